/*
 * plan_edit.c — edits to a plan's programs for tests (plan_edit.h).
 */
#include "plan_edit.h"

#include <stdlib.h>
#include <string.h>

sp_ins_t *plan_edit_at(const sp_plan_t *p, int d, int k)
{
	return &p->ins[p->devices[d].first_ins + k];
}

/* Device d's program grows by `by` instructions: later ones start later. */
static void shift_after(sp_plan_t *p, int d, int by)
{
	p->n_ins += by;
	p->devices[d].n_ins += by;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].first_ins += by;
}

void plan_edit_delete(sp_plan_t *p, int d, int k)
{
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g, p->ins + g + 1, sizeof *p->ins * (size_t)(p->n_ins - g - 1));
	shift_after(p, d, -1);
}

int plan_edit_insert(sp_plan_t *p, int d, int k, sp_ins_t in)
{
	sp_ins_t *grown = realloc(p->ins, sizeof *p->ins * (size_t)(p->n_ins + 1));
	if (!grown)
		return SP_ENOMEM;
	p->ins = grown;
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g + 1, p->ins + g, sizeof *p->ins * (size_t)(p->n_ins - g));
	p->ins[g] = in;
	shift_after(p, d, 1);
	return 0;
}

int plan_edit_move(sp_plan_t *p, int d, int from, int to)
{
	sp_ins_t in = *plan_edit_at(p, d, from);
	plan_edit_delete(p, d, from);
	return plan_edit_insert(p, d, to, in);
}

void plan_edit_retarget(sp_plan_t *p, int d, int k, int dst, sp_vref_t v)
{
	sp_ins_t *in = plan_edit_at(p, d, k);
	*(dst ? &in->dst : &in->src) = v;
}

int plan_edit_find_tag(const sp_plan_t *p, int op, int tag, int *dev)
{
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = plan_edit_at(p, d, k);
			if (in->op == op && in->tag == tag) {
				*dev = d;
				return k;
			}
		}
	return -1;
}
