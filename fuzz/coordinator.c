/* libFuzzer harness: what the coordinator (comm/coordinator_server.c)
 * does with a worker's bytes. A real pt_coordinator serves one end of a
 * socketpair; the input is written to the other end. Its first byte sets the
 * job's size, whether the harness first registers a rank with a correct
 * handshake (so the input reaches what registered ranks may say: each input
 * line is then sealed as a worker seals it, unless bit 6 asks for the raw
 * bytes, which the seal must drop), and whether the worker hangs up at the
 * end. The coordinator must survive all of it and end in a consistent state. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz/fuzz.h"
#include "comm/coordinator.h"
#include "comm/coordinator_protocol.h"
#include "runtime/job_digest.h"

#define SECRET "fuzzing-secret-0123456789"

/* False once the coordinator has closed its end (it may, after what it was sent). */
static bool send_some(int fd, const void *data, size_t size)
{
    for (size_t sent = 0; sent < size;) {
        ssize_t n = send(fd, (const char *)data + sent, size - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EPIPE) return false;
        FUZZ_CHECK(n > 0);
        sent += (size_t)n;
    }
    return true;
}

static void send_all(int fd, const void *data, size_t size) { FUZZ_CHECK(send_some(fd, data, size)); }

/* The coordinator's next line to us (after it served what we sent), parsed. */
static json_t *answer(pt_coordinator *c, int fd)
{
    FUZZ_CHECK(pt_coordinator_poll(c, 0) == PIPERT_OK);
    char line[4096];
    ssize_t n = recv(fd, line, sizeof line - 1, MSG_DONTWAIT);
    FUZZ_CHECK(n > 0);
    line[n] = '\0';
    return json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
}

/* hello → challenge → register, as a worker with the job's secret does. */
static void register_rank(pt_coordinator *c, int fd, int rank, int world, pt_coord_seal *seal)
{
    uint8_t ours[PT_AUTH_NONCE_BYTES] = {1, 2, 3}, theirs[PT_AUTH_NONCE_BYTES];
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    char hex[PT_AUTH_HEX_CAPACITY], line[512];
    pt_auth_to_hex(ours, sizeof ours, hex);
    snprintf(line, sizeof line, "{\"type\": \"hello\", \"nonce\": \"%s\"}\n", hex);
    send_all(fd, line, strlen(line));
    json_t *challenge = answer(c, fd);
    const char *nonce = json_string_value(json_object_get(challenge, "nonce"));
    FUZZ_CHECK(nonce && pt_auth_from_hex(nonce, theirs, sizeof theirs));
    json_decref(challenge);
    pt_auth_key key;
    FUZZ_CHECK(pt_auth_derive_key(SECRET, PT_AUTH_USE_COORDINATOR, &key) == PIPERT_OK);
    pt_auth_prove(&key, &(pt_auth_party){PT_COORD_WORKER_ROLE, rank, -1}, theirs, ours, proof);
    pt_auth_to_hex(proof, sizeof proof, hex);
    snprintf(line, sizeof line, "{\"type\": \"register\", \"rank\": %d, \"world\": %d, \"pid\": 1, "
             "\"host\": \"fuzz\", \"address\": \"00\", \"proof\": \"%s\", \"protocol\": %u, "
             "\"digest\": \"%0*d\"}\n", rank, world, hex, PT_PROTOCOL_VERSION, PT_JOB_DIGEST_HEX - 1, 1);
    send_all(fd, line, strlen(line));
    json_t *welcome = answer(c, fd);
    FUZZ_CHECK(!strcmp(json_string_value(json_object_get(welcome, "type")), "welcome"));
    json_decref(welcome);
    pt_coord_seal_start(seal, &key, ours, theirs);
}

/* Reads whatever the coordinator sent us, so that its output never blocks. */
static void drain(int fd)
{
    char buffer[65536];
    while (recv(fd, buffer, sizeof buffer, MSG_DONTWAIT) > 0) {}
}

/* Each line of the input that is a JSON object goes sealed (the seal adds its "seq"); the
 * others, and a last line without its newline, go as they are. Sealed lines are longer than
 * the input, so the coordinator reads (and we drain its answers) after each one: the
 * socketpair's buffers never fill up. */
static void send_sealed(pt_coordinator *c, int fd, pt_coord_seal *seal, const uint8_t *data,
                        size_t size)
{
    while (size > 0) {
        const uint8_t *newline = memchr(data, '\n', size);
        const size_t length = newline ? (size_t)(newline - data) : size;
        json_t *m = newline ? json_loadb((const char *)data, length, 0, NULL) : NULL;
        size_t sealed_length;
        const bool object = json_is_object(m);
        char *sealed = object ? pt_coord_seal_message(seal, m, &sealed_length) : NULL; /* takes m */
        if (!object) json_decref(m);
        const bool open = sealed ? send_some(fd, sealed, sealed_length)
                                 : send_some(fd, data, length + (newline ? 1 : 0));
        free(sealed);
        if (!open) return;
        FUZZ_CHECK(pt_coordinator_poll(c, 0) == PIPERT_OK);
        drain(fd);
        data += length + (newline ? 1 : 0);
        size -= length + (newline ? 1 : 0);
    }
}

static void check_status(pt_coordinator *c, int world)
{
    pt_job_status status;
    pt_coordinator_status(c, &status);
    FUZZ_CHECK(status.world == world && status.registered >= 0 && status.registered <= world);
    FUZZ_CHECK(status.done >= 0 && status.done <= status.registered);
    char line[512];
    pt_job_progress_line(&status, line, sizeof line);
    char reason[512];
    for (int r = 0; r < world; r++) (void)pt_coordinator_rank_failure(c, r, reason, sizeof reason);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (size < 1) return 0;
    pt_coordinator_options options = PT_COORDINATOR_OPTIONS_INIT;
    options.bind_host = "127.0.0.1";
    options.world = 1 + (data[0] & 3);
    options.secret = SECRET;
    pt_coordinator *c;
    int fds[2];
    FUZZ_CHECK(pt_coordinator_create(&c, &options) == PIPERT_OK);
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    FUZZ_CHECK(pt_coordinator_adopt(c, fds[0]) == PIPERT_OK);
    pt_coord_seal seal = {0};
    if (data[0] & 4) register_rank(c, fds[1], (data[0] >> 3) % options.world, options.world, &seal);
    if (seal.on && !(data[0] & 0x40)) send_sealed(c, fds[1], &seal, data + 1, size - 1);
    else send_all(fds[1], data + 1, size - 1);
    for (int i = 0; i < 3; i++) {
        FUZZ_CHECK(pt_coordinator_poll(c, 0) == PIPERT_OK);
        drain(fds[1]);
    }
    if (data[0] & 0x80) {
        close(fds[1]);
        fds[1] = -1;
        FUZZ_CHECK(pt_coordinator_poll(c, 0) == PIPERT_OK);
    }
    check_status(c, options.world);
    pt_coordinator_free(c);
    if (fds[1] >= 0) close(fds[1]);
    return 0;
}
