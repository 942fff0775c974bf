/*
 * report.c — `--report` / `--compare` (text) and `--json`: per-algorithm
 * predicted iteration time with what transfers and sync add to it, speed-up
 * over sequential, utilisation and model FLOPs utilisation, bounds (the
 * lower bound: the max of the compute bounds and the communication bound
 * of every plan; beside it the communication bound of this plan's
 * placement, which bounds this plan only) and gap, planning time; the chosen schedule wave by wave; the cost model
 * used per MetaOp; per-device memory and timeline.
 */
#include "planner.h"

#include <math.h>
#include <string.h>

static double gib(double b)
{
	return b / (1024.0 * 1024.0 * 1024.0);
}

static void slice_devices(char *buf, size_t cap, const sp_plan_t *p, const sp_slice_t *s)
{
	/* compact ranges: 0-7,12 */
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; i < s->n_dev && o + 16 < cap; i++) {
		int a = p->slice_devs[s->dev_off + i], j = i;
		while (j + 1 < s->n_dev && p->slice_devs[s->dev_off + j + 1] == a + (j + 1 - i))
			j++;
		int b = p->slice_devs[s->dev_off + j];
		o += (size_t)snprintf(buf + o, cap - o, a == b ? "%s%d" : "%s%d-%d", i ? "," : "",
				      a, b);
		i = j;
	}
}

/* The report's lower bound on every plan's iteration: the compute bounds
 * (the certificate's) and the communication bound of every plan. */
static double lower_bound(const sp_plan_t *p, const plan_summary_t *s)
{
	return fmax(p->cert.lower_bound_ms, s->bounds.comm_any_ms);
}

void report_print(FILE *f, const sp_plan_t *p, const plan_summary_t *s)
{
	const sp_cert_t *c = &p->cert;
	double seq = s->algos[ALGO_SEQUENTIAL].iteration_ms;
	fprintf(f, "plan for '%s' on '%s' (%d x %s), algorithm %s\n\n", p->model.name,
		p->cluster_name, p->n_devices, p->gpu_name, p->algo);
	/* transfers and sync: what each adds to the compute schedule */
	fprintf(f, "  %-16s %11s %11s %11s %9s %9s %12s %6s %12s  %s\n", "algorithm",
		"iteration ms", "compute ms", "transfer ms", "sync ms", "speed-up", "utilisation",
		"MFU", "planning ms", "memory");
	for (int a = 0; a < ALGO__COUNT; a++) {
		if (!s->ran[a])
			continue;
		const sp_algo_result_t *r = &s->algos[a];
		const algo_extra_t *x = &s->extra[a];
		fprintf(f, "  %-16s %11.3f %11.3f %11.3f %9.3f %8.2fx %11.1f%% %5.1f%% %12.1f  %s%s\n",
			r->name, r->iteration_ms, r->compute_ms, x->transfer_ms, x->sync_ms,
			r->iteration_ms > 0 ? seq / r->iteration_ms : 0, 100 * r->utilisation,
			100 * x->mfu, r->planning_ms, r->fits_memory ? "fits" : "over cap",
			a == (int)s->chosen ? "  <- chosen" : "");
	}
	fprintf(f, "(transfer and sync ms: what transfers, then sync and the optimizer step, "
		   "add to the compute schedule; MFU: model FLOPs / (devices x peak x "
		   "iteration))\n");
	fprintf(f, "\nlower bound %.3f ms = max(area %.3f, critical path %.3f, allotment %.3f, "
		   "communication %.3f); paper's relaxed bound %.3f ms\n",
		lower_bound(p, s), c->area_bound_ms, c->cp_bound_ms, c->allot_bound_ms,
		s->bounds.comm_any_ms, c->paper_bound_ms);
	fprintf(f, "(communication: the gradient bytes the nodes a group's work needs must carry "
		   "over their NICs, for any plan)\n");
	fprintf(f, "this plan's placement: communication bound %.3f ms (the gradient bytes its "
		   "busiest node's NICs carry; bounds this plan only)\n",
		s->bounds.comm_ms);
	fprintf(f, "compute schedule %.3f ms: gap %.1f%% to the compute bound %.3f ms (max of "
		   "area, critical path and allotment), %.1f%% to the area bound alone\n",
		c->compute_ms, 100 * c->gap, c->lower_bound_ms,
		c->area_bound_ms > 0 ? 100 * (c->compute_ms / c->area_bound_ms - 1) : 0);
	fprintf(f, "transfers %.3f ms (%.1f%%), sync and optimizer step %.3f ms (%.1f%%) of the "
		   "%.3f ms iteration\n",
		c->transfer_ms, c->iteration_ms > 0 ? 100 * c->transfer_ms / c->iteration_ms : 0,
		c->sync_ms, c->iteration_ms > 0 ? 100 * c->sync_ms / c->iteration_ms : 0,
		c->iteration_ms);
	fprintf(f, "placement: %.3f GiB cross-node per iteration, +%.3f ms for transfers "
		   "(naive placement: %.3f GiB, +%.3f ms)\n",
		gib((double)c->xnode_bytes), c->xfer_pred_ms, gib((double)c->naive_xnode_bytes),
		c->naive_xfer_pred_ms);
	fprintf(f, "planning took %.1f ms in all\n", s->total_ms);

	int prof = 0;
	for (int m = 0; m < p->n_metaops; m++)
		prof += p->metaops[m].profiled;
	fprintf(f, "\nMetaOps: %d (%d from the cluster profile, %d analytic)\n", p->n_metaops,
		prof, p->n_metaops - prof);
	fprintf(f, "  %-32s %6s %-40s %-8s %12s\n", "MetaOp", "layers", "shape", "model",
		"T(1) ms/lay");
	for (int m = 0; m < p->n_metaops; m++) {
		const sp_metaop_t *mo = &p->metaops[m];
		char sh[96];
		opshape_str(sh, sizeof sh, &mo->shape);
		fprintf(f, "  %-32s %6d %-40s %-8s %12.4f\n", mo->name, mo->n_layers, sh,
			mo->profiled ? "profile" : "analytic", mo->fwd_ms + mo->bwd_ms);
	}
	fprintf(f, "\nwaves (forward; the backward mirrors them in reverse on the same devices)\n");
	for (int w = 0; w < p->n_waves; w++) {
		const sp_wave_t *wv = &p->waves[w];
		fprintf(f, "  wave %3d  start %10.3f ms  %9.3f ms  (backward %10.3f, %9.3f ms)\n", w,
			wv->start_ms, wv->dur_ms, wv->bwd_start_ms, wv->bwd_dur_ms);
		for (int i = wv->first_slice; i < wv->first_slice + wv->n_slices; i++) {
			const sp_slice_t *sl = &p->slices[i];
			char devs[256], tp[24] = "";
			slice_devices(devs, sizeof devs, p, sl);
			if (sl->tp > 1)
				snprintf(tp, sizeof tp, "  tp %d%s", sl->tp, sl->sp ? " sp" : "");
			fprintf(f, "    %-32s layers %3d-%-3d x%-4d gpus %s%s\n",
				p->metaops[sl->metaop].name, sl->layer_from, sl->layer_to, sl->n_dev,
				devs, tp);
		}
	}
	fprintf(f, "\ndevices (memory GiB; time ms)\n  %6s %8s %8s %8s %8s %8s  %9s %9s %9s\n",
		"device", "params", "acts", "buffers", "work", "peak", "busy", "comm", "idle");
	int shown = SP_MIN(p->n_devices, 64);
	for (int d = 0; d < shown; d++) {
		const sp_device_t *dv = &p->devices[d];
		fprintf(f, "  %6d %8.2f %8.2f %8.2f %8.2f %8.2f  %9.3f %9.3f %9.3f\n", d,
			gib((double)dv->mem[MEM_PARAMS]), gib((double)dv->mem[MEM_ACTS]),
			gib((double)dv->mem[MEM_COMM]), gib((double)dv->mem[MEM_WORK]),
			gib((double)dv->mem_peak), dv->busy_ms, dv->comm_ms, dv->idle_ms);
	}
	if (shown < p->n_devices)
		fprintf(f, "  ... %d more devices\n", p->n_devices - shown);
	fprintf(f, "  cap %.2f GiB per device (%.0f GiB less %.1f GiB reserve)\n",
		p->memory_gib - p->mem_reserve_gib, p->memory_gib, p->mem_reserve_gib);
	layout_report(f, p, s->mb_earlier_ms);
	tp_report(f, p);
}

void report_json(FILE *f, const sp_plan_t *p, const plan_summary_t *s)
{
	const sp_cert_t *c = &p->cert;
	fprintf(f, "{\n  \"model\": ");
	sp_json_str(f, p->model.name);
	fprintf(f, ",\n  \"cluster\": ");
	sp_json_str(f, p->cluster_name);
	fprintf(f, ",\n  \"devices\": %d,\n  \"algorithms\": {", p->n_devices);
	int first = 1;
	double seq = s->algos[ALGO_SEQUENTIAL].iteration_ms;
	for (int a = 0; a < ALGO__COUNT; a++) {
		if (!s->ran[a])
			continue;
		const sp_algo_result_t *r = &s->algos[a];
		const algo_extra_t *x = &s->extra[a];
		fprintf(f, "%s\n    ", first ? "" : ",");
		sp_json_str(f, r->name);
		fprintf(f, ": {\"iteration_ms\": %.6f, \"compute_ms\": %.6f, \"transfer_ms\": %.6f, "
			   "\"sync_ms\": %.6f, \"planning_ms\": %.3f, \"utilisation\": %.6f, "
			   "\"mfu\": %.6f, \"speedup_vs_sequential\": %.6f, \"fits_memory\": %s}",
			r->iteration_ms, r->compute_ms, x->transfer_ms, x->sync_ms, r->planning_ms,
			r->utilisation, x->mfu, r->iteration_ms > 0 ? seq / r->iteration_ms : 0,
			r->fits_memory ? "true" : "false");
		first = 0;
	}
	fprintf(f, "\n  },\n  \"lower_bound_ms\": %.6f,\n  \"comm_lower_bound_ms\": %.6f,\n"
		   "  \"placement_comm_bound_ms\": %.6f,\n  \"area_bound_ms\": %.6f,\n"
		   "  \"critical_path_bound_ms\": %.6f,\n  \"paper_relaxed_bound_ms\": %.6f,\n"
		   "  \"allotment_bound_ms\": %.6f,\n"
		   "  \"gap\": %.6f,\n  \"transfer_ms\": %.6f,\n  \"sync_ms\": %.6f,\n"
		   "  \"xnode_bytes\": %lld,\n  \"naive_xnode_bytes\": %lld,\n"
		   "  \"naive_transfer_ms\": %.6f,\n  \"waves\": %d,\n  \"total_planning_ms\": %.3f,\n"
		   "  \"chosen\": ",
		lower_bound(p, s), s->bounds.comm_any_ms, s->bounds.comm_ms, c->area_bound_ms,
		c->cp_bound_ms, c->paper_bound_ms, c->allot_bound_ms, c->gap,
		c->transfer_ms, c->sync_ms, (long long)c->xnode_bytes,
		(long long)c->naive_xnode_bytes, c->naive_xfer_pred_ms, p->n_waves, s->total_ms);
	sp_json_str(f, algo_name(s->chosen));
	/* the chosen plan's tensor-parallel degree of every slice, in order */
	fprintf(f, ",\n  \"slice_tp\": [");
	for (int i = 0; i < p->n_slices; i++)
		fprintf(f, "%s%d", i ? ", " : "", p->slices[i].tp);
	fprintf(f, "]");
	layout_json(f, p, s->mb_earlier_ms);
	tp_json(f, p);
	fprintf(f, "\n}\n");
}
