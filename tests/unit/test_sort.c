/*
 * test_sort.c — planner/sort.h's inlined sort against qsort with the
 * matching comparator: for (double key, distinct id) pairs (the placer's
 * and the lanes' orders) with many equal keys, negative zeros and
 * infinities, and for plain int32 lists; random, ascending, descending,
 * all-equal-key and organ-pipe inputs of every length 0..300 and some
 * longer. The arrays must come out equal byte for byte (a total order
 * has one sorted array).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sort.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	double key;
	int id;
} kid_t;

#define KID_BEFORE(x, y) ((x).key < (y).key || ((x).key == (y).key && (x).id < (y).id))
SP_SORT_DEFINE(kid_sort, kid_t, KID_BEFORE)

#define I32_BEFORE(x, y) ((x) < (y))
SP_SORT_DEFINE(i32_sort, int32_t, I32_BEFORE)

static int cmp_kid(const void *a, const void *b)
{
	const kid_t *x = a, *y = b;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

static uint64_t rng = 1;

/* Knuth's MMIX linear congruential generator, its high bits */
static uint64_t next_rand(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return rng >> 17;
}

enum { RANDOM, ASCENDING, DESCENDING, SAME_KEY, ORGAN, SHAPES };

static double shaped_key(int shape, int i, int n)
{
	uint64_t r = next_rand();
	switch (shape) {
	case ASCENDING: return i;
	case DESCENDING: return n - i;
	case SAME_KEY: return 1.5;
	case ORGAN: return i < n / 2 ? i : n - i;
	default:
		return r % 97 == 0 ? HUGE_VAL : r % 89 == 0 ? -0.0 : r % 83 == 0 ? 0.0
						    : (double)(r % 13);
	}
}

static void check_kid(int n, int shape)
{
	kid_t *a = calloc((size_t)n + 1, sizeof *a), *b = calloc((size_t)n + 1, sizeof *b);
	assert_non_null(a);
	assert_non_null(b);
	/* distinct ids in a random order */
	for (int i = 0; i < n; i++)
		a[i].id = i;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(next_rand() % (uint64_t)(i + 1)), t = a[i].id;
		a[i].id = a[j].id;
		a[j].id = t;
	}
	for (int i = 0; i < n; i++)
		a[i].key = shaped_key(shape, i, n);
	memcpy(b, a, sizeof *a * (size_t)n);
	kid_sort(a, n);
	qsort(b, (size_t)n, sizeof *b, cmp_kid);
	for (int i = 0; i < n; i++) {
		/* the same element: the key's bits (a negative zero stays one) */
		assert_int_equal(a[i].id, b[i].id);
		assert_memory_equal(&a[i].key, &b[i].key, sizeof a[i].key);
	}
	free(a);
	free(b);
}

static void check_i32(int n, int shape)
{
	int32_t *a = calloc((size_t)n + 1, sizeof *a), *b = calloc((size_t)n + 1, sizeof *b);
	assert_non_null(a);
	assert_non_null(b);
	for (int i = 0; i < n; i++)
		a[i] = shape == RANDOM ? (int32_t)(next_rand() % 2048) - 1024
				       : (int32_t)shaped_key(shape, i, n);
	memcpy(b, a, sizeof *a * (size_t)n);
	i32_sort(a, n);
	qsort(b, (size_t)n, sizeof *b, cmp_i32);
	assert_memory_equal(a, b, sizeof *a * (size_t)n + 1);
	free(a);
	free(b);
}

static void test_pairs(void **state)
{
	(void)state;
	for (int shape = 0; shape < SHAPES; shape++) {
		for (int n = 0; n <= 300; n++)
			check_kid(n, shape);
		for (int n = 1000; n <= 5000; n += 1000)
			check_kid(n, shape);
	}
}

static void test_ints(void **state)
{
	(void)state;
	for (int shape = 0; shape < SHAPES; shape++) {
		for (int n = 0; n <= 300; n++)
			check_i32(n, shape);
		check_i32(4096, shape);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pairs),
		cmocka_unit_test(test_ints),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
