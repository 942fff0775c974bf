/*
 * comm_mpi.c — communication over Open MPI: non-blocking point-to-point
 * (polled by the interpreter with a timeout), one sub-communicator per
 * sync group (created collectively at start-up), in-place non-blocking
 * all-reduce, and for zero-1 buckets a non-blocking reduce-scatter and
 * all-gather with uneven shards (comm_shard), and an all-gather with the
 * caller's parts (zero-3 layers). Errors return instead of
 * aborting so the caller can name the rank and instruction; the caller
 * then aborts (m_abort). The blocking
 * calls (allsum, gather, barrier) have no timeout of their own: main.c
 * runs them under its watchdog.
 */
#include "runtime.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
	MPI_Comm *groups;
	int n_groups, cap;
} mpi_impl_t;

static int m_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	mpi_impl_t *im = c->impl;
	int member = comm_member(c, ranks, n);
	MPI_Comm nc = MPI_COMM_NULL;
	if (MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, c->rank, &nc) !=
	    MPI_SUCCESS)
		return -1;
	/* a member keeps the communicator; the group's id is its place in the list */
	if (member && SP_PUSH(im->groups, im->n_groups, im->cap, nc))
		return -1;
	*out = member ? im->n_groups - 1 : -1;
	return 0;
}

/* One point-to-point request: kind 1 send, 2 receive. */
static int m_p2p(int kind, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	MPI_Request *r = malloc(sizeof *r);
	if (!r || bytes > (size_t)2147483647)
		return free(r), -1;
	int rc = kind == 1 ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r)
			   : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r);
	if (rc != MPI_SUCCESS) {
		free(r);
		return -1;
	}
	*req = (rt_req_t){kind, r, peer, tag};
	return 0;
}

static int m_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	(void)c;
	return m_p2p(1, (void *)buf, bytes, peer, tag, req);
}

static int m_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	(void)c;
	return m_p2p(2, buf, bytes, peer, tag, req);
}

static int m_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	mpi_impl_t *im = c->impl;
	if (group < 0 || group >= im->n_groups || n > 2147483647)
		return -1;
	MPI_Request *r = malloc(sizeof *r);
	if (!r)
		return -1;
	if (MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, im->groups[group], r) !=
	    MPI_SUCCESS) {
		free(r);
		return -1;
	}
	*req = (rt_req_t){3, r, -1, group};
	return 0;
}

/*
 * A zero-1 collective in flight (req kind 4: reduce-scatter, 5: all-gather).
 * The request comes first (m_test hands the struct to MPI_Test); the count
 * and displacement arrays stay alive until completion, as MPI requires of
 * non-blocking collectives. MPI_Ireduce_scatter with MPI_IN_PLACE leaves a
 * member's result at the start of buf: m_test moves it to the shard's
 * place (shard_n floats to shard), the contract of rt_comm_ops_t.
 */
typedef struct {
	MPI_Request r;
	float *buf, *shard;
	int64_t shard_n;
	int cnt[];	/* counts [0, k), displacements [k, 2k) */
} mcoll_t;

static int m_coll(rt_comm_t *c, int kind, float *buf, int64_t n, int group, rt_req_t *req)
{
	mpi_impl_t *im = c->impl;
	int k = 0, me = 0;
	if (group < 0 || group >= im->n_groups || n > 2147483647 ||
	    MPI_Comm_size(im->groups[group], &k) != MPI_SUCCESS ||
	    MPI_Comm_rank(im->groups[group], &me) != MPI_SUCCESS)
		return -1;
	mcoll_t *m = malloc(sizeof *m + sizeof(int) * 2 * (size_t)k);
	if (!m)
		return -1;
	for (int i = 0; i < k; i++) {
		int64_t off, cnt;
		comm_shard(n, i, k, &off, &cnt);
		m->cnt[i] = (int)cnt;
		m->cnt[k + i] = (int)off;
	}
	m->buf = buf;
	m->shard = buf + m->cnt[k + me];
	m->shard_n = m->cnt[me];
	int rc = kind == 4 ? MPI_Ireduce_scatter(MPI_IN_PLACE, buf, m->cnt, MPI_FLOAT, MPI_SUM,
						 im->groups[group], &m->r)
			   : MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, m->cnt,
					     m->cnt + k, MPI_FLOAT, im->groups[group], &m->r);
	if (rc != MPI_SUCCESS) {
		free(m);
		return -1;
	}
	*req = (rt_req_t){kind, m, -1, group};
	return 0;
}

static int m_ireduce_scatter(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return m_coll(c, 4, buf, n, group, req);
}

static int m_iallgather(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return m_coll(c, 5, buf, n, group, req);
}

static int m_iallgatherv(rt_comm_t *c, float *buf, int k, const int64_t *cnt,
			 const int64_t *off, int group, rt_req_t *req)
{
	mpi_impl_t *im = c->impl;
	int size = 0;
	if (group < 0 || group >= im->n_groups ||
	    MPI_Comm_size(im->groups[group], &size) != MPI_SUCCESS || size != k)
		return -1;
	for (int i = 0; i < k; i++)
		if (cnt[i] < 0 || off[i] < 0 || cnt[i] > 2147483647 || off[i] > 2147483647)
			return -1;
	mcoll_t *m = malloc(sizeof *m + sizeof(int) * 2 * (size_t)k);
	if (!m)
		return -1;
	for (int i = 0; i < k; i++) {
		m->cnt[i] = (int)cnt[i];
		m->cnt[k + i] = (int)off[i];
	}
	m->buf = m->shard = buf;
	m->shard_n = 0;
	if (MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, m->cnt, m->cnt + k, MPI_FLOAT,
			    im->groups[group], &m->r) != MPI_SUCCESS) {
		free(m);
		return -1;
	}
	*req = (rt_req_t){5, m, -1, group};
	return 0;
}

static int m_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	(void)c;
	*done = 1;
	if (!req->kind)
		return 0;
	int flag = 0;
	if (MPI_Test(req->impl, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
		return -1;
	*done = flag;
	if (flag) {
		if (req->kind == 4) {
			mcoll_t *m = req->impl;
			memmove(m->shard, m->buf, sizeof(float) * (size_t)m->shard_n);
		}
		free(req->impl);
		req->kind = 0;
		req->impl = NULL;
	}
	return 0;
}

static int m_allsum(rt_comm_t *c, double *buf, int n)
{
	(void)c;
	return MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) ==
			       MPI_SUCCESS
		       ? 0
		       : -1;
}

static int m_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	int n = c->nranks, rc = -1;
	long long mine = (long long)bytes;
	long long *all = malloc(sizeof(long long) * (size_t)n);
	int *cnt = malloc(sizeof(int) * (size_t)n), *disp = malloc(sizeof(int) * (size_t)n);
	*out = NULL;
	*sizes = NULL;
	if (!all || !cnt || !disp)
		goto cleanup;
	if (MPI_Gather(&mine, 1, MPI_LONG_LONG, all, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD) !=
	    MPI_SUCCESS)
		goto cleanup;
	long long total = 0;
	if (c->rank == 0) {
		for (int i = 0; i < n; i++) {
			if (all[i] > 2147483647LL || total + all[i] > 2147483647LL)
				goto cleanup;
			cnt[i] = (int)all[i];
			disp[i] = (int)total;
			total += all[i];
		}
		*out = malloc((size_t)total + 1);
		*sizes = malloc(sizeof(size_t) * (size_t)n);
		if (!*out || !*sizes)
			goto cleanup;
		for (int i = 0; i < n; i++)
			(*sizes)[i] = (size_t)all[i];
	}
	if (MPI_Gatherv(buf, (int)bytes, MPI_BYTE, *out, cnt, disp, MPI_BYTE, 0,
			MPI_COMM_WORLD) != MPI_SUCCESS)
		goto cleanup;
	rc = 0;
cleanup:
	if (rc) {
		free(*out);
		free(*sizes);
		*out = NULL;
		*sizes = NULL;
	}
	free(all);
	free(cnt);
	free(disp);
	return rc;
}

static int m_barrier(rt_comm_t *c)
{
	(void)c;
	return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
}

/*
 * Ends this rank at once with a non-zero status, which makes mpirun tear
 * the whole job down (its default, orte_abort_on_non_zero_status). Not
 * MPI_Abort: when several ranks time out together and each calls it, Open
 * MPI 4.1.4's mpirun can crash (a segfault in its show_help relay) instead
 * of reporting; and a rank whose launcher keeps the job running still has
 * its peers' own timeouts bounding their wait.
 */
static void m_abort(rt_comm_t *c, int code)
{
	(void)c;
	fflush(stdout);
	fflush(stderr);
	_exit(code ? code : 1);
}

static void m_finalize(rt_comm_t *c)
{
	mpi_impl_t *im = c->impl;
	if (im) {
		for (int i = 0; i < im->n_groups; i++)
			MPI_Comm_free(&im->groups[i]);
		free(im->groups);
		free(im);
	}
	c->impl = NULL;
	MPI_Finalize();
}

int comm_mpi_available(void)
{
	return 1;
}

static const rt_comm_ops_t mpi_ops = {
	.group_create = m_group, .isend = m_isend, .irecv = m_irecv,
	.iallreduce = m_iallreduce, .ireduce_scatter = m_ireduce_scatter,
	.iallgather = m_iallgather, .iallgatherv = m_iallgatherv, .test = m_test, .allsum = m_allsum, .gather = m_gather,
	.barrier = m_barrier, .abort = m_abort, .finalize = m_finalize,
};

int comm_mpi_init(rt_comm_t *c, int *argc, char ***argv, sp_err_t *err)
{
	*c = (rt_comm_t){.ops = &mpi_ops, .name = "mpi"};
	if (MPI_Init(argc, argv) != MPI_SUCCESS)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "MPI_Init failed");
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	c->impl = calloc(1, sizeof(mpi_impl_t));
	if (!c->impl)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &c->nranks);
	int *ub = NULL, flag = 0;
	MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
	c->tag_ub = flag && ub ? *ub : 32767; /* the standard's guaranteed minimum */
	return 0;
}
