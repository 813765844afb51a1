/* Causal multi-head self-attention, flash-attention style: the T×T
 * probabilities are never stored. The forward keeps each row's log-sum-exp;
 * the backward recomputes the probabilities tile by tile from it.
 *
 * Naive reading, for each (b, h), with Q, K, V the [T, hs] slices of qkv,
 * scale = 1/√hs, and every sum over j running over j ≤ i only (causal), as
 * in kernels/cpu/attention.c:
 *   forward:  S[i][j] = scale·Σ_d Q[i][d]·K[j][d];  P[i] = softmax_j(S[i]);
 *             O[i][d] = Σ_j P[i][j]·V[j][d]
 *   backward: dP[i][j] = Σ_d dO[i][d]·V[j][d];  dV[j][d] += Σ_i P[i][j]·dO[i][d]
 *             dS[i][j] = P[i][j]·(dP[i][j] − D[i])·scale,  D[i] = Σ_j P[i][j]·dP[i][j]
 *             dQ[i][d] += Σ_j dS[i][j]·K[j][d];  dK[j][d] += Σ_i dS[i][j]·Q[i][d]
 *
 * What the forward saves, in `att` (pt_cuda_attention_saved_floats):
 *   lse[B, NH, T]  L[i] = log₂ Σ_{j≤i} 2^(S[i][j]·log₂e), so P[i][j] = 2^(S[i][j]·log₂e − L[i])
 *   o[B, T, C]     a copy of out, for D[i] = Σ_j P[i][j]·dP[i][j] = Σ_d dO[i][d]·O[i][d]
 *                  (attention_backward is not given out, and D needs it)
 * Scores are kept in base 2 (exp2f is one instruction); the forward and the
 * backward compute every score with the same expression, so the recomputed
 * probabilities are the forward's.
 *
 * Work split. Every kernel gives one thread to one "own" row of one (b, h)
 * and keeps that row's accumulators in registers; the rows of the other side
 * pass through shared memory in tiles, read by all threads at once
 * (broadcast). Head sizes are rounded up to a template HS (16, 32, 64, 128)
 * with zero padding, so the register arrays have compile-time sizes.
 *   forward    own query rows i; tiles of K and V rows j ≤ i. Online softmax:
 *              a running max m, sum l and output o, rescaled when m grows.
 *   dq         own query rows i; tiles of K and V rows j ≤ i.
 *   dkdv       own key rows j (K and V rows in shared memory, padded); tiles
 *              of Q and dO rows i ≥ j, with their L[i] and D[i].
 * dq and dkdv each recompute the probabilities (the price of determinism:
 * no atomics, every sum in a fixed order). Row blocks are scheduled longest
 * first.
 *
 * These are fp32 CUDA-core kernels, clear rather than fast. A bf16 qkv of head
 * size 32, 64 or 128 goes to the tensor-core kernels of attention_mma.cuh (the
 * same saved state and D; P, dO and dS rounded to bf16 for the products); an
 * fp32 qkv to cuBLAS's products (attention_gemm.cu, the same saved state and D)
 * where their T×T scratch fits. PIPERT_CUDA_MMA_ATTENTION=0 and
 * PIPERT_CUDA_GEMM_ATTENTION=0 keep each here.
 */
#include <math.h>
#include <stdio.h>
#include <type_traits>

#include "kernels/cuda/common.cuh"

#define ROWS_PER_BLOCK 64 /* own rows per block = threads per block */
#define TILE_ROWS 32      /* rows of the other side per shared-memory tile */
#define MAX_HEAD_SIZE 128
#define LOG2E 1.4426950408889634f

struct attention_shape {
    int B, T, C, NH, hs;
    float scale;      /* 1/√hs */
    float scale_log2; /* log₂e/√hs: the score in base 2 */
};

/* A value of qkv (fp32, or bf16 under runtime.precision = bf16) as the fp32 the sums use. */
__device__ inline float as_float(float x) { return x; }
__device__ inline float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/* Rows [r0, r0 + rows) of one head's slice of a [B, T, row_stride] buffer
 * into tile[rows][tile_stride], zero beyond T and beyond hs. `src` points at
 * (b, t = 0, first column of the head). All threads of the block take part. */
template <class Element>
__device__ void load_rows(float *tile, int rows, int tile_stride, const Element *src,
                          size_t row_stride, int r0, int T, int hs, int HS)
{
    for (int idx = threadIdx.x; idx < rows * HS; idx += blockDim.x) {
        int r = idx / HS, d = idx % HS, t = r0 + r;
        tile[r * tile_stride + d] =
            t < T && d < hs ? as_float(src[(size_t)t * row_stride + d]) : 0.0f;
    }
}

/* Σ_d a[d]·b[d] for a in registers and b in shared memory. */
template <int HS> __device__ inline float dot_shared(const float (&a)[HS], const float *b)
{
    float acc = 0.0f;
#pragma unroll
    for (int d = 0; d < HS; d++) acc += a[d] * b[d];
    return acc;
}

/* The (b, h) and first own row of this block. Blocks are scheduled longest
 * first: own query rows near T see the most keys (last_rows_first), own key
 * rows near 0 the most queries. */
struct block_rows {
    int b, h, bh, r0;
};

__device__ inline block_rows own_rows(attention_shape s, bool last_rows_first)
{
    int blocks_per_head = (s.T + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    int bh = (int)(blockIdx.x / blocks_per_head), k = (int)(blockIdx.x % blocks_per_head);
    int row_block = last_rows_first ? blocks_per_head - 1 - k : k;
    return {bh / s.NH, bh % s.NH, bh, row_block * ROWS_PER_BLOCK};
}

/* Pointers to (b, t = 0, head h) of q, k, v inside qkv[B, T, 3C], and of a
 * [B, T, C] buffer. */
template <class Element>
__device__ inline const Element *qkv_head(const Element *qkv, attention_shape s, int b, int h,
                                          int part)
{
    return qkv + (size_t)b * s.T * 3 * s.C + (size_t)part * s.C + (size_t)h * s.hs;
}
__device__ inline size_t btc_head(attention_shape s, int b, int h)
{
    return (size_t)b * s.T * s.C + (size_t)h * s.hs;
}

/* x = row i of a head's slice starting at src (zero beyond hs, or when the
 * thread has no row). */
template <int HS, class Element>
__device__ inline void load_own_row(float (&x)[HS], const Element *src, size_t row_stride, int i,
                                    bool active, int hs)
{
#pragma unroll
    for (int d = 0; d < HS; d++)
        x[d] = active && d < hs ? as_float(src[(size_t)i * row_stride + d]) : 0.0f;
}

/* K and V rows [j0, j0 + TILE_ROWS) of the block's head into their tiles. */
template <int HS, class Element>
__device__ inline void load_kv_tiles(float *k_tile, float *v_tile, const Element *qkv,
                                     attention_shape s, block_rows blk, int j0)
{
    load_rows(k_tile, TILE_ROWS, HS, qkv_head(qkv, s, blk.b, blk.h, 1), 3 * (size_t)s.C, j0, s.T,
              s.hs, HS);
    load_rows(v_tile, TILE_ROWS, HS, qkv_head(qkv, s, blk.b, blk.h, 2), 3 * (size_t)s.C, j0, s.T,
              s.hs, HS);
}

/* ---- forward ------------------------------------------------------------------------ */

template <int HS, class Element>
__global__ void __launch_bounds__(ROWS_PER_BLOCK)
    attention_forward_kernel(float *out, float *lse, float *o_saved, const Element *qkv,
                             attention_shape s)
{
    /* out[B,T,C], lse[B,NH,T], o_saved[B,T,C], qkv[B,T,3C] */
    __shared__ __align__(16) float k_tile[TILE_ROWS * HS];
    __shared__ __align__(16) float v_tile[TILE_ROWS * HS];
    const block_rows blk = own_rows(s, true);
    const int i = blk.r0 + threadIdx.x;
    const bool active = i < s.T;
    float q[HS], o[HS];
    load_own_row(q, qkv_head(qkv, s, blk.b, blk.h, 0), 3 * (size_t)s.C, i, active, s.hs);
#pragma unroll
    for (int d = 0; d < HS; d++) o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* running max (base 2) and Σ 2^(score − m) */

    const int last_row = min(blk.r0 + ROWS_PER_BLOCK, s.T) - 1; /* keys [0, last_row] */
    for (int j0 = 0; j0 <= last_row; j0 += TILE_ROWS) {
        load_kv_tiles<HS>(k_tile, v_tile, qkv, s, blk, j0);
        __syncthreads();
        const int j_end = active ? min(j0 + TILE_ROWS, i + 1) : j0; /* causal: j ≤ i */
        for (int j = j0; j < j_end; j++) {
            const float score = dot_shared(q, k_tile + (j - j0) * HS) * s.scale_log2;
            if (score > m) { /* a new max: rescale what was summed against the old one */
                const float correction = exp2f(m - score);
                l *= correction;
#pragma unroll
                for (int d = 0; d < HS; d++) o[d] *= correction;
                m = score;
            }
            const float p = exp2f(score - m);
            l += p;
            const float *v = v_tile + (j - j0) * HS;
#pragma unroll
            for (int d = 0; d < HS; d++) o[d] += p * v[d];
        }
        __syncthreads();
    }
    if (!active) return;
    const float inv_l = 1.0f / l;
    const size_t row = btc_head(s, blk.b, blk.h) + (size_t)i * s.C;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < s.hs) out[row + d] = o_saved[row + d] = o[d] * inv_l;
    lse[(size_t)blk.bh * s.T + i] = m + log2f(l);
}

/* ---- backward ----------------------------------------------------------------------- */

__global__ void attention_delta_kernel(float *delta, const float *dout, const float *o_saved,
                                       attention_shape s)
{
    /* delta[B,NH,T] = Σ_d dout·o over each head's columns; dout, o_saved [B,T,C];
     * one thread per (b, t, h) */
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)s.B * s.T * s.NH) return;
    int h = (int)(idx % s.NH);
    size_t bt = idx / s.NH;
    int t = (int)(bt % s.T), b = (int)(bt / s.T);
    const size_t row = bt * s.C + (size_t)h * s.hs;
    float acc = 0.0f;
    for (int d = 0; d < s.hs; d++) acc += dout[row + d] * o_saved[row + d];
    delta[((size_t)b * s.NH + h) * s.T + t] = acc;
}

template <int HS, class Element>
__global__ void __launch_bounds__(ROWS_PER_BLOCK)
    attention_backward_dq_kernel(float *dqkv, const float *dout, const Element *qkv,
                                 const float *lse, const float *delta, attention_shape s)
{
    /* dqkv[B,T,3C] (+= into the q columns), dout[B,T,C], qkv[B,T,3C], lse and delta [B,NH,T] */
    __shared__ __align__(16) float k_tile[TILE_ROWS * HS];
    __shared__ __align__(16) float v_tile[TILE_ROWS * HS];
    const block_rows blk = own_rows(s, true);
    const int i = blk.r0 + threadIdx.x;
    const bool active = i < s.T;
    float q[HS], d_o[HS], dq[HS];
    load_own_row(q, qkv_head(qkv, s, blk.b, blk.h, 0), 3 * (size_t)s.C, i, active, s.hs);
    load_own_row(d_o, dout + btc_head(s, blk.b, blk.h), s.C, i, active, s.hs);
#pragma unroll
    for (int d = 0; d < HS; d++) dq[d] = 0.0f;
    const float L = active ? lse[(size_t)blk.bh * s.T + i] : 0.0f;
    const float D = active ? delta[(size_t)blk.bh * s.T + i] : 0.0f;

    const int last_row = min(blk.r0 + ROWS_PER_BLOCK, s.T) - 1;
    for (int j0 = 0; j0 <= last_row; j0 += TILE_ROWS) {
        load_kv_tiles<HS>(k_tile, v_tile, qkv, s, blk, j0);
        __syncthreads();
        const int j_end = active ? min(j0 + TILE_ROWS, i + 1) : j0;
        for (int j = j0; j < j_end; j++) {
            const float *k = k_tile + (j - j0) * HS;
            const float p = exp2f(dot_shared(q, k) * s.scale_log2 - L);
            const float ds = p * (dot_shared(d_o, v_tile + (j - j0) * HS) - D);
#pragma unroll
            for (int d = 0; d < HS; d++) dq[d] += ds * k[d];
        }
        __syncthreads();
    }
    if (!active) return;
    float *dq_dst = dqkv + (size_t)blk.b * s.T * 3 * s.C + (size_t)i * 3 * s.C + (size_t)blk.h * s.hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < s.hs) dq_dst[d] += dq[d] * s.scale;
}

/* Shared memory of the dkdv kernel: own K and V rows (stride HS + 1, so that
 * thread t reading row t hits bank (t + d) mod 32: no conflicts), tiles of
 * Q and dO rows, and their L and D. */
template <int HS> constexpr size_t dkdv_shared_floats()
{
    return 2 * (size_t)ROWS_PER_BLOCK * (HS + 1) + 2 * (size_t)TILE_ROWS * HS + 2 * TILE_ROWS;
}

template <int HS, class Element>
__global__ void __launch_bounds__(ROWS_PER_BLOCK)
    attention_backward_dkdv_kernel(float *dqkv, const float *dout, const Element *qkv,
                                   const float *lse, const float *delta, attention_shape s)
{
    /* dqkv[B,T,3C] (+= into the k and v columns), dout[B,T,C], qkv[B,T,3C],
     * lse and delta [B,NH,T] */
    extern __shared__ __align__(16) float shared[];
    float *k_own = shared;                                /* [ROWS_PER_BLOCK][HS + 1] */
    float *v_own = k_own + ROWS_PER_BLOCK * (HS + 1);     /* [ROWS_PER_BLOCK][HS + 1] */
    float *q_tile = v_own + ROWS_PER_BLOCK * (HS + 1);    /* [TILE_ROWS][HS] */
    float *do_tile = q_tile + TILE_ROWS * HS;             /* [TILE_ROWS][HS] */
    float *L_tile = do_tile + TILE_ROWS * HS;             /* [TILE_ROWS] */
    float *D_tile = L_tile + TILE_ROWS;                   /* [TILE_ROWS] */

    const block_rows blk = own_rows(s, false);
    const int j = blk.r0 + threadIdx.x;
    const bool active = j < s.T;
    load_rows(k_own, ROWS_PER_BLOCK, HS + 1, qkv_head(qkv, s, blk.b, blk.h, 1), 3 * (size_t)s.C,
              blk.r0, s.T, s.hs, HS);
    load_rows(v_own, ROWS_PER_BLOCK, HS + 1, qkv_head(qkv, s, blk.b, blk.h, 2), 3 * (size_t)s.C,
              blk.r0, s.T, s.hs, HS);
    const float *k = k_own + threadIdx.x * (HS + 1), *v = v_own + threadIdx.x * (HS + 1);

    float dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) dk[d] = dv[d] = 0.0f;

    for (int i0 = blk.r0; i0 < s.T; i0 += TILE_ROWS) { /* queries i ≥ j ≥ r0 */
        load_rows(q_tile, TILE_ROWS, HS, qkv_head(qkv, s, blk.b, blk.h, 0), 3 * (size_t)s.C, i0,
                  s.T, s.hs, HS);
        load_rows(do_tile, TILE_ROWS, HS, dout + btc_head(s, blk.b, blk.h), s.C, i0, s.T, s.hs,
                  HS);
        for (int r = threadIdx.x; r < TILE_ROWS; r += blockDim.x) {
            bool row_exists = i0 + r < s.T;
            L_tile[r] = row_exists ? lse[(size_t)blk.bh * s.T + i0 + r] : 0.0f;
            D_tile[r] = row_exists ? delta[(size_t)blk.bh * s.T + i0 + r] : 0.0f;
        }
        __syncthreads(); /* (the first pass also waits for k_own and v_own) */
        if (active)
            for (int r = 0; r < TILE_ROWS; r++) {
                const int i = i0 + r;
                if (i < j || i >= s.T) continue; /* causal, and past the end */
                const float *q = q_tile + r * HS, *d_o = do_tile + r * HS;
                float score = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    score += q[d] * k[d];
                    dp += d_o[d] * v[d];
                }
                const float p = exp2f(score * s.scale_log2 - L_tile[r]);
                const float ds = p * (dp - D_tile[r]);
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    dv[d] += p * d_o[d];
                    dk[d] += ds * q[d];
                }
            }
        __syncthreads();
    }
    if (!active) return;
    float *dk_dst = dqkv + (size_t)blk.b * s.T * 3 * s.C + (size_t)j * 3 * s.C + s.C +
                    (size_t)blk.h * s.hs;
    float *dv_dst = dk_dst + s.C;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < s.hs) {
            dk_dst[d] += dk[d] * s.scale;
            dv_dst[d] += dv[d];
        }
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* The template head size for hs, or 0 when hs is too large. */
static int head_size_class(int hs)
{
    for (int HS = 16; HS <= MAX_HEAD_SIZE; HS *= 2)
        if (hs <= HS) return HS;
    return 0;
}

static bool shape_for(attention_shape *s, int B, int T, int C, int NH, const char *what)
{
    const int hs = C / NH;
    *s = attention_shape{B, T, C, NH, hs, 1.0f / sqrtf((float)hs), LOG2E / sqrtf((float)hs)};
    if (head_size_class(s->hs) == 0) {
        char detail[128];
        snprintf(detail, sizeof detail, "head size %d (n_embd %d / n_head %d) is over %d", s->hs, C,
                 NH, MAX_HEAD_SIZE);
        pt_cuda_record_error(what, detail, __FILE__, __LINE__);
        return false;
    }
    return B > 0 && T > 0;
}

static unsigned attention_blocks(attention_shape s)
{
    return (unsigned)((size_t)s.B * s.NH * pt_cuda_ceil_div(s.T, ROWS_PER_BLOCK));
}

template <int HS, class Element> static pipert_result allow_dkdv_shared_memory(void)
{
    size_t bytes = dkdv_shared_floats<HS>() * sizeof(float);
    if (bytes > pt_cuda.prop.sharedMemPerBlockOptin)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "CUDA attention: the backward for head size %d needs %zu bytes of shared "
                       "memory per block; %s has %zu",
                       HS, bytes, pt_cuda.prop.name, (size_t)pt_cuda.prop.sharedMemPerBlockOptin);
    cudaError_t err = cudaFuncSetAttribute(attention_backward_dkdv_kernel<HS, Element>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_INTERNAL, "CUDA attention: cudaFuncSetAttribute: %s",
                       cudaGetErrorString(err));
    return PIPERT_OK;
}

template <class Element> static pipert_result allow_dkdv_shared_memory_all(void)
{
    PT_TRY((allow_dkdv_shared_memory<16, Element>()));
    PT_TRY((allow_dkdv_shared_memory<32, Element>()));
    PT_TRY((allow_dkdv_shared_memory<64, Element>()));
    PT_TRY((allow_dkdv_shared_memory<128, Element>()));
    return PIPERT_OK;
}

pipert_result pt_cuda_attention_setup(void)
{
    PT_TRY(allow_dkdv_shared_memory_all<float>());
    PT_TRY(allow_dkdv_shared_memory_all<__nv_bfloat16>());
    return PIPERT_OK;
}

template <int HS, class Element>
static void forward_launch(float *out, float *att, const Element *qkv, attention_shape s)
{
    float *lse = att, *o_saved = att + (size_t)s.B * s.NH * s.T;
    attention_forward_kernel<HS, Element><<<attention_blocks(s), ROWS_PER_BLOCK, 0, pt_cuda.compute>>>(
        out, lse, o_saved, qkv, s);
    PT_CUDA_LAUNCHED("attention_forward_kernel");
}

template <int HS, class Element>
static void backward_launch(float *dqkv, const float *dout, const Element *qkv, const float *lse,
                            const float *delta, attention_shape s)
{
    attention_backward_dq_kernel<HS, Element><<<attention_blocks(s), ROWS_PER_BLOCK, 0, pt_cuda.compute>>>(
        dqkv, dout, qkv, lse, delta, s);
    PT_CUDA_LAUNCHED("attention_backward_dq_kernel");
    attention_backward_dkdv_kernel<HS, Element>
        <<<attention_blocks(s), ROWS_PER_BLOCK, dkdv_shared_floats<HS>() * sizeof(float),
           pt_cuda.compute>>>(dqkv, dout, qkv, lse, delta, s);
    PT_CUDA_LAUNCHED("attention_backward_dkdv_kernel");
}

/* A bf16 qkv goes to the tensor-core kernels (attention_mma.cu) where they take its shape. */
static bool on_tensor_cores(const float *qkv, int C, int NH) { return false; }
static bool on_tensor_cores(const __nv_bfloat16 *qkv, int C, int NH)
{
    return pt_cuda_attention_mma_takes(qkv, C, NH);
}

/* An fp32 qkv's backward goes through cuBLAS (attention_gemm.cu) where its scratch fits. */
static bool on_gemms(const float *qkv, int B, int T, int C, int NH)
{
    return pt_cuda_attention_gemm_takes(B, T, C, NH, true);
}
static bool on_gemms(const __nv_bfloat16 *qkv, int B, int T, int C, int NH) { return false; }

/* D = rowsum(dO ⊙ O) per (b, h, t) into scratch (the caller releases it), or NULL when the
 * arena has no room (recorded). */
static const float *delta_of(const float *dout, const float *att, attention_shape s)
{
    const float *o_saved = att + (size_t)s.B * s.NH * s.T;
    float *delta =
        (float *)pt_cuda_scratch((size_t)s.B * s.NH * s.T * sizeof(float), "attention delta");
    if (!delta) return NULL;
    size_t rows = (size_t)s.B * s.T * s.NH;
    attention_delta_kernel<<<(unsigned)((rows + PT_CUDA_THREADS - 1) / PT_CUDA_THREADS),
                             PT_CUDA_THREADS, 0, pt_cuda.compute>>>(delta, dout, o_saved, s);
    PT_CUDA_LAUNCHED("attention_delta_kernel");
    return delta;
}

template <class Element>
static void backward_for_head_size(float *dqkv, const float *dout, const Element *qkv,
                                   const float *lse, const float *delta, attention_shape s)
{
    switch (head_size_class(s.hs)) {
    case 16: backward_launch<16>(dqkv, dout, qkv, lse, delta, s); break;
    case 32: backward_launch<32>(dqkv, dout, qkv, lse, delta, s); break;
    case 64: backward_launch<64>(dqkv, dout, qkv, lse, delta, s); break;
    default: backward_launch<128>(dqkv, dout, qkv, lse, delta, s); break;
    }
}

template <class Element>
static void attention_forward(float *out, float *att, const Element *qkv, int B, int T, int C,
                              int NH)
{
    /* out[B,T,C], att[pt_cuda_attention_saved_floats], qkv[B,T,3C] */
    attention_shape s;
    if (!shape_for(&s, B, T, C, NH, "attention_forward")) return;
    if (on_tensor_cores(qkv, C, NH)) {
        pt_cuda_attention_mma_forward(out, att, att + (size_t)B * NH * T,
                                      (const __nv_bfloat16 *)qkv, B, T, C, NH);
        return;
    }
    if constexpr (std::is_same_v<Element, float>)
        if (pt_cuda_attention_gemm_takes(B, T, C, NH, false)) {
            pt_cuda_attention_gemm_forward(out, att, att + (size_t)B * NH * T, qkv, B, T, C, NH);
            return;
        }
    switch (head_size_class(s.hs)) {
    case 16: forward_launch<16>(out, att, qkv, s); break;
    case 32: forward_launch<32>(out, att, qkv, s); break;
    case 64: forward_launch<64>(out, att, qkv, s); break;
    default: forward_launch<128>(out, att, qkv, s); break;
    }
}

template <class Element>
static void attention_backward(float *dqkv, const float *dout, const Element *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    /* dqkv[B,T,3C] (+=), dout[B,T,C], qkv[B,T,3C], att as the forward left it */
    attention_shape s;
    if (!shape_for(&s, B, T, C, NH, "attention_backward")) return;
    const float *lse = att, *o_saved = att + (size_t)B * NH * T;
    if (on_tensor_cores(qkv, C, NH)) { /* D and a bf16 dO in one pass of its own */
        pt_cuda_attention_mma_backward(dqkv, dout, (const __nv_bfloat16 *)qkv, lse, o_saved, B, T,
                                       C, NH);
        return;
    }
    size_t mark = pt_cuda_scratch_mark();
    const float *delta = delta_of(dout, att, s);
    if (delta && on_gemms(qkv, B, T, C, NH))
        pt_cuda_attention_gemm_backward(dqkv, dout, (const float *)qkv, lse, delta, B, T, C, NH);
    else if (delta)
        backward_for_head_size(dqkv, dout, qkv, lse, delta, s);
    pt_cuda_scratch_release(mark);
}

void pt_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH)
{
    attention_forward(out, att, qkv, B, T, C, NH);
}

void pt_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH)
{
    attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
}

/* runtime.precision = bf16: the same kernels reading a bf16 qkv, each value widened exactly
 * as it is loaded (the sums, the saved state and the gradients stay fp32). */
void pt_cuda_attention_forward_bf16(float *out, float *att, const pt_bf16 *qkv, int B, int T,
                                    int C, int NH)
{
    attention_forward(out, att, (const __nv_bfloat16 *)qkv, B, T, C, NH);
}

void pt_cuda_attention_backward_bf16(float *dqkv, const float *dout, const pt_bf16 *qkv,
                                     const float *att, int B, int T, int C, int NH)
{
    attention_backward(dqkv, dout, (const __nv_bfloat16 *)qkv, att, B, T, C, NH);
}

/* The gradient of a bf16 qkv written in bf16 (kernels.h): the tensor-core kernels round each
 * element as they write it; other shapes run the CUDA-core kernels into the fp32 scratch
 * (zeroed, added into) and cast it. */
void pt_cuda_attention_backward_bf16_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                             const pt_bf16 *qkv, const float *att, int B, int T,
                                             int C, int NH)
{
    const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkv;
    if (!on_tensor_cores(q, C, NH)) {
        const size_t n = (size_t)B * T * 3 * C;
        pt_cuda_zero(scratch, n * sizeof(float));
        attention_backward(scratch, dout, q, att, B, T, C, NH);
        pt_cuda_cast_to_bf16(dqkv, scratch, n);
        return;
    }
    attention_shape s;
    if (!shape_for(&s, B, T, C, NH, "attention_backward_bf16_to_bf16")) return;
    pt_cuda_attention_mma_backward_to_bf16(dqkv, dout, q, att, att + (size_t)B * NH * T, B, T, C,
                                           NH);
}

/* out written in bf16 (kernels.h): the tensor-core kernels round it as they write it, beside
 * the fp32 copy they save; other shapes run the CUDA-core forward into scratch and cast. */
void pt_cuda_attention_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, float *att,
                                            const pt_bf16 *qkv, int B, int T, int C, int NH)
{
    const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkv;
    if (!on_tensor_cores(q, C, NH)) {
        attention_forward(scratch, att, q, B, T, C, NH);
        pt_cuda_cast_to_bf16(out, scratch, (size_t)B * T * C);
        return;
    }
    attention_shape s;
    if (!shape_for(&s, B, T, C, NH, "attention_forward_bf16_to_bf16")) return;
    pt_cuda_attention_mma_forward_to_bf16(out, att, att + (size_t)B * NH * T, q, B, T, C, NH);
}
