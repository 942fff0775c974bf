/*
 * show.c — spindle-show: the canonical text view of a plan for code review
 * and as a git textconv driver (also as JSON, schemas/plan-view.schema.json),
 * plus the predicted schedule as a Chrome trace and an SVG Gantt chart.
 *
 * The view is deterministic: no timestamps, no addresses, fixed precision
 * (ms and GiB to 0.01, shares to 0.1%), waves in order, slices sorted by
 * MetaOp name within a wave, devices as compact lists. It does not judge
 * the plan (the planner's verifier does) and it never plans.
 */
#include "tools.h"
#include "trace_fmt.h"

#include <stdlib.h>
#include <string.h>

#define VIEW_FORMAT "spindle.plan-view/1"

typedef struct {
	const char *plan_path;
	const char *trace_path, *gantt_path;
	int json, programs;
} show_opts_t;

/* Things the header prints that are computed from the plan, not stored. */
typedef struct {
	double cap_gib;
	double peak_max, peak_min, peak_mean; /* GiB */
	int peak_dev, over_cap;
	double seq_ms; /* iteration of the sequential baseline, 0 if absent */
	int *order;    /* slices: by wave, then MetaOp name, layers, first device */
} view_t;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: spindle-show PLAN.bin [--programs] [--json] [--trace OUT.json]\n"
		"                    [--gantt OUT.svg]\n"
		"\n"
		"Prints the canonical text view of a plan: header, one line per wave and\n"
		"per slice, sync buckets and devices. Deterministic, so it works as a git\n"
		"textconv driver (see README.md, \"Plans in git diff\").\n"
		"\n"
		"  --programs        add every device's program, one instruction per line\n"
		"  --json            print the same content as JSON\n"
		"                    (schemas/plan-view.schema.json)\n"
		"  --trace FILE      write the predicted schedule as Chrome trace JSON\n"
		"                    (Perfetto, chrome://tracing)\n"
		"  --gantt FILE      write an SVG Gantt chart of the waves\n"
		"  -h, --help        this text\n"
		"\n"
		"With --trace or --gantt the view is printed only when --json or\n"
		"--programs asks for it. Files are written atomically.\n"
		"exit status: 0 done, 1 internal error, 2 bad command line or bad plan\n");
}

static int parse_args(show_opts_t *o, int argc, char **argv)
{
	memset(o, 0, sizeof *o);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			exit(SP_EXIT_OK);
		} else if (!strcmp(a, "--json")) {
			o->json = 1;
		} else if (!strcmp(a, "--programs")) {
			o->programs = 1;
		} else if (!strcmp(a, "--trace") || !strcmp(a, "--gantt")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "spindle-show: option '%s' needs a file name\n", a);
				return SP_EXIT_INPUT;
			}
			*(!strcmp(a, "--trace") ? &o->trace_path : &o->gantt_path) = argv[++i];
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "spindle-show: unknown option '%s'\nhint: see "
					"spindle-show --help\n",
				a);
			return SP_EXIT_INPUT;
		} else if (!o->plan_path) {
			o->plan_path = a;
		} else {
			fprintf(stderr, "spindle-show: unexpected argument '%s'\n", a);
			return SP_EXIT_INPUT;
		}
	}
	if (!o->plan_path) {
		usage(stderr);
		return SP_EXIT_INPUT;
	}
	return 0;
}

/* ---- the view's derived numbers ------------------------------------------ */

static const sp_plan_t *sort_plan; /* qsort has no context argument */

static int cmp_slice(const void *a, const void *b)
{
	const sp_slice_t *x = &sort_plan->slices[*(const int *)a];
	const sp_slice_t *y = &sort_plan->slices[*(const int *)b];
	if (x->wave != y->wave)
		return x->wave < y->wave ? -1 : 1;
	int c = strcmp(sort_plan->metaops[x->metaop].name, sort_plan->metaops[y->metaop].name);
	if (c)
		return c;
	if (x->layer_from != y->layer_from)
		return x->layer_from < y->layer_from ? -1 : 1;
	int dx = sort_plan->slice_devs[x->dev_off], dy = sort_plan->slice_devs[y->dev_off];
	if (dx != dy)
		return dx < dy ? -1 : 1;
	/* equal keys: plan order keeps the sort stable */
	return *(const int *)a < *(const int *)b ? -1 : *(const int *)a > *(const int *)b;
}

static int view_init(view_t *v, const sp_plan_t *p)
{
	memset(v, 0, sizeof *v);
	v->cap_gib = p->memory_gib - p->mem_reserve_gib;
	v->peak_min = HUGE_VAL;
	for (int d = 0; d < p->n_devices; d++) {
		double g = (double)p->devices[d].mem_peak / GIB;
		if (g > v->peak_max || d == 0) {
			v->peak_max = g;
			v->peak_dev = d;
		}
		v->peak_min = fmin(v->peak_min, g);
		v->peak_mean += g / p->n_devices;
		v->over_cap += g > v->cap_gib;
	}
	for (int a = 0; a < p->n_algos; a++)
		if (!strcmp(p->algos[a].name, "sequential"))
			v->seq_ms = p->algos[a].iteration_ms;
	v->order = malloc(sizeof *v->order * (size_t)(p->n_slices + 1));
	if (!v->order)
		return SP_ENOMEM;
	for (int s = 0; s < p->n_slices; s++)
		v->order[s] = s;
	sort_plan = p;
	qsort(v->order, (size_t)p->n_slices, sizeof *v->order, cmp_slice);
	return 0;
}

static double share(double part, double whole)
{
	return whole > 0 ? 100 * part / whole : 0;
}

/* "vision 0-31, vision_proj 0": a bucket's parameter groups, by component. */
static void param_list(char *buf, size_t cap, const sp_plan_t *p, const sp_param_t *a, int n)
{
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; i < n && o + SP_NAME_MAX + 32 < cap; i++) {
		int j = i;
		while (j + 1 < n && a[j + 1].comp == a[i].comp && a[j + 1].layer == a[j].layer + 1 &&
		       a[j + 1].tp == a[i].tp && a[j + 1].tp_rank == a[i].tp_rank)
			j++;
		const char *name = p->model.comps[a[i].comp].name;
		o += (size_t)snprintf(buf + o, cap - o, i == j ? "%s%s %d" : "%s%s %d-%d",
				      i ? ", " : "", name, a[i].layer, a[j].layer);
		if (a[i].tp > 1) /* shard tp_rank of tp */
			o += (size_t)snprintf(buf + o, cap - o, " shard %d/%d", a[i].tp_rank,
					      a[i].tp);
		i = j;
	}
	if (o + SP_NAME_MAX + 32 >= cap && cap > 4)
		strcpy(buf + cap - 4, "...");
}

/* 1 when device x holds a tensor-parallel shard (the views then list what
 * it holds; whole layers only: nothing more to say than the buckets do). */
static int holds_shards(const sp_plan_t *p, const sp_device_t *x)
{
	for (int k = 0; k < x->n_held; k++)
		if (p->held[x->held_off + k].tp > 1)
			return 1;
	return 0;
}

/* ---- text view -------------------------------------------------------------- */

#define N2(x) tl_fmt(&nr, (x), 2)
#define N1(x) tl_fmt(&nr, (x), 1)

static void text_header(FILE *f, const sp_plan_t *p, const view_t *v)
{
	tl_ring_t nr = {0};
	const sp_cert_t *c = &p->cert;
	fprintf(f, "# spindle plan view: times in ms, memory in GiB, layers a-b are [a, b)\n");
	fprintf(f, "model        %s (%s, %s, %d tasks, %d MetaOps)\n", p->model.name,
		dtype_name(p->model.dtype), p->model.opt.kind == OPT_SGD ? "sgd" : "adamw",
		p->model.n_tasks, p->n_metaops);
	fprintf(f, "cluster      %s (%d x %d %s, %s GiB each, %s GiB reserved)\n", p->cluster_name,
		p->nodes, p->gpus_per_node, p->gpu_name, N2(p->memory_gib), N2(p->mem_reserve_gib));
	fprintf(f, "algorithm    %s\n", p->algo);
	fprintf(f, "planner      %s\n", p->planner_version);
	fprintf(f, "options      %s\n", p->options);
	int same_k = 1;
	for (int t = 0; t < p->model.n_tasks; t++)
		same_k &= plan_task_k(p, t) == p->microbatches;
	if (same_k) {
		fprintf(f, "micro-batch  %d per step, the same for every task (task batches, waves "
			   "and slice times are one micro-step's)\n",
			p->microbatches);
	} else {
		fprintf(f, "micro-batch  %d micro-steps per step; per task:", p->microbatches);
		for (int t = 0; t < p->model.n_tasks; t++)
			fprintf(f, "%s %s %d", t ? "," : "", p->model.tasks[t].name,
				plan_task_k(p, t));
		fprintf(f, " (a task runs in its first ones; task batches, waves and slice "
			   "times are one micro-step's)\n");
	}
	fprintf(f, "inputs       model %016llx, cluster %016llx\n",
		(unsigned long long)p->model_hash, (unsigned long long)p->cluster_hash);
	fprintf(f, "iteration    %s ms predicted\n", N2(c->iteration_ms));
	fprintf(f, "compute      %s ms (forward and backward waves alone)\n", N2(c->compute_ms));
	fprintf(f, "lower bound  %s ms = max(area %s, critical path %s, allotment %s); paper's "
		   "relaxed bound %s\n",
		N2(c->lower_bound_ms), N2(c->area_bound_ms), N2(c->cp_bound_ms),
		N2(c->allot_bound_ms), N2(c->paper_bound_ms));
	fprintf(f, "gap          %s%% (compute over the lower bound)\n", N1(100 * c->gap));
	fprintf(f, "comm bound   %s ms (gradient bytes over the busiest node's NICs, this "
		   "placement)\n",
		N2(c->comm_lower_bound_ms));
	fprintf(f, "transfers    %s ms (%s%% of the iteration); cross-node %s GiB, naive placement "
		   "%s GiB (+%s ms)\n",
		N2(c->transfer_ms), N1(share(c->transfer_ms, c->iteration_ms)),
		N2((double)c->xnode_bytes / GIB), N2((double)c->naive_xnode_bytes / GIB),
		N2(c->naive_xfer_pred_ms));
	fprintf(f, "sync         %s ms (%s%% of the iteration) for sync and optimizer step, %d "
		   "buckets\n",
		N2(c->sync_ms), N1(share(c->sync_ms, c->iteration_ms)), p->n_buckets);
	fprintf(f, "memory       peak %s GiB max (device %d), %s mean, %s min; cap %s GiB; %s\n",
		N2(v->peak_max), v->peak_dev, N2(v->peak_mean), N2(v->peak_min), N2(v->cap_gib),
		v->over_cap ? "OVER CAP" : "fits");
	if (v->over_cap)
		fprintf(f, "             %d devices over the cap\n", v->over_cap);
	fprintf(f, "size         %d waves, %d slices, %d devices, %d instructions\n", p->n_waves,
		p->n_slices, p->n_devices, p->n_ins);
	fprintf(f, "\nbaselines    %-14s %12s %11s %9s %12s  %s\n", "algorithm", "iteration ms",
		"compute ms", "speed-up", "utilisation", "memory");
	for (int a = 0; a < p->n_algos; a++) {
		const sp_algo_result_t *r = &p->algos[a];
		char sp[40] = "-";
		if (v->seq_ms > 0 && r->iteration_ms > 0)
			snprintf(sp, sizeof sp, "%sx", N2(v->seq_ms / r->iteration_ms));
		fprintf(f, "             %-14s %12s %11s %9s %11s%%  %s%s\n", r->name,
			N2(r->iteration_ms), N2(r->compute_ms), sp, N1(100 * r->utilisation),
			r->fits_memory ? "fits" : "over cap",
			!strcmp(r->name, p->algo) ? "  <- this plan" : "");
	}
}

static void text_waves(FILE *f, const sp_plan_t *p, const view_t *v)
{
	tl_ring_t nr = {0};
	fprintf(f, "\nwaves: forward start +duration, backward start +duration (the backward "
		   "mirrors the\nforward in reverse on the same devices); slices sorted by MetaOp\n");
	int k = 0;
	for (int w = 0; w < p->n_waves; w++) {
		const sp_wave_t *wv = &p->waves[w];
		int used = 0;
		for (int i = wv->first_slice; i < wv->first_slice + wv->n_slices; i++)
			used += p->slices[i].n_dev;
		fprintf(f, "wave %d  fwd %s +%s  bwd %s +%s  %d slices on %d devices\n", w,
			N2(wv->start_ms), N2(wv->dur_ms), N2(wv->bwd_start_ms), N2(wv->bwd_dur_ms),
			wv->n_slices, used);
		for (; k < p->n_slices && p->slices[v->order[k]].wave == w; k++) {
			const sp_slice_t *s = &p->slices[v->order[k]];
			char devs[512], lay[32], tp[24] = "", mem[2 * SP_NAME_MAX + 64];
			tl_devlist(devs, sizeof devs, p->slice_devs + s->dev_off, s->n_dev);
			snprintf(lay, sizeof lay, "%d-%d", s->layer_from, s->layer_to);
			if (s->tp > 1)
				snprintf(tp, sizeof tp, "  tp %d%s", s->tp, s->sp ? " sp" : "");
			tl_memory_str(mem, sizeof mem, p, s->metaop);
			fprintf(f, "  w%-3d %-32s layers %-7s x%-3d devices %-10s fwd %s +%s  bwd %s +%s%s%s%s%s\n",
				w, p->metaops[s->metaop].name, lay, s->n_dev, devs, N2(s->start_ms),
				N2(s->fwd_ms), N2(s->bwd_start_ms), N2(s->bwd_ms),
				s->recompute ? "  recompute" : "", tp, mem[0] ? "  " : "", mem);
		}
	}
}

/* " in n pieces" of deferred bucket b when its all-gather runs in n > 1
 * (plan_defer_pieces); a static buffer, one call per line. */
static const char *pieces_note(const sp_plan_t *p, int b)
{
	static char s[32];
	int32_t *first = malloc(sizeof(int32_t) * (size_t)(p->buckets[b].n_params + 1));
	int n = first ? plan_defer_pieces(p, b, p->buckets[b].defer, first, NULL) : 0;
	free(first);
	snprintf(s, sizeof s, n > 1 ? " in %d pieces" : "", n);
	return s;
}

static void text_buckets(FILE *f, const sp_plan_t *p)
{
	tl_ring_t nr = {0};
	fprintf(f, "\nsync buckets: devices, parameter groups (component layers), elements, "
		   "all-reduce ms (zero-1: reduce-scatter + all-gather ms)\n");
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *x = &p->buckets[b];
		char devs[512], params[1024];
		tl_devlist(devs, sizeof devs, p->bucket_devs + x->dev_off, x->n_dev);
		param_list(params, sizeof params, p, p->bucket_params + x->param_off, x->n_params);
		if (x->layout == LAYOUT_REPLICATED)
			fprintf(f, "bucket %-3d devices %-10s %s; %lld elements, %s ms\n", b, devs,
				params, (long long)x->elems, N2(x->sync_ms));
		else
			fprintf(f, "bucket %-3d devices %-10s %s; %lld elements, %s%s%s%s, %s + %s ms\n",
				b, devs, params, (long long)x->elems, layout_name(x->layout),
				x->overlap ? " overlapped" : "", x->defer ? " deferred" : "",
				x->defer > 1 ? pieces_note(p, b) : "", N2(x->sync_ms),
				N2(x->gather_ms));
	}
}

static void text_devices(FILE *f, const sp_plan_t *p)
{
	tl_ring_t nr = {0};
	fprintf(f, "\ndevices: memory GiB (params, acts, buffers, work, peak); time ms (busy, "
		   "comm, idle)\n");
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *x = &p->devices[d];
		fprintf(f, "device %-3d node %d gpu %-2d  mem %s %s %s %s peak %s  time %s %s %s  "
			   "%d instructions\n",
			d, x->node, x->local, N2((double)x->mem[MEM_PARAMS] / GIB),
			N2((double)x->mem[MEM_ACTS] / GIB), N2((double)x->mem[MEM_COMM] / GIB),
			N2((double)x->mem[MEM_WORK] / GIB), N2((double)x->mem_peak / GIB),
			N2(x->busy_ms), N2(x->comm_ms), N2(x->idle_ms), x->n_ins);
		if (holds_shards(p, x)) {
			char held[1024];
			param_list(held, sizeof held, p, p->held + x->held_off, x->n_held);
			fprintf(f, "           holds %s\n", held);
		}
	}
}

/* "act(image-text/img, 6) tokens 0+257"; a decoder's memory is layer "mem":
 * "act(cap/dec, mem) tokens 0+257" */
static void vref_str(char *buf, size_t cap, const sp_plan_t *p, const sp_vref_t *r, int seq_len)
{
	char l[16];
	snprintf(buf, cap, "%s(%s, %s) tokens %d+%d", r->grad ? "grad" : "act",
		 p->metaops[r->metaop].name, tl_layer_str(l, sizeof l, r->layer), r->seq_off,
		 seq_len);
}

static void text_ins(FILE *f, const sp_plan_t *p, int k, const sp_ins_t *in)
{
	char a[256], b[256];
	fprintf(f, "  %5d %-4s ", k, ins_op_name(in->op));
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		const sp_slice_t *s = &p->slices[in->slice];
		fprintf(f, "%s layers %d-%d samples %d-%d\n", p->metaops[s->metaop].name,
			s->layer_from, s->layer_to, in->s0, in->s1);
		break;
	}
	case INS_SEND:
		vref_str(a, sizeof a, p, &in->src, in->seq_len);
		fprintf(f, "%s samples %d-%d to %d tag %d\n", a, in->s0, in->s1, in->peer, in->tag);
		break;
	case INS_RECV:
		vref_str(a, sizeof a, p, &in->dst, in->seq_len);
		fprintf(f, "%s samples %d-%d from %d tag %d\n", a, in->s0, in->s1, in->peer,
			in->tag);
		break;
	case INS_COPY:
		vref_str(a, sizeof a, p, &in->src, in->seq_len);
		vref_str(b, sizeof b, p, &in->dst, in->seq_len);
		fprintf(f, "%s -> %s samples %d-%d\n", a, b, in->s0, in->s1);
		break;
	case INS_SYNC:
	case INS_GATHER:
	case INS_PGATHER:
	case INS_PFREE: {
		const sp_bucket_t *x = &p->buckets[in->peer];
		tl_devlist(a, sizeof a, p->bucket_devs + x->dev_off, x->n_dev);
		fprintf(f, "bucket %d devices %s\n", in->peer, a);
		break;
	}
	default: fputc('\n', f); break;
	}
}

static void text_programs(FILE *f, const sp_plan_t *p)
{
	fprintf(f, "\nprograms: index, op, operands (values are act|grad(MetaOp, layer boundary) "
		   "tokens offset+count)\n");
	for (int m = 0; m < p->n_metaops; m++)
		if (p->metaops[m].shape.mem_seq > 0) {
			fprintf(f, "(layer boundary mem: a cross-attention MetaOp's memory)\n");
			break;
		}
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *x = &p->devices[d];
		fprintf(f, "program of device %d (node %d gpu %d): %d instructions\n", d, x->node,
			x->local, x->n_ins);
		for (int k = 0; k < x->n_ins; k++)
			text_ins(f, p, k, &p->ins[x->first_ins + k]);
	}
}

static void text_view(FILE *f, const sp_plan_t *p, const view_t *v, int programs)
{
	text_header(f, p, v);
	text_waves(f, p, v);
	text_buckets(f, p);
	text_devices(f, p);
	if (programs)
		text_programs(f, p);
}

/* ---- JSON view (schemas/plan-view.schema.json) ------------------------------- */

/* Numbers rounded as in the text view, so JSON diffs are as quiet. */
#define J2(x) tl_fmt(&nr, (x), 2)
#define J4(x) tl_fmt(&nr, (x), 4)

/* [{"component": ..., "layer": l, "tp": t, "tp_rank": j}, ...] */
static void json_params(FILE *f, const sp_plan_t *p, const sp_param_t *a, int n)
{
	fprintf(f, "[");
	for (int i = 0; i < n; i++) {
		fprintf(f, "%s{\"component\": ", i ? ", " : "");
		sp_json_str(f, p->model.comps[a[i].comp].name);
		fprintf(f, ", \"layer\": %d, \"tp\": %d, \"tp_rank\": %d}", a[i].layer, a[i].tp,
			a[i].tp_rank);
	}
	fprintf(f, "]");
}

static void json_devlist(FILE *f, const int32_t *d, int n)
{
	fputc('[', f);
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%d", i ? ", " : "", d[i]);
	fputc(']', f);
}

static void json_vref(FILE *f, const char *key, const sp_plan_t *p, const sp_vref_t *r)
{
	fprintf(f, ", \"%s\": {\"value\": \"%s\", \"metaop\": ", key, r->grad ? "grad" : "act");
	sp_json_str(f, p->metaops[r->metaop].name);
	fprintf(f, ", \"layer\": %d, \"seq_off\": %d}", r->layer, r->seq_off);
}

static void json_ins(FILE *f, const sp_plan_t *p, const sp_ins_t *in)
{
	fprintf(f, "{\"op\": \"%s\"", ins_op_name(in->op));
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		const sp_slice_t *s = &p->slices[in->slice];
		fprintf(f, ", \"metaop\": ");
		sp_json_str(f, p->metaops[s->metaop].name);
		fprintf(f, ", \"layers\": [%d, %d], \"samples\": [%d, %d]", s->layer_from,
			s->layer_to, in->s0, in->s1);
		break;
	}
	case INS_SEND:
	case INS_RECV:
	case INS_COPY:
		fprintf(f, ", \"samples\": [%d, %d], \"seq_len\": %d", in->s0, in->s1, in->seq_len);
		if (in->op != INS_RECV)
			json_vref(f, "src", p, &in->src);
		if (in->op != INS_SEND)
			json_vref(f, "dst", p, &in->dst);
		if (in->op != INS_COPY)
			fprintf(f, ", \"peer\": %d, \"tag\": %d", in->peer, in->tag);
		break;
	case INS_SYNC:
	case INS_GATHER:
	case INS_PGATHER:
	case INS_PFREE: fprintf(f, ", \"bucket\": %d", in->peer); break;
	default: break;
	}
	fputc('}', f);
}

static void json_view(FILE *f, const sp_plan_t *p, const view_t *v, int programs)
{
	tl_ring_t nr = {0};
	const sp_cert_t *c = &p->cert;
	fprintf(f, "{\n  \"format\": \"%s\",\n  \"model\": ", VIEW_FORMAT);
	sp_json_str(f, p->model.name);
	fprintf(f, ",\n  \"dtype\": \"%s\",\n  \"optimizer\": \"%s\",\n  \"tasks\": [",
		dtype_name(p->model.dtype), p->model.opt.kind == OPT_SGD ? "sgd" : "adamw");
	for (int t = 0; t < p->model.n_tasks; t++) {
		fprintf(f, "%s", t ? ", " : "");
		sp_json_str(f, p->model.tasks[t].name);
	}
	fprintf(f, "],\n  \"cluster\": {\"name\": ");
	sp_json_str(f, p->cluster_name);
	fprintf(f, ", \"gpu\": ");
	sp_json_str(f, p->gpu_name);
	fprintf(f, ", \"nodes\": %d, \"gpus_per_node\": %d, \"memory_gib\": %s, "
		   "\"mem_reserve_gib\": %s},\n",
		p->nodes, p->gpus_per_node, J2(p->memory_gib), J2(p->mem_reserve_gib));
	fprintf(f, "  \"algorithm\": ");
	sp_json_str(f, p->algo);
	fprintf(f, ",\n  \"planner_version\": ");
	sp_json_str(f, p->planner_version);
	fprintf(f, ",\n  \"options\": ");
	sp_json_str(f, p->options);
	fprintf(f, ",\n  \"microbatches\": %d,\n  \"task_microbatches\": [", p->microbatches);
	for (int t = 0; t < p->model.n_tasks; t++)
		fprintf(f, "%s%d", t ? ", " : "", plan_task_k(p, t));
	fprintf(f, "]");
	fprintf(f, ",\n  \"model_hash\": \"%016llx\",\n  \"cluster_hash\": \"%016llx\",\n",
		(unsigned long long)p->model_hash, (unsigned long long)p->cluster_hash);
	fprintf(f, "  \"predicted\": {\"iteration_ms\": %s, \"compute_ms\": %s, "
		   "\"lower_bound_ms\": %s, \"area_bound_ms\": %s, \"critical_path_bound_ms\": %s, "
		   "\"paper_bound_ms\": %s, \"gap\": %s, \"transfer_ms\": %s, \"transfer_share\": %s, "
		   "\"sync_ms\": %s, \"sync_share\": %s, \"xnode_gib\": %s, "
		   "\"naive_xnode_gib\": %s, \"naive_transfer_ms\": %s},\n",
		J2(c->iteration_ms), J2(c->compute_ms), J2(c->lower_bound_ms), J2(c->area_bound_ms),
		J2(c->cp_bound_ms), J2(c->paper_bound_ms), J4(c->gap), J2(c->transfer_ms),
		J4(share(c->transfer_ms, c->iteration_ms) / 100), J2(c->sync_ms),
		J4(share(c->sync_ms, c->iteration_ms) / 100), J2((double)c->xnode_bytes / GIB),
		J2((double)c->naive_xnode_bytes / GIB), J2(c->naive_xfer_pred_ms));
	fprintf(f, "  \"size\": {\"metaops\": %d, \"waves\": %d, \"slices\": %d, \"devices\": %d, "
		   "\"buckets\": %d, \"instructions\": %d},\n",
		p->n_metaops, p->n_waves, p->n_slices, p->n_devices, p->n_buckets, p->n_ins);
	fprintf(f, "  \"memory\": {\"cap_gib\": %s, \"peak_max_gib\": %s, \"peak_max_device\": %d, "
		   "\"peak_mean_gib\": %s, \"peak_min_gib\": %s, \"devices_over_cap\": %d},\n",
		J2(v->cap_gib), J2(v->peak_max), v->peak_dev, J2(v->peak_mean), J2(v->peak_min),
		v->over_cap);
	fprintf(f, "  \"baselines\": [");
	for (int a = 0; a < p->n_algos; a++) {
		const sp_algo_result_t *r = &p->algos[a];
		fprintf(f, "%s\n    {\"algorithm\": ", a ? "," : "");
		sp_json_str(f, r->name);
		fprintf(f, ", \"iteration_ms\": %s, \"compute_ms\": %s, \"speedup\": %s, "
			   "\"utilisation\": %s, \"fits_memory\": %s, \"this_plan\": %s}",
			J2(r->iteration_ms), J2(r->compute_ms),
			v->seq_ms > 0 && r->iteration_ms > 0 ? J2(v->seq_ms / r->iteration_ms) : "null",
			J4(r->utilisation), r->fits_memory ? "true" : "false",
			strcmp(r->name, p->algo) ? "false" : "true");
	}
	fprintf(f, "\n  ],\n  \"waves\": [");
	int k = 0;
	for (int w = 0; w < p->n_waves; w++) {
		const sp_wave_t *wv = &p->waves[w];
		fprintf(f, "%s\n    {\"wave\": %d, \"start_ms\": %s, \"dur_ms\": %s, "
			   "\"bwd_start_ms\": %s, \"bwd_dur_ms\": %s, \"slices\": [",
			w ? "," : "", w, J2(wv->start_ms), J2(wv->dur_ms), J2(wv->bwd_start_ms),
			J2(wv->bwd_dur_ms));
		for (int i = 0; k < p->n_slices && p->slices[v->order[k]].wave == w; k++, i++) {
			const sp_slice_t *s = &p->slices[v->order[k]];
			const sp_metaop_t *m = &p->metaops[s->metaop];
			char devs[512];
			tl_devlist(devs, sizeof devs, p->slice_devs + s->dev_off, s->n_dev);
			fprintf(f, "%s\n      {\"metaop\": ", i ? "," : "");
			sp_json_str(f, m->name);
			fprintf(f, ", \"task\": ");
			sp_json_str(f, p->model.tasks[m->task].name);
			fprintf(f, ", \"layers\": [%d, %d], \"n_dev\": %d, \"devices\": ",
				s->layer_from, s->layer_to, s->n_dev);
			json_devlist(f, p->slice_devs + s->dev_off, s->n_dev);
			fprintf(f, ", \"device_list\": \"%s\", \"start_ms\": %s, \"fwd_ms\": %s, "
				   "\"bwd_start_ms\": %s, \"bwd_ms\": %s, \"tp\": %d, \"sp\": %d",
				devs, J2(s->start_ms), J2(s->fwd_ms), J2(s->bwd_start_ms),
				J2(s->bwd_ms), s->tp, s->sp);
			if (m->shape.mem_seq > 0) {
				int src = tl_memory_src(p, s->metaop);
				fprintf(f, ", \"memory\": {\"seq\": %lld, \"width\": %lld, \"from\": ",
					(long long)m->shape.mem_seq, (long long)m->shape.mem_width);
				sp_json_str(f, src >= 0 ? p->metaops[src].name : "?");
				fputc('}', f);
			}
			fputc('}', f);
		}
		fprintf(f, "%s]}", wv->n_slices ? "\n    " : "");
	}
	fprintf(f, "\n  ],\n  \"buckets\": [");
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *x = &p->buckets[b];
		fprintf(f, "%s\n    {\"bucket\": %d, \"devices\": ", b ? "," : "", b);
		json_devlist(f, p->bucket_devs + x->dev_off, x->n_dev);
		fprintf(f, ", \"params\": ");
		json_params(f, p, p->bucket_params + x->param_off, x->n_params);
		fprintf(f,
			", \"elems\": %lld, \"sync_ms\": %s, \"layout\": \"%s\", \"overlap\": %s, "
			"\"defer\": %s, \"pieces\": %d}",
			(long long)x->elems, J2(x->sync_ms), layout_name(x->layout),
			x->overlap ? "true" : "false", x->defer ? "true" : "false", (int)x->defer);
	}
	fprintf(f, "%s],\n  \"devices\": [", p->n_buckets ? "\n  " : "");
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *x = &p->devices[d];
		fprintf(f, "%s\n    {\"device\": %d, \"node\": %d, \"gpu\": %d, \"params_gib\": %s, "
			   "\"acts_gib\": %s, \"buffers_gib\": %s, \"work_gib\": %s, \"peak_gib\": %s, "
			   "\"busy_ms\": %s, \"comm_ms\": %s, \"idle_ms\": %s, \"instructions\": %d",
			d ? "," : "", d, x->node, x->local, J2((double)x->mem[MEM_PARAMS] / GIB),
			J2((double)x->mem[MEM_ACTS] / GIB), J2((double)x->mem[MEM_COMM] / GIB),
			J2((double)x->mem[MEM_WORK] / GIB), J2((double)x->mem_peak / GIB),
			J2(x->busy_ms), J2(x->comm_ms), J2(x->idle_ms), x->n_ins);
		if (holds_shards(p, x)) {
			fprintf(f, ", \"held\": ");
			json_params(f, p, p->held + x->held_off, x->n_held);
		}
		if (programs) {
			fprintf(f, ",\n     \"program\": [");
			for (int i = 0; i < x->n_ins; i++) {
				fprintf(f, "%s\n       ", i ? "," : "");
				json_ins(f, p, &p->ins[x->first_ins + i]);
			}
			fprintf(f, "%s]", x->n_ins ? "\n     " : "");
		}
		fputc('}', f);
	}
	fprintf(f, "\n  ]\n}\n");
}

/* ---- predicted trace ------------------------------------------------------ */

/*
 * trace_event prints ts and dur in us to 0.001 each; rounding both ends to
 * that grid first keeps ts + dur of one event at most the next event's ts.
 */
static void trace_span(FILE *f, int pid, int tid, const char *name, const char *cat,
		       double t0_ms, double t1_ms)
{
	double a = round(t0_ms * 1e6) / 1e6, z = round(t1_ms * 1e6) / 1e6;
	trace_event(f, pid, tid, name, cat, a, z - a);
}

/*
 * Chrome trace of the prediction in the layout of spindle-run --trace
 * (trace_fmt.c), events named as the runtime names the instructions: a
 * process per device; thread 0 compute: each slice's forward (or loss) and
 * backward on each of its devices; thread 1 communication: the all-reduce
 * of each sync bucket the device is in. Times are tl_timeline's: inside
 * each slice's predicted envelope, and never overlapping on one thread.
 */
static int trace_write(FILE *f, const sp_plan_t *p)
{
	tl_timeline_t t;
	if (tl_timeline(&t, p))
		return SP_ENOMEM;
	char name[192];
	trace_begin(f, p->n_devices, "device");
	for (int i = 0, j = 0, d = 0; d < p->n_devices; d++) {
		for (; i < t.n_bars && t.bars[i].dev == d; i++) {
			const tl_bar_t *b = &t.bars[i];
			int sink = comp_is_sink(p->metaops[p->slices[b->slice].metaop].shape.type);
			sp_ins_t in = {.op = sink ? INS_LOSS : b->bwd ? INS_BWD : INS_FWD,
				       .slice = b->slice};
			trace_ins_name(name, sizeof name, p, &in);
			trace_span(f, d, 0, name, "compute", b->t0, b->t0 + b->dur);
		}
		for (; j < t.n_syncs && t.syncs[j].dev == d; j++) {
			const tl_sync_t *y = &t.syncs[j];
			sp_ins_t in = {.op = INS_SYNC, .peer = y->bucket};
			trace_ins_name(name, sizeof name, p, &in);
			trace_span(f, d, 1, name, "comm", y->t0, y->t0 + y->dur);
		}
	}
	trace_end(f);
	tl_timeline_release(&t);
	return 0;
}

/* ---- main ------------------------------------------------------------------ */

static int write_file(const char *path, const sp_plan_t *p, int trace)
{
	tl_out_t o;
	sp_err_t err = {0};
	int rc = tl_out_open(&o);
	if (!rc) {
		if (trace)
			rc = trace_write(o.f, p);
		else
			rc = gantt_svg(o.f, p);
	}
	if (rc) {
		if (o.f)
			fclose(o.f);
		free(o.buf);
		fprintf(stderr, "spindle-show: %s: out of memory\n", path);
		return SP_EXIT_FAIL;
	}
	if (tl_out_commit(&o, path, &err)) {
		fprintf(stderr, "spindle-show: ");
		sp_err_print(stderr, &err);
		return err.code == SP_EINPUT ? SP_EXIT_INPUT : SP_EXIT_FAIL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	show_opts_t o;
	int rc = parse_args(&o, argc, argv);
	if (rc)
		return rc;
	sp_plan_t p = {0};
	view_t v = {0};
	if ((rc = tl_load(&p, "spindle-show", o.plan_path)))
		return rc;
	if (view_init(&v, &p)) {
		fprintf(stderr, "spindle-show: out of memory\n");
		rc = SP_EXIT_FAIL;
		goto cleanup;
	}
	if (o.trace_path && (rc = write_file(o.trace_path, &p, 1)))
		goto cleanup;
	if (o.gantt_path && (rc = write_file(o.gantt_path, &p, 0)))
		goto cleanup;
	if (o.json)
		json_view(stdout, &p, &v, o.programs);
	else if (o.programs || (!o.trace_path && !o.gantt_path))
		text_view(stdout, &p, &v, o.programs);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "spindle-show: cannot write to standard output\n");
		rc = SP_EXIT_FAIL;
	}
cleanup:
	free(v.order);
	plan_release(&p);
	return rc;
}
