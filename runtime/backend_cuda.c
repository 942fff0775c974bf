/*
 * backend_cuda.c — the CUDA backend's table (builds with CUDA; without it,
 * backend_cuda_none.c stands in). The math lives behind the extern "C"
 * header cuda/cuda_backend.h; parameter initialisation stays on the host
 * (layers.c's layer_init, then to_device), so both backends start from the
 * same bits. With more than one rank the comm is wrapped so that device
 * buffers move over NCCL (cuda/comm_nccl.c); without NCCL such runs are
 * refused.
 */
#include "cuda/cuda_backend.h"
#include "layers.h"
#include "runtime.h"

static void cuda_abort_hook(void *ctx, int code)
{
	rt_comm_t *c = ctx;
	c->ops->abort(c, code);
}

static int cuda_attach(rt_comm_t *c, sp_err_t *err)
{
	if (c->nranks > 1 && !comm_nccl_available()) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "the cuda backend needs NCCL for %d ranks, and this spindle-run was "
			   "built without it",
			   c->nranks);
		sp_err_hint(err, "rebuild with NCCL (-Dnccl=enabled), run one rank, or use "
				 "--backend cpu");
		return SP_EINPUT;
	}
	if (comm_nccl_wrap(c, err))
		return err->code ? err->code : SP_EINTERNAL;
	return 0;
}

static int cuda_init(rt_comm_t *c, sp_err_t *err)
{
	int rc = cu_init(c->rank, err);
	cu_set_abort(cuda_abort_hook, c);
	/* every rank takes part, so a rank without a device cannot strand the others */
	if (c->nranks > 1) {
		int rc2 = comm_nccl_start(c, rc == 0, err);
		if (!rc)
			rc = rc2;
	}
	return rc;
}

#define CUDA_MATH(f) .f = cu_##f,
const rt_backend_t backend_cuda = {
	.name = "cuda", .attach = cuda_attach, .init = cuda_init, .shutdown = cu_shutdown,
	.alloc = cu_alloc, .release = cu_release, .to_device = cu_to_device,
	.to_host = cu_to_host, .zero = cu_zero, .copy_rows = cu_copy_rows, .sync = cu_sync,
	RT_BACKEND_MATH(CUDA_MATH)
	/* parameters are initialised on the host, then copied */
	.layer_init = layer_init,
};
