/*
 * test_align.c — the node-aligned renumbering of a placement
 * (planner/align.c) on a hand-made case: 3 nodes of 4 GPUs with a NIC per
 * GPU, two tasks sharing a large transformer 'a' and a third with a small
 * one 'b', placed so that a's replica group (devices 1-8) has 3, 4 and 1
 * GPUs on the three nodes and b's (0, 9-11) 1 and 3. Renumbered, each
 * group must fill whole nodes, every slice keep its size and the slices
 * together the same devices, and a's all-reduce, priced by net.c, must be
 * faster by more than half: before, the node holding one of a's GPUs
 * offers its ring one NIC; after, every node offers four.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "hand_inputs.h"

#include <stdlib.h>
#include <string.h>

static const char CLUSTER[] =
	"{\"format\": \"spindle.cluster/1\", \"name\": \"three\", \"nodes\": 3,"
	" \"gpus_per_node\": 4,"
	" \"gpu\": {\"name\": \"g\", \"memory_gib\": 80, \"peak_tflops\": 100,"
	" \"mem_bandwidth_gbs\": 2000},"
	" \"links\": {\"intra_node_gbs\": 200, \"intra_node_latency_us\": 3,"
	" \"inter_node_gbs\": 10, \"inter_node_latency_us\": 10, \"nics_per_node\": 4}}";

static const char MODEL[] =
	"{'format': 'spindle.model/1', 'name': 'align', 'components': {"
	"'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 1024, 'max_seq': 8},"
	"'a': {'type': 'transformer', 'layers': 2, 'hidden': 1024, 'heads': 8, 'ffn': 4096},"
	"'b': {'type': 'transformer', 'layers': 1, 'hidden': 1024, 'heads': 8, 'ffn': 64},"
	"'cls': {'type': 'classifier', 'hidden': 1024, 'classes': 4}},"
	"'tasks': ["
	"{'name': 't1', 'batch': 8, 'graph': [{'id': 'src', 'component': 'emb', 'seq': 8},"
	" {'id': 'enc', 'component': 'a', 'seq': 8, 'inputs': ['src']},"
	" {'id': 'loss', 'component': 'cls', 'inputs': ['enc']}]},"
	"{'name': 't2', 'batch': 8, 'graph': [{'id': 'src', 'component': 'emb', 'seq': 8},"
	" {'id': 'enc', 'component': 'a', 'seq': 8, 'inputs': ['src']},"
	" {'id': 'loss', 'component': 'cls', 'inputs': ['enc']}]},"
	"{'name': 't3', 'batch': 8, 'graph': [{'id': 'src', 'component': 'emb', 'seq': 8},"
	" {'id': 'enc', 'component': 'b', 'seq': 8, 'inputs': ['src']},"
	" {'id': 'loss', 'component': 'cls', 'inputs': ['enc']}]}]}";

/* The index of the component named name. */
static int comp_named(const sp_model_t *md, const char *name)
{
	int k = 0;
	while (k < md->n_comps && strcmp(md->comps[k].name, name))
		k++;
	assert_true(k < md->n_comps);
	return k;
}

/* GPUs of the devices holding component comp (by the slices) per node. */
static void per_node(const planner_t *pl, const sched_t *s, const place_t *pc, int comp,
		     int *cnt, int32_t *devs, int *n)
{
	int seen[12] = {0};
	memset(cnt, 0, 3 * sizeof *cnt);
	*n = 0;
	for (int i = 0; i < s->n; i++) {
		int layer;
		if (mop_comp(pl, s->s[i].metaop, 0, &layer) != comp)
			continue;
		for (int j = 0; j < s->s[i].n; j++) {
			int d = pc->devs[pc->off[i] + j];
			if (!seen[d]++) {
				cnt[d / 4]++;
				devs[(*n)++] = d;
			}
		}
	}
	devs_sort(devs, *n);
}

/* Every MetaOp whole on its task's four devices (tdevs) into s, its
 * devices into pc (arrays the caller frees); where perm, the first of
 * task 0's MetaOps named "enc..." on perm instead, its index into *enc
 * (-1: none). */
static void task_slices(planner_t *pl, sched_t *s, place_t *pc, const int32_t *perm, int *enc)
{
	static const int32_t tdevs[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {0, 9, 10, 11}};
	sched_init(s, ALGO_SPINDLE, &pl->scratch);
	int32_t *dv = calloc(4 * (size_t)pl->n_mops, sizeof *dv), *off = calloc((size_t)pl->n_mops, sizeof *off);
	assert_true(dv && off);
	*enc = -1;
	for (int m = 0; m < pl->n_mops; m++) {
		int t = pl->mops[m].task;
		assert_int_equal(sched_push(s, m, 0, pl->mops[m].n_layers, 4, pl->mops[m].level, 0, 1), 0);
		int is_enc = perm && t == 0 && strstr(pl->mops[m].name, "enc") && *enc < 0;
		memcpy(dv + 4 * m, is_enc ? perm : tdevs[t], sizeof tdevs[0]);
		*enc = is_enc ? m : *enc;
		off[m] = 4 * m;
	}
	pc->devs = dv;
	pc->off = off;
}

static void test_align_whole_nodes(void **state)
{
	(void)state;
	hand_t h;
	hand_planner(&h, MODEL, CLUSTER, 12, 0);
	planner_t *pl = &h.pl;

	/* each task's MetaOps on one device set */
	sched_t s;
	place_t pc;
	int none;
	task_slices(pl, &s, &pc, NULL, &none);
	int32_t *dv = pc.devs, *off = pc.off;

	int ca = comp_named(&h.model, "a"), cb = comp_named(&h.model, "b");
	int cnt[3], n_a, n_b;
	int32_t before[12], after[12], bdevs[12];
	per_node(pl, &s, &pc, ca, cnt, before, &n_a);
	assert_int_equal(n_a, 8);
	assert_true(cnt[0] == 3 && cnt[1] == 4 && cnt[2] == 1);

	int changed = 0;
	assert_int_equal(place_align(pl, &s, &pc, &changed), 0);
	assert_int_equal(changed, 1);
	/* a permutation: every slice keeps 4 distinct devices, each device
	 * is used by exactly one task's slices, as before */
	int used[12] = {0}, first[3] = {-1, -1, -1};
	for (int m = 0; m < pl->n_mops; m++) {
		int t = pl->mops[m].task;
		if (first[t] < 0) {
			first[t] = m;
			for (int j = 0; j < 4; j++) {
				assert_true(dv[off[m] + j] >= 0 && dv[off[m] + j] < 12);
				used[dv[off[m] + j]]++;
			}
		}
		assert_memory_equal(dv + off[first[t]], dv + off[m], 4 * sizeof(int32_t));
	}
	for (int d = 0; d < 12; d++)
		assert_int_equal(used[d], 1);
	/* whole nodes: a on two, b on one */
	per_node(pl, &s, &pc, ca, cnt, after, &n_a);
	assert_int_equal(n_a, 8);
	for (int q = 0; q < 3; q++)
		assert_true(cnt[q] == 0 || cnt[q] == 4);
	per_node(pl, &s, &pc, cb, cnt, bdevs, &n_b);
	assert_int_equal(n_b, 4);
	for (int q = 0; q < 3; q++)
		assert_true(cnt[q] == 0 || cnt[q] == 4);

	/* a's gradients (2 layers) all-reduced: more than twice as fast */
	int64_t bytes = 2 * comp_layer_params(&h.model.comps[ca]) * dtype_bytes(h.model.dtype);
	double t0 = cost_allreduce_ms(&h.cluster, before, 8, bytes);
	double t1 = cost_allreduce_ms(&h.cluster, after, 8, bytes);
	print_message("a's all-reduce of %lld bytes: %.3f ms ragged, %.3f ms aligned\n",
		      (long long)bytes, t0, t1);
	assert_true(2 * t1 < t0);

	free(dv);
	free(off);
	hand_done(&h);
}

/* A slice the scheduler left out of ascending order (sched_pack.c's
 * hand-over order) keeps its order through the renumbering: t1's 'enc'
 * on {2, 1, 4, 3} where its other slices are on {1, 2, 3, 4}; renumbered,
 * 'enc' holds the same devices as they do, not ascending, and the
 * ascending slices stay ascending. */
static void test_align_keeps_order(void **state)
{
	(void)state;
	hand_t h;
	hand_planner(&h, MODEL, CLUSTER, 12, 0);
	planner_t *pl = &h.pl;
	static const int32_t perm[4] = {2, 1, 4, 3};
	sched_t s;
	place_t pc;
	int enc, src = -1;
	task_slices(pl, &s, &pc, perm, &enc);
	int32_t *dv = pc.devs, *off = pc.off;
	for (int m = 0; m < pl->n_mops && src < 0; m++)
		src = pl->mops[m].task == 0 && m != enc ? m : -1;
	assert_true(enc >= 0 && src >= 0);
	int changed = 0;
	assert_int_equal(place_align(pl, &s, &pc, &changed), 0);
	assert_int_equal(changed, 1);
	int32_t sorted[4];
	memcpy(sorted, dv + off[enc], sizeof sorted);
	devs_sort(sorted, 4);
	assert_memory_equal(sorted, dv + off[src], sizeof sorted);
	int asc = 1;
	for (int j = 1; j < 4; j++)
		asc &= dv[off[enc] + j - 1] < dv[off[enc] + j];
	print_message("t1 'enc' on %d %d %d %d, its other slices on %d %d %d %d\n",
		      dv[off[enc]], dv[off[enc] + 1], dv[off[enc] + 2], dv[off[enc] + 3],
		      dv[off[src]], dv[off[src] + 1], dv[off[src] + 2], dv[off[src] + 3]);
	assert_false(asc);
	for (int m = 0; m < pl->n_mops; m++)
		for (int j = 1; j < 4 && m != enc; j++)
			assert_true(dv[off[m] + j - 1] < dv[off[m] + j]);
	free(dv);
	free(off);
	hand_done(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_align_whole_nodes),
		cmocka_unit_test(test_align_keeps_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
