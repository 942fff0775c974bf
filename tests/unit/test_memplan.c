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
 * add up into the peak.
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
		assert_true(f.err.hint[0] != '\0');
		/* on error the plan is left empty */
		assert_int_equal(f.plan.n_devices, 0);
		assert_null(f.plan.ins);
		mfix_release(&f);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_formula),
		cmocka_unit_test(test_multi_layer_slices),
		cmocka_unit_test(test_recompute),
		cmocka_unit_test(test_shared_counted_once),
		cmocka_unit_test(test_no_plan_fits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
