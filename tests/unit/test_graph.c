/*
 * test_graph.c — graph contraction (planner/graph.c) on hand-built models:
 * for each model the exact MetaOps (names, layers, the (node, layer) list of
 * their operators), edges (src, dst, seq_off, seq_len), levels and
 * topological order. Every graph built here, and every bundled model under
 * plans/, is also checked against the properties any contraction must have
 * (operators partitioned, chains maximal, levels the longest path, edges
 * tiling each consumer's input along seq). Costs, schedules and plans are
 * other tests' business.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "hand_inputs.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

/* A one-device cluster: graph_build reads nothing of it but N. */
static const char CLUSTER[] =
	"{\"format\": \"spindle.cluster/1\", \"name\": \"tiny\", \"nodes\": 1,"
	" \"gpus_per_node\": 1,"
	" \"gpu\": {\"name\": \"cpu\", \"memory_gib\": 1, \"peak_tflops\": 1,"
	" \"mem_bandwidth_gbs\": 10},"
	" \"links\": {\"intra_node_gbs\": 10, \"intra_node_latency_us\": 1,"
	" \"inter_node_gbs\": 1, \"inter_node_latency_us\": 10}}";

/* The planner as plan.c sets it up, with the options main.c defaults to
 * (hand_inputs.h's hand_t; fix_init fills it). */
typedef hand_t gfix_t;

/* Models below are written with ' for " so they read as JSON. */
static char *unquote(const char *s)
{
	char *t = strdup(s);
	assert_non_null(t);
	for (char *c = t; *c; c++)
		if (*c == '\'')
			*c = '"';
	return t;
}

static void check_invariants(const planner_t *pl);

static void fix_init(gfix_t *f)
{
	memset(f, 0, sizeof *f);
	assert_int_equal(cluster_parse(&f->cluster, CLUSTER, strlen(CLUSTER), "tiny.json",
				       &f->err),
			 0);
	f->opts.algo = ALGO_SPINDLE;
	f->opts.placement = PLACE_SPINDLE;
	f->opts.mem_reserve_gib = SP_MIN(2.0, 0.1 * f->cluster.memory_gib);
	f->opts.milp_nodes = 200;
	f->pl.model = &f->model;
	f->pl.cluster = &f->cluster;
	f->pl.opts = &f->opts;
	f->pl.err = &f->err;
	sp_arena_init(&f->pl.arena);
	sp_arena_init(&f->pl.scratch);
	f->pl.N = f->cluster.nodes * f->cluster.gpus_per_node;
}

static void fix_graph(gfix_t *f)
{
	int rc = graph_build(&f->pl);
	if (rc)
		print_message("graph_build: %s\n", f->err.msg);
	assert_int_equal(rc, 0);
	check_invariants(&f->pl);
}

static void fix_build(gfix_t *f, const char *json)
{
	fix_init(f);
	char *text = unquote(json);
	int rc = model_parse(&f->model, text, strlen(text), "test.json", &f->err);
	free(text);
	if (rc)
		print_message("model_parse: %s\n", f->err.msg);
	assert_int_equal(rc, 0);
	fix_graph(f);
}

static void fix_release(gfix_t *f)
{
	sp_arena_release(&f->pl.arena);
	sp_arena_release(&f->pl.scratch); /* a reset keeps blocks for reuse */
	model_release(&f->model);
	cluster_release(&f->cluster);
}

/* ---- properties of every contraction ----------------------------------- */

static const sp_node_t *op_node(const planner_t *pl, int m, int k)
{
	const metaop_t *mo = &pl->mops[m];
	return &pl->model->tasks[mo->task].nodes[pl->ops[mo->first_op + k].node];
}

static int n_consumers(const sp_task_t *t, int node)
{
	int c = 0;
	for (int j = 0; j < t->n_nodes; j++)
		for (int q = 0; q < t->nodes[j].n_inputs; q++)
			c += t->nodes[j].inputs[q] == node;
	return c;
}

static void check_invariants(const planner_t *pl)
{
	const sp_model_t *md = pl->model;
	/* operators: MetaOps own contiguous, consecutive runs covering all */
	int next_op = 0;
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		assert_true(mo->n_layers >= 1);
		assert_int_equal(mo->first_op, next_op);
		next_op += mo->n_layers;
		assert_true(mo->task >= 0 && mo->task < md->n_tasks);
		const sp_task_t *t = &md->tasks[mo->task];
		for (int k = 0; k < mo->n_layers; k++) {
			const sp_op_t *op = &pl->ops[mo->first_op + k];
			assert_true(op->node >= 0 && op->node < t->n_nodes);
			const sp_node_t *n = &t->nodes[op->node];
			assert_true(op->layer >= n->layer_from && op->layer < n->layer_to);
			sp_opshape_t sh = op_shape(md, t, n);
			assert_true(opshape_equal(&sh, &mo->shape)); /* one shape per MetaOp */
			if (k == 0)
				continue;
			const sp_op_t *pr = &pl->ops[mo->first_op + k - 1];
			if (pr->node == op->node) {
				assert_int_equal(op->layer, pr->layer + 1);
			} else {
				/* a chain link: whole nodes, the only consumer and input */
				assert_int_equal(pr->layer, t->nodes[pr->node].layer_to - 1);
				assert_int_equal(op->layer, n->layer_from);
				assert_int_equal(n->n_inputs, 1);
				assert_int_equal(n->inputs[0], pr->node);
				assert_int_equal(n_consumers(t, pr->node), 1);
			}
		}
	}
	assert_int_equal(next_op, pl->n_ops);
	/* every layer of every node is exactly one operator */
	int total = 0;
	for (int ti = 0; ti < md->n_tasks; ti++)
		for (int i = 0; i < md->tasks[ti].n_nodes; i++)
			total += md->tasks[ti].nodes[i].layer_to - md->tasks[ti].nodes[i].layer_from;
	assert_int_equal(pl->n_ops, total);
	for (int a = 0; a < pl->n_mops; a++)
		for (int k = 0; k < pl->mops[a].n_layers; k++)
			for (int b = a; b < pl->n_mops; b++)
				for (int j = b == a ? k + 1 : 0; j < pl->mops[b].n_layers; j++)
					assert_false(pl->mops[a].task == pl->mops[b].task &&
						     op_node(pl, a, k) == op_node(pl, b, j) &&
						     pl->ops[pl->mops[a].first_op + k].layer ==
							     pl->ops[pl->mops[b].first_op + j].layer);
	/* edges: inside a task, adjacency lists agree with them */
	for (int e = 0; e < pl->n_edges; e++) {
		const sp_edge_t *ed = &pl->edges[e];
		assert_true(ed->src >= 0 && ed->src < pl->n_mops);
		assert_true(ed->dst >= 0 && ed->dst < pl->n_mops);
		assert_int_equal(pl->mops[ed->src].task, pl->mops[ed->dst].task);
		assert_true(ed->seq_len >= 1);
	}
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		int np = 0, ns = 0;
		for (int e = 0; e < pl->n_edges; e++) {
			np += pl->edges[e].dst == m;
			ns += pl->edges[e].src == m;
		}
		assert_int_equal(mo->n_pred, np);
		assert_int_equal(mo->n_succ, ns);
		for (int q = 0; q < mo->n_pred; q++)
			assert_int_equal(pl->edges[mo->pred[q]].dst, m);
		for (int q = 0; q < mo->n_succ; q++)
			assert_int_equal(pl->edges[mo->succ[q]].src, m);
		/* inputs tile act(m, 0) along seq, in pred order; a decoder's
		 * memory edge comes last */
		assert_int_equal(mo->source, mo->n_pred == 0);
		int n_mem = 0;
		if (!mo->source) {
			int off = 0;
			for (int q = 0; q < mo->n_pred; q++) {
				const sp_edge_t *ed = &pl->edges[mo->pred[q]];
				if (ed->memory) {
					assert_int_equal(q, mo->n_pred - 1);
					n_mem++;
					continue;
				}
				assert_int_equal(ed->seq_off, off);
				off += ed->seq_len;
			}
			assert_int_equal(mo->seq_in, off);
		}
		assert_int_equal(n_mem, mo->shape.mem_seq > 0);
		assert_int_equal(mo->sink, mo->n_succ == 0);
	}
	/* memory edges: act(p, L_p) -> act(c, -1), p's last node the memory of
	 * every node of c, the whole memory (seq_off 0, mem_seq tokens) */
	for (int e = 0; e < pl->n_edges; e++) {
		const sp_edge_t *ed = &pl->edges[e];
		assert_true(ed->memory == 0 || ed->memory == 1);
		if (!ed->memory)
			continue;
		const metaop_t *c = &pl->mops[ed->dst], *p = &pl->mops[ed->src];
		const sp_task_t *t = &md->tasks[c->task];
		assert_true(c->shape.mem_seq > 0);
		assert_int_equal(ed->seq_off, 0);
		assert_int_equal(ed->seq_len, c->shape.mem_seq);
		int last = pl->ops[p->first_op + p->n_layers - 1].node;
		assert_int_equal(t->nodes[last].seq, c->shape.mem_seq);
		for (int k = 0; k < c->n_layers; k++)
			assert_int_equal(op_node(pl, ed->dst, k)->memory, last);
	}
	/* a memory ends its MetaOp: no chain link leaves a node that is one */
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		const sp_task_t *t = &md->tasks[mo->task];
		for (int k = 0; k + 1 < mo->n_layers; k++) {
			int node = pl->ops[mo->first_op + k].node;
			if (pl->ops[mo->first_op + k + 1].node == node)
				continue;
			for (int j = 0; j < t->n_nodes; j++)
				assert_false(md->comps[t->nodes[j].comp].cross_attention &&
					     t->nodes[j].memory == node);
		}
	}
	/* maximal: an edge from a single-consumer MetaOp into a single-input
	 * MetaOp joins two different shapes (else the chain would continue) */
	for (int e = 0; e < pl->n_edges; e++) {
		const metaop_t *s = &pl->mops[pl->edges[e].src], *d = &pl->mops[pl->edges[e].dst];
		if (s->n_succ == 1 && d->n_pred == 1)
			assert_false(opshape_equal(&s->shape, &d->shape));
	}
	/* levels: the longest path from a source, in MetaOps */
	int max_level = -1;
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		int want = 0;
		for (int q = 0; q < mo->n_pred; q++)
			want = SP_MAX(want, pl->mops[pl->edges[mo->pred[q]].src].level + 1);
		assert_int_equal(mo->level, want);
		max_level = SP_MAX(max_level, mo->level);
	}
	assert_int_equal(pl->n_levels, max_level + 1);
	/* topo: a permutation ordered by (level, id) */
	char *seen = calloc((size_t)pl->n_mops + 1, 1);
	assert_non_null(seen);
	for (int k = 0; k < pl->n_mops; k++) {
		int m = pl->topo[k];
		assert_true(m >= 0 && m < pl->n_mops);
		assert_false(seen[m]);
		seen[m] = 1;
		if (k > 0) {
			int p = pl->topo[k - 1];
			assert_true(pl->mops[p].level < pl->mops[m].level ||
				    (pl->mops[p].level == pl->mops[m].level && p < m));
		}
	}
	free(seen);
}

/* ---- exact expectations ---------------------------------------------------- */

typedef struct {
	const char *name;
	int n_layers, level;
	int ops[8][2]; /* (node, layer) */
} exp_mop_t;

static void expect_mops(const planner_t *pl, const exp_mop_t *x, int n)
{
	assert_int_equal(pl->n_mops, n);
	for (int m = 0; m < n; m++) {
		const metaop_t *mo = &pl->mops[m];
		assert_string_equal(mo->name, x[m].name);
		assert_int_equal(mo->n_layers, x[m].n_layers);
		assert_int_equal(mo->level, x[m].level);
		for (int k = 0; k < mo->n_layers; k++) {
			assert_int_equal(pl->ops[mo->first_op + k].node, x[m].ops[k][0]);
			assert_int_equal(pl->ops[mo->first_op + k].layer, x[m].ops[k][1]);
		}
	}
}

/* (src, dst, seq_off, seq_len) in creation order */
static void expect_edges(const planner_t *pl, const int (*x)[4], int n)
{
	assert_int_equal(pl->n_edges, n);
	for (int e = 0; e < n; e++) {
		assert_int_equal(pl->edges[e].src, x[e][0]);
		assert_int_equal(pl->edges[e].dst, x[e][1]);
		assert_int_equal(pl->edges[e].seq_off, x[e][2]);
		assert_int_equal(pl->edges[e].seq_len, x[e][3]);
	}
}

static void expect_topo(const planner_t *pl, const int *x, int n, int n_levels)
{
	assert_int_equal(pl->n_levels, n_levels);
	for (int k = 0; k < n; k++)
		assert_int_equal(pl->topo[k], x[k]);
}

#define HEAD(name) "{'format': 'spindle.model/1', 'name': '" name "', "

/* (a) source → transformer (3 layers) → linear → loss */
static void test_chain(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("a") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'tr': {'type': 'transformer', 'layers': 3, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lin': {'type': 'linear', 'in': 8, 'out': 8},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'src', 'component': 'emb', 'seq': 4},"
		      " {'id': 'enc', 'component': 'tr', 'seq': 4, 'inputs': ['src']},"
		      " {'id': 'proj', 'component': 'lin', 'seq': 4, 'inputs': ['enc']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['proj']}]}]}");
	/* the three layers of 'enc' are one MetaOp; 'proj' (another type) and
	 * the source and loss are their own */
	static const exp_mop_t x[] = {
		{"t/src", 1, 0, {{0, 0}}},
		{"t/enc", 3, 1, {{1, 0}, {1, 1}, {1, 2}}},
		{"t/proj", 1, 2, {{2, 0}}},
		{"t/loss", 1, 3, {{3, 0}}},
	};
	expect_mops(&f.pl, x, 4);
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 4}, {2, 3, 0, 4}};
	expect_edges(&f.pl, e, 3);
	static const int topo[] = {0, 1, 2, 3};
	expect_topo(&f.pl, topo, 4, 4);
	const metaop_t *m = f.pl.mops;
	assert_int_equal(f.pl.n_ops, 6);
	assert_true(m[0].source && !m[0].sink && m[3].sink && !m[3].source);
	assert_int_equal(m[0].seq_in, 4);
	assert_int_equal(m[0].width_in, 0); /* data, not an activation */
	assert_int_equal(m[1].shape.type, COMP_TRANSFORMER);
	assert_int_equal(m[2].shape.type, COMP_LINEAR);
	assert_int_equal(m[3].seq_in, 4); /* an lm_head takes every token */
	assert_int_equal(m[3].seq_out, 0);
	assert_int_equal(m[3].width_out, 0);
	for (int k = 0; k < 4; k++)
		assert_int_equal(m[k].batch, 4);
	fix_release(&f);
}

/* (b) one transformer component split over chained nodes: one MetaOp */
static void test_split_component(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("b") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'tr': {'type': 'transformer', 'layers': 5, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'src', 'component': 'emb', 'seq': 4},"
		      " {'id': 'lo', 'component': 'tr', 'seq': 4, 'layers': [0, 2], 'inputs': ['src']},"
		      " {'id': 'hi', 'component': 'tr', 'seq': 4, 'layers': [2, 5], 'inputs': ['lo']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['hi']}]}]}");
	/* operators carry the component's layers 0..4, from nodes 1 and 2 */
	static const exp_mop_t x[] = {
		{"t/src", 1, 0, {{0, 0}}},
		{"t/lo..hi", 5, 1, {{1, 0}, {1, 1}, {2, 2}, {2, 3}, {2, 4}}},
		{"t/loss", 1, 2, {{3, 0}}},
	};
	expect_mops(&f.pl, x, 3);
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 4}};
	expect_edges(&f.pl, e, 2);
	static const int topo[] = {0, 1, 2};
	expect_topo(&f.pl, topo, 3, 3);
	fix_release(&f);

	/* three links: the name keeps the first and the last node only */
	fix_build(&f, HEAD("b3") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'tr': {'type': 'transformer', 'layers': 5, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'src', 'component': 'emb', 'seq': 4},"
		      " {'id': 'lo', 'component': 'tr', 'seq': 4, 'layers': [0, 1], 'inputs': ['src']},"
		      " {'id': 'mid', 'component': 'tr', 'seq': 4, 'layers': [1, 3], 'inputs': ['lo']},"
		      " {'id': 'hi', 'component': 'tr', 'seq': 4, 'layers': [3, 5], 'inputs': ['mid']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['hi']}]}]}");
	static const exp_mop_t x3[] = {
		{"t/src", 1, 0, {{0, 0}}},
		{"t/lo..hi", 5, 1, {{1, 0}, {2, 1}, {2, 2}, {3, 3}, {3, 4}}},
		{"t/loss", 1, 2, {{4, 0}}},
	};
	expect_mops(&f.pl, x3, 3);
	fix_release(&f);
}

/* (c) overlapping layer ranges of one component in two tasks */
static void test_partial_two_tasks(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("c") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'tr': {'type': 'transformer', 'layers': 4, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': ["
		      " {'name': 'A', 'batch': 4, 'graph': ["
		      "  {'id': 'src', 'component': 'emb', 'seq': 4},"
		      "  {'id': 'enc', 'component': 'tr', 'seq': 4, 'layers': [0, 3], 'inputs': ['src']},"
		      "  {'id': 'loss', 'component': 'lm', 'inputs': ['enc']}]},"
		      " {'name': 'B', 'batch': 2, 'graph': ["
		      "  {'id': 'src', 'component': 'emb', 'seq': 4},"
		      "  {'id': 'enc', 'component': 'tr', 'seq': 4, 'layers': [1, 4], 'inputs': ['src']},"
		      "  {'id': 'loss', 'component': 'lm', 'inputs': ['enc']}]}]}");
	static const exp_mop_t x[] = {
		{"A/src", 1, 0, {{0, 0}}},
		{"A/enc", 3, 1, {{1, 0}, {1, 1}, {1, 2}}},
		{"A/loss", 1, 2, {{2, 0}}},
		{"B/src", 1, 0, {{0, 0}}},
		{"B/enc", 3, 1, {{1, 1}, {1, 2}, {1, 3}}},
		{"B/loss", 1, 2, {{2, 0}}},
	};
	expect_mops(&f.pl, x, 6);
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 4}, {3, 4, 0, 4}, {4, 5, 0, 4}};
	expect_edges(&f.pl, e, 4);
	static const int topo[] = {0, 3, 1, 4, 2, 5};
	expect_topo(&f.pl, topo, 6, 3);
	/* same shape, yet two MetaOps: each task has its own batch */
	assert_true(opshape_equal(&f.pl.mops[1].shape, &f.pl.mops[4].shape));
	assert_int_equal(f.pl.mops[1].task, 0);
	assert_int_equal(f.pl.mops[4].task, 1);
	assert_int_equal(f.pl.mops[1].batch, 4);
	assert_int_equal(f.pl.mops[4].batch, 2);
	fix_release(&f);
}

/*
 * (d) a diamond. The fork 'x' has the shape of both its consumers, so only
 * its out-degree (2) keeps it apart from them. The join 'j' has two inputs
 * and concatenates them (seq 4 + 4); a transformer with two inputs always
 * has a longer seq than either, so in-degree and shape both forbid merging
 * there and no valid model separates the two reasons.
 */
static void test_diamond(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("d") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'enc': {'type': 'transformer', 'layers': 1, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'src', 'component': 'emb', 'seq': 4},"
		      " {'id': 'x', 'component': 'enc', 'seq': 4, 'inputs': ['src']},"
		      " {'id': 'l', 'component': 'enc', 'seq': 4, 'inputs': ['x']},"
		      " {'id': 'r', 'component': 'enc', 'seq': 4, 'inputs': ['x']},"
		      " {'id': 'j', 'component': 'enc', 'seq': 8, 'inputs': ['l', 'r']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['j']}]}]}");
	static const exp_mop_t x[] = {
		{"t/src", 1, 0, {{0, 0}}}, {"t/x", 1, 1, {{1, 0}}}, {"t/l", 1, 2, {{2, 0}}},
		{"t/r", 1, 2, {{3, 0}}},   {"t/j", 1, 3, {{4, 0}}}, {"t/loss", 1, 4, {{5, 0}}},
	};
	expect_mops(&f.pl, x, 6);
	/* the join's second input starts where the first one's 4 tokens end */
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 4}, {1, 3, 0, 4},
				   {2, 4, 0, 4}, {3, 4, 4, 4}, {4, 5, 0, 8}};
	expect_edges(&f.pl, e, 6);
	static const int topo[] = {0, 1, 2, 3, 4, 5};
	expect_topo(&f.pl, topo, 6, 5);
	assert_true(opshape_equal(&f.pl.mops[1].shape, &f.pl.mops[2].shape));
	assert_int_equal(f.pl.mops[1].n_succ, 2);
	assert_int_equal(f.pl.mops[4].n_pred, 2);
	assert_int_equal(f.pl.mops[4].seq_in, 8);
	assert_int_equal(f.pl.mops[4].width_in, 8);
	assert_int_equal(f.pl.mops[4].seq_out, 8);
	fix_release(&f);
}

/* (e) concatenation follows the order of the inputs list, not of the nodes */
static void test_concat_order(void **state)
{
	(void)state;
	static const char *const order[2] = {"'b', 'a'", "'a', 'b'"};
	/* a has 3 tokens, b 5: (b, a) puts b at 0 and a at 5; (a, b) a at 0, b at 3 */
	static const int want[2][2][4] = {{{1, 2, 0, 5}, {0, 2, 5, 3}},
					  {{0, 2, 0, 3}, {1, 2, 3, 5}}};
	for (int v = 0; v < 2; v++) {
		char json[2048];
		snprintf(json, sizeof json,
			 HEAD("e") "'components': {"
			 "'tok': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 8},"
			 "'enc': {'type': 'transformer', 'layers': 1, 'hidden': 8, 'heads': 2, 'ffn': 16},"
			 "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
			 "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
			 " {'id': 'a', 'component': 'tok', 'seq': 3},"
			 " {'id': 'b', 'component': 'tok', 'seq': 5},"
			 " {'id': 'j', 'component': 'enc', 'seq': 8, 'inputs': [%s]},"
			 " {'id': 'loss', 'component': 'lm', 'inputs': ['j']}]}]}",
			 order[v]);
		gfix_t f;
		fix_build(&f, json);
		static const exp_mop_t x[] = {
			{"t/a", 1, 0, {{0, 0}}},
			{"t/b", 1, 0, {{1, 0}}},
			{"t/j", 1, 1, {{2, 0}}},
			{"t/loss", 1, 2, {{3, 0}}},
		};
		expect_mops(&f.pl, x, 4);
		const int e[][4] = {{want[v][0][0], want[v][0][1], want[v][0][2], want[v][0][3]},
				    {want[v][1][0], want[v][1][1], want[v][1][2], want[v][1][3]},
				    {2, 3, 0, 8}};
		expect_edges(&f.pl, e, 3);
		static const int topo[] = {0, 1, 2, 3};
		expect_topo(&f.pl, topo, 4, 3);
		fix_release(&f);
	}
}

/* (f) classifier and contrastive read token 0: one token per input */
static void test_one_token_consumers(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("f") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'pat': {'type': 'patch', 'in': 6, 'hidden': 8, 'max_seq': 4},"
		      "'enc': {'type': 'transformer', 'layers': 2, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'cls': {'type': 'classifier', 'hidden': 8, 'classes': 3},"
		      "'align': {'type': 'contrastive'}},"
		      "'tasks': ["
		      " {'name': 'cls', 'batch': 4, 'graph': ["
		      "  {'id': 'src', 'component': 'emb', 'seq': 4},"
		      "  {'id': 'enc', 'component': 'enc', 'seq': 4, 'inputs': ['src']},"
		      "  {'id': 'head', 'component': 'cls', 'inputs': ['enc']}]},"
		      " {'name': 'clip', 'batch': 6, 'graph': ["
		      "  {'id': 'ta', 'component': 'emb', 'seq': 4},"
		      "  {'id': 'tenc', 'component': 'enc', 'seq': 4, 'inputs': ['ta']},"
		      "  {'id': 'ia', 'component': 'pat', 'seq': 2},"
		      "  {'id': 'ienc', 'component': 'enc', 'seq': 2, 'inputs': ['ia']},"
		      "  {'id': 'loss', 'component': 'align', 'inputs': ['tenc', 'ienc']}]}]}");
	static const exp_mop_t x[] = {
		{"cls/src", 1, 0, {{0, 0}}},
		{"cls/enc", 2, 1, {{1, 0}, {1, 1}}},
		{"cls/head", 1, 2, {{2, 0}}},
		{"clip/ta", 1, 0, {{0, 0}}},
		{"clip/tenc", 2, 1, {{1, 0}, {1, 1}}},
		{"clip/ia", 1, 0, {{2, 0}}},
		{"clip/ienc", 2, 1, {{3, 0}, {3, 1}}},
		{"clip/loss", 1, 2, {{4, 0}}},
	};
	expect_mops(&f.pl, x, 8);
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 1}, {3, 4, 0, 4},
				   {5, 6, 0, 2}, {4, 7, 0, 1}, {6, 7, 1, 1}};
	expect_edges(&f.pl, e, 6);
	static const int topo[] = {0, 3, 5, 1, 4, 6, 2, 7};
	expect_topo(&f.pl, topo, 8, 3);
	const metaop_t *m = f.pl.mops;
	assert_int_equal(m[2].seq_in, 1);
	assert_int_equal(m[2].width_in, 8);
	assert_int_equal(m[7].seq_in, 2);
	assert_int_equal(m[7].width_in, 8);
	assert_int_equal(m[7].shape.hidden, 8); /* contrastive: the inputs' width */
	assert_true(m[2].sink && m[7].sink);
	assert_int_equal(m[2].seq_out + m[2].width_out + m[7].seq_out + m[7].width_out, 0);
	/* producers still emit all their tokens; only the edge is one token */
	assert_int_equal(m[1].seq_out, 4);
	assert_int_equal(m[6].seq_out, 2);
	assert_int_equal(m[5].seq_in, 2); /* a source: its own seq of data */
	assert_int_equal(m[5].width_in, 0);
	fix_release(&f);
}

/* (g) linear layers merge on equal shape, not on equal component */
static void test_linear_shapes(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("g") "'components': {"
		      "'emb': {'type': 'embedding', 'vocab': 16, 'hidden': 16, 'max_seq': 4},"
		      "'sq1': {'type': 'linear', 'in': 16, 'out': 16},"
		      "'sq2': {'type': 'linear', 'in': 16, 'out': 16},"
		      "'nar': {'type': 'linear', 'in': 16, 'out': 8},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'src', 'component': 'emb', 'seq': 4},"
		      " {'id': 'a', 'component': 'sq1', 'seq': 4, 'inputs': ['src']},"
		      " {'id': 'b', 'component': 'sq2', 'seq': 4, 'inputs': ['a']},"
		      " {'id': 'c', 'component': 'nar', 'seq': 4, 'inputs': ['b']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['c']}]}]}");
	static const exp_mop_t x[] = {
		{"t/src", 1, 0, {{0, 0}}},
		{"t/a..b", 2, 1, {{1, 0}, {2, 0}}},
		{"t/c", 1, 2, {{3, 0}}},
		{"t/loss", 1, 3, {{4, 0}}},
	};
	expect_mops(&f.pl, x, 4);
	static const int e[][4] = {{0, 1, 0, 4}, {1, 2, 0, 4}, {2, 3, 0, 4}};
	expect_edges(&f.pl, e, 3);
	static const int topo[] = {0, 1, 2, 3};
	expect_topo(&f.pl, topo, 4, 4);
	assert_int_equal(f.pl.mops[1].width_in, 16);
	assert_int_equal(f.pl.mops[1].width_out, 16);
	assert_int_equal(f.pl.mops[2].width_in, 16);
	assert_int_equal(f.pl.mops[2].width_out, 8);
	fix_release(&f);
}

/* (h) levels are the longest path: z is 3 hops from a, 1 from b */
static void test_levels(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("h") "'components': {"
		      "'tok': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 4},"
		      "'enc': {'type': 'transformer', 'layers': 1, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'lin': {'type': 'linear', 'in': 8, 'out': 8},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'a', 'component': 'tok', 'seq': 2},"
		      " {'id': 'x', 'component': 'enc', 'seq': 2, 'inputs': ['a']},"
		      " {'id': 'y', 'component': 'lin', 'seq': 2, 'inputs': ['x']},"
		      " {'id': 'b', 'component': 'tok', 'seq': 3},"
		      " {'id': 'z', 'component': 'enc', 'seq': 5, 'inputs': ['y', 'b']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['z']}]}]}");
	/* MetaOps are created in Kahn order (lowest ready node first): a, x, y, b */
	static const exp_mop_t x[] = {
		{"t/a", 1, 0, {{0, 0}}}, {"t/x", 1, 1, {{1, 0}}}, {"t/y", 1, 2, {{2, 0}}},
		{"t/b", 1, 0, {{3, 0}}}, {"t/z", 1, 3, {{4, 0}}}, {"t/loss", 1, 4, {{5, 0}}},
	};
	expect_mops(&f.pl, x, 6);
	static const int e[][4] = {{0, 1, 0, 2}, {1, 2, 0, 2}, {2, 4, 0, 2}, {3, 4, 2, 3},
				   {4, 5, 0, 5}};
	expect_edges(&f.pl, e, 5);
	/* topological order is by level, so b (level 0) comes before x */
	static const int topo[] = {0, 3, 1, 2, 4, 5};
	expect_topo(&f.pl, topo, 6, 5);
	fix_release(&f);
}

/*
 * (i) cross-attention (issue #20). Decoder 'dlo' (node 2) attends to 'e1'
 * (node 6), so e1 comes first in the topological order. e1 is a memory:
 * its chain ends there although e2 has its shape and is its only consumer.
 * 'dlo..dhi' chain (one component, the same memory); 'd2' has their shape
 * but attends to e2: apart. 'pre' has the decoders' shape but for the
 * memory (mem_seq, mem_width): apart. Memory seq (6) and width (16) differ
 * from the decoders' (4, 8).
 */
static void test_cross_attention(void **state)
{
	(void)state;
	gfix_t f;
	fix_build(&f, HEAD("i") "'components': {"
		      "'tok': {'type': 'embedding', 'vocab': 16, 'hidden': 8, 'max_seq': 8},"
		      "'img': {'type': 'embedding', 'vocab': 16, 'hidden': 16, 'max_seq': 8},"
		      "'tr8': {'type': 'transformer', 'layers': 1, 'hidden': 8, 'heads': 2, 'ffn': 16},"
		      "'tr16': {'type': 'transformer', 'layers': 4, 'hidden': 16, 'heads': 2, 'ffn': 32},"
		      "'dec': {'type': 'transformer', 'layers': 4, 'hidden': 8, 'heads': 2, 'ffn': 16,"
		      "        'cross_attention': true, 'memory_width': 16},"
		      "'dec2': {'type': 'transformer', 'layers': 2, 'hidden': 8, 'heads': 2, 'ffn': 16,"
		      "        'cross_attention': true, 'memory_width': 16},"
		      "'lm': {'type': 'lm_head', 'hidden': 8, 'vocab': 16}},"
		      "'tasks': [{'name': 't', 'batch': 4, 'graph': ["
		      " {'id': 'q', 'component': 'tok', 'seq': 4},"
		      " {'id': 'pre', 'component': 'tr8', 'seq': 4, 'inputs': ['q']},"
		      " {'id': 'dlo', 'component': 'dec', 'seq': 4, 'layers': [0, 2], 'inputs': ['pre'],"
		      "  'memory': 'e1'},"
		      " {'id': 'dhi', 'component': 'dec', 'seq': 4, 'layers': [2, 4], 'inputs': ['dlo'],"
		      "  'memory': 'e1'},"
		      " {'id': 'd2', 'component': 'dec2', 'seq': 4, 'inputs': ['dhi'], 'memory': 'e2'},"
		      " {'id': 's', 'component': 'img', 'seq': 6},"
		      " {'id': 'e1', 'component': 'tr16', 'seq': 6, 'layers': [0, 2], 'inputs': ['s']},"
		      " {'id': 'e2', 'component': 'tr16', 'seq': 6, 'layers': [2, 4], 'inputs': ['e1']},"
		      " {'id': 'loss', 'component': 'lm', 'inputs': ['d2']}]}]}");
	/* Kahn order with memories: q, pre, s, e1, dlo, dhi, e2, d2, loss */
	static const exp_mop_t x[] = {
		{"t/q", 1, 0, {{0, 0}}},
		{"t/pre", 1, 1, {{1, 0}}},
		{"t/s", 1, 0, {{5, 0}}},
		{"t/e1", 2, 1, {{6, 0}, {6, 1}}},
		{"t/dlo..dhi", 4, 2, {{2, 0}, {2, 1}, {3, 2}, {3, 3}}},
		{"t/e2", 2, 2, {{7, 2}, {7, 3}}},
		{"t/d2", 2, 3, {{4, 0}, {4, 1}}},
		{"t/loss", 1, 4, {{8, 0}}},
	};
	expect_mops(&f.pl, x, 8);
	/* by head node: pre; dlo's input, then its memory; d2's; e1; e2; loss */
	static const int e[][4] = {{0, 1, 0, 4}, {1, 4, 0, 4}, {3, 4, 0, 6}, {4, 6, 0, 4},
				   {5, 6, 0, 6}, {2, 3, 0, 6}, {3, 5, 0, 6}, {6, 7, 0, 4}};
	expect_edges(&f.pl, e, 8);
	static const int mem[] = {0, 0, 1, 0, 1, 0, 0, 0};
	for (int k = 0; k < 8; k++)
		assert_int_equal(f.pl.edges[k].memory, mem[k]);
	/* memory edges are dependencies: d2 waits for e2 (level 2), the
	 * decoders for e1 */
	static const int topo[] = {0, 2, 1, 3, 4, 5, 6, 7};
	expect_topo(&f.pl, topo, 8, 5);
	const metaop_t *m = f.pl.mops;
	assert_int_equal(m[4].shape.mem_seq, 6);
	assert_int_equal(m[4].shape.mem_width, 16);
	assert_int_equal(m[4].seq_in, 4);
	assert_int_equal(m[4].width_in, 8);
	assert_int_equal(m[4].seq_out, 4);
	assert_int_equal(m[4].width_out, 8);
	assert_int_equal(m[4].n_pred, 2);
	assert_int_equal(m[3].n_succ, 2); /* e1: e2's input and the decoders' memory */
	assert_true(opshape_equal(&m[4].shape, &m[6].shape));
	assert_int_equal(m[1].shape.mem_seq, 0);
	sp_opshape_t pre = m[1].shape;
	pre.mem_seq = m[4].shape.mem_seq;
	pre.mem_width = m[4].shape.mem_width;
	assert_true(opshape_equal(&pre, &m[4].shape)); /* only the memory differs */
	fix_release(&f);
}

/* Every bundled model contracts into a graph with the properties above. */
static int not_hidden(const struct dirent *de)
{
	return de->d_name[0] != '.';
}

static void test_bundled_models(void **state)
{
	(void)state;
	char dir[4096];
	const char *root = getenv("SPINDLE_ROOT");
	snprintf(dir, sizeof dir, "%s/plans", root && *root ? root : SPINDLE_ROOT);
	struct dirent **names = NULL;
	int nn = scandir(dir, &names, not_hidden, alphasort); /* sorted: stable output */
	assert_true(nn > 0);
	int n = 0;
	for (int i = 0; i < nn; i++) {
		char path[8192];
		snprintf(path, sizeof path, "%s/%s/model.json", dir, names[i]->d_name);
		FILE *fp = fopen(path, "r");
		if (fp) {
			fclose(fp);
			gfix_t f;
			fix_init(&f);
			int rc = model_load(&f.model, path, &f.err);
			if (rc)
				print_message("%s: %s\n", path, f.err.msg);
			assert_int_equal(rc, 0);
			fix_graph(&f);
			print_message("%-10s %3d MetaOps %4d operators %3d edges %2d levels\n",
				      names[i]->d_name, f.pl.n_mops, f.pl.n_ops, f.pl.n_edges,
				      f.pl.n_levels);
			fix_release(&f);
			n++;
		}
		free(names[i]);
	}
	free(names);
	assert_true(n >= 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chain),
		cmocka_unit_test(test_split_component),
		cmocka_unit_test(test_partial_two_tasks),
		cmocka_unit_test(test_diamond),
		cmocka_unit_test(test_concat_order),
		cmocka_unit_test(test_one_token_consumers),
		cmocka_unit_test(test_linear_shapes),
		cmocka_unit_test(test_levels),
		cmocka_unit_test(test_cross_attention),
		cmocka_unit_test(test_bundled_models),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
