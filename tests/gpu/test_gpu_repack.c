/*
 * test_gpu_repack.c — cu_shard_repack (cuda/cu_comm.cu), the kernel the
 * NCCL data plane's padded reduce-scatters and all-gathers run on the
 * group's stream (nccl_pad.c ne_stage_in / ne_stage_out), against a host
 * reference of the same layouts: member i's comm_shard of n elements at
 * its place, and a window [r0, r0 + m) of each padded chunk (c = ceil(n /
 * k)) at i m in the scratch, elements past the shard's end 0. Every
 * direction, all members (who = -1) and one (who = j: nothing outside
 * j's chunk or shard written), the whole chunk and the first, a middle
 * and the last (short) window of rounds, for even and uneven shards,
 * shards empty (n < k) and 672 members. Exits 77 (skip) without a usable GPU.
 * NCCL itself is not here: one GPU cannot hold two NCCL ranks.
 */
#include "cuda/cuda_backend.h"
#include "runtime.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SENT (-3.5f)

static int fails;

static void check(const char *what, int64_t n, int k, int who, int64_t r0, const float *got,
		  const float *want, int64_t len)
{
	for (int64_t i = 0; i < len; i++)
		if (got[i] != want[i]) {
			printf("FAIL %s n=%lld k=%d who=%d r0=%lld: element %lld is %g, want %g\n",
			       what, (long long)n, k, who, (long long)r0, (long long)i, got[i],
			       want[i]);
			fails++;
			return;
		}
}

/* Both device buffers from the host ones, one repack (to_padded: dx ->
 * dp, else dp -> dx), its destination back to the host. */
static void repack(float *dx, float *x, size_t nb, float *dp, float *p, size_t pb, int64_t n,
		   int k, int who, int64_t r0, int64_t m, int to_padded, cudaStream_t st)
{
	cudaMemcpy(dx, x, nb, cudaMemcpyHostToDevice);
	cudaMemcpy(dp, p, pb, cudaMemcpyHostToDevice);
	/* a copy from pageable memory may return before its DMA lands, and st
	 * (non-blocking) does not wait for the default stream */
	if (cudaDeviceSynchronize() ||
	    cu_shard_repack(to_padded ? dp : dx, to_padded ? dx : dp, n, k, r0, m, to_padded, who,
			    st) ||
	    cudaStreamSynchronize(st)) {
		printf("FAIL launch (%s) n=%lld k=%d\n", to_padded ? "to padded" : "from padded",
		       (long long)n, k);
		fails++;
	}
	if (to_padded)
		cudaMemcpy(p, dp, pb, cudaMemcpyDeviceToHost);
	else
		cudaMemcpy(x, dx, nb, cudaMemcpyDeviceToHost);
}

/* One (n, k, who, window) case, both directions, through device buffers. */
static void one(int64_t n, int k, int who, int64_t r0, int64_t m, cudaStream_t st)
{
	int64_t pn = (int64_t)k * m;
	size_t nb = sizeof(float) * (size_t)(n ? n : 1), pb = sizeof(float) * (size_t)(pn ? pn : 1);
	float *x = malloc(nb), *p = malloc(pb), *want = malloc(pb > nb ? pb : nb);
	float *dx, *dp;
	if (!x || !p || !want || cudaMalloc((void **)&dx, nb) != cudaSuccess ||
	    cudaMalloc((void **)&dp, pb) != cudaSuccess) {
		printf("FAIL out of memory at n=%lld\n", (long long)n);
		exit(1);
	}
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(i % 9973) + 0.25f;
	/* bucket -> padded: chunk i holds shard i then zeros; who >= 0 writes
	 * only its chunk */
	for (int64_t i = 0; i < pn; i++)
		want[i] = SENT;
	for (int i = 0; i < k; i++) {
		int64_t off, cnt;
		comm_shard(n, i, k, &off, &cnt);
		for (int64_t t = 0; t < m && (who < 0 || who == i); t++)
			want[i * m + t] = r0 + t < cnt ? x[off + r0 + t] : 0.0f;
	}
	for (int64_t i = 0; i < pn; i++)
		p[i] = SENT;
	repack(dx, x, nb, dp, p, pb, n, k, who, r0, m, 1, st);
	check("to padded", n, k, who, r0, p, want, pn);
	/* padded -> bucket: from a scratch of distinct values; who >= 0 writes
	 * only its shard */
	for (int64_t i = 0; i < pn; i++)
		p[i] = (float)(i % 7919) - 0.5f;
	for (int64_t i = 0; i < n; i++)
		want[i] = SENT;
	for (int i = 0; i < k; i++) {
		int64_t off, cnt;
		comm_shard(n, i, k, &off, &cnt);
		for (int64_t t = 0; t < m && r0 + t < cnt && (who < 0 || who == i); t++)
			want[off + r0 + t] = p[i * m + t];
	}
	for (int64_t i = 0; i < n; i++)
		x[i] = SENT;
	repack(dx, x, nb, dp, p, pb, n, k, who, r0, m, 0, st);
	check("from padded", n, k, who, r0, x, want, n);
	cudaFree(dx);
	cudaFree(dp);
	free(x);
	free(p);
	free(want);
}

int main(void)
{
	if (cu_device_count() <= 0) {
		printf("test_gpu_repack: no usable CUDA device, skipping\n");
		return 77;
	}
	cudaStream_t st;
	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
		printf("FAIL creating a stream: %s\n", cudaGetErrorString(cudaGetLastError()));
		return 1;
	}
	static const struct {
		int64_t n;
		int k;
	} cases[] = {{7, 3}, {8, 4}, {5, 8}, {1, 2}, {1000003, 7}, {4096, 4}, {672 * 37 + 5, 672}};
	int runs = 0;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int k = cases[i].k;
		int64_t c = (cases[i].n + k - 1) / k, m = c > 3 ? c / 3 : 1;
		int whos[4] = {-1, 0, k / 2, k - 1};
		for (int w = 0; w < 4; w++) {
			one(cases[i].n, k, whos[w], 0, c, st); /* the whole chunk */
			runs++;
			/* rounds of m: the first, a middle one, the last (short) */
			int64_t last = (c - 1) / m * m;
			int64_t r0s[3] = {0, c / m / 2 * m, last};
			for (int q = 0; q < 3; q++, runs++)
				one(cases[i].n, k, whos[w], r0s[q], SP_MIN(m, c - r0s[q]), st);
		}
	}
	cudaStreamDestroy(st);
	printf("%s: %d cases, %d failed\n", fails ? "FAIL" : "PASS", runs, fails);
	return fails ? 1 : 0;
}
