/*
 * test_plan_io.c — plan.bin writer and reader: a small complete plan built
 * by hand (its model parsed from JSON, so it is what the loader makes) must
 * round-trip byte for byte; every truncation, every corrupted bit and every
 * wrong index must be rejected with a message and an empty plan, never a
 * crash; the atomic writer must leave nothing behind on failure. It does not
 * test the planner or the runtime.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "plan.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL_HEAD \
	"{\"format\": \"spindle.model/1\", \"name\": \"mini-2\", \"dtype\": \"bf16\",\n" \
	" \"optimizer\": \"adamw\", \"seed\": 7,\n" \
	" \"components\": {\n" \
	"  \"tok\": {\"type\": \"embedding\", \"vocab\": 64, \"hidden\": 16,\n" \
	"          \"max_seq\": 8},\n" \
	"  \"img_in\": {\"type\": \"patch\", \"in\": 12, \"hidden\": 16,\n" \
	"             \"max_seq\": 6},\n" \
	"  \"body\": {\"type\": \"transformer\", \"layers\": 4, \"hidden\": 16,\n" \
	"           \"heads\": 2, \"ffn\": 32, \"causal\": true},\n" \
	"  \"head\": {\"type\": \"lm_head\", \"hidden\": 16, \"vocab\": 64},\n" \
	"  \"align\": {\"type\": \"contrastive\", \"temperature\": 0.07}"
#define MODEL_TASKS \
	"},\n" \
	" \"tasks\": [\n" \
	"  {\"name\": \"lm\", \"batch\": 8, \"graph\": [\n" \
	"    {\"id\": \"t_in\", \"component\": \"tok\", \"seq\": 8},\n" \
	"    {\"id\": \"t\", \"component\": \"body\", \"seq\": 8,\n" \
	"     \"inputs\": [\"t_in\"]},\n" \
	"    {\"id\": \"loss\", \"component\": \"head\", \"inputs\": [\"t\"]}]},\n" \
	"  {\"name\": \"clip\", \"batch\": 4, \"weight\": 0.5, \"graph\": [\n" \
	"    {\"id\": \"i_in\", \"component\": \"img_in\", \"seq\": 6},\n" \
	"    {\"id\": \"i\", \"component\": \"body\", \"seq\": 6, \"layers\": [0, 2],\n" \
	"     \"inputs\": [\"i_in\"]},\n" \
	"    {\"id\": \"c_in\", \"component\": \"tok\", \"seq\": 5},\n" \
	"    {\"id\": \"c\", \"component\": \"body\", \"seq\": 5,\n" \
	"     \"inputs\": [\"c_in\"]},\n" \
	"    {\"id\": \"loss\", \"component\": \"align\",\n" \
	"     \"inputs\": [\"i\", \"c\"]}]}"

static const char MODEL_JSON[] = MODEL_HEAD MODEL_TASKS "]}\n";

/*
 * The mini model and a third task, "wide", whose nodes each keep their
 * saved activations within the 2^60-byte limit while their sum passes it at
 * batch 2^22: two linear nodes of 2^17 x 2^17 x 2^22 x 8 = 2^59 bytes each,
 * with fewer FLOPs than bytes (out = 1). WIDE_BATCH is 1 or 4194304.
 */
#define WIDE_MODEL_JSON(WIDE_BATCH) \
	MODEL_HEAD ",\n" \
	"  \"ids\": {\"type\": \"embedding\", \"vocab\": 64, \"hidden\": 131072,\n" \
	"          \"max_seq\": 131072},\n" \
	"  \"proj\": {\"type\": \"linear\", \"in\": 131072, \"out\": 1},\n" \
	"  \"score\": {\"type\": \"classifier\", \"hidden\": 1, \"classes\": 2}" \
	MODEL_TASKS ",\n" \
	"  {\"name\": \"wide\", \"batch\": " #WIDE_BATCH ", \"graph\": [\n" \
	"    {\"id\": \"x\", \"component\": \"ids\", \"seq\": 131072},\n" \
	"    {\"id\": \"p\", \"component\": \"proj\", \"seq\": 131072,\n" \
	"     \"inputs\": [\"x\"]},\n" \
	"    {\"id\": \"q\", \"component\": \"proj\", \"seq\": 131072,\n" \
	"     \"inputs\": [\"x\"]},\n" \
	"    {\"id\": \"p_loss\", \"component\": \"score\", \"inputs\": [\"p\"]},\n" \
	"    {\"id\": \"q_loss\", \"component\": \"score\", \"inputs\": [\"q\"]}]}]}\n"

/*
 * An encoder-decoder (issue #20): the image encoder's output, projected to
 * width 12 by "mem", is the memory every layer of the decoder "dec" attends
 * to (memory_width 12, not its hidden 16).
 */
static const char XATTN_JSON[] =
	"{\"format\": \"spindle.model/1\", \"name\": \"xattn-mini\", \"dtype\": \"bf16\",\n"
	" \"optimizer\": \"adamw\", \"seed\": 7,\n"
	" \"components\": {\n"
	"  \"tok\": {\"type\": \"embedding\", \"vocab\": 64, \"hidden\": 16, \"max_seq\": 8},\n"
	"  \"img_in\": {\"type\": \"patch\", \"in\": 12, \"hidden\": 16, \"max_seq\": 6},\n"
	"  \"enc\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 16,\n"
	"          \"heads\": 2, \"ffn\": 32},\n"
	"  \"proj\": {\"type\": \"linear\", \"in\": 16, \"out\": 12},\n"
	"  \"dec\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 16,\n"
	"          \"heads\": 2, \"ffn\": 32, \"causal\": true,\n"
	"          \"cross_attention\": true, \"memory_width\": 12},\n"
	"  \"head\": {\"type\": \"lm_head\", \"hidden\": 16, \"vocab\": 64}},\n"
	" \"tasks\": [\n"
	"  {\"name\": \"cap\", \"batch\": 4, \"graph\": [\n"
	"    {\"id\": \"i_in\", \"component\": \"img_in\", \"seq\": 6},\n"
	"    {\"id\": \"enc\", \"component\": \"enc\", \"seq\": 6, \"inputs\": [\"i_in\"]},\n"
	"    {\"id\": \"mem\", \"component\": \"proj\", \"seq\": 6, \"inputs\": [\"enc\"]},\n"
	"    {\"id\": \"d_in\", \"component\": \"tok\", \"seq\": 5},\n"
	"    {\"id\": \"dec\", \"component\": \"dec\", \"seq\": 5, \"inputs\": [\"d_in\"],\n"
	"     \"memory\": \"mem\"},\n"
	"    {\"id\": \"loss\", \"component\": \"head\", \"inputs\": [\"dec\"]}]}]}\n";

/* component indices, in the JSON's order */
enum { C_TOK, C_IMG, C_BODY, C_HEAD, C_ALIGN };

#define NEW(p, n) ((p) = calloc((size_t)(n), sizeof *(p)), assert_non_null(p))

static void metaop(sp_plan_t *p, int i, int task, int node, int n_layers, int first_op,
		   int seq_in, int w_in, int seq_out, int w_out, const char *name)
{
	sp_metaop_t *m = &p->metaops[i];
	const sp_task_t *t = &p->model.tasks[task];
	m->task = task;
	m->shape = op_shape(&p->model, t, &t->nodes[node]);
	m->n_layers = n_layers;
	m->first_op = first_op;
	m->seq_in = seq_in;
	m->width_in = w_in;
	m->seq_out = seq_out;
	m->width_out = w_out;
	m->fwd_ms = 0.125 * (i + 1);
	m->bwd_ms = 0.2 * (i + 1);
	m->profiled = i % 2;
	snprintf(m->name, sizeof m->name, "%s", name);
	for (int k = 0; k < n_layers; k++) {
		p->ops[first_op + k].node = node;
		p->ops[first_op + k].layer = t->nodes[node].layer_from + k;
	}
}

static void slice(sp_plan_t *p, int i, int wave, int m, int from, int to, int n_dev,
		  int dev_off)
{
	sp_slice_t *s = &p->slices[i];
	s->wave = wave;
	s->metaop = m;
	s->layer_from = from;
	s->layer_to = to;
	s->n_dev = n_dev;
	s->dev_off = dev_off;
	s->start_ms = 0.5 * wave;
	s->fwd_ms = 0.1 + i;
	s->bwd_start_ms = 10.0 - wave;
	s->bwd_ms = 0.3 * i;
	s->tp = 1;
}

static sp_ins_t ins(int op, int slice, int s0, int s1)
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

static sp_vref_t vref(int m, int layer, int grad, int seq_off)
{
	sp_vref_t v = {m, layer, grad, seq_off};
	return v;
}

/* Compute instructions name the values their slice implies. */
static void compute_vrefs(sp_plan_t *p)
{
	for (int k = 0; k < p->n_ins; k++) {
		sp_ins_t *c = &p->ins[k];
		if (c->op != INS_FWD && c->op != INS_BWD && c->op != INS_LOSS)
			continue;
		const sp_slice_t *sl = &p->slices[c->slice];
		int m = sl->metaop, a = sl->layer_from, b = sl->layer_to;
		c->src = c->op == INS_FWD ? vref(m, a, 0, 0)
			 : c->op == INS_BWD ? vref(m, b, 1, 0) : vref(m, 0, 0, 0);
		c->dst = c->op == INS_FWD ? vref(m, b, 0, 0)
			 : c->op == INS_BWD ? vref(m, a, 1, 0) : vref(m, 0, 1, 0);
	}
}

/*
 * Two tasks on one node of two GPUs. Task "lm": t_in -> t -> loss;
 * task "clip": i_in -> i (body layers 0-2), c_in -> c, (i, c) -> loss.
 * Eight MetaOps, five waves, nine slices, three buckets, 18 instructions.
 */
static void make_plan(sp_plan_t *p, const char *model_json)
{
	sp_err_t err;
	memset(p, 0, sizeof *p);
	memset(&err, 0, sizeof err);
	int rc = model_parse(&p->model, model_json, strlen(model_json), "model.json",
			     &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	snprintf(p->planner_version, sizeof p->planner_version, "0.1.0");
	snprintf(p->algo, sizeof p->algo, "spindle");
	snprintf(p->options, sizeof p->options, "--algo spindle --mem-reserve 1");
	p->model_hash = p->model.hash;
	p->cluster_hash = 0x0123456789abcdefULL;
	snprintf(p->cluster_name, sizeof p->cluster_name, "mini");
	snprintf(p->gpu_name, sizeof p->gpu_name, "Test GPU 16GB");
	p->nodes = 1;
	p->gpus_per_node = 2;
	p->memory_gib = 16;
	p->mem_reserve_gib = 1.5;
	p->microbatches = 2;
	p->model.tasks[0].microbatches = 1; /* per task: 'lm' 1, 'clip' 2 (0: K) */

	p->n_metaops = 8;
	p->n_ops = 15;
	NEW(p->metaops, p->n_metaops);
	NEW(p->ops, p->n_ops);
	metaop(p, 0, 0, 0, 1, 0, 8, 0, 8, 16, "lm/t_in");
	metaop(p, 1, 0, 1, 4, 1, 8, 16, 8, 16, "lm/t");
	metaop(p, 2, 0, 2, 1, 5, 8, 16, 0, 0, "lm/loss");
	metaop(p, 3, 1, 0, 1, 6, 6, 0, 6, 16, "clip/i_in");
	metaop(p, 4, 1, 1, 2, 7, 6, 16, 6, 16, "clip/i");
	metaop(p, 5, 1, 2, 1, 9, 5, 0, 5, 16, "clip/c_in");
	metaop(p, 6, 1, 3, 4, 10, 5, 16, 5, 16, "clip/c");
	/* a contrastive loss reads one token per input (graph.c, metaop_io) */
	metaop(p, 7, 1, 4, 1, 14, 2, 16, 0, 0, "clip/loss");

	static const sp_edge_t edges[] = {{0, 1, 0, 8, 0}, {1, 2, 0, 8, 0},
					  {3, 4, 0, 6, 0}, {5, 6, 0, 5, 0},
					  {4, 7, 0, 1, 0}, {6, 7, 1, 1, 0}};
	p->n_edges = SP_ARRAY_LEN(edges);
	NEW(p->edges, p->n_edges);
	memcpy(p->edges, edges, sizeof edges);

	p->n_waves = 5;
	NEW(p->waves, p->n_waves);
	static const int wave_first[] = {0, 2, 4, 6, 8}, wave_n[] = {2, 2, 2, 2, 1};
	for (int w = 0; w < p->n_waves; w++) {
		p->waves[w].start_ms = 1.5 * w;
		p->waves[w].dur_ms = 1.25;
		p->waves[w].bwd_start_ms = 20 - 2.5 * w;
		p->waves[w].bwd_dur_ms = 2.5;
		p->waves[w].first_slice = wave_first[w];
		p->waves[w].n_slices = wave_n[w];
	}
	static const int32_t sdevs[] = {0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1};
	p->n_slice_devs = SP_ARRAY_LEN(sdevs);
	NEW(p->slice_devs, p->n_slice_devs);
	memcpy(p->slice_devs, sdevs, sizeof sdevs);
	p->n_slices = 9;
	NEW(p->slices, p->n_slices);
	slice(p, 0, 0, 0, 0, 1, 1, 0);
	slice(p, 1, 0, 3, 0, 1, 1, 1);
	slice(p, 2, 1, 1, 0, 2, 1, 2);
	slice(p, 3, 1, 4, 0, 2, 1, 3);
	slice(p, 4, 2, 1, 2, 4, 1, 4);
	slice(p, 5, 2, 5, 0, 1, 1, 5);
	slice(p, 6, 3, 2, 0, 1, 1, 6);
	slice(p, 7, 3, 6, 0, 4, 2, 7);
	slice(p, 8, 4, 7, 0, 1, 2, 9);
	p->slices[7].tp = 2; /* clip/c: the body (2 heads, ffn 32) split 2 ways */

	static const int32_t bdevs[] = {0, 1, 1, 0};
	static const sp_param_t bparams[] = {{C_BODY, 0, 1, 0}, {C_BODY, 1, 1, 0}, {C_BODY, 2, 1, 0},
					     {C_BODY, 3, 1, 0}, {C_IMG, 0, 1, 0},  {C_TOK, 0, 1, 0},
					     {C_HEAD, 0, 1, 0}};
	static const sp_bucket_t buckets[] = {{2, 0, 4, 0, 4 * 2416, 0.75, LAYOUT_ZERO1, 0.5, 0, 0},
					      {1, 2, 1, 4, 304, 0.01, LAYOUT_REPLICATED, 0, 0, 0},
					      {1, 3, 2, 5, 1152 + 1056, 0.02, LAYOUT_REPLICATED, 0, 0, 0}};
	p->n_bucket_devs = SP_ARRAY_LEN(bdevs);
	p->n_bucket_params = SP_ARRAY_LEN(bparams);
	p->n_buckets = SP_ARRAY_LEN(buckets);
	NEW(p->bucket_devs, p->n_bucket_devs);
	NEW(p->bucket_params, p->n_bucket_params);
	NEW(p->buckets, p->n_buckets);
	memcpy(p->bucket_devs, bdevs, sizeof bdevs);
	memcpy(p->bucket_params, bparams, sizeof bparams);
	memcpy(p->buckets, buckets, sizeof buckets);

	/* shards round-trip (whether they match the slices is the verifier's
	 * question, not the reader's) */
	static const sp_param_t held[] = {{C_TOK, 0, 1, 0}, {C_BODY, 0, 2, 0}, {C_BODY, 1, 2, 0},
					  {C_BODY, 2, 2, 0}, {C_BODY, 3, 2, 0}, {C_HEAD, 0, 1, 0},
					  {C_IMG, 0, 1, 0}, {C_BODY, 0, 2, 1}, {C_BODY, 1, 2, 1},
					  {C_BODY, 2, 2, 1}, {C_BODY, 3, 2, 1}, {C_TOK, 0, 1, 0}};
	p->n_held = SP_ARRAY_LEN(held);
	NEW(p->held, p->n_held);
	memcpy(p->held, held, sizeof held);

	p->n_ins = 18;
	NEW(p->ins, p->n_ins);
	sp_ins_t *in = p->ins;
	/* device 0 */
	in[0] = ins(INS_FWD, 0, 0, 8);
	in[1] = ins(INS_FWD, 2, 0, 8);
	in[2] = ins(INS_FWD, 4, 0, 8);
	in[3] = ins(INS_LOSS, 6, 0, 8);
	in[4] = ins(INS_RECV, -1, 0, 2);
	in[4].peer = 1;
	in[4].tag = 1;
	in[4].seq_len = 1;
	in[4].dst = vref(7, 0, 0, 0);
	in[5] = ins(INS_LOSS, 8, 0, 2);
	in[6] = ins(INS_BWD, 4, 0, 8);
	in[7] = ins(INS_COPY, -1, 0, 2);
	in[7].seq_len = 1;
	in[7].src = vref(6, 4, 0, 0);
	in[7].dst = vref(7, 0, 0, 1);
	in[8] = ins(INS_SYNC, -1, 0, 0);
	in[8].peer = 0;
	in[9] = ins(INS_STEP, -1, 0, 0);
	/* device 1 */
	in[10] = ins(INS_FWD, 1, 0, 4);
	in[11] = ins(INS_FWD, 3, 0, 4);
	in[12] = ins(INS_SEND, -1, 0, 2);
	in[12].peer = 0;
	in[12].tag = 1;
	in[12].seq_len = 1;
	in[12].src = vref(4, 2, 0, 0);
	in[13] = ins(INS_FWD, 5, 0, 4);
	in[14] = ins(INS_BWD, 3, 0, 4);
	in[15] = ins(INS_SYNC, -1, 0, 0);
	in[15].peer = 0;
	in[16] = ins(INS_SYNC, -1, 0, 0);
	in[16].peer = 1;
	in[17] = ins(INS_STEP, -1, 0, 0);
	compute_vrefs(p);

	p->n_devices = 2;
	NEW(p->devices, p->n_devices);
	for (int d = 0; d < 2; d++) {
		sp_device_t *x = &p->devices[d];
		x->node = 0;
		x->local = d;
		x->first_ins = d ? 10 : 0;
		x->n_ins = d ? 8 : 10;
		x->held_off = d ? 6 : 0;
		x->n_held = 6;
		for (int k = 0; k < MEM__COUNT; k++)
			x->mem[k] = (int64_t)1000 * (k + 1) + d;
		x->mem_peak = 123456789012LL + d;
		x->busy_ms = 7.5 + d;
		x->comm_ms = 0.25;
		x->idle_ms = 1.0 / 3.0;
		x->finish_ms = 9.75;
	}

	p->cert = (sp_cert_t){
		.iteration_ms = 12.5, .compute_ms = 10.25, .transfer_ms = 0.5,
		.sync_ms = 1.125, .step_ms = 0.625, .area_bound_ms = 8.0,
		.cp_bound_ms = 7.5, .paper_bound_ms = 9.0, .lower_bound_ms = 8.0,
		.gap = 10.25 / 8.0 - 1, .xnode_bytes = 0, .naive_xnode_bytes = 4096,
		.xfer_pred_ms = 0.1, .naive_xfer_pred_ms = 0.7};
	p->n_algos = 2;
	NEW(p->algos, p->n_algos);
	p->algos[0] = (sp_algo_result_t){"spindle", 12.5, 10.25, 3.5, 0.8125, 1};
	p->algos[1] = (sp_algo_result_t){"sequential", 20.0, 18.5, 0.1, 0.45, 0};
}

/*
 * The encoder-decoder on two GPUs. Device 0: i_in, enc, mem (the memory's
 * producer, MetaOp 2); device 1: d_in, dec (the decoder, MetaOp 4, memory
 * 6 tokens x 12), loss. Device 1 receives act(dec, -1) before its first
 * FWD of dec and sends grad(dec, -1) back after its BWD, into grad(mem, 1).
 * Six MetaOps, edge 3 the memory edge, five waves, six slices, 17
 * instructions (3 and 14 send, 4 and 10 receive).
 */
enum { XM_MEM = 2, XM_DEC = 4 };

static void make_xattn_plan(sp_plan_t *p)
{
	sp_err_t err;
	memset(p, 0, sizeof *p);
	memset(&err, 0, sizeof err);
	int rc = model_parse(&p->model, XATTN_JSON, strlen(XATTN_JSON), "xattn.json", &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	snprintf(p->planner_version, sizeof p->planner_version, "0.1.0");
	snprintf(p->algo, sizeof p->algo, "sequential");
	snprintf(p->options, sizeof p->options, "--algo sequential");
	p->model_hash = p->model.hash;
	p->cluster_hash = 0x0123456789abcdefULL;
	snprintf(p->cluster_name, sizeof p->cluster_name, "mini");
	snprintf(p->gpu_name, sizeof p->gpu_name, "Test GPU 16GB");
	p->nodes = 1;
	p->gpus_per_node = 2;
	p->memory_gib = 16;
	p->mem_reserve_gib = 1;
	p->microbatches = 1;

	p->n_metaops = 6;
	p->n_ops = 8;
	NEW(p->metaops, p->n_metaops);
	NEW(p->ops, p->n_ops);
	metaop(p, 0, 0, 0, 1, 0, 6, 0, 6, 16, "cap/i_in");
	metaop(p, 1, 0, 1, 2, 1, 6, 16, 6, 16, "cap/enc");
	metaop(p, 2, 0, 2, 1, 3, 6, 16, 6, 12, "cap/mem");
	metaop(p, 3, 0, 3, 1, 4, 5, 0, 5, 16, "cap/d_in");
	metaop(p, 4, 0, 4, 2, 5, 5, 16, 5, 16, "cap/dec");
	metaop(p, 5, 0, 5, 1, 7, 5, 16, 0, 0, "cap/loss");

	static const sp_edge_t edges[] = {{0, 1, 0, 6, 0}, {1, 2, 0, 6, 0}, {3, 4, 0, 5, 0},
					  {XM_MEM, XM_DEC, 0, 6, 1}, {4, 5, 0, 5, 0}};
	p->n_edges = SP_ARRAY_LEN(edges);
	NEW(p->edges, p->n_edges);
	memcpy(p->edges, edges, sizeof edges);

	p->n_waves = 5;
	NEW(p->waves, p->n_waves);
	static const int wave_first[] = {0, 2, 3, 4, 5}, wave_n[] = {2, 1, 1, 1, 1};
	for (int w = 0; w < p->n_waves; w++) {
		p->waves[w].start_ms = 1.5 * w;
		p->waves[w].dur_ms = 1.25;
		p->waves[w].bwd_start_ms = 20 - 2.5 * w;
		p->waves[w].bwd_dur_ms = 2.5;
		p->waves[w].first_slice = wave_first[w];
		p->waves[w].n_slices = wave_n[w];
	}
	static const int32_t sdevs[] = {0, 1, 0, 0, 1, 1};
	p->n_slice_devs = SP_ARRAY_LEN(sdevs);
	NEW(p->slice_devs, p->n_slice_devs);
	memcpy(p->slice_devs, sdevs, sizeof sdevs);
	p->n_slices = 6;
	NEW(p->slices, p->n_slices);
	slice(p, 0, 0, 0, 0, 1, 1, 0);
	slice(p, 1, 0, 3, 0, 1, 1, 1);
	slice(p, 2, 1, 1, 0, 2, 1, 2);
	slice(p, 3, 2, 2, 0, 1, 1, 3);
	slice(p, 4, 3, 4, 0, 2, 1, 4);
	slice(p, 5, 4, 5, 0, 1, 1, 5);

	p->n_ins = 17;
	NEW(p->ins, p->n_ins);
	sp_ins_t *in = p->ins;
	/* device 0: the encoder and the memory's producer */
	in[0] = ins(INS_FWD, 0, 0, 4);
	in[1] = ins(INS_FWD, 2, 0, 4);
	in[2] = ins(INS_FWD, 3, 0, 4);
	in[3] = ins(INS_SEND, -1, 0, 4); /* act(mem, 1) -> act(dec, -1) */
	in[3].src = vref(XM_MEM, 1, 0, 0);
	in[4] = ins(INS_RECV, -1, 0, 4); /* grad(dec, -1) -> grad(mem, 1), added */
	in[4].dst = vref(XM_MEM, 1, 1, 0);
	in[5] = ins(INS_BWD, 3, 0, 4);
	in[6] = ins(INS_BWD, 2, 0, 4);
	in[7] = ins(INS_BWD, 0, 0, 4);
	in[8] = ins(INS_STEP, -1, 0, 0);
	/* device 1: the decoder */
	in[9] = ins(INS_FWD, 1, 0, 4);
	in[10] = ins(INS_RECV, -1, 0, 4);
	in[10].dst = vref(XM_DEC, -1, 0, 0);
	in[11] = ins(INS_FWD, 4, 0, 4);
	in[12] = ins(INS_LOSS, 5, 0, 4);
	in[13] = ins(INS_BWD, 4, 0, 4);
	in[14] = ins(INS_SEND, -1, 0, 4);
	in[14].src = vref(XM_DEC, -1, 1, 0);
	in[15] = ins(INS_BWD, 1, 0, 4);
	in[16] = ins(INS_STEP, -1, 0, 0);
	/* the memory's two transfers: tag 1 forward, tag 2 its gradient */
	static const int xfer[] = {3, 4, 10, 14};
	for (int i = 0; i < SP_ARRAY_LEN(xfer); i++) {
		sp_ins_t *x = &in[xfer[i]];
		x->seq_len = 6;
		x->peer = xfer[i] < 9 ? 1 : 0;
		x->tag = x->op == (xfer[i] < 9 ? INS_SEND : INS_RECV) ? 1 : 2;
	}
	compute_vrefs(p);

	p->n_devices = 2;
	NEW(p->devices, p->n_devices);
	for (int d = 0; d < 2; d++) {
		sp_device_t *x = &p->devices[d];
		x->local = d;
		x->first_ins = d ? 9 : 0;
		x->n_ins = d ? 8 : 9;
		for (int k = 0; k < MEM__COUNT; k++)
			x->mem[k] = (int64_t)1000 * (k + 1) + d;
		x->mem_peak = 5000 + d;
		x->busy_ms = 7.5 + d;
		x->finish_ms = 9.75;
	}
	p->cert = (sp_cert_t){.iteration_ms = 12.5, .compute_ms = 10.25, .lower_bound_ms = 8.0};
}

/* ---- helpers ------------------------------------------------------------ */

static uint32_t rd32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static uint64_t rd64(const uint8_t *b)
{
	return (uint64_t)rd32(b) | (uint64_t)rd32(b + 4) << 32;
}

static void wr32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static void fix_crc(uint8_t *b, size_t len)
{
	uint32_t hs = rd32(b + 16);
	wr32(b + 32, sp_crc32(0, b + hs, len - hs));
}

/* The table entry of section id in a valid encoding. */
static uint8_t *entry_of(uint8_t *b, uint32_t id)
{
	uint32_t n = rd32(b + 28);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *t = b + 40 + 40 * (size_t)i;
		if (rd32(t) == id)
			return t;
	}
	fail_msg("section %u not found", id);
	return NULL;
}

static void encode(const sp_plan_t *p, uint8_t **b, size_t *n)
{
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_encode(b, n, p, &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
}

static int is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/* Decoding must fail with an input error that names the file; *out stays empty. */
static void expect_reject(const uint8_t *b, size_t n, const char *want)
{
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_decode(&out, b, n, "plan.bin", &err);
	assert_int_equal(rc, SP_EINPUT);
	assert_int_equal(err.code, SP_EINPUT);
	assert_string_equal(err.file, "plan.bin");
	assert_true(err.msg[0] != 0);
	assert_true(is_zero(&out, sizeof out));
	if (want && !strstr(err.msg, want) && !strstr(err.path, want)) {
		sp_err_print(stderr, &err);
		fail_msg("expected an error mentioning \"%s\"", want);
	}
	plan_release(&out);
}

static void expect_nodes_equal(const sp_task_t *a, const sp_task_t *b)
{
	assert_string_equal(a->name, b->name);
	assert_int_equal(a->batch, b->batch);
	assert_true(a->weight == b->weight);
	assert_int_equal(a->n_nodes, b->n_nodes);
	for (int i = 0; i < a->n_nodes; i++) {
		const sp_node_t *x = &a->nodes[i], *y = &b->nodes[i];
		assert_string_equal(x->id, y->id);
		assert_int_equal(x->comp, y->comp);
		assert_int_equal(x->seq, y->seq);
		assert_int_equal(x->layer_from, y->layer_from);
		assert_int_equal(x->layer_to, y->layer_to);
		assert_int_equal(x->memory, y->memory);
		assert_int_equal(x->n_inputs, y->n_inputs);
		for (int k = 0; k < x->n_inputs; k++)
			assert_int_equal(x->inputs[k], y->inputs[k]);
	}
}

static void expect_model_equal(const sp_model_t *a, const sp_model_t *b)
{
	assert_string_equal(a->name, b->name);
	assert_int_equal(a->dtype, b->dtype);
	assert_int_equal(a->opt.kind, b->opt.kind);
	assert_true(a->opt.lr == b->opt.lr &&
		    a->opt.weight_decay == b->opt.weight_decay &&
		    a->opt.beta1 == b->opt.beta1 && a->opt.beta2 == b->opt.beta2 &&
		    a->opt.eps == b->opt.eps);
	assert_true(a->seed == b->seed && a->hash == b->hash);
	assert_int_equal(a->n_comps, b->n_comps);
	for (int i = 0; i < a->n_comps; i++) {
		const sp_component_t *x = &a->comps[i], *y = &b->comps[i];
		assert_string_equal(x->name, y->name);
		assert_int_equal(x->type, y->type);
		assert_true(x->vocab == y->vocab && x->hidden == y->hidden &&
			    x->max_seq == y->max_seq && x->in == y->in &&
			    x->out == y->out &&
			    x->layers == y->layers && x->heads == y->heads &&
			    x->ffn == y->ffn && x->classes == y->classes &&
			    x->causal == y->causal && x->temperature == y->temperature);
		assert_int_equal(x->cross_attention, y->cross_attention);
		assert_int_equal(x->memory_width, y->memory_width);
	}
	assert_int_equal(a->n_tasks, b->n_tasks);
	for (int t = 0; t < a->n_tasks; t++)
		expect_nodes_equal(&a->tasks[t], &b->tasks[t]);
}

/* Arrays of int32-only structs have no padding: memcmp compares every field. */
#define EXPECT_ARRAY_EQUAL(a, b, n, arr)                                   \
	do {                                                               \
		assert_int_equal((a)->n, (b)->n);                          \
		if ((a)->n)                                                \
			assert_memory_equal((a)->arr, (b)->arr,            \
					    sizeof *(a)->arr * (size_t)(a)->n); \
	} while (0)

static void expect_plan_equal(const sp_plan_t *a, const sp_plan_t *b)
{
	assert_string_equal(a->planner_version, b->planner_version);
	assert_string_equal(a->algo, b->algo);
	assert_string_equal(a->options, b->options);
	assert_true(a->model_hash == b->model_hash && a->cluster_hash == b->cluster_hash);
	assert_string_equal(a->cluster_name, b->cluster_name);
	assert_string_equal(a->gpu_name, b->gpu_name);
	assert_int_equal(a->nodes, b->nodes);
	assert_int_equal(a->gpus_per_node, b->gpus_per_node);
	assert_true(a->memory_gib == b->memory_gib &&
		    a->mem_reserve_gib == b->mem_reserve_gib);
	assert_int_equal(a->microbatches, b->microbatches);
	expect_model_equal(&a->model, &b->model);
	for (int t = 0; t < a->model.n_tasks; t++)
		assert_int_equal(plan_task_k(a, t), plan_task_k(b, t));

	assert_int_equal(a->n_metaops, b->n_metaops);
	for (int i = 0; i < a->n_metaops; i++) {
		const sp_metaop_t *x = &a->metaops[i], *y = &b->metaops[i];
		assert_true(opshape_equal(&x->shape, &y->shape));
		assert_true(x->task == y->task && x->n_layers == y->n_layers &&
			    x->first_op == y->first_op && x->seq_in == y->seq_in &&
			    x->width_in == y->width_in && x->seq_out == y->seq_out &&
			    x->width_out == y->width_out && x->fwd_ms == y->fwd_ms &&
			    x->bwd_ms == y->bwd_ms && x->profiled == y->profiled);
		assert_string_equal(x->name, y->name);
	}
	EXPECT_ARRAY_EQUAL(a, b, n_ops, ops);
	EXPECT_ARRAY_EQUAL(a, b, n_edges, edges);
	EXPECT_ARRAY_EQUAL(a, b, n_slice_devs, slice_devs);
	EXPECT_ARRAY_EQUAL(a, b, n_bucket_devs, bucket_devs);
	EXPECT_ARRAY_EQUAL(a, b, n_bucket_params, bucket_params);
	EXPECT_ARRAY_EQUAL(a, b, n_held, held);
	EXPECT_ARRAY_EQUAL(a, b, n_ins, ins);

	assert_int_equal(a->n_waves, b->n_waves);
	for (int i = 0; i < a->n_waves; i++) {
		const sp_wave_t *x = &a->waves[i], *y = &b->waves[i];
		assert_true(x->start_ms == y->start_ms && x->dur_ms == y->dur_ms &&
			    x->bwd_start_ms == y->bwd_start_ms &&
			    x->bwd_dur_ms == y->bwd_dur_ms &&
			    x->first_slice == y->first_slice &&
			    x->n_slices == y->n_slices);
	}
	assert_int_equal(a->n_slices, b->n_slices);
	for (int i = 0; i < a->n_slices; i++) {
		const sp_slice_t *x = &a->slices[i], *y = &b->slices[i];
		assert_true(x->wave == y->wave && x->metaop == y->metaop &&
			    x->layer_from == y->layer_from &&
			    x->layer_to == y->layer_to &&
			    x->n_dev == y->n_dev && x->dev_off == y->dev_off &&
			    x->start_ms == y->start_ms && x->fwd_ms == y->fwd_ms &&
			    x->bwd_start_ms == y->bwd_start_ms && x->bwd_ms == y->bwd_ms);
	}
	assert_int_equal(a->n_buckets, b->n_buckets);
	for (int i = 0; i < a->n_buckets; i++) {
		const sp_bucket_t *x = &a->buckets[i], *y = &b->buckets[i];
		assert_true(x->n_dev == y->n_dev && x->dev_off == y->dev_off &&
			    x->n_params == y->n_params && x->param_off == y->param_off &&
			    x->elems == y->elems && x->sync_ms == y->sync_ms &&
			    x->layout == y->layout && x->gather_ms == y->gather_ms &&
			    x->overlap == y->overlap && x->defer == y->defer);
	}
	assert_int_equal(a->n_devices, b->n_devices);
	for (int i = 0; i < a->n_devices; i++) {
		const sp_device_t *x = &a->devices[i], *y = &b->devices[i];
		assert_true(x->node == y->node && x->local == y->local &&
			    x->first_ins == y->first_ins && x->n_ins == y->n_ins &&
			    x->n_held == y->n_held && x->held_off == y->held_off &&
			    x->mem_peak == y->mem_peak && x->busy_ms == y->busy_ms &&
			    x->comm_ms == y->comm_ms && x->idle_ms == y->idle_ms &&
			    x->finish_ms == y->finish_ms);
		assert_memory_equal(x->mem, y->mem, sizeof x->mem);
	}
	const sp_cert_t *c = &a->cert, *d = &b->cert;
	assert_true(c->iteration_ms == d->iteration_ms &&
		    c->compute_ms == d->compute_ms &&
		    c->transfer_ms == d->transfer_ms && c->sync_ms == d->sync_ms &&
		    c->step_ms == d->step_ms && c->area_bound_ms == d->area_bound_ms &&
		    c->cp_bound_ms == d->cp_bound_ms &&
		    c->paper_bound_ms == d->paper_bound_ms &&
		    c->lower_bound_ms == d->lower_bound_ms && c->gap == d->gap &&
		    c->xnode_bytes == d->xnode_bytes &&
		    c->naive_xnode_bytes == d->naive_xnode_bytes &&
		    c->xfer_pred_ms == d->xfer_pred_ms &&
		    c->naive_xfer_pred_ms == d->naive_xfer_pred_ms);
	assert_int_equal(a->n_algos, b->n_algos);
	for (int i = 0; i < a->n_algos; i++) {
		const sp_algo_result_t *x = &a->algos[i], *y = &b->algos[i];
		assert_string_equal(x->name, y->name);
		assert_true(x->iteration_ms == y->iteration_ms &&
			    x->compute_ms == y->compute_ms &&
			    x->planning_ms == y->planning_ms &&
			    x->utilisation == y->utilisation &&
			    x->fits_memory == y->fits_memory);
	}
}

/* ---- fixtures --------------------------------------------------------- */

typedef struct {
	sp_plan_t plan;
	uint8_t *bin;
	size_t len;
} fix_t;

static int setup(void **state)
{
	fix_t *f = calloc(1, sizeof *f);
	if (!f)
		return -1;
	make_plan(&f->plan, MODEL_JSON);
	encode(&f->plan, &f->bin, &f->len);
	*state = f;
	return 0;
}

static int setup_xattn(void **state)
{
	fix_t *f = calloc(1, sizeof *f);
	if (!f)
		return -1;
	make_xattn_plan(&f->plan);
	encode(&f->plan, &f->bin, &f->len);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fix_t *f = *state;
	plan_release(&f->plan);
	free(f->bin);
	free(f);
	return 0;
}

/* ---- tests ------------------------------------------------------------- */

static void test_round_trip(void **state)
{
	fix_t *f = *state;
	sp_plan_t back;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_decode(&back, f->bin, f->len, "plan.bin", &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	expect_plan_equal(&f->plan, &back);
	uint8_t *again;
	size_t n;
	encode(&back, &again, &n);
	assert_int_equal(n, f->len);
	assert_memory_equal(again, f->bin, n);
	/* the same plan encodes to the same bytes every time */
	free(again);
	encode(&f->plan, &again, &n);
	assert_int_equal(n, f->len);
	assert_memory_equal(again, f->bin, n);
	free(again);
	plan_release(&back);
	assert_true(is_zero(&back, sizeof back));
}

static void test_layout(void **state)
{
	fix_t *f = *state;
	const uint8_t *b = f->bin;
	assert_memory_equal(b, PLAN_MAGIC, PLAN_MAGIC_LEN);
	assert_int_equal(rd32(b + 12), PLAN_VERSION);
	assert_int_equal(rd32(b + 16), 40);
	assert_int_equal(rd64(b + 20), f->len);
	assert_int_equal(f->len % 8, 0);
	assert_int_equal(rd32(b + 36), 0);
	uint32_t n = rd32(b + 28);
	assert_int_equal(n, 21);
	uint64_t end = 40 + 40 * (uint64_t)n;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *t = b + 40 + 40 * (size_t)i;
		assert_int_equal(rd32(t), i + 1);
		assert_int_equal(rd32(t + 4), 0);
		assert_int_equal(rd64(t + 8) % 8, 0);
		assert_true(rd64(t + 8) + rd64(t + 16) <= f->len);
		/* sections in id order; the padding before each is zero */
		assert_true(rd64(t + 8) >= end && rd64(t + 8) - end < 8);
		assert_true(is_zero(b + end, (size_t)(rd64(t + 8) - end)));
		end = rd64(t + 8) + rd64(t + 16);
	}
	assert_true(f->len - end < 8 && is_zero(b + end, (size_t)(f->len - end)));
	/* the string table starts with the empty string and stores names once */
	uint8_t *st = entry_of(f->bin, 1);
	const char *strs = (const char *)b + rd64(st + 8);
	size_t slen = (size_t)rd64(st + 16);
	assert_int_equal(strs[0], 0);
	int lossy = 0;
	for (size_t i = 0; i + 5 <= slen; i++)
		lossy += (i == 0 || strs[i - 1] == 0) && strcmp(strs + i, "loss") == 0;
	assert_int_equal(lossy, 1);
}

static void test_truncations(void **state)
{
	fix_t *f = *state;
	for (size_t n = 0; n < f->len; n++)
		expect_reject(f->bin, n, NULL);
	char want[64];
	snprintf(want, sizeof want, "file is truncated (%zu of %zu bytes)", f->len - 100,
		 f->len);
	expect_reject(f->bin, f->len - 100, want);
	expect_reject(f->bin, 0, "empty");
	expect_reject(f->bin, 20, "truncated");
}

static void test_bit_flips_checksum(void **state)
{
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	for (uint64_t i = 0; i < 2000; i++) {
		uint64_t r = sp_mix64(0x5eed0000 + i);
		size_t bit = (size_t)(r % (f->len * 8));
		memcpy(b, f->bin, f->len);
		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		/* the header's fields are checked one by one, the rest by the CRC */
		expect_reject(b, f->len, bit / 8 >= 40 ? "checksum mismatch" : NULL);
	}
	/* every bit of the body is covered by the CRC */
	memcpy(b, f->bin, f->len);
	b[f->len - 1] ^= 0x80;
	expect_reject(b, f->len, "checksum mismatch: the file is corrupt");
	free(b);
}

/*
 * Mutations with the checksum made valid again: now the validator alone
 * stands between the bytes and the runtime. A mutated file either is
 * rejected, or decodes to a plan that passes the same validation again
 * (plan_encode decodes what it writes).
 */
static void mutate_and_check(fix_t *f, uint8_t *b, int *accepted, int *rejected)
{
	fix_crc(b, f->len);
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_decode(&out, b, f->len, "plan.bin", &err);
	if (rc) {
		assert_int_equal(rc, SP_EINPUT);
		assert_true(err.msg[0] != 0);
		assert_true(is_zero(&out, sizeof out));
		(*rejected)++;
		return;
	}
	uint8_t *again;
	size_t n;
	encode(&out, &again, &n);
	sp_plan_t twice;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_decode(&twice, again, n, "again.bin", &err), 0);
	expect_plan_equal(&out, &twice);
	plan_release(&twice);
	plan_release(&out);
	free(again);
	(*accepted)++;
}

static void test_bit_flips_validated(void **state)
{
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	int acc = 0, rej = 0;
	for (uint64_t i = 0; i < 2000; i++) {
		uint64_t r = sp_mix64(0xb17f0000 + i);
		size_t bit = 40 * 8 + (size_t)(r % ((f->len - 40) * 8));
		memcpy(b, f->bin, f->len);
		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		mutate_and_check(f, b, &acc, &rej);
	}
	/* both outcomes happen: the test reaches the validator's checks */
	assert_true(rej > 100);
	assert_true(acc > 100);

	/* whole 32-bit fields set to boundary values: indices, counts, offsets */
	static const uint32_t vals[] = {0,          1,          2,          3,
					0xffffffffu, 0x7fffffffu, 0x80000000u, 7,
					8,          9,          15,         16};
	acc = rej = 0;
	for (uint64_t i = 0; i < 2000; i++) {
		uint64_t r = sp_mix64(0xfa1d0000 + i);
		size_t pos = 40 + 4 * (size_t)(r % ((f->len - 40) / 4));
		memcpy(b, f->bin, f->len);
		wr32(b + pos, vals[(r >> 32) % SP_ARRAY_LEN(vals)]);
		mutate_and_check(f, b, &acc, &rej);
	}
	assert_true(rej > 100);
	free(b);
}

static void test_version_and_magic(void **state)
{
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	char want[128];
	memcpy(b, f->bin, f->len);
	wr32(b + 12, PLAN_VERSION + 1);
	snprintf(want, sizeof want,
		 "plan format version %d is newer than this build (reads version %d)",
		 PLAN_VERSION + 1, PLAN_VERSION);
	expect_reject(b, f->len, want);
	/* the version is checked before the size: a short newer file says so too */
	expect_reject(b, 40, want);
	wr32(b + 12, PLAN_VERSION - 1);
	expect_reject(b, f->len, "is older than this build");
	/* version 3 (before cross-attention): refused, told to re-plan */
	wr32(b + 12, 3);
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_decode(&out, b, f->len, "plan.bin", &err), SP_EINPUT);
	snprintf(want, sizeof want, "plan format version 3 is older than this build "
				    "(reads version %d): re-plan", PLAN_VERSION);
	assert_string_equal(err.msg, want);
	assert_non_null(strstr(err.hint, "run spindle-plan again"));
	assert_true(is_zero(&out, sizeof out));
	memcpy(b, f->bin, f->len);
	b[3] ^= 0x20;
	expect_reject(b, f->len, "not a Spindle plan");
	expect_reject((const uint8_t *)"{\"format\": 1}", 13, "not a Spindle plan");
	free(b);
}

static void test_sections(void **state)
{
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	/* a section that runs past the end of the file */
	memcpy(b, f->bin, f->len);
	uint8_t *t = entry_of(b, 18);
	uint64_t off = rd64(t + 8);
	wr64(t + 16, f->len);
	fix_crc(b, f->len);
	char want[128];
	snprintf(want, sizeof want,
		 "section 'instructions' ends past the file (offset %llu > %zu)",
		 (unsigned long long)(off + f->len), f->len);
	expect_reject(b, f->len, want);
	wr64(t + 16, UINT64_MAX - 3);
	fix_crc(b, f->len);
	expect_reject(b, f->len, "overflows");
	/* a required section missing (its id now unknown) */
	memcpy(b, f->bin, f->len);
	wr32(entry_of(b, 12), 99);
	fix_crc(b, f->len);
	expect_reject(b, f->len, "required section 'slices' is missing");
	/* a required section twice */
	memcpy(b, f->bin, f->len);
	wr32(entry_of(b, 13), 12);
	fix_crc(b, f->len);
	expect_reject(b, f->len, "section 'slices' appears twice");
	/* a record count that does not match the bytes */
	memcpy(b, f->bin, f->len);
	t = entry_of(b, 12);
	wr64(t + 24, rd64(t + 24) + 1);
	fix_crc(b, f->len);
	expect_reject(b, f->len, "records of 68 bytes");
	/* a section count larger than the table */
	memcpy(b, f->bin, f->len);
	wr32(b + 28, 22);
	expect_reject(b, f->len, "overlaps the section table");
	/* unaligned section */
	memcpy(b, f->bin, f->len);
	t = entry_of(b, 21);
	wr64(t + 8, rd64(t + 8) + 4);
	fix_crc(b, f->len);
	expect_reject(b, f->len, "aligned");
	free(b);
}

/* Rebuilds the file with one extra table entry (id, size bytes of data). */
static uint8_t *with_extra_section(const fix_t *f, uint32_t id, uint64_t xoff,
				   uint64_t xsize, size_t *out_len)
{
	uint32_t n = rd32(f->bin + 28);
	size_t table_end = 40 + 40 * (size_t)n;
	size_t len = f->len + 40 + 8;
	uint8_t *b = calloc(len, 1);
	assert_non_null(b);
	memcpy(b, f->bin, table_end);
	memcpy(b + table_end + 40, f->bin + table_end, f->len - table_end);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *t = b + 40 + 40 * (size_t)i;
		wr64(t + 8, rd64(t + 8) + 40);
	}
	uint8_t *x = b + table_end;
	wr32(x, id);
	wr64(x + 8, xoff ? xoff + 40 : f->len + 40);
	wr64(x + 16, xsize);
	wr64(x + 24, 1);
	memcpy(b + f->len + 40, "future!", 8);
	wr32(b + 28, n + 1);
	wr64(b + 20, len);
	fix_crc(b, len);
	*out_len = len;
	return b;
}

static void test_unknown_and_duplicate_sections(void **state)
{
	fix_t *f = *state;
	size_t len;
	/* an unknown section of the same major version is skipped */
	uint8_t *b = with_extra_section(f, 1000, 0, 8, &len);
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_decode(&out, b, len, "plan.bin", &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	expect_plan_equal(&f->plan, &out);
	plan_release(&out);
	free(b);
	/* ... but still bounds-checked */
	b = with_extra_section(f, 1000, 0, 16, &len);
	expect_reject(b, len, "section 1000 (unknown) ends past the file");
	free(b);
	/* a known section listed twice is rejected */
	const uint8_t *cert = entry_of(f->bin, 20);
	b = with_extra_section(f, 20, rd64(cert + 8), rd64(cert + 16), &len);
	expect_reject(b, len, "section 'certificate' appears twice");
	free(b);
}

/* Sets one u32 field of record rec of section id, and makes the CRC valid. */
static void patch(uint8_t *b, size_t len, uint32_t id, size_t rec, size_t at, uint32_t v)
{
	uint8_t *t = entry_of(b, id);
	uint64_t size = rd64(t + 16), count = rd64(t + 24);
	wr32(b + rd64(t + 8) + rec * (size / count) + at, v);
	fix_crc(b, len);
}

static void expect_rejected_at(const uint8_t *b, size_t len, const char *path,
			       const char *msg)
{
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_decode(&out, b, len, "plan.bin", &err), SP_EINPUT);
	if (strcmp(err.path, path) != 0 || !strstr(err.msg, msg)) {
		sp_err_print(stderr, &err);
		fail_msg("expected \"%s: %s\"", path, msg);
	}
	assert_true(is_zero(&out, sizeof out));
}

static void expect_patch_rejected(const fix_t *f, uint32_t id, size_t rec, size_t at,
				  uint32_t v, const char *path, const char *msg)
{
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	memcpy(b, f->bin, f->len);
	patch(b, f->len, id, rec, at, v);
	expect_rejected_at(b, f->len, path, msg);
	free(b);
}

/* Bucket 0 (zero-1 over 2 devices, with its GATHERs) as zero-2: read, with
 * the gradients' shards the same as the optimizer state's. */
static void test_zero2_read(void **state)
{
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 14, 0, 32, LAYOUT_ZERO2);
	patch(b, f->len, 14, 0, 44, 1); /* overlapped (version 7) */
	patch(b, f->len, 14, 0, 48, 1); /* deferred all-gather (version 8) */
	sp_plan_t out;
	sp_err_t err = {0};
	int rc = plan_decode(&out, b, f->len, "plan.bin", &err);
	if (rc)
		print_message("zero-2 bucket refused: %s\n", err.msg);
	assert_int_equal(rc, 0);
	assert_int_equal(out.buckets[0].layout, LAYOUT_ZERO2);
	assert_int_equal(out.buckets[0].overlap, 1);
	assert_int_equal(out.buckets[0].defer, 1);
	assert_string_equal(layout_name(out.buckets[0].layout), "zero-2");
	int64_t off, n;
	assert_int_equal(bucket_shard(&out, 0, out.bucket_devs[out.buckets[0].dev_off + 1], &off,
				      &n),
			 1);
	assert_int_equal(off, out.buckets[0].elems / 2);
	assert_int_equal(n, out.buckets[0].elems - out.buckets[0].elems / 2);
	plan_release(&out);
	free(b);
}

static void test_indices(void **state)
{
	fix_t *f = *state;
	/* instruction record: op 0, slice 4, s0 8, s1 12, seq_len 16, src 20,
	 * dst 36, peer 52, tag 56 */
	expect_patch_rejected(f, 18, 12, 52, 2, "instructions[12].peer",
			      "device 2 does not exist (there are 2)");
	expect_patch_rejected(f, 18, 12, 52, 1, "instructions[12].peer",
			      "device 1 sends to itself");
	expect_patch_rejected(f, 18, 8, 52, 3, "instructions[8].peer",
			      "bucket 3 does not exist (there are 3)");
	expect_patch_rejected(f, 18, 0, 0, 12, "instructions[0].op",
			      "unknown instruction op code 12");
	/* a PGATHER or PFREE names a zero-3 bucket (bucket 1 is replicated) */
	expect_patch_rejected(f, 18, 16, 0, INS_PGATHER, "instructions[16].peer",
			      "pgather of bucket 1, whose weights are not sharded (layout "
			      "replicated, not zero-3)");
	expect_patch_rejected(f, 18, 16, 0, INS_PFREE, "instructions[16].peer",
			      "pfree of bucket 1");
	/* a gather names a zero-1 bucket (bucket 1 is replicated) */
	expect_patch_rejected(f, 18, 16, 0, INS_GATHER, "instructions[16].peer", "not sharded");
	/* provenance: microbatches 60 */
	expect_patch_rejected(f, 2, 0, 60, 0, "provenance.microbatches", "outside");
	/* task record: microbatches 28 (k_t, 1 to the plan's 2; the fixture's
	 * task 1 has 2, and some task must) */
	expect_patch_rejected(f, 5, 1, 28, 0, "tasks[1].microbatches", "outside [1, 2]");
	expect_patch_rejected(f, 5, 0, 28, 3, "tasks[0].microbatches", "outside [1, 2]");
	expect_patch_rejected(f, 5, 1, 28, 1, "provenance.microbatches",
			      "2 micro-steps, but no task has more than 1 micro-batches");
	/* bucket record: layout 32; slice record: recompute 56 */
	expect_patch_rejected(f, 14, 1, 32, LAYOUT_ZERO1, "buckets[1].layout",
			      "nothing to shard");
	expect_patch_rejected(f, 14, 1, 32, LAYOUT_ZERO2, "buckets[1].layout",
			      "zero-2 over a single device");
	expect_patch_rejected(f, 14, 1, 32, LAYOUT_ZERO3, "buckets[1].layout",
			      "zero-3 over a single device");
	expect_patch_rejected(f, 14, 0, 32, 4, "buckets[0].layout", "outside");
	/* bucket record: overlap 44, 0 or 1, and 1 only on zero-2/3 (bucket 0
	 * is zero-1) */
	expect_patch_rejected(f, 14, 0, 44, 2, "buckets[0].overlap", "outside");
	expect_patch_rejected(f, 14, 0, 44, 1, "buckets[0].overlap", "set on a zero-1 bucket");
	/* bucket record: defer 48 (version 8; since 9 the k of its pieces), 0
	 * to n_params, and nonzero only on zero-1/2 (bucket 1 is replicated;
	 * bucket 0 made zero-3 below) */
	expect_patch_rejected(f, 14, 0, 48, 100000, "buckets[0].defer", "outside");
	expect_patch_rejected(f, 14, 1, 48, 1, "buckets[1].defer", "set on a replicated bucket");
	{
		uint8_t *b = malloc(f->len);
		assert_non_null(b);
		memcpy(b, f->bin, f->len);
		patch(b, f->len, 14, 0, 32, LAYOUT_ZERO3);
		patch(b, f->len, 14, 0, 48, 1);
		expect_rejected_at(b, f->len, "buckets[0].defer", "set on a zero-3 bucket");
		free(b);
	}
	/* a GATHER after the STEP names a zero-1 or zero-2 bucket, not zero-3:
	 * bucket 0 (2 devices) made zero-3, instruction 16 a GATHER of it */
	{
		uint8_t *b = malloc(f->len);
		assert_non_null(b);
		memcpy(b, f->bin, f->len);
		patch(b, f->len, 14, 0, 32, LAYOUT_ZERO3);
		patch(b, f->len, 18, 16, 0, INS_GATHER);
		patch(b, f->len, 18, 16, 52, 0);
		expect_rejected_at(b, f->len, "instructions[16].peer",
				   "not sharded by zero-1 or zero-2");
		free(b);
	}
	expect_patch_rejected(f, 12, 0, 56, 2, "slices[0].recompute", "outside");
	expect_patch_rejected(f, 18, 0, 4, 9, "instructions[0].slice",
			      "slice 9 does not exist");
	expect_patch_rejected(f, 18, 0, 12, 9, "instructions[0].s0",
			      "sample range [0, 9) is outside the task's batch [0, 8)");
	expect_patch_rejected(f, 18, 2, 8, 9, "instructions[2].s0",
			      "sample range [9, 8)");
	expect_patch_rejected(f, 18, 12, 24, 3, "instructions[12].src.layer",
			      "3 is outside [-1, 2]");
	expect_patch_rejected(f, 18, 12, 28, 2, "instructions[12].src.grad",
			      "2 is outside [0, 1]");
	expect_patch_rejected(f, 18, 12, 32, 6, "instructions[12].src.seq_off",
			      "range [6, 7) is outside the 6 tokens of the value");
	/* a compute instruction's values must be the ones its slice implies
	 * (the runtime indexes them): a foreign metaop or layer is refused */
	expect_patch_rejected(f, 18, 0, 20, 100000, "instructions[0].src",
			      "do not match slice 0");
	expect_patch_rejected(f, 18, 6, 40, 0, "instructions[6].dst",
			      "do not match slice 4");
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 18, 7, 36, 5); /* dst: act(clip/c_in, 0), data of width 0 */
	patch(b, f->len, 18, 7, 48, 0);
	expect_rejected_at(b, f->len, "instructions[7].dst",
			   "copy between values of widths 16 and 0");
	expect_patch_rejected(f, 18, 3, 4, 0, "instructions[3].slice",
			      "is not a loss");
	/* slices: wave 0, metaop 4, layer_from 8, layer_to 12, n_dev 16, dev_off 20 */
	expect_patch_rejected(f, 12, 2, 12, 5, "slices[2].layer_from",
			      "layer range [0, 5) is empty or outside the metaop's 4");
	expect_patch_rejected(f, 12, 8, 20, 10, "slices[8].dev_off",
			      "range [10, 12) is outside the 11 slice devices");
	expect_patch_rejected(f, 12, 7, 20, 6, "slices[7].dev_off",
			      "device 0 is twice");
	expect_patch_rejected(f, 12, 3, 0, 2, "waves[1].first_slice",
			      "slice 3 is in this wave's range but belongs to wave 2");
	expect_patch_rejected(f, 13, 4, 0, 2, "slice_devs[4]", "device 2 does not exist");
	/* metaops: task 0, shape 4..76, n_layers 76, first_op 80 */
	expect_patch_rejected(f, 8, 6, 80, 12, "metaops[6].first_op",
			      "range [12, 16) is outside the 15 ops");
	expect_patch_rejected(f, 8, 0, 0, 2, "metaops[0].task", "task 2 does not exist");
	/* a metaop's shape and value shapes are its nodes' in the model (the
	 * runtime runs layers with the shape and sizes parameters and buffers
	 * by the model: a crafted shape read past them) */
	expect_patch_rejected(f, 8, 1, 8, 32, "ops[1].node",
			      "metaops[1] has shape 'transformer h32");
	expect_patch_rejected(f, 8, 0, 32, 64, "ops[0].node", "node 't_in' of its layer 0 is");
	expect_patch_rejected(f, 8, 1, 84, 7, "metaops[1].seq_in",
			      "metaop 'lm/t' reads [7 x 16] and writes [8 x 16], but its nodes "
			      "in the model make [8 x 16] and [8 x 16]");
	expect_patch_rejected(f, 8, 2, 96, 16, "metaops[2].width_out", "writes [0 x 16]");
	expect_patch_rejected(f, 9, 5, 0, 1, "ops[5].node", "metaops[2] has shape");
	/* ops: node 0, layer 4 */
	expect_patch_rejected(f, 9, 8, 4, 2, "ops[8].layer",
			      "layer 2 is outside the layers [0, 2) of node 'i'");
	expect_patch_rejected(f, 9, 0, 0, 3, "ops[0].node", "node 3 does not exist");
	/* edges: src 0, dst 4, seq_off 8, seq_len 12 */
	expect_patch_rejected(f, 10, 5, 8, 7, "edges[5].seq_off",
			      "range [7, 8) is outside the 2 tokens");
	/* buckets: n_dev 0, dev_off 4, n_params 8, param_off 12 */
	expect_patch_rejected(f, 14, 0, 4, 2, "buckets[0].dev_off",
			      "not ascending and distinct (0 after 1)");
	expect_patch_rejected(f, 14, 2, 12, 6, "buckets[2].param_off",
			      "range [6, 8) is outside the 7 bucket params");
	expect_patch_rejected(f, 16, 0, 4, 4, "bucket_params[0].layer",
			      "layer 4 does not exist (there are 4)");
	expect_patch_rejected(f, 19, 0, 0, 5, "held[0].comp",
			      "component 5 does not exist");
	/* devices: node 0, local 4, first_ins 8, n_ins 12, n_held 16, held_off 20 */
	expect_patch_rejected(f, 17, 1, 4, 0, "devices[1].local",
			      "node 0 GPU 0 is already another device");
	expect_patch_rejected(f, 17, 1, 12, 9, "devices[1].first_ins",
			      "range [10, 19) is outside the 18 instructions");
	expect_patch_rejected(f, 17, 1, 8, 9, "devices[1].first_ins",
			      "instruction 9 is also in the program of device 0");
	/* model: nodes (id 0, comp 4, seq 8, n_inputs 16, first_input 20, layers 24) */
	expect_patch_rejected(f, 6, 4, 28, 5, "tasks[1].nodes[1].layer_from",
			      "layer range [0, 5) is empty or outside component 'body'");
	expect_patch_rejected(f, 6, 1, 4, 7, "tasks[0].nodes[1].comp",
			      "component 7 does not exist");
	expect_patch_rejected(f, 7, 0, 0, 1, "tasks[0].nodes[1].inputs",
			      "node 't' is its own input");
	expect_patch_rejected(f, 7, 5, 0, 9, "tasks[1].nodes[4].inputs",
			      "node 9 does not exist (there are 5)");
	expect_patch_rejected(f, 5, 1, 24, 2, "tasks[1].first_node",
			      "nodes start at 2, expected 3");
	/* components: name 0, type 4, vocab 8 (i64), hidden 16 */
	expect_patch_rejected(f, 4, 2, 8, 3, "components[2].vocab",
			      "transformer components have no 'vocab'");
	expect_patch_rejected(f, 4, 2, 16, 15, "components[2].heads",
			      "hidden 15 is not divisible by heads 2");
	expect_patch_rejected(f, 4, 0, 4, 7, "components[0].type",
			      "7 is outside [0, 6]");
	expect_patch_rejected(f, 4, 0, 0, 100000, "components[0].name",
			      "string offset 100000 is outside the string table");
	expect_patch_rejected(f, 4, 0, 0, 2, "components[0].name",
			      "points into the middle of a string");
	/* strings: a name with a character the loaders would refuse */
	memcpy(b, f->bin, f->len);
	uint8_t *t = entry_of(b, 3);
	uint32_t name = rd32(b + rd64(t + 8));
	uint8_t *strs = b + rd64(entry_of(b, 1) + 8);
	strs[name] = '/';
	fix_crc(b, f->len);
	expect_reject(b, f->len, "invalid name '/ini-2'");
	strs[name] = '\n';
	fix_crc(b, f->len);
	expect_reject(b, f->len, "control character 0x0a");
	free(b);
}

/* The writer refuses plans the reader would reject, and malformed arrays. */
/*
 * One home for the model's rules: a plan whose model breaks one of the JSON
 * loader's rules is rejected by the reader too, at the plan record. Here the
 * total of saved activations (each node within the limit, their sum past
 * it), which the reader once did not check.
 */
/* Tensor parallelism: slice tp (slices, at 60) and sp (at 64); a param's
 * tp and tp_rank (bucket_params 16 and held 19, at 8 and 12). */
static void test_tp_fields(void **state)
{
	static const struct {
		uint32_t id, rec, at, v;
		const char *path, *msg;
	} cases[] = {
		{12, 0, 60, 0, "slices[0].tp", "0 is outside [1, 64]"},
		{12, 7, 60, 65, "slices[7].tp", "65 is outside [1, 64]"},
		{12, 2, 60, 2, "slices[2].tp",
		 "tensor-parallel degree 2 does not divide the slice's 1 devices"},
		{12, 8, 60, 2, "slices[8].tp", "metaop 'clip/loss' cannot be split 2 ways"},
		{12, 7, 60, 4, "slices[7].tp", "does not divide the slice's 2 devices"},
		{16, 0, 8, 0, "bucket_params[0].tp", "0 is outside [1, 64]"},
		{16, 0, 12, 1, "bucket_params[0].tp_rank", "shard 1 does not exist (there are 1)"},
		{19, 1, 12, 2, "held[1].tp_rank", "shard 2 does not exist (there are 2)"},
		/* 3 ways: not the transformer 'body' (4 heads); the embedding
		 * 'tok' by vocabulary, unevenly: see below */
		{19, 1, 8, 3, "held[1].tp", "component 'body' cannot be split 3 ways"},
		/* sequence parallelism (slice sp, at 64): a flag, only on a split
		 * transformer whose seq the degree divides (clip/c: seq 5) */
		{12, 0, 64, 2, "slices[0].sp", "2 is outside [0, 1]"},
		{12, 0, 64, 1, "slices[0].sp",
		 "sequence parallelism on metaop 'lm/t_in' split 1 ways"},
		{12, 7, 64, 1, "slices[7].sp",
		 "sequence parallelism on metaop 'clip/c' split 2 ways (only a split "
		 "transformer, not a decoder, whose seq 5 the degree divides)"},
	};
	for (size_t i = 0; i < SP_ARRAY_LEN(cases); i++)
		expect_patch_rejected(*state, cases[i].id, cases[i].rec, cases[i].at, cases[i].v,
				      cases[i].path, cases[i].msg);
	/* an embedding splits by vocabulary unevenly (vocab_shard: 64 over 3
	 * is 22, 21, 21): held 0, 'tok''s layer, 3 ways is no refusal of its
	 * tp (other checks may still refuse the patched plan; fewer ids than
	 * members: test_layers_vocab, tp_whole.py) */
	const fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 19, 0, 8, 3);
	sp_plan_t out;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	int rc = plan_decode(&out, b, f->len, "plan.bin", &err);
	if (rc == SP_EINPUT && strcmp(err.path, "held[0].tp") == 0)
		fail_msg("a 3-way shard of the 64-id embedding was refused: %s", err.msg);
	if (rc == 0)
		plan_release(&out);
	free(b);
}

static void test_model_rules_shared(void **state)
{
	(void)state;
	static const char bad_json[] = WIDE_MODEL_JSON(4194304);
	sp_model_t m;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	assert_int_equal(model_parse(&m, bad_json, strlen(bad_json), "model.json", &err),
			 SP_EINPUT);
	if (strcmp(err.path, "tasks[2].graph[2]") != 0 ||
	    !strstr(err.msg, "sizes overflow 64-bit FLOP/byte arithmetic")) {
		sp_err_print(stderr, &err);
		fail_msg("expected the loader to reject the saved-activation total");
	}
	/* the same model at batch 1 is valid; the plan's batch field set to 2^22 */
	sp_plan_t p;
	uint8_t *b;
	size_t n;
	make_plan(&p, WIDE_MODEL_JSON(1));
	encode(&p, &b, &n);
	/* task record: name 0, batch 4 (i64: low word, high word 0) */
	patch(b, n, 5, 2, 4, 1u << 22);
	expect_rejected_at(b, n, "tasks[2].nodes[2]",
			   "sizes overflow 64-bit FLOP/byte arithmetic (batch 4194304, "
			   "seq 131072)");
	free(b);
	plan_release(&p);
}

static void test_encode_refuses_invalid(void **state)
{
	fix_t *f = *state;
	sp_plan_t *p = &f->plan;
	uint8_t *b = (uint8_t *)"untouched";
	size_t n = 99;
	sp_err_t err;

	p->ins[12].peer = 5;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	assert_null(b);
	assert_int_equal(n, 0);
	assert_non_null(strstr(err.msg, "refusing to write an invalid plan: "
					"instructions[12].peer: device 5 does "
					"not exist"));
	p->ins[12].peer = 0;

	int32_t keep = p->n_edges;
	p->n_edges = -1;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	p->n_edges = keep;

	sp_op_t *ops = p->ops;
	p->ops = NULL;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	assert_non_null(strstr(err.msg, "plan.ops"));
	p->ops = ops;

	p->metaops[3].name[0] = 0;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	snprintf(p->metaops[3].name, sizeof p->metaops[3].name, "clip/i_in");

	memset(p->gpu_name, 'x', sizeof p->gpu_name);
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	assert_non_null(strstr(err.msg, "not NUL-terminated"));
	snprintf(p->gpu_name, sizeof p->gpu_name, "Test GPU 16GB");

	p->slices[2].fwd_ms = NAN;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&b, &n, p, &err), SP_EINTERNAL);
	assert_non_null(strstr(err.msg, "slices[2].fwd_ms: not a finite number"));
	p->slices[2].fwd_ms = 2.1;

	encode(p, &b, &n);
	assert_int_equal(n, f->len);
	free(b);
}

/* ---- files --------------------------------------------------------------- */

static char tmpdir[64];

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static void test_files(void **state)
{
	fix_t *f = *state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/spindle-plan-io-XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	char path[160], sub[160], empty[160], missing[200];
	snprintf(path, sizeof path, "%s/plan.bin", tmpdir);
	snprintf(sub, sizeof sub, "%s/dir.bin", tmpdir);
	snprintf(empty, sizeof empty, "%s/empty.bin", tmpdir);
	snprintf(missing, sizeof missing, "%s/no/such/dir/plan.bin", tmpdir);
	sp_err_t err;

	/* plan_write's bytes are plan_encode's */
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_write(&f->plan, path, &err), 0);
	char *text;
	size_t n;
	assert_int_equal(sp_read_file(&text, &n, path, &err), 0);
	assert_int_equal(n, f->len);
	assert_memory_equal(text, f->bin, n);
	free(text);
	sp_plan_t back;
	assert_int_equal(plan_read(&back, path, &err), 0);
	expect_plan_equal(&f->plan, &back);
	plan_release(&back);
	assert_int_equal(count_entries(tmpdir), 1);

	/* a missing directory: a user error (exit 2), and no file */
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_write(&f->plan, missing, &err), SP_EINPUT);
	assert_string_equal(err.file, missing);
	struct stat st;
	assert_int_equal(stat(missing, &st), -1);
	assert_int_equal(count_entries(tmpdir), 1);

	/* a directory in the way: a user error found before any file is made
	 * (sp_output_check; it once failed only at the rename, SP_EIO) */
	assert_int_equal(mkdir(sub, 0755), 0);
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_write(&f->plan, sub, &err), SP_EINPUT);
	assert_string_equal(err.file, sub);
	assert_int_equal(count_entries(tmpdir), 2);
	assert_int_equal(count_entries(sub), 0);
	assert_int_equal(rmdir(sub), 0);

	/* a zero-length file */
	FILE *fp = fopen(empty, "wb");
	assert_non_null(fp);
	fclose(fp);
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_read(&back, empty, &err), SP_EINPUT);
	assert_string_equal(err.file, empty);
	assert_non_null(strstr(err.msg, "file is empty: not a Spindle plan"));
	assert_true(is_zero(&back, sizeof back));

	/* a file that is not there */
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_read(&back, missing, &err), SP_EINPUT);
	assert_true(is_zero(&back, sizeof back));

	assert_int_equal(unlink(empty), 0);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(rmdir(tmpdir), 0);
}

static void test_util(void **state)
{
	fix_t *f = *state;
	static const char *const names[] = {"?",    "fwd",  "bwd",  "send", "recv", "copy",
					    "loss", "sync", "step", "gather", "pgather", "pfree", "?"};
	for (int op = 0; op <= 12; op++)
		assert_string_equal(ins_op_name(op), names[op]);
	assert_string_equal(ins_op_name(-1), "?");
	int32_t seq, width;
	plan_value_shape(&f->plan, 3, 0, &seq, &width);
	assert_true(seq == 6 && width == 0);
	plan_value_shape(&f->plan, 3, 1, &seq, &width);
	assert_true(seq == 6 && width == 16);
	plan_value_shape(&f->plan, 7, 0, &seq, &width);
	assert_true(seq == 2 && width == 16);
	plan_value_shape(&f->plan, 7, 1, &seq, &width);
	assert_true(seq == 0 && width == 0);
	plan_release(NULL);
}

/* ---- cross-attention (format 4) ---------------------------------------- */

/* The decoded decoder plan holds what was built: the memory's fields. */
static void test_xattn_fields(void **state)
{
	fix_t *f = *state;
	sp_plan_t back;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_decode(&back, f->bin, f->len, "plan.bin", &err), 0);
	const sp_component_t *dec = &back.model.comps[4], *enc = &back.model.comps[2];
	assert_true(dec->cross_attention == 1 && dec->memory_width == 12);
	assert_true(enc->cross_attention == 0 && enc->memory_width == 0);
	const sp_task_t *t = &back.model.tasks[0];
	assert_int_equal(t->nodes[4].memory, 2); /* dec attends to mem */
	assert_int_equal(t->nodes[1].memory, 0); /* as the loader leaves it */
	assert_true(back.metaops[XM_DEC].shape.mem_seq == 6 &&
		    back.metaops[XM_DEC].shape.mem_width == 12);
	for (int m = 0; m < back.n_metaops; m++)
		if (m != XM_DEC)
			assert_true(back.metaops[m].shape.mem_seq == 0 &&
				    back.metaops[m].shape.mem_width == 0);
	for (int e = 0; e < back.n_edges; e++)
		assert_int_equal(back.edges[e].memory, e == 3);
	assert_true(back.ins[10].dst.metaop == XM_DEC && back.ins[10].dst.layer == -1 &&
		    back.ins[10].dst.grad == 0);
	assert_true(back.ins[14].src.metaop == XM_DEC && back.ins[14].src.layer == -1 &&
		    back.ins[14].src.grad == 1);
	int32_t seq, width;
	plan_value_shape(&back, XM_DEC, -1, &seq, &width);
	assert_true(seq == 6 && width == 12);
	plan_release(&back);
}

/* The new fields sit where PLAN-FORMAT.md says: appended to each record. */
static void test_xattn_layout(void **state)
{
	fix_t *f = *state;
	const uint8_t *b = f->bin;
	static const struct {
		uint32_t id, rec_size, rec, at;
		uint64_t v;
	} fields[] = {
		{4, 104, 4, 92, 1},            /* components[dec].cross_attention */
		{4, 104, 4, 96, 12},           /* components[dec].memory_width (i64) */
		{4, 104, 2, 92, 0},            /* components[enc] */
		{4, 104, 2, 96, 0},
		{6, 36, 4, 32, 2},             /* nodes[dec].memory */
		{6, 36, 1, 32, 0xffffffffu},   /* nodes[enc].memory: -1 */
		{8, 140, XM_DEC, 124, 6},      /* metaops[dec].mem_seq (i64) */
		{8, 140, XM_DEC, 132, 12},     /* mem_width (i64) */
		{8, 140, XM_MEM, 124, 0},
		{10, 20, 3, 16, 1},            /* edges[3].memory */
		{10, 20, 2, 16, 0},
		{18, 60, 10, 40, 0xffffffffu}, /* instructions[10].dst.layer: -1 */
	};
	for (int i = 0; i < SP_ARRAY_LEN(fields); i++) {
		uint8_t *t = entry_of((uint8_t *)b, fields[i].id);
		uint64_t size = rd64(t + 16), count = rd64(t + 24);
		assert_int_equal(size, count * fields[i].rec_size);
		const uint8_t *r = b + rd64(t + 8) + fields[i].rec * fields[i].rec_size;
		uint64_t got = fields[i].at == 96 || fields[i].at == 124 || fields[i].at == 132
				       ? rd64(r + fields[i].at)
				       : rd32(r + fields[i].at);
		if (got != fields[i].v)
			fail_msg("section %u record %u at %u: expected %llu, got %llu", fields[i].id,
				 fields[i].rec, fields[i].at, (unsigned long long)fields[i].v,
				 (unsigned long long)got);
	}
}

/* The reader's cross-attention rules, one broken field each. */
static void test_xattn_refusals(void **state)
{
	static const struct {
		uint32_t id, rec, at, v;
		const char *path, *msg;
	} cases[] = {
		/* a memory value only on a decoder */
		{18, 3, 24, 0xffffffffu, "instructions[3].src.layer",
		 "layer -1 (the memory) of metaop 'cap/mem', which has none"},
		{18, 10, 40, 0xfffffffeu, "instructions[10].dst.layer", "-2 is outside [-1, 2]"},
		{18, 10, 48, 1, "instructions[10].dst.seq_off",
		 "range [1, 7) is outside the 6 tokens of the value"},
		/* the memory edge */
		{10, 3, 16, 2, "edges[3].memory", "2 is outside [0, 1]"},
		{10, 3, 12, 5, "edges[3].seq_len",
		 "a memory edge carries the whole memory: seq_off 0 and seq_len 6 (got 0 and 5)"},
		{10, 3, 8, 1, "edges[3].seq_len", "(got 1 and 6)"},
		{10, 3, 4, 5, "edges[3].memory",
		 "memory edge into metaop 'cap/loss', which has no memory"},
		{10, 3, 0, 1, "edges[3].src",
		 "metaop 'cap/enc' does not end with node 'mem', the memory of metaop 'cap/dec'"},
		{10, 2, 16, 1, "edges[2].seq_len", "carries the whole memory"},
		/* components: cross_attention 0/1 on transformers, memory_width >= 1
		 * exactly with it */
		{4, 4, 92, 2, "components[4].cross_attention", "2 is outside [0, 1]"},
		{4, 0, 92, 1, "components[0].cross_attention",
		 "embedding components have no 'cross_attention'"},
		{4, 2, 96, 5, "components[2].memory_width",
		 "memory width 5 on a component without cross-attention"},
		{4, 4, 92, 0, "components[4].memory_width",
		 "memory width 12 on a component without cross-attention"},
		{4, 4, 96, 0, "components[4].memory_width", "0 is outside [1, 16777216]"},
		/* nodes: a memory in the task, only on cross-attention nodes; the
		 * model's memory rules (model_check.c) */
		{6, 4, 32, 9, "tasks[0].nodes[4].memory", "node 9 does not exist (there are 6)"},
		{6, 4, 32, 0xffffffffu, "tasks[0].nodes[4].memory", "node -1 does not exist"},
		{6, 1, 32, 2, "tasks[0].nodes[1].memory",
		 "node 'enc' has memory 2, but component 'enc' has no cross-attention"},
		{6, 4, 32, 4, "tasks[0].nodes[4].memory", "node 'dec' is its own memory"},
		{6, 4, 32, 5, "tasks[0].nodes[4].memory", "memory 'loss' is a loss node"},
		{6, 4, 32, 1, "tasks[0].nodes[4].memory",
		 "width mismatch: memory 'enc' has width 16, expected 12"},
		/* metaops: the shape's memory is the nodes' */
		{8, XM_DEC, 124, 7, "ops[5].node",
		 "node 'dec' has a memory of 6 tokens of width 12, metaops[4] one of 7 of width 12"},
		{8, 1, 124, 6, "metaops[1].mem_seq",
		 "a memory of 6 tokens of width 0 (both 0, or both at least 1)"},
		{8, XM_DEC, 124, 0, "metaops[4].mem_seq",
		 "a memory of 0 tokens of width 12 (both 0, or both at least 1)"},
	};
	for (size_t i = 0; i < SP_ARRAY_LEN(cases); i++)
		expect_patch_rejected(*state, cases[i].id, cases[i].rec, cases[i].at, cases[i].v,
				      cases[i].path, cases[i].msg);
	fix_t *f = *state;
	uint8_t *b = malloc(f->len);
	assert_non_null(b);
	/* a memory on a non-transformer, well-formed otherwise */
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 8, 0, 124, 6);
	patch(b, f->len, 8, 0, 132, 16);
	expect_rejected_at(b, f->len, "metaops[0].mem_seq", "a memory on a patch metaop");
	/* a transformer metaop whose nodes have no memory */
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 8, 1, 124, 6);
	patch(b, f->len, 8, 1, 132, 16);
	expect_rejected_at(b, f->len, "ops[1].node",
			   "node 'enc' has a memory of 0 tokens of width 0, metaops[1] one of "
			   "6 of width 16");
	/* the memory edge made an input edge: the decoder has none left */
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 10, 3, 16, 0);
	patch(b, f->len, 10, 3, 12, 5);
	expect_rejected_at(b, f->len, "metaops[4].mem_seq",
			   "decoder metaop 'cap/dec' has no memory edge");
	/* decoders are not split: slice 4 on devices 0 and 1, tp 2 */
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 12, 4, 16, 2);
	patch(b, f->len, 12, 4, 20, 0);
	patch(b, f->len, 12, 4, 60, 2);
	expect_rejected_at(b, f->len, "slices[4].tp",
			   "metaop 'cap/dec' is a cross-attention decoder: decoders are not split");
	/* a copy into the memory checks its width (act(enc, 2) is 16 wide) */
	memcpy(b, f->bin, f->len);
	patch(b, f->len, 18, 3, 0, INS_COPY);
	patch(b, f->len, 18, 3, 20, 1);
	patch(b, f->len, 18, 3, 24, 2);
	patch(b, f->len, 18, 3, 36, XM_DEC);
	patch(b, f->len, 18, 3, 40, 0xffffffffu);
	expect_rejected_at(b, f->len, "instructions[3].dst",
			   "copy between values of widths 16 and 12");
	free(b);
	/* the writer refuses what the reader would: a second memory edge, a
	 * decoder layer's shard */
	sp_plan_t *p = &f->plan;
	sp_err_t err;
	uint8_t *out = NULL;
	size_t n = 0;
	sp_edge_t *e = realloc(p->edges, sizeof *e * (size_t)(p->n_edges + 1));
	assert_non_null(e);
	p->edges = e;
	p->edges[p->n_edges++] = p->edges[3];
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&out, &n, p, &err), SP_EINTERNAL);
	assert_non_null(strstr(err.msg, "edges[5].dst: a second memory edge into metaop 'cap/dec'"));
	p->n_edges--;
	NEW(p->held, 1);
	p->n_held = 1;
	p->held[0] = (sp_param_t){4, 0, 2, 1}; /* dec layer 0, shard 1 of 2 */
	memset(&err, 0, sizeof err);
	assert_int_equal(plan_encode(&out, &n, p, &err), SP_EINTERNAL);
	assert_non_null(strstr(err.msg, "held[0].tp: component 'dec' has cross-attention: "
					"decoders are not split"));
	assert_null(out);
}

/*
 * With --write-xattn PATH, writes the encoder-decoder plan to PATH and exits
 * (tests/tools runs spindle-show on it while the planner cannot yet plan
 * decoders).
 */
static int write_xattn(const char *path)
{
	sp_plan_t p;
	sp_err_t err;
	memset(&err, 0, sizeof err);
	make_xattn_plan(&p);
	int rc = plan_write(&p, path, &err);
	if (rc)
		sp_err_print(stderr, &err);
	plan_release(&p);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-xattn"))
		return write_xattn(argv[2]);
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
#define X(name) cmocka_unit_test_setup_teardown(name, setup_xattn, teardown)
	const struct CMUnitTest tests[] = {
		T(test_round_trip),
		T(test_layout),
		T(test_truncations),
		T(test_bit_flips_checksum),
		T(test_bit_flips_validated),
		T(test_version_and_magic),
		T(test_sections),
		T(test_unknown_and_duplicate_sections),
		T(test_indices),
		T(test_zero2_read),
		T(test_tp_fields),
		T(test_model_rules_shared),
		T(test_encode_refuses_invalid),
		T(test_files),
		T(test_util),
		X(test_round_trip),
		X(test_truncations),
		X(test_bit_flips_validated),
		X(test_xattn_fields),
		X(test_xattn_layout),
		X(test_xattn_refusals),
	};
#undef T
#undef X
	return cmocka_run_group_tests(tests, NULL, NULL);
}
