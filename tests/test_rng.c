#include <criterion/criterion.h>
#include <math.h>

#include "runtime/rng.h"

/* Known-answer vectors from the Random123 distribution (kat_vectors):
 * philox4x32_10 with counter 0 and key 0, and with all bits set. */
Test(rng, philox_known_answers)
{
    uint32_t out[4];
    pt_philox4x32((pt_philox_key){{0, 0}}, (uint32_t[4]){0, 0, 0, 0}, out);
    cr_expect_eq(out[0], 0x6627e8d5u);
    cr_expect_eq(out[1], 0xe169c58du);
    cr_expect_eq(out[2], 0xbc57ac4cu);
    cr_expect_eq(out[3], 0x9b00dbd8u);
    pt_philox4x32((pt_philox_key){{0xffffffffu, 0xffffffffu}},
                  (uint32_t[4]){0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, out);
    cr_expect_eq(out[0], 0x408f276du);
    cr_expect_eq(out[1], 0x41c83b0eu);
    cr_expect_eq(out[2], 0xa20bc7c6u);
    cr_expect_eq(out[3], 0x6d5451fdu);
}

Test(rng, normal_moments)
{
    pt_philox_key key = pt_rng_key(1234, 7);
    const size_t n = 200000;
    double sum = 0, sum2 = 0;
    for (size_t i = 0; i < n; i++) {
        double x = pt_rng_normal(key, i);
        sum += x;
        sum2 += x * x;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    /* standard errors: 1/sqrt(n) = 0.0022 for the mean, sqrt(2/n) = 0.0032 for the variance */
    cr_expect(fabs(mean) < 0.01, "mean %f", mean);
    cr_expect(fabs(var - 1.0) < 0.015, "variance %f", var);
}

Test(rng, streams_are_independent_of_position_and_distinct)
{
    pt_philox_key a = pt_rng_key(42, pt_hash_string("h.0.attn.c_attn.weight"));
    pt_philox_key b = pt_rng_key(42, pt_hash_string("h.1.attn.c_attn.weight"));
    float block[16];
    pt_rng_fill_normal(a, block, 16, 0.f, 1.f);
    cr_expect_eq(block[9], pt_rng_normal(a, 9));
    cr_expect_neq(pt_rng_normal(a, 0), pt_rng_normal(b, 0));
    cr_expect_neq(pt_rng_u64(pt_rng_key(1, 0), 0), pt_rng_u64(pt_rng_key(2, 0), 0));
}
