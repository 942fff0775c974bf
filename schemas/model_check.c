/*
 * model_check.c — the model's validity rules that hold whatever format the
 * model came in: every task graph's sources and arities, acyclicity, seq and
 * width agreement, cross-attention memories, every node reaching a loss,
 * and totals (parameters, FLOPs, saved activation bytes) that fit the
 * planner's int64 arithmetic. The JSON loader (model_load.c) and the plan
 * reader (plan_check.c) both call it, so a plan cannot carry a model the
 * loader rejects.
 *
 * It checks the loaded form of a model (sp_model_t after model_parse: loss
 * nodes carry their input's seq, contrastive nodes seq 1) and assumes what
 * each reader establishes first: indices in range, names valid, each field
 * within its limits. It does not know where a field was written: each broken
 * rule goes to the caller's report function with the element it concerns,
 * and the caller turns that into file:line:col or a plan section and record.
 * A component no node uses is reported as a warning (code 0), not an error.
 */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limit on FLOP and byte totals: int64 with room for sums of a few. */
#define SIZE_LIM ((int64_t)1 << 60)

/* Formats the message and passes it to the caller's report. */
static int bad(const model_report_t *r, int task, int node, const char *key, int index,
	       const char *hint, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int bad(const model_report_t *r, int task, int node, const char *key, int index,
	       const char *hint, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	model_where_t w = {task, node, -1, key, index};
	return r->report(r->ctx, SP_EINPUT, &w, msg, hint);
}

static int bad_comp(const model_report_t *r, int comp, const char *hint, const char *fmt,
		    ...) __attribute__((format(printf, 4, 5)));
static int bad_comp(const model_report_t *r, int comp, const char *hint, const char *fmt,
		    ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	model_where_t w = {-1, -1, comp, NULL, -1};
	return r->report(r->ctx, SP_EINPUT, &w, msg, hint);
}

static int no_memory(const model_report_t *r)
{
	model_where_t w = {-1, -1, -1, NULL, -1};
	return r->report(r->ctx, SP_ENOMEM, &w, "out of memory", NULL);
}

/* Inputs a node of this type takes exactly, or -1 for one or more. */
static int arity(sp_comp_type_t t)
{
	if (t == COMP_LINEAR || t == COMP_LM_HEAD || t == COMP_CLASSIFIER)
		return 1;
	return t == COMP_CONTRASTIVE ? 2 : -1;
}

/* Sources take no inputs, the others some; arities; losses are sinks. */
static int check_arity(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
		       int ti)
{
	for (int i = 0; i < t->n_nodes; i++) {
		const sp_node_t *n = &t->nodes[i];
		const sp_component_t *cp = &m->comps[n->comp];
		const char *tn = comp_type_name(cp->type);
		if (comp_is_source(cp->type) && n->n_inputs > 0)
			return bad(r, ti, i, "inputs", -1, NULL,
				   "%s node '%s' is a source and takes no inputs", tn, n->id);
		if (!comp_is_source(cp->type) && n->n_inputs == 0)
			return bad(r, ti, i, NULL, -1,
				   "only embedding and patch nodes are sources",
				   "%s node '%s' has no inputs", tn, n->id);
		int want = arity(cp->type);
		if (want > 0 && n->n_inputs != want)
			return bad(r, ti, i, "inputs", -1, NULL,
				   "%s node '%s' takes exactly %d input%s, got %d", tn, n->id,
				   want, want == 1 ? "" : "s", n->n_inputs);
		for (int k = 0; k < n->n_inputs; k++) {
			const sp_node_t *src = &t->nodes[n->inputs[k]];
			if (comp_is_sink(m->comps[src->comp].type))
				return bad(r, ti, i, "inputs", k, NULL,
					   "input '%s' is a loss node; losses are sinks",
					   src->id);
		}
	}
	return 0;
}

/*
 * u takes w as input and w reaches u through the DFS path (parent[x] takes
 * x), so data flows w -> u -> parent[u] -> ... -> w: reported by its ids.
 */
static int report_cycle(const model_report_t *r, const sp_task_t *t, int ti, int u, int k,
			const int *parent)
{
	int w = t->nodes[u].inputs[k];
	char cyc[200];
	size_t used = 0;
	int x = u, guard = 0;
	used += (size_t)snprintf(cyc, sizeof cyc, "%s", t->nodes[w].id);
	while (x != -1 && x != w && used < sizeof cyc) {
		if (guard++ == 6) {
			used += (size_t)snprintf(cyc + used, sizeof cyc - used, " -> ...");
			break;
		}
		used += (size_t)snprintf(cyc + used, sizeof cyc - used, " -> %s",
					 t->nodes[x].id);
		x = parent[x];
	}
	if (used < sizeof cyc)
		snprintf(cyc + used, sizeof cyc - used, " -> %s", t->nodes[w].id);
	return bad(r, ti, u, "inputs", k,
		   "inputs must form a DAG from sources (embedding, patch) to losses",
		   "task graph has a cycle: %s", cyc);
}

/* Iterative DFS over input edges; the stack holds (node, next input index). */
static int check_acyclic(const model_report_t *r, const sp_task_t *t, int ti)
{
	int n = t->n_nodes, rc = 0;
	if (n <= 0)
		return 0;
	char *color = calloc((size_t)n, 1);
	int *stack = malloc(sizeof(int) * (size_t)n * 2);
	int *parent = malloc(sizeof(int) * (size_t)n);
	if (!color || !stack || !parent) {
		rc = no_memory(r);
		goto cleanup;
	}
	for (int s = 0; s < n && !rc; s++) {
		if (color[s])
			continue;
		int sp = 0;
		stack[sp++] = s;
		stack[sp++] = 0;
		color[s] = 1;
		parent[s] = -1;
		while (sp > 0 && !rc) {
			int u = stack[sp - 2], k = stack[sp - 1];
			if (k >= t->nodes[u].n_inputs) {
				color[u] = 2;
				sp -= 2;
				continue;
			}
			stack[sp - 1]++;
			int w = t->nodes[u].inputs[k];
			if (color[w] == 1) {
				rc = report_cycle(r, t, ti, u, k, parent);
			} else if (color[w] == 0) {
				color[w] = 1;
				parent[w] = u;
				stack[sp++] = w;
				stack[sp++] = 0;
			}
		}
	}
cleanup:
	free(color);
	free(stack);
	free(parent);
	return rc;
}

/* Each input's width is what node i takes (contrastive: its first input's). */
static int check_widths(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
			int ti, int i)
{
	const sp_node_t *n = &t->nodes[i];
	const sp_component_t *cp = &m->comps[n->comp];
	for (int k = 0; k < n->n_inputs; k++) {
		const sp_node_t *src = &t->nodes[n->inputs[k]];
		int64_t w = comp_out_width(&m->comps[src->comp]);
		int64_t need = cp->type == COMP_LINEAR ? cp->in : cp->hidden;
		if (cp->type == COMP_CONTRASTIVE)
			need = comp_out_width(&m->comps[t->nodes[n->inputs[0]].comp]);
		if (w == need)
			continue;
		char hint[96];
		if (cp->type == COMP_CONTRASTIVE)
			snprintf(hint, sizeof hint, "both inputs of a contrastive loss need "
						    "the same width; add a linear projection");
		else
			snprintf(hint, sizeof hint, "add a linear projection from %lld to %lld",
				 (long long)w, (long long)need);
		return bad(r, ti, i, "inputs", k, hint,
			   "width mismatch: input '%s' has width %lld, expected %lld", src->id,
			   (long long)w, (long long)need);
	}
	return 0;
}

/*
 * seq: a source's fits its max_seq; a transformer's is the sum of its
 * inputs' (concatenation); linear, lm_head and classifier keep their
 * input's; a contrastive loss reads token 0 of each input, so its seq is 1.
 */
static int check_seqs(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
		      int ti, int i)
{
	const sp_node_t *n = &t->nodes[i];
	const sp_component_t *cp = &m->comps[n->comp];
	if (comp_is_source(cp->type) && n->seq > cp->max_seq) {
		char hint[128];
		snprintf(hint, sizeof hint,
			 "raise max_seq of component '%s' or shorten the node", cp->name);
		return bad(r, ti, i, "seq", -1, hint,
			   "seq %lld exceeds max_seq %lld of its component", (long long)n->seq,
			   (long long)cp->max_seq);
	}
	int64_t sum = 0;
	for (int k = 0; k < n->n_inputs; k++)
		sum += t->nodes[n->inputs[k]].seq;
	if (cp->type == COMP_TRANSFORMER && sum != n->seq)
		return bad(r, ti, i, "seq", -1,
			   "a transformer with several inputs concatenates them along seq",
			   "seq %lld does not match its inputs (their seqs sum to %lld)",
			   (long long)n->seq, (long long)sum);
	if (arity(cp->type) == 1 && n->seq != t->nodes[n->inputs[0]].seq)
		return bad(r, ti, i, "seq", -1, NULL,
			   "seq %lld differs from its input's seq %lld", (long long)n->seq,
			   (long long)t->nodes[n->inputs[0]].seq);
	if (cp->type == COMP_CONTRASTIVE && n->seq != 1)
		return bad(r, ti, i, "seq", -1, NULL,
			   "a contrastive node has seq 1 (got %lld)", (long long)n->seq);
	return 0;
}

/*
 * An LM head's loss is next-token prediction on the token stream its
 * positions come from (runtime/data.c, node_trace_position): at least one
 * position must trace back to an embedding, else every target is ignored,
 * the loss is 0 and nothing trains. With check_seqs' rules (a transformer's
 * seq is its inputs' summed, every other one-input node keeps its input's)
 * every input of a node owns some of its positions, so that is: an
 * embedding is reachable back through inputs (all of a transformer's, the
 * first of any other node's) without passing a patch. tokens[] memoises
 * it per node: 0 unknown, 1 yes, 2 no.
 */
static int has_tokens(const sp_model_t *m, const sp_task_t *t, int node, uint8_t *tokens)
{
	if (tokens[node])
		return tokens[node] == 1;
	const sp_node_t *n = &t->nodes[node];
	sp_comp_type_t ty = m->comps[n->comp].type;
	int yes = ty == COMP_EMBEDDING;
	if (!yes && ty != COMP_PATCH) {
		int k_end = ty == COMP_TRANSFORMER ? n->n_inputs : SP_MIN(n->n_inputs, 1);
		for (int k = 0; k < k_end && !yes; k++)
			yes = has_tokens(m, t, n->inputs[k], tokens);
	}
	tokens[node] = yes ? 1 : 2;
	return yes;
}

static int check_lm_targets(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
			    int ti, uint8_t *tokens)
{
	for (int i = 0; i < t->n_nodes; i++) {
		const sp_node_t *n = &t->nodes[i];
		if (m->comps[n->comp].type != COMP_LM_HEAD || n->n_inputs < 1 ||
		    has_tokens(m, t, n->inputs[0], tokens))
			continue;
		return bad(r, ti, i, "inputs", 0,
			   "feed the lm_head a stream that starts at an embedding node (a "
			   "transformer over token embeddings, possibly with other inputs "
			   "concatenated)",
			   "lm_head node '%s' has no token position: none of its %lld positions "
			   "comes from an embedding, so its next-token loss has no targets and "
			   "trains nothing",
			   n->id, (long long)n->seq);
	}
	return 0;
}

/* The memory node of node n (cross-attention), or -1. */
static int memory_of(const sp_model_t *m, const sp_node_t *n)
{
	return m->comps[n->comp].cross_attention ? n->memory : -1;
}

/* Node n's predecessor q: its inputs, then its memory (q == n_inputs). */
static int pred_of(const sp_model_t *m, const sp_node_t *n, int q)
{
	return q < n->n_inputs ? n->inputs[q] : memory_of(m, n);
}

/*
 * 1 when node `from` flows into node `to` through inputs and memories: a
 * walk over to's ancestors, with the caller's seen (n_nodes bytes) and
 * stack (n_nodes ints).
 */
static int flows_into(const sp_model_t *m, const sp_task_t *t, int from, int to,
		      char *seen, int *stack)
{
	int sp = 0;
	memset(seen, 0, (size_t)t->n_nodes);
	stack[sp++] = to;
	seen[to] = 1;
	while (sp > 0) {
		const sp_node_t *x = &t->nodes[stack[--sp]];
		for (int q = 0; q <= x->n_inputs; q++) {
			int y = pred_of(m, x, q);
			if (y == from)
				return 1;
			if (y < 0 || seen[y])
				continue;
			seen[y] = 1;
			stack[sp++] = y;
		}
	}
	return 0;
}

/*
 * A cross-attention node's memory: another node of the task, not a loss,
 * not downstream of the node (no cycle through memories either), of the
 * component's memory_width (hidden unless declared). Its seq is free: it
 * is not concatenated, and the memory's positions are those its own
 * source gave it within that source's max_seq.
 */
static int check_memory(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
			int ti, int i, char *seen, int *stack)
{
	const sp_node_t *n = &t->nodes[i];
	const sp_component_t *cp = &m->comps[n->comp];
	if (!cp->cross_attention)
		return 0;
	const sp_node_t *mem = &t->nodes[n->memory];
	if (n->memory == i)
		return bad(r, ti, i, "memory", -1,
			   "a memory is another node, computed before this one "
			   "(an encoder's output)",
			   "node '%s' is its own memory", n->id);
	if (comp_is_sink(m->comps[mem->comp].type))
		return bad(r, ti, i, "memory", -1, NULL,
			   "memory '%s' is a loss node; losses are sinks", mem->id);
	if (flows_into(m, t, i, n->memory, seen, stack))
		return bad(r, ti, i, "memory", -1,
			   "a memory is computed before the node that attends to it",
			   "memory '%s' depends on node '%s' (a cycle)", mem->id, n->id);
	int64_t w = comp_out_width(&m->comps[mem->comp]);
	if (w == cp->memory_width)
		return 0;
	char hint[160];
	if (cp->memory_width == cp->hidden)
		snprintf(hint, sizeof hint,
			 "declare \"memory_width\": %lld on component '%s' (K and V "
			 "project it to %lld)",
			 (long long)w, cp->name, (long long)cp->hidden);
	else
		snprintf(hint, sizeof hint, "set memory_width of component '%s' to %lld",
			 cp->name, (long long)w);
	return bad(r, ti, i, "memory", -1, hint,
		   "width mismatch: memory '%s' has width %lld, expected %lld", mem->id,
		   (long long)w, (long long)cp->memory_width);
}

/* Memory rules of every node (scratch for the cycle walk). */
static int check_memories(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
			  int ti)
{
	char *seen = malloc((size_t)t->n_nodes + 1);
	int *stack = malloc(sizeof(int) * ((size_t)t->n_nodes + 1));
	int rc = 0;
	if (!seen || !stack)
		rc = no_memory(r);
	for (int i = 0; i < t->n_nodes && !rc; i++)
		rc = check_memory(r, m, t, ti, i, seen, stack);
	free(seen);
	free(stack);
	return rc;
}

/* Every node reaches a loss: "reaches" propagated backwards from the losses. */
static int check_reach(const model_report_t *r, const sp_model_t *m, const sp_task_t *t,
		       int ti)
{
	char *reach = calloc((size_t)t->n_nodes, 1);
	if (!reach)
		return no_memory(r);
	for (int i = 0; i < t->n_nodes; i++)
		reach[i] = (char)comp_is_sink(m->comps[t->nodes[i].comp].type);
	for (int changed = 1; changed;) {
		changed = 0;
		for (int i = 0; i < t->n_nodes; i++)
			for (int q = 0; reach[i] && q <= t->nodes[i].n_inputs; q++) {
				int p = pred_of(m, &t->nodes[i], q);
				if (p >= 0 && !reach[p]) {
					reach[p] = 1;
					changed = 1;
				}
			}
	}
	int rc = 0;
	for (int i = 0; i < t->n_nodes && !rc; i++)
		if (!reach[i])
			rc = bad(r, ti, i, "id", -1,
				 "feed it (directly or through other nodes) into an lm_head, "
				 "classifier or contrastive node, or remove it",
				 "node '%s' does not reach any loss", t->nodes[i].id);
	free(reach);
	return rc;
}

int model_check_task(const sp_model_t *m, int ti, const model_report_t *r)
{
	const sp_task_t *t = &m->tasks[ti];
	int rc;
	if ((rc = check_arity(r, m, t, ti)) || (rc = check_acyclic(r, t, ti)))
		return rc;
	for (int i = 0; i < t->n_nodes; i++)
		if ((rc = check_widths(r, m, t, ti, i)) || (rc = check_seqs(r, m, t, ti, i)))
			return rc;
	uint8_t *tokens = calloc((size_t)t->n_nodes + 1, 1);
	if (!tokens)
		return no_memory(r);
	rc = check_lm_targets(r, m, t, ti, tokens);
	free(tokens);
	if (rc)
		return rc;
	if ((rc = check_memories(r, m, t, ti)))
		return rc;
	return check_reach(r, m, t, ti);
}

/* Totals must fit the int64 FLOP and byte arithmetic of the planner. */
static int check_sizes(const model_report_t *r, const sp_model_t *m)
{
	int ovf = 0;
	int64_t total_flops = 0, total_saved = 0, total_params = 0;
	for (int k = 0; k < m->n_comps; k++)
		total_params = sp_add(total_params, comp_params(&m->comps[k]), &ovf);
	if (ovf || sp_mul(total_params, 32, &ovf) > SIZE_LIM || ovf)
		return bad_comp(r, -1, NULL, "the model's parameters are too many for "
					     "64-bit byte arithmetic");
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		for (int i = 0; i < t->n_nodes; i++) {
			const sp_node_t *n = &t->nodes[i];
			sp_opshape_t s = op_shape(m, t, n);
			int64_t layers = n->layer_to - n->layer_from;
			int64_t f = sp_add(op_fwd_flops(&s, t->batch),
					   op_bwd_flops(&s, t->batch), &ovf);
			f = sp_mul(sp_mul(f, layers, &ovf), t->batch, &ovf);
			int64_t a = sp_mul(sp_mul(op_saved_elems(&s, t->batch), layers, &ovf),
					   sp_mul(t->batch, 8, &ovf), &ovf);
			total_flops = sp_add(total_flops, f, &ovf);
			total_saved = sp_add(total_saved, a, &ovf);
			if (ovf || f > SIZE_LIM || a > SIZE_LIM || total_flops > SIZE_LIM ||
			    total_saved > SIZE_LIM)
				return bad(r, ti, i, NULL, -1, "reduce batch, seq or widths",
					   "sizes overflow 64-bit FLOP/byte arithmetic "
					   "(batch %lld, seq %lld)",
					   (long long)t->batch, (long long)n->seq);
		}
	}
	return 0;
}

int model_check_totals(const sp_model_t *m, const model_report_t *r)
{
	for (int k = 0; k < m->n_comps; k++) {
		int used = 0;
		for (int ti = 0; ti < m->n_tasks && !used; ti++)
			for (int i = 0; i < m->tasks[ti].n_nodes; i++)
				used |= m->tasks[ti].nodes[i].comp == k;
		if (!used) {
			model_where_t w = {-1, -1, k, NULL, -1};
			char msg[200];
			snprintf(msg, sizeof msg,
				 "component '%s' is not used by any node: it is neither "
				 "planned nor trained",
				 m->comps[k].name);
			r->report(r->ctx, 0, &w, msg, NULL);
		}
	}
	return check_sizes(r, m);
}

int model_check(const sp_model_t *m, const model_report_t *r)
{
	int rc;
	for (int ti = 0; ti < m->n_tasks; ti++)
		if ((rc = model_check_task(m, ti, r)))
			return rc;
	return model_check_totals(m, r);
}
