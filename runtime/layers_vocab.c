/*
 * layers_vocab.c — vocabulary-parallel embedding and LM head (CPU
 * reference): member j of a t-way group holds token rows / logit columns
 * [v0, v0 + vl) (vocab_shard: V/t each, the first V%t members one more;
 * its shard laid out for vm = vocab_shard_max of them, the rest zero,
 * layers.h layer_tensors_tp) and calls the group's
 * all-reduce hook (rt_tp_t; the embedding's backward its all-gather), once
 * per call over all n samples, also when n == 0. NULL tp or t == 1: the
 * whole layers of layers.c, unchanged.
 *
 * Embedding: each member looks up the tokens of its rows (zero for the
 * others) and adds the position rows of its share of the n s (sample,
 * position) rows, [n s j/t, n s (j+1)/t) for member j; one all-reduce of
 * [n, s, h] gives every member the whole output. Each element of it has
 * at most two nonzero terms (the token row's and the position's), so it
 * equals the unsplit layer's bit for bit. Backward: each member scatters
 * dy into its own rows and sums dy into its share of the position table's
 * gradient, the elements [S j/t, S (j+1)/t) of its S = s h (comm_shard's
 * shard, rows cut anywhere); one all-gather of the S elements gives every
 * member the whole gradient (equal on every member, as it was before the
 * call). So a member does 1/t of the token rows' and of the position
 * rows' work in both passes. Every gradient element sums its terms in the
 * unsplit layer's order (samples in turn): the same bits. The CUDA
 * backend (cu_layers.cu) keeps the older split: member 0 adds the whole
 * position table forward, every member sums all of dy into the position
 * gradient backward, no all-gather: there the position sum is one
 * bandwidth-bound kernel reading dy once, and saving (t - 1)/t of it would
 * cost an all-gather of s h floats, its launch and the stream sync before
 * it (not measured on a device); the planner's cost.c prices that split.
 *
 * LM head: LayerNorm whole on every member, logits for its columns only;
 * the loss without gathering logits: per position each member writes its
 * column maximum m_j and sum of exponentials s_j = sum exp(z - m_j) into
 * its own slots of a [2t + 1] row, and the member owning the target its
 * logit into the last slot; one all-reduce (every slot has one nonzero
 * term, so it is exact) gives each member logsumexp = M + log sum_j s_j
 * exp(m_j - M), M = max_j m_j, and the loss, the same on every member.
 * Backward: dz = scale (softmax - onehot) / n_i on its columns, dW on its
 * columns, dln = dz W_j^T summed over the group (second all-reduce, [n, s,
 * h]), then the LayerNorm backward, whole: dx and the LayerNorm's
 * gradients equal on every member.
 */
#include "layers.h"
#include "layers_impl.h"

#include <assert.h>
#include <math.h>
#include <string.h>

int vocab_split(vocab_split_t *out, const sp_opshape_t *s, sp_comp_type_t type,
		const rt_tp_t *tp)
{
	int t = tp ? tp->t : 1;
	if (t < 1 || s->type != type)
		return SP_EINPUT;
	if (t > 1 && (!tp_ok(s->type, s->heads, s->ffn, s->vocab, t) || tp->rank < 0 ||
		      tp->rank >= t || !tp->allreduce))
		return SP_EINPUT;
	out->t = t;
	out->rank = t > 1 ? tp->rank : 0;
	out->vl = vocab_shard(s->vocab, t, out->rank, &out->v0);
	out->vm = vocab_shard_max(s->vocab, t);
	return 0;
}

int embedding_fwd_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		     const int32_t *tokens, float *y, float *saved)
{
	vocab_split_t v;
	if (vocab_split(&v, s, COMP_EMBEDDING, tp) || (v.t > 1 && !tp->allgather))
		return SP_EINPUT;
	if (v.t == 1) {
		embedding_fwd(s, n, p, tokens, y, saved);
		return 0;
	}
	int64_t h = s->hidden, sq = s->seq, v0 = v.v0, vl = v.vl, rows = (int64_t)n * sq;
	/* the (sample, position) rows whose position row this member adds */
	int64_t r0 = rows * v.rank / v.t, r1 = rows * (v.rank + 1) / v.t;
	size_t row = sizeof(float) * (size_t)h;
	const float *tok = p, *pos = p + v.vm * h;
	/* per row one of four row operations (own token or not, own position
	 * or not), chosen once per row, each one pass writing the row once */
	for (int64_t r = 0; r < rows; r++) {
		int32_t id = tokens[r];
		assert(id >= 0 && id < s->vocab);
		float *o = y + r * h;
		int own = id >= v0 && id < v0 + vl, at = r >= r0 && r < r1;
		const float *e = tok + (id - v0) * h, *ps = pos + (r % sq) * h;
		if (own && at)
			ly_sum2(o, e, ps, h); /* e + ps, as the unsplit layer */
		else if (own)
			memcpy(o, e, row);
		else if (at)
			memcpy(o, ps, row);
		else
			memset(o, 0, row); /* +0.0f */
		saved[r] = (float)id;
	}
	return tp->allreduce(tp->ctx, y, rows * h);
}

int embedding_bwd_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *saved,
		     const float *dy, float *dp)
{
	vocab_split_t v;
	if (vocab_split(&v, s, COMP_EMBEDDING, tp) || (v.t > 1 && !tp->allgather))
		return SP_EINPUT;
	if (v.t == 1) {
		embedding_bwd(s, n, saved, dy, dp);
		return 0;
	}
	int64_t h = s->hidden, sq = s->seq, v0 = v.v0, vl = v.vl, pn = sq * h;
	float *dtok = dp, *dpos = dp + v.vm * h;
	/* the member's own token rows, then its shard of the position table's
	 * elements, each in the unsplit layer's order (embedding_bwd: per
	 * element the samples in turn) */
	for (int64_t r = 0; r < (int64_t)n * sq; r++) {
		int64_t id = (int64_t)saved[r];
		if (id >= v0 && id < v0 + vl)
			ly_add_rows(dtok + (id - v0) * h, 1, h, h, dy + r * h);
	}
	/* its elements [e0, e1) a position row's part at a time, the n
	 * samples' dy added into it while it sits in L1 (embedding_bwd's
	 * loop, cut at the share's ends) */
	int64_t e0 = pn * v.rank / v.t, e1 = pn * (v.rank + 1) / v.t;
	for (int64_t e = e0; e < e1;) {
		int64_t end = SP_MIN(e1, (e / h + 1) * h);
		ly_sum_rows(dpos + e, dy + e, n, end - e, pn);
		e = end;
	}
	return tp->allgather(tp->ctx, dpos, pn);
}

/*
 * Scratch for all n samples (op_saved_elems_tp(s, n, t) floats per
 * sample): ln [n,s,h], dln [n,s,h], mean [n,s], rstd [n,s], z [n,s,Vl],
 * stats [n,s,2t+1] (m_0..m_{t-1}, s_0..s_{t-1}, target logit).
 */
int lm_head_loss_tp(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
		    const float *x, const int32_t *targets, double scale, float *dx, float *dp,
		    float *saved, double *loss)
{
	vocab_split_t v;
	*loss = 0;
	if (vocab_split(&v, s, COMP_LM_HEAD, tp))
		return SP_EINPUT;
	if (v.t == 1) {
		*loss = lm_head_loss(s, n, p, x, targets, scale, dx, dp, saved);
		return 0;
	}
	int t = v.t, j = v.rank;
	/* its logits z [rows, vl]; w and dw have row stride vm */
	int64_t h = s->hidden, sq = s->seq, V = s->vocab, v0 = v.v0, vl = v.vl, vm = v.vm;
	int64_t rows = (int64_t)n * sq, ns = 2 * (int64_t)t + 1;
	const float *lng = p, *lnb = p + h, *w = p + 2 * h;
	float *dg = dp, *db = dp + h, *dw = dp + 2 * h;
	float *ln = saved, *dln = ln + rows * h, *mean = dln + rows * h, *rstd = mean + rows;
	float *z = rstd + rows, *st = z + rows * vl;
	memset(st, 0, sizeof(float) * (size_t)(rows * ns));

	for (int64_t i = 0; i < n; i++) {
		const int32_t *yi = targets + i * sq;
		int64_t cnt = 0;
		for (int64_t q = 0; q < sq; q++) {
			assert(yi[q] < V);
			cnt += yi[q] >= 0;
		}
		float *lni = ln + i * sq * h, *zi = z + i * sq * vl;
		if (cnt == 0) { /* no loss, no gradient: zeros into the products */
			memset(lni, 0, sizeof(float) * (size_t)(sq * h));
			memset(zi, 0, sizeof(float) * (size_t)(sq * vl));
			continue;
		}
		ly_ln_rows(lni, mean + i * sq, rstd + i * sq, x + i * sq * h, sq, h, lng, lnb);
		ly_gemm(0, 0, sq, vl, h, 1.0f, lni, h, w, vm, 0.0f, zi, vl);
		for (int64_t q = 0; q < sq; q++) {
			const float *zq = zi + q * vl;
			float *sr = st + (i * sq + q) * ns;
			if (yi[q] < 0)
				continue;
			double mx = -INFINITY, sum = 0;
			for (int64_t k = 0; k < vl; k++)
				mx = zq[k] > mx ? zq[k] : mx;
			for (int64_t k = 0; k < vl; k++)
				sum += exp((double)zq[k] - mx);
			sr[j] = (float)mx;
			sr[t + j] = (float)sum;
			if (yi[q] >= v0 && yi[q] < v0 + vl)
				sr[2 * t] = zq[yi[q] - v0];
		}
	}
	int rc = tp->allreduce(tp->ctx, st, rows * ns);
	if (rc)
		return rc;

	double total = 0;
	for (int64_t i = 0; i < n; i++) {
		const int32_t *yi = targets + i * sq;
		int64_t cnt = 0;
		for (int64_t q = 0; q < sq; q++)
			cnt += yi[q] >= 0;
		if (cnt == 0)
			continue;
		double li = 0, coef = scale / (double)cnt;
		for (int64_t q = 0; q < sq; q++) {
			float *zq = z + (i * sq + q) * vl;
			const float *sr = st + (i * sq + q) * ns;
			if (yi[q] < 0) {
				memset(zq, 0, sizeof(float) * (size_t)vl);
				continue;
			}
			/* logsumexp over the whole vocabulary from every member's
			 * (max, sum of exponentials), in member order on every member */
			double M = sr[0], S = 0;
			for (int r = 1; r < t; r++)
				M = sr[r] > M ? sr[r] : M;
			for (int r = 0; r < t; r++)
				S += (double)sr[t + r] * exp((double)sr[r] - M);
			double lse = M + log(S);
			li += lse - sr[2 * t];
			for (int64_t k = 0; k < vl; k++)
				zq[k] = (float)(coef * exp((double)zq[k] - lse));
			if (yi[q] >= v0 && yi[q] < v0 + vl)
				zq[yi[q] - v0] -= (float)coef;
		}
		total += li / (double)cnt;
	}
	/* dW_j += ln^T dz; dln = dz W_j^T, summed over the group */
	ly_gemm(1, 0, h, vl, rows, 1.0f, ln, h, z, vl, 1.0f, dw, vm);
	ly_gemm(0, 1, rows, h, vl, 1.0f, z, vl, w, vm, 0.0f, dln, h);
	if ((rc = tp->allreduce(tp->ctx, dln, rows * h)))
		return rc;
	for (int64_t i = 0; i < n; i++) {
		const int32_t *yi = targets + i * sq;
		int64_t cnt = 0;
		for (int64_t q = 0; q < sq; q++)
			cnt += yi[q] >= 0;
		if (cnt > 0)
			ly_ln_rows_bwd(dx + i * sq * h, dg, db, dln + i * sq * h, x + i * sq * h,
				       mean + i * sq, rstd + i * sq, lng, sq, h);
	}
	*loss = total;
	return 0;
}
