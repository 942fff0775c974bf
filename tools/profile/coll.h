/*
 * coll.h — spindle-profile --collectives: the measuring side, one file per
 * transport chosen by the build (coll_mpi.c with MPI, coll_none.c
 * without). It measures and returns points; profile.c writes them.
 */
#ifndef SPINDLE_PROFILE_COLL_H
#define SPINDLE_PROFILE_COLL_H

#include "model.h"

typedef struct {
	const int64_t *sizes; /* bytes, increasing */
	int n_sizes, reps, warmup;
	/* only groups that fit the cluster file being written */
	int max_per_node, max_nodes;
	int cuda; /* 1: NCCL on GPU buffers (coll_dev.h), 0: MPI on host memory */
} coll_opts_t;

/*
 * Starts MPI (argc, argv: main's), measures all-reduce, all-gather,
 * reduce-scatter (float32 sums) on every group shape the launch allows and
 * p2p inside a node and across two (over MPI, or with o->cuda over NCCL
 * on one GPU per rank), then stops MPI. On world rank 0,
 * *out_root = 1 and *out (malloc'd, n_out points) holds them sorted as the
 * cluster loader wants; elsewhere *out_root = 0 and *out = NULL. Returns 0,
 * SP_EINPUT (a launch with one rank, a build without MPI, o->cuda in a
 * build without CUDA and NCCL or with fewer GPUs than ranks) or another
 * negative code, with err set.
 */
int coll_measure(sp_coll_point_t **out, int *n_out, int *out_root, const coll_opts_t *o,
		 int *argc, char ***argv, sp_err_t *err);

#endif
