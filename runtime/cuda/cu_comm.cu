/*
 * cu_comm.cu — the one kernel of the NCCL data plane (comm_nccl.c): the
 * repacking of a sharded collective's padded scratch. A bucket of n
 * elements is sharded over k members as comm_shard does (member i's
 * [n i / k, n (i + 1) / k)); ncclReduceScatter and ncclAllGather take one
 * count per member, so where k does not divide n the halves run over a
 * padded layout (chunks of c = ceil(n / k), the tail of each 0), a window
 * [r0, r0 + m) of every chunk at a time (member i's at [i m, (i + 1) m)
 * of the scratch), that this kernel makes from the bucket and takes apart
 * again. Runs on the stream it is given (the group's, not the compute
 * stream); reads and writes only what the shards say.
 */
#include "cuda_backend.h"

#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;

/* One thread per scratch element of members [first, ...): t's member
 * i = first + t / m, its place r = r0 + t % m in the member's shard. */
__global__ void repack_kernel(float *dst, const float *src, int64_t n, int k, int64_t r0,
			      int64_t m, int to_padded, int first, int64_t total)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
	     t += (int64_t)gridDim.x * blockDim.x) {
		int64_t i = first + t / m, r = r0 + t % m;
		int64_t off = n * i / k, cnt = n * (i + 1) / k - off;
		int64_t pad = i * m + t % m;
		if (to_padded)
			dst[pad] = r < cnt ? src[off + r] : 0.0f;
		else if (r < cnt)
			dst[off + r] = src[pad];
	}
}

} // namespace

extern "C" int cu_shard_repack(float *dst, const float *src, int64_t n, int k, int64_t r0,
			       int64_t m, int to_padded, int who, void *stream)
{
	int first = who >= 0 ? who : 0, members = who >= 0 ? 1 : k;
	int64_t total = (int64_t)members * m;
	if (total <= 0)
		return 0;
	int64_t blocks = (total + kThreads - 1) / kThreads;
	unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
	repack_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(dst, src, n, k, r0, m,
								  to_padded, first, total);
	return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
