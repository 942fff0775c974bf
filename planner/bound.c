/*
 * bound.c — lower bounds on the compute time of one iteration (forward and
 * backward of every layer), for the plan's certificate:
 *
 *  Configurations. The bounds below are not read off the cost tables
 *  (the active set prices one degree per width, the one the schedulers
 *  plan with) but off every configuration a slice of MetaOp m can run a
 *  layer in, in any plan of these options (bound_points): n = d t
 *  devices, t a degree the tp assignment can leave it at (1 always: a
 *  class that cannot all run a degree, tp_run's fall-backs; under --tp F
 *  also F, whether or not F divides gpus_per_node; under auto the
 *  divisors of gpus_per_node, bound_degrees), d <= B data-parallel
 *  groups, sequence parallel or not as --sp allows (off: never; on:
 *  wherever sp_ok; auto: either). Group i holds b_i samples (sample_range:
 *  floor or ceil of B / d) and each of its t members takes T_i =
 *  cost_layer_sp(b_i, t, sp) for the layer's forward and backward, what
 *  sim_compute charges it (recompute, zero-3 gathers only add; a member
 *  with fewer samples moves on early, so the width's device-time is less
 *  than n times the larger group's time). Configuration c of a layer has
 *      device-time a_c = t sum_i T_i,   time tau_c = T_{d-1},
 *  the time of the last group, [floor(B (d - 1) / d), B): it holds
 *  ceil(B / d) samples, and sample B - 1 whatever d is. A MetaOp that does
 *  not scale prices the whole batch on any width: one configuration,
 *  a_c = tau_c = T(B) (wider only adds device-time).
 *  Why a MetaOp of L layers run in configurations c_1..c_L spans at least
 *  S' = sum_l tau_{c_l}: sample B - 1 goes through the forward of layer
 *  1..L and then the backward of layer L..1, each step after the one
 *  before it, each on the group of c_l that holds it, the last, a whole
 *  block of T_{d-1}. (Any fixed sample would do; the last one is in a
 *  largest group of every configuration. A "largest group" per layer
 *  without a fixed sample would not: slices of one MetaOp at different d
 *  could put different samples in their larger groups.) Its devices are
 *  busy for D = sum_l a_{c_l}. Along a DAG path sample B - 1 of the same
 *  task flows (edges join MetaOps of one task), so the path's spans add.
 *
 *  area      sum_m L_m min_c a_c / N: the device-time every MetaOp needs
 *            in its most efficient configuration, spread perfectly.
 *  critical  the longest DAG path with every MetaOp at L_m min_c tau_c.
 *  allotment the smallest C at which every MetaOp can run within C (each
 *            alone) and all of them fit the devices' area N C: a MetaOp
 *            meeting a span C needs at least the area A_m(C) of the lower
 *            convex hull of its points (L tau_c, L a_c) at C (layers may
 *            mix configurations); sum_m A_m(C) <= N C. It dominates the
 *            area bound and is what a wide MetaOp on the critical path
 *            really costs. Why every compute schedule of C ms satisfies
 *            it: (S', D) above is the mean of the L points (L tau_{c_l},
 *            L a_{c_l}), so it lies in their convex hull, on or above its
 *            lower boundary, and S' <= C: D >= A_m(S') >= A_m(C), A_m
 *            being non-increasing. A device runs one slice at a time, so
 *            the MetaOps' D add up to at most N C. A_m non-increasing
 *            makes sum_m A_m(C) <= N C hold exactly from its least C on,
 *            which the bisection brackets; it returns the infeasible end,
 *            below that least C. tests/planner/properties.py checks it
 *            against every algorithm's simulated compute time, with
 *            forced degrees, --sp and uneven batches under a profile
 *            convex in the local batch among its cases.
 *  paper     the paper's relaxed optimum: per level, the C* at which all
 *            the level's MetaOps finish together with real-valued widths
 *            summing to N; levels add up. Its inverse of T is the authors'
 *            (sched_paper.c's paper_cstar: speed-up interpolated between
 *            batch-divisible counts; below one device a MetaOp
 *            time-shares it). Reported, not a lower bound of this model.
 *
 * Each is of one micro-step's MetaOps: those of the tasks active in
 * micro-step pl->micro (mop_active; every task in micro-step 0). The
 * micro-steps run one after another, so plan.c adds up the bounds of each
 * distinct set of active tasks times its micro-steps (K times micro-step
 * 0's when every task has K micro-batches).
 *
 * and, once the chosen plan is placed, a bound on its iteration:
 *
 *  comm      (bound_comm) max over nodes v of E_v / (K B_x): E_v the
 *            gradient bytes S_b (elems x dtype bytes) of every sync bucket b
 *            whose devices lie on v and on at least one other node, K B_x
 *            the node's NICs together (nics_per_node x inter_node_gbs).
 *            Whatever the collective, each element of v's gradient must
 *            leave v at least once (every other node's result depends on it
 *            and the map from it to their sum is invertible), so at least
 *            S_b bytes cross v's NICs each way; they cannot all have crossed
 *            before E_v / (K B_x). Valid for this placement under the
 *            cluster's link model, not for every plan (a placement that
 *            keeps a group inside one node has no such term); latencies and
 *            transfers between waves are left out, so it stays a bound.
 *            The report gives it beside the lower bound, not in it.
 *  comm_any  (bound_comm_any) a communication bound of every plan, part of
 *            the report's lower bound. Parameter group p (a component's
 *            layer) with S_p gradient bytes needs W_p = sum over the
 *            MetaOp layers using it of min_c a_c device-ms of compute
 *            (one micro-step's, so the bound stays below the iteration's
 *            work; a_c of the configurations above). A plan whose iteration takes T runs all of it on the
 *            devices holding p, so at least W_p / T of them, on at least
 *            m_p(T) = ceil(W_p / (G T)) nodes. When m_p >= 2 each of those
 *            nodes must carry S_p bytes over its NICs each way (the comm
 *            argument below, for any collective and any layout whose
 *            gathers run within the iteration), so the cluster's NICs carry
 *            at least E(T) = sum over p with m_p(T) >= 2 of m_p(T) S_p
 *            bytes each way, at most T x nodes x K B_x in T. E falls and
 *            the capacity rises with T: the bound is the least T with
 *            E(T) <= T nodes K B_x (bisection). It is weak where a group's
 *            work fits in a node or two (a plan may keep it there), strong
 *            where many nodes are needed for its work.
 *  sync      (bound_sync) max over devices d of sum over the sync buckets b
 *            that d belongs to of A_b, the time b's collective takes alone
 *            on the network: net_phases_ms of the very phases the
 *            simulator runs it as (net_allreduce_phases, or under zero-1
 *            net_half_phases' reduce-scatter, of elems x dtype bytes). In the simulator
 *            (fluid.c) a device takes part in one all-reduce at a time, and
 *            each phase of a job drains at a max-min fair rate x with
 *            x bytes_r / V <= cap_r on every link r it loads, so it takes
 *            at least max_r bytes_r / cap_r, and then its latency: a job
 *            lasts at least A_b, d's jobs one after another at least their
 *            sum, and d's STEP waits for them all (finish_steps), so no
 *            simulated iteration of this plan (sim_run: the full pass, plus
 *            k - 1 passes of non-negative length) ends sooner. any_layout:
 *            the least of both layouts per bucket, for a plan whose zero-1
 *            layouts may still change (layout_trial). With releases
 *            (sync_releases, a plan whose every micro-step runs every
 *            task): d's jobs also start no sooner than their releases R_b,
 *            so d's last ends no sooner than the greedy chain t = max(t,
 *            R_b) + A_b over its buckets by increasing R_b (for the jobs of
 *            any suffix of that order, the least R_b plus their A_b: the
 *            one-machine bound with release dates), which is at least the
 *            sum. The same chain per link r (a NIC or a GPU port, each
 *            direction): the bytes every phase of b's collective puts on
 *            r drain after R_b, and fluid.c's max-min sharing never loads
 *            r beyond its bandwidth, so r is busy at least bytes / bandwidth
 *            for b after R_b. gathers: a zero-1/2 bucket's all-gather after
 *            the step (finish_steps_net) is ready once every member updated
 *            it, after its reduce-scatter, runs on the same stream and
 *            links, and is waited for unless deferred: it joins b's time
 *            and bytes where the bucket does not defer it (and, with
 *            any_layout, where zero-1 taken later would not: set_layout's
 *            defer_for); layout_refine may defer any, so the refined bound
 *            leaves gathers out (walk.c refined_bound). It leaves out 1e-6
 *            of itself against the simulator's rounding. The walk (walk.c)
 *            uses it to skip simulating candidates that cannot win.
 */
#include "planner.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

double relaxed_n(const metaop_t *m, double layers, double C)
{
	if (layers <= 0)
		return 0;
	double t1 = layers * mop_t(m, 1);
	if (t1 <= C)
		return t1 / C;
	if (layers * mop_t(m, m->nmax) > C * (1 + 1e-12))
		return HUGE_VAL;
	int lo = 1, hi = m->nmax; /* L T(lo) > C >= L T(hi) */
	while (hi - lo > 1) {
		int mid = (lo + hi) / 2;
		if (layers * mop_t(m, mid) > C)
			lo = mid;
		else
			hi = mid;
	}
	double a = layers * mop_t(m, lo), b = layers * mop_t(m, hi);
	if (a <= b)
		return hi;
	return lo + (a - C) / (a - b);
}

double relaxed_cstar_by(const planner_t *pl, const int *mops, const double *rem, int k,
			double N, double *n_out, relaxed_inv_t inv)
{
	double lo = 0, hi = 0;
	for (int i = 0; i < k; i++) {
		const metaop_t *m = &pl->mops[mops[i]];
		lo = fmax(lo, rem[i] * mop_t(m, m->nmax));
		hi += rem[i] * mop_t(m, 1);
	}
	hi = fmax(hi, lo);
	double need = 0;
	for (int i = 0; i < k; i++)
		need += inv(&pl->mops[mops[i]], rem[i], lo);
	double C = lo;
	if (need > N) {
		for (int it = 0; it < 200 && hi - lo > 1e-9 * hi; it++) {
			double mid = 0.5 * (lo + hi), s = 0;
			for (int i = 0; i < k; i++)
				s += inv(&pl->mops[mops[i]], rem[i], mid);
			if (s > N)
				lo = mid;
			else
				hi = mid;
		}
		C = hi;
	}
	if (n_out)
		for (int i = 0; i < k; i++)
			n_out[i] = inv(&pl->mops[mops[i]], rem[i], C);
	return C;
}

double relaxed_cstar(const planner_t *pl, const int *mops, const double *rem, int k,
		     double N, double *n_out)
{
	return relaxed_cstar_by(pl, mops, rem, k, N, n_out, relaxed_n);
}

/* Lower convex hull of the points (time[k], k time[k]) for k = 1..nmax
 * (area time[k] alone if !scales), by time ascending. Times need not fall
 * monotonically with k (equal local batches, measured profiles), so the
 * points are sorted by time first and those that another point beats on
 * both time and area are dropped before the hull is taken. */
typedef struct {
	double t, a;
} hpt_t;

static int hpt_cmp(const void *x, const void *y)
{
	const hpt_t *p = x, *q = y;
	if (p->t != q->t)
		return p->t < q->t ? -1 : 1;
	return (p->a > q->a) - (p->a < q->a);
}

/* The lower hull of the np points pt (sorted here) into h->t and h->a
 * (np entries each). */
static void hull_pts(hpt_t *pt, int np, hull_t *h)
{
	h->n = 0;
	qsort(pt, (size_t)np, sizeof(hpt_t), hpt_cmp);
	for (int i = 0; i < np; i++) {
		double t = pt[i].t, a = pt[i].a;
		/* slower and no smaller: dominated (this covers equal times too) */
		if (h->n && a >= h->a[h->n - 1] * (1 - 1e-15))
			continue;
		if (h->n && t <= h->t[h->n - 1] + 1e-15)
			h->n--; /* same time, less area: replaces the last point */
		while (h->n >= 2) {
			/* drop the last point if it lies on or above the segment
			 * from the one before it to the new one */
			double t1 = h->t[h->n - 2], a1 = h->a[h->n - 2];
			double t2 = h->t[h->n - 1], a2 = h->a[h->n - 1];
			if ((a2 - a1) * (t - t1) >= (a - a1) * (t2 - t1))
				h->n--;
			else
				break;
		}
		h->t[h->n] = t;
		h->a[h->n++] = a;
	}
}

/* The hull of the points into h->t and h->a (nmax + 1 entries each),
 * sorting them in pt (as many). */
static void hull_fill(const double *time, int nmax, int scales, hpt_t *pt, hull_t *h)
{
	for (int k = 1; k <= nmax; k++)
		pt[k - 1] = (hpt_t){time[k], time[k] * (scales ? k : 1)};
	hull_pts(pt, nmax, h);
}

int hull_from_times(sp_arena_t *a, const double *time, int nmax, int scales, hull_t *h)
{
	h->n = 0;
	h->t = sp_arena_calloc(a, (size_t)nmax + 1, sizeof(double));
	h->a = sp_arena_calloc(a, (size_t)nmax + 1, sizeof(double));
	hpt_t *pt = sp_arena_calloc(a, (size_t)nmax + 1, sizeof(hpt_t));
	if (!h->t || !h->a || !pt)
		return SP_ENOMEM;
	hull_fill(time, nmax, scales, pt, h);
	return 0;
}

/*
 * The degrees a slice of MetaOp m can run at in any plan of these options
 * (ascending, returns how many): 1, and where m splits (pl_tp_ok with
 * --tp-vocab's rule, not the active table set's) under --tp F only F
 * (tp_assign's pick, even where F does not divide gpus_per_node), under
 * --tp auto the divisors of gpus_per_node (cost.c's tp_degrees: an
 * embedding only when forced), up to N.
 */
static int bound_degrees(const planner_t *pl, const metaop_t *m, int out[SP_TP_MAX + 1])
{
	int F = pl->opts ? pl->opts->tp : 0, G = pl->cluster->gpus_per_node, k = 0;
	int vw = pl->opts && pl->opts->tp_vocab_whole;
	out[k++] = 1;
	if (!m->scales || F == 1 || (m->shape.type == COMP_EMBEDDING && F <= 1))
		return k;
	for (int t = 2; t <= SP_MIN(pl->N, SP_TP_MAX); t++)
		if ((F > 1 ? t == F : G % t == 0) && shape_tp_ok(&m->shape, t) &&
		    (m->shape.type == COMP_TRANSFORMER || !vw))
			out[k++] = t;
	return k;
}

/* Per-layer fwd + bwd ms of a group of t (sequence parallel: sp) holding
 * `local` samples of MetaOp mi, memoised in row (local + 1 entries, < 0:
 * not yet priced). */
static double group_ms(const planner_t *pl, int mi, int64_t local, int t, int sp, double *row)
{
	if (row[local] < 0) {
		double f, b;
		cost_layer_sp(pl, mi, local, t, sp, &f, &b);
		row[local] = f + b;
	}
	return row[local];
}

/*
 * Every configuration a layer of MetaOp mi can run in, as per-layer points
 * (time, device-time) into *pt (in a; *np of them): a slice of n = d t
 * devices, t from bound_degrees, d <= B data-parallel groups, with and
 * without sequence parallelism as --sp allows (off: without; on: with,
 * cost.c falling back where sp_ok refuses; auto: both). Group i holds the
 * b_i samples of sample_range (floor or ceil of B / d) and its t members
 * each take T_i = cost_layer_sp(b_i, t, sp), exactly what sim_compute
 * charges a member for the layer (recompute and gathers only add), so
 * the configuration's device-time is t sum_i T_i and its time that of
 * the last group, which holds ceil(B / d) samples, sample B - 1 among
 * them (bound.c's header: why a span is at least that). One that does not
 * scale: the single point (T(B), T(B)) (cost_layer prices the whole batch
 * on any width; more devices only add device-time).
 */
static int bound_points(planner_t *pl, int mi, sp_arena_t *a, hpt_t **pt, int *np)
{
	const metaop_t *m = &pl->mops[mi];
	int64_t B = m->batch;
	int deg[SP_TP_MAX + 1], n_deg = bound_degrees(pl, m, deg);
	int sp = pl->opts ? pl->opts->sp : 0;
	int sp_lo = sp > 0 ? 1 : 0, sp_hi = sp != 0 ? 1 : 0;
	*np = 0;
	if (!m->scales || B < 1) {
		double f, b;
		cost_layer(pl, mi, B, &f, &b);
		if (!(*pt = sp_arena_calloc(a, 1, sizeof(hpt_t))))
			return SP_ENOMEM;
		(*pt)[(*np)++] = (hpt_t){f + b, f + b};
		return 0;
	}
	int nmax = (int)SP_MIN((int64_t)pl->N, B * deg[n_deg - 1]);
	double *row = sp_arena_calloc(a, (size_t)(B + 1) * 2 * (size_t)n_deg, sizeof(double));
	*pt = sp_arena_calloc(a, (size_t)nmax * 2 * (size_t)n_deg, sizeof(hpt_t));
	if (!row || !*pt)
		return SP_ENOMEM;
	for (size_t i = 0; i < (size_t)(B + 1) * 2 * (size_t)n_deg; i++)
		row[i] = -1;
	for (int n = 1; n <= nmax; n++)
		for (int j = 0; j < n_deg; j++) {
			int t = deg[j];
			int64_t d = n / t;
			if (n % t || d > B)
				continue;
			int64_t lo = B / d, r = B % d; /* r groups of lo + 1, d - r of lo */
			for (int s = t > 1 ? sp_lo : 0; s <= (t > 1 ? sp_hi : 0); s++) {
				double *rw = row + (size_t)(2 * j + s) * (size_t)(B + 1);
				double tl = group_ms(pl, mi, lo, t, s, rw);
				double th = r ? group_ms(pl, mi, lo + 1, t, s, rw) : 0;
				(*pt)[(*np)++] = (hpt_t){r ? th : tl,
							 t * ((double)(d - r) * tl + (double)r * th)};
			}
		}
	return 0;
}

/* MetaOp mi's hull of L-layer points (L time, L device-time), in a; *cp:
 * its least L time, *area: its least device-time of one layer. */
static int hull_build(planner_t *pl, sp_arena_t *a, int mi, hull_t *h, double *cp, double *area)
{
	hpt_t *pt;
	int np, rc;
	double L = pl->mops[mi].n_layers;
	if ((rc = bound_points(pl, mi, a, &pt, &np)))
		return rc;
	*cp = *area = HUGE_VAL;
	for (int i = 0; i < np; i++) {
		*area = fmin(*area, pt[i].a);
		pt[i].t *= L;
		pt[i].a *= L;
		*cp = fmin(*cp, pt[i].t);
	}
	h->t = sp_arena_calloc(a, (size_t)np + 1, sizeof(double));
	h->a = sp_arena_calloc(a, (size_t)np + 1, sizeof(double));
	if (!h->t || !h->a)
		return SP_ENOMEM;
	hull_pts(pt, np, h);
	return 0;
}

/* Least area within span C (HUGE_VAL if it cannot). */
double hull_area(const hull_t *h, double C)
{
	if (C < h->t[0] * (1 - 1e-12))
		return HUGE_VAL;
	double best = HUGE_VAL;
	for (int i = 0; i < h->n; i++) {
		if (h->t[i] <= C)
			best = fmin(best, h->a[i]);
		if (i + 1 < h->n && h->t[i] <= C && C < h->t[i + 1]) {
			double f = (C - h->t[i]) / (h->t[i + 1] - h->t[i]);
			best = fmin(best, h->a[i] + f * (h->a[i + 1] - h->a[i]));
		}
	}
	return best;
}

/* Whether MetaOp m's task runs in micro-step pl->micro (it has more
 * micro-batches than that; the bounds are of that micro-step's tasks). */
static int mop_active(const planner_t *pl, int m)
{
	int32_t k = pl->model->tasks[pl->mops[m].task].microbatches;
	return (k > 0 ? k : pl->k) > pl->micro;
}

/* Least device area all MetaOps need to finish within span C. */
static double hulls_area(const planner_t *pl, const hull_t *h, double C)
{
	double need = 0;
	for (int m = 0; m < pl->n_mops; m++)
		if (mop_active(pl, m))
			need += hull_area(&h[m], C);
	return need;
}

/* The least feasible C of the hulls h, from lo (the infeasible end). */
static double allotment_bound(planner_t *pl, const hull_t *h, double lo)
{
	double hi = fmax(lo, 1e-9);
	for (int it = 0; it < 200; it++) { /* find a feasible upper end */
		if (hulls_area(pl, h, hi) <= pl->N * hi)
			break;
		hi *= 2;
	}
	if (hulls_area(pl, h, lo) <= pl->N * lo)
		return lo;
	for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; it++) {
		double mid = 0.5 * (lo + hi);
		if (hulls_area(pl, h, mid) <= pl->N * mid)
			hi = mid;
		else
			lo = mid;
	}
	return lo; /* infeasible: below the least feasible C, so a bound */
}

/* The longest DAG path with every MetaOp at its least time cpt[m]. */
static double critical_path(const planner_t *pl, const double *cpt, double *finish)
{
	double cp = 0;
	for (int k = 0; k < pl->n_mops; k++) {
		int m = pl->topo[k];
		const metaop_t *mo = &pl->mops[m];
		double start = 0;
		for (int q = 0; q < mo->n_pred; q++)
			start = fmax(start, finish[pl->edges[mo->pred[q]].src]);
		finish[m] = start + (mop_active(pl, m) ? cpt[m] : 0);
		cp = fmax(cp, finish[m]);
	}
	return cp;
}

static void bound_steps(planner_t *pl, bounds_t *out)
{
	size_t nm = (size_t)pl->n_mops + 1;
	double area = 0;
	double *finish = sp_arena_calloc(&pl->scratch, nm, sizeof(double));
	double *cpt = sp_arena_calloc(&pl->scratch, nm, sizeof(double));
	int *ids = sp_arena_calloc(&pl->scratch, nm, sizeof(int));
	double *rem = sp_arena_calloc(&pl->scratch, nm, sizeof(double));
	hull_t *h = sp_arena_calloc(&pl->scratch, nm, sizeof *h);
	out->area_ms = out->cp_ms = out->paper_ms = out->lower_ms = out->allot_ms = 0;
	if (!finish || !cpt || !ids || !rem || !h)
		return;
	for (int m = 0; m < pl->n_mops; m++) {
		double least;
		if (hull_build(pl, &pl->scratch, m, &h[m], &cpt[m], &least))
			return;
		if (mop_active(pl, m))
			area += pl->mops[m].n_layers * least;
	}
	out->area_ms = area / pl->N;
	out->cp_ms = critical_path(pl, cpt, finish);
	for (int lv = 0; lv < pl->n_levels; lv++) {
		int k = 0;
		for (int m = 0; m < pl->n_mops; m++)
			if (pl->mops[m].level == lv && mop_active(pl, m)) {
				ids[k] = m;
				rem[k++] = pl->mops[m].n_layers;
			}
		if (k)
			out->paper_ms += paper_cstar(pl, ids, rem, k, pl->N, NULL);
	}
	out->allot_ms = allotment_bound(pl, h, fmax(out->area_ms, out->cp_ms));
	out->lower_ms = fmax(fmax(out->area_ms, out->cp_ms), out->allot_ms);
}

void bound_compute(planner_t *pl, bounds_t *out)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	bound_steps(pl, out);
	sp_arena_reset(&pl->scratch, mark);
}

int bound_comm(double *out, const sp_plan_t *p, const sp_cluster_t *c)
{
	*out = 0;
	int nodes = c->nodes, db = dtype_bytes(p->model.dtype);
	double *bytes = calloc((size_t)nodes + 1, sizeof *bytes);
	int *seen = calloc((size_t)nodes + 1, sizeof *seen);
	int rc = 0;
	if (!bytes || !seen) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		int n_nodes = 0;
		/* seen[v] == b + 1: v holds a replica of bucket b (counted once) */
		for (int i = 0; i < bk->n_dev; i++) {
			int v = p->devices[p->bucket_devs[bk->dev_off + i]].node;
			if (seen[v] != b + 1) {
				seen[v] = b + 1;
				n_nodes++;
			}
		}
		if (n_nodes < 2)
			continue;
		for (int v = 0; v < nodes; v++)
			if (seen[v] == b + 1)
				bytes[v] += (double)bk->elems * db;
	}
	double bw = (double)(c->nics > 0 ? c->nics : 1) * c->inter_gbs * 1e6; /* bytes per ms */
	for (int v = 0; v < nodes; v++)
		*out = fmax(*out, bytes[v] / bw);
cleanup:
	free(bytes);
	free(seen);
	return rc;
}

/*
 * Per bucket, R_b: the latest, over its members d, of the compute d's
 * program runs before its SYNC of b, each FWD/BWD/LOSS charged as the
 * simulator charges it, by the same function (ins_compute_ms: layers x
 * T_fwd|bwd at the instruction's local batch and the slice's tp and sp;
 * a recomputing slice's BWD its forward too; LOSS T_fwd + T_bwd). A device runs its program in order and its
 * clock only moves on (waits, copies, zero-3 gathers and recompute added
 * by layout_trial add), and a bucket's collective is ready when its last
 * member issued its SYNC (sim.c), so it starts no sooner than R_b in any
 * layout: regather moves only GATHERs, never a SYNC or a compute
 * instruction. All 0 where a micro-step leaves tasks out (its full pass
 * skips their instructions).
 */
static int sync_releases(planner_t *pl, const sp_plan_t *p, double *rel)
{
	if (plan_micro_next(&p->model, p->microbatches, 0) < p->microbatches)
		return 0;
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *dv = &p->devices[d];
		double x = 0;
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p->ins[dv->first_ins + k];
			if (in->op == INS_SYNC && in->peer >= 0 && in->peer < p->n_buckets) {
				rel[in->peer] = fmax(rel[in->peer], x);
				continue;
			}
			if ((in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS) ||
			    in->slice < 0 || in->slice >= p->n_slices)
				continue;
			x += ins_compute_ms(pl, p, in);
		}
	}
	return 1;
}

/* A bucket and its release, sorted by release (ties: bucket order). */
typedef struct {
	double rel;
	int b;
} rel_t;

static int rel_cmp(const void *x, const void *y)
{
	const rel_t *a = x, *b = y;
	return a->rel < b->rel ? -1 : a->rel > b->rel ? 1 : a->b - b->b;
}

/* A bucket's bytes per link (the least of both layouts with any_layout),
 * as ms at the link's bandwidth: entries off[b]..off[b + 1] of res, ms. */
typedef struct {
	int *off, *res, n, cap_res, cap_ms;
	double *ms;
} link_ms_t;

/* Adds loads ld[0..n) into acc (bytes per link, touched: the links
 * written, n_touched of them), in order. */
static void add_loads(const net_load_t *ld, int n, double *acc, int *touched, int *n_touched)
{
	for (int i = 0; i < n; i++) {
		int r = ld[i].res;
		if (acc[r] < 0) {
			acc[r] = 0;
			touched[(*n_touched)++] = r;
		}
		acc[r] += ld[i].bytes;
	}
}

/*
 * coll_loads' results once per planner (pl->coll_memo, in pl->arena): a
 * collective of kind op over devices devs (in their order) and bytes, its
 * time alone and its loads phase by phase, as net_*_phases gives them.
 * Those read nothing else but the cluster, which a planner keeps, so a
 * collective met again (the same bucket in the walk's next candidate, the
 * same plan bounded again after layout_fit or for refined_bound) adds the
 * same figures in the same order: the bound is the very number computed
 * afresh. A planner copied for a job thread (jobs.c) finds the memo of
 * another arena (home) and starts its own. Past COLL_MEMO_BYTES (its
 * tables, old ones included, and entries), new collectives are computed
 * and not kept.
 */
typedef struct {
	uint64_t h;
	int op, n_dev, n_load;
	int64_t bytes;
	const int32_t *devs;
	const net_load_t *load;
	double ms;
} coll_ent_t;

struct coll_memo {
	const sp_arena_t *home;
	coll_ent_t *e; /* open addressing; cap a power of 2, NULL h: empty */
	int n, cap;
	size_t bytes;
	uint64_t hits, misses; /* SPINDLE_TOP_STATS */
};

enum { COLL_MEMO_BYTES = 64 << 20 };

static uint64_t coll_hash(int op, const int32_t *devs, int n, int64_t bytes)
{
	uint64_t h = 1469598103934665603ull;
	h = (h ^ (uint64_t)op) * 1099511628211ull;
	h = (h ^ (uint64_t)bytes) * 1099511628211ull;
	for (int i = 0; i < n; i++)
		h = (h ^ (uint32_t)devs[i]) * 1099511628211ull;
	return h ? h : 1;
}

/* Slot of key (op, devs, n, bytes) hashed h: its entry, or the empty slot
 * where it goes. */
static coll_ent_t *coll_slot(const struct coll_memo *m, uint64_t h, int op, const int32_t *devs,
			     int n, int64_t bytes)
{
	for (size_t i = (size_t)h & (size_t)(m->cap - 1);; i = (i + 1) & (size_t)(m->cap - 1)) {
		coll_ent_t *e = &m->e[i];
		if (!e->h || (e->h == h && e->op == op && e->n_dev == n && e->bytes == bytes &&
			      !memcmp(e->devs, devs, sizeof *devs * (size_t)n)))
			return e;
	}
}

/* pl's memo, made on first use (NULL where out of memory: then
 * coll_loads computes every collective). */
static struct coll_memo *coll_memo_get(planner_t *pl)
{
	struct coll_memo *m = pl->coll_memo;
	if (pl->coll_memo_off)
		return NULL;
	if (m && m->home == &pl->arena)
		return m;
	m = sp_arena_calloc(&pl->arena, 1, sizeof *m);
	coll_ent_t *e = m ? sp_arena_calloc(&pl->arena, 256, sizeof *e) : NULL;
	if (!e)
		return NULL;
	*m = (struct coll_memo){.home = &pl->arena, .e = e, .cap = 256,
				.bytes = sizeof *m + 256 * sizeof *e};
	pl->coll_memo = m;
	return m;
}

/* Keeps a collective computed (co: its phases; devs, n: its devices) in
 * slot e of m, within COLL_MEMO_BYTES; the table doubled past half full.
 * Nothing kept where out of memory. */
static void coll_keep(planner_t *pl, struct coll_memo *m, coll_ent_t *e, coll_ent_t key,
		      const net_coll_t *co)
{
	int nl = 0;
	for (int p = 0; p < co->n_phase; p++)
		nl += co->ph[p].n_load;
	size_t need = sizeof *key.devs * (size_t)key.n_dev + sizeof *key.load * (size_t)nl;
	int grow = 2 * (m->n + 1) > m->cap;
	size_t table = grow ? 2 * (size_t)m->cap * sizeof *m->e : 0;
	if (m->bytes + need + table > COLL_MEMO_BYTES)
		return;
	if (grow) {
		coll_ent_t *t = sp_arena_calloc(&pl->arena, 2 * (size_t)m->cap, sizeof *t);
		if (!t)
			return;
		struct coll_memo g = *m;
		g.e = t;
		g.cap = 2 * m->cap;
		g.bytes += table; /* the old table stays in the arena: counted too */
		for (int i = 0; i < m->cap; i++)
			if (m->e[i].h)
				*coll_slot(&g, m->e[i].h, m->e[i].op, m->e[i].devs, m->e[i].n_dev,
					   m->e[i].bytes) = m->e[i];
		*m = g;
		e = coll_slot(m, key.h, key.op, key.devs, key.n_dev, key.bytes);
	}
	int32_t *devs = sp_arena_alloc(&pl->arena, sizeof *devs * (size_t)key.n_dev + 1);
	net_load_t *ld = sp_arena_alloc(&pl->arena, sizeof *ld * (size_t)nl + 1);
	if (!devs || !ld)
		return;
	memcpy(devs, key.devs, sizeof *devs * (size_t)key.n_dev);
	for (int p = 0, k = 0; p < co->n_phase; p++)
		for (int i = 0; i < co->ph[p].n_load; i++)
			ld[k++] = co->ph[p].load[i];
	key.devs = devs;
	key.load = ld;
	key.n_load = nl;
	*e = key;
	m->n++;
	m->bytes += need;
}

/* Bucket b's collective of kind op (COLL_ALL_REDUCE, _REDUCE_SCATTER or
 * _ALL_GATHER) as sim.c runs it: its time alone into *ms, its bytes per
 * link added into acc (touched, *nt: the links written); from pl's memo
 * where it holds it. */
static int coll_loads(planner_t *pl, const sp_plan_t *p, int b, sp_coll_op_t op, double *ms,
		      double *acc, int *touched, int *nt)
{
	const sp_bucket_t *bk = &p->buckets[b];
	const int32_t *devs = p->bucket_devs + bk->dev_off;
	int64_t bytes = bk->elems * dtype_bytes(pl->model->dtype);
	struct coll_memo *m = coll_memo_get(pl);
	coll_ent_t key = {.op = (int)op, .n_dev = bk->n_dev, .bytes = bytes, .devs = devs}, *e = NULL;
	if (m) {
		key.h = coll_hash(key.op, devs, bk->n_dev, bytes);
		e = coll_slot(m, key.h, key.op, devs, bk->n_dev, bytes);
		if (e->h) {
			m->hits++;
			*ms += e->ms;
			add_loads(e->load, e->n_load, acc, touched, nt);
			return 0;
		}
		m->misses++;
	}
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t m2 = sp_arena_mark(a);
	net_coll_t co;
	int rc = op == COLL_ALL_REDUCE
			 ? net_allreduce_phases(&co, pl->cluster, devs, bk->n_dev, bytes, 0, a)
			 : net_half_phases(&co, pl->cluster, op, devs, bk->n_dev, bytes, a);
	if (!rc) {
		key.ms = net_phases_ms(pl->cluster, &co);
		*ms += key.ms;
		for (int ph = 0; ph < co.n_phase; ph++)
			add_loads(co.ph[ph].load, co.ph[ph].n_load, acc, touched, nt);
		if (m)
			coll_keep(pl, m, e, key, &co);
	}
	sp_arena_reset(a, m2);
	return rc;
}

void coll_memo_counts(const planner_t *pl, uint64_t *hits, uint64_t *misses)
{
	const struct coll_memo *m = pl->coll_memo;
	*hits = m && m->home == &pl->arena ? m->hits : 0;
	*misses = m && m->home == &pl->arena ? m->misses : 0;
}

int bound_sync(planner_t *pl, const sp_plan_t *p, int any_layout, int gathers, double *out)
{
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	size_t nb = (size_t)p->n_buckets + 1, nr = (size_t)net_n_res(pl->cluster) + 1;
	double *end = sp_arena_calloc(a, (size_t)p->n_devices + 1, sizeof(double));
	double *rel = sp_arena_calloc(a, nb, sizeof(double));
	double *dur = sp_arena_calloc(a, nb, sizeof(double));
	double *acc[2] = {sp_arena_calloc(a, nr, sizeof(double)),
			  sp_arena_calloc(a, nr, sizeof(double))};
	double *lend = sp_arena_calloc(a, nr, sizeof(double));
	int *touched[2] = {sp_arena_calloc(a, nr, sizeof(int)), sp_arena_calloc(a, nr, sizeof(int))};
	rel_t *ord = sp_arena_calloc(a, nb, sizeof *ord);
	link_ms_t lk = {.off = sp_arena_calloc(a, nb + 1, sizeof(int))};
	int rc = 0;
	*out = 0;
	if (!end || !rel || !dur || !acc[0] || !acc[1] || !lend || !touched[0] || !touched[1] ||
	    !ord || !lk.off) {
		rc = SP_ENOMEM;
		goto done;
	}
	for (size_t r = 0; r < nr; r++)
		acc[0][r] = acc[1][r] = -1; /* untouched */
	int timed = sync_releases(pl, p, rel);
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		int zero1 = layout_sharded(bk->layout), nt[2] = {0, 0};
		/* the layouts it may take: 0 replicated (an all-reduce), 1
		 * sharded (a reduce-scatter, and with gathers its all-gather
		 * after the step where that is waited for: not deferred, as
		 * set_layout's zero-1 would not be either) */
		int lo = any_layout ? 0 : zero1, hi = any_layout ? 1 : zero1;
		int ag = gathers && timed && !bk->defer &&
			 (zero1 ? layout_gathers_after_step(bk->layout)
				: pl->opts->defer_gather != 1);
		double t[2] = {0, 0};
		for (int k = lo; k <= hi && !rc; k++) {
			rc = coll_loads(pl, p, b, k ? COLL_REDUCE_SCATTER : COLL_ALL_REDUCE, &t[k],
					acc[k], touched[k], &nt[k]);
			if (!rc && k && ag)
				rc = coll_loads(pl, p, b, COLL_ALL_GATHER, &t[k], acc[k], touched[k],
						&nt[k]);
		}
		if (rc)
			goto done;
		dur[b] = fmin(t[lo], t[hi]);
		/* per link, the least of the layouts (a link one of them does
		 * not load: none) */
		lk.off[b] = lk.n;
		if (sp_grow((void **)&lk.res, &lk.cap_res, lk.n + nt[lo] + 1, sizeof(int)) ||
		    sp_grow((void **)&lk.ms, &lk.cap_ms, lk.n + nt[lo] + 1, sizeof(double))) {
			rc = SP_ENOMEM;
			goto done;
		}
		for (int i = 0; i < nt[lo]; i++) {
			int r = touched[lo][i];
			double x = acc[lo][r];
			if (hi != lo)
				x = acc[hi][r] < 0 ? 0 : fmin(x, acc[hi][r]);
			if (x > 0) {
				lk.res[lk.n] = r;
				lk.ms[lk.n++] = x / (net_res_gbs(pl->cluster, r) * 1e6);
			}
		}
		for (int k = lo; k <= hi; k++)
			for (int i = 0; i < nt[k]; i++)
				acc[k][touched[k][i]] = -1;
	}
	lk.off[p->n_buckets] = lk.n;
	for (int b = 0; b < p->n_buckets; b++)
		ord[b] = (rel_t){rel[b], b};
	qsort(ord, (size_t)p->n_buckets, sizeof *ord, rel_cmp);
	for (int i = 0; i < p->n_buckets; i++) {
		int b = ord[i].b;
		const sp_bucket_t *bk = &p->buckets[b];
		const int32_t *devs = p->bucket_devs + bk->dev_off;
		for (int j = 0; j < bk->n_dev; j++)
			end[devs[j]] = fmax(end[devs[j]], rel[b]) + dur[b];
		for (int e = lk.off[b]; timed && e < lk.off[b + 1]; e++)
			lend[lk.res[e]] = fmax(lend[lk.res[e]], rel[b]) + lk.ms[e];
	}
	for (int d = 0; d < p->n_devices; d++)
		*out = fmax(*out, end[d]);
	for (size_t r = 0; r < nr; r++)
		*out = fmax(*out, lend[r]);
	*out *= 1 - 1e-6;
done:
	free(lk.res);
	free(lk.ms);
	sp_arena_reset(a, mark);
	if (rc == SP_ENOMEM && !pl->err->code)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return rc;
}

/*
 * bound_sync of p as lower_run leaves it into *raw, in the layouts' mode
 * any = (--zero auto) and with the gathers, and *out, *raw less 1e-9 of
 * itself: no more than bound_sync(q, a, 1) for every plan q that
 * memplan_run and layout_fit make of p, in each mode a that --zero
 * leaves to the walk (any, or with --zero auto either). Those passes change
 * only what bound_sync reads as follows: memory (not read); under --zero
 * auto bucket layouts (replicated, zero-1, zero-2), their overlaps and
 * deferrals: any_layout takes the least of both layouts per bucket, in
 * time and on every link, and counts a sharded layout's all-gather
 * exactly where q's would count (lowering defers a gather only under
 * --defer-gather on, and so does set_layout: defer_for), so no bucket's
 * time or link load here exceeds q's; under a forced --zero no layout
 * changes (fit_memory shards only under auto). Recompute flags, set and
 * never cleared, only add a forward to a BWD (ins_layer_ms), so every
 * release R_b of q is no less than p's; GATHER instructions (regather)
 * sync_releases skips. The buckets, their devices and elements, the
 * SYNCs' places and every other instruction stay. Both bounds are max over
 * devices and links of the chain t = max(t, R_b) + A_b by increasing R_b,
 * which equals max over t of t + the A_b with R_b >= t: no less when
 * releases rise and times grow. The 1e-9 covers the two evaluations'
 * rounding (sums in other orders). Not a bound of bound_sync without the
 * gathers (refined_bound's under --defer-gather auto or on). The walk
 * lowers a candidate no further when this settles it (walk.c
 * plan_lowered_cut), and where layout_fit changed nothing takes *raw as
 * the candidate's own bound_sync.
 */
int bound_sync_early(planner_t *pl, const sp_plan_t *p, double *raw, double *out)
{
	int rc = bound_sync(pl, p, pl->opts->zero < 0, 1, raw);
	*out = *raw * (1 - 1e-9);
	return rc;
}

double bound_comm_solve(const double *W, const double *S, int nw, int G, double cap_ms)
{
	double wmax = 0;
	for (int i = 0; i < nw; i++)
		wmax = fmax(wmax, W[i]);
	if (wmax <= 0 || cap_ms <= 0)
		return 0;
	double lo = 0, hi = wmax / G; /* at hi every group fits one node: E = 0 */
	for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
		double T = 0.5 * (lo + hi), E = 0;
		for (int i = 0; i < nw; i++) {
			double m = ceil(W[i] / (G * T) - 1e-12);
			if (m >= 2)
				E += m * S[i];
		}
		if (E <= T * cap_ms)
			hi = T;
		else
			lo = T;
	}
	return hi;
}

int bound_comm_any(planner_t *pl, double *out)
{
	const sp_model_t *md = pl->model;
	const sp_cluster_t *c = pl->cluster;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	int nc = md->n_comps, np = 0, rc = 0;
	*out = 0;
	int *base = sp_arena_calloc(a, (size_t)nc + 1, sizeof(int));
	if (!base) {
		rc = SP_ENOMEM;
		goto done;
	}
	for (int k = 0; k < nc; k++) {
		base[k] = np;
		np += md->comps[k].type == COMP_TRANSFORMER ? (int)md->comps[k].layers : 1;
	}
	double *W = sp_arena_calloc(a, (size_t)np + 1, sizeof(double));
	double *S = sp_arena_calloc(a, (size_t)np + 1, sizeof(double));
	if (!W || !S) {
		rc = SP_ENOMEM;
		goto done;
	}
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		if (!mo->scales || !mop_active(pl, m))
			continue;
		hull_t h;
		double least, cp; /* device-ms of one layer at its least */
		if ((rc = hull_build(pl, a, m, &h, &cp, &least)))
			goto done;
		for (int l = 0; l < mo->n_layers; l++) {
			int layer, k = mop_comp(pl, m, l, &layer);
			W[base[k] + layer] += least;
			S[base[k] + layer] = (double)comp_layer_params(&md->comps[k]) *
					     dtype_bytes(md->dtype);
		}
	}
	/* bytes per ms over all NICs of the cluster, each way */
	double cap = (double)c->nodes * (c->nics > 0 ? c->nics : 1) * c->inter_gbs * 1e6;
	if (c->nodes >= 2)
		*out = bound_comm_solve(W, S, np, c->gpus_per_node, cap);
done:
	sp_arena_reset(a, mark);
	return rc;
}
