/*
 * test_plan_oom.c — failing allocations in the planner and the verifier
 * (style.md: fault paths tested on purpose). A clean planning run of
 * plans/demo (ours and the sequential baseline) and a clean verify_plan of
 * its plan count their malloc/calloc/realloc calls; then each one fails
 * in turn (the planning run: every one up to 300, then an even spread of
 * 300 more), and each run must end with SP_ENOMEM and "out of memory" in
 * err (what spindle-plan prints, exit status 1), an emptied plan, no crash
 * and, under ASan, no leak. GLPK's own allocations are not ours to fail
 * (it aborts on them by design); jansson is done before the count.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

/* With -Wl,--wrap every allocation of our code comes here; while armed
 * they are counted and number fail_at (0-based) fails. */
static int armed;
static long n_allocs, fail_at = -1;

static int should_fail(void)
{
	return armed && n_allocs++ == fail_at;
}

#include "alloc_wrap.h"

typedef struct {
	sp_model_t m;
	sp_cluster_t c;
	plan_opts_t o;
} inputs_t;

static int setup(void **state)
{
	inputs_t *in = calloc(1, sizeof *in);
	sp_err_t err = {0};
	if (!in)
		return -1;
	if (model_load(&in->m, SPINDLE_ROOT "/plans/demo/model.json", &err) ||
	    cluster_load(&in->c, SPINDLE_ROOT "/plans/demo/cluster.json", &err)) {
		fprintf(stderr, "setup: %s\n", err.msg);
		return -1;
	}
	/* main.c's defaults */
	in->o.algo = ALGO_SPINDLE;
	in->o.placement = PLACE_SPINDLE;
	in->o.mem_reserve_gib = SP_MIN(2.0, 0.1 * in->c.memory_gib);
	in->o.milp_nodes = 200;
	in->o.zero = -1;
	in->o.recompute = -1;
	in->o.max_ins = PLAN_MAX_INS_DEFAULT;
	*state = in;
	return 0;
}

static int teardown(void **state)
{
	inputs_t *in = *state;
	model_release(&in->m);
	cluster_release(&in->c);
	free(in);
	return 0;
}

/* planner_run with allocation k failing (-1: none); the number of
 * allocations it made in *count. */
static int plan_failing(inputs_t *in, long k, long *count, sp_plan_t *p, sp_err_t *err)
{
	plan_summary_t sum;
	memset(err, 0, sizeof *err);
	n_allocs = 0;
	fail_at = k;
	armed = 1;
	int rc = planner_run(&in->o, &in->m, &in->c, p, &sum, err);
	armed = 0;
	*count = n_allocs;
	return rc;
}

static void test_planner(void **state)
{
#ifndef HAVE_WRAP
	skip();
#endif
	inputs_t *in = *state;
	sp_plan_t p = {0};
	sp_err_t err;
	long total;
	assert_int_equal(plan_failing(in, -1, &total, &p, &err), 0);
	plan_release(&p);
	assert_true(total > 10);
	long tried = 0;
	for (long k = 0; k < total; k += k < 300 ? 1 : SP_MAX(1, (total - 300) / 300)) {
		long seen;
		memset(&p, 0, sizeof p);
		int rc = plan_failing(in, k, &seen, &p, &err);
		if (rc != SP_ENOMEM || !strstr(err.msg, "out of memory"))
			fail_msg("allocation %ld of %ld failed: rc %d, '%s' (want SP_ENOMEM, "
				 "out of memory)",
				 k, total, rc, err.msg);
		if (p.ins || p.devices || p.metaops || p.n_ins)
			fail_msg("allocation %ld of %ld failed: the plan was not emptied", k,
				 total);
		plan_release(&p);
		tried++;
	}
	print_message("planning the demo: %ld of its %ld allocations failed in turn, each "
		      "SP_ENOMEM\n",
		      tried, total);
}

static void test_verifier(void **state)
{
#ifndef HAVE_WRAP
	skip();
#endif
	inputs_t *in = *state;
	sp_plan_t p = {0};
	sp_err_t err;
	long total;
	assert_int_equal(plan_failing(in, -1, &total, &p, &err), 0);
	memset(&err, 0, sizeof err);
	n_allocs = 0;
	fail_at = -1;
	armed = 1;
	assert_int_equal(verify_plan(&p, 0, &err), 0);
	armed = 0;
	total = n_allocs;
	assert_true(total > 0);
	for (long k = 0; k < total; k++) {
		memset(&err, 0, sizeof err);
		n_allocs = 0;
		fail_at = k;
		armed = 1;
		int rc = verify_plan(&p, 0, &err);
		armed = 0;
		if (rc != SP_ENOMEM || strcmp(err.msg, "out of memory"))
			fail_msg("verifier allocation %ld of %ld failed: rc %d, '%s'", k, total, rc,
				 err.msg);
	}
	print_message("verifying the demo's plan: each of its %ld allocations failed in turn\n",
		      total);
	plan_release(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_planner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_verifier, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
