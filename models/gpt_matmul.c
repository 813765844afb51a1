/* The model's matrix products in the slice's precision (gpt_matmul.h).
 *
 * fp32: the kernel table's matmul_forward and matmul_backward on the fp32 tensors.
 *
 * bf16 (mixed precision, docs/CUDA.md "bf16"): each operand is rounded to bf16 as it is used,
 * by cast_to_bf16 into the slice's scratch (the weight matrix whole; the input's and the
 * upstream gradient's rows in chunks that fit), and the table's _bf16 products sum in fp32
 * into the fp32 outputs: the activations, and the master gradients, which accumulate in fp32
 * across microbatches as before. Everything else stays fp32: master weights, AdamW's moments,
 * layernorm, attention, GELU, softmax and the loss. Rounding at use rather than once after
 * each optimizer step follows whichever weights a step runs on (a stash, a prediction:
 * pt_gpt_use_params, the look-aheads) with nothing to keep in step; it costs one cast of each
 * matrix per product, a pass over memory that is small beside the product itself. */
#include "models/gpt_matmul.h"

void pt_gpt_matmul_scratch(const pt_gpt_slice *s, size_t *rows, size_t *weight)
{
    *rows = *weight = 0;
    if (s->config.precision != PT_PRECISION_BF16) return;
    const size_t N = (size_t)s->B * s->T, C = (size_t)s->config.n_embd;
    const size_t V = s->has_head ? (size_t)s->config.vocab_size : 0;
    /* the widest input or upstream gradient of a block is [N, 4C] (c_fc's output, c_proj's
     * input); the head's [N, V] gradient goes through in chunks of rows, at least one */
    *rows = N * 4 * C > V ? N * 4 * C : V;
    *weight = 4 * C * C > V * C ? 4 * C * C : V * C;
}

/* Rows of an [N, C] · [C, OC] product whose rounded operands fit the row buffers at once. */
static int rows_per_chunk(const pt_gpt_slice *s, int N, int C, int OC)
{
    const size_t widest = (size_t)(C > OC ? C : OC);
    const size_t rows = s->bf16_rows / widest;
    return rows >= (size_t)N ? N : (int)rows;
}

void pt_gpt_matmul_forward(const pt_gpt_slice *s, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int C, int OC,
                           pt_weight_layout layout)
{
    const pt_kernels *k = s->kernels;
    if (s->config.precision != PT_PRECISION_BF16) {
        k->matmul_forward(out, inp, weight, bias, N, C, OC, layout);
        return;
    }
    k->cast_to_bf16(s->bf16_weight, weight, (size_t)C * OC);
    const int rows = rows_per_chunk(s, N, C, OC);
    for (int first = 0; first < N; first += rows) {
        const int n = N - first < rows ? N - first : rows;
        k->cast_to_bf16(s->bf16_in, inp + (size_t)first * C, (size_t)n * C);
        k->matmul_forward_bf16(out + (size_t)first * OC, s->bf16_in, s->bf16_weight, bias, n, C,
                               OC, layout);
    }
}

void pt_gpt_matmul_backward(const pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight, int N, int C,
                            int OC, pt_weight_layout layout)
{
    const pt_kernels *k = s->kernels;
    if (s->config.precision != PT_PRECISION_BF16) {
        k->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout);
        return;
    }
    k->cast_to_bf16(s->bf16_weight, weight, (size_t)C * OC);
    const int rows = rows_per_chunk(s, N, C, OC);
    for (int first = 0; first < N; first += rows) {
        const int n = N - first < rows ? N - first : rows;
        k->cast_to_bf16(s->bf16_out, dout + (size_t)first * OC, (size_t)n * OC);
        k->cast_to_bf16(s->bf16_in, inp + (size_t)first * C, (size_t)n * C);
        /* dweight and dbias accumulate over the chunks as over microbatches */
        k->matmul_backward_bf16(dinp ? dinp + (size_t)first * C : NULL, dweight, dbias,
                                s->bf16_out, s->bf16_in, s->bf16_weight, n, C, OC, layout);
    }
}
