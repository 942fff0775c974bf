/*
 * arena.c — the planner's per-run bump allocator and the growable-array
 * helper. Arena memory is zeroed and lives until sp_arena_release.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

struct sp_arena_block {
	sp_arena_block_t *next;
	size_t cap, used;
	max_align_t data[];
};

void sp_arena_init(sp_arena_t *a)
{
	a->head = NULL;
	a->used_total = 0;
	a->spare = NULL;
}

static void free_blocks(sp_arena_block_t *b)
{
	while (b) {
		sp_arena_block_t *n = b->next;
		free(b);
		b = n;
	}
}

void sp_arena_release(sp_arena_t *a)
{
	if (!a)
		return;
	free_blocks(a->head);
	free_blocks(a->spare);
	a->head = NULL;
	a->spare = NULL;
	a->used_total = 0;
}

/* A block with room for n bytes: the smallest spare one that has it (a
 * large block is not spent on a small need), else a new one of at least
 * 1 MiB. */
static sp_arena_block_t *new_block(sp_arena_t *a, size_t n)
{
	sp_arena_block_t **best = NULL;
	for (sp_arena_block_t **pp = &a->spare; *pp; pp = &(*pp)->next)
		if ((*pp)->cap >= n && (!best || (*pp)->cap < (*best)->cap))
			best = pp;
	if (best) {
		sp_arena_block_t *b = *best;
		*best = b->next;
		return b;
	}
	size_t cap = n > (1u << 20) ? n : (1u << 20);
	sp_arena_block_t *b = malloc(sizeof *b + cap);
	if (b)
		b->cap = cap;
	return b;
}

void *sp_arena_alloc(sp_arena_t *a, size_t n)
{
	if (n > ((size_t)1 << 40))
		return NULL;
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	sp_arena_block_t *b = a->head;
	if (!b || b->cap - b->used < n) {
		if (!(b = new_block(a, n)))
			return NULL;
		b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	void *p = (char *)b->data + b->used;
	b->used += n;
	a->used_total += n;
	memset(p, 0, n);
	return p;
}

void *sp_arena_calloc(sp_arena_t *a, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size)
		return NULL;
	return sp_arena_alloc(a, count * size);
}

sp_arena_mark_t sp_arena_mark(const sp_arena_t *a)
{
	sp_arena_mark_t m = {a->head, a->head ? a->head->used : 0, a->used_total};
	return m;
}

void sp_arena_reset(sp_arena_t *a, sp_arena_mark_t m)
{
	while (a->head && a->head != m.block) {
		sp_arena_block_t *n = a->head->next;
		a->head->next = a->spare;
		a->spare = a->head;
		a->head = n;
	}
	if (a->head)
		a->head->used = m.used;
	a->used_total = m.used_total;
}

/* The doubled capacity that holds need elements, or -1 past 2^30. */
static int grown_cap(int cap, int need)
{
	int nc = cap ? cap : 8;
	while (nc < need) {
		if (nc > (1 << 29))
			return -1;
		nc *= 2;
	}
	return nc;
}

int sp_arena_grow(sp_arena_t *a, void **p, int *cap, int need, size_t sz)
{
	if (need <= *cap)
		return 0;
	int nc = grown_cap(*cap, need);
	void *np = nc < 0 ? NULL : sp_arena_calloc(a, (size_t)nc, sz);
	if (!np)
		return SP_ENOMEM;
	if (*cap)
		memcpy(np, *p, (size_t)*cap * sz);
	*p = np;
	*cap = nc;
	return 0;
}

int sp_grow(void **p, int *cap, int need, size_t sz)
{
	if (need <= *cap)
		return 0;
	int nc = grown_cap(*cap, need);
	void *np = nc < 0 ? NULL : realloc(*p, (size_t)nc * sz);
	if (!np)
		return SP_ENOMEM;
	memset((char *)np + (size_t)*cap * sz, 0, (size_t)(nc - *cap) * sz);
	*p = np;
	*cap = nc;
	return 0;
}
