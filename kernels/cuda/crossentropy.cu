/* Softmax cross-entropy over the vocabulary, one block per position.
 *
 * Naive reading, for a row x = logits[n, :] and target y (as
 * kernels/cpu/crossentropy.c):
 *   loss = log Σ_v exp(x_v) − x_y, computed as m + log Σ_v exp(x_v − m) with
 *   m = max_v x_v so that no exponential overflows;
 *   dlogits_v = dloss·(softmax(x)_v − [v = y])
 * Three passes over the row (max, sum, write), the row stays in L2 between
 * them. */
#include "kernels/cuda/reduce.cuh"

#define CROSSENTROPY_THREADS 1024

template <bool WITH_GRADIENT>
__global__ void crossentropy_kernel(float *losses, float *logits, const int32_t *targets, int V,
                                    float dloss)
{
    /* losses[N], logits[N, V] (overwritten by dlogits WITH_GRADIENT), targets[N] */
    const int n = blockIdx.x;
    float *x = logits + (size_t)n * V;
    float max = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) max = fmaxf(max, x[v]);
    max = pt_block_reduce<float, true>(max);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - max);
    sum = pt_block_reduce(sum);
    const int target = targets[n];
    const float target_logit = x[target];
    __syncthreads(); /* every thread has read x[target] before anyone overwrites it */
    if (threadIdx.x == 0) losses[n] = max + logf(sum) - target_logit;
    if (!WITH_GRADIENT) return;
    const float factor = dloss / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(x[v] - max) * factor;
        x[v] = v == target ? p - dloss : p;
    }
}

void pt_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  int N, int V)
{
    if (N <= 0) return;
    /* the forward only reads logits; the kernel's pointer is shared with the gradient form */
    crossentropy_kernel<false><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (float *)logits, targets, V, 0.0f);
    PT_CUDA_LAUNCHED("crossentropy_kernel<false>");
}

void pt_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                           int N, int V, float dloss)
{
    if (N <= 0) return;
    crossentropy_kernel<true><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, logits, targets, V, dloss);
    PT_CUDA_LAUNCHED("crossentropy_kernel<true>");
}
