/* comm/auth.c: keys and proofs against values computed independently (Python's
 * hashlib and hmac: BLAKE2b of the secret, BLAKE2b keyed with salt and personalisation for the
 * derived key, HMAC-SHA-256 of the message auth.c documents), and every argument of a proof
 * shown to matter. */
#include <criterion/criterion.h>
#include <string.h>

#include "comm/auth.h"

#define SECRET "5ecret5ecret5ecret5ecret5ecret00"

/* python3: master = blake2b(SECRET, digest_size=32); key(use) = blake2b(b"", digest_size=32,
 * key=master, salt=pack("<Q", use) + 8 zero bytes, person=b"pipertjb" + 8 zero bytes);
 * proof = hmac(key, pack("<q", len(role)) + role + challenge + response + pack("<q", rank) +
 * pack("<q", peer_rank), sha256) with challenge = bytes(range(32)), response =
 * bytes(range(32, 64)), role "worker", rank 3, peer rank -1. */
static const char KEY_COORDINATOR[] =
    "140ed21f7a217a28de8f047cdb5c4b9257fb2be80e7dda176689ce69881bdc39";
static const char KEY_TRANSPORT[] =
    "aa31b79ad48d5a7fe7c117f35fa796939f0578148088f5cff2e8aa30d63f17ba";
static const char PROOF_COORDINATOR[] =
    "07d635314898be814d20894e1fd19f7f93b3d2b3d59772d74a0cabd8db77f288";
static const char PROOF_TRANSPORT[] =
    "ebc60f315c06874704fdf89cae0959bde10f135cb89e7b9063567b53dff73ac1";

static void fixed_nonces(uint8_t challenge[PT_AUTH_NONCE_BYTES],
                         uint8_t response[PT_AUTH_NONCE_BYTES])
{
    for (int i = 0; i < PT_AUTH_NONCE_BYTES; i++) {
        challenge[i] = (uint8_t)i;
        response[i] = (uint8_t)(32 + i);
    }
}

static void expect_hex(const uint8_t *bytes, size_t n, const char *expected, const char *what)
{
    char text[2 * 64 + 1];
    pt_auth_to_hex(bytes, n, text);
    cr_expect_str_eq(text, expected, "%s", what);
}

Test(auth, keys_and_proofs_match_an_independent_computation)
{
    static const struct {
        pt_auth_use use;
        const char *key, *proof;
    } cases[] = {{PT_AUTH_USE_COORDINATOR, KEY_COORDINATOR, PROOF_COORDINATOR},
                 {PT_AUTH_USE_TRANSPORT, KEY_TRANSPORT, PROOF_TRANSPORT}};
    uint8_t challenge[PT_AUTH_NONCE_BYTES], response[PT_AUTH_NONCE_BYTES];
    fixed_nonces(challenge, response);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_auth_key key;
        cr_assert_eq(pt_auth_derive_key(SECRET, cases[i].use, &key), PIPERT_OK);
        expect_hex(key.bytes, sizeof key.bytes, cases[i].key, "derived key");
        uint8_t proof[PT_AUTH_PROOF_BYTES];
        pt_auth_prove(&key, &(pt_auth_party){"worker", 3, -1}, challenge, response, proof);
        expect_hex(proof, sizeof proof, cases[i].proof, "proof");
        cr_expect(pt_auth_verify(&key, &(pt_auth_party){"worker", 3, -1}, challenge, response,
                                 proof));
    }
}

Test(auth, every_argument_of_a_proof_matters)
{
    pt_auth_key key, other_key;
    cr_assert_eq(pt_auth_derive_key(SECRET, PT_AUTH_USE_TRANSPORT, &key), PIPERT_OK);
    cr_assert_eq(pt_auth_derive_key(SECRET "x", PT_AUTH_USE_TRANSPORT, &other_key), PIPERT_OK);
    uint8_t challenge[PT_AUTH_NONCE_BYTES], response[PT_AUTH_NONCE_BYTES];
    fixed_nonces(challenge, response);
    const pt_auth_party prover = {"transport dialler", 2, 5};
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    pt_auth_prove(&key, &prover, challenge, response, proof);
    cr_expect(pt_auth_verify(&key, &prover, challenge, response, proof));

    cr_expect_not(pt_auth_verify(&other_key, &prover, challenge, response, proof), "secret");
    cr_expect_not(pt_auth_verify(&key, &(pt_auth_party){"transport answerer", 2, 5}, challenge,
                                 response, proof),
                  "role");
    cr_expect_not(pt_auth_verify(&key, &(pt_auth_party){"transport dialler", 3, 5}, challenge,
                                 response, proof),
                  "rank");
    cr_expect_not(pt_auth_verify(&key, &(pt_auth_party){"transport dialler", 2, 4}, challenge,
                                 response, proof),
                  "peer rank");
    cr_expect_not(pt_auth_verify(&key, &prover, response, challenge, proof), "nonces swapped");
    for (int i = 0; i < PT_AUTH_NONCE_BYTES; i += 7) {
        uint8_t changed[PT_AUTH_NONCE_BYTES];
        memcpy(changed, challenge, sizeof changed);
        changed[i] ^= 1;
        cr_expect_not(pt_auth_verify(&key, &prover, changed, response, proof), "challenge byte %d",
                      i);
        memcpy(changed, response, sizeof changed);
        changed[i] ^= 0x80;
        cr_expect_not(pt_auth_verify(&key, &prover, challenge, changed, proof), "response byte %d",
                      i);
    }
    for (int i = 0; i < PT_AUTH_PROOF_BYTES; i++) {
        uint8_t changed[PT_AUTH_PROOF_BYTES];
        memcpy(changed, proof, sizeof changed);
        changed[i] ^= 0x10;
        cr_expect_not(pt_auth_verify(&key, &prover, challenge, response, changed), "proof byte %d",
                      i);
    }
}

/* A role that ends where the challenge begins must not make two messages equal. */
Test(auth, role_and_nonce_boundaries_are_unambiguous)
{
    pt_auth_key key;
    cr_assert_eq(pt_auth_derive_key(SECRET, PT_AUTH_USE_COORDINATOR, &key), PIPERT_OK);
    uint8_t a[PT_AUTH_NONCE_BYTES] = {0}, b[PT_AUTH_NONCE_BYTES] = {0}, p1[32], p2[32];
    pt_auth_prove(&key, &(pt_auth_party){"w", 0, 0}, a, b, p1);
    pt_auth_prove(&key, &(pt_auth_party){"w\x01", 0, 0}, a, b, p2);
    cr_expect_neq(memcmp(p1, p2, sizeof p1), 0);
}

Test(auth, nonces_are_fresh)
{
    uint8_t a[PT_AUTH_NONCE_BYTES], b[PT_AUTH_NONCE_BYTES];
    cr_assert_eq(pt_auth_new_nonce(a), PIPERT_OK);
    cr_assert_eq(pt_auth_new_nonce(b), PIPERT_OK);
    cr_expect_neq(memcmp(a, b, sizeof a), 0, "two nonces are equal");
}

Test(auth, hex_round_trip_and_refusals)
{
    uint8_t bytes[4] = {0x00, 0xab, 0x7f, 0xff}, back[4];
    char text[9];
    pt_auth_to_hex(bytes, sizeof bytes, text);
    cr_expect_str_eq(text, "00ab7fff");
    cr_expect(pt_auth_from_hex(text, back, sizeof back));
    cr_expect_eq(memcmp(bytes, back, sizeof bytes), 0);
    cr_expect(pt_auth_from_hex("00AB7FFF", back, sizeof back), "upper case is hexadecimal too");
    cr_expect_not(pt_auth_from_hex("00ab7ff", back, sizeof back), "too short");
    cr_expect_not(pt_auth_from_hex("00ab7fff00", back, sizeof back), "too long");
    cr_expect_not(pt_auth_from_hex("00ab7fgf", back, sizeof back), "not hexadecimal");
    cr_expect_not(pt_auth_from_hex("00ab 7ff", back, sizeof back), "a space");
    cr_expect_not(pt_auth_from_hex("", back, sizeof back), "empty");
}
