/*
 * backend_cuda.c — the CUDA backend's table (builds with CUDA; without it,
 * backend_cuda_none.c stands in). The math lives behind the extern "C"
 * header cuda/cuda_backend.h; parameter initialisation stays on the host
 * (layers.c's layer_init, then to_device), so both backends start from the
 * same bits. With more than one rank the comm is wrapped so that device
 * buffers move over NCCL (comm_nccl.c); without NCCL such runs are refused.
 */
#include "cuda/cuda_backend.h"
#include "layers.h"
#include "runtime.h"

#include <string.h>

static void cuda_abort_hook(void *ctx, int code)
{
	rt_comm_t *c = ctx;
	if (c && c->abort)
		c->abort(c, code);
}

static int cuda_init(rt_backend_t *b, int rank, sp_err_t *err)
{
	int rc = cu_init(rank, err);
	cu_set_abort(cuda_abort_hook, &b->comm);
	/* every rank takes part, so a rank without a device cannot strand the others */
	if (b->comm.nranks > 1) {
		int rc2 = comm_nccl_start(&b->comm, rc == 0, err);
		if (!rc)
			rc = rc2;
	}
	return rc;
}

static void cuda_shutdown(rt_backend_t *b)
{
	(void)b;
	cu_shutdown();
}

int backend_cuda(rt_backend_t *b, sp_err_t *err)
{
	rt_comm_t keep = b->comm;
	if (keep.nranks > 1 && !comm_nccl_available()) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "the cuda backend needs NCCL for %d ranks, and this spindle-run was "
			   "built without it",
			   keep.nranks);
		sp_err_hint(err, "rebuild with NCCL (-Dnccl=enabled), run one rank, or use "
				 "--backend cpu");
		return SP_EINPUT;
	}
	memset(b, 0, sizeof *b);
	b->comm = keep;
	if (comm_nccl_wrap(&b->comm, err))
		return err->code ? err->code : SP_EINTERNAL;
	b->name = "cuda";
	b->init = cuda_init;
	b->shutdown = cuda_shutdown;
	b->alloc = cu_alloc;
	b->release = cu_release;
	b->to_device = cu_to_device;
	b->to_host = cu_to_host;
	b->zero = cu_zero;
	b->copy_rows = cu_copy_rows;
	b->embedding_fwd = cu_embedding_fwd;
	b->embedding_bwd = cu_embedding_bwd;
	b->patch_fwd = cu_patch_fwd;
	b->patch_bwd = cu_patch_bwd;
	b->tblock_fwd = cu_tblock_fwd;
	b->tblock_bwd = cu_tblock_bwd;
	b->linear_fwd = cu_linear_fwd;
	b->linear_bwd = cu_linear_bwd;
	b->lm_head_loss = cu_lm_head_loss;
	b->classifier_loss = cu_classifier_loss;
	b->contrastive_loss = cu_contrastive_loss;
	b->adamw_step = cu_adamw_step;
	b->sgd_step = cu_sgd_step;
	b->layer_init = layer_init;
	b->sync = cu_sync;
	return 0;
}
