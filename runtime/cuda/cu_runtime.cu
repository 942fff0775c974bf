/*
 * cu_runtime.cu — the CUDA backend's state: device choice, the compute
 * stream and cuBLAS handle, error reporting, device memory (the
 * interpreter's allocations, each registered so that parameter pointers can
 * find their bf16 shadow), the layer workspace, copies, and the optimizer
 * steps. Also the row-major GEMM wrappers every layer uses.
 *
 * Not here: layer math (cu_layers.cu, cu_loss.cu, cu_kernels.cu) and
 * communication (comm_nccl.c).
 *
 * Device memory before step 1: cu_init reserves the layer workspace (at the
 * cap the layers chunk their samples to) and the reduction scratch (grown
 * to the plan's bound by cu_reserve_reduction before rt_create), and a
 * pinned staging buffer through which every host<->device copy goes
 * (cudaMemcpyAsync from pageable memory stages and synchronises behind
 * the caller's back). cudaMalloc/cudaFree mid-step synchronise the device,
 * which hangs while an NCCL kernel waits for a peer; a later request above
 * a reservation still grows it, with a warning naming the sizes.
 *
 * bf16 shadows: cu_reserve_shadow makes an allocation's bf16 mirror at
 * start-up; otherwise it is made the first time a layer asks for the
 * shadow of a pointer inside it (cu_shadow). The optimizer
 * kernels write the mirror as they update the fp32 masters; any other write
 * through this backend (to_device, zero, copy_rows), or announced by the
 * data plane (cu_mark_written: a zero-1 all-gather of weights over NCCL),
 * marks the allocation dirty and the next cu_shadow re-converts it whole. Layer kernels never
 * write parameters, so nothing else can make a shadow stale.
 */
#include "cu_internal.cuh"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace {

struct alloc_rec {
	char *base;
	size_t bytes;
	bf16 *shadow;
	bool dirty;
};

struct cu_state {
	int rank = 0, device = -1;
	char host[64] = "?";
	cudaStream_t stream = nullptr;
	cublasHandle_t blas = nullptr;
	char *ws = nullptr;
	size_t ws_bytes = 0, ws_cap = (size_t)2 << 30;
	char *red = nullptr;
	size_t red_bytes = 0;
	double *pinned = nullptr;
	char *stage = nullptr; /* pinned staging for host<->device copies */
	size_t stage_bytes = 0;
	bool reserved = false, warned = false, share_ok = false;
	alloc_rec *recs = nullptr;
	int n_recs = 0, cap_recs = 0;
	size_t shadow_bytes = 0;
	char first_err[512] = "";
	void (*abort_fn)(void *, int) = nullptr;
	void *abort_ctx = nullptr;
};

cu_state g;

alloc_rec *find_rec(const void *p)
{
	const char *c = (const char *)p;
	for (int i = 0; i < g.n_recs; i++)
		if (c >= g.recs[i].base && c < g.recs[i].base + g.recs[i].bytes)
			return &g.recs[i];
	return nullptr;
}

void mark_dirty(const void *p)
{
	alloc_rec *r = find_rec(p);
	if (r && r->shadow)
		r->dirty = true;
}

/* Grows *buf to at least `bytes` (rounded to 1 MiB) after draining the stream. */
char *grow(char **buf, size_t *have, size_t bytes, const char *what)
{
	if (bytes <= *have && *buf)
		return *buf;
	if (g.reserved && !g.warned) {
		char msg[200];
		snprintf(msg, sizeof msg,
			 "rank %d: %s: %.1f MiB asked, %.1f MiB reserved at start-up: growing "
			 "mid-step (this synchronises the device)",
			 g.rank, what, (double)bytes / 1048576.0, (double)*have / 1048576.0);
		fprintf(stderr, "spindle-run: warning: %s\n", msg);
		g.warned = true;
	}
	size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
	if (want == 0)
		want = (size_t)1 << 20;
	CUDA_CHECK(cudaStreamSynchronize(g.stream));
	if (*buf)
		CUDA_CHECK(cudaFree(*buf));
	*buf = nullptr;
	*have = 0;
	if (cudaMalloc((void **)buf, want) != cudaSuccess) {
		char msg[160];
		cudaGetLastError();
		snprintf(msg, sizeof msg, "out of device memory: need %.1f MiB",
			 (double)want / 1048576.0);
		cu_fatal(__FILE__, __LINE__, what, msg);
	}
	*have = want;
	return *buf;
}

int cu_local_rank(int rank)
{
	const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
			       "LOCAL_RANK"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		const char *v = getenv(names[i]);
		if (v && *v)
			return atoi(v);
	}
	return rank;
}

} /* namespace */

/* ---- errors ---- */

const char *cu_cublas_string(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
	case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
	case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
	case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
	}
	return "unknown cuBLAS status";
}

void cu_fatal(const char *file, int line, const char *what, const char *detail)
{
	char msg[512];
	snprintf(msg, sizeof msg, "rank %d on %s: %s:%d: %s: %s", g.rank, g.host, file, line, what,
		 detail);
	if (!g.first_err[0])
		snprintf(g.first_err, sizeof g.first_err, "%s", msg);
	fprintf(stderr, "spindle-run: cuda backend error: %s\n", msg);
	fprintf(stderr, "hint: the CUDA context cannot be used after this; the job is aborted\n");
	fflush(stderr);
	if (g.abort_fn)
		g.abort_fn(g.abort_ctx, 1);
	abort();
}

void cu_set_abort(void (*fn)(void *ctx, int code), void *ctx)
{
	g.abort_fn = fn;
	g.abort_ctx = ctx;
}

const char *cu_first_error(void)
{
	return g.first_err;
}

/* ---- state ---- */

cudaStream_t cu_s(void)
{
	return g.stream;
}

void *cu_stream(void)
{
	return (void *)g.stream;
}

size_t cu_ws_cap(void)
{
	return g.ws_cap;
}

void cu_set_workspace_cap(size_t bytes)
{
	g.ws_cap = bytes ? bytes : 1;
}

void cu_memory_extra(size_t *workspace, size_t *shadows)
{
	*workspace = g.ws_bytes + g.red_bytes;
	*shadows = g.shadow_bytes;
}

char *cu_ws_get(size_t bytes)
{
	return grow(&g.ws, &g.ws_bytes, bytes, "growing the layer workspace");
}

void cu_reserve_reduction(size_t bytes)
{
	bool was = g.reserved; /* start-up: no warning */
	g.reserved = false;
	grow(&g.red, &g.red_bytes, bytes, "reserving the reduction scratch");
	g.reserved = was;
}

char *cu_red_get(size_t bytes)
{
	return grow(&g.red, &g.red_bytes, bytes, "growing the reduction scratch");
}

double *cu_host_scalars(void)
{
	return g.pinned;
}

int cu_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}

int cu_init(int rank, sp_err_t *err)
{
	g.rank = rank;
	if (gethostname(g.host, sizeof g.host - 1) != 0)
		snprintf(g.host, sizeof g.host, "?");
	g.host[sizeof g.host - 1] = 0;
	const char *cap = getenv("SPINDLE_CUDA_WORKSPACE_MB");
	if (cap && atol(cap) > 0)
		cu_set_workspace_cap((size_t)atol(cap) << 20);
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0) {
		cudaGetLastError();
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "rank %d on %s: no usable CUDA device (cudaGetDeviceCount: %s)", rank,
			   g.host, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		sp_err_hint(err, "check nvidia-smi, or run with --backend cpu");
		return SP_EINPUT;
	}
	int local = cu_local_rank(rank);
	if (local >= n && !g.share_ok) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "rank %d on %s: local rank %d but only %d CUDA device%s: two ranks "
			   "would share a GPU, which NCCL refuses",
			   rank, g.host, local, n, n == 1 ? "" : "s");
		sp_err_hint(err, "start at most %d rank%s per machine, or use --comm mpi", n,
			    n == 1 ? "" : "s");
		return SP_EINPUT;
	}
	g.device = local % n;
#define INIT_CHECK(call, what)                                                                \
	do {                                                                                  \
		cudaError_t ce_ = (call);                                                     \
		if (ce_ != cudaSuccess) {                                                     \
			cudaGetLastError();                                                   \
			return sp_err_set(err, SP_EIO, __FILE__, __LINE__, 0, NULL,          \
					  "rank %d on %s: %s failed on device %d: %s", rank,  \
					  g.host, what, g.device, cudaGetErrorString(ce_));   \
		}                                                                             \
	} while (0)
	INIT_CHECK(cudaSetDevice(g.device), "cudaSetDevice");
	INIT_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking),
		   "creating the compute stream");
	INIT_CHECK(cudaMallocHost((void **)&g.pinned, 16 * sizeof(double)),
		   "allocating pinned host memory");
	g.stage_bytes = (size_t)8 << 20;
	INIT_CHECK(cudaMallocHost((void **)&g.stage, g.stage_bytes),
		   "allocating the pinned staging buffer");
	/* the workspace and reduction scratch, before any collective runs */
	INIT_CHECK(cudaMalloc((void **)&g.ws, g.ws_cap), "reserving the layer workspace");
	g.ws_bytes = g.ws_cap;
	INIT_CHECK(cudaMalloc((void **)&g.red, (size_t)64 << 20),
		   "reserving the reduction scratch");
	g.red_bytes = (size_t)64 << 20;
	g.reserved = true;
#undef INIT_CHECK
	cublasStatus_t bs = cublasCreate(&g.blas);
	if (bs == CUBLAS_STATUS_SUCCESS)
		bs = cublasSetStream(g.blas, g.stream);
	if (bs == CUBLAS_STATUS_SUCCESS)
		bs = cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH);
	if (bs != CUBLAS_STATUS_SUCCESS)
		return sp_err_set(err, SP_EIO, __FILE__, __LINE__, 0, NULL,
				  "rank %d on %s: cuBLAS initialisation failed on device %d: %s",
				  rank, g.host, g.device, cu_cublas_string(bs));
	return 0;
}

void cu_shutdown(void)
{
	if (g.device < 0)
		return;
	if (g.stream)
		cudaStreamSynchronize(g.stream);
	for (int i = 0; i < g.n_recs; i++) {
		cudaFree(g.recs[i].shadow);
		cudaFree(g.recs[i].base);
	}
	free(g.recs);
	g.recs = nullptr;
	g.n_recs = g.cap_recs = 0;
	g.shadow_bytes = 0;
	cudaFree(g.ws);
	cudaFree(g.red);
	g.ws = g.red = nullptr;
	g.ws_bytes = g.red_bytes = 0;
	if (g.pinned)
		cudaFreeHost(g.pinned);
	g.pinned = nullptr;
	if (g.stage)
		cudaFreeHost(g.stage);
	g.stage = nullptr;
	g.stage_bytes = 0;
	g.reserved = g.warned = false;
	if (g.blas)
		cublasDestroy(g.blas);
	g.blas = nullptr;
	/* the stream stays: NCCL (comm finalize, after this) may still use it */
}

/* ---- memory ---- */

void *cu_alloc(size_t bytes)
{
	void *p = nullptr;
	size_t n = bytes ? bytes : 1;
	if (cudaMalloc(&p, n) != cudaSuccess) {
		cudaGetLastError();
		if (!g.first_err[0])
			snprintf(g.first_err, sizeof g.first_err,
				 "rank %d on %s: cudaMalloc of %.1f MiB failed", g.rank, g.host,
				 (double)n / 1048576.0);
		return nullptr;
	}
	/* the CPU backend's memory starts zeroed (AdamW moments rely on it) */
	CUDA_CHECK(cudaMemsetAsync(p, 0, n, g.stream));
	CUDA_CHECK(cudaStreamSynchronize(g.stream));
	if (g.n_recs == g.cap_recs) {
		int nc = g.cap_recs ? 2 * g.cap_recs : 16;
		alloc_rec *nr = (alloc_rec *)realloc(g.recs, sizeof *nr * (size_t)nc);
		if (!nr) {
			cudaFree(p);
			return nullptr;
		}
		g.recs = nr;
		g.cap_recs = nc;
	}
	g.recs[g.n_recs++] = alloc_rec{(char *)p, n, nullptr, false};
	return p;
}

void cu_release(void *p)
{
	if (!p)
		return;
	CUDA_CHECK(cudaStreamSynchronize(g.stream));
	for (int i = 0; i < g.n_recs; i++)
		if (g.recs[i].base == (char *)p) {
			if (g.recs[i].shadow) {
				CUDA_CHECK(cudaFree(g.recs[i].shadow));
				g.shadow_bytes -= g.recs[i].bytes / 2;
			}
			g.recs[i] = g.recs[--g.n_recs];
			break;
		}
	CUDA_CHECK(cudaFree(p));
}

void cu_allow_shared_device(int allowed)
{
	g.share_ok = allowed != 0;
}

void cu_mark_written(const void *p)
{
	mark_dirty(p);
}

void cu_reserve_shadow(const float *p, int64_t n)
{
	cu_shadow(p, n);
	CUDA_CHECK(cudaStreamSynchronize(g.stream));
}

const bf16 *cu_shadow(const float *p, int64_t n)
{
	alloc_rec *r = find_rec(p);
	if (!r || (const char *)(p + n) > r->base + r->bytes)
		cu_fatal(__FILE__, __LINE__, "finding the bf16 shadow of parameters",
			 "the pointer is not inside one allocation of this backend");
	int64_t count = (int64_t)(r->bytes / sizeof(float));
	if (!r->shadow) {
		size_t sb = sizeof(bf16) * (size_t)(count > 0 ? count : 1);
		if (cudaMalloc((void **)&r->shadow, sb) != cudaSuccess) {
			char msg[128];
			cudaGetLastError();
			snprintf(msg, sizeof msg, "out of device memory: need %.1f MiB",
				 (double)sb / 1048576.0);
			cu_fatal(__FILE__, __LINE__, "allocating bf16 weight shadows", msg);
		}
		g.shadow_bytes += r->bytes / 2;
		r->dirty = true;
	}
	if (r->dirty) {
		k_to_bf16(r->shadow, (const float *)r->base, count);
		r->dirty = false;
	}
	return r->shadow + (p - (const float *)r->base);
}

/* bf16 shadow to update alongside p[0..n), or NULL (none, or stale anyway) */
static bf16 *shadow_for_update(float *p, int64_t n)
{
	alloc_rec *r = find_rec(p);
	if (!r || !r->shadow || r->dirty || (const char *)(p + n) > r->base + r->bytes)
		return nullptr;
	return r->shadow + (p - (const float *)r->base);
}

/* Host<->device through the pinned staging buffer, one chunk at a time
 * (to_device: 1, dev is dst). Synchronous, like the CPU backend's copies. */
static void staged_copy(char *dev, char *host, size_t bytes, int to_device)
{
	for (size_t off = 0; off < bytes; off += g.stage_bytes) {
		size_t n = bytes - off < g.stage_bytes ? bytes - off : g.stage_bytes;
		if (to_device) {
			memcpy(g.stage, host + off, n);
			CUDA_CHECK(cudaMemcpyAsync(dev + off, g.stage, n, cudaMemcpyHostToDevice,
						   g.stream));
			CUDA_CHECK(cudaStreamSynchronize(g.stream));
		} else {
			CUDA_CHECK(cudaMemcpyAsync(g.stage, dev + off, n, cudaMemcpyDeviceToHost,
						   g.stream));
			CUDA_CHECK(cudaStreamSynchronize(g.stream));
			memcpy(host + off, g.stage, n);
		}
	}
}

void cu_to_device(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	staged_copy((char *)dst, (char *)src, bytes, 1);
	mark_dirty(dst);
}

void cu_to_host(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	staged_copy((char *)src, (char *)dst, bytes, 0);
}

void cu_zero(float *p, int64_t n)
{
	if (n <= 0)
		return;
	CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * (size_t)n, g.stream));
	mark_dirty(p);
}

void cu_copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
		  int64_t rows, int64_t cols, int acc)
{
	if (rows <= 0 || cols <= 0)
		return;
	if (acc)
		k_add_2d(dst, dst_stride, src, src_stride, rows, cols);
	else
		CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(float) * (size_t)dst_stride, src,
					     sizeof(float) * (size_t)src_stride,
					     sizeof(float) * (size_t)cols, (size_t)rows,
					     cudaMemcpyDeviceToDevice, g.stream));
	mark_dirty(dst);
}

void cu_sync(void)
{
	CUDA_CHECK(cudaStreamSynchronize(g.stream));
}

/* ---- optimizer ---- */

void cu_adamw_step(float *p, const float *g_, float *m, float *v, int64_t n, int t,
		   const sp_optim_t *o)
{
	double c1 = 1.0 - pow(o->beta1, t), c2 = 1.0 - pow(o->beta2, t);
	k_adamw(p, g_, m, v, shadow_for_update(p, n), n, (float)o->lr, (float)o->beta1,
		(float)o->beta2, (float)o->eps, (float)o->weight_decay, (float)c1, (float)c2);
}

void cu_sgd_step(float *p, const float *g_, int64_t n, const sp_optim_t *o)
{
	k_sgd(p, g_, shadow_for_update(p, n), n, (float)o->lr, (float)o->weight_decay);
}

/* ---- GEMM ---- */

static int fits_int(int64_t v)
{
	return v >= 0 && v <= 2147483647LL;
}

static size_t elem_size(cudaDataType_t t)
{
	return t == CUDA_R_32F ? 4 : 2;
}

/*
 * Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS
 * gets B as its first operand, A as its second, and m, n swapped; the
 * transpose flags carry over unchanged (a row-major [r,c] buffer is the
 * column-major [c,r] transpose).
 */
void cu_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *A,
	     cudaDataType_t at, int64_t lda, const void *B, cudaDataType_t bt, int64_t ldb,
	     float beta, void *C, cudaDataType_t ct, int64_t ldc)
{
	if (m <= 0 || n <= 0)
		return;
	if (k <= 0) {
		if (beta == 0.0f)
			CUDA_CHECK(cudaMemset2DAsync(C, elem_size(ct) * (size_t)ldc, 0,
						     elem_size(ct) * (size_t)n, (size_t)m, g.stream));
		return;
	}
	if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
	    !fits_int(ldc))
		cu_fatal(__FILE__, __LINE__, "matrix product", "a dimension exceeds INT_MAX");
	CUBLAS_CHECK(cublasGemmEx(g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
				  ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, B,
				  bt, (int)ldb, A, at, (int)lda, &beta, C, ct, (int)ldc,
				  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void cu_gemm_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
		     const void *A, cudaDataType_t at, int64_t lda, int64_t sa, const void *B,
		     cudaDataType_t bt, int64_t ldb, int64_t sb, float beta, void *C,
		     cudaDataType_t ct, int64_t ldc, int64_t sc, int64_t batch)
{
	if (m <= 0 || n <= 0 || batch <= 0)
		return;
	if (k <= 0) {
		for (int64_t i = 0; beta == 0.0f && i < batch; i++)
			CUDA_CHECK(cudaMemset2DAsync((char *)C + elem_size(ct) * (size_t)(i * sc),
						     elem_size(ct) * (size_t)ldc, 0,
						     elem_size(ct) * (size_t)n, (size_t)m, g.stream));
		return;
	}
	if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
	    !fits_int(ldc) || !fits_int(batch))
		cu_fatal(__FILE__, __LINE__, "batched matrix product",
			 "a dimension exceeds INT_MAX");
	CUBLAS_CHECK(cublasGemmStridedBatchedEx(
		g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
		(int)m, (int)k, &alpha, B, bt, (int)ldb, (long long)sb, A, at, (int)lda,
		(long long)sa, &beta, C, ct, (int)ldc, (long long)sc, (int)batch,
		CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
