/*
 * test_arena.c — the planner's memory policy (schemas/arena.c): marks are
 * LIFO scopes, a reset gives back exactly what was allocated since its
 * mark (blocks freed, the bump pointer restored, memory zeroed again), and
 * arena-grown arrays keep their contents. LeakSanitizer checks that every
 * block freed by a reset or the final release is gone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common.h"

#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_TEST_ASAN 1
#endif
#endif
#ifdef ARENA_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

static void test_mark_reset(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	sp_arena_mark_t empty = sp_arena_mark(&a);
	char *keep = sp_arena_alloc(&a, 100);
	assert_non_null(keep);
	memset(keep, 7, 100);
	size_t used_keep = a.used_total;
	sp_arena_mark_t m = sp_arena_mark(&a);
	/* small ones in the same block, big ones in blocks of their own */
	for (int i = 0; i < 50; i++) {
		char *p = sp_arena_alloc(&a, i % 7 == 0 ? (3u << 20) : 1000);
		assert_non_null(p);
		memset(p, 0xff, 1000);
	}
	assert_true(a.used_total > used_keep);
	sp_arena_reset(&a, m);
	assert_int_equal(a.used_total, used_keep);
	for (int i = 0; i < 100; i++)
		assert_int_equal(keep[i], 7);
	/* what comes next is zeroed again, right after keep (and, under ASan,
	 * its red zone: used_keep is all keep took) */
	unsigned char *q = sp_arena_alloc(&a, 1000);
	assert_non_null(q);
	assert_ptr_equal(q, keep + used_keep);
#ifdef ARENA_TEST_ASAN
	/* ASan knows what is live: keep's 100 bytes, not the byte past them,
	 * nor what the reset gave back beyond q */
	assert_false(__asan_address_is_poisoned(keep + 99));
	assert_true(__asan_address_is_poisoned(keep + 100));
	assert_false(__asan_address_is_poisoned(q + 999));
	assert_true(__asan_address_is_poisoned(q + 1000));
	assert_true(__asan_address_is_poisoned(q + 4096));
#endif
	for (int i = 0; i < 1000; i++)
		assert_int_equal(q[i], 0);
	sp_arena_reset(&a, empty);
	assert_null(a.head);
	assert_int_equal(a.used_total, 0);
	sp_arena_release(&a);
}

static void test_grow(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	int *v = NULL, cap = 0;
	for (int i = 0; i < 5000; i++) {
		assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, i + 1, sizeof *v), 0);
		assert_true(cap >= i + 1);
		v[i] = i * 3;
	}
	for (int i = 0; i < 5000; i++)
		assert_int_equal(v[i], i * 3);
	for (int i = 5000; i < cap; i++)
		assert_int_equal(v[i], 0);
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, INT32_MAX, sizeof *v), SP_ENOMEM);
	sp_arena_release(&a);
}

/* A grown array that is its block's last allocation stays where it is
 * (contents, zeroed new room); one that is not moves and keeps its
 * contents, the allocation after it untouched; a large one moves to a
 * block with room for two more doublings in place. */
static void test_grow_in_place(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	sp_arena_mark_t empty = sp_arena_mark(&a);
	/* junk where the arrays will be: growth must zero the new room */
	char *junk = sp_arena_alloc(&a, 4096);
	assert_non_null(junk);
	memset(junk, 0xab, 4096);
	sp_arena_reset(&a, empty);
	int *v = NULL, cap = 0;
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, 8, sizeof *v), 0);
	for (int i = 0; i < 8; i++)
		v[i] = i + 1;
	int *first = v;
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, 9, sizeof *v), 0);
	assert_ptr_equal(v, first);
	assert_int_equal(cap, 16);
	for (int i = 0; i < 16; i++)
		assert_int_equal(v[i], i < 8 ? i + 1 : 0);
#ifdef ARENA_TEST_ASAN
	assert_false(__asan_address_is_poisoned(v + 15));
	assert_true(__asan_address_is_poisoned(v + 16));
#endif
	/* another allocation after it: the next growth copies */
	char *other = sp_arena_alloc(&a, 40);
	assert_non_null(other);
	memset(other, 5, 40);
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, 17, sizeof *v), 0);
	assert_ptr_not_equal(v, first);
	assert_int_equal(cap, 32);
	for (int i = 0; i < 32; i++)
		assert_int_equal(v[i], i < 8 ? i + 1 : 0);
	for (int i = 0; i < 40; i++)
		assert_int_equal(other[i], 5);
	/* used_total counts what in-place growth took: a reset to before
	 * everything gives it all back */
	assert_true(a.used_total >= 32 * sizeof *v + 16 * sizeof *v + 40);
	sp_arena_reset(&a, empty);
	assert_int_equal(a.used_total, 0);
	/* large: moved once into a block with room, then in place twice */
	double *w = NULL;
	int wcap = 0;
	assert_int_equal(sp_arena_grow(&a, (void **)&w, &wcap, 1 << 18, sizeof *w), 0);
	double *big = w;
	for (int i = 0; i < wcap; i++)
		w[i] = i;
	assert_int_equal(sp_arena_grow(&a, (void **)&w, &wcap, (1 << 18) + 1, sizeof *w), 0);
	assert_ptr_equal(w, big);
	assert_int_equal(sp_arena_grow(&a, (void **)&w, &wcap, (1 << 19) + 1, sizeof *w), 0);
	assert_ptr_equal(w, big);
	assert_int_equal(wcap, 1 << 20);
	for (int i = 0; i < wcap; i++)
		assert_true(w[i] == (i < (1 << 18) ? i : 0));
	sp_arena_release(&a);
}

/* A large array's growth asks for at most 64 MiB of room beyond its new
 * size (not 4x): 32 MiB moves into a block of 96 MiB, so it grows in place
 * to 64 MiB and moves again at 128 MiB (with 4x room it would not). */
static void test_grow_room_capped(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	char *v = NULL;
	int cap = 0;
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, 32 << 20, 1), 0);
	assert_int_equal(cap, 32 << 20);
	char *at32 = v;
	v[0] = 7;
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, (32 << 20) + 1, 1), 0);
	assert_int_equal(cap, 64 << 20);
	assert_ptr_equal(v, at32);
	assert_int_equal(sp_arena_grow(&a, (void **)&v, &cap, (64 << 20) + 1, 1), 0);
	assert_int_equal(cap, 128 << 20);
	assert_ptr_not_equal(v, at32);
	assert_int_equal(v[0], 7);
	assert_int_equal(v[(128 << 20) - 1], 0);
	sp_arena_release(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mark_reset),
		cmocka_unit_test(test_grow),
		cmocka_unit_test(test_grow_in_place),
		cmocka_unit_test(test_grow_room_capped),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
