/*
 * jsonutil.h — strict reading of jansson values for the loaders: a JSON
 * path kept while walking, type and range checks with messages that name
 * file:line:col and the path, unknown-key rejection with a closest-name
 * hint. jansson keeps no positions for parsed values, so jloc rescans the
 * original text along the path when (and only when) an error is reported.
 */
#ifndef SPINDLE_JSONUTIL_H
#define SPINDLE_JSONUTIL_H

#include "common.h"

#include <jansson.h>

#define JP_MAX_DEPTH 16

typedef struct {
	const char *key; /* NULL: array index */
	size_t index;
} jp_comp_t;

typedef struct {
	const char *text;
	size_t len;
	const char *file;
	sp_err_t *err;
	int depth;
	jp_comp_t comp[JP_MAX_DEPTH];
} jctx_t;

void jp_push_key(jctx_t *c, const char *key);
void jp_push_index(jctx_t *c, size_t i);
void jp_pop(jctx_t *c);

/*
 * Reports an error at the current path (at_key: point at the key of the
 * last component rather than its value). Returns SP_EINPUT.
 */
int jerr(jctx_t *c, int at_key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Same, for the member `key` of the object at the current path. */
int jerr_member(jctx_t *c, const char *key, int at_key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Parses text with duplicate keys rejected; reports syntax errors. */
json_t *jparse(jctx_t *c);

/* Checks obj is an object whose keys all appear in allowed (NULL-ended). */
int jcheck_object(jctx_t *c, json_t *obj, const char *what,
		  const char *const *allowed);

/*
 * Member readers. Each reads obj[key]; if absent: required → error,
 * else leaves *out at its default and returns 0.
 */
int jget_int(jctx_t *c, json_t *obj, const char *key, int required,
	     int64_t lo, int64_t hi, int64_t *out);
int jget_num(jctx_t *c, json_t *obj, const char *key, int required,
	     double lo, double hi, int lo_open, double *out);
int jget_bool(jctx_t *c, json_t *obj, const char *key, int required, int *out);
int jget_name(jctx_t *c, json_t *obj, const char *key, int required,
	      char *out, size_t cap);
/* String member restricted to choices[]; *out = index. */
int jget_enum(jctx_t *c, json_t *obj, const char *key, int required,
	      const char *const *choices, int n, int *out);
/* Checks a "format" member equals "<family>/<version>". */
int jcheck_format(jctx_t *c, json_t *root, const char *family, int version);
/* Name rule shared by ids: [A-Za-z0-9_][A-Za-z0-9_.-]*, 1..63 chars. */
int jvalid_name(const char *s);

/* FNV-1a of the canonical dump (sorted keys, compact) in *out: whitespace
 * and key order do not change it. SP_ENOMEM (reported) when it cannot. */
int jcanonical_hash(jctx_t *c, json_t *root, uint64_t *out);

#endif
