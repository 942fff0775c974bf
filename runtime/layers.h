/*
 * layers.h — the math of every component type, fp32, on n samples at a
 * time: forward, backward, losses, optimizer. This is the reference the
 * CUDA backend is checked against. Row-major throughout; a sample's
 * activation is [seq, width]. Matrix products go through CBLAS. Each
 * function's type (its signature) is in backend_ops.h; the parameter
 * names used below are the ones written there.
 *
 * Parameters of one layer of a component are one contiguous float array,
 * tensors in the order listed by layer_tensors(); gradients use the same
 * layout. Backward functions ADD into parameter gradients and into input
 * gradients (callers zero them once per step), so contributions from
 * several slices, tasks and samples accumulate.
 *
 * Saved activations: each forward writes exactly op_saved_elems(shape)
 * floats per sample into `saved` (layout below, per sample, contiguous),
 * and the backward reads them back. Nothing else is kept between the two.
 * Losses use `saved` as scratch: op_saved_elems(shape, B) floats per
 * sample (contrastive: for all B samples).
 */
#ifndef SPINDLE_LAYERS_H
#define SPINDLE_LAYERS_H

#include "backend_ops.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>

/* ---- parameter layout --------------------------------------------------- */

typedef struct {
	const char *name; /* "w_qkv", ... */
	int64_t rows, cols; /* cols == 1 for vectors */
	int64_t offset;     /* in floats from the layer's base */
} layer_tensor_t;

/* The most tensors one layer has (a cross-attention transformer's). */
#define LAYER_TENSORS_MAX 20

/*
 * Tensors of one layer of component c (at most LAYER_TENSORS_MAX). Order
 * and shapes:
 *  embedding:   tok [V,h], pos [max_seq,h]
 *  patch:       w [in,h], b [h], pos [max_seq,h]
 *  transformer: ln1_g [h], ln1_b [h], w_qkv [h,3h], b_qkv [3h], w_o [h,h],
 *               b_o [h], ln2_g [h], ln2_b [h], w_1 [h,f], b_1 [f],
 *               w_2 [f,h], b_2 [h]
 *   with cross_attention (W = memory_width), then: lnc_g [h], lnc_b [h],
 *               w_q [h,h], b_q [h], w_kv [W,2h] (K columns, then V),
 *               b_kv [2h], w_oc [h,h], b_oc [h]
 *  linear:      w [in,out], b [out]
 *  lm_head:     ln_g [h], ln_b [h], w [h,V]
 *  classifier:  ln_g [h], ln_b [h], w [h,C], b [C]
 *  contrastive: none
 * Total floats == comp_layer_params(c). Returns the count of tensors.
 */
int layer_tensors(const sp_component_t *c, layer_tensor_t out[LAYER_TENSORS_MAX]);
/*
 * The same for shard `j` of a t-way tensor-parallel split (tp_ok in
 * model.h; a t it refuses is taken as 1). Transformer shard shapes, with
 * hl = h/t, fl = f/t: w_qkv [h,3hl] (columns q, k, v of heads
 * [j a/t, (j+1) a/t), b_qkv [3hl] likewise), w_o [hl,h] (its rows), w_1
 * [h,fl] and b_1 [fl] (FFN columns [j fl, (j+1) fl)), w_2 [fl,h] (rows);
 * ln1, ln2, b_o and b_2 are whole. Vocabulary-parallel shards, laid out
 * for Vm = vocab_shard_max(V, t) ids (member j has vl = vocab_shard(V,
 * t, j, &v0) of them, ids [v0, v0 + vl); t need not divide V): embedding
 * tok [Vm,h] (its token rows first, then zero rows), pos whole; lm_head
 * ln_g, ln_b whole, w [h,Vm] (its logit columns first in each row, then
 * zeros). The zero padding stays zero: the layers neither read nor write
 * it, and layer_shard writes zeros there and copies only the real part
 * back.
 * Total comp_layer_params_tp(c, t).
 * Cross-attention layers are not split yet: with t > 1 their extra
 * tensors are left out, as comp_layer_params_tp leaves them out.
 */
int layer_tensors_tp(const sp_component_t *c, int tp, layer_tensor_t out[LAYER_TENSORS_MAX]);
/*
 * Copies between a whole layer (layer_tensors layout) and its shard j of
 * tp (layer_tensors_tp layout): to_full 0 fills shard from full, 1 writes
 * the shard's part of full (tensors whole on every member are copied too).
 * Used for initialisation, checkpoints and exports, which stay whole.
 */
void layer_shard(const sp_component_t *c, int tp, int j, float *full, float *shard,
		 int to_full);
/*
 * A component with the dimensions of an operator shape, for layer_tensors:
 * max_seq is set to the shape's seq, which only sizes the position table,
 * the last tensor, so every offset is right; a shape with a memory
 * (mem_seq > 0) gives a cross-attention component of memory_width
 * mem_width.
 */
sp_component_t layer_comp_of_shape(const sp_opshape_t *s);

/*
 * Deterministic initialisation of one layer's parameters: a function of
 * (seed, component name, layer) only, so every replica starts equal.
 * LayerNorm gains 1, biases 0, matrices N(0, 0.02)-like uniform, position
 * tables small uniform.
 */
rt_layer_init_fn_t layer_init;

/* ---- layers -------------------------------------------------------------- */

/*
 * Sources. tokens: [n, seq] int32 in [0, V); feats: [n, seq, in].
 * Saved: the inputs themselves (tokens as floats for embedding).
 */
rt_embedding_fwd_fn_t embedding_fwd;
rt_embedding_bwd_fn_t embedding_bwd;
rt_fwd_fn_t patch_fwd; /* x: feats */
rt_patch_bwd_fn_t patch_bwd;

/*
 * Transformer block (pre-LN, GELU tanh approximation, LayerNorm eps 1e-5,
 * scaled dot-product attention, causal mask when s->causal), on member
 * tp->rank of a tp->t-way Megatron split (NULL tp or t == 1: the whole
 * layer). With hl = h/t, fl = f/t, al = a/t (the member's heads and FFN
 * columns, layer_tensors_tp), saved per sample, op_saved_elems_tp(s, n, t)
 * floats in this order: x [s,h], ln1 [s,h], qkv [s,3hl] (q, k, v of its
 * heads), attn_cat [s,hl], x_mid [s,h], ln2 [s,h], mlp_pre [s,fl],
 * mlp_act [s,fl], probs [al,s,s], ln1_mean [s], ln1_rstd [s],
 * ln2_mean [s], ln2_rstd [s].
 * Split, each direction calls tp->allreduce twice, each time once over all
 * n samples ([n,s,h]): forward after the attention output projection and
 * after the second MLP product, backward on the gradients of ln2's and
 * ln1's outputs, also when n == 0 (every member must call with the
 * same n, so the calls pair up). x, y, dy, dx are whole and identical on
 * every member; so are the gradients of the whole tensors (LayerNorms,
 * b_o, b_2). dx is added into (not overwritten).
 * Returns 0, SP_EINPUT for a split the shape refuses (tp_ok, rank outside
 * [0, t), no hook) or a shape with a memory (mem_seq > 0: the decoder
 * block's, xblock_fwd) with nothing written, or the all-reduce's negative
 * code at once (y, dx, dp then hold partial results).
 */
rt_tblock_fwd_fn_t tblock_fwd;
rt_tblock_bwd_fn_t tblock_bwd;
/*
 * With tp->sp (t > 1; sp_ok: t divides seq; both hooks set; else
 * SP_EINPUT) the split block is sequence parallel (layers_sp.c): x, y,
 * dy, dx are whole or the member's token shard as tp->whole_in and
 * tp->whole_out say (backend_ops.h), and the saved activations are
 * op_saved_elems_sp(s, n, t, 1) floats per sample, laid out for the call's
 * n samples together, each part for all of them: x [R,h], ln1 [n s,h],
 * qkv [n s,3hl], cat [n s,hl], x_mid [R,h], ln2 [n s,h], mlp_pre [n s,fl],
 * mlp_act [n s,fl], probs [n,al,s,s], ln1_mean, ln1_rstd, ln2_mean,
 * ln2_rstd [R] (R = n s / t: the member's tokens). Collectives per call:
 * forward all-gather of ln1 (none when whole_in: LN1 of every token is
 * computed locally), reduce-scatter of the output projection, all-gather
 * of ln2, reduce-scatter of the second MLP product, and with whole_out
 * the all-gather of y; backward the mirror ones (all-gather of dy unless
 * whole_out, reduce-scatter of d ln2, all-gather of d x_mid,
 * reduce-scatter of d ln1, with whole_in the all-gather of dx) and the
 * four LayerNorm gradients [4h] (each member's are over its tokens only)
 * summed over the group: by one all-reduce per call, or with
 * tp->ln_grads the caller's way, on the whole_in layer's all-gather of
 * dx (backend_ops.h). The gradients of b_o and b_2 come from the gathered
 * output gradients: every whole tensor's gradient is equal on every member.
 */
/*
 * One member's part of a split block, for both backends: t (1 for NULL
 * tp), its rank (0 unsplit), the shape's hidden h and seq s, its widths
 * hl = h/t, fl = f/t, al = a/t, the head width dh = h/a, the floats saved
 * per sample (op_saved_elems_tp) and its tensors (layer_tensors_tp).
 * Returns 0, or SP_EINPUT for a split or a shape the block refuses (see
 * above).
 */
typedef struct {
	int t, rank;
	int sp; /* sequence parallel (tp->sp, t > 1: layers_sp.c) */
	int64_t h, s, hl, fl, al, dh, per;
	layer_tensor_t tensors[LAYER_TENSORS_MAX];
} tblock_split_t;
int tblock_split(tblock_split_t *out, const sp_opshape_t *s, const rt_tp_t *tp);
/*
 * A sequence-parallel member's token rows (both backends, layers_sp.c and
 * cuda/cu_sp.cu): of a call's T = n seq tokens, flattened sample after
 * sample, it owns R = T / t from row o = rank R (comm_shard's shard of
 * any [T, w] buffer). With tp->ln_grads its whole_in backward sends its
 * dx rows and the ln_n LayerNorm gradients in one all-gather of t blocks
 * of blk = R h + ln_n floats, its own at o_blk = rank blk.
 */
typedef struct {
	int64_t T, R, o, blk, o_blk;
} sp_rows_t;
sp_rows_t sp_rows(const tblock_split_t *d, int n, int64_t ln_n);

/*
 * Cross-attention decoder block (layers_xattn.c; the CPU backend's
 * xblock_fwd/xblock_bwd, which interp.c runs for decoder slices):
 * self-attention as in the transformer block (pre-LN, causal when
 * s->causal), x_mid = x + attn(LN1(x)) Wo + bo; then
 *   x_c = x_mid + attn(Q = LN_c(x_mid) Wq + bq, [K V] = memory Wkv + bkv) Woc + boc
 * (queries [s,h] from the decoder stream, keys and values [m,h] from the
 * memory [m,W], m = s->mem_seq, W = s->mem_width, no mask, same heads);
 * then y = x_c + gelu(LN2(x_c) W1 + b1) W2 + b2. memory: [n, m, W].
 * Saved per sample, op_saved_elems(s) floats: the transformer block's
 * layout above (its x_mid the residual after self-attention, its ln2 =
 * LN2(x_c)), then lnc [s,h], q [s,h], catc [s,h], x_c [s,h], kv [m,2h]
 * (each row K then V), probs_c [a,s,m], lnc_mean [s], lnc_rstd [s]. The
 * memory is not saved (arith.c: one value per node, held by the caller):
 * the backward reads it again and adds into dx, dmemory and dp.
 * Returns 0, or SP_EINPUT for tp with t != 1 (not split yet) or a shape
 * without a memory (nothing written).
 */
rt_xblock_fwd_fn_t xblock_fwd;
rt_xblock_bwd_fn_t xblock_bwd;
/*
 * The decoder block's dimensions, for both backends: its self-attention
 * and MLP as an unsplit transformer block (self: tblock_split of the shape
 * without its memory), the memory's tokens m and width W, the floats
 * saved per sample (op_saved_elems: self.per of them are the block's, the
 * rest the cross-attention's) and all its tensors (layer_tensors: the
 * block's 12, then the cross-attention's 8 in the order above). Returns 0,
 * or SP_EINPUT for what xblock_fwd refuses.
 */
typedef struct {
	tblock_split_t self;
	int64_t m, W, per;
	layer_tensor_t tensors[LAYER_TENSORS_MAX];
} xblock_split_t;
int xblock_split(xblock_split_t *out, const sp_opshape_t *s, const rt_tp_t *tp);

/*
 * Vocabulary-parallel embedding and LM head (layers_vocab.c), member
 * tp->rank of a tp->t-way split by vocabulary (tp_ok: t <= V; its ids
 * vocab_shard's; NULL tp or t == 1: embedding_fwd/bwd and lm_head_loss,
 * whole):
 * parameters in layer_tensors_tp layout. Like the split block, x, y, dy,
 * dx are whole and identical on every member, so are the gradients of
 * the whole tensors (the position table, the LM head's LayerNorm), and
 * every member calls tp->allreduce the same times over all n samples.
 *  embedding_fwd_tp: its rows' lookups and the positions of its share of
 *    the n s rows, one all-reduce of y [n,s,h] (y equals embedding_fwd's
 *    bit for bit); saved as embedding_fwd. embedding_bwd_tp: dy into its
 *    rows and into its share of the position table's elements, one
 *    all-gather (tp->allgather, needed by both passes) of that table's
 *    gradient [s,h] (equal to embedding_bwd's bit for bit).
 *  lm_head_loss_tp: lm_head_loss's loss (into *loss, identical on every
 *    member) and gradients, without gathering logits: one all-reduce of
 *    each position's per-member (max, sum of exponentials) and target
 *    logit, one of the LayerNorm output's gradient [n,s,h]. Scratch:
 *    op_saved_elems_tp(s, n, t) floats per sample.
 * Return 0, SP_EINPUT for a split the shape refuses (tp_ok, rank outside
 * [0, t), no hook, another type) with nothing written, or the
 * collective's negative code at once.
 */
rt_embedding_fwd_tp_fn_t embedding_fwd_tp;
rt_embedding_bwd_tp_fn_t embedding_bwd_tp;
rt_lm_head_loss_tp_fn_t lm_head_loss_tp;
/*
 * The member's part of a vocabulary-parallel call, for both backends: t
 * (1 for NULL tp), its rank (0 unsplit), its ids' count vl and first id
 * v0 (vocab_shard), and vm, the ids its shard is laid out for (the token
 * table's rows, the LM head's row stride: vocab_shard_max; V unsplit).
 * Returns 0, or SP_EINPUT for a shape not of type `type` or a split the
 * functions above refuse.
 */
typedef struct {
	int t, rank;
	int64_t vl, v0, vm;
} vocab_split_t;
int vocab_split(vocab_split_t *out, const sp_opshape_t *s, sp_comp_type_t type,
		const rt_tp_t *tp);

/* Linear over every token: y = x W + b. Saved: x. */
rt_fwd_fn_t linear_fwd;
rt_bwd_fn_t linear_bwd;

/* ---- losses (forward and backward in one call) ----------------------------- */

/*
 * LM head: final LayerNorm, logits = ln(x) W, next-token cross-entropy
 * against targets [n, seq] (-1: position ignored). A sample's loss is the
 * mean over its valid positions (0, with no gradient, when it has none).
 * Returns the sum of the n samples' losses;
 * adds scale * d(sum of losses)/dx into dx and /dp into dp.
 */
rt_lm_head_loss_fn_t lm_head_loss;

/*
 * Classifier on token 0 of x ([n, seq_in, h], row stride seq_in*h);
 * labels [n] in [0, C), -1: sample left out (loss 0, no gradient).
 */
rt_classifier_loss_fn_t classifier_loss;
/* Its forward alone: sample i's logits [C] at saved + i (2h + 2 + C) + 2h + 2
 * (saved: n (2h + 2 + C) floats). */
void classifier_logits(const sp_opshape_t *s, int n, int64_t seq_in, const float *p,
		       const float *x, float *saved);

/*
 * Symmetric InfoNCE over a whole batch of B samples: a_i = token 0 of
 * input 1, b_i = token 0 of input 2 (row strides seq_a*w and seq_b*w, rows
 * indexed by the full batch), both L2-normalised, logits = a b^T / temperature.
 * Sample i's loss is (CE(row i) + CE(column i)) / 2. The caller holds all B
 * rows of both inputs. Adds scale * d(sum over all B samples of loss)/d a_j
 * and /d b_j for j in [s0, s1) only into da, db (same strides as a, b), so
 * devices owning disjoint ranges together produce the full gradient.
 * Returns the sum of losses of samples [s0, s1).
 */
rt_contrastive_loss_fn_t contrastive_loss;
/* Its forward alone: the logits S [B, B] (S_ij = a_i . b_j / temperature,
 * normalised) at saved + 2 B (w + 1) (saved: 2 B (w + 1) + B B floats). */
void contrastive_scores(int64_t B, int64_t w, int64_t seq_a, int64_t seq_b,
			double temperature, const float *a, const float *b, float *saved);

/* ---- optimizer ------------------------------------------------------------ */

/*
 * AdamW (decoupled weight decay, bias-corrected, step t >= 1):
 *   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
 *   p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p)
 * SGD: p -= lr * (g + wd * p).
 */
rt_adamw_step_fn_t adamw_step;
rt_sgd_step_fn_t sgd_step;

#endif
