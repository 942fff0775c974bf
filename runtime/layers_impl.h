/*
 * layers_impl.h — internals of the CPU layers shared by layers.c and
 * layers_xattn.c, sectioned by what they are: numeric helpers, multi-head
 * attention on strided Q/K/V, and the transformer block's per-sample
 * steps, which the cross-attention decoder block calls around its extra
 * sublayer. Defined in layers.c, except attention (layers_attn.c). It is not an interface of the
 * runtime: only runtime/layers*.c include it; semantics of the public
 * functions stay in layers.h.
 */
#ifndef SPINDLE_LAYERS_IMPL_H
#define SPINDLE_LAYERS_IMPL_H

#include "layers.h"

#include <stddef.h>
#include <stdint.h>

/* ---- helpers -------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C, row-major, with int64 sizes. */
void ly_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
	     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* log sum_k exp z_k, stable. */
double ly_logsumexp(const float *z, int64_t n);
/* malloc that aborts with a message when memory runs out (workspace). */
void *ly_xmalloc(size_t n);
/* Each of `rows` rows (stride ld) gets the vector v added (v outside y's
 * rows). */
void ly_add_rows(float *y, int64_t rows, int64_t cols, int64_t ld, const float *v);
/* o = a + b over n floats in one pass (o disjoint from a and b). */
void ly_sum2(float *restrict o, const float *restrict a, const float *restrict b, int64_t n);
/* db += sum over rows of dy, row after row (db outside dy's rows). */
void ly_sum_rows(float *db, const float *dy, int64_t rows, int64_t cols, int64_t ld);
/* y (rows x cols) = bias row b + a W, a: rows x k, W: k x cols. */
void ly_affine(float *y, const float *a, const float *w, const float *b, int64_t rows,
	       int64_t k, int64_t cols);
/* LayerNorm (eps 1e-5) of `rows` contiguous rows of width h, their means
 * and 1/std; and its backward, adding into dx, dg, db. */
void ly_ln_rows(float *y, float *mean, float *rstd, const float *x, int64_t rows, int64_t h,
		const float *g, const float *b);
void ly_ln_rows_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
		    const float *mean, const float *rstd, const float *g, int64_t rows,
		    int64_t h);

/* GELU (tanh approximation) and its derivative, as the block uses them. */
float ly_gelu(float x);
float ly_gelu_grad(float x);

/* ---- layers_attn.c: attention ---------------------------------------------- */

/*
 * Scaled dot-product attention of `heads` heads of width dh: queries
 * [sq, *] (row stride ldq), keys and values [sk, *] (ldk, ldv), output
 * [sq, *] (ldo), head j at columns [j dh, (j+1) dh) of each; probabilities
 * [heads, sq, sk]. The gradients dq, dk, dv have the strides of q, k, v
 * and are overwritten; dpr is scratch [sq, sk].
 */
typedef struct {
	int64_t heads, dh, sq, sk, ldq, ldk, ldv, ldo;
	int causal;
} ly_attn_t;
void ly_attn_fwd(const ly_attn_t *a, const float *q, const float *k, const float *v,
		 float *probs, float *out);
void ly_attn_bwd(const ly_attn_t *a, const float *q, const float *k, const float *v,
		 const float *probs, const float *dout, float *dq, float *dk, float *dv,
		 float *dpr);

/* ---- transformer block steps ---------------------------------------------- */

/* Transformer tensors, in layer_tensors order. */
enum {
	TB_LN1G,
	TB_LN1B,
	TB_WQKV,
	TB_BQKV,
	TB_WO,
	TB_BO,
	TB_LN2G,
	TB_LN2B,
	TB_W1,
	TB_B1,
	TB_W2,
	TB_B2,
	TB__COUNT
};

/* A member's view of the block: its split and the hook (NULL unsplit). */
typedef struct {
	tblock_split_t sp;
	const rt_tp_t *tp;
} tb_dims_t;
int tb_dims(tb_dims_t *out, const sp_opshape_t *s, const rt_tp_t *tp);
/* The member's tensors of p (and of dp when not NULL), layer_tensors_tp order. */
void tb_tensors(const tb_dims_t *d, const float *p, float *dp, const float *w[TB__COUNT],
		float *g[TB__COUNT]);
/* The sequence-parallel block (layers_sp.c), called by tblock_fwd/bwd
 * once tb_dims accepted a split with d->sp.sp set. */
int tblock_sp_fwd(const tb_dims_t *d, int causal, int n, const float *p, const float *x,
		  float *y, float *saved);
int tblock_sp_bwd(const tb_dims_t *d, int n, const float *p, const float *saved,
		  const float *dy, float *dx, float *dp);

/* Pointers into one sample's saved block, in the order of layers.h. */
typedef struct {
	float *x, *ln1, *qkv, *cat, *xmid, *ln2, *pre, *act, *probs;
	float *m1, *r1, *m2, *r2;
} tb_saved_t;
tb_saved_t tb_saved(const tb_dims_t *d, float *base);

/* Scratch of one sample's attention backward: dcat [s,hl], dqkv [s,3hl],
 * dpr [s,s]. */
typedef struct {
	float *dcat, *dqkv, *dpr;
} tb_scratch_t;

/*
 * One sample's steps; w and g index tensors by TB_* (a longer table whose
 * first TB__COUNT entries are the block's will do). Each output sum y or
 * out is partial when split (see tb_start_sum in layers.c).
 *  tb_attn_out_fwd: ln1, qkv, probs, cat from v->x; out = x + bo + cat Wo
 *  tb_mlp_fwd:      ln2, pre, act from v->xmid; y = xmid + b2 + act W2
 *  tb_mlp_bwd:      MLP weight gradients; dln2 = d(LN2 output); dact scratch [s,fl]
 *  tb_attn_out_bwd: from dxm = d(x_mid): Wo, Wqkv gradients; dln1 = d(LN1 output)
 */
void tb_attn_out_fwd(const tb_dims_t *d, int causal, const float *const *w, tb_saved_t *v,
		     float *out);
void tb_mlp_fwd(const tb_dims_t *d, const float *const *w, tb_saved_t *v, float *y);
void tb_mlp_bwd(const tb_dims_t *d, const float *const *w, float *const *g,
		const tb_saved_t *v, const float *dy, float *dact, float *dln2);
void tb_attn_out_bwd(const tb_dims_t *d, const float *const *w, float *const *g,
		     const tb_saved_t *v, const float *dxm, const tb_scratch_t *ws, float *dln1);

#endif
