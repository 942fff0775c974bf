/*
 * lower.c — turns a placed schedule into the plan: MetaOps, slices, waves,
 * the parameters each device holds, gradient-sync buckets, and one program
 * per device. It decides no timing (sim.c) and checks nothing (verify.c).
 *
 * Sample ranges. Device i of a slice's n gets [i*B/n, (i+1)*B/n). A
 * consumer slot needs its own range of its input (a contrastive loss needs
 * the whole batch), and gets each piece from the producer slot whose range
 * intersects it: the MetaOp's previous slice (act(m, lf)), or, for a
 * MetaOp's first slice, the last slice of every producer (act(p, L_p) into
 * act(m, 0) at the edge's seq offset). Gradients flow back over the same
 * intersections, from the consumer's own range only; the receiver adds them
 * (a producer with several consumers sums their contributions). Pieces that
 * stay on one device are free (same buffer) or a local COPY.
 *
 * Order. All instructions are emitted into one global sequence: forward
 * slices in schedule order, for each device slot its RECVs, its FWD (or
 * LOSS), then its SENDs; then backward slices in reverse order, RECVs, BWD,
 * SENDs. Each device's program is its subsequence. Every RECV comes after
 * its SEND in the global order and sends never block, so no rank can wait
 * on a peer that waits on it (verify.c re-checks by simulation).
 *
 * Sync. A parameter's holders are the devices whose slices use it; params
 * with the same holder set form one bucket (one all-reduce per group). A
 * device issues a bucket's SYNC right after its last instruction that
 * produces gradients of it (overlap), or all SYNCs just before STEP (the
 * paper's variant). STEP waits for all of them.
 */
#include "planner.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
	int ps, pj, cs, cj; /* producer slice/slot, consumer slice/slot */
	int32_t s0, s1, seq_len;
	sp_vref_t src, dst;
	int grad, tag;
} xfer_t;

typedef struct {
	int dev;
	sp_ins_t ins;
} gins_t;

typedef struct {
	planner_t *pl;
	const sched_t *s;
	const place_t *pc;
	xfer_t *x;
	int nx, capx;
	gins_t *g;
	int ng, capg;
	int *order; /* slices in execution order */
	int *prev;  /* per slice: the same MetaOp's previous slice, or -1 */
	int *last;  /* per MetaOp: its last slice */
	int *first; /* per MetaOp: its first slice */
	int *cons_first, *cons_list, *prod_first, *prod_list;
} lstate_t;

static int dev_of(const lstate_t *st, int slice, int slot)
{
	return st->pc->devs[st->pc->off[slice] + slot];
}

static void slot_range(const lstate_t *st, int slice, int slot, int32_t *a, int32_t *b)
{
	const sslice_t *x = &st->s->s[slice];
	sample_range(st->pl->mops[x->metaop].batch, slot, x->n, a, b);
}

static sp_vref_t vref(int m, int l, int grad, int off)
{
	return (sp_vref_t){m, l, grad, off};
}

static int add_xfer(lstate_t *st, xfer_t x)
{
	x.tag = st->nx;
	return SP_PUSH(st->x, st->nx, st->capx, x);
}

static int emit(lstate_t *st, int dev, sp_ins_t ins)
{
	gins_t g = {dev, ins};
	return SP_PUSH(st->g, st->ng, st->capg, g);
}

static sp_ins_t ins_new(int op)
{
	sp_ins_t i;
	memset(&i, 0, sizeof i);
	i.op = op;
	i.slice = -1;
	i.peer = -1;
	i.tag = -1;
	return i;
}

/* All transfers (forward and backward) into consumer slice i. */
static int collect_xfers(lstate_t *st, int i)
{
	const planner_t *pl = st->pl;
	const sslice_t *c = &st->s->s[i];
	const metaop_t *mo = &pl->mops[c->metaop];
	if (mo->source)
		return 0;
	for (int j = 0; j < c->n; j++) {
		int32_t a0, a1, own0, own1;
		slot_range(st, i, j, &own0, &own1);
		a0 = own0;
		a1 = own1;
		if (!mo->scales) {
			a0 = 0;
			a1 = (int32_t)mo->batch;
		}
		int nin = c->lf > 0 ? 1 : mo->n_pred;
		for (int q = 0; q < nin; q++) {
			int p, src_m, src_l, off, len;
			if (c->lf > 0) {
				p = st->prev[i];
				src_m = c->metaop;
				src_l = c->lf;
				off = 0;
				len = mo->seq_out;
			} else {
				const sp_edge_t *e = &pl->edges[mo->pred[q]];
				p = st->last[e->src];
				src_m = e->src;
				src_l = pl->mops[e->src].n_layers;
				off = e->seq_off;
				len = e->seq_len;
			}
			const sslice_t *y = &st->s->s[p];
			for (int k = 0; k < y->n; k++) {
				int32_t b0, b1;
				slot_range(st, p, k, &b0, &b1);
				int same = dev_of(st, p, k) == dev_of(st, i, j);
				int32_t o0 = SP_MAX(a0, b0), o1 = SP_MIN(a1, b1);
				int chain = c->lf > 0; /* same buffer: nothing to move locally */
				if (o0 < o1 && !(same && chain)) {
					xfer_t x = {p, k, i, j, o0, o1, len, vref(src_m, src_l, 0, 0),
						    vref(c->metaop, c->lf, 0, off), 0, 0};
					if (add_xfer(st, x))
						return SP_ENOMEM;
				}
				o0 = SP_MAX(own0, b0);
				o1 = SP_MIN(own1, b1);
				if (o0 < o1 && !(same && chain)) {
					xfer_t x = {i, j, p, k, o0, o1, len,
						    vref(c->metaop, c->lf, 1, off),
						    vref(src_m, src_l, 1, 0), 1, 0};
					if (add_xfer(st, x))
						return SP_ENOMEM;
				}
			}
		}
	}
	return 0;
}

/* Indexes transfers by consumer slot and by producer slot (a slot is one
 * device of one slice: pc->off[slice] + i), keeping their order. */
static int index_xfers(lstate_t *st)
{
	int n = 0;
	for (int i = 0; i < st->s->n; i++)
		n += st->s->s[i].n;
	st->cons_first = calloc((size_t)n + 2, sizeof(int));
	st->prod_first = calloc((size_t)n + 2, sizeof(int));
	st->cons_list = malloc(sizeof(int) * (size_t)(st->nx + 1));
	st->prod_list = malloc(sizeof(int) * (size_t)(st->nx + 1));
	int *cf = calloc((size_t)n + 1, sizeof(int)), *pf = calloc((size_t)n + 1, sizeof(int));
	if (!st->cons_first || !st->prod_first || !st->cons_list || !st->prod_list || !cf ||
	    !pf) {
		free(cf);
		free(pf);
		return SP_ENOMEM;
	}
	for (int k = 0; k < st->nx; k++) {
		st->cons_first[st->pc->off[st->x[k].cs] + st->x[k].cj + 1]++;
		st->prod_first[st->pc->off[st->x[k].ps] + st->x[k].pj + 1]++;
	}
	for (int i = 0; i < n; i++) {
		st->cons_first[i + 1] += st->cons_first[i];
		st->prod_first[i + 1] += st->prod_first[i];
	}
	for (int k = 0; k < st->nx; k++) {
		int c = st->pc->off[st->x[k].cs] + st->x[k].cj;
		int p = st->pc->off[st->x[k].ps] + st->x[k].pj;
		st->cons_list[st->cons_first[c] + cf[c]++] = k;
		st->prod_list[st->prod_first[p] + pf[p]++] = k;
	}
	free(cf);
	free(pf);
	return 0;
}

/* Emits the xfers of one direction touching (slice, slot) on one side. */
static int emit_xfers(lstate_t *st, int slice, int slot, int grad, int incoming)
{
	const int *list = incoming ? st->cons_list : st->prod_list;
	const int *first = incoming ? st->cons_first : st->prod_first;
	int key = st->pc->off[slice] + slot;
	for (int q = first[key]; q < first[key + 1]; q++) {
		const xfer_t *x = &st->x[list[q]];
		if (x->grad != grad)
			continue;
		int pd = dev_of(st, x->ps, x->pj), cd = dev_of(st, x->cs, x->cj);
		sp_ins_t in;
		if (pd == cd) {
			if (!incoming)
				continue; /* local copies are emitted on the consumer side */
			in = ins_new(INS_COPY);
		} else {
			in = ins_new(incoming ? INS_RECV : INS_SEND);
			in.peer = incoming ? pd : cd;
			in.tag = x->tag;
		}
		in.s0 = x->s0;
		in.s1 = x->s1;
		in.seq_len = x->seq_len;
		in.src = x->src;
		in.dst = x->dst;
		if (emit(st, incoming ? cd : pd, in))
			return SP_ENOMEM;
	}
	return 0;
}

int lower_run(planner_t *pl, const sched_t *s, const place_t *pc, sp_plan_t *out)
{
	const sp_model_t *md = pl->model;
	const sp_cluster_t *cl = pl->cluster;
	int N = pl->N, rc = 0;
	lstate_t st = {.pl = pl, .s = s, .pc = pc};
	int *param_base = calloc((size_t)md->n_comps + 1, sizeof(int));
	int n_params = 0;
	uint8_t *held = NULL;
	int *bucket_of = NULL, *fill = NULL, *cnt = NULL, *byd = NULL;
	memset(out, 0, sizeof *out);
	st.order = malloc(sizeof(int) * (size_t)(s->n + 1));
	st.prev = malloc(sizeof(int) * (size_t)(s->n + 1));
	st.last = malloc(sizeof(int) * (size_t)(pl->n_mops + 1));
	st.first = malloc(sizeof(int) * (size_t)(pl->n_mops + 1));
	if (!param_base || !st.order || !st.prev || !st.last || !st.first)
		goto nomem;
	for (int k = 0; k < md->n_comps; k++) {
		param_base[k] = n_params;
		n_params += md->comps[k].type == COMP_TRANSFORMER ? (int)md->comps[k].layers : 1;
	}
	for (int m = 0; m < pl->n_mops; m++)
		st.last[m] = st.first[m] = -1;
	for (int i = 0; i < s->n; i++) {
		int m = s->s[i].metaop;
		st.order[i] = i;
		st.prev[i] = st.last[m];
		st.last[m] = i;
		if (st.first[m] < 0)
			st.first[m] = i;
	}

	/* ---- plan header, model, structure ---- */
	snprintf(out->planner_version, sizeof out->planner_version, "spindle-plan %s",
		 SP_VERSION);
	snprintf(out->algo, sizeof out->algo, "%s", algo_name(s->algo));
	snprintf(out->options, sizeof out->options,
		 "algo=%s placement=%s mem_reserve_gib=%.3f milp_nodes=%d", algo_name(s->algo),
		 pl->opts->placement == PLACE_NAIVE ? "naive" : "spindle",
		 pl->opts->mem_reserve_gib, pl->opts->milp_nodes);
	out->model_hash = md->hash;
	out->cluster_hash = cl->hash;
	if (model_copy(&out->model, md))
		goto nomem;
	snprintf(out->cluster_name, sizeof out->cluster_name, "%s", cl->name);
	snprintf(out->gpu_name, sizeof out->gpu_name, "%s", cl->gpu_name);
	out->nodes = cl->nodes;
	out->gpus_per_node = cl->gpus_per_node;
	out->memory_gib = cl->memory_gib;
	out->mem_reserve_gib = pl->opts->mem_reserve_gib;

	out->n_metaops = pl->n_mops;
	out->n_ops = pl->n_ops;
	out->n_edges = pl->n_edges;
	out->metaops = calloc((size_t)pl->n_mops + 1, sizeof *out->metaops);
	out->ops = calloc((size_t)pl->n_ops + 1, sizeof *out->ops);
	out->edges = calloc((size_t)pl->n_edges + 1, sizeof *out->edges);
	if (!out->metaops || !out->ops || !out->edges)
		goto nomem;
	memcpy(out->ops, pl->ops, sizeof *out->ops * (size_t)pl->n_ops);
	memcpy(out->edges, pl->edges, sizeof *out->edges * (size_t)pl->n_edges);
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		sp_metaop_t *o = &out->metaops[m];
		o->task = mo->task;
		o->shape = mo->shape;
		o->n_layers = mo->n_layers;
		o->first_op = mo->first_op;
		o->seq_in = mo->seq_in;
		o->width_in = mo->width_in;
		o->seq_out = mo->seq_out;
		o->width_out = mo->width_out;
		o->fwd_ms = mo->tf[1];
		o->bwd_ms = mo->tb[1];
		o->profiled = mo->profiled;
		snprintf(o->name, sizeof o->name, "%s", mo->name);
	}

	/* ---- slices and waves ---- */
	out->n_slices = s->n;
	out->n_waves = s->n_waves;
	out->slices = calloc((size_t)s->n + 1, sizeof *out->slices);
	out->waves = calloc((size_t)s->n_waves + 1, sizeof *out->waves);
	int total_devs = 0;
	for (int i = 0; i < s->n; i++)
		total_devs += s->s[i].n;
	out->n_slice_devs = total_devs;
	out->slice_devs = calloc((size_t)total_devs + 1, sizeof(int32_t));
	if (!out->slices || !out->waves || !out->slice_devs)
		goto nomem;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		sp_slice_t *o = &out->slices[i];
		o->wave = x->wave;
		o->metaop = x->metaop;
		o->layer_from = x->lf;
		o->layer_to = x->lt;
		o->n_dev = x->n;
		o->dev_off = pc->off[i];
		o->start_ms = x->t0;
		o->fwd_ms = x->t1 - x->t0;
		memcpy(out->slice_devs + pc->off[i], pc->devs + pc->off[i],
		       sizeof(int32_t) * (size_t)x->n);
		sp_wave_t *w = &out->waves[x->wave];
		if (w->n_slices == 0) {
			w->first_slice = i;
			w->start_ms = x->t0;
		}
		w->n_slices++;
		if (x->t1 - w->start_ms > w->dur_ms)
			w->dur_ms = x->t1 - w->start_ms;
	}

	/* ---- held parameters and buckets ---- */
	held = calloc((size_t)N * (size_t)n_params + 1, 1);
	bucket_of = malloc(sizeof(int) * (size_t)(n_params + 1));
	if (!held || !bucket_of)
		goto nomem;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		for (int l = x->lf; l < x->lt; l++) {
			const sp_op_t *op = &pl->ops[mo->first_op + l];
			int comp = md->tasks[mo->task].nodes[op->node].comp;
			if (md->comps[comp].type == COMP_CONTRASTIVE)
				continue;
			int pid = param_base[comp] + op->layer;
			for (int j = 0; j < x->n; j++)
				held[(size_t)dev_of(&st, i, j) * n_params + pid] = 1;
		}
	}
	out->devices = calloc((size_t)N, sizeof *out->devices);
	if (!out->devices)
		goto nomem;
	out->n_devices = N;
	int total_held = 0;
	for (size_t k = 0; k < (size_t)N * n_params; k++)
		total_held += held[k];
	out->held = calloc((size_t)total_held + 1, sizeof *out->held);
	if (!out->held)
		goto nomem;
	for (int d = 0; d < N; d++) {
		sp_device_t *dv = &out->devices[d];
		dv->node = d / cl->gpus_per_node;
		dv->local = d % cl->gpus_per_node;
		dv->held_off = out->n_held;
		for (int c = 0; c < md->n_comps; c++) {
			int nl = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
			for (int l = 0; l < nl; l++)
				if (held[(size_t)d * n_params + param_base[c] + l])
					out->held[out->n_held++] = (sp_param_t){c, l};
		}
		dv->n_held = out->n_held - dv->held_off;
	}
	/* buckets: params with identical holder sets, in (comp, layer) order */
	out->buckets = calloc((size_t)n_params + 1, sizeof *out->buckets);
	out->bucket_params = calloc((size_t)n_params + 1, sizeof *out->bucket_params);
	out->bucket_devs = calloc((size_t)total_held + 1, sizeof(int32_t));
	if (!out->buckets || !out->bucket_params || !out->bucket_devs)
		goto nomem;
	for (int p = 0; p < n_params; p++)
		bucket_of[p] = -1;
	int *pcomp = malloc(sizeof(int) * (size_t)(n_params + 1));
	int *player = malloc(sizeof(int) * (size_t)(n_params + 1));
	if (!pcomp || !player) {
		free(pcomp);
		free(player);
		goto nomem;
	}
	for (int c = 0; c < md->n_comps; c++) {
		int nl = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
		for (int l = 0; l < nl; l++) {
			pcomp[param_base[c] + l] = c;
			player[param_base[c] + l] = l;
		}
	}
	/* the first slice (in schedule order) touching each param: the backward
	 * runs in reverse, so that slice's BWD is the param's last */
	int *first_use = malloc(sizeof(int) * (size_t)(n_params + 1));
	if (!first_use) {
		free(pcomp);
		free(player);
		goto nomem;
	}
	for (int p = 0; p < n_params; p++)
		first_use[p] = -1;
	for (int i = s->n - 1; i >= 0; i--) {
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		for (int l = x->lf; l < x->lt; l++) {
			const sp_op_t *op = &pl->ops[mo->first_op + l];
			int comp = md->tasks[mo->task].nodes[op->node].comp;
			first_use[param_base[comp] + op->layer] = i;
		}
	}
	/* buckets: params with the same holders whose gradients complete
	 * together (same last slice), in the order their backward completes */
	for (;;) {
		int p = -1;
		for (int q = 0; q < n_params; q++)
			if (bucket_of[q] == -1 && first_use[q] >= 0 &&
			    (p < 0 || first_use[q] > first_use[p]))
				p = q;
		if (p < 0)
			break;
		int any = 0;
		for (int d = 0; d < N && !any; d++)
			any = held[(size_t)d * n_params + p];
		if (!any) { /* parameter-free (contrastive) */
			bucket_of[p] = -2;
			continue;
		}
		int b = out->n_buckets++;
		sp_bucket_t *bk = &out->buckets[b];
		bk->dev_off = out->n_bucket_devs;
		for (int d = 0; d < N; d++)
			if (held[(size_t)d * n_params + p])
				out->bucket_devs[out->n_bucket_devs++] = d;
		bk->n_dev = out->n_bucket_devs - bk->dev_off;
		bk->param_off = out->n_bucket_params;
		for (int q = 0; q < n_params; q++) {
			int same = bucket_of[q] == -1 && first_use[q] == first_use[p];
			for (int d = 0; d < N && same; d++)
				same = held[(size_t)d * n_params + q] == held[(size_t)d * n_params + p];
			if (!same)
				continue;
			bucket_of[q] = b;
			out->bucket_params[out->n_bucket_params++] = (sp_param_t){pcomp[q], player[q]};
			bk->elems += comp_layer_params(&md->comps[pcomp[q]]);
		}
		bk->n_params = out->n_bucket_params - bk->param_off;
		bk->sync_ms = cost_allreduce_ms(cl, out->bucket_devs + bk->dev_off, bk->n_dev,
						bk->elems * dtype_bytes(md->dtype));
	}
	free(first_use);
	free(pcomp);
	free(player);

	/* ---- programs ---- */
	for (int i = 0; i < s->n; i++)
		if ((rc = collect_xfers(&st, i)))
			goto nomem;
	if (index_xfers(&st))
		goto nomem;
	for (int ii = 0; ii < s->n; ii++) {
		int i = st.order[ii];
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		for (int j = 0; j < x->n; j++) {
			if (emit_xfers(&st, i, j, 0, 1))
				goto nomem;
			sp_ins_t in = ins_new(mo->sink ? INS_LOSS : INS_FWD);
			in.slice = i;
			slot_range(&st, i, j, &in.s0, &in.s1);
			in.src = vref(x->metaop, x->lf, 0, 0);
			in.dst = mo->sink ? vref(x->metaop, 0, 1, 0) : vref(x->metaop, x->lt, 0, 0);
			if (emit(&st, dev_of(&st, i, j), in) || emit_xfers(&st, i, j, 0, 0))
				goto nomem;
			if (mo->sink && emit_xfers(&st, i, j, 1, 0))
				goto nomem;
		}
	}
	for (int ii = s->n - 1; ii >= 0; ii--) {
		int i = st.order[ii];
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		if (mo->sink)
			continue;
		for (int j = 0; j < x->n; j++) {
			if (emit_xfers(&st, i, j, 1, 1))
				goto nomem;
			sp_ins_t in = ins_new(INS_BWD);
			in.slice = i;
			slot_range(&st, i, j, &in.s0, &in.s1);
			in.src = vref(x->metaop, x->lt, 1, 0);
			in.dst = vref(x->metaop, x->lf, 1, 0);
			if (emit(&st, dev_of(&st, i, j), in) || emit_xfers(&st, i, j, 1, 0))
				goto nomem;
		}
	}
	/* per-device programs with SYNCs and STEP inserted */
	fill = calloc((size_t)N + 1, sizeof(int));
	cnt = calloc((size_t)N + 1, sizeof(int));
	byd = malloc(sizeof(int) * (size_t)(st.ng + 1));
	if (!fill || !cnt || !byd)
		goto nomem;
	for (int k = 0; k < st.ng; k++)
		cnt[st.g[k].dev + 1]++;
	for (int d = 0; d < N; d++)
		cnt[d + 1] += cnt[d];
	for (int k = 0; k < st.ng; k++)
		byd[cnt[st.g[k].dev] + fill[st.g[k].dev]++] = k;
	int per_dev_extra = 0;
	for (int d = 0; d < N; d++)
		per_dev_extra += out->devices[d].n_held ? out->n_buckets + 1 : 1;
	out->ins = calloc((size_t)(st.ng + per_dev_extra) + 1, sizeof *out->ins);
	if (!out->ins)
		goto nomem;
	int overlap = s->algo != ALGO_PAPER;
	/* buckets over the same device group: every member starts their
	 * all-reduces in the same (bucket) order, so a transport that runs one
	 * group's collectives in order on one communicator cannot deadlock
	 * (the MPI runtime happens to give each bucket its own) */
	int *group = malloc(sizeof(int) * (size_t)(out->n_buckets + 1));
	int *last_pos = malloc(sizeof(int) * (size_t)(out->n_buckets + 1));
	if (!group || !last_pos) {
		free(group);
		free(last_pos);
		goto nomem;
	}
	for (int b = 0; b < out->n_buckets; b++) {
		const sp_bucket_t *bk = &out->buckets[b];
		group[b] = b;
		for (int a = 0; a < b && group[b] == b; a++) {
			const sp_bucket_t *ba = &out->buckets[a];
			if (ba->n_dev == bk->n_dev &&
			    !memcmp(out->bucket_devs + ba->dev_off, out->bucket_devs + bk->dev_off,
				    sizeof(int32_t) * (size_t)bk->n_dev))
				group[b] = group[a];
		}
	}
	int *sync_at = malloc(sizeof(int) * (size_t)(out->n_buckets + 1));
	sp_ins_t *base = malloc(sizeof *base * (size_t)(st.ng + 1));
	if (!sync_at || !base) {
		free(sync_at);
		free(base);
		free(group);
		free(last_pos);
		goto nomem;
	}
	for (int d = 0; d < N; d++) {
		sp_device_t *dv = &out->devices[d];
		dv->first_ins = out->n_ins;
		/* the device's instructions in global order */
		int nd = 0;
		for (int k = cnt[d]; k < cnt[d] + fill[d]; k++)
			base[nd++] = st.g[byd[k]].ins;
		/* each member bucket's SYNC goes before base position sync_at[b]:
		 * after its last gradient-producing instruction (overlap) or at the
		 * end, never before an earlier bucket of the same group */
		for (int b = 0; b < out->n_buckets; b++) {
			const sp_param_t *pr = &out->bucket_params[out->buckets[b].param_off];
			int member = held[(size_t)d * n_params + param_base[pr->comp] + pr->layer];
			sync_at[b] = member ? (overlap ? 0 : nd) : -1;
			last_pos[b] = 0;
		}
		for (int k = 0; overlap && k < nd; k++) {
			const sp_ins_t *in = &base[k];
			if (in->op != INS_BWD && in->op != INS_LOSS)
				continue;
			const sslice_t *x = &s->s[in->slice];
			const metaop_t *mo = &pl->mops[x->metaop];
			for (int l = x->lf; l < x->lt; l++) {
				const sp_op_t *op = &pl->ops[mo->first_op + l];
				int comp = md->tasks[mo->task].nodes[op->node].comp;
				int bb = bucket_of[param_base[comp] + op->layer];
				if (bb >= 0 && sync_at[bb] >= 0)
					sync_at[bb] = k + 1;
			}
		}
		for (int b = 0; b < out->n_buckets; b++)
			if (sync_at[b] >= 0) {
				sync_at[b] = SP_MAX(sync_at[b], last_pos[group[b]]);
				last_pos[group[b]] = sync_at[b];
			}
		/* merge: base instructions with SYNCs in (position, bucket) order */
		int ns = 0;
		for (int b = 0; b < out->n_buckets; b++)
			if (sync_at[b] >= 0) {
				int j = ns++;
				while (j > 0 && sync_at[last_pos[j - 1]] > sync_at[b]) {
					last_pos[j] = last_pos[j - 1];
					j--;
				}
				last_pos[j] = b; /* reused: member buckets sorted by position */
			}
		for (int k = 0, q = 0; k <= nd; k++) {
			for (; q < ns && sync_at[last_pos[q]] == k; q++) {
				sp_ins_t sy = ins_new(INS_SYNC);
				sy.peer = last_pos[q];
				out->ins[out->n_ins++] = sy;
			}
			if (k < nd)
				out->ins[out->n_ins++] = base[k];
		}
		out->ins[out->n_ins++] = ins_new(INS_STEP);
		dv->n_ins = out->n_ins - dv->first_ins;
	}
	free(sync_at);
	free(base);
	free(group);
	free(last_pos);
	goto cleanup;
nomem:
	rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
cleanup:
	free(param_base);
	free(held);
	free(bucket_of);
	free(fill);
	free(cnt);
	free(st.x);
	free(st.g);
	free(st.order);
	free(st.prev);
	free(st.last);
	free(st.first);
	free(st.cons_first);
	free(st.cons_list);
	free(st.prod_first);
	free(st.prod_list);
	free(byd);
	if (rc)
		plan_release(out);
	return rc;
}
