/*
 * cuda/nccl_engine_internal.h — what nccl_engine.c (the progress engine)
 * and nccl_pad.c (how a zero-1/2/3 half runs: in place, over a padded
 * scratch in rounds, or as rooted calls) share: the engine's, operations'
 * and communicators' structs, and the padded path's entry points; private
 * to those two files.
 */
#ifndef SPINDLE_NCCL_ENGINE_INTERNAL_H
#define SPINDLE_NCCL_ENGINE_INTERNAL_H

#include "nccl_engine.h"

typedef struct {
	int32_t tag, pad;
	int64_t bytes;
} cts_t;

/* The group collectives (all-reduce and the zero-1 halves) share one queue
 * per group, in posting order: every member issues them in one order. */
enum { OP_SEND, OP_RECV, OP_ALLREDUCE, OP_RSCATTER, OP_AGATHER, OP_AGATHERV };
enum { ST_WAIT_CTS, ST_READY, ST_ENQUEUING, ST_LAUNCHED, ST_DONE, ST_FAILED };
enum { HOW_ROOTED, HOW_DIRECT, HOW_PADDED };

/* A communicator with its stream; busy while an enqueue is pending. */
typedef struct {
	void *comm, *stream;
	int busy, failed;
	int size; /* groups: members */
	int me;   /* groups: this rank's rank in the communicator */
	double t_busy;
} ne_chan_t;

struct ne_op {
	int kind, state, peer, tag;
	long seq; /* sends: order of their clear-to-send */
	void *buf;
	size_t bytes;
	void *ev;
	double t0;
	ne_chan_t *ch;
	int64_t *parts;  /* OP_AGATHERV: the members' counts, then offsets */
	/* the sharded halves (ne_how_shard): HOW_DIRECT or HOW_PADDED, over
	 * base[0..n) in comm_shard's layout, chunks of c; HOW_ROOTED: one
	 * call per member. HOW_PADDED runs in rounds (round of rounds), each
	 * over the window [round m, round m + m) of every chunk; pad: the
	 * round's scratch (held bytes) while it is held. */
	int how, round, rounds;
	float *base, *pad;
	int64_t n, c, m, held;
	cts_t cts;       /* receives: the clear-to-send message */
	rt_req_t cts_req; /* receives: its host send (kind 0 once complete) */
	ne_op_t *next;
};

typedef struct {
	ne_chan_t out, in;
	cts_t *fifo; /* clear-to-send messages not yet matched, in arrival order */
	int n_fifo, cap_fifo;
	cts_t ctrl_buf;
	rt_req_t ctrl_req;
	int ctrl_posted;
	long seq;
} ne_peer_t;

struct ne_engine {
	const ne_prims_t *pr;
	void *ctx;
	rt_comm_t *host;
	int rank, nranks;
	double timeout_s;
	char hostname[64];
	void *world, *warm;
	ne_peer_t *peers;
	/* one per bucket this rank is in (comm NULL: alone), then one per
	 * tensor-parallel group it is in (from n_sync on) */
	ne_chan_t *groups;
	int n_groups, n_sync;
	int *item_group; /* layout item (buckets, then TP groups) -> group id, or -1 */
	int n_items;
	ne_op_t *ops; /* live operations, in posting order */
	ne_stats_t stats;
	int64_t scratch_live; /* bytes of padded scratch held */
	int64_t pad_cap;      /* a padded round's scratch at most (bytes) */
	/* start-up: item prep_at of the global order, its sub-state */
	int prep_at, prep_sub, prepared;
	void *prep_comm;
	ne_op_t *prep_op;
	double prep_t0;
};

/* ---- nccl_pad.c: the sharded halves ---- */

/* A half that runs over a padded scratch (one round at a time). */
static inline int ne_padded(const ne_op_t *op)
{
	return op->kind >= OP_RSCATTER && op->how == HOW_PADDED;
}

/* Decides op->how (and the padded rounds) when a half is posted. */
void ne_how_shard(const ne_engine_t *e, ne_op_t *op);
/* A padded round, before its group: the scratch and what goes into it. */
int ne_stage_in(ne_engine_t *e, ne_op_t *op);
/* A padded round, once its call is on the stream: the result back, the
 * scratch freed behind it. */
int ne_stage_out(ne_engine_t *e, ne_op_t *op);
/* The NCCL call(s) of a half's (current round), inside the caller's group. */
int ne_shard_call(ne_engine_t *e, ne_op_t *op);
/* A scratch still held by op (it failed before its copy out): freed. */
void ne_pad_drop(ne_engine_t *e, ne_op_t *op);

#endif
