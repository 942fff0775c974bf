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
 *  analytic: t = max(t_c, Q / BW) + t_launch, where
 *    F   = b * FLOPs per sample (model.h arithmetic),
 *    Q   = bytes moved: the layer's weights once (params * dtype bytes) plus
 *          b * saved elements * dtype bytes * 2 (written, then read back);
 *          an embedding reads only the rows it gathers (b * seq * hidden),
 *    P   = peak_tflops, BW = mem_bandwidth_gbs (the memory roof).
 *    Without gpu.sm_count (0: not modelled, the files before it):
 *      t_c = F / (P * eff(F)), eff(F) = E_MAX * F / (F + F_HALF),
 *          F_HALF = P * T_HALF: kernels reach E_MAX = 0.6 of peak on large
 *          work and half of that when the work is what the GPU does in
 *          T_HALF = 20 us at peak;
 *      t_launch = LAUNCH_MS = 0.01 ms per layer and pass.
 *    With S = gpu.sm_count SMs: the layer's matrix products as our CUDA
 *      backend issues them (layer_gemms), each an M x N x K product in
 *      `batch` independent copies, issued `calls` times. A GEMM kernel
 *      covers its output with thread-block tiles TM x TN and runs them in
 *      waves of S (NVIDIA, "Matrix Multiplication Background User's Guide",
 *      DU-09799-001, 2023, ch. 3 "Dimension Quantization Effects"):
 *        tiles = ceil(M/TM) ceil(N/TN) batch,  waves = ceil(tiles / S),
 *        t_gemm = calls * waves * 2 TM TN K / (E_MAX P / S),
 *      an SM running one tile at E_MAX of its share of the peak. The tile
 *      is the one of the guide's cuBLAS tile sizes (section 2.3: 256x128,
 *      128x256, 128x128, 128x64, 64x128, 64x64) that gives the least
 *      t_gemm, as if cuBLAS's heuristic chose perfectly and small tiles ran
 *      as fast per SM as large ones (the guide shows they do not: this
 *      errs on the fast side). t_c = sum of t_gemm; F is only a check
 *      (the products' 2 M N K batch calls add up to it);
 *      t_launch = launch_us * kernels(layer, b): the kernels, stream
 *      copies and memsets the backend issues for the layer (LAUNCHES;
 *      a sequence-parallel layer SP_LAUNCHES).
 *    A layer's kernels run one after another on one stream, so launches
 *    add to the roofline time (the authors' fitted Time = A FLOPs + D has
 *    the same form).
 *  Backward uses the backward FLOPs and twice the bytes.
 *
 * A decoder layer (cross-attention, shape mem_seq m > 0, memory width w)
 * adds its cross block everywhere above: FLOPs and saved elements are
 * arith.c's (with the cross terms), its parameters count in the weights'
 * bytes, its products are the query and output projections (b s x h x h),
 * the memory's key and value projection (b m x 2h x w; backward also the
 * gradient into the memory) and per (sample, head) S = Q K^T (s x m x d),
 * P V (s x d x m), and it adds XATTN_LAUNCHES kernels. A profiled decoder
 * shape matches on mem_seq and mem_width too (opshape_equal). Decoders
 * are never split (shape_tp_ok).
 *
 * The contrastive loss does not scale: every device of its slice computes
 * the whole B x B similarity of its task, so its time is T(1) for all n.
 *
 * Tensor parallelism (tp-format.txt): a width is n = d t, d <= B groups of
 * t GPUs of one node (t divides gpus_per_node; t > 1 only where tp_ok). A
 * t-way member computes its shard at the group's local batch ceil(B/d):
 * the analytic model on the shard's products, bytes and kernels (with
 * sm_count; without it FLOPs / t), a profiled shape's profile scaled by
 * the analytic ratio shard / whole (cost_layer_tp), plus its all-reduces
 * over NVLink (tp_allreduces: a transformer's two per pass of the group's
 * activations; the vocabulary-parallel embedding's and LM head's one
 * each). T(n) is the fastest
 * (d, t) at n (tpn[n]); widths reach min(N, B tmax). --tp F keeps t = F
 * where F divides n and t = 1 elsewhere.
 *
 * Transfers and all-reduces are priced in net.c. Optimizer step: one
 * fused kernel per bucket, bound by memory: step bytes / BW per parameter,
 * the bytes being what an update of one parameter reads and writes in the
 * plan's dtype (cost_step_bytes): it reads the gradient (dtype bytes), the
 * fp32 master weight and the fp32 moments (AdamW: 8 B), and writes the
 * master, the moments and, when the dtype is not fp32, the low-precision
 * copy the layers read (dtype bytes). It reads no low-precision weight
 * (the master is the value it updates) and writes no gradient (zeroing
 * them is not the step's work). bf16 AdamW: 2 + 4 + 8 read, 4 + 8 + 2
 * written, 28 B; fp32 AdamW 4 + 4 + 8 + 4 + 8 = 28; SGD 12. That is the
 * runtime's step (runtime/cuda/cu_kernels.cu adamw_kernel, sgd_kernel;
 * layers.c adamw_step): it reads p, g, m, v and writes p, m, v and the bf16
 * shadow of p, except that its gradients are fp32 (AdamW 30 B, SGD 14 B a
 * parameter), as are its all-reduces, which net.c prices at the dtype
 * too. Before, every byte of parameter state was read and written
 * (2 * param_state_bytes, 32 B for bf16 AdamW).
 */
#include "planner.h"

#include <math.h>
#include <string.h>

/*
 * The all-reduces of a t-way shard per layer and pass (tp-format.txt): a
 * transformer's two of its group's activations each pass; a
 * vocabulary-parallel embedding's one of its output forward, none
 * backward (the CUDA backend's; the CPU backend's also all-gathers the
 * position gradient backward, layers_vocab.c); an LM head's one of its per-position statistics (2t + 1 fp32
 * per token, runtime/layers_vocab.c) forward and one of the LayerNorm
 * output's gradient backward. *elems: the elements of each, per token
 * (activations in the model's dtype, statistics in fp32: *fp32 set).
 */
static int tp_allreduces(const sp_opshape_t *s, int t, int bwd, int64_t *elems, int *fp32)
{
	*elems = s->hidden;
	*fp32 = 0;
	if (t <= 1)
		return 0;
	switch (s->type) {
	case COMP_TRANSFORMER: return 2;
	case COMP_EMBEDDING: return !bwd;
	case COMP_LM_HEAD:
		if (!bwd) {
			*elems = 2 * (int64_t)t + 1;
			*fp32 = 1;
		}
		return 1;
	default: return 0;
	}
}
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

/*
 * Kernels one layer issues in our CUDA backend, per pass: fixed launches
 * plus per_head for every loop over heads (gemm_grid issues one batched
 * GEMM per min(b, heads) and loops over the other). Counted in
 * runtime/cuda/ (the .cu files) as launched: each <<<>>> one, each cu_gemm /
 * cu_gemm_batched call one, each cudaMemcpyAsync / cudaMemsetAsync one;
 * k_colsum and k_colsum_bf16 two, k_ln_bwd four (with parameter grads),
 * k_infonce_grads four. Functions counted (straight-line, one workspace
 * chunk; tests/planner/launch_counts.py recounts them from the sources
 * and fails when this table drifts):
 *   embedding   cu_embedding_fwd / cu_embedding_bwd
 *   patch       cu_patch_fwd / cu_patch_bwd
 *   transformer cu_tblock_fwd / cu_tblock_bwd
 *   decoder     cu_xblock_fwd / cu_xblock_bwd less the transformer's
 *               (XATTN_LAUNCHES below)
 *   linear      cu_linear_fwd / cu_linear_bwd (with dx)
 *   losses      cu_lm_head_loss, cu_classifier_loss, cu_contrastive_loss:
 *               forward and backward in one call (runtime/interp.c
 *               exec_loss), so all their launches count as forward.
 * Not counted: the bf16 weight shadow (cu_shadow converts once per step
 * after the optimizer touched the weights, not per layer and pass).
 * Besides, runtime/exec.c adds per layer (interp_extra): a host-to-device
 * copy of the tokens, features, targets or labels (embedding, patch
 * forward; lm_head, classifier), and a memset of dx before every
 * transformer backward but the first of a slice (exec_bwd; counted for
 * every layer).
 */
typedef struct {
	int fwd, fwd_per_head, bwd, bwd_per_head;
} launches_t;

static const launches_t LAUNCHES[COMP__COUNT] = {
	[COMP_EMBEDDING] = {1, 0, 3, 0},
	[COMP_PATCH] = {3, 0, 6, 0},
	[COMP_TRANSFORMER] = {13, 2, 29, 4},
	[COMP_LINEAR] = {3, 0, 5, 0},
	[COMP_LM_HEAD] = {12, 0, 0, 0},
	[COMP_CLASSIFIER] = {14, 0, 0, 0},
	[COMP_CONTRASTIVE] = {14, 0, 0, 0},
};

/*
 * A decoder's cross block per layer and pass, beyond the transformer's
 * row above: runtime/cuda/cu_xattn.cu's cu_xblock_fwd / cu_xblock_bwd
 * counted by the same rule, less cu_tblock_fwd / cu_tblock_bwd
 * (tests/planner/launch_counts.py recounts this row too). Forward
 * (xb_cross_fwd; a recomputing backward re-runs it, as it re-runs
 * cu_tblock_fwd): LN_c, the query bias fill and product, the memory's
 * bf16 copy, the key/value bias fill and product, the softmax, the
 * residual-and-bias add, the output product (9), and per head loop S =
 * Q K^T and P V (2). Backward (xb_cross_bwd): the output linear backward
 * from fp32 (bf16 copy, dW, two column-sum kernels, dX: 5), the
 * probabilities' bf16 copy and the softmax backward (2), the query and
 * key/value linear backwards from bf16 (dW, two column-sum kernels, dX
 * or the memory's gradient: 4 each), the memory's bf16 copy again (1),
 * LN_c with its parameter gradients (4): 20; per head loop dP, dV, dQ,
 * dK (4).
 */
static const launches_t XATTN_LAUNCHES = {9, 2, 20, 4};

/*
 * A sequence-parallel transformer layer (sp, where sp_ok) in place of the
 * transformer's row: cu_tblock_fwd / cu_tblock_bwd hand the whole call to
 * runtime/cuda/cu_sp.cu's cu_tblock_sp_fwd / cu_tblock_sp_bwd (not
 * chunked), counted by the same rule along the path of a layer inside its
 * slice (whole_in and whole_out 0; interp.c exec_bwd always sets
 * ln_grads). Forward: copy of x, LN1 and its bf16 copy, QKV bias fill and
 * product, attention (k_softmax_fwd, per head loop S and P V: 1 + 2), the
 * output product, bias and residual adds (2), LN2 and its bf16 copy, MLP
 * bias fill, product, GELU, product, adds (2): 17, 2 per head loop.
 * Backward: the LayerNorm-gradient zero, dy's copy into the gather
 * buffer, the MLP down and up linear backwards (5 + 4), GELU, LN2
 * backward (4), dx_mid's copy, the output linear backward (5), attention
 * backward (2, 4 per head loop), the QKV linear backward (4), LN1
 * backward (4), the add of its LayerNorm gradients into ln_grads: 33, 4
 * per head loop. Their collectives (one kernel each, as tp_allreduces'):
 * SP_COLLECTIVES per pass, the all-gathers of ln1 and ln2 and the
 * reduce-scatters of the two row-parallel products forward, the
 * all-gathers of dy and d x_mid and the reduce-scatters of d ln2 and d ln1
 * backward (layer_tp_priced prices each all-reduce of the plain split as
 * one reduce-scatter and one all-gather: the same four). Besides the
 * dx memset (interp_extra), exec_bwd's sp_ln_add adds each layer's four
 * summed LayerNorm gradients into its own (copy_rows accumulating:
 * k_add_2d each): SP_BWD_EXTRA. tests/planner/launch_counts.py
 * recounts all three along that path. Per slice, not priced: its first
 * layer computes LN1 of every token (2 more kernels, no ln1 gather) and
 * in backward gathers dx with the summed LayerNorm gradients (6 more
 * kernels, one all-gather), its last gathers y (one all-gather) and skips
 * dy's copy and gather; exec_bwd zeroes ln_grads once; and interp.c's
 * hooks wait for the stream (b->sync) before each collective.
 */
static const launches_t SP_LAUNCHES = {17, 2, 33, 4};
#define SP_COLLECTIVES 4
#define SP_BWD_EXTRA 4

/* runtime/interp.c's launches beside the layer function (see above) */
static int interp_extra(sp_comp_type_t t, int bwd)
{
	switch (t) {
	case COMP_EMBEDDING:
	case COMP_PATCH:
	case COMP_LM_HEAD:
	case COMP_CLASSIFIER: return !bwd; /* host-to-device copy of the inputs */
	case COMP_TRANSFORMER: return bwd; /* exec_bwd's memset of dx */
	default: return 0;
	}
}

/* A t-way shard loops over heads / t heads; its all-reduces per pass
 * (tp_allreduces) are one kernel each (NCCL runs a collective as one kernel: "NCCL
 * implements each collective in a single kernel", NCCL User Guide,
 * "Overview of NCCL"). Sequence parallel (sp: the caller checked sp_ok):
 * SP_LAUNCHES and SP_COLLECTIVES instead, and SP_BWD_EXTRA. */
static int64_t layer_kernels(const sp_opshape_t *s, int64_t b, int t, int sp, int bwd)
{
	const launches_t *l = &LAUNCHES[s->type], *x = &XATTN_LAUNCHES;
	if (sp) {
		int64_t heads = SP_MIN(b, SP_MAX(s->heads, 1) / t);
		return interp_extra(s->type, bwd) + SP_COLLECTIVES +
		       (bwd ? SP_BWD_EXTRA + SP_LAUNCHES.bwd + heads * SP_LAUNCHES.bwd_per_head
			    : SP_LAUNCHES.fwd + heads * SP_LAUNCHES.fwd_per_head);
	}
	int64_t heads = SP_MIN(b, SP_MAX(s->heads, 1) / t);
	int64_t cross = s->type == COMP_TRANSFORMER && s->mem_seq > 0
				? (bwd ? x->bwd + heads * x->bwd_per_head
				       : x->fwd + heads * x->fwd_per_head)
				: 0;
	int64_t el;
	int f32;
	/* a split LM head (cu_lm_head_loss_tp) also zeroes and fills its
	 * statistics: two launches beside the unsplit loss's, in its one call */
	int vocab = t > 1 && s->type == COMP_LM_HEAD && !bwd ? 2 : 0;
	return interp_extra(s->type, bwd) + tp_allreduces(s, t, bwd, &el, &f32) + cross + vocab +
	       (bwd ? l->bwd + heads * l->bwd_per_head : l->fwd + heads * l->fwd_per_head);
}

int64_t cost_layer_kernels(const sp_opshape_t *s, int64_t b, int bwd)
{
	return layer_kernels(s, b, 1, 0, bwd);
}

int64_t cost_layer_kernels_sp(const sp_opshape_t *s, int64_t b, int t, int sp, int bwd)
{
	return layer_kernels(s, b, t, sp && sp_ok(s, t), bwd);
}

static int layer_gemms(const sp_opshape_t *s, int64_t b, int t, int bwd,
		       cost_gemm_t out[COST_MAX_GEMMS]);

/*
 * The matrix products of one layer at local batch b as the backend issues
 * them (runtime/cuda/cu_layers.cu, cu_loss.cu): out[i] = {M, N, K, batch,
 * calls}; returns how many. Backward of a product M x N x K (weights K x N)
 * is dW: K x N x M and dX: M x K x N; a source layer has no dX. The
 * contrastive loss computes the whole B x B similarity (T(1), it does not
 * scale) and two gradient products of B x w x B.
 */
int cost_layer_gemms(const sp_opshape_t *s, int64_t b, int bwd, cost_gemm_t out[COST_MAX_GEMMS])
{
	return layer_gemms(s, b, 1, bwd, out);
}

int cost_layer_gemms_tp(const sp_opshape_t *s, int64_t b, int t, int bwd,
			cost_gemm_t out[COST_MAX_GEMMS])
{
	return layer_gemms(s, b, t, bwd, out);
}

/* The products of one t-way shard (t = 1: the whole layer). Megatron
 * splits (tp-format.txt): QKV and MLP up by output columns (N / t), the
 * output projection and MLP down by input rows (K / t), attention by heads
 * (heads / t per member); the LM head's vocabulary projection by its
 * columns (vocab_shard: the first V % t members have one more than V / t,
 * and the group waits for them); only these split (tp_ok). */
static int layer_gemms(const sp_opshape_t *s, int64_t b, int t, int bwd,
		       cost_gemm_t out[COST_MAX_GEMMS])
{
	double T = (double)b * (double)s->seq, h = (double)s->hidden, f = (double)s->ffn;
	int k = 0;
#define G(m_, n_, k_, batch_, calls_) out[k++] = (cost_gemm_t){(m_), (n_), (k_), (batch_), (calls_)}
	/* forward product M x N x K: fwd that, bwd dW and (unless a source) dX */
#define PROD(m_, n_, k_, dx_)                                \
	do {                                                 \
		if (!bwd) {                                  \
			G(m_, n_, k_, 1, 1);                 \
		} else {                                     \
			G(k_, n_, m_, 1, 1);                 \
			if (dx_)                             \
				G(m_, k_, n_, 1, 1);         \
		}                                            \
	} while (0)
	switch (s->type) {
	case COMP_PATCH: PROD(T, h, (double)s->in, 0); break;
	case COMP_LINEAR: PROD(T, (double)s->out, (double)s->in, 1); break;
	case COMP_LM_HEAD: /* the largest member's columns: the slowest */
		PROD(T, t > 1 ? (double)vocab_shard_max(s->vocab, t) : (double)s->vocab, h, 1);
		break;
	case COMP_CLASSIFIER: PROD((double)b, (double)s->classes, h, 1); break;
	case COMP_CONTRASTIVE:
		if (!bwd)
			G((double)b, (double)b, h, 1, 1);
		else
			G((double)b, h, (double)b, 1, 2);
		break;
	case COMP_TRANSFORMER: {
		double a = (double)SP_MAX(s->heads, 1), sq = (double)s->seq, dh = h / a;
		double ts = t, al = a / ts;
		double calls = fmin((double)b, al), batch = fmax((double)b, al);
		PROD(T, 3 * h / ts, h, 1); /* QKV */
		PROD(T, h, h / ts, 1);     /* output projection */
		PROD(T, f / ts, h, 1);     /* MLP up */
		PROD(T, h, f / ts, 1);     /* MLP down */
		/* per (sample, head): S = Q K^T and P V forward; dP, dV, dQ, dK backward */
		G(sq, sq, dh, batch, calls);
		G(sq, dh, sq, batch, calls);
		if (bwd) {
			G(sq, dh, sq, batch, calls);
			G(sq, dh, sq, batch, calls);
		}
		if (s->mem_seq > 0) { /* the cross block (never split: t = 1) */
			double mk = (double)s->mem_seq, w = (double)s->mem_width;
			PROD(T, h, h, 1);                  /* query */
			PROD((double)b * mk, 2 * h, w, 1); /* key, value of the memory */
			PROD(T, h, h, 1);                  /* output projection */
			/* S = Q K^T, P V; backward dP = dO V^T, dQ = dS K (their
			 * sizes) and dV = P^T dO, dK = dS^T Q */
			G(sq, mk, dh, batch, calls);
			G(sq, dh, mk, batch, calls);
			if (bwd) {
				G(mk, dh, sq, batch, calls);
				G(mk, dh, sq, batch, calls);
			}
		}
		break;
	}
	default: break;
	}
#undef PROD
#undef G
	return k;
}

double cost_gemm_ms(const cost_gemm_t *g, int sm_count, double peak_flops)
{
	double sms = sm_count, peak = peak_flops;
	static const double tiles[][2] = {{256, 128}, {128, 256}, {128, 128},
					  {128, 64},  {64, 128},  {64, 64}};
	double best = HUGE_VAL, per_sm = E_MAX * peak / sms;
	for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
		double tm = tiles[i][0], tn = tiles[i][1];
		double n_tiles = ceil(g->m / tm) * ceil(g->n / tn) * g->batch;
		double waves = ceil(n_tiles / sms);
		best = fmin(best, g->calls * waves * 2.0 * tm * tn * g->k / per_sm);
	}
	return best * 1e3;
}

static double analytic_sp(const planner_t *pl, const metaop_t *m, int64_t b, int t, int sp,
			  int bwd)
{
	const sp_cluster_t *c = pl->cluster;
	int db = dtype_bytes(pl->model->dtype);
	double peak = c->peak_tflops * 1e12;
	double flops = (double)b * (double)(bwd ? op_bwd_flops(&m->shape, m->batch)
						: op_fwd_flops(&m->shape, m->batch)) / t;
	/* weights of the first op stand for the MetaOp's (all layers share a shape) */
	const sp_node_t *n = &pl->model->tasks[m->task].nodes[pl->ops[m->first_op].node];
	double wbytes = (double)comp_layer_params_tp(&pl->model->comps[n->comp], t) * db;
	if (m->shape.type == COMP_EMBEDDING)
		wbytes = (double)b * (double)m->shape.seq * (double)m->shape.hidden * db;
	/* whole layers: with a decoder's cross block */
	double saved = (double)op_saved_elems_sp(&m->shape, m->batch, t, sp);
	double abytes = (double)b * saved * db * 2.0;
	double bytes = (wbytes + abytes) * (bwd ? 2.0 : 1.0);
	double t_m = bytes / (c->mem_bandwidth_gbs * 1e9) * 1e3;
	if (c->sm_count > 0) {
		cost_gemm_t g[COST_MAX_GEMMS];
		int ng = layer_gemms(&m->shape, b, t, bwd, g);
		double t_c = 0;
		for (int i = 0; i < ng; i++)
			t_c += cost_gemm_ms(&g[i], c->sm_count, peak);
		return fmax(t_c, t_m) +
		       c->launch_us * 1e-3 * (double)layer_kernels(&m->shape, b, t, sp, bwd);
	}
	double t_c = 0;
	if (flops > 0) {
		double eff = E_MAX * flops / (flops + peak * T_HALF_S);
		t_c = flops / (peak * eff);
	}
	return fmax(t_c * 1e3, t_m) + LAUNCH_MS;
}

static double analytic(const planner_t *pl, const metaop_t *m, int64_t b, int t, int bwd)
{
	return analytic_sp(pl, m, b, t, 0, bwd);
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
		*fwd = analytic(pl, m, local, 1, 0);
		*bwd = analytic(pl, m, local, 1, 1);
	}
	/* no layer with samples takes less than a nanosecond: a profile may say
	 * 0 (or 1e-300), and the schedulers divide by these times and hand
	 * them to the MILP as coefficients */
	*fwd = fmax(*fwd, LAYER_MIN_MS);
	*bwd = fmax(*bwd, LAYER_MIN_MS);
}

/*
 * A t-way shard (t > 1) of a split layer at `local` samples per
 * group: the shard's own products and bytes (analytic above), plus its
 * all-reduces per pass (tp_allreduces: a transformer's two of local * seq
 * * hidden activations) over t GPUs of one node (cost_allreduce_ms:
 * measured points, else the NVLink ring), alone on the network. A profiled shape's profile is of
 * whole layers: we scale it by the analytic ratio shard / whole at the
 * same local batch, so the shard keeps the profile's calibration and
 * takes from the model only what splitting changes (the products'
 * quantisation, the kernels that loop over heads, bytes).
 */
/*
 * Sequence parallel (sp, where sp_ok): the shard's products as above, its
 * bytes with the sequence-sharded saved activations (op_saved_elems_sp),
 * and in place of each pass's two all-reduces two reduce-scatters and two
 * all-gathers of the same activations (net.c's prices; on a ring they move
 * what the all-reduces move). The LayerNorm gradients (4 h fp32 per layer,
 * summed over the group) ride on the all-gather of the input gradient
 * that the slice's first layer does anyway: t 4 h L floats more on it,
 * kilobytes, not priced. A slice's first layer computes LN1 of all its
 * tokens instead of gathering it and its last gathers its output: the
 * count per layer is the same. Its kernels are the sequence-parallel
 * block's (SP_LAUNCHES, layer_kernels), not the plain split's.
 */
static void layer_tp_priced(const planner_t *pl, int mi, int64_t local, int t, int sp,
			    double *fwd, double *bwd)
{
	const metaop_t *m = &pl->mops[mi];
	if (t <= 1 || local < 1 || !m->scales ||
	    !shape_tp_ok(&m->shape, t)) {
		cost_layer(pl, mi, local, fwd, bwd);
		return;
	}
	sp = sp && sp_ok(&m->shape, t);
	double f = analytic_sp(pl, m, local, t, sp, 0), b = analytic_sp(pl, m, local, t, sp, 1);
	if (find_profile(pl->cluster, &m->shape)) {
		double f1, b1;
		cost_layer(pl, mi, local, &f1, &b1);
		f *= f1 / analytic(pl, m, local, 1, 0);
		b *= b1 / analytic(pl, m, local, 1, 1);
	}
	int32_t devs[SP_TP_MAX];
	for (int i = 0; i < t; i++)
		devs[i] = i;
	double ar[2];
	for (int pass = 0; pass < 2; pass++) {
		int64_t el;
		int f32, k = tp_allreduces(&m->shape, t, pass, &el, &f32);
		int64_t bytes = local * m->shape.seq * el * (f32 ? 4 : dtype_bytes(pl->model->dtype));
		ar[pass] = k ? k * cost_allreduce_ms(pl->cluster, devs, t, bytes) : 0;
		if (sp)
			ar[pass] = k * (cost_reduce_scatter_ms(pl->cluster, devs, t, bytes) +
					cost_all_gather_ms(pl->cluster, devs, t, bytes));
	}
	*fwd = fmax(f + ar[0], LAYER_MIN_MS);
	*bwd = fmax(b + ar[1], LAYER_MIN_MS);
}

/*
 * The memo of layer_tp_priced (pl->memo, made by cost_build): the
 * simulator asks for the same (MetaOp, local batch, degree) on every
 * device of a slice and in each of its passes, and the analytic price
 * (every GEMM's tile quantisation) is the planner's costliest arithmetic.
 * A direct-mapped table that compares the whole key: a hit returns the
 * doubles an earlier call computed from the same arguments (the price
 * reads only the MetaOp's shape, scales and batch, the model and the
 * cluster, none of which change after cost_build), so every caller gets
 * bit for bit what it would compute itself; a collision only evicts.
 */
#define MEMO_SLOTS 8192 /* a power of two */
struct cost_memo {
	int32_t m, t; /* m < 0: empty */
	int64_t local;
	double f, b;
};

void cost_layer_tp(const planner_t *pl, int mi, int64_t local, int t, double *fwd, double *bwd)
{
	cost_layer_sp(pl, mi, local, t, 0, fwd, bwd);
}

void cost_layer_sp(const planner_t *pl, int mi, int64_t local, int t, int sp, double *fwd,
		   double *bwd)
{
	if (!pl->memo) {
		layer_tp_priced(pl, mi, local, t, sp, fwd, bwd);
		return;
	}
	/* the key's degree carries sp above its bits: t | sp << 16 */
	int32_t key = t | (sp ? 1 << 16 : 0);
	uint64_t h = ((uint64_t)(uint32_t)mi * 0x9E3779B97F4A7C15ull) ^
		     ((uint64_t)local * 0xC2B2AE3D27D4EB4Full) ^ ((uint64_t)(uint32_t)key << 17);
	struct cost_memo *e = &pl->memo[(h ^ (h >> 29)) & (MEMO_SLOTS - 1)];
	if (e->m != mi || e->t != key || e->local != local) {
		layer_tp_priced(pl, mi, local, t, sp, &e->f, &e->b);
		e->m = mi;
		e->t = key;
		e->local = local;
	}
	*fwd = e->f;
	*bwd = e->b;
}

int cost_memo_copy(planner_t *dst, const planner_t *src)
{
	dst->memo = NULL;
	if (!src->memo)
		return 0;
	dst->memo = sp_arena_calloc(&dst->arena, MEMO_SLOTS, sizeof *dst->memo);
	if (!dst->memo)
		return SP_ENOMEM;
	memcpy(dst->memo, src->memo, sizeof *dst->memo * MEMO_SLOTS);
	return 0;
}

/*
 * The degrees m may take: t = 1, and with a shape that shape_tp_ok allows
 * (a transformer, a vocabulary-parallel LM head, an embedding under a
 * forced F), the divisors of gpus_per_node (a group stays in one NVLink
 * island and the node's GPUs split into whole groups) up to N; with
 * F = pl->tp_force (--tp F, or 1 for the whole-layer set), only F among
 * those. Ascending; returns how many.
 */
static int tp_degrees(const planner_t *pl, const metaop_t *m, int out[SP_TP_MAX])
{
	int G = pl->cluster->gpus_per_node, k = 0, F = pl->tp_force;
	out[k++] = 1;
	/* an embedding splits only when forced: its split adds an all-reduce of
	 * its whole output to a lookup, so no width is faster split (it only
	 * saves memory), and its widths would only make ours plan again on the
	 * COST_VOCAB_WHOLE tables for nothing */
	if (m->shape.type == COMP_EMBEDDING && F <= 1)
		return k;
	for (int t = 2; t <= SP_MIN(SP_MIN(G, pl->N), SP_TP_MAX); t++)
		if (G % t == 0 && m->scales && (F <= 0 || t == F) &&
		    pl_tp_ok(pl, &m->shape, t))
			out[k++] = t;
	return k;
}

/*
 * The fastest (d, t) with d t = n and d <= batch among deg (ascending);
 * forced F > 1: F where it divides n, else 1. *f, *b: its per-layer times.
 * Returns t, or 0 when no pair makes n.
 */
static int best_degree(const planner_t *pl, int mi, int n, const int *deg, int n_deg,
		       double *f, double *b)
{
	const metaop_t *m = &pl->mops[mi];
	int F = pl->tp_force, best = 0;
	double bt = HUGE_VAL;
	for (int i = 0; i < n_deg; i++) {
		int t = deg[i];
		if (n % t || n / t > m->batch || (F > 1 && t == 1 && deg[n_deg - 1] == F &&
						  n % F == 0))
			continue;
		double tf, tb;
		cost_layer_tp(pl, mi, (m->batch + n / t - 1) / (n / t), t, &tf, &tb);
		/* strictly faster: ties go to the smaller t (fewer collectives) */
		if (tf + tb < bt)
			best = t, bt = tf + tb, *f = tf, *b = tb;
	}
	return best;
}

/* Table set `set` of MetaOp k (made active): widths 1..nmax = min(N,
 * batch tmax), at each the fastest (d, t) of the degrees pl->tp_force
 * allows, kept non-increasing in n. */
static int cost_tables(planner_t *pl, int k, int set)
{
	metaop_t *m = &pl->mops[k];
	struct cost_tab *tab = &m->tabs[set];
	int deg[SP_TP_MAX], n_deg = tp_degrees(pl, m, deg);
	tab->nmax = (int)SP_MIN((int64_t)pl->N, m->batch * deg[n_deg - 1]);
	size_t sz = (size_t)tab->nmax + 1;
	tab->tf = sp_arena_calloc(&pl->arena, sz, sizeof(double));
	tab->tb = sp_arena_calloc(&pl->arena, sz, sizeof(double));
	tab->tpn = sp_arena_calloc(&pl->arena, sz, sizeof(int));
	tab->usen = sp_arena_calloc(&pl->arena, sz, sizeof(int));
	if (!tab->tf || !tab->tb || !tab->tpn || !tab->usen)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	m->nmax = tab->nmax;
	m->tf = tab->tf;
	m->tb = tab->tb;
	m->tpn = tab->tpn;
	m->usen = tab->usen;
	for (int n = 1; n <= m->nmax; n++) {
		double f = HUGE_VAL, b = HUGE_VAL;
		int t = best_degree(pl, k, n, deg, n_deg, &f, &b);
		/* keep T non-increasing in n: more devices never make a layer
		 * slower in the model (ceil(B/n) can repeat; a width no (d, t)
		 * makes, or a slower one, runs as the width before it) */
		if (n > 1 && (!t || f + b > m->tf[n - 1] + m->tb[n - 1])) {
			m->tpn[n] = m->tpn[n - 1];
			m->usen[n] = m->usen[n - 1];
		} else {
			m->tpn[n] = t;
			m->usen[n] = n;
		}
		m->tf[n] = n > 1 ? fmin(f, m->tf[n - 1]) : f;
		m->tb[n] = n > 1 ? fmin(b, m->tb[n - 1]) : b;
	}
	/* width_floor's answers, from below: n when it gains, else n - 1's */
	if (!(tab->wfloor = sp_arena_calloc(&pl->arena, sz, sizeof(int))))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int n = 1; n <= m->nmax; n++)
		tab->wfloor[n] = n > 1 && !width_gains(m, n) ? tab->wfloor[n - 1] : n;
	m->wfloor = tab->wfloor;
	return 0;
}

void cost_use(planner_t *pl, int set)
{
	pl->tables = set;
	pl->tp_force = set == COST_WHOLE ? 1 : pl->opts ? pl->opts->tp : 0;
	pl->vocab_whole = set == COST_VOCAB_WHOLE || (pl->opts && pl->opts->tp_vocab_whole);
	for (int k = 0; k < pl->n_mops; k++) {
		metaop_t *m = &pl->mops[k];
		const struct cost_tab *tab = &m->tabs[set];
		m->nmax = tab->nmax;
		m->tf = tab->tf;
		m->tb = tab->tb;
		m->tpn = tab->tpn;
		m->usen = tab->usen;
		m->wfloor = tab->wfloor;
	}
}

/* 1 when MetaOp m's auto table set and set `set` price some width
 * differently, or reach different widths. */
static int tabs_differ(const metaop_t *m, int set)
{
	const struct cost_tab *a = &m->tabs[COST_AUTO], *w = &m->tabs[set];
	if (a->nmax != w->nmax)
		return 1;
	for (int n = 1; n <= a->nmax; n++)
		if (a->tf[n] != w->tf[n] || a->tb[n] != w->tb[n])
			return 1;
	return 0;
}

/*
 * Under --tp auto the auto tables change the schedulers' width choices
 * even where tp_assign then keeps every slice whole, and the schedule was
 * built on times those slices do not run at: ours also plans on the
 * whole-layer set (plan.c) and keeps the better plan. A model whose
 * tables all agree (no transformer tp_ok splits, or no width where a
 * split pays and no MetaOp that widens past its batch) gets one set.
 * Likewise the vocabulary splits: ours also plans on the auto set with
 * embeddings and LM heads whole (COST_VOCAB_WHOLE; only their tables
 * differ, the others share the auto set's arrays; under auto only LM
 * heads split, tp_degrees), so auto is never slower than --tp-vocab whole
 * either (the schedulers are heuristics: a cheaper LM head can move the
 * other slices' widths to a worse plan).
 */
int cost_build(planner_t *pl)
{
	const sp_model_t *md = pl->model;
	int64_t psb = param_state_bytes(md->dtype, md->opt.kind);
	int db = dtype_bytes(md->dtype), rc;
	int whole = pl->opts && pl->opts->tp == 0;
	int vocab = whole && !pl->opts->tp_vocab_whole;
	pl->has_whole = pl->has_vocab_whole = 0;
	pl->memo = sp_arena_calloc(&pl->arena, MEMO_SLOTS, sizeof *pl->memo);
	if (!pl->memo)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int i = 0; i < MEMO_SLOTS; i++)
		pl->memo[i].m = -1;
	for (int k = 0; k < pl->n_mops; k++) {
		metaop_t *m = &pl->mops[k];
		m->scales = m->shape.type != COMP_CONTRASTIVE;
		m->profiled = find_profile(pl->cluster, &m->shape) != NULL;
		if (whole) {
			pl->tp_force = 1;
			if ((rc = cost_tables(pl, k, COST_WHOLE)))
				return rc;
		}
		pl->tp_force = pl->opts ? pl->opts->tp : 0;
		pl->vocab_whole = pl->opts && pl->opts->tp_vocab_whole;
		if ((rc = cost_tables(pl, k, COST_AUTO)))
			return rc;
		pl->has_whole |= whole && tabs_differ(m, COST_WHOLE);
		m->tabs[COST_VOCAB_WHOLE] = m->tabs[COST_AUTO];
		if (vocab && (m->shape.type == COMP_EMBEDDING || m->shape.type == COMP_LM_HEAD)) {
			pl->vocab_whole = 1;
			if ((rc = cost_tables(pl, k, COST_VOCAB_WHOLE)))
				return rc;
			pl->vocab_whole = 0;
			pl->has_vocab_whole |= tabs_differ(m, COST_VOCAB_WHOLE);
		}
		const sp_node_t *n0 = &md->tasks[m->task].nodes[pl->ops[m->first_op].node];
		m->layer_state_bytes = comp_layer_params(&md->comps[n0->comp]) * psb;
		m->saved_per_sample = op_saved_elems(&m->shape, m->batch) * db;
	}
	cost_use(pl, COST_AUTO);
	return 0;
}

int64_t cost_step_bytes(sp_dtype_t dt, sp_opt_kind_t opt)
{
	int64_t master = 4, moments = opt == OPT_ADAMW ? 8 : 0;
	int64_t copy = dt == DT_FP32 ? 0 : dtype_bytes(dt);
	return (dtype_bytes(dt) + master + moments) + (master + moments + copy);
}

double cost_step_ms(const planner_t *pl, int64_t elems)
{
	double bytes = (double)elems *
		       (double)cost_step_bytes(pl->model->dtype, pl->model->opt.kind);
	return bytes / (pl->cluster->mem_bandwidth_gbs * 1e6);
}
