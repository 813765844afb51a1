/* LayerNorm over the channels of each position, ε = 1e-5.
 *
 * Naive reading, for each row x = inp[n, :]:
 *   forward:  μ = Σx/C;  σ² = Σ(x−μ)²/C;  rstd = 1/√(σ²+ε);  x̂ = (x−μ)·rstd;
 *             out = x̂·weight + bias
 *   backward: g = dout·weight;
 *             dinp += rstd·(g − mean(g) − x̂·mean(g·x̂));
 *             dweight += Σ_n dout·x̂;  dbias += Σ_n dout
 */
#include <math.h>

#include "kernels/cpu/cpu.h"

#define LAYERNORM_EPS 1e-5f

/* Channels per task when summing parameter gradients over rows. */
#define CHANNEL_BLOCK 64

void pt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C)
{
    /* out[N,C], mean[N], rstd[N], inp[N,C], weight[C], bias[C] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < C; c++) sum += x[c];
        float mu = sum / (float)C;
        float squares = 0.0f; /* two passes: no cancellation for large means */
#pragma omp simd reduction(+ : squares)
        for (int c = 0; c < C; c++) squares += (x[c] - mu) * (x[c] - mu);
        float s = 1.0f / sqrtf(squares / (float)C + LAYERNORM_EPS);
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - mu) * s * weight[c] + bias[c];
        mean[n] = mu;
        rstd[n] = s;
    }
}

/* dinp, row by row (rows are independent). */
static void layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                     const float *weight, const float *mean, const float *rstd,
                                     int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float mu = mean[n], s = rstd[n];
        float g_sum = 0.0f, g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
        for (int c = 0; c < C; c++) {
            float g = dy[c] * weight[c];
            g_sum += g;
            g_xhat_sum += g * (x[c] - mu) * s;
        }
        float g_mean = g_sum / (float)C, g_xhat_mean = g_xhat_sum / (float)C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - mu) * s;
            dx[c] += s * (dy[c] * weight[c] - g_mean - xhat * g_xhat_mean);
        }
    }
}

/* dweight and dbias: column sums over all rows, split by channel blocks so
 * that no two threads write the same element. */
static void layernorm_backward_params(float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *mean, const float *rstd,
                                      int N, int C)
{
    int blocks = (C + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * CHANNEL_BLOCK;
        int width = C - c0 < CHANNEL_BLOCK ? C - c0 : CHANNEL_BLOCK;
        float dw[CHANNEL_BLOCK] = {0}, db[CHANNEL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0, *dy = dout + (size_t)n * C + c0;
            float mu = mean[n], s = rstd[n];
#pragma omp simd
            for (int c = 0; c < width; c++) {
                dw[c] += dy[c] * (x[c] - mu) * s;
                db[c] += dy[c];
            }
        }
        for (int c = 0; c < width; c++) {
            dweight[c0 + c] += dw[c];
            dbias[c0 + c] += db[c];
        }
    }
}

/* The residual's sum, then the layernorm of it: the same bits as the two kernels in turn (the
 * CPU gains nothing from one pass: the row is in cache for the second). */
void pt_cpu_residual_layernorm_forward(float *residual, float *out, float *mean, float *rstd,
                                       const float *a, const float *b, const float *weight,
                                       const float *bias, int N, int C)
{
    pt_cpu_residual_forward(residual, a, b, (size_t)N * C);
    pt_cpu_layernorm_forward(out, mean, rstd, residual, weight, bias, N, C);
}

void pt_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C)
{
    /* dinp[N,C], dweight[C], dbias[C], dout[N,C], inp[N,C], weight[C], mean[N], rstd[N] */
    layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
    layernorm_backward_params(dweight, dbias, dout, inp, mean, rstd, N, C);
}
