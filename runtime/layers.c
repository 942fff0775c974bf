/*
 * layers.c — the fp32 CPU reference of every component type: forward and
 * backward of sources, transformer blocks and linear layers, the three
 * losses, and the optimizer steps. Matrix products go through CBLAS;
 * elementwise work is plain loops with reductions in double.
 *
 * It computes on one device's samples only: splitting, scheduling and
 * communication live elsewhere (a tensor-parallel block only calls the
 * caller's all-reduce hook). Saved activations follow arith.c exactly;
 * loss functions use `saved` as scratch. tblock_bwd and contrastive_loss
 * allocate a workspace per call (the gradient of a LayerNorm output for
 * all n samples and one sample's other gradients; O(B) doubles) and free
 * it before returning. Multi-head attention itself is in layers_attn.c,
 * the cross-attention decoder block in layers_xattn.c; the helpers and
 * block steps they share with this file are declared in layers_impl.h.
 */
#include "layers.h"
#include "layers_impl.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LN_EPS 1e-5
#define NORM_EPS 1e-12
#define INIT_STD 0.02

/* ---- helpers -------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C, row-major, with int64 sizes. */
void ly_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
		 const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
		 float *c, int64_t ldc)
{
	if (m <= 0 || n <= 0)
		return;
	if (k <= 0) {
		for (int64_t i = 0; i < m; i++)
			for (int64_t j = 0; j < n; j++)
				c[i * ldc + j] =
					beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
		return;
	}
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
		    tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
		    (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

void *ly_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr,
			"spindle: out of memory allocating %zu bytes of layer "
			"workspace\n",
			n);
		abort();
	}
	return p;
}

/* d[c] += a[c] for c < n (d and a disjoint), in blocks of 8 then one by
 * one: a fixed trip count is what GCC's -O2 vectoriser (cost model
 * "very cheap") takes; every element gets the same one addition */
static void add_vec(float *restrict d, const float *restrict a, int64_t n)
{
	int64_t c = 0;
	for (; c + 8 <= n; c += 8)
		for (int j = 0; j < 8; j++)
			d[c + j] += a[c + j];
	for (; c < n; c++)
		d[c] += a[c];
}

/* o[c] = a[c] + b[c] for c < n, in one pass (o disjoint from a and b):
 * the same one addition per element as a copy of a followed by add_vec
 * of b, without reading o back */
void ly_sum2(float *restrict o, const float *restrict a, const float *restrict b, int64_t n)
{
	int64_t c = 0;
	for (; c + 8 <= n; c += 8)
		for (int j = 0; j < 8; j++)
			o[c + j] = a[c + j] + b[c + j];
	for (; c < n; c++)
		o[c] = a[c] + b[c];
}

/* Each of `rows` rows (stride ld) gets the vector v added. */
void ly_add_rows(float *y, int64_t rows, int64_t cols, int64_t ld, const float *v)
{
	for (int64_t r = 0; r < rows; r++)
		add_vec(y + r * ld, v, cols);
}

/* db += sum over rows of dy. */
void ly_sum_rows(float *db, const float *dy, int64_t rows, int64_t cols, int64_t ld)
{
	for (int64_t r = 0; r < rows; r++)
		add_vec(db, dy + r * ld, cols);
}

/*
 * LayerNorm of one row: mu = mean(x), rstd = 1/sqrt(var(x) + 1e-5),
 * y = (x - mu) rstd g + b (biased variance).
 */
static void ln_row(float *y, float *mean, float *rstd, const float *x, int64_t h,
		   const float *g, const float *b)
{
	double s = 0, ss = 0;
	for (int64_t k = 0; k < h; k++)
		s += x[k];
	double mu = s / (double)h;
	for (int64_t k = 0; k < h; k++) {
		double d = x[k] - mu;
		ss += d * d;
	}
	double r = 1.0 / sqrt(ss / (double)h + LN_EPS);
	for (int64_t k = 0; k < h; k++)
		y[k] = (float)((x[k] - mu) * r * g[k] + b[k]);
	*mean = (float)mu;
	*rstd = (float)r;
}

/*
 * LayerNorm backward of one row, with xhat = (x - mu) rstd and dxhat = dy g:
 *   dg += dy xhat; db += dy
 *   dx += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
 */
static void ln_row_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
		       float mean, float rstd, const float *g, int64_t h)
{
	double m1 = 0, m2 = 0;
	for (int64_t k = 0; k < h; k++) {
		double xh = ((double)x[k] - mean) * rstd;
		double dxh = (double)dy[k] * g[k];
		dg[k] += (float)(dy[k] * xh);
		db[k] += dy[k];
		m1 += dxh;
		m2 += dxh * xh;
	}
	m1 /= (double)h;
	m2 /= (double)h;
	for (int64_t k = 0; k < h; k++) {
		double xh = ((double)x[k] - mean) * rstd;
		double dxh = (double)dy[k] * g[k];
		dx[k] += (float)(rstd * (dxh - m1 - xh * m2));
	}
}

void ly_ln_rows(float *y, float *mean, float *rstd, const float *x, int64_t rows, int64_t h,
		const float *g, const float *b)
{
	for (int64_t r = 0; r < rows; r++)
		ln_row(y + r * h, &mean[r], &rstd[r], x + r * h, h, g, b);
}

void ly_ln_rows_bwd(float *dx, float *dg, float *db, const float *dy, const float *x,
		    const float *mean, const float *rstd, const float *g, int64_t rows,
		    int64_t h)
{
	for (int64_t r = 0; r < rows; r++)
		ln_row_bwd(dx + r * h, dg, db, dy + r * h, x + r * h, mean[r], rstd[r], g, h);
}

/*
 * GELU, tanh approximation, with u = c (x + 0.044715 x^3), c = sqrt(2/pi):
 *   gelu(x)  = x/2 (1 + tanh u)
 *   gelu'(x) = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) c (1 + 3 0.044715 x^2)
 */
static const double GELU_C = 0.7978845608028654;
static const double GELU_K = 0.044715;

static float gelu(float xf)
{
	double x = xf;
	return (float)(0.5 * x * (1.0 + tanh(GELU_C * (x + GELU_K * x * x * x))));
}

static float gelu_grad(float xf)
{
	double x = xf;
	double t = tanh(GELU_C * (x + GELU_K * x * x * x));
	return (float)(0.5 * (1.0 + t) +
		       0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_K * x * x));
}

float ly_gelu(float x)
{
	return gelu(x);
}

float ly_gelu_grad(float x)
{
	return gelu_grad(x);
}

/* log sum_k exp z_k, stable. */
double ly_logsumexp(const float *z, int64_t n)
{
	double mx = -INFINITY, s = 0;
	for (int64_t k = 0; k < n; k++)
		mx = z[k] > mx ? z[k] : mx;
	for (int64_t k = 0; k < n; k++)
		s += exp((double)z[k] - mx);
	return mx + log(s);
}

/* F.normalize's clamp: vectors shorter than 1e-12 are divided by 1e-12. */
static double clamp_norm(double x)
{
	return x > NORM_EPS ? x : NORM_EPS;
}

sp_component_t layer_comp_of_shape(const sp_opshape_t *s)
{
	sp_component_t c;
	memset(&c, 0, sizeof c);
	c.type = s->type;
	c.vocab = s->vocab;
	c.hidden = s->hidden;
	c.max_seq = s->seq;
	c.in = s->in;
	c.out = s->out;
	c.heads = s->heads;
	c.ffn = s->ffn;
	c.classes = s->classes;
	c.causal = s->causal;
	c.cross_attention = s->mem_seq > 0;
	c.memory_width = c.cross_attention ? s->mem_width : 0;
	return c;
}

/* ---- parameter layout --------------------------------------------------- */

int layer_tensors(const sp_component_t *c, layer_tensor_t out[LAYER_TENSORS_MAX])
{
	return layer_tensors_tp(c, 1, out);
}

int layer_tensors_tp(const sp_component_t *c, int tp, layer_tensor_t out[LAYER_TENSORS_MAX])
{
	int64_t h = c->hidden, f = c->ffn;
	if (!tp_ok(c->type, c->heads, c->ffn, c->vocab, tp))
		tp = 1;
	int64_t hl = h / tp, fl = f / tp; /* this shard's attention and FFN widths */
	/* its vocabulary rows / columns: room for the largest member's */
	int64_t vl = tp > 1 ? vocab_shard_max(c->vocab, tp) : c->vocab;
	int nt = 0;
	int64_t off = 0;
#define T(nm, r, cl)                                                                     \
	do {                                                                             \
		out[nt].name = nm;                                                       \
		out[nt].rows = r;                                                        \
		out[nt].cols = cl;                                                       \
		out[nt].offset = off;                                                    \
		off += (int64_t)(r) * (cl);                                              \
		nt++;                                                                    \
	} while (0)
	switch (c->type) {
	case COMP_EMBEDDING:
		T("tok", vl, h);
		T("pos", c->max_seq, h);
		break;
	case COMP_PATCH:
		T("w", c->in, h);
		T("b", h, 1);
		T("pos", c->max_seq, h);
		break;
	case COMP_TRANSFORMER:
		T("ln1_g", h, 1);
		T("ln1_b", h, 1);
		T("w_qkv", h, 3 * hl);
		T("b_qkv", 3 * hl, 1);
		T("w_o", hl, h);
		T("b_o", h, 1);
		T("ln2_g", h, 1);
		T("ln2_b", h, 1);
		T("w_1", h, fl);
		T("b_1", fl, 1);
		T("w_2", fl, h);
		T("b_2", h, 1);
		if (!c->cross_attention || tp > 1)
			break;
		T("lnc_g", h, 1);
		T("lnc_b", h, 1);
		T("w_q", h, h);
		T("b_q", h, 1);
		T("w_kv", c->memory_width, 2 * h);
		T("b_kv", 2 * h, 1);
		T("w_oc", h, h);
		T("b_oc", h, 1);
		break;
	case COMP_LINEAR:
		T("w", c->in, c->out);
		T("b", c->out, 1);
		break;
	case COMP_LM_HEAD:
		T("ln_g", h, 1);
		T("ln_b", h, 1);
		T("w", h, vl);
		break;
	case COMP_CLASSIFIER:
		T("ln_g", h, 1);
		T("ln_b", h, 1);
		T("w", h, c->classes);
		T("b", c->classes, 1);
		break;
	case COMP_CONTRASTIVE:
	case COMP__COUNT: break;
	}
#undef T
	return nt;
}

/*
 * A column shard of a row-major tensor whose rows are `parts` blocks of wf
 * columns: the shard's row holds, for each block q, the w columns at
 * q*wf + j*w of the full row. to_full: shard -> full, else full -> shard.
 */
static void shard_cols(float *full, float *shard, int64_t rows, int parts, int64_t wf,
		       int64_t w, int64_t j, int to_full)
{
	for (int64_t r = 0; r < rows; r++)
		for (int q = 0; q < parts; q++) {
			float *fp = full + r * parts * wf + q * wf + j * w;
			float *sp = shard + r * parts * w + q * w;
			if (to_full)
				memcpy(fp, sp, (size_t)w * sizeof *fp);
			else
				memcpy(sp, fp, (size_t)w * sizeof *sp);
		}
}

/*
 * rows x cols at full (row stride ldf) and shard (row stride lds): to_full
 * copies shard -> full, else full -> shard, zeroing the shard's columns
 * [cols, lds) of each row and its pad_rows rows after them.
 */
static void shard_block(float *full, int64_t ldf, float *shard, int64_t lds, int64_t rows,
			int64_t cols, int64_t pad_rows, int to_full)
{
	for (int64_t r = 0; r < rows; r++) {
		float *fp = full + r * ldf, *sp = shard + r * lds;
		if (to_full) {
			memcpy(fp, sp, (size_t)cols * sizeof *fp);
			continue;
		}
		memcpy(sp, fp, (size_t)cols * sizeof *sp);
		memset(sp + cols, 0, (size_t)(lds - cols) * sizeof *sp);
	}
	if (!to_full)
		memset(shard + rows * lds, 0, (size_t)(pad_rows * lds) * sizeof *shard);
}

void layer_shard(const sp_component_t *c, int tp, int j, float *full, float *shard,
		 int to_full)
{
	layer_tensor_t ft[LAYER_TENSORS_MAX], st[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, ft);
	if (!tp_ok(c->type, c->heads, c->ffn, c->vocab, tp))
		tp = 1;
	layer_tensors_tp(c, tp, st);
	for (int i = 0; i < nt; i++) {
		float *f = full + ft[i].offset, *sh = shard + st[i].offset;
		int64_t n = st[i].rows * st[i].cols;
		if (tp > 1 && c->type == COMP_TRANSFORMER) {
			switch (i) {
			case TB_WQKV: /* per row: q, k, v parts, this shard's heads */
				shard_cols(f, sh, ft[i].rows, 3, c->hidden, c->hidden / tp, j,
					   to_full);
				continue;
			case TB_BQKV:
				shard_cols(f, sh, 1, 3, c->hidden, c->hidden / tp, j, to_full);
				continue;
			case TB_W1: /* columns */
				shard_cols(f, sh, ft[i].rows, 1, c->ffn, c->ffn / tp, j, to_full);
				continue;
			case TB_B1:
			case TB_WO: /* rows: contiguous */
			case TB_W2: f += (int64_t)j * n; break;
			default: break; /* whole on every member */
			}
		}
		if (tp > 1 && ((c->type == COMP_EMBEDDING && i == 0) ||
			       (c->type == COMP_LM_HEAD && i == 2))) {
			/* token rows / logit columns [v0, v0 + vl) (vocab_shard), the
			 * shard's rest zero */
			int64_t v0, vl = vocab_shard(c->vocab, tp, j, &v0);
			if (i == 0)
				shard_block(f + v0 * c->hidden, c->hidden, sh, c->hidden, vl,
					    c->hidden, st[i].rows - vl, to_full);
			else
				shard_block(f + v0, c->vocab, sh, st[i].cols, ft[i].rows, vl, 0,
					    to_full);
			continue;
		}
		if (to_full)
			memcpy(f, sh, (size_t)n * sizeof *f);
		else
			memcpy(sh, f, (size_t)n * sizeof *sh);
	}
}

/*
 * Every tensor is uniform in [-a, a], a = sqrt(3) 0.02 (std 0.02), except
 * LayerNorm gains (1) and biases (0). Element k of the layer draws from
 * key mix64(mix64(seed ^ fnv1a(name)) + layer) + k.
 */
void layer_init(float *params, const sp_component_t *c, int layer, uint64_t seed)
{
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, t);
	uint64_t hn = sp_fnv1a(SP_FNV_INIT, c->name, strnlen(c->name, SP_NAME_MAX));
	uint64_t base = sp_mix64(sp_mix64(seed ^ hn) + (uint64_t)(int64_t)layer);
	double a = sqrt(3.0) * INIT_STD;
	for (int i = 0; i < nt; i++) {
		const char *nm = t[i].name;
		size_t len = strlen(nm);
		int64_t n = t[i].rows * t[i].cols;
		float *p = params + t[i].offset;
		if (nm[0] == 'b' || (nm[0] == 'l' && nm[len - 1] == 'b')) {
			for (int64_t k = 0; k < n; k++)
				p[k] = 0.0f;
		} else if (nm[0] == 'l') {
			for (int64_t k = 0; k < n; k++)
				p[k] = 1.0f;
		} else {
			uint64_t key = base + (uint64_t)t[i].offset;
			for (int64_t k = 0; k < n; k++)
				p[k] = (float)(a *
					       (2.0 * sp_unit(key + (uint64_t)k) - 1.0));
		}
	}
}

/* ---- sources ------------------------------------------------------------- */

/* y[i,t] = tok[tokens[i,t]] + pos[t] */
void embedding_fwd(const sp_opshape_t *s, int n, const float *p, const int32_t *tokens,
		   float *y, float *saved)
{
	int64_t h = s->hidden, sq = s->seq;
	const float *tok = p, *pos = p + s->vocab * h;
	for (int64_t i = 0; i < n; i++)
		for (int64_t t = 0; t < sq; t++) {
			int32_t id = tokens[i * sq + t];
			assert(id >= 0 && id < s->vocab);
			/* token row + position row */
			ly_sum2(y + (i * sq + t) * h, tok + (int64_t)id * h, pos + t * h, h);
			saved[i * sq + t] = (float)id;
		}
}

void embedding_bwd(const sp_opshape_t *s, int n, const float *saved, const float *dy,
		   float *dp)
{
	int64_t h = s->hidden, sq = s->seq;
	float *dtok = dp, *dpos = dp + s->vocab * h;
	/* every row's sum in (sample, position) order */
	for (int64_t i = 0; i < n; i++)
		for (int64_t t = 0; t < sq; t++)
			ly_add_rows(dtok + (int64_t)saved[i * sq + t] * h, 1, h, h,
				    dy + (i * sq + t) * h);
	for (int64_t t = 0; t < sq; t++)
		ly_sum_rows(dpos + t * h, dy + t * h, n, h, sq * h);
}

/* y[i,t] = feats[i,t] W + b + pos[t] */
void patch_fwd(const sp_opshape_t *s, int n, const float *p, const float *feats, float *y,
	       float *saved)
{
	int64_t h = s->hidden, sq = s->seq, in = s->in, rows = (int64_t)n * sq;
	const float *w = p, *b = p + in * h, *pos = b + h;
	memcpy(saved, feats, (size_t)(rows * in) * sizeof *saved);
	for (int64_t i = 0; i < n; i++)
		for (int64_t t = 0; t < sq; t++) {
			float *o = y + (i * sq + t) * h;
			for (int64_t k = 0; k < h; k++)
				o[k] = b[k] + pos[t * h + k];
		}
	ly_gemm(0, 0, rows, h, in, 1.0f, feats, in, w, h, 1.0f, y, h);
}

/* dW += feats^T dy; db += sum dy; dpos[t] += sum_i dy[i,t] */
void patch_bwd(const sp_opshape_t *s, int n, const float *p, const float *saved,
	       const float *dy, float *dp)
{
	(void)p;
	int64_t h = s->hidden, sq = s->seq, in = s->in, rows = (int64_t)n * sq;
	float *dw = dp, *db = dp + in * h, *dpos = db + h;
	ly_gemm(1, 0, in, h, rows, 1.0f, saved, in, dy, h, 1.0f, dw, h);
	ly_sum_rows(db, dy, rows, h, h);
	for (int64_t i = 0; i < n; i++)
		for (int64_t k = 0; k < sq * h; k++)
			dpos[k] += dy[i * sq * h + k];
}

/* ---- transformer block ------------------------------------------------------ */

int tblock_split(tblock_split_t *out, const sp_opshape_t *s, const rt_tp_t *tp)
{
	int t = tp ? tp->t : 1;
	int sp = t > 1 && tp->sp;
	if (t < 1 || s->mem_seq != 0 ||
	    (t > 1 && (!tp_ok(s->type, s->heads, s->ffn, s->vocab, t) || tp->rank < 0 ||
		       tp->rank >= t || !tp->allreduce)) ||
	    (sp && (!sp_ok(s, t) || !tp->reduce_scatter || !tp->allgather)) ||
	    (sp && tp->ln_grads &&
	     (tp->ln_at < 0 || tp->ln_n < tp->ln_at + 4 * s->hidden)))
		return SP_EINPUT;
	assert(s->heads > 0 && s->hidden % s->heads == 0);
	out->t = t;
	out->rank = t > 1 ? tp->rank : 0;
	out->h = s->hidden;
	out->s = s->seq;
	out->hl = s->hidden / t;
	out->fl = s->ffn / t;
	out->al = s->heads / t;
	out->dh = s->hidden / s->heads;
	out->sp = sp;
	out->per = op_saved_elems_sp(s, 0, t, sp);
	sp_component_t c = layer_comp_of_shape(s);
	layer_tensors_tp(&c, t, out->tensors);
	return 0;
}

int tb_dims(tb_dims_t *out, const sp_opshape_t *s, const rt_tp_t *tp)
{
	int rc = tblock_split(&out->sp, s, tp);
	out->tp = rc == 0 && out->sp.t > 1 ? tp : NULL;
	return rc;
}

/* Sums buf [n] over the group; a no-op unsplit. */
static int tb_allreduce(const tb_dims_t *d, float *buf, int64_t n)
{
	return d->tp ? d->tp->allreduce(d->tp->ctx, buf, n) : 0;
}

tb_saved_t tb_saved(const tb_dims_t *d, float *base)
{
	int64_t h = d->sp.h, sq = d->sp.s, hl = d->sp.hl, fl = d->sp.fl;
	tb_saved_t v;
	v.x = base;
	v.ln1 = v.x + sq * h;
	v.qkv = v.ln1 + sq * h;
	v.cat = v.qkv + 3 * sq * hl;
	v.xmid = v.cat + sq * hl;
	v.ln2 = v.xmid + sq * h;
	v.pre = v.ln2 + sq * h;
	v.act = v.pre + sq * fl;
	v.probs = v.act + sq * fl;
	v.m1 = v.probs + d->sp.al * sq * sq;
	v.r1 = v.m1 + sq;
	v.m2 = v.r1 + sq;
	v.r2 = v.m2 + sq;
	assert(v.r2 + sq == base + d->sp.per);
	return v;
}

/* The member's tensors of p (and of dp when not NULL), layer_tensors_tp order. */
void tb_tensors(const tb_dims_t *d, const float *p, float *dp, const float *w[TB__COUNT],
		       float *g[TB__COUNT])
{
	for (int i = 0; i < TB__COUNT; i++) {
		w[i] = p + d->sp.tensors[i].offset;
		if (g)
			g[i] = dp + d->sp.tensors[i].offset;
	}
}

/*
 * The rank-0 member alone starts a partial sum from `base` (+ bias); the
 * others start from 0, so the group's sum counts the residual and the
 * bias once (unsplit: the residual, as before). rows x h.
 */
static void tb_start_sum(const tb_dims_t *d, float *y, const float *base, const float *bias)
{
	int64_t n = d->sp.s * d->sp.h;
	if (d->sp.rank != 0) {
		memset(y, 0, (size_t)n * sizeof *y);
		return;
	}
	memcpy(y, base, (size_t)n * sizeof *y);
	ly_add_rows(y, d->sp.s, d->sp.h, d->sp.h, bias);
}

/* rows x cols of y set to the bias row b, then y += a W (a: rows x k). */
void ly_affine(float *y, const float *a, const float *w, const float *b, int64_t rows,
	       int64_t k, int64_t cols)
{
	for (int64_t r = 0; r < rows; r++)
		memcpy(y + r * cols, b, (size_t)cols * sizeof *y);
	ly_gemm(0, 0, rows, cols, k, 1.0f, a, k, w, cols, 1.0f, y, cols);
}

/*
 * Attention of this member's al heads on one sample: ln1 = LN1(x),
 * qkv = ln1 Wqkv + bqkv (its heads' columns), cat = attention (causal when
 * asked), then the partial sum out = [x + bo] + cat Wo.
 */
void tb_attn_out_fwd(const tb_dims_t *d, int causal, const float *const *w, tb_saved_t *v,
		     float *out)
{
	int64_t h = d->sp.h, sq = d->sp.s, hl = d->sp.hl, w3 = 3 * hl;
	ly_ln_rows(v->ln1, v->m1, v->r1, v->x, sq, h, w[TB_LN1G], w[TB_LN1B]);
	ly_affine(v->qkv, v->ln1, w[TB_WQKV], w[TB_BQKV], sq, h, w3);
	ly_attn_t a = { d->sp.al, d->sp.dh, sq, sq, w3, w3, w3, hl, causal };
	ly_attn_fwd(&a, v->qkv, v->qkv + hl, v->qkv + 2 * hl, v->probs, v->cat);
	tb_start_sum(d, out, v->x, w[TB_BO]);
	ly_gemm(0, 0, sq, h, hl, 1.0f, v->cat, hl, w[TB_WO], h, 1.0f, out, h);
}

/* MLP of one sample on v->xmid: ln2, pre, act, and the partial sum
 * y = [x_mid + b2] + act W2. */
void tb_mlp_fwd(const tb_dims_t *d, const float *const *w, tb_saved_t *v, float *y)
{
	int64_t h = d->sp.h, sq = d->sp.s, fl = d->sp.fl;
	ly_ln_rows(v->ln2, v->m2, v->r2, v->xmid, sq, h, w[TB_LN2G], w[TB_LN2B]);
	ly_affine(v->pre, v->ln2, w[TB_W1], w[TB_B1], sq, h, fl);
	for (int64_t k = 0; k < sq * fl; k++)
		v->act[k] = gelu(v->pre[k]);
	tb_start_sum(d, y, v->xmid, w[TB_B2]);
	ly_gemm(0, 0, sq, h, fl, 1.0f, v->act, fl, w[TB_W2], h, 1.0f, y, h);
}

/*
 * y = x_mid + gelu(LN2(x_mid) W1 + b1) W2 + b2,
 * x_mid = x + attn(LN1(x) Wqkv + bqkv) Wo + bo,
 * per head: P = softmax(Q K^T / sqrt(d) [+ causal mask]), head out = P V.
 * Split t ways, member j holds heads [j a/t, (j+1) a/t) and FFN columns
 * [j f/t, (j+1) f/t): cat_j Wo_j and act_j W2_j are partial sums over the
 * group, each summed by one all-reduce over all n samples in y.
 */
int tblock_fwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
	       const float *x, float *y, float *saved)
{
	tb_dims_t d;
	int rc = tb_dims(&d, s, tp);
	if (rc < 0)
		return rc;
	if (d.sp.sp)
		return tblock_sp_fwd(&d, s->causal, n, p, x, y, saved);
	int64_t sh = d.sp.s * d.sp.h;
	const float *w[TB__COUNT];
	tb_tensors(&d, p, NULL, w, NULL);

	for (int64_t i = 0; i < n; i++) {
		tb_saved_t v = tb_saved(&d, saved + i * d.sp.per);
		memcpy(v.x, x + i * sh, (size_t)sh * sizeof *v.x);
		tb_attn_out_fwd(&d, s->causal, w, &v, y + i * sh);
	}
	if ((rc = tb_allreduce(&d, y, n * sh)) < 0)
		return rc;

	for (int64_t i = 0; i < n; i++) {
		tb_saved_t v = tb_saved(&d, saved + i * d.sp.per);
		memcpy(v.xmid, y + i * sh, (size_t)sh * sizeof *v.xmid);
		tb_mlp_fwd(&d, w, &v, y + i * sh);
	}
	return tb_allreduce(&d, y, n * sh);
}

/*
 * MLP backward of one sample: dW2 += act^T dy; dact = dy W2^T;
 * dpre = dact gelu'(pre); dW1 += ln2^T dpre; dln2 = dpre W1^T (partial
 * when split). dact: scratch [s, fl].
 */
void tb_mlp_bwd(const tb_dims_t *d, const float *const *w, float *const *g,
		const tb_saved_t *v, const float *dy, float *dact, float *dln2)
{
	int64_t h = d->sp.h, sq = d->sp.s, fl = d->sp.fl;
	ly_gemm(1, 0, fl, h, sq, 1.0f, v->act, fl, dy, h, 1.0f, g[TB_W2], h);
	ly_sum_rows(g[TB_B2], dy, sq, h, h);
	ly_gemm(0, 1, sq, fl, h, 1.0f, dy, h, w[TB_W2], h, 0.0f, dact, fl);
	for (int64_t k = 0; k < sq * fl; k++)
		dact[k] *= gelu_grad(v->pre[k]);
	ly_gemm(1, 0, h, fl, sq, 1.0f, v->ln2, h, dact, fl, 1.0f, g[TB_W1], fl);
	ly_sum_rows(g[TB_B1], dact, sq, fl, fl);
	ly_gemm(0, 1, sq, h, fl, 1.0f, dact, fl, w[TB_W1], fl, 0.0f, dln2, h);
}

/*
 * Attention backward of one sample from dxm, the gradient of the residual
 * after the self-attention: dWo += cat^T dxm; dcat = dxm Wo^T; attention
 * backward per head to dqkv; dWqkv += ln1^T dqkv; dln1 = dqkv Wqkv^T
 * (partial when split).
 */
void tb_attn_out_bwd(const tb_dims_t *d, const float *const *w, float *const *g,
		     const tb_saved_t *v, const float *dxm, const tb_scratch_t *ws, float *dln1)
{
	int64_t h = d->sp.h, sq = d->sp.s, hl = d->sp.hl, w3 = 3 * hl;
	ly_gemm(1, 0, hl, h, sq, 1.0f, v->cat, hl, dxm, h, 1.0f, g[TB_WO], h);
	ly_sum_rows(g[TB_BO], dxm, sq, h, h);
	ly_gemm(0, 1, sq, hl, h, 1.0f, dxm, h, w[TB_WO], h, 0.0f, ws->dcat, hl);
	ly_attn_t a = { d->sp.al, d->sp.dh, sq, sq, w3, w3, w3, hl, 0 };
	ly_attn_bwd(&a, v->qkv, v->qkv + hl, v->qkv + 2 * hl, v->probs, ws->dcat, ws->dqkv,
		    ws->dqkv + hl, ws->dqkv + 2 * hl, ws->dpr);
	ly_gemm(1, 0, h, w3, sq, 1.0f, v->ln1, h, ws->dqkv, w3, 1.0f, g[TB_WQKV], w3);
	ly_sum_rows(g[TB_BQKV], ws->dqkv, sq, w3, w3);
	ly_gemm(0, 1, sq, h, w3, 1.0f, ws->dqkv, w3, w[TB_WQKV], w3, 0.0f, dln1, h);
}

/*
 * Backward (dy given, everything else from `saved`), in three passes over
 * the n samples with an all-reduce of dln [n, s, h] between them:
 *   MLP:  to dln2 (tb_mlp_bwd)                           (partial: all-reduce)
 *   attn: dx_mid = dy + LN2'(dln2); to dln1 (tb_attn_out_bwd) (partial: all-reduce)
 *   LN1:  dx += dx_mid + LN1'(dln1)
 * Bias gradients are the column sums of the matching output gradients.
 * Whole tensors' gradients (LayerNorms, bo, b2) come from whole values,
 * so they are equal on every member.
 */
int tblock_bwd(const sp_opshape_t *s, const rt_tp_t *tp, int n, const float *p,
	       const float *saved, const float *dy, float *dx, float *dp)
{
	tb_dims_t d;
	int rc = tb_dims(&d, s, tp);
	if (rc < 0)
		return rc;
	if (d.sp.sp)
		return tblock_sp_bwd(&d, n, p, saved, dy, dx, dp);
	int64_t h = d.sp.h, sq = d.sp.s, fl = d.sp.fl, hl = d.sp.hl, sh = sq * h;
	const float *w[TB__COUNT];
	float *g[TB__COUNT];
	tb_tensors(&d, p, dp, w, g);

	/* dln [n,s,h], dxmid [s,h], dact [s,fl], dcat [s,hl], dqkv [s,3hl], dP [s,s] */
	float *buf = ly_xmalloc((size_t)(n * sh + sq * (h + fl + 4 * hl) + sq * sq) *
			     sizeof(float));
	float *dln = buf, *dxm = dln + n * sh, *dact = dxm + sh;
	tb_scratch_t ws;
	ws.dcat = dact + sq * fl;
	ws.dqkv = ws.dcat + sq * hl;
	ws.dpr = ws.dqkv + 3 * sq * hl;

	for (int64_t i = 0; i < n; i++) {
		tb_saved_t v = tb_saved(&d, (float *)saved + i * d.sp.per);
		tb_mlp_bwd(&d, w, g, &v, dy + i * sh, dact, dln + i * sh);
	}
	if ((rc = tb_allreduce(&d, dln, n * sh)) < 0)
		goto cleanup;

	for (int64_t i = 0; i < n; i++) {
		tb_saved_t v = tb_saved(&d, (float *)saved + i * d.sp.per);
		float *dlni = dln + i * sh, *dxi = dx + i * sh;
		memcpy(dxm, dy + i * sh, (size_t)sh * sizeof *dxm);
		ly_ln_rows_bwd(dxm, g[TB_LN2G], g[TB_LN2B], dlni, v.xmid, v.m2, v.r2,
			       w[TB_LN2G], sq, h);
		tb_attn_out_bwd(&d, w, g, &v, dxm, &ws, dlni);
		for (int64_t k = 0; k < sh; k++)
			dxi[k] += dxm[k];
	}
	if ((rc = tb_allreduce(&d, dln, n * sh)) < 0)
		goto cleanup;

	for (int64_t i = 0; i < n; i++) {
		tb_saved_t v = tb_saved(&d, (float *)saved + i * d.sp.per);
		ly_ln_rows_bwd(dx + i * sh, g[TB_LN1G], g[TB_LN1B], dln + i * sh, v.x, v.m1,
			       v.r1, w[TB_LN1G], sq, h);
	}
cleanup:
	free(buf);
	return rc;
}

/* ---- linear ---------------------------------------------------------------- */

void linear_fwd(const sp_opshape_t *s, int n, const float *p, const float *x, float *y,
		float *saved)
{
	int64_t in = s->in, out = s->out, rows = (int64_t)n * s->seq;
	const float *w = p, *b = p + in * out;
	memcpy(saved, x, (size_t)(rows * in) * sizeof *saved);
	for (int64_t r = 0; r < rows; r++)
		memcpy(y + r * out, b, (size_t)out * sizeof *y);
	ly_gemm(0, 0, rows, out, in, 1.0f, x, in, w, out, 1.0f, y, out);
}

/* dW += x^T dy; db += sum dy; dx += dy W^T */
void linear_bwd(const sp_opshape_t *s, int n, const float *p, const float *saved,
		const float *dy, float *dx, float *dp)
{
	int64_t in = s->in, out = s->out, rows = (int64_t)n * s->seq;
	const float *w = p;
	float *dw = dp, *db = dp + in * out;
	ly_gemm(1, 0, in, out, rows, 1.0f, saved, in, dy, out, 1.0f, dw, out);
	ly_sum_rows(db, dy, rows, out, out);
	ly_gemm(0, 1, rows, in, out, 1.0f, dy, out, w, out, 1.0f, dx, in);
}

/* ---- losses ---------------------------------------------------------------- */

/*
 * Per sample i with valid positions T_i (target >= 0), n_i = |T_i|:
 *   loss_i = 1/n_i sum_{t in T_i} (logsumexp(z_t) - z_t[y_t])
 *   dz_t = scale (softmax(z_t) - onehot(y_t)) / n_i, 0 at ignored positions
 *   dW += ln^T dz; dln = dz W^T; LayerNorm backward into dx, dg, db.
 * Scratch per sample: ln [s,h], dln [s,h], mean [s], rstd [s], dz [s,V].
 */
double lm_head_loss(const sp_opshape_t *s, int n, const float *p, const float *x,
		    const int32_t *targets, double scale, float *dx, float *dp,
		    float *saved)
{
	int64_t h = s->hidden, sq = s->seq, V = s->vocab;
	int64_t per = 2 * sq * h + 2 * sq + sq * V;
	const float *lng = p, *lnb = p + h, *w = p + 2 * h;
	float *dg = dp, *db = dp + h, *dw = dp + 2 * h;
	double total = 0;

	for (int64_t i = 0; i < n; i++) {
		float *ln = saved + i * per, *dln = ln + sq * h, *mean = dln + sq * h;
		float *rstd = mean + sq, *z = rstd + sq;
		const float *xi = x + i * sq * h;
		const int32_t *yi = targets + i * sq;
		int64_t cnt = 0;
		for (int64_t t = 0; t < sq; t++) {
			assert(yi[t] < V);
			cnt += yi[t] >= 0;
		}
		if (cnt == 0)
			continue;
		ly_ln_rows(ln, mean, rstd, xi, sq, h, lng, lnb);
		ly_gemm(0, 0, sq, V, h, 1.0f, ln, h, w, V, 0.0f, z, V);

		double li = 0, coef = scale / (double)cnt;
		for (int64_t t = 0; t < sq; t++) {
			float *zt = z + t * V;
			if (yi[t] < 0) {
				memset(zt, 0, (size_t)V * sizeof *zt);
				continue;
			}
			double lse = ly_logsumexp(zt, V);
			li += lse - zt[yi[t]];
			for (int64_t k = 0; k < V; k++)
				zt[k] = (float)(coef * exp((double)zt[k] - lse));
			zt[yi[t]] -= (float)coef;
		}
		total += li / (double)cnt;

		ly_gemm(1, 0, h, V, sq, 1.0f, ln, h, z, V, 1.0f, dw, V);
		ly_gemm(0, 1, sq, h, V, 1.0f, z, V, w, V, 0.0f, dln, h);
		ly_ln_rows_bwd(dx + i * sq * h, dg, db, dln, xi, mean, rstd, lng, sq, h);
	}
	return total;
}

/*
 * On token 0 of each sample: z = LN(x0) W + b,
 *   loss_i = logsumexp(z_i) - z_i[label_i];  dz_i = scale (softmax(z_i) - onehot)
 * A negative label leaves the sample out (loss 0, no gradient).
 * Scratch per sample (stride 2h + 2 + C): ln [h], dln [h], mean, rstd, dz [C].
 */
void classifier_logits(const sp_opshape_t *s, int n, int64_t seq_in, const float *p,
		       const float *x, float *saved)
{
	int64_t h = s->hidden, C = s->classes, per = 2 * h + 2 + C, ldx = seq_in * h;
	const float *lng = p, *lnb = p + h, *w = p + 2 * h, *b = w + h * C;
	for (int64_t i = 0; i < n; i++) {
		float *sv = saved + i * per;
		ln_row(sv, sv + 2 * h, sv + 2 * h + 1, x + i * ldx, h, lng, lnb);
		memcpy(sv + 2 * h + 2, b, (size_t)C * sizeof *sv);
	}
	ly_gemm(0, 0, n, C, h, 1.0f, saved, per, w, C, 1.0f, saved + 2 * h + 2, per);
}

double classifier_loss(const sp_opshape_t *s, int n, int64_t seq_in, const float *p,
		       const float *x, const int32_t *labels, double scale, float *dx,
		       float *dp, float *saved)
{
	int64_t h = s->hidden, C = s->classes, per = 2 * h + 2 + C, ldx = seq_in * h;
	const float *lng = p, *w = p + 2 * h;
	float *dg = dp, *dlb = dp + h, *dw = dp + 2 * h, *db = dw + h * C;
	double total = 0;

	classifier_logits(s, n, seq_in, p, x, saved);
	for (int64_t i = 0; i < n; i++) {
		float *z = saved + i * per + 2 * h + 2;
		int32_t y = labels[i];
		assert(y < C);
		if (y < 0) {
			memset(z, 0, (size_t)C * sizeof *z);
			continue;
		}
		double lse = ly_logsumexp(z, C);
		total += lse - z[y];
		for (int64_t k = 0; k < C; k++)
			z[k] = (float)(scale * exp((double)z[k] - lse));
		z[y] -= (float)scale;
	}

	ly_gemm(1, 0, h, C, n, 1.0f, saved, per, saved + 2 * h + 2, per, 1.0f, dw, C);
	ly_sum_rows(db, saved + 2 * h + 2, n, C, per);
	ly_gemm(0, 1, n, h, C, 1.0f, saved + 2 * h + 2, per, w, C, 0.0f, saved + h, per);
	for (int64_t i = 0; i < n; i++) {
		const float *sv = saved + i * per;
		if (labels[i] < 0)
			continue;
		ln_row_bwd(dx + i * ldx, dg, dlb, sv + h, x + i * ldx, sv[2 * h],
			   sv[2 * h + 1], lng, h);
	}
	return total;
}

/*
 * Symmetric InfoNCE. With u_i = a_i/|a_i|, v_j = b_j/|b_j| (norms clamped
 * at 1e-12), S = U V^T / tau, r_i = logsumexp_j S_ij, c_j = logsumexp_i S_ij:
 *   loss_i = (r_i - S_ii + c_i - S_ii) / 2
 *   G_ij = dL/dS_ij = scale ((e^{S_ij - r_i} + e^{S_ij - c_j}) / 2 - [i = j])
 *   du_i = (1/tau) sum_j G_ij v_j,   dv_j = (1/tau) sum_i G_ij u_i
 *   da_i = (du_i - u_i (u_i . du_i)) / |a_i|,  u_i . du_i = sum_j G_ij S_ij
 * and likewise db_j with column sums. Scratch (B samples' worth):
 * U [B,w], V [B,w], |a| [B], |b| [B], G_ij/(tau |a_i|) [B,B],
 * G_ij/(tau |b_j|) [B,B].
 */
void contrastive_scores(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
			double temperature, const float *a, const float *b, float *saved)
{
	int64_t lda = seq_a * w, ldb = seq_b * w;
	float *an = saved, *bn = an + B * w, *na = bn + B * w, *nb = na + B;
	for (int64_t i = 0; i < B; i++) {
		const float *src[2] = {a + i * lda, b + i * ldb};
		float *dst[2] = {an + i * w, bn + i * w}, *nrm[2] = {na + i, nb + i};
		for (int u = 0; u < 2; u++) {
			double ss = 0;
			for (int64_t k = 0; k < w; k++)
				ss += (double)src[u][k] * src[u][k];
			double nv = sqrt(ss), d = clamp_norm(nv);
			for (int64_t k = 0; k < w; k++)
				dst[u][k] = (float)(src[u][k] / d);
			*nrm[u] = (float)nv;
		}
	}
	ly_gemm(0, 1, B, B, w, (float)(1.0 / temperature), an, w, bn, w, 0.0f, nb + B, B);
}

double contrastive_loss(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
			double temperature, int64_t s0, int64_t s1, const float *a,
			const float *b, double scale, float *da, float *db, float *saved)
{
	int64_t lda = seq_a * w, ldb = seq_b * w;
	float *an = saved, *bn = an + B * w, *na = bn + B * w, *nb = na + B;
	float *pa = nb + B, *pb = pa + B * B;
	double inv_t = 1.0 / temperature;
	assert(0 <= s0 && s0 <= s1 && s1 <= B);

	contrastive_scores(B, w, seq_a, seq_b, temperature, a, b, saved);
	/* r [B], c [B], sum_j G_ij S_ij [B], sum_i G_ij S_ij [B] */
	double *r = ly_xmalloc((size_t)(4 * B) * sizeof *r);
	double *c = r + B, *dota = c + B, *dotb = dota + B;
	for (int64_t i = 0; i < B; i++)
		r[i] = ly_logsumexp(pa + i * B, B);
	for (int64_t j = 0; j < B; j++) {
		double mx = -INFINITY, sum = 0;
		for (int64_t i = 0; i < B; i++)
			mx = pa[i * B + j] > mx ? pa[i * B + j] : mx;
		for (int64_t i = 0; i < B; i++)
			sum += exp((double)pa[i * B + j] - mx);
		c[j] = mx + log(sum);
		dotb[j] = 0;
	}
	double total = 0;
	for (int64_t i = s0; i < s1; i++)
		total += 0.5 * (r[i] + c[i]) - pa[i * B + i];

	for (int64_t i = 0; i < B; i++) {
		double ca = inv_t / clamp_norm(na[i]);
		dota[i] = 0;
		for (int64_t j = 0; j < B; j++) {
			double sij = pa[i * B + j];
			double gij = 0.5 * (exp(sij - r[i]) + exp(sij - c[j])) - (i == j);
			gij *= scale;
			dota[i] += gij * sij;
			dotb[j] += gij * sij;
			pa[i * B + j] = (float)(gij * ca);
			pb[i * B + j] = (float)(gij * inv_t / clamp_norm(nb[j]));
		}
	}

	ly_gemm(0, 0, s1 - s0, w, B, 1.0f, pa + s0 * B, B, bn, w, 1.0f, da + s0 * lda, lda);
	ly_gemm(1, 0, s1 - s0, w, B, 1.0f, pb + s0, B, an, w, 1.0f, db + s0 * ldb, ldb);
	for (int64_t i = s0; i < s1; i++) {
		if (na[i] > NORM_EPS) {
			float ca = (float)(dota[i] / na[i]);
			for (int64_t k = 0; k < w; k++)
				da[i * lda + k] -= ca * an[i * w + k];
		}
		if (nb[i] > NORM_EPS) {
			float cb = (float)(dotb[i] / nb[i]);
			for (int64_t k = 0; k < w; k++)
				db[i * ldb + k] -= cb * bn[i * w + k];
		}
	}
	free(r);
	return total;
}

/* ---- optimizer ------------------------------------------------------------ */

/*
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
 * p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
 */
void adamw_step(float *p, const float *g, float *m, float *v, int64_t n, int t,
		const sp_optim_t *o)
{
	double b1 = o->beta1, b2 = o->beta2;
	double c1 = 1.0 - pow(b1, t), c2 = 1.0 - pow(b2, t);
	for (int64_t k = 0; k < n; k++) {
		double mk = b1 * m[k] + (1.0 - b1) * g[k];
		double vk = b2 * v[k] + (1.0 - b2) * (double)g[k] * g[k];
		m[k] = (float)mk;
		v[k] = (float)vk;
		double upd =
			(mk / c1) / (sqrt(vk / c2) + o->eps) + o->weight_decay * p[k];
		p[k] = (float)(p[k] - o->lr * upd);
	}
}

/* p -= lr (g + wd p) */
void sgd_step(float *p, const float *g, int64_t n, const sp_optim_t *o)
{
	for (int64_t k = 0; k < n; k++)
		p[k] = (float)(p[k] - o->lr * (g[k] + o->weight_decay * p[k]));
}
