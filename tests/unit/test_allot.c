/*
 * test_allot.c — the MILP widths (allot.c). allot_milp is wrapped
 * (-Wl,--wrap) and every call over whole planning runs (clip-10 on 32
 * A800s, qwen-val on 64) is checked:
 *  - it returns the widths that solving the MILP every time gives
 *    (allot_milp_solve): skipping the solve where allot_lower says no
 *    widths beat the separable ones changes no plan;
 *  - allot_lower is at most the objective of the separable widths and of
 *    the MILP's (a lower bound over the MILP's width choices);
 *  - on clip-10 the separable widths are provably optimal and allot_milp
 *    calls GLPK for neither table set (glp_intopt wrapped and counted);
 *    on qwen-val it solves every time and the MILP improves the widths
 *    at least once (both paths are exercised).
 * allot_search is wrapped too: it returns the widths of the search
 * without its early stop (ref_search: both passes, every trial the
 * budget allows), and the stop cuts the second pass short at least once
 * on clip-10 and on demo (the trials it skipped counted). A stop after
 * M/2 quiet MetaOps changes widths on demo a800-1x8 and fails; a stop
 * one MetaOp early (quiet < M - 1) changes no widths on these inputs and
 * is not caught (it is wrong in principle: the MetaOp that kept the last
 * change has not been tried at its new width).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "plan_bundled.h"

#include <glpk.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

static long n_calls, n_skipped, n_improved, n_bad, n_real_solves;
static int in_real;

/* Counts the solves of the wrapped allot_milp (glp_intopt wrapped too). */
int __real_glp_intopt(glp_prob *P, const glp_iocp *parm);
int __wrap_glp_intopt(glp_prob *P, const glp_iocp *parm);
int __wrap_glp_intopt(glp_prob *P, const glp_iocp *parm)
{
	n_real_solves += in_real;
	return __real_glp_intopt(P, parm);
}

int __real_allot_milp(planner_t *pl, int *w);
int __wrap_allot_milp(planner_t *pl, int *w);

int __wrap_allot_milp(planner_t *pl, int *w)
{
	int M = pl->n_mops;
	int *solved = calloc((size_t)M + 1, sizeof(int));
	double *scratch = calloc((size_t)M + 1, sizeof(double));
	if (!solved || !scratch) {
		free(solved);
		free(scratch);
		return SP_ENOMEM;
	}
	memcpy(solved, w, sizeof(int) * (size_t)M);
	double lb = 0, sep = allot_objective(pl, w, scratch);
	int rc = allot_lower(pl, &lb);
	if (!rc)
		rc = allot_milp_solve(pl, solved);
	if (!rc) {
		in_real = 1;
		rc = __real_allot_milp(pl, w);
		in_real = 0;
	}
	if (!rc) {
		double got = allot_objective(pl, solved, scratch);
		n_calls++;
		n_skipped += lb >= sep * (1 - 1e-9);
		n_improved += got < sep * (1 - 1e-9);
		if (memcmp(solved, w, sizeof(int) * (size_t)M)) {
			print_message("allot_milp: widths differ from the solved MILP's\n");
			n_bad++;
		}
		if (lb > sep || lb > got) {
			print_message("allot_lower %.9g above an objective (separable %.9g, MILP %.9g)\n",
				      lb, sep, got);
			n_bad++;
		}
	}
	free(solved);
	free(scratch);
	return rc;
}

static long n_searches, n_search_bad, n_trials_ref, n_trials;
static int in_search;

/* Counts the trial schedules of the wrapped allot_search. */
int __real_sched_list_until(planner_t *pl, const int *w, double frac, double stop, sched_t *out);
int __wrap_sched_list_until(planner_t *pl, const int *w, double frac, double stop, sched_t *out);
int __wrap_sched_list_until(planner_t *pl, const int *w, double frac, double stop, sched_t *out)
{
	n_trials += in_search;
	return __real_sched_list_until(pl, w, frac, stop, out);
}

/* A trial's list-schedule makespan: HUGE_VAL when it reaches stop or
 * finds no room. */
static double ref_makespan(planner_t *pl, const int *w, double frac, double stop)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	sched_t t;
	sched_init(&t, ALGO_SPINDLE, &pl->scratch);
	int rc = __real_sched_list_until(pl, w, frac, stop, &t);
	double ms = rc == 0 ? sched_makespan(&t) : HUGE_VAL;
	memset(pl->err, 0, sizeof *pl->err);
	sp_arena_reset(&pl->scratch, mark);
	n_trials_ref++;
	return ms;
}

/* Decreasing work, equal work by index (a stable sort's order). */
static const double *by_work;
static int cmp_work(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	if (by_work[x] != by_work[y])
		return by_work[x] < by_work[y] ? 1 : -1;
	return x - y;
}

/* allot_search's documented search without the early stop: MetaOps by
 * decreasing work, half, double, -1 and +1 their width, a change kept
 * below the bar, two passes within the budget of trials. */
static void ref_search(planner_t *pl, int *w, double frac)
{
	int M = pl->n_mops, budget = SP_MAX(12, 3000 / pl->N), order[M + 1];
	double work[M + 1], best = ref_makespan(pl, w, frac, HUGE_VAL);
	if (best == HUGE_VAL)
		return;
	for (int m = 0; m < M; m++) {
		order[m] = m;
		work[m] = pl->mops[m].n_layers * mop_t(&pl->mops[m], w[m]) * w[m];
	}
	by_work = work;
	qsort(order, (size_t)M, sizeof(int), cmp_work);
	for (int pass = 0; pass < 2; pass++)
		for (int oi = 0; oi < M; oi++) {
			int m = order[oi], w0 = w[m];
			const metaop_t *mo = &pl->mops[m];
			int cand[4] = {w0 / 2, w0 * 2, w0 - 1, w0 + 1};
			for (int c = 0; c < 4 && mo->scales && mo->nmax > 1 && budget > 0; c++) {
				int k = SP_MAX(1, SP_MIN(cand[c], mo->nmax)), keep = w[m];
				if (k == w[m] || (c >= 2 && (k == w0 / 2 || k == w0 * 2)))
					continue;
				budget--;
				w[m] = k;
				double ms = ref_makespan(pl, w, frac, best * (1 - 1e-6));
				if (ms < best * (1 - 1e-6))
					best = ms;
				else
					w[m] = keep;
			}
		}
}

int __real_allot_search(planner_t *pl, int *w, double frac);
int __wrap_allot_search(planner_t *pl, int *w, double frac);
int __wrap_allot_search(planner_t *pl, int *w, double frac)
{
	int M = pl->n_mops;
	int *ref = calloc((size_t)M + 1, sizeof(int));
	if (!ref)
		return SP_ENOMEM;
	memcpy(ref, w, sizeof(int) * (size_t)M);
	ref_search(pl, ref, frac);
	in_search = 1;
	int rc = __real_allot_search(pl, w, frac);
	in_search = 0;
	n_searches++;
	if (!rc && memcmp(ref, w, sizeof(int) * (size_t)M)) {
		print_message("allot_search: widths differ from the search without its stop\n");
		n_search_bad++;
	}
	free(ref);
	return rc;
}

static void plan_one(const char *model, const char *cluster)
{
	n_calls = n_skipped = n_improved = n_bad = n_real_solves = 0;
	n_searches = n_search_bad = n_trials_ref = n_trials = 0;
	plan_bundled(model, cluster);
	print_message("%s on %s: %ld MILPs, %ld provably not improving, %ld solved by "
		      "allot_milp, %ld improved, %ld faults\n",
		      model, cluster, n_calls, n_skipped, n_real_solves, n_improved, n_bad);
	print_message("%s on %s: %ld searches, %ld trial schedules (%ld without the stop)\n",
		      model, cluster, n_searches, n_trials, n_trials_ref);
	assert_true(n_calls > 0);
	assert_int_equal(n_bad, 0);
	assert_true(n_searches > 0);
	assert_int_equal(n_search_bad, 0);
}

static void test_clip10_32(void **state)
{
	(void)state;
	plan_one("clip-10", "a800-4x8");
	assert_int_equal(n_skipped, n_calls);
	assert_int_equal(n_real_solves, 0);
	assert_true(n_trials < n_trials_ref); /* the stop skipped some */
}

static void test_demo_8(void **state)
{
	(void)state;
	n_calls = n_searches = n_search_bad = n_trials_ref = n_trials = 0;
	plan_bundled("demo", "a800-1x8");
	print_message("demo on a800-1x8: %ld searches, %ld trial schedules (%ld without the stop)\n",
		      n_searches, n_trials, n_trials_ref);
	assert_true(n_searches > 0);
	assert_int_equal(n_search_bad, 0);
	assert_true(n_trials < n_trials_ref);
}

static void test_qwen_64(void **state)
{
	(void)state;
	plan_one("qwen-val", "a800-8x8");
	assert_int_equal(n_skipped, 0);
	assert_int_equal(n_real_solves, n_calls);
	assert_true(n_improved > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clip10_32),
		cmocka_unit_test(test_qwen_64),
		cmocka_unit_test(test_demo_8),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
