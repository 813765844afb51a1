/* Causal attention of an fp32 qkv through cuBLAS: the scores of a batch of heads are
 * materialised, T×T per head, in scratch, and every product is a strided batched GEMM over
 * the heads of one sequence (TF32 when PIPERT_CUDA_TF32 allows it, as the other fp32
 * products). This is how an fp32 step gets tensor cores (TF32) or cuBLAS's fp32 GEMMs for
 * attention; the flash-style CUDA-core kernels of attention.cu stay for what this declines.
 *
 * Naive reading: attention.cu's, with the same saved state (lse[B,NH,T] in base 2, a copy
 * of out) and the same D = rowsum(dO ⊙ O), so either path's backward takes either path's
 * forward. Per sequence b and batch of heads [h0, h0 + nh), with Q, K, V, dO the heads'
 * [T, hs] slices (row strides 3C, 3C, 3C, C):
 *   forward:  S = (log₂e/√hs)·Q·Kᵀ   (GEMM; base-2 scores)
 *             L[i] = log₂ Σ_{j≤i} 2^S[i][j];  P[i][j] = 2^(S[i][j] − L[i]) for j ≤ i, else 0
 *             O = P·V                 (GEMM, into out)
 *   backward: S again, P from the saved L
 *             dP = dO·Vᵀ;  dV += Pᵀ·dO                 (GEMMs)
 *             dS = P ⊙ (dP − D[i]) / √hs              (in place of dP)
 *             dQ += dS·K;  dK += dSᵀ·Q                 (GEMMs)
 * Half of each T×T product is above the diagonal and wasted: the price of cuBLAS's speed.
 * Scratch: nh·T² floats forward, twice that backward, nh as many heads as fit in
 * SCRATCH_BUDGET and the arena's free top (GPT-2, T = 1024: all 12 heads, 48 / 96 MiB). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define LOG2E 1.4426950408889634f
#define SCRATCH_BUDGET ((size_t)512 << 20)
#define ROWS_PER_BLOCK 8 /* warps per block in the softmax kernel */

struct gemm_attention_shape {
    int B, T, C, NH, hs;
    float scale; /* 1/√hs */
};

/* ---- the element-wise parts ------------------------------------------------------------ */

__device__ inline float warp_max(float x)
{
    for (int offset = 16; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

__device__ inline float warp_total(float x)
{
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

/* S[rows, T] base-2 scores → P in place, and L; row r is query i = r mod T of head
 * h0 + r / T; one warp per row */
__global__ void causal_softmax_kernel(float *S, float *lse, int rows, int T)
{
    const int r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int i = r % T;
    float *s = S + (size_t)r * T;
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j <= i; j += 32) l += exp2f(s[j] - m);
    const float L = m + log2f(warp_total(l));
    for (int j = lane; j < T; j += 32) s[j] = j <= i ? exp2f(s[j] - L) : 0.0f;
    if (lane == 0) lse[r] = L;
}

/* S[heads, T, T] base-2 scores → P in place from the saved L[heads, T] */
__global__ void causal_probabilities_kernel(float *S, const float *lse, int T, size_t n)
{
    PT_GRID_STRIDE_LOOP(k, n)
    {
        const size_t r = k / T;
        const int j = (int)(k % T), i = (int)(r % T);
        S[k] = j <= i ? exp2f(S[k] - lse[r]) : 0.0f;
    }
}

/* dP[heads, T, T] → dS = P ⊙ (dP − D[i])·scale in place */
__global__ void score_gradient_kernel(float *dP, const float *P, const float *delta, float scale,
                                      int T, size_t n)
{
    PT_GRID_STRIDE_LOOP(k, n) dP[k] = P[k] * (dP[k] - delta[k / T]) * scale;
}

/* ---- the products ----------------------------------------------------------------------- */

/* One row-major operand of the batched products: head h's slice starts at data + h·stride. */
struct head_operand {
    const float *data;
    int ld;
    long long stride;
};

/* D_h[rows_d, cols_d] = α·op(A_h)·op(B_h) + β·D_h for each of `heads` heads, row-major, by
 * matmul.cu's mapping (B's buffer first, m = cols_d). */
static void gemm_heads(float *D, int ldd, long long stride_d, int rows_d, int cols_d, int k,
                       head_operand A, cublasOperation_t op_a, head_operand B,
                       cublasOperation_t op_b, float alpha, float beta, int heads)
{
    const cublasComputeType_t compute =
        pt_cuda.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    PT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        pt_cuda.cublas, op_b, op_a, cols_d, rows_d, k, &alpha, B.data, CUDA_R_32F, B.ld,
        B.stride, A.data, CUDA_R_32F, A.ld, A.stride, &beta, D, CUDA_R_32F, ldd, stride_d, heads,
        compute, CUBLAS_GEMM_DEFAULT));
}

/* The heads [h0, h0 + nh) of sequence b: where their slices start. */
struct head_batch {
    head_operand q, k, v;  /* in qkv (or dqkv) */
    size_t row;            /* offset of (b, h0)'s first row in a [B, T, C] buffer */
    size_t saved;          /* offset of (b, h0) in lse / delta [B, NH, T] */
};

static head_batch heads_at(const float *qkv, gemm_attention_shape s, int b, int h0)
{
    const size_t base = (size_t)b * s.T * 3 * s.C + (size_t)h0 * s.hs;
    const int ld = 3 * s.C;
    return {{qkv + base, ld, s.hs},
            {qkv + base + s.C, ld, s.hs},
            {qkv + base + 2 * s.C, ld, s.hs},
            (size_t)b * s.T * s.C + (size_t)h0 * s.hs,
            ((size_t)b * s.NH + h0) * s.T};
}

/* S = (log₂e/√hs)·Q·Kᵀ for nh heads into scores[nh, T, T] */
static void scores(float *S, const head_batch &h, gemm_attention_shape s, int nh)
{
    const long long TT = (long long)s.T * s.T;
    gemm_heads(S, s.T, TT, s.T, s.T, s.hs, h.q, CUBLAS_OP_N, h.k, CUBLAS_OP_T, LOG2E * s.scale,
               0.0f, nh);
}

/* Heads per batch whose `buffers` T×T buffers fit the budget and the arena's free top; 0 when
 * not even one head's do. */
static int heads_per_batch(gemm_attention_shape s, int buffers)
{
    const size_t per_head = (size_t)buffers * s.T * s.T * sizeof(float);
    const size_t room = pt_cuda.arena.capacity - pt_cuda.arena.top;
    const size_t budget = (room < SCRATCH_BUDGET ? room : SCRATCH_BUDGET) * 7 / 8;
    const size_t fit = budget / per_head;
    return fit < (size_t)s.NH ? (int)fit : s.NH;
}

static unsigned grid_for(size_t n) { return pt_cuda_blocks_for(n); }

/* ---- the entries ------------------------------------------------------------------------ */

bool pt_cuda_attention_gemm_takes(int T, int C, int NH, bool backward)
{
    const gemm_attention_shape s = {1, T, C, NH, C / NH, 0.0f};
    return pt_cuda.gemm_attention && s.hs * NH == C && heads_per_batch(s, backward ? 2 : 1) > 0;
}

void pt_cuda_attention_gemm_forward(float *out, float *lse, float *o_saved, const float *qkv,
                                    int B, int T, int C, int NH)
{
    const gemm_attention_shape s = {B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
    const int per_batch = heads_per_batch(s, 1);
    const size_t mark = pt_cuda_scratch_mark();
    float *S = (float *)pt_cuda_scratch((size_t)per_batch * T * T * sizeof(float),
                                        "attention scores");
    for (int b = 0; S && b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += per_batch) {
            const int nh = NH - h0 < per_batch ? NH - h0 : per_batch;
            const head_batch h = heads_at(qkv, s, b, h0);
            scores(S, h, s, nh);
            const int rows = nh * T;
            causal_softmax_kernel<<<pt_cuda_ceil_div(rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK,
                                    0, pt_cuda.compute>>>(S, lse + h.saved, rows, T);
            PT_CUDA_LAUNCHED("causal_softmax_kernel");
            /* O = P·V, written into out's columns of these heads */
            gemm_heads(out + h.row, C, s.hs, T, s.hs, T, {S, T, (long long)T * T}, CUBLAS_OP_N,
                       h.v, CUBLAS_OP_N, 1.0f, 0.0f, nh);
        }
    pt_cuda_scratch_release(mark);
    PT_CUDA_CHECK(cudaMemcpyAsync(o_saved, out, (size_t)B * T * C * sizeof(float),
                                  cudaMemcpyDeviceToDevice, pt_cuda.compute));
}

void pt_cuda_attention_gemm_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *lse, const float *delta, int B, int T, int C,
                                     int NH)
{
    const gemm_attention_shape s = {B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
    const int per_batch = heads_per_batch(s, 2);
    const size_t mark = pt_cuda_scratch_mark();
    const size_t buffer = (size_t)per_batch * T * T;
    float *P = (float *)pt_cuda_scratch(2 * buffer * sizeof(float), "attention scores");
    float *dP = P ? P + buffer : NULL;
    const long long TT = (long long)T * T;
    for (int b = 0; P && b < B; b++)
        for (int h0 = 0; h0 < NH; h0 += per_batch) {
            const int nh = NH - h0 < per_batch ? NH - h0 : per_batch;
            const head_batch h = heads_at(qkv, s, b, h0), d = heads_at(dqkv, s, b, h0);
            const head_operand dO = {dout + h.row, C, s.hs};
            const size_t n = (size_t)nh * T * T;
            scores(P, h, s, nh);
            causal_probabilities_kernel<<<grid_for(n), PT_CUDA_THREADS, 0, pt_cuda.compute>>>(
                P, lse + h.saved, T, n);
            PT_CUDA_LAUNCHED("causal_probabilities_kernel");
            /* dP = dO·Vᵀ;  dV += Pᵀ·dO */
            gemm_heads(dP, T, TT, T, T, s.hs, dO, CUBLAS_OP_N, h.v, CUBLAS_OP_T, 1.0f, 0.0f, nh);
            gemm_heads((float *)d.v.data, d.v.ld, d.v.stride, T, s.hs, T, {P, T, TT}, CUBLAS_OP_T,
                       dO, CUBLAS_OP_N, 1.0f, 1.0f, nh);
            score_gradient_kernel<<<grid_for(n), PT_CUDA_THREADS, 0, pt_cuda.compute>>>(
                dP, P, delta + h.saved, s.scale, T, n);
            PT_CUDA_LAUNCHED("score_gradient_kernel");
            /* dQ += dS·K;  dK += dSᵀ·Q */
            gemm_heads((float *)d.q.data, d.q.ld, d.q.stride, T, s.hs, T, {dP, T, TT},
                       CUBLAS_OP_N, h.k, CUBLAS_OP_N, 1.0f, 1.0f, nh);
            gemm_heads((float *)d.k.data, d.k.ld, d.k.stride, T, s.hs, T, {dP, T, TT},
                       CUBLAS_OP_T, h.q, CUBLAS_OP_N, 1.0f, 1.0f, nh);
        }
    pt_cuda_scratch_release(mark);
}
