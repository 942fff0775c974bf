/*
 * backend_cuda_none.c — stands in for the CUDA backend's table in builds
 * without CUDA: attaching it is an error that says so. Its other entries
 * are NULL; nothing reaches them, since every user attaches first.
 */
#include "runtime.h"

static int none_attach(rt_comm_t *c, sp_err_t *err)
{
	(void)c;
	return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			  "this spindle-run was built without CUDA; use --backend cpu");
}

const rt_backend_t backend_cuda = {.name = "cuda", .attach = none_attach};
