/* The model's matrix products in the slice's precision (pt_gpt_config.precision, from
 * runtime.precision): models/gpt.c calls these instead of the kernel table's products. */
#ifndef PT_GPT_MATMUL_H
#define PT_GPT_MATMUL_H

#include "models/gpt.h"

/* The bf16 scratch a slice of this shape and precision needs, in elements: each of its two
 * row buffers (input, upstream gradient) and its weight buffer; 0 for fp32. */
void pt_gpt_matmul_scratch(const pt_gpt_slice *s, size_t *rows, size_t *weight);

/* kernels.h's matmul_forward and matmul_backward, in the slice's precision. */
void pt_gpt_matmul_forward(const pt_gpt_slice *s, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int C, int OC,
                           pt_weight_layout layout);
void pt_gpt_matmul_backward(const pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight, int N, int C,
                            int OC, pt_weight_layout layout);

#endif
