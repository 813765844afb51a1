/* pt_exchange between 1..4 real processes on this host, every mean compared
 * with a serial computation of the same thing here (multiprocess.h):
 *   none      quarter-integer inputs, so every order of fp32 additions gives
 *             the exact sum: the ring's mean equals the serial one exactly;
 *   int8/e3m0/e2m1  each member's vector encoded, decoded and added in member
 *             order, divided by W: bitwise what every member must get;
 *   onebit    a serial simulation of the two-phase algorithm written from
 *             ALGORITHMS.md §4.6 without the codec (scales, signs, worker
 *             and server error feedback over several rounds, with the state
 *             saved and restored between rounds): bitwise equal.
 * The bytes each member reports are checked against the formulas, and
 * abandoned exchanges against ASan (the build-san configuration): after
 * pt_exchange_abandon the output buffer and the state are freed at once. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp/exchange.h"
#include "comm/collectives.h"

#define JOB_SECRET "exchange test"
#define JOB_ID 9u
#define JOB_DEADLINE_S 90.0
#define JOB_CONNECT_TIMEOUT_S 20.0
#define JOB_CONNECT_ALL_TIMEOUT_S 30.0
#include "multiprocess.h"

#define BLOCK 64
static const char *const codec_names[] = {"none", "int8", "e3m0", "e2m1", "onebit"};
enum { N_CODECS = 5, ONEBIT = 4 };

/* For the serial references, which run inside the children: no Criterion asserts there. */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond);                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void run_ranks(int n, rank_body body)
{
    job_spec spec = {.n = n, .body = body, .mesh = 1};
    RUN_JOB(spec);
}

static pt_group *make_group(rank_context *ctx, const int *ranks, int n_ranks, uint32_t id)
{
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.id = id;
    options.checksum = 1;
    pt_group *g = NULL;
    if (pt_group_create(ctx->t, ranks, n_ranks, &options, &g) != PIPERT_OK)
        fprintf(stderr, "rank %d: pt_group_create: %s\n", ctx->rank, pipert_last_error());
    return g;
}


/* ---- inputs ----------------------------------------------------------------- */

/* Member r's element i in round `round` of codec k: quarter-integers in
 * [−12, 12] for none (exact sums), smooth values of mixed size otherwise. */
static float input(int k, int r, size_t i, int round)
{
    if (k == 0)
        return (float)((int)((r * 7919u + i * 31u + (unsigned)round * 101u) % 97u) - 48) / 4;
    return (float)(sin(0.37 * r + 0.011 * (double)i + 1.7 * round) * (1 + (double)(i % 7)));
}

static void fill_input(int k, int r, size_t n, int round, float *x)
{
    for (size_t i = 0; i < n; i++) x[i] = input(k, r, i, round);
}

/* ---- serial references ------------------------------------------------------- */

static void serial_none(int W, size_t n, int round, float *mean)
{
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (int r = 0; r < W; r++) sum += input(0, r, i, round);
        mean[i] = (float)sum / (float)W;
    }
}

/* Encode each member's vector, decode it, add in member order, divide by W. */
static void serial_gather(int k, int W, size_t n, int round, float *mean)
{
    pt_codec codec;
    REQUIRE(pt_codec_init(&codec, (pt_codec_kind)k, BLOCK) == PIPERT_OK);
    float *x = malloc((n + 1) * sizeof *x), *decoded = malloc((n + 1) * sizeof *decoded);
    unsigned char *buffer = malloc(pt_codec_encoded_bytes(&codec, n) + 1);
    REQUIRE(x && decoded && buffer);
    for (int r = 0; r < W; r++) {
        fill_input(k, r, n, round, x);
        REQUIRE(pt_codec_encode(&codec, x, n, NULL, buffer) == PIPERT_OK);
        pt_codec_decode(&codec, buffer, n, decoded);
        for (size_t i = 0; i < n; i++) mean[i] = r == 0 ? decoded[i] : mean[i] + decoded[i];
    }
    for (size_t i = 0; i < n; i++) mean[i] /= (float)W;
    free(x), free(decoded), free(buffer);
}

/* 1-bit compression with error feedback of v[0..m) = x + e, in place:
 * sent[i] = ±s (s = ‖v‖₂/√m, sign of 0 is +), e = v − sent. */
static void onebit_compress(const float *x, float *error, size_t m, float *sent)
{
    double squares = 0;
    for (size_t i = 0; i < m; i++) {
        const float v = x[i] + error[i];
        squares += (double)v * v;
    }
    const float s = m ? (float)sqrt(squares / (double)m) : 0.0f;
    for (size_t i = 0; i < m; i++) {
        const float v = x[i] + error[i];
        sent[i] = v < 0 ? -s : s;
        error[i] = v - sent[i];
    }
}

/* Every member's worker error and every chunk's server error, across rounds. */
typedef struct onebit_sim {
    int W;
    size_t n, chunk;
    float *worker[MAX_RANKS], *server[MAX_RANKS];
} onebit_sim;

static void sim_init(onebit_sim *s, int W, size_t n)
{
    const size_t unit = 8 * (size_t)W;
    *s = (onebit_sim){.W = W, .n = n, .chunk = (n + unit - 1) / unit * unit / (size_t)W};
    for (int r = 0; r < W; r++) {
        s->worker[r] = calloc(n + 1, sizeof(float));
        s->server[r] = calloc(s->chunk + 1, sizeof(float));
        REQUIRE(s->worker[r] && s->server[r]);
    }
}

static void sim_free(onebit_sim *s)
{
    for (int r = 0; r < s->W; r++) free(s->worker[r]), free(s->server[r]);
}

static size_t sim_inside(const onebit_sim *s, int j)
{
    const size_t begin = (size_t)j * s->chunk;
    return s->n <= begin ? 0 : (s->n - begin < s->chunk ? s->n - begin : s->chunk);
}

/* One round: every member compresses its whole vector; member j averages
 * chunk j over the members in order, adds its server error and compresses
 * that chunk again; the result is the concatenation. */
static void serial_onebit(onebit_sim *s, int round, float *mean)
{
    const int W = s->W;
    const size_t n = s->n;
    float *sent[MAX_RANKS], *x = malloc((n + 1) * sizeof *x),
                            *average = malloc((s->chunk + 1) * sizeof *average);
    REQUIRE(x && average);
    for (int r = 0; r < W; r++) {
        sent[r] = malloc((n + 1) * sizeof(float));
        REQUIRE(sent[r]);
        fill_input(ONEBIT, r, n, round, x);
        onebit_compress(x, s->worker[r], n, sent[r]);
    }
    for (int j = 0; j < W; j++) {
        const size_t begin = (size_t)j * s->chunk, m = sim_inside(s, j);
        for (size_t i = 0; i < m; i++) {
            float sum = sent[0][begin + i];
            for (int r = 1; r < W; r++) sum += sent[r][begin + i];
            average[i] = sum / (float)W;
        }
        onebit_compress(average, s->server[j], m, mean + begin);
    }
    for (int r = 0; r < W; r++) free(sent[r]);
    free(x), free(average);
}

/* ---- bytes ------------------------------------------------------------------- */

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* What member i of W sends, from the formulas of ALGORITHMS.md §4.6 and the ring. */
static size_t expected_bytes(int k, size_t n, int W, int i)
{
    if (W == 1 || n == 0) return 0;
    size_t bytes = 0;
    switch (k) {
    case 0: /* ring: reduce-scatter step s sends chunk i − s, all-gather step s chunk i + 1 − s */
        for (int s = 0; s < W - 1; s++)
            for (int gathering = 0; gathering < 2; gathering++) {
                const int chunk = ((i - s + gathering) % W + W) % W;
                bytes += 4 * (n / (size_t)W + ((size_t)chunk < n % (size_t)W));
            }
        return bytes;
    case 1: return (size_t)(W - 1) * (n + 4 * ceil_div(n, BLOCK));
    case 2:
    case 3: return (size_t)(W - 1) * (ceil_div(n, 2) + 4 * ceil_div(n, BLOCK));
    default: {
        const size_t chunk = ceil_div(n, 8 * (size_t)W) * 8; /* N / W */
        return 2 * (size_t)(W - 1) * (4 + chunk / 8);
    }
    }
}

/* ---- every codec, several sizes and rounds, all codecs in flight at once ---- */

/* The onebit state survives a checkpoint: its buffers copied out, a new state
 * made, and the copies put back. */
static pt_exchange_state *save_and_restore(rank_context *ctx, pt_group *g, size_t n,
                                           pt_exchange_state *old)
{
    size_t worker_count, server_count;
    const float *worker = pt_exchange_state_worker_error(old, &worker_count);
    const float *server = pt_exchange_state_server_error(old, &server_count);
    float *saved = malloc((worker_count + server_count + 1) * sizeof *saved);
    if (!saved) return NULL;
    memcpy(saved, worker, worker_count * sizeof *saved);
    memcpy(saved + worker_count, server, server_count * sizeof *saved);
    pt_exchange_state_free(old);
    pt_exchange_state *fresh = NULL;
    if (pt_exchange_state_create(g, n, &fresh) == PIPERT_OK) {
        size_t w, s;
        float *fresh_worker = pt_exchange_state_worker_error(fresh, &w);
        float *fresh_server = pt_exchange_state_server_error(fresh, &s);
        if (w != worker_count || s != server_count) {
            fprintf(stderr, "rank %d: restored state sizes %zu/%zu, saved %zu/%zu\n", ctx->rank, w,
                    s, worker_count, server_count);
            pt_exchange_state_free(fresh);
            fresh = NULL;
        } else {
            memcpy(fresh_worker, saved, w * sizeof *saved);
            memcpy(fresh_server, saved + w, s * sizeof *saved);
        }
    }
    free(saved);
    return fresh;
}

/* Runs ROUNDS rounds of every codec on g (member `me` of W gives the inputs of
 * member `me`), and compares each mean with the serial one. */
static int exchange_every_codec(rank_context *ctx, pt_group *g)
{
    enum { ROUNDS = 3 };
    const int W = pt_group_size(g), me = pt_group_index(g);
    static const size_t sizes[] = {0, 1, 7, 100, 1000, 100003};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const size_t n = sizes[z];
        pt_codec codecs[N_CODECS];
        float *data[N_CODECS], *out[N_CODECS], *mean = malloc((n + 1) * sizeof *mean);
        pt_exchange_state *state = NULL;
        onebit_sim sim;
        sim_init(&sim, W, n);
        CHILD_CHECK(ctx, pt_exchange_state_create(g, n, &state) == PIPERT_OK, "state");
        for (int k = 0; k < N_CODECS; k++) {
            CHILD_CHECK(ctx, pt_codec_init(&codecs[k], (pt_codec_kind)k, BLOCK) == PIPERT_OK,
                        "codec");
            data[k] = malloc((n + 1) * sizeof(float));
            out[k] = malloc((n + 1) * sizeof(float));
            CHILD_CHECK(ctx, data[k] && out[k] && mean, "no memory");
        }
        for (int round = 0; round < ROUNDS; round++) {
            pt_exchange *handles[N_CODECS];
            for (int k = 0; k < N_CODECS; k++) {
                fill_input(k, me, n, round, data[k]);
                CHILD_CHECK(ctx,
                            pt_exchange_start(g, &codecs[k], state, data[k], n, out[k],
                                              &handles[k]) == PIPERT_OK,
                            "start %s of %zu", codec_names[k], n);
                const size_t bytes = pt_exchange_bytes_sent(handles[k]),
                             want = expected_bytes(k, n, W, me);
                CHILD_CHECK(ctx, bytes == want, "%s of %zu over %d: %zu bytes sent, expected %zu",
                            codec_names[k], n, W, bytes, want);
                /* The input may be reused as soon as start returns. */
                for (size_t i = 0; i < n; i++) data[k][i] = NAN;
            }
            for (int k = N_CODECS; k-- > 0;)
                CHILD_CHECK(ctx, pt_exchange_wait(handles[k]) == PIPERT_OK, "%s of %zu, round %d",
                            codec_names[k], n, round);
            for (int k = 0; k < N_CODECS; k++) {
                if (k == 0)
                    serial_none(W, n, round, mean);
                else if (k == ONEBIT)
                    serial_onebit(&sim, round, mean);
                else
                    serial_gather(k, W, n, round, mean);
                for (size_t i = 0; i < n; i++)
                    CHILD_CHECK(ctx, out[k][i] == mean[i],
                                "%s over %d members, %zu elements, round %d: element %zu is "
                                "%.9g, the serial mean is %.9g",
                                codec_names[k], W, n, round, i, out[k][i], mean[i]);
            }
            state = save_and_restore(ctx, g, n, state);
            CHILD_CHECK(ctx, state, "state after a save and restore");
        }
        for (int k = 0; k < N_CODECS; k++) free(data[k]), free(out[k]);
        free(mean);
        sim_free(&sim);
        pt_exchange_state_free(state);
    }
    return 0;
}

static int every_codec_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 1);
    CHILD_CHECK(ctx, g, "group");
    if (exchange_every_codec(ctx, g)) return 1;
    pt_group_destroy(g);
    /* And each alone: a group of one runs the same algorithm, without messages. */
    g = make_group(ctx, &ctx->rank, 1, 2);
    CHILD_CHECK(ctx, g, "group of one");
    if (exchange_every_codec(ctx, g)) return 1;
    pt_group_destroy(g);
    return 0;
}

Test(exchange, every_codec_2_ranks_and_alone) { run_ranks(2, every_codec_body); }
Test(exchange, every_codec_3_ranks_and_alone) { run_ranks(3, every_codec_body); }
Test(exchange, every_codec_4_ranks_and_alone) { run_ranks(4, every_codec_body); }

/* ---- refusals ---------------------------------------------------------------- */

/* A refused start sends nothing and takes no place in the group's order: the
 * collectives after it still match. */
static int refusals_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    enum { N = 300 };
    static float data[N], out[N];
    for (size_t i = 0; i < N; i++) data[i] = (float)i;
    pt_codec int8, onebit;
    CHILD_CHECK(ctx, pt_codec_init(&int8, PT_CODEC_INT8, BLOCK) == PIPERT_OK, "int8");
    CHILD_CHECK(ctx, pt_codec_init(&onebit, PT_CODEC_ONEBIT, BLOCK) == PIPERT_OK, "onebit");
    pt_exchange *h = NULL;
    if (ctx->rank == 1) { /* only this member has a bad value: it alone refuses */
        data[123] = NAN;
        CHILD_CHECK(ctx,
                    pt_exchange_start(g, &int8, NULL, data, N, out, &h) == PIPERT_ERR_INVALID_ARG &&
                        !h && strstr(pipert_last_error(), "element 123 "),
                    "NaN refused naming its index: %s", pipert_last_error());
        data[123] = 123;
    }
    CHILD_CHECK(ctx,
                pt_exchange_start(g, &onebit, NULL, data, N, out, &h) == PIPERT_ERR_INVALID_ARG,
                "onebit without a state");
    pt_exchange_state *state, *other;
    CHILD_CHECK(ctx, pt_exchange_state_create(g, N, &state) == PIPERT_OK, "state");
    CHILD_CHECK(ctx, pt_exchange_state_create(g, N + 1, &other) == PIPERT_OK, "other state");
    CHILD_CHECK(ctx,
                pt_exchange_start(g, &onebit, other, data, N, out, &h) == PIPERT_ERR_INVALID_ARG,
                "a state of another size");
    /* Every member's first exchange that starts: one in flight on `state`. */
    CHILD_CHECK(ctx, pt_exchange_start(g, &onebit, state, data, N, out, &h) == PIPERT_OK, "start");
    pt_exchange *second = NULL;
    CHILD_CHECK(ctx,
                pt_exchange_start(g, &onebit, state, data, N, out, &second) ==
                        PIPERT_ERR_INVALID_ARG &&
                    strstr(pipert_last_error(), "in use"),
                "a busy state: %s", pipert_last_error());
    CHILD_CHECK(ctx, pt_exchange_wait(h) == PIPERT_OK, "wait");
    /* Everyone agrees on what came out, so the order held. */
    float sum = 0;
    for (size_t i = 0; i < N; i++) sum += out[i];
    float sums[MAX_RANKS];
    CHILD_CHECK(ctx, pt_allgather(g, &sum, sizeof sum, sums) == PIPERT_OK, "allgather");
    for (int r = 0; r < ctx->n; r++) CHILD_CHECK(ctx, sums[r] == sum, "member %d differs", r);
    pt_exchange_state_free(state);
    pt_exchange_state_free(other);
    pt_group_destroy(g);
    return 0;
}

Test(exchange, refusals_send_nothing) { run_ranks(3, refusals_body); }

/* ---- waits that give up ------------------------------------------------------ */

/* Member 0 starts, times out waiting, abandons, and at once frees its output
 * buffer and its state: an exchange that wrote to either afterwards is a use
 * after free under ASan, one that never freed itself a leak at the child's
 * leak check. Only then (a barrier on a second group, whose order is its
 * own) do the others start; they still get the right mean. Then one
 * exchange that ended before its abandon. */
static int abandon_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 4), *signal = whole_group(ctx, 6);
    CHILD_CHECK(ctx, g && signal, "groups");
    const int W = ctx->n, me = ctx->rank;
    enum { N = 50000 };
    for (int k = 0; k < N_CODECS; k++) {
        pt_codec codec;
        CHILD_CHECK(ctx, pt_codec_init(&codec, (pt_codec_kind)k, BLOCK) == PIPERT_OK, "codec");
        float *data = malloc(N * sizeof *data), *out = malloc(N * sizeof *out);
        CHILD_CHECK(ctx, data && out, "no memory");
        fill_input(k, me, N, 0, data);
        pt_exchange_state *state;
        CHILD_CHECK(ctx, pt_exchange_state_create(g, N, &state) == PIPERT_OK, "state");
        if (me != 0) CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "member 0 abandoned");
        pt_exchange *h;
        CHILD_CHECK(ctx, pt_exchange_start(g, &codec, state, data, N, out, &h) == PIPERT_OK,
                    "start %s", codec_names[k]);
        if (me == 0) {
            CHILD_CHECK(ctx, pt_exchange_wait_for(h, 0.05) == PIPERT_ERR_TIMEOUT,
                        "%s: the others are late", codec_names[k]);
            CHILD_CHECK(ctx, !pt_exchange_test(h), "not ended");
            pt_exchange_abandon(h);
            free(out);
            pt_exchange_state_free(state);
            CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "signal the others");
        } else {
            CHILD_CHECK(ctx, pt_exchange_wait(h) == PIPERT_OK, "%s", codec_names[k]);
            float *mean = malloc(N * sizeof *mean);
            CHILD_CHECK(ctx, mean, "no memory");
            if (k == 0)
                serial_none(W, N, 0, mean);
            else if (k == ONEBIT) {
                onebit_sim sim;
                sim_init(&sim, W, N);
                serial_onebit(&sim, 0, mean);
                sim_free(&sim);
            } else
                serial_gather(k, W, N, 0, mean);
            for (size_t i = 0; i < N; i++)
                CHILD_CHECK(ctx, out[i] == mean[i], "%s: element %zu", codec_names[k], i);
            free(mean);
            free(out);
            pt_exchange_state_free(state);
        }
        free(data);
        CHILD_CHECK(ctx, pt_barrier(g) == PIPERT_OK, "barrier after %s", codec_names[k]);
    }
    /* Abandoning one that has ended frees it at once. */
    pt_codec e2m1;
    CHILD_CHECK(ctx, pt_codec_init(&e2m1, PT_CODEC_E2M1, BLOCK) == PIPERT_OK, "codec");
    static float small[100], small_out[100];
    pt_exchange *h;
    CHILD_CHECK(ctx, pt_exchange_start(g, &e2m1, NULL, small, 100, small_out, &h) == PIPERT_OK,
                "start");
    while (!pt_exchange_test(h)) usleep(1000);
    pt_exchange_abandon(h);
    /* Abandoned exchanges may still be running on g: the transport goes first. */
    pt_transport_destroy(ctx->t);
    ctx->t = NULL;
    pt_group_destroy(g);
    pt_group_destroy(signal);
    return 0;
}

Test(exchange, abandoned_waits_neither_crash_nor_leak_2_ranks) { run_ranks(2, abandon_body); }
Test(exchange, abandoned_waits_neither_crash_nor_leak_4_ranks) { run_ranks(4, abandon_body); }

/* Member 0 abandons and leaves (destroys its transport) before the other
 * starts: its exchange ends when the transport closes and frees itself;
 * the other's fails naming the member that left. */
static int abandon_and_leave_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 5);
    CHILD_CHECK(ctx, g, "group");
    enum { N = 20000 };
    static float data[N], out[N];
    pt_codec codec;
    CHILD_CHECK(ctx, pt_codec_init(&codec, PT_CODEC_ONEBIT, BLOCK) == PIPERT_OK, "codec");
    pt_exchange_state *state;
    CHILD_CHECK(ctx, pt_exchange_state_create(g, N, &state) == PIPERT_OK, "state");
    pt_exchange *h;
    if (ctx->rank == 0) {
        CHILD_CHECK(ctx, pt_exchange_start(g, &codec, state, data, N, out, &h) == PIPERT_OK,
                    "start");
        pt_exchange_abandon(h);
        pt_exchange_state_free(state);
        pt_transport_destroy(ctx->t); /* the exchange ends here, then the group may go */
        ctx->t = NULL;
        pt_group_destroy(g);
        return 0;
    }
    while (pt_transport_peer_alive(ctx->t, 0)) usleep(10000);
    CHILD_CHECK(ctx, pt_exchange_start(g, &codec, state, data, N, out, &h) == PIPERT_OK, "start");
    pipert_result rc = pt_exchange_wait(h);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "rank 0"),
                "the exchange fails naming the member that left: %s", pipert_last_error());
    pt_exchange_state_free(state);
    pt_group_destroy(g);
    return 0;
}

Test(exchange, abandoned_then_the_transport_closes) { run_ranks(2, abandon_and_leave_body); }
