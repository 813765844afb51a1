/* Element-wise kernels and reductions.
 *
 * Naive reading:
 *   gelu:     y = ½x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715x³)
 *             dy/dx = ½(1 + tanh u) + ½x·(1 − tanh²u)·√(2/π)·(1 + 3·0.044715x²)
 *   residual: out = a + b
 *   sum_squares = Σ x², sum = Σ x (accumulated in double);  scale: x ← factor·x
 */
#include <math.h>

#include "kernels/cpu/cpu.h"

#define GELU_SCALE 0.7978845608028654f /* √(2/π) */
#define GELU_CUBIC 0.044715f

void pt_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        out[i] = 0.5f * x * (1.0f + pt_cpu_tanhf(u));
    }
}

void pt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = pt_cpu_tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
        float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        dinp[i] += local * dout[i];
    }
}

void pt_cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

double pt_cpu_sum_squares(const float *x, size_t n)
{
    double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total)
    for (size_t i = 0; i < n; i++) total += (double)x[i] * (double)x[i];
    return total;
}

double pt_cpu_sum(const float *x, size_t n)
{
    double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total)
    for (size_t i = 0; i < n; i++) total += (double)x[i];
    return total;
}

void pt_cpu_scale(float *x, float factor, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= factor;
}

void pt_cpu_gather(float *out, const float *src, const uint32_t *index, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = src[index[i]];
}

void pt_cpu_scatter(float *dst, const uint32_t *index, const float *values, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[index[i]] = values[i];
}
