/*
 * sched_paper.c — the paper's algorithm (Wang et al., ASPLOS '25), kept
 * faithful as the yardstick for ours:
 *
 *  1. Levels: MetaOps are grouped by BFS level of the MetaGraph; each level
 *     is scheduled on its own and levels are concatenated.
 *  2. Relaxation: the level's C* solves sum_m T_m^{-1}(C* / L_m) = N
 *     (bisection, bound.c); n*_m = T_m^{-1}(C* / L_m) is real.
 *  3. Bi-point discretisation: the valid counts n_lo = floor(n*),
 *     n_hi = ceil(n*) with layers split l_lo + l_hi = L and
 *     l_lo T(n_lo) + l_hi T(n_hi) = C* (rounded to whole layers); n* < 1
 *     becomes (1, L).
 *  4. Greedy wave packing: a MetaOp's next tuple is eligible; take eligible
 *     tuples by most remaining time while they fit the free devices; give
 *     idle devices to the wave's MetaOp with most remaining time; cut every
 *     slice to the shortest so the wave ends together (whole layers, at
 *     least one); re-queue the leftover layers with their tuple's count.
 * Gradient sync happens after the whole backward (lower.c, for this algo).
 */
#include "planner.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
	int m, n, layers;
} tuple_t;

/* One packing's state; work arrays in pl->scratch (the candidate's scope). */
typedef struct {
	planner_t *pl;
	sched_t *out;
	int *ids, *done_layers, *pick, *width;
	double *rem, *nstar;
	tuple_t *tq; /* the current level's tuples */
	int nt, wave;
	double t;
} pack_t;

/* Steps 2-3: the relaxed optimum of the k MetaOps ids[0..k) and their
 * bi-point tuples into P->tq. */
static void bipoint_tuples(pack_t *P, int k)
{
	planner_t *pl = P->pl;
	double C = relaxed_cstar(pl, P->ids, P->rem, k, pl->N, P->nstar);
	P->nt = 0;
	for (int i = 0; i < k; i++) {
		const metaop_t *m = &pl->mops[P->ids[i]];
		double ns = P->nstar[i];
		int L = m->n_layers;
		if (!(ns > 1) || !isfinite(ns)) {
			P->tq[P->nt++] = (tuple_t){P->ids[i], isfinite(ns) ? 1 : m->nmax, L};
			continue;
		}
		int lo = SP_MIN((int)floor(ns), m->nmax), hi = SP_MIN((int)ceil(ns), m->nmax);
		double tl = mop_t(m, lo), th = mop_t(m, hi);
		int l_lo = L;
		if (hi != lo && tl > th) {
			double x = (C - L * th) / (tl - th);
			l_lo = (int)floor(x + 0.5);
			l_lo = SP_MAX(0, SP_MIN(L, l_lo));
		}
		if (l_lo > 0)
			P->tq[P->nt++] = (tuple_t){P->ids[i], lo, l_lo};
		if (L - l_lo > 0)
			P->tq[P->nt++] = (tuple_t){P->ids[i], hi, L - l_lo};
	}
}

/* Eligible tuples into P->pick: the first of each MetaOp with layers left
 * whose inputs are done; sorted by most remaining time first. */
static int eligible_tuples(pack_t *P)
{
	const planner_t *pl = P->pl;
	const tuple_t *tq = P->tq;
	int *pick = P->pick, ne = 0;
	for (int i = 0; i < P->nt; i++) {
		if (tq[i].layers == 0)
			continue;
		int first = 1;
		for (int j = 0; j < i; j++)
			if (tq[j].m == tq[i].m && tq[j].layers > 0)
				first = 0;
		const metaop_t *mo = &pl->mops[tq[i].m];
		for (int q = 0; q < mo->n_pred && first; q++) {
			int src = pl->edges[mo->pred[q]].src;
			first = P->done_layers[src] == pl->mops[src].n_layers;
		}
		if (first)
			pick[ne++] = i;
	}
	for (int a = 1; a < ne; a++)
		for (int b = a; b > 0; b--) {
			const tuple_t *x = &tq[pick[b]], *y = &tq[pick[b - 1]];
			double tx = x->layers * mop_t(&pl->mops[x->m], x->n);
			double ty = y->layers * mop_t(&pl->mops[y->m], y->n);
			if (tx <= ty)
				break;
			int s = pick[b];
			pick[b] = pick[b - 1];
			pick[b - 1] = s;
		}
	return ne;
}

/* Step 4 for one wave over the ne eligible tuples: take them while they
 * fit, idle devices to the MetaOps with most remaining time, every slice
 * cut to the shortest (whole layers, at least one). */
static int pack_wave(pack_t *P, int ne)
{
	const planner_t *pl = P->pl;
	int free_dev = pl->N, nw = 0;
	for (int a = 0; a < ne; a++) {
		const tuple_t *x = &P->tq[P->pick[a]];
		if (x->n <= free_dev) {
			P->pick[nw] = P->pick[a];
			P->width[nw++] = x->n;
			free_dev -= x->n;
		}
	}
	for (int a = 0; a < nw && free_dev > 0; a++) {
		const metaop_t *m = &pl->mops[P->tq[P->pick[a]].m];
		int add = SP_MIN(free_dev, m->nmax - P->width[a]);
		P->width[a] += add;
		free_dev -= add;
	}
	double D = HUGE_VAL, end = P->t;
	for (int a = 0; a < nw; a++) {
		const tuple_t *x = &P->tq[P->pick[a]];
		D = fmin(D, x->layers * mop_t(&pl->mops[x->m], P->width[a]));
	}
	for (int a = 0; a < nw; a++) {
		tuple_t *x = &P->tq[P->pick[a]];
		double per = mop_t(&pl->mops[x->m], P->width[a]);
		int l = per > 0 ? (int)floor(D / per + 1e-9) : x->layers;
		l = SP_MAX(1, SP_MIN(l, x->layers));
		int lf = P->done_layers[x->m];
		if (sched_push(P->out, x->m, lf, lf + l, P->width[a], P->wave, P->t,
			       P->t + l * per))
			return SP_ENOMEM;
		P->done_layers[x->m] += l;
		x->layers -= l;
		end = fmax(end, P->t + l * per);
	}
	P->wave++;
	P->t = end;
	return 0;
}

/* whole_dag: one pass over all MetaOps, a tuple eligible once its inputs'
 * layers are all done in earlier waves (our variant, not the paper's). */
static int paper_pack(planner_t *pl, sched_t *out, int whole_dag)
{
	int M = pl->n_mops, rc, ne;
	sp_arena_t *ar = &pl->scratch;
	pack_t P = {.pl = pl, .out = out};
	P.ids = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	P.rem = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	P.nstar = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	P.tq = sp_arena_calloc(ar, (size_t)(2 * M + 2), sizeof(tuple_t));
	P.done_layers = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	P.pick = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	P.width = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	if (!P.ids || !P.rem || !P.nstar || !P.tq || !P.done_layers || !P.pick || !P.width)
		return SP_ENOMEM;
	int n_passes = whole_dag ? 1 : pl->n_levels;
	for (int lv = 0; lv < n_passes; lv++) {
		int k = 0;
		for (int q = 0; q < M; q++)
			if (whole_dag || pl->mops[pl->topo[q]].level == lv) {
				P.ids[k] = pl->topo[q];
				P.rem[k++] = pl->mops[pl->topo[q]].n_layers;
			}
		if (!k)
			continue;
		bipoint_tuples(&P, k);
		while ((ne = eligible_tuples(&P)) > 0)
			if ((rc = pack_wave(&P, ne)))
				return rc;
	}
	return 0;
}

int sched_paper(planner_t *pl, sched_t *out)
{
	return paper_pack(pl, out, 0);
}

int sched_paper_dag(planner_t *pl, sched_t *out)
{
	return paper_pack(pl, out, 1);
}
