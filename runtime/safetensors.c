/*
 * safetensors.c — the safetensors container (layout in safetensors.h):
 * assembling a file in memory, reading and checking a header, reading
 * tensors as fp32 from memory or by offset from a file. It does not decide
 * names, what a file must hold, or how it is written to disk (the callers:
 * ckpt_save.c through its fsynced snapshot, weights.c atomically).
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes per element of each dtype, in st_dtype_t order. */
static const char *const DT_NAMES[] = {"F32", "BF16", "F16", "I32"};
static const int DT_BYTES[] = {4, 2, 2, 4};

const char *st_dtype_name(st_dtype_t d)
{
	return DT_NAMES[d];
}

/* The dtype named s, or -1. */
static int dtype_of(const char *s)
{
	for (int i = 0; s && i < SP_ARRAY_LEN(DT_NAMES); i++)
		if (!strcmp(s, DT_NAMES[i]))
			return i;
	return -1;
}

/* ---- conversions ----------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN. */
static uint16_t to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* IEEE binary16 -> fp32, exactly (subnormals, infinities, NaN). */
static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0x1f)
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		float v = ldexpf((float)man, -24);
		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* ---- writing ------------------------------------------------------------ */

int st_out_init(st_out_t *o, json_t *meta)
{
	memset(o, 0, sizeof *o);
	o->hdr = json_object();
	if (!o->hdr || !meta || json_object_set_new(o->hdr, "__metadata__", meta)) {
		if (!o->hdr)
			json_decref(meta);
		json_decref(o->hdr);
		o->hdr = NULL;
		return SP_ENOMEM;
	}
	return 0;
}

/* [rows] for vectors (layers.h gives them as cols == 1), else [rows, cols]. */
static json_t *shape_of(const layer_tensor_t *t)
{
	return t->cols == 1 ? json_pack("[I]", (json_int_t)t->rows)
			    : json_pack("[I,I]", (json_int_t)t->rows, (json_int_t)t->cols);
}

int st_out_add(st_out_t *o, const char *name, const layer_tensor_t *t, const float *x,
	       st_dtype_t dt)
{
	size_t n = (size_t)(t->rows * t->cols), nb = n * (size_t)DT_BYTES[dt];
	if (dt == ST_F16 || dt == ST_I32) /* read, never written: a trainer exports F32 or BF16 */
		return SP_EINTERNAL;
	if (o->len + nb > o->cap) {
		size_t cap = SP_MAX(o->cap * 2, o->len + nb);
		uint8_t *d = realloc(o->data, cap + 1);
		if (!d)
			return SP_ENOMEM;
		o->data = d;
		o->cap = cap;
	}
	json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", DT_NAMES[dt], "shape", shape_of(t),
			      "data_offsets", (json_int_t)o->len, (json_int_t)(o->len + nb));
	if (!e || json_object_set_new(o->hdr, name, e))
		return SP_ENOMEM;
	uint8_t *p = o->data + o->len;
	if (dt == ST_F32) {
		memcpy(p, x, nb);
	} else {
		for (size_t i = 0; i < n; i++) {
			uint16_t b = to_bf16(x[i]);
			p[2 * i] = (uint8_t)b;
			p[2 * i + 1] = (uint8_t)(b >> 8);
		}
	}
	o->len += nb;
	return 0;
}

int st_out_finish(st_out_t *o, uint8_t **file, size_t *len)
{
	char *js = json_dumps(o->hdr, JSON_SORT_KEYS | JSON_COMPACT);
	if (!js)
		return SP_ENOMEM;
	size_t hl = strlen(js), padded = (hl + 7) & ~(size_t)7;
	uint8_t *f = malloc(8 + padded + o->len);
	if (!f) {
		free(js);
		return SP_ENOMEM;
	}
	for (int i = 0; i < 8; i++)
		f[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	memcpy(f + 8, js, hl);
	memset(f + 8 + hl, ' ', padded - hl);
	if (o->len)
		memcpy(f + 8 + padded, o->data, o->len);
	free(js);
	*file = f;
	*len = 8 + padded + o->len;
	return 0;
}

void st_out_release(st_out_t *o)
{
	if (o) {
		json_decref(o->hdr);
		free(o->data);
		*o = (st_out_t){0};
	}
}

/* ---- reading ------------------------------------------------------------ */

/* Entry e of the header: a known dtype, an integer shape, offsets within
 * the data and of the size dtype and shape give. */
static int check_entry(const st_in_t *in, const char *key, json_t *e, sp_err_t *err)
{
	json_t *off = json_object_get(e, "data_offsets"), *shape = json_object_get(e, "shape");
	const char *dts = json_string_value(json_object_get(e, "dtype"));
	if (!json_is_object(e) || !json_is_array(shape) || !json_is_array(off) ||
	    json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
	    !json_is_integer(json_array_get(off, 1)) || !dts)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s': entry lacks dtype, shape or data_offsets", key);
	int dt = dtype_of(dts);
	if (dt < 0)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s': dtype %s is not supported (F32, BF16, F16 are)",
				  key, dts);
	uint64_t n = 1;
	size_t i;
	json_t *d;
	json_array_foreach(shape, i, d) {
		json_int_t v = json_integer_value(d);
		if (!json_is_integer(d) || v < 0 || (v > 0 && n > (UINT64_C(1) << 40) / (uint64_t)v))
			return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
					  "tensor '%s': bad shape", key);
		n *= (uint64_t)v;
	}
	json_int_t a = json_integer_value(json_array_get(off, 0));
	json_int_t b = json_integer_value(json_array_get(off, 1));
	if (a < 0 || b < a || (uint64_t)b > in->data_len)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s': data_offsets [%lld, %lld] run past the %llu data "
				  "bytes (is the file truncated?)",
				  key, (long long)a, (long long)b, (unsigned long long)in->data_len);
	if ((uint64_t)(b - a) != n * (uint64_t)DT_BYTES[dt])
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s': %lld data bytes for %llu elements of %s", key,
				  (long long)(b - a), (unsigned long long)n, dts);
	return 0;
}

/* __metadata__, when present: an object of strings, as the format says. */
static int check_meta(const st_in_t *in, json_t *meta, sp_err_t *err)
{
	const char *k;
	json_t *v;
	int ok = json_is_object(meta);
	json_object_foreach(meta, k, v)
		ok &= json_is_string(v);
	return ok ? 0
		  : sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
			       "bad safetensors header: __metadata__ is not an object of strings");
}

/* The header hl bytes at text: JSON, an object with each name once, every
 * entry checked. */
static int parse_header(st_in_t *in, const char *text, uint64_t hl, sp_err_t *err)
{
	json_error_t je;
	in->hdr = json_loadb(text, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
	if (!in->hdr || !json_is_object(in->hdr))
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "bad safetensors header: %s", in->hdr ? "not an object" : je.text);
	const char *key;
	json_t *e;
	json_object_foreach(in->hdr, key, e) {
		int rc = strcmp(key, "__metadata__") ? check_entry(in, key, e, err)
						     : check_meta(in, e, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* The 8-byte length against the file's size. */
static int header_length(st_in_t *in, const uint8_t b[8], uint64_t size, uint64_t *hl,
			 sp_err_t *err)
{
	*hl = 0;
	for (int i = 0; i < 8; i++)
		*hl |= (uint64_t)b[i] << (8 * i);
	if (size < 8 || *hl > size - 8 || *hl < 2 || *hl > ((uint64_t)100 << 20))
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "not a safetensors file (header length %llu of %llu bytes)",
				  (unsigned long long)(size < 8 ? 0 : *hl),
				  (unsigned long long)size);
	in->data_at = 8 + *hl;
	in->data_len = size - 8 - *hl;
	return 0;
}

int st_in_mem(st_in_t *in, const char *path, const uint8_t *buf, size_t len, sp_err_t *err)
{
	memset(in, 0, sizeof *in);
	in->path = path;
	in->fd = -1;
	in->buf = buf;
	uint64_t hl = 0;
	if (len < 8)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "not a safetensors file (%zu bytes)", len);
	int rc = header_length(in, buf, len, &hl, err);
	return rc ? rc : parse_header(in, (const char *)buf + 8, hl, err);
}

/* n bytes at offset `at` of fd, all of them. */
static int read_at(int fd, void *out, size_t n, uint64_t at)
{
	uint8_t *p = out;
	while (n > 0) {
		ssize_t r = pread(fd, p, n, (off_t)at);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
		at += (uint64_t)r;
	}
	return 0;
}

int st_in_open(st_in_t *in, const char *path, sp_err_t *err)
{
	memset(in, 0, sizeof *in);
	in->path = path;
	in->fd = open(path, O_RDONLY);
	if (in->fd < 0)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "cannot open file: %s",
				  strerror(errno));
	struct stat sb;
	uint8_t b[8];
	uint64_t hl = 0;
	if (fstat(in->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "not a regular file");
	if (sb.st_size < 8 || read_at(in->fd, b, 8, 0))
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "not a safetensors file (%lld bytes)", (long long)sb.st_size);
	int rc = header_length(in, b, (uint64_t)sb.st_size, &hl, err);
	if (rc)
		return rc;
	char *text = malloc((size_t)hl + 1);
	if (!text)
		rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
	else if (read_at(in->fd, text, (size_t)hl, 8))
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "read error");
	else
		rc = parse_header(in, text, hl, err);
	free(text);
	return rc;
}

void st_in_release(st_in_t *in)
{
	if (in && in->fd >= 0)
		close(in->fd);
	if (in) {
		json_decref(in->hdr);
		*in = (st_in_t){.fd = -1};
	}
}

/* "[r, c]" or "[r]" of a header's shape array. */
static void shape_text(char *out, size_t cap, json_t *shape)
{
	size_t i, n = 0;
	json_t *d;
	n += (size_t)snprintf(out, cap, "[");
	json_array_foreach(shape, i, d) {
		if (n < cap)
			n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "",
					      (long long)json_integer_value(d));
	}
	if (n < cap)
		snprintf(out + n, cap - n, "]");
}

int st_in_get(st_in_t *in, const char *name, const char *ours, const layer_tensor_t *t,
	      int f32_only, float *out, sp_err_t *err)
{
	char as[200] = "";
	if (ours && strcmp(ours, name))
		snprintf(as, sizeof as, " (the model's '%s')", ours);
	json_t *e = strcmp(name, "__metadata__") ? json_object_get(in->hdr, name) : NULL;
	if (!e)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL, "tensor '%s'%s is missing",
				  name, as);
	int dt = dtype_of(json_string_value(json_object_get(e, "dtype")));
	json_t *want = shape_of(t), *shape = json_object_get(e, "shape");
	int same = want && json_equal(shape, want);
	char got_s[100], want_s[100];
	shape_text(got_s, sizeof got_s, shape);
	shape_text(want_s, sizeof want_s, want);
	json_decref(want);
	if (!same)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s'%s has shape %s, the model's is %s", name, as, got_s,
				  want_s);
	if (dt == ST_I32)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s'%s has dtype I32, not a float type", name, as);
	if (f32_only && dt != ST_F32)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s'%s has dtype %s, not F32", name, as, DT_NAMES[dt]);
	if (!out)
		return 0;
	size_t n = (size_t)(t->rows * t->cols), nb = n * (size_t)DT_BYTES[dt];
	uint64_t a = (uint64_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
	const uint8_t *src = in->buf ? in->buf + in->data_at + a : NULL;
	uint8_t *tmp = NULL;
	if (!src) {
		/* F32 lands in place; a half type through a buffer */
		tmp = dt == ST_F32 ? (uint8_t *)out : malloc(nb + 1);
		if (!tmp)
			return sp_err_set(err, SP_ENOMEM, in->path, 0, 0, NULL, "out of memory");
		if (read_at(in->fd, tmp, nb, in->data_at + a)) {
			if (dt != ST_F32)
				free(tmp);
			return sp_err_set(err, SP_EIO, in->path, 0, 0, NULL,
					  "tensor '%s': read error", name);
		}
		src = tmp;
	}
	if (dt == ST_F32) {
		if (src != (const uint8_t *)out)
			memcpy(out, src, nb);
	} else {
		for (size_t i = 0; i < n; i++) {
			uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
			out[i] = dt == ST_BF16 ? bits_f32((uint32_t)h << 16) : f16_to_f32(h);
		}
	}
	if (tmp && dt != ST_F32)
		free(tmp);
	return 0;
}

int st_in_info(st_in_t *in, const char *name, st_info_t *out, sp_err_t *err)
{
	json_t *e = strcmp(name, "__metadata__") ? json_object_get(in->hdr, name) : NULL;
	memset(out, 0, sizeof *out);
	if (!e)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL, "tensor '%s' is missing",
				  name);
	json_t *shape = json_object_get(e, "shape");
	out->dtype = (st_dtype_t)dtype_of(json_string_value(json_object_get(e, "dtype")));
	out->ndim = (int)SP_MIN(json_array_size(shape), (size_t)ST_MAX_DIMS);
	for (int i = 0; i < out->ndim; i++)
		out->shape[i] = (int64_t)json_integer_value(json_array_get(shape, (size_t)i));
	if (json_array_size(shape) > ST_MAX_DIMS)
		out->ndim = ST_MAX_DIMS + 1;
	out->offset = (uint64_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
	return 0;
}

int st_in_read(st_in_t *in, const st_info_t *t, uint64_t at, size_t n, void *out,
	       sp_err_t *err)
{
	if (in->buf) {
		memcpy(out, in->buf + in->data_at + t->offset + at, n);
		return 0;
	}
	if (read_at(in->fd, out, n, in->data_at + t->offset + at))
		return sp_err_set(err, SP_EIO, in->path, 0, 0, NULL,
				  "read error at byte %llu (did the file shrink?)",
				  (unsigned long long)(in->data_at + t->offset + at));
	return 0;
}
