/*
 * verify_zero2.c — the verifier's rules for zero-2 buckets (layout 2), run
 * inside verify.c's execution of all programs.
 *
 * A member of a zero-2 bucket holds the bucket's full gradient from the
 * first instruction of its program that writes into it (a BWD of one of the
 * bucket's layers, a LOSS of its lm_head or classifier; z2map_writes) until
 * its SYNC, which reduce-scatters it into the member's shard and frees it.
 * So:
 *   used after free   an instruction that writes gradients of a zero-2
 *                     bucket after the device's SYNC of that bucket
 *   completion        before it allocates the next full gradient (a
 *                     bucket's first write, or the SYNC of a bucket nothing
 *                     wrote) the runtime completes the device's zero-2
 *                     reduce-scatters in flight whose safe point is at or
 *                     before that instruction (plan_z2_safe; interp.c
 *                     z2_alloc; plan_mem.c counts the full gradients that
 *                     way); the allocation waits here until every member
 *                     has issued them, which by construction of the safe
 *                     points never deadlocks (a deadlock would be named by
 *                     verify.c's report). An overlapped bucket (its flag)
 *                     completes one placement later in the runtime
 *                     (plan_z2_walk's done); the wait modelled here, at
 *                     the first, is the earlier one: where it cannot
 *                     deadlock, the later cannot either. The memory
 *                     rule counts the overlapped walk (plan_mem.c).
 * It does not price anything (sim.c waits where the runtime does).
 */
#include "verify.h"

#include <stdlib.h>

static int bucket_member(const sp_plan_t *p, int b, int d)
{
	int64_t off, n;
	return bucket_shard(p, b, d, &off, &n) >= 0;
}

int vz2_prepare(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	vz2_t *z = &st->z2;
	int rc = z2map_init(&z->map, p);
	if (rc || !z->map.n_z2 || (rc = plan_z2_safe(p, &z->safe)))
		return rc;
	int cap = 2;
	for (int s = 0; s < p->n_slices; s++)
		cap = SP_MAX(cap, p->slices[s].layer_to - p->slices[s].layer_from + 1);
	z->cap = cap;
	z->w = sp_arena_calloc(&st->arena, (size_t)cap, sizeof(int32_t));
	z->state = sp_arena_calloc(&st->arena, (size_t)p->n_bucket_devs + 1, 1);
	z->pend = sp_arena_calloc(&st->arena, (size_t)p->n_devices + 1, sizeof(int32_t *));
	z->n_pend = sp_arena_calloc(&st->arena, (size_t)p->n_devices + 1, sizeof(int));
	z->cap_pend = sp_arena_calloc(&st->arena, (size_t)p->n_devices + 1, sizeof(int));
	if (!z->w || !z->state || !z->pend || !z->n_pend || !z->cap_pend)
		return SP_ENOMEM;
	return 0;
}

void vz2_release(vstate_t *st)
{
	z2map_release(&st->z2.map);
	free(st->z2.safe);
	st->z2.safe = NULL;
}

/* The first instruction of device d before which every member's SYNC of
 * zero-2 bucket b happens. */
static int safe_at(vstate_t *st, int b, int d)
{
	int64_t off, n;
	return st->z2.safe[st->p->buckets[b].dev_off + bucket_shard(st->p, b, d, &off, &n)];
}

/* Device d's state of zero-2 bucket b: 0 no full gradient yet, 1 live,
 * 2 synced (freed). */
static char *state_of(vstate_t *st, int b, int d)
{
	int64_t off, n;
	int q = bucket_shard(st->p, b, d, &off, &n);
	return &st->z2.state[st->p->buckets[b].dev_off + q];
}

/* Whether instruction in of device d allocates a full gradient: writes into
 * a bucket with none yet, or syncs a bucket nothing wrote. Fills z->w
 * (writes) and *nw. */
static int allocates(vstate_t *st, int d, const sp_ins_t *in, int *nw)
{
	vz2_t *z = &st->z2;
	const sp_plan_t *p = st->p;
	int any = 0;
	*nw = z2map_writes(&z->map, p, d, in, z->w, z->cap);
	for (int j = 0; j < *nw; j++)
		any |= *state_of(st, z->w[j], d) == 0;
	if (in->op == INS_SYNC && p->buckets[in->peer].layout == LAYOUT_ZERO2 &&
	    bucket_member(p, in->peer, d))
		any |= *state_of(st, in->peer, d) == 0;
	return any;
}

int vz2_wait(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	vz2_t *z = &st->z2;
	int nw;
	if (!z->map.n_z2 || !z->n_pend[d] || !allocates(st, d, in, &nw))
		return 0;
	for (int j = 0; j < z->n_pend[d]; j++) {
		int b = z->pend[d][j];
		if (safe_at(st, b, d) <= k && st->issued[b] < st->p->buckets[b].n_dev)
			return 1;
	}
	return 0;
}

int vz2_exec(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	vz2_t *z = &st->z2;
	const sp_plan_t *p = st->p;
	int nw;
	if (!z->map.n_z2)
		return 0;
	if (allocates(st, d, in, &nw)) { /* the safe ones complete: freed */
		int left = 0;
		for (int j = 0; j < z->n_pend[d]; j++)
			if (safe_at(st, z->pend[d][j], d) > k)
				z->pend[d][left++] = z->pend[d][j];
		z->n_pend[d] = left;
	}
	for (int j = 0; j < nw; j++) {
		char *s = state_of(st, z->w[j], d);
		if (*s == 2)
			return verify_fail(st, d, k,
				    "zero-2 gradient used after it was freed: writes gradients of "
				    "bucket %d after this device's SYNC of it",
				    (int)z->w[j]);
		*s = 1;
	}
	if (in->op == INS_STEP)
		z->n_pend[d] = 0;
	if (in->op != INS_SYNC || p->buckets[in->peer].layout != LAYOUT_ZERO2 ||
	    !bucket_member(p, in->peer, d))
		return 0;
	*state_of(st, in->peer, d) = 2;
	if (sp_arena_grow(&st->arena, (void **)&z->pend[d], &z->cap_pend[d], z->n_pend[d] + 1,
			  sizeof(int32_t)))
		return SP_ENOMEM;
	z->pend[d][z->n_pend[d]++] = in->peer;
	return 0;
}
