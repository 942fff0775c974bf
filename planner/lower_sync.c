/*
 * lower_sync.c — the lowering's gradient synchronisation (the "Sync" rule
 * in lower.c's header): which devices hold which parameters, the buckets
 * of parameters all-reduced together (or, under zero-1, reduce-scattered
 * and all-gathered), and each device's program: its part of the global
 * sequence (lower_xfer.c) with SYNCs, a STEP and the zero-1 GATHERs put in.
 * It times nothing (the buckets' all-reduce times come from cost.c).
 *
 * Tensor parallelism: member j of a t slice holds shard (t, j) of each of
 * its layers (one degree per layer: tp.c); the holders of shard j form its
 * sync group, so a bucket holds params of one shard (t, j), and its elems
 * are the shards' sizes (comp_layer_params_tp).
 */
#include "lower.h"

#include <stdlib.h>

/* The parameter id of layer l of MetaOp mo. */
static int param_id(const lstate_t *st, const metaop_t *mo, int l, int *comp_out)
{
	const sp_model_t *md = st->pl->model;
	const sp_op_t *op = &st->pl->ops[mo->first_op + l];
	int comp = md->tasks[mo->task].nodes[op->node].comp;
	if (comp_out)
		*comp_out = comp;
	return st->param_base[comp] + op->layer;
}

int lower_held(lstate_t *st, sp_plan_t *out)
{
	const sp_model_t *md = st->pl->model;
	const sched_t *s = st->s;
	int N = st->pl->N, n_params = st->n_params;
	st->held = sp_arena_calloc(st->a, (size_t)N * (size_t)n_params + 1, 1);
	st->ptp = sp_arena_calloc(st->a, (size_t)n_params + 1, sizeof(int));
	out->devices = calloc((size_t)N, sizeof *out->devices);
	if (!st->held || !st->ptp || !out->devices)
		return SP_ENOMEM;
	out->n_devices = N;
	st->tmax = 1;
	for (int p = 0; p < n_params; p++)
		st->ptp[p] = 1;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		int t = x->tp > 1 ? x->tp : 1;
		st->tmax = SP_MAX(st->tmax, t);
		for (int l = x->lf; l < x->lt; l++) {
			int comp, pid = param_id(st, &st->pl->mops[x->metaop], l, &comp);
			if (md->comps[comp].type == COMP_CONTRASTIVE)
				continue;
			st->ptp[pid] = t;
			for (int j = 0; j < x->n; j++)
				st->held[(size_t)lower_dev_of(st, i, j) * n_params + pid] =
					(uint8_t)(1 + j % t);
		}
	}
	int total_held = 0;
	for (size_t k = 0; k < (size_t)N * n_params; k++)
		total_held += st->held[k];
	out->held = calloc((size_t)total_held + 1, sizeof *out->held);
	if (!out->held)
		return SP_ENOMEM;
	for (int d = 0; d < N; d++) {
		sp_device_t *dv = &out->devices[d];
		dv->node = d / st->pl->cluster->gpus_per_node;
		dv->local = d % st->pl->cluster->gpus_per_node;
		dv->held_off = out->n_held;
		for (int c = 0; c < md->n_comps; c++) {
			int nl = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
			for (int l = 0; l < nl; l++) {
				int pid = st->param_base[c] + l,
				    h = st->held[(size_t)d * n_params + pid];
				if (h)
					out->held[out->n_held++] =
						(sp_param_t){c, l, st->ptp[pid], h - 1};
			}
		}
		dv->n_held = out->n_held - dv->held_off;
	}
	return 0;
}

/* The first slice (in schedule order) touching each param: the backward
 * runs in reverse, so that slice's BWD is the param's last. */
static int *first_uses(lstate_t *st)
{
	int *first_use = sp_arena_calloc(st->a, (size_t)st->n_params + 1, sizeof(int));
	if (!first_use)
		return NULL;
	for (int p = 0; p < st->n_params; p++)
		first_use[p] = -1;
	for (int i = st->s->n - 1; i >= 0; i--) {
		const sslice_t *x = &st->s->s[i];
		for (int l = x->lf; l < x->lt; l++)
			first_use[param_id(st, &st->pl->mops[x->metaop], l, NULL)] = i;
	}
	return first_use;
}

/* 1 when device d holds shard r of param id p */
static int holds(const lstate_t *st, int d, int p, int r)
{
	return st->held[(size_t)d * st->n_params + p] == 1 + r;
}

/* A new bucket: every unbucketed param shard with the holders of shard r
 * of p, p's degree and p's last slice, in (comp, layer) order.
 * pcomp/player: each id's comp and layer. */
static void add_bucket(lstate_t *st, sp_plan_t *out, int p, int r, const int *first_use,
		       const int *pcomp, const int *player)
{
	const sp_model_t *md = st->pl->model;
	int N = st->pl->N, n_params = st->n_params, T = st->tmax;
	int b = out->n_buckets++;
	sp_bucket_t *bk = &out->buckets[b];
	bk->dev_off = out->n_bucket_devs;
	for (int d = 0; d < N; d++)
		if (holds(st, d, p, r))
			out->bucket_devs[out->n_bucket_devs++] = d;
	bk->n_dev = out->n_bucket_devs - bk->dev_off;
	bk->param_off = out->n_bucket_params;
	for (int q = 0; q < n_params; q++) {
		int same = r < st->ptp[q] && st->bucket_of[q * T + r] == -1 &&
			   first_use[q] == first_use[p] && st->ptp[q] == st->ptp[p];
		for (int d = 0; d < N && same; d++)
			same = holds(st, d, q, r) == holds(st, d, p, r);
		if (!same)
			continue;
		st->bucket_of[q * T + r] = b;
		out->bucket_params[out->n_bucket_params++] =
			(sp_param_t){pcomp[q], player[q], st->ptp[q], r};
		bk->elems += comp_layer_params_tp(&md->comps[pcomp[q]], st->ptp[q]);
	}
	bk->n_params = out->n_bucket_params - bk->param_off;
	/* --zero 1|2|3 forces the layout on every group of 2 or more devices;
	 * under auto, st->z3 (layout_zero3) the groups of its components */
	int z3 = 0;
	for (int k = 0; st->z3 && k < bk->n_params; k++)
		z3 |= st->z3[out->bucket_params[bk->param_off + k].comp];
	bk->layout = bk->n_dev < 2 ? LAYOUT_REPLICATED
		     : z3 ? LAYOUT_ZERO3
		     : st->pl->opts->zero < 1 ? LAYOUT_REPLICATED
		     : st->pl->opts->zero == 3 ? LAYOUT_ZERO3
		     : st->pl->opts->zero == 2 ? LAYOUT_ZERO2
					       : LAYOUT_ZERO1;
	bk->overlap = layout_grads_sharded(bk->layout) && st->pl->opts->rs_overlap == 1;
	bucket_price(st->pl->cluster, out, bk, dtype_bytes(md->dtype));
	bk->defer = layout_gathers_after_step(bk->layout) && st->pl->opts->defer_gather == 1
			    ? bucket_defer_pieces(st->pl->cluster, out, b, dtype_bytes(md->dtype))
			    : 0;
}

/*
 * The k that bucket b's deferred all-gather is cut for (plan_defer_pieces,
 * bucket defer): the largest of m = min(n_params, 64), m / 2, m / 4, ..., 1 whose
 * pieces, all-gathered one after another (cost_all_gather_ms each: its
 * latency steps plus its bytes), take at most 5% more than one all-gather
 * of the whole bucket. Smaller pieces let the next forward start sooner
 * (its first layer waits for one piece) but pay the collective's latency
 * once each: a real transformer layer (tens to hundreds of MB) is far
 * above where that matters on 8-64 GPUs, a 1024-GPU group's ring of small
 * layers is not.
 */
int bucket_defer_pieces(const sp_cluster_t *c, const sp_plan_t *p, int b, int db)
{
	const sp_bucket_t *bk = &p->buckets[b];
	const int32_t *devs = p->bucket_devs + bk->dev_off;
	int np = bk->n_params;
	/* piece floor(k S_q / E) is 0..k: at most k + 1 pieces, k + 2 bounds */
	int32_t first[64 + 2];
	double whole = cost_all_gather_ms(c, devs, bk->n_dev, bk->elems * db);
	int k = SP_MIN(np, 64); /* a piece is a collective, a request, a wait */
	for (; k > 1; k /= 2) {
		int n = plan_defer_pieces(p, b, k, first, NULL);
		double sum = 0;
		for (int j = 0; j < n; j++) {
			int64_t e = 0;
			for (int q = first[j]; q < first[j + 1]; q++)
				e += plan_z3_param_elems(p, b, q);
			sum += cost_all_gather_ms(c, devs, bk->n_dev, e * db);
		}
		if (sum <= 1.05 * whole)
			break;
	}
	return SP_MAX(k, 1);
}

void bucket_price(const sp_cluster_t *c, const sp_plan_t *p, sp_bucket_t *bk, int db)
{
	const int32_t *devs = p->bucket_devs + bk->dev_off;
	int64_t bytes = bk->elems * db;
	/* zero-1: a reduce-scatter, then an all-gather of the updated shards */
	int z = layout_sharded(bk->layout);
	bk->sync_ms = z ? cost_reduce_scatter_ms(c, devs, bk->n_dev, bytes)
			: cost_allreduce_ms(c, devs, bk->n_dev, bytes);
	bk->gather_ms = z ? cost_all_gather_ms(c, devs, bk->n_dev, bytes) : 0;
}

/* Buckets: params with the same holders whose gradients complete together
 * (same last slice), in the order their backward completes. */
int lower_buckets(lstate_t *st, sp_plan_t *out)
{
	const sp_model_t *md = st->pl->model;
	int N = st->pl->N, n_params = st->n_params, T = st->tmax;
	size_t np = (size_t)n_params + 1, nk = (size_t)n_params * (size_t)T + 1;
	out->buckets = calloc(nk, sizeof *out->buckets);
	out->bucket_params = calloc(nk, sizeof *out->bucket_params);
	out->bucket_devs = calloc((size_t)out->n_held + 1, sizeof(int32_t));
	st->bucket_of = sp_arena_calloc(st->a, nk, sizeof(int));
	int *pcomp = sp_arena_calloc(st->a, np, sizeof(int));
	int *player = sp_arena_calloc(st->a, np, sizeof(int));
	int *first_use = first_uses(st);
	if (!out->buckets || !out->bucket_params || !out->bucket_devs || !st->bucket_of ||
	    !pcomp || !player || !first_use)
		return SP_ENOMEM;
	for (size_t k = 0; k < nk; k++)
		st->bucket_of[k] = -1;
	for (int c = 0; c < md->n_comps; c++) {
		int nl = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
		for (int l = 0; l < nl; l++) {
			pcomp[st->param_base[c] + l] = c;
			player[st->param_base[c] + l] = l;
		}
	}
	for (;;) {
		int p = -1, r = 0;
		for (int q = 0; q < n_params; q++)
			for (int j = 0; j < st->ptp[q]; j++)
				if (st->bucket_of[q * T + j] == -1 && first_use[q] >= 0 &&
				    (p < 0 || first_use[q] > first_use[p])) {
					p = q;
					r = j;
				}
		if (p < 0)
			return 0;
		int any = 0;
		for (int d = 0; d < N && !any; d++)
			any = holds(st, d, p, r);
		if (any)
			add_bucket(st, out, p, r, first_use, pcomp, player);
		else
			st->bucket_of[p * T + r] = -2; /* parameter-free (contrastive) */
	}
}

/* Per-device work arrays of lower_programs. */
typedef struct {
	int overlap;   /* SYNC after a bucket's last gradient, else all before STEP */
	int *group;    /* per bucket: the first bucket over the same devices */
	int *sync_at;  /* per bucket: SYNC before base position; -1 not a member */
	int *last_pos; /* per group: the last SYNC position so far; then reused */
	const gins_t *g; /* the global sequence */
	const int *base; /* the device's part of it: positions in g */
} syncw_t;

/* Buckets over the same device group: every member starts their
 * all-reduces in the same (bucket) order, so a transport that runs one
 * group's collectives in order on one communicator cannot deadlock (the
 * MPI runtime happens to give each bucket its own). */
static void bucket_groups(const sp_plan_t *out, int *group)
{
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
}

/* Each member bucket's SYNC goes before base position sync_at[b]: after
 * its last gradient-producing instruction (overlap) or at the end, never
 * before an earlier bucket of the same group. */
static void sync_positions(const lstate_t *st, const sp_plan_t *out, syncw_t *w, int d,
			   int nd)
{
	for (int b = 0; b < out->n_buckets; b++) {
		const sp_param_t *pr = &out->bucket_params[out->buckets[b].param_off];
		int member = holds(st, d, st->param_base[pr->comp] + pr->layer, pr->tp_rank);
		w->sync_at[b] = member ? (w->overlap ? 0 : nd) : -1;
		w->last_pos[b] = 0;
	}
	for (int k = 0; w->overlap && k < nd; k++) {
		const sp_ins_t *in = &w->g[w->base[k]].ins;
		/* zero-3: the SYNC's reduce-scatter runs on the group of the
		 * bucket's all-gathers, so after the device's last of them (every
		 * member's collectives of a group in one order) */
		if (in->op == INS_PFREE && w->sync_at[in->peer] >= 0)
			w->sync_at[in->peer] = SP_MAX(w->sync_at[in->peer], k + 1);
		if (in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		const sslice_t *x = &st->s->s[in->slice];
		for (int l = x->lf; l < x->lt; l++) {
			int pid = param_id(st, &st->pl->mops[x->metaop], l, NULL),
			    h = st->held[(size_t)d * st->n_params + pid];
			int bb = h ? st->bucket_of[pid * st->tmax + h - 1] : -1;
			if (bb >= 0 && w->sync_at[bb] >= 0)
				w->sync_at[bb] = k + 1;
		}
	}
	for (int b = 0; b < out->n_buckets; b++)
		if (w->sync_at[b] >= 0) {
			w->sync_at[b] = SP_MAX(w->sync_at[b], w->last_pos[w->group[b]]);
			w->last_pos[w->group[b]] = w->sync_at[b];
		}
}

/* Appends device d's program to out->ins: base instructions with SYNCs in
 * (position, bucket) order, then STEP, then a GATHER of each zero-1 bucket
 * in the order of their SYNCs (the same on every member). -1, writing
 * nothing, when that would fill out->ins past cap entries. */
static int merge_syncs(sp_plan_t *out, syncw_t *w, int nd, size_t cap)
{
	int ns = 0, *sorted = w->last_pos; /* reused: member buckets by position */
	for (int b = 0; b < out->n_buckets; b++)
		if (w->sync_at[b] >= 0) {
			int j = ns++;
			while (j > 0 && w->sync_at[sorted[j - 1]] > w->sync_at[b]) {
				sorted[j] = sorted[j - 1];
				j--;
			}
			sorted[j] = b;
		}
	size_t n = (size_t)out->n_ins + (size_t)nd + (size_t)ns + 1;
	for (int q = 0; q < ns; q++)
		n += layout_gathers_after_step(out->buckets[sorted[q]].layout);
	if (n > cap)
		return -1;
	for (int k = 0, q = 0; k <= nd; k++) {
		for (; q < ns && w->sync_at[sorted[q]] == k; q++) {
			sp_ins_t sy = lower_ins_new(INS_SYNC);
			sy.peer = sorted[q];
			out->ins[out->n_ins++] = sy;
		}
		if (k < nd)
			out->ins[out->n_ins++] = w->g[w->base[k]].ins;
	}
	out->ins[out->n_ins++] = lower_ins_new(INS_STEP);
	for (int q = 0; q < ns; q++)
		if (layout_gathers_after_step(out->buckets[sorted[q]].layout)) {
			sp_ins_t ga = lower_ins_new(INS_GATHER);
			ga.peer = sorted[q];
			out->ins[out->n_ins++] = ga;
		}
	return 0;
}

int lower_programs(lstate_t *st, sp_plan_t *out)
{
	int N = st->pl->N, ng = st->ng, nb = out->n_buckets;
	/* the global sequence by device, keeping its order */
	int *fill = sp_arena_calloc(st->a, (size_t)N + 1, sizeof(int));
	int *cnt = sp_arena_calloc(st->a, (size_t)N + 1, sizeof(int));
	int *byd = sp_arena_calloc(st->a, (size_t)ng + 1, sizeof(int));
	syncw_t w = {algo_overlaps_sync(st->s->algo),
		     sp_arena_calloc(st->a, (size_t)nb + 1, sizeof(int)),
		     sp_arena_calloc(st->a, (size_t)nb + 1, sizeof(int)),
		     sp_arena_calloc(st->a, (size_t)nb + 1, sizeof(int)), st->g, NULL};
	if (!fill || !cnt || !byd || !w.group || !w.sync_at || !w.last_pos)
		return SP_ENOMEM;
	for (int k = 0; k < ng; k++)
		cnt[st->g[k].dev + 1]++;
	for (int d = 0; d < N; d++)
		cnt[d + 1] += cnt[d];
	for (int k = 0; k < ng; k++)
		byd[cnt[st->g[k].dev] + fill[st->g[k].dev]++] = k;
	/* exactly what merge_syncs adds: a STEP per device, a SYNC per bucket
	 * member (a bucket's members are the holders of its params), a GATHER
	 * per member of a bucket that gathers after the step; not zeroed (all
	 * written), but for the one entry past the end */
	size_t need = (size_t)ng + (size_t)N + 1;
	for (int b = 0; b < nb; b++)
		need += (size_t)out->buckets[b].n_dev *
			(layout_gathers_after_step(out->buckets[b].layout) ? 2 : 1);
	out->ins = malloc(need * sizeof *out->ins);
	if (!out->ins)
		return SP_ENOMEM;
	bucket_groups(out, w.group);
	for (int d = 0; d < N; d++) {
		sp_device_t *dv = &out->devices[d];
		int nd = fill[d];
		dv->first_ins = out->n_ins;
		w.base = byd + cnt[d];
		sync_positions(st, out, &w, d, nd);
		if (merge_syncs(out, &w, nd, need - 1))
			return sp_err_set(st->pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "device %d's program overruns its %zu instructions", d,
					  need - 1);
		dv->n_ins = out->n_ins - dv->first_ins;
	}
	memset(&out->ins[out->n_ins], 0, sizeof *out->ins * (need - (size_t)out->n_ins));
	return 0;
}
