/*
 * coll_dev_none.c — stands in for coll_nccl.c in builds without the CUDA
 * backend or NCCL: --collectives --backend cuda is refused before any
 * measuring (coll_dev_open), and nothing else is ever called.
 */
#include "coll_dev.h"

const int coll_dev_built = 0;

coll_dev_t *coll_dev_open(int local_rank, int n_local, size_t bytes, sp_err_t *err)
{
	(void)local_rank;
	(void)n_local;
	(void)bytes;
	sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
		   "this spindle-profile was built without the CUDA backend and NCCL: "
		   "--collectives --backend cuda needs both");
	sp_err_hint(err, "measure MPI with --backend cpu, or build with -Dcuda=enabled "
			 "-Dnccl=enabled");
	return NULL;
}

void *coll_dev_comm(coll_dev_t *d, MPI_Comm comm, sp_err_t *err)
{
	(void)d;
	(void)comm;
	(void)err;
	return NULL;
}

void coll_dev_call(coll_dev_t *d, void *comm, sp_coll_op_t op, int count, int block, int rank)
{
	(void)d;
	(void)comm;
	(void)op;
	(void)count;
	(void)block;
	(void)rank;
}

void coll_dev_wait(coll_dev_t *d)
{
	(void)d;
}

void coll_dev_comm_free(void *comm)
{
	(void)comm;
}

void coll_dev_close(coll_dev_t *d)
{
	(void)d;
}
