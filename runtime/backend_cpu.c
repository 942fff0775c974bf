/*
 * backend_cpu.c — the reference backend: host memory, fp32 math from
 * layers.c (CBLAS for matrix products). Communication is whichever comm
 * the caller installs (MPI or a single local rank).
 */
#include "layers.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* OpenBLAS's own threads would fight the other ranks for the cores: one
 * rank stands for one device and computes on one thread. (A weak reference:
 * other CBLAS libraries simply lack the call.) */
void openblas_set_num_threads(int n) __attribute__((weak));

/* Nothing to set up beyond what attach did: the device is this process. */
static int cpu_init(rt_comm_t *c, sp_err_t *err)
{
	(void)c;
	(void)err;
	return 0;
}

static void cpu_shutdown(void)
{
}

static void *cpu_alloc(size_t bytes)
{
	return calloc(1, bytes ? bytes : 1);
}

static void cpu_release(void *p)
{
	free(p);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
}

static void cpu_zero(float *p, int64_t n)
{
	if (n > 0)
		memset(p, 0, sizeof(float) * (size_t)n);
}

static void cpu_copy_rows(float *dst, int64_t dst_stride, const float *src,
			  int64_t src_stride, int64_t rows, int64_t cols, int acc)
{
	for (int64_t r = 0; r < rows; r++) {
		float *d = dst + r * dst_stride;
		const float *s = src + r * src_stride;
		if (acc)
			for (int64_t c = 0; c < cols; c++)
				d[c] += s[c];
		else
			memcpy(d, s, sizeof(float) * (size_t)cols);
	}
}

static void cpu_sync(void)
{
}

/* Any comm serves: the CPU's buffers are host memory. */
static int cpu_attach(rt_comm_t *c, sp_err_t *err)
{
	(void)c;
	(void)err;
	if (openblas_set_num_threads)
		openblas_set_num_threads(1);
#if defined(__SSE__)
	/* denormal results flush to zero (as GPUs and ML frameworks do): tiny
	 * gradients late in training would otherwise slow the math many times */
	_MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
#endif
	return 0;
}

#define CPU_MATH(f) .f = f,
const rt_backend_t backend_cpu = {
	.name = "cpu", .attach = cpu_attach, .init = cpu_init, .shutdown = cpu_shutdown,
	/* host memory: moving in and out is a copy */
	.alloc = cpu_alloc, .release = cpu_release, .to_device = cpu_copy, .to_host = cpu_copy,
	.zero = cpu_zero, .copy_rows = cpu_copy_rows, .sync = cpu_sync,
	RT_BACKEND_MATH(CPU_MATH) .layer_init = layer_init,
	.embedding_fwd_tp = embedding_fwd_tp, .embedding_bwd_tp = embedding_bwd_tp,
	.lm_head_loss_tp = lm_head_loss_tp, .seq_parallel = 1,
};
