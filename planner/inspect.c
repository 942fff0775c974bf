/*
 * inspect.c — `spindle-plan --inspect`: what the planner understood of its
 * inputs, before any planning: tasks, nodes, components with parameter
 * counts, per-node FLOPs and activation bytes per sample, and the memory a
 * full replica of the model's parameter state takes in the chosen dtype.
 * A cross-attention node lists its memory after its inputs, with the
 * memory's seq (m) and width (w) that its FLOPs and saved bytes count.
 */
#include "planner.h"

#include <string.h>

void inspect_node(inspect_node_t *out, const sp_model_t *m, const sp_task_t *t,
		  const sp_node_t *n)
{
	sp_opshape_t s = op_shape(m, t, n);
	const sp_component_t *c = &m->comps[n->comp];
	int64_t L = n->layer_to - n->layer_from;
	int db = dtype_bytes(m->dtype);
	memset(out, 0, sizeof *out);
	out->layers = L;
	out->fwd_flops = op_fwd_flops(&s, t->batch) * L;
	out->bwd_flops = op_bwd_flops(&s, t->batch) * L;
	out->out_bytes = comp_is_sink(c->type) ? 0 : n->seq * comp_out_width(c) * db;
	out->saved_bytes = op_saved_elems(&s, t->batch) * L * db;
	out->params = comp_layer_params(c) * L;
}

void inspect_model(inspect_model_t *out, const sp_model_t *m)
{
	memset(out, 0, sizeof *out);
	for (int k = 0; k < m->n_comps; k++)
		out->params += comp_params(&m->comps[k]);
	out->state_bytes_per_param = param_state_bytes(m->dtype, m->opt.kind);
	out->state_bytes = out->params * out->state_bytes_per_param;
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		for (int i = 0; i < t->n_nodes; i++) {
			inspect_node_t n;
			inspect_node(&n, m, t, &t->nodes[i]);
			out->iter_flops += (n.fwd_flops + n.bwd_flops) * t->batch;
			out->saved_bytes += n.saved_bytes * t->batch;
		}
	}
}

static void fmt_count(char *buf, size_t cap, int64_t x)
{
	char tmp[32];
	int n = snprintf(tmp, sizeof tmp, "%lld", (long long)x);
	size_t o = 0;
	for (int i = 0; i < n && o + 2 < cap; i++) {
		if (i > 0 && tmp[i - 1] != '-' && (n - i) % 3 == 0)
			buf[o++] = ',';
		buf[o++] = tmp[i];
	}
	buf[o] = 0;
}

static double gib(int64_t b)
{
	return (double)b / (1024.0 * 1024.0 * 1024.0);
}

void inspect_print(FILE *f, const sp_model_t *m, const sp_cluster_t *cl)
{
	char a[32], b[32];
	inspect_model_t im;
	inspect_model(&im, m);
	fprintf(f, "model '%s': dtype %s, optimizer %s (lr %g, weight decay %g), seed %llu\n",
		m->name, dtype_name(m->dtype), m->opt.kind == OPT_ADAMW ? "adamw" : "sgd",
		m->opt.lr, m->opt.weight_decay, (unsigned long long)m->seed);
	fprintf(f, "cluster '%s': %d node(s) x %d %s (%.0f GiB, %.0f TFLOP/s, %.0f GB/s), "
		   "links %.0f GB/s in a node, %.0f GB/s between nodes, %d profiled shape(s)\n",
		cl->name, cl->nodes, cl->gpus_per_node, cl->gpu_name, cl->memory_gib,
		cl->peak_tflops, cl->mem_bandwidth_gbs, cl->intra_gbs, cl->inter_gbs,
		cl->n_prof);
	fprintf(f, "\ncomponents (%d)\n", m->n_comps);
	fprintf(f, "  %-20s %-12s %6s %16s %16s\n", "name", "type", "layers", "params/layer",
		"params");
	for (int k = 0; k < m->n_comps; k++) {
		const sp_component_t *c = &m->comps[k];
		fmt_count(a, sizeof a, comp_layer_params(c));
		fmt_count(b, sizeof b, comp_params(c));
		fprintf(f, "  %-20s %-12s %6lld %16s %16s\n", c->name, comp_type_name(c->type),
			(long long)(c->type == COMP_TRANSFORMER ? c->layers : 1), a, b);
	}
	fmt_count(a, sizeof a, im.params);
	fprintf(f, "  total parameters %s\n", a);
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		fprintf(f, "\ntask '%s': batch %lld, weight %g, %d node(s)\n", t->name,
			(long long)t->batch, t->weight, t->n_nodes);
		fprintf(f, "  %-16s %-16s %-7s %5s %6s %12s %12s %12s %12s  %s\n", "node",
			"component", "layers", "seq", "width", "fwd GFLOP", "bwd GFLOP",
			"out KiB", "saved KiB", "inputs");
		for (int i = 0; i < t->n_nodes; i++) {
			const sp_node_t *n = &t->nodes[i];
			const sp_component_t *c = &m->comps[n->comp];
			inspect_node_t in;
			inspect_node(&in, m, t, n);
			char lay[24], inputs[256];
			if (c->type == COMP_TRANSFORMER)
				snprintf(lay, sizeof lay, "%d-%d", n->layer_from, n->layer_to);
			else
				snprintf(lay, sizeof lay, "-");
			size_t o = 0;
			inputs[0] = 0;
			for (int k = 0; k < n->n_inputs && o < sizeof inputs; k++) {
				int w = snprintf(inputs + o, sizeof inputs - o, "%s%s", k ? "," : "",
						 t->nodes[n->inputs[k]].id);
				if (w < 0)
					break;
				o += (size_t)w;
			}
			if (c->cross_attention && o < sizeof inputs) {
				sp_opshape_t sh = op_shape(m, t, n);
				snprintf(inputs + o, sizeof inputs - o, " memory %s (m%lld w%lld)",
					 t->nodes[n->memory].id, (long long)sh.mem_seq,
					 (long long)sh.mem_width);
			}
			fprintf(f, "  %-16s %-16s %-7s %5lld %6lld %12.4f %12.4f %12.1f %12.1f  %s\n",
				n->id, c->name, lay, (long long)n->seq,
				(long long)comp_out_width(c), (double)in.fwd_flops / 1e9,
				(double)in.bwd_flops / 1e9, (double)in.out_bytes / 1024.0,
				(double)in.saved_bytes / 1024.0, inputs);
		}
	}
	fprintf(f, "\nper sample: FLOPs and bytes above; per iteration (all tasks' batches): "
		   "%.3f TFLOP, %.2f GiB of activations saved for backward (%s)\n",
		(double)im.iter_flops / 1e12, gib(im.saved_bytes), dtype_name(m->dtype));
	fprintf(f, "parameter state of one full replica: %.2f GiB (%lld B/param: %s weights "
		   "and grads%s%s)\n",
		gib(im.state_bytes), (long long)im.state_bytes_per_param, dtype_name(m->dtype),
		m->dtype != DT_FP32 ? ", fp32 master" : "",
		m->opt.kind == OPT_ADAMW ? ", AdamW moments" : "");
	if (gib(im.state_bytes) > cl->memory_gib)
		fprintf(f, "note: a full replica does not fit one %s (%.0f GiB); the plan must "
			   "split layers across devices\n",
			cl->gpu_name, cl->memory_gib);
}
