/* The machine's fp32 matrix-multiply speed, measured with OpenBLAS: the
 * "100 %" that benchmark figures are compared against. */
#ifndef PT_CPU_PEAK_H
#define PT_CPU_PEAK_H

#include "pipert/pipert.h"

typedef struct pt_gemm_peak {
    double gflops_median; /* 2n³ / median time of one multiplication, in 1e9 FLOP/s */
    double gflops_best;   /* 2n³ / fastest time */
    int size;             /* n: the matrices are n×n */
    int repeats;          /* timed multiplications (after one untimed warm-up) */
    int threads;          /* OpenMP/OpenBLAS threads used */
    double seconds;       /* median time of one multiplication */
} pt_gemm_peak;

/* Times cblas_sgemm on square matrices with `threads` threads (< 1: the
 * current setting). The thread setting in force before the call is restored
 * afterwards. Takes about a second on two cores. */
pipert_result pt_cpu_gemm_peak(int threads, pt_gemm_peak *out);

/* Median GFLOP/s (2·m·n·k per multiplication) of C[m,n] = A[m,k]·B[k,n] over
 * `repeats` timed runs after one warm-up, with the current thread setting.
 * Returns 0 and sets the last error when a dimension is not positive or the
 * matrices cannot be allocated. */
double pt_cpu_gemm_gflops(int m, int n, int k, int repeats);

#endif
