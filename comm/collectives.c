/* Groups, and barrier, broadcast, all-gather and all-to-all over pt_transport
 * (the ring all-reduce is in allreduce.c). */
#include "comm/collectives.h"
#include "comm/collectives_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/safetensors.h"

#define INTERRUPT_POLL_S 0.1 /* how often a blocking collective asks its group to go on waiting */

pipert_result pt_group_create(pt_transport *t, const int *ranks, int n_ranks,
                              const pt_group_options *options, pt_group **out)
{
    *out = NULL;
    pt_group_options defaults = PT_GROUP_OPTIONS_INIT;
    if (!options) options = &defaults;
    if (n_ranks < 1) return pt_fail(PIPERT_ERR_INVALID_ARG, "group: %d members", n_ranks);
    if (options->id > 255)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "group: id %u is above 255", options->id);
    int index = -1;
    for (int i = 0; i < n_ranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= PT_TRANSPORT_MAX_RANKS)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "group: ranks[%d] = %d is not a rank", i,
                           ranks[i]);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return pt_fail(PIPERT_ERR_INVALID_ARG,
                               "group: rank %d appears twice (ranks[%d], ranks[%d])", ranks[i], j,
                               i);
        if (ranks[i] == pt_transport_rank(t)) index = i;
    }
    if (index < 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "group: this process (rank %d) is not a member",
                       pt_transport_rank(t));
    pt_group *g = calloc(1, sizeof *g);
    int *copy = malloc((size_t)n_ranks * sizeof *copy);
    if (!g || !copy) {
        free(g);
        free(copy);
        return pt_fail(PIPERT_ERR_NOMEM, "group: no memory for %d members", n_ranks);
    }
    memcpy(copy, ranks, (size_t)n_ranks * sizeof *copy);
    g->t = t;
    g->size = n_ranks;
    g->index = index;
    g->ranks = copy;
    g->id = options->id;
    g->checksum = options->checksum;
    g->interrupted = options->interrupted;
    g->context = options->context;
    atomic_init(&g->sequence, options->first_sequence);
    *out = g;
    return PIPERT_OK;
}

void pt_group_destroy(pt_group *g)
{
    if (!g) return;
    free(g->ranks);
    free(g);
}

int pt_group_size(const pt_group *g) { return g->size; }
int pt_group_index(const pt_group *g) { return g->index; }

/* ---- messages of one collective ------------------------------------------ */

collective pt_collective_at(pt_group *g, uint32_t sequence, const char *what)
{
    collective c = {.g = g, .sequence = sequence};
    c.tag = (g->id << 24) | (c.sequence & 0xffffffu);
    snprintf(c.name, sizeof c.name, "%s #%u of group %u", what, c.sequence, g->id);
    return c;
}

collective pt_collective_begin(pt_group *g, const char *what)
{
    return pt_collective_at(g, atomic_fetch_add(&g->sequence, 1u), what);
}

uint32_t pt_group_next_sequence(const pt_group *g)
{
    return atomic_load(&((pt_group *)g)->sequence);
}

pt_group_ticket pt_group_take_ticket(pt_group *g)
{
    return (pt_group_ticket){.sequence = atomic_fetch_add(&g->sequence, 1u)};
}

int pt_group_member(const pt_group *g, int index) { return (index % g->size + g->size) % g->size; }

pipert_result pt_collective_post_send(const collective *c, int to, const void *data, size_t count,
                               pt_dtype dtype, int step, pt_request **out)
{
    pt_message_header h = {
        .kind = PT_KIND_COLLECTIVE,
        .dtype = (uint16_t)dtype,
        .microbatch = step,
        .step = c->sequence,
        .ndim = 1,
        .shape = {(int64_t)count},
        .nbytes = count * pt_dtype_size(dtype),
    };
    pipert_result rc = pt_send(c->g->t, c->g->ranks[pt_group_member(c->g, to)], c->tag, &h, data,
                               c->g->checksum ? PT_SEND_CHECKSUM : 0, out);
    if (rc != PIPERT_OK) pt_error_prefix("%s", c->name);
    return rc;
}

pipert_result pt_collective_post_recv(const collective *c, int from, void *data, size_t count,
                               pt_dtype dtype, pt_request **out)
{
    pt_recv_expect expect = {
        .kind = PT_KIND_COLLECTIVE,
        .dtype = (int32_t)dtype,
        .ndim = 1,
        .shape = {(int64_t)count},
        .require_checksum = c->g->checksum,
    };
    pipert_result rc = pt_recv(c->g->t, c->g->ranks[pt_group_member(c->g, from)], c->tag, &expect, data,
                               count * pt_dtype_size(dtype), out);
    if (rc != PIPERT_OK) pt_error_prefix("%s", c->name);
    return rc;
}

/* Waits for and frees requests[0..n) (NULL entries skipped); returns the first failure. */
/* One request's end, or PIPERT_ERR_INTERRUPTED once the group says so. */
static pipert_result wait_one(const collective *c, pt_request *request)
{
    const pt_group *g = c->g;
    if (!g->interrupted) return pt_request_wait(request, -1.0);
    for (;;) {
        pipert_result result;
        if (pt_request_test(request, &result)) return pt_request_wait(request, -1.0);
        if (g->interrupted(g->context))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "interrupted: the job's replicas changed, or it "
                                                   "stopped, while waiting for the group");
        /* a timeout here is the slice's; the test above takes a request that ended since */
        pipert_result rc = pt_request_wait(request, INTERRUPT_POLL_S);
        if (rc != PIPERT_ERR_TIMEOUT) return rc;
    }
}

/* Waits for every request and frees it. After an interruption the rest are abandoned: a
 * pending receive is cancelled, and a pending send is left to end on its own (a peer that gave
 * the collective up too never takes it; waiting for it here would hang this member instead). */
static pipert_result wait_all(const collective *c, pt_request **requests, int n)
{
    pipert_result first = PIPERT_OK;
    char message[MESSAGE_CAPACITY] = "";
    for (int i = 0; i < n; i++) {
        if (!requests[i]) continue;
        pipert_result rc = first == PIPERT_ERR_INTERRUPTED ? PIPERT_ERR_INTERRUPTED
                                                            : wait_one(c, requests[i]);
        if (rc != PIPERT_OK && first == PIPERT_OK) {
            first = rc;
            snprintf(message, sizeof message, "%s", pipert_last_error());
        }
        if (rc == PIPERT_ERR_INTERRUPTED) pt_request_abandon(requests[i]);
        else pt_request_free(requests[i]);
        requests[i] = NULL;
    }
    if (first != PIPERT_OK) return pt_fail(first, "%s: %s", c->name, message);
    return PIPERT_OK;
}

/* Sends to one member and receives from another at the same time. */
static pipert_result exchange(const collective *c, int to, const void *send, int from, void *recv,
                              size_t count, pt_dtype dtype, int step)
{
    pt_request *requests[2] = {NULL, NULL};
    pipert_result rc = pt_collective_post_recv(c, from, recv, count, dtype, &requests[0]);
    if (rc == PIPERT_OK) rc = pt_collective_post_send(c, to, send, count, dtype, step, &requests[1]);
    char message[MESSAGE_CAPACITY];
    snprintf(message, sizeof message, "%s", pipert_last_error());
    pipert_result waited = wait_all(c, requests, 2);
    if (rc != PIPERT_OK) return pt_fail(rc, "%s", message);
    return waited;
}

/* ---- barrier, broadcast, all-gather -------------------------------------- */

pipert_result pt_barrier(pt_group *g)
{
    collective c = pt_collective_begin(g, "barrier");
    /* Dissemination: in round r every member signals index + 2^r; after
     * ceil(log2 n) rounds each has heard, indirectly, from all. */
    int round = 0;
    for (int distance = 1; distance < g->size; distance *= 2, round++)
        PT_TRY(exchange(&c, g->index + distance, NULL, g->index - distance, NULL, 0, PT_DTYPE_U8,
                        round));
    return PIPERT_OK;
}

/* Binomial tree over positions relative to the root: member v receives
 * from v - 2^k (k = its lowest set bit; the returned mask is 2^k, or the
 * first power of two ≥ the size for the root) and forwards to v + 2^j for
 * every 2^j below that bit. */
static int broadcast_parent_mask(const pt_group *g, int relative)
{
    int mask = 1;
    while (mask < g->size && !(relative & mask)) mask <<= 1;
    return mask;
}

size_t pt_broadcast_bytes_sent(const pt_group *g, size_t nbytes, int root_index)
{
    if (root_index < 0 || root_index >= g->size) return 0;
    const int relative = pt_group_member(g, g->index - root_index);
    size_t children = 0;
    for (int mask = broadcast_parent_mask(g, relative) >> 1; mask > 0; mask >>= 1)
        children += relative + mask < g->size;
    return children * nbytes;
}

pipert_result pt_broadcast(pt_group *g, void *buffer, size_t nbytes, int root_index)
{
    if (root_index < 0 || root_index >= g->size)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "broadcast: root %d is not a member of a group of %d", root_index, g->size);
    collective c = pt_collective_begin(g, "broadcast");
    int relative = pt_group_member(g, g->index - root_index);
    int mask = broadcast_parent_mask(g, relative);
    if (relative != 0) {
        pt_request *request = NULL;
        PT_TRY(pt_collective_post_recv(&c, g->index - mask, buffer, nbytes, PT_DTYPE_U8, &request));
        PT_TRY(wait_all(&c, &request, 1));
    }
    pt_request *sends[32] = {NULL};
    int n_sends = 0;
    pipert_result rc = PIPERT_OK;
    for (mask >>= 1; mask > 0 && rc == PIPERT_OK; mask >>= 1)
        if (relative + mask < g->size)
            rc = pt_collective_post_send(&c, g->index + mask, buffer, nbytes, PT_DTYPE_U8, mask,
                           &sends[n_sends++]);
    char message[MESSAGE_CAPACITY];
    snprintf(message, sizeof message, "%s", pipert_last_error());
    pipert_result waited = wait_all(&c, sends, n_sends);
    if (rc != PIPERT_OK) return pt_fail(rc, "%s", message);
    return waited;
}

pipert_result pt_allgather(pt_group *g, const void *send, size_t nbytes_each, void *recv)
{
    collective c = pt_collective_begin(g, "allgather");
    unsigned char *blocks = recv;
    if (nbytes_each) memcpy(blocks + (size_t)g->index * nbytes_each, send, nbytes_each);
    /* Ring: in step s each member passes on the block it got in step s - 1. */
    for (int step = 0; step < g->size - 1; step++) {
        size_t outgoing = (size_t)pt_group_member(g, g->index - step),
               incoming = (size_t)pt_group_member(g, g->index - step - 1);
        PT_TRY(exchange(&c, g->index + 1, blocks + outgoing * nbytes_each, g->index - 1,
                        blocks + incoming * nbytes_each, nbytes_each, PT_DTYPE_U8, step));
    }
    return PIPERT_OK;
}

/* The CLOCK_REALTIME instant timeout_s from now, for pthread_cond_timedwait. */
struct timespec pt_collective_deadline_after(double timeout_s)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    double whole = floor(timeout_s);
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    return deadline;
}

/* ---- completions ---------------------------------------------------------- */

struct pt_completion {
    void (*release)(void *owner);
    void *owner;
    /* Under completion_lock. */
    int finished, abandoned;
    pipert_result result;
    char message[MESSAGE_CAPACITY];
};

/* One lock and condition for every completion, for the reason given at
 * allreduce_lock: a waiter frees the completion right after the signal. */
static pthread_mutex_t completion_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t completion_changed = PTHREAD_COND_INITIALIZER;

pipert_result pt_completion_create(void (*release)(void *owner), void *owner, pt_completion **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return pt_fail(PIPERT_ERR_NOMEM, "completion: out of memory");
    (*out)->release = release;
    (*out)->owner = owner;
    return PIPERT_OK;
}

static void completion_release(pt_completion *c)
{
    if (c->release) c->release(c->owner);
    free(c);
}

void pt_completion_finish(pt_completion *c, pipert_result result, const char *message)
{
    pthread_mutex_lock(&completion_lock);
    c->finished = 1;
    /* A wait's PIPERT_ERR_TIMEOUT must mean "not finished" only. */
    c->result = result == PIPERT_ERR_TIMEOUT ? PIPERT_ERR_TRANSPORT : result;
    snprintf(c->message, sizeof c->message, "%s", result == PIPERT_OK ? "" : message);
    const int abandoned = c->abandoned;
    pthread_cond_broadcast(&completion_changed);
    pthread_mutex_unlock(&completion_lock);
    if (abandoned) completion_release(c);
}

int pt_completion_test(pt_completion *c)
{
    pthread_mutex_lock(&completion_lock);
    const int finished = c->finished;
    pthread_mutex_unlock(&completion_lock);
    return finished;
}

pipert_result pt_completion_wait_for(pt_completion *c, double timeout_s)
{
    const struct timespec deadline = pt_collective_deadline_after(timeout_s < 0 ? 0 : timeout_s);
    pthread_mutex_lock(&completion_lock);
    int waited = 0;
    while (!c->finished && waited == 0)
        waited = timeout_s < 0
                     ? pthread_cond_wait(&completion_changed, &completion_lock)
                     : pthread_cond_timedwait(&completion_changed, &completion_lock, &deadline);
    const int finished = c->finished;
    pthread_mutex_unlock(&completion_lock);
    if (!finished) return PIPERT_ERR_TIMEOUT; /* no message: the caller asks again */
    const pipert_result result = c->result;
    char message[MESSAGE_CAPACITY];
    snprintf(message, sizeof message, "%s", c->message);
    free(c);
    return result == PIPERT_OK ? PIPERT_OK : pt_fail(result, "%s", message);
}

pipert_result pt_completion_wait(pt_completion *c) { return pt_completion_wait_for(c, -1.0); }

void pt_completion_abandon(pt_completion *c)
{
    pthread_mutex_lock(&completion_lock);
    const int finished = c->finished;
    if (!finished) c->abandoned = 1;
    pthread_mutex_unlock(&completion_lock);
    if (finished) completion_release(c);
}

/* ---- all-gather and all-to-all, driven by request callbacks -------------- */

/* One round of messages, all posted at once: one to and one from every
 * other member. It ends when the last of them completes. */
typedef struct transfer {
    collective c;
    pt_collective_done done;
    void *arg;
    atomic_int outstanding; /* requests not yet completed, +1 while posting */
    pipert_result result;   /* the first failure, under completion_lock */
    char message[MESSAGE_CAPACITY];
    pt_request *requests[]; /* [2(n−1)], only while posting */
} transfer;

static void transfer_fail(transfer *x, pipert_result result, const char *message)
{
    pthread_mutex_lock(&completion_lock);
    if (x->result == PIPERT_OK) {
        x->result = result;
        snprintf(x->message, sizeof x->message, "%s: %s", x->c.name, message);
    }
    pthread_mutex_unlock(&completion_lock);
}

/* One request (or the posting) less; the last one ends the transfer. The
 * atomic decrement orders every failure recorded before it. */
static void transfer_part_ended(transfer *x)
{
    if (atomic_fetch_sub(&x->outstanding, 1) != 1) return;
    x->done(x->arg, x->result, x->message);
    free(x);
}

static void transfer_request_done(pt_request *request, pipert_result result, void *arg)
{
    transfer *x = arg;
    if (result != PIPERT_OK) transfer_fail(x, result, pt_request_error(request));
    pt_request_free(request); /* from its own callback: released when the callback returns */
    transfer_part_ended(x);
}

/* Receives block j of recv from every member j, and sends member j the block
 * of `send` at j·send_stride (stride 0: the same block to all). Receives go
 * first; sends go to index+1, index+2, ... so that members do not all start
 * with the same peer. */
static void transfer_post(transfer *x, const unsigned char *send, size_t send_stride,
                          unsigned char *recv, size_t nbytes)
{
    pt_group *g = x->c.g;
    int posted = 0, receives = 0;
    pipert_result rc = PIPERT_OK;
    for (int d = 1; d < g->size && rc == PIPERT_OK; d++) {
        const int from = pt_group_member(g, g->index - d);
        rc = pt_collective_post_recv(&x->c, from, recv + (size_t)from * nbytes, nbytes, PT_DTYPE_U8,
                       &x->requests[posted]);
        if (rc == PIPERT_OK) receives = ++posted;
    }
    for (int d = 1; d < g->size && rc == PIPERT_OK; d++) {
        const int to = pt_group_member(g, g->index + d);
        rc = pt_collective_post_send(&x->c, to, send + (size_t)to * send_stride, nbytes, PT_DTYPE_U8, d,
                       &x->requests[posted]);
        if (rc == PIPERT_OK) posted++;
    }
    if (rc != PIPERT_OK) {
        transfer_fail(x, rc, pipert_last_error());
        for (int k = 0; k < receives; k++) pt_request_cancel(x->requests[k]);
    }
    atomic_fetch_add(&x->outstanding, posted); /* before any callback can run */
    for (int k = 0; k < posted; k++)
        pt_request_on_complete(x->requests[k], transfer_request_done, x);
    transfer_part_ended(x); /* the posting */
}

static pipert_result transfer_start(pt_group *g, const collective *c, const void *send,
                                    size_t send_stride, void *recv, size_t nbytes,
                                    pt_collective_done done, void *arg)
{
    const unsigned char *own = (const unsigned char *)send + (size_t)g->index * send_stride;
    if (nbytes) memcpy((unsigned char *)recv + (size_t)g->index * nbytes, own, nbytes);
    /* Size 0 moves nothing (every member agrees, since sizes must be equal). */
    if (nbytes == 0 || g->size == 1) {
        done(arg, PIPERT_OK, "");
        return PIPERT_OK;
    }
    transfer *x = calloc(1, sizeof *x + 2 * (size_t)(g->size - 1) * sizeof x->requests[0]);
    if (!x) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", c->name);
    x->c = *c;
    x->done = done;
    x->arg = arg;
    atomic_init(&x->outstanding, 1);
    transfer_post(x, send, send_stride, recv, nbytes);
    return PIPERT_OK;
}

pipert_result pt_allgather_then(pt_group *g, pt_group_ticket ticket, const void *send,
                                size_t nbytes_each, void *recv, pt_collective_done done, void *arg)
{
    const collective c = pt_collective_at(g, ticket.sequence, "allgather");
    return transfer_start(g, &c, send, 0, recv, nbytes_each, done, arg);
}

pipert_result pt_alltoall_then(pt_group *g, pt_group_ticket ticket, const void *send,
                               size_t nbytes_each, void *recv, pt_collective_done done, void *arg)
{
    const collective c = pt_collective_at(g, ticket.sequence, "alltoall");
    return transfer_start(g, &c, send, nbytes_each, recv, nbytes_each, done, arg);
}

static void completion_done(void *completion, pipert_result result, const char *message)
{
    pt_completion_finish(completion, result, message);
}

/* The waitable forms: a chained collective whose done finishes a completion. */
static pipert_result transfer_start_waitable(pt_group *g, const char *what, const void *send,
                                             size_t send_stride, void *recv, size_t nbytes,
                                             pt_completion **out)
{
    PT_TRY(pt_completion_create(NULL, NULL, out));
    const collective c = pt_collective_begin(g, what);
    pipert_result rc =
        transfer_start(g, &c, send, send_stride, recv, nbytes, completion_done, *out);
    if (rc != PIPERT_OK) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

pipert_result pt_allgather_start(pt_group *g, const void *send, size_t nbytes_each, void *recv,
                                 pt_completion **out)
{
    return transfer_start_waitable(g, "allgather", send, 0, recv, nbytes_each, out);
}

pipert_result pt_alltoall_start(pt_group *g, const void *send, size_t nbytes_each, void *recv,
                                pt_completion **out)
{
    return transfer_start_waitable(g, "alltoall", send, nbytes_each, recv, nbytes_each, out);
}
