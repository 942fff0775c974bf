/*
 * align.c — a node-aligned variant of a placement: the same schedule, the
 * same slices on the same device sets, the devices renumbered so that the
 * replica group of each parameter covers whole nodes where it can.
 *
 * Why: a parameter's gradient is all-reduced over every device holding it
 * (lower_sync.c), and net.c prices that collective by its slowest node: a
 * node holding k of the group's GPUs offers it k of its NICs (rail-
 * optimised), so a group of 700 GPUs with one node holding a single one
 * runs its ring or tree at one NIC's bandwidth, and hierarchical needs the
 * same k on every node. Schedulers lay slices out by compute and transfer
 * locality; where components meet inside a node, the lighter side of the
 * node pays. Renumbering devices changes nothing a device does (its slices,
 * memory, program), only which devices share a node, so the variant is a
 * placement like any other and the simulator judges it against the
 * original (plan.c keeps the faster).
 *
 * Renumbering: each device's dominant component is the one whose layers it
 * holds the most parameter bytes of (devices that hold none: a block of
 * their own, the lightest). Blocks go heaviest first (the component's
 * parameter bytes); inside a block, devices holding more of the component
 * first (those holding a later layer's group are then a prefix), ties by
 * what else they hold and their old id. Each block fills floor(n / G)
 * whole nodes in turn; the rest of each block (its devices holding least)
 * go, heaviest block first, to the remaining nodes by best fit: the fullest
 * node that still has room for all of them, else spread from the emptiest
 * node on. So heavy components sit on whole nodes and the partial nodes
 * mix what is light.
 *
 * It does not renumber plans with tensor-parallel slices (their groups of
 * t must stay inside nodes, which tp.c checked for the original numbers),
 * and it changes no times: the simulator prices the new groups.
 */
#include "planner.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
	int dev, block, np;
	double held; /* bytes of its block's component */
	const uint8_t *bits;
	double weight; /* its block's */
} adev_t;

static int cmp_adev(const void *a, const void *b)
{
	const adev_t *x = a, *y = b;
	if (x->weight != y->weight)
		return x->weight > y->weight ? -1 : 1;
	if (x->block != y->block)
		return x->block < y->block ? -1 : 1;
	if (x->held != y->held)
		return x->held > y->held ? -1 : 1;
	int c = memcmp(x->bits, y->bits, (size_t)x->np);
	if (c)
		return c > 0 ? -1 : 1;
	return (x->dev > y->dev) - (x->dev < y->dev);
}

/* new_id[old] for the slices of s placed by pc; *changed 0 when it is
 * the identity. Work arrays in pl->scratch (the caller's scope). */
static int align_numbers(planner_t *pl, const sched_t *s, const place_t *pc, int32_t *new_id,
			 int *changed)
{
	const sp_model_t *md = pl->model;
	int N = pl->N, G = pl->cluster->gpus_per_node, nc = md->n_comps, np = 0;
	sp_arena_t *a = &pl->scratch;
	int *base = sp_arena_calloc(a, (size_t)nc + 1, sizeof(int));
	if (!base)
		return SP_ENOMEM;
	for (int c = 0; c < nc; c++) {
		base[c] = np;
		np += md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
	}
	uint8_t *bits = sp_arena_calloc(a, (size_t)N * (size_t)np + 1, 1);
	double *w = sp_arena_calloc(a, (size_t)np + 1, sizeof(double));
	int *pcomp = sp_arena_calloc(a, (size_t)np + 1, sizeof(int));
	double *cw = sp_arena_calloc(a, (size_t)nc + 2, sizeof(double));
	double *by = sp_arena_calloc(a, (size_t)nc + 1, sizeof(double));
	adev_t *ad = sp_arena_calloc(a, (size_t)N, sizeof *ad);
	int *fill = sp_arena_calloc(a, (size_t)pl->cluster->nodes + 1, sizeof(int));
	if (!bits || !w || !pcomp || !cw || !by || !ad || !fill)
		return SP_ENOMEM;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		for (int l = x->lf; l < x->lt; l++) {
			int layer, c = mop_comp(pl, x->metaop, l, &layer), p = base[c] + layer;
			if (md->comps[c].type == COMP_CONTRASTIVE || mo->layer_state_bytes <= 0)
				continue;
			w[p] = (double)mo->layer_state_bytes;
			pcomp[p] = c;
			for (int j = 0; j < x->n; j++)
				bits[(size_t)pc->devs[pc->off[i] + j] * np + p] = 1;
		}
	}
	for (int p = 0; p < np; p++)
		cw[pcomp[p]] += w[p];
	for (int d = 0; d < N; d++) {
		const uint8_t *b = bits + (size_t)d * np;
		memset(by, 0, sizeof(double) * (size_t)nc);
		for (int p = 0; p < np; p++)
			if (b[p])
				by[pcomp[p]] += w[p];
		int dom = nc; /* holds nothing: the block after the components */
		for (int c = 0; c < nc; c++)
			if (by[c] > 0 && (dom == nc || by[c] > by[dom]))
				dom = c;
		ad[d] = (adev_t){.dev = d, .block = dom, .np = np, .bits = b,
				 .held = dom < nc ? by[dom] : 0, .weight = cw[dom]};
	}
	qsort(ad, (size_t)N, sizeof *ad, cmp_adev);
	/* whole nodes, block after block; the rests behind them */
	int next = 0, n_rest = 0;
	adev_t *rest = sp_arena_calloc(a, (size_t)N, sizeof *rest);
	if (!rest)
		return SP_ENOMEM;
	for (int i = 0; i < N;) {
		int j = i;
		while (j < N && ad[j].block == ad[i].block)
			j++;
		int whole = (j - i) / G * G;
		for (int k = i; k < i + whole; k++)
			new_id[ad[k].dev] = next++;
		for (int k = i + whole; k < j; k++)
			rest[n_rest++] = ad[k];
		i = j;
	}
	int first = next / G, nodes = pl->cluster->nodes;
	for (int i = 0; i < n_rest;) {
		int j = i;
		while (j < n_rest && rest[j].block == rest[i].block)
			j++;
		int need = j - i, best = -1;
		for (int q = first; q < nodes; q++) /* best fit: fullest with room */
			if (G - fill[q] >= need && (best < 0 || fill[q] > fill[best]))
				best = q;
		for (int k = i; k < j;) {
			int q = best;
			if (q < 0) /* no room for all: the emptiest first */
				for (int r = first; r < nodes; r++)
					if (fill[r] < G && (q < 0 || fill[r] < fill[q]))
						q = r;
			for (; k < j && fill[q] < G; k++)
				new_id[rest[k].dev] = q * G + fill[q]++;
		}
		i = j;
	}
	*changed = 0;
	for (int d = 0; d < N; d++)
		*changed |= new_id[d] != d;
	return 0;
}

int place_align(planner_t *pl, const sched_t *s, place_t *pc, int *changed)
{
	*changed = 0;
	if (pl->cluster->nodes < 2)
		return 0;
	for (int i = 0; i < s->n; i++)
		if (s->s[i].tp > 1)
			return 0;
	int32_t *new_id = sp_arena_calloc(&pl->scratch, (size_t)pl->N, sizeof(int32_t));
	int rc;
	if (!new_id)
		return SP_ENOMEM;
	if ((rc = align_numbers(pl, s, pc, new_id, changed)) || !*changed)
		return rc;
	for (int i = 0; i < s->n; i++) {
		int32_t *d = pc->devs + pc->off[i];
		for (int j = 0; j < s->s[i].n; j++)
			d[j] = new_id[d[j]];
		devs_sort(d, s->s[i].n);
	}
	return 0;
}
