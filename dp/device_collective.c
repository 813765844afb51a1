#include "dp/device_collective.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "dp/wait.h"
#include "runtime/clock.h"
#include "runtime/error.h"

/* Buffers a receive may still write after it was abandoned: never reused, freed at the end. */
typedef struct retired {
    void **device, **host;
    int n_device, n_host;
} retired;

struct pt_device_collective {
    const pt_kernels *k;
    size_t chunk;     /* floats a chunk holds at most */
    size_t capacity;  /* floats the buffers below hold */
    float *incoming;  /* device: another member's chunk arrives here (a broadcast's too: a late
                         copy must never land in the tensor itself) */
    float *sum;       /* device: the chunk's running sum in member order (R > 2) */
    float *host_in;   /* host: a chunk that came as bytes (or the descriptor of one that did not) */
    float *host_out;  /* host: this member's chunk for members that take bytes (made when needed) */
    retired retired;

    /* the collective in progress */
    bool active;
    bool broadcast; /* from member `root`; else the mean */
    pt_group *g;
    int R, self, root;
    pt_group_ticket ticket;
    float *data;
    size_t count, chunks, index; /* chunk `index` of `chunks` is data[at, at + len) */
    size_t at, len;
    int term;              /* the member whose chunk joins the sum next */
    pt_request **sends;    /* [sends_capacity], by member: this chunk's sends (own slot NULL) */
    int sends_capacity;
    bool host_out_sent;    /* one of this chunk's sends reads host_out */
    pt_request *recv;      /* the receive in flight, into recv_into */
    float *recv_into;
};

/* ---- buffers -------------------------------------------------------------- */

static pipert_result keep(void ***list, int *n, void *buffer)
{
    if (!buffer) return PIPERT_OK;
    void **grown = realloc(*list, (size_t)(*n + 1) * sizeof *grown);
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "device collective: out of memory");
    *list = grown;
    (*list)[(*n)++] = buffer;
    return PIPERT_OK;
}

static void free_buffers(pt_device_collective *c)
{
    if (c->incoming) c->k->free(c->incoming);
    if (c->sum) c->k->free(c->sum);
    if (c->host_in) c->k->free_host(c->host_in);
    if (c->host_out) c->k->free_host(c->host_out);
    c->incoming = c->sum = c->host_in = c->host_out = NULL;
    c->capacity = 0;
}

/* The buffers a chunk of `floats` needs among R members (a sum only for R > 2). */
static pipert_result ensure_buffers(pt_device_collective *c, size_t floats, int R)
{
    if (c->capacity < floats) {
        free_buffers(c);
        c->capacity = floats;
    }
    const size_t bytes = c->capacity * sizeof(float);
    if (!c->incoming)
        PT_TRY(c->k->alloc((void **)&c->incoming, bytes, "the device collective's incoming chunk"));
    if (!c->broadcast && R > 2 && !c->sum)
        PT_TRY(c->k->alloc((void **)&c->sum, bytes, "the device collective's running sum"));
    if (!c->host_in)
        PT_TRY(c->k->alloc_host((void **)&c->host_in, bytes, "the device collective's host chunk"));
    if (c->sends_capacity < R) {
        pt_request **grown = realloc(c->sends, (size_t)R * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "device collective: out of memory");
        c->sends = grown;
        c->sends_capacity = R;
    }
    for (int j = 0; j < R; j++) c->sends[j] = NULL;
    return PIPERT_OK;
}

pipert_result pt_device_collective_create(const pt_kernels *kernels, size_t chunk,
                                          pt_device_collective **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return pt_fail(PIPERT_ERR_NOMEM, "device collective: out of memory");
    (*out)->k = kernels;
    (*out)->chunk = chunk ? chunk : PT_DEVICE_COLLECTIVE_CHUNK;
    return PIPERT_OK;
}

void pt_device_collective_free(pt_device_collective *c)
{
    if (!c) return;
    free_buffers(c);
    for (int i = 0; i < c->retired.n_device; i++) c->k->free(c->retired.device[i]);
    for (int i = 0; i < c->retired.n_host; i++) c->k->free_host(c->retired.host[i]);
    free(c->retired.device);
    free(c->retired.host);
    free(c->sends);
    free(c);
}

size_t pt_device_collective_mean_bytes(const pt_group *g, size_t count)
{
    return (size_t)(pt_group_size(g) - 1) * count * sizeof(float);
}

size_t pt_device_collective_broadcast_bytes(const pt_group *g, size_t count, int root)
{
    return pt_group_index(g) == root ? pt_device_collective_mean_bytes(g, count) : 0;
}

pipert_result pt_device_collective_agree(const pt_coupling_options *o, pt_group *g, bool *yes)
{
    *yes = false;
    if (!g || o->kernels->host_accessible) return PIPERT_OK;
    float copiers = pt_group_copies_device_memory(g) ? 1.0f : 0.0f;
    pt_allreduce_handle *handle;
    PT_TRY(pt_allreduce_start(g, &copiers, 1, PT_REDUCE_SUM, &handle));
    pt_coupling_options setting_up = *o; /* not a step's wait: no trace span, no blocked time */
    setting_up.trace = NULL;
    setting_up.blocked = NULL;
    PT_TRY(pt_coupling_wait_allreduce(&setting_up, handle,
                                      "agreeing whether to work in device memory"));
    *yes = copiers == (float)pt_group_size(g);
    return PIPERT_OK;
}

/* ---- one chunk ------------------------------------------------------------ */

static size_t chunk_bytes(const pt_device_collective *c) { return c->len * sizeof(float); }

/* This member's chunk to every other member (a broadcast: the root's only): device to device
 * where the member copies it, else as bytes from one host copy. */
static pipert_result send_chunk(pt_device_collective *c)
{
    const float *own = c->data + c->at;
    if (c->broadcast && c->self != c->root) return PIPERT_OK;
    for (int j = 0; j < c->R; j++) {
        if (j == c->self) continue;
        if (pt_group_takes_device_payload(c->g, j, c->len)) {
            PT_TRY(pt_group_send_device(c->g, c->ticket, j, own, c->len, &c->sends[j]));
            continue;
        }
        if (!c->host_out_sent) {
            if (!c->host_out)
                PT_TRY(c->k->alloc_host((void **)&c->host_out, c->capacity * sizeof(float),
                                        "the device collective's outgoing host chunk"));
            c->k->copy_to_host(c->host_out, own, chunk_bytes(c));
            c->host_out_sent = true;
        }
        PT_TRY(pt_group_send(c->g, c->ticket, j, c->host_out, c->len, &c->sends[j]));
    }
    return PIPERT_OK;
}

/* Chunk `index`: the chunks' lengths differ by at most one float. */
static pipert_result begin_chunk(pt_device_collective *c)
{
    const size_t base = c->count / c->chunks, longer = c->count % c->chunks;
    c->len = base + (c->index < longer);
    c->at = c->index * base + (c->index < longer ? c->index : longer);
    c->term = 0;
    c->host_out_sent = false;
    return send_chunk(c);
}

static pipert_result post_receive(pt_device_collective *c, float *into)
{
    c->recv_into = into;
    return pt_group_recv_device(c->g, c->ticket, c->term, c->host_in, into, c->len, &c->recv);
}

/* Member `term`'s chunk joins the sum: this member's own at once, another's once received
 * (the first of them straight into the sum). With two members the sum is made at the end, in
 * place: own + other is the same float on both. A broadcast takes the root's chunk only. */
static pipert_result take_term(pt_device_collective *c)
{
    const float *own = c->data + c->at;
    if (c->broadcast) {
        if (c->term == c->root && c->self != c->root) return post_receive(c, c->incoming);
        c->term++;
        return PIPERT_OK;
    }
    if (c->term != c->self) return post_receive(c, c->R == 2 || c->term > 0 ? c->incoming : c->sum);
    if (c->R > 2 && c->term == 0) c->k->copy(c->sum, own, chunk_bytes(c));
    else if (c->R > 2) c->k->residual_forward(c->sum, c->sum, own, c->len);
    c->term++;
    return PIPERT_OK;
}

static void term_arrived(pt_device_collective *c)
{
    if (!pt_request_on_device(c->recv))
        c->k->copy_to_device(c->recv_into, c->host_in, chunk_bytes(c));
    pt_request_free(c->recv);
    c->recv = NULL;
    if (!c->broadcast && c->R > 2 && c->term > 0)
        c->k->residual_forward(c->sum, c->sum, c->incoming, c->len);
    c->term++;
}

/* Every member copied this chunk of ours: it becomes the mean, or the root's. */
static void finish_chunk(pt_device_collective *c)
{
    float *own = c->data + c->at;
    if (c->broadcast) {
        if (c->self != c->root) c->k->copy(own, c->incoming, chunk_bytes(c));
        return;
    }
    if (c->R == 2) c->k->residual_forward(own, own, c->incoming, c->len);
    else c->k->copy(own, c->sum, chunk_bytes(c));
    c->k->scale(own, 1.0f / (float)c->R, c->len);
}

/* ---- driving it ----------------------------------------------------------- */

/* rc, its message prefixed with where the mean was: `what` (a member, or -1: all of them). */
static pipert_result failed(pt_device_collective *c, pipert_result rc, const char *what, int member)
{
    char whom[32] = "the others";
    if (member >= 0) snprintf(whom, sizeof whom, "member %d", member);
    pt_error_prefix("device %s over %d members: %s %s, chunk %zu of %zu (%zu floats)",
                    c->broadcast ? "broadcast" : "mean", c->R, what, whom, c->index + 1, c->chunks,
                    c->len);
    return rc;
}

/* A request not ended yet: the mean waits for it. */
static pipert_result waiting_for(pt_request *request, pt_request **blocking)
{
    *blocking = request;
    return PIPERT_ERR_TIMEOUT;
}

/* How far the mean gets without waiting: PIPERT_ERR_TIMEOUT with the request it waits for in
 * *blocking, or its end. */
static pipert_result advance(pt_device_collective *c, pt_request **blocking)
{
    while (c->index < c->chunks) {
        pipert_result rc = PIPERT_OK;
        if (c->recv) {
            if (!pt_request_test(c->recv, &rc)) return waiting_for(c->recv, blocking);
            if (rc != PIPERT_OK) return failed(c, rc, "receiving from", c->term);
            term_arrived(c);
            continue;
        }
        if (c->term < c->R) {
            rc = take_term(c);
            if (rc != PIPERT_OK) return failed(c, rc, "posting the receive from", c->term);
            continue;
        }
        for (int j = 0; j < c->R; j++) {
            if (!c->sends[j]) continue;
            if (!pt_request_test(c->sends[j], &rc)) return waiting_for(c->sends[j], blocking);
            if (rc != PIPERT_OK) return failed(c, rc, "sending to", j);
            pt_request_free(c->sends[j]);
            c->sends[j] = NULL;
        }
        finish_chunk(c);
        if (++c->index < c->chunks && (rc = begin_chunk(c)) != PIPERT_OK)
            return failed(c, rc, "sending to", -1);
    }
    return PIPERT_OK;
}

/* Gives up what is in flight; a receive may still write its buffers, a send of bytes read
 * host_out: those are retired. */
static void abandon_in_flight(pt_device_collective *c)
{
    if (c->recv) {
        pt_request_abandon(c->recv);
        c->recv = NULL;
        (void)keep(&c->retired.device, &c->retired.n_device, c->incoming);
        (void)keep(&c->retired.device, &c->retired.n_device, c->sum);
        (void)keep(&c->retired.host, &c->retired.n_host, c->host_in);
        c->incoming = c->sum = c->host_in = NULL;
    }
    bool reading_host_out = false;
    for (int j = 0; j < c->R; j++)
        if (c->sends[j]) {
            pt_request_abandon(c->sends[j]);
            c->sends[j] = NULL;
            reading_host_out = c->host_out_sent;
        }
    if (reading_host_out) {
        (void)keep(&c->retired.host, &c->retired.n_host, c->host_out);
        c->host_out = NULL;
    }
    c->active = false;
}

static pipert_result start(pt_device_collective *c, pt_group *g, float *data, size_t count)
{
    if (c->active)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "device collective: one is in progress already");
    c->g = g;
    c->R = pt_group_size(g);
    c->self = pt_group_index(g);
    c->data = data;
    c->count = c->R > 1 ? count : 0;
    c->chunks = (c->count + c->chunk - 1) / c->chunk;
    c->index = 0;
    c->recv = NULL;
    c->active = c->chunks == 0; /* nothing to do: the wait ends at once */
    if (c->active) return PIPERT_OK;
    PT_TRY(ensure_buffers(c, (count + c->chunks - 1) / c->chunks, c->R));
    c->ticket = pt_group_take_ticket(g);
    c->k->synchronize(); /* the members copy what the kernels wrote, not what they will */
    c->active = true;
    pipert_result rc = begin_chunk(c);
    if (rc != PIPERT_OK) {
        abandon_in_flight(c);
        return failed(c, rc, "sending to", -1);
    }
    return PIPERT_OK;
}

pipert_result pt_device_collective_mean_start(pt_device_collective *c, pt_group *g, float *data,
                                              size_t count)
{
    c->broadcast = false;
    return start(c, g, data, count);
}

pipert_result pt_device_collective_broadcast_start(pt_device_collective *c, pt_group *g,
                                                   float *data, size_t count, int root)
{
    if (root < 0 || root >= pt_group_size(g))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "device broadcast: root %d of %d members", root,
                       pt_group_size(g));
    c->broadcast = true;
    c->root = root;
    return start(c, g, data, count);
}

pipert_result pt_device_collective_wait_for(pt_device_collective *c, double timeout_s)
{
    if (!c->active) return pt_fail(PIPERT_ERR_INVALID_ARG, "device collective: none in progress");
    const double deadline = pt_now_s() + timeout_s;
    for (;;) {
        pt_request *blocking = NULL;
        const pipert_result rc = advance(c, &blocking);
        if (rc != PIPERT_ERR_TIMEOUT) {
            if (rc != PIPERT_OK) abandon_in_flight(c);
            c->active = false;
            return rc;
        }
        const double left = deadline - pt_now_s();
        if (left <= 0) return PIPERT_ERR_TIMEOUT;
        (void)pt_request_wait(blocking, left);
    }
}

void pt_device_collective_abandon(pt_device_collective *c)
{
    if (c->active) abandon_in_flight(c);
}
