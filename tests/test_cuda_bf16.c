/* The CUDA backend's bf16 kernels (runtime.precision = bf16) against the CPU's emulation of
 * them: the casts, the bf16 products, attention on CUDA cores (exact on its values) and on
 * tensor cores (within bf16's error; kernels/cuda/attention_mma.cuh), and the kernels that
 * write bf16 themselves (layernorm, products with their bias, the product backward through the
 * GELU, logits and cross-entropy, attention's output and gradient). Tolerances and helpers: tests/cuda_checks.h; without a GPU these run
 * on cpu-guarded under PIPERT_TEST_CUDA_STANDIN (the cuda_bf16-standin test). */
#include <dlfcn.h>

#include "tests/cuda_checks.h"

/* ---- bf16 --------------------------------------------------------------------------- */

/* bf16 bits of x, round to nearest even (x finite): the reference. */
static uint16_t bf16_reference(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

static float *bf16_rounded(const float *x, size_t n)
{
    float *y = malloc(n * sizeof *y);
    cr_assert(y);
    for (size_t i = 0; i < n; i++) y[i] = bf16_to_float(bf16_reference(x[i]));
    return y;
}

Test(cuda, bf16_casts_round_to_nearest_even)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = 4099;
    float *x = random_floats(n, -100, 100);
    x[0] = 1.0f + 0x1p-8f;     /* half an ulp above 1: ties to even, 1 */
    x[1] = 1.0f + 3 * 0x1p-8f; /* one and a half ulp: ties to even, 1 + 2 ulp */
    x[2] = -0.0f, x[3] = 3.0e38f;
    float *d_x = upload(gpu, x, n * 4), *d_back = NULL;
    pt_bf16 *d_b = NULL;
    cr_assert_eq(gpu->alloc((void **)&d_b, n * sizeof(pt_bf16), "bf16"), PIPERT_OK);
    cr_assert_eq(gpu->alloc((void **)&d_back, n * 4, "back"), PIPERT_OK);
    gpu->cast_to_bf16(d_b, d_x, n);
    gpu->cast_from_bf16(d_back, d_b, n);
    pt_bf16 *b = malloc(n * sizeof *b);
    gpu->copy_to_host(b, d_b, n * sizeof *b);
    float *back = download(gpu, d_back, n);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(b[i], bf16_reference(x[i]), "bf16(%.9g): cuda 0x%04x, reference 0x%04x", x[i],
                     b[i], bf16_reference(x[i]));
        cr_expect_eq(back[i], bf16_to_float(b[i]), "bf16 0x%04x back to float", b[i]);
    }
    cr_expect_eq(b[0], 0x3f80, "1 + 2^-8 rounds to 0x%04x", b[0]);
    cr_expect_eq(b[1], 0x3f82, "1 + 3·2^-8 rounds to 0x%04x", b[1]);
    expect_no_cuda_error();
    gpu->free(d_back), gpu->free(d_b), gpu->free(d_x);
    free(x), free(b), free(back);
}

/* bf16 operands, fp32 results: against the CPU on the bf16-rounded inputs
 * (the products are then exact in fp32: only the summation order differs)
 * and on the unrounded ones (what switching to bf16 costs). */
static void check_matmul_bf16(int N, int C, int OC, pt_weight_layout layout)
{
    const pt_kernels *gpu = cuda_or_skip();
    size_t n_inp = (size_t)N * C, n_w = (size_t)C * OC, n_out = (size_t)N * OC;
    float *inp = random_floats(n_inp, -1, 1), *weight = random_floats(n_w, -1, 1);
    float *dout = random_floats(n_out, -1, 1), *bias = random_floats(OC, -1, 1);
    float *inp_r = bf16_rounded(inp, n_inp), *weight_r = bf16_rounded(weight, n_w),
          *dout_r = bf16_rounded(dout, n_out);
    float *zeros_inp = calloc(n_inp, 4), *zeros_w = calloc(n_w, 4), *zeros_b = calloc(OC, 4);
    /* bf16 operands, cast on the device from fp32 copies */
    float *d_inp32 = upload(gpu, inp, n_inp * 4), *d_weight32 = upload(gpu, weight, n_w * 4),
          *d_dout32 = upload(gpu, dout, n_out * 4);
    pt_bf16 *d_inp, *d_weight, *d_dout;
    cr_assert_eq(gpu->alloc((void **)&d_inp, n_inp * 2, "inp"), PIPERT_OK);
    cr_assert_eq(gpu->alloc((void **)&d_weight, n_w * 2, "weight"), PIPERT_OK);
    cr_assert_eq(gpu->alloc((void **)&d_dout, n_out * 2, "dout"), PIPERT_OK);
    gpu->cast_to_bf16(d_inp, d_inp32, n_inp);
    gpu->cast_to_bf16(d_weight, d_weight32, n_w);
    gpu->cast_to_bf16(d_dout, d_dout32, n_out);
    float *d_bias = upload(gpu, bias, OC * 4), *d_out = NULL;
    cr_assert_eq(gpu->alloc((void **)&d_out, n_out * 4, "out"), PIPERT_OK);
    float *d_dinp = upload(gpu, zeros_inp, n_inp * 4), *d_dweight = upload(gpu, zeros_w, n_w * 4),
          *d_dbias = upload(gpu, zeros_b, OC * 4);

    gpu->matmul_forward_bf16(d_out, d_inp, d_weight, d_bias, N, C, OC, layout);
    gpu->matmul_backward_bf16(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, N, C, OC,
                              layout);
    const char *name = layout == PT_WEIGHT_IN_OUT ? "bf16 in-out" : "bf16 out-in";
    char what[96];
    for (int rounded = 1; rounded >= 0; rounded--) {
        float *out = calloc(n_out, 4), *dinp = calloc(n_inp, 4), *dweight = calloc(n_w, 4),
              *dbias = calloc(OC, 4);
        const float *x = rounded ? inp_r : inp, *w = rounded ? weight_r : weight,
                    *dy = rounded ? dout_r : dout;
        double tol = rounded ? LONG_TOL : BF16_TOL;
        const char *inputs = rounded ? "rounded inputs" : "fp32 inputs";
        cpu()->matmul_forward(out, x, w, bias, N, C, OC, layout);
        cpu()->matmul_backward(dinp, dweight, dbias, dy, x, w, N, C, OC, layout);
        snprintf(what, sizeof what, "%s out vs cpu on %s", name, inputs);
        expect_device_close(gpu, what, d_out, out, n_out, tol);
        snprintf(what, sizeof what, "%s dinp vs cpu on %s", name, inputs);
        expect_device_close(gpu, what, d_dinp, dinp, n_inp, tol);
        snprintf(what, sizeof what, "%s dweight vs cpu on %s", name, inputs);
        expect_device_close(gpu, what, d_dweight, dweight, n_w, tol);
        snprintf(what, sizeof what, "%s dbias vs cpu on %s", name, inputs);
        expect_device_close(gpu, what, d_dbias, dbias, OC, tol);
        free(out), free(dinp), free(dweight), free(dbias);
    }
    /* dinp written, not added to: whatever it held before is gone */
    float *garbage = random_floats(n_inp, -9, 9), *dinp = calloc(n_inp, 4);
    gpu->copy_to_device(d_dinp, garbage, n_inp * 4);
    gpu->matmul_backward_bf16_dinp_written(d_dinp, NULL, NULL, d_dout, d_inp, d_weight, N, C, OC,
                                           OC, layout);
    cpu()->matmul_backward(dinp, NULL, NULL, dout_r, inp_r, weight_r, N, C, OC, layout);
    snprintf(what, sizeof what, "%s dinp written (not added) vs cpu", name);
    expect_device_close(gpu, what, d_dinp, dinp, n_inp, LONG_TOL);
    free(garbage), free(dinp);
    expect_no_cuda_error();
    void *device_buffers[] = {d_dbias, d_dweight, d_dinp, d_out, d_bias, d_dout, d_weight,
                              d_inp, d_dout32, d_weight32, d_inp32};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        gpu->free(device_buffers[i]); /* newest first: the arena takes them back */
    free(inp), free(weight), free(dout), free(bias), free(inp_r), free(weight_r), free(dout_r);
    free(zeros_inp), free(zeros_w), free(zeros_b);
}

/* ‖got − ref‖ / ‖ref − before‖ over n device floats: the change a kernel made to a
 * buffer it adds into, against the change the CPU made. */
static double normwise_error(const pt_kernels *gpu, const void *dev, const float *ref,
                             const float *before, size_t n)
{
    float *got = download(gpu, dev, n);
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        err += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        norm += ((double)ref[i] - before[i]) * ((double)ref[i] - before[i]);
    }
    free(got);
    return sqrt(err / norm);
}

/* Attention on a bf16 qkv against the CPU's fp32 kernel on the same (exactly widened) values.
 * On CUDA cores (PIPERT_CUDA_MMA_ATTENTION=0) only the order of sums differs: the fp32
 * tolerances. On tensor cores (attention_mma.cuh) P, dO and dS are rounded to bf16 for the
 * products: out within u·max|v| (u = 2^-8) element by element, a bound; the gradient within
 * 2^-6 normwise (test_attention_mma.cpp derives both; its host emulation of these kernels
 * measured 2.7e-3). */
static void check_attention_bf16(int B, int T, int C, int NH, bool tensor_cores)
{
    const pt_kernels *gpu = cuda_or_skip();
    set_mma_attention(tensor_cores);
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    float *qkv = random_floats(n_qkv, -2, 2), *dout = random_floats(n_out, -1, 1);
    uint16_t *qkv16 = malloc(n_qkv * sizeof *qkv16);
    for (size_t i = 0; i < n_qkv; i++) qkv16[i] = bf16_reference(qkv[i]);
    float *wide = bf16_rounded(qkv, n_qkv);
    float *out = random_floats(n_out, -9, 9), *dqkv = random_floats(n_qkv, -1, 1);
    float *dqkv_before = malloc(n_qkv * sizeof *dqkv_before);
    memcpy(dqkv_before, dqkv, n_qkv * sizeof *dqkv);
    float *att = random_floats(cpu()->attention_saved_floats(B, T, C, NH), -9, 9);
    void *d_qkv = upload(gpu, qkv16, n_qkv * 2);
    float *d_dout = upload(gpu, dout, n_out * 4), *d_out = upload(gpu, out, n_out * 4),
          *d_dqkv = upload(gpu, dqkv, n_qkv * 4), *d_att = NULL;
    cr_assert_eq(gpu->alloc((void **)&d_att, gpu->attention_saved_floats(B, T, C, NH) * 4, "att"),
                 PIPERT_OK);
    cpu()->attention_forward(out, att, wide, B, T, C, NH);
    gpu->attention_forward_bf16(d_out, d_att, d_qkv, B, T, C, NH);
    cpu()->attention_backward(dqkv, dout, wide, att, B, T, C, NH);
    gpu->attention_backward_bf16(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    char what[128];
    snprintf(what, sizeof what, "bf16 attention on %s, B=%d T=%d C=%d NH=%d",
             tensor_cores ? "tensor cores" : "CUDA cores", B, T, C, NH);
    if (!tensor_cores) {
        expect_device_close(gpu, what, d_out, out, n_out, FP32_TOL);
        expect_device_close(gpu, what, d_dqkv, dqkv, n_qkv, LONG_TOL);
    } else {
        float *got = download(gpu, d_out, n_out);
        const double bound = ldexp(1.0, -8) * 2.0 + 1e-5; /* |v| ≤ 2 */
        for (size_t i = 0; i < n_out; i++)
            if (!(fabsf(got[i] - out[i]) <= bound))
                cr_assert_fail("%s: out[%zu] = %.7g, the CPU %.7g (bound %.3g)", what, i, got[i],
                               out[i], bound);
        free(got);
        double rel = normwise_error(gpu, d_dqkv, dqkv, dqkv_before, n_qkv);
        printf("%s: dqkv normwise error %.2e\n", what, rel);
        cr_expect(rel <= ldexp(1.0, -6), "%s: dqkv normwise error %.3g over 2^-6", what, rel);
    }
    /* the gradient written in bf16 (attention_backward_bf16_to_bf16) against the CPU's into
     * zeros: within bf16's error normwise, every element written (the output starts as NaNs) */
    float *dqkv_zero = calloc(n_qkv, sizeof *dqkv_zero);
    uint16_t *nans = malloc(n_qkv * 2);
    for (size_t i = 0; i < n_qkv; i++) nans[i] = 0x7fc0;
    cpu()->attention_backward(dqkv_zero, dout, wide, att, B, T, C, NH);
    void *d_dqkv16 = upload(gpu, nans, n_qkv * 2);
    float *d_scratch = upload(gpu, dqkv, n_qkv * 4);
    gpu->attention_backward_bf16_to_bf16(d_dqkv16, d_scratch, d_dout, d_qkv, d_att, B, T, C, NH);
    gpu->copy_to_host(nans, d_dqkv16, n_qkv * 2);
    float *written = malloc(n_qkv * sizeof *written);
    for (size_t i = 0; i < n_qkv; i++) written[i] = bf16_to_float(nans[i]);
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n_qkv; i++) {
        err += ((double)written[i] - dqkv_zero[i]) * ((double)written[i] - dqkv_zero[i]);
        norm += (double)dqkv_zero[i] * dqkv_zero[i];
    }
    const double rel = sqrt(err / norm);
    printf("%s: bf16 dqkv written, normwise error %.2e\n", what, rel);
    cr_expect(rel <= ldexp(1.0, -6), "%s: the bf16 dqkv written errs by %.3g normwise", what, rel);
    /* the output written in bf16 (attention_forward_bf16_to_bf16): the rounding of the same
     * kernels' fp32 output above, bit for bit */
    float *out_fp32 = download(gpu, d_out, n_out);
    uint16_t *out16 = malloc(n_out * 2);
    for (size_t i = 0; i < n_out; i++) out16[i] = 0x7fc0;
    void *d_out16 = upload(gpu, out16, n_out * 2);
    gpu->attention_forward_bf16_to_bf16(d_out16, d_scratch, d_att, d_qkv, B, T, C, NH);
    gpu->copy_to_host(out16, d_out16, n_out * 2);
    size_t unequal = 0;
    for (size_t i = 0; i < n_out; i++) unequal += out16[i] != bf16_reference(out_fp32[i]);
    cr_expect_eq(unequal, 0, "%s: %zu of the bf16 out are not the rounding of the fp32 out", what,
                 unequal);
    gpu->free(d_out16), gpu->free(d_scratch), gpu->free(d_dqkv16);
    free(dqkv_zero), free(nans), free(written), free(out_fp32), free(out16);
    expect_no_cuda_error();
    set_mma_attention(1);
    gpu->free(d_att), gpu->free(d_dqkv), gpu->free(d_out), gpu->free(d_dout), gpu->free(d_qkv);
    free(qkv), free(dout), free(qkv16), free(wide), free(out), free(dqkv), free(att);
    free(dqkv_before);
}

Test(cuda, bf16_attention_on_cuda_cores_matches_the_fp32_kernel_on_its_values)
{
    check_attention_bf16(1, 1024, 128, 2, false); /* head size 64 at GPT-2's context */
    check_attention_bf16(2, 67, 256, 2, false);   /* 128 */
}

Test(cuda, bf16_attention_on_tensor_cores_matches_the_fp32_kernel_within_bf16)
{
    check_attention_bf16(1, 1024, 128, 2, true);  /* head size 64 at GPT-2's context */
    check_attention_bf16(2, 67, 256, 2, true);    /* 128, T not a multiple of 64 */
    check_attention_bf16(4, 256, 192, 6, true);   /* 32: the default model's shape */
    if (!on_the_emulated_device()) /* 16 times T = 1,024's work, through the same code */
        check_attention_bf16(1, 4096, 128, 1, true); /* the longest context the issue names */
    check_attention_bf16(2, 200, 96, 2, true);    /* head size 48: the CUDA-core kernels take it */
}

/* Attention through cuDNN's fused flash attention (PIPERT_CUDA_CUDNN_ATTENTION, attention_cudnn.cu;
 * on a GPU with libcudnn.so.9 only) against the CPU's fp32 kernel on the same values: as the
 * tensor-core kernels, P, dO and dS are rounded to bf16 for the products, so out within
 * u·max|v| (u = 2^-8) plus its own rounding to bf16 (u·|out|), element by element, and the bf16
 * gradient written within 2^-6 normwise; both passes counted as cuDNN's (no fallback). */
static void check_attention_cudnn(int B, int T, int C, int NH)
{
    const pt_kernels *gpu = cuda_or_skip();
    if (standing_in) cr_skip_test("cuDNN attention runs on a GPU only");
    void *library = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!library) cr_skip_test("no libcudnn.so.9 here: %s", dlerror());
    dlclose(library);
    pt_cuda_set_cudnn_attention(1);
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    float *qkv = random_floats(n_qkv, -2, 2), *dout = random_floats(n_out, -1, 1);
    uint16_t *qkv16 = malloc(n_qkv * sizeof *qkv16), *out16 = malloc(n_out * 2),
             *dqkv16 = malloc(n_qkv * 2);
    for (size_t i = 0; i < n_qkv; i++) qkv16[i] = bf16_reference(qkv[i]), dqkv16[i] = 0x7fc0;
    for (size_t i = 0; i < n_out; i++) out16[i] = 0x7fc0; /* NaN: every element written */
    float *wide = bf16_rounded(qkv, n_qkv), *out = calloc(n_out, sizeof *out),
          *dqkv = calloc(n_qkv, sizeof *dqkv);
    float *att = calloc(cpu()->attention_saved_floats(B, T, C, NH), sizeof *att);
    cpu()->attention_forward(out, att, wide, B, T, C, NH);
    cpu()->attention_backward(dqkv, dout, wide, att, B, T, C, NH);
    void *d_qkv = upload(gpu, qkv16, n_qkv * 2), *d_out16 = upload(gpu, out16, n_out * 2),
         *d_dqkv16 = upload(gpu, dqkv16, n_qkv * 2);
    float *d_dout = upload(gpu, dout, n_out * 4), *d_scratch = upload(gpu, dqkv, n_qkv * 4),
          *d_att = NULL;
    cr_assert_eq(gpu->alloc((void **)&d_att, gpu->attention_saved_floats(B, T, C, NH) * 4, "att"),
                 PIPERT_OK);
    const long runs = pt_cuda_cudnn_attention_runs();
    gpu->attention_forward_bf16_to_bf16(d_out16, d_scratch, d_att, d_qkv, B, T, C, NH);
    gpu->attention_backward_bf16_to_bf16(d_dqkv16, d_scratch, d_dout, d_qkv, d_att, B, T, C, NH);
    gpu->copy_to_host(out16, d_out16, n_out * 2);
    gpu->copy_to_host(dqkv16, d_dqkv16, n_qkv * 2);
    expect_no_cuda_error();
    char what[128];
    snprintf(what, sizeof what, "cuDNN attention, B=%d T=%d C=%d NH=%d", B, T, C, NH);
    cr_expect_eq(pt_cuda_cudnn_attention_runs() - runs, 2, "%s: cuDNN ran %ld of the 2 passes "
                 "(the log says why not)", what, pt_cuda_cudnn_attention_runs() - runs);
    for (size_t i = 0; i < n_out; i++) {
        const double got = bf16_to_float(out16[i]), bound = ldexp(1.0, -8) * (2.0 + fabs(out[i])) + 1e-5;
        if (!(fabs(got - out[i]) <= bound))
            cr_assert_fail("%s: out[%zu] = %.7g, the CPU %.7g (bound %.3g)", what, i, got, out[i],
                           bound);
    }
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n_qkv; i++) {
        const double got = bf16_to_float(dqkv16[i]);
        err += (got - dqkv[i]) * (got - dqkv[i]);
        norm += (double)dqkv[i] * dqkv[i];
    }
    const double rel = sqrt(err / norm);
    printf("%s: bf16 dqkv written, normwise error %.2e\n", what, rel);
    cr_expect(rel <= ldexp(1.0, -6), "%s: dqkv errs by %.3g normwise", what, rel);
    pt_cuda_set_cudnn_attention(0);
    gpu->free(d_att), gpu->free(d_scratch), gpu->free(d_dout), gpu->free(d_dqkv16);
    gpu->free(d_out16), gpu->free(d_qkv);
    free(qkv), free(dout), free(qkv16), free(out16), free(dqkv16), free(wide), free(out), free(dqkv);
    free(att);
}

Test(cuda, bf16_attention_through_cudnn_matches_the_fp32_kernel_within_bf16)
{
    check_attention_cudnn(1, 1024, 128, 2); /* head size 64 at GPT-2's context */
    check_attention_cudnn(2, 67, 256, 2);   /* 128, T not a multiple of a tile */
    check_attention_cudnn(1, 67, 64, 1);    /* B·NH·T odd: the saved output moved to 16 bytes */
    check_attention_cudnn(1, 4096, 128, 1); /* the longest context the issue names */
}

/* The GELU of a bf16: forward within one bf16 rounding of the CPU's (tanhf differs in the last
 * fp32 bits, which may cross a bf16 rounding boundary), backward as fp32. */
/* Elements of two bf16 arrays more than one step of the bf16 grid apart (a sum in another
 * order may land across a rounding boundary, so neighbours are allowed; so are values that
 * differ by less than 1e-6 of the array's rms, where a cancellation near 0 may flip a sign). */
static size_t bf16_apart(const uint16_t *a, const uint16_t *b, size_t n, size_t *first)
{
    double squares = 0;
    for (size_t i = 0; i < n; i++) squares += (double)bf16_to_float(b[i]) * bf16_to_float(b[i]);
    const double floor = 1e-6 * sqrt(squares / (double)(n ? n : 1));
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
        int exponent;
        frexp(fmax(fabs(x), fabs(y)), &exponent); /* |value| in [2^(e-1), 2^e): a step 2^(e-8) */
        const double step = ldexp(1.0, exponent - 8);
        if (!(fabs(x - y) <= fmax(step, floor))) {
            if (!count) *first = i;
            count++;
        }
    }
    return count;
}

/* The layernorm written in bf16: its statistics as the fp32 kernel's against the CPU, each
 * output within one bf16 step of the CPU's (the fp32 values differ in their last bits). */
Test(cuda, bf16_layernorm_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 4096, C = 768;
    const size_t n = (size_t)N * C;
    float *inp = random_floats(n, -3, 5), *w = random_floats(C, 0.5, 1.5);
    float *b = random_floats(C, -1, 1), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    float *d_inp = upload(gpu, inp, n * 4), *d_w = upload(gpu, w, C * 4),
          *d_b = upload(gpu, b, C * 4), *d_mean = upload(gpu, mean, N * 4),
          *d_rstd = upload(gpu, rstd, N * 4);
    void *d_out = upload(gpu, want, n * 2);
    cpu()->layernorm_forward_bf16(want, mean, rstd, inp, w, b, N, C);
    gpu->layernorm_forward_bf16(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    expect_device_close(gpu, "bf16 layernorm mean", d_mean, mean, N, FP32_TOL);
    expect_device_close(gpu, "bf16 layernorm rstd", d_rstd, rstd, N, FP32_TOL);
    gpu->copy_to_host(got, d_out, n * 2);
    size_t first = 0, apart = bf16_apart(got, want, n, &first);
    cr_expect_eq(apart, 0, "%zu bf16 layernorm outputs more than a step from the CPU's; first [%zu]",
                 apart, first);
    expect_no_cuda_error();
    gpu->free(d_out), gpu->free(d_rstd), gpu->free(d_mean), gpu->free(d_b), gpu->free(d_w);
    gpu->free(d_inp);
    free(inp), free(w), free(b), free(mean), free(rstd), free(want), free(got);
}

/* The residual's sum and the layernorm after it, written in bf16: the sum exactly the CPU's,
 * mean and rstd to fp32's tolerance, each output within one bf16 step of the CPU's. */
/* The layernorm's backward that also rounds the new dinp to bf16 (the residual stream's gradient
 * under bf16): dinp, dweight and dbias as the fp32 backward's against the CPU, and the rounding
 * exactly the nearest bf16 of the device's own new dinp (against the CPU's rounding it could be
 * more than a step off where dinp cancels to near 0); in the one-pass kernel at 16-byte loads
 * and off a 16-byte boundary (shift), and in the three kernels' form (C = 2,000). */
static void check_layernorm_backward_bf16(int N, int C, size_t shift)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (size_t)N * C;
    float *inp = random_floats(n, -3, 5), *w = random_floats(C, 0.5, 1.5);
    float *dout = random_floats(n, -1, 1), *dinp = random_floats(n, -1, 1);
    float *dw = random_floats(C, -1, 1), *db = random_floats(C, -1, 1);
    float *mean = random_floats(N, -0.5, 0.5), *rstd = random_floats(N, 0.5, 2);
    uint16_t *rounded = malloc(n * 2), *got = malloc(n * 2);
    float *d_inp = upload_shifted(gpu, inp, n * 4, shift),
          *d_w = upload_shifted(gpu, w, C * 4, shift),
          *d_dout = upload_shifted(gpu, dout, n * 4, shift),
          *d_dinp = upload_shifted(gpu, dinp, n * 4, shift),
          *d_dw = upload_shifted(gpu, dw, C * 4, shift),
          *d_db = upload_shifted(gpu, db, C * 4, shift),
          *d_mean = upload_shifted(gpu, mean, N * 4, shift),
          *d_rstd = upload_shifted(gpu, rstd, N * 4, shift);
    void *d_rounded = upload_shifted(gpu, inp, n * 2, shift / 2);
    cpu()->layernorm_backward_bf16(dinp, rounded, dw, db, dout, inp, w, mean, rstd, N, C);
    gpu->layernorm_backward_bf16(d_dinp, d_rounded, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd,
                                 N, C);
    expect_device_close(gpu, "bf16 layernorm backward dinp", d_dinp, dinp, n, FP32_TOL);
    expect_device_close(gpu, "bf16 layernorm backward dweight", d_dw, dw, C, FP32_TOL);
    expect_device_close(gpu, "bf16 layernorm backward dbias", d_db, db, C, FP32_TOL);
    gpu->copy_to_host(got, d_rounded, n * 2);
    float *new_dinp = download(gpu, d_dinp, n);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != bf16_reference(new_dinp[i]) && !wrong++) first = i;
    cr_expect_eq(wrong, 0,
                 "N %d, C %d, shift %zu: %zu of the rounded dinp not the nearest bf16 of the new "
                 "dinp; first [%zu]: %g for %.9g", N, C, shift, wrong, first,
                 bf16_to_float(got[first]), new_dinp[first]);
    free(new_dinp);
    expect_no_cuda_error();
    free_shifted(gpu, d_rounded, shift / 2);
    float *device_buffers[] = {d_inp, d_w, d_dout, d_dinp, d_dw, d_db, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        free_shifted(gpu, device_buffers[i], shift);
    free(inp), free(w), free(dout), free(dinp), free(dw), free(db), free(mean), free(rstd);
    free(rounded), free(got);
}

Test(cuda, bf16_layernorm_backward_rounds_the_dinp_it_writes)
{
    check_layernorm_backward_bf16(1024, 768, 0);
    check_layernorm_backward_bf16(1024, 768, 4); /* 2-byte off for the rounded: element form */
    check_layernorm_backward_bf16(300, 2000, 0); /* the three kernels */
}

Test(cuda, bf16_residual_layernorm_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 1000, C = 768;
    const size_t n = (size_t)N * C;
    float *a = random_floats(n, -3, 5), *b = random_floats(n, -1, 1), *residual = malloc(n * 4);
    float *w = random_floats(C, 0.5, 1.5), *bias = random_floats(C, -1, 1);
    float *mean = malloc(N * 4), *rstd = malloc(N * 4);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    float *d_a = upload(gpu, a, n * 4), *d_b = upload(gpu, b, n * 4), *d_w = upload(gpu, w, C * 4),
          *d_bias = upload(gpu, bias, C * 4), *d_residual = upload(gpu, b, n * 4),
          *d_mean = upload(gpu, a, N * 4), *d_rstd = upload(gpu, a, N * 4);
    void *d_out = upload(gpu, b, n * 2);
    cpu()->residual_layernorm_forward_bf16(residual, want, mean, rstd, a, b, w, bias, N, C);
    gpu->residual_layernorm_forward_bf16(d_residual, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias,
                                         N, C);
    expect_device_close(gpu, "bf16 residual_layernorm's residual", d_residual, residual, n, 0.0);
    expect_device_close(gpu, "bf16 residual_layernorm mean", d_mean, mean, N, FP32_TOL);
    expect_device_close(gpu, "bf16 residual_layernorm rstd", d_rstd, rstd, N, FP32_TOL);
    gpu->copy_to_host(got, d_out, n * 2);
    size_t first = 0, apart = bf16_apart(got, want, n, &first);
    cr_expect_eq(apart, 0, "%zu bf16 outputs more than a step from the CPU's; first [%zu]", apart,
                 first);
    expect_no_cuda_error();
    void *device_buffers[] = {d_out, d_rstd, d_mean, d_residual, d_bias, d_w, d_b, d_a};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        gpu->free(device_buffers[i]);
    free(a), free(b), free(residual), free(w), free(bias), free(mean), free(rstd), free(want);
    free(got);
}

/* Each test below runs the products both ways the backend can make them (lt_ways,
 * expect_made_by_lt: tests/cuda_checks.h). */

/* A product kept in bf16 with its bias (qkv's shape at 512 positions): each output within
 * one bf16 step of the CPU's (only the order of the fp32 sums differs), whatever the scratch
 * held. */
Test(cuda, bf16_product_with_bias_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 512, C = 768, OC = 2304;
    const size_t n_in = (size_t)N * C, n_w = (size_t)C * OC, n_out = (size_t)N * OC;
    float *inp = random_floats(n_in, -1, 1), *w = random_floats(n_w, -0.2, 0.2);
    float *bias = random_floats(OC, -1, 1), *garbage = random_floats(n_out, -9, 9);
    uint16_t *inp16 = malloc(n_in * 2), *w16 = malloc(n_w * 2), *want = malloc(n_out * 2);
    uint16_t *got = malloc(n_out * 2);
    for (size_t i = 0; i < n_in; i++) inp16[i] = bf16_reference(inp[i]);
    for (size_t i = 0; i < n_w; i++) w16[i] = bf16_reference(w[i]);
    void *d_inp = upload(gpu, inp16, n_in * 2), *d_w = upload(gpu, w16, n_w * 2);
    float *d_bias = upload(gpu, bias, OC * 4), *d_scratch = upload(gpu, garbage, n_out * 4);
    void *d_out = upload(gpu, got, n_out * 2);
    cpu()->matmul_forward_bf16_to_bf16(want, NULL, inp16, w16, bias, N, C, OC, OC,
                                       PT_WEIGHT_IN_OUT);
    for (int lt = 0; lt < 2; lt++) {
        set_lt(lt);
        const long fused_before = lt_products();
        gpu->copy_to_device(d_scratch, garbage, n_out * 4);
        gpu->matmul_forward_bf16_to_bf16(d_out, d_scratch, d_inp, d_w, d_bias, N, C, OC, OC,
                                         PT_WEIGHT_IN_OUT);
        gpu->copy_to_host(got, d_out, n_out * 2);
        size_t first = 0, apart = bf16_apart(got, want, n_out, &first);
        cr_expect_eq(apart, 0, "%s: %zu bf16 outputs more than a step from the CPU's; first [%zu]",
                     lt_ways[lt], apart, first);
        expect_made_by_lt(lt, lt_products() - fused_before, 1, "the bias");
    }
    set_lt(1);
    expect_no_cuda_error();
    gpu->free(d_out), gpu->free(d_scratch), gpu->free(d_bias), gpu->free(d_w), gpu->free(d_inp);
    free(inp), free(w), free(bias), free(garbage), free(inp16), free(w16), free(want), free(got);
}

/* The MLP's second product's backward through the GELU (its shape at 512 positions): dpre
 * within one bf16 step of the CPU's (the fp32 sums' order and tanhf's last bits differ), written
 * over whatever it held; dweight and dbias added to what they held, to the products' tolerance. */
/* cuBLASLt's heuristic is asked once per kind of product (gemm_lt.cu keeps its answers): the
 * same product again asks nothing; the same shape with its output 32 bytes off its alignment
 * is another kind (the kept algorithm promised 256-byte alignment: on the emulated device a
 * product through it would be refused), asked once, and right. */
Test(cuda, bf16_products_of_one_kind_ask_cublaslt_once)
{
    const pt_kernels *gpu = cuda_or_skip();
    if (standing_in && !on_the_emulated_device()) cr_skip_test("no cuBLASLt on cpu-guarded");
    const int N = 64, C = 96, OC = 160;
    const size_t n_in = (size_t)N * C, n_w = (size_t)C * OC, n_out = (size_t)N * OC;
    float *inp = random_floats(n_in, -1, 1), *w = random_floats(n_w, -0.2, 0.2);
    float *bias = random_floats(OC, -1, 1);
    uint16_t *inp16 = malloc(n_in * 2), *w16 = malloc(n_w * 2), *want = malloc(n_out * 2);
    uint16_t *got = calloc(n_out + 16, 2);
    for (size_t i = 0; i < n_in; i++) inp16[i] = bf16_reference(inp[i]);
    for (size_t i = 0; i < n_w; i++) w16[i] = bf16_reference(w[i]);
    void *d_inp = upload(gpu, inp16, n_in * 2), *d_w = upload(gpu, w16, n_w * 2);
    float *scratch = calloc(n_out, sizeof *scratch); /* the table entry's fp32 scratch */
    float *d_bias = upload(gpu, bias, OC * 4), *d_scratch = upload(gpu, scratch, n_out * 4);
    uint16_t *d_out = upload(gpu, got, (n_out + 16) * 2);
    cpu()->matmul_forward_bf16_to_bf16(want, NULL, inp16, w16, bias, N, C, OC, OC,
                                       PT_WEIGHT_IN_OUT);
    set_lt(1);
    const long asked = lt_heuristic_queries(), made = lt_products();
    for (int round = 0; round < 3; round++) {
        uint16_t *out = round < 2 ? d_out : d_out + 16; /* 32 bytes on: another kind */
        gpu->matmul_forward_bf16_to_bf16(out, d_scratch, d_inp, d_w, d_bias, N, C, OC, OC,
                                         PT_WEIGHT_IN_OUT);
        gpu->copy_to_host(got, out, n_out * 2);
        size_t first = 0, apart = bf16_apart(got, want, n_out, &first);
        cr_expect_eq(apart, 0, "round %d: %zu outputs more than a step from the CPU's; first [%zu]",
                     round, apart, first);
        cr_expect_eq(lt_heuristic_queries() - asked, round < 2 ? 1 : 2,
                     "round %d: the heuristic was asked %ld times", round,
                     lt_heuristic_queries() - asked);
    }
    expect_made_by_lt(1, lt_products() - made, 3, "the bias");
    expect_no_cuda_error();
    gpu->free(d_out), gpu->free(d_scratch), gpu->free(d_bias), gpu->free(d_w), gpu->free(d_inp);
    free(inp), free(w), free(bias), free(inp16), free(w16), free(want), free(got), free(scratch);
}

Test(cuda, bf16_product_backward_through_the_gelu_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 512, C = 3072, OC = 768;
    const size_t n_in = (size_t)N * C, n_w = (size_t)C * OC, n_out = (size_t)N * OC;
    float *pre = random_floats(n_in, -4, 4), *gelu = random_floats(n_in, -0.2, 3);
    float *dout = random_floats(n_out, -1, 1), *w = random_floats(n_w, -0.2, 0.2);
    float *dw0 = random_floats(n_w, -1, 1), *db0 = random_floats(OC, -1, 1);
    uint16_t *pre16 = malloc(n_in * 2), *gelu16 = malloc(n_in * 2), *dout16 = malloc(n_out * 2);
    uint16_t *w16 = malloc(n_w * 2), *want = malloc(n_in * 2), *got = malloc(n_in * 2);
    for (size_t i = 0; i < n_in; i++) pre16[i] = bf16_reference(pre[i]);
    for (size_t i = 0; i < n_in; i++) gelu16[i] = bf16_reference(gelu[i]);
    for (size_t i = 0; i < n_out; i++) dout16[i] = bf16_reference(dout[i]);
    for (size_t i = 0; i < n_w; i++) w16[i] = bf16_reference(w[i]);
    float *dw = malloc(n_w * 4), *db = malloc(OC * 4);
    memcpy(dw, dw0, n_w * 4), memcpy(db, db0, OC * 4);
    cpu()->matmul_gelu_backward_bf16(want, NULL, dw, db, dout16, gelu16, pre16, w16, N, C, OC,
                                     PT_WEIGHT_IN_OUT);
    void *d_pre = upload(gpu, pre16, n_in * 2), *d_gelu = upload(gpu, gelu16, n_in * 2);
    void *d_dout = upload(gpu, dout16, n_out * 2), *d_w = upload(gpu, w16, n_w * 2);
    void *d_dpre = upload(gpu, gelu16, n_in * 2);
    float *d_scratch = upload(gpu, pre, n_in * 4), *d_dw = upload(gpu, dw0, n_w * 4),
          *d_db = upload(gpu, db0, OC * 4);
    char what[96];
    for (int lt = 0; lt < 2; lt++) {
        set_lt(lt);
        gpu->copy_to_device(d_dw, dw0, n_w * 4), gpu->copy_to_device(d_db, db0, OC * 4);
        gpu->copy_to_device(d_dpre, gelu16, n_in * 2);
        const long fused_before = lt_products();
        gpu->matmul_gelu_backward_bf16(d_dpre, d_scratch, d_dw, d_db, d_dout, d_gelu, d_pre, d_w, N,
                                       C, OC, PT_WEIGHT_IN_OUT);
        expect_made_by_lt(lt, lt_products() - fused_before, 2,
                          "the GELU's gradient or the bias gradient");
        gpu->copy_to_host(got, d_dpre, n_in * 2);
        size_t first = 0, apart = bf16_apart(got, want, n_in, &first);
        cr_expect_eq(apart, 0, "%s: %zu of dpre more than a bf16 step from the CPU's; first [%zu]",
                     lt_ways[lt], apart, first);
        snprintf(what, sizeof what, "%s: dweight through the GELU", lt_ways[lt]);
        expect_device_close(gpu, what, d_dw, dw, n_w, LONG_TOL);
        snprintf(what, sizeof what, "%s: dbias through the GELU", lt_ways[lt]);
        expect_device_close(gpu, what, d_db, db, OC, LONG_TOL);
    }
    set_lt(1);
    expect_no_cuda_error();
    void *device_buffers[] = {d_db, d_dw, d_scratch, d_dpre, d_w, d_dout, d_gelu, d_pre};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        gpu->free(device_buffers[i]);
    free(pre), free(gelu), free(dout), free(w), free(dw0), free(db0), free(pre16), free(gelu16);
    free(dout16), free(w16), free(want), free(got), free(dw), free(db);
}

/* The rows' first V values of a [N, ld] buffer, dense (free it); and whether the padding past
 * them still holds `padding` (neither the product nor the cross-entropy may write it). */
static uint16_t *dense_rows(const uint16_t *x, int N, int V, int ld)
{
    uint16_t *out = malloc((size_t)N * V * sizeof *out);
    cr_assert(out);
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * V, x + (size_t)n * ld, V * sizeof *out);
    return out;
}

static void expect_padding_kept(const char *what, const uint16_t *x, int N, int V, int ld,
                                uint16_t padding)
{
    size_t written = 0;
    for (int n = 0; n < N; n++)
        for (int v = V; v < ld; v++) written += x[(size_t)n * ld + v] != padding;
    cr_expect_eq(written, 0, "%s: %zu values of the rows' padding were written", what, written);
}

/* The rows of got and want (both [N, ld]) within one bf16 step of each other, their padding
 * untouched. */
static void expect_logits_close(const char *what, const uint16_t *got, const uint16_t *want, int N,
                                int V, int ld, uint16_t padding)
{
    uint16_t *a = dense_rows(got, N, V, ld), *b = dense_rows(want, N, V, ld);
    size_t first = 0, apart = bf16_apart(a, b, (size_t)N * V, &first);
    cr_expect_eq(apart, 0, "%zu bf16 %s more than a step from the CPU's; first [%zu]: 0x%04x "
                 "against 0x%04x", apart, what, first, a[first], b[first]);
    expect_padding_kept(what, got, N, V, ld, padding);
    free(a), free(b);
}

/* The classifier under bf16: logits made in bf16 by cuBLAS against the CPU's (each within one
 * bf16 step), then the cross-entropy of the same logits: losses to fp32's tolerance, dlogits
 * within one bf16 step (expf differs in its last bits); then the product's backward from them.
 * GPT-2's vocabulary, in rows padded as the model pads them (50,304: 16-byte aligned rows),
 * the padding a NaN that neither side may write or read. */
Test(cuda, bf16_logits_and_crossentropy_match_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 64, C = 128, V = 50257, ld = 50304;
    const uint16_t padding = 0x7fa1;
    const size_t n_in = (size_t)N * C, n_w = (size_t)V * C, n_out = (size_t)N * ld;
    float *inp = random_floats(n_in, -1, 1), *w = random_floats(n_w, -0.3, 0.3);
    uint16_t *inp16 = malloc(n_in * 2), *w16 = malloc(n_w * 2), *logits = malloc(n_out * 2);
    uint16_t *got = malloc(n_out * 2);
    for (size_t i = 0; i < n_in; i++) inp16[i] = bf16_reference(inp[i]);
    for (size_t i = 0; i < n_w; i++) w16[i] = bf16_reference(w[i]);
    for (size_t i = 0; i < n_out; i++) logits[i] = padding;
    void *d_inp = upload(gpu, inp16, n_in * 2), *d_w = upload(gpu, w16, n_w * 2);
    void *d_logits = upload(gpu, logits, n_out * 2);
    cpu()->matmul_forward_bf16_to_bf16(logits, NULL, inp16, w16, NULL, N, C, V, ld,
                                       PT_WEIGHT_OUT_IN);
    gpu->matmul_forward_bf16_to_bf16(d_logits, NULL, d_inp, d_w, NULL, N, C, V, ld,
                                     PT_WEIGHT_OUT_IN);
    gpu->copy_to_host(got, d_logits, n_out * 2);
    expect_logits_close("logits", got, logits, N, V, ld, padding);

    int32_t *targets = malloc(N * sizeof *targets);
    for (int n = 0; n < N; n++) targets[n] = (int32_t)((n * 7919) % V);
    float losses[64], losses_cpu[64];
    void *d_targets = upload(gpu, targets, N * sizeof *targets);
    float *d_losses = upload(gpu, losses, sizeof losses);
    gpu->copy_to_device(d_logits, logits, n_out * 2); /* both sides from the CPU's logits */
    gpu->crossentropy_forward_backward_bf16(d_losses, d_logits, d_targets, N, V, ld, 0.125f);
    cpu()->crossentropy_forward_backward_bf16(losses_cpu, logits, targets, N, V, ld, 0.125f);
    expect_device_close(gpu, "bf16 crossentropy losses", d_losses, losses_cpu, N, FP32_TOL);
    gpu->copy_to_host(got, d_logits, n_out * 2);
    expect_logits_close("dlogits", got, logits, N, V, ld, padding);

    /* the backward from the CPU's dlogits, padded, against the CPU's */
    float *dinp = calloc(n_in, 4), *dw = calloc(n_w, 4);
    float *d_dinp = upload(gpu, dinp, n_in * 4), *d_dw = upload(gpu, dw, n_w * 4);
    gpu->copy_to_device(d_logits, logits, n_out * 2);
    gpu->matmul_backward_bf16_dinp_written(d_dinp, d_dw, NULL, d_logits, d_inp, d_w, N, C, V, ld,
                                           PT_WEIGHT_OUT_IN);
    cpu()->matmul_backward_bf16_dinp_written(dinp, dw, NULL, logits, inp16, w16, N, C, V, ld,
                                             PT_WEIGHT_OUT_IN);
    expect_device_close(gpu, "dinp from padded dlogits", d_dinp, dinp, n_in, LONG_TOL);
    expect_device_close(gpu, "dweight from padded dlogits", d_dw, dw, n_w, LONG_TOL);
    expect_no_cuda_error();
    gpu->free(d_dw), gpu->free(d_dinp);
    gpu->free(d_losses), gpu->free(d_targets), gpu->free(d_logits), gpu->free(d_w);
    gpu->free(d_inp);
    free(inp), free(w), free(inp16), free(w16), free(logits), free(got), free(targets);
    free(dinp), free(dw);
}

Test(cuda, bf16_gelu_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 20) + 3;
    float *x = random_floats(n, -6, 6), *dout = random_floats(n, -1, 1);
    float *dx = random_floats(n, -1, 1), *y = malloc(n * sizeof *y);
    uint16_t *x16 = malloc(n * sizeof *x16), *y16 = malloc(n * sizeof *y16);
    for (size_t i = 0; i < n; i++) x16[i] = bf16_reference(x[i]);
    float *wide = bf16_rounded(x, n);
    void *d_x = upload(gpu, x16, n * 2), *d_y = upload(gpu, x16, n * 2);
    float *d_dout = upload(gpu, dout, n * 4), *d_dx = upload(gpu, dx, n * 4);
    cpu()->gelu_forward(y, wide, n);
    gpu->gelu_forward_bf16(d_y, d_x, n);
    gpu->copy_to_host(y16, d_y, n * 2);
    /* a bf16 rounding (2⁻⁸ of the value at most) of the device's fp32 GELU, which itself agrees
     * with the CPU's as the fp32 test holds it (FP32_TOL·(|y| + rms)): below x ≈ −4, 1 + tanh u
     * cancels, and the CPU's vectorized tanh and the device's differ there in relative terms */
    double squares = 0;
    for (size_t i = 0; i < n; i++) squares += (double)y[i] * y[i];
    const double rms = sqrt(squares / n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += fabs(bf16_to_float(y16[i]) - y[i]) >
               0x1p-8 * fabs(y[i]) + FP32_TOL * (fabs(y[i]) + rms);
    cr_expect_eq(off, 0, "%zu of %zu bf16 GELU outputs more than a bf16 rounding away", off, n);
    cpu()->gelu_backward(dx, wide, dout, n);
    gpu->gelu_backward_bf16(d_dx, d_x, d_dout, n);
    expect_device_close(gpu, "bf16 gelu dinp", d_dx, dx, n, FP32_TOL);
    expect_no_cuda_error();
    gpu->free(d_dx), gpu->free(d_dout), gpu->free(d_y), gpu->free(d_x);
    free(x), free(dout), free(dx), free(y), free(x16), free(y16), free(wide);
}

Test(cuda, bf16_matmul_matches_cpu)
{
    check_matmul_bf16(256, 768, 3072, PT_WEIGHT_IN_OUT); /* GPT-2 c_fc */
    check_matmul_bf16(64, 768, 5000, PT_WEIGHT_OUT_IN);  /* a head */
    check_matmul_bf16(37, 19, 23, PT_WEIGHT_IN_OUT);
}
