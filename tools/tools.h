/*
 * tools.h — what spindle-show and spindle-diff share: loading a plan with
 * the reader's message, review rounding, compact device lists, JSON strings
 * and atomic output files (sections below), and the SVG Gantt (gantt.c).
 * Everything here trusts the plan: plan_read has checked every index.
 * Small helpers are static inline so each tool stays one file plus gantt.c.
 */
#ifndef SPINDLE_TOOLS_H
#define SPINDLE_TOOLS_H

#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---- rounding for review -------------------------------------------- */

/*
 * x with `prec` decimals, never "-0.00": float noise below the last digit
 * must not show up in a diff. printf without setlocale is the "C" locale.
 */
static inline const char *tl_num(char *buf, size_t cap, double x, int prec)
{
	snprintf(buf, cap, "%.*f", prec, x);
	if (buf[0] == '-' && strspn(buf + 1, "0.") == strlen(buf + 1))
		memmove(buf, buf + 1, strlen(buf));
	return buf;
}

/* Round x to `prec` decimals as a number (for comparing what is shown). */
static inline double tl_round(double x, int prec)
{
	char b[64];
	return strtod(tl_num(b, sizeof b, x, prec), NULL);
}

/*
 * Several numbers in one printf: each tl_fmt call formats into the next of
 * TL_RING buffers (calls are sequenced, unlike i++ in arguments).
 */
#define TL_RING 32
typedef struct {
	char b[TL_RING][40];
	int i;
} tl_ring_t;

static inline const char *tl_fmt(tl_ring_t *r, double x, int prec)
{
	char *s = r->b[r->i++ % TL_RING];
	return tl_num(s, sizeof r->b[0], x, prec);
}

/* ---- device lists ----------------------------------------------------- */

/* "0-7,12": runs of consecutive ascending devices, in the order given. */
static inline void tl_devlist(char *buf, size_t cap, const int32_t *dev, int n)
{
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; i < n && o + 24 < cap; i++) {
		int j = i;
		while (j + 1 < n && dev[j + 1] == dev[j] + 1)
			j++;
		o += (size_t)snprintf(buf + o, cap - o, i == j ? "%s%d" : "%s%d-%d", i ? "," : "",
				      dev[i], dev[j]);
		i = j;
	}
	if (o + 24 >= cap && cap > 4)
		strcpy(buf + cap - 4, "...");
}

/* ---- cross-attention memories ----------------------------------------- */

/* The MetaOp whose output is decoder m's memory act(m, -1) (the src of its
 * memory edge), or -1 when m has no memory. */
static inline int tl_memory_src(const sp_plan_t *p, int m)
{
	if (p->metaops[m].shape.mem_seq == 0)
		return -1;
	for (int e = 0; e < p->n_edges; e++)
		if (p->edges[e].memory && p->edges[e].dst == m)
			return p->edges[e].src;
	return -1;
}

/* "mem 257 x 1024 from task/enc" for a decoder MetaOp, "" otherwise. */
static inline void tl_memory_str(char *buf, size_t cap, const sp_plan_t *p, int m)
{
	const sp_metaop_t *mo = &p->metaops[m];
	int src = tl_memory_src(p, m);
	buf[0] = 0;
	if (mo->shape.mem_seq > 0)
		snprintf(buf, cap, "mem %lld x %lld from %s", (long long)mo->shape.mem_seq,
			 (long long)mo->shape.mem_width, src >= 0 ? p->metaops[src].name : "?");
}

/* A value's layer boundary as text: the number, or "mem" for a decoder's
 * memory (layer -1). */
static inline const char *tl_layer_str(char *buf, size_t cap, int layer)
{
	if (layer < 0)
		snprintf(buf, cap, "mem");
	else
		snprintf(buf, cap, "%d", layer);
	return buf;
}

/* ---- output files ----------------------------------------------------- */

/*
 * Output is built in memory (open_memstream) and written with
 * sp_write_atomic, so a reader never sees half a file and a failed run
 * leaves nothing behind.
 */
typedef struct {
	FILE *f;
	char *buf;
	size_t len;
} tl_out_t;

static inline int tl_out_open(tl_out_t *o)
{
	o->buf = NULL;
	o->len = 0;
	o->f = open_memstream(&o->buf, &o->len);
	return o->f ? 0 : SP_ENOMEM;
}

/* Closes the stream and writes it to path; frees the buffer either way. */
static inline int tl_out_commit(tl_out_t *o, const char *path, sp_err_t *err)
{
	int rc = 0;
	if (o->f) {
		int bad = ferror(o->f);
		if (fclose(o->f) != 0 || bad)
			rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
	}
	o->f = NULL;
	if (!rc)
		rc = sp_write_atomic(path, o->buf, o->len, err);
	free(o->buf);
	o->buf = NULL;
	return rc;
}

/* ---- loading ---------------------------------------------------------- */

/* plan_read, printing the reader's message as "tool: file: what" on failure. */
static inline int tl_load(sp_plan_t *out, const char *tool, const char *path)
{
	sp_err_t err = {0};
	if (plan_read(out, path, &err) == 0)
		return 0;
	fprintf(stderr, "%s: ", tool);
	sp_err_print(stderr, &err);
	return err.code == SP_ENOMEM ? SP_EXIT_FAIL : SP_EXIT_INPUT;
}

/* ---- gantt.c ---------------------------------------------------------- */

/*
 * The predicted timeline per device, which the Gantt and the trace draw:
 * compute bars (a slice's forward, or loss, or backward on one device) and
 * the all-reduces of the sync buckets. The plan stores each slice's times
 * as an envelope over its devices; tl_timeline estimates each device's part
 * inside it from the programs (see gantt.c), so that a device's bars never
 * overlap. Both arrays are sorted by device, then start; times in ms.
 */
typedef struct {
	int32_t dev, slice, bwd;
	double t0, dur;
} tl_bar_t;

typedef struct {
	int32_t dev, bucket;
	double t0, dur;
} tl_sync_t;

typedef struct {
	tl_bar_t *bars;
	int n_bars;
	tl_sync_t *syncs;
	int n_syncs;
} tl_timeline_t;

/* Fills *out (owned by the caller: tl_timeline_release); SP_ENOMEM on failure. */
int tl_timeline(tl_timeline_t *out, const sp_plan_t *p);
void tl_timeline_release(tl_timeline_t *t);

/*
 * SVG Gantt chart of the predicted schedule: a row per device, forward and
 * backward bars coloured by task, slice labels where they fit, wave
 * boundaries, a time axis in ms, a legend and a title.
 */
int gantt_svg(FILE *f, const sp_plan_t *p);

#endif
