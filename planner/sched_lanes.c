/*
 * sched_lanes.c — lanes: our schedule for DAGs of independent chains
 * (CLIP-style workloads), the devices shared as a fluid made integral with
 * McNaughton's wrap-around rule, with an optional end game and middle
 * step, calibrated over a few rounds (sched_lanes). It uses the widths
 * allot.c chose for the MetaOps outside lanes and does not choose widths
 * otherwise; it keeps nothing between calls.
 */
#include "planner.h"
#include "sort.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
	double key;
	int id;
} dev_key_t;

/* By key, then id (distinct: a total order, sort.h). */
#define DEV_KEY_BEFORE(x, y) ((x).key < (y).key || ((x).key == (y).key && (x).id < (y).id))
SP_SORT_DEFINE(dev_key_sort, dev_key_t, DEV_KEY_BEFORE)

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
 * LANE_SPLIT_MID_STEP: the gang's share in two steps. Shares end mid-layer, and a lane
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
		if (k <= hv->nmax && width_gains(hv, k) && (k - lo) * mop_t(hv, k) <= left &&
		    (!best || mop_t(hv, k) < mop_t(hv, best)))
			best = k;
	*step = pre + whole * per;
	return best;
}


int lanes_build(planner_t *pl, const int *w, lanes_t *L)
{
	int M = pl->n_mops, N = pl->N, nm = 0;
	sp_arena_t *a = &pl->scratch;
	L->ln = sp_arena_calloc(a, (size_t)M + 1, sizeof *L->ln);
	L->lm = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	L->in_lane = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	double *time = sp_arena_calloc(a, (size_t)N + 1, sizeof(double));
	double *bl = sp_arena_calloc(a, (size_t)M + 1, sizeof(double));
	if (!L->ln || !L->lm || !L->in_lane || !time || !bl)
		return SP_ENOMEM;
	sched_blevels(pl, w, bl);
	for (int m = 0; m < M; m++) {
		if (pl->mops[m].n_pred)
			continue;
		lane_t *l = &L->ln[L->nl++];
		l->first = nm;
		double heavy = -1;
		for (int cur = m;;) {
			const metaop_t *mo = &pl->mops[cur];
			L->lm[nm++] = cur;
			L->in_lane[cur] = 1;
			l->n++;
			if (mo->n_layers * mop_t(mo, 1) > heavy) {
				int lay;
				heavy = mo->n_layers * mop_t(mo, 1);
				l->key = mop_comp(pl, cur, 0, &lay);
				l->heavy = cur;
			}
			if (mo->n_succ != 1 || pl->mops[pl->edges[mo->succ[0]].dst].n_pred != 1)
				break;
			cur = pl->edges[mo->succ[0]].dst;
		}
		int last = L->lm[nm - 1];
		const metaop_t *lo = &pl->mops[last];
		l->tail = bl[last] - lo->n_layers * mop_t(lo, w[last]);
		for (int k = 1; k <= N; k++) {
			time[k] = 0;
			for (int i = l->first; i < nm; i++) {
				const metaop_t *mo = &pl->mops[L->lm[i]];
				time[k] += mo->n_layers * mop_t(mo, lane_width(mo, k));
			}
		}
		int rc = hull_from_times(a, time, N, 1, &l->hull);
		if (rc)
			return rc;
	}
	return 0;
}

double lanes_horizon(const lanes_t *L, int N)
{
	double lo = 0, hi;
	for (int j = 0; j < L->nl; j++)
		lo = fmax(lo, L->ln[j].hull.t[0]);
	hi = fmax(lo, 1e-9);
	for (int it = 0; it < 200 && lanes_need(L->ln, L->nl, hi) > N; it++)
		hi *= 2;
	if (lanes_need(L->ln, L->nl, lo) <= N)
		hi = lo;
	for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; it++) {
		double mid = 0.5 * (lo + hi);
		if (lanes_need(L->ln, L->nl, mid) <= N)
			hi = mid;
		else
			lo = mid;
	}
	return hi;
}

/* One try: a way to split, whether there is an end game, and when it
 * begins (a fraction of H). */
typedef struct {
	lane_split_t split;
	int endgame;
	double cut;
	int apart; /* lanes_opts_t's */
} lane_try_t;

/* The state of one try. A window is a device a lane may use from ws to
 * we; the current lane's windows are wd/ws/we[0 .. nw). */
typedef struct {
	planner_t *pl;
	const int *w;
	lanes_t *L;
	lane_try_t try_;
	sched_t *out;
	int *mids;
	double H;
	int cur;             /* layout: the first device not wholly laid out */
	int *ord;            /* lanes in layout order */
	double *free_at;     /* per device: when its last slice ends */
	double *finish;      /* per MetaOp */
	int *comp_on;        /* per device: the key of the last lane on it */
	double *free_from;   /* per device: where the lanes laid out so far leave it */
	double *orph_from, *orph_to; /* per device: a window a lane left unused */
	int *orph_key;       /* and the key of that lane */
	int *win_of;         /* per device: lane_windows' first window on it (-1: none) */
	int prev_key;        /* the key of the lane laid out last (-1: none) */
	int block_end;       /* components apart: the lane is its block's last */
	double *ws, *we;
	int *wd, nw;
	int *cand;           /* windows usable at a time */
	int32_t *devs;
	dev_key_t *byfree;
	pend_t pd;
	/* end game, per lane: MetaOp (-1: none left), layer, time, remaining
	 * work, its last slice */
	int *eg_i, *eg_layer, *eg_last;
	double *eg_t, *eg_rem;
	double *lane_end;    /* per lane: when it ends, its tail included */
} lanes_run_t;

static int lanes_run_init(lanes_run_t *R, planner_t *pl)
{
	int M = pl->n_mops, N = pl->N;
	sp_arena_t *a = &pl->scratch;
	size_t n = (size_t)N + 2, m = (size_t)M + 1;
	/* carved from three blocks: per device (n) and per lane or MetaOp (m) */
	double *dbl = sp_arena_calloc(a, 6 * n + 3 * m, sizeof(double));
	int *ints = sp_arena_calloc(a, 5 * n + 4 * m, sizeof(int));
	int32_t *ids = sp_arena_calloc(a, 2 * n, sizeof(int32_t));
	R->byfree = sp_arena_calloc(a, n, sizeof(dev_key_t));
	if (!dbl || !ints || !ids || !R->byfree)
		return SP_ENOMEM;
	R->free_at = dbl, R->free_from = dbl + n, R->orph_from = dbl + 2 * n;
	R->orph_to = dbl + 3 * n, R->ws = dbl + 4 * n, R->we = dbl + 5 * n;
	R->finish = dbl + 6 * n, R->eg_t = R->finish + m, R->eg_rem = R->finish + 2 * m;
	R->comp_on = ints, R->wd = ints + n, R->cand = ints + 2 * n;
	R->ord = ints + 3 * n, R->eg_i = R->ord + m, R->eg_layer = R->ord + 2 * m;
	R->eg_last = R->ord + 3 * m;
	R->orph_key = R->eg_last + m;
	R->win_of = R->orph_key + n;
	R->prev_key = -1;
	R->devs = ids, R->pd.devs = ids + n;
	for (int m = 0; m < M; m++)
		R->eg_i[m] = R->eg_last[m] = -1;
	for (int d = 0; d < N; d++) {
		R->comp_on[d] = -1;
		R->orph_from[d] = R->orph_to[d] = -1;
		R->win_of[d] = -1;
	}
	return 0;
}

/*
 * Components apart: the lanes of one component (a block, consecutive in
 * layout order) get a whole number of devices together, the blocks' fluid
 * totals X_b rounded by largest remainder (at least one device each while
 * devices last) to integers summing to N, each lane's x scaled by
 * D_b / X_b. Blocks then meet at device boundaries, and align.c can lay
 * each on nodes of its own. (Rounding large blocks to whole nodes here
 * instead was tried: on 32 tasks over 1024 H100 it cost more compute, in
 * the lanes that wait for a shrunk block, than it saved in sync.)
 */
static int lanes_blocks_whole(lanes_run_t *R)
{
	lane_t *ln = R->L->ln;
	int nl = R->L->nl, N = R->pl->N, *ord = R->ord, nb = 0, given = 0;
	/* per block: first lane (layout position), total, devices */
	sp_arena_t *a = &R->pl->scratch; /* the try's scope */
	int *first = sp_arena_calloc(a, 2 * (size_t)nl + 2, sizeof(int)), *dev = first + nl + 1;
	double *tot = sp_arena_calloc(a, 2 * (size_t)nl + 2, sizeof(double)), *frac = tot + nl + 1;
	if (!first || !tot)
		return SP_ENOMEM;
	for (int o = 0; o < nl; o++)
		if (o == 0 || ln[ord[o]].key != ln[ord[o - 1]].key) {
			first[nb] = o;
			tot[nb++] = 0;
		}
	first[nb] = nl;
	for (int b = 0; b < nb; b++) {
		for (int o = first[b]; o < first[b + 1]; o++)
			tot[b] += ln[ord[o]].x;
		dev[b] = SP_MAX(1, (int)floor(tot[b] + 1e-9));
		frac[b] = tot[b] - dev[b];
		given += dev[b];
	}
	while (given < N) { /* largest remainders first, ties by position */
		int best = 0;
		for (int b = 1; b < nb; b++)
			if (frac[b] > frac[best])
				best = b;
		dev[best]++;
		frac[best] -= 1;
		given++;
	}
	while (given > N) { /* more blocks than devices: the least remainders give */
		int best = -1;
		for (int b = 0; b < nb; b++)
			if (dev[b] > 1 && (best < 0 || frac[b] < frac[best]))
				best = b;
		if (best < 0)
			break;
		dev[best]--;
		frac[best] += 1;
		given--;
	}
	for (int b = 0; b < nb; b++)
		for (int o = first[b]; o < first[b + 1] && tot[b] > 0; o++)
			ln[ord[o]].x *= dev[b] / tot[b];
	return 0;
}

/* Fluid widths x_j at H, each corrected by adj[j] (calibration), rescaled
 * to N; layout order: by component, then widest first, then id. Components
 * apart: blocks of whole devices (lanes_blocks_whole). */
static int lanes_widths(lanes_run_t *R, const double *adj)
{
	lane_t *ln = R->L->ln;
	int nl = R->L->nl, N = R->pl->N, *ord = R->ord;
	double H = R->H, sum = 0;
	for (int j = 0; j < nl; j++) {
		ln[j].x = hull_area(&ln[j].hull, H) / H * adj[j];
		sum += ln[j].x;
		ord[j] = j;
	}
	for (int j = 0; j < nl && sum > 0; j++) /* corrections keep the total */
		ln[j].x *= N / sum;
	for (int a = 1; a < nl; a++)
		for (int b = a; b > 0; b--) {
			const lane_t *x = &ln[ord[b]], *y = &ln[ord[b - 1]];
			if (x->key > y->key || (x->key == y->key && x->x <= y->x))
				break;
			int s = ord[b];
			ord[b] = ord[b - 1];
			ord[b - 1] = s;
		}
	return R->try_.apart ? lanes_blocks_whole(R) : 0;
}

static void add_window(lanes_run_t *R, int d, double from, double to)
{
	R->wd[R->nw] = d;
	R->ws[R->nw] = from;
	R->we[R->nw++] = to;
}

/*
 * Whole devices and a share of one more, for the device-time A left to
 * lane l. When the two widths the lane's hull mixes at H are further apart
 * (the local batch ceil(B/n) does not shrink in between), it gets lo whole
 * devices and hi - lo devices for an equal share each instead.
 */
static void lane_whole_and_share(lanes_run_t *R, const lane_t *l, double A)
{
	const planner_t *pl = R->pl;
	int N = pl->N, split = R->try_.split;
	double H = R->H;
	const hull_t *hl = &l->hull;
	const metaop_t *hv = &pl->mops[l->heavy];
	int held = 0, k = (int)floor(A / H + 1e-12), lo = 0, hi = 0;
	for (int q = 0; q < R->nw; q++)
		held += R->we[q] >= H * (1 - 1e-12);
	if (split == LANE_SPLIT_HULL || split == LANE_SPLIT_MID_STEP) {
		for (int q = 0; q + 1 < hl->n; q++)
			if (hl->t[q] <= H && H < hl->t[q + 1]) {
				hi = (int)lround(hl->a[q] / hl->t[q]);
				lo = (int)lround(hl->a[q + 1] / hl->t[q + 1]);
			}
	} else if (split == LANE_SPLIT_NEAREST && hv->scales && held + k > 1 &&
		   held + k <= hv->nmax) {
		/* the widths that gain around the one left after the share */
		lo = width_floor(hv, held + k);
		hi = held + k + 1;
		while (hi <= hv->nmax && !width_gains(hv, hi))
			hi++;
	}
	int whole = k, gang = 0;
	if (!R->block_end && hi - lo >= 2 && lo >= held && A - (lo - held) * H <= (hi - lo) * H &&
	    A > (lo - held) * H && R->cur + (hi - held) <= N) {
		whole = lo - held;
		gang = hi - lo;
	}
	for (int q = 0; q < whole && R->cur < N; q++) {
		add_window(R, R->cur, 0, H);
		R->free_from[R->cur++] = H;
		A -= H;
	}
	double share = gang ? A / gang : A, step = share;
	int mid = 0;
	if (split == LANE_SPLIT_MID_STEP && gang)
		*R->mids += (mid = mid_step(pl, R->L->lm + l->first, l->n, l->heavy, lo, hi,
					    share, &step)) > 0;
	int first = R->cur;
	for (int q = 0; q < SP_MAX(gang, 1) && R->cur < N && share > 1e-9 * H; q++) {
		double len = fmin(mid ? step + (q < mid - lo) * mop_t(hv, mid) : share, H);
		add_window(R, R->cur, 0, len);
		R->free_from[R->cur++] = len;
	}
	R->cur = SP_MIN(first, N); /* the next lane has the rest of these */
	while (R->cur < N && R->free_from[R->cur] >= H * (1 - 1e-12))
		R->cur++;
}

/* Lane l's windows by McNaughton's rule: the rest of the device the lane
 * before began, whole devices and shares, and windows lanes before left
 * unused. */
static void lane_windows(lanes_run_t *R, const lane_t *l)
{
	int N = R->pl->N;
	double H = R->H, A = l->x * H;
	R->nw = 0;
	if (R->try_.apart && R->prev_key != l->key) /* a new block: fresh devices */
		while (R->cur < N && R->free_from[R->cur] > 0)
			R->cur++;
	R->prev_key = l->key;
	while (R->cur < N && A > 1e-9 * H && R->free_from[R->cur] > 0) {
		/* the rest of a device the lane before began */
		int c = R->cur;
		double len = fmin(H - R->free_from[c], A);
		add_window(R, c, R->free_from[c], R->free_from[c] + len);
		A -= len;
		R->free_from[c] += len;
		if (R->free_from[c] >= H * (1 - 1e-12))
			R->cur++;
	}
	if (R->cur < N && A > 1e-9 * H)
		lane_whole_and_share(R, l, A);
	/* windows lanes before left unused (a width between two fast ones
	 * saves nothing): this lane may have them. A window added here is on
	 * a device the loop has passed, so each device's first window among
	 * those laid out before it (win_of) is the one a scan would find */
	int nw0 = R->nw;
	for (int k = nw0 - 1; k >= 0; k--)
		R->win_of[R->wd[k]] = k;
	for (int d = 0; d < N; d++) {
		if (R->orph_to[d] < 0 || (R->try_.apart && R->orph_key[d] != l->key))
			continue;
		int k = R->win_of[d];
		if (k >= 0) {
			if (R->orph_to[d] >= R->ws[k] - 1e-9)
				R->ws[k] = fmin(R->ws[k], R->orph_from[d]);
			continue;
		}
		add_window(R, d, R->orph_from[d], R->orph_to[d]);
	}
	for (int k = 0; k < nw0; k++)
		R->win_of[R->wd[k]] = -1;
	if (R->nw == 0) /* rounding left it no room: the last device */
		add_window(R, N - 1, 0, H);
}

/* The windows usable at t into cand; *next: when the next one opens. */
static int open_windows(lanes_run_t *R, double t, double *next)
{
	int nc = 0;
	*next = HUGE_VAL;
	for (int k = 0; k < R->nw; k++) {
		double from = fmax(R->ws[k], R->free_at[R->wd[k]]);
		if (from <= t + 1e-9 && t < R->we[k] - 1e-9)
			R->cand[nc++] = k;
		else if (from > t + 1e-9 && from < R->we[k] - 1e-9)
			*next = fmin(*next, from);
	}
	return nc;
}

/* Every window is over: run on where no lane follows (windows to the
 * horizon), else on the last to end; *t moves to when one is free. */
static int windows_after_all(lanes_run_t *R, int m, int layer, double *t)
{
	double last = 0, first = HUGE_VAL;
	int nc = 0, rc;
	for (int q = 0; q < R->nw; q++)
		last = fmax(last, R->we[q]);
	for (int q = 0; q < R->nw; q++)
		if (R->we[q] >= fmin(last, R->H) - 1e-9)
			first = fmin(first, fmax(R->ws[q], R->free_at[R->wd[q]]));
	if (first > *t + 1e-9 && (rc = pend_flush(R->out, m, &R->pd, layer, *t)))
		return rc;
	*t = fmax(*t, first);
	for (int q = 0; q < R->nw; q++)
		if (R->we[q] >= fmin(last, R->H) - 1e-9 &&
		    fmax(R->ws[q], R->free_at[R->wd[q]]) <= *t + 1e-9)
			R->cand[nc++] = q;
	return nc;
}

/* Of nc windows open at t, longest first, the devices for r layers of
 * mo: a window ending before the horizon is kept only if at least half
 * the layers fit in it (a window to the horizon has no lane after it).
 * Returns the width; the devices are in R->devs, ascending. */
static int choose_devices(lanes_run_t *R, const metaop_t *mo, int nc, int r, double t)
{
	int *cand = R->cand, n = nc, k;
	for (int a = 1; a < nc; a++)
		for (int b = a; b > 0 && R->we[cand[b]] > R->we[cand[b - 1]]; b--) {
			int s = cand[b];
			cand[b] = cand[b - 1];
			cand[b - 1] = s;
		}
	for (;;) {
		k = lane_width(mo, n);
		double dur = r * mop_t(mo, k);
		double left = R->we[cand[k - 1]] - t;
		if (k > 1 && R->we[cand[k - 1]] < R->H - 1e-9 && left < 0.5 * dur)
			n = k - 1;
		else
			break;
	}
	for (int q = 0; q < k; q++)
		R->devs[q] = R->wd[cand[q]];
	devs_sort(R->devs, k);
	return k;
}

/* Runs r layers of m from `layer` at t on k devices R->devs, extending
 * the pending slice when the devices are the same. */
static int run_layers(lanes_run_t *R, int m, int layer, int r, int k, int key, double *t)
{
	pend_t *pd = &R->pd;
	int rc;
	if (pd->n != k || memcmp(pd->devs, R->devs, sizeof(int32_t) * (size_t)k)) {
		if ((rc = pend_flush(R->out, m, pd, layer, *t)))
			return rc;
		pd->n = k;
		pd->lf = layer;
		pd->t0 = *t;
		memcpy(pd->devs, R->devs, sizeof(int32_t) * (size_t)k);
	}
	*t += r * mop_t(&R->pl->mops[m], k);
	for (int q = 0; q < k; q++) {
		R->free_at[R->devs[q]] = *t;
		R->comp_on[R->devs[q]] = key;
	}
	return 0;
}

/* Lane j (layout position oj) through its windows, layer by layer. With
 * the end game, it stops when every window is over or the end game begins
 * (the end game has the rest). */
static int lane_run(lanes_run_t *R, int j)
{
	const lane_t *l = &R->L->ln[j];
	double t = 0, cut_t = R->try_.cut * R->H;
	int rc;
	for (int i = l->first; i < l->first + l->n; i++) {
		int m = R->L->lm[i];
		const metaop_t *mo = &R->pl->mops[m];
		R->pd.n = 0;
		R->pd.lf = 0;
		for (int layer = 0; layer < mo->n_layers;) {
			double next;
			int nc = open_windows(R, t, &next);
			if (nc == 0 && next < HUGE_VAL) {
				if ((rc = pend_flush(R->out, m, &R->pd, layer, t)))
					return rc;
				t = next;
				continue;
			}
			if (R->try_.endgame && (nc == 0 || t >= cut_t)) {
				if ((rc = pend_flush(R->out, m, &R->pd, layer, t)))
					return rc;
				R->eg_i[j] = i - l->first;
				R->eg_layer[j] = layer;
				R->eg_t[j] = t;
				return 0;
			}
			if (nc == 0 && (nc = windows_after_all(R, m, layer, &t)) < 0)
				return nc;
			int r = mo->sink ? mo->n_layers - layer : 1;
			int k = choose_devices(R, mo, nc, r, t);
			if ((rc = run_layers(R, m, layer, r, k, l->key, &t)))
				return rc;
			layer += r;
		}
		if ((rc = pend_flush(R->out, m, &R->pd, mo->n_layers, t)))
			return rc;
		R->finish[m] = t;
	}
	R->lane_end[j] = t + l->tail;
	return 0;
}

/* The windows lane j left unused, for the lanes after it. */
static void lane_orphans(lanes_run_t *R, int key)
{
	for (int k = 0; k < R->nw; k++) {
		int d = R->wd[k];
		double from = fmax(R->ws[k], R->free_at[d]);
		R->orph_from[d] = R->orph_to[d] = -1;
		R->orph_key[d] = key;
		if (from < R->we[k] - 1e-9) {
			R->orph_from[d] = from;
			R->orph_to[d] = R->we[k];
		}
	}
}

/* The end-game lane that can start first (most remaining work on ties);
 * eg_rem and *tot: remaining single-device work. -1: none left. */
static int endgame_next(lanes_run_t *R, double *tot)
{
	const lanes_t *L = R->L;
	int j = -1;
	*tot = 0;
	for (int q = 0; q < L->nl; q++) {
		if (R->eg_i[q] < 0)
			continue;
		R->eg_rem[q] = 0;
		for (int i = R->eg_i[q]; i < L->ln[q].n; i++) {
			const metaop_t *mo = &R->pl->mops[L->lm[L->ln[q].first + i]];
			R->eg_rem[q] += (mo->n_layers - (i == R->eg_i[q] ? R->eg_layer[q] : 0)) *
					mop_t(mo, 1);
		}
		*tot += R->eg_rem[q];
		if (j < 0 || R->eg_t[q] < R->eg_t[j] - 1e-9 ||
		    (R->eg_t[q] < R->eg_t[j] + 1e-9 && R->eg_rem[q] > R->eg_rem[j]))
			j = q;
	}
	return j;
}

/*
 * The end game: lanes that outran their windows go on, the one that can
 * start first next, on the devices free then, at most its share of the
 * cluster by remaining work (single-device time). Only devices that last
 * ran the lane's component (fewer new replicas to synchronise), the most
 * recently freed first.
 */
static int lanes_endgame(lanes_run_t *R)
{
	const lanes_t *L = R->L;
	int N = R->pl->N, rc;
	sched_t *out = R->out;
	for (;;) {
		double tot;
		int j = endgame_next(R, &tot);
		if (j < 0)
			return 0;
		const lane_t *l = &L->ln[j];
		int m = L->lm[l->first + R->eg_i[j]], layer = R->eg_layer[j];
		const metaop_t *mo = &R->pl->mops[m];
		double t = R->eg_t[j], soonest = HUGE_VAL;
		int na = 0, own = 0;
		for (int d = 0; d < N; d++)
			own += R->comp_on[d] == l->key;
		for (int d = 0; d < N; d++) {
			if (own && R->comp_on[d] != l->key)
				continue;
			if (R->free_at[d] <= t + 1e-9)
				R->byfree[na++] = (dev_key_t){-R->free_at[d], d};
			else
				soonest = fmin(soonest, R->free_at[d]);
		}
		if (na == 0) {
			R->eg_t[j] = soonest;
			continue;
		}
		dev_key_sort(R->byfree, na);
		int cap = SP_MAX(1, (int)ceil(N * R->eg_rem[j] / tot - 1e-9));
		int k = lane_width(mo, SP_MIN(na, cap)), r = mo->sink ? mo->n_layers - layer : 1;
		for (int q = 0; q < k; q++)
			R->devs[q] = R->byfree[q].id;
		devs_sort(R->devs, k);
		double t1 = t + r * mop_t(mo, k);
		sslice_t *last = R->eg_last[j] >= 0 ? &out->s[R->eg_last[j]] : NULL;
		if (last && last->metaop == m && last->lt == layer && last->n == k &&
		    fabs(last->t1 - t) < 1e-9 &&
		    !memcmp(out->devs + last->dev_off, R->devs, sizeof(int32_t) * (size_t)k)) {
			last->lt += r;
			last->t1 = t1;
		} else {
			if ((rc = sched_push_devs(out, m, layer, layer + r, k, t, t1, R->devs)))
				return rc;
			R->eg_last[j] = out->n - 1;
		}
		for (int q = 0; q < k; q++) {
			R->free_at[R->devs[q]] = t1;
			R->comp_on[R->devs[q]] = l->key;
		}
		R->eg_t[j] = t1;
		R->eg_layer[j] += r;
		if (R->eg_layer[j] == mo->n_layers) {
			R->finish[m] = t1;
			R->eg_layer[j] = 0;
			if (++R->eg_i[j] == l->n) {
				R->eg_i[j] = -1;
				R->lane_end[j] = t1 + l->tail;
			}
		}
	}
}

int lanes_joins(planner_t *pl, const int *w, const int *in_lane, double *finish,
		double *free_at, sched_t *out)
{
	int N = pl->N, rc;
	dev_key_t *byfree = sp_arena_calloc(&pl->scratch, (size_t)N + 1, sizeof *byfree);
	int32_t *devs = sp_arena_calloc(&pl->scratch, (size_t)N + 1, sizeof *devs);
	if (!byfree || !devs)
		return SP_ENOMEM;
	for (int q = 0; q < pl->n_mops; q++) {
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
		dev_key_sort(byfree, N);
		double t0 = ready;
		for (int i = 0; i < k; i++) {
			devs[i] = byfree[i].id;
			t0 = fmax(t0, free_at[devs[i]]);
		}
		devs_sort(devs, k);
		double t1 = t0 + mo->n_layers * mop_t(mo, k);
		if ((rc = sched_push_devs(out, m, 0, mo->n_layers, k, t0, t1, devs)))
			return rc;
		for (int i = 0; i < k; i++)
			free_at[devs[i]] = t1;
		finish[m] = t1;
	}
	return 0;
}

/*
 * One try: the horizon, the fluid widths (corrected by adj), then lane by
 * lane in layout order its windows and its layers, the end game, and the
 * joins. lane_end[j]: when lane j ends (its tail included); *horizon: H.
 */
static int lanes_try(planner_t *pl, const int *w, lanes_t *L, const lane_try_t *try_,
		     const double *adj, double *lane_end, double *horizon, int *mids,
		     sched_t *out)
{
	lanes_run_t R = {.pl = pl, .w = w, .L = L, .try_ = *try_, .out = out, .mids = mids,
			 .lane_end = lane_end};
	int rc;
	if ((rc = lanes_run_init(&R, pl)))
		return rc;
	R.H = *horizon = lanes_horizon(L, pl->N);
	if ((rc = lanes_widths(&R, adj)))
		return rc;
	for (int oj = 0; oj < L->nl; oj++) {
		int j = R.ord[oj];
		R.block_end = R.try_.apart &&
			      (oj + 1 == L->nl || L->ln[R.ord[oj + 1]].key != L->ln[j].key);
		lane_windows(&R, &L->ln[j]);
		if ((rc = lane_run(&R, j)))
			return rc;
		lane_orphans(&R, L->ln[j].key);
	}
	if ((rc = lanes_endgame(&R)))
		return rc;
	return lanes_joins(pl, w, L->in_lane, R.finish, R.free_at, out);
}

/*
 * Lanes with each way of splitting a lane's last devices in o's splits,
 * each calibrated a few rounds: layers are whole and widths integral, so a
 * lane ends a little before or after H; the next round gives each lane
 * (1 + its lateness / H) times its width, all rescaled to N. With the end
 * game, also each of a few cuts (when the end game begins). The shortest
 * schedule wins.
 *
 * Memory: each try's work arrays live in a scope of pl->scratch reset after
 * it; its schedule grows in a separate arena, reset too, so the best so
 * far is copied into out (below every try's scope) before the reset.
 */
int sched_lanes(planner_t *pl, const int *w, const lanes_opts_t *o, int *mids,
		sched_t *out)
{
	static const double cuts[] = {1.0, 0.94, 0.97, 0.9};
	int big = pl->N > LANES_BIG_CLUSTER; /* fewer tries: each costs more there */
	int n_cuts = o->endgame ? (big ? 2 : 4) : 1, rounds = big ? 1 : o->rounds, rc;
	lanes_t L = {0};
	sp_arena_t trial;
	sp_arena_init(&trial);
	double best_ms = HUGE_VAL;
	double *adj = sp_arena_calloc(&pl->scratch, (size_t)pl->n_mops + 1, sizeof(double));
	double *end = sp_arena_calloc(&pl->scratch, (size_t)pl->n_mops + 1, sizeof(double));
	if (!adj || !end)
		return SP_ENOMEM;
	if ((rc = lanes_build(pl, w, &L)))
		goto done;
	for (int k = 0; k < o->n_splits * n_cuts; k++) {
		lane_try_t tr = {(lane_split_t)(o->first_split + k % o->n_splits), o->endgame,
				 cuts[k / o->n_splits], o->apart};
		for (int j = 0; j < L.nl; j++)
			adj[j] = 1;
		for (int round = 0; round < rounds; round++) {
			sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
			sched_t t;
			double H = 0;
			sched_init(&t, out->algo, &trial);
			rc = lanes_try(pl, w, &L, &tr, adj, end, &H, mids, &t);
			sp_arena_reset(&pl->scratch, mark);
			rc = sched_keep_shorter(out, &t, rc, &best_ms);
			sp_arena_release(&trial);
			if (rc)
				goto done;
			for (int j = 0; j < L.nl && H > 0; j++)
				adj[j] *= fmax(0.5, fmin(2.0, 1 + (end[j] - H) / H));
		}
	}
done:
	sp_arena_release(&trial);
	return rc;
}
