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
 * Replays. A receiver keeps, per peer, the highest sequence number it accepted and a bitmap of
 * the REPLAY_WINDOW numbers below it: a number seen before, or older than the window, is
 * refused. Messages may be received out of order (a receive posted late takes an old message),
 * up to REPLAY_WINDOW messages apart. */
#include "runtime/comm/transport_internal.h"

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

static void compute_mac(const uint8_t key[PT_AUTH_KEY_BYTES], const pt_message_header *h,
                        const void *payload, uint8_t mac[PT_MESSAGE_MAC_BYTES])
{
    pt_message_header covered = *h;
    memset(covered.mac, 0, sizeof covered.mac);
    uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(h->sequence >> (8 * i));
    uint8_t one_time[crypto_onetimeauth_KEYBYTES];
    crypto_stream_chacha20_ietf(one_time, sizeof one_time, nonce, key);
    crypto_onetimeauth_state state;
    crypto_onetimeauth_init(&state, one_time);
    crypto_onetimeauth_update(&state, (const uint8_t *)&covered, sizeof covered);
    if (h->nbytes) crypto_onetimeauth_update(&state, payload, (size_t)h->nbytes);
    crypto_onetimeauth_final(&state, mac);
    sodium_memzero(one_time, sizeof one_time);
}

pipert_result pt_transport_mac_sign(pt_transport *t, int rank, pt_message_header *h,
                                    const void *payload)
{
    if (!t->authenticate_messages) return PIPERT_OK;
    uint8_t key[PT_AUTH_KEY_BYTES];
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = rank < t->peer_capacity ? &t->peers[rank] : NULL;
    int ready = p && p->keys.ready;
    if (ready) {
        memcpy(key, p->keys.send, sizeof key);
        h->sequence = ++p->keys.sent;
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!ready)
        return pt_fail(PIPERT_ERR_PEER, "pt_send: rank %d is not connected (no message keys)",
                       rank);
    compute_mac(key, h, payload, h->mac);
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

int pt_transport_mac_check(pt_transport *t, int rank, const pt_message_header *h,
                           const void *payload, char *why, size_t capacity)
{
    if (!t->authenticate_messages) return 1;
    uint8_t key[PT_AUTH_KEY_BYTES], expected[PT_MESSAGE_MAC_BYTES];
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = rank < t->peer_capacity ? &t->peers[rank] : NULL;
    int ready = p && p->keys.ready;
    if (ready) memcpy(key, p->keys.receive, sizeof key);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!ready) return snprintf(why, capacity, "mac: no message keys for rank %d", rank), 0;
    if (h->sequence == 0) return snprintf(why, capacity, "mac: the message carries none"), 0;
    compute_mac(key, h, payload, expected);
    sodium_memzero(key, sizeof key);
    if (crypto_verify_16(expected, h->mac) != 0)
        return snprintf(why, capacity, "mac: wrong (a forged or altered message, sequence %llu)",
                        (unsigned long long)h->sequence),
               0;
    pthread_mutex_lock(&pt_transport_state_lock);
    p = &t->peers[rank];
    int fresh = accept_sequence(&p->keys, h->sequence);
    uint64_t highest = p->keys.highest;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!fresh)
        return snprintf(why, capacity,
                        "mac: sequence %llu was used before or is too old (highest %llu): a "
                        "replayed message",
                        (unsigned long long)h->sequence, (unsigned long long)highest),
               0;
    return 1;
}
