/*
 * lower.c — turns a placed schedule into the plan: MetaOps, slices, waves,
 * the parameters each device holds, gradient-sync buckets, and one program
 * per device. It decides no timing (sim.c) and checks nothing (verify.c).
 * This file runs the steps and fills the plan's structure; transfers and
 * the instruction order are lower_xfer.c's, parameters, buckets and SYNCs
 * lower_sync.c's (shared state: lower.h). Work arrays come from
 * pl->scratch and are given back when lower_run returns; the plan's own
 * arrays are on the heap (plan_release frees them).
 *
 * Sample ranges. Device i of a slice's n gets [i*B/n, (i+1)*B/n); on a
 * tensor-parallel slice (tp t, tp.c) the unit is the group: group r of its
 * n / t gets [r*B/(n/t), (r+1)*B/(n/t)) on all its t members (lower_xfer.c
 * says who sends to which member). A
 * consumer slot needs its own range of its input (a contrastive loss needs
 * the whole batch), and gets each piece from the producer slot whose range
 * intersects it: the MetaOp's previous slice (act(m, lf)), or, for a
 * MetaOp's first slice, the last slice of every producer (act(p, L_p) into
 * act(m, 0) at the edge's seq offset). Gradients flow back over the same
 * intersections, from the consumer's own range only; the receiver adds them
 * (a producer with several consumers sums their contributions). Pieces that
 * stay on one device are free (same buffer) or a local COPY. A decoder's
 * memory act(c, -1) moves once per device holding slots of c, over the
 * union of their ranges, and its gradient grad(c, -1) once back
 * (lower_xfer.c's header).
 *
 * Order. All instructions are emitted into one global sequence: forward
 * slices in schedule order, for each device slot its RECVs, its FWD (or
 * LOSS), then its SENDs; then backward slices in reverse order (or, when
 * the schedule asks for it, in the eager order: lower_xfer.c), RECVs, BWD,
 * SENDs (for sequential-paper, algo_task_by_task, that pass task by task:
 * each task's forward then its backward). Each device's program is its
 * subsequence. Every RECV comes after
 * its SEND in the global order and sends never block, so no rank can wait
 * on a peer that waits on it (verify.c re-checks by simulation).
 *
 * Sync. A parameter's holders are the devices whose slices use it (under
 * tensor parallelism: the holders of one shard, member j of every group);
 * params with the same holder set form one bucket (one all-reduce per group). A
 * device issues a bucket's SYNC right after its last instruction that
 * produces gradients of it (overlap), or all SYNCs just before STEP (the
 * paper's algorithm and baseline: algo_overlaps_sync). STEP waits for all
 * of them.
 */
#include "lower.h"
#include "tp.h"

#include <stdlib.h>
#include <string.h>

/* Slices in execution order, and each MetaOp's first, last and previous. */
static int index_slices(lstate_t *st)
{
	const sched_t *s = st->s;
	int n_mops = st->pl->n_mops;
	st->order = sp_arena_calloc(st->a, (size_t)s->n + 1, sizeof(int));
	st->prev = sp_arena_calloc(st->a, (size_t)s->n + 1, sizeof(int));
	st->last = sp_arena_calloc(st->a, (size_t)n_mops + 1, sizeof(int));
	st->first = sp_arena_calloc(st->a, (size_t)n_mops + 1, sizeof(int));
	if (!st->order || !st->prev || !st->last || !st->first)
		return SP_ENOMEM;
	for (int m = 0; m < n_mops; m++)
		st->last[m] = st->first[m] = -1;
	for (int i = 0; i < s->n; i++) {
		int m = s->s[i].metaop;
		st->order[i] = i;
		st->prev[i] = st->last[m];
		st->last[m] = i;
		if (st->first[m] < 0)
			st->first[m] = i;
	}
	return 0;
}

/* Parameter ids: param_base[comp] + layer, a transformer's layers apart. */
static int index_params(lstate_t *st)
{
	const sp_model_t *md = st->pl->model;
	st->param_base = sp_arena_calloc(st->a, (size_t)md->n_comps + 1, sizeof(int));
	if (!st->param_base)
		return SP_ENOMEM;
	for (int k = 0; k < md->n_comps; k++) {
		st->param_base[k] = st->n_params;
		st->n_params += md->comps[k].type == COMP_TRANSFORMER ? (int)md->comps[k].layers : 1;
	}
	return 0;
}

/* Version, algorithm, options, the model and the cluster. */
static int lower_header(const planner_t *pl, algo_t algo, sp_plan_t *out)
{
	const sp_model_t *md = pl->model;
	const sp_cluster_t *cl = pl->cluster;
	char tp[12] = "auto";
	if (pl->opts->tp > 0)
		snprintf(tp, sizeof tp, "%d", pl->opts->tp);
	snprintf(out->planner_version, sizeof out->planner_version, "spindle-plan %s",
		 SP_VERSION);
	snprintf(out->algo, sizeof out->algo, "%s", algo_name(algo));
	snprintf(out->options, sizeof out->options,
		 "algo=%s placement=%s mem_reserve_gib=%.3f milp_nodes=%d zero=%s recompute=%s "
		 "microbatches=%d tp=%s",
		 algo_name(algo), pl->opts->placement == PLACE_NAIVE ? "naive" : "spindle",
		 pl->opts->mem_reserve_gib, pl->opts->milp_nodes,
		 (const char *[]){"auto", "0", "1", "2", "3"}[pl->opts->zero + 1],
		 (const char *[]){"auto", "none", "all"}[pl->opts->recompute + 1], pl->k, tp);
	/* only when asked: plans that split by vocabulary where they can keep
	 * the options they had before it existed */
	if (pl->opts->tp_vocab_whole) {
		size_t n = strlen(out->options);
		snprintf(out->options + n, sizeof out->options - n, " tp_vocab=whole");
	}
	if (pl->opts->sp != 0) { /* likewise only when not the default, off */
		size_t n = strlen(out->options);
		snprintf(out->options + n, sizeof out->options - n, " sp=%s",
			 pl->opts->sp > 0 ? "on" : "auto");
	}
	if (pl->opts->rs_overlap >= 0) { /* likewise only when not the default, auto */
		size_t n = strlen(out->options);
		snprintf(out->options + n, sizeof out->options - n, " rs_overlap=%s",
			 pl->opts->rs_overlap ? "on" : "off");
	}
	if (pl->opts->defer_gather >= 0) { /* likewise only when not the default, auto */
		size_t n = strlen(out->options);
		snprintf(out->options + n, sizeof out->options - n, " defer_gather=%s",
			 pl->opts->defer_gather ? "on" : "off");
	}
	out->model_hash = md->hash;
	out->cluster_hash = cl->hash;
	if (model_copy(&out->model, md))
		return SP_ENOMEM;
	snprintf(out->cluster_name, sizeof out->cluster_name, "%s", cl->name);
	snprintf(out->gpu_name, sizeof out->gpu_name, "%s", cl->gpu_name);
	out->nodes = cl->nodes;
	out->gpus_per_node = cl->gpus_per_node;
	out->memory_gib = cl->memory_gib;
	out->mem_reserve_gib = pl->opts->mem_reserve_gib;
	out->microbatches = pl->k;
	return 0;
}

/* MetaOps, operators and edges, as graph.c and cost.c left them. */
static int lower_structure(const planner_t *pl, sp_plan_t *out)
{
	out->n_metaops = pl->n_mops;
	out->n_ops = pl->n_ops;
	out->n_edges = pl->n_edges;
	out->metaops = calloc((size_t)pl->n_mops + 1, sizeof *out->metaops);
	out->ops = calloc((size_t)pl->n_ops + 1, sizeof *out->ops);
	out->edges = calloc((size_t)pl->n_edges + 1, sizeof *out->edges);
	if (!out->metaops || !out->ops || !out->edges)
		return SP_ENOMEM;
	memcpy(out->ops, pl->ops, sizeof *out->ops * (size_t)pl->n_ops);
	memcpy(out->edges, pl->edges, sizeof *out->edges * (size_t)pl->n_edges);
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		sp_metaop_t *o = &out->metaops[m];
		o->task = mo->task;
		o->shape = mo->shape;
		o->n_layers = mo->n_layers;
		o->first_op = mo->first_op;
		o->seq_in = mo->seq_in;
		o->width_in = mo->width_in;
		o->seq_out = mo->seq_out;
		o->width_out = mo->width_out;
		o->fwd_ms = mo->tf[1];
		o->bwd_ms = mo->tb[1];
		o->profiled = mo->profiled;
		snprintf(o->name, sizeof o->name, "%s", mo->name);
	}
	return 0;
}

/* Slices with their devices, and waves with their nominal spans; under
 * --recompute all every transformer slice recomputes. */
static int lower_slices(const planner_t *pl, const sched_t *s, const place_t *pc,
			sp_plan_t *out)
{
	out->n_slices = s->n;
	out->n_waves = s->n_waves;
	out->slices = calloc((size_t)s->n + 1, sizeof *out->slices);
	out->waves = calloc((size_t)s->n_waves + 1, sizeof *out->waves);
	int total_devs = 0;
	for (int i = 0; i < s->n; i++)
		total_devs += s->s[i].n;
	out->n_slice_devs = total_devs;
	out->slice_devs = calloc((size_t)total_devs + 1, sizeof(int32_t));
	if (!out->slices || !out->waves || !out->slice_devs)
		return SP_ENOMEM;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		sp_slice_t *o = &out->slices[i];
		o->wave = x->wave;
		o->metaop = x->metaop;
		o->layer_from = x->lf;
		o->layer_to = x->lt;
		o->n_dev = x->n;
		o->dev_off = pc->off[i];
		o->start_ms = x->t0;
		o->fwd_ms = x->t1 - x->t0;
		o->recompute = pl->opts->recompute == 1 &&
			       pl->mops[x->metaop].shape.type == COMP_TRANSFORMER;
		o->tp = x->tp > 1 ? x->tp : 1;
		o->sp = sp_want(pl, x, o->tp);
		memcpy(out->slice_devs + pc->off[i], pc->devs + pc->off[i],
		       sizeof(int32_t) * (size_t)x->n);
		sp_wave_t *w = &out->waves[x->wave];
		if (w->n_slices == 0) {
			w->first_slice = i;
			w->start_ms = x->t0;
		}
		w->n_slices++;
		if (x->t1 - w->start_ms > w->dur_ms)
			w->dur_ms = x->t1 - w->start_ms;
	}
	return 0;
}

static int lower_steps(lstate_t *st, sp_plan_t *out)
{
	int rc;
	if ((rc = index_slices(st)) || (rc = index_params(st)) ||
	    (rc = lower_header(st->pl, st->s->algo, out)) || (rc = lower_structure(st->pl, out)) ||
	    (rc = lower_slices(st->pl, st->s, st->pc, out)) || (rc = lower_held(st, out)) ||
	    (rc = lower_buckets(st, out)) || (rc = lower_sequence(st)) ||
	    (rc = lower_gathers(st, out)))
		return rc;
	return lower_programs(st, out);
}

int lower_run(planner_t *pl, const sched_t *s, const place_t *pc, sp_plan_t *out)
{
	return lower_run_z3(pl, s, pc, NULL, out);
}

int lower_run_z3(planner_t *pl, const sched_t *s, const place_t *pc, const uint8_t *z3,
		 sp_plan_t *out)
{
	lstate_t st = {.pl = pl, .s = s, .pc = pc, .a = &pl->scratch, .z3 = z3};
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	memset(out, 0, sizeof *out);
	int rc = lower_steps(&st, out);
	sp_arena_reset(&pl->scratch, mark);
	if (rc == SP_ENOMEM) /* else the guard's (lower_xfer.c collect_all) */
		rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if (rc)
		plan_release(out);
	return rc;
}
