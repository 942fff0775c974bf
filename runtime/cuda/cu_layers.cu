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
 *   transformer    xmid fp32 [n s, h] of all n samples first (the split
 *                  block all-reduces it in place, one call for all n),
 *                  then per chunk of samples (see tb_chunk), tensor-major
 *                  over the chunk's R = m s rows; a member of a t-way
 *                  split has hl = h/t, fl = f/t, al = a/t (unsplit: h, f, a):
 *                    x fp32 [R,h]     ln1 bf16 [R,h]   qkv bf16 [R,3hl]
 *                    cat bf16 [R,hl]  ln2 bf16 [R,h]
 *                    pre fp32 [R,fl]  act bf16 [R,fl]  P fp32 [m,al,s,s]
 *                    mean1, rstd1, mean2, rstd2 fp32 [R]
 *                  which with xmid is 14 R h + 6 R hl + 6 R fl + 4 m al s^2
 *                  + 16 R bytes of the 16 R h + 16 R hl + 8 R fl +
 *                  4 m al s^2 + 16 R the CPU layout takes
 *                  (op_saved_elems_tp).
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

/* ---- transformer block ---- */

/*
 * One member's view of a (possibly split) block (layers.h): its split
 * (tblock_split), the tensor offsets of its shard, the hook (NULL
 * unsplit), and what both directions start from (tb_begin): the bf16
 * shadow of its weights, the attention scale 1/sqrt(dh), the chunk size.
 */
struct tb_dims {
	tblock_split_t sp;
	int64_t off[NT];
	const rt_tp_t *tp;
	const bf16 *wb;
	float scale;
	int64_t nc;
};

/* Sums buf [n] over the group (a no-op unsplit). */
int tb_allreduce(const tb_dims &d, float *buf, int64_t n)
{
	return d.tp ? d.tp->allreduce(d.tp->ctx, buf, n) : 0;
}

struct tb_saved {
	float *x, *xmid, *pre, *p, *m1, *r1, *m2, *r2;
	bf16 *ln1, *qkv, *cat, *ln2, *act;
};

/*
 * The layout above for the chunk of m samples from sample c0 of n, the
 * chunk's part 16-byte aligned where its budget allows, else 4.
 */
tb_saved tb_layout(float *base, int64_t c0, int64_t m, int64_t n, const tb_dims &d)
{
	int64_t h = d.sp.h, hl = d.sp.hl, fl = d.sp.fl, sq = d.sp.s, R = m * sq, rest = d.sp.per - sq * h;
	size_t budget = sizeof(float) * (size_t)(m * rest);
	float *chunk = base + n * sq * h + c0 * rest;
	for (size_t align = 16;; align = 4) {
		cu_carve c(chunk, budget, align);
		tb_saved v;
		v.xmid = base + c0 * sq * h;
		v.x = c.take<float>(R * h);
		v.ln1 = c.take<bf16>(R * h);
		v.qkv = c.take<bf16>(R * 3 * hl);
		v.cat = c.take<bf16>(R * hl);
		v.ln2 = c.take<bf16>(R * h);
		v.pre = c.take<float>(R * fl);
		v.act = c.take<bf16>(R * fl);
		v.p = c.take<float>(m * d.sp.al * sq * sq);
		v.m1 = c.take<float>(R);
		v.r1 = c.take<float>(R);
		v.m2 = c.take<float>(R);
		v.r2 = c.take<float>(R);
		if (!c.overflow)
			return v;
		if (align == 4)
			cu_fatal(__FILE__, __LINE__, "laying out saved activations",
				 "the transformer layout does not fit op_saved_elems_tp");
	}
}

/*
 * Backward scratch bytes of a chunk of m samples, besides dln and dxm
 * (fp32 [., h] each, see cu_tblock_bwd; the forward needs less).
 */
size_t tb_ws_bytes(const tb_dims &d, int64_t m)
{
	int64_t R = m * d.sp.s, e = 6 * R * d.sp.h + 8 * R * d.sp.hl + 6 * R * d.sp.fl +
				   6 * m * d.sp.al * d.sp.s * d.sp.s;
	return (size_t)e + 16 * 256;
}

/*
 * Samples per chunk: as many as fit the workspace cap (at least one), with
 * dln and dxm counted per sample. The saved layout depends on it, so
 * forward and backward both use this.
 */
int64_t tb_chunk(const tb_dims &d, int n)
{
	size_t one = tb_ws_bytes(d, 1) + 8 * (size_t)(d.sp.s * d.sp.h), cap = cu_ws_cap();
	int64_t m = (int64_t)(cap / one);
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

/* Fills d for n samples on weights p: 0, or SP_EINPUT for a split the
 * shape does not allow (tblock_split). */
int tb_begin(tb_dims *d, const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p)
{
	int rc = tblock_split(&d->sp, s, tp);
	if (rc < 0)
		return rc;
	d->tp = d->sp.t > 1 ? tp : nullptr;
	for (int i = 0; i < NT; i++)
		d->off[i] = d->sp.tensors[i].offset;
	sp_component_t comp = layer_comp_of_shape(s);
	d->wb = cu_shadow(p, comp_layer_params_tp(&comp, d->sp.t));
	d->scale = (float)(1.0 / sqrt((double)d->sp.dh));
	d->nc = tb_chunk(*d, n);
	return 0;
}

/*
 * Attention of the member's al heads on one chunk: ln1 = LN1(x),
 * qkv = ln1 Wqkv + bqkv, P = softmax(scale Q K^T), cat = P V.
 */
void tb_attn_fwd(const tb_dims &d, const tb_saved &v, int64_t m, int causal, const float *p,
		 const bf16 *wb, float scale, bf16 *pb)
{
	int64_t h = d.sp.h, sq = d.sp.s, hl = d.sp.hl, dh = d.sp.dh, al = d.sp.al, R = m * sq;
	k_ln_fwd_bf16(v.ln1, h, v.m1, v.r1, 1, v.x, h, p + d.off[LN1G], p + d.off[LN1B], R, h);
	k_fill_rows_bf16(v.qkv, 3 * hl, p + d.off[BQKV], R, 3 * hl);
	cu_gemm(false, false, R, 3 * hl, h, 1.0f, v.ln1, BF, h, wb + d.off[WQKV], BF, 3 * hl,
		1.0f, v.qkv, BF, 3 * hl);
	/* S_ij = scale Q_ij K_ij^T into P [m, al, s, s] */
	gemm_grid(false, true, sq, sq, dh, scale, v.qkv, BF, 3 * hl, sq * 3 * hl, dh, v.qkv + hl,
		  BF, 3 * hl, sq * 3 * hl, dh, 0.0f, v.p, F32, sq, al * sq * sq, sq * sq, m, al);
	k_softmax_fwd(v.p, pb, m * al * sq, sq, causal);
	/* head outputs P_ij V_ij into cat [R, hl] at column j dh */
	gemm_grid(false, false, sq, dh, sq, 1.0f, pb, BF, sq, al * sq * sq, sq * sq,
		  v.qkv + 2 * hl, BF, 3 * hl, sq * 3 * hl, dh, 0.0f, v.cat, BF, hl, sq * hl, dh, m,
		  al);
}

/*
 * Backward of y = a W + b over R rows (a bf16 [R,k], W [k,o], dy fp32
 * [R,o], dyb its bf16 copy, scratch): dW += a^T dy; db += colsum dy;
 * da = dy W^T (type dt, [R,k]).
 */
void tb_lin_bwd(int64_t R, int64_t k, int64_t o, const bf16 *a, const float *dy, bf16 *dyb,
		const bf16 *w, float *dw, float *db, void *da, cudaDataType_t dt)
{
	k_to_bf16(dyb, dy, R * o);
	cu_gemm(true, false, k, o, R, 1.0f, a, BF, k, dyb, BF, o, 1.0f, dw, F32, o);
	k_colsum(db, dy, R, o, o);
	cu_gemm(false, true, R, k, o, 1.0f, dyb, BF, o, w, BF, o, 0.0f, da, dt, k);
}

} /* namespace */

/*
 * y = x_mid + gelu(LN2(x_mid) W1 + b1) W2 + b2,
 * x_mid = x + attn(LN1(x) Wqkv + bqkv) Wo + bo (layers.h). Split, the two
 * partial products sum over the group (all n samples, one all-reduce each:
 * x_mid in place in `saved`, then y); rank 0 alone starts them from the
 * residual and bias. The hook gets device buffers; it is called with every
 * earlier kernel enqueued on the compute stream (cu_s()) and must return
 * with the sum visible to later kernels on it.
 */
int cu_tblock_fwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		  const float *x, float *y, float *saved)
{
	tb_dims d;
	int rc = tb_begin(&d, s, tp, n, p);
	if (rc < 0)
		return rc;
	int64_t h = d.sp.h, fl = d.sp.fl, sq = d.sp.s, nc = d.nc;
	float scale = d.scale, beta = d.sp.rank == 0 ? 1.0f : 0.0f;
	const bf16 *wb = d.wb;
	bf16 *pb = (bf16 *)cu_ws_get((size_t)(2 * nc * d.sp.al * sq * sq) + 256);
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc, R = m * sq;
		tb_saved v = tb_layout(saved, c0, m, n, d);
		CUDA_CHECK(cudaMemcpyAsync(v.x, x + c0 * sq * h, sizeof(float) * (size_t)(R * h),
					   cudaMemcpyDeviceToDevice, cu_s()));
		tb_attn_fwd(d, v, m, s->causal, p, wb, scale, pb);
		if (d.sp.rank == 0)
			k_add_rows(v.xmid, v.x, p + d.off[BO], R, h);
		cu_gemm(false, false, R, h, d.sp.hl, 1.0f, v.cat, BF, d.sp.hl, wb + d.off[WO], BF, h,
			beta, v.xmid, F32, h);
	}
	if ((rc = tb_allreduce(d, saved, (int64_t)n * sq * h)) < 0)
		return rc;
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc, R = m * sq;
		tb_saved v = tb_layout(saved, c0, m, n, d);
		float *yc = y + c0 * sq * h;
		k_ln_fwd_bf16(v.ln2, h, v.m2, v.r2, 1, v.xmid, h, p + d.off[LN2G],
			      p + d.off[LN2B], R, h);
		k_fill_rows(v.pre, fl, p + d.off[B1], R, fl);
		cu_gemm(false, false, R, fl, h, 1.0f, v.ln2, BF, h, wb + d.off[W1], BF, fl, 1.0f,
			v.pre, F32, fl);
		k_gelu_fwd(v.act, v.pre, R * fl);
		if (d.sp.rank == 0)
			k_add_rows(yc, v.xmid, p + d.off[B2], R, h);
		cu_gemm(false, false, R, h, fl, 1.0f, v.act, BF, fl, wb + d.off[W2], BF, h, beta,
			yc, F32, h);
	}
	return tb_allreduce(d, y, (int64_t)n * sq * h);
}

/*
 * Backward (layers.c's formulas and passes; dy, dx, dp fp32), each pass
 * over every chunk:
 *   MLP:  dW2 += act^T dy; dact = dy W2^T; dpre = dact gelu'(pre);
 *         dW1 += ln2^T dpre; dln2 = dpre W1^T             (all-reduce)
 *   attn: dx_mid = dy + LN2'(dln2); dWo += cat^T dx_mid; dcat = dx_mid Wo^T;
 *         per head dP = dO V^T; dV = P^T dO; dS = P (dP - rowsum(P dP)) / sqrt(d);
 *         dQ = dS K; dK = dS^T Q; dWqkv += ln1^T dqkv; dln1 = dqkv Wqkv^T
 *                                                          (all-reduce)
 *   LN1:  dx += dx_mid + LN1'(dln1)
 * dln and dx_mid are fp32 [n s, h] when split (the all-reduce sums all n
 * samples at once: the workspace exceeds the cap by 8 (n - chunk) s h
 * bytes), [chunk s, h] reused per chunk unsplit.
 */
int cu_tblock_bwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		  const float *saved, const float *dy, float *dx, float *dp)
{
	tb_dims d;
	int rc = tb_begin(&d, s, tp, n, p);
	if (rc < 0)
		return rc;
	int64_t h = d.sp.h, fl = d.sp.fl, hl = d.sp.hl, sq = d.sp.s, al = d.sp.al;
	int64_t dh = d.sp.dh, nc = d.nc;
	const int64_t *off = d.off;
	float scale = d.scale;
	const bf16 *wb = d.wb;
	int64_t nf = d.tp ? n : nc; /* samples dln and dxm hold */
	size_t full = 2 * sizeof(float) * (size_t)(nf * sq * h) + 256;
	size_t chunk_bytes = tb_ws_bytes(d, nc);
	char *ws = cu_ws_get(full + chunk_bytes);
	cu_carve fw(ws, full, 256);
	float *dln_all = fw.take<float>(nf * sq * h), *dxm_all = fw.take<float>(nf * sq * h);
	if (fw.overflow)
		cu_fatal(__FILE__, __LINE__, "transformer backward", "workspace too small");
	for (int pass = 0; pass < 3; pass++) {
		for (int64_t c0 = 0; c0 < n; c0 += nc) {
			int64_t m = n - c0 < nc ? n - c0 : nc, R = m * sq;
			tb_saved v = tb_layout((float *)saved, c0, m, n, d);
			const float *dyc = dy + c0 * sq * h;
			float *dxc = dx + c0 * sq * h;
			int64_t at = (d.tp ? c0 : 0) * sq * h;
			float *dln = dln_all + at, *dxm = dxm_all + at;
			cu_carve w(ws + full, chunk_bytes, 256);
			bf16 *dyb = w.take<bf16>(R * h);
			float *dact = w.take<float>(R * fl);
			bf16 *dpreb = w.take<bf16>(R * fl);
			bf16 *dxmb = w.take<bf16>(R * h);
			bf16 *dcatb = w.take<bf16>(R * hl);
			bf16 *dqkvb = w.take<bf16>(R * 3 * hl);
			float *dP = w.take<float>(m * al * sq * sq);
			bf16 *pb = w.take<bf16>(m * al * sq * sq);
			if (w.overflow)
				cu_fatal(__FILE__, __LINE__, "transformer backward",
					 "workspace too small");
			if (pass == 0 || !d.tp) {
				/* MLP */
				tb_lin_bwd(R, fl, h, v.act, dyc, dyb, wb + off[W2], dp + off[W2],
					   dp + off[B2], dact, F32);
				k_gelu_bwd(dpreb, dact, v.pre, R * fl);
				cu_gemm(true, false, h, fl, R, 1.0f, v.ln2, BF, h, dpreb, BF, fl,
					1.0f, dp + off[W1], F32, fl);
				k_colsum_bf16(dp + off[B1], dpreb, R, fl, fl);
				cu_gemm(false, true, R, h, fl, 1.0f, dpreb, BF, fl, wb + off[W1],
					BF, fl, 0.0f, dln, F32, h);
			}
			if (pass == 1 || !d.tp) {
				k_ln_bwd(dxm, h, 0, dyc, h, dln, h, v.xmid, h, v.m2, v.r2, 1,
					 p + off[LN2G], dp + off[LN2G], dp + off[LN2B], R, h);
				/* output projection */
				tb_lin_bwd(R, hl, h, v.cat, dxm, dxmb, wb + off[WO], dp + off[WO],
					   dp + off[BO], dcatb, BF);
				/* attention, per (sample, head) */
				k_to_bf16(pb, v.p, m * al * sq * sq);
				gemm_grid(false, true, sq, sq, dh, 1.0f, dcatb, BF, hl, sq * hl, dh,
					  v.qkv + 2 * hl, BF, 3 * hl, sq * 3 * hl, dh, 0.0f, dP,
					  F32, sq, al * sq * sq, sq * sq, m, al);
				gemm_grid(true, false, sq, dh, sq, 1.0f, pb, BF, sq, al * sq * sq,
					  sq * sq, dcatb, BF, hl, sq * hl, dh, 0.0f, dqkvb + 2 * hl,
					  BF, 3 * hl, sq * 3 * hl, dh, m, al);
				k_softmax_bwd(pb, v.p, dP, m * al * sq, sq, scale); /* pb: dS */
				gemm_grid(false, false, sq, dh, sq, 1.0f, pb, BF, sq, al * sq * sq,
					  sq * sq, v.qkv + hl, BF, 3 * hl, sq * 3 * hl, dh, 0.0f,
					  dqkvb, BF, 3 * hl, sq * 3 * hl, dh, m, al);
				gemm_grid(true, false, sq, dh, sq, 1.0f, pb, BF, sq, al * sq * sq,
					  sq * sq, v.qkv, BF, 3 * hl, sq * 3 * hl, dh, 0.0f,
					  dqkvb + hl, BF, 3 * hl, sq * 3 * hl, dh, m, al);
				/* QKV projection */
				cu_gemm(true, false, h, 3 * hl, R, 1.0f, v.ln1, BF, h, dqkvb, BF,
					3 * hl, 1.0f, dp + off[WQKV], F32, 3 * hl);
				k_colsum_bf16(dp + off[BQKV], dqkvb, R, 3 * hl, 3 * hl);
				cu_gemm(false, true, R, h, 3 * hl, 1.0f, dqkvb, BF, 3 * hl,
					wb + off[WQKV], BF, 3 * hl, 0.0f, dln, F32, h);
			}
			if (pass == 2 || !d.tp)
				k_ln_bwd(dxc, h, 1, dxm, h, dln, h, v.x, h, v.m1, v.r1, 1,
					 p + off[LN1G], dp + off[LN1G], dp + off[LN1B], R, h);
		}
		/* unsplit, the first pass did all three per chunk */
		if (!d.tp)
			return 0;
		if (pass < 2 && (rc = tb_allreduce(d, dln_all, (int64_t)n * sq * h)) < 0)
			return rc;
	}
	return 0;
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
