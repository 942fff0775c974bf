/*
 * layout_refine.c — layout_refine, step 3 of layout.c's header: on an
 * algorithm's chosen plan, the replicated buckets whose zero-1 shortens
 * the optimizer step's tail (refine_zero1), then the deferred all-gathers
 * (try_defer), then one more bucket in zero-1 with its all-gather deferred
 * (try_defer_one), and the last of those trials split off to run beside the
 * others (layout_last_*, walk_jobs.c's jobs). The estimates, the fit and the
 * trials on every candidate are layout.c's (layout.h).
 */
#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- zero-1 against the optimizer step's tail (layout_refine) ------------ */

/*
 * After its program a device updates its buckets one after another (a
 * replicated bucket whole, a zero-1 one its shard) and its zero-1 buckets'
 * all-gathers enter the network, each from when every member has updated
 * the bucket (sim.c finish_steps_net: one after another per device, sharing
 * links with the collectives in flight). A replicated bucket
 * shared by many devices costs each of them its whole step, which no
 * collective hides; in zero-1 it costs a shard's step and an all-gather,
 * which runs beside the other buckets' updates, and its reduce-scatter
 * replaces the all-reduce. tail_t estimates the iteration for a choice of
 * layouts from the simulated plan: each device's program ends with its
 * last slice (e), a bucket's collective is ready when the last backward
 * before its SYNC ends on every member (issue) and takes its price alone,
 * a member's collectives one after another; then the updates and gathers
 * (alone, one after another per device: an estimate that picks the
 * buckets; the change is kept only if the simulator says it is faster).
 */
typedef struct {
	int *off, *bk;  /* per device: its SYNCs' buckets in program order */
	double *whole;  /* per bucket: the full step (ms) */
	double *shard;  /* per bucket: a member's zero-1 shard step */
	double *gather; /* per bucket: its zero-1 all-gather alone */
	double *ar, *rs; /* per bucket: its all-reduce, reduce-scatter alone */
	double *issue;  /* per bucket: its collective ready */
	double *done;   /* per bucket: its collective done (scratch) */
	double *e;      /* per device: its program's end */
	double *upd;    /* per bucket: its last member's update (scratch) */
	double *end;    /* per device: the estimated end (scratch) */
	uint8_t *z1;    /* per bucket: zero-1 in this choice */
} tail_t;

static int tail_init(planner_t *pl, const sp_plan_t *p, sp_arena_t *a, tail_t *t)
{
	int nb = p->n_buckets, nd = p->n_devices, n = 0;
	t->off = sp_arena_calloc(a, (size_t)nd + 1, sizeof(int));
	for (int d = 0; t->off && d < nd; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++)
			n += p->ins[p->devices[d].first_ins + k].op == INS_SYNC;
	t->bk = sp_arena_calloc(a, (size_t)n + 1, sizeof(int));
	t->z1 = sp_arena_calloc(a, (size_t)nb + 1, 1);
	double **per_bucket[] = {&t->whole, &t->shard, &t->gather, &t->ar,
				 &t->rs,    &t->issue, &t->done,   &t->upd};
	double **per_dev[] = {&t->e, &t->end};
	for (size_t i = 0; i < sizeof per_bucket / sizeof *per_bucket; i++)
		if (!(*per_bucket[i] = sp_arena_calloc(a, (size_t)nb + 1, sizeof(double))))
			return SP_ENOMEM;
	for (size_t i = 0; i < sizeof per_dev / sizeof *per_dev; i++)
		if (!(*per_dev[i] = sp_arena_calloc(a, (size_t)nd + 1, sizeof(double))))
			return SP_ENOMEM;
	if (!t->off || !t->bk || !t->z1)
		return SP_ENOMEM;
	n = 0;
	for (int d = 0; d < nd; d++) {
		double x = 0;
		t->off[d] = n;
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			if (in->op == INS_SYNC) {
				t->bk[n++] = in->peer;
				t->issue[in->peer] = fmax(t->issue[in->peer], x);
			} else if (in->slice >= 0 && in->slice < p->n_slices &&
				   (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS)) {
				const sp_slice_t *sl = &p->slices[in->slice];
				x = fmax(x, in->op == INS_FWD ? sl->start_ms + sl->fwd_ms
							      : sl->bwd_start_ms + sl->bwd_ms);
			}
		}
		t->e[d] = x;
	}
	t->off[nd] = n;
	int db = dtype_bytes(p->model.dtype);
	for (int b = 0; b < nb; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		int64_t m = bk->n_dev > 1 ? (bk->elems + bk->n_dev - 1) / bk->n_dev : bk->elems;
		t->whole[b] = cost_step_ms(pl, bk->elems);
		t->shard[b] = cost_step_ms(pl, m);
		/* zero-1 and zero-2 gather after the step; zero-3 at each use */
		t->gather[b] = bk->layout == LAYOUT_ZERO1 || bk->layout == LAYOUT_ZERO2
				       ? bk->gather_ms
			       : bk->layout == LAYOUT_REPLICATED && bk->n_dev > 1
				       ? cost_all_gather_ms(pl->cluster, p->bucket_devs + bk->dev_off,
							    bk->n_dev, bk->elems * db)
				       : 0;
		t->z1[b] = (uint8_t)layout_sharded(bk->layout);
		t->ar[b] = bk->layout == LAYOUT_REPLICATED ? bk->sync_ms
			   : cost_allreduce_ms(pl->cluster, p->bucket_devs + bk->dev_off,
					       bk->n_dev, bk->elems * db);
		t->rs[b] = layout_sharded(bk->layout) ? bk->sync_ms
			   : cost_reduce_scatter_ms(pl->cluster, p->bucket_devs + bk->dev_off,
						    bk->n_dev, bk->elems * db);
	}
	return 0;
}

/* The latest estimated end over the devices. */
static double tail_est(const sp_plan_t *p, tail_t *t)
{
	double worst = 0;
	for (int b = 0; b < p->n_buckets; b++)
		t->upd[b] = t->done[b] = 0;
	for (int d = 0; d < p->n_devices; d++) {
		double c = 0;
		for (int i = t->off[d]; i < t->off[d + 1]; i++) {
			int b = t->bk[i];
			c = fmax(c, t->issue[b]) + (t->z1[b] ? t->rs[b] : t->ar[b]);
			t->done[b] = fmax(t->done[b], c);
		}
	}
	for (int d = 0; d < p->n_devices; d++) {
		double x = t->e[d];
		for (int i = t->off[d]; i < t->off[d + 1]; i++) {
			int b = t->bk[i];
			x = fmax(x, t->done[b]) + (t->z1[b] ? t->shard[b] : t->whole[b]);
			if (t->z1[b])
				t->upd[b] = fmax(t->upd[b], x);
		}
		t->end[d] = x;
	}
	for (int d = 0; d < p->n_devices; d++) {
		double g = 0;
		for (int i = t->off[d]; i < t->off[d + 1]; i++)
			if (t->z1[t->bk[i]])
				g = fmax(g, t->upd[t->bk[i]]) + t->gather[t->bk[i]];
		t->end[d] = fmax(t->end[d], g);
		worst = fmax(worst, t->end[d]);
	}
	return worst;
}

/* The n candidates cand[] in the order the greedy tries them: the step a
 * member saves per millisecond of all-gather, most first (ties: bucket
 * order); key[] scratch. */
static void by_saving(const tail_t *t, int *cand, double *key, int n)
{
	for (int i = 0; i < n; i++) {
		int b = cand[i];
		key[i] = (t->whole[b] - t->shard[b]) / fmax(t->gather[b], 1e-12);
	}
	for (int i = 1; i < n; i++) { /* insertion sort: stable, few buckets */
		int b = cand[i];
		double k = key[i];
		int j = i;
		for (; j > 0 && key[j - 1] < k; j--) {
			cand[j] = cand[j - 1];
			key[j] = key[j - 1];
		}
		cand[j] = b;
		key[j] = k;
	}
}

/*
 * A trial on p (its programs' tails rebuilt) that must be faster than
 * beat ms to be kept: *doomed 1 when its sync bound (bound_sync with its
 * layouts and the all-gathers it waits for: at most its simulated
 * iteration, the prune-exact test's check) shows it cannot be, as the
 * keep test is iteration < beat x (1 - 1e-9). Then simulating it changes
 * nothing: it would be rejected, and a rejected trial leaves the plan as
 * its caller found it (trial_restore; a copy's result unread). With
 * --simulate-all nothing is skipped; *lb for trial_check.
 */
static int trial_doomed(planner_t *pl, const sp_plan_t *p, double beat, double *lb,
			int *doomed)
{
	int rc = bound_sync(pl, p, 0, 1, lb);
	*doomed = !rc && !pl->opts->simulate_all && *lb >= beat * (1 - 1e-9);
	return rc;
}

/* --simulate-all: the trial's simulated iteration (r) no less than its
 * bound lb, which trial_doomed's skips rest on. */
static int trial_check(planner_t *pl, const sim_result_t *r, double lb, const char *site)
{
	if (!pl->opts->simulate_all || lb <= r->iteration_ms)
		return 0;
	return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
			  "%s: sync bound %.6f ms above the trial's iteration %.6f ms", site, lb,
			  r->iteration_ms);
}

/* Bucket layouts changed since t was saved: the programs' tails rebuilt,
 * the sync pass simulated again, the change kept when the iteration is
 * faster than res (res then the new one), else the plan as t saved it.
 * bounded: not simulated where trial_doomed says it cannot be faster (the
 * last trial only, try_defer with shard: on the 32-task scaling row the
 * bound settled 4 of its 5 trials and 1 of the 4 others; on QWen-VAL none
 * of 18, each bound costing about a tenth of a simulation there). */
static int keep_if_faster(planner_t *pl, sp_plan_t *p, sim_result_t *res,
			  trial_save_t *t, const char *site, int bounded)
{
	sim_result_t r = *res;
	double lb = 0;
	int doomed = 0, rc = regather(pl, p);
	if (!rc && bounded &&
	    !(rc = trial_doomed(pl, p, res->iteration_ms, &lb, &doomed)) && doomed) {
		sim_stats_event("refine trial doomed");
		return trial_restore(pl, p, t);
	}
	if (!rc)
		sim_stats_note(site, p);
	if (rc || (rc = sim_sync_again(pl, p, &r)) || (rc = trial_check(pl, &r, lb, site)))
		return rc;
	if (r.iteration_ms < res->iteration_ms * (1 - 1e-9)) {
		*res = r;
		return 0;
	}
	return trial_restore(pl, p, t);
}

/* 1 when bucket b is replicated over 2+ devices (try_defer's shard and
 * refine_zero1's candidates). */
static int replicated2(const sp_plan_t *p, int b)
{
	return p->buckets[b].layout == LAYOUT_REPLICATED && p->buckets[b].n_dev >= 2;
}

/* The number of buckets try_defer would change on p (0: it tries nothing). */
static int defer_count(const planner_t *pl, const sp_plan_t *p, int shard)
{
	int n = 0;
	for (int b = 0; b < p->n_buckets && pl->opts->defer_gather < 0; b++)
		n += (layout_gathers_after_step(p->buckets[b].layout) && !p->buckets[b].defer) ||
		     (shard && replicated2(p, b));
	return n;
}

/* try_defer's change to p, not yet simulated (the programs' tails not yet
 * rebuilt). */
static void defer_apply(planner_t *pl, sp_plan_t *p, int shard)
{
	for (int b = 0; b < p->n_buckets; b++) {
		if (shard && replicated2(p, b))
			set_layout(pl, p, b, LAYOUT_ZERO1);
		if (!p->buckets[b].defer && layout_gathers_after_step(p->buckets[b].layout))
			p->buckets[b].defer = bucket_defer_pieces(pl->cluster, p, b,
								  dtype_bytes(p->model.dtype));
	}
}

/*
 * --defer-gather auto, a plan with zero-1/2 buckets (after the zero-1
 * choice below): every one of their all-gathers deferred at once (left in
 * flight at the step's end, waited for before the next step's first use of
 * the bucket: sim.c models it from the iteration's start, sharing the
 * network with the forward's transfers), kept when the simulator says the
 * iteration is faster; else the plan as it was. With shard (--zero auto,
 * tried second), every replicated bucket of 2+ devices in zero-1 too and
 * deferred with them: the zero-1 choice above prices the all-gather in the
 * tail, where a deferred one is not. Memory does not grow (a zero-1/2
 * member holds the whole weights either way; zero-1 shards the state).
 * One choice for the plan, as try_overlap's.
 */
static int try_defer(planner_t *pl, sp_plan_t *p, sim_result_t *res, int shard)
{
	int rc = 0;
	if (!defer_count(pl, p, shard))
		return 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	trial_save_t t;
	if ((rc = trial_save(pl, a, p, &t)))
		goto cleanup;
	defer_apply(pl, p, shard);
	rc = keep_if_faster(pl, p, res, &t, shard ? "refine defer (shard)" : "refine defer",
			    shard);
cleanup:
	sp_arena_reset(a, mark);
	return rc;
}

static int refine_zero1(planner_t *pl, sp_plan_t *p, sim_result_t *res);
static int any_replicated2(const sp_plan_t *p);

/*
 * --zero auto and --defer-gather auto, after the trials above: one more
 * replicated bucket of 2+ devices in zero-1 with its all-gather deferred.
 * refine_zero1 prices a zero-1 all-gather in the tail, where a deferred
 * one is not, and the last trial shards every bucket at once; a large
 * bucket whose gather the next forward hides pays between the two (a
 * shared encoder's middle layers: its members' step shrinks to a shard's,
 * its reduce-scatter replaces its all-reduce in the sync chain, its gather
 * runs from the iteration's start while the forward runs the layers
 * before it). Estimate per bucket: tail_est with the bucket in zero-1 and
 * its gather out of the tail, plus what its all-gather alone takes beyond
 * the start of its earliest first use (sim.c: deferred gathers enter the
 * network at time 0; plan_defer_use: a member's first FWD, BWD or LOSS
 * reading it, at its slice's recorded start). The buckets with the least
 * estimate at or below the plan's own are simulated, at most
 * DEFER_ONE_TRIES of them, least estimate first (at: the estimated tail
 * can be held by devices the bucket does not shorten while the simulated
 * one is not; ofasys on 64 A800s, the step at 28 B a parameter: with
 * "below" no bucket of the best plan was tried, 74.32 ms, with "at"
 * 73.39): tail_est charges each collective alone
 * and no deferred gather's load on the network, so estimates a few tenths
 * of a millisecond apart do not rank the trials (32 tasks on 1024 H100s:
 * vision 24-30 estimated 17.62 ms, simulated 17.49; vision 16-23
 * estimated 17.74, simulated 16.63); two, as each is a simulation of the
 * whole plan. The fastest is kept when faster than the plan (each trial
 * alone, the plan restored between them), as simulated: the last one as p
 * holds it, an earlier one restored as trial_save found it after its
 * simulation (the simulator writes the slices', waves' and devices' times,
 * trial_save's; simulating it again would give the same bytes).
 */
#define DEFER_ONE_TRIES 2

static double first_use_ms(const sp_plan_t *p, int b, int32_t *k, int32_t *pos)
{
	const sp_bucket_t *bk = &p->buckets[b];
	double t = HUGE_VAL;
	for (int q = 0; q < bk->n_dev; q++) {
		int d = p->bucket_devs[bk->dev_off + q];
		const sp_device_t *dv = &p->devices[d];
		plan_defer_use(p, d, b, k, pos);
		for (int j = 0; j < bk->n_params; j++) {
			if (k[j] >= dv->n_ins)
				continue;
			const sp_ins_t *in = &p->ins[dv->first_ins + k[j]];
			if (in->slice < 0 || in->slice >= p->n_slices)
				return 0; /* its STEP: nothing hides the gather */
			const sp_slice_t *sl = &p->slices[in->slice];
			t = fmin(t, in->op == INS_BWD ? sl->bwd_start_ms : sl->start_ms);
		}
	}
	return t == HUGE_VAL ? 0 : t;
}

/* Bucket b in zero-1 with its gather deferred, simulated into r. */
static int defer_one_sim(planner_t *pl, sp_plan_t *p, int b, sim_result_t *r)
{
	int rc = set_layout(pl, p, b, LAYOUT_ZERO1);
	p->buckets[b].defer = bucket_defer_pieces(pl->cluster, p, b, dtype_bytes(p->model.dtype));
	if (!rc && !(rc = regather(pl, p))) {
		sim_stats_note("refine defer_one", p);
		rc = sim_sync_again(pl, p, r);
	}
	return rc;
}

static int try_defer_one(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	if (pl->opts->zero >= 0 || pl->opts->defer_gather >= 0 || !any_replicated2(p))
		return 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	tail_t t;
	trial_save_t sv;
	int nb = p->n_buckets, db = dtype_bytes(p->model.dtype), np = 0, n = 0;
	int rc = tail_init(pl, p, a, &t);
	for (int b = 0; b < nb; b++)
		np = SP_MAX(np, p->buckets[b].n_params);
	int32_t *k = rc ? NULL : sp_arena_calloc(a, (size_t)np + 1, sizeof *k);
	int32_t *pos = rc ? NULL : sp_arena_calloc(a, (size_t)np + 1, sizeof *pos);
	int *cand = rc ? NULL : sp_arena_calloc(a, (size_t)nb + 1, sizeof *cand);
	double *key = rc ? NULL : sp_arena_calloc(a, (size_t)nb + 1, sizeof *key);
	if (!rc && (!k || !pos || !cand || !key))
		rc = SP_ENOMEM;
	if (rc)
		goto cleanup;
	double est = tail_est(p, &t);
	for (int b = 0; b < nb; b++) {
		if (!replicated2(p, b))
			continue;
		const sp_bucket_t *bk = &p->buckets[b];
		double g = t.gather[b];
		t.z1[b] = 1;
		t.gather[b] = 0;
		double v = tail_est(p, &t);
		t.z1[b] = 0;
		t.gather[b] = g;
		if (v > est * (1 + 1e-9)) /* worse even with its gather hidden */
			continue;
		v += fmax(0, cost_all_gather_ms(pl->cluster, p->bucket_devs + bk->dev_off, bk->n_dev,
						bk->elems * db) -
				     first_use_ms(p, b, k, pos));
		if (v > est * (1 + 1e-9))
			continue;
		/* insertion by estimate, least first (ties: bucket order) */
		int j = n++;
		for (; j > 0 && key[j - 1] > v; j--) {
			cand[j] = cand[j - 1];
			key[j] = key[j - 1];
		}
		cand[j] = b;
		key[j] = v;
	}
	if (!n || (rc = trial_save(pl, a, p, &sv)))
		goto cleanup;
	/* on: the trial p holds (-1: the plan as sv saved it); fast: the
	 * fastest so far as simulated, when a trial follows it */
	int best = -1, on = -1, tries = SP_MIN(n, DEFER_ONE_TRIES);
	sim_result_t best_r = *res;
	trial_save_t fast = {0};
	for (int i = 0; i < tries; i++) {
		sim_result_t r = *res;
		if (on >= 0 && (rc = trial_restore(pl, p, &sv)))
			goto cleanup;
		on = cand[i];
		if ((rc = defer_one_sim(pl, p, cand[i], &r)))
			goto cleanup;
		if (r.iteration_ms < best_r.iteration_ms * (1 - 1e-9)) {
			best_r = r;
			best = cand[i];
			if (i + 1 < tries && (rc = trial_save(pl, a, p, &fast)))
				goto cleanup;
		}
	}
	if (best == on) /* p holds the fastest, simulated: kept */
		*res = best_r;
	else if (best < 0) /* none faster than the plan */
		rc = trial_restore(pl, p, &sv);
	else if (!(rc = trial_restore(pl, p, &fast))) /* the fastest as simulated */
		*res = best_r;
cleanup:
	sp_arena_reset(a, mark);
	return rc;
}

/* 1 when some bucket is replicated over 2+ devices. */
static int any_replicated2(const sp_plan_t *p)
{
	for (int b = 0; b < p->n_buckets; b++)
		if (replicated2(p, b))
			return 1;
	return 0;
}

int layout_refine_head(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int rc = pl->opts->zero >= 0 ? 0 : refine_zero1(pl, p, res);
	if (!rc)
		rc = try_defer(pl, p, res, 0);
	if (!rc)
		rc = try_defer_one(pl, p, res);
	return no_memory(pl, rc);
}

/*
 * The last trial, try_defer with shard, is skipped where p has no
 * replicated bucket of 2+ devices: it would then only defer the gathers
 * the trial before (shard 0) deferred, from the same plan (that one kept
 * leaves none to defer; rejected, it restored p): the same plan simulated
 * again to the same iteration, which was not faster.
 */
int layout_refine(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int rc = layout_refine_head(pl, p, res);
	if (!rc && pl->opts->zero < 0 && any_replicated2(p))
		rc = try_defer(pl, p, res, 1);
	return no_memory(pl, rc);
}

/* ---- layout_refine's last trial beside the others (walk_jobs.c, --jobs) -- */

/*
 * The last trial's plan does not depend on what the trials before it kept:
 * refine_zero1 turns replicated buckets of 2+ devices into zero-1 (the
 * last trial turns them all), try_defer without shard defers the zero-1/2
 * gathers (the last defers them all), try_defer_one turns one into zero-1
 * with its gather deferred (as the last does), each kept or restored exactly
 * (trial_restore; memory moves by the same integer deltas either way), and
 * the sync pass (sim_sync_again) overwrites every time the plan records
 * and every field of the result it changes. So the last trial is
 * simulated on a copy of p taken before the others (layout_last_init,
 * layout_last_run: on any thread) and judged after them (layout_last_join)
 * exactly as layout_refine judges it: the same plan and result.
 */
int layout_last_init(planner_t *pl, layout_last_t *t, const sp_plan_t *p,
		     const sim_result_t *res)
{
	memset(t, 0, sizeof *t);
	t->r = *res;
	if (pl->opts->zero >= 0 || !defer_count(pl, p, 1) || !any_replicated2(p))
		return 0; /* layout_refine tries nothing last (see layout_last_join) */
	sp_plan_t *q = &t->q;
	*q = *p; /* the rest (model, structure, devices' sets) read only, p's */
	q->buckets = malloc(sizeof *q->buckets * (size_t)p->n_buckets + 1);
	q->devices = malloc(sizeof *q->devices * (size_t)p->n_devices + 1);
	q->slices = malloc(sizeof *q->slices * (size_t)p->n_slices + 1);
	q->waves = malloc(sizeof *q->waves * (size_t)p->n_waves + 1);
	q->ins = malloc(sizeof *q->ins * (size_t)p->n_ins + 1);
	t->tried = 1;
	if (!q->buckets || !q->devices || !q->slices || !q->waves || !q->ins) {
		layout_last_release(t);
		return no_memory(pl, SP_ENOMEM);
	}
	memcpy(q->buckets, p->buckets, sizeof *q->buckets * (size_t)p->n_buckets);
	memcpy(q->devices, p->devices, sizeof *q->devices * (size_t)p->n_devices);
	memcpy(q->slices, p->slices, sizeof *q->slices * (size_t)p->n_slices);
	memcpy(q->waves, p->waves, sizeof *q->waves * (size_t)p->n_waves);
	memcpy(q->ins, p->ins, sizeof *q->ins * (size_t)p->n_ins);
	return 0;
}

/* The copy's trial simulated into t->r, unless trial_doomed shows it
 * cannot beat t->r as layout_last_init took it (the plan's result before
 * the head's trials, which only make it faster): then t->r is left as it
 * is, which layout_last_join rejects as it would the simulated one. */
int layout_last_run(planner_t *pl, layout_last_t *t)
{
	if (!t->tried)
		return 0;
	defer_apply(pl, &t->q, 1);
	double lb = 0;
	int doomed = 0, rc = regather(pl, &t->q);
	if (!rc && !(rc = trial_doomed(pl, &t->q, t->r.iteration_ms, &lb, &doomed)) && doomed) {
		sim_stats_event("refine trial doomed");
		return t->rc = 0;
	}
	if (!rc) {
		sim_stats_note("refine defer (shard)", &t->q);
		rc = sim_sync_again(pl, &t->q, &t->r);
	}
	if (!rc)
		rc = trial_check(pl, &t->r, lb, "refine defer (shard)");
	return t->rc = no_memory(pl, rc);
}

/*
 * After layout_refine_head on p (res): what layout_refine's last trial
 * does there. Where layout_refine skips it, so does this: with nothing to
 * change (defer_count) or no replicated bucket of 2+ devices left, and
 * where layout_last_init took no copy (zero forced, nothing to change, or
 * no such bucket at first: the head's trials add none). Else its result
 * (rc: the caller takes its error), kept as keep_if_faster keeps it: p
 * takes the copy's buckets, devices, slices, waves and programs; rejected,
 * p is left as it is, as trial_restore leaves it (its programs regather's
 * for its layouts, as the head's trials kept or restored them: a rewrite
 * gives the same bytes).
 */
int layout_last_join(planner_t *pl, layout_last_t *t, sp_plan_t *p, sim_result_t *res)
{
	if (!t->tried || !defer_count(pl, p, 1) || !any_replicated2(p))
		return 0;
	if (t->rc)
		return t->rc;
	if (!(t->r.iteration_ms < res->iteration_ms * (1 - 1e-9))) {
		sim_stats_event("programs restored without a rewrite");
		return trial_check_programs(pl, p, "refine last trial rejected");
	}
	sp_plan_t *q = &t->q;
#define LAST_SWAP(T, a, b) do { T x_ = (a); (a) = (b); (b) = x_; } while (0)
	LAST_SWAP(sp_bucket_t *, p->buckets, q->buckets);
	LAST_SWAP(sp_device_t *, p->devices, q->devices);
	LAST_SWAP(sp_slice_t *, p->slices, q->slices);
	LAST_SWAP(sp_wave_t *, p->waves, q->waves);
	LAST_SWAP(sp_ins_t *, p->ins, q->ins);
	LAST_SWAP(int32_t, p->n_ins, q->n_ins);
#undef LAST_SWAP
	*res = t->r;
	return 0;
}

void layout_last_release(layout_last_t *t)
{
	if (!t || !t->tried)
		return;
	free(t->q.buckets);
	free(t->q.devices);
	free(t->q.slices);
	free(t->q.waves);
	free(t->q.ins);
	memset(&t->q, 0, sizeof t->q);
	t->tried = 0;
}

/* layout_refine's zero-1 choice (the header's step 3). */
static int refine_zero1(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	tail_t t;
	trial_save_t sv;
	int nb = p->n_buckets, n = 0, rc = tail_init(pl, p, a, &t);
	int *cand = rc ? NULL : sp_arena_calloc(a, (size_t)nb + 1, sizeof(int));
	double *key = rc ? NULL : sp_arena_calloc(a, (size_t)nb + 1, sizeof(double));
	if (!rc && (!cand || !key))
		rc = SP_ENOMEM;
	if (rc)
		goto done;
	for (int b = 0; b < nb; b++)
		if (p->buckets[b].layout == LAYOUT_REPLICATED && p->buckets[b].n_dev >= 2)
			cand[n++] = b;
	if (!n)
		goto done;
	double best = tail_est(p, &t);
	by_saving(&t, cand, key, n);
	int picked = 0;
	for (int i = 0; i < n; i++) {
		t.z1[cand[i]] = 1;
		double v = tail_est(p, &t);
		if (v < best * (1 - 1e-9)) {
			best = v;
			picked++;
		} else {
			t.z1[cand[i]] = 0;
		}
	}
	if (!picked)
		goto done;
	if ((rc = trial_save(pl, a, p, &sv)))
		goto done;
	for (int i = 0; i < n; i++)
		if (t.z1[cand[i]])
			set_layout(pl, p, cand[i], LAYOUT_ZERO1);
	rc = keep_if_faster(pl, p, res, &sv, "refine zero1", 0);
done:
	sp_arena_reset(a, mark);
	return rc;
}

