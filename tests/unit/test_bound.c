/*
 * test_bound.c — the lower convex hull behind the allotment bound and the
 * lanes' fluid widths (planner/bound.c). For many random time curves (with
 * plateaus, equal times and non-monotone stretches, as measured profiles
 * have) the hull must be convex, strictly faster-to-slower with strictly
 * falling area, and hull_area(C) must equal a brute-force minimum over
 * every single width and every mix of two widths that finishes within C.
 * The communication bound on a hand-built placement against hand-computed
 * bytes over NIC bandwidth; the communication bound of every plan
 * (bound_comm_solve) against hand-solved cases. The sync bound the walk
 * skips simulations on (bound_sync) against the simulated iteration of a
 * plan lowered from a hand-made schedule, once where compute dominates
 * (the releases must lift it above the bare sum of collectives) and once
 * where two tasks' collectives share the NICs (the links must lift it),
 * and in zero-1, where each all-gather after the step must count too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "hand_inputs.h"
#include "layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Least area of one width, or a mix of two, finishing within C. */
static double brute_area(const double *time, int nmax, int scales, double C)
{
	double best = HUGE_VAL;
	for (int i = 1; i <= nmax; i++) {
		double ti = time[i], ai = ti * (scales ? i : 1);
		if (ti <= C)
			best = fmin(best, ai);
		for (int j = 1; j <= nmax; j++) {
			double tj = time[j], aj = tj * (scales ? j : 1);
			if (ti <= C && C < tj) {
				double f = (C - ti) / (tj - ti);
				best = fmin(best, ai + f * (aj - ai));
			}
		}
	}
	return best;
}

static void check_curve(const double *time, int nmax, int scales)
{
	hull_t h;
	sp_arena_t a;
	sp_arena_init(&a);
	assert_int_equal(hull_from_times(&a, time, nmax, scales, &h), 0);
	assert_true(h.n >= 1);
	for (int i = 1; i < h.n; i++) {
		assert_true(h.t[i] > h.t[i - 1]);
		assert_true(h.a[i] < h.a[i - 1]);
	}
	for (int i = 2; i < h.n; i++) { /* slopes rise: convex */
		double s1 = (h.a[i - 1] - h.a[i - 2]) / (h.t[i - 1] - h.t[i - 2]);
		double s2 = (h.a[i] - h.a[i - 1]) / (h.t[i] - h.t[i - 1]);
		assert_true(s2 > s1 - 1e-9 * fabs(s1));
	}
	double tmin = HUGE_VAL, tmax = 0;
	for (int k = 1; k <= nmax; k++) {
		tmin = fmin(tmin, time[k]);
		tmax = fmax(tmax, time[k]);
	}
	assert_true(hull_area(&h, tmin * 0.99) == HUGE_VAL);
	for (int s = 0; s <= 200; s++) {
		double C = tmin + (tmax * 1.1 - tmin) * s / 200.0;
		double want = brute_area(time, nmax, scales, C), got = hull_area(&h, C);
		assert_true(fabs(got - want) <= 1e-9 * want);
	}
	/* every width's own point is on or above the hull */
	for (int k = 1; k <= nmax; k++)
		assert_true(hull_area(&h, time[k]) <= time[k] * (scales ? k : 1) * (1 + 1e-12));
	sp_arena_release(&a);
}

/* Data-parallel curves T(n) = a + b ceil(B/n), and variants of them. */
static void test_random_curves(void **state)
{
	(void)state;
	srand(7);
	for (int it = 0; it < 400; it++) {
		int nmax = 1 + rand() % 64, B = 1 + rand() % 256;
		double time[65];
		double a = 0.01 + (rand() % 100) / 100.0, b = 0.01 + (rand() % 100) / 50.0;
		int kind = it % 4;
		for (int k = 1; k <= nmax; k++) {
			double t = a + b * ((B + k - 1) / k);
			if (kind == 1) /* measured: a little noise, not monotone */
				t *= 1 + ((rand() % 21) - 10) / 200.0;
			else if (kind == 2) /* coarse plateaus, equal times */
				t = a + b * (((B + k - 1) / k + 7) / 8);
			else if (kind == 3) /* slower past a point */
				t += k > nmax / 2 ? 0.05 * b * k : 0;
			time[k] = t;
		}
		check_curve(time, nmax, it % 5 != 0);
	}
}

/* The case that once left a non-convex hull: a narrower width as fast as
 * the previous point, with less area, after a point that it hides. */
static void test_equal_time_replaces(void **state)
{
	(void)state;
	/* k: 1..4 -> times 10, 4, 4.9, 5 (k=3 beats k=4 on time and area) */
	double time[5] = {0, 10, 4, 4.9, 5};
	check_curve(time, 4, 1);
	double eq[5] = {0, 8, 4, 4, 3};
	check_curve(eq, 4, 1);
}

/* The communication bound by hand: 3 nodes of 4 GPUs, bf16 gradients.
 * Buckets {0,4} 1000 elements (nodes 0, 1), {4,8,9} 3000 (nodes 1, 2),
 * {1,2} 500 (node 0 alone: no NIC bytes). Node 1 carries the most:
 * (1000 + 3000) x 2 bytes = 8000 bytes over its NICs. */
static void test_comm_bound(void **state)
{
	(void)state;
	sp_device_t devs[12] = {0};
	for (int d = 0; d < 12; d++)
		devs[d].node = d / 4;
	int32_t bdevs[] = {0, 4, 4, 8, 9, 1, 2};
	sp_bucket_t bks[] = {{.n_dev = 2, .dev_off = 0, .elems = 1000},
			     {.n_dev = 3, .dev_off = 2, .elems = 3000},
			     {.n_dev = 2, .dev_off = 5, .elems = 500}};
	sp_plan_t p = {0};
	p.model.dtype = DT_BF16;
	p.n_devices = 12;
	p.devices = devs;
	p.n_buckets = 3;
	p.buckets = bks;
	p.bucket_devs = bdevs;
	sp_cluster_t c = {.nodes = 3, .gpus_per_node = 4, .inter_gbs = 50, .nics = 2};
	double t = -1;
	assert_int_equal(bound_comm(&t, &p, &c), 0);
	/* 8000 bytes / (2 NICs x 50 GB/s) = 8e-5 ms */
	assert_true(fabs(t - 8000.0 / (2 * 50e6)) < 1e-15);
	c.nics = 1;
	assert_int_equal(bound_comm(&t, &p, &c), 0);
	assert_true(fabs(t - 8000.0 / 50e6) < 1e-15);
	/* every group inside one node: nothing crosses a NIC */
	for (int d = 0; d < 12; d++)
		devs[d].node = 0;
	assert_int_equal(bound_comm(&t, &p, &c), 0);
	assert_true(t == 0);
}

/* One group of 160 device-ms and 1e6 bytes, G = 8, the NICs carrying 1e6
 * bytes per ms: in T it needs m = ceil(20 / T) nodes, so m 1e6 <= T 1e6,
 * ceil(20 / T) <= T, first at T = 5 (4 nodes); at T in (sqrt 20, 5) it
 * needs 5 nodes. A group whose spread costs more than its work on one node
 * (64 device-ms, 1e9 bytes) stays there: T = 64 / 8. Two groups of 160
 * add up: 2 ceil(20 / T) <= T first at T = 20/3 (3 nodes each: 6 <= 6.67;
 * at T in (sqrt 40, 20/3) each needs 4, 8 > T). No group, no bound. */
static void test_comm_any(void **state)
{
	(void)state;
	double W1[] = {160}, S1[] = {1e6};
	double t = bound_comm_solve(W1, S1, 1, 8, 1e6);
	assert_true(fabs(t - 5.0) < 1e-6);
	double W2[] = {64}, S2[] = {1e9};
	t = bound_comm_solve(W2, S2, 1, 8, 1e6);
	assert_true(fabs(t - 8.0) < 1e-6);
	double W3[] = {160, 160}, S3[] = {1e6, 1e6};
	t = bound_comm_solve(W3, S3, 2, 8, 1e6);
	assert_true(fabs(t - 20.0 / 3) < 1e-6);
	assert_true(bound_comm_solve(W1, S1, 0, 8, 1e6) == 0);
}

/* Two nodes of two GPUs, inter-node links at inter GB/s, one NIC each. */
static void two_nodes(char *buf, size_t cap, double inter)
{
	snprintf(buf, cap,
		 "{\"format\": \"spindle.cluster/1\", \"name\": \"two\", \"nodes\": 2,"
		 " \"gpus_per_node\": 2,"
		 " \"gpu\": {\"name\": \"g\", \"memory_gib\": 80, \"peak_tflops\": 100,"
		 " \"mem_bandwidth_gbs\": 2000},"
		 " \"links\": {\"intra_node_gbs\": 200, \"intra_node_latency_us\": 3,"
		 " \"inter_node_gbs\": %g, \"inter_node_latency_us\": 10}}",
		 inter);
}

/* Tasks t1 and t2 alike: an embedding, 4 layers of 'a', a classifier. */
static const char SYNC_MODEL[] =
	"{'format': 'spindle.model/1', 'name': 'sync', 'components': {"
	"'e1': {'type': 'embedding', 'vocab': 16, 'hidden': 1024, 'max_seq': 64},"
	"'e2': {'type': 'embedding', 'vocab': 16, 'hidden': 1024, 'max_seq': 64},"
	"'a': {'type': 'transformer', 'layers': 4, 'hidden': 1024, 'heads': 8, 'ffn': 4096},"
	"'b': {'type': 'transformer', 'layers': 4, 'hidden': 1024, 'heads': 8, 'ffn': 4096},"
	"'c1': {'type': 'classifier', 'hidden': 1024, 'classes': 4},"
	"'c2': {'type': 'classifier', 'hidden': 1024, 'classes': 4}},"
	"'tasks': ["
	"{'name': 't1', 'batch': 64, 'graph': [{'id': 's', 'component': 'e1', 'seq': 64},"
	" {'id': 'x', 'component': 'a', 'seq': 64, 'inputs': ['s']},"
	" {'id': 'loss', 'component': 'c1', 'inputs': ['x']}]},"
	"{'name': 't2', 'batch': 64, 'graph': [{'id': 's', 'component': 'e2', 'seq': 64},"
	" {'id': 'x', 'component': 'b', 'seq': 64, 'inputs': ['s']},"
	" {'id': 'loss', 'component': 'c2', 'inputs': ['x']}]}]}";

/* bound_sync of every bucket alone, summed per device (its bound before
 * releases and links), the most of any device. */
static double bare_sum(planner_t *pl, const sp_plan_t *p)
{
	double *sum = calloc((size_t)p->n_devices, sizeof *sum), most = 0;
	assert_non_null(sum);
	for (int b = 0; b < p->n_buckets; b++) {
		const sp_bucket_t *bk = &p->buckets[b];
		net_coll_t co;
		assert_int_equal(net_allreduce_phases(&co, pl->cluster, p->bucket_devs + bk->dev_off,
						      bk->n_dev, bk->elems * dtype_bytes(p->model.dtype), 0,
						      &pl->scratch),
				 0);
		for (int i = 0; i < bk->n_dev; i++)
			sum[p->bucket_devs[bk->dev_off + i]] += net_phases_ms(pl->cluster, &co);
	}
	for (int d = 0; d < p->n_devices; d++)
		most = fmax(most, sum[d]);
	free(sum);
	return most;
}

/* The two tasks' plan (sync_case's) as lower_run leaves it, into *p: t1
 * on devices 0 and 2, t2 on 1 and 3, one wave per MetaOp in order. */
static int lower_two_tasks(planner_t *pl, sp_plan_t *p)
{
	sched_t s;
	sched_init(&s, ALGO_SPINDLE, &pl->scratch);
	int32_t devs[64], off[32], n = 0, nd = 0;
	for (int m = 0; m < pl->n_mops; m++) { /* one wave per MetaOp, in order */
		int t1 = pl->mops[m].task == 0;
		assert_int_equal(sched_push(&s, m, 0, pl->mops[m].n_layers, 2, n, n, n + 1), 0);
		off[n++] = nd;
		devs[nd++] = t1 ? 0 : 1;
		devs[nd++] = t1 ? 2 : 3;
	}
	s.n_waves = n;
	place_t pc = {devs, off};
	return lower_run(pl, &s, &pc, p);
}

/* t1 on devices 0 and 2, t2 on 1 and 3 (each across both nodes, so each
 * task's all-reduces cross both NICs), data parallel, buckets replicated
 * (zero 0) or zero-1 (zero 1, gathers not deferred). *it: the simulated
 * iteration, *lb: bound_sync with the gathers, *lb0 without, *bare:
 * bare_sum. */
static void sync_case(double inter, int zero, double *it, double *lb, double *lb0,
		      double *bare, double *deferred)
{
	char cl[1024];
	hand_t h;
	two_nodes(cl, sizeof cl, inter);
	hand_planner(&h, SYNC_MODEL, cl, 4, zero);
	planner_t *pl = &h.pl;
	sp_plan_t p;
	sim_result_t res;
	int rc = lower_two_tasks(pl, &p);
	if (!rc)
		rc = memplan_run(pl, &p, 0);
	if (rc)
		print_message("lowering: %s\n", h.err.msg);
	assert_int_equal(rc, 0);
	assert_int_equal(sim_run(pl, &p, 1, &res), 0);
	*it = res.iteration_ms;
	assert_int_equal(bound_sync(pl, &p, 0, 1, lb), 0);
	assert_int_equal(bound_sync(pl, &p, 0, 0, lb0), 0);
	for (int b = 0; b < p.n_buckets; b++)
		assert_int_equal(p.buckets[b].layout, zero ? LAYOUT_ZERO1 : LAYOUT_REPLICATED);
	double any;
	assert_int_equal(bound_sync(pl, &p, 1, 1, &any), 0);
	assert_true(any <= *lb); /* either layout: no more than its own */
	*bare = bare_sum(pl, &p);
	/* every gather deferred, as layout_refine may: simulated again */
	for (int b = 0; zero && b < p.n_buckets; b++)
		p.buckets[b].defer = bucket_defer_pieces(pl->cluster, &p, b,
							 dtype_bytes(p.model.dtype));
	assert_int_equal(regather(pl, &p), 0);
	assert_int_equal(sim_run(pl, &p, 1, &res), 0);
	*deferred = res.iteration_ms;
	free(pl->ins_spare);
	plan_release(&p);
	hand_done(&h);
}

static void test_sync_bound(void **state)
{
	(void)state;
	double it, lb, lb0, bare, dfr;
	/* fast links: the collectives are short beside the compute before
	 * their SYNCs, which the releases count */
	sync_case(400, 0, &it, &lb, &lb0, &bare, &dfr);
	print_message("compute-bound: iteration %.4f ms, bound %.4f, bare sum %.4f\n", it, lb,
		      bare);
	assert_true(lb <= it);
	assert_true(bare < 0.25 * it);
	assert_true(lb >= 0.5 * it);
	/* slow links: each device's collectives are its task's, each NIC
	 * carries both tasks' */
	sync_case(1, 0, &it, &lb, &lb0, &bare, &dfr);
	print_message("link-bound: iteration %.4f ms, bound %.4f, bare sum %.4f\n", it, lb, bare);
	assert_true(lb <= it);
	assert_true(it >= 1.5 * bare);
	assert_true(lb >= 1.5 * bare);
	assert_true(lb0 == lb); /* no bucket gathers */
	/* zero-1: each reduce-scatter's all-gather follows it on the NICs */
	sync_case(1, 1, &it, &lb, &lb0, &bare, &dfr);
	print_message("zero-1: iteration %.4f ms, bound %.4f (without the gathers %.4f)\n", it,
		      lb, lb0);
	assert_true(lb <= it);
	assert_true(lb >= 1.5 * lb0);
	assert_true(lb >= 0.75 * it);
	/* deferred, the gathers leave the tail: below the bound that counts
	 * them, so the bound on refined plans (refined_bound) must not */
	print_message("zero-1 deferred: iteration %.4f ms\n", dfr);
	assert_true(dfr < lb);
	assert_true(lb0 <= dfr);
}

/*
 * bound_sync_early, the bound the walk cuts lowering on (walk.c
 * plan_lowered_cut), on the two tasks' plan as lower_run leaves it under
 * --zero auto, against bound_sync in both of the walk's layout modes (with
 * the gathers) of the plan that layout_fit could make of it: every bucket
 * sharded (zero-1: a reduce-scatter alone takes less than the all-reduce;
 * its all-gather counted unless --defer-gather on defers it), every slice
 * recomputing (the releases rise), the gathers placed again (regather).
 * Slow links, where the collectives decide the bound, and fast ones, where
 * the releases do; --defer-gather off, auto and on.
 */
static void early_case(double inter, int defer)
{
	char cl[1024];
	hand_t h;
	two_nodes(cl, sizeof cl, inter);
	hand_planner(&h, SYNC_MODEL, cl, 4, -1);
	h.opts.defer_gather = defer;
	planner_t *pl = &h.pl;
	sp_plan_t p;
	sim_result_t res;
	assert_int_equal(lower_two_tasks(pl, &p), 0);
	double early, raw, x;
	assert_int_equal(bound_sync_early(pl, &p, &raw, &early), 0);
	assert_int_equal(memplan_run(pl, &p, 0), 0);
	assert_int_equal(sim_run(pl, &p, 1, &res), 0);
	for (int any = 0; any < 2; any++) {
		assert_int_equal(bound_sync(pl, &p, any, 1, &x), 0);
		assert_true(early <= x);
		if (any)
			assert_true(raw == x); /* its own, unchanged */
	}
	print_message("inter %g, defer %d: early %.4f ms, iteration %.4f as lowered\n", inter,
		      defer, early, res.iteration_ms);
	assert_true(early >= 0.5 * res.iteration_ms); /* not a vacuous bound */
	int sharded = 0;
	for (int k = 0; k < p.n_buckets; k++)
		if (p.buckets[k].n_dev >= 2) {
			assert_int_equal(set_layout(pl, &p, k, LAYOUT_ZERO1), 0);
			sharded++;
		}
	assert_true(sharded > 0);
	for (int i = 0; i < p.n_slices; i++)
		p.slices[i].recompute = 1;
	assert_int_equal(regather(pl, &p), 0);
	assert_int_equal(memplan_run(pl, &p, 0), 0);
	assert_int_equal(sim_run(pl, &p, 1, &res), 0);
	for (int any = 0; any < 2; any++) {
		assert_int_equal(bound_sync(pl, &p, any, 1, &x), 0);
		print_message("  fitted: bound_sync any_layout %d: %.4f ms\n", any, x);
		assert_true(early <= x);
	}
	print_message("  fitted: iteration %.4f ms\n", res.iteration_ms);
	assert_true(early <= res.iteration_ms);
	free(pl->ins_spare);
	plan_release(&p);
	hand_done(&h);
}

static void test_early_bound(void **state)
{
	(void)state;
	for (int defer = -1; defer <= 1; defer++) {
		early_case(1, defer);
		early_case(400, defer);
	}
}

/*
 * bound_sync's memo of collectives (bound.c coll_loads): bounding a plan
 * again takes every collective from the memo and gives the same number;
 * a plan whose buckets carry other bytes is bounded as a planner with an
 * empty memo bounds it (the memo keys on the bytes and the devices, not
 * on the bucket); a planner copied for a job thread (another arena)
 * starts a memo of its own.
 */
static void test_coll_memo(void **state)
{
	(void)state;
	char cl[1024];
	hand_t h, g;
	two_nodes(cl, sizeof cl, 1);
	hand_planner(&h, SYNC_MODEL, cl, 4, -1);
	hand_planner(&g, SYNC_MODEL, cl, 4, -1);
	sp_plan_t p;
	assert_int_equal(lower_two_tasks(&h.pl, &p), 0);
	double a, b, x, y;
	uint64_t hits, misses, hits2, misses2;
	assert_int_equal(bound_sync(&h.pl, &p, 1, 1, &a), 0);
	coll_memo_counts(&h.pl, &hits, &misses);
	assert_true(misses > 0);
	assert_int_equal(bound_sync(&h.pl, &p, 1, 1, &b), 0);
	coll_memo_counts(&h.pl, &hits2, &misses2);
	print_message("first: %llu held, %llu computed; again: %llu held, %llu computed\n",
		      (unsigned long long)hits, (unsigned long long)misses,
		      (unsigned long long)(hits2 - hits), (unsigned long long)(misses2 - misses));
	assert_true(misses2 == misses);   /* nothing computed again */
	assert_true(hits2 - hits == misses + hits);
	assert_true(a == b);
	/* other bytes per bucket: what an empty memo gives (g's) */
	for (int k = 0; k < p.n_buckets; k++)
		p.buckets[k].elems *= 4;
	assert_int_equal(bound_sync(&h.pl, &p, 1, 1, &x), 0);
	assert_int_equal(bound_sync(&g.pl, &p, 1, 1, &y), 0);
	print_message("bound %.6f ms; with 4x the bytes %.6f ms (empty memo %.6f)\n", a, x, y);
	assert_true(x == y);
	assert_true(x > 1.5 * a);
	/* a copy of h's planner over g's arena (jobs.c thread_copy): its own
	 * memo, h's left as it was */
	planner_t c = h.pl;
	c.arena = g.pl.arena;
	c.scratch = g.pl.scratch;
	coll_memo_counts(&h.pl, &hits, &misses);
	assert_int_equal(bound_sync(&c, &p, 1, 1, &x), 0);
	g.pl.arena = c.arena;
	g.pl.scratch = c.scratch;
	assert_true(x == y);
	coll_memo_counts(&h.pl, &hits2, &misses2);
	assert_true(hits2 == hits && misses2 == misses);
	assert_true(c.coll_memo != h.pl.coll_memo);
	/* h's warm memo against no memo at all (g), bit for bit, for every
	 * layout and gather choice (all-reduce, reduce-scatter, all-gather),
	 * then with every bucket of one size, then of two devices each (0-1
	 * or 1-2), so that keys differ only in op and devices (net.c wants a
	 * group's devices ascending: no other order exists) */
	g.pl.coll_memo_off = 1;
	coll_memo_counts(&g.pl, &hits2, &misses2);
	int checked = 0;
	for (int pass = 0; pass < 3; pass++) {
		for (int k = 0; pass == 1 && k < p.n_buckets; k++)
			p.buckets[k].elems = p.buckets[0].elems;
		for (int k = 0; pass == 2 && k < p.n_buckets; k++) {
			/* two devices each: inside node 0, or across the nodes */
			int32_t *d = p.bucket_devs + p.buckets[k].dev_off;
			assert_true(p.buckets[k].n_dev >= 2 && p.n_devices >= 3);
			p.buckets[k].n_dev = 2;
			d[0] = k % 2;
			d[1] = k % 2 + 1;
		}
		for (int any = 0; any < 2; any++)
			for (int gat = 0; gat < 2; gat++) {
				assert_int_equal(bound_sync(&h.pl, &p, any, gat, &x), 0);
				assert_int_equal(bound_sync(&g.pl, &p, any, gat, &y), 0);
				assert_memory_equal(&x, &y, sizeof x);
				checked++;
			}
	}
	coll_memo_counts(&g.pl, &hits, &misses);
	assert_true(hits == hits2 && misses == misses2); /* g's memo untouched */
	print_message("%d bounds with the memo equal to those without\n", checked);
	plan_release(&p);
	hand_done(&g);
	hand_done(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_curves),
		cmocka_unit_test(test_equal_time_replaces),
		cmocka_unit_test(test_comm_bound),
		cmocka_unit_test(test_comm_any),
		cmocka_unit_test(test_sync_bound),
		cmocka_unit_test(test_early_bound),
		cmocka_unit_test(test_coll_memo),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
