/*
 * comm_nccl_none.c — stands in for comm_nccl.c in CUDA builds without
 * NCCL: one rank works (its all-reduces are no-ops on device buffers, so
 * the wrapped comm never touches device memory); backend_cuda refuses
 * more ranks before getting here.
 */
#include "cuda_backend.h"
#include "runtime.h"

static int none_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)buf;
	(void)n;
	*req = (rt_req_t){0, NULL, -1, group};
	return 0;
}

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
	c->iallreduce = none_iallreduce;
	return 0;
}

int comm_nccl_start(rt_comm_t *c, int dev_ok, sp_err_t *err)
{
	(void)c;
	(void)dev_ok;
	(void)err;
	return 0;
}
