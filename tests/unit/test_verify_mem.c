/*
 * test_verify_mem.c — the verifier's rules for a decoder's memory
 * (planner/verify_mem.c, issue #20) on decoder plans broken on purpose.
 *
 * The plans are made by hand, per the contract's lowering, for one
 * encoder-decoder task (an image encoder whose output the decoder's two
 * layers attend to; batch 4): "two" puts the encoder on device 0 and the
 * decoder on device 1; "three" splits the decoder's first layer over
 * devices 1 and 2 by samples and runs its second on device 1 (so device 1
 * holds the memory of the union of its ranges and returns a gradient of
 * two layers for some samples and one for others, device 2 one); "local"
 * runs the encoder on devices 0 and 1 by samples and the decoder on device
 * 1 (half the memory and its gradient are COPYs). Beside them, the planner's
 * plans of tests/planner/encdec (two tasks sharing a decoder component, one
 * of them's decoder in two MetaOps) under several algorithms and options,
 * --tp 2 among them (an encoder split: a decoder device returns the same
 * samples to both members). Each must pass; each is then broken, one edit
 * at a time (plan_edit.c), in every way the rules cover, at every site,
 * and each break must be rejected with the rule's message at the expected
 * device and instruction (among them a memory SEND whose destination names
 * a MetaOp the plan lacks, vmem_xfer's bounds check). Every test prints its
 * counts; the last prints "N/N breaks rejected" over all of them. And the
 * fuzzing regressions of tests/fuzz/regressions/plan/ decode and are
 * refused by the checks they name (test_fuzz_regressions).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "plan_edit.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

static const char MODEL[] =
	"{\"format\": \"spindle.model/1\", \"name\": \"encdec\",\n"
	" \"components\": {\n"
	"  \"img\": {\"type\": \"patch\", \"in\": 12, \"hidden\": 16, \"max_seq\": 8},\n"
	"  \"enc\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 16, \"heads\": 2,"
	" \"ffn\": 32},\n"
	"  \"tok\": {\"type\": \"embedding\", \"vocab\": 32, \"hidden\": 8, \"max_seq\": 6},\n"
	"  \"dec\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 8, \"heads\": 2,"
	" \"ffn\": 16, \"causal\": true, \"cross_attention\": true, \"memory_width\": 16},\n"
	"  \"head\": {\"type\": \"lm_head\", \"hidden\": 8, \"vocab\": 32}},\n"
	" \"tasks\": [{\"name\": \"caption\", \"batch\": 4, \"graph\": [\n"
	"  {\"id\": \"img_in\", \"component\": \"img\", \"seq\": 8},\n"
	"  {\"id\": \"enc\", \"component\": \"enc\", \"seq\": 8, \"inputs\": [\"img_in\"]},\n"
	"  {\"id\": \"txt_in\", \"component\": \"tok\", \"seq\": 6},\n"
	"  {\"id\": \"dec\", \"component\": \"dec\", \"seq\": 6, \"inputs\": [\"txt_in\"],"
	" \"memory\": \"enc\"},\n"
	"  {\"id\": \"loss\", \"component\": \"head\", \"inputs\": [\"dec\"]}]}]}\n";

/* ---- hand-made plans -------------------------------------------------------- */

/* MetaOps: one per node (node index = MetaOp index) */
enum { M_IMG, M_ENC, M_TOK, M_DEC, M_LOSS, N_MOPS };
enum { V_TWO, V_THREE, V_LOCAL, N_VARIANTS };
static const char *const VARIANT[N_VARIANTS] = {"two", "three", "local"};
#define MAX_DEV 3
#define MAX_INS 64
#define MAX_SLICES 8
#define MAX_PARAMS 16

typedef struct {
	int metaop, lf, lt, n;
	int devs[MAX_DEV];
} slice_spec_t;

/* Programs written in one global order (a RECV after its SEND), each
 * device's its subsequence. */
typedef struct {
	sp_plan_t *p;
	sp_ins_t prog[MAX_DEV][MAX_INS];
	int n[MAX_DEV];
	int tag;
} writer_t;

static sp_vref_t act(int m, int l)
{
	return (sp_vref_t){m, l, 0, 0};
}

static sp_vref_t grad(int m, int l)
{
	return (sp_vref_t){m, l, 1, 0};
}

static void put(writer_t *w, int d, sp_ins_t in)
{
	assert_true(w->n[d] < MAX_INS);
	w->prog[d][w->n[d]++] = in;
}

/* FWD, BWD or LOSS of slice i on samples [s0, s1) of device d. */
static void run(writer_t *w, int d, int op, int i, int s0, int s1)
{
	const sp_slice_t *sl = &w->p->slices[i];
	int m = sl->metaop;
	sp_ins_t in = {.op = op, .slice = i, .s0 = s0, .s1 = s1, .peer = -1, .tag = -1};
	in.src = op == INS_BWD ? grad(m, sl->layer_to) : act(m, sl->layer_from);
	in.dst = op == INS_BWD ? grad(m, sl->layer_from)
	       : op == INS_LOSS ? grad(m, 0)
				: act(m, sl->layer_to);
	put(w, d, in);
}

/* src on device a -> dst on device b, samples [s0, s1), seq tokens each: a
 * SEND and its RECV, or a COPY when a == b. */
static void xfer(writer_t *w, int a, int b, sp_vref_t src, sp_vref_t dst, int s0, int s1,
		 int seq)
{
	sp_ins_t in = {.op = INS_COPY, .slice = -1, .s0 = s0, .s1 = s1, .seq_len = seq,
		       .src = src, .dst = dst, .peer = -1, .tag = -1};
	if (a == b) {
		put(w, a, in);
		return;
	}
	in.tag = w->tag++;
	in.op = INS_SEND;
	in.peer = b;
	put(w, a, in);
	in.op = INS_RECV;
	in.peer = a;
	put(w, b, in);
}

/* Slices of variant v. */
static int variant_slices(int v, slice_spec_t *out)
{
	static const slice_spec_t two[] = {
		{M_IMG, 0, 1, 1, {0}}, {M_ENC, 0, 2, 1, {0}}, {M_TOK, 0, 1, 1, {1}},
		{M_DEC, 0, 2, 1, {1}}, {M_LOSS, 0, 1, 1, {1}}};
	static const slice_spec_t three[] = {
		{M_IMG, 0, 1, 1, {0}},	  {M_ENC, 0, 2, 1, {0}}, {M_TOK, 0, 1, 2, {1, 2}},
		{M_DEC, 0, 1, 2, {1, 2}}, {M_DEC, 1, 2, 1, {1}}, {M_LOSS, 0, 1, 1, {1}}};
	static const slice_spec_t local[] = {
		{M_IMG, 0, 1, 2, {0, 1}}, {M_ENC, 0, 2, 2, {0, 1}}, {M_TOK, 0, 1, 1, {1}},
		{M_DEC, 0, 2, 1, {1}},	  {M_LOSS, 0, 1, 1, {1}}};
	const slice_spec_t *s = v == V_TWO ? two : v == V_THREE ? three : local;
	int n = v == V_THREE ? 6 : 5;
	memcpy(out, s, sizeof *s * (size_t)n);
	return n;
}

/* Encoder on device 0, decoder on device 1. */
static void write_two(writer_t *w)
{
	run(w, 0, INS_FWD, 0, 0, 4);
	xfer(w, 0, 0, act(M_IMG, 1), act(M_ENC, 0), 0, 4, 8);
	run(w, 0, INS_FWD, 1, 0, 4);
	run(w, 1, INS_FWD, 2, 0, 4);
	xfer(w, 1, 1, act(M_TOK, 1), act(M_DEC, 0), 0, 4, 6);
	xfer(w, 0, 1, act(M_ENC, 2), act(M_DEC, -1), 0, 4, 8); /* the memory */
	run(w, 1, INS_FWD, 3, 0, 4);
	xfer(w, 1, 1, act(M_DEC, 2), act(M_LOSS, 0), 0, 4, 6);
	run(w, 1, INS_LOSS, 4, 0, 4);
	xfer(w, 1, 1, grad(M_LOSS, 0), grad(M_DEC, 2), 0, 4, 6);
	run(w, 1, INS_BWD, 3, 0, 4);
	xfer(w, 1, 0, grad(M_DEC, -1), grad(M_ENC, 2), 0, 4, 8); /* its gradient */
	xfer(w, 1, 1, grad(M_DEC, 0), grad(M_TOK, 1), 0, 4, 6);
	run(w, 1, INS_BWD, 2, 0, 4);
	run(w, 0, INS_BWD, 1, 0, 4);
	xfer(w, 0, 0, grad(M_ENC, 0), grad(M_IMG, 1), 0, 4, 8);
	run(w, 0, INS_BWD, 0, 0, 4);
}

/* Decoder layer 0 on devices 1 ([0, 2)) and 2 ([2, 4)), layer 1 on device
 * 1: device 1 holds the memory of [0, 4), device 2 of [2, 4). */
static void write_three(writer_t *w)
{
	run(w, 0, INS_FWD, 0, 0, 4);
	xfer(w, 0, 0, act(M_IMG, 1), act(M_ENC, 0), 0, 4, 8);
	run(w, 0, INS_FWD, 1, 0, 4);
	run(w, 1, INS_FWD, 2, 0, 2);
	xfer(w, 1, 1, act(M_TOK, 1), act(M_DEC, 0), 0, 2, 6);
	run(w, 2, INS_FWD, 2, 2, 4);
	xfer(w, 2, 2, act(M_TOK, 1), act(M_DEC, 0), 2, 4, 6);
	xfer(w, 0, 1, act(M_ENC, 2), act(M_DEC, -1), 0, 4, 8);
	xfer(w, 0, 2, act(M_ENC, 2), act(M_DEC, -1), 2, 4, 8);
	run(w, 1, INS_FWD, 3, 0, 2);
	run(w, 2, INS_FWD, 3, 2, 4);
	xfer(w, 2, 1, act(M_DEC, 1), act(M_DEC, 1), 2, 4, 6);
	run(w, 1, INS_FWD, 4, 0, 4);
	xfer(w, 1, 1, act(M_DEC, 2), act(M_LOSS, 0), 0, 4, 6);
	run(w, 1, INS_LOSS, 5, 0, 4);
	xfer(w, 1, 1, grad(M_LOSS, 0), grad(M_DEC, 2), 0, 4, 6);
	run(w, 1, INS_BWD, 4, 0, 4);
	xfer(w, 1, 2, grad(M_DEC, 1), grad(M_DEC, 1), 2, 4, 6);
	run(w, 1, INS_BWD, 3, 0, 2);
	xfer(w, 1, 0, grad(M_DEC, -1), grad(M_ENC, 2), 0, 4, 8); /* layers 2, 2, 1, 1 */
	xfer(w, 1, 1, grad(M_DEC, 0), grad(M_TOK, 1), 0, 2, 6);
	run(w, 1, INS_BWD, 2, 0, 2);
	run(w, 2, INS_BWD, 3, 2, 4);
	xfer(w, 2, 0, grad(M_DEC, -1), grad(M_ENC, 2), 2, 4, 8); /* layers 0, 0, 1, 1 */
	xfer(w, 2, 2, grad(M_DEC, 0), grad(M_TOK, 1), 2, 4, 6);
	run(w, 2, INS_BWD, 2, 2, 4);
	run(w, 0, INS_BWD, 1, 0, 4);
	xfer(w, 0, 0, grad(M_ENC, 0), grad(M_IMG, 1), 0, 4, 8);
	run(w, 0, INS_BWD, 0, 0, 4);
}

/* Encoder on devices 0 ([0, 2)) and 1 ([2, 4)), decoder on device 1: the
 * memory of [2, 4) and its gradient are COPYs. */
static void write_local(writer_t *w)
{
	for (int d = 0; d < 2; d++) {
		run(w, d, INS_FWD, 0, 2 * d, 2 * d + 2);
		xfer(w, d, d, act(M_IMG, 1), act(M_ENC, 0), 2 * d, 2 * d + 2, 8);
		run(w, d, INS_FWD, 1, 2 * d, 2 * d + 2);
	}
	run(w, 1, INS_FWD, 2, 0, 4);
	xfer(w, 1, 1, act(M_TOK, 1), act(M_DEC, 0), 0, 4, 6);
	xfer(w, 0, 1, act(M_ENC, 2), act(M_DEC, -1), 0, 2, 8);
	xfer(w, 1, 1, act(M_ENC, 2), act(M_DEC, -1), 2, 4, 8);
	run(w, 1, INS_FWD, 3, 0, 4);
	xfer(w, 1, 1, act(M_DEC, 2), act(M_LOSS, 0), 0, 4, 6);
	run(w, 1, INS_LOSS, 4, 0, 4);
	xfer(w, 1, 1, grad(M_LOSS, 0), grad(M_DEC, 2), 0, 4, 6);
	run(w, 1, INS_BWD, 3, 0, 4);
	xfer(w, 1, 0, grad(M_DEC, -1), grad(M_ENC, 2), 0, 2, 8);
	xfer(w, 1, 1, grad(M_DEC, -1), grad(M_ENC, 2), 2, 4, 8);
	xfer(w, 1, 1, grad(M_DEC, 0), grad(M_TOK, 1), 0, 4, 6);
	run(w, 1, INS_BWD, 2, 0, 4);
	for (int d = 1; d >= 0; d--) {
		run(w, d, INS_BWD, 1, 2 * d, 2 * d + 2);
		xfer(w, d, d, grad(M_ENC, 0), grad(M_IMG, 1), 2 * d, 2 * d + 2, 8);
		run(w, d, INS_BWD, 0, 2 * d, 2 * d + 2);
	}
}

static void fill_metaops(sp_plan_t *p)
{
	/* seq_in, width_in, seq_out, width_out per node */
	static const int32_t io[N_MOPS][4] = {
		{0, 0, 8, 16}, {8, 16, 8, 16}, {0, 0, 6, 8}, {6, 8, 6, 8}, {6, 8, 0, 0}};
	const sp_task_t *t = &p->model.tasks[0];
	p->n_metaops = N_MOPS;
	p->metaops = calloc(N_MOPS, sizeof *p->metaops);
	p->ops = calloc(8, sizeof *p->ops);
	assert_non_null(p->metaops);
	assert_non_null(p->ops);
	for (int m = 0; m < N_MOPS; m++) {
		const sp_node_t *n = &t->nodes[m];
		const sp_component_t *c = &p->model.comps[n->comp];
		sp_metaop_t *mo = &p->metaops[m];
		mo->task = 0;
		mo->shape = (sp_opshape_t){.type = c->type, .hidden = c->hidden, .heads = c->heads,
					   .ffn = c->ffn, .seq = io[m][2] ? io[m][2] : io[m][0],
					   .vocab = c->vocab, .causal = c->causal};
		if (c->cross_attention) {
			mo->shape.mem_seq = 8;
			mo->shape.mem_width = c->memory_width;
		}
		mo->n_layers = n->layer_to - n->layer_from;
		mo->first_op = p->n_ops;
		mo->seq_in = io[m][0];
		mo->width_in = io[m][1];
		mo->seq_out = io[m][2];
		mo->width_out = io[m][3];
		snprintf(mo->name, sizeof mo->name, "%s/%s", t->name, n->id);
		for (int l = 0; l < mo->n_layers; l++)
			p->ops[p->n_ops++] = (sp_op_t){m, n->layer_from + l};
	}
	static const sp_edge_t edges[] = {{M_IMG, M_ENC, 0, 8, 0},
					  {M_TOK, M_DEC, 0, 6, 0},
					  {M_ENC, M_DEC, 0, 8, 1},
					  {M_DEC, M_LOSS, 0, 6, 0}};
	p->n_edges = 4;
	p->edges = malloc(sizeof edges);
	assert_non_null(p->edges);
	memcpy(p->edges, edges, sizeof edges);
}

static void fill_slices(sp_plan_t *p, const slice_spec_t *s, int n)
{
	p->n_slices = n;
	p->slices = calloc((size_t)n, sizeof *p->slices);
	p->slice_devs = calloc(MAX_SLICES * MAX_DEV, sizeof *p->slice_devs);
	assert_non_null(p->slices);
	assert_non_null(p->slice_devs);
	for (int i = 0; i < n; i++) {
		p->slices[i] = (sp_slice_t){.wave = i, .metaop = s[i].metaop,
					    .layer_from = s[i].lf, .layer_to = s[i].lt,
					    .n_dev = s[i].n, .dev_off = p->n_slice_devs, .tp = 1};
		for (int k = 0; k < s[i].n; k++)
			p->slice_devs[p->n_slice_devs++] = s[i].devs[k];
	}
}

/* Held parameters (what each device's slices use) and one replicated
 * bucket per set of holders, in order of first use. */
static void fill_params(sp_plan_t *p)
{
	sp_param_t par[MAX_PARAMS];
	int holders[MAX_PARAMS] = {0}, np = 0;
	for (int i = 0; i < p->n_slices; i++) {
		const sp_slice_t *sl = &p->slices[i];
		for (int l = sl->layer_from; l < sl->layer_to; l++) {
			const sp_op_t *op = &p->ops[p->metaops[sl->metaop].first_op + l];
			sp_param_t x = {p->model.tasks[0].nodes[op->node].comp, op->layer, 1, 0};
			int q = 0;
			while (q < np && (par[q].comp != x.comp || par[q].layer != x.layer))
				q++;
			if (q == np)
				par[np++] = x;
			for (int k = 0; k < sl->n_dev; k++)
				holders[q] |= 1 << p->slice_devs[sl->dev_off + k];
		}
	}
	p->held = calloc(MAX_PARAMS * MAX_DEV, sizeof *p->held);
	p->buckets = calloc(MAX_PARAMS, sizeof *p->buckets);
	p->bucket_devs = calloc(MAX_PARAMS * MAX_DEV, sizeof *p->bucket_devs);
	p->bucket_params = calloc(MAX_PARAMS, sizeof *p->bucket_params);
	assert_true(p->held && p->buckets && p->bucket_devs && p->bucket_params);
	for (int d = 0; d < p->n_devices; d++) {
		p->devices[d].held_off = p->n_held;
		for (int q = 0; q < np; q++)
			if (holders[q] >> d & 1)
				p->held[p->n_held++] = par[q];
		p->devices[d].n_held = p->n_held - p->devices[d].held_off;
	}
	int done[MAX_PARAMS] = {0};
	for (int q = 0; q < np; q++) {
		if (done[q])
			continue;
		sp_bucket_t *bk = &p->buckets[p->n_buckets++];
		bk->dev_off = p->n_bucket_devs;
		bk->param_off = p->n_bucket_params;
		for (int d = 0; d < p->n_devices; d++)
			if (holders[q] >> d & 1)
				p->bucket_devs[p->n_bucket_devs++] = d;
		bk->n_dev = p->n_bucket_devs - bk->dev_off;
		for (int r = q; r < np; r++)
			if (holders[r] == holders[q]) {
				done[r] = 1;
				p->bucket_params[p->n_bucket_params++] = par[r];
				bk->elems += comp_layer_params_tp(&p->model.comps[par[r].comp], 1);
			}
		bk->n_params = p->n_bucket_params - bk->param_off;
	}
}

/* Each device's SYNCs (its buckets, ascending) and STEP, then the programs
 * into p->ins. */
static void finish_programs(writer_t *w)
{
	sp_plan_t *p = w->p;
	for (int d = 0; d < p->n_devices; d++) {
		for (int b = 0; b < p->n_buckets; b++) {
			int64_t off, n;
			if (bucket_shard(p, b, d, &off, &n) >= 0)
				put(w, d, (sp_ins_t){.op = INS_SYNC, .slice = -1, .peer = b, .tag = -1});
		}
		put(w, d, (sp_ins_t){.op = INS_STEP, .slice = -1, .peer = -1, .tag = -1});
	}
	p->ins = calloc(MAX_DEV * MAX_INS, sizeof *p->ins);
	assert_non_null(p->ins);
	for (int d = 0; d < p->n_devices; d++) {
		p->devices[d].first_ins = p->n_ins;
		p->devices[d].n_ins = w->n[d];
		memcpy(p->ins + p->n_ins, w->prog[d], sizeof *p->ins * (size_t)w->n[d]);
		p->n_ins += w->n[d];
	}
}

/* The hand-made plan of variant v. */
static void build_plan(int v, sp_plan_t *out)
{
	sp_err_t err = {0};
	memset(out, 0, sizeof *out);
	if (model_parse(&out->model, MODEL, sizeof MODEL - 1, "encdec.json", &err))
		fail_msg("model: %s", err.msg);
	snprintf(out->algo, sizeof out->algo, "hand-made %s", VARIANT[v]);
	out->nodes = 1;
	out->gpus_per_node = v == V_THREE ? 3 : 2;
	out->microbatches = 1;
	out->n_devices = out->gpus_per_node;
	out->devices = calloc((size_t)out->n_devices, sizeof *out->devices);
	assert_non_null(out->devices);
	for (int d = 0; d < out->n_devices; d++)
		out->devices[d].local = d;
	slice_spec_t s[MAX_SLICES];
	fill_metaops(out);
	fill_slices(out, s, variant_slices(v, s));
	fill_params(out);
	writer_t *w = calloc(1, sizeof *w);
	assert_non_null(w);
	w->p = out;
	if (v == V_TWO)
		write_two(w);
	else if (v == V_THREE)
		write_three(w);
	else
		write_local(w);
	finish_programs(w);
	free(w);
}

/* ---- breaks --------------------------------------------------------------------- */

/* The plans broken: the hand-made ones (and planned ones: group_setup). */
#define MAX_FIX 8
typedef struct {
	char name[64];
	sp_plan_t plan;
} fixture_t;

static fixture_t fix[MAX_FIX];
static int n_fix, total_made, total_rejected;

/* Planned fixtures: tests/planner/encdec (two tasks, one decoder
 * component: a captioning decoder over an image encoder, a summarising
 * one split in two MetaOps over a projected text encoder) on two nodes of
 * four, under these options (main.c's defaults otherwise). */
static const struct {
	const char *name, *algo;
	int tp, microbatches, recompute;
} PLANNED[] = {
	{"encdec spindle", "spindle", 0, 0, -1},
	{"encdec sequential", "sequential", 0, 0, -1},
	{"encdec distmm-mt", "distmm-mt", 0, 0, -1},
	{"encdec spindle --tp 2", "spindle", 2, 0, -1},
	{"encdec spindle --microbatches 2 --recompute all", "spindle", 0, 2, 1},
};

static const char *root_dir(void)
{
	const char *r = getenv("SPINDLE_ROOT");
	return r && *r ? r : SPINDLE_ROOT;
}

static int plan_encdec(void)
{
	char mp[4096], cp[4096];
	snprintf(mp, sizeof mp, "%s/tests/planner/encdec/model.json", root_dir());
	snprintf(cp, sizeof cp, "%s/tests/planner/encdec/cluster-2x4.json", root_dir());
	sp_err_t err = {0};
	sp_model_t m = {0};
	sp_cluster_t c = {0};
	int rc = model_load(&m, mp, &err) || cluster_load(&c, cp, &err);
	for (size_t q = 0; !rc && q < sizeof PLANNED / sizeof *PLANNED; q++) {
		plan_opts_t o = {0};
		plan_summary_t sum;
		if ((rc = algo_parse(PLANNED[q].algo, &o.algo)))
			snprintf(err.msg, sizeof err.msg, "no algorithm '%s'", PLANNED[q].algo);
		o.placement = PLACE_SPINDLE;
		o.mem_reserve_gib = SP_MIN(2.0, 0.1 * c.memory_gib);
		o.milp_nodes = 200;
		o.zero = -1;
		o.recompute = PLANNED[q].recompute;
		o.microbatches = PLANNED[q].microbatches;
		o.tp = PLANNED[q].tp;
		fixture_t *f = &fix[n_fix];
		snprintf(f->name, sizeof f->name, "%s", PLANNED[q].name);
		rc = rc || planner_run(&o, &m, &c, &f->plan, &sum, &err);
		n_fix += !rc;
	}
	if (rc)
		fprintf(stderr, "setup: %s\n", err.msg);
	model_release(&m);
	cluster_release(&c);
	return rc;
}

static int group_setup(void **state)
{
	(void)state;
	for (int v = 0; v < N_VARIANTS; v++) {
		snprintf(fix[n_fix].name, sizeof fix[n_fix].name, "%s", VARIANT[v]);
		build_plan(v, &fix[n_fix++].plan);
	}
	return plan_encdec();
}

static int group_teardown(void **state)
{
	(void)state;
	for (int i = 0; i < n_fix; i++)
		plan_release(&fix[i].plan);
	return 0;
}

/*
 * Breaks of one kind on one plan: the reference copy to find sites in, the
 * copy being broken, how many breaks were made and how many the verifier
 * rejected as expected (the first message and the first misses printed).
 */
typedef struct {
	const char *kind;
	const fixture_t *f;
	sp_plan_t ref, p;
	int made, rejected;
	int loose; /* of made, caught by another rule (del_grad_out) */
} breaks_t;

static void copy_of(const fixture_t *f, sp_plan_t *out)
{
	assert_int_equal(plan_edit_copy(out, &f->plan), 0);
}

static void breaks_begin(breaks_t *b, const char *kind, const fixture_t *f)
{
	memset(b, 0, sizeof *b);
	b->kind = kind;
	b->f = f;
	copy_of(f, &b->ref);
}

static sp_plan_t *break_copy(breaks_t *b)
{
	copy_of(b->f, &b->p);
	return &b->p;
}

/* b->p, broken, is rejected (SP_EINTERNAL) with a message naming `defect`
 * and the text `where` formats to. Releases b->p. */
static void judge(breaks_t *b, const char *defect, const char *where, ...)
	__attribute__((format(printf, 3, 4)));
static void judge(breaks_t *b, const char *defect, const char *where, ...)
{
	static const char pre[] = "plan verification failed: ";
	char at[256] = "";
	va_list ap;
	va_start(ap, where);
	vsnprintf(at, sizeof at, where, ap);
	va_end(ap);
	sp_err_t err = {0};
	int rc = verify_plan(&b->p, 0, &err);
	int ok = rc == SP_EINTERNAL && !strncmp(err.msg, pre, strlen(pre)) &&
		 strstr(err.msg, defect) && strstr(err.msg, at);
	b->made++;
	if (ok && b->rejected++ == 0)
		print_message("  %s\n", err.msg);
	if (!ok && b->made - b->rejected <= 3)
		print_message("MISS %s (%s): expected '%s' at '%s', got rc %d: %s\n", b->kind,
			      b->f->name, defect, at, rc, err.msg);
	plan_release(&b->p);
}

/* Every break made was rejected, at least `least` were made. */
static void breaks_end(breaks_t *b, int least)
{
	print_message("%s (%s): %d/%d breaks rejected (at least %d expected)", b->kind,
		      b->f->name, b->rejected, b->made, least);
	if (b->loose)
		print_message(", %d of them by another rule", b->loose);
	print_message("\n");
	total_made += b->made;
	total_rejected += b->rejected;
	assert_int_equal(b->rejected, b->made);
	assert_true(b->made >= least);
	plan_release(&b->ref);
}

/* ---- sites ------------------------------------------------------------------------ */

static const sp_ins_t *at(const sp_plan_t *p, int d, int k)
{
	return plan_edit_at(p, d, k);
}

static int producer_of(const sp_plan_t *p, int c)
{
	for (int e = 0; e < p->n_edges; e++)
		if (p->edges[e].memory && p->edges[e].dst == c)
			return p->edges[e].src;
	fail_msg("no memory edge into '%s'", p->metaops[c].name);
	return -1;
}

/* A RECV's SEND (on *dev at the returned position). */
static int send_of(const sp_plan_t *p, const sp_ins_t *in, int *dev)
{
	int k = plan_edit_find_tag(p, INS_SEND, in->tag, dev);
	assert_true(k >= 0);
	return k;
}

/* The memory coming in: a RECV or COPY into act(c, -1). */
static int mem_in(const sp_ins_t *in)
{
	return (in->op == INS_RECV || in->op == INS_COPY) && in->dst.layer < 0 && !in->dst.grad;
}

/* Its gradient going out: a SEND or COPY of grad(c, -1). */
static int grad_out(const sp_ins_t *in)
{
	return (in->op == INS_SEND || in->op == INS_COPY) && in->src.layer < 0 && in->src.grad;
}

/* Its gradient coming in on the producer's device: a RECV of such a SEND,
 * or such a COPY. */
static int grad_in(const sp_plan_t *p, const sp_ins_t *in)
{
	if (in->op == INS_COPY)
		return grad_out(in);
	if (in->op != INS_RECV)
		return 0;
	int d = -1, k = send_of(p, in, &d);
	return grad_out(at(p, d, k));
}

static int meets(const sp_ins_t *in, int s0, int s1)
{
	return in->s0 < s1 && s0 < in->s1;
}

/* Device d's first (last: last 1) instruction in [from, to) with op of a
 * slice of MetaOp m (op -1: FWD or BWD; layer_to L: only slices ending at
 * L, -1 any) whose samples meet [s0, s1), or -1. */
static int find_compute(const sp_plan_t *p, int d, int op, int m, int lt, int s0, int s1,
			int from, int to, int last)
{
	int found = -1;
	for (int k = from; k < to; k++) {
		const sp_ins_t *in = at(p, d, k);
		if ((op < 0 ? in->op != INS_FWD && in->op != INS_BWD : in->op != op) ||
		    p->slices[in->slice].metaop != m || (lt >= 0 && p->slices[in->slice].layer_to != lt) ||
		    !meets(in, s0, s1))
			continue;
		found = k;
		if (!last)
			break;
	}
	return found;
}

/* brk(b, d, k) at every instruction of b->ref that pick accepts. */
static void each_site(breaks_t *b, int (*pick)(const sp_plan_t *p, const sp_ins_t *in),
		      void (*brk)(breaks_t *b, int d, int k))
{
	for (int d = 0; d < b->ref.n_devices; d++)
		for (int k = 0; k < b->ref.devices[d].n_ins; k++)
			if (pick(&b->ref, at(&b->ref, d, k)))
				brk(b, d, k);
}

static int pick_mem_in(const sp_plan_t *p, const sp_ins_t *in)
{
	(void)p;
	return mem_in(in);
}

static int pick_grad_out(const sp_plan_t *p, const sp_ins_t *in)
{
	(void)p;
	return grad_out(in);
}

static int pick_grad_in(const sp_plan_t *p, const sp_ins_t *in)
{
	return grad_in(p, in);
}

/* Runs brk over pick's sites of every plan. */
static void over_variants(const char *kind, int (*pick)(const sp_plan_t *p, const sp_ins_t *in),
			  void (*brk)(breaks_t *b, int d, int k), int least)
{
	for (int v = 0; v < n_fix; v++) {
		breaks_t b;
		breaks_begin(&b, kind, &fix[v]);
		each_site(&b, pick, brk);
		breaks_end(&b, least);
	}
}

/* ---- the valid plans --------------------------------------------------------------- */

static int count(const sp_plan_t *p, int (*pick)(const sp_plan_t *p, const sp_ins_t *in),
		 int op)
{
	int n = 0;
	for (int k = 0; k < p->n_ins; k++)
		n += pick(p, &p->ins[k]) && (op < 0 || p->ins[k].op == op);
	return n;
}

/* Every hand-made plan passes, and has the memory transfers it is meant
 * to have: (RECV, COPY) of the memory and of its gradient's arrivals. */
static void test_valid(void **state)
{
	(void)state;
	static const int want[N_VARIANTS][4] = {{1, 0, 1, 0}, {2, 0, 2, 0}, {1, 1, 1, 1}};
	for (int v = 0; v < n_fix; v++) {
		const sp_plan_t *p = &fix[v].plan;
		sp_err_t err = {0};
		if (verify_plan(p, 0, &err))
			fail_msg("valid plan '%s' rejected: %s", fix[v].name, err.msg);
		int got[4] = {count(p, pick_mem_in, INS_RECV), count(p, pick_mem_in, INS_COPY),
			      count(p, pick_grad_in, INS_RECV), count(p, pick_grad_in, INS_COPY)};
		print_message("valid %s: %d devices, %d instructions; memory %d RECV %d COPY, "
			      "its gradient %d RECV %d COPY\n",
			      fix[v].name, p->n_devices, p->n_ins, got[0], got[1], got[2], got[3]);
		for (int q = 0; q < 4 && v < N_VARIANTS; q++)
			assert_int_equal(got[q], want[v][q]);
		assert_true(got[0] + got[1] > 0 && got[2] + got[3] > 0);
	}
}

/* ---- (a) a FWD/BWD of the decoder before its memory arrived ------------------------- */

/* The first FWD/BWD of the decoder on d after k meeting the samples of
 * device d's instruction k (the memory arriving there). */
static int first_reader(const sp_plan_t *p, int d, int k)
{
	const sp_ins_t *in = at(p, d, k);
	int j = find_compute(p, d, -1, in->dst.metaop, -1, in->s0, in->s1, k + 1,
			     p->devices[d].n_ins, 0);
	assert_true(j > k);
	return j;
}

/* The memory's RECV or COPY deleted (a RECV's SEND stays: the reader on d
 * fails before the end-of-run check of unreceived tags). */
static void del_mem_in(breaks_t *b, int d, int k)
{
	int j = first_reader(&b->ref, d, k), c = at(&b->ref, d, k)->dst.metaop;
	plan_edit_delete(break_copy(b), d, k);
	judge(b, "missing memory: ", "device %d instruction %d (%s): missing memory: %s of '%s'", d,
	      j - 1, ins_op_name(at(&b->ref, d, j)->op), ins_op_name(at(&b->ref, d, j)->op),
	      b->ref.metaops[c].name);
}

static void test_memory_deleted(void **state)
{
	(void)state;
	over_variants("memory RECV/COPY deleted", pick_mem_in, del_mem_in, 1);
}

/* The memory's RECV or COPY moved right after its first reader. */
static void late_mem_in(breaks_t *b, int d, int k)
{
	int j = first_reader(&b->ref, d, k), c = at(&b->ref, d, k)->dst.metaop;
	assert_int_equal(plan_edit_move(break_copy(b), d, k, j), 0);
	judge(b, "missing memory: ", "device %d instruction %d (%s): missing memory: %s of '%s'", d,
	      j - 1, ins_op_name(at(&b->ref, d, j)->op), ins_op_name(at(&b->ref, d, j)->op),
	      b->ref.metaops[c].name);
}

static void test_memory_late(void **state)
{
	(void)state;
	over_variants("memory RECV/COPY after its first reader", pick_mem_in, late_mem_in, 1);
}

/* The memory's RECV or COPY one sample short (a RECV with its SEND): the
 * first reader of that sample finds none of its tokens. */
static void short_mem_in(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	int s = in->s1 - 1, c = in->dst.metaop;
	int j = find_compute(&b->ref, d, -1, c, -1, s, s + 1, k + 1, b->ref.devices[d].n_ins, 0);
	assert_true(j > k);
	sp_plan_t *p = break_copy(b);
	plan_edit_at(p, d, k)->s1--;
	if (in->op == INS_RECV) {
		int sd = -1, sk = send_of(p, in, &sd);
		plan_edit_at(p, sd, sk)->s1--;
	}
	judge(b, "missing memory: ", "device %d instruction %d (%s): missing memory: %s of '%s' "
				     "samples [%d, %d) reads act(m, -1), but sample %d has 0 of %lld",
	      d, j, ins_op_name(at(&b->ref, d, j)->op), ins_op_name(at(&b->ref, d, j)->op),
	      b->ref.metaops[c].name, at(&b->ref, d, j)->s0, at(&b->ref, d, j)->s1, s,
	      (long long)b->ref.metaops[c].shape.mem_seq);
}

static void test_memory_short(void **state)
{
	(void)state;
	over_variants("memory RECV/COPY one sample short", pick_mem_in, short_mem_in, 1);
}

/* The memory taken from another value of its producer (its input): at the
 * COPY, or at the SEND of a RECV. */
static void wrong_mem_source(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	int c = in->dst.metaop, pm = producer_of(&b->ref, c), sd = d, sk = k;
	if (in->op == INS_RECV)
		sk = send_of(&b->ref, in, &sd);
	plan_edit_retarget(break_copy(b), sd, sk, 0, act(pm, 0));
	judge(b, "(misdirected)", "device %d instruction %d (%s): missing memory: act(m, -1) of '%s'",
	      sd, sk, ins_op_name(at(&b->ref, sd, sk)->op), b->ref.metaops[c].name);
}

static void test_memory_misdirected(void **state)
{
	(void)state;
	over_variants("memory from another value", pick_mem_in, wrong_mem_source, 1);
}

/* The SEND of a memory RECV saying it sends act(m, -1) of a MetaOp the plan
 * does not have (the reader checks a SEND's source, not its destination;
 * vmem_xfer's bounds check, before it indexes its decoder table with it:
 * tests/fuzz/regressions/plan/send-dst-metaop-out-of-range): one past the
 * last, far past, and negative. */
static void send_dst_out_of_range(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	if (in->op != INS_RECV)
		return;
	int sd = d, sk = send_of(&b->ref, in, &sd);
	const int bad[] = {b->ref.n_metaops, b->ref.n_metaops + 1000, -2};
	for (size_t q = 0; q < sizeof bad / sizeof *bad; q++) {
		plan_edit_retarget(break_copy(b), sd, sk, 1, act(bad[q], -1));
		judge(b, "not one of the plan's",
		      "device %d instruction %d (%s): its destination names MetaOp %d, not one of "
		      "the plan's %d",
		      sd, sk, ins_op_name(INS_SEND), bad[q], b->ref.n_metaops);
	}
}

static void test_memory_send_dst_out_of_range(void **state)
{
	(void)state;
	int before = total_made;
	/* a plan whose memory arrives only by COPY has no site */
	over_variants("memory SEND's destination past the MetaOps", pick_mem_in,
		      send_dst_out_of_range, 0);
	assert_true(total_made - before >= 3 * 3); /* "two", "three": 1 and 2 RECVs */
}

/* ---- (b) its gradient returned before a BWD that adds to it ------------------------- */

/* The SEND or COPY of grad(c, -1) moved before the last BWD of c on its
 * device that adds to its samples. */
static void early_grad_out(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	int c = in->src.metaop;
	int j = find_compute(&b->ref, d, INS_BWD, c, -1, in->s0, in->s1, 0, k, 1);
	assert_true(j >= 0);
	assert_int_equal(plan_edit_move(break_copy(b), d, k, j), 0);
	judge(b, "memory gradient sent early", "device %d instruction %d (%s): memory gradient sent "
					       "early: sample %d of grad(m, -1) of '%s'",
	      d, j, ins_op_name(in->op), SP_MAX(in->s0, at(&b->ref, d, j)->s0),
	      b->ref.metaops[c].name);
}

static void test_grad_early(void **state)
{
	(void)state;
	over_variants("memory gradient SEND/COPY before a BWD", pick_grad_out, early_grad_out, 1);
}

/* ---- (c) its gradient never returned --------------------------------------------------- */

/* Where deleting device d's grad_out k leaves a BWD's contribution
 * unreturned: the first BWD of c on d (its position) with a sample
 * (*sample) that no other grad_out of d returns; -1 when all are. */
static int unreturned(const sp_plan_t *p, int d, int k, int *sample)
{
	const sp_ins_t *out = at(p, d, k);
	int c = out->src.metaop;
	for (int j = 0; j < p->devices[d].n_ins; j++) {
		const sp_ins_t *bw = at(p, d, j);
		if (bw->op != INS_BWD || p->slices[bw->slice].metaop != c)
			continue;
		for (int s = SP_MAX(bw->s0, out->s0); s < SP_MIN(bw->s1, out->s1); s++) {
			int other = 0;
			for (int q = 0; q < p->devices[d].n_ins && !other; q++) {
				const sp_ins_t *o = at(p, d, q);
				other = q != k && grad_out(o) && o->src.metaop == c && o->s0 <= s &&
					s < o->s1;
			}
			if (!other) {
				*sample = s;
				return j;
			}
		}
	}
	return -1;
}

/* The first BWD of the producer's last slice on device q meeting the
 * samples of grad_out `out` (whose copy or receipt is deleted before it
 * when the caller subtracts one). */
static int producer_bwd_of(const sp_plan_t *p, const sp_ins_t *out, int q)
{
	int pm = producer_of(p, out->src.metaop);
	int j = find_compute(p, q, INS_BWD, pm, p->metaops[pm].n_layers, out->s0, out->s1, 0,
			     p->devices[q].n_ins, 0);
	assert_true(j >= 0);
	return j;
}

/* b[0]: the SEND or COPY deleted; b[1]: a SEND deleted with its RECV.
 * Where another of the device's SENDs returns the same samples (to
 * another member of a tensor-parallel producer) the static rule cannot
 * see it: that member's RECV waits for ever (b[0], a deadlock) or its BWD
 * runs short (a COPY, or b[1]: rule (d)). */
static void del_grad_out(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	int s = -1, j = unreturned(&b->ref, d, k, &s);
	assert_true(j < k);
	for (int both = 0; both < 1 + (in->op == INS_SEND); both++) {
		sp_plan_t *p = break_copy(&b[both]);
		if (both) {
			int rd = -1, rk = plan_edit_find_tag(p, INS_RECV, in->tag, &rd);
			assert_true(rk >= 0);
			plan_edit_delete(p, rd, rk);
		}
		plan_edit_delete(p, d, k);
		if (j < 0 && in->op == INS_SEND && !both) {
			b[both].loose++;
			judge(&b[both], "deadlock", "waits for tag %d from device %d, which never sends it",
			      in->tag, d);
			continue;
		}
		if (j < 0) {
			b[both].loose++;
			judge(&b[both], "missing memory gradient",
			      "device %d instruction %d (bwd): missing memory gradient: backward of '%s'",
			      in->op == INS_SEND ? in->peer : d,
			      producer_bwd_of(&b->ref, in, in->op == INS_SEND ? in->peer : d) - 1,
			      b->ref.metaops[producer_of(&b->ref, in->src.metaop)].name);
			continue;
		}
		const sp_ins_t *bw = at(&b->ref, d, j);
		judge(&b[both], "memory gradient never sent",
		      "device %d instruction %d (bwd): memory gradient never sent: this backward adds "
		      "layers [%d, %d) of '%s' to grad(m, -1) of samples [%d, %d), and no later send "
		      "or copy returns sample %d",
		      d, j, b->ref.slices[bw->slice].layer_from, b->ref.slices[bw->slice].layer_to,
		      b->ref.metaops[in->src.metaop].name, bw->s0, bw->s1, s);
	}
}

static void test_grad_never_sent(void **state)
{
	(void)state;
	for (int v = 0; v < n_fix; v++) {
		breaks_t b[2];
		breaks_begin(&b[0], "memory gradient SEND/COPY deleted", &fix[v]);
		breaks_begin(&b[1], "memory gradient SEND deleted with its RECV", &fix[v]);
		each_site(b, pick_grad_out, del_grad_out);
		breaks_end(&b[0], 1);
		breaks_end(&b[1], count(&b[1].ref, pick_grad_out, INS_SEND));
	}
}

/* ---- (d) the producer's BWD before every contribution arrived ---------------------- */

/* The first BWD of the producer's last slice on d after k meeting the
 * samples of the gradient arriving at k. */
static int producer_bwd(const sp_plan_t *p, int d, int k, int *pm)
{
	const sp_ins_t *in = at(p, d, k);
	int sd = d, sk = k;
	if (in->op == INS_RECV)
		sk = send_of(p, in, &sd);
	*pm = producer_of(p, at(p, sd, sk)->src.metaop);
	int j = find_compute(p, d, INS_BWD, *pm, p->metaops[*pm].n_layers, in->s0, in->s1, k + 1,
			     p->devices[d].n_ins, 0);
	assert_true(j > k);
	return j;
}

/* b[0]: the arrival moved right after the producer's BWD; b[1]: a RECV
 * deleted (a COPY deleted is rule (c)'s). */
static void late_grad_in(breaks_t *b, int d, int k)
{
	int pm = -1, j = producer_bwd(&b->ref, d, k, &pm);
	for (int del = 0; del < 1 + (at(&b->ref, d, k)->op == INS_RECV); del++) {
		sp_plan_t *p = break_copy(&b[del]);
		if (del)
			plan_edit_delete(p, d, k);
		else
			assert_int_equal(plan_edit_move(p, d, k, j), 0);
		judge(&b[del], "missing memory gradient",
		      "device %d instruction %d (bwd): missing memory gradient: backward of '%s' "
		      "samples [%d, %d) before every contribution",
		      d, j - 1, b->ref.metaops[pm].name, at(&b->ref, d, j)->s0,
		      at(&b->ref, d, j)->s1);
	}
}

static void test_grad_late(void **state)
{
	(void)state;
	for (int v = 0; v < n_fix; v++) {
		breaks_t b[2];
		breaks_begin(&b[0], "memory gradient RECV/COPY after the producer's BWD", &fix[v]);
		breaks_begin(&b[1], "memory gradient RECV deleted", &fix[v]);
		each_site(b, pick_grad_in, late_grad_in);
		breaks_end(&b[0], 1);
		breaks_end(&b[1], count(&b[1].ref, pick_grad_in, INS_RECV));
	}
}

/* The same contribution arriving twice: a COPY repeated, or a SEND and
 * its RECV repeated under a tag of their own. */
static void twice_grad_in(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = at(&b->ref, d, k);
	sp_plan_t *p = break_copy(b);
	sp_ins_t again = *in;
	if (in->op == INS_RECV) {
		int tag = 0, sd = -1, sk = send_of(&b->ref, in, &sd);
		for (int q = 0; q < p->n_ins; q++)
			tag = SP_MAX(tag, p->ins[q].tag + 1);
		sp_ins_t send = *at(p, sd, sk);
		send.tag = again.tag = tag;
		assert_int_equal(plan_edit_insert(p, sd, sk + 1, send), 0);
	}
	assert_int_equal(plan_edit_insert(p, d, k + 1, again), 0);
	judge(b, "(added twice)", "device %d instruction", d);
}

static void test_grad_twice(void **state)
{
	(void)state;
	over_variants("memory gradient arriving twice", pick_grad_in, twice_grad_in, 1);
}

/* The arrival written into another value of the producer. */
static void wrong_grad_target(breaks_t *b, int d, int k)
{
	int pm = -1;
	producer_bwd(&b->ref, d, k, &pm);
	plan_edit_retarget(break_copy(b), d, k, 1, grad(pm, b->ref.metaops[pm].n_layers - 1));
	judge(b, "(misdirected)", "device %d instruction %d (%s): missing memory gradient: grad(m, -1)",
	      d, k, ins_op_name(at(&b->ref, d, k)->op));
}

static void test_grad_misdirected(void **state)
{
	(void)state;
	over_variants("memory gradient into another value", pick_grad_in, wrong_grad_target, 1);
}

/* ---- whole plans ------------------------------------------------------------------------- */

/* A decoder slice split for tensor parallelism: decoders never are. */
static void test_decoder_split(void **state)
{
	(void)state;
	for (int v = 0; v < n_fix; v++) {
		breaks_t b;
		breaks_begin(&b, "decoder slices split", &fix[v]);
		for (int i = 0; i < b.ref.n_slices; i++) {
			if (b.ref.metaops[b.ref.slices[i].metaop].shape.mem_seq == 0)
				continue;
			break_copy(&b)->slices[i].tp = 2;
			judge(&b, "tensor parallelism", "slice %d of decoder '%s' is split 2 ways", i,
			      b.ref.metaops[b.ref.slices[i].metaop].name);
		}
		breaks_end(&b, 1);
	}
}

/* Every single deleted instruction but a STEP is rejected (any message). */
static void test_every_deletion(void **state)
{
	(void)state;
	for (int v = 0; v < n_fix; v++) {
		breaks_t b;
		breaks_begin(&b, "every deletion but STEP", &fix[v]);
		for (int d = 0; d < b.ref.n_devices; d++)
			for (int k = 0; k < b.ref.devices[d].n_ins; k++) {
				if (at(&b.ref, d, k)->op == INS_STEP)
					continue;
				plan_edit_delete(break_copy(&b), d, k);
				judge(&b, "", "%s", "");
			}
		breaks_end(&b, b.ref.n_ins - b.ref.n_devices);
	}
}

/* Every plan input of tests/fuzz/regressions/plan/ (made by
 * tests/fuzz/make-regressions) is in the current format version, so it
 * gets past the reader, and the verifier refuses it with the message of
 * the check it was made for; every file there is listed here. */
static void test_fuzz_regressions(void **state)
{
	(void)state;
	static const struct {
		const char *file, *msg;
	} reg[] = {
		{"send-dst-metaop-out-of-range", "(send): its destination names MetaOp "},
	};
	const size_t n_reg = sizeof reg / sizeof *reg;
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/tests/fuzz/regressions/plan", root_dir());
	DIR *dh = opendir(dir);
	assert_non_null(dh);
	int files = 0;
	for (struct dirent *e; (e = readdir(dh));) {
		if (e->d_name[0] == '.')
			continue;
		files++;
		size_t i = 0;
		while (i < n_reg && strcmp(reg[i].file, e->d_name))
			i++;
		if (i == n_reg)
			fail_msg("%s/%s: not listed in test_fuzz_regressions", dir, e->d_name);
		char path[8192];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		sp_plan_t p;
		sp_err_t err = {0};
		if (plan_read(&p, path, &err))
			fail_msg("%s: %s (re-make it: tests/fuzz/make-regressions)", path, err.msg);
		memset(&err, 0, sizeof err);
		int rc = verify_plan(&p, 0, &err);
		print_message("%s: %s\n", e->d_name, err.msg);
		if (rc != SP_EINTERNAL || !strstr(err.msg, reg[i].msg))
			fail_msg("%s: verifier rc %d '%s', expected '%s'", path, rc, err.msg, reg[i].msg);
		plan_release(&p);
	}
	closedir(dh);
	assert_int_equal(files, (int)n_reg);
}

static void test_summary(void **state)
{
	(void)state;
	print_message("%d/%d breaks rejected\n", total_rejected, total_made);
	assert_int_equal(total_rejected, total_made);
	assert_true(total_made > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_memory_deleted),
		cmocka_unit_test(test_memory_late),
		cmocka_unit_test(test_memory_short),
		cmocka_unit_test(test_memory_misdirected),
		cmocka_unit_test(test_memory_send_dst_out_of_range),
		cmocka_unit_test(test_grad_early),
		cmocka_unit_test(test_grad_never_sent),
		cmocka_unit_test(test_grad_late),
		cmocka_unit_test(test_grad_twice),
		cmocka_unit_test(test_grad_misdirected),
		cmocka_unit_test(test_decoder_split),
		cmocka_unit_test(test_every_deletion),
		cmocka_unit_test(test_fuzz_regressions),
		cmocka_unit_test(test_summary),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
