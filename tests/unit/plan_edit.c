/*
 * plan_edit.c — edits to a plan's programs for tests (plan_edit.h).
 */
#include "plan_edit.h"

#include <stdlib.h>
#include <string.h>

/* A copy of n elements of sz bytes at a (at least one byte: never NULL
 * unless out of memory). */
static void *dup(const void *a, int32_t n, size_t sz)
{
	size_t len = sz * (size_t)(n > 0 ? n : 0);
	void *c = malloc(len + 1);
	if (c && len)
		memcpy(c, a, len);
	return c;
}

int plan_edit_copy(sp_plan_t *out, const sp_plan_t *in)
{
	*out = *in;
	memset(&out->model, 0, sizeof out->model);
	out->metaops = dup(in->metaops, in->n_metaops, sizeof *in->metaops);
	out->ops = dup(in->ops, in->n_ops, sizeof *in->ops);
	out->edges = dup(in->edges, in->n_edges, sizeof *in->edges);
	out->waves = dup(in->waves, in->n_waves, sizeof *in->waves);
	out->slices = dup(in->slices, in->n_slices, sizeof *in->slices);
	out->slice_devs = dup(in->slice_devs, in->n_slice_devs, sizeof *in->slice_devs);
	out->buckets = dup(in->buckets, in->n_buckets, sizeof *in->buckets);
	out->bucket_devs = dup(in->bucket_devs, in->n_bucket_devs, sizeof *in->bucket_devs);
	out->bucket_params = dup(in->bucket_params, in->n_bucket_params, sizeof *in->bucket_params);
	out->devices = dup(in->devices, in->n_devices, sizeof *in->devices);
	out->ins = dup(in->ins, in->n_ins, sizeof *in->ins);
	out->held = dup(in->held, in->n_held, sizeof *in->held);
	out->algos = dup(in->algos, in->n_algos, sizeof *in->algos);
	if (model_copy(&out->model, &in->model) || !out->metaops || !out->ops || !out->edges ||
	    !out->waves || !out->slices || !out->slice_devs || !out->buckets ||
	    !out->bucket_devs || !out->bucket_params || !out->devices || !out->ins ||
	    !out->held || !out->algos) {
		plan_release(out);
		return SP_ENOMEM;
	}
	return 0;
}

sp_ins_t *plan_edit_at(const sp_plan_t *p, int d, int k)
{
	return &p->ins[p->devices[d].first_ins + k];
}

/* Device d's program grows by `by` instructions: later ones start later. */
static void shift_after(sp_plan_t *p, int d, int by)
{
	p->n_ins += by;
	p->devices[d].n_ins += by;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].first_ins += by;
}

void plan_edit_delete(sp_plan_t *p, int d, int k)
{
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g, p->ins + g + 1, sizeof *p->ins * (size_t)(p->n_ins - g - 1));
	shift_after(p, d, -1);
}

int plan_edit_insert(sp_plan_t *p, int d, int k, sp_ins_t in)
{
	sp_ins_t *grown = realloc(p->ins, sizeof *p->ins * (size_t)(p->n_ins + 1));
	if (!grown)
		return SP_ENOMEM;
	p->ins = grown;
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g + 1, p->ins + g, sizeof *p->ins * (size_t)(p->n_ins - g));
	p->ins[g] = in;
	shift_after(p, d, 1);
	return 0;
}

int plan_edit_move(sp_plan_t *p, int d, int from, int to)
{
	sp_ins_t in = *plan_edit_at(p, d, from);
	plan_edit_delete(p, d, from);
	return plan_edit_insert(p, d, to, in);
}

void plan_edit_retarget(sp_plan_t *p, int d, int k, int dst, sp_vref_t v)
{
	sp_ins_t *in = plan_edit_at(p, d, k);
	*(dst ? &in->dst : &in->src) = v;
}

int plan_edit_find_tag(const sp_plan_t *p, int op, int tag, int *dev)
{
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = plan_edit_at(p, d, k);
			if (in->op == op && in->tag == tag) {
				*dev = d;
				return k;
			}
		}
	return -1;
}
