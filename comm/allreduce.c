/* The ring all-reduce, pipelined by segments and driven by request callbacks.
 *
 * The buffer is cut into n chunks, one per member, and the ring takes
 * 2(n−1) steps: in reduce-scatter step t (t < n−1) member i sends chunk i−t
 * to i+1 and adds chunk i−t−1 from i−1 into its own; then chunk i+1 is
 * complete at i, and in all-gather step s = t−(n−1) it sends chunk i+1−s and
 * receives chunk i−s, complete. Each chunk is further cut into S segments,
 * and the steps run per segment: segment j of step t needs only segment j of
 * step t−1, so it moves on as soon as that arrived instead of waiting for
 * the whole step. Over a slow link this keeps the link busy across the step
 * boundary, where a step-at-a-time ring lets it idle for a round trip and
 * the last segment's reduction (~10% of a 100 Mbit/s all-reduce of 11 MB).
 *
 * Order. All messages of one all-reduce carry its tag, and messages with
 * equal tags from one peer match receives in the order they were sent. So
 * every member posts its sends, and separately its receives, in one order,
 * step-major: message x = t·S + j. A send or receive waits (is not posted)
 * until what it needs is done, never out of that order:
 *   send x      needs receive x−S done (t > 0): the segment it sends is the
 *               one that arrived (reduced) in the step before;
 *   receive x   reduce-scatter: receive x−S done (t > 0), whose scratch
 *               segment it reuses; all-gather: send (s·S + j) done, which
 *               read the segment of `data` this one overwrites.
 * Every wait points at an earlier x, so the ring cannot deadlock.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/collectives.h"
#include "comm/collectives_internal.h"

/* Segments per chunk, and the least a segment holds. The link idles only
 * while the first segment of a step is in flight, so a few segments per chunk
 * take all of the gain (measured over a shaped 100 Mbit/s link: 4 segments of
 * 1.4 MB kept it 93% busy, 22 of 256 kB 91%, one per chunk 87%), and each
 * message costs a round of the transport's own (on one host: a descriptor
 * and an acknowledgement). */
#define SEGMENTS_PER_CHUNK 4
#define MIN_SEGMENT_BYTES (64u * 1024u)

/* What a request's callback needs to know about its message. */
typedef struct message_slot {
    pt_allreduce_handle *h;
    int x;
    bool is_send;
} message_slot;

struct pt_allreduce_handle {
    collective c;
    float *data; /* [count] */
    size_t count;
    pt_reduce_op op;
    int n, index;          /* the group's size, this member's position */
    int segments;          /* S, per chunk: the same on every member */
    size_t segment_stride; /* floats of scratch per segment */
    float *scratch;        /* [S·segment_stride]: the left neighbour's segments in reduce-scatter */
    int messages;          /* 2(n−1)·S each way */
    message_slot *slots;   /* [2·messages]: receives, then sends */
    /* Under allreduce_lock. */
    bool *received, *sent;  /* [messages]: done (a receive: and reduced) */
    pt_request **receives;  /* [messages]: posted, not yet completed */
    int sends_posted, receives_posted, outstanding;
    bool pumping, pump_again, cancelled, ended;
    int finished;
    int abandoned; /* its waiter left (or it never had one): the end frees it */
    pipert_result result;
    char message[MESSAGE_CAPACITY];
    pt_collective_done done; /* pt_allreduce_then: called before it frees itself */
    void *done_arg;
};

/* One lock and condition for every handle: a handle is freed by its waiter
 * right after the last signal, so they must not live inside it. */
static pthread_mutex_t allreduce_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t allreduce_finished = PTHREAD_COND_INITIALIZER;

/* Part k of a range of `count` cut into n: count/n elements, the first
 * count%n parts one more. */
static size_t part_begin(size_t count, int n, int k)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    return base * (size_t)k + ((size_t)k < extra ? (size_t)k : extra);
}

static size_t part_length(size_t count, int n, int k)
{
    return part_begin(count, n, k + 1) - part_begin(count, n, k);
}

/* ---- which segment a message carries ------------------------------------ */

typedef struct segment {
    float *at;     /* in data */
    size_t length; /* elements */
    float *scratch; /* reduce-scatter receives: where it arrives */
} segment;

static int step_of(const pt_allreduce_handle *h, int x) { return x / h->segments; }
static bool gathering(const pt_allreduce_handle *h, int t) { return t >= h->n - 1; }

/* Chunk j's segment of message x, sent (is_send) or received. */
static segment segment_of(const pt_allreduce_handle *h, int x, bool is_send)
{
    const int t = step_of(h, x), j = x % h->segments, i = h->index;
    const int s = t - (h->n - 1);
    int k;
    if (is_send)
        k = gathering(h, t) ? i + 1 - s : i - t;
    else
        k = gathering(h, t) ? i - s : i - t - 1;
    k = pt_group_member(h->c.g, k);
    const size_t chunk = part_begin(h->count, h->n, k), chunk_length = part_length(h->count, h->n, k);
    return (segment){
        .at = h->data + chunk + part_begin(chunk_length, h->segments, j),
        .length = part_length(chunk_length, h->segments, j),
        .scratch = h->scratch + (size_t)j * h->segment_stride,
    };
}

/* Under the lock: may message x be posted now? */
static bool send_ready(const pt_allreduce_handle *h, int x)
{
    return step_of(h, x) == 0 || h->received[x - h->segments];
}

static bool receive_ready(const pt_allreduce_handle *h, int x)
{
    const int t = step_of(h, x);
    if (!gathering(h, t)) return t == 0 || h->received[x - h->segments];
    const int s = t - (h->n - 1);
    return h->sent[s * h->segments + x % h->segments];
}

/* A reduce-scatter segment arrived in scratch: add it in; the last
 * reduce-scatter step completes the chunk (MEAN: divides it). */
static void reduce_received(pt_allreduce_handle *h, int x)
{
    const int t = step_of(h, x);
    if (gathering(h, t)) return; /* it arrived in place */
    const segment seg = segment_of(h, x, false);
    for (size_t e = 0; e < seg.length; e++) seg.at[e] += seg.scratch[e];
    if (t == h->n - 2 && h->op == PT_REDUCE_MEAN)
        for (size_t e = 0; e < seg.length; e++) seg.at[e] /= (float)h->n;
}

/* ---- failure and the end ------------------------------------------------- */

/* Under the lock: keeps the first failure, and cancels the receives posted
 * (their messages may never come: the peers wait for ours). */
static void record_failure(pt_allreduce_handle *h, pipert_result result, const char *message)
{
    if (h->result == PIPERT_OK) {
        h->result = result;
        snprintf(h->message, sizeof h->message, "%s: %s", h->c.name, message);
    }
    if (h->cancelled) return;
    h->cancelled = true;
    for (int x = 0; x < h->messages; x++)
        if (h->receives[x]) pt_request_cancel(h->receives[x]);
}

static pipert_result allreduce_release(pt_allreduce_handle *h);

static void allreduce_finish(pt_allreduce_handle *h)
{
    pthread_mutex_lock(&allreduce_lock);
    h->finished = 1;
    const int abandoned = h->abandoned;
    pthread_cond_broadcast(&allreduce_finished);
    pthread_mutex_unlock(&allreduce_lock);
    if (abandoned) { /* nobody waits: it frees itself */
        if (h->done) h->done(h->done_arg, h->result, h->message);
        allreduce_release(h);
    }
}

/* ---- posting ------------------------------------------------------------- */

static void message_done(pt_request *request, pipert_result result, void *arg);

/* Posts message slot `m`; under no lock. */
static void post(pt_allreduce_handle *h, message_slot *m)
{
    const segment seg = segment_of(h, m->x, m->is_send);
    pt_request *request = NULL;
    pipert_result rc =
        m->is_send ? pt_collective_post_send(&h->c, h->index + 1, seg.at, seg.length, PT_DTYPE_F32,
                                             step_of(h, m->x), &request)
                   : pt_collective_post_recv(&h->c, h->index - 1,
                                             gathering(h, step_of(h, m->x)) ? seg.at : seg.scratch,
                                             seg.length, PT_DTYPE_F32, &request);
    pthread_mutex_lock(&allreduce_lock);
    if (rc != PIPERT_OK) {
        record_failure(h, rc, pipert_last_error());
        h->outstanding--;
    } else if (!m->is_send) {
        h->receives[m->x] = request;
        if (h->cancelled) pt_request_cancel(request);
    }
    pthread_mutex_unlock(&allreduce_lock);
    if (request) pt_request_on_complete(request, message_done, m);
}

/* Under the lock: the next message that may be posted now, in order, or
 * NULL. Sends go first: once something failed nothing more is posted, and a
 * peer should still get the message it waits for (a member whose sizes
 * differ then hears of it from every neighbour, not as a timeout). */
static message_slot *next_message(pt_allreduce_handle *h)
{
    if (h->result != PIPERT_OK) return NULL;
    if (h->sends_posted < h->messages && send_ready(h, h->sends_posted))
        return &h->slots[h->messages + h->sends_posted++];
    if (h->receives_posted < h->messages && receive_ready(h, h->receives_posted))
        return &h->slots[h->receives_posted++];
    return NULL;
}

/* Posts whatever may be posted, and ends the all-reduce once nothing is in
 * flight and nothing more will be. One thread pumps at a time: a completion
 * that arrives meanwhile (on the progress thread, or right inside `post`)
 * asks it to look again instead of pumping beside it. */
static void pump(pt_allreduce_handle *h)
{
    pthread_mutex_lock(&allreduce_lock);
    if (h->pumping) {
        h->pump_again = true;
        pthread_mutex_unlock(&allreduce_lock);
        return;
    }
    h->pumping = true;
    for (;;) {
        h->pump_again = false;
        message_slot *m = next_message(h);
        if (!m) {
            if (h->pump_again) continue;
            break;
        }
        h->outstanding++;
        pthread_mutex_unlock(&allreduce_lock);
        post(h, m);
        pthread_mutex_lock(&allreduce_lock);
    }
    h->pumping = false;
    const bool all_done = h->sends_posted == h->messages && h->receives_posted == h->messages;
    const bool end = !h->ended && h->outstanding == 0 && (all_done || h->result != PIPERT_OK);
    if (end) h->ended = true;
    pthread_mutex_unlock(&allreduce_lock);
    if (end) allreduce_finish(h);
}

static void message_done(pt_request *request, pipert_result result, void *arg)
{
    message_slot *m = arg;
    pt_allreduce_handle *h = m->h;
    if (result == PIPERT_OK && !m->is_send) reduce_received(h, m->x);
    pthread_mutex_lock(&allreduce_lock);
    if (result != PIPERT_OK) record_failure(h, result, pt_request_error(request));
    if (m->is_send)
        h->sent[m->x] = result == PIPERT_OK;
    else {
        h->receives[m->x] = NULL;
        h->received[m->x] = result == PIPERT_OK;
    }
    h->outstanding--;
    pthread_mutex_unlock(&allreduce_lock);
    pt_request_free(request); /* from its own callback: released when the callback returns */
    pump(h);
}

/* ---- the handle ---------------------------------------------------------- */

static pt_allreduce_handle *handle_alloc(pt_group *g, size_t count)
{
    pt_allreduce_handle *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->n = g->size;
    h->index = g->index;
    const size_t largest_chunk = part_length(count, h->n, 0);
    const size_t fitting = largest_chunk * sizeof(float) / MIN_SEGMENT_BYTES;
    h->segments = fitting < 1 ? 1 : fitting > SEGMENTS_PER_CHUNK ? SEGMENTS_PER_CHUNK : (int)fitting;
    h->segment_stride = part_length(largest_chunk, h->segments, 0);
    h->messages = 2 * (h->n - 1) * h->segments;
    const size_t messages = (size_t)(h->messages > 0 ? h->messages : 1);
    h->scratch = malloc(((size_t)h->segments * h->segment_stride + 1) * sizeof *h->scratch);
    h->slots = calloc(2 * messages, sizeof *h->slots);
    h->received = calloc(messages, sizeof *h->received);
    h->sent = calloc(messages, sizeof *h->sent);
    h->receives = calloc(messages, sizeof *h->receives);
    if (!h->scratch || !h->slots || !h->received || !h->sent || !h->receives) {
        allreduce_release(h);
        return NULL;
    }
    for (int x = 0; x < h->messages; x++) {
        h->slots[x] = (message_slot){h, x, false};
        h->slots[h->messages + x] = (message_slot){h, x, true};
    }
    return h;
}

/* pt_allreduce_start (ticket NULL: the group's next sequence number, taken
 * once the arguments passed) and pt_allreduce_then (done set, out NULL). */
static pipert_result allreduce_launch(pt_group *g, const pt_group_ticket *ticket, float *data,
                                      size_t count, pt_reduce_op op, pt_collective_done done,
                                      void *done_arg, pt_allreduce_handle **out)
{
    if (op != PT_REDUCE_SUM && op != PT_REDUCE_MEAN)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "allreduce: unknown reduce op %d", (int)op);
    if (count > 0 && !data)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "allreduce: %zu elements but no data", count);
    pt_allreduce_handle *h = handle_alloc(g, count);
    if (!h) return pt_fail(PIPERT_ERR_NOMEM, "allreduce: no memory for %zu elements", count);
    h->c = ticket ? pt_collective_at(g, ticket->sequence, "allreduce")
                  : pt_collective_begin(g, "allreduce");
    h->data = data;
    h->count = count;
    h->op = op;
    h->done = done;
    h->done_arg = done_arg;
    h->abandoned = done != NULL;
    if (out) *out = h;
    /* Size 0 moves nothing (every member agrees, since the sizes must be
     * equal); a single member has nothing to reduce. */
    if (count == 0 || g->size == 1) {
        h->ended = true;
        allreduce_finish(h);
    } else {
        pump(h);
    }
    return PIPERT_OK;
}

pipert_result pt_allreduce_start(pt_group *g, float *data, size_t count, pt_reduce_op op,
                                 pt_allreduce_handle **out)
{
    *out = NULL;
    return allreduce_launch(g, NULL, data, count, op, NULL, NULL, out);
}

pipert_result pt_allreduce_then(pt_group *g, pt_group_ticket ticket, float *data, size_t count,
                                pt_reduce_op op, pt_collective_done done, void *arg)
{
    return allreduce_launch(g, &ticket, data, count, op, done, arg, NULL);
}

static pipert_result allreduce_release(pt_allreduce_handle *h)
{
    /* The last callbacks may still be returning on the progress thread, but
     * they touch neither the handle nor the (self-freeing) requests again. */
    pipert_result result = h->result;
    char message[MESSAGE_CAPACITY];
    snprintf(message, sizeof message, "%s", h->message);
    free(h->scratch);
    free(h->slots);
    free(h->received);
    free(h->sent);
    free(h->receives);
    free(h);
    if (result != PIPERT_OK) return pt_fail(result, "%s", message);
    return PIPERT_OK;
}

pipert_result pt_allreduce_wait(pt_allreduce_handle *h)
{
    pthread_mutex_lock(&allreduce_lock);
    while (!h->finished) pthread_cond_wait(&allreduce_finished, &allreduce_lock);
    pthread_mutex_unlock(&allreduce_lock);
    return allreduce_release(h);
}

pipert_result pt_allreduce_wait_for(pt_allreduce_handle *h, double timeout_s)
{
    const struct timespec deadline = pt_collective_deadline_after(timeout_s);
    pthread_mutex_lock(&allreduce_lock);
    int waited = 0;
    while (!h->finished && waited == 0)
        waited = pthread_cond_timedwait(&allreduce_finished, &allreduce_lock, &deadline);
    const int finished = h->finished;
    pthread_mutex_unlock(&allreduce_lock);
    if (!finished) return PIPERT_ERR_TIMEOUT; /* no message: the caller asks again */
    return allreduce_release(h);
}

void pt_allreduce_abandon(pt_allreduce_handle *h)
{
    pthread_mutex_lock(&allreduce_lock);
    const int finished = h->finished;
    if (!finished) h->abandoned = 1;
    pthread_mutex_unlock(&allreduce_lock);
    if (finished) allreduce_release(h);
}

pipert_result pt_allreduce(pt_group *g, float *data, size_t count, pt_reduce_op op)
{
    pt_allreduce_handle *h;
    PT_TRY(pt_allreduce_start(g, data, count, op, &h));
    return pt_allreduce_wait(h);
}

size_t pt_allreduce_bytes_sent(const pt_group *g, size_t count)
{
    const int n = g->size, i = g->index;
    if (n == 1) return 0;
    return sizeof(float) * (2 * count - part_length(count, n, pt_group_member(g, i + 1)) -
                            part_length(count, n, pt_group_member(g, i + 2)));
}
