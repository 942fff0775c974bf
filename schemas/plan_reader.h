/*
 * plan_reader.h — private to the plan reader's units (plan_decode.c,
 * plan_check.c, plan_diag.c): the decoder's state and the helpers that
 * report an error at the record and field being read or checked. Not for
 * callers of the reader: they use plan.h.
 */
#ifndef SPINDLE_PLAN_READER_H
#define SPINDLE_PLAN_READER_H

#include "plan.h"
#include "plan_format.h"

/* batch x seq x width of one value: its byte count fits int64 with room */
#define MAX_VALUE_ELEMS ((int64_t)1 << 48)

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

/* ---- plan_diag.c: errors at the record being read or checked --------- */

/* The record (section `where`, element idx or -1) the next errors name. */
void pr_at(dec_t *d, const char *where, int64_t idx);
/* SP_EINPUT at where[idx].field (field may be NULL); the first error wins. */
int pr_fail(dec_t *d, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Adds a hint to our own error, not to an earlier one. */
void pr_hint(dec_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error of another code (SP_ENOMEM, SP_EINTERNAL) at the record. */
int pr_fail_code(dec_t *d, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* v in [0, n): an index into n things called `what` */
int pr_index(dec_t *d, const char *field, int64_t v, int64_t n, const char *what);
/* [off, off + n) within [0, total) */
int pr_span(dec_t *d, const char *field, int64_t off, int64_t n, int64_t total,
	    const char *what);
int pr_int(dec_t *d, const char *field, int64_t v, int64_t lo, int64_t hi);
int pr_finite(dec_t *d, const char *field, double v);
/* v in [lo, hi], or (lo, hi] when lo_open */
int pr_num(dec_t *d, const char *field, double v, double lo, double hi, int lo_open);
int pr_name(dec_t *d, const char *field, const char *s);

/* ---- plan_check.c ------------------------------------------------------ */

/* Every name, dimension, index and range of a decoded plan, its model's
 * rules (model_check.c) included. Returns d->rc. */
int pr_check(dec_t *d, const sp_plan_t *p);

#endif
