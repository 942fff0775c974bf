/*
 * model_load.c — reads spindle.model/1 (schemas/model.schema.json) into an
 * sp_model_t: types, keys, limits and names as the schema says, references
 * resolved (inputs and cross-attention memories), hidden % heads == 0, a
 * memory written exactly on cross-attention nodes, loss nodes' seqs filled
 * in; then the rules of every model, whatever its format (task graphs
 * acyclic, sources, arities, widths and seqs agreeing, memories, every node
 * reaching a loss, sizes fitting int64 arithmetic), by model_check.c, with
 * errors located in the JSON text. It does not plan anything; the first problem found is reported.
 */
#include "jsonutil.h"
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const char *const COMP_TYPES[COMP__COUNT] = {
	"embedding", "patch", "transformer", "linear", "lm_head", "classifier",
	"contrastive"};
static const char *const DTYPES[] = {"bf16", "fp16", "fp32"};
static const char *const OPTS[] = {"adamw", "sgd"};

const char *comp_type_name(sp_comp_type_t t)
{
	return (unsigned)t < COMP__COUNT ? COMP_TYPES[t] : "?";
}

const char *dtype_name(sp_dtype_t d)
{
	return (unsigned)d < 3 ? DTYPES[d] : "?";
}

int dtype_bytes(sp_dtype_t d)
{
	return d == DT_FP32 ? 4 : 2;
}

void model_release(sp_model_t *m)
{
	if (!m)
		return;
	for (int t = 0; t < m->n_tasks; t++) {
		for (int i = 0; i < m->tasks[t].n_nodes; i++)
			free(m->tasks[t].nodes[i].inputs);
		free(m->tasks[t].nodes);
	}
	free(m->tasks);
	free(m->comps);
	memset(m, 0, sizeof *m);
}

/* Keys each component type takes besides "type" (required unless noted). */
static const char *const *comp_keys(sp_comp_type_t t)
{
	static const char *const emb[] = {"type", "vocab", "hidden", "max_seq", NULL};
	static const char *const patch[] = {"type", "in", "hidden", "max_seq", NULL};
	static const char *const tr[] = {"type", "layers", "hidden", "heads", "ffn",
					 "causal", "cross_attention", "memory_width",
					 NULL};
	static const char *const lin[] = {"type", "in", "out", NULL};
	static const char *const lm[] = {"type", "hidden", "vocab", NULL};
	static const char *const cls[] = {"type", "hidden", "classes", NULL};
	static const char *const con[] = {"type", "temperature", NULL};
	switch (t) {
	case COMP_EMBEDDING: return emb;
	case COMP_PATCH: return patch;
	case COMP_TRANSFORMER: return tr;
	case COMP_LINEAR: return lin;
	case COMP_LM_HEAD: return lm;
	case COMP_CLASSIFIER: return cls;
	default: return con;
	}
}

/* A component's required integer fields: where they go, their limits. */
typedef struct {
	const char *key;
	size_t off;
	int64_t lo, hi;
} int_field_t;

static const int_field_t *int_field(const char *key)
{
#define F(k, lo, hi) {#k, offsetof(sp_component_t, k), lo, hi}
	static const int_field_t fields[] = {
		F(vocab, 1, SP_MAX_DIM), F(hidden, 1, SP_MAX_DIM), F(max_seq, 1, SP_MAX_DIM),
		F(in, 1, SP_MAX_DIM),    F(out, 1, SP_MAX_DIM),    F(layers, 1, SP_MAX_LAYERS),
		F(heads, 1, SP_MAX_DIM), F(ffn, 1, SP_MAX_DIM),    F(classes, 2, SP_MAX_DIM)};
#undef F
	for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
		if (strcmp(fields[i].key, key) == 0)
			return &fields[i];
	return NULL;
}

/* A cross-attention transformer's memory width: "memory_width" when
 * declared (only with "cross_attention": true), else its hidden. */
static int parse_memory_width(jctx_t *c, json_t *v, sp_component_t *out)
{
	if (!out->cross_attention) {
		if (!json_object_get(v, "memory_width"))
			return 0;
		int rc = jerr_member(c, "memory_width", 1,
				     "'memory_width' applies to cross-attention "
				     "transformers only");
		sp_err_hint(c->err, "add \"cross_attention\": true, or remove 'memory_width'");
		return rc;
	}
	out->memory_width = out->hidden;
	return jget_int(c, v, "memory_width", 0, 1, SP_MAX_DIM, &out->memory_width);
}

static int parse_component(jctx_t *c, json_t *v, const char *name, sp_component_t *out)
{
	static const char *const any[] = {"type", "vocab", "hidden", "max_seq", "in",
					  "out", "layers", "heads", "ffn", "causal",
					  "cross_attention", "memory_width", "classes",
					  "temperature", NULL};
	int rc, type = 0;
	if (!json_is_object(v))
		return jcheck_object(c, v, "a component", any);
	if ((rc = jget_enum(c, v, "type", 1, COMP_TYPES, COMP__COUNT, &type)))
		return rc;
	snprintf(out->name, sizeof out->name, "%s", name);
	out->type = (sp_comp_type_t)type;
	char what[96];
	snprintf(what, sizeof what, "%s %s component",
		 strchr("aeiou", COMP_TYPES[type][0]) ? "an" : "a", COMP_TYPES[type]);
	/* unknown to every type → typo hint against all; known elsewhere → not for this type */
	const char *key;
	json_t *m;
	json_object_foreach(v, key, m) {
		const char *const *allowed = comp_keys(out->type);
		int ok = 0, known = 0;
		for (int i = 0; allowed[i]; i++)
			ok |= strcmp(allowed[i], key) == 0;
		for (int i = 0; any[i]; i++)
			known |= strcmp(any[i], key) == 0;
		if (ok)
			continue;
		if (known) {
			rc = jerr_member(c, key, 1, "'%s' is not a field of %s", key, what);
			return rc;
		}
		return jcheck_object(c, v, what, allowed);
	}
	/* the integer fields its type takes, required, in comp_keys' order */
	for (int i = 0; comp_keys(out->type)[i]; i++) {
		const int_field_t *f = int_field(comp_keys(out->type)[i]);
		if (f && (rc = jget_int(c, v, f->key, 1, f->lo, f->hi,
					(int64_t *)((char *)out + f->off))))
			return rc;
	}
	if (out->type == COMP_TRANSFORMER) {
		if ((rc = jget_bool(c, v, "causal", 0, &out->causal)) ||
		    (rc = jget_bool(c, v, "cross_attention", 0, &out->cross_attention)))
			return rc;
		if (out->hidden % out->heads) {
			rc = jerr_member(c, "heads", 0,
					 "hidden %lld is not divisible by heads %lld",
					 (long long)out->hidden, (long long)out->heads);
			sp_err_hint(c->err, "choose heads so that hidden / heads is an integer");
			return rc;
		}
		if ((rc = parse_memory_width(c, v, out)))
			return rc;
	}
	if (out->type == COMP_CONTRASTIVE) {
		out->temperature = 0.07;
		if ((rc = jget_num(c, v, "temperature", 0, 0, 1e6, 1, &out->temperature)))
			return rc;
	}
	if (comp_params(out) == INT64_MAX)
		return jerr(c, 0, "component is too large: its parameter count "
				  "overflows 64-bit arithmetic");
	return 0;
}

static int parse_optimizer(jctx_t *c, json_t *root, sp_optim_t *o)
{
	json_t *v = json_object_get(root, "optimizer");
	o->kind = OPT_ADAMW;
	o->lr = 1e-3;
	o->weight_decay = 0.01;
	o->beta1 = 0.9;
	o->beta2 = 0.999;
	o->eps = 1e-8;
	if (!v)
		return 0;
	int rc, kind = 0;
	if (json_is_string(v)) {
		if ((rc = jget_enum(c, root, "optimizer", 1, OPTS, 2, &kind)))
			return rc;
	} else if (json_is_object(v)) {
		jp_push_key(c, "optimizer");
		if ((rc = jget_enum(c, v, "type", 1, OPTS, 2, &kind)))
			goto out;
		static const char *const ka[] = {"type", "lr", "weight_decay", "beta1",
						 "beta2", "eps", NULL};
		static const char *const ks[] = {"type", "lr", "weight_decay", NULL};
		if ((rc = jcheck_object(c, v, kind == OPT_ADAMW ? "an adamw optimizer"
								: "an sgd optimizer",
					kind == OPT_ADAMW ? ka : ks)))
			goto out;
		if (kind == OPT_SGD)
			o->lr = 1e-2, o->weight_decay = 0;
		if ((rc = jget_num(c, v, "lr", 0, 0, 1e3, 1, &o->lr)) ||
		    (rc = jget_num(c, v, "weight_decay", 0, 0, 1e3, 0, &o->weight_decay)) ||
		    (rc = jget_num(c, v, "beta1", 0, 0, 0.999999, 0, &o->beta1)) ||
		    (rc = jget_num(c, v, "beta2", 0, 0, 0.999999999, 0, &o->beta2)) ||
		    (rc = jget_num(c, v, "eps", 0, 0, 1, 1, &o->eps)))
			goto out;
	out:
		jp_pop(c);
		if (rc)
			return rc;
	} else {
		return jerr_member(c, "optimizer", 0,
				   "expected \"adamw\", \"sgd\" or an optimizer object");
	}
	o->kind = (sp_opt_kind_t)kind;
	if (kind == OPT_SGD && !json_is_object(v))
		o->lr = 1e-2, o->weight_decay = 0;
	return 0;
}

static int find_node(const sp_task_t *t, const char *id)
{
	for (int i = 0; i < t->n_nodes; i++)
		if (strcmp(t->nodes[i].id, id) == 0)
			return i;
	return -1;
}

static int find_comp(const sp_model_t *m, const char *name)
{
	for (int i = 0; i < m->n_comps; i++)
		if (strcmp(m->comps[i].name, name) == 0)
			return i;
	return -1;
}

/* Points c's path at tasks[t].graph[i](.key) for an error. */
static int node_err(jctx_t *c, int t, int i, const char *key, int idx,
		    const char *fmt, const char *a, const char *b, long long x,
		    long long y)
{
	jp_push_key(c, "tasks");
	jp_push_index(c, (size_t)t);
	jp_push_key(c, "graph");
	jp_push_index(c, (size_t)i);
	if (key)
		jp_push_key(c, key);
	if (idx >= 0)
		jp_push_index(c, (size_t)idx);
	int rc;
	if (a && b)
		rc = jerr(c, 0, fmt, a, b, x, y);
	else if (a)
		rc = jerr(c, 0, fmt, a, x, y);
	else
		rc = jerr(c, 0, fmt, x, y);
	c->depth = 0;
	return rc;
}

/* "memory" is written on the nodes of cross-attention components, and
 * only there (resolved with the inputs, once every node is known). */
static int check_memory_key(jctx_t *c, json_t *v, const sp_node_t *n,
			    const sp_component_t *comp)
{
	json_t *mv = json_object_get(v, "memory");
	int rc;
	if (mv && !comp->cross_attention) {
		rc = jerr_member(c, "memory", 1,
				 "'memory' applies to nodes of cross-attention transformers "
				 "only (component '%s' has no cross-attention)",
				 comp->name);
		if (comp->type == COMP_TRANSFORMER)
			sp_err_hint(c->err, "add \"cross_attention\": true to component '%s'",
				    comp->name);
		return rc;
	}
	if (!mv && comp->cross_attention) {
		rc = jerr(c, 0, "cross-attention node '%s' has no 'memory'", n->id);
		sp_err_hint(c->err, "name the node it attends to (an encoder's output): "
				    "\"memory\": \"<node id>\"");
		return rc;
	}
	if (mv && !json_is_string(mv))
		return jerr_member(c, "memory", 0, "expected a node id (a string)");
	return 0;
}

static int parse_node(jctx_t *c, sp_model_t *m, sp_task_t *t, json_t *v, int i)
{
	static const char *const keys[] = {"id", "component", "seq", "inputs", "layers",
					   "memory", NULL};
	sp_node_t *n = &t->nodes[i];
	int rc;
	if ((rc = jcheck_object(c, v, "a graph node", keys)) ||
	    (rc = jget_name(c, v, "id", 1, n->id, sizeof n->id)))
		return rc;
	json_t *cv = json_object_get(v, "component");
	if (!cv)
		return jerr(c, 0, "missing required key 'component'");
	if (!json_is_string(cv))
		return jerr_member(c, "component", 0, "expected a component name (a string)");
	n->comp = find_comp(m, json_string_value(cv));
	if (n->comp < 0) {
		rc = jerr_member(c, "component", 0, "unknown component '%.64s'",
				 json_string_value(cv));
		const char **names = malloc(sizeof(char *) * (size_t)m->n_comps);
		if (names) {
			for (int k = 0; k < m->n_comps; k++)
				names[k] = m->comps[k].name;
			const char *near = sp_closest(json_string_value(cv), names, m->n_comps);
			if (near)
				sp_err_hint(c->err, "did you mean '%s'?", near);
			free(names);
		}
		return rc;
	}
	const sp_component_t *comp = &m->comps[n->comp];
	int sink = comp_is_sink(comp->type);
	if ((rc = jget_int(c, v, "seq", !sink, 1, SP_MAX_DIM, &n->seq)))
		return rc;
	n->layer_from = 0;
	n->layer_to = comp->type == COMP_TRANSFORMER ? (int)comp->layers : 1;
	json_t *lv = json_object_get(v, "layers");
	if (lv) {
		if (comp->type != COMP_TRANSFORMER)
			return jerr_member(c, "layers", 1,
					   "'layers' applies to transformer nodes only "
					   "(component '%s' has type %s)",
					   comp->name, COMP_TYPES[comp->type]);
		if (!json_is_array(lv) || json_array_size(lv) != 2 ||
		    !json_is_integer(json_array_get(lv, 0)) ||
		    !json_is_integer(json_array_get(lv, 1)))
			return jerr_member(c, "layers", 0,
					   "expected [from, to] (two integers)");
		json_int_t a = json_integer_value(json_array_get(lv, 0));
		json_int_t b = json_integer_value(json_array_get(lv, 1));
		if (a < 0 || b > comp->layers || a >= b) {
			rc = jerr_member(c, "layers", 0,
					 "layer range [%lld, %lld) is empty or outside "
					 "component '%s' (%lld layers)",
					 (long long)a, (long long)b, comp->name,
					 (long long)comp->layers);
			sp_err_hint(c->err, "ranges are half-open: [0, %lld) is the whole stack",
				    (long long)comp->layers);
			return rc;
		}
		n->layer_from = (int)a;
		n->layer_to = (int)b;
	}
	json_t *iv = json_object_get(v, "inputs");
	if (iv && !json_is_array(iv))
		return jerr_member(c, "inputs", 0, "expected an array of node ids");
	return check_memory_key(c, v, n, comp);
}

/* Node i's reference e (its field key, element idx or -1) to a node of
 * the same task: *out its index; an unknown id is an error with a hint. */
static int resolve_ref(jctx_t *c, const sp_model_t *m, const sp_task_t *t, int ti, int i,
		       const char *key, int idx, json_t *e, int *out)
{
	if (!json_is_string(e))
		return node_err(c, ti, i, key, idx, "expected a node id (a string)", NULL, NULL,
				0, 0);
	const char *id = json_string_value(e);
	*out = find_node(t, id);
	if (*out >= 0)
		return 0;
	int rc = node_err(c, ti, i, key, idx, "unknown node '%.64s'", id, NULL, 0, 0);
	const char **names = malloc(sizeof(char *) * (size_t)t->n_nodes);
	if (names) {
		for (int q = 0; q < t->n_nodes; q++)
			names[q] = t->nodes[q].id;
		const char *near = sp_closest(id, names, t->n_nodes);
		if (near)
			sp_err_hint(c->err, "did you mean '%s'?", near);
		free(names);
		if (near)
			return rc;
	}
	/* a node of an earlier task: say that references stay inside a task */
	for (int q = 0; q < ti; q++)
		if (find_node(&m->tasks[q], id) >= 0) {
			sp_err_hint(c->err, "'%s' is a node of task '%s'; %s of the same task",
				    id, m->tasks[q].name,
				    idx >= 0 ? "inputs name nodes" : "a memory names a node");
			break;
		}
	return rc;
}

static int resolve_inputs(jctx_t *c, sp_model_t *m, sp_task_t *t, int ti, json_t *graph)
{
	for (int i = 0; i < t->n_nodes; i++) {
		sp_node_t *n = &t->nodes[i];
		json_t *nv = json_array_get(graph, (size_t)i);
		json_t *iv = json_object_get(nv, "inputs"), *mv = json_object_get(nv, "memory");
		size_t k = iv ? json_array_size(iv) : 0;
		if (k > 64)
			return node_err(c, ti, i, "inputs", -1,
					"too many inputs (%lld, at most %lld)", NULL, NULL,
					(long long)k, 64);
		n->inputs = calloc(k ? k : 1, sizeof(int));
		if (!n->inputs)
			return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
		n->n_inputs = (int)k;
		for (size_t j = 0; j < k; j++) {
			int rc = resolve_ref(c, m, t, ti, i, "inputs", (int)j,
					     json_array_get(iv, j), &n->inputs[j]);
			if (rc)
				return rc;
			for (size_t q = 0; q < j; q++)
				if (n->inputs[q] == n->inputs[j])
					return node_err(c, ti, i, "inputs", (int)j,
							"input '%s' is listed twice",
							t->nodes[n->inputs[j]].id, NULL, 0, 0);
		}
		int rc = mv ? resolve_ref(c, m, t, ti, i, "memory", -1, mv, &n->memory) : 0;
		if (rc)
			return rc;
	}
	return 0;
}

/* What json_report needs: the text's context and the model's names. */
typedef struct {
	jctx_t *c;
	const sp_model_t *m;
} jreport_t;

/* Reports a broken model_check rule at the JSON path of its element. */
static int json_report(void *ctx, int code, const model_where_t *w, const char *msg,
		       const char *hint)
{
	const jreport_t *jr = ctx;
	jctx_t *c = jr->c;
	sp_err_t warning = {0}, *err = c->err;
	if (code == 0) /* a warning: located like an error, into a struct of its own */
		c->err = &warning;
	else if (code != SP_EINPUT)
		return sp_err_set(c->err, code, c->file, 0, 0, NULL, "%s", msg);
	c->depth = 0;
	if (w->task >= 0) {
		jp_push_key(c, "tasks");
		jp_push_index(c, (size_t)w->task);
		jp_push_key(c, "graph");
		jp_push_index(c, (size_t)w->node);
	} else {
		jp_push_key(c, "components");
		if (w->comp >= 0)
			jp_push_key(c, jr->m->comps[w->comp].name);
	}
	if (w->key)
		jp_push_key(c, w->key);
	if (w->index >= 0)
		jp_push_index(c, (size_t)w->index);
	int rc = jerr(c, w->comp >= 0, "%s", msg);
	if (hint)
		sp_err_hint(c->err, "%s", hint);
	c->depth = 0;
	if (code == 0) {
		c->err = err;
		warning.code = 0;
		sp_err_warn(err, &warning);
		return 0;
	}
	return rc;
}

/*
 * The loaded form of seq, which model_check expects: a loss node without
 * one takes its input's, a contrastive node (which reads token 0 of each
 * input) has none written and gets 1. Nodes without inputs are left to
 * model_check's arity rule.
 */
static int fill_loss_seqs(jctx_t *c, const sp_model_t *m, sp_task_t *t, int ti)
{
	for (int i = 0; i < t->n_nodes; i++) {
		sp_node_t *n = &t->nodes[i];
		sp_comp_type_t type = m->comps[n->comp].type;
		if (!comp_is_sink(type) || n->n_inputs == 0)
			continue;
		if (type != COMP_CONTRASTIVE) {
			if (n->seq == 0)
				n->seq = t->nodes[n->inputs[0]].seq;
			continue;
		}
		if (n->seq != 0) {
			int rc = node_err(c, ti, i, "seq", -1,
					  "a contrastive node has no seq (got %lld)", NULL,
					  NULL, n->seq, 0);
			sp_err_hint(c->err, "it reads token 0 of each input; remove 'seq'");
			return rc;
		}
		n->seq = 1;
	}
	return 0;
}

static int parse_task(jctx_t *c, sp_model_t *m, json_t *v, int ti)
{
	static const char *const keys[] = {"name", "batch", "weight", "graph", NULL};
	sp_task_t *t = &m->tasks[ti];
	int rc;
	t->weight = 1.0;
	if ((rc = jcheck_object(c, v, "a task", keys)) ||
	    (rc = jget_name(c, v, "name", 1, t->name, sizeof t->name)) ||
	    (rc = jget_int(c, v, "batch", 1, 1, SP_MAX_BATCH, &t->batch)) ||
	    (rc = jget_num(c, v, "weight", 0, 0, 1e9, 1, &t->weight)))
		return rc;
	for (int k = 0; k < ti; k++)
		if (strcmp(m->tasks[k].name, t->name) == 0)
			return jerr_member(c, "name", 0, "duplicate task name '%s'", t->name);
	json_t *g = json_object_get(v, "graph");
	if (!g)
		return jerr(c, 0, "missing required key 'graph'");
	if (!json_is_array(g) || json_array_size(g) == 0)
		return jerr_member(c, "graph", 0, "expected a non-empty array of nodes");
	if (json_array_size(g) > SP_MAX_NODES)
		return jerr_member(c, "graph", 0, "too many nodes (at most %d)", SP_MAX_NODES);
	/* n_nodes only once nodes exists: model_release walks nodes[0..n_nodes) */
	t->nodes = calloc(json_array_size(g), sizeof *t->nodes);
	if (!t->nodes)
		return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
	t->n_nodes = (int)json_array_size(g);
	jp_push_key(c, "graph");
	for (int i = 0; i < t->n_nodes; i++) {
		jp_push_index(c, (size_t)i);
		rc = parse_node(c, m, t, json_array_get(g, (size_t)i), i);
		if (!rc)
			for (int k = 0; k < i; k++)
				if (strcmp(t->nodes[k].id, t->nodes[i].id) == 0) {
					rc = jerr_member(c, "id", 0, "duplicate node id '%s' in task '%s'",
							 t->nodes[i].id, t->name);
					break;
				}
		jp_pop(c);
		if (rc)
			break;
	}
	jp_pop(c);
	if (rc)
		return rc;
	int depth = c->depth;
	c->depth = 0;
	jreport_t jr = {c, m};
	model_report_t r = {json_report, &jr};
	if ((rc = resolve_inputs(c, m, t, ti, g)) || (rc = fill_loss_seqs(c, m, t, ti)) ||
	    (rc = model_check_task(m, ti, &r)))
		return rc;
	c->depth = depth;
	return 0;
}

/* root's "components" (a non-empty object) or "tasks" (a non-empty
 * array) of at most max members, in *out, and a zeroed array of as many
 * elements of elsz bytes in *arr. */
static int get_collection(jctx_t *c, json_t *root, const char *key, int max, size_t elsz,
			  json_t **out, void **arr)
{
	int object = strcmp(key, "components") == 0;
	json_t *v = json_object_get(root, key);
	if (!v)
		return jerr(c, 0, "missing required key '%s'", key);
	size_t n = object ? json_object_size(v) : json_array_size(v);
	if ((object ? !json_is_object(v) : !json_is_array(v)) || n == 0)
		return jerr_member(c, key, 0, "expected a non-empty %s of %s",
				   object ? "object" : "array", key);
	if (n > (size_t)max)
		return jerr_member(c, key, 0, "too many %s (at most %d)", key, max);
	*out = v;
	*arr = calloc(n, elsz);
	if (!*arr)
		return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
	return 0;
}

int model_parse(sp_model_t *out, const char *text, size_t len, const char *fname,
		sp_err_t *err)
{
	static const char *const keys[] = {"format", "name", "dtype", "optimizer", "seed",
					   "components", "tasks", NULL};
	memset(out, 0, sizeof *out);
	jctx_t c = {.text = text, .len = len, .file = fname, .err = err};
	json_t *root = jparse(&c);
	if (!root)
		return err->code ? err->code : SP_EINPUT;
	int rc, dt = DT_BF16;
	int64_t seed = 0;
	if ((rc = jcheck_format(&c, root, "spindle.model", 1)) ||
	    (rc = jcheck_object(&c, root, "a model", keys)) ||
	    (rc = jget_name(&c, root, "name", 1, out->name, sizeof out->name)) ||
	    (rc = jget_enum(&c, root, "dtype", 0, DTYPES, 3, &dt)) ||
	    (rc = parse_optimizer(&c, root, &out->opt)) ||
	    (rc = jget_int(&c, root, "seed", 0, 0, INT64_MAX, &seed)))
		goto cleanup;
	out->dtype = (sp_dtype_t)dt;
	out->seed = (uint64_t)seed;

	json_t *comps = NULL, *tasks = NULL;
	if ((rc = get_collection(&c, root, "components", SP_MAX_COMPONENTS,
				 sizeof *out->comps, &comps, (void **)&out->comps)))
		goto cleanup;
	/* object order as written in the file (jansson keeps insertion order) */
	const char *key;
	json_t *v;
	jp_push_key(&c, "components");
	json_object_foreach(comps, key, v) {
		jp_push_key(&c, key);
		if (!jvalid_name(key)) {
			rc = jerr(&c, 1, "invalid component name '%.80s'", key);
			sp_err_hint(err, "names are 1-63 characters of letters, digits, '_', "
					 "and (after the first) '-' or '.'");
			goto cleanup;
		}
		rc = parse_component(&c, v, key, &out->comps[out->n_comps]);
		jp_pop(&c);
		if (rc)
			goto cleanup;
		out->n_comps++;
	}
	jp_pop(&c);

	if ((rc = get_collection(&c, root, "tasks", SP_MAX_TASKS, sizeof *out->tasks, &tasks,
				 (void **)&out->tasks)))
		goto cleanup;
	for (size_t i = 0; i < json_array_size(tasks); i++) {
		jp_push_key(&c, "tasks");
		jp_push_index(&c, i);
		out->n_tasks++;
		rc = parse_task(&c, out, json_array_get(tasks, i), (int)i);
		c.depth = 0;
		if (rc)
			goto cleanup;
	}
	jreport_t jr = {&c, out};
	model_report_t r = {json_report, &jr};
	if ((rc = model_check_totals(out, &r)))
		goto cleanup;
	rc = jcanonical_hash(&c, root, &out->hash);
cleanup:
	json_decref(root);
	if (rc)
		model_release(out);
	return rc;
}

static int parse_text(void *out, const char *text, size_t len, const char *fname,
		      sp_err_t *err)
{
	return model_parse(out, text, len, fname, err);
}

int model_load(sp_model_t *out, const char *path, sp_err_t *err)
{
	memset(out, 0, sizeof *out);
	return sp_parse_file(out, parse_text, path, err);
}

int model_copy(sp_model_t *out, const sp_model_t *in)
{
	*out = *in;
	out->comps = NULL;
	out->tasks = NULL;
	out->n_tasks = 0;
	out->comps = malloc(sizeof *out->comps * (size_t)(in->n_comps + 1));
	out->tasks = calloc((size_t)in->n_tasks + 1, sizeof *out->tasks);
	if (!out->comps || !out->tasks)
		goto fail;
	memcpy(out->comps, in->comps, sizeof *out->comps * (size_t)in->n_comps);
	for (int t = 0; t < in->n_tasks; t++) {
		sp_task_t *d = &out->tasks[t];
		*d = in->tasks[t];
		d->nodes = calloc((size_t)d->n_nodes + 1, sizeof *d->nodes);
		d->n_nodes = 0;
		out->n_tasks++;
		if (!d->nodes)
			goto fail;
		for (int i = 0; i < in->tasks[t].n_nodes; i++) {
			sp_node_t *n = &d->nodes[i];
			*n = in->tasks[t].nodes[i];
			n->inputs = malloc(sizeof(int) * (size_t)(n->n_inputs + 1));
			d->n_nodes++;
			if (!n->inputs)
				goto fail;
			memcpy(n->inputs, in->tasks[t].nodes[i].inputs,
			       sizeof(int) * (size_t)n->n_inputs);
		}
	}
	return 0;
fail:
	model_release(out);
	return SP_ENOMEM;
}
