/*
 * test_iv_peak.c — planner/iv_peak.h's sweep against the brute force it
 * replaces in sched_pack.c (every interval summed at every point): random
 * intervals with many shared ends (points on an end: open at its start,
 * closed at its end), infinite ends, weights of 0 and more, points
 * repeated and outside every interval, 0..60 intervals and points.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "iv_peak.h"

#include <math.h>

#define MAX_N 60

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Places with many ties: a few small integers, now and then an infinity
 * or a value between them. */
static double rand_place(void)
{
	uint64_t r = next_rand() % 40;
	if (r == 0)
		return HUGE_VAL;
	if (r == 1)
		return -HUGE_VAL;
	if (r == 2)
		return (double)(next_rand() % 9) + 0.5;
	return (double)(r % 9);
}

static void test_random(void **state)
{
	(void)state;
	double s[MAX_N], e[MAX_N], u[MAX_N];
	int w[MAX_N];
	iv_end_t open[MAX_N], close[MAX_N];
	long nonzero = 0;
	for (int round = 0; round < 20000; round++) {
		int n = (int)(next_rand() % (MAX_N + 1)), m = (int)(next_rand() % (MAX_N + 1)), k = 0;
		for (int i = 0; i < n; i++) {
			s[i] = rand_place();
			e[i] = rand_place();
			w[i] = (int)(next_rand() % 5);
		}
		for (int i = 0; i < m; i++)
			u[i] = rand_place();
		/* the brute force: every interval at every point */
		int want = 0;
		for (int i = 0; i < m; i++) {
			int held = 0;
			for (int j = 0; j < n; j++)
				if (s[j] <= u[i] && e[j] > u[i])
					held += w[j];
			want = held > want ? held : want;
		}
		for (int j = 0; j < n; j++)
			if (s[j] < e[j]) {
				open[k] = (iv_end_t){s[j], w[j]};
				close[k++] = (iv_end_t){e[j], w[j]};
			}
		assert_int_equal(iv_peak(open, close, k, u, m), want);
		nonzero += want > 0;
	}
	assert_true(nonzero > 10000); /* not all trivially 0 */
}

/* Ends that meet: one interval closes where the next opens (the point
 * there counts only the second), and nested ones. */
static void test_touching(void **state)
{
	(void)state;
	iv_end_t open[3] = {{0, 2}, {1, 3}, {0.5, 1}}, close[3] = {{1, 2}, {2, 3}, {3, 1}};
	double u[3] = {1, 0.5, 2};
	/* at 0.5: 2 + 1; at 1: 3 + 1; at 2: 1 */
	assert_int_equal(iv_peak(open, close, 3, u, 3), 4);
	iv_end_t o2[1] = {{0, 5}}, c2[1] = {{1, 5}};
	double u2[2] = {1, -1};
	assert_int_equal(iv_peak(o2, c2, 1, u2, 2), 0);
	assert_int_equal(iv_peak(o2, c2, 1, u2, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random),
		cmocka_unit_test(test_touching),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
