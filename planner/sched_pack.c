/*
 * sched_pack.c — packed lanes: the lanes of sched_lanes.c (independent
 * chains, CLIP-style) each at two widths at most, switching only at its
 * own layer boundaries, and the devices they hold packed as intervals
 * (sched_pack). It chooses the lanes' widths itself; the MetaOps outside
 * lanes (the joins) keep the widths allot.c chose. It keeps nothing
 * between calls.
 *
 * Why: the fluid lanes of sched_lanes.c hand devices over at fluid
 * times, which fall inside layers, so a lane either overruns its window
 * (the next lane starts late) or leaves the device idle, and the
 * calibration rounds chase that raggedness without settling. Here every
 * hand-over is at a layer boundary of the lane that gives the device up.
 *
 *  step    one layer of a lane's MetaOp (a sink: all its layers), in chain
 *          order; on a lane holding n devices it takes mop_t at
 *          lane_width(m, n).
 *  plan    lo devices for the whole lane, and hi - lo more for its hi
 *          phase: its first l steps (descending) or its last l
 *          (ascending), l the fewest that end within the lane's budget
 *          T - tail; lo = 0: every step at hi, anywhere within the
 *          budget. lo and hi are widths that gain whose device-time is
 *          within NEAR_HULL of the lane's hull (a flatter pair than the
 *          hull's can pack where the hull's cannot).
 *  pack    a plan is a set of unit intervals, each one device held from
 *          one time to another: lo over the lane, hi - lo over its hi
 *          phase. Intervals are coloured with as many devices as most of
 *          them overlap at one time (interval graphs are perfect: first
 *          fit in order of start attains it), so the plans fit N devices
 *          exactly when no time has more than N intervals open. Lanes are
 *          placed greedily, the largest least device-time first (the
 *          small ones fill the holes the large ones leave): of its plans
 *          that keep the devices held within N, the flat ones (device-time
 *          within 1 + delta of its least) by the lowest peak so far, then
 *          the fewest devices, then the least device-time; if none is
 *          flat, the least device-time. A plan at one width starts at 0,
 *          else at the earliest time another lane frees devices from which
 *          it fits, else ends at its budget. With SCHED_PACK_REORDER
 *          (the row lanes-packed-reorder), a lane that finds no room
 *          goes first and the placement starts again, at most as many
 *          times as there are lanes (a lane may go first more than once,
 *          and a try may repeat an order tried before: counted, not
 *          checked; a first-fit order that packs where the largest-first
 *          one does not; with at most PACK_REORDER_LANES lanes); its
 *          horizons are searched twice, the second time (for a delta
 *          whose first search fitted on a retry) with keep: on a retry
 *          a lane's flat plans are those within 1 + delta of the plan
 *          it took in the try before (the
 *          lane that found no room: the last it tried), so a lane
 *          squeezed once may take as costly a plan again.
 *  horizon the least T, by bisection from the fluid horizon
 *          (lanes_horizon), at which every lane is placed; for each delta
 *          of a few, the shortest schedule kept. With SCHED_PACK_TAILS
 *          (the row lanes-packed-tails) the kept one is instead the one
 *          whose latest device end plus optimizer step is least (the
 *          runtime steps every parameter a device holds after its last
 *          instruction, so a device holding two components' layers ends
 *          later by the second one's step), ties to the shorter; its
 *          devices are chosen as without it (choosing them by the least
 *          step added made clip-10 on a800-8x8 and a800-8x8-4nic plan
 *          slower).
 *  hand-over (SCHED_PACK_HANDOVER, the row lanes-packed-tails) a plan at
 *          two widths takes, at its change of width, the time its
 *          transfers take (hand_over_ms): in its budget, its core
 *          interval and the slices' times; its hi-phase devices are held
 *          only for their own steps (a transfer waits on the network, not
 *          on a device). In every packed row it made clip-7 on a800-8x8
 *          and a800-2x8 and clip-4 on a800-2x8 plan slower, so it is
 *          this row's only.
 *
 *          Its hi-phase slices' devices are in hand_over_order, so that
 *          each core device keeps about its share of the samples it held
 *          at lo (ascending order moves nearly all of them; in every
 *          packed row that order made clip-4 on h100-4x8-8nic plan 45.54
 *          -> 45.91 ms).
 *
 * Devices: each interval, in order of start, takes a free device that
 * holds the lane's component already (no new replica), else one on a
 * node that does, else one on a node the lane holds, else the lowest free
 * one (fewer nodes per component: its gradients cross fewer NICs). The
 * joins follow as in sched_lanes.c.
 */
#include "iv_peak.h"
#include "planner.h"
#include "sort.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bisection steps on the horizon (each halves the bracket: 2^-12 of it). */
#define PACK_ITERS 12
/* Widths whose device-time is this much above the lane's hull still
 * count (a flatter plan can pack where the hull's widths do not). */
#define NEAR_HULL 0.03
/* Packs only DAGs whose lanes hold at least this share of the work (at
 * one device). */
#define PACK_LANES_SHARE 0.9
/* Relative tolerance of times compared (sums of the same step times). */
#define PACK_EPS 1e-9
/* SCHED_PACK_REORDER retries, and SCHED_PACK_TAILS runs (a search as
 * long as the plain one's: 32 tasks on 1024 H100s, 64 lanes, +1.1 G
 * instructions, the same plan), only with at most this many lanes: a failed
 * placement costs up to one greedy placement per lane, each one over
 * every lane (64 lanes, 32 tasks on 1024 H100s: 8 s of planning for no
 * shorter plan; the rows it shortened have 8 to 20). A cut-off between
 * the measured rows, not a budget. */
#define PACK_REORDER_LANES 32

typedef struct {
	int lo, hi, l, desc; /* l: steps in the hi phase */
	double time, hi_time, area;
	double start; /* lo = 0: when it starts (else desc: 0, asc: at the budget) */
} pack_plan_t;

typedef struct {
	double area;
	int q;
} plan_key_t;

/* By area, then index (distinct: a total order, sort.h). */
#define PLAN_KEY_BEFORE(x, y) ((x).area < (y).area || ((x).area == (y).area && (x).q < (y).q))
SP_SORT_DEFINE(plan_key_sort, plan_key_t, PLAN_KEY_BEFORE)
#define PEAK_T_BEFORE(x, y) ((x) < (y))
SP_SORT_DEFINE(peak_t_sort, double, PEAK_T_BEFORE) /* pack_fix's starts */

typedef struct {
	planner_t *pl;
	const lanes_t *L;
	int *s_first;          /* per lane: its first step (s_first[nl]: all) */
	int *s_m, *s_lf, *s_lt; /* per step: MetaOp and layers */
	int *wid, *w_first;    /* per lane: its widths wid[w_first[j] .. w_first[j + 1]) */
	double *pre;           /* per lane and width: prefix times of its steps */
	int *pre_off;          /* per lane: where its widths' prefixes begin */
	pack_plan_t *plan;     /* per lane, at the horizon tried last */
	pack_plan_t *cand;     /* every lane's plans (lane_plans) at cand_off */
	int *cand_off, *n_cand;
	plan_key_t *rest;      /* those not flat, to sort */
	double delta;          /* plans within 1 + delta of a lane's least area
				* count as least, the narrowest of them first */
	double *budget;        /* per lane */
	int *order;            /* lanes by hi-phase weight */
	double *iv_s, *iv_e;   /* per lane: its core and hi-phase intervals */
	double *hs, *he;
	/* pack_peak's view of the lanes placed before the one it places
	 * (pack_fix): their intervals, and the times they start intervals,
	 * sorted (pk_t; pk_fix.u their points) */
	iv_fixed_t pk_fix;
	double *pk_t;
	int asc; /* ascending plans before descending ones (ties go to them) */
	int bumps;    /* retries of the greedy placement (pack_fits) */
	int reordered; /* a placement fitted on a retry */
	int tails;     /* SCHED_PACK_TAILS */
	double *ho;    /* SCHED_PACK_HANDOVER: per lane and width hi, its
			* hand-over (hand_over_ms; < 0: not priced yet);
			* NULL without the flag */
	int keep;      /* a retry's flat plans are within 1 + delta of the plan
			* each lane took in the try before (the lane that
			* found no room: the last it tried), not of its least
			* area */
} pack_t;

static int lane_steps(const pack_t *P, int j)
{
	return P->s_first[j + 1] - P->s_first[j];
}

/* Prefix time of lane j's first s steps at its width index c. */
static double pre_at(const pack_t *P, int j, int c, int s)
{
	return P->pre[P->pre_off[j] + (c - P->w_first[j]) * (lane_steps(P, j) + 1) + s];
}

static int pack_init(pack_t *P, planner_t *pl, const lanes_t *L)
{
	sp_arena_t *a = &pl->scratch;
	int nl = L->nl, ns = 0, nw = 0, npre = 0, N = pl->N;
	P->pl = pl;
	P->L = L;
	for (int j = 0; j < nl; j++)
		for (int i = L->ln[j].first; i < L->ln[j].first + L->ln[j].n; i++) {
			const metaop_t *mo = &pl->mops[L->lm[i]];
			ns += mo->sink ? 1 : mo->n_layers;
		}
	nw = nl * N;
	P->s_first = sp_arena_calloc(a, (size_t)nl + 1, sizeof(int));
	P->w_first = sp_arena_calloc(a, (size_t)nl + 1, sizeof(int));
	P->pre_off = sp_arena_calloc(a, (size_t)nl + 1, sizeof(int));
	P->order = sp_arena_calloc(a, (size_t)nl + 1, sizeof(int));
	P->s_m = sp_arena_calloc(a, 3 * (size_t)ns + 3, sizeof(int));
	P->wid = sp_arena_calloc(a, (size_t)nw + 1, sizeof(int));
	P->plan = sp_arena_calloc(a, (size_t)nl + 1, sizeof *P->plan);
	P->budget = sp_arena_calloc(a, 5 * (size_t)nl + 5, sizeof(double));
	int mp = 2 * nl + 1; /* pack_fix's points: 2 per lane */
	iv_fixed_t *F = &P->pk_fix;
	F->open = sp_arena_calloc(a, 2 * (size_t)mp, sizeof(iv_end_t));
	F->open_sum = sp_arena_calloc(a, (2 + (size_t)iv_fixed_levels(mp)) * mp, sizeof(int));
	P->pk_t = sp_arena_calloc(a, 2 * (size_t)mp, sizeof(double));
	if (!P->s_first || !P->w_first || !P->pre_off || !P->order || !P->s_m || !P->wid ||
	    !P->plan || !P->budget || !F->open || !F->open_sum || !P->pk_t)
		return SP_ENOMEM;
	F->close = F->open + mp;
	F->close_sum = F->open_sum + mp;
	F->held = F->close_sum + mp;
	F->u = P->pk_t + mp;
	P->s_lf = P->s_m + ns + 1;
	P->s_lt = P->s_lf + ns + 1;
	P->iv_s = P->budget + nl + 1;
	P->iv_e = P->iv_s + nl + 1;
	P->hs = P->iv_e + nl + 1;
	P->he = P->hs + nl + 1;
	ns = nw = 0;
	for (int j = 0; j < nl; j++) {
		const lane_t *l = &L->ln[j];
		P->s_first[j] = ns;
		for (int i = l->first; i < l->first + l->n; i++) {
			const metaop_t *mo = &pl->mops[L->lm[i]];
			for (int y = 0; y < mo->n_layers; y += mo->sink ? mo->n_layers : 1) {
				P->s_m[ns] = L->lm[i];
				P->s_lf[ns] = y;
				P->s_lt[ns++] = mo->sink ? mo->n_layers : y + 1;
			}
		}
		/* the widths that gain whose device-time is within NEAR_HULL of
		 * the hull's at their time, widest first */
		P->w_first[j] = nw;
		double prev = HUGE_VAL;
		for (int k = 1; k <= N; k++) {
			double t = 0;
			for (int i = l->first; i < l->first + l->n; i++) {
				const metaop_t *mo = &pl->mops[L->lm[i]];
				t += mo->n_layers * mop_t(mo, lane_width(mo, k));
			}
			if (t < prev * (1 - PACK_EPS) && k * t <= hull_area(&l->hull, t) * (1 + NEAR_HULL))
				P->wid[nw++] = k;
			prev = fmin(prev, t);
		}
		for (int a = P->w_first[j], b = nw - 1; a < b; a++, b--) {
			int x = P->wid[a];
			P->wid[a] = P->wid[b];
			P->wid[b] = x;
		}
		P->pre_off[j] = npre;
		npre += (nw - P->w_first[j]) * (ns - P->s_first[j] + 1);
	}
	P->s_first[nl] = ns;
	P->w_first[nl] = nw;
	int most = 0, all = 0;
	P->cand_off = sp_arena_calloc(a, 2 * (size_t)nl + 2, sizeof(int));
	if (!P->cand_off)
		return SP_ENOMEM;
	P->n_cand = P->cand_off + nl + 1;
	for (int j = 0; j < nl; j++) {
		int w = P->w_first[j + 1] - P->w_first[j];
		most = SP_MAX(most, 2 * w * w + 2 * w);
		P->cand_off[j] = all;
		all += 2 * w * w + 2 * w;
	}
	if (!(P->pre = sp_arena_calloc(a, (size_t)npre + 1, sizeof(double))) ||
	    !(P->cand = sp_arena_calloc(a, (size_t)all + 1, sizeof *P->cand)) ||
	    !(P->rest = sp_arena_calloc(a, (size_t)most + 1, sizeof *P->rest)))
		return SP_ENOMEM;
	for (int j = 0; j < nl; j++)
		for (int c = P->w_first[j]; c < P->w_first[j + 1]; c++) {
			double *p = P->pre + P->pre_off[j] +
				    (c - P->w_first[j]) * (lane_steps(P, j) + 1);
			p[0] = 0;
			for (int s = 0; s < lane_steps(P, j); s++) {
				int x = P->s_first[j] + s;
				const metaop_t *mo = &pl->mops[P->s_m[x]];
				p[s + 1] = p[s] + (P->s_lt[x] - P->s_lf[x]) *
							  mop_t(mo, lane_width(mo, P->wid[c]));
			}
		}
	return 0;
}

/* Lane j's time with l steps at width index ch (its first l: desc; its
 * last l: asc) and the others at cl. */
static double plan_time(const pack_t *P, int j, int ch, int cl, int desc, int l)
{
	int n = lane_steps(P, j);
	if (desc)
		return pre_at(P, j, ch, l) + pre_at(P, j, cl, n) - pre_at(P, j, cl, l);
	return pre_at(P, j, cl, n - l) + pre_at(P, j, ch, n) - pre_at(P, j, ch, n - l);
}

/* The hand-over of lane j at its change of width to or from hi devices
 * (forward: the activations move, backward: their gradients back), with
 * hand_over_order's slots: each of the devices that join or leave
 * receives (sends) the ceil(B / hi) samples its slot holds of the output
 * of the lane's heaviest MetaOp (where its widths change in the CLIP
 * rows; one price per lane and width, so the bisection below looks none
 * up), B its batch, and the core devices keep theirs. The transfers run
 * at once, so it takes one of them (cost_xfer_ms), across nodes where hi
 * is more than a node's GPUs (the lane cannot sit in one node), else over
 * NVLink, forward and backward: 2 cost_xfer_ms. Before placement, so it
 * does not count the NIC's share when several of a node's devices
 * receive at once. 0 without SCHED_PACK_HANDOVER. */
static double hand_over_ms(const pack_t *P, int j, int hi)
{
	if (!P->ho)
		return 0;
	const planner_t *pl = P->pl;
	double *h = &P->ho[(size_t)j * (size_t)(pl->N + 1) + (size_t)hi];
	if (*h < 0) {
		const metaop_t *mo = &pl->mops[P->L->ln[j].heavy];
		int G = pl->cluster->gpus_per_node;
		int64_t per = (int64_t)mo->seq_out * mo->width_out * dtype_bytes(pl->model->dtype);
		int64_t n = (mo->batch + hi - 1) / hi;
		*h = 2 * cost_xfer_ms(pl->cluster, 0, hi > G ? G : 1, n * per);
	}
	return *h;
}

/* Lane j's plans within budget B into out (at most 2 w^2 + 2 w of them, w
 * its widths): every width alone, both ways; every pair lo < hi, both
 * ways, with the fewest steps at hi that meet B (more cost more area).
 * Returns how many. */
static int lane_plans(const pack_t *P, int j, double B, pack_plan_t *out)
{
	int n = lane_steps(P, j), np = 0;
	double lim = B * (1 + PACK_EPS);
	for (int ch = P->w_first[j]; ch < P->w_first[j + 1]; ch++) {
		int hi = P->wid[ch];
		double all = pre_at(P, j, ch, n), h = hand_over_ms(P, j, hi);
		for (int k = 0; k < 2 && all <= lim; k++) {
			int desc = P->asc ? k : !k;
			out[np++] = (pack_plan_t){0, hi, n, desc, all, all, hi * all,
						  desc ? 0 : fmax(0, B - all)};
		}
		for (int cl = P->w_first[j]; cl < P->w_first[j + 1]; cl++) {
			int lo = P->wid[cl];
			if (lo >= hi)
				continue;
			double lo_all = pre_at(P, j, cl, n);
			for (int k = 0; k < 2; k++) {
				int desc = P->asc ? k : !k;
				/* the fewest steps at hi, l in [1, n): time falls with l
				 * (each step at hi is no slower), so bisect */
				int a = 1, b = n; /* b: fits (n: none known) */
				while (a < b) {
					int l = a + (b - a) / 2;
					if (plan_time(P, j, ch, cl, desc, l) + h <= lim)
						b = l;
					else
						a = l + 1;
				}
				if (b >= n)
					continue;
				double ht = desc ? pre_at(P, j, ch, b) : all - pre_at(P, j, ch, n - b);
				double lt = desc ? lo_all - pre_at(P, j, cl, b) : pre_at(P, j, cl, n - b);
				out[np++] = (pack_plan_t){lo, hi, b, desc, ht + lt + h, ht,
							  hi * ht + lo * lt, 0};
			}
		}
	}
	return np;
}

/* Lane j's intervals under plan p: core [iv_s, iv_e) of p.lo devices and
 * hi phase [hs, he) of p.hi - p.lo. */
static void lane_intervals(pack_t *P, int j, const pack_plan_t *p)
{
	double s0 = !p->lo ? p->start : p->desc ? 0 : P->budget[j] - p->time;
	P->iv_s[j] = s0;
	P->iv_e[j] = s0 + p->time;
	P->hs[j] = p->desc ? s0 : s0 + p->time - p->hi_time;
	P->he[j] = p->desc ? s0 + p->hi_time : s0 + p->time;
}

/* Where lane j's interval starts count (pack_peak): t + eps, eps =
 * PACK_EPS * max(1, t), rising with t. */
static double peak_point(double t)
{
	return t + PACK_EPS * fmax(1, t);
}

/* 1 when a start at t lies before the span [s, e) that pack_peak looks
 * at (true for every t below some point: t rises, s - eps falls). */
static int peak_before(double t, double s)
{
	return t < s - PACK_EPS * fmax(1, t);
}

/* Lane j's intervals (iv_peak.h's), those not empty: its core [iv_s,
 * iv_e) of p.lo devices (p.lo > 0) and its hi phase [hs, he) of p.hi -
 * p.lo more. Returns how many. */
static int lane_ends(const pack_t *P, int j, iv_end_t *open, iv_end_t *close)
{
	const pack_plan_t *p = &P->plan[j];
	int n = 0;
	if (p->lo && P->iv_s[j] < P->iv_e[j]) {
		open[n] = (iv_end_t){P->iv_s[j], p->lo};
		close[n++] = (iv_end_t){P->iv_e[j], p->lo};
	}
	if (P->hs[j] < P->he[j]) {
		open[n] = (iv_end_t){P->hs[j], p->hi - p->lo};
		close[n++] = (iv_end_t){P->he[j], p->hi - p->lo};
	}
	return n;
}

/* pack_peak's view of the first k lanes of P->order, which stay where
 * they are while lane P->order[k] tries its plans: their intervals, and
 * the times they start one (iv_s and hs, empty or not) with the weight
 * they hold just after each. */
static void pack_fix(pack_t *P, int k)
{
	iv_fixed_t *F = &P->pk_fix;
	int n = 0, m = 0;
	for (int b = 0; b < k; b++) {
		int j = P->order[b];
		n += lane_ends(P, j, F->open + n, F->close + n);
		double t[2] = {P->iv_s[j], P->hs[j]};
		for (int a = 0; a < 2; a++)
			if (!isnan(peak_point(t[a]))) /* (no interval holds NaN) */
				P->pk_t[m++] = t[a];
	}
	peak_t_sort(P->pk_t, m);
	for (int i = 0; i < m; i++)
		F->u[i] = peak_point(P->pk_t[i]);
	F->n = n;
	F->m = m;
	iv_fixed_build(F);
}

/* Most devices held at one time by the first k lanes of P->order, at the
 * times lane P->order[k - 1] starts an interval or another starts one
 * inside it (the first k - 1 fit already: the peak can only rise there;
 * pack_fix(P, k - 1) holds them): at t + eps (peak_point) for the starts
 * t with s - eps <= t < e, [s, e) the lane's core (iv_peak.h). */
static int pack_peak(const pack_t *P, int k)
{
	const iv_fixed_t *F = &P->pk_fix;
	int jn = P->order[k - 1], nx = 0;
	double s = P->iv_s[jn], e = P->iv_e[jn], x[2];
	double own[2] = {P->iv_s[jn], P->hs[jn]};
	for (int a = 0; a < 2; a++) {
		double t = own[a], u = peak_point(t);
		if (!peak_before(t, s) && t < e && !isnan(u))
			x[nx++] = u;
	}
	int a = 0, z = F->m;
	while (a < z) { /* the fixed starts before the span: [0, a) */
		int c = a + (z - a) / 2;
		if (peak_before(P->pk_t[c], s))
			a = c + 1;
		else
			z = c;
	}
	for (int b = F->m; z < b;) { /* those in it: [a, z) */
		int c = z + (b - z) / 2;
		if (P->pk_t[c] < e)
			z = c + 1;
		else
			b = c;
	}
	iv_end_t open[IV_OWN], close[IV_OWN];
	int no = lane_ends(P, jn, open, close);
	int peak = iv_fixed_peak(F, a, z, open, close, no, x, nx);
	return peak;
}

/* Whether plan c of lane P->order[k] fits beside the lanes before it: at
 * its start, or (lo = 0: the lane at one width, anywhere within its
 * budget) at the earliest time some device is freed from which it fits;
 * c->start set to it. Returns the most devices held at once within its
 * span (<= N), or -1 when it fits nowhere. */
static int pack_place(pack_t *P, int k, pack_plan_t *c)
{
	int j = P->order[k], N = P->pl->N, peak;
	double latest = P->budget[j] - c->time;
	P->plan[j] = *c;
	lane_intervals(P, j, c);
	if ((peak = pack_peak(P, k + 1)) <= N)
		return peak;
	if (c->lo || !c->desc)
		return -1;
	for (;;) {
		/* the next time after start at which a lane before frees devices */
		double next = latest;
		for (int b = 0; b < k; b++) {
			int jb = P->order[b];
			if (P->iv_e[jb] > c->start && P->iv_e[jb] < next)
				next = P->iv_e[jb];
			if (P->he[jb] > c->start && P->he[jb] < next)
				next = P->he[jb];
		}
		if (next <= c->start || next > latest * (1 + PACK_EPS))
			return -1;
		c->start = next;
		P->plan[j] = *c;
		lane_intervals(P, j, c);
		if ((peak = pack_peak(P, k + 1)) <= N)
			return peak;
		if (next >= latest)
			return -1;
	}
}

/* Every lane's plan at horizon T, placed greedily as the header says;
 * 1 when every lane has one that keeps the devices held within N. */
static int pack_greedy(pack_t *P);

static int pack_fits(pack_t *P, double T)
{
	const lanes_t *L = P->L;
	int nl = L->nl;
	for (int j = 0; j < nl; j++) {
		P->budget[j] = T - L->ln[j].tail;
		pack_plan_t *c = P->cand + P->cand_off[j];
		P->n_cand[j] = lane_plans(P, j, P->budget[j], c);
		P->plan[j].area = HUGE_VAL;
		for (int q = 0; q < P->n_cand[j]; q++)
			P->plan[j].area = fmin(P->plan[j].area, c[q].area);
		if (P->n_cand[j] == 0)
			return 0;
		P->order[j] = j;
	}
	for (int a = 1; a < nl; a++)
		for (int b = a; b > 0; b--) {
			if (P->plan[P->order[b]].area <= P->plan[P->order[b - 1]].area)
				break;
			int s = P->order[b];
			P->order[b] = P->order[b - 1];
			P->order[b - 1] = s;
		}
	for (int tries = 0;; tries++) {
		int k = pack_greedy(P);
		if (k < 0) {
			P->reordered |= tries > 0;
			return 1;
		}
		if (k == 0 || tries >= P->bumps)
			return 0;
		/* the lane that found no room goes first and the rest keep their order */
		int j = P->order[k];
		memmove(P->order + 1, P->order, (size_t)k * sizeof *P->order);
		P->order[0] = j;
	}
}

/* The lanes placed greedily in P->order; -1 when every one fits, else the
 * position of the first that does not. */
static int pack_greedy(pack_t *P)
{
	int nl = P->L->nl;
	/* the least areas again (a try before set plans), unless keep */
	for (int j = 0; j < nl && !P->keep; j++) {
		const pack_plan_t *c = P->cand + P->cand_off[j];
		P->plan[j].area = HUGE_VAL;
		for (int q = 0; q < P->n_cand[j]; q++)
			P->plan[j].area = fmin(P->plan[j].area, c[q].area);
	}
	int so_far = 0; /* most devices held at once by the lanes placed */
	for (int k = 0; k < nl; k++) {
		pack_fix(P, k);
		int j = P->order[k], np = P->n_cand[j], best = -1;
		pack_plan_t *cand = P->cand + P->cand_off[j];
		double flat = P->plan[j].area * (1 + P->delta);
		int best_peak = 0, nrest = 0;
		/* the flat plans (least area within delta): the lowest peak, the
		 * narrowest, the least area */
		for (int q = 0; q < np; q++) {
			pack_plan_t *c = &cand[q];
			if (c->area > flat) {
				P->rest[nrest++] = (plan_key_t){c->area, q};
				continue;
			}
			int peak = pack_place(P, k, c);
			if (peak < 0)
				continue;
			peak = SP_MAX(peak, so_far);
			const pack_plan_t *b = best >= 0 ? &cand[best] : NULL;
			if (!b || (peak != best_peak ? peak < best_peak
				   : c->hi != b->hi ? c->hi < b->hi
						    : c->area < b->area * (1 - PACK_EPS))) {
				best = q;
				best_peak = peak;
			}
		}
		/* else the first of the others, by least area, that fits */
		if (best < 0)
			plan_key_sort(P->rest, nrest);
		for (int i = 0; best < 0 && i < nrest; i++)
			if ((best_peak = pack_place(P, k, &cand[P->rest[i].q])) >= 0)
				best = P->rest[i].q;
		if (best < 0)
			return k;
		P->plan[j] = cand[best];
		lane_intervals(P, j, &cand[best]);
		so_far = SP_MAX(so_far, best_peak);
	}
	return -1;
}

/* 1 when a slice of MetaOp mo ends before its layer y: its first layers
 * run as slices of 1 and 2 layers (cut at layers 1 and 3), the rest as
 * long as the phase. The lowering buckets a gradient with the others of
 * the first slice that uses it (each slice cut into up to SYNC_CHUNKS
 * chunks), and a lane's first layers are the last of its backward: in one
 * slice of a whole phase they would all-reduce in a bucket of several
 * layers after the last backward, none of it overlapped. (Cuts at 1 only,
 * or at 1, 3 and 7, made slower plans of the CLIP rows than 1 and 3.) */
static int head_cut(const metaop_t *mo, int y)
{
	return !mo->sink && (y == 1 || y == 3);
}

/* The slots of a hi-phase slice of hi devices whose lo core devices
 * (ascending: the lo phase's slots) run the lo phase: core slot c takes
 * hi slot r_c = floor((2c + 1) hi / (2 lo)), the one holding the middle
 * sample of c's lo range [c B / lo, (c + 1) B / lo) (sample_range), and
 * the phase devices (ascending) the others. So at the hand-over each core
 * device keeps about B / hi of its samples; in ascending order (what a
 * slice's devices are elsewhere) core slot c sits at hi slot c or later
 * and keeps none past the first hi / (hi - lo) slots: nearly every
 * sample's activations (and gradients, backward) cross devices. r_c
 * rises by hi / lo >= 1 per c: distinct, and r_{lo-1} < hi. */
static void hand_over_order(const int32_t *core, int lo, const int32_t *phase, int hi,
			    int32_t *out)
{
	for (int r = 0, c = 0, q = 0; r < hi; r++)
		if (c < lo && r == (2 * c + 1) * hi / (2 * lo))
			out[r] = core[c++];
		else
			out[r] = phase[q++];
}

/* Lane j's steps on its devices (core: its lo, then its hi-phase ones);
 * finish and free_at as lanes_joins reads them. */
static int lane_emit(pack_t *P, int j, int32_t *core, int32_t *phase, double *finish,
		     double *free_at, int32_t *devs, sched_t *out)
{
	const pack_plan_t *p = &P->plan[j];
	int n = lane_steps(P, j), rc;
	double t = P->iv_s[j];
	devs_sort(core, p->lo);
	devs_sort(phase, p->hi - p->lo);
	for (int s = 0; s < n;) {
		int x = P->s_first[j] + s, m = P->s_m[x];
		int in_hi = !p->lo || (p->desc ? s < p->l : s >= n - p->l);
		if (p->lo && s == (p->desc ? p->l : n - p->l))
			t += hand_over_ms(P, j, p->hi); /* the change of width */
		const metaop_t *mo = &P->pl->mops[m];
		int held = in_hi ? p->hi : p->lo, k = lane_width(mo, held), e = s + 1;
		/* the steps after it of the same MetaOp in the same phase, up
		 * to a head cut */
		while (e < n && P->s_m[P->s_first[j] + e] == m &&
		       (!p->lo || (p->desc ? e < p->l : e >= n - p->l) == in_hi) &&
		       !head_cut(mo, P->s_lf[P->s_first[j] + e]))
			e++;
		/* the hand-over order interleaves core and joining devices: a
		 * tensor-parallel group of consecutive slots would span both,
		 * so only where the width is priced unsplit (t = 1) */
		if (P->ho && in_hi && p->lo && k == p->hi && k <= mo->nmax && mo->tpn[k] == 1) {
			hand_over_order(core, p->lo, phase, p->hi, devs);
		} else {
			for (int q = 0; q < p->lo; q++)
				devs[q] = core[q];
			for (int q = 0; in_hi && q < p->hi - p->lo; q++)
				devs[p->lo + q] = phase[q];
			devs_sort(devs, held);
		}
		double t1 = t;
		for (int y = s; y < e; y++) {
			int z = P->s_first[j] + y;
			t1 += (P->s_lt[z] - P->s_lf[z]) * mop_t(mo, k);
		}
		if ((rc = sched_push_devs(out, m, P->s_lf[x], P->s_lt[P->s_first[j] + e - 1], k, t,
					  t1, devs)))
			return rc;
		for (int q = 0; q < k; q++)
			free_at[devs[q]] = fmax(free_at[devs[q]], t1);
		t = t1;
		if (P->s_lt[P->s_first[j] + e - 1] == mo->n_layers)
			finish[m] = t1;
		s = e;
	}
	return 0;
}

/* SCHED_PACK_TAILS: the parameter state each device holds, per
 * (component, layer) slot, and the optimizer step it takes. */
typedef struct {
	int *base;       /* per component: its first slot */
	int n_slots;
	uint8_t *held;   /* [device][slot] */
	double *ms;      /* [device]: the optimizer step of what it holds */
	double unit_ms;  /* the step of one element */
} pack_state_t;

static int state_init(const pack_t *P, pack_state_t *S)
{
	const planner_t *pl = P->pl;
	sp_arena_t *a = &P->pl->scratch;
	if (!(S->base = sp_arena_calloc(a, (size_t)pl->model->n_comps + 1, sizeof(int))))
		return SP_ENOMEM;
	for (int k = 0; k < pl->model->n_comps; k++) {
		S->base[k] = S->n_slots;
		const sp_component_t *c = &pl->model->comps[k];
		S->n_slots += c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
	}
	S->held = sp_arena_calloc(a, (size_t)pl->N * (size_t)(S->n_slots + 1), 1);
	S->ms = sp_arena_calloc(a, (size_t)pl->N + 1, sizeof(double));
	S->unit_ms = cost_step_ms(pl, 1);
	return S->held && S->ms ? 0 : SP_ENOMEM;
}

/* The slot of MetaOp m's layer l, and its step (*ms). */
static int state_slot(const pack_t *P, const pack_state_t *S, int m, int l, double *ms)
{
	const planner_t *pl = P->pl;
	const metaop_t *mo = &pl->mops[m];
	const sp_op_t *op = &pl->ops[mo->first_op + l];
	int comp = pl->model->tasks[mo->task].nodes[op->node].comp;
	*ms = (double)comp_layer_params(&pl->model->comps[comp]) * S->unit_ms;
	return S->base[comp] + op->layer;
}

/* Device d takes a unit of lane j of kind k (0: its core, every step;
 * 1: its hi phase, the steps in it): the slots of those steps' layers
 * and their step. */
static void state_add(const pack_t *P, pack_state_t *S, int d, int j, int k)
{
	const pack_plan_t *p = &P->plan[j];
	int n = lane_steps(P, j);
	int a = !k || !p->lo || p->desc ? 0 : n - p->l, b = !k || !p->lo || !p->desc ? n : p->l;
	uint8_t *h = S->held + (size_t)d * (size_t)(S->n_slots + 1);
	double one;
	for (int s = a; s < b; s++) {
		int x = P->s_first[j] + s, m = P->s_m[x];
		for (int l = P->s_lf[x]; l < P->s_lt[x]; l++) {
			int slot = state_slot(P, S, m, l, &one);
			S->ms[d] += h[slot] ? 0 : one;
			h[slot] = 1;
		}
	}
}

/* Devices for every lane's intervals (first fit in order of start), then
 * every lane's slices and the joins. */
static int pack_emit(pack_t *P, const int *w, sched_t *out, double *est)
{
	planner_t *pl = P->pl;
	const lanes_t *L = P->L;
	int nl = L->nl, N = pl->N, G = pl->cluster->gpus_per_node, rc;
	sp_arena_t *a = &pl->scratch;
	int n_units = 0;
	for (int j = 0; j < nl; j++)
		n_units += P->plan[j].hi;
	int *uj = sp_arena_calloc(a, 2 * (size_t)n_units + 2, sizeof(int)), *uk = uj + n_units + 1;
	int32_t *dev = sp_arena_calloc(a, (size_t)n_units + (size_t)N + 2, sizeof(int32_t));
	int32_t *devs = dev + n_units + 1;
	int *node_of = sp_arena_calloc(a, (size_t)(N / SP_MAX(G, 1)) + 2, sizeof(int));
	double *busy = sp_arena_calloc(a, 2 * (size_t)N + 2, sizeof(double)), *free_at = busy + N + 1;
	double *finish = sp_arena_calloc(a, (size_t)pl->n_mops + 1, sizeof(double));
	int *first_u = sp_arena_calloc(a, (size_t)nl + 1, sizeof(int));
	if (!uj || !dev || !node_of || !busy || !finish || !first_u)
		return SP_ENOMEM;
	/* units: lane j's core (kind 0) then its hi phase (kind 1) */
	n_units = 0;
	for (int j = 0; j < nl; j++) {
		first_u[j] = n_units;
		for (int q = 0; q < P->plan[j].hi; q++) {
			uj[n_units] = j;
			uk[n_units++] = q >= P->plan[j].lo;
		}
	}
	/* by start, then lane, then kind, then index: insertion sort over a
	 * permutation (a total order) */
	int *perm = sp_arena_calloc(a, (size_t)n_units + 1, sizeof(int));
	if (!perm)
		return SP_ENOMEM;
	for (int u = 0; u < n_units; u++) {
		double su = uk[u] ? P->hs[uj[u]] : P->iv_s[uj[u]];
		int b = u;
		for (; b > 0; b--) {
			int v = perm[b - 1];
			double sv = uk[v] ? P->hs[uj[v]] : P->iv_s[uj[v]];
			if (sv < su || (sv == su && (uj[v] < uj[u] || (uj[v] == uj[u] && uk[v] <= uk[u]))))
				break;
			perm[b] = v;
		}
		perm[b] = u;
	}
	int nn = N / SP_MAX(G, 1) + 1, nk = 1;
	for (int j = 0; j < nl; j++)
		nk = SP_MAX(nk, L->ln[j].key + 1);
	/* per component: the devices and nodes that hold it so far */
	char *held = sp_arena_calloc(a, (size_t)nk * (size_t)(N + nn) + 1, 1);
	if (!held)
		return SP_ENOMEM;
	pack_state_t S = {0};
	if (P->tails && (rc = state_init(P, &S)))
		return rc;
	for (int i = 0; i < n_units; i++) {
		int u = perm[i], j = uj[u], key = L->ln[j].key;
		double s = uk[u] ? P->hs[j] : P->iv_s[j], e = uk[u] ? P->he[j] : P->iv_e[j];
		double eps = PACK_EPS * fmax(1, s);
		char *kd = held + (size_t)key * (size_t)(N + nn), *kn = kd + N;
		/* nodes the lane holds so far */
		for (int x = 0; x < nn; x++)
			node_of[x] = 0;
		for (int v = first_u[j]; v < first_u[j] + P->plan[j].hi; v++)
			if (v != u && dev[v] > 0)
				node_of[(dev[v] - 1) / SP_MAX(G, 1)] = 1;
		/* a device holding the component adds no replica; then its
		 * nodes, then the lane's */
		int pick = -1, score = -1;
		for (int d = 0; d < N; d++) {
			if (busy[d] > s + eps)
				continue;
			int x = d / SP_MAX(G, 1), sc = 4 * kd[d] + 2 * kn[x] + node_of[x];
			if (sc > score) {
				score = sc;
				pick = d;
			}
		}
		if (pick < 0)
			return SCHED_NOTHING_NEW; /* cannot happen when the peak fits */
		if (P->tails)
			state_add(P, &S, pick, j, uk[u]);
		kd[pick] = 1;
		kn[pick / SP_MAX(G, 1)] = 1;
		dev[u] = pick + 1; /* 0: none yet */
		busy[pick] = e;
	}
	for (int d = 0; d < N; d++)
		free_at[d] = 0;
	int32_t *core = sp_arena_calloc(a, 2 * (size_t)N + 2, sizeof(int32_t)), *phase = core + N + 1;
	if (!core)
		return SP_ENOMEM;
	for (int j = 0; j < nl; j++) {
		const pack_plan_t *p = &P->plan[j];
		for (int q = 0; q < p->hi; q++)
			*(q < p->lo ? &core[q] : &phase[q - p->lo]) = dev[first_u[j] + q] - 1;
		if ((rc = lane_emit(P, j, core, phase, finish, free_at, devs, out)))
			return rc;
	}
	if ((rc = lanes_joins(pl, w, L->in_lane, finish, free_at, out)))
		return rc;
	*est = 0;
	for (int d = 0; d < N; d++)
		*est = fmax(*est, free_at[d] + (P->tails ? S.ms[d] : 0));
	return 0;
}

/* The least horizon at which the plans fit (P->delta's), or HUGE_VAL;
 * *lo (when not NULL) the greatest horizon below it at which they did
 * not (or the fluid horizon, untried). */
static double pack_horizon(pack_t *P, double fluid, double *lo_out)
{
	double lo = fluid, hi = fluid * 1.01;
	for (int it = 0; !pack_fits(P, hi); it++) {
		if (it == 8)
			return HUGE_VAL; /* no fit within 2.5 times the fluid */
		lo = hi;
		hi *= 1.12;
	}
	for (int it = 0; it < PACK_ITERS; it++) {
		double mid = 0.5 * (lo + hi);
		if (pack_fits(P, mid))
			hi = mid;
		else
			lo = mid;
	}
	if (lo_out)
		*lo_out = lo;
	return pack_fits(P, hi) ? hi : HUGE_VAL;
}

/* SCHED_PACK_REORDER's horizon at P->delta (and P->keep): its bisection
 * takes the plain one's path (a retry only changes a placement that
 * failed) until a horizon where the plain placement fails and a retry
 * fits. A bound on its cost, not an equivalence: it is searched only where
 * a retry fits at the plain search's last failed horizon, else the plain
 * horizon is taken (*lo, *plain: that search, done when *plain is 0), so
 * a retry that fits only at a lower failed horizon is missed (none of the
 * bundled rows lost its gain by it). */
static double pack_horizon_reorder(pack_t *P, double fluid, double *lo, double *plain)
{
	int bumps = P->bumps;
	if (*plain == 0) {
		P->bumps = 0;
		*plain = pack_horizon(P, fluid, lo);
		P->bumps = bumps;
	}
	if (*plain == HUGE_VAL || pack_fits(P, *lo))
		return pack_horizon(P, fluid, NULL);
	return pack_fits(P, *plain) ? *plain : HUGE_VAL; /* the plans at it */
}

/* The schedule of the plans pack_fits fitted last, kept in out when its
 * estimate (pack_emit: with P->tails, the most any device's end plus its
 * optimizer step comes to; else its makespan), then its makespan, is
 * below best's (updated). */
static int pack_keep(pack_t *P, const int *w, sp_arena_t *trial, sched_t *out, double best[2])
{
	planner_t *pl = P->pl;
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	sched_t t;
	double est = 0;
	sched_init(&t, out->algo, trial);
	int rc = pack_emit(P, w, &t, &est);
	sp_arena_reset(&pl->scratch, mark);
	double ms = rc ? HUGE_VAL : sched_makespan(&t);
	est = P->tails ? est : ms;
	if (!rc && (est < best[0] * (1 - PACK_EPS) ||
		    (est <= best[0] * (1 + PACK_EPS) && ms < best[1] * (1 - PACK_EPS)))) {
		best[0] = est;
		best[1] = ms;
		rc = sched_copy(out, &t);
	}
	sp_arena_release(trial);
	return rc == SCHED_NOTHING_NEW ? 0 : rc; /* no device free: not this try */
}

int sched_pack(planner_t *pl, const int *w, int flags, sched_t *out)
{
	static const double deltas[] = {0.01, 0.02, 0.03};
	lanes_t L = {0};
	pack_t P = {0};
	sp_arena_t trial;
	sp_arena_init(&trial);
	double best[2] = {HUGE_VAL, HUGE_VAL};
	int rc;
	if ((rc = lanes_build(pl, w, &L)))
		return rc;
	/* for DAGs whose lanes are the work: the joins at their allotted
	 * widths after every lane would be the schedule's tail */
	double lanes_work = 0, all_work = 0;
	for (int m = 0; m < pl->n_mops; m++) {
		double t1 = pl->mops[m].n_layers * mop_t(&pl->mops[m], 1);
		all_work += t1;
		lanes_work += L.in_lane[m] ? t1 : 0;
	}
	if (L.nl < 2 || lanes_work < PACK_LANES_SHARE * all_work)
		return SCHED_NOTHING_NEW;
	if ((flags & (SCHED_PACK_REORDER | SCHED_PACK_TAILS)) && L.nl > PACK_REORDER_LANES)
		return SCHED_NOTHING_NEW;
	if ((rc = pack_init(&P, pl, &L)))
		return rc;
	P.asc = flags & SCHED_PACK_ASC;
	P.tails = !!(flags & SCHED_PACK_TAILS);
	if (flags & SCHED_PACK_HANDOVER) {
		size_t nh = (size_t)L.nl * (size_t)(pl->N + 1);
		if (!(P.ho = sp_arena_calloc(&pl->scratch, nh + 1, sizeof(double))))
			return SP_ENOMEM;
		for (size_t i = 0; i < nh; i++)
			P.ho[i] = -1;
	}
	P.bumps = flags & SCHED_PACK_REORDER ? L.nl : 0;
	double fluid = lanes_horizon(&L, pl->N);
	/* reorder: every delta with the least areas, then with keep those
	 * whose first search fitted on a retry */
	size_t nd = sizeof deltas / sizeof *deltas, nk = P.bumps ? 2 : 1;
	unsigned retried = 0; /* per delta: the first search fitted on a retry */
	double lo[sizeof deltas / sizeof *deltas], plain[sizeof deltas / sizeof *deltas] = {0};
	for (size_t i = 0; i < nk * nd; i++) {
		P.delta = deltas[i % nd];
		P.keep = i >= nd;
		if (P.keep && !(retried >> (i % nd) & 1))
			continue;
		int before = P.reordered;
		P.reordered = 0;
		double T = P.bumps ? pack_horizon_reorder(&P, fluid, &lo[i % nd], &plain[i % nd])
				   : pack_horizon(&P, fluid, NULL);
		retried |= P.keep ? 0 : (unsigned)P.reordered << i;
		P.reordered |= before;
		if (T == HUGE_VAL)
			continue;
		if ((rc = pack_keep(&P, w, &trial, out, best)))
			break;
	}
	sp_arena_release(&trial);
	if (!rc && (best[0] == HUGE_VAL || (P.bumps && !P.reordered)))
		return SCHED_NOTHING_NEW; /* reorder: the same schedule as without */
	return rc;
}
