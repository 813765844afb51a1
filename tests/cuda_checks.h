/* What every CUDA test binary shares (test_cuda.c, test_cuda_bf16.c; each includes it once):
 * the tolerances, the sanitizer hooks and the suite's small arena, the table (CUDA, or
 * cpu-guarded standing in without a GPU: PIPERT_TEST_CUDA_STANDIN), uploads, downloads and the
 * comparisons against the CPU.
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
#ifndef PT_TESTS_CUDA_CHECKS_H
#define PT_TESTS_CUDA_CHECKS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "tests/kernel_table.h"
#include "tests/random_data.h"

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
static inline void limit_arena(void) { setenv("PIPERT_CUDA_ARENA_MB", "2048", 0); }

TestSuite(cuda, .init = limit_arena);

/* ---- helpers --------------------------------------------------------------- */

static inline int32_t *random_tokens(size_t n, int vocab)
{
    int32_t *t = malloc(n * sizeof *t);
    cr_assert(t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(uniform(0, vocab) * 0.9999);
    return t;
}

static inline const pt_kernels *cpu(void) { return pt_kernels_cpu(); }

/* The CUDA backend itself (the tests that call pt_cuda_* beyond the table), or the test is
 * skipped. */
static inline const pt_kernels *cuda_backend_or_skip(void)
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

/* The tests that use only the kernel table run on a stand-in, by PIPERT_TEST_CUDA_STANDIN
 * (cpu-guarded where there is no GPU; emulated always):
 *   cpu-guarded  runtime.device=cpu-guarded: "device" memory the host cannot touch and copies
 *                checked for their direction (kernels/guarded.c), so CI checks these tests'
 *                own handling of device memory, and that they run, before a GPU session
 *                spends minutes on them. Their tolerances then hold trivially (the stand-in is
 *                the CPU's arithmetic).
 *   emulated     kernels/cuda's own code runs on the host on an emulated device
 *                (tests/cuda_host): its kernels' indexing, reductions, barriers and warp
 *                operations, and its calls of cuBLAS and cuBLASLt (an emulation of them as
 *                documented), against the CPU. */
#ifdef PT_TEST_CUDA_EMULATION
#include "pt_cuda_emulated.h"
#endif

static const char *standing_in; /* the stand-in's name, or NULL: the real backend */

static inline const pt_kernels *cuda_or_skip(void)
{
    const pt_kernels *k = NULL;
    const char *standin = getenv("PIPERT_TEST_CUDA_STANDIN");
#ifdef PT_TEST_CUDA_EMULATION
    if (standin && !strcmp(standin, "emulated")) { /* with a GPU too: the emulation is the test */
        standing_in = "emulated";
        k = pt_kernels_cuda_emulated();
        cr_assert(k, "the emulated device did not start: %s", pipert_last_error());
        return k;
    }
#endif
    if (pt_kernels_cuda(&k) == PIPERT_OK || !standin) return cuda_backend_or_skip();
    pt_error_clear();
    if (!strcmp(standin, "cpu-guarded")) {
        standing_in = "cpu-guarded";
        return pt_kernels_cpu_guarded();
    }
    cr_assert_fail("PIPERT_TEST_CUDA_STANDIN=%s: no such stand-in in this build", standin);
    return NULL;
}

/* A device copy of host[bytes]. */
static inline void *upload(const pt_kernels *k, const void *host, size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(k->alloc(&d, bytes, "test buffer"), PIPERT_OK, "cuda alloc of %zu bytes: %s",
                 bytes, pipert_last_error());
    k->copy_to_device(d, host, bytes);
    return d;
}

/* A device copy of host[bytes] placed `shift` bytes into an allocation of bytes + shift (a
 * buffer a kernel's 16-byte loads must not take where shift is not a multiple of 16); free it
 * with free_shifted. */
static inline void *upload_shifted(const pt_kernels *k, const void *host, size_t bytes,
                                   size_t shift)
{
    void *d = NULL;
    cr_assert_eq(k->alloc(&d, bytes + shift, "test buffer"), PIPERT_OK,
                 "cuda alloc of %zu bytes: %s", bytes + shift, pipert_last_error());
    k->copy_to_device((char *)d + shift, host, bytes);
    return (char *)d + shift;
}

static inline void free_shifted(const pt_kernels *k, void *dev, size_t shift)
{
    k->free((char *)dev - shift);
}

static inline float *download(const pt_kernels *k, const void *dev, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h);
    k->copy_to_host(h, dev, n * sizeof *h);
    return h;
}

/* Every element within tol·(|ref| + rms(ref)); NaN fails. */
static inline void expect_close(const char *what, const float *got, const float *ref, size_t n,
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
static inline void expect_device_close(const pt_kernels *gpu, const char *what, const void *dev,
                                const float *ref, size_t n, double tol)
{
    float *got = download(gpu, dev, n);
    expect_close(what, got, ref, n, tol);
    free(got);
}

/* Whether the tests run on the emulated device (after cuda_or_skip): ~10⁵ times slower than a
 * GPU, so the longest shapes, which run no code the shorter ones do not, are left to the GPU. */
static inline bool on_the_emulated_device(void)
{
    return standing_in && !strcmp(standing_in, "emulated");
}

/* The backend's switches, on the device the tests run on (the real one, and the emulated). */

/* A bf16 qkv's attention on tensor cores (1) or CUDA cores (0) */
static inline void set_mma_attention(int enabled)
{
    pt_cuda_set_mma_attention(enabled);
#ifdef PT_TEST_CUDA_EMULATION
    pt_cuda_emulated_set_mma_attention(enabled);
#endif
}

/* An fp32 qkv's attention through cuBLAS (1) or on CUDA cores (0) */
static inline void set_gemm_attention(int enabled)
{
    pt_cuda_set_gemm_attention(enabled);
#ifdef PT_TEST_CUDA_EMULATION
    pt_cuda_emulated_set_gemm_attention(enabled);
#endif
}

/* Products with an epilogue through cuBLASLt (1), or cuBLAS and a kernel (0) */
static inline void set_lt(int enabled)
{
    pt_cuda_set_lt(enabled);
#ifdef PT_TEST_CUDA_EMULATION
    pt_cuda_emulated_set_lt(enabled);
#endif
}

/* The products cuBLASLt made so far on the device the tests run on */
static inline long lt_products(void)
{
#ifdef PT_TEST_CUDA_EMULATION
    if (on_the_emulated_device()) return pt_cuda_emulated_lt_products();
#endif
    return pt_cuda_lt_products();
}

/* The questions cuBLASLt's heuristic was asked so far on the device the tests run on */
static inline long lt_heuristic_queries(void)
{
#ifdef PT_TEST_CUDA_EMULATION
    if (on_the_emulated_device()) return pt_cuda_emulated_lt_heuristic_queries();
#endif
    return pt_cuda_lt_heuristic_queries();
}

/* The products with a bias, the GELU's gradient or the bias gradient run both ways the backend
 * can make them: cuBLASLt with it in its epilogue, and cuBLAS with the separate kernel
 * (kernels/cuda/matmul.cu; set_lt). On the cpu-guarded stand-in the switch does nothing. */
static const char *const lt_ways[2] = {"cuBLAS and a kernel", "cuBLASLt's epilogue"};

/* With the epilogues on, cuBLASLt made all `products` products that have one (a decline would
 * pass the numbers through the fallback and hide that the fused path never runs); off, none. */
static inline void expect_made_by_lt(int lt, long made, long products, const char *epilogue)
{
    if (standing_in && !on_the_emulated_device()) return; /* no cuBLASLt on cpu-guarded */
    if (lt)
        cr_expect_eq(made, products, "cuBLASLt made %ld of the %ld products with %s (its log "
                     "line says why it declined): the fallback ran", made, products, epilogue);
    else
        cr_expect_eq(made, 0, "cuBLASLt made a product with %s although it was switched off",
                     epilogue);
}

static inline void expect_no_cuda_error(void)
{
#ifdef PT_TEST_CUDA_EMULATION
    if (on_the_emulated_device()) {
        cr_expect_eq(pt_cuda_emulated_status(), PIPERT_OK, "emulated CUDA error: %s",
                     pipert_last_error());
        return;
    }
#endif
    if (standing_in) return; /* no CUDA backend runs */
    cr_expect_eq(pt_cuda_status(), PIPERT_OK, "CUDA error: %s", pipert_last_error());
}

#endif
