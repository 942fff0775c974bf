/*
 * backend_cuda_none.c — stands in for the CUDA backend in builds without
 * CUDA: asking for it is an error that says so.
 */
#include "runtime.h"

int backend_cuda(rt_backend_t *b, sp_err_t *err)
{
	(void)b;
	return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			  "this spindle-run was built without CUDA; use --backend cpu");
}
