/*
 * cu_attn.cu — multi-head scaled dot-product attention on the GPU, forward
 * and backward, on strided bf16 Q/K/V of a chunk of samples (cu_attn in
 * cu_internal.cuh; the CPU's is layers_attn.c): the transformer block's
 * self-attention (cu_layers.cu) and the decoder block's cross-attention
 * (cu_xattn.cu) both call it. It does not project, normalise or add
 * residuals; the blocks do. Scores and probabilities are materialised per
 * (sample, head), as on the CPU (not fused); the products are
 * strided-batched GEMMs (gemm_grid), the softmax cu_kernels.cu's.
 */
#include "cu_internal.cuh"

#include <assert.h>

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;

} /* namespace */

void gemm_grid(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *A,
	       cudaDataType_t at, int64_t lda, int64_t ai, int64_t aj, const void *B,
	       cudaDataType_t bt, int64_t ldb, int64_t bi, int64_t bj, float beta, void *C,
	       cudaDataType_t ct, int64_t ldc, int64_t ci, int64_t cj, int64_t ni, int64_t nj)
{
	size_t ea = at == F32 ? 4 : 2, eb = bt == F32 ? 4 : 2, ec = ct == F32 ? 4 : 2;
	const char *a = (const char *)A, *b = (const char *)B;
	char *c = (char *)C;
	if (ni <= nj) {
		for (int64_t i = 0; i < ni; i++)
			cu_gemm_batched(ta, tb, m, n, k, alpha, a + ea * (size_t)(i * ai), at, lda,
					aj, b + eb * (size_t)(i * bi), bt, ldb, bj, beta,
					c + ec * (size_t)(i * ci), ct, ldc, cj, nj);
	} else {
		for (int64_t j = 0; j < nj; j++)
			cu_gemm_batched(ta, tb, m, n, k, alpha, a + ea * (size_t)(j * aj), at, lda,
					ai, b + eb * (size_t)(j * bj), bt, ldb, bi, beta,
					c + ec * (size_t)(j * cj), ct, ldc, ci, ni);
	}
}

/*
 * Per (sample i, head j):
 *   P_ij = softmax(scale Q_ij K_ij^T [+ causal mask]) [sq, sk]
 *   out_ij = P_ij V_ij
 */
void cu_attn_fwd(const cu_attn &a, int64_t samples, const bf16 *q, const bf16 *k,
		 const bf16 *v, float *p, bf16 *pb, bf16 *out)
{
	int64_t sq = a.sq, sk = a.sk, dh = a.dh, nh = a.heads, pp = sq * sk;
	assert(!a.causal || sq == sk);
	gemm_grid(false, true, sq, sk, dh, a.scale, q, BF, a.ldq, sq * a.ldq, dh, k, BF, a.ldk,
		  sk * a.ldk, dh, 0.0f, p, F32, sk, nh * pp, pp, samples, nh);
	k_softmax_fwd(p, pb, samples * nh * sq, sk, a.causal);
	gemm_grid(false, false, sq, dh, sk, 1.0f, pb, BF, sk, nh * pp, pp, v, BF, a.ldv,
		  sk * a.ldv, dh, 0.0f, out, BF, a.ldo, sq * a.ldo, dh, samples, nh);
}

/*
 * Per (sample, head): dP = dO V^T; dV = P^T dO;
 * dS = P (dP - rowsum(P dP)) scale (softmax backward); dQ = dS K; dK = dS^T Q.
 */
void cu_attn_bwd(const cu_attn &a, int64_t samples, const bf16 *q, const bf16 *k,
		 const bf16 *v, const float *p, const bf16 *dout, bf16 *dq, bf16 *dk, bf16 *dv,
		 float *dp, bf16 *pb)
{
	int64_t sq = a.sq, sk = a.sk, dh = a.dh, nh = a.heads, pp = sq * sk;
	k_to_bf16(pb, p, samples * nh * pp);
	gemm_grid(false, true, sq, sk, dh, 1.0f, dout, BF, a.ldo, sq * a.ldo, dh, v, BF, a.ldv,
		  sk * a.ldv, dh, 0.0f, dp, F32, sk, nh * pp, pp, samples, nh);
	gemm_grid(true, false, sk, dh, sq, 1.0f, pb, BF, sk, nh * pp, pp, dout, BF, a.ldo,
		  sq * a.ldo, dh, 0.0f, dv, BF, a.ldv, sk * a.ldv, dh, samples, nh);
	k_softmax_bwd(pb, p, dp, samples * nh * sq, sk, a.scale); /* pb: dS */
	gemm_grid(false, false, sq, dh, sk, 1.0f, pb, BF, sk, nh * pp, pp, k, BF, a.ldk,
		  sk * a.ldk, dh, 0.0f, dq, BF, a.ldq, sq * a.ldq, dh, samples, nh);
	gemm_grid(true, false, sk, dh, sq, 1.0f, pb, BF, sk, nh * pp, pp, q, BF, a.ldq,
		  sq * a.ldq, dh, 0.0f, dk, BF, a.ldk, sk * a.ldk, dh, samples, nh);
}
