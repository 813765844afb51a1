/* Softmax cross-entropy over the vocabulary, one block per position.
 *
 * Naive reading, for a row x = logits[n, :] and target y (as
 * kernels/cpu/crossentropy.c):
 *   loss = log Σ_v exp(x_v) − x_y, computed as m + log Σ_v exp(x_v − m) with
 *   m = max_v x_v so that no exponential overflows;
 *   dlogits_v = dloss·(softmax(x)_v − [v = y])
 * Three passes over the row (max, sum, write), the row stays in L2 between
 * them. Logits in fp32, or in bf16 (the classifier under bf16: read as the
 * values they hold, the sums fp32, dlogits rounded to bf16). */
#include "kernels/cuda/reduce.cuh"

#define CROSSENTROPY_THREADS 1024

/* A logit as the fp32 the sums use, and a gradient stored as its element type. */
__device__ inline float logit_value(float x) { return x; }
__device__ inline float logit_value(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store_gradient(float *x, float g) { *x = g; }
__device__ inline void store_gradient(__nv_bfloat16 *x, float g) { *x = __float2bfloat16_rn(g); }

template <class Element, bool WITH_GRADIENT>
__global__ void crossentropy_kernel(float *losses, Element *logits, const int32_t *targets, int V,
                                    float dloss)
{
    /* losses[N], logits[N, V] (fp32 or bf16; overwritten by dlogits WITH_GRADIENT), targets[N] */
    const int n = blockIdx.x;
    Element *x = logits + (size_t)n * V;
    float max = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) max = fmaxf(max, logit_value(x[v]));
    max = pt_block_reduce<float, true>(max);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(logit_value(x[v]) - max);
    sum = pt_block_reduce(sum);
    const int target = targets[n];
    const float target_logit = logit_value(x[target]);
    __syncthreads(); /* every thread has read x[target] before anyone overwrites it */
    if (threadIdx.x == 0) losses[n] = max + logf(sum) - target_logit;
    if (!WITH_GRADIENT) return;
    const float factor = dloss / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(logit_value(x[v]) - max) * factor;
        store_gradient(&x[v], v == target ? p - dloss : p);
    }
}

void pt_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  int N, int V)
{
    if (N <= 0) return;
    /* the forward only reads logits; the kernel's pointer is shared with the gradient form */
    crossentropy_kernel<float, false><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (float *)logits, targets, V, 0.0f);
    PT_CUDA_LAUNCHED("crossentropy_kernel<float, false>");
}

void pt_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                           int N, int V, float dloss)
{
    if (N <= 0) return;
    crossentropy_kernel<float, true><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, logits, targets, V, dloss);
    PT_CUDA_LAUNCHED("crossentropy_kernel<float, true>");
}

/* bf16 logits (the classifier under runtime.precision = bf16): read as the values they hold,
 * dlogits rounded to bf16 in place. */
void pt_cuda_crossentropy_forward_bf16(float *losses, const pt_bf16 *logits,
                                       const int32_t *targets, int N, int V)
{
    if (N <= 0) return;
    crossentropy_kernel<__nv_bfloat16, false><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (__nv_bfloat16 *)logits, targets, V, 0.0f);
    PT_CUDA_LAUNCHED("crossentropy_kernel<bf16, false>");
}

void pt_cuda_crossentropy_forward_backward_bf16(float *losses, pt_bf16 *logits,
                                                const int32_t *targets, int N, int V, float dloss)
{
    if (N <= 0) return;
    crossentropy_kernel<__nv_bfloat16, true><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (__nv_bfloat16 *)logits, targets, V, dloss);
    PT_CUDA_LAUNCHED("crossentropy_kernel<bf16, true>");
}
