/*
 * cu_internal.cuh — what the CUDA backend's .cu files share, one section
 * per file: error checks and state (cu_runtime.cu), the row-major GEMM
 * wrappers over cuBLAS (cu_runtime.cu), and the host launchers of the
 * kernels (cu_kernels.cu). Not visible from C: the C side sees only
 * cuda_backend.h.
 */
#ifndef SPINDLE_CU_INTERNAL_CUH
#define SPINDLE_CU_INTERNAL_CUH

#include "cuda_backend.h"

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

#endif
