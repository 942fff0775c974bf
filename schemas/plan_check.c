/*
 * plan_check.c — checks a plan that plan_decode.c has decoded, before
 * anything uses it: its model's names, field limits, indices and the
 * model's own rules (model_check.c, the same the JSON loader applies), then
 * every index and range of the plan (metaops, edges, waves and slices,
 * buckets, devices, programs) and the finiteness of its predictions. Errors
 * name the section, record and field. It reads no bytes and does not judge
 * the schedule (that is the planner's verifier).
 */
#include "plan_reader.h"

#include <stdlib.h>
#include <string.h>

/* ---- the model: names, limits and indices, then model_check ---------- */

enum {
	U_VOCAB = 1 << 0,
	U_HIDDEN = 1 << 1,
	U_MAX_SEQ = 1 << 2,
	U_IN = 1 << 3,
	U_OUT = 1 << 4,
	U_LAYERS = 1 << 5,
	U_HEADS = 1 << 6,
	U_FFN = 1 << 7,
	U_CLASSES = 1 << 8
};

/* Dimensions each component type uses; the others are 0. */
static const unsigned COMP_USES[COMP__COUNT] = {
	[COMP_EMBEDDING] = U_VOCAB | U_HIDDEN | U_MAX_SEQ,
	[COMP_PATCH] = U_IN | U_HIDDEN | U_MAX_SEQ,
	[COMP_TRANSFORMER] = U_LAYERS | U_HIDDEN | U_HEADS | U_FFN,
	[COMP_LINEAR] = U_IN | U_OUT,
	[COMP_LM_HEAD] = U_HIDDEN | U_VOCAB,
	[COMP_CLASSIFIER] = U_HIDDEN | U_CLASSES,
	[COMP_CONTRASTIVE] = 0,
};

static int64_t comp_nlayers(const sp_component_t *c)
{
	return c->type == COMP_TRANSFORMER ? c->layers : 1;
}

static int check_component(dec_t *d, const sp_component_t *c)
{
	if (pr_name(d, "name", c->name) ||
	    pr_int(d, "type", c->type, 0, COMP__COUNT - 1))
		return d->rc;
	const struct {
		const char *name;
		int64_t v;
		unsigned use;
		int64_t lo, hi;
	} f[] = {
		{"vocab", c->vocab, U_VOCAB, 1, SP_MAX_DIM},
		{"hidden", c->hidden, U_HIDDEN, 1, SP_MAX_DIM},
		{"max_seq", c->max_seq, U_MAX_SEQ, 1, SP_MAX_DIM},
		{"in", c->in, U_IN, 1, SP_MAX_DIM},
		{"out", c->out, U_OUT, 1, SP_MAX_DIM},
		{"layers", c->layers, U_LAYERS, 1, SP_MAX_LAYERS},
		{"heads", c->heads, U_HEADS, 1, SP_MAX_DIM},
		{"ffn", c->ffn, U_FFN, 1, SP_MAX_DIM},
		{"classes", c->classes, U_CLASSES, 2, SP_MAX_DIM},
	};
	const char *tn = comp_type_name(c->type);
	for (int k = 0; k < SP_ARRAY_LEN(f); k++) {
		if (COMP_USES[c->type] & f[k].use) {
			if (pr_int(d, f[k].name, f[k].v, f[k].lo, f[k].hi))
				return d->rc;
		} else if (f[k].v != 0) {
			return pr_fail(d, f[k].name, "%s components have no '%s' "
						  "(expected 0, got %lld)",
				    tn, f[k].name, (long long)f[k].v);
		}
	}
	if (c->type == COMP_TRANSFORMER) {
		if (pr_int(d, "causal", c->causal, 0, 1))
			return d->rc;
		if (c->hidden % c->heads)
			return pr_fail(d, "heads", "hidden %lld is not divisible by "
						"heads %lld",
				    (long long)c->hidden, (long long)c->heads);
		if (pr_int(d, "cross_attention", c->cross_attention, 0, 1))
			return d->rc;
	} else if (c->causal) {
		return pr_fail(d, "causal", "%s components have no 'causal' "
					 "(expected 0)", tn);
	} else if (c->cross_attention) {
		return pr_fail(d, "cross_attention", "%s components have no "
						  "'cross_attention' (expected 0)", tn);
	}
	/* memory_width >= 1 exactly on cross-attention components */
	if (c->cross_attention) {
		if (pr_int(d, "memory_width", c->memory_width, 1, SP_MAX_DIM))
			return d->rc;
	} else if (c->memory_width != 0) {
		return pr_fail(d, "memory_width", "memory width %lld on a component "
						"without cross-attention (expected 0)",
			    (long long)c->memory_width);
	}
	if (c->type == COMP_CONTRASTIVE)
		return pr_num(d, "temperature", c->temperature, 0, 1e6, 1);
	if (c->temperature != 0)
		return pr_fail(d, "temperature", "%s components have no 'temperature' "
					      "(expected 0)", tn);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name of names[0..n) that another one repeats, or NULL. */
static const char *find_dup(const char **names, int n)
{
	qsort(names, (size_t)n, sizeof *names, cmp_str);
	for (int i = 1; i < n; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			return names[i];
	return NULL;
}

/* Names in one scope (components, tasks, one task's nodes) are unique. */
static int check_unique(dec_t *d, const char **tmp, const char *where, const char *field,
			const char *(*name)(const void *, int), const void *arr, int n)
{
	for (int i = 0; i < n; i++)
		tmp[i] = name(arr, i);
	const char *dup = find_dup(tmp, n);
	if (!dup)
		return 0;
	int seen = 0;
	for (int i = 0; i < n; i++)
		if (strcmp(name(arr, i), dup) == 0 && seen++) {
			pr_at(d, where, i);
			return pr_fail(d, field, "duplicate name '%s'", dup);
		}
	return 0;
}

static const char *comp_name(const void *a, int i)
{
	return ((const sp_component_t *)a)[i].name;
}

static const char *task_name(const void *a, int i)
{
	return ((const sp_task_t *)a)[i].name;
}

static const char *node_name(const void *a, int i)
{
	return ((const sp_node_t *)a)[i].id;
}

static int check_node(dec_t *d, const sp_model_t *m, const sp_task_t *t, int i)
{
	const sp_node_t *n = &t->nodes[i];
	if (pr_name(d, "id", n->id) ||
	    pr_index(d, "comp", n->comp, m->n_comps, "component") ||
	    pr_int(d, "seq", n->seq, 1, SP_MAX_DIM))
		return d->rc;
	const sp_component_t *c = &m->comps[n->comp];
	int64_t L = comp_nlayers(c);
	int bad = c->type == COMP_TRANSFORMER
			  ? n->layer_from < 0 || n->layer_from >= n->layer_to ||
				    n->layer_to > L
			  : n->layer_from != 0 || n->layer_to != 1;
	if (bad)
		return pr_fail(d, "layer_from", "layer range [%d, %d) is empty or outside "
					     "component '%s' (%lld layers)",
			    n->layer_from, n->layer_to, c->name, (long long)L);
	/* a memory (a node of the task) exactly on cross-attention nodes; its
	 * other rules (not itself, not a loss, no cycle, width) are model_check's */
	if (c->cross_attention) {
		if (pr_index(d, "memory", n->memory, t->n_nodes, "node"))
			return d->rc;
	} else if (n->memory != -1) {
		return pr_fail(d, "memory", "node '%s' has memory %d, but component '%s' "
					 "has no cross-attention (expected -1)",
			    n->id, n->memory, c->name);
	}
	for (int k = 0; k < n->n_inputs; k++) {
		int v = n->inputs[k];
		if (pr_index(d, "inputs", v, t->n_nodes, "node"))
			return d->rc;
		if (v == i)
			return pr_fail(d, "inputs", "node '%s' is its own input", n->id);
		for (int q = 0; q < k; q++)
			if (n->inputs[q] == v)
				return pr_fail(d, "inputs", "input '%s' is listed twice",
					    t->nodes[v].id);
	}
	return 0;
}

/* Reports a broken model_check rule at the plan record of its element. */
static int plan_report(void *ctx, int code, const model_where_t *w, const char *msg,
		       const char *hint)
{
	dec_t *d = ctx;
	if (code == 0) /* a warning: the planner gave it when it read the model */
		return 0;
	if (code != SP_EINPUT)
		return pr_fail_code(d, code, "%s", msg);
	char field[48] = "";
	if (w->task >= 0) {
		snprintf(d->where_buf, sizeof d->where_buf, "tasks[%d].nodes", w->task);
		pr_at(d, d->where_buf, w->node);
	} else {
		pr_at(d, "components", w->comp);
	}
	if (w->key && w->index >= 0)
		snprintf(field, sizeof field, "%s[%d]", w->key, w->index);
	else if (w->key)
		snprintf(field, sizeof field, "%s", w->key);
	pr_fail(d, field[0] ? field : NULL, "%s", msg);
	if (hint)
		pr_hint(d, "%s", hint);
	return d->rc;
}

static int check_model(dec_t *d, const sp_model_t *m)
{
	pr_at(d, "model", -1);
	if (pr_name(d, "name", m->name) || pr_int(d, "dtype", m->dtype, 0, DT_FP32) ||
	    pr_int(d, "optimizer", m->opt.kind, 0, OPT_SGD) ||
	    pr_num(d, "lr", m->opt.lr, 0, 1e3, 1) ||
	    pr_num(d, "weight_decay", m->opt.weight_decay, 0, 1e3, 0) ||
	    pr_num(d, "beta1", m->opt.beta1, 0, 0.999999, 0) ||
	    pr_num(d, "beta2", m->opt.beta2, 0, 0.999999999, 0) ||
	    pr_num(d, "eps", m->opt.eps, 0, 1, 1))
		return d->rc;
	if (m->seed > (uint64_t)INT64_MAX)
		return pr_fail(d, "seed", "seed %llu is above 2^63 - 1",
			    (unsigned long long)m->seed);
	for (int k = 0; k < m->n_comps; k++) {
		pr_at(d, "components", k);
		if (check_component(d, &m->comps[k]))
			return d->rc;
	}
	int most = SP_MAX(m->n_comps, m->n_tasks);
	for (int ti = 0; ti < m->n_tasks; ti++)
		most = SP_MAX(most, m->tasks[ti].n_nodes);
	const char **tmp = malloc(sizeof *tmp * (size_t)most);
	if (!tmp)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	if (check_unique(d, tmp, "components", "name", comp_name, m->comps, m->n_comps) ||
	    check_unique(d, tmp, "tasks", "name", task_name, m->tasks, m->n_tasks))
		goto cleanup;
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		pr_at(d, "tasks", ti);
		if (pr_name(d, "name", t->name) ||
		    pr_int(d, "batch", t->batch, 1, SP_MAX_BATCH) ||
		    pr_num(d, "weight", t->weight, 0, 1e9, 1))
			goto cleanup;
		snprintf(d->where_buf, sizeof d->where_buf, "tasks[%d].nodes", ti);
		for (int i = 0; i < t->n_nodes; i++) {
			pr_at(d, d->where_buf, i);
			if (check_node(d, m, t, i))
				goto cleanup;
		}
		if (check_unique(d, tmp, d->where_buf, "id", node_name, t->nodes,
				 t->n_nodes))
			goto cleanup;
	}
	model_report_t r = {plan_report, d};
	model_check(m, &r);
cleanup:
	free(tmp);
	return d->rc;
}

/* ---- the plan: every index and range ----------------------------------- */

/* Each task's micro-batches k_t: 1 to the step's K (provenance
 * microbatches), which is the most of them (the step runs K micro-steps). */
static int check_task_k(dec_t *d, const sp_plan_t *p)
{
	int32_t most = 0;
	for (int ti = 0; ti < p->model.n_tasks; ti++) {
		pr_at(d, "tasks", ti);
		if (pr_int(d, "microbatches", p->model.tasks[ti].microbatches, 1, p->microbatches))
			return d->rc;
		most = SP_MAX(most, p->model.tasks[ti].microbatches);
	}
	if (most != p->microbatches) {
		pr_at(d, "provenance", -1);
		return pr_fail(d, "microbatches", "%d micro-steps, but no task has more than %d "
						  "micro-batches",
			       (int)p->microbatches, (int)most);
	}
	return 0;
}

static int check_provenance(dec_t *d, const sp_plan_t *p)
{
	pr_at(d, "provenance", -1);
	if (pr_name(d, "cluster_name", p->cluster_name) ||
	    pr_int(d, "nodes", p->nodes, 1, 4096) ||
	    pr_int(d, "gpus_per_node", p->gpus_per_node, 1, 256) ||
	    pr_num(d, "memory_gib", p->memory_gib, 0, 1e6, 1) ||
	    pr_num(d, "mem_reserve_gib", p->mem_reserve_gib, 0, 1e6, 0) ||
	    pr_int(d, "microbatches", p->microbatches, 1, SP_MAX_MICROBATCHES))
		return d->rc;
	if (!p->gpu_name[0])
		return pr_fail(d, "gpu_name", "empty GPU name");
	if ((int64_t)p->nodes * p->gpus_per_node > SP_MAX_DEVICES)
		return pr_fail(d, "nodes", "%lld devices in all; at most %d supported",
			    (long long)p->nodes * p->gpus_per_node, SP_MAX_DEVICES);
	return check_task_k(d, p);
}

static int check_shape(dec_t *d, const sp_opshape_t *s)
{
	const struct {
		const char *name;
		int64_t v;
	} f[] = {
		{"shape.hidden", s->hidden}, {"shape.heads", s->heads},
		{"shape.ffn", s->ffn},       {"shape.seq", s->seq},
		{"shape.in", s->in},         {"shape.out", s->out},
		{"shape.vocab", s->vocab},   {"shape.classes", s->classes},
		{"mem_seq", s->mem_seq},     {"mem_width", s->mem_width},
	};
	if (pr_int(d, "shape.type", s->type, 0, COMP__COUNT - 1) ||
	    pr_int(d, "shape.causal", s->causal, 0, 1))
		return d->rc;
	for (int k = 0; k < SP_ARRAY_LEN(f); k++)
		if (pr_int(d, f[k].name, f[k].v, 0, SP_MAX_DIM))
			return d->rc;
	/* a memory (mem_seq tokens of width mem_width) only on transformers */
	if ((s->mem_seq > 0) != (s->mem_width > 0))
		return pr_fail(d, "mem_seq", "a memory of %lld tokens of width %lld "
					  "(both 0, or both at least 1)",
			    (long long)s->mem_seq, (long long)s->mem_width);
	if (s->mem_seq > 0 && s->type != COMP_TRANSFORMER)
		return pr_fail(d, "mem_seq", "a memory on a %s metaop (only "
					  "cross-attention transformers have one)",
			    comp_type_name(s->type));
	return 0;
}

/* batch x seq x width of a value must stay below MAX_VALUE_ELEMS */
static int chk_value_size(dec_t *d, const char *field, int64_t batch, int64_t seq,
			  int64_t width)
{
	int ovf = 0;
	int64_t n = sp_mul(sp_mul(batch, seq, &ovf), width, &ovf);
	if (!ovf && n <= MAX_VALUE_ELEMS)
		return 0;
	return pr_fail(d, field, "a value of %lld x %lld x %lld elements is too large",
		    (long long)batch, (long long)seq, (long long)width);
}

/* One layer over the whole batch: FLOPs and saved bytes fit int64 with room,
 * as model_load.c checks for every node (of at least one layer). */
static int chk_layer_size(dec_t *d, const sp_opshape_t *s, int64_t batch)
{
	const int64_t LIM = (int64_t)1 << 60;
	int ovf = 0;
	int64_t f = sp_add(op_fwd_flops(s, batch), op_bwd_flops(s, batch), &ovf);
	f = sp_mul(f, batch, &ovf);
	int64_t a = sp_mul(op_saved_elems(s, batch), sp_mul(batch, 8, &ovf), &ovf);
	if (!ovf && f <= LIM && a <= LIM)
		return 0;
	return pr_fail(d, "shape", "one layer's FLOPs or saved bytes overflow 64-bit "
				"arithmetic (batch %lld)", (long long)batch);
}

/* Operator node n of metaop m (index i) has m's memory: mem_seq and
 * mem_width are its memory's seq and its component's memory_width (0, 0
 * without cross-attention), and the memory node is the same for every
 * operator (*head, -1 before the first). */
static int chk_op_memory(dec_t *d, const sp_model_t *md, const sp_task_t *t,
			 const sp_node_t *n, const sp_metaop_t *m, int i, int *head)
{
	const sp_component_t *c = &md->comps[n->comp];
	int64_t seq = c->cross_attention ? t->nodes[n->memory].seq : 0;
	if (seq != m->shape.mem_seq || c->memory_width != m->shape.mem_width)
		return pr_fail(d, "node", "node '%s' has a memory of %lld tokens of "
					  "width %lld, metaops[%d] one of %lld of width %lld",
			    n->id, (long long)seq, (long long)c->memory_width, i,
			    (long long)m->shape.mem_seq, (long long)m->shape.mem_width);
	if (!c->cross_attention)
		return 0;
	if (*head >= 0 && n->memory != *head)
		return pr_fail(d, "node", "node '%s' attends to memory '%s', the "
					  "metaop's first node to '%s' (a metaop has "
					  "one memory)",
			    n->id, t->nodes[n->memory].id, t->nodes[*head].id);
	*head = n->memory;
	return 0;
}

static int check_metaops(dec_t *d, const sp_plan_t *p)
{
	const sp_model_t *md = &p->model;
	for (int i = 0; i < p->n_metaops; i++) {
		const sp_metaop_t *m = &p->metaops[i];
		pr_at(d, "metaops", i);
		if (pr_index(d, "task", m->task, md->n_tasks, "task") ||
		    check_shape(d, &m->shape) ||
		    pr_int(d, "n_layers", m->n_layers, 1, INT32_MAX) ||
		    pr_span(d, "first_op", m->first_op, m->n_layers, p->n_ops, "ops") ||
		    pr_int(d, "seq_in", m->seq_in, 0, SP_MAX_DIM) ||
		    pr_int(d, "width_in", m->width_in, 0, SP_MAX_DIM) ||
		    pr_int(d, "seq_out", m->seq_out, 0, SP_MAX_DIM) ||
		    pr_int(d, "width_out", m->width_out, 0, SP_MAX_DIM))
			return d->rc;
		const sp_task_t *t = &md->tasks[m->task];
		if (chk_layer_size(d, &m->shape, t->batch) ||
		    chk_value_size(d, "seq_in", t->batch, m->seq_in, m->width_in) ||
		    chk_value_size(d, "seq_out", t->batch, m->seq_out, m->width_out) ||
		    chk_value_size(d, "mem_seq", t->batch, m->shape.mem_seq,
				   m->shape.mem_width) ||
		    pr_finite(d, "fwd_ms", m->fwd_ms) ||
		    pr_finite(d, "bwd_ms", m->bwd_ms) ||
		    pr_int(d, "profiled", m->profiled, 0, 1))
			return d->rc;
		if (!m->name[0])
			return pr_fail(d, "name", "empty metaop name");
		/* its operators: nodes of its task, layers inside each node's
		 * range, each with the metaop's memory: none, or the same
		 * memory node (of mem_seq tokens, mem_width wide) for all */
		int head_memory = -1;
		for (int k = 0; k < m->n_layers; k++) {
			const sp_op_t *o = &p->ops[m->first_op + k];
			pr_at(d, "ops", m->first_op + k);
			if (pr_index(d, "node", o->node, t->n_nodes, "node"))
				return d->rc;
			const sp_node_t *n = &t->nodes[o->node];
			if (o->layer < n->layer_from || o->layer >= n->layer_to)
				return pr_fail(d, "layer", "layer %d is outside the layers "
							"[%d, %d) of node '%s' "
							"(metaops[%d])",
					    o->layer, n->layer_from, n->layer_to, n->id,
					    i);
			if (chk_op_memory(d, md, t, n, m, i, &head_memory))
				return d->rc;
			/* the layers run with the metaop's shape, the parameters
			 * are sized by the node's component: they must agree */
			sp_opshape_t want = op_shape(md, t, n);
			if (!opshape_equal(&m->shape, &want)) {
				char got_s[160], want_s[160];
				opshape_str(got_s, sizeof got_s, &m->shape);
				opshape_str(want_s, sizeof want_s, &want);
				return pr_fail(d, "node", "metaops[%d] has shape '%s' but node "
							 "'%s' of its layer %d is '%s' in the model",
					    i, got_s, n->id, o->layer, want_s);
			}
		}
		/* its values' shapes follow from its first and last nodes */
		pr_at(d, "metaops", i);
		sp_metaop_io_t io =
			metaop_io(md, t, &t->nodes[p->ops[m->first_op].node],
				  &t->nodes[p->ops[m->first_op + m->n_layers - 1].node]);
		const char *field = m->seq_in != io.seq_in       ? "seq_in"
				    : m->width_in != io.width_in   ? "width_in"
				    : m->seq_out != io.seq_out     ? "seq_out"
				    : m->width_out != io.width_out ? "width_out"
								   : NULL;
		if (field)
			return pr_fail(d, field, "metaop '%s' reads [%d x %d] and writes "
						    "[%d x %d], but its nodes in the model make "
						    "[%lld x %lld] and [%lld x %lld]",
				    m->name, (int)m->seq_in, (int)m->width_in, (int)m->seq_out,
				    (int)m->width_out, (long long)io.seq_in,
				    (long long)io.width_in, (long long)io.seq_out,
				    (long long)io.width_out);
	}
	return 0;
}

/*
 * A memory edge (memory = 1) carries the producer's whole output, act(src,
 * L), to act(dst, -1): dst is a decoder (mem_seq > 0), seq_off 0, seq_len
 * its mem_seq; src, of the same task, ends with the node that dst's nodes
 * attend to, and outputs mem_seq tokens of width mem_width.
 */
static int chk_memory_edge(dec_t *d, const sp_plan_t *p, const sp_edge_t *e)
{
	const sp_metaop_t *src = &p->metaops[e->src], *dst = &p->metaops[e->dst];
	if (dst->shape.mem_seq == 0)
		return pr_fail(d, "memory", "memory edge into metaop '%s', which has no "
					 "memory (not a cross-attention decoder)",
			    dst->name);
	if (e->seq_off != 0 || e->seq_len != dst->shape.mem_seq)
		return pr_fail(d, "seq_len", "a memory edge carries the whole memory: "
					  "seq_off 0 and seq_len %lld (got %d and %d)",
			    (long long)dst->shape.mem_seq, e->seq_off, e->seq_len);
	const sp_task_t *t = &p->model.tasks[dst->task];
	int mem = t->nodes[p->ops[dst->first_op].node].memory;
	int last = p->ops[src->first_op + src->n_layers - 1].node;
	if (src->task != dst->task || last != mem)
		return pr_fail(d, "src", "metaop '%s' does not end with node '%s', the "
					 "memory of metaop '%s'",
			    src->name, t->nodes[mem].id, dst->name);
	if (src->seq_out != e->seq_len || src->width_out != dst->shape.mem_width)
		return pr_fail(d, "src", "metaop '%s' outputs %d tokens of width %d, "
					 "not the memory of metaop '%s' (%lld of width %lld)",
			    src->name, src->seq_out, src->width_out, dst->name,
			    (long long)dst->shape.mem_seq, (long long)dst->shape.mem_width);
	return 0;
}

/* Input edges feed a span of the consumer's input; every decoder has
 * exactly one memory edge (count: n_metaops zeroed ints). */
static int check_edges(dec_t *d, const sp_plan_t *p, int32_t *count)
{
	for (int i = 0; i < p->n_edges; i++) {
		const sp_edge_t *e = &p->edges[i];
		pr_at(d, "edges", i);
		if (pr_index(d, "src", e->src, p->n_metaops, "metaop") ||
		    pr_index(d, "dst", e->dst, p->n_metaops, "metaop") ||
		    pr_int(d, "memory", e->memory, 0, 1))
			return d->rc;
		if (e->src == e->dst)
			return pr_fail(d, "dst", "metaop %d feeds itself", e->src);
		if (e->memory) {
			if (chk_memory_edge(d, p, e))
				return d->rc;
			if (count[e->dst]++)
				return pr_fail(d, "dst", "a second memory edge into "
							"metaop '%s'",
					    p->metaops[e->dst].name);
			continue;
		}
		if (pr_span(d, "seq_off", e->seq_off, e->seq_len,
			     p->metaops[e->dst].seq_in,
			     "tokens of the consumer's input") ||
		    pr_int(d, "seq_len", e->seq_len, 0, p->metaops[e->src].seq_out))
			return d->rc;
	}
	for (int m = 0; m < p->n_metaops; m++)
		if (p->metaops[m].shape.mem_seq > 0 && !count[m]) {
			pr_at(d, "metaops", m);
			return pr_fail(d, "mem_seq", "decoder metaop '%s' has no memory "
						  "edge (from the metaop that computes "
						  "its memory)",
				    p->metaops[m].name);
		}
	return 0;
}

/* Indices into the device list, stored in slice_devs and bucket_devs. */
static int check_dev_list(dec_t *d, const char *where, const int32_t *a, int n,
			  int n_devices)
{
	for (int i = 0; i < n; i++) {
		pr_at(d, where, i);
		if (pr_index(d, NULL, a[i], n_devices, "device"))
			return d->rc;
	}
	return 0;
}

static int check_params(dec_t *d, const char *where, const sp_param_t *a, int n,
			const sp_model_t *m)
{
	for (int i = 0; i < n; i++) {
		pr_at(d, where, i);
		if (pr_index(d, "comp", a[i].comp, m->n_comps, "component") ||
		    pr_index(d, "layer", a[i].layer, comp_nlayers(&m->comps[a[i].comp]),
			      "layer") ||
		    pr_int(d, "tp", a[i].tp, 1, SP_MAX_TP) ||
		    pr_index(d, "tp_rank", a[i].tp_rank, a[i].tp, "shard"))
			return d->rc;
		const sp_component_t *c = &m->comps[a[i].comp];
		if (!tp_ok(c->type, c->heads, c->ffn, c->vocab, a[i].tp))
			return pr_fail(d, "tp", "component '%s' cannot be split %d ways "
						 "(only transformers whose heads and ffn "
						 "the degree divides, embeddings and LM "
						 "heads of at least that many ids)",
				    c->name, a[i].tp);
		if (a[i].tp > 1 && c->cross_attention)
			return pr_fail(d, "tp", "component '%s' has cross-attention: "
						 "decoders are not split (tp 1, not %d)",
				    c->name, a[i].tp);
	}
	return 0;
}

/* slices[s].wave == w exactly when s is in waves[w]'s slice range */
static int check_waves_slices(dec_t *d, const sp_plan_t *p, int32_t *stamp)
{
	for (int w = 0; w < p->n_waves; w++) {
		const sp_wave_t *x = &p->waves[w];
		pr_at(d, "waves", w);
		if (pr_span(d, "first_slice", x->first_slice, x->n_slices, p->n_slices,
			     "slices") ||
		    pr_finite(d, "start_ms", x->start_ms) ||
		    pr_finite(d, "dur_ms", x->dur_ms) ||
		    pr_finite(d, "bwd_start_ms", x->bwd_start_ms) ||
		    pr_finite(d, "bwd_dur_ms", x->bwd_dur_ms))
			return d->rc;
		for (int s = x->first_slice; s < x->first_slice + x->n_slices; s++)
			if (p->slices[s].wave != w)
				return pr_fail(d, "first_slice",
					    "slice %d is in this wave's range but "
					    "belongs to wave %d",
					    s, p->slices[s].wave);
	}
	for (int s = 0; s < p->n_slices; s++) {
		const sp_slice_t *x = &p->slices[s];
		pr_at(d, "slices", s);
		if (pr_index(d, "wave", x->wave, p->n_waves, "wave") ||
		    pr_index(d, "metaop", x->metaop, p->n_metaops, "metaop"))
			return d->rc;
		const sp_wave_t *w = &p->waves[x->wave];
		if (s < w->first_slice || s >= w->first_slice + w->n_slices)
			return pr_fail(d, "wave", "slice is not in the slice range [%d, %d) "
					       "of wave %d",
				    w->first_slice, w->first_slice + w->n_slices,
				    x->wave);
		int32_t L = p->metaops[x->metaop].n_layers;
		if (x->layer_from < 0 || x->layer_from >= x->layer_to || x->layer_to > L)
			return pr_fail(d, "layer_from", "layer range [%d, %d) is empty or "
						     "outside the metaop's %d layers",
				    x->layer_from, x->layer_to, L);
		if (pr_int(d, "n_dev", x->n_dev, 1, p->n_devices) ||
		    pr_span(d, "dev_off", x->dev_off, x->n_dev, p->n_slice_devs,
			     "slice devices") ||
		    pr_finite(d, "start_ms", x->start_ms) ||
		    pr_finite(d, "fwd_ms", x->fwd_ms) ||
		    pr_finite(d, "bwd_start_ms", x->bwd_start_ms) ||
		    pr_finite(d, "bwd_ms", x->bwd_ms) ||
		    pr_int(d, "recompute", x->recompute, 0, 1) ||
		    pr_int(d, "tp", x->tp, 1, SP_MAX_TP) || pr_int(d, "sp", x->sp, 0, 1))
			return d->rc;
		const sp_opshape_t *sh = &p->metaops[x->metaop].shape;
		if (x->n_dev % x->tp != 0)
			return pr_fail(d, "tp", "tensor-parallel degree %d does not divide "
						 "the slice's %d devices",
				    x->tp, x->n_dev);
		if (!tp_ok(sh->type, sh->heads, sh->ffn, sh->vocab, x->tp))
			return pr_fail(d, "tp", "metaop '%s' cannot be split %d ways "
						 "(only transformers whose heads and ffn "
						 "the degree divides, embeddings and LM "
						 "heads of at least that many ids)",
				    p->metaops[x->metaop].name, x->tp);
		if (x->tp > 1 && sh->mem_seq > 0)
			return pr_fail(d, "tp", "metaop '%s' is a cross-attention decoder: "
						 "decoders are not split (tp 1, not %d)",
				    p->metaops[x->metaop].name, x->tp);
		if (x->sp && !sp_ok(sh, x->tp))
			return pr_fail(d, "sp", "sequence parallelism on metaop '%s' split %d "
						"ways (only a split transformer, not a decoder, "
						"whose seq %lld the degree divides)",
				    p->metaops[x->metaop].name, x->tp, (long long)sh->seq);
		if (x->recompute && p->metaops[x->metaop].shape.type != COMP_TRANSFORMER)
			return pr_fail(d, "recompute", "recomputation on metaop '%s', which is "
						    "not a transformer (only transformer "
						    "layers recompute)",
				    p->metaops[x->metaop].name);
		for (int k = 0; k < x->n_dev; k++) {
			int32_t dev = p->slice_devs[x->dev_off + k];
			if (stamp[dev] == s + 1)
				return pr_fail(d, "dev_off", "device %d is twice in the "
							  "slice's group", dev);
			stamp[dev] = s + 1;
		}
	}
	return 0;
}

static int check_buckets(dec_t *d, const sp_plan_t *p)
{
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *x = &p->buckets[b];
		pr_at(d, "buckets", b);
		if (pr_int(d, "n_dev", x->n_dev, 1, p->n_devices) ||
		    pr_span(d, "dev_off", x->dev_off, x->n_dev, p->n_bucket_devs,
			     "bucket devices") ||
		    pr_span(d, "param_off", x->param_off, x->n_params,
			     p->n_bucket_params, "bucket params") ||
		    pr_int(d, "elems", x->elems, 0, INT64_MAX) ||
		    pr_finite(d, "sync_ms", x->sync_ms) ||
		    pr_int(d, "layout", x->layout, 0, LAYOUT__COUNT - 1) ||
		    pr_finite(d, "gather_ms", x->gather_ms) ||
		    pr_int(d, "overlap", x->overlap, 0, 1) ||
		    pr_int(d, "defer", x->defer, 0, SP_MAX(x->n_params, 1)))
			return d->rc;
		if (x->defer && !layout_gathers_after_step(x->layout))
			return pr_fail(d, "defer", "set on a %s bucket: only zero-1 and zero-2 "
						 "all-gathers run after the STEP",
				       layout_name(x->layout));
		if (x->overlap && !layout_grads_sharded(x->layout))
			return pr_fail(d, "overlap", "set on a %s bucket: only zero-2 and zero-3 "
						   "reduce-scatters complete at a placement",
				       layout_name(x->layout));
		if (layout_sharded(x->layout) && x->n_dev < 2)
			return pr_fail(d, "layout", "%s over a single device: there "
						 "is nothing to shard", layout_name(x->layout));
		const int32_t *dv = p->bucket_devs + x->dev_off;
		for (int k = 1; k < x->n_dev; k++)
			if (dv[k] <= dv[k - 1])
				return pr_fail(d, "dev_off", "devices are not ascending and "
							  "distinct (%d after %d)",
					    dv[k], dv[k - 1]);
	}
	return 0;
}

static int check_devices(dec_t *d, const sp_plan_t *p)
{
	/* machine and GPU index: in the cluster, one device each */
	size_t n_slots = (size_t)p->nodes * (size_t)p->gpus_per_node;
	char *used = calloc(n_slots, 1);
	if (!used)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	for (int i = 0; i < p->n_devices && !d->rc; i++) {
		const sp_device_t *x = &p->devices[i];
		pr_at(d, "devices", i);
		if (pr_int(d, "node", x->node, 0, p->nodes - 1) ||
		    pr_int(d, "local", x->local, 0, p->gpus_per_node - 1) ||
		    pr_span(d, "first_ins", x->first_ins, x->n_ins, p->n_ins,
			     "instructions") ||
		    pr_span(d, "held_off", x->held_off, x->n_held, p->n_held,
			     "held params") ||
		    pr_int(d, "mem_peak", x->mem_peak, 0, INT64_MAX) ||
		    pr_finite(d, "busy_ms", x->busy_ms) ||
		    pr_finite(d, "comm_ms", x->comm_ms) ||
		    pr_finite(d, "idle_ms", x->idle_ms) ||
		    pr_finite(d, "finish_ms", x->finish_ms))
			break;
		for (int k = 0; k < MEM__COUNT; k++)
			if (pr_int(d, "mem", x->mem[k], 0, INT64_MAX))
				break;
		size_t slot = (size_t)x->node * (size_t)p->gpus_per_node +
			      (size_t)x->local;
		if (!d->rc && used[slot])
			pr_fail(d, "local", "node %d GPU %d is already another device",
			     x->node, x->local);
		used[slot] = 1;
	}
	free(used);
	return d->rc;
}

/* [s0, s1) inside the batch of metaop m's task */
static int chk_samples(dec_t *d, const sp_plan_t *p, const sp_ins_t *in, int m)
{
	int64_t B = p->model.tasks[p->metaops[m].task].batch;
	if (in->s0 >= 0 && in->s0 <= in->s1 && in->s1 <= B)
		return 0;
	return pr_fail(d, "s0", "sample range [%d, %d) is outside the task's batch "
			     "[0, %lld)",
		    in->s0, in->s1, (long long)B);
}

/* A value reference: metaop, boundary (-1: a decoder's memory), act/grad,
 * seq range of seq_len tokens. */
static int chk_vref(dec_t *d, const sp_plan_t *p, const sp_ins_t *in, const char *name,
		    const sp_vref_t *v)
{
	char f[4][24];
	snprintf(f[0], sizeof f[0], "%s.metaop", name);
	snprintf(f[1], sizeof f[1], "%s.layer", name);
	snprintf(f[2], sizeof f[2], "%s.grad", name);
	snprintf(f[3], sizeof f[3], "%s.seq_off", name);
	if (pr_index(d, f[0], v->metaop, p->n_metaops, "metaop") ||
	    pr_int(d, f[1], v->layer, -1, p->metaops[v->metaop].n_layers) ||
	    pr_int(d, f[2], v->grad, 0, 1))
		return d->rc;
	const sp_metaop_t *m = &p->metaops[v->metaop];
	if (v->layer == -1 && m->shape.mem_seq == 0)
		return pr_fail(d, f[1], "layer -1 (the memory) of metaop '%s', which has "
					 "none (only cross-attention decoders have one)",
			    m->name);
	int32_t seq, width;
	plan_value_shape(p, v->metaop, v->layer, &seq, &width);
	if (pr_int(d, "seq_len", in->seq_len, 0, INT32_MAX) ||
	    pr_span(d, f[3], v->seq_off, in->seq_len, seq, "tokens of the value"))
		return d->rc;
	return chk_samples(d, p, in, v->metaop);
}

static int check_ins(dec_t *d, const sp_plan_t *p, const sp_ins_t *in)
{
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		if (pr_index(d, "slice", in->slice, p->n_slices, "slice"))
			return d->rc;
		int m = p->slices[in->slice].metaop;
		if (in->op == INS_LOSS && !comp_is_sink(p->metaops[m].shape.type))
			return pr_fail(d, "slice", "loss of slice %d, whose metaop '%s' "
						"is not a loss",
				    in->slice, p->metaops[m].name);
		/* the values a compute instruction reads and writes are implied
		 * by its slice; the runtime indexes them, so they must match */
		const sp_slice_t *sl = &p->slices[in->slice];
		int a = sl->layer_from, b = sl->layer_to;
		sp_vref_t src = {m, a, 0, 0}, dst = {m, b, 0, 0};
		if (in->op == INS_BWD) {
			src = (sp_vref_t){m, b, 1, 0};
			dst = (sp_vref_t){m, a, 1, 0};
		} else if (in->op == INS_LOSS) {
			src = (sp_vref_t){m, 0, 0, 0};
			dst = (sp_vref_t){m, 0, 1, 0};
		}
		int bad_src = memcmp(&in->src, &src, sizeof src) != 0;
		if (bad_src || memcmp(&in->dst, &dst, sizeof dst))
			return pr_fail(d, bad_src ? "src" : "dst", "values (metaop %d layer %d grad %d, metaop %d "
					      "layer %d grad %d) do not match slice %d",
				    in->src.metaop, in->src.layer, in->src.grad, in->dst.metaop,
				    in->dst.layer, in->dst.grad, in->slice);
		return chk_samples(d, p, in, m);
	}
	case INS_SEND:
	case INS_RECV:
		if (pr_index(d, "peer", in->peer, p->n_devices, "device") ||
		    pr_int(d, "tag", in->tag, 0, INT32_MAX))
			return d->rc;
		return in->op == INS_SEND ? chk_vref(d, p, in, "src", &in->src)
					  : chk_vref(d, p, in, "dst", &in->dst);
	case INS_COPY: {
		if (chk_vref(d, p, in, "src", &in->src) ||
		    chk_vref(d, p, in, "dst", &in->dst))
			return d->rc;
		int32_t sq, ws, wd;
		plan_value_shape(p, in->src.metaop, in->src.layer, &sq, &ws);
		plan_value_shape(p, in->dst.metaop, in->dst.layer, &sq, &wd);
		if (ws != wd)
			return pr_fail(d, "dst", "copy between values of widths %d and %d",
				    ws, wd);
		/* a micro-step skips a task's copies (plan_ins_active): both
		 * values are one task's */
		if (p->metaops[in->src.metaop].task != p->metaops[in->dst.metaop].task)
			return pr_fail(d, "dst", "copy between values of tasks %d and %d",
				       p->metaops[in->src.metaop].task,
				       p->metaops[in->dst.metaop].task);
		return 0;
	}
	case INS_SYNC: return pr_index(d, "peer", in->peer, p->n_buckets, "bucket");
	case INS_GATHER:
		if (pr_index(d, "peer", in->peer, p->n_buckets, "bucket"))
			return d->rc;
		if (!layout_gathers_after_step(p->buckets[in->peer].layout))
			return pr_fail(d, "peer", "all-gather of bucket %d, whose parameters "
					       "are not sharded by zero-1 or zero-2", in->peer);
		return 0;
	case INS_PGATHER:
	case INS_PFREE:
		if (pr_index(d, "peer", in->peer, p->n_buckets, "bucket"))
			return d->rc;
		if (p->buckets[in->peer].layout != LAYOUT_ZERO3)
			return pr_fail(d, "peer", "%s of bucket %d, whose weights are not "
					       "sharded (layout %s, not zero-3)",
				       ins_op_name(in->op), in->peer,
				       layout_name(p->buckets[in->peer].layout));
		return 0;
	case INS_STEP: return 0;
	default: return pr_fail(d, "op", "unknown instruction op code %d", in->op);
	}
}

/*
 * Programs do not share instructions (so checking them costs O(n_ins)), and a
 * device does not send to or receive from itself.
 */
static int check_programs(dec_t *d, const sp_plan_t *p)
{
	int32_t *owner = calloc(p->n_ins ? (size_t)p->n_ins : 1, sizeof *owner);
	if (!owner)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	for (int dev = 0; dev < p->n_devices && !d->rc; dev++) {
		const sp_device_t *x = &p->devices[dev];
		for (int k = x->first_ins; k < x->first_ins + x->n_ins; k++) {
			if (owner[k]) {
				pr_at(d, "devices", dev);
				pr_fail(d, "first_ins", "instruction %d is also in "
						     "the program of device %d",
				     k, owner[k] - 1);
				break;
			}
			owner[k] = dev + 1;
		}
	}
	for (int i = 0; i < p->n_ins && !d->rc; i++) {
		const sp_ins_t *in = &p->ins[i];
		int dev = owner[i] - 1;
		pr_at(d, "instructions", i);
		if (check_ins(d, p, in))
			break;
		if ((in->op == INS_SEND || in->op == INS_RECV) && in->peer == dev)
			pr_fail(d, "peer", "device %d %s itself", dev,
			     in->op == INS_SEND ? "sends to" : "receives from");
	}
	free(owner);
	return d->rc;
}

static int check_results(dec_t *d, const sp_plan_t *p)
{
	const sp_cert_t *c = &p->cert;
	const struct {
		const char *name;
		double v;
	} f[] = {
		{"iteration_ms", c->iteration_ms},
		{"compute_ms", c->compute_ms},
		{"transfer_ms", c->transfer_ms},
		{"sync_ms", c->sync_ms},
		{"step_ms", c->step_ms},
		{"area_bound_ms", c->area_bound_ms},
		{"cp_bound_ms", c->cp_bound_ms},
		{"paper_bound_ms", c->paper_bound_ms},
		{"lower_bound_ms", c->lower_bound_ms},
		{"allot_bound_ms", c->allot_bound_ms},
		{"gap", c->gap},
		{"xfer_pred_ms", c->xfer_pred_ms},
		{"naive_xfer_pred_ms", c->naive_xfer_pred_ms},
		{"comm_lower_bound_ms", c->comm_lower_bound_ms},
	};
	pr_at(d, "certificate", -1);
	for (int k = 0; k < SP_ARRAY_LEN(f); k++)
		if (pr_finite(d, f[k].name, f[k].v))
			return d->rc;
	if (pr_int(d, "xnode_bytes", c->xnode_bytes, 0, INT64_MAX) ||
	    pr_int(d, "naive_xnode_bytes", c->naive_xnode_bytes, 0, INT64_MAX))
		return d->rc;
	for (int i = 0; i < p->n_algos; i++) {
		const sp_algo_result_t *a = &p->algos[i];
		pr_at(d, "algorithms", i);
		if (!a->name[0])
			return pr_fail(d, "name", "empty algorithm name");
		if (pr_finite(d, "iteration_ms", a->iteration_ms) ||
		    pr_finite(d, "compute_ms", a->compute_ms) ||
		    pr_finite(d, "planning_ms", a->planning_ms) ||
		    pr_finite(d, "utilisation", a->utilisation) ||
		    pr_int(d, "fits_memory", a->fits_memory, 0, 1))
			return d->rc;
	}
	return 0;
}

/* Order matters: each check relies only on what the checks before it proved. */
int pr_check(dec_t *d, const sp_plan_t *p)
{
	if (check_model(d, &p->model) || check_provenance(d, p) || check_metaops(d, p))
		return d->rc;
	int32_t *count = calloc(p->n_metaops ? (size_t)p->n_metaops : 1, sizeof *count);
	if (!count)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	check_edges(d, p, count);
	free(count);
	if (d->rc ||
	    check_dev_list(d, "slice_devs", p->slice_devs, p->n_slice_devs,
			   p->n_devices) ||
	    check_dev_list(d, "bucket_devs", p->bucket_devs, p->n_bucket_devs,
			   p->n_devices) ||
	    check_params(d, "bucket_params", p->bucket_params, p->n_bucket_params,
			 &p->model) ||
	    check_params(d, "held", p->held, p->n_held, &p->model) ||
	    check_buckets(d, p) || check_devices(d, p))
		return d->rc;
	int32_t *stamp = calloc((size_t)p->n_devices, sizeof *stamp);
	if (!stamp)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	if (!check_waves_slices(d, p, stamp) && !check_programs(d, p))
		check_results(d, p);
	free(stamp);
	return d->rc;
}
