/*
 * cuda/comm_nccl_none.c — stands in for cuda/comm_nccl.c in CUDA builds
 * without NCCL: one rank works. The wrapped comm (a copy kept in impl)
 * serves everything but the collectives (all-reduce, reduce-scatter,
 * all-gather), identities for one rank and so no-ops on device buffers:
 * it never touches device memory; backend_cuda refuses more ranks
 * before getting here.
 */
#include "cuda_backend.h"
#include "runtime.h"

#include <stdlib.h>

static rt_comm_t *inner(rt_comm_t *c)
{
	return c->impl;
}

static int none_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	return inner(c)->ops->group_create(inner(c), ranks, n, out);
}

static int none_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		      rt_req_t *req)
{
	return inner(c)->ops->isend(inner(c), buf, bytes, peer, tag, req);
}

static int none_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	return inner(c)->ops->irecv(inner(c), buf, bytes, peer, tag, req);
}

static int none_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)buf;
	(void)n;
	*req = (rt_req_t){0, NULL, -1, group};
	return 0;
}

static int none_iallgatherv(rt_comm_t *c, float *buf, int k, const int64_t *cnt,
			    const int64_t *off, int group, rt_req_t *req)
{
	(void)c;
	(void)buf;
	*req = (rt_req_t){0, NULL, -1, group};
	return k == 1 && cnt[0] >= 0 && off[0] >= 0 ? 0 : -1;
}

static int none_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	return inner(c)->ops->test(inner(c), req, done);
}

static int none_allsum(rt_comm_t *c, double *buf, int n)
{
	return inner(c)->ops->allsum(inner(c), buf, n);
}

static int none_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	return inner(c)->ops->gather(inner(c), buf, bytes, out, sizes);
}

static int none_barrier(rt_comm_t *c)
{
	return inner(c)->ops->barrier(inner(c));
}

static void none_abort(rt_comm_t *c, int code)
{
	inner(c)->ops->abort(inner(c), code);
}

static void none_finalize(rt_comm_t *c)
{
	rt_comm_t *in = inner(c);
	*c = *in;
	free(in);
	c->ops->finalize(c);
}

static const rt_comm_ops_t none_ops = {
	.group_create = none_group, .isend = none_isend, .irecv = none_irecv,
	.iallreduce = none_iallreduce, .ireduce_scatter = none_iallreduce,
	.iallgather = none_iallreduce, .iallgatherv = none_iallgatherv, .test = none_test,
	.allsum = none_allsum,
	.gather = none_gather, .barrier = none_barrier, .abort = none_abort,
	.finalize = none_finalize,
};

int comm_nccl_available(void)
{
	return 0;
}

int comm_nccl_wrap(rt_comm_t *c, sp_err_t *err)
{
	if (c->nranks > 1)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				  "this spindle-run was built without NCCL: the cuda backend runs "
				  "one rank only");
	rt_comm_t *in = malloc(sizeof *in);
	if (!in)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	*in = *c;
	c->impl = in;
	c->ops = &none_ops;
	return 0;
}

int comm_nccl_start(rt_comm_t *c, int dev_ok, sp_err_t *err)
{
	(void)c;
	(void)dev_ok;
	(void)err;
	return 0;
}

int comm_nccl_prepare(rt_comm_t *c, const sp_plan_t *p, sp_err_t *err)
{
	(void)c;
	(void)p;
	(void)err;
	return 0;
}
