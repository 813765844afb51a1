/* LayerNorm over the channels of each position, ε = 1e-5.
 *
 * Naive reading, for each row x = inp[n, :] (as kernels/cpu/layernorm.c):
 *   forward:  μ = Σx/C;  σ² = Σ(x−μ)²/C;  rstd = 1/√(σ²+ε);  x̂ = (x−μ)·rstd;
 *             out = x̂·weight + bias
 *   backward: g = dout·weight;
 *             dinp += rstd·(g − mean(g) − x̂·mean(g·x̂));
 *             dweight += Σ_n dout·x̂;  dbias += Σ_n dout
 *
 * With a residual (residual_layernorm_forward): x = a + b, written to residual in
 * the first pass, the residual stream's sum and the layernorm after it in one.
 *
 * One warp per row for everything per row (two passes for the variance, as
 * on the CPU: no cancellation for large means); the parameter gradients are
 * deterministic column sums (reduce.cuh).
 *
 * Where C is a multiple of 4 (fp32 rows) or 8 (bf16 output) and every buffer is 16-byte
 * aligned, a lane moves 16 bytes a load (vector.cuh); elsewhere one element.
 *
 * The backward in one pass over dout and inp where the parameter gradients' partial sums fit
 * in shared memory: each warp adds its rows' dout·x̂ and dout into sums of its own (each lane owns
 * the columns it takes, so no two lanes touch one word), the block adds its warps' in warp order
 * into a partial of its own, and a second kernel adds the partials in block order: the same
 * bits every run, as the column sums, from a grid of a fixed size. Three kernels read dout
 * and inp before (dinp's, then dweight's and dbias's column sums): ~150 MB less a GPT-2
 * layernorm at B = 16. */
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/vector.cuh"

#define LAYERNORM_EPS 1e-5f
#define ROWS_PER_BLOCK 8 /* warps per block */

/* An output value as its element type: fp32, or bf16 rounded to nearest even. */
__device__ inline void store(float *y, float v) { *y = v; }
__device__ inline void store(__nv_bfloat16 *y, float v) { *y = __float2bfloat16_rn(v); }

/* One warp per row, lane l taking the row's columns W at a time: [W·l, W·l + W), then 32·W
 * further on, and so on (W = 1: columns l, l + 32, ...; W > 1: 16-byte loads, vector.cuh, where
 * C is a multiple of W and every buffer 16-byte aligned). WITH_RESIDUAL: the row is a + b,
 * written to residual as the first pass makes it and read back from there by the later passes
 * (each lane its own columns: no barrier); residual may be a or b. Otherwise the row is a. */
template <class Element, bool WITH_RESIDUAL, int W>
__global__ void layernorm_forward_kernel(Element *out, float *mean, float *rstd, float *residual,
                                         const float *a, const float *b, const float *weight,
                                         const float *bias, int N, int C)
{
    /* out[N,C] (fp32, or bf16 under runtime.precision = bf16), mean[N], rstd[N], residual, a,
     * b [N,C] (residual and b only WITH_RESIDUAL), weight[C], bias[C] */
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const size_t row = (size_t)n * C;
    const float *x = WITH_RESIDUAL ? residual + row : a + row;
    Element *y = out + row;
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        pt_elements<float, W> v = pt_load<W>(a + row + c);
        if (WITH_RESIDUAL) {
            const pt_elements<float, W> u = pt_load<W>(b + row + c);
#pragma unroll
            for (int k = 0; k < W; k++) v.e[k] = v.e[k] + u.e[k];
            pt_store<W>(residual + row + c, v);
        }
#pragma unroll
        for (int k = 0; k < W; k++) sum += v.e[k];
    }
    float mu = pt_warp_sum(sum) / (float)C;
    float squares = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const pt_elements<float, W> v = pt_load<W>(x + c);
#pragma unroll
        for (int k = 0; k < W; k++) squares += (v.e[k] - mu) * (v.e[k] - mu);
    }
    float s = 1.0f / sqrtf(pt_warp_sum(squares) / (float)C + LAYERNORM_EPS);
    for (int c = lane * W; c < C; c += 32 * W) {
        const pt_elements<float, W> v = pt_load<W>(x + c), w = pt_load<W>(weight + c),
                                    beta = pt_load<W>(bias + c);
        pt_elements<Element, W> o;
#pragma unroll
        for (int k = 0; k < W; k++) store(&o.e[k], (v.e[k] - mu) * s * w.e[k] + beta.e[k]);
        pt_store<W>(y + c, o);
    }
    if (lane == 0) {
        mean[n] = mu;
        rstd[n] = s;
    }
}

/* One warp's row n of the backward, columns taken as the forward's: dinp's row +=, with
 * rounded (not NULL) the sum also rounded to bf16 there, and with dw, db (this warp's sums, each
 * lane owning the columns it takes) the row's dout·x̂ and dout added into them. */
template <int W>
__device__ inline void layernorm_backward_row(float *dinp, __nv_bfloat16 *rounded, float *dw,
                                              float *db, const float *dout, const float *inp,
                                              const float *weight, const float *mean,
                                              const float *rstd, int n, int C, int lane)
{
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    const float mu = mean[n], s = rstd[n];
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const pt_elements<float, W> d = pt_load<W>(dy + c), v = pt_load<W>(x + c),
                                    w = pt_load<W>(weight + c);
#pragma unroll
        for (int k = 0; k < W; k++) {
            float g = d.e[k] * w.e[k];
            g_sum += g;
            g_xhat_sum += g * (v.e[k] - mu) * s;
        }
    }
    float g_mean = pt_warp_sum(g_sum) / (float)C, g_xhat_mean = pt_warp_sum(g_xhat_sum) / (float)C;
    for (int c = lane * W; c < C; c += 32 * W) {
        const pt_elements<float, W> d = pt_load<W>(dy + c), v = pt_load<W>(x + c),
                                    w = pt_load<W>(weight + c);
        pt_elements<float, W> g = pt_load<W>(dx + c), xhat;
#pragma unroll
        for (int k = 0; k < W; k++) {
            xhat.e[k] = (v.e[k] - mu) * s;
            g.e[k] += s * (d.e[k] * w.e[k] - g_mean - xhat.e[k] * g_xhat_mean);
        }
        pt_store<W>(dx + c, g);
        if (rounded) {
            pt_elements<__nv_bfloat16, W> r;
#pragma unroll
            for (int k = 0; k < W; k++) r.e[k] = __float2bfloat16_rn(g.e[k]);
            pt_store<W>(rounded + (size_t)n * C + c, r);
        }
        if (dw) {
            pt_elements<float, W> sw = pt_load<W>(dw + c), sb = pt_load<W>(db + c);
#pragma unroll
            for (int k = 0; k < W; k++) {
                sw.e[k] += d.e[k] * xhat.e[k];
                sb.e[k] += d.e[k];
            }
            pt_store<W>(dw + c, sw);
            pt_store<W>(db + c, sb);
        }
    }
}

template <int W>
__global__ void layernorm_backward_input_kernel(float *dinp, __nv_bfloat16 *rounded,
                                                const float *dout, const float *inp,
                                                const float *weight, const float *mean,
                                                const float *rstd, int N, int C)
{
    /* dinp[N,C] +=, rounded[N,C] or NULL, dout[N,C], inp[N,C], weight[C], mean[N], rstd[N]; one
     * warp per row */
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    layernorm_backward_row<W>(dinp, rounded, NULL, NULL, dout, inp, weight, mean, rstd, n, C,
                              lane);
}

/* The backward's columns 4 at a time where its rows' buffers allow (the forward's W, for fp32) */
#define BACKWARD_W 4
static bool backward_in_vectors(const float *dinp, const __nv_bfloat16 *rounded,
                                const float *dout, const float *inp, const float *weight, int C)
{
    return C % BACKWARD_W == 0 && pt_aligned16(dinp, rounded, dout, inp, weight);
}

#define FUSED_WARPS 4      /* a block of the one-pass backward */
#define FUSED_BLOCKS 1024  /* at most, a fixed number (the sums' order is the grid's) */
#define FUSED_SHARED_MAX (48 * 1024)

static size_t fused_shared_bytes(int C) { return (size_t)FUSED_WARPS * 2 * C * sizeof(float); }

template <int W>
__global__ void layernorm_backward_fused_kernel(float *dinp, __nv_bfloat16 *rounded,
                                                float *partials, const float *dout,
                                                const float *inp, const float *weight,
                                                const float *mean, const float *rstd, int N, int C)
{
    /* dinp[N,C] +=; partials[2][gridDim.x][C]: the block's Σ dout·x̂ (dweight's), then its
     * Σ dout (dbias's); the rest as layernorm_backward_input_kernel */
    extern __shared__ float sums[]; /* [FUSED_WARPS][2][C]; W > 1: C a multiple of W */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *dw = sums + (size_t)warp * 2 * C, *db = dw + C;
    /* zeroed by the lanes that add into them (the rows' columns): no barrier */
    for (int c = lane * W; c < C; c += 32 * W)
        for (int k = 0; k < W; k++) dw[c + k] = db[c + k] = 0.0f;
    for (int n = blockIdx.x * FUSED_WARPS + warp; n < N; n += gridDim.x * FUSED_WARPS)
        layernorm_backward_row<W>(dinp, rounded, dw, db, dout, inp, weight, mean, rstd, n, C,
                                  lane);
    __syncthreads();
    float *block_dw = partials + (size_t)blockIdx.x * C, *block_db = block_dw + (size_t)gridDim.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float w = 0.0f, b = 0.0f;
        for (int k = 0; k < FUSED_WARPS; k++) {
            w += sums[(size_t)k * 2 * C + c];
            b += sums[(size_t)k * 2 * C + C + c];
        }
        block_dw[c] = w;
        block_db[c] = b;
    }
}

/* The one-pass backward; false (nothing done) where its sums do not fit in shared memory or
 * the arena has no room for the partials. */
static bool layernorm_backward_fused(float *dinp, __nv_bfloat16 *rounded, float *dweight,
                                     float *dbias, const float *dout, const float *inp,
                                     const float *weight, const float *mean, const float *rstd,
                                     int N, int C)
{
    if (fused_shared_bytes(C) > FUSED_SHARED_MAX) return false;
    const int blocks = (int)min((size_t)FUSED_BLOCKS, (size_t)pt_cuda_ceil_div(N, FUSED_WARPS));
    const size_t bytes = (size_t)2 * blocks * C * sizeof(float);
    if (!pt_cuda_scratch_fits(bytes)) return false; /* not an error here: the three kernels */
    const size_t mark = pt_cuda_scratch_mark();
    float *partials = (float *)pt_cuda_scratch(bytes, "layernorm backward partials");
    if (!partials) return false;
    const size_t shared = fused_shared_bytes(C);
    if (backward_in_vectors(dinp, rounded, dout, inp, weight, C))
        layernorm_backward_fused_kernel<BACKWARD_W><<<blocks, 32 * FUSED_WARPS, shared,
                                                      pt_cuda.compute>>>(
            dinp, rounded, partials, dout, inp, weight, mean, rstd, N, C);
    else
        layernorm_backward_fused_kernel<1><<<blocks, 32 * FUSED_WARPS, shared, pt_cuda.compute>>>(
            dinp, rounded, partials, dout, inp, weight, mean, rstd, N, C);
    PT_CUDA_LAUNCHED("layernorm_backward_fused_kernel");
    const unsigned columns = (unsigned)pt_cuda_ceil_div(C, PT_CUDA_THREADS);
    pt_column_finish_kernel<<<columns, PT_CUDA_THREADS, 0, pt_cuda.compute>>>(dweight, partials,
                                                                            blocks, C);
    pt_column_finish_kernel<<<columns, PT_CUDA_THREADS, 0, pt_cuda.compute>>>(
        dbias, partials + (size_t)blocks * C, blocks, C);
    PT_CUDA_LAUNCHED("pt_column_finish_kernel");
    pt_cuda_scratch_release(mark);
    return true;
}

/* value(n, c) = dout[n, c]·x̂[n, c], the summand of dweight */
struct normalized_gradient {
    const float *dout, *inp, *mean, *rstd;
    int C;
    __device__ float operator()(int n, int c) const
    {
        size_t i = (size_t)n * C + c;
        return dout[i] * (inp[i] - mean[n]) * rstd[n];
    }
};

static unsigned row_blocks(int N) { return (unsigned)pt_cuda_ceil_div(N, ROWS_PER_BLOCK); }

template <class Element, bool WITH_RESIDUAL, int W>
static void launch_forward_kernel(Element *out, float *mean, float *rstd, float *residual,
                                  const float *a, const float *b, const float *weight,
                                  const float *bias, int N, int C)
{
    layernorm_forward_kernel<Element, WITH_RESIDUAL, W><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0,
                                                          pt_cuda.compute>>>(
        out, mean, rstd, residual, a, b, weight, bias, N, C);
}

/* out = layernorm(a), or (b given) residual = a + b and out = layernorm(residual); 16 bytes of
 * out a load where the rows allow */
template <class Element>
static void launch_forward(Element *out, float *mean, float *rstd, float *residual, const float *a,
                           const float *b, const float *weight, const float *bias, int N, int C,
                           const char *name)
{
    constexpr int W = 16 / sizeof(Element);
    if (N <= 0) return;
    const bool vectors = C % W == 0 && pt_aligned16(out, residual, a, b, weight, bias);
    if (b && vectors)
        launch_forward_kernel<Element, true, W>(out, mean, rstd, residual, a, b, weight, bias, N,
                                                C);
    else if (b)
        launch_forward_kernel<Element, true, 1>(out, mean, rstd, residual, a, b, weight, bias, N,
                                                C);
    else if (vectors)
        launch_forward_kernel<Element, false, W>(out, mean, rstd, NULL, a, NULL, weight, bias, N,
                                                 C);
    else
        launch_forward_kernel<Element, false, 1>(out, mean, rstd, NULL, a, NULL, weight, bias, N,
                                                 C);
    PT_CUDA_LAUNCHED(name);
}

void pt_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C)
{
    launch_forward(out, mean, rstd, NULL, inp, NULL, weight, bias, N, C, "layernorm_forward_kernel");
}

void pt_cuda_layernorm_forward_bf16(pt_bf16 *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, int N, int C)
{
    launch_forward((__nv_bfloat16 *)out, mean, rstd, NULL, inp, NULL, weight, bias, N, C,
                   "layernorm_forward_kernel<bf16>");
}

void pt_cuda_residual_layernorm_forward(float *residual, float *out, float *mean, float *rstd,
                                        const float *a, const float *b, const float *weight,
                                        const float *bias, int N, int C)
{
    launch_forward(out, mean, rstd, residual, a, b, weight, bias, N, C,
                   "layernorm_forward_kernel<residual>");
}

void pt_cuda_residual_layernorm_forward_bf16(float *residual, pt_bf16 *out, float *mean,
                                             float *rstd, const float *a, const float *b,
                                             const float *weight, const float *bias, int N, int C)
{
    launch_forward((__nv_bfloat16 *)out, mean, rstd, residual, a, b, weight, bias, N, C,
                   "layernorm_forward_kernel<residual, bf16>");
}

/* The backward, and where rounded is not NULL dinp's new values rounded to bf16 there too */
static void backward(float *dinp, __nv_bfloat16 *rounded, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight, const float *mean,
                     const float *rstd, int N, int C)
{
    /* dinp[N,C], rounded[N,C], dweight[C], dbias[C], dout[N,C], inp[N,C], weight[C], mean[N],
     * rstd[N] */
    if (N <= 0) return;
    if (layernorm_backward_fused(dinp, rounded, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                 C))
        return;
    if (backward_in_vectors(dinp, rounded, dout, inp, weight, C))
        layernorm_backward_input_kernel<BACKWARD_W><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0,
                                                      pt_cuda.compute>>>(
            dinp, rounded, dout, inp, weight, mean, rstd, N, C);
    else
        layernorm_backward_input_kernel<1><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0,
                                             pt_cuda.compute>>>(dinp, rounded, dout, inp, weight,
                                                                mean, rstd, N, C);
    PT_CUDA_LAUNCHED("layernorm_backward_input_kernel");
    pt_column_sums_add(dweight, normalized_gradient{dout, inp, mean, rstd, C}, N, C);
    pt_column_sums_add(dbias, pt_rows_f32{dout, C}, N, C);
}

void pt_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C)
{
    backward(dinp, NULL, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void pt_cuda_layernorm_backward_bf16(float *dinp, pt_bf16 *dinp_rounded, float *dweight,
                                     float *dbias, const float *dout, const float *inp,
                                     const float *weight, const float *mean, const float *rstd,
                                     int N, int C)
{
    backward(dinp, (__nv_bfloat16 *)dinp_rounded, dweight, dbias, dout, inp, weight, mean, rstd, N,
             C);
}
