/*
 * runtime.h — the runtime's internal map, one section per file. The runtime
 * does not plan: it reads a plan (schemas/plan_decode.c, plan_check.c),
 * builds this rank's parameters and buffers, and executes the rank's
 * program step by step through a backend (a table of function pointers
 * chosen at start-up).
 */
#ifndef SPINDLE_RUNTIME_H
#define SPINDLE_RUNTIME_H

#include "backend_ops.h"
#include "common.h"
#include "model.h"
#include "plan.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- comm: point-to-point and all-reduce between ranks ------------------ */

typedef struct rt_req {
	int kind; /* 0: none */
	void *impl;
	int peer, tag;
} rt_req_t;

typedef struct rt_comm rt_comm_t;

/* What a transport does; one static const table per transport (comm_mpi.c,
 * comm_local.c, cuda/comm_nccl.c), each entry taking the comm itself. */
typedef struct rt_comm_ops {
	/* Creates a group over ranks[0..n) (ascending); collective over all
	 * ranks, called in the same order everywhere. *out: id, or -1 if this
	 * rank is not a member. */
	int (*group_create)(rt_comm_t *c, const int *ranks, int n, int *out);
	int (*isend)(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		     rt_req_t *req);
	int (*irecv)(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req);
	/* In-place sum over the group's members. */
	int (*iallreduce)(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req);
	/* Zero-1 halves, in place on buf[0..n) of each of the group's k
	 * members; member i's shard is comm_shard(n, i, k). reduce_scatter:
	 * member i ends with the members' sum over its shard, at the shard's
	 * own place (the rest of buf is undefined afterwards). allgather: each
	 * member contributes its shard, every member ends with all of buf. */
	int (*ireduce_scatter)(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req);
	int (*iallgather)(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req);
	/* All-gather with per-member parts, in place: member i of the group's
	 * k contributes buf[off[i], off[i] + cnt[i]) (already at its place),
	 * every member ends with all k parts (the rest of buf untouched). k,
	 * cnt and off are the same on every member; the transport copies them
	 * (the caller's may go at once). A k that is not the group's size, or
	 * a negative count or offset, fails to start. */
	int (*iallgatherv)(rt_comm_t *c, float *buf, int k, const int64_t *cnt, const int64_t *off,
			   int group, rt_req_t *req);
	/* *done = 1 when complete (req is then reset). */
	int (*test)(rt_comm_t *c, rt_req_t *req, int *done);
	/* Sum of doubles over all ranks (blocking; losses, norms). */
	int (*allsum)(rt_comm_t *c, double *buf, int n);
	/* Gathers every rank's bytes to rank 0 (blocking). out valid on 0. */
	int (*gather)(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes);
	int (*barrier)(rt_comm_t *c);
	/* Ends the process (and so the job) at once; never returns. */
	void (*abort)(rt_comm_t *c, int code);
	/* Releases what the comm holds; collective. */
	void (*finalize)(rt_comm_t *c);
} rt_comm_ops_t;

/* One rank's communicator, a struct its caller owns (main.c). A transport
 * may be wrapped in place by another (cuda/comm_nccl.c keeps a copy of the
 * wrapped comm and takes over ops and impl; rank, nranks, tag_ub stay). */
struct rt_comm {
	const rt_comm_ops_t *ops;
	const char *name;
	int rank, nranks;
	int tag_ub; /* largest message tag the transport accepts */
	void *impl;
	/* How a backend with device buffers moves them (--comm): NULL, its
	 * default; "nccl"; "mpi" (staged through host memory). Set by the
	 * caller before attach, which checks it. */
	const char *dataplane;
};

/* Member i of k's shard of n elements: [n*i/k, n*(i+1)/k), the plan's
 * rule for zero-1 buckets (bucket_shard in schemas/plan_util.c). */
static inline void comm_shard(int64_t n, int i, int k, int64_t *off, int64_t *cnt)
{
	*off = n * i / k;
	*cnt = n * (i + 1) / k - *off;
}

/* comm_mpi.c: Open MPI (when built with it); comm_local.c: one rank. */
int comm_mpi_init(rt_comm_t *c, int *argc, char ***argv, sp_err_t *err);
int comm_local_init(rt_comm_t *c);
int comm_mpi_available(void);
/* Whether this process was started by mpirun (environment). */
int comm_under_launcher(void);
/* Whether c's rank is among ranks[0..n) (for group_create). */
int comm_member(const rt_comm_t *c, const int *ranks, int n);

/* ---- backend: memory, layers, optimizer --------------------------------- */

/*
 * A compute backend is one static const table (backend_cpu.c,
 * backend_cuda.c), chosen by name at start-up; it holds no state of its
 * own beyond what its functions keep. It moves device buffers over the
 * comm it was started with.
 */
typedef struct rt_backend {
	const char *name;
	/* Checks that this build can serve c's ranks and may wrap c (cuda:
	 * device buffers over NCCL). Errors are the launch's (bad input). */
	int (*attach)(rt_comm_t *c, sp_err_t *err);
	/* Sets up this rank's device; collective when c has several ranks. */
	int (*init)(rt_comm_t *c, sp_err_t *err);
	/* Optional, collective, after init and before rt_create: everything the
	 * plan's communication needs made now, in one order on every rank (cuda
	 * over NCCL: communicators and channels, warmed up), never mid-step. */
	int (*prepare)(rt_comm_t *c, const sp_plan_t *p, sp_err_t *err);
	/* Optional: whatever the parameters w[0..n) need beside them made at
	 * start-up, not in step 1 (cuda: their bf16 shadow). */
	void (*reserve_params)(const float *w, int64_t n);
	void (*shutdown)(void);
	/* device memory */
	rt_alloc_fn_t *alloc;
	rt_release_fn_t *release;
	rt_copy_fn_t *to_device, *to_host;
	rt_zero_fn_t *zero;
	/* rows x cols floats between strided buffers; acc: add instead of copy */
	rt_copy_rows_fn_t *copy_rows;
	/* layers (layers.h semantics, device pointers) */
	rt_embedding_fwd_fn_t *embedding_fwd;
	rt_embedding_bwd_fn_t *embedding_bwd;
	rt_fwd_fn_t *patch_fwd;
	rt_patch_bwd_fn_t *patch_bwd;
	rt_tblock_fwd_fn_t *tblock_fwd;
	rt_tblock_bwd_fn_t *tblock_bwd;
	rt_fwd_fn_t *linear_fwd;
	rt_bwd_fn_t *linear_bwd;
	rt_lm_head_loss_fn_t *lm_head_loss;
	rt_classifier_loss_fn_t *classifier_loss;
	rt_contrastive_loss_fn_t *contrastive_loss;
	rt_adamw_step_fn_t *adamw_step;
	rt_sgd_step_fn_t *sgd_step;
	rt_layer_init_fn_t *layer_init;
	/* the cross-attention decoder block (layers.h); NULL in a table
	 * without one (backend_cuda_none.c's): rt_check_backend refuses a
	 * plan with decoders there */
	rt_xblock_fwd_fn_t *xblock_fwd;
	rt_xblock_bwd_fn_t *xblock_bwd;
	/* the vocabulary-parallel embedding and LM head (layers.h); NULL in a
	 * table without them (backend_cuda_none.c's): rt_check_backend
	 * refuses a plan that splits one there */
	rt_embedding_fwd_tp_fn_t *embedding_fwd_tp;
	rt_embedding_bwd_tp_fn_t *embedding_bwd_tp;
	rt_lm_head_loss_tp_fn_t *lm_head_loss_tp;
	/* 1 when tblock_fwd/tblock_bwd run the sequence-parallel block
	 * (rt_tp_t.sp; the CPU's layers_sp.c); 0: rt_check_backend refuses a
	 * plan with a sequence-parallel slice */
	int seq_parallel;
	/* waits for queued device work (no-op on the CPU) */
	rt_sync_fn_t *sync;
} rt_backend_t;

/* The math entries every backend fills with its functions of the same
 * names, under its own prefix (CPU: none, layers.h; CUDA: cu_). */
#define RT_BACKEND_MATH(X)                                                                  \
	X(embedding_fwd) X(embedding_bwd) X(patch_fwd) X(patch_bwd) X(tblock_fwd)           \
	X(tblock_bwd) X(linear_fwd) X(linear_bwd) X(lm_head_loss) X(classifier_loss)        \
	X(contrastive_loss) X(adamw_step) X(sgd_step) X(xblock_fwd) X(xblock_bwd)

/* backend_cpu.c: the reference. backend_cuda.c: the CUDA table; in builds
 * without CUDA, backend_cuda_none.c's, whose attach says so (and whose
 * other entries are NULL). */
extern const rt_backend_t backend_cpu, backend_cuda;
/* The backend called name ("cpu", "cuda"), NULL if there is none. */
const rt_backend_t *backend_find(const char *name);
/* attach, then init: a process that uses the backend alone (tools, tests). */
int backend_start(const rt_backend_t *b, rt_comm_t *c, sp_err_t *err);

/* ---- data.c: training data, synthetic or from a dataset ------------------- */

typedef struct rt_dataset rt_dataset_t;

/*
 * With ds NULL, synthetic data: everything is a function of (seed, step,
 * task, node, sample index) only, so any split of a batch across ranks sees
 * the same samples. A sample of a task has a latent z (K numbers); patch
 * features are a fixed per-component projection of z plus noise; token
 * sequences start from z and follow t[q+1] = (5 t[q] + 3) mod V; classifier
 * labels bucket z[0]; LM targets are the next token of the embedding stream
 * a position came from (-1 where it came from features).
 * With a dataset (dataset.c), the same from its samples: padding holds
 * token 0 / zero features, LM targets are the stream's next token, -1 at
 * and after the stream's last valid position.
 */
void data_tokens(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		 int64_t step, int task, int node, int64_t s0, int64_t s1);
void data_features(float *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		   int64_t step, int task, int node, int64_t s0, int64_t s1);
void data_labels(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		 int64_t step, int task, int node, int64_t s0, int64_t s1);
/* LM targets of loss node `node` for samples [s0,s1): [n, seq] */
void data_lm_targets(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m,
		     uint64_t seed, int64_t step, int task, int node, int64_t s0, int64_t s1);

/* ---- dataset.c: a "spindle.dataset/1" directory (schemas/DATASET-FORMAT.md) - */

/*
 * Opens dir for rank `rank` of plan p and the steps [first, last] of a
 * training run: checks the index, every shard's tensors and lengths tables
 * against the model (with full, also the rank's share of every row) and
 * reads the rows of the group of steps from `first`, all before step 1;
 * then a reader thread reads each next group's rows into the second of two
 * group buffers (a group: dataset_next).
 * SP_EINPUT names the file, tensor and sample.
 */
int dataset_stream(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		   int nranks, uint64_t seed, int64_t first, int64_t last, int full,
		   sp_err_t *err);
/* As dataset_stream with full checking, but reads every step of [first,
 * last] now and starts no thread (held-out scoring). */
int dataset_open(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		 int nranks, uint64_t seed, int64_t first, int64_t last, sp_err_t *err);
/* The group of steps starting at `step` is next (call it once the group
 * before has run, in order; a group is the plan's micro-steps K, one step
 * without them; task i reads in the first k_i of a group only): waits until its rows are read and checked, then starts
 * reading the next group into the buffers the one before used. A bad row
 * or a changed shard is SP_EINPUT naming the file, tensor, sample and
 * spindle-run's step (the group's). No-op for dataset_open's. */
int dataset_next(rt_dataset_t *d, int64_t step, sp_err_t *err);
/* Bytes of the step buffers (rows and lengths of the positions the rank
 * reads: two steps' for dataset_stream). */
int64_t dataset_resident(const rt_dataset_t *d);
void dataset_free(rt_dataset_t *d);
/* The epoch (0-based) task's step `step` is in (a micro-step's: its step
 * batch's, schemas/DATASET-FORMAT.md "Order"). */
int64_t dataset_epoch(const rt_dataset_t *d, int task, int64_t step);
/* Rows of source or classifier node `node` for batch positions [s0, s1) of
 * step: [n, seq(, width)] int32 or float, or [n] labels. */
void dataset_rows(void *out, const rt_dataset_t *d, int64_t step, int task, int node,
		  int64_t s0, int64_t s1);
/* Token row [seq] of embedding node `node` at batch position s, and its
 * valid length. */
const int32_t *dataset_tokens(const rt_dataset_t *d, int64_t step, int task, int node,
			      int64_t s, int32_t *len);

/* ---- interp.c: executing programs ---------------------------------------------- */

typedef struct {
	double start_ms, end_ms;
	int32_t ins;  /* index in the rank's program */
	int32_t comm; /* 1: communication thread */
	/* of [start_ms, end_ms): the time in the tensor-parallel all-reduces
	 * (tp_allreduce, summed over a split FWD/BWD's calls; else 0) */
	double tp_ms;
} rt_event_t;

typedef struct rt_state rt_state_t;

typedef struct {
	uint64_t seed;
	double timeout_s;
	int record_events;
	const rt_dataset_t *data; /* NULL: synthetic data */
	/* test mode (--check-deferred, cpu backend only): a deferred
	 * all-gather lands in a staging buffer and the bucket's weights
	 * (the rank's shard too: its part is the gather's send buffer) are
	 * NaN until the gather is waited for, each piece's range at its own
	 * wait (plan_defer_pieces) */
	int check_deferred;
} rt_opts_t;

/*
 * Whether backend b has every layer plan p runs: SP_EINPUT about fname
 * when p has a cross-attention decoder (a MetaOp with a memory) and b no
 * cross-attention block. Needs no device: main.c asks before attaching.
 */
int rt_check_backend(const sp_plan_t *p, const rt_backend_t *b, const char *fname,
		     sp_err_t *err);
/* Builds parameters and buffers of this rank for plan p (rt_check_backend
 * included). */
int rt_create(rt_state_t **out, const sp_plan_t *p, const rt_backend_t *b, rt_comm_t *c,
	      const rt_opts_t *o, sp_err_t *err);
void rt_free(rt_state_t *st);
/* One training step (1-based t); adds per-task loss sums into loss[] (this
 * rank's samples only). */
int rt_step(rt_state_t *st, int64_t t, double *loss, sp_err_t *err);
/* Completes the deferred all-gathers (bucket defer) the last step left in
 * flight, so that every weight is whole: before a checkpoint, an export,
 * a parameter digest and at the end (rt_step and rt_eval wait by
 * themselves). rt_deferred: how many pieces of such all-gathers
 * (plan_defer_pieces) completed in a later step (the step after theirs,
 * before the first layer reading the piece, or polled) and how many here;
 * rt_defer_shape: the rank's deferred buckets and their pieces. */
int rt_settle(rt_state_t *st, sp_err_t *err);
void rt_deferred(const rt_state_t *st, int64_t *later, int64_t *settled);
void rt_defer_shape(const rt_state_t *st, int *buckets, int *pieces);
/* The deferred all-gathers still in flight completed (nothing else; NULL
 * st or none: 0), before a failed run frees the buffers they write. */
int rt_settle_pending(rt_state_t *st, sp_err_t *err);
/*
 * Held-out evaluation: the forward part of the program (no update) on step
 * `step` of dataset ds. Sets acc[task * EV__COUNT + EV_*] to this rank's
 * share: the loss sum (as rt_step's), the samples in it and, for
 * classifier and contrastive losses, the predictions scored, those right
 * and the sum of each one's chance of being right by a uniform guess.
 */
enum { EV_LOSS, EV_SAMPLES, EV_TRIALS, EV_HITS, EV_CHANCE, EV__COUNT };
int rt_eval(rt_state_t *st, const rt_dataset_t *ds, int64_t step, double *acc, sp_err_t *err);
/* Bytes of each memory category this rank allocated (MEM_*). */
void rt_memory(const rt_state_t *st, int64_t out[MEM__COUNT]);
/* Bytes of zero-2 full gradients: the most live at once so far (placed and
 * given back as the steps ran), the walk's peak (plan_z2_walk) and the
 * pool they are placed in (in rt_memory's params). Returns 1 when the rank
 * has zero-2 buckets, else 0. */
int rt_zero2_peak(const rt_state_t *st, int64_t *most, int64_t *peak, int64_t *pool);
/* The same for zero-3 full weights (gathered layer by layer in the spans
 * PGATHER opens, plan_z3_walk), and in whole the most the walk counts for
 * whole buckets gathered together; 1 when the rank has zero-3 buckets. */
int rt_zero3_peak(const rt_state_t *st, int64_t *most, int64_t *peak, int64_t *pool,
		  int64_t *whole);
/* Events of the last step (when recorded). */
const rt_event_t *rt_events(const rt_state_t *st, int *n);

/*
 * Parameters in canonical order (component, layer, tensor element) owned
 * by this rank: a (comp, layer) is owned by the lowest rank holding it.
 * Returns a packed host buffer: records {int32 comp, int32 layer, int64
 * count, float[count]}; the caller frees. With opt_state, each record
 * holds weights, then AdamW m, then v, whole whatever the plan's layouts:
 * the shards of zero-1 buckets are all-gathered first, so with opt_state
 * it is collective (every rank calls it, as ckpt.c does).
 */
int rt_pack_owned(const rt_state_t *st, int opt_state, void **out, size_t *bytes);
/* Loads parameters (and optimizer state) from records like the above for
 * every (comp, layer) this rank holds; of the optimizer state, only the
 * part it owns (its shard in a zero-1 bucket). */
int rt_unpack(rt_state_t *st, const void *buf, size_t bytes, int opt_state, sp_err_t *err);

/* ---- eval.c: held-out evaluation (--eval DIR) ---------------------------------- */

typedef struct rt_heldout rt_heldout_t;

/* Opens the held-out split dir for rank `rank` of plan p, as dataset_open
 * does (same checks and messages, before step 1). */
int heldout_open(rt_heldout_t **out, const char *dir, const sp_plan_t *p, int rank,
		 int nranks, uint64_t seed, sp_err_t *err);
void heldout_free(rt_heldout_t *h);
/* One pass over the held-out samples with st's parameters (this rank's
 * share; its waits are bounded by the interpreter's timeout). */
int heldout_run(rt_heldout_t *h, rt_state_t *st, rt_comm_t *c, sp_err_t *err);
/* Sums the scores over the ranks (collective, blocking). */
int heldout_sum(rt_heldout_t *h, rt_comm_t *c, sp_err_t *err);
/* The per-task table (rank 0). */
void heldout_print(const rt_heldout_t *h, const sp_plan_t *p, FILE *f);
/* The same as JSON ("spindle.eval/1": tasks[] with task, batches, samples,
 * loss, kind, scored, right, accuracy, chance). */
int heldout_write_json(const rt_heldout_t *h, const sp_plan_t *p, const char *path,
		       sp_err_t *err);

#endif
