/* pt_exchange: the mean of a vector over a group, with a codec, as a chain of
 * non-blocking collectives whose callbacks do the decoding and averaging on
 * the transport's progress thread (dp/exchange.h). */
#include "dp/exchange.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESSAGE_CAPACITY 512

/* ---- onebit's layout ------------------------------------------------------ */

/* The vector padded to a multiple of 8W and cut into W chunks of `chunk`
 * elements; a member's message for one chunk is a scale and its signs. */
typedef struct onebit_layout {
    size_t chunk;       /* C, a multiple of 8 */
    size_t chunk_bytes; /* 4 + C/8 */
} onebit_layout;

static onebit_layout onebit_layout_of(size_t n, int members)
{
    const size_t unit = 8 * (size_t)members, padded = (n + unit - 1) / unit * unit;
    const size_t chunk = padded / (size_t)members;
    return (onebit_layout){.chunk = chunk, .chunk_bytes = sizeof(float) + chunk / 8};
}

/* Elements of chunk k that are inside the vector (not padding). */
static size_t chunk_inside(size_t n, size_t chunk, int k)
{
    const size_t begin = (size_t)k * chunk;
    if (n <= begin) return 0;
    return n - begin < chunk ? n - begin : chunk;
}

/* ---- the state: onebit's error feedback ----------------------------------- */

struct pt_exchange_state {
    size_t n;
    int members, index;  /* the group it was made for */
    float *worker_error; /* [n] */
    float *server_error; /* [server_count]: this member's chunk, inside the vector */
    size_t server_count;
    atomic_int references; /* its owner's, and that of the exchange using it */
    atomic_int busy;       /* an exchange uses it */
};

pipert_result pt_exchange_state_create(const pt_group *g, size_t n, pt_exchange_state **out)
{
    *out = NULL;
    pt_exchange_state *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "exchange state: out of memory");
    s->n = n;
    s->members = pt_group_size(g);
    s->index = pt_group_index(g);
    s->server_count = chunk_inside(n, onebit_layout_of(n, s->members).chunk, s->index);
    s->worker_error = calloc(n ? n : 1, sizeof *s->worker_error);
    s->server_error = calloc(s->server_count ? s->server_count : 1, sizeof *s->server_error);
    atomic_init(&s->references, 1);
    atomic_init(&s->busy, 0);
    if (!s->worker_error || !s->server_error) {
        pt_exchange_state_free(s);
        return pt_fail(PIPERT_ERR_NOMEM, "exchange state: no memory for %zu elements", n);
    }
    *out = s;
    return PIPERT_OK;
}

static void state_unref(pt_exchange_state *s)
{
    if (atomic_fetch_sub(&s->references, 1) != 1) return;
    free(s->worker_error);
    free(s->server_error);
    free(s);
}

void pt_exchange_state_free(pt_exchange_state *s)
{
    if (s) state_unref(s);
}

float *pt_exchange_state_worker_error(pt_exchange_state *s, size_t *count)
{
    *count = s->n;
    return s->worker_error;
}

float *pt_exchange_state_server_error(pt_exchange_state *s, size_t *count)
{
    *count = s->server_count;
    return s->server_error;
}

/* Takes the state for one exchange of n elements over g. */
static pipert_result state_acquire(pt_exchange_state *s, const pt_group *g, size_t n)
{
    if (!s)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "onebit exchange: no state to keep its error feedback in");
    if (s->n != n || s->members != pt_group_size(g) || s->index != pt_group_index(g))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "onebit exchange of %zu elements as member %d of %d: its state was made "
                       "for %zu elements as member %d of %d",
                       n, pt_group_index(g), pt_group_size(g), s->n, s->index, s->members);
    int idle = 0;
    if (!atomic_compare_exchange_strong(&s->busy, &idle, 1))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "onebit exchange: its state is in use by an exchange that has not ended");
    atomic_fetch_add(&s->references, 1);
    return PIPERT_OK;
}

static void state_release(pt_exchange_state *s)
{
    atomic_store(&s->busy, 0);
    state_unref(s);
}

/* ---- the exchange --------------------------------------------------------- */

typedef enum exchange_path {
    PATH_RING,   /* none: the fp32 ring all-reduce */
    PATH_GATHER, /* int8, e3m0, e2m1: all-gather the encodings */
    PATH_ONEBIT, /* onebit: all-to-all, server compression, all-gather */
} exchange_path;

/* Who may touch `out`: the exchange until the caller abandons it; once the
 * exchange starts writing the mean, abandoning waits for the end instead. */
enum { OUT_OPEN, OUT_ABANDONED, OUT_WRITING };

struct pt_exchange {
    pt_group *g;
    pt_codec codec;
    exchange_path path;
    pt_exchange_state *state; /* onebit: held until the exchange is freed */
    size_t n;
    float *out; /* the caller's [n] */
    atomic_int out_claim;
    pt_completion *completion;
    pt_group_ticket tickets[2]; /* the places of its collectives in the group's order */
    size_t bytes_sent;
    char name[96];
    /* Buffers, by path:
     *   ring    values [n]: the vector being all-reduced
     *   gather  send [each = encoded bytes], recv [W·each]
     *   onebit  send [W·each] (each = 4 + C/8): what goes to each member;
     *           later its first `each` bytes: this member's compressed mean
     *           recv [W·each]: the chunks from every member, then the
     *           compressed means of every chunk
     *           values [C]: the server's mean of its chunk */
    float *values;
    unsigned char *send, *recv;
    size_t each;
};

static exchange_path path_of(const pt_codec *codec)
{
    switch (codec->kind) {
    case PT_CODEC_NONE: return PATH_RING;
    case PT_CODEC_ONEBIT: return PATH_ONEBIT;
    default: return PATH_GATHER;
    }
}

static void exchange_free(pt_exchange *ex)
{
    if (ex->state) state_release(ex->state);
    free(ex->values);
    free(ex->send);
    free(ex->recv);
    free(ex);
}

static void exchange_release(void *owner) { exchange_free(owner); }

/* Allocates the path's buffers (zeroed: onebit's padding bits stay 0) and
 * counts the bytes this member will send. */
static pipert_result exchange_allocate(pt_exchange *ex)
{
    const int W = pt_group_size(ex->g);
    size_t values = 0, send = 0, recv = 0;
    switch (ex->path) {
    case PATH_RING:
        values = ex->n;
        ex->bytes_sent = pt_allreduce_bytes_sent(ex->g, ex->n);
        break;
    case PATH_GATHER:
        ex->each = pt_codec_encoded_bytes(&ex->codec, ex->n);
        send = ex->each;
        recv = (size_t)W * ex->each;
        ex->bytes_sent = (size_t)(W - 1) * ex->each;
        break;
    case PATH_ONEBIT: {
        const onebit_layout layout = onebit_layout_of(ex->n, W);
        ex->each = layout.chunk_bytes;
        values = layout.chunk;
        send = recv = (size_t)W * ex->each;
        ex->bytes_sent = 2 * (size_t)(W - 1) * ex->each;
        break;
    }
    }
    if (ex->n == 0) ex->bytes_sent = 0;
    ex->values = calloc(values ? values : 1, sizeof *ex->values);
    ex->send = calloc(send ? send : 1, 1);
    ex->recv = calloc(recv ? recv : 1, 1);
    if (!ex->values || !ex->send || !ex->recv)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", ex->name);
    return PIPERT_OK;
}

/* Encodes (or, for none, checks and copies) the caller's vector: the one
 * quantization of this member's values. */
static pipert_result exchange_encode(pt_exchange *ex, const float *data)
{
    switch (ex->path) {
    case PATH_RING: return pt_codec_encode(&ex->codec, data, ex->n, NULL, ex->values);
    case PATH_GATHER: return pt_codec_encode(&ex->codec, data, ex->n, NULL, ex->send);
    case PATH_ONEBIT: break;
    }
    /* The whole vector is encoded with one scale into recv (scratch until the
     * all-to-all fills it, and large enough: W·(4 + C/8) >= 4 + N/8; zeroed,
     * so the signs of the padding are 0), as [scale][signs]; member j's block
     * is that scale and the C/8 bytes of signs of chunk j. */
    const int W = pt_group_size(ex->g);
    const size_t chunk_signs = ex->each - sizeof(float);
    PT_TRY(pt_codec_encode(&ex->codec, data, ex->n, ex->state->worker_error, ex->recv));
    for (int j = 0; j < W; j++) {
        unsigned char *block = ex->send + (size_t)j * ex->each;
        memcpy(block, ex->recv, sizeof(float));
        memcpy(block + sizeof(float), ex->recv + sizeof(float) + (size_t)j * chunk_signs,
               chunk_signs);
    }
    return PIPERT_OK;
}

/* out[0..m) = the mean of the W encodings of m elements at encodings[r·stride],
 * added in member order in fp32 and divided by W: the same on every member. */
static void mean_of_encodings(const pt_codec *codec, const unsigned char *encodings, size_t stride,
                              int W, size_t m, float *out)
{
    pt_codec_decode(codec, encodings, m, out);
    for (int r = 1; r < W; r++) pt_codec_decode_add(codec, encodings + (size_t)r * stride, m, out);
    for (size_t i = 0; i < m; i++) out[i] /= (float)W;
}

/* 1 if the exchange may write the mean into out (the caller still wants it). */
static int claim_out(pt_exchange *ex)
{
    int open = OUT_OPEN;
    return atomic_compare_exchange_strong(&ex->out_claim, &open, OUT_WRITING);
}

static void exchange_end(pt_exchange *ex, pipert_result result, const char *message)
{
    char why[MESSAGE_CAPACITY] = "";
    if (result != PIPERT_OK) snprintf(why, sizeof why, "%s: %s", ex->name, message);
    pt_completion_finish(ex->completion, result, why); /* may free ex (abandoned) */
}

/* ---- the callbacks, on the progress thread --------------------------------- */

static void ring_done(void *arg, pipert_result result, const char *message)
{
    pt_exchange *ex = arg;
    if (result == PIPERT_OK && claim_out(ex)) memcpy(ex->out, ex->values, ex->n * sizeof(float));
    exchange_end(ex, result, message);
}

static void gather_done(void *arg, pipert_result result, const char *message)
{
    pt_exchange *ex = arg;
    if (result == PIPERT_OK && claim_out(ex))
        mean_of_encodings(&ex->codec, ex->recv, ex->each, pt_group_size(ex->g), ex->n, ex->out);
    exchange_end(ex, result, message);
}

static void onebit_gathered(void *arg, pipert_result result, const char *message)
{
    pt_exchange *ex = arg;
    if (result == PIPERT_OK && claim_out(ex)) {
        const size_t chunk = onebit_layout_of(ex->n, pt_group_size(ex->g)).chunk;
        for (int k = 0; (size_t)k * chunk < ex->n; k++) /* chunks of padding only: nothing */
            pt_codec_decode(&ex->codec, ex->recv + (size_t)k * ex->each,
                            chunk_inside(ex->n, chunk, k), ex->out + (size_t)k * chunk);
    }
    exchange_end(ex, result, message);
}

/* Member j got chunk j from everyone: average it, compress it once more with
 * the server error into send[0..each), and all-gather the compressed means. */
static void onebit_scattered(void *arg, pipert_result result, const char *message)
{
    pt_exchange *ex = arg;
    if (result != PIPERT_OK) {
        exchange_end(ex, result, message);
        return;
    }
    const size_t m = ex->state->server_count;
    mean_of_encodings(&ex->codec, ex->recv, ex->each, pt_group_size(ex->g), m, ex->values);
    memset(ex->send, 0, ex->each);
    pipert_result rc =
        pt_codec_encode(&ex->codec, ex->values, m, ex->state->server_error, ex->send);
    if (rc == PIPERT_OK)
        rc = pt_allgather_then(ex->g, ex->tickets[1], ex->send, ex->each, ex->recv, onebit_gathered,
                               ex);
    if (rc != PIPERT_OK) exchange_end(ex, rc, pipert_last_error());
}

/* Starts the first collective; a failure ends the exchange through its completion. */
static void exchange_launch(pt_exchange *ex)
{
    if (ex->n == 0) {
        exchange_end(ex, PIPERT_OK, "");
        return;
    }
    pipert_result rc = PIPERT_OK;
    switch (ex->path) {
    case PATH_RING:
        rc = pt_allreduce_then(ex->g, ex->tickets[0], ex->values, ex->n, PT_REDUCE_MEAN, ring_done,
                               ex);
        break;
    case PATH_GATHER:
        rc =
            pt_allgather_then(ex->g, ex->tickets[0], ex->send, ex->each, ex->recv, gather_done, ex);
        break;
    case PATH_ONEBIT:
        rc = pt_alltoall_then(ex->g, ex->tickets[0], ex->send, ex->each, ex->recv, onebit_scattered,
                              ex);
        break;
    }
    if (rc != PIPERT_OK) exchange_end(ex, rc, pipert_last_error());
}

/* ---- the caller's side ----------------------------------------------------- */

pipert_result pt_exchange_start(pt_group *g, const pt_codec *codec, pt_exchange_state *state,
                                const float *data, size_t n, float *out, pt_exchange **handle)
{
    *handle = NULL;
    if (n > 0 && (!data || !out))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "exchange: %zu elements but no %s", n,
                       data ? "output" : "data");
    const exchange_path path = path_of(codec);
    if (path == PATH_ONEBIT) PT_TRY(state_acquire(state, g, n));
    pt_exchange *ex = calloc(1, sizeof *ex);
    if (!ex) {
        if (path == PATH_ONEBIT) state_release(state);
        return pt_fail(PIPERT_ERR_NOMEM, "exchange: out of memory");
    }
    *ex = (pt_exchange){.g = g,
                        .codec = *codec,
                        .path = path,
                        .n = n,
                        .out = out,
                        .state = path == PATH_ONEBIT ? state : NULL};
    atomic_init(&ex->out_claim, OUT_OPEN);
    snprintf(ex->name, sizeof ex->name, "%s exchange of %zu elements over %d members",
             pt_codec_name(codec), n, pt_group_size(g));
    pipert_result rc = exchange_allocate(ex);
    if (rc == PIPERT_OK) rc = exchange_encode(ex, data);
    if (rc == PIPERT_OK) rc = pt_completion_create(exchange_release, ex, &ex->completion);
    if (rc != PIPERT_OK) {
        exchange_free(ex);
        return rc;
    }
    /* Nothing was refused: take this exchange's places in the group's order. */
    if (n > 0) ex->tickets[0] = pt_group_take_ticket(g);
    if (n > 0 && path == PATH_ONEBIT) ex->tickets[1] = pt_group_take_ticket(g);
    *handle = ex;
    exchange_launch(ex);
    return PIPERT_OK;
}

size_t pt_exchange_bytes_sent(const pt_exchange *ex) { return ex->bytes_sent; }

int pt_exchange_test(pt_exchange *ex) { return pt_completion_test(ex->completion); }

pipert_result pt_exchange_wait_for(pt_exchange *ex, double timeout_s)
{
    const pipert_result rc = pt_completion_wait_for(ex->completion, timeout_s);
    if (rc != PIPERT_ERR_TIMEOUT) exchange_free(ex); /* the completion freed itself */
    return rc;
}

pipert_result pt_exchange_wait(pt_exchange *ex) { return pt_exchange_wait_for(ex, -1.0); }

void pt_exchange_abandon(pt_exchange *ex)
{
    int open = OUT_OPEN;
    if (atomic_compare_exchange_strong(&ex->out_claim, &open, OUT_ABANDONED))
        pt_completion_abandon(ex->completion); /* frees ex when the exchange ends */
    else
        (void)pt_exchange_wait(ex); /* the mean is being written: no network, it ends soon */
}
