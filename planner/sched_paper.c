/*
 * sched_paper.c — the paper's algorithm (Wang et al., "Spindle", ASPLOS '25)
 * as the authors' planner runs it (Hetu-Galvatron, branch `spindle`,
 * galvatron/core/spindle_planner.py: Planner with global_optimization,
 * candidate_sel_rule "indegree", valid_gpunum_strategy "batch divisible",
 * sort_rule "bigN_bigT", extend_rule "bigRW_bigST"), kept faithful as the
 * yardstick for ours. Per macro-stage (the MetaOps whose inputs are done:
 * our levels, the longest path from a source):
 *
 *  1. Valid counts: n devices with batch % n == 0 (LayerNode.
 *     update_valid_gpunum, "batch divisible"), n <= nmax; past the batch,
 *     n = d t with the table's degree t at n and batch % d == 0 (the paper
 *     counts tensor-parallel degrees among a MetaOp's valid counts).
 *  2. Relaxation: C* with sum_m n*_m = N (Planner.cal_minimized_time),
 *     n*_m = T_m^{-1}(C* / L_m) where the speed-up s(n) = T(1) / T(n) is
 *     interpolated linearly between valid counts (LayerNode.gpunum_linear,
 *     LayerNode.speedup), s(n) = n below one device.
 *  3. Bi-point tuples: n*'s valid neighbours n1 <= n* < n2 share C* in
 *     proportion to n*'s position between them (LayerNode.time_pair), each
 *     share's layers rounded half to even, the sum fixed on n1's tuple.
 *  4. Micro-stages (Planner.schedule_gen): tuples sorted by more devices,
 *     then longer; the first of a MetaOp's tuples that fits is taken (one
 *     per MetaOp); every slice cut to the shortest in whole layers, then
 *     all filled to the longest; idle devices go one valid step at a time
 *     (Planner.stage_extension); leftovers re-queued with their tuple's
 *     count; a stage of the same (MetaOp, count) pairs as the one before
 *     is merged into it.
 *
 * It does not place devices (place.c) nor time transfers (sim.c). Gradient
 * sync happens after the whole backward (lower_sync.c, for this algo).
 * The candidate paper-dag (candidates.c) runs the same packing over the
 * whole DAG at once (the authors' candidate_sel_rule "all").
 */
#include "planner.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
	int m, n, layers;
} tuple_t;

/* One stage entry: MetaOp m's layers [lf, lf + layers) on n devices (both
 * may grow by stage extension), taken from tuple tq[tuple]. */
typedef struct {
	int m, n, lf, layers, tuple;
} entry_t;

/* One packing's state; work arrays in pl->scratch (the candidate's scope). */
typedef struct {
	planner_t *pl;
	int *ids, *done, *order, *keep;
	double *rem, *nk;  /* the level's MetaOps ids[i]: layers, n* */
	double *nstar;     /* by MetaOp id */
	tuple_t *tq;
	entry_t *st;       /* all stages' entries, stage after stage */
	int *stage_at;     /* stage s: entries [stage_at[s], stage_at[s + 1]) */
	int nt, ns, ne, first_stage;
} pack_t;

static int valid_count(const metaop_t *m, int v)
{
	if (v <= m->batch)
		return m->batch % v == 0;
	return m->usen[v] == v && m->batch % (v / m->tpn[v]) == 0;
}

/* Valid count after n (0: none), at most nmax. */
static int valid_next(const metaop_t *m, int n)
{
	for (int v = n + 1; v <= m->nmax; v++)
		if (valid_count(m, v))
			return v;
	return 0;
}

static int valid_max(const metaop_t *m)
{
	int v = m->nmax;
	while (v > 1 && !valid_count(m, v))
		v--;
	return v;
}

/* Speed-up at a valid count. */
static double speedup(const metaop_t *m, int n)
{
	double t = mop_t(m, n);
	return t > 0 ? mop_t(m, 1) / t : 1;
}

/* n with interpolated s(n) = L T(1) / C, the authors' inverse of T
 * (LayerNode.gpunum_linear); HUGE_VAL when no valid count meets C. */
static double paper_n(const metaop_t *m, double layers, double C)
{
	if (layers <= 0)
		return 0;
	double want = layers * mop_t(m, 1) / C;
	if (!(want > 1))
		return fmax(want, 0);
	int lo = 1;
	double slo = 1;
	for (int v = valid_next(m, 1); v; lo = v, v = valid_next(m, v)) {
		double sv = speedup(m, v);
		if (sv >= want)
			return lo + (v - lo) * (want - slo) / (sv - slo);
		slo = sv;
	}
	return HUGE_VAL;
}

double paper_cstar(const planner_t *pl, const int *mops, const double *rem, int k,
		   double N, double *n_out)
{
	return relaxed_cstar_by(pl, mops, rem, k, N, n_out, paper_n);
}

/* Whole layers in a share of t ms at per ms a layer, within [0, L]; -1
 * when layers take no time. */
static int share_layers(double t, double per, int L)
{
	if (!(per > 0))
		return -1;
	double x = rint(t / per);
	return x > 0 ? (int)fmin(x, L) : 0;
}

/* Steps 2-3 for the k MetaOps ids[0..k): tuples into P->tq. */
static void bipoint_tuples(pack_t *P, int k)
{
	planner_t *pl = P->pl;
	for (int i = 0; i < k; i++)
		P->rem[i] = pl->mops[P->ids[i]].n_layers;
	double C = paper_cstar(pl, P->ids, P->rem, k, pl->N, P->nk);
	P->nt = 0;
	for (int i = 0; i < k; i++) {
		int id = P->ids[i];
		const metaop_t *m = &pl->mops[id];
		double n = fmin(P->nk[i], valid_max(m));
		P->nstar[id] = n;
		/* LayerNode.find_valid_gpunum_pair: n1 <= n < n2 (n1 = 0 below
		 * one device; n1 = n2 at the largest valid count) */
		int n1 = n < 1 ? 0 : 1, n2;
		while (n1 && valid_next(m, n1) && valid_next(m, n1) <= n)
			n1 = valid_next(m, n1);
		n2 = n1 ? valid_next(m, n1) : 1;
		if (!n2)
			n2 = n1;
		double t2 = n1 == n2 ? C : (n - n1) / (n2 - n1) * C;
		double t1 = n1 == n2 || !n1 ? 0 : (n2 - n) / (n2 - n1) * C;
		int L = m->n_layers;
		int l1 = n1 ? SP_MAX(0, share_layers(t1, mop_t(m, n1), L)) : 0;
		int l2 = share_layers(t2, mop_t(m, n2), L);
		if (l2 < 0)
			l1 = 0, l2 = L; /* layers take no time: one tuple */
		if (l1 + l2 != L) { /* Planner.plan_stage: the sum fixed on n1's share */
			if (n1 && l1)
				l1 += L - (l1 + l2);
			else
				l2 += L - (l1 + l2);
		}
		l1 = SP_MAX(0, SP_MIN(L, l1));
		l2 = L - l1;
		if (n1 && l1)
			P->tq[P->nt++] = (tuple_t){id, n1, l1};
		if (l2)
			P->tq[P->nt++] = (tuple_t){id, n2, l2};
	}
}

/* Tuple q's remaining time on its count (the authors' SchedulePlace.width). */
static double tuple_w(const pack_t *P, int q)
{
	const tuple_t *x = &P->tq[q];
	return x->layers * mop_t(&P->pl->mops[x->m], x->n);
}

/* Stable insertion sort of P->order[0..no): by count ascending (the first
 * sort of Planner.schedule_gen), or "bigN_bigT": more devices, then longer. */
static void sort_tuples(pack_t *P, int no, int big_first)
{
	int *o = P->order;
	for (int a = 1; a < no; a++)
		for (int b = a; b > 0; b--) {
			const tuple_t *x = &P->tq[o[b]], *y = &P->tq[o[b - 1]];
			int before = big_first ? x->n > y->n || (x->n == y->n &&
								 tuple_w(P, o[b]) > tuple_w(P, o[b - 1]))
					       : x->n < y->n;
			if (!before)
				break;
			int s = o[b];
			o[b] = o[b - 1];
			o[b - 1] = s;
		}
}

/* Planner.schedule_gen's check_valid: fits, inputs done, one per MetaOp. */
static int tuple_fits(const pack_t *P, const tuple_t *x, int free_dev, int e0)
{
	const planner_t *pl = P->pl;
	const metaop_t *mo = &pl->mops[x->m];
	if (x->n > free_dev)
		return 0;
	for (int q = 0; q < mo->n_pred; q++) {
		int src = pl->edges[mo->pred[q]].src;
		if (P->done[src] != pl->mops[src].n_layers)
			return 0;
	}
	for (int e = e0; e < P->ne; e++)
		if (P->st[e].m == x->m)
			return 0;
	return 1;
}

/* Layers of MetaOp m on n devices that fit within span D, at least one. */
static int layers_within(const metaop_t *m, int n, double D, int cap)
{
	double per = mop_t(m, n);
	double l = per > 0 ? floor(D / per * (1 + 1e-12)) : cap;
	return l >= cap ? cap : l >= 1 ? (int)l : 1;
}

/* SchedulePlace.new_remain_work_nstar: the MetaOp's work left after this
 * entry, on n* devices ("bigRW"). */
static double remain_key(const pack_t *P, const entry_t *e)
{
	const metaop_t *m = &P->pl->mops[e->m];
	double left = m->n_layers - P->done[e->m] - e->layers;
	return left * mop_t(m, 1) / fmax(P->nstar[e->m], 1e-300);
}

/* Stable sort of the stage's entries [e0, ne) by key descending: the
 * MetaOp's work left (layers extension) or the entry's time (counts). */
static void sort_entries(pack_t *P, int e0, int by_time)
{
	for (int a = e0 + 1; a < P->ne; a++)
		for (int b = a; b > e0; b--) {
			entry_t *x = &P->st[b], *y = &P->st[b - 1];
			double kx = by_time ? x->layers * mop_t(&P->pl->mops[x->m], x->n)
					    : remain_key(P, x);
			double ky = by_time ? y->layers * mop_t(&P->pl->mops[y->m], y->n)
					    : remain_key(P, y);
			if (!(kx > ky))
				break;
			entry_t s = *x;
			*x = *y;
			*y = s;
		}
}

/* One step of Planner.stage_extension ("bigRW_bigST") with free_dev idle
 * devices and stage span D: the first entry (by work left) whose next valid
 * count fits and which has layers left in its tuple grows to it and fills
 * D; else the first (by time) whose next valid count fits grows to it.
 * Returns the devices used, 0 when nothing grew. */
static int extend_once(pack_t *P, int e0, int free_dev, double D)
{
	for (int pass = 0; pass < 2; pass++) {
		sort_entries(P, e0, pass);
		for (int e = e0; e < P->ne; e++) {
			entry_t *x = &P->st[e];
			const metaop_t *m = &P->pl->mops[x->m];
			int cap = P->tq[x->tuple].layers, n2 = valid_next(m, x->n);
			if (!n2 || n2 - x->n > free_dev || (pass == 0 && x->layers == cap))
				continue;
			int grew = n2 - x->n;
			x->n = n2;
			x->layers = pass == 0 ? layers_within(m, n2, D, cap) : cap;
			return grew;
		}
	}
	return 0;
}

/* Planner.schedule_gen's merge: the stage [e0, ne) holds only (MetaOp,
 * count) pairs of the stage before it; their layers join those entries. */
static int merge_stage(pack_t *P, int e0)
{
	if (P->ns <= P->first_stage)
		return 0;
	int p0 = P->stage_at[P->ns - 1];
	for (int e = e0; e < P->ne; e++) {
		int hit = 0;
		for (int f = p0; f < e0 && !hit; f++)
			hit = P->st[f].m == P->st[e].m && P->st[f].n == P->st[e].n;
		if (!hit)
			return 0;
	}
	for (int e = e0; e < P->ne; e++)
		for (int f = p0; f < e0; f++)
			if (P->st[f].m == P->st[e].m && P->st[f].n == P->st[e].n)
				P->st[f].layers += P->st[e].layers;
	P->ne = e0;
	return 1;
}

/* Step 4, one micro-stage over the no queued tuples in P->order; returns
 * the tuples still queued (-1: none could run, our bug). */
static int pack_stage(pack_t *P, int no)
{
	const planner_t *pl = P->pl;
	int free_dev = pl->N, e0 = P->ne;
	double D = HUGE_VAL, span = 0;
	if (P->tq[P->order[0]].n < pl->N)
		sort_tuples(P, no, 1);
	/* a MetaOp whose inputs are done always has a tuple that fits */
	for (int a = 0; a < no && free_dev > 0; a++) {
		const tuple_t *x = &P->tq[P->order[a]];
		if (!tuple_fits(P, x, free_dev, e0))
			continue;
		P->st[P->ne++] = (entry_t){x->m, x->n, P->done[x->m], 0, P->order[a]};
		free_dev -= x->n;
		D = fmin(D, tuple_w(P, P->order[a]));
	}
	if (P->ne == e0)
		return -1;
	/* cut to the shortest (whole layers, rounded), then fill to the longest */
	for (int e = e0; e < P->ne; e++) {
		entry_t *x = &P->st[e];
		const metaop_t *m = &pl->mops[x->m];
		double per = mop_t(m, x->n);
		int l = SP_MAX(1, share_layers(D, per, P->tq[x->tuple].layers));
		span = fmax(span, l * per);
	}
	for (int e = e0; e < P->ne; e++) {
		entry_t *x = &P->st[e];
		x->layers = layers_within(&pl->mops[x->m], x->n, span, P->tq[x->tuple].layers);
	}
	for (int grew; free_dev > 0 && (grew = extend_once(P, e0, free_dev, span)) > 0;)
		free_dev -= grew;
	/* commit: the queue keeps untouched tuples, then leftovers in stage order */
	int nk = 0;
	for (int a = 0; a < no; a++) {
		int taken = 0;
		for (int e = e0; e < P->ne; e++)
			taken |= P->st[e].tuple == P->order[a];
		if (!taken)
			P->keep[nk++] = P->order[a];
	}
	for (int e = e0; e < P->ne; e++) {
		entry_t *x = &P->st[e];
		P->done[x->m] += x->layers;
		if ((P->tq[x->tuple].layers -= x->layers) > 0)
			P->keep[nk++] = x->tuple;
	}
	for (int a = 0; a < nk; a++)
		P->order[a] = P->keep[a];
	if (!merge_stage(P, e0))
		P->stage_at[++P->ns] = P->ne;
	return nk;
}

/* The stages as slices: each stage starts when the one before ends. */
static int emit_stages(const pack_t *P, sched_t *out)
{
	double t = 0;
	for (int s = 0; s < P->ns; s++) {
		double span = 0;
		for (int e = P->stage_at[s]; e < P->stage_at[s + 1]; e++) {
			const entry_t *x = &P->st[e];
			double d = x->layers * mop_t(&P->pl->mops[x->m], x->n);
			if (sched_push(out, x->m, x->lf, x->lf + x->layers, x->n, s, t, t + d))
				return SP_ENOMEM;
			span = fmax(span, d);
		}
		t += span;
	}
	return 0;
}

/* whole_dag: one pass over all MetaOps, a tuple eligible once its inputs'
 * layers are all done (the authors' candidate_sel_rule "all"). */
static int paper_pack(planner_t *pl, sched_t *out, int whole_dag)
{
	int M = pl->n_mops;
	sp_arena_t *ar = &pl->scratch;
	size_t total = 0; /* every layer can be a stage of its own at most */
	for (int m = 0; m < M; m++)
		total += (size_t)pl->mops[m].n_layers;
	pack_t P = {.pl = pl};
	P.ids = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	P.rem = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	P.nk = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	P.nstar = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	P.done = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	P.order = sp_arena_calloc(ar, (size_t)(2 * M + 2), sizeof(int));
	P.keep = sp_arena_calloc(ar, (size_t)(2 * M + 2), sizeof(int));
	P.tq = sp_arena_calloc(ar, (size_t)(2 * M + 2), sizeof(tuple_t));
	P.st = sp_arena_calloc(ar, total + 1, sizeof(entry_t));
	P.stage_at = sp_arena_calloc(ar, total + 2, sizeof(int));
	if (!P.ids || !P.rem || !P.nk || !P.nstar || !P.done || !P.order || !P.keep ||
	    !P.tq || !P.st || !P.stage_at)
		return SP_ENOMEM;
	int n_passes = whole_dag ? 1 : pl->n_levels;
	for (int lv = 0; lv < n_passes; lv++) {
		int k = 0;
		for (int q = 0; q < M; q++)
			if (whole_dag || pl->mops[pl->topo[q]].level == lv)
				P.ids[k++] = pl->topo[q];
		if (!k)
			continue;
		bipoint_tuples(&P, k);
		int no = P.nt;
		for (int a = 0; a < no; a++)
			P.order[a] = a;
		sort_tuples(&P, no, 0);
		P.first_stage = P.ns;
		while (no > 0)
			no = pack_stage(&P, no);
		if (no < 0)
			return SP_EINTERNAL;
	}
	return emit_stages(&P, out);
}

int sched_paper(planner_t *pl, sched_t *out)
{
	return paper_pack(pl, out, 0);
}

int sched_paper_dag(planner_t *pl, sched_t *out)
{
	return paper_pack(pl, out, 1);
}
