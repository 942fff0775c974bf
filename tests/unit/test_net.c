/*
 * test_net.c — the network model (planner/net.c, planner/fluid.c): the rail
 * mapping, the isolated prices of transfers and all-reduces (with one NIC
 * and one GPU per node they are the prices from before NICs were modelled;
 * the phases the simulator drains price the same as cost_allreduce_ms; the
 * ring's latency by node crossings, and the tree where latency rules), and
 * max-min fair sharing on hand-computed cases: two transfers through one
 * NIC take twice as long, through two NICs (rails) they do not, an
 * all-reduce beside a transfer on one NIC slows both, a transfer that
 * leaves gives its share back, also from the middle of its links' lists,
 * a transfer's two links, its latency (by node) and one of no bytes,
 * a sharing's last round (it only sets rates) after a first, a sharing of
 * many rounds max-min fair (the bottleneck property), jobs leaving their
 * group of one end time when their rate changes;
 * measured collectives (the cluster's "collectives"): log-log
 * interpolation, the nearest shape, fallbacks, and the simulator's phases
 * scaled to the measured time.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bandwidths in GB/s = 1e6 bytes/ms; latencies in us = 1e-3 ms. */
static sp_cluster_t cluster(int nodes, int gpn, int nics, double lat_us)
{
	sp_cluster_t c = {.nodes = nodes, .gpus_per_node = gpn, .nics = nics,
			  .intra_gbs = 200, .intra_lat_us = lat_us,
			  .inter_gbs = 50, .inter_lat_us = 2 * lat_us};
	return c;
}

static void near(double got, double want, const char *what)
{
	if (fabs(got - want) > 1e-9 * fmax(1, fabs(want))) {
		fprintf(stderr, "%s: expected %.12g ms, got %.12g ms\n", what, want, got);
		fail();
	}
}

static void test_rails(void **state)
{
	(void)state;
	sp_cluster_t c = cluster(2, 8, 4, 0);
	const int want4[8] = {0, 0, 1, 1, 2, 2, 3, 3};
	for (int g = 0; g < 8; g++) {
		assert_int_equal(dev_nic(&c, g), want4[g]);
		assert_int_equal(dev_nic(&c, 8 + g), 4 + want4[g]);
	}
	c.nics = 3; /* need not divide: floor(g * 3 / 8) */
	const int want3[8] = {0, 0, 0, 1, 1, 1, 2, 2};
	for (int g = 0; g < 8; g++)
		assert_int_equal(dev_nic(&c, g), want3[g]);
}

/* With one NIC and one GPU of the group per node: the flat ring at the NIC,
 * 2 (n-1)/n S / B_x + 2 (n-1) a_x, as before NICs were modelled. */
static void test_one_nic_is_old_price(void **state)
{
	(void)state;
	for (int gpn = 1; gpn <= 8; gpn *= 2)
		for (int n = 2; n <= 16; n++) {
			sp_cluster_t c = cluster(16, gpn, 1, 5);
			int32_t devs[16];
			for (int i = 0; i < n; i++)
				devs[i] = i * gpn + (i % gpn);
			int64_t S = 123456789;
			double old = 2.0 * (n - 1) / n * (double)S / (c.inter_gbs * 1e6) +
				     2.0 * (n - 1) * c.inter_lat_us * 1e-3;
			near(cost_allreduce_ms(&c, devs, n, S), old, "one-nic all-reduce");
			near(cost_xfer_ms(&c, devs[0], devs[1], S),
			     c.inter_lat_us * 1e-3 + (double)S / (c.inter_gbs * 1e6), "xfer");
		}
}

/* 16 GPUs on 2 nodes of 8, S = 1 GB, no latency. One NIC: ring 2*15/16 S at
 * 50 GB/s = 37.5 ms; hierarchical 2 * 7/8 S at 200 + 2*1/2 * 8 * S/8 at 50
 * = 8.75 + 20 = 28.75 ms. Four NICs: ring at min(4*50, 200) = 9.375 ms;
 * hierarchical 8.75 + 2*1/2 * 2 * S/8 at 50 = 13.75 ms. */
static void test_ring_or_hierarchical(void **state)
{
	(void)state;
	int32_t devs[16];
	for (int i = 0; i < 16; i++)
		devs[i] = i;
	sp_cluster_t c1 = cluster(2, 8, 1, 0), c4 = cluster(2, 8, 4, 0);
	near(cost_allreduce_ms(&c1, devs, 16, 1000000000), 28.75, "1 nic, hierarchical");
	near(cost_allreduce_ms(&c4, devs, 16, 1000000000), 9.375, "4 nics, ring");
}

/* Latency-bound groups (S = 1 MB; B_n 200, B_x 50 GB/s).
 * 64 nodes, one GPU of each, a_x = 10 us: ring 2*63/64 S / B_x + 2*63 a_x
 * = 0.039375 + 1.26 ms; tree 2 S / (0.9 B_x) + 2 * 6 a_x = 0.044444 + 0.12
 * ms: the tree. Its reduce-scatter has no tree: half the ring, 0.6496875.
 * 12 GPUs, 8 on node 0 and 4 on node 1 (hierarchical does not apply),
 * a_n = 5, a_x = 10 us, one NIC: ring 2*11/12 S / 50 + 2*1*10 + 2*10*5 us
 * = 0.0366667 + 0.12 ms; tree 2 S / (0.9 * 50) + 2 (7*5 + 1*10) us
 * = 0.0444444 + 0.09 ms, so the tree (0.1344444 < 0.1566667); at 100 MB
 * the ring (3.7866667 < 4.5344444). */
static void test_tree_and_ring_latency(void **state)
{
	sp_arena_t a;
	(void)state;
	sp_arena_init(&a);
	int32_t devs[64];
	for (int i = 0; i < 64; i++)
		devs[i] = i;
	sp_cluster_t c = cluster(64, 1, 1, 5);
	near(cost_allreduce_ms(&c, devs, 64, 1000000), 2e6 / (0.9 * 50e6) + 0.12, "64 nodes: tree");
	near(cost_reduce_scatter_ms(&c, devs, 64, 1000000),
	     (2.0 * 63 / 64 * 1e6 / 50e6 + 1.26) / 2, "64 nodes: reduce-scatter, ring");
	net_coll_t co;
	assert_int_equal(net_allreduce_phases(&co, &c, devs, 64, 1000000, 0, &a), 0);
	near(net_phases_ms(&c, &co), 2e6 / (0.9 * 50e6) + 0.12, "tree phases");
	assert_int_equal(net_allreduce_phases(&co, &c, devs, 64, 1000000, 1, &a), 0);
	near(net_phases_ms(&c, &co), 2.0 * 63 / 64 * 1e6 / 50e6 + 1.26, "no_tree phases");
	sp_cluster_t c2 = cluster(2, 8, 1, 5);
	near(cost_allreduce_ms(&c2, devs, 12, 1000000), 2e6 / (0.9 * 50e6) + 0.09, "8 + 4: tree");
	near(cost_allreduce_ms(&c2, devs, 12, 100000000), 2.0 * 11 / 12 * 1e8 / 50e6 + 0.12,
	     "8 + 4: ring");
	sp_arena_release(&a);
}

/* The phases the simulator drains take, alone, the price (all-reduce and
 * reduce-scatter). */
static void test_phases_price(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	srand(7);
	for (int it = 0; it < 2000; it++) {
		int gpn = 1 + rand() % 8, nodes = 1 + rand() % 6;
		sp_cluster_t c = cluster(nodes, gpn, 1 + rand() % gpn, rand() % 10);
		int32_t devs[48];
		int n = 0;
		int even = rand() % 2, per = 1 + rand() % gpn;
		for (int d = 0; d < nodes * gpn; d++)
			if (even ? d % gpn < per : rand() % 2)
				devs[n++] = d;
		int64_t S = 1 + rand() % 100000000;
		net_coll_t co;
		assert_int_equal(net_allreduce_phases(&co, &c, devs, n, S, 0, &a), 0);
		near(net_phases_ms(&c, &co), cost_allreduce_ms(&c, devs, n, S), "phases");
		assert_int_equal(net_half_phases(&co, &c, COLL_REDUCE_SCATTER, devs, n, S, &a), 0);
		near(net_phases_ms(&c, &co), cost_reduce_scatter_ms(&c, devs, n, S),
		     "reduce-scatter phases");
		assert_int_equal(net_half_phases(&co, &c, COLL_ALL_GATHER, devs, n, S, &a), 0);
		near(net_phases_ms(&c, &co), cost_all_gather_ms(&c, devs, n, S),
		     "all-gather phases");
	}
	sp_arena_release(&a);
}

/* A reduce-scatter's phases (a zero-1 bucket's SYNC in the simulator)
 * take, alone, its price: never the all-reduce of half the bytes, which
 * pays the all-reduce's latency and an intra-node all-gather too. The
 * all-gather's (a zero-1/2 bucket's GATHER) are the mirror: half the
 * inter-node all-reduce first, then the intra-node all-gather whole; the
 * same price, and never the reduce-scatter of half the bytes (a merge once
 * priced every gather so: half its time). */
static void test_reduce_scatter_phases(void **state)
{
	(void)state;
	sp_arena_t a;
	sp_arena_init(&a);
	/* 16 GPUs on 2 nodes of 8, one NIC, S = 1 GB, a_n = 5, a_x = 10 us:
	 * hierarchical (as test_ring_or_hierarchical, with latencies): intra
	 * reduce-scatter 7/8 S at 200 + 7 a_n = 4.375 + 0.035 ms, inter 1/2 *
	 * 8 * S/8 at 50 + 1 a_x = 10 + 0.01 ms: 14.42 ms in two phases */
	int32_t devs[16];
	for (int i = 0; i < 16; i++)
		devs[i] = i;
	sp_cluster_t c1 = cluster(2, 8, 1, 5);
	net_coll_t co;
	assert_int_equal(net_half_phases(&co, &c1, COLL_REDUCE_SCATTER, devs, 16, 1000000000, &a),
			 0);
	assert_int_equal(co.n_phase, 2);
	near(co.ph[0].lat_ms, 0.035, "intra-node first");
	near(net_phases_ms(&c1, &co), 4.375 + 0.035 + 10 + 0.01, "hierarchical reduce-scatter");
	near(cost_reduce_scatter_ms(&c1, devs, 16, 1000000000), 14.42, "its price");
	net_coll_t half;
	assert_int_equal(net_allreduce_phases(&half, &c1, devs, 16, 500000000, 1, &a), 0);
	assert_true(net_phases_ms(&c1, &half) > net_phases_ms(&c1, &co) + 0.04);
	net_coll_t ag;
	assert_int_equal(net_half_phases(&ag, &c1, COLL_ALL_GATHER, devs, 16, 1000000000, &a), 0);
	assert_int_equal(ag.n_phase, 2);
	near(ag.ph[0].lat_ms, 0.01, "inter-node first");
	near(ag.ph[1].lat_ms, 0.035, "intra-node all-gather last");
	near(net_phases_ms(&c1, &ag), 14.42, "hierarchical all-gather");
	near(cost_all_gather_ms(&c1, devs, 16, 1000000000), 14.42, "its price");
	net_coll_t rs_half;
	assert_int_equal(
		net_half_phases(&rs_half, &c1, COLL_REDUCE_SCATTER, devs, 16, 500000000, &a), 0);
	assert_true(net_phases_ms(&c1, &ag) > 1.9 * net_phases_ms(&c1, &rs_half));
	assert_int_equal(net_half_phases(&ag, &c1, COLL_ALL_REDUCE, devs, 16, 1000, &a),
			 SP_EINTERNAL);
	sp_arena_release(&a);
}

/* S = 100 MB over one 50 GB/s NIC takes 2 ms alone, a_x = 0.01 ms. */
#define S_BYTES 100000000
#define ALONE (2.0 + 0.01)

/* Each network test gets a fresh arena as its state. */
static int arena_setup(void **state)
{
	sp_arena_t *a = calloc(1, sizeof *a);
	if (!a)
		return -1;
	sp_arena_init(a);
	*state = a;
	return 0;
}

static int arena_teardown(void **state)
{
	sp_arena_release(*state);
	free(*state);
	return 0;
}

static fl_net_t *net_new(void **state, const sp_cluster_t *c)
{
	sp_arena_t *a = *state;
	fl_net_t *n = sp_arena_calloc(a, 1, sizeof *n);
	assert_non_null(n);
	assert_int_equal(fl_init(n, c, a, 8), 0);
	return n;
}

static void test_two_flows_one_nic(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int j0 = fl_xfer(n, 0, 0, 2, S_BYTES), j1 = fl_xfer(n, 0, 1, 3, S_BYTES);
	fl_advance(n, 0);
	near(fl_done(n, j0), 2 * 2.0 + 0.01, "first of two on one nic");
	near(fl_done(n, j1), 2 * 2.0 + 0.01, "second of two on one nic");

}

static void test_two_flows_two_rails(void **state)
{
	sp_cluster_t c = cluster(2, 2, 2, 5);
	fl_net_t *n = net_new(state, &c);
	int j0 = fl_xfer(n, 0, 0, 2, S_BYTES), j1 = fl_xfer(n, 0, 1, 3, S_BYTES);
	fl_advance(n, 0);
	near(fl_done(n, j0), ALONE, "rail 0");
	near(fl_done(n, j1), ALONE, "rail 1");

}

/* A ring all-reduce of S over GPU 0 of each node loads each NIC with
 * 2 (2-1)/2 S = S each way; beside it a transfer of S from GPU 1 to GPU 3
 * on the same NICs. Both get 25 GB/s: 4 ms of bytes, then latency
 * (all-reduce: 2 (n-1) a_x = 0.02 ms). Alone: 2 ms + latency. */
static void test_allreduce_beside_flow(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	static const int32_t devs[2] = {0, 2};
	near(cost_allreduce_ms(&c, devs, 2, S_BYTES), 2.0 + 0.02, "all-reduce alone");
	fl_net_t *n = net_new(state, &c);
	/* the transfer first: the all-reduce's job is not job 0 (fl_coll
	 * once returned 0 for every all-reduce, and the simulator then timed
	 * each optimizer step by the network's first job) */
	int x = fl_xfer(n, 0, 1, 3, S_BYTES), ar = fl_coll(n, 0, devs, 2, S_BYTES, COLL_ALL_REDUCE);
	assert_true(ar >= 0 && x >= 0);
	assert_int_not_equal(ar, x);
	fl_advance(n, 0);
	near(fl_done(n, ar), 4.0 + 0.02, "all-reduce beside a transfer");
	near(fl_done(n, x), 4.0 + 0.01, "transfer beside an all-reduce");

}

/* A zero-1 bucket's reduce-scatter and all-gather alone on the network end
 * at their prices (the simulator's SYNC and GATHER jobs): over GPUs 0 and
 * 2 of two nodes, half the all-reduce's 2 (2-1)/2 S bytes each, 1 ms, and
 * half its latency, 0.01 ms. */
static void test_half_jobs_alone(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	static const int32_t devs[2] = {0, 2};
	for (int op = COLL_ALL_GATHER; op <= COLL_REDUCE_SCATTER; op++) {
		fl_net_t *n = net_new(state, &c);
		int j = fl_coll(n, 0, devs, 2, S_BYTES, (sp_coll_op_t)op);
		assert_true(j >= 0);
		fl_advance(n, 0);
		double price = op == COLL_ALL_GATHER ? cost_all_gather_ms(&c, devs, 2, S_BYTES)
						     : cost_reduce_scatter_ms(&c, devs, 2, S_BYTES);
		near(price, 1.0 + 0.01, "its price");
		near(fl_done(n, j), price, "alone on the network");
	}
}

/* A hierarchical all-reduce over 2 nodes x 8 GPUs, one NIC (28.75 ms, test
 * ring_or_hierarchical): three phases of different loads (GPU ports,
 * NICs, GPU ports), each more than a transfer's two, drained one after
 * the other through the job's room for its largest phase (fl_ld_t, in
 * fl_init's 64-byte aligned job array); alone it ends
 * at its price, and so does the same all-reduce on two other nodes beside
 * it, with a transfer between those nodes through their NICs, alone there
 * (2 ms) until their NIC phase (after 7/8 GB / 200 GB/s = 4.375 ms). */
static void test_phases_in_turn(void **state)
{
	sp_cluster_t c = cluster(4, 8, 1, 0);
	int32_t d0[16], d1[16];
	for (int i = 0; i < 16; i++)
		d0[i] = i, d1[i] = 16 + i;
	net_coll_t co;
	assert_int_equal(net_allreduce_phases(&co, &c, d0, 16, 1000000000, 0, *state), 0);
	assert_int_equal(co.n_phase, 3);
	for (int p = 0; p < 3; p++)
		assert_true(co.ph[p].n_load > 2);
	assert_int_not_equal(co.ph[0].n_load, co.ph[1].n_load);
	fl_net_t *n = net_new(state, &c);
	/* each job's sharing fields in one cache line */
	assert_int_equal((uintptr_t)n->jobs % 64, 0);
	assert_int_equal(sizeof *n->jobs % 64, 0);
	int j0 = fl_coll(n, 0, d0, 16, 1000000000, COLL_ALL_REDUCE),
	    x = fl_xfer(n, 0, 16, 24, S_BYTES),
	    j1 = fl_coll(n, 0, d1, 16, 1000000000, COLL_ALL_REDUCE);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, j0), 28.75, "hierarchical all-reduce alone");
	near(fl_done(n, j1), 28.75, "beside another and a transfer");
	near(fl_done(n, x), 2.0, "transfer before the NIC phase");
}

/* S and 2S on one NIC: both at 25 GB/s until the first is through (4 ms),
 * then the second alone at 50 GB/s for its last S (2 ms). The network
 * stops at the first awaited arrival when asked to. */
static void test_share_given_back(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int j0 = fl_xfer(n, 0, 0, 2, S_BYTES), j1 = fl_xfer(n, 0, 1, 3, 2 * S_BYTES);
	fl_await(n, j0);
	fl_await(n, j1);
	assert_int_equal(fl_advance(n, 1), 1);
	near(fl_done(n, j0), 4.0 + 0.01, "short one");
	assert_true(fl_done(n, j1) < 0);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, j1), 6.0 + 0.01, "long one");

}

/* A transfer's one phase (fluid.c keeps it in the job: two links, one
 * size, a latency), each part by hand on 3 nodes of 2 GPUs, one NIC: from
 * nodes 0 and 2 into node 1 the two share only node 1's inbound NIC (25
 * GB/s each: 4 ms, then 0.01 ms inter-node latency); within a node S at
 * 200 GB/s is 0.5 ms, then 0.005 ms; nothing to send from 1 ms on arrives
 * after the latency alone. */
static void test_transfer_sides(void **state)
{
	sp_cluster_t c = cluster(3, 2, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int a = fl_xfer(n, 0, 0, 2, S_BYTES), b = fl_xfer(n, 0, 4, 3, S_BYTES),
	    in = fl_xfer(n, 0, 0, 1, S_BYTES), none = fl_xfer(n, 1, 5, 1, 0);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, a), 4.0 + 0.01, "into one NIC from node 0");
	near(fl_done(n, b), 4.0 + 0.01, "into one NIC from node 2");
	near(fl_done(n, in), 0.5 + 0.005, "within a node");
	near(fl_done(n, none), 1.0 + 0.01, "no bytes: the latency");
}

/* 3S, S and 2S on one NIC, at 50/3 GB/s each: the middle one is through
 * at 6 ms, then two at 25 GB/s until the last added is at 10 ms, then the
 * first alone at 50 GB/s for its last S (12 ms). */
static void test_leave_in_turn(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int j0 = fl_xfer(n, 0, 0, 2, 3 * S_BYTES), j1 = fl_xfer(n, 0, 1, 3, S_BYTES),
	    j2 = fl_xfer(n, 0, 0, 3, 2 * S_BYTES);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, j1), 6.0 + 0.01, "middle one");
	near(fl_done(n, j2), 10.0 + 0.01, "last added");
	near(fl_done(n, j0), 12.0 + 0.01, "first added");
}

/* Two rounds of filling, the second the last: A (GPU 0 -> 2), D (1 -> 3)
 * and B (0 -> 6) leave node 0's NIC at 50/3 GB/s each, the first link to
 * fill; then C (4 -> 7) alone has what B leaves of node 3's incoming
 * NIC, 100/3 GB/s, and takes all of it in the last round (which only
 * sets rates). S each: C is through at 3 ms, the others at 6 ms. */
static void test_last_round(void **state)
{
	sp_cluster_t c = cluster(4, 2, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int a = fl_xfer(n, 0, 0, 2, S_BYTES), d = fl_xfer(n, 0, 1, 3, S_BYTES),
	    b = fl_xfer(n, 0, 0, 6, S_BYTES), x = fl_xfer(n, 0, 4, 7, S_BYTES);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, x), 3.0 + 0.01, "alone in the last round");
	near(fl_done(n, a), 6.0 + 0.01, "first round, A");
	near(fl_done(n, d), 6.0 + 0.01, "first round, D");
	near(fl_done(n, b), 6.0 + 0.01, "first round, B");
}

/* One sharing's jobs of one end time go into the event heap as one group
 * (A, B, C: S each from GPU 0, 2, 4 to 1, 3, 5 of 8 one-GPU nodes, all
 * at 0, alone 2 ms each); a job whose end moves leaves its group. At
 * 0.5 ms E (6 -> 1) joins A, the group's first, on node 1's NIC: A's last
 * 3S/4 at 25 GB/s ends at 3.5 ms, E's last S/4 alone at 4 ms. At 1 ms D
 * (7 -> 5) joins C, inside the group after B: C's last S/2 ends at 3 ms,
 * D's at 4 ms. B still ends at 2 ms. Latency 0.01 ms each. */
static void test_event_groups(void **state)
{
	sp_cluster_t c = cluster(8, 1, 1, 5);
	fl_net_t *n = net_new(state, &c);
	int ja = fl_xfer(n, 0, 0, 1, S_BYTES), jb = fl_xfer(n, 0, 2, 3, S_BYTES),
	    jc = fl_xfer(n, 0, 4, 5, S_BYTES), je = fl_xfer(n, 0.5, 6, 1, S_BYTES),
	    jd = fl_xfer(n, 1.0, 7, 5, S_BYTES);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, jb), 2.0 + 0.01, "left in the group");
	near(fl_done(n, ja), 3.5 + 0.01, "the group's first, slowed");
	near(fl_done(n, jc), 3.0 + 0.01, "inside the group, slowed");
	near(fl_done(n, je), 4.0 + 0.01, "joined A");
	near(fl_done(n, jd), 4.0 + 0.01, "joined C");
}

/* Max-min fairness of a sharing with many rounds (more than the scans'
 * SCAN_ROUNDS: the later ones take links from the heap, whose keys go up
 * lazily): 400 transfers of varied sizes between pseudo-random GPUs of
 * 32 nodes x 4 (2 NICs), all at 0. Until the first arrives, the rates
 * are the first sharing's; they must be max-min fair: no link over
 * capacity, and every job has a full link on which no job runs faster
 * (Bertsekas & Gallager 6.5.2). A link taken with a stale level freezes
 * its jobs too early. */
static void test_fair_many_rounds(void **state)
{
	sp_cluster_t c = cluster(32, 4, 2, 5);
	sp_arena_t *a = *state;
	fl_net_t *n = sp_arena_calloc(a, 1, sizeof *n);
	assert_non_null(n);
	enum { NJ = 400 };
	assert_int_equal(fl_init(n, &c, a, NJ), 0);
	int nr = net_n_res(&c);
	double *use = sp_arena_calloc(a, (size_t)nr, sizeof(double));
	double *fastest = sp_arena_calloc(a, (size_t)nr, sizeof(double));
	assert_true(use && fastest);
	unsigned s = 12345;
	for (int i = 0; i < NJ; i++) {
		int from, to;
		do {
			s = s * 1103515245u + 12345u;
			from = (int)(s >> 16) % 128;
			s = s * 1103515245u + 12345u;
			to = (int)(s >> 16) % 128;
		} while (from == to);
		fl_await(n, fl_xfer(n, 0, from, to, (int64_t)(i % 5 + 1) * S_BYTES));
	}
	assert_int_equal(fl_advance(n, 1), 1);
	for (int j = 0; j < NJ; j++) {
		const fl_ld_t *ld = fl_loads(&n->jobs[j]);
		for (int i = 0; i < n->jobs[j].n_ld; i++) {
			use[ld[i].res] += n->jobs[j].rate * ld[i].w;
			fastest[ld[i].res] = fmax(fastest[ld[i].res], n->jobs[j].rate);
		}
	}
	for (int r = 0; r < nr; r++)
		assert_true(use[r] <= net_res_gbs(&c, r) * 1e6 * (1 + 1e-9));
	for (int j = 0; j < NJ; j++) {
		const fl_ld_t *ld = fl_loads(&n->jobs[j]);
		int held = 0;
		for (int i = 0; i < n->jobs[j].n_ld; i++) {
			int r = ld[i].res;
			held |= use[r] >= net_res_gbs(&c, r) * 1e6 * (1 - 1e-9) &&
				n->jobs[j].rate >= fastest[r] * (1 - 1e-9);
		}
		if (!held)
			fprintf(stderr, "job %d at %.6g bytes/ms has no bottleneck\n", j,
				n->jobs[j].rate);
		assert_true(held);
	}
}

/* Three all-reduces over GPUs 0 and 2 (2.02 ms alone), ready at 0: they
 * queue on both members and run in turn, the third after the second
 * (2.02, 4.04, 6.06 ms). */
static void test_allreduce_queue(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	static const int32_t d02[2] = {0, 2};
	fl_net_t *n = net_new(state, &c);
	int j[3];
	for (int i = 0; i < 3; i++)
		j[i] = fl_coll(n, 0, d02, 2, S_BYTES, COLL_ALL_REDUCE);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, j[0]), 2.02, "first in the queue");
	near(fl_done(n, j[1]), 4.04, "second in the queue");
	near(fl_done(n, j[2]), 6.06, "third in the queue");
}

/* All-reduces run one at a time per device, in the order they became
 * ready: X over GPUs 1 and 3, then A over 0 and 1 (waits for X on GPU 1),
 * then B over 0 and 2, all ready at 0. B must not start on GPU 0 before A,
 * which became ready first: X alone 2.02 ms, A over NVLink 0.5 + 0.01 ms
 * after it, B 2.02 ms after A. (B once jumped ahead of A, shared the NIC
 * with X, and both ended at 4.02 ms.) */
static void test_allreduce_order_per_device(void **state)
{
	sp_cluster_t c = cluster(2, 2, 1, 5);
	static const int32_t dx[2] = {1, 3}, da[2] = {0, 1}, db[2] = {0, 2};
	fl_net_t *n = net_new(state, &c);
	int x = fl_coll(n, 0, dx, 2, S_BYTES, COLL_ALL_REDUCE), a = fl_coll(n, 0, da, 2, S_BYTES, COLL_ALL_REDUCE),
	    b = fl_coll(n, 0, db, 2, S_BYTES, COLL_ALL_REDUCE);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, x), 2.02, "first all-reduce");
	near(fl_done(n, a), 2.02 + 0.51, "second, after the first on GPU 1");
	near(fl_done(n, b), 2.53 + 2.02, "third, after the second on GPU 0");
}

/* Measured points on one node of 8: all-reduce at 2 ranks 0.1 ms at 4 KiB
 * and 0.4 ms at 64 KiB, at 8 ranks 1 ms at 4 KiB; reduce-scatter at 2
 * ranks 0.05 ms at 4 KiB; p2p in one node 0.02 ms at 4 KiB. */
static const sp_coll_point_t MEASURED[] = {
	{COLL_ALL_REDUCE, 2, 1, 4096, 0.1},   {COLL_ALL_REDUCE, 2, 1, 65536, 0.4},
	{COLL_ALL_REDUCE, 8, 1, 4096, 1.0},   {COLL_REDUCE_SCATTER, 2, 1, 4096, 0.05},
	{COLL_P2P, 2, 1, 4096, 0.02},
};

static sp_cluster_t measured_cluster(void)
{
	sp_cluster_t c = cluster(2, 8, 1, 5);
	c.coll = (sp_coll_point_t *)MEASURED;
	c.n_coll = (int)(sizeof MEASURED / sizeof *MEASURED);
	return c;
}

static void test_measured_interp(void **state)
{
	(void)state;
	sp_cluster_t c = measured_cluster();
	static const int32_t d2[2] = {0, 1}, d3[3] = {0, 1, 2}, d4[4] = {0, 1, 2, 3};
	/* 16 KiB: halfway in ln S between 4 and 64 KiB, so ln t halfway:
	 * sqrt(0.1 * 0.4) = 0.2 ms (a power law through both points) */
	near(cost_allreduce_ms(&c, d2, 2, 16384), 0.2, "log-log halfway");
	near(cost_allreduce_ms(&c, d2, 2, 4096), 0.1, "at a point");
	near(cost_allreduce_ms(&c, d2, 2, 1000), 0.1, "below: the smallest's time");
	near(cost_allreduce_ms(&c, d2, 2, 131072), 0.8, "above: proportional to bytes");
	/* 3 ranks: |ln 2/3| = 0.405 < |ln 8/3| = 0.981, so the 2-rank curve,
	 * times (2/3) / (1/2) */
	near(cost_allreduce_ms(&c, d3, 3, 4096), 0.1 * 4.0 / 3.0, "nearest ranks, scaled");
	/* 4 ranks: ln 2 either side, the tie goes to 2 ranks: times 1.5 */
	near(cost_allreduce_ms(&c, d4, 4, 16384), 0.2 * 1.5, "tie: the smaller");
	/* reduce-scatter measured; all-gather falls back to half the
	 * (measured) all-reduce */
	near(cost_reduce_scatter_ms(&c, d2, 2, 4096), 0.05, "measured reduce-scatter");
	near(cost_all_gather_ms(&c, d2, 2, 16384), 0.1, "all-gather: half the all-reduce");
	near(cost_xfer_ms(&c, 0, 1, 8192), 0.04, "p2p in a node");
	near(net_xfer_scale(&c, 0, 1, 8192), 0.04 / (0.005 + 8192 / 200e6), "p2p scale");
	/* across nodes nothing is measured: the analytic prices */
	sp_cluster_t a = cluster(2, 8, 1, 5);
	static const int32_t dx[2] = {0, 8};
	near(cost_allreduce_ms(&c, dx, 2, 16384), cost_allreduce_ms(&a, dx, 2, 16384),
	     "other node count: analytic all-reduce");
	near(cost_xfer_ms(&c, 0, 8, 16384), 0.01 + 16384 / 50e6, "cross-node p2p: analytic");
	near(net_xfer_scale(&c, 0, 8, 16384), 1, "cross-node p2p: not scaled");
}

/* Without measured points a transfer is not scaled: exactly 1 (the
 * simulator's fast path divides the analytic time by itself), in a node
 * and across nodes, at any size. */
static void test_xfer_scale_unmeasured(void **state)
{
	(void)state;
	sp_cluster_t c = cluster(2, 8, 1, 5);
	static const int64_t sizes[] = {1, 4096, 16384, (int64_t)1 << 30, (int64_t)3 << 40};
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		assert_true(net_xfer_scale(&c, 0, 1, sizes[i]) == 1.0);
		assert_true(net_xfer_scale(&c, 0, 8, sizes[i]) == 1.0);
		assert_true(net_xfer_scale(&c, 9, 2, sizes[i]) == 1.0);
	}
	assert_true(net_xfer_scale(&c, 3, 3, 4096) == 1.0);
	assert_true(net_xfer_scale(&c, 0, 8, 0) == 1.0);
}

/* With measured points the simulator's phases keep the analytic links but
 * take the measured time alone: an all-reduce over GPUs 0..3 at 16 KiB
 * finishes at 0.3 ms; two of them on disjoint GPUs at once do not share a
 * link (ports of their own GPUs), so both still take 0.3 ms. */
static void test_measured_phases(void **state)
{
	sp_cluster_t c = measured_cluster();
	static const int32_t d4[4] = {0, 1, 2, 3}, e4[4] = {4, 5, 6, 7};
	net_coll_t co;
	assert_int_equal(net_allreduce_phases(&co, &c, d4, 4, 16384, 0, *state), 0);
	near(net_phases_ms(&c, &co), 0.3, "phases at the measured time");
	fl_net_t *n = net_new(state, &c);
	int j0 = fl_coll(n, 0, d4, 4, 16384, COLL_ALL_REDUCE), j1 = fl_coll(n, 0, e4, 4, 16384, COLL_ALL_REDUCE);
	assert_int_equal(fl_advance(n, 0), 0);
	near(fl_done(n, j0), 0.3, "measured all-reduce in the simulator");
	near(fl_done(n, j1), 0.3, "beside one on other GPUs");
}

/* The loader keeps the points as written (cluster_load.c) and the prices
 * read them: 2 ranks at 4 and 64 KiB, 16 KiB at sqrt(0.1 * 0.4) ms. */
static void test_measured_loaded(void **state)
{
	(void)state;
	static const char text[] =
		"{\"format\": \"spindle.cluster/1\", \"name\": \"m\", \"nodes\": 1,\n"
		" \"gpus_per_node\": 4, \"gpu\": {\"name\": \"g\", \"memory_gib\": 1,\n"
		" \"peak_tflops\": 1, \"mem_bandwidth_gbs\": 1}, \"links\": {\"intra_node_gbs\": 1,\n"
		" \"intra_node_latency_us\": 1, \"inter_node_gbs\": 1, \"inter_node_latency_us\": 1},\n"
		" \"collectives\": [\n"
		"  {\"op\": \"all_reduce\", \"ranks\": 2, \"nodes\": 1, \"bytes\": 4096, \"ms\": 0.1},\n"
		"  {\"op\": \"all_reduce\", \"ranks\": 2, \"nodes\": 1, \"bytes\": 65536, \"ms\": 0.4},\n"
		"  {\"op\": \"p2p\", \"ranks\": 2, \"nodes\": 1, \"bytes\": 4096, \"ms\": 0.02}]}\n";
	sp_cluster_t c;
	sp_err_t err = {0};
	assert_int_equal(cluster_parse(&c, text, sizeof text - 1, "m.json", &err), 0);
	assert_int_equal(c.n_coll, 3);
	assert_int_equal(c.coll[1].op, COLL_ALL_REDUCE);
	assert_int_equal(c.coll[1].ranks, 2);
	assert_int_equal(c.coll[1].nodes, 1);
	near(c.coll[1].bytes, 65536, "bytes as written");
	near(c.coll[2].ms, 0.02, "ms as written");
	assert_int_equal(c.coll[2].op, COLL_P2P);
	static const int32_t d2[2] = {0, 1};
	near(cost_allreduce_ms(&c, d2, 2, 16384), 0.2, "priced from the loaded points");
	cluster_release(&c);
}

/* The network's senders' queues (fluid.c new_job, pend_pop) change only
 * where jobs wait to start, never when: random transfers between 16 GPUs
 * of 4 nodes with 2 NICs each, added in rounds as the simulator adds
 * them (each sender's clock mostly going on, sometimes back, so a job
 * also takes the list and the heap), with all-reduces beside them, and
 * the network run to an awaited arrival between rounds, end at the same
 * bits with the queues as without (queues 0). The queues must be used. */
static void send_queue_run(sp_arena_t *a, int queues, double *done, int *used)
{
	enum { N = 16, ROUNDS = 40, PER = 12 };
	static const int32_t devs[4] = {0, 5, 10, 15};
	sp_cluster_t c = cluster(4, 4, 2, 5);
	fl_net_t *n = sp_arena_calloc(a, 1, sizeof *n);
	assert_non_null(n);
	assert_int_equal(fl_init(n, &c, a, ROUNDS * (PER + 1)), 0);
	n->queues = queues;
	double clock[N] = {0};
	unsigned r = 12345;
	int nj = 0;
	*used = 0;
	for (int round = 0; round < ROUNDS; round++) {
		for (int i = 0; i < PER; i++) {
			r = r * 1103515245u + 12345u;
			int d = (int)(r >> 8) % N, peer = (d + 1 + (int)(r >> 16) % (N - 1)) % N;
			/* mostly on, one in eight back (not before the network) */
			double step = ((r >> 4) % 8 == 0 ? -0.5 : 0.25) * (double)((r >> 12) % 5);
			clock[d] = fmax(n->now, clock[d] + step);
			int j = fl_xfer(n, clock[d], d, peer, (int64_t)(1 + (r >> 20) % 4) * S_BYTES / 4);
			assert_int_equal(j, nj++);
			fl_await(n, j);
		}
		*used |= n->src.n > 0;
		if (round % 5 == 0)
			assert_int_equal(fl_coll(n, n->now + 0.1, devs, 4, S_BYTES, COLL_ALL_REDUCE),
					 nj++);
		assert_true(fl_advance(n, 1) >= 0);
	}
	assert_int_equal(fl_advance(n, 0), 0);
	for (int j = 0; j < nj; j++)
		done[j] = fl_done(n, j);
	done[nj] = -2;
}

static void test_send_queues_exact(void **state)
{
	static double on[600], off[600];
	int used_on, used_off;
	send_queue_run(*state, 1, on, &used_on);
	send_queue_run(*state, 0, off, &used_off);
	assert_true(used_on);
	assert_false(used_off);
	for (int j = 0; on[j] != -2 || off[j] != -2; j++) {
		if (memcmp(&on[j], &off[j], sizeof on[j])) {
			fprintf(stderr, "job %d: done at %.17g ms with the queues, %.17g without\n",
				j, on[j], off[j]);
			fail();
		}
		assert_true(on[j] >= 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rails),
		cmocka_unit_test(test_one_nic_is_old_price),
		cmocka_unit_test(test_ring_or_hierarchical),
		cmocka_unit_test(test_tree_and_ring_latency),
		cmocka_unit_test(test_phases_price),
		cmocka_unit_test(test_reduce_scatter_phases),
		cmocka_unit_test_setup_teardown(test_two_flows_one_nic, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_two_flows_two_rails, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_allreduce_beside_flow, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_share_given_back, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_transfer_sides, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_half_jobs_alone, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_leave_in_turn, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_last_round, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_fair_many_rounds, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_event_groups, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_allreduce_queue, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_phases_in_turn, arena_setup, arena_teardown),
		cmocka_unit_test_setup_teardown(test_allreduce_order_per_device, arena_setup,
						arena_teardown),
		cmocka_unit_test_setup_teardown(test_send_queues_exact, arena_setup, arena_teardown),
		cmocka_unit_test(test_measured_interp),
		cmocka_unit_test(test_xfer_scale_unmeasured),
		cmocka_unit_test(test_measured_loaded),
		cmocka_unit_test_setup_teardown(test_measured_phases, arena_setup, arena_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
