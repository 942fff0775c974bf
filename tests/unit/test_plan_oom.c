/*
 * test_plan_oom.c — failing allocations in the planner and the verifier
 * (style.md: fault paths tested on purpose). A clean planning run of
 * plans/demo (ours and the sequential baseline) and a clean verify_plan of
 * its plan count their malloc/calloc/realloc calls; then each one fails
 * in turn (the planning run: every one up to 300, then an even spread of
 * 300 more), and each run must end with SP_ENOMEM and "out of memory" in
 * err (what spindle-plan prints, exit status 1), an emptied plan, no crash
 * and, under ASan, no leak; and with --jobs 2, a failed queueing of the
 * sequential plan's refinement, which must not run the refinement anyway.
 * GLPK's own allocations are not ours to fail
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

/*
 * The sequential plan's refinement with --jobs (walk.h's seq_refine_t, a
 * job queued with the least prio of the run, to start first): when its
 * jobs_add fails, ours fails with SP_ENOMEM, and the refinement, no
 * longer wanted, must not then run on the caller's thread (it once did,
 * from seq_wait on the failure path). layout_refine_head (every
 * refinement's, with --jobs: walk_jobs.c calls it) and jobs_add are
 * wrapped (-Wl,--wrap) to count the first and fail the second.
 */
static int fail_add = 0, min_prio = 0, n_min_prio = 0;
static long n_refines;

#ifdef HAVE_WRAP
int __real_jobs_add(jobs_t *j, sp_job_t *job);
int __wrap_jobs_add(jobs_t *j, sp_job_t *job);
int __real_layout_refine_head(planner_t *pl, sp_plan_t *p, sim_result_t *res);
int __wrap_layout_refine_head(planner_t *pl, sp_plan_t *p, sim_result_t *res);

int __wrap_jobs_add(jobs_t *j, sp_job_t *job)
{
	/* jobs_add runs on the planning thread only */
	if (fail_add && job->prio == min_prio)
		return SP_ENOMEM;
	if (!n_min_prio || job->prio < min_prio) {
		min_prio = job->prio;
		n_min_prio = 1;
	} else if (job->prio == min_prio) {
		n_min_prio++;
	}
	return __real_jobs_add(j, job);
}

int __wrap_layout_refine_head(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	__atomic_fetch_add(&n_refines, 1, __ATOMIC_RELAXED);
	return __real_layout_refine_head(pl, p, res);
}
#endif

static void test_refine_cancelled(void **state)
{
#ifndef HAVE_WRAP
	skip();
#endif
	inputs_t *in = *state;
	sp_plan_t p = {0};
	sp_err_t err;
	plan_summary_t sum;
	in->o.jobs = 2;
	n_refines = 0;
	assert_int_equal(planner_run(&in->o, &in->m, &in->c, &p, &sum, &err), 0);
	plan_release(&p);
	if (n_refines < 2 || n_min_prio != 1)
		fail_msg("clean run with --jobs 2: %ld layout_refine_head calls (want 2 or more: seq's "
			 "and ours'), %d jobs with the least prio %d (want 1: seq's refinement)",
			 n_refines, n_min_prio, min_prio);
	memset(&err, 0, sizeof err);
	fail_add = 1;
	n_refines = 0;
	int rc = planner_run(&in->o, &in->m, &in->c, &p, &sum, &err);
	fail_add = 0;
	in->o.jobs = 0;
	if (rc != SP_ENOMEM || !strstr(err.msg, "out of memory"))
		fail_msg("refinement's jobs_add failed: rc %d, '%s' (want SP_ENOMEM, out of memory)",
			 rc, err.msg);
	if (n_refines)
		fail_msg("refinement's jobs_add failed: layout_refine_head ran %ld times after it "
			 "(want 0: the run fails, its result is never read)",
			 n_refines);
	if (p.ins || p.devices || p.metaops || p.n_ins)
		fail_msg("refinement's jobs_add failed: the plan was not emptied");
	plan_release(&p);
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
		cmocka_unit_test_setup_teardown(test_refine_cancelled, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
