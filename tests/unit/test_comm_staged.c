/*
 * test_comm_staged.c — the CUDA backend's host-staged comm
 * (runtime/cuda/comm_staged.c) on the CPU: "device" memory is ordinary
 * memory reached only through fake copy functions that count their calls,
 * and the wrapped comm is a fake that completes an operation only after a
 * set number of polls. Checks that device data crosses the wire only via
 * staging buffers, that received and reduced data reaches the device only
 * once the wrapped operation completes, that staging buffers are reused
 * (best fit) and all freed by finalize, and that a failed start leaks
 * nothing. It does not test CUDA's copies or MPI itself.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda/comm_staged.h"

#include <stdlib.h>
#include <string.h>

/* ---- fake device: counted copies, tracked host allocations ---- */

static struct {
	int to_host, to_device, allocs, frees;
	void *host[16]; /* live staging buffers */
	int n_host;
} dev;

static int is_host(const void *p)
{
	for (int i = 0; i < dev.n_host; i++)
		if (dev.host[i] == p)
			return 1;
	return 0;
}

static void f_to_host(void *dst, const void *src, size_t bytes)
{
	assert_true(is_host(dst));
	dev.to_host++;
	memcpy(dst, src, bytes);
}

static void f_to_device(void *dst, const void *src, size_t bytes)
{
	assert_true(is_host(src));
	dev.to_device++;
	memcpy(dst, src, bytes);
}

static void *f_alloc(size_t bytes)
{
	assert_true(dev.n_host < 16);
	dev.allocs++;
	void *p = malloc(bytes);
	dev.host[dev.n_host++] = p;
	return p;
}

static void f_free(void *p)
{
	for (int i = 0; i < dev.n_host; i++)
		if (dev.host[i] == p) {
			dev.host[i] = dev.host[--dev.n_host];
			dev.frees++;
			free(p);
			return;
		}
	fail_msg("freeing %p, which is not a staging buffer", p);
}

static const comm_staging_t staging = {f_to_host, f_to_device, f_alloc, f_free};

/* ---- fake wrapped comm: one wire buffer, completion after `polls` tests ---- */

static struct {
	char wire[256];
	size_t wire_bytes;
	void *last_buf; /* the buffer the last operation was given */
	int polls, fail_next, finalized, groups, barriers, aborted;
	int peer, tag; /* of the last send or receive */
} net;

typedef struct {
	int left;
	int op; /* 2: receive, 3: all-reduce */
	void *buf;
	size_t bytes;
} fop_t;

static int fake_start(int op, void *buf, size_t bytes, rt_req_t *req)
{
	net.last_buf = buf;
	if (net.fail_next) {
		net.fail_next = 0;
		return -1;
	}
	fop_t *f = malloc(sizeof *f);
	*f = (fop_t){net.polls, op, buf, bytes};
	*req = (rt_req_t){op, f, 0, 0};
	return 0;
}

static int k_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	assert_int_equal(c->nranks, 2);
	net.peer = peer;
	net.tag = tag;
	memcpy(net.wire, buf, bytes);
	net.wire_bytes = bytes;
	return fake_start(1, (void *)buf, bytes, req);
}

static int k_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	assert_int_equal(c->nranks, 2);
	net.peer = peer;
	net.tag = tag;
	return fake_start(2, buf, bytes, req);
}

static int k_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)group;
	return fake_start(3, buf, sizeof(float) * (size_t)n, req);
}

static int k_ireduce_scatter(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)group;
	return fake_start(4, buf, sizeof(float) * (size_t)n, req);
}

static int k_iallgather(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	(void)c;
	(void)group;
	return fake_start(5, buf, sizeof(float) * (size_t)n, req);
}

/* completes after `left` more polls: a receive then delivers the wire; as
 * if a second rank (member 1 of 2) held the same values, an all-reduce
 * doubles, a reduce-scatter doubles member 0's shard (and leaves the rest,
 * which the contract leaves undefined), an all-gather writes 7 into member
 * 1's shard */
static int k_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	(void)c;
	fop_t *f = req->impl;
	*done = f->left-- <= 0;
	if (!*done)
		return 0;
	if (f->op == 2)
		memcpy(f->buf, net.wire, f->bytes);
	int64_t n = (int64_t)(f->bytes / sizeof(float)), off, cnt;
	comm_shard(n, 0, 2, &off, &cnt);
	for (int64_t i = 0; f->op >= 3 && i < n; i++) {
		float *x = (float *)f->buf + i;
		int mine = i >= off && i < off + cnt;
		*x = f->op == 3 || (f->op == 4 && mine) ? 2 * *x : f->op == 5 && !mine ? 7 : *x;
	}
	free(f);
	*req = (rt_req_t){0};
	return 0;
}

static int k_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	(void)c;
	(void)ranks;
	(void)n;
	*out = net.groups++;
	return 0;
}

static int k_allsum(rt_comm_t *c, double *buf, int n)
{
	(void)c;
	for (int i = 0; i < n; i++)
		buf[i] += 1;
	return 0;
}

static int k_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	(void)c;
	(void)buf;
	(void)bytes;
	*out = NULL;
	*sizes = NULL;
	return 0;
}

static int k_barrier(rt_comm_t *c)
{
	assert_string_equal(c->name, "fake");
	return net.barriers++ < 0;
}

static void k_abort(rt_comm_t *c, int code)
{
	assert_string_equal(c->name, "fake");
	net.aborted = code;
}

static void k_finalize(rt_comm_t *c)
{
	assert_string_equal(c->name, "fake");
	net.finalized++;
}

static const rt_comm_ops_t fake_ops = {
	.group_create = k_group, .isend = k_isend, .irecv = k_irecv,
	.iallreduce = k_iallreduce, .ireduce_scatter = k_ireduce_scatter,
	.iallgather = k_iallgather, .test = k_test, .allsum = k_allsum, .gather = k_gather,
	.barrier = k_barrier, .abort = k_abort, .finalize = k_finalize,
};

static rt_comm_t comm;

/* A fresh staged comm over the fake, in *state. */
static int setup(void **state)
{
	memset(&dev, 0, sizeof dev);
	memset(&net, 0, sizeof net);
	comm = (rt_comm_t){.ops = &fake_ops, .name = "fake", .rank = 0, .nranks = 2,
			   .tag_ub = 100, .dataplane = "mpi"};
	sp_err_t err = {0};
	assert_int_equal(comm_staged_wrap(&comm, &staging, &err), 0);
	assert_int_equal(comm.nranks, 2);
	assert_int_equal(comm.tag_ub, 100);
	*state = &comm;
	return 0;
}

/* finalize frees every staging buffer and puts the wrapped comm back */
static int teardown(void **state)
{
	rt_comm_t *c = *state;
	c->ops->finalize(c);
	assert_int_equal(net.finalized, 1);
	assert_ptr_equal(c->ops, &fake_ops);
	assert_string_equal(c->dataplane, "mpi");
	assert_int_equal(dev.n_host, 0);
	assert_int_equal(dev.allocs, dev.frees);
	return 0;
}

/* polls req until done; returns how many polls said "not yet" */
static int wait(rt_comm_t *c, rt_req_t *req)
{
	int done = 0, waits = -1;
	while (!done) {
		assert_int_equal(c->ops->test(c, req, &done), 0);
		waits++;
	}
	assert_int_equal(req->kind, 0);
	return waits;
}

static void test_send(void **state)
{
	rt_comm_t *c = *state;
	float d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	rt_req_t r = {0};
	net.polls = 2;
	assert_int_equal(c->ops->isend(c, d, sizeof d, 1, 5, &r), 0);
	assert_int_not_equal(r.kind, 0);
	/* the wire saw a staging buffer holding the device data, not the device pointer */
	assert_true(is_host(net.last_buf));
	assert_ptr_not_equal(net.last_buf, d);
	assert_int_equal(dev.to_host, 1);
	assert_memory_equal(net.wire, d, sizeof d);
	assert_true(net.peer == 1 && net.tag == 5 && r.peer == 1 && r.tag == 5);
	assert_int_equal(wait(c, &r), 2);
	assert_int_equal(dev.to_device, 0);
}

static void test_recv_after_completion(void **state)
{
	rt_comm_t *c = *state;
	float msg[4] = {9, 8, 7, 6}, d[4] = {0};
	memcpy(net.wire, msg, sizeof msg);
	net.polls = 3;
	rt_req_t r = {0};
	assert_int_equal(c->ops->irecv(c, d, sizeof d, 1, 5, &r), 0);
	assert_true(is_host(net.last_buf));
	for (int i = 0; i < 3; i++) {
		int done = 1;
		assert_int_equal(c->ops->test(c, &r, &done), 0);
		assert_int_equal(done, 0);
		/* nothing reaches the device before the wrapped receive completes */
		assert_int_equal(dev.to_device, 0);
		assert_true(d[0] == 0);
	}
	assert_int_equal(wait(c, &r), 0);
	assert_int_equal(dev.to_device, 1);
	assert_int_equal(dev.to_host, 0);
	assert_memory_equal(d, msg, sizeof msg);
}

static void test_allreduce_round_trip(void **state)
{
	rt_comm_t *c = *state;
	float g[5] = {1, -2, 3.5f, 0, 10};
	net.polls = 1;
	rt_req_t r = {0};
	assert_int_equal(c->ops->iallreduce(c, g, 5, 0, &r), 0);
	assert_int_equal(dev.to_host, 1);
	assert_true(g[0] == 1); /* in place on the device only once complete */
	assert_int_equal(wait(c, &r), 1);
	assert_int_equal(dev.to_device, 1);
	float want[5] = {2, -4, 7, 0, 20};
	assert_memory_equal(g, want, sizeof want);
}

/* The zero-1 halves stage the whole bucket both ways, and nothing reaches
 * the device before the wrapped operation completes: member 0 of 2 owns
 * [0, 2) of 5 (comm_shard); the reduce-scatter sums it, the all-gather
 * brings member 1's shard. */
static void test_zero1_round_trip(void **state)
{
	rt_comm_t *c = *state;
	float b[5] = {1, -2, 3.5f, 0, 10}, before[5];
	const float want[2][5] = {{2, -4, 3.5f, 0, 10}, {2, -4, 7, 7, 7}};
	net.polls = 1;
	for (int half = 0; half < 2; half++) {
		rt_req_t r = {0};
		memcpy(before, b, sizeof b);
		assert_int_equal((half ? c->ops->iallgather : c->ops->ireduce_scatter)(c, b, 5, 0, &r),
				 0);
		assert_memory_equal(b, before, sizeof b);
		assert_int_equal(wait(c, &r), 1);
		assert_memory_equal(b, want[half], sizeof b);
	}
	assert_int_equal(dev.to_host, 2);
	assert_int_equal(dev.to_device, 2);
}

/* Step after step the same sizes reuse the same buffers; a small message
 * takes the smallest idle buffer that fits. */
static void test_buffers_reused(void **state)
{
	rt_comm_t *c = *state;
	float big[32] = {0}, small[4] = {0};
	for (int step = 0; step < 3; step++) {
		rt_req_t a = {0}, b = {0};
		assert_int_equal(c->ops->isend(c, big, sizeof big, 1, 1, &a), 0);
		assert_int_equal(c->ops->irecv(c, small, sizeof small, 1, 2, &b), 0);
		wait(c, &a);
		wait(c, &b);
	}
	assert_int_equal(dev.allocs, 2);
	rt_req_t r = {0};
	assert_int_equal(c->ops->irecv(c, small, 2 * sizeof(float), 1, 3, &r), 0);
	void *small_buf = net.last_buf;
	wait(c, &r);
	assert_int_equal(c->ops->irecv(c, small, sizeof small, 1, 4, &r), 0);
	assert_ptr_equal(net.last_buf, small_buf);
	wait(c, &r);
	assert_int_equal(dev.allocs, 2);
}

static void test_failed_start(void **state)
{
	rt_comm_t *c = *state;
	float d[4] = {0};
	rt_req_t r = {0};
	net.fail_next = 1;
	assert_int_not_equal(c->ops->isend(c, d, sizeof d, 1, 1, &r), 0);
	assert_int_equal(r.kind, 0);
	/* the staging buffer went back: the next operation reuses it */
	assert_int_equal(c->ops->irecv(c, d, sizeof d, 1, 1, &r), 0);
	assert_int_equal(dev.allocs, 1);
	wait(c, &r);
}

/* Host collectives are the wrapped comm's (teardown: finalize restores it). */
static void test_host_ops_pass_through(void **state)
{
	rt_comm_t *c = *state;
	double v[2] = {1, 2};
	assert_int_equal(c->ops->allsum(c, v, 2), 0);
	assert_true(v[0] == 2 && v[1] == 3);
	int ranks[2] = {0, 1}, g0 = -1, g1 = -1;
	assert_int_equal(c->ops->group_create(c, ranks, 2, &g0), 0);
	assert_int_equal(c->ops->group_create(c, ranks, 2, &g1), 0);
	assert_true(g0 == 0 && g1 == 1);
	assert_int_equal(c->ops->barrier(c), 0);
	assert_int_equal(net.barriers, 1);
	c->ops->abort(c, 3);
	assert_int_equal(net.aborted, 3);
	rt_req_t none = {0};
	int done = 0;
	assert_int_equal(c->ops->test(c, &none, &done), 0);
	assert_int_equal(done, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_send, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recv_after_completion, setup, teardown),
		cmocka_unit_test_setup_teardown(test_allreduce_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zero1_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_buffers_reused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_start, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_ops_pass_through, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
