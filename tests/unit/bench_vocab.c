/*
 * bench_vocab.c — the vocabulary-parallel embedding's own work (issue
 * #18's split-layer target, without the collectives): each member of a
 * t-way split (layers_vocab.c embedding_fwd_tp / embedding_bwd_tp, its
 * all-reduce and all-gather no-ops) against the unsplit layer / t, one
 * process, calls interleaved (unsplit, member 0, ..., member t-1) per
 * round. Prints the least and the median time over the rounds and, for
 * the slowest member, its time over unsplit / t. Cold (the default): a
 * 64 MiB buffer is written before every call, as the runtime's step
 * leaves the caches (the LM head runs between two embedding calls);
 * --hot: no flush. Shapes of tools/bench-tp --what vocab: n 4, seq 128,
 * h 512, V 4096; tokens as data.c makes them (a random first token per
 * sample, then t -> 5t + 3 mod V). Prints numbers, asserts nothing.
 *
 * Usage: bench_vocab [T [ROUNDS]] [--hot]
 */
#define _POSIX_C_SOURCE 200809L
#include "layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenBLAS's threads (spinning after start-up) would take the core */
void openblas_set_num_threads(int n) __attribute__((weak));

enum { N = 4, SQ = 128, HID = 512, VOC = 4096, TMAX = 8, FLUSH = 64 << 20 };

static int noop(void *ctx, float *buf, int64_t n)
{
	(void)ctx;
	(void)buf;
	(void)n;
	return 0;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	int t = 2, rounds = 300, hot = 0, pos = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--hot"))
			hot = 1;
		else if (pos++ == 0)
			t = atoi(argv[i]);
		else
			rounds = atoi(argv[i]);
	}
	if (t < 2 || t > TMAX || rounds < 1) {
		fprintf(stderr, "usage: bench_vocab [T (2-%d) [ROUNDS]] [--hot]\n", TMAX);
		return 2;
	}
	if (openblas_set_num_threads)
		openblas_set_num_threads(1);
	int64_t rows = (int64_t)N * SQ, np = (int64_t)(VOC + SQ) * HID;
	sp_opshape_t s = {.type = COMP_EMBEDDING, .hidden = HID, .seq = SQ, .vocab = VOC};
	float *p = malloc(sizeof(float) * (size_t)np), *dp = calloc((size_t)np, sizeof(float));
	float *y = malloc(sizeof(float) * (size_t)(rows * HID));
	float *dy = malloc(sizeof(float) * (size_t)(rows * HID));
	float *saved = malloc(sizeof(float) * (size_t)rows);
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)rows);
	char *junk = calloc(FLUSH, 1);
	/* [k][0]: unsplit, [k][1 + j]: member j; forward then backward */
	double *ms = malloc(sizeof(double) * (size_t)rounds * 2 * (TMAX + 1));
	if (!p || !dp || !y || !dy || !saved || !tok || !junk || !ms) {
		fprintf(stderr, "bench_vocab: out of memory\n");
		return 1;
	}
	srand(1);
	for (int64_t i = 0; i < np; i++)
		p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
	for (int64_t i = 0; i < rows * HID; i++)
		dy[i] = (float)rand() / (float)RAND_MAX - 0.5f;
	for (int i = 0; i < N; i++) {
		int64_t v = rand() % VOC;
		for (int q = 0; q < SQ; q++, v = (5 * v + 3) % VOC)
			tok[i * SQ + q] = (int32_t)v;
	}
	/* member j's parameters are the first vm token rows and the position
	 * rows after them: p serves every member (timing, not values) */
	for (int k = 0; k < rounds; k++)
		for (int j = -1; j < t; j++)
			for (int dir = 0; dir < 2; dir++) {
				rt_tp_t tp = {.t = t, .rank = j, .allreduce = noop,
					      .allgather = noop, .reduce_scatter = noop};
				for (size_t b = 0; !hot && b < FLUSH; b += 64)
					junk[b]++;
				double t0 = now_ms();
				int rc = 0;
				if (dir == 0)
					rc = j < 0 ? (embedding_fwd(&s, N, p, tok, y, saved), 0)
						   : embedding_fwd_tp(&s, &tp, N, p, tok, y, saved);
				else
					rc = j < 0 ? (embedding_bwd(&s, N, saved, dy, dp), 0)
						   : embedding_bwd_tp(&s, &tp, N, saved, dy, dp);
				if (rc) {
					fprintf(stderr, "bench_vocab: the split layer refused t %d\n", t);
					return 1;
				}
				ms[((size_t)dir * (TMAX + 1) + (size_t)(j + 1)) * (size_t)rounds +
				   (size_t)k] = now_ms() - t0;
			}
	printf("bench_vocab: embedding n %d seq %d h %d V %d, t %d, %d rounds, %s caches; "
	       "ms least/median\n",
	       N, SQ, HID, VOC, t, rounds, hot ? "hot" : "cold");
	for (int dir = 0; dir < 2; dir++) {
		double least[TMAX + 1], med[TMAX + 1];
		for (int j = 0; j <= t; j++) {
			double *v = ms + ((size_t)dir * (TMAX + 1) + (size_t)j) * (size_t)rounds;
			med[j] = median(v, rounds);
			least[j] = v[0];
		}
		printf("  %s: unsplit %.4f/%.4f, unsplit/%d %.4f/%.4f; members", dir ? "bwd" : "fwd",
		       least[0], med[0], t, least[0] / t, med[0] / t);
		double wl = 0, wm = 0;
		for (int j = 1; j <= t; j++) {
			printf(" %.4f/%.4f", least[j], med[j]);
			wl = least[j] > wl ? least[j] : wl;
			wm = med[j] > wm ? med[j] : wm;
		}
		printf("; slowest member / (unsplit/%d) %.2f/%.2f\n", t, wl / (least[0] / t),
		       wm / (med[0] / t));
	}
	free(p);
	free(dp);
	free(y);
	free(dy);
	free(saved);
	free(tok);
	free(junk);
	free(ms);
	return 0;
}
