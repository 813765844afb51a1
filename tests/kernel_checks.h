/* Helpers the CPU kernels' tests share (test_kernels.c, test_kernels_bf16.c): buffers, the
 * accumulation rule's check, closeness to a double reference, a weight's element by layout. */
#ifndef PT_TESTS_KERNEL_CHECKS_H
#define PT_TESTS_KERNEL_CHECKS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static inline float *zero_floats(size_t n)
{
    float *x = calloc(n, sizeof *x);
    cr_assert(x);
    return x;
}

static inline float *copy_floats(const float *src, size_t n)
{
    float *x = malloc(n * sizeof *x);
    cr_assert(x);
    memcpy(x, src, n * sizeof *x);
    return x;
}

/* after = 2·before, element by element (the accumulation rule). */
static inline void check_doubled(const char *what, const float *before, const float *after, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double expected = 2.0 * before[i];
        cr_assert(fabs(after[i] - expected) <= 1e-5 * fabs(expected) + 1e-7,
                  "%s[%zu]: a second backward gave %.7g, expected twice the first, %.7g", what, i,
                  after[i], expected);
    }
}

static inline void check_close(const char *what, const float *got, const double *expected, size_t n,
                        double rel, double abs_tol)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - expected[i]) <= rel * fabs(expected[i]) + abs_tol,
                  "%s[%zu]: kernel %.7g, reference %.7g", what, i, got[i], expected[i]);
}

static inline float weight_at(const float *W, int c, int o, int Cin, int OC, pt_weight_layout layout)
{
    return layout == PT_WEIGHT_IN_OUT ? W[(size_t)c * OC + o] : W[(size_t)o * Cin + c];
}

#endif
