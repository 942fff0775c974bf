/*
 * exec.c — one rank's instructions, split from interp.c (which sets a
 * rank up, evaluates and answers the accessors): FWD (rt_exec_fwd), BWD,
 * LOSS (rt_exec_loss), the transfers, copies and syncs (rt_exec_comm),
 * polling the requests in flight (rt_poll_pending) and draining them
 * (rt_drain), STEP, the micro-steps and rt_step. interp.c's header
 * comment describes the memory, the step and the layouts these run;
 * rt_eval (interp.c) runs the forward part of the same program through
 * the exported ones.
 */
#include "interp_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int add_pending(rt_state_t *st, rt_req_t r, int k)
{
	if (st->n_pending == st->cap_pending) {
		int nc = st->cap_pending ? 2 * st->cap_pending : 64;
		rt_req_t *np = realloc(st->pending, sizeof *np * (size_t)nc);
		if (!np)
			return SP_ENOMEM;
		st->pending = np;
		int *ni = realloc(st->pending_ins, sizeof *ni * (size_t)nc);
		if (!ni)
			return SP_ENOMEM;
		st->pending_ins = ni;
		st->cap_pending = nc;
	}
	st->pending[st->n_pending] = r;
	st->pending_ins[st->n_pending++] = k;
	return 0;
}

static void event(rt_state_t *st, double t0, int k, int comm)
{
	if (!st->o.record_events)
		return;
	rt_event_t e = {t0 - st->t_origin, wall_ms() - st->t_origin, k, comm, st->tp_ms};
	SP_PUSH(st->ev, st->n_ev, st->cap_ev, e);
}

/* What the split block's all-reduce needs: instruction k of the rank's
 * program runs it, over comm group `group`. */
typedef struct {
	rt_state_t *st;
	int k, group;
	sp_err_t *err;
} tp_call_t;

/* What a forward or backward instruction k runs: its slice's layers of one
 * MetaOp on n samples, each layer keeping kpp floats per sample from its
 * FWD to its BWD (kept_pp); the layers' tensor-parallel split (tp: NULL
 * for whole layers, else &tps, so a slice_run_t stays where
 * slice_run_init filled it) and a decoder's memory (mem: NULL without). */
typedef struct {
	const sp_ins_t *in;
	const sp_slice_t *sl;
	const sp_metaop_t *mo;
	int n;
	int64_t kpp;
	tp_call_t tc;
	rt_tp_t tps, *tp;
	const float *mem;
} slice_run_t;

/* The first sample of micro-step st->micro in task's synthetic batch; a
 * dataset's micro-steps are its steps (rt_step). */
static int64_t sample_off(const rt_state_t *st, int task)
{
	return st->o.data ? 0 : (int64_t)st->micro * st->p->model.tasks[task].batch;
}

/* What the FWD kept of layer l of a run whose block starts at off: its
 * saved activations, or under recompute its input [n, seq, hidden]. */
static float *layer_saved(const rt_state_t *st, const slice_run_t *r, int64_t off, int l)
{
	return st->saved + off + (int64_t)(l - r->sl->layer_from) * r->n * r->kpp;
}

/* Where a recomputing slice's layer writes its full saved activations, in
 * its FWD and again in its BWD (after loss scratch and input features). */
static float *redo_buf(const rt_state_t *st)
{
	return st->work + 2 * st->ping_n + st->loss_n + st->feat_n;
}

/* A sequence-parallel BWD's LayerNorm gradients of all its layers
 * (rt_tp_t.ln_grads), after the recompute buffer. */
static float *lnacc_buf(const rt_state_t *st)
{
	return redo_buf(st) + st->redo_n;
}

/* rt_tp_t.allreduce: the layer's kernels so far finish (b->sync), then the
 * group's all-reduce, waited for against the timeout like a RECV. The
 * time from the start to the end of the wait (waiting for the slowest
 * member included, the kernels before it not) adds to st->tp_ms. */
static int tp_allreduce(void *ctx, float *buf, int64_t n)
{
	tp_call_t *tc = ctx;
	rt_state_t *st = tc->st;
	rt_req_t r = {0};
	st->b->sync();
	double t0 = wall_ms();
	if (st->c->ops->iallreduce(st->c, buf, n, tc->group, &r))
		return rt_fail(st, tc->err, tc->k, "starting the tensor-parallel all-reduce failed");
	int rc = rt_wait_req(st, &r, tc->k, tc->err);
	st->tp_ms += wall_ms() - t0;
	return rc;
}

/* The sequence-parallel halves (layers_sp.c), as tp_allreduce: in place,
 * the member's shard comm_shard's, which is its token rows. The split
 * embedding's backward all-gathers its position gradient here too
 * (layers_vocab.c). */
static int tp_half(tp_call_t *tc, float *buf, int64_t n, int gather)
{
	rt_state_t *st = tc->st;
	rt_req_t r = {0};
	st->b->sync();
	double t0 = wall_ms();
	int bad = gather ? st->c->ops->iallgather(st->c, buf, n, tc->group, &r)
			 : st->c->ops->ireduce_scatter(st->c, buf, n, tc->group, &r);
	if (bad)
		return rt_fail(st, tc->err, tc->k,
			    gather ? "starting the tensor-parallel all-gather failed"
				   : "starting the sequence-parallel reduce-scatter failed");
	int rc = rt_wait_req(st, &r, tc->k, tc->err);
	st->tp_ms += wall_ms() - t0;
	return rc;
}

static int tp_reduce_scatter(void *ctx, float *buf, int64_t n)
{
	return tp_half(ctx, buf, n, 0);
}

static int tp_allgather(void *ctx, float *buf, int64_t n)
{
	return tp_half(ctx, buf, n, 1);
}

/* The split of instruction k's slice for the layers (NULL: whole layers).
 * With sp the caller sets whole_in and whole_out per layer. */
static rt_tp_t *tp_of(rt_state_t *st, int k, sp_err_t *err, tp_call_t *tc, rt_tp_t *tp)
{
	int sl = st->prog[k].slice;
	if (st->p->slices[sl].tp <= 1)
		return NULL;
	*tc = (tp_call_t){st, k, st->tp_group[sl], err};
	*tp = (rt_tp_t){.t = st->p->slices[sl].tp, .rank = st->tp_rank[sl], .ctx = tc,
			.allreduce = tp_allreduce, .sp = st->p->slices[sl].sp,
			.reduce_scatter = tp_reduce_scatter, .allgather = tp_allgather};
	return tp;
}

static void slice_run_init(slice_run_t *out, rt_state_t *st, int k, sp_err_t *err)
{
	out->in = &st->prog[k];
	out->sl = &st->p->slices[out->in->slice];
	out->mo = mop(st, out->sl->metaop);
	out->n = out->in->s1 - out->in->s0;
	out->kpp = kept_pp(st, out->sl);
	out->tp = tp_of(st, k, err, &out->tc, &out->tps);
	out->mem = st->mem_vb[k] >= 0 ? vptr(st, st->mem_vb[k], out->in->s0, 0) : NULL;
}

/* A sequence-parallel slice's layer l reads its whole input when it is
 * the slice's first and puts out its whole output when it is the last
 * (values stay whole); in between it passes token shards. */
static void sp_layer(rt_tp_t *tp, const sp_slice_t *sl, int l)
{
	if (tp) {
		tp->whole_in = l == sl->layer_from;
		tp->whole_out = l == sl->layer_to - 1;
	}
}

/* The member's token rows of a sequence-parallel call of n samples: the
 * offset of its first float in a whole [n, seq, hidden] buffer. */
static int64_t sp_off(const rt_tp_t *tp, const sp_metaop_t *mo, int n)
{
	return tp && tp->sp ? (int64_t)n * mo->shape.seq * mo->shape.hidden / tp->t * tp->rank
			    : 0;
}

/* 0, or the code of a layer that failed (a tensor-parallel all-reduce:
 * tp_allreduce named the instruction). */
int rt_exec_fwd(rt_state_t *st, int k, int64_t step, sp_err_t *err)
{
	slice_run_t r;
	slice_run_init(&r, st, k, err);
	rt_tp_t *tp = r.tp;
	const float *mem = r.mem;
	int rc = 0;
	const rt_backend_t *b = st->b;
	float *ping = st->work, *pong = st->work + st->ping_n;
	const float *x = NULL;
	int64_t so = sample_off(st, r.mo->task);
	for (int l = r.sl->layer_from; l < r.sl->layer_to; l++) {
		int comp;
		int si = layer_slot(st, r.sl->metaop, l, &comp);
		if (si >= 0 && (rc = rt_z3_need(st, si, k, err)))
			return rc;
		const float *pw = si >= 0 ? rt_wptr(st, si) : NULL;
		float *y = l == r.sl->layer_to - 1 ? vptr(st, st->dst_vb[k], r.in->s0, 0)
						   : ((l - r.sl->layer_from) % 2 ? pong : ping);
		float *saved = layer_saved(st, &r, st->saved_off[k], l);
		if (l == r.sl->layer_from)
			x = st->src_vb[k] >= 0 ? vptr(st, st->src_vb[k], r.in->s0, 0) : NULL;
		sp_layer(tp, r.sl, l);
		if (r.sl->recompute) {
			/* keep the input bit for bit (sequence parallel: the
			 * member's tokens of it); the saved activations go to
			 * scratch, re-created from it by the BWD */
			int64_t h = r.mo->shape.hidden;
			const float *xk = l == r.sl->layer_from ? x + sp_off(tp, r.mo, r.n) : x;
			b->copy_rows(saved, h, xk, h, r.n * r.kpp / h, h, 0);
			saved = redo_buf(st);
		}
		const sp_op_t *op = &st->p->ops[r.mo->first_op + l];
		switch (r.mo->shape.type) {
		case COMP_EMBEDDING:
			data_tokens(st->ints_host, st->o.data, &st->p->model, st->o.seed, step, r.mo->task,
				    op->node, r.in->s0 + so, r.in->s1 + so);
			b->to_device(st->ints_dev, st->ints_host,
				     sizeof(int32_t) * (size_t)r.n * (size_t)r.mo->seq_in);
			if (tp)
				rc = b->embedding_fwd_tp(&r.mo->shape, tp, r.n, pw, st->ints_dev, y,
							 saved);
			else
				b->embedding_fwd(&r.mo->shape, r.n, pw, st->ints_dev, y, saved);
			break;
		case COMP_PATCH: {
			float *feat = st->work + 2 * st->ping_n + st->loss_n;
			data_features(st->feat_host, st->o.data, &st->p->model, st->o.seed, step, r.mo->task,
				      op->node, r.in->s0 + so, r.in->s1 + so);
			b->to_device(feat, st->feat_host,
				     sizeof(float) * (size_t)r.n *
					     (size_t)(r.mo->seq_in * r.mo->shape.in));
			b->patch_fwd(&r.mo->shape, r.n, pw, feat, y, saved);
			break;
		}
		case COMP_TRANSFORMER:
			rc = mem ? b->xblock_fwd(&r.mo->shape, tp, r.n, pw, x, mem, y, saved)
				 : b->tblock_fwd(&r.mo->shape, tp, r.n, pw, x, y, saved);
			break;
		case COMP_LINEAR: b->linear_fwd(&r.mo->shape, r.n, pw, x, y, saved); break;
		default: break;
		}
		if (rc)
			return rc;
		x = y;
	}
	return 0;
}

/* The gradient of held layer si: in g, or in its zero-2 bucket's full
 * gradient (live: rt_z2_touch ran for the instruction). */
static float *grad_of(const rt_state_t *st, int si)
{
	const mybucket_t *mb = &st->mb[st->pmb[si]];
	return (mb->zero2 ? mb->full : st->g + mb->goff) + (st->poff[si] - mb->off);
}

/* The summed LayerNorm gradients of a sequence-parallel BWD's layers
 * (tp->ln_grads, [4h] per layer: ln1_g, ln1_b, ln2_g, ln2_b, which are
 * layer_tensors 0, 1, 6 and 7 of a transformer, layers.h) into their
 * gradients. */
static void sp_ln_add(rt_state_t *st, const slice_run_t *r, const rt_tp_t *tp)
{
	static const int ln[4] = {0, 1, 6, 7};
	tblock_split_t spl;
	if (tblock_split(&spl, &r->mo->shape, tp)) /* the layers ran it: cannot fail */
		return;
	for (int l = r->sl->layer_from; l < r->sl->layer_to; l++) {
		int comp, si = layer_slot(st, r->sl->metaop, l, &comp);
		float *dp = grad_of(st, si);
		const float *a = tp->ln_grads + (l - r->sl->layer_from) * 4 * spl.h;
		for (int q = 0; q < 4; q++)
			st->b->copy_rows(dp + spl.tensors[ln[q]].offset, spl.h, a + q * spl.h, spl.h, 1,
					 spl.h, 1);
	}
}

/* 0, or the code of a layer that failed (as rt_exec_fwd). */
static int exec_bwd(rt_state_t *st, int k, sp_err_t *err)
{
	slice_run_t r;
	slice_run_init(&r, st, k, err);
	rt_tp_t *tp = r.tp;
	/* a decoder: its memory, and the memory's gradient every layer adds to */
	const float *mem = r.mem;
	float *dmem = st->dmem_vb[k] >= 0 ? vptr(st, st->dmem_vb[k], r.in->s0, 0) : NULL;
	int rc = 0;
	const rt_backend_t *b = st->b;
	float *bufs[2] = {st->work, st->work + st->ping_n};
	const float *dy = vptr(st, st->src_vb[k], r.in->s0, 0);
	int64_t fwd_off = st->saved_off[st->fwd_of[k]];
	/* sequence parallel: the layers' LayerNorm gradients gathered once, on
	 * the first layer's all-gather of dx, and added into them at the end */
	int64_t lnh = 4 * r.mo->shape.hidden;
	if (tp && tp->sp) {
		tp->ln_grads = lnacc_buf(st);
		tp->ln_n = (r.sl->layer_to - r.sl->layer_from) * lnh;
		b->zero(tp->ln_grads, tp->ln_n);
	}
	for (int l = r.sl->layer_to - 1, j = 0; l >= r.sl->layer_from; l--, j++) {
		int comp;
		int si = layer_slot(st, r.sl->metaop, l, &comp);
		if (si >= 0 && (rc = rt_z3_need(st, si, k, err)))
			return rc;
		const float *pw = si >= 0 ? rt_wptr(st, si) : NULL;
		float *dp = si >= 0 ? grad_of(st, si) : NULL;
		const float *saved = layer_saved(st, &r, fwd_off, l);
		if (r.sl->recompute) {
			/* the same forward on the same input and weights as the FWD
			 * (parameters change only at STEP), so the same saved
			 * activations; its output goes to bufs[j % 2], free here: dy
			 * is in the other buffer or a value, and dx is zeroed below.
			 * Sequence parallel: from the kept tokens, to tokens (the
			 * same saved values: LayerNorms are per token) */
			if (tp)
				tp->whole_in = tp->whole_out = 0;
			if (tp && tp->sp)
				tp->ln_at = (l - r.sl->layer_from) * lnh;
			rc = mem ? b->xblock_fwd(&r.mo->shape, tp, r.n, pw, saved, mem, bufs[j % 2],
						 redo_buf(st))
				 : b->tblock_fwd(&r.mo->shape, tp, r.n, pw, saved, bufs[j % 2],
						 redo_buf(st));
			if (rc)
				return rc;
			saved = redo_buf(st);
		}
		sp_layer(tp, r.sl, l);
		if (tp && tp->sp)
			tp->ln_at = (l - r.sl->layer_from) * lnh;
		float *dx = NULL;
		if (l == r.sl->layer_from) {
			if (st->dst_vb[k] >= 0)
				dx = vptr(st, st->dst_vb[k], r.in->s0, 0);
		} else {
			dx = bufs[j % 2];
			b->zero(dx, (int64_t)r.n * r.mo->seq_out * r.mo->width_out);
		}
		switch (r.mo->shape.type) {
		case COMP_EMBEDDING:
			if (tp)
				rc = b->embedding_bwd_tp(&r.mo->shape, tp, r.n, saved, dy, dp);
			else
				b->embedding_bwd(&r.mo->shape, r.n, saved, dy, dp);
			break;
		case COMP_PATCH: b->patch_bwd(&r.mo->shape, r.n, pw, saved, dy, dp); break;
		case COMP_TRANSFORMER:
			rc = mem ? b->xblock_bwd(&r.mo->shape, tp, r.n, pw, saved, mem, dy, dx, dmem, dp)
				 : b->tblock_bwd(&r.mo->shape, tp, r.n, pw, saved, dy, dx, dp);
			break;
		case COMP_LINEAR: b->linear_bwd(&r.mo->shape, r.n, pw, saved, dy, dx, dp); break;
		default: break;
		}
		if (rc)
			return rc;
		dy = dx;
	}
	if (tp && tp->sp)
		sp_ln_add(st, &r, tp);
	return 0;
}

/* 0, or the code of a split LM head's all-reduce (tp_allreduce named the
 * instruction). A split loss's members compute the same loss: member 0
 * alone adds it, so it is counted once. */
int rt_exec_loss(rt_state_t *st, int k, int64_t step, sp_err_t *err)
{
	tp_call_t tc;
	rt_tp_t tps;
	const rt_tp_t *tp = tp_of(st, k, err, &tc, &tps);
	int rc = 0;
	const sp_ins_t *in = &st->prog[k];
	const sp_slice_t *sl = &st->p->slices[in->slice];
	const sp_metaop_t *mo = mop(st, sl->metaop);
	const sp_task_t *t = task_of(st, sl->metaop);
	const sp_op_t *op = &st->p->ops[mo->first_op];
	const rt_backend_t *b = st->b;
	int n = in->s1 - in->s0;
	int comp;
	int si = layer_slot(st, sl->metaop, 0, &comp);
	if (si >= 0 && (rc = rt_z3_need(st, si, k, err)))
		return rc;
	const float *pw = si >= 0 ? rt_wptr(st, si) : NULL;
	float *dp = si >= 0 ? grad_of(st, si) : NULL;
	float *scratch = st->work + 2 * st->ping_n;
	int64_t so = sample_off(st, mo->task);
	/* the mean over the step batch: k_t micro-batches of t->batch */
	double scale = t->weight / ((double)t->batch * plan_task_k(st->p, mo->task)), l = 0;
	switch (mo->shape.type) {
	case COMP_LM_HEAD:
		data_lm_targets(st->ints_host, st->o.data, &st->p->model, st->o.seed, step, mo->task, op->node,
				in->s0 + so, in->s1 + so);
		b->to_device(st->ints_dev, st->ints_host,
			     sizeof(int32_t) * (size_t)n * (size_t)mo->seq_in);
		if (tp)
			rc = b->lm_head_loss_tp(&mo->shape, tp, n, pw,
						vptr(st, st->src_vb[k], in->s0, 0), st->ints_dev,
						scale, vptr(st, st->dst_vb[k], in->s0, 0), dp,
						scratch, &l);
		else
			l = b->lm_head_loss(&mo->shape, n, pw, vptr(st, st->src_vb[k], in->s0, 0),
					    st->ints_dev, scale, vptr(st, st->dst_vb[k], in->s0, 0),
					    dp, scratch);
		break;
	case COMP_CLASSIFIER:
		data_labels(st->ints_host, st->o.data, &st->p->model, st->o.seed, step, mo->task, op->node,
			    in->s0 + so, in->s1 + so);
		b->to_device(st->ints_dev, st->ints_host, sizeof(int32_t) * (size_t)n);
		l = b->classifier_loss(&mo->shape, n, mo->seq_in, pw,
				       vptr(st, st->src_vb[k], in->s0, 0), st->ints_dev, scale,
				       vptr(st, st->dst_vb[k], in->s0, 0), dp, scratch);
		break;
	case COMP_CONTRASTIVE: {
		const float *a = vptr(st, st->src_vb[k], 0, 0);
		float *da = vptr(st, st->dst_vb[k], 0, 0);
		int64_t w = mo->width_in;
		l = b->contrastive_loss(t->batch, w, mo->seq_in, mo->seq_in,
					st->p->model.comps[comp].temperature, in->s0, in->s1, a,
					a + w, scale, da, da + w, scratch);
		break;
	}
	default: break;
	}
	if (!tp || tp->rank == 0)
		st->loss[mo->task] += l;
	return rc;
}

int rt_exec_comm(rt_state_t *st, int k, sp_err_t *err)
{
	const sp_ins_t *in = &st->prog[k];
	const rt_backend_t *b = st->b;
	rt_comm_t *c = st->c;
	int rows = in->s1 - in->s0;
	if (in->op == INS_COPY) {
		const vbuf_t *s = &st->vb[st->src_vb[k]], *d = &st->vb[st->dst_vb[k]];
		b->copy_rows(vptr(st, st->dst_vb[k], in->s0, in->dst.seq_off),
			     (int64_t)d->seq * d->width, vptr(st, st->src_vb[k], in->s0, in->src.seq_off),
			     (int64_t)s->seq * s->width, rows, (int64_t)in->seq_len * s->width,
			     in->dst.grad);
		return 0;
	}
	if (in->op == INS_SEND) {
		const vbuf_t *s = &st->vb[st->src_vb[k]];
		int64_t cols = (int64_t)in->seq_len * s->width;
		float *stage = st->stage + st->stage_off[k];
		b->copy_rows(stage, cols, vptr(st, st->src_vb[k], in->s0, in->src.seq_off),
			     (int64_t)s->seq * s->width, rows, cols, 0);
		b->sync();
		rt_req_t r = {0};
		if (c->ops->isend(c, stage, sizeof(float) * (size_t)(rows * cols), in->peer, in->tag,
				  &r))
			return rt_fail(st, err, k, "send failed");
		return add_pending(st, r, k) ? rt_fail(st, err, k, "out of memory") : 0;
	}
	if (in->op == INS_RECV) {
		const vbuf_t *d = &st->vb[st->dst_vb[k]];
		int64_t cols = (int64_t)in->seq_len * d->width;
		rt_req_t r = {0};
		if (c->ops->irecv(c, st->rstage, sizeof(float) * (size_t)(rows * cols), in->peer,
				  in->tag, &r))
			return rt_fail(st, err, k, "receive failed");
		int rc = rt_wait_req(st, &r, k, err);
		if (rc)
			return rc;
		b->copy_rows(vptr(st, st->dst_vb[k], in->s0, in->dst.seq_off),
			     (int64_t)d->seq * d->width, st->rstage, cols, rows, cols, in->dst.grad);
		return 0;
	}
	if (in->op == INS_PGATHER || in->op == INS_PFREE)
		return rt_exec_zero3(st, k, err);
	if (in->op == INS_SYNC || in->op == INS_GATHER) {
		for (int i = 0; i < st->n_mb; i++)
			if (st->mb[i].bucket == in->peer) {
				mybucket_t *mb = &st->mb[i];
				rt_req_t r = {0};
				if (in->op == INS_GATHER) { /* exec_step started it */
					if (!mb->gstarted)
						return rt_fail(st, err, k, "a GATHER whose STEP did not run");
					mb->gstarted = 0;
					return 0;
				}
				/* zero-2: a bucket nothing wrote reduce-scatters zeros */
				int rc = mb->zero2 && !mb->full
						 ? rt_z2_alloc(st, mb, k, err)
						 : 0;
				if (rc)
					return rc;
				float *g = mb->zero2 ? mb->full : st->g + mb->goff;
				b->sync();
				int bad = mb->zero1 ? c->ops->ireduce_scatter(c, g, mb->n, mb->group, &r)
						    : c->ops->iallreduce(c, g, mb->n, mb->group, &r);
				if (bad)
					return rt_fail(st, err, k, "starting the collective failed");
				if (mb->zero2) { /* completed by rt_z2_finish */
					mb->req = r;
					mb->rs = 1;
					return 0;
				}
				return add_pending(st, r, k) ? rt_fail(st, err, k, "out of memory") : 0;
			}
		return rt_fail(st, err, k, "not a member of this sync bucket");
	}
	return 0;
}

/*
 * Lets outstanding sends and all-reduces progress between instructions.
 * MPI moves a large message only while the sender is inside MPI, so a rank
 * busy computing would otherwise hold its peer until its next transfer.
 */
int rt_poll_pending(rt_state_t *st, sp_err_t *err)
{
	if (st->n_dpend && rt_defer_poll(st, err))
		return err->code;
	for (int i = 0; i < st->n_pending;) {
		int done = 0;
		if (st->c->ops->test(st->c, &st->pending[i], &done))
			return rt_fail(st, err, st->pending_ins[i], "communication failed");
		if (done) {
			st->pending[i] = st->pending[--st->n_pending];
			st->pending_ins[i] = st->pending_ins[st->n_pending];
		} else {
			i++;
		}
	}
	return 0;
}

/* The optimizer on the elements of bucket mb the rank owns. */
static void step_bucket(rt_state_t *st, const mybucket_t *mb, int64_t t)
{
	const rt_backend_t *b = st->b;
	const sp_optim_t *o = &st->p->model.opt;
	int64_t off = mb->soff, n = mb->sn;
	float *g = mb->zero2 ? st->gs + mb->gsoff : st->g + mb->goff + (off - mb->off);
	if (n <= 0)
		return;
	float *w = mb->zero3 ? st->ws + mb->wsoff : st->w + mb->wc + (off - mb->off);
	if (o->kind == OPT_ADAMW)
		b->adamw_step(w, g, st->m + mb->moff, st->v + mb->moff, n, (int)t, o);
	else
		b->sgd_step(w, g, n, o);
}

/* Waits for every operation still in flight. */
int rt_drain(rt_state_t *st, sp_err_t *err)
{
	for (int i = 0; i < st->n_pending; i++) {
		int rc = rt_wait_req(st, &st->pending[i], st->pending_ins[i], err);
		if (rc)
			return rc;
	}
	st->n_pending = 0;
	return 0;
}

/*
 * STEP: the device's sync buckets one at a time, in the order of their
 * SYNCs (check_step made sure each is there once): wait for the bucket's
 * all-reduce (zero-1: reduce-scatter), then update the parameters the rank
 * owns, so the updates of early buckets overlap the collectives of later
 * ones (the optimizer is elementwise, so this equals one update of
 * everything); a zero-1/2 bucket's all-gather of its GATHER starts right
 * after its update (its shard is final then), beside the later updates:
 * the same all-gathers in the same order on every member as at the
 * GATHERs (SYNC order both), which then have nothing left to do. A
 * deferred bucket's all-gather (bucket defer) starts after the last
 * update instead, in pieces (defer.c rt_defer_start_all), the deferred
 * buckets in the reverse order of the SYNCs (on every member the same
 * order: the SYNC order reversed), and the step does not wait for them;
 * before its first update it waits for the pieces of the last step's
 * that no layer read (rt_defer_step_wait). Then the sends and
 * all-gathers still in flight.
 */
static int exec_step(rt_state_t *st, int64_t t, sp_err_t *err)
{
	int rc0 = rt_defer_step_wait(st, err); /* pieces no use read */
	if (rc0)
		return rc0;
	for (int q = 0; q < st->n_mb; q++) {
		mybucket_t *mb = &st->mb[st->step_order[q]];
		int rc = mb->rs ? rt_z2_finish(st, mb, err) : 0; /* zero-2: into the shard */
		if (rc)
			return rc;
		for (int j = 0; j < st->n_pending; j++)
			if (st->pending_ins[j] == mb->sync) {
				int rc = rt_wait_req(st, &st->pending[j], mb->sync, err);
				if (rc)
					return rc;
				st->pending[j] = st->pending[--st->n_pending];
				st->pending_ins[j] = st->pending_ins[st->n_pending];
				break;
			}
		step_bucket(st, mb, t);
		if (mb->gather >= 0 && !mb->defer) { /* its GATHER's all-gather, now */
			rt_req_t r = {0};
			st->b->sync();
			if (st->c->ops->iallgather(st->c, st->w + mb->wc, mb->n, mb->group, &r))
				return rt_fail(st, err, mb->gather, "starting the all-gather failed");
			if (add_pending(st, r, mb->gather))
				return rt_fail(st, err, mb->gather, "out of memory");
			mb->gstarted = 1;
		}
		if (rt_poll_pending(st, err))
			return err->code;
	}
	if (rt_defer_start_all(st, err)) /* the deferred ones, after the last update */
		return err->code;
	return rt_drain(st, err);
}

/* One run of the program: micro-step st->micro of step t (data step ds);
 * all but the last micro-step leave out SYNC, STEP and GATHER, and each
 * leaves out the instructions of tasks with no micro-batch left. */
static int micro_step(rt_state_t *st, int64_t t, int64_t ds, int last, sp_err_t *err)
{
	const rt_backend_t *b = st->b;
	for (int i = 0; i < st->nvb; i++)
		if (st->vb[i].g)
			b->zero(st->vals + st->vb[i].off,
				(int64_t)(st->vb[i].hi - st->vb[i].lo) * st->vb[i].seq * st->vb[i].width);
	for (int k = 0; k < st->n_ins; k++) {
		const sp_ins_t *in = &st->prog[k];
		double t0 = wall_ms();
		int rc = 0, comm = 0;
		st->tp_ms = 0;
		if (!last && (in->op == INS_SYNC || in->op == INS_STEP || in->op == INS_GATHER))
			continue;
		if (!plan_ins_active(st->p, in, st->micro))
			continue;
		if ((in->op == INS_BWD || in->op == INS_LOSS) && (rc = rt_z2_touch(st, k, err)))
			return rc;
		switch (in->op) {
		case INS_FWD: rc = rt_exec_fwd(st, k, ds, err); break;
		case INS_BWD: rc = exec_bwd(st, k, err); break;
		case INS_LOSS: rc = rt_exec_loss(st, k, ds, err); break;
		case INS_STEP:
			comm = 1;
			rc = exec_step(st, t, err);
			break;
		default:
			comm = 1;
			rc = rt_exec_comm(st, k, err);
			break;
		}
		if (rc)
			return rc;
		if (!comm)
			b->sync();
		event(st, t0, k, comm);
		if (!comm && rt_poll_pending(st, err))
			return err->code;
	}
	return rt_drain(st, err); /* the sends; last: the GATHERs' all-gathers */
}

int rt_step(rt_state_t *st, int64_t t, double *loss, sp_err_t *err)
{
	int k = st->p->microbatches, rc = 0;
	st->n_steps++;
	st->n_ev = 0;
	st->t_origin = wall_ms();
	st->b->zero(st->g, SP_MAX(st->n_g, 1));
	for (int i = 0; i < st->p->model.n_tasks; i++)
		st->loss[i] = 0;
	for (st->micro = 0; st->micro < k && !rc; st->micro++)
		rc = micro_step(st, t, st->o.data ? (t - 1) * k + st->micro + 1 : t,
				st->micro == k - 1, err);
	st->micro = 0;
	if (rc)
		return rc;
	for (int i = 0; i < st->p->model.n_tasks; i++)
		loss[i] += st->loss[i];
	return 0;
}
