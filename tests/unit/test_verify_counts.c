/*
 * test_verify_counts.c — the verifier's per-sample counts as runs
 * (planner/verify_counts.c) against a plain array, the representation it
 * replaced: random adds over random ranges of a batch, after each of them
 * every sample's count and the pieces of random ranges equal the array's,
 * and the runs stay sorted, disjoint, non-empty and merged (no two
 * neighbours with one count). Then what made the change: memory that does
 * not grow with the batch (one run for a range of 2^30 samples, where a
 * table took 4 GiB), and clipping a range as a SEND's snapshot does.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "verify.h"

#include <stdlib.h>

/* The runs are sorted, disjoint and non-empty, and neighbours differ. */
static void check_shape(const vcounts_t *c)
{
	for (int i = 0; i < c->n; i++) {
		if (c->r[i].s0 >= c->r[i].s1)
			fail_msg("run %d [%d, %d) is empty", i, (int)c->r[i].s0, (int)c->r[i].s1);
		if (i && c->r[i - 1].s1 > c->r[i].s0)
			fail_msg("runs %d and %d overlap or are out of order", i - 1, i);
		if (i && c->r[i - 1].s1 == c->r[i].s0 && c->r[i - 1].n == c->r[i].n)
			fail_msg("runs %d and %d touch with one count %d: not merged", i - 1, i,
				 (int)c->r[i].n);
	}
}

static int32_t at(const vcounts_t *c, int32_t s)
{
	int32_t n;
	vcounts_piece(c, s, s + 1, &n);
	return n;
}

static void test_against_array(void **state)
{
	(void)state;
	enum { B = 97, ROUNDS = 400 };
	srand(12345);
	for (int trial = 0; trial < 20; trial++) {
		sp_arena_t a;
		sp_arena_init(&a);
		vcounts_t c = {0};
		int32_t ref[B] = {0};
		for (int round = 0; round < ROUNDS; round++) {
			int32_t s0 = rand() % (B + 1), s1 = rand() % (B + 1);
			if (s0 > s1) {
				int32_t t = s0;
				s0 = s1;
				s1 = t;
			}
			/* few distinct amounts, so that runs meet with equal counts */
			int32_t add = rand() % 3;
			assert_int_equal(vcounts_add(&a, &c, s0, s1, add), 0);
			for (int32_t s = s0; s < s1; s++)
				ref[s] += add;
			check_shape(&c);
			for (int32_t s = 0; s < B; s++)
				if (at(&c, s) != ref[s])
					fail_msg("trial %d round %d: sample %d counts %d, the array %d",
						 trial, round, (int)s, (int)at(&c, s), (int)ref[s]);
			/* pieces of a random range: each has one count, they tile it */
			int32_t q0 = rand() % B, q1 = q0 + 1 + rand() % (B - q0);
			for (int32_t s = q0, n, e; s < q1; s = e) {
				e = vcounts_piece(&c, s, q1, &n);
				assert_true(e > s && e <= q1);
				for (int32_t x = s; x < e; x++)
					if (ref[x] != n)
						fail_msg("piece [%d, %d) of count %d holds sample %d of "
							 "count %d",
							 (int)s, (int)e, (int)n, (int)x, (int)ref[x]);
				if (e < q1 && ref[e] == n && e < B)
					fail_msg("piece [%d, %d) ends before sample %d of the same "
						 "count %d",
						 (int)s, (int)e, (int)e, (int)n);
			}
		}
		sp_arena_release(&a);
	}
}

static void test_memory_not_batch(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	vcounts_t c = {0};
	const int32_t B = (int32_t)1 << 30;
	/* a device's slice range written by four consumers' pieces of seq */
	for (int k = 0; k < 4; k++)
		assert_int_equal(vcounts_add(&a, &c, B / 2, B, 7), 0);
	assert_int_equal(c.n, 1);
	assert_int_equal(at(&c, B - 1), 28);
	assert_int_equal(at(&c, B / 2 - 1), 0);
	/* contiguous writes of the rest merge into one run */
	for (int32_t s = 0; s < B / 2; s += B / 8)
		assert_int_equal(vcounts_add(&a, &c, s, s + B / 8, 28), 0);
	assert_int_equal(c.n, 1);
	assert_true(a.used_total < 4096);
	print_message("2^30 samples written in 8 adds: %d run, %zu arena bytes\n", c.n,
		      a.used_total);
	sp_arena_release(&a);
}

static void test_clip(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	vcounts_t c = {0}, out;
	assert_int_equal(vcounts_add(&a, &c, 0, 10, 1), 0);
	assert_int_equal(vcounts_add(&a, &c, 5, 20, 2), 0);
	assert_int_equal(vcounts_add(&a, &c, 30, 40, 4), 0);
	/* [3, 35): 1 on [3, 5), 3 on [5, 10), 2 on [10, 20), 0, 4 on [30, 35) */
	assert_int_equal(vcounts_clip(&a, &out, &c, 3, 35), 0);
	check_shape(&out);
	assert_int_equal(out.n, 4);
	const int32_t want[][3] = {{3, 5, 1}, {5, 10, 3}, {10, 20, 2}, {30, 35, 4}};
	for (int i = 0; i < 4; i++) {
		assert_int_equal(out.r[i].s0, want[i][0]);
		assert_int_equal(out.r[i].s1, want[i][1]);
		assert_int_equal(out.r[i].n, want[i][2]);
	}
	assert_int_equal(at(&out, 2), 0);
	assert_int_equal(at(&out, 36), 0);
	sp_arena_release(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_against_array),
		cmocka_unit_test(test_memory_not_batch),
		cmocka_unit_test(test_clip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
