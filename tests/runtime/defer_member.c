/*
 * defer_member.c — writes a plan in which a deferred bucket has a member
 * that runs none of its layers, for tests/runtime/defer_step.py: the case
 * in which the runtime's only wait for the bucket's pieces before the next
 * STEP is the STEP's own (plan_defer_use gives such params the STEP), a
 * case the planner never makes (each member of its buckets runs every
 * layer of them in every step).
 *
 *   defer-member IN.bin OUT.bin
 *
 * Of the deferred buckets device 0 is not a member of, the one of the most
 * params (ties: the lowest index) gains device 0 as a member and is cut
 * into as many pieces as it has params (defer = n_params; the pieces of
 * plan_defer_pieces, one layer each): device 0 holds its params (the bucket is "the params whose
 * holders are exactly this group"), owns a shard of their optimizer state
 * (comm_shard over the grown group), and its program gets the bucket's
 * SYNC just before its STEP and its GATHER at the end. Its gradients of
 * them stay zero, so the group's sums and every result are those of IN.
 * Prints "bucket B: N pieces, device 0 added to its M members". Exit
 * status 2 (with a message) when IN cannot be read or has no such bucket.
 * Nothing here checks the result: spindle-run reads it and runs the
 * verifier on it (whose memory figures stay IN's: device 0's grow by the
 * bucket's, far below the CPU cluster's cap in the test).
 */
#include "plan.h"
#include "plan_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int member(const sp_plan_t *p, int b, int d)
{
	for (int q = 0; q < p->buckets[b].n_dev; q++)
		if (p->bucket_devs[p->buckets[b].dev_off + q] == d)
			return 1;
	return 0;
}

/* Device d's instruction with op (and bucket peer, when peer >= 0), or -1. */
static int find_op(const sp_plan_t *p, int d, int op, int peer)
{
	for (int k = 0; k < p->devices[d].n_ins; k++) {
		const sp_ins_t *in = plan_edit_at(p, d, k);
		if (in->op == op && (peer < 0 || in->peer == peer))
			return k;
	}
	return -1;
}

/* The deferred bucket without device 0 of the most params, or -1. */
static int pick(const sp_plan_t *p)
{
	int best = -1;
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		if (bk->defer && layout_gathers_after_step(bk->layout) && !member(p, b, 0) &&
		    (best < 0 || bk->n_params > p->buckets[best].n_params))
			best = b;
	}
	return best;
}

/* Device 0 joins bucket b: its devices (ascending), device 0's held
 * params, its SYNC before device 0's STEP and its GATHER at the end. */
static int join(sp_plan_t *p, int b)
{
	sp_bucket_t *bk = &p->buckets[b];
	int np = bk->n_params, at = bk->dev_off;
	int32_t *devs = realloc(p->bucket_devs, sizeof(int32_t) * (size_t)(p->n_bucket_devs + 1));
	sp_param_t *held = realloc(p->held, sizeof(sp_param_t) * (size_t)(p->n_held + np));
	if (devs)
		p->bucket_devs = devs;
	if (held)
		p->held = held;
	if (!devs || !held)
		return SP_ENOMEM;
	/* device 0 first among the bucket's devices (ascending) */
	memmove(devs + at + 1, devs + at, sizeof(int32_t) * (size_t)(p->n_bucket_devs - at));
	devs[at] = 0;
	p->n_bucket_devs++;
	for (int c = 0; c < p->n_buckets; c++)
		if (c != b && p->buckets[c].dev_off >= at)
			p->buckets[c].dev_off++;
	bk->n_dev++;
	/* its params at the end of device 0's held list */
	int end = p->devices[0].held_off + p->devices[0].n_held;
	memmove(held + end + np, held + end, sizeof(sp_param_t) * (size_t)(p->n_held - end));
	memcpy(held + end, p->bucket_params + bk->param_off, sizeof(sp_param_t) * (size_t)np);
	p->n_held += np;
	for (int e = 1; e < p->n_devices; e++)
		if (p->devices[e].held_off >= end)
			p->devices[e].held_off += np;
	p->devices[0].n_held += np;
	/* its SYNC and GATHER, as another member's */
	int other = p->bucket_devs[at + 1];
	int ks = find_op(p, other, INS_SYNC, b), kg = find_op(p, other, INS_GATHER, b);
	int step = find_op(p, 0, INS_STEP, -1);
	if (ks < 0 || kg < 0 || step < 0)
		return SP_EINPUT;
	sp_ins_t sync = *plan_edit_at(p, other, ks), gather = *plan_edit_at(p, other, kg);
	if (plan_edit_insert(p, 0, step, sync))
		return SP_ENOMEM;
	return plan_edit_insert(p, 0, p->devices[0].n_ins, gather);
}

int main(int argc, char **argv)
{
	sp_plan_t in = {0}, out = {0};
	sp_err_t err = {0};
	int rc = 2, pieces = 0;
	if (argc != 3) {
		fprintf(stderr, "usage: defer-member IN.bin OUT.bin\n");
		return 2;
	}
	if (plan_read(&in, argv[1], &err)) {
		fprintf(stderr, "defer-member: %s\n", err.msg);
		return 2;
	}
	int b = pick(&in);
	if (b < 0) {
		fprintf(stderr, "defer-member: '%s' has no deferred bucket without device 0\n",
			argv[1]);
		goto cleanup;
	}
	int was = in.buckets[b].n_dev;
	if (plan_edit_copy(&out, &in) || join(&out, b)) {
		fprintf(stderr, "defer-member: bucket %d: device 0 could not join it\n", b);
		goto cleanup;
	}
	/* as many pieces as it has params: a piece per layer */
	out.buckets[b].defer = out.buckets[b].n_params;
	int32_t *first = malloc(sizeof(int32_t) * (size_t)(2 * out.buckets[b].n_params + 2));
	pieces = first ? plan_defer_pieces(&out, b, out.buckets[b].defer, first, NULL) : SP_ENOMEM;
	free(first);
	if (pieces < 0) {
		fprintf(stderr, "defer-member: out of memory\n");
		goto cleanup;
	}
	if (plan_write(&out, argv[2], &err)) {
		fprintf(stderr, "defer-member: %s\n", err.msg);
		goto cleanup;
	}
	printf("bucket %d: %d pieces, device 0 added to its %d members\n", b, pieces, was);
	rc = 0;
cleanup:
	plan_release(&out);
	plan_release(&in);
	return rc;
}
