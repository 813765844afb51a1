/* bf16 as the tests' emulated device rounds and widens it (tests/cuda_host/include/cuda_bf16.h,
 * test_attention_mma.cpp): round to nearest even, a NaN stays a quiet NaN; the
 * widening is exact. C and C++. (test_cuda_bf16.c keeps a reference of its own, written
 * apart, to hold the devices' casts to.) */
#ifndef PT_TESTS_BF16_BITS_H
#define PT_TESTS_BF16_BITS_H

#include <stdint.h>
#include <string.h>

static inline float pt_bf16_bits_widen(uint16_t bits)
{
    const uint32_t wide = (uint32_t)bits << 16;
    float x;
    memcpy(&x, &wide, sizeof x);
    return x;
}

static inline uint16_t pt_bf16_bits_round(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#endif
