/*
 * sched_spindle.c — our scheduler. Two phases, over the whole MetaOp DAG
 * (no level barriers: a MetaOp is ready as soon as its inputs are done):
 *
 * Phase 1, allotment (GLPK MILP). Choose one width k_m per MetaOp from a
 * candidate set K_m (the widths faster than one device fewer, i.e. where
 * the local batch ceil(B/n) shrinks; beyond 48 of them, all up to 16 and
 * then about 8% apart) minimising C, the larger of the area and
 * critical-path bounds of the whole iteration under those widths:
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
 * deterministic, unlike a time limit); the separable solution (each MetaOp's cheapest width
 * meeting a common deadline, scanned over all deadlines, critical path
 * evaluated exactly) is computed first and kept when it is as good.
 *
 * Phase 2, list scheduling with malleable tails. Event-driven over time:
 * ready MetaOps start in order of bottom level (longest remaining path at
 * the chosen widths) with their width when it fits the free devices; a
 * MetaOp that does not fit starts narrower if that finishes no later than
 * waiting would; smaller MetaOps backfill. When devices would sit idle, the
 * running MetaOp that finishes last is widened at its next layer boundary
 * (a new slice on a superset of its devices) if that ends it sooner.
 *
 * Phase 1b improves the MILP widths by local search on the schedule itself
 * (allot_search).
 *
 * Variants (plan.c evaluates each with the simulator and keeps the fastest
 * that fits memory):
 *   0  MILP widths + search, list scheduling with tails, segments within 70%
 *   1  separable widths, the same
 *   2  the paper's waves with the whole DAG (no level barrier)
 *   3, 4  MILP widths with segments within 40% and 20% of memory
 *   5  lanes: independent chains share the devices as a fluid made
 *      integral with McNaughton's wrap-around rule (see lanes_schedule)
 *   6  lanes with an end game: lanes that outrun their windows go on
 *      wherever devices are free (shorter compute, more replicas)
 *   7  lanes with the end game whose gangs step down through a middle
 *      width (mid_step), calibrated longer; up to 256 devices
 *   8  data parallel on all devices: when nothing beats it, we use it
 */
#include "planner.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CAND 48

static int faster_than_one_less(const metaop_t *m, int c)
{
	return c == 1 || mop_t(m, c) < mop_t(m, c - 1) * (1 - 1e-12);
}

static int candidates(const metaop_t *m, int N, int *k)
{
	int n = 0, lim = SP_MIN(N, m->nmax), total = 0, last = 0;
	if (!m->scales) {
		k[n++] = 1;
		return n;
	}
	/* only widths faster than one device fewer: the others add devices
	 * without shrinking the local batch ceil(B/n) */
	for (int c = 1; c <= lim; c++)
		total += faster_than_one_less(m, c);
	for (int c = 1; c <= lim && n < MAX_CAND - 1; c++) {
		if (!faster_than_one_less(m, c))
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
	while (top > 1 && !faster_than_one_less(m, top))
		top--;
	if (k[n - 1] != top)
		k[n++] = top;
	return n;
}

/* The fewest devices that run m as fast as n do. */
static int pareto_floor(const metaop_t *m, int n)
{
	while (n > 1 && !faster_than_one_less(m, n))
		n--;
	return n;
}

/* Bottom levels (longest path from m to the end, m included) at widths w. */
static void blevels(const planner_t *pl, const int *w, double *bl)
{
	for (int q = pl->n_mops - 1; q >= 0; q--) {
		int m = pl->topo[q];
		const metaop_t *mo = &pl->mops[m];
		double after = 0;
		for (int s = 0; s < mo->n_succ; s++)
			after = fmax(after, bl[pl->edges[mo->succ[s]].dst]);
		bl[m] = mo->n_layers * mop_t(mo, w[m]) + after;
	}
}

/* max(area / N, critical path) of widths w. */
static double allot_objective(const planner_t *pl, const int *w, double *scratch)
{
	double area = 0, cp = 0;
	blevels(pl, w, scratch);
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
static int allot_separable(const planner_t *pl, int *w)
{
	int M = pl->n_mops, nd = 0, rc = 0;
	int *k = malloc(sizeof(int) * MAX_CAND);
	double *dl = malloc(sizeof(double) * (size_t)(M * MAX_CAND + 1));
	int *cur = malloc(sizeof(int) * (size_t)(M + 1));
	double *scratch = malloc(sizeof(double) * (size_t)(M + 1));
	if (!k || !dl || !cur || !scratch) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int m = 0; m < M; m++) {
		int nk = candidates(&pl->mops[m], pl->N, k);
		for (int i = 0; i < nk; i++)
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
			int nk = candidates(mo, pl->N, k), pick = k[nk - 1];
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
cleanup:
	free(k);
	free(dl);
	free(cur);
	free(scratch);
	return rc;
}

static int milp_node_budget;

/* Stops the branch and bound after milp_node_budget subproblems. */
static void milp_budget(glp_tree *T, void *info)
{
	int *nodes = info;
	if (glp_ios_reason(T) == GLP_ISELECT && ++*nodes > milp_node_budget)
		glp_ios_terminate(T);
}

/* The MILP of the file comment; improves w (from allot_separable) if it can. */
static int allot_milp(const planner_t *pl, int *w)
{
	int M = pl->n_mops, rc = 0;
	int *k = malloc(sizeof(int) * MAX_CAND);
	int *col_m = NULL, *col_k = NULL, *ia = NULL, *ja = NULL;
	double *ar = NULL, *scratch = malloc(sizeof(double) * (size_t)(M + 1));
	int *cand_w = malloc(sizeof(int) * (size_t)(M + 1));
	glp_prob *lp = NULL;
	if (!k || !scratch || !cand_w) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	int nx = 0;
	for (int m = 0; m < M; m++)
		nx += candidates(&pl->mops[m], pl->N, k);
	/* columns: x (nx), S (M), C (1) */
	int ncol = nx + M + 1, cC = nx + M + 1;
	col_m = malloc(sizeof(int) * (size_t)(nx + 1));
	col_k = malloc(sizeof(int) * (size_t)(nx + 1));
	size_t nz_cap = (size_t)nx * 3 + (size_t)pl->n_edges * (2 + 2 * MAX_CAND) +
			(size_t)M * 2 + 8;
	ia = malloc(sizeof(int) * (nz_cap + 1));
	ja = malloc(sizeof(int) * (nz_cap + 1));
	ar = malloc(sizeof(double) * (nz_cap + 1));
	if (!col_m || !col_k || !ia || !ja || !ar) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	glp_term_out(GLP_OFF);
	lp = glp_create_prob();
	glp_set_obj_dir(lp, GLP_MIN);
	glp_add_cols(lp, ncol);
	int *first = malloc(sizeof(int) * (size_t)(M + 1));
	if (!first) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int m = 0, j = 0; m < M; m++) {
		int nk = candidates(&pl->mops[m], pl->N, k);
		first[m] = j + 1;
		for (int i = 0; i < nk; i++, j++) {
			col_m[j] = m;
			col_k[j] = k[i];
			glp_set_col_kind(lp, j + 1, GLP_BV);
		}
	}
	first[M] = nx + 1;
	for (int m = 0; m < M; m++)
		glp_set_col_bnds(lp, nx + 1 + m, GLP_LO, 0, 0);
	glp_set_col_bnds(lp, cC, GLP_LO, 0, 0);
	glp_set_obj_coef(lp, cC, 1.0);
	int nrow = M + 1 + pl->n_edges + M, r = 0;
	size_t nz = 0;
	glp_add_rows(lp, nrow);
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
		const metaop_t *mo = &pl->mops[col_m[j - 1]];
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
	glp_iocp parm;
	glp_init_iocp(&parm);
	parm.presolve = GLP_ON;
	parm.msg_lev = GLP_MSG_OFF;
	/* a node budget, not a time limit, ends the search: the same inputs must
	 * give the same plan on any machine (no tm_lim: GLPK's default is none) */
	int nodes = 0;
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
	milp_node_budget = pl->opts->milp_nodes > 0 ? pl->opts->milp_nodes : 200;
	int ret = glp_intopt(lp, &parm);
	int st = glp_mip_status(lp);
	if ((ret == 0 || ret == GLP_ESTOP) && (st == GLP_OPT || st == GLP_FEAS)) {
		for (int m = 0; m < M; m++) {
			cand_w[m] = w[m];
			for (int j = first[m]; j < first[m + 1]; j++)
				if (glp_mip_col_val(lp, j) > 0.5)
					cand_w[m] = col_k[j - 1];
		}
		if (allot_objective(pl, cand_w, scratch) <
		    allot_objective(pl, w, scratch) * (1 - 1e-9))
			memcpy(w, cand_w, sizeof(int) * (size_t)M);
	}
	free(first);
cleanup:
	if (lp)
		glp_delete_prob(lp);
	free(k);
	free(col_m);
	free(col_k);
	free(ia);
	free(ja);
	free(ar);
	free(scratch);
	free(cand_w);
	return rc;
}

/* ---- phase 2: list scheduling ---- */

typedef struct {
	int m, lf, lt, n;
	double t0, t1;
	int32_t *devs; /* n devices (owned) */
	int homed;     /* on its home: never widened */
} run_t;

/* When at least want devices are free, if running slices end as planned:
 * the running slices taken in order of their ends. */
static double next_free_time(const run_t *run, int nrun, int have, int want)
{
	int *ord = malloc(sizeof(int) * (size_t)(nrun + 1));
	double t = HUGE_VAL;
	if (!ord)
		return t;
	for (int i = 0; i < nrun; i++) {
		int j = i;
		for (; j > 0 && run[ord[j - 1]].t1 > run[i].t1; j--)
			ord[j] = ord[j - 1];
		ord[j] = i;
	}
	for (int i = 0; i < nrun && have < want; i++) {
		have += run[ord[i]].n;
		if (have >= want)
			t = run[ord[i]].t1;
	}
	free(ord);
	return t;
}

/*
 * Memory: the most layers of m one device can hold in a slice of width n,
 * with 70% of the cap for them: each layer costs its parameter state plus
 * the activations saved for backward by every MetaOp sharing its component
 * (placement puts those on the same devices), at their local batches. A
 * MetaOp longer than that runs as consecutive segments on different devices.
 */
static int max_layers(const planner_t *pl, const int *w, int m, int n, double frac)
{
	const metaop_t *mo = &pl->mops[m];
	const sp_model_t *md = pl->model;
	int comp = md->tasks[mo->task].nodes[pl->ops[mo->first_op].node].comp;
	double per = (double)mo->layer_state_bytes +
		     (double)mo->saved_per_sample * (double)((mo->batch + n - 1) / n);
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *o = &pl->mops[k];
		if (k == m || md->tasks[o->task].nodes[pl->ops[o->first_op].node].comp != comp)
			continue;
		per += (double)o->saved_per_sample * (double)((o->batch + w[k] - 1) / w[k]);
	}
	double lim = frac * pl->mem_cap / per;
	return lim >= mo->n_layers ? mo->n_layers : SP_MAX(1, (int)lim);
}

/*
 * Homes. A component whose full parameter state takes more than a quarter
 * of a device cannot be replicated freely: its layers are cut into S
 * segments of at most 40% of a device each, and every segment gets a fixed
 * home group of g devices (inside one node when it fits) that holds it
 * once; every MetaOp using those layers runs them there, data parallel over
 * the home. Homes of different segments are disjoint while the devices
 * last; g starts at the widest allotment among the component's MetaOps and
 * shrinks until all homes fit, and S grows until a home also holds the
 * activations its MetaOps save there.
 */
typedef struct {
	int n_params;
	int *param_base; /* per component */
	int *seg_of;     /* per (comp, layer) slot: home segment, -1 if none */
	int32_t *devs;   /* home devices, segment by segment */
	int *first, *n;  /* per segment: devs[first .. +n) */
	int n_seg;
} homes_t;

static void homes_release(homes_t *h)
{
	free(h->param_base);
	free(h->seg_of);
	free(h->devs);
	free(h->first);
	free(h->n);
	memset(h, 0, sizeof *h);
}

static int op_comp(const planner_t *pl, int m, int l, int *layer)
{
	const metaop_t *mo = &pl->mops[m];
	const sp_op_t *op = &pl->ops[mo->first_op + l];
	*layer = op->layer;
	return pl->model->tasks[mo->task].nodes[op->node].comp;
}

static int homes_build(const planner_t *pl, const int *w, homes_t *h)
{
	const sp_model_t *md = pl->model;
	int C = md->n_comps, N = pl->N, G = pl->cluster->gpus_per_node;
	double psb = (double)param_state_bytes(md->dtype, md->opt.kind), cap = pl->mem_cap;
	memset(h, 0, sizeof *h);
	h->param_base = calloc((size_t)C + 1, sizeof(int));
	int *S = calloc((size_t)C + 1, sizeof(int)), *g = calloc((size_t)C + 1, sizeof(int));
	int *L = calloc((size_t)C + 1, sizeof(int));
	if (!h->param_base || !S || !g || !L)
		goto nomem;
	for (int c = 0; c < C; c++) {
		h->param_base[c] = h->n_params;
		L[c] = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
		h->n_params += L[c];
		double ls = (double)comp_layer_params(&md->comps[c]) * psb;
		if (ls * L[c] <= 0.25 * cap || md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		S[c] = SP_MIN(L[c], (int)ceil(ls * L[c] / (0.4 * cap)));
		g[c] = 1;
		for (int m = 0; m < pl->n_mops; m++) {
			int lay;
			if (op_comp(pl, m, 0, &lay) == c)
				g[c] = SP_MAX(g[c], w[m]);
		}
	}
	for (int round = 0; round < 64; round++) {
		int need = 0, grown = 0;
		for (int c = 0; c < C; c++)
			need += S[c] * g[c];
		while (need > N) { /* shrink the widest homes */
			int big = -1;
			for (int c = 0; c < C; c++)
				if (S[c] && g[c] > 1 && (big < 0 || g[c] > g[big]))
					big = c;
			if (big < 0)
				break;
			g[big]--;
			need -= S[big];
		}
		/* a segment must also hold its MetaOps' saved activations */
		for (int c = 0; c < C; c++) {
			if (!S[c] || S[c] == L[c])
				continue;
			double acts = 0;
			for (int m = 0; m < pl->n_mops; m++) {
				int lay;
				if (op_comp(pl, m, 0, &lay) != c)
					continue;
				const metaop_t *mo = &pl->mops[m];
				int gg = (int)SP_MIN((int64_t)g[c], mo->batch);
				acts += (double)mo->saved_per_sample * (double)((mo->batch + gg - 1) / gg);
			}
			double per = (double)comp_layer_params(&md->comps[c]) * psb + acts;
			if (per * ceil((double)L[c] / S[c]) > 0.75 * cap) {
				S[c]++;
				grown = 1;
			}
		}
		if (!grown)
			break;
	}
	h->seg_of = malloc(sizeof(int) * (size_t)(h->n_params + 1));
	int total = 0;
	for (int c = 0; c < C; c++) {
		h->n_seg += S[c];
		total += S[c] * g[c];
	}
	h->devs = calloc((size_t)total + 1, sizeof(int32_t));
	h->first = calloc((size_t)h->n_seg + 1, sizeof(int));
	h->n = calloc((size_t)h->n_seg + 1, sizeof(int));
	if (!h->seg_of || !h->devs || !h->first || !h->n)
		goto nomem;
	for (int q = 0; q < h->n_params; q++)
		h->seg_of[q] = -1;
	int seg = 0, o = 0, dev = 0;
	for (int c = 0; c < C; c++)
		for (int k = 0; k < S[c]; k++, seg++) {
			/* keep a home inside one node when it fits */
			if (g[c] <= G && dev % G + g[c] > G && (dev / G + 1) * G + g[c] <= N)
				dev = (dev / G + 1) * G;
			h->first[seg] = o;
			h->n[seg] = g[c];
			for (int j = 0; j < g[c]; j++)
				h->devs[o++] = (dev++) % N;
			for (int l = L[c] * k / S[c]; l < L[c] * (k + 1) / S[c]; l++)
				h->seg_of[h->param_base[c] + l] = seg;
		}
	free(S);
	free(g);
	free(L);
	return 0;
nomem:
	free(S);
	free(g);
	free(L);
	homes_release(h);
	return SP_ENOMEM;
}

/* Home segment of MetaOp m's layer l, or -1. */
static int home_of(const planner_t *pl, const homes_t *h, int m, int l)
{
	int layer, c = op_comp(pl, m, l, &layer);
	return h->seg_of ? h->seg_of[h->param_base[c] + layer] : -1;
}

/* Commits slice x on devs to the placer and records it as running. */
static int start_slice(placer_t *P, run_t *ru, const sslice_t *x, const int32_t *devs, int N,
		       int homed)
{
	placer_commit(P, x, devs);
	*ru = (run_t){x->metaop, x->lf, x->lt, x->n, x->t0, x->t1,
		      malloc(sizeof(int32_t) * (size_t)N), homed};
	if (!ru->devs)
		return SP_ENOMEM;
	memcpy(ru->devs, devs, sizeof(int32_t) * (size_t)x->n);
	return 0;
}

static int ready(const planner_t *pl, const int *finished, int m)
{
	const metaop_t *mo = &pl->mops[m];
	for (int q = 0; q < mo->n_pred; q++)
		if (!finished[pl->edges[mo->pred[q]].src])
			return 0;
	return 1;
}

/*
 * Phase 2 with the placer: a slice starts only on free devices whose
 * memory takes it, so the schedule respects memory device by device and
 * the placement pass keeps these devices.
 */
static int list_schedule(planner_t *pl, const int *w, double frac, sched_t *out)
{
	int M = pl->n_mops, N = pl->N, rc = 0, nrun = 0, n_fin = 0;
	placer_t *P = NULL;
	homes_t H = {0};
	double *bl = malloc(sizeof(double) * (size_t)(M + 1));
	int *done = calloc((size_t)M + 1, sizeof(int));	 /* layers scheduled */
	int *finished = calloc((size_t)M + 1, sizeof(int)); /* all layers ended */
	int *running = calloc((size_t)M + 1, sizeof(int));
	int *order = malloc(sizeof(int) * (size_t)(M + 1));
	run_t *run = calloc((size_t)M + 1, sizeof(run_t));
	int32_t *devs = malloc(sizeof(int32_t) * (size_t)N);
	if (!bl || !done || !finished || !running || !order || !run || !devs ||
	    placer_new(&P, pl, PLACE_SPINDLE)) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	if (homes_build(pl, w, &H)) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int c = 0; c < pl->model->n_comps; c++) {
		int nl = pl->model->comps[c].type == COMP_TRANSFORMER ? (int)pl->model->comps[c].layers : 1;
		for (int l = 0; l < nl; l++) {
			int sg = H.seg_of[H.param_base[c] + l];
			if (sg >= 0)
				placer_reserve(P, c, l, H.devs + H.first[sg], H.n[sg]);
		}
	}
	blevels(pl, w, bl);
	for (int m = 0; m < M; m++)
		order[m] = m;
	/* priority: bottom level, then id */
	for (int a = 1; a < M; a++)
		for (int b = a; b > 0; b--) {
			int x = order[b], y = order[b - 1];
			if (bl[x] < bl[y] || (bl[x] == bl[y] && x > y))
				break;
			order[b] = y;
			order[b - 1] = x;
		}
	double t = 0;
	while (n_fin < M) {
		int free_dev = placer_free_count(P, t), blocked = 0;
		/* start ready MetaOps */
		for (int oi = 0; oi < M && free_dev > 0; oi++) {
			int m = order[oi];
			const metaop_t *mo = &pl->mops[m];
			if (running[m] || done[m] == mo->n_layers || !ready(pl, finished, m))
				continue;
			int home = home_of(pl, &H, m, done[m]);
			if (home >= 0) {
				/* homed layers run on their home, when all of it is free */
				int r = 1, n = (int)SP_MIN((int64_t)H.n[home], mo->batch);
				while (done[m] + r < mo->n_layers && home_of(pl, &H, m, done[m] + r) == home)
					r++;
				int all_free = 1;
				sslice_t x = {m, done[m], done[m] + r, n, 0, t, t + r * mop_t(mo, n), 0, -1};
				memcpy(devs, H.devs + H.first[home], sizeof(int32_t) * (size_t)n);
				devs_sort(devs, n);
				for (int j = 0; j < n; j++)
					all_free &= placer_free_count_dev(P, devs[j], t);
				if (!all_free)
					continue;
				if ((rc = start_slice(P, &run[nrun++], &x, devs, N, 1)))
					goto cleanup;
				running[m] = 1;
				done[m] += r;
				free_dev -= n;
				continue;
			}
			int want = SP_MIN(w[m], mo->nmax);
			int r = SP_MIN(mo->n_layers - done[m], max_layers(pl, w, m, want, frac));
			for (int k = 1; k < r; k++)
				if (home_of(pl, &H, m, done[m] + k) >= 0)
					r = k; /* stop where homed layers begin */
			sslice_t x = {m, done[m], done[m] + r, want, 0, t, 0, 0, -1};
			int later = 0, fit = placer_fitting(P, &x, &later);
			int n = pareto_floor(mo, SP_MIN(want, fit));
			want = pareto_floor(mo, want);
			if (n < want) {
				/* wait for devices with room, or start narrower now? */
				double t_free = next_free_time(run, nrun, fit, want);
				double wait_fin = t_free + r * mop_t(mo, want);
				double now_fin = n > 0 ? t + r * mop_t(mo, n) : HUGE_VAL;
				if (n == 0 || (now_fin > wait_fin && later > 0)) {
					blocked += n == 0 && later == 0;
					continue; /* wait; a smaller one may backfill */
				}
			}
			x.n = n;
			x.t1 = t + r * mop_t(mo, n);
			int fits = placer_choose(P, &x, devs);
			if (fits < 0) {
				rc = SP_EINTERNAL;
				goto cleanup;
			}
			if (fits < n) {
				blocked++; /* narrower means more samples each: no room */
				continue;
			}
			if ((rc = start_slice(P, &run[nrun++], &x, devs, N, 0)))
				goto cleanup;
			running[m] = 1;
			done[m] += r;
			free_dev -= n;
		}
		/* malleable tail: idle devices widen the slice that ends last */
		int any_waiting = 0;
		for (int m = 0; m < M && !any_waiting; m++)
			any_waiting = !running[m] && done[m] < pl->mops[m].n_layers &&
				      ready(pl, finished, m);
		while (!any_waiting && free_dev > 0) {
			int best = -1;
			for (int i = 0; i < nrun; i++)
				if (!run[i].homed && (best < 0 || run[i].t1 > run[best].t1))
					best = i;
			if (best < 0)
				break;
			run_t *x = &run[best];
			const metaop_t *mo = &pl->mops[x->m];
			double per = mop_t(mo, x->n);
			int split = x->lf + (int)ceil((t - x->t0) / per - 1e-9);
			split = SP_MAX(split, x->lf);
			if (split >= x->lt || !mo->scales)
				break;
			double ts = x->t0 + (split - x->lf) * per;
			/* extra devices: free now, with room for the rest of the slice */
			sslice_t ext = {x->m, split, x->lt, SP_MIN(mo->nmax, x->n + free_dev) - x->n,
					0, t, 0, 0, -1};
			if (ext.n <= 0)
				break;
			int fit = placer_fitting(P, &ext, NULL);
			ext.n = SP_MIN(ext.n, fit);
			int nn = x->n + ext.n;
			double fin = ts + (x->lt - split) * mop_t(mo, nn);
			if (ext.n <= 0 || fin >= x->t1 - 1e-9)
				break;
			ext.t1 = fin;
			if (placer_choose(P, &ext, devs) < 0)
				break;
			if (split > x->lf &&
			    (rc = sched_push_devs(out, x->m, x->lf, split, x->n, x->t0, ts, x->devs)))
				goto cleanup;
			/* the widened slice: old devices from ts, extra ones from now */
			memcpy(x->devs + x->n, devs, sizeof(int32_t) * (size_t)ext.n);
			sslice_t wide = {x->m, split, x->lt, nn, 0, ts, fin, 0, -1};
			devs_sort(x->devs, nn);
			placer_commit(P, &wide, x->devs);
			free_dev -= ext.n;
			x->lf = split;
			x->n = nn;
			x->t0 = ts;
			x->t1 = fin;
		}
		if (nrun == 0) {
			if (blocked)
				rc = sp_err_set(pl->err, SP_EINFEAS, NULL, 0, 0, NULL,
						"spindle schedule: no device has memory left for "
						"some MetaOp at %.3f ms",
						t);
			else
				rc = sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						"spindle schedule: nothing runnable at %.3f ms", t);
			goto cleanup;
		}
		/* advance to the next end */
		int e = 0;
		for (int i = 1; i < nrun; i++)
			if (run[i].t1 < run[e].t1)
				e = i;
		t = run[e].t1;
		for (int i = 0; i < nrun;) {
			if (run[i].t1 > t + 1e-12) {
				i++;
				continue;
			}
			run_t *x = &run[i];
			if ((rc = sched_push_devs(out, x->m, x->lf, x->lt, x->n, x->t0, x->t1, x->devs)))
				goto cleanup;
			running[x->m] = 0;
			if (x->lt == pl->mops[x->m].n_layers) {
				finished[x->m] = 1;
				n_fin++;
			}
			free(x->devs);
			run[i] = run[--nrun];
			run[nrun].devs = NULL;
		}
	}
cleanup:
	for (int i = 0; run && i < nrun; i++)
		free(run[i].devs);
	placer_free(P);
	homes_release(&H);
	free(bl);
	free(done);
	free(finished);
	free(running);
	free(order);
	free(run);
	free(devs);
	return rc;
}

/* ---- variant 5: lanes, with McNaughton's wrap-around rule ---- */

/*
 * Lanes. A lane is a chain of MetaOps from a source, followed while each
 * link is the only way out of one MetaOp and the only way into the next
 * (in CLIP-style workloads: input layer, encoder, projection). Lanes are
 * independent until they join, so they can share the devices as a fluid:
 * lane j gets the real width x_j = A_j(H) / H, A_j(H) its least device-time
 * to finish within H (the lower convex hull of its (time, device-time)
 * points: two widths mixed over its layers), with H the shortest horizon at
 * which sum_j x_j <= N (bisection). McNaughton's wrap-around rule makes the
 * fluid integral: lay the x_j end to end on [0, N); a lane owns the devices
 * wholly inside its interval for all of [0, H), and a device it shares with
 * a neighbour for its share of H, the earlier lane first. A lane's width
 * thus steps between at most three values and a device changes hands once
 * per neighbour. Lanes that share a component sit next to each other, so
 * its replicas span few nodes. Layers follow the windows: a layer runs on
 * the lane's devices free at its start, keeping a device whose window ends
 * during the layer only if at least half the layer fits (the next lane on
 * it starts later). MetaOps outside lanes (the joins) follow in
 * topological order, each at its allotted width on the devices free first.
 */
typedef struct {
	int first, n; /* its MetaOps: lm[first .. first + n) */
	hull_t hull;  /* of its time at each width */
	double tail;  /* bottom level after its last MetaOp */
	int key;      /* component of its heaviest MetaOp */
	int heavy;    /* that MetaOp */
	double x;     /* fluid width */
} lane_t;

typedef struct {
	double key;
	int id;
} dev_key_t;

/* By key, then id. */
static int cmp_dev_key(const void *a, const void *b)
{
	const dev_key_t *x = a, *y = b;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

/* Devices a MetaOp of a lane uses when the lane has n. */
static int lane_width(const metaop_t *mo, int n)
{
	return mo->scales ? pareto_floor(mo, SP_MIN(n, mo->nmax)) : 1;
}

static double lanes_need(const lane_t *ln, int nl, double H)
{
	double need = 0;
	for (int j = 0; j < nl; j++)
		need += hull_area(&ln[j].hull, H) / H;
	return need;
}

/* The slice of MetaOp m being built on one device set. */
typedef struct {
	int lf, n;
	double t0;
	int32_t *devs;
} pend_t;

static int pend_flush(sched_t *out, int m, pend_t *p, int lt, double t1)
{
	int rc = 0;
	if (p->n > 0 && lt > p->lf)
		rc = sched_push_devs(out, m, p->lf, lt, p->n, p->t0, t1, p->devs);
	p->n = 0;
	p->lf = lt;
	return rc;
}

/*
 * Mode 3: the gang's share in two steps. Shares end mid-layer, and a lane
 * whose heavy MetaOp mixes widths lo and hi far apart (16 and 32) can only
 * move whole layers between them: one layer more or less at hi is a large
 * step in its finish time. So the gang keeps all hi - lo devices for the
 * whole layers at hi that fit in the share (those before the heavy one
 * included, at the widths they take on hi devices), then the mid - lo of
 * them for one layer at a width mid in between: the width that saves most
 * time within the device-time left of the share. 0: no such width.
 */
static int mid_step(const planner_t *pl, const int *chain, int n, int heavy, int lo, int hi,
		    double share, double *step)
{
	const metaop_t *hv = &pl->mops[heavy];
	double pre = 0;
	for (int i = 0; i < n && chain[i] != heavy; i++)
		pre += pl->mops[chain[i]].n_layers * mop_t(&pl->mops[chain[i]],
							     lane_width(&pl->mops[chain[i]], hi));
	double per = mop_t(hv, hi);
	if (!hv->scales || share < pre || per <= 0)
		return 0;
	int whole = (int)floor((share - pre) / per + 1e-9);
	if (whole >= hv->n_layers)
		return 0;
	double left = (share - pre - whole * per) * (hi - lo);
	int best = 0;
	for (int k = lo + 1; k < hi; k++)
		if (k <= hv->nmax && faster_than_one_less(hv, k) && (k - lo) * mop_t(hv, k) <= left &&
		    (!best || mop_t(hv, k) < mop_t(hv, best)))
			best = k;
	*step = pre + whole * per;
	return best;
}

static int lanes_schedule(planner_t *pl, const int *w, int mode, int endgame, double cut,
			  const double *adj, double *lane_end, double *horizon, int *mids,
			  sched_t *out)
{
	int M = pl->n_mops, N = pl->N, rc = 0, nl = 0, nm = 0;
	lane_t *ln = calloc((size_t)M + 1, sizeof *ln);
	int *lm = malloc(sizeof(int) * (size_t)(M + 1));
	int *in_lane = calloc((size_t)M + 1, sizeof(int));
	int *ord = malloc(sizeof(int) * (size_t)(M + 1));
	double *time = malloc(sizeof(double) * (size_t)(N + 1));
	double *bl = malloc(sizeof(double) * (size_t)(M + 1));
	double *free_at = calloc((size_t)N + 1, sizeof(double));
	double *finish = calloc((size_t)M + 1, sizeof(double));
	double *ws = malloc(sizeof(double) * (size_t)(N + 2));
	double *we = malloc(sizeof(double) * (size_t)(N + 2));
	int *wd = malloc(sizeof(int) * (size_t)(N + 2));
	int *cand = malloc(sizeof(int) * (size_t)(N + 2));
	int32_t *devs = malloc(sizeof(int32_t) * (size_t)(N + 1));
	double *orph_from = malloc(sizeof(double) * (size_t)(N + 1));
	double *orph_to = malloc(sizeof(double) * (size_t)(N + 1));
	double *free_from = calloc((size_t)N + 1, sizeof(double));
	dev_key_t *byfree = malloc(sizeof *byfree * (size_t)(N + 1));
	/* end game, per lane: MetaOp (-1: none left), layer, time, remaining
	 * work, its last slice */
	int *eg_i = malloc(sizeof(int) * (size_t)(M + 1));
	int *comp_on = malloc(sizeof(int) * (size_t)(N + 1)); /* last lane's key */
	int *eg_layer = calloc((size_t)M + 1, sizeof(int));
	int *eg_last = malloc(sizeof(int) * (size_t)(M + 1));
	double *eg_t = calloc((size_t)M + 1, sizeof(double));
	double *eg_rem = calloc((size_t)M + 1, sizeof(double));
	pend_t pd = {0, 0, 0, malloc(sizeof(int32_t) * (size_t)(N + 1))};
	if (!ln || !lm || !in_lane || !ord || !time || !bl || !free_at || !finish || !ws ||
	    !we || !wd || !cand || !devs || !orph_from || !orph_to || !free_from || !byfree ||
	    !eg_i || !comp_on || !eg_layer || !eg_last || !eg_t || !eg_rem ||
	    !pd.devs) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int m = 0; m < M; m++)
		eg_i[m] = eg_last[m] = -1;
	for (int d = 0; d < N; d++)
		comp_on[d] = -1;
	blevels(pl, w, bl);
	for (int m = 0; m < M; m++) {
		if (pl->mops[m].n_pred)
			continue;
		lane_t *l = &ln[nl++];
		l->first = nm;
		double heavy = -1;
		for (int cur = m;;) {
			const metaop_t *mo = &pl->mops[cur];
			lm[nm++] = cur;
			in_lane[cur] = 1;
			l->n++;
			if (mo->n_layers * mop_t(mo, 1) > heavy) {
				int lay;
				heavy = mo->n_layers * mop_t(mo, 1);
				l->key = op_comp(pl, cur, 0, &lay);
				l->heavy = cur;
			}
			if (mo->n_succ != 1 || pl->mops[pl->edges[mo->succ[0]].dst].n_pred != 1)
				break;
			cur = pl->edges[mo->succ[0]].dst;
		}
		int last = lm[nm - 1];
		const metaop_t *lo = &pl->mops[last];
		l->tail = bl[last] - lo->n_layers * mop_t(lo, w[last]);
		for (int k = 1; k <= N; k++) {
			time[k] = 0;
			for (int i = l->first; i < nm; i++) {
				const metaop_t *mo = &pl->mops[lm[i]];
				time[k] += mo->n_layers * mop_t(mo, lane_width(mo, k));
			}
		}
		if ((rc = hull_from_times(time, N, 1, &l->hull)))
			goto cleanup;
	}
	/* the horizon: shortest H with sum of fluid widths <= N */
	double lo = 0, hi;
	for (int j = 0; j < nl; j++)
		lo = fmax(lo, ln[j].hull.t[0]);
	hi = fmax(lo, 1e-9);
	for (int it = 0; it < 200 && lanes_need(ln, nl, hi) > N; it++)
		hi *= 2;
	if (lanes_need(ln, nl, lo) <= N)
		hi = lo;
	for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; it++) {
		double mid = 0.5 * (lo + hi);
		if (lanes_need(ln, nl, mid) <= N)
			hi = mid;
		else
			lo = mid;
	}
	double H = hi, sum = 0;
	for (int j = 0; j < nl; j++) {
		ln[j].x = hull_area(&ln[j].hull, H) / H * adj[j];
		sum += ln[j].x;
		ord[j] = j;
	}
	for (int j = 0; j < nl && sum > 0; j++) /* corrections keep the total */
		ln[j].x *= N / sum;
	*horizon = H;
	/* layout order: by component, then widest first, then id */
	for (int a = 1; a < nl; a++)
		for (int b = a; b > 0; b--) {
			const lane_t *x = &ln[ord[b]], *y = &ln[ord[b - 1]];
			if (x->key > y->key || (x->key == y->key && x->x <= y->x))
				break;
			int s = ord[b];
			ord[b] = ord[b - 1];
			ord[b - 1] = s;
		}
	for (int d = 0; d < N; d++)
		orph_from[d] = orph_to[d] = -1;
	/* the layout, device by device: free_from[d] is where the lanes laid
	 * out so far leave device d (the earlier lane has its start) */
	int cur = 0;
	for (int oj = 0; oj < nl; oj++) {
		const lane_t *l = &ln[ord[oj]];
		double A = l->x * H;
		int nw = 0;
		while (cur < N && A > 1e-9 * H && free_from[cur] > 0) {
			/* the rest of a device the lane before began */
			double len = fmin(H - free_from[cur], A);
			wd[nw] = cur;
			ws[nw] = free_from[cur];
			we[nw++] = free_from[cur] + len;
			A -= len;
			free_from[cur] += len;
			if (free_from[cur] >= H * (1 - 1e-12))
				cur++;
		}
		if (cur < N && A > 1e-9 * H) {
			/* whole devices and a share of one more. When the two widths
			 * the lane's hull mixes at H are further apart (the local
			 * batch ceil(B/n) does not shrink in between), it gets lo
			 * whole devices and hi - lo devices for an equal share
			 * each instead */
			const hull_t *hl = &l->hull;
			const metaop_t *hv = &pl->mops[l->heavy];
			int held = 0, k = (int)floor(A / H + 1e-12), lo = 0, hi = 0;
			for (int q = 0; q < nw; q++)
				held += we[q] >= H * (1 - 1e-12);
			if (mode == 0 || mode == 3) { /* the hull's two widths at H */
				for (int q = 0; q + 1 < hl->n; q++)
					if (hl->t[q] <= H && H < hl->t[q + 1]) {
						hi = (int)lround(hl->a[q] / hl->t[q]);
						lo = (int)lround(hl->a[q + 1] / hl->t[q + 1]);
					}
			} else if (mode == 1 && hv->scales && held + k > 1 && held + k <= hv->nmax) {
				/* the widths that gain around the one left after the share */
				lo = pareto_floor(hv, held + k);
				hi = held + k + 1;
				while (hi <= hv->nmax && !faster_than_one_less(hv, hi))
					hi++;
			}
			int whole = k, gang = 0;
			if (hi - lo >= 2 && lo >= held && A - (lo - held) * H <= (hi - lo) * H &&
			    A > (lo - held) * H && cur + (hi - held) <= N) {
				whole = lo - held;
				gang = hi - lo;
			}
			for (int q = 0; q < whole && cur < N; q++) {
				wd[nw] = cur;
				ws[nw] = 0;
				we[nw++] = H;
				free_from[cur++] = H;
				A -= H;
			}
			double share = gang ? A / gang : A, step = share;
			int mid = 0;
			if (mode == 3 && gang)
				*mids += (mid = mid_step(pl, lm + l->first, l->n, l->heavy, lo, hi, share,
							 &step)) > 0;
			int first = cur;
			for (int q = 0; q < SP_MAX(gang, 1) && cur < N && share > 1e-9 * H; q++) {
				double len = fmin(mid ? step + (q < mid - lo) * mop_t(hv, mid) : share, H);
				wd[nw] = cur;
				ws[nw] = 0;
				we[nw++] = len;
				free_from[cur++] = len;
			}
			cur = SP_MIN(first, N); /* the next lane has the rest of these */
			while (cur < N && free_from[cur] >= H * (1 - 1e-12))
				cur++;
		}
		/* windows lanes before left unused (a width between two fast ones
		 * saves nothing): this lane may have them */
		for (int d = 0; d < N; d++) {
			if (orph_to[d] < 0)
				continue;
			int k = 0;
			while (k < nw && wd[k] != d)
				k++;
			if (k < nw) {
				if (orph_to[d] >= ws[k] - 1e-9)
					ws[k] = fmin(ws[k], orph_from[d]);
				continue;
			}
			wd[nw] = d;
			ws[nw] = orph_from[d];
			we[nw++] = orph_to[d];
		}
		if (nw == 0) { /* rounding left it no room: the last device */
			wd[nw] = N - 1;
			ws[nw] = 0;
			we[nw++] = H;
		}
		double t = 0;
		for (int i = l->first; i < l->first + l->n; i++) {
			int m = lm[i];
			const metaop_t *mo = &pl->mops[m];
			pd.n = 0;
			pd.lf = 0;
			for (int layer = 0; layer < mo->n_layers;) {
				int nc = 0;
				double next = HUGE_VAL;
				for (int k = 0; k < nw; k++) {
					double from = fmax(ws[k], free_at[wd[k]]);
					if (from <= t + 1e-9 && t < we[k] - 1e-9)
						cand[nc++] = k;
					else if (from > t + 1e-9 && from < we[k] - 1e-9)
						next = fmin(next, from);
				}
				if (nc == 0 && next < HUGE_VAL) {
					if ((rc = pend_flush(out, m, &pd, layer, t)))
						goto cleanup;
					t = next;
					continue;
				}
				if (endgame && (nc == 0 || t >= cut * H)) {
					/* every window is over, or the end game begins: it has
					 * the rest */
					if ((rc = pend_flush(out, m, &pd, layer, t)))
						goto cleanup;
					eg_i[ord[oj]] = i - l->first;
					eg_layer[ord[oj]] = layer;
					eg_t[ord[oj]] = t;
					goto lane_stop;
				}
				if (nc == 0) {
					/* every window is over: run on where no lane follows
					 * (windows to the horizon), else on the last to end */
					double last = 0, first = HUGE_VAL;
					for (int q = 0; q < nw; q++)
						last = fmax(last, we[q]);
					for (int q = 0; q < nw; q++)
						if (we[q] >= fmin(last, H) - 1e-9)
							first = fmin(first, fmax(ws[q], free_at[wd[q]]));
					if (first > t + 1e-9 &&
					    (rc = pend_flush(out, m, &pd, layer, t)))
						goto cleanup;
					t = fmax(t, first);
					for (int q = 0; q < nw; q++)
						if (we[q] >= fmin(last, H) - 1e-9 &&
						    fmax(ws[q], free_at[wd[q]]) <= t + 1e-9)
							cand[nc++] = q;
				}
				/* longest windows first */
				for (int a2 = 1; a2 < nc; a2++)
					for (int b2 = a2; b2 > 0 && we[cand[b2]] > we[cand[b2 - 1]]; b2--) {
						int s = cand[b2];
						cand[b2] = cand[b2 - 1];
						cand[b2 - 1] = s;
					}
				int r = mo->sink ? mo->n_layers - layer : 1, n = nc, k;
				for (;;) {
					k = lane_width(mo, n);
					double dur = r * mop_t(mo, k);
					/* a window to the horizon has no lane after it */
					double left = we[cand[k - 1]] - t;
					if (k > 1 && we[cand[k - 1]] < H - 1e-9 && left < 0.5 * dur)
						n = k - 1;
					else
						break;
				}
				for (int q = 0; q < k; q++)
					devs[q] = wd[cand[q]];
				devs_sort(devs, k);
				if (pd.n != k || memcmp(pd.devs, devs, sizeof(int32_t) * (size_t)k)) {
					if ((rc = pend_flush(out, m, &pd, layer, t)))
						goto cleanup;
					pd.n = k;
					pd.lf = layer;
					pd.t0 = t;
					memcpy(pd.devs, devs, sizeof(int32_t) * (size_t)k);
				}
				t += r * mop_t(mo, k);
				for (int q = 0; q < k; q++) {
					free_at[devs[q]] = t;
					comp_on[devs[q]] = l->key;
				}
				layer += r;
			}
			if ((rc = pend_flush(out, m, &pd, mo->n_layers, t)))
				goto cleanup;
			finish[m] = t;
		}
		lane_end[ord[oj]] = t + l->tail;
	lane_stop:
		for (int k = 0; k < nw; k++) {
			int d = wd[k];
			double from = fmax(ws[k], free_at[d]);
			orph_from[d] = orph_to[d] = -1;
			if (from < we[k] - 1e-9) {
				orph_from[d] = from;
				orph_to[d] = we[k];
			}
		}
	}
	/* the end game: lanes that outran their windows go on, the one that
	 * can start first next, on the devices free then, at most its share
	 * of the cluster by remaining work (single-device time) */
	for (;;) {
		int j = -1;
		double tot = 0;
		for (int q = 0; q < nl; q++) {
			if (eg_i[q] < 0)
				continue;
			eg_rem[q] = 0;
			for (int i = eg_i[q]; i < ln[q].n; i++) {
				const metaop_t *mo = &pl->mops[lm[ln[q].first + i]];
				eg_rem[q] += (mo->n_layers - (i == eg_i[q] ? eg_layer[q] : 0)) * mop_t(mo, 1);
			}
			tot += eg_rem[q];
			if (j < 0 || eg_t[q] < eg_t[j] - 1e-9 ||
			    (eg_t[q] < eg_t[j] + 1e-9 && eg_rem[q] > eg_rem[j]))
				j = q;
		}
		if (j < 0)
			break;
		int m = lm[ln[j].first + eg_i[j]], layer = eg_layer[j];
		const metaop_t *mo = &pl->mops[m];
		double t = eg_t[j], soonest = HUGE_VAL;
		int na = 0;
		/* only devices that last ran the lane's component (fewer new
		 * replicas to synchronise), the most recently freed first */
		int own = 0;
		for (int d = 0; d < N; d++)
			own += comp_on[d] == ln[j].key;
		for (int d = 0; d < N; d++) {
			if (own && comp_on[d] != ln[j].key)
				continue;
			if (free_at[d] <= t + 1e-9)
				byfree[na++] = (dev_key_t){-free_at[d], d};
			else
				soonest = fmin(soonest, free_at[d]);
		}
		if (na == 0) {
			eg_t[j] = soonest;
			continue;
		}
		qsort(byfree, (size_t)na, sizeof *byfree, cmp_dev_key);
		int cap = SP_MAX(1, (int)ceil(N * eg_rem[j] / tot - 1e-9));
		int k = lane_width(mo, SP_MIN(na, cap)), r = mo->sink ? mo->n_layers - layer : 1;
		for (int q = 0; q < k; q++)
			devs[q] = byfree[q].id;
		devs_sort(devs, k);
		double t1 = t + r * mop_t(mo, k);
		sslice_t *last = eg_last[j] >= 0 ? &out->s[eg_last[j]] : NULL;
		if (last && last->metaop == m && last->lt == layer && last->n == k &&
		    fabs(last->t1 - t) < 1e-9 &&
		    !memcmp(out->devs + last->dev_off, devs, sizeof(int32_t) * (size_t)k)) {
			last->lt += r;
			last->t1 = t1;
		} else {
			if ((rc = sched_push_devs(out, m, layer, layer + r, k, t, t1, devs)))
				goto cleanup;
			eg_last[j] = out->n - 1;
		}
		for (int q = 0; q < k; q++) {
			free_at[devs[q]] = t1;
			comp_on[devs[q]] = ln[j].key;
		}
		eg_t[j] = t1;
		eg_layer[j] += r;
		if (eg_layer[j] == mo->n_layers) {
			finish[m] = t1;
			eg_layer[j] = 0;
			if (++eg_i[j] == ln[j].n) {
				eg_i[j] = -1;
				lane_end[j] = t1 + ln[j].tail;
			}
		}
	}
	/* the rest, in topological order, on the devices free first */
	for (int q = 0; q < M; q++) {
		int m = pl->topo[q];
		const metaop_t *mo = &pl->mops[m];
		if (in_lane[m])
			continue;
		double ready = 0;
		for (int p = 0; p < mo->n_pred; p++)
			ready = fmax(ready, finish[pl->edges[mo->pred[p]].src]);
		int k = lane_width(mo, w[m]);
		for (int d = 0; d < N; d++)
			byfree[d] = (dev_key_t){fmax(free_at[d], ready), d};
		qsort(byfree, (size_t)N, sizeof *byfree, cmp_dev_key);
		for (int d = 0; d < N; d++)
			cand[d] = byfree[d].id;
		double t0 = ready;
		for (int i = 0; i < k; i++) {
			devs[i] = cand[i];
			t0 = fmax(t0, free_at[cand[i]]);
		}
		devs_sort(devs, k);
		double t1 = t0 + mo->n_layers * mop_t(mo, k);
		if ((rc = sched_push_devs(out, m, 0, mo->n_layers, k, t0, t1, devs)))
			goto cleanup;
		for (int i = 0; i < k; i++)
			free_at[devs[i]] = t1;
		finish[m] = t1;
	}
cleanup:
	for (int j = 0; ln && j < nl; j++)
		hull_release(&ln[j].hull);
	free(ln);
	free(lm);
	free(in_lane);
	free(ord);
	free(time);
	free(bl);
	free(free_at);
	free(finish);
	free(ws);
	free(we);
	free(wd);
	free(cand);
	free(devs);
	free(orph_from);
	free(orph_to);
	free(free_from);
	free(byfree);
	free(eg_i);
	free(comp_on);
	free(eg_layer);
	free(eg_last);
	free(eg_t);
	free(eg_rem);
	free(pd.devs);
	return rc;
}

/*
 * Lanes with each way of splitting a lane's last devices in modes
 * [m0, m0 + nm) (0: the hull's two widths; 1: the two nearest widths that
 * gain; 2: McNaughton's one shared device; 3: the hull's widths with a
 * middle step), each calibrated a few rounds: layers are whole and widths
 * integral, so a lane ends a little before or after H; the next round
 * gives each lane (1 + its lateness / H) times its width, all rescaled to
 * N. The shortest schedule wins. *mids counts the middle steps taken.
 */
#define LANE_ROUNDS 3
static int lanes_best(planner_t *pl, const int *w, int endgame, int m0, int nm, int rounds,
		      int *mids, sched_t *out)
{
	int nl = 0, rc = 0;
	for (int m = 0; m < pl->n_mops; m++)
		nl += pl->mops[m].n_pred == 0;
	double *adj = malloc(sizeof(double) * (size_t)(nl + 1));
	double *end = malloc(sizeof(double) * (size_t)(nl + 1));
	sched_t best = *out;
	double best_ms = HUGE_VAL;
	if (!adj || !end) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	static const double cuts[] = {1.0, 0.94, 0.97, 0.9};
	/* big clusters: fewer tries (each costs more there) */
	int n_cuts = endgame ? (pl->N > 256 ? 2 : 4) : 1;
	if (pl->N > 256)
		rounds = 1;
	for (int mode = 0; mode < nm * n_cuts; mode++) {
		for (int j = 0; j < nl; j++)
			adj[j] = 1;
		for (int round = 0; round < rounds; round++) {
			sched_t t = *out;
			double H = 0, ms = 0;
			if ((rc = lanes_schedule(pl, w, m0 + mode % nm, endgame, cuts[mode / nm],
						 adj, end, &H, mids, &t))) {
				sched_release(&t);
				goto cleanup;
			}
			for (int i = 0; i < t.n; i++)
				ms = fmax(ms, t.s[i].t1);
			if (ms < best_ms * (1 - 1e-9)) {
				if (best_ms < HUGE_VAL)
					sched_release(&best);
				best = t;
				best_ms = ms;
			} else {
				sched_release(&t);
			}
			for (int j = 0; j < nl && H > 0; j++)
				adj[j] *= fmax(0.5, fmin(2.0, 1 + (end[j] - H) / H));
		}
	}
cleanup:
	free(adj);
	free(end);
	if (rc) {
		if (best_ms < HUGE_VAL)
			sched_release(&best);
		return rc;
	}
	*out = best;
	return 0;
}

/*
 * Phase 1b, local search on the widths. The list schedule's nominal
 * makespan is what the simulator measures for its compute (it replays the
 * same cost model), so widths can be tuned on it cheaply: for each MetaOp,
 * by decreasing work, try half, double, -1 and +1 its width and keep a
 * change when the whole schedule gets shorter. A fixed budget of trial
 * schedules (more on small clusters, where each is cheap) keeps it bounded
 * and deterministic.
 */
/* The list schedule's makespan for widths w (HUGE_VAL if it finds none in
 * memory). */
static int makespan(planner_t *pl, const int *w, double frac, double *out)
{
	sched_t t;
	memset(&t, 0, sizeof t);
	int rc = list_schedule(pl, w, frac, &t);
	*out = HUGE_VAL;
	if (rc == 0) {
		*out = 0;
		for (int i = 0; i < t.n; i++)
			*out = fmax(*out, t.s[i].t1);
	} else if (rc == SP_EINFEAS) {
		memset(pl->err, 0, sizeof *pl->err);
		rc = 0;
	}
	sched_release(&t);
	return rc;
}

static int allot_search(planner_t *pl, int *w, double frac)
{
	int M = pl->n_mops, rc = 0, budget = SP_MAX(12, 3000 / pl->N);
	int *order = malloc(sizeof(int) * (size_t)(M + 1));
	double *work = malloc(sizeof(double) * (size_t)(M + 1));
	if (!order || !work) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	double best;
	if ((rc = makespan(pl, w, frac, &best)) || best == HUGE_VAL)
		goto cleanup;
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
	for (int pass = 0; pass < 2 && budget > 0; pass++)
		for (int oi = 0; oi < M && budget > 0; oi++) {
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
				if ((rc = makespan(pl, w, frac, &ms)))
					goto cleanup;
				if (ms < best * (1 - 1e-6))
					best = ms;
				else
					w[m] = keep;
			}
		}
cleanup:
	free(order);
	free(work);
	return rc;
}

int sched_spindle_variant(planner_t *pl, int variant, sched_t *out)
{
	/* variant: 0 MILP widths; 1 separable widths; 2 paper's waves over the
	 * whole DAG; 3, 4 MILP widths with smaller memory segments; 5, 6 lanes
	 * without and with the end game; 7 lanes with middle steps; 8 data
	 * parallel on all devices (the sequential plan: when it is best, ours
	 * is that) */
	static const double frac[SPINDLE_VARIANTS] = {0.7, 0.7, 0, 0.4, 0.2, 0, 0, 0, 0};
	int M = pl->n_mops, rc = 0;
	if (variant == 2)
		return sched_paper_dag(pl, out);
	if (variant == SPINDLE_VARIANTS - 1)
		return sched_sequential(pl, out);
	int **cache = variant == 1 ? &pl->allot_sep : &pl->allot_milp;
	if (!*cache) {
		/* the allotment is the same for every variant using it: once per run */
		int *w = sp_arena_calloc(&pl->arena, (size_t)M + 1, sizeof(int));
		if (!w)
			return SP_ENOMEM;
		if ((rc = allot_separable(pl, w)) || (variant != 1 && (rc = allot_milp(pl, w))) ||
		    (variant != 1 && (rc = allot_search(pl, w, frac[0]))))
			return rc;
		*cache = w;
	}
	const int *w = *cache;
	if (variant == 1 && pl->allot_milp &&
	    !memcmp(pl->allot_milp, pl->allot_sep, sizeof(int) * (size_t)M))
		return SP_EINFEAS; /* the same widths as variant 0: nothing new */
	int mids = 0;
	if (variant == 5 || variant == 6)
		return lanes_best(pl, w, variant == 6, 0, 3, LANE_ROUNDS, &mids, out);
	if (variant == 7) {
		/* middle steps move lanes more per round: more rounds. Above 256
		 * devices there is one round, and steps rarely pay */
		if (pl->N > 256)
			return SP_EINFEAS;
		rc = lanes_best(pl, w, 1, 3, 1, LANE_ROUNDS + 2, &mids, out);
		return rc ? rc : mids ? 0 : SP_EINFEAS; /* no step anywhere: nothing new */
	}
	return list_schedule(pl, w, frac[variant], out);
}
