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

const char *layout_name(int layout)
{
	switch (layout) {
	case LAYOUT_REPLICATED: return "replicated";
	case LAYOUT_ZERO1: return "zero-1";
	case LAYOUT_ZERO2: return "zero-2";
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

int z2map_init(sp_z2map_t *out, const sp_plan_t *p)
{
	const sp_model_t *md = &p->model;
	memset(out, 0, sizeof *out);
	out->dev = -1;
	for (int b = 0; b < p->n_buckets; b++)
		out->n_z2 += p->buckets[b].layout == LAYOUT_ZERO2;
	if (!out->n_z2)
		return 0;
	int slots = 0;
	out->base = malloc(sizeof(int32_t) * (size_t)(md->n_comps + 1));
	for (int c = 0; out->base && c < md->n_comps; c++) {
		out->base[c] = slots;
		slots += md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
	}
	out->first = malloc(sizeof(int32_t) * (size_t)(slots + 1));
	out->next = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_params + 1));
	out->bucket = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_params + 1));
	if (!out->base || !out->first || !out->next || !out->bucket) {
		z2map_release(out);
		return SP_ENOMEM;
	}
	for (int i = 0; i < slots; i++)
		out->first[i] = -1;
	int n = 0;
	for (int b = p->n_buckets - 1; b >= 0; b--) {
		const sp_bucket_t *bk = &p->buckets[b];
		if (bk->layout != LAYOUT_ZERO2)
			continue;
		for (int q = 0; q < bk->n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[bk->param_off + q];
			int s = out->base[pr->comp] + pr->layer;
			out->bucket[n] = b;
			out->next[n] = out->first[s];
			out->first[s] = n++;
		}
	}
	return 0;
}

void z2map_release(sp_z2map_t *m)
{
	if (!m)
		return;
	free(m->base);
	free(m->first);
	free(m->next);
	free(m->bucket);
	free(m->mine);
	memset(m, 0, sizeof *m);
	m->dev = -1;
}

int z2map_for(sp_z2map_t *m, const sp_plan_t *p, int dev)
{
	int64_t off, n;
	if (!m->n_z2)
		return 0;
	if (!m->mine && !(m->mine = malloc((size_t)p->n_buckets + 1)))
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++)
		m->mine[b] = p->buckets[b].layout == LAYOUT_ZERO2 &&
			     bucket_shard(p, b, dev, &off, &n) >= 0;
	m->dev = dev;
	return 0;
}

int z2map_writes(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
		 int32_t *out, int cap)
{
	if (!m->n_z2 || (in->op != INS_BWD && in->op != INS_LOSS))
		return 0;
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *mo = &p->metaops[sl->metaop];
	const sp_task_t *t = &p->model.tasks[mo->task];
	int n = 0;
	int64_t off, cnt;
	/* a LOSS runs the slice's one layer (a loss MetaOp's) */
	int lo = in->op == INS_LOSS ? 0 : sl->layer_from;
	int hi = in->op == INS_LOSS ? 1 : sl->layer_to;
	for (int l = lo; l < hi; l++) {
		const sp_op_t *op = &p->ops[mo->first_op + l];
		int comp = t->nodes[op->node].comp;
		for (int e = m->first[m->base[comp] + op->layer]; e >= 0; e = m->next[e]) {
			int b = m->bucket[e], dup = 0;
			if (m->dev == dev ? !m->mine[b] : bucket_shard(p, b, dev, &off, &cnt) < 0)
				continue;
			for (int j = 0; j < n && !dup; j++)
				dup = out[j] == b;
			if (!dup && n < cap)
				out[n++] = b;
		}
	}
	return n;
}

/* The program of every device run together, round robin, a RECV waiting for
 * its SEND; vc[d][e]: instructions of e that happen before d's next one.
 * At each instruction of d, the zero-2 buckets of d whose members' SYNCs
 * all happen before it become safe there. A plan that cannot finish (the
 * verifier rejects it) leaves the rest at the program's end. */
int plan_z2_safe(const sp_plan_t *p, int every, int32_t **out)
{
	int N = p->n_devices, rc = SP_ENOMEM, any = 0;
	*out = NULL;
	for (int b = 0; b < p->n_buckets; b++)
		any |= p->buckets[b].layout == LAYOUT_ZERO2 || (every && p->buckets[b].n_dev >= 2);
	if (!any)
		return 0;
#define Z2(b) (p->buckets[b].layout == LAYOUT_ZERO2 || (every && p->buckets[b].n_dev >= 2))
	int max_tag = 0;
	for (int i = 0; i < p->n_ins; i++)
		if (p->ins[i].op == INS_SEND || p->ins[i].op == INS_RECV)
			max_tag = SP_MAX(max_tag, p->ins[i].tag + 1);
	int32_t *safe = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	int32_t *sync_at = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	int32_t *vc = calloc((size_t)N * (size_t)N + 1, sizeof(int32_t));
	int32_t **tag_vc = calloc((size_t)max_tag + 1, sizeof(int32_t *));
	int32_t *pc = calloc((size_t)N + 1, sizeof(int32_t));
	/* per device, its zero-2 bucket_devs entries: ent[first[d] .. first[d + 1]) */
	int32_t *first = calloc((size_t)N + 2, sizeof(int32_t));
	int32_t *ent = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	int32_t *bk_of = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	if (!safe || !sync_at || !vc || !tag_vc || !pc || !first || !ent || !bk_of)
		goto cleanup;
	int64_t off, n;
	for (int i = 0; i < p->n_bucket_devs; i++)
		safe[i] = sync_at[i] = -1;
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; Z2(b) && q < p->buckets[b].n_dev; q++) {
			bk_of[p->buckets[b].dev_off + q] = b;
			first[p->bucket_devs[p->buckets[b].dev_off + q] + 2]++;
		}
	for (int d = 0; d < N; d++)
		first[d + 2] += first[d + 1];
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; Z2(b) && q < p->buckets[b].n_dev; q++)
			ent[first[p->bucket_devs[p->buckets[b].dev_off + q] + 1]++] =
				p->buckets[b].dev_off + q;
	for (int d = 0; d < N; d++) {
		const sp_device_t *dv = &p->devices[d];
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p->ins[dv->first_ins + k];
			int q;
			if (in->op == INS_SYNC && Z2(in->peer) &&
			    (q = bucket_shard(p, in->peer, d, &off, &n)) >= 0)
				sync_at[p->buckets[in->peer].dev_off + q] = k;
		}
	}
	for (int moved = 1; moved;) {
		moved = 0;
		for (int d = 0; d < N; d++) {
			const sp_device_t *dv = &p->devices[d];
			int32_t *my = vc + (size_t)d * N;
			for (; pc[d] <= dv->n_ins; pc[d]++) {
				/* the buckets of d safe before instruction pc[d] */
				for (int x = first[d]; x < first[d + 1]; x++) {
					const sp_bucket_t *bk = &p->buckets[bk_of[ent[x]]];
					if (safe[ent[x]] >= 0)
						continue;
					int all = 1;
					for (int j = 0; j < bk->n_dev && all; j++) {
						int e = p->bucket_devs[bk->dev_off + j];
						int s = sync_at[bk->dev_off + j];
						all = s >= 0 && my[e] > s;
					}
					if (all || pc[d] == dv->n_ins)
						safe[ent[x]] = pc[d];
				}
				if (pc[d] == dv->n_ins)
					break;
				const sp_ins_t *in = &p->ins[dv->first_ins + pc[d]];
				if (in->op == INS_RECV) {
					if (in->tag < 0 || !tag_vc[in->tag])
						break; /* its SEND has not run */
					for (int e = 0; e < N; e++)
						my[e] = SP_MAX(my[e], tag_vc[in->tag][e]);
				}
				my[d] = pc[d] + 1;
				if (in->op == INS_SEND && in->tag >= 0 && !tag_vc[in->tag]) {
					tag_vc[in->tag] = malloc(sizeof(int32_t) * (size_t)N);
					if (!tag_vc[in->tag])
						goto cleanup;
					memcpy(tag_vc[in->tag], my, sizeof(int32_t) * (size_t)N);
				}
				moved = 1;
			}
		}
	}
	/* stuck devices: their remaining buckets at the program's end */
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; Z2(b) && q < p->buckets[b].n_dev; q++)
			if (safe[p->buckets[b].dev_off + q] < 0)
				safe[p->buckets[b].dev_off + q] =
					p->devices[p->bucket_devs[p->buckets[b].dev_off + q]].n_ins;
	*out = safe;
	safe = NULL;
	rc = 0;
cleanup:
	for (int t = 0; tag_vc && t < max_tag; t++)
		free(tag_vc[t]);
	free(tag_vc);
	free(safe);
	free(sync_at);
	free(vc);
	free(pc);
	free(first);
	free(ent);
	free(bk_of);
	return rc;
#undef Z2
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
