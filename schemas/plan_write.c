/*
 * plan_write.c — serialises an sp_plan_t into plan.bin (the layout is in
 * schemas/PLAN-FORMAT.md). Every field is written on its own, little-endian,
 * one put_* line per field, so padding and pointers never reach the file;
 * strings go to one table, each stored once in order of first use; every
 * padding byte is zero. The same plan therefore always gives the same bytes.
 *
 * The encoding is decoded again before it is returned: a plan the reader
 * would reject is never written (the reader owns every validity rule, this
 * file owns none). It does no other I/O than sp_write_atomic.
 */
#include "plan.h"
#include "plan_format.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define N_SECTIONS (SEC__END - 1)

_Static_assert(MEM__COUNT == 4, "the device record holds 4 memory classes: "
				"changing them changes the format (bump PLAN_VERSION)");

typedef struct {
	uint8_t *b;
	size_t n, cap;
} buf_t;

typedef struct {
	buf_t sec[SEC__END]; /* by section id; sec[SEC_STRINGS] is the table */
	uint64_t count[SEC__END];
	buf_t *cur; /* the section being written */
	/* string index: open addressing, slot = table offset + 1, 0 = empty */
	uint32_t *slots;
	size_t n_slots, n_used;
	const char *fname;
	sp_err_t *err;
	int rc;
	int own; /* err holds our error, not an earlier one */
} enc_t;

static int enc_fail(enc_t *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int enc_fail(enc_t *e, int code, const char *fmt, ...)
{
	if (e->rc)
		return e->rc;
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	e->own = e->err && !e->err->code;
	e->rc = sp_err_set(e->err, code, e->fname, 0, 0, NULL, "%s", msg);
	return e->rc;
}

static void buf_put(enc_t *e, buf_t *w, const void *p, size_t k)
{
	if (e->rc || k == 0)
		return;
	if (w->cap - w->n < k) {
		size_t cap = w->cap ? w->cap : 256;
		while (cap - w->n < k) {
			if (cap > SIZE_MAX / 4) {
				enc_fail(e, SP_ENOMEM, "out of memory");
				return;
			}
			cap *= 2;
		}
		uint8_t *nb = realloc(w->b, cap);
		if (!nb) {
			enc_fail(e, SP_ENOMEM, "out of memory");
			return;
		}
		w->b = nb;
		w->cap = cap;
	}
	memcpy(w->b + w->n, p, k);
	w->n += k;
}

static void put_u32(enc_t *e, uint32_t v)
{
	uint8_t b[4];
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	buf_put(e, e->cur, b, 4);
}

static void put_u64(enc_t *e, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	buf_put(e, e->cur, b, 8);
}

static void put_i32(enc_t *e, int32_t v)
{
	put_u32(e, (uint32_t)v);
}

static void put_i64(enc_t *e, int64_t v)
{
	put_u64(e, (uint64_t)v);
}

/* IEEE-754 binary64, its bit pattern as a little-endian u64. */
static void put_f64(enc_t *e, double v)
{
	uint64_t u;
	memcpy(&u, &v, sizeof u);
	put_u64(e, u);
}

static uint64_t str_hash(const char *s, size_t n)
{
	return sp_fnv1a(SP_FNV_INIT, s, n);
}

/* Finds the slot of s (len n) in the index: its entry, or the empty slot. */
static size_t str_slot(const enc_t *e, const char *s, size_t n)
{
	const buf_t *st = &e->sec[SEC_STRINGS];
	size_t mask = e->n_slots - 1, i = (size_t)str_hash(s, n) & mask;
	for (;; i = (i + 1) & mask) {
		uint32_t v = e->slots[i];
		if (!v)
			return i;
		const char *t = (const char *)st->b + (v - 1);
		if (strlen(t) == n && memcmp(t, s, n) == 0)
			return i;
	}
}

static int str_index_grow(enc_t *e)
{
	size_t n = e->n_slots ? e->n_slots * 2 : 64;
	uint32_t *old = e->slots;
	size_t old_n = e->n_slots;
	e->slots = calloc(n, sizeof *e->slots);
	if (!e->slots) {
		e->slots = old;
		return enc_fail(e, SP_ENOMEM, "out of memory");
	}
	e->n_slots = n;
	for (size_t i = 0; i < old_n; i++) {
		if (!old[i])
			continue;
		const char *t = (const char *)e->sec[SEC_STRINGS].b + (old[i] - 1);
		e->slots[str_slot(e, t, strlen(t))] = old[i];
	}
	free(old);
	return 0;
}

/* Offset of s in the string table, adding it on first use. */
static uint32_t intern(enc_t *e, const char *s, size_t n)
{
	buf_t *st = &e->sec[SEC_STRINGS];
	if (e->rc || ((e->n_used + 1) * 2 > e->n_slots && str_index_grow(e)))
		return 0;
	size_t i = str_slot(e, s, n);
	if (e->slots[i])
		return e->slots[i] - 1;
	if (st->n + n + 1 >= UINT32_MAX) {
		enc_fail(e, SP_EINTERNAL, "string table exceeds 4 GiB");
		return 0;
	}
	uint32_t off = (uint32_t)st->n;
	buf_put(e, st, s, n);
	buf_put(e, st, "", 1);
	if (e->rc)
		return 0;
	e->slots[i] = off + 1;
	e->n_used++;
	e->count[SEC_STRINGS]++;
	return off;
}

/* A fixed-size char field as a u32 offset into the string table. */
static void put_str(enc_t *e, const char *s, size_t cap, const char *what)
{
	size_t n = strnlen(s, cap);
	if (n == cap) {
		enc_fail(e, SP_EINTERNAL, "%s is not NUL-terminated", what);
		return;
	}
	put_u32(e, intern(e, s, n));
}

#define PUT_STR(e, field) put_str(e, field, sizeof(field), #field)

/* ---- one function per record type: one line per field --------------- */

static void put_provenance(enc_t *e, const sp_plan_t *p)
{
	PUT_STR(e, p->planner_version);
	PUT_STR(e, p->algo);
	PUT_STR(e, p->options);
	put_u64(e, p->model_hash);
	put_u64(e, p->cluster_hash);
	PUT_STR(e, p->cluster_name);
	PUT_STR(e, p->gpu_name);
	put_i32(e, p->nodes);
	put_i32(e, p->gpus_per_node);
	put_f64(e, p->memory_gib);
	put_f64(e, p->mem_reserve_gib);
	put_i32(e, p->microbatches);
}

static void put_model(enc_t *e, const sp_model_t *m)
{
	PUT_STR(e, m->name);
	put_u32(e, (uint32_t)m->dtype);
	put_u32(e, (uint32_t)m->opt.kind);
	put_f64(e, m->opt.lr);
	put_f64(e, m->opt.weight_decay);
	put_f64(e, m->opt.beta1);
	put_f64(e, m->opt.beta2);
	put_f64(e, m->opt.eps);
	put_u64(e, m->seed);
	put_u64(e, m->hash);
}

static void put_component(enc_t *e, const void *v)
{
	const sp_component_t *c = v;
	PUT_STR(e, c->name);
	put_u32(e, (uint32_t)c->type);
	put_i64(e, c->vocab);
	put_i64(e, c->hidden);
	put_i64(e, c->max_seq);
	put_i64(e, c->in);
	put_i64(e, c->out);
	put_i64(e, c->layers);
	put_i64(e, c->heads);
	put_i64(e, c->ffn);
	put_i64(e, c->classes);
	put_i32(e, c->causal);
	put_f64(e, c->temperature);
	put_i32(e, c->cross_attention);
	put_i64(e, c->memory_width);
}

static void put_task(enc_t *e, const sp_task_t *t, int32_t first_node, int32_t k)
{
	PUT_STR(e, t->name);
	put_i64(e, t->batch);
	put_f64(e, t->weight);
	put_i32(e, t->n_nodes);
	put_i32(e, first_node);
	put_i32(e, t->microbatches > 0 ? t->microbatches : k);
}

/* A node's memory field: its memory node on a cross-attention component,
 * else -1 (the in-memory model leaves it 0 there). A component index out of
 * range gives -1 too: the reader then refuses the index, not the memory. */
static int32_t node_memory(const sp_model_t *m, const sp_node_t *n)
{
	if (n->comp < 0 || n->comp >= m->n_comps || !m->comps[n->comp].cross_attention)
		return -1;
	return n->memory;
}

static void put_node(enc_t *e, const sp_node_t *n, int32_t first_input, int32_t memory)
{
	PUT_STR(e, n->id);
	put_i32(e, n->comp);
	put_i64(e, n->seq);
	put_i32(e, n->n_inputs);
	put_i32(e, first_input);
	put_i32(e, n->layer_from);
	put_i32(e, n->layer_to);
	put_i32(e, memory);
}

static void put_opshape(enc_t *e, const sp_opshape_t *s)
{
	put_u32(e, (uint32_t)s->type);
	put_i64(e, s->hidden);
	put_i64(e, s->heads);
	put_i64(e, s->ffn);
	put_i64(e, s->seq);
	put_i64(e, s->in);
	put_i64(e, s->out);
	put_i64(e, s->vocab);
	put_i64(e, s->classes);
	put_i32(e, s->causal);
}

static void put_metaop(enc_t *e, const void *v)
{
	const sp_metaop_t *m = v;
	put_i32(e, m->task);
	put_opshape(e, &m->shape);
	put_i32(e, m->n_layers);
	put_i32(e, m->first_op);
	put_i32(e, m->seq_in);
	put_i32(e, m->width_in);
	put_i32(e, m->seq_out);
	put_i32(e, m->width_out);
	put_f64(e, m->fwd_ms);
	put_f64(e, m->bwd_ms);
	put_i32(e, m->profiled);
	PUT_STR(e, m->name);
	put_i64(e, m->shape.mem_seq);
	put_i64(e, m->shape.mem_width);
}

static void put_op(enc_t *e, const void *v)
{
	const sp_op_t *o = v;
	put_i32(e, o->node);
	put_i32(e, o->layer);
}

static void put_edge(enc_t *e, const void *v)
{
	const sp_edge_t *g = v;
	put_i32(e, g->src);
	put_i32(e, g->dst);
	put_i32(e, g->seq_off);
	put_i32(e, g->seq_len);
	put_i32(e, g->memory);
}

static void put_wave(enc_t *e, const void *v)
{
	const sp_wave_t *w = v;
	put_f64(e, w->start_ms);
	put_f64(e, w->dur_ms);
	put_f64(e, w->bwd_start_ms);
	put_f64(e, w->bwd_dur_ms);
	put_i32(e, w->first_slice);
	put_i32(e, w->n_slices);
}

static void put_slice(enc_t *e, const void *v)
{
	const sp_slice_t *s = v;
	put_i32(e, s->wave);
	put_i32(e, s->metaop);
	put_i32(e, s->layer_from);
	put_i32(e, s->layer_to);
	put_i32(e, s->n_dev);
	put_i32(e, s->dev_off);
	put_f64(e, s->start_ms);
	put_f64(e, s->fwd_ms);
	put_f64(e, s->bwd_start_ms);
	put_f64(e, s->bwd_ms);
	put_i32(e, s->recompute);
	put_i32(e, s->tp);
	put_i32(e, s->sp);
}

static void put_index(enc_t *e, const void *v)
{
	put_i32(e, *(const int32_t *)v);
}

static void put_bucket(enc_t *e, const void *v)
{
	const sp_bucket_t *b = v;
	put_i32(e, b->n_dev);
	put_i32(e, b->dev_off);
	put_i32(e, b->n_params);
	put_i32(e, b->param_off);
	put_i64(e, b->elems);
	put_f64(e, b->sync_ms);
	put_i32(e, b->layout);
	put_f64(e, b->gather_ms);
	put_i32(e, b->overlap);
	put_i32(e, b->defer);
}

static void put_param(enc_t *e, const void *v)
{
	const sp_param_t *q = v;
	put_i32(e, q->comp);
	put_i32(e, q->layer);
	put_i32(e, q->tp);
	put_i32(e, q->tp_rank);
}

static void put_device(enc_t *e, const void *v)
{
	const sp_device_t *d = v;
	put_i32(e, d->node);
	put_i32(e, d->local);
	put_i32(e, d->first_ins);
	put_i32(e, d->n_ins);
	put_i32(e, d->n_held);
	put_i32(e, d->held_off);
	for (int k = 0; k < MEM__COUNT; k++)
		put_i64(e, d->mem[k]);
	put_i64(e, d->mem_peak);
	put_f64(e, d->busy_ms);
	put_f64(e, d->comm_ms);
	put_f64(e, d->idle_ms);
	put_f64(e, d->finish_ms);
}

static void put_vref(enc_t *e, const sp_vref_t *r)
{
	put_i32(e, r->metaop);
	put_i32(e, r->layer);
	put_i32(e, r->grad);
	put_i32(e, r->seq_off);
}

static void put_ins(enc_t *e, const void *v)
{
	const sp_ins_t *in = v;
	put_i32(e, in->op);
	put_i32(e, in->slice);
	put_i32(e, in->s0);
	put_i32(e, in->s1);
	put_i32(e, in->seq_len);
	put_vref(e, &in->src);
	put_vref(e, &in->dst);
	put_i32(e, in->peer);
	put_i32(e, in->tag);
}

static void put_cert(enc_t *e, const sp_cert_t *c)
{
	put_f64(e, c->iteration_ms);
	put_f64(e, c->compute_ms);
	put_f64(e, c->transfer_ms);
	put_f64(e, c->sync_ms);
	put_f64(e, c->step_ms);
	put_f64(e, c->area_bound_ms);
	put_f64(e, c->cp_bound_ms);
	put_f64(e, c->paper_bound_ms);
	put_f64(e, c->lower_bound_ms);
	put_f64(e, c->allot_bound_ms);
	put_f64(e, c->gap);
	put_i64(e, c->xnode_bytes);
	put_i64(e, c->naive_xnode_bytes);
	put_f64(e, c->xfer_pred_ms);
	put_f64(e, c->naive_xfer_pred_ms);
	put_f64(e, c->comm_lower_bound_ms);
}

static void put_algo(enc_t *e, const void *v)
{
	const sp_algo_result_t *a = v;
	PUT_STR(e, a->name);
	put_f64(e, a->iteration_ms);
	put_f64(e, a->compute_ms);
	put_f64(e, a->planning_ms);
	put_f64(e, a->utilisation);
	put_i32(e, a->fits_memory);
}

/* ---- sections --------------------------------------------------------- */

static void begin(enc_t *e, int id)
{
	e->cur = &e->sec[id];
}

static void put_array(enc_t *e, int id, const void *arr, int32_t n, size_t sz,
		      void (*put)(enc_t *, const void *))
{
	begin(e, id);
	for (int32_t i = 0; i < n && !e->rc; i++)
		put(e, (const char *)arr + (size_t)i * sz);
	e->count[id] = (uint64_t)n;
}

/* Counts must be >= 0 with an array behind them: else the planner has a bug. */
static int check_arrays(enc_t *e, const sp_plan_t *p)
{
	const struct {
		const char *name;
		int64_t n;
		const void *arr;
	} t[] = {
		{"model.comps", p->model.n_comps, p->model.comps},
		{"model.tasks", p->model.n_tasks, p->model.tasks},
		{"metaops", p->n_metaops, p->metaops},
		{"ops", p->n_ops, p->ops},
		{"edges", p->n_edges, p->edges},
		{"waves", p->n_waves, p->waves},
		{"slices", p->n_slices, p->slices},
		{"slice_devs", p->n_slice_devs, p->slice_devs},
		{"buckets", p->n_buckets, p->buckets},
		{"bucket_devs", p->n_bucket_devs, p->bucket_devs},
		{"bucket_params", p->n_bucket_params, p->bucket_params},
		{"devices", p->n_devices, p->devices},
		{"ins", p->n_ins, p->ins},
		{"held", p->n_held, p->held},
		{"algos", p->n_algos, p->algos},
	};
	for (int i = 0; i < SP_ARRAY_LEN(t); i++)
		if (t[i].n < 0 || (t[i].n > 0 && !t[i].arr))
			return enc_fail(e, SP_EINTERNAL,
					"plan.%s: count %lld with %s array", t[i].name,
					(long long)t[i].n, t[i].arr ? "an" : "no");
	for (int ti = 0; ti < p->model.n_tasks; ti++) {
		const sp_task_t *tk = &p->model.tasks[ti];
		if (tk->n_nodes < 0 || (tk->n_nodes > 0 && !tk->nodes))
			return enc_fail(e, SP_EINTERNAL,
					"model.tasks[%d]: bad node array", ti);
		for (int i = 0; i < tk->n_nodes; i++)
			if (tk->nodes[i].n_inputs < 0 ||
			    (tk->nodes[i].n_inputs > 0 && !tk->nodes[i].inputs))
				return enc_fail(e, SP_EINTERNAL, "model.tasks[%d]."
								 "nodes[%d]: bad inputs",
						ti, i);
	}
	return 0;
}

/* Tasks, then their nodes, then the nodes' inputs, each flattened in order. */
static void put_graph(enc_t *e, const sp_model_t *m, int32_t k)
{
	int64_t n_nodes = 0, n_inputs = 0;
	for (int ti = 0; ti < m->n_tasks && !e->rc; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		begin(e, SEC_TASKS);
		put_task(e, t, (int32_t)n_nodes, k);
		for (int i = 0; i < t->n_nodes && !e->rc; i++) {
			const sp_node_t *n = &t->nodes[i];
			begin(e, SEC_NODES);
			put_node(e, n, (int32_t)n_inputs, node_memory(m, n));
			begin(e, SEC_NODE_INPUTS);
			for (int k = 0; k < n->n_inputs; k++)
				put_i32(e, n->inputs[k]);
			n_inputs += n->n_inputs;
			if (n_inputs > INT32_MAX)
				enc_fail(e, SP_EINTERNAL, "too many node inputs");
		}
		n_nodes += t->n_nodes;
		if (n_nodes > INT32_MAX)
			enc_fail(e, SP_EINTERNAL, "too many nodes");
	}
	e->count[SEC_TASKS] = (uint64_t)m->n_tasks;
	e->count[SEC_NODES] = (uint64_t)n_nodes;
	e->count[SEC_NODE_INPUTS] = (uint64_t)n_inputs;
}

static void put_sections(enc_t *e, const sp_plan_t *p)
{
	/* the empty string is always at offset 0 */
	intern(e, "", 0);
	begin(e, SEC_PROVENANCE);
	put_provenance(e, p);
	e->count[SEC_PROVENANCE] = 1;
	begin(e, SEC_MODEL);
	put_model(e, &p->model);
	e->count[SEC_MODEL] = 1;
	put_array(e, SEC_COMPONENTS, p->model.comps, p->model.n_comps,
		  sizeof *p->model.comps, put_component);
	put_graph(e, &p->model, p->microbatches);
	put_array(e, SEC_METAOPS, p->metaops, p->n_metaops, sizeof *p->metaops,
		  put_metaop);
	put_array(e, SEC_OPS, p->ops, p->n_ops, sizeof *p->ops, put_op);
	put_array(e, SEC_EDGES, p->edges, p->n_edges, sizeof *p->edges, put_edge);
	put_array(e, SEC_WAVES, p->waves, p->n_waves, sizeof *p->waves, put_wave);
	put_array(e, SEC_SLICES, p->slices, p->n_slices, sizeof *p->slices, put_slice);
	put_array(e, SEC_SLICE_DEVS, p->slice_devs, p->n_slice_devs,
		  sizeof *p->slice_devs, put_index);
	put_array(e, SEC_BUCKETS, p->buckets, p->n_buckets, sizeof *p->buckets,
		  put_bucket);
	put_array(e, SEC_BUCKET_DEVS, p->bucket_devs, p->n_bucket_devs,
		  sizeof *p->bucket_devs, put_index);
	put_array(e, SEC_BUCKET_PARAMS, p->bucket_params, p->n_bucket_params,
		  sizeof *p->bucket_params, put_param);
	put_array(e, SEC_DEVICES, p->devices, p->n_devices, sizeof *p->devices,
		  put_device);
	put_array(e, SEC_INSTRUCTIONS, p->ins, p->n_ins, sizeof *p->ins, put_ins);
	put_array(e, SEC_HELD, p->held, p->n_held, sizeof *p->held, put_param);
	begin(e, SEC_CERTIFICATE);
	put_cert(e, &p->cert);
	e->count[SEC_CERTIFICATE] = 1;
	put_array(e, SEC_ALGORITHMS, p->algos, p->n_algos, sizeof *p->algos, put_algo);
}

static void wr_u32(uint8_t *at, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		at[i] = (uint8_t)(v >> (8 * i));
}

static void wr_u64(uint8_t *at, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		at[i] = (uint8_t)(v >> (8 * i));
}

static size_t align8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/*
 * Header (40 bytes), the section table (40 bytes per section, ids in
 * ascending order), then the sections in the same order, each starting at a
 * multiple of 8; the gaps and the tail are zero. The CRC covers every byte
 * after the header.
 */
static int assemble(enc_t *e, uint8_t **out, size_t *out_len)
{
	uint64_t off[SEC__END];
	size_t pos = HEADER_SIZE + (size_t)N_SECTIONS * ENTRY_SIZE;
	for (int id = 1; id < SEC__END; id++) {
		pos = align8(pos);
		off[id] = pos;
		if (e->sec[id].n > SIZE_MAX / 2 - pos)
			return enc_fail(e, SP_ENOMEM, "plan too large");
		pos += e->sec[id].n;
	}
	size_t total = align8(pos);
	uint8_t *b = calloc(total, 1);
	if (!b)
		return enc_fail(e, SP_ENOMEM, "out of memory");
	memcpy(b + HDR_MAGIC, PLAN_MAGIC, PLAN_MAGIC_LEN);
	wr_u32(b + HDR_VERSION, PLAN_VERSION);
	wr_u32(b + HDR_SIZE_FIELD, HEADER_SIZE);
	wr_u64(b + HDR_FILE_SIZE, total);
	wr_u32(b + HDR_N_SECTIONS, N_SECTIONS);
	/* HDR_CRC: below; HDR_RESERVED: 0 */
	for (int id = 1; id < SEC__END; id++) {
		uint8_t *t = b + HEADER_SIZE + (size_t)(id - 1) * ENTRY_SIZE;
		wr_u32(t + ENT_ID, (uint32_t)id);
		wr_u32(t + ENT_RESERVED, 0);
		wr_u64(t + ENT_OFFSET, off[id]);
		wr_u64(t + ENT_SIZE, e->sec[id].n);
		wr_u64(t + ENT_COUNT, e->count[id]);
		if (e->sec[id].n)
			memcpy(b + off[id], e->sec[id].b, e->sec[id].n);
	}
	wr_u32(b + HDR_CRC, sp_crc32(0, b + HEADER_SIZE, total - HEADER_SIZE));
	*out = b;
	*out_len = total;
	return 0;
}

/* Decodes what was encoded: the reader's rules are the only rules. */
static int self_check(enc_t *e, const uint8_t *b, size_t n)
{
	sp_plan_t back;
	sp_err_t derr;
	memset(&derr, 0, sizeof derr);
	int rc = plan_decode(&back, b, n, e->fname, &derr);
	plan_release(&back);
	if (!rc)
		return 0;
	if (rc == SP_ENOMEM)
		return enc_fail(e, SP_ENOMEM, "out of memory");
	enc_fail(e, SP_EINTERNAL, "refusing to write an invalid plan: %s%s%s",
		 derr.path, derr.path[0] ? ": " : "", derr.msg);
	if (e->own)
		sp_err_hint(e->err, "this is a bug in the planner: the plan it made "
				    "breaks a rule of the plan format");
	return e->rc;
}

static int encode(uint8_t **out, size_t *out_len, const sp_plan_t *p,
		  const char *fname, sp_err_t *err)
{
	enc_t e;
	memset(&e, 0, sizeof e);
	e.fname = fname;
	e.err = err;
	*out = NULL;
	*out_len = 0;
	uint8_t *b = NULL;
	size_t n = 0;
	int rc;
	if ((rc = check_arrays(&e, p)))
		goto cleanup;
	put_sections(&e, p);
	if ((rc = e.rc) || (rc = assemble(&e, &b, &n)) || (rc = self_check(&e, b, n)))
		goto cleanup;
	*out = b;
	*out_len = n;
	b = NULL;
cleanup:
	free(b);
	for (int id = 0; id < SEC__END; id++)
		free(e.sec[id].b);
	free(e.slots);
	return rc;
}

int plan_encode(uint8_t **out, size_t *out_len, const sp_plan_t *p, sp_err_t *err)
{
	return encode(out, out_len, p, "plan", err);
}

int plan_write(const sp_plan_t *p, const char *path, sp_err_t *err)
{
	uint8_t *b;
	size_t n;
	int rc = encode(&b, &n, p, path, err);
	if (rc)
		return rc;
	rc = sp_write_atomic(path, b, n, err);
	free(b);
	return rc;
}
