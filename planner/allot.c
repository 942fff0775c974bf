/*
 * allot.c — phase 1 of our scheduler: one width per MetaOp.
 *
 * Separable allotment: each MetaOp's cheapest width meeting a common
 * deadline, scanned over all deadlines, critical path evaluated exactly.
 *
 * The MILP (GLPK). Choose one width k_m per MetaOp from a candidate set K_m
 * (the widths faster than one device fewer, i.e. where the local batch
 * ceil(B/n) shrinks; beyond 48 of them, all up to 16 and then about 8%
 * apart) minimising C, the larger of the area and critical-path bounds of
 * the whole iteration under those widths:
 *
 *   min C
 *   s.t. sum_k x_mk = 1                                   for every m
 *        sum_{m,k} L_m k T_m(k) x_mk - N C <= 0           (area)
 *        S_p + sum_k L_p T_p(k) x_pk - S_m <= 0           for every edge p -> m
 *        S_m + sum_k L_m T_m(k) x_mk - C <= 0             for every m
 *        x_mk in {0,1}, S_m >= 0
 *
 * S_m are start potentials (longest-path). Presolve on, cut generators
 * off, a budget of branch-and-bound nodes (--milp-nodes, default 200;
 * deterministic, unlike a time limit); the separable solution is computed
 * first and kept when it is as good, and the MILP is not solved at all
 * when a lower bound (allot_lower) shows that no widths beat it.
 *
 * Local search (allot_search) then tunes the widths on the list schedule
 * itself (sched_list.c). This file chooses widths only; it schedules
 * nothing that is kept. Temporaries live in a scope of pl->scratch.
 */
#include "planner.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CAND 48

static int width_candidates(const metaop_t *m, int N, int *k)
{
	int n = 0, lim = SP_MIN(N, m->nmax), total = 0, last = 0;
	if (!m->scales) {
		k[n++] = 1;
		return n;
	}
	/* only widths faster than one device fewer: the others add devices
	 * without shrinking the local batch ceil(B/n) */
	for (int c = 1; c <= lim; c++)
		total += width_gains(m, c);
	for (int c = 1; c <= lim && n < MAX_CAND - 1; c++) {
		if (!width_gains(m, c))
			continue;
		/* too many: all up to 16, then at least 8% apart, spaced
		 * geometrically so that the slots left reach the top */
		if (total > MAX_CAND && c > 16) {
			int slots = MAX_CAND - 1 - n;
			double ratio = fmax(1.08, pow((double)lim / last, 1.0 / slots));
			if (c < last * ratio && c < lim)
				continue;
		}
		k[n++] = last = c;
	}
	int top = lim;
	while (top > 1 && !width_gains(m, top))
		top--;
	if (k[n - 1] != top)
		k[n++] = top;
	return n;
}

double allot_objective(const planner_t *pl, const int *w, double *scratch)
{
	double area = 0, cp = 0;
	sched_blevels(pl, w, scratch);
	for (int m = 0; m < pl->n_mops; m++) {
		area += pl->mops[m].n_layers * w[m] * mop_t(&pl->mops[m], w[m]);
		cp = fmax(cp, scratch[m]);
	}
	return fmax(area / pl->N, cp);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Separable allotment: for each deadline D, the cheapest width with
 * L T(k) <= D; keep the D with the best objective. */
int allot_separable(planner_t *pl, int *w)
{
	int M = pl->n_mops, nd = 0;
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	/* every MetaOp's candidate widths, once: k + m MAX_CAND, nks[m] of them */
	int *ks = sp_arena_calloc(&pl->scratch, (size_t)(M * MAX_CAND + 1), sizeof(int));
	int *nks = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(int));
	double *dl = sp_arena_calloc(&pl->scratch, (size_t)(M * MAX_CAND + 1), sizeof(double));
	int *cur = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(int));
	double *scratch = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(double));
	if (!ks || !nks || !dl || !cur || !scratch)
		return SP_ENOMEM;
	for (int m = 0; m < M; m++) {
		int *k = ks + (size_t)m * MAX_CAND;
		nks[m] = width_candidates(&pl->mops[m], pl->N, k);
		for (int i = 0; i < nks[m]; i++)
			dl[nd++] = pl->mops[m].n_layers * mop_t(&pl->mops[m], k[i]);
	}
	qsort(dl, (size_t)nd, sizeof(double), cmp_double);
	double best = HUGE_VAL, lo_needed = 0;
	for (int m = 0; m < M; m++)
		lo_needed = fmax(lo_needed, pl->mops[m].n_layers *
						    mop_t(&pl->mops[m], pl->mops[m].scales ? pl->mops[m].nmax : 1));
	for (int i = 0; i < nd; i++) {
		if (i > 0 && dl[i] == dl[i - 1])
			continue;
		double D = dl[i];
		if (D < lo_needed * (1 - 1e-12))
			continue;
		for (int m = 0; m < M; m++) {
			const metaop_t *mo = &pl->mops[m];
			const int *k = ks + (size_t)m * MAX_CAND;
			int nk = nks[m], pick = k[nk - 1];
			double area = HUGE_VAL;
			for (int j = 0; j < nk; j++)
				if (mo->n_layers * mop_t(mo, k[j]) <= D * (1 + 1e-12) &&
				    k[j] * mop_t(mo, k[j]) < area) {
					area = k[j] * mop_t(mo, k[j]);
					pick = k[j];
				}
			cur[m] = pick;
		}
		double obj = allot_objective(pl, cur, scratch);
		if (obj < best) {
			best = obj;
			memcpy(w, cur, sizeof(int) * (size_t)M);
		}
	}
	sp_arena_reset(&pl->scratch, mark);
	return 0;
}

/* A(D) of allot_lower: every MetaOp at its least area among its candidate
 * widths k (ks + m MAX_CAND, nks[m] of them) with L T(k) <= D; HUGE_VAL
 * when one has none. */
static double area_within(const planner_t *pl, const int *ks, const int *nks, double D)
{
	double area = 0;
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		const int *k = ks + (size_t)m * MAX_CAND;
		double least = HUGE_VAL;
		for (int j = 0; j < nks[m]; j++)
			if (mo->n_layers * mop_t(mo, k[j]) <= D)
				least = fmin(least, mo->n_layers * k[j] * mop_t(mo, k[j]));
		if (least == HUGE_VAL)
			return HUGE_VAL;
		area += least;
	}
	return area;
}

/*
 * A lower bound on allot_objective over every choice of candidate widths
 * (the MILP's feasible set). Widths w have a longest MetaOp, D = max_m
 * L_m T_m(w_m), one of the deadlines L_m T_m(k); then
 *   area(w) >= A(D) = sum_m min {L_m k T_m(k) : k in K_m, L_m T_m(k) <= D}
 *   cp(w)   >= D,  cp(w) >= cp_min (every MetaOp at its fastest candidate)
 * so obj(w) >= max(cp_min, min_D max(A(D) / N, D)). A(D) / N does not grow
 * with D and D does, so the minimum lies at the first deadline where
 * A(D) / N <= D or the one before it (bisection). Every term is one that
 * allot_objective computes, in the same expression and order, and
 * rounding is monotone: the bound holds for the computed values exactly.
 */
int allot_lower(planner_t *pl, double *out)
{
	int M = pl->n_mops, nd = 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	int *ks = sp_arena_calloc(a, (size_t)(M * MAX_CAND + 1), sizeof(int));
	int *nks = sp_arena_calloc(a, (size_t)(M + 1), sizeof(int));
	int *fast = sp_arena_calloc(a, (size_t)(M + 1), sizeof(int));
	double *dl = sp_arena_calloc(a, (size_t)(M * MAX_CAND + 1), sizeof(double));
	double *bl = sp_arena_calloc(a, (size_t)(M + 1), sizeof(double));
	if (!ks || !nks || !fast || !dl || !bl)
		return SP_ENOMEM;
	for (int m = 0; m < M; m++) {
		const metaop_t *mo = &pl->mops[m];
		int *k = ks + (size_t)m * MAX_CAND;
		nks[m] = width_candidates(mo, pl->N, k);
		fast[m] = k[0];
		for (int j = 0; j < nks[m]; j++) {
			dl[nd++] = mo->n_layers * mop_t(mo, k[j]);
			if (mo->n_layers * mop_t(mo, k[j]) < mo->n_layers * mop_t(mo, fast[m]))
				fast[m] = k[j];
		}
	}
	sched_blevels(pl, fast, bl);
	double cp = 0;
	for (int m = 0; m < M; m++)
		cp = fmax(cp, bl[m]);
	qsort(dl, (size_t)nd, sizeof(double), cmp_double);
	int lo = 0, hi = nd; /* the first deadline with A(D) / N <= D (nd: none) */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (area_within(pl, ks, nks, dl[mid]) / pl->N <= dl[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	double least = lo < nd ? dl[lo] : HUGE_VAL;
	if (lo > 0)
		least = fmin(least, area_within(pl, ks, nks, dl[lo - 1]) / pl->N);
	*out = fmax(cp, least);
	sp_arena_reset(a, mark);
	return 0;
}

/* The search's subproblems so far and its budget (no global: MILPs may
 * run on several threads at once, each with GLPK state of its own). */
typedef struct {
	int nodes, budget;
} milp_count_t;

/* Stops the branch and bound after the budget's subproblems. */
static void milp_budget(glp_tree *T, void *info)
{
	milp_count_t *n = info;
	if (glp_ios_reason(T) == GLP_ISELECT && ++n->nodes > n->budget)
		glp_ios_terminate(T);
}

void allot_thread_end(void)
{
	glp_free_env(); /* 1 (nothing done) when the thread never used GLPK */
}

/* The MILP's columns: x_mk at 1..nx (MetaOp by MetaOp), S_m at nx+1..nx+M,
 * C at nx+M+1. */
typedef struct {
	int nx;
	int *col_m, *col_k; /* per x column j: its MetaOp and width, at [j - 1] */
	int *first;         /* per MetaOp: its first x column; first[M] = nx + 1 */
} milp_cols_t;

/* Numbers the x columns: every MetaOp's candidate widths. */
static int milp_columns(planner_t *pl, milp_cols_t *cols)
{
	int M = pl->n_mops, nx = 0;
	sp_arena_t *a = &pl->scratch;
	int *k = sp_arena_calloc(a, MAX_CAND, sizeof(int));
	cols->first = sp_arena_calloc(a, (size_t)(M + 1), sizeof(int));
	if (!k || !cols->first)
		return SP_ENOMEM;
	for (int m = 0; m < M; m++)
		nx += width_candidates(&pl->mops[m], pl->N, k);
	cols->nx = nx;
	cols->col_m = sp_arena_calloc(a, (size_t)(nx + 1), sizeof(int));
	cols->col_k = sp_arena_calloc(a, (size_t)(nx + 1), sizeof(int));
	if (!cols->col_m || !cols->col_k)
		return SP_ENOMEM;
	for (int m = 0, j = 0; m < M; m++) {
		int nk = width_candidates(&pl->mops[m], pl->N, k);
		cols->first[m] = j + 1;
		for (int i = 0; i < nk; i++, j++) {
			cols->col_m[j] = m;
			cols->col_k[j] = k[i];
		}
	}
	cols->first[M] = nx + 1;
	return 0;
}

/* Loads the problem of the file comment into lp: columns, objective and
 * rows. */
static int milp_build(planner_t *pl, const milp_cols_t *cols, glp_prob *lp)
{
	int M = pl->n_mops, nx = cols->nx, cC = nx + M + 1, r = 0;
	const int *first = cols->first, *col_k = cols->col_k;
	size_t nz_cap = (size_t)nx * 3 + (size_t)pl->n_edges * (2 + 2 * MAX_CAND) +
			(size_t)M * 2 + 8;
	int *ia = sp_arena_calloc(&pl->scratch, nz_cap + 1, sizeof(int));
	int *ja = sp_arena_calloc(&pl->scratch, nz_cap + 1, sizeof(int));
	double *ar = sp_arena_calloc(&pl->scratch, nz_cap + 1, sizeof(double));
	if (!ia || !ja || !ar)
		return SP_ENOMEM;
	glp_set_obj_dir(lp, GLP_MIN);
	glp_add_cols(lp, nx + M + 1);
	for (int j = 1; j <= nx; j++)
		glp_set_col_kind(lp, j, GLP_BV);
	for (int m = 0; m < M; m++)
		glp_set_col_bnds(lp, nx + 1 + m, GLP_LO, 0, 0);
	glp_set_col_bnds(lp, cC, GLP_LO, 0, 0);
	glp_set_obj_coef(lp, cC, 1.0);
	size_t nz = 0;
	glp_add_rows(lp, M + 1 + pl->n_edges + M);
#define NZ(row, col, val)                                                          \
	do {                                                                       \
		nz++;                                                              \
		ia[nz] = (row);                                                    \
		ja[nz] = (col);                                                    \
		ar[nz] = (val);                                                    \
	} while (0)
	for (int m = 0; m < M; m++) { /* one width each */
		r++;
		glp_set_row_bnds(lp, r, GLP_FX, 1, 1);
		for (int j = first[m]; j < first[m + 1]; j++)
			NZ(r, j, 1.0);
	}
	r++; /* area */
	glp_set_row_bnds(lp, r, GLP_UP, 0, 0);
	for (int j = 1; j <= nx; j++) {
		const metaop_t *mo = &pl->mops[cols->col_m[j - 1]];
		NZ(r, j, mo->n_layers * col_k[j - 1] * mop_t(mo, col_k[j - 1]));
	}
	NZ(r, cC, -(double)pl->N);
	for (int e = 0; e < pl->n_edges; e++) { /* precedence */
		int p = pl->edges[e].src, m = pl->edges[e].dst;
		r++;
		glp_set_row_bnds(lp, r, GLP_UP, 0, 0);
		NZ(r, nx + 1 + p, 1.0);
		NZ(r, nx + 1 + m, -1.0);
		for (int j = first[p]; j < first[p + 1]; j++)
			NZ(r, j, pl->mops[p].n_layers * mop_t(&pl->mops[p], col_k[j - 1]));
	}
	for (int m = 0; m < M; m++) { /* finish by C */
		r++;
		glp_set_row_bnds(lp, r, GLP_UP, 0, 0);
		NZ(r, nx + 1 + m, 1.0);
		NZ(r, cC, -1.0);
		for (int j = first[m]; j < first[m + 1]; j++)
			NZ(r, j, pl->mops[m].n_layers * mop_t(&pl->mops[m], col_k[j - 1]));
	}
#undef NZ
	glp_load_matrix(lp, (int)nz, ia, ja, ar);
	return 0;
}

/* Branch and bound within the node budget; 1 when it found a solution. */
static int milp_solve(const planner_t *pl, glp_prob *lp)
{
	glp_iocp parm;
	glp_init_iocp(&parm);
	parm.presolve = GLP_ON;
	parm.msg_lev = GLP_MSG_OFF;
	/* a node budget, not a time limit, ends the search: the same inputs must
	 * give the same plan on any machine (no tm_lim: GLPK's default is none) */
	milp_count_t nodes = {0, pl->opts->milp_nodes > 0 ? pl->opts->milp_nodes : 200};
	parm.cb_func = milp_budget;
	parm.cb_info = &nodes;
	parm.mip_gap = 1e-3;
	/* branch on the first fractional variable: under a node budget the
	 * search rarely finishes on big instances, and Driebeck-Tomlin (GLPK's
	 * default) spends most of each node computing tableau rows. Measured
	 * on this project's machine: the same iteration and compute times for
	 * every bundled workload (qwen-val places a few slices differently),
	 * MILP time 1134 -> 369 ms (32 tasks, 1024 devices) and 3740 -> 868 ms
	 * (64 tasks), and over 180 random workload/cluster pairs (property-test
	 * generator, seeds 0-89 on 8 and 16 devices) plans 1.1% faster in
	 * geometric mean (13 faster, 9 slower, the rest the same) */
	parm.br_tech = GLP_BR_FFV;
	int ret = glp_intopt(lp, &parm);
	int st = glp_mip_status(lp);
	return (ret == 0 || ret == GLP_ESTOP) && (st == GLP_OPT || st == GLP_FEAS);
}

/* The solution's widths replace w when their objective is lower. */
static int milp_keep_better(planner_t *pl, const milp_cols_t *cols, glp_prob *lp, int *w)
{
	int M = pl->n_mops;
	double *scratch = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(double));
	int *cand_w = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(int));
	if (!scratch || !cand_w)
		return SP_ENOMEM;
	for (int m = 0; m < M; m++) {
		cand_w[m] = w[m];
		for (int j = cols->first[m]; j < cols->first[m + 1]; j++)
			if (glp_mip_col_val(lp, j) > 0.5)
				cand_w[m] = cols->col_k[j - 1];
	}
	if (allot_objective(pl, cand_w, scratch) < allot_objective(pl, w, scratch) * (1 - 1e-9))
		memcpy(w, cand_w, sizeof(int) * (size_t)M);
	return 0;
}

int allot_milp_solve(planner_t *pl, int *w)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	milp_cols_t cols;
	int rc = milp_columns(pl, &cols);
	if (!rc) {
		glp_term_out(GLP_OFF);
		glp_prob *lp = glp_create_prob();
		if (!(rc = milp_build(pl, &cols, lp)) && milp_solve(pl, lp))
			rc = milp_keep_better(pl, &cols, lp, w);
		glp_delete_prob(lp);
	}
	sp_arena_reset(&pl->scratch, mark);
	return rc;
}

/* The MILP of the file comment, solved only when it can change w: its
 * answer replaces w only below w's objective by milp_keep_better's margin,
 * and no widths are below allot_lower, so when that bound is at the bar
 * the answer would be dropped (the separable widths are optimal then:
 * clip-10 on 32 A800s). */
int allot_milp(planner_t *pl, int *w)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	double lb, *scratch = sp_arena_calloc(&pl->scratch, (size_t)(pl->n_mops + 1), sizeof(double));
	int rc = scratch ? allot_lower(pl, &lb) : SP_ENOMEM;
	if (!rc && lb < allot_objective(pl, w, scratch) * (1 - 1e-9))
		rc = allot_milp_solve(pl, w);
	sp_arena_reset(&pl->scratch, mark);
	return rc;
}

/*
 * Local search on the widths. The list schedule's nominal
 * makespan is what the simulator measures for its compute (it replays the
 * same cost model), so widths can be tuned on it cheaply: for each MetaOp,
 * by decreasing work, try half, double, -1 and +1 its width and keep a
 * change when the whole schedule gets shorter. A fixed budget of trial
 * schedules (more on small clusters, where each is cheap) keeps it bounded
 * and deterministic.
 */
/* The list schedule's makespan for widths w (HUGE_VAL if it finds none in
 * memory, or when it reaches stop: then the makespan is stop or more). */
static int makespan(planner_t *pl, const int *w, double frac, double stop, double *out)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	sched_t t;
	sched_init(&t, ALGO_SPINDLE, &pl->scratch);
	int rc = sched_list_until(pl, w, frac, stop, &t);
	*out = HUGE_VAL;
	if (rc == 0) {
		*out = sched_makespan(&t);
	} else if (rc == SCHED_PAST) {
		rc = 0;
	} else if (rc == SP_EINFEAS) {
		memset(pl->err, 0, sizeof *pl->err);
		rc = 0;
	}
	sp_arena_reset(&pl->scratch, mark); /* the trial and its work arrays */
	return rc;
}

int allot_search(planner_t *pl, int *w, double frac)
{
	int M = pl->n_mops, rc = 0, budget = SP_MAX(12, 3000 / pl->N);
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int *order = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(int));
	double *work = sp_arena_calloc(&pl->scratch, (size_t)(M + 1), sizeof(double));
	if (!order || !work)
		return SP_ENOMEM;
	double best;
	if ((rc = makespan(pl, w, frac, HUGE_VAL, &best)) || best == HUGE_VAL)
		goto done;
	for (int m = 0; m < M; m++) {
		order[m] = m;
		work[m] = pl->mops[m].n_layers * mop_t(&pl->mops[m], w[m]) * w[m];
	}
	for (int a = 1; a < M; a++)
		for (int b = a; b > 0 && work[order[b]] > work[order[b - 1]]; b--) {
			int x = order[b];
			order[b] = order[b - 1];
			order[b - 1] = x;
		}
	/* quiet: the MetaOps visited since a change was last kept. After M
	 * of them the widths are those at which this MetaOp's trials were
	 * all refused a pass before: the search is over */
	for (int pass = 0, quiet = 0; pass < 2 && budget > 0; pass++)
		for (int oi = 0; oi < M && budget > 0 && quiet < M; oi++, quiet++) {
			int m = order[oi], w0 = w[m];
			const metaop_t *mo = &pl->mops[m];
			if (!mo->scales || mo->nmax == 1)
				continue;
			int cand[4] = {w0 / 2, w0 * 2, w0 - 1, w0 + 1};
			for (int c = 0; c < 4 && budget > 0; c++) {
				int k = SP_MAX(1, SP_MIN(cand[c], mo->nmax));
				if (k == w[m] || (c >= 2 && (k == w0 / 2 || k == w0 * 2)))
					continue;
				budget--;
				int keep = w[m];
				w[m] = k;
				double ms;
				/* a trial is kept only below the bar: one that
				 * reaches it is stopped there */
				if ((rc = makespan(pl, w, frac, best * (1 - 1e-6), &ms)))
					goto done;
				if (ms < best * (1 - 1e-6)) {
					best = ms;
					quiet = -1; /* 0 after this MetaOp */
				} else
					w[m] = keep;
			}
		}
done:
	sp_arena_reset(&pl->scratch, mark);
	return rc;
}
