/*
 * trace.c — gathers every rank's recorded events of the last step to rank
 * 0 and writes them as Chrome trace JSON: one process per rank, compute
 * and communication threads, instruction names from the plan; a split
 * FWD/BWD's time in its tensor-parallel all-reduces as the event's args.
 */
#include "trace.h"
#include "trace_fmt.h"

#include <stdlib.h>
#include <string.h>

int trace_write_measured(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p,
			 const char *path, sp_err_t *err)
{
	int n = 0;
	const rt_event_t *ev = rt_events(st, &n);
	void *all = NULL;
	size_t *sizes = NULL;
	if (c->ops->gather(c, ev, sizeof *ev * (size_t)n, &all, &sizes))
		return sp_err_set(err, SP_EIO, path, 0, 0, NULL, "gathering the trace failed");
	if (c->rank != 0)
		return 0;
	int rc = 0;
	char *tmp = malloc(strlen(path) + 8);
	FILE *f = NULL;
	if (!tmp) {
		rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	sprintf(tmp, "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "cannot write the trace");
		goto cleanup;
	}
	trace_begin(f, c->nranks, "rank");
	const char *base = all;
	for (int r = 0; r < c->nranks; r++) {
		const rt_event_t *e = (const rt_event_t *)base;
		int ne = (int)(sizes[r] / sizeof *e);
		const sp_device_t *dv = &p->devices[r];
		for (int i = 0; i < ne; i++) {
			char name[160];
			if (e[i].ins < 0 || e[i].ins >= dv->n_ins)
				continue;
			const sp_ins_t *in = &p->ins[dv->first_ins + e[i].ins];
			double dur = e[i].end_ms - e[i].start_ms;
			trace_ins_name(name, sizeof name, p, in);
			/* a split layer's (an LM head's: its LOSS) collectives' time */
			if ((in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) &&
			    p->slices[in->slice].tp > 1)
				trace_event_tp(f, r, name, e[i].start_ms, dur, e[i].tp_ms);
			else
				trace_event(f, r, e[i].comm, name, e[i].comm ? "comm" : "compute",
					    e[i].start_ms, dur);
		}
		base += sizes[r];
	}
	trace_end(f);
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "cannot write the trace");
	f = NULL;
cleanup:
	if (f)
		fclose(f);
	if (rc && tmp)
		remove(tmp);
	free(tmp);
	free(all);
	free(sizes);
	return rc;
}
