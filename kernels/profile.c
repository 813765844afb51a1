#include "kernels/profile.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"

enum {
    K_ENCODER_FWD, K_ENCODER_BWD, K_LAYERNORM_FWD, K_LAYERNORM_BWD, K_LAYERNORM_BWD_BF16,
    K_MATMUL_FWD, K_MATMUL_BWD,
    K_CAST_BF16, K_CAST_FROM_BF16, K_LAYERNORM_FWD_BF16, K_RESIDUAL_LAYERNORM,
    K_RESIDUAL_LAYERNORM_BF16, K_MATMUL_GELU_BWD_BF16, K_MATMUL_BWD_BF16_SET,
    K_ATTENTION_BWD_TO_BF16, K_ATTENTION_FWD_TO_BF16, K_MATMUL_FWD_BF16, K_MATMUL_BWD_BF16,
    K_ATTENTION_FWD, K_ATTENTION_BWD, K_ATTENTION_FWD_BF16, K_ATTENTION_BWD_BF16, K_GELU_FWD,
    K_GELU_BWD, K_GELU_FWD_BF16, K_GELU_BWD_BF16, K_RESIDUAL_FWD, K_XENT_FWD, K_XENT_FWD_BWD,
    K_MATMUL_FWD_TO_BF16, K_XENT_FWD_BF16, K_XENT_FWD_BWD_BF16, K_ADAM, K_ADAM_EXTRAPOLATE,
    K_DELAY_COMPENSATE, K_SECANT_COMPENSATE, K_SUM_SQUARES, K_SUM, K_SCALE, K_ZERO, K_COPY,
    K_GATHER, K_SCATTER,
    K_COUNT
};

/* The name each kernel is reported by, beside its id. */
static const char *const kernel_names[K_COUNT] = {
    [K_ENCODER_FWD] = "encoder_forward",
    [K_ENCODER_BWD] = "encoder_backward",
    [K_LAYERNORM_FWD] = "layernorm_forward",
    [K_LAYERNORM_BWD] = "layernorm_backward",
    [K_LAYERNORM_BWD_BF16] = "layernorm_backward_bf16",
    [K_MATMUL_FWD] = "matmul_forward",
    [K_MATMUL_BWD] = "matmul_backward",
    [K_CAST_BF16] = "cast_to_bf16",
    [K_CAST_FROM_BF16] = "cast_from_bf16",
    [K_LAYERNORM_FWD_BF16] = "layernorm_forward_bf16",
    [K_RESIDUAL_LAYERNORM] = "residual_layernorm_forward",
    [K_RESIDUAL_LAYERNORM_BF16] = "residual_layernorm_forward_bf16",
    [K_MATMUL_GELU_BWD_BF16] = "matmul_gelu_backward_bf16",
    [K_MATMUL_BWD_BF16_SET] = "matmul_backward_bf16_dinp_written",
    [K_ATTENTION_BWD_TO_BF16] = "attention_backward_bf16_to_bf16",
    [K_ATTENTION_FWD_TO_BF16] = "attention_forward_bf16_to_bf16",
    [K_MATMUL_FWD_BF16] = "matmul_forward_bf16",
    [K_MATMUL_BWD_BF16] = "matmul_backward_bf16",
    [K_ATTENTION_FWD] = "attention_forward",
    [K_ATTENTION_BWD] = "attention_backward",
    [K_ATTENTION_FWD_BF16] = "attention_forward_bf16",
    [K_ATTENTION_BWD_BF16] = "attention_backward_bf16",
    [K_GELU_FWD] = "gelu_forward",
    [K_GELU_BWD] = "gelu_backward",
    [K_GELU_FWD_BF16] = "gelu_forward_bf16",
    [K_GELU_BWD_BF16] = "gelu_backward_bf16",
    [K_RESIDUAL_FWD] = "residual_forward",
    [K_XENT_FWD] = "crossentropy_forward",
    [K_XENT_FWD_BWD] = "crossentropy_forward_backward",
    [K_MATMUL_FWD_TO_BF16] = "matmul_forward_bf16_to_bf16",
    [K_XENT_FWD_BF16] = "crossentropy_forward_bf16",
    [K_XENT_FWD_BWD_BF16] = "crossentropy_forward_backward_bf16",
    [K_ADAM] = "adam_update",
    [K_ADAM_EXTRAPOLATE] = "adam_extrapolate",
    [K_DELAY_COMPENSATE] = "delay_compensate",
    [K_SECANT_COMPENSATE] = "secant_compensate",
    [K_SUM_SQUARES] = "sum_squares",
    [K_SUM] = "sum",
    [K_SCALE] = "scale",
    [K_ZERO] = "zero",
    [K_COPY] = "copy",
    [K_GATHER] = "gather",
    [K_SCATTER] = "scatter",
};

static const pt_kernels *inner;
static pt_kernels profiled;
static double seconds[K_COUNT];
static long calls[K_COUNT];
static double traffic[K_COUNT]; /* bytes: pt_kernel_time.bytes */
static double work[K_COUNT];    /* floating-point operations: pt_kernel_time.flops */

#define PRODUCT_SHAPES 64
static pt_product_time products[PRODUCT_SHAPES];
static int n_products;

/* Adds one call of product entry `id` on [N, C] → [N, OC] to its shape's totals. */
static void count_product(int id, int N, int C, int OC, double flops, double spent)
{
    pt_product_time *p = products;
    while (p < products + n_products &&
           (p->name != kernel_names[id] || p->N != N || p->C != C || p->OC != OC))
        p++;
    if (p == products + PRODUCT_SHAPES) return; /* a 65th shape: in the per-kernel totals only */
    if (p == products + n_products) {
        *p = (pt_product_time){.name = kernel_names[id], .N = N, .C = C, .OC = OC};
        n_products++;
    }
    p->seconds += spent;
    p->flops += flops;
    p->calls++;
}

/* The operations of `made` products of [N, C] by [C, OC]. */
static double product_flops(int made, int N, int C, int OC)
{
    return 2.0 * made * (double)N * (double)C * (double)OC;
}

/* Times one call of the inner kernel; the synchronize makes the time the
 * kernel's own on an asynchronous backend. */
#define TIMED(id, call)                                                                            \
    do {                                                                                           \
        inner->synchronize();                                                                      \
        double started_ = pt_now_s();                                                              \
        call;                                                                                      \
        inner->synchronize();                                                                      \
        seconds[id] += pt_now_s() - started_;                                                      \
        calls[id]++;                                                                               \
    } while (0)

/* TIMED, with the call's least memory traffic (bytes: each input read once, each output
 * written once, what it adds into read and written; small vectors such as a layernorm's weight
 * left out) or its operations counted */
#define TIMED_BYTES(id, bytes, call)                                                               \
    do {                                                                                           \
        TIMED(id, call);                                                                           \
        traffic[id] += (double)(bytes);                                                            \
    } while (0)
#define TIMED_FLOPS(id, flops, call)                                                               \
    do {                                                                                           \
        TIMED(id, call);                                                                           \
        work[id] += (double)(flops);                                                               \
    } while (0)

/* Causal attention's products over [B, T] with C channels: the forward's q·kᵀ and P·v,
 * 2·T²·C a sequence each, half of it masked; the backward's five (S again, dP, dv, dq, dk). */
static double attention_flops(int B, int T, int C, bool backward)
{
    const double one = 2.0 * B * (double)T * T * C / 2;
    return (backward ? 5 : 2) * one;
}

/* TIMED, and the call counted by its shape and the products it made */
#define TIMED_PRODUCT(id, N, C, OC, made, call)                                                    \
    do {                                                                                           \
        const double before_ = seconds[id];                                                        \
        TIMED(id, call);                                                                           \
        count_product(id, N, C, OC, product_flops(made, N, C, OC), seconds[id] - before_);         \
    } while (0)

static void p_zero(void *p, size_t n) { TIMED_BYTES(K_ZERO, n, inner->zero(p, n)); }
static void p_copy(void *d, const void *s, size_t n)
{
    TIMED_BYTES(K_COPY, 2.0 * n, inner->copy(d, s, n));
}
static void p_encoder_forward(float *o, const int32_t *t, const float *wte, const float *wpe,
                              int B, int T, int C)
{
    TIMED_BYTES(K_ENCODER_FWD, 8.0 * B * T * C + 4.0 * T * C,
                inner->encoder_forward(o, t, wte, wpe, B, T, C));
}
static void p_encoder_backward(float *dwte, float *dwpe, const float *d, const int32_t *t, int B,
                               int T, int C)
{
    TIMED_BYTES(K_ENCODER_BWD, 12.0 * B * T * C + 8.0 * T * C,
                inner->encoder_backward(dwte, dwpe, d, t, B, T, C));
}
static void p_layernorm_forward(float *o, float *m, float *r, const float *i, const float *w,
                                const float *b, int N, int C)
{
    TIMED_BYTES(K_LAYERNORM_FWD, 8.0 * N * C, inner->layernorm_forward(o, m, r, i, w, b, N, C));
}
static void p_layernorm_backward(float *di, float *dw, float *db, const float *d, const float *i,
                                 const float *w, const float *m, const float *r, int N, int C)
{
    TIMED_BYTES(K_LAYERNORM_BWD, 16.0 * N * C,
                inner->layernorm_backward(di, dw, db, d, i, w, m, r, N, C));
}
static void p_layernorm_backward_bf16(float *di, pt_bf16 *d16, float *dw, float *db,
                                      const float *d, const float *i, const float *w,
                                      const float *m, const float *r, int N, int C)
{
    TIMED_BYTES(K_LAYERNORM_BWD_BF16, 18.0 * N * C,
                inner->layernorm_backward_bf16(di, d16, dw, db, d, i, w, m, r, N, C));
}
static void p_matmul_forward(float *o, const float *i, const float *w, const float *b, int N,
                             int C, int OC, pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_FWD, N, C, OC, 1, inner->matmul_forward(o, i, w, b, N, C, OC, l));
}
static void p_matmul_backward(float *di, float *dw, float *db, const float *d, const float *i,
                              const float *w, int N, int C, int OC, pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_BWD, N, C, OC, !!di + !!dw,
                  inner->matmul_backward(di, dw, db, d, i, w, N, C, OC, l));
}
static void p_cast_to_bf16(pt_bf16 *o, const float *i, size_t n)
{
    TIMED_BYTES(K_CAST_BF16, 6.0 * n, inner->cast_to_bf16(o, i, n));
}
static void p_cast_from_bf16(float *o, const pt_bf16 *i, size_t n)
{
    TIMED_BYTES(K_CAST_FROM_BF16, 6.0 * n, inner->cast_from_bf16(o, i, n));
}
static void p_matmul_backward_bf16_dinp_written(float *di, float *dw, float *db,
                                                const pt_bf16 *d, const pt_bf16 *i,
                                                const pt_bf16 *w, int N, int C, int OC, int ld,
                                                pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_BWD_BF16_SET, N, C, OC, !!di + !!dw,
                  inner->matmul_backward_bf16_dinp_written(di, dw, db, d, i, w, N, C, OC, ld, l));
}
static void p_attention_forward_bf16_to_bf16(pt_bf16 *o, float *x, float *a, const pt_bf16 *q,
                                             int B, int T, int C, int NH)
{
    TIMED_FLOPS(K_ATTENTION_FWD_TO_BF16, attention_flops(B, T, C, false),
                inner->attention_forward_bf16_to_bf16(o, x, a, q, B, T, C, NH));
}
static void p_attention_backward_bf16_to_bf16(pt_bf16 *dq, float *x, const float *d,
                                              const pt_bf16 *q, const float *a, int B, int T,
                                              int C, int NH)
{
    TIMED_FLOPS(K_ATTENTION_BWD_TO_BF16, attention_flops(B, T, C, true),
                inner->attention_backward_bf16_to_bf16(dq, x, d, q, a, B, T, C, NH));
}
static void p_layernorm_forward_bf16(pt_bf16 *o, float *m, float *r, const float *i,
                                     const float *w, const float *b, int N, int C)
{
    TIMED_BYTES(K_LAYERNORM_FWD_BF16, 6.0 * N * C,
                inner->layernorm_forward_bf16(o, m, r, i, w, b, N, C));
}
static void p_residual_layernorm_forward(float *x, float *o, float *m, float *r, const float *a,
                                         const float *b, const float *w, const float *bi, int N,
                                         int C)
{
    TIMED_BYTES(K_RESIDUAL_LAYERNORM, 16.0 * N * C,
                inner->residual_layernorm_forward(x, o, m, r, a, b, w, bi, N, C));
}
static void p_residual_layernorm_forward_bf16(float *x, pt_bf16 *o, float *m, float *r,
                                              const float *a, const float *b, const float *w,
                                              const float *bi, int N, int C)
{
    TIMED_BYTES(K_RESIDUAL_LAYERNORM_BF16, 14.0 * N * C,
                inner->residual_layernorm_forward_bf16(x, o, m, r, a, b, w, bi, N, C));
}
static void p_matmul_forward_bf16(float *o, const pt_bf16 *i, const pt_bf16 *w, const float *b,
                                  int N, int C, int OC, pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_FWD_BF16, N, C, OC, 1,
                  inner->matmul_forward_bf16(o, i, w, b, N, C, OC, l));
}
static void p_matmul_backward_bf16(float *di, float *dw, float *db, const pt_bf16 *d,
                                   const pt_bf16 *i, const pt_bf16 *w, int N, int C, int OC,
                                   pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_BWD_BF16, N, C, OC, !!di + !!dw,
                  inner->matmul_backward_bf16(di, dw, db, d, i, w, N, C, OC, l));
}
static void p_attention_forward(float *o, float *a, const float *q, int B, int T, int C, int NH)
{
    TIMED_FLOPS(K_ATTENTION_FWD, attention_flops(B, T, C, false),
                inner->attention_forward(o, a, q, B, T, C, NH));
}
static void p_attention_backward(float *dq, const float *d, const float *q, const float *a, int B,
                                 int T, int C, int NH)
{
    TIMED_FLOPS(K_ATTENTION_BWD, attention_flops(B, T, C, true),
                inner->attention_backward(dq, d, q, a, B, T, C, NH));
}
static void p_attention_forward_bf16(float *o, float *a, const pt_bf16 *q, int B, int T, int C,
                                     int NH)
{
    TIMED_FLOPS(K_ATTENTION_FWD_BF16, attention_flops(B, T, C, false),
                inner->attention_forward_bf16(o, a, q, B, T, C, NH));
}
static void p_attention_backward_bf16(float *dq, const float *d, const pt_bf16 *q, const float *a,
                                      int B, int T, int C, int NH)
{
    TIMED_FLOPS(K_ATTENTION_BWD_BF16, attention_flops(B, T, C, true),
                inner->attention_backward_bf16(dq, d, q, a, B, T, C, NH));
}
static void p_gelu_forward_bf16(pt_bf16 *o, const pt_bf16 *i, size_t n)
{
    TIMED_BYTES(K_GELU_FWD_BF16, 4.0 * n, inner->gelu_forward_bf16(o, i, n));
}
static void p_gelu_backward_bf16(float *di, const pt_bf16 *i, const float *d, size_t n)
{
    TIMED_BYTES(K_GELU_BWD_BF16, 14.0 * n, inner->gelu_backward_bf16(di, i, d, n));
}
static void p_gelu_forward(float *o, const float *i, size_t n)
{
    TIMED_BYTES(K_GELU_FWD, 8.0 * n, inner->gelu_forward(o, i, n));
}
static void p_gelu_backward(float *di, const float *i, const float *d, size_t n)
{
    TIMED_BYTES(K_GELU_BWD, 16.0 * n, inner->gelu_backward(di, i, d, n));
}
static void p_residual_forward(float *o, const float *a, const float *b, size_t n)
{
    TIMED_BYTES(K_RESIDUAL_FWD, 12.0 * n, inner->residual_forward(o, a, b, n));
}
static void p_crossentropy_forward(float *l, const float *x, const int32_t *t, int N, int V)
{
    TIMED_BYTES(K_XENT_FWD, 4.0 * N * V, inner->crossentropy_forward(l, x, t, N, V));
}
static void p_crossentropy_forward_backward(float *l, float *x, const int32_t *t, int N, int V,
                                            float d)
{
    TIMED_BYTES(K_XENT_FWD_BWD, 8.0 * N * V,
                inner->crossentropy_forward_backward(l, x, t, N, V, d));
}
static void p_matmul_forward_bf16_to_bf16(pt_bf16 *o, float *x, const pt_bf16 *i,
                                          const pt_bf16 *w, const float *b, int N, int C, int OC,
                                          int ld, pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_FWD_TO_BF16, N, C, OC, 1,
                  inner->matmul_forward_bf16_to_bf16(o, x, i, w, b, N, C, OC, ld, l));
}
static void p_matmul_gelu_backward_bf16(pt_bf16 *dp, float *x, float *dw, float *db,
                                        const pt_bf16 *d, const pt_bf16 *i, const pt_bf16 *p,
                                        const pt_bf16 *w, int N, int C, int OC, pt_weight_layout l)
{
    TIMED_PRODUCT(K_MATMUL_GELU_BWD_BF16, N, C, OC, 1 + !!dw,
                  inner->matmul_gelu_backward_bf16(dp, x, dw, db, d, i, p, w, N, C, OC, l));
}
static void p_crossentropy_forward_bf16(float *l, const pt_bf16 *x, const int32_t *t, int N, int V,
                                        int ld)
{
    TIMED_BYTES(K_XENT_FWD_BF16, 2.0 * N * V,
                inner->crossentropy_forward_bf16(l, x, t, N, V, ld));
}
static void p_crossentropy_forward_backward_bf16(float *l, pt_bf16 *x, const int32_t *t, int N,
                                                 int V, int ld, float d)
{
    TIMED_BYTES(K_XENT_FWD_BWD_BF16, 4.0 * N * V,
                inner->crossentropy_forward_backward_bf16(l, x, t, N, V, ld, d));
}
static double region_elements(const pt_param_region *r, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++) total += (double)r[i].numel;
    return total;
}
static void p_adam_update(float *p, const float *g, float *m, float *v, const pt_param_region *r,
                          int nr, const pt_adam_coeffs *c, const pt_adam_coeffs *c0, float s)
{
    TIMED_BYTES(K_ADAM, 28.0 * region_elements(r, nr),
                inner->adam_update(p, g, m, v, r, nr, c, c0, s));
}
static void p_adam_extrapolate(float *o, const float *p, const float *m, const float *v,
                               size_t n, const pt_adam_coeffs *c, float steps)
{
    TIMED_BYTES(K_ADAM_EXTRAPOLATE, 16.0 * n, inner->adam_extrapolate(o, p, m, v, n, c, steps));
}
static void p_delay_compensate(float *g, const float *now, const float *used, const float *v,
                               size_t n, const pt_adam_coeffs *c, float lambda)
{
    TIMED_BYTES(K_DELAY_COMPENSATE, 20.0 * n,
                inner->delay_compensate(g, now, used, v, n, c, lambda));
}
static void p_secant_compensate(float *g, const float *now, const float *used, float *pg, float *pu,
                                float *num, float *den, const float *v, size_t n,
                                const pt_secant_coeffs *c)
{
    TIMED_BYTES(K_SECANT_COMPENSATE, 52.0 * n,
                inner->secant_compensate(g, now, used, pg, pu, num, den, v, n, c));
}
static double p_sum_squares(const float *x, size_t n)
{
    double r;
    TIMED_BYTES(K_SUM_SQUARES, 4.0 * n, r = inner->sum_squares(x, n));
    return r;
}
static double p_sum(const float *x, size_t n)
{
    double r;
    TIMED_BYTES(K_SUM, 4.0 * n, r = inner->sum(x, n));
    return r;
}
static void p_scale(float *x, float f, size_t n) { TIMED_BYTES(K_SCALE, 8.0 * n, inner->scale(x, f, n)); }
static void p_gather(float *out, const float *src, const uint32_t *index, size_t n)
{
    TIMED_BYTES(K_GATHER, 12.0 * n, inner->gather(out, src, index, n));
}
static void p_scatter(float *dst, const uint32_t *index, const float *values, size_t n)
{
    TIMED_BYTES(K_SCATTER, 12.0 * n, inner->scatter(dst, index, values, n));
}

void pt_kernel_profile_reset(void)
{
    memset(seconds, 0, sizeof seconds);
    memset(calls, 0, sizeof calls);
    memset(traffic, 0, sizeof traffic);
    memset(work, 0, sizeof work);
    n_products = 0;
}

const pt_kernels *pt_kernels_profiled(const pt_kernels *wrapped)
{
    inner = wrapped;
    profiled = *wrapped; /* memory management passes straight through */
    profiled.zero = p_zero;
    profiled.copy = p_copy;
    profiled.encoder_forward = p_encoder_forward;
    profiled.encoder_backward = p_encoder_backward;
    profiled.layernorm_forward = p_layernorm_forward;
    profiled.layernorm_backward = p_layernorm_backward;
    profiled.layernorm_backward_bf16 = p_layernorm_backward_bf16;
    profiled.matmul_forward = p_matmul_forward;
    profiled.matmul_backward = p_matmul_backward;
    profiled.cast_to_bf16 = p_cast_to_bf16;
    profiled.cast_from_bf16 = p_cast_from_bf16;
    profiled.matmul_gelu_backward_bf16 = p_matmul_gelu_backward_bf16;
    profiled.residual_layernorm_forward = p_residual_layernorm_forward;
    profiled.residual_layernorm_forward_bf16 = p_residual_layernorm_forward_bf16;
    profiled.attention_forward_bf16_to_bf16 = p_attention_forward_bf16_to_bf16;
    profiled.attention_backward_bf16_to_bf16 = p_attention_backward_bf16_to_bf16;
    profiled.matmul_backward_bf16_dinp_written = p_matmul_backward_bf16_dinp_written;
    profiled.layernorm_forward_bf16 = p_layernorm_forward_bf16;
    profiled.matmul_forward_bf16 = p_matmul_forward_bf16;
    profiled.matmul_backward_bf16 = p_matmul_backward_bf16;
    profiled.attention_forward = p_attention_forward;
    profiled.attention_backward = p_attention_backward;
    profiled.gelu_forward = p_gelu_forward;
    profiled.gelu_backward = p_gelu_backward;
    profiled.attention_forward_bf16 = p_attention_forward_bf16;
    profiled.attention_backward_bf16 = p_attention_backward_bf16;
    profiled.gelu_forward_bf16 = p_gelu_forward_bf16;
    profiled.gelu_backward_bf16 = p_gelu_backward_bf16;
    profiled.residual_forward = p_residual_forward;
    profiled.crossentropy_forward = p_crossentropy_forward;
    profiled.crossentropy_forward_backward = p_crossentropy_forward_backward;
    profiled.matmul_forward_bf16_to_bf16 = p_matmul_forward_bf16_to_bf16;
    profiled.crossentropy_forward_bf16 = p_crossentropy_forward_bf16;
    profiled.crossentropy_forward_backward_bf16 = p_crossentropy_forward_backward_bf16;
    profiled.adam_update = p_adam_update;
    /* optional: a backend without it stays without it (callers test for NULL) */
    profiled.adam_extrapolate = wrapped->adam_extrapolate ? p_adam_extrapolate : NULL;
    profiled.delay_compensate = wrapped->delay_compensate ? p_delay_compensate : NULL;
    profiled.secant_compensate = wrapped->secant_compensate ? p_secant_compensate : NULL;
    profiled.sum_squares = p_sum_squares;
    profiled.sum = p_sum;
    profiled.scale = p_scale;
    profiled.gather = p_gather;
    profiled.scatter = p_scatter;
    pt_kernel_profile_reset();
    return &profiled;
}

static int by_time_desc(const void *a, const void *b)
{
    double x = ((const pt_kernel_time *)a)->seconds, y = ((const pt_kernel_time *)b)->seconds;
    return (x < y) - (x > y);
}

int pt_kernel_profile_read(pt_kernel_time *out, int capacity)
{
    pt_kernel_time all[K_COUNT];
    int n = 0;
    for (int k = 0; k < K_COUNT; k++)
        if (calls[k])
            all[n++] = (pt_kernel_time){kernel_names[k], seconds[k], calls[k], traffic[k], work[k]};
    qsort(all, (size_t)n, sizeof all[0], by_time_desc);
    if (n > capacity) n = capacity;
    memcpy(out, all, (size_t)n * sizeof all[0]);
    return n;
}

static int by_product_time_desc(const void *a, const void *b)
{
    double x = ((const pt_product_time *)a)->seconds, y = ((const pt_product_time *)b)->seconds;
    return (x < y) - (x > y);
}

int pt_kernel_profile_products(pt_product_time *out, int capacity)
{
    pt_product_time all[PRODUCT_SHAPES];
    memcpy(all, products, (size_t)n_products * sizeof all[0]);
    qsort(all, (size_t)n_products, sizeof all[0], by_product_time_desc);
    const int n = n_products < capacity ? n_products : capacity;
    memcpy(out, all, (size_t)n * sizeof all[0]);
    return n;
}
