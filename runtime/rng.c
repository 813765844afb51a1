#include "runtime/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t product = (uint64_t)a * b;
    *hi = (uint32_t)(product >> 32);
    *lo = (uint32_t)product;
}

void pt_philox4x32(pt_philox_key key, const uint32_t counter[4], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key.k[0], k1 = key.k[1];
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += PHILOX_W0, k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* splitmix64 finaliser: a bijective mixer for seeds and stream ids. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

pt_philox_key pt_rng_key(uint64_t seed, uint64_t stream)
{
    uint64_t k = mix64(mix64(seed) ^ stream);
    return (pt_philox_key){{(uint32_t)k, (uint32_t)(k >> 32)}};
}

uint64_t pt_hash_string(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void block_at(pt_philox_key key, uint64_t block, uint32_t out[4])
{
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    pt_philox4x32(key, counter, out);
}

uint64_t pt_rng_u64(pt_philox_key key, uint64_t i)
{
    uint32_t r[4];
    block_at(key, i, r);
    return (uint64_t)r[0] | (uint64_t)r[1] << 32;
}

double pt_rng_uniform(pt_philox_key key, uint64_t i)
{
    return (double)(pt_rng_u64(key, i) >> 11) * 0x1.0p-53;
}

/* Box-Muller on the four words of block i: element i uses words (0,1) for its
 * radius and angle, so each element is independent of its neighbours. */
float pt_rng_normal(pt_philox_key key, uint64_t i)
{
    uint32_t r[4];
    block_at(key, i, r);
    double u1 = ((double)(((uint64_t)r[0] << 21) ^ r[1]) + 0.5) * 0x1.0p-53;
    double u2 = (double)r[2] * 0x1.0p-32;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void pt_rng_fill_normal(pt_philox_key key, float *out, size_t n, float mean, float std)
{
    for (size_t j = 0; j < n; j++) out[j] = mean + std * pt_rng_normal(key, j);
}

uint64_t pt_rng_below(pt_philox_key key, uint64_t counter, uint64_t bound)
{
    const uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    uint64_t x = pt_rng_u64(key, counter);
    for (uint32_t attempt = 1;; attempt++) {
        unsigned __int128 product = (unsigned __int128)x * bound;
        if ((uint64_t)product >= threshold) return (uint64_t)(product >> 64);
        /* Rejected: redraw from the same counter, the attempt in word 2. */
        uint32_t words[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), attempt, 0}, r[4];
        pt_philox4x32(key, words, r);
        x = (uint64_t)r[0] | (uint64_t)r[1] << 32;
    }
}
