/*
 * plan_zero3.c — the walk of a device's zero-3 full weights (layout 3),
 * shared by plan_mem.c (the prediction), the verifier (use before the
 * gather, after the free) and the runtime (where each gathered bucket is
 * placed in its one pool). A zero-3 member keeps only its shard of the
 * bucket's weights (bucket_shard's range, as its optimizer state); a
 * PGATHER all-gathers the full weights into the pool, a PFREE gives them
 * back. Gradients of zero-3 buckets follow the zero-2 rules (plan_zero2.c).
 * Trusts the plan (plan_read has checked every index).
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

/* First fit: the lowest offset where n elements fit between the live
 * buckets b (at[b] >= 0: elements [at[b], at[b] + elems)). */
static int64_t z3_first_fit(const sp_plan_t *p, const int64_t *at, const int64_t *sz, int64_t n)
{
	int64_t x = 0;
	for (int moved = 1; moved;) {
		moved = 0;
		for (int b = 0; b < p->n_buckets; b++)
			if (at[b] >= 0 && at[b] < x + n && x < at[b] + sz[b]) {
				x = at[b] + sz[b];
				moved = 1;
			}
	}
	return x;
}


/* Index in zero-3 bucket b's params of (comp, layer), or -1. */
static int z3_param(const sp_plan_t *p, int b, int comp, int layer)
{
	const sp_bucket_t *bk = &p->buckets[b];
	for (int q = 0; q < bk->n_params; q++) {
		const sp_param_t *pr = &p->bucket_params[bk->param_off + q];
		if (pr->comp == comp && pr->layer == layer)
			return q;
	}
	return -1;
}

int64_t plan_z3_param_elems(const sp_plan_t *p, int b, int q)
{
	const sp_param_t *pr = &p->bucket_params[p->buckets[b].param_off + q];
	return comp_layer_params_tp(&p->model.comps[pr->comp], pr->tp);
}

int plan_z3_layer(const sp_plan_t *p, const sp_ins_t *in, int i, int32_t *comp, int32_t *layer)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *mo = &p->metaops[sl->metaop];
	const sp_task_t *t = &p->model.tasks[mo->task];
	int lo = in->op == INS_LOSS ? 0 : sl->layer_from;
	int hi = in->op == INS_LOSS ? 1 : sl->layer_to;
	if (i >= hi - lo)
		return -2;
	int l = in->op == INS_BWD ? hi - 1 - i : lo + i;
	const sp_op_t *op = &p->ops[mo->first_op + l];
	*comp = t->nodes[op->node].comp;
	*layer = op->layer;
	return 0;
}

int plan_z3_use(const sp_plan_t *p, int b, const sp_ins_t *in, int i)
{
	int32_t comp, layer;
	if (plan_z3_layer(p, in, i, &comp, &layer))
		return -2;
	return z3_param(p, b, comp, layer);
}

/* The layers of bucket b that device d's uses from instruction k + 1 to
 * the next PFREE of b run, in their order (a FWD ascending, a BWD
 * descending, a LOSS its one layer; a layer used twice in a row once):
 * their count, in *out (malloc'd), or SP_ENOMEM. */
static int z3_own(const sp_plan_t *p, int d, int k, int b, int32_t **out)
{
	const sp_device_t *dv = &p->devices[d];
	int n = 0, cap = 1;
	*out = NULL;
	for (int j = k + 1; j < dv->n_ins; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		if (in->op == INS_PFREE && in->peer == b)
			break;
		if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS)
			cap += p->slices[in->slice].layer_to - p->slices[in->slice].layer_from + 1;
	}
	int32_t *s = malloc(sizeof(int32_t) * (size_t)cap);
	if (!s)
		return SP_ENOMEM;
	for (int j = k + 1; j < dv->n_ins; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		if (in->op == INS_PFREE && in->peer == b)
			break;
		if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		for (int i = 0, q; (q = plan_z3_use(p, b, in, i)) != -2; i++)
			if (q >= 0 && (n == 0 || s[n - 1] != q) && n < cap)
				s[n++] = q;
	}
	*out = s;
	return n;
}

/* 1 when device d's uses from instruction k + 1 to the next PFREE of b
 * run some layer of bucket b (z3_own's count > 0, without the list). */
static int z3_has_use(const sp_plan_t *p, int d, int k, int b)
{
	const sp_device_t *dv = &p->devices[d];
	for (int j = k + 1; j < dv->n_ins; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		if (in->op == INS_PFREE && in->peer == b)
			return 0;
		if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		for (int i = 0, q; (q = plan_z3_use(p, b, in, i)) != -2; i++)
			if (q >= 0)
				return 1;
	}
	return 0;
}

int plan_z3_span(const sp_plan_t *p, int d, int k, int32_t **out, int *whole)
{
	const sp_device_t *dv = &p->devices[d];
	int b = p->ins[dv->first_ins + k].peer, nth = 0, found = 0, n = 0;
	const sp_bucket_t *bk = &p->buckets[b];
	*out = NULL;
	*whole = 0;
	for (int j = 0; j <= k; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		nth += in->op == INS_PGATHER && in->peer == b;
	}
	/* the first member's order; whole when a member has no use there */
	for (int q = 0; q < bk->n_dev && !*whole; q++) {
		int m = p->bucket_devs[bk->dev_off + q], seen = 0, used = 0;
		const sp_device_t *mv = &p->devices[m];
		for (int j = 0; j < mv->n_ins && seen < nth; j++) {
			const sp_ins_t *in = &p->ins[mv->first_ins + j];
			if (in->op != INS_PGATHER || in->peer != b || ++seen < nth)
				continue;
			if (found) { /* the order is known: only whether m uses it */
				used = z3_has_use(p, m, j, b);
				continue;
			}
			int32_t *own = NULL;
			used = z3_own(p, m, j, b, &own);
			if (used < 0) {
				free(*out);
				*out = NULL;
				return used;
			}
			if (used) {
				*out = own;
				n = used;
				found = 1;
			} else {
				free(own);
			}
		}
		*whole = !used;
	}
	if (*whole) {
		free(*out);
		*out = NULL;
		n = 0;
	}
	return n;
}

int64_t plan_z3_room(const sp_plan_t *p, int b, const int32_t *seq, int n, int64_t *slot1,
		     int64_t *pair)
{
	int64_t m[2] = {0, 0};
	*pair = 0;
	for (int i = 0; i < n; i++) {
		int64_t e = plan_z3_param_elems(p, b, seq[i]);
		m[i % 2] = SP_MAX(m[i % 2], e);
		*pair = SP_MAX(*pair, e + (i + 1 < n ? plan_z3_param_elems(p, b, seq[i + 1]) : 0));
	}
	*slot1 = m[0];
	return m[0] + m[1];
}

/* The room device d's PGATHER k needs (plan_z3_room over the span's
 * gathers, plan_z3_span; a whole span: the bucket) in *size, and in *live
 * the most of it full at once. Names in out a program whose own uses
 * there run the bucket's layers in another order than the members'
 * common one. 0 or SP_ENOMEM. */
static int z3_span_size(const sp_plan_t *p, int d, int k, int64_t *size, int64_t *live,
			plan_z3_walk_t *out)
{
	int b = p->ins[p->devices[d].first_ins + k].peer;
	int32_t *ref = NULL, *own = NULL;
	int whole, n = plan_z3_span(p, d, k, &ref, &whole);
	int m = n < 0 || whole ? 0 : z3_own(p, d, k, b, &own);
	int64_t slot1;
	*size = *live = whole ? p->buckets[b].elems : 0;
	if (n < 0 || m < 0) {
		free(ref);
		free(own);
		return SP_ENOMEM;
	}
	if (!whole)
		*size = plan_z3_room(p, b, ref, n, &slot1, live);
	if (m && (m != n || memcmp(own, ref, sizeof(int32_t) * (size_t)n)) && out->bad < 0) {
		out->bad = k;
		out->why = "opens weights whose layers its uses run in another order than the "
			   "bucket's other members (the per-layer all-gathers must match)";
	}
	free(ref);
	free(own);
	return 0;
}

int plan_z3_walk(const sp_plan_t *p, int d, plan_z3_walk_t *out)
{
	const sp_device_t *dv = &p->devices[d];
	sp_z2map_t m;
	int64_t so, sn, live = 0, lwhole = 0;
	int rc = 0, cap = 2, any = 0;
	memset(out, 0, sizeof *out);
	out->bad = -1;
	for (int b = 0; b < p->n_buckets; b++)
		any |= p->buckets[b].layout == LAYOUT_ZERO3;
	if (!any)
		return 0;
	if (z2map_init(&m, p) || z2map_for(&m, p, d)) {
		z2map_release(&m);
		return SP_ENOMEM;
	}
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op == INS_FWD || in->op == INS_BWD)
			cap = SP_MAX(cap, p->slices[in->slice].layer_to -
						  p->slices[in->slice].layer_from + 1);
	}
	int64_t *at = malloc(sizeof(int64_t) * (size_t)(p->n_buckets + 1));
	int64_t *sz = calloc((size_t)p->n_buckets + 1, sizeof(int64_t));
	int64_t *lv = calloc((size_t)p->n_buckets + 1, sizeof(int64_t));
	int32_t *w = malloc(sizeof(int32_t) * (size_t)cap);
	uint8_t *synced = calloc((size_t)p->n_buckets + 1, 1);
	out->off = malloc(sizeof(int64_t) * (size_t)(dv->n_ins + 1));
	if (!at || !sz || !lv || !w || !synced || !out->off) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int b = 0; b < p->n_buckets; b++) {
		at[b] = -1;
		if (p->buckets[b].layout == LAYOUT_ZERO3 && bucket_shard(p, b, d, &so, &sn) >= 0) {
			out->shards += sn;
			out->fulls += p->buckets[b].elems;
		}
	}
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		out->off[k] = -1;
		if (in->op == INS_SYNC && p->buckets[in->peer].layout == LAYOUT_ZERO3)
			synced[in->peer] = 1;
		if (in->op == INS_PGATHER && synced[in->peer] && out->bad < 0) {
			out->bad = k;
			out->why = "gathers the weights of a zero-3 bucket after its SYNC (a "
				   "group's collectives run in one order on every member)";
		}
		if (in->op == INS_PGATHER || in->op == INS_PFREE) {
			int b = in->peer, gathered = at[b] >= 0;
			if (bucket_shard(p, b, d, &so, &sn) < 0) {
				if (out->bad < 0) {
					out->bad = k;
					out->why = "is not a member of the bucket";
				}
				continue;
			}
			if (gathered == (in->op == INS_PGATHER)) {
				if (out->bad < 0) {
					out->bad = k;
					out->why = gathered ? "gathers weights already gathered"
							    : "frees weights not gathered";
				}
				continue;
			}
			if (in->op == INS_PFREE) {
				at[b] = -1;
				live -= lv[b];
				lwhole -= p->buckets[b].elems;
				continue;
			}
			if ((rc = z3_span_size(p, d, k, &sz[b], &lv[b], out)) < 0)
				goto cleanup;
			rc = 0;
			at[b] = out->off[k] = z3_first_fit(p, at, sz, sz[b]);
			out->pool = SP_MAX(out->pool, at[b] + sz[b]);
			live += lv[b];
			lwhole += p->buckets[b].elems;
			out->whole = SP_MAX(out->whole, lwhole);
			out->peak = SP_MAX(out->peak, live);
			continue;
		}
		int nu = z3map_uses(&m, p, d, in, w, cap);
		for (int j = 0; j < nu && out->bad < 0; j++)
			if (at[w[j]] < 0) {
				out->bad = k;
				out->why = "uses zero-3 weights not gathered (before their PGATHER "
					   "or after their PFREE)";
			}
	}
	for (int b = 0; b < p->n_buckets && out->bad < 0; b++)
		if (at[b] >= 0) {
			out->bad = dv->n_ins - 1;
			out->why = "ends with zero-3 weights still gathered (no PFREE)";
		}
cleanup:
	free(at);
	free(sz);
	free(lv);
	free(w);
	free(synced);
	z2map_release(&m);
	if (rc)
		plan_z3_walk_release(out);
	return rc;
}

void plan_z3_walk_release(plan_z3_walk_t *w)
{
	if (!w)
		return;
	free(w->off);
	w->off = NULL;
}
