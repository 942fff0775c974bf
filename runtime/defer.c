/*
 * defer.c — the deferred all-gathers of zero-1/2 buckets (bucket defer,
 * plan format 9) while a program executes (interp.c): each deferred
 * bucket's pieces (plan_defer_pieces) and, under --check-deferred, its
 * staging buffer (set-up); the pieces started after the STEP's last
 * update; the waits for them (before the first layer reading a piece:
 * rt_z3_need in zero.c calls rt_defer_land; before the next STEP's
 * updates; rt_settle before anything reads the whole weights: digest,
 * checkpoint, export, evaluation, the end); polling between
 * instructions; the counts spindle-run reports. interp.c decides when
 * (it dispatches); this file owns the pieces' state in mybucket_t. It
 * does not plan (the pieces and their order are the plan's) and
 * allocates nothing mid-step.
 *
 * A deferred zero-1/2 bucket's all-gather is started after the STEP's
 * last update as one all-gather per piece, in dord order (the same on
 * every member: the first member's first uses), each of the members'
 * parts of the piece's element range [lo, hi) (member i's shard
 * intersected with it, at its place; the rank's own part is there
 * already: STEP updated it), so every element crosses the network once,
 * as in the one all-gather of the whole bucket. The next step waits for a
 * piece just before the first layer that reads one of its params
 * (rt_z3_need), so the forward runs its first layers while the later
 * pieces still move; pieces no layer read are waited for at the STEP
 * (before its updates: an update must not write the rank's part of a
 * piece still in flight, nor start its next all-gather over it), and all
 * of them by rt_settle. Only a member that runs none of a piece's layers
 * leaves it to the STEP, which no planned plan has (the planner's
 * members run every layer of their buckets each step; defer_step.py in
 * tests/runtime makes one). --check-deferred gathers into dstage instead and
 * NaNs the bucket's weights, the rank's own part too (in flight it is the
 * all-gather's send buffer, which nothing may write: an update of it
 * before its piece's wait, as a STEP without its wait would make, reads
 * NaN): a piece's range lands (is copied into the weights) at its wait,
 * so a layer that ran before its piece's wait reads NaN. Starting a
 * piece whose last all-gather is still in flight is refused (its request
 * would be lost, its landing never counted).
 */
#include "interp_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Set-up: which of the rank's buckets are deferred (zero-1/2 with a
 * GATHER and bucket defer k >= 1), their pieces, and (--check-deferred)
 * their staging buffers. */
int rt_defer_setup(rt_state_t *st)
{
	for (int i = 0; i < st->n_mb; i++) {
		mybucket_t *mb = &st->mb[i];
		mb->defer = mb->gather >= 0 && st->p->buckets[mb->bucket].defer;
		mb->dpend = 0;
	}
	st->n_dpend = 0;
	for (int i = 0; i < st->n_mb; i++) {
		mybucket_t *mb = &st->mb[i];
		if (!mb->defer)
			continue;
		int np = st->p->buckets[mb->bucket].n_params;
		mb->dfirst = malloc(sizeof(int32_t) * (size_t)(3 * np + 2));
		mb->dreq = calloc((size_t)np + 1, sizeof(rt_req_t));
		mb->dbusy = calloc((size_t)np + 1, 1);
		if (!mb->dfirst || !mb->dreq || !mb->dbusy)
			return SP_ENOMEM;
		mb->dord = mb->dfirst + np + 1;
		mb->dpiece = mb->dord + np + 1;
		if ((mb->dn = plan_defer_pieces(st->p, mb->bucket, st->p->buckets[mb->bucket].defer,
						   mb->dfirst, mb->dord)) < 0)
			return mb->dn;
		for (int j = 0; j < mb->dn; j++)
			for (int q = mb->dfirst[j]; q < mb->dfirst[j + 1]; q++)
				mb->dpiece[q] = j;
		if (st->o.check_deferred &&
		    !(mb->dstage = malloc(sizeof(float) * (size_t)SP_MAX(mb->n, 1))))
			return SP_ENOMEM;
	}
	return 0;
}

void rt_defer_release(rt_state_t *st)
{
	for (int i = 0; st->mb && i < st->n_mb; i++) {
		free(st->mb[i].dstage);
		free(st->mb[i].dfirst);
		free(st->mb[i].dreq);
		free(st->mb[i].dbusy);
	}
}

/* Piece j of deferred bucket mb: its element range [lo, hi) in the bucket. */
static void defer_range(const rt_state_t *st, const mybucket_t *mb, int j, int64_t *lo,
			int64_t *hi)
{
	int a = mb->hfirst + mb->dfirst[j], z = mb->hfirst + mb->dfirst[j + 1] - 1;
	*lo = st->poff[a] - mb->off;
	*hi = st->poff[z] + st->pcount[z] - mb->off;
}

/* The pieces of deferred bucket mb started (k: its GATHER). */
static int defer_start(rt_state_t *st, mybucket_t *mb, int k, sp_err_t *err)
{
	int g = st->p->buckets[mb->bucket].n_dev;
	int64_t *cnt = st->z3_parts, *off = st->z3_parts + g;
	float *w = st->w + mb->wc, *buf = mb->dstage ? mb->dstage : w;
	for (int j = 0; j < mb->dn; j++)
		if (mb->dbusy[j]) /* its request would be lost */
			return rt_fail(st, err, k, "starts a deferred piece whose last all-gather "
						   "is still in flight");
	if (mb->dstage) { /* --check-deferred: the rank's part to the staging
			   * buffer, the whole bucket NaN in the weights */
		memcpy(mb->dstage, w, sizeof(float) * (size_t)mb->n);
		for (int64_t i = 0; i < mb->n; i++)
			w[i] = NAN;
	}
	for (int x = 0; x < mb->dn; x++) {
		int j = mb->dord[x];
		int64_t lo, hi;
		defer_range(st, mb, j, &lo, &hi);
		for (int i = 0; i < g; i++) {
			int64_t so, sn;
			comm_shard(mb->n, i, g, &so, &sn);
			int64_t a = SP_MAX(lo, so), z = SP_MIN(hi, so + sn);
			cnt[i] = z > a ? z - a : 0;
			off[i] = z > a ? a - lo : 0;
		}
		if (st->c->ops->iallgatherv(st->c, buf + lo, g, cnt, off, mb->group, &mb->dreq[j]))
			return rt_fail(st, err, k, "starting the all-gather of a deferred piece failed");
		mb->dbusy[j] = 1;
		mb->dpend++;
		st->n_dpend++;
	}
	mb->dstep = st->n_steps;
	return 0;
}

/* The deferred ones after the STEP's last update, in the reverse order of
 * the SYNCs (the next forward's order; on every member the same); the
 * next step waits for each piece before the first layer reading it
 * (rt_z3_need). */
int rt_defer_start_all(rt_state_t *st, sp_err_t *err)
{
	if (st->n_mb)
		st->b->sync();
	for (int q = st->n_mb - 1; q >= 0; q--) {
		mybucket_t *mb = &st->mb[st->step_order[q]];
		if (mb->gather < 0 || !mb->defer)
			continue;
		if (defer_start(st, mb, mb->gather, err))
			return err->code;
		mb->gstarted = 1;
	}
	return 0;
}

/* Piece j done: its range landed (--check-deferred: copied in), counted. */
static void defer_done(rt_state_t *st, mybucket_t *mb, int j, int later)
{
	if (mb->dstage) {
		int64_t lo, hi;
		defer_range(st, mb, j, &lo, &hi);
		memcpy(st->w + mb->wc + lo, mb->dstage + lo, sizeof(float) * (size_t)(hi - lo));
	}
	mb->dbusy[j] = 0;
	mb->dpend--;
	st->n_dpend--;
	if (!later)
		st->d_settled++;
	else if (st->n_steps > mb->dstep)
		st->d_later++;
}

int rt_defer_land(rt_state_t *st, mybucket_t *mb, int j, int k, int later, sp_err_t *err)
{
	if (!mb->dbusy[j])
		return 0;
	int rc = rt_wait_req(st, &mb->dreq[j], k, err);
	if (!rc)
		defer_done(st, mb, j, later);
	return rc;
}

/* Waits for every piece of the deferred all-gathers still in flight (the
 * STEP's: no use read them; rt_settle's). later: counted as completed in a
 * later step (when it is one), else by rt_settle. */
static int defer_wait(rt_state_t *st, int later, sp_err_t *err)
{
	for (int i = 0; i < st->n_mb && st->n_dpend; i++) {
		mybucket_t *mb = &st->mb[i];
		for (int j = 0; j < mb->dn && mb->dpend; j++) {
			int rc = rt_defer_land(st, mb, j, mb->gather, later, err);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int rt_defer_step_wait(rt_state_t *st, sp_err_t *err)
{
	return st->n_dpend ? defer_wait(st, 1, err) : 0;
}

int rt_defer_poll(rt_state_t *st, sp_err_t *err)
{
	for (int i = 0; i < st->n_mb && st->n_dpend; i++) {
		mybucket_t *mb = &st->mb[i];
		if (!mb->dpend || mb->dstage) /* --check-deferred: lands at the wait */
			continue;
		for (int j = 0; j < mb->dn; j++) {
			int done = 0;
			if (!mb->dbusy[j])
				continue;
			if (st->c->ops->test(st->c, &mb->dreq[j], &done))
				return rt_fail(st, err, mb->gather, "communication failed");
			if (done)
				defer_done(st, mb, j, 1);
		}
	}
	return 0;
}

int rt_settle_pending(rt_state_t *st, sp_err_t *err)
{
	return st && st->n_dpend ? defer_wait(st, 0, err) : 0;
}

int rt_settle(rt_state_t *st, sp_err_t *err)
{
	int rc = rt_settle_pending(st, err);
	if (!rc)
		st->b->sync();
	return rc;
}

void rt_deferred(const rt_state_t *st, int64_t *later, int64_t *settled)
{
	*later = st->d_later;
	*settled = st->d_settled;
}

void rt_defer_shape(const rt_state_t *st, int *buckets, int *pieces)
{
	*buckets = *pieces = 0;
	for (int i = 0; i < st->n_mb; i++) {
		*buckets += st->mb[i].defer;
		*pieces += st->mb[i].defer ? st->mb[i].dn : 0;
	}
}
