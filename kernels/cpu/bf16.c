/* The kernels on bf16 operands on the CPU (kernels.h, runtime.precision = bf16): an
 * emulation, for tests and for checking a bf16 run without a GPU. Each bf16 operand is widened
 * back to fp32 (exact: a bf16 is the upper half of a float) and the fp32 kernel runs on it, so
 * a product is the fp32 GEMM of the rounded values (what a tensor core computes, up to the
 * order of its fp32 sums), attention and GELU the fp32 ones of the rounded inputs. No faster
 * than fp32.
 *
 * Naive reading: as matmul.c, attention.c and elementwise.c, with every bf16 value x read as
 * the float it is, and a bf16 output the nearest bf16 of the fp32 result. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Round to nearest even (the rounding of CUDA's __float2bfloat16_rn); a NaN stays a NaN. */
static pt_bf16 to_bf16(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (pt_bf16)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (pt_bf16)(bits >> 16);
}

void pt_cpu_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = to_bf16(inp[i]);
}

void pt_cpu_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)inp[i] << 16;
        memcpy(&out[i], &bits, sizeof bits);
    }
}

/* x as fp32 values in a new buffer (free it), or NULL when memory is short. */
static float *widened(const pt_bf16 *x, size_t n)
{
    float *out = malloc((n ? n : 1) * sizeof *out);
    if (out) pt_cpu_cast_from_bf16(out, x, n);
    return out;
}

/* The rows [N, width] of x, ld apart, as dense fp32 rows in a new buffer (free it), or NULL. */
static float *widened_rows(const pt_bf16 *x, int N, int width, int ld)
{
    if (ld == width) return widened(x, (size_t)N * width);
    const size_t count = (size_t)N * width;
    float *out = malloc((count ? count : 1) * sizeof *out);
    for (int row = 0; out && row < N; row++)
        pt_cpu_cast_from_bf16(out + (size_t)row * width, x + (size_t)row * ld, (size_t)width);
    return out;
}

/* Dense fp32 rows [N, width] rounded into the rows of out, ld apart. */
static void rounded_rows_into(pt_bf16 *out, const float *y, int N, int width, int ld)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < width; i++) out[(size_t)n * ld + i] = to_bf16(y[(size_t)n * width + i]);
}

/* A kernel has no error path: a product that could not get its memory leaves NaN in what it
 * writes, which the step's loss and the gradient norm then show. */
static void poison(float *x, size_t n)
{
    for (size_t i = 0; x && i < n; i++) x[i] = NAN;
}
static void poison_bf16(pt_bf16 *x, size_t n)
{
    for (size_t i = 0; x && i < n; i++) x[i] = 0x7fc0; /* NaN */
}

/* The fp32 buffer a kernel writing bf16 computes into (zeroed when it adds into it), or NULL
 * with out poisoned when memory is short; rounded_into then rounds it into out and frees it. */
static float *fp32_for(pt_bf16 *out, size_t n, bool zeroed)
{
    float *y = zeroed ? calloc(n ? n : 1, sizeof *y) : malloc((n ? n : 1) * sizeof *y);
    if (!y) poison_bf16(out, n);
    return y;
}

static void rounded_into(pt_bf16 *out, float *y, size_t n)
{
    pt_cpu_cast_to_bf16(out, y, n);
    free(y);
}

void pt_cpu_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                const float *bias, int N, int C, int OC, pt_weight_layout layout)
{
    float *in = widened(inp, (size_t)N * C), *w = widened(weight, (size_t)C * OC);
    if (in && w) pt_cpu_matmul_forward(out, in, w, bias, N, C, OC, layout);
    else poison(out, (size_t)N * OC);
    free(in);
    free(w);
}

/* The backward from dout's rows, ld_dout apart, made dense first where they are not. */
static void matmul_backward_bf16_rows(float *dinp, float *dweight, float *dbias,
                                      const pt_bf16 *dout, int ld_dout, const pt_bf16 *inp,
                                      const pt_bf16 *weight, int N, int C, int OC,
                                      pt_weight_layout layout)
{
    float *d = widened_rows(dout, N, OC, ld_dout), *in = widened(inp, (size_t)N * C),
          *w = widened(weight, (size_t)C * OC);
    if (d && in && w) {
        pt_cpu_matmul_backward(dinp, dweight, dbias, d, in, w, N, C, OC, layout);
    } else {
        poison(dinp, (size_t)N * C);
        poison(dweight, (size_t)C * OC);
        poison(dbias, (size_t)OC);
    }
    free(d);
    free(in);
    free(w);
}

void pt_cpu_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                 const pt_bf16 *inp, const pt_bf16 *weight, int N, int C, int OC,
                                 pt_weight_layout layout)
{
    matmul_backward_bf16_rows(dinp, dweight, dbias, dout, OC, inp, weight, N, C, OC, layout);
}

/* dinp zeroed, then added to: the same bits as the model's zero and product before. */
void pt_cpu_matmul_backward_bf16_dinp_written(float *dinp, float *dweight, float *dbias,
                                              const pt_bf16 *dout, const pt_bf16 *inp,
                                              const pt_bf16 *weight, int N, int C, int OC,
                                              int ld_dout, pt_weight_layout layout)
{
    if (dinp) memset(dinp, 0, (size_t)N * C * sizeof *dinp);
    matmul_backward_bf16_rows(dinp, dweight, dbias, dout, ld_dout, inp, weight, N, C, OC, layout);
}

/* Into the scratch, then rounded: the same bits as the fp32 output's cast. */
void pt_cpu_attention_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, float *att,
                                           const pt_bf16 *qkv, int B, int T, int C, int NH)
{
    pt_cpu_attention_forward_bf16(scratch, att, qkv, B, T, C, NH);
    pt_cpu_cast_to_bf16(out, scratch, (size_t)B * T * C);
}

/* Into the zeroed scratch, then rounded: the same bits as the fp32 gradient's cast. */
void pt_cpu_attention_backward_bf16_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                            const pt_bf16 *qkv, const float *att, int B, int T,
                                            int C, int NH)
{
    const size_t n = (size_t)B * T * 3 * C;
    memset(scratch, 0, n * sizeof *scratch);
    pt_cpu_attention_backward_bf16(scratch, dout, qkv, att, B, T, C, NH);
    pt_cpu_cast_to_bf16(dqkv, scratch, n);
}

/* The fp32 layernorm into a buffer of its own, rounded as it is copied out (one parallel pass
 * each, not a call per row). */
void pt_cpu_layernorm_forward_bf16(pt_bf16 *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C)
{
    const size_t n = (size_t)N * C;
    float *y = fp32_for(out, n, false);
    if (!y) return;
    pt_cpu_layernorm_forward(y, mean, rstd, inp, weight, bias, N, C);
    rounded_into(out, y, n);
}

/* The fp32 backward, then dinp rounded in a pass of its own (the same bits as a cast after it). */
void pt_cpu_layernorm_backward_bf16(float *dinp, pt_bf16 *dinp_rounded, float *dweight,
                                    float *dbias, const float *dout, const float *inp,
                                    const float *weight, const float *mean, const float *rstd,
                                    int N, int C)
{
    pt_cpu_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    pt_cpu_cast_to_bf16(dinp_rounded, dinp, (size_t)N * C);
}

void pt_cpu_residual_layernorm_forward_bf16(float *residual, pt_bf16 *out, float *mean,
                                            float *rstd, const float *a, const float *b,
                                            const float *weight, const float *bias, int N, int C)
{
    pt_cpu_residual_forward(residual, a, b, (size_t)N * C);
    pt_cpu_layernorm_forward_bf16(out, mean, rstd, residual, weight, bias, N, C);
}

/* The fp32 product of the widened operands into scratch (a buffer of its own when there is
 * none), then bias added and rounded once: the same bits as the product, then the bias, then
 * the cast. */
void pt_cpu_matmul_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, const pt_bf16 *inp,
                                        const pt_bf16 *weight, const float *bias, int N, int C,
                                        int OC, int ld_out, pt_weight_layout layout)
{
    const size_t n = (size_t)N * OC;
    float *product = scratch ? scratch : malloc((n ? n : 1) * sizeof *product);
    if (!product) {
        for (int row = 0; row < N; row++) poison_bf16(out + (size_t)row * ld_out, (size_t)OC);
        return;
    }
    pt_cpu_matmul_forward_bf16(product, inp, weight, NULL, N, C, OC, layout);
#pragma omp parallel for schedule(static)
    for (int row = 0; row < N; row++)
        for (int o = 0; o < OC; o++) {
            const size_t i = (size_t)row * OC + o;
            out[(size_t)row * ld_out + o] = to_bf16(bias ? product[i] + bias[o] : product[i]);
        }
    if (product != scratch) free(product);
}

/* The product's dinp written into scratch, then gelu'(pre)·dinp onto zeros, rounded: the same
 * bits as the product, the fp32 GELU backward and the cast in turn. */
void pt_cpu_matmul_gelu_backward_bf16(pt_bf16 *dpre, float *scratch, float *dweight, float *dbias,
                                      const pt_bf16 *dout, const pt_bf16 *inp, const pt_bf16 *pre,
                                      const pt_bf16 *weight, int N, int C, int OC,
                                      pt_weight_layout layout)
{
    const size_t n = (size_t)N * C;
    float *product = scratch ? scratch : fp32_for(dpre, n, false);
    float *gradient = product ? fp32_for(dpre, n, true) : NULL;
    if (gradient) {
        pt_cpu_matmul_backward_bf16_dinp_written(product, dweight, dbias, dout, inp, weight, N, C,
                                                 OC, OC, layout);
        pt_cpu_gelu_backward_bf16(gradient, pre, product, n);
        rounded_into(dpre, gradient, n);
    }
    if (product != scratch) free(product);
}

/* Cross-entropy on bf16 logits (rows ld apart): the fp32 kernel on their exact values; the
 * gradient's form rounds dlogits back into the logits. */
void pt_cpu_crossentropy_forward_bf16(float *losses, const pt_bf16 *logits, const int32_t *targets,
                                      int N, int V, int ld)
{
    float *x = widened_rows(logits, N, V, ld);
    if (x) pt_cpu_crossentropy_forward(losses, x, targets, N, V);
    else poison(losses, (size_t)N);
    free(x);
}

void pt_cpu_crossentropy_forward_backward_bf16(float *losses, pt_bf16 *logits,
                                               const int32_t *targets, int N, int V, int ld,
                                               float dloss)
{
    float *x = widened_rows(logits, N, V, ld);
    if (x) {
        pt_cpu_crossentropy_forward_backward(losses, x, targets, N, V, dloss);
        rounded_rows_into(logits, x, N, V, ld);
    } else {
        poison(losses, (size_t)N);
        for (int n = 0; n < N; n++) poison_bf16(logits + (size_t)n * ld, (size_t)V);
    }
    free(x);
}

void pt_cpu_attention_forward_bf16(float *out, float *att, const pt_bf16 *qkv, int B, int T,
                                   int C, int NH)
{
    const size_t N = (size_t)B * T;
    float *wide = widened(qkv, N * 3 * C);
    if (wide) pt_cpu_attention_forward(out, att, wide, B, T, C, NH);
    else poison(out, N * C);
    free(wide);
}

void pt_cpu_attention_backward_bf16(float *dqkv, const float *dout, const pt_bf16 *qkv,
                                    const float *att, int B, int T, int C, int NH)
{
    const size_t N = (size_t)B * T;
    float *wide = widened(qkv, N * 3 * C);
    if (wide) pt_cpu_attention_backward(dqkv, dout, wide, att, B, T, C, NH);
    else poison(dqkv, N * 3 * C);
    free(wide);
}

void pt_cpu_gelu_forward_bf16(pt_bf16 *out, const pt_bf16 *inp, size_t n)
{
    float *wide = widened(inp, n);
    if (wide) {
        pt_cpu_gelu_forward(wide, wide, n);
        pt_cpu_cast_to_bf16(out, wide, n);
    } else {
        for (size_t i = 0; i < n; i++) out[i] = 0x7fc0; /* NaN */
    }
    free(wide);
}

void pt_cpu_gelu_backward_bf16(float *dinp, const pt_bf16 *inp, const float *dout, size_t n)
{
    float *wide = widened(inp, n);
    if (wide) pt_cpu_gelu_backward(dinp, wide, dout, n);
    else poison(dinp, n);
    free(wide);
}
