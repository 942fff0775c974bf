/*
 * sim.c — the one evaluator: executes all devices' programs together, in
 * simulated time, under the cost model. Every algorithm is judged here on
 * its lowered programs, never by its own estimate.
 *
 * Each device runs its program in order with a clock `now`:
 *   FWD/BWD/LOSS  now += layers * T_fwd|bwd(m, local batch, the slice's tp:
 *                 a t-way member's shard with its group's all-reduces,
 *                 cost_layer_tp); a recomputing
 *                 slice's BWD also re-runs its forward (T_fwd + T_bwd)
 *   COPY          now += bytes / memory bandwidth
 *   SEND          non-blocking; the transfer enters the network (fluid.c)
 *                 at now, where it shares the links it crosses with every
 *                 transfer and all-reduce in flight beside it
 *   RECV          blocks until the matching transfer has arrived
 *   SYNC          non-blocking; when the bucket's last member issued it,
 *                 its all-reduce (zero-1/2/3: reduce-scatter, the first
 *                 half of the ring's or hierarchical all-reduce:
 *                 net_half_phases) enters the network, ready
 *                 at that moment;
 *                 it starts when its members finished their earlier
 *                 all-reduces (one at a time per device) and shares links
 *                 like a transfer
 *                 A zero-2/zero-3 bucket's reduce-scatter is waited for
 *                 where the runtime completes it (plan_z2_walk's done: the
 *                 first later instruction that places another full
 *                 gradient, its safe point passed, else the STEP): before
 *                 that instruction the device waits for the collective
 *                 (in the passes with SIM_SYNC, where syncs cost)
 *   STEP          for each bucket the device belongs to, in the order of
 *                 its SYNCs: wait for the bucket's all-reduce, then
 *                 now += optimizer time of the bucket's parameters (zero-1:
 *                 of the device's shard), so updates overlap later
 *                 all-reduces, as the runtime does (steps are timed after
 *                 the programs ran, since only the final STEPs wait for
 *                 all-reduces)
 *   PGATHER       zero-3: a rendezvous of the bucket's members; from the
 *                 last arrival the span's first layer is gathered (an
 *                 all-gather of the layer, priced alone on the network;
 *                 a span gathered whole: the bucket's gather_ms), charged
 *                 here. Each later layer's all-gather runs while the
 *                 layer before it computes (the runtime's prefetch): what
 *                 it takes beyond that layer's compute is added to the
 *                 FWD/BWD/LOSS running that layer (pg_overlap); PFREE
 *                 takes no time
 *   GATHER        zero-1/2: the bucket's all-gather is ready when its
 *                 last member has updated the bucket (the runtime starts
 *                 it there, in the STEP) and enters the network like an
 *                 all-reduce (finish_steps_net: the all-reduce's second
 *                 half, net_half_phases; alone it takes the bucket's
 *                 gather_ms):
 *                 it shares links with the collectives in flight and
 *                 starts once its members are through their earlier
 *                 ones; the device is done when its gathers are, but
 *                 for its deferred buckets' (defer 1, below)
 *
 * Deferred all-gathers (a zero-1/2 bucket with defer k >= 1): the runtime
 * starts the all-gather in the STEP, after the device's last update (its
 * deferred ones in the reverse order of its SYNCs), in pieces
 * (plan_defer_pieces for k), but the step does not wait for it; the next
 * step waits for each piece before the first layer that reads it
 * (plan_defer_use: inside the first FWD, BWD or LOSS running one of its
 * layers, else at the STEP). One iteration in the steady state is
 * modelled conservatively, never earlier than the runtime could be:
 *  - each piece of a gather left in flight by the step before is a
 *    collective that enters the network at time 0 of the iteration
 *    (dw_alloc; in the runtime it started in the step before's tail,
 *    earlier, so it is done no later than modelled), the pieces in the
 *    runtime's order, one after another on the members' one stream each
 *    (each paying its latency), running through the fluid network like
 *    the others, sharing NICs and ports with the forward's transfers and
 *    delaying the members' later collectives; a member's use waits for a
 *    piece before the layer that first reads it: layer i of the use
 *    starts no earlier than that piece is done, the layers before it
 *    taking the use's per-layer compute each (dw_wait);
 *  - this iteration's own deferred gathers still enter the network in its
 *    tail (finish_steps_net, once every member updated the bucket: no
 *    later than the runtime starts them; one collective of the bucket's
 *    bytes, its pieces' extra latency not counted where no device waits),
 *    where they share links with the
 *    collectives still in flight there and delay those, but no device
 *    waits for them:
 *    the iteration ends when the last step (and non-deferred gather) is
 *    done. So each deferred gather loads the network twice in the model
 *    (at the start and in the tail), once in the runtime.
 * The bounds (bound.c) still hold: the sync bound counts only the
 * reduce-scatters and all-reduces the STEP waits for (deferral adds to a
 * device's stream, never removes), the communication bound's bytes are
 * all moved within the modelled iteration (the time-0 gathers are waited
 * for at the latest at the STEP), and the compute bounds ignore the
 * network. With K micro-steps the time-0 gathers are in the full pass (the
 * last micro-step's; the runtime waits in the first, where nothing else
 * loads the network with syncs yet).
 * Devices run ahead of each other (progs.c); the network runs in time
 * order. When no device can proceed, the network runs to its next arrival:
 * every device is then waiting, so whatever it sends later leaves after
 * that arrival and cannot change it. If the network has nothing left to
 * deliver, the programs deadlock and the simulation says so. Modes switch
 * costs off to measure the compute schedule alone and the share of
 * transfers.
 *
 * With K micro-steps (pl->k) the programs are one micro-step; the runtime
 * runs them K times, the first K - 1 without SYNC, STEP and GATHER, and
 * micro-step j only with the instructions of the tasks that have more than
 * j micro-batches (plan_ins_active). Each distinct set of active tasks is
 * simulated once (plan_micro_next) and counted for its micro-steps: the
 * iteration is the passes with transfers but without sync and step of the
 * first K - 1 micro-steps + the full pass of the last; compute and
 * transfer times add up over the K. Micro-steps are taken back to back (no
 * overlap of one's tail with the next one's head). The times recorded in
 * the plan are the full pass's with every task active: the last
 * micro-step's when every task has K micro-batches, else one pass more.
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

/* One run's state; arrays come from pl->scratch. */
typedef struct {
	planner_t *pl;
	sp_plan_t *p;
	int mode, record, db, max_tag;
	int micro;                       /* the micro-step: its tasks run */
	int *pc;                         /* per device: next instruction */
	/* per device d, sg_k[sg_at[d] .. sg_at[d + 1]) the positions of its
	 * SYNCs and GATHERs in program order (sim_alloc's one scan of the
	 * programs: the loops over a device's SYNCs or GATHERs below read
	 * these instead of the whole program) */
	int *sg_at, *sg_k;
	int *scan;                       /* per device: into sg_k; the SYNCs before
					  * it all issued */
	double *now, *busy, *wait;       /* per device: clock, compute, waiting */
	double *arrive;                  /* per tag: when its SEND arrives; -1 before it
					  * ran, -2 while in the network */
	int *xjob;                       /* per tag: its job in the network */
	int *issued, *sjob;              /* per bucket: SYNCs issued so far, its job */
	double *last_issue, *sync_done;  /* per bucket */
	double *gather_at;               /* per bucket: its last member's update done */
	int *pg_n, *pg_round, *pg_wait;  /* zero-3 PGATHER: per bucket arrivals and
					  * rounds done; per device its round, -1 */
	double *pg_t, *pg_done;          /* per bucket: latest arrival, round's end */
	double *pg_ms;                   /* per instruction of the plan: a PGATHER's
					  * span priced (pg_span_ms), -1 not yet */
	double *pg_x;                    /* per instruction: a use's exposed
					  * zero-3 gathers (pg_overlap) */
	char *pg_ov;                     /* per instruction: pg_overlap ran */
	fl_net_t net;
	double *s_f0, *s_f1, *s_b0, *s_b1; /* per slice, when recording: fwd/bwd span */
	/* sim_progs: per device whether it waits where only a SEND of its
	 * RECV's tag, its transfer's arrival or a SYNC completing its STEP's
	 * bucket can move it; who waits on what */
	char *blocked;
	int *tag_waiter;           /* per tag: the device whose RECV waits for its SEND */
	int *bk_head, *bk_next;    /* per bucket, linked through devices: STEP waiters */
	int *netw, n_netw, *wtag;  /* devices whose RECV's transfer is in the network */
	/* SIM_SYNC with zero-2/3 buckets: per device d, zw_k/zw_b[zw_at[d] ..
	 * zw_at[d + 1]) the (instruction, bucket) pairs, ascending, before which d
	 * waits for the bucket's reduce-scatter (plan_z2_walk's done, the STEP's
	 * left to finish_steps); zw_pos[d] the next one */
	int *zw_at, *zw_pos, *zw_k, *zw_b;
	/* SIM_SYNC with deferred buckets: per device d, dw_k/dw_i/dw_j[dw_at[d]
	 * .. dw_at[d + 1]) the (instruction, layer position, job) of each piece
	 * of a gather left by the step before (entered at time 0), ascending,
	 * before which d waits for it; dw_pos[d] the next one */
	int *dw_at, *dw_pos, *dw_k, *dw_i, *dw_j;
	int zw_waits;              /* the last step waited in zw_wait (not blocked) */
} sim_t;

/* The zw_* lists (sim_t) for a SIM_SYNC pass: empty without zero-2/3
 * buckets. */
static int zw_alloc(sim_t *st, sp_arena_t *a)
{
	const sp_plan_t *p = st->p;
	int N = p->n_devices, n = 0, has = 0, rc = 0;
	st->zw_at = sp_arena_calloc(a, (size_t)N + 2, sizeof(int));
	st->zw_pos = sp_arena_calloc(a, (size_t)N + 1, sizeof(int));
	if (!st->zw_at || !st->zw_pos)
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets && !has; b++)
		has = layout_grads_sharded(p->buckets[b].layout);
	if (!has || !(st->mode & SIM_SYNC))
		return 0;
	int32_t *safe = NULL;
	if (plan_z2_safe(p, &safe))
		return SP_ENOMEM;
	int cap = 0;
	for (int b = 0; b < p->n_buckets; b++)
		cap += layout_grads_sharded(p->buckets[b].layout) ? p->buckets[b].n_dev : 0;
	st->zw_k = sp_arena_calloc(a, (size_t)cap + 1, sizeof(int));
	st->zw_b = sp_arena_calloc(a, (size_t)cap + 1, sizeof(int));
	for (int d = 0; d < N && st->zw_k && st->zw_b && !rc; d++) {
		plan_z2_walk_t w;
		st->zw_at[d] = st->zw_pos[d] = n;
		if (plan_z2_walk(p, d, safe, &w)) {
			rc = SP_ENOMEM;
			break;
		}
		const sp_device_t *dv = &p->devices[d];
		int step = dv->n_ins; /* the STEP's index: finish_steps waits there */
		for (int k = 0; k < dv->n_ins; k++)
			if (p->ins[dv->first_ins + k].op == INS_STEP) {
				step = k;
				break;
			}
		int m = n;
		for (int b = 0; w.done && b < p->n_buckets; b++)
			if (w.done[b] >= 0 && w.done[b] < step && n < cap) {
				int i = n++; /* insertion by instruction, then bucket */
				while (i > m && st->zw_k[i - 1] > w.done[b]) {
					st->zw_k[i] = st->zw_k[i - 1];
					st->zw_b[i] = st->zw_b[i - 1];
					i--;
				}
				st->zw_k[i] = w.done[b];
				st->zw_b[i] = b;
			}
		plan_z2_walk_release(&w);
	}
	st->zw_at[N] = n;
	free(safe);
	return rc ? rc : (!st->zw_k || !st->zw_b) ? SP_ENOMEM : 0;
}

/* 1 when bucket b's all-gather after the STEP is deferred. */
static int deferred(const sp_bucket_t *bk)
{
	return bk->defer && layout_gathers_after_step(bk->layout);
}

/* The dw_* lists and the time-0 gathers (sim_t) for a SIM_SYNC pass: empty
 * without deferred buckets. The runtime starts a device's deferred gathers
 * after its last update, in the reverse order of its SYNCs (the backward's
 * reverse: the forward's order), each bucket's in pieces
 * (plan_defer_pieces: in the order of their first use); here the buckets
 * enter the network by how close to its members' last SYNC a bucket's
 * SYNC is (the least over members of the SYNCs after it; ties: bucket
 * order), the same order on every device whose SYNC orders agree, each
 * bucket's pieces one collective each in the pieces' order (on a member's
 * stream one after another). A member waits for a piece before the layer
 * of its first use that first reads the piece (plan_defer_use). */
static int dw_alloc(sim_t *st, sp_arena_t *a)
{
	const sp_plan_t *p = st->p;
	int N = p->n_devices, n = 0, cap = 0, npar = 0, most = 0;
	st->dw_at = sp_arena_calloc(a, (size_t)N + 2, sizeof(int));
	st->dw_pos = sp_arena_calloc(a, (size_t)N + 1, sizeof(int));
	if (!st->dw_at || !st->dw_pos)
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++)
		if (deferred(&p->buckets[b])) {
			cap += p->buckets[b].n_dev * p->buckets[b].n_params;
			npar += p->buckets[b].n_params + 1;
			most = SP_MAX(most, p->buckets[b].n_params);
		}
	if (!cap || !(st->mode & SIM_SYNC))
		return 0;
	int nb = p->n_buckets, no = 0;
	/* per deferred bucket b, its pieces at pc0[b]: first param (pfirst),
	 * job (pjob); npc[b] of them */
	int *pc0 = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	int *npc = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	int32_t *pfirst = sp_arena_calloc(a, (size_t)npar + 1, sizeof(int32_t));
	int32_t *pord = sp_arena_calloc(a, (size_t)npar + 1, sizeof(int32_t));
	int *pjob = sp_arena_calloc(a, (size_t)npar + 1, sizeof(int));
	int32_t *uk = sp_arena_calloc(a, (size_t)most + 1, sizeof(int32_t));
	int32_t *upos = sp_arena_calloc(a, (size_t)most + 1, sizeof(int32_t));
	st->dw_k = sp_arena_calloc(a, (size_t)cap + 1, sizeof(int));
	st->dw_i = sp_arena_calloc(a, (size_t)cap + 1, sizeof(int));
	st->dw_j = sp_arena_calloc(a, (size_t)cap + 1, sizeof(int));
	int *key = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	int *ord = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	if (!pc0 || !npc || !pfirst || !pord || !pjob || !uk || !upos || !st->dw_k || !st->dw_i ||
	    !st->dw_j || !key || !ord)
		return SP_ENOMEM;
	for (int b = 0; b < nb; b++)
		key[b] = INT32_MAX;
	for (int d = 0; d < N; d++) {
		const sp_ins_t *prog = p->ins + p->devices[d].first_ins;
		int after = 0;
		for (int i = st->sg_at[d + 1] - 1; i >= st->sg_at[d]; i--) {
			const sp_ins_t *in = &prog[st->sg_k[i]];
			if (in->op == INS_SYNC) {
				key[in->peer] = SP_MIN(key[in->peer], after);
				after++;
			}
		}
	}
	for (int b = 0, at = 0; b < nb; b++) {
		if (!deferred(&p->buckets[b]))
			continue;
		pc0[b] = at;
		if ((npc[b] = plan_defer_pieces(p, b, p->buckets[b].defer, pfirst + at, pord + at)) < 0)
			return npc[b];
		at += npc[b] + 1;
		int i = no++;
		for (; i > 0 && key[ord[i - 1]] > key[b]; i--)
			ord[i] = ord[i - 1];
		ord[i] = b;
	}
	for (int i = 0; i < no; i++) {
		int b = ord[i];
		const sp_bucket_t *bk = &p->buckets[b];
		for (int j = 0; j < npc[b]; j++) {
			int q = pc0[b] + pord[pc0[b] + j];
			int64_t e = 0;
			for (int r = pfirst[q]; r < pfirst[q + 1]; r++)
				e += plan_z3_param_elems(p, b, r);
			if ((pjob[q] = fl_coll(&st->net, 0, p->bucket_devs + bk->dev_off, bk->n_dev,
					       e * st->db, COLL_ALL_GATHER)) < 0)
				return pjob[q];
		}
	}
	for (int d = 0; d < N; d++) {
		int m = n;
		int64_t so, sn;
		st->dw_at[d] = st->dw_pos[d] = n;
		for (int b = 0; b < nb; b++) {
			if (!deferred(&p->buckets[b]) || bucket_shard(p, b, d, &so, &sn) < 0)
				continue;
			plan_defer_use(p, d, b, uk, upos);
			for (int j = 0; j < npc[b] && n < cap; j++) {
				const int32_t *f = pfirst + pc0[b] + j;
				int k = INT32_MAX, ps = 0, i = n++;
				for (int r = f[0]; r < f[1]; r++)
					if (uk[r] < k || (uk[r] == k && upos[r] < ps)) {
						k = uk[r];
						ps = upos[r];
					}
				/* by instruction, then position, then bucket and piece */
				while (i > m && (st->dw_k[i - 1] > k ||
						 (st->dw_k[i - 1] == k && st->dw_i[i - 1] > ps))) {
					st->dw_k[i] = st->dw_k[i - 1];
					st->dw_i[i] = st->dw_i[i - 1];
					st->dw_j[i] = st->dw_j[i - 1];
					i--;
				}
				st->dw_k[i] = k;
				st->dw_i[i] = ps;
				st->dw_j[i] = pjob[pc0[b] + j];
			}
		}
	}
	st->dw_at[N] = n;
	return 0;
}

/* Before device d's instruction k (in): the deferred pieces it reads there
 * (dw_* lists), each waited for before the layer that first reads it: its
 * position i in the use, layers taking c each (the use's per-layer
 * compute), so the use is held back by the most any piece is late for
 * its layer; pieces of an earlier instruction (one a micro-step left
 * out) or of the STEP at its start. PROGS_WAIT while one is in the
 * network. */
static int dw_wait(sim_t *st, int d, int k, const sp_ins_t *in)
{
	int e = st->dw_pos[d];
	for (; e < st->dw_at[d + 1] && st->dw_k[e] <= k; e++)
		if (fl_done(&st->net, st->dw_j[e]) < 0) {
			fl_await(&st->net, st->dw_j[e]);
			return PROGS_WAIT;
		}
	double c = 0, stall = 0;
	if (in->op == INS_FWD || in->op == INS_BWD)
		c = ins_layer_ms(st->pl, st->p, in);
	for (int i = st->dw_pos[d]; i < e; i++) {
		double t = fl_done(&st->net, st->dw_j[i]);
		double at = st->now[d] + stall + (st->dw_k[i] == k ? st->dw_i[i] * c : 0);
		if (t > at)
			stall += t - at;
	}
	st->dw_pos[d] = e;
	st->wait[d] += stall;
	st->now[d] += stall;
	return PROGS_RAN;
}

/* Before device d's instruction k: the reduce-scatters the runtime
 * completes there (zw_* lists), waited for. PROGS_WAIT while one is not
 * done (its members' SYNCs not all issued, or still in the network). */
static int zw_wait(sim_t *st, int d, int k)
{
	const sp_plan_t *p = st->p;
	for (int *i = &st->zw_pos[d]; *i < st->zw_at[d + 1] && st->zw_k[*i] <= k; ++*i) {
		int b = st->zw_b[*i];
		if (st->issued[b] < p->buckets[b].n_dev)
			return PROGS_WAIT;
		double t = fl_done(&st->net, st->sjob[b]);
		if (t < 0) {
			fl_await(&st->net, st->sjob[b]);
			return PROGS_WAIT;
		}
		if (t > st->now[d]) {
			st->wait[d] += t - st->now[d];
			st->now[d] = t;
		}
	}
	return PROGS_RAN;
}

static int sim_alloc(sim_t *st, sp_arena_t *a)
{
	const sp_plan_t *p = st->p;
	size_t N = (size_t)p->n_devices, nb = (size_t)p->n_buckets + 1;
	size_t ns = (size_t)p->n_slices + 1;
	int n_xfer = 0, n_pg = 0, n_sg = 0; /* transfers that may enter the network;
					      * PGATHERs; SYNCs and GATHERs */
	st->max_tag = 0;
	st->sg_at = sp_arena_array(a, N + 1, sizeof(int));
	st->sg_k = sp_arena_array(a, (size_t)p->n_ins + 1, sizeof(int));
	st->scan = sp_arena_array(a, N + 1, sizeof(int));
	if (!st->sg_at || !st->sg_k || !st->scan)
		return SP_ENOMEM;
	for (int d = 0; d < p->n_devices; d++) {
		st->sg_at[d] = st->scan[d] = n_sg;
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			n_pg += in->op == INS_PGATHER;
			if (in->op == INS_SYNC || in->op == INS_GATHER)
				st->sg_k[n_sg++] = k;
			if (in->op != INS_SEND)
				continue;
			st->max_tag = SP_MAX(st->max_tag, in->tag + 1);
			n_xfer += (st->mode & SIM_XFER) && in->peer != d;
		}
	}
	st->sg_at[N] = n_sg;
	st->pc = sp_arena_calloc(a, N + 1, sizeof(int));
	st->now = sp_arena_calloc(a, N + 1, sizeof(double));
	st->busy = sp_arena_calloc(a, N + 1, sizeof(double));
	st->wait = sp_arena_calloc(a, N + 1, sizeof(double));
	/* per tag, written before read: arrive and tag_waiter below, a tag's
	 * xjob when its arrive becomes -2 */
	st->arrive = sp_arena_array(a, (size_t)st->max_tag + 1, sizeof(double));
	st->xjob = sp_arena_array(a, (size_t)st->max_tag + 1, sizeof(int));
	st->issued = sp_arena_calloc(a, nb, sizeof(int));
	st->sjob = sp_arena_calloc(a, nb, sizeof(int));
	st->last_issue = sp_arena_calloc(a, nb, sizeof(double));
	st->sync_done = sp_arena_calloc(a, nb, sizeof(double));
	st->gather_at = sp_arena_calloc(a, nb, sizeof(double));
	st->pg_n = sp_arena_calloc(a, nb, sizeof(int));
	st->pg_round = sp_arena_calloc(a, nb, sizeof(int));
	st->pg_wait = sp_arena_calloc(a, N + 1, sizeof(int));
	st->pg_t = sp_arena_calloc(a, nb, sizeof(double));
	st->pg_done = sp_arena_calloc(a, nb, sizeof(double));
	if (!st->pg_n || !st->pg_round || !st->pg_wait || !st->pg_t || !st->pg_done)
		return SP_ENOMEM;
	/* per instruction, only where a PGATHER reads and writes them (a
	 * plan without one: NULL, its uses add nothing) */
	if (n_pg) {
		st->pg_ms = sp_arena_array(a, (size_t)p->n_ins + 1, sizeof(double));
		st->pg_x = sp_arena_calloc(a, (size_t)p->n_ins + 1, sizeof(double));
		st->pg_ov = sp_arena_calloc(a, (size_t)p->n_ins + 1, 1);
		if (!st->pg_ms || !st->pg_x || !st->pg_ov)
			return SP_ENOMEM;
		for (int i = 0; i < p->n_ins; i++)
			st->pg_ms[i] = -1;
	}
	for (size_t d = 0; d < N; d++)
		st->pg_wait[d] = -1;
	if (!st->pc || !st->now || !st->busy || !st->wait || !st->arrive || !st->xjob ||
	    !st->issued || !st->sjob || !st->last_issue || !st->sync_done || !st->gather_at ||
	    fl_init(&st->net, st->pl->cluster, a,
		    n_xfer + 3 * p->n_buckets + p->n_bucket_params))
		return SP_ENOMEM;
	st->blocked = sp_arena_calloc(a, N + 1, 1);
	st->tag_waiter = sp_arena_array(a, (size_t)st->max_tag + 1, sizeof(int));
	st->bk_head = sp_arena_calloc(a, nb, sizeof(int));
	st->bk_next = sp_arena_calloc(a, N + 1, sizeof(int));
	st->netw = sp_arena_calloc(a, N + 1, sizeof(int));
	st->wtag = sp_arena_calloc(a, N + 1, sizeof(int));
	if (!st->blocked || !st->tag_waiter || !st->bk_head || !st->bk_next || !st->netw ||
	    !st->wtag)
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++)
		st->bk_head[b] = -1;
	if (zw_alloc(st, a))
		return SP_ENOMEM;
	int rc = dw_alloc(st, a);
	if (rc)
		return rc;
	for (int t = 0; t <= st->max_tag; t++) {
		st->arrive[t] = -1;
		st->tag_waiter[t] = -1;
	}
	if (!st->record)
		return 0;
	st->s_f0 = sp_arena_calloc(a, ns, sizeof(double));
	st->s_f1 = sp_arena_calloc(a, ns, sizeof(double));
	st->s_b0 = sp_arena_calloc(a, ns, sizeof(double));
	st->s_b1 = sp_arena_calloc(a, ns, sizeof(double));
	if (!st->s_f0 || !st->s_f1 || !st->s_b0 || !st->s_b1)
		return SP_ENOMEM;
	for (int i = 0; i < p->n_slices; i++)
		st->s_f0[i] = st->s_b0[i] = HUGE_VAL;
	return 0;
}

double ins_layer_ms(const planner_t *pl, const sp_plan_t *p, const sp_ins_t *in)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	double f, b;
	cost_layer_sp(pl, sl->metaop, in->s1 - in->s0, sl->tp, sl->sp, &f, &b);
	return in->op == INS_BWD ? b + (sl->recompute ? f : 0) : in->op == INS_LOSS ? f + b : f;
}

double ins_compute_ms(const planner_t *pl, const sp_plan_t *p, const sp_ins_t *in)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	double c = ins_layer_ms(pl, p, in);
	return in->op == INS_LOSS ? c : (sl->layer_to - sl->layer_from) * c;
}

/* FWD/BWD/LOSS: the device computes for the slice's layers. */
static void sim_compute(sim_t *st, int d, const sp_ins_t *in)
{
	double t0 = st->now[d], dur = ins_compute_ms(st->pl, st->p, in);
	if (st->pg_x)
		dur += st->pg_x[in - st->p->ins];
	st->now[d] += dur;
	st->busy[d] += dur;
	if (st->record) {
		double *a = in->op == INS_BWD ? st->s_b0 : st->s_f0;
		double *z = in->op == INS_BWD ? st->s_b1 : st->s_f1;
		a[in->slice] = fmin(a[in->slice], t0);
		z[in->slice] = fmax(z[in->slice], st->now[d]);
	}
}

/* Device d's PGATHER k: its span's first layer gathered (plan_z3_span)
 * over the bucket's group (priced alone on the network). The runtime
 * gathers a layer by one all-gather in which each member gives its
 * shard's part of the layer (runtime/zero.c z3_start), priced as the
 * all-gather of the layer's bytes; a span gathered whole: the bucket's
 * gather_ms (the same all-gather of the whole bucket). The later layers:
 * pg_overlap. */
static int pg_span_ms(sim_t *st, int d, int k, double *ms)
{
	const sp_plan_t *p = st->p;
	int g = p->devices[d].first_ins + k, b = p->ins[g].peer;
	if (st->pg_ms[g] < 0) {
		const sp_bucket_t *bk = &p->buckets[b];
		int32_t *seq = NULL;
		int whole, n = plan_z3_span(p, d, k, &seq, &whole);
		if (n < 0)
			return n;
		st->pg_ms[g] = whole ? bk->gather_ms : 0;
		if (n > 0)
			st->pg_ms[g] += cost_all_gather_ms(
				st->pl->cluster, p->bucket_devs + bk->dev_off, bk->n_dev,
				plan_z3_param_elems(p, b, seq[0]) * st->db);
		free(seq);
	}
	*ms = st->pg_ms[g];
	return 0;
}

/*
 * Device d's PGATHER k, prefetch (runtime/zero.c rt_z3_need): the gather of
 * the span's layer i + 1 starts when layer i starts to compute, and layer
 * i + 1 computes once both are done, so layer i takes max(its compute,
 * the gather of layer i + 1): the excess is added to the use running
 * layer i (pg_x). The uses are d's own, in the span's order (the walk
 * checks that); a layer used again at once adds compute only.
 */
static int pg_overlap(sim_t *st, int d, int k)
{
	const sp_plan_t *p = st->p;
	const sp_device_t *dv = &p->devices[d];
	int b = p->ins[dv->first_ins + k].peer, whole, pos = -1, prev = -1;
	const sp_bucket_t *bk = &p->buckets[b];
	int32_t *seq = NULL;
	int n = plan_z3_span(p, d, k, &seq, &whole);
	if (n < 0)
		return n;
	for (int j = k + 1; j < dv->n_ins && !whole && pos + 1 < n; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		if (in->op == INS_PFREE && in->peer == b)
			break;
		if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		double c = ins_layer_ms(st->pl, p, in);
		for (int i = 0, q; pos + 1 < n && (q = plan_z3_use(p, b, in, i)) != -2; i++) {
			if (q < 0 || q == prev)
				continue;
			prev = q;
			pos++;
			if (pos + 1 < n)
				st->pg_x[dv->first_ins + j] += fmax(
					0, cost_all_gather_ms(st->pl->cluster, p->bucket_devs + bk->dev_off,
							      bk->n_dev,
							      plan_z3_param_elems(p, b, seq[pos + 1]) *
								      st->db) -
						   c);
		}
	}
	free(seq);
	return 0;
}

/* One instruction of device d under the cost model (the table at the top).
 * It waits only where sim_block knows what moves the device on: a new
 * reason to wait needs its wake-up there and in sim_unblock (a device
 * waiting for anything else is visited every round, as by progs_run). */
static int sim_step(void *ctx, int d, int k, const sp_ins_t *in)
{
	sim_t *st = ctx;
	const sp_plan_t *p = st->p;
	const sp_cluster_t *cl = st->pl->cluster;
	int xfer = st->mode & SIM_XFER;
	if (st->micro && !plan_ins_active(p, in, st->micro)) /* micro-step 0 runs all */
		return PROGS_RAN;
	st->zw_waits = (st->zw_pos[d] < st->zw_at[d + 1] && zw_wait(st, d, k) == PROGS_WAIT) ||
		       (st->dw_pos[d] < st->dw_at[d + 1] && dw_wait(st, d, k, in) == PROGS_WAIT);
	if (st->zw_waits)
		return PROGS_WAIT; /* visited every round: sim_block does not know it */
	if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) {
		sim_compute(st, d, in);
	} else if (in->op == INS_COPY) {
		if (xfer)
			st->now[d] += (double)value_bytes(p, in, st->db) /
				      (cl->mem_bandwidth_gbs * 1e6);
	} else if (in->op == INS_SEND) {
		int64_t bytes = xfer ? value_bytes(p, in, st->db) : 0;
		st->arrive[in->tag] = st->now[d];
		if (bytes > 0 && in->peer != d) {
			if ((st->xjob[in->tag] = fl_xfer(&st->net, st->now[d], d, in->peer, bytes)) < 0)
				return st->xjob[in->tag];
			st->arrive[in->tag] = -2;
		}
	} else if (in->op == INS_RECV) {
		if (in->tag < 0 || in->tag > st->max_tag || st->arrive[in->tag] == -1)
			return PROGS_WAIT; /* its SEND has not run yet */
		if (st->arrive[in->tag] == -2 &&
		    (st->arrive[in->tag] = fl_done(&st->net, st->xjob[in->tag])) < 0) {
			st->arrive[in->tag] = -2;
			fl_await(&st->net, st->xjob[in->tag]);
			return PROGS_WAIT; /* still in the network */
		}
		if (st->arrive[in->tag] > st->now[d]) {
			st->wait[d] += st->arrive[in->tag] - st->now[d];
			st->now[d] = st->arrive[in->tag];
		}
	} else if (in->op == INS_SYNC) {
		const sp_bucket_t *bk = &p->buckets[in->peer];
		st->last_issue[in->peer] = fmax(st->last_issue[in->peer], st->now[d]);
		if (++st->issued[in->peer] == bk->n_dev &&
		    (st->sjob[in->peer] = fl_coll(
			     &st->net, st->last_issue[in->peer], p->bucket_devs + bk->dev_off,
			     bk->n_dev,
			     (st->mode & SIM_SYNC) ? bk->elems * st->db : 0,
			     layout_sharded(bk->layout) ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE)) < 0)
			return st->sjob[in->peer];
	} else if (in->op == INS_PGATHER) {
		/* a rendezvous of the bucket's members: the span's gathers start
		 * at the last arrival and take pg_span_ms */
		const sp_bucket_t *bk = &p->buckets[in->peer];
		int b = in->peer;
		int gi = p->devices[d].first_ins + k;
		if ((st->mode & SIM_SYNC) && !st->pg_ov[gi]) {
			int rc = pg_overlap(st, d, k);
			if (rc)
				return rc;
			st->pg_ov[gi] = 1;
		}
		if (st->pg_wait[d] < 0) {
			st->pg_wait[d] = st->pg_round[b];
			st->pg_t[b] = fmax(st->pg_t[b], st->now[d]);
			if (++st->pg_n[b] == bk->n_dev) {
				double ms = 0;
				int rc = st->mode & SIM_SYNC ? pg_span_ms(st, d, k, &ms) : 0;
				if (rc)
					return rc;
				st->pg_done[b] = st->pg_t[b] + ms;
				st->pg_round[b]++;
				st->pg_n[b] = 0;
				st->pg_t[b] = 0;
			}
		}
		if (st->pg_round[b] <= st->pg_wait[d])
			return PROGS_WAIT;
		st->pg_wait[d] = -1;
		if (st->pg_done[b] > st->now[d]) {
			st->wait[d] += st->pg_done[b] - st->now[d];
			st->now[d] = st->pg_done[b];
		}
	} else if (in->op == INS_STEP) {
		/* it waits for its buckets' all-reduces, timed once every bucket is
		 * known (finish_steps); here only for all of them to start */
		const sp_ins_t *prog = p->ins + p->devices[d].first_ins;
		for (; st->scan[d] < st->sg_at[d + 1]; st->scan[d]++) {
			const sp_ins_t *sy = &prog[st->sg_k[st->scan[d]]];
			if (sy->op == INS_SYNC && st->issued[sy->peer] < p->buckets[sy->peer].n_dev)
				return PROGS_WAIT;
		}
	}
	return PROGS_RAN;
}

/*
 * progs_run(p, st->pc, sim_step, st), the same steps in the same order,
 * without the visits that would only wait again (progs_run_skip). A device whose step
 * waited is blocked (skipped) until what it waits for may have come: its
 * RECV's SEND ran (that step unblocks it), its transfer arrived (checked
 * here after the network ran), or its STEP's first unissued bucket got
 * its last SYNC (that step unblocks the bucket's waiters). A blocked
 * device's step would wait again (sim_step waits only in those cases,
 * and its fl_await was made on the visit that blocked it), so skipping
 * it changes nothing; an unblocked one is visited when progs_run would
 * next visit it (in this round if after the device that unblocked it).
 */
static void sim_block(sim_t *st, int d, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	if (in->op == INS_RECV) {
		st->blocked[d] = 1;
		if (in->tag < 0 || in->tag > st->max_tag)
			return; /* never comes */
		if (st->arrive[in->tag] == -1) {
			st->tag_waiter[in->tag] = d;
		} else {
			st->wtag[d] = in->tag;
			st->netw[st->n_netw++] = d;
		}
	} else if (in->op == INS_STEP) {
		const sp_ins_t *sy = &p->ins[p->devices[d].first_ins + st->sg_k[st->scan[d]]];
		st->blocked[d] = 1;
		st->bk_next[d] = st->bk_head[sy->peer];
		st->bk_head[sy->peer] = d;
	}
}

/* Step `in` ran: the devices it may move are unblocked. */
static void sim_unblock(sim_t *st, const sp_ins_t *in)
{
	if (in->op == INS_SEND && in->tag >= 0 && in->tag <= st->max_tag &&
	    st->tag_waiter[in->tag] >= 0) {
		st->blocked[st->tag_waiter[in->tag]] = 0;
		st->tag_waiter[in->tag] = -1;
	} else if (in->op == INS_SYNC && st->issued[in->peer] >= st->p->buckets[in->peer].n_dev) {
		for (int d = st->bk_head[in->peer]; d >= 0; d = st->bk_next[d])
			st->blocked[d] = 0;
		st->bk_head[in->peer] = -1;
	}
}

/* sim_step, blocking the device it waits on and unblocking those its
 * step may move. */
static int sim_step_tracked(void *ctx, int d, int k, const sp_ins_t *in)
{
	sim_t *st = ctx;
	st->zw_waits = 0;
	int rc = sim_step(ctx, d, k, in);
	if (rc == PROGS_WAIT && !st->zw_waits)
		sim_block(ctx, d, in);
	else if (rc == PROGS_RAN)
		sim_unblock(ctx, in);
	return rc;
}

static int sim_progs(sim_t *st)
{
	for (int i = 0; i < st->n_netw;) { /* arrived since */
		int d = st->netw[i];
		if (fl_done(&st->net, st->xjob[st->wtag[d]]) >= 0) {
			st->blocked[d] = 0;
			st->netw[i] = st->netw[--st->n_netw];
		} else {
			i++;
		}
	}
	return progs_run_skip(st->p, st->pc, sim_step_tracked, st, st->blocked);
}

/* Every device's optimizer step: it updates one bucket's parameters (or
 * its zero-1 shard) at a time, in program order, each as soon as its
 * collective is done (sync_done, known: the network has run); without
 * SIM_SYNC the steps and all-gathers cost nothing. */
static void finish_steps(sim_t *st)
{
	const sp_plan_t *p = st->p;
	for (int b = 0; b < p->n_buckets; b++)
		st->gather_at[b] = 0;
	for (int d = 0; d < p->n_devices; d++) {
		const sp_ins_t *prog = p->ins + p->devices[d].first_ins;
		double t = st->now[d], waited = 0;
		for (int i = st->sg_at[d]; i < st->sg_at[d + 1]; i++) {
			const sp_ins_t *sy = &prog[st->sg_k[i]];
			if (sy->op != INS_SYNC)
				continue;
			waited += fmax(0, st->sync_done[sy->peer] - t);
			t = fmax(t, st->sync_done[sy->peer]);
			int64_t off, n;
			bucket_shard(p, sy->peer, d, &off, &n);
			if (st->mode & SIM_SYNC)
				t += cost_step_ms(st->pl, n);
			st->gather_at[sy->peer] = fmax(st->gather_at[sy->peer], t);
		}
		st->wait[d] += waited;
		st->now[d] = t;
	}
}

/* finish_steps in a SIM_SYNC pass, with the zero-1/2 all-gathers as the
 * runtime runs them (exec_step): a bucket's all-gather starts once every
 * member has updated it, beside the later updates, and it is a collective
 * of the network like the others (fluid.c): it shares the NICs and ports
 * it crosses with the reduce-scatters and all-reduces still in flight and
 * with the other all-gathers, and waits, as they do, until its members
 * are through their earlier collectives (one stream per device). Its
 * phases are the all-reduce's second half (no tree; net.c
 * net_half_phases), alone its gather_ms. The steps run as the network
 * delivers the collectives they wait for; a gather whose last member's
 * update comes before the network's clock (that member finished its
 * program early, while the network ran on for others) starts at the
 * clock. A device is done when its steps and its all-gathers are. */
static int finish_steps_net(sim_t *st)
{
	const sp_plan_t *p = st->p;
	sp_arena_t *a = &st->pl->scratch;
	int N = p->n_devices, nb = p->n_buckets, rc;
	int *pos = sp_arena_calloc(a, (size_t)N + 1, sizeof(int));
	int *stepped = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	int *gjob = sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	char *gathered = sp_arena_calloc(a, (size_t)nb + 1, sizeof(char));
	if (!pos || !stepped || !gjob || !gathered)
		return SP_ENOMEM;
	for (int d = 0; d < N; d++) {
		pos[d] = st->sg_at[d];
		for (int i = st->sg_at[d]; i < st->sg_at[d + 1]; i++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + st->sg_k[i]];
			if (in->op == INS_GATHER)
				gathered[in->peer] = 1;
		}
	}
	for (int b = 0; b < nb; b++) {
		st->gather_at[b] = 0;
		gjob[b] = -1;
		fl_await(&st->net, st->sjob[b]);
	}
	for (;;) {
		int left = 0;
		for (int d = 0; d < N; d++) {
			const sp_ins_t *prog = p->ins + p->devices[d].first_ins;
			double t = st->now[d];
			for (; pos[d] < st->sg_at[d + 1]; pos[d]++) {
				const sp_ins_t *sy = &prog[st->sg_k[pos[d]]];
				if (sy->op != INS_SYNC)
					continue;
				int b = sy->peer;
				double done = fl_done(&st->net, st->sjob[b]);
				if (done < 0)
					break;
				st->wait[d] += fmax(0, done - t);
				t = fmax(t, done);
				int64_t off, n;
				bucket_shard(p, b, d, &off, &n);
				t += cost_step_ms(st->pl, n);
				st->gather_at[b] = fmax(st->gather_at[b], t);
				const sp_bucket_t *bk = &p->buckets[b];
				if (++stepped[b] == bk->n_dev && gathered[b]) {
					gjob[b] = fl_coll(&st->net, st->gather_at[b],
							  p->bucket_devs + bk->dev_off, bk->n_dev,
							  bk->elems * st->db, COLL_ALL_GATHER);
					if (gjob[b] < 0)
						return gjob[b];
				}
			}
			st->now[d] = t;
			left |= pos[d] < st->sg_at[d + 1];
		}
		if (!left)
			break;
		if ((rc = fl_advance(&st->net, 1)) < 0)
			return rc;
		if (rc == 0)
			return sp_err_set(st->pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "simulation: a step waits for a collective that "
					  "never ends");
	}
	if ((rc = fl_advance(&st->net, 0)))
		return rc;
	for (int d = 0; d < N; d++) {
		const sp_ins_t *prog = p->ins + p->devices[d].first_ins;
		double t = st->now[d];
		for (int i = st->sg_at[d]; i < st->sg_at[d + 1]; i++) {
			const sp_ins_t *ga = &prog[st->sg_k[i]];
			if (ga->op == INS_GATHER && gjob[ga->peer] >= 0 &&
			    !deferred(&p->buckets[ga->peer])) /* the next step waits */
				t = fmax(t, fl_done(&st->net, gjob[ga->peer]));
		}
		st->wait[d] += t - st->now[d];
		st->now[d] = t;
	}
	return 0;
}

/* Predicted times into the plan's devices, slices and waves. */
static void record_times(sim_t *st, double iteration)
{
	sp_plan_t *p = st->p;
	for (int d = 0; d < p->n_devices; d++) {
		sp_device_t *dv = &p->devices[d];
		dv->busy_ms = st->busy[d];
		dv->comm_ms = st->wait[d];
		dv->finish_ms = st->now[d];
		dv->idle_ms = fmax(0, iteration - st->busy[d] - st->wait[d]);
	}
	const double *f0 = st->s_f0, *f1 = st->s_f1, *b0 = st->s_b0, *b1 = st->s_b1;
	for (int w = 0; w < p->n_waves; w++) {
		sp_wave_t *wv = &p->waves[w];
		double a = HUGE_VAL, z = 0, ba = HUGE_VAL, bz = 0;
		for (int i = wv->first_slice; i < wv->first_slice + wv->n_slices; i++) {
			sp_slice_t *sl = &p->slices[i];
			sl->start_ms = f0[i] < HUGE_VAL ? f0[i] : 0;
			sl->fwd_ms = f1[i] - sl->start_ms;
			sl->bwd_start_ms = b0[i] < HUGE_VAL ? b0[i] : f1[i];
			sl->bwd_ms = b1[i] > 0 ? b1[i] - sl->bwd_start_ms : 0;
			a = fmin(a, sl->start_ms);
			z = fmax(z, f1[i]);
			ba = fmin(ba, sl->bwd_start_ms);
			bz = fmax(bz, sl->bwd_start_ms + sl->bwd_ms);
		}
		wv->start_ms = a < HUGE_VAL ? a : 0;
		wv->dur_ms = z - wv->start_ms;
		wv->bwd_start_ms = ba < HUGE_VAL ? ba : 0;
		wv->bwd_dur_ms = fmax(0, bz - wv->bwd_start_ms);
	}
}

/* The programs, then the all-reduces, then the steps; its arrays live in
 * pl->scratch until it returns. */
static int run_scoped(sim_t *st, sim_out_t *res)
{
	const sp_plan_t *p = st->p;
	sp_arena_t *a = &st->pl->scratch;
	int rc;
	if ((rc = sim_alloc(st, a)))
		return rc;
	/* stuck: every device waits; the network delivers its next transfer */
	int got = 1;
	while ((rc = sim_progs(st)) == PROGS_STUCK &&
	       (got = fl_advance(&st->net, 1)) == 1)
		;
	if (got < 0)
		return got;
	if (rc == PROGS_STUCK) {
		int d = 0;
		while (st->pc[d] >= p->devices[d].n_ins)
			d++;
		return sp_err_set(st->pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "simulation: the programs deadlock (device %d stuck at "
				  "instruction %d, %s)",
				  d, st->pc[d],
				  ins_op_name(p->ins[p->devices[d].first_ins + st->pc[d]].op));
	}
	if (rc)
		return rc;
	if (st->mode & SIM_SYNC) {
		if ((rc = finish_steps_net(st)))
			return rc;
		for (int b = 0; b < p->n_buckets; b++)
			st->sync_done[b] = fl_done(&st->net, st->sjob[b]);
	} else {
		if ((rc = fl_advance(&st->net, 0)))
			return rc;
		for (int b = 0; b < p->n_buckets; b++)
			st->sync_done[b] = fl_done(&st->net, st->sjob[b]);
		finish_steps(st);
	}
	res->iteration = 0;
	res->busy_total = 0;
	for (int d = 0; d < p->n_devices; d++) {
		res->iteration = fmax(res->iteration, st->now[d]);
		res->busy_total += st->busy[d];
	}
	if (st->record)
		record_times(st, res->iteration);
	return 0;
}

static int run_pass(planner_t *pl, sp_plan_t *p, int mode, int record, int micro,
		    sim_out_t *res)
{
	sim_t st = {.pl = pl, .p = p, .mode = mode, .record = record, .micro = micro,
		    .db = dtype_bytes(pl->model->dtype)};
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int rc = run_scoped(&st, res);
	sp_arena_reset(&pl->scratch, mark);
	if (rc == SP_ENOMEM)
		rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return rc;
}

/* run_pass, or for a pass with sync (the costly one; the compute and
 * transfer passes of a plan run again are too few to pay for the memo's
 * copies), the result and times of the same pass (mode, record, micro) of
 * the same plan state run before in this run (sim_memo.c: a rejected
 * trial tried again, a plan simulated again). SPINDLE_NO_PASS_MEMO set:
 * every pass runs (a check of the memo's exactness,
 * tests/planner/pass_memo.py). */
static int run(planner_t *pl, sp_plan_t *p, int mode, int record, int micro, sim_out_t *res)
{
	sim_memo_key_t key;
	double o[2];
	int32_t tag[3] = {mode, record, micro};
	if (!(mode & SIM_SYNC) || getenv("SPINDLE_NO_PASS_MEMO"))
		return run_pass(pl, p, mode, record, micro, res);
	int rc = sim_pass_find(pl, p, tag, &key, o);
	if (rc == 1) {
		res->iteration = o[0];
		res->busy_total = o[1];
		return 0;
	}
	if (rc)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	rc = run_pass(pl, p, mode, record, micro, res);
	o[0] = res->iteration;
	o[1] = res->busy_total;
	int mrc = sim_pass_add(pl, &key, p, rc ? NULL : o);
	if (!rc && mrc)
		rc = sp_err_set(pl->err, mrc, NULL, 0, 0, NULL, "out of memory");
	return rc;
}

/* Whether every task runs in every micro-step (the same k for all). */
static int uniform(const sp_plan_t *p)
{
	return plan_micro_next(&p->model, p->microbatches, 0) >= p->microbatches;
}

/* The last micro-step: the first of its set of active tasks. */
static int last_set(const sp_plan_t *p)
{
	int j = 0;
	while (plan_micro_next(&p->model, p->microbatches, j) < p->microbatches)
		j = plan_micro_next(&p->model, p->microbatches, j);
	return j;
}

/* The iteration from the full pass f of the last micro-step and the passes
 * with transfers of the others (res: xfer_iteration_ms less its last
 * micro-step's part xfer_last_ms, busy_before); with the same k for every
 * task, k - 1 times the last one's, as before per-task counts. */
static void sync_result(const planner_t *pl, const sp_plan_t *p, const sim_out_t *f,
			sim_result_t *res)
{
	if (uniform(p)) {
		double x = res->xfer_iteration_ms / pl->k;
		res->iteration_ms = x * (pl->k - 1) + f->iteration;
		res->sync_ms = fmax(0, f->iteration - x);
		/* busy time of the earlier micro-steps: k - 1 times the last one's */
		res->utilisation = res->iteration_ms > 0 ? f->busy_total * pl->k /
								   (p->n_devices * res->iteration_ms)
							 : 0;
		return;
	}
	res->iteration_ms = res->xfer_iteration_ms - res->xfer_last_ms + f->iteration;
	res->sync_ms = fmax(0, f->iteration - res->xfer_last_ms);
	res->utilisation = res->iteration_ms > 0 ? (res->busy_before + f->busy_total) /
							   (p->n_devices * res->iteration_ms)
						 : 0;
}

/* The full pass of the last micro-step into f; when it leaves tasks out,
 * the plan's times come from a pass with every task active. */
static int full_pass(planner_t *pl, sp_plan_t *p, sim_out_t *f)
{
	sim_out_t all;
	if (uniform(p))
		return run(pl, p, SIM_XFER | SIM_SYNC, 1, 0, f);
	int rc = run(pl, p, SIM_XFER | SIM_SYNC, 1, 0, &all);
	return rc ? rc : run(pl, p, SIM_XFER | SIM_SYNC, 0, last_set(p), f);
}

int sim_run(planner_t *pl, sp_plan_t *p, int comm, sim_result_t *out)
{
	sim_out_t c, f;
	int rc;
	memset(out, 0, sizeof *out);
	if (!comm) {
		double busy = 0, it = 0;
		for (int j = 0, next; j < pl->k; j = next) {
			next = plan_micro_next(&p->model, pl->k, j);
			if ((rc = run(pl, p, 0, 0, j, &c)))
				return rc;
			it += c.iteration * (next - j);
			busy += c.busy_total * (next - j);
		}
		out->iteration_ms = out->compute_ms = it;
		out->utilisation = it > 0 ? busy / (p->n_devices * it) : 0;
		return 0;
	}
	/* the compute and transfer passes, then the full one */
	if ((rc = sim_transfers(pl, p, out)) || (rc = full_pass(pl, p, &f)))
		return rc;
	sync_result(pl, p, &f, out);
	return 0;
}

/* The compute and transfer passes do not look at bucket layouts (a SYNC
 * moves no bytes and no GATHER waits without SIM_SYNC): only the full pass
 * runs again. */
int sim_sync_again(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	sim_out_t f;
	int rc = full_pass(pl, p, &f);
	if (!rc)
		sync_result(pl, p, &f, res);
	return rc;
}

/* With k = 1, sync_result takes the iteration (x 0 + f) and the
 * utilisation from the full pass alone; only sync_ms reads the transfer
 * pass, and sim_complete sets it as sync_result would have. */
int sim_iteration(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	sim_out_t f;
	int rc;
	if (pl->k != 1)
		return sim_run(pl, p, 1, res);
	memset(res, 0, sizeof *res);
	if ((rc = run(pl, p, SIM_XFER | SIM_SYNC, 1, 0, &f)))
		return rc;
	sync_result(pl, p, &f, res);
	res->partial = 1;
	return 0;
}

/* The compute and transfer passes, as sim_run runs them; they do not look
 * at bucket layouts (see sim_sync_again), so a layout changed since
 * sim_iteration does not change them. */
int sim_transfers(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	sim_out_t c, x;
	int rc;
	if (uniform(p)) {
		if ((rc = run(pl, p, 0, 0, 0, &c)) || (rc = run(pl, p, SIM_XFER, 0, 0, &x)))
			return rc;
		res->compute_ms = c.iteration * pl->k;
		res->xfer_iteration_ms = x.iteration * pl->k;
		res->transfer_ms = fmax(0, x.iteration - c.iteration) * pl->k;
		res->xfer_last_ms = x.iteration;
		res->busy_before = x.busy_total * (pl->k - 1);
		return 0;
	}
	/* each set of active tasks once, times its micro-steps */
	res->compute_ms = res->xfer_iteration_ms = res->transfer_ms = res->busy_before = 0;
	for (int j = 0, next; j < pl->k; j = next) {
		next = plan_micro_next(&p->model, pl->k, j);
		if ((rc = run(pl, p, 0, 0, j, &c)) || (rc = run(pl, p, SIM_XFER, 0, j, &x)))
			return rc;
		res->compute_ms += c.iteration * (next - j);
		res->xfer_iteration_ms += x.iteration * (next - j);
		res->transfer_ms += fmax(0, x.iteration - c.iteration) * (next - j);
		res->busy_before += x.busy_total * (next - j);
		res->xfer_last_ms = x.iteration;
		if (next == pl->k)
			res->busy_before -= x.busy_total;
	}
	return 0;
}

int sim_complete(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int rc;
	if (!res->partial)
		return 0;
	if ((rc = sim_transfers(pl, p, res)))
		return rc;
	res->sync_ms = fmax(0, res->iteration_ms - res->xfer_iteration_ms / pl->k);
	res->partial = 0;
	return 0;
}
