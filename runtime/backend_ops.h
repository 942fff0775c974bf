/*
 * backend_ops.h — the function type of every entry of a backend's table,
 * each signature written once. layers.h declares the CPU reference
 * functions with these types, cuda/cuda_backend.h the CUDA ones, and
 * runtime.h's rt_backend_t holds pointers to them, so the compiler checks
 * that all three agree. Semantics live beside the CPU declarations
 * (layers.h) and the table (runtime.h); this header only names types.
 * Included by C and by CUDA C++ (inside extern "C" there).
 */
#ifndef SPINDLE_BACKEND_OPS_H
#define SPINDLE_BACKEND_OPS_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

/* ---- device memory ------------------------------------------------------ */

typedef void *rt_alloc_fn_t(size_t bytes);
typedef void rt_release_fn_t(void *p);
typedef void rt_copy_fn_t(void *dst, const void *src, size_t bytes);
typedef void rt_zero_fn_t(float *p, int64_t n);
typedef void rt_copy_rows_fn_t(float *dst, int64_t dst_stride, const float *src,
			       int64_t src_stride, int64_t rows, int64_t cols, int acc);
typedef void rt_sync_fn_t(void);

/* ---- layers ------------------------------------------------------------- */

typedef void rt_embedding_fwd_fn_t(const sp_opshape_t *s, int n, const float *p,
				   const int32_t *tokens, float *y, float *saved);
typedef void rt_embedding_bwd_fn_t(const sp_opshape_t *s, int n, const float *saved,
				   const float *dy, float *dp);
/* patch, transformer block, linear: x -> y */
typedef void rt_fwd_fn_t(const sp_opshape_t *s, int n, const float *p, const float *x, float *y,
			 float *saved);
typedef void rt_patch_bwd_fn_t(const sp_opshape_t *s, int n, const float *p,
			       const float *saved, const float *dy, float *dp);
/* transformer block, linear: dy -> dx, dp */
typedef void rt_bwd_fn_t(const sp_opshape_t *s, int n, const float *p, const float *saved,
			 const float *dy, float *dx, float *dp);

/*
 * Tensor parallelism: the transformer block on shard `rank` of a t-way
 * split (parameters in layer_tensors_tp layout, saved activations
 * op_saved_elems_tp per sample). x, y, dy, dx are whole and identical on
 * every member of the group. allreduce sums buf[0..n) in place over the
 * group, blocking until the sum is there (backend memory); it returns 0 or
 * a negative code, which the layer returns at once. NULL tp, or t == 1:
 * the unsplit layer, no all-reduce.
 */
typedef struct rt_tp {
	int t, rank;
	void *ctx;
	int (*allreduce)(void *ctx, float *buf, int64_t n);
	/*
	 * Sequence parallelism (sp != 0; the transformer block only, t > 1,
	 * t dividing the shape's seq): the layer norms, residual adds and
	 * biases run on the member's token shard, rows [rank R, (rank+1) R) of
	 * the call's n seq tokens flattened sample after sample, R = n seq / t;
	 * an all-gather before the column-parallel products and a
	 * reduce-scatter after the row-parallel ones replace the all-reduces
	 * (backward: the mirror ones, and one all-reduce of the LayerNorm
	 * gradients). Both hooks work in place on buf[0..n) of every member,
	 * member i's shard [n i/t, n (i+1)/t) (comm_shard): reduce_scatter
	 * leaves the members' sum of its shard there (the rest undefined),
	 * allgather gives every member all shards. whole_in: x (and dx) are
	 * whole [n, seq, h] and identical on every member (the slice's first
	 * layer), else the member's shard [R, h]; whole_out: y (and dy) are
	 * whole (the slice's last layer: y all-gathered), else the shard.
	 * ln_grads (backward; NULL: each layer all-reduces its own four
	 * LayerNorm gradients [4h] and adds them into dp): the caller's
	 * ln_n floats, the instruction's layers' LayerNorm gradients, this
	 * layer's [4h] at ln_at (ln1_g, ln1_b, ln2_g, ln2_b); the layer adds
	 * its own, over its tokens, there, and a whole_in layer (the last
	 * backward of a slice) sums all ln_n over the group on the
	 * all-gather of dx it does anyway, leaving the sums in ln_grads on
	 * every member, for the caller to add into each layer's gradients.
	 */
	int sp, whole_in, whole_out;
	int (*reduce_scatter)(void *ctx, float *buf, int64_t n);
	int (*allgather)(void *ctx, float *buf, int64_t n);
	float *ln_grads;
	int64_t ln_n, ln_at;
} rt_tp_t;
typedef int rt_tblock_fwd_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
			       const float *p, const float *x, float *y, float *saved);
typedef int rt_tblock_bwd_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
			       const float *p, const float *saved, const float *dy, float *dx,
			       float *dp);
/*
 * Vocabulary parallelism: the embedding and the LM head on member `rank`
 * of a t-way split by vocabulary (layer_tensors_tp layout); the same tp
 * argument, the same all-reduce rules (the CPU embedding's backward also
 * all-gathers its position gradient: layers.h). The LM head's loss goes
 * to *loss.
 */
typedef int rt_embedding_fwd_tp_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
				     const float *p, const int32_t *tokens, float *y,
				     float *saved);
typedef int rt_embedding_bwd_tp_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
				     const float *saved, const float *dy, float *dp);
typedef int rt_lm_head_loss_tp_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
				    const float *p, const float *x, const int32_t *targets,
				    double scale, float *dx, float *dp, float *saved,
				    double *loss);
/*
 * The cross-attention decoder block: the transformer block's x -> y that
 * also reads memory [n, m, W] (m = s->mem_seq, W = s->mem_width); the
 * backward adds into dmemory as well. Same tp argument; no split yet.
 */
typedef int rt_xblock_fwd_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
			       const float *p, const float *x, const float *memory, float *y,
			       float *saved);
typedef int rt_xblock_bwd_fn_t(const sp_opshape_t *s, const rt_tp_t *tp, int n,
			       const float *p, const float *saved, const float *memory,
			       const float *dy, float *dx, float *dmemory, float *dp);

/* ---- losses, optimizer, initialisation ------------------------------------ */

typedef double rt_lm_head_loss_fn_t(const sp_opshape_t *s, int n, const float *p,
				    const float *x, const int32_t *targets, double scale,
				    float *dx, float *dp, float *saved);
typedef double rt_classifier_loss_fn_t(const sp_opshape_t *s, int n, int64_t seq_in,
				       const float *p, const float *x, const int32_t *labels,
				       double scale, float *dx, float *dp, float *saved);
typedef double rt_contrastive_loss_fn_t(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
					double temperature, int64_t s0, int64_t s1,
					const float *a, const float *b, double scale, float *da,
					float *db, float *saved);
typedef void rt_adamw_step_fn_t(float *p, const float *g, float *m, float *v, int64_t n, int t,
				const sp_optim_t *o);
typedef void rt_sgd_step_fn_t(float *p, const float *g, int64_t n, const sp_optim_t *o);
typedef void rt_layer_init_fn_t(float *params, const sp_component_t *c, int layer,
				uint64_t seed);

#endif
