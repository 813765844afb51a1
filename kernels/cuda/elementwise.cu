/* Element-wise kernels: GELU, the residual add, scaling, and the bf16 casts.
 *
 * Naive reading (as kernels/cpu/elementwise.c):
 *   gelu:     y = ½x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715x³)
 *             dy/dx = ½(1 + tanh u) + ½x·(1 − tanh²u)·√(2/π)·(1 + 3·0.044715x²)
 *   residual: out = a + b;   scale: x ← factor·x
 *   casts:    bf16 = round-to-nearest-even(float), float = bf16 (exact)
 *
 * Each is out[i] = f(a[i], b[i]), or out[i] += f(a[i], b[i]) (map_kernel), in a grid-stride
 * loop. Where every buffer is 16-byte aligned a thread takes 16 bytes of the narrowest one at a
 * time (vector.cuh: 4 fp32 or 8 bf16 elements, the wider buffers in two loads) and the last
 * n mod that singly; elsewhere one element at a time. The same arithmetic either way. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vector.cuh"

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

/* An element as the fp32 the arithmetic uses, and an fp32 result stored as its element type
 * (bf16: rounded to nearest even). */
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class Element> __device__ inline Element narrow(float x);
template <> __device__ inline float narrow<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* What map_kernel computes per element; the second operand is 0 where a map has one input. */
struct gelu_op {
    __device__ float operator()(float x, float) const { return gelu(x); }
};
struct gelu_gradient_op { /* gelu'(inp)·dout */
    __device__ float operator()(float inp, float dout) const { return gelu_derivative(inp) * dout; }
};
/* the same, written rather than added: 0 + g, as gelu_backward_bf16 onto zeros gives (−0 → +0) */
struct gelu_gradient_onto_zero_op {
    __device__ float operator()(float inp, float dout) const
    {
        const float zero = 0.0f;
        return __fadd_rn(zero, gelu_derivative(inp) * dout);
    }
};
struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct scale_op {
    float factor;
    __device__ float operator()(float x, float) const { return x * factor; }
};
struct copy_op {
    __device__ float operator()(float x, float) const { return x; }
};

/* Elements of a 16-byte vector of the narrowest of the three types. */
template <class O, class A, class B> constexpr int map_width()
{
    size_t narrowest = sizeof(O) < sizeof(A) ? sizeof(O) : sizeof(A);
    if (sizeof(B) < narrowest) narrowest = sizeof(B);
    return (int)(16 / narrowest);
}

/* out[i] (ADD: +)= f(a[i], b[i]) for i < n, b[i] read as 0 where b is NULL; W elements a step
 * for i below n − n mod W, then singly (W = 1: all singly). */
template <int W, bool ADD, class O, class A, class B, class F>
__device__ inline void map_step(O *out, const A *a, const B *b, size_t i, F f)
{
    const pt_elements<A, W> x = pt_load<W>(a + i);
    pt_elements<B, W> y = {};
    if (b) y = pt_load<W>(b + i);
    pt_elements<O, W> r = {};
    if (ADD) r = pt_load<W>(out + i);
#pragma unroll
    for (int k = 0; k < W; k++) {
        const float value = f(widen(x.e[k]), b ? widen(y.e[k]) : 0.0f);
        r.e[k] = narrow<O>(ADD ? widen(r.e[k]) + value : value);
    }
    pt_store<W>(out + i, r);
}

template <int W, bool ADD, class O, class A, class B, class F>
__global__ void map_kernel(O *out, const A *a, const B *b, size_t n, F f)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, body = n / W * W;
    for (size_t i = first * W; i < body; i += stride * W) map_step<W, ADD>(out, a, b, i, f);
    for (size_t i = body + first; i < n; i += stride) map_step<1, ADD>(out, a, b, i, f);
}

template <bool ADD, class O, class A, class B, class F>
static void map(O *out, const A *a, const B *b, size_t n, F f, const char *name)
{
    constexpr int W = map_width<O, A, B>();
    if (n == 0) return;
    if (pt_aligned16(out, a, b))
        map_kernel<W, ADD, O, A, B, F><<<pt_cuda_blocks_for((n + W - 1) / W), PT_CUDA_THREADS, 0,
                                         pt_cuda.compute>>>(out, a, b, n, f);
    else
        map_kernel<1, ADD, O, A, B, F><<<pt_cuda_blocks_for(n), PT_CUDA_THREADS, 0,
                                         pt_cuda.compute>>>(out, a, b, n, f);
    PT_CUDA_LAUNCHED(name);
}

/* Either a one-input map (b NULL, typed as a) or a two-input one. */
template <class O, class A, class F>
static void map1(O *out, const A *a, size_t n, F f, const char *name)
{
    map<false>(out, a, (const A *)NULL, n, f, name);
}

__global__ void gather_kernel(float *out, const float *src, const uint32_t *index, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) out[i] = src[index[i]];
}

__global__ void scatter_kernel(float *dst, const uint32_t *index, const float *values, size_t n)
{
    PT_GRID_STRIDE_LOOP(i, n) dst[index[i]] = values[i];
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

typedef __nv_bfloat16 bf16;

void pt_cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    map1(out, inp, n, gelu_op{}, "map_kernel<gelu>");
}

void pt_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    map<true>(dinp, inp, dout, n, gelu_gradient_op{}, "map_kernel<gelu gradient>");
}

void pt_cuda_gelu_forward_bf16(pt_bf16 *out, const pt_bf16 *inp, size_t n)
{
    map1((bf16 *)out, (const bf16 *)inp, n, gelu_op{}, "map_kernel<gelu, bf16>");
}

void pt_cuda_gelu_backward_bf16(float *dinp, const pt_bf16 *inp, const float *dout, size_t n)
{
    map<true>(dinp, (const bf16 *)inp, dout, n, gelu_gradient_op{},
              "map_kernel<gelu gradient, bf16>");
}

void pt_cuda_gelu_backward_to_bf16(pt_bf16 *dinp, const pt_bf16 *inp, const float *dout, size_t n)
{
    map<false>((bf16 *)dinp, (const bf16 *)inp, dout, n, gelu_gradient_onto_zero_op{},
               "map_kernel<gelu gradient to bf16>");
}

void pt_cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    map<false>(out, a, b, n, add_op{}, "map_kernel<residual>");
}

void pt_cuda_scale(float *x, float factor, size_t n)
{
    map1(x, (const float *)x, n, scale_op{factor}, "map_kernel<scale>");
}

extern "C" void pt_cuda_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n)
{
    map1((bf16 *)out, inp, n, copy_op{}, "map_kernel<to bf16>");
}

extern "C" void pt_cuda_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n)
{
    map1(out, (const bf16 *)inp, n, copy_op{}, "map_kernel<from bf16>");
}

void pt_cuda_gather(float *out, const float *src, const uint32_t *index, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(gather_kernel, n, out, src, index, n);
}

void pt_cuda_scatter(float *dst, const uint32_t *index, const float *values, size_t n)
{
    PT_LAUNCH_ELEMENTWISE(scatter_kernel, n, dst, index, values, n);
}

void pt_cuda_add_bias_to_bf16(pt_bf16 *out, const float *inp, const float *bias, int N, int OC,
                              int ld_out)
{
    const size_t n = (size_t)N * OC;
    PT_LAUNCH_ELEMENTWISE(add_bias_to_bf16_kernel, n, (__nv_bfloat16 *)out, inp, bias, OC,
                          (size_t)ld_out, n);
}
