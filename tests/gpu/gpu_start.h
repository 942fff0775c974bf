/*
 * gpu_start.h — how a GPU test or benchmark starts: skip (77) without a
 * usable device, else the cuda backend on one local rank. Shared by the
 * programs in tests/gpu only; it decides nothing about what they check.
 */
#ifndef SPINDLE_GPU_START_H
#define SPINDLE_GPU_START_H

#include "cuda/cuda_backend.h"
#include "runtime.h"

#include <stdio.h>

/* 77 (skip) without a device, 1 when the backend fails to start (the error
 * printed), 0 with the cuda backend up on *comm (a local rank). */
static inline int gpu_start(const char *prog, rt_comm_t *comm)
{
	if (cu_device_count() <= 0) {
		printf("%s: no usable CUDA device, skipping\n", prog);
		return 77;
	}
	sp_err_t err = {0};
	comm_local_init(comm);
	if (backend_start(&backend_cuda, comm, &err)) {
		sp_err_print(stderr, &err);
		return 1;
	}
	return 0;
}

/* Ends what gpu_start started. */
static inline void gpu_stop(rt_comm_t *comm)
{
	backend_cuda.shutdown();
	comm->ops->finalize(comm);
}

#endif
