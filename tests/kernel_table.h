/* Every entry of a kernel table that each table must have (kernels/kernels.h; not the optional
 * peer_export, peer_copy and set_threads): test_kernels checks the cpu table, test_cuda cuda's. */
#ifndef PT_TESTS_KERNEL_TABLE_H
#define PT_TESTS_KERNEL_TABLE_H

#include <criterion/criterion.h>

#include "kernels/kernels.h"

static inline void expect_a_complete_table(const pt_kernels *k)
{
#define ENTRY(name) {#name, (void (*)(void))k->name}
    const struct {
        const char *name;
        void (*function)(void);
    } entries[] = {
        ENTRY(alloc), ENTRY(free), ENTRY(zero), ENTRY(copy_to_device), ENTRY(copy_to_host),
        ENTRY(copy), ENTRY(synchronize), ENTRY(alloc_host), ENTRY(free_host),
        ENTRY(encoder_forward), ENTRY(encoder_backward), ENTRY(layernorm_forward),
        ENTRY(layernorm_backward), ENTRY(matmul_forward), ENTRY(matmul_backward),
        ENTRY(cast_to_bf16), ENTRY(cast_from_bf16), ENTRY(matmul_forward_bf16),
        ENTRY(matmul_backward_bf16), ENTRY(attention_forward), ENTRY(attention_backward),
        ENTRY(attention_saved_floats), ENTRY(attention_forward_bf16),
        ENTRY(attention_backward_bf16), ENTRY(gelu_forward), ENTRY(gelu_backward),
        ENTRY(gelu_forward_bf16), ENTRY(gelu_backward_bf16), ENTRY(residual_forward),
        ENTRY(crossentropy_forward), ENTRY(crossentropy_forward_backward), ENTRY(adam_update),
        ENTRY(adam_extrapolate), ENTRY(delay_compensate), ENTRY(secant_compensate),
        ENTRY(sum_squares), ENTRY(sum), ENTRY(scale), ENTRY(gather), ENTRY(scatter),
        ENTRY(layernorm_forward_bf16), ENTRY(residual_layernorm_forward),
        ENTRY(residual_layernorm_forward_bf16), ENTRY(matmul_backward_bf16_dinp_written),
        ENTRY(matmul_forward_bf16_to_bf16), ENTRY(matmul_gelu_backward_bf16),
        ENTRY(attention_forward_bf16_to_bf16), ENTRY(attention_backward_bf16_to_bf16),
        ENTRY(crossentropy_forward_bf16), ENTRY(crossentropy_forward_backward_bf16),
    };
#undef ENTRY
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        cr_expect(entries[i].function != NULL, "the %s table has no %s", k->name, entries[i].name);
}

#endif
