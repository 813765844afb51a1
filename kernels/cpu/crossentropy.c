/* Softmax cross-entropy over the vocabulary, one row per position.
 *
 * Naive reading, for a row x = logits[n, :] and target y:
 *   loss = log Σ_v exp(x_v) − x_y, computed as m + log Σ_v exp(x_v − m) with
 *   m = max_v x_v so that no exponential overflows;
 *   dlogits_v = dloss·(softmax(x)_v − [v = y])
 */
#include <math.h>

#include "kernels/cpu/cpu.h"

static float row_max(const float *x, int V)
{
    float max = -INFINITY;
#pragma omp simd reduction(max : max)
    for (int v = 0; v < V; v++) max = x[v] > max ? x[v] : max;
    return max;
}

void pt_cpu_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                 int N, int V)
{
    /* losses[N], logits[N,V], targets[N] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float max = row_max(x, V), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += pt_cpu_expf(x[v] - max);
        losses[n] = max + logf(sum) - x[targets[n]];
    }
}

void pt_cpu_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                          int N, int V, float dloss)
{
    /* losses[N], logits[N,V] (overwritten by dlogits), targets[N] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        float max = row_max(x, V), target_logit = x[targets[n]], sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) { /* x ← exp(x − max), the unnormalised softmax */
            x[v] = pt_cpu_expf(x[v] - max);
            sum += x[v];
        }
        losses[n] = max + logf(sum) - target_logit;
        float factor = dloss / sum;
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] *= factor;
        x[targets[n]] -= dloss;
    }
}
