/* The primitives of kernels/cuda/mma_primitives.cuh on the emulated device (tests/cuda_host):
 * this file takes that one's place when tests/cuda_host compiles attention_mma.cu (its include
 * directory comes first), so the tensor-core attention's own launches, grids and shared-memory
 * sizes run here; test_attention_mma runs the bodies alone, with finer checks of each.
 *
 *   pt_mma_bf16       the warp's A and B registers gathered by one warp exchange; each lane then
 *                     computes its four D elements from the whole 16×16 A and 16×8 B by the
 *                     register layout of mma.m16n8k16 in the PTX ISA (the table
 *                     attention_mma.cuh's comment gives, written out here as "who holds
 *                     element (row, k)"); fp32 sums in k order
 *   pt_ldmatrix_x4    the row addresses gathered; lane l's register i is matrix i's (row l/4,
 *   (and _trans)      columns 2(l mod 4), +1), of its transpose with .trans; a row address off
 *                     16 bytes is a fault, as on the device
 *   pt_cp_async*      copies queued per thread, made when pt_cp_async_wait<N> lets all but the
 *                     N newest committed groups land: a tile read before its wait holds what
 *                     was there (NaN at first: the device's shared memory starts so here)
 */
#ifndef PT_TESTS_CUDA_HOST_MMA_PRIMITIVES_CUH
#define PT_TESTS_CUDA_HOST_MMA_PRIMITIVES_CUH

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_host.hpp"

#define PT_MMA_FN inline

inline void pt_block_sync() { __syncthreads(); }

inline float pt_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

namespace cuda_host_mma {

/* The warp's A and B registers, every lane's, in one exchange. */
inline void gather(uint32_t (&all_a)[32][4], uint32_t (&all_b)[32][2], const uint32_t (&a)[4],
                   const uint32_t (&b)[2])
{
    uint64_t mine[3];
    std::memcpy(mine, a, sizeof a);
    std::memcpy(mine + 2, b, sizeof b);
    const cuda_host::lane_words *lanes = cuda_host::warp_exchange(0xffffffffu, mine, 3);
    for (int l = 0; l < 32; l++) {
        std::memcpy(all_a[l], lanes[l], sizeof all_a[l]);
        std::memcpy(all_b[l], lanes[l] + 2, sizeof all_b[l]);
    }
}

inline float half_of(uint32_t pair, int high)
{
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)(pair >> (16 * high))));
}

/* A[row][k] of the 16×16 A: row r < 8 is held by lanes 4r.., rows 8–15 in the odd registers;
 * k < 8 in registers 0–1, k ≥ 8 in 2–3; lane 4·(r mod 8) + (k mod 8)/2 holds the pair, k's
 * parity picks the half. */
inline float a_element(const uint32_t (&a)[32][4], int row, int k)
{
    return half_of(a[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k & 1);
}

/* B[k][n] of the 16×8 B: column n is held by lanes 4n..4n+3, k < 8 in b0. */
inline float b_element(const uint32_t (&b)[32][2], int k, int n)
{
    return half_of(b[4 * n + (k % 8) / 2][k >= 8], k & 1);
}

inline void ldmatrix_x4(uint32_t (&r)[4], const uint16_t *row, bool transposed)
{
    if ((uintptr_t)row % 16 != 0) cuda_host::fault("ldmatrix: a row address not 16-byte aligned");
    const cuda_host::lane_words *lanes =
        cuda_host::warp_exchange(0xffffffffu, (uint64_t)(uintptr_t)row);
    const int lane = (int)cuda_host::lane();
    for (int i = 0; i < 4; i++) {
        uint32_t pair = 0;
        for (int half = 0; half < 2; half++) {
            const int rr = lane / 4, c = 2 * (lane % 4) + half;
            /* element (rr, c) of matrix i, or (c, rr) of it transposed */
            const uint16_t *source =
                (const uint16_t *)(uintptr_t)lanes[8 * i + (transposed ? c : rr)][0];
            pair |= (uint32_t)source[transposed ? rr : c] << (16 * half);
        }
        r[i] = pair;
    }
}

struct async_copy {
    void *dst;
    const void *src;
    size_t bytes;
};

/* This thread's cp.async copies: the group being formed, and those committed, oldest first. */
struct async_copies {
    std::vector<async_copy> forming;
    std::deque<std::vector<async_copy>> committed;
};

inline async_copies &copies()
{
    std::shared_ptr<void> &state = cuda_host::thread_state();
    if (!state) state = std::make_shared<async_copies>();
    return *static_cast<async_copies *>(state.get());
}

inline void queue(void *dst, const void *src, size_t bytes)
{
    if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes)
        cuda_host::fault("cp.async: an address not aligned to the copy's size");
    copies().forming.push_back({dst, src, bytes});
}

} // namespace cuda_host_mma

inline void pt_mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    uint32_t all_a[32][4], all_b[32][2];
    cuda_host_mma::gather(all_a, all_b, a, b);
    const int lane = (int)cuda_host::lane();
    for (int e = 0; e < 4; e++) { /* D[g + 8·(e ≥ 2)][2t + (e mod 2)] */
        const int row = lane / 4 + 8 * (e >= 2), col = 2 * (lane % 4) + (e & 1);
        float sum = d[e];
        for (int k = 0; k < 16; k++)
            sum += cuda_host_mma::a_element(all_a, row, k) * cuda_host_mma::b_element(all_b, k, col);
        d[e] = sum;
    }
}

inline void pt_ldmatrix_x4(uint32_t (&r)[4], const uint16_t *row)
{
    cuda_host_mma::ldmatrix_x4(r, row, false);
}
inline void pt_ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t *row)
{
    cuda_host_mma::ldmatrix_x4(r, row, true);
}

inline void pt_cp_async16(void *dst, const void *src) { cuda_host_mma::queue(dst, src, 16); }
inline void pt_cp_async4(void *dst, const void *src) { cuda_host_mma::queue(dst, src, 4); }

inline void pt_cp_async_commit()
{
    cuda_host_mma::async_copies &c = cuda_host_mma::copies();
    c.committed.push_back(std::move(c.forming));
    c.forming.clear();
}

template <int N> inline void pt_cp_async_wait()
{
    cuda_host_mma::async_copies &c = cuda_host_mma::copies();
    while (c.committed.size() > (size_t)N) {
        for (const cuda_host_mma::async_copy &copy : c.committed.front())
            std::memcpy(copy.dst, copy.src, copy.bytes);
        c.committed.pop_front();
    }
}

inline uint32_t pt_pack_bf16x2(float lo, float hi)
{
    return (uint32_t)__float2bfloat16_rn(lo).__x | (uint32_t)__float2bfloat16_rn(hi).__x << 16;
}

inline uint16_t pt_round_bf16(float x) { return __float2bfloat16_rn(x).__x; }

inline void pt_zero16(uint16_t *dst) { std::memset(dst, 0, 16); }

#endif
