/*
 * test_iv_peak.c — planner/iv_peak.h's fixed intervals (the lanes
 * sched_pack.c placed) with up to two more tried against them, against
 * the brute force (every interval summed at every point): random
 * intervals with many shared ends (points on an end: open at its start,
 * closed at its end), infinite ends, weights of 0 and more, points
 * repeated and outside every interval, 0..60 intervals and points, any
 * run of the points and up to two points more.
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

/* The brute force: fixed intervals s/e/w (n, empty ones count nowhere)
 * and own ones at u. */
static int brute_at(const double *s, const double *e, const int *w, int n, const iv_end_t *oo,
		    const iv_end_t *oc, int no, double u)
{
	int held = 0;
	for (int j = 0; j < n; j++)
		held += s[j] <= u && e[j] > u ? w[j] : 0;
	for (int j = 0; j < no; j++)
		held += oo[j].v <= u && oc[j].v > u ? oo[j].w : 0;
	return held;
}

static void test_random(void **state)
{
	(void)state;
	double s[MAX_N], e[MAX_N], u[MAX_N], x[2];
	int w[MAX_N], sums[2 * MAX_N], held[7 * MAX_N];
	iv_end_t open[MAX_N], close[MAX_N], oo[IV_OWN], oc[IV_OWN];
	long nonzero = 0, own_counted = 0;
	assert_true(iv_fixed_levels(MAX_N) <= 7);
	for (int round = 0; round < 20000; round++) {
		int n = (int)(next_rand() % (MAX_N + 1)), m = (int)(next_rand() % (MAX_N + 1)), k = 0;
		for (int i = 0; i < n; i++) {
			s[i] = rand_place();
			e[i] = rand_place();
			w[i] = (int)(next_rand() % 5);
		}
		for (int i = 0; i < m; i++)
			u[i] = rand_place();
		for (int i = 1; i < m; i++) /* ascending, as the caller gives them */
			for (int j = i; j > 0 && u[j] < u[j - 1]; j--) {
				double t = u[j];
				u[j] = u[j - 1];
				u[j - 1] = t;
			}
		for (int j = 0; j < n; j++)
			if (s[j] < e[j]) {
				open[k] = (iv_end_t){s[j], w[j]};
				close[k++] = (iv_end_t){e[j], w[j]};
			}
		iv_fixed_t F = {open, close, sums, sums + MAX_N, u, held, k, m};
		iv_fixed_build(&F);
		int no = 0, nx = (int)(next_rand() % 3);
		for (int j = (int)(next_rand() % (IV_OWN + 1)); j > 0; j--) {
			double a = rand_place(), b = rand_place();
			if (a < b) {
				int ww = 1 + (int)(next_rand() % 4);
				oo[no] = (iv_end_t){a, ww};
				oc[no++] = (iv_end_t){b, ww};
			}
		}
		for (int i = 0; i < nx; i++)
			x[i] = rand_place();
		int a = m ? (int)(next_rand() % (m + 1)) : 0;
		int z = a + (m - a ? (int)(next_rand() % (m - a + 1)) : 0);
		int want = 0;
		for (int i = a; i < z; i++) {
			int h = brute_at(s, e, w, n, oo, oc, no, u[i]);
			want = h > want ? h : want;
		}
		for (int i = 0; i < nx; i++) {
			int h = brute_at(s, e, w, n, oo, oc, no, x[i]);
			want = h > want ? h : want;
		}
		assert_int_equal(iv_fixed_peak(&F, a, z, oo, oc, no, x, nx), want);
		double v = rand_place();
		assert_int_equal(iv_fixed_at(&F, v), brute_at(s, e, w, n, oo, oc, 0, v));
		nonzero += want > 0;
		own_counted += no > 0 && want > iv_fixed_peak(&F, a, z, oo, oc, 0, x, nx);
	}
	assert_true(nonzero > 10000); /* not all trivially 0 */
	assert_true(own_counted > 1000); /* the own intervals raise the peak */
}

/* Ends that meet: one interval closes where the next opens (the point
 * there counts only the second), and nested ones; the own interval's
 * weight only where it is open. */
static void test_touching(void **state)
{
	(void)state;
	iv_end_t open[3] = {{0, 2}, {1, 3}, {0.5, 1}}, close[3] = {{1, 2}, {2, 3}, {3, 1}};
	double u[3] = {0.5, 1, 2};
	int sums[6], held[3 * 3];
	iv_fixed_t F = {open, close, sums, sums + 3, u, held, 3, 3};
	iv_fixed_build(&F);
	/* at 0.5: 2 + 1; at 1: 3 + 1; at 2: 1 */
	assert_int_equal(iv_fixed_peak(&F, 0, 3, NULL, NULL, 0, NULL, 0), 4);
	assert_int_equal(iv_fixed_peak(&F, 2, 3, NULL, NULL, 0, NULL, 0), 1);
	assert_int_equal(iv_fixed_peak(&F, 1, 1, NULL, NULL, 0, NULL, 0), 0);
	/* own [2, 2.5) of 7: only the point at 2 (1 + 7) */
	iv_end_t oo[1] = {{2, 7}}, oc[1] = {{2.5, 7}};
	assert_int_equal(iv_fixed_peak(&F, 0, 3, oo, oc, 1, NULL, 0), 8);
	assert_int_equal(iv_fixed_peak(&F, 0, 2, oo, oc, 1, NULL, 0), 4);
	double x[1] = {2.25}; /* 1 + 7 there too */
	assert_int_equal(iv_fixed_peak(&F, 0, 2, oo, oc, 1, x, 1), 8);
	assert_int_equal(iv_fixed_at(&F, -1), 0);
	assert_int_equal(iv_fixed_at(&F, 3), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random),
		cmocka_unit_test(test_touching),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
