/* The codecs of dp/codec.h against values worked out by hand: every 4-bit
 * code decoded, scales of full and short blocks, the rounding of ties, zeros
 * and signs, the byte layouts, refused NaN and infinities, and error
 * feedback keeping the long-run mean of what was sent on the inputs. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/codec.h"
#include "random_data.h"
#include "runtime/config.h"

static pt_codec codec_named(const char *name, size_t block)
{
    pt_codec c;
    const int kind = pt_config_choice_value("dp.compress", name);
    cr_assert_geq(kind, 0, "%s", pipert_last_error());
    cr_assert_eq(pt_codec_init(&c, kind, block), PIPERT_OK, "%s: %s", name, pipert_last_error());
    return c;
}

/* Encodes into a buffer of exactly the announced size (ASan sees overruns). */
static unsigned char *encode(const pt_codec *c, const float *x, size_t n, float *error)
{
    const size_t bytes = pt_codec_encoded_bytes(c, n);
    unsigned char *buffer = malloc(bytes ? bytes : 1);
    cr_assert(buffer);
    cr_assert_eq(pt_codec_encode(c, x, n, error, buffer), PIPERT_OK, "%s: %s", pt_codec_name(c),
                 pipert_last_error());
    return buffer;
}

static float scale_at(const unsigned char *buffer, size_t b)
{
    float s;
    memcpy(&s, buffer + 4 * b, sizeof s);
    return s;
}

/* Checks out[i] == expected[i] bitwise (so −0 differs from +0). */
static void expect_floats(const float *out, const float *expected, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(memcmp(&out[i], &expected[i], sizeof(float)) == 0,
                  "%s: element %zu is %.9g, expected %.9g", what, i, out[i], expected[i]);
}

/* ---- names and sizes ------------------------------------------------------ */

Test(codec, names)
{
    static const char *names[] = {"none", "int8", "e3m0", "e2m1", "onebit"};
    for (int k = 0; k < 5; k++) {
        pt_codec c = codec_named(names[k], 64);
        cr_expect_str_eq(pt_codec_name(&c), names[k]);
        cr_expect_eq(c.block, 64);
    }
    pt_codec c;
    cr_expect_eq(pt_codec_init(&c, PT_CODEC_KINDS, 64), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "dp.compress"), "%s", pipert_last_error());
    cr_expect_eq(pt_codec_init(&c, PT_CODEC_INT8, 0), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "int8"), "%s", pipert_last_error());
}

Test(codec, encoded_sizes)
{
    pt_codec none = codec_named("none", 4), int8 = codec_named("int8", 4),
             e3m0 = codec_named("e3m0", 4), e2m1 = codec_named("e2m1", 4),
             onebit = codec_named("onebit", 4);
    /* n = 0, 1, 8, 9, 10 with blocks of 4: 0, 1, 2, 3, 3 scales. */
    const size_t n[] = {0, 1, 8, 9, 10};
    const size_t want_none[] = {0, 4, 32, 36, 40};
    const size_t want_int8[] = {0, 4 + 1, 8 + 8, 12 + 9, 12 + 10};
    const size_t want_fp4[] = {0, 4 + 1, 8 + 4, 12 + 5, 12 + 5};
    const size_t want_onebit[] = {0, 4 + 1, 4 + 1, 4 + 2, 4 + 2};
    for (int k = 0; k < 5; k++) {
        cr_expect_eq(pt_codec_encoded_bytes(&none, n[k]), want_none[k], "none %zu", n[k]);
        cr_expect_eq(pt_codec_encoded_bytes(&int8, n[k]), want_int8[k], "int8 %zu", n[k]);
        cr_expect_eq(pt_codec_encoded_bytes(&e3m0, n[k]), want_fp4[k], "e3m0 %zu", n[k]);
        cr_expect_eq(pt_codec_encoded_bytes(&e2m1, n[k]), want_fp4[k], "e2m1 %zu", n[k]);
        cr_expect_eq(pt_codec_encoded_bytes(&onebit, n[k]), want_onebit[k], "onebit %zu", n[k]);
    }
}

Test(codec, empty_vectors)
{
    static const char *names[] = {"none", "int8", "e3m0", "e2m1", "onebit"};
    for (int k = 0; k < 5; k++) {
        pt_codec c = codec_named(names[k], 8);
        cr_expect_eq(pt_codec_encode(&c, NULL, 0, NULL, NULL), PIPERT_OK, "%s", names[k]);
        pt_codec_decode(&c, NULL, 0, NULL);
        pt_codec_decode_add(&c, NULL, 0, NULL);
    }
}

/* ---- the 4-bit tables ------------------------------------------------------ */

/* Decodes all 16 codes (element k has code k) with the given scale. */
static void decode_every_code(const char *name, float scale, float out[16])
{
    pt_codec c = codec_named(name, 16);
    unsigned char buffer[4 + 8];
    memcpy(buffer, &scale, 4);
    for (int k = 0; k < 8; k++) buffer[4 + k] = (unsigned char)((2 * k) | ((2 * k + 1) << 4));
    cr_assert_eq(pt_codec_encoded_bytes(&c, 16), sizeof buffer);
    pt_codec_decode(&c, buffer, 16, out);
}

Test(codec, every_e3m0_code)
{
    const float want[16] = {0.0f,      1 / 64.0f, 1 / 32.0f, 1 / 16.0f,  1 / 8.0f,   1 / 4.0f,
                            1 / 2.0f,  1.0f,      -0.0f,     -1 / 64.0f, -1 / 32.0f, -1 / 16.0f,
                            -1 / 8.0f, -1 / 4.0f, -1 / 2.0f, -1.0f};
    float out[16];
    decode_every_code("e3m0", 1.0f, out);
    expect_floats(out, want, 16, "e3m0, scale 1");
    decode_every_code("e3m0", 3.0f, out);
    float scaled[16];
    for (int k = 0; k < 16; k++) scaled[k] = 3.0f * want[k];
    expect_floats(out, scaled, 16, "e3m0, scale 3");
}

Test(codec, every_e2m1_code)
{
    const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    float out[16];
    decode_every_code("e2m1", 1.0f, out);
    expect_floats(out, want, 16, "e2m1, scale 1");
    decode_every_code("e2m1", 0.25f, out);
    float scaled[16];
    for (int k = 0; k < 16; k++) scaled[k] = 0.25f * want[k];
    expect_floats(out, scaled, 16, "e2m1, scale 0.25");
}

/* Encodes x (one block), then checks the scale, each 4-bit code and the decoded values. */
static void expect_fp4(const char *name, const float *x, size_t n, float scale,
                       const unsigned char *codes, const float *decoded)
{
    pt_codec c = codec_named(name, n);
    unsigned char *buffer = encode(&c, x, n, NULL);
    cr_expect_eq(scale_at(buffer, 0), scale, "%s: scale %.9g, expected %.9g", name,
                 scale_at(buffer, 0), scale);
    for (size_t i = 0; i < n; i++) {
        unsigned code = (buffer[4 + i / 2] >> (4 * (i % 2))) & 15u;
        cr_expect_eq(code, codes[i], "%s: element %zu (%g) has code 0x%x, expected 0x%x", name, i,
                     x[i], code, codes[i]);
    }
    if (n % 2) cr_expect_eq(buffer[4 + n / 2] >> 4, 0, "%s: the unused nibble is not 0", name);
    float *out = malloc(n * sizeof *out);
    pt_codec_decode(&c, buffer, n, out);
    expect_floats(out, decoded, n, name);
    free(out);
    free(buffer);
}

Test(codec, e2m1_rounds_to_nearest_ties_to_even_code)
{
    /* absmax 6 → scale 1. Halfway cases: 0.25 (0|0.5), 0.75 (0.5|1), 1.25 (1|1.5),
     * 1.75 (1.5|2), 2.5 (2|3), 3.5 (3|4), 5 (4|6): each to the even code. */
    const float x[] = {6,     0.25f,  0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -5,
                       0.26f, -0.25f, -0.0f, 0.24f, 4.9f,  5.1f, 2.4f, -6};
    const unsigned char codes[] = {0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xE,
                                   0x1, 0x8, 0x8, 0x0, 0x6, 0x7, 0x4, 0xF};
    const float decoded[] = {6, 0, 1, 1, 2, 2, 4, 4, -4, 0.5f, -0.0f, -0.0f, 0, 4, 6, 2, -6};
    expect_fp4("e2m1", x, 17, 1.0f, codes, decoded);
    /* absmax 3 → scale 0.5: 3 → 6·0.5, 0.6 → 1.2 → 1·0.5, −1.1 → 2.2 → −2·0.5. */
    const float y[] = {0.6f, -1.1f, 3};
    const unsigned char y_codes[] = {0x2, 0xC, 0x7};
    const float y_decoded[] = {0.5f, -1.0f, 3};
    expect_fp4("e2m1", y, 3, 0.5f, y_codes, y_decoded);
}

Test(codec, e3m0_rounds_to_nearest_ties_to_even_code)
{
    /* absmax 1 → scale 1. Halfway: 1/128 (0|1/64) → code 0; 3/128 (1/64|1/32) →
     * code 2; 3/64 (1/32|1/16) → code 2; 3/32 (1/16|1/8) → code 4; 0.1875
     * (1/8|1/4) → code 4; 0.375 (1/4|1/2) → code 6; 0.75 (1/2|1) → code 6. */
    const float x[] = {1,     1 / 128.0f, 3 / 128.0f, 3 / 64.0f, 3 / 32.0f, 0.1875f, 0.375f,
                       0.75f, 0.76f,      -0.3f,      0.001f,    -0.001f,   0.4f};
    const unsigned char codes[] = {0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0xD, 0x0, 0x8, 0x6};
    const float decoded[] = {1,    0,    1 / 32.0f, 1 / 32.0f, 1 / 8.0f, 1 / 8.0f, 0.5f,
                             0.5f, 1.0f, -0.25f,    0,         -0.0f,    0.5f};
    expect_fp4("e3m0", x, 13, 1.0f, codes, decoded);
    /* absmax 0.5 → scale 0.5: 0.3 → 0.6 → 1/2·0.5; −0.125 → 1/4 → −1/4·0.5. */
    const float y[] = {0.5f, -0.125f, 0.3f};
    const unsigned char y_codes[] = {0x7, 0xD, 0x6};
    const float y_decoded[] = {0.5f, -0.125f, 0.25f};
    expect_fp4("e3m0", y, 3, 0.5f, y_codes, y_decoded);
}

/* ---- int8 ------------------------------------------------------------------ */

Test(codec, int8_blocks_ties_away_from_zero_and_a_short_last_block)
{
    pt_codec c = codec_named("int8", 4);
    /* Blocks: absmax 127 (scale 1), zeros (scale 0), a short one with absmax 254 (scale 2). */
    const float x[10] = {127, -63.5f, 0.5f, 2.5f, 0, 0, 0, -0.0f, -254, 127};
    const int8_t codes[10] = {127, -64, 1, 3, 0, 0, 0, 0, -127, 64};
    const float decoded[10] = {127, -64, 1, 3, 0, 0, 0, 0, -254, 128};
    unsigned char *buffer = encode(&c, x, 10, NULL);
    cr_expect_eq(scale_at(buffer, 0), 1.0f);
    cr_expect_eq(scale_at(buffer, 1), 0.0f);
    cr_expect_eq(scale_at(buffer, 2), 2.0f);
    for (int i = 0; i < 10; i++)
        cr_expect_eq((int8_t)buffer[12 + i], codes[i], "element %d: code %d, expected %d", i,
                     (int8_t)buffer[12 + i], codes[i]);
    float out[10];
    pt_codec_decode(&c, buffer, 10, out);
    expect_floats(out, decoded, 10, "int8");
    /* decode_add adds in fp32. */
    for (int i = 0; i < 10; i++) out[i] = 0.25f;
    pt_codec_decode_add(&c, buffer, 10, out);
    for (int i = 0; i < 10; i++) cr_expect_eq(out[i], decoded[i] + 0.25f, "add, element %d", i);
    free(buffer);
    /* Ties both ways, and a scale that is not 1: absmax 254 → scale 2. */
    const float y[] = {-2.5f, -0.5f, 127, 254, 1, -3, 2.9f};
    const float y_decoded[] = {-3, -1, 127, 254, 2, -4, 2};
    pt_codec one_block = codec_named("int8", 8);
    buffer = encode(&one_block, y, 3, NULL);
    cr_expect_eq(scale_at(buffer, 0), 1.0f);
    pt_codec_decode(&one_block, buffer, 3, out);
    expect_floats(out, y_decoded, 3, "int8 negative ties, scale 1");
    free(buffer);
    buffer = encode(&one_block, y + 3, 4, NULL);
    cr_expect_eq(scale_at(buffer, 0), 2.0f);
    pt_codec_decode(&one_block, buffer, 4, out);
    expect_floats(out, y_decoded + 3, 4, "int8, scale 2");
    free(buffer);
}

/* ---- fp32 and onebit ------------------------------------------------------- */

Test(codec, none_is_exact)
{
    pt_codec c = codec_named("none", 8);
    const float x[5] = {1.0f / 3, -0.0f, 1e-42f, -3e38f, 7};
    unsigned char *buffer = encode(&c, x, 5, NULL);
    cr_expect(memcmp(buffer, x, sizeof x) == 0, "the layout is the fp32 values");
    float out[5];
    pt_codec_decode(&c, buffer, 5, out);
    expect_floats(out, x, 5, "none");
    free(buffer);
}

Test(codec, onebit_layout_scale_and_error)
{
    pt_codec c = codec_named("onebit", 4); /* the block does not matter */
    /* n = 9: Σx² = 9 + 16 + 0 + 0 + 4·25 + 1 = 126, s = √(126/9) = √14; the
     * signs of elements 1, 5, 7 (byte 0) and 8 (byte 1) are set, not those of 0 and −0. */
    const float x[9] = {3, -4, 0, -0.0f, 5, -5, 5, -5, -1};
    float error[9] = {0};
    unsigned char *buffer = encode(&c, x, 9, error);
    const float s = (float)sqrt(14.0);
    cr_expect_eq(scale_at(buffer, 0), s);
    cr_expect_eq(buffer[4], 0xA2, "signs of elements 0..7: 0x%02x", buffer[4]); /* 1, 5, 7 */
    cr_expect_eq(buffer[5], 0x01, "sign of element 8 alone in the last byte: 0x%02x", buffer[5]);
    float out[9];
    const float want[9] = {s, -s, s, s, s, -s, s, -s, -s};
    pt_codec_decode(&c, buffer, 9, out);
    expect_floats(out, want, 9, "onebit decoded");
    for (int i = 0; i < 9; i++)
        cr_expect_eq(error[i], x[i] - want[i], "error %d: %.9g", i, error[i]);
    /* The next round sends x + error. */
    float again[9];
    memcpy(again, error, sizeof again);
    free(buffer);
    buffer = encode(&c, x, 9, error);
    double squares = 0;
    for (int i = 0; i < 9; i++) squares += (double)(x[i] + again[i]) * (x[i] + again[i]);
    cr_expect_eq(scale_at(buffer, 0), (float)sqrt(squares / 9));
    free(buffer);
}

/* ---- refusals ---------------------------------------------------------------- */

Test(codec, nan_and_infinity_are_refused_naming_the_element)
{
    static const char *names[] = {"none", "int8", "e3m0", "e2m1", "onebit"};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const size_t where[] = {0, 5, 11};
    for (int k = 0; k < 5; k++) {
        pt_codec c = codec_named(names[k], 4);
        for (int b = 0; b < 3; b++) {
            float x[12], error[12];
            for (int i = 0; i < 12; i++) x[i] = (float)i - 6, error[i] = 0.125f;
            x[where[b]] = bad[b];
            unsigned char buffer[64];
            memset(buffer, 0x5a, sizeof buffer);
            cr_expect_eq(pt_codec_encode(&c, x, 12, error, buffer), PIPERT_ERR_INVALID_ARG,
                         "%s refuses %g", names[k], bad[b]);
            char index[32];
            snprintf(index, sizeof index, "element %zu ", where[b]);
            cr_expect(strstr(pipert_last_error(), index), "%s: %s", names[k], pipert_last_error());
            for (int i = 0; i < 12; i++) cr_expect_eq(error[i], 0.125f, "error %d was touched", i);
            for (size_t i = 0; i < sizeof buffer; i++)
                cr_expect_eq(buffer[i], 0x5a, "%s wrote byte %zu of a refused vector", names[k], i);
        }
    }
    /* Finite, but overflowing once the carried error is added. */
    pt_codec c = codec_named("onebit", 4);
    float x[2] = {1, 3e38f}, error[2] = {0, 3e38f};
    unsigned char buffer[8];
    cr_expect_eq(pt_codec_encode(&c, x, 2, error, buffer), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "element 1 ") &&
                  strstr(pipert_last_error(), "carried error"),
              "%s", pipert_last_error());
}

/* ---- error feedback ---------------------------------------------------------- */

/* Sends the same vector T times with error feedback (or without); returns
 * the largest |mean of the decoded vectors − x|. Every round sends
 * x + e_t and keeps e_{t+1} = x + e_t − decoded_t, so Σ decoded = T·x − e_T:
 * the mean is off by exactly e_T / T (checked, up to fp32 rounding), which
 * goes to 0 as long as the error stays bounded. */
static double long_run_error(const char *name, const float *x, size_t n, int T, int feedback)
{
    pt_codec c = codec_named(name, 32);
    float *error = calloc(n, sizeof *error), *out = malloc(n * sizeof *out);
    double *sum = calloc(n, sizeof *sum);
    unsigned char *buffer = malloc(pt_codec_encoded_bytes(&c, n));
    cr_assert(error && out && sum && buffer);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(pt_codec_encode(&c, x, n, feedback ? error : NULL, buffer), PIPERT_OK);
        pt_codec_decode(&c, buffer, n, out);
        for (size_t i = 0; i < n; i++) sum[i] += out[i];
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double mean = sum[i] / T;
        worst = fmax(worst, fabs(mean - x[i]));
        if (feedback)
            cr_expect(fabs(mean - (x[i] - (double)error[i] / T)) < 1e-5,
                      "%s, element %zu: the mean %.9g is not x − e_T/T = %.9g", name, i, mean,
                      x[i] - (double)error[i] / T);
    }
    free(error), free(out), free(sum), free(buffer);
    return worst;
}

Test(codec, error_feedback_keeps_the_long_run_mean)
{
    enum { N = 1000, T = 1000 };
    float *x = random_floats(N, -1, 1);
    /* Without feedback, one bit per element is far off (±RMS for values in [−1, 1]). */
    const double plain = long_run_error("onebit", x, N, T, 0);
    cr_expect(plain > 0.3, "onebit without error feedback: off by only %g", plain);
    /* With it, about 0.0065 after 1000 rounds: the error grows to a few units
     * before it levels off (below 20 for such inputs), so the mean converges
     * as 1/T (within 2e-4 after 100000 rounds). */
    const double onebit = long_run_error("onebit", x, N, T, 1);
    cr_expect(onebit < 1.5e-2, "onebit with error feedback: off by %g after %d rounds", onebit, T);
    const double e3m0 = long_run_error("e3m0", x, N, T, 1);
    cr_expect(e3m0 < 1e-3, "e3m0 with error feedback: off by %g", e3m0);
    const double int8 = long_run_error("int8", x, N, T, 1);
    cr_expect(int8 < 2e-5, "int8 with error feedback: off by %g", int8);
    free(x);
}
