/*
 * test_heap.c — the simulator's 4-ary heaps (planner/heap.c) against a
 * brute-force model: random pushes, pops, re-keys (up and down),
 * deletions from the middle and entries replaced by another id's, with
 * many equal keys (ties go to the least id) and infinite ones; after
 * every operation the heap property, the index (pos) of every id
 * present and absent, and the least entry the model says. Also a heap built from an array in one go (heap_build), the
 * plain (unindexed) heap, and the sizes around a full last level.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define IDS 300

static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Keys with many ties: a few small integers, now and then infinity. */
static double rand_key(void)
{
	uint64_t r = next_rand() % 50;
	return r == 0 ? HUGE_VAL : (double)(r % 7);
}

static int before(fl_ev_t a, fl_ev_t b)
{
	return a.t < b.t || (a.t == b.t && a.id < b.id);
}

/* The heap property, and pos (when indexed) against the model's present
 * ids (key[id] when in[id]). */
static void check(const fl_heap_t *h, const int *in, const double *key, int n_ids)
{
	int present = 0;
	for (int k = 0; k < h->n; k++) {
		if (k > 0)
			assert_false(before(h->e[k], h->e[(k - 1) / 4]));
		if (h->pos) {
			assert_int_equal(h->pos[h->e[k].id], k);
			assert_true(in[h->e[k].id]);
			assert_true(h->e[k].t == key[h->e[k].id]);
		}
	}
	if (!h->pos)
		return;
	for (int id = 0; id < n_ids; id++) {
		present += in[id];
		if (!in[id])
			assert_int_equal(h->pos[id], -1);
	}
	assert_int_equal(present, h->n);
}

/* The model's least present (key, id); -1 when none. */
static int least(const int *in, const double *key, int n_ids)
{
	int best = -1;
	for (int id = 0; id < n_ids; id++)
		if (in[id] && (best < 0 || before((fl_ev_t){key[id], id, 0}, (fl_ev_t){key[best], best, 0})))
			best = id;
	return best;
}

static void test_indexed_random(void **state)
{
	(void)state;
	fl_ev_t e[IDS];
	int pos[IDS], in[IDS] = {0};
	double key[IDS];
	fl_heap_t h = {.e = e, .pos = pos};
	for (int id = 0; id < IDS; id++)
		pos[id] = -1;
	for (int step = 0; step < 40000; step++) {
		int id = (int)(next_rand() % IDS), op = (int)(next_rand() % 5),
		    other = (int)(next_rand() % IDS);
		if (op == 0 || (op == 3 && !in[id])) { /* set: add or re-key */
			key[id] = rand_key();
			heap_set(&h, id, key[id]);
			in[id] = 1;
		} else if (op == 1 && h.n > 0) { /* pop the least */
			int want = least(in, key, IDS);
			fl_ev_t top = heap_pop(&h);
			assert_int_equal(top.id, want);
			assert_true(top.t == key[want]);
			in[want] = 0;
		} else if (op == 2 && in[id]) { /* leave from wherever it is */
			heap_del(&h, pos[id]);
			in[id] = 0;
		} else if (op == 3) { /* re-key down or up by one */
			key[id] += next_rand() % 2 ? 1 : -1;
			heap_set(&h, id, key[id]);
		} else if (op == 4 && in[id] && !in[other]) { /* another id in its place */
			key[other] = rand_key();
			heap_replace(&h, pos[id], (fl_ev_t){key[other], other, 0});
			in[id] = 0;
			in[other] = 1;
		}
		check(&h, in, key, IDS);
		if (h.n > 0)
			assert_int_equal(h.e[0].id, least(in, key, IDS));
	}
	/* the rest comes out in (key, id) order */
	while (h.n > 0) {
		int want = least(in, key, IDS);
		assert_int_equal(heap_pop(&h).id, want);
		in[want] = 0;
		check(&h, in, key, IDS);
	}
}

static void test_build(void **state)
{
	(void)state;
	fl_ev_t e[IDS];
	int pos[IDS], in[IDS];
	double key[IDS];
	/* every size up to a few levels, each from a shuffled array */
	for (int n = 0; n <= 90; n++) {
		fl_heap_t h = {.e = e, .pos = pos};
		for (int id = 0; id < IDS; id++) {
			pos[id] = -1;
			in[id] = 0;
		}
		for (int i = 0; i < n; i++) {
			int id = (i * 37 + n) % IDS; /* distinct for n <= IDS */
			key[id] = rand_key();
			in[id] = 1;
			e[h.n++] = (fl_ev_t){key[id], id, 0};
		}
		heap_build(&h);
		check(&h, in, key, IDS);
		for (int i = 0; i < n; i++) {
			int want = least(in, key, IDS);
			fl_ev_t top = heap_pop(&h);
			assert_int_equal(top.id, want);
			in[want] = 0;
			check(&h, in, key, IDS);
		}
		assert_int_equal(h.n, 0);
	}
}

static void test_plain(void **state)
{
	(void)state;
	fl_ev_t e[IDS];
	fl_heap_t h = {.e = e};
	double key[IDS];
	int in[IDS] = {0};
	for (int id = IDS - 1; id >= 0; id--) { /* pushed in reverse id order */
		key[id] = rand_key();
		heap_push(&h, (fl_ev_t){key[id], id, 0});
		in[id] = 1;
		check(&h, in, key, IDS);
	}
	fl_ev_t last = {-HUGE_VAL, -1, 0};
	for (int i = 0; i < IDS; i++) {
		fl_ev_t top = heap_pop(&h);
		assert_true(before(last, top));
		assert_int_equal(top.id, least(in, key, IDS));
		in[top.id] = 0;
		last = top;
	}
	assert_int_equal(h.n, 0);
}

/* heap_replace_top (fluid.c's senders' queues: a sender's first leaves,
 * its next takes its place), indexed and plain: the least entry out, an
 * absent id in with a random key, against the model. */
static void test_replace_top(void **state)
{
	(void)state;
	for (int indexed = 0; indexed < 2; indexed++) {
		fl_ev_t e[IDS];
		int pos[IDS], in[IDS] = {0};
		double key[IDS];
		fl_heap_t h = {.e = e, .pos = indexed ? pos : NULL};
		for (int id = 0; id < IDS; id++)
			pos[id] = -1;
		for (int id = 0; id < IDS / 3; id++) {
			key[id] = rand_key();
			heap_push(&h, (fl_ev_t){key[id], id, 0});
			in[id] = 1;
		}
		for (int step = 0; step < 20000; step++) {
			int want = least(in, key, IDS), id = (int)(next_rand() % IDS);
			assert_int_equal(h.e[0].id, want);
			while (in[id] && id != want)
				id = (id + 1) % IDS;
			in[want] = 0;
			key[id] = rand_key();
			heap_replace_top(&h, (fl_ev_t){key[id], id, 0});
			in[id] = 1;
			if (indexed && id != want)
				assert_int_equal(pos[want], -1);
			check(&h, in, key, IDS);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_indexed_random),
		cmocka_unit_test(test_build),
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_replace_top),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
