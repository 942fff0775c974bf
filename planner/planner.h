/*
 * planner.h — the planner's internal map, one section per pass (file).
 *
 * Pipeline (plan.c): load+validate (schemas/) → graph.c (task DAG →
 * MetaOps) → cost.c (scalability estimator) → bound.c (lower bounds, for
 * the certificate); then for every candidate: sched_*.c (waves of slices)
 * → place.c (devices) → lower*.c (per-device programs, buckets, held
 * params) → memplan.c (memory per device) → sim.c (predicted times); for
 * the chosen plan: verify.c → plan_write (schemas/).
 *
 * Memory (style.md): pl->arena lives for the planning run (MetaOps, costs,
 * allotments); pl->scratch holds one candidate plan's temporaries
 * (schedule, placement, lowering work arrays) and plan.c resets it when the
 * candidate has been judged; a pass that tries many things (trial
 * schedules) takes an sp_arena_mark and resets to it. Nothing allocated
 * from either is freed one by one, so error paths need no cleanup lists.
 * Only the lowered sp_plan_t lives on the heap (the kept plan outlives the
 * run; plan_release frees the others). verify_plan has no planner_t (tests
 * and tools call it too): its work goes to one arena of its own.
 */
#ifndef SPINDLE_PLANNER_H
#define SPINDLE_PLANNER_H

#include "common.h"
#include "model.h"
#include "plan.h"
#include "plan_verify.h"

#include <stdio.h>

typedef enum {
	ALGO_SPINDLE,
	ALGO_PAPER,
	ALGO_SEQUENTIAL,
	ALGO_TASK_LEVEL,
	ALGO_DISTMM,
	ALGO_SEQUENTIAL_PAPER,
	ALGO__COUNT
} algo_t;

typedef enum { PLACE_SPINDLE, PLACE_NAIVE } place_kind_t;

/* --max-instructions' default, and about what an instruction of a plan
 * costs the planner at its peak (lower_xfer.c collect_all). */
#define PLAN_MAX_INS_DEFAULT ((int64_t)8000000)
#define PLAN_BYTES_PER_INS 500

typedef struct {
	const char *model_path, *cluster_path, *out_path;
	int inspect, costs, report, compare, json;
	algo_t algo;
	place_kind_t placement;
	double mem_reserve_gib; /* kept free on every device */
	int milp_nodes;         /* branch-and-bound node budget per MILP */
	const char *exclude;    /* one of our candidates left out (NULL: none) */
	const char *only;       /* the one candidate ours plans with (NULL: all) */
	int zero;               /* state layout of every bucket over 2+ devices:
				 * -1 auto, 0 replicated, 1 zero-1 */
	int recompute;          /* transformer slices: -1 auto, 0 keep, 1 recompute */
	int rs_overlap;         /* zero-2/3 buckets' overlap: -1 auto, 0 off, 1 on */
	int defer_gather;       /* zero-1/2 buckets' deferred all-gather: -1 auto,
				 * 0 off, 1 on */
	int no_advice;          /* 1: no re-planning for a hint when nothing fits */
	int microbatches;       /* k micro-batches per step, the same for every
				 * task (0: auto, the smallest that fits) */
	const char *mb_tasks;   /* --microbatches NAME=K,...: per task (tasks
				 * not named: 1); NULL: microbatches above */
	int tp;                 /* tensor-parallel degree: 0 auto, else forced */
	int sp;                 /* sequence parallelism of split transformer
				 * slices: -1 auto, 0 off, 1 on (--sp) */
	int tp_vocab_whole;     /* 1: embeddings and LM heads stay whole
				 * (--tp-vocab whole); 0: they split by
				 * vocabulary like transformers (default) */
	int simulate_all;       /* 1: ours simulates every candidate in full (no
				 * bound skips: the same plans, slower; tests) */
	int64_t max_ins;        /* the lowering refuses a plan whose transfers
				 * alone are more instructions (0: no limit) */
	int jobs;               /* threads for ours' candidates (jobs.c); 0 or 1:
				 * the walk runs on the caller's thread alone */
	double refine_within;   /* --refine-within: top_choose refines only the
				 * candidates whose unrefined iteration is within
				 * this fraction of the walk's choice's (0: the
				 * default, 0.10); < 0: every one refined_bound
				 * leaves (exact) */
} plan_opts_t;

const char *algo_name(algo_t a);
int algo_parse(const char *s, algo_t *out);
/* 1 when a's gradient sync overlaps its backward (SYNC after a bucket's
 * last gradient, transformer slices in chunks); 0: all SYNCs after the
 * last backward, as in the paper's algorithm and baseline. */
int algo_overlaps_sync(algo_t a);
/* Its programs run each task's backward right after that task's forward
 * (the paper's baseline, §6.1: Megatron-LM/DeepSpeed accumulate gradients
 * task by task), instead of every forward, then every backward. */
int algo_task_by_task(algo_t a);

/* ---- graph.c: task DAG → MetaOps ------------------------------------------ */

typedef struct {
	int task;
	int n_layers, first_op; /* operators pl->ops[first_op .. +n_layers) */
	sp_opshape_t shape;
	int64_t batch;
	int seq_in, width_in, seq_out, width_out;
	int source, sink;
	int n_pred, n_succ;
	int *pred, *succ; /* edge indices into pl->edges */
	int level;        /* longest path from a source, in MetaOps */
	char name[2 * SP_NAME_MAX];
	/* cost.c */
	int nmax;        /* device counts: 1..nmax = min(N, batch tmax), tmax the
			  * largest tensor-parallel degree m may take */
	double *tf, *tb; /* [nmax+1]: per-layer ms at n devices: the fastest
			  * n = d t (d <= batch), local batch ceil(B/d),
			  * non-increasing in n */
	int *tpn;        /* [nmax+1]: the t of tf/tb at n */
	int *usen;       /* [nmax+1]: the width that makes tf/tb at n (n, or less
			  * when n is no faster or no (d, t) makes it) */
	int *wfloor;     /* [nmax+1]: width_floor(m, n), tabled */
	/* the table sets cost_build made (COST_AUTO always, COST_WHOLE when
	 * has_whole, COST_VOCAB_WHOLE when has_vocab_whole); the fields above
	 * are a copy of the active one */
	struct cost_tab {
		int nmax;
		double *tf, *tb;
		int *tpn, *usen, *wfloor;
	} tabs[3];
	int profiled;
	int scales;      /* 0: every device of a slice does the whole work (contrastive) */
	int64_t layer_state_bytes; /* parameter state of one layer replica */
	int64_t saved_per_sample;  /* bytes saved for backward per layer and sample */
} metaop_t;

typedef struct planner {
	const sp_model_t *model;
	const sp_cluster_t *cluster;
	const plan_opts_t *opts;
	sp_err_t *err;
	sp_arena_t arena;   /* the planning run */
	sp_arena_t scratch; /* one candidate plan; reset by plan.c */
	int N; /* devices */
	int k; /* micro-steps per step, K: model holds the micro-batches, task t's
		* batch / k_t, k_t its microbatches (0: K) (plan.c) */
	int micro; /* bound.c: bounds of the tasks active in this micro-step */
	int n_mops, n_ops, n_edges;
	/* cost.c: the active table set (cost_use) and its forced degree (0
	 * auto: opts->tp; COST_WHOLE: 1); has_whole: cost_build made a
	 * whole-layer set that differs from the auto one; vocab_whole: the
	 * active set keeps embeddings and LM heads whole (COST_VOCAB_WHOLE, or
	 * --tp-vocab whole); has_vocab_whole: cost_build made that set and it
	 * differs from the auto one */
	int tables, tp_force, has_whole, vocab_whole, has_vocab_whole;
	/* cost.c: cost_layer_tp's memo (NULL: none; cost_build makes it) */
	struct cost_memo *memo;
	metaop_t *mops;
	sp_op_t *ops;
	sp_edge_t *edges;
	int *topo; /* MetaOps in a topological order (by level, then id) */
	int n_levels;
	double mem_cap; /* usable bytes per device */
	/* layout.c: per component, whether the estimates assume zero-1 state
	 * and input-only activations; lay_large: some component is large */
	uint8_t *lay_shard, *lay_redo;
	uint8_t *lay_big;  /* per component: large (layout_zero3's candidates) */
	double *lay_saved; /* per MetaOp: layout_saved_per_sample */
	double *lay_opt;   /* per MetaOp: a layer's state zero-1 shards (or 0) */
	int lay_large;
	/* jobs.c: worker threads for ours' walk (NULL: none, --jobs 1) */
	struct jobs *jobs;
	/* walk_jobs.c: the sequential plan's layout_refine as a job running beside
	 * ours' walk (NULL: none; only the caller's planner reads it) */
	struct seq_refine *seq_refine;
	/* walk_jobs.c top_choose, over every walk of the run: the most plans
	 * one walk kept at once, and how many it refined (SPINDLE_TOP_STATS) */
	int top_peak, top_refined;
	/* walk.c plan_lowered_cut, over the run's walks on this planner: the
	 * variants lowered, and those that bound_sync_early settled before
	 * memplan_run (SPINDLE_TOP_STATS) */
	int low_all, low_cut;
	/* sim_memo.c: ours' simulated plans (NULL: none yet) */
	struct sim_memo *sim_memo;
	/* bound.c: bound_sync's collectives, each computed once (NULL: none
	 * yet; in arena; a copied planner with another arena makes its own;
	 * jobs.c keeps each thread's own across syncs). coll_memo_off (tests):
	 * every collective computed afresh. */
	struct coll_memo *coll_memo;
	int coll_memo_off;
	/* layout_trial.c regather: the instruction array it last replaced, written
	 * by its next call instead of a fresh one (NULL: none); each planner
	 * (thread) its own, freed with its arenas */
	sp_ins_t *ins_spare;
	/* the number of arrays regather has written, and of changes of a plan's
	 * instruction array (regather's and trial_restore's swaps: trial_restore
	 * takes the spare back only where its save's array was the one changed) */
	uint64_t ins_regathers, ins_changes;
} planner_t;

/* Builds operators and contracts chains into MetaOps. */
int graph_build(planner_t *pl);

/* ---- cost.c: scalability estimator ------------------------------------------ */

/* The table sets: COST_AUTO prices every width at the degree opts->tp
 * asks for (auto: the fastest); COST_WHOLE whole layers only (t = 1,
 * exactly what --tp 1 prices); COST_VOCAB_WHOLE as COST_AUTO with
 * embeddings and LM heads whole (exactly what --tp-vocab whole prices). */
enum { COST_AUTO, COST_WHOLE, COST_VOCAB_WHOLE, COST__SETS };
/* Fills tf/tb/profiled for every MetaOp: the COST_AUTO set, and under
 * --tp auto the COST_WHOLE set where it differs (pl->has_whole) and,
 * unless --tp-vocab whole, the COST_VOCAB_WHOLE set where it differs
 * (pl->has_vocab_whole); leaves COST_AUTO active. */
int cost_build(planner_t *pl);
/* Makes table set `set` the active one (the metaop_t fields the passes read). */
void cost_use(planner_t *pl, int set);
/* Per-layer ms of MetaOp m for a device holding `local` samples. */
void cost_layer(const planner_t *pl, int m, int64_t local, double *fwd, double *bwd);
/* The largest tensor-parallel degree (the plan format's SP_MAX_TP). */
#define SP_TP_MAX 64
/* 1 when a t-way split of shape s is planned: tp_ok, and never a decoder
 * (a cross-attention shape, mem_seq > 0, runs whole layers: issue #20). */
static inline int shape_tp_ok(const sp_opshape_t *s, int t)
{
	return t == 1 || (s->mem_seq == 0 && tp_ok(s->type, s->heads, s->ffn, s->vocab, t));
}
/* shape_tp_ok under the active table set: COST_VOCAB_WHOLE and
 * --tp-vocab whole keep embeddings and LM heads unsplit. */
static inline int pl_tp_ok(const planner_t *pl, const sp_opshape_t *s, int t)
{
	return shape_tp_ok(s, t) && (t == 1 || s->type == COMP_TRANSFORMER || !pl->vocab_whole);
}
/* The same for a t-way group holding `local` samples: the shard's compute
 * and its all-reduces (t = 1, or a shape shape_tp_ok refuses: cost_layer). */
void cost_layer_tp(const planner_t *pl, int m, int64_t local, int t, double *fwd, double *bwd);
/* The same for a sequence-parallel group (sp != 0 where sp_ok; cost.c:
 * its collectives and bytes); sp 0: cost_layer_tp. */
void cost_layer_sp(const planner_t *pl, int m, int64_t local, int t, int sp, double *fwd,
		   double *bwd);
/* dst's memo of cost_layer_tp becomes a copy of src's (in dst->arena; none
 * when src has none): a thread of its own writes only its memo (jobs.c).
 * SP_ENOMEM. */
int cost_memo_copy(planner_t *dst, const planner_t *src);
/* Bytes the optimizer step reads and writes per parameter in dtype dt
 * (cost.c: 28 for AdamW, 12 for SGD). */
int64_t cost_step_bytes(sp_dtype_t dt, sp_opt_kind_t opt);
/* Optimizer step over elems parameters on one device. */
double cost_step_ms(const planner_t *pl, int64_t elems);
/* One matrix product of a layer: batch copies of M x N x K, issued calls times. */
typedef struct {
	double m, n, k, batch, calls;
} cost_gemm_t;
#define COST_MAX_GEMMS 22 /* a decoder's backward: 12, and 10 of its cross block */
/* The products of one layer of shape s at local batch b, forward or
 * backward, as the CUDA backend issues them; returns how many. */
int cost_layer_gemms(const sp_opshape_t *s, int64_t b, int bwd, cost_gemm_t out[COST_MAX_GEMMS]);
/* The same for one member of a t-way split (the slowest: an uneven
 * vocabulary's largest shard, vocab_shard_max). */
int cost_layer_gemms_tp(const sp_opshape_t *s, int64_t b, int t, int bwd,
			cost_gemm_t out[COST_MAX_GEMMS]);
/* ms of one product on sm_count SMs of peak_flops FLOP/s: tile and wave
 * quantised, the least over cuBLAS's tile sizes (cost.c's header). */
double cost_gemm_ms(const cost_gemm_t *g, int sm_count, double peak_flops);
/* Kernels (with stream copies and memsets) the CUDA backend issues for it. */
int64_t cost_layer_kernels(const sp_opshape_t *s, int64_t b, int bwd);
/* The same for one member of a t-way split (its collectives one kernel
 * each), sequence parallel where sp and sp_ok (cost.c SP_LAUNCHES). */
int64_t cost_layer_kernels_sp(const sp_opshape_t *s, int64_t b, int t, int sp, int bwd);
static inline int dev_node(const sp_cluster_t *c, int d)
{
	return d / c->gpus_per_node;
}

/* ---- net.c: prices of transfers and all-reduces, per-link loads ------------- */

/* Global id of the NIC device d sends and receives through (rail-optimised). */
int dev_nic(const sp_cluster_t *c, int d);
/* Time of one point-to-point transfer of bytes between devices a and b:
 * measured (cluster "collectives") where a p2p point covers it. */
double cost_xfer_ms(const sp_cluster_t *c, int a, int b, int64_t bytes);
/* cost_xfer_ms over the analytic price (1 without measured p2p points):
 * what the simulator scales a transfer's bytes and latency by. */
double net_xfer_scale(const sp_cluster_t *c, int a, int b, int64_t bytes);
/* All-reduce of bytes over the n devices devs[] (increasing ids), alone on
 * the network: measured where points cover it, else the cheaper of flat
 * ring and hierarchical. */
double cost_allreduce_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes);
/* Reduce-scatter of a bytes buffer (each keeps bytes / n) and all-gather
 * of one (each gives bytes / n) over devs: measured, else half the
 * all-reduce. */
double cost_reduce_scatter_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes);
double cost_all_gather_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes);
/* The measured time of op over n ranks on m nodes (net.c's rules) in *out:
 * 1, or 0 when the cluster has no point of op on m nodes. */
int net_measured_ms(const sp_cluster_t *c, sp_coll_op_t op, int n, int m, double bytes,
		    double *out);
/* lower_sync.c: bk's sync_ms and gather_ms under its layout, alone on the
 * network (db: bytes per parameter). */
void bucket_price(const sp_cluster_t *c, const sp_plan_t *p, sp_bucket_t *bk, int db);
/* The k bucket b's deferred all-gather is cut for (bucket defer). */
int bucket_defer_pieces(const sp_cluster_t *c, const sp_plan_t *p, int b, int db);

/* Links that can be shared: every GPU's intra-node port and every NIC, each
 * direction apart; ids 0..net_n_res-1. */
typedef struct {
	int res;
	double bytes;
} net_load_t;
typedef struct {
	double lat_ms; /* after its bytes */
	int n_load;
	net_load_t *load;
} net_phase_t;
#define NET_MAX_PHASES 3
typedef struct {
	int n_phase;
	net_phase_t ph[NET_MAX_PHASES];
} net_coll_t;

int net_n_res(const sp_cluster_t *c);
/* Bandwidth of link r, GB/s. */
double net_res_gbs(const sp_cluster_t *c, int r);
/* The two links a transfer from a to b crosses (out of a, into b); returns 2. */
int net_xfer_loads(const sp_cluster_t *c, int a, int b, int *out_res);
/* cost_allreduce_ms's choice as phases of loads (arrays from a); SP_ENOMEM.
 * no_tree: ring or hierarchical only (net_half_phases starts from that
 * choice; NCCL has no tree for a reduce-scatter or an all-gather). */
int net_allreduce_phases(net_coll_t *out, const sp_cluster_t *c, const int32_t *devs, int n,
			 int64_t bytes, int no_tree, sp_arena_t *a);
/* A half of the ring's or hierarchical all-reduce of bytes as phases:
 * op COLL_REDUCE_SCATTER its first half (a zero-1/2/3 bucket's
 * reduce-scatter of all its bytes; alone on the network exactly
 * cost_reduce_scatter_ms), COLL_ALL_GATHER its second (a zero-1/2
 * bucket's all-gather of all its bytes; alone exactly cost_all_gather_ms).
 * SP_ENOMEM, SP_EINTERNAL for another op. */
int net_half_phases(net_coll_t *out, const sp_cluster_t *c, sp_coll_op_t op,
		    const int32_t *devs, int n, int64_t bytes, sp_arena_t *a);
/* Time of the phases alone on the network (equals cost_allreduce_ms). */
double net_phases_ms(const sp_cluster_t *c, const net_coll_t *co);

/* ---- fluid.c: the simulator's network, links shared max-min fairly ---------- */

/* A load of a job's draining phase as the sharing reads it: its link, its
 * index in that link's list of loads, its weight bytes_r / V. */
typedef struct {
	int res, slot;
	double w;
} fl_ld_t;

/* What an all-reduce, reduce-scatter or all-gather job holds besides
 * fl_job_t (fl_coll's, from the arena). */
typedef struct {
	net_coll_t co;
	fl_ld_t *ldbuf;            /* room for its largest phase's loads */
	const int32_t *devs;       /* its members */
	int *wnext;                /* per member: the next waiting collective there, -1 */
	int n_dev;
} fl_cjob_t;

/* A job in two 64-byte lines (fl_init aligns the array; a transfer, most
 * jobs, needs no more). What the sharing reads comes first, in the first
 * line: the draining phase's loads (a transfer's two, or any phase's up to
 * two, inline; more in the collective's ldbuf), the sharing's mark, the
 * rate and the bytes left at t_ref; the rest in the second. */
typedef struct {
	_Alignas(64) int n_ld;     /* loads of the draining phase */
	int jmark;                 /* the last sharing that took it (epoch) */
	double rate, rem, t_ref;   /* current phase: rem bytes at t_ref */
	union {
		fl_ld_t x[2];      /* n_ld <= 2 */
		fl_ld_t *p;        /* n_ld > 2: ldbuf */
	} ld;
	double start, done;        /* start (transfer) or ready (all-reduce); done: -1 */
	int phase, state;
	int src, fnext;            /* a transfer in its sender's queue: the sender, the
				    * next job there (-1: none, or not queued) */
	int ev_slot;               /* in a group of ev (fluid.c): its index in gm, else -1 */
	char coll, wake;
	union {
		/* a transfer's one phase: bytes on each of its two links,
		 * then its latency */
		struct {
			int res[2];
			double bytes, lat_ms;
		} x;
		fl_cjob_t *c;      /* coll */
	} u;
} fl_job_t;
_Static_assert(sizeof(fl_job_t) == 128, "a job is two lines");

/* The loads of job jb's draining phase. */
static inline fl_ld_t *fl_loads(fl_job_t *jb)
{
	return jb->n_ld <= 2 ? jb->ld.x : jb->ld.p;
}

/* A heap entry: a time or level, a job or link; aux is the fluid event
 * heap's (the entry's place in its group of phase ends, -1 alone). */
typedef struct {
	double t;
	int id, aux;
} fl_ev_t;
/* Least (t, id) first; with pos (per id: its index, -1 when absent) an id
 * has at most one entry, whose key can change. */
typedef struct {
	fl_ev_t *e;
	int n, *pos;
} fl_heap_t;
/* heap.c: the operations (4-ary; keys never NaN, ids distinct). push adds
 * x (room is the caller's), pop takes the least entry out, del entry k;
 * set (indexed) gives id the key t, adding it when absent; build orders
 * the n entries placed in e (and fills pos). */
void heap_push(fl_heap_t *h, fl_ev_t x);
fl_ev_t heap_pop(fl_heap_t *h);
void heap_del(fl_heap_t *h, int k);
/* Entry k replaced by x, moved to its place. */
void heap_replace(fl_heap_t *h, int k, fl_ev_t x);
void heap_set(fl_heap_t *h, int id, double t);
void heap_build(fl_heap_t *h);
/* The least entry (h->n > 0) replaced by x, moved to its place. */
void heap_replace_top(fl_heap_t *h, fl_ev_t x);

typedef struct {
	const sp_cluster_t *c;
	sp_arena_t *a;
	double now;
	int n_jobs, cap_jobs, n_waiting;
	fl_job_t *jobs;
	int *waiting;            /* ready all-reduces */
	fl_heap_t pending, ev, lv; /* jobs by start; phase ends; links by level */
	/* A sharing's new times (fresh, n_fresh) go into ev by group of one
	 * time: its jobs in increasing order in gm from an entry's aux to a
	 * -1, one entry for the group (its next job; ev.pos indexes it). */
	fl_ev_t *fresh;
	int n_fresh;
	int *gm, gm_n, gm_cap;
	/* jobs by start too: those added in (start, job) order after the
	 * last one here, in that order at [in_head, in_n); the pending heap
	 * holds the others (most jobs come in order) */
	fl_ev_t *in_order;
	int in_head, in_n;
	/* transfers by start too: per sender, its jobs in (start, job) order
	 * (a device's clock never goes back) from fhead through fnext to
	 * ftail, -1 when none; the heap src holds each sender's first (one
	 * not in order goes to the others) */
	int *fhead, *ftail;
	fl_heap_t src;
	int queues;              /* 1 (fl_init): the senders' queues in use; 0 (a
				  * test's check of their exactness): not */
	/* per link: the loads draining through it (job, index of the load) */
	struct fl_on {
		int job, load;
	} **lj;
	int *ln, *lcap;
	int *seeds, n_seeds;     /* links whose jobs changed (room: every link) */
	int *seeded;             /* per link: the epoch it is a seed for */
	double *cap;             /* per link: bytes per ms */
	char *frozen, *busy;     /* per component slot; per device (in an all-reduce) */
	/* per device: the waiting collectives over it, in the order they
	 * became ready, from whead (-1: none waiting) through their wnext;
	 * wtail/wtail_i the last one and its member's index, read only while
	 * whead is not -1 (stale once a queue empties) */
	int *whead, *wtail, *wtail_i;
	char *touched;           /* per link: in changed[] (its level changed this round) */
	/* while sharing: per link what is left, the unfrozen weight, its loads'
	 * jobs (component slots on[r][0..cnt), unfrozen of them); the
	 * component's links and jobs (marked with epoch) */
	double *left, *sum;
	int **on, *oncap, *cnt, *unfrozen, *links, *changed;
	int *comp, *lmark, epoch;
	int freed, arrived;
} fl_net_t;

/* Room for max_jobs jobs, arrays from a. SP_ENOMEM. */
int fl_init(fl_net_t *out, const sp_cluster_t *c, sp_arena_t *a, int max_jobs);
/* A transfer of bytes from a to b leaving at start (>= the clock); its job. */
int fl_xfer(fl_net_t *n, double start, int a, int b, int64_t bytes);
/* A collective over devs (kept, increasing ids) ready at ready: op
 * COLL_ALL_REDUCE an all-reduce of bytes (net_allreduce_phases),
 * COLL_REDUCE_SCATTER / COLL_ALL_GATHER the reduce-scatter / all-gather of
 * a bucket of bytes (net_half_phases); bytes 0 takes no time. Its job, or a
 * negative code. */
int fl_coll(fl_net_t *n, double ready, const int32_t *devs, int nd, int64_t bytes,
	    sp_coll_op_t op);
/* Marks transfer j as awaited: fl_advance(n, 1) stops when it arrives. */
void fl_await(fl_net_t *n, int j);
/* Runs events in time order: until an awaited transfer arrives (1) when
 * until_arrival, else until every job is done (0); SP_ENOMEM. Jobs added
 * later must not start before the clock. */
int fl_advance(fl_net_t *n, int until_arrival);
/* When job j finished, or -1 (inline: sim.c asks once per awaited
 * transfer and sync, the call cost more than the read). */
static inline double fl_done(const fl_net_t *n, int j)
{
	return n->jobs[j].done;
}

/* ---- sched.c (shared) and sched_*.c: schedules ---------------------------- */

typedef struct {
	int metaop, lf, lt; /* layers [lf, lt) */
	int n;              /* devices */
	int wave;
	double t0, t1;      /* nominal start/end (the scheduler's own estimate) */
	int chunk;          /* > 0: continues the previous slice on its devices */
	int dev_off;        /* >= 0: devices chosen by the scheduler, in devs */
	int tp;             /* tensor-parallel degree (0 counts as 1) */
} sslice_t;

/* A schedule; its arrays grow in *arena (pl->scratch: one candidate), so
 * there is nothing to release. */
typedef struct {
	algo_t algo;
	sslice_t *s;
	int n, cap;
	int n_waves;
	int32_t *devs; /* devices of slices placed while scheduling */
	int n_devs, cap_devs;
	sp_arena_t *arena;
	int bwd_eager; /* the lowering's backward order: 0 the forward's reverse,
			* 1 eager (lower_xfer.c) */
} sched_t;

/* An empty schedule of algorithm a growing in arena. */
void sched_init(sched_t *s, algo_t a, sp_arena_t *arena);
int sched_push(sched_t *s, int metaop, int lf, int lt, int n, int wave, double t0,
	       double t1);
/* The same, with the slice's n devices chosen already. */
int sched_push_devs(sched_t *s, int metaop, int lf, int lt, int n, double t0, double t1,
		    const int32_t *devs);
/* out becomes a copy of s (its arrays in out->arena). */
int sched_copy(sched_t *out, const sched_t *s);
/* The latest nominal end of a slice. */
double sched_makespan(const sched_t *s);
/* out becomes a copy of trial t when t (rc 0) ends sooner than *best_ms
 * by a relative 1e-9 (*best_ms updated); rc, or SP_ENOMEM. */
int sched_keep_shorter(sched_t *out, const sched_t *t, int rc, double *best_ms);
/* Sorts slices by (t0, wave, creation), renumbers waves by distinct t0. */
int sched_finish(sched_t *s);
/*
 * Splits long slices of parameterised MetaOps into up to SYNC_CHUNKS chunks
 * on the same devices, so each chunk's gradients can be all-reduced while
 * the backward of the chunks before it still runs.
 */
#define SYNC_CHUNKS 4
int sched_chunk(sched_t *s, const planner_t *pl);
/* tp_cost.c: every slice's tensor-parallel degree, one per class of
 * MetaOps sharing a component (the t of least layer-time over the class
 * among those all its slices can run; forced: pl->tp_force where they
 * can, else 1: slices wider than their batch shrink to it); SP_ENOMEM. */
int tp_assign(planner_t *pl, sched_t *s);
/* The largest t of MetaOp m's slices in plan p (1: whole layers). */
int tp_metaop(const sp_plan_t *p, int m);
/* For report.c: the MetaOps that split and their t, as text lines, or the
 * JSON member "tp" (after a ","): every MetaOp's name and t. */
void tp_report(FILE *f, const sp_plan_t *p);
void tp_json(FILE *f, const sp_plan_t *p);
/* Checks coverage, precedence and device counts; an internal error if broken. */
int sched_check(const planner_t *pl, const sched_t *s);
/* 1 when a and b are the same schedule: slices (every field), devices
 * (plan.c). */
int sched_same(const sched_t *a, const sched_t *b);
/* qsort order by a double key, then an int id (ascending both). */
static inline int sched_cmp_key_id(double ka, int ia, double kb, int ib)
{
	if (ka != kb)
		return ka < kb ? -1 : 1;
	return (ia > ib) - (ia < ib);
}
/* Per-layer fwd+bwd ms of m on n devices. */
static inline double mop_t(const metaop_t *m, int n)
{
	return m->tf[n] + m->tb[n];
}
/* 1 when c devices run m faster than c - 1 (the local batch shrinks). */
int width_gains(const metaop_t *m, int c);
/* The fewest devices that run m as fast as n do. */
int width_floor(const metaop_t *m, int n);
/* Bottom levels (longest path from m to the end, m included) at widths w. */
void sched_blevels(const planner_t *pl, const int *w, double *bl);
/* Component of MetaOp m's layer l; *layer: its layer in the component. */
int mop_comp(const planner_t *pl, int m, int l, int *layer);

/* A scheduler's answer besides 0 and the negative error codes: the
 * candidate adds nothing (no plan; another candidate covers it). */
#define SCHED_NOTHING_NEW 1

int sched_sequential(planner_t *pl, sched_t *out);
int sched_task_level(planner_t *pl, sched_t *out);
int sched_distmm(planner_t *pl, sched_t *out);
int sched_paper(planner_t *pl, sched_t *out);
/* The paper's wave packing over the whole DAG (a candidate of ours). */
int sched_paper_dag(planner_t *pl, sched_t *out);
/* The paper's relaxed optimum of independent MetaOps mops[0..k) with rem[i]
 * layers on N devices, by the authors' inverse of T (speed-up interpolated
 * between batch-divisible counts); n_out[i]: real n* (may be NULL). */
double paper_cstar(const planner_t *pl, const int *mops, const double *rem, int k,
		   double N, double *n_out);

/* ---- allot.c: our widths (phase 1) ------------------------------------------ */

/* Separable allotment: each MetaOp's cheapest width meeting a common
 * deadline, the best deadline. Temporaries in pl->scratch. */
int allot_separable(planner_t *pl, int *w);
/* The GLPK MILP; improves w (from allot_separable) if it can: solved
 * only when allot_lower leaves room below w's objective. */
int allot_milp(planner_t *pl, int *w);
/* The same, always solved (what allot_milp must equal). */
int allot_milp_solve(planner_t *pl, int *w);
/* A lower bound on allot_objective over the MILP's width choices. */
int allot_lower(planner_t *pl, double *out);
/* The MILP's objective at widths w: the larger of the area and
 * critical-path bounds (scratch: room for M bottom levels). */
double allot_objective(const planner_t *pl, const int *w, double *scratch);
/* Frees the calling thread's GLPK state (a worker thread, before it ends). */
void allot_thread_end(void);
/* Local search on w against the list schedule's makespan at memory
 * fraction frac. */
int allot_search(planner_t *pl, int *w, double frac);

/* ---- sched_list.c: list scheduling with homes and malleable tails --------- */

/* Phase 2 at widths w, a segment's layers within frac of the cap;
 * SP_EINFEAS when some MetaOp finds no device with room. */
int sched_list(planner_t *pl, const int *w, double frac, sched_t *out);
/* The same with sync homes (sched_list.c): a component some MetaOp of
 * which w makes wider than nodes / share whole nodes is held on homes of
 * that many nodes, one cut into a single segment on homes of nodes /
 * share1 nodes when that is narrower; SCHED_NOTHING_NEW when no
 * component is (sched_list's schedule). */
int sched_list_sync(planner_t *pl, const int *w, double frac, int share, int share1,
		    sched_t *out);
/* The same, stopping with SCHED_PAST once a slice ends at or after stop
 * (the makespan is then at least stop). */
#define SCHED_PAST 2
int sched_list_until(planner_t *pl, const int *w, double frac, double stop, sched_t *out);

/* ---- sched_lanes.c: lanes (fluid widths made integral) ---------------------- */

/* Lower convex hull of the points (time[k], k time[k]), k = 1..nmax (area
 * time[k] if !scales), by time ascending: the least device-time to finish
 * within a span, mixing widths over layers (bound.c). */
typedef struct {
	int n;
	double *t, *a;
} hull_t;

/* How a lane splits its last devices between two widths. */
typedef enum {
	LANE_SPLIT_HULL,      /* the two widths of the lane's hull at H */
	LANE_SPLIT_NEAREST,   /* the two nearest widths that gain */
	LANE_SPLIT_ONE_SHARED, /* McNaughton's one shared device */
	LANE_SPLIT_MID_STEP,  /* the hull's widths with a middle step */
} lane_split_t;

typedef struct {
	lane_split_t first_split; /* tries splits first_split .. + n_splits - 1 */
	int n_splits;
	int endgame;              /* lanes that outrun their windows go on */
	int rounds;               /* calibration rounds per try */
	int apart;                /* components apart: each component's lanes get
				   * whole devices of their own (no device, window
				   * or end game shared with another component's
				   * lanes), so align.c can give it whole nodes */
} lanes_opts_t;

/* Above this many devices the lanes calibrate less (each try costs more). */
#define LANES_BIG_CLUSTER 256

/* A lane: a chain of MetaOps from a source (sched_lanes.c's header). */
typedef struct {
	int first, n; /* its MetaOps: lm[first .. first + n) */
	hull_t hull;  /* of its time at each width */
	double tail;  /* bottom level after its last MetaOp */
	int key;      /* component of its heaviest MetaOp */
	int heavy;    /* that MetaOp */
	double x;     /* fluid width */
} lane_t;

/* The lanes of the DAG at widths w; they depend on w only, so every try
 * of one sched_lanes call shares them. In pl->scratch. */
typedef struct {
	lane_t *ln;
	int nl;
	int *lm;      /* the lanes' MetaOps, lane after lane */
	int *in_lane; /* per MetaOp */
} lanes_t;
int lanes_build(planner_t *pl, const int *w, lanes_t *L);
/* The horizon: the shortest H with sum of fluid widths <= N (bisection). */
double lanes_horizon(const lanes_t *L, int N);
/* MetaOps outside lanes (the joins), in topological order, each at its
 * allotted width w on the devices free first (free_at, per device) once
 * its inputs are done (finish, per MetaOp); both are updated. */
int lanes_joins(planner_t *pl, const int *w, const int *in_lane, double *finish,
		double *free_at, sched_t *out);
/* Devices a MetaOp of a lane uses when the lane has n. */
static inline int lane_width(const metaop_t *mo, int n)
{
	return mo->scales ? width_floor(mo, SP_MIN(n, mo->nmax)) : 1;
}

/* ---- sched_pack.c: packed lanes (two widths each, devices as intervals) ----- */

/* The lanes at two widths each, switching at layer boundaries, packed on
 * the least horizon that fits (sched_pack.c's header); the joins at widths
 * w. flags: SCHED_PACK_ASC, a lane's plans that tie take the ascending
 * order (its wide phase last) before the descending one;
 * SCHED_PACK_REORDER, a greedy placement that fails is tried again with
 * the lane that found no room first (at most as many times as there
 * are lanes), and nothing new
 * where no horizon fitted that way; SCHED_PACK_TAILS, of the horizons
 * tried the one kept is the one whose latest device end plus optimizer
 * step is least, not the shortest; SCHED_PACK_HANDOVER, a lane's change
 * of width takes the time its hand-over's transfers take (sched_pack.c
 * hand_over_ms). SCHED_NOTHING_NEW when the DAG has no lanes that pack. */
#define SCHED_PACK_ASC 1
#define SCHED_PACK_REORDER 2
#define SCHED_PACK_TAILS 4
#define SCHED_PACK_HANDOVER 8
int sched_pack(planner_t *pl, const int *w, int flags, sched_t *out);

/* The shortest lanes schedule over the tries of o; *mids counts the middle
 * steps taken. */
int sched_lanes(planner_t *pl, const int *w, const lanes_opts_t *o, int *mids,
		sched_t *out);

/* ---- candidates.c: our scheduling candidates, as data ---------------------- */

typedef enum { CAND_ALLOT_NONE, CAND_ALLOT_SEPARABLE, CAND_ALLOT_MILP, CAND_ALLOT__COUNT } cand_allot_t;
typedef enum { CAND_LIST, CAND_LANES, CAND_PAPER_DAG, CAND_BASELINE, CAND_TASKS, CAND_PACK } cand_sched_t;

typedef struct {
	const char *name;
	cand_allot_t allot;
	cand_sched_t sched;
	double mem_frac;     /* CAND_LIST: a segment's layers within this of the cap */
	lanes_opts_t lanes;  /* CAND_LANES */
	int max_devices;     /* 0: any cluster; else skipped above this */
	int min_nodes;       /* 0: any cluster; else skipped below this many nodes */
	int reuses_baseline; /* the sequential plan: plan.c may reuse it */
	int bwd_eager;       /* its schedule's backward in the eager order */
	int home_share;      /* CAND_LIST: sync homes of nodes / home_share
			      * whole nodes (sched_list_sync); 0: none */
	int home_share1;     /* the same for a component held in one segment */
	int pack_flags;      /* CAND_PACK: SCHED_PACK_* (sched_pack) */
} sched_cand_t;

extern const sched_cand_t sched_cands[];
extern const int n_sched_cands;
/* The row named name, or NULL. */
const sched_cand_t *cand_find(const char *name);

/* The walk's state for one planning run: allotments, computed once each. */
typedef struct {
	int *widths[CAND_ALLOT__COUNT]; /* in pl->arena */
} cand_state_t;

/* The allotment cand_schedule computes (on first use) for c: CAND_ALLOT_NONE
 * when it computes none (the cluster is outside c's limits, or its
 * scheduler reads no widths). */
cand_allot_t cand_allot_kind(const planner_t *pl, const sched_cand_t *c);
/* Computes allotment kind into st (in pl->arena) unless st has it. */
int cand_allot(planner_t *pl, cand_state_t *st, cand_allot_t kind);
/* Candidate c's schedule; SCHED_NOTHING_NEW when it would repeat another
 * (its limits; or its widths equal another allotment st holds already). */
int cand_schedule(planner_t *pl, cand_state_t *st, const sched_cand_t *c, sched_t *out);

/* Algorithm a's schedule (ours: candidate c with state st), finished,
 * checked and chunked; SCHED_NOTHING_NEW passed up. */
int sched_run(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
	      sched_t *out);

/* ---- jobs.c: worker threads ------------------------------------------------ */

/*
 * A job: run(pl, job) on some thread of the pool, pl that thread's planner
 * (jobs_sync's copy of the caller's, with its own arenas, error, cost memo
 * and MetaOps: cost_use on it is the thread's alone), job->err its error; it starts once the jobs in after[] (NULL:
 * none) are done, least prio first. Results go where run writes them
 * (through arg); a job's caller reads them after jobs_wait.
 */
enum { JOB_IDLE, JOB_PENDING, JOB_RUNNING, JOB_DONE, JOB_DROPPED };
#define JOB_MAX_AFTER 2
typedef struct sp_job {
	int (*run)(planner_t *pl, struct sp_job *job);
	void *arg;
	int prio;
	const struct sp_job *after[JOB_MAX_AFTER];
	int state, rc;
	sp_err_t err;
} sp_job_t;
typedef struct jobs jobs_t;

/* A pool of n threads in all: n - 1 started, the caller's the n-th (it
 * runs jobs while it waits). SP_ENOMEM, or SP_EINTERNAL when a thread
 * does not start (err says which). */
int jobs_start(jobs_t **out, const planner_t *pl, int n, sp_err_t *err);
/* Every thread's planner becomes a copy of pl's state (the active cost
 * tables: call after cost_use), keeping its arenas, error and memo. Only
 * while no job is queued. */
void jobs_sync(jobs_t *j, const planner_t *pl);
/* Queues job (state JOB_PENDING; rc and err cleared). */
int jobs_add(jobs_t *j, sp_job_t *job);
/* Returns once job is done or dropped, running queued jobs meanwhile. */
void jobs_wait(jobs_t *j, sp_job_t *job);
/* Marks job, never queued, done: a milestone other jobs wait for in after[]
 * (until then it holds them back). */
void jobs_mark_done(jobs_t *j, sp_job_t *job);
/* Takes job out of the queue: not run if it has not started, else once it
 * is done (never queued: nothing). */
void jobs_drop(jobs_t *j, sp_job_t *job);
/* Drops every queued job not started, waits for those running, and
 * empties the queue. */
void jobs_clear(jobs_t *j);
/* The pool's lock, for what jobs share besides their results. */
void jobs_lock(jobs_t *j);
void jobs_unlock(jobs_t *j);
/* Stops the threads and frees the pool (NULL: nothing). */
void jobs_free(jobs_t *j);

/* ---- bound.c: lower bounds -------------------------------------------------- */

typedef struct {
	double area_ms, cp_ms, paper_ms, lower_ms, allot_ms;
	/* bound_comm of the chosen plan (plan.c fills it after placement) */
	double comm_ms;
	/* bound_comm_any: a communication bound of every plan */
	double comm_any_ms;
} bounds_t;
/* Its work arrays come from pl->scratch and are given back on return. */
void bound_compute(planner_t *pl, bounds_t *out);
/* Communication lower bound on placed plan p's iteration (bound.c's
 * header); 0 or SP_ENOMEM. */
int bound_comm(double *out, const sp_plan_t *p, const sp_cluster_t *c);
/* Communication lower bound on every plan's iteration (bound.c's header:
 * comm_any); 0 or SP_ENOMEM; scratch given back. */
int bound_comm_any(planner_t *pl, double *out);
/* Its core: the least T (ms) with E(T) <= T cap_ms, for the nw groups of
 * work W[i] (device-ms) and gradient bytes S[i], G GPUs per node, cap_ms
 * the cluster's NIC bytes per ms each way; at most max W[i] / G (every
 * group inside one node). */
double bound_comm_solve(const double *W, const double *S, int nw, int G, double cap_ms);
/* Lower bound on the simulated iteration of lowered plan p from its
 * gradient sync and the compute before it (bound.c's header); any_layout:
 * valid whatever layout each bucket ends with; gathers: the all-gathers
 * after the step count where p's buckets do not defer them (and zero-1
 * taken later would not: layout_trial's, never layout_refine's, which may
 * defer). 0 or SP_ENOMEM; scratch given back. */
int bound_sync(planner_t *pl, const sp_plan_t *p, int any_layout, int gathers, double *out);
/* bound_sync of p as lower_run leaves it (*raw) and a lower bound of
 * bound_sync(q, any, 1) for every q that memplan_run and layout_fit make of
 * p, any as --zero allows (*out; bound.c's header: bound_sync_early).
 * 0 or SP_ENOMEM. */
int bound_sync_early(planner_t *pl, const sp_plan_t *p, double *raw, double *out);
/* How many of bound_sync's collectives pl's memo held (*hits) and how
 * many it computed (*misses), for tests and SPINDLE_TOP_STATS. */
void coll_memo_counts(const planner_t *pl, uint64_t *hits, uint64_t *misses);
/* hull_t (sched_lanes.c's section): its arrays live in a. */
int hull_from_times(sp_arena_t *a, const double *time, int nmax, int scales, hull_t *h);
/* Least area within span C (HUGE_VAL if it cannot). */
double hull_area(const hull_t *h, double C);
/*
 * The paper's relaxed optimum for a set of independent MetaOps: C* with
 * sum_m n_m(C*) = N, n_m(C) = T_m^{-1}(C / L_m) (real n; below one device a
 * MetaOp time-shares, T(n) = T(1)/n). rem[k] = layers left of mops[k].
 */
double relaxed_cstar(const planner_t *pl, const int *mops, const double *rem, int k,
		     double N, double *n_out);
/* Real-valued n with L * T_m(n) = C, by the same convention. */
double relaxed_n(const metaop_t *m, double layers, double C);
/* relaxed_cstar with another inverse of T (HUGE_VAL: C cannot be met). */
typedef double (*relaxed_inv_t)(const metaop_t *m, double layers, double C);
double relaxed_cstar_by(const planner_t *pl, const int *mops, const double *rem, int k,
			double N, double *n_out, relaxed_inv_t inv);

/* ---- place.c: devices for every slice --------------------------------------- */

/* In pl->scratch (one candidate): nothing to release. */
typedef struct {
	int32_t *devs;  /* slice i: devs[off[i] .. off[i] + s[i].n) */
	int32_t *off;
} place_t;

/* Places every slice (keeping devices a scheduler chose already). */
int place_run(planner_t *pl, const sched_t *s, place_kind_t kind, place_t *out);
/* Ascending device ids (sample ranges follow device order). */
void devs_sort(int32_t *d, int n);

/* The placer: device state (free time, memory, held parameters) that a
 * scheduler consults and updates as it schedules; in pl->scratch. */
typedef struct placer placer_t;
int placer_new(placer_t **out, planner_t *pl, place_kind_t kind);
/* Devices free at x->t0 whose memory takes x; *busy_fitting: busy ones. */
int placer_fitting(placer_t *P, const sslice_t *x, int *busy_fitting);
/* The best x->n free devices into out (ascending); returns how many of them
 * fit in memory, or -1 when fewer than x->n are free. */
int placer_choose(placer_t *P, const sslice_t *x, int32_t *out);
void placer_commit(placer_t *P, const sslice_t *x, const int32_t *devs);
/* Counts the state of (comp, layer) as held on devs (a reserved home). */
void placer_reserve(placer_t *P, int comp, int layer, const int32_t *devs, int n);
int placer_free_count(const placer_t *P, double t);
/* 1 when device d is free at t. */
int placer_free_count_dev(const placer_t *P, int d, double t);

/* ---- align.c: a node-aligned variant of a placement ------------------------- */

/* Renumbers the devices of placement pc (schedule s, degrees set by
 * tp_run) so that heavy components' replica groups cover whole nodes
 * (align.c's header); *changed 0 when nothing moved (a tensor-parallel
 * slice, one node, or already aligned). Work arrays in pl->scratch. */
int place_align(planner_t *pl, const sched_t *s, place_t *pc, int *changed);

/* ---- lower.c: per-device programs -------------------------------------------- */

/* Fills plan structure, programs, buckets and held params from s + placement
 * (lower_xfer.c: transfers and instruction order; lower_sync.c: held params,
 * buckets, SYNC and STEP; lower.h: their shared state). Work arrays come from
 * pl->scratch and are given back on return; out's arrays are on the heap. */
int lower_run(planner_t *pl, const sched_t *s, const place_t *pc, sp_plan_t *out);
/* lower_run, with the buckets of 2+ devices that hold a parameter of a
 * component c with z3[c] in zero-3 (the others as lower_run makes them). */
int lower_run_z3(planner_t *pl, const sched_t *s, const place_t *pc, const uint8_t *z3,
		 sp_plan_t *out);

/* ---- memplan.c: memory per device --------------------------------------------- */

/* Fills devices[].mem and mem_peak; reports the worst overflow in err. */
int memplan_run(planner_t *pl, sp_plan_t *p, int check);

/* ---- progs.c: running every device's program together ----------------------------- */

/* What a step function answers for device d's instruction k (in): */
enum { PROGS_WAIT = 0, PROGS_RAN = 1 }; /* or a negative error code */
#define PROGS_STUCK 1                   /* progs_run: no device can move */
typedef int (*progs_step_fn)(void *ctx, int d, int k, const sp_ins_t *in);
/*
 * Devices take turns in id order, each running (step answers PROGS_RAN)
 * until its next instruction must wait. pc[d] (n_devices entries, usually
 * zero) is where device d starts and, on return, where it stopped. Returns
 * 0 when every program finished, PROGS_STUCK when a round moved no device,
 * or the first negative code step returned.
 */
int progs_run(const sp_plan_t *p, int *pc, progs_step_fn step, void *ctx);
/* The same, not visiting the devices d with skip[d] set (their steps
 * would answer PROGS_WAIT); step may change skip as it runs. */
int progs_run_skip(const sp_plan_t *p, int *pc, progs_step_fn step, void *ctx,
		   const char *skip);

/* ---- sim.c: the one evaluator --------------------------------------------------- */

typedef struct {
	double iteration_ms, compute_ms, utilisation;
	double transfer_ms, sync_ms, step_ms;
	double xfer_iteration_ms; /* the pass with transfers, without sync */
	double xfer_last_ms;      /* its last micro-step's part */
	double busy_before;       /* device-ms computing before the last micro-step */
	int partial; /* sim_iteration's: compute, transfer and sync times missing */
} sim_result_t;

/*
 * Event-driven execution of all programs under the cost model. comm: 1 with
 * transfer, sync and step costs; 0 for the compute schedule alone. Fills
 * predicted times into p (slices, waves, devices) when comm is 1.
 */
int sim_run(planner_t *pl, sp_plan_t *p, int comm, sim_result_t *out);
/* What the simulator charges a FWD/BWD/LOSS instruction of plan p: one
 * of its layers (BWD: T_bwd, plus T_fwd where the slice recomputes;
 * LOSS: T_fwd + T_bwd; FWD: T_fwd; at its samples, tp and sp), and the
 * whole instruction (its slice's layers; LOSS once). bound.c's release
 * times use them too: the sync bound holds only while they are equal. */
double ins_layer_ms(const planner_t *pl, const sp_plan_t *p, const sp_ins_t *in);
double ins_compute_ms(const planner_t *pl, const sp_plan_t *p, const sp_ins_t *in);
/* res (sim_run's, comm 1) again after only bucket layouts changed. */
int sim_sync_again(planner_t *pl, sp_plan_t *p, sim_result_t *res);
/* sim_run (comm 1) in two steps, for judging many plans: with one
 * micro-batch the iteration and utilisation (and p's predicted times) are
 * the full pass's alone, so sim_iteration runs only that pass and marks
 * res partial; sim_complete runs the other two and fills the rest. Both
 * steps together give bit for bit what sim_run gives, also with
 * sim_sync_again or layout_trial between them. */
int sim_iteration(planner_t *pl, sp_plan_t *p, sim_result_t *res);
int sim_complete(planner_t *pl, sp_plan_t *p, sim_result_t *res);
/* The compute and transfer passes alone: res's compute_ms, transfer_ms
 * and xfer_iteration_ms as sim_run sets them (nothing else). */
int sim_transfers(planner_t *pl, sp_plan_t *p, sim_result_t *res);

/* ---- sim_memo.c: ours' simulations, once per lowered plan --------------------- */

typedef struct {
	uint64_t hash;
	size_t len;
	unsigned char *blob; /* the plan's bytes, malloc'd (NULL: not kept) */
	int32_t tag[3];      /* sim_pass_*: the pass */
} sim_memo_key_t;
/* 1 when a plan equal to p (lowered, not yet simulated) was simulated
 * earlier in this run (sim_memo_add): its result into *r and *f. Else 0,
 * and key holds p's bytes (when there is room) for sim_memo_add; or
 * SP_ENOMEM. */
int sim_memo_find(planner_t *pl, const sp_plan_t *p, sim_memo_key_t *key, sim_result_t *r,
		  double *f);
/* key's plan simulated to r and f (plan.c plan_simulated); r NULL: it
 * failed, nothing is recorded (key's bytes are freed either way). 0 or
 * SP_ENOMEM. */
int sim_memo_add(planner_t *pl, sim_memo_key_t *key, const sim_result_t *r, double f);
/* sim.c's pass tag (mode, record, micro-step; a pass with sync) of p in
 * the state it is in now, run earlier in this run (sim_pass_add): 1, its
 * iteration and busy time into out[0..1] and the times it recorded into
 * p's slices, devices and waves. Else 0, and key holds p's bytes (when
 * there is room) for sim_pass_add; or SP_ENOMEM. */
int sim_pass_find(planner_t *pl, sp_plan_t *p, const int32_t tag[3], sim_memo_key_t *key,
		  double out[2]);
/* key's plan passed to out[0..1], its times recorded in p; out NULL: the
 * pass failed, nothing is recorded. 0 or SP_ENOMEM. */
int sim_pass_add(planner_t *pl, sim_memo_key_t *key, const sp_plan_t *p, const double *out);
/* Frees the recorded plans' bytes (before pl->arena goes). */
void sim_memo_release(planner_t *pl);
/* 1 when plans a and b are equal in every array the memo keys on (those
 * the simulator and the layout trials read), else 0. */
int sim_memo_same(const sp_plan_t *a, const sp_plan_t *b);

/* ---- sim_stats.c: the debug env SPINDLE_SIM_STATS ------------------------------ */

/* Before a whole-plan simulation of p at site (a string literal): counted,
 * with whether p's state was simulated before (every whole-plan
 * simulation runs the same full pass with sync on it: sim_iteration,
 * sim_run, sim_sync_again). sim_stats_print prints the counts on stderr
 * (plan.c, at the end of a run). Both do nothing unless SPINDLE_SIM_STATS
 * is set. */
void sim_stats_note(const char *site, const sp_plan_t *p);
/* Something that is not a simulation happened (what: a string literal):
 * counted, printed by sim_stats_print as "event" lines. */
void sim_stats_event(const char *what);
void sim_stats_print(void);
/* top_choose's kept plan of row idx refined to r, f: printed at once
 * (the test that top_ready's shortcuts change nothing compares them). */
void sim_stats_refined(int idx, const sim_result_t *r, double f);

/* ---- layout.c: zero-1 buckets and recomputing slices ------------------------- */

/* Which components the estimates price with zero-1 state and recomputed
 * activations (after cost_build). */
int layout_prepare(planner_t *pl);
/* Parameter state of one layer of comp (or MetaOp m) on a slice of n
 * devices, and the activation bytes m keeps per layer and sample, as the
 * schedulers and the placer estimate them. */
double layout_comp_state(const planner_t *pl, int comp, int n);
double layout_state_bytes(const planner_t *pl, int m, int n);
double layout_saved_per_sample(const planner_t *pl, int m);
/* On a lowered plan with its memory, before the simulator: the auto
 * choices that make it fit (GATHERs put in, memory updated). */
int layout_fit(planner_t *pl, sp_plan_t *p);
/* Ours, once simulated (res): zero-1 for large components' other buckets
 * when not slower (p and res updated). */
int layout_trial(planner_t *pl, sp_plan_t *p, sim_result_t *res);
/* --zero auto, an algorithm's chosen plan p once simulated (res): the
 * replicated buckets whose zero-1 shortens the optimizer step's tail
 * (layout.c's estimate, greedily) in zero-1, kept when the simulator says
 * the iteration is faster (p and res updated). */
int layout_refine(planner_t *pl, sp_plan_t *p, sim_result_t *res);
/* layout_refine in two parts that may run at once (walk_jobs.c, --jobs):
 * layout_last_init copies p (before anything else changes it) for the
 * last trial, layout_last_run simulates it on any thread, beside
 * layout_refine_head (every trial but the last) on p; layout_last_join
 * then leaves p and res as layout_refine would have, or returns the last
 * trial's error. layout_last_release frees the copy (NULL: nothing). */
typedef struct {
	sp_plan_t q; /* p's buckets, devices, slices, waves and programs
		      * copied; the rest p's, read only */
	sim_result_t r;
	int tried, rc;
} layout_last_t;
int layout_refine_head(planner_t *pl, sp_plan_t *p, sim_result_t *res);
int layout_last_init(planner_t *pl, layout_last_t *t, const sp_plan_t *p,
		     const sim_result_t *res);
int layout_last_run(planner_t *pl, layout_last_t *t);
int layout_last_join(planner_t *pl, layout_last_t *t, sp_plan_t *p, sim_result_t *res);
void layout_last_release(layout_last_t *t);
/* --zero auto, a model with a large component, the chosen plan p over the
 * cap: p lowered again on its own schedule and placement with the large
 * components' buckets of 2+ devices in zero-3, fitted (layout_fit),
 * simulated and tried (layout_trial); it replaces p and res (p's complete
 * simulation) when it fits. 1 when it did, 0, or an error. */
int layout_zero3(planner_t *pl, sp_plan_t *p, sim_result_t *res);
/* The report's layouts: each bucket's layout and each transformer MetaOp's
 * recomputing slices, with the bytes they free per device and the time they
 * add, as text or as the JSON members "buckets" and "metaops" (each after
 * a ","). */
/* earlier_ms: the micro-steps before the last one (plan_summary_t) */
void layout_report(FILE *f, const sp_plan_t *p, double earlier_ms);
void layout_json(FILE *f, const sp_plan_t *p, double earlier_ms);
/* After memplan_run found the chosen plan (closest) over the cap: names in
 * err's hint the cheapest change that fits, each one re-planned (the
 * layouts the options forbade, a smaller --mem-reserve, the fewest more
 * nodes). Returns SP_EINPUT when the forced layouts are what does not fit
 * (auto fits), else SP_EINFEAS. */
int layout_advise(planner_t *pl, const sp_plan_t *closest);
/* SP_EINPUT when --zero 1 was asked and no group of p can be sharded. */
int layout_forced_check(planner_t *pl, const sp_plan_t *p);

/* ---- verify.c ------------------------------------------------------------------- */

/* verify_plan: plan_verify.h (its own library, which spindle-run links too). */

/* ---- plan.c: the pipeline ------------------------------------------------------- */

/* An algorithm's figures beside its sp_algo_result_t that the plan file does
 * not hold (its format stays as it is): what transfers and then sync with
 * the optimizer step add to the compute schedule (sim_result_t), and the
 * model FLOPs utilisation (plan.c says which FLOPs count). */
typedef struct {
	double sync_ms, transfer_ms, mfu;
} algo_extra_t;

typedef struct {
	sp_algo_result_t algos[ALGO__COUNT];
	algo_extra_t extra[ALGO__COUNT];
	int ran[ALGO__COUNT];
	algo_t chosen;
	bounds_t bounds;
	double total_ms;
	/* the chosen plan's micro-steps before its last one: their predicted
	 * time (passes with transfers, without sync; 0 with one micro-step),
	 * what micro-batching adds to the iteration */
	double mb_earlier_ms;
} plan_summary_t;

/* Micro-batches per task k (m->n_tasks entries, each a divisor of its
 * task's batch) with which the inputs plan and fit under o, more than one
 * for some task: the first that fit along auto's sequence (plan.c
 * mb_sequence: the task holding the most activations gets more first).
 * The step of that sequence (>= 1) when found, 0 when none does. */
int microbatch_fit(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c, int *k);
/* k as --microbatches takes it into buf: "N" when every task has N
 * (*uniform 1), else "task=N,..." of the tasks with more than one. */
int mb_describe(char *buf, size_t cap, const sp_model_t *m, const int *k, int *uniform);
int planner_run(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
		sp_plan_t *out, plan_summary_t *sum, sp_err_t *err);

/* ---- report.c -------------------------------------------------------------------- */

void report_print(FILE *f, const sp_plan_t *p, const plan_summary_t *s);
void report_json(FILE *f, const sp_plan_t *p, const plan_summary_t *s);

/* ---- costs.c: the cost table out (--costs) ------------------------------------- */

/* Builds the MetaOps and their costs (its own arenas) and prints them with
 * the collective, transfer and step prices as JSON (schemas/costs.schema.json);
 * on error prints nothing. */
int costs_print(FILE *f, const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
		sp_err_t *err);

/* ---- inspect.c ------------------------------------------------------------------- */

typedef struct {
	int64_t layers, params;
	int64_t fwd_flops, bwd_flops; /* per sample, all layers of the node */
	int64_t out_bytes;            /* output activation per sample */
	int64_t saved_bytes;          /* saved for backward per sample */
} inspect_node_t;

typedef struct {
	int64_t params, state_bytes_per_param, state_bytes;
	int64_t iter_flops, saved_bytes; /* whole iteration, all tasks */
} inspect_model_t;

void inspect_node(inspect_node_t *out, const sp_model_t *m, const sp_task_t *t,
		  const sp_node_t *n);
void inspect_model(inspect_model_t *out, const sp_model_t *m);
void inspect_print(FILE *f, const sp_model_t *m, const sp_cluster_t *c);

#endif
