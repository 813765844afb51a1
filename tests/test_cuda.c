/* The CUDA backend against the CPU backend (itself checked against finite
 * differences and naive loops in test_kernels.c): every kernel of the table
 * on the same random inputs, gradients pre-filled with the same random
 * values (so the backwards' accumulation is compared too), attention forward
 * and backward at T = 1024, memory, staging, NCCL on a one-member group, and
 * a training step of a small GPT built once per backend from the same seed
 * (fp32, and bf16 against the CPU's emulation).
 *
 * Every test that needs a device skips ("no CUDA device: ...") when
 * pt_kernels_cuda() finds none, or when this build has no CUDA backend.
 *
 * Tolerances (FP32_TOL, LONG_TOL, BF16_TOL) and helpers: tests/cuda_checks.h. The
 * bf16 kernels' tests are in test_cuda_bf16.c.
 */
#include "tests/cuda_checks.h"
#include "models/gpt.h"
#include "train/optimizer.h"

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

/* dwte adds each position's row in position order, as the CPU: the same bits. */
static void check_encoder(int B, int T, int C, int V)
{
    const pt_kernels *gpu = cuda_or_skip();
    const int N = B * T;
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
    expect_device_close(gpu, "encoder dwte", d_dwte, dwte, (size_t)V * C, 0);
    expect_device_close(gpu, "encoder dwpe", d_dwpe, dwpe, (size_t)T * C, FP32_TOL);
    expect_no_cuda_error();
    void *device_buffers[] = {d_tokens, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        gpu->free(device_buffers[i]);
    free(tokens), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
}

Test(cuda, encoder_matches_cpu)
{
    check_encoder(4, 64, 96, 1000);  /* V > 256 token groups */
    check_encoder(5, 300, 130, 700); /* 1,500 positions: two token tiles, the second partial; C
                                      * not a multiple of a block's 128 channels */
}

/* shift: every device buffer that many bytes off a 16-byte boundary (the kernels' element-by-
 * element form where 16-byte loads would fault) */
static void check_layernorm(int N, int C, size_t shift)
{
    const pt_kernels *gpu = cuda_or_skip();
    size_t NC = (size_t)N * C;
    float *inp = random_floats(NC, -2, 3), *weight = random_floats(C, 0.5, 1.5),
          *bias = random_floats(C, -1, 1), *dout = random_floats(NC, -1, 1);
    float *out = random_floats(NC, -9, 9), *mean = random_floats(N, -9, 9),
          *rstd = random_floats(N, -9, 9);
    float *dinp = random_floats(NC, -1, 1), *dweight = random_floats(C, -1, 1),
          *dbias = random_floats(C, -1, 1);
    float *d_inp = upload_shifted(gpu, inp, NC * 4, shift),
          *d_weight = upload_shifted(gpu, weight, C * 4, shift),
          *d_bias = upload_shifted(gpu, bias, C * 4, shift),
          *d_dout = upload_shifted(gpu, dout, NC * 4, shift),
          *d_out = upload_shifted(gpu, out, NC * 4, shift),
          *d_mean = upload_shifted(gpu, mean, N * 4, shift),
          *d_rstd = upload_shifted(gpu, rstd, N * 4, shift),
          *d_dinp = upload_shifted(gpu, dinp, NC * 4, shift),
          *d_dweight = upload_shifted(gpu, dweight, C * 4, shift),
          *d_dbias = upload_shifted(gpu, dbias, C * 4, shift);

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
    float *device_buffers[] = {d_inp, d_weight, d_bias, d_dout, d_out,
                               d_mean, d_rstd, d_dinp, d_dweight, d_dbias};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        free_shifted(gpu, device_buffers[i], shift);
    float *host_buffers[] = {inp, weight, bias, dout, out, mean, rstd, dinp, dweight, dbias};
    for (size_t i = 0; i < sizeof host_buffers / sizeof host_buffers[0]; i++) free(host_buffers[i]);
}

Test(cuda, layernorm_matches_cpu)
{
    check_layernorm(256, 768, 0);
    check_layernorm(256, 768, 4); /* C a multiple of 4, the rows off 16-byte boundaries */
    check_layernorm(1000, 37, 0); /* rows not a multiple of the block, C not of the warp */
    check_layernorm(5001, 768, 0); /* the one-pass backward's fixed grid: warps of 1 and 2 rows */
    check_layernorm(300, 2000, 0); /* its sums too large for shared memory: three kernels */
}

/* The residual's sum and the layernorm after it in one pass, the sum written over its first
 * addend as the model does: the sum exactly the CPU's (one fp32 addition), the rest to fp32's
 * tolerance. */
static void check_residual_layernorm(int N, int C, size_t shift)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t NC = (size_t)N * C;
    float *a = random_floats(NC, -2, 3), *b = random_floats(NC, -1, 1);
    float *weight = random_floats(C, 0.5, 1.5), *bias = random_floats(C, -1, 1);
    float *residual = malloc(NC * 4), *out = random_floats(NC, -9, 9);
    float *mean = random_floats(N, -9, 9), *rstd = random_floats(N, -9, 9);
    float *d_a = upload_shifted(gpu, a, NC * 4, shift),
          *d_b = upload_shifted(gpu, b, NC * 4, shift),
          *d_weight = upload_shifted(gpu, weight, C * 4, shift),
          *d_bias = upload_shifted(gpu, bias, C * 4, shift),
          *d_out = upload_shifted(gpu, out, NC * 4, shift),
          *d_mean = upload_shifted(gpu, mean, N * 4, shift),
          *d_rstd = upload_shifted(gpu, rstd, N * 4, shift);
    cpu()->residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, N, C);
    gpu->residual_layernorm_forward(d_a, d_out, d_mean, d_rstd, d_a, d_b, d_weight, d_bias, N, C);
    expect_device_close(gpu, "residual of residual_layernorm", d_a, residual, NC, 0.0);
    expect_device_close(gpu, "residual_layernorm out", d_out, out, NC, FP32_TOL);
    expect_device_close(gpu, "residual_layernorm mean", d_mean, mean, N, FP32_TOL);
    expect_device_close(gpu, "residual_layernorm rstd", d_rstd, rstd, N, FP32_TOL);
    expect_no_cuda_error();
    float *device_buffers[] = {d_rstd, d_mean, d_out, d_bias, d_weight, d_b, d_a};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        free_shifted(gpu, device_buffers[i], shift);
    free(a), free(b), free(weight), free(bias), free(residual), free(out), free(mean), free(rstd);
}

Test(cuda, residual_layernorm_matches_cpu)
{
    check_residual_layernorm(256, 768, 0);
    check_residual_layernorm(256, 768, 8); /* the element-by-element form */
    check_residual_layernorm(1000, 37, 0);
}

/* ---- matmul ------------------------------------------------------------------- */

/* One way (lt: the bias in cuBLASLt's epilogue, or a kernel and cuBLAS) against the CPU */
static void check_matmul_way(int N, int C, int OC, pt_weight_layout layout, int with_bias,
                             int with_dinp, int lt)
{
    const pt_kernels *gpu = cuda_or_skip();
    set_lt(lt);
    char what[160];
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
    const long fused_before = lt_products();
    gpu->matmul_forward(d_out, d_inp, d_weight, with_bias ? d_bias : NULL, N, C, OC, layout);
    if (with_bias && OC % 8 == 0) /* rows cuBLASLt's vector loads take */
        expect_made_by_lt(lt, lt_products() - fused_before, 1, "the bias");
    snprintf(what, sizeof what, "matmul %s %dx%dx%d (%s) out", name, N, C, OC, lt_ways[lt]);
    expect_device_close(gpu, what, d_out, out, (size_t)N * OC, FP32_TOL);

    cpu()->matmul_backward(with_dinp ? dinp : NULL, dweight, with_bias ? dbias : NULL, dout, inp,
                           weight, N, C, OC, layout);
    const long fused_backward = lt_products();
    gpu->matmul_backward(with_dinp ? d_dinp : NULL, d_dweight, with_bias ? d_dbias : NULL, d_dout,
                         d_inp, d_weight, N, C, OC, layout);
    if (with_bias && OC % 8 == 0)
        expect_made_by_lt(lt, lt_products() - fused_backward, 1, "the bias gradient");
    snprintf(what, sizeof what, "matmul %s %dx%dx%d (%s) dinp", name, N, C, OC, lt_ways[lt]);
    expect_device_close(gpu, what, d_dinp, dinp, (size_t)N * C, FP32_TOL);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d (%s) dweight", name, N, C, OC, lt_ways[lt]);
    expect_device_close(gpu, what, d_dweight, dweight, (size_t)C * OC, FP32_TOL);
    snprintf(what, sizeof what, "matmul %s %dx%dx%d (%s) dbias", name, N, C, OC, lt_ways[lt]);
    expect_device_close(gpu, what, d_dbias, dbias, OC, FP32_TOL);
    expect_no_cuda_error();
    free(inp), free(weight), free(bias), free(dout), free(out), free(dinp), free(dweight), free(dbias);
    gpu->free(d_dbias), gpu->free(d_dweight), gpu->free(d_dinp), gpu->free(d_out);
    gpu->free(d_dout), gpu->free(d_bias), gpu->free(d_weight), gpu->free(d_inp);
    set_lt(1);
}

static void check_matmul(int N, int C, int OC, pt_weight_layout layout, int with_bias,
                         int with_dinp)
{
    for (int lt = 1; lt >= 0; lt--) check_matmul_way(N, C, OC, layout, with_bias, with_dinp, lt);
}

Test(cuda, matmul_matches_cpu)
{
    check_matmul(37, 19, 23, PT_WEIGHT_IN_OUT, 1, 1); /* sizes nothing tiles evenly */
    check_matmul(37, 19, 23, PT_WEIGHT_OUT_IN, 1, 1);
    check_matmul(37, 19, 23, PT_WEIGHT_IN_OUT, 0, 0); /* NULL bias, dinp, dbias */
    check_matmul(37, 19, 23, PT_WEIGHT_OUT_IN, 0, 0);
    check_matmul(40, 24, 48, PT_WEIGHT_OUT_IN, 1, 1);     /* a bias epilogue with W transposed */
    check_matmul(256, 768, 2304, PT_WEIGHT_IN_OUT, 1, 1); /* GPT-2 c_attn */
    check_matmul(64, 768, 50257, PT_WEIGHT_OUT_IN, 0, 1); /* GPT-2 lm_head */
}

/* ---- attention ----------------------------------------------------------------- */

/* The forward's output and the backward's dqkv (pre-filled, so accumulation
 * is compared too) of both backends, each with its own saved state; cuda's
 * through cuBLAS (gemms, attention_gemm.cu) or its CUDA-core kernels. */
static void check_attention_way(int B, int T, int C, int NH, int gemms)
{
    const pt_kernels *gpu = cuda_or_skip();
    set_gemm_attention(gemms);
    char what[128];
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
    const char *way = gemms ? "cuBLAS" : "CUDA cores";
    snprintf(what, sizeof what, "attention (%s) B=%d T=%d C=%d NH=%d out", way, B, T, C, NH);
    expect_device_close(gpu, what, d_out, out, n_out, FP32_TOL);

    cpu()->attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
    gpu->attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    snprintf(what, sizeof what, "attention (%s) B=%d T=%d C=%d NH=%d dqkv", way, B, T, C, NH);
    expect_device_close(gpu, what, d_dqkv, dqkv, n_qkv, LONG_TOL);
    expect_no_cuda_error();
    gpu->free(d_att), gpu->free(d_dqkv), gpu->free(d_out), gpu->free(d_dout), gpu->free(d_qkv);
    free(qkv), free(dout), free(out), free(dqkv), free(att);
    set_gemm_attention(1);
}

static void check_attention(int B, int T, int C, int NH)
{
    check_attention_way(B, T, C, NH, 1);
    check_attention_way(B, T, C, NH, 0);
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

/* shift as check_layernorm's; n odd: the 16-byte form's last elements singly */
static void check_gelu_and_residual(size_t shift)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 20) + 3;
    float *x = random_floats(n, -6, 6), *b = random_floats(n, -1, 1), *dout = random_floats(n, -1, 1);
    float *y = random_floats(n, -9, 9), *dx = random_floats(n, -1, 1), *sum = random_floats(n, -9, 9);
    float *d_x = upload_shifted(gpu, x, n * 4, shift), *d_b = upload_shifted(gpu, b, n * 4, shift),
          *d_dout = upload_shifted(gpu, dout, n * 4, shift),
          *d_y = upload_shifted(gpu, y, n * 4, shift),
          *d_dx = upload_shifted(gpu, dx, n * 4, shift),
          *d_sum = upload_shifted(gpu, sum, n * 4, shift);
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
    float *device_buffers[] = {d_x, d_b, d_dout, d_y, d_dx, d_sum};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        free_shifted(gpu, device_buffers[i], shift);
    free(x), free(b), free(dout), free(y), free(dx), free(sum);
}

Test(cuda, gelu_and_residual_match_cpu)
{
    check_gelu_and_residual(0);
    check_gelu_and_residual(4);
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
    expect_no_cuda_error();
    gpu->free(d_x), gpu->free(d_y), gpu->free(d_picked), gpu->free(d_index);
    free(index), free(x), free(y), free(picked);
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
    gpu->free(d_logits), gpu->free(d_losses), gpu->free(d_targets);
    free(logits), free(targets), free(losses), free(losses_fb);
}

/* Regions of every kind in one call: more than one launch's batch (300 regions), empty ones,
 * gaps between them, decayed and not; against the CPU over three steps, the gaps untouched.
 * unit: every region's length and place a multiple of it (4: the 16-byte form; 1: the element-
 * by-element one, as regions of any length take). */
static void check_adam_update(size_t unit)
{
    const pt_kernels *gpu = cuda_or_skip();
    enum { REGIONS = 300 };
    pt_param_region regions[REGIONS];
    size_t n = 0;
    for (int r = 0; r < REGIONS; r++) {
        const size_t numel = r % 17 == 0 ? 0 : unit * ((size_t)(r * 7919 % 1500) + 1);
        regions[r] = (pt_param_region){n, numel, r % 3 != 0};
        n += numel + (r % 5 == 0 ? 3 * unit : 0); /* every fifth region leaves a gap after it */
    }
    float *param = random_floats(n, -1, 1), *grad = random_floats(n, -1, 1);
    float *m = random_floats(n, -0.1, 0.1), *v = random_floats(n, 0, 0.01);
    float *d_param = upload(gpu, param, n * 4), *d_grad = upload(gpu, grad, n * 4),
          *d_m = upload(gpu, m, n * 4), *d_v = upload(gpu, v, n * 4);
    const pt_adam_coeffs decayed = {.decay = 0.99f, .beta1 = 0.9f, .beta2 = 0.95f, .bias2 = 0.2f,
                                    .eps = 1e-3f, .c_grad = 0.01f, .c_mom = 0.02f};
    pt_adam_coeffs plain = decayed;
    plain.decay = 1.0f;
    plain.c_mom = 0.03f;
    for (int step = 0; step < 3; step++) {
        const float clip = step == 1 ? 0.37f : 1.0f; /* a clipped step */
        cpu()->adam_update(param, grad, m, v, regions, REGIONS, &decayed, &plain, clip);
        gpu->adam_update(d_param, d_grad, d_m, d_v, regions, REGIONS, &decayed, &plain, clip);
    }
    expect_device_close(gpu, "adam param", d_param, param, n, FP32_TOL);
    expect_device_close(gpu, "adam m", d_m, m, n, FP32_TOL);
    expect_device_close(gpu, "adam v", d_v, v, n, FP32_TOL);
    expect_no_cuda_error();
    gpu->free(d_v), gpu->free(d_m), gpu->free(d_grad), gpu->free(d_param);
    free(param), free(grad), free(m), free(v);
}

Test(cuda, adam_update_matches_cpu)
{
    check_adam_update(1);
    check_adam_update(4);
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
    gpu->free(d_param), gpu->free(d_m), gpu->free(d_v), gpu->free(d_out);
    free(param), free(m), free(v), free(out);
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
    gpu->free(d_grad), gpu->free(d_now), gpu->free(d_used), gpu->free(d_v);
    free(grad), free(now), free(used), free(v);
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
    float *device_buffers[] = {d_grad, d_now, d_used, d_v, d_prev_grad, d_prev_used, d_num, d_den};
    for (size_t i = 0; i < sizeof device_buffers / sizeof device_buffers[0]; i++)
        gpu->free(device_buffers[i]);
    float *host_buffers[] = {grad, now, used, v, prev_grad, prev_used, num, den};
    for (size_t i = 0; i < sizeof host_buffers / sizeof host_buffers[0]; i++) free(host_buffers[i]);
}

Test(cuda, reductions_are_exact_to_double)
{
    const pt_kernels *gpu = cuda_or_skip();
    const size_t n = (1 << 22) + 5;
    float *x = random_floats(n, -1, 1);
    x[0] = 16777216.0f; /* 2²⁴: a float accumulator would drop the 1s added to it */
    float *d_x = upload(gpu, x, n * 4);
    double gpu_sum = gpu->sum(d_x, n), gpu_sq = gpu->sum_squares(d_x, n);
    /* The reference in long double (64-bit significand): within ~n·2⁻⁶⁴ of the exact sums. A
     * double sum errs by ~2⁻⁵³ of its running total an addition: the CPU's, adding a million
     * squares in [0, 1] into the accumulator that holds 2⁴⁸, rounds each to 1/16 with a bias
     * (most squares are near 0), 8e-13 of the sum in the release build, 7e-12 in the sanitizer
     * build's; the device's threads each add ~100 values, so 1e-12 of Σ|x| holds for it. */
    long double sum = 0, squares = 0, magnitude = 0;
    for (size_t i = 0; i < n; i++) {
        sum += x[i];
        squares += (long double)x[i] * x[i];
        magnitude += fabsf(x[i]);
    }
    const bool cpus_sums = standing_in && !strcmp(standing_in, "cpu-guarded");
    const long double tol = cpus_sums ? 1e-10L : 1e-12L; /* the stand-in's are the CPU's */
    cr_expect(fabsl(gpu_sum - sum) <= tol * magnitude, "sum: cuda %.17g, exact %.17Lg", gpu_sum,
              sum);
    cr_expect(fabsl(gpu_sq - squares) <= tol * squares, "sum_squares: cuda %.17g, exact %.17Lg",
              gpu_sq, squares);
    cr_expect(fabs(cpu()->sum(x, n) - (double)sum) <= 1e-11 * (double)magnitude,
              "the CPU's own sum is off: the reference above is the one to trust");
    cr_expect_eq(gpu->sum(d_x, n), gpu_sum, "the same input gave another sum: not deterministic");
    cr_expect_eq(gpu->sum(d_x, 0), 0.0);
    /* from x[1]: off a 16-byte boundary, the element-by-element form */
    const long double rest = sum - x[0];
    cr_expect(fabsl(gpu->sum(d_x + 1, n - 1) - rest) <= tol * magnitude,
              "sum from x[1]: cuda %.17g, exact %.17Lg", gpu->sum(d_x + 1, n - 1), rest);
    expect_no_cuda_error();
    gpu->free(d_x);
    free(x);
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
