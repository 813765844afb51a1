/* Reductions shared by several kernels: sums across a warp and a block, and
 * deterministic column sums of an [N, C] matrix (bias and LayerNorm parameter
 * gradients). Every sum here adds in a fixed order, so results do not change
 * from run to run (no atomics). Private to kernels/cuda/. */
#ifndef PT_KERNELS_CUDA_REDUCE_CUH
#define PT_KERNELS_CUDA_REDUCE_CUH

#include "kernels/cuda/common.cuh"

/* ---- warp and block ---------------------------------------------------------- */

template <class T> __device__ inline T pt_warp_sum(T x)
{
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x; /* every lane holds the sum */
}

__device__ inline float pt_warp_max(float x)
{
    for (int offset = 16; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

/* The sum (or max) of x over the block, returned to every thread. blockDim.x
 * must be a multiple of 32, at most 1024. Every thread of the block must
 * call it (it synchronizes). */
template <class T, bool MAX = false> __device__ inline T pt_block_reduce(T x)
{
    __shared__ T per_warp[32];
    __shared__ T result;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = MAX ? (T)pt_warp_max((float)x) : pt_warp_sum(x);
    if (lane == 0) per_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        T y = lane < warps ? per_warp[lane] : (MAX ? (T)-INFINITY : (T)0);
        y = MAX ? (T)pt_warp_max((float)y) : pt_warp_sum(y);
        if (lane == 0) result = y;
    }
    __syncthreads();
    return result;
}

/* ---- column sums ------------------------------------------------------------------
 *
 * dst[c] += Σ_n value(n, c) over n < N, for c < C, in two stages: chunks of
 * rows are summed into partials[chunk][c] by one thread per (chunk, column)
 * (consecutive threads read consecutive columns: coalesced), then one thread
 * per column adds its partials in chunk order. The partials live in arena
 * scratch. `Value` is a small functor, so one pair of kernels serves the
 * bias gradient (value = dout) and LayerNorm's (value = dout·x̂). */

#define PT_COLUMN_CHUNKS 128

/* value(n, c) = x[n, c] */
struct pt_rows_f32 {
    const float *x;
    int C;
    __device__ float operator()(int n, int c) const { return x[(size_t)n * C + c]; }
};

struct pt_rows_bf16 {
    const __nv_bfloat16 *x;
    int C;
    __device__ float operator()(int n, int c) const
    {
        return __bfloat162float(x[(size_t)n * C + c]);
    }
};

template <class Value>
__global__ void pt_column_partials_kernel(float *partials, Value value, int N, int C,
                                          int rows_per_chunk)
{
    /* partials[gridDim.y, C]; chunk = blockIdx.y covers rows [n0, n1) */
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    float acc = 0.0f;
    for (int n = n0; n < n1; n++) acc += value(n, c);
    partials[(size_t)chunk * C + c] = acc;
}

__global__ void pt_column_finish_kernel(float *dst, const float *partials, int chunks, int C);

template <class Value> void pt_column_sums_add(float *dst, Value value, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    int rows_per_chunk = pt_cuda_ceil_div(N, PT_COLUMN_CHUNKS);
    int chunks = pt_cuda_ceil_div(N, rows_per_chunk);
    size_t mark = pt_cuda_scratch_mark();
    float *partials = (float *)pt_cuda_scratch((size_t)chunks * C * sizeof(float), "column sums");
    if (partials) {
        dim3 grid(pt_cuda_ceil_div(C, PT_CUDA_THREADS), chunks);
        pt_column_partials_kernel<<<grid, PT_CUDA_THREADS, 0, pt_cuda.compute>>>(
            partials, value, N, C, rows_per_chunk);
        PT_CUDA_LAUNCHED("pt_column_partials_kernel");
        pt_column_finish_kernel<<<pt_cuda_ceil_div(C, PT_CUDA_THREADS), PT_CUDA_THREADS, 0,
                                  pt_cuda.compute>>>(dst, partials, chunks, C);
        PT_CUDA_LAUNCHED("pt_column_finish_kernel");
    }
    pt_cuda_scratch_release(mark);
}

#endif
