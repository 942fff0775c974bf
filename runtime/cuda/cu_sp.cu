/*
 * cu_sp.cu — the sequence-parallel transformer block on the GPU: the
 * algorithm of layers_sp.c (layers.h "With tp->sp"), step for step, with
 * the CUDA block's kernels and products (cu_layers.cu: bf16 operands, fp32
 * accumulation). The member's token rows come from sp_rows (shared with
 * the CPU); the hooks get device buffers, fp32, as the split block's
 * all-reduce does (the runtime's NCCL reduce-scatter and all-gather over
 * the slice's tensor-parallel communicator).
 *
 * Not chunked: one call runs all n samples at once (the collectives work
 * on the whole [n s, h] buffer), so its workspace is the forward's two
 * [n s, h] fp32 buffers, or the backward's two, its [R, h] and the
 * per-sample scratch of cu_layers.cu (tb_scratch) for all n samples.
 * Saved, a layout of ours inside op_saved_elems_sp(s, n, t, 1) floats per
 * sample (cu_layers.cu's tb_carve, bf16 where only a product reads a
 * tensor back, for all n samples at once):
 *   x fp32 [R,h]  ln1 bf16 [T,h]  qkv bf16 [T,3hl]  cat bf16 [T,hl]
 *   ln2 bf16 [T,h]  pre fp32 [T,fl]  act bf16 [T,fl]  P fp32 [n,al,s,s]
 *   mean1, rstd1, mean2, rstd2 fp32 [R], then xmid fp32 [R,h]
 * (T = n s; R = T/t, the member's tokens). The LayerNorms' outputs are
 * all-gathered in fp32 and kept as bf16.
 * Never run on a GPU yet: tools/gpu-check runs its reference test
 * (tests/gpu/test_gpu_layers.c) and a two-rank replay.
 */
#include "cu_internal.cuh"

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;
enum { LN1G, LN1B, WQKV, BQKV, WO, BO, LN2G, LN2B, W1, B1, W2, B2 };

/* tb_carve's tensors for all n samples, the member's R rows of x and the
 * statistics, then xmid [R,h]. */
tb_saved sp_layout(float *base, int n, const tb_dims &d, const sp_rows_t &r)
{
	size_t budget = sizeof(float) * (size_t)(n * d.sp.per);
	return cu_layout(base, budget, "the sequence-parallel layout does not fit op_saved_elems_sp",
			 [&](cu_carve &c) {
				 tb_saved v = tb_carve(c, d, n, r.R);
				 v.xmid = c.take<float>(r.R * d.sp.h);
				 return v;
			 });
}

int gather(const tb_dims &d, float *buf, int64_t n)
{
	return d.tp->allgather(d.tp->ctx, buf, n);
}

int scatter(const tb_dims &d, float *buf, int64_t n)
{
	return d.tp->reduce_scatter(d.tp->ctx, buf, n);
}

void copy_dev(float *dst, const float *src, int64_t n)
{
	if (n > 0)
		CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n,
					   cudaMemcpyDeviceToDevice, cu_s()));
}

/* out [R,h] = a + b + bias (b at row stride h) */
void add_rows3(float *out, const float *a, const float *b, const float *bias, int64_t R,
	       int64_t h)
{
	k_add_rows(out, a, bias, R, h);
	k_add_2d(out, h, b, h, R, h);
}

/*
 * A LayerNorm of every token into lnf [T,h] fp32 (the member's rows with
 * their saved statistics, from xs), then its bf16 copy into out: the other
 * members' rows from the whole input x when there is one (statistics into
 * the scratch st [2T]), else by an all-gather.
 */
int ln_all(const tb_dims &d, const sp_rows_t &r, const float *xs, const float *x, int whole,
	   const float *g, const float *b, float *mean, float *rstd, float *lnf, float *st,
	   bf16 *out)
{
	int64_t h = d.sp.h, T = r.T, R = r.R, o = r.o;
	k_ln_fwd_f32(lnf + o * h, h, mean, rstd, 1, xs, h, g, b, R, h);
	if (whole) {
		k_ln_fwd_f32(lnf, h, st, st + T, 1, x, h, g, b, o, h);
		k_ln_fwd_f32(lnf + (o + R) * h, h, st, st + T, 1, x + (o + R) * h, h, g, b,
			     T - o - R, h);
	} else {
		int rc = gather(d, lnf, T * h);
		if (rc < 0)
			return rc;
	}
	k_to_bf16(out, lnf, T * h);
	return 0;
}

} /* namespace */

int cu_tblock_sp_fwd(const tb_dims &d, int n, const float *x, float *y, float *saved)
{
	int64_t h = d.sp.h, sq = d.sp.s, hl = d.sp.hl, fl = d.sp.fl;
	sp_rows_t r = sp_rows(&d.sp, n, 0);
	int64_t T = r.T, R = r.R, o = r.o;
	const float *p = d.p;
	const bf16 *wb = d.wb;
	const int64_t *off = d.off;
	tb_saved v = sp_layout(saved, n, d, r);
	const float *xs = d.tp->whole_in ? x + o * h : x;
	float *ys = d.tp->whole_out ? y + o * h : y;
	int64_t pp = (int64_t)n * d.sp.al * sq * sq;
	size_t bytes = sizeof(float) * (size_t)(2 * T * h + 2 * T) + 2 * (size_t)pp + 4 * 256;
	cu_carve w(cu_ws_get(bytes), bytes, 256);
	float *lnf = w.take<float>(T * h), *part = w.take<float>(T * h), *st = w.take<float>(2 * T);
	bf16 *pb = w.take<bf16>(pp);
	if (w.overflow)
		cu_fatal(__FILE__, __LINE__, "sequence-parallel forward", "workspace too small");
	int rc;

	copy_dev(v.x, xs, R * h);
	if ((rc = ln_all(d, r, v.x, x, d.tp->whole_in, p + off[LN1G], p + off[LN1B], v.m1, v.r1,
			 lnf, st, v.ln1)) < 0)
		return rc;
	cu_affine_bf16(v.qkv, v.ln1, wb + off[WQKV], p + off[BQKV], T, h, 3 * hl);
	cu_attn_fwd(d.attn, n, v.qkv, v.qkv + hl, v.qkv + 2 * hl, v.p, pb, v.cat);
	cu_gemm(false, false, T, h, hl, 1.0f, v.cat, BF, hl, wb + off[WO], BF, h, 0.0f, part, F32,
		h);
	if ((rc = scatter(d, part, T * h)) < 0)
		return rc;
	add_rows3(v.xmid, xs, part + o * h, p + off[BO], R, h);

	if ((rc = ln_all(d, r, v.xmid, nullptr, 0, p + off[LN2G], p + off[LN2B], v.m2, v.r2, lnf,
			 st, v.ln2)) < 0)
		return rc;
	k_fill_rows(v.pre, fl, p + off[B1], T, fl);
	cu_gemm(false, false, T, fl, h, 1.0f, v.ln2, BF, h, wb + off[W1], BF, fl, 1.0f, v.pre, F32,
		fl);
	k_gelu_fwd(v.act, v.pre, T * fl);
	cu_gemm(false, false, T, h, fl, 1.0f, v.act, BF, fl, wb + off[W2], BF, h, 0.0f, part, F32,
		h);
	if ((rc = scatter(d, part, T * h)) < 0)
		return rc;
	add_rows3(ys, v.xmid, part + o * h, p + off[B2], R, h);
	return d.tp->whole_out ? gather(d, y, T * h) : 0;
}

/*
 * Backward, layers_sp.c's (tblock_sp_bwd) collectives and formulas:
 *   dyf = gather(dy); MLP weights from dyf; dln2 = scatter(dpre W1^T)
 *   dxm = dy + LN2'(dln2) (shard); dxmf = gather(dxm); Wo, attention,
 *   Wqkv; dln1 = scatter(dqkv Wqkv^T); dx += dxm + LN1'(dln1)
 * and the four LayerNorm gradients over the member's tokens: all-reduced
 * into dp, or into tp->ln_grads (summed on the whole_in all-gather of dx).
 */
int cu_tblock_sp_bwd(const tb_dims &d, int n, const float *saved, const float *dy, float *dx,
		     float *dp)
{
	int64_t h = d.sp.h, hl = d.sp.hl, fl = d.sp.fl;
	const rt_tp_t *tp = d.tp;
	sp_rows_t r = sp_rows(&d.sp, n, tp->ln_grads ? tp->ln_n : 0);
	int64_t T = r.T, R = r.R, o = r.o, t = d.sp.t;
	const float *p = d.p;
	const bf16 *wb = d.wb;
	const int64_t *off = d.off;
	tb_saved v = sp_layout((float *)saved, n, d, r);
	const float *dys = tp->whole_out ? dy + o * h : dy;
	size_t full = sizeof(float) * (size_t)(2 * T * h + R * h + 4 * h + t * r.blk) + 5 * 256;
	size_t chunk = tb_ws_bytes(d, n);
	char *ws = cu_ws_get(full + chunk);
	cu_carve fw(ws, full, 256);
	float *gat = fw.take<float>(T * h), *part = fw.take<float>(T * h);
	float *dxm = fw.take<float>(R * h), *lng = fw.take<float>(4 * h);
	float *blk = fw.take<float>(t * r.blk);
	cu_carve cw(ws + full, chunk, 256);
	tb_scratch s = tb_scratch_take(cw, d, n);
	if (fw.overflow || cw.overflow)
		cu_fatal(__FILE__, __LINE__, "sequence-parallel backward", "workspace too small");
	cu_zero(lng, 4 * h);
	int rc;

	const float *dyf = dy;
	if (!tp->whole_out) {
		copy_dev(gat + o * h, dy, R * h);
		if ((rc = gather(d, gat, T * h)) < 0)
			return rc;
		dyf = gat;
	}
	tb_lin_bwd(T, fl, h, v.act, dyf, s.dyb, wb + off[W2], dp + off[W2], dp + off[B2], s.dact,
		   F32);
	k_gelu_bwd(s.dpreb, s.dact, v.pre, T * fl);
	cu_lin_bwd_bf16(T, h, fl, v.ln2, s.dpreb, wb + off[W1], dp + off[W1], dp + off[B1], part,
			F32, 0.0f);
	if ((rc = scatter(d, part, T * h)) < 0)
		return rc;
	k_ln_bwd(dxm, h, 0, dys, h, part + o * h, h, v.xmid, h, v.m2, v.r2, 1, p + off[LN2G],
		 lng + 2 * h, lng + 3 * h, R, h);

	copy_dev(gat + o * h, dxm, R * h);
	if ((rc = gather(d, gat, T * h)) < 0)
		return rc;
	tb_lin_bwd(T, hl, h, v.cat, gat, s.dxmb, wb + off[WO], dp + off[WO], dp + off[BO], s.dcatb,
		   BF);
	cu_attn_bwd(d.attn, n, v.qkv, v.qkv + hl, v.qkv + 2 * hl, v.p, s.dcatb, s.dqkvb,
		    s.dqkvb + hl, s.dqkvb + 2 * hl, s.dP, s.pb);
	cu_lin_bwd_bf16(T, h, 3 * hl, v.ln1, s.dqkvb, wb + off[WQKV], dp + off[WQKV],
			dp + off[BQKV], part, F32, 0.0f);
	if ((rc = scatter(d, part, T * h)) < 0)
		return rc;

	float *acc = tp->ln_grads;
	if (tp->whole_in) {
		float *mine = gat + o * h;
		k_ln_bwd(mine, h, 0, dxm, h, part + o * h, h, v.x, h, v.m1, v.r1, 1, p + off[LN1G],
			 lng, lng + h, R, h);
		if (acc) {
			/* this layer's part, then every layer's summed on dx's gather:
			 * t blocks of [R h + ln_n] (sp_rows), the sums in member order */
			int64_t E = tp->ln_n;
			k_add_2d(acc + tp->ln_at, 4 * h, lng, 4 * h, 1, 4 * h);
			copy_dev(blk + r.o_blk, mine, R * h);
			copy_dev(blk + r.o_blk + R * h, acc, E);
			if ((rc = gather(d, blk, t * r.blk)) < 0)
				return rc;
			if (dx)
				k_add_2d(dx, R * h, blk, r.blk, t, R * h);
			cu_zero(acc, E);
			k_colsum(acc, blk + R * h, t, E, r.blk);
			return 0;
		}
		if ((rc = gather(d, gat, T * h)) < 0)
			return rc;
		if (dx)
			k_add_2d(dx, h, gat, h, T, h);
	} else {
		k_ln_bwd(dx, h, 1, dxm, h, part + o * h, h, v.x, h, v.m1, v.r1, 1, p + off[LN1G],
			 lng, lng + h, R, h);
	}
	if (acc) { /* the caller's, summed by the slice's first layer */
		k_add_2d(acc + tp->ln_at, 4 * h, lng, 4 * h, 1, 4 * h);
		return 0;
	}
	if ((rc = tp->allreduce(tp->ctx, lng, 4 * h)) < 0)
		return rc;
	static const int ln[4] = {LN1G, LN1B, LN2G, LN2B};
	for (int q = 0; q < 4; q++)
		k_add_2d(dp + off[ln[q]], h, lng + q * h, h, 1, h);
	return 0;
}
