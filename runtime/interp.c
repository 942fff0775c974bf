/*
 * interp.c — executes one rank's program of a plan through a backend. It
 * knows nothing about which backend runs it.
 *
 * Memory, one allocation per category (sizes fixed by the program):
 *   params   weights and gradients of every held layer, laid out bucket by
 *            bucket, so each sync bucket's are one contiguous range
 *            (all-reduced in place; zero-3 buckets' weights: the rank's
 *            shards, ws, and the pool they are gathered into, z3pool); AdamW m and v of the elements the rank
 *            owns in each bucket, bucket after bucket: all of a replicated
 *            bucket, the rank's shard of a zero-1/2 one (bucket_shard);
 *            zero-2 buckets' gradients as shards (gs) plus the pool their
 *            full gradients are placed in (z2pool: plan_zero2)
 *   acts     activations saved by each FWD until its BWD; a slice that
 *            recomputes keeps only each layer's input ([seq, hidden] per
 *            sample) and its BWD re-runs the layer's forward from it
 *   comm     value buffers: act/grad of each MetaOp boundary the rank
 *            touches, rows = samples of the union of its ranges, each row
 *            [seq, width] (a decoder's memory act/grad(m, -1): [mem_seq,
 *            mem_width]); plus staging for outgoing transfers
 *   work     ping-pong buffers between layers of a slice, loss scratch,
 *            generated input data, and the one layer's saved activations a
 *            recomputing BWD re-creates (the largest such layer's)
 * A step: zero gradients, then K times (the plan's microbatches) zero the
 * gradient values and run the program, the first K - 1 times without
 * SYNC, STEP and GATHER, so that gradients accumulate over the
 * micro-batches; sum the per-task losses. Task t has its own k_t <= K
 * (plan_task_k): micro-step i runs only the instructions of the tasks with
 * k_t > i (plan_ins_active; both ends of a transfer skip alone), so a
 * component shared by tasks sums its gradients over every task's
 * micro-batches before the last micro-step's SYNC. Micro-step i reads
 * samples [s0, s1) + i x the task's micro-batch of step t (synthetic
 * data), or step (t - 1) K + i + 1 of a dataset, whose steps are then
 * micro-steps (dataset.c: the samples of step t at positions i x B / k_t +
 * [s0, s1), B the task's step batch, as with one micro-batch).
 * SENDs and SYNCs are non-blocking and completed at STEP; RECVs and
 * completions are polled against the timeout.
 *
 * A decoder (a MetaOp whose shape has a memory, mem_seq > 0) runs the
 * cross-attention block (backend xblock_fwd/xblock_bwd): every FWD and BWD
 * of its slices reads act(m, -1) for its samples, which RECVs or COPYs
 * fill before the device's first FWD of m, and every BWD adds each layer's
 * gradient with respect to the memory into grad(m, -1), zeroed with the
 * other gradient values each micro-step and sent back (SEND or COPY to the
 * producer's output gradient) after the device's last BWD of m. A
 * recomputing BWD re-runs the block's forward with the same memory.
 *
 * A zero-1 bucket: SYNC starts the reduce-scatter of its gradients, which
 * leaves the sum over the rank's shard at the shard's own place in the
 * gradients (the rest of the bucket's gradients is then undefined); STEP
 * updates the shard's weights with the shard's m and v; GATHER starts the
 * all-gather of the weights, which rt_step completes before it returns,
 * unless the bucket is deferred (bucket defer): then it is started in
 * pieces after the STEP's last update and waited for in the next step
 * (defer.c owns the pieces; this file calls it at set-up, STEP, each
 * layer's use through rt_z3_need, and between instructions).
 *
 * A zero-2 bucket is not in the gradients allocation: its full gradient is
 * placed (zeroed) at its offset in the pool before the first instruction
 * writing into it and given back once its reduce-scatter completes, its
 * shard's sum copied to gs (the persistent gradient shards), from which
 * STEP updates the shard. A reduce-scatter started at SYNC completes at
 * the first later instruction that places another full gradient with the
 * bucket's safe point at or before it (plan_z2_safe: waiting there cannot
 * deadlock), else at STEP (zero.c rt_zero2_setup; plan_mem.c counts the same).
 * With k > 1 micro-batches the full gradients stay live across the
 * micro-steps.
 *
 * A zero-3 bucket: gradients and optimizer state as zero-2, and its
 * weights are not in w either: the rank keeps its shard of them (ws),
 * which STEP updates. A PGATHER opens a span to the next PFREE in which
 * the bucket's layers are gathered one at a time, in the order of
 * plan_z3_span (the members' common one), into one room of a pool
 * (z3pool, at the offset plan_z3_walk gives the PGATHER: nothing is
 * allocated mid-step), each by one all-gather of the members' parts of
 * the layer: the PGATHER gathers the first; as a layer starts to run, the
 * next one's gather starts into the room's other slot (plan_z3_room) and
 * its use waits for it (rt_z3_need, zero.c); the PFREE gathers the ones
 * its uses did not need,
 * so every member runs the same all-gathers in the same order; a span in
 * which some member has no use is gathered whole at the PGATHER. The
 * layers read them there (rt_wptr). PGATHER and PFREE run in every
 * micro-step.
 *
 * A tensor-parallel slice (tp = t > 1): the rank is member j of one of its
 * groups of t devices, holds shard j of each of the slice's layers
 * (layer_tensors_tp) and runs the split block, which all-reduces over the
 * group inside each layer (tp_allreduce: blocking, against the timeout).
 * The groups' communicators are created once, collectively, after the
 * sync buckets'. Checkpoints and exports stay whole (pack.c).
 *
 * An evaluation (rt_eval) runs the forward part of the same program only.
 *
 * This file sets a rank up (rt_create: the plan's parameters, buffers and
 * checks), evaluates and answers the accessors; exec.c runs the
 * instructions (FWD, BWD, LOSS, transfers and syncs, STEP, rt_step).
 */
#include "interp_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int find_vb(rt_state_t *st, const sp_vref_t *r, int32_t s0, int32_t s1, int create)
{
	for (int i = 0; i < st->nvb; i++)
		if (st->vb[i].m == r->metaop && st->vb[i].l == r->layer && st->vb[i].g == r->grad) {
			if (create) {
				st->vb[i].lo = SP_MIN(st->vb[i].lo, s0);
				st->vb[i].hi = SP_MAX(st->vb[i].hi, s1);
			}
			return i;
		}
	if (!create)
		return -1;
	vbuf_t v = {r->metaop, r->layer, r->grad, s0, s1, 0, 0, 0};
	plan_value_shape(st->p, r->metaop, r->layer, &v.seq, &v.width);
	int cap = st->nvb;
	vbuf_t *nv = realloc(st->vb, sizeof *nv * (size_t)(cap + 1));
	if (!nv)
		return -2;
	st->vb = nv;
	st->vb[st->nvb++] = v;
	return st->nvb - 1;
}

static int fail(rt_state_t *st, sp_err_t *err, int k, const char *what)
{
	const sp_ins_t *in = k >= 0 ? &st->prog[k] : NULL;
	if (!in)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "rank %d: %s", st->rank, what);
	return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
			  "rank %d: instruction %d (%s%s%d): %s", st->rank, k,
			  ins_op_name(in->op),
			  in->op == INS_SEND || in->op == INS_RECV ? " peer rank " : " ",
			  in->op == INS_SEND || in->op == INS_RECV	 ? in->peer
			  : in->op == INS_SYNC || in->op == INS_GATHER || in->op == INS_PGATHER ||
					  in->op == INS_PFREE
				  ? in->peer
								       : in->slice,
			  what);
}

/* Polls req until done or the timeout; names the rank, instruction, peer. */
static int wait_req(rt_state_t *st, rt_req_t *req, int k, sp_err_t *err)
{
	double deadline = wall_ms() + st->o.timeout_s * 1e3;
	struct timespec nap = {0, 20000};
	for (long spin = 0;; spin++) {
		int done = 0;
		if (st->c->ops->test(st->c, req, &done))
			return fail(st, err, k, "communication failed");
		if (done)
			return 0;
		if (wall_ms() > deadline) {
			char msg[160];
			const sp_ins_t *in = &st->prog[k];
			if (in->op == INS_RECV || in->op == INS_SEND)
				snprintf(msg, sizeof msg,
					 "timed out after %g s waiting for rank %d (tag %d)",
					 st->o.timeout_s, in->peer, in->tag);
			else if (in->op == INS_FWD || in->op == INS_BWD)
				snprintf(msg, sizeof msg,
					 "timed out after %g s waiting for the other members of "
					 "its tensor-parallel group of slice %d (a layer's "
					 "all-reduce)",
					 st->o.timeout_s, in->slice);
			else
				snprintf(msg, sizeof msg,
					 "timed out after %g s waiting for the members of sync "
					 "bucket %d",
					 st->o.timeout_s,
					 in->op == INS_SYNC || in->op == INS_GATHER ||
							 in->op == INS_PGATHER
						 ? in->peer
						 : -1);
			return fail(st, err, k, msg);
		}
		if (spin > 1000)
			nanosleep(&nap, NULL);
	}
}

int rt_fail(rt_state_t *st, sp_err_t *err, int k, const char *what)
{
	return fail(st, err, k, what);
}

int rt_wait_req(rt_state_t *st, rt_req_t *req, int k, sp_err_t *err)
{
	return wait_req(st, req, k, err);
}

/* ---- set-up ---- */

static int plan_params(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	const sp_model_t *md = &p->model;
	st->param_base = calloc((size_t)md->n_comps + 1, sizeof(int));
	if (!st->param_base)
		return SP_ENOMEM;
	for (int c = 0; c < md->n_comps; c++) {
		st->param_base[c] = st->n_params_total;
		st->n_params_total += comp_n_layers(&md->comps[c]);
	}
	st->slot = malloc(sizeof(int) * (size_t)(st->n_params_total + 1));
	st->held = calloc((size_t)st->dev->n_held + 1, sizeof *st->held);
	st->poff = calloc((size_t)st->dev->n_held + 1, sizeof(int64_t));
	st->pcount = calloc((size_t)st->dev->n_held + 1, sizeof(int64_t));
	st->pmb = calloc((size_t)st->dev->n_held + 1, sizeof(int));
	st->mb = calloc((size_t)p->n_buckets + 1, sizeof *st->mb);
	if (!st->slot || !st->held || !st->poff || !st->pcount || !st->mb || !st->pmb)
		return SP_ENOMEM;
	for (int i = 0; i < st->n_params_total; i++)
		st->slot[i] = -1;
	/* held params in bucket order: each bucket's gradients contiguous */
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		int member = 0;
		for (int q = 0; q < bk->n_dev; q++)
			member |= p->bucket_devs[bk->dev_off + q] == st->rank;
		if (!member)
			continue;
		mybucket_t *mb = &st->mb[st->n_mb++];
		mb->bucket = b;
		mb->off = st->n_w;
		mb->hfirst = st->n_held;
		mb->z3cur = mb->z3next = -1;
		for (int q = 0; q < bk->n_params; q++) {
			sp_param_t pr = p->bucket_params[bk->param_off + q];
			int id = st->param_base[pr.comp] + pr.layer;
			if (st->n_held >= st->dev->n_held || st->slot[id] >= 0)
				return SP_EINPUT;
			st->slot[id] = st->n_held;
			st->held[st->n_held] = pr;
			st->poff[st->n_held] = st->n_w;
			st->pcount[st->n_held] = comp_layer_params_tp(&md->comps[pr.comp], pr.tp);
			st->pmb[st->n_held] = st->n_mb - 1;
			st->n_w += st->pcount[st->n_held];
			st->n_held++;
		}
		mb->n = st->n_w - mb->off;
		int64_t so, sn;
		if (mb->n != bk->elems || bucket_shard(p, b, st->rank, &so, &sn) < 0)
			return SP_EINPUT;
		mb->zero1 = layout_sharded(bk->layout);
		mb->zero2 = layout_grads_sharded(bk->layout);
		mb->zero3 = bk->layout == LAYOUT_ZERO3;
		mb->soff = mb->off + so;
		mb->sn = sn;
		mb->moff = st->n_opt;
		st->n_opt += sn;
		if (mb->zero2) {
			mb->gsoff = st->n_gs;
			st->n_gs += sn;
		} else {
			mb->goff = st->n_g;
			st->n_g += mb->n;
		}
		if (mb->zero3) {
			mb->wsoff = st->n_ws;
			st->n_ws += sn;
		} else {
			mb->wc = st->n_wc;
			st->n_wc += mb->n;
		}
	}
	if (st->n_held != st->dev->n_held)
		return SP_EINPUT;
	return 0;
}

static int plan_buffers(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	int n = st->n_ins;
	st->src_vb = malloc(sizeof(int) * (size_t)(n + 1));
	st->dst_vb = malloc(sizeof(int) * (size_t)(n + 1));
	st->saved_off = malloc(sizeof(int64_t) * (size_t)(n + 1));
	st->stage_off = malloc(sizeof(int64_t) * (size_t)(n + 1));
	st->fwd_of = malloc(sizeof(int) * (size_t)(n + 1));
	st->mem_vb = malloc(sizeof(int) * (size_t)(n + 1));
	st->dmem_vb = malloc(sizeof(int) * (size_t)(n + 1));
	if (!st->src_vb || !st->dst_vb || !st->saved_off || !st->stage_off || !st->fwd_of ||
	    !st->mem_vb || !st->dmem_vb)
		return SP_ENOMEM;
	for (int k = 0; k < n; k++) {
		const sp_ins_t *in = &st->prog[k];
		st->src_vb[k] = st->dst_vb[k] = -1;
		st->saved_off[k] = st->stage_off[k] = -1;
		st->fwd_of[k] = -1;
		st->mem_vb[k] = st->dmem_vb[k] = -1;
		int32_t r0 = in->s0, r1 = in->s1;
		int use_src = 0, use_dst = 0;
		switch (in->op) {
		case INS_FWD: {
			const sp_slice_t *sl = &p->slices[in->slice];
			const sp_metaop_t *mo = mop(st, sl->metaop);
			int L = sl->layer_to - sl->layer_from;
			use_src = !(sl->layer_from == 0 && mo->width_in == 0);
			use_dst = 1;
			st->saved_off[k] = st->saved_n;
			st->saved_n += (int64_t)(in->s1 - in->s0) * kept_pp(st, sl) * L;
			if (sl->recompute)
				st->redo_n = SP_MAX(st->redo_n, (int64_t)(in->s1 - in->s0) *
									saved_pp(st, sl));
			int64_t per = SP_MAX((int64_t)mo->seq_in * mo->width_in,
					     (int64_t)mo->seq_out * mo->width_out);
			st->ping_n = SP_MAX(st->ping_n, per * (in->s1 - in->s0));
			if (mo->width_in == 0 && sl->layer_from == 0) {
				int64_t in_w = mo->shape.type == COMP_PATCH ? mo->shape.in : 0;
				st->feat_n = SP_MAX(st->feat_n, (int64_t)(in->s1 - in->s0) *
									 mo->seq_in * in_w);
				st->ints_n = SP_MAX(st->ints_n, (int64_t)(in->s1 - in->s0) * mo->seq_in);
			}
			break;
		}
		case INS_BWD: {
			const sp_slice_t *sl = &p->slices[in->slice];
			const sp_metaop_t *mo = mop(st, sl->metaop);
			use_src = 1;
			use_dst = !(sl->layer_from == 0 && mo->width_in == 0);
			/* its FWD ran the same samples: the BWD reads that FWD's
			 * saved block (and re-runs into scratch) sized by them */
			for (int j = 0; j < k; j++)
				if (st->prog[j].op == INS_FWD && st->prog[j].slice == in->slice &&
				    st->prog[j].s0 == in->s0 && st->prog[j].s1 == in->s1)
					st->fwd_of[k] = j;
			if (st->fwd_of[k] < 0)
				return SP_EINPUT;
			if (sl->tp > 1 && sl->sp)
				st->lnacc_n = SP_MAX(st->lnacc_n, (int64_t)(sl->layer_to - sl->layer_from) *
									  4 * mo->shape.hidden);
			break;
		}
		case INS_LOSS: {
			const sp_slice_t *sl = &p->slices[in->slice];
			const sp_metaop_t *mo = mop(st, sl->metaop);
			int64_t B = task_of(st, sl->metaop)->batch;
			use_src = use_dst = 1;
			int64_t rows = in->s1 - in->s0;
			if (mo->shape.type == COMP_CONTRASTIVE) {
				r0 = 0;
				r1 = (int32_t)B;
				rows = B;
			}
			st->loss_n = SP_MAX(st->loss_n, rows * saved_pp(st, sl));
			st->ints_n = SP_MAX(st->ints_n, (int64_t)(in->s1 - in->s0) * mo->seq_in);
			break;
		}
		case INS_SEND:
			use_src = 1;
			st->stage_off[k] = st->stage_n;
			break;
		case INS_RECV: use_dst = 1; break;
		case INS_COPY: use_src = use_dst = 1; break;
		default: break;
		}
		if (use_src && (st->src_vb[k] = find_vb(st, &in->src, r0, r1, 1)) < -1)
			return SP_ENOMEM;
		if (use_dst && (st->dst_vb[k] = find_vb(st, &in->dst, r0, r1, 1)) < -1)
			return SP_ENOMEM;
		/* a decoder's FWD reads its memory for its samples, its BWD also
		 * adds into the memory's gradient (the RECVs or COPYs before its
		 * first FWD fill the first, the SENDs or COPYs after its last BWD
		 * carry the second to the memory's producer) */
		if ((in->op == INS_FWD || in->op == INS_BWD) &&
		    is_decoder(st, p->slices[in->slice].metaop)) {
			sp_vref_t mv = {p->slices[in->slice].metaop, -1, 0, 0};
			if ((st->mem_vb[k] = find_vb(st, &mv, r0, r1, 1)) < -1)
				return SP_ENOMEM;
			mv.grad = 1;
			if (in->op == INS_BWD && (st->dmem_vb[k] = find_vb(st, &mv, r0, r1, 1)) < -1)
				return SP_ENOMEM;
		}
		if (in->op == INS_SEND || in->op == INS_RECV) {
			const sp_vref_t *r = in->op == INS_SEND ? &in->src : &in->dst;
			int32_t seq, width;
			plan_value_shape(p, r->metaop, r->layer, &seq, &width);
			int64_t fl = (int64_t)(in->s1 - in->s0) * in->seq_len * width;
			if (in->op == INS_SEND)
				st->stage_n += fl;
			else
				st->rstage_n = SP_MAX(st->rstage_n, fl);
		}
	}
	for (int i = 0; i < st->nvb; i++) {
		st->vb[i].off = st->vals_n;
		st->vals_n += (int64_t)(st->vb[i].hi - st->vb[i].lo) * st->vb[i].seq * st->vb[i].width;
	}
	st->work_n = 2 * st->ping_n + st->loss_n + st->feat_n + st->redo_n + st->lnacc_n;
	return 0;
}

static int alloc_all(rt_state_t *st)
{
	const rt_backend_t *b = st->b;
	int64_t nw = SP_MAX(st->n_wc, 1), nm = SP_MAX(st->n_opt, 1);
	st->w = b->alloc(sizeof(float) * (size_t)nw);
	st->ws = b->alloc(sizeof(float) * (size_t)SP_MAX(st->n_ws, 1));
	st->z3pool = b->alloc(sizeof(float) * (size_t)SP_MAX(st->z3_acct, 1));
	st->g = b->alloc(sizeof(float) * (size_t)SP_MAX(st->n_g, 1));
	st->gs = b->alloc(sizeof(float) * (size_t)SP_MAX(st->n_gs, 1));
	st->z2pool = b->alloc(sizeof(float) * (size_t)SP_MAX(st->z2_acct, 1));
	int adam = st->p->model.opt.kind == OPT_ADAMW;
	st->m = adam ? b->alloc(sizeof(float) * (size_t)nm) : NULL;
	st->v = adam ? b->alloc(sizeof(float) * (size_t)nm) : NULL;
	st->saved = b->alloc(sizeof(float) * (size_t)SP_MAX(st->saved_n, 1));
	st->vals = b->alloc(sizeof(float) * (size_t)SP_MAX(st->vals_n, 1));
	st->stage = b->alloc(sizeof(float) * (size_t)SP_MAX(st->stage_n, 1));
	st->rstage = b->alloc(sizeof(float) * (size_t)SP_MAX(st->rstage_n, 1));
	st->work = b->alloc(sizeof(float) * (size_t)SP_MAX(st->work_n, 1));
	st->ints_dev = b->alloc(sizeof(int32_t) * (size_t)SP_MAX(st->ints_n, 1));
	st->ints_host = malloc(sizeof(int32_t) * (size_t)SP_MAX(st->ints_n, 1));
	st->feat_host = malloc(sizeof(float) * (size_t)SP_MAX(st->feat_n, 1));
	st->loss = calloc((size_t)st->p->model.n_tasks + 1, sizeof(double));
	if (!st->w || !st->ws || !st->z3pool || !st->g || !st->gs || !st->z2pool || (adam && (!st->m || !st->v)) || !st->saved || !st->vals ||
	    !st->stage || !st->rstage || !st->work || !st->ints_dev || !st->ints_host ||
	    !st->feat_host || !st->loss)
		return SP_ENOMEM;
	if (b->reserve_params)
		b->reserve_params(st->w, nw);
	int64_t f = sizeof(float);
	/* weights (zero-3: the shards and the pool of gathered full weights),
	 * the gradients (zero-2/3: the shards and the pool of full gradients),
	 * the owned optimizer state */
	st->mem[MEM_PARAMS] = (st->n_wc + st->n_ws + st->z3_acct + st->n_g + st->n_gs + st->z2_acct) * f +
			      (adam ? st->n_opt * f * 2 : 0);
	st->mem[MEM_ACTS] = st->saved_n * f;
	st->mem[MEM_COMM] = (st->vals_n + st->stage_n + st->rstage_n) * f;
	st->mem[MEM_WORK] = st->work_n * f + st->ints_n * 4;
	return 0;
}

/* Whole layer records of held layer i (nw floats: w, then m, v when
 * present) to the rank's part: its shard of a tensor-parallel layer (in
 * out), or the record itself. Returns what to copy from. */
const float *rt_own_part(const rt_state_t *st, int i, const float *whole, int64_t nw,
			 int parts, float *out)
{
	const sp_param_t *pr = &st->held[i];
	if (pr->tp <= 1)
		return whole;
	for (int q = 0; q < parts; q++)
		layer_shard(&st->p->model.comps[pr->comp], pr->tp, pr->tp_rank,
			    (float *)(whole + q * nw), out + q * st->pcount[i], 0);
	return out;
}

float *rt_wptr(const rt_state_t *st, int i)
{
	const mybucket_t *mb = &st->mb[st->pmb[i]];
	int64_t rel = st->poff[i] - mb->off;
	if (mb->zero3)
		return !mb->wfull ? NULL
		       : mb->z3cur == -2 ? mb->wfull + rel
		       : mb->z3cur == i ? mb->z3w : NULL;
	return st->w + mb->wc + rel;
}

void rt_put_weights(rt_state_t *st, int i, const float *host)
{
	const mybucket_t *mb = &st->mb[st->pmb[i]];
	int64_t lo = st->poff[i], hi = lo + st->pcount[i];
	if (!mb->zero3) {
		st->b->to_device(rt_wptr(st, i), host, sizeof(float) * (size_t)(hi - lo));
		return;
	}
	/* the part of the layer in the rank's shard [soff, soff + sn) */
	int64_t a = SP_MAX(lo, mb->soff), z = SP_MIN(hi, mb->soff + mb->sn);
	if (z > a)
		st->b->to_device(st->ws + mb->wsoff + (a - mb->soff), host + (a - lo),
				 sizeof(float) * (size_t)(z - a));
}

static int init_params(rt_state_t *st)
{
	const sp_model_t *md = &st->p->model;
	for (int i = 0; i < st->n_held; i++) {
		int64_t nw = comp_layer_params(&md->comps[st->held[i].comp]);
		float *host = malloc(sizeof(float) * (size_t)SP_MAX(nw + st->pcount[i], 1));
		if (!host)
			return SP_ENOMEM;
		/* the whole layer, as every plan initialises it, then the shard */
		st->b->layer_init(host, &md->comps[st->held[i].comp], st->held[i].layer, st->o.seed);
		const float *mine = rt_own_part(st, i, host, nw, 1, host + nw);
		rt_put_weights(st, i, mine);
		free(host);
	}
	return 0;
}

/*
 * The step updates each bucket's parameters after that bucket's SYNC, so
 * the program must have one STEP and issue the SYNC of each of the
 * device's buckets exactly once before it (and none of another's): else a
 * bucket would be updated twice, or never. After the STEP come only
 * GATHERs, one for each of the device's zero-1 buckets (else a member's
 * weights would stay stale, or an all-gather would lack a member). Records
 * the order for the step.
 */
static int check_step(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	int steps = 0, n = 0, rc = 0, gathers = 0, zero1 = 0, last = -1;
	int *mb_of = malloc(sizeof(int) * (size_t)(p->n_buckets + 1));
	st->step_order = malloc(sizeof(int) * (size_t)(st->n_mb + 1));
	if (!mb_of || !st->step_order) {
		free(mb_of);
		return SP_ENOMEM;
	}
	for (int b = 0; b < p->n_buckets; b++)
		mb_of[b] = -1;
	for (int i = 0; i < st->n_mb; i++) {
		mb_of[st->mb[i].bucket] = i;
		st->mb[i].sync = st->mb[i].gather = -1;
		st->mb[i].gstarted = 0;
		zero1 += st->mb[i].zero1 && !st->mb[i].zero3;
	}
	for (int k = 0; k < st->n_ins && !rc; k++) {
		const sp_ins_t *in = &st->prog[k];
		if (in->op == INS_STEP) {
			steps++;
			last = k;
		} else if (in->op == INS_GATHER) {
			int i = mb_of[in->peer];
			if (!steps || i < 0 || !st->mb[i].zero1 || st->mb[i].zero3 ||
			    st->mb[i].gather >= 0)
				rc = SP_EINPUT; /* before the STEP, not ours, not zero-1/2, twice */
			else
				st->mb[i].gather = k;
			gathers++;
			last = k;
		} else if (steps) {
			rc = SP_EINPUT; /* only GATHERs follow the STEP */
		} else if (in->op == INS_SYNC) {
			int i = mb_of[in->peer]; /* peer < n_buckets: the reader checked it */
			if (i < 0 || st->mb[i].sync >= 0) {
				rc = SP_EINPUT; /* not this device's bucket, or twice */
			} else {
				st->mb[i].sync = k;
				st->step_order[n++] = i;
			}
		}
	}
	if (steps != 1 || last != st->n_ins - 1 || n != st->n_mb || gathers != zero1)
		rc = SP_EINPUT;
	free(mb_of);
	return rc;
}

/* Bytes a SEND or RECV moves: its samples' tokens of the value's width. */
static int64_t xfer_bytes(const sp_plan_t *p, const sp_ins_t *in)
{
	const sp_vref_t *r = in->op == INS_SEND ? &in->src : &in->dst;
	int32_t seq, width;
	plan_value_shape(p, r->metaop, r->layer, &seq, &width);
	return (int64_t)(in->s1 - in->s0) * in->seq_len * width * (int64_t)sizeof(float);
}

/*
 * Each RECV has its SEND (same tag, from its peer to this rank) of the same
 * size: the receive buffer is sized by the RECV, and a larger message would
 * overrun it. The reader checks each instruction alone, not the pairs.
 */
static int check_recvs(const rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	for (int k = 0; k < st->n_ins; k++) {
		const sp_ins_t *in = &st->prog[k];
		if (in->op != INS_RECV)
			continue;
		const sp_device_t *pd = &p->devices[in->peer];
		int found = 0;
		for (int j = pd->first_ins; j < pd->first_ins + pd->n_ins && !found; j++) {
			const sp_ins_t *sn = &p->ins[j];
			found = sn->op == INS_SEND && sn->tag == in->tag && sn->peer == st->rank;
			if (found && xfer_bytes(p, sn) != xfer_bytes(p, in))
				return SP_EINPUT;
		}
		if (!found)
			return SP_EINPUT;
	}
	return 0;
}

/*
 * The shards agree with the slices (the verifier's rules; a crafted plan
 * that breaks them would read past a shard or train wrong numbers): each
 * layer a FWD or BWD of the rank runs is held in its slice's split, shard
 * (t, the rank's member index) of a t-way slice, whole for t = 1; and
 * every split layer's t shards each sit in exactly one bucket (a
 * checkpoint joins them). SP_EINPUT with st->why.
 */
static int check_shards(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	for (int k = 0; k < st->n_ins; k++) {
		const sp_ins_t *in = &st->prog[k];
		if (in->op != INS_FWD && in->op != INS_BWD)
			continue;
		const sp_slice_t *sl = &p->slices[in->slice];
		int pos = -1;
		for (int q = 0; q < sl->n_dev && pos < 0; q++)
			if (p->slice_devs[sl->dev_off + q] == st->rank)
				pos = q;
		for (int l = sl->layer_from; l < sl->layer_to && pos >= 0; l++) {
			int comp, si = layer_slot(st, sl->metaop, l, &comp);
			if (si >= 0 && (st->held[si].tp != sl->tp ||
					st->held[si].tp_rank != (sl->tp > 1 ? pos % sl->tp : 0))) {
				snprintf(st->why, sizeof st->why,
					 "instruction %d runs slice %d split %d ways, but the rank "
					 "holds shard %d of %d of its layer %d",
					 k, in->slice, sl->tp, st->held[si].tp_rank, st->held[si].tp, l);
				return SP_EINPUT;
			}
		}
		if (pos < 0) {
			snprintf(st->why, sizeof st->why,
				 "instruction %d runs slice %d, which is not on this rank", k,
				 in->slice);
			return SP_EINPUT;
		}
	}
	/* every shard of a split layer in one bucket, all with one t */
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; q < p->buckets[b].n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[p->buckets[b].param_off + q];
			int t = -1, n = 0, all = 0;
			for (int b2 = 0; b2 < p->n_buckets; b2++)
				for (int q2 = 0; q2 < p->buckets[b2].n_params; q2++) {
					const sp_param_t *o = &p->bucket_params[p->buckets[b2].param_off + q2];
					if (o->comp != pr->comp || o->layer != pr->layer)
						continue;
					n += o->tp_rank == pr->tp_rank;
					all++;
					if (t >= 0 && o->tp != t)
						n = -1000;
					t = o->tp;
				}
			if (n != 1 || all != t) {
				snprintf(st->why, sizeof st->why,
					 "layer %d of component %d: shard %d is synced by %d buckets, "
					 "or its buckets disagree on the split (t shards, one bucket "
					 "each)",
					 pr->layer, pr->comp, pr->tp_rank, n < 0 ? 0 : n);
				return SP_EINPUT;
			}
		}
	return 0;
}

/* The first decoder MetaOp of p, or -1. */
static int first_decoder(const sp_plan_t *p)
{
	for (int m = 0; m < p->n_metaops; m++)
		if (p->metaops[m].shape.type == COMP_TRANSFORMER && p->metaops[m].shape.mem_seq > 0)
			return m;
	return -1;
}

int rt_check_backend(const sp_plan_t *p, const rt_backend_t *b, const char *fname,
		     sp_err_t *err)
{
	for (int s = 0; s < p->n_slices; s++) {
		const sp_metaop_t *mv = &p->metaops[p->slices[s].metaop];
		int ty = mv->shape.type;
		if (p->slices[s].tp <= 1 || (ty != COMP_EMBEDDING && ty != COMP_LM_HEAD) ||
		    (b->embedding_fwd_tp && b->embedding_bwd_tp && b->lm_head_loss_tp))
			continue;
		sp_err_set(err, SP_EINPUT, fname, 0, 0, NULL,
			   "the vocabulary-parallel %s is not built for the %s backend yet "
			   "(metaop '%s' is split %d ways)",
			   ty == COMP_EMBEDDING ? "embedding" : "LM head", b->name, mv->name,
			   (int)p->slices[s].tp);
		sp_err_hint(err, "run this plan with --backend cpu, or re-plan it with "
				 "--tp-vocab whole");
		return err->code;
	}
	for (int s = 0; s < p->n_slices && !b->seq_parallel; s++) {
		if (!p->slices[s].sp)
			continue;
		sp_err_set(err, SP_EINPUT, fname, 0, 0, NULL,
			   "sequence parallelism is not built for the %s backend yet (metaop "
			   "'%s' runs it on %d-way splits)",
			   b->name, p->metaops[p->slices[s].metaop].name, (int)p->slices[s].tp);
		sp_err_hint(err, "run this plan with --backend cpu, or re-plan it with --sp off");
		return err->code;
	}
	int m = first_decoder(p);
	if (m < 0 || (b->xblock_fwd && b->xblock_bwd))
		return 0;
	sp_err_set(err, SP_EINPUT, fname, 0, 0, NULL,
		   "cross-attention is not built for the %s backend yet (metaop '%s' is a "
		   "decoder)",
		   b->name, p->metaops[m].name);
	sp_err_hint(err, "run this plan with --backend cpu");
	return err->code;
}

/*
 * Decoders' slices are whole (tp 1): the cross-attention block is not
 * split (SP_EINPUT with st->why). The memory's shapes against the model
 * and the memory edges are the reader's (plan_check.c: chk_op_memory,
 * chk_memory_edge); the transfers' sizes check_recvs'.
 */
static int check_decoders(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	for (int s = 0; s < p->n_slices; s++)
		if (p->slices[s].tp > 1 && is_decoder(st, p->slices[s].metaop)) {
			snprintf(st->why, sizeof st->why,
				 "slice %d splits decoder metaop '%.120s' %d ways; cross-attention "
				 "layers are not split",
				 s, mop(st, p->slices[s].metaop)->name, p->slices[s].tp);
			return SP_EINPUT;
		}
	return 0;
}

/*
 * The communicators of the tensor-parallel groups: the plan's distinct
 * groups (plan_tp_groups: slice order, an equal group reusing the earlier
 * one's communicator), created on every rank (collective), after the sync
 * buckets' (cuda/comm_nccl.c counts on that order). Records, per slice,
 * the rank's group and member index.
 */
static int tp_groups(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	sp_tp_group_t *g = NULL;
	int32_t *at = NULL;
	int n = 0, *gid = NULL;
	st->tp_group = malloc(sizeof(int) * (size_t)(p->n_slices + 1));
	st->tp_rank = malloc(sizeof(int) * (size_t)(p->n_slices + 1));
	int rc = !st->tp_group || !st->tp_rank ? SP_ENOMEM : plan_tp_groups(p, &g, &n, &at);
	if (!rc && !(gid = malloc(sizeof(int) * (size_t)(n + 1))))
		rc = SP_ENOMEM;
	for (int q = 0; q < n && !rc; q++) {
		int ranks[64];
		if (g[q].t > 64) {
			rc = SP_EINPUT; /* the reader allows 64 at most */
			break;
		}
		for (int j = 0; j < g[q].t; j++)
			ranks[j] = p->slice_devs[g[q].off + j];
		if (st->c->ops->group_create(st->c, ranks, g[q].t, &gid[q]))
			rc = SP_EIO;
	}
	for (int k = 0; k < p->n_slices && !rc; k++) {
		const sp_slice_t *s = &p->slices[k];
		st->tp_group[k] = st->tp_rank[k] = -1;
		for (int i = 0; s->tp > 1 && i < s->n_dev; i++)
			if (p->slice_devs[s->dev_off + i] == st->rank && at[s->dev_off + i] >= 0) {
				st->tp_group[k] = gid[at[s->dev_off + i]];
				st->tp_rank[k] = i % s->tp;
			}
	}
	free(g);
	free(at);
	free(gid);
	return rc;
}

int rt_create(rt_state_t **out, const sp_plan_t *p, const rt_backend_t *b, rt_comm_t *c,
	      const rt_opts_t *o, sp_err_t *err)
{
	rt_state_t *st = calloc(1, sizeof *st);
	*out = NULL;
	if (!st)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	st->p = p;
	st->b = b;
	st->c = c;
	st->o = *o;
	st->rank = c->rank;
	st->dev = &p->devices[st->rank];
	st->prog = p->ins + st->dev->first_ins;
	st->n_ins = st->dev->n_ins;
	int rc = plan_params(st);
	if (!rc)
		rc = plan_buffers(st);
	/* transfer tags go to the transport as they are: they must fit it */
	for (int k = 0; !rc && k < st->n_ins; k++)
		if ((st->prog[k].op == INS_SEND || st->prog[k].op == INS_RECV) &&
		    st->prog[k].tag > c->tag_ub)
			rc = SP_EINPUT;
	if (!rc)
		rc = check_recvs(st);
	if (!rc)
		rc = check_step(st);
	if (!rc)
		rc = check_shards(st);
	if (!rc)
		rc = check_decoders(st);
	if (!rc)
		rc = rt_zero2_setup(st);
	if (!rc)
		rc = rt_zero3_setup(st);
	if (!rc)
		rc = rt_defer_setup(st);
	sp_err_t lacks = {0};
	if (!rc && rt_check_backend(p, b, NULL, &lacks)) {
		snprintf(st->why, sizeof st->why, "%.300s", lacks.msg);
		rc = SP_EINPUT;
	}
	if (!rc)
		rc = alloc_all(st);
	if (!rc)
		rc = init_params(st);
	/* every rank learns whether all could set up before any collective that
	 * a failed rank would never join */
	double bad[2] = {rc != 0, rc == SP_EINPUT};
	if (c->ops->allsum(c, bad, 2))
		bad[0] = 1;
	if (bad[0] > 0) {
		char why[sizeof st->why];
		memcpy(why, st->why, sizeof why);
		rt_free(st);
		if (rc == SP_EINPUT && why[0])
			return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "rank %d: %s", c->rank,
					  why);
		if (rc == SP_EINPUT)
			return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
					  "rank %d: the plan's parameters, buckets and programs do "
					  "not agree, or its transfer tags exceed the transport's "
					  "limit %d",
					  c->rank, c->tag_ub);
		if (rc)
			return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
					  "rank %d: out of memory allocating the plan's buffers",
					  c->rank);
		return sp_err_set(err, bad[1] > 0 ? SP_EINPUT : SP_ENOMEM, NULL, 0, 0, NULL,
				  "rank %d: another rank could not set up the plan",
				  c->rank);
	}
	/* sync groups: created collectively, in bucket order, on every rank */
	for (int bk = 0, mi = 0; bk < p->n_buckets; bk++) {
		const sp_bucket_t *bu = &p->buckets[bk];
		int *ranks = malloc(sizeof(int) * (size_t)(bu->n_dev + 1));
		if (!ranks) {
			rt_free(st);
			return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		}
		for (int q = 0; q < bu->n_dev; q++)
			ranks[q] = p->bucket_devs[bu->dev_off + q];
		int gid = -1;
		rc = c->ops->group_create(c, ranks, bu->n_dev, &gid);
		free(ranks);
		if (rc) {
			rt_free(st);
			return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
					  "rank %d: creating the group of sync bucket %d failed",
					  c->rank, bk);
		}
		if (mi < st->n_mb && st->mb[mi].bucket == bk)
			st->mb[mi++].group = gid;
	}
	if ((rc = tp_groups(st))) {
		rt_free(st);
		return sp_err_set(err, rc == SP_ENOMEM ? SP_ENOMEM : SP_EIO, NULL, 0, 0, NULL,
				  "rank %d: creating the tensor-parallel groups failed", c->rank);
	}
	*out = st;
	return 0;
}

void rt_free(rt_state_t *st)
{
	if (!st)
		return;
	const rt_backend_t *b = st->b;
	rt_defer_release(st);
	b->release(st->w);
	b->release(st->ws);
	b->release(st->z3pool);
	free(st->z3_at);
	for (int k = 0; st->z3_seq && k < st->n_ins; k++)
		free(st->z3_seq[k]);
	free(st->z3_seq);
	free(st->z3_seqn);
	free(st->z3_parts);
	b->release(st->g);
	b->release(st->gs);
	b->release(st->z2pool);
	free(st->pmb);
	free(st->z2_off);
	free(st->z2_list);
	b->release(st->m);
	b->release(st->v);
	b->release(st->saved);
	b->release(st->vals);
	b->release(st->stage);
	b->release(st->rstage);
	b->release(st->work);
	b->release(st->ints_dev);
	free(st->ints_host);
	free(st->feat_host);
	free(st->param_base);
	free(st->slot);
	free(st->held);
	free(st->poff);
	free(st->pcount);
	free(st->mb);
	free(st->step_order);
	free(st->vb);
	free(st->src_vb);
	free(st->dst_vb);
	free(st->saved_off);
	free(st->stage_off);
	free(st->fwd_of);
	free(st->mem_vb);
	free(st->dmem_vb);
	free(st->pending);
	free(st->pending_ins);
	free(st->loss);
	free(st->ev);
	free(st->tp_group);
	free(st->tp_rank);
	free(st);
}

/* ---- held-out evaluation ---- */

/* Whether candidate j is a right answer for query i of a contrastive
 * batch: j is i's partner, or a duplicate of one side of the pair (the
 * loss's inputs a_j, b_j are bit-identical to a_i, b_i: identical samples
 * through the same weights), since no model can tell duplicates apart. */
static int same_pair(const float *a, const float *b, int64_t ld, int64_t w, int64_t i,
		     int64_t j)
{
	size_t row = sizeof(float) * (size_t)w;
	return i == j || !memcmp(a + i * ld, a + j * ld, row) ||
	       !memcmp(b + i * ld, b + j * ld, row);
}

/* Index of the largest of x[0], x[step], ... x[(n-1) step]; the first on ties. */
static int64_t argmax(const float *x, int64_t n, int64_t step)
{
	int64_t best = 0;
	for (int64_t j = 1; j < n; j++)
		if (x[j * step] > x[best * step])
			best = j;
	return best;
}

/*
 * Scores LOSS instruction k, just run, into acc[task * EV__COUNT + EV_*]:
 * classifier: argmax of the logits against the label (chance 1/C);
 * contrastive: top-1 retrieval in both directions for the rows [s0, s1)
 * among the whole batch (chance: the right answers over B, see
 * same_pair). The logits are recomputed by the CPU reference (layers.c)
 * from host copies of the loss's inputs, as the loss computed them; the
 * labels are those exec_loss left in ints_host.
 */
static int score_loss(rt_state_t *st, int k, double *acc)
{
	const sp_ins_t *in = &st->prog[k];
	const sp_slice_t *sl = &st->p->slices[in->slice];
	const sp_metaop_t *mo = mop(st, sl->metaop);
	const sp_task_t *t = task_of(st, sl->metaop);
	const vbuf_t *v = &st->vb[st->src_vb[k]];
	int64_t n = in->s1 - in->s0, ld = (int64_t)v->seq * v->width, h = mo->shape.hidden;
	int comp, kind = mo->shape.type;
	int si = layer_slot(st, sl->metaop, 0, &comp);
	double *e = acc + mo->task * EV__COUNT;
	if (st->tp_rank[in->slice] > 0)
		return 0; /* a split loss's samples count on member 0 */
	e[EV_SAMPLES] += (double)n;
	if (kind != COMP_CLASSIFIER && kind != COMP_CONTRASTIVE)
		return 0;
	int64_t rows = kind == COMP_CONTRASTIVE ? t->batch : n;
	int64_t B = t->batch, w = mo->width_in, C = mo->shape.classes;
	int64_t np = si >= 0 ? st->pcount[si] : 0;
	int64_t scratch = kind == COMP_CONTRASTIVE ? 2 * B * (w + 1) + B * B : n * (2 * h + 2 + C);
	float *x = malloc(sizeof(float) * (size_t)(rows * ld + np + scratch + 1));
	if (!x)
		return SP_ENOMEM;
	float *pw = x + rows * ld, *sv = pw + np;
	st->b->to_host(x, vptr(st, st->src_vb[k], kind == COMP_CONTRASTIVE ? 0 : in->s0, 0),
		       sizeof(float) * (size_t)(rows * ld));
	if (np)
		st->b->to_host(pw, rt_wptr(st, si), sizeof(float) * (size_t)np);
	if (kind == COMP_CLASSIFIER) {
		classifier_logits(&mo->shape, (int)n, mo->seq_in, pw, x, sv);
		for (int64_t i = 0; i < n; i++) {
			int32_t y = st->ints_host[i];
			if (y < 0)
				continue;
			e[EV_HITS] += argmax(sv + i * (2 * h + 2 + C) + 2 * h + 2, C, 1) == y;
			e[EV_TRIALS] += 1;
			e[EV_CHANCE] += 1.0 / (double)C;
		}
	} else {
		const float *S = sv + 2 * B * (w + 1);
		contrastive_scores(B, w, mo->seq_in, mo->seq_in,
				   st->p->model.comps[comp].temperature, x, x + w, sv);
		for (int64_t i = in->s0; i < in->s1; i++) {
			int64_t right = 0;
			for (int64_t j = 0; j < B; j++)
				right += same_pair(x, x + w, ld, w, i, j);
			e[EV_HITS] += same_pair(x, x + w, ld, w, i, argmax(S + i * B, B, 1)) +
				      same_pair(x, x + w, ld, w, i, argmax(S + i, B, B));
			e[EV_TRIALS] += 2;
			e[EV_CHANCE] += 2.0 * (double)right / (double)B;
		}
	}
	free(x);
	return 0;
}

/*
 * The forward part of the program on step `step` of ds: FWD, LOSS and the
 * transfers of values (not of gradients) of the tasks active in the
 * micro-step the step is ((step - 1) mod K); BWD, SYNC, STEP, GATHER are
 * training's. The losses still write gradients, which the next rt_step
 * zeroes before use. Sends are completed before returning; no events are
 * recorded (rt_events keeps the last training step's).
 */
int rt_eval(rt_state_t *st, const rt_dataset_t *ds, int64_t step, double *acc, sp_err_t *err)
{
	const rt_dataset_t *train = st->o.data;
	int T = st->p->model.n_tasks, rc = 0;
	memset(acc, 0, sizeof(double) * (size_t)T * EV__COUNT);
	for (int i = 0; i < T; i++)
		st->loss[i] = 0;
	if ((rc = rt_settle(st, err))) /* the weights read: whole */
		return rc;
	st->o.data = ds;
	int micro = (int)((step - 1) % SP_MAX(st->p->microbatches, 1));
	for (int k = 0; k < st->n_ins && !rc; k++) {
		const sp_ins_t *in = &st->prog[k];
		if (!plan_ins_active(st->p, in, micro))
			continue;
		switch (in->op) {
		case INS_FWD: rc = rt_exec_fwd(st, k, step, err); break;
		case INS_LOSS:
			if ((rc = rt_z2_touch(st, k, err)))
				break;
			rc = rt_exec_loss(st, k, step, err);
			if (!rc && score_loss(st, k, acc))
				rc = fail(st, err, k, "out of memory");
			rt_z2_drop(st); /* nobody reads an evaluation's gradients */
			break;
		case INS_SEND:
		case INS_COPY:
			if (!in->src.grad)
				rc = rt_exec_comm(st, k, err);
			break;
		case INS_RECV:
			if (!in->dst.grad)
				rc = rt_exec_comm(st, k, err);
			break;
		case INS_PGATHER: /* every member runs them all: collectives */
		case INS_PFREE: rc = rt_exec_comm(st, k, err); break;
		default: break;
		}
		st->b->sync();
		if (!rc)
			rc = rt_poll_pending(st, err);
	}
	if (!rc)
		rc = rt_drain(st, err);
	st->n_pending = 0;
	st->o.data = train;
	for (int i = 0; i < T; i++)
		acc[i * EV__COUNT + EV_LOSS] = st->loss[i];
	return rc;
}

void rt_memory(const rt_state_t *st, int64_t out[MEM__COUNT])
{
	memcpy(out, st->mem, sizeof(int64_t) * MEM__COUNT);
}

const rt_event_t *rt_events(const rt_state_t *st, int *n)
{
	*n = st->n_ev;
	return st->ev;
}
