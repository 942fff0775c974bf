/*
 * sim.c — the one evaluator: executes all devices' programs together, in
 * simulated time, under the cost model. Every algorithm is judged here on
 * its lowered programs, never by its own estimate.
 *
 * Each device runs its program in order with a clock `now`:
 *   FWD/BWD/LOSS  now += layers * T_fwd|bwd(m, local batch)
 *   COPY          now += bytes / memory bandwidth
 *   SEND          non-blocking; leaves when the device's link is free:
 *                 depart = max(now, link_free), arrive = depart + xfer time,
 *                 link_free = arrive (one outgoing transfer at a time)
 *   RECV          blocks until the matching SEND has arrived
 *   SYNC          non-blocking start; the bucket's all-reduce runs from the
 *                 moment its last member issued it and its members finished
 *                 their earlier all-reduces (one at a time per device), for
 *                 the ring time
 *   STEP          for each bucket the device belongs to, in the order of
 *                 its SYNCs: wait for the bucket's all-reduce, then
 *                 now += optimizer time of the bucket's parameters, so
 *                 updates overlap later all-reduces, as the runtime does
 *                 (all-reduces are timed after the programs ran, in the
 *                 order they can start, since only the final STEPs wait
 *                 for them)
 * A device that cannot proceed (RECV before its SEND ran, STEP before a
 * member issued SYNC) waits; if no device can proceed the programs
 * deadlock and the simulation says so. Modes switch costs off to measure
 * the compute schedule alone and the share of transfers.
 */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SIM_XFER = 1, SIM_SYNC = 2 };

typedef struct {
	double iteration, busy_total;
} sim_out_t;

static int64_t value_bytes(const sp_plan_t *p, const sp_ins_t *in, int db)
{
	int32_t seq, width;
	const sp_vref_t *v = in->op == INS_RECV ? &in->dst : &in->src;
	plan_value_shape(p, v->metaop, v->layer, &seq, &width);
	(void)seq;
	return (int64_t)(in->s1 - in->s0) * in->seq_len * width * db;
}

static int run(planner_t *pl, sp_plan_t *p, int mode, int record, sim_out_t *res)
{
	int N = p->n_devices, rc = 0;
	int db = dtype_bytes(pl->model->dtype);
	const sp_cluster_t *cl = pl->cluster;
	int max_tag = 0;
	for (int k = 0; k < p->n_ins; k++)
		if (p->ins[k].op == INS_SEND)
			max_tag = SP_MAX(max_tag, p->ins[k].tag + 1);
	int *pc = calloc((size_t)N, sizeof(int));
	double *now = calloc((size_t)N, sizeof(double));
	double *link = calloc((size_t)N, sizeof(double));
	double *busy = calloc((size_t)N, sizeof(double));
	double *wait = calloc((size_t)N, sizeof(double));
	double *arrive = malloc(sizeof(double) * (size_t)(max_tag + 1));
	int *issued = calloc((size_t)p->n_buckets + 1, sizeof(int));
	double *last_issue = calloc((size_t)p->n_buckets + 1, sizeof(double));
	double *sync_done = calloc((size_t)p->n_buckets + 1, sizeof(double));
	double *sync_free = calloc((size_t)N + 1, sizeof(double));
	int *border = malloc(sizeof(int) * (size_t)(p->n_buckets + 1));
	double *s_f0 = NULL, *s_f1 = NULL, *s_b0 = NULL, *s_b1 = NULL;
	if (!pc || !now || !link || !busy || !wait || !arrive || !issued || !last_issue || !sync_done ||
	    !sync_free || !border) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	if (record) {
		s_f0 = malloc(sizeof(double) * (size_t)(p->n_slices + 1));
		s_f1 = calloc((size_t)p->n_slices + 1, sizeof(double));
		s_b0 = malloc(sizeof(double) * (size_t)(p->n_slices + 1));
		s_b1 = calloc((size_t)p->n_slices + 1, sizeof(double));
		if (!s_f0 || !s_f1 || !s_b0 || !s_b1) {
			rc = SP_ENOMEM;
			goto cleanup;
		}
		for (int i = 0; i < p->n_slices; i++)
			s_f0[i] = s_b0[i] = HUGE_VAL;
	}
	for (int t = 0; t <= max_tag; t++)
		arrive[t] = -1;
	int done = 0;
	for (int d = 0; d < N; d++)
		if (p->devices[d].n_ins == 0)
			done++;
	while (done < N) {
		int progress = 0;
		for (int d = 0; d < N; d++) {
			const sp_device_t *dv = &p->devices[d];
			while (pc[d] < dv->n_ins) {
				const sp_ins_t *in = &p->ins[dv->first_ins + pc[d]];
				double t0 = now[d];
				if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) {
					const sp_slice_t *sl = &p->slices[in->slice];
					double f, b;
					cost_layer(pl, sl->metaop, in->s1 - in->s0, &f, &b);
					int L = sl->layer_to - sl->layer_from;
					double dur = L * (in->op == INS_BWD ? b : f);
					if (in->op == INS_LOSS)
						dur = f + b;
					now[d] += dur;
					busy[d] += dur;
					if (record) {
						double *a = in->op == INS_BWD ? s_b0 : s_f0;
						double *z = in->op == INS_BWD ? s_b1 : s_f1;
						a[in->slice] = fmin(a[in->slice], t0);
						z[in->slice] = fmax(z[in->slice], now[d]);
					}
				} else if (in->op == INS_COPY) {
					if (mode & SIM_XFER)
						now[d] += (double)value_bytes(p, in, db) /
							  (cl->mem_bandwidth_gbs * 1e6);
				} else if (in->op == INS_SEND) {
					double dep = (mode & SIM_XFER) ? fmax(now[d], link[d]) : now[d];
					double tt = (mode & SIM_XFER)
							    ? cost_xfer_ms(cl, d, in->peer,
									   value_bytes(p, in, db))
							    : 0;
					link[d] = dep + tt;
					arrive[in->tag] = dep + tt;
				} else if (in->op == INS_RECV) {
					if (in->tag < 0 || in->tag > max_tag || arrive[in->tag] < 0)
						break; /* its SEND has not run yet */
					if (arrive[in->tag] > now[d]) {
						wait[d] += arrive[in->tag] - now[d];
						now[d] = arrive[in->tag];
					}
				} else if (in->op == INS_SYNC) {
					issued[in->peer]++;
					last_issue[in->peer] = fmax(last_issue[in->peer], now[d]);
				} else if (in->op == INS_STEP) {
					/* it waits for its buckets' all-reduces, timed below once
					 * every bucket is known; here only for all of them to start */
					for (int k = 0; k < dv->n_ins; k++) {
						const sp_ins_t *sy = &p->ins[dv->first_ins + k];
						if (sy->op == INS_SYNC && issued[sy->peer] < p->buckets[sy->peer].n_dev)
							goto blocked;
					}
				}
				pc[d]++;
				progress = 1;
				if (pc[d] == dv->n_ins)
					done++;
			}
		blocked:;
		}
		if (!progress && done < N) {
			int d = 0;
			while (pc[d] >= p->devices[d].n_ins)
				d++;
			rc = sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					"simulation: the programs deadlock (device %d stuck at "
					"instruction %d, %s)",
					d, pc[d],
					ins_op_name(p->ins[p->devices[d].first_ins + pc[d]].op));
			goto cleanup;
		}
	}
	/* all-reduces in the order they can start; each device runs one at a
	 * time (they share its links), then every device's optimizer step */
	for (int i = 0; i < p->n_buckets; i++)
		border[i] = i;
	for (int a = 1; a < p->n_buckets; a++)
		for (int b = a; b > 0 && last_issue[border[b]] < last_issue[border[b - 1]]; b--) {
			int t = border[b];
			border[b] = border[b - 1];
			border[b - 1] = t;
		}
	for (int i = 0; i < p->n_buckets; i++) {
		const sp_bucket_t *bk = &p->buckets[border[i]];
		double start = last_issue[border[i]];
		for (int q = 0; q < bk->n_dev; q++)
			start = fmax(start, sync_free[p->bucket_devs[bk->dev_off + q]]);
		sync_done[border[i]] = start + ((mode & SIM_SYNC) ? bk->sync_ms : 0);
		for (int q = 0; q < bk->n_dev; q++)
			sync_free[p->bucket_devs[bk->dev_off + q]] = sync_done[border[i]];
	}
	for (int d = 0; d < N; d++) {
		/* the step updates one bucket's parameters at a time, in program
		 * order, each as soon as its all-reduce is done */
		const sp_device_t *dv = &p->devices[d];
		double t = now[d], waited = 0;
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *sy = &p->ins[dv->first_ins + k];
			if (sy->op != INS_SYNC)
				continue;
			waited += fmax(0, sync_done[sy->peer] - t);
			t = fmax(t, sync_done[sy->peer]);
			if (mode & SIM_SYNC)
				t += cost_step_ms(pl, p->buckets[sy->peer].elems);
		}
		wait[d] += waited;
		now[d] = t;
	}
	res->iteration = 0;
	res->busy_total = 0;
	for (int d = 0; d < N; d++) {
		res->iteration = fmax(res->iteration, now[d]);
		res->busy_total += busy[d];
	}
	if (record) {
		for (int d = 0; d < N; d++) {
			sp_device_t *dv = &p->devices[d];
			dv->busy_ms = busy[d];
			dv->comm_ms = wait[d];
			dv->finish_ms = now[d];
			dv->idle_ms = fmax(0, res->iteration - busy[d] - wait[d]);
		}
		for (int w = 0; w < p->n_waves; w++) {
			sp_wave_t *wv = &p->waves[w];
			double a = HUGE_VAL, z = 0, ba = HUGE_VAL, bz = 0;
			for (int i = wv->first_slice; i < wv->first_slice + wv->n_slices; i++) {
				sp_slice_t *sl = &p->slices[i];
				sl->start_ms = s_f0[i] < HUGE_VAL ? s_f0[i] : 0;
				sl->fwd_ms = s_f1[i] - sl->start_ms;
				sl->bwd_start_ms = s_b0[i] < HUGE_VAL ? s_b0[i] : s_f1[i];
				sl->bwd_ms = s_b1[i] > 0 ? s_b1[i] - sl->bwd_start_ms : 0;
				a = fmin(a, sl->start_ms);
				z = fmax(z, s_f1[i]);
				ba = fmin(ba, sl->bwd_start_ms);
				bz = fmax(bz, sl->bwd_start_ms + sl->bwd_ms);
			}
			wv->start_ms = a < HUGE_VAL ? a : 0;
			wv->dur_ms = z - wv->start_ms;
			wv->bwd_start_ms = ba < HUGE_VAL ? ba : 0;
			wv->bwd_dur_ms = fmax(0, bz - wv->bwd_start_ms);
		}
	}
cleanup:
	free(pc);
	free(now);
	free(link);
	free(busy);
	free(wait);
	free(arrive);
	free(issued);
	free(last_issue);
	free(sync_done);
	free(sync_free);
	free(border);
	free(s_f0);
	free(s_f1);
	free(s_b0);
	free(s_b1);
	if (rc == SP_ENOMEM)
		rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return rc;
}

int sim_run(planner_t *pl, sp_plan_t *p, int comm, sim_result_t *out)
{
	sim_out_t c, x, f;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = run(pl, p, 0, 0, &c)))
		return rc;
	out->compute_ms = c.iteration;
	if (!comm) {
		out->iteration_ms = c.iteration;
		out->utilisation = c.iteration > 0 ? c.busy_total / (p->n_devices * c.iteration) : 0;
		return 0;
	}
	if ((rc = run(pl, p, SIM_XFER, 0, &x)) ||
	    (rc = run(pl, p, SIM_XFER | SIM_SYNC, 1, &f)))
		return rc;
	out->iteration_ms = f.iteration;
	out->transfer_ms = fmax(0, x.iteration - c.iteration);
	out->sync_ms = fmax(0, f.iteration - x.iteration);
	out->utilisation = f.iteration > 0 ? f.busy_total / (p->n_devices * f.iteration) : 0;
	return 0;
}
