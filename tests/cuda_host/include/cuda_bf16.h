/* The emulated device's bf16 (tests/cuda_host): the storage type and the
 * conversions kernels/cuda uses, rounding to nearest even as the device. */
#ifndef PT_TESTS_CUDA_HOST_BF16_H
#define PT_TESTS_CUDA_HOST_BF16_H

#include "cuda_host.hpp"
#include "tests/bf16_bits.h"

struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
};

struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 b) { return pt_bf16_bits_widen(b.__x); }

/* Round to nearest even; a NaN stays a (quiet) NaN. */
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {pt_bf16_bits_round(f)}; }

inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }

inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

inline float2 __bfloat1622float2(__nv_bfloat162 p)
{
    return {__bfloat162float(p.x), __bfloat162float(p.y)};
}

#endif
