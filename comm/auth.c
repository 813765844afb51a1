/* Challenge and response over the job secret (auth.h), with libsodium: the secret is hashed
 * (BLAKE2b) into a master key, a key per use is derived from it (crypto_kdf), and proofs are
 * HMAC-SHA-256 over a message that names everything the proof is about. */
#include "comm/auth.h"

#include <sodium.h>
#include <string.h>

/* crypto_kdf's context: 8 characters naming the application. */
static const char KDF_CONTEXT[crypto_kdf_CONTEXTBYTES + 1] = "pipertjb";

static pipert_result sodium_ready(void)
{
    if (sodium_init() < 0)
        return pt_fail(PIPERT_ERR_INTERNAL, "auth: libsodium could not initialise");
    return PIPERT_OK;
}

pipert_result pt_auth_derive_key(const char *secret, pt_auth_use use, pt_auth_key *key)
{
    PT_TRY(sodium_ready());
    uint8_t master[crypto_kdf_KEYBYTES];
    crypto_generichash(master, sizeof master, (const uint8_t *)secret, strlen(secret), NULL, 0);
    crypto_kdf_derive_from_key(key->bytes, sizeof key->bytes, (uint64_t)use, KDF_CONTEXT, master);
    sodium_memzero(master, sizeof master);
    return PIPERT_OK;
}

pipert_result pt_auth_new_nonce(uint8_t nonce[PT_AUTH_NONCE_BYTES])
{
    PT_TRY(sodium_ready());
    randombytes_buf(nonce, PT_AUTH_NONCE_BYTES);
    return PIPERT_OK;
}

static void update_with_number(crypto_auth_hmacsha256_state *state, long value)
{
    uint8_t bytes[8];
    uint64_t v = (uint64_t)(int64_t)value;
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(v >> (8 * i)); /* little-endian */
    crypto_auth_hmacsha256_update(state, bytes, sizeof bytes);
}

/* HMAC(key, len(role) ‖ role ‖ challenge ‖ response nonce ‖ rank ‖ peer rank); lengths and
 * ranks as 64-bit little-endian, so no two different arguments give one message. */
void pt_auth_prove(const pt_auth_key *key, const pt_auth_party *prover,
                   const uint8_t challenge[PT_AUTH_NONCE_BYTES],
                   const uint8_t response_nonce[PT_AUTH_NONCE_BYTES],
                   uint8_t proof[PT_AUTH_PROOF_BYTES])
{
    crypto_auth_hmacsha256_state state;
    crypto_auth_hmacsha256_init(&state, key->bytes, sizeof key->bytes);
    size_t role_length = strlen(prover->role);
    update_with_number(&state, (long)role_length);
    crypto_auth_hmacsha256_update(&state, (const uint8_t *)prover->role, role_length);
    crypto_auth_hmacsha256_update(&state, challenge, PT_AUTH_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&state, response_nonce, PT_AUTH_NONCE_BYTES);
    update_with_number(&state, prover->rank);
    update_with_number(&state, prover->peer_rank);
    crypto_auth_hmacsha256_final(&state, proof);
    sodium_memzero(&state, sizeof state);
}

bool pt_auth_verify(const pt_auth_key *key, const pt_auth_party *prover,
                    const uint8_t challenge[PT_AUTH_NONCE_BYTES],
                    const uint8_t response_nonce[PT_AUTH_NONCE_BYTES],
                    const uint8_t proof[PT_AUTH_PROOF_BYTES])
{
    uint8_t expected[PT_AUTH_PROOF_BYTES];
    pt_auth_prove(key, prover, challenge, response_nonce, expected);
    return sodium_memcmp(expected, proof, PT_AUTH_PROOF_BYTES) == 0;
}

void pt_auth_to_hex(const uint8_t *bytes, size_t n, char *text)
{
    sodium_bin2hex(text, 2 * n + 1, bytes, n);
}

bool pt_auth_from_hex(const char *text, uint8_t *bytes, size_t n)
{
    size_t length = 0;
    const char *end = NULL;
    if (strlen(text) != 2 * n) return false;
    return sodium_hex2bin(bytes, n, text, 2 * n, NULL, &length, &end) == 0 && length == n &&
           *end == '\0';
}
