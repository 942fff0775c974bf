/*
 * layout.c — the planner's choice of memory layouts under --zero auto and
 * --recompute auto: which sync buckets shard their optimizer state
 * (zero-1, or zero-2 with the gradients) and which transformer slices
 * recompute their activations.
 *
 * The choice is made with the schedule, in two places:
 *
 *  1. Estimates (layout_prepare, before any scheduling). A component is
 *     "large" when its replicated parameter state takes more than a quarter
 *     of a device: the threshold at which sched_list.c already gives it
 *     fixed homes. For large components (for every one when the option is
 *     forced) the schedulers and the placer price a layer at width n with
 *     zero-1 state (weights and gradients whole, optimizer state / n:
 *     layout_state_bytes) and its activations as the layer input only
 *     (layout_saved_per_sample), so segments, homes and widths are chosen
 *     knowing that memory can be bought back; other components are priced
 *     as today, so small workloads plan exactly as before.
 *
 *  2. Per candidate plan, after lowering and before the simulator (plan.c
 *     calls layout_fit for every candidate of every algorithm, so each is
 *     judged with its own layouts): while a device is over the cap, the
 *     bucket it belongs to whose zero-1 sharding frees the most bytes is
 *     sharded; when none is left, the slice on it that frees the most
 *     activation bytes per millisecond of forward re-run recomputes
 *     (recomputation costs one more forward: sim.c). Memory is exact
 *     (plan_mem.c's formula) after every change. Then, once simulated, for
 *     every algorithm (the baselines too: a comparison then measures the
 *     schedules, not a layout only ours could choose) and only in models
 *     with a large component (layout_trial), every remaining bucket over
 *     2+ devices, of any component, is tried in zero-1 at once and kept
 *     when the simulator says the iteration is not slower (reduce-scatter
 *     + shard step + all-gather against all-reduce + full step; only the
 *     sync pass is simulated again).
 *
 *  3. Per algorithm, on its chosen plan (plan.c run_algos: every algorithm,
 *     so comparisons stay fair), under --zero auto in any model
 *     (layout_refine, in layout_refine.c; layout.h): the replicated buckets whose zero-1 shortens the
 *     tail of the iteration — the optimizer step every member of a
 *     replicated bucket runs whole after its program, against a shard's
 *     step, a reduce-scatter and an all-gather — chosen greedily on an
 *     estimate of that tail (tail_est, from the simulated plan's times),
 *     then simulated and kept when faster. One simulation per algorithm,
 *     none where no bucket would shorten the estimate. Then, under
 *     --defer-gather auto (any --zero), the zero-1/2 all-gathers deferred
 *     (try_defer), and under --zero auto every replicated bucket of 2+
 *     devices in zero-1 with deferred all-gathers: at most two more
 *     simulations, each kept when faster. (The zero-3 replacement plan
 *     of step 2, layout_zero3's, is not refined: its zero-1/2 buckets'
 *     gathers stay at the step's end, a missed option, not a wrong time.)
 *
 * Zero-2 (gradients sharded too) replaces zero-1 plan-wide only where the
 * cap needs it (choose_zero2 in step 2, before recomputation; dropped again
 * when the slices recomputed later make zero-1 fit: drop_zero2; and
 * once simulated, zero-1 with more slices recomputing is tried instead,
 * kept when faster: try_zero1_recompute). It moves the bytes zero-1
 * moves, but the runtime completes each reduce-scatter before it places
 * the next full gradient (plan_z2_walk's done; one placement later when
 * overlapped: try_overlap), so the backward can wait for it (sim.c):
 * memory bought with time, like recomputation.
 * Zero-3 (weights sharded too: lower_sync.c and lower_zero3.c) is forced
 * by --zero 3, or under auto taken for a chosen plan that does not fit
 * (layout_zero3, plan.c after the algorithms ran): its schedule and
 * placement lowered again with the large components' buckets in zero-3,
 * then step 2 and the trials as above, kept when it fits. Not tried for a
 * plan that fits: on the bundled workloads the chosen schedule in zero-3
 * was slower and the try cost more planning time than the whole plan
 * (README). When nothing fits, the advice names forced zero-3 if it would
 * fit (layout_advise). Layouts do not choose micro-batches (plan.c
 * does: planner_run), and it does not reschedule: a candidate whose schedule cannot fit even with every
 * bucket sharded and every slice recomputing stays over the cap, and
 * plan.c picks another candidate or reports (layout_advise) what would fit.
 */
#include "layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The component of MetaOp m. */
static int comp_of(const planner_t *pl, int m)
{
	return pl->model->tasks[pl->mops[m].task].nodes[pl->ops[pl->mops[m].first_op].node].comp;
}

int layout_prepare(planner_t *pl)
{
	const sp_model_t *md = pl->model;
	int64_t psb = param_state_bytes(md->dtype, md->opt.kind);
	pl->lay_shard = sp_arena_calloc(&pl->arena, (size_t)md->n_comps + 1, 1);
	pl->lay_redo = sp_arena_calloc(&pl->arena, (size_t)md->n_comps + 1, 1);
	pl->lay_big = sp_arena_calloc(&pl->arena, (size_t)md->n_comps + 1, 1);
	pl->lay_saved = sp_arena_calloc(&pl->arena, (size_t)pl->n_mops + 1, sizeof(double));
	pl->lay_opt = sp_arena_calloc(&pl->arena, (size_t)pl->n_mops + 1, sizeof(double));
	if (!pl->lay_shard || !pl->lay_redo || !pl->lay_big || !pl->lay_saved || !pl->lay_opt)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int c = 0; c < md->n_comps; c++) {
		const sp_component_t *cp = &md->comps[c];
		int L = cp->type == COMP_TRANSFORMER ? (int)cp->layers : 1;
		/* the homes threshold of sched_list.c: a quarter of a device */
		int large = (double)comp_layer_params(cp) * (double)psb * L > 0.25 * pl->mem_cap;
		pl->lay_shard[c] = pl->opts->zero >= 1 || (pl->opts->zero < 0 && large);
		pl->lay_redo[c] = cp->type == COMP_TRANSFORMER &&
				  (pl->opts->recompute == 1 || (pl->opts->recompute < 0 && large));
		pl->lay_big[c] = (uint8_t)large;
		pl->lay_large |= large;
	}
	/* the placer asks for these per slice and device: computed once */
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		double in = (double)mo->shape.seq * mo->shape.hidden * dtype_bytes(md->dtype);
		pl->lay_saved[m] = pl->lay_redo[comp_of(pl, m)]
					   ? fmin(in, (double)mo->saved_per_sample)
					   : (double)mo->saved_per_sample;
		/* the state zero-1 shards: all but weights and gradients */
		pl->lay_opt[m] = pl->lay_shard[comp_of(pl, m)]
					 ? (double)mo->layer_state_bytes *
						   (double)opt_state_bytes(md->dtype, md->opt.kind) / (double)psb
					 : 0;
	}
	return 0;
}

double layout_comp_state(const planner_t *pl, int comp, int n)
{
	const sp_model_t *md = pl->model;
	double P = (double)comp_layer_params(&md->comps[comp]);
	double psb = (double)param_state_bytes(md->dtype, md->opt.kind);
	double whole = 2.0 * dtype_bytes(md->dtype); /* weights and gradients */
	if (!pl->lay_shard || !pl->lay_shard[comp] || n < 2)
		return P * psb;
	return P * (whole + (psb - whole) / n);
}

double layout_state_bytes(const planner_t *pl, int m, int n)
{
	double whole = (double)pl->mops[m].layer_state_bytes;
	if (!pl->lay_opt || n < 2)
		return whole;
	return whole - pl->lay_opt[m] * (1.0 - 1.0 / n);
}

double layout_saved_per_sample(const planner_t *pl, int m)
{
	return pl->lay_saved ? pl->lay_saved[m] : (double)pl->mops[m].saved_per_sample;
}

/* ---- the choice on a lowered plan --------------------------------------- */

/* Exact memory of the n devices devs[] after a change (safe: as
 * plan_memory_at); plan_memory's error passed up. */
static int remem(sp_plan_t *p, const int32_t *devs, int n, const int32_t *safe)
{
	for (int j = 0; j < n; j++) {
		sp_device_t *dv = &p->devices[devs[j]];
		int rc = plan_memory_at(p, devs[j], safe, dv->mem);
		if (rc)
			return rc;
		dv->mem_peak = 0;
		for (int c = 0; c < MEM__COUNT; c++)
			dv->mem_peak += dv->mem[c];
	}
	return 0;
}

/* The device furthest over the cap, or -1. */
static int worst_device(const planner_t *pl, const sp_plan_t *p)
{
	int worst = -1;
	double most = 0;
	for (int d = 0; d < p->n_devices; d++) {
		double over = (double)p->devices[d].mem_peak - pl->mem_cap;
		if (over > most) {
			most = over;
			worst = d;
		}
	}
	return worst;
}

/* Bytes of optimizer state zero-1 frees on each member of bucket b; of
 * all its state (weights and gradients too: the full layers gathered at a
 * use come on top) under zero-3. */
static double shard_saving(const sp_plan_t *p, int b)
{
	const sp_bucket_t *bk = &p->buckets[b];
	double opt = (double)(bk->layout == LAYOUT_ZERO3
				      ? param_state_bytes(p->model.dtype, p->model.opt.kind)
				      : opt_state_bytes(p->model.dtype, p->model.opt.kind));
	return bk->n_dev < 2 ? 0 : (double)bk->elems * opt * (1.0 - 1.0 / bk->n_dev);
}

static int remem(sp_plan_t *p, const int32_t *devs, int n, const int32_t *safe);

/* A bucket's overlap under layout: --rs-overlap on sets it on every zero-2
 * and zero-3 bucket; off and auto leave it 0 (auto tries it once the plan
 * is simulated: try_overlap). */
static int overlap_for(const planner_t *pl, int layout)
{
	return layout_grads_sharded(layout) && pl->opts->rs_overlap == 1;
}

/* Bucket bk's deferred all-gather under layout: only zero-1/2 gather after
 * the STEP; --defer-gather on defers every one, auto keeps what
 * try_defer chose (while the layout still gathers). */
static int defer_for(const planner_t *pl, const sp_bucket_t *bk, int layout)
{
	return layout_gathers_after_step(layout) &&
	       (pl->opts->defer_gather == 1 || (pl->opts->defer_gather < 0 && bk->defer));
}

/* Bucket b in layout; its prices and, exactly (plan_mem.c's formula: the
 * optimizer state of the elements a member owns), its members' memory:
 * between replicated and zero-1 by the difference in state, to or from
 * zero-2 by plan_memory again (its gradients depend on the program). 0 or
 * plan_memory's error. */
int set_layout(planner_t *pl, sp_plan_t *p, int b, int layout)
{
	sp_bucket_t *bk = &p->buckets[b];
	int db = dtype_bytes(p->model.dtype);
	int64_t opt = opt_state_bytes(p->model.dtype, p->model.opt.kind);
	int64_t E = bk->elems, n = bk->n_dev;
	if (layout != bk->layout && (layout == LAYOUT_ZERO2 || bk->layout == LAYOUT_ZERO2)) {
		bk->defer = defer_for(pl, bk, layout) ? bucket_defer_pieces(pl->cluster, p, b, db) : 0;
		bk->layout = layout;
		bk->overlap = overlap_for(pl, layout);
		bucket_price(pl->cluster, p, bk, db);
		return remem(p, p->bucket_devs + bk->dev_off, bk->n_dev, NULL);
	}
	for (int q = 0; q < bk->n_dev && layout != bk->layout; q++) {
		/* member q owns E*q/n .. E*(q+1)/n under zero-1 (bucket_shard) */
		int64_t shard = E * (q + 1) / n - E * q / n;
		int64_t delta = (layout == LAYOUT_ZERO1 ? shard - E : E - shard) * opt;
		sp_device_t *dv = &p->devices[p->bucket_devs[bk->dev_off + q]];
		dv->mem[MEM_PARAMS] += delta;
		dv->mem_peak += delta;
	}
	bk->defer = defer_for(pl, bk, layout) ? bucket_defer_pieces(pl->cluster, p, b, db) : 0;
	bk->layout = layout;
	bucket_price(pl->cluster, p, bk, db);
	return 0;
}

/* The replicated bucket of 2+ devices with d as a member that frees the
 * most on d, or -1. */
static int best_bucket(const sp_plan_t *p, int d)
{
	int best = -1;
	double most = 0;
	int64_t off, n;
	for (int b = 0; b < p->n_buckets; b++) {
		double s = shard_saving(p, b);
		if (p->buckets[b].layout == LAYOUT_REPLICATED && s > most &&
		    bucket_shard(p, b, d, &off, &n) >= 0) {
			most = s;
			best = b;
		}
	}
	return best;
}

/* 1 when device d runs slice s. */
static int slice_on(const sp_plan_t *p, const sp_slice_t *s, int d)
{
	for (int j = 0; j < s->n_dev; j++)
		if (p->slice_devs[s->dev_off + j] == d)
			return 1;
	return 0;
}

/* The keeping transformer slice on d that frees the most activation bytes
 * per ms of re-run forward (per sample: both scale with the local batch),
 * or -1. */
static int best_slice(const planner_t *pl, const sp_plan_t *p, int d)
{
	int best = -1;
	double most = 0;
	for (int i = 0; i < p->n_slices; i++) {
		const sp_slice_t *s = &p->slices[i];
		const metaop_t *mo = &pl->mops[s->metaop];
		if (s->recompute || mo->shape.type != COMP_TRANSFORMER || !slice_on(p, s, d))
			continue;
		int db = dtype_bytes(p->model.dtype), groups = s->n_dev / s->tp;
		double in = (double)op_kept_elems(&mo->shape, s->tp, s->sp) * db;
		double f, b;
		int64_t local = (mo->batch + groups - 1) / groups; /* a TP group's samples */
		cost_layer_sp(pl, s->metaop, local, s->tp, s->sp, &f, &b); /* a member's shard */
		double saved = (double)op_saved_elems_sp(&mo->shape, mo->batch, s->tp, s->sp) * db;
		double rate = (saved - in) * (double)local / f;
		if (rate > most) {
			most = rate;
			best = i;
		}
	}
	return best;
}

/*
 * --zero auto with one micro-batch: zero-2 instead of zero-1 where it
 * saves (fit_memory_at asks when the cap needs it). Zero-2 moves the bytes
 * of zero-1 (the same reduce-scatter and all-gather; its waits are the
 * simulator's) but its gradient memory is a walk over the program
 * (plan_mem.c): a device's full gradients count only while live, plus the
 * shards. A device in one sharded bucket only gains nothing (its full
 * gradient is live at some point anyway, and the shard is more); one whose
 * buckets' full gradients are live at different times saves all but the
 * largest at once. So every zero-1 bucket goes zero-2 together, kept when
 * that raises no device's memory and lowers some (plan_zero2_grads: one
 * walk per device, plan_z2_safe's points computed once), else all stay
 * zero-1: one choice for the plan, not per bucket (buckets interact
 * through the walk; a per-bucket search cost planning time for no gain on
 * the bundled workloads). At k > 1 micro-batches every full gradient is
 * live across the micro-steps and zero-2 never saves: nothing is tried.
 * Buckets an earlier call made zero-2 stay so; only the zero-1 ones are
 * judged, by the change from the plan as it is. Returns the number of
 * buckets made zero-2, or an error code.
 */
static int choose_zero2(planner_t *pl, sp_plan_t *p)
{
	if (pl->opts->zero >= 0 || p->microbatches != 1)
		return 0;
	int tried = 0, n = 0, rc = 0, gain = 0, loss = 0;
	/* a device gains only with two sharded buckets or more, and only if
	 * some bucket is still zero-1 */
	int *nz = calloc((size_t)p->n_devices + 1, sizeof *nz), any1 = 0;
	if (!nz)
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++) {
		any1 |= p->buckets[b].layout == LAYOUT_ZERO1;
		for (int q = 0; layout_sharded(p->buckets[b].layout) && q < p->buckets[b].n_dev; q++)
			tried |= ++nz[p->bucket_devs[p->buckets[b].dev_off + q]] >= 2;
	}
	free(nz);
	if (!tried || !any1)
		return 0;
	/* buckets already zero-2 (an earlier call kept them) have their saving
	 * in the devices' memory: z0, what they save now; the choice is about
	 * the zero-1 buckets alone, judged and applied as z - z0 */
	int32_t *safe = NULL; /* for each set of zero-2 buckets: once */
	int64_t *z = calloc((size_t)p->n_devices + 1, sizeof *z);
	int64_t *z0 = calloc((size_t)p->n_devices + 1, sizeof *z0);
	uint8_t *fresh = calloc((size_t)p->n_buckets + 1, 1);
	int had = 0;
	if (!z || !z0 || !fresh)
		rc = SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++)
		had |= p->buckets[b].layout == LAYOUT_ZERO2;
	if (had && !rc && !(rc = plan_z2_safe(p, &safe) ? SP_ENOMEM : 0)) {
		for (int d = 0; d < p->n_devices && !rc; d++)
			rc = plan_zero2_grads_at(p, d, safe, &z0[d]);
		free(safe);
		safe = NULL;
	}
	for (int b = 0; b < p->n_buckets && !rc; b++)
		if (p->buckets[b].layout == LAYOUT_ZERO1) {
			p->buckets[b].layout = LAYOUT_ZERO2;
			p->buckets[b].overlap = overlap_for(pl, LAYOUT_ZERO2);
			fresh[b] = 1;
			n++;
		}
	if (!rc && plan_z2_safe(p, &safe))
		rc = SP_ENOMEM;
	for (int d = 0; d < p->n_devices && !rc && !loss; d++) {
		rc = plan_zero2_grads_at(p, d, safe, &z[d]);
		z[d] -= z0[d];
		gain |= z[d] < 0;
		loss |= z[d] > 0;
	}
	int keep = !rc && gain && !loss;
	for (int b = 0; b < p->n_buckets; b++)
		if (fresh && fresh[b]) {
			p->buckets[b].layout = keep ? LAYOUT_ZERO2 : LAYOUT_ZERO1;
			p->buckets[b].overlap = overlap_for(pl, p->buckets[b].layout);
			bucket_price(pl->cluster, p, &p->buckets[b], dtype_bytes(p->model.dtype));
		}
	/* kept: every device's memory again by plan_mem's formula (exact,
	 * whatever was zero-2 before) */
	int32_t *all = keep ? calloc((size_t)p->n_devices + 1, sizeof *all) : NULL;
	if (keep && !all)
		rc = SP_ENOMEM;
	for (int d = 0; all && d < p->n_devices; d++)
		all[d] = d;
	if (all && !rc)
		rc = remem(p, all, p->n_devices, safe);
	free(all);
	free(z);
	free(z0);
	free(fresh);
	free(safe);
	return rc ? rc : keep ? n : 0;
}

/* While a device is over the cap: shard a bucket (zero-1, then zero-2
 * where it saves more: choose_zero2), else recompute a slice (as far as
 * auto may). Returns 1 | 2 when it sharded | recomputed, or a negative
 * code. *safe: plan_z2_safe's points, made when first needed. */
static int fit_memory_at(planner_t *pl, sp_plan_t *p, int32_t **safe)
{
	int changes = 0, d, z2 = 0;
	while ((d = worst_device(pl, p)) >= 0) {
		int b = pl->opts->zero < 0 ? best_bucket(p, d) : -1;
		if (b >= 0) {
			set_layout(pl, p, b, LAYOUT_ZERO1);
			changes |= 1;
			continue;
		}
		if (!z2) { /* once, with every bucket the cap needs in zero-1 */
			z2 = 1;
			int kept = choose_zero2(pl, p);
			if (kept < 0)
				return kept;
			if (kept) {
				changes |= 1;
				continue;
			}
		}
		int s = pl->opts->recompute < 0 ? best_slice(pl, p, d) : -1;
		if (s < 0)
			break; /* nothing left to buy memory back on d */
		p->slices[s].recompute = 1;
		if (!*safe && plan_z2_safe(p, safe))
			return SP_ENOMEM;
		if (remem(p, p->slice_devs + p->slices[s].dev_off, p->slices[s].n_dev, *safe))
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		changes |= 2;
	}
	return changes;
}

/* Under --zero auto, after fit_memory_at: the zero-2 buckets back in
 * zero-1 when the plan still fits so (fit_memory_at takes zero-2 before
 * recomputing; the slices it then made recompute can leave zero-2 with
 * nothing to do). The plan is then the same but for its waits: zero-2's
 * reduce-scatters complete before the next full gradient is placed
 * (sim.c); layout_trial tries zero-2 again on time. 1 when it changed the
 * plan, 0, or plan_memory's error. */
static int drop_zero2(planner_t *pl, sp_plan_t *p)
{
	int n = 0, rc = 0;
	for (int b = 0; b < p->n_buckets && pl->opts->zero < 0; b++)
		n += p->buckets[b].layout == LAYOUT_ZERO2;
	if (!n)
		return 0;
	int z3 = 0;
	for (int b = 0; b < p->n_buckets; b++)
		z3 |= p->buckets[b].layout == LAYOUT_ZERO3;
	/* zero-2's points once, as they are in both passes; with zero-3
	 * buckets too they depend on which buckets are zero-2: each memory
	 * walk makes its own (NULL) */
	uint8_t *was = calloc((size_t)p->n_buckets + 1, 1);
	int32_t *all = calloc((size_t)p->n_devices + 1, sizeof *all), *safe = NULL;
	if (!was || !all || (!z3 && plan_z2_safe(p, &safe))) {
		free(was);
		free(all);
		return SP_ENOMEM;
	}
	for (int d = 0; d < p->n_devices; d++)
		all[d] = d;
	for (int pass = 0; pass < 2; pass++) {
		for (int b = 0; b < p->n_buckets; b++) {
			int to = pass ? LAYOUT_ZERO2 : LAYOUT_ZERO1;
			if (pass ? was[b] : p->buckets[b].layout == LAYOUT_ZERO2) {
				was[b] = 1;
				p->buckets[b].layout = to;
				p->buckets[b].overlap = overlap_for(pl, to);
				bucket_price(pl->cluster, p, &p->buckets[b], dtype_bytes(p->model.dtype));
			}
		}
		if ((rc = remem(p, all, p->n_devices, safe)) || worst_device(pl, p) < 0)
			break; /* fits in zero-1 (pass 0), or zero-2 as it was (pass 1) */
	}
	int fits = !rc && worst_device(pl, p) < 0;
	int dropped = 0;
	for (int b = 0; b < p->n_buckets; b++)
		dropped |= was[b] && p->buckets[b].layout == LAYOUT_ZERO1;
	free(was);
	free(all);
	free(safe);
	return rc ? rc : fits && dropped;
}

static int fit_memory(planner_t *pl, sp_plan_t *p)
{
	/* the programs do not change here: zero-2's points once, when a
	 * zero-2 bucket needs them */
	int32_t *safe = NULL;
	int rc = fit_memory_at(pl, p, &safe);
	free(safe);
	int dropped = rc >= 0 ? drop_zero2(pl, p) : 0;
	return dropped < 0 ? dropped : rc | dropped;
}

/* Any algorithm's plan, in a model with a large component: every remaining bucket of 2+
 * devices (of any component: a small one's shard step and halves can
 * beat its all-reduce and full step too) in zero-1 at once, kept when the
 * iteration is not slower than res (the plan's); else the plan's memory and
 * predicted times as they were. */
static int try_shard_all(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int tried = 0, rc = 0;
	sp_arena_t *a = &pl->scratch; /* the candidate's: given back below */
	sp_arena_mark_t mark = sp_arena_mark(a);
	trial_save_t t;
	if ((rc = trial_save(pl, a, p, &t)))
		goto cleanup;
	for (int b = 0; b < p->n_buckets; b++)
		if (p->buckets[b].layout == LAYOUT_REPLICATED && p->buckets[b].n_dev >= 2) {
			set_layout(pl, p, b, LAYOUT_ZERO1);
			tried++;
		}
	sim_result_t r = *res;
	if (tried && !(rc = regather(pl, p)))
		sim_stats_note("trial shard_all", p);
	if (!tried || rc || (rc = sim_sync_again(pl, p, &r)))
		goto cleanup;
	if (r.iteration_ms <= res->iteration_ms * (1 + 1e-9))
		*res = r;
	else
		rc = trial_restore(pl, p, &t);
cleanup:
	sp_arena_reset(a, mark);
	return rc;
}

/* --zero auto, a plan fitted with zero-2 (fit_memory_at takes it before
 * recomputing): the other way to fit, every zero-2 bucket back in zero-1
 * and more slices recomputing (best_slice, as fit_memory_at picks them),
 * simulated in full (recomputation changes the compute) and kept when
 * faster: zero-2's waits for its reduce-scatters can cost more than a
 * forward re-run. Else the plan as it was. */
static int try_zero1_recompute(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int n = 0, rc = 0, d;
	for (int b = 0; b < p->n_buckets && pl->opts->zero < 0 && pl->opts->recompute < 0; b++)
		n += p->buckets[b].layout == LAYOUT_ZERO2;
	if (!n)
		return 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	trial_save_t t;
	int32_t *all = sp_arena_calloc(a, (size_t)p->n_devices + 1, sizeof *all);
	if (!all || (rc = trial_save(pl, a, p, &t)))
		goto cleanup;
	for (int i = 0; i < p->n_devices; i++)
		all[i] = i;
	for (int b = 0; b < p->n_buckets; b++)
		if (p->buckets[b].layout == LAYOUT_ZERO2) {
			p->buckets[b].layout = LAYOUT_ZERO1;
			p->buckets[b].overlap = 0;
			bucket_price(pl->cluster, p, &p->buckets[b], dtype_bytes(p->model.dtype));
		}
	if ((rc = remem(p, all, p->n_devices, NULL)))
		goto cleanup;
	int fits = 1;
	while (fits && (d = worst_device(pl, p)) >= 0) {
		int s = best_slice(pl, p, d);
		if (s < 0) {
			fits = 0;
			break;
		}
		p->slices[s].recompute = 1;
		if ((rc = remem(p, p->slice_devs + p->slices[s].dev_off, p->slices[s].n_dev, NULL)))
			goto cleanup;
	}
	sim_result_t r;
	if (fits && !(rc = regather(pl, p)))
		sim_stats_note("trial zero1_recompute", p);
	if (fits && !rc &&
	    !(rc = res->partial ? sim_iteration(pl, p, &r) : sim_run(pl, p, 1, &r)) &&
	    r.iteration_ms < res->iteration_ms * (1 - 1e-9))
		*res = r;
	else if (!rc)
		rc = trial_restore(pl, p, &t);
cleanup:
	sp_arena_reset(a, mark);
	return rc ? rc : !all ? SP_ENOMEM : 0;
}

/* --rs-overlap auto, a plan with zero-2 or zero-3 buckets: every one of
 * them overlapped at once (its reduce-scatter completes one placement
 * later, beside the next bucket's backward: plan_z2_walk), kept when every
 * device still fits (one more full gradient can be live) and the simulator
 * says the iteration is faster; else the plan as it was. One choice for
 * the plan, as choose_zero2's. */
static int try_overlap(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int n = 0, rc = 0;
	for (int b = 0; b < p->n_buckets && pl->opts->rs_overlap < 0; b++)
		n += layout_grads_sharded(p->buckets[b].layout) && !p->buckets[b].overlap;
	if (!n)
		return 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	trial_save_t t;
	int32_t *safe = NULL; /* the programs do not change: once */
	int32_t *all = sp_arena_calloc(a, (size_t)p->n_devices + 1, sizeof *all);
	if (!all || (rc = trial_save(pl, a, p, &t)))
		goto cleanup;
	for (int d = 0; d < p->n_devices; d++)
		all[d] = d;
	for (int b = 0; b < p->n_buckets; b++)
		p->buckets[b].overlap |= layout_grads_sharded(p->buckets[b].layout);
	if (plan_z2_safe(p, &safe)) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	if ((rc = remem(p, all, p->n_devices, safe)))
		goto cleanup;
	sim_result_t r = *res;
	int fits = worst_device(pl, p) < 0;
	if (fits)
		sim_stats_note("trial overlap", p);
	if (fits && !(rc = sim_sync_again(pl, p, &r)) &&
	    r.iteration_ms < res->iteration_ms * (1 - 1e-9))
		*res = r;
	else if (!rc)
		rc = trial_restore(pl, p, &t);
cleanup:
	free(safe);
	sp_arena_reset(a, mark);
	return rc ? rc : !all ? SP_ENOMEM : 0;
}

/* rc, with a message when it is an allocation failure of this file (a
 * lower level's error, already in err, is kept). */
int no_memory(planner_t *pl, int rc)
{
	if (rc == SP_ENOMEM && !pl->err->code)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return rc;
}

int layout_fit(planner_t *pl, sp_plan_t *p)
{
	if (pl->opts->zero >= 0 && pl->opts->recompute >= 0)
		return 0; /* both forced: lowering chose */
	int changed = fit_memory(pl, p);
	return no_memory(pl, changed > 0 ? regather(pl, p) : changed);
}

int layout_trial(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	int rc = pl->opts->zero < 0 && pl->lay_large ? try_shard_all(pl, p, res) : 0;
	if (!rc)
		rc = try_overlap(pl, p, res);
	return no_memory(pl, rc ? rc : try_zero1_recompute(pl, p, res));
}

/* ---- zero-3 under auto ------------------------------------------------------ */

/* The schedule and placement plan p was lowered from, into *s and *pc (in
 * pl->scratch): its slices' MetaOps, layers, widths, degrees, waves and
 * devices. The nominal times are the simulator's (lowering only copies
 * them; the simulator sets them again). */
static int plan_schedule(planner_t *pl, const sp_plan_t *p, sched_t *s, place_t *pc)
{
	algo_t a;
	if (algo_parse(p->algo, &a))
		a = ALGO_SPINDLE;
	sched_init(s, a, &pl->scratch);
	s->s = sp_arena_calloc(&pl->scratch, (size_t)p->n_slices + 1, sizeof *s->s);
	pc->off = sp_arena_calloc(&pl->scratch, (size_t)p->n_slices + 1, sizeof *pc->off);
	if (!s->s || !pc->off)
		return SP_ENOMEM;
	for (int i = 0; i < p->n_slices; i++) {
		const sp_slice_t *x = &p->slices[i];
		s->s[i] = (sslice_t){.metaop = x->metaop, .lf = x->layer_from, .lt = x->layer_to,
				     .n = x->n_dev, .wave = x->wave, .t0 = x->start_ms,
				     .t1 = x->start_ms + x->fwd_ms, .dev_off = -1, .tp = x->tp};
		pc->off[i] = x->dev_off;
	}
	s->n = s->cap = p->n_slices;
	s->n_waves = p->n_waves;
	pc->devs = p->slice_devs;
	return 0;
}

int layout_zero3(planner_t *pl, sp_plan_t *p, sim_result_t *res)
{
	if (pl->opts->zero >= 0 || !pl->lay_large || !p->n_slices || worst_device(pl, p) < 0)
		return 0;
	sp_arena_t *a = &pl->scratch;
	sp_arena_mark_t mark = sp_arena_mark(a);
	sched_t s;
	place_t pc;
	sp_plan_t q = {0};
	sim_result_t r = {0};
	int rc = plan_schedule(pl, p, &s, &pc), any = 0;
	if (rc)
		rc = no_memory(pl, rc);
	else
		rc = lower_run_z3(pl, &s, &pc, pl->lay_big, &q);
	for (int b = 0; !rc && b < q.n_buckets; b++)
		any |= q.buckets[b].layout == LAYOUT_ZERO3;
	if (!rc && any && !(rc = memplan_run(pl, &q, 0)) && !(rc = layout_fit(pl, &q)))
		sim_stats_note("zero3", &q);
	if (!rc && any && !(rc = sim_run(pl, &q, 1, &r)))
		rc = layout_trial(pl, &q, &r);
	sp_arena_reset(a, mark);
	int keep = 0;
	if (!rc && any) /* p is over the cap: q is kept when it fits */
		keep = worst_device(pl, &q) < 0;
	if (keep) {
		plan_release(p);
		*p = q;
		*res = r;
	} else {
		plan_release(&q);
	}
	return rc ? rc : keep;
}

/* ---- the report ----------------------------------------------------------- */

/* Bytes slice s frees per device by recomputing: each layer keeps its input
 * instead of everything it saves (one shard's under tensor parallelism),
 * at the slice's local batch (its group's samples). */
static double slice_saving(const sp_plan_t *p, const sp_slice_t *s)
{
	const sp_metaop_t *mo = &p->metaops[s->metaop];
	int db = dtype_bytes(p->model.dtype);
	int64_t B = p->model.tasks[mo->task].batch;
	int64_t groups = s->n_dev / s->tp, local = (B + groups - 1) / groups;
	double saved = (double)op_saved_elems_sp(&mo->shape, B, s->tp, s->sp);
	double in = (double)op_kept_elems(&mo->shape, s->tp, s->sp);
	return (saved - in) * db * (double)local * (s->layer_to - s->layer_from);
}

/* Per MetaOp: slices, recomputing ones, bytes freed on its worst device and
 * forward time re-run (the recomputing slices' forward spans). */
typedef struct {
	int n, redo;
	double saved, added_ms;
} mop_policy_t;

static void mop_policy(const sp_plan_t *p, int m, mop_policy_t *out)
{
	memset(out, 0, sizeof *out);
	for (int i = 0; i < p->n_slices; i++) {
		const sp_slice_t *s = &p->slices[i];
		if (s->metaop != m)
			continue;
		out->n++;
		if (s->recompute) {
			out->redo++;
			out->saved = fmax(out->saved, slice_saving(p, s));
			out->added_ms += s->fwd_ms;
		}
	}
}

/* The most gradient bytes zero-2 saves on one device beyond zero-1's
 * saving (plan_zero2_grads), and that device in *dev (-1: no device has a
 * zero-2 bucket). */
static double zero2_saved(const sp_plan_t *p, int *dev)
{
	double most = 0;
	int any = 0;
	*dev = -1;
	for (int b = 0; b < p->n_buckets; b++)
		any |= p->buckets[b].layout == LAYOUT_ZERO2;
	for (int d = 0; any && d < p->n_devices; d++) {
		int64_t z = 0;
		if (plan_zero2_grads(p, d, &z) == 0 && (*dev < 0 || (double)-z > most)) {
			most = (double)-z;
			*dev = d;
		}
	}
	return most;
}

/* "vision 0-47" for bucket b's parameters (the first component's range;
 * "+" when more components share the bucket). */
static void bucket_name(char *buf, size_t cap, const sp_plan_t *p, const sp_bucket_t *bk)
{
	const sp_param_t *q = p->bucket_params + bk->param_off;
	int lo = q[0].layer, hi = q[0].layer, more = 0;
	for (int k = 1; k < bk->n_params; k++) {
		if (q[k].comp != q[0].comp) {
			more = 1;
			continue;
		}
		lo = SP_MIN(lo, q[k].layer);
		hi = SP_MAX(hi, q[k].layer);
	}
	snprintf(buf, cap, "%s %d-%d%s", p->model.comps[q[0].comp].name, lo, hi, more ? " +" : "");
}

void layout_report(FILE *f, const sp_plan_t *p, double earlier_ms)
{
	double gib = 1024.0 * 1024.0 * 1024.0;
	int forced = strstr(p->options, "zero=1") || strstr(p->options, "zero=2");
	fprintf(f, "\nmicro-batches: %d micro-steps per step (%.3f ms before the last one); "
		   "per task micro-batches x micro-batch:\n ",
		p->microbatches, earlier_ms);
	for (int t = 0; t < p->model.n_tasks; t++)
		fprintf(f, "%s %s %d x %lld", t ? "," : "", p->model.tasks[t].name,
			plan_task_k(p, t), (long long)p->model.tasks[t].batch);
	fprintf(f, "\n");
	fprintf(f, "\nlayouts (zero-3 under auto: the large components' buckets when only "
		   "it fits)\n  %-4s %-22s %6s %12s %-10s %13s %12s %12s\n",
		"bkt", "parameters", "group", "elements", "layout", "saved GiB/dev", "sync ms",
		"gather ms");
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		char nm[SP_NAME_MAX + 32];
		bucket_name(nm, sizeof nm, p, bk);
		fprintf(f, "  %-4d %-22s %6d %12lld %-10s %13.3f %12.3f %12.3f%s%s\n", b, nm,
			bk->n_dev, (long long)bk->elems, layout_name(bk->layout),
			layout_sharded(bk->layout) ? shard_saving(p, b) / gib : 0.0, bk->sync_ms,
			bk->gather_ms, bk->overlap ? "  overlapped" : bk->defer ? "  deferred" : "",
			forced && bk->n_dev < 2 ? "  (--zero 1|2: a group of 1 stays replicated)"
						: "");
	}
	int zd;
	double z2 = zero2_saved(p, &zd);
	if (zd >= 0)
		fprintf(f, "  zero-2 gradients (shards, full gradients only from first write to "
			   "SYNC): up to %.3f GiB/dev more saved (device %d)\n",
			z2 / gib, zd);
	fprintf(f, "  %-32s %6s %9s %14s %12s\n", "MetaOp", "slices", "recompute",
		"saved GiB/dev", "added ms");
	for (int m = 0; m < p->n_metaops; m++) {
		mop_policy_t mp;
		mop_policy(p, m, &mp);
		if (p->metaops[m].shape.type == COMP_TRANSFORMER)
			fprintf(f, "  %-32s %6d %9d %14.3f %12.3f\n", p->metaops[m].name, mp.n,
				mp.redo, mp.saved / gib, mp.added_ms);
	}
}

void layout_json(FILE *f, const sp_plan_t *p, double earlier_ms)
{
	fprintf(f, ",\n  \"microbatches\": %d,\n  \"microbatch_earlier_ms\": %.6f,\n"
		   "  \"task_microbatches\": {",
		p->microbatches, earlier_ms);
	for (int t = 0; t < p->model.n_tasks; t++) {
		fprintf(f, "%s", t ? ", " : "");
		sp_json_str(f, p->model.tasks[t].name);
		fprintf(f, ": %d", plan_task_k(p, t));
	}
	fprintf(f, "},\n  \"buckets\": [");
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		char nm[SP_NAME_MAX + 32];
		bucket_name(nm, sizeof nm, p, bk);
		fprintf(f, "%s\n    {\"parameters\": ", b ? "," : "");
		sp_json_str(f, nm);
		fprintf(f, ", \"devices\": %d, \"elements\": %lld, \"layout\": \"%s\", "
			   "\"saved_bytes_per_device\": %.0f, \"sync_ms\": %.6f, \"gather_ms\": %.6f, "
			   "\"overlap\": %s, \"defer\": %s}",
			bk->n_dev, (long long)bk->elems, layout_name(bk->layout),
			layout_sharded(bk->layout) ? shard_saving(p, b) : 0.0, bk->sync_ms,
			bk->gather_ms, bk->overlap ? "true" : "false", bk->defer ? "true" : "false");
	}
	fprintf(f, "\n  ]");
	int zd;
	double z2 = zero2_saved(p, &zd);
	if (zd >= 0) /* zero-2's gradient saving beyond the state's, on its best device */
		fprintf(f, ",\n  \"zero2_grad_saved_bytes\": %.0f, \"zero2_grad_saved_device\": %d",
			z2, zd);
	fprintf(f, ",\n  \"metaops\": [");
	for (int m = 0; m < p->n_metaops; m++) {
		mop_policy_t mp;
		mop_policy(p, m, &mp);
		fprintf(f, "%s\n    {\"name\": ", m ? "," : "");
		sp_json_str(f, p->metaops[m].name);
		fprintf(f, ", \"slices\": %d, \"recompute\": %d, \"saved_bytes_per_device\": %.0f, "
			   "\"added_ms\": %.6f}",
			mp.n, mp.redo, mp.saved, mp.added_ms);
	}
	fprintf(f, "\n  ]");
}

/* ---- when nothing fits ---------------------------------------------------- */

/* 1 when the inputs plan and fit under options o on cluster c (a full
 * re-plan, without advice of its own). With forced micro-batches
 * pl->model holds the micro-batch already: one micro-batch of it. */
static int fits_with(const planner_t *pl, const plan_opts_t *o, const sp_cluster_t *c)
{
	plan_opts_t q = *o;
	q.compare = 0;
	q.no_advice = 1;
	q.microbatches = SP_MIN(q.microbatches, 1);
	q.mb_tasks = NULL;
	sp_err_t err = {0};
	sp_plan_t p = {0};
	plan_summary_t sum;
	int rc = planner_run(&q, pl->model, c, &p, &sum, &err);
	plan_release(&p);
	return rc == 0;
}

/* The most nodes the advice tries: 8 times as many, at most 1024 devices
 * (the largest cluster of the planner's benchmark, tools/bench-plan), so
 * that the advice costs a few plans of the size the planner is tried on. */
static int max_nodes(const planner_t *pl)
{
	return SP_MIN(8 * pl->cluster->nodes, SP_MAX(1024 / pl->cluster->gpus_per_node, 1));
}

/* The smallest node count (more than today's, at most max_nodes) on which
 * the inputs fit under o: doubling, then bisection; 0 if none. */
static int nodes_that_fit(const planner_t *pl, const plan_opts_t *o)
{
	sp_cluster_t c = *pl->cluster;
	int lo = pl->cluster->nodes, hi = 0;
	for (int k = 2 * lo; k <= max_nodes(pl) && !hi; k *= 2) {
		c.nodes = k;
		if (fits_with(pl, o, &c))
			hi = k;
		else
			lo = k;
	}
	if (!hi && lo < max_nodes(pl)) { /* the last doubling overshot the limit */
		c.nodes = max_nodes(pl);
		hi = fits_with(pl, o, &c) ? c.nodes : 0;
	}
	while (hi && hi - lo > 1) {
		c.nodes = lo + (hi - lo) / 2;
		if (fits_with(pl, o, &c))
			hi = c.nodes;
		else
			lo = c.nodes;
	}
	return hi;
}

/* Forced micro-batches that do not fit: the first more that do, per task,
 * on top of the forced ones (pl->model holds their micro-batches), as a
 * hint; SP_EINPUT with the hint, 0 when none fit. */
static int advise_microbatches(planner_t *pl)
{
	const sp_model_t *m = pl->model;
	int *k = calloc((size_t)m->n_tasks + 1, sizeof *k), uni = 0, rc = 0;
	char opt[256], words[512];
	if (!k || !microbatch_fit(pl->opts, m, pl->cluster, k)) {
		free(k);
		return 0;
	}
	for (int t = 0; t < m->n_tasks; t++)
		k[t] *= m->tasks[t].microbatches > 0 ? m->tasks[t].microbatches : pl->k;
	mb_describe(opt, sizeof opt, m, k, &uni);
	/* "2 micro-batches", or "4 micro-batches for 'text', 2 for 'image'" */
	int len = 0;
	if (uni)
		snprintf(words, sizeof words, "%d micro-batches", k[0]);
	for (int t = 0; !uni && t < m->n_tasks && len < (int)sizeof words - 80; t++)
		if (k[t] > 1)
			len += snprintf(words + len, sizeof words - (size_t)len,
					len ? ", %d for '%s'" : "%d micro-batches for '%s'", k[t],
					m->tasks[t].name);
	sp_err_hint(pl->err, "fits with %s (--microbatches %s)", words, opt);
	pl->err->code = rc = SP_EINPUT;
	free(k);
	return rc;
}

int layout_advise(planner_t *pl, const sp_plan_t *closest)
{
	const plan_opts_t *o = pl->opts;
	int rc, forced = o->zero == 0 || o->recompute == 0;
	if (o->no_advice || pl->cluster->nodes >= max_nodes(pl))
		return SP_EINFEAS;
	plan_opts_t q = *o;
	/* 1. the layouts the options forbade */
	q.zero = o->zero == 0 ? -1 : o->zero;
	q.recompute = o->recompute == 0 ? -1 : o->recompute;
	if (forced && fits_with(pl, &q, pl->cluster)) {
		sp_err_hint(pl->err, "fits with --zero %s --recompute %s (zero-1 and recomputation "
				     "where memory needs them)",
			    q.zero < 0 ? "auto" : "1", q.recompute < 0 ? "auto" : "all");
		pl->err->code = SP_EINPUT;
		return SP_EINPUT;
	}
	/* 1b. zero-3, which auto does not choose: the weights sharded too */
	q = *o;
	q.zero = 3;
	q.recompute = o->recompute == 0 ? -1 : o->recompute;
	if (o->zero != 3 && fits_with(pl, &q, pl->cluster)) {
		sp_err_hint(pl->err, "fits with --zero 3%s (weights sharded too, all-gathered "
				     "before each slice's use)",
			    q.recompute != o->recompute ? " --recompute auto" : "");
		pl->err->code = SP_EINPUT;
		return SP_EINPUT;
	}
	/* 2. more micro-batches, when their number was forced (auto tried them) */
	if (o->microbatches > 0 && (rc = advise_microbatches(pl)))
		return rc;
	/* 3. a smaller reserve: the closest plan's peak within the device */
	int64_t peak = 0;
	for (int d = 0; d < closest->n_devices; d++)
		peak = SP_MAX(peak, closest->devices[d].mem_peak);
	double room = pl->cluster->memory_gib - (double)peak / (1024.0 * 1024.0 * 1024.0);
	q = *o;
	q.mem_reserve_gib = floor(room * 10) / 10; /* a reserve of whole 0.1 GiB */
	if (q.mem_reserve_gib >= 0 && q.mem_reserve_gib < o->mem_reserve_gib &&
	    fits_with(pl, &q, pl->cluster)) {
		sp_err_hint(pl->err, "fits with --mem-reserve %.1f", q.mem_reserve_gib);
		return SP_EINFEAS;
	}
	/* 4. more nodes, with the layouts as asked and, if forced, with auto */
	q = *o;
	int n = nodes_that_fit(pl, &q);
	if (!n && forced) {
		q.zero = o->zero == 0 ? -1 : o->zero;
		q.recompute = o->recompute == 0 ? -1 : o->recompute;
		n = nodes_that_fit(pl, &q);
	}
	int G = pl->cluster->gpus_per_node;
	if (n)
		sp_err_hint(pl->err, "fits on %d or more nodes of %d (%d or more devices)%s", n, G,
			    n * G,
			    q.zero < 0 || q.recompute < 0
				    ? " with zero-1 and recomputation where memory needs them"
				    : "");
	else
		sp_err_hint(pl->err, "no plan fits on up to %d nodes of %d either: use larger "
				     "devices or smaller batches",
			    max_nodes(pl), G);
	return SP_EINFEAS;
}

int layout_forced_check(planner_t *pl, const sp_plan_t *p)
{
	if (pl->opts->zero < 1)
		return 0;
	for (int b = 0; b < p->n_buckets; b++)
		if (layout_sharded(p->buckets[b].layout))
			return 0;
	if (!p->n_buckets)
		return 0;
	int rc = sp_err_set(pl->err, SP_EINPUT, NULL, 0, 0, NULL,
			    "--zero %d: every sync group of the plan has a single device, so "
			    "there is no %s to shard",
			    pl->opts->zero, pl->opts->zero == 3 ? "state" : "optimizer state");
	sp_err_hint(pl->err, "use --zero auto or --zero 0 (groups of one device stay "
			     "replicated)");
	return rc;
}
