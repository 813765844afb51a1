/* The CUDA backend's kernels on the emulated device (include/cuda_host.hpp):
 * what kernels/cuda/backend.cu and memory.cu give the kernel files (the
 * context, error recording, the arena's scratch), here on host memory, and a
 * kernel table whose entries are kernels/cuda's where those are kernels of
 * its own or its products: matmul.cu's and attention_gemm.cu's through the
 * emulated cuBLAS and cuBLASLt (blas.cpp). The CPU's remain for memory and
 * copies.
 *
 * The tests of test_cuda.c and test_cuda_bf16.c that use only the table run on
 * it under PIPERT_TEST_CUDA_STANDIN=emulated (tests/cuda_checks.h): every CI
 * run checks those kernels' own code, not the CPU's arithmetic standing in. */
#include "common.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pt_cuda_emulated.h"

namespace pt_emulated {

pt_cuda_context pt_cuda;

/* kernels/cuda/cuda.h's extern "C" entries, defined in this namespace by the translated files */
void pt_cuda_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                 const float *bias, int N, int C, int OC, pt_weight_layout layout);
void pt_cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                  const pt_bf16 *inp, const pt_bf16 *weight, int N, int C, int OC,
                                  pt_weight_layout layout);
long pt_cuda_lt_products(void);
long pt_cuda_lt_heuristic_queries(void);

namespace {

constexpr size_t SCRATCH_BYTES = (size_t)64 << 20;
constexpr size_t ALIGNMENT = 256; /* as the arena's pieces */

size_t align_up(size_t n) { return (n + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT; }

void start()
{
    if (pt_cuda.ready) return;
    std::snprintf(pt_cuda.prop.name, sizeof pt_cuda.prop.name, "emulated device (tests/cuda_host)");
    pt_cuda.prop.major = 9;
    pt_cuda.prop.minor = 0;
    pt_cuda.prop.multiProcessorCount = 4; /* grid-stride kernels: many elements a thread */
    pt_cuda.prop.sharedMemPerBlock = 48 * 1024;
    pt_cuda.prop.sharedMemPerBlockOptin = 227 * 1024;
    pt_cuda.arena.capacity = SCRATCH_BYTES;
    pt_cuda.arena.base = static_cast<char *>(std::aligned_alloc(ALIGNMENT, SCRATCH_BYTES));
    pt_cuda.host_partials = static_cast<double *>(
        std::calloc(PT_CUDA_REDUCE_BLOCKS, sizeof *pt_cuda.host_partials));
    pt_cuda.mma_attention = true;
    pt_cuda.gemm_attention = true; /* backend.cu's defaults: PIPERT_CUDA_GEMM_ATTENTION, _LT */
    pt_cuda.lt = true;
    if (!pt_cuda.arena.base || !pt_cuda.host_partials) {
        pt_fail(PIPERT_ERR_NOMEM, "emulated CUDA: no host memory for its %zu MiB of scratch",
                SCRATCH_BYTES >> 20);
        return;
    }
    /* as backend.cu's start-up (each says what failed) */
    pt_cuda.ready = cublasCreate(&pt_cuda.cublas) == CUBLAS_STATUS_SUCCESS &&
                    pt_cuda_lt_start() == PIPERT_OK && pt_cuda_attention_setup() == PIPERT_OK &&
                    pt_cuda_attention_mma_setup() == PIPERT_OK;
}

} // namespace

/* ---- errors, as backend.cu ----------------------------------------------------------- */

void pt_cuda_record_error(const char *what, const char *detail, const char *file, int line)
{
    if (pt_cuda.error != PIPERT_OK) return;
    std::snprintf(pt_cuda.error_message, sizeof pt_cuda.error_message,
                  "emulated CUDA: %s failed at %s:%d: %s", what, file, line, detail);
    pt_cuda.error = PIPERT_ERR_INTERNAL;
    std::fprintf(stderr, "%s\n", pt_cuda.error_message);
}

bool pt_cublas_ok(cublasStatus_t status, const char *what, const char *file, int line)
{
    if (status == CUBLAS_STATUS_SUCCESS) return true;
    pt_cuda_record_error(what, cublasGetStatusString(status), file, line);
    return false;
}

bool pt_cuda_ok(cudaError_t err, const char *what, const char *file, int line)
{
    if (err == cudaSuccess) return true;
    char detail[640];
    std::snprintf(detail, sizeof detail, "%s: %s", cudaGetErrorString(err),
                  cuda_host::error_message());
    pt_cuda_record_error(what, detail, file, line);
    return false;
}

/* ---- scratch, as memory.cu's: above a top, given back by mark -------------------------- */

size_t pt_cuda_scratch_mark(void) { return pt_cuda.arena.top; }

bool pt_cuda_scratch_fits(size_t bytes)
{
    return align_up(bytes > 0 ? bytes : 1) <= pt_cuda.arena.capacity - pt_cuda.arena.top;
}

/* Scratch starts as NaNs: a kernel that reads what it did not write gets them. */
void *pt_cuda_scratch(size_t bytes, const char *what)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    const size_t size = align_up(bytes > 0 ? bytes : 1);
    if (size > a->capacity - a->top) {
        char detail[160];
        std::snprintf(detail, sizeof detail, "%zu bytes of scratch do not fit in %zu MiB", size,
                      a->capacity >> 20);
        pt_cuda_record_error(what, detail, __FILE__, __LINE__);
        return nullptr;
    }
    char *p = a->base + a->top;
    for (size_t i = 0; i < size; i += 4) std::memcpy(p + i, "\xc0\x7f\xc0\x7f", 4);
    a->top += size;
    if (a->top > a->peak) a->peak = a->top;
    return p;
}

void pt_cuda_scratch_release(size_t mark) { pt_cuda.arena.top = mark; }

void pt_cuda_zero(void *ptr, size_t bytes) { std::memset(ptr, 0, bytes); }

} // namespace pt_emulated

/* ---- the table --------------------------------------------------------------------------- */

extern "C" const pt_kernels *pt_kernels_cuda_emulated(void)
{
    static pt_kernels table;
    pt_emulated::start();
    if (!pt_emulated::pt_cuda.ready) return nullptr;
    if (table.name) return &table;
    table = *pt_kernels_cpu(); /* memory and copies: the CPU's */
    table.name = "cuda-emulated";
    table.encoder_forward = pt_emulated::pt_cuda_encoder_forward;
    table.encoder_backward = pt_emulated::pt_cuda_encoder_backward;
    table.layernorm_forward = pt_emulated::pt_cuda_layernorm_forward;
    table.layernorm_forward_bf16 = pt_emulated::pt_cuda_layernorm_forward_bf16;
    table.residual_layernorm_forward = pt_emulated::pt_cuda_residual_layernorm_forward;
    table.residual_layernorm_forward_bf16 = pt_emulated::pt_cuda_residual_layernorm_forward_bf16;
    table.layernorm_backward = pt_emulated::pt_cuda_layernorm_backward;
    table.layernorm_backward_bf16 = pt_emulated::pt_cuda_layernorm_backward_bf16;
    table.cast_to_bf16 = pt_emulated::pt_cuda_cast_to_bf16;
    table.cast_from_bf16 = pt_emulated::pt_cuda_cast_from_bf16;
    table.matmul_forward = pt_emulated::pt_cuda_matmul_forward;
    table.matmul_backward = pt_emulated::pt_cuda_matmul_backward;
    table.matmul_forward_bf16 = pt_emulated::pt_cuda_matmul_forward_bf16;
    table.matmul_backward_bf16 = pt_emulated::pt_cuda_matmul_backward_bf16;
    table.matmul_backward_bf16_dinp_written =
        pt_emulated::pt_cuda_matmul_backward_bf16_dinp_written;
    table.matmul_forward_bf16_to_bf16 = pt_emulated::pt_cuda_matmul_forward_bf16_to_bf16;
    table.matmul_gelu_backward_bf16 = pt_emulated::pt_cuda_matmul_gelu_backward_bf16;
    table.attention_forward = pt_emulated::pt_cuda_attention_forward;
    table.attention_backward = pt_emulated::pt_cuda_attention_backward;
    table.attention_saved_floats = pt_cuda_attention_saved_floats; /* kernels/cuda/sizes.c */
    table.attention_forward_bf16 = pt_emulated::pt_cuda_attention_forward_bf16;
    table.attention_backward_bf16 = pt_emulated::pt_cuda_attention_backward_bf16;
    table.attention_forward_bf16_to_bf16 = pt_emulated::pt_cuda_attention_forward_bf16_to_bf16;
    table.attention_backward_bf16_to_bf16 = pt_emulated::pt_cuda_attention_backward_bf16_to_bf16;
    table.gelu_forward = pt_emulated::pt_cuda_gelu_forward;
    table.gelu_backward = pt_emulated::pt_cuda_gelu_backward;
    table.gelu_forward_bf16 = pt_emulated::pt_cuda_gelu_forward_bf16;
    table.gelu_backward_bf16 = pt_emulated::pt_cuda_gelu_backward_bf16;
    table.residual_forward = pt_emulated::pt_cuda_residual_forward;
    table.crossentropy_forward = pt_emulated::pt_cuda_crossentropy_forward;
    table.crossentropy_forward_backward = pt_emulated::pt_cuda_crossentropy_forward_backward;
    table.crossentropy_forward_bf16 = pt_emulated::pt_cuda_crossentropy_forward_bf16;
    table.crossentropy_forward_backward_bf16 = pt_emulated::pt_cuda_crossentropy_forward_backward_bf16;
    table.adam_update = pt_emulated::pt_cuda_adam_update;
    table.adam_extrapolate = pt_emulated::pt_cuda_adam_extrapolate;
    table.delay_compensate = pt_emulated::pt_cuda_delay_compensate;
    table.secant_compensate = pt_emulated::pt_cuda_secant_compensate;
    table.sum_squares = pt_emulated::pt_cuda_sum_squares;
    table.sum = pt_emulated::pt_cuda_sum;
    table.scale = pt_emulated::pt_cuda_scale;
    table.gather = pt_emulated::pt_cuda_gather;
    table.scatter = pt_emulated::pt_cuda_scatter;
    return &table;
}

extern "C" pipert_result pt_cuda_emulated_status(void)
{
    const pt_emulated::pt_cuda_context &c = pt_emulated::pt_cuda;
    if (c.error == PIPERT_OK && !cuda_host::sticky_error()) return PIPERT_OK;
    return pt_fail(PIPERT_ERR_INTERNAL, "%s",
                   c.error != PIPERT_OK ? c.error_message : cuda_host::error_message());
}

extern "C" long pt_cuda_emulated_launches(void) { return cuda_host::launches(); }

extern "C" void pt_cuda_emulated_set_mma_attention(int enabled)
{
    pt_emulated::pt_cuda.mma_attention = enabled != 0;
}

extern "C" void pt_cuda_emulated_set_gemm_attention(int enabled)
{
    pt_emulated::pt_cuda.gemm_attention = enabled != 0;
}

extern "C" void pt_cuda_emulated_set_lt(int enabled) { pt_emulated::pt_cuda.lt = enabled != 0; }

extern "C" void pt_cuda_emulated_set_tf32(int enabled)
{
    pt_emulated::pt_cuda.tf32 = enabled != 0;
}

extern "C" long pt_cuda_emulated_lt_products(void) { return pt_emulated::pt_cuda_lt_products(); }

extern "C" long pt_cuda_emulated_lt_heuristic_queries(void)
{
    return pt_emulated::pt_cuda_lt_heuristic_queries();
}
