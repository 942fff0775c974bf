/*
 * test_nccl_engine.c — the NCCL progress engine (runtime/cuda/nccl_engine.c)
 * against a test double of NCCL, CUDA events and the host comm, N ranks in
 * one process under a seeded round-robin scheduler. No GPU, no NCCL.
 *
 * The double behaves like a non-blocking communicator, at its harshest:
 *   - a split completes when every world rank has made that split;
 *   - group end returns "pending" when an operation in it has no
 *     counterpart posted yet (mode STRICT: every operation; mode CONNECT:
 *     only a communicator's first, i.e. connection set-up), and the
 *     communicator then refuses every call (counted as a violation) until
 *     its status is polled OK, which needs the peers to post;
 *   - send/recv complete when both sides are posted and enqueued (the i-th
 *     send of a channel matches its i-th receive, sizes must agree, the
 *     bytes are copied); an all-reduce, reduce or broadcast when every
 *     member has (the i-th of each kind matches; sizes and roots must
 *     agree; the sum or copy is computed and the result checked). The
 *     zero-1 halves (ne_ireduce_scatter, ne_iallgather) are the engine's
 *     in-place reduce-scatters and all-gathers (each member's rank in the
 *     communicator checked), over a padded scratch whose repacks run in
 *     stream order where the shards are uneven; ne_iallgatherv's parts
 *     that only some members hold stay rooted broadcasts. Each run sums
 *     the engines' ne_stats, which the tests check (which way each half
 *     ran), and every scratch must be given back.
 * The scheduler runs each rank's program like interp.c does (sends and
 * syncs post and go on, a receive, a tensor-parallel layer's all-reduce
 * and a step wait, the end waits for everything). Tensor-parallel groups
 * come from hand-made plans and from spindle-plan --tp 2 (SPINDLE_PLAN):
 * every successful run checks that the double saw the layout's splits in
 * its order on every rank, each group's member j as rank j, and every
 * all-reduce summing exactly its group's members over its count.
 * When a whole round changes nothing it declares a deadlock and fails: no
 * test can hang. The clock is virtual.
 *
 * The switch old_blocking makes group end spin on "pending" without
 * returning (what comm_nccl.c's wait_comm did before this engine); since no
 * other rank runs during the spin, it ends in the engine's timeout, so the
 * two regression scenarios fail under it: they can fail.
 *
 * Not covered: real NCCL or CUDA behaviour (kernel co-residency, stream
 * ordering), which needs a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda/nccl_engine.h"

#define MAXR 6
#define MAXOPS 512
#define MAXACT 512
#define MAXSPLIT 128
#define MAXB 32

enum { STRICT, CONNECT };
/* K_REDUCE and K_BCAST: the double's rooted calls, and as actions the
 * zero-1 halves (reduce-scatter, all-gather), which the engine issues as
 * K_RSC / K_AGA (ncclReduceScatter / ncclAllGather, in place or over a
 * padded scratch). K_COPY: a repack of that scratch, a stream operation
 * of no communicator, run when everything before it on its stream is
 * done. Actions only: K_AGV, an all-gather with parts (ne_iallgatherv:
 * `tag` picks the parts, agv_parts);
 * K_TP, an in-layer all-reduce over tensor-parallel group `peer` (waited
 * for, like interp.c's tp_allreduce); K_STEP, wait for everything posted
 * (interp.c's exec_step drains its collectives and sends). */
enum { K_SEND, K_RECV, K_ALLREDUCE, K_REDUCE, K_BCAST, K_RSC, K_AGA, K__COUNT,
       K_TP = K__COUNT, K_STEP, K_AGV, K_COPY };

typedef struct sop sop_t;
typedef struct scomm scomm_t;

typedef struct {
	scomm_t *c; /* NULL while its split is pending */
	int me;     /* rank in c */
	int wrank;
	int busy, split_k;
	sop_t *wait[MAXOPS];
	int n_wait;
} handle_t;

struct sop {
	int kind, idx, done;
	handle_t *h;
	float *buf;
	size_t bytes;
	int root; /* K_REDUCE, K_BCAST; K_RSC, K_AGA: the rank the engine gave */
	/* K_COPY: the repack's arguments; all: its stream and place there */
	const float *src;
	int64_t n, r0, m;
	int k, to_padded, who;
	struct stream *st;
	int pos;
};

struct scomm {
	int n, connected, aborted;
	handle_t *h[MAXR];          /* by comm rank */
	sop_t *ops[MAXR][MAXOPS];   /* posted, by comm rank */
	int n_ops[MAXR], n_kind[MAXR][K__COUNT];
};

/* A stream runs its operations in order: an event recorded on it is done
 * when everything posted on the stream before the record is. */
typedef struct stream {
	sop_t *ops[MAXOPS];
	int n;
} stream_t;
typedef struct {
	stream_t *st;
	int upto;
} event_t;

typedef struct {
	int kind, peer, tag, n; /* kind: K_SEND, K_RECV, or a sync of bucket peer:
				 * K_ALLREDUCE, K_REDUCE (reduce-scatter), K_BCAST (all-gather),
				 * or K_TP, K_STEP */
	int wait;               /* the rank waits for it before its next action */
	float buf[8];           /* [n, 8): a sentinel nothing may write */
	ne_op_t *op;
} act_t;

typedef struct {
	int src, dst, tag;
	char data[64];
	size_t bytes;
	int taken;
} msg_t;

typedef struct sim {
	int n, mode, old_blocking;
	double now, timeout;
	long changes;
	int violations;
	/* world splits: [k][rank] */
	int split_color[MAXSPLIT][MAXR], split_key[MAXSPLIT][MAXR], n_split[MAXSPLIT];
	handle_t *split_h[MAXSPLIT][MAXR];
	scomm_t *world;
	handle_t *world_h[MAXR];
	/* every object, freed at the end */
	void *objs[32768];
	int n_objs;
	/* group under construction, per rank */
	sop_t *grp[MAXR][MAXOPS];
	int n_grp[MAXR], in_grp[MAXR];
	/* host messages */
	msg_t msgs[4096];
	int n_msgs;
	rt_comm_t host[MAXR];
	ne_engine_t *eng[MAXR];
	/* programs */
	act_t prog[MAXR][MAXACT];
	int n_prog[MAXR], pc[MAXR], pending[MAXR][MAXACT], n_pending[MAXR], finished[MAXR];
	int buckets_n;
	sp_bucket_t buckets[MAXB];
	int32_t bucket_devs[MAXB * MAXR];
	/* tensor-parallel groups (the caller's arrays, as in ne_layout_t) */
	int n_tps;
	const sp_tp_group_t *tps;
	const int32_t *slice_devs;
	int prepared[MAXR];
	float warm[MAXR][4];
	/* the engines' ne_stats summed at the end of a run; scratch calls */
	ne_stats_t stats;
	int scratch_made, scratch_freed;
	int64_t pad_cap; /* ne_set_pad_cap's bytes when nonzero */
	long after_compute; /* the engine's calls of after_compute, all ranks */
} sim_t;

/* per rank context: which sim and which rank */
typedef struct {
	sim_t *s;
	int rank;
} ctx_t;
static ctx_t ctxs[MAXR];

static void *keep(sim_t *s, void *p)
{
	assert_non_null(p);
	assert_true(s->n_objs < (int)(sizeof s->objs / sizeof s->objs[0]));
	s->objs[s->n_objs++] = p;
	return p;
}

/* Frees what keep() took. */
static void drop_kept(sim_t *s)
{
	for (int i = 0; i < s->n_objs; i++)
		free(s->objs[i]);
	s->n_objs = 0;
}

/* ---- the double: communicators ---- */

static int posted_kind(const scomm_t *c, int r, int kind)
{
	return c->n_kind[r][kind];
}

/* Whether op's counterparts are posted. */
static int counterpart(const sop_t *op)
{
	scomm_t *c = op->h->c;
	if (op->kind >= K_ALLREDUCE) {
		for (int r = 0; r < c->n; r++)
			if (posted_kind(c, r, op->kind) <= op->idx)
				return 0;
		return 1;
	}
	int other = 1 - op->h->me;
	return posted_kind(c, other, op->kind == K_SEND ? K_RECV : K_SEND) > op->idx;
}

static sop_t *find_op(scomm_t *c, int r, int kind, int idx)
{
	for (int i = 0; i < c->n_ops[r]; i++)
		if (c->ops[r][i]->kind == kind && c->ops[r][i]->idx == idx)
			return c->ops[r][i];
	return NULL;
}

/* A K_COPY run: the repack nccl_engine.h describes. */
static void run_copy(sop_t *op)
{
	for (int i = op->who >= 0 ? op->who : 0; i < (op->who >= 0 ? op->who + 1 : op->k); i++) {
		int64_t off, cnt;
		comm_shard(op->n, i, op->k, &off, &cnt);
		for (int64_t t = 0; t < op->m; t++) {
			int64_t r = op->r0 + t;
			if (op->to_padded)
				op->buf[i * op->m + t] = r < cnt ? op->src[off + r] : 0.0f;
			else if (r < cnt)
				op->buf[off + r] = op->src[i * op->m + t];
		}
	}
	op->done = 1;
}

/* Whether the copies before op on its stream are done: runs each whose
 * predecessors there are all done (a stream runs in order; the other
 * operations before op keep the double's order-free matching). */
static int copies_before(sop_t *op)
{
	int all_done = 1;
	for (int i = 0; op->st && i < op->pos; i++) {
		sop_t *o = op->st->ops[i];
		if (o->kind == K_COPY && !o->done) {
			if (!all_done)
				return 0;
			run_copy(o);
		}
		all_done &= o->done;
	}
	return 1;
}

/* Completes op (and its counterparts) when everything is posted and enqueued. */
static int try_complete(sim_t *s, sop_t *op)
{
	if (op->done)
		return 1;
	scomm_t *c = op->h->c;
	if (c->aborted || !counterpart(op) || op->h->busy)
		return 0;
	if (op->kind >= K_ALLREDUCE) {
		sop_t *all[MAXR];
		for (int r = 0; r < c->n; r++) {
			all[r] = find_op(c, r, op->kind, op->idx);
			if (all[r]->h->busy || !copies_before(all[r]))
				return 0;
			assert_int_equal(all[r]->bytes, op->bytes);
			if (op->kind == K_RSC || op->kind == K_AGA) /* in-place chunks */
				assert_int_equal(all[r]->root, r);
			else
				assert_int_equal(all[r]->root, op->root);
		}
		float sum[64] = {0};
		size_t nf = op->bytes / sizeof(float);
		assert_true(nf <= 64);
		if (op->kind == K_RSC || op->kind == K_AGA) {
			size_t cc = nf / (size_t)c->n;
			assert_int_equal(cc * (size_t)c->n, nf);
			for (int r = 0; r < c->n; r++)
				for (size_t i = 0; i < nf; i++)
					sum[i] += all[r]->buf[i];
			/* reduce-scatter: member r's chunk of the sum; all-gather:
			 * member q's chunk from q, everywhere */
			for (int r = 0; r < c->n; r++)
				for (size_t i = 0; i < nf; i++)
					if (op->kind == K_RSC && i / cc == (size_t)r)
						all[r]->buf[i] = sum[i];
					else if (op->kind == K_AGA && i / cc != (size_t)r)
						all[r]->buf[i] = all[i / cc]->buf[i];
			for (int r = 0; r < c->n; r++)
				all[r]->done = 1;
			s->changes++;
			return 1;
		}
		for (int r = 0; r < c->n; r++)
			for (size_t i = 0; i < nf; i++)
				sum[i] += all[r]->buf[i];
		for (int r = 0; r < c->n; r++) {
			/* all-reduce: the sum everywhere; reduce: at the root; broadcast:
			 * the root's bytes everywhere */
			if (op->kind == K_ALLREDUCE || (op->kind == K_REDUCE && r == op->root))
				memcpy(all[r]->buf, sum, op->bytes);
			if (op->kind == K_BCAST)
				memcpy(all[r]->buf, all[op->root]->buf, op->bytes);
			all[r]->done = 1;
		}
	} else {
		int other = 1 - op->h->me;
		sop_t *peer = find_op(c, other, op->kind == K_SEND ? K_RECV : K_SEND, op->idx);
		if (peer->h->busy)
			return 0;
		assert_int_equal(op->bytes, peer->bytes);
		sop_t *snd = op->kind == K_SEND ? op : peer, *rcv = op->kind == K_SEND ? peer : op;
		memcpy(rcv->buf, snd->buf, snd->bytes);
		snd->done = rcv->done = 1;
	}
	s->changes++;
	return 1;
}

static int d_status_h(sim_t *s, handle_t *h)
{
	if (!h->c) {
		int k = h->split_k;
		return s->n_split[k] == s->n ? NE_OK : NE_PENDING;
	}
	if (h->c->aborted)
		return NE_ERR;
	if (h->busy) {
		for (int i = 0; i < h->n_wait; i++)
			if (!counterpart(h->wait[i]))
				return NE_PENDING;
		h->busy = 0;
		h->n_wait = 0;
		h->c->connected = 1;
		s->changes++;
	}
	return NE_OK;
}

static double d_now(void *ctx)
{
	return ((ctx_t *)ctx)->s->now;
}

/* Makes the children of split k once every rank has called it. */
static void resolve_split(sim_t *s, int k)
{
	for (int color = 0; color < MAXR * 2; color++) {
		scomm_t *c = NULL;
		for (int key = 0; key < MAXR * 2; key++)
			for (int r = 0; r < s->n; r++)
				if (s->split_color[k][r] == color && s->split_key[k][r] == key) {
					if (!c)
						c = keep(s, calloc(1, sizeof *c));
					handle_t *h = s->split_h[k][r];
					h->c = c;
					h->me = c->n;
					c->h[c->n++] = h;
				}
	}
	s->changes++;
}

static int d_split(void *ctx, void *parent, int color, int key, void **out)
{
	ctx_t *x = ctx;
	sim_t *s = x->s;
	handle_t *w = parent;
	assert_ptr_equal(w, s->world_h[x->rank]);
	int k = 0;
	while (k < MAXSPLIT && s->split_h[k][x->rank])
		k++;
	assert_true(k < MAXSPLIT);
	if (w->busy || d_status_h(s, w) != NE_OK) {
		s->violations++;
		return NE_ERR;
	}
	handle_t *h = keep(s, calloc(1, sizeof *h));
	h->wrank = x->rank;
	h->split_k = k;
	s->split_color[k][x->rank] = color;
	s->split_key[k][x->rank] = key;
	s->split_h[k][x->rank] = h;
	if (++s->n_split[k] == s->n)
		resolve_split(s, k);
	*out = color < 0 ? NULL : h;
	return s->n_split[k] == s->n ? NE_OK : NE_PENDING;
}

static int d_status(void *ctx, void *comm)
{
	ctx_t *x = ctx;
	handle_t *h = comm;
	if (h == x->s->world_h[x->rank]) {
		/* world is busy while this rank's latest split is unresolved */
		for (int k = 0; k < MAXSPLIT; k++)
			if (x->s->split_h[k][x->rank] && x->s->n_split[k] < x->s->n)
				return NE_PENDING;
		return NE_OK;
	}
	return d_status_h(x->s, h);
}

static void d_abort(void *ctx, void *comm)
{
	(void)ctx;
	handle_t *h = comm;
	if (h->c)
		h->c->aborted = 1;
}

static int d_finalize(void *ctx, void *comm)
{
	(void)ctx;
	(void)comm;
	return NE_OK;
}

static void d_destroy(void *ctx, void *comm)
{
	(void)ctx;
	(void)comm;
}

static const char *d_why(void *ctx, void *comm)
{
	(void)ctx;
	(void)comm;
	return "simulated failure";
}

static int d_group_start(void *ctx)
{
	ctx_t *x = ctx;
	x->s->in_grp[x->rank] = 1;
	x->s->n_grp[x->rank] = 0;
	return NE_OK;
}

static int d_post(ctx_t *x, int kind, void *buf, size_t bytes, int peer, void *comm, void *st)
{
	sim_t *s = x->s;
	handle_t *h = comm;
	if (!h || !h->c || h->busy || !s->in_grp[x->rank]) {
		s->violations++;
		return NE_ERR;
	}
	if (kind < K_ALLREDUCE && peer != 1 - h->me) {
		s->violations++;
		return NE_ERR;
	}
	/* its index among the comm's operations of its kind: those enqueued,
	 * then those earlier in this group */
	int idx = h->c->n_kind[h->me][kind];
	for (int i = 0; i < s->n_grp[x->rank]; i++)
		idx += s->grp[x->rank][i]->h == h && s->grp[x->rank][i]->kind == kind;
	sop_t *op = keep(s, calloc(1, sizeof *op));
	*op = (sop_t){.kind = kind, .idx = idx, .h = h, .buf = buf, .bytes = bytes, .root = peer};
	s->grp[x->rank][s->n_grp[x->rank]++] = op;
	stream_t *sm = st;
	assert_true(sm->n < MAXOPS);
	op->st = sm;
	op->pos = sm->n;
	sm->ops[sm->n++] = op;
	return NE_OK;
}

static int d_send(void *ctx, const void *buf, size_t bytes, int peer, void *comm, void *st)
{
	return d_post(ctx, K_SEND, (void *)buf, bytes, peer, comm, st);
}

static int d_recv(void *ctx, void *buf, size_t bytes, int peer, void *comm, void *st)
{
	return d_post(ctx, K_RECV, buf, bytes, peer, comm, st);
}

static int d_allreduce(void *ctx, float *buf, size_t n, void *comm, void *st)
{
	return d_post(ctx, K_ALLREDUCE, buf, n * sizeof(float), -1, comm, st);
}

static int d_reduce(void *ctx, float *buf, size_t n, int root, void *comm, void *st)
{
	return d_post(ctx, K_REDUCE, buf, n * sizeof(float), root, comm, st);
}

static int d_bcast(void *ctx, float *buf, size_t n, int root, void *comm, void *st)
{
	return d_post(ctx, K_BCAST, buf, n * sizeof(float), root, comm, st);
}

static int d_reduce_scatter(void *ctx, float *buf, size_t c, int me, void *comm, void *st)
{
	handle_t *h = comm;
	return d_post(ctx, K_RSC, buf, c * sizeof(float) * (size_t)(h && h->c ? h->c->n : 1), me,
		      comm, st);
}

static int d_allgather(void *ctx, float *buf, size_t c, int me, void *comm, void *st)
{
	handle_t *h = comm;
	return d_post(ctx, K_AGA, buf, c * sizeof(float) * (size_t)(h && h->c ? h->c->n : 1), me,
		      comm, st);
}

static int d_scratch(void *ctx, size_t bytes, void *st, float **out)
{
	sim_t *s = ((ctx_t *)ctx)->s;
	(void)st;
	*out = keep(s, calloc(1, bytes ? bytes : 1));
	s->scratch_made++;
	return NE_OK;
}

static void d_scratch_free(void *ctx, float *p, void *st)
{
	(void)p;
	(void)st;
	((ctx_t *)ctx)->s->scratch_freed++;
}

/* Posted on the stream, run in its order (copies_before, d_query). */
static int d_repack(void *ctx, float *dst, const float *src, int64_t n, int k, int64_t r0,
		    int64_t m, int to_padded, int who, void *st)
{
	sim_t *s = ((ctx_t *)ctx)->s;
	stream_t *sm = st;
	sop_t *op = keep(s, calloc(1, sizeof *op));
	/* the window within the padded chunk c = ceil(n / k) */
	assert_true(r0 >= 0 && m >= 1 && r0 + m <= (n + k - 1) / k);
	*op = (sop_t){.kind = K_COPY, .buf = dst, .src = src, .n = n, .r0 = r0, .m = m, .k = k,
		      .to_padded = to_padded, .who = who, .st = sm, .pos = sm->n};
	assert_true(sm->n < MAXOPS && who < k);
	sm->ops[sm->n++] = op;
	return NE_OK;
}

static int d_group_end(void *ctx)
{
	ctx_t *x = ctx;
	sim_t *s = x->s;
	int r = x->rank, pending = 0;
	s->in_grp[r] = 0;
	for (int i = 0; i < s->n_grp[r]; i++) {
		sop_t *op = s->grp[r][i];
		scomm_t *c = op->h->c;
		assert_true(c->n_ops[op->h->me] < MAXOPS);
		c->ops[op->h->me][c->n_ops[op->h->me]++] = op;
		c->n_kind[op->h->me][op->kind]++;
		s->changes++;
	}
	for (int i = 0; i < s->n_grp[r]; i++) {
		sop_t *op = s->grp[r][i];
		if (!counterpart(op) && (s->mode == STRICT || !op->h->c->connected)) {
			op->h->busy = 1;
			pending = 1;
		}
	}
	for (int i = 0; pending && i < s->n_grp[r]; i++) {
		handle_t *h = s->grp[r][i]->h;
		h->busy = 1;
		h->wait[h->n_wait++] = s->grp[r][i];
	}
	if (!pending)
		return NE_OK;
	/* the old code had no start-up warm-up: its spin is modelled in steps */
	int stepping = 1;
	for (int q = 0; q < s->n; q++)
		stepping &= s->prepared[q];
	if (!s->old_blocking || !stepping)
		return NE_PENDING;
	/* the old wait_comm: spin until OK or the timeout, serving nobody */
	double t0 = s->now;
	for (;;) {
		int st = NE_OK;
		for (int i = 0; i < s->n_grp[r]; i++)
			if (d_status_h(s, s->grp[r][i]->h) != NE_OK)
				st = NE_PENDING;
		if (st == NE_OK)
			return NE_OK;
		if (s->now - t0 > s->timeout)
			return NE_ERR;
		s->now += 1.0;
	}
}

static int d_stream_new(void *ctx, void **out)
{
	*out = keep(((ctx_t *)ctx)->s, calloc(1, sizeof(stream_t)));
	return NE_OK;
}

static void d_stream_free(void *ctx, void *st)
{
	(void)ctx;
	(void)st;
}

static int d_event_new(void *ctx, void **out)
{
	*out = keep(((ctx_t *)ctx)->s, calloc(1, sizeof(event_t)));
	return NE_OK;
}

static int d_after_compute(void *ctx, void *st)
{
	(void)st;
	((ctx_t *)ctx)->s->after_compute++;
	return NE_OK;
}

static int d_record(void *ctx, void *ev, void *st)
{
	(void)ctx;
	((event_t *)ev)->st = st;
	((event_t *)ev)->upto = ((stream_t *)st)->n;
	return NE_OK;
}

static int d_query(void *ctx, void *ev)
{
	event_t *e = ev;
	for (int i = 0; e->st && i < e->upto; i++) {
		sop_t *op = e->st->ops[i];
		if (op->kind == K_COPY) { /* everything before it is done */
			if (!op->done)
				run_copy(op);
			continue;
		}
		if (op->h->c->aborted)
			return NE_ERR;
		if (!try_complete(((ctx_t *)ctx)->s, op))
			return NE_PENDING;
	}
	return NE_OK;
}

static const ne_prims_t double_prims = {
	.now = d_now, .split = d_split, .status = d_status, .abort = d_abort,
	.finalize = d_finalize, .destroy = d_destroy, .why = d_why,
	.group_start = d_group_start, .group_end = d_group_end, .send = d_send,
	.recv = d_recv, .allreduce = d_allreduce, .reduce = d_reduce, .bcast = d_bcast,
	.reduce_scatter = d_reduce_scatter, .allgather = d_allgather, .scratch = d_scratch,
	.scratch_free = d_scratch_free, .repack = d_repack,
	.stream_new = d_stream_new,
	.stream_free = d_stream_free, .event_new = d_event_new, .event_free = d_stream_free,
	.after_compute = d_after_compute, .record = d_record, .query = d_query,
};

/* ---- the double: host comm (eager, ordered per pair and tag) ---- */

typedef struct {
	void *buf;
	size_t bytes;
	int src, tag;
} hrecv_t;

static sim_t *host_sim(rt_comm_t *c)
{
	return c->impl;
}

static int h_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	sim_t *s = host_sim(c);
	assert_true(s->n_msgs < 4096 && bytes <= 64);
	msg_t *m = &s->msgs[s->n_msgs++];
	*m = (msg_t){c->rank, peer, tag, {0}, bytes, 0};
	memcpy(m->data, buf, bytes);
	*req = (rt_req_t){0, NULL, peer, tag};
	s->changes++;
	return 0;
}

static int h_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	hrecv_t *r = keep(host_sim(c), calloc(1, sizeof *r));
	*r = (hrecv_t){buf, bytes, peer, tag};
	*req = (rt_req_t){1, r, peer, tag};
	return 0;
}

static int h_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	sim_t *s = host_sim(c);
	hrecv_t *r = req->impl;
	*done = 0;
	if (!req->kind) {
		*done = 1;
		return 0;
	}
	for (int i = 0; i < s->n_msgs; i++) {
		msg_t *m = &s->msgs[i];
		if (!m->taken && m->src == r->src && m->dst == c->rank && m->tag == r->tag) {
			assert_int_equal(m->bytes, r->bytes);
			memcpy(r->buf, m->data, m->bytes);
			m->taken = 1;
			req->kind = 0;
			*done = 1;
			s->changes++;
			return 0;
		}
	}
	return 0;
}

static const rt_comm_ops_t host_ops = {.isend = h_isend, .irecv = h_irecv, .test = h_test};

/* ---- the scheduler: interp.c's way of running a program ---- */

static void sim_init(sim_t *s, int n, int mode)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	s->mode = mode;
	s->timeout = 50.0;
	s->world = keep(s, calloc(1, sizeof *s->world));
	s->world->connected = 1;
	for (int r = 0; r < n; r++) {
		handle_t *h = keep(s, calloc(1, sizeof *h));
		h->c = s->world;
		h->me = r;
		h->wrank = r;
		s->world->h[r] = h;
		s->world_h[r] = h;
		s->host[r] = (rt_comm_t){.ops = &host_ops, .name = "sim", .rank = r, .nranks = n,
					  .tag_ub = 32767, .impl = s};
	}
	s->world->n = n;
}

/* Rank r's shard of n elements in bucket b (its place among the members). */
static void member_shard(const sim_t *s, int b, int r, int n, int64_t *off, int64_t *cnt)
{
	const sp_bucket_t *bu = &s->buckets[b];
	for (int q = 0; q < bu->n_dev; q++)
		if (s->bucket_devs[bu->dev_off + q] == r)
			comm_shard(n, q, bu->n_dev, off, cnt);
}

#define SENTINEL (-7.0f)

/* K_AGV's parts over bucket b's members (n elements): the range [lo, lo +
 * len), tag = 16 lo + len, cut at the members' shards as zero.c and
 * defer.c cut a layer or a deferred piece (offsets from buf's start). */
static void agv_parts(const sim_t *s, int b, int tag, int n, int64_t *cnt, int64_t *off)
{
	int k = s->buckets[b].n_dev, lo = tag / 16, hi = lo + tag % 16;
	assert_true(hi <= n);
	for (int q = 0; q < k; q++) {
		int64_t so, sn;
		comm_shard(n, q, k, &so, &sn);
		int64_t a = SP_MAX(lo, so), z = SP_MIN(hi, so + sn);
		cnt[q] = z > a ? z - a : 0;
		off[q] = z > a ? a : 0;
	}
}

/* Whether element i is in member q's K_AGV part; q: the member's place. */
static int agv_in(const sim_t *s, const act_t *a, int q, int i)
{
	int64_t cnt[MAXR], off[MAXR];
	agv_parts(s, a->peer, a->tag, a->n, cnt, off);
	return i >= off[q] && i < off[q] + cnt[q];
}

/* Rank r's place among bucket b's members. */
static int member_place(const sim_t *s, int b, int r)
{
	for (int q = 0; q < s->buckets[b].n_dev; q++)
		if (s->bucket_devs[s->buckets[b].dev_off + q] == r)
			return q;
	return -1;
}

/* Rank r's next action; a receive, an in-layer all-reduce and a step
 * always wait, others when `wait` says. n: floats moved (at most 8). */
static void add_act_w(sim_t *s, int r, int kind, int peer, int tag, int n, int wait)
{
	assert_true(s->n_prog[r] < MAXACT - 1 && n <= 8);
	act_t *a = &s->prog[r][s->n_prog[r]++];
	memset(a, 0, sizeof *a);
	*a = (act_t){kind, peer, tag, n, wait || kind == K_RECV || kind == K_TP || kind == K_STEP,
		     {0}, NULL};
	int64_t off = 0, cnt = 0;
	if (kind == K_BCAST)
		member_shard(s, peer, r, n, &off, &cnt);
	if (kind == K_AGV) { /* its own part: [off, off + cnt) */
		int64_t c[MAXR], o[MAXR];
		int q = member_place(s, peer, r);
		agv_parts(s, peer, tag, n, c, o);
		off = o[q];
		cnt = c[q];
	}
	/* a tensor-parallel member contributes 2^r: the sum names the members */
	for (int i = 0; i < 8; i++)
		a->buf[i] = i >= n					 ? SENTINEL
			    : kind == K_SEND			 ? (float)(tag * 10 + i)
			    : kind == K_ALLREDUCE || kind == K_REDUCE ? (float)(r + 1)
			    : kind == K_TP				 ? (float)(1 << r)
			    : (kind == K_BCAST || kind == K_AGV) && i >= off && i < off + cnt
				? (float)(100 * r + i)
									: -1.0f;
}

static void add_act(sim_t *s, int r, int kind, int peer, int tag, int n)
{
	add_act_w(s, r, kind, peer, tag, n, 0);
}

static void add_bucket(sim_t *s, const int *ranks, int n)
{
	assert_true(s->buckets_n < MAXB && n <= MAXR);
	sp_bucket_t *b = &s->buckets[s->buckets_n];
	int off = s->buckets_n ? s->buckets[s->buckets_n - 1].dev_off + s->buckets[s->buckets_n - 1].n_dev : 0;
	*b = (sp_bucket_t){.n_dev = n, .dev_off = off};
	for (int i = 0; i < n; i++)
		s->bucket_devs[off + i] = ranks[i];
	s->buckets_n++;
}

/* Whether action a (done) left the right bytes, and none past its n. */
static void check_act(const sim_t *s, int r, const act_t *a)
{
	for (int i = a->n; i < 8; i++)
		assert_true(a->buf[i] == SENTINEL);
	if (a->kind == K_RECV)
		for (int i = 0; i < a->n; i++)
			assert_true(a->buf[i] == (float)(a->tag * 10 + i));
	if (a->kind == K_TP) { /* the sum over exactly the group's members */
		const sp_tp_group_t *g = &s->tps[a->peer];
		float want = 0;
		for (int j = 0; j < g->t; j++)
			want += (float)(1 << s->slice_devs[g->off + j]);
		for (int i = 0; i < a->n; i++)
			assert_true(a->buf[i] == want);
	}
	if (a->kind == K_AGV) /* every part from its member, nothing else written */
		for (int i = 0; i < a->n; i++) {
			float want = -1.0f;
			for (int q = 0; q < s->buckets[a->peer].n_dev; q++)
				if (agv_in(s, a, q, i))
					want = (float)(100 * s->bucket_devs[s->buckets[a->peer].dev_off + q] +
						       i);
			assert_true(a->buf[i] == want);
		}
	if (a->kind >= K__COUNT || a->kind < K_ALLREDUCE)
		return;
	const sp_bucket_t *b = &s->buckets[a->peer];
	if (a->kind == K_ALLREDUCE || a->kind == K_REDUCE) {
		float want = 0;
		int64_t off = 0, cnt = a->n;
		for (int q = 0; q < b->n_dev; q++)
			want += (float)(s->bucket_devs[b->dev_off + q] + 1);
		if (a->kind == K_REDUCE) /* the sum over r's own shard */
			member_shard(s, a->peer, r, a->n, &off, &cnt);
		for (int64_t i = off; i < off + cnt; i++)
			assert_true(a->buf[i] == want);
	}
	if (a->kind == K_BCAST) /* every member's shard, from that member */
		for (int q = 0; q < b->n_dev; q++) {
			int m = s->bucket_devs[b->dev_off + q];
			int64_t off, cnt;
			comm_shard(a->n, q, b->n_dev, &off, &cnt);
			for (int64_t i = off; i < off + cnt; i++)
				assert_true(a->buf[i] == (float)(100 * m + i));
		}
}

/* One turn of rank r. -1: an engine call failed. */
static int turn(sim_t *s, int r, const ne_layout_t *lay)
{
	ne_engine_t *e = s->eng[r];
	if (!s->prepared[r]) {
		int p = ne_prepare(e, lay);
		if (p == NE_ERR)
			return -1;
		s->prepared[r] = p == NE_OK;
		s->changes += p == NE_OK;
		return 0;
	}
	/* poll what is outstanding, as interp.c's poll_pending does */
	for (int i = 0; i < s->n_pending[r];) {
		act_t *a = &s->prog[r][s->pending[r][i]];
		int done = 0;
		if (ne_test(e, a->op, &done))
			return -1;
		if (done) {
			check_act(s, r, a);
			a->op = NULL;
			s->pending[r][i] = s->pending[r][--s->n_pending[r]];
			s->changes++;
		} else {
			i++;
		}
	}
	if (s->pc[r] == s->n_prog[r]) {
		if (!s->n_pending[r] && !s->finished[r]) {
			s->finished[r] = 1;
			s->changes++;
		}
		return ne_progress(e);
	}
	act_t *a = &s->prog[r][s->pc[r]];
	if (a->wait && a->op) { /* posted: the rank waits for it */
		int done = 0;
		if (ne_test(e, a->op, &done))
			return -1;
		if (!done)
			return 0;
		check_act(s, r, a);
		a->op = NULL;
		s->pc[r]++;
		s->changes++;
		return 0;
	}
	if (a->kind == K_STEP) {
		if (s->n_pending[r])
			return 0;
		s->pc[r]++;
		s->changes++;
		return 0;
	}
	int rc = 0;
	size_t bytes = sizeof(float) * (size_t)a->n;
	if (a->kind == K_SEND) {
		rc = ne_isend(e, a->buf, bytes, a->peer, a->tag, &a->op);
	} else if (a->kind == K_RECV) {
		rc = ne_irecv(e, a->buf, bytes, a->peer, a->tag, &a->op);
	} else {
		/* the layout's items: buckets, then tensor-parallel groups */
		int g = -1, item = a->kind == K_TP ? s->buckets_n + a->peer : a->peer;
		assert_int_equal(ne_group_id(e, item, &g), 0);
		assert_true(g >= 0);
		if (a->kind == K_AGV) {
			int64_t cnt[MAXR], off[MAXR];
			agv_parts(s, a->peer, a->tag, a->n, cnt, off);
			rc = ne_iallgatherv(e, a->buf, s->buckets[a->peer].n_dev, cnt, off, g,
					    &a->op);
		} else {
			rc = (a->kind == K_ALLREDUCE || a->kind == K_TP ? ne_iallreduce
			      : a->kind == K_REDUCE ? ne_ireduce_scatter
						    : ne_iallgather)(e, a->buf, a->n, g, &a->op);
		}
		if (!rc && !a->op)
			check_act(s, r, a); /* a group of one: nothing to move */
	}
	if (rc)
		return -1;
	s->changes++;
	if (a->op && a->wait)
		return 0; /* the next turns wait for it */
	if (a->op)
		s->pending[r][s->n_pending[r]++] = s->pc[r];
	s->pc[r]++;
	return 0;
}

/* The directed channels of the programs, sorted and unique. */
static void sim_layout(sim_t *s, ne_layout_t *lay, int (*chans)[2])
{
	int n = 0;
	for (int a = 0; a < s->n; a++)
		for (int b = 0; b < s->n; b++) {
			int used = 0;
			for (int k = 0; k < s->n_prog[a]; k++)
				used |= s->prog[a][k].kind == K_SEND && s->prog[a][k].peer == b;
			if (used) {
				chans[n][0] = a;
				chans[n++][1] = b;
			}
		}
	*lay = (ne_layout_t){.n_buckets = s->buckets_n, .buckets = s->buckets,
			     .bucket_devs = s->bucket_devs, .n_tps = s->n_tps,
			     .tps = (sp_tp_group_t *)s->tps, .slice_devs = s->slice_devs,
			     .n_chans = n, .chans = chans};
}

/* Whether rank r is in item i of the layout's order (buckets, groups,
 * channels) and the rank it must have in the item's communicator; returns
 * whether the item needs a communicator at all. */
static int item_member(const ne_layout_t *l, int i, int r, int *member, int *key)
{
	int nb = l->n_buckets, nt = l->n_tps;
	*member = 0;
	*key = -1;
	if (i < nb) {
		const sp_bucket_t *b = &l->buckets[i];
		for (int q = 0; q < b->n_dev; q++)
			if (l->bucket_devs[b->dev_off + q] == r)
				*member = 1, *key = r; /* ascending: by world rank */
		return b->n_dev > 1;
	}
	if (i < nb + nt) {
		const sp_tp_group_t *g = &l->tps[i - nb];
		for (int j = 0; j < g->t; j++)
			if (l->slice_devs[g->off + j] == r)
				*member = 1, *key = j; /* rank j is member j */
		return 1;
	}
	const int *c = l->chans[i - nb - nt];
	*member = c[0] == r || c[1] == r;
	*key = c[1] == r; /* the sender is rank 0 */
	return 1;
}

/*
 * What the double saw made: every rank took part in every split, in one
 * order, and that order is the layout's (buckets with several members,
 * then the tensor-parallel groups, then the channels), each split's members
 * the item's and each member's key its rank there. A rank that made its
 * splits in another order would have joined another item's split here.
 */
static void check_creation(const sim_t *s, const ne_layout_t *l)
{
	int k = 0, items = l->n_buckets + l->n_tps + l->n_chans;
	for (int i = 0; i < items; i++) {
		int member, key;
		if (!item_member(l, i, 0, &member, &key))
			continue;
		assert_true(k < MAXSPLIT);
		assert_int_equal(s->n_split[k], s->n);
		for (int r = 0; r < s->n; r++) {
			item_member(l, i, r, &member, &key);
			if (member != (s->split_color[k][r] >= 0))
				fail_msg("split %d (item %d): rank %d %s, expected %s", k, i, r,
					 member ? "left out" : "a member", member ? "a member" : "not");
			if (member && s->split_key[k][r] != key)
				fail_msg("split %d (item %d): rank %d has key %d, expected %d", k, i, r,
					 s->split_key[k][r], key);
		}
		k++;
	}
	assert_true(k == MAXSPLIT || s->n_split[k] == 0); /* nothing more */
}

/* Runs every rank to its end over layout given (NULL: the programs' own,
 * sim_layout). 0: done, and check_creation held; 1: an engine call failed
 * (the engine printed why); 2: deadlock (a round without change). */
static int sim_run_layout(sim_t *s, unsigned seed, const ne_layout_t *given)
{
	ne_layout_t lay;
	int chans[MAXR * MAXR][2];
	if (given)
		lay = *given;
	else
		sim_layout(s, &lay, chans);
	for (int r = 0; r < s->n; r++) {
		ctxs[r] = (ctx_t){s, r};
		s->eng[r] = ne_new(&double_prims, &ctxs[r], &s->host[r], s->world_h[r], s->warm[r],
				   s->timeout, "sim");
		assert_non_null(s->eng[r]);
		if (s->pad_cap)
			ne_set_pad_cap(s->eng[r], s->pad_cap);
	}
	int result = 2, order[MAXR];
	srand(seed);
	for (int round = 0; round < 100000; round++) {
		long before = s->changes;
		for (int r = 0; r < s->n; r++)
			order[r] = r;
		for (int r = s->n - 1; r > 0; r--) {
			int j = rand() % (r + 1), t = order[r];
			order[r] = order[j];
			order[j] = t;
		}
		for (int i = 0; i < s->n; i++)
			if (turn(s, order[i], &lay)) {
				result = 1;
				goto out;
			}
		int all = 1;
		for (int r = 0; r < s->n; r++)
			all &= s->finished[r];
		if (all) {
			result = 0;
			goto out;
		}
		s->now += 0.001;
		if (s->changes == before)
			break; /* nothing can move any more */
	}
out:
	memset(&s->stats, 0, sizeof s->stats);
	for (int r = 0; r < s->n; r++) {
		ne_stats_t st;
		ne_stats(s->eng[r], &st);
		s->stats.direct += st.direct;
		s->stats.padded += st.padded;
		s->stats.rooted += st.rooted;
		s->stats.scratch_peak = SP_MAX(s->stats.scratch_peak, st.scratch_peak);
		ne_free(s->eng[r], result != 0);
	}
	/* every padded scratch given back (a failed run frees in ne_free) */
	assert_int_equal(s->scratch_made, s->scratch_freed);
	drop_kept(s);
	if (!result)
		check_creation(s, &lay);
	return result;
}

static int sim_run(sim_t *s, unsigned seed)
{
	return sim_run_layout(s, seed, NULL);
}

/* sim_run_layout, which must finish with no violation; `what` names the
 * case when it does not. */
static void run_clean(sim_t *s, unsigned seed, const ne_layout_t *l, const char *what)
{
	int rc = sim_run_layout(s, seed, l);
	if (rc)
		fprintf(stderr, "%s seed %u mode %d: %s\n", what, seed, s->mode,
			rc == 2 ? "deadlock" : "failed");
	assert_int_equal(rc, 0);
	assert_int_equal(s->violations, 0);
}

/* ---- tests ---- */

/*
 * Regression (a): A sends to B, then syncs a bucket {A, B} and waits for
 * it; B receives from A first. A waiting on its all-reduce must still
 * serve B's clear-to-send. Before this engine, A's all-reduce enqueue spun
 * in wait_comm (it needs B's, which B posts only after its receive), so
 * B never got the send: a hang until the timeout.
 */
static void sync_serves_cts(sim_t *s, int old)
{
	sim_init(s, 2, STRICT);
	s->old_blocking = old;
	add_bucket(s, (int[]){0, 1}, 2);
	add_act(s, 0, K_SEND, 1, 5, 4);
	add_act(s, 0, K_ALLREDUCE, 0, 0, 2);
	add_act(s, 1, K_RECV, 0, 5, 4);
	add_act(s, 1, K_ALLREDUCE, 0, 0, 2);
}

/* A regression case set up by setup(s, old) and run with seed: the engine
 * finishes it without a violation; the old blocking behaviour does not. */
static void regression(void **state, void (*setup)(sim_t *, int), int old, int seed)
{
	sim_t *s = *state;
	setup(s, old);
	int rc = sim_run(s, seed);
	if (old) {
		assert_int_not_equal(rc, 0);
	} else {
		assert_int_equal(rc, 0);
		assert_int_equal(s->violations, 0);
	}
}

static void test_sync_serves_cts(void **state)
{
	regression(state, sync_serves_cts, 0, 1);
}

static void test_sync_serves_cts_old_hangs(void **state)
{
	regression(state, sync_serves_cts, 1, 1);
}

/*
 * Regression (b): A and B each send to the other, then receive: two
 * channels in opposite directions whose operations each need the peer's
 * (STRICT makes every operation behave like a channel's first). Before,
 * each rank spun in its send's enqueue and never enqueued its receive.
 */
static void crossing(sim_t *s, int old)
{
	sim_init(s, 2, STRICT);
	s->old_blocking = old;
	add_act(s, 0, K_SEND, 1, 1, 3);
	add_act(s, 0, K_RECV, 1, 2, 3);
	add_act(s, 1, K_SEND, 0, 2, 3);
	add_act(s, 1, K_RECV, 0, 1, 3);
}

static void test_crossing_channels(void **state)
{
	regression(state, crossing, 0, 2);
}

static void test_crossing_channels_old_hangs(void **state)
{
	regression(state, crossing, 1, 2);
}

/* The detector: a program that cannot finish under any engine (B waits
 * for a message A never sends) ends as a deadlock, not a hang. */
static void test_detects_no_progress(void **state)
{
	sim_t *s = *state;
	sim_init(s, 2, STRICT);
	add_act(s, 0, K_SEND, 1, 1, 1);
	add_act(s, 1, K_RECV, 0, 1, 1);
	add_act(s, 1, K_RECV, 0, 9, 1);
	assert_int_equal(sim_run(s, 3), 2);
}

/*
 * Random plans: a global sequence of transfers and syncs, each rank's
 * program its subsequence (so some order finishes: sends never block),
 * receives moved later at random so tags arrive in a different order
 * than they were sent. Every seed, both modes, must finish.
 */
static void random_plan(sim_t *s, unsigned seed, int mode)
{
	srand(seed);
	int n = 2 + rand() % 3;
	sim_init(s, n, mode);
	int nb = 1 + rand() % 3;
	for (int b = 0; b < nb; b++) {
		int ranks[MAXR], k = 0;
		for (int r = 0; r < n; r++)
			if (rand() % 2)
				ranks[k++] = r;
		if (!k)
			ranks[k++] = rand() % n;
		add_bucket(s, ranks, k);
	}
	/* receives wait in a queue and are placed a few steps later */
	int qr[64], qp[64], qt[64], nq = 0, tag = 1;
	int steps = 6 + rand() % 10;
	for (int t = 0; t < steps; t++) {
		int a = rand() % n, b = rand() % n;
		if (a != b) {
			add_act(s, a, K_SEND, b, tag, 1 + rand() % 4);
			qr[nq] = b;
			qp[nq] = a;
			qt[nq++] = tag++;
		}
		while (nq > 0 && rand() % 3 == 0) {
			int i = rand() % nq;
			int len = 0;
			for (int k = 0; k < s->n_prog[qp[i]]; k++)
				if (s->prog[qp[i]][k].tag == qt[i] && s->prog[qp[i]][k].kind == K_SEND)
					len = s->prog[qp[i]][k].n;
			add_act(s, qr[i], K_RECV, qp[i], qt[i], len);
			qr[i] = qr[--nq];
			qp[i] = qp[nq];
			qt[i] = qt[nq];
		}
	}
	while (nq > 0) {
		int i = nq - 1, len = 0;
		for (int k = 0; k < s->n_prog[qp[i]]; k++)
			if (s->prog[qp[i]][k].tag == qt[i] && s->prog[qp[i]][k].kind == K_SEND)
				len = s->prog[qp[i]][k].n;
		add_act(s, qr[i], K_RECV, qp[i], qt[i], len);
		nq--;
	}
	/* syncs in bucket order on every member (like the plan's SYNCs); every
	 * other bucket is zero-1: a reduce-scatter, and after every sync an
	 * all-gather (like STEP's GATHERs), 7 elements for uneven shards
	 * (padded), 8 for even ones over 2 or 4 members (in place) */
	int zn = 7 + (int)(seed / 2 % 2);
	for (int b = 0; b < nb; b++)
		for (int q = 0; q < s->buckets[b].n_dev; q++)
			add_act(s, s->bucket_devs[s->buckets[b].dev_off + q],
				(seed + (unsigned)b) % 2 ? K_REDUCE : K_ALLREDUCE, b, 0,
				(seed + (unsigned)b) % 2 ? zn : 3);
	for (int b = 0; b < nb; b++)
		for (int q = 0; q < s->buckets[b].n_dev && (seed + (unsigned)b) % 2; q++)
			add_act(s, s->bucket_devs[s->buckets[b].dev_off + q], K_BCAST, b, 0, zn);
}

static void test_random_plans(void **state)
{
	sim_t *s = *state;
	long direct = 0, padded = 0;
	for (unsigned seed = 1; seed <= 60; seed++)
		for (int mode = STRICT; mode <= CONNECT; mode++) {
			random_plan(s, seed, mode);
			/* every third seed: padded halves in rounds of one element
			 * per member */
			s->pad_cap = seed % 3 ? 0 : 1;
			run_clean(s, seed * 7 + (unsigned)mode, NULL, "random plan");
			assert_int_equal(s->stats.rooted, 0);
			direct += s->stats.direct;
			padded += s->stats.padded;
		}
	assert_true(direct > 0 && padded > 0); /* both ways ran */
}

/*
 * Zero-1 over three ranks, 7 elements (shards 2, 2, 3): each rank ends the
 * reduce-scatter with the sum over its own shard and the all-gather with
 * every member's shard; a rank that sends first must still serve its
 * peer's clear-to-send while its collectives wait.
 */
static void test_zero1_halves(void **state)
{
	sim_t *s = *state;
	sim_init(s, 3, STRICT);
	add_bucket(s, (int[]){0, 1, 2}, 3);
	add_act(s, 0, K_SEND, 2, 4, 2);
	for (int r = 0; r < 3; r++)
		add_act(s, r, K_REDUCE, 0, 0, 7);
	add_act(s, 2, K_RECV, 0, 4, 2);
	for (int r = 0; r < 3; r++)
		add_act(s, r, K_BCAST, 0, 0, 7);
	assert_int_equal(sim_run(s, 5), 0);
	assert_int_equal(s->violations, 0);
	/* uneven: ncclReduceScatter / ncclAllGather over a padded scratch of
	 * 3 x 3 floats on each rank, none rooted */
	assert_int_equal(s->stats.padded, 6);
	assert_int_equal(s->stats.direct, 0);
	assert_int_equal(s->stats.rooted, 0);
	assert_int_equal(s->stats.scratch_peak, 9 * (int64_t)sizeof(float));
	assert_int_equal(s->scratch_made, 6);
}

/*
 * Even shards run in place (8 over 4 members and 6 over 2: no scratch),
 * beside an uneven bucket (8 over 3: padded) on the same ranks; the engine
 * gives each member its rank in the bucket's communicator (the double
 * checks it against the split's order, members ascending).
 */
static void test_sharded_even(void **state)
{
	sim_t *s = *state;
	for (int mode = STRICT; mode <= CONNECT; mode++) {
		sim_init(s, 4, mode);
		add_bucket(s, (int[]){0, 1, 2, 3}, 4);
		add_bucket(s, (int[]){1, 3}, 2);
		add_bucket(s, (int[]){0, 2, 3}, 3);
		static const int size[3] = {8, 6, 8};
		for (int b = 0; b < 3; b++)
			for (int q = 0; q < s->buckets[b].n_dev; q++)
				add_act(s, s->bucket_devs[s->buckets[b].dev_off + q], K_REDUCE, b, 0,
					size[b]);
		for (int b = 2; b >= 0; b--)
			for (int q = 0; q < s->buckets[b].n_dev; q++)
				add_act(s, s->bucket_devs[s->buckets[b].dev_off + q], K_BCAST, b, 0,
					size[b]);
		run_clean(s, 11 + (unsigned)mode, NULL, "even shards");
		assert_int_equal(s->stats.direct, 2 * (4 + 2));
		assert_int_equal(s->stats.padded, 2 * 3);
		assert_int_equal(s->stats.rooted, 0);
		assert_int_equal(s->stats.scratch_peak, 3 * 3 * (int64_t)sizeof(float));
	}
}

/*
 * All-gathers with parts (zero-3 layers, deferred pieces: agv_parts):
 * parts that tile their range as comm_shard does run as one all-gather
 * (in place when equal, padded when not); parts that only some members
 * hold stay one broadcast per part. Every member ends with every part
 * and nothing else written.
 */
/*
 * Padded halves in rounds (the scratch capped at one or two elements per
 * member): 7 over 3 (chunks of 3) runs 3 or 2 rounds of each half on each
 * rank, a round's scratch at most the cap, with a transfer between them;
 * the results are those of one round.
 */
static void test_padded_rounds(void **state)
{
	sim_t *s = *state;
	long first_calls[CONNECT + 1];
	for (int per = 3; per >= 1; per--) /* 3: every op in one round */
		for (int mode = STRICT; mode <= CONNECT; mode++) {
			sim_init(s, 3, mode);
			s->pad_cap = per * 3 * (int64_t)sizeof(float);
			add_bucket(s, (int[]){0, 1, 2}, 3);
			for (int r = 0; r < 3; r++)
				add_act(s, r, K_REDUCE, 0, 0, 7);
			add_act(s, 1, K_SEND, 0, 9, 3);
			add_act(s, 0, K_RECV, 1, 9, 3);
			for (int r = 0; r < 3; r++)
				add_act(s, r, K_BCAST, 0, 0, 7);
			for (int r = 0; r < 3; r++) /* a layer [1, 6) of it, tiled evenly */
				add_act_w(s, r, K_AGV, 0, 1 * 16 + 5, 7, 1);
			run_clean(s, 21 + (unsigned)(per * 2 + mode), NULL, "padded rounds");
			/* rounds of chunk 3 (halves) and of chunk 2 (the layer's) */
			int rounds = (3 + per - 1) / per, lrounds = (2 + per - 1) / per;
			assert_int_equal(s->stats.padded, 3 * (2 * rounds + lrounds));
			assert_int_equal(s->stats.direct + s->stats.rooted, 0);
			assert_int_equal(s->stats.scratch_peak, s->pad_cap);
			/* a later round follows its own first on the stream: it
			 * does not wait again for compute queued since, so rounds
			 * add no call of after_compute */
			if (per == 3)
				first_calls[mode] = s->after_compute;
			assert_int_equal(s->after_compute, first_calls[mode]);
		}
}

static void test_allgatherv_parts(void **state)
{
	sim_t *s = *state;
	static const struct {
		int ranks, n, tag;
		long direct, padded, rooted;
	} cases[] = {
		{3, 7, 0 * 16 + 7, 0, 3, 0}, /* a whole bucket, shards 2, 2, 3 */
		{4, 8, 0 * 16 + 8, 4, 0, 0}, /* a whole bucket, shards of 2 */
		{2, 8, 1 * 16 + 6, 2, 0, 0}, /* [1, 7) over [0, 4), [4, 8): 3 and 3 */
		{3, 7, 1 * 16 + 5, 0, 3, 0}, /* [1, 6): 1, 2, 2, comm_shard of 5 */
		{3, 7, 2 * 16 + 3, 0, 0, 6}, /* [2, 5): member 0 has none: 2 calls */
		{4, 8, 5 * 16 + 1, 0, 0, 4}, /* [5, 6): member 2's only: 1 call */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		sim_init(s, cases[i].ranks, i % 2 ? CONNECT : STRICT);
		int all[MAXR];
		for (int r = 0; r < cases[i].ranks; r++)
			all[r] = r;
		add_bucket(s, all, cases[i].ranks);
		for (int r = 0; r < cases[i].ranks; r++)
			add_act_w(s, r, K_AGV, 0, cases[i].tag, cases[i].n, 1);
		run_clean(s, 3 + (unsigned)i, NULL, "all-gather with parts");
		assert_int_equal(s->stats.direct, cases[i].direct);
		assert_int_equal(s->stats.padded, cases[i].padded);
		assert_int_equal(s->stats.rooted, cases[i].rooted);
	}
}

/* ne_layout_init: every SEND's pair, sorted and unique. */
static void test_layout_from_plan(void **state)
{
	(void)state;
	sp_ins_t ins[5] = {
		{.op = INS_SEND, .peer = 2}, {.op = INS_RECV, .peer = 1}, {.op = INS_SEND, .peer = 2},
		{.op = INS_SEND, .peer = 0}, {.op = INS_SEND, .peer = 0},
	};
	sp_device_t dev[3] = {{.first_ins = 0, .n_ins = 3}, {.first_ins = 3, .n_ins = 1},
			      {.first_ins = 4, .n_ins = 1}};
	sp_plan_t p = {.n_devices = 3, .devices = dev, .ins = ins, .n_ins = 5};
	ne_layout_t l;
	assert_int_equal(ne_layout_init(&l, &p), 0);
	assert_int_equal(l.n_chans, 3);
	int want[3][2] = {{0, 2}, {1, 0}, {2, 0}};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(l.chans[i][0], want[i][0]);
		assert_int_equal(l.chans[i][1], want[i][1]);
	}
	ne_layout_release(&l);
}

/* ---- tensor-parallel groups ---- */

/*
 * A hand-made plan on 4 ranks, its buckets the sim's: slice 0 split 2 ways
 * on devices 0-3 (groups [0 1] and [2 3]), slice 1 whole on 0-3, slice 2
 * split on [2 3] (the same group again), slice 3 split on [3 1] (member 0
 * is rank 3). Layer (1, 0) is split on [0 1]/[2 3]: shard 0 in bucket
 * {0, 2}, shard 1 in {1, 3} (zero-1); layer (2, 0) on [3 1]: shard 0 in
 * {3}, shard 1 in {1}; layer (0, 0) whole in {0..3}. Device 0 sends to 3.
 */
typedef struct {
	sp_slice_t slices[4];
	int32_t slice_devs[12];
	sp_param_t params[5];
	sp_ins_t ins[1];
	sp_device_t devs[4];
	sp_plan_t p;
} tp_plan_t;

static void tp_plan(sim_t *s, tp_plan_t *t)
{
	memset(t, 0, sizeof *t);
	static const int32_t devs[12] = {0, 1, 2, 3, 0, 1, 2, 3, 2, 3, 3, 1};
	memcpy(t->slice_devs, devs, sizeof devs);
	t->slices[0] = (sp_slice_t){.n_dev = 4, .dev_off = 0, .tp = 2};
	t->slices[1] = (sp_slice_t){.n_dev = 4, .dev_off = 4, .tp = 1};
	t->slices[2] = (sp_slice_t){.n_dev = 2, .dev_off = 8, .tp = 2};
	t->slices[3] = (sp_slice_t){.n_dev = 2, .dev_off = 10, .tp = 2};
	add_bucket(s, (int[]){0, 1, 2, 3}, 4);
	add_bucket(s, (int[]){0, 2}, 2);
	add_bucket(s, (int[]){1, 3}, 2);
	add_bucket(s, (int[]){3}, 1);
	add_bucket(s, (int[]){1}, 1);
	s->buckets[2].layout = LAYOUT_ZERO1;
	static const sp_param_t par[5] = {{0, 0, 1, 0}, {1, 0, 2, 0}, {1, 0, 2, 1}, {2, 0, 2, 0},
					   {2, 0, 2, 1}};
	memcpy(t->params, par, sizeof par);
	for (int b = 0; b < 5; b++) {
		s->buckets[b].n_params = 1;
		s->buckets[b].param_off = b;
	}
	t->ins[0] = (sp_ins_t){.op = INS_SEND, .peer = 3, .tag = 5};
	t->devs[0] = (sp_device_t){.first_ins = 0, .n_ins = 1};
	for (int d = 1; d < 4; d++)
		t->devs[d] = (sp_device_t){.first_ins = 1, .n_ins = 0};
	t->p = (sp_plan_t){.n_slices = 4, .slices = t->slices, .n_slice_devs = 12,
			   .slice_devs = t->slice_devs, .n_buckets = s->buckets_n,
			   .buckets = s->buckets, .bucket_devs = s->bucket_devs,
			   .bucket_params = t->params, .n_bucket_params = 5, .n_devices = 4,
			   .devices = t->devs, .ins = t->ins, .n_ins = 1};
}

/* ne_layout_init on the hand-made plan: the distinct groups in slice order
 * (slice 2's group is slice 0's second; [3 1] is not [1 3]), and the
 * channels of the SEND and of both split layers' shard joins. */
static void test_layout_tp_groups(void **state)
{
	sim_t *s = *state;
	tp_plan_t t;
	sim_init(s, 4, STRICT);
	tp_plan(s, &t);
	ne_layout_t l;
	assert_int_equal(ne_layout_init(&l, &t.p), 0);
	assert_int_equal(l.n_buckets, 5);
	assert_int_equal(l.n_tps, 3);
	int want_off[3] = {0, 2, 10};
	for (int g = 0; g < 3; g++) {
		assert_int_equal(l.tps[g].t, 2);
		assert_int_equal(l.tps[g].off, want_off[g]);
	}
	assert_ptr_equal(l.slice_devs, t.slice_devs);
	/* SEND 0 -> 3; layer (1, 0): shard 1's owner 1 -> shard 0's owner 0;
	 * layer (2, 0): 1 -> 3 */
	int want[3][2] = {{0, 3}, {1, 0}, {1, 3}};
	assert_int_equal(l.n_chans, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(l.chans[i][0], want[i][0]);
		assert_int_equal(l.chans[i][1], want[i][1]);
	}
	/* every slice_devs entry's group, as interp.c uses it */
	sp_tp_group_t *g = NULL;
	int32_t *at = NULL;
	int n = 0;
	assert_int_equal(plan_tp_groups(&t.p, &g, &n, &at), 0);
	int32_t want_at[12] = {0, 0, 1, 1, -1, -1, -1, -1, 1, 1, 2, 2};
	assert_int_equal(n, 3);
	for (int i = 0; i < 12; i++)
		assert_int_equal(at[i], want_at[i]);
	free(g);
	free(at);
	ne_layout_release(&l);
	drop_kept(s);
}

/* Rank r's in-layer all-reduces of slice k, as many as `count` (forward or
 * backward of its layers), on its group of the plan's groups. */
static void tp_acts(sim_t *s, const sp_plan_t *p, const int32_t *at, int k, int r, int count)
{
	const sp_slice_t *sl = &p->slices[k];
	for (int i = 0; sl->tp > 1 && i < sl->n_dev; i++)
		if (p->slice_devs[sl->dev_off + i] == r)
			for (int c = 0; c < count; c++)
				add_act(s, r, K_TP, at[sl->dev_off + i], 0, 1 + (k * 3 + c) % 8);
}

/*
 * The hand-made plan's step on 4 ranks, as interp.c runs it: the split
 * slices' in-layer all-reduces forward and backward (rank 1 and 3 are in
 * two groups each), a transfer whose receiver first works in two groups,
 * the syncs (one zero-1, two groups of one), the step, the all-gather,
 * then a checkpoint's shard joins (pack.c: blocking send and receive, tag
 * 0). Every seed, both modes: done, no violation, the splits in the
 * layout's order with member j as rank j (check_creation).
 */
static void test_tp_mixed(void **state)
{
	sim_t *s = *state;
	for (unsigned seed = 1; seed <= 20; seed++)
		for (int mode = STRICT; mode <= CONNECT; mode++) {
			tp_plan_t t;
			sim_init(s, 4, mode);
			tp_plan(s, &t);
			ne_layout_t l;
			sp_tp_group_t *g = NULL;
			int32_t *at = NULL;
			int n = 0;
			assert_int_equal(ne_layout_init(&l, &t.p), 0);
			assert_int_equal(plan_tp_groups(&t.p, &g, &n, &at), 0);
			s->n_tps = l.n_tps;
			s->tps = l.tps;
			s->slice_devs = l.slice_devs;
			for (int r = 0; r < 4; r++) {
				for (int k = 0; k < 4; k++) /* forward */
					tp_acts(s, &t.p, at, k, r, 2);
				if (r == 0)
					add_act(s, 0, K_SEND, 3, 5, 4);
				if (r == 3)
					add_act(s, 3, K_RECV, 0, 5, 4);
				for (int k = 3; k >= 0; k--) /* backward */
					tp_acts(s, &t.p, at, k, r, 2);
				for (int b = 0; b < s->buckets_n; b++)
					if (bucket_shard(&t.p, b, r, &(int64_t){0}, &(int64_t){0}) >= 0)
						add_act(s, r, b == 2 ? K_REDUCE : K_ALLREDUCE, b, 0,
							b == 2 ? 7 : 3);
				add_act(s, r, K_STEP, -1, 0, 0);
				if (r == 1 || r == 3)
					add_act(s, r, K_BCAST, 2, 0, 7);
			}
			/* the joins: layer (1, 0) at 0 from 1, layer (2, 0) at 3 from 1 */
			add_act_w(s, 1, K_SEND, 0, 0, 3, 1);
			add_act(s, 0, K_RECV, 1, 0, 3);
			add_act_w(s, 1, K_SEND, 3, 0, 4, 1);
			add_act(s, 3, K_RECV, 1, 0, 4);
			run_clean(s, seed, &l, "hand-made tp plan");
			free(g);
			free(at);
			ne_layout_release(&l);
		}
}

/*
 * A plan's step as interp.c runs it, in the double: each rank's program
 * (a split FWD: two in-layer all-reduces per layer, a split BWD two, four
 * when it recomputes; SEND, RECV, SYNC, STEP, GATHER as they are), then a
 * checkpoint's shard joins in pack.c's walk (layers in model order, shard
 * j from its owner to shard 0's, both ends waiting). Sizes are small and
 * derived from what both ends know (slice, tag), so members' calls agree
 * only when they are the same calls in the same order.
 */
static void plan_replay(sim_t *s, const sp_plan_t *p, const int32_t *at)
{
	for (int b = 0; b < p->n_buckets; b++)
		add_bucket(s, (const int *)(p->bucket_devs + p->buckets[b].dev_off),
			   p->buckets[b].n_dev);
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			const sp_slice_t *sl = in->slice >= 0 ? &p->slices[in->slice] : NULL;
			int layers = sl ? sl->layer_to - sl->layer_from : 0;
			int zero1 = in->op == INS_SYNC && p->buckets[in->peer].layout == LAYOUT_ZERO1;
			switch (in->op) {
			case INS_FWD: tp_acts(s, p, at, in->slice, d, 2 * layers); break;
			case INS_BWD:
				tp_acts(s, p, at, in->slice, d, (sl->recompute ? 4 : 2) * layers);
				break;
			case INS_SEND:
			case INS_RECV:
				add_act(s, d, in->op == INS_SEND ? K_SEND : K_RECV, in->peer, in->tag,
					1 + in->tag % 8);
				break;
			case INS_SYNC:
				add_act(s, d, zero1 ? K_REDUCE : K_ALLREDUCE, in->peer, 0, zero1 ? 7 : 3);
				break;
			case INS_STEP: add_act(s, d, K_STEP, -1, 0, 0); break;
			case INS_GATHER: add_act(s, d, K_BCAST, in->peer, 0, 7); break;
			default: break;
			}
		}
	for (int c = 0; c < p->model.n_comps; c++) {
		const sp_component_t *co = &p->model.comps[c];
		for (int l = 0; l < (co->type == COMP_TRANSFORMER ? (int)co->layers : 1); l++) {
			int t = 1, o0 = plan_shard_owner(p, c, l, 0, &t);
			for (int j = 1; j < t; j++) {
				int oj = plan_shard_owner(p, c, l, j, NULL);
				if (oj == o0)
					continue;
				add_act_w(s, oj, K_SEND, o0, 0, 1 + (c + l + j) % 8, 1);
				add_act(s, o0, K_RECV, oj, 0, 1 + (c + l + j) % 8);
			}
		}
	}
}

/* Runs `spindle-plan MODEL CLUSTER ARGS -o OUT` (SPINDLE_PLAN, paths under
 * SPINDLE_ROOT unless absolute) and reads OUT into *p. */
static void plan_with(sp_plan_t *p, const char *model, const char *cluster, const char *args,
		      const char *out)
{
	const char *plan = getenv("SPINDLE_PLAN"), *root = getenv("SPINDLE_ROOT");
	char cmd[2048];
	root = root && *root ? root : ".";
	snprintf(cmd, sizeof cmd, "'%s' '%s/%s' '%s%s%s' %s -o '%s' >/dev/null 2>&1", plan, root,
		 model, cluster[0] == '/' ? "" : root, cluster[0] == '/' ? "" : "/", cluster, args,
		 out);
	if (system(cmd) != 0)
		fail_msg("planning failed: %s", cmd);
	sp_err_t err = {0};
	if (plan_read(p, out, &err))
		fail_msg("reading %s: %s", out, err.msg);
}

/*
 * Planned with spindle-plan --tp 2: demo-sgd on 2 ranks (one group), on 4
 * (sequential: every slice on all four, transformers split into groups
 * [0 1] and [2 3], the rest whole and data-parallel), on 4 with zero-1
 * and recomputation forced, and on two nodes of two. The layout has every
 * split slice's groups, once each; the replayed step, with a checkpoint's
 * joins, finishes on every seed in both modes, every all-reduce summing
 * exactly its group's members (check_act) and the splits in the layout's
 * order with member j as rank j (check_creation).
 */
static void test_tp_planned(void **state)
{
	sim_t *s = *state;
	if (!getenv("SPINDLE_PLAN"))
		skip(); /* run outside meson test */
	char dir[] = "/tmp/spindle-nccl-tp-XXXXXX", c2[64], out[96];
	assert_non_null(mkdtemp(dir));
	snprintf(c2, sizeof c2, "%s/cluster-2.json", dir);
	snprintf(out, sizeof out, "%s/plan.bin", dir);
	FILE *f = fopen(c2, "w");
	assert_non_null(f);
	fputs("{\"format\": \"spindle.cluster/1\", \"name\": \"cpu-2\", \"nodes\": 1, "
	      "\"gpus_per_node\": 2, \"gpu\": {\"name\": \"cpu-process\", \"memory_gib\": 2, "
	      "\"peak_tflops\": 0.1, \"mem_bandwidth_gbs\": 10}, \"links\": {\"intra_node_gbs\": "
	      "4, \"intra_node_latency_us\": 5, \"inter_node_gbs\": 1, "
	      "\"inter_node_latency_us\": 50}}\n",
	      f);
	assert_int_equal(fclose(f), 0);
	static const struct {
		const char *cluster, *args;
		int ranks, mixed;
	} CASES[] = {
		{NULL, "--tp 2 --algo sequential", 2, 0},
		{"plans/clusters/cpu-4.json", "--tp 2 --algo sequential", 4, 1},
		{"plans/clusters/cpu-4.json", "--tp 2 --algo sequential --zero 1 --recompute all", 4,
		 1},
		{"tests/invalid/cli-tp-wider-than-node/cluster.json", "--tp 2 --algo sequential", 4, 1},
	};
	for (size_t q = 0; q < sizeof CASES / sizeof *CASES; q++) {
		sp_plan_t p;
		plan_with(&p, "tests/gpu/demo-sgd.json", CASES[q].cluster ? CASES[q].cluster : c2,
			  CASES[q].args, out);
		assert_int_equal(p.n_devices, CASES[q].ranks);
		ne_layout_t l;
		sp_tp_group_t *g = NULL;
		int32_t *at = NULL;
		int n = 0, split = 0, whole = 0;
		assert_int_equal(ne_layout_init(&l, &p), 0);
		assert_int_equal(plan_tp_groups(&p, &g, &n, &at), 0);
		assert_int_equal(l.n_tps, n);
		for (int k = 0; k < p.n_slices; k++) {
			const sp_slice_t *sl = &p.slices[k];
			split += sl->tp > 1;
			whole += sl->tp == 1 && sl->n_dev > 1;
			for (int i = 0; i < sl->n_dev; i++) { /* in its group, at its place */
				int32_t gi = at[sl->dev_off + i];
				if (sl->tp == 1) {
					assert_int_equal(gi, -1);
					continue;
				}
				assert_true(gi >= 0 && gi < n && l.tps[gi].t == sl->tp);
				assert_int_equal(l.slice_devs[l.tps[gi].off + i % sl->tp],
						 p.slice_devs[sl->dev_off + i]);
			}
		}
		for (int a = 0; a < n; a++) /* distinct */
			for (int b = a + 1; b < n; b++)
				assert_true(l.tps[a].t != l.tps[b].t ||
					    memcmp(l.slice_devs + l.tps[a].off, l.slice_devs + l.tps[b].off,
						   sizeof(int32_t) * (size_t)l.tps[a].t));
		assert_true(split > 0 && n == CASES[q].ranks / 2);
		assert_true(!CASES[q].mixed || whole > 0);
		for (unsigned seed = 1; seed <= 4; seed++)
			for (int mode = STRICT; mode <= CONNECT; mode++) {
				sim_init(s, p.n_devices, mode);
				s->n_tps = l.n_tps;
				s->tps = l.tps;
				s->slice_devs = l.slice_devs;
				plan_replay(s, &p, at);
				run_clean(s, seed, &l, CASES[q].args);
			}
		free(g);
		free(at);
		ne_layout_release(&l);
		plan_release(&p);
	}
	unlink(out);
	unlink(c2);
	rmdir(dir);
}

static int setup(void **state)
{
	*state = calloc(1, sizeof(sim_t));
	return *state ? 0 : -1;
}

static int teardown(void **state)
{
	free(*state);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout_from_plan),
		cmocka_unit_test(test_sync_serves_cts),
		cmocka_unit_test(test_sync_serves_cts_old_hangs),
		cmocka_unit_test(test_crossing_channels),
		cmocka_unit_test(test_crossing_channels_old_hangs),
		cmocka_unit_test(test_detects_no_progress),
		cmocka_unit_test(test_random_plans),
		cmocka_unit_test(test_zero1_halves),
		cmocka_unit_test(test_sharded_even),
		cmocka_unit_test(test_allgatherv_parts),
		cmocka_unit_test(test_padded_rounds),
		cmocka_unit_test(test_layout_tp_groups),
		cmocka_unit_test(test_tp_mixed),
		cmocka_unit_test(test_tp_planned),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
