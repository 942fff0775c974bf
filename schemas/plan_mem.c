/*
 * plan_mem.c — predicted memory of one device, computed from the plan
 * alone (so planner, verifier and runtime agree on one formula), in the
 * plan's dtype:
 *
 *  params  weights and gradients of every layer (shard) the device holds,
 *          once each (comp_layer_params_tp of the held entry's tp * 2 *
 *          dtype bytes: a t-way shard's), plus the optimizer
 *          state (fp32 master weights, AdamW moments: param_state_bytes
 *          minus those) of the elements it owns in each of its buckets: all
 *          of them when replicated, its shard under zero-1 (bucket_shard)
 *          and zero-2 and zero-3. A zero-2 or zero-3 bucket's gradients count as its shard
 *          (persistent) plus the full gradient while it is live, by the
 *          walk below (zero2_grad_bytes)
 *  acts    activations saved for backward: every FWD keeps
 *          op_saved_elems_sp (the slice's tp: one shard's, with sp a
 *          sequence-parallel one's; a decoder's, never split, with its
 *          cross-attention part) * local batch * layers until its BWD, or
 *          under recompute only each layer's input (op_kept_elems: seq *
 *          hidden per sample, with sp the member's seq / tp tokens); all
 *          forward instructions precede all backward ones, so the peak is
 *          their sum
 *  comm    value buffers: each value (act or grad of a MetaOp boundary) the
 *          device touches, over the span of its sample ranges (lowest to
 *          highest sample, as the runtime allocates it) — a
 *          decoder's memory act(c, -1) [mem_seq, mem_width] per sample is
 *          touched by every FWD and BWD of c, and grad(c, -1) by every BWD,
 *          so both are held for the span of the device's samples of c,
 *          whether or not the transfers that fill and drain them are there
 *          yet; plus staging:
 *          every SEND's bytes (sends stay outstanding until the step ends)
 *          and the largest RECV's
 *  work    scratch: the largest single (shard) layer's saved size at its local
 *          batch (losses compute in it), plus, when a slice recomputes, the
 *          largest recomputed layer's saved size (its forward is re-run into
 *          it), plus the largest transformer backward's layer workspace
 *          (bwd_ws_bytes; a decoder's: the cross-attention block's), plus
 *          WORK_FIXED for libraries
 *
 * The zero-2 walk. Under zero-2 a member holds the bucket's full gradient
 * (E elements) only from the first instruction of its program that writes
 * into it (a BWD of one of the bucket's layers, or a LOSS of an lm_head or
 * classifier of it; a SYNC when nothing wrote it: a zero gradient) until
 * the reduce-scatter its SYNC starts completes into the member's shard and
 * frees it: at the first later instruction that allocates another full
 * gradient with the bucket's safe point (plan_z2_safe: a wait there cannot
 * deadlock) at or before it, else at the STEP. The walk goes through the
 * program in order, completing the in-flight buckets so before each
 * allocation, placing each bucket's E elements at its first write at the
 * lowest offset of one pool where they fit between the live ones (first
 * fit: plan_z2_walk, plan_zero2.c; the runtime allocates that pool once);
 * the pool (at least the most full gradients live at once) is added to
 * params, with the shards, in place of the full gradients the held entries
 * count. The other categories
 * are not walked: activations are one allocation for the whole program
 * (the runtime does not give them back at BWD), so acts + params' peak is
 * the device's peak whatever the order. With k > 1 micro-batches the
 * program runs k times and only the last run has SYNCs: a full gradient
 * stays live across the micro-steps (the simplest correct rule: gradients
 * accumulate in it, and the shard is reduce-scattered once per step at the
 * same price as zero-1), so the walk runs the program k = 2 times (the
 * second run is the last: every bucket written in the first is live at its
 * start) — at k > 1 zero-2 then holds every full gradient at once and saves
 * nothing over zero-1 but the shard's copy costs E / n more; the planner's
 * auto choice takes zero-2 only at k = 1 (layout.c).
 * The runtime (interp.c) places and gives back the full gradients at these
 * points, at the walk's offsets, and checks as it runs that no two live
 * ones overlap and that the most live at once stays the walk's peak.
 *
 * Zero-3 (layout 3): gradients as zero-2; the weights count as the
 * member's shard (persistent) plus the pool the full weights of its
 * buckets are gathered into, each live from its PGATHER to its PFREE
 * (plan_z3_walk, plan_zero3.c: first fit, the runtime allocates that pool
 * once), in place of the whole weights the held entries count.
 *
 * The layer workspace is allocated by the backend, not by the runtime's
 * work buffer, so the runtime's own figure (rt_memory) does not include it;
 * counting it here keeps a plan that fits from running out of memory.
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#define WORK_FIXED ((int64_t)64 << 20)

static int64_t saved_bytes(const sp_plan_t *p, const sp_ins_t *in, int db)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *m = &p->metaops[sl->metaop];
	const sp_task_t *t = &p->model.tasks[m->task];
	int64_t local = in->s1 - in->s0;
	if (m->shape.type == COMP_CONTRASTIVE)
		local = t->batch;
	/* a decoder is never split (plan_check.c): all it saves, the
	 * cross-attention's LN_c, Q, heads, residual, K and V, probabilities */
	return op_saved_elems_sp(&m->shape, t->batch, sl->tp, sl->sp) * local * db;
}

/*
 * Workspace one transformer BWD allocates besides the saved activations, in
 * bytes: the larger of the two backends' (both fp32 whatever the plan's
 * dtype, hence sizeof(float)). The CPU reference (runtime/layers.c
 * tblock_bwd) holds the gradient of a LayerNorm output for all n local
 * samples [n, s, h] and one sample's dx_mid [s, h], dact [s, f/t], dcat
 * [s, h/t], dqkv [s, 3h/t] and one head's dP [s, s]; the CUDA split backward
 * (cu_layers.cu cu_tblock_bwd) holds dln and dx_mid [n, s, h] each, which
 * exceeds its chunked workspace cap by up to 8 n s h bytes (unsplit it stays
 * within the cap). A decoder layer (mem_seq m > 0, never split) runs the
 * cross-attention block instead (runtime/layers_xattn.c xblock_bwd), whose
 * workspace is one sample's: dln, dxc, dxm, dcat [s, h] and dqkv [s, 3h]
 * (its first third dq) — 7 s h —, dact [s, f], dP [s, max(s, m)], dK and
 * dV [m, 2h]; that is the figure counted. The CUDA decoder block
 * (runtime/cuda/cu_xattn.cu cu_xblock_bwd) needs more per sample — 28 s h
 * + 6 s f + 6 a s (s + m) + 4 m h + 2 m W bytes (dln, dxc, dxm and the
 * block's scratch, both attentions' dP in fp32 and bf16, dq, dK and dV and
 * the memory in bf16) — but, like the unsplit transformer's, it chunks its
 * samples to the backend's workspace cap (cu_ws_cap, reserved whole at
 * start-up outside this count), so it adds nothing beyond that
 * reservation unless one sample alone exceeds the cap. A sequence-parallel
 * block (runtime/layers_sp.c tblock_sp_bwd, CPU only) holds the gathered
 * gradient and the partial sums [n s, h] each, one sample's dact [s, f/t],
 * dcat [s, h/t], dqkv [s, 3h/t] and dP [s, s], its dx_mid shard [n s/t, h]
 * and the LayerNorm gradients [4h], and at the slice's first layer the
 * all-gather of dx with every layer's LayerNorm gradients (t blocks of
 * [n s h / t + 4 h L]); the runtime's work buffer holds those gradients
 * of the instruction's L layers (4 h L, interp.c), counted here too; its
 * forward's workspace ([n s, h] and 2 n s statistics) is less.
 */
static int64_t bwd_ws_bytes(const sp_plan_t *p, const sp_ins_t *in)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_opshape_t *s = &p->metaops[sl->metaop].shape;
	if (in->op != INS_BWD || s->type != COMP_TRANSFORMER)
		return 0;
	if (s->mem_seq > 0) {
		int64_t sq = s->seq, h = s->hidden, m = s->mem_seq;
		return (7 * sq * h + sq * s->ffn + 2 * m * h + sq * SP_MAX(sq, m)) *
		       (int64_t)sizeof(float);
	}
	int t = tp_ok(s->type, s->heads, s->ffn, s->vocab, sl->tp) ? sl->tp : 1;
	int64_t n = in->s1 - in->s0, sq = s->seq, h = s->hidden;
	int64_t fl = s->ffn / t, hl = h / t, f = (int64_t)sizeof(float);
	int64_t cpu = (n * sq * h + sq * (h + fl + 4 * hl) + sq * sq) * f;
	if (sl->sp && sp_ok(s, t)) { /* layers_sp.c: gathered and partial [n s, h], a
				       * sample's gradients, dx_mid's shard, a layer's LN
				       * gradients; the first layer's all-gather of dx with
				       * every layer's E = 4 h L (t blocks [n s h / t + E]);
				       * interp.c's E accumulated */
		int64_t E = 4 * h * (sl->layer_to - sl->layer_from);
		cpu = (2 * n * sq * h + sq * (fl + 4 * hl) + sq * sq + n * sq / t * h + 4 * h +
		       n * sq * h + t * E + E) *
		      f;
	}
	int64_t cuda = t > 1 ? 2 * n * sq * h * f : 0;
	return SP_MAX(cpu, cuda);
}

/* Bytes one FWD keeps per layer: all it saves, or under recompute its input. */
static int64_t kept_bytes(const sp_plan_t *p, const sp_ins_t *in, int db, int64_t saved)
{
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_opshape_t *s = &p->metaops[sl->metaop].shape;
	if (!sl->recompute)
		return saved;
	return (int64_t)(in->s1 - in->s0) * op_kept_elems(s, sl->tp, sl->sp) * db;
}

/*
 * Bytes of device d's zero-2 gradients: every shard, plus the pool of the
 * full gradients (plan_z2_walk: the walk in the header), minus the full
 * gradients the held loop counted (negative: a saving), in *out; 0 without
 * zero-2 buckets. 0 or -1 when out of memory.
 */
int plan_zero2_grads_at(const sp_plan_t *p, int d, const int32_t *safe, int64_t *out)
{
	plan_z2_walk_t w;
	*out = 0;
	if (plan_z2_walk(p, d, safe, &w))
		return -1;
	*out = (w.shards + w.pool - w.fulls) * dtype_bytes(p->model.dtype);
	plan_z2_walk_release(&w);
	return 0;
}

int plan_zero2_grads(const sp_plan_t *p, int d, int64_t *out)
{
	return plan_zero2_grads_at(p, d, NULL, out);
}

/* Optimizer state of the elements d owns in each bucket it belongs to. */
static int64_t owned_state_bytes(const sp_plan_t *p, int d, int64_t per_elem)
{
	int64_t sum = 0, off, n;
	for (int b = 0; b < p->n_buckets && per_elem > 0; b++)
		if (bucket_shard(p, b, d, &off, &n) >= 0)
			sum += n * per_elem;
	return sum;
}

/* A value buffer's span: (metaop, layer, grad) -> samples [lo, hi). */
typedef struct {
	int32_t m, l, g, lo, hi;
} vslot_t;

static size_t value_hash(int32_t m, int32_t l, int32_t g)
{
	return (size_t)m * 2654435761u + (size_t)l * 40503u + (size_t)g;
}

/* plan_memory_at's table of value indexes, doubled: the old one freed
 * (also on failure: NULL); vals holds the n entries that index. */
static int32_t *values_rehash(int32_t *tab, size_t *cap, const vslot_t *v, size_t n)
{
	size_t nc = *cap * 2;
	int32_t *t = calloc(nc, sizeof *t);
	free(tab);
	if (!t)
		return NULL;
	for (size_t j = 0; j < n; j++) {
		size_t h = value_hash(v[j].m, v[j].l, v[j].g) & (nc - 1);
		while (t[h])
			h = (h + 1) & (nc - 1);
		t[h] = (int32_t)(j + 1);
	}
	*cap = nc;
	return t;
}

int plan_memory(const sp_plan_t *p, int d, int64_t out[MEM__COUNT])
{
	return plan_memory_at(p, d, NULL, out);
}

int plan_memory_at(const sp_plan_t *p, int d, const int32_t *safe, int64_t out[MEM__COUNT])
{
	const sp_device_t *dv = &p->devices[d];
	const sp_model_t *md = &p->model;
	int db = dtype_bytes(md->dtype);
	memset(out, 0, sizeof(int64_t) * MEM__COUNT);
	for (int k = 0; k < dv->n_held; k++) {
		const sp_param_t *h = &p->held[dv->held_off + k];
		out[MEM_PARAMS] += comp_layer_params_tp(&md->comps[h->comp], h->tp) * 2 * db;
	}
	out[MEM_PARAMS] += owned_state_bytes(p, d, opt_state_bytes(md->dtype, md->opt.kind));
	int64_t z2;
	if (plan_zero2_grads_at(p, d, safe, &z2))
		return -1;
	out[MEM_PARAMS] += z2;
	/* zero-3: the weight shards and the pool of gathered full weights in
	 * place of the whole weights the held loop counted */
	plan_z3_walk_t z3;
	if (plan_z3_walk(p, d, &z3))
		return -1;
	out[MEM_PARAMS] += (z3.shards + z3.pool - z3.fulls) * db;
	plan_z3_walk_release(&z3);
	int64_t work = 0, redo = 0, bwd_ws = 0;
	/* value buffers: (metaop, layer, grad) -> [lo, hi), in vals (in the
	 * order first touched) found through an open-addressing table of
	 * indexes + 1 (0: empty) at most half full, doubled as values come:
	 * a program touches few distinct values however long it is */
	size_t cap = 64, n_vals = 0, cap_vals = 32;
	int32_t *tab = calloc(cap, sizeof *tab);
	vslot_t *vals = malloc(cap_vals * sizeof *vals);
	if (!tab || !vals) {
		free(tab);
		free(vals);
		return -1;
	}
	int64_t send_stage = 0, recv_stage = 0;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op == INS_SEND || in->op == INS_RECV) {
			const sp_vref_t *r = in->op == INS_SEND ? &in->src : &in->dst;
			int32_t sq, wd;
			plan_value_shape(p, r->metaop, r->layer, &sq, &wd);
			int64_t bytes = (int64_t)(in->s1 - in->s0) * in->seq_len * wd * db;
			if (in->op == INS_SEND)
				send_stage += bytes;
			else
				recv_stage = SP_MAX(recv_stage, bytes);
		}
		if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) {
			const sp_slice_t *sl = &p->slices[in->slice];
			int64_t one = saved_bytes(p, in, db);
			if (in->op == INS_FWD)
				out[MEM_ACTS] += kept_bytes(p, in, db, one) *
						 (sl->layer_to - sl->layer_from);
			work = SP_MAX(work, one);
			bwd_ws = SP_MAX(bwd_ws, bwd_ws_bytes(p, in));
			if (sl->recompute)
				redo = SP_MAX(redo, one);
		}
		const sp_vref_t *refs[4] = {NULL, NULL, NULL, NULL};
		sp_vref_t mem_act, mem_grad;
		int32_t r0 = in->s0, r1 = in->s1;
		switch (in->op) {
		case INS_FWD:
		case INS_BWD:
		case INS_LOSS: {
			int mi = p->slices[in->slice].metaop;
			const sp_metaop_t *m = &p->metaops[mi];
			if (!(in->op == INS_FWD && in->src.layer == 0 && m->width_in == 0))
				refs[0] = &in->src;
			refs[1] = &in->dst;
			/* a decoder reads its memory; its backward adds into the
			 * memory's gradient */
			mem_act = (sp_vref_t){mi, -1, 0, 0};
			mem_grad = (sp_vref_t){mi, -1, 1, 0};
			if (m->shape.mem_seq > 0 && in->op != INS_LOSS)
				refs[2] = &mem_act;
			if (m->shape.mem_seq > 0 && in->op == INS_BWD)
				refs[3] = &mem_grad;
			if (in->op == INS_LOSS && m->shape.type == COMP_CONTRASTIVE) {
				r0 = 0;
				r1 = (int32_t)p->model.tasks[m->task].batch;
			}
			break;
		}
		case INS_SEND: refs[0] = &in->src; break;
		case INS_RECV: refs[1] = &in->dst; break;
		case INS_COPY:
			refs[0] = &in->src;
			refs[1] = &in->dst;
			break;
		default: break;
		}
		for (int q = 0; q < 4; q++) {
			const sp_vref_t *r = refs[q];
			if (!r)
				continue;
			size_t h = value_hash(r->metaop, r->layer, r->grad) & (cap - 1);
			while (tab[h]) {
				vslot_t *x = &vals[tab[h] - 1];
				if (x->m == r->metaop && x->l == r->layer && x->g == r->grad)
					break;
				h = (h + 1) & (cap - 1);
			}
			if (tab[h]) {
				vslot_t *x = &vals[tab[h] - 1];
				x->lo = SP_MIN(x->lo, r0);
				x->hi = SP_MAX(x->hi, r1);
				continue;
			}
			if (n_vals == cap_vals) {
				vslot_t *nv = realloc(vals, 2 * cap_vals * sizeof *vals);
				if (!nv) {
					free(tab);
					free(vals);
					return -1;
				}
				vals = nv;
				cap_vals *= 2;
			}
			vals[n_vals] = (vslot_t){r->metaop, r->layer, r->grad, r0, r1};
			tab[h] = (int32_t)++n_vals;
			if (2 * n_vals > cap && !(tab = values_rehash(tab, &cap, vals, n_vals))) {
				free(vals);
				return -1;
			}
		}
	}
	for (size_t j = 0; j < n_vals; j++) {
		const vslot_t *x = &vals[j];
		int32_t seq, width;
		plan_value_shape(p, x->m, x->l, &seq, &width);
		out[MEM_COMM] += (int64_t)(x->hi - x->lo) * seq * width * db;
	}
	free(tab);
	free(vals);
	out[MEM_COMM] += send_stage + recv_stage;
	out[MEM_WORK] = work + redo + bwd_ws + WORK_FIXED;
	return 0;
}
