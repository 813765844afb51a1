#include "dp/device_mean.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/clock.h"
#include "runtime/error.h"

/* Buffers a receive may still write after it was abandoned: never reused, freed at the end. */
typedef struct retired {
    void **device, **host;
    int n_device, n_host;
} retired;

struct pt_device_mean {
    const pt_kernels *k;
    size_t chunk;     /* floats a chunk holds at most */
    size_t capacity;  /* floats the buffers below hold */
    float *incoming;  /* device: another member's chunk arrives here */
    float *sum;       /* device: the chunk's running sum in member order (R > 2) */
    float *host_in;   /* host: a chunk that came as bytes (and the descriptor of one that did not) */
    float *host_out;  /* host: this member's chunk for members that take bytes (made when needed) */
    retired retired;

    /* the mean in progress */
    bool active;
    pt_group *g;
    int R, self;
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
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "device mean: out of memory");
    *list = grown;
    (*list)[(*n)++] = buffer;
    return PIPERT_OK;
}

static void free_buffers(pt_device_mean *m)
{
    if (m->incoming) m->k->free(m->incoming);
    if (m->sum) m->k->free(m->sum);
    if (m->host_in) m->k->free_host(m->host_in);
    if (m->host_out) m->k->free_host(m->host_out);
    m->incoming = m->sum = m->host_in = m->host_out = NULL;
    m->capacity = 0;
}

/* The buffers a chunk of `floats` needs among R members (a sum only for R > 2). */
static pipert_result ensure_buffers(pt_device_mean *m, size_t floats, int R)
{
    if (m->capacity < floats) {
        free_buffers(m);
        m->capacity = floats;
    }
    const size_t bytes = m->capacity * sizeof(float);
    if (!m->incoming)
        PT_TRY(m->k->alloc((void **)&m->incoming, bytes, "the device mean's incoming chunk"));
    if (R > 2 && !m->sum)
        PT_TRY(m->k->alloc((void **)&m->sum, bytes, "the device mean's running sum"));
    if (!m->host_in)
        PT_TRY(m->k->alloc_host((void **)&m->host_in, bytes, "the device mean's host chunk"));
    if (m->sends_capacity < R) {
        pt_request **grown = realloc(m->sends, (size_t)R * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "device mean: out of memory");
        m->sends = grown;
        m->sends_capacity = R;
    }
    for (int j = 0; j < R; j++) m->sends[j] = NULL;
    return PIPERT_OK;
}

pipert_result pt_device_mean_create(const pt_kernels *kernels, size_t chunk, pt_device_mean **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return pt_fail(PIPERT_ERR_NOMEM, "device mean: out of memory");
    (*out)->k = kernels;
    (*out)->chunk = chunk ? chunk : PT_DEVICE_MEAN_CHUNK;
    return PIPERT_OK;
}

void pt_device_mean_free(pt_device_mean *m)
{
    if (!m) return;
    free_buffers(m);
    for (int i = 0; i < m->retired.n_device; i++) m->k->free(m->retired.device[i]);
    for (int i = 0; i < m->retired.n_host; i++) m->k->free_host(m->retired.host[i]);
    free(m->retired.device);
    free(m->retired.host);
    free(m->sends);
    free(m);
}

size_t pt_device_mean_bytes_sent(const pt_group *g, size_t count)
{
    return (size_t)(pt_group_size(g) - 1) * count * sizeof(float);
}

/* ---- one chunk ------------------------------------------------------------ */

static size_t chunk_bytes(const pt_device_mean *m) { return m->len * sizeof(float); }

/* This member's chunk to every other member: device to device where the member copies it,
 * else as bytes from one host copy. */
static pipert_result send_chunk(pt_device_mean *m)
{
    const float *own = m->data + m->at;
    for (int j = 0; j < m->R; j++) {
        if (j == m->self) continue;
        if (pt_group_takes_device_payload(m->g, j, m->len)) {
            PT_TRY(pt_group_send_device(m->g, m->ticket, j, own, m->len, &m->sends[j]));
            continue;
        }
        if (!m->host_out_sent) {
            if (!m->host_out)
                PT_TRY(m->k->alloc_host((void **)&m->host_out, m->capacity * sizeof(float),
                                        "the device mean's outgoing host chunk"));
            m->k->copy_to_host(m->host_out, own, chunk_bytes(m));
            m->host_out_sent = true;
        }
        PT_TRY(pt_group_send(m->g, m->ticket, j, m->host_out, m->len, &m->sends[j]));
    }
    return PIPERT_OK;
}

/* Chunk `index`: the chunks' lengths differ by at most one float. */
static pipert_result begin_chunk(pt_device_mean *m)
{
    const size_t base = m->count / m->chunks, longer = m->count % m->chunks;
    m->len = base + (m->index < longer);
    m->at = m->index * base + (m->index < longer ? m->index : longer);
    m->term = 0;
    m->host_out_sent = false;
    return send_chunk(m);
}

static pipert_result post_receive(pt_device_mean *m, float *into)
{
    m->recv_into = into;
    return pt_group_recv_device(m->g, m->ticket, m->term, m->host_in, into, m->len, &m->recv);
}

/* Member `term`'s chunk joins the sum: this member's own at once, another's once received
 * (the first of them straight into the sum). With two members the sum is made at the end, in
 * place: own + other is the same float on both. */
static pipert_result take_term(pt_device_mean *m)
{
    const float *own = m->data + m->at;
    if (m->term != m->self) return post_receive(m, m->R == 2 || m->term > 0 ? m->incoming : m->sum);
    if (m->R > 2 && m->term == 0) m->k->copy(m->sum, own, chunk_bytes(m));
    else if (m->R > 2) m->k->residual_forward(m->sum, m->sum, own, m->len);
    m->term++;
    return PIPERT_OK;
}

static void term_arrived(pt_device_mean *m)
{
    if (!pt_request_on_device(m->recv))
        m->k->copy_to_device(m->recv_into, m->host_in, chunk_bytes(m));
    pt_request_free(m->recv);
    m->recv = NULL;
    if (m->R > 2 && m->term > 0) m->k->residual_forward(m->sum, m->sum, m->incoming, m->len);
    m->term++;
}

/* Every member copied this chunk of ours: it becomes the mean. */
static void finish_chunk(pt_device_mean *m)
{
    float *own = m->data + m->at;
    if (m->R == 2) m->k->residual_forward(own, own, m->incoming, m->len);
    else m->k->copy(own, m->sum, chunk_bytes(m));
    m->k->scale(own, 1.0f / (float)m->R, m->len);
}

/* ---- driving it ----------------------------------------------------------- */

/* rc, its message prefixed with where the mean was: `what` (a member, or -1: all of them). */
static pipert_result failed(pt_device_mean *m, pipert_result rc, const char *what, int member)
{
    char whom[32] = "the others";
    if (member >= 0) snprintf(whom, sizeof whom, "member %d", member);
    pt_error_prefix("device mean over %d members: %s %s, chunk %zu of %zu (%zu floats)", m->R,
                    what, whom, m->index + 1, m->chunks, m->len);
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
static pipert_result advance(pt_device_mean *m, pt_request **blocking)
{
    while (m->index < m->chunks) {
        pipert_result rc = PIPERT_OK;
        if (m->recv) {
            if (!pt_request_test(m->recv, &rc)) return waiting_for(m->recv, blocking);
            if (rc != PIPERT_OK) return failed(m, rc, "receiving from", m->term);
            term_arrived(m);
            continue;
        }
        if (m->term < m->R) {
            rc = take_term(m);
            if (rc != PIPERT_OK) return failed(m, rc, "posting the receive from", m->term);
            continue;
        }
        for (int j = 0; j < m->R; j++) {
            if (!m->sends[j]) continue;
            if (!pt_request_test(m->sends[j], &rc)) return waiting_for(m->sends[j], blocking);
            if (rc != PIPERT_OK) return failed(m, rc, "sending to", j);
            pt_request_free(m->sends[j]);
            m->sends[j] = NULL;
        }
        finish_chunk(m);
        if (++m->index < m->chunks && (rc = begin_chunk(m)) != PIPERT_OK)
            return failed(m, rc, "sending to", -1);
    }
    return PIPERT_OK;
}

/* Gives up what is in flight; a receive may still write its buffers, a send of bytes read
 * host_out: those are retired. */
static void abandon_in_flight(pt_device_mean *m)
{
    if (m->recv) {
        pt_request_abandon(m->recv);
        m->recv = NULL;
        (void)keep(&m->retired.device, &m->retired.n_device, m->incoming);
        (void)keep(&m->retired.device, &m->retired.n_device, m->sum);
        (void)keep(&m->retired.host, &m->retired.n_host, m->host_in);
        m->incoming = m->sum = m->host_in = NULL;
    }
    bool reading_host_out = false;
    for (int j = 0; j < m->R; j++)
        if (m->sends[j]) {
            pt_request_abandon(m->sends[j]);
            m->sends[j] = NULL;
            reading_host_out = m->host_out_sent;
        }
    if (reading_host_out) {
        (void)keep(&m->retired.host, &m->retired.n_host, m->host_out);
        m->host_out = NULL;
    }
    m->active = false;
}

pipert_result pt_device_mean_start(pt_device_mean *m, pt_group *g, float *data, size_t count)
{
    if (m->active)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_device_mean_start: a mean is in progress");
    m->g = g;
    m->R = pt_group_size(g);
    m->self = pt_group_index(g);
    m->data = data;
    m->count = m->R > 1 ? count : 0;
    m->chunks = (m->count + m->chunk - 1) / m->chunk;
    m->index = 0;
    m->recv = NULL;
    m->active = m->chunks == 0; /* nothing to average: the wait ends at once */
    if (m->active) return PIPERT_OK;
    PT_TRY(ensure_buffers(m, (count + m->chunks - 1) / m->chunks, m->R));
    m->ticket = pt_group_take_ticket(g);
    m->k->synchronize(); /* the members copy what the kernels wrote, not what they will */
    m->active = true;
    pipert_result rc = begin_chunk(m);
    if (rc != PIPERT_OK) {
        abandon_in_flight(m);
        return failed(m, rc, "sending to", -1);
    }
    return PIPERT_OK;
}

pipert_result pt_device_mean_wait_for(pt_device_mean *m, double timeout_s)
{
    if (!m->active) return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_device_mean_wait_for: no mean");
    const double deadline = pt_now_s() + timeout_s;
    for (;;) {
        pt_request *blocking = NULL;
        const pipert_result rc = advance(m, &blocking);
        if (rc != PIPERT_ERR_TIMEOUT) {
            if (rc != PIPERT_OK) abandon_in_flight(m);
            m->active = false;
            return rc;
        }
        const double left = deadline - pt_now_s();
        if (left <= 0) return PIPERT_ERR_TIMEOUT;
        (void)pt_request_wait(blocking, left);
    }
}

void pt_device_mean_abandon(pt_device_mean *m)
{
    if (m->active) abandon_in_flight(m);
}
