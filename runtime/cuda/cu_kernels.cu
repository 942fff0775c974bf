/*
 * cu_kernels.cu — the CUDA backend's own kernels and their host launchers:
 * conversions and broadcasts, deterministic column sums, LayerNorm,
 * GELU (tanh), row softmax for attention, embeddings, the optimizer steps
 * and the pieces of the three losses. Matrix products are not here (cuBLAS,
 * cu_runtime.cu); composing kernels into layers is cu_layers.cu and
 * cu_loss.cu.
 *
 * Conventions: every launcher runs on the backend's stream and checks the
 * launch; indices are 64-bit; reductions accumulate in fp32 inside a row
 * (double where the CPU reference's result is sensitive: losses, norms)
 * and cross-block sums are done in a fixed order, so results do not depend
 * on scheduling (except embedding_bwd's scatter, which uses atomics).
 */
#include "cu_internal.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr float kLnEps = 1e-5f;
constexpr double kNormEps = 1e-12;
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kGeluK = 0.044715f;

/* Blocks for a grid-stride loop over n elements. */
unsigned grid_for(int64_t n)
{
	int64_t b = (n + kThreads - 1) / kThreads;
	if (b < 1)
		b = 1;
	if (b > (1 << 20))
		b = 1 << 20;
	return (unsigned)b;
}

/* Blocks for one warp per row. */
unsigned grid_rows_warp(int64_t rows)
{
	int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
	return (unsigned)(b < 1 ? 1 : b);
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Block-wide reductions (blockDim.x a multiple of 32, <= 1024); every
 * thread gets the result. `sh` has 32 slots. */
__device__ float block_sum(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0f;
	return warp_sum(v);
}

__device__ float block_max(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : -INFINITY;
	return warp_max(v);
}

__device__ double block_sum_d(double v, double *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_sum_d(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0;
	return warp_sum_d(v);
}

template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v)
{
	return v;
}
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v)
{
	return __float2bfloat16(v);
}

__device__ __forceinline__ float to_f32(float v)
{
	return v;
}
__device__ __forceinline__ float to_f32(bf16 v)
{
	return __bfloat162float(v);
}

/* ---- elementwise ---- */

__global__ void to_bf16_kernel(bf16 *dst, const float *src, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16(src[i]);
}

template <class T>
__global__ void fill_rows_kernel(T *y, int64_t ld, const float *v, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / cols, c = i - r * cols;
		y[r * ld + c] = from_f32<T>(v[c]);
	}
}

__global__ void add_rows_kernel(float *y, const float *x, const float *v, int64_t rows,
				int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] = x[i] + v[i % cols];
}

__global__ void bias_pos_kernel(float *y, const float *b, const float *pos, int64_t n,
				int64_t s, int64_t h)
{
	int64_t total = n * s * h, sh = s * h;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t in = i % sh;
		y[i] = b[in % h] + pos[in];
	}
}

__global__ void add_2d_kernel(float *dst, int64_t ldd, const float *src, int64_t lds,
			      int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / cols, c = i - r * cols;
		dst[r * ldd + c] += src[r * lds + c];
	}
}

/* ---- deterministic column sums: partials per row chunk, then in order ---- */

constexpr int kColTile = 32, kColRows = 8, kMaxChunks = 1024;

template <class T>
__global__ void colsum_partial_kernel(float *part, const T *in, int64_t rows, int64_t cols,
				      int64_t ld, int64_t chunk)
{
	__shared__ float sh[kColRows][kColTile + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int64_t c = (int64_t)blockIdx.x * kColTile + tx;
	int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
	float acc = 0.0f;
	if (c < cols)
		for (int64_t r = r0 + ty; r < r1; r += kColRows)
			acc += to_f32(in[r * ld + c]);
	sh[ty][tx] = acc;
	__syncthreads();
	if (ty == 0 && c < cols) {
		float s = 0.0f;
		for (int k = 0; k < kColRows; k++)
			s += sh[k][tx];
		part[(int64_t)blockIdx.y * cols + c] = s;
	}
}

__global__ void colsum_finish_kernel(float *out, const float *part, int64_t nchunks,
				     int64_t cols)
{
	for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
	     c += (int64_t)gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (int64_t k = 0; k < nchunks; k++)
			s += part[k * cols + c];
		out[c] += s;
	}
}

void chunking(int64_t rows, int64_t *chunk, int64_t *nchunks)
{
	int64_t ch = 64;
	if ((rows + ch - 1) / ch > kMaxChunks)
		ch = (rows + kMaxChunks - 1) / kMaxChunks;
	*chunk = ch;
	*nchunks = rows > 0 ? (rows + ch - 1) / ch : 0;
}

template <class T> void colsum_any(float *out, const T *in, int64_t rows, int64_t cols, int64_t ld)
{
	if (rows <= 0 || cols <= 0)
		return;
	int64_t chunk, nch;
	chunking(rows, &chunk, &nch);
	float *part = (float *)cu_red_get(sizeof(float) * (size_t)(nch * cols));
	dim3 grid((unsigned)((cols + kColTile - 1) / kColTile), (unsigned)nch);
	colsum_partial_kernel<T><<<grid, dim3(kColTile, kColRows), 0, cu_s()>>>(part, in, rows,
									   cols, ld, chunk);
	CUDA_LAUNCHED();
	colsum_finish_kernel<<<grid_for(cols), kThreads, 0, cu_s()>>>(out, part, nch, cols);
	CUDA_LAUNCHED();
}

/* ---- LayerNorm: one warp per row ---- */

template <class T>
__global__ void ln_fwd_kernel(T *y, int64_t ldy, float *mean, float *rstd, int64_t ldm,
			      const float *x, int64_t ldx, const float *g, const float *b,
			      int64_t rows, int64_t h)
{
	int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	const float *xr = x + r * ldx;
	float s = 0.0f;
	for (int64_t k = lane; k < h; k += 32)
		s += xr[k];
	float mu = warp_sum(s) / (float)h;
	float ss = 0.0f;
	for (int64_t k = lane; k < h; k += 32) {
		float d = xr[k] - mu;
		ss += d * d;
	}
	float rs = rsqrtf(warp_sum(ss) / (float)h + kLnEps);
	T *yr = y + r * ldy;
	for (int64_t k = lane; k < h; k += 32)
		yr[k] = from_f32<T>((xr[k] - mu) * rs * g[k] + b[k]);
	if (lane == 0) {
		mean[r * ldm] = mu;
		rstd[r * ldm] = rs;
	}
}

__global__ void ln_bwd_kernel(float *dst, int64_t ldd, int acc, const float *resid,
			      int64_t ldr, const float *dln, int64_t ldl, const float *x,
			      int64_t ldx, const float *mean, const float *rstd, int64_t ldm,
			      const float *g, int64_t rows, int64_t h)
{
	int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	const float *xr = x + r * ldx, *dr = dln + r * ldl;
	float mu = mean[r * ldm], rs = rstd[r * ldm];
	float m1 = 0.0f, m2 = 0.0f;
	for (int64_t k = lane; k < h; k += 32) {
		float xh = (xr[k] - mu) * rs, dxh = dr[k] * g[k];
		m1 += dxh;
		m2 += dxh * xh;
	}
	m1 = warp_sum(m1) / (float)h;
	m2 = warp_sum(m2) / (float)h;
	float *o = dst + r * ldd;
	const float *res = resid ? resid + r * ldr : nullptr;
	for (int64_t k = lane; k < h; k += 32) {
		float xh = (xr[k] - mu) * rs, dxh = dr[k] * g[k];
		float v = rs * (dxh - m1 - xh * m2);
		if (res)
			v += res[k];
		o[k] = acc ? o[k] + v : v;
	}
}

/* dg/db partials: like colsum_partial over (dln xhat, dln) */
__global__ void ln_param_partial_kernel(float *pg, float *pb, const float *dln, int64_t ldl,
					const float *x, int64_t ldx, const float *mean,
					const float *rstd, int64_t ldm, int64_t rows, int64_t h,
					int64_t chunk)
{
	__shared__ float s1[kColRows][kColTile + 1], s2[kColRows][kColTile + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int64_t c = (int64_t)blockIdx.x * kColTile + tx;
	int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
	float a1 = 0.0f, a2 = 0.0f;
	if (c < h)
		for (int64_t r = r0 + ty; r < r1; r += kColRows) {
			float d = dln[r * ldl + c];
			float xh = (x[r * ldx + c] - mean[r * ldm]) * rstd[r * ldm];
			a1 += d * xh;
			a2 += d;
		}
	s1[ty][tx] = a1;
	s2[ty][tx] = a2;
	__syncthreads();
	if (ty == 0 && c < h) {
		float u = 0.0f, v = 0.0f;
		for (int k = 0; k < kColRows; k++) {
			u += s1[k][tx];
			v += s2[k][tx];
		}
		pg[(int64_t)blockIdx.y * h + c] = u;
		pb[(int64_t)blockIdx.y * h + c] = v;
	}
}

/* ---- GELU (tanh approximation) ---- */

__global__ void gelu_fwd_kernel(bf16 *act, const float *pre, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float x = pre[i];
		float t = tanhf(kGeluC * (x + kGeluK * x * x * x));
		act[i] = __float2bfloat16(0.5f * x * (1.0f + t));
	}
}

__global__ void gelu_bwd_kernel(bf16 *dpre, const float *dact, const float *pre, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float x = pre[i];
		float t = tanhf(kGeluC * (x + kGeluK * x * x * x));
		float d = 0.5f * (1.0f + t) +
			  0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluK * x * x);
		dpre[i] = __float2bfloat16(dact[i] * d);
	}
}

/* ---- attention softmax: one warp per row ---- */

__global__ void softmax_fwd_kernel(float *p, bf16 *pb, int64_t rows, int64_t s, int causal)
{
	int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	int64_t q = r % s, lim = causal ? q + 1 : s;
	float *row = p + r * s;
	bf16 *rb = pb + r * s;
	float mx = -INFINITY;
	for (int64_t c = lane; c < lim; c += 32)
		mx = fmaxf(mx, row[c]);
	mx = warp_max(mx);
	float sum = 0.0f;
	for (int64_t c = lane; c < lim; c += 32)
		sum += __expf(row[c] - mx);
	float inv = 1.0f / warp_sum(sum);
	for (int64_t c = lane; c < s; c += 32) {
		float v = c < lim ? __expf(row[c] - mx) * inv : 0.0f;
		row[c] = v;
		rb[c] = __float2bfloat16(v);
	}
}

__global__ void softmax_bwd_kernel(bf16 *ds, const float *p, const float *dp, int64_t rows,
				   int64_t s, float scale)
{
	int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	const float *pr = p + r * s, *dr = dp + r * s;
	float dot = 0.0f;
	for (int64_t c = lane; c < s; c += 32)
		dot += pr[c] * dr[c];
	dot = warp_sum(dot);
	bf16 *o = ds + r * s;
	for (int64_t c = lane; c < s; c += 32)
		o[c] = __float2bfloat16(pr[c] * (dr[c] - dot) * scale);
}

/* ---- embeddings ---- */

__global__ void embed_fwd_kernel(float *y, float *saved, const float *tok, const float *pos,
				 const int32_t *tokens, int64_t rows, int64_t s, int64_t h,
				 int64_t vocab)
{
	int64_t n = rows * h;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / h, c = i - r * h;
		int32_t id = tokens[r];
		if (id < 0 || id >= vocab)
			__trap(); /* the data generator's bug: CPU asserts the same */
		y[i] = tok[(int64_t)id * h + c] + pos[(r % s) * h + c];
		if (c == 0)
			saved[r] = (float)id;
	}
}

__global__ void embed_bwd_kernel(float *dtok, const float *saved, const float *dy,
				 int64_t rows, int64_t h)
{
	int64_t n = rows * h;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / h, c = i - r * h;
		int64_t id = (int64_t)saved[r];
		atomicAdd(&dtok[id * h + c], dy[i]);
	}
}

/*
 * Vocabulary-parallel embedding (member rank of a split by rows
 * [v0, v0 + vl)): its rows' lookups, zero for the others; member 0 adds
 * the positions (layers_vocab.c: the same terms, so the group's sum is the
 * unsplit output).
 */
__global__ void embed_fwd_tp_kernel(float *y, float *saved, const float *tok, const float *pos,
				    const int32_t *tokens, int64_t rows, int64_t s, int64_t h,
				    int64_t vocab, int64_t v0, int64_t vl, int add_pos)
{
	int64_t n = rows * h;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / h, c = i - r * h;
		int32_t id = tokens[r];
		if (id < 0 || id >= vocab)
			__trap();
		bool own = id >= v0 && id < v0 + vl;
		float e = own ? tok[((int64_t)id - v0) * h + c] : 0.0f;
		y[i] = add_pos ? (own ? e + pos[(r % s) * h + c] : pos[(r % s) * h + c]) : e;
		if (c == 0)
			saved[r] = (float)id;
	}
}

__global__ void embed_bwd_tp_kernel(float *dtok, const float *saved, const float *dy,
				    int64_t rows, int64_t h, int64_t v0, int64_t vl)
{
	int64_t n = rows * h;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / h, c = i - r * h;
		int64_t id = (int64_t)saved[r];
		if (id >= v0 && id < v0 + vl)
			atomicAdd(&dtok[(id - v0) * h + c], dy[i]);
	}
}

/* ---- optimizer ---- */

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, bf16 *shadow,
			     int64_t n, float lr, float b1, float b2, float eps, float wd,
			     float c1, float c2)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float gi = g[i];
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		float upd = (mi / c1) / (sqrtf(vi / c2) + eps) + wd * p[i];
		float pn = p[i] - lr * upd;
		p[i] = pn;
		if (shadow)
			shadow[i] = __float2bfloat16(pn);
	}
}

__global__ void sgd_kernel(float *p, const float *g, bf16 *shadow, int64_t n, float lr,
			   float wd)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float pn = p[i] - lr * (g[i] + wd * p[i]);
		p[i] = pn;
		if (shadow)
			shadow[i] = __float2bfloat16(pn);
	}
}

/* ---- losses ---- */

__global__ void count_valid_kernel(int *cnt, const int32_t *targets, int64_t s)
{
	__shared__ float sh[32];
	const int32_t *t = targets + (int64_t)blockIdx.x * s;
	float c = 0.0f;
	for (int64_t k = threadIdx.x; k < s; k += blockDim.x)
		c += t[k] >= 0 ? 1.0f : 0.0f;
	c = block_sum(c, sh);
	if (threadIdx.x == 0)
		cnt[blockIdx.x] = (int)(c + 0.5f);
}

/*
 * One block per row. The bf16 gradient overwrites the first half of the
 * row's own fp32 logits: element k of the bf16 row covers bytes [2k, 2k+2),
 * inside fp32 element k/2 <= k. Each pass of the write loop reads its
 * blockDim logits, syncs, then writes their gradients: the writes of pass i
 * touch fp32 elements below (i+1) blockDim / 2, all read by passes <= i,
 * and the next pass's reads start at (i+1) blockDim.
 */
__global__ void ce_inplace_kernel(float *z, int64_t V, const int32_t *targets, const int *cnt,
				  int64_t s, double scale, double *rowloss)
{
	__shared__ float sh[32];
	int64_t r = blockIdx.x;
	float *zr = z + r * V;
	bf16 *dz = (bf16 *)zr;
	int32_t y = targets[r];
	int ci = cnt[r / s];
	if (y >= V)
		__trap();
	bool valid = y >= 0 && ci > 0;
	float lse = 0.0f, zy = 0.0f;
	if (valid) {
		float mx = -INFINITY;
		for (int64_t k = threadIdx.x; k < V; k += blockDim.x)
			mx = fmaxf(mx, zr[k]);
		mx = block_max(mx, sh);
		float sum = 0.0f;
		for (int64_t k = threadIdx.x; k < V; k += blockDim.x)
			sum += __expf(zr[k] - mx);
		sum = block_sum(sum, sh);
		lse = mx + logf(sum);
		zy = zr[y];
	}
	float coef = valid ? (float)(scale / (double)ci) : 0.0f;
	for (int64_t base = 0; base < V; base += blockDim.x) {
		int64_t k = base + threadIdx.x;
		float v = k < V ? zr[k] : 0.0f;
		__syncthreads();
		if (k < V)
			dz[k] = __float2bfloat16(
				valid ? coef * (__expf(v - lse) - (k == y ? 1.0f : 0.0f)) : 0.0f);
	}
	if (threadIdx.x == 0)
		rowloss[r] = valid ? (double)lse - (double)zy : 0.0;
}

/*
 * A vocabulary-parallel LM head's statistics, row r of its logits z
 * [rows, vl] (columns [v0, v0 + vl) of member `rank` of t): st[r] (2t + 1
 * floats, zeroed by the caller) gets this member's maximum at slot rank,
 * its sum of exponentials at t + rank, and, when it owns the target, the
 * target logit at 2t; rows without a target (or a sample without any)
 * stay zero.
 */
__global__ void vocab_stats_kernel(float *st, const float *z, int64_t vl,
				   const int32_t *targets, const int *cnt, int64_t s,
				   int64_t vocab, int64_t v0, int t, int rank)
{
	__shared__ float sh[32];
	int64_t r = blockIdx.x;
	const float *zr = z + r * vl;
	int32_t y = targets[r];
	if (y >= vocab)
		__trap();
	if (y < 0 || cnt[r / s] <= 0)
		return;
	float mx = -INFINITY;
	for (int64_t k = threadIdx.x; k < vl; k += blockDim.x)
		mx = fmaxf(mx, zr[k]);
	mx = block_max(mx, sh);
	float sum = 0.0f;
	for (int64_t k = threadIdx.x; k < vl; k += blockDim.x)
		sum += __expf(zr[k] - mx);
	sum = block_sum(sum, sh);
	if (threadIdx.x == 0) {
		float *sr = st + r * (2 * (int64_t)t + 1);
		sr[rank] = mx;
		sr[t + rank] = sum;
		if (y >= v0 && y < v0 + vl)
			sr[2 * t] = zr[y - v0];
	}
}

/*
 * After the statistics' all-reduce: logsumexp of row r over the whole
 * vocabulary, M + log sum_q s_q exp(m_q - M), M = max_q m_q (member order),
 * the row's loss lse - z_y, and its gradient on this member's columns,
 * scale/cnt (softmax - onehot), written as bf16 over the first half of its
 * own fp32 row (as ce_inplace_kernel: leading dimension 2 vl).
 */
__global__ void vocab_ce_kernel(float *z, int64_t vl, const float *st, const int32_t *targets,
				const int *cnt, int64_t s, double scale, int64_t v0, int t,
				double *rowloss)
{
	int64_t r = blockIdx.x;
	float *zr = z + r * vl;
	bf16 *dz = (bf16 *)zr;
	const float *sr = st + r * (2 * (int64_t)t + 1);
	int32_t y = targets[r];
	int ci = cnt[r / s];
	bool valid = y >= 0 && ci > 0;
	float lse = 0.0f;
	if (valid) {
		float M = sr[0];
		for (int q = 1; q < t; q++)
			M = fmaxf(M, sr[q]);
		float S = 0.0f;
		for (int q = 0; q < t; q++)
			S += sr[t + q] * __expf(sr[q] - M);
		lse = M + logf(S);
	}
	float coef = valid ? (float)(scale / (double)ci) : 0.0f;
	int64_t yl = y - v0; /* the target's column here, when in [0, vl) */
	for (int64_t base = 0; base < vl; base += blockDim.x) {
		int64_t k = base + threadIdx.x;
		float v = k < vl ? zr[k] : 0.0f;
		__syncthreads();
		if (k < vl)
			dz[k] = __float2bfloat16(
				valid ? coef * (__expf(v - lse) - (k == yl ? 1.0f : 0.0f)) : 0.0f);
	}
	if (threadIdx.x == 0)
		rowloss[r] = valid ? (double)lse - (double)sr[2 * t] : 0.0;
}

__global__ void lm_total_kernel(double *total, const double *rowloss, const int *cnt,
				int64_t n, int64_t s)
{
	__shared__ double sh[32];
	double acc = 0.0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
		if (cnt[i] <= 0)
			continue;
		double li = 0.0;
		for (int64_t t = 0; t < s; t++)
			li += rowloss[i * s + t];
		acc += li / (double)cnt[i];
	}
	acc = block_sum_d(acc, sh);
	if (threadIdx.x == 0)
		*total = acc;
}

__global__ void ce_rows_f32_kernel(float *z, int64_t ld, int64_t C, const int32_t *labels,
				   double scale, double *rowloss)
{
	__shared__ float sh[32];
	int64_t r = blockIdx.x;
	float *zr = z + r * ld;
	int32_t y = labels[r];
	if (y >= C)
		__trap();
	if (y < 0) {
		for (int64_t k = threadIdx.x; k < C; k += blockDim.x)
			zr[k] = 0.0f;
		if (threadIdx.x == 0)
			rowloss[r] = 0.0;
		return;
	}
	float mx = -INFINITY;
	for (int64_t k = threadIdx.x; k < C; k += blockDim.x)
		mx = fmaxf(mx, zr[k]);
	mx = block_max(mx, sh);
	float sum = 0.0f;
	for (int64_t k = threadIdx.x; k < C; k += blockDim.x)
		sum += expf(zr[k] - mx);
	sum = block_sum(sum, sh);
	float lse = mx + logf(sum), zy = zr[y];
	__syncthreads();
	for (int64_t k = threadIdx.x; k < C; k += blockDim.x)
		zr[k] = (float)(scale * ((double)expf(zr[k] - lse) - (k == y ? 1.0 : 0.0)));
	if (threadIdx.x == 0)
		rowloss[r] = (double)lse - (double)zy;
}

__global__ void sum_doubles_kernel(double *total, const double *v, int64_t n)
{
	__shared__ double sh[32];
	double acc = 0.0;
	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		acc += v[i];
	acc = block_sum_d(acc, sh);
	if (threadIdx.x == 0)
		*total = acc;
}

__global__ void l2norm_rows_kernel(float *dst, float *nrm, const float *src, int64_t lds,
				   int64_t w)
{
	__shared__ double sh[32];
	int64_t r = blockIdx.x;
	const float *x = src + r * lds;
	double ss = 0.0;
	for (int64_t k = threadIdx.x; k < w; k += blockDim.x)
		ss += (double)x[k] * x[k];
	ss = block_sum_d(ss, sh);
	double nv = sqrt(ss), d = nv > kNormEps ? nv : kNormEps;
	for (int64_t k = threadIdx.x; k < w; k += blockDim.x)
		dst[r * w + k] = (float)(x[k] / d);
	if (threadIdx.x == 0)
		nrm[r] = (float)nv;
}

/* lse over B values at stride `stride` starting at s + start */
__device__ double lse_strided(const float *s, int64_t B, int64_t stride, double *sh)
{
	__shared__ double mx_sh;
	double mx = -INFINITY;
	for (int64_t k = threadIdx.x; k < B; k += blockDim.x)
		mx = fmax(mx, (double)s[k * stride]);
	for (int o = 16; o > 0; o >>= 1)
		mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh[threadIdx.x >> 5] = mx;
	__syncthreads();
	if (threadIdx.x == 0) {
		double m = -INFINITY;
		for (int k = 0; k < (int)((blockDim.x + 31) >> 5); k++)
			m = fmax(m, sh[k]);
		mx_sh = m;
	}
	__syncthreads();
	mx = mx_sh;
	double sum = 0.0;
	for (int64_t k = threadIdx.x; k < B; k += blockDim.x)
		sum += exp((double)s[k * stride] - mx);
	sum = block_sum_d(sum, sh);
	return mx + log(sum);
}

__global__ void row_lse_kernel(double *r, const float *s, int64_t B)
{
	__shared__ double sh[32];
	double v = lse_strided(s + (int64_t)blockIdx.x * B, B, 1, sh);
	if (threadIdx.x == 0)
		r[blockIdx.x] = v;
}

__global__ void col_lse_kernel(double *c, const float *s, int64_t B)
{
	__shared__ double sh[32];
	double v = lse_strided(s + blockIdx.x, B, B, sh);
	if (threadIdx.x == 0)
		c[blockIdx.x] = v;
}

__device__ __forceinline__ double infonce_g(double sij, double ri, double cj, bool diag,
					    double scale)
{
	return scale * (0.5 * (exp(sij - ri) + exp(sij - cj)) - (diag ? 1.0 : 0.0));
}

/* one block per row i: dota[i], pb[i, :] */
__global__ void infonce_rows_kernel(float *pb, double *dota, const float *pa, const double *r,
				    const double *c, const float *nb, int64_t B, double inv_t,
				    double scale)
{
	__shared__ double sh[32];
	int64_t i = blockIdx.x;
	double acc = 0.0;
	for (int64_t j = threadIdx.x; j < B; j += blockDim.x) {
		double sij = pa[i * B + j];
		double g = infonce_g(sij, r[i], c[j], i == j, scale);
		acc += g * sij;
		double nj = nb[j] > kNormEps ? (double)nb[j] : kNormEps;
		pb[i * B + j] = (float)(g * inv_t / nj);
	}
	acc = block_sum_d(acc, sh);
	if (threadIdx.x == 0)
		dota[i] = acc;
}

/* one block per column j: dotb[j] */
__global__ void infonce_cols_kernel(double *dotb, const float *pa, const double *r,
				    const double *c, int64_t B, double scale)
{
	__shared__ double sh[32];
	int64_t j = blockIdx.x;
	double acc = 0.0;
	for (int64_t i = threadIdx.x; i < B; i += blockDim.x) {
		double sij = pa[i * B + j];
		acc += infonce_g(sij, r[i], c[j], i == j, scale) * sij;
	}
	acc = block_sum_d(acc, sh);
	if (threadIdx.x == 0)
		dotb[j] = acc;
}

__global__ void infonce_loss_kernel(double *total, const float *pa, const double *r,
				    const double *c, int64_t B, int64_t s0, int64_t s1)
{
	__shared__ double sh[32];
	double acc = 0.0;
	for (int64_t i = s0 + threadIdx.x; i < s1; i += blockDim.x)
		acc += 0.5 * (r[i] + c[i]) - (double)pa[i * B + i];
	acc = block_sum_d(acc, sh);
	if (threadIdx.x == 0)
		*total = acc;
}

__global__ void infonce_pa_kernel(float *pa, const double *r, const double *c, const float *na,
				  int64_t B, double inv_t, double scale)
{
	int64_t n = B * B;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t i = e / B, j = e - i * B;
		double sij = pa[e];
		double g = infonce_g(sij, r[i], c[j], i == j, scale);
		double ni = na[i] > kNormEps ? (double)na[i] : kNormEps;
		pa[e] = (float)(g * inv_t / ni);
	}
}

__global__ void tangent_rows_kernel(float *d, int64_t ldd, const float *u, const float *nrm,
				    const double *dot, int64_t s0, int64_t w)
{
	int64_t i = s0 + blockIdx.x;
	if (!(nrm[i] > (float)kNormEps))
		return;
	float ca = (float)(dot[i] / (double)nrm[i]);
	for (int64_t k = threadIdx.x; k < w; k += blockDim.x)
		d[i * ldd + k] -= ca * u[i * w + k];
}

} /* namespace */

/* ---- launchers ---- */

void k_to_bf16(bf16 *dst, const float *src, int64_t n)
{
	if (n <= 0)
		return;
	to_bf16_kernel<<<grid_for(n), kThreads, 0, cu_s()>>>(dst, src, n);
	CUDA_LAUNCHED();
}

void k_fill_rows(float *y, int64_t ld, const float *v, int64_t rows, int64_t cols)
{
	if (rows <= 0 || cols <= 0)
		return;
	fill_rows_kernel<float><<<grid_for(rows * cols), kThreads, 0, cu_s()>>>(y, ld, v, rows,
										  cols);
	CUDA_LAUNCHED();
}

void k_fill_rows_bf16(bf16 *y, int64_t ld, const float *v, int64_t rows, int64_t cols)
{
	if (rows <= 0 || cols <= 0)
		return;
	fill_rows_kernel<bf16><<<grid_for(rows * cols), kThreads, 0, cu_s()>>>(y, ld, v, rows,
										 cols);
	CUDA_LAUNCHED();
}

void k_add_rows(float *y, const float *x, const float *v, int64_t rows, int64_t cols)
{
	if (rows <= 0 || cols <= 0)
		return;
	add_rows_kernel<<<grid_for(rows * cols), kThreads, 0, cu_s()>>>(y, x, v, rows, cols);
	CUDA_LAUNCHED();
}

void k_bias_pos(float *y, const float *b, const float *pos, int64_t n, int64_t s, int64_t h)
{
	if (n * s * h <= 0)
		return;
	bias_pos_kernel<<<grid_for(n * s * h), kThreads, 0, cu_s()>>>(y, b, pos, n, s, h);
	CUDA_LAUNCHED();
}

void k_add_2d(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
	      int64_t cols)
{
	if (rows <= 0 || cols <= 0)
		return;
	add_2d_kernel<<<grid_for(rows * cols), kThreads, 0, cu_s()>>>(dst, ldd, src, lds, rows,
									cols);
	CUDA_LAUNCHED();
}

void k_colsum(float *out, const float *in, int64_t rows, int64_t cols, int64_t ld)
{
	colsum_any<float>(out, in, rows, cols, ld);
}

void k_colsum_bf16(float *out, const bf16 *in, int64_t rows, int64_t cols, int64_t ld)
{
	colsum_any<bf16>(out, in, rows, cols, ld);
}

void k_ln_fwd_bf16(bf16 *y, int64_t ldy, float *mean, float *rstd, int64_t ldm,
		   const float *x, int64_t ldx, const float *g, const float *b, int64_t rows,
		   int64_t h)
{
	if (rows <= 0)
		return;
	ln_fwd_kernel<bf16><<<grid_rows_warp(rows), kThreads, 0, cu_s()>>>(
		y, ldy, mean, rstd, ldm, x, ldx, g, b, rows, h);
	CUDA_LAUNCHED();
}

void k_ln_fwd_f32(float *y, int64_t ldy, float *mean, float *rstd, int64_t ldm,
		  const float *x, int64_t ldx, const float *g, const float *b, int64_t rows,
		  int64_t h)
{
	if (rows <= 0)
		return;
	ln_fwd_kernel<float><<<grid_rows_warp(rows), kThreads, 0, cu_s()>>>(
		y, ldy, mean, rstd, ldm, x, ldx, g, b, rows, h);
	CUDA_LAUNCHED();
}

void k_ln_bwd(float *dst, int64_t ldd, int acc, const float *resid, int64_t ldr,
	      const float *dln, int64_t ldl, const float *x, int64_t ldx, const float *mean,
	      const float *rstd, int64_t ldm, const float *g, float *dg, float *db,
	      int64_t rows, int64_t h)
{
	if (rows <= 0)
		return;
	ln_bwd_kernel<<<grid_rows_warp(rows), kThreads, 0, cu_s()>>>(
		dst, ldd, acc, resid, ldr, dln, ldl, x, ldx, mean, rstd, ldm, g, rows, h);
	CUDA_LAUNCHED();
	if (!dg)
		return;
	int64_t chunk, nch;
	chunking(rows, &chunk, &nch);
	float *part = (float *)cu_red_get(2 * sizeof(float) * (size_t)(nch * h));
	dim3 grid((unsigned)((h + kColTile - 1) / kColTile), (unsigned)nch);
	ln_param_partial_kernel<<<grid, dim3(kColTile, kColRows), 0, cu_s()>>>(
		part, part + nch * h, dln, ldl, x, ldx, mean, rstd, ldm, rows, h, chunk);
	CUDA_LAUNCHED();
	colsum_finish_kernel<<<grid_for(h), kThreads, 0, cu_s()>>>(dg, part, nch, h);
	CUDA_LAUNCHED();
	colsum_finish_kernel<<<grid_for(h), kThreads, 0, cu_s()>>>(db, part + nch * h, nch, h);
	CUDA_LAUNCHED();
}

void k_gelu_fwd(bf16 *act, const float *pre, int64_t n)
{
	if (n <= 0)
		return;
	gelu_fwd_kernel<<<grid_for(n), kThreads, 0, cu_s()>>>(act, pre, n);
	CUDA_LAUNCHED();
}

void k_gelu_bwd(bf16 *dpre, const float *dact, const float *pre, int64_t n)
{
	if (n <= 0)
		return;
	gelu_bwd_kernel<<<grid_for(n), kThreads, 0, cu_s()>>>(dpre, dact, pre, n);
	CUDA_LAUNCHED();
}

void k_softmax_fwd(float *p, bf16 *pb, int64_t rows, int64_t s, int causal)
{
	if (rows <= 0)
		return;
	softmax_fwd_kernel<<<grid_rows_warp(rows), kThreads, 0, cu_s()>>>(p, pb, rows, s, causal);
	CUDA_LAUNCHED();
}

void k_softmax_bwd(bf16 *ds, const float *p, const float *dp, int64_t rows, int64_t s,
		   float scale)
{
	if (rows <= 0)
		return;
	softmax_bwd_kernel<<<grid_rows_warp(rows), kThreads, 0, cu_s()>>>(ds, p, dp, rows, s,
									 scale);
	CUDA_LAUNCHED();
}

void k_embed_fwd(float *y, float *saved, const float *tok, const float *pos,
		 const int32_t *tokens, int64_t n, int64_t s, int64_t h, int64_t vocab)
{
	if (n * s * h <= 0)
		return;
	embed_fwd_kernel<<<grid_for(n * s * h), kThreads, 0, cu_s()>>>(y, saved, tok, pos, tokens,
									 n * s, s, h, vocab);
	CUDA_LAUNCHED();
}

void k_embed_bwd(float *dtok, const float *saved, const float *dy, int64_t rows, int64_t h)
{
	if (rows * h <= 0)
		return;
	embed_bwd_kernel<<<grid_for(rows * h), kThreads, 0, cu_s()>>>(dtok, saved, dy, rows, h);
	CUDA_LAUNCHED();
}

void k_embed_fwd_tp(float *y, float *saved, const float *tok, const float *pos,
		    const int32_t *tokens, int64_t n, int64_t s, int64_t h, int64_t vocab,
		    int64_t v0, int64_t vl, int add_pos)
{
	if (n * s * h <= 0)
		return;
	embed_fwd_tp_kernel<<<grid_for(n * s * h), kThreads, 0, cu_s()>>>(
		y, saved, tok, pos, tokens, n * s, s, h, vocab, v0, vl, add_pos);
	CUDA_LAUNCHED();
}

void k_embed_bwd_tp(float *dtok, const float *saved, const float *dy, int64_t rows, int64_t h,
		    int64_t v0, int64_t vl)
{
	if (rows * h <= 0)
		return;
	embed_bwd_tp_kernel<<<grid_for(rows * h), kThreads, 0, cu_s()>>>(dtok, saved, dy, rows, h,
									  v0, vl);
	CUDA_LAUNCHED();
}

void k_vocab_stats(float *st, const float *z, int64_t vl, const int32_t *targets,
		   const int *cnt, int64_t s, int64_t vocab, int64_t v0, int t, int rank,
		   int64_t rows)
{
	if (rows <= 0)
		return;
	vocab_stats_kernel<<<(unsigned)rows, kThreads, 0, cu_s()>>>(st, z, vl, targets, cnt, s,
								     vocab, v0, t, rank);
	CUDA_LAUNCHED();
}

void k_vocab_ce(float *z, int64_t vl, const float *st, const int32_t *targets, const int *cnt,
		int64_t s, double scale, int64_t v0, int t, double *rowloss, int64_t rows)
{
	if (rows <= 0)
		return;
	vocab_ce_kernel<<<(unsigned)rows, kThreads, 0, cu_s()>>>(z, vl, st, targets, cnt, s, scale,
								  v0, t, rowloss);
	CUDA_LAUNCHED();
}

void k_adamw(float *p, const float *g, float *m, float *v, bf16 *shadow, int64_t n, float lr,
	     float b1, float b2, float eps, float wd, float c1, float c2)
{
	if (n <= 0)
		return;
	adamw_kernel<<<grid_for(n), kThreads, 0, cu_s()>>>(p, g, m, v, shadow, n, lr, b1, b2, eps,
							   wd, c1, c2);
	CUDA_LAUNCHED();
}

void k_sgd(float *p, const float *g, bf16 *shadow, int64_t n, float lr, float wd)
{
	if (n <= 0)
		return;
	sgd_kernel<<<grid_for(n), kThreads, 0, cu_s()>>>(p, g, shadow, n, lr, wd);
	CUDA_LAUNCHED();
}

void k_count_valid(int *cnt, const int32_t *targets, int64_t n, int64_t s)
{
	if (n <= 0)
		return;
	count_valid_kernel<<<(unsigned)n, kThreads, 0, cu_s()>>>(cnt, targets, s);
	CUDA_LAUNCHED();
}

void k_ce_rows_inplace(float *z, int64_t V, const int32_t *targets, const int *cnt,
		       int64_t s, double scale, double *rowloss, int64_t rows)
{
	if (rows <= 0)
		return;
	ce_inplace_kernel<<<(unsigned)rows, kThreads, 0, cu_s()>>>(z, V, targets, cnt, s, scale,
								    rowloss);
	CUDA_LAUNCHED();
}

void k_lm_total(double *total, const double *rowloss, const int *cnt, int64_t n, int64_t s)
{
	lm_total_kernel<<<1, kThreads, 0, cu_s()>>>(total, rowloss, cnt, n, s);
	CUDA_LAUNCHED();
}

void k_ce_rows_f32(float *z, int64_t ld, int64_t C, const int32_t *labels, double scale,
		   double *rowloss, int64_t rows)
{
	if (rows <= 0)
		return;
	ce_rows_f32_kernel<<<(unsigned)rows, kThreads, 0, cu_s()>>>(z, ld, C, labels, scale,
								     rowloss);
	CUDA_LAUNCHED();
}

void k_sum_doubles(double *total, const double *v, int64_t n)
{
	sum_doubles_kernel<<<1, kThreads, 0, cu_s()>>>(total, v, n);
	CUDA_LAUNCHED();
}

void k_l2norm_rows(float *dst, float *nrm, const float *src, int64_t lds, int64_t rows,
		   int64_t w)
{
	if (rows <= 0)
		return;
	l2norm_rows_kernel<<<(unsigned)rows, kThreads, 0, cu_s()>>>(dst, nrm, src, lds, w);
	CUDA_LAUNCHED();
}

void k_row_lse(double *r, const float *s, int64_t B)
{
	if (B <= 0)
		return;
	row_lse_kernel<<<(unsigned)B, kThreads, 0, cu_s()>>>(r, s, B);
	CUDA_LAUNCHED();
}

void k_col_lse(double *c, const float *s, int64_t B)
{
	if (B <= 0)
		return;
	col_lse_kernel<<<(unsigned)B, kThreads, 0, cu_s()>>>(c, s, B);
	CUDA_LAUNCHED();
}

void k_infonce_grads(float *pa, float *pb, double *dota, double *dotb, double *total,
		     const double *r, const double *c, const float *na, const float *nb,
		     int64_t B, double inv_t, double scale, int64_t s0, int64_t s1)
{
	if (B <= 0)
		return;
	infonce_rows_kernel<<<(unsigned)B, kThreads, 0, cu_s()>>>(pb, dota, pa, r, c, nb, B, inv_t,
								   scale);
	CUDA_LAUNCHED();
	infonce_cols_kernel<<<(unsigned)B, kThreads, 0, cu_s()>>>(dotb, pa, r, c, B, scale);
	CUDA_LAUNCHED();
	infonce_loss_kernel<<<1, kThreads, 0, cu_s()>>>(total, pa, r, c, B, s0, s1);
	CUDA_LAUNCHED();
	infonce_pa_kernel<<<grid_for(B * B), kThreads, 0, cu_s()>>>(pa, r, c, na, B, inv_t, scale);
	CUDA_LAUNCHED();
}

void k_tangent_rows(float *d, int64_t ldd, const float *u, const float *nrm,
		    const double *dot, int64_t s0, int64_t s1, int64_t w)
{
	if (s1 <= s0)
		return;
	tangent_rows_kernel<<<(unsigned)(s1 - s0), kThreads, 0, cu_s()>>>(d, ldd, u, nrm, dot, s0,
									    w);
	CUDA_LAUNCHED();
}
