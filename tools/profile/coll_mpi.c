/*
 * coll_mpi.c — spindle-profile --collectives over MPI: times MPI_Allreduce,
 * MPI_Allgather, MPI_Reduce_scatter_block (float32 sums) and a ping-pong
 * between two ranks, by size and group shape, on the ranks mpirun started.
 *
 * Shapes: the ranks of a node are found with MPI_COMM_TYPE_SHARED; nodes
 * are numbered by their lowest world rank. A group of k ranks per node on
 * m nodes is the first k local ranks of each of the first m nodes, for
 * every m and k that the launch (the fewest ranks on any of those nodes)
 * and the cluster file allow, k m >= 2. P2P: local ranks 0 and 1 of the
 * first node (nodes 1) and local rank 0 of the first two nodes (nodes 2).
 *
 * Timing (as spindle-profile's layers and nccl-tests): zeroed buffers (sums
 * stay finite), --warmup discarded calls, one timed call to calibrate k,
 * the number of calls per run so that a run lasts at least MIN_RUN_MS;
 * then --reps runs per size, interleaved across sizes (measure_op), each
 * after a barrier: a run's time per call is the slowest member's (an
 * MPI_MAX all-reduce), the point the fastest run (k from the fastest of 3
 * single calls). The minimum, not the layer profiler's median: a
 * collective waits for its slowest rank, so a rank descheduled by other
 * load delays every member, and on a shared host most runs are delayed;
 * interference only adds time, so the fastest run is the best estimate of
 * what the machine itself does (the Python timeit documentation gives
 * this reason for its min: "higher values ... are typically not caused by
 * variability in Python's speed, but by other processes interfering with
 * your timing accuracy"). P2P: k round trips per run, half a round trip
 * reported. Every rank follows the same sequence, so the calls match.
 *
 * With --backend cuda (o->cuda) the same calls run over NCCL on GPU
 * buffers (coll_dev.h: coll_nccl.c), each group's NCCL communicator made
 * from its MPI group, and a run's clock stops once the rank's stream has
 * drained; MPI still makes the groups, the barriers and the slowest-member
 * reduction.
 *
 * It does not return on an MPI or NCCL error mid-measuring
 * (MPI_ERRORS_ARE_FATAL ends the launch with MPI's own message, coll_dev.h
 * with NCCL's); a failed allocation, GPU set-up or communicator on any rank
 * is agreed on first and returned.
 */
#include "coll.h"
#include "coll_dev.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* as profile.c's layer runs: a run of at least 1 ms lies well above
 * clock_gettime's resolution and MPI_Wtime's (tens of ns here), so the
 * smallest collectives (a few us) are timed over hundreds of calls */
#define MIN_RUN_MS 1.0
#define MAX_CALLS 1000

typedef struct {
	const coll_opts_t *o;
	MPI_Comm comm; /* the group's, MPI_COMM_NULL when not a member */
	int n, rank;
	float *a, *b;  /* two buffers of the largest size */
	int *order;    /* n_sizes: a round's order */
	sp_coll_point_t *pts;
	int n_pts, cap;
	int root;      /* world rank 0 keeps the points */
	int oom;       /* the root could not keep one: reported at the end */
	coll_dev_t *dev; /* o->cuda: the rank's GPU */
	void *dcomm;     /* and the group's NCCL communicator */
	int failed;      /* a group's communicator could not be made here */
	sp_err_t *err;
} run_t;

/* One call of op on S bytes (count floats in all, block per rank). */
static void call(run_t *r, sp_coll_op_t op, int count, int block)
{
	if (r->dev) {
		coll_dev_call(r->dev, r->dcomm, op, count, block, r->rank);
		return;
	}
	switch (op) {
	case COLL_ALL_REDUCE:
		MPI_Allreduce(MPI_IN_PLACE, r->a, count, MPI_FLOAT, MPI_SUM, r->comm);
		break;
	case COLL_ALL_GATHER:
		MPI_Allgather(r->a, block, MPI_FLOAT, r->b, block, MPI_FLOAT, r->comm);
		break;
	case COLL_REDUCE_SCATTER:
		MPI_Reduce_scatter_block(r->a, r->b, block, MPI_FLOAT, MPI_SUM, r->comm);
		break;
	case COLL_P2P: /* a round trip between the pair's ranks 0 and 1 */
		if (r->rank == 0) {
			MPI_Send(r->a, count, MPI_FLOAT, 1, 0, r->comm);
			MPI_Recv(r->b, count, MPI_FLOAT, 1, 0, r->comm, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(r->b, count, MPI_FLOAT, 0, 0, r->comm, MPI_STATUS_IGNORE);
			MPI_Send(r->a, count, MPI_FLOAT, 0, 0, r->comm);
		}
		break;
	case COLL__COUNT: break;
	}
}

/* The slowest member's time per call of k calls, ms. */
static double run_calls(run_t *r, sp_coll_op_t op, int count, int block, int k)
{
	MPI_Barrier(r->comm);
	double t0 = MPI_Wtime();
	for (int i = 0; i < k; i++)
		call(r, op, count, block);
	if (r->dev)
		coll_dev_wait(r->dev);
	double t = (MPI_Wtime() - t0) * 1e3 / k, slowest;
	MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, r->comm);
	return slowest;
}

/* Count (floats in all) and block (per rank) of size s of op. */
static void sizes_of(const run_t *r, sp_coll_op_t op, int s, int *count, int *block)
{
	int parts = op == COLL_P2P ? 1 : r->n;
	*count = (int)(r->o->sizes[s] / 4);
	*block = SP_MAX(*count / parts, 1);
	if (op == COLL_ALL_GATHER || op == COLL_REDUCE_SCATTER)
		*count = *block * parts;
}

/*
 * Every size of op on the group (members only); the root keeps them (on
 * failure it goes on measuring, so the other ranks' calls still match).
 * As the layer profiler does, the runs are interleaved: round i runs every
 * size once, in an order shuffled by (op, i) alike on every rank, so a
 * burst of other load slows one run of several sizes rather than all runs
 * of one size. t: room for n_sizes (reps + 1).
 */
static void measure_op(run_t *r, sp_coll_op_t op, int nodes, double *t)
{
	const coll_opts_t *o = r->o;
	int ns = o->n_sizes, count, block, *order = r->order;
	double *k = t + (size_t)ns * (size_t)o->reps;
	for (int s = 0; s < ns; s++) {
		sizes_of(r, op, s, &count, &block);
		for (int w = 0; w < o->warmup; w++)
			call(r, op, count, block);
		double t1 = HUGE_VAL;
		for (int i = 0; i < 3; i++)
			t1 = fmin(t1, run_calls(r, op, count, block, 1));
		k[s] = t1 >= MIN_RUN_MS ? 1 : SP_MIN(ceil(MIN_RUN_MS / fmax(t1, 1e-6)), MAX_CALLS);
	}
	for (int i = 0; i < o->reps; i++) {
		for (int j = 0; j < ns; j++)
			order[j] = j;
		for (int j = ns - 1; j > 0; j--) {
			int x = (int)(sp_mix64(((uint64_t)op << 40) ^ ((uint64_t)i << 20) ^
					       (uint64_t)j) % (uint64_t)(j + 1));
			int tmp = order[j];
			order[j] = order[x];
			order[x] = tmp;
		}
		for (int j = 0; j < ns; j++) {
			sizes_of(r, op, order[j], &count, &block);
			t[order[j] * o->reps + i] = run_calls(r, op, count, block, (int)k[order[j]]);
		}
	}
	for (int s = 0; s < ns; s++) {
		double *ts = t + (size_t)s * (size_t)o->reps;
		sizes_of(r, op, s, &count, &block);
		for (int i = 1; i < o->reps; i++)
			ts[0] = fmin(ts[0], ts[i]);
		double ms = ts[0];
		if (op == COLL_P2P)
			ms /= 2; /* one way */
		sp_coll_point_t p = {op, r->n, nodes, 4.0 * count, ms};
		if (r->root && SP_PUSH(r->pts, r->n_pts, r->cap, p))
			r->oom = 1;
	}
}

/* The group of world ranks with member set, its ops measured. Collective
 * over the world. */
static void measure_group(run_t *r, int member, int nodes, const sp_coll_op_t *ops, int n_ops,
			  double *t)
{
	int wr;
	MPI_Comm_rank(MPI_COMM_WORLD, &wr);
	MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, wr, &r->comm);
	if (!member)
		return;
	MPI_Comm_size(r->comm, &r->n);
	MPI_Comm_rank(r->comm, &r->rank);
	if (r->dev && !(r->dcomm = coll_dev_comm(r->dev, r->comm, r->err)))
		r->failed = 1; /* every member: coll_dev_comm agrees */
	for (int i = 0; i < n_ops && !r->failed; i++)
		measure_op(r, ops[i], nodes, t);
	coll_dev_comm_free(r->dcomm);
	r->dcomm = NULL;
	MPI_Comm_free(&r->comm);
}

/* 1 when a group's communicator failed on any rank (collective over the
 * world: the next group must not be made without those ranks). */
static int any_failed(const run_t *r)
{
	int f = r->failed, any = 0;
	if (!r->dev)
		return 0;
	MPI_Allreduce(&f, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	return any;
}

static int cmp_point(const void *x, const void *y)
{
	return coll_point_cmp(x, y);
}

/* Node index and local rank of every world rank. */
static void find_nodes(int world, int *node, int *local)
{
	MPI_Comm nc;
	int wr, lr, leader;
	MPI_Comm_rank(MPI_COMM_WORLD, &wr);
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, wr, MPI_INFO_NULL, &nc);
	MPI_Comm_rank(nc, &lr);
	leader = wr;
	MPI_Bcast(&leader, 1, MPI_INT, 0, nc);
	MPI_Comm_free(&nc);
	MPI_Allgather(&leader, 1, MPI_INT, node, 1, MPI_INT, MPI_COMM_WORLD);
	MPI_Allgather(&lr, 1, MPI_INT, local, 1, MPI_INT, MPI_COMM_WORLD);
	/* a leader is the lowest world rank of its node (key wr), so its own
	 * leader: a node's index is the number of leaders below it. Going down,
	 * node[p] for p < node[i] <= i is still the leader's rank. */
	for (int i = world - 1; i >= 0; i--) {
		int idx = 0;
		for (int p = 0; p < node[i]; p++)
			idx += node[p] == p;
		node[i] = idx;
	}
}

/* t: room for measure_op's times. */
static int measure_all(run_t *r, int world, int wr, const int *node, const int *local, double *t)
{
	static const sp_coll_op_t colls[] = {COLL_ALL_REDUCE, COLL_ALL_GATHER, COLL_REDUCE_SCATTER};
	const sp_coll_op_t p2p = COLL_P2P;
	const coll_opts_t *o = r->o;
	int M = 0;
	for (int i = 0; i < world; i++)
		M = SP_MAX(M, node[i] + 1);
	for (int m = 1; m <= SP_MIN(M, o->max_nodes); m++) {
		/* the fewest ranks on any of the first m nodes */
		int kmax = o->max_per_node;
		for (int j = 0; j < m; j++) {
			int cnt = 0;
			for (int i = 0; i < world; i++)
				cnt += node[i] == j;
			kmax = SP_MIN(kmax, cnt);
		}
		for (int k = 1; k <= kmax; k++)
			if (k * m >= 2) {
				measure_group(r, node[wr] < m && local[wr] < k, m, colls, 3, t);
				if (any_failed(r))
					return SP_EIO;
			}
	}
	/* p2p inside the first node, then across the first two */
	for (int m = 1; m <= SP_MIN(2, SP_MIN(M, o->max_nodes)); m++) {
		int member = m == 1 ? node[wr] == 0 && local[wr] < 2 : node[wr] < 2 && local[wr] == 0;
		int size = 0, flag = member;
		MPI_Allreduce(&flag, &size, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (size == 2) {
			measure_group(r, member, m, &p2p, 1, t);
			if (any_failed(r))
				return SP_EIO;
		}
	}
	return r->oom ? SP_ENOMEM : 0;
}

/* o->cuda: rank wr's GPU (its local rank on its node), agreed over the
 * world: 0, or the first failure (its message here when it is this
 * rank's, else a line naming the rank). */
static int open_dev(run_t *r, int world, int wr, const int *node, const int *local, size_t big,
		    sp_err_t *err)
{
	int n_local = 0;
	for (int i = 0; i < world; i++)
		n_local += node[i] == node[wr];
	sp_err_t mine = {0};
	r->dev = coll_dev_open(local[wr], n_local, big, &mine);
	int bad = r->dev ? world : wr, first = 0;
	MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (first == world)
		return 0;
	if (!r->dev) {
		*err = mine;
		return err->code;
	}
	return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			  "--backend cuda: the GPU set-up failed on rank %d", first);
}

int coll_measure(sp_coll_point_t **out, int *n_out, int *out_root, const coll_opts_t *o,
		 int *argc, char ***argv, sp_err_t *err)
{
	*out = NULL;
	*n_out = 0;
	*out_root = 1;
	if (MPI_Init(argc, argv) != MPI_SUCCESS)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "MPI_Init failed");
	int world, wr, rc = 0;
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	MPI_Comm_rank(MPI_COMM_WORLD, &wr);
	run_t r = {.o = o, .root = wr == 0, .err = err};
	*out_root = r.root;
	int *node = calloc((size_t)world, sizeof *node), *local = calloc((size_t)world, sizeof *local);
	size_t big = (size_t)o->sizes[o->n_sizes - 1] + 4;
	r.a = calloc(big / 4, sizeof(float));
	r.b = calloc(big / 4, sizeof(float));
	double *t = calloc((size_t)o->n_sizes * ((size_t)o->reps + 1), sizeof *t);
	r.order = calloc((size_t)o->n_sizes, sizeof *r.order);
	int ok = node && local && r.a && r.b && t && r.order, all_ok = 0;
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (!all_ok) {
		rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
				"out of memory for buffers of %lld bytes on some rank",
				(long long)o->sizes[o->n_sizes - 1]);
	} else if (world < 2) {
		rc = sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				"--collectives needs two or more ranks, started with 1");
		sp_err_hint(err, "run it under mpirun, e.g. mpirun -np 4 spindle-profile "
				 "--collectives -o OUT.json");
	} else {
		find_nodes(world, node, local);
		rc = o->cuda ? open_dev(&r, world, wr, node, local, big, err) : 0;
		if (!rc && (rc = measure_all(&r, world, wr, node, local, t)) == SP_EIO) {
			if (!err->code) /* the failing rank has its own message */
				sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
					   "an NCCL communicator failed on another rank");
		} else if (rc && !err->code) {
			sp_err_set(err, rc, NULL, 0, 0, NULL, "out of memory keeping the points");
		}
	}
	coll_dev_close(r.dev);
	free(t);
	free(r.order);
	free(node);
	free(local);
	free(r.a);
	free(r.b);
	MPI_Finalize();
	if (!rc && r.root) {
		/* sorted, one point per (op, ranks, nodes, bytes) */
		qsort(r.pts, (size_t)r.n_pts, sizeof *r.pts, cmp_point);
		int k = 0;
		for (int i = 0; i < r.n_pts; i++)
			if (k == 0 || cmp_point(&r.pts[k - 1], &r.pts[i]))
				r.pts[k++] = r.pts[i];
		*out = r.pts;
		*n_out = k;
		return 0;
	}
	free(r.pts);
	return rc;
}
