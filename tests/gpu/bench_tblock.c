/*
 * bench_tblock.c — times one transformer block, forward and backward,
 * through the cuda backend's table (what spindle-run calls), and prints
 * one tab-separated line per (shape, batch) with milliseconds, TFLOP/s
 * (matrix-product FLOPs as schemas/arith.c counts them: fwd
 * 8 s h^2 + 4 s^2 h + 4 s h f per sample, bwd twice that) and MFU against
 * a peak (default 989 TFLOP/s, H100/H200 dense bf16).
 *
 *   bench_tblock [--peak TFLOPS] [--reps N] [h a f s causal batch[,batch...]]...
 *
 * Without shape arguments: the bundled workloads' shapes (CLIP vision,
 * QWen-VAL LLM). A benchmark, not a test: it asserts nothing. Exits 77
 * without a GPU.
 */
#include "cuda/cuda_backend.h"
#include "gpu_start.h"
#include "layers.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const rt_backend_t *const B = &backend_cuda;
static rt_comm_t comm;

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *dev_rand(int64_t n, float scale, uint64_t seed)
{
	float *h = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		h[i] = (float)(scale * (2.0 * sp_unit(seed + (uint64_t)i) - 1.0));
	void *d = B->alloc(sizeof(float) * (size_t)n);
	if (d)
		B->to_device(d, h, sizeof(float) * (size_t)n);
	free(h);
	return d;
}

static int bench(int64_t h, int64_t a, int64_t f, int64_t s, int causal, int n, int reps,
		 double peak)
{
	sp_opshape_t sh = {.type = COMP_TRANSFORMER, .hidden = h, .heads = a, .ffn = f, .seq = s,
			   .causal = causal};
	sp_component_t c;
	memset(&c, 0, sizeof c);
	snprintf(c.name, sizeof c.name, "bench");
	c.type = COMP_TRANSFORMER;
	c.hidden = h;
	c.heads = a;
	c.ffn = f;
	c.max_seq = s;
	c.layers = 1;
	c.causal = causal;
	int64_t np = comp_layer_params(&c), e = (int64_t)n * s * h;
	int64_t ns = op_saved_elems(&sh, n) * n;
	float *hp = malloc(sizeof(float) * (size_t)np);
	layer_init(hp, &c, 0, 1);
	float *p = B->alloc(sizeof(float) * (size_t)np), *g = B->alloc(sizeof(float) * (size_t)np);
	float *x = dev_rand(e, 1.0f, 7), *dy = dev_rand(e, 1.0f, 11);
	float *y = B->alloc(sizeof(float) * (size_t)e), *dx = B->alloc(sizeof(float) * (size_t)e);
	float *sv = B->alloc(sizeof(float) * (size_t)ns);
	if (!p || !g || !x || !dy || !y || !dx || !sv) {
		fprintf(stderr, "bench_tblock: out of device memory at batch %d\n", n);
		free(hp);
		B->release(p), B->release(g), B->release(x), B->release(dy), B->release(y),
			B->release(dx), B->release(sv);
		return -1;
	}
	B->to_device(p, hp, sizeof(float) * (size_t)np);
	free(hp);
	double tf = 0, tb = 0;
	for (int r = -2; r < reps; r++) {
		double t0 = now_ms();
		B->tblock_fwd(&sh, NULL, n, p, x, y, sv);
		B->sync();
		double t1 = now_ms();
		B->tblock_bwd(&sh, NULL, n, p, sv, dy, dx, g);
		B->sync();
		double t2 = now_ms();
		if (r >= 0) {
			tf += t1 - t0;
			tb += t2 - t1;
		}
	}
	tf /= reps;
	tb /= reps;
	double ff = (double)op_fwd_flops(&sh, n) * n, fb = (double)op_bwd_flops(&sh, n) * n;
	double tfl = (ff + fb) / ((tf + tb) * 1e-3) / 1e12;
	printf("transformer\th%lld a%lld f%lld s%lld%s\t%d\t%.4f\t%.4f\t%.1f\t%.1f\t%.1f\t%.3f\n",
	       (long long)h, (long long)a, (long long)f, (long long)s, causal ? " causal" : "", n,
	       tf, tb, ff / (tf * 1e-3) / 1e12, fb / (tb * 1e-3) / 1e12, tfl, tfl / peak);
	fflush(stdout);
	B->release(p), B->release(g), B->release(x), B->release(dy), B->release(y), B->release(dx),
		B->release(sv);
	return 0;
}

int main(int argc, char **argv)
{
	double peak = 989;
	int reps = 10, i = 1;
	for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
		if (!strcmp(argv[i], "--peak"))
			peak = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--reps"))
			reps = atoi(argv[i + 1]);
		else
			break;
	}
	if (reps < 1 || peak <= 0 || (argc - i) % 6) {
		fprintf(stderr, "usage: bench_tblock [--peak TFLOPS] [--reps N] "
				"[h a f s causal batch[,batch...]]...\n");
		return 2;
	}
	int up = gpu_start("bench_tblock", &comm);
	if (up)
		return up;
	static const char *dflt[] = {"1280", "16", "5120",  "257", "0", "1,8,32,64",
				     "4096", "32", "11008", "512", "1", "1,2,4,8"};
	const char **args = (const char **)argv + i;
	int nargs = argc - i;
	if (nargs == 0) {
		args = dflt;
		nargs = 12;
	}
	printf("op\tshape\tbatch\tfwd_ms\tbwd_ms\tfwd_tflops\tbwd_tflops\ttflops\tmfu\n");
	for (int k = 0; k + 6 <= nargs; k += 6) {
		char batches[256];
		snprintf(batches, sizeof batches, "%s", args[k + 5]);
		for (char *t = strtok(batches, ","); t; t = strtok(NULL, ","))
			bench(atoll(args[k]), atoll(args[k + 1]), atoll(args[k + 2]), atoll(args[k + 3]),
			      atoi(args[k + 4]), atoi(t), reps, peak);
	}
	gpu_stop(&comm);
	return 0;
}
