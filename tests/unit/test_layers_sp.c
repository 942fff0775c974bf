/*
 * test_layers_sp.c — the sequence-parallel transformer block
 * (layers_sp.c) on a group of t members run in threads (tp_group.c),
 * against the unsplit block: at t = 2 and 3, causal or not, with the
 * input and output whole or as token shards (the four whole_in/whole_out
 * combinations), every member's y and dx equal the unsplit ones on the
 * rows it has, the shard gradients put back whole equal the unsplit
 * gradient and every whole tensor's gradient is equal on every member,
 * and the split layer's gradient matches finite differences of its own
 * loss. Also: a seq that t does not divide, a missing hook and a decoder
 * shape are refused with nothing written, a failing hook's code comes
 * back, and the saved size is op_saved_elems_sp's.
 * Shape h 12, a 6, f 18, s 6, n 3: t = 2 and 3 divide heads, ffn and seq.
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

enum { H = 12, A = 6, F = 18, S = 6, N = 3, TMAX = 3 };

/* as test_layers_tp.c: split and unsplit differ in the order of fp32 sums */
#define SP_RTOL 1e-5

typedef struct {
	sp_opshape_t s;
	sp_component_t c;
	int t, whole_in, whole_out;
	int64_t np, nps, nx, per;
	float *p, *x, *dy;              /* whole layer, input, output gradient */
	float *y_ref, *dx_ref, *dp_ref; /* unsplit */
	float *ps[TMAX], *saved[TMAX], *y[TMAX], *dx[TMAX], *dp[TMAX];
	float *acc[TMAX]; /* not NULL: the caller's LayerNorm gradients (ln_grads, [4H]) */
	int bwd; /* run the backward too */
} sp_case_t;

static sp_opshape_t sp_shape(int causal)
{
	return (sp_opshape_t){.type = COMP_TRANSFORMER, .hidden = H, .heads = A, .ffn = F,
			      .seq = S, .causal = causal};
}

static sp_case_t sp_case(int t, int causal, int whole_in, int whole_out)
{
	sp_case_t k;
	memset(&k, 0, sizeof k);
	k.s = sp_shape(causal);
	k.c = layer_comp_of_shape(&k.s);
	k.t = t;
	k.whole_in = whole_in;
	k.whole_out = whole_out;
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
	k.per = op_saved_elems_sp(&k.s, N, t, 1);
	for (int j = 0; j < t; j++) {
		k.ps[j] = falloc(k.nps);
		layer_shard(&k.c, t, j, k.p, k.ps[j], 0);
		k.saved[j] = falloc(N * k.per);
		k.y[j] = falloc(k.nx);
		k.dx[j] = falloc(k.nx);
		k.dp[j] = falloc(k.nps);
	}
	return k;
}

static void sp_case_free(sp_case_t *k)
{
	for (int j = 0; j < k->t; j++)
		free(k->ps[j]), free(k->saved[j]), free(k->y[j]), free(k->dx[j]), free(k->dp[j]),
			free(k->acc[j]);
	free(k->p), free(k->x), free(k->dy), free(k->y_ref), free(k->dx_ref), free(k->dp_ref);
}

/* Member j's rows of a whole [N S H] buffer (its token shard). */
static int64_t shard_off(const sp_case_t *k, int j)
{
	return k->nx / k->t * j;
}

typedef struct {
	sp_case_t *k;
	int j;
} member_arg_t;

/* One member: forward, then (k->bwd) backward, on whole or shard buffers. */
static int run_member(const rt_tp_t *tp0, void *arg)
{
	member_arg_t *a = arg;
	sp_case_t *k = a->k;
	int j = a->j;
	rt_tp_t tp = *tp0;
	tp.sp = 1;
	tp.whole_in = k->whole_in;
	tp.whole_out = k->whole_out;
	if (k->acc[j]) { /* one layer's: its [4H] at 0 */
		tp.ln_grads = k->acc[j];
		tp.ln_n = 4 * H;
	}
	int64_t o = shard_off(k, j);
	const float *x = k->whole_in ? k->x : k->x + o;
	const float *dy = k->whole_out ? k->dy : k->dy + o;
	int rc = tblock_fwd(&k->s, &tp, N, k->ps[j], x, k->y[j], k->saved[j]);
	if (rc || !k->bwd)
		return rc;
	return tblock_bwd(&k->s, &tp, N, k->ps[j], k->saved[j], dy, k->dx[j], k->dp[j]);
}

static int run_group(sp_case_t *k, int bwd)
{
	member_arg_t a[TMAX];
	void *args[TMAX];
	k->bwd = bwd;
	for (int j = 0; j < k->t; j++) {
		a[j] = (member_arg_t){k, j};
		args[j] = &a[j];
	}
	return tp_group_each(k->t, run_member, args, NULL);
}

/* ---- split against unsplit -------------------------------------------------- */

/*
 * acc: the members pass their own LayerNorm gradients' buffer (ln_grads),
 * the caller's way of a slice (interp.c); the slice's first layer
 * (whole_in) sums it over the group on its gather of dx, and the test adds
 * it into the gradients as the caller does (ln1_g, ln1_b, ln2_g, ln2_b:
 * tensors 0, 1, 6, 7), after checking that nothing else went there.
 */
static void check_split(int t, int causal, int whole_in, int whole_out, int acc)
{
	sp_case_t k = sp_case(t, causal, whole_in, whole_out);
	char what[96];
	int bad = 0;
	layer_tensor_t st[LAYER_TENSORS_MAX];
	layer_tensors_tp(&k.c, t, st);
	for (int j = 0; j < t && acc; j++)
		k.acc[j] = falloc(4 * H);
	assert_int_equal(run_group(&k, 1), 0);
	for (int j = 0; j < t && acc; j++) {
		static const int ln[4] = {0, 1, 6, 7};
		for (int q = 0; q < 4; q++)
			for (int64_t e = 0; e < H; e++) {
				float *d = &k.dp[j][st[ln[q]].offset + e];
				bad += *d != 0.0f; /* the layer left them to the caller */
				*d += k.acc[j][q * H + e];
			}
	}
	int64_t R = k.nx / t;
	float *g = falloc(k.np);
	for (int j = 0; j < t; j++) {
		int64_t o = shard_off(&k, j);
		snprintf(what, sizeof what, "t %d causal %d in %d out %d member %d y", t, causal,
			 whole_in, whole_out, j);
		bad += whole_out ? tp_close_rel(what, k.y[j], k.y_ref, k.nx, SP_RTOL)
				 : tp_close_rel(what, k.y[j], k.y_ref + o, R, SP_RTOL);
		snprintf(what, sizeof what, "t %d causal %d in %d out %d member %d dx", t, causal,
			 whole_in, whole_out, j);
		bad += whole_in ? tp_close_rel(what, k.dx[j], k.dx_ref, k.nx, SP_RTOL)
				: tp_close_rel(what, k.dx[j], k.dx_ref + o, R, SP_RTOL);
	}
	/* whole tensors (LayerNorms, b_o, b_2): the same bits on every member */
	bad += tp_put_back(&k.c, t, k.dp, g, k.np);
	snprintf(what, sizeof what, "t %d causal %d in %d out %d dparams (put back)", t, causal,
		 whole_in, whole_out);
	bad += tp_close_rel(what, g, k.dp_ref, k.np, SP_RTOL);
	free(g);
	sp_case_free(&k);
	assert_int_equal(bad, 0);
}

static void test_split(void **state)
{
	(void)state;
	for (int t = 2; t <= 3; t++)
		for (int causal = 0; causal < 2; causal++)
			for (int io = 0; io < 4; io++)
				check_split(t, causal, io & 1, io >> 1, 0);
	/* the caller's LayerNorm gradients, summed by a whole_in layer */
	for (int t = 2; t <= 3; t++)
		for (int out = 0; out < 2; out++)
			check_split(t, t == 2, 1, out, 1);
}

/* ---- finite differences of the split layer's own loss ------------------------ */

/* Loss sum(y r) over the members' token shards (output as shards), the
 * whole parameters k->p sharded afresh. */
static double split_obj(void *ctx)
{
	sp_case_t *k = ctx;
	for (int j = 0; j < k->t; j++)
		layer_shard(&k->c, k->t, j, k->p, k->ps[j], 0);
	assert_int_equal(run_group(k, 0), 0);
	double l = 0;
	int64_t R = k->nx / k->t;
	for (int j = 0; j < k->t; j++)
		l += dot(k->y[j], k->dy + shard_off(k, j), R);
	return l;
}

static void check_split_fd(int t, int causal)
{
	/* input whole (dx whole on every member), output as shards */
	sp_case_t k = sp_case(t, causal, 1, 0);
	assert_int_equal(run_group(&k, 1), 0);
	float *g = falloc(k.np);
	for (int j = 0; j < t; j++)
		layer_shard(&k.c, t, j, g, k.dp[j], 1);
	char what[64];
	snprintf(what, sizeof what, "sp t %d causal %d dparams", t, causal);
	int bad = check_fd(what, split_obj, &k, k.p, g, k.np, 1e-2);
	snprintf(what, sizeof what, "sp t %d causal %d dx", t, causal);
	bad += check_fd(what, split_obj, &k, k.x, k.dx[t - 1], k.nx, 1e-2);
	free(g);
	sp_case_free(&k);
	assert_int_equal(bad, 0);
}

static void test_split_fd(void **state)
{
	(void)state;
	for (int t = 2; t <= 3; t++)
		check_split_fd(t, t == 2);
}

/* ---- sizes, refusals, errors ------------------------------------------------ */

static void test_saved_size(void **state)
{
	(void)state;
	sp_opshape_t s = sp_shape(0);
	/* 2 s h + (s/t)(2h + 4) + s (4 h/t + 2 f/t) + (a/t) s^2, written out */
	assert_int_equal(op_saved_elems_sp(&s, N, 2, 1),
			 2 * S * H + 3 * (2 * H + 4) + S * (4 * 6 + 2 * 9) + 3 * S * S);
	assert_int_equal(op_saved_elems_sp(&s, N, 3, 1),
			 2 * S * H + 2 * (2 * H + 4) + S * (4 * 4 + 2 * 6) + 2 * S * S);
	/* sp off, or a seq t does not divide: the plain shard's */
	assert_int_equal(op_saved_elems_sp(&s, N, 2, 0), op_saved_elems_tp(&s, N, 2));
	s.seq = 5;
	assert_int_equal(sp_ok(&s, 2), 0);
	assert_int_equal(op_saved_elems_sp(&s, N, 2, 1), op_saved_elems_tp(&s, N, 2));
	assert_int_equal(op_kept_elems(&s, 2, 1), 5 * H);
	s.seq = S;
	assert_int_equal(op_kept_elems(&s, 3, 1), 2 * H);
	assert_true(op_saved_elems_sp(&s, N, 2, 1) < op_saved_elems_tp(&s, N, 2));
}

static int ok_hook(void *ctx, float *buf, int64_t n)
{
	(void)ctx, (void)buf, (void)n;
	return 0;
}

static void test_refused_and_errors(void **state)
{
	(void)state;
	sp_opshape_t s = sp_shape(1);
	sp_component_t c = layer_comp_of_shape(&s);
	int64_t np, nx = (int64_t)N * S * H;
	float *p = random_params(&c, &np), *x = fill(falloc(nx), nx, -1, 1);
	float *y = falloc(nx), *dx = falloc(nx), *dp = falloc(np);
	float *sv = falloc(N * op_saved_elems(&s, N));
	int calls = 0;
	rt_tp_t tp = {.t = 2, .rank = 1, .ctx = &calls, .sp = 1,
		      .allreduce = tp_failing_allreduce,
		      .reduce_scatter = tp_failing_allreduce,
		      .allgather = tp_failing_allreduce};
	/* a seq t does not divide; no reduce-scatter; no all-gather; a decoder */
	sp_opshape_t s5 = s, dec = s;
	s5.seq = 5;
	dec.mem_seq = 4;
	dec.mem_width = H;
	rt_tp_t no_rs = tp, no_ag = tp;
	no_rs.reduce_scatter = NULL;
	no_ag.allgather = NULL;
	assert_int_equal(tblock_fwd(&s5, &tp, N, p, x, y, sv), SP_EINPUT);
	assert_int_equal(tblock_bwd(&s5, &tp, N, p, sv, x, dx, dp), SP_EINPUT);
	assert_int_equal(tblock_fwd(&s, &no_rs, N, p, x, y, sv), SP_EINPUT);
	assert_int_equal(tblock_bwd(&s, &no_ag, N, p, sv, x, dx, dp), SP_EINPUT);
	assert_int_equal(tblock_fwd(&dec, &tp, N, p, x, y, sv), SP_EINPUT);
	assert_int_equal(calls, 0);
	for (int64_t i = 0; i < nx; i++)
		assert_true(y[i] == 0.0f && dx[i] == 0.0f);
	/* the first hook's code comes back at once: forward gathers ln1 first,
	 * backward gathers dy first (both as shards) */
	assert_int_equal(tblock_fwd(&s, &tp, N, p, x, y, sv), SP_EIO);
	assert_int_equal(calls, 1);
	assert_int_equal(tblock_bwd(&s, &tp, N, p, sv, x, dx, dp), SP_EIO);
	assert_int_equal(calls, 2);
	/* no samples: the collectives still happen, so the members' calls pair up */
	assert_int_equal(tblock_fwd(&s, &tp, 0, p, x, y, sv), SP_EIO);
	assert_int_equal(calls, 3);
	/* whole input: no gather of ln1, the output projection's reduce-scatter fails */
	rt_tp_t rs_fails = tp;
	rs_fails.allgather = ok_hook;
	rs_fails.whole_in = 1;
	assert_int_equal(tblock_fwd(&s, &rs_fails, N, p, x, y, sv), SP_EIO);
	assert_int_equal(calls, 4);
	free(p), free(x), free(y), free(dx), free(dp), free(sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_split_fd),
		cmocka_unit_test(test_saved_size),
		cmocka_unit_test(test_refused_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
