/*
 * layers_xattn.c — the fp32 CPU reference of the cross-attention decoder
 * block (issue 20): pre-LN self-attention, pre-LN cross-attention of the
 * decoder's tokens to a memory (an encoder's output), then the MLP, with
 * a residual after each. The self-attention and the MLP are the
 * transformer block's own steps (layers_impl.h); this file adds the
 * cross-attention sublayer between them and the memory's gradient.
 *
 * What it does not do yet: split (tensor parallelism: tp with t != 1 is
 * refused, xblock_split). It is the CPU backend's xblock_fwd/xblock_bwd,
 * which interp.c calls for decoder slices, and the reference the CUDA
 * backend's (cuda/cu_xattn.cu, built from the CUDA block's steps the same
 * way) is checked against in tests/gpu/test_gpu_layers.c. Tested by finite
 * differences in tests/unit/test_layers_xattn.c.
 */
#include "layers.h"
#include "layers_impl.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Cross-attention tensors after the block's 12, in layer_tensors order. */
enum {
	XB_LNCG = TB__COUNT,
	XB_LNCB,
	XB_WQ,
	XB_BQ,
	XB_WKV,
	XB_BKV,
	XB_WOC,
	XB_BOC,
	XB__COUNT
};

typedef struct {
	tb_dims_t tb;      /* the self-attention and the MLP: an unsplit block */
	int64_t m, W, per; /* memory tokens and width; floats saved per sample */
} xb_dims_t;

/* Pointers into the cross-attention part of one sample's saved block. */
typedef struct {
	float *lnc, *q, *cat, *xc, *kv, *probs, *mc, *rc;
} xb_saved_t;

int xblock_split(xblock_split_t *out, const sp_opshape_t *s, const rt_tp_t *tp)
{
	if ((tp && tp->t != 1) || s->type != COMP_TRANSFORMER || s->mem_seq <= 0 ||
	    s->mem_width <= 0)
		return SP_EINPUT;
	sp_opshape_t self = *s;
	self.mem_seq = 0;
	self.mem_width = 0;
	int rc = tblock_split(&out->self, &self, NULL);
	if (rc < 0)
		return rc;
	out->m = s->mem_seq;
	out->W = s->mem_width;
	out->per = op_saved_elems(s, 0);
	sp_component_t c = layer_comp_of_shape(s);
	int nt = layer_tensors(&c, out->tensors);
	assert(nt == XB__COUNT);
	(void)nt;
	return 0;
}

/* The dimensions and the tensors of p (and of dp when not NULL) by XB_*. */
static int xb_dims(xb_dims_t *out, const float *w[XB__COUNT], float *g[XB__COUNT],
		   const sp_opshape_t *s, const rt_tp_t *tp, const float *p, float *dp)
{
	xblock_split_t x;
	int rc = xblock_split(&x, s, tp);
	if (rc < 0)
		return rc;
	out->tb.sp = x.self;
	out->tb.tp = NULL;
	out->m = x.m;
	out->W = x.W;
	out->per = x.per;
	for (int i = 0; i < XB__COUNT; i++) {
		w[i] = p + x.tensors[i].offset;
		if (g)
			g[i] = dp + x.tensors[i].offset;
	}
	return 0;
}

/* After the block's part (tb_saved), in the order of layers.h. */
static xb_saved_t xb_saved(const xb_dims_t *d, float *base)
{
	int64_t h = d->tb.sp.h, sq = d->tb.sp.s;
	xb_saved_t c;
	c.lnc = base + d->tb.sp.per;
	c.q = c.lnc + sq * h;
	c.cat = c.q + sq * h;
	c.xc = c.cat + sq * h;
	c.kv = c.xc + sq * h;
	c.probs = c.kv + 2 * d->m * h;
	c.mc = c.probs + d->tb.sp.al * sq * d->m;
	c.rc = c.mc + sq;
	assert(c.rc + sq == base + d->per);
	return c;
}

/* The attention's dimensions: s queries of stride h, m keys and values
 * (rows of kv [m, 2h]), no mask. */
static ly_attn_t xb_attn(const xb_dims_t *d)
{
	int64_t h = d->tb.sp.h;
	ly_attn_t a = { d->tb.sp.al, d->tb.sp.dh, d->tb.sp.s, d->m, h, 2 * h, 2 * h, h, 0 };
	return a;
}

/*
 * One sample's cross-attention on xin = x_mid [s,h] and mem [m,W]:
 * lnc = LN_c(xin); q = lnc Wq + bq; kv = mem Wkv + bkv;
 * cat = attention(q, K, V); x_c = xin + boc + cat Woc.
 */
static void xb_cross_fwd(const xb_dims_t *d, const float *const *w, const float *xin,
			 const float *mem, xb_saved_t *c)
{
	int64_t h = d->tb.sp.h, sq = d->tb.sp.s;
	ly_ln_rows(c->lnc, c->mc, c->rc, xin, sq, h, w[XB_LNCG], w[XB_LNCB]);
	ly_affine(c->q, c->lnc, w[XB_WQ], w[XB_BQ], sq, h, h);
	ly_affine(c->kv, mem, w[XB_WKV], w[XB_BKV], d->m, d->W, 2 * h);
	ly_attn_t a = xb_attn(d);
	ly_attn_fwd(&a, c->q, c->kv, c->kv + h, c->probs, c->cat);
	memcpy(c->xc, xin, (size_t)(sq * h) * sizeof *c->xc);
	ly_add_rows(c->xc, sq, h, h, w[XB_BOC]);
	ly_gemm(0, 0, sq, h, h, 1.0f, c->cat, h, w[XB_WOC], h, 1.0f, c->xc, h);
}

int xblock_fwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
	       const float *x, const float *memory, float *y, float *saved)
{
	xb_dims_t d;
	const float *w[XB__COUNT];
	int rc = xb_dims(&d, w, NULL, s, tp, p, NULL);
	if (rc < 0)
		return rc;
	int64_t sh = d.tb.sp.s * d.tb.sp.h, mw = d.m * d.W;
	for (int64_t i = 0; i < n; i++) {
		float *base = saved + i * d.per;
		tb_saved_t v = tb_saved(&d.tb, base);
		xb_saved_t c = xb_saved(&d, base);
		memcpy(v.x, x + i * sh, (size_t)sh * sizeof *v.x);
		tb_attn_out_fwd(&d.tb, s->causal, w, &v, v.xmid);
		xb_cross_fwd(&d, w, v.xmid, memory + i * mw, &c);
		tb_saved_t vm = v; /* the MLP reads x_c where the block has x_mid */
		vm.xmid = c.xc;
		tb_mlp_fwd(&d.tb, w, &vm, y + i * sh);
	}
	return 0;
}

/* Scratch of one sample's cross-attention backward. */
typedef struct {
	float *dcat, *dq, *dkv, *dpr, *dlnc; /* [s,h] [s,h] [m,2h] [s,m] [s,h] */
} xb_scratch_t;

/*
 * One sample's cross-attention backward from dxc = d(x_c):
 * dWoc += cat^T dxc; dcat = dxc Woc^T; attention backward to dq, dK, dV;
 * dWq += lnc^T dq; dlnc = dq Wq^T; dWkv += mem^T dkv; dmem += dkv Wkv^T;
 * dxm = dxc + LN_c'(dlnc) (the gradient of x_mid). Bias gradients are the
 * column sums of dxc, dq and dkv.
 */
static void xb_cross_bwd(const xb_dims_t *d, const float *const *w, float *const *g,
			 const xb_saved_t *c, const float *xin, const float *mem,
			 const float *dxc, const xb_scratch_t *ws, float *dmem, float *dxm)
{
	int64_t h = d->tb.sp.h, sq = d->tb.sp.s, m = d->m, W = d->W;
	ly_gemm(1, 0, h, h, sq, 1.0f, c->cat, h, dxc, h, 1.0f, g[XB_WOC], h);
	ly_sum_rows(g[XB_BOC], dxc, sq, h, h);
	ly_gemm(0, 1, sq, h, h, 1.0f, dxc, h, w[XB_WOC], h, 0.0f, ws->dcat, h);
	ly_attn_t a = xb_attn(d);
	ly_attn_bwd(&a, c->q, c->kv, c->kv + h, c->probs, ws->dcat, ws->dq, ws->dkv,
		    ws->dkv + h, ws->dpr);
	ly_gemm(1, 0, h, h, sq, 1.0f, c->lnc, h, ws->dq, h, 1.0f, g[XB_WQ], h);
	ly_sum_rows(g[XB_BQ], ws->dq, sq, h, h);
	ly_gemm(0, 1, sq, h, h, 1.0f, ws->dq, h, w[XB_WQ], h, 0.0f, ws->dlnc, h);
	ly_gemm(1, 0, W, 2 * h, m, 1.0f, mem, W, ws->dkv, 2 * h, 1.0f, g[XB_WKV], 2 * h);
	ly_sum_rows(g[XB_BKV], ws->dkv, m, 2 * h, 2 * h);
	ly_gemm(0, 1, m, W, 2 * h, 1.0f, ws->dkv, 2 * h, w[XB_WKV], 2 * h, 1.0f, dmem, W);
	memcpy(dxm, dxc, (size_t)(sq * h) * sizeof *dxm);
	ly_ln_rows_bwd(dxm, g[XB_LNCG], g[XB_LNCB], ws->dlnc, xin, c->mc, c->rc, w[XB_LNCG],
		       sq, h);
}

/*
 * Backward of each sample in turn (unsplit, so no all-reduce between):
 *   MLP:   dln2 (tb_mlp_bwd on x_c); dxc = dy + LN2'(dln2)
 *   cross: dxm, dmemory (xb_cross_bwd)
 *   self:  dln1 (tb_attn_out_bwd from dxm); dx += dxm + LN1'(dln1)
 * Workspace, one sample's: dln, dxc, dxm [s,h], dact [s,f], dkv [m,2h],
 * dcat [s,h], dqkv [s,3h] (also dq), dP [s, max(s,m)]; freed on return.
 */
int xblock_bwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
	       const float *saved, const float *memory, const float *dy, float *dx,
	       float *dmemory, float *dp)
{
	xb_dims_t d;
	const float *w[XB__COUNT];
	float *g[XB__COUNT];
	int rc = xb_dims(&d, w, g, s, tp, p, dp);
	if (rc < 0)
		return rc;
	int64_t h = d.tb.sp.h, sq = d.tb.sp.s, f = d.tb.sp.fl, m = d.m, sh = sq * h;
	int64_t mw = m * d.W, sk = sq > m ? sq : m;

	float *buf = ly_xmalloc((size_t)(7 * sh + sq * f + 2 * m * h + sq * sk) *
				sizeof(float));
	float *dln = buf, *dxc = dln + sh, *dxm = dxc + sh, *dact = dxm + sh;
	tb_scratch_t ws;
	ws.dcat = dact + sq * f;
	ws.dqkv = ws.dcat + sh;
	ws.dpr = ws.dqkv + 3 * sh;
	xb_scratch_t xs = { ws.dcat, ws.dqkv, ws.dpr + sq * sk, ws.dpr, dln };

	for (int64_t i = 0; i < n; i++) {
		float *base = (float *)saved + i * d.per;
		tb_saved_t v = tb_saved(&d.tb, base);
		xb_saved_t c = xb_saved(&d, base);
		tb_saved_t vm = v;
		vm.xmid = c.xc;
		const float *dyi = dy + i * sh;
		float *dxi = dx + i * sh;
		tb_mlp_bwd(&d.tb, w, g, &vm, dyi, dact, dln);
		memcpy(dxc, dyi, (size_t)sh * sizeof *dxc);
		ly_ln_rows_bwd(dxc, g[TB_LN2G], g[TB_LN2B], dln, c.xc, v.m2, v.r2, w[TB_LN2G],
			       sq, h);
		xb_cross_bwd(&d, w, g, &c, v.xmid, memory + i * mw, dxc, &xs,
			     dmemory + i * mw, dxm);
		tb_attn_out_bwd(&d.tb, w, g, &v, dxm, &ws, dln);
		for (int64_t k = 0; k < sh; k++)
			dxi[k] += dxm[k];
		ly_ln_rows_bwd(dxi, g[TB_LN1G], g[TB_LN1B], dln, v.x, v.m1, v.r1, w[TB_LN1G],
			       sq, h);
	}
	free(buf);
	return 0;
}
