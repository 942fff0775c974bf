/*
 * sched_spindle.c — our scheduler. Two phases, over the whole MetaOp DAG
 * (no level barriers: a MetaOp is ready as soon as its inputs are done):
 *
 * Phase 1, allotment (GLPK MILP). Choose one width k_m per MetaOp from a
 * candidate set K_m (every valid count up to 16, then a x1.5/x2 grid and
 * nmax) minimising C, the larger of the area and critical-path bounds of
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
 * off, a time limit; the separable solution (each MetaOp's cheapest width
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
 * Variants (plan.c evaluates each with the simulator and keeps the fastest
 * that fits memory):
 *   0  MILP widths, list scheduling with tails, segments within 70% of memory
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
		c = step % 2 ? c * 4 / 3 : c * 3 / 2; /* 24 32 48 64 96 128 ... */
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
	parm.tm_lim = pl->opts->milp_time_ms > 0 ? pl->opts->milp_time_ms : 2000;
	parm.mip_gap = 1e-3;
	int ret = glp_intopt(lp, &parm);
	int st = glp_mip_status(lp);
	if ((ret == 0 || ret == GLP_ETMLIM) && (st == GLP_OPT || st == GLP_FEAS)) {
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
} run_t;

/* When at least want devices are free, if running slices end as planned. */
static double next_free_time(const run_t *run, int nrun, int have, int want)
{
	char used[512] = {0};
	for (int it = 0; it < nrun && it < 512 && have < want; it++) {
		int e = -1;
		for (int i = 0; i < nrun && i < 512; i++)
			if (!used[i] && (e < 0 || run[i].t1 < run[e].t1))
				e = i;
		if (e < 0)
			break;
		used[e] = 1;
		have += run[e].n;
		if (have >= want)
			return run[e].t1;
	}
	return HUGE_VAL;
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

static int list_schedule(planner_t *pl, const int *w, double frac, sched_t *out)
{
	int M = pl->n_mops, rc = 0;
	double *bl = malloc(sizeof(double) * (size_t)(M + 1));
	int *done = calloc((size_t)M + 1, sizeof(int));	 /* layers scheduled */
	int *finished = calloc((size_t)M + 1, sizeof(int)); /* all layers ended */
	int *running = calloc((size_t)M + 1, sizeof(int));
	int *order = malloc(sizeof(int) * (size_t)(M + 1));
	run_t *run = malloc(sizeof(run_t) * (size_t)(M + 1));
	if (!bl || !done || !finished || !running || !order || !run) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	blevels(pl, w, bl);
	for (int m = 0; m < M; m++)
		order[m] = m;
	/* priority: bottom level, then more work, then id */
	for (int a = 1; a < M; a++)
		for (int b = a; b > 0; b--) {
			int x = order[b], y = order[b - 1];
			if (bl[x] < bl[y] || (bl[x] == bl[y] && x > y))
				break;
			order[b] = y;
			order[b - 1] = x;
		}
	int nrun = 0, free_dev = pl->N, n_fin = 0;
	double t = 0;
	while (n_fin < M) {
		/* start ready MetaOps */
		for (int oi = 0; oi < M && free_dev > 0; oi++) {
			int m = order[oi];
			const metaop_t *mo = &pl->mops[m];
			if (running[m] || done[m] == mo->n_layers)
				continue;
			int ready = 1;
			for (int q = 0; q < mo->n_pred && ready; q++)
				ready = finished[pl->edges[mo->pred[q]].src];
			if (!ready)
				continue;
			int want = SP_MIN(w[m], mo->nmax), n = want;
			int r = SP_MIN(mo->n_layers - done[m], max_layers(pl, w, m, want, frac));
			if (want > free_dev) {
				/* wait for enough devices, or start narrower now? */
				double t_free = next_free_time(run, nrun, free_dev, want);
				double wait_fin = t_free + r * mop_t(mo, want);
				double now_fin = t + r * mop_t(mo, free_dev);
				if (now_fin > wait_fin)
					continue; /* wait; a smaller one may backfill */
				n = free_dev;
			}
			run[nrun++] = (run_t){m, done[m], done[m] + r, n, t, t + r * mop_t(mo, n)};
			running[m] = 1;
			done[m] += r;
			free_dev -= n;
		}
		/* malleable tail: idle devices widen the slice that ends last */
		if (free_dev > 0) {
			int any_waiting = 0;
			for (int m = 0; m < M && !any_waiting; m++) {
				const metaop_t *mo = &pl->mops[m];
				if (running[m] || done[m] == mo->n_layers)
					continue;
				int ready = 1;
				for (int q = 0; q < mo->n_pred && ready; q++)
					ready = finished[pl->edges[mo->pred[q]].src];
				any_waiting = ready;
			}
			while (!any_waiting && free_dev > 0) {
				int best = -1;
				for (int i = 0; i < nrun; i++)
					if (best < 0 || run[i].t1 > run[best].t1)
						best = i;
				if (best < 0)
					break;
				run_t *x = &run[best];
				const metaop_t *mo = &pl->mops[x->m];
				int nn = SP_MIN(mo->nmax, x->n + free_dev);
				if (nn <= x->n || !mo->scales)
					break;
				double per = mop_t(mo, x->n);
				int split = x->lf + (int)ceil((t - x->t0) / per - 1e-9);
				split = SP_MAX(split, x->lf);
				if (split >= x->lt)
					break;
				double ts = x->t0 + (split - x->lf) * per;
				double fin = ts + (x->lt - split) * mop_t(mo, nn);
				if (fin >= x->t1 - 1e-9)
					break;
				if (split > x->lf) {
					if ((rc = sched_push(out, x->m, x->lf, split, x->n, 0, x->t0, ts)))
						goto cleanup;
				}
				free_dev -= nn - x->n;
				*x = (run_t){x->m, split, x->lt, nn, ts, fin};
			}
		}
		if (nrun == 0) {
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
			if ((rc = sched_push(out, x->m, x->lf, x->lt, x->n, 0, x->t0, x->t1)))
				goto cleanup;
			free_dev += x->n;
			running[x->m] = 0;
			if (x->lt == pl->mops[x->m].n_layers) {
				finished[x->m] = 1;
				n_fin++;
			}
			run[i] = run[--nrun];
		}
	}
cleanup:
	free(bl);
	free(done);
	free(finished);
	free(running);
	free(order);
	free(run);
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
	int *w = malloc(sizeof(int) * (size_t)(M + 1));
	if (!w)
		return SP_ENOMEM;
	if ((rc = allot_separable(pl, w)))
		goto cleanup;
	if (variant != 1 && (rc = allot_milp(pl, w)))
		goto cleanup;
	rc = list_schedule(pl, w, frac[variant], out);
cleanup:
	free(w);
	return rc;
}
