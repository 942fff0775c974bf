/*
 * jsonutil.c — strict member readers and error positions for the loaders.
 *
 * Positions: jansson reports line:column only for syntax errors. For a
 * semantic error we walk the original text along the JSON path with a
 * small scanner (the text is known to be valid JSON at that point) and
 * report the 1-based line and column of the value, or of its key.
 */
#include "jsonutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void jp_push_key(jctx_t *c, const char *key)
{
	if (c->depth < JP_MAX_DEPTH)
		c->comp[c->depth] = (jp_comp_t){key, 0};
	c->depth++;
}

void jp_push_index(jctx_t *c, size_t i)
{
	if (c->depth < JP_MAX_DEPTH)
		c->comp[c->depth] = (jp_comp_t){NULL, i};
	c->depth++;
}

void jp_pop(jctx_t *c)
{
	if (c->depth > 0)
		c->depth--;
}

static void path_string(const jctx_t *c, int depth, char *buf, size_t cap)
{
	size_t n = 0;
	buf[0] = 0;
	for (int i = 0; i < depth && i < JP_MAX_DEPTH; i++) {
		const jp_comp_t *p = &c->comp[i];
		int w;
		if (p->key)
			w = snprintf(buf + n, cap - n, "%s%s", n ? "." : "", p->key);
		else
			w = snprintf(buf + n, cap - n, "[%zu]", p->index);
		if (w < 0 || (size_t)w >= cap - n)
			return;
		n += (size_t)w;
	}
}

/* ---- locating a path in the text ---- */

typedef struct {
	const char *s, *end;
} scan_t;

static void skip_ws(scan_t *t)
{
	while (t->s < t->end && (*t->s == ' ' || *t->s == '\t' || *t->s == '\n' ||
				 *t->s == '\r'))
		t->s++;
}

/* Appends the UTF-8 encoding of code point u to b (at least 4 bytes). */
static int utf8_put(unsigned long u, unsigned char *b)
{
	if (u < 0x80) {
		b[0] = (unsigned char)u;
		return 1;
	}
	if (u < 0x800) {
		b[0] = (unsigned char)(0xc0 | (u >> 6));
		b[1] = (unsigned char)(0x80 | (u & 0x3f));
		return 2;
	}
	if (u < 0x10000) {
		b[0] = (unsigned char)(0xe0 | (u >> 12));
		b[1] = (unsigned char)(0x80 | ((u >> 6) & 0x3f));
		b[2] = (unsigned char)(0x80 | (u & 0x3f));
		return 3;
	}
	b[0] = (unsigned char)(0xf0 | (u >> 18));
	b[1] = (unsigned char)(0x80 | ((u >> 12) & 0x3f));
	b[2] = (unsigned char)(0x80 | ((u >> 6) & 0x3f));
	b[3] = (unsigned char)(0x80 | (u & 0x3f));
	return 4;
}

static long hex4(const char *p, const char *end)
{
	long v = 0;
	if (end - p < 4)
		return -1;
	for (int i = 0; i < 4; i++) {
		char ch = p[i];
		int d = ch >= '0' && ch <= '9'   ? ch - '0'
			: ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
			: ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
						 : -1;
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

/*
 * Skips a string starting at '"'. When want is not NULL, *eq tells whether
 * the decoded string (escapes resolved as jansson resolves them) equals
 * want, so keys written with escapes or of any length are found.
 */
static int skip_string(scan_t *t, const char *want, int *eq)
{
	size_t n = 0, wl = want ? strlen(want) : 0;
	int same = 1;
	if (t->s >= t->end || *t->s != '"')
		return -1;
	t->s++;
	while (t->s < t->end && *t->s != '"') {
		unsigned char b[8];
		int k = 1;
		b[0] = (unsigned char)*t->s;
		if (*t->s == '\\' && t->s + 1 < t->end) {
			t->s++;
			switch (*t->s) {
			case 'b': b[0] = '\b'; break;
			case 'f': b[0] = '\f'; break;
			case 'n': b[0] = '\n'; break;
			case 'r': b[0] = '\r'; break;
			case 't': b[0] = '\t'; break;
			case 'u': {
				long u = hex4(t->s + 1, t->end);
				if (u < 0)
					return -1;
				t->s += 4;
				if (u >= 0xd800 && u < 0xdc00 && t->end - t->s > 6 &&
				    t->s[1] == '\\' && t->s[2] == 'u') {
					long lo = hex4(t->s + 3, t->end);
					if (lo >= 0xdc00 && lo < 0xe000) {
						u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
						t->s += 6;
					}
				}
				k = utf8_put((unsigned long)u, b);
				break;
			}
			default: b[0] = (unsigned char)*t->s; break;
			}
		}
		if (want)
			for (int i = 0; i < k; i++, n++)
				if (n >= wl || (unsigned char)want[n] != b[i])
					same = 0;
		t->s++;
	}
	if (t->s >= t->end)
		return -1;
	t->s++;
	if (eq)
		*eq = same && n == wl;
	return 0;
}

static int skip_value(scan_t *t)
{
	skip_ws(t);
	if (t->s >= t->end)
		return -1;
	char ch = *t->s;
	if (ch == '"')
		return skip_string(t, NULL, NULL);
	if (ch == '{' || ch == '[') {
		char close = ch == '{' ? '}' : ']';
		t->s++;
		skip_ws(t);
		if (t->s < t->end && *t->s == close) {
			t->s++;
			return 0;
		}
		for (;;) {
			if (ch == '{') {
				skip_ws(t);
				if (skip_string(t, NULL, NULL))
					return -1;
				skip_ws(t);
				if (t->s >= t->end || *t->s != ':')
					return -1;
				t->s++;
			}
			if (skip_value(t))
				return -1;
			skip_ws(t);
			if (t->s >= t->end)
				return -1;
			if (*t->s == ',') {
				t->s++;
				continue;
			}
			if (*t->s == close) {
				t->s++;
				return 0;
			}
			return -1;
		}
	}
	while (t->s < t->end && !strchr(",]} \t\r\n", *t->s))
		t->s++;
	return 0;
}

/* Returns a pointer to the value (or key) at comp[0..depth), or NULL. */
static const char *locate(const jctx_t *c, int depth, int at_key)
{
	scan_t t = {c->text, c->text + c->len};
	const char *key_pos = NULL;
	skip_ws(&t);
	for (int i = 0; i < depth && i < JP_MAX_DEPTH; i++) {
		const jp_comp_t *p = &c->comp[i];
		skip_ws(&t);
		if (t.s >= t.end)
			return NULL;
		if (p->key) {
			if (*t.s != '{')
				return NULL;
			t.s++;
			int found = 0;
			for (;;) {
				skip_ws(&t);
				if (t.s >= t.end || *t.s == '}')
					return NULL;
				int eq = 0;
				key_pos = t.s;
				if (skip_string(&t, p->key, &eq))
					return NULL;
				skip_ws(&t);
				if (t.s >= t.end || *t.s != ':')
					return NULL;
				t.s++;
				skip_ws(&t);
				if (eq) {
					found = 1;
					break;
				}
				if (skip_value(&t))
					return NULL;
				skip_ws(&t);
				if (t.s < t.end && *t.s == ',')
					t.s++;
			}
			if (!found)
				return NULL;
		} else {
			if (*t.s != '[')
				return NULL;
			t.s++;
			for (size_t k = 0; k < p->index; k++) {
				if (skip_value(&t))
					return NULL;
				skip_ws(&t);
				if (t.s >= t.end || *t.s != ',')
					return NULL;
				t.s++;
			}
			skip_ws(&t);
			key_pos = NULL;
		}
	}
	skip_ws(&t);
	if (at_key && depth > 0 && key_pos && c->comp[depth - 1].key)
		return key_pos;
	return t.s;
}

static void line_col(const jctx_t *c, const char *pos, int *line, int *col)
{
	*line = 1;
	*col = 1;
	for (const char *p = c->text; p < pos && p < c->text + c->len; p++) {
		if (*p == '\n') {
			(*line)++;
			*col = 1;
		} else if (((unsigned char)*p & 0xc0) != 0x80) {
			(*col)++;
		}
	}
}

/*
 * Copies s to out with control characters written as escapes, so a name
 * taken from the input cannot break the one-line error format.
 */
static void escape_controls(char *out, size_t cap, const char *s)
{
	size_t n = 0;
	for (; *s && n + 5 < cap; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '\n' || ch == '\t' || ch == '\r') {
			out[n++] = '\\';
			out[n++] = ch == '\n' ? 'n' : ch == '\t' ? 't' : 'r';
		} else if (ch < 0x20 || ch == 0x7f) {
			n += (size_t)snprintf(out + n, cap - n, "\\x%02x", ch);
		} else {
			out[n++] = (char)ch;
		}
	}
	out[n] = 0;
}

static int vjerr(jctx_t *c, int depth, int at_key, const char *fmt, va_list ap)
{
	char path[256], raw[512], msg[512];
	path_string(c, depth, raw, sizeof raw);
	escape_controls(path, sizeof path, raw);
	vsnprintf(raw, sizeof raw, fmt, ap);
	escape_controls(msg, sizeof msg, raw);
	int line = 0, col = 0;
	const char *pos = locate(c, depth, at_key);
	if (pos)
		line_col(c, pos, &line, &col);
	return sp_err_set(c->err, SP_EINPUT, c->file, line, col, path, "%s", msg);
}

int jerr(jctx_t *c, int at_key, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vjerr(c, c->depth, at_key, fmt, ap);
	va_end(ap);
	return rc;
}

int jerr_member(jctx_t *c, const char *key, int at_key, const char *fmt, ...)
{
	jp_push_key(c, key);
	va_list ap;
	va_start(ap, fmt);
	int rc = vjerr(c, c->depth, at_key, fmt, ap);
	va_end(ap);
	jp_pop(c);
	return rc;
}

static const char *type_word(json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "a value";
}

json_t *jparse(jctx_t *c)
{
	json_error_t je;
	memset(&je, 0, sizeof je);
	size_t k = 0;
	while (k < c->len && c->text[k] && strchr(" \t\r\n", c->text[k]))
		k++;
	if (k == c->len) {
		sp_err_set(c->err, SP_EINPUT, c->file, 0, 0, NULL,
			   "file is empty, expected a JSON object");
		return NULL;
	}
	json_t *root = json_loadb(c->text, c->len,
				  JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!root) {
		/* jansson leaves the text empty when its lexer cannot allocate */
		if (json_error_code(&je) == json_error_out_of_memory || je.text[0] == 0) {
			sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
			return NULL;
		}
		char text[sizeof je.text * 4];
		escape_controls(text, sizeof text, je.text);
		sp_err_set(c->err, SP_EINPUT, c->file, je.line, je.column, NULL,
			   "invalid JSON: %s", text);
		return NULL;
	}
	if (!json_is_object(root)) {
		jerr(c, 0, "expected a JSON object at the top level, got %s",
		     type_word(root));
		json_decref(root);
		return NULL;
	}
	return root;
}

int jcheck_object(jctx_t *c, json_t *obj, const char *what,
		  const char *const *allowed)
{
	if (!json_is_object(obj))
		return jerr(c, 0, "expected %s (an object), got %s", what, type_word(obj));
	const char *key;
	json_t *v;
	json_object_foreach(obj, key, v) {
		int ok = 0, n = 0;
		for (; allowed[n]; n++)
			if (strcmp(allowed[n], key) == 0)
				ok = 1;
		if (ok)
			continue;
		/* report the unknown key that comes first in the file */
		int rc = jerr_member(c, key, 1, "unknown key '%s' in %s", key, what);
		const char *near = sp_closest(key, allowed, n);
		if (near)
			sp_err_hint(c->err, "did you mean '%s'?", near);
		else {
			char list[200];
			size_t used = 0;
			list[0] = 0;
			for (int i = 0; i < n && used + 1 < sizeof list; i++) {
				int w = snprintf(list + used, sizeof list - used, "%s%s",
						 i ? ", " : "", allowed[i]);
				if (w < 0)
					break;
				used += (size_t)w;
			}
			sp_err_hint(c->err, "allowed keys: %s", list);
		}
		return rc;
	}
	return 0;
}

/* obj[key] in *v, NULL when absent; absent and required is an error. */
static int member(jctx_t *c, json_t *obj, const char *key, int required, json_t **v)
{
	*v = json_object_get(obj, key);
	if (!*v && required)
		return jerr(c, 0, "missing required key '%s'", key);
	return 0;
}

/* As member; present, it must be a string (kind 's') or a boolean ('b'). */
static int member_kind(jctx_t *c, json_t *obj, const char *key, int required, char kind,
		       json_t **v)
{
	int rc = member(c, obj, key, required, v);
	if (rc || !*v)
		return rc;
	if (kind == 's' && !json_is_string(*v))
		return jerr_member(c, key, 0, "expected a string, got %s", type_word(*v));
	if (kind == 'b' && !json_is_boolean(*v))
		return jerr_member(c, key, 0, "expected true or false, got %s",
				   type_word(*v));
	return 0;
}

int jget_int(jctx_t *c, json_t *obj, const char *key, int required,
	     int64_t lo, int64_t hi, int64_t *out)
{
	json_t *v;
	int rc = member(c, obj, key, required, &v);
	if (rc || !v)
		return rc;
	int64_t x;
	if (json_is_integer(v)) {
		x = json_integer_value(v);
	} else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
		   fabs(json_real_value(v)) < 9e15) {
		x = (int64_t)json_real_value(v);
	} else {
		return jerr_member(c, key, 0, "expected an integer, got %s", type_word(v));
	}
	if (x < lo || x > hi) {
		if (hi >= INT64_MAX / 2)
			return jerr_member(c, key, 0, "%lld is out of range (must be >= %lld)",
					   (long long)x, (long long)lo);
		return jerr_member(c, key, 0, "%lld is out of range [%lld, %lld]",
				   (long long)x, (long long)lo, (long long)hi);
	}
	*out = x;
	return 0;
}

/*
 * Formats x exactly (integers plainly, others with the fewest significant
 * digits that read back as x), so a bound like 0.999999999 is not printed
 * as 1 and a value just outside a bound is not printed as the bound.
 */
static void fmt_num(char *buf, size_t cap, double x)
{
	if (x == floor(x) && fabs(x) < 1e15) {
		snprintf(buf, cap, "%.0f", x);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			return;
	}
}

int jget_num(jctx_t *c, json_t *obj, const char *key, int required,
	     double lo, double hi, int lo_open, double *out)
{
	json_t *v;
	int rc = member(c, obj, key, required, &v);
	if (rc || !v)
		return rc;
	if (!json_is_number(v))
		return jerr_member(c, key, 0, "expected a number, got %s", type_word(v));
	double x = json_number_value(v);
	if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
		char xs[32], ls[32], hs[32];
		fmt_num(xs, sizeof xs, x);
		fmt_num(ls, sizeof ls, lo);
		fmt_num(hs, sizeof hs, hi);
		if (hi == HUGE_VAL)
			return jerr_member(c, key, 0, "%s is out of range (must be %s %s)", xs,
					   lo_open ? ">" : ">=", ls);
		return jerr_member(c, key, 0, "%s is out of range %s%s, %s]", xs,
				   lo_open ? "(" : "[", ls, hs);
	}
	*out = x;
	return 0;
}

int jget_bool(jctx_t *c, json_t *obj, const char *key, int required, int *out)
{
	json_t *v;
	int rc = member_kind(c, obj, key, required, 'b', &v);
	if (!rc && v)
		*out = json_is_true(v);
	return rc;
}

int jvalid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= 64)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			 (ch >= '0' && ch <= '9') || ch == '_' ||
			 (i > 0 && (ch == '-' || ch == '.'));
		if (!ok)
			return 0;
	}
	return 1;
}

int jget_name(jctx_t *c, json_t *obj, const char *key, int required,
	      char *out, size_t cap)
{
	json_t *v;
	int rc = member_kind(c, obj, key, required, 's', &v);
	if (rc || !v)
		return rc;
	const char *s = json_string_value(v);
	if (!jvalid_name(s)) {
		rc = jerr_member(c, key, 0, "invalid name '%.80s'", s);
		sp_err_hint(c->err, "names are 1-63 characters of letters, digits, '_', "
				    "and (after the first) '-' or '.'");
		return rc;
	}
	snprintf(out, cap, "%s", s);
	return 0;
}

int jget_enum(jctx_t *c, json_t *obj, const char *key, int required,
	      const char *const *choices, int n, int *out)
{
	json_t *v;
	int rc = member_kind(c, obj, key, required, 's', &v);
	if (rc || !v)
		return rc;
	const char *s = json_string_value(v);
	for (int i = 0; i < n; i++)
		if (strcmp(s, choices[i]) == 0) {
			*out = i;
			return 0;
		}
	rc = jerr_member(c, key, 0, "unknown value '%.80s'", s);
	const char *near = sp_closest(s, choices, n);
	if (near) {
		sp_err_hint(c->err, "did you mean '%s'?", near);
	} else {
		char list[200];
		size_t used = 0;
		list[0] = 0;
		for (int i = 0; i < n; i++) {
			int w = snprintf(list + used, sizeof list - used, "%s'%s'",
					 i ? ", " : "", choices[i]);
			if (w < 0 || (size_t)w >= sizeof list - used)
				break;
			used += (size_t)w;
		}
		sp_err_hint(c->err, "expected one of %s", list);
	}
	return rc;
}

/*
 * The schemas' pattern is "^<family>/<version>$": the version is written
 * as plain decimal digits without sign, spaces or leading zeros. Another
 * version number is "unsupported"; anything else is not our format.
 */
int jcheck_format(jctx_t *c, json_t *root, const char *family, int version)
{
	json_t *v = json_object_get(root, "format");
	if (!v) {
		int rc = jerr(c, 0, "missing required key 'format'");
		sp_err_hint(c->err, "add \"format\": \"%s/%d\"", family, version);
		return rc;
	}
	if (!json_is_string(v))
		return jerr_member(c, "format", 0, "expected a string, got %s", type_word(v));
	const char *s = json_string_value(v);
	size_t fl = strlen(family);
	if (strncmp(s, family, fl) == 0 && s[fl] == '/') {
		const char *d = s + fl + 1;
		size_t nd = strspn(d, "0123456789");
		if (nd > 0 && d[nd] == 0 && (d[0] != '0' || nd == 1)) {
			char want[24];
			snprintf(want, sizeof want, "%d", version);
			int cmp = nd != strlen(want) ? (nd > strlen(want) ? 1 : -1)
						     : strcmp(d, want);
			if (cmp == 0)
				return 0;
			int rc = jerr_member(c, "format", 0,
					     cmp > 0 ? "format '%.60s' is newer than this build"
						     : "unsupported format version '%.60s'",
					     s);
			sp_err_hint(c->err, "this build reads %s/%d", family, version);
			return rc;
		}
		int rc = jerr_member(c, "format", 0, "malformed format version '%.60s'", s);
		sp_err_hint(c->err, "expected \"format\": \"%s/%d\"", family, version);
		return rc;
	}
	int rc = jerr_member(c, "format", 0, "not a %s file (format '%.60s')", family, s);
	sp_err_hint(c->err, "expected \"format\": \"%s/%d\"", family, version);
	return rc;
}

/*
 * jansson's dumper ignores some failed appends (a key can go missing when
 * a buffer cannot grow), so the dump is read back and compared before it
 * is trusted. 0 means no hash could be made (out of memory).
 */
int jcanonical_hash(jctx_t *c, json_t *root, uint64_t *out)
{
	char *s = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_t *back = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
	*out = back && json_equal(back, root) ? sp_fnv1a(SP_FNV_INIT, s, strlen(s)) : 0;
	json_decref(back);
	free(s);
	/* the dump and the reload fail only when memory runs out */
	if (*out == 0)
		return sp_err_set(c->err, SP_ENOMEM, c->file, 0, 0, NULL, "out of memory");
	return 0;
}
