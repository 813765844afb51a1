/* The CPU backend's bf16 kernels (runtime.precision = bf16) against independent references:
 * the cast against the nearest bf16 found by comparison, the products against naive loops over
 * the rounded operands, and every kernel that reads or writes bf16 against its fp32 twin on the
 * same values: bit for bit where it reads them (a bf16 value widens exactly), the nearest bf16
 * of the twin's result where it writes them. test_kernels.c checks the fp32 kernels themselves
 * (finite differences, naive loops). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernel_checks.h"
#include "tests/random_data.h"

enum { B = 2, T = 5, C = 8, NH = 2 }; /* attention's small problem, as test_kernels.c's */

static const pt_kernels *cpu(void) { return pt_kernels_cpu(); }

/* ---- bf16 operands --------------------------------------------------------- */

static float bf16_value(pt_bf16 b)
{
    const uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The bf16 nearest to x, ties to the even one, found by comparing the two bf16 that bracket
 * it in double (not by the kernel's carry trick); x finite. */
static pt_bf16 nearest_bf16(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const pt_bf16 down = (pt_bf16)(bits >> 16), up = (pt_bf16)(down + 1);
    const double below = fabs((double)x - bf16_value(down));
    const double above = fabs((double)x - bf16_value(up));
    if (below != above) return below < above ? down : up;
    return (down & 1u) ? up : down;
}

Test(kernels, bf16_cast_rounds_to_the_nearest_ties_to_even)
{
    const size_t n = 5003;
    float *x = random_floats(n, -1e3f, 1e3f);
    x[0] = 1.0f + 0x1p-8f;     /* a tie: to 1 (even) */
    x[1] = 1.0f + 3 * 0x1p-8f; /* a tie: to 1 + 2^-6 (even) */
    x[2] = -0.0f, x[3] = 3.0e38f, x[4] = 1e-40f; /* a subnormal */
    x[5] = 0x1.fffffep127f;                     /* rounds up to infinity */
    pt_bf16 *b = malloc(n * sizeof *b);
    cpu()->cast_to_bf16(b, x, n);
    for (size_t i = 0; i < n; i++)
        if (i != 5)
            cr_expect_eq(b[i], nearest_bf16(x[i]), "bf16(%.9g): 0x%04x, nearest 0x%04x", x[i], b[i],
                         nearest_bf16(x[i]));
    cr_expect_eq(b[0], 0x3f80, "1 + 2^-8: 0x%04x", b[0]);
    cr_expect_eq(b[1], 0x3f82, "1 + 3·2^-8: 0x%04x", b[1]);
    cr_expect_eq(b[2], 0x8000, "-0 keeps its sign: 0x%04x", b[2]);
    cr_expect_eq(b[5], 0x7f80, "the largest float rounds to infinity: 0x%04x", b[5]);
    float special[2] = {INFINITY, NAN};
    pt_bf16 out[2];
    cpu()->cast_to_bf16(out, special, 2);
    cr_expect_eq(out[0], 0x7f80, "infinity: 0x%04x", out[0]);
    cr_expect(isnan(bf16_value(out[1])), "NaN stays NaN: 0x%04x", out[1]);
    free(x);
    free(b);
}

/* Widening is exact (a bf16 is the upper half of a float), and a widened value rounds to itself. */
Test(kernels, bf16_widens_to_the_float_it_is)
{
    const size_t n = 1 << 16; /* every bf16 */
    pt_bf16 *b = malloc(n * sizeof *b), *again = malloc(n * sizeof *again);
    float *wide = malloc(n * sizeof *wide);
    for (size_t i = 0; i < n; i++) b[i] = (pt_bf16)i;
    cpu()->cast_from_bf16(wide, b, n);
    cpu()->cast_to_bf16(again, wide, n);
    for (size_t i = 0; i < n; i++) {
        const float want = bf16_value(b[i]);
        if (isnan(want)) {
            cr_expect(isnan(wide[i]), "0x%04zx is a NaN, widened %g", i, wide[i]);
            continue;
        }
        cr_expect(memcmp(&wide[i], &want, sizeof want) == 0, "0x%04zx: %g, expected %g", i, wide[i],
                  want);
        cr_expect_eq(again[i], b[i], "0x%04zx rounds to 0x%04x", i, again[i]);
    }
    free(b);
    free(again);
    free(wide);
}

/* The bf16 products are the products of the rounded operands, summed in fp32: against naive
 * loops in double over the rounded values (forward), and against matmul_backward on them. */
static void check_matmul_bf16(pt_weight_layout layout)
{
    const int rows = 37, Cin = 19, Cout = 23;
    float *inp = random_floats(rows * Cin, -1, 1), *W = random_floats(Cin * Cout, -1, 1);
    float *bias = random_floats(Cout, -1, 1), *dout = random_floats(rows * Cout, -1, 1);
    pt_bf16 *inp16 = malloc(sizeof(pt_bf16) * rows * Cin);
    pt_bf16 *W16 = malloc(sizeof(pt_bf16) * Cin * Cout);
    pt_bf16 *dout16 = malloc(sizeof(pt_bf16) * rows * Cout);
    cpu()->cast_to_bf16(inp16, inp, (size_t)rows * Cin);
    cpu()->cast_to_bf16(W16, W, (size_t)Cin * Cout);
    cpu()->cast_to_bf16(dout16, dout, (size_t)rows * Cout);
    for (int i = 0; i < rows * Cin; i++) inp[i] = bf16_value(inp16[i]);
    for (int i = 0; i < Cin * Cout; i++) W[i] = bf16_value(W16[i]);
    for (int i = 0; i < rows * Cout; i++) dout[i] = bf16_value(dout16[i]);

    float *out = random_floats(rows * Cout, -9, 9);
    cpu()->matmul_forward_bf16(out, inp16, W16, bias, rows, Cin, Cout, layout);
    double *expected = malloc(sizeof(double) * rows * Cout);
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < Cout; o++) {
            double acc = bias[o];
            for (int c = 0; c < Cin; c++)
                acc += (double)inp[n * Cin + c] * weight_at(W, c, o, Cin, Cout, layout);
            expected[n * Cout + o] = acc;
        }
    check_close("bf16 matmul out", out, expected, (size_t)rows * Cout, 1e-5, 1e-5);

    float *dinp = zero_floats(rows * Cin), *dW = zero_floats(Cin * Cout), *db = zero_floats(Cout);
    float *dinp32 = zero_floats(rows * Cin), *dW32 = zero_floats(Cin * Cout),
          *db32 = zero_floats(Cout);
    cpu()->matmul_backward_bf16(dinp, dW, db, dout16, inp16, W16, rows, Cin, Cout, layout);
    cpu()->matmul_backward(dinp32, dW32, db32, dout, inp, W, rows, Cin, Cout, layout);
    cr_expect_eq(memcmp(dinp, dinp32, sizeof(float) * rows * Cin), 0, "bf16 dinp");
    cr_expect_eq(memcmp(dW, dW32, sizeof(float) * Cin * Cout), 0, "bf16 dweight");
    cr_expect_eq(memcmp(db, db32, sizeof(float) * Cout), 0, "bf16 dbias");
    cpu()->matmul_backward_bf16(dinp, dW, db, dout16, inp16, W16, rows, Cin, Cout, layout);
    check_doubled("bf16 matmul dweight", dW32, dW, Cin * Cout);
    /* dinp written, not added to; dweight still accumulates (a third time) */
    cpu()->matmul_backward_bf16_dinp_written(dinp, dW, NULL, dout16, inp16, W16, rows, Cin, Cout,
                                             Cout, layout);
    cr_expect_eq(memcmp(dinp, dinp32, sizeof(float) * rows * Cin), 0, "bf16 dinp written");
    for (int i = 0; i < Cin * Cout; i++)
        cr_expect(fabsf(dW[i] - 3 * dW32[i]) <= 1e-5f * (fabsf(dW32[i]) + 1e-3f),
                  "dweight [%d]: %g after three backwards of %g", i, dW[i], dW32[i]);
    free(inp), free(W), free(bias), free(dout), free(inp16), free(W16), free(dout16);
    free(out), free(expected), free(dinp), free(dW), free(db), free(dinp32), free(dW32), free(db32);
}

Test(kernels, bf16_products_are_the_fp32_products_of_the_rounded_operands)
{
    check_matmul_bf16(PT_WEIGHT_IN_OUT);
    check_matmul_bf16(PT_WEIGHT_OUT_IN);
}

/* x rounded to bf16 (cast_to_bf16, checked above) into x16, and x set to the values it holds. */
static void round_in_place(float *x, pt_bf16 *x16, size_t n)
{
    cpu()->cast_to_bf16(x16, x, n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_value(x16[i]);
}

/* Attention and the GELU on bf16 inputs read the values the bf16 hold: the fp32 kernels
 * (checked against the definitions below) on those values, bit for bit; a bf16 output is
 * the nearest bf16 of the fp32 result. */
Test(kernels, bf16_attention_and_gelu_are_the_fp32_kernels_of_the_rounded_inputs)
{
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    const size_t saved = cpu()->attention_saved_floats(B, T, C, NH);
    float *qkv = random_floats(n_qkv, -2, 2), *dout = random_floats(n_out, -1, 1);
    pt_bf16 *qkv16 = malloc(sizeof(pt_bf16) * n_qkv);
    round_in_place(qkv, qkv16, n_qkv);
    float *out = zero_floats(n_out), *out32 = zero_floats(n_out);
    float *att = zero_floats(saved), *att32 = zero_floats(saved);
    cpu()->attention_forward_bf16(out, att, qkv16, B, T, C, NH);
    cpu()->attention_forward(out32, att32, qkv, B, T, C, NH);
    cr_expect_eq(memcmp(out, out32, sizeof(float) * n_out), 0, "bf16 attention out");
    cr_expect_eq(memcmp(att, att32, sizeof(float) * saved), 0, "bf16 attention saved state");
    float *dqkv = random_floats(n_qkv, -1, 1), *dqkv32 = copy_floats(dqkv, n_qkv);
    cpu()->attention_backward_bf16(dqkv, dout, qkv16, att, B, T, C, NH);
    cpu()->attention_backward(dqkv32, dout, qkv, att32, B, T, C, NH);
    cr_expect_eq(memcmp(dqkv, dqkv32, sizeof(float) * n_qkv), 0, "bf16 attention dqkv");

    const size_t n = 1000;
    float *x = random_floats(n, -6, 6), *y32 = zero_floats(n), *d = random_floats(n, -1, 1);
    pt_bf16 *x16 = malloc(sizeof(pt_bf16) * n), *y16 = malloc(sizeof(pt_bf16) * n);
    round_in_place(x, x16, n);
    cpu()->gelu_forward_bf16(y16, x16, n);
    cpu()->gelu_forward(y32, x, n);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(y16[i], nearest_bf16(y32[i]), "gelu(%g): 0x%04x, nearest of %.9g 0x%04x",
                     x[i], y16[i], y32[i], nearest_bf16(y32[i]));
    float *dx = random_floats(n, -1, 1), *dx32 = copy_floats(dx, n);
    cpu()->gelu_backward_bf16(dx, x16, d, n);
    cpu()->gelu_backward(dx32, x, d, n);
    cr_expect_eq(memcmp(dx, dx32, sizeof(float) * n), 0, "bf16 gelu dinp");
    free(qkv), free(dout), free(qkv16), free(out), free(out32), free(att), free(att32);
    free(dqkv), free(dqkv32), free(x), free(y32), free(d), free(x16), free(y16), free(dx), free(dx32);
}

/* ---- kernels that write bf16 themselves ------------------------------------ */

/* A layernorm written in bf16 is the fp32 layernorm rounded, with the same statistics. */
Test(kernels, bf16_layernorm_is_the_fp32_layernorm_rounded)
{
    const int rows = 9, width = 130;
    float *inp = random_floats((size_t)rows * width, -3, 5), *w = random_floats(width, 0.5, 1.5);
    float *b = random_floats(width, -1, 1), *out = malloc(sizeof(float) * rows * width);
    float mean[9], rstd[9], mean16[9], rstd16[9];
    pt_bf16 *out16 = malloc(sizeof(pt_bf16) * rows * width);
    cpu()->layernorm_forward(out, mean, rstd, inp, w, b, rows, width);
    cpu()->layernorm_forward_bf16(out16, mean16, rstd16, inp, w, b, rows, width);
    cr_expect_eq(memcmp(mean, mean16, sizeof mean), 0, "mean");
    cr_expect_eq(memcmp(rstd, rstd16, sizeof rstd), 0, "rstd");
    for (int i = 0; i < rows * width; i++)
        cr_expect_eq(out16[i], nearest_bf16(out[i]), "[%d]: %g, the nearest of %.9g", i,
                     bf16_value(out16[i]), out[i]);
    free(inp), free(w), free(b), free(out), free(out16);
}

/* gelu'(x) of the tanh approximation, in double: an independent reference for the kernels'. */
static double gelu_slope(double x)
{
    const double a = sqrt(2.0 / M_PI), u = a * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * a * (1.0 + 3.0 * 0.044715 * x * x);
}

/* The residual's sum and the layernorm after it, written in bf16: the sum, then
 * layernorm_forward_bf16 of it, bit for bit. */
/* The layernorm backward that also rounds dinp: the fp32 backward's bits, and the rounding the
 * cast of the new dinp gives. */
Test(kernels, bf16_layernorm_backward_rounds_the_new_dinp)
{
    const int N = 9, Cn = 40;
    const size_t n = (size_t)N * Cn;
    float *inp = random_floats(n, -3, 5), *w = random_floats(Cn, 0.5, 1.5);
    float *dout = random_floats(n, -1, 1), *dinp = random_floats(n, -1, 1);
    float *dw = random_floats(Cn, -1, 1), *db = random_floats(Cn, -1, 1);
    float *mean = random_floats(N, -0.5, 0.5), *rstd = random_floats(N, 0.5, 2);
    float *dinp1 = copy_floats(dinp, n), *dw1 = copy_floats(dw, Cn), *db1 = copy_floats(db, Cn);
    pt_bf16 *rounded = malloc(2 * n);
    cpu()->layernorm_backward_bf16(dinp, rounded, dw, db, dout, inp, w, mean, rstd, N, Cn);
    cpu()->layernorm_backward(dinp1, dw1, db1, dout, inp, w, mean, rstd, N, Cn);
    cr_expect_arr_eq(dinp, dinp1, n * sizeof *dinp, "dinp as the fp32 backward's");
    cr_expect_arr_eq(dw, dw1, Cn * sizeof *dw, "dweight as the fp32 backward's");
    cr_expect_arr_eq(db, db1, Cn * sizeof *db, "dbias as the fp32 backward's");
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(rounded[i], nearest_bf16(dinp1[i]), "[%zu]: %g, the nearest of %.9g", i,
                     bf16_value(rounded[i]), dinp1[i]);
    free(inp), free(w), free(dout), free(dinp), free(dw), free(db), free(mean), free(rstd);
    free(dinp1), free(dw1), free(db1), free(rounded);
}

Test(kernels, bf16_residual_layernorm_is_the_sum_then_the_layernorm)
{
    const int rows = 9, width = 130;
    const size_t n = (size_t)rows * width;
    float *a = random_floats(n, -3, 5), *b = random_floats(n, -1, 1), *sum = malloc(4 * n);
    float *w = random_floats(width, 0.5, 1.5), *bias = random_floats(width, -1, 1);
    float *residual = malloc(4 * n), mean[9], rstd[9], fused_mean[9], fused_rstd[9];
    pt_bf16 *out = malloc(2 * n), *fused = malloc(2 * n);
    cpu()->residual_forward(sum, a, b, n);
    cpu()->layernorm_forward_bf16(out, mean, rstd, sum, w, bias, rows, width);
    cpu()->residual_layernorm_forward_bf16(residual, fused, fused_mean, fused_rstd, a, b, w, bias,
                                           rows, width);
    cr_expect_eq(memcmp(residual, sum, 4 * n), 0, "the residual: a + b");
    cr_expect_eq(memcmp(fused, out, 2 * n), 0, "the layernorm of a + b, in bf16");
    cr_expect_eq(memcmp(fused_mean, mean, sizeof mean), 0, "mean");
    cr_expect_eq(memcmp(fused_rstd, rstd, sizeof rstd), 0, "rstd");
    free(a), free(b), free(sum), free(w), free(bias), free(residual), free(out), free(fused);
}

/* The MLP's second product's backward through the GELU under bf16: dpre written (whatever it
 * and the scratch held is gone) with the bits of the product's dinp, the fp32 GELU gradient on
 * it and the cast in turn, and within one bf16 step of gelu'(pre)·dout·Wᵀ computed in double;
 * dweight and dbias accumulate as matmul_backward_bf16's, bit for bit. */
Test(kernels, bf16_product_backward_through_the_gelu)
{
    const int rows = 6, cin = 40, cout = 24;
    const size_t n_in = (size_t)rows * cin, n_out = (size_t)rows * cout, n_w = (size_t)cin * cout;
    float *pre = random_floats(n_in, -4, 4), *gelu = random_floats(n_in, -1, 3);
    float *dout = random_floats(n_out, -1, 1), *w = random_floats(n_w, -1, 1);
    pt_bf16 *pre16 = malloc(2 * n_in), *gelu16 = malloc(2 * n_in), *dout16 = malloc(2 * n_out);
    pt_bf16 *w16 = malloc(2 * n_w), *dpre16 = malloc(2 * n_in);
    round_in_place(pre, pre16, n_in), round_in_place(gelu, gelu16, n_in);
    round_in_place(dout, dout16, n_out), round_in_place(w, w16, n_w);
    for (size_t i = 0; i < n_in; i++) dpre16[i] = 0x7fc0;
    float *scratch = random_floats(n_in, -9, 9);
    float *dw = random_floats(n_w, -1, 1), *db = random_floats(cout, -1, 1);
    float *dw_want = malloc(4 * n_w), *db_want = malloc(4 * (size_t)cout);
    memcpy(dw_want, dw, 4 * n_w), memcpy(db_want, db, 4 * (size_t)cout);
    float *dinp = zero_floats(n_in), *dpre = zero_floats(n_in);

    cpu()->matmul_gelu_backward_bf16(dpre16, scratch, dw, db, dout16, gelu16, pre16, w16, rows,
                                     cin, cout, PT_WEIGHT_IN_OUT);
    cpu()->matmul_backward_bf16(dinp, dw_want, db_want, dout16, gelu16, w16, rows, cin, cout,
                                PT_WEIGHT_IN_OUT);
    cpu()->gelu_backward_bf16(dpre, pre16, dinp, n_in);
    cr_expect_eq(memcmp(dw, dw_want, 4 * n_w), 0, "dweight as matmul_backward_bf16's");
    cr_expect_eq(memcmp(db, db_want, 4 * (size_t)cout), 0, "dbias as matmul_backward_bf16's");
    for (int n = 0; n < rows; n++)
        for (int c = 0; c < cin; c++) {
            const size_t i = (size_t)n * cin + c;
            cr_expect_eq(dpre16[i], nearest_bf16(dpre[i]), "dpre[%zu]: %g, the nearest of %.9g", i,
                         bf16_value(dpre16[i]), dpre[i]);
            double acc = 0;
            for (int o = 0; o < cout; o++) acc += (double)dout[n * cout + o] * w[c * cout + o];
            const pt_bf16 want = nearest_bf16((float)(gelu_slope(pre[i]) * acc));
            cr_expect(dpre16[i] == want || dpre16[i] == want + 1 || dpre16[i] + 1 == want,
                      "dpre[%d][%d] = %g, gelu'(pre)·dout·Wᵀ rounds to %g", n, c,
                      bf16_value(dpre16[i]), bf16_value(want));
        }
    free(pre), free(gelu), free(dout), free(w), free(pre16), free(gelu16), free(dout16);
    free(w16), free(dpre16), free(scratch), free(dw), free(db), free(dw_want), free(db_want);
    free(dinp), free(dpre);
}

/* Attention's gradient and output written in bf16: the fp32 gradient of the bf16 qkv added
 * into zeros, and the fp32 output, rounded; whatever the output and the scratch held before is
 * gone. */
Test(kernels, bf16_attention_gradient_written_in_bf16)
{
    const int b_ = 2, t_ = 9, c_ = 12, nh = 3;
    const size_t n_qkv = (size_t)b_ * t_ * 3 * c_, n_out = (size_t)b_ * t_ * c_;
    float *qkv = random_floats(n_qkv, -2, 2), *dout = random_floats(n_out, -1, 1);
    float *out = zero_floats(n_out), *d = zero_floats(n_qkv);
    float *scratch = random_floats(n_qkv, -9, 9);
    float *att = zero_floats(cpu()->attention_saved_floats(b_, t_, c_, nh));
    pt_bf16 *qkv16 = malloc(sizeof(pt_bf16) * n_qkv), *d16 = malloc(sizeof(pt_bf16) * n_qkv);
    for (size_t i = 0; i < n_qkv; i++) d16[i] = 0x7fc0;
    round_in_place(qkv, qkv16, n_qkv);
    cpu()->attention_forward_bf16(out, att, qkv16, b_, t_, c_, nh);
    cpu()->attention_backward_bf16(d, dout, qkv16, att, b_, t_, c_, nh);
    cpu()->attention_backward_bf16_to_bf16(d16, scratch, dout, qkv16, att, b_, t_, c_, nh);
    pt_bf16 *out16 = malloc(sizeof(pt_bf16) * n_out);
    cpu()->attention_forward_bf16_to_bf16(out16, scratch, att, qkv16, b_, t_, c_, nh);
    for (size_t i = 0; i < n_out; i++)
        cr_expect_eq(out16[i], nearest_bf16(out[i]), "out[%zu]: %g, the nearest of %.9g", i,
                     bf16_value(out16[i]), out[i]);
    free(out16);
    for (size_t i = 0; i < n_qkv; i++)
        cr_expect_eq(d16[i], nearest_bf16(d[i]), "dqkv[%zu]: %g, the nearest of %.9g", i,
                     bf16_value(d16[i]), d[i]);
    free(qkv), free(dout), free(out), free(d), free(scratch), free(att), free(qkv16), free(d16);
}

/* A product kept in bf16 with its bias (qkv, fc): the fp32 sums and the bias rounded once,
 * the nearest bf16 of the float sum of matmul_forward_bf16's product and the bias, and within
 * one bf16 step of the sum in double; the same bits with the backend's scratch or without. */
Test(kernels, bf16_product_and_bias_are_rounded_once)
{
    const int rows = 7, cin = 19, cols = 300;
    const size_t n_in = (size_t)rows * cin, n_out = (size_t)rows * cols, n_w = (size_t)cin * cols;
    float *inp = random_floats(n_in, -2, 2), *w = random_floats(n_w, -1, 1);
    float *bias = random_floats(cols, -1, 1), *product = malloc(4 * n_out);
    float *scratch = random_floats(n_out, -9, 9);
    pt_bf16 *inp16 = malloc(2 * n_in), *w16 = malloc(2 * n_w);
    pt_bf16 *out = malloc(2 * n_out), *out_alone = malloc(2 * n_out);
    round_in_place(inp, inp16, n_in), round_in_place(w, w16, n_w);
    cpu()->matmul_forward_bf16_to_bf16(out, scratch, inp16, w16, bias, rows, cin, cols, cols,
                                       PT_WEIGHT_IN_OUT);
    cpu()->matmul_forward_bf16_to_bf16(out_alone, NULL, inp16, w16, bias, rows, cin, cols, cols,
                                       PT_WEIGHT_IN_OUT);
    cpu()->matmul_forward_bf16(product, inp16, w16, NULL, rows, cin, cols, PT_WEIGHT_IN_OUT);
    cr_expect_eq(memcmp(out, out_alone, 2 * n_out), 0, "with the scratch or without");
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < cols; o++) {
            const size_t i = (size_t)n * cols + o;
            const float sum = product[i] + bias[o];
            cr_expect_eq(out[i], nearest_bf16(sum), "[%d][%d]: %g, the nearest of %.9g", n, o,
                         bf16_value(out[i]), sum);
            double acc = bias[o];
            for (int c = 0; c < cin; c++) acc += (double)inp[n * cin + c] * w[c * cols + o];
            const pt_bf16 want = nearest_bf16((float)acc);
            cr_expect(out[i] == want || out[i] == want + 1 || out[i] + 1 == want,
                      "[%d][%d] = %g, the product and bias round to %g", n, o, bf16_value(out[i]),
                      bf16_value(want));
        }
    free(inp), free(w), free(bias), free(product), free(scratch), free(inp16), free(w16);
    free(out), free(out_alone);
}

/* The classifier under bf16: logits made in bf16 (the nearest bf16 of the exact product of
 * the rounded operands, or its neighbour when the fp32 sum lands across a rounding boundary)
 * into rows padded as the model pads them (ld > vocab: the padding neither written nor read),
 * and the cross-entropy on them: the losses the fp32 kernel gives on the values they hold, the
 * dlogits the nearest bf16 of its dlogits; the product's backward from the padded dlogits the
 * same bits as from a dense copy. */
Test(kernels, bf16_logits_and_their_crossentropy)
{
    const int rows = 5, Cin = 33, vocab = 1031, ld = 1088;
    const pt_bf16 padding = 0x7fa1; /* a NaN: read, it would show in every loss */
    float *inp = random_floats((size_t)rows * Cin, -1, 1);
    float *W = random_floats((size_t)vocab * Cin, -1, 1);
    pt_bf16 *inp16 = malloc(sizeof(pt_bf16) * rows * Cin);
    pt_bf16 *W16 = malloc(sizeof(pt_bf16) * vocab * Cin);
    round_in_place(inp, inp16, (size_t)rows * Cin);
    round_in_place(W, W16, (size_t)vocab * Cin);
    pt_bf16 *logits16 = malloc(sizeof(pt_bf16) * rows * ld);
    for (int i = 0; i < rows * ld; i++) logits16[i] = padding;
    cpu()->matmul_forward_bf16_to_bf16(logits16, NULL, inp16, W16, NULL, rows, Cin, vocab, ld,
                                       PT_WEIGHT_OUT_IN);
    float *logits = malloc(sizeof(float) * rows * vocab);
    for (int n = 0; n < rows; n++)
        for (int v = 0; v < vocab; v++) {
            double acc = 0;
            for (int c = 0; c < Cin; c++) acc += (double)inp[n * Cin + c] * W[v * Cin + c];
            const pt_bf16 got = logits16[n * ld + v], want = nearest_bf16((float)acc);
            cr_expect(got == want || got == want + 1 || got + 1 == want,
                      "logit [%d][%d] = %g, the product rounds to %g", n, v, bf16_value(got),
                      bf16_value(want));
            logits[n * vocab + v] = bf16_value(got);
        }

    int32_t targets[5] = {0, vocab - 1, 17, 1000, 3};
    float losses[5], losses16[5], losses_fb16[5], losses_fb[5];
    const float dloss = 0.5f;
    cpu()->crossentropy_forward_bf16(losses16, logits16, targets, rows, vocab, ld);
    cpu()->crossentropy_forward(losses, logits, targets, rows, vocab);
    cr_expect_eq(memcmp(losses16, losses, sizeof losses), 0, "bf16 losses = fp32 losses");
    cpu()->crossentropy_forward_backward_bf16(losses_fb16, logits16, targets, rows, vocab, ld,
                                              dloss);
    cpu()->crossentropy_forward_backward(losses_fb, logits, targets, rows, vocab, dloss);
    cr_expect_eq(memcmp(losses_fb16, losses_fb, sizeof losses), 0, "bf16 losses, with gradient");
    pt_bf16 *dense = malloc(sizeof(pt_bf16) * rows * vocab);
    for (int n = 0; n < rows; n++)
        for (int v = 0; v < ld; v++) {
            const pt_bf16 got = logits16[n * ld + v];
            if (v >= vocab && got != padding)
                cr_assert_fail("padding [%d][%d] was written: %#x", n, v, got);
            if (v < vocab && got != nearest_bf16(logits[n * vocab + v]))
                cr_assert_fail("dlogits[%d][%d] = %g, the nearest bf16 of %g", n, v,
                               bf16_value(got), logits[n * vocab + v]);
            if (v < vocab) dense[n * vocab + v] = got;
        }

    float *dinp = zero_floats(rows * Cin), *dW = zero_floats(vocab * Cin);
    float *dinp_dense = zero_floats(rows * Cin), *dW_dense = zero_floats(vocab * Cin);
    cpu()->matmul_backward_bf16_dinp_written(dinp, dW, NULL, logits16, inp16, W16, rows, Cin,
                                             vocab, ld, PT_WEIGHT_OUT_IN);
    cpu()->matmul_backward_bf16_dinp_written(dinp_dense, dW_dense, NULL, dense, inp16, W16, rows,
                                             Cin, vocab, vocab, PT_WEIGHT_OUT_IN);
    cr_expect_eq(memcmp(dinp, dinp_dense, sizeof(float) * rows * Cin), 0, "dinp from padded rows");
    cr_expect_eq(memcmp(dW, dW_dense, sizeof(float) * vocab * Cin), 0, "dW from padded rows");
    free(inp), free(W), free(inp16), free(W16), free(logits16), free(logits), free(dense);
    free(dinp), free(dW), free(dinp_dense), free(dW_dense);
}
