/* A CUDA device on the host, for tests: kernels/cuda's own sources (rewritten
 * by tests/cuda_host/translate.py only where C++ cannot say what CUDA does: the
 * <<<>>> launches and dynamic shared memory) compiled by the host compiler and
 * run here, so that CI checks their indexing, bounds, reductions, barriers and
 * warp-wide operations against the CPU backend on a machine without a GPU.
 *
 * How a launch runs (tests/cuda_host/device.cpp): one block at a time, each of
 * its threads a fiber with a stack of its own, scheduled in turn on the calling
 * thread, switched only where CUDA threads meet:
 *   __syncthreads()     waits until every thread of the block that has not exited
 *                       arrived (an exited thread no longer counts, as on sm_70+)
 *   __shfl_*_sync,      each lane named in the mask deposits its value; when all
 *   __ballot_sync, …    of them have, each reads the lane it asked for. A mask that
 *                       names a lane that has exited, or a lane asking a lane outside
 *                       the mask, is undefined on a GPU: recorded as an error
 * and otherwise runs a thread until it waits, in thread order (from the last
 * with PIPERT_EMULATED_ORDER=reverse): the same results every run. A block where
 * no thread can go on (threads of one warp at different barriers, __syncthreads in
 * code some threads skip) is a deadlock: recorded as an error
 * (cuda_host::error_message), the launch abandoned. So is a
 * launch the device would refuse: no threads, more than 1,024 a block, grid or
 * block dimensions over the limits, more dynamic shared memory than 48 KiB or
 * than cudaFuncSetAttribute raised that kernel's limit to (at most 227 KiB, an
 * H100's). Dynamic shared memory starts as NaNs (fp32 and bf16 alike), so a read
 * before a write poisons the result.
 *
 * What it cannot check: speed, bank conflicts, races between threads (a thread
 * runs until it waits, so a missing barrier shows only where it reorders a read
 * and a write), the device's own rounding (no fused multiply-adds here unless the
 * host compiler makes them), memory the kernels should not touch beyond what
 * AddressSanitizer sees (run under the sanitizer build: global memory is host
 * memory, so it does see an out-of-bounds read).
 */
#ifndef PT_TESTS_CUDA_HOST_HPP
#define PT_TESTS_CUDA_HOST_HPP

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* The running thread's coordinates: set by the scheduler before it resumes a thread. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace cuda_host {

/* Runs body (the kernel called with its arguments) on every thread of every block of the
 * grid, and returns when all have finished; a launch the device would refuse runs nothing.
 * Either records an error (take_error). kernel: the launch's key for its shared-memory limit
 * (nullptr: the default limit). */
void launch(const void *kernel, const std::function<void()> &body, dim3 grid, dim3 block,
            size_t dynamic_shared_bytes = 0, const void *stream = nullptr);

/* The running block's dynamic shared memory (extern __shared__). */
void *dynamic_shared();

/* cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) */
bool set_max_dynamic_shared(const void *kernel, int bytes);

/* The first error since the last take_error (0: none; a cudaError_t's value) and its
 * message; take_error clears it, as cudaGetLastError. sticky_error is the first ever (a
 * deadlock or a bad warp operation), kept as a failed kernel poisons a CUDA context. */
int take_error();
int peek_error();
int sticky_error();
const char *error_message();

/* Launches so far: the tests check that the emulated path ran at all. */
long launches();

/* State the running thread keeps for the rest of its block (a primitive's own, as cp.async's
 * groups of copies): empty when the thread starts, released when its block ends. */
std::shared_ptr<void> &thread_state();

/* Records a fault a kernel made (as the device would report an illegal instruction or a
 * misaligned address): the launch goes on, the error stays (sticky_error). */
void fault(const char *what);

/* __syncthreads */
void block_barrier();

/* Each lane of `mask` gives `words` (at most EXCHANGE_WORDS) 64-bit words, `mine`; when all
 * have, returns the warp's, [lane][word] (lanes outside the mask: unspecified), valid until
 * this lane's next warp operation. One exchange a register set: each is a round of switches. */
constexpr int EXCHANGE_WORDS = 4;
using lane_words = uint64_t[EXCHANGE_WORDS];
const lane_words *warp_exchange(unsigned mask, const uint64_t *mine, int words);
inline const lane_words *warp_exchange(unsigned mask, uint64_t mine)
{
    return warp_exchange(mask, &mine, 1);
}

/* The running thread's lane (its linear index in the block, mod 32). */
unsigned lane();

/* Records a warp operation's misuse (a source lane outside the mask). */
void warp_misuse(const char *what, unsigned mask, int source);

template <class T> uint64_t bits_of(T v)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a register's value");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}

template <class T> T value_of(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

/* The value lane `source` gave, or this lane's own when the source lies outside its
 * segment (shfl_up/down keep their own value there). */
template <class T> T shuffle(unsigned mask, T v, int source)
{
    const lane_words *all = warp_exchange(mask, bits_of(v));
    if (source < 0 || source >= 32 || !(mask >> source & 1u)) {
        warp_misuse("a shuffle from a lane outside its mask", mask, source);
        return v;
    }
    return value_of<T>(all[source][0]);
}

} // namespace cuda_host

/* ---- CUDA's built-in functions -------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __shared__ static /* one block runs at a time: the block's threads share it */
#define __constant__
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

inline void __syncthreads() { cuda_host::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_host::warp_exchange(mask, 0); }

template <class T> T __shfl_sync(unsigned mask, T v, int source, int width = 32)
{
    const int lane = (int)cuda_host::lane();
    return cuda_host::shuffle(mask, v, (lane & ~(width - 1)) + (source & (width - 1)));
}

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    const int lane = (int)cuda_host::lane();
    return cuda_host::shuffle(mask, v, (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1)));
}

template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = (int)cuda_host::lane(), segment_end = (lane & ~(width - 1)) + width;
    const int source = lane + (int)delta;
    return cuda_host::shuffle(mask, v, source < segment_end ? source : lane);
}

template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = (int)cuda_host::lane(), segment_start = lane & ~(width - 1);
    const int source = lane - (int)delta;
    return cuda_host::shuffle(mask, v, source >= segment_start ? source : lane);
}

inline unsigned __ballot_sync(unsigned mask, int predicate)
{
    const cuda_host::lane_words *all = cuda_host::warp_exchange(mask, predicate != 0);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1u) ballot |= (all[l][0] ? 1u : 0u) << l;
    return ballot;
}

inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate)
{
    return __ballot_sync(mask, predicate) == mask;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }

template <class T> T __ldg(const T *p) { return *p; }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

/* CUDA's min and max of any two arithmetic types, on the host and the device */
template <class A, class B> std::common_type_t<A, B> min(A a, B b)
{
    return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <class A, class B> std::common_type_t<A, B> max(A a, B b)
{
    return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}

/* the vector types the kernels load 8 and 16 bytes at a time with */
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(8) float2 { float x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

#endif
