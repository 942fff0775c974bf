/*
 * cuda/comm_nccl.c — the CUDA backend's data plane: device buffers move over
 * NCCL while the host collectives (allsum, gather, barrier) stay on the
 * comm it wraps (MPI, or the local single rank). It fills the progress
 * engine's primitive table (nccl_engine.h) with NCCL and CUDA calls and
 * maps rt_comm_t's entries onto the engine; every decision about order and
 * waiting is the engine's. It does not pick devices (cu_runtime.cu does)
 * and never touches the interpreter's buffers beyond the pointers it is
 * given.
 *
 * A bucket's zero-1/2/3 halves run as ncclReduceScatter / ncclAllGather
 * (nccl_pad.c ne_how_shard: in place where the members' shards have one
 * size, else over a padded scratch from cudaMallocAsync on the group's
 * stream, in rounds of at most SPINDLE_NCCL_PAD_MB, default 64 MiB, that
 * cu_comm.cu's kernel repacks); parts only some members hold (zero-3
 * layers, deferred pieces) stay rooted broadcasts. finalize prints each
 * rank's counts and the scratch's peak (outside the plan's memory).
 *
 * Communicators are all non-blocking (config.blocking = 0): no NCCL call
 * here waits for a peer. Start-up (the only loops that wait, each polling
 * with SPINDLE_NCCL_TIMEOUT, default 300 s, and aborting with a message
 * naming rank and peer):
 *   comm_nccl_start    the world communicator: rank 0's ncclUniqueId is
 *                      spread with the wrapped comm's allsum;
 *   comm_nccl_prepare  everything the plan needs, in the plan's global
 *                      order (ne_prepare): one communicator per sync
 *                      bucket with several members, one per distinct
 *                      tensor-parallel group (its rank j is member j), one
 *                      per direction of each pair that exchanges data (the
 *                      programs' transfers and the checkpoint's shard
 *                      joins), all split from world, each warmed up with a
 *                      4-byte operation.
 * After that group_create only hands out the buckets' and the
 * tensor-parallel groups' communicators. A split layer's in-layer
 * all-reduces go over its group's communicator like a bucket's.
 *
 * Split configuration (split_config): splitShare = 1, so the children
 * reuse world's proxy thread and buffers instead of each allocating its
 * own (a plan with many peers and buckets otherwise holds dozens of
 * full-size communicators); maxCTAs bounded so that the kernels of every
 * communicator of a rank can be resident at once: NCCL guarantees progress
 * of concurrent operations on different communicators only when their
 * kernels are co-resident, and a send kernel waiting for its peer must not
 * keep a receive kernel of another channel from being scheduled. The bound
 * is the SM count divided by the number of communicators (at least 1, at
 * most 16).
 */
#include "cuda_backend.h"
#include "nccl_engine.h"
#include "runtime.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REQ_NCCL 0x4e43 /* rt_req_t.kind of our requests */

typedef struct {
	rt_comm_t inner;
	char host[64];
	double timeout_s;
	ncclComm_t world;
	ne_engine_t *eng;
	cudaEvent_t ready_ev;
	float *warm;       /* device: the warm-up operations' buffer */
	int max_ctas;      /* for splits; set by comm_nccl_prepare */
	int n_groups_made; /* group_create calls so far (layout item index) */
	int started;
} nccl_impl_t;

static nccl_impl_t *impl(rt_comm_t *c)
{
	return c->impl;
}

static void report(nccl_impl_t *im, const char *what, const char *detail)
{
	fprintf(stderr, "spindle-run: rank %d on %s: nccl: %s: %s\n", im->inner.rank, im->host,
		what, detail);
	fflush(stderr);
}

/* ---- the engine's primitives: NCCL and CUDA ---- */

static int nres(ncclResult_t r)
{
	return r == ncclSuccess ? NE_OK : r == ncclInProgress ? NE_PENDING : NE_ERR;
}

static int cres(cudaError_t e)
{
	if (e == cudaSuccess)
		return NE_OK;
	if (e == cudaErrorNotReady) {
		cudaGetLastError();
		return NE_PENDING;
	}
	cudaGetLastError();
	return NE_ERR;
}

static double p_now(void *ctx)
{
	(void)ctx;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ncclConfig_t nb_config(void)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	return cfg;
}

static ncclConfig_t split_config(const nccl_impl_t *im)
{
	ncclConfig_t cfg = nb_config();
	cfg.splitShare = 1;
	if (im->max_ctas > 0)
		cfg.maxCTAs = im->max_ctas;
	return cfg;
}

static int p_split(void *ctx, void *parent, int color, int key, void **out)
{
	ncclConfig_t cfg = split_config(ctx);
	ncclComm_t nc = NULL;
	int r = nres(ncclCommSplit((ncclComm_t)parent, color < 0 ? NCCL_SPLIT_NOCOLOR : color,
				   key, &nc, &cfg));
	*out = nc;
	return r;
}

static int p_status(void *ctx, void *comm)
{
	(void)ctx;
	ncclResult_t st = ncclSuccess;
	ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)comm, &st);
	return nres(r != ncclSuccess ? r : st);
}

static void p_abort(void *ctx, void *comm)
{
	(void)ctx;
	ncclCommAbort((ncclComm_t)comm);
}

static int p_finalize(void *ctx, void *comm)
{
	(void)ctx;
	return nres(ncclCommFinalize((ncclComm_t)comm));
}

static void p_destroy(void *ctx, void *comm)
{
	(void)ctx;
	ncclCommDestroy((ncclComm_t)comm);
}

static const char *p_why(void *ctx, void *comm)
{
	(void)ctx;
	const char *w = comm ? ncclGetLastError((ncclComm_t)comm) : NULL;
	return w && *w ? w : "NCCL error";
}

static int p_group_start(void *ctx)
{
	(void)ctx;
	return nres(ncclGroupStart());
}

static int p_group_end(void *ctx)
{
	(void)ctx;
	return nres(ncclGroupEnd());
}

static int p_send(void *ctx, const void *buf, size_t bytes, int peer, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclSend(buf, bytes, ncclUint8, peer, (ncclComm_t)comm, (cudaStream_t)s));
}

static int p_recv(void *ctx, void *buf, size_t bytes, int peer, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclRecv(buf, bytes, ncclUint8, peer, (ncclComm_t)comm, (cudaStream_t)s));
}

static int p_allreduce(void *ctx, float *buf, size_t n, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, (ncclComm_t)comm,
				  (cudaStream_t)s));
}

static int p_reduce(void *ctx, float *buf, size_t n, int root, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclReduce(buf, buf, n, ncclFloat, ncclSum, root, (ncclComm_t)comm,
			       (cudaStream_t)s));
}

static int p_bcast(void *ctx, float *buf, size_t n, int root, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclBroadcast(buf, buf, n, ncclFloat, root, (ncclComm_t)comm,
				  (cudaStream_t)s));
}

static int p_reduce_scatter(void *ctx, float *buf, size_t c, int me, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclReduceScatter(buf, buf + (size_t)me * c, c, ncclFloat, ncclSum,
				      (ncclComm_t)comm, (cudaStream_t)s));
}

static int p_allgather(void *ctx, float *buf, size_t c, int me, void *comm, void *s)
{
	(void)ctx;
	return nres(ncclAllGather(buf + (size_t)me * c, buf, c, ncclFloat, (ncclComm_t)comm,
				  (cudaStream_t)s));
}

/* The padded halves' scratch: stream-ordered, so a later half on the same
 * stream reuses the pool's bytes without a device-wide synchronisation. */
static int p_scratch(void *ctx, size_t bytes, void *s, float **out)
{
	nccl_impl_t *im = ctx;
	*out = NULL;
	if (cudaMallocAsync((void **)out, bytes ? bytes : sizeof(float), (cudaStream_t)s) !=
	    cudaSuccess) {
		report(im, "allocating the padded scratch of a sharded collective",
		       cudaGetErrorString(cudaGetLastError()));
		*out = NULL;
		return NE_ERR;
	}
	return NE_OK;
}

static void p_scratch_free(void *ctx, float *p, void *s)
{
	(void)ctx;
	cudaFreeAsync(p, (cudaStream_t)s);
}

static int p_repack(void *ctx, float *dst, const float *src, int64_t n, int k, int64_t r0,
		    int64_t m, int to_padded, int who, void *s)
{
	nccl_impl_t *im = ctx;
	if (cu_shard_repack(dst, src, n, k, r0, m, to_padded, who, s)) {
		report(im, "repacking a sharded collective's padded scratch",
		       cudaGetErrorString(cudaGetLastError()));
		return NE_ERR;
	}
	return NE_OK;
}

static int p_stream_new(void *ctx, void **out)
{
	(void)ctx;
	cudaStream_t s = NULL;
	int r = cres(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	*out = s;
	return r == NE_OK ? NE_OK : NE_ERR;
}

static void p_stream_free(void *ctx, void *s)
{
	(void)ctx;
	cudaStreamDestroy((cudaStream_t)s);
}

static int p_event_new(void *ctx, void **out)
{
	(void)ctx;
	cudaEvent_t ev = NULL;
	int r = cres(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	*out = ev;
	return r == NE_OK ? NE_OK : NE_ERR;
}

static void p_event_free(void *ctx, void *ev)
{
	(void)ctx;
	cudaEventDestroy((cudaEvent_t)ev);
}

/* The channel's stream waits for the compute stream: buffers written there
 * (staging copies) are complete, and ones read there are free. */
static int p_after_compute(void *ctx, void *s)
{
	nccl_impl_t *im = ctx;
	if (cudaEventRecord(im->ready_ev, (cudaStream_t)cu_stream()) != cudaSuccess ||
	    cudaStreamWaitEvent((cudaStream_t)s, im->ready_ev, 0) != cudaSuccess) {
		report(im, "ordering after the compute stream", cudaGetErrorString(cudaGetLastError()));
		return NE_ERR;
	}
	return NE_OK;
}

static int p_record(void *ctx, void *ev, void *s)
{
	(void)ctx;
	return cres(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s)) == NE_OK ? NE_OK : NE_ERR;
}

static int p_query(void *ctx, void *ev)
{
	(void)ctx;
	return cres(cudaEventQuery((cudaEvent_t)ev));
}

static const ne_prims_t nccl_prims = {
	.now = p_now, .split = p_split, .status = p_status, .abort = p_abort,
	.finalize = p_finalize, .destroy = p_destroy, .why = p_why,
	.group_start = p_group_start, .group_end = p_group_end, .send = p_send, .recv = p_recv,
	.allreduce = p_allreduce, .reduce = p_reduce, .bcast = p_bcast,
	.reduce_scatter = p_reduce_scatter, .allgather = p_allgather, .scratch = p_scratch,
	.scratch_free = p_scratch_free, .repack = p_repack,
	.stream_new = p_stream_new, .stream_free = p_stream_free,
	.event_new = p_event_new, .event_free = p_event_free, .after_compute = p_after_compute,
	.record = p_record, .query = p_query,
};

/* ---- rt_comm_t entry points ---- */

static int n_post_ok(nccl_impl_t *im)
{
	if (im->eng && ne_prepared(im->eng))
		return 1;
	report(im, "moving device buffers",
	       "the plan's communicators were not made at start-up (comm_nccl_prepare)");
	return 0;
}

static int n_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	ne_op_t *op = NULL;
	if (!n_post_ok(im) || ne_isend(im->eng, buf, bytes, peer, tag, &op))
		return -1;
	*req = (rt_req_t){REQ_NCCL, op, peer, tag};
	return 0;
}

static int n_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	ne_op_t *op = NULL;
	if (!n_post_ok(im) || ne_irecv(im->eng, buf, bytes, peer, tag, &op))
		return -1;
	*req = (rt_req_t){REQ_NCCL, op, peer, tag};
	return 0;
}

/* Called in the layout's order (interp.c's rt_create): the k-th call is
 * item k, bucket k and then the tensor-parallel groups in plan_tp_groups
 * order, whose communicator comm_nccl_prepare made. One rank: groups of
 * one. */
static int n_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	nccl_impl_t *im = impl(c);
	int item = im->n_groups_made++;
	*out = -1;
	if (c->nranks == 1) {
		*out = comm_member(c, ranks, n) ? item : -1;
		return 0;
	}
	if (!n_post_ok(im) || ne_group_id(im->eng, item, out)) {
		report(im, "creating a group",
		       "the plan's buckets and tensor-parallel groups and the calls disagree");
		return -1;
	}
	return (*out >= 0) == comm_member(c, ranks, n) ? 0 : -1;
}

typedef int ne_coll_fn(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out);

static int n_coll(rt_comm_t *c, ne_coll_fn *fn, float *buf, int64_t n, int group,
		  rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	ne_op_t *op = NULL;
	*req = (rt_req_t){0, NULL, -1, group};
	if (c->nranks == 1)
		return 0; /* groups of one: the result is the buffer itself */
	if (!n_post_ok(im) || fn(im->eng, buf, n, group, &op))
		return -1;
	if (op)
		*req = (rt_req_t){REQ_NCCL, op, -1, group};
	return 0;
}

static int n_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return n_coll(c, ne_iallreduce, buf, n, group, req);
}

static int n_ireduce_scatter(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	return n_coll(c, ne_ireduce_scatter, buf, n, group, req);
}

/* The all-gather writes weights behind the backend's back: their bf16
 * shadow must be re-made, marked so when it starts and again when it
 * completes (n_test): a layer that runs between the two, on weights an
 * earlier deferred piece or zero-3 gather brought, re-makes the shadow of
 * the whole allocation while this gather still writes into it, and would
 * otherwise leave it marked clean with this gather's range stale. */
static int n_iallgather(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	cu_mark_written(buf);
	return n_coll(c, ne_iallgather, buf, n, group, req);
}

/* The all-gather with parts (zero-3 layers): as n_iallgather, over the
 * caller's parts (ne_iallgatherv: a broadcast per member with a part). */
static int n_iallgatherv(rt_comm_t *c, float *buf, int k, const int64_t *cnt,
			 const int64_t *off, int group, rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	ne_op_t *op = NULL;
	*req = (rt_req_t){0, NULL, -1, group};
	cu_mark_written(buf);
	if (c->nranks == 1)
		return k == 1 && cnt[0] >= 0 && off[0] >= 0 ? 0 : -1;
	if (!n_post_ok(im) || ne_iallgatherv(im->eng, buf, k, cnt, off, group, &op))
		return -1;
	if (op)
		*req = (rt_req_t){REQ_NCCL, op, -1, group};
	return 0;
}

static int n_test(rt_comm_t *c, rt_req_t *req, int *done)
{
	nccl_impl_t *im = impl(c);
	*done = 0;
	if (req->kind != REQ_NCCL) {
		*done = 1;
		req->kind = 0;
		return 0;
	}
	void *wrote = ne_op_gathers(req->impl); /* before ne_test frees it */
	if (ne_test(im->eng, req->impl, done))
		return -1;
	if (*done) {
		if (wrote) /* see n_iallgather */
			cu_mark_written(wrote);
		*req = (rt_req_t){0, NULL, -1, -1};
	}
	return 0;
}

static int n_allsum(rt_comm_t *c, double *buf, int n)
{
	nccl_impl_t *im = impl(c);
	return im->inner.ops->allsum(&im->inner, buf, n);
}

static int n_gather(rt_comm_t *c, const void *buf, size_t bytes, void **out, size_t **sizes)
{
	nccl_impl_t *im = impl(c);
	return im->inner.ops->gather(&im->inner, buf, bytes, out, sizes);
}

static int n_barrier(rt_comm_t *c)
{
	nccl_impl_t *im = impl(c);
	return im->inner.ops->barrier(&im->inner);
}

/* Ends every communicator (the engine's, or world alone before prepare). */
static void teardown(nccl_impl_t *im, int hard)
{
	if (im->eng) {
		ne_free(im->eng, hard);
		im->world = NULL; /* the engine ended it */
	} else if (im->world) {
		if (hard)
			ncclCommAbort(im->world);
		else
			ncclCommDestroy(im->world);
	}
	im->eng = NULL;
	im->world = NULL;
	if (im->warm)
		cudaFree(im->warm);
	im->warm = NULL;
	if (im->ready_ev)
		cudaEventDestroy(im->ready_ev);
	im->ready_ev = NULL;
}

static void n_abort(rt_comm_t *c, int code)
{
	nccl_impl_t *im = impl(c);
	teardown(im, 1);
	im->inner.ops->abort(&im->inner, code);
}

/* How the sharded halves ran (ne_stats): which NCCL collective, and the
 * padded scratch's peak, which the plan's memory does not count. */
static void print_shard_stats(nccl_impl_t *im)
{
	ne_stats_t st;
	if (!im->eng)
		return;
	ne_stats(im->eng, &st);
	if (!st.direct && !st.padded && !st.rooted)
		return;
	printf("rank %d nccl sharded halves: %ld ncclReduceScatter/ncclAllGather in place, "
	       "%ld padded (scratch peak %.2f MiB, not in the plan's memory), %ld rooted "
	       "ncclReduce/ncclBroadcast\n",
	       im->inner.rank, st.direct, st.padded, (double)st.scratch_peak / 1048576.0,
	       st.rooted);
	fflush(stdout);
}

static void n_finalize(rt_comm_t *c)
{
	nccl_impl_t *im = impl(c);
	print_shard_stats(im);
	teardown(im, 0);
	rt_comm_t inner = im->inner;
	free(im);
	*c = inner;
	c->ops->finalize(c);
}

static const rt_comm_ops_t nccl_ops = {
	.group_create = n_group, .isend = n_isend, .irecv = n_irecv,
	.iallreduce = n_iallreduce, .ireduce_scatter = n_ireduce_scatter,
	.iallgather = n_iallgather, .iallgatherv = n_iallgatherv, .test = n_test,
	.allsum = n_allsum, .gather = n_gather,
	.barrier = n_barrier, .abort = n_abort, .finalize = n_finalize,
};

int comm_nccl_available(void)
{
	return 1;
}

int comm_nccl_wrap(rt_comm_t *c, sp_err_t *err)
{
	nccl_impl_t *im = calloc(1, sizeof *im);
	if (!im)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	im->inner = *c;
	if (gethostname(im->host, sizeof im->host - 1) != 0)
		snprintf(im->host, sizeof im->host, "?");
	const char *t = getenv("SPINDLE_NCCL_TIMEOUT");
	im->timeout_s = t && atof(t) > 0 ? atof(t) : 300.0;
	im->started = c->nranks == 1;
	c->impl = im;
	c->name = c->nranks > 1 ? "nccl" : c->name;
	c->ops = &nccl_ops;
	return 0;
}

/* Polls a non-blocking communicator under creation (start-up only: every
 * rank is in the same call). Aborts it on error or timeout. */
static int wait_created(nccl_impl_t *im, ncclComm_t *comm, const char *what)
{
	double deadline = p_now(NULL) + im->timeout_s;
	struct timespec nap = {0, 100000};
	int s;
	while ((s = p_status(im, *comm)) == NE_PENDING && p_now(NULL) < deadline)
		nanosleep(&nap, NULL);
	if (s == NE_OK)
		return 0;
	report(im, what, s == NE_PENDING ? "timed out; aborting the communicator"
					 : p_why(im, *comm));
	ncclCommAbort(*comm);
	*comm = NULL;
	return -1;
}

int comm_nccl_start(rt_comm_t *c, int dev_ok, sp_err_t *err)
{
	nccl_impl_t *im = impl(c);
	int n = c->nranks, nid = (int)sizeof(ncclUniqueId);
	/* [0]: ranks that cannot go on; [1..]: rank 0's unique id, one byte each */
	double *v = calloc((size_t)nid + 1, sizeof *v);
	if (!v)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	v[0] = dev_ok ? 0.0 : 1.0;
	if (c->rank == 0 && dev_ok) {
		ncclUniqueId id;
		ncclResult_t r = ncclGetUniqueId(&id);
		if (r != ncclSuccess) {
			report(im, "ncclGetUniqueId", ncclGetErrorString(r));
			v[0] = 1.0;
		} else {
			for (int i = 0; i < nid; i++)
				v[1 + i] = (double)(unsigned char)id.internal[i];
		}
	}
	if (im->inner.ops->allsum(&im->inner, v, nid + 1)) {
		free(v);
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d: agreeing on the NCCL unique id failed", c->rank);
	}
	if (v[0] > 0.5) {
		int bad = (int)(v[0] + 0.5);
		free(v);
		if (!dev_ok)
			return err->code ? err->code : SP_EIO;
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d: %d rank%s could not set up a CUDA device or NCCL id",
				  c->rank, bad, bad == 1 ? "" : "s");
	}
	ncclUniqueId id;
	for (int i = 0; i < nid; i++)
		id.internal[i] = (char)(unsigned char)(v[1 + i] + 0.5);
	free(v);
	if (cudaEventCreateWithFlags(&im->ready_ev, cudaEventDisableTiming) != cudaSuccess ||
	    cudaMalloc((void **)&im->warm, sizeof(float)) != cudaSuccess ||
	    cudaMemset(im->warm, 0, sizeof(float)) != cudaSuccess)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "rank %d: setting up NCCL: %s",
				  c->rank, cudaGetErrorString(cudaGetLastError()));
	ncclConfig_t cfg = nb_config();
	ncclResult_t r = ncclCommInitRankConfig(&im->world, n, id, c->rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress) {
		report(im, "creating the world communicator", ncclGetErrorString(r));
		im->world = NULL;
	}
	if (!im->world || wait_created(im, &im->world, "creating the world communicator"))
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d on %s: creating the NCCL world communicator failed",
				  c->rank, im->host);
	im->started = 1;
	return 0;
}

/* maxCTAs for the splits: every communicator's kernels resident at once. */
static int ctas_for(int n_comms)
{
	int sms = 0, dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
		cudaGetLastError();
		return 1;
	}
	int k = sms / (n_comms > 0 ? n_comms : 1);
	return k < 1 ? 1 : k > 16 ? 16 : k;
}

int comm_nccl_prepare(rt_comm_t *c, const sp_plan_t *p, sp_err_t *err)
{
	if (c->ops != &nccl_ops || c->nranks == 1)
		return 0;
	nccl_impl_t *im = impl(c);
	if (!im->started || !im->world)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d: the NCCL world communicator is missing", c->rank);
	ne_layout_t lay;
	if (ne_layout_init(&lay, p))
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	/* communicators of this rank: world, its buckets, its tensor-parallel
	 * groups, its channels */
	int mine = 1;
	for (int b = 0; b < lay.n_buckets; b++)
		mine += comm_member(c, p->bucket_devs + lay.buckets[b].dev_off, lay.buckets[b].n_dev);
	for (int g = 0; g < lay.n_tps; g++)
		mine += comm_member(c, p->slice_devs + lay.tps[g].off, lay.tps[g].t);
	for (int i = 0; i < lay.n_chans; i++)
		mine += lay.chans[i][0] == c->rank || lay.chans[i][1] == c->rank;
	im->max_ctas = ctas_for(mine);
	im->eng = ne_new(&nccl_prims, im, &im->inner, im->world, im->warm, im->timeout_s,
			 im->host);
	/* a padded sharded half's scratch per round (SPINDLE_NCCL_PAD_MB) */
	const char *pad = getenv("SPINDLE_NCCL_PAD_MB");
	if (im->eng && pad && atof(pad) > 0)
		ne_set_pad_cap(im->eng, (int64_t)(atof(pad) * 1048576.0));
	int r = im->eng ? NE_PENDING : NE_ERR;
	struct timespec nap = {0, 100000};
	/* every rank walks the same global order; ne_prepare bounds each wait */
	while (r == NE_PENDING) {
		r = ne_prepare(im->eng, &lay);
		if (r == NE_PENDING)
			nanosleep(&nap, NULL);
	}
	ne_layout_release(&lay);
	if (r != NE_OK)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d on %s: making the plan's NCCL communicators failed",
				  c->rank, im->host);
	return 0;
}
