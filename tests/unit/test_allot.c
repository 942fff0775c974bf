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
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "plan_bundled.h"

#include <glpk.h>

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

static void plan_one(const char *model, const char *cluster)
{
	n_calls = n_skipped = n_improved = n_bad = n_real_solves = 0;
	plan_bundled(model, cluster);
	print_message("%s on %s: %ld MILPs, %ld provably not improving, %ld solved by "
		      "allot_milp, %ld improved, %ld faults\n",
		      model, cluster, n_calls, n_skipped, n_real_solves, n_improved, n_bad);
	assert_true(n_calls > 0);
	assert_int_equal(n_bad, 0);
}

static void test_clip10_32(void **state)
{
	(void)state;
	plan_one("clip-10", "a800-4x8");
	assert_int_equal(n_skipped, n_calls);
	assert_int_equal(n_real_solves, 0);
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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
