/*
 * verify_zero3.c — the verifier's rules for the weights of zero-3 buckets
 * (layout 3; their gradients follow the zero-2 rules, verify_zero2.c), run
 * before and inside verify.c's execution of all programs.
 *
 * A member of a zero-3 bucket keeps only its shard of the bucket's weights;
 * its full weights exist from a PGATHER to the next PFREE of the bucket in
 * its program (plan_z3_walk, plan_zero3.c, which plan_mem.c and the
 * runtime share). So:
 *   used before gather  a FWD, BWD or LOSS of a layer of a zero-3 bucket
 *   or after free       the device belongs to while its weights are not
 *                       gathered; a PGATHER of weights already gathered,
 *                       a PFREE of weights not gathered, a program that
 *                       ends with weights gathered, a PGATHER or PFREE by
 *                       a device outside the bucket's group
 *   rendezvous          a PGATHER is an all-gather over the bucket's
 *                       group: a member's n-th PGATHER of the bucket runs
 *                       once every member has reached its n-th (members
 *                       that gather in different orders deadlock here and
 *                       are named; members with different counts leave a
 *                       gather unmatched)
 *   layer order         in a span the layers are all-gathered one at a
 *                       time as the uses reach them (plan_z3_span): a
 *                       member whose uses run them in another order than
 *                       the others' is named (plan_z3_walk). This run
 *                       models the PGATHER (the span's first layer) as the
 *                       rendezvous; the later layers' gathers inside the
 *                       uses are not modelled: the uses of one slice and
 *                       direction follow each other in the lowering's
 *                       sequence, as tensor-parallel FWD/BWD do
 * It does not price anything (sim.c does).
 */
#include "verify.h"

#include <stdlib.h>

int vz3_prepare(vstate_t *st)
{
	const sp_plan_t *p = st->p;
	int any = 0;
	for (int b = 0; b < p->n_buckets; b++)
		any |= p->buckets[b].layout == LAYOUT_ZERO3;
	if (!any)
		return 0;
	st->z3.garr = sp_arena_calloc(&st->arena, (size_t)p->n_bucket_devs + 1, sizeof(int32_t));
	st->z3.round = sp_arena_calloc(&st->arena, (size_t)p->n_ins + 1, sizeof(int32_t));
	if (!st->z3.garr || !st->z3.round)
		return SP_ENOMEM;
	for (int d = 0; d < p->n_devices; d++) {
		plan_z3_walk_t w;
		if (plan_z3_walk(p, d, &w))
			return SP_ENOMEM;
		int bad = w.bad;
		const char *why = w.why;
		plan_z3_walk_release(&w);
		if (bad >= 0)
			return verify_fail(st, d, bad, "zero-3: the instruction %s", why);
	}
	/* every member gathers each bucket equally often */
	int32_t *cnt = sp_arena_calloc(&st->arena, (size_t)p->n_bucket_devs + 1, sizeof(int32_t));
	if (!cnt)
		return SP_ENOMEM;
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			int64_t off, n;
			int q;
			if (in->op == INS_PGATHER && (q = bucket_shard(p, in->peer, d, &off, &n)) >= 0)
				cnt[p->buckets[in->peer].dev_off + q]++;
		}
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		for (int q = 1; bk->layout == LAYOUT_ZERO3 && q < bk->n_dev; q++)
			if (cnt[bk->dev_off + q] != cnt[bk->dev_off])
				return verify_fail(st, -1, -1,
						   "zero-3: devices %d and %d gather the weights of "
						   "bucket %d %d and %d times (every member takes part "
						   "in each all-gather)",
						   p->bucket_devs[bk->dev_off],
						   p->bucket_devs[bk->dev_off + q], b,
						   cnt[bk->dev_off], cnt[bk->dev_off + q]);
	}
	return 0;
}

int vz3_wait(vstate_t *st, int d, int k, const sp_ins_t *in)
{
	const sp_plan_t *p = st->p;
	int64_t off, n;
	if (in->op != INS_PGATHER || !st->z3.garr)
		return 0;
	const sp_bucket_t *bk = &p->buckets[in->peer];
	int q = bucket_shard(p, in->peer, d, &off, &n), g = p->devices[d].first_ins + k;
	if (q < 0)
		return 0; /* vz3_prepare named it */
	if (!st->z3.round[g])
		st->z3.round[g] = ++st->z3.garr[bk->dev_off + q];
	for (int j = 0; j < bk->n_dev; j++)
		if (st->z3.garr[bk->dev_off + j] < st->z3.round[g])
			return 1;
	return 0;
}
