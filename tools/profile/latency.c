/*
 * latency.c — spindle-latency: measures the latency one message between
 * two ranks sees on this machine, the way spindle-run moves it, to put
 * into a cluster file's links.intra_node_latency_us (tools/run-demo).
 *
 *   mpirun -np N spindle-latency [--bytes B] [--rounds R] [--work-us W]
 *
 * Ranks pair up (r, r xor 1; N even) and every pair ping-pongs at once, so
 * the machine is as loaded as N ranks of spindle-run: B bytes (default
 * 1024, one sample's activation of a small model), R timed rounds after
 * R / 10 discarded ones. Between rounds each rank computes for W
 * microseconds (default 0), as a rank runs layers between transfers.
 * Waits poll like runtime/interp.c (the transport's test, a 20 us nap
 * after 1000 polls), so where ranks outnumber cores the figure includes
 * the time a peer waits to be scheduled. Prints on rank 0 the median over
 * pairs and rounds of half the round trip, in microseconds:
 * "latency_us X". It does not measure bandwidth or collectives.
 * Exit status: 0, 1 failure (communication), 2 bad input.
 */
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Polls r until done, as interp.c's wait_req does (without its timeout). */
static int poll_done(rt_comm_t *c, rt_req_t *r)
{
	struct timespec nap = {0, 20000};
	for (long spin = 0;; spin++) {
		int done = 0;
		if (c->ops->test(c, r, &done))
			return -1;
		if (done)
			return 0;
		if (spin > 1000)
			nanosleep(&nap, NULL);
	}
}

/* Busy work for us microseconds. */
static void work(double us)
{
	double end = now_us() + us;
	volatile double x = 1;
	while (now_us() < end)
		for (int i = 0; i < 1000; i++)
			x = x * 1.0000001 + 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int parse(int argc, char **argv, long *bytes, long *rounds, double *work_us)
{
	for (int i = 1; i < argc; i++) {
		char *end = NULL;
		if (i + 1 >= argc) {
			fprintf(stderr, "spindle-latency: '%s' needs a value\n", argv[i]);
			return 2;
		}
		double v = strtod(argv[i + 1], &end);
		if (*end || v < 0 || v > 1e9) {
			fprintf(stderr, "spindle-latency: %s: invalid number '%s'\n", argv[i],
				argv[i + 1]);
			return 2;
		}
		if (!strcmp(argv[i], "--bytes"))
			*bytes = (long)v;
		else if (!strcmp(argv[i], "--rounds"))
			*rounds = (long)v;
		else if (!strcmp(argv[i], "--work-us"))
			*work_us = v;
		else {
			fprintf(stderr, "usage: mpirun -np N spindle-latency [--bytes B] "
					"[--rounds R] [--work-us W]\n");
			return 2;
		}
		i++;
	}
	return *rounds > 0 && *bytes > 0 ? 0 : 2;
}

int main(int argc, char **argv)
{
	long bytes = 1024, rounds = 200;
	double work_us = 0;
	rt_comm_t c;
	sp_err_t err = {0};
	if (parse(argc, argv, &bytes, &rounds, &work_us))
		return 2;
	if (!comm_mpi_available() || comm_mpi_init(&c, &argc, &argv, &err)) {
		fprintf(stderr, "spindle-latency: needs MPI (run under mpirun)\n");
		return 2;
	}
	int rc = 0, peer = c.rank ^ 1, lead = !(c.rank & 1);
	long warm = rounds / 10, n = warm + rounds;
	char *buf = calloc((size_t)bytes, 1);
	double *half = calloc((size_t)rounds + 1, sizeof *half), *all = NULL; /* this rank's */
	size_t *sizes = NULL;
	if (c.nranks % 2) {
		fprintf(stderr, "spindle-latency: needs an even number of ranks\n");
		rc = 2;
	} else if (!buf || !half) {
		fprintf(stderr, "spindle-latency: out of memory\n");
		rc = 1;
	}
	for (long k = 0; !rc && k < n; k++) {
		rt_req_t r = {0};
		work(work_us);
		double t0 = now_us();
		for (int leg = 0; !rc && leg < 2; leg++) {
			int sending = leg == !lead; /* the lead sends first */
			rc = (sending ? c.ops->isend(&c, buf, (size_t)bytes, peer, 7, &r)
				      : c.ops->irecv(&c, buf, (size_t)bytes, peer, 7, &r)) ||
			     poll_done(&c, &r);
		}
		if (k >= warm)
			half[k - warm] = (now_us() - t0) / 2;
	}
	if (!rc && c.ops->gather(&c, half, sizeof(double) * (size_t)rounds, (void **)&all,
				 &sizes))
		rc = 1;
	if (!rc && c.rank == 0) {
		qsort(all, (size_t)(rounds * c.nranks), sizeof *all, cmp_double);
		printf("latency_us %.1f\n", all[rounds * c.nranks / 2]);
	}
	free(all);
	free(sizes);
	free(half);
	free(buf);
	c.ops->finalize(&c);
	return rc;
}
