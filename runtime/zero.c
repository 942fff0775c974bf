/*
 * zero.c — the zero-2 and zero-3 parts of executing a program (interp.c):
 * where each zero-2 bucket's full gradient and each zero-3 span's gathered
 * weights are placed in the rank's pools (set-up, from the walks of
 * schemas/plan_zero2.c and plan_zero3.c), placing and giving back full
 * gradients as the step runs, and the zero-3 spans' per-layer gathers
 * (PGATHER, PFREE, and each use of a layer). interp.c's header describes
 * the layouts; this file does not plan and allocates nothing mid-step.
 */
#include "interp_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Zero-2 (set-up): which of the rank's zero-2 buckets each instruction
 * writes gradients into (z2map_writes: a BWD's layers, a LOSS's head), and
 * where each bucket's full gradient lives in the rank's one pool of them
 * (plan_z2_walk, the walk plan_mem.c counts): a full gradient is placed
 * (zeroed) at the first instruction writing into it (or at its SYNC if
 * none did) and given back once its reduce-scatter, started at the SYNC,
 * is complete: before the step places another, it completes the
 * reduce-scatters in flight whose completion point (plan_z2_walk's done:
 * the first placement at or past the safe point of plan_z2_safe, where
 * waiting cannot deadlock; an overlapped bucket's the next one) is at or
 * before that instruction, and at STEP all of them. One pool allocated at start-up: no allocation mid-step (on CUDA a
 * cudaMalloc/cudaFree there would wait for an NCCL kernel that waits for
 * a peer). k > 1 micro-batches: the first k - 1 runs have no SYNC, so
 * every full gradient stays placed until the last run's SYNC (gradients
 * accumulate in it; plan_mem.c's header says why). A write after the
 * bucket's SYNC is refused (SP_EINPUT with st->why): the full gradient is
 * gone by then (the verifier rejects such a plan).
 */
int rt_zero2_setup(rt_state_t *st)
{
	const sp_plan_t *p = st->p;
	sp_z2map_t zm;
	plan_z2_walk_t wk = {0};
	int32_t *safe = NULL, *w = NULL;
	int rc = z2map_init(&zm, p), cap = 2, n = 0, ncap = 16;
	st->z2_off = calloc((size_t)st->n_ins + 2, sizeof(int));
	if (rc || !st->z2_off) {
		z2map_release(&zm);
		return SP_ENOMEM;
	}
	if (!zm.n_z2)
		return 0;
	rc = SP_ENOMEM;
	if (plan_z2_safe(p, &safe) || plan_z2_walk(p, st->rank, safe, &wk))
		goto cleanup;
	if (wk.bad >= 0) {
		snprintf(st->why, sizeof st->why,
			 "instruction %d writes gradients of a zero-2 bucket after its SYNC (its "
			 "full gradient is freed there)",
			 wk.bad);
		rc = SP_EINPUT;
		goto cleanup;
	}
	for (int i = 0; i < st->n_mb; i++)
		if (st->mb[i].zero2) {
			int32_t done = wk.done[st->mb[i].bucket];
			st->mb[i].done = done < 0 ? INT_MAX : done;
			st->mb[i].zoff = wk.off[st->mb[i].bucket];
		}
	st->z2_acct = wk.pool;
	st->z2_peak = wk.peak;
	for (int k = 0; k < st->n_ins; k++)
		if (st->prog[k].op == INS_BWD)
			cap = SP_MAX(cap, p->slices[st->prog[k].slice].layer_to -
						  p->slices[st->prog[k].slice].layer_from + 1);
	w = malloc(sizeof(int32_t) * (size_t)cap);
	st->z2_list = malloc(sizeof(int) * (size_t)ncap);
	if (!w || !st->z2_list)
		goto cleanup;
	for (int k = 0; k < st->n_ins; k++) {
		int nw = z2map_writes(&zm, p, st->rank, &st->prog[k], w, cap);
		for (int j = 0; j < nw; j++) {
			if (n == ncap) {
				int *nl = realloc(st->z2_list, sizeof(int) * (size_t)(ncap *= 2));
				if (!nl)
					goto cleanup;
				st->z2_list = nl;
			}
			int i = 0;
			while (st->mb[i].bucket != w[j]) /* a member: z2map_writes checked */
				i++;
			st->z2_list[n++] = i;
		}
		st->z2_off[k + 1] = n;
	}
	rc = 0;
cleanup:
	free(w);
	free(safe);
	plan_z2_walk_release(&wk);
	z2map_release(&zm);
	return rc;
}

/*
 * Zero-3 (set-up): where each PGATHER places its bucket's full weights in
 * the rank's one pool of them (plan_z3_walk, the walk plan_mem.c counts),
 * so nothing is allocated mid-step. A program that uses zero-3 weights
 * outside a PGATHER .. PFREE span is refused (SP_EINPUT with st->why; the
 * verifier rejects such a plan).
 */
int rt_zero3_setup(rt_state_t *st)
{
	plan_z3_walk_t wk;
	if (plan_z3_walk(st->p, st->rank, &wk))
		return SP_ENOMEM;
	if (wk.bad >= 0) {
		snprintf(st->why, sizeof st->why, "instruction %d %s", wk.bad, wk.why);
		plan_z3_walk_release(&wk);
		return SP_EINPUT;
	}
	st->z3_at = wk.off; /* NULL without zero-3 buckets */
	if (wk.off) {
		st->z3_seq = calloc((size_t)st->n_ins + 1, sizeof(int32_t *));
		st->z3_seqn = calloc((size_t)st->n_ins + 1, sizeof(int));
		if (!st->z3_seq || !st->z3_seqn)
			return SP_ENOMEM;
		for (int k = 0, whole; k < st->n_ins; k++)
			if (st->prog[k].op == INS_PGATHER) {
				st->z3_seqn[k] = plan_z3_span(st->p, st->rank, k, &st->z3_seq[k], &whole);
				if (st->z3_seqn[k] < 0)
					return SP_ENOMEM;
				if (whole)
					st->z3_seqn[k] = -1; /* gathered whole at the PGATHER */
			}
	}
	int g = 1;
	for (int i = 0; i < st->n_mb; i++)
		g = SP_MAX(g, st->p->buckets[st->mb[i].bucket].n_dev);
	st->z3_parts = malloc(sizeof(int64_t) * 2 * (size_t)g);
	if (!st->z3_parts)
		return SP_ENOMEM;
	st->z3_acct = wk.pool;
	st->z3_peak = wk.peak;
	st->z3_whole = wk.whole;
	return 0;
}

/* A zero-2 bucket's reduce-scatter is complete: its shard's sum (at the
 * shard's place in the full gradient) to gs, and the full gradient freed. */
int rt_z2_finish(rt_state_t *st, mybucket_t *mb, sp_err_t *err)
{
	int rc = rt_wait_req(st, &mb->req, mb->sync, err);
	if (rc)
		return rc;
	if (mb->sn > 0)
		st->b->copy_rows(st->gs + mb->gsoff, mb->sn, mb->full + (mb->soff - mb->off), mb->sn,
				 1, mb->sn, 0);
	st->b->sync();
	mb->full = NULL; /* its place in the pool is free */
	mb->rs = 0;
	st->z2_live -= mb->n;
	return 0;
}

/* Zero-2 bucket mb's full gradient, at its place in the pool, zeroed,
 * after completing the reduce-scatters in flight whose completion point is
 * at or before instruction k (rt_zero2_setup's rule). Checks what the walk promised:
 * the place is free (no live full gradient overlaps it), and the most live
 * at once stays the walk's peak. */
int rt_z2_alloc(rt_state_t *st, mybucket_t *mb, int k, sp_err_t *err)
{
	for (int i = 0; i < st->n_mb; i++)
		if (st->mb[i].rs && st->mb[i].done <= k) {
			int rc = rt_z2_finish(st, &st->mb[i], err);
			if (rc)
				return rc;
		}
	for (int i = 0; i < st->n_mb; i++) {
		const mybucket_t *o = &st->mb[i];
		if (o->full && o->zoff < mb->zoff + mb->n && mb->zoff < o->zoff + o->n)
			return rt_fail(st, err, k, "a zero-2 full gradient's place is still in use");
	}
	if (mb->zoff < 0 || mb->zoff + mb->n > st->z2_acct)
		return rt_fail(st, err, k, "a zero-2 full gradient has no place in the pool");
	mb->full = st->z2pool + mb->zoff;
	st->b->zero(mb->full, mb->n);
	st->z2_live += mb->n;
	st->z2_hwm = SP_MAX(st->z2_hwm, st->z2_live);
	if (st->z2_hwm > st->z2_peak)
		return rt_fail(st, err, k, "zero-2 full gradients exceed their accounted peak");
	return 0;
}

/* Before instruction k writes gradients: the full gradients it writes into. */
int rt_z2_touch(rt_state_t *st, int k, sp_err_t *err)
{
	for (int j = st->z2_off[k]; j < st->z2_off[k + 1]; j++) {
		mybucket_t *mb = &st->mb[st->z2_list[j]];
		int rc = mb->full ? 0 : rt_z2_alloc(st, mb, k, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every full gradient freed without a reduce-scatter (after an evaluation,
 * whose losses write gradients nobody reads). */
void rt_z2_drop(rt_state_t *st)
{
	for (int i = 0; i < st->n_mb; i++)
		if (st->mb[i].full && !st->mb[i].rs) {
			st->mb[i].full = NULL;
			st->z2_live -= st->mb[i].n;
		}
}

/*
 * Zero-3 spans (the header's). z3_start starts the all-gather of the
 * span's next layer (z3seq[z3pos]) into slot z3pos % 2 of mb's room
 * (plan_z3_room): the layer [lo, lo + n) of the bucket straddles the
 * members' shards (comm_shard of the bucket over its group), member i
 * gives its shard's intersection with the layer at that part's place (the
 * rank copies its own there first), so every element of the layer crosses
 * the network once (one all-gather with per-member parts: rt_comm_ops_t
 * iallgatherv). It is in flight (z3next) until z3_land waits for it and
 * gives back the layer before it (z3cur), whose slot the layer after will
 * take. rt_z3_need starts the next layer's gather as soon as a layer is
 * about to run (prefetch one ahead): the gather overlaps the layer's
 * compute, and each member starts the same gathers in the same order.
 */
static int z3_start(rt_state_t *st, mybucket_t *mb, int k, sp_err_t *err)
{
	const rt_backend_t *b = st->b;
	int pos = mb->z3pos++;
	int si = mb->hfirst + mb->z3seq[pos];
	int g = st->p->buckets[mb->bucket].n_dev;
	int64_t lo = st->poff[si] - mb->off, n = st->pcount[si], mine = mb->soff - mb->off;
	int64_t *cnt = st->z3_parts, *off = st->z3_parts + g;
	float *room = mb->wfull + (pos % 2 ? mb->z3slot1 : 0);
	st->z3_live += n;
	st->z3_hwm = SP_MAX(st->z3_hwm, st->z3_live);
	if (st->z3_hwm > st->z3_peak)
		return rt_fail(st, err, k, "more zero-3 weights gathered at once than the walk's peak");
	mb->z3next = si;
	mb->z3nw = room;
	mb->z3nhave = n;
	for (int i = 0; i < g; i++) {
		int64_t so, sn;
		comm_shard(mb->n, i, g, &so, &sn);
		int64_t a = SP_MAX(lo, so), z = SP_MIN(lo + n, so + sn);
		cnt[i] = z > a ? z - a : 0;
		off[i] = z > a ? a - lo : 0;
	}
	int64_t a = SP_MAX(lo, mine), z = SP_MIN(lo + n, mine + mb->sn);
	if (z > a)
		b->copy_rows(room + (a - lo), z - a, st->ws + mb->wsoff + (a - mine), z - a, 1, z - a,
			     0);
	b->sync();
	if (st->c->ops->iallgatherv(st->c, room, g, cnt, off, mb->group, &mb->z3req))
		return rt_fail(st, err, k, "starting the all-gather of a zero-3 layer failed");
	return 0;
}

static int z3_land(rt_state_t *st, mybucket_t *mb, int k, sp_err_t *err)
{
	int rc = rt_wait_req(st, &mb->z3req, k, err);
	if (rc)
		return rc;
	st->z3_live -= mb->z3have;
	mb->z3cur = mb->z3next;
	mb->z3w = mb->z3nw;
	mb->z3have = mb->z3nhave;
	mb->z3next = -1;
	mb->z3nw = NULL;
	mb->z3nhave = 0;
	return 0;
}

/* Before instruction k runs held layer si: its weights in its bucket's
 * room (the gather in flight waited for when it is si's), then the next
 * layer's gather started; a deferred bucket's: the piece of si landed. */
int rt_z3_need(rt_state_t *st, int si, int k, sp_err_t *err)
{
	mybucket_t *mb = &st->mb[st->pmb[si]];
	int rc = 0;
	if (mb->dpend) /* deferred: si's piece waited for (rt_defer_start) */
		return rt_defer_land(st, mb, mb->dpiece[si - mb->hfirst], k, 1, err);
	if (!mb->zero3 || (mb->wfull && mb->z3cur == -2))
		return 0;
	if (!mb->wfull)
		return rt_fail(st, err, k, "uses zero-3 weights that are not gathered");
	if (mb->z3cur != si) {
		if (mb->z3next != si)
			return rt_fail(st, err, k, "uses a zero-3 layer out of its span's gather order");
		if ((rc = z3_land(st, mb, k, err)))
			return rc;
	}
	return mb->z3next < 0 && mb->z3pos < mb->z3n ? z3_start(st, mb, k, err) : 0;
}

/* PGATHER: opens the span and gathers its first layer (a rendezvous of
 * the bucket's members, as the verifier models it), or the whole bucket
 * (plan_z3_span's whole spans). PFREE: gathers the span's layers not yet
 * gathered (the one in flight, then the rest), then gives the room back. */
int rt_exec_zero3(rt_state_t *st, int k, sp_err_t *err)
{
	const sp_ins_t *in = &st->prog[k];
	mybucket_t *mb = NULL;
	int rc = 0;
	for (int i = 0; i < st->n_mb && !mb; i++)
		if (st->mb[i].bucket == in->peer && st->mb[i].zero3)
			mb = &st->mb[i];
	if (!mb)
		return rt_fail(st, err, k, "not a member of this zero-3 bucket");
	if (in->op == INS_PFREE) {
		if (!mb->wfull)
			return rt_fail(st, err, k, "frees zero-3 weights that are not gathered");
		while (!rc && (mb->z3next >= 0 || mb->z3pos < mb->z3n))
			rc = mb->z3next >= 0 ? z3_land(st, mb, k, err) : z3_start(st, mb, k, err);
		mb->wfull = mb->z3w = NULL;
		mb->z3cur = -1;
		st->z3_live -= mb->z3have;
		mb->z3have = 0;
		return rc;
	}
	if (mb->wfull || !st->z3_at || st->z3_at[k] < 0 || st->z3_at[k] > st->z3_acct)
		return rt_fail(st, err, k, "gathers zero-3 weights outside the walk's pool");
	mb->wfull = st->z3pool + st->z3_at[k];
	mb->z3seq = st->z3_seq[k];
	mb->z3n = st->z3_seqn[k];
	mb->z3pos = 0;
	mb->z3cur = mb->z3next = -1;
	mb->z3have = mb->z3nhave = 0;
	if (mb->z3n < 0) { /* whole: the shard into its place, the rest gathered */
		if (st->z3_at[k] + mb->n > st->z3_acct)
			return rt_fail(st, err, k, "gathers zero-3 weights outside the walk's pool");
		mb->z3cur = -2;
		mb->z3have = mb->n;
		st->z3_live += mb->n;
		st->z3_hwm = SP_MAX(st->z3_hwm, st->z3_live);
		if (st->z3_hwm > st->z3_peak)
			return rt_fail(st, err, k,
				    "more zero-3 weights gathered at once than the walk's peak");
		rt_req_t r = {0};
		st->b->copy_rows(mb->wfull + (mb->soff - mb->off), mb->sn, st->ws + mb->wsoff,
				 mb->sn, 1, mb->sn, 0);
		st->b->sync();
		if (st->c->ops->iallgather(st->c, mb->wfull, mb->n, mb->group, &r))
			return rt_fail(st, err, k, "starting the all-gather failed");
		return rt_wait_req(st, &r, k, err);
	}
	int64_t pair, room = plan_z3_room(st->p, mb->bucket, mb->z3seq, mb->z3n, &mb->z3slot1,
					  &pair);
	if (st->z3_at[k] + room > st->z3_acct)
		return rt_fail(st, err, k, "gathers a zero-3 layer outside the walk's pool");
	if (!mb->z3n)
		return 0;
	rc = z3_start(st, mb, k, err);
	return rc ? rc : z3_land(st, mb, k, err);
}

int rt_zero3_peak(const rt_state_t *st, int64_t *most, int64_t *peak, int64_t *pool,
		  int64_t *whole)
{
	*whole = st->z3_whole * (int64_t)sizeof(float);
	*most = st->z3_hwm * (int64_t)sizeof(float);
	*peak = st->z3_peak * (int64_t)sizeof(float);
	*pool = st->z3_acct * (int64_t)sizeof(float);
	return st->n_ws > 0;
}

int rt_zero2_peak(const rt_state_t *st, int64_t *most, int64_t *peak, int64_t *pool)
{
	int any = 0;
	for (int i = 0; i < st->n_mb; i++)
		any |= st->mb[i].zero2;
	*most = st->z2_hwm * (int64_t)sizeof(float);
	*peak = st->z2_peak * (int64_t)sizeof(float);
	*pool = st->z2_acct * (int64_t)sizeof(float);
	return any;
}
