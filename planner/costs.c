/*
 * costs.c — `spindle-plan --costs`: the estimator's prices as JSON
 * (schemas/costs.schema.json), so that another planner can be run on
 * exactly what ours believed and reviewers can check it: every MetaOp with
 * its per-layer forward and backward time at every width it may take, the
 * cluster's link figures, all-reduce and point-to-point prices at a few
 * sizes and group shapes, and the optimizer step's price.
 *
 * It prints what cost.c computes and nothing else: it builds the MetaOps
 * and their costs (graph.c, cost.c) and plans nothing. Output is
 * deterministic: MetaOps in the planner's order (topological inside each
 * task, tasks in model order), predecessors in input order (a decoder's
 * memory apart, as "memory"), times in ms with a fixed 9 decimals.
 */
#include "planner.h"

#include <string.h>

/* The sizes the collective and transfer prices are given at: 4 KiB (a small
 * bucket) to 1 GiB (a large model's gradients), by factors of 16. */
static const int64_t PRICE_BYTES[] = {(int64_t)1 << 12, (int64_t)1 << 16, (int64_t)1 << 20,
				      (int64_t)1 << 24, (int64_t)1 << 28, (int64_t)1 << 30};
#define N_PRICE_BYTES ((int)(sizeof PRICE_BYTES / sizeof *PRICE_BYTES))

/* A shape as the keys of a cluster profile entry's "op" (cluster.schema.json),
 * so a line of this output can be turned into a profile key as it is. */
static void print_shape(FILE *f, const sp_opshape_t *s)
{
	fprintf(f, "{\"type\": \"%s\"", comp_type_name(s->type));
	struct {
		const char *key;
		int64_t v;
	} k[] = {{"vocab", s->vocab}, {"in", s->in},       {"out", s->out},
		 {"hidden", s->hidden}, {"heads", s->heads}, {"ffn", s->ffn},
		 {"classes", s->classes}, {"seq", s->seq}};
	for (size_t i = 0; i < sizeof k / sizeof *k; i++)
		if (k[i].v)
			fprintf(f, ", \"%s\": %lld", k[i].key, (long long)k[i].v);
	if (s->type == COMP_TRANSFORMER)
		fprintf(f, ", \"causal\": %s", s->causal ? "true" : "false");
	if (s->mem_seq > 0)
		fprintf(f, ", \"mem_seq\": %lld, \"mem_width\": %lld", (long long)s->mem_seq,
			(long long)s->mem_width);
	fprintf(f, "}");
}

static void print_ms_list(FILE *f, const double *t, int n)
{
	fprintf(f, "[");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%.9f", i ? ", " : "", t[i]);
	fprintf(f, "]");
}

static void print_metaop(FILE *f, const planner_t *pl, int k)
{
	const sp_model_t *md = pl->model;
	const metaop_t *m = &pl->mops[k];
	const sp_node_t *n0 = &md->tasks[m->task].nodes[pl->ops[m->first_op].node];
	int db = dtype_bytes(md->dtype);
	fprintf(f, "    {\"name\": ");
	sp_json_str(f, m->name);
	fprintf(f, ", \"task\": ");
	sp_json_str(f, md->tasks[m->task].name);
	fprintf(f, ", \"layers\": %d, \"batch\": %lld, \"predecessors\": [", m->n_layers,
		(long long)m->batch);
	for (int e = 0, k = 0; e < m->n_pred; e++) {
		if (pl->edges[m->pred[e]].memory)
			continue;
		fprintf(f, "%s", k++ ? ", " : "");
		sp_json_str(f, pl->mops[pl->edges[m->pred[e]].src].name);
	}
	fprintf(f, "]");
	for (int e = 0; e < m->n_pred; e++)
		if (pl->edges[m->pred[e]].memory) {
			fprintf(f, ", \"memory\": ");
			sp_json_str(f, pl->mops[pl->edges[m->pred[e]].src].name);
		}
	fprintf(f, ",\n     \"scales\": %s, \"profiled\": %s, \"shape\": ",
		m->scales ? "true" : "false", m->profiled ? "true" : "false");
	print_shape(f, &m->shape);
	fprintf(f, ",\n     \"params_per_layer\": %lld, \"state_bytes_per_layer\": %lld, "
		   "\"saved_bytes_per_sample_per_layer\": %lld, \"out_bytes_per_sample\": %lld,\n"
		   "     \"nmax\": %d,\n     \"fwd_ms\": ",
		(long long)comp_layer_params(&md->comps[n0->comp]),
		(long long)m->layer_state_bytes, (long long)m->saved_per_sample,
		(long long)m->seq_out * m->width_out * db, m->nmax);
	/* tf[0] is unused: widths are 1..nmax */
	print_ms_list(f, m->tf + 1, m->nmax);
	fprintf(f, ",\n     \"bwd_ms\": ");
	print_ms_list(f, m->tb + 1, m->nmax);
	fprintf(f, "}");
}

/*
 * All-reduce group shapes: the first g GPUs of each of the first a nodes,
 * for (a, g) in (1, 2), (1, all), (2, 1), (all, 1), (2, all), (all, all),
 * those the cluster has, once each, ascending.
 */
static int group_shapes(const sp_cluster_t *c, int shapes[][2])
{
	int G = c->gpus_per_node, A = c->nodes, n = 0;
	int cand[][2] = {{1, 2}, {1, G}, {2, 1}, {2, G}, {A, 1}, {A, G}};
	for (size_t i = 0; i < sizeof cand / sizeof *cand; i++) {
		int a = cand[i][0], g = cand[i][1], dup = 0;
		if (a > A || g > G || a * g < 2)
			continue;
		for (int j = 0; j < n; j++)
			dup |= shapes[j][0] == a && shapes[j][1] == g;
		if (dup)
			continue;
		/* insertion in (a, g) order */
		int at = n++;
		while (at > 0 && (shapes[at - 1][0] > a || (shapes[at - 1][0] == a &&
							     shapes[at - 1][1] > g))) {
			shapes[at][0] = shapes[at - 1][0];
			shapes[at][1] = shapes[at - 1][1];
			at--;
		}
		shapes[at][0] = a;
		shapes[at][1] = g;
	}
	return n;
}

/* devs: room for every device of the cluster. */
static void print_collectives(FILE *f, const planner_t *pl, int32_t *devs)
{
	const sp_cluster_t *c = pl->cluster;
	int shapes[6][2], n_shapes = group_shapes(c, shapes);
	double ms[N_PRICE_BYTES];
	fprintf(f, "  \"sizes_bytes\": [");
	for (int i = 0; i < N_PRICE_BYTES; i++)
		fprintf(f, "%s%lld", i ? ", " : "", (long long)PRICE_BYTES[i]);
	fprintf(f, "],\n  \"all_reduce\": [");
	for (int s = 0; s < n_shapes; s++) {
		int a = shapes[s][0], g = shapes[s][1], n = 0;
		for (int node = 0; node < a; node++)
			for (int gpu = 0; gpu < g; gpu++)
				devs[n++] = node * c->gpus_per_node + gpu;
		for (int i = 0; i < N_PRICE_BYTES; i++)
			ms[i] = cost_allreduce_ms(c, devs, n, PRICE_BYTES[i]);
		fprintf(f, "%s\n    {\"nodes\": %d, \"gpus_per_node\": %d, \"devices\": %d, \"ms\": ",
			s ? "," : "", a, g, n);
		print_ms_list(f, ms, N_PRICE_BYTES);
		fprintf(f, "}");
	}
	/* point to point: device 0 to its neighbour in the node, and to the
	 * first GPU of the next node */
	fprintf(f, "\n  ],\n  \"p2p\": [");
	int peers[2] = {1, c->gpus_per_node}, first = 1;
	for (int k = 0; k < 2; k++) {
		if (peers[k] >= pl->N || (k == 0 && c->gpus_per_node < 2))
			continue;
		for (int i = 0; i < N_PRICE_BYTES; i++)
			ms[i] = cost_xfer_ms(c, 0, peers[k], PRICE_BYTES[i]);
		fprintf(f, "%s\n    {\"path\": \"%s\", \"from\": 0, \"to\": %d, \"ms\": ",
			first ? "" : ",", k == 0 ? "intra-node" : "cross-node", peers[k]);
		print_ms_list(f, ms, N_PRICE_BYTES);
		fprintf(f, "}");
		first = 0;
	}
	fprintf(f, "\n  ],\n");
}

static void print_cluster(FILE *f, const sp_cluster_t *c)
{
	fprintf(f, "  \"cluster\": ");
	sp_json_str(f, c->name);
	fprintf(f, ",\n  \"nodes\": %d,\n  \"gpus_per_node\": %d,\n  \"devices\": %d,\n",
		c->nodes, c->gpus_per_node, c->nodes * c->gpus_per_node);
	fprintf(f, "  \"gpu\": {\"name\": ");
	sp_json_str(f, c->gpu_name);
	fprintf(f, ", \"memory_gib\": %.6f, \"peak_tflops\": %.6f, \"mem_bandwidth_gbs\": %.6f, "
		   "\"sm_count\": %d, \"launch_us\": %.6f},\n",
		c->memory_gib, c->peak_tflops, c->mem_bandwidth_gbs, c->sm_count, c->launch_us);
	fprintf(f, "  \"links\": {\"intra_node_gbs\": %.6f, \"intra_node_latency_us\": %.6f, "
		   "\"inter_node_gbs\": %.6f, \"inter_node_latency_us\": %.6f},\n",
		c->intra_gbs, c->intra_lat_us, c->inter_gbs, c->inter_lat_us);
}

/* Everything is computed before the first byte is printed, so an error
 * leaves stdout empty. */
static int costs_scoped(FILE *f, planner_t *pl)
{
	const sp_model_t *md = pl->model;
	int rc;
	if ((rc = graph_build(pl)) || (rc = cost_build(pl)))
		return rc;
	int32_t *devs = sp_arena_calloc(&pl->scratch, (size_t)pl->N, sizeof *devs);
	if (!devs)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	fprintf(f, "{\n  \"format\": \"spindle.costs/1\",\n  \"model\": ");
	sp_json_str(f, md->name);
	fprintf(f, ",\n  \"dtype\": \"%s\",\n  \"dtype_bytes\": %d,\n", dtype_name(md->dtype),
		dtype_bytes(md->dtype));
	print_cluster(f, pl->cluster);
	fprintf(f, "  \"optimizer_step\": {\"state_bytes_per_param\": %lld, "
		   "\"ms_per_million_params\": %.9f},\n",
		(long long)param_state_bytes(md->dtype, md->opt.kind), cost_step_ms(pl, 1000000));
	print_collectives(f, pl, devs);
	fprintf(f, "  \"metaops\": [");
	for (int k = 0; k < pl->n_mops; k++) {
		fprintf(f, "%s\n", k ? "," : "");
		print_metaop(f, pl, k);
	}
	fprintf(f, "\n  ]\n}\n");
	return 0;
}

int costs_print(FILE *f, const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
		sp_err_t *err)
{
	planner_t pl = {.model = m, .cluster = c, .opts = o, .err = err};
	sp_arena_init(&pl.arena);
	sp_arena_init(&pl.scratch);
	pl.N = c->nodes * c->gpus_per_node;
	int rc = costs_scoped(f, &pl);
	sp_arena_release(&pl.scratch);
	sp_arena_release(&pl.arena);
	return rc;
}
