/*
 * test_layers_tp.c — the tensor-parallel transformer block (layers.c) on a
 * group of t members run in threads (tp_group.c), against the unsplit
 * block: every member's y and dx equal the unsplit ones, the members'
 * shard gradients put back whole (layer_shard) equal the unsplit gradient
 * and agree on the whole tensors, and the split layer's gradient matches
 * finite differences of its own loss. Also: layer_shard round trips, a
 * split the shape refuses is refused, a failing all-reduce is returned.
 * Shape h 12, a 6, f 18, s 5, n 3 allows t = 2 and 3 (tp_ok), not 4.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "layer_check.h"
#include "layers.h"
#include "tp_group.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 12, A = 6, F = 18, S = 5, N = 3, TMAX = 3 };

/*
 * Tolerance of split against unsplit, relative to the largest |ref|: the
 * two differ only in the order fp32 partial sums are added (t partial
 * products instead of one), a few ulps (2^-24 = 6e-8) per sum.
 */
#define TP_RTOL 1e-5

typedef struct {
	sp_opshape_t s;
	sp_component_t c;
	int t;
	int64_t np, nps, nx, per;
	float *p, *x, *dy;              /* whole layer, input, output gradient */
	float *y_ref, *dx_ref, *dp_ref; /* unsplit */
	tp_member_t m[TMAX];
} tp_case_t;

static sp_opshape_t tp_shape(int causal)
{
	return (sp_opshape_t){.type = COMP_TRANSFORMER, .hidden = H, .heads = A, .ffn = F,
			      .seq = S, .causal = causal};
}

static tp_case_t tp_case(int t, int causal)
{
	tp_case_t k;
	memset(&k, 0, sizeof k);
	k.s = tp_shape(causal);
	k.c = layer_comp_of_shape(&k.s);
	k.t = t;
	k.p = random_params(&k.c, &k.np);
	k.nps = comp_layer_params_tp(&k.c, t);
	k.nx = (int64_t)N * S * H;
	k.x = fill(falloc(k.nx), k.nx, -1.0, 1.0);
	k.dy = fill(falloc(k.nx), k.nx, -1.0, 1.0);
	k.y_ref = falloc(k.nx);
	k.dx_ref = falloc(k.nx);
	k.dp_ref = falloc(k.np);
	float *sv = falloc(N * op_saved_elems(&k.s, N));
	assert_int_equal(tblock_fwd(&k.s, NULL, N, k.p, k.x, k.y_ref, sv), 0);
	assert_int_equal(tblock_bwd(&k.s, NULL, N, k.p, sv, k.dy, k.dx_ref, k.dp_ref), 0);
	free(sv);
	k.per = op_saved_elems_tp(&k.s, N, t);
	for (int j = 0; j < t; j++) {
		tp_member_t *m = &k.m[j];
		m->p = falloc(k.nps);
		layer_shard(&k.c, t, j, k.p, m->p, 0);
		m->saved = falloc(N * k.per);
		m->y = falloc(k.nx);
		m->dx = falloc(k.nx);
		m->dp = falloc(k.nps);
	}
	return k;
}

static void tp_case_free(tp_case_t *k)
{
	for (int j = 0; j < k->t; j++) {
		free(k->m[j].p);
		free(k->m[j].saved);
		free(k->m[j].y);
		free(k->m[j].dx);
		free(k->m[j].dp);
	}
	free(k->p), free(k->x), free(k->dy), free(k->y_ref), free(k->dx_ref), free(k->dp_ref);
}

static int close_rel(const char *what, const float *got, const float *ref, int64_t n)
{
	return tp_close_rel(what, got, ref, n, TP_RTOL);
}

/* ---- split against unsplit -------------------------------------------------- */

static void check_split(int t, int causal)
{
	tp_case_t k = tp_case(t, causal);
	char what[64];
	int bad = 0;
	assert_int_equal(tp_group_run(&k.s, t, N, k.x, k.dy, k.m), 0);

	float *g = falloc(k.np);
	for (int j = 0; j < t; j++) {
		snprintf(what, sizeof what, "t %d causal %d member %d y", t, causal, j);
		bad += close_rel(what, k.m[j].y, k.y_ref, k.nx);
		snprintf(what, sizeof what, "t %d causal %d member %d dx", t, causal, j);
		bad += close_rel(what, k.m[j].dx, k.dx_ref, k.nx);
	}
	/* whole tensors: the same bits on every member */
	float *dp[TMAX];
	for (int j = 0; j < t; j++)
		dp[j] = k.m[j].dp;
	bad += tp_put_back(&k.c, t, dp, g, k.np);
	snprintf(what, sizeof what, "t %d causal %d dparams (put back)", t, causal);
	bad += close_rel(what, g, k.dp_ref, k.np);
	free(g);
	tp_case_free(&k);
	assert_int_equal(bad, 0);
}

static void test_split(void **state)
{
	(void)state;
	for (int t = 2; t <= 3; t++)
		for (int causal = 0; causal < 2; causal++)
			check_split(t, causal);
}

/* ---- finite differences of the split layer's own loss ------------------------ */

/* Loss sum(y r) of member 0's y, whole parameters k->p sharded afresh. */
typedef struct {
	tp_case_t *k;
	float *r;
} fd_ctx_t;

static double split_obj(void *ctx)
{
	fd_ctx_t *f = ctx;
	tp_case_t *k = f->k;
	for (int j = 0; j < k->t; j++)
		layer_shard(&k->c, k->t, j, k->p, k->m[j].p, 0);
	assert_int_equal(tp_group_run(&k->s, k->t, N, k->x, NULL, k->m), 0);
	return dot(k->m[0].y, f->r, k->nx);
}

static void check_split_fd(int t, int causal)
{
	tp_case_t k = tp_case(t, causal);
	fd_ctx_t f = {&k, k.dy}; /* dL/dy = r = dy */
	assert_int_equal(tp_group_run(&k.s, t, N, k.x, k.dy, k.m), 0);
	float *g = falloc(k.np);
	for (int j = 0; j < t; j++)
		layer_shard(&k.c, t, j, g, k.m[j].dp, 1);
	char what[64];
	snprintf(what, sizeof what, "split t %d causal %d dparams", t, causal);
	int bad = check_fd(what, split_obj, &f, k.p, g, k.np, 1e-2);
	snprintf(what, sizeof what, "split t %d causal %d dx", t, causal);
	bad += check_fd(what, split_obj, &f, k.x, k.m[0].dx, k.nx, 1e-2);
	free(g);
	tp_case_free(&k);
	assert_int_equal(bad, 0);
}

/* FD on two of the four (t, causal) cases: each costs 2 (params + x) group runs */
static void test_split_fd(void **state)
{
	(void)state;
	for (int t = 2; t <= 3; t++)
		check_split_fd(t, t == 2);
}

/* ---- shards, refusals, errors ---------------------------------------------- */

static void test_shard_round_trip(void **state)
{
	(void)state;
	sp_opshape_t s = tp_shape(0);
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np;
	float *full = random_params(&c, &np), *back = falloc(np);
	for (int t = 1; t <= 3; t++) {
		int64_t nps = comp_layer_params_tp(&c, t);
		float *sh = falloc(nps);
		layer_tensor_t lt[LAYER_TENSORS_MAX];
		layer_tensors_tp(&c, t, lt);
		assert_int_equal(lt[11].offset + lt[11].rows * lt[11].cols, nps);
		for (int64_t i = 0; i < np; i++)
			back[i] = NAN;
		for (int j = 0; j < t; j++) {
			layer_shard(&c, t, j, full, sh, 0);
			layer_shard(&c, t, j, back, sh, 1);
		}
		/* every element written back (no NaN left), and equal */
		assert_memory_equal(back, full, sizeof(float) * (size_t)np);
		free(sh);
	}
	free(full), free(back);
}

static void test_refused_and_errors(void **state)
{
	(void)state;
	sp_opshape_t s = tp_shape(1);
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np, nx = (int64_t)N * S * H;
	float *p = random_params(&c, &np), *x = fill(falloc(nx), nx, -1, 1);
	float *y = falloc(nx), *dx = falloc(nx), *dp = falloc(np);
	float *sv = falloc(N * op_saved_elems(&s, N));
	int calls = 0;
	/* heads 6 and ffn 18: t 4 and 5 refused; rank outside [0, t); no hook */
	rt_tp_t bad[] = {{.t = 4, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 5, .rank = 1, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = 2, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = -1, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 0, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = 0, .ctx = &calls, .allreduce = NULL}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(tblock_fwd(&s, &bad[i], N, p, x, y, sv), SP_EINPUT);
		assert_int_equal(tblock_bwd(&s, &bad[i], N, p, sv, x, dx, dp), SP_EINPUT);
	}
	assert_int_equal(calls, 0);
	for (int64_t i = 0; i < nx; i++)
		assert_true(y[i] == 0.0f && dx[i] == 0.0f);
	/* the hook's code comes back at once: one call per direction */
	rt_tp_t fails = {.t = 2, .rank = 1, .ctx = &calls, .allreduce = tp_failing_allreduce};
	assert_int_equal(tblock_fwd(&s, &fails, N, p, x, y, sv), SP_EIO);
	assert_int_equal(calls, 1);
	assert_int_equal(tblock_bwd(&s, &fails, N, p, sv, x, dx, dp), SP_EIO);
	assert_int_equal(calls, 2);
	/* no samples: the calls still happen, so the members' calls pair up */
	assert_int_equal(tblock_fwd(&s, &fails, 0, p, x, y, sv), SP_EIO);
	assert_int_equal(tblock_bwd(&s, &fails, 0, p, sv, x, dx, dp), SP_EIO);
	assert_int_equal(calls, 4);
	/* t == 1 through a hook: the unsplit block, no call */
	rt_tp_t one = {.t = 1, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce};
	assert_int_equal(tblock_fwd(&s, &one, N, p, x, y, sv), 0);
	assert_int_equal(tblock_bwd(&s, &one, N, p, sv, x, dx, dp), 0);
	assert_int_equal(calls, 4);
	free(p), free(x), free(y), free(dx), free(dp), free(sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_split_fd),
		cmocka_unit_test(test_shard_round_trip),
		cmocka_unit_test(test_refused_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
