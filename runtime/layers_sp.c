/*
 * layers_sp.c — the sequence-parallel transformer block: a t-way
 * Megatron split (layers.c) whose layer norms, residual adds and the
 * biases of the row-parallel products run on the member's token shard
 * (R = n s / t of the call's n s tokens, flattened sample after sample,
 * so the shards of a whole [n, s, h] buffer are its contiguous t parts
 * and the collectives work in place on it). An all-gather of the
 * LayerNorm output feeds each column-parallel product (QKV, FC1) and a
 * reduce-scatter of each row-parallel product's partial sum (output
 * projection, FC2) replaces the all-reduce; the LayerNorm gradients,
 * each member's over its tokens, are all-reduced per call or, the
 * caller's way (tp->ln_grads), summed on the slice's first layer's
 * all-gather of dx. Semantics and the saved layout: layers.h
 * (tblock_fwd, "With tp->sp"); the hooks: backend_ops.h.
 *
 * The forward computes the products over all n s rows at once and the
 * attention per sample; the backward the products with all n s rows in
 * their inner dimension (weight gradients) at once, the rest per sample,
 * so its workspace holds one sample's intermediate gradients. Each call
 * allocates its workspace (forward: one [n s, h] partial sum; backward:
 * two [n s, h] buffers and one sample's gradients, plan_mem.c counts it)
 * and frees it before returning. It does not gather or scatter anything outside
 * the block: a slice's first and last layers are told by whole_in and
 * whole_out that their input or output is whole.
 */
#include "layers.h"
#include "layers_impl.h"

#include <stdlib.h>
#include <string.h>

sp_rows_t sp_rows(const tblock_split_t *d, int n, int64_t ln_n)
{
	sp_rows_t r;
	r.T = (int64_t)n * d->s;
	r.R = r.T / d->t;
	r.o = d->rank * r.R;
	r.blk = r.R * d->h + ln_n;
	r.o_blk = d->rank * r.blk;
	return r;
}

/* Pointers into a call's saved block (layers.h order, all n samples). */
typedef struct {
	float *x, *ln1, *qkv, *cat, *xmid, *ln2, *pre, *act, *probs;
	float *m1, *r1, *m2, *r2;
} sp_saved_t;

static sp_saved_t sp_saved(const tb_dims_t *d, int64_t n, float *base)
{
	int64_t h = d->sp.h, T = n * d->sp.s, R = T / d->sp.t;
	sp_saved_t v;
	v.x = base;
	v.ln1 = v.x + R * h;
	v.qkv = v.ln1 + T * h;
	v.cat = v.qkv + 3 * T * d->sp.hl;
	v.xmid = v.cat + T * d->sp.hl;
	v.ln2 = v.xmid + R * h;
	v.pre = v.ln2 + T * h;
	v.act = v.pre + T * d->sp.fl;
	v.probs = v.act + T * d->sp.fl;
	v.m1 = v.probs + n * d->sp.al * d->sp.s * d->sp.s;
	v.r1 = v.m1 + R;
	v.m2 = v.r1 + R;
	v.r2 = v.m2 + R;
	return v;
}

static int gather(const tb_dims_t *d, float *buf, int64_t n)
{
	return d->tp->allgather(d->tp->ctx, buf, n);
}

static int scatter(const tb_dims_t *d, float *buf, int64_t n)
{
	return d->tp->reduce_scatter(d->tp->ctx, buf, n);
}

/* out[r] = a[r] + b[r] + bias, R rows of width h. */
static void add_rows3(float *out, const float *a, const float *b, const float *bias, int64_t R,
		      int64_t h)
{
	for (int64_t r = 0; r < R; r++)
		for (int64_t k = 0; k < h; k++)
			out[r * h + k] = a[r * h + k] + b[r * h + k] + bias[k];
}

/*
 * ln1 of every token into v->ln1 (the member's own rows with their saved
 * statistics): from the whole input locally, or from the shard and an
 * all-gather.
 */
static int ln1_all(const tb_dims_t *d, const float *const *w, const sp_saved_t *v,
		   const float *x, int64_t T)
{
	int64_t h = d->sp.h, R = T / d->sp.t, o = d->sp.rank * R;
	ly_ln_rows(v->ln1 + o * h, v->m1, v->r1, v->x, R, h, w[TB_LN1G], w[TB_LN1B]);
	if (!d->tp->whole_in)
		return gather(d, v->ln1, T * h);
	/* the other members' tokens: their statistics are theirs to keep */
	float *st = ly_xmalloc((size_t)(2 * T + 2) * sizeof(float));
	ly_ln_rows(v->ln1, st, st + T, x, o, h, w[TB_LN1G], w[TB_LN1B]);
	ly_ln_rows(v->ln1 + (o + R) * h, st, st + T, x + (o + R) * h, T - o - R, h, w[TB_LN1G],
		   w[TB_LN1B]);
	free(st);
	return 0;
}

/*
 * x_mid = x + attn(LN1(x) Wqkv + bqkv) Wo + bo and y = x_mid +
 * gelu(LN2(x_mid) W1 + b1) W2 + b2, the sums over the members' heads and
 * FFN columns reduce-scattered onto the token shards.
 */
int tblock_sp_fwd(const tb_dims_t *d, int causal, int n, const float *p, const float *x,
		  float *y, float *saved)
{
	int64_t h = d->sp.h, sq = d->sp.s, hl = d->sp.hl, fl = d->sp.fl, w3 = 3 * hl;
	sp_rows_t rows = sp_rows(&d->sp, n, 0);
	int64_t T = rows.T, R = rows.R, o = rows.o;
	const float *w[TB__COUNT];
	tb_tensors(d, p, NULL, w, NULL);
	sp_saved_t v = sp_saved(d, n, saved);
	const float *xs = d->tp->whole_in ? x + o * h : x;
	float *ys = d->tp->whole_out ? y + o * h : y;
	float *part = ly_xmalloc((size_t)(T * h) * sizeof(float));
	int rc;

	memcpy(v.x, xs, (size_t)(R * h) * sizeof *v.x);
	if ((rc = ln1_all(d, w, &v, x, T)) < 0)
		goto cleanup;
	ly_affine(v.qkv, v.ln1, w[TB_WQKV], w[TB_BQKV], T, h, w3);
	for (int64_t i = 0; i < n; i++) {
		ly_attn_t a = {d->sp.al, d->sp.dh, sq, sq, w3, w3, w3, hl, causal};
		const float *q = v.qkv + i * sq * w3;
		ly_attn_fwd(&a, q, q + hl, q + 2 * hl, v.probs + i * d->sp.al * sq * sq,
			    v.cat + i * sq * hl);
	}
	ly_gemm(0, 0, T, h, hl, 1.0f, v.cat, hl, w[TB_WO], h, 0.0f, part, h);
	if ((rc = scatter(d, part, T * h)) < 0)
		goto cleanup;
	add_rows3(v.xmid, xs, part + o * h, w[TB_BO], R, h);

	ly_ln_rows(v.ln2 + o * h, v.m2, v.r2, v.xmid, R, h, w[TB_LN2G], w[TB_LN2B]);
	if ((rc = gather(d, v.ln2, T * h)) < 0)
		goto cleanup;
	ly_affine(v.pre, v.ln2, w[TB_W1], w[TB_B1], T, h, fl);
	for (int64_t k = 0; k < T * fl; k++)
		v.act[k] = ly_gelu(v.pre[k]);
	ly_gemm(0, 0, T, h, fl, 1.0f, v.act, fl, w[TB_W2], h, 0.0f, part, h);
	if ((rc = scatter(d, part, T * h)) < 0)
		goto cleanup;
	add_rows3(ys, v.xmid, part + o * h, w[TB_B2], R, h);
	rc = d->tp->whole_out ? gather(d, y, T * h) : 0;
cleanup:
	free(part);
	return rc < 0 ? rc : 0;
}

/*
 * The slice's first layer (whole_in) with the caller's LayerNorm
 * gradients ln[0..E) (this member's sums over its tokens, every layer of
 * the instruction): its dx rows `mine` [R, h] and ln ride one all-gather
 * of t blocks [R h + E]; every member then adds all rows into dx and sums
 * the t partials of ln in rank order (the same bits on every member).
 */
static int gather_dx_ln(const tb_dims_t *d, const sp_rows_t *rows, const float *mine, float *ln,
			float *dx)
{
	int64_t h = d->sp.h, t = d->sp.t, B = rows->blk, R = rows->R, E = B - R * h;
	float *blk = ly_xmalloc((size_t)(t * B) * sizeof(float));
	float *me = blk + rows->o_blk;
	memcpy(me, mine, (size_t)(R * h) * sizeof *me);
	memcpy(me + R * h, ln, (size_t)E * sizeof *me);
	int rc = gather(d, blk, t * B);
	if (rc == 0) {
		for (int64_t q = 0; q < t; q++)
			for (int64_t k = 0; k < R * h; k++)
				dx[q * R * h + k] += blk[q * B + k];
		for (int64_t k = 0; k < E; k++) {
			float s = 0.0f;
			for (int64_t q = 0; q < t; q++)
				s += blk[q * B + R * h + k];
			ln[k] = s;
		}
	}
	free(blk);
	return rc;
}

/*
 * Backward, the forward's collectives mirrored:
 *   dyf = gather(dy)                  (dy whole: as it is)
 *   MLP: dW2, db2 from dyf; dln2 = scatter(dpre W1^T)
 *   dxm = dy + LN2'(dln2)             (shard)
 *   dxmf = gather(dxm); dWo, dbo from it; attention; dln1 = scatter(dqkv Wqkv^T)
 *   dx += dxm + LN1'(dln1)            (whole_in: gathered, added to every row)
 * and the LayerNorm gradients, over the member's tokens: all-reduced and
 * added into dp, or added into the caller's tp->ln_grads (summed on the
 * first layer's all-gather of dx: gather_dx_ln).
 */
int tblock_sp_bwd(const tb_dims_t *d, int n, const float *p, const float *saved,
		  const float *dy, float *dx, float *dp)
{
	int64_t h = d->sp.h, sq = d->sp.s, hl = d->sp.hl, fl = d->sp.fl, w3 = 3 * hl;
	sp_rows_t rows = sp_rows(&d->sp, n, d->tp->ln_grads ? d->tp->ln_n : 0);
	int64_t T = rows.T, R = rows.R, o = rows.o;
	const float *w[TB__COUNT];
	float *g[TB__COUNT];
	tb_tensors(d, p, dp, w, g);
	sp_saved_t v = sp_saved(d, n, (float *)saved);
	const float *dys = d->tp->whole_out ? dy + o * h : dy;
	/* gat, part [T,h]; one sample's dact [s,fl], dcat [s,hl], dqkv [s,3hl],
	 * dP [s,s]; dxm [R,h], the LayerNorm gradients [4h] */
	float *gat = ly_xmalloc((size_t)(2 * T * h + sq * (fl + 4 * hl) + sq * sq + R * h + 4 * h) *
				sizeof(float));
	float *part = gat + T * h, *dact = part + T * h, *dcat = dact + sq * fl;
	float *dqkv = dcat + sq * hl, *dpr = dqkv + sq * w3, *dxm = dpr + sq * sq;
	float *lng = dxm + R * h;
	memset(lng, 0, (size_t)(4 * h) * sizeof *lng);
	int rc = 0;

	const float *dyf = dy;
	if (!d->tp->whole_out) {
		memcpy(gat + o * h, dy, (size_t)(R * h) * sizeof *gat);
		if ((rc = gather(d, gat, T * h)) < 0)
			goto cleanup;
		dyf = gat;
	}
	ly_gemm(1, 0, fl, h, T, 1.0f, v.act, fl, dyf, h, 1.0f, g[TB_W2], h);
	ly_sum_rows(g[TB_B2], dyf, T, h, h);
	for (int64_t i = 0; i < n; i++) { /* per sample: dact is one sample's */
		const float *dyi = dyf + i * sq * h, *pre = v.pre + i * sq * fl;
		ly_gemm(0, 1, sq, fl, h, 1.0f, dyi, h, w[TB_W2], h, 0.0f, dact, fl);
		for (int64_t k = 0; k < sq * fl; k++)
			dact[k] *= ly_gelu_grad(pre[k]);
		ly_gemm(1, 0, h, fl, sq, 1.0f, v.ln2 + i * sq * h, h, dact, fl, 1.0f, g[TB_W1],
			fl);
		ly_sum_rows(g[TB_B1], dact, sq, fl, fl);
		ly_gemm(0, 1, sq, h, fl, 1.0f, dact, fl, w[TB_W1], fl, 0.0f, part + i * sq * h, h);
	}
	if ((rc = scatter(d, part, T * h)) < 0)
		goto cleanup;
	memcpy(dxm, dys, (size_t)(R * h) * sizeof *dxm);
	ly_ln_rows_bwd(dxm, lng + 2 * h, lng + 3 * h, part + o * h, v.xmid, v.m2, v.r2,
		       w[TB_LN2G], R, h);

	memcpy(gat + o * h, dxm, (size_t)(R * h) * sizeof *gat);
	if ((rc = gather(d, gat, T * h)) < 0)
		goto cleanup;
	ly_gemm(1, 0, hl, h, T, 1.0f, v.cat, hl, gat, h, 1.0f, g[TB_WO], h);
	ly_sum_rows(g[TB_BO], gat, T, h, h);
	for (int64_t i = 0; i < n; i++) { /* per sample: dcat, dqkv are one sample's */
		ly_attn_t a = {d->sp.al, d->sp.dh, sq, sq, w3, w3, w3, hl, 0};
		const float *q = v.qkv + i * sq * w3;
		ly_gemm(0, 1, sq, hl, h, 1.0f, gat + i * sq * h, h, w[TB_WO], h, 0.0f, dcat, hl);
		ly_attn_bwd(&a, q, q + hl, q + 2 * hl, v.probs + i * d->sp.al * sq * sq, dcat, dqkv,
			    dqkv + hl, dqkv + 2 * hl, dpr);
		ly_gemm(1, 0, h, w3, sq, 1.0f, v.ln1 + i * sq * h, h, dqkv, w3, 1.0f, g[TB_WQKV],
			w3);
		ly_sum_rows(g[TB_BQKV], dqkv, sq, w3, w3);
		ly_gemm(0, 1, sq, h, w3, 1.0f, dqkv, w3, w[TB_WQKV], w3, 0.0f, part + i * sq * h, h);
	}
	if ((rc = scatter(d, part, T * h)) < 0)
		goto cleanup;

	float *acc = d->tp->ln_grads;
	if (d->tp->whole_in) {
		float *mine = gat + o * h;
		memcpy(mine, dxm, (size_t)(R * h) * sizeof *mine);
		ly_ln_rows_bwd(mine, lng, lng + h, part + o * h, v.x, v.m1, v.r1, w[TB_LN1G], R,
			       h);
		if (acc) { /* this layer's part, then every layer's summed on dx's gather */
			for (int64_t k = 0; k < 4 * h; k++)
				acc[d->tp->ln_at + k] += lng[k];
			rc = gather_dx_ln(d, &rows, mine, acc, dx);
			goto cleanup;
		}
		if ((rc = gather(d, gat, T * h)) < 0)
			goto cleanup;
		for (int64_t k = 0; k < T * h; k++)
			dx[k] += gat[k];
	} else {
		for (int64_t k = 0; k < R * h; k++)
			dx[k] += dxm[k];
		ly_ln_rows_bwd(dx, lng, lng + h, part + o * h, v.x, v.m1, v.r1, w[TB_LN1G], R, h);
	}
	if (acc) { /* the caller's, summed by the slice's first layer */
		for (int64_t k = 0; k < 4 * h; k++)
			acc[d->tp->ln_at + k] += lng[k];
		goto cleanup;
	}
	if ((rc = d->tp->allreduce(d->tp->ctx, lng, 4 * h)) < 0)
		goto cleanup;
	for (int64_t k = 0; k < h; k++) {
		g[TB_LN1G][k] += lng[k];
		g[TB_LN1B][k] += lng[h + k];
		g[TB_LN2G][k] += lng[2 * h + k];
		g[TB_LN2B][k] += lng[3 * h + k];
	}
cleanup:
	free(gat);
	return rc < 0 ? rc : 0;
}
