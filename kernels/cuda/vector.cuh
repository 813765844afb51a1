/* Private to kernels/cuda/: 16-byte loads and stores, the memory-bound kernels' way to move their
 * bytes (one 128-bit instruction where four or eight narrow ones would issue: fewer
 * instructions in flight for the same traffic, which is what keeps HBM busy).
 *
 * pt_elements<Element, N> is N elements side by side in memory. Where N·sizeof(Element) is a
 * multiple of 16 (4 or 8 fp32, 8 bf16) they must start on a 16-byte boundary, and pt_load and
 * pt_store move them as N·sizeof(Element)/16 uint4s; where it is 8 (4 bf16), on an 8-byte
 * boundary, as one uint2; otherwise (N = 1: a kernel's element-by-element form) element by
 * element. The bytes go between the vectors and the elements by memcpy, which compiles to
 * register moves and is defined, where reading a uint4 through an Element pointer is not:
 * type-based alias analysis may drop such reads (GCC at -O2 did, on the emulated device of
 * tests/cuda_host).
 *
 * A kernel takes the vector path only where every buffer it moves this way is 16-byte aligned
 * (pt_aligned16 on the host, before the launch) and takes the elements past the last whole
 * vector singly; elsewhere it keeps its element-by-element loop. */
#ifndef PT_KERNELS_CUDA_VECTOR_CUH
#define PT_KERNELS_CUDA_VECTOR_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

template <class Element, int N> struct pt_elements {
    Element e[N];
};

template <class Element, int N> constexpr bool pt_whole_vectors = N * sizeof(Element) % 16 == 0;
template <class Element, int N> constexpr bool pt_half_vector = N * sizeof(Element) == 8;

/* N elements from `at` */
template <int N, class Element>
__device__ inline pt_elements<Element, N> pt_load(const Element *at)
{
    pt_elements<Element, N> v;
    if constexpr (pt_whole_vectors<Element, N>) {
        const uint4 *src = reinterpret_cast<const uint4 *>(at);
#pragma unroll
        for (int k = 0; k < (int)(N * sizeof(Element) / 16); k++) {
            const uint4 raw = src[k];
            memcpy(reinterpret_cast<char *>(v.e) + 16 * k, &raw, sizeof raw);
        }
    } else if constexpr (pt_half_vector<Element, N>) {
        const uint2 raw = *reinterpret_cast<const uint2 *>(at);
        memcpy(v.e, &raw, sizeof raw);
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) v.e[k] = at[k];
    }
    return v;
}

template <int N, class Element>
__device__ inline void pt_store(Element *at, const pt_elements<Element, N> &v)
{
    if constexpr (pt_whole_vectors<Element, N>) {
        uint4 *dst = reinterpret_cast<uint4 *>(at);
#pragma unroll
        for (int k = 0; k < (int)(N * sizeof(Element) / 16); k++) {
            uint4 raw;
            memcpy(&raw, reinterpret_cast<const char *>(v.e) + 16 * k, sizeof raw);
            dst[k] = raw;
        }
    } else if constexpr (pt_half_vector<Element, N>) {
        uint2 raw;
        memcpy(&raw, v.e, sizeof raw);
        *reinterpret_cast<uint2 *>(at) = raw;
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) at[k] = v.e[k];
    }
}

/* Whether every pointer given (NULL counts as aligned: a buffer the call does not use) is on a
 * 16-byte boundary. */
inline bool pt_aligned16() { return true; }
template <class P, class... Rest> inline bool pt_aligned16(const P *p, const Rest *...rest)
{
    return (uintptr_t)p % 16 == 0 && pt_aligned16(rest...);
}

#endif
