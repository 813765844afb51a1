/* The model's matrix products in the slice's precision (pt_gpt_config.precision, from
 * runtime.precision): models/gpt.c calls these instead of the kernel table's products. */
#ifndef PT_GPT_MATMUL_H
#define PT_GPT_MATMUL_H

#include "models/gpt.h"

/* The bf16 scratch a slice of this shape and precision needs, in elements: its row buffer
 * (an upstream gradient's rows) and its weight buffer; 0 for fp32. */
void pt_gpt_matmul_scratch(const pt_gpt_slice *s, size_t *rows, size_t *weight);

/* Before a pass over the model (a forward, a backward): the weights may have changed since
 * the last, so no operand rounded then is used again. */
void pt_gpt_matmul_begin_pass(pt_gpt_slice *s);

/* kernels.h's matmul_forward and matmul_backward, in the slice's precision: `inp` in it (an
 * operand of the slice's), the rest fp32. In bf16, a weight matrix rounded for one product
 * serves the next ones on it in the same pass (the classifier's chunks). Unlike the table's,
 * the backward *writes* dinp (bf16: a product that does not read it, matmul_backward_bf16_
 * dinp_written; fp32: zeroed, then added to); dweight and dbias accumulate. */
void pt_gpt_matmul_forward(pt_gpt_slice *s, float *out, pt_gpt_operand inp,
                           const float *weight, const float *bias, int N, int C, int OC,
                           pt_weight_layout layout);
void pt_gpt_matmul_backward(pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                            const float *dout, pt_gpt_operand inp, const float *weight, int N,
                            int C, int OC, pt_weight_layout layout);

/* A product into an operand of the slice's precision (bf16: qkv and fc, the classifier's
 * logits; made rounded, its fp32 sums and bias rounded once); and a product's backward from
 * an upstream gradient in that precision, rounded where it was made (dlogits, the MLP's dfc).
 * ld: the rows' stride of out and dout, OC but for the classifier's bf16 logits (an fp32 out
 * is dense). */
void pt_gpt_matmul_forward_operand(pt_gpt_slice *s, pt_gpt_operand out, pt_gpt_operand inp,
                                   const float *weight, const float *bias, int N, int C, int OC,
                                   int ld, pt_weight_layout layout);
void pt_gpt_matmul_backward_operand(pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                                    pt_gpt_operand dout, pt_gpt_operand inp, const float *weight,
                                    int N, int C, int OC, int ld, pt_weight_layout layout);

/* bf16 only: the backward of out = gelu(pre)·W + bias (the MLP's second product, W in-out)
 * through the GELU, from the fp32 upstream gradient dout: dpre[N,C] = bf16(gelu'(pre)·
 * dout·Wᵀ) written, dweight and dbias accumulated; inp holds gelu(pre). The table's
 * matmul_gelu_backward_bf16, dout rounded in chunks as pt_gpt_matmul_backward's, or read
 * rounded from dout_rounded[N,OC] where it is not NULL (a layernorm backward wrote it). */
void pt_gpt_matmul_gelu_backward(pt_gpt_slice *s, pt_bf16 *dpre, float *dweight, float *dbias,
                                 const float *dout, const pt_bf16 *dout_rounded,
                                 pt_gpt_operand inp, const pt_bf16 *pre, const float *weight,
                                 int N, int C, int OC);

/* Rows [first, …) of an operand of `width` columns. */
pt_gpt_operand pt_gpt_operand_rows(pt_gpt_operand op, size_t first, size_t width);

#endif
