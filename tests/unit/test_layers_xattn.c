/*
 * test_layers_xattn.c — unit tests of the CPU cross-attention decoder
 * block (runtime/layers_xattn.c): its backward against central finite
 * differences of its forward, for x, the memory and each of the 20
 * parameter tensors by name, causal and not, with a memory shorter and
 * longer than the sequence and narrower than the hidden width; its
 * forward against a naive double-precision version written from the
 * definition; its saved activations against op_saved_elems and a hand
 * count; its tensor table and initialisation; what it refuses.
 * It does not test the runtime's use of the block (there is none yet).
 * Shapes are tiny (hidden 8, heads 2, ffn 12, seq 5, memory 3 or 7 tokens
 * of width 6, n 2), so the file runs in well under a second.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "layer_check.h"
#include "layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 8, A = 2, F = 12, S = 5, W = 6, N = 2, MMAX = 7 };

/* ---- one decoder layer on random data: objective sum(y * r) ---------------- */

typedef struct {
	sp_opshape_t s;
	sp_component_t c;
	float *p, *buf; /* buf: x, mem, r, y, then saved (last, for ASan) */
	float *x, *mem, *y, *r, *saved;
	int64_t np, nx, nm, nsaved;
} xcase_t;

static xcase_t xcase(int causal, int64_t m)
{
	xcase_t k;
	memset(&k, 0, sizeof k);
	k.s.type = COMP_TRANSFORMER;
	k.s.hidden = H;
	k.s.heads = A;
	k.s.ffn = F;
	k.s.seq = S;
	k.s.causal = causal;
	k.s.mem_seq = m;
	k.s.mem_width = W;
	k.c = layer_comp_of_shape(&k.s);
	snprintf(k.c.name, sizeof k.c.name, "decoder");
	k.p = random_params(&k.c, &k.np);
	k.nx = (int64_t)N * S * H;
	k.nm = N * m * W;
	k.nsaved = N * op_saved_elems(&k.s, N);
	k.buf = falloc(3 * k.nx + k.nm + k.nsaved);
	k.x = fill(k.buf, k.nx, -1.0, 1.0);
	k.mem = fill(k.x + k.nx, k.nm, -1.0, 1.0);
	k.r = fill(k.mem + k.nm, k.nx, -1.0, 1.0);
	k.y = k.r + k.nx;
	k.saved = k.y + k.nx;
	return k;
}

static void xcase_free(xcase_t *k)
{
	free(k->p);
	free(k->buf);
}

static void xfwd(xcase_t *k)
{
	assert_int_equal(xblock_fwd(&k->s, NULL, N, k->p, k->x, k->mem, k->y, k->saved), 0);
}

static double xobj(void *ctx)
{
	xcase_t *k = ctx;
	xfwd(k);
	return dot(k->y, k->r, k->nx);
}

/* ---- gradients against finite differences ---------------------------------- */

static void check_grads(int causal, int64_t m)
{
	xcase_t k = xcase(causal, m);
	float *dp = falloc(k.np), *dx = falloc(k.nx), *dmem = falloc(k.nm);
	xfwd(&k);
	assert_int_equal(
		xblock_bwd(&k.s, NULL, N, k.p, k.saved, k.mem, k.r, dx, dmem, dp), 0);
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(&k.c, t), bad = 0;
	char what[64];
	for (int i = 0; i < nt; i++) {
		snprintf(what, sizeof what, "causal %d m %lld d%s", causal, (long long)m,
			 t[i].name);
		bad += check_fd(what, xobj, &k, k.p + t[i].offset, dp + t[i].offset,
				t[i].rows * t[i].cols, 1e-2);
	}
	snprintf(what, sizeof what, "causal %d m %lld dx", causal, (long long)m);
	bad += check_fd(what, xobj, &k, k.x, dx, k.nx, 1e-2);
	snprintf(what, sizeof what, "causal %d m %lld dmemory", causal, (long long)m);
	bad += check_fd(what, xobj, &k, k.mem, dmem, k.nm, 1e-2);
	free(dp);
	free(dx);
	free(dmem);
	xcase_free(&k);
	assert_int_equal(bad, 0);
}

static void test_grad_short_memory(void **state)
{
	(void)state;
	check_grads(0, 3);
}

static void test_grad_long_memory_causal(void **state)
{
	(void)state;
	check_grads(1, MMAX);
}

/* A second backward adds the same amounts again (callers zero once). */
static void test_backward_accumulates(void **state)
{
	(void)state;
	xcase_t k = xcase(1, 3);
	float *g1 = falloc(k.np + k.nx + k.nm), *g2 = falloc(k.np + k.nx + k.nm);
	xfwd(&k);
	for (int rep = 0; rep < 3; rep++) {
		float *g = rep == 0 ? g1 : g2;
		xblock_bwd(&k.s, NULL, N, k.p, k.saved, k.mem, k.r, g + k.np, g + k.np + k.nx,
			   g);
	}
	int64_t total = k.np + k.nx + k.nm, bad = 0;
	for (int64_t i = 0; i < total; i++)
		bad += !(fabs(g2[i] - 2.0 * g1[i]) <= 1e-5 * (1.0 + fabs(g1[i])));
	if (bad)
		fprintf(stderr, "%lld of %lld gradients not doubled\n", (long long)bad,
			(long long)total);
	assert_int_equal(bad, 0);
	free(g1);
	free(g2);
	xcase_free(&k);
}

/* ---- forward against a naive double version ---------------------------------- */

/* y [rows][cols] = b + x w, x [rows][k] in double, w [k][cols]. */
static void naive_affine(double *y, const double *x, int rows, int k, const float *w,
			 const float *b, int cols)
{
	for (int r = 0; r < rows; r++)
		for (int o = 0; o < cols; o++) {
			double acc = b[o];
			for (int i = 0; i < k; i++)
				acc += x[r * k + i] * w[i * cols + o];
			y[r * cols + o] = acc;
		}
}

/* LayerNorm of rows of width H: var = E[x^2] - E[x]^2 (biased), eps 1e-5. */
static void naive_norm(double *y, const double *x, int rows, const float *g, const float *b)
{
	for (int r = 0; r < rows; r++) {
		const double *xr = x + r * H;
		double s1 = 0, s2 = 0;
		for (int i = 0; i < H; i++) {
			s1 += xr[i];
			s2 += xr[i] * xr[i];
		}
		double mu = s1 / H, inv = 1.0 / sqrt(s2 / H - mu * mu + 1e-5);
		for (int i = 0; i < H; i++)
			y[r * H + i] = g[i] * (xr[i] - mu) * inv + b[i];
	}
}

/*
 * out [S][H] = concat over heads of softmax(q k^T / sqrt(H/A)) v, queries
 * q [S][ldq], keys k and values v [sk][ldkv]; causal: query i sees keys
 * j <= i.
 */
static void naive_heads(double *out, const double *q, int ldq, const double *k,
			const double *v, int ldkv, int sk, int causal)
{
	int dh = H / A;
	for (int hd = 0; hd < A; hd++)
		for (int i = 0; i < S; i++) {
			double e[MMAX] = {0}, z = 0, top = -INFINITY;
			int seen = causal ? i + 1 : sk;
			for (int j = 0; j < seen; j++) {
				double qk = 0;
				for (int d = 0; d < dh; d++)
					qk += q[i * ldq + hd * dh + d] * k[j * ldkv + hd * dh + d];
				e[j] = qk / sqrt((double)dh);
				top = fmax(top, e[j]);
			}
			for (int j = 0; j < seen; j++)
				z += e[j] = exp(e[j] - top);
			for (int d = 0; d < dh; d++) {
				double acc = 0;
				for (int j = 0; j < seen; j++)
					acc += e[j] / z * v[j * ldkv + hd * dh + d];
				out[i * H + hd * dh + d] = acc;
			}
		}
}

/* y += x W + b, both [S][H], W [H][H]: a residual projection. */
static void naive_residual(double *y, const double *x, const float *w, const float *b)
{
	double proj[S * H];
	naive_affine(proj, x, S, H, w, b, H);
	for (int i = 0; i < S * H; i++)
		y[i] += proj[i];
}

/*
 * One sample of the decoder layer from its definition (layers.h), with
 * the parameter offsets counted by hand from the documented order.
 */
static void naive_xblock(double *y, const float *p, const float *x, const float *mem,
			 int m, int causal)
{
	const float *ln1g = p, *ln1b = ln1g + H, *wqkv = ln1b + H, *bqkv = wqkv + H * 3 * H;
	const float *wo = bqkv + 3 * H, *bo = wo + H * H, *ln2g = bo + H, *ln2b = ln2g + H;
	const float *w1 = ln2b + H, *b1 = w1 + H * F, *w2 = b1 + F, *b2 = w2 + F * H;
	const float *lncg = b2 + H, *lncb = lncg + H, *wq = lncb + H, *bq = wq + H * H;
	const float *wkv = bq + H, *bkv = wkv + W * 2 * H, *woc = bkv + 2 * H;
	const float *boc = woc + H * H;
	double h[S * H], n[S * H], qkv[S * 3 * H], att[S * H], q[S * H];
	double mm[MMAX * W], kv[MMAX * 2 * H], u[S * F];
	for (int i = 0; i < S * H; i++)
		h[i] = x[i];
	for (int i = 0; i < m * W; i++)
		mm[i] = mem[i];

	naive_norm(n, h, S, ln1g, ln1b); /* self-attention */
	naive_affine(qkv, n, S, H, wqkv, bqkv, 3 * H);
	naive_heads(att, qkv, 3 * H, qkv + H, qkv + 2 * H, 3 * H, S, causal);
	naive_residual(h, att, wo, bo);

	naive_norm(n, h, S, lncg, lncb); /* cross-attention, no mask */
	naive_affine(q, n, S, H, wq, bq, H);
	naive_affine(kv, mm, m, W, wkv, bkv, 2 * H);
	naive_heads(att, q, H, kv, kv + H, 2 * H, m, 0);
	naive_residual(h, att, woc, boc);

	naive_norm(n, h, S, ln2g, ln2b); /* MLP */
	naive_affine(u, n, S, H, w1, b1, F);
	for (int i = 0; i < S * F; i++)
		u[i] = 0.5 * u[i] *
		       (1 + tanh(sqrt(2 / M_PI) * (u[i] + 0.044715 * u[i] * u[i] * u[i])));
	naive_affine(y, u, S, F, w2, b2, H);
	for (int i = 0; i < S * H; i++)
		y[i] += h[i];
}

static void test_matches_naive(void **state)
{
	(void)state;
	int64_t ms[] = {3, MMAX};
	for (int causal = 0; causal < 2; causal++)
		for (int im = 0; im < 2; im++) {
			xcase_t k = xcase(causal, ms[im]);
			xfwd(&k);
			double ref[S * H], mx = 0;
			for (int i = 0; i < N; i++) {
				naive_xblock(ref, k.p, k.x + i * S * H, k.mem + i * ms[im] * W,
					     (int)ms[im], causal);
				for (int j = 0; j < S * H; j++)
					mx = fmax(mx, fabs(ref[j] - k.y[i * S * H + j]));
			}
			if (mx > 1e-4)
				fprintf(stderr, "decoder causal %d m %lld: max diff %.3g\n",
					causal, (long long)ms[im], mx);
			assert_true(mx <= 1e-4);
			xcase_free(&k);
		}
}

/* The memory reaches every token, also under a causal mask. */
static void test_memory_reaches_every_token(void **state)
{
	(void)state;
	xcase_t k = xcase(1, 3);
	xfwd(&k);
	float *y0 = falloc(k.nx);
	memcpy(y0, k.y, (size_t)k.nx * sizeof *y0);
	for (int j = 0; j < W; j++)
		k.mem[2 * W + j] += 0.5f; /* sample 0's last memory token */
	xfwd(&k);
	for (int t = 0; t < S; t++)
		assert_true(memcmp(y0 + t * H, k.y + t * H, H * sizeof *y0) != 0);
	assert_memory_equal(y0 + S * H, k.y + S * H, S * H * sizeof *y0); /* sample 1 */
	free(y0);
	xcase_free(&k);
}

/* ---- saved activations, tensors, refusals ------------------------------------ */

/*
 * Every one of op_saved_elems floats per sample is written and nothing
 * after them; the count is the block's plus the cross-attention's terms
 * of arith.c counted here by hand.
 */
static void test_saved_elems(void **state)
{
	(void)state;
	enum { GUARD = 32 };
	xcase_t k = xcase(0, MMAX);
	int64_t per = op_saved_elems(&k.s, N), m = MMAX;
	int64_t hand = (8 * S * H + 2 * S * F + A * S * S + 4 * S) +
		       (4 * S * H + 2 * m * H + A * S * m + 2 * S);
	assert_int_equal(per, hand);
	float *sv = falloc(N * per + GUARD);
	for (int64_t i = 0; i < N * per + GUARD; i++)
		sv[i] = NAN;
	assert_int_equal(xblock_fwd(&k.s, NULL, N, k.p, k.x, k.mem, k.y, sv), 0);
	int64_t unwritten = 0;
	for (int64_t i = 0; i < N * per; i++)
		unwritten += isnan(sv[i]);
	for (int64_t i = N * per; i < N * per + GUARD; i++)
		assert_true(isnan(sv[i]));
	assert_int_equal(unwritten, 0);
	free(sv);
	xcase_free(&k);
}

static void test_tensors_and_init(void **state)
{
	(void)state;
	xcase_t k = xcase(0, 3);
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(&k.c, t);
	assert_int_equal(nt, 20);
	assert_string_equal(t[12].name, "lnc_g");
	assert_string_equal(t[16].name, "w_kv");
	assert_int_equal(t[16].rows, W);
	assert_int_equal(t[16].cols, 2 * H);
	assert_int_equal(t[nt - 1].offset + t[nt - 1].rows * t[nt - 1].cols,
			 comp_layer_params(&k.c));
	/* not split yet: a t-way table leaves the cross-attention out, as arith.c */
	nt = layer_tensors_tp(&k.c, 2, t);
	assert_int_equal(nt, 12);
	assert_int_equal(t[nt - 1].offset + t[nt - 1].rows * t[nt - 1].cols,
			 comp_layer_params_tp(&k.c, 2));

	float *p = falloc(k.np);
	layer_init(p, &k.c, 1, 7);
	nt = layer_tensors(&k.c, t);
	for (int i = 12; i < nt; i++) {
		const float *q = p + t[i].offset;
		int64_t n = t[i].rows * t[i].cols;
		double want = strcmp(t[i].name, "lnc_g") == 0 ? 1.0 : 0.0;
		int matrix = t[i].name[0] == 'w';
		double sq = 0;
		for (int64_t j = 0; j < n; j++) {
			if (!matrix)
				assert_true(q[j] == (float)want);
			sq += (double)q[j] * q[j];
		}
		if (matrix) /* uniform of std 0.02 (layers.c's INIT_STD) */
			assert_true(fabs(sqrt(sq / (double)n) - 0.02) < 0.01);
	}
	free(p);
	xcase_free(&k);
}

static int refuse_ar(void *ctx, float *buf, int64_t n)
{
	(void)ctx;
	(void)buf;
	(void)n;
	return 0;
}

static void test_refusals(void **state)
{
	(void)state;
	xcase_t k = xcase(0, 3);
	rt_tp_t tp = {.t = 2, .rank = 0, .allreduce = refuse_ar};
	float *dx = falloc(k.nx), *dmem = falloc(k.nm), *dp = falloc(k.np);
	assert_int_equal(xblock_fwd(&k.s, &tp, N, k.p, k.x, k.mem, k.y, k.saved), SP_EINPUT);
	assert_int_equal(xblock_bwd(&k.s, &tp, N, k.p, k.saved, k.mem, k.r, dx, dmem, dp),
			 SP_EINPUT);
	tp.t = 0;
	assert_int_equal(xblock_fwd(&k.s, &tp, N, k.p, k.x, k.mem, k.y, k.saved), SP_EINPUT);
	tp.t = 1; /* a one-member group is the whole layer */
	assert_int_equal(xblock_fwd(&k.s, &tp, N, k.p, k.x, k.mem, k.y, k.saved), 0);
	/* the transformer block does not ignore a memory silently */
	assert_int_equal(tblock_fwd(&k.s, NULL, N, k.p, k.x, k.y, k.saved), SP_EINPUT);
	sp_opshape_t plain = k.s;
	plain.mem_seq = 0;
	plain.mem_width = 0;
	memset(k.y, 0, (size_t)k.nx * sizeof *k.y);
	assert_int_equal(xblock_fwd(&plain, NULL, N, k.p, k.x, k.mem, k.y, k.saved),
			 SP_EINPUT);
	for (int64_t i = 0; i < k.nx; i++)
		assert_true(k.y[i] == 0.0f);
	free(dx);
	free(dmem);
	free(dp);
	xcase_free(&k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensors_and_init),
		cmocka_unit_test(test_saved_elems),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_matches_naive),
		cmocka_unit_test(test_memory_reaches_every_token),
		cmocka_unit_test(test_grad_short_memory),
		cmocka_unit_test(test_grad_long_memory_causal),
		cmocka_unit_test(test_backward_accumulates),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
