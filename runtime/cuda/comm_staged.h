/*
 * cuda/comm_staged.h — a comm that moves device buffers over a host comm
 * (MPI) by staging them through host memory: device -> host staging buffer
 * -> MPI -> host staging buffer -> device. The CUDA backend wraps the rank's
 * comm with it for --comm mpi, so several ranks can share one GPU (NCCL
 * refuses that). Plain C: the copies and the staging allocator are given
 * as functions, so the logic runs (and is unit-tested) without a GPU.
 * It does not pick devices and is not CUDA-aware MPI: every transfer is
 * copied twice and the copies are synchronous.
 */
#ifndef SPINDLE_COMM_STAGED_H
#define SPINDLE_COMM_STAGED_H

#include "runtime.h"

#include <stddef.h>

/* How the staged comm reaches device memory. to_host and to_device are
 * synchronous (backend_ops.h's rt_copy_fn_t); host_alloc returns host
 * memory the copies are fast from (CUDA: pinned), NULL on failure. */
typedef struct comm_staging {
	rt_copy_fn_t *to_host, *to_device;
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *p);
} comm_staging_t;

/*
 * Wraps c (already initialised: MPI or the one local rank) in place:
 * isend, irecv and the collectives (iallreduce, ireduce_scatter,
 * iallgather) take device buffers and stage them through
 * host buffers that s allocates (kept in a free list and reused, released
 * by finalize); group_create, test, allsum, gather, barrier and abort keep
 * the wrapped comm's meaning; finalize releases the staging, then
 * finalizes the wrapped comm. s must outlive c. Makes no copy yet.
 */
int comm_staged_wrap(rt_comm_t *c, const comm_staging_t *s, sp_err_t *err);

#endif
