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
 * mix what is light. A second packing spreads a block with a small rest
 * (r <= G/2) over one node more, G - r of them one GPU short, so none of
 * its nodes has fewer than G - 1 of its GPUs (align_pack); of the two, after
 * the swaps below, the one whose longest chain (the most the classes of one
 * device cost together: its all-reduces queue one after another) is shorter
 * is kept, ties to the first.
 *
 * Then a local search over swaps of two devices on different nodes. A
 * class is a set of parameters with the same holders (one or more sync
 * buckets); its price, as net.c's ring and tree see it, is W_c / u_c:
 * W_c its parameter bytes, u_c = min over the nodes it touches of
 * min(k_j, K), the NICs its k_j GPUs there offer (K per node), and 0 when
 * it lies inside one node (NVLink). The class with the most to gain
 * (W_c (1/u_c - 1/K)) looks at a node where it has the fewest GPUs and takes
 * the swap of one of that node's devices with a device elsewhere, in or out
 * of the class, that lowers the sum of all prices most; a class no swap
 * helps is left as it is. This mends what blocks cannot see: the holders
 * of a later layer are a subset of the block, and where that subset ends
 * part-way into a node it would have one or two GPUs there.
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

/* The local search's state: per class its weight and per node its count
 * of GPUs (cnt[c * nodes + q]), how many nodes have each count (hist[c *
 * (G + 1) + k]) and how many it touches; per device its class set. */
typedef struct {
	int nc, nodes, G, K, N;
	double *W;
	int *cnt, *hist, *touch;
	const uint8_t *mem; /* [dev][class] */
	const int *sig;     /* per device: the first device with its class set */
	int32_t *pos, *at;  /* device -> number, number -> device */
} swp_t;

static double class_price(const swp_t *S, int c)
{
	if (S->touch[c] < 2)
		return 0;
	const int *h = S->hist + (size_t)c * (S->G + 1);
	int k = 1;
	while (k < S->G && !h[k])
		k++;
	return S->W[c] / SP_MIN(k, S->K);
}

/* Class c gains d GPUs on node q. */
static void class_move(swp_t *S, int c, int q, int d)
{
	int *n = &S->cnt[(size_t)c * S->nodes + q], *h = S->hist + (size_t)c * (S->G + 1);
	if (*n)
		h[*n]--;
	else
		S->touch[c]++;
	*n += d;
	if (*n)
		h[*n]++;
	else
		S->touch[c]--;
}

/* Devices x and y trade places (apply) or the change in the sum of prices
 * that trade would make (!apply: nothing changes). */
static double swap_eval(swp_t *S, int x, int y, int apply)
{
	int qa = S->pos[x] / S->G, qb = S->pos[y] / S->G;
	const uint8_t *mx = S->mem + (size_t)x * S->nc, *my = S->mem + (size_t)y * S->nc;
	double before = 0, after = 0;
	for (int c = 0; c < S->nc; c++) {
		if (mx[c] == my[c])
			continue;
		int d = mx[c] ? 1 : -1; /* x's classes go to qb, y's to qa */
		before += class_price(S, c);
		class_move(S, c, qa, -d);
		class_move(S, c, qb, d);
		after += class_price(S, c);
		if (!apply) {
			class_move(S, c, qb, -d);
			class_move(S, c, qa, d);
		}
	}
	if (apply) {
		int32_t px = S->pos[x];
		S->pos[x] = S->pos[y];
		S->pos[y] = px;
		S->at[S->pos[x]] = x;
		S->at[S->pos[y]] = y;
	}
	return after - before;
}

/* 1 when a device before position j on its node has the class set of the
 * device there (trading either is the same). */
static int seen_on_node(const swp_t *S, int j)
{
	for (int i = j / S->G * S->G; i < j; i++)
		if (S->sig[S->at[i]] == S->sig[S->at[j]])
			return 1;
	return 0;
}

/* The swaps (align.c's header), at most `budget` of them. */
static void swap_search(swp_t *S, int budget, uint8_t *stuck)
{
	int G = S->G;
	for (int it = 0; it < budget; it++) {
		int c = -1;
		double gain = 0;
		for (int k = 0; k < S->nc; k++) {
			double p = class_price(S, k), g = p - (S->touch[k] < 2 ? 0 : S->W[k] / S->K);
			if (!stuck[k] && g > gain * (1 + 1e-12))
				c = k, gain = g;
		}
		if (c < 0)
			break;
		int qa = -1;
		for (int q = 0; q < S->nodes; q++) {
			int n = S->cnt[(size_t)c * S->nodes + q];
			if (n && (qa < 0 || n < S->cnt[(size_t)c * S->nodes + qa]))
				qa = q;
		}
		double best = -1e-9 * gain;
		int bx = -1, by = -1;
		for (int i = 0; i < G; i++) {
			int x = S->at[qa * G + i];
			if (seen_on_node(S, qa * G + i))
				continue;
			for (int j = 0; j < S->N; j++) {
				int y = S->at[j];
				if (j / G == qa || S->mem[(size_t)x * S->nc + c] ==
							   S->mem[(size_t)y * S->nc + c] ||
				    seen_on_node(S, j))
					continue;
				double d = swap_eval(S, x, y, 0);
				if (d < best)
					best = d, bx = x, by = y;
			}
		}
		if (bx < 0)
			stuck[c] = 1;
		else
			swap_eval(S, bx, by, 1);
	}
}

/* The classes of the parameters (np of them, weights w, held per device
 * in bits) and the swap search from numbering new_id; new_id updated,
 * *price the longest chain after: the most the classes of one device
 * cost together. */
static int align_swaps(planner_t *pl, const uint8_t *bits, const double *w, int np,
		       int32_t *new_id, double *price)
{
	sp_arena_t *a = &pl->scratch;
	int N = pl->N, G = pl->cluster->gpus_per_node, nodes = pl->cluster->nodes;
	int *cls = sp_arena_calloc(a, (size_t)np + 1, sizeof(int));
	uint64_t *h = sp_arena_calloc(a, (size_t)np + 1, sizeof(uint64_t));
	if (!cls || !h)
		return SP_ENOMEM;
	swp_t S = {.nodes = nodes, .G = G, .N = N,
		   .K = pl->cluster->nics > 0 ? pl->cluster->nics : 1};
	for (int p = 0; p < np; p++) { /* FNV-1a over the holders */
		h[p] = 1469598103934665603ull;
		for (int d = 0; d < N; d++)
			if (bits[(size_t)d * np + p])
				h[p] = (h[p] ^ (uint64_t)d) * 1099511628211ull;
	}
	for (int p = 0; p < np; p++) {
		cls[p] = -1;
		if (w[p] <= 0)
			continue;
		for (int q = 0; q < p && cls[p] < 0; q++) {
			if (w[q] <= 0 || h[q] != h[p])
				continue;
			int same = 1;
			for (int d = 0; d < N && same; d++)
				same = bits[(size_t)d * np + p] == bits[(size_t)d * np + q];
			if (same)
				cls[p] = cls[q];
		}
		if (cls[p] < 0)
			cls[p] = S.nc++;
	}
	S.W = sp_arena_calloc(a, (size_t)S.nc + 1, sizeof(double));
	S.cnt = sp_arena_calloc(a, (size_t)S.nc * nodes + 1, sizeof(int));
	S.hist = sp_arena_calloc(a, (size_t)S.nc * (G + 1) + 1, sizeof(int));
	S.touch = sp_arena_calloc(a, (size_t)S.nc + 1, sizeof(int));
	uint8_t *mem = sp_arena_calloc(a, (size_t)N * S.nc + 1, 1);
	uint8_t *stuck = sp_arena_calloc(a, (size_t)S.nc + 1, 1);
	S.pos = new_id;
	S.at = sp_arena_calloc(a, (size_t)N, sizeof(int32_t));
	if (!S.W || !S.cnt || !S.hist || !S.touch || !mem || !stuck || !S.at)
		return SP_ENOMEM;
	S.mem = mem;
	int *sig = sp_arena_calloc(a, (size_t)N, sizeof(int));
	uint64_t *dh = sp_arena_calloc(a, (size_t)N, sizeof(uint64_t));
	if (!sig || !dh)
		return SP_ENOMEM;
	S.sig = sig;
	for (int p = 0; p < np; p++)
		if (cls[p] >= 0)
			S.W[cls[p]] += w[p];
	for (int d = 0; d < N; d++) {
		S.at[new_id[d]] = d;
		for (int p = 0; p < np; p++)
			if (cls[p] >= 0 && bits[(size_t)d * np + p] && !mem[(size_t)d * S.nc + cls[p]]) {
				mem[(size_t)d * S.nc + cls[p]] = 1;
				class_move(&S, cls[p], new_id[d] / G, 1);
			}
	}
	for (int d = 0; d < N; d++) { /* class sets: hashed, then compared */
		const uint8_t *m = mem + (size_t)d * S.nc;
		dh[d] = 1469598103934665603ull;
		for (int c = 0; c < S.nc; c++)
			dh[d] = (dh[d] ^ m[c]) * 1099511628211ull;
		sig[d] = d;
		for (int e = 0; e < d && sig[d] == d; e++)
			if (sig[e] == e && dh[e] == dh[d] &&
			    !memcmp(mem + (size_t)e * S.nc, m, (size_t)S.nc))
				sig[d] = e;
	}
	swap_search(&S, 4 * S.nc, stuck);
	/* the longest chain: the most any device's classes cost together
	 * (their all-reduces queue on it one by one) */
	double *pc = sp_arena_calloc(a, (size_t)S.nc + 1, sizeof(double));
	if (!pc)
		return SP_ENOMEM;
	for (int c = 0; c < S.nc; c++)
		pc[c] = class_price(&S, c);
	*price = 0;
	for (int d = 0; d < N; d++) {
		double chain = 0;
		if (sig[d] != d)
			continue;
		for (int c = 0; c < S.nc; c++)
			chain += mem[(size_t)d * S.nc + c] ? pc[c] : 0;
		*price = chain > *price ? chain : *price;
	}
	return 0;
}

/*
 * The blocks on nodes (devices ad[] sorted by cmp_adev) into new_id: each
 * block of n = q G + r devices fills q whole nodes, its last r devices
 * wait; with spread, a block whose r is at most G/2 takes q + 1 nodes
 * instead, G - r of them with one slot left (so each of its nodes has at
 * least G - 1 of its GPUs, not r on the last), when it has that many.
 * Then the waiting devices, heaviest block first, by best fit: the
 * fullest node with room for all of the block's, else from the emptiest.
 */
static int align_pack(planner_t *pl, const adev_t *ad, int spread, int32_t *new_id)
{
	int N = pl->N, G = pl->cluster->gpus_per_node, nodes = pl->cluster->nodes;
	int node = 0, n_rest = 0, later = 0;
	int *fill = sp_arena_calloc(&pl->scratch, (size_t)nodes + 1, sizeof(int));
	const adev_t **rest = sp_arena_calloc(&pl->scratch, (size_t)N, sizeof *rest);
	if (!fill || !rest)
		return SP_ENOMEM;
	for (int i = 0; i < N;) { /* later: whole nodes the blocks after need */
		int j = i;
		while (j < N && ad[j].block == ad[i].block)
			j++;
		later += (j - i) / G;
		i = j;
	}
	for (int i = 0; i < N;) {
		int j = i;
		while (j < N && ad[j].block == ad[i].block)
			j++;
		int n = j - i, q = n / G, r = n % G, holes = 0;
		later -= q;
		/* a node more, while every block after still finds its whole nodes */
		if (spread && r > 0 && 2 * r <= G && q >= G - r && node + q + 1 + later <= nodes)
			holes = G - r, q++;
		for (int t = 0, k = i; t < q; t++, node++)
			for (int c = 0; c < G - (t < holes); c++, k++)
				new_id[ad[k].dev] = node * G + fill[node]++;
		for (int k = i + q * G - holes; k < j; k++)
			rest[n_rest++] = &ad[k];
		i = j;
	}
	for (int i = 0; i < n_rest;) {
		int j = i;
		while (j < n_rest && rest[j]->block == rest[i]->block)
			j++;
		int need = j - i, best = -1;
		for (int q = 0; q < nodes; q++) /* best fit: fullest with room */
			if (G - fill[q] >= need && (best < 0 || fill[q] > fill[best]))
				best = q;
		for (int k = i; k < j;) {
			int q = best;
			if (q < 0) /* no room for all: the emptiest first */
				for (int t = 0; t < nodes; t++)
					if (fill[t] < G && (q < 0 || fill[t] < fill[q]))
						q = t;
			for (; k < j && fill[q] < G; k++)
				new_id[rest[k]->dev] = q * G + fill[q]++;
		}
		i = j;
	}
	return 0;
}

/* new_id[old] for the slices of s placed by pc; *changed 0 when it is
 * the identity. Work arrays in pl->scratch (the caller's scope). */
static int align_numbers(planner_t *pl, const sched_t *s, const place_t *pc, int32_t *new_id,
			 int *changed)
{
	const sp_model_t *md = pl->model;
	int N = pl->N, nc = md->n_comps, np = 0;
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
	if (!bits || !w || !pcomp || !cw || !by || !ad)
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
	/* both packings, each mended by swaps; the shorter longest chain wins
	 * (ties: without spreading) */
	int32_t *alt = sp_arena_calloc(a, (size_t)N, sizeof(int32_t));
	double price[2];
	int rc;
	if (!alt)
		return SP_ENOMEM;
	for (int spread = 0; spread < 2; spread++) {
		int32_t *ids = spread ? alt : new_id;
		if ((rc = align_pack(pl, ad, spread, ids)) ||
		    (rc = align_swaps(pl, bits, w, np, ids, &price[spread])))
			return rc;
	}
	if (price[1] < price[0] * (1 - 1e-9))
		memcpy(new_id, alt, sizeof(int32_t) * (size_t)N);
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
	/* a slice whose devices the scheduler left out of ascending order
	 * (sched_pack.c's hand-over order: which samples each slot holds)
	 * keeps its order, renumbered; the rest stay ascending */
	for (int i = 0; i < s->n; i++) {
		int32_t *d = pc->devs + pc->off[i];
		int asc = 1;
		for (int j = 1; j < s->s[i].n; j++)
			asc &= d[j - 1] < d[j];
		for (int j = 0; j < s->s[i].n; j++)
			d[j] = new_id[d[j]];
		if (asc)
			devs_sort(d, s->s[i].n);
	}
	return 0;
}
