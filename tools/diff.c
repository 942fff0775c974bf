/*
 * diff.c — spindle-diff: what changed between two plans, for review.
 * Inputs (model and cluster hashes, algorithm, options, planner), predicted
 * times and per-device peak memory (absolute and relative), the baselines,
 * waves, slices (matched by MetaOp name and layer range, then by MetaOp
 * and overlapping layers; a changed tensor-parallel degree is a change,
 * not timing), device time per MetaOp, sync buckets (with their shards) and the
 * per-device programs. Numbers are compared as spindle-show prints them
 * (ms and GiB to 0.01), so float noise is no difference.
 *
 * Exit status as diff(1): 0 equal, 1 different, 2 trouble (bad plan or
 * command line). Output is deterministic; it does not judge which plan is
 * better.
 */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
	const sp_plan_t *p;
	int *order; /* slices: by wave, MetaOp name, layers, first device */
	int *match; /* per slice: index in the other plan, or -1 */
} side_t;

typedef struct {
	int n; /* differences found */
	tl_ring_t r;
} dstate_t;

static const char *F2(dstate_t *st, double x)
{
	return tl_fmt(&st->r, x, 2);
}

/* "+7.39 (+3.8%)" */
static const char *delta(dstate_t *st, double a, double b)
{
	char *s = st->r.b[st->r.i++ % TL_RING];
	double ra = tl_round(a, 2), rb = tl_round(b, 2);
	char d[40], pc[40];
	tl_num(d, sizeof d, rb - ra, 2);
	if (ra != 0)
		snprintf(s, sizeof st->r.b[0], "%s%s (%s%s%%)", rb - ra >= 0 ? "+" : "", d,
			 rb - ra >= 0 ? "+" : "", tl_num(pc, sizeof pc, 100 * (rb - ra) / fabs(ra), 1));
	else
		snprintf(s, sizeof st->r.b[0], "%s%s", rb - ra >= 0 ? "+" : "", d);
	return s;
}

/* A number in the table "name  a -> b  delta"; counts it when it differs. */
static void num_row(dstate_t *st, const char *name, double a, double b, int always)
{
	int differ = tl_round(a, 2) != tl_round(b, 2);
	st->n += differ;
	if (differ || always)
		printf("  %-24s %10s -> %-10s %s\n", name, F2(st, a), F2(st, b),
		       differ ? delta(st, a, b) : "same");
}

static void str_row(dstate_t *st, const char *name, const char *a, const char *b)
{
	if (strcmp(a, b)) {
		st->n++;
		printf("  %-13s %s -> %s\n", name, a, b);
	}
}

/* Each task's micro-batches, "match 2, caption 4, classify 1", into buf. */
static void task_ks(char *buf, size_t cap, const sp_plan_t *p)
{
	size_t len = 0;
	buf[0] = 0;
	for (int t = 0; t < p->model.n_tasks && len + 2 < cap; t++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%s %d", t ? ", " : "",
					p->model.tasks[t].name, plan_task_k(p, t));
}

/* ---- slices ------------------------------------------------------------------ */

static const sp_plan_t *sort_plan; /* qsort has no context argument */

static int cmp_slice(const void *a, const void *b)
{
	const sp_plan_t *p = sort_plan;
	const sp_slice_t *x = &p->slices[*(const int *)a], *y = &p->slices[*(const int *)b];
	int c = strcmp(p->metaops[x->metaop].name, p->metaops[y->metaop].name);
	if (c)
		return c;
	if (x->layer_from != y->layer_from)
		return x->layer_from < y->layer_from ? -1 : 1;
	if (x->layer_to != y->layer_to)
		return x->layer_to < y->layer_to ? -1 : 1;
	if (x->wave != y->wave)
		return x->wave < y->wave ? -1 : 1;
	return *(const int *)a < *(const int *)b ? -1 : *(const int *)a > *(const int *)b;
}

static int side_init(side_t *s, const sp_plan_t *p)
{
	s->p = p;
	s->order = malloc(sizeof *s->order * (size_t)(p->n_slices + 1));
	s->match = malloc(sizeof *s->match * (size_t)(p->n_slices + 1));
	if (!s->order || !s->match)
		return SP_ENOMEM;
	for (int i = 0; i < p->n_slices; i++) {
		s->order[i] = i;
		s->match[i] = -1;
	}
	sort_plan = p;
	qsort(s->order, (size_t)p->n_slices, sizeof *s->order, cmp_slice);
	return 0;
}

static void side_release(side_t *s)
{
	free(s->order);
	free(s->match);
}

static const char *mname(const sp_plan_t *p, int slice)
{
	return p->metaops[p->slices[slice].metaop].name;
}

/*
 * Pairs slices of a and b: first equal MetaOp name and layer range (in
 * sorted order, so repeated keys pair up in order), then, among the rest,
 * equal MetaOp name with overlapping layers.
 */
static void match_slices(side_t *a, side_t *b)
{
	const sp_plan_t *pa = a->p, *pb = b->p;
	for (int i = 0, j = 0; i < pa->n_slices && j < pb->n_slices;) {
		int x = a->order[i], y = b->order[j];
		const sp_slice_t *sx = &pa->slices[x], *sy = &pb->slices[y];
		int c = strcmp(mname(pa, x), mname(pb, y));
		if (!c)
			c = sx->layer_from != sy->layer_from ? (sx->layer_from < sy->layer_from ? -1 : 1)
			    : sx->layer_to != sy->layer_to   ? (sx->layer_to < sy->layer_to ? -1 : 1)
							     : 0;
		if (c < 0) {
			i++;
		} else if (c > 0) {
			j++;
		} else {
			a->match[x] = y;
			b->match[y] = x;
			i++;
			j++;
		}
	}
	for (int i = 0; i < pa->n_slices; i++) {
		int x = a->order[i];
		if (a->match[x] >= 0)
			continue;
		const sp_slice_t *sx = &pa->slices[x];
		for (int j = 0; j < pb->n_slices; j++) {
			int y = b->order[j];
			const sp_slice_t *sy = &pb->slices[y];
			if (b->match[y] >= 0 || strcmp(mname(pa, x), mname(pb, y)) ||
			    sy->layer_to <= sx->layer_from || sx->layer_to <= sy->layer_from)
				continue;
			a->match[x] = y;
			b->match[y] = x;
			break;
		}
	}
}

static void slice_desc(char *buf, size_t cap, const sp_plan_t *p, int s)
{
	const sp_slice_t *x = &p->slices[s];
	char devs[256], mem[2 * SP_NAME_MAX + 64];
	tl_devlist(devs, sizeof devs, p->slice_devs + x->dev_off, x->n_dev);
	tl_memory_str(mem, sizeof mem, p, x->metaop);
	snprintf(buf, cap, "%s layers %d-%d (wave %d, x%d, devices %s%s%s)", mname(p, s),
		 x->layer_from, x->layer_to, x->wave, x->n_dev, devs, mem[0] ? ", " : "", mem);
}

/* 1 when matched slices read different memories ("mem S x W from P"). */
static int memory_differs(const sp_plan_t *pa, const sp_slice_t *x, const sp_plan_t *pb,
			  const sp_slice_t *y)
{
	char ma[2 * SP_NAME_MAX + 64], mb[2 * SP_NAME_MAX + 64];
	tl_memory_str(ma, sizeof ma, pa, x->metaop);
	tl_memory_str(mb, sizeof mb, pb, y->metaop);
	return strcmp(ma, mb) != 0;
}

static int same_devs(const sp_plan_t *pa, const sp_slice_t *x, const sp_plan_t *pb,
		     const sp_slice_t *y)
{
	return x->n_dev == y->n_dev &&
	       !memcmp(pa->slice_devs + x->dev_off, pb->slice_devs + y->dev_off,
		       sizeof(int32_t) * (size_t)x->n_dev);
}

static int same_times(const sp_slice_t *x, const sp_slice_t *y)
{
	return tl_round(x->start_ms, 2) == tl_round(y->start_ms, 2) &&
	       tl_round(x->fwd_ms, 2) == tl_round(y->fwd_ms, 2) &&
	       tl_round(x->bwd_start_ms, 2) == tl_round(y->bwd_start_ms, 2) &&
	       tl_round(x->bwd_ms, 2) == tl_round(y->bwd_ms, 2);
}

static void diff_slices(dstate_t *st, const side_t *a, const side_t *b)
{
	const sp_plan_t *pa = a->p, *pb = b->p;
	int removed = 0, added = 0, changed = 0, timing = 0, same = 0;
	char d1[512], d2[512];
	for (int i = 0; i < pa->n_slices; i++)
		removed += a->match[i] < 0;
	for (int i = 0; i < pb->n_slices; i++)
		added += b->match[i] < 0;
	for (int i = 0; i < pa->n_slices; i++) {
		int y = a->match[i];
		if (y < 0)
			continue;
		const sp_slice_t *x = &pa->slices[i], *z = &pb->slices[y];
		if (x->layer_from != z->layer_from || x->layer_to != z->layer_to ||
		    x->wave != z->wave || x->tp != z->tp || x->sp != z->sp || !same_devs(pa, x, pb, z) ||
		    memory_differs(pa, x, pb, z))
			changed++;
		else if (!same_times(x, z))
			timing++;
		else
			same++;
	}
	st->n += removed + added + changed + timing;
	if (!(removed + added + changed + timing))
		return;
	printf("\nslices: %d -> %d; %d removed, %d added, %d changed, %d changed only in time, %d "
	       "same\n",
	       pa->n_slices, pb->n_slices, removed, added, changed, timing, same);
	/* in a's sorted order, removed and changed; then b's added, in its order */
	for (int i = 0; i < pa->n_slices; i++) {
		int s = a->order[i], y = a->match[s];
		if (y < 0) {
			slice_desc(d1, sizeof d1, pa, s);
			printf("  - %s\n", d1);
			continue;
		}
		const sp_slice_t *x = &pa->slices[s], *z = &pb->slices[y];
		int lay = x->layer_from != z->layer_from || x->layer_to != z->layer_to;
		int devs = !same_devs(pa, x, pb, z), mem = memory_differs(pa, x, pb, z);
		if (!lay && !devs && !mem && x->wave == z->wave && x->tp == z->tp && x->sp == z->sp)
			continue;
		printf("  ~ %s layers %d-%d:", mname(pa, s), x->layer_from, x->layer_to);
		const char *sep = "";
		if (lay) {
			printf(" layers %d-%d -> %d-%d", x->layer_from, x->layer_to, z->layer_from,
			       z->layer_to);
			sep = ";";
		}
		if (x->n_dev != z->n_dev) {
			printf("%s device count %d -> %d", sep, x->n_dev, z->n_dev);
			sep = ";";
		}
		if (devs) {
			tl_devlist(d1, sizeof d1, pa->slice_devs + x->dev_off, x->n_dev);
			tl_devlist(d2, sizeof d2, pb->slice_devs + z->dev_off, z->n_dev);
			printf("%s devices %s -> %s", sep, d1, d2);
			sep = ";";
		}
		if (x->tp != z->tp) {
			printf("%s tp %d -> %d", sep, x->tp, z->tp);
			sep = ";";
		}
		if (x->sp != z->sp) {
			printf("%s sp %d -> %d", sep, x->sp, z->sp);
			sep = ";";
		}
		if (mem) {
			tl_memory_str(d1, sizeof d1, pa, x->metaop);
			tl_memory_str(d2, sizeof d2, pb, z->metaop);
			printf("%s memory %s -> %s", sep, d1[0] ? d1 : "none", d2[0] ? d2 : "none");
			sep = ";";
		}
		if (x->wave != z->wave)
			printf("%s wave %d -> %d", sep, x->wave, z->wave);
		printf("\n");
	}
	for (int i = 0; i < pb->n_slices; i++) {
		int s = b->order[i];
		if (b->match[s] >= 0)
			continue;
		slice_desc(d2, sizeof d2, pb, s);
		printf("  + %s\n", d2);
	}
}

/* ---- waves -------------------------------------------------------------------- */

/* Do waves wa of a and wb of b hold the same slices (matched, same devices)? */
static int same_wave_slices(const side_t *a, int wa, const side_t *b, int wb)
{
	const sp_wave_t *x = &a->p->waves[wa], *y = &b->p->waves[wb];
	if (x->n_slices != y->n_slices)
		return 0;
	for (int s = x->first_slice; s < x->first_slice + x->n_slices; s++) {
		int m = a->match[s];
		if (m < 0 || b->p->slices[m].wave != wb)
			return 0;
		const sp_slice_t *sa = &a->p->slices[s], *sb = &b->p->slices[m];
		if (sa->layer_from != sb->layer_from || sa->layer_to != sb->layer_to ||
		    !same_devs(a->p, sa, b->p, sb))
			return 0;
	}
	return 1;
}

static void diff_waves(dstate_t *st, const side_t *a, const side_t *b)
{
	const sp_plan_t *pa = a->p, *pb = b->p;
	int n = SP_MAX(pa->n_waves, pb->n_waves), changed = 0;
	for (int w = 0; w < n; w++) {
		if (w >= pa->n_waves || w >= pb->n_waves) {
			changed++;
			continue;
		}
		const sp_wave_t *x = &pa->waves[w], *y = &pb->waves[w];
		changed += !same_wave_slices(a, w, b, w) ||
			   tl_round(x->start_ms, 2) != tl_round(y->start_ms, 2) ||
			   tl_round(x->dur_ms, 2) != tl_round(y->dur_ms, 2) ||
			   tl_round(x->bwd_start_ms, 2) != tl_round(y->bwd_start_ms, 2) ||
			   tl_round(x->bwd_dur_ms, 2) != tl_round(y->bwd_dur_ms, 2);
	}
	st->n += changed;
	if (!changed)
		return;
	printf("\nwaves: %d -> %d; %d changed, removed or added\n", pa->n_waves, pb->n_waves,
	       changed);
	for (int w = 0; w < n; w++) {
		if (w >= pb->n_waves || w >= pa->n_waves) { /* removed, or added */
			int gone = w >= pb->n_waves;
			const sp_wave_t *x = gone ? &pa->waves[w] : &pb->waves[w];
			printf("  %c wave %d: fwd %s +%s, bwd %s +%s, %d slices\n", gone ? '-' : '+',
			       w, F2(st, x->start_ms), F2(st, x->dur_ms), F2(st, x->bwd_start_ms),
			       F2(st, x->bwd_dur_ms), x->n_slices);
			continue;
		}
		const sp_wave_t *x = &pa->waves[w], *y = &pb->waves[w];
		char ta[128], tb[128];
		snprintf(ta, sizeof ta, "fwd %s +%s, bwd %s +%s", F2(st, x->start_ms),
			 F2(st, x->dur_ms), F2(st, x->bwd_start_ms), F2(st, x->bwd_dur_ms));
		snprintf(tb, sizeof tb, "fwd %s +%s, bwd %s +%s", F2(st, y->start_ms),
			 F2(st, y->dur_ms), F2(st, y->bwd_start_ms), F2(st, y->bwd_dur_ms));
		int slices = !same_wave_slices(a, w, b, w), times = strcmp(ta, tb) != 0;
		if (!slices && !times)
			continue;
		printf("  ~ wave %d:", w);
		if (times)
			printf(" %s -> %s%s", ta, tb, slices ? ";" : "");
		if (slices)
			printf(" slices differ (%d -> %d)", x->n_slices, y->n_slices);
		printf("\n");
	}
}

/* ---- device time per MetaOp ---------------------------------------------------- */

typedef struct {
	const char *name;
	double ms[2];
} mo_time_t;

static int cmp_mo(const void *a, const void *b)
{
	return strcmp(((const mo_time_t *)a)->name, ((const mo_time_t *)b)->name);
}

/* Σ over a MetaOp's slices of n_dev × (fwd_ms + bwd_ms), per MetaOp name. */
static int diff_metaops(dstate_t *st, const sp_plan_t *pa, const sp_plan_t *pb)
{
	int cap = pa->n_metaops + pb->n_metaops, n = 0;
	mo_time_t *t = calloc((size_t)cap + 1, sizeof *t);
	if (!t)
		return SP_ENOMEM;
	const sp_plan_t *ps[2] = {pa, pb};
	for (int k = 0; k < 2; k++)
		for (int m = 0; m < ps[k]->n_metaops; m++)
			t[n++].name = ps[k]->metaops[m].name;
	qsort(t, (size_t)n, sizeof *t, cmp_mo);
	int u = 0;
	for (int i = 0; i < n; i++)
		if (u == 0 || strcmp(t[u - 1].name, t[i].name))
			t[u++] = t[i];
	for (int k = 0; k < 2; k++)
		for (int s = 0; s < ps[k]->n_slices; s++) {
			const sp_slice_t *x = &ps[k]->slices[s];
			mo_time_t key = {ps[k]->metaops[x->metaop].name, {0, 0}};
			mo_time_t *e = bsearch(&key, t, (size_t)u, sizeof *t, cmp_mo);
			e->ms[k] += x->n_dev * (x->fwd_ms + x->bwd_ms);
		}
	int changed = 0;
	double tot[2] = {0, 0};
	for (int i = 0; i < u; i++) {
		changed += tl_round(t[i].ms[0], 2) != tl_round(t[i].ms[1], 2);
		tot[0] += t[i].ms[0];
		tot[1] += t[i].ms[1];
	}
	st->n += changed;
	if (!changed) {
		free(t);
		return 0;
	}
	printf("\ndevice time per MetaOp, device-ms (sum over its slices of n_dev x (fwd_ms + "
	       "bwd_ms)): %d of %d changed\n",
	       changed, u);
	for (int i = 0; i < u; i++)
		if (tl_round(t[i].ms[0], 2) != tl_round(t[i].ms[1], 2))
			printf("  %-32s %10s -> %-10s %s\n", t[i].name, F2(st, t[i].ms[0]),
			       F2(st, t[i].ms[1]), delta(st, t[i].ms[0], t[i].ms[1]));
	printf("  %-32s %10s -> %-10s %s\n", "total", F2(st, tot[0]), F2(st, tot[1]),
	       tl_round(tot[0], 2) != tl_round(tot[1], 2) ? delta(st, tot[0], tot[1]) : "same");
	free(t);
	return 0;
}

/* ---- memory, baselines, buckets, programs --------------------------------------- */

static void diff_memory(dstate_t *st, const sp_plan_t *pa, const sp_plan_t *pb)
{
	int n = SP_MAX(pa->n_devices, pb->n_devices), changed = 0;
	for (int d = 0; d < n; d++)
		changed += d >= pa->n_devices || d >= pb->n_devices ||
			   tl_round((double)pa->devices[d].mem_peak / GIB, 2) !=
				   tl_round((double)pb->devices[d].mem_peak / GIB, 2);
	st->n += changed;
	if (!changed)
		return;
	printf("\npeak memory per device, GiB: %d of %d devices changed\n", changed, n);
	for (int d = 0; d < n; d++) {
		if (d >= pa->n_devices) {
			printf("  device %-4d %10s -> %-10s added\n", d, "-",
			       F2(st, (double)pb->devices[d].mem_peak / GIB));
			continue;
		}
		if (d >= pb->n_devices) {
			printf("  device %-4d %10s -> %-10s removed\n", d,
			       F2(st, (double)pa->devices[d].mem_peak / GIB), "-");
			continue;
		}
		double a = (double)pa->devices[d].mem_peak / GIB;
		double b = (double)pb->devices[d].mem_peak / GIB;
		if (tl_round(a, 2) != tl_round(b, 2))
			printf("  device %-4d %10s -> %-10s %s\n", d, F2(st, a), F2(st, b),
			       delta(st, a, b));
	}
}

static const sp_algo_result_t *find_algo(const sp_plan_t *p, const char *name)
{
	for (int i = 0; i < p->n_algos; i++)
		if (!strcmp(p->algos[i].name, name))
			return &p->algos[i];
	return NULL;
}

static void diff_baselines(dstate_t *st, const sp_plan_t *pa, const sp_plan_t *pb)
{
	int header = 0;
	const sp_plan_t *ps[2] = {pa, pb};
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < ps[k]->n_algos; i++) {
			const char *name = ps[k]->algos[i].name;
			if (k == 1 && find_algo(pa, name))
				continue; /* shown in the first pass */
			const sp_algo_result_t *x = find_algo(pa, name), *y = find_algo(pb, name);
			if (x && y && tl_round(x->iteration_ms, 2) == tl_round(y->iteration_ms, 2) &&
			    tl_round(x->compute_ms, 2) == tl_round(y->compute_ms, 2) &&
			    x->fits_memory == y->fits_memory)
				continue;
			if (!header)
				printf("\nbaselines (iteration ms):\n");
			header = 1;
			st->n++;
			if (!x || !y)
				printf("  %-24s %10s -> %-10s %s\n", name,
				       x ? F2(st, x->iteration_ms) : "-",
				       y ? F2(st, y->iteration_ms) : "-", x ? "removed" : "added");
			else
				printf("  %-24s %10s -> %-10s %s%s\n", name, F2(st, x->iteration_ms),
				       F2(st, y->iteration_ms), delta(st, x->iteration_ms, y->iteration_ms),
				       x->fits_memory != y->fits_memory
					       ? (y->fits_memory ? "; now fits memory" : "; now over cap")
					       : "");
		}
}

static int same_bucket(const sp_plan_t *pa, const sp_bucket_t *x, const sp_plan_t *pb,
		       const sp_bucket_t *y)
{
	if (x->n_dev != y->n_dev || x->n_params != y->n_params || x->elems != y->elems ||
	    x->layout != y->layout || x->overlap != y->overlap || x->defer != y->defer ||
	    tl_round(x->sync_ms, 2) != tl_round(y->sync_ms, 2) ||
	    memcmp(pa->bucket_devs + x->dev_off, pb->bucket_devs + y->dev_off,
		   sizeof(int32_t) * (size_t)x->n_dev))
		return 0;
	for (int i = 0; i < x->n_params; i++) {
		const sp_param_t *u = &pa->bucket_params[x->param_off + i];
		const sp_param_t *v = &pb->bucket_params[y->param_off + i];
		if (u->layer != v->layer || u->tp != v->tp || u->tp_rank != v->tp_rank ||
		    strcmp(pa->model.comps[u->comp].name, pb->model.comps[v->comp].name))
			return 0;
	}
	return 1;
}

static void diff_buckets(dstate_t *st, const sp_plan_t *pa, const sp_plan_t *pb)
{
	int n = SP_MAX(pa->n_buckets, pb->n_buckets), changed = 0, da = 0, db = 0;
	double ta = 0, tb = 0;
	for (int b = 0; b < n; b++)
		changed += b >= pa->n_buckets || b >= pb->n_buckets ||
			   !same_bucket(pa, &pa->buckets[b], pb, &pb->buckets[b]);
	for (int b = 0; b < pa->n_buckets; b++)
		ta += pa->buckets[b].sync_ms;
	for (int b = 0; b < pb->n_buckets; b++)
		tb += pb->buckets[b].sync_ms;
	for (int b = 0; b < pa->n_buckets; b++)
		da += pa->buckets[b].defer != 0;
	for (int b = 0; b < pb->n_buckets; b++)
		db += pb->buckets[b].defer != 0;
	st->n += changed;
	if (!changed)
		return;
	printf("\nsync buckets: %d -> %d; %d changed, removed or added; all-reduce ms in all %s "
	       "-> %s\n",
	       pa->n_buckets, pb->n_buckets, changed, F2(st, ta), F2(st, tb));
	if (da != db)
		printf("deferred all-gathers: %d -> %d buckets\n", da, db);
}

/* One instruction as text, by names (indices differ between plans). */
static void ins_key(char *buf, size_t cap, const sp_plan_t *p, const sp_ins_t *in)
{
	const sp_vref_t *v = in->op == INS_RECV ? &in->dst : &in->src;
	char la[16], lb[16]; /* layer boundaries; "mem": a decoder's memory */
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		const sp_slice_t *s = &p->slices[in->slice];
		snprintf(buf, cap, "%s %s layers %d-%d samples %d-%d", ins_op_name(in->op),
			 p->metaops[s->metaop].name, s->layer_from, s->layer_to, in->s0, in->s1);
		break;
	}
	case INS_SEND:
	case INS_RECV:
		snprintf(buf, cap, "%s %s(%s, %s) tokens %d+%d samples %d-%d %s %d tag %d",
			 ins_op_name(in->op), v->grad ? "grad" : "act", p->metaops[v->metaop].name,
			 tl_layer_str(la, sizeof la, v->layer), v->seq_off, in->seq_len, in->s0, in->s1,
			 in->op == INS_SEND ? "to" : "from", in->peer, in->tag);
		break;
	case INS_COPY:
		snprintf(buf, cap, "copy %s(%s, %s) -> %s(%s, %s) tokens %d/%d+%d samples %d-%d",
			 in->src.grad ? "grad" : "act", p->metaops[in->src.metaop].name,
			 tl_layer_str(la, sizeof la, in->src.layer), in->dst.grad ? "grad" : "act",
			 p->metaops[in->dst.metaop].name, tl_layer_str(lb, sizeof lb, in->dst.layer),
			 in->src.seq_off,
			 in->dst.seq_off, in->seq_len, in->s0, in->s1);
		break;
	case INS_SYNC:
	case INS_GATHER:
	case INS_PGATHER:
	case INS_PFREE: snprintf(buf, cap, "%s bucket %d", ins_op_name(in->op), in->peer); break;
	default: snprintf(buf, cap, "%s", ins_op_name(in->op)); break;
	}
}

static void diff_programs(dstate_t *st, const sp_plan_t *pa, const sp_plan_t *pb)
{
	int n = SP_MIN(pa->n_devices, pb->n_devices), changed = 0;
	char ka[512], kb[512];
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1 && !changed)
			break;
		if (pass == 1)
			printf("\nprograms: %d of %d devices differ\n", changed, n);
		for (int d = 0; d < n; d++) {
			const sp_device_t *x = &pa->devices[d], *y = &pb->devices[d];
			int k = 0;
			for (; k < x->n_ins && k < y->n_ins; k++) {
				ins_key(ka, sizeof ka, pa, &pa->ins[x->first_ins + k]);
				ins_key(kb, sizeof kb, pb, &pb->ins[y->first_ins + k]);
				if (strcmp(ka, kb))
					break;
			}
			if (k == x->n_ins && k == y->n_ins)
				continue;
			if (pass == 0) {
				changed++;
				continue;
			}
			printf("  device %d: %d -> %d instructions, first difference at %d", d,
			       x->n_ins, y->n_ins, k);
			if (k < x->n_ins && k < y->n_ins)
				printf(": %s -> %s", ka, kb);
			printf("\n");
		}
	}
	st->n += changed;
}

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f, "usage: spindle-diff A.bin B.bin\n"
		   "\n"
		   "Shows what changed from plan A to plan B: inputs, predicted times and\n"
		   "memory, baselines, waves, slices, device time per MetaOp, sync buckets\n"
		   "and programs. Numbers are compared as spindle-show prints them.\n"
		   "\n"
		   "exit status: 0 equal, 1 different, 2 bad plan or command line\n");
}

int main(int argc, char **argv)
{
	const char *path[2] = {NULL, NULL};
	int np = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		}
		if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "spindle-diff: unknown option '%s'\nhint: see spindle-diff "
					"--help\n",
				argv[i]);
			return SP_EXIT_INPUT;
		}
		if (np == 2) {
			fprintf(stderr, "spindle-diff: unexpected argument '%s'\n", argv[i]);
			return SP_EXIT_INPUT;
		}
		path[np++] = argv[i];
	}
	if (np != 2) {
		usage(stderr);
		return SP_EXIT_INPUT;
	}
	sp_plan_t pa = {0}, pb = {0};
	side_t a = {0}, b = {0};
	dstate_t st = {0};
	int rc = tl_load(&pa, "spindle-diff", path[0]);
	if (!rc)
		rc = tl_load(&pb, "spindle-diff", path[1]);
	if (rc)
		goto cleanup;
	if (side_init(&a, &pa) || side_init(&b, &pb)) {
		fprintf(stderr, "spindle-diff: out of memory\n");
		rc = SP_EXIT_INPUT;
		goto cleanup;
	}
	match_slices(&a, &b);

	printf("--- %s: %s on %s, %s\n+++ %s: %s on %s, %s\n", path[0], pa.model.name,
	       pa.cluster_name, pa.algo, path[1], pb.model.name, pb.cluster_name, pb.algo);
	printf("\ninputs:\n");
	char ha[32], hb[32];
	str_row(&st, "model", pa.model.name, pb.model.name);
	snprintf(ha, sizeof ha, "%016llx", (unsigned long long)pa.model_hash);
	snprintf(hb, sizeof hb, "%016llx", (unsigned long long)pb.model_hash);
	str_row(&st, "model hash", ha, hb);
	str_row(&st, "cluster", pa.cluster_name, pb.cluster_name);
	snprintf(ha, sizeof ha, "%016llx", (unsigned long long)pa.cluster_hash);
	snprintf(hb, sizeof hb, "%016llx", (unsigned long long)pb.cluster_hash);
	str_row(&st, "cluster hash", ha, hb);
	str_row(&st, "algorithm", pa.algo, pb.algo);
	str_row(&st, "options", pa.options, pb.options);
	char ka[512], kb[512];
	task_ks(ka, sizeof ka, &pa);
	task_ks(kb, sizeof kb, &pb);
	str_row(&st, "micro-batches", ka, kb);
	str_row(&st, "planner", pa.planner_version, pb.planner_version);
	if (!st.n)
		printf("  same model, cluster, algorithm, options and planner\n");

	const sp_cert_t *ca = &pa.cert, *cb = &pb.cert;
	double peak[2] = {0, 0};
	for (int d = 0; d < pa.n_devices; d++)
		peak[0] = fmax(peak[0], (double)pa.devices[d].mem_peak / GIB);
	for (int d = 0; d < pb.n_devices; d++)
		peak[1] = fmax(peak[1], (double)pb.devices[d].mem_peak / GIB);
	printf("\npredicted:\n");
	num_row(&st, "iteration ms", ca->iteration_ms, cb->iteration_ms, 1);
	num_row(&st, "compute ms", ca->compute_ms, cb->compute_ms, 1);
	num_row(&st, "lower bound ms", ca->lower_bound_ms, cb->lower_bound_ms, 0);
	num_row(&st, "gap %", 100 * ca->gap, 100 * cb->gap, 0);
	num_row(&st, "transfers ms", ca->transfer_ms, cb->transfer_ms, 0);
	num_row(&st, "sync and step ms", ca->sync_ms, cb->sync_ms, 0);
	num_row(&st, "cross-node GiB", (double)ca->xnode_bytes / GIB, (double)cb->xnode_bytes / GIB,
		0);
	num_row(&st, "peak memory GiB (max)", peak[0], peak[1], 1);

	diff_memory(&st, &pa, &pb);
	diff_baselines(&st, &pa, &pb);
	diff_waves(&st, &a, &b);
	diff_slices(&st, &a, &b);
	if (diff_metaops(&st, &pa, &pb)) {
		fprintf(stderr, "spindle-diff: out of memory\n");
		rc = SP_EXIT_INPUT;
		goto cleanup;
	}
	diff_buckets(&st, &pa, &pb);
	diff_programs(&st, &pa, &pb);
	if (st.n)
		printf("\nplans differ: %d difference%s\n", st.n, st.n == 1 ? "" : "s");
	else
		printf("\nplans are equal\n");
	rc = st.n ? SP_EXIT_FAIL : SP_EXIT_OK;
	if (fflush(stdout) != 0) {
		fprintf(stderr, "spindle-diff: cannot write to standard output\n");
		rc = SP_EXIT_INPUT;
	}
cleanup:
	side_release(&a);
	side_release(&b);
	plan_release(&pa);
	plan_release(&pb);
	return rc;
}
