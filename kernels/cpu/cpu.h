/* The CPU kernels, one file per layer; backend.c gathers them into the
 * pt_kernels table. Shapes and semantics are those documented in
 * kernels/kernels.h. Private to kernels/cpu/. */
#ifndef PT_KERNELS_CPU_H
#define PT_KERNELS_CPU_H

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* max(x, lo) and min(x, hi) without a select: the comparison becomes a 0/1
 * factor. (A ternary here stays a branch under -ftrapping-math and keeps the
 * loops around it scalar.) x must be finite. */
static inline float pt_cpu_clampf(float x, float lo, float hi)
{
    x += (float)(x < lo) * (lo - x);
    x += (float)(x > hi) * (hi - x);
    return x;
}

/* expf in a form the compiler vectorizes (glibc's expf stays scalar without
 * -ffast-math), for finite x: x = k·ln2 + r with |r| ≤ ln2/2, eʳ by its Taylor
 * polynomial of degree 7 (truncation error r⁸/8! < 6e-9, a few ulp in all),
 * times 2ᵏ built in the exponent bits. x is clamped to [−87, 88], so below −87
 * the result is ~1.6e-38 rather than 0: invisible in any sum that holds a 1. */
static inline float pt_cpu_expf(float x)
{
    x = pt_cpu_clampf(x, -87.0f, 88.0f);
    /* k = round(x/ln2) ∈ [−126, 127]; the shift makes the truncation a floor */
    int32_t k = (int32_t)(x * 1.44269504088896341f + 126.5f) - 126;
    float r = x - (float)k * 0.693145751953125f; /* ln2, high bits: the product is exact */
    r -= (float)k * 1.4286068203e-06f;          /* ln2, low bits */
    float p = 1.0f / 5040.0f + r * (1.0f / 40320.0f);
    p = 1.0f / 720.0f + r * p;
    p = 1.0f / 120.0f + r * p;
    p = 1.0f / 24.0f + r * p;
    p = 1.0f / 6.0f + r * p;
    p = 0.5f + r * p;
    p = 1.0f + r * p;
    p = 1.0f + r * p;
    int32_t bits = (k + 127) << 23; /* the float 2ᵏ */
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

/* tanh u = 1 − 2/(e²ᵘ + 1), vectorizable. The absolute error is ~1e-7; near 0
 * the relative error is larger, which is harmless where the result is added
 * to 1 (GELU). */
static inline float pt_cpu_tanhf(float u) { return 1.0f - 2.0f / (pt_cpu_expf(2.0f * u) + 1.0f); }

/* encoder.c */
void pt_cpu_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
void pt_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C);

/* layernorm.c */
void pt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
void pt_cpu_layernorm_backward_bf16(float *dinp, pt_bf16 *dinp_rounded, float *dweight,
                                    float *dbias, const float *dout, const float *inp,
                                    const float *weight, const float *mean, const float *rstd,
                                    int N, int C);
void pt_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);

/* matmul.c */
void pt_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC, pt_weight_layout layout);
void pt_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC,
                            pt_weight_layout layout);

/* bf16.c */
void pt_cpu_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n);
void pt_cpu_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n);
void pt_cpu_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                const float *bias, int N, int C, int OC, pt_weight_layout layout);
void pt_cpu_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                 const pt_bf16 *inp, const pt_bf16 *weight, int N, int C, int OC,
                                 pt_weight_layout layout);
void pt_cpu_matmul_backward_bf16_dinp_written(float *dinp, float *dweight, float *dbias,
                                              const pt_bf16 *dout, const pt_bf16 *inp,
                                              const pt_bf16 *weight, int N, int C, int OC,
                                              int ld_dout, pt_weight_layout layout);
void pt_cpu_attention_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, float *att,
                                           const pt_bf16 *qkv, int B, int T, int C, int NH);
void pt_cpu_attention_backward_bf16_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                            const pt_bf16 *qkv, const float *att, int B, int T,
                                            int C, int NH);
void pt_cpu_layernorm_forward_bf16(pt_bf16 *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C);
void pt_cpu_residual_layernorm_forward(float *residual, float *out, float *mean, float *rstd,
                                       const float *a, const float *b, const float *weight,
                                       const float *bias, int N, int C);
void pt_cpu_residual_layernorm_forward_bf16(float *residual, pt_bf16 *out, float *mean,
                                            float *rstd, const float *a, const float *b,
                                            const float *weight, const float *bias, int N, int C);
void pt_cpu_matmul_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, const pt_bf16 *inp,
                                        const pt_bf16 *weight, const float *bias, int N, int C,
                                        int OC, int ld_out, pt_weight_layout layout);
void pt_cpu_matmul_gelu_backward_bf16(pt_bf16 *dpre, float *scratch, float *dweight, float *dbias,
                                      const pt_bf16 *dout, const pt_bf16 *inp, const pt_bf16 *pre,
                                      const pt_bf16 *weight, int N, int C, int OC,
                                      pt_weight_layout layout);
void pt_cpu_crossentropy_forward_bf16(float *losses, const pt_bf16 *logits, const int32_t *targets,
                                      int N, int V, int ld);
void pt_cpu_crossentropy_forward_backward_bf16(float *losses, pt_bf16 *logits,
                                               const int32_t *targets, int N, int V, int ld,
                                               float dloss);
void pt_cpu_attention_forward_bf16(float *out, float *att, const pt_bf16 *qkv, int B, int T,
                                   int C, int NH);
void pt_cpu_attention_backward_bf16(float *dqkv, const float *dout, const pt_bf16 *qkv,
                                    const float *att, int B, int T, int C, int NH);
void pt_cpu_gelu_forward_bf16(pt_bf16 *out, const pt_bf16 *inp, size_t n);
void pt_cpu_gelu_backward_bf16(float *dinp, const pt_bf16 *inp, const float *dout, size_t n);

/* attention.c */
void pt_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
void pt_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH);

/* elementwise.c */
void pt_cpu_gelu_forward(float *out, const float *inp, size_t n);
void pt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void pt_cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
double pt_cpu_sum_squares(const float *x, size_t n);
double pt_cpu_sum(const float *x, size_t n);
void pt_cpu_scale(float *x, float factor, size_t n);
void pt_cpu_gather(float *out, const float *src, const uint32_t *index, size_t n);
void pt_cpu_scatter(float *dst, const uint32_t *index, const float *values, size_t n);

/* crossentropy.c */
void pt_cpu_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                 int N, int V);
void pt_cpu_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                          int N, int V, float dloss);

/* adam.c */
void pt_cpu_adam_update(float *param, const float *grad, float *m, float *v,
                        const pt_param_region *regions, int n_regions,
                        const pt_adam_coeffs *decayed, const pt_adam_coeffs *plain,
                        float grad_scale);
void pt_cpu_adam_extrapolate(float *out, const float *param, const float *m, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float steps);
void pt_cpu_delay_compensate(float *grad, const float *now, const float *used, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float lambda);
void pt_cpu_secant_compensate(float *grad, const float *now, const float *used, float *prev_grad,
                              float *prev_used, float *num, float *den, const float *v, size_t n,
                              const pt_secant_coeffs *coeffs);

#endif
