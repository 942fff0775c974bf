/*
 * test_loaders.c — the model and cluster loaders: every bundled input
 * under plans/ loads (and its canonical hash ignores layout and key order
 * but not values); the per-node and per-model summary of a tiny model
 * equals numbers worked out by hand; an error names line:column, path and
 * a hint; model_copy is deep; and every failing allocation during a parse
 * gives SP_ENOMEM, an empty result and no leak. The bad-input catalogue is
 * tests/invalid/, not here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

static const char *root_dir(void)
{
	const char *r = getenv("SPINDLE_ROOT");
	return r && *r ? r : SPINDLE_ROOT;
}

static char *read_text(const char *path)
{
	char *text = NULL;
	sp_err_t err = {0};
	assert_int_equal(sp_read_file(&text, NULL, path, &err), 0);
	return text;
}

/* ---- allocation failures ------------------------------------------------ */

/*
 * With -Wl,--wrap, every malloc/calloc/realloc of the loaders (and of this
 * file) comes here (kind 0); jansson's own come through
 * json_set_alloc_funcs (kind 1). While armed, allocations of each kind are
 * counted, and number fail_at of kind fail_kind (0-based) fails.
 */
static int armed, fail_kind;
static long n_allocs[2], fail_at = -1;

static int should_fail_kind(int kind)
{
	if (!armed)
		return 0;
	return n_allocs[kind]++ == fail_at && kind == fail_kind;
}

static int should_fail(void)
{
	return should_fail_kind(0);
}

#include "alloc_wrap.h"
#ifdef HAVE_WRAP
#define REAL_MALLOC __real_malloc
#else
#define REAL_MALLOC malloc
#endif

static void *json_malloc(size_t n)
{
	return should_fail_kind(1) ? NULL : REAL_MALLOC(n);
}

/* ---- the tiny model ------------------------------------------------------ */

/* Line 3 holds a typo ("hiden") at column 45 for the error test. */
static const char TINY[] =
	"{\"format\": \"spindle.model/1\", \"name\": \"tiny\", \"dtype\": \"bf16\",\n"
	" \"optimizer\": \"adamw\", \"components\": {\n"
	"  \"tok\": {\"type\": \"embedding\", \"vocab\": 10, \"hidden\": 8, \"max_seq\": 4},\n"
	"  \"body\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 8, \"heads\": 2,\n"
	"           \"ffn\": 16},\n"
	"  \"head\": {\"type\": \"lm_head\", \"hidden\": 8, \"vocab\": 10}},\n"
	" \"tasks\": [{\"name\": \"lm\", \"batch\": 3, \"graph\": [\n"
	"  {\"id\": \"in\", \"component\": \"tok\", \"seq\": 4},\n"
	"  {\"id\": \"x\", \"component\": \"body\", \"seq\": 4, \"inputs\": [\"in\"]},\n"
	"  {\"id\": \"loss\", \"component\": \"head\", \"inputs\": [\"x\"]}]}]}\n";

/* The same model: other layout, other key order, reals written for integers. */
static const char TINY_REFORMATTED[] =
	"{ \"tasks\" : [ { \"graph\" : [\n"
	"      { \"seq\": 4, \"component\": \"tok\", \"id\": \"in\" },\n"
	"      { \"inputs\": [\"in\"], \"seq\": 4, \"id\": \"x\", \"component\": \"body\" },\n"
	"      { \"component\": \"head\", \"id\": \"loss\", \"inputs\": [\"x\"] } ],\n"
	"    \"batch\": 3, \"name\": \"lm\" } ],\n"
	"  \"components\": {\n"
	"    \"tok\": {\"max_seq\": 4, \"hidden\": 8, \"vocab\": 10, \"type\": \"embedding\"},\n"
	"    \"body\": {\"ffn\": 16, \"heads\": 2, \"hidden\": 8, \"layers\": 2, \"type\": \"transformer\"},\n"
	"    \"head\": {\"vocab\": 10, \"hidden\": 8, \"type\": \"lm_head\"} },\n"
	"  \"optimizer\": \"adamw\", \"dtype\": \"bf16\", \"name\": \"tiny\",\n"
	"  \"format\": \"spindle.model/1\" }";

static char *replace(const char *s, const char *old, const char *new)
{
	const char *at = strstr(s, old);
	assert_non_null(at);
	size_t n = strlen(s) - strlen(old) + strlen(new) + 1;
	char *out = malloc(n);
	assert_non_null(out);
	snprintf(out, n, "%.*s%s%s", (int)(at - s), s, new, at + strlen(old));
	return out;
}

static void parse_ok(sp_model_t *m, const char *text)
{
	sp_err_t err = {0};
	int rc = model_parse(m, text, strlen(text), "tiny.json", &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
}

/*
 * Hand calculation (arith.c's table), h = 8, f = 16, s = 4, a = 2, V = 10,
 * max_seq = 4, B = 3, bf16 (2 bytes per element).
 *
 * "in" (embedding, 1 layer):
 *   params      (V + max_seq) h  = (10 + 4) * 8          = 112
 *   FLOPs       0 forward, 0 backward (a gather)
 *   out bytes   s h * 2          = 4 * 8 * 2             = 64
 *   saved       s ids * 2        = 4 * 2                 = 8
 * "x" (transformer, layers [0, 2)):
 *   params/layer 4h^2 + 2hf + 9h + f = 256 + 256 + 72 + 16 = 600; x2 = 1200
 *     (QKV 3h^2+3h, out-proj h^2+h, MLP hf+f + fh+h, two LNs 4h)
 *   fwd/layer   8sh^2 + 4s^2h + 4shf = 2048 + 512 + 2048 = 4608; x2 = 9216
 *   bwd         2 x fwd                                  = 18432
 *   out bytes   s h * 2                                  = 64
 *   saved/layer 8sh + 2sf + a s^2 + 4s = 256 + 128 + 32 + 16 = 432
 *               x 2 layers x 2 bytes                     = 1728
 * "loss" (lm_head, seq 4 taken from its input):
 *   params      2h + hV          = 16 + 80               = 96
 *   fwd         2 s h V          = 2 * 4 * 8 * 10        = 640
 *   bwd         2 x fwd                                  = 1280
 *   out bytes   0 (a sink)
 *   saved       2sh + 2s + sV    = 64 + 8 + 40 = 112 elements * 2 = 224
 * Model:
 *   params      112 + 1200 + 96                          = 1408
 *   state       bf16 weights 2 + grads 2 + fp32 master 4 + AdamW m,v 8 = 16 B/param
 *               1408 * 16                                = 22528
 *   FLOPs/iter  B * sum(fwd + bwd) = 3 * (0 + 27648 + 1920) = 3 * 29568 = 88704
 *   saved/iter  B * sum(saved)     = 3 * (8 + 1728 + 224)   = 3 * 1960  = 5880
 */
static void test_summary_by_hand(void **state)
{
	(void)state;
	sp_model_t m;
	parse_ok(&m, TINY);
	assert_int_equal(m.n_tasks, 1);
	const sp_task_t *t = &m.tasks[0];
	assert_int_equal(t->n_nodes, 3);
	assert_int_equal(t->batch, 3);
	static const struct {
		const char *id;
		int64_t layers, params, fwd, bwd, out, saved;
	} want[] = {
		{"in", 1, 112, 0, 0, 64, 8},
		{"x", 2, 1200, 9216, 18432, 64, 1728},
		{"loss", 1, 96, 640, 1280, 0, 224},
	};
	for (int i = 0; i < 3; i++) {
		inspect_node_t n;
		assert_string_equal(t->nodes[i].id, want[i].id);
		inspect_node(&n, &m, t, &t->nodes[i]);
		assert_int_equal(n.layers, want[i].layers);
		assert_int_equal(n.params, want[i].params);
		assert_int_equal(n.fwd_flops, want[i].fwd);
		assert_int_equal(n.bwd_flops, want[i].bwd);
		assert_int_equal(n.out_bytes, want[i].out);
		assert_int_equal(n.saved_bytes, want[i].saved);
	}
	assert_int_equal(t->nodes[2].seq, 4); /* a loss takes its input's seq */
	inspect_model_t im;
	inspect_model(&im, &m);
	assert_int_equal(im.params, 1408);
	assert_int_equal(im.state_bytes_per_param, 16);
	assert_int_equal(im.state_bytes, 22528);
	assert_int_equal(im.iter_flops, 88704);
	assert_int_equal(im.saved_bytes, 5880);
	/* defaults the file leaves out */
	assert_int_equal(m.opt.kind, OPT_ADAMW);
	assert_true(m.opt.lr == 1e-3 && m.opt.beta2 == 0.999 && m.opt.eps == 1e-8);
	assert_true(t->weight == 1.0);
	assert_int_equal(m.seed, 0);
	model_release(&m);
}

static void test_typo_error(void **state)
{
	(void)state;
	char *bad = replace(TINY, "\"hidden\": 8, \"max_seq\"", "\"hiden\": 8, \"max_seq\"");
	sp_model_t m;
	sp_err_t err = {0};
	assert_int_equal(model_parse(&m, bad, strlen(bad), "m.json", &err), SP_EINPUT);
	assert_int_equal(err.code, SP_EINPUT);
	assert_string_equal(err.file, "m.json");
	assert_int_equal(err.line, 3);
	assert_int_equal(err.col, 45);
	assert_string_equal(err.path, "components.tok.hiden");
	assert_string_equal(err.msg, "unknown key 'hiden' in an embedding component");
	assert_string_equal(err.hint, "did you mean 'hidden'?");
	/* nothing is left behind in the result */
	assert_null(m.comps);
	assert_null(m.tasks);
	assert_int_equal(m.n_comps, 0);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	sp_err_print(f, &err);
	fclose(f);
	assert_string_equal(buf, "m.json:3:45: components.tok.hiden: unknown key 'hiden' in an "
				 "embedding component\nhint: did you mean 'hidden'?\n");
	free(buf);
	free(bad);

	/* a misspelt reference: line 9, the input's string, with the near name */
	bad = replace(TINY, "\"inputs\": [\"in\"]", "\"inputs\": [\"inn\"]");
	memset(&err, 0, sizeof err);
	assert_int_equal(model_parse(&m, bad, strlen(bad), "m.json", &err), SP_EINPUT);
	assert_int_equal(err.line, 9);
	assert_int_equal(err.col, 57);
	assert_string_equal(err.path, "tasks[0].graph[1].inputs[0]");
	assert_string_equal(err.msg, "unknown node 'inn'");
	assert_string_equal(err.hint, "did you mean 'in'?");
	assert_null(m.tasks);
	free(bad);
}

static void assert_same_model(const sp_model_t *a, const sp_model_t *b)
{
	assert_string_equal(a->name, b->name);
	assert_int_equal(a->dtype, b->dtype);
	assert_memory_equal(&a->opt, &b->opt, sizeof a->opt);
	assert_int_equal(a->seed, b->seed);
	assert_int_equal(a->hash, b->hash);
	assert_int_equal(a->n_comps, b->n_comps);
	assert_memory_equal(a->comps, b->comps, sizeof *a->comps * (size_t)a->n_comps);
	assert_int_equal(a->n_tasks, b->n_tasks);
	for (int t = 0; t < a->n_tasks; t++) {
		const sp_task_t *x = &a->tasks[t], *y = &b->tasks[t];
		assert_string_equal(x->name, y->name);
		assert_int_equal(x->batch, y->batch);
		assert_true(x->weight == y->weight);
		assert_int_equal(x->n_nodes, y->n_nodes);
		for (int i = 0; i < x->n_nodes; i++) {
			const sp_node_t *p = &x->nodes[i], *q = &y->nodes[i];
			assert_string_equal(p->id, q->id);
			assert_int_equal(p->comp, q->comp);
			assert_int_equal(p->seq, q->seq);
			assert_int_equal(p->layer_from, q->layer_from);
			assert_int_equal(p->layer_to, q->layer_to);
			assert_int_equal(p->n_inputs, q->n_inputs);
			if (p->n_inputs > 0)
				assert_memory_equal(p->inputs, q->inputs,
						    sizeof(int) * (size_t)p->n_inputs);
		}
	}
}

static void test_model_copy_is_deep(void **state)
{
	(void)state;
	sp_model_t m, copy, ref;
	parse_ok(&m, TINY);
	parse_ok(&ref, TINY);
	assert_int_equal(model_copy(&copy, &m), 0);
	assert_same_model(&copy, &m);
	assert_ptr_not_equal(copy.comps, m.comps);
	assert_ptr_not_equal(copy.tasks, m.tasks);
	assert_ptr_not_equal(copy.tasks[0].nodes, m.tasks[0].nodes);
	for (int i = 0; i < m.tasks[0].n_nodes; i++)
		assert_ptr_not_equal(copy.tasks[0].nodes[i].inputs, m.tasks[0].nodes[i].inputs);
	/* scribble over the original and free it: the copy must not notice */
	m.comps[1].hidden = 999;
	snprintf(m.tasks[0].name, sizeof m.tasks[0].name, "changed");
	m.tasks[0].nodes[1].inputs[0] = 2;
	m.tasks[0].nodes[2].seq = 77;
	model_release(&m);
	assert_null(m.comps);
	assert_same_model(&copy, &ref);
	model_release(&copy);
	model_release(&ref);
	model_release(NULL);
	cluster_release(NULL);
}

static void test_hash_ignores_layout(void **state)
{
	(void)state;
	sp_model_t a, b, c;
	parse_ok(&a, TINY);
	parse_ok(&b, TINY_REFORMATTED);
	assert_int_not_equal(a.hash, 0);
	assert_int_equal(a.hash, b.hash);
	assert_same_model(&a, &b);
	/* one value changed: another hash */
	char *other = replace(TINY, "\"batch\": 3", "\"batch\": 4");
	parse_ok(&c, other);
	assert_int_not_equal(a.hash, c.hash);
	model_release(&c);
	free(other);
	other = replace(TINY, "\"name\": \"lm\"", "\"name\": \"lm2\"");
	parse_ok(&c, other);
	assert_int_not_equal(a.hash, c.hash);
	model_release(&a);
	model_release(&b);
	model_release(&c);
	free(other);
}

/* ---- the bundled inputs -------------------------------------------------- */

/* Rewrites text with sorted keys and another indentation. */
static char *relayout(const char *text, size_t flags)
{
	json_error_t je;
	json_t *v = json_loads(text, 0, &je);
	assert_non_null(v);
	char *s = json_dumps(v, flags | JSON_REAL_PRECISION(17));
	assert_non_null(s);
	json_decref(v);
	return s;
}

static void check_model_file(const char *path)
{
	sp_model_t m, r, copy;
	sp_err_t err = {0};
	int rc = model_load(&m, path, &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	assert_true(m.n_comps > 0 && m.n_tasks > 0);
	assert_int_not_equal(m.hash, 0);
	inspect_model_t im;
	inspect_model(&im, &m);
	assert_true(im.params > 0 && im.iter_flops > 0 && im.state_bytes > im.params);

	char *text = read_text(path);
	char *re = relayout(text, JSON_SORT_KEYS | JSON_INDENT(3));
	parse_ok(&r, re);
	assert_int_equal(r.hash, m.hash);
	model_release(&r);
	free(re);
	assert_int_equal(model_copy(&copy, &m), 0);
	assert_same_model(&copy, &m);
	model_release(&copy);
	model_release(&m);
	free(text);
}

static void check_cluster_file(const char *path)
{
	sp_cluster_t c, r;
	sp_err_t err = {0};
	int rc = cluster_load(&c, path, &err);
	if (rc)
		sp_err_print(stderr, &err);
	assert_int_equal(rc, 0);
	assert_true(c.nodes > 0 && c.gpus_per_node > 0 && c.memory_gib > 0);
	assert_int_not_equal(c.hash, 0);
	char *text = read_text(path);
	char *re = relayout(text, JSON_SORT_KEYS | JSON_COMPACT);
	memset(&err, 0, sizeof err);
	assert_int_equal(cluster_parse(&r, re, strlen(re), path, &err), 0);
	assert_int_equal(r.hash, c.hash);
	assert_int_equal(r.n_prof, c.n_prof);
	cluster_release(&r);
	cluster_release(&c);
	free(re);
	free(text);
}

static int is_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* plans/<name>/{model,cluster}.json and plans/clusters/<any>.json */
static void test_bundled_inputs_load(void **state)
{
	(void)state;
	char dir[1024], path[2048];
	snprintf(dir, sizeof dir, "%s/plans", root_dir());
	DIR *d = opendir(dir);
	if (!d)
		fail_msg("cannot open '%s' (set SPINDLE_ROOT)", dir);
	char *names[256];
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < 256)
		if (e->d_name[0] != '.')
			names[n++] = strdup(e->d_name);
	closedir(d);
	qsort(names, (size_t)n, sizeof *names, cmp_str);
	int models = 0, clusters = 0;
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/%s/model.json", dir, names[i]);
		if (is_file(path)) {
			print_message("model   %s\n", path);
			check_model_file(path);
			models++;
		}
		snprintf(path, sizeof path, "%s/%s/cluster.json", dir, names[i]);
		if (is_file(path)) {
			print_message("cluster %s\n", path);
			check_cluster_file(path);
			clusters++;
		}
		if (strcmp(names[i], "clusters") == 0) {
			char sub[1536];
			snprintf(sub, sizeof sub, "%s/%s", dir, names[i]);
			DIR *cd = opendir(sub);
			assert_non_null(cd);
			while ((e = readdir(cd)))
				if (ends_with(e->d_name, ".json")) {
					snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
					print_message("cluster %s\n", path);
					check_cluster_file(path);
					clusters++;
				}
			closedir(cd);
		}
		free(names[i]);
	}
	print_message("%d model(s), %d cluster(s)\n", models, clusters);
	assert_true(models >= 1);
	assert_true(clusters >= 2);
}

/* ---- failing allocations -------------------------------------------------- */

static const char CLUSTER[] =
	"{\"format\": \"spindle.cluster/1\", \"name\": \"c\", \"nodes\": 1, \"gpus_per_node\": 2,\n"
	" \"gpu\": {\"name\": \"g\", \"memory_gib\": 8, \"peak_tflops\": 10, \"mem_bandwidth_gbs\": 100},\n"
	" \"links\": {\"intra_node_gbs\": 10, \"intra_node_latency_us\": 1,\n"
	"           \"inter_node_gbs\": 1, \"inter_node_latency_us\": 5},\n"
	" \"profile\": [{\"op\": {\"type\": \"transformer\", \"hidden\": 8, \"heads\": 2, \"ffn\": 16,\n"
	"                       \"seq\": 4}, \"points\": [{\"batch\": 1, \"fwd_ms\": 1, \"bwd_ms\": 2}]},\n"
	"             {\"op\": {\"type\": \"classifier\", \"hidden\": 8, \"classes\": 3},\n"
	"              \"points\": [{\"batch\": 1, \"fwd_ms\": 1, \"bwd_ms\": 2}]}]}\n";

static int parse_model_or_cluster(int which, sp_err_t *err)
{
	if (which == 0) {
		sp_model_t m;
		int rc = model_parse(&m, TINY, strlen(TINY), "m.json", err);
		if (rc)
			assert_true(m.comps == NULL && m.tasks == NULL && m.n_tasks == 0);
		model_release(&m);
		return rc;
	}
	if (which == 1) {
		/* model_copy of a parsed model */
		sp_model_t m, copy;
		armed = 0;
		int rc = model_parse(&m, TINY, strlen(TINY), "m.json", err);
		assert_int_equal(rc, 0);
		armed = 1;
		rc = model_copy(&copy, &m);
		armed = 0;
		if (rc)
			assert_true(copy.comps == NULL && copy.tasks == NULL);
		model_release(&copy);
		model_release(&m);
		armed = 1;
		return rc;
	}
	sp_cluster_t c;
	int rc = cluster_parse(&c, CLUSTER, strlen(CLUSTER), "c.json", err);
	if (rc)
		assert_true(c.prof == NULL && c.n_prof == 0);
	cluster_release(&c);
	return rc;
}

/*
 * Our allocations: each failure must give SP_ENOMEM ("out of memory"), an
 * emptied result and no leak. jansson's: a failure inside json_loadb may be
 * reported by jansson as a syntax error (its lexer does not tell them
 * apart), so there the property is only: an error, an emptied result, no
 * crash and no leak.
 */
static void test_allocation_failures(void **state)
{
	(void)state;
#ifndef HAVE_WRAP
	skip();
#endif
	json_set_alloc_funcs(json_malloc, free);
	for (int which = 0; which < 3; which++) {
		/* count the allocations of a clean run */
		sp_err_t err = {0};
		n_allocs[0] = n_allocs[1] = 0;
		fail_at = -1;
		armed = 1;
		assert_int_equal(parse_model_or_cluster(which, &err), 0);
		armed = 0;
		long total[2] = {n_allocs[0], n_allocs[1]};
		assert_true(total[0] >= 3);
		for (int kind = 0; kind < 2; kind++) {
			for (long k = 0; k < total[kind]; k++) {
				memset(&err, 0, sizeof err);
				n_allocs[0] = n_allocs[1] = 0;
				fail_kind = kind;
				fail_at = k;
				armed = 1;
				int rc = parse_model_or_cluster(which, &err);
				armed = 0;
				if (kind == 0 && rc != SP_ENOMEM)
					fail_msg("parse %d, failing allocation %ld of %ld: rc %d (%s)",
						 which, k, total[kind], rc, err.msg);
				if (kind == 1 && rc != SP_ENOMEM && rc != SP_EINPUT)
					fail_msg("parse %d, failing jansson allocation %ld of %ld: "
						 "rc %d (%s)",
						 which, k, total[kind], rc, err.msg);
				if (kind == 0 && which != 1)
					assert_string_equal(err.msg, "out of memory");
			}
		}
		print_message("parse %d: each of %ld + %ld (jansson) allocations failed in turn\n",
			      which, total[0], total[1]);
	}
	fail_at = -1;
	json_set_alloc_funcs(malloc, free);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_summary_by_hand),
		cmocka_unit_test(test_typo_error),
		cmocka_unit_test(test_model_copy_is_deep),
		cmocka_unit_test(test_hash_ignores_layout),
		cmocka_unit_test(test_bundled_inputs_load),
		cmocka_unit_test(test_allocation_failures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
