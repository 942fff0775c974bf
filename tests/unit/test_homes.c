/*
 * test_homes.c — the list-homes candidate (sched_list_sync) homes
 * something whenever it returns a schedule. homes_fit sends a sync
 * component whose segments would overlap back to its memory home; when
 * that leaves no sync home, the candidate must say SCHED_NOTHING_NEW (as
 * when homes_sync homes nothing) instead of a schedule labelled "homes"
 * that is the plain list schedule at the same widths. sched_list_sync is
 * wrapped (-Wl,--wrap) to compare each schedule it returns with
 * sched_list's at the same widths, over whole planning runs of the
 * bundled qwen-val on 4 A800 nodes: with 70 GiB of each device reserved
 * (homes_fit reverts every sync home in some calls: sync_homes.py) and
 * with the default reserve (homes kept).
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

static long n_sched, n_same, n_nothing;

int __real_sched_list_sync(planner_t *pl, const int *w, double frac, int share, int share1,
			   sched_t *out);
int __wrap_sched_list_sync(planner_t *pl, const int *w, double frac, int share, int share1,
			   sched_t *out);

int __wrap_sched_list_sync(planner_t *pl, const int *w, double frac, int share, int share1,
			   sched_t *out)
{
	int rc = __real_sched_list_sync(pl, w, frac, share, share1, out);
	if (rc == SCHED_NOTHING_NEW) {
		n_nothing++;
	} else if (!rc) {
		sched_t plain;
		sched_init(&plain, out->algo, out->arena);
		if (sched_list(pl, w, frac, &plain) == 0 && sched_same(out, &plain))
			n_same++;
		n_sched++;
	}
	return rc;
}

/* A planning run of qwen-val on a800-4x8 (main.c's defaults, one thread)
 * with reserve GiB kept free on each device. */
static void plan_qwen(double reserve)
{
	sp_model_t m = {0};
	sp_cluster_t c = {0};
	sp_err_t err = {0};
	sp_plan_t p = {0};
	plan_summary_t sum;
	if (model_load(&m, SPINDLE_ROOT "/plans/qwen-val/model.json", &err) ||
	    cluster_load(&c, SPINDLE_ROOT "/plans/clusters/a800-4x8.json", &err))
		fail_msg("loading qwen-val on a800-4x8: %s", err.msg);
	plan_opts_t o = {.algo = ALGO_SPINDLE, .placement = PLACE_SPINDLE,
			 .mem_reserve_gib = reserve, .milp_nodes = 200, .zero = -1,
			 .recompute = -1, .max_ins = PLAN_MAX_INS_DEFAULT, .jobs = 1};
	n_sched = n_same = n_nothing = 0;
	int rc = planner_run(&o, &m, &c, &p, &sum, &err);
	plan_release(&p);
	model_release(&m);
	cluster_release(&c);
	if (rc)
		fail_msg("planning qwen-val on a800-4x8, --mem-reserve %g: rc %d, '%s'", reserve,
			 rc, err.msg);
	print_message("--mem-reserve %g: list-homes made %ld schedules (%ld the plain list "
		      "schedule), nothing new %ld times\n",
		      reserve, n_sched, n_same, n_nothing);
}

static void test_reverted_homes(void **state)
{
	(void)state;
	plan_qwen(70);
	if (!n_nothing)
		fail_msg("--mem-reserve 70: list-homes never said nothing new (want some: homes_fit "
			 "reverts every sync home there); the case tests nothing");
	if (n_same)
		fail_msg("--mem-reserve 70: %ld of list-homes' %ld schedules are the plain list "
			 "schedule (want 0: nothing homed is nothing new)",
			 n_same, n_sched);
}

static void test_kept_homes(void **state)
{
	(void)state;
	plan_qwen(2);
	if (!n_sched || n_same)
		fail_msg("--mem-reserve 2: list-homes made %ld schedules, %ld of them the plain list "
			 "schedule (want some, none)",
			 n_sched, n_same);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reverted_homes),
		cmocka_unit_test(test_kept_homes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
