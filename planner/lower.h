/*
 * lower.h — the lowering's own state, shared by its three files: lower.c
 * (the pass and the plan's structure), lower_xfer.c (transfers and the
 * global instruction order), lower_sync.c (held parameters, buckets, and
 * per-device programs with SYNC and STEP). Nothing outside lower*.c
 * includes it; the pass's entry point is lower_run in planner.h.
 */
#ifndef SPINDLE_LOWER_H
#define SPINDLE_LOWER_H

#include "planner.h"

#include <string.h>

typedef struct {
	int ps, pj, cs, cj; /* producer slice/slot, consumer slice/slot */
	int32_t s0, s1, seq_len;
	sp_vref_t src, dst;
	int grad, tag;
} xfer_t;

/* One instruction of the global sequence, for device dev. */
typedef struct {
	int dev;
	sp_ins_t ins;
} gins_t;

/* Work arrays live in a (pl->scratch, under lower_run's mark). */
typedef struct {
	planner_t *pl;
	const sched_t *s;
	const place_t *pc;
	sp_arena_t *a;
	const uint8_t *z3; /* per component: its buckets in zero-3 (NULL: none) */
	int *order; /* slices in execution order */
	int *prev;  /* per slice: the same MetaOp's previous slice, or -1 */
	int *last;  /* per MetaOp: its last slice */
	int *first; /* per MetaOp: its first slice */
	/* parameters: id = param_base[comp] + layer */
	int *param_base, n_params;
	uint8_t *held;  /* [device * n_params + id]: 0 not held, else 1 + the
			 * shard (tp_rank) of it the device holds */
	int *ptp;       /* per id: its tensor-parallel degree (one per layer) */
	int tmax;       /* the largest degree: shard keys are id * tmax + rank */
	int *bucket_of; /* per shard key: its bucket; -2 parameter-free; -1
			 * never used */
	/* transfers, and the global instruction sequence (lower_xfer.c) */
	xfer_t *x;
	int nx, capx;
	gins_t *g;
	int ng, capg;
	/* lower_sequence counts the transfers' instructions (1 a COPY, 2 a
	 * SEND and its RECV) and stores transfers only while that count is
	 * within store_to (collect_all); g is sized from the count */
	int64_t n_counted, store_to;
	int *cons_first, *cons_list, *prod_first, *prod_list;
} lstate_t;

static inline int lower_dev_of(const lstate_t *st, int slice, int slot)
{
	return st->pc->devs[st->pc->off[slice] + slot];
}

static inline sp_ins_t lower_ins_new(int op)
{
	sp_ins_t i;
	memset(&i, 0, sizeof i);
	i.op = op;
	i.slice = -1;
	i.peer = -1;
	i.tag = -1;
	return i;
}

/* ---- lower_xfer.c ---- */

/* The global sequence st->g: forward slices in order, backward in reverse,
 * each slot's RECVs, compute, SENDs (and local COPYs). */
int lower_sequence(lstate_t *st);

/* ---- lower_sync.c ---- */

/* st->held and out's devices and held lists. */
int lower_held(lstate_t *st, sp_plan_t *out);
/* out's buckets and st->bucket_of. */
int lower_buckets(lstate_t *st, sp_plan_t *out);
/* ---- lower_zero3.c ---- */

/* PGATHERs and PFREEs of zero-3 buckets into st->g (nothing without). */
int lower_gathers(lstate_t *st, sp_plan_t *out);

/* out->ins: each device's part of st->g with its SYNCs and STEP. */
int lower_programs(lstate_t *st, sp_plan_t *out);

#endif
