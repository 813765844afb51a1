/* Codecs for what crosses a slow link between replicas (ALGORITHMS.md §4.6),
 * chosen by name (dp.compress): none | int8 | e3m0 | e2m1 | onebit.
 *
 * A codec turns n floats into a compact byte string (pt_codec_encode) and
 * back into fp32 (pt_codec_decode, or pt_codec_decode_add: out += decoded).
 * The block codecs keep one fp32 scale per block of `block` elements (the last
 * block may be shorter), scale = absmax(block) / top, where top is the
 * largest magnitude of the code; an element's code is its value / scale
 * rounded to the nearest code value, and decodes to code value · scale.
 *
 *   none    fp32 as is. Layout: n fp32 values.
 *   int8    codes −127..127, top 127. Ties round away from zero (C's
 *           roundf: 2.5 → 3, −2.5 → −3), independent of the FP environment.
 *           Layout: ⌈n/block⌉ fp32 scales, then n two's-complement bytes.
 *   e3m0    4 bits: 1 sign bit (bit 3) and 3 exponent bits e (bits 0..2), no
 *           mantissa, as Streaming DiLoCo's FP4 E3M0. e = 0 is zero, e = 1..7
 *           is 2^(e−7); top 1. The 16 codes:
 *             0x0 +0      0x1 +1/64  0x2 +1/32  0x3 +1/16
 *             0x4 +1/8    0x5 +1/4   0x6 +1/2   0x7 +1
 *             0x8 −0      0x9 −1/64  ...        0xF −1
 *   e2m1    4 bits, the OCP MX FP4 (E2M1) table: bits 0..2 index the
 *           magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign; top 6.
 *           For both 4-bit codes the nearest magnitude wins, and a value
 *           exactly halfway between two goes to the one whose 3-bit code is
 *           even (round half to even on the code, as the OCP MX spec's
 *           roundTiesToEven: e2m1 0.25 → 0, 0.75 → 1, 2.5 → 2, 5 → 4; e3m0
 *           1.5/64 → 1/32, 0.75 → 1/2). A negative value (−0 included) keeps
 *           its sign bit even when it rounds to zero, so −0 encodes as 0x8.
 *           Layout: ⌈n/block⌉ fp32 scales, then ⌈n/2⌉ bytes, element 2k in
 *           the low nibble of byte k, 2k+1 in the high nibble.
 *   onebit  1-bit with one scale for the whole vector (1-bit Adam/LAMB):
 *           s = ‖x‖₂/√n (the sum of squares in double), each element sent as
 *           its sign (0 and −0 as +1), decoded as ±s. `block` is not used.
 *           Layout: one fp32 scale, then ⌈n/8⌉ bytes, element 8k+j in bit j
 *           of byte k, set for −1.
 * Unused bits of the last byte are 0. An empty vector encodes to 0 bytes.
 * Scales are written with memcpy in host byte order (every host of a job
 * shares it, as the transport's headers require), so buffers need no
 * alignment. A block of zeros has scale 0 and decodes to zeros.
 *
 * Error feedback. Given an error buffer e (any codec; onebit is the one that
 * needs it), encoding sends x + e instead of x and leaves in e what that
 * lost: v = x + e; send v; e ← v − decode(v). Over many rounds the mean of
 * what was sent then tracks the mean of the inputs. The buffer is the
 * caller's state (it belongs in checkpoints); start it at zero.
 *
 * Decoding trusts its input (a peer's checksummed message): it never reads
 * past pt_codec_encoded_bytes(n), but garbage scales decode to garbage.
 */
#ifndef PT_CODEC_H
#define PT_CODEC_H

#include <stddef.h>

#include "runtime/error.h"
#include "runtime/settings.h"

/* A codec is a small value: fill it with pt_codec_init. */
typedef struct pt_codec {
    pt_codec_kind kind;
    size_t block; /* elements per scale of the block codecs, >= 1 */
} pt_codec;

/* The codec `kind` (dp.compress) with `block` elements per scale (dp.block). A value no codec
 * has is a PIPERT_ERR_CONFIG; block 0 is a PIPERT_ERR_INVALID_ARG. */
pipert_result pt_codec_init(pt_codec *codec, pt_codec_kind kind, size_t block);

/* "none", "int8", ...: dp.compress's name of it. */
const char *pt_codec_name(const pt_codec *codec);

/* Bytes pt_codec_encode writes for n elements: 4·scales + ⌈n·bits/8⌉, with
 * ⌈n/block⌉ scales (int8, e3m0, e2m1), 1 (onebit, n > 0) or 0 (none). */
size_t pt_codec_encoded_bytes(const pt_codec *codec, size_t n);

/* Bits a long vector costs per element, scales included: the code's bits, plus a 32-bit scale
 * per block (int8, e3m0, e2m1); onebit's one scale and none's nothing add no bits per element. */
double pt_codec_bits_per_element(const pt_codec *codec);

/* Encodes x[0..n) into out[0..pt_codec_encoded_bytes(n)). error: the error
 * feedback buffer [n] (read and updated), or NULL for none. A NaN or an
 * infinity in x (or in x + error) is refused with PIPERT_ERR_INVALID_ARG
 * naming the element's index, before anything is written. */
pipert_result pt_codec_encode(const pt_codec *codec, const float *x, size_t n, float *error,
                              void *out);

/* out[0..n) = the decoded values of `in`, or out[i] += them (fp32 adds). */
void pt_codec_decode(const pt_codec *codec, const void *in, size_t n, float *out);
void pt_codec_decode_add(const pt_codec *codec, const void *in, size_t n, float *out);

#endif
