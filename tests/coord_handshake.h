/* A worker's side of the coordinator's handshake spoken by hand over a raw socket
 * (comm/coordinator_protocol.h), for tests that must see and control every byte:
 * a silent rank, a replayed registration, a wrong proof. Header-only; include once. */
#ifndef PT_TESTS_COORD_HANDSHAKE_H
#define PT_TESTS_COORD_HANDSHAKE_H

#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/auth.h"
#include "runtime/job_digest.h"
#include "comm/coordinator_protocol.h"

/* What a raw registration sent, line by line, for a replay. */
typedef struct coord_transcript {
    char hello[256];
    char registration[1024];
} coord_transcript;

/* A TCP connection to the coordinator on 127.0.0.1:port, or -1. */
static int coord_dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool coord_write_line(int fd, const char *line)
{
    size_t length = strlen(line);
    return write(fd, line, length) == (ssize_t)length;
}

/* One line (without its '\n') within timeout_s, byte by byte: nothing after it is consumed. */
static bool coord_read_line(int fd, char *line, size_t capacity, double timeout_s)
{
    size_t n = 0;
    while (n + 1 < capacity) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(timeout_s * 1000)) != 1 || read(fd, line + n, 1) != 1) break;
        if (line[n] == '\n') {
            line[n] = '\0';
            return true;
        }
        n++;
    }
    line[n] = '\0';
    return false;
}

/* hello → challenge → register for `rank` of `world`, proving with `secret` (NULL: a proof of
 * random bytes), the registration carrying `extra` fields too (", \"resume\": {...}"; "" for
 * none); *answer gets the coordinator's last line ("welcome" or "refused" JSON). False when the
 * coordinator's challenge is missing or its proof is wrong. */
static bool coord_register_raw_with(int fd, const char *secret, int rank, int world,
                                    const char *extra, coord_transcript *sent, char *answer,
                                    size_t capacity)
{
    pt_auth_key key;
    uint8_t ours[PT_AUTH_NONCE_BYTES], theirs[PT_AUTH_NONCE_BYTES], proof[PT_AUTH_PROOF_BYTES];
    char hex[PT_AUTH_HEX_CAPACITY], line[1024];
    pt_auth_derive_key(secret ? secret : "", PT_AUTH_USE_COORDINATOR, &key);
    pt_auth_new_nonce(ours);
    pt_auth_to_hex(ours, sizeof ours, hex);
    snprintf(sent->hello, sizeof sent->hello, "{\"type\": \"hello\", \"nonce\": \"%s\"}\n", hex);
    if (!coord_write_line(fd, sent->hello) || !coord_read_line(fd, line, sizeof line, 10))
        return false;
    json_t *challenge = json_loads(line, 0, NULL);
    const char *nonce = json_string_value(json_object_get(challenge, "nonce"));
    const char *their_proof = json_string_value(json_object_get(challenge, "proof"));
    bool ok = nonce && their_proof && pt_auth_from_hex(nonce, theirs, sizeof theirs) &&
              pt_auth_from_hex(their_proof, proof, sizeof proof);
    json_decref(challenge);
    if (!ok) return false;
    if (secret && !pt_auth_verify(&key, &PT_COORD_PROVER, ours, theirs, proof)) return false;
    if (secret)
        pt_auth_prove(&key, &(pt_auth_party){PT_COORD_WORKER_ROLE, rank, -1}, theirs, ours, proof);
    else
        pt_auth_new_nonce(proof); /* 32 random bytes */
    pt_auth_to_hex(proof, sizeof proof, hex);
    snprintf(sent->registration, sizeof sent->registration,
             "{\"type\": \"register\", \"rank\": %d, \"world\": %d, \"host\": \"h\", \"pid\": 1, "
             "\"address\": \"\", \"proof\": \"%s\", \"protocol\": %u%s}\n",
             rank, world, hex, PT_PROTOCOL_VERSION, extra);
    if (!coord_write_line(fd, sent->registration)) return false;
    return coord_read_line(fd, answer, capacity, 10);
}

static bool coord_register_raw(int fd, const char *secret, int rank, int world,
                               coord_transcript *sent, char *answer, size_t capacity)
{
    return coord_register_raw_with(fd, secret, rank, world, "", sent, answer, capacity);
}

#endif
