/*
 * fuzz_safetensors.c — libFuzzer target for the runtime's safetensors
 * reader (runtime/safetensors.c), the container of checkpoints
 * (ckpt_load.c), weights files (weights.c: --init) and dataset shards
 * (dataset.c). The input is read twice, from memory (st_in_mem, as a
 * checkpoint is) and from a file (st_in_open, as weights and shards are):
 * either both reject it with a message or both accept it. For an accepted
 * header every entry's st_in_info must answer, its bytes read back with
 * st_in_read, and an entry of one or two dimensions is read as floats
 * with st_in_get at its own shape (I32 refused with a message); both
 * reads must give the same bytes. ASan/UBSan and leak checks catch the
 * rest.
 */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What one read gave: every value read, appended. */
typedef struct {
	uint8_t *b;
	size_t n, cap;
} sink_t;

static void put(sink_t *s, const void *p, size_t n)
{
	if (!n)
		return;
	if (s->n + n > s->cap) {
		size_t cap = (s->n + n) * 2;
		uint8_t *nb = realloc(s->b, cap);
		if (!nb)
			abort();
		s->b = nb;
		s->cap = cap;
	}
	memcpy(s->b + s->n, p, n);
	s->n += n;
}

static void walk(st_in_t *in, sink_t *s)
{
	const char *key;
	json_t *e;
	json_object_foreach(in->hdr, key, e) {
		st_info_t ti;
		sp_err_t err = {0};
		if (!strcmp(key, "__metadata__"))
			continue;
		if (st_in_info(in, key, &ti, &err))
			abort(); /* a checked header has every entry */
		json_t *off = json_object_get(e, "data_offsets");
		size_t nb = (size_t)(json_integer_value(json_array_get(off, 1)) -
				     json_integer_value(json_array_get(off, 0)));
		uint8_t *raw = malloc(nb + 1);
		if (!raw)
			abort();
		if (st_in_read(in, &ti, 0, nb, raw, &err))
			abort();
		put(s, raw, nb);
		free(raw);
		if (ti.ndim < 1 || ti.ndim > 2)
			continue;
		layer_tensor_t t = {.name = key, .rows = ti.shape[0],
				    .cols = ti.ndim == 2 ? ti.shape[1] : 1};
		if (t.rows < 1 || t.cols < 1 || t.rows * t.cols > (1 << 20))
			continue;
		float *x = malloc(sizeof(float) * (size_t)(t.rows * t.cols));
		if (!x)
			abort();
		int rc = st_in_get(in, key, "model.name", &t, 0, x, &err);
		if (rc && (ti.dtype != ST_I32 || !err.msg[0]))
			abort();
		if (!rc)
			put(s, x, sizeof(float) * (size_t)(t.rows * t.cols));
		free(x);
	}
}

/* 0 accepted, else the error's code; *s gets what was read. */
static int read_mem(const uint8_t *data, size_t size, sink_t *s, sp_err_t *err)
{
	/* an exact-size copy: reads past the end are caught */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		abort();
	memcpy(buf, data, size);
	st_in_t in;
	int rc = st_in_mem(&in, "fuzz.safetensors", buf, size, err);
	if (!rc)
		walk(&in, s);
	st_in_release(&in);
	free(buf);
	return rc;
}

static int read_file(const uint8_t *data, size_t size, sink_t *s, sp_err_t *err)
{
	const char *dir = getenv("TMPDIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/fuzz-st-XXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	int rc = -1;
	if (write(fd, data, size) == (ssize_t)size) {
		st_in_t in;
		rc = st_in_open(&in, path, err);
		if (!rc)
			walk(&in, s);
		st_in_release(&in);
	}
	close(fd);
	unlink(path);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	sink_t a = {0}, b = {0};
	sp_err_t ea = {0}, eb = {0};
	int ra = read_mem(data, size, &a, &ea);
	int rb = read_file(data, size, &b, &eb);
	if (rb == -1) { /* the temporary file could not be written */
		free(a.b);
		return 0;
	}
	/* a rejection says why; both ways agree on the verdict, the message
	 * and what they read */
	if ((ra && !ea.msg[0]) || (rb && !eb.msg[0]) || !ra != !rb || strcmp(ea.msg, eb.msg) ||
	    a.n != b.n || (a.n && memcmp(a.b, b.b, a.n)))
		abort();
	free(a.b);
	free(b.b);
	return 0;
}
