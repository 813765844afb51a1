/* Element-wise kernels: GELU, the residual add, scaling, and the bf16 casts.
 * One thread per element in a grid-stride loop.
 *
 * Naive reading (as kernels/cpu/elementwise.c):
 *   gelu:     y = ½x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715x³)
 *             dy/dx = ½(1 + tanh u) + ½x·(1 − tanh²u)·√(2/π)·(1 + 3·0.044715x²)
 *   residual: out = a + b;   scale: x ← factor·x
 *   casts:    bf16 = round-to-nearest-even(float), float = bf16 (exact)
 */
#include "kernels/cuda/common.cuh"

#define GELU_SCALE 0.7978845608028654f /* √(2/π) */
#define GELU_CUBIC 0.044715f

__device__ inline float gelu(float x)
{
    float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ inline float gelu_derivative(float x)
{
    float th = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
    float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = gelu(inp[i]);
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) dinp[i] += gelu_derivative(inp[i]) * dout[i];
}

/* runtime.precision = bf16: a bf16 input widened exactly, the GELU in fp32, a bf16 output
 * rounded to nearest even (kernels.h) */
__global__ void gelu_forward_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = __float2bfloat16_rn(gelu(__bfloat162float(inp[i])));
}

__global__ void gelu_backward_bf16_kernel(float *dinp, const __nv_bfloat16 *inp,
                                          const float *dout, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) dinp[i] += gelu_derivative(__bfloat162float(inp[i])) * dout[i];
}

/* the same written (not added) and rounded: 0 + g as gelu_backward_bf16 onto zeros gives */
__global__ void gelu_backward_to_bf16_kernel(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp,
                                             const float *dout, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n)
    {
        const float zero = 0.0f, g = gelu_derivative(__bfloat162float(inp[i])) * dout[i];
        dinp[i] = __float2bfloat16_rn(__fadd_rn(zero, g));
    }
}

__global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float *x, float factor, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) x[i] *= factor;
}

__global__ void gather_kernel(float *out, const float *src, const uint32_t *index, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = src[index[i]];
}

__global__ void scatter_kernel(float *dst, const uint32_t *index, const float *values, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) dst[index[i]] = values[i];
}

__global__ void cast_to_bf16_kernel(__nv_bfloat16 *out, const float *inp, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = __float2bfloat16_rn(inp[i]);
}

__global__ void cast_from_bf16_kernel(float *out, const __nv_bfloat16 *inp, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = __bfloat162float(inp[i]);
}

__global__ void add_bias_to_bf16_kernel(__nv_bfloat16 *out, const float *inp, const float *bias,
                                        int OC, size_t ld_out, size_t n)
{
    /* out[N, OC] (rows ld_out apart) = bf16(inp[N, OC] + bias[OC]); n = N·OC */
    PT_GRID_STRIDE_LOOP(i, n)
    {
        const size_t row = i / OC, o = i % OC;
        out[row * ld_out + o] = __float2bfloat16_rn(inp[i] + bias[o]);
    }
}

void pt_cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gelu_forward_kernel, n, out, inp, n);
}

void pt_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gelu_backward_kernel, n, dinp, inp, dout, n);
}

void pt_cuda_gelu_forward_bf16(pt_bf16 *out, const pt_bf16 *inp, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gelu_forward_bf16_kernel, n, (__nv_bfloat16 *)out,
                          (const __nv_bfloat16 *)inp, n);
}

void pt_cuda_gelu_backward_bf16(float *dinp, const pt_bf16 *inp, const float *dout, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gelu_backward_bf16_kernel, n, dinp, (const __nv_bfloat16 *)inp, dout, n);
}

void pt_cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(residual_forward_kernel, n, out, a, b, n);
}

void pt_cuda_scale(float *x, float factor, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(scale_kernel, n, x, factor, n);
}

void pt_cuda_gather(float *out, const float *src, const uint32_t *index, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gather_kernel, n, out, src, index, n);
}

void pt_cuda_scatter(float *dst, const uint32_t *index, const float *values, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(scatter_kernel, n, dst, index, values, n);
}

extern "C" void pt_cuda_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(cast_to_bf16_kernel, n, (__nv_bfloat16 *)out, inp, n);
}

void pt_cuda_gelu_backward_to_bf16(pt_bf16 *dinp, const pt_bf16 *inp, const float *dout, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gelu_backward_to_bf16_kernel, n, (__nv_bfloat16 *)dinp,
                          (const __nv_bfloat16 *)inp, dout, n);
}

void pt_cuda_add_bias_to_bf16(pt_bf16 *out, const float *inp, const float *bias, int N, int OC,
                              int ld_out)
{
    const size_t n = (size_t)N * OC;
    PT_LAUNCH_ELEMENTWISE(add_bias_to_bf16_kernel, n, (__nv_bfloat16 *)out, inp, bias, OC,
                          (size_t)ld_out, n);
}

extern "C" void pt_cuda_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(cast_from_bf16_kernel, n, out, (const __nv_bfloat16 *)inp, n);
}
