/* Sealed lines of the coordinator's protocol (coordinator_protocol.h,
 * "Authentication"): after the registration handshake, every line either
 * side sends is "MAC JSON\n", where JSON carries "seq" (1, 2, … per
 * direction) and MAC is HMAC-SHA-256 of the JSON text under a key of this
 * connection alone, derived from the job's key and the handshake's two
 * nonces. A line whose MAC is wrong (injected into the TCP stream, or
 * garbled) or whose seq is not the next one (replayed, reordered, dropped) is
 * refused without being parsed. */
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "comm/coordinator_protocol.h"

#define MAC_HEX (2 * crypto_auth_hmacsha256_BYTES)

/* The party whose "proof" over the two nonces is the connection's key: a label no
 * registration proof uses, so the key is nothing an observer of the handshake saw. */
static const pt_auth_party SESSION = {"coordinator-session", -1, -1};

void pt_coord_seal_start(pt_coord_seal *s, const pt_auth_key *key,
                         const uint8_t worker_nonce[PT_AUTH_NONCE_BYTES],
                         const uint8_t coordinator_nonce[PT_AUTH_NONCE_BYTES])
{
    *s = (pt_coord_seal){.on = true};
    pt_auth_prove(key, &SESSION, worker_nonce, coordinator_nonce, s->key);
}

static void mac_hex(const pt_coord_seal *s, const char *text, size_t length, char hex[MAC_HEX + 1])
{
    uint8_t mac[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256(mac, (const unsigned char *)text, length, s->key);
    sodium_bin2hex(hex, MAC_HEX + 1, mac, sizeof mac);
}

char *pt_coord_seal_message(pt_coord_seal *s, json_t *message, size_t *length)
{
    if (!s->on) return pt_coord_message_text(message, length);
    if (!message || json_object_set_new(message, "seq", json_integer((json_int_t)++s->sent)) != 0) {
        json_decref(message);
        return NULL;
    }
    char *text = json_dumps(message, JSON_COMPACT);
    json_decref(message);
    if (!text) return NULL;
    const size_t body = strlen(text);
    char *line = malloc(MAC_HEX + 1 + body + 2);
    if (line) {
        mac_hex(s, text, body, line);
        line[MAC_HEX] = ' ';
        memcpy(line + MAC_HEX + 1, text, body);
        *length = MAC_HEX + 1 + body + 1;
        line[*length - 1] = '\n';
        line[*length] = '\0';
    }
    free(text);
    return line;
}

json_t *pt_coord_seal_open(pt_coord_seal *s, const char *line, size_t length, const char **why)
{
    if (!s->on) {
        json_t *m = json_loadb(line, length, 0, NULL);
        *why = m ? NULL : "not a JSON line";
        return m;
    }
    char expected[MAC_HEX + 1];
    if (length <= MAC_HEX + 1 || line[MAC_HEX] != ' ') {
        *why = "an unsealed line (no MAC)";
        return NULL;
    }
    const char *text = line + MAC_HEX + 1;
    const size_t body = length - MAC_HEX - 1;
    mac_hex(s, text, body, expected);
    if (sodium_memcmp(expected, line, MAC_HEX) != 0) {
        *why = "a line whose MAC is wrong";
        return NULL;
    }
    json_t *m = json_loadb(text, body, 0, NULL);
    json_int_t seq = json_integer_value(json_object_get(m, "seq"));
    if (!m || seq != (json_int_t)(s->received + 1)) {
        json_decref(m);
        *why = "a line out of sequence (replayed or reordered)";
        return NULL;
    }
    s->received++;
    *why = NULL;
    return m;
}
