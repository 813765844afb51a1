/* The primitives attention_mma.cuh's bodies ask for, on the device: barriers and shuffles,
 * the warp's m16n8k16 product on tensor cores, ldmatrix, cp.async and bf16 packing, in inline
 * PTX. attention_mma.cu includes this before attention_mma.cuh;
 * tests/cuda_host/include/kernels/cuda/mma_primitives.cuh gives the same primitives on the
 * emulated device, from the PTX ISA's descriptions. Private to kernels/cuda/. */
#ifndef PT_KERNELS_CUDA_MMA_PRIMITIVES_CUH
#define PT_KERNELS_CUDA_MMA_PRIMITIVES_CUH

#include <string.h>

#include "kernels/cuda/common.cuh"

#define PT_MMA_FN __device__ __forceinline__

__device__ __forceinline__ void pt_block_sync() { __syncthreads(); }

__device__ __forceinline__ float pt_shfl_xor(float v, int mask)
{
    return __shfl_xor_sync(0xffffffffu, v, mask);
}

/* d += A·B: one warp's m16n8k16 product, bf16 operands, fp32 sums. */
__device__ __forceinline__ void pt_mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pt_pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi); /* .x = lo: the low half */
    uint32_t bits; /* by memcpy: reading pair through a uint32_t pointer breaks aliasing rules */
    memcpy(&bits, &pair, sizeof bits);
    return bits;
}

__device__ __forceinline__ uint16_t pt_round_bf16(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ void pt_ldmatrix_x4(uint32_t (&r)[4], const uint16_t *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}

__device__ __forceinline__ void pt_ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}

/* cp.async: global to shared memory without a trip through registers; .cg (16 bytes) keeps the
 * line out of L1, where a tile is read once. */
__device__ __forceinline__ void pt_cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src));
}

__device__ __forceinline__ void pt_cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src));
}

__device__ __forceinline__ void pt_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void pt_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void pt_zero16(uint16_t *dst)
{
    *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
}

#endif
