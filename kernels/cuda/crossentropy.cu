/* Softmax cross-entropy over the vocabulary, one block per position.
 *
 * Naive reading, for a row x = logits[n, :] and target y (as
 * kernels/cpu/crossentropy.c):
 *   loss = log Σ_v exp(x_v) − x_y, computed as m + log Σ_v exp(x_v − m) with
 *   m = max_v x_v so that no exponential overflows;
 *   dlogits_v = dloss·(softmax(x)_v − [v = y])
 * Here the max and the sum come in one pass (session 34; three before): each thread keeps a
 * running max m_t and s_t = Σ exp(x − m_t) over its share, rescaled when m_t grows; then the
 * block's m = max m_t and Σ s_t·exp(m_t − m). A second pass writes dlogits. The row is read
 * 16 bytes a load (4 fp32 or 8 bf16 values) between its unaligned ends (GPT-2's V = 50257 is
 * odd, so in a dense [N, V] most rows start off a 16-byte boundary; the model's bf16 logits
 * have rows a multiple of 16 bytes apart), and stays in L2 between the passes. Logits
 * in fp32, or in bf16 (the classifier under bf16: read as the values they hold, the sums fp32,
 * dlogits rounded to bf16). */
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/row_parts.h"
#include "kernels/cuda/vector.cuh"

#define CROSSENTROPY_THREADS 1024

/* A logit as the fp32 the sums use, and a gradient stored as its element type. */
__device__ inline float logit_value(float x) { return x; }
__device__ inline float logit_value(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store_gradient(float *x, float g) { *x = g; }
__device__ inline void store_gradient(__nv_bfloat16 *x, float g) { *x = __float2bfloat16_rn(g); }

/* f(v, x_v) for each element of this thread's share of the row. */
template <class Element, class F>
__device__ inline void for_each_logit(const Element *x, int V, F f)
{
    constexpr int width = 16 / sizeof(Element);
    const pt_row_parts parts = pt_row_parts_of((uintptr_t)x, V, sizeof(Element));
    for (int v = threadIdx.x; v < parts.head; v += blockDim.x) f(v, logit_value(x[v]));
    const Element *body = x + parts.head;
    for (int i = threadIdx.x; i < parts.vectors; i += blockDim.x) {
        const pt_elements<Element, width> v = pt_load<width>(body + i * width);
        for (int k = 0; k < width; k++) f(parts.head + i * width + k, logit_value(v.e[k]));
    }
    for (int v = parts.tail_start + threadIdx.x; v < V; v += blockDim.x) f(v, logit_value(x[v]));
}

/* x_v ← g(v, x_v) (rounded to the element type) for each element of this thread's share. */
template <class Element, class G>
__device__ inline void rewrite_logits(Element *x, int V, G g)
{
    constexpr int width = 16 / sizeof(Element);
    const pt_row_parts parts = pt_row_parts_of((uintptr_t)x, V, sizeof(Element));
    for (int v = threadIdx.x; v < parts.head; v += blockDim.x)
        store_gradient(&x[v], g(v, logit_value(x[v])));
    Element *body = x + parts.head;
    for (int i = threadIdx.x; i < parts.vectors; i += blockDim.x) {
        pt_elements<Element, width> v = pt_load<width>(body + i * width);
        for (int k = 0; k < width; k++)
            store_gradient(&v.e[k], g(parts.head + i * width + k, logit_value(v.e[k])));
        pt_store<width>(body + i * width, v);
    }
    for (int v = parts.tail_start + threadIdx.x; v < V; v += blockDim.x)
        store_gradient(&x[v], g(v, logit_value(x[v])));
}

template <class Element, bool WITH_GRADIENT>
__global__ void crossentropy_kernel(float *losses, Element *logits, const int32_t *targets, int V,
                                    size_t ld, float dloss)
{
    /* losses[N], logits[N, V] with rows ld apart (fp32 or bf16; overwritten by dlogits
     * WITH_GRADIENT), targets[N] */
    const int n = blockIdx.x;
    Element *x = logits + (size_t)n * ld;
    float m = -INFINITY, s = 0.0f; /* this thread's running max and Σ exp(x − m) */
    for_each_logit(x, V, [&](int, float value) {
        if (value > m) {
            s = s * expf(m - value) + 1.0f; /* expf(−∞) = 0: the first value */
            m = value;
        } else {
            s += expf(value - m);
        }
    });
    const float max = pt_block_reduce<float, true>(m);
    const float sum = pt_block_reduce(m == -INFINITY ? 0.0f : s * expf(m - max));
    const int target = targets[n];
    const float target_logit = logit_value(x[target]);
    __syncthreads(); /* every thread has read x[target] before anyone overwrites it */
    if (threadIdx.x == 0) losses[n] = max + logf(sum) - target_logit;
    if (!WITH_GRADIENT) return;
    const float factor = dloss / sum;
    rewrite_logits(x, V, [&](int v, float value) {
        const float p = expf(value - max) * factor;
        return v == target ? p - dloss : p;
    });
}

void pt_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  int N, int V)
{
    if (N <= 0) return;
    /* the forward only reads logits; the kernel's pointer is shared with the gradient form */
    crossentropy_kernel<float, false><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (float *)logits, targets, V, (size_t)V, 0.0f);
    PT_CUDA_LAUNCHED("crossentropy_kernel<float, false>");
}

void pt_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                           int N, int V, float dloss)
{
    if (N <= 0) return;
    crossentropy_kernel<float, true><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, logits, targets, V, (size_t)V, dloss);
    PT_CUDA_LAUNCHED("crossentropy_kernel<float, true>");
}

/* bf16 logits (the classifier under runtime.precision = bf16), rows ld apart: read as the
 * values they hold, dlogits rounded to bf16 in place. */
void pt_cuda_crossentropy_forward_bf16(float *losses, const pt_bf16 *logits,
                                       const int32_t *targets, int N, int V, int ld)
{
    if (N <= 0) return;
    crossentropy_kernel<__nv_bfloat16, false><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (__nv_bfloat16 *)logits, targets, V, (size_t)ld, 0.0f);
    PT_CUDA_LAUNCHED("crossentropy_kernel<bf16, false>");
}

void pt_cuda_crossentropy_forward_backward_bf16(float *losses, pt_bf16 *logits,
                                                const int32_t *targets, int N, int V, int ld,
                                                float dloss)
{
    if (N <= 0) return;
    crossentropy_kernel<__nv_bfloat16, true><<<N, CROSSENTROPY_THREADS, 0, pt_cuda.compute>>>(
        losses, (__nv_bfloat16 *)logits, targets, V, (size_t)ld, dloss);
    PT_CUDA_LAUNCHED("crossentropy_kernel<bf16, true>");
}
