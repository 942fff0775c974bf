/*
 * cuda/comm_nccl.c — the CUDA backend's data plane: device buffers move over
 * NCCL while the host collectives (allsum, gather, barrier) stay on the
 * comm it wraps (MPI, or the local single rank). It does not pick devices
 * (cu_runtime.cu does) and never touches the interpreter's buffers beyond
 * the pointers it is given.
 *
 * Communicators (all non-blocking, so nothing here can hang: every wait
 * polls ncclCommGetAsyncError against SPINDLE_NCCL_TIMEOUT, default 300 s,
 * and aborts the communicator on error or timeout, naming rank and peer):
 *   world    created once in comm_nccl_start: rank 0's ncclUniqueId is
 *            spread with the wrapped comm's allsum (one double per byte);
 *   groups   one per sync bucket with more than one member, ncclCommSplit
 *            of world (collective, in bucket order, like comm_mpi.c's
 *            MPI_Comm_split), each with its own stream so an all-reduce
 *            overlaps later backward work on the compute stream; a group
 *            of one is a no-op;
 *   channels one two-rank communicator per direction of each pair that
 *            exchanges data, created on first use.
 *
 * Point-to-point keeps MPI's semantics (sends never block the sender's
 * later receives; messages match by tag) although NCCL has neither tags
 * nor independent operations on one communicator:
 *   - each direction has its own communicator and stream, so a pending
 *     send never sits in front of a receive;
 *   - receives drive the order: irecv sends the sender a clear-to-send
 *     message {tag, bytes} on the wrapped comm (tag CTRL_TAG) and enqueues
 *     ncclRecv; the sender enqueues its ncclSends in the order the
 *     clear-to-send messages arrive, matched by tag, so both sides of a
 *     channel enqueue the same sequence. The first message on a channel
 *     also carries the ncclUniqueId the receiver made for it.
 * Sends are grouped (ncclGroupStart/End) when several become ready at
 * once. Completion is polled with cudaEventQuery from test().
 */
#include "cuda_backend.h"
#include "runtime.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CTRL_TAG 32767
#define REQ_NCCL 0x4e43 /* rt_req_t.kind of our requests */

typedef struct {
	int32_t tag, fresh;
	int64_t bytes;
	ncclUniqueId id;
} cts_msg_t;

enum { OP_SEND, OP_RECV, OP_ALLREDUCE };
enum { ST_WAIT_CTS, ST_MATCHED, ST_WAIT_CHAN, ST_LAUNCHED, ST_DONE, ST_FAILED };

typedef struct nop {
	int kind, state, peer, tag, group;
	long seq; /* sends: order of their clear-to-send */
	void *buf;
	size_t bytes;
	cudaEvent_t ev;
	cts_msg_t cts;    /* receives: the clear-to-send message */
	rt_req_t cts_req; /* receives: its host send (kind 0 once complete) */
	struct nop *next;
} nop_t;

typedef struct {
	ncclComm_t comm; /* NULL until created */
	cudaStream_t stream;
	int ready, failed;
	double t_start;
} chan_t;

typedef struct {
	chan_t out, in;  /* out: this rank sends (comm rank 0); in: receives (rank 1) */
	cts_msg_t *fifo; /* clear-to-send messages not yet matched, in arrival order */
	int n_fifo, cap_fifo;
	cts_msg_t ctrl_buf;
	rt_req_t ctrl_req;
	int ctrl_posted;
	long seq;
} peer_t;

typedef struct {
	ncclComm_t comm; /* NULL: a group of one */
	cudaStream_t stream;
} group_t;

typedef struct {
	rt_comm_t inner;
	char host[64];
	double timeout_s;
	ncclComm_t world;
	group_t *groups;
	int n_groups, cap_groups;
	peer_t *peers;
	nop_t *ops; /* live operations, in posting order */
	cudaEvent_t ready_ev;
	int started;
} nccl_impl_t;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static nccl_impl_t *impl(rt_comm_t *c)
{
	return c->impl;
}

static void report(nccl_impl_t *im, const char *what, int peer, const char *detail)
{
	if (peer >= 0)
		fprintf(stderr, "spindle-run: rank %d on %s: nccl: %s rank %d: %s\n",
			im->inner.rank, im->host, what, peer, detail);
	else
		fprintf(stderr, "spindle-run: rank %d on %s: nccl: %s: %s\n", im->inner.rank,
			im->host, what, detail);
	fflush(stderr);
}

static void report_nccl(nccl_impl_t *im, const char *what, int peer, ncclComm_t comm,
			ncclResult_t r)
{
	char msg[512];
	const char *last = comm ? ncclGetLastError(comm) : NULL;
	snprintf(msg, sizeof msg, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
		 last ? last : "");
	report(im, what, peer, msg);
}

/*
 * Waits until a non-blocking communicator has finished its pending call
 * (init, split, or enqueueing a group). On error or timeout it is aborted
 * (*comm becomes NULL) and -1 returned.
 */
static int wait_comm(nccl_impl_t *im, ncclComm_t *comm, const char *what, int peer)
{
	double deadline = now_s() + im->timeout_s;
	struct timespec nap = {0, 100000};
	for (;;) {
		ncclResult_t st = ncclSuccess;
		ncclResult_t r = ncclCommGetAsyncError(*comm, &st);
		if (r != ncclSuccess)
			st = r;
		if (st == ncclSuccess)
			return 0;
		if (st != ncclInProgress) {
			report_nccl(im, what, peer, *comm, st);
			break;
		}
		if (now_s() > deadline) {
			report(im, what, peer, "timed out; aborting the communicator");
			break;
		}
		nanosleep(&nap, NULL);
	}
	ncclCommAbort(*comm);
	*comm = NULL;
	return -1;
}

static ncclConfig_t nb_config(void)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	return cfg;
}

/* ---- operations ---- */

static nop_t *op_new(nccl_impl_t *im, int kind, int peer, int tag, void *buf, size_t bytes)
{
	nop_t *op = calloc(1, sizeof *op);
	if (!op)
		return NULL;
	if (cudaEventCreateWithFlags(&op->ev, cudaEventDisableTiming) != cudaSuccess) {
		cudaGetLastError();
		free(op);
		return NULL;
	}
	op->kind = kind;
	op->peer = peer;
	op->tag = tag;
	op->buf = buf;
	op->bytes = bytes;
	op->group = -1;
	nop_t **tail = &im->ops;
	while (*tail)
		tail = &(*tail)->next;
	*tail = op;
	return op;
}

static void op_free(nccl_impl_t *im, nop_t *op)
{
	for (nop_t **p = &im->ops; *p; p = &(*p)->next)
		if (*p == op) {
			*p = op->next;
			break;
		}
	cudaEventDestroy(op->ev);
	free(op);
}

static chan_t *op_chan(nccl_impl_t *im, nop_t *op)
{
	return op->kind == OP_SEND ? &im->peers[op->peer].out : &im->peers[op->peer].in;
}

static ncclComm_t op_comm(nccl_impl_t *im, nop_t *op)
{
	if (op->kind == OP_ALLREDUCE)
		return im->groups[op->group].comm;
	return op_chan(im, op)->comm;
}

/* "send to rank 3 (tag 17)", "all-reduce of sync group 2" */
static const char *op_desc(const nop_t *op, char *buf, size_t n)
{
	if (op->kind == OP_ALLREDUCE)
		snprintf(buf, n, "all-reduce of sync group %d", op->group);
	else
		snprintf(buf, n, "%s rank %d (tag %d)", op->kind == OP_SEND ? "send to" : "receive from",
			 op->peer, op->tag);
	return buf;
}

/* The channel's stream waits for the compute stream: buffers written there
 * (staging copies) are complete, and ones read there (the previous
 * receive's copy-out) are free. */
static int after_compute(nccl_impl_t *im, cudaStream_t s)
{
	if (cudaEventRecord(im->ready_ev, (cudaStream_t)cu_stream()) != cudaSuccess ||
	    cudaStreamWaitEvent(s, im->ready_ev, 0) != cudaSuccess) {
		report(im, "ordering after the compute stream", -1,
		       cudaGetErrorString(cudaGetLastError()));
		return -1;
	}
	return 0;
}

static int chan_create(nccl_impl_t *im, chan_t *ch, ncclUniqueId id, int my_rank, int peer)
{
	ncclConfig_t cfg = nb_config();
	if (cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking) != cudaSuccess) {
		report(im, "creating a stream for", peer, cudaGetErrorString(cudaGetLastError()));
		ch->failed = 1;
		return -1;
	}
	ncclResult_t r = ncclCommInitRankConfig(&ch->comm, 2, id, my_rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress) {
		report_nccl(im, "creating the channel with", peer, NULL, r);
		ch->comm = NULL;
		ch->failed = 1;
		return -1;
	}
	ch->t_start = now_s();
	ch->ready = 0;
	return 0;
}

/* Polls a channel under creation; fails it on error or timeout. */
static void chan_poll(nccl_impl_t *im, chan_t *ch, int peer)
{
	if (!ch->comm || ch->ready || ch->failed)
		return;
	ncclResult_t st = ncclSuccess;
	ncclResult_t r = ncclCommGetAsyncError(ch->comm, &st);
	if (r != ncclSuccess)
		st = r;
	if (st == ncclSuccess) {
		ch->ready = 1;
		return;
	}
	if (st == ncclInProgress && now_s() - ch->t_start < im->timeout_s)
		return;
	if (st == ncclInProgress)
		report(im, "creating the channel with", peer, "timed out; aborting it");
	else
		report_nccl(im, "creating the channel with", peer, ch->comm, st);
	ncclCommAbort(ch->comm);
	ch->comm = NULL;
	ch->failed = 1;
	for (nop_t *op = im->ops; op; op = op->next)
		if (op->kind != OP_ALLREDUCE && op->peer == peer && op_chan(im, op) == ch &&
		    op->state != ST_DONE)
			op->state = ST_FAILED;
}

/* Enqueues ops[0..n) (all on one channel) as one group; records their events. */
static int launch(nccl_impl_t *im, chan_t *ch, nop_t **ops, int n, int peer)
{
	if (after_compute(im, ch->stream)) {
		for (int i = 0; i < n; i++)
			ops[i]->state = ST_FAILED;
		return -1;
	}
	ncclResult_t r = ncclGroupStart();
	for (int i = 0; i < n && r == ncclSuccess; i++)
		r = ops[i]->kind == OP_SEND
			    ? ncclSend(ops[i]->buf, ops[i]->bytes, ncclUint8, 1, ch->comm, ch->stream)
			    : ncclRecv(ops[i]->buf, ops[i]->bytes, ncclUint8, 0, ch->comm,
				       ch->stream);
	ncclResult_t r2 = ncclGroupEnd();
	if (r == ncclSuccess)
		r = r2;
	if (r == ncclInProgress)
		r = wait_comm(im, &ch->comm, ops[0]->kind == OP_SEND ? "send to" : "receive from",
			      peer)
			    ? ncclInternalError
			    : ncclSuccess;
	if (r != ncclSuccess) {
		if (ch->comm) {
			report_nccl(im, ops[0]->kind == OP_SEND ? "send to" : "receive from", peer,
				    ch->comm, r);
			ncclCommAbort(ch->comm);
			ch->comm = NULL;
		}
		ch->failed = 1;
		for (int i = 0; i < n; i++)
			ops[i]->state = ST_FAILED;
		return -1;
	}
	for (int i = 0; i < n; i++) {
		if (cudaEventRecord(ops[i]->ev, ch->stream) != cudaSuccess) {
			report(im, "recording an event for", peer,
			       cudaGetErrorString(cudaGetLastError()));
			ops[i]->state = ST_FAILED;
			continue;
		}
		ops[i]->state = ST_LAUNCHED;
	}
	return 0;
}

/* Handles one clear-to-send from peer p. */
static int got_cts(nccl_impl_t *im, int p, const cts_msg_t *m)
{
	peer_t *pe = &im->peers[p];
	if (m->fresh && !pe->out.comm && !pe->out.failed && chan_create(im, &pe->out, m->id, 0, p))
		return -1;
	if (SP_PUSH(pe->fifo, pe->n_fifo, pe->cap_fifo, *m))
		return -1;
	return 0;
}

/* Moves the ops along: control messages, matching, channel set-up,
 * launches, completions. Returns -1 when the wrapped comm fails. */
static int progress(nccl_impl_t *im)
{
	int n = im->inner.nranks;
	for (int p = 0; p < n; p++) {
		peer_t *pe = &im->peers[p];
		if (pe->ctrl_posted) {
			int done = 0;
			if (im->inner.ops->test(&im->inner, &pe->ctrl_req, &done))
				return -1;
			if (done) {
				pe->ctrl_posted = 0;
				if (got_cts(im, p, &pe->ctrl_buf))
					return -1;
			}
		}
		/* match the clear-to-send messages in arrival order */
		while (pe->n_fifo > 0) {
			nop_t *hit = NULL;
			for (nop_t *op = im->ops; op && !hit; op = op->next)
				if (op->kind == OP_SEND && op->peer == p && op->state == ST_WAIT_CTS &&
				    op->tag == pe->fifo[0].tag)
					hit = op;
			if (!hit)
				break;
			if ((int64_t)hit->bytes != pe->fifo[0].bytes) {
				char msg[160];
				snprintf(msg, sizeof msg,
					 "size mismatch on tag %d: sending %zu bytes, the receiver "
					 "expects %lld",
					 hit->tag, hit->bytes, (long long)pe->fifo[0].bytes);
				report(im, "send to", p, msg);
				hit->state = ST_FAILED;
			} else {
				hit->state = ST_MATCHED;
				hit->seq = pe->seq++;
			}
			memmove(pe->fifo, pe->fifo + 1, sizeof *pe->fifo * (size_t)(pe->n_fifo - 1));
			pe->n_fifo--;
		}
		/* listen for more while sends still wait for theirs */
		int waiting = 0;
		for (nop_t *op = im->ops; op; op = op->next)
			waiting += op->kind == OP_SEND && op->peer == p && op->state == ST_WAIT_CTS;
		if (!pe->ctrl_posted && waiting > pe->n_fifo) {
			if (im->inner.ops->irecv(&im->inner, &pe->ctrl_buf, sizeof pe->ctrl_buf, p,
					    CTRL_TAG, &pe->ctrl_req))
				return -1;
			pe->ctrl_posted = 1;
		}
		chan_poll(im, &pe->out, p);
		chan_poll(im, &pe->in, p);
	}
	/* launch: sends in clear-to-send order, receives in posting order */
	for (int p = 0; p < n; p++) {
		peer_t *pe = &im->peers[p];
		nop_t *batch[64];
		int nb = 0;
		if (pe->out.ready && pe->out.comm) {
			for (;;) {
				nop_t *first = NULL;
				for (nop_t *op = im->ops; op; op = op->next)
					if (op->kind == OP_SEND && op->peer == p &&
					    op->state == ST_MATCHED && (!first || op->seq < first->seq))
						first = op;
				if (!first || nb == 64)
					break;
				first->state = ST_WAIT_CHAN; /* taken */
				batch[nb++] = first;
			}
			if (nb)
				launch(im, &pe->out, batch, nb, p);
		}
		nb = 0;
		if (pe->in.ready && pe->in.comm) {
			for (nop_t *op = im->ops; op && nb < 64; op = op->next)
				if (op->kind == OP_RECV && op->peer == p && op->state == ST_WAIT_CHAN)
					batch[nb++] = op;
			if (nb)
				launch(im, &pe->in, batch, nb, p);
		}
	}
	/* completions */
	for (nop_t *op = im->ops; op; op = op->next) {
		if (op->kind == OP_RECV && op->cts_req.kind) {
			int done = 0;
			if (im->inner.ops->test(&im->inner, &op->cts_req, &done))
				return -1;
		}
		if (op->state != ST_LAUNCHED)
			continue;
		cudaError_t e = cudaEventQuery(op->ev);
		if (e == cudaSuccess) {
			op->state = ST_DONE;
			continue;
		}
		char desc[96];
		if (e != cudaErrorNotReady) {
			report(im, op_desc(op, desc, sizeof desc), -1, cudaGetErrorString(e));
			op->state = ST_FAILED;
			continue;
		}
		ncclComm_t comm = op_comm(im, op);
		ncclResult_t st = ncclSuccess;
		if (comm && ncclCommGetAsyncError(comm, &st) == ncclSuccess && st != ncclSuccess &&
		    st != ncclInProgress) {
			report_nccl(im, op_desc(op, desc, sizeof desc), -1, comm, st);
			ncclCommAbort(comm);
			if (op->kind == OP_ALLREDUCE)
				im->groups[op->group].comm = NULL;
			else {
				op_chan(im, op)->comm = NULL;
				op_chan(im, op)->failed = 1;
			}
			for (nop_t *o = im->ops; o; o = o->next)
				if (o->state == ST_LAUNCHED && op_comm(im, o) == NULL)
					o->state = ST_FAILED;
			op->state = ST_FAILED;
		}
	}
	return 0;
}

/* ---- rt_comm_t entry points ---- */

static int n_isend(rt_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
		   rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	if (!im->started || peer < 0 || peer >= c->nranks || peer == c->rank ||
	    im->peers[peer].out.failed)
		return -1;
	nop_t *op = op_new(im, OP_SEND, peer, tag, (void *)buf, bytes);
	if (!op)
		return -1;
	op->state = ST_WAIT_CTS;
	*req = (rt_req_t){REQ_NCCL, op, peer, tag};
	return progress(im);
}

static int n_irecv(rt_comm_t *c, void *buf, size_t bytes, int peer, int tag, rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	if (!im->started || peer < 0 || peer >= c->nranks || peer == c->rank)
		return -1;
	peer_t *pe = &im->peers[peer];
	if (pe->in.failed)
		return -1;
	nop_t *op = op_new(im, OP_RECV, peer, tag, buf, bytes);
	if (!op)
		return -1;
	memset(&op->cts, 0, sizeof op->cts);
	op->cts.tag = tag;
	op->cts.bytes = (int64_t)bytes;
	if (!pe->in.comm) {
		ncclResult_t r = ncclGetUniqueId(&op->cts.id);
		if (r != ncclSuccess) {
			report_nccl(im, "making a unique id for the channel from", peer, NULL, r);
			op_free(im, op);
			return -1;
		}
		op->cts.fresh = 1;
		if (chan_create(im, &pe->in, op->cts.id, 1, peer)) {
			op_free(im, op);
			return -1;
		}
	}
	op->state = ST_WAIT_CHAN;
	/* the receive is enqueued (progress) before the sender can match it */
	if (im->inner.ops->isend(&im->inner, &op->cts, sizeof op->cts, peer, CTRL_TAG,
				 &op->cts_req)) {
		op_free(im, op);
		return -1;
	}
	*req = (rt_req_t){REQ_NCCL, op, peer, tag};
	return progress(im);
}

static int n_group(rt_comm_t *c, const int *ranks, int n, int *out)
{
	nccl_impl_t *im = impl(c);
	int member = comm_member(c, ranks, n);
	*out = -1;
	group_t g = {NULL, NULL};
	if (n > 1) {
		if (!im->started || !im->world)
			return -1;
		ncclConfig_t cfg = nb_config();
		ncclResult_t r = ncclCommSplit(im->world, member ? 0 : NCCL_SPLIT_NOCOLOR, c->rank,
					       &g.comm, &cfg);
		if (r != ncclSuccess && r != ncclInProgress) {
			report_nccl(im, "splitting a sync group from the world communicator", -1,
				    im->world, r);
			return -1;
		}
		if (wait_comm(im, &im->world, "splitting a sync group", -1))
			return -1;
		if (g.comm && wait_comm(im, &g.comm, "creating a sync group", -1))
			return -1;
		if (member && !g.comm)
			return -1;
		if (g.comm && cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking) !=
				      cudaSuccess) {
			report(im, "creating a sync group stream", -1,
			       cudaGetErrorString(cudaGetLastError()));
			return -1;
		}
	}
	if (!member)
		return 0;
	if (SP_PUSH(im->groups, im->n_groups, im->cap_groups, g))
		return -1;
	*out = im->n_groups - 1;
	return 0;
}

static int n_iallreduce(rt_comm_t *c, float *buf, int64_t n, int group, rt_req_t *req)
{
	nccl_impl_t *im = impl(c);
	if (group < 0 || group >= im->n_groups)
		return -1;
	group_t *g = &im->groups[group];
	if (!g->comm) {
		/* a group of one: the sum is the buffer itself */
		*req = (rt_req_t){0, NULL, -1, group};
		return 0;
	}
	nop_t *op = op_new(im, OP_ALLREDUCE, -1, group, buf, sizeof(float) * (size_t)n);
	if (!op)
		return -1;
	op->group = group;
	if (after_compute(im, g->stream)) {
		op_free(im, op);
		return -1;
	}
	ncclResult_t r = ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, g->comm, g->stream);
	if (r == ncclInProgress)
		r = wait_comm(im, &g->comm, "enqueueing an all-reduce", -1) ? ncclInternalError
									    : ncclSuccess;
	if (r != ncclSuccess) {
		if (g->comm) {
			report_nccl(im, "enqueueing an all-reduce", -1, g->comm, r);
			ncclCommAbort(g->comm);
			g->comm = NULL;
		}
		op_free(im, op);
		return -1;
	}
	if (cudaEventRecord(op->ev, g->stream) != cudaSuccess) {
		report(im, "recording an event for an all-reduce", -1,
		       cudaGetErrorString(cudaGetLastError()));
		op_free(im, op);
		return -1;
	}
	op->state = ST_LAUNCHED;
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
	if (progress(im))
		return -1;
	nop_t *op = req->impl;
	if (op->state == ST_FAILED)
		return -1;
	if (op->state != ST_DONE || (op->kind == OP_RECV && op->cts_req.kind))
		return 0;
	op_free(im, op);
	*req = (rt_req_t){0, NULL, -1, -1};
	*done = 1;
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

/* Every communicator of this rank, for teardown. */
static int all_comms(nccl_impl_t *im, ncclComm_t **out)
{
	int n = 0;
	for (int p = 0; im->peers && p < im->inner.nranks; p++) {
		out[n++] = &im->peers[p].out.comm;
		out[n++] = &im->peers[p].in.comm;
	}
	for (int i = 0; i < im->n_groups; i++)
		out[n++] = &im->groups[i].comm;
	out[n++] = &im->world;
	return n;
}

/*
 * Ends every communicator. Gracefully: finalize all first (finalizing
 * waits for the peers to finalize theirs too, so waiting on one before
 * starting the next could deadlock), then wait for each and destroy it.
 * Hard (abort, or work still in flight): ncclCommAbort each.
 */
static void teardown(nccl_impl_t *im, int hard)
{
	for (nop_t *op = im->ops; op; op = op->next)
		hard |= op->state == ST_LAUNCHED;
	ncclComm_t **cs = malloc(sizeof *cs * (size_t)(2 * im->inner.nranks + im->n_groups + 1));
	int n = cs ? all_comms(im, cs) : 0;
	hard |= !cs;
	for (int i = 0; i < n; i++)
		if (*cs[i] && !hard) {
			ncclResult_t r = ncclCommFinalize(*cs[i]);
			if (r != ncclSuccess && r != ncclInProgress) {
				ncclCommAbort(*cs[i]);
				*cs[i] = NULL;
			}
		}
	for (int i = 0; i < n; i++) {
		if (!*cs[i])
			continue;
		if (hard) {
			ncclCommAbort(*cs[i]);
		} else {
			if (wait_comm(im, cs[i], "finalizing a communicator", -1))
				continue; /* aborted */
			ncclCommDestroy(*cs[i]);
		}
		*cs[i] = NULL;
	}
	free(cs);
	for (int p = 0; im->peers && p < im->inner.nranks; p++) {
		chan_t *ch[2] = {&im->peers[p].out, &im->peers[p].in};
		for (int k = 0; k < 2; k++) {
			if (ch[k]->stream)
				cudaStreamDestroy(ch[k]->stream);
			ch[k]->stream = NULL;
		}
		free(im->peers[p].fifo);
		im->peers[p].fifo = NULL;
	}
	for (int i = 0; i < im->n_groups; i++)
		if (im->groups[i].stream)
			cudaStreamDestroy(im->groups[i].stream);
	im->n_groups = 0;
	while (im->ops)
		op_free(im, im->ops);
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

static void n_finalize(rt_comm_t *c)
{
	nccl_impl_t *im = impl(c);
	teardown(im, 0);
	rt_comm_t inner = im->inner;
	free(im->peers);
	free(im->groups);
	free(im);
	*c = inner;
	c->ops->finalize(c);
}

static const rt_comm_ops_t nccl_ops = {
	.group_create = n_group, .isend = n_isend, .irecv = n_irecv,
	.iallreduce = n_iallreduce, .test = n_test, .allsum = n_allsum, .gather = n_gather,
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
	im->peers = calloc((size_t)c->nranks, sizeof *im->peers);
	if (!im->peers) {
		free(im);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
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
			report_nccl(im, "ncclGetUniqueId", -1, NULL, r);
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
	if (cudaEventCreateWithFlags(&im->ready_ev, cudaEventDisableTiming) != cudaSuccess)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "rank %d: cudaEventCreate: %s",
				  c->rank, cudaGetErrorString(cudaGetLastError()));
	ncclConfig_t cfg = nb_config();
	ncclResult_t r = ncclCommInitRankConfig(&im->world, n, id, c->rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress) {
		report_nccl(im, "creating the world communicator", -1, NULL, r);
		im->world = NULL;
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d on %s: creating the NCCL world communicator failed",
				  c->rank, im->host);
	}
	if (wait_comm(im, &im->world, "creating the world communicator", -1))
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d on %s: creating the NCCL world communicator failed",
				  c->rank, im->host);
	im->started = 1;
	return 0;
}
