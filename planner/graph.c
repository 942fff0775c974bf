/*
 * graph.c — graph contraction: the task DAG of operators (one per layer of
 * each node) becomes a DAG of MetaOps.
 *
 * Rule (the paper's): merge operator i into j while out-degree(i) = 1,
 * in-degree(j) = 1 and both have the same shape (type, seq, widths, heads,
 * ffn, causal). Inside a node consecutive layers always merge, so each node
 * is a chain; a node joins its input's MetaOp when it is that input's only
 * consumer, has that single input, and has the same shape. Tasks never
 * share operators (each has its own batch), so MetaOps never span tasks;
 * a component used by several nodes keeps one parameter set (the runtime
 * sums its gradients over all uses).
 *
 * Cross-attention (a decoder, issue #20). A decoder node's memory is a
 * dependency like an input: the topological order puts it first. A chain
 * never continues past a node that is some node's memory (the memory is
 * act(p, L_p), the output of its MetaOp p), and joins two decoder nodes
 * only when they attend to the same memory (shapes already separate
 * decoders from other transformers: mem_seq, mem_width). Each decoder
 * MetaOp c gets, after its input edges, one memory edge {p, c, 0, mem_seq,
 * memory = 1}; levels and adjacency count it like any edge.
 *
 * Needs: a validated model. Leaves: pl->mops, pl->ops, pl->edges, pl->topo,
 * levels. Consumers that read token 0 only (classifier, contrastive) take
 * one token per input, so only that token is ever transferred.
 */
#include "planner.h"

#include <string.h>

/* The memory node of node n of t (cross-attention), or -1. */
static int memory_of(const sp_model_t *m, const sp_node_t *n)
{
	return m->comps[n->comp].cross_attention ? n->memory : -1;
}

/* 1 when node i of t is some node's memory. */
static int is_memory(const sp_model_t *m, const sp_task_t *t, int i)
{
	for (int j = 0; j < t->n_nodes; j++)
		if (memory_of(m, &t->nodes[j]) == i)
			return 1;
	return 0;
}

/* Nodes in a topological order of inputs and memories. */
static int topo_nodes(sp_arena_t *a, const sp_model_t *m, const sp_task_t *t, int *order)
{
	/* Kahn's algorithm in node order for determinism */
	int n = t->n_nodes, k = 0;
	int *indeg = sp_arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (!indeg)
		return SP_ENOMEM;
	for (int i = 0; i < n; i++)
		indeg[i] = t->nodes[i].n_inputs + (memory_of(m, &t->nodes[i]) >= 0);
	while (k < n) {
		int pick = -1;
		for (int i = 0; i < n && pick < 0; i++)
			if (indeg[i] == 0)
				pick = i;
		if (pick < 0)
			break; /* cannot happen: the loader rejected cycles */
		indeg[pick] = -1;
		order[k++] = pick;
		for (int j = 0; j < n; j++) {
			for (int q = 0; q < t->nodes[j].n_inputs; q++)
				if (t->nodes[j].inputs[q] == pick)
					indeg[j]--;
			if (memory_of(m, &t->nodes[j]) == pick)
				indeg[j]--;
		}
	}
	return k == n ? 0 : SP_EINTERNAL;
}

static int consumers(const sp_task_t *t, int node, int *only)
{
	int c = 0;
	for (int j = 0; j < t->n_nodes; j++)
		for (int q = 0; q < t->nodes[j].n_inputs; q++)
			if (t->nodes[j].inputs[q] == node) {
				c++;
				*only = j;
			}
	return c;
}

/* Room for every MetaOp, operator and edge (results in pl->arena), and the
 * node → MetaOp map (*mop_of, in pl->scratch: graph_build's scope). */
static int graph_alloc(planner_t *pl, int **mop_of)
{
	const sp_model_t *m = pl->model;
	int total_nodes = 0, total_ops = 0, max_edges = 0; /* one edge per node input */
	for (int t = 0; t < m->n_tasks; t++)
		for (int i = 0; i < m->tasks[t].n_nodes; i++) {
			const sp_node_t *n = &m->tasks[t].nodes[i];
			total_nodes++;
			total_ops += n->layer_to - n->layer_from;
			max_edges += n->n_inputs + (memory_of(m, n) >= 0);
		}
	*mop_of = sp_arena_calloc(&pl->scratch, (size_t)total_nodes + 1, sizeof(int));
	pl->mops = sp_arena_calloc(&pl->arena, (size_t)total_nodes, sizeof(metaop_t));
	pl->ops = sp_arena_calloc(&pl->arena, (size_t)total_ops, sizeof(sp_op_t));
	pl->edges = sp_arena_calloc(&pl->arena, (size_t)max_edges + 1, sizeof(sp_edge_t));
	if (!*mop_of || !pl->mops || !pl->ops || !pl->edges)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return 0;
}

/* A new MetaOp headed by node i of task ti, followed along its chain while
 * the contraction rule allows (and neither a memory ends the chain nor
 * two decoders attend to different memories); its operators are
 * contiguous. */
static void contract_chain(planner_t *pl, int ti, int i, int *mop_of)
{
	const sp_model_t *m = pl->model;
	const sp_task_t *t = &m->tasks[ti];
	const sp_node_t *n = &t->nodes[i];
	sp_opshape_t sh = op_shape(m, t, n);
	metaop_t *mo = &pl->mops[pl->n_mops];
	mo->task = ti;
	mo->first_op = pl->n_ops;
	mo->shape = sh;
	mo->batch = t->batch;
	mo->source = comp_is_source(sh.type);
	mo->sink = comp_is_sink(sh.type);
	snprintf(mo->name, sizeof mo->name, "%s/%s", t->name, n->id);
	for (int cur = i;;) {
		const sp_node_t *cn = &t->nodes[cur];
		for (int l = cn->layer_from; l < cn->layer_to; l++)
			pl->ops[pl->n_ops++] = (sp_op_t){cur, l};
		mo->n_layers += cn->layer_to - cn->layer_from;
		mop_of[cur] = pl->n_mops;
		int next = -1;
		if (consumers(t, cur, &next) != 1 || t->nodes[next].n_inputs != 1 ||
		    is_memory(m, t, cur))
			break;
		sp_opshape_t ns = op_shape(m, t, &t->nodes[next]);
		if (!opshape_equal(&sh, &ns) || memory_of(m, cn) != memory_of(m, &t->nodes[next]))
			break;
		size_t len = strlen(mo->name);
		const char *dots = strstr(mo->name, "..");
		if (dots)
			len = (size_t)(dots - mo->name);
		snprintf(mo->name + len, sizeof mo->name - len, "..%s", t->nodes[next].id);
		cur = next;
	}
	pl->n_mops++;
}

/* Nodes to MetaOps, task by task in topological order, following each
 * chain to its end at once. mop_of is indexed by (task's base + node). */
static int graph_contract(planner_t *pl, int *mop_of)
{
	const sp_model_t *m = pl->model;
	for (int ti = 0, base = 0; ti < m->n_tasks; base += m->tasks[ti].n_nodes, ti++) {
		const sp_task_t *t = &m->tasks[ti];
		int *order = sp_arena_calloc(&pl->scratch, (size_t)t->n_nodes + 1, sizeof(int));
		if (!order)
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		if (topo_nodes(&pl->scratch, m, t, order))
			return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "graph: task '%s' is not acyclic", t->name);
		for (int k = 0; k < t->n_nodes; k++)
			mop_of[base + order[k]] = -1;
		for (int k = 0; k < t->n_nodes; k++)
			if (mop_of[base + order[k]] < 0)
				contract_chain(pl, ti, order[k], mop_of + base);
	}
	return 0;
}

/* Shapes of values and edges: each MetaOp's head node's inputs in order,
 * then a decoder's memory edge (act(p, L_p) -> act(c, -1)). */
static void graph_edges(planner_t *pl, const int *mop_of)
{
	const sp_model_t *m = pl->model;
	for (int ti = 0, base = 0; ti < m->n_tasks; base += m->tasks[ti].n_nodes, ti++) {
		const sp_task_t *t = &m->tasks[ti];
		for (int i = 0; i < t->n_nodes; i++) {
			int mi = mop_of[base + i];
			metaop_t *mo = &pl->mops[mi];
			if (pl->ops[mo->first_op].node != i)
				continue; /* not the head */
			const sp_node_t *n = &t->nodes[i];
			const sp_component_t *c = &m->comps[n->comp];
			int one_token = c->type == COMP_CLASSIFIER || c->type == COMP_CONTRASTIVE;
			int off = 0;
			for (int q = 0; q < n->n_inputs; q++) {
				const sp_node_t *src = &t->nodes[n->inputs[q]];
				int len = one_token ? 1 : (int)src->seq;
				pl->edges[pl->n_edges++] = (sp_edge_t){
					mop_of[base + n->inputs[q]], mi, off, len, 0};
				off += len;
			}
			if (memory_of(m, n) >= 0)
				pl->edges[pl->n_edges++] = (sp_edge_t){
					mop_of[base + n->memory], mi, 0, (int)mo->shape.mem_seq, 1};
			/* input: the head's (off when it is not a source); output:
			 * the last node of the chain's */
			const sp_node_t *last = &t->nodes[pl->ops[mo->first_op + mo->n_layers - 1].node];
			sp_metaop_io_t io = metaop_io(m, t, n, last);
			mo->seq_in = (int)io.seq_in;
			mo->width_in = (int)io.width_in;
			mo->seq_out = (int)io.seq_out;
			mo->width_out = (int)io.width_out;
		}
	}
}

/* Each MetaOp's predecessor and successor edges. */
static int graph_adjacency(planner_t *pl)
{
	for (int e = 0; e < pl->n_edges; e++) {
		pl->mops[pl->edges[e].src].n_succ++;
		pl->mops[pl->edges[e].dst].n_pred++;
	}
	for (int k = 0; k < pl->n_mops; k++) {
		metaop_t *mo = &pl->mops[k];
		mo->pred = sp_arena_calloc(&pl->arena, (size_t)mo->n_pred + 1, sizeof(int));
		mo->succ = sp_arena_calloc(&pl->arena, (size_t)mo->n_succ + 1, sizeof(int));
		if (!mo->pred || !mo->succ)
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		mo->n_pred = mo->n_succ = 0;
	}
	for (int e = 0; e < pl->n_edges; e++) {
		metaop_t *s = &pl->mops[pl->edges[e].src], *d = &pl->mops[pl->edges[e].dst];
		s->succ[s->n_succ++] = e;
		d->pred[d->n_pred++] = e;
	}
	return 0;
}

/* Levels (MetaOps were created in topological order inside each task) and
 * pl->topo: by level, then creation order (stable). */
static int graph_levels(planner_t *pl)
{
	pl->n_levels = 0;
	for (int k = 0; k < pl->n_mops; k++) {
		metaop_t *mo = &pl->mops[k];
		mo->level = 0;
		for (int q = 0; q < mo->n_pred; q++) {
			int p = pl->edges[mo->pred[q]].src;
			if (p >= k)
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						  "graph: MetaOps not in topological order");
			mo->level = SP_MAX(mo->level, pl->mops[p].level + 1);
		}
		pl->n_levels = SP_MAX(pl->n_levels, mo->level + 1);
	}
	pl->topo = sp_arena_calloc(&pl->arena, (size_t)pl->n_mops + 1, sizeof(int));
	if (!pl->topo)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int lv = 0, k = 0; lv < pl->n_levels; lv++)
		for (int q = 0; q < pl->n_mops; q++)
			if (pl->mops[q].level == lv)
				pl->topo[k++] = q;
	return 0;
}

/* Temporaries in pl->scratch (this call's scope); results in pl->arena. */
int graph_build(planner_t *pl)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int *mop_of = NULL, rc;
	if (!(rc = graph_alloc(pl, &mop_of)) && !(rc = graph_contract(pl, mop_of))) {
		graph_edges(pl, mop_of);
		if (!(rc = graph_adjacency(pl)))
			rc = graph_levels(pl);
	}
	sp_arena_reset(&pl->scratch, mark);
	return rc;
}
