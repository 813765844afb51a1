/* Fully connected layers: every product goes through cblas_sgemm.
 *
 * Naive reading (W as [C, OC], "in-out"; for "out-in" read W[o][c] for W[c][o]):
 *   forward:  out[n][o] = bias[o] + Σ_c inp[n][c]·W[c][o]
 *   backward: dinp[n][c] += Σ_o dout[n][o]·W[c][o]
 *             dW[c][o]   += Σ_n inp[n][c]·dout[n][o]
 *             dbias[o]   += Σ_n dout[n][o]
 */
#include <cblas.h>

#include "kernels/cpu/cpu.h"

/* Output channels per task in the bias-gradient column sum. */
#define CHANNEL_BLOCK 64

void pt_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC, pt_weight_layout layout)
{
    /* out[N,OC], inp[N,C], weight[C,OC] (in-out) or [OC,C] (out-in), bias[OC] or NULL */
    float beta = 0.0f;
    if (bias) { /* out starts as the bias rows; the GEMM adds onto it */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *row = out + (size_t)n * OC;
#pragma omp simd
            for (int o = 0; o < OC; o++) row[o] = bias[o];
        }
        beta = 1.0f;
    }
    if (layout == PT_WEIGHT_IN_OUT)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC,
                    beta, out, OC);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                    beta, out, OC);
}

/* dbias[OC] += column sums of dout[N,OC], split by column blocks. */
static void bias_backward(float *dbias, const float *dout, int N, int OC)
{
    int blocks = (OC + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int o0 = blk * CHANNEL_BLOCK;
        int width = OC - o0 < CHANNEL_BLOCK ? OC - o0 : CHANNEL_BLOCK;
        float sums[CHANNEL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC + o0;
#pragma omp simd
            for (int o = 0; o < width; o++) sums[o] += row[o];
        }
        for (int o = 0; o < width; o++) dbias[o0 + o] += sums[o];
    }
}

void pt_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC,
                            pt_weight_layout layout)
{
    /* dinp[N,C] or NULL, dweight like weight or NULL, dbias[OC] or NULL, dout[N,OC], inp[N,C] */
    int in_out = layout == PT_WEIGHT_IN_OUT;
    if (dinp) /* dinp += dout·Wᵀ */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, in_out ? CblasTrans : CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, weight, in_out ? OC : C, 1.0f, dinp, C);
    if (dweight && in_out) /* dW[C,OC] += inpᵀ·dout */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC,
                    1.0f, dweight, OC);
    else if (dweight) /* dW[OC,C] += doutᵀ·inp */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dweight, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
}
