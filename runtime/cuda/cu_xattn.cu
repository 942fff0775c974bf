/*
 * cu_xattn.cu — the cross-attention decoder block on the GPU (layers.h
 * semantics; the CPU reference is layers_xattn.c): pre-LN self-attention
 * and the MLP are the transformer block's steps (cu_layers.cu), between
 * them the cross-attention of the decoder's tokens to a memory [m, W]
 * (attention: cu_attn.cu), with a residual after each; the backward adds
 * into dx, the memory's gradient and the parameter gradients. Products
 * are cuBLAS with bf16 operands and fp32 accumulation, like the block's.
 *
 * Not split (tp with t != 1 is refused, as on the CPU: xblock_split).
 *
 * `saved`: op_saved_elems floats per sample, as the interpreter sizes it,
 * in our own layout (a function of saved, shape and n only, like the
 * block's; m is the memory's tokens, M = c m its rows in a chunk of c
 * samples, R = c s):
 *   first n self.per floats: the transformer block's layout (cu_layers.cu)
 *     of the self-attention and the MLP, its ln2/pre/act those of the MLP
 *     on x_c;
 *   then per chunk (samples c0 .. c0+c at c0 (per - self.per) floats):
 *     lnc bf16 [R,h]   q bf16 [R,h]   cat bf16 [R,h]   x_c fp32 [R,h]
 *     kv bf16 [M,2h] (each row K then V)   P fp32 [c,a,s,m]
 *     lnc_mean, lnc_rstd fp32 [R]
 *   which is 10 R h + 4 M h + 4 c a s m + 8 R bytes of the 16 R h + 8 M h
 *   + 4 c a s m + 8 R the CPU's cross part takes.
 * Workspace (cu_ws_get, chunked to the cap with the block's chunk rule):
 * forward the bf16 probabilities of both attentions and the memory as
 * bf16 [M,W]; backward the block's scratch (tb_ws_bytes) plus xb_ws_bytes.
 */
#include "cu_internal.cuh"

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;

/* The cross-attention's tensors, after the block's TB_NT (layer_tensors). */
enum { LNCG, LNCB, WQ, BQ, WKV, BKV, WOC, BOC, NX };

/*
 * The decoder's view: the block's (tb, unsplit, its chunk size nc set for
 * both workspaces here), the memory's tokens m and width W, the cross
 * part's floats per sample, its tensor offsets and its attention.
 */
struct xb_dims {
	tb_dims tb;
	int64_t m, W, xper;
	int64_t off[NX];
	cu_attn attn;
};

struct xb_saved {
	bf16 *lnc, *q, *cat, *kv;
	float *xc, *p, *mc, *rc;
};

/* Backward scratch of the cross-attention (a chunk's), besides the block's. */
struct xb_scratch {
	float *dln, *dxc, *dxm, *dP; /* dln also holds dlnc */
	bf16 *dq, *dkv, *pb, *memb;
};

/*
 * Backward bytes of a chunk of c samples besides tb_ws_bytes: dln, dxc,
 * dxm fp32 [R,h]; dP fp32 and pb bf16 [c,a,s,m]; dq bf16 [R,h]; dkv bf16
 * [M,2h]; the memory as bf16 [M,W]; alignment.
 */
size_t xb_ws_bytes(const xb_dims &d, int64_t c)
{
	int64_t R = c * d.tb.sp.s, M = c * d.m, h = d.tb.sp.h;
	int64_t e = 14 * R * h + 6 * c * d.attn.heads * d.tb.sp.s * d.m + 4 * M * h + 2 * M * d.W;
	return (size_t)e + 8 * 256;
}

xb_scratch xb_scratch_take(cu_carve &w, const xb_dims &d, int64_t c)
{
	int64_t R = c * d.tb.sp.s, M = c * d.m, h = d.tb.sp.h;
	int64_t pp = c * d.attn.heads * d.tb.sp.s * d.m;
	xb_scratch x;
	x.dln = w.take<float>(R * h);
	x.dxc = w.take<float>(R * h);
	x.dxm = w.take<float>(R * h);
	x.dP = w.take<float>(pp);
	x.pb = w.take<bf16>(pp);
	x.dq = w.take<bf16>(R * h);
	x.dkv = w.take<bf16>(M * 2 * h);
	x.memb = w.take<bf16>(M * d.W);
	return x;
}

/*
 * Fills d for n samples: 0, or SP_EINPUT for what the CPU block refuses
 * (xblock_split). The chunk size counts both backward scratches per
 * sample, so the forward's (smaller) fits too.
 */
int xb_begin(xb_dims *d, const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p)
{
	xblock_split_t x;
	int rc = xblock_split(&x, s, tp);
	if (rc < 0)
		return rc;
	sp_opshape_t self = *s;
	self.mem_seq = 0;
	self.mem_width = 0;
	if ((rc = tb_begin(&d->tb, &self, nullptr, n, p)) < 0)
		return rc;
	d->m = x.m;
	d->W = x.W;
	d->xper = x.per - x.self.per;
	for (int i = 0; i < NX; i++)
		d->off[i] = x.tensors[TB_NT + i].offset;
	int64_t h = x.self.h;
	/* queries [s,h] from the decoder, keys and values [m,2h] from the memory */
	d->attn = cu_attn{x.self.al, x.self.dh, x.self.s, x.m, h, 2 * h, 2 * h, h, 0,
			  d->tb.attn.scale};
	d->tb.nc = cu_chunk_samples(tb_ws_bytes(d->tb, 1) + xb_ws_bytes(*d, 1), n);
	return 0;
}

/* The cross part of the chunk of c samples from sample c0 of n. */
xb_saved xb_layout(float *base, int64_t c0, int64_t c, int64_t n, const xb_dims &d)
{
	int64_t h = d.tb.sp.h, R = c * d.tb.sp.s, M = c * d.m;
	float *chunk = base + n * d.tb.sp.per + c0 * d.xper;
	return cu_layout(chunk, sizeof(float) * (size_t)(c * d.xper),
			 "the decoder layout does not fit op_saved_elems", [&](cu_carve &k) {
				 xb_saved v;
				 v.lnc = k.take<bf16>(R * h);
				 v.q = k.take<bf16>(R * h);
				 v.cat = k.take<bf16>(R * h);
				 v.xc = k.take<float>(R * h);
				 v.kv = k.take<bf16>(M * 2 * h);
				 v.p = k.take<float>(c * d.attn.heads * d.tb.sp.s * d.m);
				 v.mc = k.take<float>(R);
				 v.rc = k.take<float>(R);
				 return v;
			 });
}

/*
 * The cross-attention of a chunk on xin = x_mid [R,h] and mem [M,W] (fp32):
 * lnc = LN_c(xin); q = lnc Wq + bq; kv = mem Wkv + bkv;
 * cat = attention(q, K, V); x_c = xin + boc + cat Woc.
 * Scratch: pb bf16 [c,a,s,m], memb bf16 [M,W].
 */
void xb_cross_fwd(const xb_dims &d, const xb_saved &v, int64_t c, const float *xin,
		  const float *mem, bf16 *pb, bf16 *memb)
{
	int64_t h = d.tb.sp.h, R = c * d.tb.sp.s, M = c * d.m, W = d.W;
	const float *p = d.tb.p;
	const bf16 *wb = d.tb.wb;
	const int64_t *off = d.off;
	k_ln_fwd_bf16(v.lnc, h, v.mc, v.rc, 1, xin, h, p + off[LNCG], p + off[LNCB], R, h);
	cu_affine_bf16(v.q, v.lnc, wb + off[WQ], p + off[BQ], R, h, h);
	k_to_bf16(memb, mem, M * W);
	cu_affine_bf16(v.kv, memb, wb + off[WKV], p + off[BKV], M, W, 2 * h);
	cu_attn_fwd(d.attn, c, v.q, v.kv, v.kv + h, v.p, pb, v.cat);
	k_add_rows(v.xc, xin, p + off[BOC], R, h);
	cu_gemm(false, false, R, h, h, 1.0f, v.cat, BF, h, wb + off[WOC], BF, h, 1.0f, v.xc, F32,
		h);
}

/*
 * The cross-attention's backward of a chunk from dxc = d(x_c):
 * dWoc += cat^T dxc; dcat = dxc Woc^T; attention backward to dq, dK, dV;
 * dWq += lnc^T dq; dlnc = dq Wq^T; dWkv += mem^T dkv; dmem += dkv Wkv^T;
 * dxm = dxc + LN_c'(dlnc) (the gradient of x_mid); bias gradients the
 * column sums of dxc, dq and dkv. t: the block's scratch (its dyb and
 * dcatb, free between the block's steps).
 */
void xb_cross_bwd(const xb_dims &d, const xb_saved &v, int64_t c, const float *xin,
		  const float *mem, const tb_scratch &t, const xb_scratch &x, float *dp,
		  float *dmem)
{
	int64_t h = d.tb.sp.h, R = c * d.tb.sp.s, M = c * d.m, W = d.W;
	const float *p = d.tb.p;
	const bf16 *wb = d.tb.wb;
	const int64_t *off = d.off;
	float *dlnc = x.dln;
	tb_lin_bwd(R, h, h, v.cat, x.dxc, t.dyb, wb + off[WOC], dp + off[WOC], dp + off[BOC],
		   t.dcatb, BF);
	cu_attn_bwd(d.attn, c, v.q, v.kv, v.kv + h, v.p, t.dcatb, x.dq, x.dkv, x.dkv + h, x.dP,
		    x.pb);
	cu_lin_bwd_bf16(R, h, h, v.lnc, x.dq, wb + off[WQ], dp + off[WQ], dp + off[BQ], dlnc, F32,
			0.0f);
	k_to_bf16(x.memb, mem, M * W);
	cu_lin_bwd_bf16(M, W, 2 * h, x.memb, x.dkv, wb + off[WKV], dp + off[WKV], dp + off[BKV],
			dmem, F32, 1.0f);
	k_ln_bwd(x.dxm, h, 0, x.dxc, h, dlnc, h, xin, h, v.mc, v.rc, 1, p + off[LNCG],
		 dp + off[LNCG], dp + off[LNCB], R, h);
}

} /* namespace */

/*
 * Per chunk: x_mid = x + self-attention (tb_self_fwd); x_c = x_mid +
 * cross-attention (xb_cross_fwd); y = x_c + MLP(x_c) (tb_mlp_fwd).
 */
int cu_xblock_fwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		  const float *x, const float *memory, float *y, float *saved)
{
	xb_dims d;
	int rc = xb_begin(&d, s, tp, n, p);
	if (rc < 0)
		return rc;
	int64_t sq = d.tb.sp.s, sh = sq * d.tb.sp.h, mw = d.m * d.W, nc = d.tb.nc;
	int64_t a = d.attn.heads;
	size_t bytes = 2 * (size_t)(nc * a * sq * sq + nc * a * sq * d.m + nc * mw) + 3 * 256;
	cu_carve w(cu_ws_get(bytes), bytes, 256);
	bf16 *pb = w.take<bf16>(nc * a * sq * sq), *pbc = w.take<bf16>(nc * a * sq * d.m);
	bf16 *memb = w.take<bf16>(nc * mw);
	if (w.overflow)
		cu_fatal(__FILE__, __LINE__, "decoder forward", "workspace too small");
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t c = n - c0 < nc ? n - c0 : nc;
		tb_saved v = tb_layout(saved, c0, c, n, d.tb);
		xb_saved xs = xb_layout(saved, c0, c, n, d);
		tb_self_fwd(d.tb, v, c, x + c0 * sh, pb);
		xb_cross_fwd(d, xs, c, v.xmid, memory + c0 * mw, pbc, memb);
		tb_saved vm = v; /* the MLP reads x_c where the block has x_mid */
		vm.xmid = xs.xc;
		tb_mlp_fwd(d.tb, vm, c, y + c0 * sh);
	}
	return 0;
}

/*
 * Per chunk (unsplit, so no all-reduce between):
 *   MLP:   dln = d(LN2 output) (tb_mlp_bwd on x_c); dxc = dy + LN2'(dln)
 *   cross: dxm, dmemory (xb_cross_bwd)
 *   self:  dln = d(LN1 output) (tb_attn_out_bwd from dxm); dx += dxm + LN1'(dln)
 */
int cu_xblock_bwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		  const float *saved, const float *memory, const float *dy, float *dx,
		  float *dmemory, float *dp)
{
	xb_dims d;
	int rc = xb_begin(&d, s, tp, n, p);
	if (rc < 0)
		return rc;
	int64_t sh = d.tb.sp.s * d.tb.sp.h, mw = d.m * d.W, nc = d.tb.nc;
	size_t tb_bytes = tb_ws_bytes(d.tb, nc), xb_bytes = xb_ws_bytes(d, nc);
	char *ws = cu_ws_get(tb_bytes + xb_bytes);
	for (int64_t c0 = 0; c0 < n; c0 += nc) {
		int64_t c = n - c0 < nc ? n - c0 : nc;
		tb_saved v = tb_layout((float *)saved, c0, c, n, d.tb);
		xb_saved xs = xb_layout((float *)saved, c0, c, n, d);
		cu_carve w(ws, tb_bytes, 256), xw(ws + tb_bytes, xb_bytes, 256);
		tb_scratch t = tb_scratch_take(w, d.tb, c);
		xb_scratch x = xb_scratch_take(xw, d, c);
		if (w.overflow || xw.overflow)
			cu_fatal(__FILE__, __LINE__, "decoder backward", "workspace too small");
		const float *dyc = dy + c0 * sh, *mem = memory + c0 * mw;
		tb_saved vm = v;
		vm.xmid = xs.xc;
		tb_mlp_bwd(d.tb, vm, c, dp, dyc, t, x.dln);
		tb_ln2_bwd(d.tb, vm, c, dp, dyc, x.dln, x.dxc);
		xb_cross_bwd(d, xs, c, v.xmid, mem, t, x, dp, dmemory + c0 * mw);
		tb_attn_out_bwd(d.tb, v, c, dp, x.dxm, t, x.dln);
		tb_ln1_bwd(d.tb, v, c, dp, x.dxm, x.dln, dx + c0 * sh);
	}
	return 0;
}
