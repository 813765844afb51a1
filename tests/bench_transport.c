/* Transport speed between two processes on this host: bandwidth of 4 MiB
 * messages and latency (half a round trip) of 8-byte messages, as medians
 * over several runs. UCX_TLS from the environment picks the transports.
 *
 *     build/tests/bench_transport [--runs N] [--messages M] [--pings K] [--window W]
 *                                 [--recv-buffers B] [--checksum] [--authenticate]
 *
 * --authenticate: every message carries a MAC (runtime.authenticate_messages).
 *
 * Bandwidth: rank 0 keeps W sends of the same 4 MiB buffer in flight, rank 1
 * W receives, into B buffers in turn (B = 1, as ucx_perftest does, keeps the
 * destination in cache: with 4 distinct buffers the copy itself is slower on
 * small-cache machines). scripts/bench-transport.sh compares with ucx_perftest.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/safetensors.h"
#include "runtime/stats.h"
#include "comm/transport.h"

#define ADDRESS_MAX 4096 /* a worker address as text; written to a pipe in one piece */
#define LARGE_BYTES (4u << 20)
#define MAX_WINDOW 64

typedef struct bench_options {
    int runs, messages, pings;
    int window;       /* large messages in flight */
    int recv_buffers; /* distinct 4 MiB receive buffers, used in turn */
    unsigned send_flags;
    int authenticate; /* pt_transport_options.authenticate_messages */
} bench_options;

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        pipert_result rc_ = (expr);                                                                \
        if (rc_ != PIPERT_OK) {                                                                    \
            fprintf(stderr, "bench_transport: %s: %s\n", #expr, pipert_last_error());              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static pt_message_header bytes_header(size_t nbytes)
{
    pt_message_header h = {.kind = PT_KIND_ACTIVATION,
                           .dtype = PT_DTYPE_U8,
                           .ndim = 1,
                           .shape = {(int64_t)nbytes},
                           .nbytes = nbytes};
    return h;
}

static pipert_result wait_free(pt_request **r)
{
    if (!*r) return PIPERT_OK;
    pipert_result rc = pt_request_wait(*r, 60.0);
    pt_request_free(*r);
    *r = NULL;
    return rc;
}

static pipert_result send_wait(pt_transport *t, int to, uint32_t tag, const void *data,
                               size_t bytes, unsigned flags)
{
    pt_message_header h = bytes_header(bytes);
    pt_request *r;
    PT_TRY(pt_send(t, to, tag, &h, data, flags, &r));
    return wait_free(&r);
}

static pipert_result recv_wait(pt_transport *t, int from, uint32_t tag, void *data, size_t capacity)
{
    pt_recv_expect e = {.kind = PT_KIND_ACTIVATION, .dtype = -1, .ndim = -1};
    pt_request *r;
    PT_TRY(pt_recv(t, from, tag, &e, data, capacity, &r));
    return wait_free(&r);
}

/* Rank 0 streams `messages` large messages to rank 1, which acknowledges the last. Seconds, on rank
 * 0. */
static int bandwidth_run(pt_transport *t, const bench_options *o, unsigned char *buffers,
                         double *seconds)
{
    int rank = pt_transport_rank(t), other = 1 - rank;
    pt_request *window[MAX_WINDOW] = {NULL};
    char token[8] = {0};
    /* Both sides ready before the clock starts. */
    if (rank == 0)
        CHECK(recv_wait(t, other, 1, token, sizeof token));
    else
        CHECK(send_wait(t, other, 1, token, sizeof token, 0));
    double start = pt_now_s();
    pt_message_header h = bytes_header(LARGE_BYTES);
    pt_recv_expect e = {.kind = PT_KIND_ACTIVATION, .dtype = -1, .ndim = -1};
    for (int i = 0; i < o->messages; i++) {
        pt_request **slot = &window[i % o->window];
        CHECK(wait_free(slot));
        if (rank == 0)
            CHECK(pt_send(t, other, 2, &h, buffers, o->send_flags, slot));
        else
            CHECK(pt_recv(t, other, 2, &e, buffers + (size_t)(i % o->recv_buffers) * LARGE_BYTES,
                          LARGE_BYTES, slot));
    }
    for (int i = 0; i < o->window; i++) CHECK(wait_free(&window[i]));
    if (rank == 0)
        CHECK(recv_wait(t, other, 3, token, sizeof token));
    else
        CHECK(send_wait(t, other, 3, token, sizeof token, 0));
    *seconds = pt_now_s() - start;
    return 0;
}

/* `pings` round trips of 8 bytes; returns half the mean round trip in seconds. */
static int latency_run(pt_transport *t, const bench_options *o, double *half_round_trip)
{
    int rank = pt_transport_rank(t), other = 1 - rank;
    double value = 0;
    double start = pt_now_s();
    for (int i = 0; i < o->pings; i++) {
        if (rank == 0) {
            CHECK(send_wait(t, other, 4, &value, sizeof value, o->send_flags));
            CHECK(recv_wait(t, other, 5, &value, sizeof value));
        } else {
            CHECK(recv_wait(t, other, 4, &value, sizeof value));
            value += 1;
            CHECK(send_wait(t, other, 5, &value, sizeof value, o->send_flags));
        }
    }
    *half_round_trip = (pt_now_s() - start) / (2.0 * o->pings);
    return 0;
}

static int run_rank(int rank, int to_peer, int from_peer, const bench_options *o)
{
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = rank;
    options.secret = "bench_transport";
    options.authenticate_messages = o->authenticate;
    pt_transport *t;
    CHECK(pt_transport_create(&options, &t));
    char mine[ADDRESS_MAX] = {0}, theirs[ADDRESS_MAX] = {0};
    snprintf(mine, sizeof mine, "%s", pt_transport_address(t));
    if (write(to_peer, mine, sizeof mine) != (ssize_t)sizeof mine ||
        read(from_peer, theirs, sizeof theirs) != (ssize_t)sizeof theirs) {
        fprintf(stderr, "bench_transport: address exchange: %s\n", strerror(errno));
        return 1;
    }
    if (rank == 1)
        CHECK(pt_transport_connect(t, 0, theirs));
    else
        CHECK(pt_transport_wait_peer(t, 1, 30.0));
    unsigned char *buffers = calloc((size_t)o->recv_buffers, LARGE_BYTES);
    double *bandwidth = calloc((size_t)o->runs, sizeof *bandwidth),
           *latency = calloc((size_t)o->runs, sizeof *latency);
    if (!buffers || !bandwidth || !latency) return 1;
    double seconds, half;
    if (bandwidth_run(t, o, buffers, &seconds) || latency_run(t, o, &half)) return 1; /* warm-up */
    for (int run = 0; run < o->runs; run++) {
        if (bandwidth_run(t, o, buffers, &seconds)) return 1;
        bandwidth[run] = (double)o->messages * LARGE_BYTES / seconds / 1e9;
        if (latency_run(t, o, &half)) return 1;
        latency[run] = half * 1e6;
    }
    if (rank == 0) {
        const char *tls = getenv("UCX_TLS");
        double low_bw = bandwidth[0], high_bw = bandwidth[0];
        for (int run = 1; run < o->runs; run++) {
            if (bandwidth[run] < low_bw) low_bw = bandwidth[run];
            if (bandwidth[run] > high_bw) high_bw = bandwidth[run];
        }
        double low_lat = latency[0], high_lat = latency[0];
        for (int run = 1; run < o->runs; run++) {
            if (latency[run] < low_lat) low_lat = latency[run];
            if (latency[run] > high_lat) high_lat = latency[run];
        }
        printf("transport between 2 processes on this host (UCX_TLS=%s%s%s), medians of %d runs:\n",
               tls ? tls : "(default)", o->send_flags ? ", checksums on" : "",
               o->authenticate ? ", messages authenticated" : "", o->runs);
        printf("  bandwidth, %d x 4 MiB messages, %d in flight, %d receive buffer%s:  %7.2f GB/s  "
               "(min %.2f, max %.2f)\n",
               o->messages, o->window, o->recv_buffers, o->recv_buffers == 1 ? "" : "s",
               pt_median(bandwidth, (size_t)(o->runs)), low_bw, high_bw);
        printf(
            "  latency, 8-byte ping-pong x %d:  %7.2f us half round trip  (min %.2f, max %.2f)\n",
            o->pings, pt_median(latency, (size_t)(o->runs)), low_lat, high_lat);
    }
    free(buffers);
    free(bandwidth);
    free(latency);
    pt_transport_destroy(t);
    return 0;
}

int main(int argc, char **argv)
{
    bench_options o = {.runs = 5, .messages = 100, .pings = 2000, .window = 4, .recv_buffers = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            o.runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc)
            o.messages = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pings") && i + 1 < argc)
            o.pings = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc)
            o.window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recv-buffers") && i + 1 < argc)
            o.recv_buffers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--checksum"))
            o.send_flags = PT_SEND_CHECKSUM;
        else if (!strcmp(argv[i], "--authenticate"))
            o.authenticate = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--runs N] [--messages M] [--pings K] [--window W] "
                    "[--recv-buffers B] [--checksum] [--authenticate]\n",
                    argv[0]);
            return 2;
        }
    }
    if (o.runs < 1 || o.messages < 1 || o.pings < 1 || o.recv_buffers < 1 || o.window < 1 ||
        o.window > MAX_WINDOW) {
        fprintf(stderr, "bench_transport: --runs, --messages, --pings and --recv-buffers must be "
                        "positive, --window 1..%d\n",
                MAX_WINDOW);
        return 2;
    }
    /* Fork first: nothing of UCX exists yet in either process. */
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return perror("pipe"), 1;
    pid_t child = fork();
    if (child < 0) return perror("fork"), 1;
    if (child == 0) _exit(run_rank(1, up[1], down[0], &o));
    int status = run_rank(0, down[1], up[0], &o);
    if (status != 0) kill(child, SIGKILL);
    int child_status;
    waitpid(child, &child_status, 0);
    if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) status = 1;
    return status;
}
