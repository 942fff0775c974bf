/*
 * cu_loss.cu — the three losses on the GPU (forward and backward in one
 * call, layers.h semantics). Each returns its loss sum to the host, so each
 * call ends with a stream synchronisation.
 *
 *   lm_head      bf16 products (ln(x) W and the two gradient products) with
 *                fp32 logits; scratch per sample as the CPU sizes it
 *                (2 s h + 2 s + s V floats), laid out tensor-major:
 *                z fp32 [R,V] (its rows later hold the bf16 dz in place),
 *                ln bf16 [R,h], dln fp32 [R,h], mean and rstd fp32 [R].
 *   classifier   fp32 throughout, the CPU's scratch layout (tiny products).
 *   contrastive  fp32 throughout, the CPU's scratch layout.
 */
#include "cu_internal.cuh"

extern "C" {
#include "layers.h"
}

namespace {

constexpr cudaDataType_t BF = CUDA_R_16BF, F32 = CUDA_R_32F;

double read_back(const double *dev)
{
	double *host = cu_host_scalars();
	CUDA_CHECK(cudaMemcpyAsync(host, dev, sizeof(double), cudaMemcpyDeviceToHost, cu_s()));
	CUDA_CHECK(cudaStreamSynchronize(cu_s()));
	return host[0];
}

} /* namespace */

/*
 * loss_i = 1/n_i sum_{t valid} (logsumexp(z_t) - z_t[y_t]),
 * dz_t = scale (softmax(z_t) - onehot(y_t)) / n_i;
 * dW += ln^T dz; dln = dz W^T; LayerNorm backward into dx, dg, db.
 */
double cu_lm_head_loss(const sp_opshape_t *s, int n, const float *p, const float *x,
		       const int32_t *targets, double scale, float *dx, float *dp,
		       float *saved)
{
	int64_t h = s->hidden, sq = s->seq, V = s->vocab, R = (int64_t)n * sq;
	if (R <= 0)
		return 0.0;
	const float *lng = p, *lnb = p + h;
	const bf16 *wb = cu_shadow(p, 2 * h + h * V) + 2 * h;
	size_t budget = sizeof(float) * (size_t)(n * op_saved_elems(s, 0));
	float *z = nullptr, *dln = nullptr, *mean = nullptr, *rstd = nullptr;
	bf16 *ln = nullptr;
	for (size_t align = 16;; align = 4) {
		cu_carve c(saved, budget, align);
		z = c.take<float>(R * V);
		ln = c.take<bf16>(R * h);
		dln = c.take<float>(R * h);
		mean = c.take<float>(R);
		rstd = c.take<float>(R);
		if (!c.overflow)
			break;
		if (align == 4)
			cu_fatal(__FILE__, __LINE__, "lm_head loss", "scratch layout does not fit");
	}
	size_t wsb = sizeof(double) * (size_t)(R + 1) + sizeof(int) * (size_t)n + 1024;
	cu_carve w(cu_ws_get(wsb), wsb, 256);
	double *rowloss = w.take<double>(R), *total = w.take<double>(1);
	int *cnt = w.take<int>(n);

	k_count_valid(cnt, targets, n, sq);
	k_ln_fwd_bf16(ln, h, mean, rstd, 1, x, h, lng, lnb, R, h);
	cu_gemm(false, false, R, V, h, 1.0f, ln, BF, h, wb, BF, V, 0.0f, z, F32, V);
	k_ce_rows_inplace(z, V, targets, cnt, sq, scale, rowloss, R);
	const bf16 *dz = (const bf16 *)z; /* leading dimension 2V */
	cu_gemm(true, false, h, V, R, 1.0f, ln, BF, h, dz, BF, 2 * V, 1.0f, dp + 2 * h, F32, V);
	cu_gemm(false, true, R, h, V, 1.0f, dz, BF, 2 * V, wb, BF, V, 0.0f, dln, F32, h);
	k_ln_bwd(dx, h, 1, nullptr, 0, dln, h, x, h, mean, rstd, 1, lng, dp, dp + h, R, h);
	k_lm_total(total, rowloss, cnt, n, sq);
	return read_back(total);
}

/*
 * Member rank of a vocabulary-parallel LM head (layers.h lm_head_loss_tp),
 * logit columns [v0, v0 + vl): as cu_lm_head_loss on its columns, with the
 * logsumexp from every member's (max, sum of exponentials) and the target
 * logit from its owner (one all-reduce of st [R, 2t + 1]), and dln summed
 * over the group (a second all-reduce, [R, h]) before the LayerNorm
 * backward. Scratch (op_saved_elems_tp(s, n, t) floats per sample): z fp32
 * [R,vl] (bf16 dz in place), ln bf16 [R,h], dln fp32 [R,h], mean, rstd fp32
 * [R], st fp32 [R, 2t + 1]. Both all-reduces happen with no rows too.
 */
int cu_lm_head_loss_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		       const float *x, const int32_t *targets, double scale, float *dx, float *dp,
		       float *saved, double *loss)
{
	vocab_split_t v;
	*loss = 0.0;
	if (vocab_split(&v, s, COMP_LM_HEAD, tp))
		return SP_EINPUT;
	if (v.t == 1) {
		*loss = cu_lm_head_loss(s, n, p, x, targets, scale, dx, dp, saved);
		return 0;
	}
	/* its vl logit columns; w and dW [h, vm] (layer_tensors_tp) */
	int64_t h = s->hidden, sq = s->seq, vl = v.vl, vm = v.vm, R = (int64_t)n * sq;
	int64_t ns = 2 * (int64_t)v.t + 1;
	int rc;
	if (R <= 0) { /* the members' calls still pair up */
		if ((rc = tp->allreduce(tp->ctx, saved, 0)))
			return rc;
		return tp->allreduce(tp->ctx, saved, 0);
	}
	const float *lng = p, *lnb = p + h;
	const bf16 *wb = cu_shadow(p, 2 * h + h * vm) + 2 * h;
	size_t budget = sizeof(float) * (size_t)(n * op_saved_elems_tp(s, 0, v.t));
	float *z = nullptr, *dln = nullptr, *mean = nullptr, *rstd = nullptr, *st = nullptr;
	bf16 *ln = nullptr;
	for (size_t align = 16;; align = 4) {
		cu_carve c(saved, budget, align);
		z = c.take<float>(R * vl);
		ln = c.take<bf16>(R * h);
		dln = c.take<float>(R * h);
		mean = c.take<float>(R);
		rstd = c.take<float>(R);
		st = c.take<float>(R * ns);
		if (!c.overflow)
			break;
		if (align == 4)
			cu_fatal(__FILE__, __LINE__, "lm_head loss (split)",
				 "scratch layout does not fit");
	}
	size_t wsb = sizeof(double) * (size_t)(R + 1) + sizeof(int) * (size_t)n + 1024;
	cu_carve w(cu_ws_get(wsb), wsb, 256);
	double *rowloss = w.take<double>(R), *total = w.take<double>(1);
	int *cnt = w.take<int>(n);

	k_count_valid(cnt, targets, n, sq);
	k_ln_fwd_bf16(ln, h, mean, rstd, 1, x, h, lng, lnb, R, h);
	cu_gemm(false, false, R, vl, h, 1.0f, ln, BF, h, wb, BF, vm, 0.0f, z, F32, vl);
	CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof(float) * (size_t)(R * ns), cu_s()));
	k_vocab_stats(st, z, vl, targets, cnt, sq, s->vocab, v.v0, v.t, v.rank, R);
	if ((rc = tp->allreduce(tp->ctx, st, R * ns)))
		return rc;
	k_vocab_ce(z, vl, st, targets, cnt, sq, scale, v.v0, v.t, rowloss, R);
	const bf16 *dz = (const bf16 *)z; /* leading dimension 2 vl */
	cu_gemm(true, false, h, vl, R, 1.0f, ln, BF, h, dz, BF, 2 * vl, 1.0f, dp + 2 * h, F32, vm);
	cu_gemm(false, true, R, h, vl, 1.0f, dz, BF, 2 * vl, wb, BF, vm, 0.0f, dln, F32, h);
	if ((rc = tp->allreduce(tp->ctx, dln, R * h)))
		return rc;
	k_ln_bwd(dx, h, 1, nullptr, 0, dln, h, x, h, mean, rstd, 1, lng, dp, dp + h, R, h);
	k_lm_total(total, rowloss, cnt, n, sq);
	*loss = read_back(total);
	return 0;
}

/*
 * On token 0 of each sample: z = LN(x0) W + b, loss_i = logsumexp(z_i) -
 * z_i[label_i], dz_i = scale (softmax(z_i) - onehot); label < 0: left out.
 * Scratch per sample (stride 2h + 2 + C): ln [h], dln [h], mean, rstd, dz [C].
 */
double cu_classifier_loss(const sp_opshape_t *s, int n, int64_t seq_in, const float *p,
			  const float *x, const int32_t *labels, double scale, float *dx,
			  float *dp, float *saved)
{
	int64_t h = s->hidden, C = s->classes, per = 2 * h + 2 + C, ldx = seq_in * h;
	if (n <= 0)
		return 0.0;
	const float *lng = p, *lnb = p + h, *w = p + 2 * h, *b = w + h * C;
	float *dw = dp + 2 * h, *db = dw + h * C;
	float *ln = saved, *dln = saved + h, *mean = saved + 2 * h, *rstd = mean + 1;
	float *z = saved + 2 * h + 2;
	size_t wsb = sizeof(double) * (size_t)(n + 1) + 512;
	cu_carve wk(cu_ws_get(wsb), wsb, 256);
	double *rowloss = wk.take<double>(n), *total = wk.take<double>(1);

	k_ln_fwd_f32(ln, per, mean, rstd, per, x, ldx, lng, lnb, n, h);
	k_fill_rows(z, per, b, n, C);
	cu_gemm(false, false, n, C, h, 1.0f, ln, F32, per, w, F32, C, 1.0f, z, F32, per);
	k_ce_rows_f32(z, per, C, labels, scale, rowloss, n);
	cu_gemm(true, false, h, C, n, 1.0f, ln, F32, per, z, F32, per, 1.0f, dw, F32, C);
	k_colsum(db, z, n, C, per);
	cu_gemm(false, true, n, h, C, 1.0f, z, F32, per, w, F32, C, 0.0f, dln, F32, per);
	k_ln_bwd(dx, ldx, 1, nullptr, 0, dln, per, x, ldx, mean, rstd, per, lng, dp, dp + h, n,
		 h);
	k_sum_doubles(total, rowloss, n);
	return read_back(total);
}

/*
 * Symmetric InfoNCE (layers.c has the derivation). Scratch: U [B,w],
 * V [B,w], |a| [B], |b| [B], then S / G_ij/(tau |a_i|) [B,B] and
 * G_ij/(tau |b_j|) [B,B].
 */
double cu_contrastive_loss(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
			   double temperature, int64_t s0, int64_t s1, const float *a,
			   const float *b, double scale, float *da, float *db, float *saved)
{
	int64_t lda = seq_a * w, ldb = seq_b * w;
	if (B <= 0)
		return 0.0;
	float *an = saved, *bn = an + B * w, *na = bn + B * w, *nb = na + B;
	float *pa = nb + B, *pb = pa + B * B;
	double inv_t = 1.0 / temperature;
	size_t wsb = sizeof(double) * (size_t)(4 * B + 1) + 1024;
	cu_carve wk(cu_ws_get(wsb), wsb, 256);
	double *r = wk.take<double>(B), *c = wk.take<double>(B);
	double *dota = wk.take<double>(B), *dotb = wk.take<double>(B);
	double *total = wk.take<double>(1);

	k_l2norm_rows(an, na, a, lda, B, w);
	k_l2norm_rows(bn, nb, b, ldb, B, w);
	cu_gemm(false, true, B, B, w, (float)inv_t, an, F32, w, bn, F32, w, 0.0f, pa, F32, B);
	k_row_lse(r, pa, B);
	k_col_lse(c, pa, B);
	k_infonce_grads(pa, pb, dota, dotb, total, r, c, na, nb, B, inv_t, scale, s0, s1);
	if (s1 > s0) {
		cu_gemm(false, false, s1 - s0, w, B, 1.0f, pa + s0 * B, F32, B, bn, F32, w, 1.0f,
			da + s0 * lda, F32, lda);
		cu_gemm(true, false, s1 - s0, w, B, 1.0f, pb + s0, F32, B, an, F32, w, 1.0f,
			db + s0 * ldb, F32, ldb);
		k_tangent_rows(da, lda, an, na, dota, s0, s1, w);
		k_tangent_rows(db, ldb, bn, nb, dotb, s0, s1, w);
	}
	return read_back(total);
}
