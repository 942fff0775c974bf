/*
 * lower_xfer.c — the lowering's transfers and its global instruction
 * sequence (the "Sample ranges" and "Order" rules in lower.c's header).
 * Which devices hold which parameters and where SYNC and STEP go is
 * lower_sync.c's; the plan's structure is lower.c's.
 *
 * Tensor parallelism (tp-format.txt): a slice of tp t has n / t groups of
 * t consecutive slots; sample ranges are per group (group r of n / t), and
 * every member of a group runs the slice on the group's range. A consumer
 * member mc receives its input from producer member mc % t_p, and a
 * producer member mp its output gradient from consumer member mp % t_c
 * (each member needs whole inputs, any member's outputs are whole; with
 * equal degrees member j talks to member j), unless a chained value is on
 * the device already (collect_xfers). A group's instructions are
 * emitted together: every member's RECVs, then every member's FWD (BWD),
 * then their SENDs, so the group's compute (a rendezvous: its all-reduces)
 * is one step of the global sequence and the "RECV after SEND" argument
 * still rules out deadlock.
 *
 * Memory (a decoder MetaOp c, issue #20). Every slice of c reads act(c, -1)
 * and adds into grad(c, -1). Per device holding slots of c, the union of
 * their sample ranges (maximal intervals) moves once: act(p, L_p) of the
 * memory's producer p into act(c, -1) at the device's first slot of c
 * (RECVs before its first FWD, or COPY where p's slot is local), from p's
 * last slice split over its slots like an ordinary input (one member of a
 * tensor-parallel group sends: the one on the device, if any, copies);
 * and grad(c, -1) back into grad(p, L_p)
 * from that same slot, so after the device's last BWD of c (backward runs
 * in reverse), to every member of p's slots (added on receipt).
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>

static int slice_tp(const lstate_t *st, int slice)
{
	return st->s->s[slice].tp > 1 ? st->s->s[slice].tp : 1;
}

/* The samples of a slot: its group's range. */
static void slot_range(const lstate_t *st, int slice, int slot, int32_t *a, int32_t *b)
{
	const sslice_t *x = &st->s->s[slice];
	int t = slice_tp(st, slice);
	sample_range(st->pl->mops[x->metaop].batch, slot / t, x->n / t, a, b);
}

static sp_vref_t vref(int m, int l, int grad, int off)
{
	return (sp_vref_t){m, l, grad, off};
}

static int add_xfer(lstate_t *st, xfer_t x)
{
	st->n_counted += lower_dev_of(st, x.ps, x.pj) == lower_dev_of(st, x.cs, x.cj) ? 1 : 2;
	if (st->n_counted > st->store_to)
		return 0; /* past what collect_all stores: counted only */
	x.tag = st->nx;
	if (sp_arena_grow(st->a, (void **)&st->x, &st->capx, st->nx + 1, sizeof *st->x))
		return SP_ENOMEM;
	st->x[st->nx++] = x;
	return 0;
}

static int emit(lstate_t *st, int dev, sp_ins_t ins)
{
	if (sp_arena_grow(st->a, (void **)&st->g, &st->capg, st->ng + 1, sizeof *st->g))
		return SP_ENOMEM;
	st->g[st->ng++] = (gins_t){dev, ins};
	return 0;
}

/* Whether a member of the group of (slice, slot) runs on device dev. */
static int group_has(const lstate_t *st, int slice, int slot, int dev)
{
	int t = slice_tp(st, slice), g = slot - slot % t;
	for (int k = g; k < g + t; k++)
		if (lower_dev_of(st, slice, k) == dev)
			return 1;
	return 0;
}

/* The first slot of slice p whose samples end after s (p's slot count
 * when none): slot ranges grow with the slot (sample_range of its group). */
static int first_slot_after(const lstate_t *st, int p, int32_t s)
{
	int lo = 0, hi = st->s->s[p].n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		int32_t b0, b1;
		slot_range(st, p, mid, &b0, &b1);
		if (b1 <= s)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* All transfers (forward and backward) into consumer slice i. Per
 * (consumer slot, producer group) one designated producer member sends
 * (forward), per (producer slot, consumer group) one consumer member
 * (backward); but when the slices chain (same MetaOp, one buffer) and a
 * member of the other side's group runs on the slot's own device, that
 * device computed the whole group's range already and nothing moves: a
 * transfer from another member would write the value twice. */
static int collect_xfers(lstate_t *st, int i)
{
	const planner_t *pl = st->pl;
	const sslice_t *c = &st->s->s[i];
	const metaop_t *mo = &pl->mops[c->metaop];
	if (mo->source)
		return 0;
	int tc = slice_tp(st, i);
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
			if (c->lf == 0 && pl->edges[mo->pred[q]].memory)
				continue; /* collect_memory's */
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
			int tp = slice_tp(st, p), chain = c->lf > 0, dj = lower_dev_of(st, i, j);
			/* only producer slots that meet [a0, a1) (own lies in it) add
			 * transfers: from the first, until one starts at a1 */
			for (int k = first_slot_after(st, p, a0); k < y->n; k++) {
				int32_t b0, b1;
				slot_range(st, p, k, &b0, &b1);
				if (b0 >= a1)
					break;
				int dk = lower_dev_of(st, p, k);
				int32_t o0 = SP_MAX(a0, b0), o1 = SP_MIN(a1, b1);
				if (o0 < o1 && !(chain && group_has(st, p, k, dj)) &&
				    k % tp == j % tc % tp) {
					xfer_t x = {p, k, i, j, o0, o1, len, vref(src_m, src_l, 0, 0),
						    vref(c->metaop, c->lf, 0, off), 0, 0};
					if (add_xfer(st, x))
						return SP_ENOMEM;
				}
				o0 = SP_MAX(own0, b0);
				o1 = SP_MIN(own1, b1);
				if (o0 < o1 && !(chain && group_has(st, i, j, dk)) &&
				    j % tc == k % tp % tc) {
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

/* ---- a decoder's memory ---- */

typedef struct {
	int32_t s0, s1;
} range_t;

static int cmp_range(const void *a, const void *b)
{
	const range_t *x = a, *y = b;
	return x->s0 != y->s0 ? (x->s0 > y->s0) - (x->s0 < y->s0) : (x->s1 > y->s1) - (x->s1 < y->s1);
}

/* Ranges r[0..n) merged in place into maximal intervals; their count. */
static int range_union(range_t *r, int n)
{
	int k = 0;
	qsort(r, (size_t)n, sizeof *r, cmp_range);
	for (int i = 0; i < n; i++) {
		if (k > 0 && r[i].s0 <= r[k - 1].s1)
			r[k - 1].s1 = SP_MAX(r[k - 1].s1, r[i].s1);
		else
			r[k++] = r[i];
	}
	return k;
}

/* Memory transfers of decoder MetaOp c over interval u of device slot
 * (fs, fj): act(p, L_p) from p's last slice in (from the member of a
 * tensor-parallel group on the device itself where there is one, else
 * its first member), grad(c, -1) back to every member. */
static int memory_xfers(lstate_t *st, int c, const sp_edge_t *e, int fs, int fj, range_t u)
{
	const planner_t *pl = st->pl;
	int p = e->src, ps = st->last[p], tp = slice_tp(st, ps), dev = lower_dev_of(st, fs, fj);
	const sslice_t *y = &st->s->s[ps];
	for (int k = 0; k < y->n; k++) {
		int32_t b0, b1;
		slot_range(st, ps, k, &b0, &b1);
		int32_t o0 = SP_MAX(u.s0, b0), o1 = SP_MIN(u.s1, b1);
		if (o0 >= o1)
			continue;
		xfer_t in = {ps, k, fs, fj, o0, o1, e->seq_len, vref(p, pl->mops[p].n_layers, 0, 0),
			     vref(c, -1, 0, 0), 0, 0};
		xfer_t back = {fs, fj, ps, k, o0, o1, e->seq_len, vref(c, -1, 1, 0),
			       vref(p, pl->mops[p].n_layers, 1, 0), 1, 0};
		int sender = group_has(st, ps, k, dev) ? lower_dev_of(st, ps, k) == dev : k % tp == 0;
		if ((sender && add_xfer(st, in)) || add_xfer(st, back))
			return SP_ENOMEM;
	}
	return 0;
}

/* Every decoder's memory transfers, device by device (ascending): the
 * union of the device's sample ranges over all slices of c, keyed to its
 * slot in the first of them. */
static int collect_memory(lstate_t *st)
{
	const planner_t *pl = st->pl;
	const sched_t *s = st->s;
	range_t *r = sp_arena_calloc(st->a, (size_t)s->n + 1, sizeof *r);
	if (!r)
		return SP_ENOMEM;
	for (int c = 0; c < pl->n_mops; c++) {
		const metaop_t *mo = &pl->mops[c];
		const sp_edge_t *e = NULL;
		for (int q = 0; q < mo->n_pred; q++)
			if (pl->edges[mo->pred[q]].memory)
				e = &pl->edges[mo->pred[q]];
		if (!e || st->first[c] < 0)
			continue;
		for (int d = 0; d < pl->N; d++) {
			int n = 0, fs = -1, fj = -1;
			for (int i = st->first[c]; i < s->n; i++) {
				if (s->s[i].metaop != c)
					continue;
				for (int j = 0; j < s->s[i].n; j++) {
					if (lower_dev_of(st, i, j) != d)
						continue;
					if (fs < 0) {
						fs = i;
						fj = j;
					}
					slot_range(st, i, j, &r[n].s0, &r[n].s1);
					n++;
				}
			}
			n = range_union(r, n);
			for (int k = 0; k < n; k++)
				if (memory_xfers(st, c, e, fs, fj, r[k]))
					return SP_ENOMEM;
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
	st->cons_first = sp_arena_calloc(st->a, (size_t)n + 2, sizeof(int));
	st->prod_first = sp_arena_calloc(st->a, (size_t)n + 2, sizeof(int));
	st->cons_list = sp_arena_calloc(st->a, (size_t)st->nx + 1, sizeof(int));
	st->prod_list = sp_arena_calloc(st->a, (size_t)st->nx + 1, sizeof(int));
	int *cf = sp_arena_calloc(st->a, (size_t)n + 1, sizeof(int));
	int *pf = sp_arena_calloc(st->a, (size_t)n + 1, sizeof(int));
	if (!st->cons_first || !st->prod_first || !st->cons_list || !st->prod_list || !cf ||
	    !pf)
		return SP_ENOMEM;
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
		int pd = lower_dev_of(st, x->ps, x->pj), cd = lower_dev_of(st, x->cs, x->cj);
		int local = pd == cd;
		if (local && !incoming)
			continue; /* local copies are emitted on the consumer side */
		sp_ins_t in = {.op = local ? INS_COPY : incoming ? INS_RECV : INS_SEND,
			       .slice = -1, .s0 = x->s0, .s1 = x->s1, .seq_len = x->seq_len,
			       .src = x->src, .dst = x->dst,
			       .peer = local ? -1 : incoming ? pd : cd,
			       .tag = local ? -1 : x->tag};
		if (emit(st, incoming ? cd : pd, in))
			return SP_ENOMEM;
	}
	return 0;
}

/* One direction of slice i, group by group: the members' RECVs, their
 * compute (FWD or LOSS forward, BWD backward), their SENDs; a loss also
 * sends its input gradients back at once. */
static int emit_slice(lstate_t *st, int i, int grad)
{
	const sslice_t *x = &st->s->s[i];
	const metaop_t *mo = &st->pl->mops[x->metaop];
	int t = slice_tp(st, i);
	for (int g = 0; g < x->n; g += t) {
		for (int j = g; j < g + t; j++)
			if (emit_xfers(st, i, j, grad, 1))
				return SP_ENOMEM;
		for (int j = g; j < g + t; j++) {
			sp_ins_t in = lower_ins_new(grad ? INS_BWD : mo->sink ? INS_LOSS : INS_FWD);
			in.slice = i;
			slot_range(st, i, j, &in.s0, &in.s1);
			in.src = vref(x->metaop, grad ? x->lt : x->lf, grad, 0);
			in.dst = grad ? vref(x->metaop, x->lf, 1, 0)
			       : mo->sink ? vref(x->metaop, 0, 1, 0)
					  : vref(x->metaop, x->lt, 0, 0);
			if (emit(st, lower_dev_of(st, i, j), in))
				return SP_ENOMEM;
		}
		for (int j = g; j < g + t; j++)
			if (emit_xfers(st, i, j, grad, 0) ||
			    (!grad && mo->sink && emit_xfers(st, i, j, 1, 0)))
				return SP_ENOMEM;
	}
	return 0;
}

/* The latest free time of slice i's devices in free. */
static double devs_free(const lstate_t *st, int i, const double *free)
{
	double t = 0;
	for (int j = 0; j < st->s->s[i].n; j++)
		t = fmax(t, free[lower_dev_of(st, i, j)]);
	return t;
}

static void devs_take(const lstate_t *st, int i, double *free, double t)
{
	for (int j = 0; j < st->s->s[i].n; j++)
		free[lower_dev_of(st, i, j)] = t;
}

/*
 * The eager backward order: the backward slices in the order a list
 * schedule of them starts them, each as early as its devices and its
 * gradients allow (estimated from the cost tables, transfers left out):
 * the forward as emitted, then, repeatedly, of the backward slices whose
 * gradients are all in (every slice that sends it some has run), the one
 * that can start first; on a tie the one the reverse order puts first.
 * In the reverse order a device runs its slices last forwarded first, so
 * a lane whose devices the end of another lane borrowed waits for that
 * lane's backward; here it starts as soon as its own loss is done, and a
 * component's last backward, and its sync, can come earlier (and the
 * borrower's later: the simulator judges). A slice comes after every
 * slice it receives gradients from (the next slice of its MetaOp, or the
 * first slice of each consumer: the last one to run there), so every
 * RECV still follows its SEND. out: the non-sink slices in that order.
 */
static int bwd_eager_order(lstate_t *st, int *out, int *n_out)
{
	const sched_t *s = st->s;
	const planner_t *pl = st->pl;
	int S = s->n, N = pl->N;
	double *free = sp_arena_calloc(st->a, (size_t)N + 1, sizeof(double));
	double *fin = sp_arena_calloc(st->a, (size_t)S + 1, sizeof(double));
	double *dep = sp_arena_calloc(st->a, (size_t)S + 1, sizeof(double));
	int *cnt = sp_arena_calloc(st->a, (size_t)S + 1, sizeof(int));
	uint8_t *done = sp_arena_calloc(st->a, (size_t)S + 1, 1);
	if (!free || !fin || !dep || !cnt || !done)
		return SP_ENOMEM;
	for (int i = 0; i < S; i++) { /* the forward, in order */
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		double t = devs_free(st, i, free);
		if (st->prev[i] >= 0)
			t = fmax(t, fin[st->prev[i]]);
		else
			for (int k = 0; k < mo->n_pred; k++)
				t = fmax(t, fin[st->last[pl->edges[mo->pred[k]].src]]);
		fin[i] = t + (x->lt - x->lf) * (mo->tf[x->n] + (mo->sink ? mo->tb[x->n] : 0));
		devs_take(st, i, free, fin[i]);
	}
	for (int i = 0; i < S; i++) {
		const metaop_t *mo = &pl->mops[s->s[i].metaop];
		done[i] = (uint8_t)mo->sink;
		if (st->last[s->s[i].metaop] != i) {
			cnt[i] = 1; /* the next slice of the MetaOp */
			continue;
		}
		for (int k = 0; k < mo->n_succ; k++) {
			int c = pl->edges[mo->succ[k]].dst;
			if (pl->mops[c].sink)
				dep[i] = fmax(dep[i], fin[st->last[c]]);
			else
				cnt[i]++; /* c's first slice, its backward's last */
		}
	}
	*n_out = 0;
	for (;;) {
		int best = -1;
		double bt = 0;
		for (int i = S - 1; i >= 0; i--) {
			if (done[i] || cnt[i])
				continue;
			double t = fmax(dep[i], devs_free(st, i, free));
			if (best < 0 || t < bt) {
				best = i;
				bt = t;
			}
		}
		if (best < 0)
			break;
		const sslice_t *x = &s->s[best];
		const metaop_t *mo = &pl->mops[x->metaop];
		double t1 = bt + (x->lt - x->lf) * mo->tb[x->n];
		done[best] = 1;
		out[(*n_out)++] = best;
		devs_take(st, best, free, t1);
		int pv = st->prev[best];
		if (pv >= 0) {
			cnt[pv]--;
			dep[pv] = fmax(dep[pv], t1);
			continue;
		}
		for (int k = 0; k < mo->n_pred; k++) {
			int l = st->last[pl->edges[mo->pred[k]].src];
			cnt[l]--;
			dep[l] = fmax(dep[l], t1);
		}
	}
	for (int i = 0; i < S; i++) /* a cycle: cannot happen on a DAG */
		if (!done[i])
			return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "eager backward order: slice %d of '%s' never ready", i,
					  pl->mops[s->s[i].metaop].name);
	return 0;
}

/* The slices of task (all of them: -1): forward slices in schedule order,
 * then backward slices in reverse order (losses did theirs), or in the
 * eager order (bwd_eager_order) when the schedule asks for it. */
static int emit_pass(lstate_t *st, int task)
{
	const sched_t *s = st->s;
	const metaop_t *mops = st->pl->mops;
	for (int ii = 0; ii < s->n; ii++) {
		int i = st->order[ii];
		if ((task < 0 || mops[s->s[i].metaop].task == task) && emit_slice(st, i, 0))
			return SP_ENOMEM;
	}
	if (task < 0 && s->bwd_eager) {
		int n = 0, rc, *ord = sp_arena_calloc(st->a, (size_t)s->n + 1, sizeof(int));
		if (!ord)
			return SP_ENOMEM;
		if ((rc = bwd_eager_order(st, ord, &n)))
			return rc;
		for (int k = 0; k < n; k++)
			if (emit_slice(st, ord[k], 1))
				return SP_ENOMEM;
		return 0;
	}
	for (int ii = s->n - 1; ii >= 0; ii--) {
		int i = st->order[ii];
		const metaop_t *mo = &mops[s->s[i].metaop];
		if ((task < 0 || mo->task == task) && !mo->sink && emit_slice(st, i, 1))
			return SP_ENOMEM;
	}
	return 0;
}

/* One pass over every slice; task by task (algo_task_by_task: tasks in the
 * order their first slice comes, each one's backward before the next
 * one's forward: a task's values only flow inside the task, so every
 * RECV still follows its SEND). */
static int emit_all(lstate_t *st)
{
	const sched_t *s = st->s;
	if (!algo_task_by_task(s->algo))
		return emit_pass(st, -1);
	int T = st->pl->model->n_tasks;
	uint8_t *done = sp_arena_calloc(st->a, (size_t)T + 1, 1);
	if (!done)
		return SP_ENOMEM;
	for (int ii = 0; ii < s->n; ii++) {
		int t = st->pl->mops[s->s[st->order[ii]].metaop].task;
		if (!done[t]) {
			done[t] = 1;
			if (emit_pass(st, t))
				return SP_ENOMEM;
		}
	}
	return 0;
}

/*
 * Every transfer (collect_xfers slice by slice, then collect_memory), and
 * the guard on a plan's size: their instructions counted against
 * --max-instructions, the transfers stored only while the count is within
 * it. They are what can grow past memory: a slice that does not scale (a
 * contrastive loss) needs its whole batch on every one of its n devices,
 * from each of its producers' m devices, n x m transfers per input
 * (sequential: every slice on all N devices, N^2: 2.1 M instructions for
 * clip-10 with batches x4 on 256 GPUs, about 34 M at 1024 GPUs). So a
 * pass stores transfers only while the count is within STORE_AHEAD
 * instructions (at most that many records held before the guard can
 * refuse); a plan past it but within the limit is collected once more,
 * every transfer stored (the pass has no other effect). Past the limit
 * the first pass only counts, to name the slice that receives most.
 */
#define STORE_AHEAD ((int64_t)1 << 18)

static int collect_pass(lstate_t *st, int64_t store_to, int64_t *worst, int *wi)
{
	int rc = 0;
	st->n_counted = 0;
	st->nx = 0;
	st->store_to = store_to;
	for (int i = 0; i < st->s->n && !rc; i++) {
		int64_t before = st->n_counted;
		rc = collect_xfers(st, i);
		if (st->n_counted - before > *worst) {
			*worst = st->n_counted - before;
			*wi = i;
		}
	}
	return rc ? rc : collect_memory(st);
}

static int collect_all(lstate_t *st)
{
	const planner_t *pl = st->pl;
	int64_t worst = -1, total, limit = pl->opts->max_ins > 0 ? pl->opts->max_ins : INT64_MAX;
	int wi = 0;
	int rc = collect_pass(st, limit < STORE_AHEAD ? limit : STORE_AHEAD, &worst, &wi);
	total = st->n_counted;
	if (!rc && total > STORE_AHEAD && total <= limit)
		rc = collect_pass(st, limit, &worst, &wi);
	if (rc || total <= limit)
		return rc;
	const sslice_t *x = &st->s->s[wi];
	const metaop_t *mo = &pl->mops[x->metaop];
	sp_err_set(pl->err, SP_EINPUT, NULL, 0, 0, NULL,
		   "the %s plan's transfers alone would be %lld instructions, more than "
		   "--max-instructions %lld; %lld of them move the inputs of the slice of "
		   "'%s' (layers %d-%d) on %d devices%s",
		   algo_name(st->s->algo), (long long)total, (long long)pl->opts->max_ins,
		   (long long)worst,
		   mo->name, x->lf, x->lt, x->n,
		   mo->scales ? ""
			      : ", which does not scale: each of its devices receives the whole "
				"batch from every device of its inputs");
	sp_err_hint(pl->err, "plan for fewer GPUs, or raise --max-instructions (each "
			     "instruction takes about %d bytes of the planner's memory)",
		    PLAN_BYTES_PER_INS);
	return SP_EINPUT;
}

/*
 * st->g allocated once at its size: emit_pass writes one instruction per
 * counted transfer instruction (a COPY, or a SEND and its RECV) plus one
 * compute per slot and direction (a loss's one, forward). Not zeroed:
 * every entry below ng is written before it is read. Were the count ever
 * short, emit would still grow the array.
 */
static int size_sequence(lstate_t *st)
{
	int64_t ng = st->n_counted;
	for (int i = 0; i < st->s->n; i++)
		ng += (int64_t)st->s->s[i].n * (st->pl->mops[st->s->s[i].metaop].sink ? 1 : 2);
	if (ng >= INT32_MAX)
		return SP_ENOMEM;
	st->capg = (int)ng + 1;
	st->g = sp_arena_array(st->a, (size_t)st->capg, sizeof *st->g);
	return st->g ? 0 : SP_ENOMEM;
}

int lower_sequence(lstate_t *st)
{
	int rc;
	if ((rc = collect_all(st)) || (rc = size_sequence(st)) || (rc = index_xfers(st)))
		return rc;
	return emit_all(st);
}
