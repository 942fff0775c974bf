/*
 * cu_internal.cuh — what the CUDA backend's .cu files share, one section
 * per file: error checks and state (cu_runtime.cu), the row-major GEMM
 * wrappers over cuBLAS (cu_runtime.cu), the host launchers of the
 * kernels (cu_kernels.cu), multi-head attention (cu_attn.cu) and the
 * transformer block's steps (cu_layers.cu), which the cross-attention
 * decoder block (cu_xattn.cu) calls around its own sublayer. Not visible
 * from C: the C side sees only cuda_backend.h.
 */
#ifndef SPINDLE_CU_INTERNAL_CUH
#define SPINDLE_CU_INTERNAL_CUH

#include "cuda_backend.h"

extern "C" {
#include "layers.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 bf16;

/* ---- cu_runtime.cu: errors --------------------------------------------- */

/*
 * Records the first error ("rank R on HOST: file:line: what: detail"),
 * prints it and ends the job through the abort hook: used where the entry
 * point returns void and the CUDA context cannot be trusted any more.
 */
[[noreturn]] void cu_fatal(const char *file, int line, const char *what, const char *detail);
const char *cu_cublas_string(cublasStatus_t s);

static inline void cu_check_cuda(cudaError_t e, const char *what, const char *file, int line)
{
	if (e != cudaSuccess)
		cu_fatal(file, line, what, cudaGetErrorString(e));
}

static inline void cu_check_cublas(cublasStatus_t s, const char *what, const char *file,
				   int line)
{
	if (s != CUBLAS_STATUS_SUCCESS)
		cu_fatal(file, line, what, cu_cublas_string(s));
}

#define CUDA_CHECK(call) cu_check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cu_check_cublas((call), #call, __FILE__, __LINE__)
/* After a kernel launch: launch-configuration errors surface here. */
#define CUDA_LAUNCHED() cu_check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

/* ---- cu_runtime.cu: state -------------------------------------------------- */

cudaStream_t cu_s(void);
/* Workspace cap (bytes) layers size their sample chunks by. */
size_t cu_ws_cap(void);
/*
 * The layer workspace: one device buffer of at least `bytes`, grown (after
 * a stream sync) when too small. One call per layer entry point, before
 * carving: a later call may move it.
 */
char *cu_ws_get(size_t bytes);
/* Scratch for reductions inside the kernel launchers (independent of the
 * layer workspace, same growth rule). */
char *cu_red_get(size_t bytes);
/* Pinned host doubles for results read back by the losses. */
double *cu_host_scalars(void);
/*
 * bf16 shadow of n fp32 parameters at p (a pointer into an allocation made
 * by cu_alloc). Created on first use for the whole allocation, refreshed
 * when anything but the optimizer wrote to that allocation since.
 */
const bf16 *cu_shadow(const float *p, int64_t n);

/* Carves aligned sub-buffers out of [base, base + bytes). */
struct cu_carve {
	char *base;
	size_t bytes, off, align;
	bool overflow;
	cu_carve(void *b, size_t n, size_t a) : base((char *)b), bytes(n), off(0), align(a), overflow(false) {}
	template <class T> T *take(int64_t count)
	{
		uintptr_t at = (uintptr_t)base + off;
		uintptr_t al = (at + align - 1) / align * align;
		size_t need = (size_t)(al - (uintptr_t)base) + sizeof(T) * (size_t)count;
		if (need > bytes) {
			overflow = true;
			return (T *)base;
		}
		off = need;
		return (T *)al;
	}
};

/*
 * Lays out a saved-activation chunk of `budget` bytes at `chunk` with
 * take(cu_carve &) -> L: 16-byte aligned where the budget allows, else 4
 * (the CPU's float layout always fits with 4); a layout that does not fit
 * even then is our bug (what names it).
 */
template <class F> auto cu_layout(void *chunk, size_t budget, const char *what, F take)
{
	for (size_t align = 16;; align = 4) {
		cu_carve c(chunk, budget, align);
		auto v = take(c);
		if (!c.overflow)
			return v;
		if (align == 4)
			cu_fatal(__FILE__, __LINE__, "laying out saved activations", what);
	}
}

/* Samples per chunk: as many as fit the workspace cap at per_sample bytes
 * each, at least one, at most n. */
int64_t cu_chunk_samples(size_t per_sample, int n);

/* ---- cu_runtime.cu: row-major GEMM over cuBLAS -------------------------------- */

/*
 * C[m,n] = alpha op(A) op(B) + beta C, all row-major with leading
 * dimensions in elements (A is [m,k], or [k,m] when ta; B is [k,n], or
 * [n,k] when tb). Types: CUDA_R_16BF or CUDA_R_32F each; compute is fp32
 * (CUBLAS_COMPUTE_32F: tensor cores for bf16 inputs, plain fp32 for fp32).
 */
void cu_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *A,
	     cudaDataType_t at, int64_t lda, const void *B, cudaDataType_t bt, int64_t ldb,
	     float beta, void *C, cudaDataType_t ct, int64_t ldc);
/* The same over `batch` matrices at element strides sa, sb, sc. */
void cu_gemm_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
		     const void *A, cudaDataType_t at, int64_t lda, int64_t sa, const void *B,
		     cudaDataType_t bt, int64_t ldb, int64_t sb, float beta, void *C,
		     cudaDataType_t ct, int64_t ldc, int64_t sc, int64_t batch);

/* ---- cu_kernels.cu: kernel launchers (all on cu_s()) ------------------------- */

void k_to_bf16(bf16 *dst, const float *src, int64_t n);
/* y[r, c] = v[c] (row stride ld) */
void k_fill_rows(float *y, int64_t ld, const float *v, int64_t rows, int64_t cols);
void k_fill_rows_bf16(bf16 *y, int64_t ld, const float *v, int64_t rows, int64_t cols);
/* y[r, c] = x[r, c] + v[c] (contiguous rows of cols) */
void k_add_rows(float *y, const float *x, const float *v, int64_t rows, int64_t cols);
/* y[i, t, c] = b[c] + pos[t, c] for n samples of s tokens */
void k_bias_pos(float *y, const float *b, const float *pos, int64_t n, int64_t s, int64_t h);
/* dst[r, c] += src[r, c] with strides */
void k_add_2d(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
	      int64_t cols);
/* out[c] += sum_r in[r*ld + c] (deterministic: fixed-order two-stage sum) */
void k_colsum(float *out, const float *in, int64_t rows, int64_t cols, int64_t ld);
void k_colsum_bf16(float *out, const bf16 *in, int64_t rows, int64_t cols, int64_t ld);

/*
 * LayerNorm forward of rows (eps 1e-5, biased variance), y as bf16 or fp32;
 * mean and rstd at row stride ldm.
 */
void k_ln_fwd_bf16(bf16 *y, int64_t ldy, float *mean, float *rstd, int64_t ldm,
		   const float *x, int64_t ldx, const float *g, const float *b, int64_t rows,
		   int64_t h);
void k_ln_fwd_f32(float *y, int64_t ldy, float *mean, float *rstd, int64_t ldm,
		  const float *x, int64_t ldx, const float *g, const float *b, int64_t rows,
		  int64_t h);
/*
 * LayerNorm backward of rows with xhat = (x - mean) rstd, dxhat = dln g:
 *   dst = (acc ? dst : 0) + (resid ? resid : 0)
 *         + rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
 * and, when dg is not NULL, dg += sum_r dln xhat, db += sum_r dln.
 */
void k_ln_bwd(float *dst, int64_t ldd, int acc, const float *resid, int64_t ldr,
	      const float *dln, int64_t ldl, const float *x, int64_t ldx, const float *mean,
	      const float *rstd, int64_t ldm, const float *g, float *dg, float *db,
	      int64_t rows, int64_t h);
/* act = gelu_tanh(pre) (bf16 out) and dpre = dact gelu'(pre) (bf16 out) */
void k_gelu_fwd(bf16 *act, const float *pre, int64_t n);
void k_gelu_bwd(bf16 *dpre, const float *dact, const float *pre, int64_t n);
/*
 * Row softmax of rows of s scores (already scaled), in place in fp32 plus a
 * bf16 copy; row r is query r % s, which sees keys [0, q] when causal.
 */
void k_softmax_fwd(float *p, bf16 *pb, int64_t rows, int64_t s, int causal);
/* ds = p (dp - rowsum(p dp)) scale, as bf16 */
void k_softmax_bwd(bf16 *ds, const float *p, const float *dp, int64_t rows, int64_t s,
		   float scale);
void k_embed_fwd(float *y, float *saved, const float *tok, const float *pos,
		 const int32_t *tokens, int64_t n, int64_t s, int64_t h, int64_t vocab);
void k_embed_bwd(float *dtok, const float *saved, const float *dy, int64_t rows, int64_t h);
/* The vocabulary-parallel embedding's (rows [v0, v0 + vl) of the table;
 * add_pos: member 0) */
void k_embed_fwd_tp(float *y, float *saved, const float *tok, const float *pos,
		    const int32_t *tokens, int64_t n, int64_t s, int64_t h, int64_t vocab,
		    int64_t v0, int64_t vl, int add_pos);
void k_embed_bwd_tp(float *dtok, const float *saved, const float *dy, int64_t rows, int64_t h,
		    int64_t v0, int64_t vl);
void k_adamw(float *p, const float *g, float *m, float *v, bf16 *shadow, int64_t n, float lr,
	     float b1, float b2, float eps, float wd, float c1, float c2);
void k_sgd(float *p, const float *g, bf16 *shadow, int64_t n, float lr, float wd);

/* losses */
void k_count_valid(int *cnt, const int32_t *targets, int64_t n, int64_t s);
/*
 * Next-token cross-entropy of each row of z [rows, V] (fp32) with in-place
 * bf16 gradient: row r's dz (scale/cnt[r/s] (softmax - onehot), 0 for
 * ignored rows) is written over the first half of its own fp32 row, so the
 * bf16 matrix has leading dimension 2V. rowloss[r] = lse - z[y] (0 when
 * ignored).
 */
void k_ce_rows_inplace(float *z, int64_t V, const int32_t *targets, const int *cnt,
		       int64_t s, double scale, double *rowloss, int64_t rows);
/*
 * The vocabulary-parallel LM head's rows (cu_vocab.cu): k_vocab_stats
 * writes member rank's (max, sum of exponentials) of each row of z [rows,
 * vl] and, where it owns the target, the target logit into st [rows, 2t +
 * 1] (zeroed by the caller); after their all-reduce, k_vocab_ce writes each
 * row's loss and its bf16 gradient in place (k_ce_rows_inplace's layout).
 */
void k_vocab_stats(float *st, const float *z, int64_t vl, const int32_t *targets,
		   const int *cnt, int64_t s, int64_t vocab, int64_t v0, int t, int rank,
		   int64_t rows);
void k_vocab_ce(float *z, int64_t vl, const float *st, const int32_t *targets, const int *cnt,
		int64_t s, double scale, int64_t v0, int t, double *rowloss, int64_t rows);
/* total = sum over samples with cnt > 0 of (sum of their rows' losses) / cnt */
void k_lm_total(double *total, const double *rowloss, const int *cnt, int64_t n, int64_t s);
/* Classifier rows: z [rows, C] at stride ld, labels < 0 leave a row out. */
void k_ce_rows_f32(float *z, int64_t ld, int64_t C, const int32_t *labels, double scale,
		   double *rowloss, int64_t rows);
void k_sum_doubles(double *total, const double *v, int64_t n);
/* dst [rows, w] = src rows / max(|row|, 1e-12); nrm[r] = |row| */
void k_l2norm_rows(float *dst, float *nrm, const float *src, int64_t lds, int64_t rows,
		   int64_t w);
/* r[i] = logsumexp_j s[i, j]; c[j] = logsumexp_i s[i, j] (s is B x B) */
void k_row_lse(double *r, const float *s, int64_t B);
void k_col_lse(double *c, const float *s, int64_t B);
/*
 * InfoNCE gradient pieces from S (pa, B x B): g_ij = scale ((e^{S-r_i} +
 * e^{S-c_j})/2 - [i=j]); dota[i] = sum_j g S, dotb[j] = sum_i g S;
 * pb[i,j] = g inv_t / |b_j|; total = sum_{i in [s0,s1)} (r_i + c_i)/2 - S_ii;
 * finally pa[i,j] = g inv_t / |a_i| in place.
 */
void k_infonce_grads(float *pa, float *pb, double *dota, double *dotb, double *total,
		     const double *r, const double *c, const float *na, const float *nb,
		     int64_t B, double inv_t, double scale, int64_t s0, int64_t s1);
/* d[i] -= (dot[i] / nrm[i]) u[i] for rows i in [s0, s1) with nrm > 1e-12 */
void k_tangent_rows(float *d, int64_t ldd, const float *u, const float *nrm,
		    const double *dot, int64_t s0, int64_t s1, int64_t w);

/* ---- cu_attn.cu: attention on strided Q/K/V ------------------------------- */

/*
 * C_ij = alpha op(A_ij) op(B_ij) + beta C_ij over samples i < ni and heads
 * j < nj, with X_ij = X + i*xi + j*xj (elements): strided-batched over the
 * larger of the two, looping over the smaller.
 */
void gemm_grid(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *A,
	       cudaDataType_t at, int64_t lda, int64_t ai, int64_t aj, const void *B,
	       cudaDataType_t bt, int64_t ldb, int64_t bi, int64_t bj, float beta, void *C,
	       cudaDataType_t ct, int64_t ldc, int64_t ci, int64_t cj, int64_t ni, int64_t nj);

/*
 * Scaled dot-product attention (layers_attn.c on the GPU) of `heads` heads
 * of width dh over a chunk of samples: queries [sq, *] per sample (row
 * stride ldq), keys and values [sk, *] (ldk, ldv), output [sq, *] (ldo),
 * samples contiguous (a sample's rows follow the previous sample's), head
 * j at columns [j dh, (j+1) dh); all bf16. Probabilities P fp32 and pb
 * bf16 [samples, heads, sq, sk]. causal (self-attention, sq == sk): query
 * r sees keys [0, r]. The gradients dq, dk, dv have the strides of q, k, v
 * and are overwritten; dp fp32 and pb are scratch [samples, heads, sq, sk].
 */
struct cu_attn {
	int64_t heads, dh, sq, sk, ldq, ldk, ldv, ldo;
	int causal;
	float scale; /* 1/sqrt(dh) */
};
void cu_attn_fwd(const cu_attn &a, int64_t samples, const bf16 *q, const bf16 *k,
		 const bf16 *v, float *p, bf16 *pb, bf16 *out);
void cu_attn_bwd(const cu_attn &a, int64_t samples, const bf16 *q, const bf16 *k,
		 const bf16 *v, const float *p, const bf16 *dout, bf16 *dq, bf16 *dk, bf16 *dv,
		 float *dp, bf16 *pb);

/* ---- cu_layers.cu: transformer block steps ----------------------------------- */

/* Tensors of one transformer layer (the first 12 of a decoder's). */
constexpr int TB_NT = 12;

/*
 * One member's view of a (possibly split) block (layers.h): its split
 * (tblock_split), the tensor offsets of its shard, the hook (NULL
 * unsplit), and what both directions start from (tb_begin): the weights p,
 * their bf16 shadow wb, the self-attention's dimensions, the chunk size nc
 * (samples per workspace chunk; the saved layout depends on it).
 */
struct tb_dims {
	tblock_split_t sp;
	int64_t off[TB_NT];
	const rt_tp_t *tp;
	const float *p;
	const bf16 *wb;
	cu_attn attn;
	int64_t nc;
};
/* Fills d for n samples on weights p: 0, or SP_EINPUT for a split the
 * shape does not allow (tblock_split: a shape with a memory included). */
int tb_begin(tb_dims *d, const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p);

/* One chunk's saved tensors (cu_layers.cu's header gives the layout). */
struct tb_saved {
	float *x, *xmid, *pre, *p, *m1, *r1, *m2, *r2;
	bf16 *ln1, *qkv, *cat, *ln2, *act;
};
/* The layout for the chunk of m samples from sample c0 of n, inside the
 * first n d.sp.per floats of base. */
tb_saved tb_layout(float *base, int64_t c0, int64_t m, int64_t n, const tb_dims &d);
/* The tensors of that layout but xmid (NULL) carved from c in its order
 * for m samples: x and the four statistics for `own` rows (the chunk's m
 * s, or a sequence-parallel member's token shard), the rest for m s. */
tb_saved tb_carve(cu_carve &c, const tb_dims &d, int64_t m, int64_t own);

/* Backward scratch of one chunk, besides dln and dxm. */
struct tb_scratch {
	bf16 *dyb, *dpreb, *dxmb, *dcatb, *dqkvb, *pb;
	float *dact, *dP;
};
/* Its bytes for a chunk of m samples (alignment included), and its carving. */
size_t tb_ws_bytes(const tb_dims &d, int64_t m);
tb_scratch tb_scratch_take(cu_carve &w, const tb_dims &d, int64_t m);

/* y [R,cols] (bf16) = b + a W over R rows of a [R,k] (bf16; W from the shadow). */
void cu_affine_bf16(bf16 *y, const bf16 *a, const bf16 *w, const float *b, int64_t R,
		    int64_t k, int64_t cols);
/*
 * Backward of y = a W + b over R rows, a bf16 [R,k], W [k,o] (shadow):
 *   tb_lin_bwd from fp32 dy (dyb its bf16 copy, scratch [R,o]),
 *   cu_lin_bwd_bf16 from bf16 dyb:
 * dW += a^T dy; db += colsum dy; da = beta da + dy W^T (type dt, [R,k]).
 */
void tb_lin_bwd(int64_t R, int64_t k, int64_t o, const bf16 *a, const float *dy, bf16 *dyb,
		const bf16 *w, float *dw, float *db, void *da, cudaDataType_t dt);
void cu_lin_bwd_bf16(int64_t R, int64_t k, int64_t o, const bf16 *a, const bf16 *dyb,
		     const bf16 *w, float *dw, float *db, void *da, cudaDataType_t dt, float beta);

/*
 * One chunk of m samples, in the order the block runs them (layers.h's
 * formulas; split, each output is the member's partial sum, see
 * cu_tblock_fwd):
 *  tb_self_fwd:     v.x = x; ln1, qkv, P, cat; v.xmid = x + bo + cat Wo
 *  tb_mlp_fwd:      ln2, pre, act from v.xmid; y = v.xmid + b2 + act W2
 *  tb_mlp_bwd:      W2, W1 gradients from dy; dln = d(LN2 output)
 *  tb_ln2_bwd:      dxm = dy + LN2'(dln) at v.xmid
 *  tb_attn_out_bwd: Wo, Wqkv gradients from dxm; dln = d(LN1 output)
 *  tb_ln1_bwd:      dx += dxm + LN1'(dln)
 * A decoder runs the MLP steps on a copy of v whose xmid is its x_c.
 */
void tb_self_fwd(const tb_dims &d, const tb_saved &v, int64_t m, const float *x, bf16 *pb);
void tb_mlp_fwd(const tb_dims &d, const tb_saved &v, int64_t m, float *y);
void tb_mlp_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dy,
		const tb_scratch &w, float *dln);
void tb_ln2_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dy,
		const float *dln, float *dxm);
void tb_attn_out_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp,
		     const float *dxm, const tb_scratch &w, float *dln);
void tb_ln1_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dxm,
		const float *dln, float *dx);

/* ---- cu_sp.cu: the sequence-parallel block ------------------------------------ */

/*
 * cu_tblock_fwd/_bwd on a split whose d.sp.sp is set (tb_begin on n
 * samples: d.tp the hooks, whole_in and whole_out): layers_sp.c's
 * algorithm and collectives; its saved layout is cu_sp.cu's.
 */
int cu_tblock_sp_fwd(const tb_dims &d, int n, const float *x, float *y, float *saved);
int cu_tblock_sp_bwd(const tb_dims &d, int n, const float *saved, const float *dy, float *dx,
		     float *dp);

#endif
