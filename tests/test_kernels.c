/* The CPU kernels against independent references: every backward against
 * central finite differences of its own forward, forwards against naive
 * loops in double, and the accumulation rule of kernels.h (a backward ADDS
 * into its gradients, so calling it twice doubles them).
 *
 * Finite differences: f = Σ w ⊙ forward(x) for a random upstream gradient w,
 * accumulated in double from the float outputs; ∂f/∂x_i ≈ (f(x+h) − f(x−h)) /
 * (2h) with h = 2e-3 (the step actually taken after rounding x ± h to float;
 * smaller steps drown in the float rounding of the outputs).
 * Tolerance: |analytic − numeric| ≤ 1e-2·max(|analytic|, |numeric|) + 2e-4. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/adam_batch.h"
#include "kernels/cuda/row_parts.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "tests/kernel_checks.h"
#include "tests/kernel_table.h"
#include "tests/random_data.h"

#define FD_STEP 2e-3f
#define FD_REL_TOL 1e-2
#define FD_ABS_TOL 2e-4
#define FD_CHECKS 16 /* elements checked per gradient */

/* ---- helpers --------------------------------------------------------------- */

static const pt_kernels *cpu(void) { return pt_kernels_cpu(); }

static double weighted_sum(const float *w, const float *y, size_t n)
{
    double f = 0;
    for (size_t i = 0; i < n; i++) f += (double)w[i] * (double)y[i];
    return f;
}

/* Checks analytic[i] = ∂objective/∂x[i] at the given indices of x (x is
 * perturbed and restored). At least one checked derivative must be clearly
 * non-zero, so an all-zero gradient cannot pass by accident. */
static void check_gradient_at(const char *what, float *x, const float *analytic,
                              const size_t *indices, int count, double (*objective)(void *ctx),
                              void *ctx)
{
    double largest = 0;
    for (int c = 0; c < count; c++) {
        size_t i = indices[c];
        float saved = x[i], up = saved + FD_STEP, down = saved - FD_STEP;
        x[i] = up;
        double f_up = objective(ctx);
        x[i] = down;
        double f_down = objective(ctx);
        x[i] = saved;
        double numeric = (f_up - f_down) / ((double)up - (double)down);
        double a = analytic[i], tol = FD_REL_TOL * fmax(fabs(a), fabs(numeric)) + FD_ABS_TOL;
        cr_expect(fabs(a - numeric) <= tol,
                  "%s[%zu]: analytic %.7g, finite difference %.7g (difference %.3g > %.3g)",
                  what, i, a, numeric, fabs(a - numeric), tol);
        largest = fmax(largest, fabs(numeric));
    }
    cr_expect(largest > 100 * FD_ABS_TOL,
              "%s: every checked derivative is ~0 (largest %.3g): the check proves nothing", what,
              largest);
}

/* The same at FD_CHECKS indices spread over x[n] (all of them if n is small). */
static void check_gradient(const char *what, float *x, const float *analytic, size_t n,
                           double (*objective)(void *ctx), void *ctx)
{
    size_t indices[FD_CHECKS];
    int count = n < FD_CHECKS ? (int)n : FD_CHECKS;
    for (int c = 0; c < count; c++) {
        size_t stride = n / (size_t)count;
        indices[c] = (size_t)c * stride + (size_t)(c * 7) % stride; /* wander inside each stride */
    }
    check_gradient_at(what, x, analytic, indices, count, objective, ctx);
}

/* ---- the table ------------------------------------------------------------- */

/* The cpu table, the guarded one over it and the profiling wrapper pass every entry on. */
Test(kernels, cpu_tables_are_complete)
{
    const pt_kernels *k = cpu(), *guarded;
    cr_assert_str_eq(k->name, "cpu");
    expect_a_complete_table(k);
    cr_assert_eq(pt_kernels_for_device(PT_DEVICE_CPU_GUARDED, &guarded), PIPERT_OK);
    expect_a_complete_table(guarded);
    expect_a_complete_table(pt_kernels_profiled(k));
}

/* The profile's traffic and operations: a layernorm's least traffic (its input read, its output
 * written: 8 bytes an element in fp32), Adam's (θ, g, m, v read, θ, m, v written: 28 bytes a
 * parameter), causal attention's operations (2 of the forward's products of 2·T²·C a sequence,
 * half masked), each summed over its calls; kernels it does not count show 0. */
Test(kernels, profile_counts_traffic_and_attention_operations)
{
    const pt_kernels *k = pt_kernels_profiled(cpu());
    const int N = 6, C = 8, B = 2, T = 5, NH = 2;
    float *x = random_floats((size_t)N * C, -1, 1), *out = calloc((size_t)N * C, 4);
    float *w = random_floats(C, -1, 1), *b = random_floats(C, -1, 1);
    float *mean = calloc(N, 4), *rstd = calloc(N, 4);
    for (int i = 0; i < 2; i++) k->layernorm_forward(out, mean, rstd, x, w, b, N, C);
    float *qkv = random_floats((size_t)B * T * 3 * C, -1, 1), *o = calloc((size_t)B * T * C, 4);
    float *att = calloc(cpu()->attention_saved_floats(B, T, C, NH), 4);
    k->attention_forward(o, att, qkv, B, T, C, NH);
    float *p = random_floats(10, -1, 1), *g = random_floats(10, -1, 1), *m = calloc(10, 4),
          *v = calloc(10, 4);
    const pt_param_region regions[] = {{.offset = 0, .numel = 4}, {.offset = 4, .numel = 6}};
    const pt_adam_coeffs c = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .bias2 = 1, .decay = 1};
    k->adam_update(p, g, m, v, regions, 2, &c, &c, 1.0f);
    pt_kernel_time t[8];
    const int n = pt_kernel_profile_read(t, 8);
    int seen = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(t[i].name, "layernorm_forward")) {
            cr_expect_eq(t[i].bytes, 2 * 8.0 * N * C, "layernorm: %g bytes", t[i].bytes);
            cr_expect_eq(t[i].flops, 0);
            seen |= 1;
        } else if (!strcmp(t[i].name, "attention_forward")) {
            cr_expect_eq(t[i].flops, 2 * (2.0 * B * T * T * C / 2), "attention: %g", t[i].flops);
            seen |= 2;
        } else if (!strcmp(t[i].name, "adam_update")) {
            cr_expect_eq(t[i].bytes, 28.0 * 10, "adam: %g bytes", t[i].bytes);
            seen |= 4;
        }
    }
    cr_expect_eq(seen, 7, "the three kernels profiled (%d)", seen);
    free(x), free(out), free(w), free(b), free(mean), free(rstd), free(qkv), free(o), free(att);
    free(p), free(g), free(m), free(v);
}

/* The profile's products by shape: each shape once with its calls, and the operations of the
 * products each call made (2·N·C·OC apiece: a forward 1, a backward 1 for dinp and 1 for
 * dweight), the result still the wrapped table's. */
Test(kernels, profile_counts_products_by_shape)
{
    const pt_kernels *k = pt_kernels_profiled(cpu());
    const int N = 6, C = 5, OC = 7;
    float *inp = random_floats((size_t)N * C, -1, 1), *w = random_floats((size_t)C * OC, -1, 1);
    float *out = calloc((size_t)2 * N * OC, 4), *want = calloc((size_t)2 * N * OC, 4);
    float *dinp = calloc((size_t)N * C, 4), *dw = calloc((size_t)C * OC, 4);
    for (int i = 0; i < 3; i++) k->matmul_forward(out, inp, w, NULL, N, C, OC, PT_WEIGHT_IN_OUT);
    k->matmul_forward(out, inp, w, NULL, 2 * N, C / 2, OC, PT_WEIGHT_IN_OUT);
    k->matmul_backward(dinp, dw, NULL, out, inp, w, N, C, OC, PT_WEIGHT_IN_OUT);
    k->matmul_backward(NULL, dw, NULL, out, inp, w, N, C, OC, PT_WEIGHT_IN_OUT);
    cpu()->matmul_forward(want, inp, w, NULL, 2 * N, C / 2, OC, PT_WEIGHT_IN_OUT);
    cr_expect_eq(memcmp(out, want, (size_t)2 * N * OC * 4), 0, "the wrapped table's result");

    pt_product_time p[8];
    const int n = pt_kernel_profile_products(p, 8);
    cr_assert_eq(n, 3, "3 shapes: the forward at two, the backward at one; got %d", n);
    const double one = 2.0 * N * C * OC;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(p[i].name, "matmul_forward") && p[i].N == N) {
            cr_expect(p[i].calls == 3 && p[i].flops == 3 * one, "forward: %ld calls, %g flops",
                      p[i].calls, p[i].flops);
            seen |= 1;
        } else if (!strcmp(p[i].name, "matmul_forward")) {
            cr_expect(p[i].N == 2 * N && p[i].C == C / 2 && p[i].calls == 1, "the other forward");
            seen |= 2;
        } else if (!strcmp(p[i].name, "matmul_backward")) {
            cr_expect(p[i].calls == 2 && p[i].flops == 3 * one, "backward: %ld calls, %g flops "
                      "(dinp and dweight, then dweight)", p[i].calls, p[i].flops);
            seen |= 4;
        }
        if (i > 0) cr_expect(p[i - 1].seconds >= p[i].seconds, "largest time first");
    }
    cr_expect_eq(seen, 7, "every shape reported");
    pt_kernel_profile_reset();
    cr_expect_eq(pt_kernel_profile_products(p, 8), 0, "reset");
    free(inp), free(w), free(out), free(want), free(dinp), free(dw);
}

Test(kernels, memory_is_zeroed_aligned_and_copies)
{
    const pt_kernels *k = cpu();
    float *a = NULL, *b = NULL;
    cr_assert_eq(k->alloc((void **)&a, 100 * sizeof(float), "test a"), PIPERT_OK);
    cr_assert_eq(k->alloc((void **)&b, 100 * sizeof(float), "test b"), PIPERT_OK);
    cr_expect_eq((uintptr_t)a % 64, 0, "allocation not 64-byte aligned");
    for (int i = 0; i < 100; i++) cr_expect_eq(a[i], 0.0f, "alloc is not zero-filled at %d", i);
    float host[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i;
    k->copy_to_device(a, host, sizeof host);
    k->copy(b, a, sizeof host);
    float back[100];
    k->copy_to_host(back, b, sizeof back);
    for (int i = 0; i < 100; i++) cr_expect_eq(back[i], (float)i, "copy lost element %d", i);
    k->zero(b, sizeof host);
    k->synchronize();
    for (int i = 0; i < 100; i++) cr_expect_eq(b[i], 0.0f, "zero missed element %d", i);
    k->free(a);
    k->free(b);
}

Test(kernels, cuda_stub_fails_cleanly)
{
    const pt_kernels *cuda = (const pt_kernels *)1;
    pipert_result rc = pt_kernels_cuda(&cuda);
    if (rc == PIPERT_OK) {
        cr_expect(cuda != NULL && !strcmp(cuda->name, "cuda"));
    } else {
        cr_expect(rc == PIPERT_ERR_UNSUPPORTED || rc == PIPERT_ERR_NO_DEVICE, "result %d", rc);
        cr_expect_null(cuda, "*out must be NULL on failure");
        cr_expect(strstr(pipert_last_error(), "CUDA") != NULL, "message: %s", pipert_last_error());
    }
}

/* ---- encoder --------------------------------------------------------------- */

enum { B = 2, T = 5, C = 8, NH = 2, V = 11, N = B * T };

typedef struct encoder_problem {
    int32_t tokens[N];
    float *wte, *wpe, *w, *out; /* [V,C], [T,C], [N,C], [N,C] */
} encoder_problem;

static double encoder_objective(void *ctx)
{
    encoder_problem *p = ctx;
    cpu()->encoder_forward(p->out, p->tokens, p->wte, p->wpe, B, T, C);
    return weighted_sum(p->w, p->out, N * C);
}

Test(kernels, encoder_forward_and_gradients)
{
    encoder_problem p = {.wte = random_floats(V * C, -1, 1), .wpe = random_floats(T * C, -1, 1),
                         .w = random_floats(N * C, -1, 1), .out = zero_floats(N * C)};
    for (int n = 0; n < N; n++) p.tokens[n] = (int32_t)(uniform(0, V) * 0.999);
    p.tokens[7] = p.tokens[2]; /* a repeated token: its gradient rows must add up */

    encoder_objective(&p);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            cr_assert_eq(p.out[n * C + c], p.wte[p.tokens[n] * C + c] + p.wpe[(n % T) * C + c],
                         "out[%d][%d]", n, c);

    float *dwte = zero_floats(V * C), *dwpe = zero_floats(T * C);
    cpu()->encoder_backward(dwte, dwpe, p.w, p.tokens, B, T, C);
    check_gradient("encoder dwte", p.wte, dwte, V * C, encoder_objective, &p);
    check_gradient("encoder dwpe", p.wpe, dwpe, T * C, encoder_objective, &p);

    float *dwte1 = copy_floats(dwte, V * C), *dwpe1 = copy_floats(dwpe, T * C);
    cpu()->encoder_backward(dwte, dwpe, p.w, p.tokens, B, T, C);
    check_doubled("encoder dwte", dwte1, dwte, V * C);
    check_doubled("encoder dwpe", dwpe1, dwpe, T * C);
}

/* ---- layernorm ------------------------------------------------------------- */

typedef struct layernorm_problem {
    float *inp, *weight, *bias, *w; /* [N,C], [C], [C], [N,C] */
    float *out, *mean, *rstd;       /* [N,C], [N], [N] */
} layernorm_problem;

static double layernorm_objective(void *ctx)
{
    layernorm_problem *p = ctx;
    cpu()->layernorm_forward(p->out, p->mean, p->rstd, p->inp, p->weight, p->bias, N, C);
    return weighted_sum(p->w, p->out, N * C);
}

Test(kernels, layernorm_forward_matches_definition)
{
    layernorm_problem p = {.inp = random_floats(N * C, -2, 3), .weight = random_floats(C, 0.5, 1.5),
                           .bias = random_floats(C, -1, 1), .w = random_floats(N * C, -1, 1),
                           .out = zero_floats(N * C), .mean = zero_floats(N),
                           .rstd = zero_floats(N)};
    layernorm_objective(&p);
    for (int n = 0; n < N; n++) {
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++) mu += p.inp[n * C + c] / (double)C;
        for (int c = 0; c < C; c++) var += pow(p.inp[n * C + c] - mu, 2) / C;
        double rstd = 1 / sqrt(var + 1e-5), expected[C];
        for (int c = 0; c < C; c++)
            expected[c] = (p.inp[n * C + c] - mu) * rstd * p.weight[c] + p.bias[c];
        check_close("layernorm out", p.out + n * C, expected, C, 1e-5, 1e-5);
        cr_expect(fabs(p.mean[n] - mu) < 1e-6 && fabs(p.rstd[n] - rstd) < 1e-5 * rstd,
                  "row %d: mean %g rstd %g, expected %g %g", n, p.mean[n], p.rstd[n], mu, rstd);
    }
}

Test(kernels, layernorm_gradients)
{
    layernorm_problem p = {.inp = random_floats(N * C, -2, 2), .weight = random_floats(C, 0.5, 1.5),
                           .bias = random_floats(C, -1, 1), .w = random_floats(N * C, -1, 1),
                           .out = zero_floats(N * C), .mean = zero_floats(N),
                           .rstd = zero_floats(N)};
    layernorm_objective(&p);
    float *dinp = zero_floats(N * C), *dweight = zero_floats(C), *dbias = zero_floats(C);
    cpu()->layernorm_backward(dinp, dweight, dbias, p.w, p.inp, p.weight, p.mean, p.rstd, N, C);
    check_gradient("layernorm dinp", p.inp, dinp, N * C, layernorm_objective, &p);
    check_gradient("layernorm dweight", p.weight, dweight, C, layernorm_objective, &p);
    check_gradient("layernorm dbias", p.bias, dbias, C, layernorm_objective, &p);

    float *dinp1 = copy_floats(dinp, N * C), *dweight1 = copy_floats(dweight, C),
          *dbias1 = copy_floats(dbias, C);
    layernorm_objective(&p); /* the mean and rstd of the unperturbed input */
    cpu()->layernorm_backward(dinp, dweight, dbias, p.w, p.inp, p.weight, p.mean, p.rstd, N, C);
    check_doubled("layernorm dinp", dinp1, dinp, N * C);
    check_doubled("layernorm dweight", dweight1, dweight, C);
    check_doubled("layernorm dbias", dbias1, dbias, C);
}

/* The residual stream's sum and the layernorm after it in one call: the bits of the two kernels
 * in turn, also with the sum written over its first addend (as the model calls it). */
Test(kernels, residual_layernorm_is_the_sum_then_the_layernorm)
{
    const int rows = 11, width = 70;
    const size_t n = (size_t)rows * width;
    float *a = random_floats(n, -2, 3), *b = random_floats(n, -1, 1);
    float *w = random_floats(width, 0.5, 1.5), *bias = random_floats(width, -1, 1);
    float *sum = zero_floats(n), *out = zero_floats(n), *mean = zero_floats(rows),
          *rstd = zero_floats(rows);
    float *residual = copy_floats(a, n), *fused = zero_floats(n), *fused_mean = zero_floats(rows),
          *fused_rstd = zero_floats(rows);
    cpu()->residual_forward(sum, a, b, n);
    cpu()->layernorm_forward(out, mean, rstd, sum, w, bias, rows, width);
    cpu()->residual_layernorm_forward(residual, fused, fused_mean, fused_rstd, residual, b, w, bias,
                                      rows, width);
    cr_expect_eq(memcmp(residual, sum, n * sizeof *sum), 0, "the residual: a + b");
    cr_expect_eq(memcmp(fused, out, n * sizeof *out), 0, "the layernorm of a + b");
    cr_expect_eq(memcmp(fused_mean, mean, rows * sizeof *mean), 0, "mean");
    cr_expect_eq(memcmp(fused_rstd, rstd, rows * sizeof *rstd), 0, "rstd");
    free(a), free(b), free(w), free(bias), free(sum), free(out), free(mean), free(rstd);
    free(residual), free(fused), free(fused_mean), free(fused_rstd);
}

/* ---- matmul ---------------------------------------------------------------- */

/* W[c][o] of either layout. */

static void check_matmul_forward(pt_weight_layout layout, int with_bias)
{
    const int rows = 37, Cin = 19, OC = 23; /* sizes no kernel blocks evenly */
    float *inp = random_floats(rows * Cin, -1, 1), *W = random_floats(Cin * OC, -1, 1);
    float *bias = with_bias ? random_floats(OC, -1, 1) : NULL;
    float *out = random_floats(rows * OC, -9, 9); /* garbage: the forward overwrites */
    cpu()->matmul_forward(out, inp, W, bias, rows, Cin, OC, layout);
    double *expected = malloc(sizeof(double) * rows * OC);
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < Cin; c++)
                acc += (double)inp[n * Cin + c] * weight_at(W, c, o, Cin, OC, layout);
            expected[n * OC + o] = acc;
        }
    check_close(layout == PT_WEIGHT_IN_OUT ? "matmul in-out out" : "matmul out-in out", out,
                expected, (size_t)rows * OC, 1e-5, 1e-5);
    free(expected);
}

Test(kernels, matmul_forward_both_layouts_match_naive_loops)
{
    check_matmul_forward(PT_WEIGHT_IN_OUT, 1);
    check_matmul_forward(PT_WEIGHT_OUT_IN, 1);
    check_matmul_forward(PT_WEIGHT_IN_OUT, 0);
    check_matmul_forward(PT_WEIGHT_OUT_IN, 0);
}

enum { OC = 12 };

typedef struct matmul_problem {
    pt_weight_layout layout;
    float *inp, *weight, *bias, *w, *out; /* [N,C], [C,OC] or [OC,C], [OC], [N,OC], [N,OC] */
} matmul_problem;

static double matmul_objective(void *ctx)
{
    matmul_problem *p = ctx;
    cpu()->matmul_forward(p->out, p->inp, p->weight, p->bias, N, C, OC, p->layout);
    return weighted_sum(p->w, p->out, N * OC);
}

static void check_matmul_gradients(pt_weight_layout layout)
{
    matmul_problem p = {.layout = layout, .inp = random_floats(N * C, -1, 1),
                        .weight = random_floats(C * OC, -1, 1), .bias = random_floats(OC, -1, 1),
                        .w = random_floats(N * OC, -1, 1), .out = zero_floats(N * OC)};
    float *dinp = zero_floats(N * C), *dweight = zero_floats(C * OC), *dbias = zero_floats(OC);
    cpu()->matmul_backward(dinp, dweight, dbias, p.w, p.inp, p.weight, N, C, OC, layout);
    const char *name = layout == PT_WEIGHT_IN_OUT ? "in-out" : "out-in";
    char what[64];
    snprintf(what, sizeof what, "matmul %s dinp", name);
    check_gradient(what, p.inp, dinp, N * C, matmul_objective, &p);
    snprintf(what, sizeof what, "matmul %s dweight", name);
    check_gradient(what, p.weight, dweight, C * OC, matmul_objective, &p);
    snprintf(what, sizeof what, "matmul %s dbias", name);
    check_gradient(what, p.bias, dbias, OC, matmul_objective, &p);

    float *dinp1 = copy_floats(dinp, N * C), *dweight1 = copy_floats(dweight, C * OC),
          *dbias1 = copy_floats(dbias, OC);
    cpu()->matmul_backward(dinp, dweight, dbias, p.w, p.inp, p.weight, N, C, OC, layout);
    check_doubled("matmul dinp", dinp1, dinp, N * C);
    check_doubled("matmul dweight", dweight1, dweight, C * OC);
    check_doubled("matmul dbias", dbias1, dbias, OC);

    /* dinp and dbias may be NULL: dweight alone grows by the same amount */
    cpu()->matmul_backward(NULL, dweight, NULL, p.w, p.inp, p.weight, N, C, OC, layout);
    for (int i = 0; i < C * OC; i++)
        cr_assert(fabs(dweight[i] - 3 * dweight1[i]) <= 1e-5 * fabs(3 * dweight1[i]) + 1e-7,
                  "matmul %s dweight[%d] with NULL dinp/dbias: %g, expected %g", name, i,
                  dweight[i], 3 * dweight1[i]);
}

Test(kernels, matmul_gradients_in_out) { check_matmul_gradients(PT_WEIGHT_IN_OUT); }
Test(kernels, matmul_gradients_out_in) { check_matmul_gradients(PT_WEIGHT_OUT_IN); }

/* ---- attention ------------------------------------------------------------- */

/* out[B,T,C] and att[B,NH,T,T] by the definition, in double. */
static void attention_reference(double *out, double *att, const float *qkv, int b_, int t_, int c_,
                                int nh)
{
    int hs = c_ / nh;
    for (int b = 0; b < b_; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < t_; i++) {
                const float *q = qkv + ((size_t)b * t_ + i) * 3 * c_ + h * hs;
                double *p = att + (((size_t)b * nh + h) * t_ + i) * t_, max = -INFINITY, sum = 0;
                for (int j = 0; j < t_; j++) {
                    const float *k = qkv + ((size_t)b * t_ + j) * 3 * c_ + c_ + h * hs;
                    double s = 0;
                    for (int d = 0; d < hs; d++) s += (double)q[d] * k[d];
                    p[j] = j <= i ? s / sqrt(hs) : -INFINITY;
                    max = fmax(max, p[j]);
                }
                for (int j = 0; j < t_; j++) sum += p[j] = j <= i ? exp(p[j] - max) : 0.0;
                for (int j = 0; j < t_; j++) p[j] /= sum;
                for (int d = 0; d < hs; d++) {
                    double y = 0;
                    for (int j = 0; j <= i; j++)
                        y += p[j] * qkv[((size_t)b * t_ + j) * 3 * c_ + 2 * c_ + h * hs + d];
                    out[((size_t)b * t_ + i) * c_ + h * hs + d] = y;
                }
            }
}

static void check_attention_forward(int b_, int t_, int c_, int nh)
{
    size_t n_qkv = (size_t)b_ * t_ * 3 * c_, n_out = (size_t)b_ * t_ * c_,
           n_att = (size_t)b_ * nh * t_ * t_;
    float *qkv = random_floats(n_qkv, -2, 2), *out = random_floats(n_out, -9, 9);
    float *att = random_floats(n_att, 5, 9); /* garbage above the diagonal must become 0 */
    double *out_ref = malloc(n_out * sizeof(double)), *att_ref = malloc(n_att * sizeof(double));
    cpu()->attention_forward(out, att, qkv, b_, t_, c_, nh);
    attention_reference(out_ref, att_ref, qkv, b_, t_, c_, nh);
    char what[64];
    snprintf(what, sizeof what, "attention T=%d out", t_);
    check_close(what, out, out_ref, n_out, 1e-4, 1e-5);
    snprintf(what, sizeof what, "attention T=%d att", t_);
    check_close(what, att, att_ref, n_att, 1e-4, 1e-6);
    free(qkv), free(out), free(att), free(out_ref), free(att_ref);
}

Test(kernels, attention_forward_matches_naive_loops)
{
    check_attention_forward(B, T, C, NH);
    check_attention_forward(1, 1, 4, 1);    /* one position */
    check_attention_forward(2, 67, 12, 3);  /* T spans two row blocks, unevenly */
    check_attention_forward(1, 131, 8, 2);  /* three row blocks */
}

typedef struct attention_problem {
    int b, t, c, nh;
    float *qkv, *w, *out, *att; /* [b,t,3c], [b,t,c], [b,t,c], [b,nh,t,t] */
} attention_problem;

static double attention_objective(void *ctx)
{
    attention_problem *p = ctx;
    cpu()->attention_forward(p->out, p->att, p->qkv, p->b, p->t, p->c, p->nh);
    return weighted_sum(p->w, p->out, (size_t)p->b * p->t * p->c);
}

static void check_attention_gradients(int b_, int t_, int c_, int nh)
{
    size_t n_qkv = (size_t)b_ * t_ * 3 * c_, n_out = (size_t)b_ * t_ * c_;
    attention_problem p = {.b = b_, .t = t_, .c = c_, .nh = nh,
                           .qkv = random_floats(n_qkv, -2, 2), .w = random_floats(n_out, -1, 1),
                           .out = zero_floats(n_out),
                           .att = zero_floats((size_t)b_ * nh * t_ * t_)};
    attention_objective(&p);
    float *dqkv = zero_floats(n_qkv);
    cpu()->attention_backward(dqkv, p.w, p.qkv, p.att, b_, t_, c_, nh);
    /* q, k and v of the first, a middle and the last position, two columns each */
    size_t indices[18];
    int count = 0;
    const int positions[3] = {0, t_ / 2, t_ - 1};
    for (int part = 0; part < 3; part++)
        for (int r = 0; r < 3; r++)
            for (int col = 0; col < 2; col++) {
                size_t row = (size_t)(b_ - 1) * t_ + positions[r];
                indices[count++] = row * 3 * c_ + (size_t)part * c_ + (size_t)col * (c_ - 1);
            }
    char what[64];
    snprintf(what, sizeof what, "attention T=%d dqkv", t_);
    check_gradient_at(what, p.qkv, dqkv, indices, count, attention_objective, &p);
    attention_objective(&p); /* att of the unperturbed input */
    float *dqkv1 = copy_floats(dqkv, n_qkv);
    cpu()->attention_backward(dqkv, p.w, p.qkv, p.att, b_, t_, c_, nh);
    check_doubled(what, dqkv1, dqkv, n_qkv);
    free(p.qkv), free(p.w), free(p.out), free(p.att), free(dqkv), free(dqkv1);
}

Test(kernels, attention_gradients)
{
    check_attention_gradients(B, T, C, NH);
    check_attention_gradients(1, 70, 8, 2);   /* two row blocks */
    check_attention_gradients(1, 600, 4, 1);  /* T large enough to shrink the backward's block */
}

/* ---- gelu, residual -------------------------------------------------------- */

Test(kernels, gelu_forward_matches_tanh_formula)
{
    const size_t n = 1001;
    float *x = zero_floats(n), *y = zero_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(-10.0 + 20.0 * (double)i / (n - 1));
    cpu()->gelu_forward(y, x, n);
    double *expected = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double u = sqrt(2 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3));
        expected[i] = 0.5 * x[i] * (1 + tanh(u));
    }
    check_close("gelu", y, expected, n, 1e-5, 1e-6);
    free(x), free(y), free(expected);
}

typedef struct gelu_problem {
    size_t n;
    float *inp, *w, *out;
} gelu_problem;

static double gelu_objective(void *ctx)
{
    gelu_problem *p = ctx;
    cpu()->gelu_forward(p->out, p->inp, p->n);
    return weighted_sum(p->w, p->out, p->n);
}

Test(kernels, gelu_gradient)
{
    gelu_problem p = {.n = 97, .inp = random_floats(97, -5, 5), .w = random_floats(97, -1, 1),
                      .out = zero_floats(97)};
    float *dinp = zero_floats(p.n);
    cpu()->gelu_backward(dinp, p.inp, p.w, p.n);
    check_gradient("gelu dinp", p.inp, dinp, p.n, gelu_objective, &p);
    float *dinp1 = copy_floats(dinp, p.n);
    cpu()->gelu_backward(dinp, p.inp, p.w, p.n);
    check_doubled("gelu dinp", dinp1, dinp, p.n);
}

Test(kernels, residual_adds)
{
    const size_t n = 1000;
    float *a = random_floats(n, -1, 1), *b = random_floats(n, -1, 1), *out = zero_floats(n);
    cpu()->residual_forward(out, a, b, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(out[i], a[i] + b[i], "residual[%zu]", i);
}

/* ---- cross-entropy --------------------------------------------------------- */

/* −log softmax(x)[y] by log-sum-exp in double. */
static double crossentropy_reference(const float *x, int y, int v_)
{
    double max = -INFINITY, sum = 0;
    for (int v = 0; v < v_; v++) max = fmax(max, x[v]);
    for (int v = 0; v < v_; v++) sum += exp((double)x[v] - max);
    return max + log(sum) - x[y];
}

Test(kernels, crossentropy_matches_log_sum_exp_and_is_stable)
{
    const int rows = 6, vocab = 4099; /* rows 3..5: logits near ±500 overflow a naive expf */
    float *logits = random_floats((size_t)rows * vocab, -3, 3);
    for (int n = 3; n < rows; n++)
        for (int v = 0; v < vocab; v++) logits[n * vocab + v] += n == 4 ? -500.0f : 500.0f;
    int32_t targets[6] = {0, vocab - 1, 17, 4000, 1, 2};
    float losses[6], losses_fb[6];
    cpu()->crossentropy_forward(losses, logits, targets, rows, vocab);
    float *dlogits = copy_floats(logits, (size_t)rows * vocab);
    const float dloss = 0.25f;
    cpu()->crossentropy_forward_backward(losses_fb, dlogits, targets, rows, vocab, dloss);
    for (int n = 0; n < rows; n++) {
        double expected = crossentropy_reference(logits + n * vocab, targets[n], vocab);
        cr_expect(fabs(losses[n] - expected) < 1e-4 * expected + 1e-5,
                  "row %d: loss %.7g, log-sum-exp %.7g", n, losses[n], expected);
        cr_expect(fabs(losses_fb[n] - expected) < 1e-4 * expected + 1e-5,
                  "row %d: forward_backward loss %.7g, log-sum-exp %.7g", n, losses_fb[n],
                  expected);
        /* dlogits = dloss·(softmax − onehot): sums to 0, the target entry is negative */
        double sum = 0;
        for (int v = 0; v < vocab; v++) sum += dlogits[n * vocab + v];
        cr_expect(fabs(sum) < 1e-6, "row %d: dlogits sum to %g, not 0", n, sum);
        cr_expect(dlogits[n * vocab + targets[n]] < 0, "row %d: target gradient >= 0", n);
    }
}

typedef struct crossentropy_problem {
    float *logits, *losses; /* [N,V], [N] */
    int32_t targets[N];
    float dloss;
} crossentropy_problem;

static double crossentropy_objective(void *ctx)
{
    crossentropy_problem *p = ctx;
    cpu()->crossentropy_forward(p->losses, p->logits, p->targets, N, V);
    double f = 0;
    for (int n = 0; n < N; n++) f += (double)p->dloss * p->losses[n];
    return f;
}

Test(kernels, crossentropy_gradient)
{
    crossentropy_problem p = {.logits = random_floats(N * V, -3, 3), .losses = zero_floats(N),
                              .dloss = 0.7f};
    for (int n = 0; n < N; n++) p.targets[n] = (int32_t)(uniform(0, V) * 0.999);
    float *dlogits = copy_floats(p.logits, N * V), losses[N];
    cpu()->crossentropy_forward_backward(losses, dlogits, p.targets, N, V, p.dloss);
    check_gradient("crossentropy dlogits", p.logits, dlogits, N * V, crossentropy_objective, &p);
}

/* ---- reductions and adam --------------------------------------------------- */

/* gather and scatter follow an index (a shuffled permutation's first part, as a sparse
 * partition) element by element, and scatter leaves every other element alone. */
Test(kernels, gather_and_scatter_follow_the_index)
{
    enum { n = 5000, m = 1234 };
    static float src[n], out[m], dst[n];
    static uint32_t index[n];
    for (size_t i = 0; i < n; i++) {
        src[i] = (float)i * 0.25f - 7.0f;
        dst[i] = -1.0f;
        index[i] = (uint32_t)i;
    }
    for (size_t i = n - 1; i > 0; i--) { /* a fixed shuffle */
        const size_t j = (i * 2654435761u) % (i + 1);
        const uint32_t t = index[i];
        index[i] = index[j];
        index[j] = t;
    }
    cpu()->gather(out, src, index, m);
    for (size_t i = 0; i < m; i++) cr_assert_eq(out[i], src[index[i]], "gather[%zu]", i);
    cpu()->scatter(dst, index, out, m);
    for (size_t i = 0; i < m; i++) cr_assert_eq(dst[index[i]], src[index[i]], "scatter[%zu]", i);
    for (size_t i = m; i < n; i++) cr_assert_eq(dst[index[i]], -1.0f, "untouched %u", index[i]);
}

Test(kernels, reductions_and_scale)
{
    const size_t n = 100003;
    float *x = random_floats(n, -1, 1);
    double squares = 0, sum = 0;
    for (size_t i = 0; i < n; i++) squares += (double)x[i] * x[i], sum += x[i];
    cr_expect(fabs(cpu()->sum_squares(x, n) - squares) < 1e-9 * squares, "sum_squares");
    cr_expect(fabs(cpu()->sum(x, n) - sum) < 1e-9 * fabs(squares), "sum %.12g vs %.12g",
              cpu()->sum(x, n), sum);
    float *y = copy_floats(x, n);
    cpu()->scale(y, -0.5f, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], -0.5f * x[i], "scale[%zu]", i);

    /* Accumulation in double: 2²⁴ + 1 is not a float, so a float accumulator
     * holding 2²⁴ (or 4096²) drops every 1 added to it; a double keeps them. */
    for (size_t i = 0; i < 1001; i++) x[i] = 1.0f;
    x[0] = 16777216.0f;
    cr_expect_eq(cpu()->sum(x, 1001), 16777216.0 + 1000, "sum %.1f", cpu()->sum(x, 1001));
    x[0] = 4096.0f;
    cr_expect_eq(cpu()->sum_squares(x, 1001), 16777216.0 + 1000, "sum_squares %.1f",
                 cpu()->sum_squares(x, 1001));
}

Test(kernels, adam_update_follows_its_formula)
{
    const size_t n = 37;
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *p0 = copy_floats(param, n), *m0 = copy_floats(m, n), *v0 = copy_floats(v, n);
    pt_adam_coeffs c = {.decay = 0.99f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.2f,
                        .eps = 1e-3f, .c_grad = 0.01f, .c_mom = 0.02f};
    const pt_param_region all = {0, n, 1};
    cpu()->adam_update(param, grad, m, v, &all, 1, &c, NULL, 1.0f);
    for (size_t i = 0; i < n; i++) {
        double mi = 0.9 * m0[i] + 0.1 * grad[i], vi = 0.95 * v0[i] + 0.05 * grad[i] * grad[i];
        double d = sqrt(vi / 0.2) + 1e-3;
        double expected = p0[i] * 0.99 - 0.01 * grad[i] / d - 0.02 * mi / d;
        cr_expect(fabs(m[i] - mi) < 1e-6 && fabs(v[i] - vi) < 1e-7, "moments [%zu]", i);
        cr_expect(fabs(param[i] - expected) < 1e-5 * fabs(expected) + 1e-6,
                  "param[%zu]: %.7g, expected %.7g", i, param[i], expected);
    }
}

/* grad_scale is the clipping's factor applied inside the step: the bits of scale(grad) then the
 * step at 1, and grad itself left as it was. */
Test(kernels, adam_update_reads_the_gradient_scaled)
{
    const size_t n = 1001;
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *p1 = copy_floats(param, n), *m1 = copy_floats(m, n), *v1 = copy_floats(v, n);
    float *scaled = copy_floats(grad, n), *grad0 = copy_floats(grad, n);
    const pt_adam_coeffs c = {.decay = 0.99f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.2f,
                              .eps = 1e-8f, .c_grad = 0.01f, .c_mom = 0.02f};
    const pt_param_region all = {0, n, 1};
    const float factor = 0.3719f;
    cpu()->adam_update(param, grad, m, v, &all, 1, &c, NULL, factor);
    cpu()->scale(scaled, factor, n);
    cpu()->adam_update(p1, scaled, m1, v1, &all, 1, &c, NULL, 1.0f);
    cr_expect_arr_eq(param, p1, n * sizeof *param, "θ as after scale(grad)");
    cr_expect_arr_eq(m, m1, n * sizeof *m, "m as after scale(grad)");
    cr_expect_arr_eq(v, v1, n * sizeof *v, "v as after scale(grad)");
    cr_expect_arr_eq(grad, grad0, n * sizeof *grad, "grad untouched");
    cr_expect_arr_neq(param, grad0, n * sizeof *param);
    free(param), free(grad), free(m), free(v), free(p1), free(m1), free(v1), free(scaled);
    free(grad0);
}

/* Several regions in one call: each moves as a call on it alone with its own coefficients
 * (decayed or plain), bit for bit; elements between regions are not touched. */
Test(kernels, adam_update_takes_each_region_with_its_coefficients)
{
    const size_t n = 400;
    const pt_param_region regions[] = {{0, 50, 1}, {50, 7, 0}, {60, 0, 1}, {60, 200, 1},
                                       {300, 99, 0}};
    const pt_adam_coeffs decayed = {.decay = 0.99f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.2f,
                                    .eps = 1e-3f, .c_grad = 0.01f, .c_mom = 0.02f};
    pt_adam_coeffs plain = decayed;
    plain.decay = 1.0f;
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *p1 = copy_floats(param, n), *m1 = copy_floats(m, n), *v1 = copy_floats(v, n);
    cpu()->adam_update(param, grad, m, v, regions, 5, &decayed, &plain, 1.0f);
    for (int r = 0; r < 5; r++) {
        const pt_param_region alone = {regions[r].offset, regions[r].numel, 1};
        cpu()->adam_update(p1, grad, m1, v1, &alone, 1, regions[r].decay ? &decayed : &plain,
                           NULL, 1.0f);
    }
    cr_expect_eq(memcmp(param, p1, n * sizeof *param), 0, "parameters as region by region");
    cr_expect_eq(memcmp(m, m1, n * sizeof *m), 0, "m as region by region");
    cr_expect_eq(memcmp(v, v1, n * sizeof *v), 0, "v as region by region");
    const size_t gaps[] = {57, 58, 59, 260, 299, 399};
    float *p0 = copy_floats(p1, n);
    cpu()->adam_update(p0, grad, m1, v1, regions, 5, &decayed, &plain, 1.0f);
    for (size_t i = 0; i < sizeof gaps / sizeof gaps[0]; i++)
        cr_expect_eq(p0[gaps[i]], p1[gaps[i]], "[%zu] lies in no region: untouched", gaps[i]);
    cr_expect_neq(p0[0], p1[0], "[0] lies in a region: moved");
    free(param), free(grad), free(m), free(v), free(p1), free(m1), free(v1), free(p0);
}

/* How the CUDA backend packs regions into launches (kernels/cuda/adam_batch.h, plain C): 500
 * regions, some empty, with gaps, in batches that fit the kernel's parameter; every element of
 * every region reached exactly once, at its offset, with its decay flag, and nothing else. */
Test(kernels, adam_batches_reach_every_region_element_once)
{
    enum { REGIONS = 500 };
    pt_param_region regions[REGIONS];
    size_t n = 0;
    for (int r = 0; r < REGIONS; r++) {
        const size_t numel = r % 13 == 0 ? 0 : (size_t)(r * 7919 % 300) + 1;
        regions[r] = (pt_param_region){n, numel, r % 3 != 0};
        n += numel + (r % 4 == 0 ? 2 : 0);
    }
    int *reached = calloc(n, sizeof *reached), *decay = calloc(n, sizeof *decay);
    int launches = 0;
    for (int first = 0; first < REGIONS; launches++) {
        pt_adam_batch b;
        const int next = pt_adam_batch_fill(&b, regions, REGIONS, first);
        cr_assert(next > first && b.count <= PT_ADAM_REGIONS_PER_LAUNCH, "a batch moves on");
        for (unsigned long long j = 0; j < b.start[b.count]; j++) {
            const int r = pt_adam_batch_region(&b, j);
            cr_assert(r >= 0 && r < b.count && b.start[r] <= j && j < b.start[r + 1],
                      "element %llu: region %d of %d", j, r, b.count);
            const size_t i = b.offset[r] + (j - b.start[r]);
            cr_assert(i < n);
            reached[i]++;
            decay[i] = b.decay[r];
        }
        first = next;
    }
    cr_expect_gt(launches, 3, "500 regions take several launches");
    char *in_region = calloc(n, 1);
    for (int r = 0; r < REGIONS; r++)
        for (size_t i = 0; i < regions[r].numel; i++) {
            const size_t at = regions[r].offset + i;
            in_region[at] = 1;
            cr_expect_eq(reached[at], 1, "region %d element %zu reached %d times", r, i,
                         reached[at]);
            cr_expect_eq(decay[at], regions[r].decay, "region %d's decay flag", r);
        }
    for (size_t i = 0; i < n; i++)
        if (!in_region[i]) cr_expect_eq(reached[i], 0, "[%zu] lies in no region", i);
    free(reached), free(decay), free(in_region);
}

/* adam.cu's 16-byte form takes 4 elements a step only from batches pt_adam_batch_in_steps_of
 * admits: there no step of 4 straddles two regions; one region of odd length, or one placed off a
 * multiple of 4, makes its batch take the element-by-element form. */
Test(kernels, adam_batches_in_steps_of_four_keep_each_step_in_one_region)
{
    enum { REGIONS = 200 };
    pt_param_region regions[REGIONS];
    size_t n = 0;
    for (int r = 0; r < REGIONS; r++) {
        const size_t numel = r % 13 == 0 ? 0 : 4 * ((size_t)(r * 7919 % 300) + 1);
        regions[r] = (pt_param_region){n, numel, r % 3 != 0};
        n += numel + (r % 4 == 0 ? 8 : 0);
    }
    for (int first = 0; first < REGIONS;) {
        pt_adam_batch b;
        const int next = pt_adam_batch_fill(&b, regions, REGIONS, first);
        cr_assert(pt_adam_batch_in_steps_of(&b, 4), "regions [%d, %d) in steps of 4", first, next);
        for (unsigned long long j = 0; j < b.start[b.count]; j += 4)
            cr_assert_eq(pt_adam_batch_region(&b, j), pt_adam_batch_region(&b, j + 3),
                         "the step at %llu in one region", j);
        first = next;
    }
    pt_param_region odd_length[] = {{0, 8, 1}, {8, 6, 0}, {16, 4, 1}};
    pt_param_region odd_place[] = {{0, 8, 1}, {10, 8, 0}};
    pt_adam_batch b;
    pt_adam_batch_fill(&b, odd_length, 3, 0);
    cr_expect_not(pt_adam_batch_in_steps_of(&b, 4), "a region 6 long");
    cr_expect(pt_adam_batch_in_steps_of(&b, 2), "every length and place even");
    pt_adam_batch_fill(&b, odd_place, 2, 0);
    cr_expect_not(pt_adam_batch_in_steps_of(&b, 4), "a region at 10");
}

/* adam_extrapolate against its formula in double. beta1, beta2 and c_grad are
 * NaN: the kernel must not read them. A few v are exactly 0, where d = ε. */
Test(kernels, adam_extrapolate_follows_its_formula)
{
    const size_t n = 1001; /* odd, and more than one vector per thread */
    float *param = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    for (size_t i = 0; i < n; i += 97) v[i] = 0.0f;
    float *p0 = copy_floats(param, n), *m0 = copy_floats(m, n), *v0 = copy_floats(v, n);
    float *out = zero_floats(n);
    pt_adam_coeffs c = {.decay = 0.99f, .beta1 = NAN, .beta2 = NAN, .bias2 = 0.3f,
                        .eps = 1e-3f, .c_grad = NAN, .c_mom = 0.02f};
    const float all_steps[] = {0.0f, 1.0f, 2.5f};
    for (int s = 0; s < 3; s++) {
        const double steps = all_steps[s];
        cpu()->adam_extrapolate(out, param, m, v, n, &c, (float)steps);
        double largest_move = 0;
        for (size_t i = 0; i < n; i++) {
            double d = sqrt((double)v0[i] / 0.3) + 1e-3;
            /* decay and c_mom as the floats the kernel holds */
            double expected = p0[i] * (1 - steps * (1 - (double)c.decay)) -
                              steps * (double)c.c_mom * m0[i] / d;
            if (steps == 0)
                cr_assert_eq(out[i], param[i], "steps 0, out[%zu] = %.9g, param %.9g", i,
                             out[i], param[i]);
            /* float against double: a few ulp of max(|θ|, |ŵ|, 1) */
            cr_assert(fabs(out[i] - expected) < 4e-7 * fmax(1, fabs(expected)),
                      "steps %.1f, out[%zu]: %.9g, expected %.9g (v = %g)", steps, i, out[i],
                      expected, v0[i]);
            largest_move = fmax(largest_move, fabs(expected - p0[i]));
        }
        if (steps > 0) cr_assert(largest_move > 0.1, "the test moves nothing: %g", largest_move);
    }
    for (size_t i = 0; i < n; i++)
        cr_assert(param[i] == p0[i] && m[i] == m0[i] && v[i] == v0[i],
                  "adam_extrapolate wrote into its inputs at %zu", i);

    /* in place: out = param */
    cpu()->adam_extrapolate(out, param, m, v, n, &c, 2.5f);
    cpu()->adam_extrapolate(param, param, m, v, n, &c, 2.5f);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(param[i], out[i], "in place differs at %zu: %.9g vs %.9g", i, param[i],
                     out[i]);
    free(param), free(m), free(v), free(p0), free(m0), free(v0), free(out);
}

/* The property the prediction rests on: with c_grad = 0 (AdamW), adam_update
 * moves θ to θ·decay − c_mom·m'/d' where m', v' are the moments it leaves
 * behind, so one step of adam_extrapolate from the old θ along the NEW
 * moments lands where adam_update did, for any gradient, β1 and β2. The two
 * kernels round differently, hence a few ulp rather than equality. */
Test(kernels, adam_extrapolate_one_step_repeats_an_adamw_update)
{
    const size_t n = 257;
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *before = copy_floats(param, n), *out = zero_floats(n);
    pt_adam_coeffs c = {.decay = 0.995f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.1426f,
                        .eps = 1e-8f, .c_grad = 0.0f, .c_mom = 0.0369f};
    const pt_param_region all = {0, n, 0};
    cpu()->adam_update(param, grad, m, v, &all, 1, NULL, &c, 1.0f);
    cpu()->adam_extrapolate(out, before, m, v, n, &c, 1.0f);
    double largest_move = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(out[i] - param[i]) < 4e-7,
                  "[%zu]: one extrapolated step %.9g, adam_update %.9g (from %.9g)", i, out[i],
                  param[i], before[i]);
        largest_move = fmax(largest_move, fabs(param[i] - before[i]));
    }
    cr_assert(largest_move > 1e-3, "the update moved nothing: %g", largest_move);
    free(param), free(grad), free(m), free(v), free(before), free(out);
}

Test(kernels, thread_count_does_not_change_results)
{
    attention_problem p = {.b = 2, .t = 33, .c = 8, .nh = 2,
                           .qkv = random_floats(2 * 33 * 24, -1, 1),
                           .w = random_floats(2 * 33 * 8, -1, 1), .out = zero_floats(2 * 33 * 8),
                           .att = zero_floats(2 * 2 * 33 * 33)};
    pt_kernels_cpu_set_threads(1);
    attention_objective(&p);
    float *one = copy_floats(p.out, 2 * 33 * 8);
    pt_kernels_cpu_set_threads(2);
    attention_objective(&p);
    for (int i = 0; i < 2 * 33 * 8; i++)
        cr_assert_eq(one[i], p.out[i], "attention out[%d] differs between 1 and 2 threads", i);
}

/* How crossentropy.cu splits a row for 16-byte loads (kernels/cuda/row_parts.h, plain C): for
 * every start address modulo 16 and lengths around the vector width and GPT-2's vocabulary,
 * head, vectors and tail visit each element exactly once, and the vectors start on a 16-byte
 * boundary. */
Test(kernels, row_parts_cover_a_row_once_with_aligned_vectors)
{
    static unsigned char seen[50300];
    const int lengths[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 50257, 50264};
    for (int element_size = 2; element_size <= 4; element_size += 2)
        for (int offset = 0; offset < 16; offset += element_size)
            for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
                const int n = lengths[k], width = 16 / element_size;
                const uintptr_t address = 4096 + (uintptr_t)offset;
                const pt_row_parts p = pt_row_parts_of(address, n, element_size);
                memset(seen, 0, sizeof seen);
                for (int v = 0; v < p.head; v++) seen[v]++;
                for (int i = 0; i < p.vectors; i++)
                    for (int e = 0; e < width; e++) seen[p.head + i * width + e]++;
                for (int v = p.tail_start; v < n; v++) seen[v]++;
                int wrong = 0;
                for (int v = 0; v < n; v++) wrong += seen[v] != 1;
                cr_expect_eq(wrong, 0, "size %d, offset %d, V %d: %d elements not visited once",
                             element_size, offset, n, wrong);
                cr_expect(p.vectors == 0 ||
                              (address + (uintptr_t)p.head * element_size) % 16 == 0,
                          "size %d, offset %d, V %d: vectors start off a 16-byte boundary",
                          element_size, offset, n);
                cr_expect(p.head < width && n - p.tail_start < width,
                          "size %d, offset %d, V %d: a head or tail as long as a vector (%d %d %d)",
                          element_size, offset, n, p.head, p.vectors, p.tail_start);
            }
}
