/*
 * plan_read.c — reads plan.bin (layout in schemas/PLAN-FORMAT.md) into an
 * sp_plan_t and checks all of it before anything uses it: the header (magic,
 * version, sizes, checksum), the section table, each section's bounds and
 * record size, then every string, name, dimension, index and range, so that
 * the runtime and the tools may index the plan's arrays without checking
 * again. Every error names the file, the record and field, and what is wrong.
 *
 * It does not judge the schedule (deadlock freedom, matched transfers,
 * memory): that is the planner's verifier. plan_release frees plans made
 * here (every array malloc'd), not plans living in the planner's arena.
 */
#include "jsonutil.h"
#include "plan.h"
#include "plan_format.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SECTIONS 4096     /* table entries, known or not */
#define MAX_RECORDS (1 << 28) /* any array: sizes stay far from overflow */
/* batch x seq x width of one value: its byte count fits int64 with room */
#define MAX_VALUE_ELEMS ((int64_t)1 << 48)

typedef struct {
	const char *name;
	uint32_t rec;     /* bytes per record; 0 for the string table */
	int64_t min, max; /* record count */
} sec_desc_t;

/*
 * Every known section is required, once; unknown ids are skipped. A section
 * added later within version 1 must be made optional: older files lack it.
 */
static const sec_desc_t SECS[SEC__END] = {
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

typedef struct {
	uint64_t off, size, count;
	int present;
} sec_t;

typedef struct {
	const uint8_t *data;
	size_t len;
	const char *fname;
	sp_err_t *err;
	int rc;
	int own; /* err holds our error (not an earlier one): hints may be added */
	sec_t sec[SEC__END];
	const char *strs; /* the string table; its last byte is NUL */
	size_t strs_len;
	/* the record being read or checked, for messages: where[idx].field */
	const char *where;
	int64_t idx;
	char where_buf[64];
} dec_t;

/* A cursor over one record; reading past its end is a bug, caught by end_rec. */
typedef struct {
	const uint8_t *p, *end;
	int over;
} rcur_t;

/* ---- errors ----------------------------------------------------------- */

static void at(dec_t *d, const char *where, int64_t idx)
{
	d->where = where;
	d->idx = idx;
}

static int vfail(dec_t *d, int code, const char *field, const char *fmt, va_list ap)
{
	if (d->rc)
		return d->rc;
	char path[160] = "", msg[400];
	if (d->where && d->idx >= 0)
		snprintf(path, sizeof path, "%s[%lld]%s%s", d->where, (long long)d->idx,
			 field ? "." : "", field ? field : "");
	else if (d->where)
		snprintf(path, sizeof path, "%s%s%s", d->where, field ? "." : "",
			 field ? field : "");
	vsnprintf(msg, sizeof msg, fmt, ap);
	d->own = d->err && !d->err->code;
	d->rc = sp_err_set(d->err, code, d->fname, 0, 0, path[0] ? path : NULL, "%s",
			   msg);
	return d->rc;
}

static int fail(dec_t *d, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(dec_t *d, const char *field, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(d, SP_EINPUT, field, fmt, ap);
	va_end(ap);
	return rc;
}

static void hint(dec_t *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void hint(dec_t *d, const char *fmt, ...)
{
	if (!d->own)
		return;
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	sp_err_hint(d->err, "%s", buf);
}

static int fail_code(dec_t *d, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail_code(dec_t *d, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(d, code, NULL, fmt, ap);
	va_end(ap);
	return rc;
}

/* v in [0, n): an index into n things called `what` */
static int chk_index(dec_t *d, const char *field, int64_t v, int64_t n, const char *what)
{
	if (v >= 0 && v < n)
		return 0;
	return fail(d, field, "%s %lld does not exist (there are %lld)", what,
		    (long long)v, (long long)n);
}

/* [off, off + n) within [0, total) */
static int chk_span(dec_t *d, const char *field, int64_t off, int64_t n, int64_t total,
		    const char *what)
{
	if (n < 0)
		return fail(d, field, "negative count %lld", (long long)n);
	if (off >= 0 && off <= total && n <= total - off)
		return 0;
	return fail(d, field, "range [%lld, %lld) is outside the %lld %s", (long long)off,
		    (long long)(off + n), (long long)total, what);
}

static int chk_int(dec_t *d, const char *field, int64_t v, int64_t lo, int64_t hi)
{
	if (v >= lo && v <= hi)
		return 0;
	return fail(d, field, "%lld is outside [%lld, %lld]", (long long)v, (long long)lo,
		    (long long)hi);
}

static int chk_finite(dec_t *d, const char *field, double v)
{
	return isfinite(v) ? 0 : fail(d, field, "not a finite number");
}

/* v in [lo, hi], or (lo, hi] when lo_open */
static int chk_num(dec_t *d, const char *field, double v, double lo, double hi,
		   int lo_open)
{
	if (chk_finite(d, field, v))
		return d->rc;
	if ((lo_open ? v > lo : v >= lo) && v <= hi)
		return 0;
	return fail(d, field, "%g is outside %c%g, %g]", v, lo_open ? '(' : '[', lo, hi);
}

static int chk_name(dec_t *d, const char *field, const char *s)
{
	if (jvalid_name(s))
		return 0;
	fail(d, field, "invalid name '%s'", s);
	hint(d, "names are 1-63 characters of letters, digits, '_', and (after "
		"the first) '-' or '.'");
	return d->rc;
}

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
		fail(d, field, "string offset %u is outside the string table (%zu bytes)",
		     off, d->strs_len);
		return;
	}
	if (off > 0 && d->strs[off - 1] != 0) {
		fail(d, field, "string offset %u points into the middle of a string",
		     off);
		return;
	}
	const char *s = d->strs + off;
	size_t n = strnlen(s, d->strs_len - off);
	if (n >= cap) {
		fail(d, field, "string of %zu bytes is too long (at most %zu)", n,
		     cap - 1);
		return;
	}
	for (size_t k = 0; k < n; k++)
		if ((unsigned char)s[k] < 0x20 || s[k] == 0x7f) {
			fail(d, field, "string contains the control character 0x%02x",
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
		return fail_code(d, SP_EINTERNAL, "bug: plan_read.c reads records of "
						  "'%s' with the wrong size", d->where);
	return 0;
}

/* ---- header and section table ---------------------------------------- */

static int check_header(dec_t *d, uint32_t *hsize)
{
	const uint8_t *b = d->data;
	size_t len = d->len;
	if (len == 0)
		return fail(d, NULL, "file is empty: not a Spindle plan");
	if (memcmp(b, PLAN_MAGIC, SP_MIN(len, (size_t)PLAN_MAGIC_LEN)) != 0) {
		fail(d, NULL, "not a Spindle plan (wrong magic bytes)");
		hint(d, "plan files are written by spindle-plan");
		return d->rc;
	}
	/* the version, header size and file size must be readable */
	if (len < HDR_FILE_SIZE + 8)
		return fail(d, NULL, "file is truncated (%zu bytes, shorter than the "
				     "%d-byte header)", len, HEADER_SIZE);
	uint32_t version = rd_u32(b + HDR_VERSION);
	if (version > PLAN_VERSION) {
		fail(d, NULL, "plan format version %u is newer than this build "
			      "(reads version %d)", version, PLAN_VERSION);
		hint(d, "use a newer spindle, or re-plan with this one");
		return d->rc;
	}
	if (version < PLAN_VERSION) {
		fail(d, NULL, "plan format version %u is older than this build "
			      "(reads version %d)", version, PLAN_VERSION);
		hint(d, "re-run spindle-plan to write the plan again");
		return d->rc;
	}
	uint64_t fsize = rd_u64(b + HDR_FILE_SIZE);
	if (fsize > len)
		return fail(d, NULL, "file is truncated (%zu of %llu bytes)", len,
			    (unsigned long long)fsize);
	if (fsize < len)
		return fail(d, NULL, "file is longer than its header says (%zu, not %llu "
				     "bytes)", len, (unsigned long long)fsize);
	if (len < HEADER_SIZE)
		return fail(d, NULL, "file is truncated (%zu bytes, shorter than the "
				     "%d-byte header)", len, HEADER_SIZE);
	uint32_t hs = rd_u32(b + HDR_SIZE_FIELD);
	if (hs < HEADER_SIZE || hs % 8 || hs > len)
		return fail(d, NULL, "header size %u is invalid (a multiple of 8, "
				     "at least %d, within the file)", hs, HEADER_SIZE);
	if (rd_u32(b + HDR_RESERVED) != 0)
		return fail(d, NULL, "reserved header field is %u, not 0",
			    rd_u32(b + HDR_RESERVED));
	if (sp_crc32(0, b + hs, len - hs) != rd_u32(b + HDR_CRC)) {
		fail(d, NULL, "checksum mismatch: the file is corrupt");
		hint(d, "the file changed after spindle-plan wrote it; copy it "
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
		return fail(d, NULL, "section table of %u entries does not fit the file",
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
			return fail(d, NULL, "section %s overlaps the section table "
					     "(offset %llu < %llu)",
				    name, (unsigned long long)off,
				    (unsigned long long)table_end);
		if (off % 8)
			return fail(d, NULL, "section %s is not 8-byte aligned "
					     "(offset %llu)",
				    name, (unsigned long long)off);
		if (off > d->len || size > d->len - off) {
			if (size > UINT64_MAX - off)
				return fail(d, NULL, "section %s ends past the file "
						     "(offset %llu + size %llu "
						     "overflows)",
					    name, (unsigned long long)off,
					    (unsigned long long)size);
			return fail(d, NULL, "section %s ends past the file "
					     "(offset %llu > %zu)",
				    name, (unsigned long long)(off + size), d->len);
		}
		if (!known)
			continue;
		const sec_desc_t *sd = &SECS[id];
		sec_t *s = &d->sec[id];
		if (s->present)
			return fail(d, NULL, "section %s appears twice", name);
		if (reserved)
			return fail(d, NULL, "section %s: reserved field is %u, not 0",
				    name, reserved);
		if (count < (uint64_t)sd->min || count > (uint64_t)sd->max)
			return fail(d, NULL, "section %s has %llu records "
					     "(expected %lld to %lld)",
				    name, (unsigned long long)count,
				    (long long)sd->min, (long long)sd->max);
		if (sd->rec && (size % sd->rec || size / sd->rec != count))
			return fail(d, NULL, "section %s: %llu bytes are not "
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
			return fail(d, NULL, "required section '%s' is missing",
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
		return fail(d, NULL, "string table does not end with a NUL byte");
	uint64_t nul = 0;
	for (size_t i = 0; i < d->strs_len; i++)
		nul += d->strs[i] == 0;
	if (nul != s->count)
		return fail(d, NULL, "string table holds %llu strings, its entry "
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
}

static void get_task(dec_t *d, rcur_t *r, sp_task_t *t, int32_t *n_nodes,
		     int32_t *first_node)
{
	GET_STR(d, r, t, name);
	t->batch = get_i64(r);
	t->weight = get_f64(r);
	*n_nodes = get_i32(r);
	*first_node = get_i32(r);
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
}

static void get_param(dec_t *d, rcur_t *r, void *v)
{
	sp_param_t *q = v;
	(void)d;
	q->comp = get_i32(r);
	q->layer = get_i32(r);
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
		fail_code(d, SP_ENOMEM, "out of memory");
		return NULL;
	}
	*n = (int32_t)count;
	for (int64_t i = 0; i < count && !d->rc; i++) {
		at(d, SECS[id].name, i);
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
		return fail_code(d, SP_ENOMEM, "out of memory");
	m->n_tasks = (int)n_tasks;
	for (int64_t ti = 0; ti < n_tasks; ti++) {
		sp_task_t *t = &m->tasks[ti];
		int32_t nn, first;
		at(d, "tasks", ti);
		rcur_t r = rec_at(d, SEC_TASKS, ti);
		get_task(d, &r, t, &nn, &first);
		if (end_rec(d, &r) || chk_int(d, "n_nodes", nn, 1, SP_MAX_NODES))
			return d->rc;
		if (first != next_node)
			return fail(d, "first_node", "nodes start at %d, expected %lld "
						     "(each task's nodes follow the "
						     "previous task's)",
				    first, (long long)next_node);
		if (chk_span(d, "first_node", first, nn, all_nodes, "nodes"))
			return d->rc;
		t->nodes = calloc((size_t)nn, sizeof *t->nodes);
		if (!t->nodes)
			return fail_code(d, SP_ENOMEM, "out of memory");
		t->n_nodes = nn;
		snprintf(d->where_buf, sizeof d->where_buf, "tasks[%lld].nodes",
			 (long long)ti);
		for (int32_t i = 0; i < nn; i++) {
			sp_node_t *nd = &t->nodes[i];
			int32_t ni, fi;
			at(d, d->where_buf, i);
			r = rec_at(d, SEC_NODES, first + i);
			get_node(d, &r, nd, &ni, &fi);
			if (end_rec(d, &r) || chk_int(d, "n_inputs", ni, 0, 64))
				return d->rc;
			if (fi != next_input)
				return fail(d, "first_input",
					    "inputs start at %d, expected %lld (each "
					    "node's inputs follow the previous node's)",
					    fi, (long long)next_input);
			if (chk_span(d, "first_input", fi, ni, all_inputs, "node inputs"))
				return d->rc;
			nd->inputs = calloc(ni ? (size_t)ni : 1, sizeof *nd->inputs);
			if (!nd->inputs)
				return fail_code(d, SP_ENOMEM, "out of memory");
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
	at(d, NULL, -1);
	if (next_node != all_nodes)
		return fail(d, NULL, "section 'nodes' has %lld records, but the "
				     "tasks hold %lld nodes",
			    (long long)all_nodes, (long long)next_node);
	if (next_input != all_inputs)
		return fail(d, NULL, "section 'node_inputs' has %lld records, but "
				     "the nodes list %lld inputs",
			    (long long)all_inputs, (long long)next_input);
	return 0;
}

static int decode_all(dec_t *d, sp_plan_t *p)
{
	rcur_t r;
	at(d, "provenance", -1);
	r = rec_at(d, SEC_PROVENANCE, 0);
	get_provenance(d, &r, p);
	if (end_rec(d, &r))
		return d->rc;
	sp_model_t *m = &p->model;
	at(d, "model", -1);
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
	at(d, "certificate", -1);
	r = rec_at(d, SEC_CERTIFICATE, 0);
	get_cert(&r, &p->cert);
	if (end_rec(d, &r))
		return d->rc;
	p->algos = decode_array(d, SEC_ALGORITHMS, sizeof *p->algos, &p->n_algos,
				get_algo);
	return d->rc;
}

/* ---- the model: the same name and size rules as model_load.c --------- */

enum {
	U_VOCAB = 1 << 0,
	U_HIDDEN = 1 << 1,
	U_MAX_SEQ = 1 << 2,
	U_IN = 1 << 3,
	U_OUT = 1 << 4,
	U_LAYERS = 1 << 5,
	U_HEADS = 1 << 6,
	U_FFN = 1 << 7,
	U_CLASSES = 1 << 8
};

/* Dimensions each component type uses; the others are 0. */
static const unsigned COMP_USES[COMP__COUNT] = {
	[COMP_EMBEDDING] = U_VOCAB | U_HIDDEN | U_MAX_SEQ,
	[COMP_PATCH] = U_IN | U_HIDDEN | U_MAX_SEQ,
	[COMP_TRANSFORMER] = U_LAYERS | U_HIDDEN | U_HEADS | U_FFN,
	[COMP_LINEAR] = U_IN | U_OUT,
	[COMP_LM_HEAD] = U_HIDDEN | U_VOCAB,
	[COMP_CLASSIFIER] = U_HIDDEN | U_CLASSES,
	[COMP_CONTRASTIVE] = 0,
};

static int64_t comp_nlayers(const sp_component_t *c)
{
	return c->type == COMP_TRANSFORMER ? c->layers : 1;
}

static int check_component(dec_t *d, const sp_component_t *c)
{
	if (chk_name(d, "name", c->name) ||
	    chk_int(d, "type", c->type, 0, COMP__COUNT - 1))
		return d->rc;
	const struct {
		const char *name;
		int64_t v;
		unsigned use;
		int64_t lo, hi;
	} f[] = {
		{"vocab", c->vocab, U_VOCAB, 1, SP_MAX_DIM},
		{"hidden", c->hidden, U_HIDDEN, 1, SP_MAX_DIM},
		{"max_seq", c->max_seq, U_MAX_SEQ, 1, SP_MAX_DIM},
		{"in", c->in, U_IN, 1, SP_MAX_DIM},
		{"out", c->out, U_OUT, 1, SP_MAX_DIM},
		{"layers", c->layers, U_LAYERS, 1, SP_MAX_LAYERS},
		{"heads", c->heads, U_HEADS, 1, SP_MAX_DIM},
		{"ffn", c->ffn, U_FFN, 1, SP_MAX_DIM},
		{"classes", c->classes, U_CLASSES, 2, SP_MAX_DIM},
	};
	const char *tn = comp_type_name(c->type);
	for (int k = 0; k < SP_ARRAY_LEN(f); k++) {
		if (COMP_USES[c->type] & f[k].use) {
			if (chk_int(d, f[k].name, f[k].v, f[k].lo, f[k].hi))
				return d->rc;
		} else if (f[k].v != 0) {
			return fail(d, f[k].name, "%s components have no '%s' "
						  "(expected 0, got %lld)",
				    tn, f[k].name, (long long)f[k].v);
		}
	}
	if (c->type == COMP_TRANSFORMER) {
		if (chk_int(d, "causal", c->causal, 0, 1))
			return d->rc;
		if (c->hidden % c->heads)
			return fail(d, "heads", "hidden %lld is not divisible by "
						"heads %lld",
				    (long long)c->hidden, (long long)c->heads);
	} else if (c->causal) {
		return fail(d, "causal", "%s components have no 'causal' "
					 "(expected 0)", tn);
	}
	if (c->type == COMP_CONTRASTIVE)
		return chk_num(d, "temperature", c->temperature, 0, 1e6, 1);
	if (c->temperature != 0)
		return fail(d, "temperature", "%s components have no 'temperature' "
					      "(expected 0)", tn);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name of names[0..n) that another one repeats, or NULL. */
static const char *find_dup(const char **names, int n)
{
	qsort(names, (size_t)n, sizeof *names, cmp_str);
	for (int i = 1; i < n; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			return names[i];
	return NULL;
}

/* Names in one scope (components, tasks, one task's nodes) are unique. */
static int check_unique(dec_t *d, const char **tmp, const char *where, const char *field,
			const char *(*name)(const void *, int), const void *arr, int n)
{
	for (int i = 0; i < n; i++)
		tmp[i] = name(arr, i);
	const char *dup = find_dup(tmp, n);
	if (!dup)
		return 0;
	int seen = 0;
	for (int i = 0; i < n; i++)
		if (strcmp(name(arr, i), dup) == 0 && seen++) {
			at(d, where, i);
			return fail(d, field, "duplicate name '%s'", dup);
		}
	return 0;
}

static const char *comp_name(const void *a, int i)
{
	return ((const sp_component_t *)a)[i].name;
}

static const char *task_name(const void *a, int i)
{
	return ((const sp_task_t *)a)[i].name;
}

static const char *node_name(const void *a, int i)
{
	return ((const sp_node_t *)a)[i].id;
}

static int check_node(dec_t *d, const sp_model_t *m, const sp_task_t *t, int i)
{
	const sp_node_t *n = &t->nodes[i];
	if (chk_name(d, "id", n->id) ||
	    chk_index(d, "comp", n->comp, m->n_comps, "component") ||
	    chk_int(d, "seq", n->seq, 1, SP_MAX_DIM))
		return d->rc;
	const sp_component_t *c = &m->comps[n->comp];
	int64_t L = comp_nlayers(c);
	int bad = c->type == COMP_TRANSFORMER
			  ? n->layer_from < 0 || n->layer_from >= n->layer_to ||
				    n->layer_to > L
			  : n->layer_from != 0 || n->layer_to != 1;
	if (bad)
		return fail(d, "layer_from", "layer range [%d, %d) is empty or outside "
					     "component '%s' (%lld layers)",
			    n->layer_from, n->layer_to, c->name, (long long)L);
	for (int k = 0; k < n->n_inputs; k++) {
		int v = n->inputs[k];
		if (chk_index(d, "inputs", v, t->n_nodes, "node"))
			return d->rc;
		if (v == i)
			return fail(d, "inputs", "node '%s' is its own input", n->id);
		for (int q = 0; q < k; q++)
			if (n->inputs[q] == v)
				return fail(d, "inputs", "input '%s' is listed twice",
					    t->nodes[v].id);
	}
	return 0;
}

/* As model_load.c: parameter, FLOP and byte totals fit int64 with room. */
static int check_sizes(dec_t *d, const sp_model_t *m)
{
	const int64_t LIM = (int64_t)1 << 60;
	int ovf = 0;
	int64_t total_flops = 0, total_params = 0;
	for (int k = 0; k < m->n_comps; k++)
		total_params = sp_add(total_params, comp_params(&m->comps[k]), &ovf);
	if (ovf || sp_mul(total_params, 32, &ovf) > LIM || ovf) {
		at(d, "components", -1);
		return fail(d, NULL, "the model's parameters are too many for 64-bit "
				     "byte arithmetic");
	}
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		for (int i = 0; i < t->n_nodes; i++) {
			const sp_node_t *n = &t->nodes[i];
			sp_opshape_t s = op_shape(m, t, n);
			int64_t layers = n->layer_to - n->layer_from;
			int64_t f = sp_add(op_fwd_flops(&s, t->batch),
					   op_bwd_flops(&s, t->batch), &ovf);
			f = sp_mul(sp_mul(f, layers, &ovf), t->batch, &ovf);
			int64_t a = sp_mul(op_saved_elems(&s, t->batch), layers, &ovf);
			a = sp_mul(a, sp_mul(t->batch, 8, &ovf), &ovf);
			total_flops = sp_add(total_flops, f, &ovf);
			if (ovf || f > LIM || a > LIM || total_flops > LIM) {
				snprintf(d->where_buf, sizeof d->where_buf,
					 "tasks[%d].nodes", ti);
				at(d, d->where_buf, i);
				return fail(d, NULL, "sizes overflow 64-bit FLOP/byte "
						     "arithmetic (batch %lld, seq %lld)",
					    (long long)t->batch, (long long)n->seq);
			}
		}
	}
	return 0;
}

static int check_model(dec_t *d, const sp_model_t *m)
{
	at(d, "model", -1);
	if (chk_name(d, "name", m->name) || chk_int(d, "dtype", m->dtype, 0, DT_FP32) ||
	    chk_int(d, "optimizer", m->opt.kind, 0, OPT_SGD) ||
	    chk_num(d, "lr", m->opt.lr, 0, 1e3, 1) ||
	    chk_num(d, "weight_decay", m->opt.weight_decay, 0, 1e3, 0) ||
	    chk_num(d, "beta1", m->opt.beta1, 0, 0.999999, 0) ||
	    chk_num(d, "beta2", m->opt.beta2, 0, 0.999999999, 0) ||
	    chk_num(d, "eps", m->opt.eps, 0, 1, 1))
		return d->rc;
	if (m->seed > (uint64_t)INT64_MAX)
		return fail(d, "seed", "seed %llu is above 2^63 - 1",
			    (unsigned long long)m->seed);
	for (int k = 0; k < m->n_comps; k++) {
		at(d, "components", k);
		if (check_component(d, &m->comps[k]))
			return d->rc;
	}
	int most = SP_MAX(m->n_comps, m->n_tasks);
	for (int ti = 0; ti < m->n_tasks; ti++)
		most = SP_MAX(most, m->tasks[ti].n_nodes);
	const char **tmp = malloc(sizeof *tmp * (size_t)most);
	if (!tmp)
		return fail_code(d, SP_ENOMEM, "out of memory");
	if (check_unique(d, tmp, "components", "name", comp_name, m->comps, m->n_comps) ||
	    check_unique(d, tmp, "tasks", "name", task_name, m->tasks, m->n_tasks))
		goto cleanup;
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		at(d, "tasks", ti);
		if (chk_name(d, "name", t->name) ||
		    chk_int(d, "batch", t->batch, 1, SP_MAX_BATCH) ||
		    chk_num(d, "weight", t->weight, 0, 1e9, 1))
			goto cleanup;
		snprintf(d->where_buf, sizeof d->where_buf, "tasks[%d].nodes", ti);
		for (int i = 0; i < t->n_nodes; i++) {
			at(d, d->where_buf, i);
			if (check_node(d, m, t, i))
				goto cleanup;
		}
		if (check_unique(d, tmp, d->where_buf, "id", node_name, t->nodes,
				 t->n_nodes))
			goto cleanup;
	}
	check_sizes(d, m);
cleanup:
	free(tmp);
	return d->rc;
}

/* ---- the plan: every index and range ----------------------------------- */

static int check_provenance(dec_t *d, const sp_plan_t *p)
{
	at(d, "provenance", -1);
	if (chk_name(d, "cluster_name", p->cluster_name) ||
	    chk_int(d, "nodes", p->nodes, 1, 4096) ||
	    chk_int(d, "gpus_per_node", p->gpus_per_node, 1, 256) ||
	    chk_num(d, "memory_gib", p->memory_gib, 0, 1e6, 1) ||
	    chk_num(d, "mem_reserve_gib", p->mem_reserve_gib, 0, 1e6, 0))
		return d->rc;
	if (!p->gpu_name[0])
		return fail(d, "gpu_name", "empty GPU name");
	if ((int64_t)p->nodes * p->gpus_per_node > SP_MAX_DEVICES)
		return fail(d, "nodes", "%lld devices in all; at most %d supported",
			    (long long)p->nodes * p->gpus_per_node, SP_MAX_DEVICES);
	return 0;
}

static int check_shape(dec_t *d, const sp_opshape_t *s)
{
	const struct {
		const char *name;
		int64_t v;
	} f[] = {
		{"shape.hidden", s->hidden}, {"shape.heads", s->heads},
		{"shape.ffn", s->ffn},       {"shape.seq", s->seq},
		{"shape.in", s->in},         {"shape.out", s->out},
		{"shape.vocab", s->vocab},   {"shape.classes", s->classes},
	};
	if (chk_int(d, "shape.type", s->type, 0, COMP__COUNT - 1) ||
	    chk_int(d, "shape.causal", s->causal, 0, 1))
		return d->rc;
	for (int k = 0; k < SP_ARRAY_LEN(f); k++)
		if (chk_int(d, f[k].name, f[k].v, 0, SP_MAX_DIM))
			return d->rc;
	return 0;
}

/* batch x seq x width of a value must stay below MAX_VALUE_ELEMS */
static int chk_value_size(dec_t *d, const char *field, int64_t batch, int64_t seq,
			  int64_t width)
{
	int ovf = 0;
	int64_t n = sp_mul(sp_mul(batch, seq, &ovf), width, &ovf);
	if (!ovf && n <= MAX_VALUE_ELEMS)
		return 0;
	return fail(d, field, "a value of %lld x %lld x %lld elements is too large",
		    (long long)batch, (long long)seq, (long long)width);
}

/* One layer over the whole batch: FLOPs and saved bytes fit int64 with room,
 * as model_load.c checks for every node (of at least one layer). */
static int chk_layer_size(dec_t *d, const sp_opshape_t *s, int64_t batch)
{
	const int64_t LIM = (int64_t)1 << 60;
	int ovf = 0;
	int64_t f = sp_add(op_fwd_flops(s, batch), op_bwd_flops(s, batch), &ovf);
	f = sp_mul(f, batch, &ovf);
	int64_t a = sp_mul(op_saved_elems(s, batch), sp_mul(batch, 8, &ovf), &ovf);
	if (!ovf && f <= LIM && a <= LIM)
		return 0;
	return fail(d, "shape", "one layer's FLOPs or saved bytes overflow 64-bit "
				"arithmetic (batch %lld)", (long long)batch);
}

static int check_metaops(dec_t *d, const sp_plan_t *p)
{
	const sp_model_t *md = &p->model;
	for (int i = 0; i < p->n_metaops; i++) {
		const sp_metaop_t *m = &p->metaops[i];
		at(d, "metaops", i);
		if (chk_index(d, "task", m->task, md->n_tasks, "task") ||
		    check_shape(d, &m->shape) ||
		    chk_int(d, "n_layers", m->n_layers, 1, INT32_MAX) ||
		    chk_span(d, "first_op", m->first_op, m->n_layers, p->n_ops, "ops") ||
		    chk_int(d, "seq_in", m->seq_in, 0, SP_MAX_DIM) ||
		    chk_int(d, "width_in", m->width_in, 0, SP_MAX_DIM) ||
		    chk_int(d, "seq_out", m->seq_out, 0, SP_MAX_DIM) ||
		    chk_int(d, "width_out", m->width_out, 0, SP_MAX_DIM))
			return d->rc;
		const sp_task_t *t = &md->tasks[m->task];
		if (chk_layer_size(d, &m->shape, t->batch) ||
		    chk_value_size(d, "seq_in", t->batch, m->seq_in, m->width_in) ||
		    chk_value_size(d, "seq_out", t->batch, m->seq_out, m->width_out) ||
		    chk_finite(d, "fwd_ms", m->fwd_ms) ||
		    chk_finite(d, "bwd_ms", m->bwd_ms) ||
		    chk_int(d, "profiled", m->profiled, 0, 1))
			return d->rc;
		if (!m->name[0])
			return fail(d, "name", "empty metaop name");
		/* its operators: nodes of its task, layers inside each node's range */
		for (int k = 0; k < m->n_layers; k++) {
			const sp_op_t *o = &p->ops[m->first_op + k];
			at(d, "ops", m->first_op + k);
			if (chk_index(d, "node", o->node, t->n_nodes, "node"))
				return d->rc;
			const sp_node_t *n = &t->nodes[o->node];
			if (o->layer < n->layer_from || o->layer >= n->layer_to)
				return fail(d, "layer", "layer %d is outside the layers "
							"[%d, %d) of node '%s' "
							"(metaops[%d])",
					    o->layer, n->layer_from, n->layer_to, n->id,
					    i);
		}
	}
	return 0;
}

static int check_edges(dec_t *d, const sp_plan_t *p)
{
	for (int i = 0; i < p->n_edges; i++) {
		const sp_edge_t *e = &p->edges[i];
		at(d, "edges", i);
		if (chk_index(d, "src", e->src, p->n_metaops, "metaop") ||
		    chk_index(d, "dst", e->dst, p->n_metaops, "metaop") ||
		    chk_span(d, "seq_off", e->seq_off, e->seq_len,
			     p->metaops[e->dst].seq_in,
			     "tokens of the consumer's input") ||
		    chk_int(d, "seq_len", e->seq_len, 0, p->metaops[e->src].seq_out))
			return d->rc;
		if (e->src == e->dst)
			return fail(d, "dst", "metaop %d feeds itself", e->src);
	}
	return 0;
}

/* Indices into the device list, stored in slice_devs and bucket_devs. */
static int check_dev_list(dec_t *d, const char *where, const int32_t *a, int n,
			  int n_devices)
{
	for (int i = 0; i < n; i++) {
		at(d, where, i);
		if (chk_index(d, NULL, a[i], n_devices, "device"))
			return d->rc;
	}
	return 0;
}

static int check_params(dec_t *d, const char *where, const sp_param_t *a, int n,
			const sp_model_t *m)
{
	for (int i = 0; i < n; i++) {
		at(d, where, i);
		if (chk_index(d, "comp", a[i].comp, m->n_comps, "component") ||
		    chk_index(d, "layer", a[i].layer, comp_nlayers(&m->comps[a[i].comp]),
			      "layer"))
			return d->rc;
	}
	return 0;
}

/* slices[s].wave == w exactly when s is in waves[w]'s slice range */
static int check_waves_slices(dec_t *d, const sp_plan_t *p, int32_t *stamp)
{
	for (int w = 0; w < p->n_waves; w++) {
		const sp_wave_t *x = &p->waves[w];
		at(d, "waves", w);
		if (chk_span(d, "first_slice", x->first_slice, x->n_slices, p->n_slices,
			     "slices") ||
		    chk_finite(d, "start_ms", x->start_ms) ||
		    chk_finite(d, "dur_ms", x->dur_ms) ||
		    chk_finite(d, "bwd_start_ms", x->bwd_start_ms) ||
		    chk_finite(d, "bwd_dur_ms", x->bwd_dur_ms))
			return d->rc;
		for (int s = x->first_slice; s < x->first_slice + x->n_slices; s++)
			if (p->slices[s].wave != w)
				return fail(d, "first_slice",
					    "slice %d is in this wave's range but "
					    "belongs to wave %d",
					    s, p->slices[s].wave);
	}
	for (int s = 0; s < p->n_slices; s++) {
		const sp_slice_t *x = &p->slices[s];
		at(d, "slices", s);
		if (chk_index(d, "wave", x->wave, p->n_waves, "wave") ||
		    chk_index(d, "metaop", x->metaop, p->n_metaops, "metaop"))
			return d->rc;
		const sp_wave_t *w = &p->waves[x->wave];
		if (s < w->first_slice || s >= w->first_slice + w->n_slices)
			return fail(d, "wave", "slice is not in the slice range [%d, %d) "
					       "of wave %d",
				    w->first_slice, w->first_slice + w->n_slices,
				    x->wave);
		int32_t L = p->metaops[x->metaop].n_layers;
		if (x->layer_from < 0 || x->layer_from >= x->layer_to || x->layer_to > L)
			return fail(d, "layer_from", "layer range [%d, %d) is empty or "
						     "outside the metaop's %d layers",
				    x->layer_from, x->layer_to, L);
		if (chk_int(d, "n_dev", x->n_dev, 1, p->n_devices) ||
		    chk_span(d, "dev_off", x->dev_off, x->n_dev, p->n_slice_devs,
			     "slice devices") ||
		    chk_finite(d, "start_ms", x->start_ms) ||
		    chk_finite(d, "fwd_ms", x->fwd_ms) ||
		    chk_finite(d, "bwd_start_ms", x->bwd_start_ms) ||
		    chk_finite(d, "bwd_ms", x->bwd_ms))
			return d->rc;
		for (int k = 0; k < x->n_dev; k++) {
			int32_t dev = p->slice_devs[x->dev_off + k];
			if (stamp[dev] == s + 1)
				return fail(d, "dev_off", "device %d is twice in the "
							  "slice's group", dev);
			stamp[dev] = s + 1;
		}
	}
	return 0;
}

static int check_buckets(dec_t *d, const sp_plan_t *p)
{
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *x = &p->buckets[b];
		at(d, "buckets", b);
		if (chk_int(d, "n_dev", x->n_dev, 1, p->n_devices) ||
		    chk_span(d, "dev_off", x->dev_off, x->n_dev, p->n_bucket_devs,
			     "bucket devices") ||
		    chk_span(d, "param_off", x->param_off, x->n_params,
			     p->n_bucket_params, "bucket params") ||
		    chk_int(d, "elems", x->elems, 0, INT64_MAX) ||
		    chk_finite(d, "sync_ms", x->sync_ms))
			return d->rc;
		const int32_t *dv = p->bucket_devs + x->dev_off;
		for (int k = 1; k < x->n_dev; k++)
			if (dv[k] <= dv[k - 1])
				return fail(d, "dev_off", "devices are not ascending and "
							  "distinct (%d after %d)",
					    dv[k], dv[k - 1]);
	}
	return 0;
}

static int check_devices(dec_t *d, const sp_plan_t *p)
{
	/* machine and GPU index: in the cluster, one device each */
	size_t n_slots = (size_t)p->nodes * (size_t)p->gpus_per_node;
	char *used = calloc(n_slots, 1);
	if (!used)
		return fail_code(d, SP_ENOMEM, "out of memory");
	for (int i = 0; i < p->n_devices && !d->rc; i++) {
		const sp_device_t *x = &p->devices[i];
		at(d, "devices", i);
		if (chk_int(d, "node", x->node, 0, p->nodes - 1) ||
		    chk_int(d, "local", x->local, 0, p->gpus_per_node - 1) ||
		    chk_span(d, "first_ins", x->first_ins, x->n_ins, p->n_ins,
			     "instructions") ||
		    chk_span(d, "held_off", x->held_off, x->n_held, p->n_held,
			     "held params") ||
		    chk_int(d, "mem_peak", x->mem_peak, 0, INT64_MAX) ||
		    chk_finite(d, "busy_ms", x->busy_ms) ||
		    chk_finite(d, "comm_ms", x->comm_ms) ||
		    chk_finite(d, "idle_ms", x->idle_ms) ||
		    chk_finite(d, "finish_ms", x->finish_ms))
			break;
		for (int k = 0; k < MEM__COUNT; k++)
			if (chk_int(d, "mem", x->mem[k], 0, INT64_MAX))
				break;
		size_t slot = (size_t)x->node * (size_t)p->gpus_per_node +
			      (size_t)x->local;
		if (!d->rc && used[slot])
			fail(d, "local", "node %d GPU %d is already another device",
			     x->node, x->local);
		used[slot] = 1;
	}
	free(used);
	return d->rc;
}

/* [s0, s1) inside the batch of metaop m's task */
static int chk_samples(dec_t *d, const sp_plan_t *p, const sp_ins_t *in, int m)
{
	int64_t B = p->model.tasks[p->metaops[m].task].batch;
	if (in->s0 >= 0 && in->s0 <= in->s1 && in->s1 <= B)
		return 0;
	return fail(d, "s0", "sample range [%d, %d) is outside the task's batch "
			     "[0, %lld)",
		    in->s0, in->s1, (long long)B);
}

/* A value reference: metaop, boundary, act/grad, seq range of seq_len tokens. */
static int chk_vref(dec_t *d, const sp_plan_t *p, const sp_ins_t *in, const char *name,
		    const sp_vref_t *v)
{
	char f[4][24];
	snprintf(f[0], sizeof f[0], "%s.metaop", name);
	snprintf(f[1], sizeof f[1], "%s.layer", name);
	snprintf(f[2], sizeof f[2], "%s.grad", name);
	snprintf(f[3], sizeof f[3], "%s.seq_off", name);
	if (chk_index(d, f[0], v->metaop, p->n_metaops, "metaop") ||
	    chk_int(d, f[1], v->layer, 0, p->metaops[v->metaop].n_layers) ||
	    chk_int(d, f[2], v->grad, 0, 1))
		return d->rc;
	int32_t seq, width;
	plan_value_shape(p, v->metaop, v->layer, &seq, &width);
	if (chk_int(d, "seq_len", in->seq_len, 0, INT32_MAX) ||
	    chk_span(d, f[3], v->seq_off, in->seq_len, seq, "tokens of the value"))
		return d->rc;
	return chk_samples(d, p, in, v->metaop);
}

static int check_ins(dec_t *d, const sp_plan_t *p, const sp_ins_t *in)
{
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		if (chk_index(d, "slice", in->slice, p->n_slices, "slice"))
			return d->rc;
		int m = p->slices[in->slice].metaop;
		if (in->op == INS_LOSS && !comp_is_sink(p->metaops[m].shape.type))
			return fail(d, "slice", "loss of slice %d, whose metaop '%s' "
						"is not a loss",
				    in->slice, p->metaops[m].name);
		/* the values a compute instruction reads and writes are implied
		 * by its slice; the runtime indexes them, so they must match */
		const sp_slice_t *sl = &p->slices[in->slice];
		int a = sl->layer_from, b = sl->layer_to;
		sp_vref_t src = {m, a, 0, 0}, dst = {m, b, 0, 0};
		if (in->op == INS_BWD) {
			src = (sp_vref_t){m, b, 1, 0};
			dst = (sp_vref_t){m, a, 1, 0};
		} else if (in->op == INS_LOSS) {
			src = (sp_vref_t){m, 0, 0, 0};
			dst = (sp_vref_t){m, 0, 1, 0};
		}
		int bad_src = memcmp(&in->src, &src, sizeof src) != 0;
		if (bad_src || memcmp(&in->dst, &dst, sizeof dst))
			return fail(d, bad_src ? "src" : "dst", "values (metaop %d layer %d grad %d, metaop %d "
					      "layer %d grad %d) do not match slice %d",
				    in->src.metaop, in->src.layer, in->src.grad, in->dst.metaop,
				    in->dst.layer, in->dst.grad, in->slice);
		return chk_samples(d, p, in, m);
	}
	case INS_SEND:
	case INS_RECV:
		if (chk_index(d, "peer", in->peer, p->n_devices, "device") ||
		    chk_int(d, "tag", in->tag, 0, INT32_MAX))
			return d->rc;
		return in->op == INS_SEND ? chk_vref(d, p, in, "src", &in->src)
					  : chk_vref(d, p, in, "dst", &in->dst);
	case INS_COPY: {
		if (chk_vref(d, p, in, "src", &in->src) ||
		    chk_vref(d, p, in, "dst", &in->dst))
			return d->rc;
		int32_t sq, ws, wd;
		plan_value_shape(p, in->src.metaop, in->src.layer, &sq, &ws);
		plan_value_shape(p, in->dst.metaop, in->dst.layer, &sq, &wd);
		if (ws != wd)
			return fail(d, "dst", "copy between values of widths %d and %d",
				    ws, wd);
		return 0;
	}
	case INS_SYNC: return chk_index(d, "peer", in->peer, p->n_buckets, "bucket");
	case INS_STEP: return 0;
	default: return fail(d, "op", "unknown instruction op code %d", in->op);
	}
}

/*
 * Programs do not share instructions (so checking them costs O(n_ins)), and a
 * device does not send to or receive from itself.
 */
static int check_programs(dec_t *d, const sp_plan_t *p)
{
	int32_t *owner = calloc(p->n_ins ? (size_t)p->n_ins : 1, sizeof *owner);
	if (!owner)
		return fail_code(d, SP_ENOMEM, "out of memory");
	for (int dev = 0; dev < p->n_devices && !d->rc; dev++) {
		const sp_device_t *x = &p->devices[dev];
		for (int k = x->first_ins; k < x->first_ins + x->n_ins; k++) {
			if (owner[k]) {
				at(d, "devices", dev);
				fail(d, "first_ins", "instruction %d is also in "
						     "the program of device %d",
				     k, owner[k] - 1);
				break;
			}
			owner[k] = dev + 1;
		}
	}
	for (int i = 0; i < p->n_ins && !d->rc; i++) {
		const sp_ins_t *in = &p->ins[i];
		int dev = owner[i] - 1;
		at(d, "instructions", i);
		if (check_ins(d, p, in))
			break;
		if ((in->op == INS_SEND || in->op == INS_RECV) && in->peer == dev)
			fail(d, "peer", "device %d %s itself", dev,
			     in->op == INS_SEND ? "sends to" : "receives from");
	}
	free(owner);
	return d->rc;
}

static int check_results(dec_t *d, const sp_plan_t *p)
{
	const sp_cert_t *c = &p->cert;
	const struct {
		const char *name;
		double v;
	} f[] = {
		{"iteration_ms", c->iteration_ms},
		{"compute_ms", c->compute_ms},
		{"transfer_ms", c->transfer_ms},
		{"sync_ms", c->sync_ms},
		{"step_ms", c->step_ms},
		{"area_bound_ms", c->area_bound_ms},
		{"cp_bound_ms", c->cp_bound_ms},
		{"paper_bound_ms", c->paper_bound_ms},
		{"lower_bound_ms", c->lower_bound_ms},
		{"allot_bound_ms", c->allot_bound_ms},
		{"gap", c->gap},
		{"xfer_pred_ms", c->xfer_pred_ms},
		{"naive_xfer_pred_ms", c->naive_xfer_pred_ms},
	};
	at(d, "certificate", -1);
	for (int k = 0; k < SP_ARRAY_LEN(f); k++)
		if (chk_finite(d, f[k].name, f[k].v))
			return d->rc;
	if (chk_int(d, "xnode_bytes", c->xnode_bytes, 0, INT64_MAX) ||
	    chk_int(d, "naive_xnode_bytes", c->naive_xnode_bytes, 0, INT64_MAX))
		return d->rc;
	for (int i = 0; i < p->n_algos; i++) {
		const sp_algo_result_t *a = &p->algos[i];
		at(d, "algorithms", i);
		if (!a->name[0])
			return fail(d, "name", "empty algorithm name");
		if (chk_finite(d, "iteration_ms", a->iteration_ms) ||
		    chk_finite(d, "compute_ms", a->compute_ms) ||
		    chk_finite(d, "planning_ms", a->planning_ms) ||
		    chk_finite(d, "utilisation", a->utilisation) ||
		    chk_int(d, "fits_memory", a->fits_memory, 0, 1))
			return d->rc;
	}
	return 0;
}

/* Order matters: each check relies only on what the checks before it proved. */
static int check_all(dec_t *d, const sp_plan_t *p)
{
	if (check_model(d, &p->model) || check_provenance(d, p) || check_metaops(d, p) ||
	    check_edges(d, p) ||
	    check_dev_list(d, "slice_devs", p->slice_devs, p->n_slice_devs,
			   p->n_devices) ||
	    check_dev_list(d, "bucket_devs", p->bucket_devs, p->n_bucket_devs,
			   p->n_devices) ||
	    check_params(d, "bucket_params", p->bucket_params, p->n_bucket_params,
			 &p->model) ||
	    check_params(d, "held", p->held, p->n_held, &p->model) ||
	    check_buckets(d, p) || check_devices(d, p))
		return d->rc;
	int32_t *stamp = calloc((size_t)p->n_devices, sizeof *stamp);
	if (!stamp)
		return fail_code(d, SP_ENOMEM, "out of memory");
	if (!check_waves_slices(d, p, stamp) && !check_programs(d, p))
		check_results(d, p);
	free(stamp);
	return d->rc;
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
	    decode_all(&d, out) || check_all(&d, out)) {
		plan_release(out);
		return d.rc;
	}
	return 0;
}

int plan_read(sp_plan_t *out, const char *path, sp_err_t *err)
{
	char *buf;
	size_t len;
	memset(out, 0, sizeof *out);
	int rc = sp_read_file(&buf, &len, path, err);
	if (rc)
		return rc;
	rc = plan_decode(out, (const uint8_t *)buf, len, path, err);
	free(buf);
	return rc;
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
