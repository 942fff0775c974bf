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

/* whole_dag: one pass over all MetaOps, a tuple eligible once its inputs'
 * layers are all done in earlier waves (our variant, not the paper's). */
static int paper_pack(planner_t *pl, sched_t *out, int whole_dag)
{
	int M = pl->n_mops, wave = 0;
	double t = 0;
	sp_arena_t *ar = &pl->scratch; /* work arrays: the candidate's scope */
	int *ids = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	double *rem = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	double *nstar = sp_arena_calloc(ar, (size_t)M + 1, sizeof(double));
	tuple_t *tq = sp_arena_calloc(ar, (size_t)(2 * M + 2), sizeof(tuple_t));
	int *done_layers = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	int *pick = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	int *width = sp_arena_calloc(ar, (size_t)M + 1, sizeof(int));
	if (!ids || !rem || !nstar || !tq || !done_layers || !pick || !width)
		return SP_ENOMEM;
	int n_passes = whole_dag ? 1 : pl->n_levels;
	for (int lv = 0; lv < n_passes; lv++) {
		int k = 0, nt = 0;
		for (int q = 0; q < M; q++)
			if (whole_dag || pl->mops[pl->topo[q]].level == lv) {
				ids[k] = pl->topo[q];
				rem[k++] = pl->mops[pl->topo[q]].n_layers;
			}
		if (!k)
			continue;
		double C = relaxed_cstar(pl, ids, rem, k, pl->N, nstar);
		/* bi-point tuples */
		for (int i = 0; i < k; i++) {
			const metaop_t *m = &pl->mops[ids[i]];
			double ns = nstar[i];
			int L = m->n_layers;
			if (!(ns > 1) || !isfinite(ns)) {
				tq[nt++] = (tuple_t){ids[i], isfinite(ns) ? 1 : m->nmax, L};
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
				tq[nt++] = (tuple_t){ids[i], lo, l_lo};
			if (L - l_lo > 0)
				tq[nt++] = (tuple_t){ids[i], hi, L - l_lo};
		}
		/* greedy waves */
		for (;;) {
			/* eligible: the first tuple of each MetaOp with layers left */
			int ne = 0;
			for (int i = 0; i < nt; i++) {
				if (tq[i].layers == 0)
					continue;
				int first = 1;
				for (int j = 0; j < i; j++)
					if (tq[j].m == tq[i].m && tq[j].layers > 0)
						first = 0;
				const metaop_t *mo = &pl->mops[tq[i].m];
				for (int q = 0; q < mo->n_pred && first; q++) {
					int src = pl->edges[mo->pred[q]].src;
					first = done_layers[src] == pl->mops[src].n_layers;
				}
				if (first)
					pick[ne++] = i;
			}
			if (!ne)
				break;
			/* most remaining time first */
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
			int free_dev = pl->N, nw = 0;
			for (int a = 0; a < ne; a++) {
				const tuple_t *x = &tq[pick[a]];
				if (x->n <= free_dev) {
					pick[nw] = pick[a];
					width[nw++] = x->n;
					free_dev -= x->n;
				}
			}
			/* idle devices to the MetaOps with most remaining time */
			for (int a = 0; a < nw && free_dev > 0; a++) {
				const metaop_t *m = &pl->mops[tq[pick[a]].m];
				int add = SP_MIN(free_dev, m->nmax - width[a]);
				width[a] += add;
				free_dev -= add;
			}
			double D = HUGE_VAL;
			for (int a = 0; a < nw; a++) {
				const tuple_t *x = &tq[pick[a]];
				D = fmin(D, x->layers * mop_t(&pl->mops[x->m], width[a]));
			}
			double end = t;
			for (int a = 0; a < nw; a++) {
				tuple_t *x = &tq[pick[a]];
				const metaop_t *m = &pl->mops[x->m];
				double per = mop_t(m, width[a]);
				int l = per > 0 ? (int)floor(D / per + 1e-9) : x->layers;
				l = SP_MAX(1, SP_MIN(l, x->layers));
				int lf = done_layers[x->m];
				if (sched_push(out, x->m, lf, lf + l, width[a], wave, t, t + l * per))
					return SP_ENOMEM;
				done_layers[x->m] += l;
				x->layers -= l;
				end = fmax(end, t + l * per);
			}
			wave++;
			t = end;
		}
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
