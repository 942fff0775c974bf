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

static int cpu_init(rt_backend_t *b, int rank, sp_err_t *err)
{
	(void)b;
	(void)rank;
	(void)err;
	return 0;
}

static void cpu_shutdown(rt_backend_t *b)
{
	(void)b;
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

void backend_cpu(rt_backend_t *b)
{
	if (openblas_set_num_threads)
		openblas_set_num_threads(1);
#if defined(__SSE__)
	/* denormal results flush to zero (as GPUs and ML frameworks do): tiny
	 * gradients late in training would otherwise slow the math many times */
	_MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
#endif
	rt_comm_t keep = b->comm;
	memset(b, 0, sizeof *b);
	b->comm = keep;
	b->name = "cpu";
	b->init = cpu_init;
	b->shutdown = cpu_shutdown;
	b->alloc = cpu_alloc;
	b->release = cpu_release;
	b->to_device = cpu_copy;
	b->to_host = cpu_copy;
	b->zero = cpu_zero;
	b->copy_rows = cpu_copy_rows;
	b->embedding_fwd = embedding_fwd;
	b->embedding_bwd = embedding_bwd;
	b->patch_fwd = patch_fwd;
	b->patch_bwd = patch_bwd;
	b->tblock_fwd = tblock_fwd;
	b->tblock_bwd = tblock_bwd;
	b->linear_fwd = linear_fwd;
	b->linear_bwd = linear_bwd;
	b->lm_head_loss = lm_head_loss;
	b->classifier_loss = classifier_loss;
	b->contrastive_loss = contrastive_loss;
	b->adamw_step = adamw_step;
	b->sgd_step = sgd_step;
	b->layer_init = layer_init;
	b->sync = cpu_sync;
}
