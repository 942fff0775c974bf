/*
 * plan_diag.c — how the plan reader reports: each error names the file, the
 * section and record being read or checked (set by pr_at), the field, and
 * what is wrong; the first error wins and a hint is added only to our own
 * error. Also the range checks every part of the reader uses. It reads
 * nothing itself.
 */
#include "jsonutil.h"
#include "plan_reader.h"

#include <math.h>
#include <stdarg.h>

void pr_at(dec_t *d, const char *where, int64_t idx)
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

int pr_fail(dec_t *d, const char *field, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(d, SP_EINPUT, field, fmt, ap);
	va_end(ap);
	return rc;
}

void pr_hint(dec_t *d, const char *fmt, ...)
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

int pr_fail_code(dec_t *d, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vfail(d, code, NULL, fmt, ap);
	va_end(ap);
	return rc;
}

/* v in [0, n): an index into n things called `what` */
int pr_index(dec_t *d, const char *field, int64_t v, int64_t n, const char *what)
{
	if (v >= 0 && v < n)
		return 0;
	return pr_fail(d, field, "%s %lld does not exist (there are %lld)", what,
		    (long long)v, (long long)n);
}

/* [off, off + n) within [0, total) */
int pr_span(dec_t *d, const char *field, int64_t off, int64_t n, int64_t total,
		    const char *what)
{
	if (n < 0)
		return pr_fail(d, field, "negative count %lld", (long long)n);
	if (off >= 0 && off <= total && n <= total - off)
		return 0;
	return pr_fail(d, field, "range [%lld, %lld) is outside the %lld %s", (long long)off,
		    (long long)(off + n), (long long)total, what);
}

int pr_int(dec_t *d, const char *field, int64_t v, int64_t lo, int64_t hi)
{
	if (v >= lo && v <= hi)
		return 0;
	return pr_fail(d, field, "%lld is outside [%lld, %lld]", (long long)v, (long long)lo,
		    (long long)hi);
}

int pr_finite(dec_t *d, const char *field, double v)
{
	return isfinite(v) ? 0 : pr_fail(d, field, "not a finite number");
}

/* v in [lo, hi], or (lo, hi] when lo_open */
int pr_num(dec_t *d, const char *field, double v, double lo, double hi,
		   int lo_open)
{
	if (pr_finite(d, field, v))
		return d->rc;
	if ((lo_open ? v > lo : v >= lo) && v <= hi)
		return 0;
	return pr_fail(d, field, "%g is outside %c%g, %g]", v, lo_open ? '(' : '[', lo, hi);
}

int pr_name(dec_t *d, const char *field, const char *s)
{
	if (jvalid_name(s))
		return 0;
	pr_fail(d, field, "invalid name '%s'", s);
	pr_hint(d, "names are 1-63 characters of letters, digits, '_', and (after "
		"the first) '-' or '.'");
	return d->rc;
}
