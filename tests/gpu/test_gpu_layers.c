/*
 * test_gpu_layers.c — every layer of the cuda backend, forward and
 * backward, against the CPU reference (layers.c) on the same random
 * inputs: embedding, patch, transformer (causal and not, and again with
 * the workspace capped so samples go one chunk at a time), linear,
 * lm_head, classifier, contrastive, AdamW (including the bf16 shadow
 * refresh), SGD, copy_rows and zero; and the split transformer block
 * (tensor parallelism): the CPU members of a t-way group run in threads
 * (tests/unit/tp_group.c) recording every all-reduce's sum, then each CUDA
 * member alone, its hook handing back those sums in order and keeping its
 * own partial buffers: its y, dx and shard gradient against the CPU
 * member's, and the CUDA members' partials summed against the recorded
 * sums; the sequence-parallel block (cu_sp.cu) the same way against
 * layers_sp.c's, all three collectives replayed (test_tblock_sp); the
 * cross-attention decoder block (causal and not, memories
 * shorter and longer than the sequence, of the hidden width and not,
 * chunked): y, dx, dmemory and every parameter gradient. A value passes
 * when |gpu - ref| <= tol + eps |ref|, with tol a fraction of the largest
 * |ref| of that tensor: loose for bf16 paths, tight for fp32 ones.
 * Prints the max difference and the first mismatches of each check.
 * Exits 77 (skip) without a usable GPU.
 */
#include "cuda/cuda_backend.h"
#include "gpu_start.h"
#include "layers.h"
#include "runtime.h"
#include "tp_group.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* bf16 paths: products of bf16 operands chained through a few layers */
#define BF_TOL 0.03
#define BF_EPS 0.03
/* fp32 paths: order of summation only */
#define F32_TOL 1e-5
#define F32_EPS 1e-4

static const rt_backend_t *const B = &backend_cuda;
static rt_comm_t comm;
static int n_fail, n_checks;
static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static double urand(void)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static float *hrand(int64_t n, double scale)
{
	float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
	for (int64_t i = 0; i < n; i++)
		p[i] = (float)(scale * (2.0 * urand() - 1.0));
	return p;
}

static float *hcopy(const float *src, int64_t n)
{
	float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
	memcpy(p, src, sizeof(float) * (size_t)n);
	return p;
}

static void *dev(const void *host, size_t bytes)
{
	void *d = B->alloc(bytes ? bytes : 4);
	if (!d) {
		fprintf(stderr, "test_gpu_layers: device allocation of %zu bytes failed: %s\n",
			bytes, cu_first_error());
		exit(1);
	}
	if (host && bytes)
		B->to_device(d, host, bytes);
	return d;
}

static float *fetch(const float *d, int64_t n)
{
	float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
	B->to_host(h, d, sizeof(float) * (size_t)n);
	return h;
}

/* |gpu - ref| <= tol_frac max|ref| + eps |ref|, elementwise */
static void check(const char *what, const float *gpu, const float *ref, int64_t n,
		  double tol_frac, double eps)
{
	double mx = 0, maxd = 0;
	int64_t at = -1, bad = 0;
	for (int64_t i = 0; i < n; i++)
		mx = fmax(mx, fabs((double)ref[i]));
	double tol = tol_frac * mx + 1e-12;
	for (int64_t i = 0; i < n; i++) {
		double d = fabs((double)gpu[i] - (double)ref[i]);
		if (!(d <= maxd) || isnan(d)) {
			maxd = isnan(d) ? INFINITY : d;
			at = i;
		}
		if (!(d <= tol + eps * fabs((double)ref[i]))) {
			if (bad < 5)
				printf("    mismatch %s[%lld]: gpu %.8g ref %.8g\n", what, (long long)i,
				       gpu[i], ref[i]);
			bad++;
		}
	}
	n_checks++;
	printf("%s %-34s max |diff| %.3g at %lld (max |ref| %.3g, tol %.3g + %.0e |ref|, n %lld)\n",
	       bad ? "FAIL" : "ok  ", what, maxd, (long long)at, mx, tol, eps, (long long)n);
	if (bad) {
		printf("    %lld of %lld values out of tolerance\n", (long long)bad, (long long)n);
		n_fail++;
	}
}

static void check_scalar(const char *what, double gpu, double ref, double rel)
{
	double d = fabs(gpu - ref);
	int ok = d <= rel * fabs(ref) + 1e-9;
	n_checks++;
	printf("%s %-34s gpu %.9g ref %.9g |diff| %.3g\n", ok ? "ok  " : "FAIL", what, gpu, ref,
	       d);
	if (!ok)
		n_fail++;
}

/* Parameters large enough that every path matters: LN gains 1 +- 0.2,
 * biases +- 0.2, matrices +- 1/sqrt(rows). */
static float *params(const sp_opshape_t *s, int64_t *count)
{
	sp_component_t c = layer_comp_of_shape(s);
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(&c, t);
	*count = comp_layer_params(&c);
	float *p = malloc(sizeof(float) * (size_t)(*count > 0 ? *count : 1));
	for (int i = 0; i < nt; i++) {
		int64_t n = t[i].rows * t[i].cols;
		const char *nm = t[i].name;
		size_t len = strlen(nm);
		for (int64_t k = 0; k < n; k++) {
			double u = 2.0 * urand() - 1.0;
			float v;
			if (nm[0] == 'l' && nm[len - 1] == 'g')
				v = (float)(1.0 + 0.2 * u);
			else if (t[i].cols == 1)
				v = (float)(0.2 * u);
			else
				v = (float)(u / sqrt((double)t[i].rows));
			p[t[i].offset + k] = v;
		}
	}
	return p;
}

/* Compares a parameter gradient tensor by tensor. */
static void check_params(const char *layer, const sp_opshape_t *s, const float *gpu,
			 const float *ref, double tol, double eps)
{
	sp_component_t c = layer_comp_of_shape(s);
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(&c, t);
	for (int i = 0; i < nt; i++) {
		char what[96];
		snprintf(what, sizeof what, "%s d%s", layer, t[i].name);
		check(what, gpu + t[i].offset, ref + t[i].offset, t[i].rows * t[i].cols, tol, eps);
	}
}

/* A loss's value, dx and parameter gradient (device) against the CPU's. */
static void check_loss(const char *name, const sp_opshape_t *s, double got, double ref,
		       double rel, const float *dDX, const float *dx_ref, int64_t nx,
		       const float *dDP, const float *dp_ref, int64_t np, double tol, double eps)
{
	float *gdx = fetch(dDX, nx), *gdp = fetch(dDP, np);
	char what[96];
	snprintf(what, sizeof what, "%s loss", name);
	check_scalar(what, got, ref, rel);
	snprintf(what, sizeof what, "%s dx", name);
	check(what, gdx, dx_ref, nx, tol, eps);
	check_params(name, s, gdp, dp_ref, tol, eps);
	free(gdx), free(gdp);
}

/* A forward layer's y, dx and parameter gradient (device) against the CPU's. */
static void check_layer(const char *name, const sp_opshape_t *s, const float *dY,
			const float *y, int64_t ny, const float *dDX, const float *dx_ref,
			int64_t nx, const float *dDP, const float *dp_ref, int64_t np)
{
	float *gy = fetch(dY, ny), *gdx = fetch(dDX, nx), *gdp = fetch(dDP, np);
	char what[96];
	snprintf(what, sizeof what, "%s fwd y", name);
	check(what, gy, y, ny, BF_TOL, BF_EPS);
	snprintf(what, sizeof what, "%s bwd dx", name);
	check(what, gdx, dx_ref, nx, BF_TOL, BF_EPS);
	snprintf(what, sizeof what, "%s bwd", name);
	check_params(what, s, gdp, dp_ref, BF_TOL, BF_EPS);
	free(gy), free(gdx), free(gdp);
}

static void test_embedding(void)
{
	sp_opshape_t s = {.type = COMP_EMBEDDING, .hidden = 16, .seq = 5, .vocab = 11};
	int n = 3;
	int64_t np, rows = n * s.seq, h = s.hidden;
	float *p = params(&s, &np);
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows);
	for (int64_t i = 0; i < rows; i++)
		tok[i] = (int32_t)(urand() * 4); /* repeats: the scatter must add */
	float *y = calloc((size_t)(rows * h), 4), *sv = calloc((size_t)rows, 4);
	float *dy = hrand(rows * h, 1.0), *dp = hrand(np, 0.1);
	float *dp_ref = hcopy(dp, np);
	embedding_fwd(&s, n, p, tok, y, sv);
	embedding_bwd(&s, n, sv, dy, dp_ref);

	float *dP = dev(p, 4 * (size_t)np), *dY = dev(NULL, 4 * (size_t)(rows * h));
	float *dS = dev(NULL, 4 * (size_t)rows), *dDY = dev(dy, 4 * (size_t)(rows * h));
	float *dDP = dev(dp, 4 * (size_t)np);
	int32_t *dT = dev(tok, 4 * (size_t)rows);
	B->embedding_fwd(&s, n, dP, dT, dY, dS);
	B->embedding_bwd(&s, n, dS, dDY, dDP);
	float *gy = fetch(dY, rows * h), *gdp = fetch(dDP, np);
	check("embedding fwd y", gy, y, rows * h, F32_TOL, F32_EPS);
	check_params("embedding bwd", &s, gdp, dp_ref, F32_TOL, F32_EPS);
	B->release(dP), B->release(dY), B->release(dS), B->release(dDY), B->release(dDP),
		B->release(dT);
	free(p), free(tok), free(y), free(sv), free(dy), free(dp), free(dp_ref), free(gy), free(gdp);
}

static void test_patch(void)
{
	sp_opshape_t s = {.type = COMP_PATCH, .hidden = 24, .seq = 5, .in = 12};
	int n = 3;
	int64_t np, rows = n * s.seq, h = s.hidden;
	float *p = params(&s, &np), *feats = hrand(rows * s.in, 1.0);
	float *y = calloc((size_t)(rows * h), 4);
	float *sv = calloc((size_t)op_saved_elems(&s, n) * (size_t)n, 4);
	float *dy = hrand(rows * h, 1.0), *dp = hrand(np, 0.1), *dp_ref = hcopy(dp, np);
	patch_fwd(&s, n, p, feats, y, sv);
	patch_bwd(&s, n, p, sv, dy, dp_ref);

	float *dP = dev(p, 4 * (size_t)np), *dF = dev(feats, 4 * (size_t)(rows * s.in));
	float *dY = dev(NULL, 4 * (size_t)(rows * h));
	float *dS = dev(NULL, 4 * (size_t)(op_saved_elems(&s, n) * n));
	float *dDY = dev(dy, 4 * (size_t)(rows * h)), *dDP = dev(dp, 4 * (size_t)np);
	B->patch_fwd(&s, n, dP, dF, dY, dS);
	B->patch_bwd(&s, n, dP, dS, dDY, dDP);
	float *gy = fetch(dY, rows * h), *gdp = fetch(dDP, np);
	check("patch fwd y", gy, y, rows * h, BF_TOL, BF_EPS);
	check_params("patch bwd", &s, gdp, dp_ref, BF_TOL, BF_EPS);
	B->release(dP), B->release(dF), B->release(dY), B->release(dS), B->release(dDY),
		B->release(dDP);
	free(p), free(feats), free(y), free(sv), free(dy), free(dp), free(dp_ref), free(gy),
		free(gdp);
}

static void test_tblock(const char *name, int64_t h, int64_t a, int64_t f, int64_t sq,
			int causal, int n, size_t ws_cap)
{
	sp_opshape_t s = {.type = COMP_TRANSFORMER, .hidden = h, .heads = a, .ffn = f,
			  .seq = sq, .causal = causal};
	int64_t np, e = n * sq * h, ns = op_saved_elems(&s, n) * n;
	float *p = params(&s, &np), *x = hrand(e, 1.0);
	float *y = calloc((size_t)e, 4), *sv = calloc((size_t)ns, 4);
	float *dy = hrand(e, 1.0), *dx = hrand(e, 0.5), *dp = hrand(np, 0.1);
	float *dx_ref = hcopy(dx, e), *dp_ref = hcopy(dp, np);
	tblock_fwd(&s, NULL, n, p, x, y, sv);
	tblock_bwd(&s, NULL, n, p, sv, dy, dx_ref, dp_ref);

	if (ws_cap)
		cu_set_workspace_cap(ws_cap);
	float *dP = dev(p, 4 * (size_t)np), *dX = dev(x, 4 * (size_t)e);
	float *dY = dev(NULL, 4 * (size_t)e), *dS = dev(NULL, 4 * (size_t)ns);
	float *dDY = dev(dy, 4 * (size_t)e), *dDX = dev(dx, 4 * (size_t)e);
	float *dDP = dev(dp, 4 * (size_t)np);
	B->tblock_fwd(&s, NULL, n, dP, dX, dY, dS);
	B->tblock_bwd(&s, NULL, n, dP, dS, dDY, dDX, dDP);
	B->sync();
	if (ws_cap)
		cu_set_workspace_cap((size_t)2 << 30);
	check_layer(name, &s, dY, y, e, dDX, dx_ref, e, dDP, dp_ref, np);
	B->release(dP), B->release(dX), B->release(dY), B->release(dS), B->release(dDY),
		B->release(dDX), B->release(dDP);
	free(p), free(x), free(y), free(sv), free(dy), free(dx), free(dp), free(dx_ref),
		free(dp_ref);
}

/*
 * The CUDA member's all-reduce: adds its partial buffer (fetched) into
 * part[call] and hands back the CPU group's sum of that call (sums, in
 * order). The hook runs with the member's kernels enqueued on the stream;
 * to_host and to_device are ordered on it.
 */
typedef struct {
	const float *sums; /* the CPU group's results, in call order */
	float *part;       /* sum over CUDA members of their partials, same order */
	int64_t pos, n_sums;
	int calls;
	int64_t sizes[4];
} replay_t;

static int replay_allreduce(void *ctx, float *buf, int64_t n)
{
	replay_t *r = ctx;
	if (r->calls >= 4 || r->pos + n > r->n_sums)
		return SP_EINTERNAL;
	float *mine = fetch(buf, n);
	for (int64_t k = 0; k < n; k++)
		r->part[r->pos + k] += mine[k];
	free(mine);
	B->to_device(buf, r->sums + r->pos, sizeof(float) * (size_t)n);
	r->sizes[r->calls++] = n;
	r->pos += n;
	return 0;
}

/* Member j's host buffers: its shard of the whole layer p, saved [ns],
 * y [ny], dx [nx], dp, zeroed, and room for cap recorded floats. */
static void member_alloc(tp_member_t *m, const sp_component_t *c, int t, int j, float *p,
			 int64_t nps, int64_t ns, int64_t ny, int64_t nx, int64_t cap)
{
	m->p = malloc(sizeof(float) * (size_t)nps);
	layer_shard(c, t, j, p, m->p, 0);
	m->saved = calloc((size_t)ns, 4);
	m->y = calloc((size_t)ny, 4);
	m->dx = calloc((size_t)nx, 4);
	m->dp = calloc((size_t)nps, 4);
	m->cap_sums = cap;
	m->sums = malloc(sizeof(float) * (size_t)cap);
}

static void member_free(tp_member_t *m)
{
	free(m->p), free(m->saved), free(m->y), free(m->dx), free(m->dp), free(m->sums);
}

/* A CUDA member's y [ny], dx [nx] and shard gradient [np] (device) against
 * its CPU twin's (bf16 tolerance). */
static void check_member(const char *name, int j, const float *dY, const float *dDX,
			 const float *dDP, const float *y, const float *dx, const float *dp,
			 int64_t ny, int64_t nx, int64_t np)
{
	char what[160];
	float *gy = fetch(dY, ny), *gdx = fetch(dDX, nx), *gdp = fetch(dDP, np);
	snprintf(what, sizeof what, "%s m%d fwd y", name, j);
	check(what, gy, y, ny, BF_TOL, BF_EPS);
	snprintf(what, sizeof what, "%s m%d bwd dx", name, j);
	check(what, gdx, dx, nx, BF_TOL, BF_EPS);
	snprintf(what, sizeof what, "%s m%d bwd dp (shard)", name, j);
	check(what, gdp, dp, np, BF_TOL, BF_EPS);
	free(gy), free(gdx), free(gdp);
}

static void test_tblock_tp(const char *name, int64_t h, int64_t a, int64_t f, int64_t sq,
			   int causal, int n, int t, size_t ws_cap)
{
	sp_opshape_t s = {.type = COMP_TRANSFORMER, .hidden = h, .heads = a, .ffn = f,
			  .seq = sq, .causal = causal};
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np, e = n * sq * h, nps = comp_layer_params_tp(&c, t);
	int64_t ns = op_saved_elems_tp(&s, n, t) * n;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *dy = hrand(e, 1.0);
	tp_member_t m[8];
	memset(m, 0, sizeof m);
	for (int j = 0; j < t; j++)
		member_alloc(&m[j], &c, t, j, p, nps, ns, e, e, 4 * e);
	char what[128];
	if (tp_group_run(&s, t, n, x, dy, m) || m[0].n_sums != 4 * e) {
		printf("FAIL %s: the CPU group failed (rc %d, %lld sums)\n", name, m[0].rc,
		       (long long)m[0].n_sums);
		n_fail++, n_checks++;
		goto cleanup;
	}
	float *part = calloc((size_t)(4 * e), 4);
	if (ws_cap)
		cu_set_workspace_cap(ws_cap);
	for (int j = 0; j < t; j++) {
		replay_t r = {.sums = m[j].sums, .part = part, .n_sums = m[j].n_sums};
		rt_tp_t tp = {.t = t, .rank = j, .ctx = &r, .allreduce = replay_allreduce};
		float *dP = dev(m[j].p, 4 * (size_t)nps), *dX = dev(x, 4 * (size_t)e);
		float *dY = dev(NULL, 4 * (size_t)e), *dS = dev(NULL, 4 * (size_t)ns);
		float *dDY = dev(dy, 4 * (size_t)e), *dDX = dev(NULL, 4 * (size_t)e);
		float *dDP = dev(NULL, 4 * (size_t)nps);
		B->zero(dDX, e);
		B->zero(dDP, nps);
		int rf = B->tblock_fwd(&s, &tp, n, dP, dX, dY, dS);
		int rb = rf ? rf : B->tblock_bwd(&s, &tp, n, dP, dS, dDY, dDX, dDP);
		B->sync();
		int sizes_ok = r.calls == 4;
		for (int i = 0; i < r.calls; i++)
			sizes_ok &= r.sizes[i] == e;
		n_checks++;
		if (rb || !sizes_ok) {
			printf("FAIL %s member %d: rc %d, %d all-reduces (want 4 of %lld)\n", name,
			       j, rb, r.calls, (long long)e);
			n_fail++;
		}
		check_member(name, j, dY, dDX, dDP, m[j].y, m[j].dx, m[j].dp, e, e, nps);
		B->release(dP), B->release(dX), B->release(dY), B->release(dS), B->release(dDY),
			B->release(dDX), B->release(dDP);
	}
	if (ws_cap)
		cu_set_workspace_cap((size_t)2 << 30);
	static const char *call[4] = {"fwd x_mid", "fwd y", "bwd d ln2", "bwd d ln1"};
	for (int i = 0; i < 4; i++) {
		snprintf(what, sizeof what, "%s partials %s", name, call[i]);
		check(what, part + i * e, m[0].sums + i * e, e, BF_TOL, BF_EPS);
	}
	free(part);
cleanup:
	for (int j = 0; j < t; j++)
		member_free(&m[j]);
	free(p), free(x), free(dy);
}

/* One CPU member of a sequence-parallel block (tp_group_each): its token
 * shards or whole buffers as whole_in and whole_out say (layers_sp.c). */
typedef struct {
	const sp_opshape_t *s;
	int n, whole_in, whole_out;
	const float *x, *dy; /* what the member is given */
	tp_member_t *b;      /* its buffers and record */
	float *acc;          /* ln_grads [4h] or NULL */
} spmember_t;

static int spmember_run(const rt_tp_t *tp0, void *arg)
{
	spmember_t *m = arg;
	tp_member_t *b = m->b;
	rt_tp_t tp = *tp0;
	tp.sp = 1, tp.whole_in = m->whole_in, tp.whole_out = m->whole_out;
	if (m->acc)
		tp.ln_grads = m->acc, tp.ln_n = 4 * m->s->hidden;
	int rc = tblock_fwd(m->s, &tp, m->n, b->p, m->x, b->y, b->saved);
	return rc ? rc : tblock_bwd(m->s, &tp, m->n, b->p, b->saved, m->dy, b->dx, b->dp);
}

/* A CUDA member's collectives (all three kinds): each hands back the CPU
 * member's recorded result (its whole buffer) and keeps what the CUDA
 * member put in, in call order. */
typedef struct {
	const float *rec;
	float *mine;
	int64_t pos, n_rec;
	int calls, kind[16];
	int64_t size[16];
} sp_replay_t;

static int sp_hook(sp_replay_t *r, float *buf, int64_t n, int kind)
{
	if (r->calls >= 16 || r->pos + n > r->n_rec)
		return SP_EINTERNAL;
	float *m = fetch(buf, n);
	memcpy(r->mine + r->pos, m, sizeof(float) * (size_t)n);
	free(m);
	B->to_device(buf, r->rec + r->pos, sizeof(float) * (size_t)n);
	r->kind[r->calls] = kind;
	r->size[r->calls++] = n;
	r->pos += n;
	return 0;
}
static int sp_ar(void *c, float *b, int64_t n) { return sp_hook(c, b, n, 0); }
static int sp_rs(void *c, float *b, int64_t n) { return sp_hook(c, b, n, 1); }
static int sp_ag(void *c, float *b, int64_t n) { return sp_hook(c, b, n, 2); }

/*
 * The sequence-parallel block (cu_sp.cu) against the CPU's (layers_sp.c):
 * the CPU group of t members in threads records every collective's result;
 * then each CUDA member alone, its collectives replaying its CPU twin's
 * (sp_hook): its y, dx, shard gradient (and ln_grads when acc) against the
 * twin's, and what the CUDA members put into each collective: an
 * all-reduce's inputs summed against the result, a reduce-scatter's
 * inputs summed on each member's shard against that member's result, an
 * all-gather's own shard against the gathered one. The calls' kinds and
 * sizes must be the CPU's.
 */
static void test_tblock_sp(const char *name, int64_t h, int64_t a, int64_t f, int64_t sq,
			   int causal, int n, int t, int whole_in, int whole_out, int acc)
{
	sp_opshape_t s = {.type = COMP_TRANSFORMER, .hidden = h, .heads = a, .ffn = f,
			  .seq = sq, .causal = causal};
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np, e = n * sq * h, nps = comp_layer_params_tp(&c, t);
	int64_t ns = op_saved_elems_sp(&s, n, t, 1) * n, cap = 16 * e + 4 * h * 16;
	int64_t ein = whole_in ? e : e / t, eout = whole_out ? e : e / t;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *dy = hrand(e, 1.0);
	spmember_t m[8];
	tp_member_t rec[8];
	void *args[8];
	memset(m, 0, sizeof m);
	memset(rec, 0, sizeof rec);
	for (int j = 0; j < t; j++) {
		m[j] = (spmember_t){.s = &s, .n = n, .whole_in = whole_in, .whole_out = whole_out,
				    .x = whole_in ? x : x + j * (e / t),
				    .dy = whole_out ? dy : dy + j * (e / t), .b = &rec[j],
				    .acc = acc ? calloc((size_t)(4 * h), 4) : NULL};
		member_alloc(&rec[j], &c, t, j, p, nps, ns, eout, ein, cap);
		args[j] = &m[j];
	}
	float *mine[8] = {0};
	sp_replay_t rp[8];
	char what[160];
	if (tp_group_each(t, spmember_run, args, rec)) {
		printf("FAIL %s: the CPU group failed\n", name);
		n_fail++, n_checks++;
		goto cleanup;
	}
	for (int j = 0; j < t; j++) {
		mine[j] = calloc((size_t)rec[j].n_sums, 4);
		rp[j] = (sp_replay_t){.rec = rec[j].sums, .mine = mine[j], .n_rec = rec[j].n_sums};
		rt_tp_t tp = {.t = t, .rank = j, .ctx = &rp[j], .allreduce = sp_ar,
			      .reduce_scatter = sp_rs, .allgather = sp_ag, .sp = 1,
			      .whole_in = whole_in, .whole_out = whole_out};
		float *dP = dev(rec[j].p, 4 * (size_t)nps), *dX = dev(m[j].x, 4 * (size_t)ein);
		float *dY = dev(NULL, 4 * (size_t)eout), *dS = dev(NULL, 4 * (size_t)ns);
		float *dDY = dev(m[j].dy, 4 * (size_t)eout), *dDX = dev(NULL, 4 * (size_t)ein);
		float *dDP = dev(NULL, 4 * (size_t)nps), *dA = dev(NULL, 4 * (size_t)(4 * h));
		B->zero(dDX, ein);
		B->zero(dDP, nps);
		B->zero(dA, 4 * h);
		if (acc)
			tp.ln_grads = dA, tp.ln_n = 4 * h;
		int rf = B->tblock_fwd(&s, &tp, n, dP, dX, dY, dS);
		int rb = rf ? rf : B->tblock_bwd(&s, &tp, n, dP, dS, dDY, dDX, dDP);
		B->sync();
		int same = rp[j].pos == rec[j].n_sums && rp[j].calls == rp[0].calls;
		for (int i = 0; same && i < rp[j].calls; i++)
			same = rp[j].kind[i] == rp[0].kind[i] && rp[j].size[i] == rp[0].size[i];
		n_checks++;
		if (rb || !same) {
			printf("FAIL %s member %d: rc %d, %d collectives of %lld floats (the CPU's: "
			       "%lld floats; member 0's calls: %d)\n",
			       name, j, rb, rp[j].calls, (long long)rp[j].pos,
			       (long long)rec[j].n_sums, rp[0].calls);
			n_fail++;
		}
		check_member(name, j, dY, dDX, dDP, rec[j].y, rec[j].dx, rec[j].dp, eout, ein, nps);
		if (acc) {
			float *ga = fetch(dA, 4 * h);
			snprintf(what, sizeof what, "%s m%d ln_grads", name, j);
			check(what, ga, m[j].acc, 4 * h, BF_TOL, BF_EPS);
			free(ga);
		}
		B->release(dP), B->release(dX), B->release(dY), B->release(dS), B->release(dDY),
			B->release(dDX), B->release(dDP), B->release(dA);
	}
	static const char *kind[3] = {"all-reduce", "reduce-scatter", "all-gather"};
	for (int i = 0, pos = 0; i < rp[0].calls; pos += (int)rp[0].size[i], i++) {
		int64_t nn = rp[0].size[i];
		float *sum = calloc((size_t)nn, 4), *ref = malloc(sizeof(float) * (size_t)nn);
		for (int j = 0; j < t; j++)
			for (int64_t k = 0; k < nn; k++)
				sum[k] += mine[j][pos + k];
		memcpy(ref, rec[0].sums + pos, sizeof(float) * (size_t)nn);
		const float *got = sum;
		if (rp[0].kind[i] > 0) { /* shard j: member j's */
			float *g = malloc(sizeof(float) * (size_t)nn);
			for (int j = 0; j < t; j++) {
				int64_t o = nn * j / t, cnt = nn * (j + 1) / t - o;
				memcpy(ref + o, rec[j].sums + pos + o, sizeof(float) * (size_t)cnt);
				memcpy(g + o, (rp[0].kind[i] == 1 ? sum : mine[j] + pos) + o,
				       sizeof(float) * (size_t)cnt);
			}
			memcpy(sum, g, sizeof(float) * (size_t)nn);
			free(g);
		}
		snprintf(what, sizeof what, "%s call %d %s", name, i, kind[rp[0].kind[i]]);
		check(what, got, ref, nn, BF_TOL, BF_EPS);
		free(sum), free(ref);
	}
cleanup:
	for (int j = 0; j < t; j++)
		member_free(&rec[j]), free(m[j].acc), free(mine[j]);
	free(p), free(x), free(dy);
}

/* One CPU member of a vocabulary-parallel group (tp_group_each). */
typedef struct {
	const sp_opshape_t *s;
	int n;
	const int32_t *ids;
	const float *x, *dy;
	float *p, *saved, *y, *dx, *dp;
	double loss;
} vmember_t;

static int vmember_run(const rt_tp_t *tp, void *arg)
{
	vmember_t *m = arg;
	if (m->s->type == COMP_EMBEDDING) {
		int rc = embedding_fwd_tp(m->s, tp, m->n, m->p, m->ids, m->y, m->saved);
		return rc ? rc : embedding_bwd_tp(m->s, tp, m->n, m->saved, m->dy, m->dp);
	}
	return lm_head_loss_tp(m->s, tp, m->n, m->p, m->x, m->ids, 0.7, m->dx, m->dp, m->saved,
			       &m->loss);
}

/*
 * The vocabulary-parallel embedding (forward and backward) or LM head of
 * shape s, t members: the CPU group (layers_vocab.c, tp_group_each) and
 * each CUDA member in turn, whose all-reduces replay the CPU group's
 * results (replay_allreduce): every member's y (embedding), loss and dx
 * (LM head) and shard gradient against its CPU twin, and the CUDA
 * members' partials, summed, against the CPU group's all-reduce inputs
 * (their sums): the embedding 1 call of [n s h], the LM head 2 ([n s,
 * 2t + 1] statistics, then [n s h]). The CPU embedding's backward also
 * all-gathers its position gradient [s h] (layers_vocab.c; recorded after
 * the sums, not replayed: the CUDA one sums all of it on every member).
 * Targets include ignored positions and a sample with none.
 */
static void test_vocab_tp(const char *name, sp_comp_type_t type, int64_t V, int64_t h,
			  int64_t sq, int n, int t)
{
	sp_opshape_t s = {.type = type, .hidden = h, .seq = sq, .vocab = V};
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np, rows = n * sq, e = rows * h, nps = comp_layer_params_tp(&c, t);
	int64_t ns = op_saved_elems_tp(&s, n, t) * n;
	int64_t calls = type == COMP_EMBEDDING ? 1 : 2;
	int64_t sizes[2] = {type == COMP_EMBEDDING ? e : rows * (2 * t + 1), e};
	int64_t nsum = sizes[0] + (calls > 1 ? sizes[1] : 0);
	int64_t gathered = type == COMP_EMBEDDING ? sq * h : 0;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *dy = hrand(e, 1.0);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)rows);
	for (int64_t i = 0; i < rows; i++) {
		ids[i] = (int32_t)(urand() * (double)V);
		if (type == COMP_LM_HEAD && (i % 5 == 4 || i / sq == n - 1))
			ids[i] = -1;
	}
	vmember_t m[8];
	tp_member_t rec[8];
	void *args[8];
	memset(rec, 0, sizeof rec);
	for (int j = 0; j < t; j++) {
		m[j] = (vmember_t){.s = &s, .n = n, .ids = ids, .x = x, .dy = dy};
		m[j].p = malloc(sizeof(float) * (size_t)nps);
		layer_shard(&c, t, j, p, m[j].p, 0);
		m[j].saved = calloc((size_t)ns, 4);
		m[j].y = calloc((size_t)e, 4);
		m[j].dx = calloc((size_t)e, 4);
		m[j].dp = calloc((size_t)nps, 4);
		rec[j].cap_sums = nsum + gathered;
		rec[j].sums = malloc(sizeof(float) * (size_t)(nsum + gathered));
		args[j] = &m[j];
	}
	char what[128];
	if (tp_group_each(t, vmember_run, args, rec) || rec[0].n_sums != nsum + gathered) {
		printf("FAIL %s: the CPU group failed (%lld sums)\n", name,
		       (long long)rec[0].n_sums);
		n_fail++, n_checks++;
		goto cleanup;
	}
	float *part = calloc((size_t)nsum, 4);
	for (int j = 0; j < t; j++) {
		replay_t r = {.sums = rec[j].sums, .part = part, .n_sums = rec[j].n_sums};
		rt_tp_t tp = {.t = t, .rank = j, .ctx = &r, .allreduce = replay_allreduce};
		float *dP = dev(m[j].p, 4 * (size_t)nps), *dX = dev(x, 4 * (size_t)e);
		float *dY = dev(NULL, 4 * (size_t)e), *dS = dev(NULL, 4 * (size_t)ns);
		float *dDY = dev(dy, 4 * (size_t)e), *dDX = dev(NULL, 4 * (size_t)e);
		float *dDP = dev(NULL, 4 * (size_t)nps);
		int32_t *dI = dev(ids, sizeof(int32_t) * (size_t)rows);
		double loss = 0;
		B->zero(dDX, e);
		B->zero(dDP, nps);
		int rc;
		if (type == COMP_EMBEDDING) {
			rc = B->embedding_fwd_tp(&s, &tp, n, dP, dI, dY, dS);
			rc = rc ? rc : B->embedding_bwd_tp(&s, &tp, n, dS, dDY, dDP);
		} else {
			rc = B->lm_head_loss_tp(&s, &tp, n, dP, dX, dI, 0.7, dDX, dDP, dS, &loss);
		}
		B->sync();
		int sizes_ok = r.calls == calls;
		for (int i = 0; i < r.calls && i < 2; i++)
			sizes_ok &= r.sizes[i] == sizes[i];
		n_checks++;
		if (rc || !sizes_ok) {
			printf("FAIL %s member %d: rc %d, %d all-reduces (want %lld)\n", name, j, rc,
			       r.calls, (long long)calls);
			n_fail++;
		}
		float *g = fetch(type == COMP_EMBEDDING ? dY : dDX, e), *gdp = fetch(dDP, nps);
		if (type == COMP_EMBEDDING) {
			snprintf(what, sizeof what, "%s m%d fwd y", name, j);
			check(what, g, m[j].y, e, F32_TOL, F32_EPS);
		} else {
			snprintf(what, sizeof what, "%s m%d loss", name, j);
			check_scalar(what, loss, m[j].loss, 0.02);
			snprintf(what, sizeof what, "%s m%d dx", name, j);
			check(what, g, m[j].dx, e, BF_TOL, BF_EPS);
		}
		snprintf(what, sizeof what, "%s m%d dp (shard)", name, j);
		check(what, gdp, m[j].dp, nps, BF_TOL, BF_EPS);
		B->release(dP), B->release(dX), B->release(dY), B->release(dS), B->release(dDY),
			B->release(dDX), B->release(dDP), B->release(dI);
		free(g), free(gdp);
	}
	for (int64_t i = 0, off = 0; i < calls; off += sizes[i], i++) {
		snprintf(what, sizeof what, "%s partials, call %lld", name, (long long)i);
		check(what, part + off, rec[0].sums + off, sizes[i], BF_TOL, BF_EPS);
	}
	free(part);
cleanup:
	for (int j = 0; j < t; j++)
		free(m[j].p), free(m[j].saved), free(m[j].y), free(m[j].dx), free(m[j].dp),
			free(rec[j].sums);
	free(p), free(x), free(dy), free(ids);
}

/*
 * The cross-attention decoder block (layers_xattn.c against cu_xattn.cu):
 * y, and after the backward dx, dmemory and every parameter gradient,
 * each added into random starting values. `saved` is the backend's own
 * layout (bf16 where only a product reads a tensor back), so it is checked
 * by what it must do: the forward writes nothing past op_saved_elems per
 * sample (a guard after it keeps its bits), and the backward, which reads
 * only saved and the memory, matches. Also: a 2-way split and a shape
 * without a memory are refused (SP_EINPUT), as on the CPU.
 */
static void test_xblock(const char *name, int64_t h, int64_t a, int64_t f, int64_t sq,
			int64_t m, int64_t W, int causal, int n, size_t ws_cap)
{
	sp_opshape_t s = {.type = COMP_TRANSFORMER, .hidden = h, .heads = a, .ffn = f,
			  .seq = sq, .causal = causal, .mem_seq = m, .mem_width = W};
	enum { GUARD = 64 };
	int64_t np, e = n * sq * h, em = n * m * W, ns = op_saved_elems(&s, n) * n;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *mem = hrand(em, 1.0);
	float *y = calloc((size_t)e, 4), *sv = calloc((size_t)ns, 4);
	float *dy = hrand(e, 1.0), *dx = hrand(e, 0.5), *dmem = hrand(em, 0.5);
	float *dp = hrand(np, 0.1);
	float *dx_ref = hcopy(dx, e), *dmem_ref = hcopy(dmem, em), *dp_ref = hcopy(dp, np);
	float *guard = malloc(sizeof(float) * (size_t)(ns + GUARD));
	for (int64_t i = 0; i < ns + GUARD; i++)
		guard[i] = -777.0f;
	int rf = xblock_fwd(&s, NULL, n, p, x, mem, y, sv);
	int rb = xblock_bwd(&s, NULL, n, p, sv, mem, dy, dx_ref, dmem_ref, dp_ref);
	char what[128];
	n_checks++;
	if (rf || rb) {
		printf("FAIL %s: the CPU reference failed (rc %d, %d)\n", name, rf, rb);
		n_fail++;
		goto cleanup;
	}

	if (ws_cap)
		cu_set_workspace_cap(ws_cap);
	float *dP = dev(p, 4 * (size_t)np), *dX = dev(x, 4 * (size_t)e);
	float *dM = dev(mem, 4 * (size_t)em), *dY = dev(NULL, 4 * (size_t)e);
	float *dS = dev(guard, 4 * (size_t)(ns + GUARD)), *dDY = dev(dy, 4 * (size_t)e);
	float *dDX = dev(dx, 4 * (size_t)e), *dDM = dev(dmem, 4 * (size_t)em);
	float *dDP = dev(dp, 4 * (size_t)np);
	rt_tp_t tp2 = {.t = 2, .rank = 0, .ctx = NULL, .allreduce = replay_allreduce};
	sp_opshape_t plain = s;
	plain.mem_seq = plain.mem_width = 0;
	int refused = B->xblock_fwd(&s, &tp2, n, dP, dX, dM, dY, dS) == SP_EINPUT &&
		      B->xblock_bwd(&s, &tp2, n, dP, dS, dM, dDY, dDX, dDM, dDP) == SP_EINPUT &&
		      B->xblock_fwd(&plain, NULL, n, dP, dX, dM, dY, dS) == SP_EINPUT &&
		      B->tblock_fwd(&s, NULL, n, dP, dX, dY, dS) == SP_EINPUT;
	rf = B->xblock_fwd(&s, NULL, n, dP, dX, dM, dY, dS);
	rb = rf ? rf : B->xblock_bwd(&s, NULL, n, dP, dS, dM, dDY, dDX, dDM, dDP);
	B->sync();
	if (ws_cap)
		cu_set_workspace_cap((size_t)2 << 30);
	n_checks += 2;
	if (rf || rb) {
		printf("FAIL %s: rc %d, %d (want 0)\n", name, rf, rb);
		n_fail++;
	}
	if (!refused) {
		printf("FAIL %s: a 2-way split or a shape without a memory was not refused\n",
		       name);
		n_fail++;
	}
	float *gs = fetch(dS, ns + GUARD);
	snprintf(what, sizeof what, "%s saved guard", name);
	check(what, gs + ns, guard + ns, GUARD, 0, 0);
	check_layer(name, &s, dY, y, e, dDX, dx_ref, e, dDP, dp_ref, np);
	float *gdm = fetch(dDM, em);
	snprintf(what, sizeof what, "%s bwd dmemory", name);
	check(what, gdm, dmem_ref, em, BF_TOL, BF_EPS);
	B->release(dP), B->release(dX), B->release(dM), B->release(dY), B->release(dS),
		B->release(dDY), B->release(dDX), B->release(dDM), B->release(dDP);
	free(gs), free(gdm);
cleanup:
	free(p), free(x), free(mem), free(y), free(sv), free(dy), free(dx), free(dmem), free(dp),
		free(dx_ref), free(dmem_ref), free(dp_ref), free(guard);
}

static void test_linear(const char *name, size_t ws_cap)
{
	sp_opshape_t s = {.type = COMP_LINEAR, .in = 24, .out = 20, .seq = 5};
	int n = 3;
	int64_t np, rows = n * s.seq, ex = rows * s.in, ey = rows * s.out;
	int64_t ns = op_saved_elems(&s, n) * n;
	float *p = params(&s, &np), *x = hrand(ex, 1.0), *y = calloc((size_t)ey, 4);
	float *sv = calloc((size_t)ns, 4), *dy = hrand(ey, 1.0), *dx = hrand(ex, 0.5);
	float *dp = hrand(np, 0.1), *dx_ref = hcopy(dx, ex), *dp_ref = hcopy(dp, np);
	linear_fwd(&s, n, p, x, y, sv);
	linear_bwd(&s, n, p, sv, dy, dx_ref, dp_ref);

	float *dP = dev(p, 4 * (size_t)np), *dX = dev(x, 4 * (size_t)ex);
	float *dY = dev(NULL, 4 * (size_t)ey), *dS = dev(NULL, 4 * (size_t)ns);
	float *dDY = dev(dy, 4 * (size_t)ey), *dDX = dev(dx, 4 * (size_t)ex);
	float *dDP = dev(dp, 4 * (size_t)np);
	if (ws_cap)
		cu_set_workspace_cap(ws_cap);
	B->linear_fwd(&s, n, dP, dX, dY, dS);
	B->linear_bwd(&s, n, dP, dS, dDY, dDX, dDP);
	B->sync();
	if (ws_cap)
		cu_set_workspace_cap((size_t)2 << 30);
	check_layer(name, &s, dY, y, ey, dDX, dx_ref, ex, dDP, dp_ref, np);
	char what[96];

	/* the bf16 shadow follows the optimizer and later uploads (both sides
	 * step with the CPU's gradient, so only the shadow can differ) */
	sp_optim_t o = {OPT_ADAMW, 0.05, 0.01, 0.9, 0.999, 1e-8};
	float *m = calloc((size_t)np, 4), *v = calloc((size_t)np, 4);
	float *dM = dev(m, 4 * (size_t)np), *dV = dev(v, 4 * (size_t)np);
	B->to_device(dDP, dp_ref, 4 * (size_t)np);
	adamw_step(p, dp_ref, m, v, np, 1, &o);
	B->adamw_step(dP, dDP, dM, dV, np, 1, &o);
	linear_fwd(&s, n, p, x, y, sv);
	B->linear_fwd(&s, n, dP, dX, dY, dS);
	float *gy = fetch(dY, ey);
	snprintf(what, sizeof what, "%s fwd after adamw", name);
	check(what, gy, y, ey, BF_TOL, BF_EPS);
	for (int64_t i = 0; i < np; i++)
		p[i] = -p[i];
	B->to_device(dP, p, 4 * (size_t)np);
	linear_fwd(&s, n, p, x, y, sv);
	B->linear_fwd(&s, n, dP, dX, dY, dS);
	free(gy);
	gy = fetch(dY, ey);
	snprintf(what, sizeof what, "%s fwd after upload", name);
	check(what, gy, y, ey, BF_TOL, BF_EPS);

	B->release(dP), B->release(dX), B->release(dY), B->release(dS), B->release(dDY),
		B->release(dDX), B->release(dDP), B->release(dM), B->release(dV);
	free(p), free(x), free(y), free(sv), free(dy), free(dx), free(dp), free(dx_ref),
		free(dp_ref), free(gy), free(m), free(v);
}

static void test_lm_head(void)
{
	sp_opshape_t s = {.type = COMP_LM_HEAD, .hidden = 32, .vocab = 50, .seq = 6};
	int n = 3;
	int64_t np, e = n * s.seq * s.hidden, ns = op_saved_elems(&s, n) * n;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *dx = hrand(e, 0.1);
	float *dp = hrand(np, 0.1), *dx_ref = hcopy(dx, e), *dp_ref = hcopy(dp, np);
	float *sv = calloc((size_t)ns, 4);
	int32_t tg[18];
	for (int i = 0; i < 18; i++)
		tg[i] = i % 5 == 4 ? -1 : (int32_t)(urand() * 50);
	for (int i = 12; i < 18; i++)
		tg[i] = -1; /* a sample with no target: loss 0, no gradient */
	double ref = lm_head_loss(&s, n, p, x, tg, 0.7, dx_ref, dp_ref, sv);

	float *dP = dev(p, 4 * (size_t)np), *dX = dev(x, 4 * (size_t)e);
	float *dDX = dev(dx, 4 * (size_t)e), *dDP = dev(dp, 4 * (size_t)np);
	float *dS = dev(NULL, 4 * (size_t)ns);
	int32_t *dT = dev(tg, sizeof tg);
	double got = B->lm_head_loss(&s, n, dP, dX, dT, 0.7, dDX, dDP, dS);
	check_loss("lm_head", &s, got, ref, 0.02, dDX, dx_ref, e, dDP, dp_ref, np, BF_TOL, BF_EPS);
	B->release(dP), B->release(dX), B->release(dDX), B->release(dDP), B->release(dS), B->release(dT);
	free(p), free(x), free(dx), free(dp), free(dx_ref), free(dp_ref), free(sv);
}

static void test_classifier(void)
{
	sp_opshape_t s = {.type = COMP_CLASSIFIER, .hidden = 32, .classes = 5, .seq = 4};
	int n = 4;
	int64_t seq_in = 4, np, e = n * seq_in * s.hidden, ns = op_saved_elems(&s, n) * n;
	float *p = params(&s, &np), *x = hrand(e, 1.0), *dx = hrand(e, 0.1);
	float *dp = hrand(np, 0.1), *dx_ref = hcopy(dx, e), *dp_ref = hcopy(dp, np);
	float *sv = calloc((size_t)ns, 4);
	int32_t lb[4] = {2, -1, 0, 4};
	double ref = classifier_loss(&s, n, seq_in, p, x, lb, 0.7, dx_ref, dp_ref, sv);

	float *dP = dev(p, 4 * (size_t)np), *dX = dev(x, 4 * (size_t)e);
	float *dDX = dev(dx, 4 * (size_t)e), *dDP = dev(dp, 4 * (size_t)np);
	float *dS = dev(NULL, 4 * (size_t)ns);
	int32_t *dL = dev(lb, sizeof lb);
	double got = B->classifier_loss(&s, n, seq_in, dP, dX, dL, 0.7, dDX, dDP, dS);
	check_loss("classifier", &s, got, ref, 1e-5, dDX, dx_ref, e, dDP, dp_ref, np, F32_TOL,
		   F32_EPS);
	B->release(dP), B->release(dX), B->release(dDX), B->release(dDP), B->release(dS), B->release(dL);
	free(p), free(x), free(dx), free(dp), free(dx_ref), free(dp_ref), free(sv);
}

static void test_contrastive(void)
{
	int64_t Bn = 6, w = 16, sa = 3, sb = 2, s0 = 1, s1 = 4;
	sp_opshape_t s = {.type = COMP_CONTRASTIVE, .hidden = w};
	int64_t ea = Bn * sa * w, eb = Bn * sb * w, ns = op_saved_elems(&s, Bn) * Bn;
	float *a = hrand(ea, 1.0), *b = hrand(eb, 1.0), *da = hrand(ea, 0.1), *db = hrand(eb, 0.1);
	float *da_ref = hcopy(da, ea), *db_ref = hcopy(db, eb), *sv = calloc((size_t)ns, 4);
	double ref = contrastive_loss(Bn, w, sa, sb, 0.1, s0, s1, a, b, 0.7, da_ref, db_ref, sv);

	float *dA = dev(a, 4 * (size_t)ea), *dB = dev(b, 4 * (size_t)eb);
	float *dDA = dev(da, 4 * (size_t)ea), *dDB = dev(db, 4 * (size_t)eb);
	float *dS = dev(NULL, 4 * (size_t)ns);
	double got = B->contrastive_loss(Bn, w, sa, sb, 0.1, s0, s1, dA, dB, 0.7, dDA, dDB, dS);
	float *gda = fetch(dDA, ea), *gdb = fetch(dDB, eb);
	check_scalar("contrastive loss", got, ref, 1e-5);
	check("contrastive da", gda, da_ref, ea, 1e-4, 1e-3);
	check("contrastive db", gdb, db_ref, eb, 1e-4, 1e-3);
	B->release(dA), B->release(dB), B->release(dDA), B->release(dDB), B->release(dS);
	free(a), free(b), free(da), free(db), free(da_ref), free(db_ref), free(sv), free(gda),
		free(gdb);
}

static void test_optimizers(void)
{
	int64_t n = 1000;
	float *p = hrand(n, 1.0), *g = hrand(n, 1.0), *m = hrand(n, 0.1), *v = hrand(n, 0.1);
	for (int64_t i = 0; i < n; i++)
		v[i] = fabsf(v[i]);
	float *dP = dev(p, 4 * (size_t)n), *dG = dev(g, 4 * (size_t)n);
	float *dM = dev(m, 4 * (size_t)n), *dV = dev(v, 4 * (size_t)n);
	sp_optim_t o = {OPT_ADAMW, 1e-2, 0.05, 0.9, 0.95, 1e-8};
	adamw_step(p, g, m, v, n, 3, &o);
	B->adamw_step(dP, dG, dM, dV, n, 3, &o);
	float *gp = fetch(dP, n), *gm = fetch(dM, n), *gv = fetch(dV, n);
	check("adamw p", gp, p, n, 1e-6, 1e-5);
	check("adamw m", gm, m, n, 1e-6, 1e-5);
	check("adamw v", gv, v, n, 1e-6, 1e-5);
	sp_optim_t so = {OPT_SGD, 0.1, 0.01, 0, 0, 0};
	sgd_step(p, g, n, &so);
	B->sgd_step(dP, dG, n, &so);
	free(gp);
	gp = fetch(dP, n);
	check("sgd p", gp, p, n, 1e-6, 1e-5);
	B->release(dP), B->release(dG), B->release(dM), B->release(dV);
	free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv);
}

static void test_copies(void)
{
	int64_t rows = 5, cols = 7, ds = 11, ss = 9;
	float *dst = hrand(rows * ds, 1.0), *src = hrand(rows * ss, 1.0);
	float *ref = hcopy(dst, rows * ds);
	float *dD = dev(dst, 4 * (size_t)(rows * ds)), *dSrc = dev(src, 4 * (size_t)(rows * ss));
	for (int acc = 0; acc < 2; acc++) {
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++)
				ref[r * ds + c] = acc ? ref[r * ds + c] + src[r * ss + c] : src[r * ss + c];
		B->copy_rows(dD, ds, dSrc, ss, rows, cols, acc);
		float *got = fetch(dD, rows * ds);
		check(acc ? "copy_rows acc" : "copy_rows", got, ref, rows * ds, 0, 0);
		free(got);
	}
	B->zero(dD + 3, 20);
	memset(ref + 3, 0, 20 * sizeof(float));
	float *got = fetch(dD, rows * ds);
	check("zero", got, ref, rows * ds, 0, 0);
	B->release(dD), B->release(dSrc);
	free(dst), free(src), free(ref), free(got);
}

int main(void)
{
	int up = gpu_start("test_gpu_layers", &comm);
	if (up)
		return up;
	test_embedding();
	test_patch();
	test_tblock("tblock", 32, 4, 48, 7, 0, 3, 0);
	test_tblock("tblock causal", 32, 4, 48, 7, 1, 3, 0);
	test_tblock("tblock dh32", 64, 2, 128, 16, 1, 2, 0);
	test_tblock("tblock chunked", 32, 4, 48, 7, 1, 3, 1);
	test_tblock("tblock s1", 32, 2, 64, 1, 1, 2, 0);
	test_tblock_tp("tblock tp2", 32, 4, 48, 7, 0, 3, 2, 0);
	test_tblock_tp("tblock tp4 causal", 64, 8, 128, 16, 1, 2, 4, 0);
	test_tblock_tp("tblock tp2 chunked", 32, 4, 48, 7, 1, 3, 2, 1);
	/* sequence parallel: whole or sharded ends, the caller's LayerNorm sums */
	test_tblock_sp("tblock sp2 in", 32, 4, 48, 8, 1, 3, 2, 1, 0, 1);
	test_tblock_sp("tblock sp2 whole", 32, 4, 48, 8, 0, 3, 2, 1, 1, 0);
	test_tblock_sp("tblock sp3 out", 48, 6, 96, 6, 1, 2, 3, 0, 1, 0);
	test_tblock_sp("tblock sp3 mid", 48, 6, 96, 6, 0, 2, 3, 0, 0, 1);
	/* vocabulary parallel: t 2 and 4 of 12 and 64 ids */
	test_vocab_tp("embedding tp2", COMP_EMBEDDING, 12, 16, 5, 3, 2);
	test_vocab_tp("embedding tp4", COMP_EMBEDDING, 64, 32, 7, 2, 4);
	test_vocab_tp("lm_head tp2", COMP_LM_HEAD, 50, 32, 6, 3, 2);
	test_vocab_tp("lm_head tp4", COMP_LM_HEAD, 64, 32, 7, 3, 4);
	/* uneven: 11 ids over 3 (4, 4, 3), 50 over 3 (17, 17, 16), 51 over 4 */
	test_vocab_tp("embedding tp3 V11", COMP_EMBEDDING, 11, 16, 5, 3, 3);
	test_vocab_tp("lm_head tp3 V50", COMP_LM_HEAD, 50, 32, 6, 3, 3);
	test_vocab_tp("lm_head tp4 V51", COMP_LM_HEAD, 51, 32, 7, 2, 4);
	/* decoders: m < s and m > s, W != h and W == h, batch > 1, chunked */
	test_xblock("xblock", 32, 4, 48, 7, 5, 24, 0, 3, 0);
	test_xblock("xblock causal m>s", 32, 4, 48, 6, 11, 40, 1, 2, 0);
	test_xblock("xblock dh32 W=h", 64, 2, 128, 16, 9, 64, 1, 2, 0);
	test_xblock("xblock chunked", 32, 4, 48, 7, 5, 24, 1, 3, 1);
	test_xblock("xblock s1", 32, 2, 64, 1, 3, 16, 1, 2, 0);
	test_linear("linear", 0);
	test_linear("linear chunked", 100);
	test_lm_head();
	test_classifier();
	test_contrastive();
	test_optimizers();
	test_copies();
	size_t ws, sh;
	cu_memory_extra(&ws, &sh);
	printf("backend extra memory: workspace %zu bytes, bf16 shadows %zu bytes\n", ws, sh);
	gpu_stop(&comm);
	printf("%d of %d checks failed\n", n_fail, n_checks);
	return n_fail ? 1 : 0;
}
