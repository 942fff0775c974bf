/*
 * coll_predict.c — spindle-coll-predict, the planner's price of
 * collectives for tools/bench-collectives: reads a cluster file, then lines
 * "OP RANKS NODES BYTES" on stdin (OP as in the cluster's "collectives"),
 * and prints for each the milliseconds planner/net.c gives (measured points
 * where the cluster has them, else the analytic model), %.6g, one a line.
 * The group is the first RANKS/NODES GPUs of each of the first NODES nodes;
 * p2p goes from GPU 0 to GPU 1 (1 node) or to the next node's GPU 0.
 * It plans nothing and is not installed.
 * Exit status: 0, 2 bad input (the cluster, or a line: named on stderr).
 */
#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double price(const sp_cluster_t *c, int op, int n, int m, int64_t bytes, int32_t *devs)
{
	int k = n / m;
	for (int i = 0; i < n; i++)
		devs[i] = (i / k) * c->gpus_per_node + i % k;
	switch (op) {
	case COLL_ALL_REDUCE: return cost_allreduce_ms(c, devs, n, bytes);
	case COLL_ALL_GATHER: return cost_all_gather_ms(c, devs, n, bytes);
	case COLL_REDUCE_SCATTER: return cost_reduce_scatter_ms(c, devs, n, bytes);
	default: return cost_xfer_ms(c, devs[0], devs[1], bytes);
	}
}

int main(int argc, char **argv)
{
	sp_cluster_t c;
	sp_err_t err = {0};
	if (argc != 2) {
		fprintf(stderr, "usage: spindle-coll-predict CLUSTER.json < 'OP RANKS NODES BYTES' lines\n");
		return SP_EXIT_INPUT;
	}
	if (cluster_load(&c, argv[1], &err)) {
		sp_err_print(stderr, &err);
		return SP_EXIT_INPUT;
	}
	int32_t *devs = calloc((size_t)c.nodes * c.gpus_per_node + 2, sizeof *devs);
	char name[32];
	int n, m, line = 0, status = devs ? SP_EXIT_OK : SP_EXIT_FAIL;
	long long bytes;
	while (status == SP_EXIT_OK && scanf("%31s %d %d %lld", name, &n, &m, &bytes) == 4) {
		int op = 0;
		line++;
		while (op < COLL__COUNT && strcmp(name, SP_COLL_NAMES[op]))
			op++;
		if (op == COLL__COUNT || m < 1 || n < 2 || n % m || m > c.nodes ||
		    n / m > c.gpus_per_node || (op == COLL_P2P && n != 2) || bytes < 0) {
			fprintf(stderr, "spindle-coll-predict: line %d: '%s %d %d %lld' is not an op "
					"on a group this cluster holds\n", line, name, n, m, bytes);
			status = SP_EXIT_INPUT;
			break;
		}
		printf("%.6g\n", price(&c, op, n, m, (int64_t)bytes, devs));
	}
	free(devs);
	cluster_release(&c);
	return status;
}
