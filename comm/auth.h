/* Proving knowledge of the job secret without sending it: challenge and response with a
 * keyed MAC (HMAC-SHA-256, from libsodium), used by the coordinator's
 * registration (coordinator_server.c, coordinator_client.c) and by the transport's hellos
 * (transport_connect.c).
 *
 * Each side of a connection draws a fresh random nonce and sends it; each proves itself by
 * the MAC, under a key derived from the secret, of (its role's label, the other side's nonce,
 * its own nonce, its rank, the other's rank). A recorded proof is worthless later: the other
 * side's nonce is new on every connection. The labels differ by role, so a proof obtained by
 * asking one side can never be replayed as the other side's, and the keys differ by use
 * (PT_AUTH_USE_*), so a coordinator proof is no transport proof.
 */
#ifndef PT_AUTH_H
#define PT_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/error.h"

#define PT_AUTH_KEY_BYTES 32
#define PT_AUTH_NONCE_BYTES 32
#define PT_AUTH_PROOF_BYTES 32
/* hexadecimal text of a nonce or proof, with its NUL */
#define PT_AUTH_HEX_CAPACITY (2 * PT_AUTH_PROOF_BYTES + 1)

/* What a key is for: keys for different uses are unrelated. */
typedef enum pt_auth_use { PT_AUTH_USE_COORDINATOR = 1, PT_AUTH_USE_TRANSPORT = 2 } pt_auth_use;

typedef struct pt_auth_key {
    uint8_t bytes[PT_AUTH_KEY_BYTES];
} pt_auth_key;

/* Who is proving: a role label goes into every proof. */
typedef struct pt_auth_party {
    const char *role; /* "coordinator", "worker", "dialler", "answerer", ... */
    long rank;        /* the prover's rank (-1: none) */
    long peer_rank;   /* the verifier's rank (-1: none) */
} pt_auth_party;

/* The key for `use` derived from the job secret (a NUL-terminated string of any length).
 * Fails only when libsodium cannot initialise. */
pipert_result pt_auth_derive_key(const char *secret, pt_auth_use use, pt_auth_key *key);

/* PT_AUTH_NONCE_BYTES fresh random bytes. */
pipert_result pt_auth_new_nonce(uint8_t nonce[PT_AUTH_NONCE_BYTES]);

/* The proof that `prover` knows the key, answering `challenge` (the verifier's nonce) with
 * its own nonce `response_nonce`. */
void pt_auth_prove(const pt_auth_key *key, const pt_auth_party *prover,
                   const uint8_t challenge[PT_AUTH_NONCE_BYTES],
                   const uint8_t response_nonce[PT_AUTH_NONCE_BYTES],
                   uint8_t proof[PT_AUTH_PROOF_BYTES]);

/* Whether `proof` is what pt_auth_prove gives for the same arguments (in constant time). */
bool pt_auth_verify(const pt_auth_key *key, const pt_auth_party *prover,
                    const uint8_t challenge[PT_AUTH_NONCE_BYTES],
                    const uint8_t response_nonce[PT_AUTH_NONCE_BYTES],
                    const uint8_t proof[PT_AUTH_PROOF_BYTES]);

/* Lowercase hexadecimal of n bytes (text has capacity 2n + 1), and back: false unless
 * `text` is exactly 2n hexadecimal digits. */
void pt_auth_to_hex(const uint8_t *bytes, size_t n, char *text);
bool pt_auth_from_hex(const char *text, uint8_t *bytes, size_t n);

#endif
