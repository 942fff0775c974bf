/*
 * test_memplan.c — the per-device memory formula (schemas/plan_mem.c, run
 * by memplan_run) against numbers worked out by hand. Each plan is made by
 * planner_run on a tiny model; the test then walks each device's held
 * parameters and FWD instructions with its own table of per-layer sizes
 * (below, with the arithmetic) and requires MEM_PARAMS, MEM_ACTS and
 * MEM_WORK to match exactly, whatever schedule the planner chose, with
 * activations kept or recomputed (--recompute all). Also: a
 * layer used by two tasks on one device is counted once, and a cluster too
 * small for any plan fails with SP_EINFEAS naming the device. MEM_COMM (value
 * buffers) depends on the lowering's buffer layout and is only checked to
 * add up into the peak — except for a hand-built cross-attention decoder
 * (test_decoder_memory), whose memory, activations, buffers and backward
 * workspace are all worked out by hand.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The model: token embedding → transformer (2 layers; 6 in one test) →
 * lm_head, seq 4, h = 8, a = 2 heads, f = 16, vocab V = 16, max_seq 4.
 *
 * Parameters per layer (schemas/arith.c's table):
 *   embedding    (V + max_seq) h     = (16 + 4) * 8                   = 160
 *   transformer  4h^2 + 2hf + 9h + f = 4*64 + 2*8*16 + 9*8 + 16
 *                                    = 256 + 256 + 72 + 16            = 600
 *   lm_head      2h + h V            = 16 + 8*16                      = 144
 *   whole model: 160 + 2*600 + 144                                    = 1504
 *
 * Elements saved for backward per sample and layer, s = 4:
 *   embedding    s                                  = 4
 *   transformer  8sh + 2sf + a s^2 + 4s = 8*4*8 + 2*4*16 + 2*16 + 4*4
 *                                      = 256 + 128 + 32 + 16        = 432
 *   lm_head      2sh + 2s + sV         = 2*4*8 + 2*4 + 4*16
 *                                      = 64 + 8 + 64                 = 136
 * A recomputing transformer FWD keeps only the layer's input, what
 * spindle-run's interp.c allocates for it (kept_pp):
 *   transformer  s h                   = 4*8                         = 32
 * A transformer BWD of n samples also takes the backend's layer workspace
 * (plan_mem.c bwd_ws_bytes; unsplit, the CPU reference's is the larger),
 * fp32 whatever the dtype: dln for the n samples, n s h, and one sample's
 * dx_mid, dact, dcat, dqkv and dP:
 *   s (h + f + 4 h) + s^2              = 4*(8+16+32) + 16            = 240
 * so at batch 4: (4 * 32 + 240) * 4 B = 1472.
 */
enum { P_EMB = 160, P_TR = 600, P_LM = 144, P_ALL = 1504 };
enum { S_EMB = 4, S_TR = 432, S_LM = 136, K_TR = 32, W_TR = 240 };
#define MIB64 ((int64_t)64 << 20) /* the workspace's fixed part: 67108864 */

static const char *const MODEL_FMT =
	"{\"format\": \"spindle.model/1\", \"name\": \"tiny\", \"dtype\": \"%s\","
	" \"optimizer\": \"%s\", \"components\": {"
	" \"emb\": {\"type\": \"embedding\", \"vocab\": 16, \"hidden\": 8, \"max_seq\": 4},"
	" \"tr\": {\"type\": \"transformer\", \"layers\": %d, \"hidden\": 8, \"heads\": 2,"
	" \"ffn\": 16},"
	" \"lm\": {\"type\": \"lm_head\", \"hidden\": 8, \"vocab\": 16}},"
	" \"tasks\": [%s]}";

#define TASK(name, batch)                                                         \
	"{\"name\": \"" name "\", \"batch\": " #batch ", \"graph\": ["             \
	" {\"id\": \"src\", \"component\": \"emb\", \"seq\": 4},"                    \
	" {\"id\": \"enc\", \"component\": \"tr\", \"seq\": 4, \"inputs\": [\"src\"]}," \
	" {\"id\": \"loss\", \"component\": \"lm\", \"inputs\": [\"enc\"]}]}"

static const char *const CLUSTER_FMT =
	"{\"format\": \"spindle.cluster/1\", \"name\": \"c%d\", \"nodes\": 1,"
	" \"gpus_per_node\": %d,"
	" \"gpu\": {\"name\": \"cpu\", \"memory_gib\": %g, \"peak_tflops\": 1,"
	" \"mem_bandwidth_gbs\": 100},"
	" \"links\": {\"intra_node_gbs\": 10, \"intra_node_latency_us\": 5,"
	" \"inter_node_gbs\": 1, \"inter_node_latency_us\": 50}}";

typedef struct {
	sp_model_t model;
	sp_cluster_t cluster;
	plan_opts_t opts;
	sp_plan_t plan;
	plan_summary_t sum;
	sp_err_t err;
} mfix_t;

/* Loads model and cluster and sets main.c's default options (activations
 * kept, replicated state: this file's hand tables). */
static void mfix_load(mfix_t *f, const char *dtype, const char *opt, int layers,
		      const char *tasks, int gpus, double mem_gib)
{
	char text[4096];
	memset(f, 0, sizeof *f);
	int n = snprintf(text, sizeof text, MODEL_FMT, dtype, opt, layers, tasks);
	assert_true(n > 0 && n < (int)sizeof text);
	int rc = model_parse(&f->model, text, (size_t)n, "tiny.json", &f->err);
	if (rc)
		print_message("model: %s\n", f->err.msg);
	assert_int_equal(rc, 0);
	n = snprintf(text, sizeof text, CLUSTER_FMT, gpus, gpus, mem_gib);
	assert_int_equal(cluster_parse(&f->cluster, text, (size_t)n, "c.json", &f->err), 0);
	f->opts.algo = ALGO_SPINDLE;
	f->opts.placement = PLACE_SPINDLE;
	f->opts.mem_reserve_gib = SP_MIN(2.0, 0.1 * f->cluster.memory_gib);
	f->opts.milp_nodes = 200;
}

/* mfix_load, then plans. */
static int mfix_plan(mfix_t *f, const char *dtype, const char *opt, int layers,
		     const char *tasks, int gpus, double mem_gib)
{
	mfix_load(f, dtype, opt, layers, tasks, gpus, mem_gib);
	return planner_run(&f->opts, &f->model, &f->cluster, &f->plan, &f->sum, &f->err);
}

static void mfix_release(mfix_t *f)
{
	plan_release(&f->plan);
	model_release(&f->model);
	cluster_release(&f->cluster);
}

/* The hand tables above, by component name and operator type. */
static int64_t hand_params(const sp_component_t *c)
{
	if (!strcmp(c->name, "emb"))
		return P_EMB;
	if (!strcmp(c->name, "tr"))
		return P_TR;
	assert_string_equal(c->name, "lm");
	return P_LM;
}

static int64_t hand_saved(sp_comp_type_t t)
{
	switch (t) {
	case COMP_EMBEDDING: return S_EMB;
	case COMP_TRANSFORMER: return S_TR;
	case COMP_LM_HEAD: return S_LM;
	default: fail_msg("unexpected operator type %d", (int)t);
	}
	return 0;
}

typedef struct {
	int64_t params, acts, work;
	int n_fwd;
} hand_t;

/* Device d by hand: psb bytes of state per parameter, db per element. */
static hand_t hand_device(const sp_plan_t *p, int d, int64_t psb, int64_t db)
{
	hand_t h = {0};
	const sp_device_t *dv = &p->devices[d];
	for (int k = 0; k < dv->n_held; k++)
		h.params += hand_params(&p->model.comps[p->held[dv->held_off + k].comp]) * psb;
	int64_t big = 0, redo = 0, bws = 0;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
			continue;
		const sp_slice_t *sl = &p->slices[in->slice];
		sp_comp_type_t ty = p->metaops[sl->metaop].shape.type;
		int64_t one = hand_saved(ty) * (in->s1 - in->s0) * db;
		big = SP_MAX(big, one);
		if (in->op == INS_BWD && ty == COMP_TRANSFORMER)
			bws = SP_MAX(bws, (K_TR * (in->s1 - in->s0) + W_TR) * 4);
		if (sl->recompute)
			redo = SP_MAX(redo, one);
		if (in->op == INS_FWD) {
			int64_t kept = sl->recompute ? K_TR * (in->s1 - in->s0) * db : one;
			h.acts += kept * (sl->layer_to - sl->layer_from);
			h.n_fwd++;
		}
	}
	h.work = big + redo + bws + MIB64;
	return h;
}

/* plan_memory and memplan_run's numbers for every device equal the hand
 * ones; returns the sums over devices of (params, acts). */
static void check_devices(const sp_plan_t *p, int64_t psb, int64_t db, int64_t *sum_params,
			  int64_t *sum_acts)
{
	*sum_params = *sum_acts = 0;
	for (int d = 0; d < p->n_devices; d++) {
		int64_t mem[MEM__COUNT];
		assert_int_equal(plan_memory(p, d, mem), 0);
		hand_t h = hand_device(p, d, psb, db);
		print_message("  device %d: %d held, %d FWD: params %lld (by hand %lld) acts %lld "
			      "(%lld) work %lld (%lld) comm %lld\n",
			      d, (int)p->devices[d].n_held, h.n_fwd, (long long)mem[MEM_PARAMS],
			      (long long)h.params, (long long)mem[MEM_ACTS], (long long)h.acts,
			      (long long)mem[MEM_WORK], (long long)h.work, (long long)mem[MEM_COMM]);
		assert_int_equal(mem[MEM_PARAMS], h.params);
		assert_int_equal(mem[MEM_ACTS], h.acts);
		assert_int_equal(mem[MEM_WORK], h.work);
		/* memplan_run stored the same numbers, and the peak is their sum */
		int64_t tot = 0;
		for (int c = 0; c < MEM__COUNT; c++) {
			assert_int_equal(p->devices[d].mem[c], mem[c]);
			tot += mem[c];
		}
		assert_int_equal(p->devices[d].mem_peak, tot);
		*sum_params += h.params;
		*sum_acts += h.acts;
	}
}

/* Device 0's params, acts and work are the numbers worked out above the
 * test (what), and the hand tables agree on every device. */
static void expect_device0(const sp_plan_t *p, const char *what, int64_t psb, int64_t db,
			   const int64_t want[3])
{
	int64_t mem[MEM__COUNT];
	assert_int_equal(plan_memory(p, 0, mem), 0);
	print_message("%s: device 0 params %lld acts %lld work %lld (expected %lld %lld %lld)\n",
		      what, (long long)mem[MEM_PARAMS], (long long)mem[MEM_ACTS],
		      (long long)mem[MEM_WORK], (long long)want[0], (long long)want[1],
		      (long long)want[2]);
	assert_int_equal(mem[MEM_PARAMS], want[0]);
	assert_int_equal(mem[MEM_ACTS], want[1]);
	assert_int_equal(mem[MEM_WORK], want[2]);
	int64_t sp, sa;
	check_devices(p, psb, db, &sp, &sa);
}

/*
 * One task of batch 4, every dtype and optimizer, on 1 and 2 devices.
 *
 * Bytes of state per parameter: weights + gradients (2 * dtype), fp32
 * master weights when the dtype is not fp32 (4), AdamW's two fp32 moments
 * (8):
 *   bf16 + adamw  2+2+4+8 = 16     fp32 + adamw  4+4+8 = 16
 *   bf16 + sgd    2+2+4   = 8      fp32 + sgd    4+4   = 8
 *
 * On one device it holds everything and runs every forward:
 *   params  1504 * psb            = 24064 (psb 16), 12032 (psb 8)
 *   acts    (embedding 4 * 4 samples * 1 layer + transformer 432 * 4 * 2)
 *           = 16 + 3456 = 3472 elements; * 2 B = 6944 (bf16), * 4 B = 13888
 *   work    the largest layer at batch 4, the transformer: 432 * 4 = 1728
 *           elements (lm_head: 136 * 4 = 544); * db + 1472 (its backward's
 *           workspace) + 64 MiB = 67113792 (bf16), 67117248 (fp32)
 * On two devices every (sample, layer) is still forwarded exactly once, so
 * the activations summed over devices are the one-device numbers.
 */
static void test_formula(void **state)
{
	(void)state;
	static const struct {
		const char *dtype, *opt;
		int64_t psb, db, params1, acts1, work1;
	} cases[] = {
		{"bf16", "adamw", 16, 2, 24064, 6944, 67113792},
		{"fp32", "adamw", 16, 4, 24064, 13888, 67117248},
		{"bf16", "sgd", 8, 2, 12032, 6944, 67113792},
		{"fp32", "sgd", 8, 4, 12032, 13888, 67117248},
	};
	for (int c = 0; c < SP_ARRAY_LEN(cases); c++) {
		for (int gpus = 1; gpus <= 2; gpus++) {
			mfix_t f;
			int rc = mfix_plan(&f, cases[c].dtype, cases[c].opt, 2, TASK("t", 4), gpus,
					   16);
			if (rc)
				print_message("plan: %s\n", f.err.msg);
			assert_int_equal(rc, 0);
			/* the library agrees with the hand's per-parameter bytes */
			assert_int_equal(param_state_bytes(f.model.dtype, f.model.opt.kind),
					 cases[c].psb);
			assert_int_equal(dtype_bytes(f.model.dtype), cases[c].db);
			print_message("%s + %s on %d device(s), %s plan:\n", cases[c].dtype,
				      cases[c].opt, gpus, f.plan.algo);
			int64_t sp, sa;
			check_devices(&f.plan, cases[c].psb, cases[c].db, &sp, &sa);
			assert_int_equal(sa, cases[c].acts1);
			if (gpus == 1) {
				expect_device0(&f.plan, "1 device", cases[c].psb, cases[c].db,
					       (int64_t[3]){cases[c].params1, cases[c].acts1,
							    cases[c].work1});
			} else {
				/* replicas only add: never less than one full copy */
				assert_true(sp >= cases[c].params1);
			}
			mfix_release(&f);
		}
	}
}

/*
 * With 6 transformer layers the planner cuts the stack into chunks of
 * 1 and 2 layers ([0,1) [1,3) [3,4) [4,6) when it is one slice), so a FWD
 * keeps its activations once per layer it runs. On one device, bf16+adamw:
 *   params  (160 + 6 * 600 + 144) * 16 = 3904 * 16            = 62464
 *   acts    (4 * 4 + 432 * 4 * 6) * 2 = (16 + 10368) * 2       = 20768
 *   work    432 * 4 * 2 + 1472 + 64 MiB                        = 67113792
 */
static void test_multi_layer_slices(void **state)
{
	(void)state;
	mfix_t f;
	int rc = mfix_plan(&f, "bf16", "adamw", 6, TASK("t", 4), 1, 16);
	if (rc)
		print_message("plan: %s\n", f.err.msg);
	assert_int_equal(rc, 0);
	const sp_plan_t *p = &f.plan;
	int widest = 0;
	for (int k = 0; k < p->n_ins; k++)
		if (p->ins[k].op == INS_FWD)
			widest = SP_MAX(widest, p->slices[p->ins[k].slice].layer_to -
							p->slices[p->ins[k].slice].layer_from);
	assert_true(widest >= 2); /* the premise: some FWD runs several layers */
	print_message("widest FWD: %d layers\n", widest);
	expect_device0(p, "6 layers on 1 device", 16, 2, (int64_t[3]){62464, 20768, 67113792});
	mfix_release(&f);
}

/*
 * The same 6 layers with every transformer slice recomputing: a FWD keeps
 * each layer's input only, and the workspace grows by the largest
 * recomputed layer's saved size (its forward re-runs there). On one
 * device, bf16+adamw:
 *   acts    (4 * 4 + 32 * 4 * 6) * 2 = (16 + 768) * 2          = 1568
 *   work    432 * 4 * 2 + 432 * 4 * 2 + 1472 + 64 MiB          = 67117248
 * On two devices the hand tables hold per device, and the kept inputs
 * summed over devices are the one-device number.
 */
static void test_recompute(void **state)
{
	(void)state;
	for (int gpus = 1; gpus <= 2; gpus++) {
		mfix_t f;
		mfix_load(&f, "bf16", "adamw", 6, TASK("t", 4), gpus, 16);
		f.opts.recompute = 1;
		int rc = planner_run(&f.opts, &f.model, &f.cluster, &f.plan, &f.sum, &f.err);
		if (rc)
			print_message("plan: %s\n", f.err.msg);
		assert_int_equal(rc, 0);
		const sp_plan_t *p = &f.plan;
		/* the premise: exactly the transformer slices recompute */
		for (int s = 0; s < p->n_slices; s++)
			assert_int_equal(p->slices[s].recompute,
					 p->metaops[p->slices[s].metaop].shape.type ==
						 COMP_TRANSFORMER);
		int64_t sp, sa;
		check_devices(p, 16, 2, &sp, &sa);
		print_message("recompute, 6 layers on %d device(s): acts %lld (expected 1568)\n",
			      gpus, (long long)sa);
		assert_int_equal(sa, 1568);
		if (gpus == 1)
			expect_device0(p, "recompute, 6 layers on 1 device", 16, 2,
				       (int64_t[3]){62464, 1568, 67117248});
		mfix_release(&f);
	}
}

/*
 * Two tasks share all three components on one device: both tasks' slices
 * use every layer, yet each layer's state is there once.
 *   params  1504 * 16                                     = 24064
 *   acts    per sample (4 + 2 * 432) = 868 elements, for 4 + 2 samples
 *           = 5208 elements * 2 B                         = 10416
 *   work    the transformer at batch 4: 432 * 4 * 2 + 1472 + 64 MiB
 *                                                               = 67113792
 */
static void test_shared_counted_once(void **state)
{
	(void)state;
	mfix_t f;
	int rc = mfix_plan(&f, "bf16", "adamw", 2, TASK("big", 4) "," TASK("small", 2), 1, 16);
	if (rc)
		print_message("plan: %s\n", f.err.msg);
	assert_int_equal(rc, 0);
	const sp_plan_t *p = &f.plan;
	/* the premise: transformer layer 0 runs in slices of both tasks here */
	int task_mask = 0;
	for (int k = 0; k < p->devices[0].n_ins; k++) {
		const sp_ins_t *in = &p->ins[p->devices[0].first_ins + k];
		if (in->op != INS_FWD)
			continue;
		const sp_slice_t *sl = &p->slices[in->slice];
		const sp_metaop_t *m = &p->metaops[sl->metaop];
		if (m->shape.type == COMP_TRANSFORMER && sl->layer_from == 0)
			task_mask |= 1 << m->task;
	}
	assert_int_equal(task_mask, 3);
	/* held: (emb, 0), (tr, 0), (tr, 1), (lm, 0), each once */
	assert_int_equal(p->devices[0].n_held, 4);
	expect_device0(p, "shared components, 2 tasks on 1 device", 16, 2,
		       (int64_t[3]){(int64_t)P_ALL * 16, 10416, 67113792});
	mfix_release(&f);
}

/*
 * A device of 0.05 GiB (51.2 MiB, less 10 % reserve: 46.1 MiB usable)
 * cannot take even the 64 MiB workspace: no schedule fits, and the final
 * memory check names a device and what it needs.
 */
static void test_no_plan_fits(void **state)
{
	(void)state;
	for (int gpus = 1; gpus <= 2; gpus++) {
		mfix_t f;
		int rc = mfix_plan(&f, "bf16", "adamw", 2, TASK("t", 4), gpus, 0.05);
		print_message("%d device(s): %s\nhint: %s\n", gpus, f.err.msg, f.err.hint);
		assert_int_equal(rc, SP_EINFEAS);
		assert_int_equal(f.err.code, SP_EINFEAS);
		const char *pre = "no plan fits memory: device ";
		assert_memory_equal(f.err.msg, pre, strlen(pre));
		int d = -1;
		assert_int_equal(sscanf(f.err.msg + strlen(pre), "%d", &d), 1);
		assert_true(d >= 0 && d < gpus);
		assert_non_null(strstr(f.err.msg, "workspace 64.0 MiB"));
		assert_null(strstr(f.err.msg, "decoder memories")); /* there are none */
		assert_true(f.err.hint[0] != '\0');
		/* on error the plan is left empty */
		assert_int_equal(f.plan.n_devices, 0);
		assert_null(f.plan.ins);
		mfix_release(&f);
	}
}

/*
 * A decoder (issue #20), by hand while the planner cannot plan one: the
 * tiny stack's widths (h 8, a 2, f 16), decoder seq s = 4, batch 4, bf16
 * + AdamW, attending to a memory of m = 6 tokens of width W = 12 (an
 * encoder's output projected by "mem"). Only the decoder's slices run:
 * slice A (layer 0) on devices {0, 1}: device 0 samples 0-2, device 1
 * samples 2-4; slice B (layer 1) on device 1 alone, samples 0-4. So device
 * 1 holds the memory for the union of its slots, 0-4 (4 samples, not the
 * 6 of the two slots summed); device 0 for 0-2.
 *
 * Per layer (schemas/arith.c): params 600 + cross-attention 2h^2 + 2Wh +
 * 6h = 128 + 192 + 48 = 368, so 968 (* 16 B of state); saved elements per
 * sample 432 + cross-attention 4sh + 2mh + a s m + 2s = 128 + 96 + 48 + 8
 * = 280, so 712. The cross-attention block's backward workspace (fp32, one
 * sample's: 7sh + sf + 2mh + s max(s, m)) = 224 + 64 + 96 + 24 = 408
 * floats = 1632 B.
 *
 *            params          acts                 work
 * device 0   968*16 = 15488  712*2*2 = 2848       2848 + 1632 + 64 MiB
 * device 1   2*968*16 = 30976 2848 + 712*4*2 = 8544  5696 + 1632 + 64 MiB
 *
 * Buffers (comm), bytes = samples * seq * width * 2: the memory act(dec, -1)
 * and its gradient grad(dec, -1), [samples, 6, 12]: 144 B a sample each;
 * the boundaries act/grad(dec, 0..2), [samples, 4, 8]: 64 B a sample.
 *  device 0: act -1, grad -1 over 0-2: 2*288; act 0, act 1, grad 1,
 *            grad 0 over 0-2: 4*128                       = 1088
 *  device 1: act -1, grad -1 over 0-4: 2*576; act 0, grad 0 over 2-4:
 *            2*128; act 1, act 2, grad 2, grad 1 over 0-4: 4*256 = 2432
 * With the lowering's transfers (the memory received once per device over
 * its union and its gradient sent back; act 1 and grad 1 of samples 0-2
 * between the devices) the same buffers plus staging: every SEND, the
 * largest RECV:
 *  device 0: sends grad -1 (288) + act 1 (128), recv max(288, 128) = 1088 + 704
 *  device 1: sends grad -1 (576) + grad 1 (128), recv max(576, 128) = 2432 + 1280
 */
static const char XATTN_JSON[] =
	"{\"format\": \"spindle.model/1\", \"name\": \"tiny-xattn\", \"dtype\": \"bf16\","
	" \"optimizer\": \"adamw\", \"components\": {"
	" \"tok\": {\"type\": \"embedding\", \"vocab\": 16, \"hidden\": 8, \"max_seq\": 6},"
	" \"img\": {\"type\": \"patch\", \"in\": 12, \"hidden\": 8, \"max_seq\": 6},"
	" \"enc\": {\"type\": \"transformer\", \"layers\": 1, \"hidden\": 8, \"heads\": 2,"
	" \"ffn\": 16},"
	" \"proj\": {\"type\": \"linear\", \"in\": 8, \"out\": 12},"
	" \"dec\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 8, \"heads\": 2,"
	" \"ffn\": 16, \"cross_attention\": true, \"memory_width\": 12},"
	" \"lm\": {\"type\": \"lm_head\", \"hidden\": 8, \"vocab\": 16}},"
	" \"tasks\": [{\"name\": \"cap\", \"batch\": 4, \"graph\": ["
	" {\"id\": \"i_in\", \"component\": \"img\", \"seq\": 6},"
	" {\"id\": \"enc\", \"component\": \"enc\", \"seq\": 6, \"inputs\": [\"i_in\"]},"
	" {\"id\": \"mem\", \"component\": \"proj\", \"seq\": 6, \"inputs\": [\"enc\"]},"
	" {\"id\": \"d_in\", \"component\": \"tok\", \"seq\": 4},"
	" {\"id\": \"dec\", \"component\": \"dec\", \"seq\": 4, \"inputs\": [\"d_in\"],"
	" \"memory\": \"mem\"},"
	" {\"id\": \"loss\", \"component\": \"lm\", \"inputs\": [\"dec\"]}]}]}";

enum { XC_DEC = 4, XM_MEM = 2, XM_DEC = 4 };

static sp_ins_t xins(int op, int slice, int s0, int s1)
{
	sp_ins_t in;
	memset(&in, 0, sizeof in);
	in.op = op;
	in.slice = slice;
	in.s0 = s0;
	in.s1 = s1;
	in.peer = -1;
	return in;
}

static sp_ins_t xfer(int op, int m, int layer, int grad, int s0, int s1, int seq_len, int peer,
		     int tag)
{
	sp_ins_t in = xins(op, -1, s0, s1);
	sp_vref_t v = {m, layer, grad, 0};
	if (op == INS_SEND)
		in.src = v;
	else
		in.dst = v;
	in.seq_len = seq_len;
	in.peer = peer;
	in.tag = tag;
	return in;
}

#define XNEW(p, n) ((p) = calloc((size_t)(n), sizeof *(p)), assert_non_null(p))

/* The plan above; with_xfers 0 leaves the transfers out (a plan before
 * its lowering: the decoder's FWD and BWD still read the memory). */
static void make_xattn_plan(sp_plan_t *p, int with_xfers)
{
	sp_err_t err;
	memset(p, 0, sizeof *p);
	memset(&err, 0, sizeof err);
	int rc = model_parse(&p->model, XATTN_JSON, strlen(XATTN_JSON), "x.json", &err);
	if (rc)
		print_message("model: %s\n", err.msg);
	assert_int_equal(rc, 0);
	snprintf(p->planner_version, sizeof p->planner_version, "test");
	snprintf(p->algo, sizeof p->algo, "hand");
	snprintf(p->cluster_name, sizeof p->cluster_name, "c2");
	snprintf(p->gpu_name, sizeof p->gpu_name, "cpu");
	p->nodes = 1;
	p->gpus_per_node = 2;
	p->memory_gib = 16;
	p->microbatches = 1;
	/* every node's MetaOp: i_in, enc, mem, d_in, dec (2 layers), loss */
	static const int nl[] = {1, 1, 1, 1, 2, 1}, sin[] = {6, 6, 6, 4, 4, 4};
	static const int win[] = {0, 8, 8, 0, 8, 8}, sout[] = {6, 6, 6, 4, 4, 0};
	static const int wout[] = {8, 8, 12, 8, 8, 0};
	p->n_metaops = 6;
	p->n_ops = 7;
	XNEW(p->metaops, p->n_metaops);
	XNEW(p->ops, p->n_ops);
	const sp_task_t *t = &p->model.tasks[0];
	for (int m = 0, op = 0; m < p->n_metaops; op += nl[m], m++) {
		sp_metaop_t *x = &p->metaops[m];
		x->shape = op_shape(&p->model, t, &t->nodes[m]);
		x->n_layers = nl[m];
		x->first_op = op;
		x->seq_in = sin[m];
		x->width_in = win[m];
		x->seq_out = sout[m];
		x->width_out = wout[m];
		snprintf(x->name, sizeof x->name, "cap/%s", t->nodes[m].id);
		for (int k = 0; k < nl[m]; k++)
			p->ops[op + k] = (sp_op_t){m, k};
	}
	static const sp_edge_t edges[] = {{0, 1, 0, 6, 0}, {1, 2, 0, 6, 0}, {3, 4, 0, 4, 0},
					  {XM_MEM, XM_DEC, 0, 6, 1}, {4, 5, 0, 4, 0}};
	p->n_edges = SP_ARRAY_LEN(edges);
	XNEW(p->edges, p->n_edges);
	memcpy(p->edges, edges, sizeof edges);
	p->n_waves = 2;
	XNEW(p->waves, 2);
	p->waves[0] = (sp_wave_t){0, 1, 2, 1, 0, 1};
	p->waves[1] = (sp_wave_t){1, 1, 1, 1, 1, 1};
	static const int32_t sdevs[] = {0, 1, 1};
	p->n_slice_devs = 3;
	XNEW(p->slice_devs, 3);
	memcpy(p->slice_devs, sdevs, sizeof sdevs);
	p->n_slices = 2;
	XNEW(p->slices, 2);
	p->slices[0] = (sp_slice_t){.wave = 0, .metaop = XM_DEC, .layer_from = 0, .layer_to = 1,
				    .n_dev = 2, .dev_off = 0, .tp = 1};
	p->slices[1] = (sp_slice_t){.wave = 1, .metaop = XM_DEC, .layer_from = 1, .layer_to = 2,
				    .n_dev = 1, .dev_off = 2, .tp = 1};
	/* held: (dec, 0) on both, (dec, 1) on device 1; a bucket per group */
	static const sp_param_t held[] = {{XC_DEC, 0, 1, 0}, {XC_DEC, 0, 1, 0}, {XC_DEC, 1, 1, 0}};
	p->n_held = 3;
	XNEW(p->held, 3);
	memcpy(p->held, held, sizeof held);
	static const int32_t bdevs[] = {0, 1, 1};
	p->n_bucket_devs = 3;
	XNEW(p->bucket_devs, 3);
	memcpy(p->bucket_devs, bdevs, sizeof bdevs);
	p->n_bucket_params = 2;
	XNEW(p->bucket_params, 2);
	p->bucket_params[0] = held[0];
	p->bucket_params[1] = held[2];
	p->n_buckets = 2;
	XNEW(p->buckets, 2);
	int64_t e = comp_layer_params(&p->model.comps[XC_DEC]);
	p->buckets[0] = (sp_bucket_t){2, 0, 1, 0, e, 0, LAYOUT_REPLICATED, 0, 0, 0};
	p->buckets[1] = (sp_bucket_t){1, 2, 1, 1, e, 0, LAYOUT_REPLICATED, 0, 0, 0};

	sp_ins_t d0[16], d1[16];
	int n0 = 0, n1 = 0;
	if (with_xfers)
		d0[n0++] = xfer(INS_RECV, XM_DEC, -1, 0, 0, 2, 6, 1, 1);
	d0[n0++] = xins(INS_FWD, 0, 0, 2);
	if (with_xfers)
		d0[n0++] = xfer(INS_SEND, XM_DEC, 1, 0, 0, 2, 4, 1, 3);
	if (with_xfers)
		d0[n0++] = xfer(INS_RECV, XM_DEC, 1, 1, 0, 2, 4, 1, 4);
	d0[n0++] = xins(INS_BWD, 0, 0, 2);
	if (with_xfers)
		d0[n0++] = xfer(INS_SEND, XM_DEC, -1, 1, 0, 2, 6, 1, 2);
	d0[n0++] = xins(INS_SYNC, -1, 0, 0);
	d0[n0 - 1].peer = 0;
	d0[n0++] = xins(INS_STEP, -1, 0, 0);
	if (with_xfers)
		d1[n1++] = xfer(INS_RECV, XM_DEC, -1, 0, 0, 4, 6, 0, 1);
	d1[n1++] = xins(INS_FWD, 0, 2, 4);
	if (with_xfers)
		d1[n1++] = xfer(INS_RECV, XM_DEC, 1, 0, 0, 2, 4, 0, 3);
	d1[n1++] = xins(INS_FWD, 1, 0, 4);
	d1[n1++] = xins(INS_BWD, 1, 0, 4);
	if (with_xfers)
		d1[n1++] = xfer(INS_SEND, XM_DEC, 1, 1, 0, 2, 4, 0, 4);
	d1[n1++] = xins(INS_BWD, 0, 2, 4);
	if (with_xfers)
		d1[n1++] = xfer(INS_SEND, XM_DEC, -1, 1, 0, 4, 6, 0, 2);
	d1[n1++] = xins(INS_SYNC, -1, 0, 0);
	d1[n1 - 1].peer = 0;
	d1[n1++] = xins(INS_SYNC, -1, 0, 0);
	d1[n1 - 1].peer = 1;
	d1[n1++] = xins(INS_STEP, -1, 0, 0);
	p->n_ins = n0 + n1;
	XNEW(p->ins, p->n_ins);
	memcpy(p->ins, d0, sizeof *d0 * (size_t)n0);
	memcpy(p->ins + n0, d1, sizeof *d1 * (size_t)n1);
	for (int k = 0; k < p->n_ins; k++) {
		sp_ins_t *c = &p->ins[k];
		if (c->op != INS_FWD && c->op != INS_BWD)
			continue;
		const sp_slice_t *sl = &p->slices[c->slice];
		int a = sl->layer_from, b = sl->layer_to;
		c->src = (sp_vref_t){XM_DEC, c->op == INS_FWD ? a : b, c->op == INS_BWD, 0};
		c->dst = (sp_vref_t){XM_DEC, c->op == INS_FWD ? b : a, c->op == INS_BWD, 0};
	}
	p->n_devices = 2;
	XNEW(p->devices, 2);
	p->devices[0] = (sp_device_t){.node = 0, .local = 0, .first_ins = 0, .n_ins = n0,
				      .n_held = 1, .held_off = 0};
	p->devices[1] = (sp_device_t){.node = 0, .local = 1, .first_ins = n0, .n_ins = n1,
				      .n_held = 2, .held_off = 1};
}

static void test_decoder_memory(void **state)
{
	(void)state;
	static const int64_t want[2][4] = {
		/* params, acts, comm (no transfers), work */
		{15488, 2848, 1088, 2848 + 1632 + MIB64},
		{30976, 8544, 2432, 5696 + 1632 + MIB64},
	};
	static const int64_t staging[2] = {704, 1280};
	for (int with = 0; with <= 1; with++) {
		sp_plan_t p;
		make_xattn_plan(&p, with);
		/* the premises: a valid plan (the reader's rules, the memory's
		 * edge and values included), and the library's per-layer sizes */
		uint8_t *bin;
		size_t len;
		sp_err_t err;
		memset(&err, 0, sizeof err);
		int rc = plan_encode(&bin, &len, &p, &err);
		if (rc)
			print_message("encode: %s: %s\n", err.path, err.msg);
		assert_int_equal(rc, 0);
		free(bin);
		assert_int_equal(comp_layer_params(&p.model.comps[XC_DEC]), 968);
		assert_int_equal(op_saved_elems(&p.metaops[XM_DEC].shape, 4), 712);
		for (int d = 0; d < 2; d++) {
			int64_t mem[MEM__COUNT];
			assert_int_equal(plan_memory(&p, d, mem), 0);
			int64_t comm = want[d][2] + (with ? staging[d] : 0);
			print_message("decoder, %s transfers, device %d: params %lld (%lld) acts %lld "
				      "(%lld) comm %lld (%lld) work %lld (%lld)\n",
				      with ? "with" : "without", d, (long long)mem[MEM_PARAMS],
				      (long long)want[d][0], (long long)mem[MEM_ACTS],
				      (long long)want[d][1], (long long)mem[MEM_COMM], (long long)comm,
				      (long long)mem[MEM_WORK], (long long)want[d][3]);
			assert_int_equal(mem[MEM_PARAMS], want[d][0]);
			assert_int_equal(mem[MEM_ACTS], want[d][1]);
			assert_int_equal(mem[MEM_COMM], comm);
			assert_int_equal(mem[MEM_WORK], want[d][3]);
		}
		if (with) {
			/* over a cap of 1 KiB, memplan_run names device 1 and its
			 * decoder memories: 2 * 576 B = 1.1 KiB */
			sp_cluster_t cl;
			plan_opts_t opts;
			planner_t pl;
			memset(&cl, 0, sizeof cl);
			memset(&opts, 0, sizeof opts);
			memset(&pl, 0, sizeof pl);
			memset(&err, 0, sizeof err);
			cl.memory_gib = 16;
			pl.cluster = &cl;
			pl.opts = &opts;
			pl.err = &err;
			pl.mem_cap = 1024;
			assert_int_equal(memplan_run(&pl, &p, 1), SP_EINFEAS);
			print_message("%s\n", err.msg);
			const char *pre = "no plan fits memory: device 1 needs ";
			assert_memory_equal(err.msg, pre, strlen(pre));
			assert_non_null(strstr(err.msg, "buffers 3.6 KiB (decoder memories 1.1 KiB)"));
		}
		plan_release(&p);
	}
}

/*
 * The same encoder-decoder planned by planner_run on 1 and 2 devices
 * (bf16 + AdamW, replicated, kept, unsplit), checked against per-layer
 * tables by hand whatever the schedule. Saved elements per sample:
 *   d_in  embedding, s 4                                  4
 *   i_in  patch, s 6: s in = 6*12                         72
 *   enc   transformer, s 6: 8sh + 2sf + a s^2 + 4s
 *         = 384 + 192 + 72 + 24                           672
 *   mem   linear, s 6: s in = 6*8                         48
 *   dec   decoder, s 4 (above)                            712
 *   loss  lm_head, s 4 (above)                            136
 * Parameters per layer: tok (16 + 6) 8 = 176, img 12*8 + 8 + 6*8 = 152,
 * enc 600, proj 8*12 + 12 = 108, dec 968, lm 144; 16 B of state each.
 * Backward workspace (fp32): enc at n samples (n s h + s (h + f + 4h) +
 * s^2) 4 = (48 n + 372) 4 B; dec 1632 B whatever n. Buffers: at least the
 * decoder memory and its gradient over the hull of the device's decoder
 * samples, 2 * 144 B per sample.
 */
static int64_t x_params(const char *comp)
{
	static const struct {
		const char *name;
		int64_t v;
	} t[] = {{"tok", 176}, {"img", 152}, {"enc", 600}, {"proj", 108}, {"dec", 968}, {"lm", 144}};
	for (int i = 0; i < SP_ARRAY_LEN(t); i++)
		if (!strcmp(t[i].name, comp))
			return t[i].v;
	fail_msg("unexpected component %s", comp);
	return 0;
}

static int64_t x_saved(const sp_opshape_t *s)
{
	switch (s->type) {
	case COMP_EMBEDDING: return 4;
	case COMP_PATCH: return 72;
	case COMP_TRANSFORMER: return s->mem_seq > 0 ? 712 : 672;
	case COMP_LINEAR: return 48;
	case COMP_LM_HEAD: return 136;
	default: fail_msg("unexpected operator type %d", (int)s->type);
	}
	return 0;
}

static void test_planned_decoder(void **state)
{
	(void)state;
	for (int gpus = 1; gpus <= 2; gpus++) {
		mfix_t f;
		char text[1024];
		memset(&f, 0, sizeof f);
		assert_int_equal(model_parse(&f.model, XATTN_JSON, strlen(XATTN_JSON), "x.json",
					     &f.err), 0);
		int n = snprintf(text, sizeof text, CLUSTER_FMT, gpus, gpus, 16.0);
		assert_int_equal(cluster_parse(&f.cluster, text, (size_t)n, "c.json", &f.err), 0);
		f.opts.algo = ALGO_SPINDLE;
		f.opts.placement = PLACE_SPINDLE;
		f.opts.mem_reserve_gib = 1.6;
		f.opts.milp_nodes = 200;
		f.opts.tp = 1;
		int rc = planner_run(&f.opts, &f.model, &f.cluster, &f.plan, &f.sum, &f.err);
		if (rc)
			print_message("plan: %s\n", f.err.msg);
		assert_int_equal(rc, 0);
		const sp_plan_t *p = &f.plan;
		int64_t acts_sum = 0;
		int decoder_devices = 0;
		for (int d = 0; d < p->n_devices; d++) {
			const sp_device_t *dv = &p->devices[d];
			int64_t params = 0, acts = 0, big = 0, bws = 0;
			int32_t lo = INT32_MAX, hi = -1;
			for (int k = 0; k < dv->n_held; k++)
				params += x_params(p->model.comps[p->held[dv->held_off + k].comp].name) *
					  16;
			for (int k = 0; k < dv->n_ins; k++) {
				const sp_ins_t *in = &p->ins[dv->first_ins + k];
				if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
					continue;
				const sp_slice_t *sl = &p->slices[in->slice];
				const sp_opshape_t *sh = &p->metaops[sl->metaop].shape;
				int64_t nn = in->s1 - in->s0, one = x_saved(sh) * nn * 2;
				assert_int_equal(sl->tp, 1);
				assert_int_equal(sl->recompute, 0);
				big = SP_MAX(big, one);
				if (in->op == INS_FWD)
					acts += one * (sl->layer_to - sl->layer_from);
				if (in->op == INS_BWD && sh->type == COMP_TRANSFORMER)
					bws = SP_MAX(bws, sh->mem_seq > 0 ? 1632 : (48 * nn + 372) * 4);
				if (sh->mem_seq > 0) {
					lo = SP_MIN(lo, in->s0);
					hi = SP_MAX(hi, in->s1);
				}
			}
			int64_t mem[MEM__COUNT], memory = hi > lo ? 2 * (int64_t)(hi - lo) * 144 : 0;
			assert_int_equal(plan_memory(p, d, mem), 0);
			print_message("decoder planned on %d device(s), device %d: params %lld (%lld) "
				      "acts %lld (%lld) work %lld (%lld) comm %lld (memory %lld)\n",
				      gpus, d, (long long)mem[MEM_PARAMS], (long long)params,
				      (long long)mem[MEM_ACTS], (long long)acts, (long long)mem[MEM_WORK],
				      (long long)(big + bws + MIB64), (long long)mem[MEM_COMM],
				      (long long)memory);
			assert_int_equal(mem[MEM_PARAMS], params);
			assert_int_equal(mem[MEM_ACTS], acts);
			assert_int_equal(mem[MEM_WORK], big + bws + MIB64);
			assert_true(mem[MEM_COMM] >= memory);
			acts_sum += acts;
			decoder_devices += memory > 0;
		}
		/* every (sample, layer) is forwarded once: 4 samples of each */
		int64_t per_sample = 4 + 72 + 672 + 48 + 712 * 2;
		assert_int_equal(acts_sum, per_sample * 4 * 2);
		assert_true(decoder_devices >= 1);
		mfix_release(&f);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decoder_memory),
		cmocka_unit_test(test_planned_decoder),
		cmocka_unit_test(test_formula),
		cmocka_unit_test(test_multi_layer_slices),
		cmocka_unit_test(test_recompute),
		cmocka_unit_test(test_shared_counted_once),
		cmocka_unit_test(test_no_plan_fits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
