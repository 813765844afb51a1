#include "kernels/cpu/peak.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/stats.h"

/* n = 2048 is 17 GFLOP per multiplication: about 0.1 s on two modern cores,
 * large enough that OpenBLAS runs at its steady-state speed (packing and
 * thread start-up are a few percent of the time) and small enough (48 MiB for
 * the three matrices) to run anywhere. */
#define PEAK_SIZE 2048
#define PEAK_REPEATS 7

/* Small values of both signs, so that nothing overflows or turns denormal. */
static void fill_pattern(float *x, size_t n, int period)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % (size_t)period) - period / 2) / 32.f;
}

static pipert_result alloc_matrix(float **out, int rows, int cols, const char *what)
{
    size_t bytes;
    if (!pt_mul_size((size_t)rows * (size_t)cols, sizeof(float), &bytes))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: %d x %d floats overflow", what, rows, cols);
    return pt_alloc((void **)out, bytes, what);
}

/* times[repeats] = seconds of each of `repeats` runs of C[m,n] = A[m,k]·B[k,n],
 * after one untimed warm-up (which faults the pages in and starts the
 * threads). */
static pipert_result time_sgemm(int m, int n, int k, int repeats, double *times)
{
    if (m < 1 || n < 1 || k < 1 || repeats < 1)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "gemm timing: m=%d n=%d k=%d repeats=%d must all be positive", m, n, k,
                       repeats);
    float *a = NULL, *b = NULL, *c = NULL;
    pipert_result rc = alloc_matrix(&a, m, k, "gemm timing: A");
    if (rc == PIPERT_OK) rc = alloc_matrix(&b, k, n, "gemm timing: B");
    if (rc == PIPERT_OK) rc = alloc_matrix(&c, m, n, "gemm timing: C");
    if (rc == PIPERT_OK) {
        fill_pattern(a, (size_t)m * (size_t)k, 17);
        fill_pattern(b, (size_t)k * (size_t)n, 13);
        for (int run = -1; run < repeats; run++) {
            double start = pt_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a, k, b, n, 0.f,
                        c, n);
            if (run >= 0) times[run] = pt_now_s() - start;
        }
    }
    pt_free(a);
    pt_free(b);
    pt_free(c);
    return rc;
}

double pt_cpu_gemm_gflops(int m, int n, int k, int repeats)
{
    if (repeats < 1) {
        pt_fail(PIPERT_ERR_INVALID_ARG, "gemm timing: repeats=%d must be positive", repeats);
        return 0;
    }
    double *times = malloc((size_t)repeats * sizeof *times);
    if (!times) {
        pt_fail(PIPERT_ERR_NOMEM, "gemm timing: cannot allocate %d timings", repeats);
        return 0;
    }
    double gflops = 0;
    if (time_sgemm(m, n, k, repeats, times) == PIPERT_OK)
        gflops = 2e-9 * (double)m * (double)n * (double)k / pt_median(times, (size_t)repeats);
    free(times);
    return gflops;
}

pipert_result pt_cpu_gemm_peak(int threads, pt_gemm_peak *out)
{
    int previous_threads = omp_get_max_threads();
    if (threads < 1) threads = previous_threads;
    pt_kernels_cpu_set_threads(threads);

    double times[PEAK_REPEATS];
    pipert_result rc = time_sgemm(PEAK_SIZE, PEAK_SIZE, PEAK_SIZE, PEAK_REPEATS, times);
    pt_kernels_cpu_set_threads(previous_threads);
    if (rc != PIPERT_OK) {
        pt_error_prefix("fp32 GEMM peak");
        return rc;
    }
    double median = pt_median(times, (size_t)PEAK_REPEATS);
    double flops = 2.0 * PEAK_SIZE * (double)PEAK_SIZE * PEAK_SIZE;
    *out = (pt_gemm_peak){.gflops_median = 1e-9 * flops / median,
                          .gflops_best = 1e-9 * flops / times[0],
                          .size = PEAK_SIZE,
                          .repeats = PEAK_REPEATS,
                          .threads = threads,
                          .seconds = median};
    return PIPERT_OK;
}
