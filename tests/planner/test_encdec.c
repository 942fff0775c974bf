/*
 * test_encdec.c — the planner plans encoder-decoder models (issue #20) on
 * tests/planner/encdec: a captioning task (image encoder, text decoder
 * attending to it: memory width 64, decoder hidden 32, mem_seq 16, seq 8)
 * and a summarising task (text encoder projected to 64 as the memory of the
 * same decoder component, split over two nodes: mem_seq 24, seq 6).
 *
 * For every algorithm, under the default options, a forced --tp 2,
 * --microbatches 2, --recompute all and the three together: the plan
 * verifies (verify_plan), decoders run whole layers (tp 1) and the
 * memory's lowering follows the contract on every device (check_memory):
 * act(c, -1) is written once per sample of the union of the device's
 * slots of c, from act(p, L_p), before its first FWD of c; grad(c, -1)
 * leaves once to each holder of p's samples, after its last BWD of c, and
 * arrives before p's BWD; devices without slots of c move neither. Two
 * runs give the same bytes (plan_encode). A hand-made schedule puts two
 * slices of one decoder on one device over disjoint ranges (a union of
 * two intervals, one of them local to the encoder's device) and checks the
 * exact transfers. The placer counts a decoder's memory buffers once per
 * device; a profiled decoder shape matches on its memory's size. Prints
 * ours' and the sequential iteration (ms). DUMP=1 prints the hand-made
 * plan's programs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

typedef struct {
	sp_model_t model;
	sp_cluster_t cluster;
} inputs_t;

static void load_inputs(inputs_t *in)
{
	char mp[4096], cp[4096];
	const char *root = getenv("SPINDLE_ROOT");
	root = root && *root ? root : SPINDLE_ROOT;
	snprintf(mp, sizeof mp, "%s/tests/planner/encdec/model.json", root);
	snprintf(cp, sizeof cp, "%s/tests/planner/encdec/cluster-2x4.json", root);
	sp_err_t err = {0};
	memset(in, 0, sizeof *in);
	if (model_load(&in->model, mp, &err) || cluster_load(&in->cluster, cp, &err))
		print_message("%s\n", err.msg);
	assert_int_equal(err.code, 0);
}

static void release_inputs(inputs_t *in)
{
	model_release(&in->model);
	cluster_release(&in->cluster);
}

static void default_opts(plan_opts_t *o, const sp_cluster_t *c)
{
	memset(o, 0, sizeof *o);
	o->algo = ALGO_SPINDLE;
	o->placement = PLACE_SPINDLE;
	o->mem_reserve_gib = SP_MIN(2.0, 0.1 * c->memory_gib);
	o->milp_nodes = 200;
	o->zero = -1;
	o->recompute = -1;
}

/* ---- the memory's lowering, on any plan ---------------------------------- */

typedef struct {
	int decoders;    /* (decoder, device) pairs with slots */
	int multi_slot;  /* of those, with 2 or more slots */
	int gaps;        /* of those, whose union is 2 or more intervals */
	int local;       /* memory COPYs (the encoder's output on the device) */
	int received;    /* memory RECVs */
} mem_stats_t;

static int64_t batch_of(const sp_plan_t *p, int m)
{
	return p->model.tasks[p->metaops[m].task].batch;
}

static int is_vref(const sp_vref_t *v, int m, int l, int g)
{
	return v->metaop == m && v->layer == l && v->grad == g && v->seq_off == 0;
}

/* The slot of device d in slice i, or -1. */
static int slot_of(const sp_plan_t *p, int i, int d)
{
	const sp_slice_t *sl = &p->slices[i];
	for (int q = 0; q < sl->n_dev; q++)
		if (p->slice_devs[sl->dev_off + q] == d)
			return q;
	return -1;
}

static void slot_range(const sp_plan_t *p, int i, int q, int32_t *a, int32_t *b)
{
	const sp_slice_t *sl = &p->slices[i];
	sample_range(batch_of(p, sl->metaop), q / sl->tp, sl->n_dev / sl->tp, a, b);
}

/* Decoder c (memory edge e) on device d. */
static void check_device(const sp_plan_t *p, int c, const sp_edge_t *e, int d, mem_stats_t *st)
{
	const sp_metaop_t *mc = &p->metaops[c];
	int pm = e->src, Lp = p->metaops[pm].n_layers, last_p = -1;
	int64_t B = batch_of(p, c);
	for (int i = 0; i < p->n_slices; i++)
		if (p->slices[i].metaop == pm)
			last_p = i;
	assert_true(last_p >= 0);
	int *in_union = calloc((size_t)B, sizeof(int)), *got = calloc((size_t)B, sizeof(int));
	int *sent = calloc((size_t)B, sizeof(int)), *want_sent = calloc((size_t)B, sizeof(int));
	assert_true(in_union && got && sent && want_sent);
	int slots = 0;
	for (int i = 0; i < p->n_slices; i++) {
		int q = p->slices[i].metaop == c ? slot_of(p, i, d) : -1;
		if (q < 0)
			continue;
		assert_int_equal(p->slices[i].tp, 1); /* decoders are never split */
		int32_t a, b;
		slot_range(p, i, q, &a, &b);
		for (int32_t s = a; s < b; s++)
			in_union[s] = 1;
		slots++;
	}
	/* every holder of p's samples (each member of a tp group) gets grad(c, -1) */
	const sp_slice_t *lp = &p->slices[last_p];
	for (int q = 0; q < lp->n_dev; q++) {
		int32_t a, b;
		slot_range(p, last_p, q, &a, &b);
		for (int32_t s = a; s < b; s++)
			want_sent[s] += in_union[s];
	}
	const sp_device_t *dv = &p->devices[d];
	int first_fwd = -1, last_bwd = -1;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if ((in->op == INS_FWD || in->op == INS_BWD) && p->slices[in->slice].metaop == c) {
			if (in->op == INS_FWD && first_fwd < 0)
				first_fwd = k;
			if (in->op == INS_BWD)
				last_bwd = k;
		}
	}
	assert_int_equal(first_fwd >= 0, slots > 0);
	assert_int_equal(last_bwd >= 0, slots > 0);
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if ((in->op == INS_RECV || in->op == INS_COPY) && in->dst.metaop == c &&
		    in->dst.layer == -1 && !in->dst.grad) {
			/* the memory in: from act(p, L_p), before the first FWD */
			assert_true(is_vref(&in->src, pm, Lp, 0));
			assert_true(is_vref(&in->dst, c, -1, 0));
			assert_int_equal(in->seq_len, mc->shape.mem_seq);
			assert_true(first_fwd >= 0 && k < first_fwd);
			for (int32_t s = in->s0; s < in->s1; s++)
				got[s]++;
			st->local += in->op == INS_COPY;
			st->received += in->op == INS_RECV;
		}
		if ((in->op == INS_SEND || in->op == INS_COPY) && in->src.metaop == c &&
		    in->src.layer == -1) {
			/* its gradient out: into grad(p, L_p), after the last BWD */
			assert_true(is_vref(&in->src, c, -1, 1));
			assert_true(is_vref(&in->dst, pm, Lp, 1));
			assert_int_equal(in->seq_len, mc->shape.mem_seq);
			assert_true(last_bwd >= 0 && k > last_bwd);
			for (int32_t s = in->s0; s < in->s1; s++)
				sent[s]++;
		}
		if ((in->op == INS_RECV || in->op == INS_COPY) && in->src.metaop == c &&
		    in->src.layer == -1) {
			/* received by p's holder before its BWD of p's last slice */
			int bwd = -1;
			for (int j = k + 1; j < dv->n_ins && bwd < 0; j++)
				if (p->ins[dv->first_ins + j].op == INS_BWD &&
				    p->ins[dv->first_ins + j].slice == last_p)
					bwd = j;
			assert_true(bwd > k);
		}
	}
	/* local gradient COPYs run on the holder (this device too): count
	 * them where they are, with the SENDs of this device */
	for (int64_t s = 0; s < B; s++) {
		assert_int_equal(got[s], in_union[s]);
		assert_int_equal(sent[s], want_sent[s]);
	}
	if (slots) {
		int runs = 0;
		for (int64_t s = 0; s < B; s++)
			runs += in_union[s] && (s == 0 || !in_union[s - 1]);
		st->decoders++;
		st->multi_slot += slots > 1;
		st->gaps += runs > 1;
	}
	free(in_union);
	free(got);
	free(sent);
	free(want_sent);
}

/* Every decoder on every device; the plan also verifies. */
static void check_memory(const sp_plan_t *p, mem_stats_t *st)
{
	sp_err_t err = {0};
	int rc = verify_plan(p, 0, &err);
	if (rc)
		print_message("verify: %s\n", err.msg);
	assert_int_equal(rc, 0);
	int n_dec = 0;
	for (int e = 0; e < p->n_edges; e++) {
		const sp_edge_t *ed = &p->edges[e];
		if (!ed->memory)
			continue;
		n_dec++;
		assert_true(p->metaops[ed->dst].shape.mem_seq > 0);
		for (int d = 0; d < p->n_devices; d++)
			check_device(p, ed->dst, ed, d, st);
	}
	assert_int_equal(n_dec, 2); /* one per task */
}

/* ---- every algorithm under every option set ------------------------------- */

static const char *const ALGOS[] = {"spindle", "spindle-paper", "sequential", "task-level",
				    "distmm-mt"};

typedef struct {
	const char *name;
	int tp, microbatches, recompute;
} optset_t;

static const optset_t OPTSETS[] = {
	{"default", 0, 0, -1},
	{"--tp 2", 2, 0, -1},
	{"--microbatches 2", 0, 2, -1},
	{"--recompute all", 0, 0, 1},
	{"--tp 2 --microbatches 2 --recompute all", 2, 2, 1},
};

static int plan_once(const inputs_t *in, const plan_opts_t *o, sp_plan_t *out,
		     plan_summary_t *sum)
{
	sp_err_t err = {0};
	int rc = planner_run(o, &in->model, &in->cluster, out, sum, &err);
	if (rc)
		print_message("planner_run: %s\n", err.msg);
	return rc;
}

/*
 * Under recomputation the report's saving of each decoder MetaOp (layout_json:
 * saved_bytes_per_device, its worst slice) is what a decoder layer saves,
 * its cross-attention's part included, less the layer input it keeps:
 * (op_saved_elems - seq * hidden) * dtype bytes * the slice's local batch *
 * its layers. The cross-attention part alone must show in it.
 */
static void check_decoder_saving(const sp_plan_t *p)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	layout_json(f, p, 0);
	fclose(f);
	int db = dtype_bytes(p->model.dtype);
	for (int m = 0; m < p->n_metaops; m++) {
		const sp_metaop_t *mo = &p->metaops[m];
		if (mo->shape.mem_seq == 0)
			continue;
		int64_t B = p->model.tasks[mo->task].batch;
		double want = 0, xpart = 0;
		for (int i = 0; i < p->n_slices; i++) {
			const sp_slice_t *sl = &p->slices[i];
			if (sl->metaop != m || !sl->recompute)
				continue;
			int64_t local = (B + sl->n_dev - 1) / sl->n_dev, L = sl->layer_to - sl->layer_from;
			double per = (double)(op_saved_elems(&mo->shape, B) -
					      mo->shape.seq * mo->shape.hidden);
			want = fmax(want, per * db * (double)local * (double)L);
			xpart = fmax(xpart, (double)(op_saved_elems(&mo->shape, B) -
						     op_saved_elems_tp(&mo->shape, B, 1)) *
						    db * (double)local * (double)L);
		}
		char key[sizeof mo->name + 16];
		snprintf(key, sizeof key, "{\"name\": \"%s\"", mo->name);
		const char *at = strstr(buf, key), *sv = at ? strstr(at, "\"saved_bytes_per_device\": ") : NULL;
		assert_non_null(sv);
		double got = strtod(sv + strlen("\"saved_bytes_per_device\": "), NULL);
		assert_true(xpart > 0);
		assert_true(fabs(got - want) < 0.5);
	}
	free(buf);
}

static void test_every_algorithm(void **state)
{
	(void)state;
	inputs_t in;
	load_inputs(&in);
	mem_stats_t st = {0};
	int split = 0;
	for (size_t a = 0; a < sizeof ALGOS / sizeof *ALGOS; a++)
		for (size_t v = 0; v < sizeof OPTSETS / sizeof *OPTSETS; v++) {
			const optset_t *os = &OPTSETS[v];
			plan_opts_t o;
			default_opts(&o, &in.cluster);
			assert_int_equal(algo_parse(ALGOS[a], &o.algo), 0);
			o.tp = os->tp;
			o.microbatches = os->microbatches;
			o.recompute = os->recompute;
			sp_plan_t p = {0}, q = {0};
			plan_summary_t sum, sum2;
			assert_int_equal(plan_once(&in, &o, &p, &sum), 0);
			check_memory(&p, &st);
			if (os->microbatches)
				assert_int_equal(p.microbatches, os->microbatches);
			for (int i = 0; i < p.n_slices; i++) {
				const sp_slice_t *sl = &p.slices[i];
				split += sl->tp > 1;
				if (os->recompute == 1 && p.metaops[sl->metaop].shape.mem_seq > 0)
					assert_int_equal(sl->recompute, 1);
			}
			if (os->recompute == 1)
				check_decoder_saving(&p);
			/* the same inputs: the same bytes (plan format 4) */
			assert_int_equal(plan_once(&in, &o, &q, &sum2), 0);
			uint8_t *b1 = NULL, *b2 = NULL;
			size_t n1 = 0, n2 = 0;
			sp_err_t err = {0};
			if (plan_encode(&b1, &n1, &p, &err) || plan_encode(&b2, &n2, &q, &err))
				print_message("plan_encode: %s\n", err.msg);
			assert_int_equal(err.code, 0);
			assert_int_equal(n1, n2);
			assert_memory_equal(b1, b2, n1);
			free(b1);
			free(b2);
			print_message("%-13s %-40s iteration %8.3f ms (sequential %8.3f ms)\n",
				      ALGOS[a], os->name, p.cert.iteration_ms,
				      sum.algos[ALGO_SEQUENTIAL].iteration_ms);
			plan_release(&p);
			plan_release(&q);
		}
	print_message("memory lowered on %d (decoder, device) pairs: %d with several slots, "
		      "%d over disjoint ranges; %d RECVs, %d local COPYs\n",
		      st.decoders, st.multi_slot, st.gaps, st.received, st.local);
	assert_true(split > 0); /* --tp 2 split the encoders */
	assert_true(st.multi_slot > 0 && st.received > 0);
	release_inputs(&in);
}

/* The planner on the bundled inputs as the hand-made tests below set it
 * up: 8 devices, one micro-step, mem_cap, graph, costs and layouts built
 * (h stays where it is: pl points into it). */
typedef struct {
	inputs_t in;
	plan_opts_t o;
	sp_err_t err;
	planner_t pl;
} hand8_t;

static planner_t *hand8_up(hand8_t *h, double mem_cap)
{
	load_inputs(&h->in);
	default_opts(&h->o, &h->in.cluster);
	memset(&h->err, 0, sizeof h->err);
	h->pl = (planner_t){.model = &h->in.model, .cluster = &h->in.cluster, .opts = &h->o,
			    .err = &h->err, .k = 1};
	sp_arena_init(&h->pl.arena);
	sp_arena_init(&h->pl.scratch);
	h->pl.N = 8;
	h->pl.mem_cap = mem_cap;
	assert_int_equal(graph_build(&h->pl), 0);
	assert_int_equal(cost_build(&h->pl), 0);
	assert_int_equal(layout_prepare(&h->pl), 0);
	return &h->pl;
}

static void hand8_down(hand8_t *h)
{
	sp_arena_release(&h->pl.scratch);
	sp_arena_release(&h->pl.arena);
	release_inputs(&h->in);
}

/* ---- a hand-made schedule ---------------------------------------------------- */

/*
 * caption: img_in, img on {0, 3} (device 3 holds samples [8, 16) of the
 * encoder's output); the decoder's layer 0 on {3, 4, 5, 6}, layer 1 on
 * {1, 2, 3, 4}: device 3 holds [0, 4) and [8, 12) of the decoder (two
 * intervals: [0, 4) comes from device 0, [8, 12) is local), device 4
 * [4, 8) and [12, 16) (both received). summarize: the decoder on device 7 alone, the memory
 * on device 6.
 */
static void test_hand_schedule(void **state)
{
	(void)state;
	hand8_t h;
	planner_t *pl = hand8_up(&h, 1e12);
	static const struct {
		const char *mop;
		int lf, lt, n;
		int32_t devs[4];
	} rows[] = {
		{"caption/img_in", 0, 1, 2, {0, 3}},
		{"caption/img", 0, 2, 2, {0, 3}},
		{"caption/txt_in", 0, 1, 1, {5}},
		{"caption/dec", 0, 1, 4, {3, 4, 5, 6}},
		{"caption/dec", 1, 2, 4, {1, 2, 3, 4}},
		{"caption/loss", 0, 1, 4, {1, 2, 3, 4}},
		{"summarize/doc_in", 0, 1, 1, {5}},
		{"summarize/doc", 0, 2, 2, {5, 6}},
		{"summarize/mem", 0, 1, 1, {6}},
		{"summarize/txt_in", 0, 1, 1, {7}},
		{"summarize/dec_lo..dec_hi", 0, 2, 1, {7}},
		{"summarize/loss", 0, 1, 1, {7}},
	};
	sched_t s;
	sched_init(&s, ALGO_SPINDLE, &pl->scratch);
	for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
		int m = -1;
		for (int k = 0; k < pl->n_mops; k++)
			if (!strcmp(pl->mops[k].name, rows[r].mop))
				m = k;
		assert_true(m >= 0);
		assert_int_equal(sched_push_devs(&s, m, rows[r].lf, rows[r].lt, rows[r].n,
						 (double)r, (double)r + 1, rows[r].devs),
				 0);
	}
	assert_int_equal(sched_finish(&s), 0);
	place_t pc;
	assert_int_equal(place_run(pl, &s, PLACE_SPINDLE, &pc), 0);
	sp_plan_t p = {0};
	assert_int_equal(lower_run(pl, &s, &pc, &p), 0);
	mem_stats_t st = {0};
	check_memory(&p, &st);
	/* devices 3 ([0, 4), [8, 12)) and 4 ([4, 8), [12, 16)) */
	assert_int_equal(st.multi_slot, 2);
	assert_int_equal(st.gaps, 2);
	assert_int_equal(st.local, 1);  /* device 3's [8, 12) */
	/* from device 0 to 1, 2, 3, 4; from 3 to 4, 5, 6; from 6 to 7 */
	assert_int_equal(st.received, 8);
	/* device 3's memory: RECV [0, 4) from device 0, COPY [8, 12) */
	int c = p.slices[3].metaop, recv = 0, copy = 0;
	const sp_device_t *dv = &p.devices[3];
	if (getenv("DUMP"))
		for (int d = 0; d < p.n_devices; d++)
			for (int k = 0; k < p.devices[d].n_ins; k++) {
				const sp_ins_t *x = &p.ins[p.devices[d].first_ins + k];
				print_message("dev %d %2d %-5s sl %2d [%2d,%2d) len %2d src %d/%d/%d "
					      "dst %d/%d/%d peer %d tag %d\n",
					      d, k, ins_op_name(x->op), x->slice, x->s0, x->s1,
					      x->seq_len, x->src.metaop, x->src.layer, x->src.grad,
					      x->dst.metaop, x->dst.layer, x->dst.grad, x->peer, x->tag);
			}
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *x = &p.ins[dv->first_ins + k];
		if ((x->op != INS_RECV && x->op != INS_COPY) || x->dst.metaop != c ||
		    x->dst.layer != -1 || x->dst.grad)
			continue;
		if (x->op == INS_RECV) {
			assert_int_equal(x->peer, 0);
			assert_int_equal(x->s0, 0);
			assert_int_equal(x->s1, 4);
			recv++;
		} else {
			assert_int_equal(x->op, INS_COPY);
			assert_int_equal(x->s0, 8);
			assert_int_equal(x->s1, 12);
			copy++;
		}
	}
	assert_int_equal(recv, 1);
	assert_int_equal(copy, 1);
	plan_release(&p);
	hand8_down(&h);
}

/* The placer counts a decoder's memory buffers (act(c, -1), grad(c, -1):
 * 2 x local x mem_seq x mem_width x dtype bytes) once per device: a second
 * slice of the decoder on the same device adds only its own activations
 * and state. Devices fit at a cap half a byte above the sum, not below. */
static void test_placer_memory(void **state)
{
	(void)state;
	hand8_t h;
	planner_t *pl = hand8_up(&h, 0);
	int c = -1;
	for (int k = 0; k < pl->n_mops; k++)
		if (!strcmp(pl->mops[k].name, "caption/dec"))
			c = k;
	assert_true(c >= 0);
	const metaop_t *mo = &pl->mops[c];
	double mem = 2.0 * 16 * (double)mo->shape.mem_seq * (double)mo->shape.mem_width * 4;
	double base = 16 * layout_saved_per_sample(pl, c) + layout_state_bytes(pl, c, 1);
	assert_true(mem > 1 && base > 1);
	placer_t *P = NULL;
	assert_int_equal(placer_new(&P, pl, PLACE_SPINDLE), 0);
	sslice_t a = {c, 0, 1, 1, 0, 0, 1, 0, -1, 0}, b = {c, 1, 2, 1, 0, 1, 2, 0, -1, 0};
	pl->mem_cap = base + mem - 0.5;
	assert_int_equal(placer_fitting(P, &a, NULL), 0);
	pl->mem_cap = base + mem + 0.5;
	assert_int_equal(placer_fitting(P, &a, NULL), 8);
	int32_t dev0 = 0;
	placer_commit(P, &a, &dev0);
	/* device 0 holds a's state, activations and the memory: b adds base */
	pl->mem_cap = 2 * base + mem + 0.5;
	assert_int_equal(placer_fitting(P, &b, NULL), 8);
	pl->mem_cap = 2 * base + mem - 0.5;
	assert_int_equal(placer_fitting(P, &b, NULL), 7);
	/* all of a device's samples: x on {2, 3} puts samples [8, 16)
	 * on device 3; y's first slot, [0, 8), fits on device 2 (its memory
	 * counted already) but not on device 3, whose buffers must grow to
	 * all 16 samples (counting the largest slot alone would let it fit) */
	double half = mem / 2, base8 = 8 * layout_saved_per_sample(pl, c) +
				       layout_state_bytes(pl, c, 2);
	sslice_t x = {c, 0, 1, 2, 0, 2, 3, 0, -1, 0}, y = {c, 1, 2, 2, 0, 3, 4, 0, -1, 0};
	int32_t devs23[2] = {2, 3};
	placer_commit(P, &x, devs23);
	pl->mem_cap = 2 * base8 + half + 0.5;
	int fit_y = placer_fitting(P, &y, NULL);
	/* devices 1 and 4-7 are empty (they need base8 + half), 2 holds x;
	 * 0 (a's 16 samples) and 3 are over */
	assert_int_equal(fit_y, 6);
	pl->mem_cap = 2 * base8 + 2 * half + 0.5;
	assert_int_equal(placer_fitting(P, &y, NULL), fit_y + 1);
	/* a gap: the buffers cover the span from the lowest to the highest
	 * sample (plan_mem.c, the runtime), not the union. On a fresh placer,
	 * z on {4, 5, 6, 7} (4 samples each); w's first slot, [0, 4), widens
	 * device 7's span [12, 16) to [0, 16): 12 samples more, not 4 */
	placer_t *Q = NULL;
	assert_int_equal(placer_new(&Q, pl, PLACE_SPINDLE), 0);
	double q = mem / 16, b4 = 4 * layout_saved_per_sample(pl, c) +
				  layout_state_bytes(pl, c, 4);
	sslice_t z = {c, 0, 1, 4, 0, 0, 1, 0, -1, 0}, w = {c, 1, 2, 4, 0, 1, 2, 0, -1, 0};
	int32_t devs47[4] = {4, 5, 6, 7};
	placer_commit(Q, &z, devs47);
	/* 0-3: b4 + 4q; 4: 2 b4 + 4q; 5: + 8q; 6: + 12q; 7: + 16q (union: 8q) */
	pl->mem_cap = 2 * b4 + 12 * q + 0.5;
	assert_int_equal(placer_fitting(Q, &w, NULL), 7);
	pl->mem_cap = 2 * b4 + 16 * q - 0.5;
	assert_int_equal(placer_fitting(Q, &w, NULL), 7);
	pl->mem_cap = 2 * b4 + 16 * q + 0.5;
	assert_int_equal(placer_fitting(Q, &w, NULL), 8);
	hand8_down(&h);
}

/* The placer's choice (placer_choose) and count (placer_fitting) for a
 * MetaOp without memory buffers (caption/img, 2 layers), on 2 nodes of 4:
 * a on devices 6 and 7 holds both layers' state (2 st), and b, the same
 * layers on 2 devices after it, needs act of activations per device and
 * the state where it is not held. b goes to 6 and 7 (best scored, though
 * not the node's lowest devices). */
static void test_placer_choose(void **state)
{
	(void)state;
	hand8_t h;
	planner_t *pl = hand8_up(&h, 1e15);
	assert_int_equal(h.in.cluster.gpus_per_node, 4);
	int c = -1;
	for (int k = 0; k < pl->n_mops; k++)
		if (!strcmp(pl->mops[k].name, "caption/img"))
			c = k;
	assert_true(c >= 0 && pl->mops[c].n_layers >= 2 && pl->mops[c].shape.mem_seq == 0);
	double act = 2 * 8 * layout_saved_per_sample(pl, c), st = layout_state_bytes(pl, c, 2);
	assert_int_equal(pl->mops[c].batch, 16);
	assert_true(act > 1 && st > 1);
	placer_t *P = NULL;
	assert_int_equal(placer_new(&P, pl, PLACE_SPINDLE), 0);
	sslice_t a = {c, 0, 2, 2, 0, 0, 1, 0, -1, 0}, b = {c, 0, 2, 2, 0, 1, 2, 0, -1, 0};
	int32_t devs67[2] = {6, 7}, got[2] = {-1, -1};
	placer_commit(P, &a, devs67);
	assert_int_equal(placer_choose(P, &b, got), 2);
	assert_int_equal(got[0], 6);
	assert_int_equal(got[1], 7);
	/* 6 and 7 need act more (2 act + 2 st in all), the others act + 2 st */
	pl->mem_cap = act + 0.5 * st;
	assert_int_equal(placer_fitting(P, &b, NULL), 0);
	pl->mem_cap = act + 2 * st + 0.5;
	assert_int_equal(placer_fitting(P, &b, NULL), 6);
	pl->mem_cap = 2 * act + 2 * st + 0.5;
	assert_int_equal(placer_fitting(P, &b, NULL), 8);
	/* 7 devices where 6 fit (0-5): the nodes' fitting ones, then by
	 * score, over the cap (6 and 7 alike: the lower) */
	sslice_t w = {c, 0, 2, 7, 0, 1, 2, 0, -1, 0};
	int32_t wide[7];
	pl->mem_cap = act + 2 * st + 0.5;
	assert_int_equal(placer_choose(P, &w, wide), 6);
	for (int j = 0; j < 7; j++)
		assert_int_equal(wide[j], j);
	hand8_down(&h);
}

/* A profiled decoder shape matches on mem_seq and mem_width too: the
 * profile's time (2 ms forward, 5 backward at batch 16: T(1)) is caption's
 * decoder's; the same entry with another mem_seq matches nothing. */
static void test_profiled_decoder(void **state)
{
	(void)state;
	for (int other = 0; other < 2; other++) {
		inputs_t in;
		load_inputs(&in);
		plan_opts_t o;
		default_opts(&o, &in.cluster);
		sp_err_t err = {0};
		planner_t pl = {.model = &in.model, .cluster = &in.cluster, .opts = &o, .err = &err,
				.k = 1};
		sp_arena_init(&pl.arena);
		sp_arena_init(&pl.scratch);
		pl.N = 8;
		assert_int_equal(graph_build(&pl), 0);
		int c = -1;
		for (int k = 0; k < pl.n_mops; k++)
			if (!strcmp(pl.mops[k].name, "caption/dec"))
				c = k;
		assert_true(c >= 0);
		in.cluster.prof = calloc(1, sizeof *in.cluster.prof);
		assert_non_null(in.cluster.prof);
		in.cluster.n_prof = 1;
		sp_prof_entry_t *e = in.cluster.prof;
		e->shape = pl.mops[c].shape;
		e->shape.mem_seq += other;
		e->n_points = 1;
		e->points = calloc(1, sizeof *e->points);
		assert_non_null(e->points);
		e->points[0] = (sp_prof_point_t){16, 2.0, 5.0};
		assert_int_equal(cost_build(&pl), 0);
		assert_int_equal(pl.mops[c].profiled, !other);
		if (!other) {
			assert_true(fabs(pl.mops[c].tf[1] - 2.0) < 1e-12);
			assert_true(fabs(pl.mops[c].tb[1] - 5.0) < 1e-12);
		}
		sp_arena_release(&pl.scratch);
		sp_arena_release(&pl.arena);
		release_inputs(&in);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_profiled_decoder),
		cmocka_unit_test(test_placer_memory),
		cmocka_unit_test(test_placer_choose),
		cmocka_unit_test(test_hand_schedule),
		cmocka_unit_test(test_every_algorithm),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
