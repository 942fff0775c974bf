/*
 * plan_util.c — small helpers over a plan that the planner, the runtime and
 * the tools share: instruction names for messages and text views, and the
 * shape of a value act(m, l) / grad(m, l), buckets' shards, the
 * tensor-parallel groups and the owners of split layers' shards. They trust
 * the plan (plan_read has checked every index); they do not check it again.
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

const char *ins_op_name(int op)
{
	switch (op) {
	case INS_FWD: return "fwd";
	case INS_BWD: return "bwd";
	case INS_SEND: return "send";
	case INS_RECV: return "recv";
	case INS_COPY: return "copy";
	case INS_LOSS: return "loss";
	case INS_SYNC: return "sync";
	case INS_STEP: return "step";
	case INS_GATHER: return "gather";
	case INS_PGATHER: return "pgather";
	case INS_PFREE: return "pfree";
	default: return "?";
	}
}

/* Boundary 0 is the MetaOp's input; every boundary l >= 1 has its output
 * shape; l = -1 is a cross-attention MetaOp's memory. */
void plan_value_shape(const sp_plan_t *p, int m, int l, int32_t *seq, int32_t *width)
{
	const sp_metaop_t *mo = &p->metaops[m];
	if (l < 0) {
		*seq = (int32_t)mo->shape.mem_seq;
		*width = (int32_t)mo->shape.mem_width;
		return;
	}
	*seq = l == 0 ? mo->seq_in : mo->seq_out;
	*width = l == 0 ? mo->width_in : mo->width_out;
}

int plan_task_k(const sp_plan_t *p, int task)
{
	int32_t k = p->model.tasks[task].microbatches;
	return k > 0 ? k : SP_MAX(p->microbatches, 1);
}

int plan_micro_next(const sp_model_t *m, int K, int j)
{
	int next = K;
	for (int t = 0; t < m->n_tasks; t++) {
		int k = m->tasks[t].microbatches > 0 ? m->tasks[t].microbatches : K;
		if (k > j && k < next)
			next = k;
	}
	return SP_MAX(next, j + 1);
}

int plan_ins_task(const sp_plan_t *p, const sp_ins_t *in)
{
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: return p->metaops[p->slices[in->slice].metaop].task;
	case INS_SEND:
	case INS_COPY: return p->metaops[in->src.metaop].task;
	case INS_RECV: return p->metaops[in->dst.metaop].task;
	default: return -1;
	}
}

int plan_ins_active(const sp_plan_t *p, const sp_ins_t *in, int j)
{
	int t = plan_ins_task(p, in);
	return t < 0 || plan_task_k(p, t) > j;
}

const char *layout_name(int layout)
{
	switch (layout) {
	case LAYOUT_REPLICATED: return "replicated";
	case LAYOUT_ZERO1: return "zero-1";
	case LAYOUT_ZERO2: return "zero-2";
	case LAYOUT_ZERO3: return "zero-3";
	default: return "?";
	}
}

int bucket_shard(const sp_plan_t *p, int b, int dev, int64_t *off, int64_t *n)
{
	const sp_bucket_t *bk = &p->buckets[b];
	const int32_t *dv = p->bucket_devs + bk->dev_off;
	int lo = 0, hi = bk->n_dev; /* ascending: binary search */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (dv[mid] < dev)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == bk->n_dev || dv[lo] != dev)
		return -1;
	*off = 0;
	*n = bk->elems;
	if (layout_sharded(bk->layout)) {
		*off = bk->elems * lo / bk->n_dev;
		*n = bk->elems * (lo + 1) / bk->n_dev - *off;
	}
	return lo;
}

int plan_tp_groups(const sp_plan_t *p, sp_tp_group_t **out, int *n, int32_t **at)
{
	int32_t *grp = malloc(sizeof(int32_t) * (size_t)(p->n_slice_devs + 1));
	sp_tp_group_t *g = NULL;
	int ng = 0, cap = 0;
	*out = NULL;
	*n = 0;
	if (at)
		*at = NULL;
	if (!grp)
		return SP_ENOMEM;
	for (int i = 0; i < p->n_slice_devs; i++)
		grp[i] = -1;
	for (int k = 0; k < p->n_slices; k++) {
		const sp_slice_t *s = &p->slices[k];
		for (int r = 0; s->tp > 1 && r < s->n_dev / s->tp; r++) {
			int32_t off = s->dev_off + r * s->tp;
			const int32_t *d = p->slice_devs + off;
			int q = 0;
			while (q < ng && !(g[q].t == s->tp &&
					   !memcmp(p->slice_devs + g[q].off, d, sizeof *d * (size_t)s->tp)))
				q++;
			if (q == ng && SP_PUSH(g, ng, cap, ((sp_tp_group_t){k, off, s->tp}))) {
				free(g);
				free(grp);
				return SP_ENOMEM;
			}
			for (int j = 0; j < s->tp; j++)
				grp[off + j] = q;
		}
	}
	*out = g;
	*n = ng;
	if (at)
		*at = grp;
	else
		free(grp);
	return 0;
}

int plan_shard_owner(const sp_plan_t *p, int comp, int layer, int j, int *tp)
{
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; q < p->buckets[b].n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[p->buckets[b].param_off + q];
			if (pr->comp == comp && pr->layer == layer && pr->tp_rank == j) {
				if (tp)
					*tp = pr->tp;
				return p->bucket_devs[p->buckets[b].dev_off];
			}
		}
	return -1;
}

__extension__ typedef __int128 i128;

void plan_defer_use(const sp_plan_t *p, int d, int b, int32_t *k, int32_t *pos)
{
	const sp_device_t *dv = &p->devices[d];
	int n = p->buckets[b].n_params, left = n, step = dv->n_ins;
	/* the least box of (component, layer) holding b's params: a layer
	 * outside it is none of them (the same answer as plan_z3_use's scan) */
	int32_t c0 = INT32_MAX, c1 = INT32_MIN, l0 = INT32_MAX, l1 = INT32_MIN, c, l;
	for (int q = 0; q < n; q++) {
		const sp_param_t *pr = &p->bucket_params[p->buckets[b].param_off + q];
		k[q] = -1;
		c0 = SP_MIN(c0, pr->comp);
		c1 = SP_MAX(c1, pr->comp);
		l0 = SP_MIN(l0, pr->layer);
		l1 = SP_MAX(l1, pr->layer);
	}
	for (int j = 0; j < dv->n_ins && left; j++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + j];
		if (in->op == INS_STEP) {
			step = j;
			break;
		}
		if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		for (int i = 0, q; plan_z3_layer(p, in, i, &c, &l) == 0; i++)
			if (c >= c0 && c <= c1 && l >= l0 && l <= l1 &&
			    (q = plan_z3_use(p, b, in, i)) >= 0 && k[q] < 0) {
				k[q] = j;
				pos[q] = i;
				left--;
			}
	}
	for (int q = 0; q < n; q++)
		if (k[q] < 0) {
			k[q] = step;
			pos[q] = 0;
		}
}

int plan_defer_pieces(const sp_plan_t *p, int b, int k, int32_t *first, int32_t *order)
{
	const sp_bucket_t *bk = &p->buckets[b];
	int n = 0, np = bk->n_params;
	int64_t at = 0, E = SP_MAX(bk->elems, 1), last = -1;
	k = SP_MAX(k, 1);
	for (int q = 0; q < np; q++) { /* piece floor(k S_q / E), S_q = at */
		int64_t j = (int64_t)((i128)k * at / E);
		if (j != last)
			first[n++] = q;
		last = j;
		at += plan_z3_param_elems(p, b, q);
	}
	first[n] = np;
	if (!order)
		return n;
	int32_t *uk = malloc(sizeof(int32_t) * (size_t)(2 * np + 2 * n + 2));
	if (!uk)
		return SP_ENOMEM;
	int32_t *pos = uk + np, *pk = pos + np, *pp = pk + n + 1;
	plan_defer_use(p, p->bucket_devs[bk->dev_off], b, uk, pos);
	for (int j = 0; j < n; j++) {
		pk[j] = INT32_MAX;
		pp[j] = 0;
		for (int q = first[j]; q < first[j + 1]; q++)
			if (uk[q] < pk[j] || (uk[q] == pk[j] && pos[q] < pp[j])) {
				pk[j] = uk[q];
				pp[j] = pos[q];
			}
		int i = j; /* insertion, stable: ties keep param order */
		for (; i > 0 && (pk[order[i - 1]] > pk[j] ||
				 (pk[order[i - 1]] == pk[j] && pp[order[i - 1]] > pp[j]));
		     i--)
			order[i] = order[i - 1];
		order[i] = j;
	}
	free(uk);
	return n;
}
