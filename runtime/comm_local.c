/*
 * comm_local.c — communication for a single rank without MPI: there is no
 * peer, every group is {0}, all-reduce, reduce-scatter and the gathers
 * are identities (a group of one owns the whole buffer; an all-gather with
 * parts checks that it has one part, of a valid size). A plan
 * for more than one device never reaches this (main.c refuses it).
 */
#include "runtime.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int l_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	(void)c;
	*out = (n == 1 && ranks[0] == 0) ? 0 : -1;
	return 0;
}

static int l_p2p(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		 rt_req_t *req)
{
	(void)c;
	(void)buf;
	(void)bytes;
	(void)peer;
	(void)tag;
	(void)req;
	return -1; /* a single rank has no peers */
}

static int l_recv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	return l_p2p(c, buf, bytes, peer, tag, req);
}

static int l_allreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)buf;
	(void)n;
	(void)group;
	req->kind = 0;
	return 0;
}

static int l_allgatherv(rt_comm_t *c, float *buf, int k, const int64_t *cnt,
			const int64_t *off, int group, rt_req_t *req)
{
	(void)c;
	(void)buf;
	*req = (rt_req_t){0, NULL, -1, group};
	return group == 0 && k == 1 && cnt[0] >= 0 && off[0] >= 0 ? 0 : -1;
}

static int l_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	(void)c;
	req->kind = 0;
	*done = 1;
	return 0;
}

static int l_allsum(rt_comm_t *c, double *buf, int n)
{
	(void)c;
	(void)buf;
	(void)n;
	return 0;
}

static int l_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	(void)c;
	*out = malloc(bytes ? bytes : 1);
	*sizes = malloc(sizeof(size_t));
	if (!*out || !*sizes) {
		free(*out);
		free(*sizes);
		*out = NULL;
		*sizes = NULL;
		return -1;
	}
	if (bytes)
		memcpy(*out, buf, bytes);
	(*sizes)[0] = bytes;
	return 0;
}

static int l_barrier(rt_comm_t *c)
{
	(void)c;
	return 0;
}

static void l_abort(rt_comm_t *c, int code)
{
	(void)c;
	exit(code);
}

static void l_finalize(rt_comm_t *c)
{
	(void)c;
}

static const rt_comm_ops_t local_ops = {
	.group_create = l_group, .isend = l_p2p, .irecv = l_recv,
	.iallreduce = l_allreduce, .ireduce_scatter = l_allreduce, .iallgather = l_allreduce,
	.iallgatherv = l_allgatherv,
	.test = l_test, .allsum = l_allsum, .gather = l_gather,
	.barrier = l_barrier, .abort = l_abort, .finalize = l_finalize,
};

int comm_local_init(rt_comm_t *c)
{
	*c = (rt_comm_t){.ops = &local_ops, .name = "local", .rank = 0, .nranks = 1,
			 .tag_ub = INT32_MAX};
	return 0;
}

int comm_under_launcher(void)
{
	return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int comm_member(const rt_comm_t *c, const int *ranks, int n)
{
	int member = 0;
	for (int i = 0; i < n; i++)
		member |= ranks[i] == c->rank;
	return member;
}
