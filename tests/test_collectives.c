/* Collectives between 2..8 real processes on this host, each result compared
 * with a serial computation of the same thing in the test.
 *
 * Inputs are quarter-integers of small magnitude, so every sum is exact in
 * fp32 whatever the order of the additions: sums must match bitwise, and so
 * must means (the exact sum divided by n, as the test computes it). One test
 * uses inexact inputs with a stated tolerance.
 *
 * The harness (fork, address exchange through a pipe, kill on request,
 * reaping with a deadline) is the one of test_transport.c, trimmed. */
#include <criterion/criterion.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
/* Children end with _exit, which skips LeakSanitizer's exit check: run it by hand. */
#define CHILD_LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define CHILD_LEAK_CHECK() 0
#endif

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/collectives.h"
#include "runtime/log.h"

#define MAX_RANKS 8
#define ADDRESS_MAX 96
#define JOB_DEADLINE_S 90.0

/* ---- the multi-process harness ------------------------------------------- */

typedef struct rank_context {
    int rank, n;
    pt_transport *t;
    int up_fd;
} rank_context;

typedef int (*rank_body)(rank_context *ctx);

typedef struct up_record {
    int kind; /* 0: my address (empty: I failed), 1: kill rank `rank`, 2: connected, waiting */
    int rank;
    char address[ADDRESS_MAX];
} up_record;

#define CHILD_CHECK(ctx, cond, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d of %d, %s:%d: check failed: %s: ", (ctx)->rank, (ctx)->n,     \
                    __FILE__, __LINE__, #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", pipert_last_error());                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int read_full(int fd, void *buffer, size_t bytes)
{
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = read(fd, (char *)buffer + got, bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        got += (size_t)n;
    }
    return 1;
}

static void child_main(int n, int rank, rank_body body, int up_fd, int down_fd)
{
    rank_context ctx = {.rank = rank, .n = n, .up_fd = up_fd};
    pt_log_set_rank(rank);
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = rank;
    options.secret = "collectives test";
    options.job = 7;
    options.listen_host = "127.0.0.1";
    options.connect_timeout_s = 20.0;
    up_record mine = {.kind = 0, .rank = rank};
    pipert_result rc = pt_transport_create(&options, &ctx.t);
    if (rc == PIPERT_OK)
        snprintf(mine.address, sizeof mine.address, "%s", pt_transport_listen_address(ctx.t));
    else
        fprintf(stderr, "rank %d: pt_transport_create: %s\n", rank, pipert_last_error());
    if (write(up_fd, &mine, sizeof mine) != (ssize_t)sizeof mine || rc != PIPERT_OK) _exit(91);
    static char table[MAX_RANKS][ADDRESS_MAX];
    if (!read_full(down_fd, table, sizeof table)) _exit(92);
    const char *addresses[MAX_RANKS];
    for (int r = 0; r < n; r++) addresses[r] = table[r];
    int status = 0;
    if (pt_transport_connect_all(ctx.t, n, addresses, 30.0) != PIPERT_OK) {
        fprintf(stderr, "rank %d: connect_all: %s\n", rank, pipert_last_error());
        status = 93;
    }
    /* Nobody starts (and so nobody can finish and leave) before everyone is connected. */
    up_record ready = {.kind = 2, .rank = rank};
    char go;
    if (write(up_fd, &ready, sizeof ready) != (ssize_t)sizeof ready || !read_full(down_fd, &go, 1))
        _exit(97);
    if (status == 0) status = body(&ctx);
    pt_transport_destroy(ctx.t);
    if (status == 0 && CHILD_LEAK_CHECK()) status = 95;
    _exit(status);
}

/* Runs body on n processes; `killed` is the rank expected to die by SIGKILL (-1: none). */
static int run_job(int n, rank_body body, int killed, char *why, size_t why_capacity)
{
    int up[2], down[MAX_RANKS][2];
    pid_t pids[MAX_RANKS] = {0}, parent = getpid();
    if (pipe(up) != 0) return snprintf(why, why_capacity, "pipe: %s", strerror(errno)), 0;
    int ok = 1;
    for (int r = 0; r < n && ok; r++) {
        if (pipe(down[r]) != 0) return snprintf(why, why_capacity, "pipe: %s", strerror(errno)), 0;
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            /* Never outlive the test, even if it is killed itself. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(96);
            close(up[0]);
            close(down[r][1]);
            child_main(n, r, body, up[1], down[r][0]);
        }
        close(down[r][0]);
        if (pids[r] < 0) ok = !snprintf(why, why_capacity, "fork: %s", strerror(errno));
    }
    close(up[1]);
    static char table[MAX_RANKS][ADDRESS_MAX];
    memset(table, 0, sizeof table);
    int reported = 0, ready = 0, ended = 0, done[MAX_RANKS] = {0};
    double deadline = pt_now_s() + JOB_DEADLINE_S;
    while (ok && ended < n) {
        if (pt_now_s() > deadline) {
            ok = !snprintf(why, why_capacity, "the job did not end within %.0f s", JOB_DEADLINE_S);
            break;
        }
        struct pollfd fd = {.fd = up[0], .events = POLLIN};
        if (up[0] >= 0 && poll(&fd, 1, 10) > 0) {
            up_record record;
            if (!read_full(up[0], &record, sizeof record)) {
                close(up[0]);
                up[0] = -1;
            } else if (record.kind == 0 && !record.address[0]) {
                ok = !snprintf(why, why_capacity, "rank %d could not create its transport",
                               record.rank);
            } else if (record.kind == 0) {
                snprintf(table[record.rank], ADDRESS_MAX, "%s", record.address);
                if (++reported == n)
                    for (int r = 0; r < n; r++)
                        if (write(down[r][1], table, sizeof table) != (ssize_t)sizeof table) ok = 0;
            } else if (record.kind == 2) {
                if (++ready == n)
                    for (int r = 0; r < n; r++)
                        if (write(down[r][1], "g", 1) != 1) ok = 0;
            } else if (record.rank >= 0 && record.rank < n) {
                kill(pids[record.rank], SIGKILL);
            }
        } else if (up[0] < 0) {
            usleep(10000);
        }
        for (int r = 0; r < n && ok; r++) {
            int status;
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
            done[r] = 1;
            ended++;
            pids[r] = 0;
            int expected = r == killed ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                       : WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!expected)
                ok = !snprintf(why, why_capacity, "rank %d of %d ended with %s %d", r, n,
                               WIFEXITED(status) ? "exit status" : "signal",
                               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        }
    }
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) waitpid(pids[r], NULL, 0);
    if (up[0] >= 0) close(up[0]);
    for (int r = 0; r < n; r++) close(down[r][1]);
    return ok;
}

#define RUN_JOB(n, body, killed)                                                                   \
    do {                                                                                           \
        char why_[512] = "";                                                                       \
        int ok_ = run_job((n), (body), (killed), why_, sizeof why_);                               \
        cr_assert(ok_, "%d ranks: %s (see the children's stderr above)", (n), why_);               \
    } while (0)

/* ---- inputs and references ----------------------------------------------- */

/* Quarter-integers in [-12, 12]: sums of up to 8 are exact in fp32. */
static float exact_input(int rank, size_t i, int salt)
{
    return (float)((int)((rank * 7919u + i * 31u + (unsigned)salt * 101u) % 97u) - 48) * 0.25f;
}

static pt_group *whole_group(rank_context *ctx, uint32_t id)
{
    int ranks[MAX_RANKS];
    for (int r = 0; r < ctx->n; r++) ranks[r] = r;
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.id = id;
    options.checksum = 1;
    pt_group *g = NULL;
    if (pt_group_create(ctx->t, ranks, ctx->n, &options, &g) != PIPERT_OK)
        fprintf(stderr, "rank %d: pt_group_create: %s\n", ctx->rank, pipert_last_error());
    return g;
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
    size_t counts[] = {0, 1, (size_t)ctx->n - 1, (size_t)ctx->n + 1, 7, 1000, 100003, 1u << 20};
    float *data = malloc((1u << 20) * sizeof *data);
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

Test(collectives, allreduce_2_ranks) { RUN_JOB(2, allreduce_exact_body, -1); }
Test(collectives, allreduce_3_ranks) { RUN_JOB(3, allreduce_exact_body, -1); }
Test(collectives, allreduce_5_ranks) { RUN_JOB(5, allreduce_exact_body, -1); }
Test(collectives, allreduce_8_ranks) { RUN_JOB(8, allreduce_exact_body, -1); }

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
    RUN_JOB(4, allreduce_inexact_body, -1);
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

Test(collectives, nonblocking_allreduces_overlap) { RUN_JOB(3, nonblocking_body, -1); }

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

Test(collectives, subgroups_reduce_only_their_members) { RUN_JOB(5, subgroup_body, -1); }

/* ---- broadcast, all-gather, barrier -------------------------------------- */

static unsigned char pattern_byte(int seed, size_t i)
{
    return (unsigned char)((i * 2654435761u + (unsigned)seed * 40503u) >> 7);
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
            CHILD_CHECK(ctx, pt_broadcast(g, buffer, sizes[k], root) == PIPERT_OK,
                        "broadcast from %d", root);
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

Test(collectives, broadcast_from_every_root_5_ranks) { RUN_JOB(5, broadcast_body, -1); }
Test(collectives, broadcast_from_every_root_8_ranks) { RUN_JOB(8, broadcast_body, -1); }

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

Test(collectives, allgather_3_ranks) { RUN_JOB(3, allgather_body, -1); }
Test(collectives, allgather_5_ranks) { RUN_JOB(5, allgather_body, -1); }

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
    RUN_JOB(n, barrier_body, -1);
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
    up_record kill_request = {.kind = 1, .rank = 1};
    CHILD_CHECK(
        ctx, write(ctx->up_fd, &kill_request, sizeof kill_request) == (ssize_t)sizeof kill_request,
        "ask");
    double start = pt_now_s();
    pipert_result rc = pt_allreduce(g, data, 100000, PT_REDUCE_SUM);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "rank 1"),
                "an allreduce with a killed member fails naming it, got %s", pipert_result_str(rc));
    CHILD_CHECK(ctx, pt_now_s() - start < 10.0, "the failure took %.1f s", pt_now_s() - start);
    pt_group_destroy(g);
    return 0;
}

Test(collectives, allreduce_with_a_killed_member_fails) { RUN_JOB(2, dead_member_body, 1); }

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

Test(collectives, arguments_and_mismatched_sizes) { RUN_JOB(2, arguments_body, -1); }
