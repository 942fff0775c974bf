/*
 * safetensors.h — the safetensors container, written and read by the
 * checkpoints (ckpt_save.c, ckpt_load.c) and the weights files (weights.c).
 *
 * Layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte
 * little-endian header length N, N bytes of JSON (here padded with spaces
 * to a multiple of 8, as the format allows) mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * end of the header) and an optional "__metadata__" of strings, then the
 * raw little-endian data. A tensor's shape here is a parameter tensor of
 * layers.h: [rows] for vectors (cols == 1), else [rows, cols].
 *
 * It knows nothing of components, layers or names: callers choose them.
 * Floats go in and come out as fp32; F32, BF16 and F16 are the dtypes it
 * converts (BF16 rounded to nearest even on the way out).
 */
#ifndef SPINDLE_SAFETENSORS_H
#define SPINDLE_SAFETENSORS_H

#include "common.h"
#include "layers.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* I32 is read only as raw integers (st_in_info, st_in_read: datasets), never
 * as parameters. */
typedef enum { ST_F32, ST_BF16, ST_F16, ST_I32 } st_dtype_t;

/* "F32", "BF16", "F16", "I32" (safetensors' names). */
const char *st_dtype_name(st_dtype_t d);

/* ---- writing ------------------------------------------------------------ */

/* A file being assembled in memory: tensors in the order added. */
typedef struct {
	json_t *hdr;
	uint8_t *data;
	size_t len, cap;
} st_out_t;

/* Starts a file whose __metadata__ is meta (an object of strings; the call
 * takes it, also on failure). SP_ENOMEM on failure. */
int st_out_init(st_out_t *o, json_t *meta);
/* Appends tensor `name` of t's shape: t->rows * t->cols floats from x,
 * stored as dt (F32 or BF16; F16 is only read). */
int st_out_add(st_out_t *o, const char *name, const layer_tensor_t *t, const float *x,
	       st_dtype_t dt);
/* The whole file: the 8-byte length, the JSON header (key-sorted,
 * compact, padded) and the data; *file is on the heap (caller frees). */
int st_out_finish(st_out_t *o, uint8_t **file, size_t *len);
void st_out_release(st_out_t *o);

/* ---- reading ------------------------------------------------------------ */

/*
 * A file whose header was read and checked: every entry has a dtype,
 * integer shape and data_offsets within the data, of the size the dtype and
 * shape give. The data is either in memory (buf) or read on demand from fd
 * (only the tensors asked for).
 */
typedef struct {
	const char *path; /* for messages; not owned */
	json_t *hdr;
	const uint8_t *buf; /* the whole file, or NULL: read from fd */
	int fd;
	uint64_t data_at, data_len;
} st_in_t;

/* From a whole file in memory (buf must outlive *in). */
int st_in_mem(st_in_t *in, const char *path, const uint8_t *buf, size_t len, sp_err_t *err);
/* Opens path and reads its header only. */
int st_in_open(st_in_t *in, const char *path, sp_err_t *err);
void st_in_release(st_in_t *in);

/*
 * Checks tensor `name` against t's shape (and dtype F32 when f32_only) and,
 * when out is not NULL, reads it into out as fp32. A missing tensor, another
 * shape or a dtype not allowed is SP_EINPUT naming the file and the tensor;
 * shown_as, when not NULL, is the name the file gives it (a renamed tensor).
 */
int st_in_get(st_in_t *in, const char *name, const char *shown_as, const layer_tensor_t *t,
	      int f32_only, float *out, sp_err_t *err);

/* A tensor's entry in a checked header: dtype, shape (ndim > ST_MAX_DIMS:
 * more dimensions than shown), start of its data (bytes after the header). */
#define ST_MAX_DIMS 4
typedef struct {
	st_dtype_t dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	uint64_t offset;
} st_info_t;

/* Tensor `name`'s entry; a missing tensor is SP_EINPUT naming file and
 * tensor. */
int st_in_info(st_in_t *in, const char *name, st_info_t *out, sp_err_t *err);
/* Bytes [at, at + n) of t's data, raw (little-endian, as stored); the
 * caller keeps within the tensor. A failed read is SP_EIO naming the file. */
int st_in_read(st_in_t *in, const st_info_t *t, uint64_t at, size_t n, void *out,
	       sp_err_t *err);

#endif
