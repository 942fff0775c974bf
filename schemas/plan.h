/*
 * plan.h — the plan: what the planner produces, what plan.bin stores, what
 * the runtime and the tools read. Defined once here; plan_write.c and
 * plan_decode.c map it to and from the binary format (schemas/PLAN-FORMAT.md).
 *
 * Vocabulary. A MetaOp is a chain of operators (layers) of one task with
 * one shape. Its activations at layer boundary l (0 = input, L = output)
 * are the value act(m, l), shape [task batch, seq, width]; grad(m, l) is
 * the gradient of the loss with respect to it. A slice runs layers [a, b)
 * of one MetaOp on a device group; inside it the batch is split in
 * contiguous sample ranges, device i of n getting [i*B/n, (i+1)*B/n).
 * Every device runs one program: a list of instructions.
 */
#ifndef SPINDLE_PLAN_H
#define SPINDLE_PLAN_H

#include "common.h"
#include "model.h"

#define PLAN_MAGIC "SPINDLE\0PLAN"
#define PLAN_MAGIC_LEN 12
#define PLAN_VERSION 9
/* tensor-parallel degree of a slice or a shard: at most this */
#define SP_MAX_TP 64
/* micro-batches per step (provenance microbatches): at most this many */
#define SP_MAX_MICROBATCHES 4096

typedef enum {
	INS_FWD = 1,  /* forward of slice's layers on samples [s0,s1) */
	INS_BWD = 2,  /* backward of slice's layers, accumulates param grads */
	INS_SEND = 3, /* src value [s0,s1) x seq [src.seq_off, +seq_len) to peer */
	INS_RECV = 4, /* from peer into dst value at dst.seq_off (grad: added) */
	INS_COPY = 5, /* local: src value -> dst value (grad: added) */
	INS_LOSS = 6, /* sink slice: loss of [s0,s1) and grad(m,0)[s0,s1) */
	INS_SYNC = 7, /* start bucket `peer`'s gradient collective over its group:
		       * all-reduce (replicated) or reduce-scatter (zero-1) */
	INS_STEP = 8, /* per sync bucket, in program order: wait for its
		       * collective, update its parameters (zero-1: its shard) */
	INS_GATHER = 9, /* after STEP, zero-1 bucket `peer`: start the all-gather
			 * of the updated weights from every member's shard */
	INS_PGATHER = 10, /* zero-3 bucket `peer`: all-gather its weights from the
			   * members' shards into a full buffer (blocking: a
			   * rendezvous of the bucket's members) */
	INS_PFREE = 11    /* zero-3 bucket `peer`: give its full weights back */
} sp_ins_op_t;

/* State layout of a sync bucket's parameters over its devices. */
typedef enum {
	LAYOUT_REPLICATED = 0, /* every member holds weights, gradients, optimizer state */
	LAYOUT_ZERO1 = 1,      /* optimizer state (and fp32 master weights) sharded:
				* member i of n owns elements sample_range(elems, i, n) */
	LAYOUT_ZERO2 = 2,      /* as zero-1, and the gradients sharded too: the full
				* gradient lives from the first BWD (or LOSS)
				* writing into the bucket until its SYNC's
				* reduce-scatter into the member's shard */
	LAYOUT_ZERO3 = 3,      /* as zero-2, and the weights sharded too: the full
				* weights exist only from a PGATHER to its PFREE */
	LAYOUT__COUNT
} sp_layout_t;

/* 1 when layout shards the optimizer state (zero-1, 2 and 3): SYNC is a
 * reduce-scatter, STEP updates the shard. */
static inline int layout_sharded(int layout)
{
	return layout == LAYOUT_ZERO1 || layout == LAYOUT_ZERO2 || layout == LAYOUT_ZERO3;
}

/* 1 when the gradients are sharded too (zero-2 and zero-3): a full gradient
 * lives from its first write to its reduce-scatter (plan_zero2.c). */
static inline int layout_grads_sharded(int layout)
{
	return layout == LAYOUT_ZERO2 || layout == LAYOUT_ZERO3;
}

/* 1 when a GATHER after the STEP all-gathers the updated weights (zero-1
 * and zero-2; zero-3 keeps only the shard, gathered at each use). */
static inline int layout_gathers_after_step(int layout)
{
	return layout == LAYOUT_ZERO1 || layout == LAYOUT_ZERO2;
}

/* A reference to a value on the executing device. */
typedef struct {
	int32_t metaop;
	int32_t layer;   /* boundary 0..L; -1: the memory of a cross-attention
			  * MetaOp (shape.mem_seq > 0): act(m, -1) is
			  * [batch, mem_seq, mem_width], read by every layer of
			  * every slice of m; grad(m, -1) sums every layer's
			  * gradient with respect to it */
	int32_t grad;    /* 0: act(m, l), 1: grad(m, l) */
	int32_t seq_off; /* first token on the seq axis */
} sp_vref_t;

typedef struct {
	int32_t op;     /* sp_ins_op_t */
	int32_t slice;  /* FWD, BWD, LOSS: the slice; else -1 */
	int32_t s0, s1; /* sample range in the task's batch */
	int32_t seq_len; /* SEND, RECV, COPY: tokens moved per sample */
	sp_vref_t src, dst;
	int32_t peer; /* SEND/RECV: the other device; SYNC: the bucket */
	int32_t tag;  /* SEND/RECV: transfer id, equal on both ends */
} sp_ins_t;

typedef struct {
	int32_t task;
	sp_opshape_t shape;
	int32_t n_layers;
	int32_t first_op;  /* into plan.ops: n_layers operators in order */
	int32_t seq_in;    /* seq of act(m, 0) */
	int32_t width_in;  /* width of act(m, 0) (0 for sources: data) */
	int32_t seq_out, width_out; /* of act(m, l >= 1); 0 for sinks */
	double fwd_ms, bwd_ms;     /* per layer at the slice's local batch: see slices */
	int32_t profiled;  /* 1: cost from the cluster profile, 0: analytic */
	char name[2 * SP_NAME_MAX]; /* "task/node" or "task/node..node" */
} sp_metaop_t;

typedef struct {
	int32_t node;  /* node index in the MetaOp's task */
	int32_t layer; /* layer of the component (node.layer_from + k) */
} sp_op_t;

/* Producer p feeds consumer c: act(p, L_p) -> act(c, 0) at seq_off; or,
 * with memory = 1, act(p, L_p) -> act(c, -1), the memory every layer of the
 * cross-attention MetaOp c reads (seq_off 0, seq_len c's shape.mem_seq). */
typedef struct {
	int32_t src, dst;
	int32_t seq_off, seq_len;
	int32_t memory; /* 0: an input, 1: the consumer's memory */
} sp_edge_t;

typedef struct {
	int32_t wave;
	int32_t metaop;
	int32_t layer_from, layer_to;
	int32_t n_dev, dev_off; /* devices: plan.slice_devs[dev_off .. +n_dev) */
	double start_ms, fwd_ms, bwd_start_ms, bwd_ms; /* predicted; bwd includes recompute */
	int32_t recompute; /* 1: FWD keeps each layer's input only; BWD re-runs each
			    * layer's forward from it before its backward */
	int32_t tp;        /* tensor-parallel degree t >= 1: devices are n_dev / t
			    * groups of t consecutive entries, member j holds
			    * shard j of each layer (PLAN-FORMAT.md) */
	int32_t sp;        /* 1: sequence parallel (tp > 1 transformer whose seq
			    * tp divides: layers_sp.c), 0: not */
} sp_slice_t;

typedef struct {
	double start_ms, dur_ms;         /* forward */
	double bwd_start_ms, bwd_dur_ms; /* its mirrored backward wave */
	int32_t first_slice, n_slices;
} sp_wave_t;

/* One parameter tensor group: all tensors of one layer of one component,
 * or shard tp_rank of its tp-way split (layer_tensors_tp layout). */
typedef struct {
	int32_t comp, layer;
	int32_t tp, tp_rank; /* shard tp_rank of a tp-way split; 1, 0: whole */
} sp_param_t;

/* Gradient sync bucket: the params whose holders are exactly this group;
 * all of one shard spec (tp, tp_rank), elems the sum of the shard sizes. */
typedef struct {
	int32_t n_dev, dev_off;     /* into plan.bucket_devs, ascending */
	int32_t n_params, param_off; /* into plan.bucket_params */
	int64_t elems;              /* parameters in the bucket */
	double sync_ms;             /* predicted all-reduce (zero-1: reduce-scatter) time */
	int32_t layout;             /* sp_layout_t */
	double gather_ms;           /* zero-1: predicted all-gather time; else 0 */
	int32_t overlap;            /* zero-2/3: 1 when a member completes the
				     * reduce-scatter one full-gradient placement
				     * later (plan_z2_walk), so it runs beside the
				     * next bucket's backward; else 0 */
	int32_t defer;              /* zero-1/2: k >= 1 when the iteration does not
				     * wait for the all-gather after the STEP; the
				     * next one waits for each of its pieces
				     * (plan_defer_pieces for k, version 9) before
				     * the first layer reading it; else 0 */
} sp_bucket_t;

/* Predicted memory of one device, in bytes. */
enum { MEM_PARAMS, MEM_ACTS, MEM_COMM, MEM_WORK, MEM__COUNT };

typedef struct {
	int32_t node, local;        /* machine and GPU index in it */
	int32_t first_ins, n_ins;   /* program: plan.ins[first_ins .. +n_ins) */
	int32_t n_held, held_off;   /* params held: plan.held[held_off .. +n_held) */
	int64_t mem[MEM__COUNT];
	int64_t mem_peak;
	double busy_ms, comm_ms, idle_ms, finish_ms;
} sp_device_t;

/* One algorithm's result, for the report and the plan's baselines table. */
typedef struct {
	char name[32];
	double iteration_ms, compute_ms, planning_ms, utilisation;
	int32_t fits_memory; /* 1 when its placement fits every device */
} sp_algo_result_t;

typedef struct {
	double iteration_ms; /* simulated, with transfers and sync */
	double compute_ms;   /* forward and backward waves alone */
	double transfer_ms;  /* share of the iteration spent waiting on transfers */
	double sync_ms, step_ms;
	double area_bound_ms, cp_bound_ms, paper_bound_ms;
	double lower_bound_ms; /* max(area, critical path): the compute bound */
	double allot_bound_ms; /* allotment bound (planner/bound.c), >= lower */
	double gap;            /* compute_ms / lower_bound - 1 */
	int64_t xnode_bytes, naive_xnode_bytes; /* inter-wave bytes across nodes */
	double xfer_pred_ms, naive_xfer_pred_ms;
	double comm_lower_bound_ms; /* sync bound of the chosen placement (planner/bound.c) */
} sp_cert_t;

typedef struct sp_plan {
	/* provenance */
	char planner_version[32];
	char algo[32];
	char options[256];
	uint64_t model_hash, cluster_hash;
	/* inputs the runtime needs */
	sp_model_t model;
	char cluster_name[SP_NAME_MAX];
	char gpu_name[SP_NAME_MAX];
	int32_t nodes, gpus_per_node;
	double memory_gib, mem_reserve_gib;
	int32_t microbatches; /* k: every task's step batch runs as k micro-batches */
	/* structure */
	int32_t n_metaops, n_ops, n_edges, n_waves, n_slices, n_slice_devs;
	sp_metaop_t *metaops;
	sp_op_t *ops;
	sp_edge_t *edges;
	sp_wave_t *waves;
	sp_slice_t *slices;
	int32_t *slice_devs;
	int32_t n_buckets, n_bucket_devs, n_bucket_params;
	sp_bucket_t *buckets;
	int32_t *bucket_devs;
	sp_param_t *bucket_params;
	int32_t n_devices, n_ins, n_held;
	sp_device_t *devices;
	sp_ins_t *ins;
	sp_param_t *held;
	/* predictions */
	sp_cert_t cert;
	int32_t n_algos;
	sp_algo_result_t *algos;
} sp_plan_t;

/* ---- plan_write.c ----------------------------------------------------- */

/* Serialises p (deterministically) into a new buffer *out of *out_len bytes. */
int plan_encode(uint8_t **out, size_t *out_len, const sp_plan_t *p, sp_err_t *err);
/* plan_encode + atomic write (temporary name, fsync, rename). */
int plan_write(const sp_plan_t *p, const char *path, sp_err_t *err);

/* ---- plan_decode.c (checks: plan_check.c) ------------------------------ */

/*
 * Checks magic, version, sizes, checksum, then every index and range, then
 * fills *out. fname names the file in messages. On error *out is empty.
 */
int plan_decode(sp_plan_t *out, const uint8_t *data, size_t len, const char *fname,
		sp_err_t *err);
int plan_read(sp_plan_t *out, const char *path, sp_err_t *err);
void plan_release(sp_plan_t *p);

/* ---- plan_util.c ------------------------------------------------------ */

const char *ins_op_name(int op);
/* Sample range of device i of n in a batch of B: [*s0, *s1). */
static inline void sample_range(int64_t B, int i, int n, int32_t *s0, int32_t *s1)
{
	*s0 = (int32_t)(B * i / n);
	*s1 = (int32_t)(B * (i + 1) / n);
}
/* Width and seq of value (m, l): act(m,0) is the input, l >= 1 the output,
 * l = -1 the memory (mem_seq, mem_width; 0, 0 on a MetaOp without one). */
void plan_value_shape(const sp_plan_t *p, int m, int l, int32_t *seq, int32_t *width);
/*
 * Micro-batching per task. Task t runs k_t = plan_task_k micro-batches of
 * its (plan) batch per step; a step is K = p->microbatches micro-steps, and
 * micro-step j (0-based) runs the instructions of the tasks with k_t > j
 * only: FWD/BWD/LOSS of their slices and SEND/RECV/COPY of their values
 * (both ends of a transfer belong to one task, so both skip together).
 * plan_ins_task: the task an instruction works for, -1 for SYNC, STEP and
 * GATHER (they run in the last micro-step only: the caller's rule).
 * plan_ins_active: 1 when instruction in runs in micro-step j.
 */
int plan_task_k(const sp_plan_t *p, int task);
/* The micro-steps from j on that run the same tasks as j: [j, next), next
 * the least k_t above j (K when none is below it); k_t is
 * m->tasks[t].microbatches, 0 meaning K. Walk a step's distinct sets of
 * active tasks with for (j = 0; j < K; j = next). */
int plan_micro_next(const sp_model_t *m, int K, int j);
int plan_ins_task(const sp_plan_t *p, const sp_ins_t *in);
int plan_ins_active(const sp_plan_t *p, const sp_ins_t *in, int j);
const char *layout_name(int layout);
/*
 * Device dev's position in bucket b's group (or -1 if not a member) and,
 * for a member, the elements it owns under the bucket's layout: its shard
 * [*off, *off + *n) of the bucket's elems (the flattened parameters in
 * bucket_params order) under zero-1, all of them when replicated.
 */
int bucket_shard(const sp_plan_t *p, int b, int dev, int64_t *off, int64_t *n);

/*
 * Zero-2 gradient writers (plan_zero2.c). A zero-2 bucket's full gradient exists on a
 * member from the first instruction writing into it (a BWD of one of its
 * layers, a LOSS of an lm_head or classifier) until the bucket's SYNC. The
 * map lists, per parameter slot (comp, layer), the zero-2 buckets holding
 * it (one per tensor-parallel shard); z2map_writes names the zero-2
 * buckets of device dev an instruction writes into. n_z2 == 0: the plan has
 * no zero-2 bucket (the arrays are then NULL and z2map_writes finds none).
 */
typedef struct {
	int32_t *base;  /* per component: its first slot */
	int32_t *first; /* per slot: first entry, or -1 */
	int32_t *next;  /* per entry: the next of its slot, or -1 */
	int32_t *bucket; /* per entry: its bucket */
	int n_z2;       /* zero-2 buckets in the plan */
	int dev;        /* z2map_for's device (-1 none): mine[b] its member flags */
	uint8_t *mine;
} sp_z2map_t;
int z2map_init(sp_z2map_t *out, const sp_plan_t *p); /* 0 or SP_ENOMEM */
void z2map_release(sp_z2map_t *m);
/* Remembers which buckets dev belongs to, for z2map_writes on dev (a
 * speed-up only). 0 or SP_ENOMEM. */
int z2map_for(sp_z2map_t *m, const sp_plan_t *p, int dev);
/* Distinct zero-2 buckets of dev that instruction in writes gradients into,
 * at most cap of them in out (cap >= the slice's layers + 1 is enough);
 * returns their count. */
int z2map_writes(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
		 int32_t *out, int cap);
/* The distinct zero-3 buckets of dev whose weights instruction in uses (a
 * FWD, BWD or LOSS of their layers), at most cap in out; their count. */
int z3map_uses(const sp_z2map_t *m, const sp_plan_t *p, int dev, const sp_ins_t *in,
	       int32_t *out, int cap);

/*
 * When a member frees a zero-2 bucket's full gradient. Its SYNC starts the
 * reduce-scatter; the member completes it (and frees the full gradient) at
 * its first instruction after the SYNC that allocates another full
 * gradient and at which waiting for the reduce-scatter cannot deadlock: a
 * run of all programs together shows that every member issues the SYNC
 * without this device going on (plan_util.c); else at the STEP. *out
 * (malloc'd, n_bucket_devs + 1 entries): per bucket_devs entry of a zero-2
 * bucket, that instruction's index in the member's program (its length:
 * the STEP); -1 for other buckets; NULL without zero-2 buckets. The walks
 * (plan_mem.c, interp.c) complete an in-flight bucket at the first
 * allocating instruction k with safe <= k. 0 or SP_ENOMEM.
 */
int plan_z2_safe(const sp_plan_t *p, int32_t **out);

/*
 * Device d's zero-2 full gradients over one step, as the runtime runs it
 * (plan_mem.c's header: the walk). Each is placed, at its allocation, at
 * the lowest offset of one pool where it fits between the live ones
 * (first fit; the same offset every step, the walk being the same), so
 * the runtime allocates the pool once and never mid-step. In elements:
 * off per bucket (-1: none on d; malloc'd), pool its size, peak the most
 * live at once (pool >= peak: holes), shards and fulls the sums of d's
 * zero-2 shards and whole buckets; bad the first instruction writing a
 * gradient after its bucket's SYNC (-1: none; the verifier rejects such a
 * plan); done per bucket the instruction of d's program before which its
 * reduce-scatter completes (the runtime waits for it there; the STEP's
 * index when it completes at the STEP; -1: none on d or never synced;
 * malloc'd). safe: plan_z2_safe's points, or NULL (computed). 0 or
 * SP_ENOMEM.
 */
typedef struct {
	int64_t *off;
	int32_t *done;
	int64_t pool, peak, shards, fulls;
	int bad;
} plan_z2_walk_t;
int plan_z2_walk(const sp_plan_t *p, int d, const int32_t *safe, plan_z2_walk_t *out);
void plan_z2_walk_release(plan_z2_walk_t *w);

/*
 * Zero-3 gathers are layer by layer (plan_zero3.c): a PGATHER of bucket b
 * opens a span that ends at the next PFREE of b; in it the members
 * all-gather b's layers one at a time, in the order the uses of the span
 * run them (a FWD ascending, a BWD descending, a LOSS its one layer; a
 * layer used twice in a row once), each replacing the one before: the
 * PGATHER gathers the first (the members' rendezvous), the uses the
 * others. A span in which some member has no use (it holds the layers for
 * another slice) is gathered whole at the PGATHER instead (*whole = 1),
 * so that every collective of such a member stays at the rendezvous.
 * plan_z3_span: the order for device d's PGATHER k (the first member's,
 * in bucket_devs order), as indices into b's params, in *out (malloc'd;
 * NULL when whole); its length, or SP_ENOMEM.
 * plan_z3_param_elems: the elements of param q of bucket b.
 */
int plan_z3_span(const sp_plan_t *p, int d, int k, int32_t **out, int *whole);
int64_t plan_z3_param_elems(const sp_plan_t *p, int b, int q);
/* The i-th layer a use (FWD ascending, BWD descending, LOSS its one) runs:
 * its index in bucket b's params, -1 when not b's, -2 past the last. */
int plan_z3_use(const sp_plan_t *p, int b, const sp_ins_t *in, int i);
/* plan_z3_use's i-th layer of a use as (component, layer): 0, -2 past the
 * last. */
int plan_z3_layer(const sp_plan_t *p, const sp_ins_t *in, int i, int32_t *comp, int32_t *layer);

/*
 * A deferred bucket's all-gather runs in pieces (version 9), each waited
 * for just before the first layer that reads it, so the next forward runs
 * its first layers while the later pieces still move. With defer = k
 * (1 <= k <= n_params) param q of bucket b, whose elements start at S_q
 * in the bucket's E (bucket_params order flattened, as the shards are),
 * is in piece floor(k S_q / E): the pieces are the runs of consecutive
 * params with the same such index (at most k; k equal layers, k dividing
 * their count: n / k layers each), each an element range of the bucket.
 * The planner picks k (lower_sync.c bucket_defer_pieces).
 * plan_defer_pieces: the count n of bucket b's pieces cut for k; first[j]
 * the first param of piece j (first[n] = n_params; first has n_params + 1
 * entries); order[0..n) the pieces in the order every member starts their
 * all-gathers: by the first use on the bucket's first member
 * (bucket_devs order; plan_defer_use), ties (never read before its STEP)
 * in param order; order may be NULL. SP_ENOMEM. plan_defer_use: member
 * d's first use of each param q of b, the index in its program of its
 * first FWD, BWD or LOSS running a layer of q in k[q] and the layer's
 * position in that use (plan_z3_use's i) in pos[q]; else its STEP's index
 * and 0, else n_ins and 0. A piece's wait: the least (k, pos) of its
 * params (version 8 waited for the whole bucket at the least of all).
 */
int plan_defer_pieces(const sp_plan_t *p, int b, int k, int32_t *first, int32_t *order);
void plan_defer_use(const sp_plan_t *p, int d, int b, int32_t *k, int32_t *pos);
/*
 * The room of a span gathering bucket b's layers seq[0..n) in that order,
 * each prefetched while the one before runs (version 7): layer i goes to
 * slot i % 2, slot 0 at the room's start, slot 1 at *slot1 (slot 0's
 * largest layer); returns the room's elements (both slots' largest), and
 * in *pair the most full at once (two consecutive layers; one when n = 1).
 */
int64_t plan_z3_room(const sp_plan_t *p, int b, const int32_t *seq, int n, int64_t *slot1,
		     int64_t *pair);

/*
 * Device d's zero-3 full weights over one step (plan_zero3.c): a PGATHER
 * of bucket b places its span's room (plan_z3_room: two slots, a layer
 * and the next one prefetched; a whole span: the bucket) at the lowest
 * offset of one pool where it fits between the rooms live then (first
 * fit), a PFREE gives it back. In elements: off per instruction of d's program (the PGATHER's
 * place; -1 elsewhere; malloc'd), pool its size, peak the most full at
 * once (each open span counting its plan_z3_room pair), shards and fulls the sums of d's zero-3 weight shards and whole
 * buckets. bad: the first instruction that uses weights of a zero-3 bucket
 * outside a span, opens a span whose own uses run its layers in another
 * order than the members' common one, gathers one already gathered or frees one that is
 * not, or gathers one after its SYNC (its reduce-scatter runs on the same
 * group: every member's collectives of a group in one order) (-1: none),
 * why says which. 0 or SP_ENOMEM.
 */
typedef struct {
	int64_t *off;
	int64_t pool, peak, shards, fulls;
	int64_t whole; /* the most elements of whole buckets in open spans at
			* once: what gathering a span's layers together holds */
	int bad;
	const char *why;
} plan_z3_walk_t;
int plan_z3_walk(const sp_plan_t *p, int d, plan_z3_walk_t *out);
void plan_z3_walk_release(plan_z3_walk_t *w);

/* A tensor-parallel group: the t devices slice_devs[off .. off + t), member
 * j holding shard j (the first such group of the plan, in slice `slice`). */
typedef struct {
	int32_t slice, off, t;
} sp_tp_group_t;

/*
 * The plan's distinct tensor-parallel groups, in the order every rank
 * creates their communicators: group r of each slice with tp > 1, slices
 * in index order, r ascending; a group with the same t and the same
 * devices in the same order as an earlier one is that one (chunks of one
 * slice, the same devices in another wave). *out: malloc'd, *n groups
 * (NULL when none). at (may be NULL): malloc'd, n_slice_devs + 1 entries,
 * at[i] the group of slice_devs entry i (-1 in whole slices). SP_ENOMEM.
 */
int plan_tp_groups(const sp_plan_t *p, sp_tp_group_t **out, int *n, int32_t **at);

/* The owner of shard j of layer (comp, layer): the first device of the
 * bucket that holds it (j = 0 of a whole layer: the layer's owner), or -1;
 * *tp (may be NULL): the layer's tensor-parallel degree. Checkpoints and
 * weights files join a split layer's shards at the owner of shard 0. */
int plan_shard_owner(const sp_plan_t *p, int comp, int layer, int j, int *tp);

/* ---- plan_mem.c ------------------------------------------------------- */

/* Predicted memory of device d by category (bytes); -1 if out of memory. */
int plan_memory(const sp_plan_t *p, int d, int64_t out[MEM__COUNT]);
/* Device d's zero-2 gradient bytes (plan_mem.c's walk: shards plus the peak
 * of live full gradients) minus its zero-2 buckets' full gradients, in
 * *out: minus the bytes zero-2 saves on d over zero-1. 0 or -1 (memory). */
int plan_zero2_grads(const sp_plan_t *p, int d, int64_t *out);
/* Both with the safe points of plan_z2_safe given (NULL: computed). */
int plan_memory_at(const sp_plan_t *p, int d, const int32_t *safe, int64_t out[MEM__COUNT]);
int plan_zero2_grads_at(const sp_plan_t *p, int d, const int32_t *safe, int64_t *out);

#endif
