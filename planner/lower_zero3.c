/*
 * lower_zero3.c — the lowering's zero-3 gathers: puts into the global
 * sequence (lower_xfer.c) a PGATHER of each zero-3 bucket before each use
 * of its weights, and a PFREE after each member's last use of them. It
 * runs after lower_sequence and before lower_programs (lower.c); without
 * zero-3 buckets it leaves the sequence as it is.
 *
 * A use is a FWD, BWD or LOSS of a slice, in one direction (FWD and LOSS
 * forward, BWD backward). The uses of one slice in one direction that
 * follow each other in the sequence (one per device of the slice) form
 * one gather: just before the first of them, every zero-3 bucket any of
 * the slice's layers belongs to (each shard's bucket of a
 * tensor-parallel slice), in bucket order, is all-gathered by all of its
 * members at that one place in the global sequence. A PGATHER is a
 * blocking rendezvous of the bucket's members; since each stands at one
 * place of the one global sequence, and RECVs wait only for SENDs before
 * them in it, the earliest instruction not yet done can always run (no
 * deadlock; the verifier re-checks by simulation). A member frees the
 * full weights right after its last use in that gather, or right after
 * the PGATHER when it has none there (a member that uses the layers in
 * another slice only, sending its shard). Inside a span the runtime
 * gathers the layers one at a time as the uses reach them (plan_z3_span);
 * the PGATHER is the rendezvous and the first layer's gather.
 */
#include "lower.h"


typedef struct {
	int bucket, key, start; /* key: slice * 2 + direction; start: position */
	int last_off;           /* into last[]: per member, its last use or -1 */
} z3ev_t;

/* The zero-3 buckets of slice i's layers, every shard's, ascending, in out
 * (at most cap); their count. */
static int slice_z3(const lstate_t *st, const sp_plan_t *out, int i, int *bk, int cap)
{
	const sslice_t *x = &st->s->s[i];
	const metaop_t *mo = &st->pl->mops[x->metaop];
	const sp_model_t *md = st->pl->model;
	int n = 0;
	for (int l = x->lf; l < x->lt; l++) {
		const sp_op_t *op = &st->pl->ops[mo->first_op + l];
		int pid = st->param_base[md->tasks[mo->task].nodes[op->node].comp] + op->layer;
		for (int r = 0; r < st->ptp[pid]; r++) {
			int b = st->bucket_of[pid * st->tmax + r], dup = 0;
			if (b < 0 || out->buckets[b].layout != LAYOUT_ZERO3)
				continue;
			for (int j = 0; j < n && !dup; j++)
				dup = bk[j] == b;
			if (dup || n == cap)
				continue;
			int j = n++;
			while (j > 0 && bk[j - 1] > b) {
				bk[j] = bk[j - 1];
				j--;
			}
			bk[j] = b;
		}
	}
	return n;
}

static int is_use(const sp_ins_t *in)
{
	return in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS;
}

int lower_gathers(lstate_t *st, sp_plan_t *out)
{
	int nb = out->n_buckets, any = 0, cap = 1;
	for (int b = 0; b < nb; b++)
		any |= out->buckets[b].layout == LAYOUT_ZERO3;
	if (!any)
		return 0;
	for (int i = 0; i < st->s->n; i++)
		cap += (st->s->s[i].lt - st->s->s[i].lf) * st->tmax;
	int *bk = sp_arena_calloc(st->a, (size_t)cap + 1, sizeof(int));
	int *cur = sp_arena_calloc(st->a, (size_t)nb + 1, sizeof(int)); /* per bucket: event */
	if (!bk || !cur)
		return SP_ENOMEM;
	for (int b = 0; b < nb; b++)
		cur[b] = -1;
	/* pass 1: the gathers (events), and each member's last use in each */
	z3ev_t *ev = NULL;
	int nev = 0, capev = 0, nlast = 0, caplast = 0, rc = 0;
	int *last = NULL;
	for (int k = 0; k < st->ng && !rc; k++) {
		const sp_ins_t *in = &st->g[k].ins;
		if (!is_use(in))
			continue;
		int key = in->slice * 2 + (in->op == INS_BWD);
		int n = slice_z3(st, out, in->slice, bk, cap);
		for (int j = 0; j < n; j++) {
			int b = bk[j];
			const sp_bucket_t *bu = &out->buckets[b];
			if (cur[b] < 0 || ev[cur[b]].key != key) {
				if (sp_arena_grow(st->a, (void **)&ev, &capev, nev + 1, sizeof *ev) ||
				    sp_arena_grow(st->a, (void **)&last, &caplast, nlast + bu->n_dev,
						  sizeof *last)) {
					rc = SP_ENOMEM;
					break;
				}
				ev[nev] = (z3ev_t){b, key, k, nlast};
				for (int q = 0; q < bu->n_dev; q++)
					last[nlast + q] = -1;
				nlast += bu->n_dev;
				cur[b] = nev++;
			}
			int64_t off, cnt;
			int q = bucket_shard(out, b, st->g[k].dev, &off, &cnt);
			if (q >= 0)
				last[ev[cur[b]].last_off + q] = k;
		}
	}
	/* pass 2: the new sequence. Events start in position order, and at
	 * one position in bucket order (slice_z3 sorts). */
	int ng2 = st->ng + 2 * nlast;
	gins_t *g2 = rc ? NULL : sp_arena_calloc(st->a, (size_t)ng2 + 1, sizeof *g2);
	/* per position: the PFREEs after it (a member's last use), as lists */
	int *after_first = g2 ? sp_arena_calloc(st->a, (size_t)st->ng + 1, sizeof(int)) : NULL;
	int *after_next = g2 ? sp_arena_calloc(st->a, (size_t)nlast + 1, sizeof(int)) : NULL;
	int *after_ev = g2 ? sp_arena_calloc(st->a, (size_t)nlast + 1, sizeof(int)) : NULL;
	if (!rc && (!g2 || !after_first || !after_next || !after_ev))
		rc = SP_ENOMEM;
	if (rc)
		return rc;
	for (int k = 0; k < st->ng; k++)
		after_first[k] = -1;
	for (int e = nev - 1; e >= 0; e--)
		for (int q = out->buckets[ev[e].bucket].n_dev - 1; q >= 0; q--) {
			int at = last[ev[e].last_off + q], x = ev[e].last_off + q;
			if (at < 0)
				continue;
			after_ev[x] = e;
			after_next[x] = after_first[at];
			after_first[at] = x;
		}
	int n2 = 0;
	for (int k = 0, e = 0; k < st->ng; k++) {
		for (; e < nev && ev[e].start == k; e++) {
			const sp_bucket_t *bu = &out->buckets[ev[e].bucket];
			for (int q = 0; q < bu->n_dev; q++) {
				sp_ins_t ga = lower_ins_new(INS_PGATHER);
				ga.peer = ev[e].bucket;
				g2[n2++] = (gins_t){out->bucket_devs[bu->dev_off + q], ga};
			}
			for (int q = 0; q < bu->n_dev; q++)
				if (last[ev[e].last_off + q] < 0) { /* no use: frees at once */
					sp_ins_t fr = lower_ins_new(INS_PFREE);
					fr.peer = ev[e].bucket;
					g2[n2++] = (gins_t){out->bucket_devs[bu->dev_off + q], fr};
				}
		}
		g2[n2++] = st->g[k];
		for (int x = after_first[k]; x >= 0; x = after_next[x]) {
			const sp_bucket_t *bu = &out->buckets[ev[after_ev[x]].bucket];
			sp_ins_t fr = lower_ins_new(INS_PFREE);
			fr.peer = ev[after_ev[x]].bucket;
			g2[n2++] = (gins_t){out->bucket_devs[bu->dev_off + (x - ev[after_ev[x]].last_off)],
					    fr};
		}
	}
	st->g = g2;
	st->ng = n2;
	st->capg = ng2 + 1;
	return 0;
}
