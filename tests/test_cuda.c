/* The CUDA backend against the CPU backend (itself checked against finite
 * differences and naive loops in test_kernels.c): every kernel of the table
 * on the same random inputs, gradients pre-filled with the same random
 * values (so the backwards' accumulation is compared too), attention forward
 * and backward at T = 1024, the bf16 GEMMs and casts, memory, staging, NCCL
 * on a one-member group, and a training step of a small GPT built once per
 * backend from the same seed.
 *
 * Every test that needs a device skips ("no CUDA device: ...") when
 * pt_kernels_cuda() finds none, or when this build has no CUDA backend.
 *
 * Tolerances. An element passes when |cuda − cpu| ≤ tol·(|cpu| + rms(cpu)),
 * rms over the whole array: relative where values are large, relative to the
 * array's scale where a value is a cancellation near 0.
 *   FP32_TOL  1e-5  one float rounding per operation, sums in another order
 *   LONG_TOL  1e-4  attention's backward (T = 1024 terms per sum, and
 *                   dP − D cancels) and a whole training step
 *   BF16_TOL  3e-2  bf16 operands against the fp32 CPU on unrounded inputs.
 *                   Rounding an operand to bf16 errs by up to 2^-8 of it
 *                   (std 2^-8/√3), so a product by ~0.32% and a sum of K
 *                   random products by ~0.32% of its rms: a GEMM's millions
 *                   of elements reach 5–6 of those σ (the first run on an
 *                   H100 found 1 element in 2.4M at 1.1% of the rms, against
 *                   1e-2 then). 3e-2 is ~9σ; a wrong layout or operand errs
 *                   by ~100%. The kernel itself is held to LONG_TOL against
 *                   the CPU on the same rounded operands.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "tests/kernel_table.h"
#include "tests/random_data.h"
#include "models/gpt.h"
#include "train/optimizer.h"

#define FP32_TOL 1e-5
#define LONG_TOL 1e-4
#define BF16_TOL 3e-2

/* In the sanitizer build on a GPU machine: the CUDA driver maps memory where
 * AddressSanitizer protects its shadow gap (cudaMalloc then fails), and the
 * driver and cuBLAS keep allocations to the end that LeakSanitizer would
 * report. These hooks are read by the sanitizer runtimes at start-up;
 * ASAN_OPTIONS and LSAN_OPTIONS still override them. Without sanitizers they
 * are unused functions. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libcuda.so\nleak:libcudart.so\nleak:libcublas\nleak:libnccl.so\n";
}

/* Each test runs in its own process and holds its own arena: keep it small
 * so that Criterion's parallel test processes share the device. */
static void limit_arena(void) { setenv("PIPERT_CUDA_ARENA_MB", "2048", 0); }

TestSuite(cuda, .init = limit_arena);

/* ---- helpers --------------------------------------------------------------- */

static int32_t *random_tokens(size_t n, int vocab)
{
    int32_t *t = malloc(n * sizeof *t);
    cr_assert(t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(uniform(0, vocab) * 0.9999);
    return t;
}

static const pt_kernels *cpu(void) { return pt_kernels_cpu(); }

/* The CUDA backend itself (the tests that call pt_cuda_* beyond the table), or the test is
 * skipped. */
static const pt_kernels *cuda_backend_or_skip(void)
{
    const pt_kernels *k = NULL;
    if (pt_kernels_cuda(&k) != PIPERT_OK) {
        const char *why = pipert_last_error(), *prefix = "no CUDA device: ";
        if (!strncmp(why, prefix, strlen(prefix))) why += strlen(prefix);
        cr_skip_test("no CUDA device: %s", why);
    }
    cr_assert(k && !strcmp(k->name, "cuda"), "pt_kernels_cuda returned no cuda table");
    return k;
}

/* Without a GPU, PIPERT_TEST_CUDA_STANDIN=cpu-guarded runs the tests that use only the kernel
 * table on runtime.device=cpu-guarded: "device" memory the host cannot touch and copies
 * checked for their direction (kernels/guarded.c), so CI checks these tests' own handling of
 * device memory, and that they run, before a GPU session spends minutes on them. Their
 * tolerances then hold trivially (the stand-in is the CPU's arithmetic). */
static bool standing_in;

static const pt_kernels *cuda_or_skip(void)
{
    const pt_kernels *k = NULL;
    const char *standin = getenv("PIPERT_TEST_CUDA_STANDIN");
    if (pt_kernels_cuda(&k) != PIPERT_OK && standin && !strcmp(standin, "cpu-guarded")) {
        pt_error_clear();
        standing_in = true;
        return pt_kernels_cpu_guarded();
    }
    return cuda_backend_or_skip();
}

/* A device copy of host[bytes]. */
static void *upload(const pt_kernels *k, const void *host, size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(k->alloc(&d, bytes, "test buffer"), PIPERT_OK, "cuda alloc of %zu bytes: %s",
                 bytes, pipert_last_error());
    k->copy_to_device(d, host, bytes);
    return d;
}

static float *download(const pt_kernels *k, const void *dev, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h);
    k->copy_to_host(h, dev, n * sizeof *h);
    return h;
}

/* Every element within tol·(|ref| + rms(ref)); NaN fails. */
static void expect_close(const char *what, const float *got, const float *ref, size_t n,
                         double tol)
{
    double squares = 0;
    for (size_t i = 0; i < n; i++) squares += (double)ref[i] * ref[i];
    double rms = sqrt(squares / (double)(n ? n : 1));
    cr_expect(rms > 0, "%s: the CPU reference is all zeros: the comparison proves nothing", what);
    size_t bad = 0, worst = 0;
    double worst_ratio = -1;
    for (size_t i = 0; i < n; i++) {
        double allowed = tol * (fabs(ref[i]) + rms), error = fabs((double)got[i] - ref[i]);
        double ratio = error <= allowed ? error / (allowed + 1e-300) : INFINITY;
        if (!(error <= allowed)) bad++;
        if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    cr_expect(bad == 0,
              "%s: %zu of %zu elements differ by more than %.0e·(|cpu| + rms %.3g); e.g. [%zu]: "
              "cuda %.9g, cpu %.9g",
              what, bad, n, tol, rms, worst, got[worst], ref[worst]);
}

/* The device copy dev[n] against the host reference. */
static void expect_device_close(const pt_kernels *gpu, const char *what, const void *dev,
                                const float *ref, size_t n, double tol)
{
    float *got = download(gpu, dev, n);
    expect_close(what, got, ref, n, tol);
    free(got);
}

static void expect_no_cuda_error(void)
{
    if (standing_in) return; /* no CUDA backend runs */
    cr_expect_eq(pt_cuda_status(), PIPERT_OK, "CUDA error: %s", pipert_last_error());
}

/* ---- without a device ------------------------------------------------------ */

Test(cuda, peak_table_knows_the_devices_mfu_needs)
{
    cr_expect_eq(pt_cuda_peak_flops("NVIDIA H100 80GB HBM3", 1), 989e12);
    cr_expect_eq(pt_cuda_peak_flops("NVIDIA H100 PCIe", 1), 756e12);
    cr_expect_eq(pt_cuda_peak_flops("NVIDIA H200", 1), 989e12);
    cr_expect_eq(pt_cuda_peak_flops("NVIDIA A100-SXM4-80GB", 1), 312e12);
    cr_expect_eq(pt_cuda_peak_flops("NVIDIA A100-SXM4-80GB", 0), 19.5e12);
    cr_expect_eq(pt_cuda_peak_flops("Tesla T4", 1), 0.0, "an unknown device has no peak");
    cr_expect_eq(pt_cuda_peak_flops(NULL, 1), 0.0);
}

Test(cuda, missing_device_is_a_clear_error)
{
    const pt_kernels *k = (const pt_kernels *)1;
    pipert_result rc = pt_kernels_cuda(&k);
    if (rc == PIPERT_OK) {
        cr_expect(k && !strcmp(k->name, "cuda"));
        return;
    }
    cr_expect(rc == PIPERT_ERR_NO_DEVICE || rc == PIPERT_ERR_UNSUPPORTED, "result %d", rc);
    cr_expect_null(k, "*out must be NULL on failure");
    cr_expect(strstr(pipert_last_error(), "CUDA") != NULL, "message: %s", pipert_last_error());
    pt_cuda_device_info info;
    cr_expect_neq(pt_cuda_device_query(&info), PIPERT_OK);
}

/* ---- the table and memory -------------------------------------------------- */

Test(cuda, table_is_complete)
{
    const pt_kernels *k = cuda_backend_or_skip();
    expect_a_complete_table(k);
    /* flash-style: one log-sum-exp per row and a copy of the output, not T×T */
    cr_expect_eq(k->attention_saved_floats(16, 1024, 768, 12), (size_t)16 * 12 * 1024 + (size_t)16 * 1024 * 768);
    pt_cuda_device_info info;
    cr_assert_eq(pt_cuda_device_query(&info), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(info.major >= 8 && info.sm_count > 0 && info.arena_bytes > 0, "%s: cc %d.%d, %d SMs",
              info.name, info.major, info.minor, info.sm_count);
}

Test(cuda, memory_is_zeroed_aligned_copied_and_reused)
{
    const pt_kernels *k = cuda_backend_or_skip();
    enum { n = 1000 };
    float host[n], back[n];
    for (int i = 0; i < n; i++) host[i] = (float)i - 17.5f;
    float *a = NULL, *b = NULL;
    cr_assert_eq(k->alloc((void **)&a, n * sizeof(float), "test a"), PIPERT_OK);
    cr_assert_eq(k->alloc((void **)&b, n * sizeof(float), "test b"), PIPERT_OK);
    cr_expect_eq((uintptr_t)a % 256, 0, "allocation not 256-byte aligned");
    cr_expect_eq((uintptr_t)b % 256, 0, "allocation not 256-byte aligned");
    k->copy_to_host(back, a, sizeof back);
    for (int i = 0; i < n; i++) cr_assert_eq(back[i], 0.0f, "alloc is not zero-filled at %d", i);
    k->copy_to_device(a, host, sizeof host);
    k->copy(b, a, sizeof host);
    k->copy_to_host(back, b, sizeof back);
    for (int i = 0; i < n; i++) cr_assert_eq(back[i], host[i], "copies lost element %d", i);
    k->zero(b, sizeof host);
    k->synchronize();
    k->copy_to_host(back, b, sizeof back);
    for (int i = 0; i < n; i++) cr_assert_eq(back[i], 0.0f, "zero missed element %d", i);

    /* the arena: freed in reverse order, memory comes back; buried frees wait */
    float *c = NULL;
    k->free(a); /* buried under b */
    cr_assert_eq(k->alloc((void **)&c, sizeof(float), "test c"), PIPERT_OK);
    cr_expect_neq(c, a, "a buried piece was handed out again");
    k->free(c);
    k->free(b); /* now b and a are both free at the top */
    cr_assert_eq(k->alloc((void **)&c, sizeof(float), "test c"), PIPERT_OK);
    cr_expect_eq(c, a, "memory freed in reverse order was not reused");
    k->free(c);

    pt_cuda_device_info info;
    cr_assert_eq(pt_cuda_device_query(&info), PIPERT_OK);
    cr_expect_eq(info.arena_used_bytes, 0, "%zu bytes still live after freeing everything",
                 info.arena_used_bytes);
    void *huge = NULL;
    cr_expect_eq(k->alloc(&huge, info.arena_bytes + 1, "too large"), PIPERT_ERR_NOMEM);
    cr_expect_null(huge);
    cr_expect(strstr(pipert_last_error(), "too large") && strstr(pipert_last_error(), "arena"),
              "message: %s", pipert_last_error());
    expect_no_cuda_error();
}

Test(cuda, pinned_staging_round_trip)
{
    const pt_kernels *k = cuda_backend_or_skip();
    const size_t n = (1 << 20) + 3;
    float *pinned_in = NULL, *pinned_out = NULL, *dev = NULL;
    cr_assert_eq(pt_cuda_pinned_alloc((void **)&pinned_in, n * sizeof(float), "in"), PIPERT_OK);
    cr_assert_eq(pt_cuda_pinned_alloc((void **)&pinned_out, n * sizeof(float), "out"), PIPERT_OK);
    cr_assert_eq(k->alloc((void **)&dev, n * sizeof(float), "dev"), PIPERT_OK);
    for (size_t i = 0; i < n; i++) pinned_in[i] = (float)(i % 1013) * 0.5f;
    pt_cuda_stage_to_device(dev, pinned_in, n * sizeof(float));
    k->scale(dev, 2.0f, n); /* compute after the copy sees its data */
    pt_cuda_stage_to_host(pinned_out, dev, n * sizeof(float)); /* and the copy after the compute */
    cr_assert_eq(pt_cuda_copy_wait(), PIPERT_OK, "%s", pipert_last_error());
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(pinned_out[i], 2.0f * pinned_in[i], "staged element %zu", i);
    /* the table's copy_to_device from pinned memory: the buffer is free on return */
    k->copy_to_device(dev, pinned_in, n * sizeof(float));
    memset(pinned_in, 0, n * sizeof(float));
    float *back = download(k, dev, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(back[i], (float)(i % 1013) * 0.5f, "copy_to_device from pinned memory [%zu]", i);
    free(back);
    k->free(dev);
    pt_cuda_pinned_free(pinned_out);
    pt_cuda_pinned_free(pinned_in);
    expect_no_cuda_error();
}

/* ---- encoder, layernorm ------------------------------------------------------ */

Test(cuda, encoder_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int B = 4, T = 64, C = 96, V = 1000, N = B * T; /* V > 256 token groups */
    int32_t *tokens = random_tokens(N, V);
    for (int n = 0; n < N; n += 3) tokens[n] = 7; /* a token repeated many times */
    float *wte = random_floats((size_t)V * C, -1, 1), *wpe = random_floats((size_t)T * C, -1, 1);
    float *out = random_floats((size_t)N * C, -9, 9), *dout = random_floats((size_t)N * C, -1, 1);
    float *dwte = random_floats((size_t)V * C, -1, 1), *dwpe = random_floats((size_t)T * C, -1, 1);
    int32_t *d_tokens = upload(gpu, tokens, N * sizeof(int32_t));
    float *d_wte = upload(gpu, wte, (size_t)V * C * 4), *d_wpe = upload(gpu, wpe, (size_t)T * C * 4);
    float *d_out = upload(gpu, out, (size_t)N * C * 4), *d_dout = upload(gpu, dout, (size_t)N * C * 4);
    float *d_dwte = upload(gpu, dwte, (size_t)V * C * 4), *d_dwpe = upload(gpu, dwpe, (size_t)T * C * 4);

    cpu()->encoder_forward(out, tokens, wte, wpe, B, T, C);
    gpu->encoder_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C);
    expect_device_close(gpu, "encoder out", d_out, out, (size_t)N * C, FP32_TOL);
    cpu()->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    gpu->encoder_backward(d_dwte, d_dwpe, d_dout, d_tokens, B, T, C);
    expect_device_close(gpu, "encoder dwte", d_dwte, dwte, (size_t)V * C, FP32_TOL);
    expect_device_close(gpu, "encoder dwpe", d_dwpe, dwpe, (size_t)T * C, FP32_TOL);
    expect_no_cuda_error();
}

static void check_layernorm(int N, int C)
{
    const pt_kernels *gpu = cuda_or_skip();
    size_t NC = (size_t)N * C;
    float *inp = random_floats(NC, -2, 3), *weight = random_floats(C, 0.5, 1.5),
          *bias = random_floats(C, -1, 1), *dout = random_floats(NC, -1, 1);
    float *out = random_floats(NC, -9, 9), *mean = random_floats(N, -9, 9),
          *rstd = random_floats(N, -9, 9);
    float *dinp = random_floats(NC, -1, 1), *dweight = random_floats(C, -1, 1),
          *dbias = random_floats(C, -1, 1);
    float *d_inp = upload(gpu, inp, NC * 4), *d_weight = upload(gpu, weight, C * 4),
          *d_bias = upload(gpu, bias, C * 4), *d_dout = upload(gpu, dout, NC * 4),
          *d_out = upload(gpu, out, NC * 4), *d_mean = upload(gpu, mean, N * 4),
          *d_rstd = upload(gpu, rstd, N * 4), *d_dinp = upload(gpu, dinp, NC * 4),
          *d_dweight = upload(gpu, dweight, C * 4), *d_dbias = upload(gpu, dbias, C * 4);

    cpu()->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    gpu->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C);
    expect_device_close(gpu, "layernorm out", d_out, out, NC, FP32_TOL);
    expect_device_close(gpu, "layernorm mean", d_mean, mean, N, FP32_TOL);
    expect_device_close(gpu, "layernorm rstd", d_rstd, rstd, N, FP32_TOL);

    cpu()->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    gpu->layernorm_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd,
                            N, C);
    expect_device_close(gpu, "layernorm dinp", d_dinp, dinp, NC, FP32_TOL);
    expect_device_close(gpu, "layernorm dweight", d_dweight, dweight, C, FP32_TOL);
    expect_device_close(gpu, "layernorm dbias", d_dbias, dbias, C, FP32_TOL);
    expect_no_cuda_error();
}

Test(cuda, layernorm_matches_cpu)
{
    check_layernorm(256, 768);
    check_layernorm(1000, 37); /* rows not a multiple of the block, C not of the warp */
}

/* ---- matmul ------------------------------------------------------------------- */

static void check_matmul(int N, int C, int OC, pt_weight_layout layout, int with_bias,
                         int with_dinp)
{
    const pt_kernels *gpu = cuda_or_skip();
    char what[96];
    const char *name = layout == PT_WEIGHT_IN_OUT ? "in-out" : "out-in";
    float *inp = random_floats((size_t)N * C, -1, 1), *weight = random_floats((size_t)C * OC, -1, 1);
    float *bias = random_floats(OC, -1, 1), *dout = random_floats((size_t)N * OC, -1, 1);
    float *out = random_floats((size_t)N * OC, -9, 9), *dinp = random_floats((size_t)N * C, -1, 1);
    float *dweight = random_floats((size_t)C * OC, -1, 1), *dbias = random_floats(OC, -1, 1);
    float *d_inp = upload(gpu, inp, (size_t)N * C * 4), *d_weight = upload(gpu, weight, (size_t)C * OC * 4),
          *d_bias = upload(gpu, bias, OC * 4), *d_dout = upload(gpu, dout, (size_t)N * OC * 4),
          *d_out = upload(gpu, out, (size_t)N * OC * 4), *d_dinp = upload(gpu, dinp, (size_t)N * C * 4),
          *d_dweight = upload(gpu, dweight, (size_t)C * OC * 4), *d_dbias = upload(gpu, dbias, OC * 4);

    cpu()->matmul_forward(out, inp, weight, with_bias ? bias : NULL, N, C, OC, layout);
    gpu->matmul_forward(d_out, d_inp, d_weight, with_bias ? d_bias : NULL, N, C, OC, layout);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d out", name, N, C, OC);
    expect_device_close(gpu, what, d_out, out, (size_t)N * OC, FP32_TOL);

    cpu()->matmul_backward(with_dinp ? dinp : NULL, dweight, with_bias ? dbias : NULL, dout, inp,
                           weight, N, C, OC, layout);
    gpu->matmul_backward(with_dinp ? d_dinp : NULL, d_dweight, with_bias ? d_dbias : NULL, d_dout,
                         d_inp, d_weight, N, C, OC, layout);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d dinp", name, N, C, OC);
    expect_device_close(gpu, what, d_dinp, dinp, (size_t)N * C, FP32_TOL);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d dweight", name, N, C, OC);
    expect_device_close(gpu, what, d_dweight, dweight, (size_t)C * OC, FP32_TOL);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d dbias", name, N, C, OC);
    expect_device_close(gpu, what, d_dbias, dbias, OC, FP32_TOL);
    expect_no_cuda_error();
    free(inp), free(weight), free(bias), free(dout), free(out), free(dinp), free(dweight), free(dbias);
    gpu->free(d_dbias), gpu->free(d_dweight), gpu->free(d_dinp), gpu->free(d_out);
    gpu->free(d_dout), gpu->free(d_bias), gpu->free(d_weight), gpu->free(d_inp);
}

Test(cuda, matmul_matches_cpu)
{
    check_matmul(37, 19, 23, PT_WEIGHT_IN_OUT, 1, 1); /* sizes nothing tiles evenly */
    check_matmul(37, 19, 23, PT_WEIGHT_OUT_IN, 1, 1);
    check_matmul(37, 19, 23, PT_WEIGHT_IN_OUT, 0, 0); /* NULL bias, dinp, dbias */
    check_matmul(37, 19, 23, PT_WEIGHT_OUT_IN, 0, 0);
    check_matmul(256, 768, 2304, PT_WEIGHT_IN_OUT, 1, 1); /* GPT-2 c_attn */
    check_matmul(64, 768, 50257, PT_WEIGHT_OUT_IN, 0, 1); /* GPT-2 lm_head */
}

/* ---- attention ----------------------------------------------------------------- */

/* The forward's output and the backward's dqkv (pre-filled, so accumulation
 * is compared too) of both backends, each with its own saved state. */
static void check_attention(int B, int T, int C, int NH)
{
    const pt_kernels *gpu = cuda_or_skip();
    char what[96];
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    size_t cpu_saved = cpu()->attention_saved_floats(B, T, C, NH);
    size_t gpu_saved = gpu->attention_saved_floats(B, T, C, NH);
    float *qkv = random_floats(n_qkv, -2, 2), *dout = random_floats(n_out, -1, 1);
    float *out = random_floats(n_out, -9, 9), *dqkv = random_floats(n_qkv, -1, 1);
    float *att = random_floats(cpu_saved, -9, 9);
    float *d_qkv = upload(gpu, qkv, n_qkv * 4), *d_dout = upload(gpu, dout, n_out * 4),
          *d_out = upload(gpu, out, n_out * 4), *d_dqkv = upload(gpu, dqkv, n_qkv * 4);
    float *d_att = NULL;
    cr_assert_eq(gpu->alloc((void **)&d_att, gpu_saved * 4, "att"), PIPERT_OK);

    cpu()->attention_forward(out, att, qkv, B, T, C, NH);
    gpu->attention_forward(d_out, d_att, d_qkv, B, T, C, NH);
    snprintf(what, sizeof what, "attention B=%d T=%d C=%d NH=%d out", B, T, C, NH);
    expect_device_close(gpu, what, d_out, out, n_out, FP32_TOL);

    cpu()->attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
    gpu->attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    snprintf(what, sizeof what, "attention B=%d T=%d C=%d NH=%d dqkv", B, T, C, NH);
    expect_device_close(gpu, what, d_dqkv, dqkv, n_qkv, LONG_TOL);
    expect_no_cuda_error();
    gpu->free(d_att), gpu->free(d_dqkv), gpu->free(d_out), gpu->free(d_dout), gpu->free(d_qkv);
    free(qkv), free(dout), free(out), free(dqkv), free(att);
}

Test(cuda, attention_matches_cpu_at_T_1024)
{
    check_attention(1, 1024, 128, 2); /* GPT-2's head size 64, its full context */
}

Test(cuda, attention_matches_cpu_for_every_head_size)
{
    check_attention(2, 67, 12, 3); /* head size 4 (template 16), T not a multiple of any tile */
    check_attention(2, 33, 64, 2); /* 32 */
    check_attention(1, 100, 96, 2); /* 48 (template 64, zero padding) */
    check_attention(1, 70, 96, 1); /* 96 (template 128) */
    check_attention(3, 1, 8, 2);   /* one position */
}

/* ---- element-wise, cross-entropy, optimizer, reductions --------------------------- */

Test(cuda, gelu_and_residual_match_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 20) + 3;
    float *x = random_floats(n, -6, 6), *b = random_floats(n, -1, 1), *dout = random_floats(n, -1, 1);
    float *y = random_floats(n, -9, 9), *dx = random_floats(n, -1, 1), *sum = random_floats(n, -9, 9);
    float *d_x = upload(gpu, x, n * 4), *d_b = upload(gpu, b, n * 4), *d_dout = upload(gpu, dout, n * 4),
          *d_y = upload(gpu, y, n * 4), *d_dx = upload(gpu, dx, n * 4), *d_sum = upload(gpu, sum, n * 4);
    cpu()->gelu_forward(y, x, n);
    gpu->gelu_forward(d_y, d_x, n);
    expect_device_close(gpu, "gelu out", d_y, y, n, FP32_TOL);
    cpu()->gelu_backward(dx, x, dout, n);
    gpu->gelu_backward(d_dx, d_x, d_dout, n);
    expect_device_close(gpu, "gelu dinp", d_dx, dx, n, FP32_TOL);
    cpu()->residual_forward(sum, x, b, n);
    gpu->residual_forward(d_sum, d_x, d_b, n);
    expect_device_close(gpu, "residual", d_sum, sum, n, 0); /* one rounding: exact */
    cpu()->scale(sum, -0.75f, n);
    gpu->scale(d_sum, -0.75f, n);
    expect_device_close(gpu, "scale", d_sum, sum, n, 0);
    expect_no_cuda_error();
}

/* dp.method=sparse's partition on the device: gather and scatter along a shuffled index. */
Test(cuda, gather_and_scatter_match_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 20) + 3, m = n / 20;
    float *x = random_floats(n, -9, 9), *y = random_floats(n, -9, 9), *picked = random_floats(m, 0, 1);
    uint32_t *index = malloc(n * sizeof *index);
    cr_assert(index);
    for (size_t i = 0; i < n; i++) index[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        const size_t j = (size_t)((i * 2654435761ull) % (i + 1));
        const uint32_t t = index[i];
        index[i] = index[j];
        index[j] = t;
    }
    float *d_x = upload(gpu, x, n * 4), *d_y = upload(gpu, y, n * 4), *d_picked = upload(gpu, picked, m * 4);
    uint32_t *d_index = upload(gpu, index, m * 4);
    cpu()->gather(picked, x, index, m);
    gpu->gather(d_picked, d_x, d_index, m);
    expect_device_close(gpu, "gather", d_picked, picked, m, 0);
    cpu()->scatter(y, index, picked, m);
    gpu->scatter(d_y, d_index, d_picked, m);
    expect_device_close(gpu, "scatter", d_y, y, n, 0);
    free(index);
    expect_no_cuda_error();
}

Test(cuda, crossentropy_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 64, V = 50257; /* rows 40..: logits near ±500 overflow a naive exp */
    size_t NV = (size_t)N * V;
    float *logits = random_floats(NV, -4, 4);
    for (int n = 40; n < N; n++)
        for (int v = 0; v < V; v++) logits[(size_t)n * V + v] += n % 2 ? 500.0f : -500.0f;
    int32_t *targets = random_tokens(N, V);
    targets[0] = 0, targets[1] = V - 1;
    float *losses = random_floats(N, -9, 9), *losses_fb = random_floats(N, -9, 9);
    float *d_logits = upload(gpu, logits, NV * 4), *d_losses = upload(gpu, losses, N * 4);
    int32_t *d_targets = upload(gpu, targets, N * sizeof(int32_t));

    cpu()->crossentropy_forward(losses, logits, targets, N, V);
    gpu->crossentropy_forward(d_losses, d_logits, d_targets, N, V);
    expect_device_close(gpu, "crossentropy losses", d_losses, losses, N, FP32_TOL);
    expect_device_close(gpu, "crossentropy_forward leaves logits alone", d_logits, logits, NV, 0);

    const float dloss = 1.0f / N;
    cpu()->crossentropy_forward_backward(losses_fb, logits, targets, N, V, dloss);
    gpu->crossentropy_forward_backward(d_losses, d_logits, d_targets, N, V, dloss);
    expect_device_close(gpu, "crossentropy_forward_backward losses", d_losses, losses_fb, N, FP32_TOL);
    expect_device_close(gpu, "crossentropy dlogits", d_logits, logits, NV, FP32_TOL);
    expect_no_cuda_error();
}

Test(cuda, adam_update_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = 100003;
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *d_param = upload(gpu, param, n * 4), *d_grad = upload(gpu, grad, n * 4),
          *d_m = upload(gpu, m, n * 4), *d_v = upload(gpu, v, n * 4);
    pt_adam_coeffs c = {.decay = 0.99f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.2f,
                        .eps = 1e-3f, .c_grad = 0.01f, .c_mom = 0.02f};
    for (int step = 0; step < 3; step++) {
        cpu()->adam_update(param, grad, m, v, n, &c);
        gpu->adam_update(d_param, d_grad, d_m, d_v, n, &c);
    }
    expect_device_close(gpu, "adam param", d_param, param, n, FP32_TOL);
    expect_device_close(gpu, "adam m", d_m, m, n, FP32_TOL);
    expect_device_close(gpu, "adam v", d_v, v, n, FP32_TOL);
    expect_no_cuda_error();
}

/* lookahead = predict's kernel (kernels.h), in place and out of place; steps = 0 is θ exactly. */
Test(cuda, adam_extrapolate_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = 100003;
    float *param = random_floats(n, -1, 1), *m = random_floats(n, -0.1, 0.1);
    float *v = random_floats(n, 0, 0.01), *out = random_floats(n, -1, 1);
    float *d_param = upload(gpu, param, n * 4), *d_m = upload(gpu, m, n * 4),
          *d_v = upload(gpu, v, n * 4), *d_out = upload(gpu, out, n * 4);
    const pt_adam_coeffs c = {.decay = 0.999f, .bias2 = 0.2f, .eps = 1e-3f, .c_mom = 0.02f};
    gpu->adam_extrapolate(d_out, d_param, d_m, d_v, n, &c, 0.0f);
    expect_device_close(gpu, "zero steps", d_out, param, n, 0.0);
    cpu()->adam_extrapolate(out, param, m, v, n, &c, 2.5f);
    gpu->adam_extrapolate(d_out, d_param, d_m, d_v, n, &c, 2.5f);
    expect_device_close(gpu, "predicted weights", d_out, out, n, FP32_TOL);
    cpu()->adam_extrapolate(param, param, m, v, n, &c, 3.0f);
    gpu->adam_extrapolate(d_param, d_param, d_m, d_v, n, &c, 3.0f);
    expect_device_close(gpu, "predicted in place", d_param, param, n, FP32_TOL);
    expect_no_cuda_error();
}

/* lookahead = dc-asgd's kernel (kernels.h): g + λ·g·g·(now − used)/(√(v/bias2) + ε) */
Test(cuda, delay_compensate_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = 100003;
    float *grad = random_floats(n, -1, 1), *now = random_floats(n, -1, 1);
    float *used = random_floats(n, -1, 1), *v = random_floats(n, 0, 0.01);
    float *d_grad = upload(gpu, grad, n * 4), *d_now = upload(gpu, now, n * 4),
          *d_used = upload(gpu, used, n * 4), *d_v = upload(gpu, v, n * 4);
    pt_adam_coeffs c = {.bias2 = 0.2f, .eps = 1e-3f};
    cpu()->delay_compensate(grad, now, used, v, n, &c, 2.0f);
    gpu->delay_compensate(d_grad, d_now, d_used, d_v, n, &c, 2.0f);
    expect_device_close(gpu, "delay-compensated gradient", d_grad, grad, n, FP32_TOL);
    expect_no_cuda_error();
}

/* lookahead = nesterov-secant's kernel (kernels.h): the running means, the previous pair and
 * the compensated gradient, with clamps on both sides hit (κ < 0, κ > cap·d, den = 0). */
Test(cuda, secant_compensate_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = 100003;
    float *grad = random_floats(n, -1, 1), *now = random_floats(n, -1, 1);
    float *used = random_floats(n, -1, 1), *v = random_floats(n, 0, 0.01);
    float *prev_grad = random_floats(n, -1, 1), *prev_used = random_floats(n, -1, 1);
    float *num = random_floats(n, -0.5, 1), *den = random_floats(n, 0, 0.1);
    for (size_t i = 0; i < n; i += 7) den[i] = 0.0f;
    float *d_grad = upload(gpu, grad, n * 4), *d_now = upload(gpu, now, n * 4),
          *d_used = upload(gpu, used, n * 4), *d_v = upload(gpu, v, n * 4),
          *d_prev_grad = upload(gpu, prev_grad, n * 4), *d_prev_used = upload(gpu, prev_used, n * 4),
          *d_num = upload(gpu, num, n * 4), *d_den = upload(gpu, den, n * 4);
    const pt_secant_coeffs c = {.beta = 0.9f, .scale = 2.0f, .cap = 30.0f, .inv_bias2 = 5.0f,
                                .eps = 1e-3f, .learn = 1, .apply = 1};
    cpu()->secant_compensate(grad, now, used, prev_grad, prev_used, num, den, v, n, &c);
    gpu->secant_compensate(d_grad, d_now, d_used, d_prev_grad, d_prev_used, d_num, d_den, d_v, n,
                           &c);
    expect_device_close(gpu, "secant numerator", d_num, num, n, FP32_TOL);
    expect_device_close(gpu, "secant denominator", d_den, den, n, FP32_TOL);
    expect_device_close(gpu, "previous gradient", d_prev_grad, prev_grad, n, 0);
    expect_device_close(gpu, "previous stash", d_prev_used, prev_used, n, 0);
    expect_device_close(gpu, "secant-compensated gradient", d_grad, grad, n, FP32_TOL);
    expect_no_cuda_error();
}

Test(cuda, reductions_match_cpu_in_double)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 22) + 5;
    float *x = random_floats(n, -1, 1);
    x[0] = 16777216.0f; /* 2²⁴: a float accumulator would drop the 1s added to it */
    float *d_x = upload(gpu, x, n * 4);
    double cpu_sum = cpu()->sum(x, n), gpu_sum = gpu->sum(d_x, n);
    double cpu_sq = cpu()->sum_squares(x, n), gpu_sq = gpu->sum_squares(d_x, n);
    double magnitude = 0; /* Σ|x|: both sums are in double, so they agree to ~1e-16 of it */
    for (size_t i = 0; i < n; i++) magnitude += fabs(x[i]);
    cr_expect(fabs(gpu_sum - cpu_sum) <= 1e-12 * magnitude, "sum: cuda %.17g, cpu %.17g", gpu_sum,
              cpu_sum);
    cr_expect(fabs(gpu_sq - cpu_sq) <= 1e-12 * cpu_sq, "sum_squares: cuda %.17g, cpu %.17g",
              gpu_sq, cpu_sq);
    cr_expect_eq(gpu->sum(d_x, n), gpu_sum, "the same input gave another sum: not deterministic");
    cr_expect_eq(gpu->sum(d_x, 0), 0.0);
    expect_no_cuda_error();
}

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
                                           layout);
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
    pt_cuda_set_mma_attention(tensor_cores);
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
    pt_cuda_set_mma_attention(1);
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
    check_attention_bf16(1, 4096, 128, 1, true);  /* the longest context the issue names */
    check_attention_bf16(2, 200, 96, 2, true);    /* head size 48: the CUDA-core kernels take it */
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

/* The GELU's gradient written in bf16: within one bf16 step of the CPU's (tanhf differs in
 * its last bits). */
Test(cuda, bf16_gelu_gradient_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 20) + 5;
    float *x = random_floats(n, -6, 6), *dout = random_floats(n, -1, 1);
    uint16_t *x16 = malloc(n * 2), *want = malloc(n * 2), *got = malloc(n * 2);
    for (size_t i = 0; i < n; i++) x16[i] = bf16_reference(x[i]);
    void *d_x = upload(gpu, x16, n * 2), *d_out = upload(gpu, x16, n * 2);
    float *d_dout = upload(gpu, dout, n * 4);
    cpu()->gelu_backward_to_bf16(want, x16, dout, n);
    gpu->gelu_backward_to_bf16(d_out, d_x, d_dout, n);
    gpu->copy_to_host(got, d_out, n * 2);
    size_t first = 0, apart = bf16_apart(got, want, n, &first);
    cr_expect_eq(apart, 0, "%zu bf16 GELU gradients more than a step from the CPU's; first [%zu]",
                 apart, first);
    expect_no_cuda_error();
    gpu->free(d_dout), gpu->free(d_out), gpu->free(d_x);
    free(x), free(dout), free(x16), free(want), free(got);
}

/* The bias added to fp32 sums and rounded once: the same float addition and rounding as the
 * CPU, so the same bits. */
Test(cuda, bf16_bias_add_matches_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 1000, OC = 2304;
    const size_t n = (size_t)N * OC;
    float *inp = random_floats(n, -4, 4), *bias = random_floats(OC, -1, 1);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    float *d_inp = upload(gpu, inp, n * 4), *d_bias = upload(gpu, bias, OC * 4);
    void *d_out = upload(gpu, want, n * 2);
    cpu()->add_bias_to_bf16(want, inp, bias, N, OC);
    gpu->add_bias_to_bf16(d_out, d_inp, d_bias, N, OC);
    gpu->copy_to_host(got, d_out, n * 2);
    cr_expect_eq(memcmp(got, want, n * 2), 0, "add_bias_to_bf16: cuda and cpu differ");
    expect_no_cuda_error();
    gpu->free(d_out), gpu->free(d_bias), gpu->free(d_inp);
    free(inp), free(bias), free(want), free(got);
}

/* The classifier under bf16: logits made in bf16 by cuBLAS against the CPU's (each within one
 * bf16 step), then the cross-entropy of the same logits: losses to fp32's tolerance, dlogits
 * within one bf16 step (expf differs in its last bits). GPT-2's vocabulary. */
Test(cuda, bf16_logits_and_crossentropy_match_cpu)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = 64, C = 128, V = 50257;
    const size_t n_in = (size_t)N * C, n_w = (size_t)V * C, n_out = (size_t)N * V;
    float *inp = random_floats(n_in, -1, 1), *w = random_floats(n_w, -0.3, 0.3);
    uint16_t *inp16 = malloc(n_in * 2), *w16 = malloc(n_w * 2), *logits = malloc(n_out * 2);
    uint16_t *got = malloc(n_out * 2);
    for (size_t i = 0; i < n_in; i++) inp16[i] = bf16_reference(inp[i]);
    for (size_t i = 0; i < n_w; i++) w16[i] = bf16_reference(w[i]);
    void *d_inp = upload(gpu, inp16, n_in * 2), *d_w = upload(gpu, w16, n_w * 2);
    void *d_logits = upload(gpu, logits, n_out * 2);
    cpu()->matmul_forward_bf16_to_bf16(logits, inp16, w16, N, C, V, PT_WEIGHT_OUT_IN);
    gpu->matmul_forward_bf16_to_bf16(d_logits, d_inp, d_w, N, C, V, PT_WEIGHT_OUT_IN);
    gpu->copy_to_host(got, d_logits, n_out * 2);
    size_t first = 0, apart = bf16_apart(got, logits, n_out, &first);
    cr_expect_eq(apart, 0, "%zu bf16 logits more than a step from the CPU's; first [%zu]: 0x%04x "
                 "against 0x%04x", apart, first, got[first], logits[first]);

    int32_t *targets = malloc(N * sizeof *targets);
    for (int n = 0; n < N; n++) targets[n] = (int32_t)((n * 7919) % V);
    float losses[64], losses_cpu[64];
    void *d_targets = upload(gpu, targets, N * sizeof *targets);
    float *d_losses = upload(gpu, losses, sizeof losses);
    gpu->copy_to_device(d_logits, logits, n_out * 2); /* both sides from the CPU's logits */
    gpu->crossentropy_forward_backward_bf16(d_losses, d_logits, d_targets, N, V, 0.125f);
    cpu()->crossentropy_forward_backward_bf16(losses_cpu, logits, targets, N, V, 0.125f);
    expect_device_close(gpu, "bf16 crossentropy losses", d_losses, losses_cpu, N, FP32_TOL);
    gpu->copy_to_host(got, d_logits, n_out * 2);
    apart = bf16_apart(got, logits, n_out, &first);
    cr_expect_eq(apart, 0, "%zu bf16 dlogits more than a step from the CPU's; first [%zu]", apart,
                 first);
    expect_no_cuda_error();
    gpu->free(d_losses), gpu->free(d_targets), gpu->free(d_logits), gpu->free(d_w);
    gpu->free(d_inp);
    free(inp), free(w), free(inp16), free(w16), free(logits), free(got), free(targets);
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
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += fabsf(bf16_to_float(y16[i]) - y[i]) > 0x1p-8f * fabsf(y[i]) + 1e-30f;
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

/* ---- NCCL ------------------------------------------------------------------------------ */

Test(cuda, nccl_one_member_group)
{
    const pt_kernels *gpu = cuda_backend_or_skip();
    pt_nccl_id id;
    pipert_result rc = pt_nccl_unique_id(&id);
    if (rc == PIPERT_ERR_UNSUPPORTED) cr_skip_test("no NCCL in this build: %s", pipert_last_error());
    cr_assert_eq(rc, PIPERT_OK, "%s", pipert_last_error());
    pt_nccl_group *g;
    cr_assert_eq(pt_nccl_group_create(&id, 1, 0, &g), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_nccl_group_size(g), 1);
    cr_expect_eq(pt_nccl_group_index(g), 0);

    const size_t n = 100003;
    float *x = random_floats(n, -1, 1), *d_x = upload(gpu, x, n * 4), *d_y = upload(gpu, x, n * 4);
    cr_expect_eq(pt_nccl_allreduce(g, d_x, n, PT_REDUCE_SUM), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_nccl_allreduce(g, d_x, n, PT_REDUCE_MEAN), PIPERT_OK, "%s", pipert_last_error());
    pt_nccl_allreduce_handle *h;
    cr_expect_eq(pt_nccl_allreduce_start(g, d_x, n, PT_REDUCE_SUM, &h), PIPERT_OK);
    gpu->scale(d_y, 1.0f, n); /* compute beside the reduction */
    cr_expect_eq(pt_nccl_allreduce_wait(h), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_nccl_broadcast(g, d_x, n * 4, 0), PIPERT_OK, "%s", pipert_last_error());
    expect_device_close(gpu, "one member's all-reduce and broadcast", d_x, x, n, 0);
    gpu->zero(d_y, n * 4);
    cr_expect_eq(pt_nccl_sendrecv(g, d_x, d_y, n * 4, 0), PIPERT_OK, "%s", pipert_last_error());
    expect_device_close(gpu, "send/recv to oneself", d_y, x, n, 0);
    cr_expect_eq(pt_nccl_broadcast(g, d_x, 4, 1), PIPERT_ERR_INVALID_ARG, "root 1 of 1 member");
    pt_nccl_group_destroy(g);
    expect_no_cuda_error();
}

/* ---- a training step ------------------------------------------------------------------ */

typedef struct trained_model {
    pt_gpt_slice *slice;
    pt_optimizer optimizer;
    float loss_before, loss_after;
} trained_model;

/* Builds the model on k, runs forward, backward and one AdamW step on the
 * batch, and the forward again. */
static trained_model train_one_step(const pt_kernels *k, const pt_gpt_config *config, int B, int T,
                                    const int32_t *tokens, const int32_t *targets)
{
    trained_model m = {0};
    cr_assert_eq(pt_gpt_slice_create(&m.slice, config, 0, config->n_layer, B, T, k), PIPERT_OK,
                 "%s: %s", k->name, pipert_last_error());
    cr_assert_eq(pt_gpt_init(m.slice, 1234), PIPERT_OK);
    k->copy_to_device(m.slice->tokens, tokens, (size_t)B * T * sizeof(int32_t));
    k->copy_to_device(m.slice->targets, targets, (size_t)B * T * sizeof(int32_t));
    pt_gpt_zero_grads(m.slice);
    pt_gpt_forward(m.slice, 1.0f, &m.loss_before);
    pt_gpt_backward(m.slice, NULL);

    pt_optimizer_settings settings = {.kind = PT_OPTIMIZER_ADAMW, .beta1 = 0.9, .beta2 = 0.95,
                                      .eps = 1e-8, .weight_decay = 0.1, .psi = PT_NADAM_PSI};
    cr_assert_eq(pt_optimizer_init(&m.optimizer, &settings, k, m.slice->n_params), PIPERT_OK);
    pt_param_region regions[m.slice->n_tensors];
    for (int i = 0; i < m.slice->n_tensors; i++)
        regions[i] = (pt_param_region){m.slice->tensors[i].offset, m.slice->tensors[i].numel,
                                       m.slice->tensors[i].decay};
    pt_optimizer_step(&m.optimizer, m.slice->params, m.slice->grads, regions, m.slice->n_tensors,
                      1e-3);
    pt_gpt_forward_eval(m.slice, &m.loss_after);
    k->synchronize();
    return m;
}

/* One training step of `config` on the GPU against the CPU table: the loss before and after
 * within loss_tol of the CPU's, every gradient within grad_tol (expect_close), and the step
 * lowering the loss. */
static void expect_training_step_like_cpu(const pt_gpt_config *config, float loss_tol,
                                          double grad_tol)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int B = 2, T = 64;
    int32_t *tokens = random_tokens((size_t)B * T, config->vocab_size);
    int32_t *targets = random_tokens((size_t)B * T, config->vocab_size);
    trained_model on_cpu = train_one_step(cpu(), config, B, T, tokens, targets);
    trained_model on_gpu = train_one_step(gpu, config, B, T, tokens, targets);
    const char *precision = config->precision == PT_PRECISION_BF16 ? "bf16" : "fp32";
    cr_expect(fabsf(on_gpu.loss_before - on_cpu.loss_before) <= loss_tol * on_cpu.loss_before,
              "%s loss: cuda %.7f, cpu %.7f", precision, on_gpu.loss_before, on_cpu.loss_before);
    float *grads = download(gpu, on_gpu.slice->grads, on_gpu.slice->n_params);
    for (int i = 0; i < on_cpu.slice->n_tensors; i++) {
        const pt_gpt_tensor *t = &on_cpu.slice->tensors[i];
        char what[96];
        snprintf(what, sizeof what, "%s gradient of %s", precision, t->name);
        expect_close(what, grads + t->offset, on_cpu.slice->grads + t->offset, t->numel, grad_tol);
    }
    cr_expect(fabsf(on_gpu.loss_after - on_cpu.loss_after) <= loss_tol * on_cpu.loss_after,
              "%s loss after one AdamW step: cuda %.7f, cpu %.7f", precision, on_gpu.loss_after,
              on_cpu.loss_after);
    cr_expect(on_gpu.loss_after < on_gpu.loss_before, "one %s step on the same batch did not "
              "lower the loss: %.7f, then %.7f", precision, on_gpu.loss_before, on_gpu.loss_after);
    free(grads);
    free(tokens);
    free(targets);
    pt_optimizer_free(&on_gpu.optimizer), pt_optimizer_free(&on_cpu.optimizer);
    pt_gpt_slice_free(on_gpu.slice), pt_gpt_slice_free(on_cpu.slice);
    expect_no_cuda_error();
}

Test(cuda, training_step_matches_cpu)
{
    const pt_gpt_config config = {.n_layer = 2, .n_embd = 64, .n_head = 4, .block_size = 64,
                                  .vocab_size = 101};
    expect_training_step_like_cpu(&config, 1e-4f, LONG_TOL);
}

/* runtime.precision = bf16: the model's products on tensor cores against the CPU's emulation
 * (the fp32 products of the same rounded operands). The operands are rounded alike, but from
 * inputs that already differ in their last fp32 bits (sums in another order), so an operand
 * may round to the neighbouring bf16: BF16_TOL, not LONG_TOL. */
Test(cuda, training_step_in_bf16_matches_the_cpus_emulation)
{
    const pt_gpt_config config = {.n_layer = 2, .n_embd = 64, .n_head = 4, .block_size = 64,
                                  .vocab_size = 101, .precision = PT_PRECISION_BF16,
                                  .recompute_gelu = true}; /* as a cuda job runs */
    expect_training_step_like_cpu(&config, 1e-3f, BF16_TOL);
}

/* A pipeline stage's activation sets take the place of the slice's first one: the arena's
 * high-water mark is the model's parameters, gradients and activation gradients and three
 * sets, not four (the first one stays buried otherwise: the arena reuses only its top). */
Test(cuda, activation_slots_take_the_place_of_the_first_set)
{
    const pt_kernels *gpu = cuda_backend_or_skip();
    const pt_gpt_config config = {.n_layer = 2, .n_embd = 64, .n_head = 4, .block_size = 64,
                                  .vocab_size = 256, .tie_weights = true};
    pt_cuda_device_info before, after;
    cr_assert_eq(pt_cuda_device_query(&before), PIPERT_OK);
    pt_gpt_slice *s = NULL;
    cr_assert_eq(pt_gpt_slice_create(&s, &config, 0, 2, 4, 64, gpu), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_assert_eq(pt_gpt_set_activation_slots(s, 3), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_cuda_device_query(&after), PIPERT_OK);
    const size_t needed = sizeof(float) * (2 * s->n_params + s->n_grad_acts + 3 * s->n_acts);
    const size_t peak = after.arena_peak_bytes - before.arena_used_bytes;
    cr_expect_leq(peak, needed + 4 * 256, "the arena peaked at %zu bytes for the %zu needed",
                  peak, needed);
    pt_gpt_slice_free(s);
    expect_no_cuda_error();
}
