/*
 * plan_bundled.h — one planning run of a bundled workload
 * (plans/MODEL/model.json on plans/clusters/CLUSTER.json) with
 * spindle-plan's defaults on one thread, for the tests that wrap a pass
 * and check what it returns over whole runs. Fails the test on an error.
 * Include after cmocka.h and planner.h; SPINDLE_ROOT is the source root.
 */
#ifndef SPINDLE_PLAN_BUNDLED_H
#define SPINDLE_PLAN_BUNDLED_H

#include <stdio.h>

static inline void plan_bundled(const char *model, const char *cluster)
{
	char mp[512], cp[512];
	snprintf(mp, sizeof mp, "%s/plans/%s/model.json", SPINDLE_ROOT, model);
	snprintf(cp, sizeof cp, "%s/plans/clusters/%s.json", SPINDLE_ROOT, cluster);
	sp_model_t m = {0};
	sp_cluster_t c = {0};
	sp_err_t err = {0};
	sp_plan_t p = {0};
	plan_summary_t sum;
	if (model_load(&m, mp, &err) || cluster_load(&c, cp, &err))
		fail_msg("loading %s on %s: %s", model, cluster, err.msg);
	plan_opts_t o = {.algo = ALGO_SPINDLE, .placement = PLACE_SPINDLE,
			 .mem_reserve_gib = 2.0, .milp_nodes = 200, .zero = -1,
			 .recompute = -1, .max_ins = PLAN_MAX_INS_DEFAULT, .jobs = 1};
	int rc = planner_run(&o, &m, &c, &p, &sum, &err);
	plan_release(&p);
	model_release(&m);
	cluster_release(&c);
	if (rc)
		fail_msg("planning %s on %s: rc %d, '%s'", model, cluster, rc, err.msg);
}

#endif
