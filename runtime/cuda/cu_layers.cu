/*
 * cu_layers.cu — embedding, patch, transformer block and linear layers on
 * the GPU, with layers.h semantics (the CPU reference is layers.c). Matrix
 * products are cuBLAS with bf16 operands and fp32 accumulation (weights
 * from their bf16 shadow; fp32 outputs where the interface wants fp32);
 * everything else is cu_kernels.cu.
 *
 * `saved` belongs to this backend between a forward and its backward: it
 * has op_saved_elems floats per sample, as the interpreter sizes it, but
 * its layout is ours (bf16 where only a matrix product reads a tensor
 * back). Layouts are a function of (saved pointer, shape, n) only, so a
 * backward finds what its forward wrote:
 *   patch, linear  the input as bf16 [n s, in]
 *   embedding      the token ids as floats [n s] (as the CPU)
 *   transformer    per chunk of samples (see tb_chunk), tensor-major over
 *                  the chunk's R = m s rows:
 *                    x fp32 [R,h]     ln1 bf16 [R,h]   qkv bf16 [R,3h]
 *                    cat bf16 [R,h]   xmid fp32 [R,h]  ln2 bf16 [R,h]
 *                    pre fp32 [R,f]   act bf16 [R,f]   P fp32 [m,a,s,s]
 *                    mean1, rstd1, mean2, rstd2 fp32 [R]
 *                  which is 20 R h + 6 R f + 4 m a s^2 + 16 R bytes of the
 *                  32 R h + 8 R f + 4 m a s^2 + 16 R the CPU layout takes.
 * Attention is not fused: scores and probabilities are materialised per
 * (sample, head) as the CPU does (correctness first); P V and the score
 * products are strided-batched GEMMs.
 */
#include "cu_internal.cuh"

extern "C" {
#include "layers.h"
}

#include <math.h>
#include <string.h>

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;

/* Tensor offsets (floats) of one transformer layer, layer_tensors order. */
enum { LN1G, LN1B, WQKV, BQKV, WO, BO, LN2G, LN2B, W1, B1, W2, B2, NT };

void tb_offsets(const sp_opshape_t *s, int64_t off[NT])
{
	sp_component_t c = layer_comp_of_shape(s);
	layer_tensor_t t[12];
	layer_tensors(&c, t);
	for (int i = 0; i < NT; i++)
		off[i] = t[i].offset;
}

/* ---- transformer block ---- */

struct tb_saved {
	float *x, *xmid, *pre, *p, *m1, *r1, *m2, *r2;
	bf16 *ln1, *qkv, *cat, *ln2, *act;
};

/* The layout above, 16-byte aligned where the budget allows, else 4. */
tb_saved tb_layout(float *base, int64_t m, const sp_opshape_t *s)
{
	int64_t h = s->hidden, f = s->ffn, sq = s->seq, a = s->heads, R = m * sq;
	size_t budget = sizeof(float) * (size_t)(m * op_saved_elems(s, 0));
	for (size_t align = 16;; align = 4) {
		cu_carve c(base, budget, align);
		tb_saved v;
		v.x = c.take<float>(R * h);
		v.ln1 = c.take<bf16>(R * h);
		v.qkv = c.take<bf16>(R * 3 * h);
		v.cat = c.take<bf16>(R * h);
		v.xmid = c.take<float>(R * h);
		v.ln2 = c.take<bf16>(R * h);
		v.pre = c.take<float>(R * f);
		v.act = c.take<bf16>(R * f);
		v.p = c.take<float>(m * a * sq * sq);
		v.m1 = c.take<float>(R);
		v.r1 = c.take<float>(R);
		v.m2 = c.take<float>(R);
		v.r2 = c.take<float>(R);
		if (!c.overflow)
			return v;
		if (align == 4)
			cu_fatal(__FILE__, __LINE__, "laying out saved activations",
				 "the transformer layout does not fit op_saved_elems");
	}
}

/* Backward workspace bytes for m samples (the forward needs less). */
size_t tb_ws_bytes(const sp_opshape_t *s, int64_t m)
{
	int64_t h = s->hidden, f = s->ffn, sq = s->seq, a = s->heads, R = m * sq;
	int64_t e = 22 * R * h + 6 * R * f + 6 * m * a * sq * sq;
	return (size_t)e + 16 * 256;
}

/*
 * Samples per chunk: as many as fit the workspace cap (at least one). The
 * saved layout depends on it, so forward and backward both use this.
 */
int64_t tb_chunk(const sp_opshape_t *s, int n)
{
	size_t one = tb_ws_bytes(s, 1), cap = cu_ws_cap();
	int64_t m = (int64_t)(cap / (one ? one : 1));
	if (m < 1)
		m = 1;
	return m < n ? m : n;
}

/*
 * C_ij = alpha op(A_ij) op(B_ij) + beta C_ij over samples i < ni and heads
 * j < nj, with X_ij = X + i*xi + j*xj (elements): strided-batched over the
 * larger of the two, looping over the smaller.
 */
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

/* What both directions of a block start from: tensor offsets, the bf16
 * shadow of the weights, the attention scale 1/sqrt(dh), the chunk size. */
const bf16 *tb_prepare(const sp_opshape_t *s, int n, const float *p, int64_t off[NT],
		       float *scale, int64_t *nc)
{
	tb_offsets(s, off);
	sp_component_t comp = layer_comp_of_shape(s);
	const bf16 *wb = cu_shadow(p, comp_layer_params(&comp));
	*scale = (float)(1.0 / sqrt((double)(s->hidden / s->heads)));
	*nc = tb_chunk(s, n);
	return wb;
}

} /* namespace */

/*
 * y = x_mid + gelu(LN2(x_mid) W1 + b1) W2 + b2,
 * x_mid = x + attn(LN1(x) Wqkv + bqkv) Wo + bo (layers.h).
 */
void cu_tblock_fwd(const sp_opshape_t *s, int n, const float *p, const float *x, float *y,
		   float *saved)
{
	int64_t h = s->hidden, f = s->ffn, sq = s->seq, a = s->heads, dh = h / a;
	int64_t per = op_saved_elems(s, 0), off[NT], nc = 0;
	if (n <= 0)
		return;
	float scale = 0;
	const bf16 *wb = tb_prepare(s, n, p, off, &scale, &nc);
	char *ws = cu_ws_get((size_t)(2 * nc * a * sq * sq) + 256);
	bf16 *pb = (bf16 *)ws;
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc, R = m * sq;
		tb_saved v = tb_layout(saved + c0 * per, m, s);
		const float *xc = x + c0 * sq * h;
		float *yc = y + c0 * sq * h;
		CUDA_CHECK(cudaMemcpyAsync(v.x, xc, sizeof(float) * (size_t)(R * h),
					   cudaMemcpyDeviceToDevice, cu_s()));
		k_ln_fwd_bf16(v.ln1, h, v.m1, v.r1, 1, v.x, h, p + off[LN1G], p + off[LN1B], R, h);
		k_fill_rows_bf16(v.qkv, 3 * h, p + off[BQKV], R, 3 * h);
		cu_gemm(false, false, R, 3 * h, h, 1.0f, v.ln1, BF, h, wb + off[WQKV], BF, 3 * h,
			1.0f, v.qkv, BF, 3 * h);
		/* S_ij = scale Q_ij K_ij^T into P [m, a, s, s] */
		gemm_grid(false, true, sq, sq, dh, scale, v.qkv, BF, 3 * h, sq * 3 * h, dh,
			  v.qkv + h, BF, 3 * h, sq * 3 * h, dh, 0.0f, v.p, F32, sq, a * sq * sq,
			  sq * sq, m, a);
		k_softmax_fwd(v.p, pb, m * a * sq, sq, s->causal);
		/* head outputs P_ij V_ij into cat [R, h] at column j dh */
		gemm_grid(false, false, sq, dh, sq, 1.0f, pb, BF, sq, a * sq * sq, sq * sq,
			  v.qkv + 2 * h, BF, 3 * h, sq * 3 * h, dh, 0.0f, v.cat, BF, h, sq * h, dh,
			  m, a);
		k_add_rows(v.xmid, v.x, p + off[BO], R, h);
		cu_gemm(false, false, R, h, h, 1.0f, v.cat, BF, h, wb + off[WO], BF, h, 1.0f,
			v.xmid, F32, h);
		k_ln_fwd_bf16(v.ln2, h, v.m2, v.r2, 1, v.xmid, h, p + off[LN2G], p + off[LN2B], R,
			      h);
		k_fill_rows(v.pre, f, p + off[B1], R, f);
		cu_gemm(false, false, R, f, h, 1.0f, v.ln2, BF, h, wb + off[W1], BF, f, 1.0f, v.pre,
			F32, f);
		k_gelu_fwd(v.act, v.pre, R * f);
		k_add_rows(yc, v.xmid, p + off[B2], R, h);
		cu_gemm(false, false, R, h, f, 1.0f, v.act, BF, f, wb + off[W2], BF, h, 1.0f, yc,
			F32, h);
	}
}

/*
 * Backward per chunk (layers.c's formulas; dy, dx, dp fp32):
 *   MLP:  dW2 += act^T dy; dact = dy W2^T; dpre = dact gelu'(pre);
 *         dW1 += ln2^T dpre; dln2 = dpre W1^T; dx_mid = dy + LN2'(dln2)
 *   attn: dWo += cat^T dx_mid; dcat = dx_mid Wo^T; per head
 *         dP = dO V^T; dV = P^T dO; dS = P (dP - rowsum(P dP)) / sqrt(d);
 *         dQ = dS K; dK = dS^T Q
 *         dWqkv += ln1^T dqkv; dln1 = dqkv Wqkv^T; dx += dx_mid + LN1'(dln1)
 */
void cu_tblock_bwd(const sp_opshape_t *s, int n, const float *p, const float *saved,
		   const float *dy, float *dx, float *dp)
{
	int64_t h = s->hidden, f = s->ffn, sq = s->seq, a = s->heads, dh = h / a;
	int64_t per = op_saved_elems(s, 0), off[NT], nc = 0;
	if (n <= 0)
		return;
	float scale = 0;
	const bf16 *wb = tb_prepare(s, n, p, off, &scale, &nc);
	char *ws = cu_ws_get(tb_ws_bytes(s, nc));
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc, R = m * sq;
		tb_saved v = tb_layout((float *)saved + c0 * per, m, s);
		const float *dyc = dy + c0 * sq * h;
		float *dxc = dx + c0 * sq * h;
		cu_carve w(ws, tb_ws_bytes(s, nc), 256);
		bf16 *dyb = w.take<bf16>(R * h);
		float *dact = w.take<float>(R * f);
		bf16 *dpreb = w.take<bf16>(R * f);
		float *dln = w.take<float>(R * h);
		float *dxm = w.take<float>(R * h);
		bf16 *dxmb = w.take<bf16>(R * h);
		bf16 *dcatb = w.take<bf16>(R * h);
		bf16 *dqkvb = w.take<bf16>(R * 3 * h);
		float *dP = w.take<float>(m * a * sq * sq);
		bf16 *pb = w.take<bf16>(m * a * sq * sq);
		if (w.overflow)
			cu_fatal(__FILE__, __LINE__, "transformer backward", "workspace too small");

		/* MLP */
		k_to_bf16(dyb, dyc, R * h);
		cu_gemm(true, false, f, h, R, 1.0f, v.act, BF, f, dyb, BF, h, 1.0f, dp + off[W2],
			F32, h);
		k_colsum(dp + off[B2], dyc, R, h, h);
		cu_gemm(false, true, R, f, h, 1.0f, dyb, BF, h, wb + off[W2], BF, h, 0.0f, dact,
			F32, f);
		k_gelu_bwd(dpreb, dact, v.pre, R * f);
		cu_gemm(true, false, h, f, R, 1.0f, v.ln2, BF, h, dpreb, BF, f, 1.0f, dp + off[W1],
			F32, f);
		k_colsum_bf16(dp + off[B1], dpreb, R, f, f);
		cu_gemm(false, true, R, h, f, 1.0f, dpreb, BF, f, wb + off[W1], BF, f, 0.0f, dln,
			F32, h);
		k_ln_bwd(dxm, h, 0, dyc, h, dln, h, v.xmid, h, v.m2, v.r2, 1, p + off[LN2G],
			 dp + off[LN2G], dp + off[LN2B], R, h);

		/* output projection */
		k_to_bf16(dxmb, dxm, R * h);
		cu_gemm(true, false, h, h, R, 1.0f, v.cat, BF, h, dxmb, BF, h, 1.0f, dp + off[WO],
			F32, h);
		k_colsum(dp + off[BO], dxm, R, h, h);
		cu_gemm(false, true, R, h, h, 1.0f, dxmb, BF, h, wb + off[WO], BF, h, 0.0f, dcatb,
			BF, h);

		/* attention, per (sample, head) */
		k_to_bf16(pb, v.p, m * a * sq * sq);
		gemm_grid(false, true, sq, sq, dh, 1.0f, dcatb, BF, h, sq * h, dh, v.qkv + 2 * h,
			  BF, 3 * h, sq * 3 * h, dh, 0.0f, dP, F32, sq, a * sq * sq, sq * sq, m, a);
		gemm_grid(true, false, sq, dh, sq, 1.0f, pb, BF, sq, a * sq * sq, sq * sq, dcatb,
			  BF, h, sq * h, dh, 0.0f, dqkvb + 2 * h, BF, 3 * h, sq * 3 * h, dh, m, a);
		k_softmax_bwd(pb, v.p, dP, m * a * sq, sq, scale); /* pb now holds dS */
		gemm_grid(false, false, sq, dh, sq, 1.0f, pb, BF, sq, a * sq * sq, sq * sq,
			  v.qkv + h, BF, 3 * h, sq * 3 * h, dh, 0.0f, dqkvb, BF, 3 * h, sq * 3 * h,
			  dh, m, a);
		gemm_grid(true, false, sq, dh, sq, 1.0f, pb, BF, sq, a * sq * sq, sq * sq, v.qkv,
			  BF, 3 * h, sq * 3 * h, dh, 0.0f, dqkvb + h, BF, 3 * h, sq * 3 * h, dh, m,
			  a);

		/* QKV projection and LN1 */
		cu_gemm(true, false, h, 3 * h, R, 1.0f, v.ln1, BF, h, dqkvb, BF, 3 * h, 1.0f,
			dp + off[WQKV], F32, 3 * h);
		k_colsum_bf16(dp + off[BQKV], dqkvb, R, 3 * h, 3 * h);
		cu_gemm(false, true, R, h, 3 * h, 1.0f, dqkvb, BF, 3 * h, wb + off[WQKV], BF, 3 * h,
			0.0f, dln, F32, h);
		k_ln_bwd(dxc, h, 1, dxm, h, dln, h, v.x, h, v.m1, v.r1, 1, p + off[LN1G],
			 dp + off[LN1G], dp + off[LN1B], R, h);
	}
}

/* ---- linear: y = x W + b; saved: x as bf16 ---- */

void cu_linear_fwd(const sp_opshape_t *s, int n, const float *p, const float *x, float *y,
		   float *saved)
{
	int64_t in = s->in, out = s->out, rows = (int64_t)n * s->seq;
	if (rows <= 0)
		return;
	const bf16 *wb = cu_shadow(p, in * out + out);
	bf16 *xb = (bf16 *)saved;
	k_to_bf16(xb, x, rows * in);
	k_fill_rows(y, out, p + in * out, rows, out);
	cu_gemm(false, false, rows, out, in, 1.0f, xb, BF, in, wb, BF, out, 1.0f, y, F32, out);
}

/* dW += x^T dy; db += sum dy; dx += dy W^T (rows chunked to the workspace cap) */
void cu_linear_bwd(const sp_opshape_t *s, int n, const float *p, const float *saved,
		   const float *dy, float *dx, float *dp)
{
	int64_t in = s->in, out = s->out, rows = (int64_t)n * s->seq;
	if (rows <= 0)
		return;
	const bf16 *wb = cu_shadow(p, in * out + out);
	const bf16 *xb = (const bf16 *)saved;
	int64_t rc = (int64_t)(cu_ws_cap() / (2 * (size_t)out));
	rc = rc < 1 ? 1 : (rc < rows ? rc : rows);
	bf16 *dyb = (bf16 *)cu_ws_get(2 * (size_t)(rc * out));
	for (int64_t r0 = 0; r0 < rows; r0 += rc) {
		int64_t m = rows - r0 < rc ? rows - r0 : rc;
		k_to_bf16(dyb, dy + r0 * out, m * out);
		cu_gemm(true, false, in, out, m, 1.0f, xb + r0 * in, BF, in, dyb, BF, out, 1.0f, dp,
			F32, out);
		if (dx)
			cu_gemm(false, true, m, in, out, 1.0f, dyb, BF, out, wb, BF, out, 1.0f,
				dx + r0 * in, F32, in);
	}
	k_colsum(dp + in * out, dy, rows, out, out);
}

/* ---- sources ---- */

/* y[i,t] = tok[tokens[i,t]] + pos[t] (fp32 gather from the masters) */
void cu_embedding_fwd(const sp_opshape_t *s, int n, const float *p, const int32_t *tokens,
		      float *y, float *saved)
{
	int64_t h = s->hidden;
	k_embed_fwd(y, saved, p, p + s->vocab * h, tokens, n, s->seq, h, s->vocab);
}

/* dtok[id] += dy (atomic scatter); dpos[t] += sum_i dy[i,t] */
void cu_embedding_bwd(const sp_opshape_t *s, int n, const float *saved, const float *dy,
		      float *dp)
{
	int64_t h = s->hidden, sq = s->seq;
	k_embed_bwd(dp, saved, dy, (int64_t)n * sq, h);
	k_colsum(dp + s->vocab * h, dy, n, sq * h, sq * h);
}

/* y[i,t] = feats[i,t] W + b + pos[t]; saved: feats as bf16 */
void cu_patch_fwd(const sp_opshape_t *s, int n, const float *p, const float *feats, float *y,
		  float *saved)
{
	int64_t h = s->hidden, sq = s->seq, in = s->in, rows = (int64_t)n * sq;
	if (rows <= 0)
		return;
	const bf16 *wb = cu_shadow(p, in * h);
	bf16 *fb = (bf16 *)saved;
	k_to_bf16(fb, feats, rows * in);
	k_bias_pos(y, p + in * h, p + in * h + h, n, sq, h);
	cu_gemm(false, false, rows, h, in, 1.0f, fb, BF, in, wb, BF, h, 1.0f, y, F32, h);
}

/* dW += feats^T dy; db += sum dy; dpos[t] += sum_i dy[i,t] */
void cu_patch_bwd(const sp_opshape_t *s, int n, const float *p, const float *saved,
		  const float *dy, float *dp)
{
	(void)p;
	int64_t h = s->hidden, sq = s->seq, in = s->in, rows = (int64_t)n * sq;
	if (rows <= 0)
		return;
	const bf16 *fb = (const bf16 *)saved;
	int64_t rc = (int64_t)(cu_ws_cap() / (2 * (size_t)h));
	rc = rc < 1 ? 1 : (rc < rows ? rc : rows);
	bf16 *dyb = (bf16 *)cu_ws_get(2 * (size_t)(rc * h));
	for (int64_t r0 = 0; r0 < rows; r0 += rc) {
		int64_t m = rows - r0 < rc ? rows - r0 : rc;
		k_to_bf16(dyb, dy + r0 * h, m * h);
		cu_gemm(true, false, in, h, m, 1.0f, fb + r0 * in, BF, in, dyb, BF, h, 1.0f, dp,
			F32, h);
	}
	k_colsum(dp + in * h, dy, rows, h, h);
	k_colsum(dp + in * h + h, dy, n, sq * h, sq * h);
}
