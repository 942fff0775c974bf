/*
 * verify_mem.c — the verifier's rules for a decoder's memory (issue #20).
 * A decoder c (a MetaOp with shape.mem_seq > 0) reads act(c, -1), its
 * producer p's output act(p, L_p), in every FWD and BWD of every slice,
 * and every BWD adds its layers' gradient w.r.t. the memory into
 * grad(c, -1), which goes back into grad(p, L_p). It rejects, naming
 * device, instruction, MetaOp and samples:
 *   missing memory              a FWD/BWD of c on samples whose act(c, -1)
 *                               was not received or copied on the device
 *                               before (or came from another value than
 *                               act(p, L_p): memory misdirected)
 *   memory gradient sent early  a SEND/COPY of grad(c, -1) before a BWD of
 *                               c on the same device that adds to its
 *                               samples (the producer would get a part)
 *   memory gradient never sent  a BWD's contribution to grad(c, -1) that
 *                               no later SEND/COPY of the device returns
 *   missing memory gradient     a BWD of p's last slice on samples before
 *                               every layer's contribution to grad(c, -1)
 *                               for them arrived on its device (or, added
 *                               twice, more than every layer's; or it went
 *                               into another value: misdirected)
 * and a split decoder slice (tp > 1: decoders are never split).
 *
 * Counting. The memory is a value like any other (mem_seq tokens per
 * sample, verify.c). Its gradient is a sum over layers, possibly computed
 * on several devices (slices over different layers), so it is counted in
 * layers: per device and sample, the layers its BWDs added (local), and on
 * the producer's devices the layers received (got). A SEND carries the
 * sender's count as it was when sent; when got reaches L_c for a sample,
 * grad(p, L_p) gets that sample's mem_seq tokens, and p's BWD finds its
 * output gradient complete as verify.c counts it. The order of a program
 * (rules 2 and 3) is checked before the run, so the same plan gets the
 * same message whatever order the devices take turns in.
 */
#include "verify.h"

/* Device d's per-sample counts of decoder i in table t. */
static vcounts_t *counts(const vstate_t *st, vcounts_t *t, int d, int i)
{
	return &t[(size_t)d * (size_t)st->mem.n_dec + (size_t)i];
}

static const char *vname(const sp_vref_t *r)
{
	return r->grad ? "grad" : "act";
}

/* Decoders and their producers (the memory edges). */
static int index_decoders(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	vmem_t *mm = &st->mem;
	mm->dec_of = sp_arena_calloc(&st->arena, (size_t)p->n_metaops + 1, sizeof(int));
	mm->dec = sp_arena_calloc(&st->arena, (size_t)p->n_metaops + 1, sizeof(int));
	mm->producer = sp_arena_calloc(&st->arena, (size_t)p->n_metaops + 1, sizeof(int));
	if (!mm->dec_of || !mm->dec || !mm->producer)
		return SP_ENOMEM;
	for (int m = 0; m < p->n_metaops; m++) {
		mm->dec_of[m] = -1;
		if (p->metaops[m].shape.mem_seq > 0) {
			mm->producer[mm->n_dec] = -1;
			mm->dec[mm->n_dec] = m;
			mm->dec_of[m] = mm->n_dec++;
		}
	}
	for (int e = 0; e < p->n_edges; e++) {
		const sp_edge_t *ed = &p->edges[e];
		if (!ed->memory)
			continue;
		int i = mm->dec_of[ed->dst];
		if (i < 0 || mm->producer[i] >= 0)
			return verify_fail(st, -1, -1, "missing memory: memory edge %d into '%s', %s", e,
				    p->metaops[ed->dst].name,
				    i < 0 ? "which has no cross-attention (mem_seq 0)"
					  : "which has another memory edge");
		mm->producer[i] = ed->src;
	}
	for (int i = 0; i < mm->n_dec; i++)
		if (mm->producer[i] < 0)
			return verify_fail(st, -1, -1, "missing memory: decoder '%s' has no memory edge",
				    p->metaops[mm->dec[i]].name);
	return 0;
}

/* 1 when in sends or copies the memory gradient grad(c, -1) of decoder c. */
static int returns_grad(const sp_ins_t *in, int c)
{
	return (in->op == INS_SEND || in->op == INS_COPY) && in->src.metaop == c &&
	       in->src.layer < 0 && in->src.grad;
}

/*
 * Rules 2 and 3 on device d's program for decoder i: with first[s] the
 * first instruction returning sample s of grad(c, -1), a BWD of c at k on
 * s needs first[s] > k (none before it: sent early; none at all: never
 * sent; later ones after a first that comes after k are fine).
 */
static int check_order(vstate_t *st, int d, int i, int32_t *first)
{
	const sp_plan_t *p = st->p;
	const sp_device_t *dv = &p->devices[d];
	int c = st->mem.dec[i];
	int32_t B = (int32_t)verify_batch(p, c), none = INT32_MAX;
	for (int32_t s = 0; s < B; s++)
		first[s] = none;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (!returns_grad(in, c))
			continue;
		for (int32_t s = SP_MAX(in->s0, 0); s < SP_MIN(in->s1, B); s++)
			first[s] = SP_MIN(first[s], k);
	}
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op != INS_BWD || p->slices[in->slice].metaop != c)
			continue;
		const sp_slice_t *sl = &p->slices[in->slice];
		for (int32_t s = SP_MAX(in->s0, 0); s < SP_MIN(in->s1, B); s++) {
			if (first[s] < k)
				return verify_fail(st, d, first[s],
					    "memory gradient sent early: sample %d of grad(m, -1) "
					    "of '%s' goes back to '%s' before the backward at "
					    "instruction %d adds layers [%d, %d) to it (samples "
					    "[%d, %d))",
					    (int)s, p->metaops[c].name,
					    p->metaops[st->mem.producer[i]].name, k,
					    (int)sl->layer_from, (int)sl->layer_to, (int)in->s0,
					    (int)in->s1);
			if (first[s] == none)
				return verify_fail(st, d, k,
					    "memory gradient never sent: this backward adds layers "
					    "[%d, %d) of '%s' to grad(m, -1) of samples [%d, %d), "
					    "and no later send or copy returns sample %d to '%s'",
					    (int)sl->layer_from, (int)sl->layer_to,
					    p->metaops[c].name, (int)in->s0, (int)in->s1, (int)s,
					    p->metaops[st->mem.producer[i]].name);
		}
	}
	return 0;
}

int vmem_prepare(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	vmem_t *mm = &st->mem;
	int rc = index_decoders(st);
	if (rc || !mm->n_dec)
		return rc;
	size_t cells = (size_t)p->n_devices * (size_t)mm->n_dec + 1;
	int32_t B = 0;
	for (int i = 0; i < mm->n_dec; i++)
		B = SP_MAX(B, (int32_t)verify_batch(p, mm->dec[i]));
	mm->local = sp_arena_calloc(&st->arena, cells, sizeof *mm->local);
	mm->got = sp_arena_calloc(&st->arena, cells, sizeof *mm->got);
	mm->sent = sp_arena_calloc(&st->arena, (size_t)st->max_tag + 1, sizeof *mm->sent);
	int32_t *first = sp_arena_calloc(&st->arena, (size_t)B + 1, sizeof(int32_t));
	if (!mm->local || !mm->got || !mm->sent || !first)
		return SP_ENOMEM;
	for (int s = 0; s < p->n_slices; s++) {
		const sp_slice_t *sl = &p->slices[s];
		if (mm->dec_of[sl->metaop] >= 0 && sl->tp != 1)
			return verify_fail(st, -1, -1,
				    "tensor parallelism: slice %d of decoder '%s' is split %d ways "
				    "(decoders are never split)",
				    s, p->metaops[sl->metaop].name, (int)sl->tp);
	}
	for (int d = 0; d < p->n_devices; d++)
		for (int i = 0; i < mm->n_dec; i++)
			if ((rc = check_order(st, d, i, first)))
				return rc;
	return 0;
}

/* Rule 4 at device d's BWD of the last slice of MetaOp m (instruction k):
 * every decoder whose memory m produces has all L_c layers' gradient of
 * the BWD's samples here. */
static int check_arrived(vstate_t *st, int d, int k, const sp_ins_t *in, int m)
{
	const sp_plan_t *p = st->p;
	const vmem_t *mm = &st->mem;
	for (int i = 0; i < mm->n_dec; i++) {
		if (mm->producer[i] != m)
			continue;
		const vcounts_t *got = counts(st, mm->got, d, i);
		int c = mm->dec[i], L = p->metaops[c].n_layers;
		for (int32_t s = in->s0, n, e; s < in->s1; s = e) {
			e = vcounts_piece(got, s, in->s1, &n);
			if (n != L)
				return verify_fail(st, d, k,
					    "missing memory gradient: backward of '%s' samples "
					    "[%d, %d) before every contribution to the memory "
					    "gradient of its decoder '%s' arrived: sample %d has "
					    "%d of %d layers' here",
					    p->metaops[m].name, (int)in->s0, (int)in->s1,
					    p->metaops[c].name, (int)s, (int)n, L);
		}
	}
	return 0;
}

int vmem_compute(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	const vmem_t *mm = &st->mem;
	if (!mm->n_dec)
		return 0;
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *m = &p->metaops[sl->metaop];
	int i = mm->dec_of[sl->metaop];
	if (i >= 0) {
		sp_vref_t mem = {sl->metaop, -1, 0, 0};
		const vbuf_t *v = verify_value(st, d, &mem);
		if (!v)
			return SP_ENOMEM;
		for (int32_t s = in->s0, n, e; s < in->s1; s = e) {
			e = vcounts_piece(&v->cnt, s, in->s1, &n);
			if (n != m->shape.mem_seq)
				return verify_fail(st, d, k,
					    "missing memory: %s of '%s' samples [%d, %d) reads "
					    "act(m, -1), but sample %d has %d of %lld tokens here "
					    "(it is received or copied before the device's first "
					    "forward of the decoder)",
					    ins_op_name(in->op), m->name, (int)in->s0, (int)in->s1,
					    (int)s, (int)n, (long long)m->shape.mem_seq);
		}
		if (in->op == INS_BWD &&
		    vcounts_add(&st->arena, counts(st, mm->local, d, i), in->s0, in->s1,
				sl->layer_to - sl->layer_from))
			return SP_ENOMEM;
	}
	if (in->op == INS_BWD && sl->layer_to == m->n_layers)
		return check_arrived(st, d, k, in, sl->metaop);
	return 0;
}

/* A memory gradient of decoder i arriving on device d (RECV or COPY at k)
 * with carried's count of layers of each sample: into grad(p, L_p), at
 * most L_c layers per sample; a sample complete gets its tokens. Walked in
 * pieces of samples that have one count carried and one got. */
static int deliver(vstate_t *st, int d, int k, const sp_ins_t *in, int i,
		   const vcounts_t *carried)
{
	const sp_plan_t *p = st->p;
	int c = st->mem.dec[i], pm = st->mem.producer[i];
	int Lc = p->metaops[c].n_layers, Lp = p->metaops[pm].n_layers;
	const sp_vref_t *to = &in->dst;
	if (!to->grad || to->metaop != pm || to->layer != Lp)
		return verify_fail(st, d, k,
			    "missing memory gradient: grad(m, -1) of '%s' samples [%d, %d) goes "
			    "into %s('%s', %d), not into its producer's output gradient "
			    "grad('%s', %d) (misdirected)",
			    p->metaops[c].name, (int)in->s0, (int)in->s1, vname(to),
			    p->metaops[to->metaop].name, (int)to->layer, p->metaops[pm].name, Lp);
	vcounts_t *got = counts(st, st->mem.got, d, i);
	for (int32_t s = in->s0, e; s < in->s1; s = e) {
		int32_t before, add;
		e = vcounts_piece(got, s, in->s1, &before);
		e = vcounts_piece(carried, s, e, &add);
		if (before + add > Lc)
			return verify_fail(st, d, k,
				    "missing memory gradient: sample %d of grad(m, -1) of '%s' "
				    "has %d of %d layers' contributions here (added twice)",
				    (int)s, p->metaops[c].name, (int)(before + add), Lc);
		int rc = before < Lc && before + add == Lc
				 ? verify_write(st, d, k, to, s, e, in->seq_len)
				 : 0;
		if (rc || (rc = vcounts_add(&st->arena, got, s, e, add)))
			return rc;
	}
	return 0;
}

/* A SEND of grad(c, -1) records what it carries: the device's layers per
 * sample now (a BWD after it is rule 2's). */
static int snapshot(vstate_t *st, int d, const sp_ins_t *in, int i)
{
	return vcounts_clip(&st->arena, &st->mem.sent[in->tag], counts(st, st->mem.local, d, i),
			    in->s0, in->s1);
}

int vmem_xfer(vstate_t *st, int d, int k, const sp_ins_t *in, int *done)
{
	const sp_plan_t *p = st->p;
	const vmem_t *mm = &st->mem;
	*done = 0;
	if (!mm->n_dec || (in->op != INS_SEND && in->op != INS_RECV && in->op != INS_COPY))
		return 0;
	/* the value moved: a RECV's is its SEND's source */
	const sp_ins_t *from = in->op == INS_RECV ? &p->ins[st->send_of[in->tag]] : in;
	const sp_vref_t *src = &from->src;
	if (src->layer < 0 && src->grad) {
		int i = mm->dec_of[src->metaop];
		if (i < 0)
			return verify_fail(st, d, k,
				    "missing memory gradient: grad('%s', -1) moved, but it is no "
				    "decoder",
				    p->metaops[src->metaop].name);
		*done = 1;
		if (in->op == INS_SEND)
			return snapshot(st, d, in, i);
		if (in->op == INS_RECV)
			return deliver(st, d, k, in, i, &mm->sent[in->tag]);
		return deliver(st, d, k, in, i, counts(st, mm->local, d, i));
	}
	const sp_vref_t *to = &in->dst; /* a SEND's: what it says it sends */
	if (to->layer >= 0 || to->grad)
		return 0;
	/* the reader checks a SEND's src, not its dst: bounds first */
	if (to->metaop < 0 || to->metaop >= p->n_metaops)
		return verify_fail(st, d, k, "its destination names MetaOp %d, not one of the plan's %d",
				   (int)to->metaop, p->n_metaops);
	int i = mm->dec_of[to->metaop];
	int pm = i >= 0 ? mm->producer[i] : -1;
	if (i < 0 || src->metaop != pm || src->layer != p->metaops[pm].n_layers || src->grad)
		return verify_fail(st, d, k,
			    "missing memory: act(m, -1) of '%s' samples [%d, %d) comes from "
			    "%s('%s', %d), not from %s (misdirected)",
			    p->metaops[to->metaop].name, (int)in->s0, (int)in->s1, vname(src),
			    p->metaops[src->metaop].name, (int)src->layer,
			    i < 0 ? "anything: it is no decoder" : "its producer's output");
	return 0;
}
