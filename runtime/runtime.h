/*
 * runtime.h — the runtime's internal map, one section per file. The runtime
 * does not plan: it reads a plan (schemas/plan_read.c), builds this rank's
 * parameters and buffers, and executes the rank's program step by step
 * through a backend (a table of function pointers chosen at start-up).
 */
#ifndef SPINDLE_RUNTIME_H
#define SPINDLE_RUNTIME_H

#include "common.h"
#include "model.h"
#include "plan.h"

#include <stddef.h>
#include <stdint.h>

/* ---- comm: point-to-point and all-reduce between ranks ------------------ */

typedef struct rt_req {
	int kind; /* 0: none */
	void *impl;
	int peer, tag;
} rt_req_t;

typedef struct rt_comm {
	const char *name;
	int rank, nranks;
	int tag_ub; /* largest message tag the transport accepts */
	void *impl;
	/* Creates a group over ranks[0..n) (ascending); collective over all
	 * ranks, called in the same order everywhere. *out: id, or -1 if this
	 * rank is not a member. */
	int (*group_create)(struct rt_comm *c, const int *ranks, int n, int *out);
	int (*isend)(struct rt_comm *c, const void *buf, size_t bytes, int peer, int tag,
		     rt_req_t *req);
	int (*irecv)(struct rt_comm *c, void *buf, size_t bytes, int peer, int tag,
		     rt_req_t *req);
	/* In-place sum over the group's members. */
	int (*iallreduce)(struct rt_comm *c, float *buf, int64_t n, int group, rt_req_t *req);
	/* *done = 1 when complete (req is then reset). */
	int (*test)(struct rt_comm *c, rt_req_t *req, int *done);
	/* Sum of doubles over all ranks (blocking; losses, norms). */
	int (*allsum)(struct rt_comm *c, double *buf, int n);
	/* Gathers every rank's bytes to rank 0 (blocking). out valid on 0. */
	int (*gather)(struct rt_comm *c, const void *buf, size_t bytes, void **out,
		      size_t **sizes);
	int (*barrier)(struct rt_comm *c);
	void (*abort)(struct rt_comm *c, int code);
	void (*finalize)(struct rt_comm *c);
} rt_comm_t;

/* comm_mpi.c: Open MPI (when built with it); comm_local.c: one rank. */
int comm_mpi_init(rt_comm_t *c, int *argc, char ***argv, sp_err_t *err);
int comm_local_init(rt_comm_t *c);
int comm_mpi_available(void);
/* Whether this process was started by mpirun (environment). */
int comm_under_launcher(void);

/* ---- backend: memory, layers, optimizer --------------------------------- */

typedef struct rt_backend {
	const char *name;
	int (*init)(struct rt_backend *b, int rank, sp_err_t *err);
	void (*shutdown)(struct rt_backend *b);
	/* device memory */
	void *(*alloc)(size_t bytes);
	void (*release)(void *p);
	void (*to_device)(void *dst, const void *src, size_t bytes);
	void (*to_host)(void *dst, const void *src, size_t bytes);
	void (*zero)(float *p, int64_t n);
	/* rows x cols floats between strided buffers; acc: add instead of copy */
	void (*copy_rows)(float *dst, int64_t dst_stride, const float *src,
			  int64_t src_stride, int64_t rows, int64_t cols, int acc);
	/* layers (layers.h semantics, device pointers) */
	void (*embedding_fwd)(const sp_opshape_t *s, int n, const float *p,
			      const int32_t *tokens, float *y, float *saved);
	void (*embedding_bwd)(const sp_opshape_t *s, int n, const float *saved,
			      const float *dy, float *dp);
	void (*patch_fwd)(const sp_opshape_t *s, int n, const float *p, const float *feats,
			  float *y, float *saved);
	void (*patch_bwd)(const sp_opshape_t *s, int n, const float *p, const float *saved,
			  const float *dy, float *dp);
	void (*tblock_fwd)(const sp_opshape_t *s, int n, const float *p, const float *x,
			   float *y, float *saved);
	void (*tblock_bwd)(const sp_opshape_t *s, int n, const float *p, const float *saved,
			   const float *dy, float *dx, float *dp);
	void (*linear_fwd)(const sp_opshape_t *s, int n, const float *p, const float *x,
			   float *y, float *saved);
	void (*linear_bwd)(const sp_opshape_t *s, int n, const float *p, const float *saved,
			   const float *dy, float *dx, float *dp);
	double (*lm_head_loss)(const sp_opshape_t *s, int n, const float *p, const float *x,
			       const int32_t *targets, double scale, float *dx, float *dp,
			       float *saved);
	double (*classifier_loss)(const sp_opshape_t *s, int n, int64_t seq_in,
				  const float *p, const float *x, const int32_t *labels,
				  double scale, float *dx, float *dp, float *saved);
	double (*contrastive_loss)(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
				   double temperature, int64_t s0, int64_t s1, const float *a,
				   const float *b, double scale, float *da, float *db,
				   float *saved);
	void (*adamw_step)(float *p, const float *g, float *m, float *v, int64_t n, int t,
			   const sp_optim_t *o);
	void (*sgd_step)(float *p, const float *g, int64_t n, const sp_optim_t *o);
	void (*layer_init)(float *params, const sp_component_t *c, int layer, uint64_t seed);
	/* waits for queued device work (no-op on the CPU) */
	void (*sync)(void);
	rt_comm_t comm;
} rt_backend_t;

/* backend_cpu.c */
void backend_cpu(rt_backend_t *b);
/* backend_cuda.c: 0 and a filled table when built with CUDA, else an error
 * that says so. */
int backend_cuda(rt_backend_t *b, sp_err_t *err);

/* ---- data.c: synthetic, deterministic, learnable training data ------------ */

/*
 * Everything is a function of (seed, step, task, node, sample index) only,
 * so any split of a batch across ranks sees the same samples. A sample of a
 * task has a latent z (K numbers); patch features are a fixed per-component
 * projection of z plus noise; token sequences start from z and follow
 * t[q+1] = (5 t[q] + 3) mod V; classifier labels bucket z[0]; LM targets
 * are the next token of the embedding stream a position came from (-1 where
 * it came from features).
 */
void data_tokens(int32_t *out, const sp_model_t *m, uint64_t seed, int64_t step, int task,
		 int node, int64_t s0, int64_t s1);
void data_features(float *out, const sp_model_t *m, uint64_t seed, int64_t step, int task,
		   int node, int64_t s0, int64_t s1);
void data_labels(int32_t *out, const sp_model_t *m, uint64_t seed, int64_t step, int task,
		 int node, int64_t s0, int64_t s1);
/* LM targets of loss node `node` for samples [s0,s1): [n, seq] */
void data_lm_targets(int32_t *out, const sp_model_t *m, uint64_t seed, int64_t step,
		     int task, int node, int64_t s0, int64_t s1);

/* ---- interp.c: executing programs ---------------------------------------------- */

typedef struct {
	double start_ms, end_ms;
	int32_t ins;  /* index in the rank's program */
	int32_t comm; /* 1: communication thread */
} rt_event_t;

typedef struct rt_state rt_state_t;

typedef struct {
	uint64_t seed;
	double timeout_s;
	int record_events;
} rt_opts_t;

/* Builds parameters and buffers of this rank for plan p. */
int rt_create(rt_state_t **out, const sp_plan_t *p, rt_backend_t *b, const rt_opts_t *o,
	      sp_err_t *err);
void rt_free(rt_state_t *st);
/* One training step (1-based t); adds per-task loss sums into loss[] (this
 * rank's samples only). */
int rt_step(rt_state_t *st, int64_t t, double *loss, sp_err_t *err);
/* Bytes of each memory category this rank allocated (MEM_*). */
void rt_memory(const rt_state_t *st, int64_t out[MEM__COUNT]);
/* Events of the last step (when recorded). */
const rt_event_t *rt_events(const rt_state_t *st, int *n);

/*
 * Parameters in canonical order (component, layer, tensor element) owned
 * by this rank: a (comp, layer) is owned by the lowest rank holding it.
 * Returns a packed host buffer: records {int32 comp, int32 layer, int64
 * count, float[count]}; the caller frees. With opt_state, each record
 * holds weights, then AdamW m, then v.
 */
int rt_pack_owned(const rt_state_t *st, int opt_state, void **out, size_t *bytes);
/* Loads parameters (and optimizer state) from records like the above for
 * every (comp, layer) this rank holds. */
int rt_unpack(rt_state_t *st, const void *buf, size_t bytes, int opt_state, sp_err_t *err);
int rt_rank(const rt_state_t *st);

#endif
