/* Collectives between 2..8 real processes on this host, each result compared
 * with a serial computation of the same thing in the test.
 *
 * Inputs are quarter-integers of small magnitude, so every sum is exact in
 * fp32 whatever the order of the additions: sums must match bitwise, and so
 * must means (the exact sum divided by n, as the test computes it). One test
 * uses inexact inputs with a stated tolerance.
 *
 * The harness is the one of multiprocess.h; every job here connects all its
 * ranks before the body runs. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/collectives.h"

#define JOB_SECRET "collectives test"
#define JOB_ID 7u
#define JOB_DEADLINE_S 90.0
#define JOB_CONNECT_TIMEOUT_S 20.0
#define JOB_CONNECT_ALL_TIMEOUT_S 30.0
#include "multiprocess.h"

/* Runs body on n connected processes; `killed` is the rank expected to die by SIGKILL (-1: none). */
static void run_ranks(int n, rank_body body, int killed)
{
    job_spec spec = {.n = n, .body = body, .mesh = 1};
    if (killed >= 0) spec.expect_killed[killed] = 1;
    RUN_JOB(spec);
}

/* ---- inputs and references ----------------------------------------------- */

/* Quarter-integers in [-12, 12]: sums of up to 8 are exact in fp32. */
static float exact_input(int rank, size_t i, int salt)
{
    return (float)((int)((rank * 7919u + i * 31u + (unsigned)salt * 101u) % 97u) - 48) * 0.25f;
}

/* Checks data[0..count) against the serial sum (or mean) over `members` of exact_input. */
static int check_exact(rank_context *ctx, const float *data, size_t count, const int *members,
                       int n_members, pt_reduce_op op, int salt, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        double sum = 0;
        for (int m = 0; m < n_members; m++) sum += exact_input(members[m], i, salt);
        float expected = op == PT_REDUCE_MEAN ? (float)sum / (float)n_members : (float)sum;
        CHILD_CHECK(ctx, data[i] == expected,
                    "%s: element %zu of %zu is %.9g, the serial %s is %.9g", what, i, count,
                    data[i], op == PT_REDUCE_MEAN ? "mean" : "sum", expected);
    }
    return 0;
}

/* ---- all-reduce ---------------------------------------------------------- */

static int allreduce_exact_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    int members[MAX_RANKS];
    for (int r = 0; r < ctx->n; r++) members[r] = r;
    /* From 100003 on, several segments per chunk (allreduce.c: up to 4 of at
     * least 64 KiB), of unequal lengths. */
    size_t counts[] = {0, 1, (size_t)ctx->n - 1, (size_t)ctx->n + 1, 7, 1000, 100003, 786437,
                       1u << 20, (1u << 20) + 3};
    float *data = malloc(((1u << 20) + 3) * sizeof *data);
    CHILD_CHECK(ctx, data, "no memory");
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        for (int op = PT_REDUCE_SUM; op <= PT_REDUCE_MEAN; op++) {
            int salt = (int)(2 * k) + op;
            for (size_t i = 0; i < counts[k]; i++) data[i] = exact_input(ctx->rank, i, salt);
            pipert_result rc = pt_allreduce(g, data, counts[k], (pt_reduce_op)op);
            CHILD_CHECK(ctx, rc == PIPERT_OK, "allreduce of %zu", counts[k]);
            char what[64];
            snprintf(what, sizeof what, "%s of %zu elements", op ? "mean" : "sum", counts[k]);
            if (check_exact(ctx, data, counts[k], members, ctx->n, (pt_reduce_op)op, salt, what))
                return 1;
        }
    }
    free(data);
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allreduce_2_ranks) { run_ranks(2, allreduce_exact_body, -1); }
Test(collectives, allreduce_3_ranks) { run_ranks(3, allreduce_exact_body, -1); }
Test(collectives, allreduce_5_ranks) { run_ranks(5, allreduce_exact_body, -1); }
Test(collectives, allreduce_8_ranks) { run_ranks(8, allreduce_exact_body, -1); }

/* Inexact inputs: within 1e-6 * n of the double-precision sum (each element
 * is at most 1 in magnitude and goes through n - 1 fp32 additions), and
 * bitwise equal on every rank (compared through an all-gather of checksums). */
static int allreduce_inexact_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    enum { COUNT = 50001 };
    static float data[COUNT];
    for (size_t i = 0; i < COUNT; i++) data[i] = (float)sin(1.3 * ctx->rank + 0.01 * (double)i);
    CHILD_CHECK(ctx, pt_allreduce(g, data, COUNT, PT_REDUCE_SUM) == PIPERT_OK, "allreduce");
    for (size_t i = 0; i < COUNT; i++) {
        double sum = 0;
        for (int r = 0; r < ctx->n; r++) sum += (float)sin(1.3 * r + 0.01 * (double)i);
        CHILD_CHECK(ctx, fabs(data[i] - sum) <= 1e-6 * ctx->n, "element %zu: %.9g vs serial %.9g",
                    i, data[i], sum);
    }
    uint64_t mine = pt_checksum64(data, sizeof data), all[MAX_RANKS];
    CHILD_CHECK(ctx, pt_allgather(g, &mine, sizeof mine, all) == PIPERT_OK, "allgather");
    for (int r = 0; r < ctx->n; r++)
        CHILD_CHECK(ctx, all[r] == mine, "rank %d's result differs from rank %d's", r, ctx->rank);
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allreduce_inexact_inputs_agree_on_every_rank)
{
    run_ranks(4, allreduce_inexact_body, -1);
}

/* Several non-blocking all-reduces in flight at once, waited out of order, with work in between. */
static int nonblocking_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    int members[MAX_RANKS];
    for (int r = 0; r < ctx->n; r++) members[r] = r;
    enum { N_OPS = 4 };
    size_t counts[N_OPS] = {300000, 17, 0, 65536};
    pt_reduce_op ops[N_OPS] = {PT_REDUCE_SUM, PT_REDUCE_MEAN, PT_REDUCE_SUM, PT_REDUCE_MEAN};
    float *data[N_OPS];
    pt_allreduce_handle *handles[N_OPS];
    for (int k = 0; k < N_OPS; k++) {
        data[k] = malloc((counts[k] + 1) * sizeof(float));
        CHILD_CHECK(ctx, data[k], "no memory");
        for (size_t i = 0; i < counts[k]; i++) data[k][i] = exact_input(ctx->rank, i, 50 + k);
        CHILD_CHECK(ctx,
                    pt_allreduce_start(g, data[k], counts[k], ops[k], &handles[k]) == PIPERT_OK,
                    "start %d", k);
    }
    /* "Compute" while they run. */
    volatile double work = 0;
    for (int i = 0; i < 2000000; i++) work += i * 1e-9;
    for (int k = N_OPS; k-- > 0;) {
        CHILD_CHECK(ctx, pt_allreduce_wait(handles[k]) == PIPERT_OK, "wait %d", k);
        char what[64];
        snprintf(what, sizeof what, "non-blocking all-reduce %d", k);
        if (check_exact(ctx, data[k], counts[k], members, ctx->n, ops[k], 50 + k, what)) return 1;
        free(data[k]);
    }
    pt_group_destroy(g);
    return 0;
}

Test(collectives, nonblocking_allreduces_overlap) { run_ranks(3, nonblocking_body, -1); }

/* Groups over some of the ranks, listed out of order, running at the same time. */
static int subgroup_body(rank_context *ctx)
{
    static const int odd_members[] = {4, 1, 3}, even_members[] = {0, 2};
    int odd = ctx->rank % 2 || ctx->rank == 4;
    const int *members = odd ? odd_members : even_members;
    int n_members = odd ? 3 : 2;
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.id = odd ? 1 : 2;
    pt_group *g;
    CHILD_CHECK(ctx, pt_group_create(ctx->t, members, n_members, &options, &g) == PIPERT_OK,
                "group");
    CHILD_CHECK(ctx, pt_group_size(g) == n_members, "size");
    enum { COUNT = 10007 };
    static float data[COUNT];
    for (size_t i = 0; i < COUNT; i++) data[i] = exact_input(ctx->rank, i, 9);
    CHILD_CHECK(ctx, pt_allreduce(g, data, COUNT, PT_REDUCE_SUM) == PIPERT_OK,
                "subgroup allreduce");
    if (check_exact(ctx, data, COUNT, members, n_members, PT_REDUCE_SUM, 9, "subgroup sum"))
        return 1;
    pt_group_destroy(g);
    /* Then everyone together. */
    g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    int all[MAX_RANKS];
    for (int r = 0; r < ctx->n; r++) all[r] = r;
    for (size_t i = 0; i < COUNT; i++) data[i] = exact_input(ctx->rank, i, 10);
    CHILD_CHECK(ctx, pt_allreduce(g, data, COUNT, PT_REDUCE_MEAN) == PIPERT_OK, "whole allreduce");
    if (check_exact(ctx, data, COUNT, all, ctx->n, PT_REDUCE_MEAN, 10, "whole mean")) return 1;
    pt_group_destroy(g);
    return 0;
}

Test(collectives, subgroups_reduce_only_their_members) { run_ranks(5, subgroup_body, -1); }

/* ---- broadcast, all-gather, barrier -------------------------------------- */

static unsigned char pattern_byte(int seed, size_t i)
{
    return (unsigned char)((i * 2654435761u + (unsigned)seed * 40503u) >> 7);
}

/* Payload bytes this rank's transport sent to peers in its own site. */
static uint64_t local_bytes(pt_transport *t)
{
    uint64_t local, remote;
    pt_transport_bytes_sent(t, &local, &remote);
    return local;
}

static int broadcast_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    static const size_t sizes[] = {0, 1, 1000, 100003};
    static unsigned char buffer[100003 + 1];
    for (int root = 0; root < ctx->n; root++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int seed = 10 * root + (int)k;
            for (size_t i = 0; i < sizes[k] + 1; i++)
                buffer[i] = ctx->rank == root ? pattern_byte(seed, i) : 0;
            const uint64_t before = local_bytes(ctx->t);
            CHILD_CHECK(ctx, pt_broadcast(g, buffer, sizes[k], root) == PIPERT_OK,
                        "broadcast from %d", root);
            const uint64_t sent = local_bytes(ctx->t) - before;
            CHILD_CHECK(ctx, sent == pt_broadcast_bytes_sent(g, sizes[k], root),
                        "broadcast of %zu bytes from %d: the transport sent %llu, expected %zu",
                        sizes[k], root, (unsigned long long)sent,
                        pt_broadcast_bytes_sent(g, sizes[k], root));
            for (size_t i = 0; i < sizes[k]; i++)
                CHILD_CHECK(ctx, buffer[i] == pattern_byte(seed, i), "byte %zu of %zu from root %d",
                            i, sizes[k], root);
            CHILD_CHECK(ctx, ctx->rank == root || buffer[sizes[k]] == 0,
                        "broadcast wrote past %zu bytes", sizes[k]);
        }
    }
    pt_group_destroy(g);
    return 0;
}

Test(collectives, broadcast_from_every_root_5_ranks) { run_ranks(5, broadcast_body, -1); }
Test(collectives, broadcast_from_every_root_8_ranks) { run_ranks(8, broadcast_body, -1); }

static int allgather_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    static const size_t sizes[] = {0, 3, 4097};
    static unsigned char mine[4097], all[MAX_RANKS * 4097];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (size_t i = 0; i < sizes[k]; i++) mine[i] = pattern_byte(ctx->rank + 100 * (int)k, i);
        memset(all, 0, sizeof all);
        CHILD_CHECK(ctx, pt_allgather(g, mine, sizes[k], all) == PIPERT_OK, "allgather of %zu",
                    sizes[k]);
        for (int r = 0; r < ctx->n; r++)
            for (size_t i = 0; i < sizes[k]; i++)
                CHILD_CHECK(ctx, all[(size_t)r * sizes[k] + i] == pattern_byte(r + 100 * (int)k, i),
                            "block of rank %d, byte %zu of %zu", r, i, sizes[k]);
    }
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allgather_3_ranks) { run_ranks(3, allgather_body, -1); }
Test(collectives, allgather_5_ranks) { run_ranks(5, allgather_body, -1); }

/* Shared by the forked ranks: how many have arrived at each barrier. */
static atomic_int *arrivals;

static int barrier_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    for (int round = 0; round < 3; round++) {
        /* Arrive in a different order each round, some late. */
        usleep((useconds_t)(((ctx->rank + round) % ctx->n) * 20000));
        atomic_fetch_add(&arrivals[round], 1);
        CHILD_CHECK(ctx, pt_barrier(g) == PIPERT_OK, "barrier %d", round);
        int seen = atomic_load(&arrivals[round]);
        CHILD_CHECK(ctx, seen == ctx->n, "left barrier %d when only %d of %d had arrived", round,
                    seen, ctx->n);
    }
    pt_group_destroy(g);
    return 0;
}

static void barrier_test(int n)
{
    arrivals = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(arrivals != MAP_FAILED);
    for (int i = 0; i < 3; i++) atomic_init(&arrivals[i], 0);
    run_ranks(n, barrier_body, -1);
    munmap(arrivals, 4096);
}

Test(collectives, barrier_waits_for_everyone_3_ranks) { barrier_test(3); }
Test(collectives, barrier_waits_for_everyone_6_ranks) { barrier_test(6); }

/* ---- arguments and failures ---------------------------------------------- */

static int dead_member_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 0);
    CHILD_CHECK(ctx, g, "group");
    static float data[100000];
    CHILD_CHECK(ctx, pt_allreduce(g, data, 100000, PT_REDUCE_SUM) == PIPERT_OK, "first allreduce");
    if (ctx->rank == 1)
        for (;;) pause(); /* until killed */
    CHILD_CHECK(ctx, request_kill(ctx, 1), "ask");
    double start = pt_now_s();
    pipert_result rc = pt_allreduce(g, data, 100000, PT_REDUCE_SUM);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "rank 1"),
                "an allreduce with a killed member fails naming it, got %s", pipert_result_str(rc));
    CHILD_CHECK(ctx, pt_now_s() - start < 10.0, "the failure took %.1f s", pt_now_s() - start);
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allreduce_with_a_killed_member_fails) { run_ranks(2, dead_member_body, 1); }

static int arguments_body(rank_context *ctx)
{
    pt_group *g;
    int not_me[] = {1 - ctx->rank}, twice[] = {0, 1, 0}, both[] = {0, 1};
    CHILD_CHECK(ctx, pt_group_create(ctx->t, not_me, 1, NULL, &g) == PIPERT_ERR_INVALID_ARG,
                "not a member");
    CHILD_CHECK(ctx, pt_group_create(ctx->t, twice, 3, NULL, &g) == PIPERT_ERR_INVALID_ARG,
                "duplicate");
    CHILD_CHECK(ctx, strstr(pipert_last_error(), "twice"), "%s", pipert_last_error());
    CHILD_CHECK(ctx, pt_group_create(ctx->t, both, 2, NULL, &g) == PIPERT_OK, "ok");
    CHILD_CHECK(ctx, pt_broadcast(g, NULL, 0, 2) == PIPERT_ERR_INVALID_ARG,
                "root outside the group");
    /* Members disagreeing on the size: the receivers' shape check (or, for a
     * small message longer than the receive, the capacity check) catches it. */
    static float data[64];
    pipert_result rc = pt_allreduce(g, data, ctx->rank == 0 ? 64 : 60, PT_REDUCE_SUM);
    CHILD_CHECK(ctx,
                rc == PIPERT_ERR_PEER &&
                    (strstr(pipert_last_error(), "shape") || strstr(pipert_last_error(), "nbytes")),
                "mismatched sizes are refused, got %s", pipert_result_str(rc));
    pt_group_destroy(g);
    /* A group of one reduces to itself. */
    int me[] = {ctx->rank};
    CHILD_CHECK(ctx, pt_group_create(ctx->t, me, 1, NULL, &g) == PIPERT_OK, "singleton");
    data[0] = 3;
    CHILD_CHECK(ctx, pt_allreduce(g, data, 1, PT_REDUCE_MEAN) == PIPERT_OK && data[0] == 3,
                "singleton mean");
    CHILD_CHECK(ctx, pt_barrier(g) == PIPERT_OK, "singleton barrier");
    pt_group_destroy(g);
    return 0;
}

Test(collectives, arguments_and_mismatched_sizes) { run_ranks(2, arguments_body, -1); }

/* ---- non-blocking all-gather and all-to-all ------------------------------- */

/* The byte that member `from` sends to member `to` in test `seed` (the
 * all-gather sends the same block to everyone: to = -1). */
static unsigned char block_byte(int seed, int from, int to, size_t i)
{
    return pattern_byte(seed * 977 + from * 31 + to, i);
}

/* Waits in short slices, as a coupling does while it asks whether to stop. */
static pipert_result wait_in_slices(pt_completion *c)
{
    for (;;) {
        pipert_result rc = pt_completion_wait_for(c, 0.01);
        if (rc != PIPERT_ERR_TIMEOUT) return rc;
    }
}

static int nonblocking_allgather_alltoall_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    const int n = ctx->n, me = ctx->rank;
    static const size_t sizes[] = {0, 1, 4096, 4097, 100003};
    enum { N_SIZES = sizeof sizes / sizeof sizes[0] };
    unsigned char *send[N_SIZES], *recv[N_SIZES], *all_send[N_SIZES], *all_recv[N_SIZES];
    pt_completion *gathers[N_SIZES], *scatters[N_SIZES];
    /* Every size at once, both collectives, waited for out of order. */
    for (int k = 0; k < N_SIZES; k++) {
        const size_t b = sizes[k];
        send[k] = malloc(b + 1);
        recv[k] = malloc((size_t)n * b + 1);
        all_send[k] = malloc((size_t)n * b + 1);
        all_recv[k] = calloc((size_t)n * b + 1, 1);
        CHILD_CHECK(ctx, send[k] && recv[k] && all_send[k] && all_recv[k], "no memory");
        for (size_t i = 0; i < b; i++) send[k][i] = block_byte(k, me, -1, i);
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < b; i++) all_send[k][(size_t)j * b + i] = block_byte(k, me, j, i);
        memset(recv[k], 0, (size_t)n * b + 1);
        CHILD_CHECK(ctx, pt_allgather_start(g, send[k], b, recv[k], &gathers[k]) == PIPERT_OK,
                    "allgather start %zu", b);
        CHILD_CHECK(ctx,
                    pt_alltoall_start(g, all_send[k], b, all_recv[k], &scatters[k]) == PIPERT_OK,
                    "alltoall start %zu", b);
    }
    for (int k = N_SIZES; k-- > 0;) {
        const size_t b = sizes[k];
        CHILD_CHECK(ctx, wait_in_slices(scatters[k]) == PIPERT_OK, "alltoall of %zu", b);
        CHILD_CHECK(ctx, pt_completion_wait(gathers[k]) == PIPERT_OK, "allgather of %zu", b);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < b; i++) {
                CHILD_CHECK(ctx, recv[k][(size_t)r * b + i] == block_byte(k, r, -1, i),
                            "allgather of %zu: block of member %d, byte %zu", b, r, i);
                CHILD_CHECK(ctx, all_recv[k][(size_t)r * b + i] == block_byte(k, r, me, i),
                            "alltoall of %zu: block from member %d, byte %zu", b, r, i);
            }
        CHILD_CHECK(ctx, recv[k][(size_t)n * b] == 0 && all_recv[k][(size_t)n * b] == 0,
                    "wrote past %d blocks of %zu", n, b);
        free(send[k]), free(recv[k]), free(all_send[k]), free(all_recv[k]);
    }
    pt_group_destroy(g);
    return 0;
}

Test(collectives, nonblocking_allgather_and_alltoall_3_ranks)
{
    run_ranks(3, nonblocking_allgather_alltoall_body, -1);
}
Test(collectives, nonblocking_allgather_and_alltoall_5_ranks)
{
    run_ranks(5, nonblocking_allgather_alltoall_body, -1);
}

/* A chain on the progress thread: an all-to-all whose callback starts an
 * all-gather, then an all-reduce, on tickets taken at the start, while the
 * caller runs a blocking all-reduce on the same group meanwhile. The tickets
 * keep every member's order the same, however late the callbacks run. */
typedef struct chain {
    pt_group *g;
    pt_group_ticket tickets[2];
    unsigned char *scatter_send, *scatter_recv, *gather_recv;
    float *sums;
    size_t b, count;
    int stage;
    pt_completion *done;
} chain;

static void chain_reduced(void *arg, pipert_result result, const char *message)
{
    chain *c = arg;
    c->stage = 3;
    pt_completion_finish(c->done, result, message);
}

static void chain_gathered(void *arg, pipert_result result, const char *message)
{
    chain *c = arg;
    c->stage = 2;
    if (result != PIPERT_OK) {
        pt_completion_finish(c->done, result, message);
        return;
    }
    result =
        pt_allreduce_then(c->g, c->tickets[1], c->sums, c->count, PT_REDUCE_SUM, chain_reduced, c);
    if (result != PIPERT_OK) pt_completion_finish(c->done, result, pipert_last_error());
}

static void chain_scattered(void *arg, pipert_result result, const char *message)
{
    chain *c = arg;
    c->stage = 1;
    /* Pass on what member index+1 sent us. */
    const int n = pt_group_size(c->g), next = (pt_group_index(c->g) + 1) % n;
    if (result != PIPERT_OK) {
        pt_completion_finish(c->done, result, message);
        return;
    }
    result = pt_allgather_then(c->g, c->tickets[0], c->scatter_recv + (size_t)next * c->b, c->b,
                               c->gather_recv, chain_gathered, c);
    if (result != PIPERT_OK) pt_completion_finish(c->done, result, pipert_last_error());
}

static int chained_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 4);
    CHILD_CHECK(ctx, g, "group");
    const int n = ctx->n, me = ctx->rank;
    enum { B = 70001, COUNT = 30011 };
    chain c = {.g = g, .b = B, .count = COUNT};
    c.scatter_send = malloc((size_t)n * B);
    c.scatter_recv = malloc((size_t)n * B);
    c.gather_recv = malloc((size_t)n * B);
    c.sums = malloc(COUNT * sizeof(float));
    static float blocking[COUNT];
    CHILD_CHECK(ctx, c.scatter_send && c.scatter_recv && c.gather_recv && c.sums, "no memory");
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < B; i++) c.scatter_send[(size_t)j * B + i] = block_byte(7, me, j, i);
    for (size_t i = 0; i < COUNT; i++) {
        c.sums[i] = exact_input(me, i, 70);
        blocking[i] = exact_input(me, i, 71);
    }
    CHILD_CHECK(ctx, pt_completion_create(NULL, NULL, &c.done) == PIPERT_OK, "completion");
    const pt_group_ticket first = pt_group_take_ticket(g);
    c.tickets[0] = pt_group_take_ticket(g);
    c.tickets[1] = pt_group_take_ticket(g);
    CHILD_CHECK(ctx,
                pt_alltoall_then(g, first, c.scatter_send, B, c.scatter_recv, chain_scattered,
                                 &c) == PIPERT_OK,
                "alltoall_then");
    /* Members start this at different points of the chain. */
    usleep((useconds_t)(me * 30000));
    CHILD_CHECK(ctx, pt_allreduce(g, blocking, COUNT, PT_REDUCE_SUM) == PIPERT_OK,
                "the blocking all-reduce beside the chain");
    CHILD_CHECK(ctx, pt_completion_wait(c.done) == PIPERT_OK, "the chain (stage %d)", c.stage);
    /* Member r passed on what r+1 sent it. */
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < B; i++)
            CHILD_CHECK(ctx, c.gather_recv[(size_t)r * B + i] == block_byte(7, (r + 1) % n, r, i),
                        "chained allgather: block of member %d, byte %zu", r, i);
    int members[MAX_RANKS];
    for (int r = 0; r < n; r++) members[r] = r;
    if (check_exact(ctx, c.sums, COUNT, members, n, PT_REDUCE_SUM, 70, "chained all-reduce") ||
        check_exact(ctx, blocking, COUNT, members, n, PT_REDUCE_SUM, 71, "blocking all-reduce"))
        return 1;
    free(c.scatter_send), free(c.scatter_recv), free(c.gather_recv), free(c.sums);
    pt_group_destroy(g);
    return 0;
}

Test(collectives, chained_collectives_keep_the_group_order) { run_ranks(4, chained_body, -1); }

/* A waiter that gives up: a member abandons an all-gather its peers join
 * only afterwards (told through a second group, whose order is its own); it
 * frees itself (the leak check of the child sees it), and a later
 * collective on the group still works. */
static int abandon_allgather_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 5), *signal = whole_group(ctx, 7);
    CHILD_CHECK(ctx, g && signal, "groups");
    enum { B = 200000 };
    static unsigned char send[B], recv[MAX_RANKS * B];
    memset(send, ctx->rank + 1, B);
    if (ctx->rank != 0) CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "member 0 abandoned");
    pt_completion *c;
    CHILD_CHECK(ctx, pt_allgather_start(g, send, B, recv, &c) == PIPERT_OK, "start");
    if (ctx->rank == 0) {
        CHILD_CHECK(ctx, pt_completion_wait_for(c, 0.02) == PIPERT_ERR_TIMEOUT,
                    "the peers are late: the wait times out");
        CHILD_CHECK(ctx, !pt_completion_test(c), "not finished yet");
        pt_completion_abandon(c);
        CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "signal the others");
    } else {
        CHILD_CHECK(ctx, pt_completion_wait(c) == PIPERT_OK, "allgather");
        CHILD_CHECK(ctx, recv[0] == 1 && recv[(size_t)(ctx->n - 1) * B] == ctx->n, "blocks");
    }
    CHILD_CHECK(ctx, pt_barrier(g) == PIPERT_OK, "barrier after");
    /* The abandoned all-gather may still be running on g: the transport goes first. */
    pt_transport_destroy(ctx->t);
    ctx->t = NULL;
    pt_group_destroy(g);
    pt_group_destroy(signal);
    return 0;
}

Test(collectives, abandoned_allgather_frees_itself) { run_ranks(3, abandon_allgather_body, -1); }

/* A member whose peers went on without it (an elastic job's regroup) waits in a broadcast from
 * a root that has not sent: its group's interrupted() turns true 0.3 s in, and the broadcast
 * returns PIPERT_ERR_INTERRUPTED soon after, naming the collective, its buffer unwritten.
 * Then the root broadcasts 1 MiB to that member, which gave up (a direct read on this host:
 * the send ends only when the member takes it): interrupted 0.3 s in, it returns too instead
 * of waiting for that send for good (the request is freed when the transport closes). Without
 * the callback either side would wait until the other's transport closed. */
static double interrupt_at; /* when the group turns interrupted (pt_now_s) */

static bool interrupt_when_due(void *context)
{
    (void)context;
    return pt_now_s() >= interrupt_at;
}

/* Every rank, asking interrupt_when_due while it waits. */
static pt_group *interruptible_group(rank_context *ctx)
{
    int ranks[MAX_RANKS];
    for (int r = 0; r < ctx->n; r++) ranks[r] = r;
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.id = 9;
    options.interrupted = interrupt_when_due;
    pt_group *g = NULL;
    return pt_group_create(ctx->t, ranks, ctx->n, &options, &g) == PIPERT_OK ? g : NULL;
}

/* A broadcast from member 0 on g that the group interrupts `delay` s in must end with
 * PIPERT_ERR_INTERRUPTED, naming the collective, within 5 s of that (non-zero: it did not). */
static int interrupted_broadcast(rank_context *ctx, pt_group *g, void *buffer, size_t bytes,
                                 double delay)
{
    interrupt_at = pt_now_s() + delay;
    const pipert_result rc = pt_broadcast(g, buffer, bytes, 0);
    const double late = pt_now_s() - interrupt_at;
    CHILD_CHECK(ctx, rc == PIPERT_ERR_INTERRUPTED, "the broadcast ended with %s: %s",
                pipert_result_str(rc), pipert_last_error());
    CHILD_CHECK(ctx, strstr(pipert_last_error(), "broadcast") != NULL,
                "the error names the collective: %s", pipert_last_error());
    CHILD_CHECK(ctx, late >= 0 && late < 5.0, "it ended %.2f s after being interrupted", late);
    return 0;
}

static int interrupted_broadcast_body(rank_context *ctx)
{
    pt_group *signal = whole_group(ctx, 7);
    CHILD_CHECK(ctx, signal, "group");
    pt_group *g = interruptible_group(ctx);
    CHILD_CHECK(ctx, g, "group");
    enum { N = 1 << 18 };
    static float buffer[N];
    for (int i = 0; i < N; i++) buffer[i] = (float)ctx->rank - 1.0f;
    CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "signal");
    if (ctx->rank == 1) {
        if (interrupted_broadcast(ctx, g, buffer, sizeof buffer, 0.3)) return 1;
        CHILD_CHECK(ctx, buffer[0] == 0.0f && buffer[N - 1] == 0.0f, "the buffer was written");
    }
    CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "member 1 gave up");
    if (ctx->rank == 0 && interrupted_broadcast(ctx, g, buffer, sizeof buffer, 0.3)) return 1;
    CHILD_CHECK(ctx, pt_barrier(signal) == PIPERT_OK, "the end");
    pt_transport_destroy(ctx->t); /* the abandoned send ends here */
    ctx->t = NULL;
    pt_group_destroy(g);
    pt_group_destroy(signal);
    return 0;
}

Test(collectives, an_interrupted_broadcast_leaves_neither_side_waiting)
{
    run_ranks(2, interrupted_broadcast_body, -1);
}

/* Bytes of a ring all-reduce, counted step by step from its definition:
 * reduce-scatter step s sends chunk i − s, all-gather step s chunk i + 1 − s. */
static int allreduce_bytes_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 6);
    CHILD_CHECK(ctx, g, "group");
    const int n = ctx->n, i = ctx->rank;
    const size_t counts[] = {0, 1, 2, 5, 1000, 1001, 1003};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t count = counts[k];
        size_t expected = 0;
        for (int s = 0; s < n - 1; s++) {
            for (int gathering = 0; gathering < 2; gathering++) {
                int chunk = ((i - s + gathering) % n + n) % n;
                size_t length = count / (size_t)n + ((size_t)chunk < count % (size_t)n);
                expected += length * sizeof(float);
            }
        }
        CHILD_CHECK(ctx, pt_allreduce_bytes_sent(g, count) == expected,
                    "%zu floats over %d: %zu bytes, counted %zu", count, n,
                    pt_allreduce_bytes_sent(g, count), expected);
        /* and what the transport counts when it runs */
        static float data[1003];
        const uint64_t before = local_bytes(ctx->t);
        CHILD_CHECK(ctx, pt_allreduce(g, data, count, PT_REDUCE_SUM) == PIPERT_OK, "allreduce");
        const uint64_t sent = local_bytes(ctx->t) - before;
        CHILD_CHECK(ctx, sent == expected, "%zu floats over %d: the transport sent %llu bytes, "
                    "expected %zu", count, n, (unsigned long long)sent, expected);
    }
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allreduce_bytes_sent)
{
    run_ranks(2, allreduce_bytes_body, -1);
    run_ranks(3, allreduce_bytes_body, -1);
    run_ranks(4, allreduce_bytes_body, -1);
}
