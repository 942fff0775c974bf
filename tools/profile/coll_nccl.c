/*
 * coll_nccl.c — spindle-profile --collectives --backend cuda: the calls of
 * coll_mpi.c on GPU buffers over NCCL (ncclAllReduce in place,
 * ncclAllGather, ncclReduceScatter, ncclSend/ncclRecv round trips), each
 * group's communicator made from its MPI group (rank 0's ncclUniqueId
 * spread with MPI_Bcast, then ncclCommInitRank). Calls go on one stream
 * per rank; coll_mpi.c times k of them from a barrier to coll_dev_wait
 * (the stream drained), as nccl-tests times its out-of-place runs.
 *
 * One GPU per rank: rank r of a node uses GPU r (NCCL refuses two ranks
 * of one communicator on one GPU), so a node needs as many visible GPUs
 * as ranks; coll_dev_open says so otherwise. It does not pick NICs or set
 * NCCL's environment: what NCCL chooses by itself is what the planner
 * should be priced on.
 *
 * Not run on a device yet (no GPU where it was written): built and
 * linked only; tools/gpu-check runs it where two or more GPUs are visible.
 */
#include "coll_dev.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

const int coll_dev_built = 1;

struct coll_dev {
	int gpu;
	cudaStream_t stream;
	float *a, *b;
};

/* An NCCL or CUDA failure in the middle of the measuring: the other ranks
 * are waiting in a collective, so the launch ends (as MPI's errors do). */
static void die(const char *what, const char *why)
{
	int wr = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &wr);
	fprintf(stderr, "spindle-profile: rank %d: %s failed: %s\n", wr, what, why);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static void nccl_ok(ncclResult_t r, const char *what)
{
	if (r != ncclSuccess)
		die(what, ncclGetErrorString(r));
}

coll_dev_t *coll_dev_open(int local_rank, int n_local, size_t bytes, sp_err_t *err)
{
	int n_gpu = 0;
	cudaError_t e = cudaGetDeviceCount(&n_gpu);
	if (e != cudaSuccess || n_gpu < 1) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "--backend cuda: no GPU visible (%s)",
			   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return NULL;
	}
	if (n_local > n_gpu) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "--backend cuda: %d ranks on a node with %d GPU(s); NCCL needs one GPU "
			   "per rank",
			   n_local, n_gpu);
		sp_err_hint(err, "start at most %d ranks per node (mpirun --map-by ppr:%d:node)",
			    n_gpu, n_gpu);
		return NULL;
	}
	coll_dev_t *d = calloc(1, sizeof *d);
	if (!d) {
		sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		return NULL;
	}
	d->gpu = local_rank;
	size_t n = bytes ? bytes : 4;
	if ((e = cudaSetDevice(d->gpu)) != cudaSuccess ||
	    (e = cudaStreamCreate(&d->stream)) != cudaSuccess ||
	    (e = cudaMalloc((void **)&d->a, n)) != cudaSuccess ||
	    (e = cudaMalloc((void **)&d->b, n)) != cudaSuccess ||
	    (e = cudaMemset(d->a, 0, n)) != cudaSuccess ||
	    (e = cudaMemset(d->b, 0, n)) != cudaSuccess ||
	    (e = cudaDeviceSynchronize()) != cudaSuccess) {
		sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
			   "--backend cuda: GPU %d: two buffers of %zu bytes: %s", d->gpu, n,
			   cudaGetErrorString(e));
		coll_dev_close(d);
		return NULL;
	}
	return d;
}

void *coll_dev_comm(coll_dev_t *d, MPI_Comm comm, sp_err_t *err)
{
	int n, rank;
	ncclUniqueId id;
	ncclComm_t c = NULL;
	MPI_Comm_size(comm, &n);
	MPI_Comm_rank(comm, &rank);
	ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
	int ok = r == ncclSuccess, all = 0;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
	if (!all) {
		sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "ncclGetUniqueId failed%s%s",
			   ok ? "" : ": ", ok ? "" : ncclGetErrorString(r));
		return NULL;
	}
	MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm);
	(void)d;
	r = ncclCommInitRank(&c, n, id, rank);
	ok = r == ncclSuccess;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
	if (!all) {
		sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
			   "ncclCommInitRank over %d ranks failed%s%s", n, ok ? " on another rank" : ": ",
			   ok ? "" : ncclGetErrorString(r));
		if (ok)
			ncclCommDestroy(c);
		return NULL;
	}
	return c;
}

void coll_dev_call(coll_dev_t *d, void *comm, sp_coll_op_t op, int count, int block, int rank)
{
	ncclComm_t c = comm;
	switch (op) {
	case COLL_ALL_REDUCE:
		nccl_ok(ncclAllReduce(d->a, d->a, (size_t)count, ncclFloat, ncclSum, c, d->stream),
			"ncclAllReduce");
		break;
	case COLL_ALL_GATHER:
		nccl_ok(ncclAllGather(d->a, d->b, (size_t)block, ncclFloat, c, d->stream),
			"ncclAllGather");
		break;
	case COLL_REDUCE_SCATTER:
		nccl_ok(ncclReduceScatter(d->a, d->b, (size_t)block, ncclFloat, ncclSum, c,
					  d->stream),
			"ncclReduceScatter");
		break;
	case COLL_P2P: /* a round trip between the pair's ranks 0 and 1 */
		if (rank == 0) {
			nccl_ok(ncclSend(d->a, (size_t)count, ncclFloat, 1, c, d->stream), "ncclSend");
			nccl_ok(ncclRecv(d->b, (size_t)count, ncclFloat, 1, c, d->stream), "ncclRecv");
		} else {
			nccl_ok(ncclRecv(d->b, (size_t)count, ncclFloat, 0, c, d->stream), "ncclRecv");
			nccl_ok(ncclSend(d->a, (size_t)count, ncclFloat, 0, c, d->stream), "ncclSend");
		}
		break;
	case COLL__COUNT: break;
	}
}

void coll_dev_wait(coll_dev_t *d)
{
	cudaError_t e = cudaStreamSynchronize(d->stream);
	if (e != cudaSuccess)
		die("cudaStreamSynchronize", cudaGetErrorString(e));
}

void coll_dev_comm_free(void *comm)
{
	if (comm)
		ncclCommDestroy((ncclComm_t)comm);
}

void coll_dev_close(coll_dev_t *d)
{
	if (!d)
		return;
	cudaFree(d->a);
	cudaFree(d->b);
	if (d->stream)
		cudaStreamDestroy(d->stream);
	free(d);
}
