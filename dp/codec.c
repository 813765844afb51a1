/* The codecs of dp/codec.h. A codec is a format: its element width, how its
 * scale is chosen, and the two maps between a value and its code; one loop
 * over blocks serves them all (instantiated once per format). */
#include "dp/codec.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "runtime/config.h"

typedef enum scale_rule {
    SCALE_NONE,   /* no scale: values travel as they are */
    SCALE_ABSMAX, /* per block: absmax / top */
    SCALE_RMS,    /* one for the whole vector: ‖v‖₂ / √n */
} scale_rule;

typedef struct format {
    unsigned bits; /* per element: 32, 8, 4 or 1 */
    scale_rule rule;
    float top; /* SCALE_ABSMAX: the largest magnitude of a code */
    uint32_t (*quantize)(float v, float scale);
    float (*value)(uint32_t code); /* the code's value, in units of the scale */
} format;

/* ---- the maps between values and codes ----------------------------------- */

static inline uint32_t fp32_quantize(float v, float scale)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

static inline float fp32_value(uint32_t code)
{
    float v;
    memcpy(&v, &code, sizeof v);
    return v;
}

/* Round half away from zero, as roundf, but inlined: a − trunc(a) is exact
 * for |a| < 2^23, and the inputs here are finite and at most about 127. */
static inline float round_half_away(float a)
{
    const float whole = truncf(a), away = (float)(fabsf(a - whole) >= 0.5f); /* no branch */
    return whole + copysignf(away, a);
}

static inline uint32_t int8_quantize(float v, float scale)
{
    float q = scale > 0 ? round_half_away(v / scale) : 0.0f;
    q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q; /* v / scale may pass 127 by an ulp */
    return (uint32_t)(uint8_t)(int8_t)q;
}

static inline float int8_value(uint32_t code) { return (float)(int8_t)(uint8_t)code; }

/* The 3-bit code of the magnitude nearest to a in an ascending table of 8:
 * the number of midpoints a is past, where a value exactly on the midpoint
 * between codes k and k+1 counts as past it when k is odd, so that it goes
 * to the even code. The midpoints are exact in fp32 for both tables.
 * Branch-free: the values are random, branches would be mispredicted. */
static inline uint32_t nearest_magnitude(const float table[8], float a)
{
    uint32_t k = 0;
#pragma GCC unroll 7
    for (uint32_t j = 0; j < 7; j++) {
        const float middle = 0.5f * (table[j] + table[j + 1]);
        k += (a > middle) | ((a == middle) & (j & 1u));
    }
    return k;
}

static const float e3m0_magnitudes[8] = {0.0f,        1.0f / 64.0f, 1.0f / 32.0f, 1.0f / 16.0f,
                                         1.0f / 8.0f, 1.0f / 4.0f,  1.0f / 2.0f,  1.0f};
static const float e2m1_magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static inline uint32_t fp4_quantize(const float table[8], float v, float scale)
{
    float a = scale > 0 ? fabsf(v) / scale : 0.0f;
    return (signbit(v) ? 8u : 0u) | nearest_magnitude(table, a);
}

static inline float fp4_value(const float table[8], uint32_t code)
{
    float magnitude = table[code & 7u];
    return code & 8u ? -magnitude : magnitude;
}

static inline uint32_t e3m0_quantize(float v, float scale)
{
    return fp4_quantize(e3m0_magnitudes, v, scale);
}

static inline uint32_t e2m1_quantize(float v, float scale)
{
    return fp4_quantize(e2m1_magnitudes, v, scale);
}

static inline float e3m0_value(uint32_t code) { return fp4_value(e3m0_magnitudes, code); }
static inline float e2m1_value(uint32_t code) { return fp4_value(e2m1_magnitudes, code); }

static inline uint32_t sign_quantize(float v, float scale) { return v < 0.0f; } /* 0 and −0: +1 */
static inline float sign_value(uint32_t code) { return code ? -1.0f : 1.0f; }

/* Indexed by dp.compress's values (runtime/settings.h); the names are the configuration's. */
static const format formats[PT_CODEC_KINDS] = {
    [PT_CODEC_NONE] = {32, SCALE_NONE, 1.0f, fp32_quantize, fp32_value},
    [PT_CODEC_INT8] = {8, SCALE_ABSMAX, 127.0f, int8_quantize, int8_value},
    [PT_CODEC_E3M0] = {4, SCALE_ABSMAX, 1.0f, e3m0_quantize, e3m0_value},
    [PT_CODEC_E2M1] = {4, SCALE_ABSMAX, 6.0f, e2m1_quantize, e2m1_value},
    [PT_CODEC_ONEBIT] = {1, SCALE_RMS, 1.0f, sign_quantize, sign_value},
};

/* ---- layout --------------------------------------------------------------- */

/* Elements per scale (SCALE_NONE: one block without a scale). */
static size_t block_length(const pt_codec *codec, size_t n)
{
    return formats[codec->kind].rule == SCALE_ABSMAX ? codec->block : n;
}

static size_t scale_count(const pt_codec *codec, size_t n)
{
    switch (formats[codec->kind].rule) {
    case SCALE_ABSMAX: return (n + codec->block - 1) / codec->block;
    case SCALE_RMS: return n > 0;
    default: return 0;
    }
}

static size_t code_bytes(const format *f, size_t n) { return (n * f->bits + 7) / 8; }

/* Codes of `bits` (1, 4, 8 or 32) packed from bit 0 of byte 0 on; the
 * buffer starts zeroed, so putting only ORs. */
static inline void put_code(unsigned char *codes, unsigned bits, size_t i, uint32_t code)
{
    if (bits == 32) {
        memcpy(codes + 4 * i, &code, sizeof code);
        return;
    }
    size_t bit = i * bits;
    codes[bit / 8] |= (unsigned char)(code << (bit % 8));
}

static inline uint32_t get_code(const unsigned char *codes, unsigned bits, size_t i)
{
    if (bits == 32) {
        uint32_t code;
        memcpy(&code, codes + 4 * i, sizeof code);
        return code;
    }
    size_t bit = i * bits;
    return (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
}

/* ---- the public side ------------------------------------------------------ */

pipert_result pt_codec_init(pt_codec *codec, pt_codec_kind kind, size_t block)
{
    if ((unsigned)kind >= PT_CODEC_KINDS)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.compress: no codec has the value %d", (int)kind);
    if (block == 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "codec %s: block of 0 elements",
                       pt_config_choice_name("dp.compress", kind));
    *codec = (pt_codec){.kind = kind, .block = block};
    return PIPERT_OK;
}

const char *pt_codec_name(const pt_codec *codec)
{
    return pt_config_choice_name("dp.compress", codec->kind);
}

size_t pt_codec_encoded_bytes(const pt_codec *codec, size_t n)
{
    return sizeof(float) * scale_count(codec, n) + code_bytes(&formats[codec->kind], n);
}

double pt_codec_bits_per_element(const pt_codec *codec)
{
    const format *f = &formats[codec->kind];
    return f->bits + (f->rule == SCALE_ABSMAX ? 32.0 / (double)codec->block : 0);
}

/* What element i sends: x + e with error feedback, else x. */
static inline float carried(const float *x, const float *error, size_t i)
{
    return error ? x[i] + error[i] : x[i];
}

static pipert_result check_finite(const pt_codec *codec, const float *x, const float *error,
                                  size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (isfinite(carried(x, error, i))) continue;
        if (isfinite(x[i]))
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "%s codec: element %zu of %zu plus its carried error (%g) is not finite",
                           pt_codec_name(codec), i, n, error[i]);
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s codec: element %zu of %zu is %g",
                       pt_codec_name(codec), i, n, x[i]);
    }
    return PIPERT_OK;
}

static float block_scale(const format *f, const float *x, const float *error, size_t n)
{
    if (f->rule == SCALE_NONE) return 1.0f;
    if (f->rule == SCALE_RMS) {
        double squares = 0;
        for (size_t i = 0; i < n; i++) {
            const double v = carried(x, error, i);
            squares += v * v;
        }
        return (float)sqrt(squares / (double)n);
    }
    float absmax = 0;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(carried(x, error, i)); /* finite: checked */
        absmax = a > absmax ? a : absmax;
    }
    return absmax / f->top;
}

/* The loops over blocks, instantiated once per format with the format as a
 * constant (SPECIALISE below), so that the compiler inlines its maps: a call
 * through a pointer per element cost 2-6 times the work itself. */
static inline __attribute__((always_inline)) void encode_blocks(const format *f, size_t length,
                                                                const float *x, size_t n,
                                                                float *error, unsigned char *scales,
                                                                unsigned char *codes)
{
    for (size_t begin = 0, b = 0; begin < n; begin += length, b++) {
        const size_t m = n - begin < length ? n - begin : length;
        const float scale = block_scale(f, x + begin, error ? error + begin : NULL, m);
        if (f->rule != SCALE_NONE) memcpy(scales + sizeof(float) * b, &scale, sizeof scale);
        for (size_t i = begin; i < begin + m; i++) {
            const float v = carried(x, error, i);
            const uint32_t code = f->quantize(v, scale);
            put_code(codes, f->bits, i, code);
            if (error) error[i] = v - f->value(code) * scale;
        }
    }
}

static inline __attribute__((always_inline)) void
decode_blocks(const format *f, size_t length, const unsigned char *scales,
              const unsigned char *codes, size_t n, float *out, int accumulate)
{
    for (size_t begin = 0, b = 0; begin < n; begin += length, b++) {
        const size_t m = n - begin < length ? n - begin : length;
        float scale = 1.0f;
        if (f->rule != SCALE_NONE) memcpy(&scale, scales + sizeof(float) * b, sizeof scale);
        for (size_t i = begin; i < begin + m; i++) {
            const float y = f->value(get_code(codes, f->bits, i)) * scale;
            out[i] = accumulate ? out[i] + y : y;
        }
    }
}

#define SPECIALISE(kind, suffix)                                                                   \
    static void encode_##suffix(size_t length, const float *x, size_t n, float *error,             \
                                unsigned char *scales, unsigned char *codes)                       \
    {                                                                                              \
        encode_blocks(&formats[kind], length, x, n, error, scales, codes);                         \
    }                                                                                              \
    static void decode_##suffix(size_t length, const unsigned char *scales,                        \
                                const unsigned char *codes, size_t n, float *out, int accumulate)  \
    {                                                                                              \
        decode_blocks(&formats[kind], length, scales, codes, n, out, accumulate);                  \
    }
SPECIALISE(PT_CODEC_NONE, none)
SPECIALISE(PT_CODEC_INT8, int8)
SPECIALISE(PT_CODEC_E3M0, e3m0)
SPECIALISE(PT_CODEC_E2M1, e2m1)
SPECIALISE(PT_CODEC_ONEBIT, onebit)

typedef struct format_loops {
    void (*encode)(size_t length, const float *x, size_t n, float *error, unsigned char *scales,
                   unsigned char *codes);
    void (*decode)(size_t length, const unsigned char *scales, const unsigned char *codes, size_t n,
                   float *out, int accumulate);
} format_loops;

static const format_loops loops_of[] = {
    [PT_CODEC_NONE] = {encode_none, decode_none},
    [PT_CODEC_INT8] = {encode_int8, decode_int8},
    [PT_CODEC_E3M0] = {encode_e3m0, decode_e3m0},
    [PT_CODEC_E2M1] = {encode_e2m1, decode_e2m1},
    [PT_CODEC_ONEBIT] = {encode_onebit, decode_onebit},
};

pipert_result pt_codec_encode(const pt_codec *codec, const float *x, size_t n, float *error,
                              void *out)
{
    const format *f = &formats[codec->kind];
    if (n == 0) return PIPERT_OK;
    PT_TRY(check_finite(codec, x, error, n));
    unsigned char *scales = out, *codes = scales + sizeof(float) * scale_count(codec, n);
    memset(codes, 0, code_bytes(f, n));
    loops_of[codec->kind].encode(block_length(codec, n), x, n, error, scales, codes);
    return PIPERT_OK;
}

static void decode(const pt_codec *codec, const void *in, size_t n, float *out, int accumulate)
{
    if (n == 0) return;
    const unsigned char *scales = in, *codes = scales + sizeof(float) * scale_count(codec, n);
    loops_of[codec->kind].decode(block_length(codec, n), scales, codes, n, out, accumulate);
}

void pt_codec_decode(const pt_codec *codec, const void *in, size_t n, float *out)
{
    decode(codec, in, n, out, 0);
}

void pt_codec_decode_add(const pt_codec *codec, const void *in, size_t n, float *out)
{
    decode(codec, in, n, out, 1);
}
