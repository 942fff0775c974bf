/*
 * cost.c — the scalability estimator: per-layer forward and backward time
 * of every MetaOp on n devices, and the time of the optimizer step (net.c
 * prices transfers and all-reduces). It prices work; it does not schedule.
 *
 * Inside a slice of n devices the batch is split data-parallel, so a
 * device holds a local batch b = ceil(B/n). T_m(n) is the time of one layer
 * at that local batch:
 *
 *  profiled: piecewise-linear interpolation of the cluster profile's
 *    points (batch, fwd_ms, bwd_ms) in b; beyond the last point, the line
 *    through the last two points (proportional scaling with one point);
 *    below the first, the line through the first two, never below
 *    first * b / b_first.
 *
 *  analytic: t = max(F / (P * eff(F)), Q / BW) + c0, where
 *    F   = b * FLOPs per sample (model.h arithmetic),
 *    Q   = bytes moved: the layer's weights once (params * dtype bytes) plus
 *          b * saved elements * dtype bytes * 2 (written, then read back);
 *          an embedding reads only the rows it gathers (b * seq * hidden),
 *    P   = peak_tflops, BW = mem_bandwidth_gbs,
 *    eff(F) = E_MAX * F / (F + F_HALF), F_HALF = P * T_HALF:
 *          kernels reach E_MAX = 0.6 of peak on large work and half of that
 *          when the work is what the GPU does in T_HALF = 20 us at peak, so
 *          small per-device batches scale poorly (the paper's observation);
 *    c0  = LAUNCH_MS = 0.01 ms per layer and pass (kernel launches).
 *  Backward uses the backward FLOPs and twice the bytes.
 *
 * The contrastive loss does not scale: every device of its slice computes
 * the whole B x B similarity of its task, so its time is T(1) for all n.
 *
 * Transfers and all-reduces are priced in net.c. Optimizer step: reads and
 * writes every byte of parameter state once: 2 * state bytes / BW.
 */
#include "planner.h"

#include <math.h>

#define E_MAX 0.6
#define T_HALF_S 20e-6
#define LAUNCH_MS 0.01

static const sp_prof_entry_t *find_profile(const sp_cluster_t *c, const sp_opshape_t *s)
{
	for (int i = 0; i < c->n_prof; i++)
		if (opshape_equal(&c->prof[i].shape, s))
			return &c->prof[i];
	return NULL;
}

static double interp(const sp_prof_entry_t *e, double b, int bwd)
{
	const sp_prof_point_t *p = e->points;
	int n = e->n_points;
#define Y(i) (bwd ? p[i].bwd_ms : p[i].fwd_ms)
	if (n == 1)
		return Y(0) * b / p[0].batch;
	int i = 0;
	if (b <= p[0].batch)
		i = 0;
	else if (b >= p[n - 1].batch)
		i = n - 2;
	else
		while (i + 1 < n - 1 && p[i + 1].batch < b)
			i++;
	double x0 = p[i].batch, x1 = p[i + 1].batch, y0 = Y(i), y1 = Y(i + 1);
	double y = y0 + (y1 - y0) * (b - x0) / (x1 - x0);
	if (b < p[0].batch)
		y = fmax(y, Y(0) * b / p[0].batch);
#undef Y
	return fmax(y, 0.0);
}

static double analytic(const planner_t *pl, const metaop_t *m, int64_t b, int bwd)
{
	const sp_cluster_t *c = pl->cluster;
	int db = dtype_bytes(pl->model->dtype);
	double peak = c->peak_tflops * 1e12;
	double flops = (double)b * (double)(bwd ? op_bwd_flops(&m->shape, m->batch)
						: op_fwd_flops(&m->shape, m->batch));
	/* weights of the first op stand for the MetaOp's (all layers share a shape) */
	const sp_node_t *n = &pl->model->tasks[m->task].nodes[pl->ops[m->first_op].node];
	double wbytes = (double)comp_layer_params(&pl->model->comps[n->comp]) * db;
	if (m->shape.type == COMP_EMBEDDING)
		wbytes = (double)b * (double)m->shape.seq * (double)m->shape.hidden * db;
	double abytes = (double)b * (double)op_saved_elems(&m->shape, m->batch) * db * 2.0;
	double bytes = (wbytes + abytes) * (bwd ? 2.0 : 1.0);
	double t_c = 0;
	if (flops > 0) {
		double eff = E_MAX * flops / (flops + peak * T_HALF_S);
		t_c = flops / (peak * eff);
	}
	double t_m = bytes / (c->mem_bandwidth_gbs * 1e9);
	return fmax(t_c, t_m) * 1e3 + LAUNCH_MS;
}

#define LAYER_MIN_MS 1e-6

void cost_layer(const planner_t *pl, int mi, int64_t local, double *fwd, double *bwd)
{
	const metaop_t *m = &pl->mops[mi];
	if (!m->scales)
		local = m->batch;
	if (local < 1) {
		*fwd = *bwd = 0;
		return;
	}
	const sp_prof_entry_t *e = find_profile(pl->cluster, &m->shape);
	if (e) {
		*fwd = interp(e, (double)local, 0);
		*bwd = interp(e, (double)local, 1);
	} else {
		*fwd = analytic(pl, m, local, 0);
		*bwd = analytic(pl, m, local, 1);
	}
	/* no layer with samples takes less than a nanosecond: a profile may say
	 * 0 (or 1e-300), and the schedulers divide by these times and hand
	 * them to the MILP as coefficients */
	*fwd = fmax(*fwd, LAYER_MIN_MS);
	*bwd = fmax(*bwd, LAYER_MIN_MS);
}

int cost_build(planner_t *pl)
{
	const sp_model_t *md = pl->model;
	int64_t psb = param_state_bytes(md->dtype, md->opt.kind);
	int db = dtype_bytes(md->dtype);
	for (int k = 0; k < pl->n_mops; k++) {
		metaop_t *m = &pl->mops[k];
		m->scales = m->shape.type != COMP_CONTRASTIVE;
		m->profiled = find_profile(pl->cluster, &m->shape) != NULL;
		m->nmax = (int)SP_MIN((int64_t)pl->N, m->batch);
		m->tf = sp_arena_calloc(&pl->arena, (size_t)m->nmax + 1, sizeof(double));
		m->tb = sp_arena_calloc(&pl->arena, (size_t)m->nmax + 1, sizeof(double));
		if (!m->tf || !m->tb)
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		for (int n = 1; n <= m->nmax; n++) {
			int64_t b = (m->batch + n - 1) / n;
			cost_layer(pl, k, b, &m->tf[n], &m->tb[n]);
		}
		/* keep T non-increasing in n: more devices never make a layer slower
		 * in the model (ceil(B/n) can repeat) */
		for (int n = 2; n <= m->nmax; n++) {
			m->tf[n] = fmin(m->tf[n], m->tf[n - 1]);
			m->tb[n] = fmin(m->tb[n], m->tb[n - 1]);
		}
		const sp_node_t *n0 = &md->tasks[m->task].nodes[pl->ops[m->first_op].node];
		m->layer_state_bytes = comp_layer_params(&md->comps[n0->comp]) * psb;
		m->saved_per_sample = op_saved_elems(&m->shape, m->batch) * db;
	}
	return 0;
}

double cost_step_ms(const planner_t *pl, int64_t elems)
{
	double bytes = 2.0 * (double)elems *
		       (double)param_state_bytes(pl->model->dtype, pl->model->opt.kind);
	return bytes / (pl->cluster->mem_bandwidth_gbs * 1e6);
}
