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
 * Attention is cu_attn.cu's (not fused: scores and probabilities are
 * materialised per (sample, head) as the CPU does). The block's steps
 * (cu_internal.cuh) are shared with the decoder block, cu_xattn.cu.
 */
#include "cu_internal.cuh"

#include <math.h>
#include <string.h>

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;

/* Tensor offsets (floats) of one transformer layer, layer_tensors order. */
enum { LN1G, LN1B, WQKV, BQKV, WO, BO, LN2G, LN2B, W1, B1, W2, B2, NT };
static_assert(NT == TB_NT, "the transformer's tensors");

/* Sums buf [n] over the group (a no-op unsplit). */
int tb_allreduce(const tb_dims &d, float *buf, int64_t n)
{
	return d.tp ? d.tp->allreduce(d.tp->ctx, buf, n) : 0;
}

/*
 * Samples per chunk: as many as fit the workspace cap (at least one), with
 * dln and dxm counted per sample. The saved layout depends on it, so
 * forward and backward both use this.
 */
int64_t tb_chunk(const tb_dims &d, int n)
{
	return cu_chunk_samples(tb_ws_bytes(d, 1) + 8 * (size_t)(d.sp.s * d.sp.h), n);
}

} /* namespace */

/* ---- transformer block steps ---- */

int64_t cu_chunk_samples(size_t per_sample, int n)
{
	int64_t m = (int64_t)(cu_ws_cap() / (per_sample ? per_sample : 1));
	if (m < 1)
		m = 1;
	return m < n ? m : n;
}

/*
 * The layout above for the chunk of m samples from sample c0 of n, the
 * chunk's part 16-byte aligned where its budget allows, else 4.
 */
tb_saved tb_carve(cu_carve &c, const tb_dims &d, int64_t m, int64_t own)
{
	int64_t h = d.sp.h, hl = d.sp.hl, fl = d.sp.fl, sq = d.sp.s, R = m * sq;
	tb_saved v;
	v.xmid = nullptr;
	v.x = c.take<float>(own * h);
	v.ln1 = c.take<bf16>(R * h);
	v.qkv = c.take<bf16>(R * 3 * hl);
	v.cat = c.take<bf16>(R * hl);
	v.ln2 = c.take<bf16>(R * h);
	v.pre = c.take<float>(R * fl);
	v.act = c.take<bf16>(R * fl);
	v.p = c.take<float>(m * d.sp.al * sq * sq);
	v.m1 = c.take<float>(own);
	v.r1 = c.take<float>(own);
	v.m2 = c.take<float>(own);
	v.r2 = c.take<float>(own);
	return v;
}

tb_saved tb_layout(float *base, int64_t c0, int64_t m, int64_t n, const tb_dims &d)
{
	int64_t h = d.sp.h, sq = d.sp.s, rest = d.sp.per - sq * h;
	size_t budget = sizeof(float) * (size_t)(m * rest);
	float *chunk = base + n * sq * h + c0 * rest;
	return cu_layout(chunk, budget, "the transformer layout does not fit op_saved_elems_tp",
			 [&](cu_carve &c) {
				 tb_saved v = tb_carve(c, d, m, m * sq);
				 v.xmid = base + c0 * sq * h;
				 return v;
			 });
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

tb_scratch tb_scratch_take(cu_carve &w, const tb_dims &d, int64_t m)
{
	int64_t R = m * d.sp.s, h = d.sp.h, hl = d.sp.hl, fl = d.sp.fl;
	int64_t pp = m * d.sp.al * d.sp.s * d.sp.s;
	tb_scratch t;
	t.dyb = w.take<bf16>(R * h);
	t.dact = w.take<float>(R * fl);
	t.dpreb = w.take<bf16>(R * fl);
	t.dxmb = w.take<bf16>(R * h);
	t.dcatb = w.take<bf16>(R * hl);
	t.dqkvb = w.take<bf16>(R * 3 * hl);
	t.dP = w.take<float>(pp);
	t.pb = w.take<bf16>(pp);
	return t;
}

int tb_begin(tb_dims *d, const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p)
{
	int rc = tblock_split(&d->sp, s, tp);
	if (rc < 0)
		return rc;
	d->tp = d->sp.t > 1 ? tp : nullptr;
	for (int i = 0; i < NT; i++)
		d->off[i] = d->sp.tensors[i].offset;
	sp_component_t comp = layer_comp_of_shape(s);
	d->p = p;
	d->wb = cu_shadow(p, comp_layer_params_tp(&comp, d->sp.t));
	int64_t hl = d->sp.hl;
	/* the member's heads: Q, K, V at columns 0, hl, 2hl of qkv [., 3hl] */
	d->attn = cu_attn{d->sp.al, d->sp.dh, d->sp.s, d->sp.s, 3 * hl, 3 * hl, 3 * hl, hl,
			  s->causal, (float)(1.0 / sqrt((double)d->sp.dh))};
	d->nc = d->sp.sp ? n : tb_chunk(*d, n); /* cu_sp.cu does not chunk */
	return 0;
}

void cu_affine_bf16(bf16 *y, const bf16 *a, const bf16 *w, const float *b, int64_t R,
		    int64_t k, int64_t cols)
{
	k_fill_rows_bf16(y, cols, b, R, cols);
	cu_gemm(false, false, R, cols, k, 1.0f, a, BF, k, w, BF, cols, 1.0f, y, BF, cols);
}

void tb_lin_bwd(int64_t R, int64_t k, int64_t o, const bf16 *a, const float *dy, bf16 *dyb,
		const bf16 *w, float *dw, float *db, void *da, cudaDataType_t dt)
{
	k_to_bf16(dyb, dy, R * o);
	cu_gemm(true, false, k, o, R, 1.0f, a, BF, k, dyb, BF, o, 1.0f, dw, F32, o);
	k_colsum(db, dy, R, o, o);
	cu_gemm(false, true, R, k, o, 1.0f, dyb, BF, o, w, BF, o, 0.0f, da, dt, k);
}

void cu_lin_bwd_bf16(int64_t R, int64_t k, int64_t o, const bf16 *a, const bf16 *dyb,
		     const bf16 *w, float *dw, float *db, void *da, cudaDataType_t dt, float beta)
{
	cu_gemm(true, false, k, o, R, 1.0f, a, BF, k, dyb, BF, o, 1.0f, dw, F32, o);
	k_colsum_bf16(db, dyb, R, o, o);
	cu_gemm(false, true, R, k, o, 1.0f, dyb, BF, o, w, BF, o, beta, da, dt, k);
}

/*
 * Attention of the member's al heads on one chunk: ln1 = LN1(x),
 * qkv = ln1 Wqkv + bqkv, P = softmax(scale Q K^T), cat = P V; then the
 * output projection into xmid (rank 0 alone starts it from x + bo).
 */
void tb_self_fwd(const tb_dims &d, const tb_saved &v, int64_t m, const float *x, bf16 *pb)
{
	int64_t h = d.sp.h, hl = d.sp.hl, R = m * d.sp.s;
	const float *p = d.p;
	const bf16 *wb = d.wb;
	CUDA_CHECK(cudaMemcpyAsync(v.x, x, sizeof(float) * (size_t)(R * h),
				   cudaMemcpyDeviceToDevice, cu_s()));
	k_ln_fwd_bf16(v.ln1, h, v.m1, v.r1, 1, v.x, h, p + d.off[LN1G], p + d.off[LN1B], R, h);
	cu_affine_bf16(v.qkv, v.ln1, wb + d.off[WQKV], p + d.off[BQKV], R, h, 3 * hl);
	cu_attn_fwd(d.attn, m, v.qkv, v.qkv + hl, v.qkv + 2 * hl, v.p, pb, v.cat);
	if (d.sp.rank == 0)
		k_add_rows(v.xmid, v.x, p + d.off[BO], R, h);
	cu_gemm(false, false, R, h, hl, 1.0f, v.cat, BF, hl, wb + d.off[WO], BF, h,
		d.sp.rank == 0 ? 1.0f : 0.0f, v.xmid, F32, h);
}

void tb_mlp_fwd(const tb_dims &d, const tb_saved &v, int64_t m, float *y)
{
	int64_t h = d.sp.h, fl = d.sp.fl, R = m * d.sp.s;
	const float *p = d.p;
	const bf16 *wb = d.wb;
	k_ln_fwd_bf16(v.ln2, h, v.m2, v.r2, 1, v.xmid, h, p + d.off[LN2G], p + d.off[LN2B], R, h);
	k_fill_rows(v.pre, fl, p + d.off[B1], R, fl);
	cu_gemm(false, false, R, fl, h, 1.0f, v.ln2, BF, h, wb + d.off[W1], BF, fl, 1.0f, v.pre,
		F32, fl);
	k_gelu_fwd(v.act, v.pre, R * fl);
	if (d.sp.rank == 0)
		k_add_rows(y, v.xmid, p + d.off[B2], R, h);
	cu_gemm(false, false, R, h, fl, 1.0f, v.act, BF, fl, wb + d.off[W2], BF, h,
		d.sp.rank == 0 ? 1.0f : 0.0f, y, F32, h);
}

/* dW2 += act^T dy; dact = dy W2^T; dpre = dact gelu'(pre); dW1 += ln2^T dpre;
 * dln = dpre W1^T */
void tb_mlp_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dy,
		const tb_scratch &w, float *dln)
{
	int64_t h = d.sp.h, fl = d.sp.fl, R = m * d.sp.s;
	const int64_t *off = d.off;
	tb_lin_bwd(R, fl, h, v.act, dy, w.dyb, d.wb + off[W2], dp + off[W2], dp + off[B2], w.dact,
		   F32);
	k_gelu_bwd(w.dpreb, w.dact, v.pre, R * fl);
	cu_lin_bwd_bf16(R, h, fl, v.ln2, w.dpreb, d.wb + off[W1], dp + off[W1], dp + off[B1], dln,
			F32, 0.0f);
}

void tb_ln2_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dy,
		const float *dln, float *dxm)
{
	int64_t h = d.sp.h;
	k_ln_bwd(dxm, h, 0, dy, h, dln, h, v.xmid, h, v.m2, v.r2, 1, d.p + d.off[LN2G],
		 dp + d.off[LN2G], dp + d.off[LN2B], m * d.sp.s, h);
}

/* dWo += cat^T dxm; dcat = dxm Wo^T; attention backward to dqkv;
 * dWqkv += ln1^T dqkv; dln = dqkv Wqkv^T */
void tb_attn_out_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp,
		     const float *dxm, const tb_scratch &w, float *dln)
{
	int64_t h = d.sp.h, hl = d.sp.hl, R = m * d.sp.s;
	const int64_t *off = d.off;
	tb_lin_bwd(R, hl, h, v.cat, dxm, w.dxmb, d.wb + off[WO], dp + off[WO], dp + off[BO],
		   w.dcatb, BF);
	cu_attn_bwd(d.attn, m, v.qkv, v.qkv + hl, v.qkv + 2 * hl, v.p, w.dcatb, w.dqkvb,
		    w.dqkvb + hl, w.dqkvb + 2 * hl, w.dP, w.pb);
	cu_lin_bwd_bf16(R, h, 3 * hl, v.ln1, w.dqkvb, d.wb + off[WQKV], dp + off[WQKV],
			dp + off[BQKV], dln, F32, 0.0f);
}

void tb_ln1_bwd(const tb_dims &d, const tb_saved &v, int64_t m, float *dp, const float *dxm,
		const float *dln, float *dx)
{
	int64_t h = d.sp.h;
	k_ln_bwd(dx, h, 1, dxm, h, dln, h, v.x, h, v.m1, v.r1, 1, d.p + d.off[LN1G],
		 dp + d.off[LN1G], dp + d.off[LN1B], m * d.sp.s, h);
}

/* ---- transformer block ---- */

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
	if (d.sp.sp)
		return cu_tblock_sp_fwd(d, n, x, y, saved);
	int64_t sq = d.sp.s, sh = sq * d.sp.h, nc = d.nc;
	bf16 *pb = (bf16 *)cu_ws_get((size_t)(2 * nc * d.sp.al * sq * sq) + 256);
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc;
		tb_self_fwd(d, tb_layout(saved, c0, m, n, d), m, x + c0 * sh, pb);
	}
	if ((rc = tb_allreduce(d, saved, (int64_t)n * sh)) < 0)
		return rc;
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t m = n - c0 < nc ? n - c0 : nc;
		tb_mlp_fwd(d, tb_layout(saved, c0, m, n, d), m, y + c0 * sh);
	}
	return tb_allreduce(d, y, (int64_t)n * sh);
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
	if (d.sp.sp)
		return cu_tblock_sp_bwd(d, n, saved, dy, dx, dp);
	int64_t sh = d.sp.s * d.sp.h, nc = d.nc;
	int64_t nf = d.tp ? n : nc; /* samples dln and dxm hold */
	size_t full = 2 * sizeof(float) * (size_t)(nf * sh) + 256;
	size_t chunk_bytes = tb_ws_bytes(d, nc);
	char *ws = cu_ws_get(full + chunk_bytes);
	cu_carve fw(ws, full, 256);
	float *dln_all = fw.take<float>(nf * sh), *dxm_all = fw.take<float>(nf * sh);
	if (fw.overflow)
		cu_fatal(__FILE__, __LINE__, "transformer backward", "workspace too small");
	for (int pass = 0; pass < 3; pass++) {
		for (int64_t c0 = 0; c0 < n; c0 += nc) {
			int64_t m = n - c0 < nc ? n - c0 : nc;
			tb_saved v = tb_layout((float *)saved, c0, m, n, d);
			const float *dyc = dy + c0 * sh;
			int64_t at = (d.tp ? c0 : 0) * sh;
			float *dln = dln_all + at, *dxm = dxm_all + at;
			cu_carve w(ws + full, chunk_bytes, 256);
			tb_scratch t = tb_scratch_take(w, d, m);
			if (w.overflow)
				cu_fatal(__FILE__, __LINE__, "transformer backward",
					 "workspace too small");
			if (pass == 0 || !d.tp)
				tb_mlp_bwd(d, v, m, dp, dyc, t, dln);
			if (pass == 1 || !d.tp) {
				tb_ln2_bwd(d, v, m, dp, dyc, dln, dxm);
				tb_attn_out_bwd(d, v, m, dp, dxm, t, dln);
			}
			if (pass == 2 || !d.tp)
				tb_ln1_bwd(d, v, m, dp, dxm, dln, dx + c0 * sh);
		}
		/* unsplit, the first pass did all three per chunk */
		if (!d.tp)
			return 0;
		if (pass < 2 && (rc = tb_allreduce(d, dln_all, (int64_t)n * sh)) < 0)
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

/* A member of a vocabulary-parallel split (layers.h embedding_fwd_tp): its
 * rows' lookups, member 0 adds the positions, one all-reduce of y. */
int cu_embedding_fwd_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
			const int32_t *tokens, float *y, float *saved)
{
	vocab_split_t v;
	if (vocab_split(&v, s, COMP_EMBEDDING, tp))
		return SP_EINPUT;
	if (v.t == 1) {
		cu_embedding_fwd(s, n, p, tokens, y, saved);
		return 0;
	}
	int64_t h = s->hidden;
	k_embed_fwd_tp(y, saved, p, p + v.vm * h, tokens, n, s->seq, h, s->vocab, v.v0, v.vl,
		       v.rank == 0);
	return tp->allreduce(tp->ctx, y, (int64_t)n * s->seq * h);
}

/* dy into its own rows (atomic scatter) and into the whole position table
 * (the CPU layer sums its share and all-gathers: layers_vocab.c says why
 * this one does not) */
int cu_embedding_bwd_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *saved,
			const float *dy, float *dp)
{
	vocab_split_t v;
	if (vocab_split(&v, s, COMP_EMBEDDING, tp))
		return SP_EINPUT;
	if (v.t == 1) {
		cu_embedding_bwd(s, n, saved, dy, dp);
		return 0;
	}
	int64_t h = s->hidden, sq = s->seq;
	k_embed_bwd_tp(dp, saved, dy, (int64_t)n * sq, h, v.v0, v.vl);
	k_colsum(dp + v.vm * h, dy, n, sq * h, sq * h);
	return 0;
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
