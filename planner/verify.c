/*
 * verify.c — the plan's safety check, run on every plan before it is
 * written. It executes all programs together (no timing, only data) and
 * rejects, naming device, instruction and defect:
 *   deadlock              no device can make progress before all finish
 *   unmatched transfer    a SEND never received / RECV with no SEND / a tag
 *                         used twice
 *   size mismatch         the two ends of a transfer disagree on samples,
 *                         tokens or peers
 *   transfer between      a SEND of one task's value received into
 *   tasks                 another's (a micro-step that runs one task and
 *                         not the other would leave it unmatched)
 *   missing parameters    FWD/BWD/LOSS of a layer the device does not hold
 *   missing input         a value read before all of it was written (FWD
 *                         input, BWD output gradient, SEND/COPY source), a
 *                         BWD without its FWD's saved activations, or a
 *                         value written twice
 *   missing gradient      a parameter's gradient contributions do not add up
 *   contribution          to its task's full batch for every use, or come
 *                         from a device outside its sync group, or a device
 *                         does not issue each of its buckets' all-reduces
 *                         exactly once
 *   out of memory         predicted peak above the cap
 *   tensor parallelism    a slice's group of tp devices spans nodes, the
 *                         slices of one (comp, layer) differ in tp, a
 *                         device runs a slice without holding shard
 *                         (tp, its member index) of its layers, or a
 *                         bucket mixes shards or misstates its elems
 *   missing memory, ...   a decoder's memory act(c, -1) or its gradient
 *                         grad(c, -1) out of order (verify_mem.c)
 *   zero-2                a gradient written after its bucket's SYNC freed
 *                         it; an allocation waits for the device's zero-2
 *                         reduce-scatters in flight (verify_zero2.c)
 *   deferred all-gather   a bucket's defer flag set where no all-gather
 *                         follows the STEP (not zero-1/2); a deferred
 *                         bucket keeps its GATHER after the STEP like any
 *                         zero-1/2 bucket (check_step_tail)
 *   zero-3                weights of a zero-3 bucket used before their
 *                         PGATHER or after their PFREE; a PGATHER is a
 *                         rendezvous of the bucket's group (verify_zero3.c)
 * With micro-batches per task the programs run once per distinct set of
 * active tasks (plan_micro_next: micro-step j runs the tasks with more
 * than j micro-batches, plan_ins_active), each run from scratch with
 * every check, SYNC, STEP and GATHER included, as the last micro-step runs
 * them: the earlier micro-steps of a set leave those out, which only
 * removes waits, so they cannot deadlock where the last does not. A
 * task's parameters get its whole (micro-)batch in every micro-step it
 * runs in, none in the others. Memory is checked once: micro-step 0 runs
 * every task.
 * A tensor-parallel group's FWD/BWD is a rendezvous (its all-reduces run
 * inside), and so is a split LM head's LOSS (vocabulary parallel): a
 * member runs it only once every member of the group has reached it, so
 * members that order them differently deadlock here and are named.
 * It is written independently of lower.c: it trusts only the plan. Its
 * working memory is one local arena, released at its single exit.
 */
#include "verify.h"

#include <stdarg.h>

int verify_vfail(vstate_t *st, int d, int k, const char *fmt, va_list ap)
{
	char msg[400];
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	if (st->micro && n >= 0 && n < (int)sizeof msg) /* the tasks of a later micro-step */
		snprintf(msg + n, sizeof msg - (size_t)n, " (in micro-step %d, the tasks with more "
							  "micro-batches only)",
			 st->micro);
	if (d >= 0 && k >= 0)
		return sp_err_set(st->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "plan verification failed: device %d instruction %d (%s): %s",
				  d, k, ins_op_name(st->p->ins[st->p->devices[d].first_ins + k].op),
				  msg);
	return sp_err_set(st->err, SP_EINTERNAL, NULL, 0, 0, NULL,
			  "plan verification failed: %s", msg);
}

int verify_fail(vstate_t *st, int d, int k, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = verify_vfail(st, d, k, fmt, ap);
	va_end(ap);
	return rc;
}

int64_t verify_batch(const sp_plan_t *p, int m)
{
	return p->model.tasks[p->metaops[m].task].batch;
}

vbuf_t *verify_value(vstate_t *st, int d, const sp_vref_t *r)
{
	dstate_t *ds = &st->ds[d];
	for (int i = 0; i < ds->nv; i++)
		if (ds->v[i].m == r->metaop && ds->v[i].l == r->layer && ds->v[i].g == r->grad)
			return &ds->v[i];
	vbuf_t nb = {r->metaop, r->layer, r->grad, {0}};
	if (sp_arena_grow(&st->arena, (void **)&ds->v, &ds->capv, ds->nv + 1, sizeof *ds->v))
		return NULL;
	ds->v[ds->nv] = nb;
	return &ds->v[ds->nv++];
}

/* The memory act(m, -1) has mem_seq tokens per sample (its gradient is
 * counted in layers: verify_mem.c). */
int32_t verify_expected(const sp_plan_t *p, const sp_vref_t *r)
{
	const sp_metaop_t *m = &p->metaops[r->metaop];
	if (r->layer < 0)
		return (int32_t)m->shape.mem_seq;
	if (!r->grad || r->layer < m->n_layers)
		return r->layer == 0 ? m->seq_in : m->seq_out;
	int32_t sum = 0; /* grad of the output: one piece per consumer edge */
	for (int e = 0; e < p->n_edges; e++)
		if (p->edges[e].src == r->metaop)
			sum += p->edges[e].seq_len;
	return sum;
}

static int check_complete(vstate_t *st, int d, int k, const sp_vref_t *r, int32_t s0,
			  int32_t s1, const char *what)
{
	vbuf_t *v = verify_value(st, d, r);
	if (!v)
		return SP_ENOMEM;
	int32_t want = verify_expected(st->p, r);
	for (int32_t s = s0, n, e; s < s1; s = e) {
		e = vcounts_piece(&v->cnt, s, s1, &n);
		if (n != want)
			return verify_fail(st, d, k,
				    "missing input: %s of '%s' sample %d has %d of %d tokens",
				    what, st->p->metaops[r->metaop].name, (int)s, (int)n,
				    (int)want);
	}
	return 0;
}

int verify_write(vstate_t *st, int d, int k, const sp_vref_t *r, int32_t s0, int32_t s1,
		 int32_t tokens)
{
	vbuf_t *v = verify_value(st, d, r);
	if (!v)
		return SP_ENOMEM;
	int32_t want = verify_expected(st->p, r);
	if (vcounts_add(&st->arena, &v->cnt, s0, s1, tokens))
		return SP_ENOMEM;
	for (int32_t s = s0, n, e; s < s1; s = e) {
		e = vcounts_piece(&v->cnt, s, s1, &n);
		if (n > want)
			return verify_fail(st, d, k,
				    "missing input: value of '%s' sample %d written twice "
				    "(%d tokens)",
				    st->p->metaops[r->metaop].name, (int)s, (int)n);
	}
	return 0;
}

/* Checks parameters and records gradient contributions of a compute ins
 * of member j of its slice's group (a shard's contributions count toward
 * that shard: each shard of a layer gets the whole batch). */
static int check_params(vstate_t *st, int d, int k, const sp_ins_t *in, int j)
{
	const sp_plan_t *p = st->p;
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *m = &p->metaops[sl->metaop];
	const sp_device_t *dv = &p->devices[d];
	const sp_task_t *t = &p->model.tasks[m->task];
	for (int l = sl->layer_from; l < sl->layer_to; l++) {
		const sp_op_t *op = &p->ops[m->first_op + l];
		int comp = t->nodes[op->node].comp;
		if (p->model.comps[comp].type == COMP_CONTRASTIVE)
			continue;
		int held = 0, whole = 0;
		for (int q = 0; q < dv->n_held && !held; q++) {
			const sp_param_t *h = &p->held[dv->held_off + q];
			whole |= h->comp == comp && h->layer == op->layer;
			held = whole && h->tp == sl->tp && h->tp_rank == j;
		}
		if (!held)
			return verify_fail(st, d, k,
				    "missing parameters: '%s' layer %d%s is not held here",
				    p->model.comps[comp].name, (int)op->layer,
				    whole ? " (shard of the slice's tp and this member)" : "");
		if (in->op == INS_FWD)
			continue;
		if (j == 0)
			st->contrib[m->first_op + l] += in->s1 - in->s0;
		int b = st->bucket_of_param[(st->param_base[comp] + op->layer) * SP_MAX_TP + j];
		int member = 0;
		if (b >= 0)
			for (int q = 0; q < p->buckets[b].n_dev; q++)
				member |= p->bucket_devs[p->buckets[b].dev_off + q] == d;
		if (!member)
			return verify_fail(st, d, k,
				    "missing gradient contribution: gradients of '%s' layer %d "
				    "computed here are not in its sync group",
				    p->model.comps[comp].name, (int)op->layer);
	}
	return 0;
}

static int exec(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	int rc = 0;
	if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) {
		const sp_slice_t *sl = &p->slices[in->slice];
		const sp_metaop_t *m = &p->metaops[sl->metaop];
		int n_slot = -1;
		for (int q = 0; q < sl->n_dev; q++)
			if (p->slice_devs[sl->dev_off + q] == d)
				n_slot = q;
		int32_t a, b;
		if (n_slot >= 0) /* its group's range */
			sample_range(verify_batch(p, sl->metaop), n_slot / sl->tp,
				     sl->n_dev / sl->tp, &a, &b);
		if (n_slot < 0 || a != in->s0 || b != in->s1)
			return verify_fail(st, d, k, "size mismatch: samples [%d, %d) are not this "
					      "device's range of the slice",
				    (int)in->s0, (int)in->s1);
		if ((rc = check_params(st, d, k, in, n_slot % sl->tp)) ||
		    (in->op != INS_LOSS && (rc = vmem_compute(st, d, k, in))))
			return rc;
		if (in->op == INS_FWD) {
			sp_vref_t src = {sl->metaop, sl->layer_from, 0, 0};
			sp_vref_t dst = {sl->metaop, sl->layer_to, 0, 0};
			if (!(sl->layer_from == 0 && m->width_in == 0) &&
			    (rc = check_complete(st, d, k, &src, in->s0, in->s1, "input")))
				return rc;
			dstate_t *ds = &st->ds[d];
			if (sp_arena_grow(&st->arena, (void **)&ds->sv, &ds->caps, ds->ns + 1,
					  sizeof *ds->sv))
				return SP_ENOMEM;
			ds->sv[ds->ns++] = (saved_t){in->slice, in->s0, in->s1};
			return verify_write(st, d, k, &dst, in->s0, in->s1, m->seq_out);
		}
		if (in->op == INS_LOSS) {
			sp_vref_t src = {sl->metaop, 0, 0, 0}, dst = {sl->metaop, 0, 1, 0};
			int32_t r0 = in->s0, r1 = in->s1;
			if (m->shape.type == COMP_CONTRASTIVE) {
				r0 = 0;
				r1 = (int32_t)verify_batch(p, sl->metaop);
			}
			if ((rc = check_complete(st, d, k, &src, r0, r1, "loss input")))
				return rc;
			return verify_write(st, d, k, &dst, in->s0, in->s1, m->seq_in);
		}
		/* BWD */
		sp_vref_t g = {sl->metaop, sl->layer_to, 1, 0};
		sp_vref_t gd = {sl->metaop, sl->layer_from, 1, 0};
		int found = 0;
		for (int q = 0; q < st->ds[d].ns && !found; q++)
			found = st->ds[d].sv[q].slice == in->slice && st->ds[d].sv[q].s0 == in->s0 &&
				st->ds[d].sv[q].s1 == in->s1;
		if (!found)
			return verify_fail(st, d, k, "missing input: backward of slice %d without its "
					      "forward's saved activations",
				    (int)in->slice);
		if ((rc = check_complete(st, d, k, &g, in->s0, in->s1, "output gradient")))
			return rc;
		if (sl->layer_from == 0 && m->width_in == 0)
			return 0; /* source: no input gradient */
		return verify_write(st, d, k, &gd, in->s0, in->s1,
				    sl->layer_from == 0 ? m->seq_in : m->seq_out);
	}
	int done = 0; /* a memory gradient: verify_mem.c's alone */
	if ((rc = vmem_xfer(st, d, k, in, &done)) || done)
		return rc;
	if (in->op == INS_SEND || in->op == INS_COPY)
		if ((rc = check_complete(st, d, k, &in->src, in->s0, in->s1,
					 in->op == INS_SEND ? "sent value" : "copied value")))
			return rc;
	if (in->op == INS_COPY || in->op == INS_RECV)
		return verify_write(st, d, k, &in->dst, in->s0, in->s1, in->seq_len);
	return 0;
}

static int verify_alloc(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	sp_arena_t *a = &st->arena;
	size_t N = (size_t)p->n_devices + 1, tags;
	/* tags number transfers, each a SEND or a COPY: below the instruction
	 * count (which keeps the per-tag arrays the plan's size; a plan file
	 * may say anything up to INT32_MAX) */
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			if (in->op != INS_SEND && in->op != INS_RECV)
				continue;
			if (in->tag >= p->n_ins)
				return verify_fail(st, d, k,
					    "unmatched transfer: tag %d, but a plan of %d "
					    "instructions has fewer transfers",
					    (int)in->tag, (int)p->n_ins);
			st->max_tag = SP_MAX(st->max_tag, in->tag + 1);
		}
	st->param_base = sp_arena_calloc(a, (size_t)p->model.n_comps + 1, sizeof(int));
	if (!st->param_base)
		return SP_ENOMEM;
	for (int c = 0; c < p->model.n_comps; c++) {
		st->param_base[c] = st->n_params;
		st->n_params += p->model.comps[c].type == COMP_TRANSFORMER
					? (int)p->model.comps[c].layers
					: 1;
	}
	tags = (size_t)st->max_tag + 1;
	st->ds = sp_arena_calloc(a, N, sizeof *st->ds);
	st->bucket_of_param =
		sp_arena_calloc(a, (size_t)st->n_params * SP_MAX_TP + 1, sizeof(int));
	st->layer_tp = sp_arena_calloc(a, (size_t)st->n_params + 1, sizeof(int));
	st->arrived = sp_arena_calloc(a, (size_t)p->n_slice_devs * 2 + 1, sizeof(int));
	st->rounds = sp_arena_calloc(a, (size_t)p->n_slice_devs * 2 + 1, sizeof(int));
	st->at_rdv = sp_arena_calloc(a, (size_t)p->n_ins + 1, sizeof(int));
	st->pc = sp_arena_calloc(a, N, sizeof(int));
	st->send_of = sp_arena_calloc(a, tags, sizeof(int));
	st->sent = sp_arena_calloc(a, tags, 1);
	st->recvd = sp_arena_calloc(a, tags, 1);
	st->issued = sp_arena_calloc(a, (size_t)p->n_buckets + 1, sizeof(int));
	st->contrib = sp_arena_calloc(a, (size_t)p->n_ops + 1, sizeof(int64_t));
	if (!st->ds || !st->bucket_of_param || !st->pc || !st->send_of || !st->sent ||
	    !st->recvd || !st->issued || !st->contrib || !st->layer_tp || !st->arrived ||
	    !st->rounds || !st->at_rdv)
		return SP_ENOMEM;
	for (int q = 0; q < st->n_params * SP_MAX_TP; q++)
		st->bucket_of_param[q] = -1;
	for (int t = 0; t <= st->max_tag; t++)
		st->send_of[t] = -1;
	return 0;
}

/* Each parameter shard's bucket; a shard in two buckets is a defect, and
 * so is a bucket that mixes shard specs or misstates its elems. */
static int index_buckets(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		int64_t elems = 0;
		for (int q = 0; q < bk->n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[bk->param_off + q];
			const sp_param_t *p0 = &p->bucket_params[bk->param_off];
			int key = (st->param_base[pr->comp] + pr->layer) * SP_MAX_TP + pr->tp_rank;
			if (pr->tp != p0->tp || pr->tp_rank != p0->tp_rank)
				return verify_fail(st, -1, -1, "tensor parallelism: sync bucket %d mixes "
							"shard %d of %d and shard %d of %d",
					    b, (int)p0->tp_rank, (int)p0->tp, (int)pr->tp_rank,
					    (int)pr->tp);
			if (st->bucket_of_param[key] >= 0)
				return verify_fail(st, -1, -1, "missing gradient contribution: '%s' layer "
							"%d is in two sync buckets",
					    p->model.comps[pr->comp].name, (int)pr->layer);
			st->bucket_of_param[key] = b;
			elems += comp_layer_params_tp(&p->model.comps[pr->comp], pr->tp);
		}
		if (elems != bk->elems)
			return verify_fail(st, -1, -1, "tensor parallelism: sync bucket %d says %lld "
						"elements, its parameter shards have %lld",
				    b, (long long)bk->elems, (long long)elems);
	}
	return 0;
}

/* Groups of a tensor-parallel slice lie in one node; every slice over a
 * (comp, layer) has the same tp (one sharding per layer). */
static int check_tp(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	for (int s = 0; s < p->n_slices; s++) {
		const sp_slice_t *sl = &p->slices[s];
		const int32_t *dv = p->slice_devs + sl->dev_off;
		for (int k = 0; k < sl->n_dev; k++) {
			int lead = dv[k - k % sl->tp];
			if (p->devices[dv[k]].node != p->devices[lead].node)
				return verify_fail(st, -1, -1, "tensor parallelism: group %d of slice %d "
							"spans nodes %d and %d (devices %d, %d)",
					    k / sl->tp, s, (int)p->devices[lead].node,
					    (int)p->devices[dv[k]].node, (int)lead, (int)dv[k]);
		}
		const sp_metaop_t *m = &p->metaops[sl->metaop];
		for (int l = sl->layer_from; l < sl->layer_to; l++) {
			const sp_op_t *op = &p->ops[m->first_op + l];
			int comp = p->model.tasks[m->task].nodes[op->node].comp;
			int *t = &st->layer_tp[st->param_base[comp] + op->layer];
			if (*t && *t != sl->tp)
				return verify_fail(st, -1, -1, "tensor parallelism: '%s' layer %d is split "
							"%d ways in slice %d and %d ways in another "
							"(one sharding per layer)",
					    p->model.comps[comp].name, (int)op->layer, (int)sl->tp,
					    s, *t);
			*t = sl->tp;
		}
	}
	return 0;
}

/* 1 when device d is a member of bucket bk. */
static int bucket_member(const sp_plan_t *p, int b, int d)
{
	int64_t off, n; /* bucket devices are ascending: a binary search */
	return bucket_shard(p, b, d, &off, &n) >= 0;
}

/* Every holder of a parameter is in its bucket, and only holders. */
static int check_sync_groups(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		for (int q = 0; q < bk->n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[bk->param_off + q];
			for (int d = 0; d < p->n_devices; d++) {
				const sp_device_t *dv = &p->devices[d];
				int holds = 0, member = bucket_member(p, b, d);
				for (int h = 0; h < dv->n_held && !holds; h++) {
					const sp_param_t *x = &p->held[dv->held_off + h];
					holds = x->comp == pr->comp && x->layer == pr->layer &&
						x->tp == pr->tp && x->tp_rank == pr->tp_rank;
				}
				if (holds != member)
					return verify_fail(st, -1, -1,
						    "missing gradient contribution: sync group of "
						    "'%s' layer %d %s device %d",
						    p->model.comps[pr->comp].name, (int)pr->layer,
						    holds ? "leaves out holder" : "includes non-holder",
						    d);
			}
		}
	}
	return 0;
}

/* Every program ends with its one optimizer step, followed only by one
 * GATHER of each zero-1 bucket the device belongs to: a sharded bucket's
 * weights are whole again before the next iteration uses them. seen: per
 * bucket, the last device (+ 1) that gathered it. */
static int check_step_tail(vstate_t *st, int d, int *seen)
{
	const sp_plan_t *p = st->p;
	const sp_device_t *dv = &p->devices[d];
	int steps = 0, after = 0, missing = 0;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op == INS_STEP) {
			steps++;
		} else if (in->op == INS_GATHER) {
			const char *why = !steps			? "before the optimizer step"
					  : seen[in->peer] == d + 1 ? "twice"
					  : !bucket_member(p, in->peer, d)
						  ? "by a device outside its group"
						  : NULL;
			if (why)
				return verify_fail(st, d, k, "sharded parameters: all-gather of bucket %d %s",
					    (int)in->peer, why);
			seen[in->peer] = d + 1;
		} else if (steps) {
			after++;
		}
	}
	if (steps != 1 || after)
		return verify_fail(st, -1, -1,
			    "missing gradient contribution: the program of device %d has %d "
			    "optimizer steps (it must end with exactly one, followed only by "
			    "all-gathers)",
			    d, steps);
	for (int b = 0; b < p->n_buckets; b++)
		missing += layout_gathers_after_step(p->buckets[b].layout) && seen[b] != d + 1 &&
			   bucket_member(p, b, d);
	if (missing)
		return verify_fail(st, -1, -1,
			    "sharded parameters: device %d leaves %d of its zero-1/2 buckets "
			    "without an all-gather (it would start the next iteration with "
			    "stale weights)",
			    d, missing);
	return 0;
}

static int check_steps(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	int *seen = sp_arena_calloc(&st->arena, (size_t)p->n_buckets + 1, sizeof(int));
	if (!seen)
		return SP_ENOMEM;
	int rc = 0;
	for (int b = 0; b < p->n_buckets && !rc; b++)
		if (p->buckets[b].defer && !layout_gathers_after_step(p->buckets[b].layout))
			rc = verify_fail(st, -1, -1,
					 "deferred all-gather: bucket %d is %s, and only zero-1 "
					 "and zero-2 buckets all-gather after the optimizer step",
					 b, layout_name(p->buckets[b].layout));
	for (int d = 0; d < p->n_devices && !rc; d++)
		rc = check_step_tail(st, d, seen);
	return rc;
}

/* A RECV whose SEND has run: received once, and both ends agree. */
static int match_recv(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	if (st->recvd[in->tag])
		return verify_fail(st, d, k, "unmatched transfer: tag %d received twice", (int)in->tag);
	const sp_ins_t *sd = &p->ins[st->send_of[in->tag]];
	int sdev = 0;
	while (sdev + 1 < p->n_devices && p->devices[sdev + 1].first_ins <= st->send_of[in->tag])
		sdev++;
	if (sd->s0 != in->s0 || sd->s1 != in->s1 || sd->seq_len != in->seq_len ||
	    sd->peer != d || in->peer != sdev)
		return verify_fail(st, d, k, "size mismatch: transfer tag %d differs from its send on "
				      "device %d",
			    (int)in->tag, sdev);
	if (plan_ins_task(p, sd) != plan_ins_task(p, in))
		return verify_fail(st, d, k, "transfer between tasks: tag %d sends a value of task '%s' "
				      "from device %d into one of task '%s'",
			    (int)in->tag, p->model.tasks[plan_ins_task(p, sd)].name, sdev,
			    p->model.tasks[plan_ins_task(p, in)].name);
	st->recvd[in->tag] = 1;
	return 0;
}

/* The member index (slot in its slice) of device d at a tensor-parallel
 * FWD/BWD/LOSS, or -1 for other instructions (or a device not in the
 * slice: exec says so). */
static int rendezvous(vstate_t *st, int d, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
		return -1;
	const sp_slice_t *sl = &p->slices[in->slice];
	for (int q = 0; sl->tp > 1 && q < sl->n_dev; q++)
		if (p->slice_devs[sl->dev_off + q] == d)
			return q;
	return -1;
}

/* One instruction of device d: waits (RECV before its SEND, STEP before
 * its buckets' all-reduces all started, a tensor-parallel FWD/BWD before
 * every member of its group reached it), else checked and executed. */
static int verify_step(void *ctx, int d, int k, const sp_ins_t *in)
{
	vstate_t *st = ctx;
	const sp_plan_t *p = st->p;
	int rc = 0;
	if (st->micro && !plan_ins_active(p, in, st->micro)) /* micro-step 0 runs all */
		return PROGS_RAN;
	if (vz2_wait(st, d, k, in) || vz3_wait(st, d, k, in))
		return PROGS_WAIT;
	if (in->op == INS_RECV) {
		if (in->tag < 0 || in->tag >= st->max_tag || !st->sent[in->tag])
			return PROGS_WAIT;
		rc = match_recv(st, d, k, in);
	} else if (in->op == INS_SEND) {
		if (in->tag < 0 || in->tag >= st->max_tag || st->sent[in->tag])
			return verify_fail(st, d, k, "unmatched transfer: tag %d sent twice or invalid",
				    (int)in->tag);
		st->sent[in->tag] = 1;
		st->send_of[in->tag] = p->devices[d].first_ins + k;
	} else if (in->op == INS_SYNC) {
		st->issued[in->peer]++;
	} else if (in->op == INS_STEP) {
		for (int b = 0; b < p->n_buckets; b++)
			if (bucket_member(p, b, d) &&
			    st->issued[b] < p->buckets[b].n_dev)
				return PROGS_WAIT;
	} else if ((in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) &&
		   p->slices[in->slice].tp > 1) {
		/* the r-th FWD (BWD) of a member waits for r arrivals of every
		 * member: r t in the group's count (a member is at most one
		 * arrival ahead of the others, so a repeat cannot pass on the
		 * arrivals of an earlier rendezvous); a loss slice has LOSS and
		 * no FWD, so its LOSS counts as the forward */
		const sp_slice_t *sl = &p->slices[in->slice];
		int q = rendezvous(st, d, in), g = p->devices[d].first_ins + k, t = sl->tp;
		int dir = in->op == INS_BWD;
		if (q >= 0) {
			int *grp = &st->arrived[(sl->dev_off + q - q % t) * 2 + dir];
			if (!st->at_rdv[g]) {
				st->at_rdv[g] = ++st->rounds[(sl->dev_off + q) * 2 + dir];
				++*grp;
			}
			if (*grp < st->at_rdv[g] * t)
				return PROGS_WAIT;
		}
	}
	if (rc || (rc = exec(st, d, k, in)) || (rc = vz2_exec(st, d, k, in)))
		return rc;
	return PROGS_RAN;
}

/* No device can move: name the most telling stuck device, a RECV whose
 * SEND is nowhere ahead in its peer's program, else the first one. */
static int explain_deadlock(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	const int *pc = st->pc;
	int N = p->n_devices, d = -1, missing = 0;
	for (int q = 0; q < N && !missing; q++) {
		if (pc[q] >= p->devices[q].n_ins)
			continue;
		const sp_ins_t *in = &p->ins[p->devices[q].first_ins + pc[q]];
		if (d < 0)
			d = q;
		if (in->op != INS_RECV || in->peer < 0 || in->peer >= N)
			continue;
		const sp_device_t *pv = &p->devices[in->peer];
		int ahead = 0;
		for (int k = pc[in->peer]; k < pv->n_ins && !ahead; k++)
			ahead = p->ins[pv->first_ins + k].op == INS_SEND &&
				p->ins[pv->first_ins + k].tag == in->tag;
		if (!ahead) {
			d = q;
			missing = 1;
		}
	}
	const sp_ins_t *in = &p->ins[p->devices[d].first_ins + pc[d]];
	for (int q = 0; q < N && !missing; q++) {
		const sp_ins_t *iq = &p->ins[p->devices[q].first_ins + pc[q]];
		if (pc[q] >= p->devices[q].n_ins || rendezvous(st, q, iq) < 0)
			continue;
		const sp_slice_t *sl = &p->slices[iq->slice];
		int lead = 0;
		while (p->slice_devs[sl->dev_off + lead] != q)
			lead++;
		lead -= lead % sl->tp;
		for (int j = lead; j < lead + sl->tp; j++) {
			int o = p->slice_devs[sl->dev_off + j];
			const sp_ins_t *io = &p->ins[p->devices[o].first_ins + pc[o]];
			if (pc[o] < p->devices[o].n_ins &&
			    (io->op != iq->op || io->slice != iq->slice))
				return verify_fail(st, q, pc[q],
					    "deadlock: the tensor-parallel group of slice %d waits "
					    "for device %d, which runs %s of slice %d first (members "
					    "must run the slice's FWD/BWD/LOSS in the same order)",
					    (int)iq->slice, o, ins_op_name(io->op), (int)io->slice);
		}
	}
	if (in->op == INS_RECV && missing)
		return verify_fail(st, d, pc[d],
			    "deadlock: waits for tag %d from device %d, which never sends it",
			    (int)in->tag, (int)in->peer);
	if (in->op == INS_RECV)
		return verify_fail(st, d, pc[d],
			    "deadlock: waits for tag %d from device %d, which waits in turn "
			    "(a cycle)",
			    (int)in->tag, (int)in->peer);
	if (in->op == INS_PGATHER)
		return verify_fail(st, d, pc[d],
			    "deadlock: waits at the all-gather of zero-3 bucket %d for a member "
			    "that waits in turn (members must gather a bucket in one order "
			    "with their other collectives and transfers)",
			    (int)in->peer);
	return verify_fail(st, d, pc[d], "deadlock: waits for a sync some member never starts");
}

static int check_all_received(vstate_t *st)
{
	for (int t = 0; t < st->max_tag; t++)
		if (st->sent[t] && !st->recvd[t])
			return verify_fail(st, -1, -1,
				    "unmatched transfer: tag %d is sent but never received", t);
	return 0;
}

/* Every parameter use receives its task's whole batch of contributions. */
static int check_contributions(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	for (int m = 0; m < p->n_metaops; m++) {
		const sp_metaop_t *mo = &p->metaops[m];
		const sp_task_t *t = &p->model.tasks[mo->task];
		for (int l = 0; l < mo->n_layers; l++) {
			const sp_op_t *op = &p->ops[mo->first_op + l];
			int comp = t->nodes[op->node].comp;
			int64_t want = plan_task_k(p, mo->task) > st->micro ? t->batch : 0;
			if (p->model.comps[comp].type == COMP_CONTRASTIVE ||
			    st->contrib[mo->first_op + l] == want)
				continue;
			return verify_fail(st, -1, -1,
				    "missing gradient contribution: '%s' layer %d gets %lld "
				    "samples of gradient in '%s' (batch %lld) in micro-step %d",
				    p->model.comps[comp].name, (int)op->layer,
				    (long long)st->contrib[mo->first_op + l], mo->name,
				    (long long)want, st->micro);
		}
	}
	return 0;
}

/* Every device issues the all-reduce of each of its buckets once (its step
 * updates each bucket's parameters after that all-reduce). */
static int check_sync_issues(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *dv = &p->devices[d];
		for (int b = 0; b < p->n_buckets; b++)
			st->issued[b] = 0;
		for (int k = 0; k < dv->n_ins; k++)
			if (p->ins[dv->first_ins + k].op == INS_SYNC)
				st->issued[p->ins[dv->first_ins + k].peer]++;
		for (int b = 0; b < p->n_buckets; b++) {
			int member = bucket_member(p, b, d);
			if (st->issued[b] != member)
				return verify_fail(st, -1, -1,
					    "missing gradient contribution: device %d issues the "
					    "all-reduce of sync bucket %d %d times (%s)",
					    d, b, st->issued[b],
					    member ? "a member: once" : "not a member: never");
		}
	}
	return 0;
}

/* mem_cap <= 0: no check. */
static int check_memory(vstate_t *st, double mem_cap)
{
	const sp_plan_t *p = st->p;
	for (int d = 0; d < p->n_devices && mem_cap > 0; d++) {
		int64_t mem[MEM__COUNT], tot = 0;
		if (plan_memory_at(p, d, st->z2.safe, mem))
			return SP_ENOMEM;
		for (int c = 0; c < MEM__COUNT; c++)
			tot += mem[c];
		if ((double)tot > mem_cap)
			return verify_fail(st, -1, -1,
				    "out of memory: device %d needs %.1f MiB, more than its "
				    "%.1f MiB",
				    d, (double)tot / 1048576.0, mem_cap / 1048576.0);
	}
	return 0;
}

/* The structure first, then all programs run together, then what only
 * the finished run can show. */
static int verify_steps(vstate_t *st, double mem_cap)
{
	int rc;
	if ((rc = verify_alloc(st)) || (rc = vmem_prepare(st)) || (rc = vz2_prepare(st)) ||
	    (rc = vz3_prepare(st)) || (rc = index_buckets(st)) ||
	    (rc = check_tp(st)) || (rc = check_sync_groups(st)) || (rc = check_steps(st)))
		return rc;
	rc = progs_run(st->p, st->pc, verify_step, st);
	if (rc == PROGS_STUCK)
		return explain_deadlock(st);
	if (rc || (rc = check_all_received(st)) || (rc = check_contributions(st)) ||
	    (rc = check_sync_issues(st)))
		return rc;
	return st->micro ? 0 : check_memory(st, mem_cap);
}

int verify_plan(const sp_plan_t *p, double mem_cap, sp_err_t *err)
{
	int rc = 0, K = SP_MAX(p->microbatches, 1);
	for (int j = 0; j < K && !rc; j = plan_micro_next(&p->model, K, j)) {
		vstate_t st = {.p = p, .err = err, .micro = j};
		sp_arena_init(&st.arena);
		rc = verify_steps(&st, mem_cap);
		vz2_release(&st);
		if (rc == SP_ENOMEM)
			rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		sp_arena_release(&st.arena);
	}
	return rc;
}
