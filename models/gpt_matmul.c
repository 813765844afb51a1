/* The model's matrix products in the slice's precision (gpt_matmul.h).
 *
 * fp32: the kernel table's matmul_forward and matmul_backward on the fp32 tensors.
 *
 * bf16 (mixed precision, docs/CUDA.md "bf16"): the activations a product reads are kept in
 * bf16 (pt_gpt_operand: rounded once, as the layernorm, attention or GELU that makes them
 * writes them), the weight matrix and the upstream gradient are rounded as they are used, by
 * cast_to_bf16 into the slice's scratch (the weight whole, once a pass; the gradient's rows in
 * chunks that fit; the residual stream's gradient comes rounded from the layernorm backward that
 * wrote it, models/gpt.c), and the table's _bf16 products sum in fp32 into the fp32 outputs: the
 * activations, and the master gradients, which accumulate in fp32 across microbatches as
 * before. Everything else stays fp32: master weights, AdamW's moments, layernorm, attention,
 * GELU, softmax and the loss. Rounding the weights at use rather than once after each
 * optimizer step follows whichever weights a step runs on (a stash, a prediction:
 * pt_gpt_use_params, the look-aheads) with nothing to keep in step; it costs one cast of each
 * matrix per pass, a pass over memory that is small beside the product itself. */
#include "models/gpt_matmul.h"

void pt_gpt_matmul_scratch(const pt_gpt_slice *s, size_t *rows, size_t *weight)
{
    *rows = *weight = 0;
    if (s->config.precision != PT_PRECISION_BF16) return;
    const size_t N = (size_t)s->B * s->T, C = (size_t)s->config.n_embd;
    const size_t V = s->has_head ? (size_t)s->config.vocab_size : 0;
    /* the widest upstream gradient of a block is [N, 4C] (c_fc's); the classifier's dlogits
     * are made in bf16 (pt_gpt_matmul_backward_operand) */
    *rows = N * 4 * C;
    *weight = 4 * C * C > V * C ? 4 * C * C : V * C;
}

pt_gpt_operand pt_gpt_operand_rows(pt_gpt_operand op, size_t first, size_t width)
{
    return op.bf16 ? (pt_gpt_operand){.bf16 = op.bf16 + first * width}
                   : (pt_gpt_operand){.f32 = op.f32 + first * width};
}

void pt_gpt_matmul_begin_pass(pt_gpt_slice *s) { s->bf16_weight_of = NULL; }

/* The weight matrix, rounded, in bf16_weight: only if the last product of this pass was
 * not on the same one. */
static void round_weight(pt_gpt_slice *s, const float *weight, size_t n)
{
    if (s->bf16_weight_of == weight) return;
    s->kernels->cast_to_bf16(s->bf16_weight, weight, n);
    s->bf16_weight_of = weight;
}

void pt_gpt_matmul_forward(pt_gpt_slice *s, float *out, pt_gpt_operand inp, const float *weight,
                           const float *bias, int N, int C, int OC, pt_weight_layout layout)
{
    const pt_kernels *k = s->kernels;
    if (!inp.bf16) {
        k->matmul_forward(out, inp.f32, weight, bias, N, C, OC, layout);
        return;
    }
    round_weight(s, weight, (size_t)C * OC);
    k->matmul_forward_bf16(out, inp.bf16, s->bf16_weight, bias, N, C, OC, layout);
}

void pt_gpt_matmul_backward(pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                            const float *dout, pt_gpt_operand inp, const float *weight, int N,
                            int C, int OC, pt_weight_layout layout)
{
    const pt_kernels *k = s->kernels;
    if (!inp.bf16) { /* the fp32 table adds into dinp: from zero */
        if (dinp) k->zero(dinp, (size_t)N * C * sizeof(float));
        k->matmul_backward(dinp, dweight, dbias, dout, inp.f32, weight, N, C, OC, layout);
        return;
    }
    round_weight(s, weight, (size_t)C * OC);
    const size_t fit = s->bf16_rows / (size_t)OC;
    const int rows = fit >= (size_t)N ? N : (int)fit;
    for (int first = 0; first < N; first += rows) {
        const int n = N - first < rows ? N - first : rows;
        k->cast_to_bf16(s->bf16_out, dout + (size_t)first * OC, (size_t)n * OC);
        /* dweight and dbias accumulate over the chunks as over microbatches */
        k->matmul_backward_bf16_dinp_written(dinp ? dinp + (size_t)first * C : NULL, dweight,
                                             dbias, s->bf16_out, inp.bf16 + (size_t)first * C,
                                             s->bf16_weight, n, C, OC, OC, layout);
    }
}

void pt_gpt_matmul_forward_operand(pt_gpt_slice *s, pt_gpt_operand out, pt_gpt_operand inp,
                                   const float *weight, const float *bias, int N, int C, int OC,
                                   int ld, pt_weight_layout layout)
{
    if (!out.bf16) {
        pt_gpt_matmul_forward(s, out.f32, inp, weight, bias, N, C, OC, layout);
        return;
    }
    round_weight(s, weight, (size_t)C * OC);
    s->kernels->matmul_forward_bf16_to_bf16(out.bf16, bias ? s->dscratch_fc : NULL, inp.bf16,
                                            s->bf16_weight, bias, N, C, OC, ld, layout);
}

void pt_gpt_matmul_backward_operand(pt_gpt_slice *s, float *dinp, float *dweight, float *dbias,
                                    pt_gpt_operand dout, pt_gpt_operand inp, const float *weight,
                                    int N, int C, int OC, int ld, pt_weight_layout layout)
{
    if (!dout.bf16) {
        pt_gpt_matmul_backward(s, dinp, dweight, dbias, dout.f32, inp, weight, N, C, OC, layout);
        return;
    }
    round_weight(s, weight, (size_t)C * OC);
    s->kernels->matmul_backward_bf16_dinp_written(dinp, dweight, dbias, dout.bf16, inp.bf16,
                                                  s->bf16_weight, N, C, OC, ld, layout);
}

void pt_gpt_matmul_gelu_backward(pt_gpt_slice *s, pt_bf16 *dpre, float *dweight, float *dbias,
                                 const float *dout, const pt_bf16 *dout_rounded,
                                 pt_gpt_operand inp, const pt_bf16 *pre, const float *weight,
                                 int N, int C, int OC)
{
    round_weight(s, weight, (size_t)C * OC);
    if (dout_rounded) {
        s->kernels->matmul_gelu_backward_bf16(dpre, s->dscratch_fc_gelu, dweight, dbias,
                                              dout_rounded, inp.bf16, pre, s->bf16_weight, N, C,
                                              OC, PT_WEIGHT_IN_OUT);
        return;
    }
    const size_t fit = s->bf16_rows / (size_t)OC;
    const int rows = fit >= (size_t)N ? N : (int)fit;
    for (int first = 0; first < N; first += rows) {
        const int n = N - first < rows ? N - first : rows;
        const size_t at = (size_t)first * C;
        s->kernels->cast_to_bf16(s->bf16_out, dout + (size_t)first * OC, (size_t)n * OC);
        s->kernels->matmul_gelu_backward_bf16(dpre + at, s->dscratch_fc_gelu + at, dweight, dbias,
                                              s->bf16_out, inp.bf16 + at, pre + at,
                                              s->bf16_weight, n, C, OC, PT_WEIGHT_IN_OUT);
    }
}
