/* Reductions to the host (sum, sum_squares) and the second stage of the
 * column sums (reduce.cuh).
 *
 * Naive reading: sum_squares = Σ x², sum = Σ x, accumulated in double.
 * Here each of up to PT_CUDA_REDUCE_BLOCKS blocks sums a fixed grid-stride
 * share of x in double, the block partials come back to pinned host memory,
 * and the host adds them in block order: the same x always gives the same
 * bits. */
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/vector.cuh"

__global__ void pt_column_finish_kernel(float *dst, const float *partials, int chunks, int C)
{
    /* dst[C] += Σ_chunk partials[chunk, c] */
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++) acc += partials[(size_t)k * C + c];
    dst[c] += acc;
}

/* W elements a step (W = 4: 16-byte loads, vector.cuh, where x is 16-byte aligned), the last
 * n mod W singly */
template <bool SQUARES, int W>
__global__ void partial_sums_kernel(double *partials, const float *x, size_t n)
{
    /* partials[gridDim.x] */
    double acc = 0.0;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x, body = n / W * W;
    for (size_t i = first * W; i < body; i += stride * W) {
        const pt_elements<float, W> v = pt_load<W>(x + i);
#pragma unroll
        for (int k = 0; k < W; k++) {
            const double d = (double)v.e[k];
            acc += SQUARES ? d * d : d;
        }
    }
    for (size_t i = body + first; i < n; i += stride) {
        const double d = (double)x[i];
        acc += SQUARES ? d * d : d;
    }
    acc = pt_block_reduce(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <bool SQUARES>
static void launch_partial_sums(double *partials, unsigned blocks, const float *x, size_t n)
{
    if (pt_aligned16(x))
        partial_sums_kernel<SQUARES, 4><<<blocks, PT_CUDA_THREADS, 0, pt_cuda.compute>>>(partials,
                                                                                       x, n);
    else
        partial_sums_kernel<SQUARES, 1><<<blocks, PT_CUDA_THREADS, 0, pt_cuda.compute>>>(partials,
                                                                                       x, n);
    PT_CUDA_LAUNCHED("partial_sums_kernel");
}

static double sum_on_host(const float *x, size_t n, bool squares)
{
    if (n == 0) return 0.0;
    unsigned blocks = pt_cuda_blocks_for(n);
    if (blocks > PT_CUDA_REDUCE_BLOCKS) blocks = PT_CUDA_REDUCE_BLOCKS;
    size_t mark = pt_cuda_scratch_mark();
    double *partials = (double *)pt_cuda_scratch(blocks * sizeof(double), "sum partials");
    double total = NAN; /* what a failed reduction returns: the caller's checks notice */
    if (partials) {
        if (squares) launch_partial_sums<true>(partials, blocks, x, n);
        else launch_partial_sums<false>(partials, blocks, x, n);
        PT_CUDA_CHECK(cudaMemcpyAsync(pt_cuda.host_partials, partials, blocks * sizeof(double),
                                      cudaMemcpyDeviceToHost, pt_cuda.compute));
        if (PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda.compute))) {
            total = 0.0;
            for (unsigned b = 0; b < blocks; b++) total += pt_cuda.host_partials[b];
        }
    }
    pt_cuda_scratch_release(mark);
    return total;
}

double pt_cuda_sum_squares(const float *x, size_t n) { return sum_on_host(x, n, true); }

double pt_cuda_sum(const float *x, size_t n) { return sum_on_host(x, n, false); }
