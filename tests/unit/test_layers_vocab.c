/*
 * test_layers_vocab.c — the vocabulary-parallel embedding and LM head
 * (layers_vocab.c) on groups of t members run in threads (tp_group.c's
 * tp_group_each), against the unsplit layers of layers.c: the split
 * embedding's output equals the unsplit one bit for bit on every member,
 * and so do its gradients put back whole;
 * the LM head's loss and dx are the same bits on every member and equal
 * the unsplit ones within TP_RTOL; shard gradients put back whole
 * (layer_shard) equal the unsplit gradients, the whole tensors' gradients
 * agree across members; finite differences of the split layers' own
 * objectives; layer_shard round trips and the shard sizes; refused splits
 * and a failing all-reduce or all-gather. The split embedding shares the
 * position rows among the members (forward: the (sample, position) rows,
 * backward: the position gradient's elements, all-gathered), cut where
 * seq 5 and its 40 elements do not divide by t; it also adds into
 * gradients that already hold a value (as over micro-batches), with n 0
 * (collectives only) and 1 (fewer rows than some shares need).
 * Vocabularies 12 (t = 2, 3, 4 divide it), 7 and
 * 11 (uneven shards: vocab_shard's, the first V % t members one more; the
 * padding of a smaller member's shard stays zero); more members than ids
 * are refused.
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

enum { H = 8, S = 5, N = 3, TMAX = 4 };

/* The vocabulary of the shapes below (test_split and test_split_fd set it). */
static int64_t V = 12;
static const int64_t VOCABS[] = {12, 7, 11};

/* Split against unsplit differ in the order fp32 partial sums are added
 * (t partial products), and the LM head's per-member sums of exponentials
 * are rounded to fp32 before they are combined: a few ulps. */
#define TP_RTOL 1e-5

static sp_opshape_t shape(sp_comp_type_t type)
{
	return (sp_opshape_t){.type = type, .hidden = H, .seq = S, .vocab = V};
}

static int close_rel(const char *what, const float *got, const float *ref, int64_t n)
{
	return tp_close_rel(what, got, ref, n, TP_RTOL);
}

/* Token ids in [0, V); targets too, with some ignored (-1) and sample 1
 * wholly ignored (no loss, no gradient). */
static void make_ids(int32_t *tok, int32_t *tgt)
{
	for (int64_t i = 0; i < (int64_t)N * S; i++) {
		tok[i] = (int32_t)urand(0, V);
		tgt[i] = urand(0, 1) < 0.2 ? -1 : (int32_t)urand(0, V);
		if (i / S == 1)
			tgt[i] = -1;
	}
	tgt[0] = 0;
	tgt[S - 1] = V - 1; /* the first and last columns are targets */
}

/* ---- one member's call ------------------------------------------------------ */

typedef struct {
	const sp_opshape_t *s;
	int n; /* the embedding's samples (N unless a test sets fewer) */
	const int32_t *ids; /* tokens or targets */
	const float *x, *dy;
	double scale;
	float *p, *saved, *y, *dx, *dp;
	double loss;
} member_t;

static int embed_member(const rt_tp_t *tp, void *arg)
{
	member_t *m = arg;
	int rc = embedding_fwd_tp(m->s, tp, m->n, m->p, m->ids, m->y, m->saved);
	if (!rc && m->dy)
		rc = embedding_bwd_tp(m->s, tp, m->n, m->saved, m->dy, m->dp);
	return rc;
}

static int head_member(const rt_tp_t *tp, void *arg)
{
	member_t *m = arg;
	return lm_head_loss_tp(m->s, tp, N, m->p, m->x, m->ids, m->scale, m->dx, m->dp,
			       m->saved, &m->loss);
}

typedef struct {
	sp_opshape_t s;
	sp_component_t c;
	int t;
	int64_t np, nps, nx;
	float *p, *x, *dy;
	int32_t tok[N * S], tgt[N * S];
	member_t m[TMAX];
	void *args[TMAX];
} vcase_t;

static void vcase_init(vcase_t *k, sp_comp_type_t type, int t)
{
	memset(k, 0, sizeof *k);
	k->s = shape(type);
	k->c = layer_comp_of_shape(&k->s);
	k->t = t;
	k->p = random_params(&k->c, &k->np);
	k->nps = comp_layer_params_tp(&k->c, t);
	k->nx = (int64_t)N * S * H;
	k->x = fill(falloc(k->nx), k->nx, -1.0, 1.0);
	k->dy = fill(falloc(k->nx), k->nx, -1.0, 1.0);
	make_ids(k->tok, k->tgt);
	for (int j = 0; j < t; j++) {
		member_t *m = &k->m[j];
		*m = (member_t){.s = &k->s, .n = N, .ids = type == COMP_EMBEDDING ? k->tok : k->tgt,
				.x = k->x, .dy = k->dy, .scale = 0.7};
		m->p = falloc(k->nps);
		layer_shard(&k->c, t, j, k->p, m->p, 0);
		m->saved = falloc(N * op_saved_elems_tp(&k->s, N, t));
		m->y = falloc(k->nx);
		m->dx = falloc(k->nx);
		m->dp = falloc(k->nps);
		k->args[j] = m;
	}
}

static void vcase_free(vcase_t *k)
{
	for (int j = 0; j < k->t; j++)
		free(k->m[j].p), free(k->m[j].saved), free(k->m[j].y), free(k->m[j].dx),
			free(k->m[j].dp);
	free(k->p), free(k->x), free(k->dy);
}

static int run(vcase_t *k)
{
	for (int j = 0; j < k->t; j++) {
		memset(k->m[j].dx, 0, sizeof(float) * (size_t)k->nx);
		memset(k->m[j].dp, 0, sizeof(float) * (size_t)k->nps);
	}
	return tp_group_each(k->t, k->s.type == COMP_EMBEDDING ? embed_member : head_member,
			     k->args, NULL);
}

/* The members' gradients put back whole into g; counts the whole tensors
 * whose gradient differs from member 0's. */
static int put_back(vcase_t *k, float *g)
{
	float *dp[TMAX];
	for (int j = 0; j < k->t; j++)
		dp[j] = k->m[j].dp;
	return tp_put_back(&k->c, k->t, dp, g, k->np);
}

/* Counts the members whose shard gradient has a nonzero past their ids
 * (the token table's last rows, the LM head's last columns of each row:
 * a member with fewer ids than vocab_shard_max leaves them alone). */
static int padding_written(const vcase_t *k)
{
	int bad = 0;
	int64_t vm = vocab_shard_max(V, k->t);
	for (int j = 0; j < k->t; j++) {
		int64_t vl = vocab_shard(V, k->t, j, NULL), nz = 0;
		const float *g = k->m[j].dp;
		if (k->s.type == COMP_EMBEDDING)
			for (int64_t i = vl * H; i < vm * H; i++)
				nz += g[i] != 0.0f;
		else
			for (int64_t r = 0; r < H; r++)
				for (int64_t c = vl; c < vm; c++)
					nz += g[2 * H + r * vm + c] != 0.0f;
		if (nz) {
			fprintf(stderr, "V %lld t %d member %d: %lld gradients in its padding\n",
				(long long)V, k->t, j, (long long)nz);
			bad++;
		}
	}
	return bad;
}

/* ---- split against unsplit -------------------------------------------------- */

static void check_embedding(int t)
{
	vcase_t k;
	vcase_init(&k, COMP_EMBEDDING, t);
	float *y = falloc(k.nx), *dp = falloc(k.np), *g = falloc(k.np);
	float *sv = falloc(N * op_saved_elems(&k.s, N));
	embedding_fwd(&k.s, N, k.p, k.tok, y, sv);
	embedding_bwd(&k.s, N, sv, k.dy, dp);
	assert_int_equal(run(&k), 0);
	int bad = 0;
	for (int j = 0; j < t; j++)
		if (memcmp(k.m[j].y, y, sizeof(float) * (size_t)k.nx)) {
			fprintf(stderr, "embedding t %d member %d: y differs from the unsplit "
					"layer's bits\n",
				t, j);
			bad++;
		}
	bad += put_back(&k, g) + padding_written(&k);
	/* every gradient element has the unsplit one's terms in its order */
	if (memcmp(g, dp, sizeof(float) * (size_t)k.np)) {
		fprintf(stderr, "embedding V %lld t %d: dparams (put back) differ from the unsplit "
				"layer's bits\n",
			(long long)V, t);
		bad++;
	}
	free(y), free(dp), free(g), free(sv);
	vcase_free(&k);
	assert_int_equal(bad, 0);
}

/*
 * The split embedding adds into gradients that hold a value already (the
 * same whole one sharded on every member, as after an earlier
 * micro-batch) with n samples (0: only the collectives, which must still
 * meet): y and the gradients put back equal the unsplit layer's bits from
 * the same start.
 */
static void check_embedding_acc(int t, int n)
{
	vcase_t k;
	vcase_init(&k, COMP_EMBEDDING, t);
	float *y = falloc(k.nx), *g = falloc(k.np);
	float *dp = fill(falloc(k.np), k.np, -1.0, 1.0);
	float *sv = falloc(N * op_saved_elems(&k.s, N));
	for (int j = 0; j < t; j++) {
		k.m[j].n = n;
		layer_shard(&k.c, t, j, dp, k.m[j].dp, 0);
	}
	embedding_fwd(&k.s, n, k.p, k.tok, y, sv);
	embedding_bwd(&k.s, n, sv, k.dy, dp);
	assert_int_equal(tp_group_each(t, embed_member, k.args, NULL), 0);
	int bad = 0;
	for (int j = 0; j < t; j++)
		if (memcmp(k.m[j].y, y, sizeof(float) * (size_t)n * S * H)) {
			fprintf(stderr, "embedding t %d n %d member %d: y differs\n", t, n, j);
			bad++;
		}
	bad += put_back(&k, g) + padding_written(&k);
	if (memcmp(g, dp, sizeof(float) * (size_t)k.np)) {
		fprintf(stderr, "embedding V %lld t %d n %d: accumulated dparams differ from the "
				"unsplit layer's bits\n",
			(long long)V, t, n);
		bad++;
	}
	free(y), free(g), free(dp), free(sv);
	vcase_free(&k);
	assert_int_equal(bad, 0);
}

static void check_head(int t)
{
	vcase_t k;
	vcase_init(&k, COMP_LM_HEAD, t);
	float *dx = falloc(k.nx), *dp = falloc(k.np), *g = falloc(k.np);
	float *sv = falloc(N * op_saved_elems(&k.s, N));
	double loss = lm_head_loss(&k.s, N, k.p, k.x, k.tgt, 0.7, dx, dp, sv);
	assert_int_equal(run(&k), 0);
	int bad = 0;
	char what[64];
	for (int j = 0; j < t; j++) {
		if (k.m[j].loss != k.m[0].loss ||
		    memcmp(k.m[j].dx, k.m[0].dx, sizeof(float) * (size_t)k.nx)) {
			fprintf(stderr, "lm head t %d member %d: loss %.17g or dx differs from "
					"member 0's (loss %.17g)\n",
				t, j, k.m[j].loss, k.m[0].loss);
			bad++;
		}
	}
	if (fabs(k.m[0].loss - loss) > 1e-6 * fabs(loss)) {
		fprintf(stderr, "lm head t %d: loss %.9g, unsplit %.9g\n", t, k.m[0].loss, loss);
		bad++;
	}
	snprintf(what, sizeof what, "lm head t %d dx", t);
	bad += close_rel(what, k.m[0].dx, dx, k.nx);
	bad += put_back(&k, g) + padding_written(&k);
	snprintf(what, sizeof what, "lm head t %d dparams (put back)", t);
	bad += close_rel(what, g, dp, k.np);
	free(dx), free(dp), free(g), free(sv);
	vcase_free(&k);
	assert_int_equal(bad, 0);
}

static void test_split(void **state)
{
	(void)state;
	for (int v = 0; v < 3; v++) {
		V = VOCABS[v];
		for (int t = 2; t <= TMAX; t++) {
			check_embedding(t);
			for (int n = 0; n <= N; n += 1 + (n > 0))
				check_embedding_acc(t, n);
			check_head(t);
		}
	}
	V = 12;
}

/* ---- finite differences of the split layers' own objectives ------------------ */

/* Embedding: sum(y r) of member 1's y; LM head: member 1's loss. The whole
 * parameters (or x) are perturbed and sharded afresh. */
static double split_obj(void *ctx)
{
	vcase_t *k = ctx;
	for (int j = 0; j < k->t; j++) {
		layer_shard(&k->c, k->t, j, k->p, k->m[j].p, 0);
		k->m[j].dy = NULL;
	}
	assert_int_equal(run(k), 0);
	for (int j = 0; j < k->t; j++)
		k->m[j].dy = k->dy;
	return k->s.type == COMP_EMBEDDING ? dot(k->m[1].y, k->dy, k->nx) : k->m[1].loss;
}

static void check_fd_split(sp_comp_type_t type, int t)
{
	vcase_t k;
	vcase_init(&k, type, t);
	for (int j = 0; j < t; j++)
		k.m[j].scale = 1.0;
	assert_int_equal(run(&k), 0);
	float *g = falloc(k.np);
	put_back(&k, g);
	/* the objective's runs overwrite the members' dx: keep member 1's */
	float *dx = falloc(k.nx);
	memcpy(dx, k.m[1].dx, sizeof(float) * (size_t)k.nx);
	char what[64];
	const char *nm = type == COMP_EMBEDDING ? "embedding" : "lm head";
	snprintf(what, sizeof what, "split %s t %d dparams", nm, t);
	int bad = check_fd(what, split_obj, &k, k.p, g, k.np, 1e-2);
	if (type == COMP_LM_HEAD) {
		snprintf(what, sizeof what, "split %s t %d dx", nm, t);
		bad += check_fd(what, split_obj, &k, k.x, dx, k.nx, 1e-2);
	}
	free(g), free(dx);
	vcase_free(&k);
	assert_int_equal(bad, 0);
}

static void test_split_fd(void **state)
{
	(void)state;
	for (int v = 0; v < 3; v++) {
		V = VOCABS[v];
		for (int t = 2; t <= 3; t++) {
			check_fd_split(COMP_EMBEDDING, t);
			check_fd_split(COMP_LM_HEAD, t);
		}
	}
	V = 12;
}

/* ---- shards, sizes, refusals, errors ---------------------------------------- */

/* vocab_shard: the first V % t members have V / t + 1 ids, the rest V / t,
 * in order and covering [0, V); the largest is member 0's. */
static void check_vocab_shards(int64_t vocab, int t)
{
	int64_t next = 0, most = 0;
	for (int j = 0; j < t; j++) {
		int64_t v0, vl = vocab_shard(vocab, t, j, &v0);
		assert_int_equal(v0, next);
		assert_int_equal(vl, vocab / t + (j < vocab % t));
		next += vl;
		most = vl > most ? vl : most;
	}
	assert_int_equal(next, vocab);
	assert_int_equal(vocab_shard_max(vocab, t), most);
}

static void test_shards(void **state)
{
	(void)state;
	sp_comp_type_t types[] = {COMP_EMBEDDING, COMP_LM_HEAD};
	for (int v = 0; v < 3; v++)
		for (int q = 0; q < 2; q++) {
			V = VOCABS[v];
			sp_opshape_t s = shape(types[q]);
			sp_component_t c = layer_comp_of_shape(&s);
			int64_t np;
			float *full = random_params(&c, &np), *back = falloc(np);
			/* t up to V splits (uneven too), more members than ids not */
			assert_true(tp_ok(s.type, 0, 0, V, 5) && tp_ok(s.type, 0, 0, V, (int)V) &&
				    !tp_ok(s.type, 0, 0, V, (int)V + 1) && !tp_ok(s.type, 0, 0, 3, 4));
			for (int t = 1; t <= TMAX; t++) {
				check_vocab_shards(V, t);
				int64_t nps = comp_layer_params_tp(&c, t), vm = (V + t - 1) / t;
				/* the shard: ceil(V/t) rows or columns, the rest whole */
				assert_int_equal(nps, types[q] == COMP_EMBEDDING ? (vm + S) * H
										: 2 * H + H * vm);
				layer_tensor_t lt[LAYER_TENSORS_MAX];
				int nt = layer_tensors_tp(&c, t, lt);
				assert_int_equal(lt[nt - 1].offset + lt[nt - 1].rows * lt[nt - 1].cols,
						 nps);
				float *sh = falloc(nps);
				for (int64_t i = 0; i < np; i++)
					back[i] = NAN;
				for (int j = 0; j < t; j++) {
					for (int64_t i = 0; i < nps; i++)
						sh[i] = NAN;
					layer_shard(&c, t, j, full, sh, 0);
					/* the member's ids, then zeros where it has fewer */
					int64_t v0, vl = vocab_shard(V, t, j, &v0), pad = 0, got = 0;
					for (int64_t r = 0; r < (q == 0 ? vm : H); r++)
						for (int64_t k = 0; k < (q == 0 ? H : vm); k++) {
							int64_t id = q == 0 ? r : k;
							float a = q == 0 ? sh[r * H + k]
									 : sh[2 * H + r * vm + k];
							if (id >= vl) {
								pad += a != 0.0f;
								continue;
							}
							float b = q == 0 ? full[(v0 + r) * H + k]
									 : full[2 * H + r * V + v0 + k];
							got += a != b;
						}
					assert_int_equal(pad, 0);
					assert_int_equal(got, 0);
					layer_shard(&c, t, j, back, sh, 1);
				}
				assert_memory_equal(back, full, sizeof(float) * (size_t)np);
				free(sh);
			}
			free(full), free(back);
		}
	V = 12;
	/* the LM head's scratch gains the per-position statistics; t = 1 unchanged */
	sp_opshape_t s = shape(COMP_LM_HEAD);
	assert_int_equal(op_saved_elems_tp(&s, N, 1), op_saved_elems(&s, N));
	assert_int_equal(op_saved_elems_tp(&s, N, 3),
			 2 * S * H + 2 * S + S * (V / 3) + S * (2 * 3 + 1));
	s.vocab = 11; /* the largest member's columns: 4 */
	assert_int_equal(op_saved_elems_tp(&s, N, 3), 2 * S * H + 2 * S + S * 4 + S * (2 * 3 + 1));
}

static void test_refused_and_errors(void **state)
{
	(void)state;
	sp_opshape_t se = shape(COMP_EMBEDDING), sh = shape(COMP_LM_HEAD);
	sp_component_t ce = layer_comp_of_shape(&se), ch = layer_comp_of_shape(&sh);
	int64_t npe, nph, nx = (int64_t)N * S * H;
	float *pe = random_params(&ce, &npe), *ph = random_params(&ch, &nph);
	float *x = fill(falloc(nx), nx, -1, 1), *y = falloc(nx), *dx = falloc(nx);
	float *dp = falloc(npe > nph ? npe : nph);
	float *sv = falloc(N * op_saved_elems(&sh, N) + N * S * 9);
	int32_t tok[N * S], tgt[N * S];
	make_ids(tok, tgt);
	int calls = 0;
	double loss = 1;
	/* vocabulary 12: t 13 refused; rank outside [0, t); t 0; no hook */
	rt_tp_t bad[] = {{.t = 13, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = 2, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = -1, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 0, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce},
			 {.t = 2, .rank = 0, .ctx = &calls, .allreduce = NULL}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(embedding_fwd_tp(&se, &bad[i], N, pe, tok, y, sv), SP_EINPUT);
		assert_int_equal(embedding_bwd_tp(&se, &bad[i], N, sv, x, dp), SP_EINPUT);
		assert_int_equal(lm_head_loss_tp(&sh, &bad[i], N, ph, x, tgt, 1, dx, dp, sv, &loss),
				 SP_EINPUT);
		assert_true(loss == 0);
	}
	/* the embedding's backward all-gathers: without that hook both of its
	 * passes refuse, the LM head (all-reduces only) does not */
	rt_tp_t nogather = {.t = 2, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce};
	assert_int_equal(embedding_fwd_tp(&se, &nogather, N, pe, tok, y, sv), SP_EINPUT);
	assert_int_equal(embedding_bwd_tp(&se, &nogather, N, sv, x, dp), SP_EINPUT);
	assert_int_equal(calls, 0);
	assert_int_equal(lm_head_loss_tp(&sh, &nogather, N, ph, x, tgt, 1, dx, dp, sv, &loss),
			 SP_EIO);
	assert_int_equal(calls, 1);
	calls = 0;
	memset(dx, 0, sizeof(float) * (size_t)nx);
	/* another type through these entries */
	sp_opshape_t lin = {.type = COMP_LINEAR, .in = H, .out = H, .seq = S};
	assert_int_equal(embedding_fwd_tp(&lin, NULL, N, pe, tok, y, sv), SP_EINPUT);
	assert_int_equal(embedding_fwd_tp(&sh, NULL, N, ph, tok, y, sv), SP_EINPUT);
	assert_int_equal(lm_head_loss_tp(&se, NULL, N, pe, x, tgt, 1, dx, dp, sv, &loss),
			 SP_EINPUT);
	assert_int_equal(calls, 0);
	for (int64_t i = 0; i < nx; i++)
		assert_true(y[i] == 0.0f && dx[i] == 0.0f);
	/* the hook's code comes back at once; the calls happen with no samples too */
	rt_tp_t fails = {.t = 2, .rank = 1, .ctx = &calls, .allreduce = tp_failing_allreduce,
			 .allgather = tp_failing_allreduce};
	assert_int_equal(embedding_fwd_tp(&se, &fails, N, pe, tok, y, sv), SP_EIO);
	assert_int_equal(calls, 1);
	assert_int_equal(lm_head_loss_tp(&sh, &fails, N, ph, x, tgt, 1, dx, dp, sv, &loss),
			 SP_EIO);
	assert_int_equal(calls, 2);
	for (int64_t i = 0; i < nx; i++)
		assert_true(dx[i] == 0.0f); /* failed before the LayerNorm backward */
	assert_int_equal(embedding_fwd_tp(&se, &fails, 0, pe, tok, y, sv), SP_EIO);
	assert_int_equal(lm_head_loss_tp(&sh, &fails, 0, ph, x, tgt, 1, dx, dp, sv, &loss),
			 SP_EIO);
	assert_int_equal(calls, 4);
	/* the embedding's backward: its all-gather's code, with samples or none */
	assert_int_equal(embedding_bwd_tp(&se, &fails, N, sv, x, dp), SP_EIO);
	assert_int_equal(embedding_bwd_tp(&se, &fails, 0, sv, x, dp), SP_EIO);
	assert_int_equal(calls, 6);
	/* t == 1 through a hook: the unsplit layers, no call */
	rt_tp_t one = {.t = 1, .rank = 0, .ctx = &calls, .allreduce = tp_failing_allreduce};
	assert_int_equal(embedding_fwd_tp(&se, &one, N, pe, tok, y, sv), 0);
	assert_int_equal(embedding_bwd_tp(&se, &one, N, sv, x, dp), 0);
	assert_int_equal(lm_head_loss_tp(&sh, &one, N, ph, x, tgt, 1, dx, dp, sv, &loss), 0);
	assert_true(loss > 0);
	assert_int_equal(calls, 6);
	free(pe), free(ph), free(x), free(y), free(dx), free(dp), free(sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_split_fd),
		cmocka_unit_test(test_shards),
		cmocka_unit_test(test_refused_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
