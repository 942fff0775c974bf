/*
 * memplan.c — predicted memory of every device (the formula lives in
 * schemas/plan_mem.c, shared with the verifier and the runtime: it counts
 * a decoder's memory act(c, -1) and its gradient for the span of the
 * device's samples of c (lowest to highest), its cross-attention activations and backward
 * workspace) and, when a device is over its cap, an explanation: which
 * device, by how much, and which parameters, activations or decoder
 * memories make it so.
 */
#include "planner.h"

#include <stdlib.h>
#include <string.h>

static double gib(double b)
{
	return b / (1024.0 * 1024.0 * 1024.0);
}

/* "12.3 GiB", below 1 GiB "45.6 MiB", below 1 MiB "7.5 KiB". */
static const char *size_str(char *buf, size_t cap, double bytes)
{
	if (bytes >= 1024.0 * 1024.0 * 1024.0)
		snprintf(buf, cap, "%.1f GiB", gib(bytes));
	else if (bytes >= 1024.0 * 1024.0)
		snprintf(buf, cap, "%.1f MiB", bytes / (1024.0 * 1024.0));
	else
		snprintf(buf, cap, "%.1f KiB", bytes / 1024.0);
	return buf;
}

/*
 * The part of device d's buffers that holds decoder memories: for each
 * decoder c, act(c, -1) and grad(c, -1) over the hull of the samples its
 * instructions touch them for (FWD and BWD of c's slices, the memory's
 * transfers), as plan_memory counts them.
 */
static int64_t decoder_memory_bytes(const sp_plan_t *p, int d)
{
	const sp_device_t *dv = &p->devices[d];
	int64_t sum = 0, db = dtype_bytes(p->model.dtype);
	for (int c = 0; c < p->n_metaops; c++) {
		const sp_metaop_t *m = &p->metaops[c];
		if (m->shape.mem_seq == 0)
			continue;
		int32_t lo = INT32_MAX, hi = -1;
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p->ins[dv->first_ins + k];
			int hit = 0;
			if (in->op == INS_FWD || in->op == INS_BWD)
				hit = p->slices[in->slice].metaop == c;
			else if (in->op == INS_SEND || in->op == INS_COPY)
				hit = in->src.metaop == c && in->src.layer < 0;
			if ((in->op == INS_RECV || in->op == INS_COPY) && in->dst.metaop == c &&
			    in->dst.layer < 0)
				hit = 1;
			if (hit) {
				lo = SP_MIN(lo, in->s0);
				hi = SP_MAX(hi, in->s1);
			}
		}
		if (hi > lo)
			sum += 2 * (int64_t)(hi - lo) * m->shape.mem_seq * m->shape.mem_width * db;
	}
	return sum;
}

/* "'llm' layers 0-31 need 112.0 GiB per replica with AdamW; zero-1 on 2 of
 * the device's 9 buckets" for the component holding most state. */
static void explain_params(const sp_plan_t *p, int d, char *buf, size_t cap)
{
	const sp_device_t *dv = &p->devices[d];
	const sp_model_t *md = &p->model;
	int64_t psb = param_state_bytes(md->dtype, md->opt.kind);
	int best = -1;
	double best_b = 0;
	for (int c = 0; c < md->n_comps; c++) {
		double b = 0;
		for (int k = 0; k < dv->n_held; k++)
			if (p->held[dv->held_off + k].comp == c)
				b += (double)comp_layer_params_tp(&md->comps[c],
								  p->held[dv->held_off + k].tp) *
				     psb;
		if (b > best_b) {
			best_b = b;
			best = c;
		}
	}
	if (best < 0) {
		snprintf(buf, cap, "no parameters");
		return;
	}
	int lo = 1 << 30, hi = -1;
	for (int k = 0; k < dv->n_held; k++)
		if (p->held[dv->held_off + k].comp == best) {
			lo = SP_MIN(lo, p->held[dv->held_off + k].layer);
			hi = SP_MAX(hi, p->held[dv->held_off + k].layer);
		}
	char sz[24];
	int zero1 = 0, zero3 = 0, member = 0;
	int64_t off, n;
	for (int b = 0; b < p->n_buckets; b++)
		if (bucket_shard(p, b, d, &off, &n) >= 0) {
			member++;
			zero1 += layout_sharded(p->buckets[b].layout);
			zero3 += p->buckets[b].layout == LAYOUT_ZERO3;
		}
	snprintf(buf, cap, "'%s' layers %d-%d need %s per replica with %s; %s on %d of the "
		 "device's %d buckets", md->comps[best].name, lo, hi,
		 size_str(sz, sizeof sz, best_b), md->opt.kind == OPT_ADAMW ? "AdamW" : "SGD",
		 zero3 == zero1 && zero3 ? "zero-3" : zero3 ? "zero-1/2/3" : "zero-1/2", zero1,
		 member);
}

int memplan_run(planner_t *pl, sp_plan_t *p, int check)
{
	int worst = -1;
	double worst_over = 0;
	int32_t *safe = NULL; /* zero-2's points: once for every device */
	if (plan_z2_safe(p, &safe))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int d = 0; d < p->n_devices; d++) {
		sp_device_t *dv = &p->devices[d];
		if (plan_memory_at(p, d, safe, dv->mem)) { /* its only failure */
			free(safe);
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		}
		dv->mem_peak = 0;
		for (int c = 0; c < MEM__COUNT; c++)
			dv->mem_peak += dv->mem[c];
		double over = (double)dv->mem_peak - pl->mem_cap;
		if (over > worst_over) {
			worst_over = over;
			worst = d;
		}
	}
	free(safe);
	if (!check || worst < 0)
		return 0;
	const sp_device_t *dv = &p->devices[worst];
	char why[256];
	explain_params(p, worst, why, sizeof why);
	char a[8][24], mem[48] = "";
	int64_t dm = decoder_memory_bytes(p, worst);
	if (dm > 0)
		snprintf(mem, sizeof mem, " (decoder memories %s)",
			 size_str(a[7], 24, (double)dm));
	int rc = sp_err_set(pl->err, SP_EINFEAS, NULL, 0, 0, NULL,
			    "no plan fits memory: device %d needs %s, %s more than the %s "
			    "usable (%g GiB less %g GiB reserve): parameter state %s (%s), "
			    "activations %s, buffers %s%s, workspace %s",
			    worst, size_str(a[0], 24, (double)dv->mem_peak),
			    size_str(a[1], 24, worst_over), size_str(a[2], 24, pl->mem_cap),
			    pl->cluster->memory_gib, pl->opts->mem_reserve_gib,
			    size_str(a[3], 24, (double)dv->mem[MEM_PARAMS]), why,
			    size_str(a[4], 24, (double)dv->mem[MEM_ACTS]),
			    size_str(a[5], 24, (double)dv->mem[MEM_COMM]), mem,
			    size_str(a[6], 24, (double)dv->mem[MEM_WORK]));
	sp_err_hint(pl->err, "use more or larger devices, smaller batches, or lower "
			     "--mem-reserve");
	return rc;
}
