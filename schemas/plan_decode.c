/*
 * plan_decode.c — reads plan.bin (layout in schemas/PLAN-FORMAT.md) into an
 * sp_plan_t: the header (magic, version, sizes, checksum), the section
 * table, each section's bounds and record size, the string table, then
 * every record into the plan's arrays (strings checked as they are copied).
 * The decoded plan then goes to plan_check.c, which checks every name,
 * dimension, index and range, so that the runtime and the tools may index
 * the plan's arrays without checking again.
 *
 * It does not judge the schedule (deadlock freedom, matched transfers,
 * memory): that is the planner's verifier. plan_release frees the arrays of
 * a plan made here or by any other code that malloc's each array; a plan
 * whose arrays live in an arena must not be given to it.
 */
#include "plan_reader.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SECTIONS 4096     /* table entries, known or not */
#define MAX_RECORDS (1 << 28) /* any array: sizes stay far from overflow */

typedef struct {
	const char *name;
	uint32_t rec;     /* bytes per record; 0 for the string table */
	int64_t min, max; /* record count */
} sec_desc_t;

/*
 * Every known section is required, once; unknown ids are skipped. A section
 * added later within version 1 must be made optional: older files lack it.
 */static const sec_desc_t SECS[SEC__END] = {
	[SEC_STRINGS] = {"strings", 0, 1, UINT32_MAX},
	[SEC_PROVENANCE] = {"provenance", REC_PROVENANCE, 1, 1},
	[SEC_MODEL] = {"model", REC_MODEL, 1, 1},
	[SEC_COMPONENTS] = {"components", REC_COMPONENT, 1, SP_MAX_COMPONENTS},
	[SEC_TASKS] = {"tasks", REC_TASK, 1, SP_MAX_TASKS},
	[SEC_NODES] = {"nodes", REC_NODE, 1, SP_MAX_TASKS * SP_MAX_NODES},
	[SEC_NODE_INPUTS] = {"node_inputs", REC_NODE_INPUT, 0, MAX_RECORDS},
	[SEC_METAOPS] = {"metaops", REC_METAOP, 0, MAX_RECORDS},
	[SEC_OPS] = {"ops", REC_OP, 0, MAX_RECORDS},
	[SEC_EDGES] = {"edges", REC_EDGE, 0, MAX_RECORDS},
	[SEC_WAVES] = {"waves", REC_WAVE, 0, MAX_RECORDS},
	[SEC_SLICES] = {"slices", REC_SLICE, 0, MAX_RECORDS},
	[SEC_SLICE_DEVS] = {"slice_devs", REC_SLICE_DEV, 0, MAX_RECORDS},
	[SEC_BUCKETS] = {"buckets", REC_BUCKET, 0, MAX_RECORDS},
	[SEC_BUCKET_DEVS] = {"bucket_devs", REC_BUCKET_DEV, 0, MAX_RECORDS},
	[SEC_BUCKET_PARAMS] = {"bucket_params", REC_BUCKET_PARAM, 0, MAX_RECORDS},
	[SEC_DEVICES] = {"devices", REC_DEVICE, 1, SP_MAX_DEVICES},
	[SEC_INSTRUCTIONS] = {"instructions", REC_INSTRUCTION, 0, MAX_RECORDS},
	[SEC_HELD] = {"held", REC_HELD, 0, MAX_RECORDS},
	[SEC_CERTIFICATE] = {"certificate", REC_CERTIFICATE, 1, 1},
	[SEC_ALGORITHMS] = {"algorithms", REC_ALGORITHM, 0, 4096},
};

/* A cursor over one record; reading past its end is a bug, caught by end_rec. */
typedef struct {
	const uint8_t *p, *end;
	int over;
} rcur_t;

/* ---- little-endian reading ------------------------------------------- */

static uint32_t rd_u32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static uint64_t rd_u64(const uint8_t *b)
{
	return (uint64_t)rd_u32(b) | (uint64_t)rd_u32(b + 4) << 32;
}

static uint32_t get_u32(rcur_t *r)
{
	if (r->end - r->p < 4) {
		r->over = 1;
		return 0;
	}
	uint32_t v = rd_u32(r->p);
	r->p += 4;
	return v;
}

static uint64_t get_u64(rcur_t *r)
{
	if (r->end - r->p < 8) {
		r->over = 1;
		return 0;
	}
	uint64_t v = rd_u64(r->p);
	r->p += 8;
	return v;
}

static int32_t get_i32(rcur_t *r)
{
	uint32_t u = get_u32(r);
	int32_t v;
	memcpy(&v, &u, sizeof v);
	return v;
}

static int64_t get_i64(rcur_t *r)
{
	uint64_t u = get_u64(r);
	int64_t v;
	memcpy(&v, &u, sizeof v);
	return v;
}

static double get_f64(rcur_t *r)
{
	uint64_t u = get_u64(r);
	double v;
	memcpy(&v, &u, sizeof v);
	return v;
}

/* A u32 offset into the string table, copied into dst[cap]. */
static void get_str(dec_t *d, rcur_t *r, const char *field, char *dst, size_t cap)
{
	uint32_t off = get_u32(r);
	if (d->rc || r->over)
		return;
	if (off >= d->strs_len) {
		pr_fail(d, field, "string offset %u is outside the string table (%zu bytes)",
		     off, d->strs_len);
		return;
	}
	if (off > 0 && d->strs[off - 1] != 0) {
		pr_fail(d, field, "string offset %u points into the middle of a string",
		     off);
		return;
	}
	const char *s = d->strs + off;
	size_t n = strnlen(s, d->strs_len - off);
	if (n >= cap) {
		pr_fail(d, field, "string of %zu bytes is too long (at most %zu)", n,
		     cap - 1);
		return;
	}
	for (size_t k = 0; k < n; k++)
		if ((unsigned char)s[k] < 0x20 || s[k] == 0x7f) {
			pr_fail(d, field, "string contains the control character 0x%02x",
			     (unsigned char)s[k]);
			return;
		}
	memcpy(dst, s, n);
	dst[n] = 0;
}

#define GET_STR(d, r, rec, field) \
	get_str(d, r, #field, (rec)->field, sizeof((rec)->field))

static rcur_t rec_at(const dec_t *d, int id, int64_t i)
{
	const uint8_t *p = d->data + d->sec[id].off + (size_t)i * SECS[id].rec;
	rcur_t r = {p, p + SECS[id].rec, 0};
	return r;
}

/* The record must have been read exactly: else its layout here is wrong. */
static int end_rec(dec_t *d, const rcur_t *r)
{
	if (d->rc)
		return d->rc;
	if (r->over || r->p != r->end)
		return pr_fail_code(d, SP_EINTERNAL, "bug: plan_decode.c reads records of "
						  "'%s' with the wrong size", d->where);
	return 0;
}

/* ---- header and section table ---------------------------------------- */

static int check_header(dec_t *d, uint32_t *hsize)
{
	const uint8_t *b = d->data;
	size_t len = d->len;
	if (len == 0)
		return pr_fail(d, NULL, "file is empty: not a Spindle plan");
	if (memcmp(b, PLAN_MAGIC, SP_MIN(len, (size_t)PLAN_MAGIC_LEN)) != 0) {
		pr_fail(d, NULL, "not a Spindle plan (wrong magic bytes)");
		pr_hint(d, "plan files are written by spindle-plan");
		return d->rc;
	}
	/* the version, header size and file size must be readable */
	if (len < HDR_FILE_SIZE + 8)
		return pr_fail(d, NULL, "file is truncated (%zu bytes, shorter than the "
				     "%d-byte header)", len, HEADER_SIZE);
	uint32_t version = rd_u32(b + HDR_VERSION);
	if (version > PLAN_VERSION) {
		pr_fail(d, NULL, "plan format version %u is newer than this build "
			      "(reads version %d)", version, PLAN_VERSION);
		pr_hint(d, "use a newer spindle, or re-plan with this one");
		return d->rc;
	}
	if (version < PLAN_VERSION) {
		pr_fail(d, NULL, "plan format version %u is older than this build "
			      "(reads version %d): re-plan", version, PLAN_VERSION);
		pr_hint(d, "run spindle-plan again on the same model and cluster to "
			"write it in version %d", PLAN_VERSION);
		return d->rc;
	}
	uint64_t fsize = rd_u64(b + HDR_FILE_SIZE);
	if (fsize > len)
		return pr_fail(d, NULL, "file is truncated (%zu of %llu bytes)", len,
			    (unsigned long long)fsize);
	if (fsize < len)
		return pr_fail(d, NULL, "file is longer than its header says (%zu, not %llu "
				     "bytes)", len, (unsigned long long)fsize);
	if (len < HEADER_SIZE)
		return pr_fail(d, NULL, "file is truncated (%zu bytes, shorter than the "
				     "%d-byte header)", len, HEADER_SIZE);
	uint32_t hs = rd_u32(b + HDR_SIZE_FIELD);
	if (hs < HEADER_SIZE || hs % 8 || hs > len)
		return pr_fail(d, NULL, "header size %u is invalid (a multiple of 8, "
				     "at least %d, within the file)", hs, HEADER_SIZE);
	if (rd_u32(b + HDR_RESERVED) != 0)
		return pr_fail(d, NULL, "reserved header field is %u, not 0",
			    rd_u32(b + HDR_RESERVED));
	if (sp_crc32(0, b + hs, len - hs) != rd_u32(b + HDR_CRC)) {
		pr_fail(d, NULL, "checksum mismatch: the file is corrupt");
		pr_hint(d, "the file changed after spindle-plan wrote it; copy it "
			"again or re-plan");
		return d->rc;
	}
	*hsize = hs;
	return 0;
}

/* Known sections: bounds, count, record size. Unknown ones: bounds only. */
static int read_table(dec_t *d, uint32_t hs)
{
	uint32_t n = rd_u32(d->data + HDR_N_SECTIONS);
	if (n > (d->len - hs) / ENTRY_SIZE || n > MAX_SECTIONS)
		return pr_fail(d, NULL, "section table of %u entries does not fit the file",
			    n);
	uint64_t table_end = hs + (uint64_t)n * ENTRY_SIZE;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *t = d->data + hs + (size_t)i * ENTRY_SIZE;
		uint32_t id = rd_u32(t + ENT_ID), reserved = rd_u32(t + ENT_RESERVED);
		uint64_t off = rd_u64(t + ENT_OFFSET), size = rd_u64(t + ENT_SIZE);
		uint64_t count = rd_u64(t + ENT_COUNT);
		int known = id >= 1 && id < SEC__END;
		char name[48];
		if (known)
			snprintf(name, sizeof name, "'%s'", SECS[id].name);
		else
			snprintf(name, sizeof name, "%u (unknown)", id);
		if (off < table_end)
			return pr_fail(d, NULL, "section %s overlaps the section table "
					     "(offset %llu < %llu)",
				    name, (unsigned long long)off,
				    (unsigned long long)table_end);
		if (off % 8)
			return pr_fail(d, NULL, "section %s is not 8-byte aligned "
					     "(offset %llu)",
				    name, (unsigned long long)off);
		if (off > d->len || size > d->len - off) {
			if (size > UINT64_MAX - off)
				return pr_fail(d, NULL, "section %s ends past the file "
						     "(offset %llu + size %llu "
						     "overflows)",
					    name, (unsigned long long)off,
					    (unsigned long long)size);
			return pr_fail(d, NULL, "section %s ends past the file "
					     "(offset %llu > %zu)",
				    name, (unsigned long long)(off + size), d->len);
		}
		if (!known)
			continue;
		const sec_desc_t *sd = &SECS[id];
		sec_t *s = &d->sec[id];
		if (s->present)
			return pr_fail(d, NULL, "section %s appears twice", name);
		if (reserved)
			return pr_fail(d, NULL, "section %s: reserved field is %u, not 0",
				    name, reserved);
		if (count < (uint64_t)sd->min || count > (uint64_t)sd->max)
			return pr_fail(d, NULL, "section %s has %llu records "
					     "(expected %lld to %lld)",
				    name, (unsigned long long)count,
				    (long long)sd->min, (long long)sd->max);
		if (sd->rec && (size % sd->rec || size / sd->rec != count))
			return pr_fail(d, NULL, "section %s: %llu bytes are not "
					     "%llu records of %u bytes",
				    name, (unsigned long long)size,
				    (unsigned long long)count, sd->rec);
		s->off = off;
		s->size = size;
		s->count = count;
		s->present = 1;
	}
	for (int id = 1; id < SEC__END; id++)
		if (!d->sec[id].present)
			return pr_fail(d, NULL, "required section '%s' is missing",
				    SECS[id].name);
	return 0;
}

/* NUL-separated strings; the last byte is NUL, so every offset ends in the table. */
static int read_strings(dec_t *d)
{
	const sec_t *s = &d->sec[SEC_STRINGS];
	d->strs = (const char *)d->data + s->off;
	d->strs_len = (size_t)s->size;
	if (d->strs_len == 0 || d->strs[d->strs_len - 1] != 0)
		return pr_fail(d, NULL, "string table does not end with a NUL byte");
	uint64_t nul = 0;
	for (size_t i = 0; i < d->strs_len; i++)
		nul += d->strs[i] == 0;
	if (nul != s->count)
		return pr_fail(d, NULL, "string table holds %llu strings, its entry "
				     "says %llu",
			    (unsigned long long)nul, (unsigned long long)s->count);
	return 0;
}

/* ---- records: one get line per field, in file order ------------------- */

static void get_provenance(dec_t *d, rcur_t *r, sp_plan_t *p)
{
	GET_STR(d, r, p, planner_version);
	GET_STR(d, r, p, algo);
	GET_STR(d, r, p, options);
	p->model_hash = get_u64(r);
	p->cluster_hash = get_u64(r);
	GET_STR(d, r, p, cluster_name);
	GET_STR(d, r, p, gpu_name);
	p->nodes = get_i32(r);
	p->gpus_per_node = get_i32(r);
	p->memory_gib = get_f64(r);
	p->mem_reserve_gib = get_f64(r);
	p->microbatches = get_i32(r);
}

static void get_model(dec_t *d, rcur_t *r, sp_model_t *m)
{
	GET_STR(d, r, m, name);
	m->dtype = (sp_dtype_t)get_u32(r);
	m->opt.kind = (sp_opt_kind_t)get_u32(r);
	m->opt.lr = get_f64(r);
	m->opt.weight_decay = get_f64(r);
	m->opt.beta1 = get_f64(r);
	m->opt.beta2 = get_f64(r);
	m->opt.eps = get_f64(r);
	m->seed = get_u64(r);
	m->hash = get_u64(r);
}

static void get_component(dec_t *d, rcur_t *r, void *v)
{
	sp_component_t *c = v;
	GET_STR(d, r, c, name);
	c->type = (sp_comp_type_t)get_u32(r);
	c->vocab = get_i64(r);
	c->hidden = get_i64(r);
	c->max_seq = get_i64(r);
	c->in = get_i64(r);
	c->out = get_i64(r);
	c->layers = get_i64(r);
	c->heads = get_i64(r);
	c->ffn = get_i64(r);
	c->classes = get_i64(r);
	c->causal = get_i32(r);
	c->temperature = get_f64(r);
	c->cross_attention = get_i32(r);
	c->memory_width = get_i64(r);
}

static void get_task(dec_t *d, rcur_t *r, sp_task_t *t, int32_t *n_nodes,
		     int32_t *first_node)
{
	GET_STR(d, r, t, name);
	t->batch = get_i64(r);
	t->weight = get_f64(r);
	*n_nodes = get_i32(r);
	*first_node = get_i32(r);
	t->microbatches = get_i32(r);
}

static void get_node(dec_t *d, rcur_t *r, sp_node_t *n, int32_t *n_inputs,
		     int32_t *first_input)
{
	GET_STR(d, r, n, id);
	n->comp = get_i32(r);
	n->seq = get_i64(r);
	*n_inputs = get_i32(r);
	*first_input = get_i32(r);
	n->layer_from = get_i32(r);
	n->layer_to = get_i32(r);
	n->memory = get_i32(r); /* -1 (none) until plan_check has seen it */
}

static void get_opshape(rcur_t *r, sp_opshape_t *s)
{
	s->type = (sp_comp_type_t)get_u32(r);
	s->hidden = get_i64(r);
	s->heads = get_i64(r);
	s->ffn = get_i64(r);
	s->seq = get_i64(r);
	s->in = get_i64(r);
	s->out = get_i64(r);
	s->vocab = get_i64(r);
	s->classes = get_i64(r);
	s->causal = get_i32(r);
}

static void get_metaop(dec_t *d, rcur_t *r, void *v)
{
	sp_metaop_t *m = v;
	m->task = get_i32(r);
	get_opshape(r, &m->shape);
	m->n_layers = get_i32(r);
	m->first_op = get_i32(r);
	m->seq_in = get_i32(r);
	m->width_in = get_i32(r);
	m->seq_out = get_i32(r);
	m->width_out = get_i32(r);
	m->fwd_ms = get_f64(r);
	m->bwd_ms = get_f64(r);
	m->profiled = get_i32(r);
	GET_STR(d, r, m, name);
	m->shape.mem_seq = get_i64(r);
	m->shape.mem_width = get_i64(r);
}

static void get_op(dec_t *d, rcur_t *r, void *v)
{
	sp_op_t *o = v;
	(void)d;
	o->node = get_i32(r);
	o->layer = get_i32(r);
}

static void get_edge(dec_t *d, rcur_t *r, void *v)
{
	sp_edge_t *e = v;
	(void)d;
	e->src = get_i32(r);
	e->dst = get_i32(r);
	e->seq_off = get_i32(r);
	e->seq_len = get_i32(r);
	e->memory = get_i32(r);
}

static void get_wave(dec_t *d, rcur_t *r, void *v)
{
	sp_wave_t *w = v;
	(void)d;
	w->start_ms = get_f64(r);
	w->dur_ms = get_f64(r);
	w->bwd_start_ms = get_f64(r);
	w->bwd_dur_ms = get_f64(r);
	w->first_slice = get_i32(r);
	w->n_slices = get_i32(r);
}

static void get_slice(dec_t *d, rcur_t *r, void *v)
{
	sp_slice_t *s = v;
	(void)d;
	s->wave = get_i32(r);
	s->metaop = get_i32(r);
	s->layer_from = get_i32(r);
	s->layer_to = get_i32(r);
	s->n_dev = get_i32(r);
	s->dev_off = get_i32(r);
	s->start_ms = get_f64(r);
	s->fwd_ms = get_f64(r);
	s->bwd_start_ms = get_f64(r);
	s->bwd_ms = get_f64(r);
	s->recompute = get_i32(r);
	s->tp = get_i32(r);
	s->sp = get_i32(r);
}

static void get_index(dec_t *d, rcur_t *r, void *v)
{
	(void)d;
	*(int32_t *)v = get_i32(r);
}

static void get_bucket(dec_t *d, rcur_t *r, void *v)
{
	sp_bucket_t *b = v;
	(void)d;
	b->n_dev = get_i32(r);
	b->dev_off = get_i32(r);
	b->n_params = get_i32(r);
	b->param_off = get_i32(r);
	b->elems = get_i64(r);
	b->sync_ms = get_f64(r);
	b->layout = get_i32(r);
	b->gather_ms = get_f64(r);
	b->overlap = get_i32(r);
	b->defer = get_i32(r);
}

static void get_param(dec_t *d, rcur_t *r, void *v)
{
	sp_param_t *q = v;
	(void)d;
	q->comp = get_i32(r);
	q->layer = get_i32(r);
	q->tp = get_i32(r);
	q->tp_rank = get_i32(r);
}

static void get_device(dec_t *d, rcur_t *r, void *v)
{
	sp_device_t *x = v;
	(void)d;
	x->node = get_i32(r);
	x->local = get_i32(r);
	x->first_ins = get_i32(r);
	x->n_ins = get_i32(r);
	x->n_held = get_i32(r);
	x->held_off = get_i32(r);
	for (int k = 0; k < MEM__COUNT; k++)
		x->mem[k] = get_i64(r);
	x->mem_peak = get_i64(r);
	x->busy_ms = get_f64(r);
	x->comm_ms = get_f64(r);
	x->idle_ms = get_f64(r);
	x->finish_ms = get_f64(r);
}

static void get_vref(rcur_t *r, sp_vref_t *v)
{
	v->metaop = get_i32(r);
	v->layer = get_i32(r);
	v->grad = get_i32(r);
	v->seq_off = get_i32(r);
}

static void get_ins(dec_t *d, rcur_t *r, void *v)
{
	sp_ins_t *in = v;
	(void)d;
	in->op = get_i32(r);
	in->slice = get_i32(r);
	in->s0 = get_i32(r);
	in->s1 = get_i32(r);
	in->seq_len = get_i32(r);
	get_vref(r, &in->src);
	get_vref(r, &in->dst);
	in->peer = get_i32(r);
	in->tag = get_i32(r);
}

static void get_cert(rcur_t *r, sp_cert_t *c)
{
	c->iteration_ms = get_f64(r);
	c->compute_ms = get_f64(r);
	c->transfer_ms = get_f64(r);
	c->sync_ms = get_f64(r);
	c->step_ms = get_f64(r);
	c->area_bound_ms = get_f64(r);
	c->cp_bound_ms = get_f64(r);
	c->paper_bound_ms = get_f64(r);
	c->lower_bound_ms = get_f64(r);
	c->allot_bound_ms = get_f64(r);
	c->gap = get_f64(r);
	c->xnode_bytes = get_i64(r);
	c->naive_xnode_bytes = get_i64(r);
	c->xfer_pred_ms = get_f64(r);
	c->naive_xfer_pred_ms = get_f64(r);
	c->comm_lower_bound_ms = get_f64(r);
}

static void get_algo(dec_t *d, rcur_t *r, void *v)
{
	sp_algo_result_t *a = v;
	GET_STR(d, r, a, name);
	a->iteration_ms = get_f64(r);
	a->compute_ms = get_f64(r);
	a->planning_ms = get_f64(r);
	a->utilisation = get_f64(r);
	a->fits_memory = get_i32(r);
}

/* ---- decoding sections into arrays ------------------------------------ */

/* A new array of the section's records; NULL when empty or on error. */
static void *decode_array(dec_t *d, int id, size_t elsz, int32_t *n,
			  void (*get)(dec_t *, rcur_t *, void *))
{
	int64_t count = (int64_t)d->sec[id].count;
	*n = 0;
	if (d->rc || count == 0)
		return NULL;
	char *arr = calloc((size_t)count, elsz);
	if (!arr) {
		pr_fail_code(d, SP_ENOMEM, "out of memory");
		return NULL;
	}
	*n = (int32_t)count;
	for (int64_t i = 0; i < count && !d->rc; i++) {
		pr_at(d, SECS[id].name, i);
		rcur_t r = rec_at(d, id, i);
		get(d, &r, arr + (size_t)i * elsz);
		end_rec(d, &r);
	}
	return arr;
}

/*
 * Tasks, their nodes and the nodes' inputs are stored flat, in order: task t's
 * nodes follow task t-1's, node i's inputs follow node i-1's. A task's node
 * array is allocated before n_nodes is set, so model_release is always safe.
 */
static int decode_graph(dec_t *d, sp_model_t *m)
{
	int64_t n_tasks = (int64_t)d->sec[SEC_TASKS].count;
	int64_t all_nodes = (int64_t)d->sec[SEC_NODES].count;
	int64_t all_inputs = (int64_t)d->sec[SEC_NODE_INPUTS].count;
	int64_t next_node = 0, next_input = 0;
	m->tasks = calloc((size_t)n_tasks, sizeof *m->tasks);
	if (!m->tasks)
		return pr_fail_code(d, SP_ENOMEM, "out of memory");
	m->n_tasks = (int)n_tasks;
	for (int64_t ti = 0; ti < n_tasks; ti++) {
		sp_task_t *t = &m->tasks[ti];
		int32_t nn, first;
		pr_at(d, "tasks", ti);
		rcur_t r = rec_at(d, SEC_TASKS, ti);
		get_task(d, &r, t, &nn, &first);
		if (end_rec(d, &r) || pr_int(d, "n_nodes", nn, 1, SP_MAX_NODES))
			return d->rc;
		if (first != next_node)
			return pr_fail(d, "first_node", "nodes start at %d, expected %lld "
						     "(each task's nodes follow the "
						     "previous task's)",
				    first, (long long)next_node);
		if (pr_span(d, "first_node", first, nn, all_nodes, "nodes"))
			return d->rc;
		t->nodes = calloc((size_t)nn, sizeof *t->nodes);
		if (!t->nodes)
			return pr_fail_code(d, SP_ENOMEM, "out of memory");
		t->n_nodes = nn;
		snprintf(d->where_buf, sizeof d->where_buf, "tasks[%lld].nodes",
			 (long long)ti);
		for (int32_t i = 0; i < nn; i++) {
			sp_node_t *nd = &t->nodes[i];
			int32_t ni, fi;
			pr_at(d, d->where_buf, i);
			r = rec_at(d, SEC_NODES, first + i);
			get_node(d, &r, nd, &ni, &fi);
			if (end_rec(d, &r) || pr_int(d, "n_inputs", ni, 0, 64))
				return d->rc;
			if (fi != next_input)
				return pr_fail(d, "first_input",
					    "inputs start at %d, expected %lld (each "
					    "node's inputs follow the previous node's)",
					    fi, (long long)next_input);
			if (pr_span(d, "first_input", fi, ni, all_inputs, "node inputs"))
				return d->rc;
			nd->inputs = calloc(ni ? (size_t)ni : 1, sizeof *nd->inputs);
			if (!nd->inputs)
				return pr_fail_code(d, SP_ENOMEM, "out of memory");
			nd->n_inputs = ni;
			for (int32_t k = 0; k < ni; k++) {
				r = rec_at(d, SEC_NODE_INPUTS, fi + k);
				nd->inputs[k] = get_i32(&r);
				if (end_rec(d, &r))
					return d->rc;
			}
			next_input += ni;
		}
		next_node += nn;
	}
	pr_at(d, NULL, -1);
	if (next_node != all_nodes)
		return pr_fail(d, NULL, "section 'nodes' has %lld records, but the "
				     "tasks hold %lld nodes",
			    (long long)all_nodes, (long long)next_node);
	if (next_input != all_inputs)
		return pr_fail(d, NULL, "section 'node_inputs' has %lld records, but "
				     "the nodes list %lld inputs",
			    (long long)all_inputs, (long long)next_input);
	return 0;
}

static int decode_all(dec_t *d, sp_plan_t *p)
{
	rcur_t r;
	pr_at(d, "provenance", -1);
	r = rec_at(d, SEC_PROVENANCE, 0);
	get_provenance(d, &r, p);
	if (end_rec(d, &r))
		return d->rc;
	sp_model_t *m = &p->model;
	pr_at(d, "model", -1);
	r = rec_at(d, SEC_MODEL, 0);
	get_model(d, &r, m);
	if (end_rec(d, &r))
		return d->rc;
	int32_t n;
	m->comps = decode_array(d, SEC_COMPONENTS, sizeof *m->comps, &n, get_component);
	m->n_comps = n;
	if (d->rc || decode_graph(d, m))
		return d->rc;
	p->metaops = decode_array(d, SEC_METAOPS, sizeof *p->metaops, &p->n_metaops,
				  get_metaop);
	p->ops = decode_array(d, SEC_OPS, sizeof *p->ops, &p->n_ops, get_op);
	p->edges = decode_array(d, SEC_EDGES, sizeof *p->edges, &p->n_edges, get_edge);
	p->waves = decode_array(d, SEC_WAVES, sizeof *p->waves, &p->n_waves, get_wave);
	p->slices = decode_array(d, SEC_SLICES, sizeof *p->slices, &p->n_slices,
				 get_slice);
	p->slice_devs = decode_array(d, SEC_SLICE_DEVS, sizeof *p->slice_devs,
				     &p->n_slice_devs, get_index);
	p->buckets = decode_array(d, SEC_BUCKETS, sizeof *p->buckets, &p->n_buckets,
				  get_bucket);
	p->bucket_devs = decode_array(d, SEC_BUCKET_DEVS, sizeof *p->bucket_devs,
				      &p->n_bucket_devs, get_index);
	p->bucket_params = decode_array(d, SEC_BUCKET_PARAMS, sizeof *p->bucket_params,
					&p->n_bucket_params, get_param);
	p->devices = decode_array(d, SEC_DEVICES, sizeof *p->devices, &p->n_devices,
				  get_device);
	p->ins = decode_array(d, SEC_INSTRUCTIONS, sizeof *p->ins, &p->n_ins, get_ins);
	p->held = decode_array(d, SEC_HELD, sizeof *p->held, &p->n_held, get_param);
	if (d->rc)
		return d->rc;
	pr_at(d, "certificate", -1);
	r = rec_at(d, SEC_CERTIFICATE, 0);
	get_cert(&r, &p->cert);
	if (end_rec(d, &r))
		return d->rc;
	p->algos = decode_array(d, SEC_ALGORITHMS, sizeof *p->algos, &p->n_algos,
				get_algo);
	return d->rc;
}

/* The file writes -1 for "no memory"; the loaders leave such a node's
 * memory 0 (sp_node_t), and so does the decoded model once checked. */
static void nodes_memory_as_loaded(sp_model_t *m)
{
	for (int ti = 0; ti < m->n_tasks; ti++)
		for (int i = 0; i < m->tasks[ti].n_nodes; i++)
			if (m->tasks[ti].nodes[i].memory < 0)
				m->tasks[ti].nodes[i].memory = 0;
}

int plan_decode(sp_plan_t *out, const uint8_t *data, size_t len, const char *fname,
		sp_err_t *err)
{
	memset(out, 0, sizeof *out);
	dec_t d;
	memset(&d, 0, sizeof d);
	d.data = data;
	d.len = len;
	d.fname = fname ? fname : "plan";
	d.err = err;
	d.idx = -1;
	uint32_t hs = 0;
	if (check_header(&d, &hs) || read_table(&d, hs) || read_strings(&d) ||
	    decode_all(&d, out) || pr_check(&d, out)) {
		plan_release(out);
		return d.rc;
	}
	nodes_memory_as_loaded(&out->model);
	return 0;
}

static int parse_text(void *out, const char *text, size_t len, const char *fname,
		      sp_err_t *err)
{
	return plan_decode(out, (const uint8_t *)text, len, fname, err);
}

int plan_read(sp_plan_t *out, const char *path, sp_err_t *err)
{
	memset(out, 0, sizeof *out);
	return sp_parse_file(out, parse_text, path, err);
}

void plan_release(sp_plan_t *p)
{
	if (!p)
		return;
	model_release(&p->model);
	free(p->metaops);
	free(p->ops);
	free(p->edges);
	free(p->waves);
	free(p->slices);
	free(p->slice_devs);
	free(p->buckets);
	free(p->bucket_devs);
	free(p->bucket_params);
	free(p->devices);
	free(p->ins);
	free(p->held);
	free(p->algos);
	memset(p, 0, sizeof *p);
}
