/*
 * heap.c — the simulator's priority queues (fluid.c): entries (t, id),
 * least t first, ties by least id, in a 4-ary heap. With pos (per id: its
 * index, -1 when absent) it is indexed: an id has at most one entry, whose
 * key can change or which can leave from the middle.
 *
 * Why 4-ary: the simulator's queues hold up to ~10^5 jobs and mostly pop
 * and re-key; four children share a cache line (4 x 16 bytes), so a sift
 * down touches half the lines of a binary heap's for the same comparisons
 * per level. The order entries come out in is that of (t, id) alone, so
 * it is the same for any correct heap: keys must be ordered (no NaN) and
 * ids distinct within a heap. Room is the caller's: e holds every entry.
 */
#include "planner.h"

#define ARITY 4

static int before(fl_ev_t a, fl_ev_t b)
{
	return a.t < b.t || (a.t == b.t && a.id < b.id);
}

static void put(fl_heap_t *h, int k, fl_ev_t x)
{
	h->e[k] = x;
	if (h->pos)
		h->pos[x.id] = k;
}

/* The least of k's children, -1 when it has none; four (most nodes) in
 * two pairs and their winners, fewer one by one (ids are distinct: the
 * least is the same either way). */
static inline __attribute__((always_inline)) int least_child(const fl_heap_t *h, int k)
{
	int c = ARITY * k + 1;
	const fl_ev_t *e = h->e;
	if (c + ARITY <= h->n) {
		int a = before(e[c + 1], e[c]) ? c + 1 : c;
		int b = before(e[c + 3], e[c + 2]) ? c + 3 : c + 2;
		return before(e[b], e[a]) ? b : a;
	}
	if (c >= h->n)
		return -1;
	int m = c;
	for (int i = c + 1; i < h->n; i++)
		if (before(e[i], e[m]))
			m = i;
	return m;
}

/* Entry x, to go at k, moved down to its place. */
static void down(fl_heap_t *h, int k, fl_ev_t x)
{
	for (int m; (m = least_child(h, k)) >= 0 && before(h->e[m], x); k = m)
		put(h, k, h->e[m]);
	put(h, k, x);
}

/* Entry k moved up, or else down, to its place. */
static void fix(fl_heap_t *h, int k)
{
	fl_ev_t x = h->e[k];
	if (k > 0 && before(x, h->e[(k - 1) / ARITY])) {
		do {
			int up = (k - 1) / ARITY;
			put(h, k, h->e[up]);
			k = up;
		} while (k > 0 && before(x, h->e[(k - 1) / ARITY]));
		put(h, k, x);
		return;
	}
	down(h, k, x);
}

void heap_push(fl_heap_t *h, fl_ev_t x)
{
	put(h, h->n++, x);
	fix(h, h->n - 1);
}

void heap_del(fl_heap_t *h, int k)
{
	if (h->pos)
		h->pos[h->e[k].id] = -1;
	if (k < --h->n) {
		put(h, k, h->e[h->n]);
		fix(h, k);
	}
}

void heap_replace(fl_heap_t *h, int k, fl_ev_t x)
{
	if (h->pos)
		h->pos[h->e[k].id] = -1;
	put(h, k, x);
	fix(h, k);
}

/*
 * The root's entry gone, x (from the end: mostly among the largest) in
 * its place, bottom-up: the hole goes down to a leaf along least
 * children, then x rises from there, mostly not at all. Per level that
 * is one comparison fewer than moving x down (x against the least
 * child); the simulator's event heap pops from ~10^4 entries.
 */
static void refill_root(fl_heap_t *h, fl_ev_t x)
{
	int k = 0;
	for (int m; (m = least_child(h, k)) >= 0; k = m)
		put(h, k, h->e[m]);
	while (k > 0 && before(x, h->e[(k - 1) / ARITY])) {
		int up = (k - 1) / ARITY;
		put(h, k, h->e[up]);
		k = up;
	}
	put(h, k, x);
}

fl_ev_t heap_pop(fl_heap_t *h)
{
	fl_ev_t top = h->e[0];
	if (h->pos)
		h->pos[top.id] = -1;
	if (--h->n > 0)
		refill_root(h, h->e[h->n]);
	return top;
}

void heap_set(fl_heap_t *h, int id, double t)
{
	if (h->pos[id] < 0) {
		heap_push(h, (fl_ev_t){t, id, 0});
		return;
	}
	h->e[h->pos[id]].t = t;
	fix(h, h->pos[id]);
}

void heap_build(fl_heap_t *h)
{
	for (int k = 0; k < h->n; k++)
		if (h->pos)
			h->pos[h->e[k].id] = k;
	for (int k = (h->n - 2) / ARITY; k >= 0 && h->n > 1; k--)
		down(h, k, h->e[k]);
}

void heap_replace_top(fl_heap_t *h, fl_ev_t x)
{
	if (h->pos)
		h->pos[h->e[0].id] = -1;
	down(h, 0, x);
}
