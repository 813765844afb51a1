/* Causal attention on tensor cores for a bf16 qkv (runtime.precision = bf16):
 * the launches of attention_mma.cuh's bodies, whose comment says what they
 * compute and how. attention.cu calls these for head sizes 32, 64 and 128 unless
 * PIPERT_CUDA_MMA_ATTENTION=0 (pt_cuda_set_mma_attention), and keeps the rest:
 * the shape checks, D = rowsum(dO ⊙ O), the CUDA-core kernels for every other
 * case, and the layout of the saved state (the same here).
 */
#include <stdio.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/attention_mma.cuh"

/* ---- kernels ------------------------------------------------------------------------- */

/* Output: float, or uint16_t (a bf16 out written rounded) */
template <int HS, class Output>
__global__ void __launch_bounds__(PT_MMA_THREADS)
    mma_forward_kernel(Output *out, float *lse, float *o_saved, const uint16_t *qkv, pt_mma_shape s)
{
    extern __shared__ __align__(16) unsigned char shared[];
    pt_mma_attention_forward<HS>(out, lse, o_saved, qkv, s, (int)blockIdx.x, (int)threadIdx.x,
                                 shared);
}

#define DELTA_WARPS 8

template <int HS>
__global__ void __launch_bounds__(32 * DELTA_WARPS)
    mma_delta_kernel(float *delta, uint16_t *dout16, const float *dout, const float *o_saved,
                     pt_mma_shape s)
{
    const int row = (int)blockIdx.x * DELTA_WARPS + (int)threadIdx.x / 32;
    if (row >= s.B * s.T * s.NH) return; /* the whole warp */
    pt_mma_delta_row<HS>(delta, dout16, dout, o_saved, s, row, (int)threadIdx.x % 32);
}

/* Gradient: float (dqkv added into) or uint16_t (a bf16 dqkv written) */
template <int HS, class Gradient>
__global__ void __launch_bounds__(PT_MMA_THREADS)
    mma_dq_kernel(Gradient *dqkv, const uint16_t *dout, const uint16_t *qkv, const float *lse,
                  const float *delta, pt_mma_shape s)
{
    extern __shared__ __align__(16) unsigned char shared[];
    pt_mma_attention_dq<HS>(dqkv, dout, qkv, lse, delta, s, (int)blockIdx.x, (int)threadIdx.x,
                            shared);
}

template <int HS, class Gradient>
__global__ void __launch_bounds__(PT_MMA_THREADS)
    mma_dkdv_kernel(Gradient *dqkv, const uint16_t *dout, const uint16_t *qkv, const float *lse,
                    const float *delta, pt_mma_shape s)
{
    extern __shared__ __align__(16) unsigned char shared[];
    pt_mma_attention_dkdv<HS>(dqkv, dout, qkv, lse, delta, s, (int)blockIdx.x, (int)threadIdx.x,
                              shared);
}

/* ---- set-up ----------------------------------------------------------------------------- */

template <class Kernel>
static pipert_result allow_shared(Kernel kernel, size_t bytes, const char *name, int hs)
{
    if (bytes > pt_cuda.prop.sharedMemPerBlockOptin)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "CUDA attention: %s for head size %d needs %zu bytes of shared memory per "
                       "block; %s has %zu",
                       name, hs, bytes, pt_cuda.prop.name,
                       (size_t)pt_cuda.prop.sharedMemPerBlockOptin);
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_INTERNAL, "CUDA attention: cudaFuncSetAttribute (%s): %s", name,
                       cudaGetErrorString(err));
    return PIPERT_OK;
}

template <int HS, class Gradient> static pipert_result allow_backward_shared(void)
{
    PT_TRY(allow_shared(mma_dq_kernel<HS, Gradient>, pt_mma_dq_shared_bytes<HS>(), "dq", HS));
    return allow_shared(mma_dkdv_kernel<HS, Gradient>, pt_mma_dkdv_shared_bytes<HS>(), "dkdv", HS);
}

template <int HS> static pipert_result allow_shared_for(void)
{
    PT_TRY(allow_shared(mma_forward_kernel<HS, float>, pt_mma_forward_shared_bytes<HS>(),
                        "the forward", HS));
    PT_TRY(allow_shared(mma_forward_kernel<HS, uint16_t>, pt_mma_forward_shared_bytes<HS>(),
                        "the forward", HS));
    PT_TRY((allow_backward_shared<HS, float>()));
    return allow_backward_shared<HS, uint16_t>();
}

pipert_result pt_cuda_attention_mma_setup(void)
{
    PT_TRY(allow_shared_for<32>());
    PT_TRY(allow_shared_for<64>());
    return allow_shared_for<128>();
}

/* ---- dispatch ---------------------------------------------------------------------------- */

/* Whether these kernels take the shape: head size 32, 64 or 128, and 16-byte
 * rows of qkv (three rows of C bf16 values) at a 16-byte aligned qkv. */
bool pt_cuda_attention_mma_takes(const void *qkv, int C, int NH)
{
    const int hs = C / NH;
    return pt_cuda.mma_attention && hs * NH == C && (hs == 32 || hs == 64 || hs == 128) &&
           (uintptr_t)qkv % 16 == 0;
}

static pt_mma_shape mma_shape(int B, int T, int C, int NH)
{
    const float hs = (float)(C / NH);
    return pt_mma_shape{B, T, C, NH, 1.0f / sqrtf(hs), 1.4426950408889634f / sqrtf(hs)};
}

static unsigned mma_blocks(int B, int T, int NH)
{
    return (unsigned)((size_t)B * NH * pt_cuda_ceil_div(T, PT_MMA_ROWS));
}

template <int HS, class Output>
static void forward_launch(Output *out, float *lse, float *o_saved, const uint16_t *qkv,
                           pt_mma_shape s)
{
    mma_forward_kernel<HS, Output><<<mma_blocks(s.B, s.T, s.NH), PT_MMA_THREADS,
                             pt_mma_forward_shared_bytes<HS>(), pt_cuda.compute>>>(out, lse, o_saved,
                                                                                   qkv, s);
    PT_CUDA_LAUNCHED("mma_forward_kernel");
}

/* D and the bf16 dO (pt_mma_delta_row), then the two kernels. */
template <int HS, class Gradient>
static void backward_launch(Gradient *dqkv, const float *dout, const uint16_t *qkv, const float *lse,
                            const float *o_saved, float *delta, uint16_t *dout16, pt_mma_shape s)
{
    const size_t rows = (size_t)s.B * s.T * s.NH;
    mma_delta_kernel<HS><<<(unsigned)pt_cuda_ceil_div(rows, DELTA_WARPS), 32 * DELTA_WARPS, 0,
                           pt_cuda.compute>>>(delta, dout16, dout, o_saved, s);
    PT_CUDA_LAUNCHED("mma_delta_kernel");
    const unsigned blocks = mma_blocks(s.B, s.T, s.NH);
    mma_dq_kernel<HS, Gradient><<<blocks, PT_MMA_THREADS, pt_mma_dq_shared_bytes<HS>(), pt_cuda.compute>>>(
        dqkv, dout16, qkv, lse, delta, s);
    PT_CUDA_LAUNCHED("mma_dq_kernel");
    mma_dkdv_kernel<HS, Gradient><<<blocks, PT_MMA_THREADS, pt_mma_dkdv_shared_bytes<HS>(), pt_cuda.compute>>>(
        dqkv, dout16, qkv, lse, delta, s);
    PT_CUDA_LAUNCHED("mma_dkdv_kernel");
}

template <class Output>
static void forward(Output *out, float *lse, float *o_saved, const __nv_bfloat16 *qkv, int B,
                    int T, int C, int NH)
{
    const pt_mma_shape s = mma_shape(B, T, C, NH);
    const uint16_t *bits = reinterpret_cast<const uint16_t *>(qkv);
    switch (C / NH) {
    case 32: forward_launch<32>(out, lse, o_saved, bits, s); break;
    case 64: forward_launch<64>(out, lse, o_saved, bits, s); break;
    default: forward_launch<128>(out, lse, o_saved, bits, s); break;
    }
}

void pt_cuda_attention_mma_forward(float *out, float *lse, float *o_saved,
                                   const __nv_bfloat16 *qkv, int B, int T, int C, int NH)
{
    forward(out, lse, o_saved, qkv, B, T, C, NH);
}

void pt_cuda_attention_mma_forward_to_bf16(pt_bf16 *out, float *lse, float *o_saved,
                                           const __nv_bfloat16 *qkv, int B, int T, int C, int NH)
{
    forward(reinterpret_cast<uint16_t *>(out), lse, o_saved, qkv, B, T, C, NH);
}

template <class Gradient>
static void backward(Gradient *dqkv, const float *dout, const __nv_bfloat16 *qkv, const float *lse,
                     const float *o_saved, int B, int T, int C, int NH)
{
    const pt_mma_shape s = mma_shape(B, T, C, NH);
    const uint16_t *bits = reinterpret_cast<const uint16_t *>(qkv);
    /* D, and dO rounded once so that its tiles come by cp.async as Q's (dkdv reads each ~T/128
     * times) */
    const size_t mark = pt_cuda_scratch_mark();
    float *delta = (float *)pt_cuda_scratch((size_t)B * NH * T * sizeof(float), "attention delta");
    uint16_t *dout16 =
        (uint16_t *)pt_cuda_scratch((size_t)B * T * C * sizeof(uint16_t), "attention dO in bf16");
    if (delta && dout16) switch (C / NH) {
        case 32: backward_launch<32>(dqkv, dout, bits, lse, o_saved, delta, dout16, s); break;
        case 64: backward_launch<64>(dqkv, dout, bits, lse, o_saved, delta, dout16, s); break;
        default: backward_launch<128>(dqkv, dout, bits, lse, o_saved, delta, dout16, s); break;
        }
    pt_cuda_scratch_release(mark); /* a failure is recorded */
}

void pt_cuda_attention_mma_backward(float *dqkv, const float *dout, const __nv_bfloat16 *qkv,
                                    const float *lse, const float *o_saved, int B, int T, int C,
                                    int NH)
{
    backward(dqkv, dout, qkv, lse, o_saved, B, T, C, NH);
}

void pt_cuda_attention_mma_backward_to_bf16(pt_bf16 *dqkv, const float *dout,
                                            const __nv_bfloat16 *qkv, const float *lse,
                                            const float *o_saved, int B, int T, int C, int NH)
{
    backward(reinterpret_cast<uint16_t *>(dqkv), dout, qkv, lse, o_saved, B, T, C, NH);
}
