/*
 * coll_dev.h — the device side of spindle-profile --collectives --backend
 * cuda: coll_mpi.c's calls on GPU buffers over NCCL (coll_nccl.c), or a
 * refusal in builds without the CUDA backend or NCCL (coll_dev_none.c).
 * MPI stays the launcher, the clock's barrier and the host channel that
 * spreads each communicator's NCCL id. Every entry is called by every
 * member of the group it names, in the same order.
 */
#ifndef SPINDLE_PROFILE_COLL_DEV_H
#define SPINDLE_PROFILE_COLL_DEV_H

#include "model.h"

#include <mpi.h>

typedef struct coll_dev coll_dev_t;

/* 1 when this build measures on GPUs (coll_nccl.c), else 0. */
extern const int coll_dev_built;

/* The rank's GPU (its local rank: one GPU per rank of a node, n_local
 * ranks on it) with two buffers of bytes each, zeroed; NULL with err set
 * (too few GPUs for the node's ranks, no GPU, out of memory). */
coll_dev_t *coll_dev_open(int local_rank, int n_local, size_t bytes, sp_err_t *err);
/* An NCCL communicator over the MPI group comm (its rank 0 makes the id,
 * MPI_Bcast spreads it); NULL with err set. */
void *coll_dev_comm(coll_dev_t *d, MPI_Comm comm, sp_err_t *err);
/* One call of op as coll_mpi.c's call() (count floats in all, block per
 * rank; p2p: a round trip between ranks 0 and 1), enqueued on the
 * device's stream. An NCCL error ends the launch (MPI_Abort) with a
 * message naming the rank and the call, as an MPI error does. */
void coll_dev_call(coll_dev_t *d, void *comm, sp_coll_op_t op, int count, int block, int rank);
/* Waits until every call enqueued has finished (the stream drained). */
void coll_dev_wait(coll_dev_t *d);
void coll_dev_comm_free(void *comm);
void coll_dev_close(coll_dev_t *d);

#endif
