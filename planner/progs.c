/*
 * progs.c — runs every device's program of a plan together, the one loop
 * shared by the plan's two interpreters: sim.c (in simulated time) and
 * verify.c (data only). Devices take turns in id order, each running until
 * its next instruction must wait; a round in which no device moves means
 * the programs are stuck. It gives instructions no meaning: the caller's
 * step function decides whether one can run and what it does.
 */
#include "planner.h"

int progs_run(const sp_plan_t *p, int *pc, progs_step_fn step, void *ctx)
{
	return progs_run_skip(p, pc, step, ctx, NULL);
}

int progs_run_skip(const sp_plan_t *p, int *pc, progs_step_fn step, void *ctx,
		   const char *skip)
{
	int N = p->n_devices, done = 0;
	for (int d = 0; d < N; d++)
		if (pc[d] >= p->devices[d].n_ins)
			done++;
	while (done < N) {
		int progress = 0;
		for (int d = 0; d < N; d++) {
			const sp_device_t *dv = &p->devices[d];
			if (skip && skip[d])
				continue;
			while (pc[d] < dv->n_ins) {
				int rc = step(ctx, d, pc[d], &p->ins[dv->first_ins + pc[d]]);
				if (rc < 0)
					return rc;
				if (rc == PROGS_WAIT)
					break;
				pc[d]++;
				progress = 1;
				if (pc[d] == dv->n_ins)
					done++;
			}
		}
		if (!progress)
			return PROGS_STUCK;
	}
	return 0;
}
