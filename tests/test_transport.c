/* The UCX transport between real processes on this host (loopback).
 *
 * Each test forks a small job with the harness of multiprocess.h: every child
 * creates its own transport, exchanges addresses, runs its part and _exits
 * with a status the test checks. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/safetensors.h"
#include "comm/transport.h"

#define JOB_SECRET "correct horse battery staple"
#define JOB_ID 4242u
#define JOB_DEADLINE_S 60.0
#define JOB_CONNECT_TIMEOUT_S 10.0
#define JOB_CONNECT_ALL_TIMEOUT_S 20.0
#include "multiprocess.h"
#include "tests/listening.h"

/* ---- helpers for the bodies ---------------------------------------------- */

static unsigned char pattern_byte(uint64_t seed, size_t i)
{
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (unsigned char)(x * 0x94D049BB133111EBull >> 56);
}

static void fill_pattern(void *buffer, size_t bytes, uint64_t seed)
{
    for (size_t i = 0; i < bytes; i++) ((unsigned char *)buffer)[i] = pattern_byte(seed, i);
}

/* Index of the first byte that differs from the pattern, or -1. */
static long pattern_mismatch(const void *buffer, size_t bytes, uint64_t seed)
{
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)buffer)[i] != pattern_byte(seed, i)) return (long)i;
    return -1;
}

static pt_message_header bytes_header(size_t nbytes, unsigned kind)
{
    pt_message_header h = {.kind = (uint16_t)kind,
                           .dtype = PT_DTYPE_U8,
                           .ndim = 1,
                           .shape = {(int64_t)nbytes},
                           .nbytes = nbytes};
    return h;
}

static pt_recv_expect any_shape(unsigned kind)
{
    pt_recv_expect e = {.kind = (uint16_t)kind, .dtype = -1, .ndim = -1};
    return e;
}

static pipert_result send_and_wait(pt_transport *t, int to, uint32_t tag,
                                   const pt_message_header *h, const void *payload, unsigned flags)
{
    pt_request *r;
    PT_TRY(pt_send(t, to, tag, h, payload, flags, &r));
    pipert_result rc = pt_request_wait(r, 20.0);
    pt_request_free(r);
    return rc;
}

/* ---- tests --------------------------------------------------------------- */

static const size_t message_sizes[] = {0, 1, 7, 4095, 4096, 4097, 65539, 4u << 20};
#define N_SIZES (sizeof message_sizes / sizeof message_sizes[0])

/* Both ranks send every size to each other at once and check what they get. */
static int exchange_sizes_body(rank_context *ctx)
{
    int other = 1 - ctx->rank;
    size_t largest = 4u << 20;
    unsigned char *out = malloc(N_SIZES * largest), *in = malloc(largest + 16);
    CHILD_CHECK(ctx, out && in, "no memory");
    pt_request *sends[N_SIZES];
    pt_message_header headers[N_SIZES];
    for (size_t k = 0; k < N_SIZES; k++) {
        unsigned char *payload = out + k * largest;
        fill_pattern(payload, message_sizes[k], 100 * (uint64_t)ctx->rank + k);
        headers[k] = bytes_header(message_sizes[k], PT_KIND_ACTIVATION);
        headers[k].step = 1000 + (int64_t)k;
        headers[k].microbatch = (int32_t)k;
        headers[k].weight_version = -3;
        headers[k].replica = 2;
        headers[k].stage = ctx->rank;
        CHILD_CHECK(ctx,
                    pt_send(ctx->t, other, (uint32_t)k, &headers[k], payload,
                            k % 2 ? PT_SEND_CHECKSUM : 0, &sends[k]) == PIPERT_OK,
                    "posting send %zu", k);
    }
    /* Receive in reverse order: tags keep them apart. */
    for (size_t j = N_SIZES; j-- > 0;) {
        size_t bytes = message_sizes[j];
        pt_recv_expect e = {
            .kind = PT_KIND_ACTIVATION, .dtype = PT_DTYPE_U8, .ndim = 1, .shape = {(int64_t)bytes}};
        memset(in, 0xEE, bytes + 16);
        pt_request *r;
        CHILD_CHECK(ctx, pt_recv(ctx->t, other, (uint32_t)j, &e, in, bytes, &r) == PIPERT_OK,
                    "posting recv %zu", j);
        pipert_result rc = pt_request_wait(r, 20.0);
        CHILD_CHECK(ctx, rc == PIPERT_OK, "receiving %zu bytes: %s", bytes, pipert_result_str(rc));
        const pt_message_header *h = pt_request_header(r);
        CHILD_CHECK(ctx,
                    h->nbytes == bytes && h->src_rank == other && h->step == 1000 + (int64_t)j &&
                        h->microbatch == (int32_t)j && h->weight_version == -3 && h->replica == 2 &&
                        h->stage == other && h->job == JOB_ID && h->ndim == 1 &&
                        h->shape[0] == (int64_t)bytes,
                    "header of the %zu-byte message: nbytes %llu src %d step %lld", bytes,
                    (unsigned long long)h->nbytes, h->src_rank, (long long)h->step);
        CHILD_CHECK(ctx, (h->checksum != 0) == (j % 2 && bytes > 0),
                    "checksum presence for size %zu", bytes);
        long bad = pattern_mismatch(in, bytes, 100 * (uint64_t)other + j);
        CHILD_CHECK(ctx, bad < 0, "%zu-byte message differs at byte %ld", bytes, bad);
        CHILD_CHECK(ctx, in[bytes] == 0xEE, "the %zu-byte message wrote past its end", bytes);
        pt_request_free(r);
    }
    for (size_t k = 0; k < N_SIZES; k++) {
        CHILD_CHECK(ctx, pt_request_wait(sends[k], 20.0) == PIPERT_OK, "send %zu", k);
        pt_request_free(sends[k]);
    }
    free(out);
    free(in);
    return 0;
}

Test(transport, tensors_of_every_size_both_ways)
{
    job_spec spec = {.n = 2, .body = exchange_sizes_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Same user tag, different kinds; same kind and tag, kept in order. */
static int tags_body(rank_context *ctx)
{
    enum { BIG = 100000 };
    static unsigned char a[BIG], b[BIG], c[16], got[BIG];
    if (ctx->rank == 1) {
        fill_pattern(a, BIG, 1);
        fill_pattern(b, BIG, 2);
        fill_pattern(c, 16, 3);
        pt_message_header big = bytes_header(BIG, PT_KIND_ACTIVATION),
                          small = bytes_header(16, PT_KIND_ACTIVATION_GRAD);
        pt_request *r[3];
        CHILD_CHECK(ctx, pt_send(ctx->t, 0, 5, &big, a, 0, &r[0]) == PIPERT_OK, "send a");
        CHILD_CHECK(ctx, pt_send(ctx->t, 0, 5, &big, b, 0, &r[1]) == PIPERT_OK, "send b");
        CHILD_CHECK(ctx, pt_send(ctx->t, 0, 5, &small, c, 0, &r[2]) == PIPERT_OK, "send c");
        for (int i = 0; i < 3; i++) {
            CHILD_CHECK(ctx, pt_request_wait(r[i], 20.0) == PIPERT_OK, "send %d", i);
            pt_request_free(r[i]);
        }
        return 0;
    }
    pt_request *r;
    pt_recv_expect grad = any_shape(PT_KIND_ACTIVATION_GRAD), act = any_shape(PT_KIND_ACTIVATION);
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 5, &grad, got, sizeof got, &r) == PIPERT_OK, "recv c");
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "recv c");
    CHILD_CHECK(ctx, pt_request_header(r)->nbytes == 16 && pattern_mismatch(got, 16, 3) < 0,
                "the gradient message (sent last) is what a gradient receive gets");
    pt_request_free(r);
    for (int seed = 1; seed <= 2; seed++) {
        CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 5, &act, got, sizeof got, &r) == PIPERT_OK, "recv %d",
                    seed);
        CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "recv %d", seed);
        long bad = pattern_mismatch(got, BIG, (uint64_t)seed);
        CHILD_CHECK(ctx, bad < 0,
                    "message %d of equal tags arrived out of order or damaged (byte %ld)", seed,
                    bad);
        pt_request_free(r);
    }
    return 0;
}

Test(transport, tags_separate_kinds_and_keep_order)
{
    job_spec spec = {.n = 2, .body = tags_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- refused messages ---------------------------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *field; /* must appear in the error */
    size_t nbytes;     /* payload sent */
    pt_recv_expect expect;
    size_t capacity;
} bad_case;

enum {
    BAD_WRONG_SHAPE,
    BAD_TOO_LARGE,
    BAD_TOO_LARGE_INLINE,
    BAD_CHECKSUM,
    BAD_CHECKSUM_INLINE,
    BAD_MAGIC,
    BAD_DTYPE,
    BAD_JOB,
    BAD_SRC_RANK,
    BAD_NBYTES_VS_SHAPE,
    BAD_NO_CHECKSUM,
    BAD_UNKNOWN_FLAGS,
    BAD_DEVICE_TO_HOST,
    N_BAD
};

static bad_case bad_cases[N_BAD] = {
    [BAD_WRONG_SHAPE] =
        {"wrong shape", "shape", 60 * 4, {PT_KIND_ACTIVATION, PT_DTYPE_F32, 2, {4, 16}}, 64 * 4},
    [BAD_TOO_LARGE] =
        {"too large", "nbytes", 2u << 20, {PT_KIND_ACTIVATION, -1, -1, {0}}, 1u << 20},
    [BAD_TOO_LARGE_INLINE] =
        {"too large inline", "nbytes", 100, {PT_KIND_ACTIVATION, -1, -1, {0}}, 64},
    [BAD_CHECKSUM] =
        {"corrupt checksum", "checksum", 65536, {PT_KIND_ACTIVATION, -1, -1, {0}}, 65536},
    [BAD_CHECKSUM_INLINE] =
        {"corrupt checksum inline", "checksum", 100, {PT_KIND_ACTIVATION, -1, -1, {0}}, 100},
    [BAD_MAGIC] = {"bad magic", "magic", 8192, {PT_KIND_ACTIVATION, -1, -1, {0}}, 8192},
    [BAD_DTYPE] = {"wrong dtype", "dtype", 256, {PT_KIND_ACTIVATION, PT_DTYPE_F32, -1, {0}}, 256},
    [BAD_JOB] = {"another job", "job", 64, {PT_KIND_ACTIVATION, -1, -1, {0}}, 64},
    [BAD_SRC_RANK] = {"lying source", "src_rank", 64, {PT_KIND_ACTIVATION, -1, -1, {0}}, 64},
    [BAD_NBYTES_VS_SHAPE] =
        {"nbytes against shape", "nbytes", 8000, {PT_KIND_ACTIVATION, -1, -1, {0}}, 1 << 16},
    [BAD_NO_CHECKSUM] =
        {"missing checksum", "checksum", 64, {PT_KIND_ACTIVATION, -1, -1, {0}, 1}, 64},
    [BAD_UNKNOWN_FLAGS] = {"unknown flags", "flags", 64, {PT_KIND_ACTIVATION, -1, -1, {0}}, 64},
    /* a device payload (its bytes sent as if they were the descriptor's place) to a receive
     * that takes bytes only: refused by the header, the payload drained */
    [BAD_DEVICE_TO_HOST] =
        {"device payload to a host receive", "flags", 65536, {PT_KIND_ACTIVATION, -1, -1, {0}},
         65536},
};

/* The header each case sends (rank 1 to rank 0). */
static pt_message_header bad_header(int which, const void *payload)
{
    const bad_case *b = &bad_cases[which];
    pt_message_header h = {.magic = PT_MESSAGE_MAGIC,
                           .version = PT_MESSAGE_VERSION,
                           .kind = PT_KIND_ACTIVATION,
                           .dtype = PT_DTYPE_U8,
                           .job = JOB_ID,
                           .src_rank = 1,
                           .ndim = 1,
                           .shape = {(int64_t)b->nbytes},
                           .nbytes = b->nbytes,
                           .checksum = pt_checksum64(payload, b->nbytes)};
    switch (which) {
    case BAD_WRONG_SHAPE:
        h.dtype = PT_DTYPE_F32, h.ndim = 2, h.shape[0] = 4, h.shape[1] = 15;
        break;
    case BAD_CHECKSUM:
    case BAD_CHECKSUM_INLINE:
        h.checksum ^= 1u << 17;
        break;
    case BAD_MAGIC:
        h.magic = 0xdeadbeefu;
        break;
    case BAD_DTYPE:
        h.dtype = PT_DTYPE_F16, h.shape[0] = (int64_t)b->nbytes / 2;
        break;
    case BAD_JOB:
        h.job = JOB_ID + 1;
        break;
    case BAD_SRC_RANK:
        h.src_rank = 5;
        break;
    case BAD_NBYTES_VS_SHAPE:
        h.shape[0] = 7999;
        break;
    case BAD_NO_CHECKSUM:
        h.checksum = 0;
        break;
    case BAD_UNKNOWN_FLAGS:
        h.flags = 0x80u;
        break;
    case BAD_DEVICE_TO_HOST:
        h.flags = PT_MESSAGE_DEVICE_PAYLOAD, h.checksum = 0;
        break;
    }
    return h;
}

static int bad_headers_body(rank_context *ctx)
{
    static unsigned char payload[2u << 20], good[4096], buffer[1u << 20];
    fill_pattern(payload, sizeof payload, 7);
    fill_pattern(good, sizeof good, 8);
    if (ctx->rank == 1) {
        /* Each bad message is followed, under the same tag, by a good one. */
        for (int which = 0; which < N_BAD; which++) {
            pt_message_header h = bad_header(which, payload);
            pt_request *r;
            CHILD_CHECK(ctx, pt_send_raw(ctx->t, 0, (uint32_t)which, &h, payload, &r) == PIPERT_OK,
                        "send bad");
            pt_message_header ok = bytes_header(sizeof good, PT_KIND_ACTIVATION);
            CHILD_CHECK(ctx,
                        send_and_wait(ctx->t, 0, (uint32_t)which, &ok, good, PT_SEND_CHECKSUM) ==
                            PIPERT_OK,
                        "good message after %s", bad_cases[which].name);
            /* A refused large message is drained by the receiver, so this send ends too. */
            CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "send of %s",
                        bad_cases[which].name);
            pt_request_free(r);
        }
        return 0;
    }
    for (int which = 0; which < N_BAD; which++) {
        const bad_case *b = &bad_cases[which];
        pt_request *r;
        CHILD_CHECK(ctx,
                    pt_recv(ctx->t, 1, (uint32_t)which, &b->expect, buffer, b->capacity, &r) ==
                        PIPERT_OK,
                    "recv");
        pipert_result rc = pt_request_wait(r, 20.0);
        const char *message = pipert_last_error();
        CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER, "%s: expected a peer error, got %s", b->name,
                    pipert_result_str(rc));
        CHILD_CHECK(ctx, strstr(message, "rank 1") && strstr(message, b->field),
                    "%s: the error \"%s\" should name rank 1 and the field %s", b->name, message,
                    b->field);
        pt_request_free(r);
        /* The connection is still good, and the refused payload did not leak into this receive. */
        pt_recv_expect e = {.kind = PT_KIND_ACTIVATION,
                            .dtype = PT_DTYPE_U8,
                            .ndim = 1,
                            .shape = {sizeof good},
                            .require_checksum = 1};
        CHILD_CHECK(ctx,
                    pt_recv(ctx->t, 1, (uint32_t)which, &e, buffer, sizeof good, &r) == PIPERT_OK,
                    "recv");
        CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "good message after %s", b->name);
        CHILD_CHECK(ctx, pattern_mismatch(buffer, sizeof good, 8) < 0,
                    "good message after %s damaged", b->name);
        pt_request_free(r);
    }
    return 0;
}

Test(transport, bad_headers_fail_with_peer_error_naming_rank_and_field)
{
    job_spec spec = {.n = 2, .body = bad_headers_body, .mesh = 1};
    RUN_JOB(spec);
}

/* An address is the worker's UCX address as hexadecimal text: no host, no port, nothing to bind. */
static int address_body(rank_context *ctx)
{
    const char *mine = pt_transport_address(ctx->t);
    size_t length = strlen(mine);
    CHILD_CHECK(ctx, length > 0 && length % 2 == 0 && length <= PT_TRANSPORT_ADDRESS_MAX,
                "an address of %zu characters", length);
    CHILD_CHECK(ctx, strspn(mine, "0123456789abcdef") == length, "not hexadecimal: \"%s\"", mine);
    CHILD_CHECK(ctx, strcmp(mine, ctx->addresses[1 - ctx->rank]) != 0, "two ranks, one address");
    return 0;
}

Test(transport, an_address_is_the_worker_address_in_hex)
{
    job_spec spec = {.n = 2, .body = address_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- authentication ------------------------------------------------------ */

static int secret_body(rank_context *ctx)
{
    if (ctx->rank == 0) {
        /* Rank 1 knocks with the wrong secret, rank 2 with the right one. */
        CHILD_CHECK(ctx, pt_transport_wait_peer(ctx->t, 2, 20.0) == PIPERT_OK, "rank 2 connects");
        CHILD_CHECK(ctx, pt_transport_wait_peer(ctx->t, 1, 2.0) == PIPERT_ERR_TIMEOUT,
                    "rank 1 must not get in");
        CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1 is not a peer");
        CHILD_CHECK(ctx, pt_transport_peer_alive(ctx->t, 2), "rank 2 is a peer");
        pt_message_header done = bytes_header(0, PT_KIND_ACTIVATION);
        CHILD_CHECK(ctx, send_and_wait(ctx->t, 2, 1, &done, NULL, 0) == PIPERT_OK,
                    "tell rank 2 we are done");
        return 0;
    }
    pipert_result rc = pt_transport_connect(ctx->t, 0, ctx->addresses[0]);
    if (ctx->rank == 1) {
        /* Rank 0's proof, under the other secret, is wrong here: refused at once. */
        CHILD_CHECK(ctx, rc == PIPERT_ERR_AUTH, "a wrong secret should be refused, got %s",
                    pipert_result_str(rc));
        CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 0), "rank 0 must not count as connected");
        pt_request *r;
        pt_message_header h = bytes_header(0, PT_KIND_ACTIVATION);
        CHILD_CHECK(ctx, pt_send(ctx->t, 0, 1, &h, NULL, 0, &r) == PIPERT_OK, "post");
        CHILD_CHECK(ctx, pt_request_wait(r, 5.0) == PIPERT_ERR_PEER,
                    "sending to a refused peer fails");
        pt_request_free(r);
    } else {
        CHILD_CHECK(ctx, rc == PIPERT_OK, "the right secret gets in");
        pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
        pt_request *r;
        CHILD_CHECK(ctx, pt_recv(ctx->t, 0, 1, &e, NULL, 0, &r) == PIPERT_OK, "post");
        CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "rank 0 is done");
        pt_request_free(r);
    }
    return 0;
}

/* An empty temporary file for a rank's stderr; its name in path[] ("/tmp/pipert-transport-log-XXXXXX"). */
static void make_log_file(char *path)
{
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
}

/* The first 64 KiB of a log file, as a string ("" when unreadable; never NULL). */
static char *read_log(const char *path)
{
    char *log = calloc(1, 1 << 16);
    cr_assert(log, "no memory");
    FILE *f = fopen(path, "r");
    if (f) {
        size_t size = fread(log, 1, (1 << 16) - 1, f);
        log[size] = '\0';
        fclose(f);
    }
    return log;
}

/* Runs `spec` with rank 0's stderr in a temporary file; asserts the job passed and returns
 * what rank 0 logged. */
static char *run_job_reading_log(job_spec *spec)
{
    char log_path[] = "/tmp/pipert-transport-log-XXXXXX";
    make_log_file(log_path);
    spec->stderr_path[0] = log_path;
    char why[512];
    int ok = run_job(spec, why, sizeof why);
    char *log = read_log(log_path);
    unlink(log_path);
    cr_assert(ok, "%s; rank 0 logged: %s", why, log);
    return log;
}

Test(transport, wrong_secret_is_refused_and_logged)
{
    job_spec spec = {.n = 3, .body = secret_body, .secret = {NULL, "not the secret", NULL}};
    char *log = run_job_reading_log(&spec);
    cr_assert(log[0], "rank 0 logged nothing");
    char claim[64];
    snprintf(claim, sizeof claim, "rank 1 (pid ");
    cr_expect(strstr(log, "refused") && strstr(log, claim) && strstr(log, "secret"),
              "rank 0's warning should say it refused rank 1 (pid P on HOST) for its secret; it "
              "logged: %s",
              log);
    free(log);
}

/* ---- another build or other settings --------------------------------------- */

/* Rank 1's settings differ from rank 0's in the dp method or codec, rank 2 is of another
 * protocol version: each is refused on both sides, naming the peer and what differs. */
static int mismatch_body(rank_context *ctx)
{
    if (ctx->rank == 0) {
        pipert_result rc = pt_transport_wait_peer(ctx->t, 1, 20.0);
        CHILD_CHECK(ctx, rc == PIPERT_ERR_CONFIG && strstr(pipert_last_error(), "rank 1") &&
                             strstr(pipert_last_error(), "settings differ in: dp method/codec"),
                    "rank 1 is refused for its dp settings, got %s", pipert_result_str(rc));
        rc = pt_transport_wait_peer(ctx->t, 2, 20.0);
        char theirs_vs_ours[64];
        snprintf(theirs_vs_ours, sizeof theirs_vs_ours, "protocol version %u vs %u",
                 PT_PROTOCOL_VERSION + 1, PT_PROTOCOL_VERSION);
        CHILD_CHECK(ctx, rc == PIPERT_ERR_CONFIG && strstr(pipert_last_error(), "rank 2") &&
                             strstr(pipert_last_error(), theirs_vs_ours),
                    "rank 2 is refused for its protocol, got %s", pipert_result_str(rc));
        CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1) && !pt_transport_peer_alive(ctx->t, 2),
                    "neither is a peer");
        return 0;
    }
    pipert_result rc = pt_transport_connect(ctx->t, 0, ctx->addresses[0]);
    char ours_vs_theirs[64];
    snprintf(ours_vs_theirs, sizeof ours_vs_theirs, "protocol version %u vs %u", PT_PROTOCOL_VERSION,
             PT_PROTOCOL_VERSION + 1);
    const char *expected = ctx->rank == 1 ? "settings differ in: dp method/codec" : ours_vs_theirs;
    CHILD_CHECK(ctx, rc == PIPERT_ERR_CONFIG && strstr(pipert_last_error(), "rank 0") &&
                         strstr(pipert_last_error(), expected),
                "rank 0 is refused (%s), got %s", expected, pipert_result_str(rc));
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 0), "rank 0 must not count as connected");
    return 0;
}

Test(transport, peers_of_other_builds_or_settings_are_refused_naming_them)
{
    job_spec spec = {.n = 3, .body = mismatch_body};
    const pt_job_identity ours = {.part = {1, 2, 3, 4, 5, 6}};
    spec.identity[0] = spec.identity[1] = spec.identity[2] = ours;
    spec.identity[1].part[PT_DIGEST_DP] = 99;
    spec.identity[2].protocol = PT_PROTOCOL_VERSION + 1;
    char *log = run_job_reading_log(&spec);
    cr_expect(strstr(log, "refused rank 1 (pid ") && strstr(log, "refused rank 2 (pid "),
              "rank 0 logs both refusals, naming the ranks: %s", log);
    free(log);
}

/* ---- strangers at UCX's listening sockets ------------------------------- */

/* UCX 1.13 aborts on its TCP greeting followed by a header announcing 4 GiB. Rank 0 lets a
 * stranger connect to each of UCX's listening sockets, stops listening, and only then does the
 * stranger send that; a new stranger finds the ports closed. Rank 0 must live on and talk. */
static int stop_listening_body(rank_context *ctx)
{
    pt_message_header h = bytes_header(0, PT_KIND_ACTIVATION);
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    if (ctx->rank == 1) { /* answers rank 0's message once it has sent it */
        CHILD_CHECK(ctx, pt_recv(ctx->t, 0, 1, &e, NULL, 0, &r) == PIPERT_OK, "post");
        CHILD_CHECK(ctx, pt_request_wait(r, 30.0) == PIPERT_OK, "rank 0's message");
        pt_request_free(r);
        return send_and_wait(ctx->t, 0, 2, &h, NULL, 0) != PIPERT_OK;
    }
    port ports[MAX_PORTS];
    int n = 0, silent[MAX_PORTS];
    listening_ports(getpid(), ports, &n);
    CHILD_CHECK(ctx, n >= 1, "UCX listens nowhere in this process");
    for (int i = 0; i < n; i++) {
        silent[i] = stranger_connect(&ports[i]);
        CHILD_CHECK(ctx, silent[i] >= 0, "a stranger cannot connect to port %d yet", ports[i].port);
    }
    usleep(200000); /* UCX's thread accepts them */
    CHILD_CHECK(ctx, pt_transport_stop_listening(ctx->t) == PIPERT_OK, "%s", pipert_last_error());
    unsigned char greeting[16];
    size_t length = ucx_greeting(greeting, 32, 0xffffffffu, 5);
    for (int i = 0; i < n; i++) {
        int late = stranger_connect(&ports[i]);
        CHILD_CHECK(ctx, late < 0, "a new stranger got into port %d", ports[i].port);
        CHILD_CHECK(ctx, send(silent[i], greeting, length, MSG_NOSIGNAL) == (ssize_t)length,
                    "the silent stranger's greeting");
    }
    usleep(500000); /* time for UCX to read it, were it delivered */
    for (int i = 0; i < n; i++) close(silent[i]);
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 1, 1, &h, NULL, 0) == PIPERT_OK, "send to rank 1");
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 2, &e, NULL, 0, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 30.0) == PIPERT_OK, "rank 1's answer");
    pt_request_free(r);
    return 0;
}

Test(transport, strangers_cannot_reach_ucx_once_it_stops_listening)
{
    job_spec spec = {.n = 2, .body = stop_listening_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- authenticated messages ------------------------------------------------ */

/* Every size, inline, apart from the header and by direct read, carries its MAC and arrives. */
Test(transport, authenticated_messages_of_every_size_arrive)
{
    job_spec spec = {.n = 2, .body = exchange_sizes_body, .mesh = 1, .authenticate_messages = 1};
    RUN_JOB(spec);
}

enum { AUTH_BYTES = 8192, TAG_GOOD = 1, TAG_REPLAY, TAG_ALTERED, TAG_UNSIGNED, TAG_AFTER };

/* Rank 1 sends a good message, then (raw, as a peer that misbehaves would) the same message
 * again, an altered one under a fresh sequence number, one without a MAC, and a good one. */
static int forger_body(rank_context *ctx)
{
    unsigned char *payload = malloc(AUTH_BYTES), *altered = malloc(AUTH_BYTES);
    CHILD_CHECK(ctx, payload && altered, "no memory");
    fill_pattern(payload, AUTH_BYTES, 7);
    pt_message_header h = bytes_header(AUTH_BYTES, PT_KIND_ACTIVATION);
    pt_request *good;
    CHILD_CHECK(ctx, pt_send(ctx->t, 0, TAG_GOOD, &h, payload, PT_SEND_CHECKSUM, &good) == PIPERT_OK,
                "send");
    CHILD_CHECK(ctx, pt_request_wait(good, 20.0) == PIPERT_OK, "the good message");
    pt_message_header wire = *pt_request_header(good);
    pt_request_free(good);
    CHILD_CHECK(ctx, wire.sequence != 0, "the message went without a sequence number");

    pt_message_header forged = wire;
    memcpy(altered, payload, AUTH_BYTES);
    altered[AUTH_BYTES / 2] ^= 1;
    forged.sequence = wire.sequence + 100; /* unused: only the MAC can refuse it */
    forged.checksum = pt_checksum64(altered, AUTH_BYTES);
    pt_message_header unsigned_header = wire;
    unsigned_header.sequence = 0;
    memset(unsigned_header.mac, 0, sizeof unsigned_header.mac);
    const struct {
        uint32_t tag;
        const pt_message_header *h;
        const void *payload;
    } raw[] = {{TAG_REPLAY, &wire, payload},
               {TAG_ALTERED, &forged, altered},
               {TAG_UNSIGNED, &unsigned_header, payload}};
    for (size_t k = 0; k < sizeof raw / sizeof raw[0]; k++) {
        pt_request *r;
        CHILD_CHECK(ctx, pt_send_raw(ctx->t, 0, raw[k].tag, raw[k].h, raw[k].payload, &r) == PIPERT_OK,
                    "raw send %zu", k);
        pt_request_wait(r, 20.0); /* refused at the other end; the send itself completes */
        pt_request_free(r);
    }
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 0, TAG_AFTER, &h, payload, PT_SEND_CHECKSUM) == PIPERT_OK,
                "a good message after the refused ones");
    free(payload);
    free(altered);
    return 0;
}

static int receive_authenticated(rank_context *ctx, uint32_t tag, pipert_result expected,
                                 const char *error_part, unsigned char *buffer)
{
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, tag, &e, buffer, AUTH_BYTES, &r) == PIPERT_OK, "post");
    pipert_result rc = pt_request_wait(r, 20.0);
    char error[512];
    snprintf(error, sizeof error, "%s", pt_request_error(r));
    pt_request_free(r);
    CHILD_CHECK(ctx, rc == expected, "tag %u: %s, expected %s (%s)", tag, pipert_result_str(rc),
                pipert_result_str(expected), error);
    CHILD_CHECK(ctx, !error_part || strstr(error, error_part), "tag %u: the error says: %s", tag,
                error);
    CHILD_CHECK(ctx, expected != PIPERT_OK || pattern_mismatch(buffer, AUTH_BYTES, 7) < 0,
                "tag %u: wrong bytes", tag);
    return 0;
}

static int authenticate_body(rank_context *ctx)
{
    if (ctx->rank == 1) return forger_body(ctx);
    unsigned char *buffer = malloc(AUTH_BYTES);
    CHILD_CHECK(ctx, buffer, "no memory");
    int failed = receive_authenticated(ctx, TAG_GOOD, PIPERT_OK, NULL, buffer) ||
                 receive_authenticated(ctx, TAG_REPLAY, PIPERT_ERR_PEER, "replayed", buffer) ||
                 receive_authenticated(ctx, TAG_ALTERED, PIPERT_ERR_PEER, "forged or altered",
                                       buffer) ||
                 receive_authenticated(ctx, TAG_UNSIGNED, PIPERT_ERR_PEER, "carries none", buffer) ||
                 receive_authenticated(ctx, TAG_AFTER, PIPERT_OK, NULL, buffer);
    free(buffer);
    return failed;
}

Test(transport, forged_altered_and_replayed_messages_are_refused)
{
    job_spec spec = {.n = 2, .body = authenticate_body, .mesh = 1, .authenticate_messages = 1};
    RUN_JOB(spec);
}

/* Control words (goodbyes, the direct-read offer) are sealed too: rank 1 sends, raw, a sealed
 * record of a word rank 0 does not know, then the same record again (a replay), a goodbye with
 * an altered MAC and one without a seal. Rank 0 must refuse the last three, log each, and still
 * count rank 1 as alive; a message after them arrives. */
enum { CONTROL_TEST_WORD = 0x54534554u, CONTROL_BYE_WORD = 0x45594221u, TAG_CONTROL_DONE = 9 };

static int control_forger_body(rank_context *ctx)
{
    pt_control_record sealed, forged, unsealed = {.word = CONTROL_BYE_WORD};
    CHILD_CHECK(ctx, pt_transport_seal_control(ctx->t, 0, CONTROL_TEST_WORD, &sealed) == PIPERT_OK,
                "seal: %s", pipert_last_error());
    CHILD_CHECK(ctx, sealed.sequence != 0, "the record went without a sequence number");
    CHILD_CHECK(ctx, pt_transport_seal_control(ctx->t, 0, CONTROL_BYE_WORD, &forged) == PIPERT_OK,
                "seal");
    forged.mac[3] ^= 0x40;
    const pt_control_record *raw[] = {&sealed, &sealed, &forged, &unsealed};
    for (size_t k = 0; k < sizeof raw / sizeof raw[0]; k++)
        CHILD_CHECK(ctx, pt_transport_send_control_raw(ctx->t, 0, raw[k]) == PIPERT_OK,
                    "raw control record %zu: %s", k, pipert_last_error());
    pt_message_header h = bytes_header(0, PT_KIND_ACTIVATION);
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 0, TAG_AFTER, &h, NULL, 0) == PIPERT_OK, "send");
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 0, TAG_CONTROL_DONE, &e, NULL, 0, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "rank 0 is done");
    pt_request_free(r);
    return 0;
}

static int control_records_body(rank_context *ctx)
{
    if (ctx->rank == 1) return control_forger_body(ctx);
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, TAG_AFTER, &e, NULL, 0, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "the message after: %s",
                pt_request_error(r));
    pt_request_free(r);
    usleep(500 * 1000); /* the stream's records, should they come after the message */
    CHILD_CHECK(ctx, pt_transport_peer_alive(ctx->t, 1), "a forged goodbye ended rank 1");
    pt_message_header h = bytes_header(0, PT_KIND_ACTIVATION);
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 1, TAG_CONTROL_DONE, &h, NULL, 0) == PIPERT_OK,
                "send to rank 1");
    return 0;
}

Test(transport, forged_and_replayed_control_words_are_refused)
{
    job_spec spec = {.n = 2, .body = control_records_body, .mesh = 1, .authenticate_messages = 1};
    char *log = run_job_reading_log(&spec);
    const char *expected[] = {"unknown control word 0x54534554", "replayed", "forged or altered",
                              "carries none"};
    for (size_t k = 0; k < sizeof expected / sizeof expected[0]; k++)
        cr_expect(strstr(log, expected[k]), "rank 0 should have logged \"%s\"; it logged: %s",
                  expected[k], log);
    free(log);
}

/* ---- failures ------------------------------------------------------------ */

static int connect_to_nobody_body(rank_context *ctx)
{
    /* The address of a transport that is gone: nothing answers there. */
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = 1;
    options.secret = JOB_SECRET;
    options.job = JOB_ID;
    pt_transport *gone;
    CHILD_CHECK(ctx, pt_transport_create(&options, &gone) == PIPERT_OK, "a second transport: %s",
                pipert_last_error());
    char *target = strdup(pt_transport_address(gone));
    pt_transport_destroy(gone);
    double start = pt_now_s();
    pipert_result rc = pt_transport_connect(ctx->t, 1, target);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_TRANSPORT || rc == PIPERT_ERR_TIMEOUT,
                "connecting to a transport that is gone: got %s", pipert_result_str(rc));
    CHILD_CHECK(ctx, strstr(pipert_last_error(), "rank 1") != NULL, "the error names rank 1: %s",
                pipert_last_error());
    CHILD_CHECK(ctx, pt_now_s() - start < 11.0, "gave up after %.1f s", pt_now_s() - start);
    CHILD_CHECK(ctx, pt_transport_connect(ctx->t, 1, "no-port-here") == PIPERT_ERR_INVALID_ARG,
                "bad address");
    CHILD_CHECK(ctx, pt_transport_connect(ctx->t, 1, "abc") == PIPERT_ERR_INVALID_ARG,
                "odd length");
    CHILD_CHECK(ctx, pt_transport_connect(ctx->t, 0, target) == PIPERT_ERR_INVALID_ARG,
                "connect to itself");
    free(target);
    return 0;
}

Test(transport, connecting_to_a_transport_that_is_gone_fails)
{
    job_spec spec = {.n = 1, .body = connect_to_nobody_body};
    RUN_JOB(spec);
}

static int killed_peer_body(rank_context *ctx)
{
    if (ctx->rank == 1) {
        pt_message_header h = bytes_header(0, PT_KIND_ACTIVATION);
        CHILD_CHECK(ctx, send_and_wait(ctx->t, 0, 1, &h, NULL, 0) == PIPERT_OK, "hello message");
        for (;;) pause(); /* until SIGKILL */
    }
    static float buffer[1024];
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 1, &e, buffer, sizeof buffer, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "first message");
    pt_request_free(r);
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 2, &e, buffer, sizeof buffer, &r) == PIPERT_OK, "post");
    request_kill(ctx, 1);
    pipert_result rc = pt_request_wait(r, 10.0);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER,
                "a receive from a killed peer should fail within 10 s, got %s",
                pipert_result_str(rc));
    CHILD_CHECK(ctx, strstr(pipert_last_error(), "rank 1") != NULL, "the error names rank 1: %s",
                pipert_last_error());
    pt_request_free(r);
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1 is dead");
    /* Later requests fail at once. */
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 3, &e, buffer, sizeof buffer, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 5.0) == PIPERT_ERR_PEER, "a later receive fails");
    pt_request_free(r);
    pt_message_header h = bytes_header(64, PT_KIND_ACTIVATION);
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 1, 3, &h, buffer, 0) == PIPERT_ERR_PEER,
                "a later send fails");
    CHILD_CHECK(ctx, strstr(pipert_last_error(), "rank 1") != NULL,
                "the send error names rank 1: %s", pipert_last_error());
    return 0;
}

Test(transport, killed_peer_fails_pending_and_later_requests)
{
    job_spec spec = {.n = 2, .body = killed_peer_body, .mesh = 1, .expect_killed = {0, 1}};
    RUN_JOB(spec);
}

static int leaving_peer_body(rank_context *ctx)
{
    static float buffer[16];
    if (ctx->rank == 1) {
        /* One last message, then the transport is destroyed at once. */
        for (int i = 0; i < 16; i++) buffer[i] = (float)i;
        pt_message_header h = {.kind = PT_KIND_ACTIVATION,
                               .dtype = PT_DTYPE_F32,
                               .ndim = 1,
                               .shape = {16},
                               .nbytes = sizeof buffer};
        return send_and_wait(ctx->t, 0, 5, &h, buffer, PT_SEND_CHECKSUM) != PIPERT_OK;
    }
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 1, &e, buffer, sizeof buffer, &r) == PIPERT_OK, "post");
    pipert_result rc = pt_request_wait(r, 10.0);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "rank 1 has left"),
                "a receive from a peer that shut down fails: %s", pipert_last_error());
    pt_request_free(r);
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1 is gone");
    /* What it sent before it left is still delivered. */
    memset(buffer, 0, sizeof buffer);
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 5, &e, buffer, sizeof buffer, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 10.0) == PIPERT_OK, "the last message of rank 1");
    pt_request_free(r);
    for (int i = 0; i < 16; i++) CHILD_CHECK(ctx, buffer[i] == (float)i, "element %d", i);
    return 0;
}

Test(transport, peer_that_shuts_down_is_marked_left)
{
    job_spec spec = {.n = 2, .body = leaving_peer_body, .mesh = 1};
    RUN_JOB(spec);
}

/* A peer whose connection still looks alive (a site cut off: UCX has not timed it out) is
 * dropped on the job's word and replaced by a new process of its rank; the old connection's
 * end, when it comes, does not touch the new one. Rank 1 plays both processes: it keeps its
 * first transport alive (it still answers UCX, as a cut-off process does until its link
 * times out), makes a second one of rank 1, and sends rank 0 that one's address over the
 * first. */
static int send_text(pt_transport *t, int to, uint32_t tag, const char *text)
{
    pt_message_header h = bytes_header(strlen(text) + 1, PT_KIND_FIRST_FREE);
    return send_and_wait(t, to, tag, &h, text, 0) == PIPERT_OK;
}

static int receive_text(pt_transport *t, int from, uint32_t tag, char *text, size_t capacity)
{
    pt_recv_expect e = any_shape(PT_KIND_FIRST_FREE);
    pt_request *r;
    if (pt_recv(t, from, tag, &e, text, capacity, &r) != PIPERT_OK) return 0;
    pipert_result rc = pt_request_wait(r, 20.0);
    pt_request_free(r);
    return rc == PIPERT_OK && memchr(text, 0, capacity) != NULL;
}

/* Rank 1's second process in the replacement tests: a transport of rank 1 again, its address
 * sent to rank 0 over the first one (tag 1). */
static int new_rank_1(rank_context *ctx, pt_transport **out)
{
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = 1;
    options.secret = JOB_SECRET;
    options.job = JOB_ID;
    options.connect_timeout_s = JOB_CONNECT_TIMEOUT_S;
    CHILD_CHECK(ctx, pt_transport_create(&options, out) == PIPERT_OK, "second transport");
    CHILD_CHECK(ctx, send_text(ctx->t, 0, 1, pt_transport_address(*out)), "the address");
    return 0;
}

/* The new rank 1's side once rank 0 dialled it: its greeting (tag 2), then "still here"
 * (tag 3) after `old_one_ends` ended the first process, and rank 0's answer (tag 4). */
static int new_rank_1_answers(rank_context *ctx, pt_transport *new_self,
                              void (*old_one_ends)(rank_context *ctx, void *arg), void *arg)
{
    static char text[ADDRESS_MAX];
    CHILD_CHECK(ctx, pt_transport_wait_peer(new_self, 0, 20.0) == PIPERT_OK, "rank 0 dials");
    CHILD_CHECK(ctx, receive_text(new_self, 0, 2, text, sizeof text), "hello from rank 0");
    CHILD_CHECK(ctx, strcmp(text, "to the new rank 1") == 0, "got \"%s\"", text);
    old_one_ends(ctx, arg);
    CHILD_CHECK(ctx, send_text(new_self, 0, 3, "still here"), "after the old one ended");
    CHILD_CHECK(ctx, receive_text(new_self, 0, 4, text, sizeof text), "rank 0's answer");
    pt_transport_destroy(new_self);
    return 0;
}

/* Rank 0's side: rank 1 dropped (nothing to do if it left) and forgotten, its new process at
 * `address` connected and greeted; it must still be there after the old one ended. */
static int rank_0_takes_the_new_rank_1(rank_context *ctx, const char *address)
{
    static char text[ADDRESS_MAX];
    CHILD_CHECK(ctx, pt_transport_drop_peer(ctx->t, 1, "replaced in this test") == PIPERT_OK,
                "drop");
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1 is dropped");
    CHILD_CHECK(ctx, pt_transport_forget_peer(ctx->t, 1) == PIPERT_OK, "forget");
    CHILD_CHECK(ctx, pt_transport_listen_again(ctx->t) == PIPERT_OK, "listen");
    CHILD_CHECK(ctx, pt_transport_connect(ctx->t, 1, address) == PIPERT_OK,
                "connect the new rank 1");
    CHILD_CHECK(ctx, send_text(ctx->t, 1, 2, "to the new rank 1"), "send to the new rank 1");
    CHILD_CHECK(ctx, receive_text(ctx->t, 1, 3, text, sizeof text), "after the old one ended");
    CHILD_CHECK(ctx, strcmp(text, "still here") == 0, "got \"%s\"", text);
    usleep(200000); /* time for a late error of the old connection to arrive */
    CHILD_CHECK(ctx, pt_transport_peer_alive(ctx->t, 1), "the new rank 1 is alive");
    CHILD_CHECK(ctx, send_text(ctx->t, 1, 4, "bye"), "the answer");
    return 0;
}

static void destroy_old_transport(rank_context *ctx, void *arg)
{
    (void)arg;
    pt_transport_destroy(ctx->t); /* its goodbye reaches rank 0 on the old connection */
    ctx->t = NULL;
    usleep(300000);
}

static int replaced_rank_body(rank_context *ctx)
{
    if (ctx->rank == 1) {
        pt_transport *new_self;
        if (new_rank_1(ctx, &new_self)) return 1;
        return new_rank_1_answers(ctx, new_self, destroy_old_transport, NULL);
    }
    static char address[ADDRESS_MAX];
    CHILD_CHECK(ctx, receive_text(ctx->t, 1, 1, address, sizeof address), "the new address");
    CHILD_CHECK(ctx, pt_transport_forget_peer(ctx->t, 1) != PIPERT_OK,
                "a rank that is alive cannot be forgotten");
    return rank_0_takes_the_new_rank_1(ctx, address);
}

Test(transport, a_silent_peer_is_dropped_and_replaced)
{
    job_spec spec = {.n = 2, .body = replaced_rank_body, .mesh = 1};
    RUN_JOB(spec);
}

static void kill_the_holder(rank_context *ctx, void *arg)
{
    (void)ctx;
    const pid_t holder = *(const pid_t *)arg;
    kill(holder, SIGKILL); /* now rank 0's old connection ends */
    waitpid(holder, NULL, 0);
    usleep(500000);
}

/* A rank that said goodbye and was replaced: its old connection ending later (here, when a
 * child that kept the old process's sockets open dies; in the churn bed, UCX's "Endpoint
 * timeout" once a site's link came back) must not fail the new process of the rank. */
static int replaced_after_goodbye_body(rank_context *ctx)
{
    if (ctx->rank == 1) {
        pt_transport *new_self;
        if (new_rank_1(ctx, &new_self)) return 1;
        /* The holder keeps the old transport's sockets open: the old endpoints close here
         * without rank 0 seeing the connection end, as when a link is down. */
        pid_t holder = fork();
        if (holder == 0) {
            pause();
            _exit(0);
        }
        CHILD_CHECK(ctx, holder > 0, "fork");
        pt_transport_destroy(ctx->t); /* the goodbye */
        ctx->t = NULL;
        return new_rank_1_answers(ctx, new_self, kill_the_holder, &holder);
    }
    static char address[ADDRESS_MAX];
    CHILD_CHECK(ctx, receive_text(ctx->t, 1, 1, address, sizeof address), "the new address");
    for (int i = 0; i < 200 && pt_transport_peer_alive(ctx->t, 1); i++) usleep(100000);
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1's goodbye came");
    return rank_0_takes_the_new_rank_1(ctx, address);
}

Test(transport, an_old_connection_ending_late_leaves_the_ranks_new_process_alone)
{
    job_spec spec = {.n = 2, .body = replaced_after_goodbye_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Destroying a transport with sends and receives still in flight: nothing
 * crashes, and every request ends (with an error) by the time destroy returns. */
static int destroy_in_flight_body(rank_context *ctx)
{
    int other = 1 - ctx->rank;
    size_t big = 4u << 20;
    unsigned char *out = calloc(1, big), *in = calloc(1, big);
    CHILD_CHECK(ctx, out && in, "no memory");
    pt_message_header large = bytes_header(big, PT_KIND_ACTIVATION),
                      small = bytes_header(16, PT_KIND_ACTIVATION);
    pt_recv_expect e = any_shape(PT_KIND_ACTIVATION);
    pt_request *r[4];
    /* Large and small sends nobody receives, receives nobody sends to. */
    CHILD_CHECK(ctx, pt_send(ctx->t, other, 1, &large, out, 0, &r[0]) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_send(ctx->t, other, 2, &small, out, 0, &r[1]) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_recv(ctx->t, other, 3, &e, in, big, &r[2]) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_recv(ctx->t, other, 4, &e, in, 16, &r[3]) == PIPERT_OK, "post");
    usleep(100000); /* let the rendezvous start */
    pt_transport_destroy(ctx->t);
    ctx->t = NULL;
    for (int i = 0; i < 4; i++) {
        pipert_result result;
        CHILD_CHECK(ctx, pt_request_test(r[i], &result), "request %d ended with the transport", i);
        /* Sends may have completed before (over TCP even the large one is
         * eager: transport.c); the receives cannot have. */
        CHILD_CHECK(ctx, i <= 1 || result != PIPERT_OK, "request %d cannot have succeeded", i);
        pt_request_free(r[i]);
    }
    free(out);
    free(in);
    return 0;
}

Test(transport, destroy_with_requests_in_flight)
{
    job_spec spec = {.n = 2, .body = destroy_in_flight_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- completion by callback, cancellation, timeouts ---------------------- */

typedef struct echo_state {
    pt_transport *t;
    float value[4];
    pt_message_header header;
    pt_request *echo;
    atomic_int called;
    pipert_result result;
} echo_state;

/* Runs on the progress thread: answers right from the callback. */
static void echo_back(pt_request *request, pipert_result result, void *arg)
{
    echo_state *s = arg;
    s->result = result;
    for (int i = 0; i < 4; i++) s->value[i] *= 2;
    s->header = (pt_message_header){.kind = PT_KIND_ACTIVATION,
                                    .dtype = PT_DTYPE_F32,
                                    .ndim = 1,
                                    .shape = {4},
                                    .nbytes = sizeof s->value};
    if (result == PIPERT_OK) pt_send(s->t, 1, 2, &s->header, s->value, 0, &s->echo);
    pt_request_free(request);
    atomic_store(&s->called, 1);
}

static int callback_body(rank_context *ctx)
{
    pt_recv_expect e = {.kind = PT_KIND_ACTIVATION, .dtype = PT_DTYPE_F32, .ndim = 1, .shape = {4}};
    if (ctx->rank == 1) {
        float value[4] = {1, 2, 3, 4}, back[4];
        pt_message_header h = {.kind = PT_KIND_ACTIVATION,
                               .dtype = PT_DTYPE_F32,
                               .ndim = 1,
                               .shape = {4},
                               .nbytes = sizeof value};
        CHILD_CHECK(ctx, send_and_wait(ctx->t, 0, 1, &h, value, 0) == PIPERT_OK, "send");
        pt_request *r;
        CHILD_CHECK(ctx, pt_recv(ctx->t, 0, 2, &e, back, sizeof back, &r) == PIPERT_OK, "post");
        CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "echo");
        pt_request_free(r);
        for (int i = 0; i < 4; i++)
            CHILD_CHECK(ctx, back[i] == 2 * value[i], "echo[%d] = %g", i, back[i]);
        pt_recv_expect done = any_shape(PT_KIND_ACTIVATION);
        CHILD_CHECK(ctx, pt_recv(ctx->t, 0, 3, &done, NULL, 0, &r) == PIPERT_OK, "post");
        CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "rank 0 is done");
        pt_request_free(r);
        return 0;
    }
    static echo_state s;
    s.t = ctx->t;
    pt_request *r;
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 1, &e, s.value, sizeof s.value, &r) == PIPERT_OK, "post");
    pt_request_on_complete(r, echo_back, &s);
    double give_up = pt_now_s() + 20.0;
    while (!atomic_load(&s.called) && pt_now_s() < give_up) usleep(1000);
    CHILD_CHECK(ctx, atomic_load(&s.called) && s.result == PIPERT_OK,
                "the callback ran with success");
    CHILD_CHECK(ctx, s.echo && pt_request_wait(s.echo, 20.0) == PIPERT_OK,
                "the echo posted from the callback");
    pt_request_free(s.echo);

    /* A receive nobody answers: wait times out, cancel ends it. */
    static float nothing[4];
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 99, &e, nothing, sizeof nothing, &r) == PIPERT_OK, "post");
    CHILD_CHECK(ctx, pt_request_wait(r, 0.05) == PIPERT_ERR_TIMEOUT, "wait times out");
    pipert_result result;
    CHILD_CHECK(ctx, !pt_request_test(r, &result), "still pending");
    pt_request_cancel(r);
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_ERR_INTERRUPTED, "cancelled");
    pt_request_free(r);
    /* Freeing a pending receive cancels it. */
    CHILD_CHECK(ctx, pt_recv(ctx->t, 1, 98, &e, nothing, sizeof nothing, &r) == PIPERT_OK, "post");
    pt_request_free(r);
    pt_message_header done = bytes_header(0, PT_KIND_ACTIVATION);
    CHILD_CHECK(ctx, send_and_wait(ctx->t, 1, 3, &done, NULL, 0) == PIPERT_OK,
                "tell rank 1 we are done");
    return 0;
}

Test(transport, callbacks_cancel_and_timeouts)
{
    job_spec spec = {.n = 2, .body = callback_body, .mesh = 1};
    RUN_JOB(spec);
}

/* The progress thread sleeps when there is nothing to do. */
static int idle_body(rank_context *ctx)
{
    struct timespec before, after;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
    usleep(500000);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
    double cpu_s =
        (double)(after.tv_sec - before.tv_sec) + 1e-9 * (double)(after.tv_nsec - before.tv_nsec);
    CHILD_CHECK(ctx, cpu_s < 0.05, "an idle connected transport used %.3f s of CPU in 0.5 s",
                cpu_s);
    return 0;
}

Test(transport, idle_progress_thread_does_not_spin)
{
    job_spec spec = {.n = 2, .body = idle_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- without processes --------------------------------------------------- */

Test(transport, options_are_checked_before_anything_starts)
{
    pt_transport *t = NULL;
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = 0;
    cr_expect_eq(pt_transport_create(&options, &t), PIPERT_ERR_INVALID_ARG, "no secret");
    cr_expect(strstr(pipert_last_error(), "secret"), "%s", pipert_last_error());
    options.secret = "s";
    options.rank = -1;
    cr_expect_eq(pt_transport_create(&options, &t), PIPERT_ERR_INVALID_ARG, "negative rank");
    cr_expect_null(t);
}

Test(transport, checksum_sees_every_bit)
{
    unsigned char data[1000];
    fill_pattern(data, sizeof data, 42);
    /* Every length (all tail paths) and every single-bit flip of a 100-byte prefix change the sum.
     */
    for (size_t length = 0; length < 80; length++) {
        uint64_t base = pt_checksum64(data, length);
        cr_assert_neq(base, 0u);
        cr_assert_neq(base, pt_checksum64(data, length + 1), "lengths %zu and %zu collide", length,
                      length + 1);
    }
    uint64_t base = pt_checksum64(data, 100);
    for (size_t bit = 0; bit < 800; bit++) {
        data[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        cr_assert_neq(pt_checksum64(data, 100), base, "flipping bit %zu went unnoticed", bit);
        data[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    cr_assert_eq(pt_checksum64(data, 100), base, "deterministic");
    /* Alignment does not matter. */
    unsigned char shifted[1001];
    memcpy(shifted + 1, data, 1000);
    cr_assert_eq(pt_checksum64(shifted + 1, 1000), pt_checksum64(data, 1000));
}

/* ---- a peer across a link that is down ----------------------------------- */

/* Two network namespaces joined by a veth pair: the dialler's ("near", 10.250.N.1) and the
 * peer's ("far", .2). Neither end is in the test's own namespace: UCX lists every device there
 * when a transport starts, so a veth that went away under the unit tests running beside this
 * one failed their ucp_worker_create ("No such device") or the connections they had made
 * over it. */
typedef struct dark_site {
    char near[32], far[32], here[16], there[16], address[24];
} dark_site;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char command[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(command, sizeof command, fmt, ap);
    va_end(ap);
    return system(command);
}

static bool dark_site_create(dark_site *d)
{
    const int id = (int)getpid();
    snprintf(d->near, sizeof d->near, "pt-dark-%d-n", id);
    snprintf(d->far, sizeof d->far, "pt-dark-%d-f", id);
    snprintf(d->here, sizeof d->here, "ptd%dh", id);
    snprintf(d->there, sizeof d->there, "ptd%dt", id);
    const int subnet = 1 + id % 250;
    snprintf(d->address, sizeof d->address, "10.250.%d.2", subnet);
    return sh("ip netns add %s && ip netns add %s && "
              "ip -n %s link add %s type veth peer name %s netns %s && "
              "ip -n %s addr add 10.250.%d.1/24 dev %s && ip -n %s link set %s up && "
              "ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up",
              d->near, d->far, d->near, d->here, d->there, d->far, d->near, subnet, d->here,
              d->near, d->here, d->far, d->address, d->there, d->far, d->there) == 0 &&
           /* a veth has its carrier a moment after both ends are up: UCX lists only devices
            * that are running */
           sh("for i in $(seq 100); do ip -n %s -br link show %s | grep -q ' UP ' && "
              "ip -n %s -br link show %s | grep -q ' UP ' && exit 0; sleep 0.05; done; exit 1",
              d->near, d->here, d->far, d->there) == 0;
}

static void dark_site_remove(const dark_site *d)
{
    sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", d->near, d->far);
}

/* This process into namespace `name`, with a /sys of the namespace's own, where UCX looks for
 * its devices (as `ip netns exec`); _exit(2) when it cannot. */
static void enter_namespace(const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "/var/run/netns/%s", name);
    const int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0)
        _exit(2);
    umount2("/sys", MNT_DETACH);
    if (mount("sysfs", "/sys", "sysfs", 0, NULL) != 0) _exit(2);
}

/* A child process (killed with the test) that runs `body(d, fd)`, fd the pipe's write end; the
 * read end to *read_fd. */
static pid_t start_in_child(const dark_site *d, void (*body)(const dark_site *, int),
                            int *read_fd)
{
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    const pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* not left behind by a test that timed out */
        close(pipe_fds[0]);
        body(d, pipe_fds[1]);
        _exit(0);
    }
    close(pipe_fds[1]);
    *read_fd = pipe_fds[0];
    return child;
}

static pipert_result create_rank(int rank, double connect_timeout_s, pt_transport **t)
{
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = rank;
    options.secret = JOB_SECRET;
    options.job = JOB_ID;
    if (connect_timeout_s > 0) options.connect_timeout_s = connect_timeout_s;
    return pt_transport_create(&options, t);
}

/* In the far namespace: a transport of rank 1 over TCP; its address to `fd`, then it waits. */
static void peer_in_dark_site(const dark_site *d, int fd)
{
    enter_namespace(d->far);
    pt_transport *t;
    if (create_rank(1, 0, &t) != PIPERT_OK) {
        fprintf(stderr, "the peer in %s: %s\n", d->far, pipert_last_error());
        _exit(3);
    }
    const char *address = pt_transport_address(t);
    if (write(fd, address, strlen(address) + 1) < 0) _exit(4);
    close(fd);
    pause();
    _exit(0);
}

/* What the dialler saw, through its pipe. */
typedef struct dial_outcome {
    char failed[256]; /* "": the dial was made */
    pipert_result rc;
    double took_s;
    char why[512];
} dial_outcome;

#define DIAL_TIMEOUT_S 3.0
static char dark_peer_address[ADDRESS_MAX];

/* In the near namespace: rank 0 dials the peer (its address in dark_peer_address); the outcome
 * to `fd`. A dial stuck in the progress thread leaves the transport undestroyed (that would
 * hold this up for minutes): the process exits. */
static void dial_from_near_site(const dark_site *d, int fd)
{
    enter_namespace(d->near);
    dial_outcome o = {.rc = PIPERT_OK};
    pt_transport *t = NULL;
    if (create_rank(0, DIAL_TIMEOUT_S, &t) != PIPERT_OK)
        snprintf(o.failed, sizeof o.failed, "rank 0: %s", pipert_last_error());
    const double started = pt_now_s();
    if (!o.failed[0]) o.rc = pt_transport_connect(t, 1, dark_peer_address);
    o.took_s = pt_now_s() - started;
    snprintf(o.why, sizeof o.why, "%s", pipert_last_error());
    if (write(fd, &o, sizeof o) != (ssize_t)sizeof o) _exit(4);
    _exit(0);
}

/* Reads exactly `size` bytes, or up to the first NUL when `text`; the count read. */
static size_t read_from(int fd, void *into, size_t size, bool text)
{
    size_t got = 0;
    ssize_t n;
    while (got < size && (n = read(fd, (char *)into + got, size - got)) > 0) {
        got += (size_t)n;
        if (text && memchr(into, 0, got)) break;
    }
    close(fd);
    return got;
}

/* Dialling a peer whose site went dark after it gave its address (the churn bed: a survivor
 * letting a joiner in as the joiner's link went down): the dial fails at the handshake's
 * deadline, and the progress thread runs on meanwhile. UCX 1.13's TCP connect() blocked it
 * for the kernel's SYN retries (UCX_TCP_CONN_NB=n), so the dial ended with "no answer from the
 * progress thread" and every other peer's traffic waited for a minute. */
Test(transport, dialling_a_peer_behind_a_link_that_is_down_leaves_the_progress_thread_running,
     .timeout = 60)
{
    if (geteuid() != 0) cr_skip_test("network namespaces need root");
    setenv("UCX_TLS", "tcp", 1);
    dark_site d;
    if (!dark_site_create(&d)) {
        dark_site_remove(&d); /* what part of it was made */
        cr_assert_fail("could not create the namespaces %s and %s", d.near, d.far);
    }
    int from_peer;
    const pid_t peer = start_in_child(&d, peer_in_dark_site, &from_peer);
    const size_t got = read_from(from_peer, dark_peer_address, sizeof dark_peer_address - 1, true);
    const char *failed = NULL;
    if (got == 0 || !memchr(dark_peer_address, 0, got)) failed = "the peer in it gave no address";
    /* the peer's site goes dark: packets to it vanish, no error comes back (its neighbour
     * entry stays, as across a router: no ARP failure ends the wait) */
    if (!failed && sh("ip -n %s neigh replace %s lladdr $(ip -n %s -br link show %s | "
                      "awk '{print $3}') dev %s nud permanent && ip -n %s link set %s down",
                      d.near, d.address, d.far, d.there, d.here, d.far, d.there) != 0)
        failed = "link down";
    dial_outcome o = {.rc = PIPERT_OK};
    pid_t dialler = 0;
    if (!failed) {
        int from_dialler;
        dialler = start_in_child(&d, dial_from_near_site, &from_dialler);
        if (read_from(from_dialler, &o, sizeof o, false) != sizeof o)
            failed = "the dialler ended without a word";
        else if (o.failed[0]) failed = o.failed;
    }
    int status = 0;
    if (dialler > 0) {
        kill(dialler, SIGKILL);
        waitpid(dialler, NULL, 0);
    }
    kill(peer, SIGKILL);
    waitpid(peer, &status, 0);
    dark_site_remove(&d);
    cr_assert(!failed, "setting the dark site up: %s (the peer's status 0x%x)", failed, status);
    cr_expect_neq(o.rc, PIPERT_OK, "a peer in a dark site answered");
    cr_expect(!strstr(o.why, "no answer from the progress thread"), "%s", o.why);
    cr_expect_lt(o.took_s, DIAL_TIMEOUT_S + 2.0, "the dial took %.1f s: %s", o.took_s, o.why);
}
