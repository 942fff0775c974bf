/*
 * tp_cost.c — the tensor-parallel degree of every slice of a schedule,
 * after the scheduler chose the widths (the widths already price the
 * fastest (d, t) at each n: cost.c's tpn/usen tables).
 *
 * One sharding per layer (tp-format.txt): every slice that covers a
 * (component, layer) has the same t. We keep one t per class of MetaOps
 * that share a component (union over the components each MetaOp covers),
 * which is that rule or stricter. A slice of a width no (d, t) makes
 * first narrows to the width its table time came from (usen). In a class,
 * the t whose slices carry the
 * most layer-time (layers x T(n)) wins; when some slice of the class cannot
 * run at it (n % t != 0 or n / t > batch), the class runs at t = 1 and a
 * slice wider than its batch shrinks to the batch. A slice whose t differs
 * from its table's runs at the class's t and the simulator prices it so.
 *
 * tp_report / tp_json: each MetaOp's t in a lowered plan, for report.c to
 * print (report.c is the format engineer's; it calls these).
 *
 * It does not place groups on nodes (place.c) nor price anything itself.
 */
#include "planner.h"

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

static int fits_degree(const metaop_t *m, int n, int t)
{
	return t == 1 || (n % t == 0 && n / t <= m->batch &&
			  tp_ok(m->shape.type, m->shape.heads, m->shape.ffn, t));
}

int tp_assign(planner_t *pl, sched_t *s)
{
	sp_arena_mark_t mk = sp_arena_mark(&pl->scratch);
	int nc = pl->model->n_comps, rc = 0;
	int *up = sp_arena_calloc(&pl->scratch, (size_t)nc, sizeof(int));
	int *cls = sp_arena_calloc(&pl->scratch, (size_t)pl->n_mops, sizeof(int));
	int *pick = sp_arena_calloc(&pl->scratch, (size_t)nc, sizeof(int));
	double *w = sp_arena_calloc(&pl->scratch, (size_t)nc * (SP_TP_MAX + 1), sizeof(double));
	if (!up || !cls || !pick || !w) {
		rc = SP_ENOMEM;
		goto done;
	}
	mop_classes(pl, up, cls);
	for (int i = 0; i < s->n; i++) {
		sslice_t *x = &s->s[i];
		const metaop_t *m = &pl->mops[x->metaop];
		int t;
		x->n = table_width(m, x->n, &t); /* the same table time */
		w[cls[x->metaop] * (SP_TP_MAX + 1) + t] += (x->lt - x->lf) * mop_t(m, x->n);
	}
	/* the heaviest t of each class (ties: the smaller t) */
	for (int c = 0; c < nc; c++) {
		pick[c] = 1;
		for (int t = 2; t <= SP_TP_MAX; t++)
			if (w[c * (SP_TP_MAX + 1) + t] > w[c * (SP_TP_MAX + 1) + pick[c]])
				pick[c] = t;
	}
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		int c = cls[x->metaop];
		if (!fits_degree(&pl->mops[x->metaop], x->n, pick[c]))
			pick[c] = 1;
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
