/*
 * model.h — the two input formats (spindle.model/1, spindle.cluster/1) as
 * C structs, their loaders, and the per-component arithmetic (parameter
 * counts, FLOPs, activation bytes) that planner, runtime and tools share.
 * Loaders enforce the JSON Schemas in schemas/ and the design's semantic
 * rules; they never exit and report the first problem in an sp_err_t.
 */
#ifndef SPINDLE_MODEL_H
#define SPINDLE_MODEL_H

#include "common.h"

#include <stdint.h>

#define SP_NAME_MAX 64
/* Upper limits that keep every FLOP and byte count inside int64. */
#define SP_MAX_DIM (1LL << 24)     /* any width, vocab, seq, ffn */
#define SP_MAX_BATCH (1LL << 22)
#define SP_MAX_LAYERS 4096
#define SP_MAX_TASKS 4096
#define SP_MAX_NODES 4096 /* per task */
#define SP_MAX_COMPONENTS 4096
#define SP_MAX_DEVICES 65536

typedef enum { DT_BF16, DT_FP16, DT_FP32 } sp_dtype_t;
typedef enum { OPT_ADAMW, OPT_SGD } sp_opt_kind_t;

typedef enum {
	COMP_EMBEDDING,
	COMP_PATCH,
	COMP_TRANSFORMER,
	COMP_LINEAR,
	COMP_LM_HEAD,
	COMP_CLASSIFIER,
	COMP_CONTRASTIVE,
	COMP__COUNT
} sp_comp_type_t;

typedef struct {
	char name[SP_NAME_MAX];
	sp_comp_type_t type;
	/* fields used by the type; the rest are 0 */
	int64_t vocab, hidden, max_seq, in, out, layers, heads, ffn, classes;
	int causal;
	/* transformer: each layer also attends to a node's memory input
	 * (cross-attention, a decoder); memory_width is that memory's width
	 * (its K and V projections are [memory_width, hidden]): the declared
	 * "memory_width", else hidden. Both 0 without cross-attention. */
	int cross_attention;
	int64_t memory_width;
	double temperature;
} sp_component_t;

typedef struct {
	char id[SP_NAME_MAX];
	int comp;     /* index into model components */
	int64_t seq;  /* tokens per sample leaving the node (loss: of its input) */
	int n_inputs;
	int *inputs;  /* node indices in the same task, in the order given */
	int layer_from, layer_to; /* [from,to): transformer layers; else [0,1) */
	/* node index (same task) of the memory input that every layer of a
	 * cross-attention component attends to; 0 and unused otherwise */
	int memory;
} sp_node_t;

typedef struct {
	char name[SP_NAME_MAX];
	int64_t batch;
	double weight;
	int n_nodes;
	sp_node_t *nodes;
	/* a plan's model only: micro-batches of the task per step, k_t (its
	 * batch above is the micro-batch, B_t / k_t); 0 in a loaded model and
	 * in a plan means the plan's microbatches (plan_task_k) */
	int32_t microbatches;
} sp_task_t;

typedef struct {
	sp_opt_kind_t kind;
	double lr, weight_decay, beta1, beta2, eps;
} sp_optim_t;

typedef struct {
	char name[SP_NAME_MAX];
	sp_dtype_t dtype;
	sp_optim_t opt;
	uint64_t seed;
	int n_comps;
	sp_component_t *comps;
	int n_tasks;
	sp_task_t *tasks;
	uint64_t hash; /* FNV-1a of the canonical form (see model_hash) */
} sp_model_t;

typedef struct {
	double batch, fwd_ms, bwd_ms;
} sp_prof_point_t;

/*
 * The shape of one operator (one layer of one node): what its cost depends
 * on. Fields not used by its type are 0. For contrastive, hidden is the
 * width of its inputs. Profile entries are matched on equality of shapes.
 */
typedef struct {
	sp_comp_type_t type;
	int64_t hidden, heads, ffn, seq, in, out, vocab, classes;
	int causal;
	/* cross-attention (transformer): the memory's tokens per sample and
	 * width; both 0 without cross-attention */
	int64_t mem_seq, mem_width;
} sp_opshape_t;

typedef struct {
	sp_opshape_t shape;
	int n_points; /* sorted by batch, strictly increasing */
	sp_prof_point_t *points;
} sp_prof_entry_t;

/*
 * Default gpu.launch_us: 3.8 us per kernel, the time per kernel that NVIDIA
 * measured for a short kernel launched back to back in one stream (A. Gray,
 * "Getting Started with CUDA Graphs", NVIDIA Technical Blog, 2019: 3.8 us per
 * kernel of ~2.9 us execution without a synchronisation between launches;
 * 9.6 us with one). Our CUDA backend launches without synchronising.
 */
#define SP_LAUNCH_US_DEFAULT 3.8

/* One measured collective (the cluster's optional "collectives", written
 * by spindle-profile --collectives): op over ranks ranks on nodes nodes
 * (ranks / nodes per node), bytes the whole buffer (all-reduce: each
 * rank's; reduce-scatter: its input, all-gather: its output; p2p: bytes
 * sent), ms the time the slowest rank saw. */
typedef enum { COLL_ALL_REDUCE, COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_P2P, COLL__COUNT } sp_coll_op_t;
typedef struct {
	sp_coll_op_t op;
	int ranks, nodes;
	double bytes, ms;
} sp_coll_point_t;

typedef struct {
	char name[SP_NAME_MAX];
	int nodes, gpus_per_node;
	char gpu_name[SP_NAME_MAX];
	double memory_gib, peak_tflops, mem_bandwidth_gbs;
	int sm_count; /* gpu.sm_count; 0 when absent (not modelled) */
	/* gpu.launch_us, per kernel; SP_LAUNCH_US_DEFAULT when absent. Used by
	 * the analytic layer model only where sm_count > 0 */
	double launch_us;
	/* inter_gbs is per NIC; GPU g of a node uses NIC g * nics / gpus_per_node */
	double intra_gbs, intra_lat_us, inter_gbs, inter_lat_us;
	int nics;     /* links.nics_per_node, 1..gpus_per_node; 1 when absent */
	int n_prof;
	sp_prof_entry_t *prof;
	/* sorted by (op, ranks, nodes, bytes), bytes strictly increasing within
	 * a shape (the loader checks the order) */
	int n_coll;
	sp_coll_point_t *coll;
	uint64_t hash;
} sp_cluster_t;

/* ---- model_load.c / cluster_load.c ---------------------------------- */

/* Loads and validates; on error returns SP_EINPUT (or SP_ENOMEM) with err set. */
int model_load(sp_model_t *out, const char *path, sp_err_t *err);
int model_parse(sp_model_t *out, const char *text, size_t len,
		const char *fname, sp_err_t *err);
void model_release(sp_model_t *m);
/* Deep copy (the plan embeds the model); SP_ENOMEM on failure. */
int model_copy(sp_model_t *out, const sp_model_t *in);
int cluster_load(sp_cluster_t *out, const char *path, sp_err_t *err);
int cluster_parse(sp_cluster_t *out, const char *text, size_t len,
		  const char *fname, sp_err_t *err);
void cluster_release(sp_cluster_t *c);

const char *comp_type_name(sp_comp_type_t t);
/* "all_reduce", "all_gather", "reduce_scatter", "p2p" (cluster.schema.json) */
extern const char *const SP_COLL_NAMES[COLL__COUNT];
/* (op, ranks, nodes, bytes) of a against b: <0, 0, >0 (the order of a
 * cluster's "collectives") */
int coll_point_cmp(const sp_coll_point_t *a, const sp_coll_point_t *b);
const char *dtype_name(sp_dtype_t d);
int dtype_bytes(sp_dtype_t d);

/* ---- model_check.c: the model's rules, whatever its format ---------- */

/*
 * The element a broken rule concerns: node `node` of task `task` (its field
 * `key`, element `index` of it), else component `comp`, else (all -1) the
 * components as a whole. A loader maps it to where the element was written.
 */
typedef struct {
	int task, node, comp;
	const char *key; /* a field of the node, or NULL */
	int index;       /* an element of that field, or -1 */
} model_where_t;

/* Fills the caller's error for one broken rule (code SP_EINPUT or
 * SP_ENOMEM; hint may be NULL) and returns the code; or, with code 0, passes
 * on a warning (sp_err_warn, or nothing) and returns 0. */
typedef struct {
	int (*report)(void *ctx, int code, const model_where_t *w, const char *msg,
		      const char *hint);
	void *ctx;
} model_report_t;

/*
 * The rules of a loaded model (indices, names and field limits already
 * checked by its reader): task graphs (sources, arity, acyclic, seq and
 * widths, cross-attention memories, every node reaches a loss), size
 * totals; a component no node uses is a warning (a component library
 * shared by several task sets is normal). Returns 0 or the code of the first broken rule, after reporting
 * it.
 */
int model_check(const sp_model_t *m, const model_report_t *r);
/* The parts of model_check: one task's graph; unused components (warned
 * about) and totals. */
int model_check_task(const sp_model_t *m, int task, const model_report_t *r);
int model_check_totals(const sp_model_t *m, const model_report_t *r);

/* ---- arith.c: per-operator arithmetic ------------------------------ */

/*
 * Counts for one operator (one layer of a node) and one sample. Computed in
 * 128-bit and saturated at INT64_MAX, so callers can detect absurd sizes.
 * FLOPs count 2 per multiply-add and only the matrix products.
 */
/* Shape of layer `node` of task `t` (seq and widths from the model). */
sp_opshape_t op_shape(const sp_model_t *m, const sp_task_t *t, const sp_node_t *n);
int64_t comp_layer_params(const sp_component_t *c);
int64_t comp_params(const sp_component_t *c); /* all its layers */
int64_t op_fwd_flops(const sp_opshape_t *s, int64_t task_batch);
int64_t op_bwd_flops(const sp_opshape_t *s, int64_t task_batch);
/* Elements saved for backward (the CPU backend saves exactly these). */
int64_t op_saved_elems(const sp_opshape_t *s, int64_t task_batch);
/*
 * Tensor parallelism (t-way Megatron splits, design.md "Tensor
 * parallelism"): 1 when a layer of this type and shape can be split t ways
 * (t == 1 always; t > 1 transformers whose heads and FFN width t divides,
 * and embeddings and LM heads of at least t ids: vocabulary parallel, in
 * shards of vocab_shard's sizes). A shard's parameter count, and the elements one shard saves
 * per sample for backward (t == 1: the unsplit counts; a t that tp_ok
 * refuses also gives them). FLOPs per shard are op_*_flops / t: every
 * matrix product of a split layer is split.
 */
int tp_ok(sp_comp_type_t type, int64_t heads, int64_t ffn, int64_t vocab, int t);
/*
 * Member j's ids of a t-way vocabulary split (t <= vocab): q = V/t each,
 * the first V%t members one more; returns its count, its first id into
 * *v0 (when not NULL). vocab_shard_max: the largest count (member 0's,
 * ceil(V/t)), which every member's shard is laid out for
 * (comp_layer_params_tp) and which the slowest member computes.
 */
int64_t vocab_shard(int64_t vocab, int t, int j, int64_t *v0);
int64_t vocab_shard_max(int64_t vocab, int t);
int64_t comp_layer_params_tp(const sp_component_t *c, int t);
int64_t op_saved_elems_tp(const sp_opshape_t *s, int64_t task_batch, int t);
/* What a slice of degree t saves per sample of a layer: one shard's
 * (t > 1), else the whole layer's, a decoder's cross block included
 * (op_saved_elems_tp(.., 1) leaves it out; decoders are never split). */
int64_t op_saved_elems_at(const sp_opshape_t *s, int64_t task_batch, int t);
/*
 * Sequence parallelism (runtime/layers_sp.c): 1 when a t-way split of a
 * block of this shape can run its layer norms and residuals on sequence
 * shards: a transformer (not a decoder: mem_seq 0) that tp_ok splits t > 1
 * ways and whose seq t divides. op_saved_elems_sp: what one member saves
 * per sample with it (sp != 0 and sp_ok), else op_saved_elems_at.
 * op_kept_elems: what a recomputing slice keeps per sample and layer (its
 * input: seq * hidden, or the member's seq / t tokens of it with sp).
 */
int sp_ok(const sp_opshape_t *s, int t);
int64_t op_saved_elems_sp(const sp_opshape_t *s, int64_t task_batch, int t, int sp);
int64_t op_kept_elems(const sp_opshape_t *s, int t, int sp);
/* Width of a node's output activation (0 for sinks). */
int64_t comp_out_width(const sp_component_t *c);
/* Bytes of state per parameter: weights, grads, fp32 master, optimizer. */
int64_t param_state_bytes(sp_dtype_t dt, sp_opt_kind_t opt);
/* The part of it zero-1 shards: fp32 master weights and optimizer moments. */
int64_t opt_state_bytes(sp_dtype_t dt, sp_opt_kind_t opt);
int comp_is_source(sp_comp_type_t t);
int comp_is_sink(sp_comp_type_t t);
int opshape_equal(const sp_opshape_t *a, const sp_opshape_t *b);
/* Follows position pos of node's output back to the embedding node whose
 * token it carries (through transformers, which concatenate their inputs
 * along seq, and one-input components): that node, with *out_pos its
 * position there; -1 where it comes from features (a patch) or nowhere. */
int node_trace_position(const sp_model_t *m, const sp_task_t *t, int node, int64_t pos,
			int64_t *out_pos);
/* A MetaOp's value shapes, from the nodes its chain starts and ends with
 * (graph.c makes them so, the plan reader requires it): a source reads
 * its own seq tokens (width 0), any other MetaOp its head's inputs
 * concatenated (one token each for a loss that reads one per sample); a
 * sink writes nothing. */
typedef struct {
	int64_t seq_in, width_in, seq_out, width_out;
} sp_metaop_io_t;
sp_metaop_io_t metaop_io(const sp_model_t *m, const sp_task_t *t, const sp_node_t *head,
			 const sp_node_t *last);
/* "transformer h1280 a16 f5120 s257", with " memory m257 w1024" for
 * cross-attention — for reports. */
void opshape_str(char *buf, size_t cap, const sp_opshape_t *s);

#endif
