/*
 * test_layers.c — unit tests of the fp32 CPU reference layers: every
 * backward against central finite differences of its forward, the
 * transformer forward against a naive double-precision version, saved
 * sizes against arith.c, loss values with known answers, accumulation
 * into gradients, initialisation and the optimizer steps.
 * Shapes are tiny (hidden 8, heads 2, ffn 16, seq 5, n 3) so the whole
 * file runs in well under a second.
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

enum { H = 8, A = 2, F = 16, S = 5, N = 3, V = 11, IN = 6, OUT = 7, C = 4 };

/* ---- helpers (and layer_check.h) ------------------------------------------ */

/* Doubles within tol; prints both on failure (cmocka's float compare is fp32). */
static int close_to(double a, double b, double tol, const char *expr, int line)
{
	if (fabs(a - b) <= tol)
		return 1;
	fprintf(stderr, "line %d: %s: %.10g vs %.10g (tol %.3g)\n", line, expr, a, b,
		tol);
	return 0;
}
#define assert_close(a, b, tol) assert_true(close_to((a), (b), (tol), #a, __LINE__))

static sp_opshape_t shape_of(sp_comp_type_t t)
{
	sp_opshape_t s;
	memset(&s, 0, sizeof s);
	s.type = t;
	s.seq = S;
	switch (t) {
	case COMP_EMBEDDING:
		s.hidden = H;
		s.vocab = V;
		break;
	case COMP_PATCH:
		s.hidden = H;
		s.in = IN;
		break;
	case COMP_TRANSFORMER:
		s.hidden = H;
		s.heads = A;
		s.ffn = F;
		break;
	case COMP_LINEAR:
		s.in = IN;
		s.out = OUT;
		break;
	case COMP_LM_HEAD:
		s.hidden = H;
		s.vocab = V;
		break;
	case COMP_CLASSIFIER:
		s.seq = 0;
		s.hidden = H;
		s.classes = C;
		break;
	case COMP_CONTRASTIVE:
		s.seq = 0;
		s.hidden = H;
		break;
	case COMP__COUNT: break;
	}
	return s;
}

static sp_component_t comp_from(const sp_opshape_t *s, const char *name)
{
	sp_component_t c;
	memset(&c, 0, sizeof c);
	snprintf(c.name, sizeof c.name, "%s", name);
	c.type = s->type;
	c.vocab = s->vocab;
	c.hidden = s->hidden;
	c.max_seq = s->seq + 3;
	c.in = s->in;
	c.out = s->out;
	c.layers = 2;
	c.heads = s->heads;
	c.ffn = s->ffn;
	c.classes = s->classes;
	c.causal = s->causal;
	c.temperature = 0.1;
	return c;
}

/* ---- forward layers: objective sum(y * r) --------------------------------- */

typedef struct {
	sp_opshape_t s;
	int n;
	float *p, *x, *y, *saved, *r;
	int32_t *tok;
	int64_t np, nx, ny, nsaved;
} fwd_case_t;

static void fwd_run(fwd_case_t *c)
{
	switch (c->s.type) {
	case COMP_EMBEDDING:
		embedding_fwd(&c->s, c->n, c->p, c->tok, c->y, c->saved);
		break;
	case COMP_PATCH: patch_fwd(&c->s, c->n, c->p, c->x, c->y, c->saved); break;
	case COMP_TRANSFORMER: tblock_fwd(&c->s, NULL, c->n, c->p, c->x, c->y, c->saved); break;
	case COMP_LINEAR: linear_fwd(&c->s, c->n, c->p, c->x, c->y, c->saved); break;
	default: fail_msg("not a forward layer");
	}
}

static void bwd_run(fwd_case_t *c, const float *dy, float *dx, float *dp)
{
	switch (c->s.type) {
	case COMP_EMBEDDING: embedding_bwd(&c->s, c->n, c->saved, dy, dp); break;
	case COMP_PATCH: patch_bwd(&c->s, c->n, c->p, c->saved, dy, dp); break;
	case COMP_TRANSFORMER: tblock_bwd(&c->s, NULL, c->n, c->p, c->saved, dy, dx, dp); break;
	case COMP_LINEAR: linear_bwd(&c->s, c->n, c->p, c->saved, dy, dx, dp); break;
	default: fail_msg("not a forward layer");
	}
}

static double fwd_obj(void *ctx)
{
	fwd_case_t *c = ctx;
	fwd_run(c);
	return dot(c->y, c->r, c->ny);
}

static fwd_case_t fwd_case(sp_comp_type_t type, int causal)
{
	fwd_case_t c;
	memset(&c, 0, sizeof c);
	c.s = shape_of(type);
	c.s.causal = causal;
	c.n = N;
	sp_component_t comp = comp_from(&c.s, "blk");
	c.p = random_params(&comp, &c.np);
	int64_t width = type == COMP_LINEAR ? IN : type == COMP_PATCH ? IN : H;
	c.nx = (int64_t)N * S * width;
	c.ny = (int64_t)N * S * (type == COMP_LINEAR ? OUT : H);
	c.nsaved = N * op_saved_elems(&c.s, N);
	c.x = fill(falloc(c.nx), c.nx, -1.0, 1.0);
	c.y = falloc(c.ny);
	c.r = fill(falloc(c.ny), c.ny, -1.0, 1.0);
	c.saved = falloc(c.nsaved);
	if (type == COMP_EMBEDDING) {
		c.tok = calloc(N * S, sizeof *c.tok);
		assert_non_null(c.tok);
		/* token 3 repeats so its table row sums several contributions */
		for (int i = 0; i < N * S; i++)
			c.tok[i] = i % 4 == 0 ? 3 : (int32_t)((i * 7) % V);
	}
	return c;
}

static void fwd_case_free(fwd_case_t *c)
{
	free(c->p);
	free(c->x);
	free(c->y);
	free(c->r);
	free(c->saved);
	free(c->tok);
}

static void check_fwd_layer(sp_comp_type_t type, int causal, const char *name)
{
	fwd_case_t c = fwd_case(type, causal);
	float *dp = falloc(c.np), *dx = falloc(c.nx);
	fwd_run(&c);
	bwd_run(&c, c.r, dx, dp);
	char what[64];
	snprintf(what, sizeof what, "%s dparams", name);
	int bad = check_fd(what, fwd_obj, &c, c.p, dp, c.np, 1e-2);
	if (!comp_is_source(type)) {
		snprintf(what, sizeof what, "%s dx", name);
		bad += check_fd(what, fwd_obj, &c, c.x, dx, c.nx, 1e-2);
	}
	free(dp);
	free(dx);
	fwd_case_free(&c);
	assert_int_equal(bad, 0);
}

static void test_grad_embedding(void **state)
{
	(void)state;
	check_fwd_layer(COMP_EMBEDDING, 0, "embedding");
}

/* embedding_fwd's row is the token row plus the position row, each
 * element one float addition (the split layer's all-reduce relies on
 * it), also where the width is no multiple of the 8-float blocks. */
static void test_embedding_sum(void **state)
{
	(void)state;
	enum { EH = 13, ES = 3, EV = 5, EN = 2 };
	sp_opshape_t s = {.type = COMP_EMBEDDING, .hidden = EH, .seq = ES, .vocab = EV};
	float p[(EV + ES) * EH], y[EN * ES * EH], saved[EN * ES];
	int32_t tok[EN * ES] = {4, 0, 2, 2, 3, 4};
	for (int i = 0; i < (EV + ES) * EH; i++)
		p[i] = (float)urand(-1, 1);
	embedding_fwd(&s, EN, p, tok, y, saved);
	int bad = 0;
	for (int r = 0; r < EN * ES; r++)
		for (int k = 0; k < EH; k++) {
			float want = p[tok[r] * EH + k] + p[(EV + r % ES) * EH + k];
			if (memcmp(&want, &y[r * EH + k], sizeof want) != 0 && bad++ < 3)
				print_message("row %d element %d: got %.9g, want %.9g\n", r, k,
					      (double)y[r * EH + k], (double)want);
		}
	assert_int_equal(bad, 0);
	for (int r = 0; r < EN * ES; r++)
		assert_true(saved[r] == (float)tok[r]);
}

static void test_grad_patch(void **state)
{
	(void)state;
	check_fwd_layer(COMP_PATCH, 0, "patch");
}

static void test_grad_tblock(void **state)
{
	(void)state;
	check_fwd_layer(COMP_TRANSFORMER, 0, "transformer");
}

static void test_grad_tblock_causal(void **state)
{
	(void)state;
	check_fwd_layer(COMP_TRANSFORMER, 1, "transformer causal");
}

static void test_grad_linear(void **state)
{
	(void)state;
	check_fwd_layer(COMP_LINEAR, 0, "linear");
}

/* ---- losses: objective scale * returned loss ------------------------------- */

typedef struct {
	sp_opshape_t s;
	int n;
	int64_t seq_in, np, nx;
	float *p, *x, *dx, *dp, *saved;
	int32_t *tgt;
	double scale;
	/* contrastive */
	int64_t B, w, seq_a, seq_b, s0, s1;
	double temp;
	float *b, *db;
} loss_case_t;

static double loss_run(loss_case_t *c, float *dx, float *db, float *dp)
{
	switch (c->s.type) {
	case COMP_LM_HEAD:
		return lm_head_loss(&c->s, c->n, c->p, c->x, c->tgt, c->scale, dx, dp,
				    c->saved);
	case COMP_CLASSIFIER:
		return classifier_loss(&c->s, c->n, c->seq_in, c->p, c->x, c->tgt,
				       c->scale, dx, dp, c->saved);
	case COMP_CONTRASTIVE:
		return contrastive_loss(c->B, c->w, c->seq_a, c->seq_b, c->temp, c->s0,
					c->s1, c->x, c->b, c->scale, dx, db, c->saved);
	default: fail_msg("not a loss");
	}
	return 0;
}

static double loss_obj(void *ctx)
{
	loss_case_t *c = ctx;
	return c->scale * loss_run(c, c->dx, c->db, c->dp);
}

static loss_case_t loss_case(sp_comp_type_t type)
{
	loss_case_t c;
	memset(&c, 0, sizeof c);
	c.s = shape_of(type);
	c.scale = 0.7;
	if (type == COMP_CONTRASTIVE) {
		c.B = 5;
		c.n = 5;
		c.w = H;
		c.seq_a = 2;
		c.seq_b = 3;
		c.s0 = 0;
		c.s1 = c.B;
		c.temp = 0.5;
		c.nx = c.B * c.seq_a * c.w;
		c.x = fill(falloc(c.nx), c.nx, -1.0, 1.0);
		c.b = fill(falloc(c.B * c.seq_b * c.w), c.B * c.seq_b * c.w, -1.0, 1.0);
		c.dx = falloc(c.nx);
		c.db = falloc(c.B * c.seq_b * c.w);
		c.saved = falloc(c.B * op_saved_elems(&c.s, c.B));
		return c;
	}
	sp_component_t comp = comp_from(&c.s, "head");
	c.p = random_params(&comp, &c.np);
	c.dp = falloc(c.np);
	if (type == COMP_LM_HEAD) {
		c.n = N;
		c.nx = (int64_t)N * S * H;
		c.tgt = calloc(N * S, sizeof *c.tgt);
		assert_non_null(c.tgt);
		for (int i = 0; i < N * S; i++)
			c.tgt[i] = (int32_t)((i * 5 + 2) % V);
		c.tgt[1] = -1; /* ignored position: sample 0 averages over 4 */
		c.tgt[S + 4] = -1;
	} else {
		c.n = N + 1;
		c.seq_in = S;
		c.nx = (int64_t)c.n * S * H;
		c.tgt = calloc((size_t)c.n, sizeof *c.tgt);
		assert_non_null(c.tgt);
		for (int i = 0; i < c.n; i++)
			c.tgt[i] = (int32_t)((i * 3 + 1) % C);
		c.tgt[2] = -1; /* left out */
	}
	c.x = fill(falloc(c.nx), c.nx, -1.0, 1.0);
	c.dx = falloc(c.nx);
	c.saved = falloc(c.n * op_saved_elems(&c.s, c.n));
	return c;
}

static void loss_case_free(loss_case_t *c)
{
	free(c->p);
	free(c->x);
	free(c->dx);
	free(c->dp);
	free(c->saved);
	free(c->tgt);
	free(c->b);
	free(c->db);
}

static void check_loss(sp_comp_type_t type, const char *name)
{
	loss_case_t c = loss_case(type);
	float *dx = falloc(c.nx), *dp = falloc(c.np);
	int64_t nb = c.B * c.seq_b * c.w;
	float *db = falloc(nb);
	loss_run(&c, dx, db, dp);
	char what[64];
	int bad = 0;
	if (c.np) {
		snprintf(what, sizeof what, "%s dparams", name);
		bad += check_fd(what, loss_obj, &c, c.p, dp, c.np, 1e-2);
	}
	snprintf(what, sizeof what, "%s dx", name);
	bad += check_fd(what, loss_obj, &c, c.x, dx, c.nx, 1e-2);
	if (nb) {
		snprintf(what, sizeof what, "%s db", name);
		bad += check_fd(what, loss_obj, &c, c.b, db, nb, 1e-2);
	}
	free(dx);
	free(dp);
	free(db);
	loss_case_free(&c);
	assert_int_equal(bad, 0);
}

static void test_grad_lm_head(void **state)
{
	(void)state;
	check_loss(COMP_LM_HEAD, "lm_head");
}

static void test_grad_classifier(void **state)
{
	(void)state;
	check_loss(COMP_CLASSIFIER, "classifier");
}

static void test_grad_contrastive(void **state)
{
	(void)state;
	check_loss(COMP_CONTRASTIVE, "contrastive");
}

/* The checker itself must reject a gradient that is wrong in one element. */
static void test_checker_rejects_wrong_gradient(void **state)
{
	(void)state;
	fwd_case_t c = fwd_case(COMP_LINEAR, 0);
	float *dp = falloc(c.np), *dx = falloc(c.nx);
	fwd_run(&c);
	bwd_run(&c, c.r, dx, dp);
	dp[c.np / 2] *= 1.1f;
	dx[3] += 0.05f;
	fprintf(stderr, "(two mismatches expected below)\n");
	assert_int_equal(check_fd("tampered dparams", fwd_obj, &c, c.p, dp, c.np, 1e-2),
			 1);
	assert_int_equal(check_fd("tampered dx", fwd_obj, &c, c.x, dx, c.nx, 1e-2), 1);
	free(dp);
	free(dx);
	fwd_case_free(&c);
}

/* ---- accumulation: a second backward adds the same gradient again ---------- */

static void assert_doubled(const char *what, const float *once, const float *twice,
			   int64_t n)
{
	int bad = 0;
	double mx = 0;
	for (int64_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(once[i]));
	for (int64_t i = 0; i < n; i++) {
		double d = fabs(twice[i] - 2.0 * once[i]);
		if (d > 1e-5 * mx + 1e-6 * fabs(once[i])) {
			if (bad < 5)
				fprintf(stderr, "  %s[%lld]: once %.7g twice %.7g\n",
					what, (long long)i, (double)once[i],
					(double)twice[i]);
			bad++;
		}
	}
	assert_true(mx > 0);
	assert_int_equal(bad, 0);
}

static void test_backward_accumulates(void **state)
{
	(void)state;
	sp_comp_type_t fwd_types[] = {COMP_EMBEDDING, COMP_PATCH, COMP_TRANSFORMER,
				      COMP_LINEAR};
	for (int k = 0; k < SP_ARRAY_LEN(fwd_types); k++) {
		fwd_case_t c = fwd_case(fwd_types[k], k == 2);
		float *dp1 = falloc(c.np), *dx1 = falloc(c.nx);
		float *dp2 = falloc(c.np), *dx2 = falloc(c.nx);
		fwd_run(&c);
		bwd_run(&c, c.r, dx1, dp1);
		bwd_run(&c, c.r, dx2, dp2);
		bwd_run(&c, c.r, dx2, dp2);
		assert_doubled(comp_type_name(fwd_types[k]), dp1, dp2, c.np);
		if (!comp_is_source(fwd_types[k]))
			assert_doubled(comp_type_name(fwd_types[k]), dx1, dx2, c.nx);
		free(dp1);
		free(dx1);
		free(dp2);
		free(dx2);
		fwd_case_free(&c);
	}
	sp_comp_type_t loss_types[] = {COMP_LM_HEAD, COMP_CLASSIFIER, COMP_CONTRASTIVE};
	for (int k = 0; k < SP_ARRAY_LEN(loss_types); k++) {
		loss_case_t c = loss_case(loss_types[k]);
		int64_t nb = c.B * c.seq_b * c.w;
		float *dx1 = falloc(c.nx), *dp1 = falloc(c.np), *db1 = falloc(nb);
		float *dx2 = falloc(c.nx), *dp2 = falloc(c.np), *db2 = falloc(nb);
		double l1 = loss_run(&c, dx1, db1, dp1);
		double l2 = loss_run(&c, dx2, db2, dp2);
		assert_true(l1 == l2);
		loss_run(&c, dx2, db2, dp2);
		assert_doubled(comp_type_name(loss_types[k]), dx1, dx2, c.nx);
		if (c.np)
			assert_doubled(comp_type_name(loss_types[k]), dp1, dp2, c.np);
		if (nb)
			assert_doubled(comp_type_name(loss_types[k]), db1, db2, nb);
		free(dx1);
		free(dp1);
		free(db1);
		free(dx2);
		free(dp2);
		free(db2);
		loss_case_free(&c);
	}
}

/* ---- saved activations: exactly op_saved_elems per sample ------------------ */

static void test_saved_sizes(void **state)
{
	(void)state;
	sp_comp_type_t types[] = {COMP_EMBEDDING, COMP_PATCH, COMP_TRANSFORMER,
				  COMP_TRANSFORMER, COMP_LINEAR};
	enum { GUARD = 64 };
	for (int k = 0; k < SP_ARRAY_LEN(types); k++) {
		fwd_case_t c = fwd_case(types[k], k == 3);
		free(c.saved);
		c.saved = falloc(c.nsaved + GUARD);
		for (int64_t i = 0; i < c.nsaved + GUARD; i++)
			c.saved[i] = NAN;
		fwd_run(&c);
		int64_t unwritten = 0;
		for (int64_t i = 0; i < c.nsaved; i++)
			unwritten += isnan(c.saved[i]) != 0;
		for (int64_t i = c.nsaved; i < c.nsaved + GUARD; i++)
			assert_true(isnan(c.saved[i]));
		if (unwritten)
			fprintf(stderr, "%s: %lld saved floats unwritten\n",
				comp_type_name(types[k]), (long long)unwritten);
		assert_int_equal(unwritten, 0);
		fwd_case_free(&c);
	}
	sp_comp_type_t ltypes[] = {COMP_LM_HEAD, COMP_CLASSIFIER, COMP_CONTRASTIVE};
	for (int k = 0; k < SP_ARRAY_LEN(ltypes); k++) {
		loss_case_t c = loss_case(ltypes[k]);
		int64_t ns = c.n * op_saved_elems(&c.s, c.n), nb = c.B * c.seq_b * c.w;
		free(c.saved);
		c.saved = falloc(ns + GUARD);
		for (int64_t i = ns; i < ns + GUARD; i++)
			c.saved[i] = NAN;
		float *dx = falloc(c.nx), *dp = falloc(c.np), *db = falloc(nb);
		loss_run(&c, dx, db, dp);
		for (int64_t i = ns; i < ns + GUARD; i++)
			assert_true(isnan(c.saved[i]));
		free(dx);
		free(dp);
		free(db);
		loss_case_free(&c);
	}
}

/* ---- transformer forward against a naive double version -------------------- */

static void naive_ln(double *y, const double *x, const float *g, const float *b)
{
	double mu = 0, var = 0;
	for (int k = 0; k < H; k++)
		mu += x[k] / H;
	for (int k = 0; k < H; k++)
		var += (x[k] - mu) * (x[k] - mu) / H;
	for (int k = 0; k < H; k++)
		y[k] = (x[k] - mu) / sqrt(var + 1e-5) * g[k] + b[k];
}

/* y[S][H] of one sample; p in layer_tensors order. */
static void naive_tblock(double *y, const float *p, const float *x, int causal)
{
	const float *g1 = p, *b1 = g1 + H, *wqkv = b1 + H, *bqkv = wqkv + 3 * H * H;
	const float *wo = bqkv + 3 * H, *bo = wo + H * H, *g2 = bo + H, *b2 = g2 + H;
	const float *w1 = b2 + H, *bb1 = w1 + H * F, *w2 = bb1 + F, *bb2 = w2 + F * H;
	double xs[S][H], ln[S][H], qkv[S][3 * H], cat[S][H], mid[S][H];
	int dh = H / A;
	for (int t = 0; t < S; t++) {
		for (int k = 0; k < H; k++)
			xs[t][k] = x[t * H + k];
		naive_ln(ln[t], xs[t], g1, b1);
		for (int o = 0; o < 3 * H; o++) {
			qkv[t][o] = bqkv[o];
			for (int k = 0; k < H; k++)
				qkv[t][o] += ln[t][k] * wqkv[k * 3 * H + o];
		}
	}
	for (int hd = 0; hd < A; hd++)
		for (int i = 0; i < S; i++) {
			double sc[S], mx = -1e300, sum = 0;
			for (int j = 0; j < S; j++) {
				sc[j] = 0;
				for (int d = 0; d < dh; d++)
					sc[j] += qkv[i][hd * dh + d] *
						 qkv[j][H + hd * dh + d];
				sc[j] /= sqrt((double)dh);
				if (causal && j > i)
					sc[j] = -INFINITY;
				mx = fmax(mx, sc[j]);
			}
			for (int j = 0; j < S; j++)
				sum += sc[j] = exp(sc[j] - mx);
			for (int d = 0; d < dh; d++) {
				cat[i][hd * dh + d] = 0;
				for (int j = 0; j < S; j++)
					cat[i][hd * dh + d] +=
						sc[j] / sum * qkv[j][2 * H + hd * dh + d];
			}
		}
	for (int t = 0; t < S; t++) {
		for (int o = 0; o < H; o++) {
			mid[t][o] = xs[t][o] + bo[o];
			for (int k = 0; k < H; k++)
				mid[t][o] += cat[t][k] * wo[k * H + o];
		}
		naive_ln(ln[t], mid[t], g2, b2);
		double act[F];
		for (int o = 0; o < F; o++) {
			double u = bb1[o];
			for (int k = 0; k < H; k++)
				u += ln[t][k] * w1[k * F + o];
			act[o] = 0.5 * u *
				 (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
		}
		for (int o = 0; o < H; o++) {
			y[t * H + o] = mid[t][o] + bb2[o];
			for (int k = 0; k < F; k++)
				y[t * H + o] += act[k] * w2[k * H + o];
		}
	}
}

static void test_tblock_matches_naive(void **state)
{
	(void)state;
	for (int causal = 0; causal < 2; causal++) {
		fwd_case_t c = fwd_case(COMP_TRANSFORMER, causal);
		fwd_run(&c);
		double ref[S * H], mx = 0;
		for (int i = 0; i < N; i++) {
			naive_tblock(ref, c.p, c.x + i * S * H, causal);
			for (int k = 0; k < S * H; k++)
				mx = fmax(mx, fabs(ref[k] - c.y[i * S * H + k]));
		}
		if (mx > 1e-4)
			fprintf(stderr, "transformer causal=%d: max diff %.3g\n", causal,
				mx);
		assert_true(mx <= 1e-4);
		fwd_case_free(&c);
	}
}

/* With a causal mask, token i's output ignores tokens after i. */
static void test_tblock_causal_mask(void **state)
{
	(void)state;
	for (int causal = 0; causal < 2; causal++) {
		fwd_case_t c = fwd_case(COMP_TRANSFORMER, causal);
		fwd_run(&c);
		float *y0 = falloc(c.ny);
		memcpy(y0, c.y, (size_t)c.ny * sizeof *y0);
		for (int k = 0; k < H; k++)
			c.x[(S - 1) * H + k] += 0.5f;
		fwd_run(&c);
		int changed = memcmp(y0, c.y, (size_t)(S - 1) * H * sizeof *y0) != 0;
		assert_int_equal(changed, !causal);
		assert_true(memcmp(y0 + (S - 1) * H, c.y + (S - 1) * H, H * sizeof *y0));
		free(y0);
		fwd_case_free(&c);
	}
}

/* ---- loss values with known answers ------------------------------------------ */

static void test_loss_values(void **state)
{
	(void)state;
	loss_case_t c = loss_case(COMP_LM_HEAD);
	memset(c.p + 2 * H, 0, H * V * sizeof *c.p); /* logits 0: each loss is log V */
	double l = lm_head_loss(&c.s, c.n, c.p, c.x, c.tgt, 1.0, c.dx, c.dp, c.saved);
	assert_close(l, N * log((double)V), 1e-6);
	for (int t = 0; t < S; t++)
		c.tgt[t] = -1;
	l = lm_head_loss(&c.s, 1, c.p, c.x, c.tgt, 1.0, c.dx, c.dp, c.saved);
	assert_close(l, 0.0, 0.0);
	loss_case_free(&c);

	c = loss_case(COMP_CLASSIFIER);
	memset(c.p + 2 * H, 0, (H * C + C) * sizeof *c.p);
	l = classifier_loss(&c.s, c.n, c.seq_in, c.p, c.x, c.tgt, 1.0, c.dx, c.dp,
			    c.saved);
	assert_close(l, (c.n - 1) * log((double)C), 1e-6); /* one label is -1 */
	for (int64_t i = 0; i < c.nx; i++)
		c.dx[i] = 0;
	classifier_loss(&c.s, c.n, c.seq_in, c.p, c.x, c.tgt, 1.0, c.dx, c.dp, c.saved);
	for (int64_t i = 0; i < c.nx; i++) {
		int64_t sample = i / (S * H), tok = i / H % S;
		if (tok != 0 || sample == 2)
			assert_true(c.dx[i] == 0.0f);
	}
	loss_case_free(&c);

	/* a_i = b_i = 3 e_i: S = I/tau, loss_i = log(e^{1/tau} + B - 1) - 1/tau */
	enum { B = 4 };
	float a[B * H] = {0}, da[B * H] = {0}, db[B * H] = {0};
	float *sv = falloc(B * (2 * H + 2 + 2 * B));
	for (int i = 0; i < B; i++)
		a[i * H + i] = 3.0f;
	double tau = 0.25;
	l = contrastive_loss(B, H, 1, 1, tau, 0, B, a, a, 1.0, da, db, sv);
	assert_close(l, B * (log(exp(1 / tau) + B - 1) - 1 / tau), 1e-5);
	free(sv);
}

/* Devices owning [0,k) and [k,B) together produce the loss and gradient of [0,B). */
static void test_contrastive_ranges(void **state)
{
	(void)state;
	loss_case_t c = loss_case(COMP_CONTRASTIVE);
	int64_t nb = c.B * c.seq_b * c.w;
	float *da = falloc(c.nx), *db = falloc(nb), *da2 = falloc(c.nx),
	      *db2 = falloc(nb);
	double full = contrastive_loss(c.B, c.w, c.seq_a, c.seq_b, c.temp, 0, c.B, c.x,
				       c.b, 0.3, da, db, c.saved);
	for (int64_t k = 0; k <= c.B; k++) {
		memset(da2, 0, (size_t)c.nx * sizeof *da2);
		memset(db2, 0, (size_t)nb * sizeof *db2);
		double l1 = contrastive_loss(c.B, c.w, c.seq_a, c.seq_b, c.temp, 0, k,
					     c.x, c.b, 0.3, da2, db2, c.saved);
		for (int64_t i = 0; i < c.nx; i++)
			if (i / (c.seq_a * c.w) >= k)
				assert_true(da2[i] == 0.0f);
		double l2 = contrastive_loss(c.B, c.w, c.seq_a, c.seq_b, c.temp, k, c.B,
					     c.x, c.b, 0.3, da2, db2, c.saved);
		assert_close(l1 + l2, full, 1e-5 * fabs(full));
		if (k > 0 && k < c.B)
			assert_true(l1 > 0 && l2 > 0);
		for (int64_t i = 0; i < c.nx; i++)
			assert_close(da2[i], da[i], 1e-6);
		for (int64_t i = 0; i < nb; i++)
			assert_close(db2[i], db[i], 1e-6);
	}
	/* only token 0 of each sample gets a gradient */
	int nonzero = 0;
	for (int64_t i = 0; i < c.nx; i++) {
		if (i % (c.seq_a * c.w) >= c.w)
			assert_true(da[i] == 0.0f);
		else
			nonzero += da[i] != 0.0f;
	}
	assert_true(nonzero > 0);
	free(da);
	free(db);
	free(da2);
	free(db2);
	loss_case_free(&c);
}

/* ---- layout and initialisation ----------------------------------------------- */

static void test_tensors_sum_to_params(void **state)
{
	(void)state;
	const int expect_count[COMP__COUNT] = {2, 3, 12, 2, 3, 4, 0};
	for (int t = 0; t < COMP__COUNT; t++) {
		sp_opshape_t s = shape_of((sp_comp_type_t)t);
		sp_component_t c = comp_from(&s, "x");
		c.hidden = 24; /* make every dimension distinct from the others */
		c.ffn = 40;
		c.heads = 4;
		layer_tensor_t ts[LAYER_TENSORS_MAX];
		int nt = layer_tensors(&c, ts);
		assert_int_equal(nt, expect_count[t]);
		int64_t off = 0;
		for (int i = 0; i < nt; i++) {
			assert_int_equal(ts[i].offset, off);
			assert_true(ts[i].rows > 0 && ts[i].cols > 0);
			off += ts[i].rows * ts[i].cols;
		}
		assert_int_equal(off, comp_layer_params(&c));
	}
}

static void test_init(void **state)
{
	(void)state;
	sp_opshape_t s = shape_of(COMP_TRANSFORMER);
	s.hidden = 32;
	s.ffn = 64;
	sp_component_t c = comp_from(&s, "encoder");
	int64_t np = comp_layer_params(&c);
	float *p0 = falloc(np), *p1 = falloc(np), *q = falloc(np);
	for (int64_t i = 0; i < np; i++)
		p0[i] = p1[i] = NAN;
	layer_init(p0, &c, 0, 42);
	layer_init(p1, &c, 0, 42);
	assert_memory_equal(p0, p1, (size_t)np * sizeof *p0);

	layer_tensor_t ts[LAYER_TENSORS_MAX];
	int nt = layer_tensors(&c, ts);
	double bound = sqrt(3.0) * 0.02;
	for (int i = 0; i < nt; i++) {
		const float *v = p0 + ts[i].offset;
		int64_t n = ts[i].rows * ts[i].cols;
		const char *nm = ts[i].name;
		if (!strcmp(nm, "ln1_g") || !strcmp(nm, "ln2_g")) {
			for (int64_t k = 0; k < n; k++)
				assert_true(v[k] == 1.0f);
		} else if (nm[0] == 'b' || !strcmp(nm, "ln1_b") || !strcmp(nm, "ln2_b")) {
			for (int64_t k = 0; k < n; k++)
				assert_true(v[k] == 0.0f);
		} else {
			double ss = 0, sum = 0;
			for (int64_t k = 0; k < n; k++) {
				assert_true(fabs(v[k]) <= bound);
				ss += (double)v[k] * v[k];
				sum += v[k];
			}
			double sd = sqrt(ss / n);
			assert_true(sd > 0.018 && sd < 0.022);
			assert_true(fabs(sum / n) < 0.003);
		}
	}
	/* matrices differ across layers, seeds and names */
	const int64_t wq = ts[2].offset, nwq = ts[2].rows * ts[2].cols;
	struct {
		int layer;
		uint64_t seed;
		const char *name;
	} other[] = {{1, 42, "encoder"}, {0, 43, "encoder"}, {0, 42, "decoder"}};
	for (int k = 0; k < SP_ARRAY_LEN(other); k++) {
		sp_component_t c2 = c;
		snprintf(c2.name, sizeof c2.name, "%s", other[k].name);
		layer_init(q, &c2, other[k].layer, other[k].seed);
		int64_t same = 0;
		for (int64_t i = 0; i < nwq; i++)
			same += q[wq + i] == p0[wq + i];
		assert_true(same < 4);
	}
	/* patch: the position table is random too */
	sp_opshape_t ps = shape_of(COMP_PATCH);
	sp_component_t pc = comp_from(&ps, "vision");
	int64_t pn = comp_layer_params(&pc);
	float *pp = falloc(pn);
	layer_init(pp, &pc, 0, 7);
	int64_t pos = (int64_t)IN * H + H, zeros = 0;
	for (int64_t i = pos; i < pn; i++)
		zeros += pp[i] == 0.0f;
	assert_true(zeros < 2);
	free(pp);
	free(p0);
	free(p1);
	free(q);
}

/* ---- optimizer ------------------------------------------------------------------- */

static void test_adamw_step(void **state)
{
	(void)state;
	sp_optim_t o = {OPT_ADAMW, 0.1, 0.01, 0.9, 0.999, 1e-8};
	float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f}, m[2] = {0}, v[2] = {0};
	/*
	 * t = 1 from zero moments: m = 0.1 g, v = 0.001 g^2, so mhat = g, vhat = g^2
	 * and the step is lr (sign(g) + wd p) up to eps:
	 * p0 = 1 - 0.1 (1 + 0.01) = 0.899; p1 = -2 - 0.1 (1 - 0.02) = -2.098
	 */
	adamw_step(p, g, m, v, 2, 1, &o);
	assert_close(m[0], 0.05, 1e-7);
	assert_close(v[0], 0.00025, 1e-9);
	assert_close(p[0], 0.899, 1e-6);
	assert_close(p[1], -2.098, 1e-6);
	/*
	 * t = 2, g = (0.5, 0.25) again on p0: m = 0.9*0.05 + 0.05 = 0.095,
	 * v = 0.999*0.00025 + 0.00025 = 0.00049975; mhat = 0.095/0.19 = 0.5,
	 * vhat = 0.00049975/0.001999 = 0.25: step again 0.1 (1 + 0.01*0.899)
	 */
	adamw_step(p, g, m, v, 2, 2, &o);
	assert_close(m[0], 0.095, 1e-7);
	assert_close(p[0], 0.899 - 0.1 * (1 + 0.00899), 1e-6);

	float q[1] = {2.0f}, gq[1] = {0.5f};
	sp_optim_t so = {OPT_SGD, 0.1, 0.01, 0, 0, 0};
	sgd_step(q, gq, 1, &so); /* 2 - 0.1 (0.5 + 0.02) */
	assert_close(q[0], 1.948, 1e-6);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensors_sum_to_params),
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_saved_sizes),
		cmocka_unit_test(test_checker_rejects_wrong_gradient),
		cmocka_unit_test(test_grad_embedding),
		cmocka_unit_test(test_embedding_sum),
		cmocka_unit_test(test_grad_patch),
		cmocka_unit_test(test_grad_tblock),
		cmocka_unit_test(test_grad_tblock_causal),
		cmocka_unit_test(test_grad_linear),
		cmocka_unit_test(test_grad_lm_head),
		cmocka_unit_test(test_grad_classifier),
		cmocka_unit_test(test_grad_contrastive),
		cmocka_unit_test(test_backward_accumulates),
		cmocka_unit_test(test_tblock_matches_naive),
		cmocka_unit_test(test_tblock_causal_mask),
		cmocka_unit_test(test_loss_values),
		cmocka_unit_test(test_contrastive_ranges),
		cmocka_unit_test(test_adamw_step),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
