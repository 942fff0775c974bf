/*
 * plan_zero2.c — what planner, verifier and runtime share about zero-2
 * buckets (layout 2) and the gradients of zero-3 ones (layout 3, the same
 * rules: layout_grads_sharded): which instructions write into a zero-2 bucket's full
 * gradient (z2map_*), and where each member completes the bucket's
 * reduce-scatter and frees that gradient (plan_z2_safe). The memory walk
 * over these points is plan_mem.c's; the runtime's is interp.c's. Trusts
 * the plan (plan_read has checked every index).
 */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

int z2map_init(sp_z2map_t *out, const sp_plan_t *p)
{
	const sp_model_t *md = &p->model;
	memset(out, 0, sizeof *out);
	out->dev = -1;
	for (int b = 0; b < p->n_buckets; b++)
		out->n_z2 += layout_grads_sharded(p->buckets[b].layout);
	if (!out->n_z2)
		return 0;
	int slots = 0;
	out->base = malloc(sizeof(int32_t) * (size_t)(md->n_comps + 1));
	for (int c = 0; out->base && c < md->n_comps; c++) {
		out->base[c] = slots;
		slots += md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
	}
	out->first = malloc(sizeof(int32_t) * (size_t)(slots + 1));
	out->next = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_params + 1));
	out->bucket = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_params + 1));
	if (!out->base || !out->first || !out->next || !out->bucket) {
		z2map_release(out);
		return SP_ENOMEM;
	}
	for (int i = 0; i < slots; i++)
		out->first[i] = -1;
	int n = 0;
	for (int b = p->n_buckets - 1; b >= 0; b--) {
		const sp_bucket_t *bk = &p->buckets[b];
		if (!layout_grads_sharded(bk->layout))
			continue;
		for (int q = 0; q < bk->n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[bk->param_off + q];
			int s = out->base[pr->comp] + pr->layer;
			out->bucket[n] = b;
			out->next[n] = out->first[s];
			out->first[s] = n++;
		}
	}
	return 0;
}

void z2map_release(sp_z2map_t *m)
{
	if (!m)
		return;
	free(m->base);
	free(m->first);
	free(m->next);
	free(m->bucket);
	free(m->mine);
	memset(m, 0, sizeof *m);
	m->dev = -1;
}

int z2map_for(sp_z2map_t *m, const sp_plan_t *p, int dev)
{
	int64_t off, n;
	if (!m->n_z2)
		return 0;
	if (!m->mine && !(m->mine = malloc((size_t)p->n_buckets + 1)))
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++)
		m->mine[b] = layout_grads_sharded(p->buckets[b].layout) &&
			     bucket_shard(p, b, dev, &off, &n) >= 0;
	m->dev = dev;
	return 0;
}

/* The distinct buckets of the map that instruction in (of dev) touches:
 * its slice's layers' (a LOSS: its one layer's); FWD too when fwd is 1;
 * only zero-3 buckets when z3 is 1. */
static int map_touches(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
		       int32_t *out, int cap, int fwd, int z3)
{
	if (!m->n_z2 || (in->op != INS_BWD && in->op != INS_LOSS && !(fwd && in->op == INS_FWD)))
		return 0;
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *mo = &p->metaops[sl->metaop];
	const sp_task_t *t = &p->model.tasks[mo->task];
	int n = 0;
	int64_t off, cnt;
	/* a LOSS runs the slice's one layer (a loss MetaOp's) */
	int lo = in->op == INS_LOSS ? 0 : sl->layer_from;
	int hi = in->op == INS_LOSS ? 1 : sl->layer_to;
	for (int l = lo; l < hi; l++) {
		const sp_op_t *op = &p->ops[mo->first_op + l];
		int comp = t->nodes[op->node].comp;
		for (int e = m->first[m->base[comp] + op->layer]; e >= 0; e = m->next[e]) {
			int b = m->bucket[e], dup = 0;
			if (z3 && p->buckets[b].layout != LAYOUT_ZERO3)
				continue;
			if (m->dev == dev ? !m->mine[b] : bucket_shard(p, b, dev, &off, &cnt) < 0)
				continue;
			for (int j = 0; j < n && !dup; j++)
				dup = out[j] == b;
			if (!dup && n < cap)
				out[n++] = b;
		}
	}
	return n;
}

int z2map_writes(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
		 int32_t *out, int cap)
{
	return map_touches(m, p, dev, in, out, cap, 0, 0);
}

int z3map_uses(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
	       int32_t *out, int cap)
{
	return map_touches(m, p, dev, in, out, cap, 1, 1);
}

/*
 * The programs of every device run together (no timing, data only), as the
 * runtime blocks: a RECV until its SEND has run; an instruction of d that
 * allocates a zero-2 full gradient (z2 below) until every member of each
 * bucket d has in flight has issued its SYNC, which then completes there
 * (its safe point). When no device can move but some wait so, the first of
 * them goes on without waiting (its buckets stay in flight, to complete at
 * a later allocation or at the STEP): a wait is kept only where the run
 * shows that the members reach their SYNCs without this device going on,
 * so the runtime's wait there cannot deadlock (the programs are
 * deterministic: what one run reaches, every run reaches). Tensor-parallel
 * FWD/BWD are rendezvous of their groups that this run does not model: a
 * plan with them completes every zero-2 reduce-scatter at the STEP. A
 * zero-3 PGATHER is a rendezvous of its bucket's members, modelled (a
 * member passes its n-th once every member has reached its n-th). A plan
 * that cannot finish (the verifier rejects it) leaves the rest at the end.
 */
typedef struct {
	const sp_plan_t *p;
	sp_z2map_t m;
	int32_t *w; /* z2map_writes scratch, cap */
	int cap;
	uint8_t *st; /* per bucket_devs entry: 0 none, 1 live, 2 in flight, 3 done */
	int32_t *issued; /* per bucket */
	int32_t *safe;
	/* per device d, its zero-2 entries ent[first[d] .. first[d + 1]) */
	int32_t *first, *ent, *bk_of; /* bk_of: per bucket_devs entry */
	int32_t *garr; /* per bucket_devs entry: PGATHERs its member reached */
	int32_t *at_pg; /* per device: the PGATHER it has arrived at, or -1 */
} z2sim_t;

/* A PGATHER is a rendezvous of its zero-3 bucket's members: device d
 * arrives at its n-th of bucket b and passes once every member has
 * reached its n-th. 1 when d must wait. */
static int z2_pgather_waits(z2sim_t *s, int d, int pc, int b)
{
	const sp_plan_t *p = s->p;
	const sp_bucket_t *bk = &p->buckets[b];
	int64_t off, n;
	int q = bucket_shard(p, b, d, &off, &n);
	if (q < 0)
		return 0; /* not a member: the reader's and verifier's to refuse */
	if (s->at_pg[d] != pc) {
		s->garr[bk->dev_off + q]++;
		s->at_pg[d] = pc;
	}
	for (int j = 0; j < bk->n_dev; j++)
		if (s->garr[bk->dev_off + j] < s->garr[bk->dev_off + q])
			return 1;
	s->at_pg[d] = -1;
	return 0;
}

/* Device d's bucket_devs entry of zero-2 bucket b, or -1. */
static int z2_find(const z2sim_t *s, int b, int d)
{
	for (int x = s->first[d]; x < s->first[d + 1]; x++)
		if (s->bk_of[s->ent[x]] == b)
			return s->ent[x];
	return -1;
}

/* z2map_writes with the membership from d's entries: the entries written,
 * in s->w. */
static int z2_writes(z2sim_t *s, int d, const sp_ins_t *in)
{
	const sp_plan_t *p = s->p;
	if (in->op != INS_BWD && in->op != INS_LOSS)
		return 0;
	const sp_slice_t *sl = &p->slices[in->slice];
	const sp_metaop_t *mo = &p->metaops[sl->metaop];
	const sp_task_t *t = &p->model.tasks[mo->task];
	int lo = in->op == INS_LOSS ? 0 : sl->layer_from;
	int hi = in->op == INS_LOSS ? 1 : sl->layer_to, n = 0;
	for (int l = lo; l < hi; l++) {
		const sp_op_t *op = &p->ops[mo->first_op + l];
		int comp = t->nodes[op->node].comp;
		for (int x = s->m.first[s->m.base[comp] + op->layer]; x >= 0; x = s->m.next[x]) {
			int e = z2_find(s, s->m.bucket[x], d), dup = 0;
			for (int j = 0; j < n && !dup && e >= 0; j++)
				dup = s->w[j] == e;
			if (e >= 0 && !dup && n < s->cap)
				s->w[n++] = e;
		}
	}
	return n;
}

/* Whether instruction in of d allocates a full gradient (*nw entries
 * written in s->w; *sy: the zero-2 SYNC's entry, or -1). */
static int z2_allocates(z2sim_t *s, int d, const sp_ins_t *in, int *nw, int *sy)
{
	const sp_plan_t *p = s->p;
	int any = 0;
	*nw = z2_writes(s, d, in);
	*sy = in->op == INS_SYNC && layout_grads_sharded(p->buckets[in->peer].layout)
		      ? z2_find(s, in->peer, d)
		      : -1;
	for (int j = 0; j < *nw; j++)
		any |= s->st[s->w[j]] == 0;
	return any || (*sy >= 0 && s->st[*sy] == 0);
}

/* d's buckets in flight: complete the ones every member has issued (at
 * instruction k); 1 when some other is still waited for. */
static int z2_complete(z2sim_t *s, int d, int k, int dry)
{
	const sp_plan_t *p = s->p;
	int waits = 0;
	for (int x = s->first[d]; x < s->first[d + 1]; x++) {
		int e = s->ent[x], b = s->bk_of[e];
		if (s->st[e] != 2)
			continue;
		if (s->issued[b] < p->buckets[b].n_dev) {
			waits = 1;
		} else if (!dry) {
			s->st[e] = 3;
			s->safe[e] = k;
		}
	}
	return waits;
}

/* Runs device d from pc[d] until it blocks; 1 when it moved. */
static int z2_run(z2sim_t *s, int d, int32_t *pc, uint8_t *sent, uint8_t *go, int max_tag)
{
	const sp_plan_t *p = s->p;
	const sp_device_t *dv = &p->devices[d];
	int moved = 0;
	for (; pc[d] < dv->n_ins; pc[d]++, moved = 1) {
		const sp_ins_t *in = &p->ins[dv->first_ins + pc[d]];
		int nw, sy;
		if (in->op == INS_RECV && (in->tag < 0 || in->tag >= max_tag || !sent[in->tag]))
			break;
		if (in->op == INS_PGATHER && in->peer >= 0 && in->peer < p->n_buckets &&
		    z2_pgather_waits(s, d, pc[d], in->peer))
			break;
		if (z2_allocates(s, d, in, &nw, &sy)) {
			if (z2_complete(s, d, pc[d], 1) && !go[d])
				break; /* waits for a member's SYNC */
			z2_complete(s, d, pc[d], 0);
			go[d] = 0;
		}
		for (int j = 0; j < nw; j++)
			s->st[s->w[j]] = s->st[s->w[j]] == 0 ? 1 : s->st[s->w[j]];
		if (sy >= 0 && s->st[sy] <= 1) {
			s->st[sy] = 2;
			s->issued[in->peer]++;
		}
		if (in->op == INS_SEND && in->tag >= 0 && in->tag < max_tag)
			sent[in->tag] = 1;
		if (in->op == INS_STEP) /* completes the rest (the walk's rule) */
			for (int x = s->first[d]; x < s->first[d + 1]; x++) {
				int e = s->ent[x];
				if (s->st[e] == 2) {
					s->st[e] = 3;
					s->safe[e] = dv->n_ins;
				}
			}
	}
	return moved;
}

int plan_z2_safe(const sp_plan_t *p, int32_t **out)
{
	int N = p->n_devices, rc = SP_ENOMEM, max_tag = 0, tp = 0;
	z2sim_t s = {.p = p};
	*out = NULL;
	if (z2map_init(&s.m, p))
		return SP_ENOMEM;
	if (!s.m.n_z2)
		return 0;
	s.cap = 2;
	for (int i = 0; i < p->n_slices; i++) {
		s.cap = SP_MAX(s.cap, p->slices[i].layer_to - p->slices[i].layer_from + 1);
		tp |= p->slices[i].tp > 1;
	}
	for (int i = 0; i < p->n_ins; i++)
		if (p->ins[i].op == INS_SEND || p->ins[i].op == INS_RECV)
			max_tag = SP_MAX(max_tag, p->ins[i].tag + 1);
	s.w = malloc(sizeof(int32_t) * (size_t)s.cap);
	s.st = calloc((size_t)p->n_bucket_devs + 1, 1);
	s.issued = calloc((size_t)p->n_buckets + 1, sizeof(int32_t));
	s.safe = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	int32_t *pc = calloc((size_t)N + 1, sizeof(int32_t));
	uint8_t *sent = calloc((size_t)max_tag + 1, 1), *go = calloc((size_t)N + 1, 1);
	s.first = calloc((size_t)N + 2, sizeof(int32_t));
	s.ent = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	s.bk_of = malloc(sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	s.garr = calloc((size_t)p->n_bucket_devs + 1, sizeof(int32_t));
	s.at_pg = malloc(sizeof(int32_t) * (size_t)(N + 1));
	if (!s.w || !s.st || !s.issued || !s.safe || !pc || !sent || !go || !s.first || !s.ent ||
	    !s.bk_of || !s.garr || !s.at_pg)
		goto cleanup;
	for (int d = 0; d < N; d++)
		s.at_pg[d] = -1;
	for (int i = 0; i < p->n_bucket_devs; i++)
		s.safe[i] = -1;
	/* counting sort of the zero-2 entries by device */
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; layout_grads_sharded(p->buckets[b].layout) && q < p->buckets[b].n_dev; q++) {
			s.bk_of[p->buckets[b].dev_off + q] = b;
			s.first[p->bucket_devs[p->buckets[b].dev_off + q] + 2]++;
		}
	for (int d = 0; d < N; d++)
		s.first[d + 2] += s.first[d + 1];
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; layout_grads_sharded(p->buckets[b].layout) && q < p->buckets[b].n_dev; q++)
			s.ent[s.first[p->bucket_devs[p->buckets[b].dev_off + q] + 1]++] =
				p->buckets[b].dev_off + q;
	for (int moved = !tp; moved;) {
		moved = 0;
		for (int d = 0; d < N; d++)
			moved |= z2_run(&s, d, pc, sent, go, max_tag);
		for (int d = 0; d < N && !moved; d++) /* stuck: the first waiter goes on */
			if (pc[d] < p->devices[d].n_ins &&
			    p->ins[p->devices[d].first_ins + pc[d]].op != INS_RECV &&
			    p->ins[p->devices[d].first_ins + pc[d]].op != INS_PGATHER) {
				go[d] = 1;
				moved = 1;
			}
	}
	/* what did not complete in the run: at the program's end (the STEP) */
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; layout_grads_sharded(p->buckets[b].layout) && q < p->buckets[b].n_dev; q++)
			if (s.safe[p->buckets[b].dev_off + q] < 0)
				s.safe[p->buckets[b].dev_off + q] =
					p->devices[p->bucket_devs[p->buckets[b].dev_off + q]].n_ins;
	*out = s.safe;
	s.safe = NULL;
	rc = 0;
cleanup:
	free(s.w);
	free(s.st);
	free(s.issued);
	free(s.safe);
	free(pc);
	free(sent);
	free(go);
	free(s.first);
	free(s.ent);
	free(s.bk_of);
	free(s.garr);
	free(s.at_pg);
	z2map_release(&s.m);
	return rc;
}

/* ---- the walk -------------------------------------------------------------- */

/* First fit: the lowest offset of the pool where n elements fit between
 * the live buckets b (on[b]: elements [off[b], off[b] + elems)). */
static int64_t first_fit(const sp_plan_t *p, const uint8_t *on, const int64_t *off, int64_t n)
{
	int64_t at = 0;
	for (int moved = 1; moved;) {
		moved = 0;
		for (int b = 0; b < p->n_buckets; b++)
			if (on[b] && off[b] < at + n && at < off[b] + p->buckets[b].elems) {
				at = off[b] + p->buckets[b].elems; /* overlaps: past it */
				moved = 1;
			}
	}
	return at;
}

int plan_z2_walk(const sp_plan_t *p, int d, const int32_t *safe, plan_z2_walk_t *out)
{
	const sp_device_t *dv = &p->devices[d];
	sp_z2map_t m;
	int64_t sn, so;
	int rc = 0;
	int32_t *own = NULL;
	memset(out, 0, sizeof *out);
	out->bad = -1;
	if (z2map_init(&m, p))
		return SP_ENOMEM;
	if (!m.n_z2)
		return 0;
	if (z2map_for(&m, p, d) || (!safe && plan_z2_safe(p, &own))) {
		z2map_release(&m);
		return SP_ENOMEM;
	}
	if (!safe)
		safe = own;
	int cap = 2;
	for (int k = 0; k < dv->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dv->first_ins + k];
		if (in->op == INS_BWD)
			cap = SP_MAX(cap, p->slices[in->slice].layer_to -
						  p->slices[in->slice].layer_from + 1);
	}
	uint8_t *on = calloc((size_t)p->n_buckets + 1, 1); /* 0, 1 live, 2 in flight,
							       * 3 in flight, passed once */
	int32_t *w = malloc(sizeof(int32_t) * (size_t)cap);
	out->off = malloc(sizeof(int64_t) * (size_t)(p->n_buckets + 1));
	out->done = malloc(sizeof(int32_t) * (size_t)(p->n_buckets + 1));
	if (!on || !w || !out->off || !out->done) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int b = 0; b < p->n_buckets; b++) {
		out->off[b] = out->done[b] = -1;
		if (m.mine[b] && bucket_shard(p, b, d, &so, &sn) >= 0) {
			out->shards += sn;
			out->fulls += p->buckets[b].elems;
		}
	}
	int64_t live = 0;
	for (int run = p->microbatches > 1 ? 0 : 1; run < 2; run++)
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p->ins[dv->first_ins + k];
			int nw = z2map_writes(&m, p, d, in, w, cap), alloc = 0;
			int sy = run == 1 && in->op == INS_SYNC && m.mine[in->peer] ? in->peer : -1;
			for (int j = 0; j < nw; j++) {
				alloc |= on[w[j]] == 0;
				if (on[w[j]] >= 2 && out->bad < 0)
					out->bad = k; /* a write after the SYNC */
			}
			alloc |= sy >= 0 && on[sy] == 0;
			/* before an allocation: the reduce-scatters in flight whose
			 * safe point is here or before complete; an overlapped
			 * bucket's at the next such allocation (it stays live
			 * beside the gradient placed here) */
			for (int b = 0, q; alloc && b < p->n_buckets; b++)
				if (on[b] >= 2 && (q = bucket_shard(p, b, d, &so, &sn)) >= 0 &&
				    safe[p->buckets[b].dev_off + q] <= k) {
					if (on[b] == 2 && p->buckets[b].overlap) {
						on[b] = 3;
						continue;
					}
					on[b] = 0;
					live -= p->buckets[b].elems;
					out->done[b] = k;
				}
			for (int j = 0; j <= nw; j++) {
				int b = j < nw ? w[j] : sy;
				if (b < 0 || on[b] != 0)
					continue;
				/* every step places it at the same offset: the walk
				 * is the same each step */
				out->off[b] = first_fit(p, on, out->off, p->buckets[b].elems);
				out->pool = SP_MAX(out->pool, out->off[b] + p->buckets[b].elems);
				on[b] = 1;
				live += p->buckets[b].elems;
			}
			out->peak = SP_MAX(out->peak, live);
			if (sy >= 0)
				on[sy] = 2;
			for (int b = 0; in->op == INS_STEP && b < p->n_buckets; b++)
				if (on[b] >= 2) {
					on[b] = 0;
					live -= p->buckets[b].elems;
					out->done[b] = k;
				}
		}
cleanup:
	free(on);
	free(w);
	free(own);
	z2map_release(&m);
	if (rc)
		plan_z2_walk_release(out);
	return rc;
}

void plan_z2_walk_release(plan_z2_walk_t *w)
{
	if (!w)
		return;
	free(w->off);
	free(w->done);
	w->off = NULL;
	w->done = NULL;
}
