/* The CPU backend: host memory from runtime/memory.h, math from the other
 * files of this directory (OpenBLAS for every matrix product, OpenMP loops for
 * the rest). */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "runtime/memory.h"

static void cpu_zero(void *ptr, size_t bytes) { memset(ptr, 0, bytes); }

/* Host and "device" are the same memory here: every copy is a memcpy. */
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static void cpu_synchronize(void) {}

/* attention_forward keeps the softmax probabilities att[B,NH,T,T]. */
static size_t cpu_attention_saved_floats(int B, int T, int C, int NH)
{
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T;
}

static const pt_kernels cpu_kernels = {
    .name = "cpu",
    .host_accessible = true,

    .alloc = pt_alloc,
    .free = pt_free,
    .zero = cpu_zero,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .alloc_host = pt_alloc,
    .free_host = pt_free,
    .set_threads = pt_kernels_cpu_set_threads,

    .encoder_forward = pt_cpu_encoder_forward,
    .encoder_backward = pt_cpu_encoder_backward,
    .layernorm_forward = pt_cpu_layernorm_forward,
    .layernorm_backward = pt_cpu_layernorm_backward,
    .layernorm_backward_bf16 = pt_cpu_layernorm_backward_bf16,
    .layernorm_forward_bf16 = pt_cpu_layernorm_forward_bf16,
    .residual_layernorm_forward = pt_cpu_residual_layernorm_forward,
    .residual_layernorm_forward_bf16 = pt_cpu_residual_layernorm_forward_bf16,
    .matmul_forward = pt_cpu_matmul_forward,
    .matmul_backward = pt_cpu_matmul_backward,
    .cast_to_bf16 = pt_cpu_cast_to_bf16,
    .cast_from_bf16 = pt_cpu_cast_from_bf16,
    .matmul_forward_bf16 = pt_cpu_matmul_forward_bf16,
    .matmul_backward_bf16 = pt_cpu_matmul_backward_bf16,
    .matmul_backward_bf16_dinp_written = pt_cpu_matmul_backward_bf16_dinp_written,
    .matmul_forward_bf16_to_bf16 = pt_cpu_matmul_forward_bf16_to_bf16,
    .matmul_gelu_backward_bf16 = pt_cpu_matmul_gelu_backward_bf16,
    .attention_forward = pt_cpu_attention_forward,
    .attention_backward = pt_cpu_attention_backward,
    .attention_saved_floats = cpu_attention_saved_floats,
    .attention_forward_bf16 = pt_cpu_attention_forward_bf16,
    .attention_backward_bf16 = pt_cpu_attention_backward_bf16,
    .attention_forward_bf16_to_bf16 = pt_cpu_attention_forward_bf16_to_bf16,
    .attention_backward_bf16_to_bf16 = pt_cpu_attention_backward_bf16_to_bf16,
    .gelu_forward_bf16 = pt_cpu_gelu_forward_bf16,
    .gelu_backward_bf16 = pt_cpu_gelu_backward_bf16,
    .gelu_forward = pt_cpu_gelu_forward,
    .gelu_backward = pt_cpu_gelu_backward,
    .residual_forward = pt_cpu_residual_forward,
    .crossentropy_forward = pt_cpu_crossentropy_forward,
    .crossentropy_forward_backward = pt_cpu_crossentropy_forward_backward,
    .crossentropy_forward_bf16 = pt_cpu_crossentropy_forward_bf16,
    .crossentropy_forward_backward_bf16 = pt_cpu_crossentropy_forward_backward_bf16,

    .adam_update = pt_cpu_adam_update,
    .adam_extrapolate = pt_cpu_adam_extrapolate,
    .delay_compensate = pt_cpu_delay_compensate,
    .secant_compensate = pt_cpu_secant_compensate,
    .sum_squares = pt_cpu_sum_squares,
    .sum = pt_cpu_sum,
    .scale = pt_cpu_scale,
    .gather = pt_cpu_gather,
    .scatter = pt_cpu_scatter,
};

const pt_kernels *pt_kernels_cpu(void) { return &cpu_kernels; }

void pt_kernels_cpu_set_threads(int threads)
{
    if (threads < 1) threads = 1;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}
