/*
 * arith.c — parameter counts, FLOPs and saved-activation sizes per operator.
 * These formulas are the contract between the planner's cost and memory
 * models and the runtime (the CPU backend saves exactly op_saved_elems).
 *
 * Notation: h hidden, f ffn, s seq, a heads, V vocab, C classes, w input
 * width of a contrastive loss, B the task's batch.
 *
 *  type         params per layer        fwd FLOPs/sample        bwd     saved elems/sample
 *  embedding    (V + max_seq) h         0 (gather + add)        0       s (token ids)
 *  patch        in h + h + max_seq h    2 s in h                1x fwd  s in (features)
 *  transformer  4h^2 + 2hf + 9h + f     8 s h^2 + 4 s^2 h       2x fwd  8 s h + 2 s f + a s^2 + 4 s
 *                                        + 4 s h f
 *  linear       in out + out            2 s in out              2x fwd  s in
 *  lm_head      2h + h V                2 s h V                 2x fwd  2 s h + 2 s + s V
 *  classifier   2h + h C + C            2 h C (token 0)         2x fwd  2 h + 2 + C
 *  contrastive  0                       2 B w (row of B x B)    2x fwd  2 w + 2 + 2 B
 *
 * Transformer saved elements: block input, LN1 output, Q/K/V, concatenated
 * heads before the output projection, residual after attention, LN2 output
 * (8 s h), the MLP pre- and post-GELU (2 s f), attention probabilities
 * (a s^2) and the two LayerNorms' mean and 1/std (4 s). The patch's source
 * has no input gradient, so its backward is the weight gradient alone.
 *
 * Cross-attention (a transformer with "cross_attention": each block is LN1,
 * self-attention, residual, LN_c, attention of its tokens to a memory of m
 * tokens of width W, residual, LN2, MLP, residual) adds per layer:
 *
 *  params       2h (LN_c) + h^2 + h (W_q, b_q) + 2 W h + 2h (W_kv, b_kv)
 *               + h^2 + h (W_oc, b_oc)           = 2h^2 + 2 W h + 6h
 *  fwd FLOPs    2 s h^2 (q) + 2*2 m W h (k, v) + 2*2 s m h (scores and
 *               the weighted sum) + 2 s h^2 (out) = 4 s h^2 + 4 m W h + 4 s m h
 *  bwd FLOPs    2x fwd (the memory gets its gradient too: it is trained)
 *  saved elems  LN_c output, Q, concatenated heads, residual after the
 *               cross-attention (4 s h), K and V (2 m h), probabilities
 *               (a s m), LN_c's mean and 1/std (2 s)
 *
 * The memory itself (m W per sample) is one value that every layer of the
 * node reads; it is held once per node, not saved per layer, so it is not
 * in the layer's saved elements.
 */
#include "model.h"

#include <string.h>


__extension__ typedef __int128 i128;

static int64_t sat(i128 x)
{
	if (x > (i128)INT64_MAX)
		return INT64_MAX;
	if (x < 0)
		return INT64_MAX;
	return (int64_t)x;
}

/* The cross-attention terms of the table above (0 without a memory). */
static i128 xattn_params(const sp_component_t *c)
{
	i128 h = c->hidden;
	if (c->type != COMP_TRANSFORMER || !c->cross_attention)
		return 0;
	return 2 * h * h + 2 * (i128)c->memory_width * h + 6 * h;
}

static i128 xattn_fwd_flops(const sp_opshape_t *o)
{
	i128 h = o->hidden, s = o->seq, m = o->mem_seq;
	if (o->type != COMP_TRANSFORMER || m == 0)
		return 0;
	return 4 * s * h * h + 4 * m * o->mem_width * h + 4 * s * m * h;
}

static i128 xattn_saved_elems(const sp_opshape_t *o)
{
	i128 h = o->hidden, s = o->seq, m = o->mem_seq;
	if (o->type != COMP_TRANSFORMER || m == 0)
		return 0;
	return 4 * s * h + 2 * m * h + (i128)o->heads * s * m + 2 * s;
}

int64_t comp_layer_params(const sp_component_t *c)
{
	i128 h = c->hidden, f = c->ffn;
	switch (c->type) {
	case COMP_EMBEDDING: return sat(((i128)c->vocab + c->max_seq) * h);
	case COMP_PATCH: return sat((i128)c->in * h + h + (i128)c->max_seq * h);
	case COMP_TRANSFORMER:
		return sat(4 * h * h + 2 * h * f + 9 * h + f + xattn_params(c));
	case COMP_LINEAR: return sat((i128)c->in * c->out + c->out);
	case COMP_LM_HEAD: return sat(2 * h + h * c->vocab);
	case COMP_CLASSIFIER: return sat(2 * h + h * c->classes + c->classes);
	case COMP_CONTRASTIVE:
	case COMP__COUNT: break;
	}
	return 0;
}

/* Vocabulary-parallel embedding and LM head: every member holds at least
 * one id (vocab_shard: t need not divide the vocabulary). */
int tp_ok(sp_comp_type_t type, int64_t heads, int64_t ffn, int64_t vocab, int t)
{
	if (t == 1)
		return 1;
	if (t < 1)
		return 0;
	if (type == COMP_EMBEDDING || type == COMP_LM_HEAD)
		return vocab >= t;
	return type == COMP_TRANSFORMER && heads % t == 0 && ffn % t == 0;
}

int64_t vocab_shard(int64_t vocab, int t, int j, int64_t *v0)
{
	int64_t q = vocab / t, r = vocab % t;
	if (v0)
		*v0 = (int64_t)j * q + (j < r ? j : r);
	return q + (j < r);
}

int64_t vocab_shard_max(int64_t vocab, int t)
{
	return vocab_shard(vocab, t, 0, NULL);
}

/*
 * One t-way shard of a transformer layer (Megatron splits: w_qkv and w_1
 * by columns, w_o and w_2 by rows; layer norms and the biases added after
 * the all-reduce, b_o and b_2, whole on every member):
 * 4 h^2/t + 2 h f/t + 3h/t + f/t + 6h. An embedding's: room for the
 * largest member's token rows (Vm = vocab_shard_max, ceil(V/t)) and the
 * whole position table, Vm h + max_seq h; an LM head's: the whole
 * LayerNorm and Vm logit columns, 2h + h Vm (a member with fewer ids
 * leaves its last rows or columns zero). t = 1 gives comp_layer_params.
 */
int64_t comp_layer_params_tp(const sp_component_t *c, int t)
{
	if (t == 1 || !tp_ok(c->type, c->heads, c->ffn, c->vocab, t))
		return comp_layer_params(c);
	i128 h = c->hidden, f = c->ffn, vl = vocab_shard_max(c->vocab, t);
	if (c->type == COMP_EMBEDDING)
		return sat((vl + c->max_seq) * h);
	if (c->type == COMP_LM_HEAD)
		return sat(2 * h + h * vl);
	return sat((4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h);
}

int64_t comp_params(const sp_component_t *c)
{
	i128 l = c->type == COMP_TRANSFORMER ? c->layers : 1;
	return sat(l * comp_layer_params(c));
}

int64_t op_fwd_flops(const sp_opshape_t *o, int64_t task_batch)
{
	i128 h = o->hidden, s = o->seq, f = o->ffn;
	switch (o->type) {
	case COMP_EMBEDDING: return 0;
	case COMP_PATCH: return sat(2 * s * o->in * h);
	case COMP_TRANSFORMER:
		return sat(8 * s * h * h + 4 * s * s * h + 4 * s * h * f + xattn_fwd_flops(o));
	case COMP_LINEAR: return sat(2 * s * o->in * (i128)o->out);
	case COMP_LM_HEAD: return sat(2 * s * h * o->vocab);
	case COMP_CLASSIFIER: return sat(2 * h * o->classes);
	case COMP_CONTRASTIVE: return sat(2 * (i128)task_batch * h);
	case COMP__COUNT: break;
	}
	return 0;
}

int64_t op_bwd_flops(const sp_opshape_t *o, int64_t task_batch)
{
	i128 f = op_fwd_flops(o, task_batch);
	if (o->type == COMP_PATCH || o->type == COMP_EMBEDDING)
		return sat(f);
	return sat(2 * f);
}

int64_t op_saved_elems(const sp_opshape_t *o, int64_t task_batch)
{
	return sat((i128)op_saved_elems_tp(o, task_batch, 1) + xattn_saved_elems(o));
}

int64_t op_saved_elems_at(const sp_opshape_t *o, int64_t task_batch, int t)
{
	return t > 1 ? op_saved_elems_tp(o, task_batch, t) : op_saved_elems(o, task_batch);
}

int sp_ok(const sp_opshape_t *s, int t)
{
	return t > 1 && s->type == COMP_TRANSFORMER && s->mem_seq == 0 && s->seq > 0 &&
	       s->seq % t == 0 && tp_ok(s->type, s->heads, s->ffn, s->vocab, t);
}

/*
 * A sequence-parallel member (layers_sp.c) saves the block's input and
 * x_mid and the four norm statistics of its s/t tokens only, the gathered
 * LayerNorm outputs ln1, ln2 whole (the column-parallel products' weight
 * gradients read them), and the split parts as the plain shard does:
 * 2 s h + (s/t) (2 h + 4) + s (4 h/t + 2 f/t) + (a/t) s^2.
 */
int64_t op_saved_elems_sp(const sp_opshape_t *o, int64_t task_batch, int t, int sp)
{
	if (!sp || !sp_ok(o, t))
		return op_saved_elems_at(o, task_batch, t);
	i128 h = o->hidden, s = o->seq, st = s / t;
	return sat(2 * s * h + st * (2 * h + 4) + s * (4 * (h / t) + 2 * (o->ffn / t)) +
		   (i128)(o->heads / t) * s * s);
}

int64_t op_kept_elems(const sp_opshape_t *o, int t, int sp)
{
	int64_t sq = sp && sp_ok(o, t) ? o->seq / t : o->seq;
	return sat((i128)sq * o->hidden);
}

/*
 * A t-way shard of a transformer layer saves x, ln1, x_mid, ln2 whole
 * (4 s h), its heads' qkv and attention output (4 s h/t), its FFN columns
 * (2 s f/t), its heads' probabilities (a/t s^2) and the norm statistics.
 * A split embedding saves its token ids (s, as whole). A split LM head's
 * scratch: ln, dln, mean, rstd as whole, its logit columns (the largest
 * member's, vocab_shard_max), and per
 * position the all-reduced statistics of every member (its maximum and
 * sum of exponentials, 2t) and the target logit (1).
 */
int64_t op_saved_elems_tp(const sp_opshape_t *o, int64_t task_batch, int t)
{
	i128 h = o->hidden, s = o->seq, f = o->ffn;
	if (!tp_ok(o->type, o->heads, o->ffn, o->vocab, t))
		t = 1;
	switch (o->type) {
	case COMP_EMBEDDING: return sat(s);
	case COMP_PATCH: return sat(s * o->in);
	case COMP_TRANSFORMER:
		return sat(4 * s * h + (4 * s * h + 2 * s * f + (i128)o->heads * s * s) / t +
			   4 * s);
	case COMP_LINEAR: return sat(s * o->in);
	case COMP_LM_HEAD:
		if (t > 1)
			return sat(2 * s * h + 2 * s + s * (i128)vocab_shard_max(o->vocab, t) +
				   s * (2 * (i128)t + 1));
		return sat(2 * s * h + 2 * s + s * o->vocab);
	case COMP_CLASSIFIER: return sat(2 * h + 2 + o->classes);
	case COMP_CONTRASTIVE: return sat(2 * h + 2 + 2 * (i128)task_batch);
	case COMP__COUNT: break;
	}
	return 0;
}

int64_t comp_out_width(const sp_component_t *c)
{
	switch (c->type) {
	case COMP_EMBEDDING:
	case COMP_PATCH:
	case COMP_TRANSFORMER: return c->hidden;
	case COMP_LINEAR: return c->out;
	default: return 0;
	}
}

int64_t opt_state_bytes(sp_dtype_t dt, sp_opt_kind_t opt)
{
	int64_t b = 0;
	if (dt != DT_FP32)
		b += 4; /* fp32 master weights */
	if (opt == OPT_ADAMW)
		b += 8; /* fp32 first and second moments */
	return b;
}

int64_t param_state_bytes(sp_dtype_t dt, sp_opt_kind_t opt)
{
	return 2 * dtype_bytes(dt) /* weights + gradients */ + opt_state_bytes(dt, opt);
}

int comp_is_source(sp_comp_type_t t)
{
	return t == COMP_EMBEDDING || t == COMP_PATCH;
}

int comp_is_sink(sp_comp_type_t t)
{
	return t == COMP_LM_HEAD || t == COMP_CLASSIFIER || t == COMP_CONTRASTIVE;
}

/*
 * A component's fields that its type does not use are 0 (the loaders and the
 * plan reader make sure), so its shape copies them all; the seq is the
 * node's, except for the losses that read one token per sample.
 */
sp_opshape_t op_shape(const sp_model_t *m, const sp_task_t *t, const sp_node_t *n)
{
	const sp_component_t *c = &m->comps[n->comp];
	sp_opshape_t s;
	/* padding too: sim_memo.c compares the plan's metaops, shapes
	 * included, byte for byte */
	memset(&s, 0, sizeof s);
	s.type = c->type;
	s.hidden = c->hidden;
	s.heads = c->heads;
	s.ffn = c->ffn;
	s.seq = n->seq;
	s.in = c->in;
	s.out = c->out;
	s.vocab = c->vocab;
	s.classes = c->classes;
	s.causal = c->causal;
	if (c->cross_attention) {
		s.mem_seq = t->nodes[n->memory].seq;
		s.mem_width = c->memory_width;
	}
	if (c->type == COMP_CLASSIFIER)
		s.seq = 0;
	if (c->type == COMP_CONTRASTIVE) {
		s.seq = 0;
		s.hidden = n->n_inputs > 0
				   ? comp_out_width(&m->comps[t->nodes[n->inputs[0]].comp])
				   : 0;
	}
	return s;
}

int node_trace_position(const sp_model_t *m, const sp_task_t *t, int node, int64_t pos,
			int64_t *out_pos)
{
	for (int guard = 0; guard < SP_MAX_NODES; guard++) {
		const sp_node_t *n = &t->nodes[node];
		sp_comp_type_t ty = m->comps[n->comp].type;
		if (ty == COMP_EMBEDDING) {
			*out_pos = pos;
			return node;
		}
		if (ty == COMP_PATCH || n->n_inputs == 0)
			return -1;
		if (ty == COMP_TRANSFORMER && n->n_inputs > 1) {
			int k = 0;
			while (k < n->n_inputs && pos >= t->nodes[n->inputs[k]].seq) {
				pos -= t->nodes[n->inputs[k]].seq;
				k++;
			}
			if (k == n->n_inputs)
				return -1;
			node = n->inputs[k];
		} else {
			node = n->inputs[0];
		}
	}
	return -1;
}

sp_metaop_io_t metaop_io(const sp_model_t *m, const sp_task_t *t, const sp_node_t *head,
			 const sp_node_t *last)
{
	sp_metaop_io_t io = {0, 0, 0, 0};
	sp_comp_type_t type = m->comps[head->comp].type;
	int one_token = type == COMP_CLASSIFIER || type == COMP_CONTRASTIVE;
	if (comp_is_source(type)) {
		io.seq_in = head->seq;
	} else {
		for (int q = 0; q < head->n_inputs; q++) {
			const sp_node_t *src = &t->nodes[head->inputs[q]];
			io.seq_in += one_token ? 1 : src->seq;
			io.width_in = comp_out_width(&m->comps[src->comp]);
		}
	}
	if (!comp_is_sink(m->comps[last->comp].type)) {
		io.seq_out = last->seq;
		io.width_out = comp_out_width(&m->comps[last->comp]);
	}
	return io;
}

int opshape_equal(const sp_opshape_t *a, const sp_opshape_t *b)
{
	return a->type == b->type && a->hidden == b->hidden && a->heads == b->heads &&
	       a->ffn == b->ffn && a->seq == b->seq && a->in == b->in &&
	       a->out == b->out && a->vocab == b->vocab && a->classes == b->classes &&
	       a->causal == b->causal && a->mem_seq == b->mem_seq &&
	       a->mem_width == b->mem_width;
}

void opshape_str(char *buf, size_t cap, const sp_opshape_t *s)
{
	switch (s->type) {
	case COMP_EMBEDDING:
		snprintf(buf, cap, "embedding V%lld h%lld s%lld", (long long)s->vocab,
			 (long long)s->hidden, (long long)s->seq);
		break;
	case COMP_PATCH:
		snprintf(buf, cap, "patch in%lld h%lld s%lld", (long long)s->in,
			 (long long)s->hidden, (long long)s->seq);
		break;
	case COMP_TRANSFORMER:
		snprintf(buf, cap, "transformer h%lld a%lld f%lld s%lld%s",
			 (long long)s->hidden, (long long)s->heads, (long long)s->ffn,
			 (long long)s->seq, s->causal ? " causal" : "");
		if (s->mem_seq > 0) {
			size_t len = strlen(buf);
			snprintf(buf + len, cap - len, " memory m%lld w%lld",
				 (long long)s->mem_seq, (long long)s->mem_width);
		}
		break;
	case COMP_LINEAR:
		snprintf(buf, cap, "linear %lld->%lld s%lld", (long long)s->in,
			 (long long)s->out, (long long)s->seq);
		break;
	case COMP_LM_HEAD:
		snprintf(buf, cap, "lm_head h%lld V%lld s%lld", (long long)s->hidden,
			 (long long)s->vocab, (long long)s->seq);
		break;
	case COMP_CLASSIFIER:
		snprintf(buf, cap, "classifier h%lld C%lld", (long long)s->hidden,
			 (long long)s->classes);
		break;
	case COMP_CONTRASTIVE:
		snprintf(buf, cap, "contrastive w%lld", (long long)s->hidden);
		break;
	case COMP__COUNT: snprintf(buf, cap, "?"); break;
	}
}
