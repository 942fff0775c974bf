/*
 * place.c — maps every slice's device count to concrete devices.
 *
 * Slices are taken in start order; a device is free for a slice when its
 * previous slice ends (nominally) by the slice's start. Among slices that
 * start together, the one with the heaviest incoming flow chooses first.
 * A free device d scores for slice s:
 *   + bytes of s's input that already live on d (the MetaOp's previous
 *     slice, or the producers' last slices: exact sample-range overlap),
 *   + 1/4 of those bytes living elsewhere on d's node (NVLink island),
 *   + the parameter state of s's layers that d already holds (shared
 *     parameters are not duplicated),
 *   - a small memory-balance term.
 * Nodes are filled in order of their free devices' total score, so a group
 * stays inside as few NVLink islands as possible. A device whose memory
 * (held parameter state + saved activations, as memplan.c counts them)
 * would exceed the cap is not eligible; when too few are, the slice takes
 * the least-loaded free devices and memplan reports the overflow.
 *
 * Naive placement (the comparison baseline): the lowest-numbered free
 * devices, in slice order.
 */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	double score;
	int dev;
} cand_t;

static int cmp_cand(const void *a, const void *b)
{
	const cand_t *x = a, *y = b;
	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->dev - y->dev;
}

/* Parameter (component, layer) of MetaOp m's layer l. */
static void op_param(const planner_t *pl, int m, int l, int *comp, int *layer)
{
	const metaop_t *mo = &pl->mops[m];
	const sp_op_t *op = &pl->ops[mo->first_op + l];
	*comp = pl->model->tasks[mo->task].nodes[op->node].comp;
	*layer = op->layer;
}

typedef struct {
	planner_t *pl;
	const sched_t *s;
	double *busy_until;
	double *mem;      /* bytes used per device (nominal) */
	uint8_t *held;    /* [dev][param id] */
	int *param_base;  /* param id of (comp, layer) = param_base[comp] + layer */
	int n_params;
	int *last_slice;  /* per MetaOp: index of its latest placed slice */
	double *on, *island; /* scratch per device */
	uint8_t *node_held; /* [node][param id]: some device of the node holds it */
	uint8_t *any_held;  /* [param id] */
} pstate_t;

static int param_id(const pstate_t *st, int m, int l)
{
	int c, layer;
	op_param(st->pl, m, l, &c, &layer);
	return st->param_base[c] + layer;
}

/* on[d] += bytes of slice i's input that device d holds (its sample range
 * of the MetaOp's previous slice, or of the producers' last slices). */
static void input_on_devices(const pstate_t *st, const place_t *pc, int i, double *on)
{
	const planner_t *pl = st->pl;
	const sslice_t *x = &st->s->s[i];
	const metaop_t *mo = &pl->mops[x->metaop];
	int db = dtype_bytes(pl->model->dtype);
	for (int d = 0; d < pl->N; d++)
		on[d] = 0;
	for (int q = x->lf > 0 ? -1 : 0; q < (x->lf > 0 ? 0 : mo->n_pred); q++) {
		int src = q < 0 ? x->metaop : pl->edges[mo->pred[q]].src;
		double tok = q < 0 ? (double)mo->seq_out * mo->width_out
				   : (double)pl->edges[mo->pred[q]].seq_len * pl->mops[src].width_out;
		int p = st->last_slice[src];
		if (p < 0)
			continue;
		const sslice_t *y = &st->s->s[p];
		for (int j = 0; j < y->n; j++) {
			int32_t b0, b1;
			sample_range(pl->mops[src].batch, j, y->n, &b0, &b1);
			on[pc->devs[pc->off[p] + j]] += (double)(b1 - b0) * tok * db;
		}
	}
}

static double slice_mem(const pstate_t *st, int i, int d, int slot)
{
	const planner_t *pl = st->pl;
	const sslice_t *x = &st->s->s[i];
	const metaop_t *mo = &pl->mops[x->metaop];
	int32_t a0, a1;
	sample_range(mo->batch, slot, x->n, &a0, &a1);
	int64_t local = mo->scales ? a1 - a0 : mo->batch;
	double bytes = (double)local * (double)mo->saved_per_sample * (x->lt - x->lf);
	for (int l = x->lf; l < x->lt; l++)
		if (!st->held[(size_t)d * st->n_params + param_id(st, x->metaop, l)])
			bytes += (double)mo->layer_state_bytes;
	return bytes;
}

static int place_slice(pstate_t *st, place_t *pc, int i, place_kind_t kind)
{
	planner_t *pl = st->pl;
	const sslice_t *x = &st->s->s[i];
	if (x->chunk) {
		/* a chunk continues the previous slice on the same devices */
		int p = st->last_slice[x->metaop];
		memcpy(pc->devs + pc->off[i], pc->devs + pc->off[p], sizeof(int32_t) * (size_t)x->n);
		for (int j = 0; j < x->n; j++) {
			int d = pc->devs[pc->off[i] + j];
			st->mem[d] += slice_mem(st, i, d, j);
			for (int l = x->lf; l < x->lt; l++) {
				int pid = param_id(st, x->metaop, l);
				st->held[(size_t)d * st->n_params + pid] = 1;
				st->node_held[(size_t)dev_node(pl->cluster, d) * st->n_params + pid] = 1;
				st->any_held[pid] = 1;
			}
			st->busy_until[d] = x->t1;
		}
		st->last_slice[x->metaop] = i;
		return 0;
	}
	const metaop_t *mo = &pl->mops[x->metaop];
	int N = pl->N, G = pl->cluster->gpus_per_node;
	cand_t *c = malloc(sizeof *c * (size_t)N);
	double *node_score = calloc((size_t)pl->cluster->nodes, sizeof(double));
	int *node_order = malloc(sizeof(int) * (size_t)pl->cluster->nodes);
	if (!c || !node_score || !node_order) {
		free(c);
		free(node_score);
		free(node_order);
		return SP_ENOMEM;
	}
	double *on = st->on;
	if (kind == PLACE_SPINDLE) {
		input_on_devices(st, pc, i, on);
		for (int q = 0; q < pl->cluster->nodes; q++) {
			double isl = 0;
			for (int e = q * G; e < (q + 1) * G; e++)
				isl += on[e];
			for (int e = q * G; e < (q + 1) * G; e++)
				st->island[e] = isl - on[e];
		}
	}
	int k = 0;
	for (int d = 0; d < N; d++) {
		if (st->busy_until[d] > x->t0 + 1e-9)
			continue;
		double sc = 0;
		if (kind == PLACE_SPINDLE) {
			/* replicas of a layer: on this device no new state; inside
			 * this node the layer's all-reduce stays on NVLink; on
			 * another node only, it would cross the NIC */
			double shared = 0;
			int node = dev_node(pl->cluster, d);
			for (int l = x->lf; l < x->lt; l++) {
				int pid = param_id(st, x->metaop, l);
				if (st->held[(size_t)d * st->n_params + pid])
					shared += (double)mo->layer_state_bytes;
				else if (st->node_held[(size_t)node * st->n_params + pid])
					shared += 0.25 * (double)mo->layer_state_bytes;
				else if (st->any_held[pid])
					shared -= 0.25 * (double)mo->layer_state_bytes;
			}
			/* memory: filling a device gets steeply more expensive (a full
			 * device would force later slices elsewhere or not fit) */
			double after = (st->mem[d] + slice_mem(st, i, d, 0)) / pl->mem_cap;
			sc = on[d] + 0.25 * st->island[d] + shared - 1e-3 * st->mem[d] -
			     after * after * after * after * 0.1 * pl->mem_cap;
			if (after > 1)
				sc -= 1e30; /* over the cap: only if nothing else is free */
		} else {
			sc = -d;
		}
		c[k++] = (cand_t){sc, d};
	}
	if (k < x->n) {
		free(c);
		free(node_score);
		free(node_order);
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "placement: %d devices free for '%s' at %.3f ms, %d needed",
				  k, mo->name, x->t0, x->n);
	}
	qsort(c, (size_t)k, sizeof *c, cmp_cand);
	int32_t *out = pc->devs + pc->off[i];
	if (kind == PLACE_SPINDLE) {
		/* fill nodes in order of their best candidates' total score */
		for (int j = 0; j < k; j++)
			node_score[dev_node(pl->cluster, c[j].dev)] +=
				c[j].score > -1e29 ? c[j].score + 1.0 : -1e6;
		int nn = pl->cluster->nodes;
		for (int q = 0; q < nn; q++)
			node_order[q] = q;
		for (int a = 1; a < nn; a++)
			for (int b = a; b > 0 && node_score[node_order[b]] > node_score[node_order[b - 1]];
			     b--) {
				int t = node_order[b];
				node_order[b] = node_order[b - 1];
				node_order[b - 1] = t;
			}
		/* a group that fits in one node goes to the first node with room */
		int got = 0;
		for (int q = 0; q < nn && got < x->n; q++) {
			int cnt = 0;
			for (int j = 0; j < k; j++)
				cnt += dev_node(pl->cluster, c[j].dev) == node_order[q] &&
				       c[j].score > -1e29;
			if (x->n <= G && cnt < x->n && q + 1 < nn && got == 0) {
				/* look for a later node that holds the whole group */
				int better = 0;
				for (int r = q + 1; r < nn && !better; r++) {
					int cr = 0;
					for (int j = 0; j < k; j++)
						cr += dev_node(pl->cluster, c[j].dev) == node_order[r] &&
						      c[j].score > -1e29;
					better = cr >= x->n;
				}
				if (better)
					continue;
			}
			for (int j = 0; j < k && got < x->n; j++)
				if (dev_node(pl->cluster, c[j].dev) == node_order[q] &&
				    c[j].score > -1e29)
					out[got++] = c[j].dev;
		}
		for (int j = 0; j < k && got < x->n; j++) {
			int dup = 0;
			for (int q = 0; q < got; q++)
				dup |= out[q] == c[j].dev;
			if (!dup)
				out[got++] = c[j].dev;
		}
		/* devices in ascending order keep sample ranges aligned across slices
		 * placed on the same set */
		for (int a = 1; a < x->n; a++)
			for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
				int t = out[b];
				out[b] = out[b - 1];
				out[b - 1] = t;
			}
	} else {
		for (int j = 0; j < x->n; j++)
			out[j] = c[j].dev;
		for (int a = 1; a < x->n; a++)
			for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
				int t = out[b];
				out[b] = out[b - 1];
				out[b - 1] = t;
			}
	}
	for (int j = 0; j < x->n; j++) {
		int d = out[j];
		st->mem[d] += slice_mem(st, i, d, j);
		for (int l = x->lf; l < x->lt; l++) {
			int pid = param_id(st, x->metaop, l);
			st->held[(size_t)d * st->n_params + pid] = 1;
			st->node_held[(size_t)dev_node(pl->cluster, d) * st->n_params + pid] = 1;
			st->any_held[pid] = 1;
		}
		st->busy_until[d] = x->t1;
	}
	st->last_slice[x->metaop] = i;
	free(c);
	free(node_score);
	free(node_order);
	return 0;
}

static double in_bytes(const planner_t *pl, const sslice_t *x)
{
	const metaop_t *mo = &pl->mops[x->metaop];
	return (double)mo->batch * mo->seq_in * mo->width_in;
}

int place_run(planner_t *pl, const sched_t *s, place_kind_t kind, place_t *out)
{
	memset(out, 0, sizeof *out);
	pstate_t st = {.pl = pl, .s = s};
	int rc = 0, total = 0;
	for (int i = 0; i < s->n; i++)
		total += s->s[i].n;
	st.param_base = calloc((size_t)pl->model->n_comps + 1, sizeof(int));
	for (int k = 0; st.param_base && k < pl->model->n_comps; k++) {
		st.param_base[k] = st.n_params;
		const sp_component_t *c = &pl->model->comps[k];
		st.n_params += c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
	}
	out->devs = calloc((size_t)total + 1, sizeof(int32_t));
	out->off = calloc((size_t)s->n + 1, sizeof(int32_t));
	st.busy_until = calloc((size_t)pl->N, sizeof(double));
	st.mem = calloc((size_t)pl->N, sizeof(double));
	st.held = calloc((size_t)pl->N * (size_t)(st.n_params + 1), 1);
	st.last_slice = malloc(sizeof(int) * (size_t)(pl->n_mops + 1));
	st.on = calloc((size_t)pl->N, sizeof(double));
	st.node_held = calloc((size_t)pl->cluster->nodes * (size_t)(st.n_params + 1), 1);
	st.any_held = calloc((size_t)st.n_params + 1, 1);
	st.island = calloc((size_t)pl->N, sizeof(double));
	int *order = malloc(sizeof(int) * (size_t)(s->n + 1));
	if (!st.param_base || !out->devs || !out->off || !st.busy_until || !st.mem ||
	    !st.held || !st.last_slice || !order || !st.on || !st.island || !st.node_held || !st.any_held) {
		rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	for (int m = 0; m < pl->n_mops; m++)
		st.last_slice[m] = -1;
	for (int i = 0, o = 0; i < s->n; i++) {
		out->off[i] = o;
		o += s->s[i].n;
	}
	/* slices starting together: heaviest incoming flow first */
	for (int i = 0; i < s->n; i++)
		order[i] = i;
	for (int i = 0; i < s->n;) {
		int j = i;
		while (j < s->n && fabs(s->s[j].t0 - s->s[i].t0) < 1e-9)
			j++;
		if (kind == PLACE_SPINDLE)
			for (int a = i + 1; a < j; a++)
				for (int b = a; b > i && in_bytes(pl, &s->s[order[b]]) >
							 in_bytes(pl, &s->s[order[b - 1]]);
				     b--) {
					int t = order[b];
					order[b] = order[b - 1];
					order[b - 1] = t;
				}
		for (int a = i; a < j; a++)
			if ((rc = place_slice(&st, out, order[a], kind))) {
				if (rc == SP_ENOMEM)
					rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL,
							"out of memory");
				goto cleanup;
			}
		i = j;
	}
cleanup:
	free(st.param_base);
	free(st.busy_until);
	free(st.mem);
	free(st.held);
	free(st.last_slice);
	free(st.on);
	free(st.node_held);
	free(st.any_held);
	free(st.island);
	free(order);
	if (rc)
		place_release(out);
	return rc;
}

void place_release(place_t *p)
{
	if (!p)
		return;
	free(p->devs);
	free(p->off);
	memset(p, 0, sizeof *p);
}
