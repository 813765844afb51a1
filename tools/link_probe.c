#include "tools/link_probe.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/safetensors.h"
#include "session/job.h"

#define KIND_PROBE (PT_KIND_FIRST_FREE + 9)
#define PING_BYTES 8
#define PING_WARMUP 3
#define PING_ROUNDS 21
#define BULK_MESSAGE_BYTES (1 << 20)
#define BULK_SECONDS 2.0
#define BULK_MIN_MESSAGES 12
#define BULK_MAX_MESSAGES 1024
/* A link of unknown rate is first sized by this many messages: the receiver measures them
 * and tells the sender how many make the bulk phase last BULK_SECONDS (a fixed 256 MiB took
 * 41 s at 50 Mbit/s). */
#define SIZING_MESSAGES 6
#define TIMEOUT_S 300.0

/* Tags: one range per pair, one per phase; a direction's sizing and count follow its bulk. */
enum {
    TAG_PING,
    TAG_PONG,
    TAG_BULK_FORWARD,
    TAG_BULK_BACKWARD,
    TAG_SIZING_FORWARD,
    TAG_SIZING_BACKWARD,
    TAG_COUNT_FORWARD,
    TAG_COUNT_BACKWARD,
    TAGS_PER_PAIR
};
enum { SIZING = TAG_SIZING_FORWARD - TAG_BULK_FORWARD, COUNT = TAG_COUNT_FORWARD - TAG_BULK_FORWARD };

typedef struct probe {
    pt_job *job;
    double expected_bits_per_s; /* 0: unknown, each direction is sized first */
    unsigned char *buffer;      /* BULK_MESSAGE_BYTES */
    json_t *results;            /* what this rank measured */
} probe;

static pt_message_header header_of(size_t nbytes)
{
    pt_message_header h = {.kind = KIND_PROBE, .dtype = PT_DTYPE_U8, .ndim = 1};
    h.shape[0] = (int64_t)nbytes;
    h.nbytes = nbytes;
    return h;
}

static pt_recv_expect expect_bytes(void)
{
    pt_recv_expect e = {.kind = KIND_PROBE, .dtype = PT_DTYPE_U8, .ndim = -1};
    return e;
}

static pipert_result send_wait(probe *p, int to, uint32_t tag, size_t nbytes)
{
    pt_message_header h = header_of(nbytes);
    pt_request *request;
    PT_TRY(pt_send(p->job->transport, to, tag, &h, p->buffer, 0, &request));
    pipert_result rc = pt_request_wait(request, TIMEOUT_S);
    pt_request_free(request);
    return rc;
}

static pipert_result recv_wait(probe *p, int from, uint32_t tag)
{
    pt_recv_expect e = expect_bytes();
    pt_request *request;
    PT_TRY(pt_recv(p->job->transport, from, tag, &e, p->buffer, BULK_MESSAGE_BYTES, &request));
    pipert_result rc = pt_request_wait(request, TIMEOUT_S);
    pt_request_free(request);
    return rc;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Round trips from a (which measures) to b (which echoes). */
static pipert_result ping_pong(probe *p, int a, int b, uint32_t tags)
{
    double rtt[PING_ROUNDS];
    for (int round = 0; round < PING_WARMUP + PING_ROUNDS; round++) {
        if (p->job->rank == b) {
            PT_TRY(recv_wait(p, a, tags + TAG_PING));
            PT_TRY(send_wait(p, a, tags + TAG_PONG, PING_BYTES));
            continue;
        }
        double start = pt_now_s();
        PT_TRY(send_wait(p, b, tags + TAG_PING, PING_BYTES));
        PT_TRY(recv_wait(p, b, tags + TAG_PONG));
        if (round >= PING_WARMUP) rtt[round - PING_WARMUP] = pt_now_s() - start;
    }
    if (p->job->rank != a) return PIPERT_OK;
    qsort(rtt, PING_ROUNDS, sizeof rtt[0], compare_doubles);
    json_array_append_new(p->results, json_pack("{s:i, s:i, s:f}", "from", a, "to", b, "rtt_s",
                                                rtt[PING_ROUNDS / 2]));
    return PIPERT_OK;
}

/* Arrival times of the bulk messages, stamped as each receive completes. */
static void stamp_arrival(pt_request *request, pipert_result result, void *arg)
{
    (void)request;
    *(double *)arg = result == PIPERT_OK ? pt_now_s() : -1;
}

static pipert_result post_all(probe *p, int peer, uint32_t tag, bool sending, size_t n,
                              pt_request **requests, double *arrivals)
{
    pt_message_header h = header_of(BULK_MESSAGE_BYTES);
    pt_recv_expect e = expect_bytes();
    for (size_t k = 0; k < n; k++) {
        if (sending) {
            PT_TRY(pt_send(p->job->transport, peer, tag, &h, p->buffer, 0, &requests[k]));
        } else {
            PT_TRY(pt_recv(p->job->transport, peer, tag, &e, p->buffer, BULK_MESSAGE_BYTES,
                           &requests[k]));
            pt_request_on_complete(requests[k], stamp_arrival, &arrivals[k]);
        }
    }
    return PIPERT_OK;
}

static pipert_result wait_all(pt_request **requests, size_t n)
{
    pipert_result rc = PIPERT_OK;
    for (size_t k = 0; k < n; k++) {
        if (!requests[k]) continue;
        pipert_result one = pt_request_wait(requests[k], TIMEOUT_S);
        if (rc == PIPERT_OK) rc = one;
        pt_request_free(requests[k]);
    }
    return rc;
}

/* The rate between the end of the first quarter and the last arrival. */
static double steady_rate(const double *arrivals, size_t n)
{
    size_t first = n / 4;
    double seconds = arrivals[n - 1] - arrivals[first];
    return seconds > 0 ? (double)(n - 1 - first) * BULK_MESSAGE_BYTES * 8 / seconds : 0;
}

/* `n` messages from `from` to `to` on `tag`; *bits_per_s: the receiver's steady rate. */
static pipert_result stream(probe *p, int from, int to, uint32_t tag, size_t n, double *bits_per_s)
{
    const bool sending = p->job->rank == from;
    pt_request **requests = calloc(n, sizeof *requests);
    double *arrivals = calloc(n, sizeof *arrivals);
    pipert_result rc = requests && arrivals ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    if (rc == PIPERT_OK) rc = post_all(p, sending ? to : from, tag, sending, n, requests, arrivals);
    pipert_result waited = requests ? wait_all(requests, n) : PIPERT_OK;
    if (rc == PIPERT_OK) rc = waited;
    *bits_per_s = rc == PIPERT_OK && !sending ? steady_rate(arrivals, n) : 0;
    free(requests);
    free(arrivals);
    return rc;
}

static size_t bulk_messages_for(double bits_per_s)
{
    double n = bits_per_s / 8 * BULK_SECONDS / BULK_MESSAGE_BYTES;
    return n < BULK_MIN_MESSAGES ? BULK_MIN_MESSAGES : n > BULK_MAX_MESSAGES ? BULK_MAX_MESSAGES : (size_t)n;
}

/* How many bulk messages from `from` to `to`: from the expected rate, or (unknown) from the
 * rate of SIZING_MESSAGES that the receiver measures and sends back. */
static pipert_result bulk_messages(probe *p, int from, int to, uint32_t tag, size_t *n)
{
    if (p->expected_bits_per_s > 0) {
        *n = bulk_messages_for(p->expected_bits_per_s);
        return PIPERT_OK;
    }
    double rate;
    PT_TRY(stream(p, from, to, tag + SIZING, SIZING_MESSAGES, &rate));
    uint64_t count = bulk_messages_for(rate);
    if (p->job->rank == to) {
        memcpy(p->buffer, &count, sizeof count);
        PT_TRY(send_wait(p, from, tag + COUNT, sizeof count));
    } else {
        PT_TRY(recv_wait(p, to, tag + COUNT));
        memcpy(&count, p->buffer, sizeof count);
        if (count < BULK_MIN_MESSAGES || count > BULK_MAX_MESSAGES)
            return pt_fail(PIPERT_ERR_PEER, "link probe: rank %d asked for %llu bulk messages "
                                            "(%d..%d)", to, (unsigned long long)count,
                           BULK_MIN_MESSAGES, BULK_MAX_MESSAGES);
    }
    *n = (size_t)count;
    return PIPERT_OK;
}

static pipert_result bulk(probe *p, int from, int to, uint32_t tag)
{
    size_t n = 0;
    double rate;
    PT_TRY(bulk_messages(p, from, to, tag, &n));
    PT_TRY(stream(p, from, to, tag, n, &rate));
    if (p->job->rank == to)
        json_array_append_new(p->results, json_pack("{s:i, s:i, s:f}", "from", from, "to", to,
                                                    "bits_per_s", rate));
    return PIPERT_OK;
}

static pipert_result measure_pair(probe *p, int a, int b, uint32_t tags)
{
    PT_TRY(ping_pong(p, a, b, tags));
    PT_TRY(bulk(p, a, b, tags + TAG_BULK_FORWARD));
    return bulk(p, b, a, tags + TAG_BULK_BACKWARD);
}

static pipert_result measure_all(probe *p)
{
    const int n = p->job->world;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            if (p->job->rank == a || p->job->rank == b)
                PT_TRY(measure_pair(p, a, b, (uint32_t)((a * n + b) * TAGS_PER_PAIR)));
            PT_TRY(pt_barrier(p->job->replica_group));
        }
    return PIPERT_OK;
}

static pipert_result write_results(const probe *p, const char *out_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/probe-rank-%d.json", out_dir, p->job->rank);
    char *text = json_dumps(p->results, JSON_INDENT(2));
    if (!text) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    pipert_result rc = pt_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

pipert_result pt_link_probe_worker(const char *out_dir, double expected_bits_per_s)
{
    extern char **environ;
    pt_job job = {0};
    probe p = {.job = &job, .expected_bits_per_s = expected_bits_per_s,
               .buffer = calloc(1, BULK_MESSAGE_BYTES), .results = json_array()};
    pipert_result rc = p.buffer && p.results ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    if (rc == PIPERT_OK) rc = pt_job_join(&job, 1, -1, NULL, (const char *const *)environ, false);
    if (rc == PIPERT_OK && job.world < 2)
        rc = pt_fail(PIPERT_ERR_INVALID_ARG, "probing links needs a job of two sites or more");
    if (rc == PIPERT_OK) rc = measure_all(&p);
    if (rc == PIPERT_OK) rc = write_results(&p, out_dir);
    if (rc == PIPERT_OK) rc = pt_job_finish(&job);
    else if (job.world > 0) pt_job_report_failure(&job, pipert_last_error());
    pt_job_leave(&job);
    json_decref(p.results);
    free(p.buffer);
    return rc;
}

/* ---- merging ------------------------------------------------------------------- */

static pipert_result read_one(const char *path, int sites, pt_link_measure *links)
{
    json_error_t error;
    json_t *rows = json_load_file(path, 0, &error);
    if (!rows) return pt_fail(PIPERT_ERR_FORMAT, "%s:%d:%d: %s", path, error.line, error.column, error.text);
    size_t i;
    json_t *row;
    pipert_result rc = json_is_array(rows) ? PIPERT_OK : pt_fail(PIPERT_ERR_FORMAT, "%s: not a list", path);
    json_array_foreach(rows, i, row) {
        int from = -1, to = -1;
        double rtt = -1, rate = -1;
        if (json_unpack(row, "{s:i, s:i, s?:F, s?:F}", "from", &from, "to", &to, "rtt_s", &rtt,
                        "bits_per_s", &rate) != 0 ||
            from < 0 || to < 0 || from >= sites || to >= sites || from == to) {
            rc = pt_fail(PIPERT_ERR_FORMAT, "%s: entry %zu is not a link between two of %d sites",
                         path, i, sites);
            break;
        }
        if (rtt >= 0) links[from * sites + to].rtt_s = links[to * sites + from].rtt_s = rtt;
        if (rate >= 0) links[from * sites + to].bits_per_s = rate;
    }
    json_decref(rows);
    return rc;
}

pipert_result pt_link_probe_read(const char *out_dir, int sites, pt_link_measure *links)
{
    for (int i = 0; i < sites; i++)
        for (int j = 0; j < sites; j++)
            links[i * sites + j] = (pt_link_measure){.from = i, .to = j, .rtt_s = -1, .bits_per_s = -1};
    for (int r = 0; r < sites; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/probe-rank-%d.json", out_dir, r);
        PT_TRY(read_one(path, sites, links));
    }
    return PIPERT_OK;
}
