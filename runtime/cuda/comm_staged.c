/*
 * cuda/comm_staged.c — device buffers over a host comm, staged through host
 * memory (comm_staged.h). Each operation takes a staging buffer (best fit
 * from a free list, else a new one), copies device -> host before a send
 * or an all-reduce, starts the wrapped comm's operation on the host
 * buffer, and in test(), once that completes, copies host -> device after
 * a receive or an all-reduce and returns the buffer to the list. Message
 * sizes repeat every step, so after step 1 nothing is allocated.
 * It does not overlap copies with computing (the copies are synchronous)
 * and keeps the wrapped comm's matching rules (tags, groups) unchanged.
 */
#include "comm_staged.h"

#include <stdlib.h>

#define REQ_STAGED 0x5354 /* rt_req_t.kind of our requests */

enum { SOP_SEND, SOP_RECV, SOP_ALLREDUCE };

typedef struct sbuf {
	void *p;
	size_t cap;
	struct sbuf *next;
} sbuf_t;

typedef struct {
	rt_comm_t inner;
	const comm_staging_t *s;
	sbuf_t *idle; /* staging buffers no operation uses */
} staged_impl_t;

typedef struct {
	int op;
	void *dev; /* the caller's device buffer */
	size_t bytes;
	sbuf_t *buf;
	rt_req_t inner;
} sreq_t;

static staged_impl_t *sim(rt_comm_t *c)
{
	return c->impl;
}

/* The smallest idle buffer of at least `bytes`, else a new one. */
static sbuf_t *take(staged_impl_t *im, size_t bytes)
{
	sbuf_t **best = NULL;
	for (sbuf_t **b = &im->idle; *b; b = &(*b)->next)
		if ((*b)->cap >= bytes && (!best || (*b)->cap < (*best)->cap))
			best = b;
	if (best) {
		sbuf_t *b = *best;
		*best = b->next;
		b->next = NULL;
		return b;
	}
	sbuf_t *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	b->cap = bytes ? bytes : 1;
	b->p = im->s->host_alloc(b->cap);
	if (!b->p) {
		free(b);
		return NULL;
	}
	return b;
}

static void give(staged_impl_t *im, sbuf_t *b)
{
	b->next = im->idle;
	im->idle = b;
}

/* A request staging `bytes` of dev; for sends and all-reduces the device
 * data is copied to the staging buffer now. NULL when out of memory. */
static sreq_t *sreq_new(staged_impl_t *im, int op, void *dev, size_t bytes)
{
	sreq_t *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->buf = take(im, bytes);
	if (!r->buf) {
		free(r);
		return NULL;
	}
	r->op = op;
	r->dev = dev;
	r->bytes = bytes;
	if (op != SOP_RECV)
		im->s->to_host(r->buf->p, dev, bytes);
	return r;
}

static void sreq_free(staged_impl_t *im, sreq_t *r)
{
	give(im, r->buf);
	free(r);
}

/* rc: the wrapped comm's answer to starting r's operation. */
static int started(staged_impl_t *im, sreq_t *r, int rc, int peer, int tag, rt_req_t *req)
{
	if (rc) {
		sreq_free(im, r);
		return -1;
	}
	*req = (rt_req_t){REQ_STAGED, r, peer, tag};
	return 0;
}

static int s_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	staged_impl_t *im = sim(c);
	sreq_t *r = sreq_new(im, SOP_SEND, (void *)buf, bytes);
	if (!r)
		return -1;
	int rc = im->inner.ops->isend(&im->inner, r->buf->p, bytes, peer, tag, &r->inner);
	return started(im, r, rc, peer, tag, req);
}

static int s_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	staged_impl_t *im = sim(c);
	sreq_t *r = sreq_new(im, SOP_RECV, buf, bytes);
	if (!r)
		return -1;
	int rc = im->inner.ops->irecv(&im->inner, r->buf->p, bytes, peer, tag, &r->inner);
	return started(im, r, rc, peer, tag, req);
}

/*
 * A collective in place on the device floats buf[0..n): all of them go to
 * the host, the wrapped comm's collective (which: 0 all-reduce, 1
 * reduce-scatter, 2 all-gather) runs on the copy, and all of it comes
 * back. The zero-1 halves so move the whole bucket, not only the shard:
 * one code path, and --comm mpi exists to share a GPU, not for speed.
 */
static int s_coll(rt_comm_t *c, int which, float *buf, int64_t n, int group, rt_req_t *req)
{
	staged_impl_t *im = sim(c);
	const rt_comm_ops_t *o = im->inner.ops;
	if (n < 0)
		return -1;
	sreq_t *r = sreq_new(im, SOP_ALLREDUCE, buf, sizeof(float) * (size_t)n);
	if (!r)
		return -1;
	int rc = (which == 0   ? o->iallreduce
		  : which == 1 ? o->ireduce_scatter
			       : o->iallgather)(&im->inner, r->buf->p, n, group, &r->inner);
	return started(im, r, rc, -1, group, req);
}

static int s_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return s_coll(c, 0, buf, n, group, req);
}

static int s_ireduce_scatter(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return s_coll(c, 1, buf, n, group, req);
}

static int s_iallgather(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return s_coll(c, 2, buf, n, group, req);
}

/* The all-gather with parts: floats [0, the parts' end) staged as s_coll
 * does, the wrapped comm's all-gather with parts on the copy. */
static int s_iallgatherv(rt_comm_t *c, float *buf, int k, const int64_t *cnt,
			 const int64_t *off, int group, rt_req_t *req)
{
	staged_impl_t *im = sim(c);
	int64_t n = 0;
	for (int i = 0; i < k; i++) {
		if (cnt[i] < 0 || off[i] < 0)
			return -1;
		n = cnt[i] ? (off[i] + cnt[i] > n ? off[i] + cnt[i] : n) : n;
	}
	sreq_t *r = sreq_new(im, SOP_ALLREDUCE, buf, sizeof(float) * (size_t)n);
	if (!r)
		return -1;
	int rc = im->inner.ops->iallgatherv(&im->inner, r->buf->p, k, cnt, off, group, &r->inner);
	return started(im, r, rc, -1, group, req);
}

/* Done when the wrapped operation is; received and reduced data then goes
 * back to the device before *done is set. */
static int s_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	staged_impl_t *im = sim(c);
	*done = 1;
	if (!req->kind)
		return 0;
	if (req->kind != REQ_STAGED)
		return -1;
	sreq_t *r = req->impl;
	int inner_done = 0;
	if (im->inner.ops->test(&im->inner, &r->inner, &inner_done))
		return -1;
	*done = inner_done;
	if (!inner_done)
		return 0;
	if (r->op != SOP_SEND)
		im->s->to_device(r->dev, r->buf->p, r->bytes);
	sreq_free(im, r);
	*req = (rt_req_t){0, NULL, -1, 0};
	return 0;
}

/* ---- host operations: the wrapped comm's ---- */

static int s_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	rt_comm_t *in = &sim(c)->inner;
	return in->ops->group_create(in, ranks, n, out);
}

static int s_allsum(rt_comm_t *c, double *buf, int n)
{
	rt_comm_t *in = &sim(c)->inner;
	return in->ops->allsum(in, buf, n);
}

static int s_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	rt_comm_t *in = &sim(c)->inner;
	return in->ops->gather(in, buf, bytes, out, sizes);
}

static int s_barrier(rt_comm_t *c)
{
	rt_comm_t *in = &sim(c)->inner;
	return in->ops->barrier(in);
}

static void s_abort(rt_comm_t *c, int code)
{
	rt_comm_t *in = &sim(c)->inner;
	in->ops->abort(in, code);
}

/* Frees the idle staging buffers (every operation has completed by now),
 * puts the wrapped comm back in place and finalizes it. */
static void s_finalize(rt_comm_t *c)
{
	staged_impl_t *im = sim(c);
	while (im->idle) {
		sbuf_t *b = im->idle;
		im->idle = b->next;
		im->s->host_free(b->p);
		free(b);
	}
	*c = im->inner;
	free(im);
	c->ops->finalize(c);
}

static const rt_comm_ops_t staged_ops = {
	.group_create = s_group, .isend = s_isend, .irecv = s_irecv,
	.iallreduce = s_iallreduce, .ireduce_scatter = s_ireduce_scatter,
	.iallgather = s_iallgather, .iallgatherv = s_iallgatherv, .test = s_test,
	.allsum = s_allsum, .gather = s_gather,
	.barrier = s_barrier, .abort = s_abort, .finalize = s_finalize,
};

int comm_staged_wrap(rt_comm_t *c, const comm_staging_t *s, sp_err_t *err)
{
	staged_impl_t *im = calloc(1, sizeof *im);
	if (!im)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	im->inner = *c;
	im->s = s;
	c->impl = im;
	c->ops = &staged_ops;
	c->name = "staged";
	return 0;
}
