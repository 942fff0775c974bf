/*
 * tp_cost.c — the tensor-parallel degree of every slice of a schedule,
 * after the scheduler chose the widths (the widths already price the
 * fastest (d, t) at each n: cost.c's tpn/usen tables).
 *
 * One sharding per layer (tp-format.txt): every slice that covers a
 * (component, layer) has the same t. We keep one t per class of MetaOps
 * that share a component (union over the components each MetaOp covers),
 * which is that rule or stricter. A slice of a width no (d, t) makes
 * first narrows to the width its table time came from (usen). A class
 * weighs t = 1 and every t its slices' tables chose: the layer-time of all
 * its slices re-priced at that t (layers x cost_layer_tp at local batch
 * ceil(B / (n / t))), ruled out when some slice cannot run it (n % t != 0
 * or n / t > batch); the least wins. At t = 1 a slice wider than its batch
 * shrinks to the batch. With F = pl->tp_force (--tp F, or 1 on the
 * whole-layer tables), a class runs at F where all its slices can, else
 * at 1. (Taking the t of the slices that carry most
 * layer-time instead forces it on a shared encoder's large-batch tasks,
 * where it is slower than whole layers: clip-10 on 128 GPUs.)
 *
 * tp_report / tp_json: each MetaOp's t in a lowered plan, for report.c to
 * print (report.c is the format engineer's; it calls these). tp_whole:
 * under a forced --tp N (the plan's options), one line per class of
 * transformer MetaOps the plan leaves whole and why, read off the lowered
 * plan (a decoder, never split; the first slice that cannot run N: too
 * narrow, not a multiple of N, a group across nodes; else the
 * one-sharding-per-layer fall-back).
 *
 * It does not place groups on nodes (place.c); its prices are cost.c's.
 */
#include "planner.h"
#include "tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The (n, t) a slice of n devices of m runs at before the class decides:
 * its table's t where n makes it, else t = 1 (n <= batch), else the width
 * its table's time came from. */
static int table_width(const metaop_t *m, int n, int *t)
{
	*t = m->tpn[n] > 0 ? m->tpn[n] : 1;
	if (n % *t == 0 && n / *t <= m->batch)
		return n;
	if (n <= m->batch) {
		*t = 1;
		return n;
	}
	return m->usen[n];
}

static int uf_find(int *up, int x)
{
	while (up[x] != x)
		x = up[x] = up[up[x]];
	return x;
}

/* class of every MetaOp: the representative component of its components */
static int mop_classes(const planner_t *pl, int *up, int *cls)
{
	int nc = pl->model->n_comps, layer;
	for (int c = 0; c < nc; c++)
		up[c] = c;
	for (int m = 0; m < pl->n_mops; m++) {
		int c0 = uf_find(up, mop_comp(pl, m, 0, &layer));
		for (int l = 1; l < pl->mops[m].n_layers; l++) {
			int c = uf_find(up, mop_comp(pl, m, l, &layer));
			if (c != c0)
				up[c] = c0;
		}
	}
	for (int m = 0; m < pl->n_mops; m++)
		cls[m] = uf_find(up, mop_comp(pl, m, 0, &layer));
	return nc;
}

static int fits_degree(const planner_t *pl, const metaop_t *m, int n, int t)
{
	return t == 1 || (n % t == 0 && n / t <= m->batch && pl_tp_ok(pl, &m->shape, t));
}

/* Per-layer ms of slice x at degree t (t = 1: at most batch devices). */
static double slice_ms(const planner_t *pl, const sslice_t *x, int t)
{
	const metaop_t *m = &pl->mops[x->metaop];
	int64_t d = t == 1 ? SP_MIN((int64_t)x->n, m->batch) : x->n / t;
	double f, b;
	cost_layer_tp(pl, x->metaop, (m->batch + d - 1) / d, t, &f, &b);
	return f + b;
}

#define TP_ROW (SP_TP_MAX + 1)

int tp_assign(planner_t *pl, sched_t *s)
{
	sp_arena_mark_t mk = sp_arena_mark(&pl->scratch);
	int nc = pl->model->n_comps, rc = 0;
	int *up = sp_arena_calloc(&pl->scratch, (size_t)nc, sizeof(int));
	int *cls = sp_arena_calloc(&pl->scratch, (size_t)pl->n_mops, sizeof(int));
	int *pick = sp_arena_calloc(&pl->scratch, (size_t)nc, sizeof(int));
	char *seen = sp_arena_calloc(&pl->scratch, (size_t)nc * TP_ROW, 1);
	double *w = sp_arena_calloc(&pl->scratch, (size_t)nc * TP_ROW, sizeof(double));
	if (!up || !cls || !pick || !seen || !w) {
		rc = SP_ENOMEM;
		goto done;
	}
	mop_classes(pl, up, cls);
	/* the degrees a class considers: 1 and its slices' table degrees;
	 * forced, F where every slice can run it */
	int F = pl->tp_force > 0 && pl->tp_force <= SP_TP_MAX ? pl->tp_force : 0;
	for (int i = 0; i < s->n; i++) {
		sslice_t *x = &s->s[i];
		int t, c = cls[x->metaop];
		x->n = table_width(&pl->mops[x->metaop], x->n, &t); /* the same table time */
		seen[c * TP_ROW + 1] = seen[c * TP_ROW + (F ? F : t)] = 1;
	}
	/* each degree's layer-time over the class, every slice at it (none
	 * where some slice cannot run it) */
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		int c = cls[x->metaop];
		for (int t = 1; t <= SP_TP_MAX; t++) {
			double *wt = &w[c * TP_ROW + t];
			if (!seen[c * TP_ROW + t] || *wt == HUGE_VAL)
				continue;
			*wt = fits_degree(pl, &pl->mops[x->metaop], x->n, t)
				      ? *wt + (x->lt - x->lf) * slice_ms(pl, x, t)
				      : HUGE_VAL;
		}
	}
	/* the least (ties: the smaller t); t = 1 always fits; forced: F */
	for (int c = 0; c < nc; c++) {
		pick[c] = F && w[c * TP_ROW + F] != HUGE_VAL ? F : 1;
		for (int t = 2; t <= SP_TP_MAX && !F; t++)
			if (seen[c * TP_ROW + t] && w[c * TP_ROW + t] < w[c * TP_ROW + pick[c]])
				pick[c] = t;
	}
	for (int i = 0; i < s->n; i++) {
		sslice_t *x = &s->s[i];
		const metaop_t *m = &pl->mops[x->metaop];
		x->tp = pick[cls[x->metaop]];
		if (x->tp == 1 && x->n > m->batch)
			x->n = (int)m->batch; /* a scheduler-chosen slice keeps its first devices */
	}
done:
	sp_arena_reset(&pl->scratch, mk);
	return rc;
}

int tp_metaop(const sp_plan_t *p, int m)
{
	int t = 1;
	for (int i = 0; i < p->n_slices; i++)
		if (p->slices[i].metaop == m && p->slices[i].tp > t)
			t = p->slices[i].tp;
	return t;
}

void tp_report(FILE *f, const sp_plan_t *p)
{
	int any = 0;
	for (int m = 0; m < p->n_metaops; m++) {
		int t = tp_metaop(p, m);
		if (t > 1)
			fprintf(f, "%s  %s: t = %d\n", any++ ? "" : "tensor parallel:\n",
				p->metaops[m].name, t);
	}
	if (!any)
		fprintf(f, "tensor parallel: none (every slice runs whole layers)\n");
	if (tp_whole(f, p, "  "))
		fprintf(f, "  (out of memory listing the transformers --tp left whole)\n");
}

void tp_json(FILE *f, const sp_plan_t *p)
{
	fprintf(f, ",\n  \"tp\": {");
	for (int m = 0; m < p->n_metaops; m++) {
		fprintf(f, "%s", m ? ", " : "");
		sp_json_str(f, p->metaops[m].name);
		fprintf(f, ": %d", tp_metaop(p, m));
	}
	fprintf(f, "}");
}

/* The forced degree of a plan's options ("tp=N"), 0 under auto. */
int tp_forced(const sp_plan_t *p)
{
	const char *o = strstr(p->options, "tp=");
	return o ? atoi(o + 3) : 0;
}

/* Component of layer l of the plan's MetaOp m. */
static int plan_comp(const sp_plan_t *p, int m, int l)
{
	const sp_metaop_t *mo = &p->metaops[m];
	return p->model.tasks[mo->task].nodes[p->ops[mo->first_op + l].node].comp;
}

/* Why slice i of a whole class cannot run t (NULL: it could). */
static const char *slice_obstacle(const sp_plan_t *p, int i, int t, char *buf, size_t n)
{
	const sp_slice_t *sl = &p->slices[i];
	const char *name = p->metaops[sl->metaop].name;
	const int32_t *d = p->slice_devs + sl->dev_off;
	if (sl->n_dev < t || sl->n_dev % t) {
		snprintf(buf, n, "%s runs a slice on %d device%s, %s %d", name, sl->n_dev,
			 sl->n_dev > 1 ? "s" : "",
			 sl->n_dev < t ? "narrower than" : "not a multiple of", t);
		return buf;
	}
	for (int k = 0; k < sl->n_dev; k++)
		if (p->devices[d[k]].node != p->devices[d[k - k % t]].node) {
			snprintf(buf, n, "a group of %d devices of %s's slice would span nodes "
					 "%d and %d (not node-aligned)",
				 t, name, p->devices[d[k - k % t]].node, p->devices[d[k]].node);
			return buf;
		}
	return NULL;
}

/* One line of class c (its MetaOps' representative component) on f. */
static void whole_line(FILE *f, const sp_plan_t *p, const int *cls, int c, int t,
		       const char *lead)
{
	char why[256] = "";
	const sp_component_t *cp = &p->model.comps[c];
	fprintf(f, "%s--tp %d leaves %s '%s' whole (MetaOps", lead, t,
		cp->type == COMP_EMBEDDING ? "embedding"
		: cp->type == COMP_LM_HEAD ? "LM head"
					   : "transformer",
		cp->name);
	int shown = 0, more = 0;
	for (int m = 0; m < p->n_metaops; m++) {
		if (cls[m] != c)
			continue;
		if (shown < 4)
			fprintf(f, "%s %s", shown++ ? "," : "", p->metaops[m].name);
		else
			more++;
	}
	if (more)
		fprintf(f, " and %d more", more);
	if (cp->type != COMP_TRANSFORMER && !tp_ok(cp->type, 0, 0, cp->vocab, t))
		snprintf(why, sizeof why, "its vocab (%lld) has fewer ids than %d members",
			 (long long)cp->vocab, t);
	for (int m = 0; m < p->n_metaops && !why[0]; m++)
		if (cls[m] == c && p->metaops[m].shape.mem_seq > 0)
			snprintf(why, sizeof why,
				 "%s is a decoder (cross-attention): decoders are never split",
				 p->metaops[m].name);
	for (int i = 0; i < p->n_slices && !why[0]; i++)
		if (cls[p->slices[i].metaop] == c)
			slice_obstacle(p, i, t, why, sizeof why);
	fprintf(f, "): %s\n",
		why[0] ? why
		       : "its slices could run it, but one sharding per layer made them fall "
			 "back to whole layers (a device would hold two shards of a layer)");
}

int tp_whole(FILE *f, const sp_plan_t *p, const char *lead)
{
	int t = tp_forced(p), nc = p->model.n_comps;
	if (t <= 1)
		return 0;
	int *up = calloc((size_t)nc + 1, sizeof *up);
	int *cls = calloc((size_t)p->n_metaops + 1, sizeof *cls);
	char *split = calloc((size_t)nc + 1, 1);
	if (!up || !cls || !split) {
		free(up);
		free(cls);
		free(split);
		return SP_ENOMEM;
	}
	/* classes: MetaOps that share a component, as tp_assign's */
	for (int c = 0; c < nc; c++)
		up[c] = c;
	for (int m = 0; m < p->n_metaops; m++)
		for (int l = 1; l < p->metaops[m].n_layers; l++) {
			int a = uf_find(up, plan_comp(p, m, 0)), b = uf_find(up, plan_comp(p, m, l));
			if (a != b)
				up[b] = a;
		}
	/* transformers, and (unless --tp-vocab whole) embeddings and LM heads */
	int vocab = !strstr(p->options, "tp_vocab=whole");
	for (int m = 0; m < p->n_metaops; m++) {
		int ty = p->metaops[m].shape.type;
		cls[m] = ty == COMP_TRANSFORMER ||
				 (vocab && (ty == COMP_EMBEDDING || ty == COMP_LM_HEAD))
			 ? uf_find(up, plan_comp(p, m, 0))
			 : -1;
	}
	for (int i = 0; i < p->n_slices; i++)
		if (p->slices[i].tp > 1 && cls[p->slices[i].metaop] >= 0)
			split[cls[p->slices[i].metaop]] = 1;
	/* each class once, at its first MetaOp */
	for (int m = 0; m < p->n_metaops; m++) {
		int c = cls[m], first = 1;
		for (int q = 0; q < m && first; q++)
			first = cls[q] != c;
		if (c >= 0 && first && !split[c])
			whole_line(f, p, cls, c, t, lead);
	}
	free(up);
	free(cls);
	free(split);
	return 0;
}
