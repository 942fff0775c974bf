/*
 * cuda/nccl_engine.h — the NCCL data plane's progress engine: every
 * decision (which communicators a plan needs and in which order they are
 * made and warmed up, clear-to-send handling, matching sends to receives
 * by tag, what to enqueue next, which enqueue is still in progress, when an
 * operation is complete or has timed out) without a single NCCL or CUDA
 * call. It calls them through ne_prims_t, a const table that comm_nccl.c
 * fills with NCCL and CUDA and tests/unit/test_nccl_engine.c with a
 * simulated non-blocking communicator. Plain C, built in every build.
 *
 * Not here: unique ids and the world communicator's creation (comm_nccl.c
 * does those with the wrapped comm before handing world over), device
 * choice and device memory.
 *
 * Deadlock freedom, by construction:
 *   - nothing in the step loop waits: an enqueue (group end) that returns
 *     "pending" marks its communicator busy and its operations ENQUEUING,
 *     and ne_progress polls it like everything else, so a rank waiting for
 *     anything still serves its peers' clear-to-send messages;
 *   - every communicator a plan needs is made and warmed up in ne_prepare,
 *     in one global order (sync buckets by index, then tensor-parallel
 *     groups in plan_tp_groups order, then directed channels by (sender,
 *     receiver)) that every rank derives from the plan; each
 *     rank walks the subsequence it belongs to and finishes each item
 *     before the next. The smallest unfinished item has all its members
 *     done with every earlier one, so they all reach it and it finishes:
 *     no cycle of waits can form at start-up either;
 *   - receives are enqueued before sends on each pass, and every
 *     direction of a pair has its own communicator and stream, so a
 *     pending send never sits in front of a receive.
 */
#ifndef SPINDLE_NCCL_ENGINE_H
#define SPINDLE_NCCL_ENGINE_H

#include "plan.h"
#include "runtime.h"

#include <stddef.h>
#include <stdint.h>

/* What a primitive returns. */
enum { NE_OK = 0, NE_PENDING = 1, NE_ERR = -1 };

/*
 * The calls the engine makes. Handles (comm, stream, event) are opaque;
 * NULL is never a valid one. Every entry takes the table's ctx first.
 */
typedef struct ne_prims {
	/* seconds on a monotonic clock (the double's is virtual) */
	double (*now)(void *ctx);
	/* ncclCommSplit of parent (non-blocking, shared resources): color < 0
	 * means "not a member" (*out = NULL). OK, PENDING (poll status on
	 * parent and on *out) or ERR. */
	int (*split)(void *ctx, void *parent, int color, int key, void **out);
	/* ncclCommGetAsyncError: OK, PENDING or ERR */
	int (*status)(void *ctx, void *comm);
	void (*abort)(void *ctx, void *comm);
	/* graceful end: finalize (may be PENDING: poll status), then destroy */
	int (*finalize)(void *ctx, void *comm);
	void (*destroy)(void *ctx, void *comm);
	/* the reason for the last error on comm (NULL comm: the last call's) */
	const char *(*why)(void *ctx, void *comm);
	/* enqueue: group end may return PENDING for every comm in the group */
	int (*group_start)(void *ctx);
	int (*group_end)(void *ctx);
	int (*send)(void *ctx, const void *buf, size_t bytes, int peer, void *comm, void *stream);
	int (*recv)(void *ctx, void *buf, size_t bytes, int peer, void *comm, void *stream);
	int (*allreduce)(void *ctx, float *buf, size_t n, void *comm, void *stream);
	/* in place: sum of buf[0..n) over the members onto root; root's
	 * buf[0..n) to the members (ncclReduce, ncclBroadcast) */
	int (*reduce)(void *ctx, float *buf, size_t n, int root, void *comm, void *stream);
	int (*bcast)(void *ctx, float *buf, size_t n, int root, void *comm, void *stream);
	/* in place over the comm's k members, `me` this rank's rank in it:
	 * buf[0..k c) summed, member me's chunk [me c, (me + 1) c) left at
	 * its place (ncclReduceScatter); each member's chunk [me c, (me + 1)
	 * c) to every member's buf[0..k c) (ncclAllGather) */
	int (*reduce_scatter)(void *ctx, float *buf, size_t c, int me, void *comm, void *stream);
	int (*allgather)(void *ctx, float *buf, size_t c, int me, void *comm, void *stream);
	/* stream-ordered device scratch (cudaMallocAsync / cudaFreeAsync) */
	int (*scratch)(void *ctx, size_t bytes, void *stream, float **out);
	void (*scratch_free)(void *ctx, float *p, void *stream);
	/* Stream-ordered copy between the shard layout of n elements over k
	 * members (member i's comm_shard at its offset) and a window of the
	 * padded one: elements [r0, r0 + m) of member i's shard at [i m,
	 * (i + 1) m) of the scratch (those past the shard's end written 0).
	 * to_padded: bucket -> scratch. who >= 0: only member who's. */
	int (*repack)(void *ctx, float *dst, const float *src, int64_t n, int k, int64_t r0,
		      int64_t m, int to_padded, int who, void *stream);
	/* streams and events */
	int (*stream_new)(void *ctx, void **out);
	void (*stream_free)(void *ctx, void *s);
	int (*event_new)(void *ctx, void **out);
	void (*event_free)(void *ctx, void *ev);
	/* s waits for the compute stream (staged buffers are written) */
	int (*after_compute)(void *ctx, void *s);
	int (*record)(void *ctx, void *ev, void *s);
	/* cudaEventQuery: OK (done), PENDING or ERR */
	int (*query)(void *ctx, void *ev);
} ne_prims_t;

/*
 * What a plan needs, in global order: sync buckets, tensor-parallel groups
 * (member j of group g is slice_devs[tps[g].off + j], its rank j in the
 * group's communicator), directed channels.
 */
typedef struct {
	int n_buckets;
	const sp_bucket_t *buckets;  /* the plan's, index order */
	const int32_t *bucket_devs;
	int n_tps;
	sp_tp_group_t *tps;          /* plan_tp_groups: the order interp.c creates them */
	const int32_t *slice_devs;
	int n_chans;
	int (*chans)[2];             /* {sender, receiver}, ascending */
} ne_layout_t;

/* p's buckets, its distinct tensor-parallel groups, and the directed pairs
 * that carry data: every SEND's {device, peer}, and every split layer's
 * {owner of shard j, owner of shard 0} (j >= 1; pack.c joins the shards
 * there for checkpoints and weights files), sorted and unique. tps and
 * chans are malloc'd (NULL when none). -1 when out of memory. */
int ne_layout_init(ne_layout_t *out, const sp_plan_t *p);
void ne_layout_release(ne_layout_t *l);

typedef struct ne_op ne_op_t;
typedef struct ne_engine ne_engine_t;

/*
 * A new engine for rank `rank` of nranks. host carries the clear-to-send
 * messages (the wrapped MPI comm; it stays the caller's). world: the
 * world communicator, already created (NULL with one rank). warm: a
 * device buffer of at least 4 bytes for the warm-up operations.
 * timeout_s bounds every wait. hostname appears in messages.
 */
ne_engine_t *ne_new(const ne_prims_t *pr, void *ctx, rt_comm_t *host, void *world,
		    void *warm, double timeout_s, const char *hostname);
/* Releases everything (hard: abort every communicator). Accepts NULL. */
void ne_free(ne_engine_t *e, int hard);

/* Collective: makes and warms up every communicator of the layout, in the
 * global order. Idempotent; afterwards ne_group_id answers group ids. */
int ne_prepare(ne_engine_t *e, const ne_layout_t *l);
int ne_prepared(const ne_engine_t *e);
/* The group of the layout's item i for this rank: i < n_buckets is bucket
 * i, n_buckets + q tensor-parallel group q (interp.c's group_create call
 * order). id >= 0, or -1 when not a member. Fails (-1 return) when
 * ne_prepare did not see item i. */
int ne_group_id(const ne_engine_t *e, int item, int *out);

/* Post operations (never wait). *out is the handle for ne_test. */
int ne_isend(ne_engine_t *e, const void *buf, size_t bytes, int peer, int tag, ne_op_t **out);
int ne_irecv(ne_engine_t *e, void *buf, size_t bytes, int peer, int tag, ne_op_t **out);
/* In-place sum over group g, a sync bucket's or a tensor-parallel group's
 * (a group of one: *out = NULL, done at once). */
int ne_iallreduce(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out);
/* The zero-1 halves over group g, as rt_comm_ops_t's ireduce_scatter and
 * iallgather (shards: comm_shard; member j is the group's rank j, the
 * bucket's devices ascending). Shards of one size (k divides n): one
 * in-place reduce-scatter / all-gather. Uneven ones: the same over a
 * padded scratch, chunks of c = ceil(n/k) (repacked in and out on the
 * group's stream, freed after; its bytes count in ne_stats), in rounds
 * over windows of each chunk so that a round's scratch stays within the
 * engine's cap (ne_set_pad_cap). */
int ne_ireduce_scatter(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out);
int ne_iallgather(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out);
/* rt_comm_ops_t's iallgatherv over group g (k its size). Parts that tile
 * one range in member order as comm_shard does (a whole bucket's, or a
 * piece or layer every member holds a part of, one size or differing by
 * one): one all-gather, padded as above where uneven. Any other parts
 * (a layer or piece only some members hold a part of, where padding to
 * k times the largest part would move far more than the parts): one
 * broadcast from each member with a part, of that part, in one NCCL
 * group (NCCL has no all-gather with counts). */
int ne_iallgatherv(ne_engine_t *e, float *buf, int k, const int64_t *cnt, const int64_t *off,
		   int g, ne_op_t **out);
/* Moves every operation along; *done = 1 frees op. -1 when op failed. */
int ne_test(ne_engine_t *e, ne_op_t *op, int *done);
/* The buffer an all-gather op writes (NULL for the other kinds, and for
 * NULL: a group of one); read it before ne_test frees op. */
void *ne_op_gathers(const ne_op_t *op);
/* One pass over everything; -1 when the host comm fails. */
int ne_progress(ne_engine_t *e);
/* Operations not yet completed. */
int ne_live(const ne_engine_t *e);

/* How the sharded halves ran so far on this rank: NCCL calls made as
 * true reduce-scatters / all-gathers (direct: in place on the caller's
 * buffer; padded: over a scratch) and as rooted reduces / broadcasts
 * (one per member's part); the padded scratch's bytes live at once at
 * most (outside the plan's memory, which counts no staging). */
typedef struct {
	long direct, padded, rooted; /* NCCL calls (a padded half: one per round) */
	int64_t scratch_peak;
} ne_stats_t;
void ne_stats(const ne_engine_t *e, ne_stats_t *out);
/* The most scratch bytes one padded round takes (default
 * NE_PAD_CAP_DEFAULT; at least one float per member always). */
#define NE_PAD_CAP_DEFAULT ((int64_t)64 << 20)
void ne_set_pad_cap(ne_engine_t *e, int64_t bytes);

#endif
