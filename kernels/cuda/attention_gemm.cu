/* Causal attention of an fp32 qkv through cuBLAS: the scores are materialised in scratch
 * and every product is one batched GEMM over all B·NH heads (TF32 when PIPERT_CUDA_TF32
 * allows it, as the other fp32 products). This is how an fp32 step gets cuBLAS's fp32 speed,
 * or tensor cores under TF32, for attention; the flash-style CUDA-core kernels of
 * attention.cu stay for what this declines.
 *
 * Naive reading: attention.cu's, with the same saved state (lse[B,NH,T] in base 2, a copy
 * of out) and the same D = rowsum(dO ⊙ O), so either path's backward takes either path's
 * forward. The queries go in blocks of Tb rows; block I (rows [I·Tb, I·Tb + r)) sees the
 * keys [0, k), k = min(T, (I+1)·Tb), the only ones a causal row of it reaches, so a product
 * does (1 + 1/n)/2 of the full T×T work for n blocks, not all of it. Per block, for every
 * head at once, with Q, K, V, dO its [·, hs] slices (row strides 3C, 3C, 3C, C):
 *   forward:  S = (log₂e/√hs)·Q_I·K_kᵀ    [r, k]
 *             L[i] = log₂ Σ_{j≤i} 2^S[i][j];  P[i][j] = 2^(S[i][j] − L[i]) for j ≤ i, else 0
 *             O_I = P·V_k
 *   backward: S again, P from the saved L
 *             dP = dO_I·V_kᵀ;  dV_k += Pᵀ·dO_I
 *             dS = P ⊙ (dP − D[i]) / √hs   (in place of dP)
 *             dQ_I += dS·K_k;  dK_k += dSᵀ·Q_I
 * The heads' operands are found through pointer arrays (cublasGemmBatchedEx), which a kernel
 * writes into scratch for each block: a head's slices are two strides apart (b and h). The
 * blocks reuse the same scratch one after another: the compute stream orders them.
 * Scratch: B·NH·Tb·T floats of scores forward, twice that backward, Tb as large as fits in
 * SCRATCH_BUDGET and the arena's free top up to T/8 (GPT-2, B = 16, T = 1024: Tb = 128, 96 /
 * 192 MiB); not even 16 rows fitting declines to the CUDA-core kernels. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define LOG2E 1.4426950408889634f
#define SCRATCH_BUDGET ((size_t)512 << 20)
#define MIN_BLOCK_ROWS 16
#define ROWS_PER_BLOCK 8 /* warps per block in the softmax kernel */

struct gemm_attention_shape {
    int B, T, C, NH, hs;
    float scale; /* 1/√hs */
};

/* Query block I: its first row, rows and keys. */
struct query_block {
    int first, rows, keys;
};

static query_block query_block_at(int T, int Tb, int I)
{
    const int first = I * Tb, rows = T - first < Tb ? T - first : Tb;
    return {first, rows, first + rows};
}

/* ---- the operands' pointer arrays -------------------------------------------------------- */

enum { P_Q, P_K, P_V, P_S, P_DP, P_OUT, P_DQ, P_DK, P_DV, P_COUNT };

/* pointers[w][bh] for each operand w of head bh = b·NH + h, at query block `first` */
__global__ void head_pointers_kernel(const float **pointers, const float *qkv, float *dqkv,
                                     float *out, const float *dout, float *S, float *dP,
                                     gemm_attention_shape s, int first, int Tb)
{
    const int bh = blockIdx.x * blockDim.x + threadIdx.x, BH = s.B * s.NH;
    if (bh >= BH) return;
    const int b = bh / s.NH, h = bh % s.NH;
    const size_t sequence = (size_t)b * s.T * 3 * s.C + (size_t)h * s.hs;
    const size_t queries = sequence + (size_t)first * 3 * s.C;
    const size_t rows = ((size_t)b * s.T + first) * s.C + (size_t)h * s.hs;
    const size_t scores = (size_t)bh * Tb * s.T;
    pointers[P_Q * BH + bh] = qkv + queries;
    pointers[P_K * BH + bh] = qkv + sequence + s.C;
    pointers[P_V * BH + bh] = qkv + sequence + 2 * s.C;
    pointers[P_S * BH + bh] = S + scores;
    pointers[P_DP * BH + bh] = dP ? dP + scores : NULL;
    pointers[P_OUT * BH + bh] = out ? out + rows : dout + rows; /* dO in the backward */
    pointers[P_DQ * BH + bh] = dqkv ? dqkv + queries : NULL;
    pointers[P_DK * BH + bh] = dqkv ? dqkv + sequence + s.C : NULL;
    pointers[P_DV * BH + bh] = dqkv ? dqkv + sequence + 2 * s.C : NULL;
}

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

/* Row ii of head bh's block (row index r = bh·rows + ii): its scores at S + (bh·Tb + ii)·T. */
struct block_row {
    int bh, i; /* head, query position */
    size_t at; /* the row's offset in S */
};

__device__ inline block_row block_row_of(size_t r, gemm_attention_shape s, query_block q, int Tb)
{
    const int bh = (int)(r / q.rows), ii = (int)(r % q.rows);
    return {bh, q.first + ii, ((size_t)bh * Tb + ii) * s.T};
}

/* The block's scores (base 2) → P in place, and L; one warp per row */
__global__ void causal_softmax_kernel(float *S, float *lse, gemm_attention_shape s,
                                      query_block q, int Tb)
{
    const size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= (size_t)s.B * s.NH * q.rows) return;
    const block_row row = block_row_of(r, s, q, Tb);
    float *x = S + row.at;
    float m = -INFINITY;
    for (int j = lane; j <= row.i; j += 32) m = fmaxf(m, x[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j <= row.i; j += 32) l += exp2f(x[j] - m);
    const float L = m + log2f(warp_total(l));
    for (int j = lane; j < q.keys; j += 32) x[j] = j <= row.i ? exp2f(x[j] - L) : 0.0f;
    if (lane == 0) lse[(size_t)row.bh * s.T + row.i] = L;
}

/* The block's scores → P in place from the saved L */
__global__ void causal_probabilities_kernel(float *S, const float *lse, gemm_attention_shape s,
                                            query_block q, int Tb)
{
    PT_GRID_STRIDE_LOOP(e, (size_t)s.B * s.NH * q.rows * q.keys)
    {
        const block_row row = block_row_of(e / q.keys, s, q, Tb);
        const int j = (int)(e % q.keys);
        float *x = S + row.at + j;
        *x = j <= row.i ? exp2f(*x - lse[(size_t)row.bh * s.T + row.i]) : 0.0f;
    }
}

/* dP → dS = P ⊙ (dP − D[i])·scale in place */
__global__ void score_gradient_kernel(float *dP, const float *P, const float *delta,
                                      gemm_attention_shape s, query_block q, int Tb)
{
    PT_GRID_STRIDE_LOOP(e, (size_t)s.B * s.NH * q.rows * q.keys)
    {
        const block_row row = block_row_of(e / q.keys, s, q, Tb);
        const size_t at = row.at + e % q.keys;
        dP[at] = P[at] * (dP[at] - delta[(size_t)row.bh * s.T + row.i]) * s.scale;
    }
}

/* ---- the products ----------------------------------------------------------------------- */

/* One row-major operand of the batched products: its heads' pointers, its row length. */
struct heads_operand {
    const float *const *pointers;
    int ld;
};

/* D_h[rows_d, cols_d] = α·op(A_h)·op(B_h) + β·D_h for every head h, row-major, by matmul.cu's
 * mapping (B's buffer first, m = cols_d). */
static void gemm_heads(heads_operand D, int rows_d, int cols_d, int k, heads_operand A,
                       cublasOperation_t op_a, heads_operand B, cublasOperation_t op_b,
                       float alpha, float beta, int heads)
{
    const cublasComputeType_t compute =
        pt_cuda.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    PT_CUBLAS_CHECK(cublasGemmBatchedEx(
        pt_cuda.cublas, op_b, op_a, cols_d, rows_d, k, &alpha, (const void *const *)B.pointers,
        CUDA_R_32F, B.ld, (const void *const *)A.pointers, CUDA_R_32F, A.ld, &beta,
        (void *const *)D.pointers, CUDA_R_32F, D.ld, heads, compute, CUBLAS_GEMM_DEFAULT));
}

/* Query rows per block: T/8 (at least 16) or fewer, as many as `buffers` score buffers of
 * B·NH·Tb·T floats fit in the budget and the arena's free top; 0 when 16 do not. */
static int block_rows(gemm_attention_shape s, int buffers)
{
    const size_t room = pt_cuda.arena.capacity - pt_cuda.arena.top;
    const size_t budget = (room < SCRATCH_BUDGET ? room : SCRATCH_BUDGET) * 7 / 8;
    const size_t per_row = (size_t)buffers * s.B * s.NH * s.T * sizeof(float);
    const size_t fit = budget / per_row;
    int Tb = s.T / 8 > MIN_BLOCK_ROWS ? s.T / 8 : MIN_BLOCK_ROWS;
    if (Tb > s.T) Tb = s.T;
    if ((size_t)Tb > fit) Tb = (int)fit;
    return Tb >= MIN_BLOCK_ROWS || Tb == s.T ? Tb : 0;
}

/* The scratch of one call: the score buffers and the pointer arrays. */
struct attention_scratch {
    float *S, *dP;
    const float **pointers;
};

static bool take_scratch(attention_scratch *x, gemm_attention_shape s, int Tb, int buffers)
{
    const size_t scores = (size_t)s.B * s.NH * Tb * s.T, BH = (size_t)s.B * s.NH;
    x->S = (float *)pt_cuda_scratch(buffers * scores * sizeof(float), "attention scores");
    x->pointers = (const float **)pt_cuda_scratch(P_COUNT * BH * sizeof(float *),
                                                  "attention's pointer arrays");
    x->dP = x->S && buffers > 1 ? x->S + scores : NULL;
    return x->S && x->pointers;
}

static heads_operand operand(const attention_scratch &x, gemm_attention_shape s, int which,
                             int ld)
{
    return {x.pointers + (size_t)which * s.B * s.NH, ld};
}

static void point_at_block(const attention_scratch &x, const float *qkv, float *dqkv, float *out,
                           const float *dout, gemm_attention_shape s, query_block q, int Tb)
{
    const int BH = s.B * s.NH;
    head_pointers_kernel<<<pt_cuda_ceil_div(BH, PT_CUDA_THREADS), PT_CUDA_THREADS, 0,
                           pt_cuda.compute>>>(x.pointers, qkv, dqkv, out, dout, x.S, x.dP, s,
                                              q.first, Tb);
    PT_CUDA_LAUNCHED("head_pointers_kernel");
}

static gemm_attention_shape shape_of(int B, int T, int C, int NH)
{
    return {B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
}

/* ---- the entries ------------------------------------------------------------------------ */

bool pt_cuda_attention_gemm_takes(int B, int T, int C, int NH, bool backward)
{
    const gemm_attention_shape s = shape_of(B, T, C, NH);
    return pt_cuda.gemm_attention && s.hs * NH == C && B > 0 && T > 0 &&
           block_rows(s, backward ? 2 : 1) > 0;
}

void pt_cuda_attention_gemm_forward(float *out, float *lse, float *o_saved, const float *qkv,
                                    int B, int T, int C, int NH)
{
    const gemm_attention_shape s = shape_of(B, T, C, NH);
    const int Tb = block_rows(s, 1), BH = B * NH, ld = 3 * C;
    const size_t mark = pt_cuda_scratch_mark();
    attention_scratch x;
    const bool taken = take_scratch(&x, s, Tb, 1);
    for (int first = 0; taken && first < T; first += Tb) {
        const query_block q = query_block_at(T, Tb, first / Tb);
        point_at_block(x, qkv, NULL, out, NULL, s, q, Tb);
        gemm_heads(operand(x, s, P_S, T), q.rows, q.keys, s.hs, operand(x, s, P_Q, ld),
                   CUBLAS_OP_N, operand(x, s, P_K, ld), CUBLAS_OP_T, LOG2E * s.scale, 0.0f, BH);
        const size_t rows = (size_t)BH * q.rows;
        causal_softmax_kernel<<<(unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
                                32 * ROWS_PER_BLOCK, 0, pt_cuda.compute>>>(x.S, lse, s, q, Tb);
        PT_CUDA_LAUNCHED("causal_softmax_kernel");
        gemm_heads(operand(x, s, P_OUT, C), q.rows, s.hs, q.keys, operand(x, s, P_S, T),
                   CUBLAS_OP_N, operand(x, s, P_V, ld), CUBLAS_OP_N, 1.0f, 0.0f, BH);
    }
    pt_cuda_scratch_release(mark);
    PT_CUDA_CHECK(cudaMemcpyAsync(o_saved, out, (size_t)B * T * C * sizeof(float),
                                  cudaMemcpyDeviceToDevice, pt_cuda.compute));
}

void pt_cuda_attention_gemm_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *lse, const float *delta, int B, int T, int C,
                                     int NH)
{
    const gemm_attention_shape s = shape_of(B, T, C, NH);
    const int Tb = block_rows(s, 2), BH = B * NH, ld = 3 * C;
    const size_t mark = pt_cuda_scratch_mark();
    attention_scratch x;
    const bool taken = take_scratch(&x, s, Tb, 2);
    for (int first = 0; taken && first < T; first += Tb) {
        const query_block q = query_block_at(T, Tb, first / Tb);
        point_at_block(x, qkv, dqkv, NULL, dout, s, q, Tb);
        const size_t n = (size_t)BH * q.rows * q.keys;
        gemm_heads(operand(x, s, P_S, T), q.rows, q.keys, s.hs, operand(x, s, P_Q, ld),
                   CUBLAS_OP_N, operand(x, s, P_K, ld), CUBLAS_OP_T, LOG2E * s.scale, 0.0f, BH);
        causal_probabilities_kernel<<<pt_cuda_blocks_for(n), PT_CUDA_THREADS, 0,
                                      pt_cuda.compute>>>(x.S, lse, s, q, Tb);
        PT_CUDA_LAUNCHED("causal_probabilities_kernel");
        /* dP = dO·Vᵀ;  dV += Pᵀ·dO */
        gemm_heads(operand(x, s, P_DP, T), q.rows, q.keys, s.hs, operand(x, s, P_OUT, C),
                   CUBLAS_OP_N, operand(x, s, P_V, ld), CUBLAS_OP_T, 1.0f, 0.0f, BH);
        gemm_heads(operand(x, s, P_DV, ld), q.keys, s.hs, q.rows, operand(x, s, P_S, T),
                   CUBLAS_OP_T, operand(x, s, P_OUT, C), CUBLAS_OP_N, 1.0f, 1.0f, BH);
        score_gradient_kernel<<<pt_cuda_blocks_for(n), PT_CUDA_THREADS, 0, pt_cuda.compute>>>(
            x.dP, x.S, delta, s, q, Tb);
        PT_CUDA_LAUNCHED("score_gradient_kernel");
        /* dQ += dS·K;  dK += dSᵀ·Q */
        gemm_heads(operand(x, s, P_DQ, ld), q.rows, s.hs, q.keys, operand(x, s, P_DP, T),
                   CUBLAS_OP_N, operand(x, s, P_K, ld), CUBLAS_OP_N, 1.0f, 1.0f, BH);
        gemm_heads(operand(x, s, P_DK, ld), q.keys, s.hs, q.rows, operand(x, s, P_DP, T),
                   CUBLAS_OP_T, operand(x, s, P_Q, ld), CUBLAS_OP_N, 1.0f, 1.0f, BH);
    }
    pt_cuda_scratch_release(mark);
}
