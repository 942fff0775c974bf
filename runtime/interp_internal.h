/*
 * interp_internal.h — what interp.c (executing programs), exec.c (its
 * instructions), zero.c (its zero-2 and zero-3 parts), defer.c (its
 * deferred zero-1/2 all-gathers) and pack.c (parameters in and out of a
 * rank's state) share: the rank's state and its parts. Private to those files;
 * runtime.h is the interface.
 */
#ifndef SPINDLE_INTERP_INTERNAL_H
#define SPINDLE_INTERP_INTERNAL_H

#include "layers.h"
#include "runtime.h"

#include <time.h>

/* A value buffer: act or grad (g) of MetaOp m at boundary l (-1: the
 * memory of a cross-attention MetaOp), rows [lo, hi) of the task's batch,
 * each [seq, width], at floats off of the values allocation. */
typedef struct {
	int32_t m, l, g;
	int32_t lo, hi, seq, width;
	int64_t off;
} vbuf_t;

typedef struct {
	int bucket, group;
	int64_t off, n;   /* float range in the weights and gradients */
	int zero1;        /* layout: the optimizer state is sharded (zero-1 or 2) */
	int zero2;        /* zero-2: the gradient too (full only while live) */
	int64_t soff, sn; /* the owned range in them (the whole one unless zero1) */
	int64_t moff;     /* where the owned range starts in m and v */
	int sync, gather; /* its SYNC and GATHER (zero1) instructions */
	int gstarted;     /* zero1: exec_step started its GATHER's all-gather */
	int defer;        /* zero1: its all-gather is deferred (bucket defer):
			   * in pieces (plan_defer_pieces), each in flight
			   * past the step's end until the next step's first
			   * use of one of its layers (rt_z3_need), the STEP
			   * or rt_settle */
	int dn;           /* defer: its pieces; dfirst[0..dn] each one's first
			   * param, dord[0..dn) the order they start in,
			   * dpiece[q] param q's piece */
	int32_t *dfirst, *dord, *dpiece;
	rt_req_t *dreq;   /* per piece: its all-gather while dbusy */
	char *dbusy;
	int dpend;        /* its pieces in flight */
	int64_t dstep;    /* the rt_step (st->n_steps) that started them */
	float *dstage;    /* defer, --check-deferred: its all-gather's buffer
			   * (n floats), each piece's range copied into the
			   * weights at the piece's wait */
	int64_t goff;     /* not zero2: where its gradients start in g */
	int64_t gsoff;    /* zero2: where its gradient shard starts in gs */
	float *full;      /* zero2: its full gradient while live, else NULL */
	int rs;           /* zero2: its reduce-scatter is in flight (req) */
	int done;         /* zero2: the placement (instruction) at which its
			   * reduce-scatter completes (plan_z2_walk's done:
			   * the first at or past its safe point, an overlapped
			   * bucket's the second), INT_MAX: at the STEP */
	int64_t zoff;     /* zero2: its full gradient's place in the pool */
	int zero3;        /* zero-3: the weights sharded too (gradients as zero2) */
	int64_t wc;       /* not zero3: where its weights start in w */
	int64_t wsoff;    /* zero3: where its weight shard starts in ws */
	float *wfull;     /* zero3: the room of its span's layer in the pool
			   * from a PGATHER to its PFREE, else NULL */
	int hfirst;       /* its first held layer (its params in order) */
	const int32_t *z3seq; /* zero3, in a span: the layers it gathers one
			       * at a time (plan_z3_span: indices into its
			       * params), z3n of them, z3pos gathered so far */
	int z3n, z3pos;
	int z3cur;        /* zero3: the held layer gathered in wfull, or -1
			   * (-2: the whole bucket is) */
	float *z3w;       /* zero3: z3cur's weights (a slot of the room) */
	int64_t z3have;   /* zero3: its floats there */
	int z3next;       /* zero3: the layer whose gather is in flight (into
			   * z3nw, z3nhave floats, z3req), or -1 */
	float *z3nw;
	int64_t z3nhave;
	rt_req_t z3req;
	int64_t z3slot1;  /* zero3: where the room's slot 1 starts
			   * (plan_z3_room) */
	rt_req_t req;
} mybucket_t;

struct rt_state {
	const sp_plan_t *p;
	const rt_backend_t *b;
	rt_comm_t *c;
	rt_opts_t o;
	int rank;
	const sp_device_t *dev;
	const sp_ins_t *prog;
	int n_ins;
	/* parameters */
	int n_params_total; /* (comp, layer) slots in the model */
	int *param_base;    /* per component */
	int *slot;          /* (comp, layer) slot -> index in held order, or -1 */
	sp_param_t *held;
	int n_held;
	int64_t *poff, *pcount;
	int *pmb; /* per held layer: its bucket's index in mb */
	float *w, *g, *m, *v;
	int64_t n_w, n_opt; /* floats of the held layers (bucket after bucket:
			     * poff, mybucket_t off index them); in m and v */
	/* weights: w holds the buckets that are not zero-3 (n_wc floats, each
	 * at its wc), ws the zero-3 buckets' shards (n_ws); a zero-3 bucket's
	 * full weights are placed in z3pool from its PGATHER to its PFREE at
	 * the offset plan_z3_walk gives that PGATHER (z3_at, per instruction) */
	float *ws, *z3pool;
	int64_t n_wc, n_ws;
	int64_t *z3_at;
	int32_t **z3_seq; /* per instruction: a PGATHER's plan_z3_span, else NULL */
	int *z3_seqn;
	int64_t *z3_parts; /* a layer's all-gather: the members' counts, then
			    * offsets (2 x the largest zero-3 group) */
	int64_t z3_live, z3_hwm, z3_peak, z3_acct; /* floats, as z2_* */
	int64_t z3_whole; /* plan_z3_walk's whole: whole buckets gathered together */
	/* gradients: g holds those of the buckets that are not zero-2 (n_g
	 * floats), gs the zero-2 buckets' shards (n_gs); a zero-2 bucket's full
	 * gradient is its own allocation while live (mybucket_t full) */
	float *gs, *z2pool; /* z2pool: the full gradients (plan_z2_walk) */
	int64_t n_g, n_gs;
	int *z2_off, *z2_list; /* per instruction: the zero-2 mb it writes into */
	/* full-gradient floats: live now, most live so far, the walk's peak,
	 * the pool */
	int64_t z2_live, z2_hwm, z2_peak, z2_acct;
	mybucket_t *mb;
	int n_mb;
	int *step_order; /* mb indices in the order of their SYNCs */
	/* values and saved activations */
	vbuf_t *vb;
	int nvb;
	int *src_vb, *dst_vb; /* per instruction */
	/* per FWD and BWD of a decoder slice: act(m, -1), its memory, and
	 * (BWD) grad(m, -1), which its layers add into; -1 elsewhere */
	int *mem_vb, *dmem_vb;
	float *vals;
	int64_t vals_n;
	int64_t *saved_off; /* per instruction, floats into saved; -1 if none */
	int *fwd_of;        /* per BWD instruction: its FWD's index */
	float *saved;
	int64_t saved_n;
	int64_t *stage_off; /* per SEND: floats into stage */
	float *stage, *rstage;
	int64_t stage_n, rstage_n;
	/* workspace */
	float *work;
	int64_t ping_n, loss_n, feat_n, redo_n, work_n;
	int64_t lnacc_n; /* a sequence-parallel BWD's LayerNorm gradients */
	int32_t *ints_dev, *ints_host;
	float *feat_host;
	int64_t ints_n;
	/* per step */
	rt_req_t *pending;
	int *pending_ins;
	int n_pending, cap_pending;
	int n_dpend;      /* pieces of deferred all-gathers in flight (mybucket_t dpend) */
	int64_t d_later, d_settled; /* deferred all-gathers completed in a
				     * later step, and by rt_settle */
	int64_t n_steps;  /* rt_step calls so far */
	double *loss;
	rt_event_t *ev;
	int n_ev, cap_ev;
	double t_origin;
	double tp_ms; /* the running instruction's time in tp_allreduce */
	int micro; /* the micro-step running (0 outside rt_step) */
	int *tp_group; /* per slice: the comm group of the rank's TP group, or -1 */
	int *tp_rank;  /* per slice: the rank's member index in it */
	char why[480]; /* what set-up found wrong with the plan, when it says */
	int64_t mem[MEM__COUNT];
};

/* Layers of a component that carry parameters: a transformer's, else one. */
static inline int comp_n_layers(const sp_component_t *c)
{
	return c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
}

/* ---- interp.c ---------------------------------------------------------- */

/* Held layer i's weights: in w, or (zero-3) in its bucket's gathered full
 * weights; NULL when a zero-3 bucket's are not gathered now. */
float *rt_wptr(const rt_state_t *st, int i);
/* Held layer i's weights from host floats (the rank's part, pcount[i] of
 * them): all into w, or (zero-3) the part in the rank's shard into ws. */
void rt_put_weights(rt_state_t *st, int i, const float *host);
/* The whole weights of the rank's zero-3 buckets on the host, into hw
 * (n_w floats, laid out as poff; NULL: take part only): all-gathered over
 * each zero-3 group, buckets in index order (collective). 0 or SP_EIO. */
int rt_zero3_whole(const rt_state_t *st, float *hw);

/* SP_EIO naming the rank and instruction k (-1: none) with what went
 * wrong; returns its code. */
int rt_fail(rt_state_t *st, sp_err_t *err, int k, const char *what);
/* Polls req until done or the interpreter's timeout (then rt_fail naming
 * who it waited for). */
int rt_wait_req(rt_state_t *st, rt_req_t *req, int k, sp_err_t *err);

/* Whole layer records of held layer i (nw floats: w, then m, v when
 * present) to the rank's part: its shard of a tensor-parallel layer (in
 * out), or the record itself. Returns what to copy from. */
const float *rt_own_part(const rt_state_t *st, int i, const float *whole, int64_t nw, int parts,
			 float *out);

/* ---- zero.c ------------------------------------------------------------ */

/* Set-up (rt_create): the zero-2 pool's places and each instruction's
 * zero-2 writes; the zero-3 pool's places and spans. 0, SP_ENOMEM, or
 * SP_EINPUT with st->why. */
int rt_zero2_setup(rt_state_t *st);
int rt_zero3_setup(rt_state_t *st);
/* Zero-2: bucket mb's reduce-scatter completed into its shard and its
 * full gradient given back; mb's full gradient placed (zeroed) before
 * instruction k writes it; the full gradients instruction k writes placed;
 * every full gradient without a reduce-scatter given back. */
int rt_z2_finish(rt_state_t *st, mybucket_t *mb, sp_err_t *err);
int rt_z2_alloc(rt_state_t *st, mybucket_t *mb, int k, sp_err_t *err);
int rt_z2_touch(rt_state_t *st, int k, sp_err_t *err);
void rt_z2_drop(rt_state_t *st);
/* Zero-3: before instruction k runs held layer si, its weights gathered;
 * instruction k a PGATHER or PFREE. */
int rt_z3_need(rt_state_t *st, int si, int k, sp_err_t *err);
int rt_exec_zero3(rt_state_t *st, int k, sp_err_t *err);

/* ---- interp.c's small helpers, shared with exec.c ------------------------ */

static inline double wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline const sp_metaop_t *mop(const rt_state_t *st, int m)
{
	return &st->p->metaops[m];
}

static inline const sp_task_t *task_of(const rt_state_t *st, int m)
{
	return &st->p->model.tasks[mop(st, m)->task];
}

/* Floats a layer of slice s's MetaOp saves per sample: a shard's (tp > 1;
 * a sequence-parallel one's with sp), else the whole layer's, a decoder's
 * cross-attention included (layers.h). */
static inline int64_t saved_pp(const rt_state_t *st, const sp_slice_t *s)
{
	const sp_metaop_t *mo = mop(st, s->metaop);
	int64_t B = task_of(st, s->metaop)->batch;
	return op_saved_elems_sp(&mo->shape, B, s->tp, s->sp);
}

/* Whether MetaOp m is a decoder: its layers attend to a memory act(m, -1). */
static inline int is_decoder(const rt_state_t *st, int m)
{
	return mop(st, m)->shape.type == COMP_TRANSFORMER && mop(st, m)->shape.mem_seq > 0;
}

/* Floats a FWD of slice s keeps per sample and layer until its BWD: all the
 * layer saves, or under recompute its input [seq, hidden] (plan_mem.c's
 * kept_bytes; the reader allows recompute on transformers only, whose input
 * is [seq, hidden]; sequence parallel: the member's seq / tp tokens of it). */
static inline int64_t kept_pp(const rt_state_t *st, const sp_slice_t *s)
{
	const sp_opshape_t *sh = &mop(st, s->metaop)->shape;
	return s->recompute ? op_kept_elems(sh, s->tp, s->sp) : saved_pp(st, s);
}

/* The parameter slot of MetaOp m's layer l; -1 for parameter-free layers. */
static inline int layer_slot(const rt_state_t *st, int m, int l, int *comp)
{
	const sp_metaop_t *mo = mop(st, m);
	const sp_op_t *op = &st->p->ops[mo->first_op + l];
	*comp = task_of(st, m)->nodes[op->node].comp;
	if (st->p->model.comps[*comp].type == COMP_CONTRASTIVE)
		return -1;
	return st->slot[st->param_base[*comp] + op->layer];
}

static inline float *vptr(const rt_state_t *st, int vi, int32_t s, int32_t q)
{
	const vbuf_t *v = &st->vb[vi];
	return st->vals + v->off + ((int64_t)(s - v->lo) * v->seq + q) * v->width;
}

/* ---- exec.c: the instructions (rt_eval runs the forward part) ----------- */

int rt_exec_fwd(rt_state_t *st, int k, int64_t step, sp_err_t *err);
int rt_exec_loss(rt_state_t *st, int k, int64_t step, sp_err_t *err);
int rt_exec_comm(rt_state_t *st, int k, sp_err_t *err);
int rt_poll_pending(rt_state_t *st, sp_err_t *err);
int rt_drain(rt_state_t *st, sp_err_t *err);

/* ---- defer.c ----------------------------------------------------------- */

/* Deferred all-gathers in pieces: set-up (rt_create, after check_step:
 * which buckets are deferred, their pieces, --check-deferred's staging;
 * 0 or SP_ENOMEM), what it allocated freed (rt_free); in the STEP, every
 * piece still in flight landed before the first update (no use read it),
 * and every deferred bucket's pieces started after the last update; piece
 * j of bucket mb waited for and landed (later: in a step after its own,
 * else by rt_settle; k the instruction that waits); every piece in flight
 * polled (landed when done). */
int rt_defer_setup(rt_state_t *st);
void rt_defer_release(rt_state_t *st);
int rt_defer_step_wait(rt_state_t *st, sp_err_t *err);
int rt_defer_start_all(rt_state_t *st, sp_err_t *err);
int rt_defer_land(rt_state_t *st, mybucket_t *mb, int j, int k, int later, sp_err_t *err);
int rt_defer_poll(rt_state_t *st, sp_err_t *err);

#endif
