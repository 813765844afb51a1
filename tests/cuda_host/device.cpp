/* The emulated device's scheduler: a block's threads as fibers (Boost.Context)
 * on the calling thread, switched at barriers and warp operations. What it runs
 * and checks: include/cuda_host.hpp.
 *
 * Why Boost.Context and not ucontext: swapcontext saves and restores the signal
 * mask, a system call on every switch, and a warp operation is a round of 32
 * switches; the tensor-core attention's tests spent two thirds of their time in
 * that system call. Boost.Context's fibers switch registers and stack only. */
#include "cuda_host.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <boost/context/fiber.hpp>

#if defined(__SANITIZE_ADDRESS__)
#define PT_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PT_FIBER_ASAN 1
#endif
#endif
#ifdef PT_FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace cuda_host {
namespace {

constexpr int WARP = 32;
constexpr size_t DEFAULT_SHARED = 48 * 1024, OPTIN_SHARED = 227 * 1024;
constexpr size_t STACK_BYTES = 256 * 1024; /* a fiber's: kernels keep small frames */
enum cuda_error { SUCCESS = 0, INVALID_VALUE = 1, INVALID_CONFIGURATION = 9, LAUNCH_FAILURE = 719 };

enum class state { runnable, at_block_barrier, at_warp_operation, exited };

using context = boost::context::fiber;

struct fiber {
    context resume_point; /* where the fiber goes on from; empty once it has exited */
    char *stack;
    uint3 index;
    unsigned linear;
    state where = state::runnable;
    unsigned long long generation = 0; /* of the barrier it waits at */
    std::shared_ptr<void> kept;        /* thread_state() */
};

struct warp_state {
    int lanes = 0, live = 0, arrived = 0;
    unsigned arrived_mask = 0, mask = 0;
    unsigned long long generation = 0;
    lane_words value[2][WARP]; /* by generation parity: a lane ahead cannot overwrite */
};

struct block_state {
    int live = 0, arrived = 0;
    unsigned long long generation = 0;
    std::vector<fiber> fibers;
    std::vector<warp_state> warps;
    unsigned char *shared = nullptr;
    const std::function<void()> *body = nullptr;
    int running = -1;
    context scheduler; /* where the running fiber's yield returns to */
    bool abandoned = false;
};

block_state *current = nullptr;
/* Fiber stacks, kept from launch to launch (a thread of the largest block each), freed at exit */
struct stack_pool {
    std::vector<char *> stacks;
    ~stack_pool()
    {
        for (char *s : stacks) std::free(s);
    }
} pool;
std::map<const void *, size_t> shared_limits;
int last_error = SUCCESS, first_sticky = SUCCESS;
std::string message;
long launch_count = 0;

void record(int code, bool sticky, const char *format, ...) __attribute__((format(printf, 3, 4)));
void record(int code, bool sticky, const char *format, ...)
{
    char text[512];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    if (last_error == SUCCESS) last_error = code;
    if (sticky && first_sticky == SUCCESS) first_sticky = code;
    if (message.empty()) message = text;
    std::fprintf(stderr, "emulated CUDA device: %s\n", text);
}

fiber &running() { return current->fibers[current->running]; }

/* ---- switching, with AddressSanitizer told which stack is live -------------------------- */

#ifdef PT_FIBER_ASAN
void *scheduler_fake_stack;
const void *scheduler_stack_bottom;
size_t scheduler_stack_size;
#endif

void switch_to_fiber(fiber &f)
{
#ifdef PT_FIBER_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack, f.stack, STACK_BYTES);
#endif
    f.resume_point = std::move(f.resume_point).resume();
#ifdef PT_FIBER_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
}

/* From the running fiber back to the scheduler; returns when the fiber is resumed. */
void yield_to_scheduler()
{
#ifdef PT_FIBER_ASAN
    void *fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, scheduler_stack_bottom, scheduler_stack_size);
#endif
    current->scheduler = std::move(current->scheduler).resume();
#ifdef PT_FIBER_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
}

/* Every live lane of w has arrived at its warp operation (the last by arriving, or by the
 * exit of the last that had not): they go on. Lanes the operation's mask names must all have
 * arrived; a mask naming a lane that exited or does not exist is undefined on a GPU. */
void release_warp(warp_state &w)
{
    const unsigned existing = w.lanes == WARP ? 0xffffffffu : (1u << w.lanes) - 1u;
    if ((w.mask & existing) != w.arrived_mask || (w.mask & ~existing))
        warp_misuse("a warp operation whose mask names lanes that exited or do not exist",
                    w.mask, -1);
    w.arrived = 0;
    w.arrived_mask = 0;
    w.generation++;
}

/* A thread's life: the kernel's body, then its exit counted at the block's and its warp's
 * barriers (an exited thread no longer holds them up); returning resumes the scheduler. */
context fiber_main(context &&scheduler)
{
#ifdef PT_FIBER_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    current->scheduler = std::move(scheduler);
    (*current->body)();
    block_state &b = *current;
    fiber &f = running();
    f.where = state::exited;
    b.live--;
    warp_state &w = b.warps[f.linear / WARP];
    w.live--;
    if (b.arrived > 0 && b.arrived == b.live) b.arrived = 0, b.generation++;
    if (w.arrived > 0 && w.arrived == w.live) release_warp(w); /* its lanes waited for this one */
#ifdef PT_FIBER_ASAN
    __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom, scheduler_stack_size);
#endif
    return std::move(b.scheduler);
}

/* ---- a block -------------------------------------------------------------------------- */

bool resumable(const block_state &b, const fiber &f)
{
    switch (f.where) {
    case state::runnable: return true;
    case state::at_block_barrier: return b.generation != f.generation;
    case state::at_warp_operation: return b.warps[f.linear / WARP].generation != f.generation;
    case state::exited: return false;
    }
    return false;
}

void report_deadlock(const block_state &b)
{
    int at_block = 0, at_warp = 0, exited = 0, first_block = -1, first_warp = -1;
    for (const fiber &f : b.fibers) {
        if (f.where == state::exited) exited++;
        if (f.where == state::at_block_barrier && at_block++ == 0) first_block = (int)f.linear;
        if (f.where == state::at_warp_operation && at_warp++ == 0) first_warp = (int)f.linear;
    }
    record(LAUNCH_FAILURE, true,
           "deadlock in block (%u, %u, %u): %d threads wait at __syncthreads (thread %d first), "
           "%d at a warp operation (thread %d first), %d exited: a barrier some threads never "
           "reach",
           blockIdx.x, blockIdx.y, blockIdx.z, at_block, first_block, at_warp, first_warp, exited);
}

/* PIPERT_EMULATED_ORDER=reverse resumes a block's threads from the last: a race that one order
 * hides (a read before the write it should wait for) shows in the other. */
bool reverse_order()
{
    static const bool reverse = [] {
        const char *order = std::getenv("PIPERT_EMULATED_ORDER");
        return order && !std::strcmp(order, "reverse");
    }();
    return reverse;
}

void run_block(block_state &b)
{
    const size_t n = b.fibers.size();
    for (;;) {
        bool resumed = false;
        for (size_t k = 0; k < n; k++) {
            const size_t i = reverse_order() ? n - 1 - k : k;
            fiber &f = b.fibers[i];
            if (!resumable(b, f)) continue;
            f.where = state::runnable;
            b.running = (int)i;
            threadIdx = f.index;
            switch_to_fiber(f);
            resumed = true;
        }
        if (b.live == 0) return;
        if (!resumed) {
            report_deadlock(b);
            b.abandoned = true;
            return;
        }
    }
}

/* Boost.Context's stack allocator, handing out a stack of the pool: kept, not freed, when the
 * fiber ends (the pool frees them at exit). */
struct pool_stack {
    char *stack;
    boost::context::stack_context allocate()
    {
        boost::context::stack_context c;
        c.size = STACK_BYTES;
        c.sp = stack + STACK_BYTES; /* stacks grow down: sp is the top */
        return c;
    }
    void deallocate(boost::context::stack_context &) noexcept {}
};

void start_fibers(block_state &b, dim3 block)
{
    const unsigned threads = block.x * block.y * block.z;
    std::vector<char *> &stacks = pool.stacks;
    while (stacks.size() < threads) stacks.push_back(static_cast<char *>(std::malloc(STACK_BYTES)));
    b.fibers.clear();
    b.fibers.resize(threads);
    for (unsigned t = 0; t < threads; t++) {
        fiber &f = b.fibers[t];
        f.linear = t;
        f.index = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
        f.stack = stacks[t];
        f.resume_point = context(std::allocator_arg, pool_stack{f.stack}, fiber_main);
    }
    b.live = (int)threads;
    b.warps.assign((threads + WARP - 1) / WARP, warp_state{});
    for (size_t w = 0; w < b.warps.size(); w++)
        b.warps[w].lanes = b.warps[w].live = (int)std::min<unsigned>(WARP, threads - WARP * w);
}

bool check_configuration(const void *kernel, dim3 grid, dim3 block, size_t shared)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const auto limit = shared_limits.find(kernel);
    const size_t shared_limit = limit == shared_limits.end() ? DEFAULT_SHARED : limit->second;
    const char *problem = nullptr;
    if (!grid.x || !grid.y || !grid.z || !threads) problem = "an empty grid or block";
    else if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        problem = "more threads a block than 1,024 (or a block dimension over its limit)";
    else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        problem = "a grid dimension over its limit";
    else if (shared > shared_limit)
        problem = "more dynamic shared memory than the kernel's limit";
    if (!problem) return true;
    record(INVALID_CONFIGURATION, false,
           "launch refused: %s (grid %u×%u×%u, block %u×%u×%u, %zu bytes of dynamic shared "
           "memory, limit %zu)",
           problem, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared, shared_limit);
    return false;
}

/* A deadlocked block's threads are never resumed nor unwound (destroying a suspended
 * Boost.Context fiber would unwind its stack with an exception through the kernel's frames):
 * their resume points are kept where nothing destroys them. No launch runs after a deadlock
 * (a sticky error), so their stacks are not reused. */
void abandon(block_state &b)
{
    static auto *never_resumed = new std::vector<context>;
    for (fiber &f : b.fibers)
        if (f.resume_point) never_resumed->push_back(std::move(f.resume_point));
}

} // namespace

/* ---- the interface -------------------------------------------------------------------- */

void launch(const void *kernel, const std::function<void()> &body, dim3 grid, dim3 block,
            size_t dynamic_shared_bytes, const void *stream)
{
    (void)stream; /* one stream: work runs when launched */
    launch_count++;
    if (first_sticky != SUCCESS || current) {
        if (current) record(LAUNCH_FAILURE, true, "a kernel launched another (not supported)");
        return;
    }
    if (!check_configuration(kernel, grid, block, dynamic_shared_bytes)) return;
    std::vector<uint32_t> shared((dynamic_shared_bytes + 3) / 4 + 4);
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                for (uint32_t &word : shared) word = 0x7fc07fc0u; /* NaN as fp32 and as bf16 */
                block_state b;
                b.shared = reinterpret_cast<unsigned char *>(
                    (reinterpret_cast<uintptr_t>(shared.data()) + 15) & ~uintptr_t{15});
                b.body = &body;
                blockIdx = uint3{x, y, z};
                start_fibers(b, block);
                current = &b;
                run_block(b);
                current = nullptr;
                if (b.abandoned) return abandon(b);
            }
}

void *dynamic_shared() { return current->shared; }

bool set_max_dynamic_shared(const void *kernel, int bytes)
{
    if (bytes < 0 || (size_t)bytes > OPTIN_SHARED) {
        record(INVALID_VALUE, false,
               "cudaFuncSetAttribute: %d bytes of dynamic shared memory (the device's most: %zu)",
               bytes, OPTIN_SHARED);
        return false;
    }
    shared_limits[kernel] = (size_t)bytes;
    return true;
}

int take_error()
{
    const int e = last_error != SUCCESS ? last_error : first_sticky;
    last_error = SUCCESS;
    return e;
}
int peek_error() { return last_error != SUCCESS ? last_error : first_sticky; }
int sticky_error() { return first_sticky; }
const char *error_message() { return message.c_str(); }
long launches() { return launch_count; }

unsigned lane() { return running().linear % WARP; }

std::shared_ptr<void> &thread_state() { return running().kept; }

void fault(const char *what)
{
    record(LAUNCH_FAILURE, true, "%s (thread %u of block %u)", what, running().linear, blockIdx.x);
}

void block_barrier()
{
    block_state &b = *current;
    fiber &f = running();
    f.generation = b.generation;
    if (++b.arrived == b.live) { /* the last to arrive releases the others and goes on */
        b.arrived = 0;
        b.generation++;
        return;
    }
    f.where = state::at_block_barrier;
    yield_to_scheduler();
}

const lane_words *warp_exchange(unsigned mask, const uint64_t *mine, int words)
{
    block_state &b = *current;
    fiber &f = running();
    warp_state &w = b.warps[f.linear / WARP];
    const unsigned lane_bit = 1u << (f.linear % WARP);
    const unsigned long long generation = w.generation;
    if (!(mask & lane_bit)) warp_misuse("a warp operation whose mask leaves out its own lane", mask, -1);
    if (words < 1 || words > EXCHANGE_WORDS) warp_misuse("an exchange of too many words", mask, -1);
    std::memcpy(w.value[generation & 1][f.linear % WARP], mine,
                sizeof(uint64_t) * (size_t)std::min(std::max(words, 0), EXCHANGE_WORDS));
    w.arrived_mask |= lane_bit;
    w.mask = mask;
    f.generation = generation;
    if (++w.arrived == w.live) {
        release_warp(w);
    } else {
        f.where = state::at_warp_operation;
        yield_to_scheduler();
    }
    return w.value[generation & 1];
}

void warp_misuse(const char *what, unsigned mask, int source)
{
    record(LAUNCH_FAILURE, true, "%s (mask %#x, lane %u of thread %u, source lane %d, block %u)",
           what, mask, lane(), running().linear, source, blockIdx.x);
}

} // namespace cuda_host
