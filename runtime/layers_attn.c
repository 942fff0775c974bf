/*
 * layers_attn.c — multi-head scaled dot-product attention, forward and
 * backward, on strided Q/K/V of one sample (ly_attn_t in layers_impl.h):
 * the transformer block's self-attention and the decoder block's
 * cross-attention both call it. It does not project, normalise or add
 * residuals; the blocks do (layers.c, layers_xattn.c).
 */
#include "layers_impl.h"

#include <math.h>

/*
 * Per head j (columns [j dh, (j+1) dh) of q, k, v and out):
 *   P_j = softmax(Q_j K_j^T / sqrt(dh) [+ causal mask]) [sq, sk]
 *   out_j = P_j V_j
 * The causal mask lets query r see keys [0, r].
 */
void ly_attn_fwd(const ly_attn_t *a, const float *q, const float *k, const float *v,
		 float *probs, float *out)
{
	int64_t sq = a->sq, sk = a->sk, dh = a->dh;
	float scale = (float)(1.0 / sqrt((double)dh));
	for (int64_t j = 0; j < a->heads; j++) {
		float *pr = probs + j * sq * sk;
		ly_gemm(0, 1, sq, sk, dh, scale, q + j * dh, a->ldq, k + j * dh, a->ldk, 0.0f,
		     pr, sk);
		for (int64_t r = 0; r < sq; r++) {
			float *row = pr + r * sk;
			int64_t lim = a->causal && r + 1 < sk ? r + 1 : sk;
			double lse = ly_logsumexp(row, lim);
			for (int64_t cc = 0; cc < lim; cc++)
				row[cc] = (float)exp((double)row[cc] - lse);
			for (int64_t cc = lim; cc < sk; cc++)
				row[cc] = 0.0f;
		}
		ly_gemm(0, 0, sq, dh, sk, 1.0f, pr, sk, v + j * dh, a->ldv, 0.0f, out + j * dh,
		     a->ldo);
	}
}

/*
 * Per head: dP = dO V^T; dV = P^T dO;
 * dS = P (dP - rowsum(P dP)) / sqrt(dh) (softmax backward); dQ = dS K; dK = dS^T Q.
 */
void ly_attn_bwd(const ly_attn_t *a, const float *q, const float *k, const float *v,
		 const float *probs, const float *dout, float *dq, float *dk, float *dv,
		 float *dpr)
{
	int64_t sq = a->sq, sk = a->sk, dh = a->dh;
	float scale = (float)(1.0 / sqrt((double)dh));
	for (int64_t j = 0; j < a->heads; j++) {
		const float *pr = probs + j * sq * sk, *dout_j = dout + j * dh;
		int64_t c = j * dh;
		ly_gemm(0, 1, sq, sk, dh, 1.0f, dout_j, a->ldo, v + c, a->ldv, 0.0f, dpr, sk);
		ly_gemm(1, 0, sk, dh, sq, 1.0f, pr, sk, dout_j, a->ldo, 0.0f, dv + c, a->ldv);
		for (int64_t r = 0; r < sq; r++) {
			const float *pw = pr + r * sk;
			float *dw = dpr + r * sk;
			double dot = 0;
			for (int64_t cc = 0; cc < sk; cc++)
				dot += (double)pw[cc] * dw[cc];
			for (int64_t cc = 0; cc < sk; cc++)
				dw[cc] = (float)(pw[cc] * (dw[cc] - dot) * scale);
		}
		ly_gemm(0, 0, sq, dh, sk, 1.0f, dpr, sk, k + c, a->ldk, 0.0f, dq + c, a->ldq);
		ly_gemm(1, 0, sk, dh, sq, 1.0f, dpr, sk, q + c, a->ldq, 0.0f, dk + c, a->ldk);
	}
}
