/*
 * test_cost.c — the analytic layer model's parts (planner/cost.c): the
 * matrix products listed per layer add up to model.h's FLOPs for every
 * layer type, pass and batch; a product's tile- and wave-quantised time is
 * never below its FLOPs at E_MAX of peak and matches a hand-computed case;
 * kernel counts grow with the head loops as the backend issues them (a
 * decoder's with its cross block's; decoders never split); a
 * sequence-parallel layer's are its own block's and priced as such (its
 * launch time over the plain split's is launch_us times the difference).
 * The counts themselves are checked against the sources by
 * tests/planner/launch_counts.py, not here. The tensor-parallel tables of
 * the bundled qwen-val on 64 A800 (heads 16, 20 and 32: t = 8 does not
 * divide the audio encoder's): non-increasing, every t valid where the
 * table's width makes it, forced degrees honoured, a shard costs at least
 * its two all-reduces and its compute is no less than half the whole layer over t; one t
 * per class of MetaOps sharing a component (tp_assign); the report's t per
 * MetaOp (tp_report, tp_json).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const sp_opshape_t shapes[] = {
	{.type = COMP_EMBEDDING, .hidden = 1024, .seq = 77, .vocab = 49408},
	{.type = COMP_PATCH, .hidden = 1280, .seq = 257, .in = 588},
	{.type = COMP_TRANSFORMER, .hidden = 1280, .heads = 16, .ffn = 5120, .seq = 257},
	{.type = COMP_TRANSFORMER, .hidden = 384, .heads = 8, .ffn = 1536, .seq = 197, .causal = 1},
	{.type = COMP_LINEAR, .seq = 1, .in = 1280, .out = 1024},
	{.type = COMP_LM_HEAD, .hidden = 512, .seq = 64, .vocab = 1000},
	{.type = COMP_CLASSIFIER, .hidden = 768, .classes = 10},
	{.type = COMP_CONTRASTIVE, .hidden = 1024},
	/* a decoder (OFA-Large-like: 257 memory tokens of width 768) */
	{.type = COMP_TRANSFORMER, .hidden = 1024, .heads = 16, .ffn = 4096, .seq = 30, .causal = 1,
	 .mem_seq = 257, .mem_width = 768},
};

static void products_add_up_to_flops(void **state)
{
	(void)state;
	const int64_t batches[] = {1, 3, 16, 17, 255};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (size_t j = 0; j < sizeof batches / sizeof batches[0]; j++)
			for (int bwd = 0; bwd < 2; bwd++) {
				const sp_opshape_t *s = &shapes[i];
				int64_t b = batches[j], task_batch = b;
				cost_gemm_t g[COST_MAX_GEMMS];
				int n = cost_layer_gemms(s, b, bwd, g);
				assert_true(n >= 0 && n <= COST_MAX_GEMMS);
				double sum = 0;
				for (int k = 0; k < n; k++)
					sum += 2 * g[k].m * g[k].n * g[k].k * g[k].batch * g[k].calls;
				double want = (double)b * (double)(bwd ? op_bwd_flops(s, task_batch)
								       : op_fwd_flops(s, task_batch));
				if (fabs(sum - want) > 1e-9 * want) {
					print_error("shape %zu b %lld %s: products %.0f, model.h %.0f\n", i,
						    (long long)b, bwd ? "bwd" : "fwd", sum, want);
					fail();
				}
			}
}

/* A vocabulary-parallel LM head member's products have the columns of the
 * largest shard (vocab_shard_max: ceil(V/t)), evenly split or not; its
 * memory is that shard's (comp_layer_params_tp). */
static void tp_uneven_vocab(void **state)
{
	(void)state;
	const int64_t vocabs[] = {7, 11, 12, 59457};
	for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++)
		for (int t = 2; t <= 4; t++)
			for (int bwd = 0; bwd < 2; bwd++) {
				sp_opshape_t s = {.type = COMP_LM_HEAD, .hidden = 16, .seq = 5,
						  .vocab = vocabs[i]};
				int64_t vm = (vocabs[i] + t - 1) / t;
				cost_gemm_t g[COST_MAX_GEMMS];
				int n = cost_layer_gemms_tp(&s, 3, t, bwd, g);
				assert_int_equal(n, bwd ? 2 : 1);
				/* forward z = ln W: [15, vm]; backward dW [16, vm], dln */
				assert_true(bwd ? g[0].n == vm && g[1].k == vm : g[0].n == vm);
				sp_component_t c = {.type = COMP_LM_HEAD, .hidden = 16,
						    .vocab = vocabs[i]};
				assert_int_equal(comp_layer_params_tp(&c, t), 2 * 16 + 16 * vm);
			}
}

static void quantised_time(void **state)
{
	(void)state;
	/* 1024^3 on 108 SMs at 312 TFLOP/s: 64x64 tiles, 256 of them, 3 waves
	 * (the 256x128 ... 128x64 tiles need 65536, 16384, 16384 tile-area
	 * units per SM, 64x64 3 x 4096 = 12288): 3 x 2 x 64 x 64 x 1024 FLOPs at
	 * 0.6 x 312e12 / 108 FLOP/s per SM */
	cost_gemm_t g = {1024, 1024, 1024, 1, 1};
	double want = 3.0 * 2 * 64 * 64 * 1024 / (0.6 * 312e12 / 108) * 1e3;
	assert_true(fabs(cost_gemm_ms(&g, 108, 312e12) - want) < 1e-12);
	/* never below the FLOPs at 0.6 of peak, and monotone in every size */
	const double dims[] = {1, 7, 64, 65, 257, 1000, 4096, 5000};
	for (size_t a = 0; a < 8; a++)
		for (size_t b = 0; b < 8; b++)
			for (size_t c = 0; c < 8; c++) {
				cost_gemm_t p = {dims[a], dims[b], dims[c], 3, 2};
				double t = cost_gemm_ms(&p, 132, 989e12);
				double floor = 2 * p.m * p.n * p.k * p.batch * p.calls /
					       (0.6 * 989e12) * 1e3;
				assert_true(t >= floor * (1 - 1e-12));
				if (a + 1 < 8) {
					cost_gemm_t q = p;
					q.m = dims[a + 1];
					assert_true(cost_gemm_ms(&q, 132, 989e12) >= t);
				}
			}
}

static void kernels_follow_head_loops(void **state)
{
	(void)state;
	const sp_opshape_t *vit = &shapes[2]; /* 16 heads */
	/* cu_tblock_fwd: 13 + 2 gemm_grid calls of min(b, heads) launches each */
	assert_int_equal(cost_layer_kernels(vit, 1, 0), 13 + 2);
	assert_int_equal(cost_layer_kernels(vit, 64, 0), 13 + 2 * 16);
	/* cu_tblock_bwd 29 + 4 grids, and exec_bwd's memset of dx */
	assert_int_equal(cost_layer_kernels(vit, 4, 1), 29 + 1 + 4 * 4);
	/* losses: everything in the forward call, plus the host copy of labels */
	assert_int_equal(cost_layer_kernels(&shapes[6], 8, 0), 14 + 1);
	assert_int_equal(cost_layer_kernels(&shapes[6], 8, 1), 0);
	assert_int_equal(cost_layer_kernels(&shapes[7], 8, 0), 14);
	/* a decoder adds its cross block: 9 + 2 per head loop forward, 20 + 4
	 * backward (cost.c's XATTN_LAUNCHES, counted from cu_xattn.cu) */
	const sp_opshape_t *dec = &shapes[8];
	assert_int_equal(cost_layer_kernels(dec, 4, 0), 13 + 2 * 4 + 9 + 2 * 4);
	assert_int_equal(cost_layer_kernels(dec, 64, 1), 29 + 1 + 4 * 16 + 20 + 4 * 16);
	/* and never splits, though 2 divides its heads and ffn */
	assert_true(tp_ok(dec->type, dec->heads, dec->ffn, dec->vocab, 2));
	assert_false(shape_tp_ok(dec, 2));
	assert_true(shape_tp_ok(dec, 1) && shape_tp_ok(vit, 2));
}

/* A sequence-parallel layer (cost.c SP_LAUNCHES: cu_sp.cu's path of a
 * layer inside its slice) issues its own kernels, not the plain split's:
 * forward 17 + 2 per head loop and four collectives (all-gathers of ln1,
 * ln2, reduce-scatters of the two row-parallel products); backward 33 + 4
 * per head loop, four collectives, exec_bwd's dx memset and sp_ln_add's
 * four LayerNorm-gradient adds. A shape sp_ok refuses keeps the plain
 * split's count. */
static void sp_kernels(void **state)
{
	(void)state;
	const sp_opshape_t s = {.type = COMP_TRANSFORMER, .hidden = 1024, .heads = 16,
				.ffn = 4096, .seq = 256};
	for (int t = 2; t <= 8; t *= 2)
		for (int64_t b = 1; b <= 64; b *= 4) {
			int64_t h = SP_MIN(b, 16 / t);
			assert_true(sp_ok(&s, t));
			assert_int_equal(cost_layer_kernels_sp(&s, b, t, 1, 0), 17 + 2 * h + 4);
			assert_int_equal(cost_layer_kernels_sp(&s, b, t, 1, 1), 33 + 4 * h + 4 + 1 + 4);
			/* the plain split: the transformer's row and two all-reduces */
			assert_int_equal(cost_layer_kernels_sp(&s, b, t, 0, 0), 13 + 2 * h + 2);
			assert_int_equal(cost_layer_kernels_sp(&s, b, t, 0, 1), 29 + 4 * h + 2 + 1);
		}
	const sp_opshape_t *vit = &shapes[2]; /* seq 257: 2 does not divide it */
	assert_false(sp_ok(vit, 2));
	assert_int_equal(cost_layer_kernels_sp(vit, 4, 2, 1, 0), cost_layer_kernels_sp(vit, 4, 2, 0, 0));
	assert_int_equal(cost_layer_kernels_sp(vit, 4, 1, 0, 1), cost_layer_kernels(vit, 4, 1));
}

/* The MetaOps and tables of plans/<w> on plans/clusters/<c> under --tp tp
 * (pl points into the rest). */
typedef struct {
	planner_t pl;
	plan_opts_t opts;
	sp_err_t err;
	sp_model_t model;
	sp_cluster_t cluster;
} tfix_t;

static void tfix_build(tfix_t *f, const char *w, const char *c, int tp)
{
	char path[1024];
	memset(f, 0, sizeof *f);
	snprintf(path, sizeof path, "%s/plans/%s/model.json", SPINDLE_ROOT, w);
	assert_int_equal(model_load(&f->model, path, &f->err), 0);
	snprintf(path, sizeof path, "%s/plans/clusters/%s.json", SPINDLE_ROOT, c);
	assert_int_equal(cluster_load(&f->cluster, path, &f->err), 0);
	f->opts.tp = tp;
	planner_t *pl = &f->pl;
	*pl = (planner_t){.model = &f->model, .cluster = &f->cluster, .opts = &f->opts,
			  .err = &f->err};
	sp_arena_init(&pl->arena);
	sp_arena_init(&pl->scratch);
	pl->N = f->cluster.nodes * f->cluster.gpus_per_node;
	assert_int_equal(graph_build(pl), 0);
	assert_int_equal(cost_build(pl), 0);
}

static void tfix_release(tfix_t *f)
{
	sp_arena_release(&f->pl.scratch);
	sp_arena_release(&f->pl.arena);
	model_release(&f->model);
	cluster_release(&f->cluster);
}

static int can_split(const metaop_t *m, int t)
{
	return m->scales && tp_ok(m->shape.type, m->shape.heads, m->shape.ffn, m->shape.vocab, t);
}

/* Every table of f: non-increasing; at a width its own (usen[n] == n) a
 * valid (d, t); below or at the batch t = 1 is always there. */
static void check_tables(const tfix_t *f, int forced)
{
	const planner_t *pl = &f->pl;
	int G = f->cluster.gpus_per_node;
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *m = &pl->mops[k];
		int tmax = 1;
		/* an embedding splits only when forced (cost.c tp_degrees) */
		int auto_ok = m->shape.type != COMP_EMBEDDING || forced > 1;
		for (int t = 2; t <= G; t++)
			if (G % t == 0 && can_split(m, t) && (forced <= 0 || t == forced) &&
			    auto_ok)
				tmax = t;
		assert_int_equal(m->nmax, (int)SP_MIN((int64_t)pl->N, m->batch * tmax));
		for (int n = 1; n <= m->nmax; n++) {
			int t = m->tpn[n], u = m->usen[n];
			if (n > 1) {
				assert_true(m->tf[n] <= m->tf[n - 1]);
				assert_true(m->tb[n] <= m->tb[n - 1]);
			}
			assert_true(u >= 1 && u <= n && t >= 1);
			if (u != n)
				continue;
			if (n % t || n / t > m->batch || (t > 1 && !can_split(m, t))) {
				print_error("%s n %d: t %d, batch %lld\n", m->name, n, t,
					    (long long)m->batch);
				fail();
			}
			if (forced > 1 && can_split(m, forced) && G % forced == 0)
				assert_int_equal(t, n % forced ? 1 : forced);
			if (forced == 1)
				assert_int_equal(t, 1);
		}
	}
}

static void tp_tables_valid(void **state)
{
	(void)state;
	const int forced[] = {0, 1, 2, 4, 8};
	for (size_t i = 0; i < sizeof forced / sizeof *forced; i++) {
		tfix_t f;
		tfix_build(&f, "qwen-val", "a800-8x8", forced[i]);
		check_tables(&f, forced[i]);
		/* batch 32 on 64 GPUs: the LLM widens past its batch, the loss cannot */
		int widened = 0;
		for (int k = 0; k < f.pl.n_mops; k++) {
			const metaop_t *m = &f.pl.mops[k];
			if (!can_split(m, 2))
				assert_true(m->nmax <= m->batch);
			widened |= m->nmax > m->batch;
		}
		assert_int_equal(widened, forced[i] != 1);
		tfix_release(&f);
	}
}

static void tp_prices(void **state)
{
	(void)state;
	tfix_t f;
	tfix_build(&f, "qwen-val", "a800-8x8", 0);
	const planner_t *pl = &f.pl;
	int db = dtype_bytes(f.model.dtype);
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *m = &pl->mops[k];
		const int64_t locals[] = {1, 4, 32};
		for (size_t i = 0; i < sizeof locals / sizeof *locals; i++) {
			double f1, b1;
			cost_layer(pl, k, locals[i], &f1, &b1);
			for (int t = 1; t <= 8; t *= 2) {
				double ft, bt;
				cost_layer_tp(pl, k, locals[i], t, &ft, &bt);
				if (t == 1 || !can_split(m, t)) {
					/* unsplit: exactly the whole layer */
					assert_true(ft == f1 && bt == b1);
					continue;
				}
				int32_t devs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
				int64_t act = locals[i] * m->shape.seq * m->shape.hidden * db;
				double one = cost_allreduce_ms(&f.cluster, devs, t, act);
				/* a transformer: two all-reduces of its activations each
				 * pass; a vocabulary-parallel embedding: one forward; an
				 * LM head: its fp32 statistics (2t + 1 per token)
				 * forward, its activations' gradient backward */
				double arf = 2 * one, arb = 2 * one;
				if (m->shape.type == COMP_EMBEDDING)
					arf = one, arb = 0;
				if (m->shape.type == COMP_LM_HEAD)
					arf = cost_allreduce_ms(&f.cluster, devs, t,
								locals[i] * m->shape.seq *
									(2 * t + 1) * 4),
					arb = one;
				/* a shard pays its all-reduces and does at least 1/t
				 * of the whole layer's compute less launches */
				assert_true(ft >= arf && bt >= arb);
				assert_true(ft - arf >= 0.5 * f1 / t && bt - arb >= 0.5 * b1 / t);
			}
		}
	}
	tfix_release(&f);
}

/* The launch time the planner charges a sequence-parallel layer over the
 * plain split's is launch_us times their kernels' difference (sp_kernels),
 * whatever else differs (bytes, collectives): priced at two values of
 * gpu.launch_us on qwen-val's A800s (sm_count set), every transformer
 * MetaOp sp_ok allows at t = 2 and 4. */
static void sp_launch_priced(void **state)
{
	(void)state;
	tfix_t f;
	tfix_build(&f, "qwen-val", "a800-8x8", 0);
	planner_t *pl = &f.pl;
	assert_true(f.cluster.sm_count > 0);
	pl->memo = NULL; /* price afresh at each launch_us */
	int seen = 0;
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *m = &pl->mops[k];
		for (int t = 2; t <= 4; t *= 2) {
			if (!m->scales || !shape_tp_ok(&m->shape, t) || !sp_ok(&m->shape, t))
				continue;
			seen++;
			const int64_t local = 2;
			double p[2][2][2]; /* [launch_us][sp][pass] */
			const double us[2] = {1.0, 11.0};
			for (int u = 0; u < 2; u++) {
				f.cluster.launch_us = us[u];
				for (int sp = 0; sp < 2; sp++)
					cost_layer_sp(pl, k, local, t, sp, &p[u][sp][0], &p[u][sp][1]);
			}
			for (int pass = 0; pass < 2; pass++) {
				int64_t dk = cost_layer_kernels_sp(&m->shape, local, t, 1, pass) -
					     cost_layer_kernels_sp(&m->shape, local, t, 0, pass);
				assert_int_equal(dk, pass ? 10 : 6);
				double got = (p[1][1][pass] - p[0][1][pass]) -
					     (p[1][0][pass] - p[0][0][pass]);
				double want = (us[1] - us[0]) * 1e-3 * (double)dk;
				if (fabs(got - want) > 1e-9) {
					print_error("%s t %d pass %d: %g ms more, want %g\n", m->name,
						    t, pass, got, want);
					fail();
				}
			}
		}
	}
	assert_true(seen > 0);
	tfix_release(&f);
}

static int mop_named(const planner_t *pl, const char *name)
{
	for (int k = 0; k < pl->n_mops; k++)
		if (!strcmp(pl->mops[k].name, name))
			return k;
	fail_msg("no MetaOp '%s'", name);
	return -1;
}

/* Under auto cost_build keeps a second, whole-layer table set where it
 * differs, and it is exactly the one --tp 1 builds; cost_use switches. */
static void tp_whole_tables(void **state)
{
	(void)state;
	tfix_t a, w;
	tfix_build(&a, "qwen-val", "a800-8x8", 0);
	tfix_build(&w, "qwen-val", "a800-8x8", 1);
	assert_true(a.pl.has_whole);
	assert_false(w.pl.has_whole);
	int differ = 0;
	for (int set = COST_AUTO; set <= COST_WHOLE; set++) {
		cost_use(&a.pl, set);
		assert_int_equal(a.pl.tp_force, set == COST_WHOLE ? 1 : 0);
		for (int k = 0; k < a.pl.n_mops; k++) {
			const metaop_t *m = &a.pl.mops[k], *m1 = &w.pl.mops[k];
			if (set == COST_AUTO) {
				differ |= m->nmax != m1->nmax;
				continue;
			}
			assert_int_equal(m->nmax, m1->nmax);
			for (int n = 1; n <= m->nmax; n++) {
				assert_true(m->tf[n] == m1->tf[n] && m->tb[n] == m1->tb[n]);
				assert_int_equal(m->tpn[n], 1);
			}
		}
	}
	assert_true(differ); /* some MetaOp widens past its batch under auto */
	tfix_release(&a);
	tfix_release(&w);
}

/* One t for the MetaOps that share the LLM: the heaviest slices' t where
 * every slice can run it, else t = 1 with slices cut to their batch. */
static void tp_one_sharding(void **state)
{
	(void)state;
	tfix_t f;
	tfix_build(&f, "qwen-val", "a800-8x8", 0);
	planner_t *pl = &f.pl;
	int text = mop_named(pl, "text/llm"), audio = mop_named(pl, "audio-text/llm");
	const metaop_t *mt = &pl->mops[text];
	int t64 = mt->tpn[64];
	assert_true(mt->usen[64] == 64 && t64 > 1); /* batch 32: 64 needs t >= 2 */
	sched_t s;
	sched_init(&s, ALGO_SPINDLE, &pl->scratch);
	/* 24 layers at 64 devices outweigh 1 at 16 (its table's t, or 1) */
	const metaop_t *ma = &pl->mops[audio];
	assert_true(mop_t(ma, 16) < 24 * mop_t(mt, 64));
	assert_int_equal(sched_push(&s, text, 0, 24, 64, 0, 0, 1), 0);
	assert_int_equal(sched_push(&s, audio, 0, 1, 16, 0, 0, 1), 0);
	assert_int_equal(tp_assign(pl, &s), 0);
	assert_int_equal(s.s[0].tp, t64);
	assert_int_equal(s.s[1].tp, t64); /* 16 % t64 == 0, 16 / t64 <= 32 */
	assert_int_equal(s.s[0].n, 64);
	/* forced: 1 cuts the 64 to the batch; 4 splits both (16 / 4 <= 32) */
	pl->tp_force = 1;
	assert_int_equal(tp_assign(pl, &s), 0);
	assert_int_equal(s.s[0].tp, 1);
	assert_int_equal(s.s[1].tp, 1);
	assert_int_equal(s.s[0].n, 32);
	s.s[0].n = 64;
	pl->tp_force = 4;
	assert_int_equal(tp_assign(pl, &s), 0);
	assert_int_equal(s.s[0].tp, 4);
	assert_int_equal(s.s[1].tp, 4);
	pl->tp_force = 0;
	/* 15 devices cannot split: the whole class runs whole layers */
	s.s[1].n = 15;
	assert_int_equal(tp_assign(pl, &s), 0);
	assert_int_equal(s.s[0].tp, 1);
	assert_int_equal(s.s[1].tp, 1);
	assert_int_equal(s.s[0].n, 32);
	assert_int_equal(s.s[1].n, 15);
	tfix_release(&f);
}

/* The report's helpers: a MetaOp's t is its slices' largest. */
static void tp_report_names_split(void **state)
{
	(void)state;
	sp_metaop_t mo[2] = {{.name = "a/enc"}, {.name = "b/llm"}};
	sp_slice_t sl[3] = {{.metaop = 0, .tp = 1}, {.metaop = 1, .tp = 4}, {.metaop = 1, .tp = 4}};
	sp_plan_t p = {.n_metaops = 2, .metaops = mo, .n_slices = 3, .slices = sl};
	assert_int_equal(tp_metaop(&p, 0), 1);
	assert_int_equal(tp_metaop(&p, 1), 4);
	char buf[512] = {0};
	FILE *f = fmemopen(buf, sizeof buf - 1, "w");
	assert_non_null(f);
	tp_report(f, &p);
	tp_json(f, &p);
	fclose(f);
	assert_string_equal(buf, "tensor parallel:\n  b/llm: t = 4\n"
				 ",\n  \"tp\": {\"a/enc\": 1, \"b/llm\": 4}");
}

/*
 * The optimizer step's bytes per parameter, counted by hand from what one
 * fused update reads and writes (cost.c): bf16 AdamW reads the gradient
 * (2), the fp32 master (4) and moments (8), writes master, moments and
 * the bf16 copy (4 + 8 + 2): 28; fp32 AdamW 4 + 4 + 8 + 4 + 8 = 28; SGD
 * bf16 2 + 4 + 4 + 2 = 12, fp32 4 + 4 + 4 = 12. Time: 10^9 parameters of
 * bf16 AdamW at 3350 GB/s: 28e9 B / 3.35e12 B/s = 8.358209 ms; 157 M
 * parameters of SGD at 2039 GB/s: 12 x 157e6 / 2.039e12 s = 0.923982 ms.
 */
static void step_bytes_and_time(void **state)
{
	(void)state;
	assert_int_equal(cost_step_bytes(DT_BF16, OPT_ADAMW), 28);
	assert_int_equal(cost_step_bytes(DT_FP16, OPT_ADAMW), 28);
	assert_int_equal(cost_step_bytes(DT_FP32, OPT_ADAMW), 28);
	assert_int_equal(cost_step_bytes(DT_BF16, OPT_SGD), 12);
	assert_int_equal(cost_step_bytes(DT_FP32, OPT_SGD), 12);
	sp_model_t md = {.dtype = DT_BF16, .opt = {.kind = OPT_ADAMW}};
	sp_cluster_t cl = {.mem_bandwidth_gbs = 3350};
	planner_t pl = {.model = &md, .cluster = &cl};
	assert_true(fabs(cost_step_ms(&pl, 1000000000) - 8.358209) < 1e-6);
	md.opt.kind = OPT_SGD;
	cl.mem_bandwidth_gbs = 2039;
	assert_true(fabs(cost_step_ms(&pl, 157000000) - 0.923982) < 1e-6);
	assert_true(cost_step_ms(&pl, 0) == 0);
}

static const struct CMUnitTest cost_tests[] = {
	cmocka_unit_test(step_bytes_and_time),
	cmocka_unit_test(tp_report_names_split),
	cmocka_unit_test(tp_one_sharding),
	cmocka_unit_test(tp_whole_tables),
	cmocka_unit_test(tp_tables_valid),
	cmocka_unit_test(tp_prices),
	cmocka_unit_test(products_add_up_to_flops),
	cmocka_unit_test(tp_uneven_vocab),
	cmocka_unit_test(quantised_time),
	cmocka_unit_test(kernels_follow_head_loops),
	cmocka_unit_test(sp_kernels),
	cmocka_unit_test(sp_launch_priced),
};

int main(void)
{
	return cmocka_run_group_tests(cost_tests, NULL, NULL);
}
