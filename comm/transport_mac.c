/* Message authentication (pt_transport_options.authenticate_messages): every message carries
 * a sequence number and a 16-byte MAC of its header and payload.
 *
 * Keys. Each connection's handshake (transport_connect.c) leaves both sides with the
 * dialler's and the answerer's nonces. Each direction gets its own key, a proof under the
 * transport key (auth.h) over both nonces, both ranks and the direction: unknown without the
 * job's secret, new with every connection.
 *
 * MAC. Poly1305 (libsodium's crypto_onetimeauth) under a one-time key: the first 32 bytes
 * of ChaCha20's keystream for the direction's key and a nonce that is the sequence number
 * (the construction of ChaCha20-Poly1305), over the header with its MAC zeroed, then the
 * payload. No key is ever used twice: the sender counts.
 *
 * Records. The control words on a connection's stream (a goodbye: "count me as left"; the
 * direct-read offer) and the answers to direct reads are not messages, but a forged goodbye
 * would end a peer as surely as a forged message: they carry a seal, a sequence number from
 * the same count and a MAC over the record's bytes before the seal and that number.
 *
 * Replays. A receiver keeps, per peer, the highest sequence number it accepted and a bitmap of
 * the REPLAY_WINDOW numbers below it: a number seen before, or older than the window, is
 * refused. Messages may be received out of order (a receive posted late takes an old message),
 * up to REPLAY_WINDOW messages apart. */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_mac.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define REPLAY_WINDOW 65536 /* sequence numbers; a multiple of 64 */

/* The key of messages from `from` to `to` on a connection dialled by `dialler`. */
static void direction_key(const pt_transport *t, const connection *c, int from, int to,
                          uint8_t key[PT_AUTH_KEY_BYTES])
{
    const uint8_t *dialler_nonce = c->accepted ? c->peer_nonce : c->nonce;
    const uint8_t *answerer_nonce = c->accepted ? c->nonce : c->peer_nonce;
    pt_auth_party direction = {"transport messages", from, to};
    pt_auth_prove(&t->key, &direction, dialler_nonce, answerer_nonce, key);
}

void pt_transport_mac_keys(connection *c)
{
    pt_transport *t = c->t;
    if (!t->authenticate_messages) return;
    uint8_t send[PT_AUTH_KEY_BYTES], receive[PT_AUTH_KEY_BYTES];
    direction_key(t, c, t->rank, c->rank, send);
    direction_key(t, c, c->rank, t->rank, receive);
    uint64_t *window = calloc(REPLAY_WINDOW / 64, sizeof *window);
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, c->rank);
    if (p && !p->keys.ready && window) {
        memcpy(p->keys.send, send, sizeof send);
        memcpy(p->keys.receive, receive, sizeof receive);
        p->keys.window = window;
        p->keys.ready = 1;
        window = NULL;
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
    free(window); /* not taken: keys already there (the connection in the other direction) */
    sodium_memzero(send, sizeof send);
    sodium_memzero(receive, sizeof receive);
}

void pt_transport_mac_forget(peer *p)
{
    free(p->keys.window);
    sodium_memzero(&p->keys, sizeof p->keys);
}

/* Poly1305 under the one-time key of `sequence`, over `a` then `b`. */
static void mac_over(const uint8_t key[PT_AUTH_KEY_BYTES], uint64_t sequence, const void *a,
                     size_t a_bytes, const void *b, size_t b_bytes,
                     uint8_t mac[PT_MESSAGE_MAC_BYTES])
{
    uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(sequence >> (8 * i));
    uint8_t one_time[crypto_onetimeauth_KEYBYTES];
    crypto_stream_chacha20_ietf(one_time, sizeof one_time, nonce, key);
    crypto_onetimeauth_state state;
    crypto_onetimeauth_init(&state, one_time);
    crypto_onetimeauth_update(&state, a, a_bytes);
    if (b_bytes) crypto_onetimeauth_update(&state, b, b_bytes);
    crypto_onetimeauth_final(&state, mac);
    sodium_memzero(one_time, sizeof one_time);
}

/* A message's MAC: over its header with the MAC zeroed, then its payload. */
static void compute_mac(const uint8_t key[PT_AUTH_KEY_BYTES], const pt_message_header *h,
                        const void *payload, uint8_t mac[PT_MESSAGE_MAC_BYTES])
{
    pt_message_header covered = *h;
    memset(covered.mac, 0, sizeof covered.mac);
    mac_over(key, h->sequence, &covered, sizeof covered, payload, (size_t)h->nbytes, mac);
}

/* A record's MAC: over its bytes before the seal, then the seal's sequence number. */
static void compute_seal_mac(const uint8_t key[PT_AUTH_KEY_BYTES], const void *record,
                             size_t size, uint64_t sequence, uint8_t mac[PT_MESSAGE_MAC_BYTES])
{
    mac_over(key, sequence, record, size, &sequence, sizeof sequence, mac);
}

/* The send key to `rank` and the next sequence number; 0 and an error without keys. */
static int take_send_key(pt_transport *t, int rank, uint8_t key[PT_AUTH_KEY_BYTES],
                         uint64_t *sequence)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = rank < t->peer_capacity ? &t->peers[rank] : NULL;
    int ready = p && p->keys.ready;
    if (ready) {
        memcpy(key, p->keys.send, PT_AUTH_KEY_BYTES);
        *sequence = ++p->keys.sent;
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!ready)
        pt_fail(PIPERT_ERR_PEER, "pt_send: rank %d is not connected (no message keys)", rank);
    return ready;
}

/* The receive key from `rank`; 0 and `why` without keys. */
static int take_receive_key(pt_transport *t, int rank, uint8_t key[PT_AUTH_KEY_BYTES], char *why,
                            size_t capacity)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = rank < t->peer_capacity ? &t->peers[rank] : NULL;
    int ready = p && p->keys.ready;
    if (ready) memcpy(key, p->keys.receive, PT_AUTH_KEY_BYTES);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!ready) snprintf(why, capacity, "mac: no message keys for rank %d", rank);
    return ready;
}

pipert_result pt_transport_mac_sign(pt_transport *t, int rank, pt_message_header *h,
                                    const void *payload)
{
    if (!t->authenticate_messages) return PIPERT_OK;
    uint8_t key[PT_AUTH_KEY_BYTES];
    if (!take_send_key(t, rank, key, &h->sequence)) return PIPERT_ERR_PEER;
    compute_mac(key, h, payload, h->mac);
    sodium_memzero(key, sizeof key);
    return PIPERT_OK;
}

pipert_result pt_transport_seal_record(pt_transport *t, int rank, const void *record, size_t size,
                                       uint64_t *sequence, uint8_t mac[PT_MESSAGE_MAC_BYTES])
{
    *sequence = 0;
    memset(mac, 0, PT_MESSAGE_MAC_BYTES);
    if (!t->authenticate_messages) return PIPERT_OK;
    uint8_t key[PT_AUTH_KEY_BYTES];
    if (!take_send_key(t, rank, key, sequence)) return PIPERT_ERR_PEER;
    compute_seal_mac(key, record, size, *sequence, mac);
    sodium_memzero(key, sizeof key);
    return PIPERT_OK;
}

/* Whether `sequence` is new from this peer; if so it is recorded. */
static int accept_sequence(message_keys *k, uint64_t sequence)
{
    if (sequence == 0) return 0;
    if (sequence > k->highest) {
        uint64_t shift = sequence - k->highest;
        for (uint64_t s = k->highest + 1; s <= sequence && shift < REPLAY_WINDOW; s++)
            k->window[(s % REPLAY_WINDOW) / 64] &= ~(1ull << (s % 64));
        if (shift >= REPLAY_WINDOW) memset(k->window, 0, REPLAY_WINDOW / 8);
        k->highest = sequence;
    } else if (k->highest - sequence >= REPLAY_WINDOW) {
        return 0;
    }
    uint64_t *word = &k->window[(sequence % REPLAY_WINDOW) / 64], bit = 1ull << (sequence % 64);
    if (*word & bit) return 0;
    *word |= bit;
    return 1;
}

/* After the MAC passed: whether `sequence` is new from `rank` (else 0 and `why`). */
static int accept_fresh(pt_transport *t, int rank, uint64_t sequence, char *why, size_t capacity)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = &t->peers[rank];
    int fresh = p->keys.ready && accept_sequence(&p->keys, sequence);
    uint64_t highest = p->keys.highest;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!fresh)
        snprintf(why, capacity,
                 "mac: sequence %llu was used before or is too old (highest %llu): a replayed "
                 "message",
                 (unsigned long long)sequence, (unsigned long long)highest);
    return fresh;
}

/* Whether `mac` is the `expected` one of a message numbered `sequence` (else 0 and `why`). */
static int mac_matches(const uint8_t expected[PT_MESSAGE_MAC_BYTES],
                       const uint8_t mac[PT_MESSAGE_MAC_BYTES], uint64_t sequence, char *why,
                       size_t capacity)
{
    if (crypto_verify_16(expected, mac) == 0) return 1;
    snprintf(why, capacity, "mac: wrong (a forged or altered message, sequence %llu)",
             (unsigned long long)sequence);
    return 0;
}

int pt_transport_mac_check(pt_transport *t, int rank, const pt_message_header *h,
                           const void *payload, char *why, size_t capacity)
{
    if (!t->authenticate_messages) return 1;
    uint8_t key[PT_AUTH_KEY_BYTES], expected[PT_MESSAGE_MAC_BYTES];
    if (!take_receive_key(t, rank, key, why, capacity)) return 0;
    if (h->sequence == 0) return snprintf(why, capacity, "mac: the message carries none"), 0;
    compute_mac(key, h, payload, expected);
    sodium_memzero(key, sizeof key);
    return mac_matches(expected, h->mac, h->sequence, why, capacity) &&
           accept_fresh(t, rank, h->sequence, why, capacity);
}

int pt_transport_seal_check(pt_transport *t, int rank, const void *record, size_t size,
                            uint64_t sequence, const uint8_t mac[PT_MESSAGE_MAC_BYTES], char *why,
                            size_t capacity)
{
    if (!t->authenticate_messages) return 1;
    uint8_t key[PT_AUTH_KEY_BYTES], expected[PT_MESSAGE_MAC_BYTES];
    if (!take_receive_key(t, rank, key, why, capacity)) return 0;
    if (sequence == 0) return snprintf(why, capacity, "mac: the record carries none"), 0;
    compute_seal_mac(key, record, size, sequence, expected);
    sodium_memzero(key, sizeof key);
    return mac_matches(expected, mac, sequence, why, capacity) &&
           accept_fresh(t, rank, sequence, why, capacity);
}
