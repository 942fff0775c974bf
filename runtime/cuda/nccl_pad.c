/*
 * cuda/nccl_pad.c — how the NCCL data plane runs a zero-1/2/3 half
 * (ne_ireduce_scatter, ne_iallgather, ne_iallgatherv): in place where the
 * members' shards have one size, over a padded scratch in bounded rounds
 * where they do not (the scratch, the repacks in and out, its bytes in
 * ne_stats), or as rooted calls per member for parts in no shard layout.
 * Only the calls: when they are enqueued, and a padded half's later rounds,
 * are nccl_engine.c's (ready_batch, enqueue, launched). No NCCL or CUDA
 * call of its own: everything goes through the engine's ne_prims_t.
 */
#include "nccl_engine_internal.h"

/*
 * How a sharded half runs (op->how), decided when it is posted: over the
 * members' parts in comm_shard's layout of one range (every zero-1/2
 * half; an all-gather with parts when they tile a range that way), a true
 * ncclReduceScatter / ncclAllGather of chunk c = n / k in place where k
 * divides n (HOW_DIRECT), else of chunk ceil(n / k) over a padded scratch
 * (HOW_PADDED: the bucket repacked in before the call and the result out
 * after it, on the group's stream; in rounds of at most pad_cap bytes of
 * scratch, each over the same window of every member's chunk, so the
 * scratch stays bounded however large the bucket). Parts in any other layout
 * (a zero-3 layer or deferred piece that only some members hold a part
 * of: padding it to k times the largest part would move that many more
 * bytes) stay rooted (HOW_ROOTED, shard_calls).
 */
void ne_how_shard(const ne_engine_t *e, ne_op_t *op)
{
	int k = op->ch->size;
	int64_t n = (int64_t)(op->bytes / sizeof(float));
	op->base = op->buf;
	op->n = n;
	if (op->parts) { /* the parts must be comm_shard's of their sum */
		int64_t *cnt = op->parts, *off = op->parts + k, sum = 0;
		for (int j = 0; j < k; j++)
			sum += cnt[j];
		op->how = HOW_ROOTED;
		for (int j = 0; j < k; j++) {
			int64_t so, sn;
			comm_shard(sum, j, k, &so, &sn);
			if (!cnt[j] || cnt[j] != sn || off[j] != off[0] + so)
				return;
		}
		op->base = (float *)op->buf + off[0];
		op->n = n = sum;
	}
	op->how = n % k ? HOW_PADDED : HOW_DIRECT;
	op->c = (n + k - 1) / k;
	op->m = SP_MAX(SP_MIN(op->c, e->pad_cap / (int64_t)sizeof(float) / k), 1);
	op->rounds = op->how == HOW_PADDED ? (int)((op->c + op->m - 1) / op->m) : 1;
}

/* HOW_PADDED: this round's window [r0, r0 + *m) of each chunk. */
static int64_t window(const ne_op_t *op, int64_t *m)
{
	int64_t r0 = (int64_t)op->round * op->m;
	*m = SP_MIN(op->m, op->c - r0);
	return r0;
}

/* The rooted fallback: one call per member j on j's part, in place, all
 * in the caller's NCCL group: reduce to j (reduce-scatter), broadcast
 * from j (all-gather); a member whose part is empty makes no call. */
static int shard_calls(ne_engine_t *e, ne_op_t *op)
{
	const ne_prims_t *pr = e->pr;
	ne_chan_t *ch = op->ch;
	int r = NE_OK;
	for (int j = 0; j < ch->size && r == NE_OK; j++) {
		int64_t off, cnt;
		comm_shard((int64_t)(op->bytes / sizeof(float)), j, ch->size, &off, &cnt);
		if (op->parts) { /* the caller's parts (ne_iallgatherv) */
			cnt = op->parts[j];
			off = op->parts[ch->size + j];
		}
		if (!cnt)
			continue;
		float *at = (float *)op->buf + off;
		r = op->kind == OP_RSCATTER
			    ? pr->reduce(e->ctx, at, (size_t)cnt, j, ch->comm, ch->stream)
			    : pr->bcast(e->ctx, at, (size_t)cnt, j, ch->comm, ch->stream);
		e->stats.rooted++;
	}
	return r;
}

/* HOW_PADDED, before its group: the scratch, and what goes into it (a
 * reduce-scatter's whole bucket, an all-gather's own shard). */
int ne_stage_in(ne_engine_t *e, ne_op_t *op)
{
	ne_chan_t *ch = op->ch;
	int64_t m, r0 = window(op, &m);
	size_t bytes = sizeof(float) * (size_t)ch->size * (size_t)m;
	if (e->pr->scratch(e->ctx, bytes, ch->stream, &op->pad))
		return NE_ERR;
	op->held = (int64_t)bytes;
	e->scratch_live += op->held;
	e->stats.scratch_peak = SP_MAX(e->stats.scratch_peak, e->scratch_live);
	return e->pr->repack(e->ctx, op->pad, op->base, op->n, ch->size, r0, m, 1,
			     op->kind == OP_RSCATTER ? -1 : ch->me, ch->stream);
}

/* HOW_PADDED, once its call is on the stream: the result back (a
 * reduce-scatter's own shard, an all-gather's every shard), the scratch
 * freed behind it. */
int ne_stage_out(ne_engine_t *e, ne_op_t *op)
{
	ne_chan_t *ch = op->ch;
	int64_t m, r0 = window(op, &m);
	int r = e->pr->repack(e->ctx, op->base, op->pad, op->n, ch->size, r0, m, 0,
			      op->kind == OP_RSCATTER ? ch->me : -1, ch->stream);
	e->pr->scratch_free(e->ctx, op->pad, ch->stream);
	e->scratch_live -= op->held;
	op->pad = NULL;
	op->held = 0;
	return r;
}

int ne_shard_call(ne_engine_t *e, ne_op_t *op)
{
	ne_chan_t *ch = op->ch;
	if (op->how == HOW_ROOTED)
		return shard_calls(e, op);
	float *at = op->how == HOW_PADDED ? op->pad : op->base;
	int64_t m = op->c;
	if (op->how == HOW_PADDED)
		window(op, &m);
	*(op->how == HOW_PADDED ? &e->stats.padded : &e->stats.direct) += 1;
	return op->kind == OP_RSCATTER
		       ? e->pr->reduce_scatter(e->ctx, at, (size_t)m, ch->me, ch->comm, ch->stream)
		       : e->pr->allgather(e->ctx, at, (size_t)m, ch->me, ch->comm, ch->stream);
}

void ne_pad_drop(ne_engine_t *e, ne_op_t *op)
{
	if (op->pad) {
		e->pr->scratch_free(e->ctx, op->pad, op->ch->stream);
		e->scratch_live -= op->held;
	}
}

void ne_set_pad_cap(ne_engine_t *e, int64_t bytes)
{
	e->pad_cap = SP_MAX(bytes, (int64_t)sizeof(float));
}
