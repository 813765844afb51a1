/* A counter-based random number generator: Philox4x32-10 (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11). A value depends only
 * on (key, counter), so any element of any stream can be drawn independently:
 * the initial weights do not depend on the stage split, and the data a replica
 * samples at a step depends only on (seed, replica, step). */
#ifndef PT_RNG_H
#define PT_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct pt_philox_key {
    uint32_t k[2];
} pt_philox_key;

/* Four 32-bit random words for counter (c0, c1, c2, c3) under `key`. */
void pt_philox4x32(pt_philox_key key, const uint32_t counter[4], uint32_t out[4]);

/* A key from a 64-bit seed and a 64-bit stream id (mixed, so nearby seeds and
 * ids give unrelated streams). */
pt_philox_key pt_rng_key(uint64_t seed, uint64_t stream);

/* The 64-bit FNV-1a hash of a string: a stable stream id for a tensor name. */
uint64_t pt_hash_string(const char *s);

/* Element i of a stream: uniform 64-bit integer, uniform in [0,1), N(0,1). */
uint64_t pt_rng_u64(pt_philox_key key, uint64_t i);
double pt_rng_uniform(pt_philox_key key, uint64_t i);
float pt_rng_normal(pt_philox_key key, uint64_t i);

/* An unbiased draw uniform in [0, bound), bound ≥ 1, that depends only on
 * (key, counter): Lemire's multiply-and-reject on pt_rng_u64(key, counter);
 * a rejected draw (probability < bound/2^64) is redrawn from Philox counter
 * (counter, attempt) in the block's third word. */
uint64_t pt_rng_below(pt_philox_key key, uint64_t counter, uint64_t bound);

/* Fills out[0..n) with N(mean, std²): element j is element j of the stream. */
void pt_rng_fill_normal(pt_philox_key key, float *out, size_t n, float mean, float std);

#endif
