/*
 * sched_spindle.c — our scheduler. Two phases, over the whole MetaOp DAG
 * (no level barriers: a MetaOp is ready as soon as its inputs are done):
 *
 * Phase 1, allotment (GLPK MILP). Choose one width k_m per MetaOp from a
 * candidate set K_m (every valid count up to 16, then 24, 36, 48, 72, 96,
 * ... alternately x1.5 and x4/3, and nmax) minimising C, the larger of the area and critical-path bounds of
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
 *   5  data parallel on all devices: when nothing beats it, we use it
 */
#include "planner.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CAND 48

static int candidates(const metaop_t *m, int N, int *k)
{
	int n = 0, lim = SP_MIN(N, m->nmax);
	if (!m->scales) {
		k[n++] = 1;
		return n;
	}
	for (int c = 1; c <= SP_MIN(lim, 16); c++)
		k[n++] = c;
	for (int c = 24, step = 0; c < lim && n < MAX_CAND - 1; step++) {
		k[n++] = c;
		c = step % 2 ? c * 4 / 3 : c * 3 / 2; /* 24 36 48 72 96 144 ... */
	}
	if (lim > 16 && k[n - 1] != lim)
		k[n++] = lim;
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
			int n = SP_MIN(want, fit);
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
	 * whole DAG; 3, 4 MILP widths with smaller memory segments; 5 data
	 * parallel on all devices (the sequential plan: when it is best, ours
	 * is that) */
	static const double frac[SPINDLE_VARIANTS] = {0.7, 0.7, 0, 0.4, 0.2, 0};
	int M = pl->n_mops, rc = 0;
	if (variant == 2)
		return sched_paper_dag(pl, out);
	if (variant == 5)
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
	return list_schedule(pl, w, frac[variant], out);
}
