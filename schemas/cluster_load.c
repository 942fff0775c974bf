/*
 * cluster_load.c — reads spindle.cluster/1 (schemas/cluster.schema.json):
 * machine shape, GPU, links, the optional measured profile and the
 * optional measured collectives. Profile entries must have strictly
 * increasing batches and distinct op shapes; collectives are sorted by
 * (op, ranks, nodes, bytes) with no repeats. A transformer shape may
 * carry a memory ("mem_seq" and "mem_width", both or neither): the shape
 * of a cross-attention decoder layer, matched like every other field.
 */
#include "jsonutil.h"
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cluster_release(sp_cluster_t *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n_prof; i++)
		free(c->prof[i].points);
	free(c->prof);
	free(c->coll);
	memset(c, 0, sizeof *c);
}

static const char *const TYPES[COMP__COUNT] = {
	"embedding", "patch", "transformer", "linear", "lm_head", "classifier",
	"contrastive"};

static const char *const *shape_keys(sp_comp_type_t t)
{
	static const char *const emb[] = {"type", "vocab", "hidden", "seq", NULL};
	static const char *const patch[] = {"type", "in", "hidden", "seq", NULL};
	static const char *const tr[] = {"type",   "hidden",  "heads",     "ffn",
					 "seq",    "causal",  "mem_seq",   "mem_width",
					 NULL};
	static const char *const lin[] = {"type", "in", "out", "seq", NULL};
	static const char *const lm[] = {"type", "hidden", "vocab", "seq", NULL};
	static const char *const cls[] = {"type", "hidden", "classes", NULL};
	static const char *const con[] = {"type", "hidden", NULL};
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

/* A transformer shape's optional memory: "mem_seq" tokens per sample of
 * width "mem_width" (a cross-attention decoder layer), both or neither. */
static int parse_memory(jctx_t *c, json_t *v, sp_opshape_t *s)
{
	int rc;
	if ((rc = jget_int(c, v, "mem_seq", 0, 1, SP_MAX_DIM, &s->mem_seq)) ||
	    (rc = jget_int(c, v, "mem_width", 0, 1, SP_MAX_DIM, &s->mem_width)))
		return rc;
	if ((s->mem_seq > 0) == (s->mem_width > 0))
		return 0;
	const char *has = s->mem_seq > 0 ? "mem_seq" : "mem_width";
	const char *lacks = s->mem_seq > 0 ? "mem_width" : "mem_seq";
	rc = jerr_member(c, has, 1, "'%s' without '%s'", has, lacks);
	sp_err_hint(c->err, "a cross-attention shape gives both the memory's tokens per sample "
			    "(mem_seq) and its width (mem_width); a plain block gives neither");
	return rc;
}

static int parse_shape(jctx_t *c, json_t *v, sp_opshape_t *s)
{
	int rc, type = 0;
	memset(s, 0, sizeof *s);
	if (!json_is_object(v))
		return jerr(c, 0, "expected an operator shape (an object)");
	if ((rc = jget_enum(c, v, "type", 1, TYPES, COMP__COUNT, &type)))
		return rc;
	s->type = (sp_comp_type_t)type;
	char what[64];
	snprintf(what, sizeof what, "%s %s shape", strchr("aeiou", TYPES[type][0]) ? "an" : "a",
		 TYPES[type]);
	if ((rc = jcheck_object(c, v, what, shape_keys(s->type))))
		return rc;
	const char *const *k = shape_keys(s->type);
	for (int i = 1; k[i]; i++) {
		if (strncmp(k[i], "mem_", 4) == 0)
			continue; /* optional, below */
		if (strcmp(k[i], "causal") == 0) {
			if ((rc = jget_bool(c, v, "causal", 0, &s->causal)))
				return rc;
			continue;
		}
		int64_t *dst = strcmp(k[i], "hidden") == 0    ? &s->hidden
			       : strcmp(k[i], "heads") == 0   ? &s->heads
			       : strcmp(k[i], "ffn") == 0     ? &s->ffn
			       : strcmp(k[i], "seq") == 0     ? &s->seq
			       : strcmp(k[i], "in") == 0      ? &s->in
			       : strcmp(k[i], "out") == 0     ? &s->out
			       : strcmp(k[i], "vocab") == 0   ? &s->vocab
			       : strcmp(k[i], "classes") == 0 ? &s->classes
							      : NULL;
		/* as in model.json: a classifier needs at least two classes */
		int64_t lo = dst == &s->classes ? 2 : 1;
		if (dst && (rc = jget_int(c, v, k[i], 1, lo, SP_MAX_DIM, dst)))
			return rc;
	}
	return s->type == COMP_TRANSFORMER ? parse_memory(c, v, s) : 0;
}

static int parse_profile_entry(jctx_t *c, json_t *v, sp_prof_entry_t *e)
{
	static const char *const keys[] = {"op", "points", NULL};
	static const char *const pkeys[] = {"batch", "fwd_ms", "bwd_ms", NULL};
	int rc;
	if ((rc = jcheck_object(c, v, "a profile entry", keys)))
		return rc;
	json_t *op = json_object_get(v, "op");
	if (!op)
		return jerr(c, 0, "missing required key 'op'");
	jp_push_key(c, "op");
	rc = parse_shape(c, op, &e->shape);
	jp_pop(c);
	if (rc)
		return rc;
	json_t *pts = json_object_get(v, "points");
	if (!pts)
		return jerr(c, 0, "missing required key 'points'");
	if (!json_is_array(pts) || json_array_size(pts) == 0)
		return jerr_member(c, "points", 0, "expected a non-empty array of points");
	if (json_array_size(pts) > 4096)
		return jerr_member(c, "points", 0, "too many points (%zu, at most 4096)",
				   json_array_size(pts));
	e->n_points = (int)json_array_size(pts);
	e->points = calloc((size_t)e->n_points, sizeof *e->points);
	if (!e->points)
		return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
	jp_push_key(c, "points");
	for (int i = 0; i < e->n_points && !rc; i++) {
		json_t *p = json_array_get(pts, (size_t)i);
		sp_prof_point_t *q = &e->points[i];
		jp_push_index(c, (size_t)i);
		int64_t b = 0;
		if (!(rc = jcheck_object(c, p, "a profile point", pkeys)) &&
		    !(rc = jget_int(c, p, "batch", 1, 1, SP_MAX_BATCH, &b)) &&
		    !(rc = jget_num(c, p, "fwd_ms", 1, 0, 1e9, 0, &q->fwd_ms)) &&
		    !(rc = jget_num(c, p, "bwd_ms", 1, 0, 1e9, 0, &q->bwd_ms))) {
			q->batch = (double)b;
			if (i > 0 && q->batch <= e->points[i - 1].batch) {
				rc = jerr_member(c, "batch", 0,
						 "batch %lld is not greater than the previous "
						 "point's %lld",
						 (long long)b, (long long)e->points[i - 1].batch);
				sp_err_hint(c->err, "list points in strictly increasing batch order");
			}
		}
		jp_pop(c);
	}
	jp_pop(c);
	return rc;
}

/* Required object member key of root, entered (jp_push_key) into *out. */
static int enter_section(jctx_t *c, json_t *root, const char *key, json_t **out)
{
	*out = json_object_get(root, key);
	if (!*out)
		return jerr(c, 0, "missing required key '%s'", key);
	jp_push_key(c, key);
	return 0;
}

/* Required numbers of one section: key, range (lo open or closed), field. */
typedef struct {
	const char *key;
	double lo, hi;
	int lo_open;
	double *out;
} num_field_t;

static int get_nums(jctx_t *c, json_t *obj, const num_field_t *f, int n)
{
	int rc = 0;
	for (int i = 0; i < n && !rc; i++)
		rc = jget_num(c, obj, f[i].key, 1, f[i].lo, f[i].hi, f[i].lo_open, f[i].out);
	return rc;
}

static int parse_gpu(jctx_t *c, json_t *root, sp_cluster_t *out)
{
	static const char *const gkeys[] = {"name", "memory_gib", "peak_tflops",
					    "mem_bandwidth_gbs", "sm_count", "launch_us", NULL};
	json_t *g;
	int rc;
	if ((rc = enter_section(c, root, "gpu", &g)) ||
	    (rc = jcheck_object(c, g, "a gpu", gkeys)))
		return rc;
	json_t *gn = json_object_get(g, "name");
	if (!gn || !json_is_string(gn) || json_string_length(gn) == 0 ||
	    json_string_length(gn) >= SP_NAME_MAX)
		return gn ? jerr_member(c, "name", 0, "expected a GPU name (1-63 characters)")
			  : jerr(c, 0, "missing required key 'name'");
	snprintf(out->gpu_name, sizeof out->gpu_name, "%s", json_string_value(gn));
	const num_field_t nums[] = {
		{"memory_gib", 0, 1e6, 1, &out->memory_gib},
		{"peak_tflops", 0, 1e7, 1, &out->peak_tflops},
		{"mem_bandwidth_gbs", 0, 1e7, 1, &out->mem_bandwidth_gbs},
	};
	/* optional; 0 = not modelled (the H100 SXM has 132 SMs, so 4096 leaves room) */
	int64_t sms = 0;
	out->launch_us = SP_LAUNCH_US_DEFAULT; /* optional; model.h cites the default */
	if ((rc = get_nums(c, g, nums, 3)) || (rc = jget_int(c, g, "sm_count", 0, 1, 4096, &sms)) ||
	    (rc = jget_num(c, g, "launch_us", 0, 0, 1e6, 0, &out->launch_us)))
		return rc;
	out->sm_count = (int)sms;
	jp_pop(c);
	return 0;
}

static int parse_links(jctx_t *c, json_t *root, sp_cluster_t *out)
{
	static const char *const lkeys[] = {"intra_node_gbs", "intra_node_latency_us",
					    "inter_node_gbs", "inter_node_latency_us",
					    "nics_per_node", NULL};
	json_t *l;
	int rc;
	const num_field_t nums[] = {
		{"intra_node_gbs", 0, 1e7, 1, &out->intra_gbs},
		{"intra_node_latency_us", 0, 1e7, 0, &out->intra_lat_us},
		{"inter_node_gbs", 0, 1e7, 1, &out->inter_gbs},
		{"inter_node_latency_us", 0, 1e7, 0, &out->inter_lat_us},
	};
	if ((rc = enter_section(c, root, "links", &l)) ||
	    (rc = jcheck_object(c, l, "links", lkeys)) || (rc = get_nums(c, l, nums, 4)))
		return rc;
	/* optional, default 1; every NIC serves at least one GPU (rail-optimised:
	 * GPU g uses NIC floor(g * nics / gpus_per_node)) */
	int64_t nics = 1;
	if ((rc = jget_int(c, l, "nics_per_node", 0, 1, out->gpus_per_node, &nics))) {
		if (rc == SP_EINPUT && json_is_integer(json_object_get(l, "nics_per_node")))
			sp_err_hint(c->err, "every NIC serves at least one GPU: give at most "
					    "gpus_per_node NICs per node");
		return rc;
	}
	out->nics = (int)nics;
	jp_pop(c);
	return 0;
}

/* Parses element i (inside its path) of an array section into out. */
typedef int (*elem_fn_t)(jctx_t *c, json_t *v, size_t i, sp_cluster_t *out);

/* The optional array section key of root (what: its elements, in
 * messages): at most 65536, *arr calloc'd for them (one spare), each
 * parsed by fn. */
static int parse_array(jctx_t *c, json_t *root, const char *key, const char *what, size_t elem,
		       void **arr, elem_fn_t fn, sp_cluster_t *out)
{
	json_t *p = json_object_get(root, key);
	if (!p)
		return 0;
	if (!json_is_array(p))
		return jerr_member(c, key, 0, "expected an array of %s", what);
	if (json_array_size(p) > 65536)
		return jerr_member(c, key, 0, "too many %s (%zu, at most 65536)", what,
				   json_array_size(p));
	*arr = calloc(json_array_size(p) + 1, elem);
	if (!*arr)
		return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
	jp_push_key(c, key);
	for (size_t i = 0; i < json_array_size(p); i++) {
		jp_push_index(c, i);
		int rc = fn(c, json_array_get(p, i), i, out);
		if (rc)
			return rc;
		jp_pop(c);
	}
	jp_pop(c);
	return 0;
}

/* Profile entry i: distinct op shapes. */
static int profile_elem(jctx_t *c, json_t *v, size_t i, sp_cluster_t *out)
{
	out->n_prof++; /* released even when half parsed */
	int rc = parse_profile_entry(c, v, &out->prof[i]);
	for (size_t k = 0; !rc && k < i; k++)
		if (opshape_equal(&out->prof[k].shape, &out->prof[i].shape)) {
			rc = jerr_member(c, "op", 0, "duplicate profile shape (same as profile[%zu])",
					 k);
			sp_err_hint(c->err, "merge the points into one entry");
		}
	return rc;
}

const char *const SP_COLL_NAMES[COLL__COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
						"p2p"};

int coll_point_cmp(const sp_coll_point_t *a, const sp_coll_point_t *b)
{
	int d[] = {(int)a->op - (int)b->op, a->ranks - b->ranks, a->nodes - b->nodes,
		   (a->bytes > b->bytes) - (a->bytes < b->bytes)};
	for (int i = 0; i < 4; i++)
		if (d[i])
			return d[i];
	return 0;
}

static int parse_coll_point(jctx_t *c, json_t *v, const sp_cluster_t *cl, sp_coll_point_t *q)
{
	static const char *const keys[] = {"op", "ranks", "nodes", "bytes", "ms", NULL};
	int rc, op = 0;
	int64_t ranks = 0, nodes = 0, bytes = 0;
	if ((rc = jcheck_object(c, v, "a collective point", keys)) ||
	    (rc = jget_enum(c, v, "op", 1, SP_COLL_NAMES, COLL__COUNT, &op)) ||
	    (rc = jget_int(c, v, "ranks", 1, 2, SP_MAX_DEVICES, &ranks)) ||
	    (rc = jget_int(c, v, "nodes", 1, 1, 4096, &nodes)) ||
	    (rc = jget_int(c, v, "bytes", 1, 1, (int64_t)1 << 40, &bytes)) ||
	    (rc = jget_num(c, v, "ms", 1, 0, 1e9, 1, &q->ms)))
		return rc;
	*q = (sp_coll_point_t){(sp_coll_op_t)op, (int)ranks, (int)nodes, (double)bytes, q->ms};
	if (ranks % nodes)
		return jerr_member(c, "nodes", 0, "%lld ranks do not spread evenly over %lld nodes",
				   (long long)ranks, (long long)nodes);
	if (op == COLL_P2P && ranks != 2)
		return jerr_member(c, "ranks", 0, "a p2p point has 2 ranks, not %lld",
				   (long long)ranks);
	if (nodes > cl->nodes || ranks / nodes > cl->gpus_per_node) {
		rc = jerr_member(c, "ranks", 0, "%lld ranks on %lld nodes do not fit the cluster",
				 (long long)ranks, (long long)nodes);
		sp_err_hint(c->err, "measure on the machine the cluster file describes");
	}
	return rc;
}

/* Collective point i: after point i - 1. */
static int coll_elem(jctx_t *c, json_t *v, size_t i, sp_cluster_t *out)
{
	sp_coll_point_t *q = &out->coll[i];
	int rc = parse_coll_point(c, v, out, q);
	if (!rc && i > 0 && coll_point_cmp(q - 1, q) >= 0) {
		rc = jerr(c, 0, "point is not after collectives[%zu] in (op, ranks, nodes, bytes) order",
			  i - 1);
		sp_err_hint(c->err, "sort the points by op (all_reduce, all_gather, reduce_scatter, "
				    "p2p), ranks, nodes, then strictly increasing bytes");
	}
	out->n_coll += !rc;
	return rc;
}

int cluster_parse(sp_cluster_t *out, const char *text, size_t len, const char *fname,
		  sp_err_t *err)
{
	static const char *const keys[] = {"format", "name", "nodes", "gpus_per_node",
					   "gpu", "links", "profile", "collectives", NULL};
	memset(out, 0, sizeof *out);
	jctx_t c = {.text = text, .len = len, .file = fname, .err = err};
	json_t *root = jparse(&c);
	if (!root)
		return err->code ? err->code : SP_EINPUT;
	int rc;
	int64_t nodes = 0, gpn = 0;
	if ((rc = jcheck_format(&c, root, "spindle.cluster", 1)) ||
	    (rc = jcheck_object(&c, root, "a cluster", keys)) ||
	    (rc = jget_name(&c, root, "name", 1, out->name, sizeof out->name)) ||
	    (rc = jget_int(&c, root, "nodes", 1, 1, 4096, &nodes)) ||
	    (rc = jget_int(&c, root, "gpus_per_node", 1, 1, 256, &gpn)))
		goto cleanup;
	if (nodes * gpn > SP_MAX_DEVICES) {
		rc = jerr_member(&c, "nodes", 0, "%lld devices in all; at most %d supported",
				 (long long)(nodes * gpn), SP_MAX_DEVICES);
		goto cleanup;
	}
	out->nodes = (int)nodes;
	out->gpus_per_node = (int)gpn;
	if ((rc = parse_gpu(&c, root, out)) || (rc = parse_links(&c, root, out)) ||
	    (rc = parse_array(&c, root, "profile", "profile entries", sizeof *out->prof,
			       (void **)&out->prof, profile_elem, out)) ||
	    (rc = parse_array(&c, root, "collectives", "collective points", sizeof *out->coll,
			       (void **)&out->coll, coll_elem, out)))
		goto cleanup;
	rc = jcanonical_hash(&c, root, &out->hash);
cleanup:
	json_decref(root);
	if (rc)
		cluster_release(out);
	return rc;
}

static int parse_text(void *out, const char *text, size_t len, const char *fname,
		      sp_err_t *err)
{
	return cluster_parse(out, text, len, fname, err);
}

int cluster_load(sp_cluster_t *out, const char *path, sp_err_t *err)
{
	memset(out, 0, sizeof *out);
	return sp_parse_file(out, parse_text, path, err);
}
