/*
 * place.c — maps every slice's device count to concrete devices. It is a
 * pass (place_run) and, through the placer, a service our scheduler calls
 * while it schedules, so that it can respect memory device by device.
 *
 * A device is free for a slice when its previous slice ends (nominally) by
 * the slice's start. Among slices that start together, the one with the
 * heaviest incoming flow chooses first. A free device d scores for slice s:
 *   + bytes of s's input that already live on d (the MetaOp's previous
 *     slice, or the producers' last slices),
 *   + 1/4 of those bytes living elsewhere on d's node (NVLink island),
 *   + the parameter state of s's layers that d already holds (no new
 *     replica), + 1/4 of it when another device of d's node holds them
 *     (their all-reduce stays on NVLink), - 1/4 when only other nodes do,
 *   - a memory term that grows steeply as d fills: (used / cap)^4 * cap/10.
 * Nodes are filled in order of their free devices' total score, so a group
 * stays inside as few NVLink islands as possible. A device whose memory
 * (held parameter state + saved activations, as memplan counts them, and a
 * decoder's memory buffers act(c, -1) and grad(c, -1) once per device for
 * the span from the lowest to the highest sample its slots of c hold, as
 * plan_mem.c counts them and the runtime allocates them) would exceed the
 * cap is taken only when nothing else is free; memplan then reports the
 * overflow.
 *
 * Naive placement (the comparison baseline): the lowest-numbered free
 * devices, in slice order.
 */
#include "planner.h"
#include "tp.h"
#include "sort.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OVER_CAP (-1e30)

typedef struct {
	double score;
	int dev;
} cand_t;

struct placer {
	planner_t *pl;
	place_kind_t kind;
	double *busy_until, *mem;
	uint8_t *held;      /* [dev][param id] */
	uint8_t *held_t;    /* the same, [param id][dev] */
	uint16_t *held_cnt; /* [dev]: placer_fitting's count */
	uint8_t *node_held; /* [node][param id] */
	uint8_t *any_held;  /* [param id] */
	int *param_base, n_params;
	int *op_pid; /* [operator]: param_id of its MetaOp layer, computed once */
	int32_t *last_devs; /* [MetaOp][N]: devices of its latest slice */
	int *last_n;
	int32_t *mem_span; /* [MetaOp][N][2]: the samples [lo, hi) of a
			    * decoder's memory buffers counted on each device
			    * (lo >= hi: none); decoders only (mem_row) */
	int *mem_row;      /* [MetaOp]: its row in mem_span, or -1 */
	double *on, *island, *node_score;
	int *node_order, *node_cnt, *node_head, *cand_next;
	cand_t *cand, *node_cand;
	/* slice_mem's sums for the last (MetaOp, layers, width, samples) it
	 * priced without memory buffers: by_unheld[k] with k layers not held */
	double *by_unheld;
	int key[5];
};

/* Best score first, ties by device: a total order (sort.h). */
#define CAND_BEFORE(x, y) ((x).score > (y).score || ((x).score == (y).score && (x).dev < (y).dev))
SP_SORT_DEFINE(cand_sort, cand_t, CAND_BEFORE)

/* The (component, layer) slot of MetaOp m's layer l. */
static int param_id_of(const placer_t *P, int m, int l)
{
	const metaop_t *mo = &P->pl->mops[m];
	const sp_op_t *op = &P->pl->ops[mo->first_op + l];
	int comp = P->pl->model->tasks[mo->task].nodes[op->node].comp;
	return P->param_base[comp] + op->layer;
}

static int param_id(const placer_t *P, int m, int l)
{
	return P->op_pid[P->pl->mops[m].first_op + l];
}

int placer_new(placer_t **out, planner_t *pl, place_kind_t kind)
{
	sp_arena_t *a = &pl->scratch; /* the candidate's scope */
	placer_t *P = sp_arena_calloc(a, 1, sizeof *P);
	*out = NULL;
	if (!P)
		return SP_ENOMEM;
	int N = pl->N, M = pl->n_mops, nodes = pl->cluster->nodes;
	P->pl = pl;
	P->kind = kind;
	P->param_base = sp_arena_calloc(a, (size_t)pl->model->n_comps + 1, sizeof(int));
	for (int k = 0; P->param_base && k < pl->model->n_comps; k++) {
		P->param_base[k] = P->n_params;
		const sp_component_t *c = &pl->model->comps[k];
		P->n_params += c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
	}
	P->op_pid = sp_arena_calloc(a, (size_t)pl->n_ops + 1, sizeof(int));
	for (int m = 0; P->param_base && P->op_pid && m < M; m++)
		for (int l = 0; l < pl->mops[m].n_layers; l++)
			P->op_pid[pl->mops[m].first_op + l] = param_id_of(P, m, l);
	P->busy_until = sp_arena_calloc(a, (size_t)N, sizeof(double));
	P->mem = sp_arena_calloc(a, (size_t)N, sizeof(double));
	P->held = sp_arena_calloc(a, (size_t)N * (size_t)(P->n_params + 1), 1);
	P->held_t = sp_arena_calloc(a, (size_t)N * (size_t)(P->n_params + 1), 1);
	P->held_cnt = sp_arena_calloc(a, (size_t)N, sizeof(uint16_t));
	P->node_held = sp_arena_calloc(a, (size_t)nodes * (size_t)(P->n_params + 1), 1);
	P->any_held = sp_arena_calloc(a, (size_t)P->n_params + 1, 1);
	P->last_devs = sp_arena_calloc(a, (size_t)M * (size_t)N + 1, sizeof(int32_t));
	P->last_n = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	P->mem_row = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	int decoders = 0;
	for (int m = 0; P->mem_row && m < M; m++)
		P->mem_row[m] = pl->mops[m].shape.mem_seq > 0 ? decoders++ : -1;
	/* rows for decoders only: calloc's zeros are empty spans */
	P->mem_span = sp_arena_calloc(a, (size_t)decoders * (size_t)N * 2 + 1, sizeof(int32_t));
	P->on = sp_arena_calloc(a, (size_t)N, sizeof(double));
	P->island = sp_arena_calloc(a, (size_t)N, sizeof(double));
	P->node_score = sp_arena_calloc(a, (size_t)nodes, sizeof(double));
	P->node_order = sp_arena_calloc(a, (size_t)nodes, sizeof(int));
	P->node_cnt = sp_arena_calloc(a, (size_t)nodes, sizeof(int));
	P->node_head = sp_arena_calloc(a, (size_t)nodes, sizeof(int));
	P->cand_next = sp_arena_calloc(a, (size_t)N, sizeof(int));
	P->cand = sp_arena_calloc(a, (size_t)N, sizeof(cand_t));
	P->node_cand = sp_arena_calloc(a, (size_t)nodes, sizeof(cand_t));
	int most = 0;
	for (int m = 0; m < M; m++)
		most = SP_MAX(most, pl->mops[m].n_layers);
	P->by_unheld = sp_arena_calloc(a, (size_t)most + 1, sizeof(double));
	P->key[0] = -1;
	if (!P->param_base || !P->op_pid || !P->busy_until || !P->mem || !P->held ||
	    !P->node_held || !P->any_held || !P->last_devs || !P->last_n || !P->mem_span ||
	    !P->mem_row || !P->on ||
	    !P->island ||
	    !P->node_score || !P->node_order || !P->cand || !P->node_cnt || !P->node_head ||
	    !P->cand_next || !P->by_unheld || !P->held_t || !P->held_cnt || !P->node_cand)
		return SP_ENOMEM;
	*out = P;
	return 0;
}

/* on[d] = bytes of x's input that device d holds. */
static void input_on_devices(placer_t *P, const sslice_t *x)
{
	const planner_t *pl = P->pl;
	const metaop_t *mo = &pl->mops[x->metaop];
	int db = dtype_bytes(pl->model->dtype), N = pl->N;
	for (int d = 0; d < N; d++)
		P->on[d] = 0;
	for (int q = x->lf > 0 ? -1 : 0; q < (x->lf > 0 ? 0 : mo->n_pred); q++) {
		int src = q < 0 ? x->metaop : pl->edges[mo->pred[q]].src;
		double tok = q < 0 ? (double)mo->seq_out * mo->width_out
				   : (double)pl->edges[mo->pred[q]].seq_len * pl->mops[src].width_out;
		int n = P->last_n[src];
		for (int j = 0; j < n; j++) {
			int32_t b0, b1;
			sample_range(pl->mops[src].batch, j, n, &b0, &b1);
			P->on[P->last_devs[(size_t)src * N + j]] += (double)(b1 - b0) * tok * db;
		}
	}
}

/* The samples [a0, a1) slot j of slice x runs (all of them for a MetaOp
 * that does not scale). */
static void slot_samples(const metaop_t *mo, const sslice_t *x, int j, int32_t *a0, int32_t *a1)
{
	sample_range(mo->batch, j, x->n, a0, a1);
	if (!mo->scales)
		*a0 = 0, *a1 = (int32_t)mo->batch;
}

/* Samples by which decoder x's memory buffers (act(c, -1), grad(c, -1)) on
 * device d grow when they also hold [a0, a1): their span [lo, hi) widened
 * to cover it; 0 for other MetaOps. With set, the span grows. */
static int64_t memory_more(const placer_t *P, const sslice_t *x, int d, int32_t a0, int32_t a1,
			   int set)
{
	int r = P->mem_row[x->metaop];
	if (r < 0 || a1 <= a0)
		return 0;
	int32_t *span = P->mem_span + ((size_t)r * (size_t)P->pl->N + (size_t)d) * 2;
	int32_t lo = span[0] < span[1] ? SP_MIN(span[0], a0) : a0;
	int32_t hi = span[0] < span[1] ? SP_MAX(span[1], a1) : a1;
	int64_t more = (int64_t)(hi - lo) - (int64_t)(span[1] - span[0]);
	if (set)
		span[0] = lo, span[1] = hi;
	return more;
}

/* slice_mem of slot samples [a0, a1) on device d, which does not hold
 * unheld of x's layers. Without memory buffers the sum is the same for
 * every device with as many layers to add (their state added one by one,
 * in order): kept for the next call on the same slice and samples (the
 * estimates it reads do not change while the placer lives). */
static double slot_mem(placer_t *P, const sslice_t *x, int d, int32_t a0, int32_t a1,
		       int unheld)
{
	const metaop_t *mo = &P->pl->mops[x->metaop];
	int64_t local = a1 - a0;
	int key[5] = {x->metaop, x->lf, x->lt, x->n, (int)local};
	int buffers = P->mem_row[x->metaop] >= 0;
	if (!buffers && !memcmp(key, P->key, sizeof key))
		return P->by_unheld[unheld];
	double bytes = (double)local * layout_saved_per_sample(P->pl, x->metaop) * (x->lt - x->lf);
	bytes += 2.0 * (double)memory_more(P, x, d, a0, a1, 0) * (double)mo->shape.mem_seq *
		 (double)mo->shape.mem_width * dtype_bytes(P->pl->model->dtype);
	double state = layout_state_bytes(P->pl, x->metaop, x->n);
	if (!buffers) {
		P->by_unheld[0] = bytes;
		for (int k = 1; k <= x->lt - x->lf; k++)
			P->by_unheld[k] = P->by_unheld[k - 1] + state;
		memcpy(P->key, key, sizeof key);
		return P->by_unheld[unheld];
	}
	for (int k = 0; k < unheld; k++)
		bytes += state;
	return bytes;
}

/* Memory slice x adds to device d (slot's samples): new state + activations,
 * as layout.c estimates them (zero-1 over the slice, input-only activations
 * where auto may shard or recompute), and a decoder's memory buffers. */
static double slice_mem(placer_t *P, const sslice_t *x, int d, int slot)
{
	int32_t a0, a1;
	slot_samples(&P->pl->mops[x->metaop], x, slot, &a0, &a1);
	const uint8_t *held = P->held + (size_t)d * P->n_params;
	const int *pid = P->op_pid + P->pl->mops[x->metaop].first_op;
	int unheld = 0;
	for (int l = x->lf; l < x->lt; l++)
		unheld += !held[pid[l]];
	return slot_mem(P, x, d, a0, a1, unheld);
}

static double score(placer_t *P, const sslice_t *x, int d)
{
	const planner_t *pl = P->pl;
	const metaop_t *mo = &pl->mops[x->metaop];
	if (P->kind == PLACE_NAIVE)
		return -d;
	double shared = 0;
	int node = dev_node(pl->cluster, d);
	for (int l = x->lf; l < x->lt; l++) {
		int pid = param_id(P, x->metaop, l);
		if (P->held[(size_t)d * P->n_params + pid])
			shared += (double)mo->layer_state_bytes;
		else if (P->node_held[(size_t)node * P->n_params + pid])
			shared += 0.25 * (double)mo->layer_state_bytes;
		else if (P->any_held[pid])
			shared -= 0.25 * (double)mo->layer_state_bytes;
	}
	double after = (P->mem[d] + slice_mem(P, x, d, 0)) / pl->mem_cap;
	double sc = P->on[d] + 0.25 * P->island[d] + shared - 1e-3 * P->mem[d] -
		    after * after * after * after * 0.1 * pl->mem_cap;
	return after > 1 ? sc + OVER_CAP : sc;
}

/* Scores every device free at x->t0 into P->cand, in device order (so
 * each node's are together); returns their count. */
static int candidates(placer_t *P, const sslice_t *x)
{
	const planner_t *pl = P->pl;
	int G = pl->cluster->gpus_per_node, k = 0;
	if (P->kind == PLACE_SPINDLE) {
		input_on_devices(P, x);
		for (int q = 0; q < pl->cluster->nodes; q++) {
			double isl = 0;
			for (int e = q * G; e < (q + 1) * G; e++)
				isl += P->on[e];
			for (int e = q * G; e < (q + 1) * G; e++)
				P->island[e] = isl - P->on[e];
		}
	}
	for (int d = 0; d < pl->N; d++)
		if (P->busy_until[d] <= x->t0 + 1e-9)
			P->cand[k++] = (cand_t){score(P, x, d), d};
	return k;
}

/* cnt[d] += row[d], 16 at a time (vectorised) */
static void add_row(uint16_t *restrict cnt, const uint8_t *restrict row, int n)
{
	int d = 0;
	for (; d + 16 <= n; d += 16)
		for (int i = 0; i < 16; i++)
			cnt[d + i] += row[d + i];
	for (; d < n; d++)
		cnt[d] += row[d];
}

int placer_fitting(placer_t *P, const sslice_t *x, int *busy_fitting)
{
	int fit = 0, later = 0, N = P->pl->N;
	/* slice_mem(P, x, d, 0) for every d: the layers each device holds
	 * counted layer by layer, over the devices (held_t's rows) */
	uint16_t *cnt = P->held_cnt;
	const int *pid = P->op_pid + P->pl->mops[x->metaop].first_op;
	int32_t a0, a1;
	slot_samples(&P->pl->mops[x->metaop], x, 0, &a0, &a1);
	memset(cnt, 0, sizeof *cnt * (size_t)N);
	for (int l = x->lf; l < x->lt; l++)
		add_row(cnt, P->held_t + (size_t)pid[l] * N, N);
	/* without memory buffers slot_mem's sums are the same for every
	 * device (by_unheld, set by its first call on this slice): read there */
	int L = x->lt - x->lf, same = P->mem_row[x->metaop] < 0;
	if (same)
		slot_mem(P, x, 0, a0, a1, 0);
	for (int d = 0; d < N; d++) {
		double more = same ? P->by_unheld[L - cnt[d]] : slot_mem(P, x, d, a0, a1, L - cnt[d]);
		int ok = P->mem[d] + more <= P->pl->mem_cap;
		if (P->busy_until[d] <= x->t0 + 1e-9)
			fit += ok;
		else
			later += ok;
	}
	if (busy_fitting)
		*busy_fitting = later;
	return fit;
}

#define I32_BEFORE(x, y) ((x) < (y))
SP_SORT_DEFINE(i32_sort, int32_t, I32_BEFORE)

void devs_sort(int32_t *d, int n)
{
	i32_sort(d, n);
}

int placer_choose(placer_t *P, const sslice_t *x, int32_t *out)
{
	const planner_t *pl = P->pl;
	int k = candidates(P, x), nn = pl->cluster->nodes, G = pl->cluster->gpus_per_node;
	if (k < x->n)
		return -1;
	cand_t *c = P->cand;
	int got = 0;
	if (P->kind == PLACE_SPINDLE) {
		/* fill nodes in order of their fitting candidates' total score:
		 * each node's candidates sorted (CAND_BEFORE, a total order), so
		 * its list and its sum take them in the order a sort of them all
		 * would give (the rest below sorts them all where it needs to) */
		int *cnt = P->node_cnt, *head = P->node_head, *next = P->cand_next;
		for (int j = 0, e; j < k; j = e) {
			int node = dev_node(pl->cluster, c[j].dev);
			for (e = j + 1; e < k && dev_node(pl->cluster, c[e].dev) == node; e++)
				;
			cand_sort(c + j, e - j);
		}
		for (int q = 0; q < nn; q++) {
			P->node_score[q] = 0;
			cnt[q] = 0;
			head[q] = -1;
		}
		for (int j = k - 1; j >= 0; j--) { /* per-node lists in score order */
			int node = dev_node(pl->cluster, c[j].dev);
			P->node_score[node] += c[j].score > OVER_CAP / 2 ? c[j].score + 1.0 : -1e6;
			if (c[j].score > OVER_CAP / 2) {
				cnt[node]++;
				next[j] = head[node];
				head[node] = j;
			}
		}
		/* by score, ties by node (a total order: CAND_BEFORE) */
		for (int q = 0; q < nn; q++)
			P->node_cand[q] = (cand_t){P->node_score[q], q};
		cand_sort(P->node_cand, nn);
		for (int q = 0; q < nn; q++)
			P->node_order[q] = P->node_cand[q].dev;
		/* a group that fits in one node goes to the best node that holds it */
		int first = 0;
		if (x->n <= G) {
			for (int q = 0; q < nn; q++)
				if (cnt[P->node_order[q]] >= x->n) {
					first = q;
					break;
				}
		}
		/* a tensor-parallel slice takes whole groups of t from a node, so
		 * that its ascending devices form groups within nodes (tp.c) */
		int t = tp_want(pl, x);
		for (int r = 0; r < nn && got < x->n; r++) {
			int node = P->node_order[(first + r) % nn];
			int take = SP_MIN(cnt[node] / t * t, x->n - got);
			for (int j = head[node]; j >= 0 && take > 0; j = next[j], take--)
				out[got++] = c[j].dev;
		}
	}
	/* the rest by score, over the cap if nothing else is free */
	if (got < x->n)
		cand_sort(c, k);
	for (int j = 0; j < k && got < x->n; j++) {
		int dup = 0;
		for (int q = 0; q < got && !dup; q++)
			dup = out[q] == c[j].dev;
		if (!dup)
			out[got++] = c[j].dev;
	}
	/* ascending order keeps sample ranges aligned across slices on one set */
	devs_sort(out, x->n);
	int fit = 0;
	for (int j = 0; j < x->n; j++)
		fit += P->mem[out[j]] + slice_mem(P, x, out[j], j) <= pl->mem_cap;
	return fit;
}

void placer_commit(placer_t *P, const sslice_t *x, const int32_t *devs)
{
	const planner_t *pl = P->pl;
	for (int j = 0; j < x->n; j++) {
		int d = devs[j];
		P->mem[d] += slice_mem(P, x, d, j);
		int32_t a0, a1;
		slot_samples(&pl->mops[x->metaop], x, j, &a0, &a1);
		memory_more(P, x, d, a0, a1, 1);
		/* the rows once: the stores are bytes, which may alias anything */
		uint8_t *held = P->held + (size_t)d * P->n_params, *held_t = P->held_t + d;
		uint8_t *node_held = P->node_held + (size_t)dev_node(pl->cluster, d) * P->n_params;
		const int *pid = P->op_pid + pl->mops[x->metaop].first_op;
		size_t N = (size_t)pl->N;
		for (int l = x->lf, lt = x->lt; l < lt; l++) {
			int q = pid[l];
			held[q] = 1;
			held_t[(size_t)q * N] = 1;
			node_held[q] = 1;
			P->any_held[q] = 1;
		}
		P->busy_until[d] = x->t1;
		P->last_devs[(size_t)x->metaop * pl->N + j] = d;
	}
	P->last_n[x->metaop] = x->n;
}

void placer_reserve(placer_t *P, int comp, int layer, const int32_t *devs, int n)
{
	const planner_t *pl = P->pl;
	int pid = P->param_base[comp] + layer;
	double state = layout_comp_state(pl, comp, n);
	for (int j = 0; j < n; j++) {
		int d = devs[j];
		if (!P->held[(size_t)d * P->n_params + pid])
			P->mem[d] += state;
		P->held[(size_t)d * P->n_params + pid] = 1;
		P->held_t[(size_t)pid * pl->N + d] = 1;
		P->node_held[(size_t)dev_node(pl->cluster, d) * P->n_params + pid] = 1;
		P->any_held[pid] = 1;
	}
}

int placer_free_count_dev(const placer_t *P, int d, double t)
{
	return P->busy_until[d] <= t + 1e-9;
}

int placer_free_count(const placer_t *P, double t)
{
	int n = 0;
	for (int d = 0; d < P->pl->N; d++)
		n += P->busy_until[d] <= t + 1e-9;
	return n;
}

static double in_bytes(const planner_t *pl, const sslice_t *x)
{
	const metaop_t *mo = &pl->mops[x->metaop];
	return (double)mo->batch * mo->seq_in * mo->width_in;
}

int place_run(planner_t *pl, const sched_t *s, place_kind_t kind, place_t *out)
{
	memset(out, 0, sizeof *out);
	placer_t *P = NULL;
	int total = 0;
	for (int i = 0; i < s->n; i++)
		total += s->s[i].n;
	sp_arena_t *a = &pl->scratch; /* the candidate's scope */
	int *order = sp_arena_calloc(a, (size_t)(s->n + 1), sizeof(int));
	int *last = sp_arena_calloc(a, (size_t)(pl->n_mops + 1), sizeof(int));
	out->devs = sp_arena_calloc(a, (size_t)total + 1, sizeof(int32_t));
	out->off = sp_arena_calloc(a, (size_t)s->n + 1, sizeof(int32_t));
	if (!order || !last || !out->devs || !out->off || placer_new(&P, pl, kind))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int m = 0; m < pl->n_mops; m++)
		last[m] = -1;
	for (int i = 0, o = 0; i < s->n; i++) {
		out->off[i] = o;
		o += s->s[i].n;
		order[i] = i;
	}
	/* slices starting together: heaviest incoming flow first */
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
		for (int a = i; a < j; a++) {
			int k = order[a];
			const sslice_t *x = &s->s[k];
			int32_t *devs = out->devs + out->off[k];
			if (x->chunk && last[x->metaop] >= 0) {
				/* a chunk continues the previous slice on its devices */
				memcpy(devs, out->devs + out->off[last[x->metaop]],
				       sizeof(int32_t) * (size_t)x->n);
			} else if (x->dev_off >= 0 && kind == PLACE_SPINDLE) {
				/* placed by the scheduler already */
				memcpy(devs, s->devs + x->dev_off, sizeof(int32_t) * (size_t)x->n);
			} else if (placer_choose(P, x, devs) < 0) {
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						  "placement: too few devices free for '%s' at %.3f ms",
						  pl->mops[x->metaop].name, x->t0);
			}
			placer_commit(P, x, devs);
			last[x->metaop] = k;
		}
		i = j;
	}
	return 0;
}
