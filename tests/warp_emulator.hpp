/* Runs CUDA kernel bodies written against the primitives of
 * kernels/cuda/attention_mma.cuh on the host: every thread of a block is a
 * thread of the host, and the warp-wide operations are emulated from their
 * documented semantics, so that a body's indexing, masking, fragment layouts
 * and synchronisation are checked on a machine without a GPU.
 *
 *   pt_block_sync     a barrier of the block's threads (__syncthreads)
 *   pt_shfl_xor       each lane publishes its value, a warp barrier, each reads
 *                     lane ^ mask's, a second barrier before the slots are reused
 *   pt_mma_bf16       each lane publishes its A and B registers; after a warp
 *                     barrier each computes its own four D elements from the
 *                     whole 16×16 A and 16×8 B, reassembled by the register
 *                     layout of mma.m16n8k16 in the PTX ISA (the same table as
 *                     attention_mma.cuh's comment, written out independently
 *                     below as "who holds element (row, k)")
 *
 *   pt_ldmatrix_x4    each lane publishes the row address it gives; after a warp
 *   (and _trans)      barrier each assembles its four registers from the four 8×8
 *                     matrices those rows make, by ldmatrix's layout in the PTX ISA
 *                     ("Warp-level matrix load instruction: ldmatrix"): lanes 8i..8i+7
 *                     give rows 0–7 of matrix i, register i of lane l holds matrix
 *                     i's (row l/4, columns 2(l mod 4), +1), of its transpose with
 *                     .trans; each row address must be 16-byte aligned
 *
 *   pt_cp_async16/4   cp.async: the copy is queued, not made; pt_cp_async_commit
 *   pt_cp_async_wait  closes this thread's group of them; pt_cp_async_wait<N> makes
 *                     the copies of all but the N newest groups, as cp.async.wait_group
 *                     lets them land. A kernel that reads a tile before waiting for it
 *                     (or before the barrier after) reads what was there before: NaN
 *                     or the previous tile, and the comparisons fail.
 *
 * What it cannot check: the hardware's own rounding inside an mma (fp32 sums
 * here, in k order), bank conflicts, speed. A lane that skips a warp-wide
 * operation its fellows reach deadlocks the emulation (the test times out),
 * as such a kernel is undefined on a GPU. Shared memory starts as bf16 and
 * fp32 NaNs, so a read of a tile not yet written poisons the result.
 */
#ifndef PT_TESTS_WARP_EMULATOR_HPP
#define PT_TESTS_WARP_EMULATOR_HPP

#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "tests/bf16_bits.h"

namespace warp_emulator {

constexpr int lanes = 32;

struct warp {
    std::barrier<> step{lanes};
    float value[lanes];
    uint32_t a[lanes][4], b[lanes][2];
    const uint16_t *row[lanes]; /* ldmatrix's row addresses */
};

struct block {
    explicit block(int threads) : sync(threads), warps(threads / lanes) {}
    std::barrier<> sync;
    std::vector<warp> warps;
};

inline thread_local block *this_block;
inline thread_local int this_thread;

/* cp.async's copies of this thread: the group being formed, and those committed, oldest
 * first. A kernel's leftover copies are dropped when its thread ends (they were never
 * waited for, so never read). */
struct async_copy {
    void *dst;
    const void *src;
    size_t bytes;
};
inline thread_local std::vector<async_copy> forming;
inline thread_local std::deque<std::vector<async_copy>> committed;

inline warp &this_warp() { return this_block->warps[this_thread / lanes]; }
inline int this_lane() { return this_thread % lanes; }

inline float bf16_to_float(uint16_t bits) { return pt_bf16_bits_widen(bits); }

/* Round to nearest even; a NaN stays a NaN. */
inline uint16_t float_to_bf16(float x) { return pt_bf16_bits_round(x); }

inline float half_of(uint32_t pair, int high) { return bf16_to_float((uint16_t)(pair >> (16 * high))); }

/* A[row][k] of the warp's 16×16 A: row r < 8 is held by lanes 4r.., rows 8–15
 * in the odd registers; k < 8 in registers 0–1, k ≥ 8 in 2–3; lane 4·(r mod 8)
 * + (k mod 8)/2 holds the pair, k's parity picks the half. */
inline float a_element(const warp &w, int row, int k)
{
    const int holder = 4 * (row % 8) + (k % 8) / 2, reg = (row >= 8) + 2 * (k >= 8);
    return half_of(w.a[holder][reg], k & 1);
}

/* B[k][n] of the 16×8 B: column n is held by lanes 4n..4n+3, k < 8 in b0. */
inline float b_element(const warp &w, int k, int n)
{
    const int holder = 4 * n + (k % 8) / 2;
    return half_of(w.b[holder][k >= 8], k & 1);
}

} // namespace warp_emulator

#define PT_MMA_FN inline

inline void pt_block_sync() { warp_emulator::this_block->sync.arrive_and_wait(); }

inline float pt_shfl_xor(float v, int mask)
{
    warp_emulator::warp &w = warp_emulator::this_warp();
    const int lane = warp_emulator::this_lane();
    w.value[lane] = v;
    w.step.arrive_and_wait();
    const float other = w.value[lane ^ mask];
    w.step.arrive_and_wait();
    return other;
}

inline void pt_mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    using namespace warp_emulator;
    warp &w = this_warp();
    const int lane = this_lane();
    std::memcpy(w.a[lane], a, sizeof a);
    std::memcpy(w.b[lane], b, sizeof b);
    w.step.arrive_and_wait();
    for (int e = 0; e < 4; e++) { /* D[g + 8·(e ≥ 2)][2t + (e mod 2)] */
        const int row = lane / 4 + 8 * (e >= 2), col = 2 * (lane % 4) + (e & 1);
        float sum = d[e];
        for (int k = 0; k < 16; k++) sum += a_element(w, row, k) * b_element(w, k, col);
        d[e] = sum;
    }
    w.step.arrive_and_wait();
}

namespace warp_emulator {

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: matrix i's rows are the 16 bytes at the
 * addresses lanes 8i..8i+7 give; lane l's register i is the pair (row l/4, columns 2(l mod 4)
 * and 2(l mod 4) + 1) of matrix i, or of its transpose, the lower column in the low half. */
inline void ldmatrix_x4(uint32_t (&r)[4], const uint16_t *row, bool transposed)
{
    warp &w = this_warp();
    const int lane = this_lane();
    if ((uintptr_t)row % 16 != 0) {
        std::fprintf(stderr, "ldmatrix: lane %d's row address %p is not 16-byte aligned\n", lane,
                     (const void *)row);
        std::abort(); /* undefined on the GPU: the test fails here */
    }
    w.row[lane] = row;
    w.step.arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        uint32_t pair = 0;
        for (int half = 0; half < 2; half++) {
            const int r = lane / 4, c = 2 * (lane % 4) + half;
            /* element (r, c) of matrix i, or (c, r) of it when transposed */
            const uint16_t element = transposed ? w.row[8 * i + c][r] : w.row[8 * i + r][c];
            pair |= (uint32_t)element << (16 * half);
        }
        r[i] = pair;
    }
    w.step.arrive_and_wait();
}

} // namespace warp_emulator

inline void pt_cp_async16(void *dst, const void *src)
{
    warp_emulator::forming.push_back({dst, src, 16});
}
inline void pt_cp_async4(void *dst, const void *src)
{
    warp_emulator::forming.push_back({dst, src, 4});
}
inline void pt_cp_async_commit()
{
    warp_emulator::committed.push_back(std::move(warp_emulator::forming));
    warp_emulator::forming.clear();
}
template <int N> inline void pt_cp_async_wait()
{
    while (warp_emulator::committed.size() > (size_t)N) {
        for (const warp_emulator::async_copy &c : warp_emulator::committed.front())
            std::memcpy(c.dst, c.src, c.bytes);
        warp_emulator::committed.pop_front();
    }
}

inline void pt_ldmatrix_x4(uint32_t (&r)[4], const uint16_t *row)
{
    warp_emulator::ldmatrix_x4(r, row, false);
}
inline void pt_ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t *row)
{
    warp_emulator::ldmatrix_x4(r, row, true);
}

inline uint32_t pt_pack_bf16x2(float lo, float hi)
{
    return (uint32_t)warp_emulator::float_to_bf16(lo) |
           (uint32_t)warp_emulator::float_to_bf16(hi) << 16;
}

inline uint16_t pt_round_bf16(float x) { return warp_emulator::float_to_bf16(x); }

inline void pt_zero16(uint16_t *dst) { std::memset(dst, 0, 16); }

namespace warp_emulator {

/* body(block, thread, shared) for every thread of every block, a block at a time. */
template <class Body> void launch(int blocks, int threads, size_t shared_bytes, Body body)
{
    struct alignas(16) chunk { /* shared memory is 16-byte aligned (ldmatrix's rows need it) */
        uint32_t word[4];
    };
    std::vector<chunk> shared((shared_bytes + 15) / 16);
    for (int blk = 0; blk < blocks; blk++) {
        for (chunk &c : shared) /* NaN as bf16 pairs and as fp32 */
            for (uint32_t &word : c.word) word = 0x7fc07fc0u;
        block state(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; t++)
            pool.emplace_back([&, t] {
                this_block = &state;
                this_thread = t;
                body(blk, t, (unsigned char *)shared.data());
                forming.clear();
                committed.clear();
            });
        for (std::thread &thread : pool) thread.join();
    }
}

} // namespace warp_emulator

#endif
