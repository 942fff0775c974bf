/*
 * net.c — the network part of the cost model: which NIC a GPU uses, the
 * isolated price of a point-to-point transfer and of an all-reduce, and the
 * same all-reduce as phases of per-link byte loads, which the simulator's
 * fair-sharing network (fluid.c) drains under contention. It prices one
 * operation alone; sharing between operations is fluid.c's.
 *
 * Cluster: G GPUs per node, K NICs per node (links.nics_per_node), GPU g of
 * a node uses NIC floor(g K / G) (rail-optimised). B_n = intra_node_gbs per
 * GPU port and direction (NVLink via NVSwitch), B_x = inter_node_gbs per NIC
 * and direction; a_n, a_x their latencies. Resources (the links that can be
 * shared): every GPU's intra-node port and every NIC, each direction apart.
 *
 * P2P of S bytes from a to b:
 *   same node:   a_n + S / B_n      (a's port out, b's port in)
 *   other nodes: a_x + S / B_x      (a's rail NIC out, b's rail NIC in)
 *
 * All-reduce of S bytes over a group of n GPUs on m nodes, k_j of them on
 * node j, using u_j distinct NICs there; c_max = most group GPUs on one NIC.
 * NCCL picks the cheaper of its algorithms from the sizes alone; we price
 * both and take the minimum (ties: ring):
 *
 *   flat ring: every link of the ring carries 2 (n-1)/n S. NCCL runs one
 *     ring per NIC a node can offer (channels), so the ring traffic leaving
 *     node j spreads over its u_j NICs and the slowest node has u_min. Of
 *     the ring's 2 (n-1) steps, 2 (m-1) cross a node boundary and pay a_x,
 *     the other 2 (n-m) stay on NVLink and pay a_n (NCCL's own ring model,
 *     src/graph/tuning.cc: (nsteps - nInterSteps) intraLat + nInterSteps
 *     interLat):
 *       t_ring = 2 (n-1)/n S / min(u_min B_x, B_n if some k_j >= 2)
 *                + 2 (m-1) a_x + 2 (n-m) a_n        (m >= 2)
 *       t_ring = 2 (n-1)/n S / B_n + 2 (n-1) a_n    (m = 1)
 *     Loads: each NIC the group uses on node j, 2 (n-1)/n S / u_j each way;
 *     each GPU's port on a node with k_j >= 2, 2 (n-1)/n S each way.
 *
 *   tree (all-reduce only, m >= 2; NCCL's double binary tree, a chain
 *     inside each node and a binary tree over the nodes, reduce up then
 *     broadcast down): each node sends and receives about 2 S in all, at
 *     NCCL's tree efficiency TREE_EFF = 0.9 of the link (tuning.cc:
 *     busBw * .9, algorithm bandwidth busBw / 2), and the latency is two
 *     passes of the chain and the tree's depth (tuning.cc: 2 ((nRanks /
 *     nNodes - 1) intraLat + log2(nNodes) interLat)):
 *       t_tree = 2 S / (TREE_EFF min(u_min B_x, B_n if some k_j >= 2))
 *                + 2 ((k_max - 1) a_n + ceil(log2 m) a_x)
 *     Loads: each NIC of node j, 2 S / (TREE_EFF u_j) each way; each GPU's
 *     port on a node with k_j >= 2, 2 S / TREE_EFF each way. Where latency
 *     rules (many nodes, small buckets) the tree wins, as NCCL picks it;
 *     where bandwidth does, the ring.
 *
 *   hierarchical (only when every node holds the same k GPUs of the group,
 *     m >= 2): reduce-scatter inside each node over NVLink, k all-reduces of
 *     S/k across nodes (one per local rank, each over its GPU's rail NIC, so
 *     a NIC carries the shards of the c_x group GPUs it serves), all-gather
 *     inside each node:
 *       t_rs = t_ag = (k-1)/k S / B_n + (k-1) a_n          (0 when k = 1)
 *       t_x  = 2 (m-1)/m c_max S/k / B_x + 2 (m-1) a_x
 *       t_hier = t_rs + t_x + t_ag
 *     Loads: the ports (k-1)/k S each way in the first and last phase; NIC
 *     x, 2 (m-1)/m c_x S/k each way in the middle one.
 *
 * With one NIC per node and one GPU of the group per node, both are
 * 2 (n-1)/n S / B_x + 2 (n-1) a_x, the price before NICs were modelled
 * (tests/unit/test_net.c checks it).
 *
 * Reduce-scatter and all-gather of S bytes (zero-1's halves): a ring
 * all-reduce is one of each, each moving (n-1)/n S per device, so each is
 * priced at half the all-reduce by ring or hierarchical, never by tree
 * (NCCL has no tree for them).
 *
 * Measured points (the cluster's "collectives", spindle-profile
 * --collectives) replace these formulas where they cover the operation:
 *   shape: among the points of the op measured on the group's node count
 *     m, the ranks r nearest the group's n by |ln(r / n)| (ties: the
 *     smaller r). No point on m nodes: the formulas above. Nodes must
 *     match because one more node swaps NVLink for a NIC, which no rule on
 *     ranks alone can carry over.
 *   size: between measured sizes b_i <= S <= b_i+1, log-log interpolation,
 *     ln t = ln t_i + (ln t_i+1 - ln t_i) (ln S - ln b_i) / (ln b_i+1 - ln b_i),
 *     exact on both regimes of t = a + S / B (flat where latency rules,
 *     proportional where bandwidth does; a linear rule in ln S would be 25%
 *     off halfway between points four times apart); below the smallest,
 *     its time (the latency floor); above the largest, t_last S / b_last
 *     (bandwidth-bound).
 *   ranks: times (n-1)/n / ((r-1)/r), the ring's per-device volume ratio
 *     (1 when r = n, and for p2p, always 2 ranks).
 * For the simulator the phases of an all-reduce keep their links and are
 * scaled, bytes and latencies alike, by measured / analytic, so alone they
 * take the measured time and under contention share links as before.
 */
#include "planner.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* dev_nic, inlined in this file's loops over a group's devices */
static inline int nic_of(const sp_cluster_t *c, int d)
{
	int g = d % c->gpus_per_node, k = c->nics > 0 ? c->nics : 1;
	return dev_node(c, d) * k + g * k / c->gpus_per_node;
}

int dev_nic(const sp_cluster_t *c, int d)
{
	return nic_of(c, d);
}

int net_n_res(const sp_cluster_t *c)
{
	int k = c->nics > 0 ? c->nics : 1;
	return 2 * c->nodes * c->gpus_per_node + 2 * c->nodes * k;
}

/* Resource ids: ports out, ports in, NICs out, NICs in. */
static int res_port(const sp_cluster_t *c, int d, int in)
{
	return in * c->nodes * c->gpus_per_node + d;
}

static int res_nic(const sp_cluster_t *c, int nic, int in)
{
	int k = c->nics > 0 ? c->nics : 1;
	return 2 * c->nodes * c->gpus_per_node + in * c->nodes * k + nic;
}

double net_res_gbs(const sp_cluster_t *c, int r)
{
	return r < 2 * c->nodes * c->gpus_per_node ? c->intra_gbs : c->inter_gbs;
}

/* ---- measured points ---------------------------------------------------------- */

/* t(S) of one measured shape (len >= 1 points, bytes increasing), the
 * size rule at the top of the file. */
static double curve_ms(const sp_coll_point_t *p, int len, double S)
{
	if (S <= p[0].bytes)
		return p[0].ms;
	if (S >= p[len - 1].bytes)
		return p[len - 1].ms * S / p[len - 1].bytes;
	int i = 0;
	while (p[i + 1].bytes < S)
		i++;
	double x = log(S / p[i].bytes) / log(p[i + 1].bytes / p[i].bytes);
	return exp(log(p[i].ms) + x * log(p[i + 1].ms / p[i].ms));
}

int net_measured_ms(const sp_cluster_t *c, sp_coll_op_t op, int n, int m, double bytes,
		    double *out)
{
	const sp_coll_point_t *best = NULL;
	int best_len = 0;
	for (int i = 0, j; i < c->n_coll; i = j) {
		const sp_coll_point_t *p = &c->coll[i];
		for (j = i + 1; j < c->n_coll && c->coll[j].op == p->op &&
				c->coll[j].ranks == p->ranks && c->coll[j].nodes == p->nodes;
		     j++)
			;
		if (p->op != op || p->nodes != m)
			continue;
		/* shapes come in increasing ranks: a tie keeps the smaller */
		if (!best || fabs(log((double)p->ranks / n)) < fabs(log((double)best->ranks / n))) {
			best = p;
			best_len = j - i;
		}
	}
	if (!best)
		return 0;
	double r = best->ranks;
	*out = curve_ms(best, best_len, bytes) * ((n - 1.0) / n) / ((r - 1.0) / r);
	return 1;
}

static double xfer_analytic_ms(const sp_cluster_t *c, int a, int b, double S)
{
	if (dev_node(c, a) == dev_node(c, b))
		return c->intra_lat_us * 1e-3 + S / (c->intra_gbs * 1e6);
	return c->inter_lat_us * 1e-3 + S / (c->inter_gbs * 1e6);
}

double cost_xfer_ms(const sp_cluster_t *c, int a, int b, int64_t bytes)
{
	if (a == b || bytes <= 0)
		return 0;
	double t;
	int m = dev_node(c, a) == dev_node(c, b) ? 1 : 2;
	if (net_measured_ms(c, COLL_P2P, 2, m, (double)bytes, &t))
		return t;
	return xfer_analytic_ms(c, a, b, (double)bytes);
}

double net_xfer_scale(const sp_cluster_t *c, int a, int b, int64_t bytes)
{
	if (a == b || bytes <= 0)
		return 1;
	double x = xfer_analytic_ms(c, a, b, (double)bytes);
	/* without measured points cost_xfer_ms is x itself (the simulator
	 * asks once per transfer: the search for points skipped) */
	return (c->n_coll > 0 ? cost_xfer_ms(c, a, b, bytes) : x) / x;
}

int net_xfer_loads(const sp_cluster_t *c, int a, int b, int *out_res)
{
	if (dev_node(c, a) == dev_node(c, b)) {
		out_res[0] = res_port(c, a, 0);
		out_res[1] = res_port(c, b, 1);
	} else {
		out_res[0] = res_nic(c, nic_of(c, a), 0);
		out_res[1] = res_nic(c, nic_of(c, b), 1);
	}
	return 2;
}

/* The shape of a group (devs in increasing order, as every group the
 * planner builds: nodes and NICs are then monotone along devs). */
typedef struct {
	int n, m, kmin, kmax, umin, cmax;
} group_t;

static void group_shape(const sp_cluster_t *c, const int32_t *devs, int n, group_t *g)
{
	memset(g, 0, sizeof *g);
	g->n = n;
	g->kmin = g->umin = n + 1;
	int k = 0, u = 0, cnic = 0, last_nic = -1;
	for (int i = 0, last_node = -1; i < n; i++) {
		assert(i == 0 || devs[i] > devs[i - 1]);
		int node = dev_node(c, devs[i]), nic = nic_of(c, devs[i]);
		if (i == 0 || node != last_node) {
			if (i > 0) {
				g->kmin = SP_MIN(g->kmin, k);
				g->kmax = SP_MAX(g->kmax, k);
				g->umin = SP_MIN(g->umin, u);
			}
			g->m++;
			k = u = 0;
		}
		if (i == 0 || nic != last_nic) {
			u++;
			cnic = 0;
		}
		last_node = node;
		last_nic = nic;
		k++;
		cnic++;
		g->cmax = SP_MAX(g->cmax, cnic);
	}
	g->kmin = SP_MIN(g->kmin, k);
	g->kmax = SP_MAX(g->kmax, k);
	g->umin = SP_MIN(g->umin, u);
}

#define TREE_EFF 0.9

/* The slowest link a ring or tree crosses between nodes (m >= 2). */
static double xnode_gbs(const sp_cluster_t *c, const group_t *g)
{
	double bw = g->umin * c->inter_gbs;
	return g->kmax >= 2 ? fmin(bw, c->intra_gbs) : bw;
}

/* The ring's latency: 2 (m-1) steps across nodes, 2 (n-m) inside them. */
static double ring_lat_ms(const sp_cluster_t *c, const group_t *g)
{
	if (g->m == 1)
		return 2.0 * (g->n - 1) * c->intra_lat_us * 1e-3;
	return (2.0 * (g->m - 1) * c->inter_lat_us + 2.0 * (g->n - g->m) * c->intra_lat_us) * 1e-3;
}

/* t_ring above; m = 1 is a ring over the ports alone */
static double ring_ms(const sp_cluster_t *c, const group_t *g, double S)
{
	double vol = 2.0 * (g->n - 1) / g->n * S;
	double bw = g->m == 1 ? c->intra_gbs : xnode_gbs(c, g);
	return vol / (bw * 1e6) + ring_lat_ms(c, g);
}

static double tree_lat_ms(const sp_cluster_t *c, const group_t *g)
{
	return 2.0 * ((g->kmax - 1) * c->intra_lat_us + ceil(log2(g->m)) * c->inter_lat_us) * 1e-3;
}

/* t_tree above; HUGE_VAL where it does not apply */
static double tree_ms(const sp_cluster_t *c, const group_t *g, double S)
{
	if (g->m < 2)
		return HUGE_VAL;
	return 2.0 * S / (TREE_EFF * xnode_gbs(c, g) * 1e6) + tree_lat_ms(c, g);
}

/* t_hier above; HUGE_VAL where it does not apply */
static double hier_ms(const sp_cluster_t *c, const group_t *g, double S)
{
	if (g->m < 2 || g->kmin != g->kmax)
		return HUGE_VAL;
	int k = g->kmin, m = g->m;
	double t_in = (k - 1.0) / k * S / (c->intra_gbs * 1e6) + (k - 1) * c->intra_lat_us * 1e-3;
	double t_x = 2.0 * (m - 1) / m * g->cmax * S / k / (c->inter_gbs * 1e6) +
		     2.0 * (m - 1) * c->inter_lat_us * 1e-3;
	return 2 * t_in + t_x;
}

double cost_allreduce_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes)
{
	if (n <= 1 || bytes <= 0)
		return 0;
	group_t g;
	double t;
	group_shape(c, devs, n, &g);
	if (net_measured_ms(c, COLL_ALL_REDUCE, n, g.m, (double)bytes, &t))
		return t;
	return fmin(fmin(ring_ms(c, &g, (double)bytes), hier_ms(c, &g, (double)bytes)),
		    tree_ms(c, &g, (double)bytes));
}

/* A half of the all-reduce: measured when op has a point on the group's
 * node count, else the measured all-reduce's half, else half the ring's or
 * hierarchical all-reduce (no tree: NCCL has none for the halves). */
static double half_ms(const sp_cluster_t *c, sp_coll_op_t op, const int32_t *devs, int n,
		      int64_t bytes)
{
	group_t g;
	double t;
	if (n <= 1 || bytes <= 0)
		return 0;
	group_shape(c, devs, n, &g);
	if (net_measured_ms(c, op, n, g.m, (double)bytes, &t))
		return t;
	if (net_measured_ms(c, COLL_ALL_REDUCE, n, g.m, (double)bytes, &t))
		return t / 2;
	return fmin(ring_ms(c, &g, (double)bytes), hier_ms(c, &g, (double)bytes)) / 2;
}

double cost_reduce_scatter_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes)
{
	return half_ms(c, COLL_REDUCE_SCATTER, devs, n, bytes);
}

double cost_all_gather_ms(const sp_cluster_t *c, const int32_t *devs, int n, int64_t bytes)
{
	return half_ms(c, COLL_ALL_GATHER, devs, n, bytes);
}

static void put(net_phase_t *ph, int res, double bytes)
{
	ph->load[ph->n_load++] = (net_load_t){res, bytes};
}

/* Every group GPU's port, both ways. */
static void port_loads(const sp_cluster_t *c, net_phase_t *ph, const int32_t *devs, int n,
		       double bytes)
{
	for (int i = 0; i < n; i++) {
		put(ph, res_port(c, devs[i], 0), bytes);
		put(ph, res_port(c, devs[i], 1), bytes);
	}
}

/* NIC loads node by node: the ring's vol / u_j per NIC (per_gpu = 0), or
 * the hierarchical middle phase's per_gpu * c_x (ring = 0). */
static void nic_loads(const sp_cluster_t *c, net_phase_t *ph, const int32_t *devs, int n,
		      double vol, double per_gpu)
{
	for (int i0 = 0, i1; i0 < n; i0 = i1) {
		int u = 0;
		for (i1 = i0; i1 < n && dev_node(c, devs[i1]) == dev_node(c, devs[i0]); i1++)
			u += i1 == i0 || nic_of(c, devs[i1]) != nic_of(c, devs[i1 - 1]);
		for (int a = i0, b; a < i1; a = b) {
			for (b = a; b < i1 && nic_of(c, devs[b]) == nic_of(c, devs[a]); b++)
				;
			double x = per_gpu > 0 ? per_gpu * (b - a) : vol / u;
			put(ph, res_nic(c, nic_of(c, devs[a]), 0), x);
			put(ph, res_nic(c, nic_of(c, devs[a]), 1), x);
		}
	}
}

static net_phase_t *new_phase(net_coll_t *out, sp_arena_t *a, int cap, double lat_ms)
{
	net_phase_t *ph = &out->ph[out->n_phase];
	ph->load = sp_arena_calloc(a, (size_t)cap + 1, sizeof *ph->load);
	if (!ph->load)
		return NULL;
	ph->n_load = 0;
	ph->lat_ms = lat_ms;
	out->n_phase++;
	return ph;
}

/* The analytic choice's phases (g: the group's shape). */
static int analytic_phases(net_coll_t *out, const sp_cluster_t *c, const int32_t *devs, int n,
			   const group_t *gp, double S, int no_tree, sp_arena_t *a)
{
	group_t g = *gp;
	net_phase_t *ph;
	double ring = ring_ms(c, &g, S), hier = hier_ms(c, &g, S);
	double tree = no_tree ? HUGE_VAL : tree_ms(c, &g, S);
	if (ring <= hier || tree < hier) {
		/* ring and tree load the same links, by their volumes */
		int is_tree = tree < ring;
		double vol = is_tree ? 2.0 * S / TREE_EFF : 2.0 * (n - 1) / n * S;
		double lat = is_tree ? tree_lat_ms(c, &g) : ring_lat_ms(c, &g);
		if (!(ph = new_phase(out, a, 4 * n, lat)))
			return SP_ENOMEM;
		if (g.m > 1)
			nic_loads(c, ph, devs, n, vol, 0);
		/* ports carry the ring inside nodes that hold two or more */
		for (int i0 = 0, i1; i0 < n; i0 = i1) {
			for (i1 = i0; i1 < n && dev_node(c, devs[i1]) == dev_node(c, devs[i0]); i1++)
				;
			if (i1 - i0 >= 2)
				port_loads(c, ph, devs + i0, i1 - i0, vol);
		}
		return 0;
	}
	int k = g.kmin, m = g.m;
	double in_vol = (k - 1.0) / k * S, in_lat = (k - 1) * c->intra_lat_us * 1e-3;
	if (k > 1) {
		if (!(ph = new_phase(out, a, 2 * n, in_lat)))
			return SP_ENOMEM;
		port_loads(c, ph, devs, n, in_vol);
	}
	if (!(ph = new_phase(out, a, 2 * n, 2.0 * (m - 1) * c->inter_lat_us * 1e-3)))
		return SP_ENOMEM;
	nic_loads(c, ph, devs, n, 0, 2.0 * (m - 1) / m * S / k);
	if (k > 1) {
		if (!(ph = new_phase(out, a, 2 * n, in_lat)))
			return SP_ENOMEM;
		port_loads(c, ph, devs, n, in_vol);
	}
	return 0;
}

int net_allreduce_phases(net_coll_t *out, const sp_cluster_t *c, const int32_t *devs, int n,
			 int64_t bytes, int no_tree, sp_arena_t *a)
{
	memset(out, 0, sizeof *out);
	if (n <= 1 || bytes <= 0)
		return 0;
	group_t g;
	double t;
	group_shape(c, devs, n, &g);
	int rc = analytic_phases(out, c, devs, n, &g, (double)bytes, no_tree, a);
	if (rc || !net_measured_ms(c, COLL_ALL_REDUCE, n, g.m, (double)bytes, &t))
		return rc;
	/* measured: the same links, bytes and latencies scaled to take t alone */
	double k = t / net_phases_ms(c, out);
	for (int p = 0; p < out->n_phase; p++) {
		out->ph[p].lat_ms *= k;
		for (int i = 0; i < out->ph[p].n_load; i++)
			out->ph[p].load[i].bytes *= k;
	}
	return 0;
}

int net_half_phases(net_coll_t *out, const sp_cluster_t *c, sp_coll_op_t op,
		    const int32_t *devs, int n, int64_t bytes, sp_arena_t *a)
{
	memset(out, 0, sizeof *out);
	if (n <= 1 || bytes <= 0)
		return 0;
	if (op != COLL_REDUCE_SCATTER && op != COLL_ALL_GATHER)
		return SP_EINTERNAL;
	group_t g;
	group_shape(c, devs, n, &g);
	int rc = analytic_phases(out, c, devs, n, &g, (double)bytes, 1, a);
	if (rc)
		return rc;
	/* A hierarchical all-reduce (three phases) is an intra-node
	 * reduce-scatter, an inter-node all-reduce and an intra-node
	 * all-gather: the reduce-scatter is its first phase whole and half the
	 * second, the all-gather half the second and its third whole. A single
	 * phase (ring, or hierarchical with one GPU per node): half of it, in
	 * bytes and steps. */
	int three = out->n_phase == 3;
	int whole = op == COLL_REDUCE_SCATTER ? 0 : 2;
	for (int p = 0; p < out->n_phase; p++) {
		if (three && p == whole)
			continue;
		out->ph[p].lat_ms /= 2;
		for (int i = 0; i < out->ph[p].n_load; i++)
			out->ph[p].load[i].bytes /= 2;
	}
	if (three && op == COLL_ALL_GATHER)
		out->ph[0] = out->ph[1], out->ph[1] = out->ph[2];
	if (three)
		out->n_phase = 2;
	double t;
	if (!net_measured_ms(c, op, n, g.m, (double)bytes, &t) &&
	    !net_measured_ms(c, COLL_ALL_REDUCE, n, g.m, (double)bytes, &t))
		return 0;
	/* measured: scaled as net_allreduce_phases does, to take
	 * cost_reduce_scatter_ms's or cost_all_gather_ms's measured time alone */
	double k = (op == COLL_REDUCE_SCATTER ? cost_reduce_scatter_ms(c, devs, n, bytes)
					      : cost_all_gather_ms(c, devs, n, bytes)) /
		   net_phases_ms(c, out);
	for (int p = 0; p < out->n_phase; p++) {
		out->ph[p].lat_ms *= k;
		for (int i = 0; i < out->ph[p].n_load; i++)
			out->ph[p].load[i].bytes *= k;
	}
	return 0;
}

double net_phases_ms(const sp_cluster_t *c, const net_coll_t *co)
{
	double t = 0;
	for (int p = 0; p < co->n_phase; p++) {
		double x = 0;
		for (int i = 0; i < co->ph[p].n_load; i++)
			x = fmax(x, co->ph[p].load[i].bytes /
					    (net_res_gbs(c, co->ph[p].load[i].res) * 1e6));
		t += x + co->ph[p].lat_ms;
	}
	return t;
}
