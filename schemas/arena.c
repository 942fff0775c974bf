/*
 * arena.c — the planner's per-run bump allocator and the growable-array
 * helper. Arena memory is zeroed and lives until sp_arena_release.
 *
 * Under AddressSanitizer the arena tells ASan what is live: a block's
 * space is poisoned until handed out, each allocation is unpoisoned for
 * exactly the bytes asked for and followed by a poisoned red zone, and a
 * reset poisons what it takes back (spare blocks too). So a read or write past an arena
 * array, or into memory a mark gave back, is reported like a heap
 * overrun (the sanitized CI build runs every test this way); other
 * builds lay out and behave as before.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif
#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define REDZONE ((size_t)16)
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define REDZONE ((size_t)0)
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

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
 * 1 MiB, or of room (>= n) when that is more. */
static sp_arena_block_t *new_block(sp_arena_t *a, size_t n, size_t room)
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
	size_t cap = room > (1u << 20) ? room : (1u << 20);
	sp_arena_block_t *b = malloc(sizeof *b + cap);
	if (b)
		b->cap = cap;
	return b;
}

/* What an allocation of n bytes takes from its block: rounded up to 16,
 * plus the red zone. */
static size_t taken(size_t n)
{
	n = ((n + 15) & ~(size_t)15) + REDZONE;
	return n ? n : 16;
}

/* n bytes as sp_arena_alloc gives them, not zeroed yet (the caller
 * writes every byte before any is read). */
static void *arena_take(sp_arena_t *a, size_t n, size_t room)
{
	if (n > ((size_t)1 << 40))
		return NULL;
	size_t asked = n;
	n = taken(n);
	sp_arena_block_t *b = a->head;
	if (!b || b->cap - b->used < n) {
		if (!(b = new_block(a, n, room > n ? room : n)))
			return NULL;
		b->used = 0;
		b->next = a->head;
		a->head = b;
		POISON(b->data, b->cap);
	}
	void *p = (char *)b->data + b->used;
	b->used += n;
	a->used_total += n;
	UNPOISON(p, asked);
	return p;
}

void *sp_arena_alloc(sp_arena_t *a, size_t n)
{
	void *p = arena_take(a, n, 0);
	if (p)
		memset(p, 0, n);
	return p;
}

void *sp_arena_calloc(sp_arena_t *a, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size)
		return NULL;
	return sp_arena_alloc(a, count * size);
}

void *sp_arena_array(sp_arena_t *a, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size)
		return NULL;
	return arena_take(a, count * size, 0);
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
		POISON(a->head->data, a->head->cap);
		a->head->next = a->spare;
		a->spare = a->head;
		a->head = n;
	}
	if (a->head) {
		POISON((char *)a->head->data + m.used, a->head->cap - m.used);
		a->head->used = m.used;
	}
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

/*
 * An array that is the head block's last allocation grows in place while
 * the block has room: no copy, and no page touched but the new room's. One
 * that moves to a new block gets one with room for it grown twice more
 * (4x; pages past what is used are never touched), so a large array that
 * grows alone is copied once per three doublings instead of at each. The
 * room beyond the new size is capped at GROW_ROOM_MAX: an array of
 * hundreds of MiB does not ask malloc for 4x its size, which a strict
 * overcommit policy could refuse where the array itself would fit.
 */
#define GROW_ROOM_MAX ((size_t)64 << 20)

int sp_arena_grow(sp_arena_t *a, void **p, int *cap, int need, size_t sz)
{
	if (need <= *cap)
		return 0;
	int nc = grown_cap(*cap, need);
	if (nc < 0 || (sz && (size_t)nc > SIZE_MAX / sz) || (size_t)nc * sz > ((size_t)1 << 40))
		return SP_ENOMEM;
	size_t had = (size_t)*cap * sz, want = (size_t)nc * sz;
	sp_arena_block_t *b = a->head;
	if (*cap && b && (char *)*p + taken(had) == (char *)b->data + b->used &&
	    taken(want) - taken(had) <= b->cap - b->used) {
		size_t more = taken(want) - taken(had);
		b->used += more;
		a->used_total += more;
		UNPOISON(*p, want);
	} else {
		/* the old elements copied, into a block with room to grow in
		 * place: 4x, but at most GROW_ROOM_MAX beyond want, so that a
		 * large array's growth does not ask malloc for 4x its size
		 * (a refused room is a refused growth: SP_ENOMEM) */
		size_t room = want <= GROW_ROOM_MAX / 3 ? 4 * want : want + GROW_ROOM_MAX;
		void *np = arena_take(a, want, taken(room)); /* want <= 2^40 */
		if (!np)
			return SP_ENOMEM;
		if (*cap)
			memcpy(np, *p, had);
		*p = np;
	}
	/* only the new room zeroed */
	memset((char *)*p + had, 0, want - had);
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
