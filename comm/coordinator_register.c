/* The way into the job for the worker's side of the coordinator: connecting (retrying while
 * the coordinator is not up yet), the hello with a proof each way that both know the job's
 * secret, and the registration, the first or again after a lost connection. */
#include "comm/coordinator_client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/log.h"

/* One connection attempt to every address of host:port, each bounded by
 * timeout_s; the socket (blocking) or -1 with *error set. */
int pt_coord_client_try_connect(const char *host, int port, double timeout_s, int *error,
                                bool *resolved)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *list;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &list);
    *resolved = rc == 0;
    if (rc != 0) {
        *error = rc;
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *error = errno;
            continue;
        }
        int ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = ETIMEDOUT;
            socklen_t length = sizeof soerr;
            if (poll(&p, 1, (int)(timeout_s * 1e3) + 1) == 1)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &length);
            ok = soerr == 0;
            errno = soerr;
        }
        if (!ok) {
            *error = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

static pipert_result connect_with_retry(pt_coord_client *c, const pt_coord_client_options *o)
{
    const double deadline = pt_now_s() + o->connect_timeout_s;
    int error = 0;
    bool resolved = true;
    for (;;) {
        double left = deadline - pt_now_s();
        const double attempt_s = left < 5 ? (left > 0 ? left : 0.01) : 5;
        c->fd = pt_coord_client_try_connect(o->host, o->port, attempt_s, &error, &resolved);
        if (c->fd >= 0) return PIPERT_OK;
        if (!resolved && error != EAI_AGAIN)
            return pt_fail(PIPERT_ERR_TRANSPORT, "coordinator %s: cannot resolve the host: %s",
                           c->where, gai_strerror(error));
        if (pt_now_s() >= deadline) break;
        struct timespec pause = {0, 200 * 1000000L}; /* it may not listen yet */
        nanosleep(&pause, NULL);
    }
    return pt_fail(PIPERT_ERR_TIMEOUT, "no coordinator at %s after %.0f s: %s", c->where,
                   o->connect_timeout_s, resolved ? strerror(error) : gai_strerror(error));
}

/* The next message from the coordinator during registration (*m, to be freed), waiting up
 * to `deadline`. */
static pipert_result next_message(pt_coord_client *c, double deadline, json_t **m)
{
    pt_coord_buffer *in = &c->in;
    for (;;) {
        char *newline = pt_coord_find_newline(in);
        if (newline) {
            size_t length = (size_t)(newline - in->data);
            *m = json_loadb(in->data, length, 0, NULL);
            pt_coord_buffer_consume(in, length + 1);
            if (*m && pt_coord_get_string(*m, "type")) return PIPERT_OK;
            json_decref(*m);
            return pt_fail(PIPERT_ERR_PEER, "the coordinator at %s sent something that is not a "
                                            "message during registration",
                           c->where);
        }
        double left = deadline - pt_now_s();
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)(left * 1e3) + 1) == 0)
            return pt_fail(PIPERT_ERR_TIMEOUT, "the coordinator at %s did not answer rank %d's "
                                               "registration",
                           c->where, c->rank);
        char chunk[4096];
        ssize_t n = recv(c->fd, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return pt_fail(PIPERT_ERR_PEER, "the coordinator at %s closed the connection during "
                                            "registration",
                           c->where);
        if (!pt_coord_buffer_append(in, chunk, (size_t)n) || in->length > MAX_COORDINATOR_MESSAGE)
            return pt_fail(PIPERT_ERR_NOMEM, "registration: out of memory");
    }
}

/* A "refused" answer as an error (PIPERT_ERR_AUTH when it was for authentication,
 * PIPERT_ERR_CONFIG for another build or other settings than the job's). */
static pipert_result refused(pt_coord_client *c, json_t *m)
{
    const char *reason = pt_coord_get_string(m, "reason");
    bool auth = json_is_true(json_object_get(m, "auth"));
    bool settings = json_is_true(json_object_get(m, "settings"));
    c->refused_for_now = json_is_true(json_object_get(m, "retry"));
    return pt_fail(auth ? PIPERT_ERR_AUTH : settings ? PIPERT_ERR_CONFIG : PIPERT_ERR_PEER,
                   "the coordinator at %s refused rank %d: %s", c->where, c->rank,
                   reason ? reason : "no reason given");
}

/* The next message, which must be of type `expected` (or a refusal, returned as its error). */
static pipert_result expect_message(pt_coord_client *c, double deadline, const char *expected,
                                    json_t **m)
{
    const char *type;
    for (;;) { /* heartbeats say only that it is alive */
        PT_TRY(next_message(c, deadline, m));
        type = pt_coord_get_string(*m, "type");
        if (strcmp(type, "heartbeat")) break;
        json_decref(*m);
    }
    if (!strcmp(type, expected)) return PIPERT_OK;
    pipert_result rc = !strcmp(type, "refused")
                           ? refused(c, *m)
                           : pt_fail(PIPERT_ERR_PEER, "the coordinator at %s sent '%s' where '%s' "
                                                      "was expected",
                                     c->where, type, expected);
    json_decref(*m);
    *m = NULL;
    return rc;
}

/* Whether the challenge proves the coordinator knows the secret; its nonce into `theirs`. */
static bool coordinator_proved(json_t *challenge, const pt_auth_key *key,
                               const uint8_t ours[PT_AUTH_NONCE_BYTES],
                               uint8_t theirs[PT_AUTH_NONCE_BYTES])
{
    const char *nonce = pt_coord_get_string(challenge, "nonce");
    const char *proof_text = pt_coord_get_string(challenge, "proof");
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    return nonce && proof_text && pt_auth_from_hex(nonce, theirs, PT_AUTH_NONCE_BYTES) &&
           pt_auth_from_hex(proof_text, proof, PT_AUTH_PROOF_BYTES) &&
           pt_auth_verify(key, &PT_COORD_PROVER, ours, theirs, proof);
}

/* hello {nonce} → challenge {nonce, proof}: the coordinator proves itself first; then our
 * registration carries our proof, and "welcome" or "refused" answers it
 * (coordinator_protocol.h). The secret itself is never sent. */
pipert_result pt_coord_client_register(pt_coord_client *c, json_t *resume, double answer_s)
{
    uint8_t ours[PT_AUTH_NONCE_BYTES], theirs[PT_AUTH_NONCE_BYTES];
    char hex[PT_AUTH_HEX_CAPACITY];
    pipert_result rc = pt_auth_new_nonce(ours);
    pt_auth_to_hex(ours, sizeof ours, hex);
    if (rc == PIPERT_OK)
        rc = pt_coord_client_send_line(
            c, json_pack("{s:s, s:s}", "type", "hello", "nonce", hex), true);
    const double deadline = pt_now_s() + answer_s;
    json_t *m = NULL;
    if (rc == PIPERT_OK) rc = expect_message(c, deadline, "challenge", &m);
    if (rc != PIPERT_OK) {
        json_decref(resume);
        return rc;
    }
    bool proved = coordinator_proved(m, &c->key, ours, theirs);
    json_decref(m);
    if (!proved) {
        json_decref(resume);
        return pt_fail(PIPERT_ERR_AUTH, "the coordinator at %s did not prove that it knows the job's "
                                        "secret; rank %d does not register with it",
                       c->where, c->rank);
    }
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    pt_auth_prove(&c->key, &(pt_auth_party){PT_COORD_WORKER_ROLE, c->rank, -1}, theirs, ours,
                  proof);
    pt_auth_to_hex(proof, sizeof proof, hex);
    char host[PT_HOST_MAX] = "";
    gethostname(host, sizeof host - 1);
    json_t *registration = json_pack("{s:s, s:i, s:i, s:s, s:i, s:s, s:s, s:b, s:I}", "type",
                                     "register", "rank", c->rank, "world", c->world, "host", host,
                                     "pid", (int)getpid(), "address", c->address, "proof", hex,
                                     "join", c->join, "protocol",
                                     (json_int_t)(c->identity.protocol ? c->identity.protocol
                                                                       : PT_PROTOCOL_VERSION));
    if (registration && pt_job_identity_has_digest(&c->identity)) {
        char digest[PT_JOB_DIGEST_HEX];
        pt_job_digest_to_hex(&c->identity, digest);
        json_object_set_new(registration, "digest", json_string(digest));
    }
    if (registration && resume) json_object_set_new(registration, "resume", resume);
    else json_decref(resume);
    PT_TRY(pt_coord_client_send_line(c, registration, true));
    PT_TRY(expect_message(c, deadline, "welcome", &m));
    json_decref(m);
    pt_coord_seal_start(&c->seal, &c->key, ours, theirs);
    return PIPERT_OK;
}

void pt_coord_client_prepare_socket(pt_coord_client *c)
{
    pt_coord_set_no_delay(c->fd);
    /* A coordinator that stops reading must not block a worker forever. */
    struct timeval timeout = {.tv_sec = (time_t)ceil(c->dead_after_s)};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
}

/* Connects and registers. A joiner refused for now (its replica not out yet, as far as the
 * coordinator knows, or a coordinator started again still taking the job over) tries again
 * for twice the heartbeat timeout and a little: by then a process killed or silent has been
 * noticed, and a coordinator started again has taken the job over (coordinator.h). */
pipert_result pt_coord_client_connect_and_register(pt_coord_client *c,
                                                   const pt_coord_client_options *o)
{
    const double until = pt_now_s() + 2 * c->dead_after_s + 2;
    bool said = false;
    for (;;) {
        PT_TRY(connect_with_retry(c, o));
        pt_coord_client_prepare_socket(c);
        c->refused_for_now = false;
        pipert_result rc = pt_coord_client_register(c, NULL, fmax(c->connect_timeout_s, 10.0));
        if (rc == PIPERT_OK || !c->join || !c->refused_for_now || pt_now_s() > until) return rc;
        if (!said)
            pt_info("rank %d: %s; trying again for %.0f s", c->rank, pipert_last_error(),
                    until - pt_now_s());
        said = true;
        close(c->fd);
        c->fd = -1;
        c->in.length = 0;
        struct timespec pause = {0, 250 * 1000000L};
        nanosleep(&pause, NULL);
    }
}

