/*
 * backend_cuda.c — the CUDA backend's table (builds with CUDA; without it,
 * backend_cuda_none.c stands in). The math lives behind the extern "C"
 * header cuda/cuda_backend.h; parameter initialisation stays on the host
 * (layers.c's layer_init, then to_device), so both backends start from the
 * same bits. Device buffers move between ranks over the data plane the
 * comm names (rt_comm_t.dataplane, from --comm), one row of `planes`:
 *   nccl  (the default) cuda/comm_nccl.c; without NCCL only one rank runs;
 *   mpi   cuda/comm_staged.c over the MPI comm, through pinned host
 *         buffers: slower, but several ranks may share one GPU.
 */
#include "cuda/comm_staged.h"
#include "cuda/cuda_backend.h"
#include "layers.h"
#include "runtime.h"

#include <cuda_runtime_api.h>
#include <string.h>

static void cuda_abort_hook(void *ctx, int code)
{
	rt_comm_t *c = ctx;
	c->ops->abort(c, code);
}

/* Pinned host memory for staging: the copies need no bounce buffer. */
static void *pinned_alloc(size_t bytes)
{
	void *p = NULL;
	if (cudaMallocHost(&p, bytes) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return p;
}

static void pinned_free(void *p)
{
	if (p)
		cudaFreeHost(p);
}

static const comm_staging_t pinned_staging = {
	.to_host = cu_to_host, .to_device = cu_to_device,
	.host_alloc = pinned_alloc, .host_free = pinned_free,
};

static int staged_wrap(rt_comm_t *c, sp_err_t *err)
{
	return comm_staged_wrap(c, &pinned_staging, err);
}

static int nccl_multi(void)
{
	return comm_nccl_available();
}

static int always(void)
{
	return 1;
}

typedef struct {
	const char *name;
	/* whether this build can run more than one rank over it */
	int (*multi_rank)(void);
	int (*wrap)(rt_comm_t *c, sp_err_t *err);
	/* collective after cu_init when several ranks run; NULL: nothing to do */
	int (*start)(rt_comm_t *c, int dev_ok, sp_err_t *err);
	/* collective before the plan's buffers: its communicators; NULL: none */
	int (*prepare)(rt_comm_t *c, const sp_plan_t *p, sp_err_t *err);
	/* several local ranks may share one GPU (NCCL refuses that) */
	int shares_device;
} dataplane_t;

/* the default first */
static const dataplane_t planes[] = {
	{"nccl", nccl_multi, comm_nccl_wrap, comm_nccl_start, comm_nccl_prepare, 0},
	{"mpi", always, staged_wrap, NULL, NULL, 1},
};

static const dataplane_t *plane_of(const rt_comm_t *c)
{
	for (size_t i = 0; i < sizeof planes / sizeof planes[0]; i++)
		if (!c->dataplane || !strcmp(c->dataplane, planes[i].name))
			return &planes[i];
	return NULL;
}

static int cuda_attach(rt_comm_t *c, sp_err_t *err)
{
	const dataplane_t *dp = plane_of(c);
	if (!dp) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "unknown data plane '%s'",
			   c->dataplane);
		sp_err_hint(err, "use --comm nccl or --comm mpi");
		return SP_EINPUT;
	}
	if (c->nranks > 1 && !dp->multi_rank()) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "the cuda backend needs NCCL for %d ranks, and this spindle-run was "
			   "built without it",
			   c->nranks);
		sp_err_hint(err, "rebuild with NCCL (-Dnccl=enabled), stage through host memory "
				 "with --comm mpi, run one rank, or use --backend cpu");
		return SP_EINPUT;
	}
	if (dp->wrap(c, err))
		return err->code ? err->code : SP_EINTERNAL;
	return 0;
}

static int cuda_init(rt_comm_t *c, sp_err_t *err)
{
	const dataplane_t *dp = plane_of(c);
	cu_allow_shared_device(dp && dp->shares_device);
	int rc = cu_init(c->rank, err);
	cu_set_abort(cuda_abort_hook, c);
	/* every rank takes part, so a rank without a device cannot strand the others */
	if (c->nranks > 1 && dp && dp->start) {
		int rc2 = dp->start(c, rc == 0, err);
		if (!rc)
			rc = rc2;
	}
	return rc;
}

/*
 * The reduction scratch the plan's layers can ask for (cu_kernels.cu: a
 * column sum over rows in at most 1024 chunks of >= 64 rows keeps one float
 * per chunk and column, layer norm's two): 4 bytes times the larger of
 *   2 * 1024 * the widest bias or norm (3h, ffn, out, classes, h), and
 *   ceil(B/64) * seq * h for position embeddings summed over B samples,
 * B the largest task batch. Reserved at start-up so that no step grows it
 * (a request above it would still grow it, with a warning).
 */
static size_t reduction_bound(const sp_plan_t *p)
{
	const sp_model_t *m = &p->model;
	int64_t batch = 1, wide = 1, pos = 1;
	for (int t = 0; t < m->n_tasks; t++)
		batch = SP_MAX(batch, m->tasks[t].batch);
	for (int i = 0; i < m->n_comps; i++) {
		const sp_component_t *c = &m->comps[i];
		wide = SP_MAX(wide, SP_MAX(3 * c->hidden, SP_MAX(c->ffn, SP_MAX(c->out, c->classes))));
		if (c->type == COMP_EMBEDDING || c->type == COMP_PATCH)
			pos = SP_MAX(pos, (batch + 63) / 64 * c->max_seq * c->hidden);
	}
	return sizeof(float) * (size_t)SP_MAX(2 * 1024 * wide, pos);
}

static int cuda_prepare(rt_comm_t *c, const sp_plan_t *p, sp_err_t *err)
{
	const dataplane_t *dp = plane_of(c);
	cu_reserve_reduction(reduction_bound(p));
	return c->nranks > 1 && dp && dp->prepare ? dp->prepare(c, p, err) : 0;
}

#define CUDA_MATH(f) .f = cu_##f,
const rt_backend_t backend_cuda = {
	.name = "cuda", .attach = cuda_attach, .init = cuda_init, .prepare = cuda_prepare,
	.reserve_params = cu_reserve_shadow, .shutdown = cu_shutdown,
	.alloc = cu_alloc, .release = cu_release, .to_device = cu_to_device,
	.to_host = cu_to_host, .zero = cu_zero, .copy_rows = cu_copy_rows, .sync = cu_sync,
	RT_BACKEND_MATH(CUDA_MATH)
	/* parameters are initialised on the host, then copied */
	.layer_init = layer_init,
	/* vocabulary parallel (not yet run on a GPU: tools/gpu-check) */
	.embedding_fwd_tp = cu_embedding_fwd_tp, .embedding_bwd_tp = cu_embedding_bwd_tp,
	.lm_head_loss_tp = cu_lm_head_loss_tp,
	/* sequence parallel (cuda/cu_sp.cu; not yet run on a GPU either) */
	.seq_parallel = 1,
};
