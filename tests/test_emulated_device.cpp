/* The emulated CUDA device itself (tests/cuda_host/device.cpp, include/cuda_host.hpp): what
 * cuda-emulated and cuda_bf16-emulated rest on to catch GPU bugs without a GPU. Each check
 * is against what CUDA's programming guide specifies, computed here directly: every thread
 * of every block runs once with its own coordinates; a barrier orders a block's writes
 * before its reads; the warp operations give the documented lanes' values; and what a GPU
 * would refuse or what would hang it (a launch over the limits, a deadlock, a warp operation
 * naming a lane that exited) is reported as an error, not run, hung or crashed. Criterion
 * runs each test in a process of its own, so one test's sticky error leaves the next alone.
 * (No assertion runs inside a kernel's body: it runs on a fiber's stack.) */
#include <criterion/criterion.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_host.hpp"

namespace {

constexpr int LAUNCH_FAILURE = 719, INVALID_CONFIGURATION = 9;

/* Launches body on grid × block threads; returns the error it left (0: none). */
template <class Body> int run(dim3 grid, dim3 block, Body body, size_t shared = 0,
                              const void *kernel = nullptr)
{
    cuda_host::launch(kernel, body, grid, block, shared);
    return cuda_host::take_error();
}

} // namespace

Test(emulated_device, every_thread_of_every_block_runs_once_with_its_coordinates)
{
    const dim3 grid(3, 2, 2), block(4, 2, 3);
    const int threads = 4 * 2 * 3, blocks = 3 * 2 * 2;
    std::vector<int> seen(blocks * threads, 0);
    const int error = run(grid, block, [&] {
        const int b = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
        const int t = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
        seen[b * threads + t]++;
    });
    cr_assert_eq(error, 0, "%s", cuda_host::error_message());
    for (int i = 0; i < blocks * threads; i++)
        cr_expect_eq(seen[i], 1, "block %d thread %d ran %d times", i / threads, i % threads, seen[i]);
}

Test(emulated_device, a_barrier_orders_the_blocks_writes_before_its_reads)
{
    /* each thread writes its slot, waits, reads its neighbour's: the neighbour's value whichever
     * order the threads run in; without the barrier the first thread reads the slot unwritten
     * (dynamic shared memory starts as NaN) */
    const int n = 64;
    for (bool barrier : {true, false}) {
        std::vector<float> got(n, 0.0f);
        const int error = run(dim3(1), dim3(n), [&] {
            float *slots = static_cast<float *>(cuda_host::dynamic_shared());
            const unsigned t = threadIdx.x;
            slots[t] = (float)t;
            if (barrier) __syncthreads();
            got[t] = slots[(t + 1) % n];
        }, n * sizeof(float));
        cr_assert_eq(error, 0, "%s", cuda_host::error_message());
        int unwritten = 0;
        for (int t = 0; t < n; t++) {
            if (std::isnan(got[t])) unwritten++;
            else cr_expect_eq(got[t], (float)((t + 1) % n));
        }
        if (barrier) cr_expect_eq(unwritten, 0, "with the barrier every read sees its write");
        else cr_expect_gt(unwritten, 0, "without it some read comes before its write");
    }
}

Test(emulated_device, warp_operations_give_the_documented_lanes_values)
{
    std::vector<float> butterfly(64), down(64);
    std::vector<unsigned> ballots(64);
    const int error = run(dim3(1), dim3(64), [&] {
        const unsigned t = threadIdx.x, lane = t % 32;
        float sum = (float)lane; /* the butterfly all-reduce: every lane ends with 0 + … + 31 */
        for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
        butterfly[t] = sum;
        /* shfl_down within segments of 16: a lane past its segment's end keeps its value */
        down[t] = __shfl_down_sync(0xffffffffu, (float)lane, 3, 16);
        ballots[t] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    });
    cr_assert_eq(error, 0, "%s", cuda_host::error_message());
    unsigned every_third = 0;
    for (int l = 0; l < 32; l += 3) every_third |= 1u << l;
    for (int t = 0; t < 64; t++) {
        const int lane = t % 32;
        cr_expect_eq(butterfly[t], 496.0f, "thread %d: %g", t, butterfly[t]);
        const int source = lane % 16 + 3 < 16 ? lane + 3 : lane;
        cr_expect_eq(down[t], (float)source, "thread %d: shfl_down gave %g, want %d", t, down[t],
                     source);
        cr_expect_eq(ballots[t], every_third, "thread %d: ballot %#x", t, ballots[t]);
    }
}

Test(emulated_device, a_deadlock_is_reported_and_poisons_later_launches)
{
    /* half of each warp waits at a shuffle, the other half at __syncthreads: on a GPU, a hang */
    const int error = run(dim3(2), dim3(64), [&] {
        if (threadIdx.x % 32 < 16) (void)__shfl_sync(0xffffffffu, 1.0f, 0);
        else __syncthreads();
    });
    cr_expect_eq(error, LAUNCH_FAILURE);
    cr_expect(std::strstr(cuda_host::error_message(), "deadlock in block (0, 0, 0)") != nullptr,
              "the message names the block: %s", cuda_host::error_message());
    bool ran = false;
    cr_expect_eq(run(dim3(1), dim3(1), [&] { ran = true; }), LAUNCH_FAILURE,
                 "the error stays, as a failed kernel's poisons a CUDA context");
    cr_expect(!ran, "nothing runs after it");
}

Test(emulated_device, launches_a_gpu_refuses_run_nothing)
{
    bool ran = false;
    auto body = [&] { ran = true; };
    cr_expect_eq(run(dim3(1), dim3(1025), body), INVALID_CONFIGURATION, "1,025 threads");
    cr_expect_eq(run(dim3(0), dim3(32), body), INVALID_CONFIGURATION, "an empty grid");
    cr_expect_eq(run(dim3(1), dim3(1, 1, 65), body), INVALID_CONFIGURATION, "block z over 64");
    static const char kernel = 0;
    cr_expect_eq(run(dim3(1), dim3(32), body, 48 * 1024 + 16, &kernel), INVALID_CONFIGURATION,
                 "more than 48 KiB of dynamic shared memory without opting in");
    cr_expect(!ran, "a refused launch ran its body");
    cr_expect(!cuda_host::set_max_dynamic_shared(&kernel, 228 * 1024), "over an H100's 227 KiB");
    cr_expect_eq(cuda_host::take_error(), 1 /* cudaErrorInvalidValue */);
    cr_assert(cuda_host::set_max_dynamic_shared(&kernel, 100 * 1024));
    cr_expect_eq(run(dim3(1), dim3(32), body, 100 * 1024, &kernel), 0, "%s",
                 cuda_host::error_message());
    cr_expect(ran, "opted in, the launch runs");
}

Test(emulated_device, a_warp_operation_naming_an_exited_lane_is_a_fault)
{
    const int error = run(dim3(1), dim3(32), [&] {
        if (threadIdx.x >= 8) return; /* lanes 8-31 exit; the full mask still names them */
        (void)__shfl_sync(0xffffffffu, 1.0f, 0);
    });
    cr_expect_eq(error, LAUNCH_FAILURE);
    cr_expect(std::strstr(cuda_host::error_message(), "exited") != nullptr, "%s",
              cuda_host::error_message());
}

Test(emulated_device, thread_state_is_each_threads_own_for_its_block)
{
    /* a counter kept in thread_state across barriers: 3 increments each, per block anew */
    std::vector<int> counts(2 * 32, -1), started_empty(2 * 32, 0);
    const int error = run(dim3(2), dim3(32), [&] {
        std::shared_ptr<void> &state = cuda_host::thread_state();
        started_empty[blockIdx.x * 32 + threadIdx.x] = !state;
        state = std::make_shared<int>(0);
        for (int i = 0; i < 3; i++) {
            ++*static_cast<int *>(state.get());
            __syncthreads();
        }
        counts[blockIdx.x * 32 + threadIdx.x] = *static_cast<int *>(state.get());
    });
    cr_assert_eq(error, 0, "%s", cuda_host::error_message());
    for (int i = 0; i < 64; i++) {
        cr_expect_eq(counts[i], 3, "thread %d: %d", i, counts[i]);
        cr_expect(started_empty[i], "thread %d's state did not start empty", i);
    }
}
