/*
 * tp.h — tensor-parallel degrees after scheduling: the check of a forced
 * --tp N against the model, the degree a slice is placed for, and the
 * pass that keeps a placed slice's degree only where its groups lie in
 * nodes and its component has one sharding (tp.c). The degrees themselves
 * (auto, or the forced N where a slice allows it) are tp_assign's
 * (tp_cost.c), at scheduling; tp_whole (tp_cost.c) names, after planning,
 * the transformers a forced N left whole.
 */
#ifndef SPINDLE_TP_H
#define SPINDLE_TP_H

#include "planner.h"

/* SP_EINPUT with a located message when a forced t does not divide a
 * transformer component's heads or ffn, or exceeds a node's GPUs, or
 * (with --sp on) the seq of a transformer node. */
int tp_check(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
	     sp_err_t *err);
/* The degree slice x is to be placed for: its scheduled x->tp when that
 * splits its shape and divides its width, else 1. */
int tp_want(const planner_t *pl, const sslice_t *x);
/* After placement: s->s[i].tp stays tp_want where every group of t consecutive
 * devices lies in one node and every slice of the component agrees, and
 * each device holds one shard of each layer; else 1 (whole layers), to a
 * fixpoint. A slice at 1 wider than its batch narrows to its first batch
 * devices (pc stays packed). Work arrays in pl->scratch (the candidate's).
 * Under --sp on, SP_EINPUT (with a hint) when a slice keeps t > 1 on a
 * transformer whose seq t does not divide (a --tp auto choice). */
int tp_run(planner_t *pl, sched_t *s, place_t *pc);
/*
 * Sequence parallelism (--sp): whether slice x, placed at degree t, runs
 * it. off: never; on: where sp_ok (tp_run refused the other split
 * transformers); auto: where sp_ok and the layer's predicted time with it
 * (cost_layer_sp at the group's local batch) is not more than without,
 * since it always saves activation memory (op_saved_elems_sp).
 */
int sp_want(const planner_t *pl, const sslice_t *x, int t);
/* The forced degree of a lowered plan (its options' tp=N), 0 under auto. */
int tp_forced(const sp_plan_t *p);
/* Under a forced --tp N > 1: one line on f per class of transformer
 * MetaOps (sharing components) the plan leaves whole, each starting with
 * lead, naming a component and the MetaOps and why (tp_cost.c). Nothing
 * under auto. SP_ENOMEM when out of memory. */
int tp_whole(FILE *f, const sp_plan_t *p, const char *lead);

#endif
