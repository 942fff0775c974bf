/*
 * err.c — filling and printing sp_err_t (errors and warnings),
 * closest-name hints, JSON string output, and the two file helpers every
 * program needs (whole-file read, atomic write).
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sp_err_set(sp_err_t *e, int code, const char *file, int line, int col,
	       const char *path, const char *fmt, ...)
{
	if (!e || e->code)
		return e && e->code ? e->code : code;
	e->code = code;
	snprintf(e->file, sizeof e->file, "%s", file ? file : "");
	e->line = line;
	e->col = col;
	snprintf(e->path, sizeof e->path, "%s", path ? path : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	e->hint[0] = 0;
	return code;
}

void sp_err_hint(sp_err_t *e, const char *fmt, ...)
{
	if (!e)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->hint, sizeof e->hint, fmt, ap);
	va_end(ap);
}

static void print_labelled(FILE *f, const sp_err_t *e, const char *label)
{
	if (e->file[0]) {
		fputs(e->file, f);
		if (e->line > 0)
			fprintf(f, ":%d:%d", e->line, e->col);
		fputs(": ", f);
	}
	if (e->path[0])
		fprintf(f, "%s: ", e->path);
	fprintf(f, "%s%s\n", label, e->msg);
	if (e->hint[0])
		fprintf(f, "hint: %s\n", e->hint);
}

void sp_err_print(FILE *f, const sp_err_t *e)
{
	print_labelled(f, e, "");
}

void sp_warn_print(FILE *f, const sp_err_t *w)
{
	print_labelled(f, w, "warning: ");
}

void sp_err_warn(const sp_err_t *e, const sp_err_t *w)
{
	if (e && e->warn)
		e->warn(e->warn_ctx, w);
}

static int levenshtein(const char *a, const char *b)
{
	int la = (int)strlen(a), lb = (int)strlen(b);
	if (la > 64 || lb > 64)
		return 1 << 20;
	int row[65];
	for (int j = 0; j <= lb; j++)
		row[j] = j;
	for (int i = 1; i <= la; i++) {
		int prev = row[0];
		row[0] = i;
		for (int j = 1; j <= lb; j++) {
			int cur = row[j];
			int sub = prev + (a[i - 1] != b[j - 1]);
			int best = SP_MIN(row[j] + 1, row[j - 1] + 1);
			row[j] = SP_MIN(best, sub);
			prev = cur;
		}
	}
	return row[lb];
}

const char *sp_closest(const char *s, const char *const *names, int n)
{
	const char *best = NULL;
	int bd = 1 << 20;
	for (int i = 0; i < n; i++) {
		int d = levenshtein(s, names[i]);
		if (d < bd) {
			bd = d;
			best = names[i];
		}
	}
	/* close: at most a third of the word changed (and at least one edit allowed) */
	int len = (int)strlen(s);
	if (best && bd <= SP_MAX(1, len / 3))
		return best;
	return NULL;
}

void sp_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

int sp_read_file(char **out, size_t *out_len, const char *path, sp_err_t *err)
{
	*out = NULL;
	if (out_len)
		*out_len = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "cannot open file: %s", strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fclose(f);
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "is a directory, not a file");
	}
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap + 1);
	if (!buf) {
		fclose(f);
		return sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
	}
	for (;;) {
		if (n == cap) {
			if (cap > ((size_t)1 << 32)) {
				free(buf);
				fclose(f);
				return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
						  "file is larger than 4 GiB");
			}
			char *nb = realloc(buf, cap * 2 + 1);
			if (!nb) {
				free(buf);
				fclose(f);
				return sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL,
						  "out of memory");
			}
			buf = nb;
			cap *= 2;
		}
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		free(buf);
		return sp_err_set(err, SP_EIO, path, 0, 0, NULL, "read error");
	}
	buf[n] = 0;
	*out = buf;
	if (out_len)
		*out_len = n;
	return 0;
}

int sp_parse_file(void *out, sp_parse_fn parse, const char *path, sp_err_t *err)
{
	char *text;
	size_t len;
	int rc = sp_read_file(&text, &len, path, err);
	if (rc)
		return rc;
	rc = parse(out, text, len, path, err);
	free(text);
	return rc;
}

/* SP_EINPUT when path names no file: empty, or a directory */
static int output_named(const char *path, sp_err_t *err)
{
	struct stat st;
	size_t pl = strlen(path);
	if (!pl) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "the output file name is empty");
		sp_err_hint(err, "name the file to write");
		return SP_EINPUT;
	}
	/* the file is renamed onto path at the end: a directory there would
	 * fail only then */
	if (path[pl - 1] == '/' || (stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
		sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "cannot write here: is a directory");
		sp_err_hint(err, "name a file inside it");
		return SP_EINPUT;
	}
	return 0;
}

int sp_output_check(const char *path, sp_err_t *err)
{
	size_t pl = strlen(path);
	if (output_named(path, err))
		return SP_EINPUT;
	/* a file beside it can be made (the directory exists, is writable) */
	char *probe = malloc(pl + 32);
	if (!probe)
		return sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
	snprintf(probe, pl + 32, "%s.probe.%ld", path, (long)getpid());
	int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644), bad = fd < 0 ? errno : 0;
	if (fd >= 0) {
		close(fd);
		unlink(probe);
	}
	free(probe);
	if (bad) {
		sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "cannot write here: %s", strerror(bad));
		sp_err_hint(err, "check that the directory exists and is writable");
		return SP_EINPUT;
	}
	return 0;
}

int sp_write_atomic(const char *path, const void *data, size_t n, sp_err_t *err)
{
	if (output_named(path, err)) /* else the rename fails, after the write */
		return SP_EINPUT;
	size_t pl = strlen(path);
	char *tmp = malloc(pl + 32);
	if (!tmp)
		return sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
	snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
	int rc = 0;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "cannot write here: %s",
				strerror(errno));
		sp_err_hint(err, "check that the directory exists and is writable");
		goto cleanup;
	}
	const char *p = data;
	size_t left = n;
	while (left > 0) {
		ssize_t w = write(fd, p, left);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "write failed: %s",
					strerror(errno));
			break;
		}
		p += w;
		left -= (size_t)w;
	}
	if (!rc && fsync(fd) != 0 && errno != EINVAL)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "fsync failed: %s",
				strerror(errno));
	if (close(fd) != 0 && !rc)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "close failed: %s",
				strerror(errno));
	if (!rc && rename(tmp, path) != 0)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "cannot rename '%s': %s",
				tmp, strerror(errno));
cleanup:
	if (rc)
		unlink(tmp);
	free(tmp);
	return rc;
}
