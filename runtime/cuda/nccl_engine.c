/*
 * cuda/nccl_engine.c — the NCCL data plane's decisions (see nccl_engine.h
 * for the deadlock-freedom argument). Point-to-point keeps MPI's semantics
 * (sends never block the sender's later receives; messages match by tag)
 * although NCCL has neither tags nor independent operations on one
 * communicator:
 *   - each direction of a pair has its own two-rank communicator (sender
 *     is its rank 0) and stream;
 *   - receives drive the order: ne_irecv sends the sender a clear-to-send
 *     {tag, bytes} over the host comm (tag NE_CTRL_TAG) and enqueues its
 *     receive; the sender enqueues its sends in the order the clear-to-send
 *     messages arrive, matched by tag (the head of the queue waits for its
 *     send), so both sides of a channel enqueue the same sequence.
 * Operation states: WAIT_CTS (send without its clear-to-send) → READY →
 * ENQUEUING (group end returned pending; its communicator is busy and
 * gets no other call until its status is OK) → LAUNCHED (event recorded)
 * → DONE, or FAILED. Every state is left by ne_progress only; nothing
 * here loops waiting for anything but the start-up helper in comm_nccl.c.
 */
#include "nccl_engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NE_CTRL_TAG 32767
#define NE_BATCH 64

/* ---- layout: what a plan needs ---- */

static int cmp_pair(const void *a, const void *b)
{
	const int *x = a, *y = b;
	return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Every pair that carries data, unsorted: each SEND's {device, peer},
 * then each split layer's {owner of shard j >= 1, owner of shard 0}
 * (pack.c's join) where they differ. chans NULL: only counts them. */
static int data_pairs(const sp_plan_t *p, int (*chans)[2])
{
	int n = 0;
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			if (in->op == INS_SEND && chans) {
				chans[n][0] = d;
				chans[n][1] = in->peer;
			}
			n += in->op == INS_SEND;
		}
	for (int b = 0; b < p->n_buckets; b++)
		for (int q = 0; q < p->buckets[b].n_params; q++) {
			const sp_param_t *pr = &p->bucket_params[p->buckets[b].param_off + q];
			int oj = p->bucket_devs[p->buckets[b].dev_off];
			int o0 = pr->tp > 1 && pr->tp_rank > 0
					 ? plan_shard_owner(p, pr->comp, pr->layer, 0, NULL)
					 : -1;
			if (o0 < 0 || o0 == oj)
				continue;
			if (chans) {
				chans[n][0] = oj;
				chans[n][1] = o0;
			}
			n++;
		}
	return n;
}

int ne_layout_init(ne_layout_t *out, const sp_plan_t *p)
{
	memset(out, 0, sizeof *out);
	out->n_buckets = p->n_buckets;
	out->buckets = p->buckets;
	out->bucket_devs = p->bucket_devs;
	out->slice_devs = p->slice_devs;
	if (plan_tp_groups(p, &out->tps, &out->n_tps, NULL))
		return -1;
	int n = data_pairs(p, NULL);
	if (!n)
		return 0;
	out->chans = malloc(sizeof *out->chans * (size_t)n);
	if (!out->chans) {
		ne_layout_release(out);
		return -1;
	}
	data_pairs(p, out->chans);
	qsort(out->chans, (size_t)n, sizeof *out->chans, cmp_pair);
	int u = 0;
	for (int i = 0; i < n; i++)
		if (!u || cmp_pair(out->chans[i], out->chans[u - 1])) {
			out->chans[u][0] = out->chans[i][0];
			out->chans[u++][1] = out->chans[i][1];
		}
	out->n_chans = u;
	return 0;
}

void ne_layout_release(ne_layout_t *l)
{
	free(l->chans);
	free(l->tps);
	l->chans = NULL;
	l->tps = NULL;
	l->n_chans = l->n_tps = 0;
}

/* ---- messages ---- */

static void report(ne_engine_t *e, const char *what, int peer, const char *detail)
{
	if (peer >= 0)
		fprintf(stderr, "spindle-run: rank %d on %s: nccl: %s rank %d: %s\n", e->rank,
			e->hostname, what, peer, detail);
	else
		fprintf(stderr, "spindle-run: rank %d on %s: nccl: %s: %s\n", e->rank,
			e->hostname, what, detail);
	fflush(stderr);
}

/* "sync group 2" or "tensor-parallel group 0" (this rank's numbering) */
static const char *group_desc(const ne_engine_t *e, const ne_chan_t *ch, char *buf, size_t n)
{
	int g = (int)(ch - e->groups);
	snprintf(buf, n, "%s group %d", g < e->n_sync ? "sync" : "tensor-parallel",
		 g < e->n_sync ? g : g - e->n_sync);
	return buf;
}

/* "send to rank 3 (tag 17)", "all-reduce of sync group 2" */
static const char *op_desc(const ne_engine_t *e, const ne_op_t *op, char *buf, size_t n)
{
	static const char *const coll[] = {"all-reduce", "reduce-scatter", "all-gather",
					   "all-gather of parts"};
	char g[48];
	if (op->kind >= OP_ALLREDUCE)
		snprintf(buf, n, "%s of %s", coll[op->kind - OP_ALLREDUCE],
			 group_desc(e, op->ch, g, sizeof g));
	else
		snprintf(buf, n, "%s rank %d (tag %d)", op->kind == OP_SEND ? "send to" : "receive from",
			 op->peer, op->tag);
	return buf;
}

/* Aborts ch's communicator and fails every operation on it. */
static void chan_fail(ne_engine_t *e, ne_chan_t *ch, const char *what, int peer,
		      const char *detail)
{
	char msg[400];
	snprintf(msg, sizeof msg, "%s; aborting the communicator", detail);
	report(e, what, peer, msg);
	if (ch->comm)
		e->pr->abort(e->ctx, ch->comm);
	ch->comm = NULL;
	ch->busy = 0;
	ch->failed = 1;
	for (ne_op_t *op = e->ops; op; op = op->next)
		if (op->ch == ch && op->state != ST_DONE)
			op->state = ST_FAILED;
}

static const char *why(ne_engine_t *e, void *comm)
{
	const char *w = e->pr->why(e->ctx, comm);
	return w && *w ? w : "error";
}

/* ---- operations ---- */

static ne_op_t *op_new(ne_engine_t *e, int kind, int peer, int tag, void *buf, size_t bytes,
		       ne_chan_t *ch)
{
	ne_op_t *op = malloc(sizeof *op);
	if (!op)
		return NULL;
	*op = (ne_op_t){.kind = kind, .peer = peer, .tag = tag, .buf = buf, .bytes = bytes,
			.ch = ch, .t0 = e->pr->now(e->ctx)};
	if (e->pr->event_new(e->ctx, &op->ev)) {
		free(op);
		return NULL;
	}
	ne_op_t **tail = &e->ops;
	while (*tail)
		tail = &(*tail)->next;
	*tail = op;
	return op;
}

static void op_free(ne_engine_t *e, ne_op_t *op)
{
	for (ne_op_t **p = &e->ops; *p; p = &(*p)->next)
		if (*p == op) {
			*p = op->next;
			break;
		}
	e->pr->event_free(e->ctx, op->ev);
	ne_pad_drop(e, op);
	free(op->parts);
	free(op);
}


static int op_call(ne_engine_t *e, ne_op_t *op)
{
	const ne_prims_t *pr = e->pr;
	ne_chan_t *ch = op->ch;
	if (op->kind == OP_ALLREDUCE)
		return pr->allreduce(e->ctx, op->buf, op->bytes / sizeof(float), ch->comm,
				     ch->stream);
	if (op->kind == OP_RSCATTER || op->kind == OP_AGATHER || op->kind == OP_AGATHERV)
		return ne_shard_call(e, op);
	/* two-rank channels: the sender is rank 0, the receiver rank 1 */
	if (op->kind == OP_SEND)
		return pr->send(e->ctx, op->buf, op->bytes, 1, ch->comm, ch->stream);
	return pr->recv(e->ctx, op->buf, op->bytes, 0, ch->comm, ch->stream);
}

/* Records the events of ch's enqueued operations: they are launched. */
static void launched(ne_engine_t *e, ne_chan_t *ch)
{
	for (ne_op_t *op = e->ops; op; op = op->next) {
		if (op->ch != ch || op->state != ST_ENQUEUING)
			continue;
		if (op->pad && ne_stage_out(e, op)) {
			char desc[96];
			report(e, op_desc(e, op, desc, sizeof desc), -1,
			       "copying out of the padded scratch failed");
			op->state = ST_FAILED;
			continue;
		}
		if (ne_padded(op) && ++op->round < op->rounds) {
			op->state = ST_READY; /* its next round, before anything after it */
			continue;
		}
		if (e->pr->record(e->ctx, op->ev, ch->stream)) {
			char desc[96];
			report(e, op_desc(e, op, desc, sizeof desc), -1, "recording an event failed");
			op->state = ST_FAILED;
			continue;
		}
		op->state = ST_LAUNCHED;
	}
}

/*
 * Enqueues ops[0..n) (all on ch, which is idle) as one group. A pending
 * group end leaves them ENQUEUING and ch busy: ne_progress polls it.
 */
static void enqueue(ne_engine_t *e, ne_chan_t *ch, ne_op_t **ops, int n)
{
	const ne_prims_t *pr = e->pr;
	char desc[96];
	/* a padded op's later round follows its first on ch's stream, which
	 * waited for the compute before it: waiting again would put the round
	 * behind compute queued since (later backward layers) */
	int first = 0;
	for (int i = 0; i < n; i++)
		first |= !(ne_padded(ops[i]) && ops[i]->round > 0);
	int r = first && pr->after_compute(e->ctx, ch->stream) ? NE_ERR : NE_OK;
	for (int i = 0; i < n && r == NE_OK; i++)
		if (ne_padded(ops[i]))
			r = ne_stage_in(e, ops[i]) ? NE_ERR : NE_OK;
	if (r == NE_OK)
		r = pr->group_start(e->ctx);
	if (r == NE_OK) {
		for (int i = 0; i < n && r == NE_OK; i++)
			r = op_call(e, ops[i]);
		int r2 = pr->group_end(e->ctx);
		if (r == NE_OK)
			r = r2;
	}
	for (int i = 0; i < n; i++)
		ops[i]->state = ST_ENQUEUING;
	if (r == NE_ERR) {
		chan_fail(e, ch, op_desc(e, ops[0], desc, sizeof desc), -1, why(e, ch->comm));
		return;
	}
	if (r == NE_PENDING) {
		ch->busy = 1;
		ch->t_busy = pr->now(e->ctx);
		return;
	}
	launched(e, ch);
}

/* A busy communicator: done enqueueing, failed, or still at it. what: the
 * message's subject (NULL: ch is a group, named by group_desc). */
static void poll_busy(ne_engine_t *e, ne_chan_t *ch, int peer, const char *what)
{
	if (!ch->busy || !ch->comm)
		return;
	char d[48];
	if (!what)
		what = group_desc(e, ch, d, sizeof d);
	int st = e->pr->status(e->ctx, ch->comm);
	if (st == NE_OK) {
		ch->busy = 0;
		launched(e, ch);
	} else if (st == NE_ERR) {
		chan_fail(e, ch, what, peer, why(e, ch->comm));
	} else if (e->pr->now(e->ctx) - ch->t_busy > e->timeout_s) {
		chan_fail(e, ch, what, peer, "enqueueing timed out");
	}
}

/* ---- clear-to-send ---- */

/* Receives, queues and matches peer p's clear-to-send messages. */
static int control(ne_engine_t *e, int p)
{
	ne_peer_t *pe = &e->peers[p];
	rt_comm_t *h = e->host;
	if (pe->ctrl_posted) {
		int done = 0;
		if (h->ops->test(h, &pe->ctrl_req, &done))
			return -1;
		if (done) {
			pe->ctrl_posted = 0;
			if (SP_PUSH(pe->fifo, pe->n_fifo, pe->cap_fifo, pe->ctrl_buf))
				return -1;
		}
	}
	/* in arrival order: the head waits until its send is posted */
	while (pe->n_fifo > 0) {
		ne_op_t *hit = NULL;
		for (ne_op_t *op = e->ops; op && !hit; op = op->next)
			if (op->kind == OP_SEND && op->peer == p && op->state == ST_WAIT_CTS &&
			    op->tag == pe->fifo[0].tag)
				hit = op;
		if (!hit)
			break;
		if ((int64_t)hit->bytes != pe->fifo[0].bytes) {
			char msg[160];
			snprintf(msg, sizeof msg,
				 "size mismatch on tag %d: sending %zu bytes, the receiver expects "
				 "%lld",
				 hit->tag, hit->bytes, (long long)pe->fifo[0].bytes);
			report(e, "send to", p, msg);
			hit->state = ST_FAILED;
		} else {
			hit->state = ST_READY;
			hit->seq = pe->seq++;
		}
		memmove(pe->fifo, pe->fifo + 1, sizeof *pe->fifo * (size_t)(pe->n_fifo - 1));
		pe->n_fifo--;
	}
	/* listen for more while sends still wait for theirs */
	int waiting = 0;
	for (ne_op_t *op = e->ops; op; op = op->next)
		waiting += op->kind == OP_SEND && op->peer == p && op->state == ST_WAIT_CTS;
	if (!pe->ctrl_posted && waiting > pe->n_fifo) {
		if (h->ops->irecv(h, &pe->ctrl_buf, sizeof pe->ctrl_buf, p, NE_CTRL_TAG,
				  &pe->ctrl_req))
			return -1;
		pe->ctrl_posted = 1;
	}
	return 0;
}

/* ---- launching ---- */

/* Ready operations of one kind on ch, taken in order: sends by their
 * clear-to-send order, receives and group collectives (kind OP_ALLREDUCE
 * stands for all three) by posting order. */
static int ready_batch(ne_engine_t *e, ne_chan_t *ch, int kind, ne_op_t **batch)
{
	int nb = 0;
	if (!ch->comm || ch->busy || ch->failed)
		return 0;
	while (nb < NE_BATCH) {
		ne_op_t *first = NULL;
		for (ne_op_t *op = e->ops; op; op = op->next)
			if (op->ch == ch && SP_MIN(op->kind, OP_ALLREDUCE) == kind &&
			    op->state == ST_READY &&
			    (!first || op->seq < first->seq))
				first = op;
		if (!first)
			break;
		first->state = ST_ENQUEUING; /* taken */
		batch[nb++] = first;
		/* a padded round ends its group: its copy out must follow its
		 * call, and the next round's copy in reuses the stream's pool */
		if (ne_padded(first))
			break;
	}
	return nb;
}

static void launch_all(ne_engine_t *e)
{
	ne_op_t *batch[NE_BATCH];
	/* receives first: nothing blocks, but a receive never waits behind a send */
	for (int p = 0; p < e->nranks; p++) {
		int nb = ready_batch(e, &e->peers[p].in, OP_RECV, batch);
		if (nb)
			enqueue(e, &e->peers[p].in, batch, nb);
	}
	for (int p = 0; p < e->nranks; p++) {
		int nb = ready_batch(e, &e->peers[p].out, OP_SEND, batch);
		if (nb)
			enqueue(e, &e->peers[p].out, batch, nb);
	}
	for (int g = 0; g < e->n_groups; g++) {
		int nb = ready_batch(e, &e->groups[g], OP_ALLREDUCE, batch);
		if (nb)
			enqueue(e, &e->groups[g], batch, nb);
	}
}

/* Launched operations: complete, failed, or timed out. */
static int complete_all(ne_engine_t *e)
{
	double now = e->pr->now(e->ctx);
	for (ne_op_t *op = e->ops; op; op = op->next) {
		char desc[96];
		if (op->kind == OP_RECV && op->cts_req.kind) {
			int done = 0;
			if (e->host->ops->test(e->host, &op->cts_req, &done))
				return -1;
		}
		if (op->state == ST_LAUNCHED) {
			int q = e->pr->query(e->ctx, op->ev);
			if (q == NE_OK) {
				op->state = ST_DONE;
				continue;
			}
			if (q == NE_ERR || (op->ch->comm && e->pr->status(e->ctx, op->ch->comm) ==
								    NE_ERR)) {
				chan_fail(e, op->ch, op_desc(e, op, desc, sizeof desc), -1,
					  why(e, op->ch->comm));
				continue;
			}
		}
		if (op->state != ST_DONE && op->state != ST_FAILED && now - op->t0 > e->timeout_s) {
			char msg[96];
			snprintf(msg, sizeof msg, "timed out after %g s", e->timeout_s);
			chan_fail(e, op->ch, op_desc(e, op, desc, sizeof desc), -1, msg);
		}
	}
	return 0;
}

int ne_progress(ne_engine_t *e)
{
	for (int p = 0; p < e->nranks; p++) {
		if (p != e->rank && control(e, p))
			return -1;
		poll_busy(e, &e->peers[p].in, p, "receiving from");
		poll_busy(e, &e->peers[p].out, p, "sending to");
	}
	for (int g = 0; g < e->n_groups; g++)
		poll_busy(e, &e->groups[g], -1, NULL);
	launch_all(e);
	return complete_all(e);
}

/* ---- entry points ---- */

ne_engine_t *ne_new(const ne_prims_t *pr, void *ctx, rt_comm_t *host, void *world,
		    void *warm, double timeout_s, const char *hostname)
{
	ne_engine_t *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->peers = calloc((size_t)host->nranks, sizeof *e->peers);
	if (!e->peers) {
		free(e);
		return NULL;
	}
	e->pr = pr;
	e->ctx = ctx;
	e->host = host;
	e->rank = host->rank;
	e->nranks = host->nranks;
	e->world = world;
	e->warm = warm;
	e->timeout_s = timeout_s;
	e->pad_cap = NE_PAD_CAP_DEFAULT;
	snprintf(e->hostname, sizeof e->hostname, "%s", hostname ? hostname : "?");
	return e;
}

static int post_ok(const ne_engine_t *e, int peer)
{
	return e->prepared && peer >= 0 && peer < e->nranks && peer != e->rank;
}

int ne_isend(ne_engine_t *e, const void *buf, size_t bytes, int peer, int tag, ne_op_t **out)
{
	*out = NULL;
	if (!post_ok(e, peer) || !e->peers[peer].out.comm) {
		report(e, "sending to", peer, "no channel to that rank was made at start-up");
		return -1;
	}
	ne_op_t *op = op_new(e, OP_SEND, peer, tag, (void *)buf, bytes, &e->peers[peer].out);
	if (!op)
		return -1;
	op->state = ST_WAIT_CTS;
	*out = op;
	return ne_progress(e);
}

int ne_irecv(ne_engine_t *e, void *buf, size_t bytes, int peer, int tag, ne_op_t **out)
{
	*out = NULL;
	if (!post_ok(e, peer) || !e->peers[peer].in.comm) {
		report(e, "receiving from", peer, "no channel from that rank was made at start-up");
		return -1;
	}
	ne_op_t *op = op_new(e, OP_RECV, peer, tag, buf, bytes, &e->peers[peer].in);
	if (!op)
		return -1;
	op->cts = (cts_t){tag, 0, (int64_t)bytes};
	op->state = ST_READY;
	if (e->host->ops->isend(e->host, &op->cts, sizeof op->cts, peer, NE_CTRL_TAG,
				&op->cts_req)) {
		op_free(e, op);
		return -1;
	}
	*out = op;
	return ne_progress(e);
}

static int ne_coll(ne_engine_t *e, int kind, float *buf, int64_t n, int g, ne_op_t **out)
{
	*out = NULL;
	if (g < 0 || g >= e->n_groups)
		return -1;
	if (!e->groups[g].comm) /* a group of one: buf is already the result */
		return e->groups[g].failed ? -1 : 0;
	ne_op_t *op = op_new(e, kind, -1, g, buf, sizeof(float) * (size_t)n, &e->groups[g]);
	if (!op)
		return -1;
	if (kind != OP_ALLREDUCE)
		ne_how_shard(e, op);
	op->state = ST_READY;
	*out = op;
	return ne_progress(e);
}

int ne_iallreduce(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out)
{
	return ne_coll(e, OP_ALLREDUCE, buf, n, g, out);
}

int ne_ireduce_scatter(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out)
{
	return ne_coll(e, OP_RSCATTER, buf, n, g, out);
}

int ne_iallgather(ne_engine_t *e, float *buf, int64_t n, int g, ne_op_t **out)
{
	return ne_coll(e, OP_AGATHER, buf, n, g, out);
}

int ne_iallgatherv(ne_engine_t *e, float *buf, int k, const int64_t *cnt, const int64_t *off,
		   int g, ne_op_t **out)
{
	int64_t n = 0;
	*out = NULL;
	if (g < 0 || g >= e->n_groups || k != e->groups[g].size)
		return -1;
	for (int i = 0; i < k; i++) {
		if (cnt[i] < 0 || off[i] < 0)
			return -1;
		n = SP_MAX(n, cnt[i] ? off[i] + cnt[i] : 0);
	}
	if (!e->groups[g].comm)
		return e->groups[g].failed ? -1 : 0;
	int64_t *parts = malloc(sizeof(int64_t) * 2 * (size_t)k);
	if (!parts)
		return -1;
	memcpy(parts, cnt, sizeof(int64_t) * (size_t)k);
	memcpy(parts + k, off, sizeof(int64_t) * (size_t)k);
	ne_op_t *op = op_new(e, OP_AGATHERV, -1, g, buf, sizeof(float) * (size_t)n, &e->groups[g]);
	if (!op) {
		free(parts);
		return -1;
	}
	op->parts = parts;
	ne_how_shard(e, op);
	op->state = ST_READY;
	*out = op;
	return ne_progress(e);
}

int ne_test(ne_engine_t *e, ne_op_t *op, int *done)
{
	*done = 0;
	if (!op) {
		*done = 1;
		return 0;
	}
	if (ne_progress(e))
		return -1;
	if (op->state == ST_FAILED)
		return -1;
	if (op->state != ST_DONE || (op->kind == OP_RECV && op->cts_req.kind))
		return 0;
	op_free(e, op);
	*done = 1;
	return 0;
}

void *ne_op_gathers(const ne_op_t *op)
{
	return op && (op->kind == OP_AGATHER || op->kind == OP_AGATHERV) ? op->buf : NULL;
}

void ne_stats(const ne_engine_t *e, ne_stats_t *out)
{
	*out = e->stats;
}

int ne_live(const ne_engine_t *e)
{
	int n = 0;
	for (const ne_op_t *op = e->ops; op; op = op->next)
		n += op->state != ST_DONE;
	return n;
}

/* ---- start-up: communicators in one global order ---- */

/*
 * Item i of the global order: [0, nb) split bucket i, [nb, nb + nt) split
 * tensor-parallel group i - nb, [nb + nt, nb + nt + nc) split channel
 * i - nb - nt, then the same again for the warm-up. Returns whether the
 * item needs a communicator; *key: this rank's rank in it (a bucket's
 * members ascending, a group's in member order, a channel's sender 0);
 * *ch: where it lives on this rank (NULL when not a member).
 */
static int prep_item(ne_engine_t *e, const ne_layout_t *l, int i, int *key, ne_chan_t **ch,
		     int *peer)
{
	int nb = l->n_buckets, nt = l->n_tps;
	*ch = NULL;
	*key = e->rank;
	*peer = -1;
	if (i < nb + nt) {
		int g = e->item_group[i];
		if (g >= 0)
			*ch = &e->groups[g];
		if (i >= nb)
			for (int j = 0; j < l->tps[i - nb].t; j++)
				if (l->slice_devs[l->tps[i - nb].off + j] == e->rank)
					*key = j;
		return i < nb ? l->buckets[i].n_dev > 1 : l->tps[i - nb].t > 1;
	}
	const int *c = l->chans[i - nb - nt];
	if (c[0] == e->rank) {
		*ch = &e->peers[c[1]].out;
		*key = 0;
		*peer = c[1];
	} else if (c[1] == e->rank) {
		*ch = &e->peers[c[0]].in;
		*key = 1;
		*peer = c[0];
	}
	return 1;
}

/* Whether this rank is among devs[0..n). */
static int among(const ne_engine_t *e, const int32_t *devs, int n)
{
	for (int q = 0; q < n; q++)
		if (devs[q] == e->rank)
			return 1;
	return 0;
}

/* The groups table from the layout: one entry per bucket with this rank,
 * then one per tensor-parallel group with it. */
static int prep_groups(ne_engine_t *e, const ne_layout_t *l)
{
	int n = l->n_buckets + l->n_tps;
	e->item_group = malloc(sizeof(int) * (size_t)(n + 1));
	e->groups = calloc((size_t)n + 1, sizeof *e->groups);
	if (!e->item_group || !e->groups)
		return -1;
	e->n_items = n;
	for (int i = 0; i < n; i++) {
		int tp = i >= l->n_buckets;
		const sp_bucket_t *bu = tp ? NULL : &l->buckets[i];
		const sp_tp_group_t *g = tp ? &l->tps[i - l->n_buckets] : NULL;
		int size = tp ? g->t : bu->n_dev;
		e->item_group[i] = -1;
		const int32_t *devs = tp ? l->slice_devs + g->off : l->bucket_devs + bu->dev_off;
		if (among(e, devs, size)) {
			/* its rank: a bucket's split key is the world rank (members
			 * ascending), a group's its member index (prep_item) */
			int me = 0;
			for (int j = 0; j < size; j++)
				if (tp ? devs[j] == e->rank : devs[j] < e->rank)
					me = tp ? j : me + 1;
			e->groups[e->n_groups].size = size;
			e->groups[e->n_groups].me = me;
			e->item_group[i] = e->n_groups++;
		}
		if (!tp)
			e->n_sync = e->n_groups;
	}
	return 0;
}

/* One step of a split item: issue it, then poll it until OK. */
static int prep_split(ne_engine_t *e, int needed, int key, ne_chan_t *ch, int peer)
{
	const ne_prims_t *pr = e->pr;
	if (!needed)
		return NE_OK;
	if (!e->prep_sub) {
		if (pr->split(e->ctx, e->world, ch ? 0 : -1, key, &e->prep_comm) == NE_ERR) {
			report(e, "splitting a communicator from the world", peer, why(e, e->world));
			return NE_ERR;
		}
		e->prep_sub = 1;
		e->prep_t0 = pr->now(e->ctx);
	}
	int s = pr->status(e->ctx, e->world);
	if (s == NE_OK && e->prep_comm)
		s = pr->status(e->ctx, e->prep_comm);
	if (s == NE_ERR || (s == NE_PENDING && pr->now(e->ctx) - e->prep_t0 > e->timeout_s)) {
		report(e, "creating the communicator with", peer,
		       s == NE_ERR ? why(e, e->prep_comm ? e->prep_comm : e->world)
				   : "timed out; aborting it");
		if (e->prep_comm)
			pr->abort(e->ctx, e->prep_comm);
		e->prep_comm = NULL;
		return NE_ERR;
	}
	if (s == NE_PENDING)
		return NE_PENDING;
	if (ch) {
		ch->comm = e->prep_comm;
		if (pr->stream_new(e->ctx, &ch->stream)) {
			report(e, "creating a stream for the communicator with", peer, "failed");
			return NE_ERR;
		}
	}
	e->prep_comm = NULL;
	return NE_OK;
}

/* One step of a warm-up item: a 4-byte operation on a new communicator. */
static int prep_warm(ne_engine_t *e, int key, ne_chan_t *ch, int peer)
{
	if (!ch || !ch->comm)
		return NE_OK;
	if (!e->prep_sub) {
		int kind = peer < 0 ? OP_ALLREDUCE : key == 0 ? OP_SEND : OP_RECV;
		e->prep_op = op_new(e, kind, peer, -1, e->warm, sizeof(float), ch);
		if (!e->prep_op)
			return NE_ERR;
		e->prep_sub = 1;
		enqueue(e, ch, &e->prep_op, 1);
	}
	poll_busy(e, ch, peer, "warming up the communicator with");
	if (complete_all(e))
		return NE_ERR;
	int st = e->prep_op->state;
	if (st == ST_FAILED || st == ST_DONE) {
		op_free(e, e->prep_op);
		e->prep_op = NULL;
	}
	return st == ST_FAILED ? NE_ERR : st == ST_DONE ? NE_OK : NE_PENDING;
}

int ne_prepare(ne_engine_t *e, const ne_layout_t *l)
{
	if (e->prepared)
		return NE_OK;
	if (!e->groups && prep_groups(e, l))
		return NE_ERR;
	int items = l->n_buckets + l->n_tps + l->n_chans;
	while (e->prep_at < 2 * items) {
		int i = e->prep_at % items, key, peer;
		ne_chan_t *ch;
		int needed = prep_item(e, l, i, &key, &ch, &peer);
		int r = e->prep_at < items ? prep_split(e, needed, key, ch, peer)
					   : prep_warm(e, key, ch, peer);
		if (r != NE_OK)
			return r;
		e->prep_at++;
		e->prep_sub = 0;
	}
	e->prepared = 1;
	return NE_OK;
}

int ne_prepared(const ne_engine_t *e)
{
	return e->prepared;
}

int ne_group_id(const ne_engine_t *e, int item, int *out)
{
	*out = -1;
	if (!e->prepared || item < 0 || item >= e->n_items)
		return -1;
	*out = e->item_group[item];
	return 0;
}

/* ---- teardown ---- */

/*
 * Gracefully: finalize every communicator first (finalizing waits for the
 * peers to finalize theirs too, so waiting on one before starting the next
 * could deadlock), then poll each and destroy it. Hard, or with work in
 * flight: abort each.
 */
void ne_free(ne_engine_t *e, int hard)
{
	if (!e)
		return;
	const ne_prims_t *pr = e->pr;
	hard |= ne_live(e) > 0;
	int n = 2 * e->nranks + e->n_groups + 1, k = 0;
	ne_chan_t *world = &(ne_chan_t){.comm = e->world};
	ne_chan_t **cs = malloc(sizeof *cs * (size_t)n);
	hard |= !cs;
	for (int p = 0; cs && p < e->nranks; p++) {
		cs[k++] = &e->peers[p].out;
		cs[k++] = &e->peers[p].in;
	}
	for (int g = 0; cs && g < e->n_groups; g++)
		cs[k++] = &e->groups[g];
	if (cs)
		cs[k++] = world;
	for (int i = 0; i < k; i++)
		if (cs[i]->comm && !hard && pr->finalize(e->ctx, cs[i]->comm) == NE_ERR) {
			pr->abort(e->ctx, cs[i]->comm);
			cs[i]->comm = NULL;
		}
	double t0 = pr->now(e->ctx);
	for (int i = 0; i < k; i++) {
		if (!cs[i]->comm)
			continue;
		int s = hard ? NE_ERR : pr->status(e->ctx, cs[i]->comm);
		while (s == NE_PENDING && pr->now(e->ctx) - t0 < e->timeout_s)
			s = pr->status(e->ctx, cs[i]->comm);
		if (s == NE_OK)
			pr->destroy(e->ctx, cs[i]->comm);
		else
			pr->abort(e->ctx, cs[i]->comm);
		cs[i]->comm = NULL;
	}
	free(cs);
	for (int i = 0; i < 2 * e->nranks + e->n_groups; i++) {
		ne_chan_t *ch = i < 2 * e->nranks ? (i % 2 ? &e->peers[i / 2].in : &e->peers[i / 2].out)
						 : &e->groups[i - 2 * e->nranks];
		if (ch->stream)
			pr->stream_free(e->ctx, ch->stream);
	}
	for (int p = 0; p < e->nranks; p++)
		free(e->peers[p].fifo);
	while (e->ops)
		op_free(e, e->ops);
	free(e->peers);
	free(e->groups);
	free(e->item_group);
	free(e);
}
