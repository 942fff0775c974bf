/*
 * sched_list.c — phase 2 of our scheduler: list scheduling with homes and
 * malleable tails, at widths chosen by allot.c. Event-driven over time:
 * ready MetaOps start in order of bottom level (longest remaining path at
 * the chosen widths) with their width when it fits the free devices; a
 * MetaOp that does not fit starts narrower if that finishes no later than
 * waiting would; smaller MetaOps backfill. When devices would sit idle, the
 * running MetaOp that finishes last is widened at its next layer boundary
 * (a new slice on a superset of its devices) if that ends it sooner. The
 * placer (place.c) chooses devices as slices start, so memory holds device
 * by device. It does not choose widths, and keeps nothing between calls:
 * its work arrays live in pl->scratch. With sync homes (sched_list_sync)
 * it trades width for sync locality: wide components are held on a few
 * whole nodes, so their gradients cross fewer NICs.
 */
#include "planner.h"

#include <math.h>
#include <string.h>

typedef struct {
	int m, lf, lt, n;
	double t0, t1;
	int32_t *devs; /* room for N devices, n used */
	int homed;     /* on its home: never widened */
} run_t;

/* When at least want devices are free, if running slices end as planned:
 * the running slices taken in order of their ends. */
static double next_free_time(const run_t *run, int nrun, int have, int want, int *ord)
{
	double t = HUGE_VAL;
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
	return t;
}

/*
 * Memory: the most layers of m one device can hold in a slice of width n,
 * with frac of the cap for them (the candidate's memory fraction): each layer costs its parameter state plus
 * the activations saved for backward by every MetaOp sharing its component
 * (placement puts those on the same devices), at their local batches. A
 * MetaOp longer than that runs as consecutive segments on different devices.
 */
static int max_layers(const planner_t *pl, const int *w, int m, int n, double frac)
{
	const metaop_t *mo = &pl->mops[m];
	const sp_model_t *md = pl->model;
	int comp = md->tasks[mo->task].nodes[pl->ops[mo->first_op].node].comp;
	double per = layout_state_bytes(pl, m, n) +
		     layout_saved_per_sample(pl, m) * (double)((mo->batch + n - 1) / n);
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *o = &pl->mops[k];
		if (k == m || md->tasks[o->task].nodes[pl->ops[o->first_op].node].comp != comp)
			continue;
		per += layout_saved_per_sample(pl, k) * (double)((o->batch + w[k] - 1) / w[k]);
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

/* Which components need homes: those whose full parameter state (on a
 * home of g[c] devices: layout.c's estimate, zero-1 for large components
 * under --zero auto) takes more than a quarter of a device get S[c] segments of at most 40% of a
 * device, on homes of g[c] devices (the widest allotment among the
 * component's MetaOps). L[c] is the component's layer count; every
 * (comp, layer) slot gets its index from h->param_base. */
static void homes_first_guess(const planner_t *pl, const int *w, homes_t *h, int *S, int *g,
			      int *L)
{
	const sp_model_t *md = pl->model;
	double cap = pl->mem_cap;
	for (int c = 0; c < md->n_comps; c++) {
		h->param_base[c] = h->n_params;
		L[c] = md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
		h->n_params += L[c];
		int wide = 1;
		for (int m = 0; m < pl->n_mops; m++) {
			int lay;
			if (mop_comp(pl, m, 0, &lay) == c)
				wide = SP_MAX(wide, w[m]);
		}
		/* a layer's state on a home that wide (zero-1 where layout.c says) */
		double ls = layout_comp_state(pl, c, wide);
		if (ls * L[c] <= 0.25 * cap || md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		S[c] = SP_MIN(L[c], (int)ceil(ls * L[c] / (0.4 * cap)));
		g[c] = wide;
	}
}

/*
 * Sync homes (a candidate's home_share k >= 2, share1 k1; a cluster of at
 * least k nodes): a home is h = nodes / k whole nodes, g = h G devices.
 * A component whose MetaOps' allotted widths add up to more devices than
 * its home (its spread: the devices its gradients would otherwise sync
 * across, at most N) is held on homes instead, so each of its layers
 * syncs across the home's nodes only (with one NIC per node the gradient
 * bytes a node's NIC carries fall by the share of the layers it holds).
 * Its layers are cut into S segments, enough that a home's share of the
 * component's work W_c (device-ms at each MetaOp's most efficient width)
 * is at most the area A (all work / N): S = ceil(W_c / (g A)), at most
 * nodes / h homes and its layer count. A component of one MetaOp left in
 * one segment gets a home of nodes / k1 nodes (when the cluster has k1
 * nodes): it runs alone there, while a shared one's MetaOps take the
 * home one after another (start_on_home) and keep the wider one. A
 * component with under 1% of the work is left where the allotment puts
 * it (narrow slices already). Segments are laid out on whole nodes one
 * after another, wrapping around the cluster: homes of different
 * components may share devices (a device then holds both), homes of one
 * component do not (homes_fit caps S, homes_lay_out checks). Returns 1
 * when some component got sync homes (marked in sync), -1 out of memory.
 * The simulator judges the result against every other candidate;
 * narrower slices may cost compute.
 */
static int homes_sync(planner_t *pl, const int *w, int share, int share1, int *S, int *g,
		      const int *L, unsigned char *sync)
{
	const sp_model_t *md = pl->model;
	int C = md->n_comps, G = pl->cluster->gpus_per_node, nodes = pl->cluster->nodes;
	if (share < 2 || nodes < share)
		return 0;
	int h = nodes / share, gg = h * G, any = 0;
	int g1 = nodes >= share1 && share1 > 0 ? nodes / share1 * G : gg;
	double total = 0;
	double *work = sp_arena_calloc(&pl->scratch, (size_t)C + 1, sizeof(double));
	int *spread = sp_arena_calloc(&pl->scratch, (size_t)C + 1, sizeof(int));
	int *uses = sp_arena_calloc(&pl->scratch, (size_t)C + 1, sizeof(int));
	if (!work || !spread || !uses)
		return -1;
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		double least = HUGE_VAL; /* device-ms of one layer at its best width */
		for (int n = 1; n <= mo->nmax; n++)
			least = fmin(least, n * mop_t(mo, n));
		int layer, c0 = mop_comp(pl, m, 0, &layer);
		spread[c0] = SP_MIN(pl->N, spread[c0] + w[m]);
		uses[c0]++;
		for (int l = 0; l < mo->n_layers; l++)
			work[mop_comp(pl, m, l, &layer)] += least;
		total += least * mo->n_layers;
	}
	double area = total / pl->N;
	for (int c = 0; c < C && area > 0; c++) {
		int segs = (int)ceil(work[c] / (gg * area) - 1e-9);
		segs = SP_MAX(1, SP_MIN(SP_MIN(segs, nodes / h), L[c]));
		int home = segs == 1 && uses[c] == 1 ? SP_MIN(g1, gg) : gg;
		if (spread[c] <= home || work[c] < 0.01 * total ||
		    md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		S[c] = segs;
		g[c] = home;
		sync[c] = 1;
		any = 1;
	}
	return any;
}

/* Shrinks the widest memory homes until all of them fit on the devices,
 * and grows S[c] until a segment also holds the activations its MetaOps
 * save there; at most 64 rounds of both. Sync homes (sync[c]) wrap around
 * the cluster over the memory homes: they are neither shrunk nor counted
 * in the memory homes' room. homes_sync's segments can come out fewer
 * than homes_first_guess's memory S (its S follows the work, not the
 * state); the 0.75-of-the-cap check below grows them back where a segment
 * would not hold its state and activations. A sync component grows to at
 * most N / g[c] segments, so its homes never share a device; one that
 * would need more goes back to its memory home (S0, g0) as a memory
 * component. */
static void homes_fit(const planner_t *pl, int *S, int *g, const int *L, unsigned char *sync,
		      const int *S0, const int *g0)
{
	const sp_model_t *md = pl->model;
	int C = md->n_comps;
	double cap = pl->mem_cap;
	for (int round = 0; round < 64; round++) {
		int need = 0, grown = 0;
		for (int c = 0; c < C; c++)
			need += sync[c] ? 0 : S[c] * g[c];
		while (need > pl->N) { /* shrink the widest memory homes */
			int big = -1;
			for (int c = 0; c < C; c++)
				if (!sync[c] && S[c] && g[c] > 1 && (big < 0 || g[c] > g[big]))
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
				if (mop_comp(pl, m, 0, &lay) != c)
					continue;
				const metaop_t *mo = &pl->mops[m];
				int gg = (int)SP_MIN((int64_t)g[c], mo->batch);
				acts += layout_saved_per_sample(pl, m) * (double)((mo->batch + gg - 1) / gg);
			}
			double per = layout_comp_state(pl, c, g[c]) + acts;
			if (per * ceil((double)L[c] / S[c]) <= 0.75 * cap)
				continue;
			if (sync[c] && (S[c] + 1) * g[c] > pl->N) {
				sync[c] = 0; /* its homes would overlap: a memory home */
				S[c] = S0[c];
				g[c] = g0[c];
			} else {
				S[c]++;
			}
			grown = 1;
		}
		if (!grown)
			break;
	}
}

/* Lays the homes out on the devices, segment after segment (each inside
 * one node when it fits), and maps every (comp, layer) slot to its
 * segment. */
static int homes_lay_out(planner_t *pl, homes_t *h, const int *S, const int *g, const int *L,
			 const unsigned char *sync)
{
	int C = pl->model->n_comps, N = pl->N, G = pl->cluster->gpus_per_node;
	sp_arena_t *a = &pl->scratch;
	h->seg_of = sp_arena_calloc(a, (size_t)(h->n_params + 1), sizeof(int));
	int total = 0;
	for (int c = 0; c < C; c++) {
		h->n_seg += S[c];
		total += S[c] * g[c];
	}
	h->devs = sp_arena_calloc(a, (size_t)total + 1, sizeof(int32_t));
	h->first = sp_arena_calloc(a, (size_t)h->n_seg + 1, sizeof(int));
	h->n = sp_arena_calloc(a, (size_t)h->n_seg + 1, sizeof(int));
	if (!h->seg_of || !h->devs || !h->first || !h->n)
		return SP_ENOMEM;
	for (int q = 0; q < h->n_params; q++)
		h->seg_of[q] = -1;
	int seg = 0, o = 0, dev = 0;
	int *owner = sp_arena_calloc(a, (size_t)N, sizeof(int)); /* comp + 1 */
	if (!owner)
		return SP_ENOMEM;
	for (int c = 0; c < C; c++)
		for (int k = 0; k < S[c]; k++, seg++) {
			/* keep a home inside one node when it fits; one of whole
			 * nodes (sync homes) starts on a node */
			if (g[c] <= G && dev % G + g[c] > G && (dev / G + 1) * G + g[c] <= N)
				dev = (dev / G + 1) * G;
			else if (g[c] % G == 0 && dev % G)
				dev = (dev / G + 1) * G % N;
			h->first[seg] = o;
			h->n[seg] = g[c];
			for (int j = 0; j < g[c]; j++) {
				int d = (dev++) % N;
				/* memory homes may wrap (a device then holds several
				 * segments, each within the cap); sync homes must not:
				 * homes_fit keeps their S g within N */
				if (sync[c] && owner[d] == c + 1)
					return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
							  "spindle schedule: sync homes of component %d "
							  "share device %d (%d segments of %d devices "
							  "on %d)",
							  c, d, S[c], g[c], N);
				owner[d] = c + 1;
				h->devs[o++] = d;
			}
			for (int l = L[c] * k / S[c]; l < L[c] * (k + 1) / S[c]; l++)
				h->seg_of[h->param_base[c] + l] = seg;
		}
	return 0;
}

static int homes_build(planner_t *pl, const int *w, int share, int share1, homes_t *h)
{
	int C = pl->model->n_comps;
	sp_arena_t *a = &pl->scratch;
	memset(h, 0, sizeof *h);
	h->param_base = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	int *S = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	int *g = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	int *L = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	int *S0 = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	int *g0 = sp_arena_calloc(a, (size_t)C + 1, sizeof(int));
	unsigned char *sync = sp_arena_calloc(a, (size_t)C + 1, 1);
	if (!h->param_base || !S || !g || !L || !S0 || !g0 || !sync)
		return SP_ENOMEM;
	homes_first_guess(pl, w, h, S, g, L);
	memcpy(S0, S, sizeof(int) * (size_t)C);
	memcpy(g0, g, sizeof(int) * (size_t)C);
	/* sync homes wrap around the cluster: those are not shrunk */
	int any = homes_sync(pl, w, share, share1, S, g, L, sync);
	if (any < 0)
		return SP_ENOMEM;
	if (share && !any)
		return SCHED_NOTHING_NEW; /* the plain list schedule's homes */
	homes_fit(pl, S, g, L, sync, S0, g0);
	/* homes_fit may send every sync component back to its memory home:
	 * then nothing is homed, as above */
	any = 0;
	for (int c = 0; c < C; c++)
		any |= sync[c];
	if (share && !any)
		return SCHED_NOTHING_NEW;
	return homes_lay_out(pl, h, S, g, L, sync);
}

/* Home segment of MetaOp m's layer l, or -1. */
static int home_of(const planner_t *pl, const homes_t *h, int m, int l)
{
	int layer, c = mop_comp(pl, m, l, &layer);
	return h->seg_of ? h->seg_of[h->param_base[c] + layer] : -1;
}

/* Commits slice x on devs to the placer and records it as running. */
static void start_slice(placer_t *P, run_t *ru, const sslice_t *x, const int32_t *devs,
			int homed)
{
	placer_commit(P, x, devs);
	int32_t *room = ru->devs;
	*ru = (run_t){x->metaop, x->lf, x->lt, x->n, x->t0, x->t1, room, homed};
	memcpy(ru->devs, devs, sizeof(int32_t) * (size_t)x->n);
}

static int ready(const planner_t *pl, const int *finished, int m)
{
	const metaop_t *mo = &pl->mops[m];
	for (int q = 0; q < mo->n_pred; q++)
		if (!finished[pl->edges[mo->pred[q]].src])
			return 0;
	return 1;
}

/* One call's state: the placer (devices and their memory), the homes, the
 * MetaOps' progress and the slices running at time t; all in pl->scratch. */
typedef struct {
	planner_t *pl;
	const int *w;
	double frac;
	sched_t *out;
	placer_t *P;
	homes_t H;
	int *done;     /* per MetaOp: layers scheduled */
	int *finished; /* per MetaOp: all layers ended */
	int *running;  /* per MetaOp: a slice running */
	int *order;    /* MetaOps by priority */
	int *by_end;   /* next_free_time's work array */
	run_t *run;    /* the running slices, nrun of them */
	int nrun, n_fin;
	int32_t *devs; /* room for N devices */
	double t;
} list_t;

/* Priority: bottom level at widths w, then id. */
static void list_order(const planner_t *pl, const int *w, double *bl, int *order)
{
	int M = pl->n_mops;
	sched_blevels(pl, w, bl);
	for (int m = 0; m < M; m++)
		order[m] = m;
	for (int i = 1; i < M; i++)
		for (int b = i; b > 0; b--) {
			int x = order[b], y = order[b - 1];
			if (bl[x] < bl[y] || (bl[x] == bl[y] && x > y))
				break;
			order[b] = y;
			order[b - 1] = x;
		}
}

/* The work arrays, the placer with every home reserved, and the order. */
static int list_init(list_t *s, planner_t *pl, const int *w, double frac, int share,
		     int share1, sched_t *out)
{
	int M = pl->n_mops, N = pl->N;
	sp_arena_t *a = &pl->scratch; /* the candidate's (or the trial's) scope */
	*s = (list_t){.pl = pl, .w = w, .frac = frac, .out = out};
	double *bl = sp_arena_calloc(a, (size_t)M + 1, sizeof(double));
	s->done = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	s->finished = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	s->running = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	s->order = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	s->by_end = sp_arena_calloc(a, (size_t)M + 1, sizeof(int));
	s->run = sp_arena_calloc(a, (size_t)M + 1, sizeof(run_t));
	/* a running slice per MetaOp at most, each with room for N devices */
	int32_t *rooms = sp_arena_calloc(a, (size_t)(M + 1) * (size_t)N, sizeof(int32_t));
	s->devs = sp_arena_calloc(a, (size_t)N, sizeof(int32_t));
	if (!bl || !s->done || !s->finished || !s->running || !s->order || !s->by_end ||
	    !s->run || !rooms || !s->devs || placer_new(&s->P, pl, PLACE_SPINDLE))
		return SP_ENOMEM;
	int rc = homes_build(pl, w, share, share1, &s->H);
	if (rc)
		return rc;
	for (int m = 0; m <= M; m++)
		s->run[m].devs = rooms + (size_t)m * (size_t)N;
	const homes_t *H = &s->H;
	for (int c = 0; c < pl->model->n_comps; c++) {
		int nl = pl->model->comps[c].type == COMP_TRANSFORMER ? (int)pl->model->comps[c].layers : 1;
		for (int l = 0; l < nl; l++) {
			int sg = H->seg_of[H->param_base[c] + l];
			if (sg >= 0)
				placer_reserve(s->P, c, l, H->devs + H->first[sg], H->n[sg]);
		}
	}
	list_order(pl, w, bl, s->order);
	return 0;
}

/* Homed layers of m from done[m] on run on their home, when all of it is
 * free: the run of them on that home starts now. */
static void start_on_home(list_t *s, int m, int home, int *free_dev)
{
	const metaop_t *mo = &s->pl->mops[m];
	const homes_t *H = &s->H;
	int d = s->done[m], r = 1, n = SP_MIN(H->n[home], mo->nmax);
	while (d + r < mo->n_layers && home_of(s->pl, H, m, d + r) == home)
		r++;
	int all_free = 1;
	sslice_t x = {m, d, d + r, n, 0, s->t, s->t + r * mop_t(mo, n), 0, -1, 0};
	memcpy(s->devs, H->devs + H->first[home], sizeof(int32_t) * (size_t)n);
	devs_sort(s->devs, n);
	for (int j = 0; j < n; j++)
		all_free &= placer_free_count_dev(s->P, s->devs[j], s->t);
	if (!all_free)
		return;
	start_slice(s->P, &s->run[s->nrun++], &x, s->devs, 1);
	s->running[m] = 1;
	s->done[m] += r;
	*free_dev -= n;
}

/* Starts ready MetaOp m now at its width, or narrower when that finishes
 * no later than waiting for devices would; else it waits (*blocked counts
 * those that wait for memory no device will free). */
static int start_metaop(list_t *s, int m, int *free_dev, int *blocked)
{
	planner_t *pl = s->pl;
	const metaop_t *mo = &pl->mops[m];
	int home = home_of(pl, &s->H, m, s->done[m]);
	if (home >= 0) {
		start_on_home(s, m, home, free_dev);
		return 0;
	}
	double t = s->t;
	int d = s->done[m], want = SP_MIN(s->w[m], mo->nmax);
	int r = SP_MIN(mo->n_layers - d, max_layers(pl, s->w, m, want, s->frac));
	for (int k = 1; k < r; k++)
		if (home_of(pl, &s->H, m, d + k) >= 0)
			r = k; /* stop where homed layers begin */
	sslice_t x = {m, d, d + r, want, 0, t, 0, 0, -1, 0};
	int later = 0, fit = placer_fitting(s->P, &x, &later);
	int n = width_floor(mo, SP_MIN(want, fit));
	want = width_floor(mo, want);
	if (n < want) {
		/* wait for devices with room, or start narrower now? */
		double t_free = next_free_time(s->run, s->nrun, fit, want, s->by_end);
		double wait_fin = t_free + r * mop_t(mo, want);
		double now_fin = n > 0 ? t + r * mop_t(mo, n) : HUGE_VAL;
		if (n == 0 || (now_fin > wait_fin && later > 0)) {
			*blocked += n == 0 && later == 0;
			return 0; /* wait; a smaller one may backfill */
		}
	}
	x.n = n;
	x.t1 = t + r * mop_t(mo, n);
	int fits = placer_choose(s->P, &x, s->devs);
	if (fits < 0)
		return SP_EINTERNAL;
	if (fits < n) {
		++*blocked; /* narrower means more samples each: no room */
		return 0;
	}
	start_slice(s->P, &s->run[s->nrun++], &x, s->devs, 0);
	s->running[m] = 1;
	s->done[m] += r;
	*free_dev -= n;
	return 0;
}

/* Ready MetaOps start in priority order while devices are free. */
static int start_ready(list_t *s, int *free_dev, int *blocked)
{
	int rc;
	for (int oi = 0; oi < s->pl->n_mops && *free_dev > 0; oi++) {
		int m = s->order[oi];
		if (s->running[m] || s->done[m] == s->pl->mops[m].n_layers ||
		    !ready(s->pl, s->finished, m))
			continue;
		if ((rc = start_metaop(s, m, free_dev, blocked)))
			return rc;
	}
	return 0;
}

/*
 * Malleable tail: when no MetaOp waits, idle devices widen the running
 * (unhomed) slice that ends last at its next layer boundary, if that ends
 * it sooner; the part before the boundary is pushed as its own slice.
 * Repeats while devices stay free.
 */
static int widen_last(list_t *s, int free_dev)
{
	planner_t *pl = s->pl;
	double t = s->t;
	int rc, any_waiting = 0;
	for (int m = 0; m < pl->n_mops && !any_waiting; m++)
		any_waiting = !s->running[m] && s->done[m] < pl->mops[m].n_layers &&
			      ready(pl, s->finished, m);
	while (!any_waiting && free_dev > 0) {
		int best = -1;
		for (int i = 0; i < s->nrun; i++)
			if (!s->run[i].homed && (best < 0 || s->run[i].t1 > s->run[best].t1))
				best = i;
		if (best < 0)
			break;
		run_t *x = &s->run[best];
		const metaop_t *mo = &pl->mops[x->m];
		double per = mop_t(mo, x->n);
		int split = x->lf + (int)ceil((t - x->t0) / per - 1e-9);
		split = SP_MAX(split, x->lf);
		if (split >= x->lt || !mo->scales)
			break;
		double ts = x->t0 + (split - x->lf) * per;
		/* extra devices: free now, with room for the rest of the slice */
		sslice_t ext = {x->m, split, x->lt, SP_MIN(mo->nmax, x->n + free_dev) - x->n,
				0, t, 0, 0, -1, 0};
		if (ext.n <= 0)
			break;
		int fit = placer_fitting(s->P, &ext, NULL);
		ext.n = SP_MIN(ext.n, fit);
		int nn = x->n + ext.n;
		double fin = ts + (x->lt - split) * mop_t(mo, nn);
		if (ext.n <= 0 || fin >= x->t1 - 1e-9)
			break;
		ext.t1 = fin;
		if (placer_choose(s->P, &ext, s->devs) < 0)
			break;
		if (split > x->lf &&
		    (rc = sched_push_devs(s->out, x->m, x->lf, split, x->n, x->t0, ts, x->devs)))
			return rc;
		/* the widened slice: old devices from ts, extra ones from now */
		memcpy(x->devs + x->n, s->devs, sizeof(int32_t) * (size_t)ext.n);
		sslice_t wide = {x->m, split, x->lt, nn, 0, ts, fin, 0, -1, 0};
		devs_sort(x->devs, nn);
		placer_commit(s->P, &wide, x->devs);
		free_dev -= ext.n;
		x->lf = split;
		x->n = nn;
		x->t0 = ts;
		x->t1 = fin;
	}
	return 0;
}

/* Advances t to the next end of a running slice and pushes the slices that
 * end then; nothing running is an error (blocked: for want of memory). */
static int next_event(list_t *s, int blocked)
{
	planner_t *pl = s->pl;
	int rc;
	if (s->nrun == 0) {
		if (blocked)
			return sp_err_set(pl->err, SP_EINFEAS, NULL, 0, 0, NULL,
					  "spindle schedule: no device has memory left for "
					  "some MetaOp at %.3f ms",
					  s->t);
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "spindle schedule: nothing runnable at %.3f ms", s->t);
	}
	int e = 0;
	for (int i = 1; i < s->nrun; i++)
		if (s->run[i].t1 < s->run[e].t1)
			e = i;
	s->t = s->run[e].t1;
	for (int i = 0; i < s->nrun;) {
		if (s->run[i].t1 > s->t + 1e-12) {
			i++;
			continue;
		}
		run_t *x = &s->run[i];
		if ((rc = sched_push_devs(s->out, x->m, x->lf, x->lt, x->n, x->t0, x->t1, x->devs)))
			return rc;
		s->running[x->m] = 0;
		if (x->lt == pl->mops[x->m].n_layers) {
			s->finished[x->m] = 1;
			s->n_fin++;
		}
		run_t ended = *x; /* its room goes to the free slot at the end */
		*x = s->run[--s->nrun];
		s->run[s->nrun] = ended;
	}
	return 0;
}

/*
 * Phase 2 with the placer: a slice starts only on free devices whose
 * memory takes it, so the schedule respects memory device by device and
 * the placement pass keeps these devices. Event by event: start ready
 * MetaOps, widen the slice that ends last, advance to the next end.
 */
static int list_run(planner_t *pl, const int *w, double frac, int share, int share1,
		    double stop, sched_t *out)
{
	list_t s;
	int rc;
	if ((rc = list_init(&s, pl, w, frac, share, share1, out)))
		return rc;
	while (s.n_fin < pl->n_mops) {
		int free_dev = placer_free_count(s.P, s.t), blocked = 0;
		if ((rc = start_ready(&s, &free_dev, &blocked)) || (rc = widen_last(&s, free_dev)) ||
		    (rc = next_event(&s, blocked)))
			return rc;
		if (s.t >= stop) /* slices ended at s.t were pushed */
			return SCHED_PAST;
	}
	return 0;
}

int sched_list_until(planner_t *pl, const int *w, double frac, double stop, sched_t *out)
{
	return list_run(pl, w, frac, 0, 0, stop, out);
}

int sched_list(planner_t *pl, const int *w, double frac, sched_t *out)
{
	return list_run(pl, w, frac, 0, 0, HUGE_VAL, out);
}

int sched_list_sync(planner_t *pl, const int *w, double frac, int share, int share1,
		    sched_t *out)
{
	return list_run(pl, w, frac, share, share1, HUGE_VAL, out);
}
