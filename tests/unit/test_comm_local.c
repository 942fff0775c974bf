/*
 * test_comm_local.c — the one-rank comm (runtime/comm_local.c): its
 * all-gather with per-member parts (iallgatherv, zero-3 layers) is the
 * identity on a group of one and refuses what a group of one cannot be
 * (more parts, another group, a negative count or offset) without
 * touching the buffer. Several ranks: equivalence.py's zero-3 cases.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime.h"

#include <string.h>

static void test_allgatherv_one(void **state)
{
	(void)state;
	rt_comm_t c;
	int ranks[1] = {0}, g = -1, done = 0;
	float buf[8], want[8];
	assert_int_equal(comm_local_init(&c), 0);
	assert_int_equal(c.ops->group_create(&c, ranks, 1, &g), 0);
	assert_int_equal(g, 0);
	for (int i = 0; i < 8; i++)
		buf[i] = want[i] = (float)i + 0.5f;
	int64_t cnt[2] = {5, 3}, off[2] = {2, 0};
	rt_req_t r = {7, NULL, 0, 0};
	assert_int_equal(c.ops->iallgatherv(&c, buf, 1, cnt, off, g, &r), 0);
	assert_int_equal(r.kind, 0);
	assert_int_equal(c.ops->test(&c, &r, &done), 0);
	assert_int_equal(done, 1);
	assert_memory_equal(buf, want, sizeof buf);
	/* an empty part is a part */
	cnt[0] = 0;
	assert_int_equal(c.ops->iallgatherv(&c, buf, 1, cnt, off, g, &r), 0);
	assert_memory_equal(buf, want, sizeof buf);
	c.ops->finalize(&c);
}

static void test_allgatherv_refuses(void **state)
{
	(void)state;
	rt_comm_t c;
	float buf[4] = {1, 2, 3, 4}, want[4] = {1, 2, 3, 4};
	int64_t cnt[2] = {2, 2}, off[2] = {0, 2}, neg = -1, zero = 0;
	rt_req_t r = {0};
	assert_int_equal(comm_local_init(&c), 0);
	assert_int_not_equal(c.ops->iallgatherv(&c, buf, 2, cnt, off, 0, &r), 0);
	assert_int_not_equal(c.ops->iallgatherv(&c, buf, 1, cnt, off, 1, &r), 0);
	assert_int_not_equal(c.ops->iallgatherv(&c, buf, 1, &neg, &zero, 0, &r), 0);
	assert_int_not_equal(c.ops->iallgatherv(&c, buf, 1, &zero, &neg, 0, &r), 0);
	assert_memory_equal(buf, want, sizeof buf);
	c.ops->finalize(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_allgatherv_one),
		cmocka_unit_test(test_allgatherv_refuses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
