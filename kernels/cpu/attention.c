/* Causal multi-head self-attention, one (batch, head) pair per task, every
 * product through cblas_sgemm on strided views of qkv (inside an OpenMP
 * parallel region OpenBLAS runs each GEMM single-threaded, which is what these
 * small products want).
 *
 * Naive reading, for each (b, h), with Q, K, V the [T, hs] slices of qkv,
 * scale = 1/√hs, and every sum over j running over j ≤ i only (causal):
 *   forward:  S[i][j] = scale·Σ_d Q[i][d]·K[j][d];  P[i] = softmax_j(S[i]);
 *             Y[i][d] = Σ_j P[i][j]·V[j][d]                (P is stored in att)
 *   backward: dP[i][j] = Σ_d dY[i][d]·V[j][d];  dV[j][d] += Σ_i P[i][j]·dY[i][d]
 *             dS[i][j] = P[i][j]·(dP[i][j] − Σ_k P[i][k]·dP[i][k])·scale
 *             dQ[i][d] += Σ_j dS[i][j]·K[j][d];  dK[j][d] += Σ_i dS[i][j]·Q[i][d]
 *
 * Causality is exploited by row blocks: rows [i0, i1) only involve columns
 * [0, i1), so each product runs on that rectangle (about half of the T×T work
 * for T = 256).
 */
#include <cblas.h>
#include <math.h>

#include "kernels/cpu/cpu.h"

/* Rows per block: small enough to skip most of the masked triangle, large
 * enough to keep the GEMMs efficient. */
#define ROW_BLOCK 64

/* Per-task scratch for one block of dP/dS, on the stack: rows·i1 floats. The
 * backward shrinks its row block when T is large, so T may be up to this. */
#define SCRATCH_FLOATS 32768

/* Strided views of one (b, h) pair. */
typedef struct head_view {
    const float *q, *k, *v; /* [T, hs], row stride 3C */
    int ld_qkv;
} head_view;

static head_view head_at(const float *qkv, int b, int h, int T, int C, int NH)
{
    int hs = C / NH;
    const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    return (head_view){.q = q, .k = q + C, .v = q + 2 * C, .ld_qkv = 3 * C};
}

/* p[0..i] ← softmax(p[0..i]); p[i+1..T) ← 0 */
static void causal_softmax_row(float *p, int i, int T)
{
    float max = -INFINITY;
#pragma omp simd reduction(max : max)
    for (int j = 0; j <= i; j++) max = p[j] > max ? p[j] : max;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; j++) {
        p[j] = pt_cpu_expf(p[j] - max);
        sum += p[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j <= i; j++) p[j] *= inv;
    for (int j = i + 1; j < T; j++) p[j] = 0.0f;
}

static void head_forward(float *out, float *att, head_view x, int T, int C, int hs)
{
    /* out[T, hs] with row stride C, att[T, T] */
    float scale = 1.0f / sqrtf((float)hs);
    for (int i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T, rows = i1 - i0;
        float *p = att + (size_t)i0 * T;
        /* S[i0:i1, 0:i1] = scale·Q[i0:i1]·K[0:i1]ᵀ */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, scale,
                    x.q + (size_t)i0 * x.ld_qkv, x.ld_qkv, x.k, x.ld_qkv, 0.0f, p, T);
        for (int i = i0; i < i1; i++) causal_softmax_row(att + (size_t)i * T, i, T);
        /* Y[i0:i1] = P[i0:i1, 0:i1]·V[0:i1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, 1.0f, p, T, x.v,
                    x.ld_qkv, 0.0f, out + (size_t)i0 * C, C);
    }
}

void pt_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH)
{
    /* out[B,T,C], att[B,NH,T,T], qkv[B,T,3C] */
    int hs = C / NH;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        head_forward(out + (size_t)b * T * C + (size_t)h * hs, att + (size_t)bh * T * T,
                     head_at(qkv, b, h, T, C, NH), T, C, hs);
    }
}

/* Gradients of one head; dq/dk/dv alias the [T, hs] slices of dqkv. */
typedef struct head_grads {
    float *dq, *dk, *dv; /* row stride 3C */
} head_grads;

static void head_backward(head_grads g, const float *dout, const float *att, head_view x, int T,
                          int C, int hs)
{
    /* dout[T, hs] with row stride C, att[T, T] */
    float scale = 1.0f / sqrtf((float)hs);
    int ld = x.ld_qkv;
    int block = SCRATCH_FLOATS / T < ROW_BLOCK ? SCRATCH_FLOATS / T : ROW_BLOCK;
    float scratch[SCRATCH_FLOATS]; /* dP then dS of a row block, [rows, i1] */
    for (int i0 = 0; i0 < T; i0 += block) {
        int i1 = i0 + block < T ? i0 + block : T, rows = i1 - i0;
        const float *p = att + (size_t)i0 * T, *dy = dout + (size_t)i0 * C;
        float *ds = scratch;
        /* dP = dY·V[0:i1]ᵀ ;  dV[0:i1] += P[i0:i1, 0:i1]ᵀ·dY */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, 1.0f, dy, C, x.v, ld,
                    0.0f, ds, i1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, rows, 1.0f, p, T, dy, C,
                    1.0f, g.dv, ld);
        /* dS = P ⊙ (dP − rowsum(P ⊙ dP))·scale, zero above the diagonal */
        for (int r = 0; r < rows; r++) {
            int i = i0 + r;
            const float *prow = p + (size_t)r * T;
            float *drow = ds + (size_t)r * i1;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= i; j++) dot += prow[j] * drow[j];
#pragma omp simd
            for (int j = 0; j <= i; j++) drow[j] = prow[j] * (drow[j] - dot) * scale;
            for (int j = i + 1; j < i1; j++) drow[j] = 0.0f;
        }
        /* dQ[i0:i1] += dS·K[0:i1] ;  dK[0:i1] += dSᵀ·Q[i0:i1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, 1.0f, ds, i1, x.k,
                    ld, 1.0f, g.dq + (size_t)i0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, rows, 1.0f, ds, i1,
                    x.q + (size_t)i0 * ld, ld, 1.0f, g.dk, ld);
    }
}

void pt_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH)
{
    /* dqkv[B,T,3C], dout[B,T,C], qkv[B,T,3C], att[B,NH,T,T]; T ≤ SCRATCH_FLOATS */
    int hs = C / NH;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *dq = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
        head_grads g = {.dq = dq, .dk = dq + C, .dv = dq + 2 * C};
        head_backward(g, dout + (size_t)b * T * C + (size_t)h * hs, att + (size_t)bh * T * T,
                      head_at(qkv, b, h, T, C, NH), T, C, hs);
    }
}
