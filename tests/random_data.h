/* Random test inputs, reproducible within a test binary: a xorshift64*
 * stream (independent of runtime/rng.c, whose outputs some tests check). */
#ifndef PT_TEST_RANDOM_DATA_H
#define PT_TEST_RANDOM_DATA_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t test_rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [lo, hi). */
static inline double uniform(double lo, double hi)
{
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    uint64_t r = test_rng_state * 0x2545f4914f6cdd1dull;
    return lo + (hi - lo) * (double)(r >> 11) / 9007199254740992.0;
}

/* n floats uniform in [lo, hi); free() them. */
static inline float *random_floats(size_t n, double lo, double hi)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)uniform(lo, hi);
    return x;
}

#endif
