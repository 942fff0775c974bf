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
static int64_t z3_first_fit(const sp_plan_t *p, const int64_t *at, int64_t n)
{
	int64_t x = 0;
	for (int moved = 1; moved;) {
		moved = 0;
		for (int b = 0; b < p->n_buckets; b++)
			if (at[b] >= 0 && at[b] < x + n && x < at[b] + p->buckets[b].elems) {
				x = at[b] + p->buckets[b].elems;
				moved = 1;
			}
	}
	return x;
}

int plan_z3_walk(const sp_plan_t *p, int d, plan_z3_walk_t *out)
{
	const sp_device_t *dv = &p->devices[d];
	sp_z2map_t m;
	int64_t so, sn, live = 0;
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
	int32_t *w = malloc(sizeof(int32_t) * (size_t)cap);
	uint8_t *synced = calloc((size_t)p->n_buckets + 1, 1);
	out->off = malloc(sizeof(int64_t) * (size_t)(dv->n_ins + 1));
	if (!at || !w || !synced || !out->off) {
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
				live -= p->buckets[b].elems;
				continue;
			}
			at[b] = out->off[k] = z3_first_fit(p, at, p->buckets[b].elems);
			out->pool = SP_MAX(out->pool, at[b] + p->buckets[b].elems);
			live += p->buckets[b].elems;
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
