/*
 * test_bwd_order.c — the lowering's eager backward order (lower_xfer.c,
 * sched_t.bwd_eager) on a hand-made schedule of 2 devices. Task t1 (an
 * embedding, 8 layers of 'a', a classifier) runs on device 0; task t2 runs
 * its encoder x (8 layers of 'a') on device 0 after t1, and a transformer
 * z (4 layers of 'c') that joins x with y on device 1. In the
 * reverse order device 0 runs x's backward first, which waits for z's
 * backward on device 1, and t1's backward after it; in the eager order
 * t1's backward, whose gradients are in as soon as its loss ran, runs
 * while device 0 waits. Both plans must pass the verifier (no deadlock,
 * every gradient complete), and the eager one must be faster.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "plan_verify.h"
#include "planner.h"
#include "hand_inputs.h"

#include <stdlib.h>
#include <string.h>

static const char CLUSTER[] =
	"{\"format\": \"spindle.cluster/1\", \"name\": \"two\", \"nodes\": 1,"
	" \"gpus_per_node\": 2,"
	" \"gpu\": {\"name\": \"g\", \"memory_gib\": 80, \"peak_tflops\": 100,"
	" \"mem_bandwidth_gbs\": 2000},"
	" \"links\": {\"intra_node_gbs\": 200, \"intra_node_latency_us\": 3,"
	" \"inter_node_gbs\": 10, \"inter_node_latency_us\": 10}}";

static const char MODEL[] =
	"{'format': 'spindle.model/1', 'name': 'order', 'components': {"
	"'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 512, 'max_seq': 16},"
	"'a': {'type': 'transformer', 'layers': 8, 'hidden': 512, 'heads': 8, 'ffn': 8192},"
	"'b': {'type': 'transformer', 'layers': 1, 'hidden': 512, 'heads': 8, 'ffn': 64},"
	"'c': {'type': 'transformer', 'layers': 4, 'hidden': 512, 'heads': 8, 'ffn': 8192},"
	"'cls': {'type': 'classifier', 'hidden': 512, 'classes': 4}},"
	"'tasks': ["
	"{'name': 't1', 'batch': 8, 'graph': [{'id': 'src', 'component': 'emb', 'seq': 8},"
	" {'id': 'e', 'component': 'a', 'seq': 8, 'inputs': ['src']},"
	" {'id': 'loss', 'component': 'cls', 'inputs': ['e']}]},"
	"{'name': 't2', 'batch': 8, 'graph': [{'id': 'sa', 'component': 'emb', 'seq': 8},"
	" {'id': 'x', 'component': 'a', 'seq': 8, 'inputs': ['sa']},"
	" {'id': 'sb', 'component': 'emb', 'seq': 8},"
	" {'id': 'y', 'component': 'b', 'seq': 8, 'inputs': ['sb']},"
	" {'id': 'z', 'component': 'c', 'seq': 16, 'inputs': ['x', 'y']},"
	" {'id': 'loss', 'component': 'cls', 'inputs': ['z']}]}]}";

/* The MetaOp named name. */
static int mop_named(const planner_t *pl, const char *name)
{
	int k = 0;
	while (k < pl->n_mops && strcmp(pl->mops[k].name, name))
		k++;
	if (k == pl->n_mops)
		print_message("no MetaOp '%s'\n", name);
	assert_true(k < pl->n_mops);
	return k;
}

/* The position in device d's program of the BWD of slice i. */
static int bwd_pos(const sp_plan_t *p, int d, int i)
{
	const sp_device_t *dv = &p->devices[d];
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op == INS_BWD && in->slice == i)
			return k;
	}
	fail_msg("device %d runs no BWD of slice %d", d, i);
	return -1;
}

static void test_eager_backward(void **state)
{
	(void)state;
	hand_t h;
	hand_planner(&h, MODEL, CLUSTER, 2, 0);
	planner_t *pl = &h.pl;

	/* slices in forward order (by t0), each on one device */
	static const struct {
		const char *mop;
		int dev;
		double t0;
	} SL[] = {{"t1/src", 0, 0},  {"t2/sb", 1, 0},  {"t1/e", 0, 1},    {"t2/y", 1, 1},
		  {"t1/loss", 0, 2}, {"t2/sa", 0, 3},  {"t2/x", 0, 4},    {"t2/z", 1, 5},
		  {"t2/loss", 1, 6}};
	enum { NS = sizeof SL / sizeof SL[0], E = 2, X = 6 };
	int32_t devs[NS], off[NS];
	place_t pc = {devs, off};
	double ms[2] = {0};
	int pos_e[2], pos_x[2];
	for (int eager = 0; eager < 2; eager++) {
		sched_t s;
		sp_plan_t p;
		sim_result_t res;
		sched_init(&s, ALGO_SPINDLE, &pl->scratch);
		for (int i = 0; i < NS; i++) {
			int m = mop_named(pl, SL[i].mop);
			assert_int_equal(sched_push(&s, m, 0, pl->mops[m].n_layers, 1, i, SL[i].t0,
						    SL[i].t0 + 1),
					 0);
			devs[i] = SL[i].dev;
			off[i] = i;
		}
		s.n_waves = NS; /* a wave per slice */
		s.bwd_eager = eager;
		int rc = lower_run(pl, &s, &pc, &p);
		if (!rc)
			rc = memplan_run(pl, &p, 0);
		if (rc)
			print_message("lowering: %s\n", h.err.msg);
		assert_int_equal(rc, 0);
		rc = verify_plan(&p, pl->mem_cap, &h.err);
		if (rc)
			print_message("verify: %s\n", h.err.msg);
		assert_int_equal(rc, 0);
		assert_int_equal(sim_run(pl, &p, 1, &res), 0);
		ms[eager] = res.iteration_ms;
		pos_e[eager] = bwd_pos(&p, 0, E);
		pos_x[eager] = bwd_pos(&p, 0, X);
		plan_release(&p);
	}
	print_message("iteration: %.4f ms in the reverse order, %.4f ms eager\n", ms[0], ms[1]);
	/* reverse: x (forwarded last on device 0) first; eager: t1's e first */
	assert_true(pos_x[0] < pos_e[0]);
	assert_true(pos_e[1] < pos_x[1]);
	assert_true(ms[1] < ms[0]);
	hand_done(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_eager_backward),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
