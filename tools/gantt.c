/*
 * gantt.c — the predicted schedule as an SVG Gantt chart (spindle-show
 * --gantt), and the per-device timeline it draws, which the predicted trace
 * shares (tl_timeline).
 *
 * The chart: a row per device grouped by node; each slice's forward (solid)
 * and backward (hatched) bar in its task's colour, one rectangle per run of
 * consecutive devices, labelled with the MetaOp's node and layers where the
 * label fits; gradient all-reduces as thin strips; faint lines where waves
 * begin; a time axis in ms, the iteration's end, a legend of tasks, and a
 * title with the model, cluster, algorithm and predicted time.
 *
 * Plain SVG 1.1, no script, no external fonts or files; deterministic (same
 * plan, same bytes). It draws what the plan predicts and nothing else.
 */
#include "tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/*
 * Colour-blind-safe palettes: Okabe & Ito (2008) without black for up to 7
 * tasks, else Paul Tol's "muted" scheme; beyond 9 tasks colours repeat.
 */
static const char *const OKABE_ITO[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
					"#56B4E9", "#D55E00", "#F0E442"};
static const char *const TOL_MUTED[] = {"#332288", "#88CCEE", "#44AA99", "#117733", "#999933",
					"#DDCC77", "#CC6677", "#882255", "#AA4499"};

#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"
#define CHAR_W 0.6 /* average glyph width per px of font size */

typedef struct {
	double W, H;
	double x0, x1; /* chart area, horizontally */
	double y0;     /* top of the first row */
	double row_h;
	double t_max; /* ms at x1 */
	int n_rows;
} layout_t;

static const char *task_colour(const sp_plan_t *p, int t)
{
	if (p->model.n_tasks <= SP_ARRAY_LEN(OKABE_ITO))
		return OKABE_ITO[t];
	return TOL_MUTED[t % SP_ARRAY_LEN(TOL_MUTED)];
}

/* Relative luminance of "#rrggbb" (sRGB, WCAG), to pick the label colour. */
static double luminance(const char *hex)
{
	double c[3];
	for (int i = 0; i < 3; i++) {
		unsigned v = 0;
		sscanf(hex + 1 + 2 * i, "%2x", &v);
		double s = v / 255.0;
		c[i] = s <= 0.03928 ? s / 12.92 : pow((s + 0.055) / 1.055, 2.4);
	}
	return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*s, f); break;
		}
	}
}

static double xt(const layout_t *L, double ms)
{
	return L->x0 + (L->x1 - L->x0) * (L->t_max > 0 ? ms / L->t_max : 0);
}

/* A tick step of 1, 2 or 5 times a power of ten giving at most ~max ticks. */
static double nice_step(double span, int max)
{
	if (!(span > 0))
		return 1;
	double raw = span / max, p10 = pow(10, floor(log10(raw)));
	double m = raw / p10;
	return p10 * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

static double text_w(const char *s, double size)
{
	return (double)strlen(s) * size * CHAR_W;
}

static int cmp_bar_dev(const void *a, const void *b)
{
	const tl_bar_t *x = a, *y = b;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->t0 != y->t0)
		return x->t0 < y->t0 ? -1 : 1;
	if (x->slice != y->slice)
		return x->slice < y->slice ? -1 : 1;
	return x->bwd - y->bwd;
}

/*
 * A slice's times in the plan are envelopes: its first device's start to
 * its last device's end. What each device does inside it is estimated from
 * the programs: device d runs its compute items (slice, fwd|bwd) in program
 * order, starting an item at t_d = max(envelope start, end of its previous
 * item). Devices of one slice do equal work (their sample ranges differ by
 * at most one), so one duration D serves all of them, and the last to start
 * ends with the envelope: D = envelope end - max_d t_d. An item is placed
 * when every device of it has placed what comes before it; if programs
 * were to wait on each other in a cycle, the earliest item some device
 * waits at is placed for the devices at it.
 */
static int place_bars(tl_bar_t **out, int *n_out, const sp_plan_t *p)
{
	int N = p->n_devices, S2 = 2 * p->n_slices, rc = 0, nb = 0;
	int *first = calloc((size_t)N + 1, sizeof *first);
	int *item = malloc(sizeof *item * (size_t)(p->n_ins + 1));
	int *ptr = calloc((size_t)N + 1, sizeof *ptr);
	int *left = calloc((size_t)S2 + 1, sizeof *left); /* devices still to place it */
	int *at = calloc((size_t)S2 + 1, sizeof *at);     /* devices waiting at it */
	int *stamp = calloc((size_t)S2 + 1, sizeof *stamp);
	double *end = calloc((size_t)N + 1, sizeof *end);
	double *dur = malloc(sizeof *dur * (size_t)(S2 + 1));
	tl_bar_t *b = malloc(sizeof *b * (size_t)(p->n_ins + 1));
	*out = NULL;
	*n_out = 0;
	if (!first || !item || !ptr || !left || !at || !stamp || !end || !dur || !b) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	int n = 0;
	for (int d = 0; d < N; d++) {
		const sp_device_t *x = &p->devices[d];
		first[d] = ptr[d] = n;
		for (int k = 0; k < x->n_ins; k++) {
			const sp_ins_t *in = &p->ins[x->first_ins + k];
			if (in->op != INS_FWD && in->op != INS_BWD && in->op != INS_LOSS)
				continue;
			int node = 2 * in->slice + (in->op == INS_BWD);
			if (stamp[node] == d + 1)
				continue; /* one item per slice and pass, at its first instruction */
			stamp[node] = d + 1;
			item[n++] = node;
			left[node]++;
		}
		if (ptr[d] < n)
			at[item[ptr[d]]]++;
	}
	first[N] = n;
	for (int i = 0; i < S2; i++)
		dur[i] = -1;
	for (int placed = 0; placed < n;) {
		int progress = 0, force = -1;
		for (int node = 0; node < S2; node++) {
			if (!at[node])
				continue;
			const sp_slice_t *s = &p->slices[node / 2];
			double e0 = node % 2 ? s->bwd_start_ms : s->start_ms;
			double e1 = e0 + (node % 2 ? s->bwd_ms : s->fwd_ms);
			if (at[node] < left[node]) {
				double fs = force < 0 ? 0
						      : force % 2 ? p->slices[force / 2].bwd_start_ms
								  : p->slices[force / 2].start_ms;
				if (force < 0 || e0 < fs)
					force = node;
				continue;
			}
			/* every remaining device of it is there: place it */
			double tmax = e0;
			for (int k = 0; k < s->n_dev; k++) {
				int d = p->slice_devs[s->dev_off + k];
				if (ptr[d] < first[d + 1] && item[ptr[d]] == node)
					tmax = fmax(tmax, fmax(e0, end[d]));
			}
			if (dur[node] < 0)
				dur[node] = fmin(fmax(0, e1 - tmax), e1 - e0);
			for (int k = 0; k < s->n_dev; k++) {
				int d = p->slice_devs[s->dev_off + k];
				if (ptr[d] >= first[d + 1] || item[ptr[d]] != node)
					continue;
				double t = fmax(e0, end[d]);
				b[nb++] = (tl_bar_t){d, node / 2, node % 2, t, dur[node]};
				end[d] = t + dur[node];
				at[node]--;
				left[node]--;
				placed++;
				if (++ptr[d] < first[d + 1])
					at[item[ptr[d]]]++;
			}
			progress = 1;
		}
		if (!progress && force >= 0)
			left[force] = at[force]; /* a cycle: place it where it is waited for */
		else if (!progress)
			break; /* cannot happen: some device always waits at an item */
	}
	qsort(b, (size_t)nb, sizeof *b, cmp_bar_dev);
	int m = 0;
	for (int i = 0; i < nb; i++) {
		if (i + 1 < nb && b[i + 1].dev == b[i].dev && b[i].t0 + b[i].dur > b[i + 1].t0)
			b[i].dur = b[i + 1].t0 - b[i].t0;
		if (b[i].dur > 0)
			b[m++] = b[i];
	}
	*out = b;
	*n_out = m;
	b = NULL;
cleanup:
	free(first);
	free(item);
	free(ptr);
	free(left);
	free(at);
	free(stamp);
	free(end);
	free(dur);
	free(b);
	return rc;
}

static const double *sort_issue; /* qsort has no context argument */

static int cmp_issue(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	if (sort_issue[x] != sort_issue[y])
		return sort_issue[x] < sort_issue[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int cmp_sync(const void *a, const void *b)
{
	const tl_sync_t *x = a, *y = b;
	int c = (x->dev > y->dev) - (x->dev < y->dev);
	if (!c)
		c = (x->t0 > y->t0) - (x->t0 < y->t0);
	return c ? c : (x->bucket > y->bucket) - (x->bucket < y->bucket);
}

/*
 * Syncs, by the simulator's rule (planner/sim.c, planner/fluid.c): a device
 * issues a bucket's all-reduce (its SYNC instruction) when the compute
 * item before it in its program ends; the all-reduce is ready when its
 * last member issued it, and starts once none of its members is in
 * another (a device runs them one at a time, in the order they became
 * ready; ties: the lower bucket first), on all its members at once. Each
 * is drawn for the bucket's sync_ms, its price alone: the plan does not
 * hold the cluster's links, so the stretch from sharing them with
 * transfers and other all-reduces (which the simulator adds) is not drawn.
 */
static int place_syncs(tl_timeline_t *t, const sp_plan_t *p)
{
	int rc = 0, N = p->n_devices;
	double *issue = calloc((size_t)p->n_buckets + 1, sizeof *issue);
	double *free_at = calloc((size_t)N + 1, sizeof *free_at);
	int *bfirst = calloc((size_t)N + 1, sizeof *bfirst); /* bars of device d */
	int *order = malloc(sizeof *order * (size_t)(p->n_buckets + 1));
	t->syncs = malloc(sizeof *t->syncs * (size_t)(p->n_bucket_devs + 1));
	t->n_syncs = 0;
	if (!issue || !free_at || !bfirst || !order || !t->syncs) {
		rc = SP_ENOMEM;
		goto cleanup;
	}
	for (int i = 0, d = 0; d <= N; d++) {
		while (i < t->n_bars && t->bars[i].dev < d)
			i++;
		bfirst[d] = i;
	}
	for (int d = 0; d < N; d++) {
		const sp_device_t *x = &p->devices[d];
		double last = 0;
		for (int k = 0; k < x->n_ins; k++) {
			const sp_ins_t *in = &p->ins[x->first_ins + k];
			if (in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS) {
				int bwd = in->op == INS_BWD;
				for (int i = bfirst[d]; i < bfirst[d + 1]; i++)
					if (t->bars[i].slice == in->slice && t->bars[i].bwd == bwd)
						last = fmax(last, t->bars[i].t0 + t->bars[i].dur);
			} else if (in->op == INS_SYNC) {
				issue[in->peer] = fmax(issue[in->peer], last);
			}
		}
	}
	for (int b = 0; b < p->n_buckets; b++)
		order[b] = b;
	sort_issue = issue;
	qsort(order, (size_t)p->n_buckets, sizeof *order, cmp_issue);
	for (int k = 0; k < p->n_buckets; k++) {
		const sp_bucket_t *bk = &p->buckets[order[k]];
		const int32_t *devs = p->bucket_devs + bk->dev_off;
		double t0 = issue[order[k]];
		for (int i = 0; i < bk->n_dev; i++)
			t0 = fmax(t0, free_at[devs[i]]);
		for (int i = 0; i < bk->n_dev; i++) {
			t->syncs[t->n_syncs++] = (tl_sync_t){devs[i], order[k], t0, bk->sync_ms};
			free_at[devs[i]] = t0 + bk->sync_ms;
		}
	}
	qsort(t->syncs, (size_t)t->n_syncs, sizeof *t->syncs, cmp_sync);
cleanup:
	free(issue);
	free(free_at);
	free(bfirst);
	free(order);
	return rc;
}

int tl_timeline(tl_timeline_t *out, const sp_plan_t *p)
{
	memset(out, 0, sizeof *out);
	int rc = place_bars(&out->bars, &out->n_bars, p);
	if (!rc)
		rc = place_syncs(out, p);
	if (rc)
		tl_timeline_release(out);
	return rc;
}

void tl_timeline_release(tl_timeline_t *t)
{
	if (!t)
		return;
	free(t->bars);
	free(t->syncs);
	memset(t, 0, sizeof *t);
}

/* Height of the sync strip along the bottom of a row. */
static double strip_h(const layout_t *L)
{
	return fmax(1.5, fmin(4, L->row_h * 0.18));
}

/* Where bar b on devices [d0, d1] (consecutive rows) is drawn. */
static void bar_box(const layout_t *L, const tl_bar_t *b, int d0, int d1, double box[4])
{
	double gap = L->row_h >= 8 ? 1.5 : 0.5;
	box[0] = xt(L, b->t0);
	box[2] = fmax(0.6, xt(L, b->t0 + b->dur) - box[0]);
	box[1] = L->y0 + d0 * L->row_h + gap / 2;
	box[3] = (d1 - d0 + 1) * L->row_h - gap;
}

static void bar_rect(FILE *f, const layout_t *L, const sp_plan_t *p, const tl_bar_t *b, int d0,
		     int d1)
{
	const sp_slice_t *s = &p->slices[b->slice];
	const sp_metaop_t *m = &p->metaops[s->metaop];
	double r[4];
	bar_box(L, b, d0, d1, r);
	fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"",
		r[0], r[1], r[2], r[3], task_colour(p, m->task));
	if (b->bwd)
		fprintf(f, " fill-opacity=\"0.5\"");
	fprintf(f, "><title>");
	xml_text(f, m->name);
	fprintf(f, " layers %d-%d %s on %d", s->layer_from, s->layer_to,
		b->bwd ? "backward" : "forward", d0);
	if (d1 > d0)
		fprintf(f, "-%d", d1);
	char mem[2 * SP_NAME_MAX + 64];
	tl_memory_str(mem, sizeof mem, p, s->metaop);
	if (mem[0]) {
		fprintf(f, ", ");
		xml_text(f, mem);
	}
	fprintf(f, ": %.2f +%.2f ms</title></rect>\n", b->t0, b->dur);
	if (b->bwd)
		fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
			   "fill=\"url(#hatch)\"/>\n",
			r[0], r[1], r[2], r[3]);
}

/* "img 0-6" centred on the bar, else "img", else nothing. */
static void bar_label(FILE *f, const layout_t *L, const sp_plan_t *p, const tl_bar_t *b, int d0,
		      int d1)
{
	const sp_slice_t *s = &p->slices[b->slice];
	const sp_metaop_t *m = &p->metaops[s->metaop];
	double r[4];
	bar_box(L, b, d0, d1, r);
	/* in the middle row, clear of its sync strip */
	double fs = fmin(11, fmax(7, L->row_h * 0.6));
	if (L->row_h - strip_h(L) < fs || r[2] < 22)
		return;
	const char *node = strrchr(m->name, '/');
	node = node ? node + 1 : m->name;
	char lab[2 * SP_NAME_MAX + 32];
	snprintf(lab, sizeof lab, "%s %d-%d", node, s->layer_from, s->layer_to);
	if (text_w(lab, fs) + 6 > r[2])
		snprintf(lab, sizeof lab, "%s", node);
	if (text_w(lab, fs) + 6 > r[2])
		return;
	/* backward bars are the colour at half strength on white */
	double lum = luminance(task_colour(p, m->task));
	if (b->bwd)
		lum = 0.5 * lum + 0.5;
	fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"middle\" "
		   "dominant-baseline=\"central\" fill=\"%s\">",
		r[0] + r[2] / 2, L->y0 + ((d0 + d1) / 2 + 0.5) * L->row_h - (strip_h(L) + 1) / 2, fs,
		lum > 0.36 ? "#1b1b1b" : "#ffffff");
	xml_text(f, lab);
	fprintf(f, "</text>\n");
}

static int cmp_bar_slice(const void *a, const void *b)
{
	const tl_bar_t *x = a, *y = b;
	if (x->bwd != y->bwd)
		return x->bwd - y->bwd;
	if (x->slice != y->slice)
		return x->slice < y->slice ? -1 : 1;
	return x->dev < y->dev ? -1 : x->dev > y->dev;
}

/*
 * Bars of one slice on consecutive devices of one node, equal in time, as
 * one rectangle; labels in a second pass, above the sync strips.
 */
static int slice_bars(FILE *f, const layout_t *L, const sp_plan_t *p, const tl_timeline_t *t,
		      int label)
{
	int n = t->n_bars;
	tl_bar_t *b = malloc(sizeof *b * (size_t)(n + 1));
	if (!b)
		return SP_ENOMEM;
	memcpy(b, t->bars, sizeof *b * (size_t)n);
	qsort(b, (size_t)n, sizeof *b, cmp_bar_slice);
	for (int i = 0; i < n; i++) {
		if (i == 0 || b[i].bwd != b[i - 1].bwd) {
			if (label)
				fprintf(f, "%s<g id=\"%s-labels\">\n", i ? "</g>\n" : "",
					b[i].bwd ? "backward" : "forward");
			else
				fprintf(f, "%s<g id=\"%s\" stroke=\"#ffffff\" "
					   "stroke-width=\"0.7\">\n",
					i ? "</g>\n" : "", b[i].bwd ? "backward" : "forward");
		}
		int j = i;
		while (j + 1 < n && b[j + 1].bwd == b[i].bwd && b[j + 1].slice == b[i].slice &&
		       b[j + 1].dev == b[j].dev + 1 &&
		       p->devices[b[j + 1].dev].node == p->devices[b[j].dev].node &&
		       b[j + 1].t0 == b[i].t0 && b[j + 1].dur == b[i].dur)
			j++;
		(label ? bar_label : bar_rect)(f, L, p, &b[i], b[i].dev, b[j].dev);
		i = j;
	}
	if (n)
		fprintf(f, "</g>\n");
	free(b);
	return 0;
}

/* All-reduces: a thin dark strip along the bottom of the device's row. */
static void sync_bars(FILE *f, const layout_t *L, const tl_timeline_t *t)
{
	double h = strip_h(L);
	fprintf(f, "<g id=\"sync\" fill=\"#1b1b1b\" fill-opacity=\"0.8\">\n");
	for (int i = 0; i < t->n_syncs; i++) {
		const tl_sync_t *y = &t->syncs[i];
		if (!(y->dur > 0))
			continue;
		double x = xt(L, y->t0), w = fmax(0.6, xt(L, y->t0 + y->dur) - x);
		fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\">"
			   "<title>sync bucket %d on %d: %.2f +%.2f ms</title></rect>\n",
			x, L->y0 + (y->dev + 1) * L->row_h - h - 1, w, h, y->bucket, y->dev, y->t0,
			y->dur);
	}
	fprintf(f, "</g>\n");
}

static void title(FILE *f, const layout_t *L, const sp_plan_t *p)
{
	const sp_cert_t *c = &p->cert;
	double seq = 0;
	for (int a = 0; a < p->n_algos; a++)
		if (!strcmp(p->algos[a].name, "sequential"))
			seq = p->algos[a].iteration_ms;
	fprintf(f, "<text x=\"%.1f\" y=\"28\" font-size=\"17\" font-weight=\"bold\" "
		   "fill=\"#1b1b1b\">",
		L->x0);
	xml_text(f, p->model.name);
	fprintf(f, " on ");
	xml_text(f, p->cluster_name);
	fprintf(f, " \xc2\xb7 ");
	xml_text(f, p->algo);
	fprintf(f, " plan \xc2\xb7 %.2f ms per iteration (predicted)</text>\n", c->iteration_ms);
	fprintf(f, "<text x=\"%.1f\" y=\"48\" font-size=\"12\" fill=\"#555555\">%d \xc3\x97 ",
		L->x0, p->n_devices);
	xml_text(f, p->gpu_name);
	fprintf(f, " \xc2\xb7 compute %.2f ms \xc2\xb7 lower bound %.2f ms (gap %.1f%%)", c->compute_ms,
		c->lower_bound_ms, 100 * c->gap);
	if (seq > 0 && strcmp(p->algo, "sequential") && c->iteration_ms > 0)
		fprintf(f, " \xc2\xb7 sequential %.2f ms (%.2f\xc3\x97 faster)", seq,
			seq / c->iteration_ms);
	fprintf(f, " \xc2\xb7 %d waves</text>\n", p->n_waves);
}

static void axis(FILE *f, const layout_t *L, const sp_plan_t *p)
{
	double yb = L->y0 + L->n_rows * L->row_h;
	double step = nice_step(L->t_max, (int)fmax(2, (L->x1 - L->x0) / 90));
	fprintf(f, "<g font-size=\"11\" fill=\"#444444\" text-anchor=\"middle\">\n");
	for (double t = 0; t <= L->t_max * (1 + 1e-9); t += step) {
		double x = xt(L, t);
		fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#eeeeee\"/>\n",
			x, L->y0, x, yb);
		fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#888888\"/>\n",
			x, yb, x, yb + 5);
		fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">%g</text>\n", x, yb + 18, t);
	}
	fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#888888\"/>\n",
		L->x0, yb, L->x1, yb);
	fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">time (ms)</text>\n</g>\n", (L->x0 + L->x1) / 2,
		yb + 34);
	/* devices: "gpu k" per row, "node n" per group, separators between nodes */
	double fs = fmin(11, L->row_h * 0.75);
	int every = L->row_h >= 9 ? 1 : (int)ceil(9 / L->row_h);
	fprintf(f, "<g font-size=\"%.1f\" fill=\"#444444\" text-anchor=\"end\" "
		   "dominant-baseline=\"central\">\n",
		fmax(fs, 7));
	for (int d = 0; d < L->n_rows; d += every)
		fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">gpu %d</text>\n", L->x0 - 6,
			L->y0 + (d + 0.5) * L->row_h, d);
	fprintf(f, "</g>\n");
	/* a band per run of devices on one machine */
	for (int d0 = 0, d1; d0 < L->n_rows; d0 = d1) {
		int node = p->devices[d0].node;
		for (d1 = d0 + 1; d1 < L->n_rows && p->devices[d1].node == node; d1++)
			;
		double ya = L->y0 + d0 * L->row_h, yz = L->y0 + d1 * L->row_h;
		if (d0 > 0)
			fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
				   "stroke=\"#999999\" stroke-width=\"1\"/>\n",
				14.0, ya, L->x1, ya);
		if (yz - ya < 40)
			continue; /* too thin a band to name */
		fprintf(f, "<text x=\"18\" y=\"%.2f\" font-size=\"11\" fill=\"#444444\" "
			   "text-anchor=\"middle\" transform=\"rotate(-90 18 %.2f)\">node %d</text>\n",
			(ya + yz) / 2, (ya + yz) / 2, node);
	}
}

typedef struct {
	double x;
	int wave;
} mark_t;

static int cmp_mark(const void *a, const void *b)
{
	const mark_t *x = a, *y = b;
	if (x->x != y->x)
		return x->x < y->x ? -1 : 1;
	return x->wave - y->wave;
}

/* Faint lines where waves begin (forward and backward); "w3" where there is room. */
static int waves(FILE *f, const layout_t *L, const sp_plan_t *p)
{
	double yb = L->y0 + L->n_rows * L->row_h;
	mark_t *m = malloc(sizeof *m * (size_t)(2 * p->n_waves + 1));
	if (!m)
		return SP_ENOMEM;
	for (int w = 0; w < p->n_waves; w++) {
		m[2 * w] = (mark_t){xt(L, p->waves[w].start_ms), w};
		m[2 * w + 1] = (mark_t){xt(L, p->waves[w].bwd_start_ms), w};
	}
	qsort(m, (size_t)(2 * p->n_waves), sizeof *m, cmp_mark);
	double free_x = -1e9;
	fprintf(f, "<g id=\"waves\" font-size=\"9\" fill=\"#777777\">\n");
	for (int i = 0; i < 2 * p->n_waves; i++) {
		fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
			   "stroke=\"#000000\" stroke-opacity=\"0.16\" stroke-dasharray=\"3 3\"/>\n",
			m[i].x, L->y0 - 4, m[i].x, yb);
		char lab[16];
		snprintf(lab, sizeof lab, "w%d", m[i].wave);
		if (m[i].x >= free_x) {
			fprintf(f, "<text x=\"%.2f\" y=\"%.2f\">%s</text>\n", m[i].x + 1.5,
				L->y0 - 6, lab);
			free_x = m[i].x + text_w(lab, 9) + 5;
		}
	}
	fprintf(f, "</g>\n");
	free(m);
	return 0;
}

static void iteration_end(FILE *f, const layout_t *L, const sp_plan_t *p)
{
	double yb = L->y0 + L->n_rows * L->row_h;
	double xi = xt(L, p->cert.iteration_ms);
	fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#1b1b1b\" "
		   "stroke-width=\"1.2\"/>\n",
		xi, L->y0 - 18, xi, yb);
	fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"10\" fill=\"#1b1b1b\" "
		   "text-anchor=\"end\">iteration %.2f ms</text>\n",
		xi - 3, L->y0 - 20, p->cert.iteration_ms);
}

/* Legend, flowing left to right, wrapping at the chart's width; returns its height. */
static double legend(FILE *f, const layout_t *L, const sp_plan_t *p, double y, int draw)
{
	static const char *const extra[] = {"forward", "backward", "gradient all-reduce",
					    "wave start"};
	int nt = p->model.n_tasks;
	double x = L->x0, row = 20, h = row;
	for (int i = 0; i < nt + SP_ARRAY_LEN(extra); i++) {
		const char *name = i < nt ? p->model.tasks[i].name : extra[i - nt];
		double w = 18 + text_w(name, 11) + 18;
		if (i == nt)
			w += 12; /* a little space between tasks and the rest */
		if (x + w > L->x1 && x > L->x0) {
			x = L->x0;
			y += row;
			h += row;
		}
		if (i == nt)
			x += 12;
		if (!draw) {
			x += w - (i == nt ? 12 : 0);
			continue;
		}
		switch (i - nt) {
		case 0:
			fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"13\" height=\"11\" "
				   "fill=\"#666666\"/>\n",
				x, y - 9);
			break;
		case 1:
			fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"13\" height=\"11\" "
				   "fill=\"#666666\" fill-opacity=\"0.5\"/>"
				   "<rect x=\"%.2f\" y=\"%.2f\" width=\"13\" height=\"11\" "
				   "fill=\"url(#hatch)\"/>\n",
				x, y - 9, x, y - 9);
			break;
		case 2:
			fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"13\" height=\"3\" "
				   "fill=\"#1b1b1b\" fill-opacity=\"0.8\"/>\n",
				x, y - 1);
			break;
		case 3:
			fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
				   "stroke=\"#000000\" stroke-opacity=\"0.35\" "
				   "stroke-dasharray=\"3 3\"/>\n",
				x + 6.5, y - 10, x + 6.5, y + 3);
			break;
		default:
			fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"13\" height=\"11\" "
				   "fill=\"%s\"/>\n",
				x, y - 9, task_colour(p, i));
			break;
		}
		fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"11\" fill=\"#1b1b1b\">",
			x + 18, y);
		xml_text(f, name);
		fprintf(f, "</text>\n");
		x += w - (i == nt ? 12 : 0);
	}
	return h;
}

int gantt_svg(FILE *f, const sp_plan_t *p)
{
	layout_t L = {0};
	L.n_rows = p->n_devices;
	L.row_h = fmin(24, fmax(3, 520.0 / L.n_rows));
	L.W = 1280;
	L.x0 = 84;
	L.x1 = L.W - 28;
	L.y0 = 92;
	tl_timeline_t t;
	if (tl_timeline(&t, p))
		return SP_ENOMEM;
	for (int s = 0; s < p->n_slices; s++) {
		const sp_slice_t *x = &p->slices[s];
		L.t_max = fmax(L.t_max, fmax(x->start_ms + x->fwd_ms, x->bwd_start_ms + x->bwd_ms));
	}
	for (int i = 0; i < t.n_syncs; i++)
		L.t_max = fmax(L.t_max, t.syncs[i].t0 + t.syncs[i].dur);
	L.t_max = fmax(L.t_max, p->cert.iteration_ms);
	if (!(L.t_max > 0))
		L.t_max = 1;
	double yb = L.y0 + L.n_rows * L.row_h;
	double leg_y = yb + 62;
	L.H = leg_y + legend(f, &L, p, leg_y, 0) + 8;

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		   "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
		   "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\">\n",
		L.W, L.H, L.W, L.H, FONT);
	fprintf(f, "<title>");
	xml_text(f, p->model.name);
	fprintf(f, " on ");
	xml_text(f, p->cluster_name);
	fprintf(f, ": predicted schedule of the ");
	xml_text(f, p->algo);
	fprintf(f, " plan</title>\n");
	fprintf(f, "<defs><pattern id=\"hatch\" patternUnits=\"userSpaceOnUse\" width=\"5\" "
		   "height=\"5\" patternTransform=\"rotate(45)\"><rect width=\"1.6\" height=\"5\" "
		   "fill=\"#ffffff\" fill-opacity=\"0.75\"/></pattern></defs>\n");
	fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
	title(f, &L, p);
	/* every other machine's rows on a light band help the eye follow a row */
	for (int d = 0; d < L.n_rows; d++)
		if (p->devices[d].node % 2)
			fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
				   "fill=\"#f6f6f6\"/>\n",
				L.x0, L.y0 + d * L.row_h, L.x1 - L.x0, L.row_h);
	axis(f, &L, p);
	int rc;
	if ((rc = waves(f, &L, p)) || (rc = slice_bars(f, &L, p, &t, 0)))
		goto cleanup;
	sync_bars(f, &L, &t);
	if ((rc = slice_bars(f, &L, p, &t, 1)))
		goto cleanup;
	iteration_end(f, &L, p);
	legend(f, &L, p, leg_y, 1);
	fprintf(f, "</svg>\n");
cleanup:
	tl_timeline_release(&t);
	return rc;
}
