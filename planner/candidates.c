/*
 * candidates.c — our scheduler's candidates, as data: a fixed table of
 * named rows (how widths are allotted, which scheduler, its memory
 * fraction and limits) that plan.c walks, evaluating each candidate's plan
 * with the simulator and keeping the fastest that fits memory. This file
 * also holds the walk's per-run state (each allotment, computed once). It
 * does not judge plans (plan.c does) and holds no algorithm itself: those
 * are allot.c, sched_list.c, sched_lanes.c, sched_pack.c and sched_paper.c.
 *
 * Adding a candidate is one row here plus its code.
 */
#include "planner.h"

#include <string.h>

/* The local search tunes the MILP widths on list schedules whose segments
 * take at most this fraction of the cap. */
#define SEARCH_FRAC 0.7
#define LANE_ROUNDS 3

const sched_cand_t sched_cands[] = {
	{.name = "milp-list", .allot = CAND_ALLOT_MILP, .sched = CAND_LIST, .mem_frac = 0.7},
	/* nothing new (skipped) when the separable widths are the MILP's */
	{.name = "separable-list", .allot = CAND_ALLOT_SEPARABLE, .sched = CAND_LIST,
	 .mem_frac = 0.7},
	/* the paper's waves over the whole DAG (no level barrier) */
	{.name = "paper-dag", .sched = CAND_PAPER_DAG},
	/* Memory fallbacks: the MILP widths (searched once, at SEARCH_FRAC: the
	 * widths are a cost choice) scheduled with smaller segments, so that a
	 * workload whose segments do not fit at 70% of the cap still gets
	 * these widths. Intended: the widths are not searched again here. */
	{.name = "milp-list-mem40", .allot = CAND_ALLOT_MILP, .sched = CAND_LIST, .mem_frac = 0.4},
	{.name = "milp-list-mem20", .allot = CAND_ALLOT_MILP, .sched = CAND_LIST, .mem_frac = 0.2},
	/* lanes: independent chains share the devices as a fluid made integral
	 * with McNaughton's wrap-around rule, three ways to split */
	{.name = "lanes", .allot = CAND_ALLOT_MILP, .sched = CAND_LANES,
	 .lanes = {LANE_SPLIT_HULL, 3, 0, LANE_ROUNDS}},
	/* lanes with components apart: no device mixes two components'
	 * gradients, so their syncs do not queue behind each other and
	 * align.c can lay each on whole nodes (sync over compute); on one
	 * node every group is on NVLink anyway */
	{.name = "lanes-apart", .allot = CAND_ALLOT_MILP, .sched = CAND_LANES,
	 .lanes = {LANE_SPLIT_HULL, 3, 0, LANE_ROUNDS, 1}, .min_nodes = 2},
	/* with an end game: lanes that outrun their windows go on wherever
	 * devices are free (shorter compute, more replicas) */
	{.name = "lanes-endgame", .allot = CAND_ALLOT_MILP, .sched = CAND_LANES,
	 .lanes = {LANE_SPLIT_HULL, 3, 1, LANE_ROUNDS}},
	/* with the end game whose gangs step down through a middle width,
	 * calibrated longer (middle steps move lanes more per round); nothing
	 * new when no lane takes a step. Above LANES_BIG_CLUSTER devices there
	 * is one round, and steps rarely pay */
	{.name = "lanes-midstep", .allot = CAND_ALLOT_MILP, .sched = CAND_LANES,
	 .lanes = {LANE_SPLIT_MID_STEP, 1, 1, LANE_ROUNDS + 2},
	 .max_devices = LANES_BIG_CLUSTER},
	/* lanes apart with the backward in the eager order (lower_xfer.c): a
	 * slice whose gradients are in starts when its devices are free, not
	 * behind the slices the forward ran on them after it, so a component's
	 * last backward and its sync can come earlier; last of the lanes, so
	 * it changes a plan only where it is faster */
	{.name = "lanes-apart-eager", .allot = CAND_ALLOT_MILP, .sched = CAND_LANES,
	 .lanes = {LANE_SPLIT_HULL, 3, 0, LANE_ROUNDS, 1}, .min_nodes = 2, .bwd_eager = 1},
	/* packed lanes (sched_pack.c): two widths a lane, switching at its
	 * own layer boundaries, devices packed as intervals; the fluid
	 * lanes' hand-overs fall inside layers. On any cluster since ours
	 * chooses on refined iterations (top_choose): on clip-4 over
	 * h100-8x8-8nic it was chosen on its iteration before layout_refine
	 * (30.79 ms refined) where lanes refines to 27.95, so it was capped
	 * at 32 devices */
	{.name = "lanes-packed", .allot = CAND_ALLOT_MILP, .sched = CAND_PACK},
	/* the same with the ascending plans first: where a lane's two orders
	 * tie on device-time and peak, its wide phase comes last, so its
	 * backward starts wide and its last gradients come from few devices
	 * (clip-7 on a800-4x8: iteration 142.53 ms against lanes' 143.18) */
	{.name = "lanes-packed-asc", .allot = CAND_ALLOT_MILP, .sched = CAND_PACK,
	 .pack_flags = SCHED_PACK_ASC},
	/* lanes-packed whose greedy placement, where it finds no room for a
	 * lane, tries again with that lane first: other packings, some
	 * shorter (clip-7 on a800-8x8: iteration 94.90 -> 86.35 ms); nothing
	 * new where no horizon fits only that way. A row of its own: in
	 * lanes-packed it made clip-10 on a800-8x8-4nic slower (82.43 ->
	 * 84.26 ms), as a shorter packing can sync worse */
	{.name = "lanes-packed-reorder", .allot = CAND_ALLOT_MILP, .sched = CAND_PACK,
	 .pack_flags = SCHED_PACK_REORDER},
	/* lanes-packed keeping, of its horizons, the one whose latest device
	 * end plus optimizer step is least, not the shortest (a device runs
	 * the step of every parameter it holds after its last slice):
	 * clip-10 on a800-4x8 149.68 ms against lanes-packed's 150.20, the
	 * same compute. A row of its own: the estimate leaves out transfers
	 * and the refinement's zero-1 shards, so it can rank wrongly (clip-4
	 * on a800-4x8: in a trial that also scanned horizons below the
	 * bisection, not kept, a 101.20 ms pack ranked first and iterates
	 * 110.53). Its lanes' changes of width take their hand-overs' time
	 * (SCHED_PACK_HANDOVER): clip-4 on a800-4x8 109.28 -> 108.73 ms; in
	 * every packed row it made clip-7 on a800-8x8 86.39 -> 94.90 */
	{.name = "lanes-packed-tails", .allot = CAND_ALLOT_MILP, .sched = CAND_PACK,
	 .pack_flags = SCHED_PACK_TAILS | SCHED_PACK_HANDOVER},
	/* sync homes (sched_list.c homes_sync): the MILP widths listed with
	 * every component spread over more than half of the nodes held on
	 * homes of half of the nodes (a single MetaOp's in one segment: a
	 * quarter), its layers cut into segments over them, so its gradients
	 * sync across fewer NICs at the price of narrower slices; nothing new
	 * where no component is spread that wide. (Halves everywhere or
	 * quarters everywhere won no bundled row; on 2 nodes the homes, one
	 * node each, won none either.) */
	{.name = "list-homes", .allot = CAND_ALLOT_MILP, .sched = CAND_LIST,
	 .mem_frac = 0.7, .min_nodes = 4, .home_share = 2, .home_share1 = 4},
	/* each task on devices of its own (the task-level baseline's
	 * schedule, sched_task_level): its syncs stay inside its devices,
	 * which one NIC per node can make the fastest. Not gated by nodes or
	 * tasks: on one node with several tasks it is its own schedule
	 * (disjoint groups), and with one task it is not provably
	 * data-parallel's: sched_task_level widens the task only while a
	 * device more shortens it (it stops at the first step that does not,
	 * which can be below a MetaOp's nmax), where
	 * sched_sequential runs every MetaOp at nmax; and data-parallel is
	 * seq's refined plan, taken without lowering. Its cost is one
	 * lowering and simulation */
	{.name = "task-level", .sched = CAND_TASKS},
	/* data parallel on all devices: the sequential plan; when nothing
	 * beats it, ours is that */
	{.name = "data-parallel", .sched = CAND_BASELINE, .reuses_baseline = 1},
};
const int n_sched_cands = (int)(sizeof sched_cands / sizeof sched_cands[0]);

const sched_cand_t *cand_find(const char *name)
{
	for (int i = 0; i < n_sched_cands; i++)
		if (!strcmp(sched_cands[i].name, name))
			return &sched_cands[i];
	return NULL;
}

/* The widths of allotment kind, computed on first use (in pl->arena). */
static int cand_widths(planner_t *pl, cand_state_t *st, cand_allot_t kind, const int **out)
{
	int rc;
	if (!st->widths[kind]) {
		int *w = sp_arena_calloc(&pl->arena, (size_t)pl->n_mops + 1, sizeof(int));
		if (!w)
			return SP_ENOMEM;
		if ((rc = allot_separable(pl, w)))
			return rc;
		if (kind == CAND_ALLOT_MILP &&
		    ((rc = allot_milp(pl, w)) || (rc = allot_search(pl, w, SEARCH_FRAC))))
			return rc;
		st->widths[kind] = w;
	}
	*out = st->widths[kind];
	return 0;
}

cand_allot_t cand_allot_kind(const planner_t *pl, const sched_cand_t *c)
{
	if ((c->max_devices && pl->N > c->max_devices) ||
	    (c->min_nodes && pl->cluster->nodes < c->min_nodes) ||
	    (c->sched != CAND_LIST && c->sched != CAND_LANES && c->sched != CAND_PACK))
		return CAND_ALLOT_NONE;
	return c->allot;
}

int cand_allot(planner_t *pl, cand_state_t *st, cand_allot_t kind)
{
	const int *w;
	return cand_widths(pl, st, kind, &w);
}

/* 1 when widths w equal those of another allotment computed already. */
static int widths_known(const planner_t *pl, const cand_state_t *st, cand_allot_t kind,
			const int *w)
{
	for (int k = 0; k < CAND_ALLOT__COUNT; k++)
		if (k != (int)kind && st->widths[k] &&
		    !memcmp(st->widths[k], w, sizeof(int) * (size_t)pl->n_mops))
			return 1;
	return 0;
}

int cand_schedule(planner_t *pl, cand_state_t *st, const sched_cand_t *c, sched_t *out)
{
	const int *w = NULL;
	int rc, mids = 0;
	if ((c->max_devices && pl->N > c->max_devices) ||
	    (c->min_nodes && pl->cluster->nodes < c->min_nodes) ||
	    (pl->opts && pl->opts->only && strcmp(pl->opts->only, c->name)))
		return SCHED_NOTHING_NEW;
	if (c->sched == CAND_BASELINE)
		return sched_sequential(pl, out);
	if (c->sched == CAND_PAPER_DAG)
		return sched_paper_dag(pl, out);
	if (c->sched == CAND_TASKS)
		return sched_task_level(pl, out);
	if ((rc = cand_widths(pl, st, c->allot, &w)))
		return rc;
	if (c->allot == CAND_ALLOT_SEPARABLE && widths_known(pl, st, c->allot, w))
		return SCHED_NOTHING_NEW; /* the same widths as a candidate before */
	if (c->sched == CAND_PACK)
		return sched_pack(pl, w, c->pack_flags, out);
	if (c->sched == CAND_LIST)
		return c->home_share ? sched_list_sync(pl, w, c->mem_frac, c->home_share,
								 c->home_share1, out)
				     : sched_list(pl, w, c->mem_frac, out);
	if ((rc = sched_lanes(pl, w, &c->lanes, &mids, out)))
		return rc;
	out->bwd_eager = c->bwd_eager;
	/* middle steps asked for and none taken: the end-game lanes again */
	return c->lanes.first_split == LANE_SPLIT_MID_STEP && !mids ? SCHED_NOTHING_NEW : 0;
}
