/* The multi-process test harness: runs a job of 1..MAX_RANKS real processes
 * on this host, each with its own UCX transport (loopback).
 *
 * The test process initialises nothing of UCX: run_job forks one child per
 * rank, every child creates its transport, reports its listen address through
 * a pipe, gets everyone's back, optionally connects to everyone, waits until
 * all are ready, runs the body and _exits with its status, which the test
 * process checks. Children check with CHILD_CHECK (stderr + non-zero exit),
 * since Criterion's asserts belong to the test process. A body may ask the
 * test process to SIGKILL a rank (request_kill). Nothing outlives a test: on
 * a deadline or a failure every child is killed and reaped.
 *
 * The including file may set, before the #include:
 *   JOB_SECRET, JOB_ID          the transport's secret and job id
 *   JOB_DEADLINE_S              how long a whole job may take
 *   JOB_CONNECT_TIMEOUT_S       the transport's connect_timeout_s
 *   JOB_CONNECT_ALL_TIMEOUT_S   the timeout of the mesh's connect_all
 * Everything here is static inline, so a file that uses only part of it
 * compiles without unused-function warnings. */
#ifndef PIPERT_TESTS_MULTIPROCESS_H
#define PIPERT_TESTS_MULTIPROCESS_H

#include <criterion/criterion.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
/* Children end with _exit, which skips LeakSanitizer's exit check: run it by hand. */
#define CHILD_LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define CHILD_LEAK_CHECK() 0
#endif

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/log.h"
#include "comm/collectives.h"
#include "comm/transport.h"

#define MAX_RANKS 8
/* A worker address as text: up_record must fit in PIPE_BUF to be written atomically. */
#define ADDRESS_MAX 2048

#ifndef JOB_SECRET
#define JOB_SECRET "multi-process test"
#endif
#ifndef JOB_ID
#define JOB_ID 7u
#endif
#ifndef JOB_DEADLINE_S
#define JOB_DEADLINE_S 60.0
#endif
#ifndef JOB_CONNECT_TIMEOUT_S
#define JOB_CONNECT_TIMEOUT_S 10.0
#endif
#ifndef JOB_CONNECT_ALL_TIMEOUT_S
#define JOB_CONNECT_ALL_TIMEOUT_S 20.0
#endif

typedef struct rank_context {
    int rank, n;
    pt_transport *t; /* a body may destroy it and set it to NULL */
    const char *addresses[MAX_RANKS];
    int up_fd; /* to the test process: kill requests */
} rank_context;

typedef int (*rank_body)(rank_context *ctx);

typedef struct job_spec {
    int n;
    rank_body body;
    int mesh;                      /* connect everyone to everyone before the body */
    const char *secret[MAX_RANKS]; /* per-rank secret (NULL: JOB_SECRET) */
    const char *stderr_path[MAX_RANKS];
    int expect_killed[MAX_RANKS]; /* this rank is killed on request: SIGKILL is its expected end */
    int authenticate_messages;    /* the transports' option of that name */
    pt_job_identity identity[MAX_RANKS]; /* per-rank build and settings (zeros: this build's, no
                                          * digest) */
} job_spec;

/* A record on the children-to-parent pipe; small enough to be written atomically. */
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

/* A checksummed group of every rank of the job, with id `id`; NULL (said on stderr) on failure. */
static inline pt_group *whole_group(rank_context *ctx, uint32_t id)
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

/* Asks the test process to SIGKILL `rank`; returns 1 if the request went out. */
static inline int request_kill(rank_context *ctx, int rank)
{
    up_record record = {.kind = 1, .rank = rank};
    return write(ctx->up_fd, &record, sizeof record) == (ssize_t)sizeof record;
}

static inline int read_full(int fd, void *buffer, size_t bytes)
{
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = read(fd, (char *)buffer + got, bytes - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            return 0;
        }
        got += (size_t)n;
    }
    return 1;
}

static inline void child_main(const job_spec *spec, int rank, int up_fd, int down_fd)
{
    if (spec->stderr_path[rank]) {
        FILE *log = freopen(spec->stderr_path[rank], "w", stderr);
        if (!log) _exit(90);
        setvbuf(stderr, NULL, _IONBF, 0);
    }
    rank_context ctx = {.rank = rank, .n = spec->n, .up_fd = up_fd};
    pt_log_set_rank(rank);
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = rank;
    options.secret = spec->secret[rank] ? spec->secret[rank] : JOB_SECRET;
    options.job = JOB_ID;
    options.connect_timeout_s = JOB_CONNECT_TIMEOUT_S;
    options.authenticate_messages = spec->authenticate_messages;
    options.identity = spec->identity[rank];
    up_record mine = {.kind = 0, .rank = rank};
    pipert_result rc = pt_transport_create(&options, &ctx.t);
    if (rc == PIPERT_OK && strlen(pt_transport_address(ctx.t)) >= ADDRESS_MAX)
        fprintf(stderr, "rank %d: a transport address of %zu characters\n", rank,
                strlen(pt_transport_address(ctx.t)));
    else if (rc == PIPERT_OK)
        snprintf(mine.address, sizeof mine.address, "%s", pt_transport_address(ctx.t));
    else
        fprintf(stderr, "rank %d: pt_transport_create: %s\n", rank, pipert_last_error());
    if (write(up_fd, &mine, sizeof mine) != (ssize_t)sizeof mine) _exit(91);
    if (rc != PIPERT_OK) _exit(92);
    static char table[MAX_RANKS][ADDRESS_MAX];
    if (!read_full(down_fd, table, sizeof table)) _exit(93);
    for (int r = 0; r < spec->n; r++) ctx.addresses[r] = table[r];
    int status = 0;
    if (spec->mesh && pt_transport_connect_all(ctx.t, spec->n, ctx.addresses,
                                               JOB_CONNECT_ALL_TIMEOUT_S) != PIPERT_OK) {
        fprintf(stderr, "rank %d: connect_all: %s\n", rank, pipert_last_error());
        status = 94;
    }
    /* Nobody starts (and so nobody can finish and leave) before everyone is connected. */
    up_record ready = {.kind = 2, .rank = rank};
    char go;
    if (write(up_fd, &ready, sizeof ready) != (ssize_t)sizeof ready || !read_full(down_fd, &go, 1))
        _exit(97);
    if (status == 0) status = spec->body(&ctx);
    pt_transport_destroy(ctx.t); /* NULL if the body destroyed it */
    if (status == 0 && CHILD_LEAK_CHECK()) status = 95;
    fflush(stderr);
    _exit(status);
}

static inline void kill_all(pid_t *pids, int n)
{
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) waitpid(pids[r], NULL, 0);
}

/* Runs the job; returns 1 if every child ended as expected, else 0 with `why` filled. */
static inline int run_job(const job_spec *spec, char *why, size_t why_capacity)
{
    int up[2];
    if (pipe(up) != 0) return snprintf(why, why_capacity, "pipe: %s", strerror(errno)), 0;
    int down[MAX_RANKS][2];
    pid_t pids[MAX_RANKS] = {0}, parent = getpid();
    for (int r = 0; r < spec->n; r++) {
        if (pipe(down[r]) != 0) return snprintf(why, why_capacity, "pipe: %s", strerror(errno)), 0;
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] < 0) {
            kill_all(pids, r);
            return snprintf(why, why_capacity, "fork: %s", strerror(errno)), 0;
        }
        if (pids[r] == 0) {
            /* Never outlive the test, even if it is killed itself. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(96);
            close(up[0]);
            close(down[r][1]);
            child_main(spec, r, up[1], down[r][0]);
        }
        close(down[r][0]);
    }
    close(up[1]);
    static char table[MAX_RANKS][ADDRESS_MAX];
    memset(table, 0, sizeof table);
    int reported = 0, ready = 0, status[MAX_RANKS], ended[MAX_RANKS] = {0}, n_ended = 0, ok = 1;
    double deadline = pt_now_s() + JOB_DEADLINE_S;
    why[0] = '\0';
    while (n_ended < spec->n) {
        if (pt_now_s() > deadline) {
            snprintf(why, why_capacity, "the job did not end within %.0f s", JOB_DEADLINE_S);
            ok = 0;
            break;
        }
        struct pollfd fd = {.fd = up[0], .events = POLLIN};
        if (poll(&fd, 1, 10) > 0) {
            up_record record;
            if (!read_full(up[0], &record, sizeof record)) {
                fd.fd = -1; /* every child closed its end: keep reaping */
                close(up[0]);
                up[0] = -1;
            } else if (record.kind == 0) {
                if (!record.address[0]) {
                    snprintf(why, why_capacity, "rank %d could not create its transport",
                             record.rank);
                    ok = 0;
                    break;
                }
                snprintf(table[record.rank], ADDRESS_MAX, "%s", record.address);
                if (++reported == spec->n)
                    for (int r = 0; r < spec->n; r++)
                        if (write(down[r][1], table, sizeof table) != (ssize_t)sizeof table) ok = 0;
            } else if (record.kind == 1 && record.rank >= 0 && record.rank < spec->n) {
                kill(pids[record.rank], SIGKILL);
            } else if (record.kind == 2 && ++ready == spec->n) {
                for (int r = 0; r < spec->n; r++)
                    if (write(down[r][1], "g", 1) != 1) ok = 0;
            }
        }
        if (up[0] < 0) usleep(10000);
        for (int r = 0; r < spec->n; r++) {
            if (ended[r] || waitpid(pids[r], &status[r], WNOHANG) != pids[r]) continue;
            ended[r] = 1;
            n_ended++;
            pids[r] = 0;
            int expected = spec->expect_killed[r]
                               ? WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL
                               : WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0;
            if (!expected && ok) {
                snprintf(why, why_capacity, "rank %d of %d ended with %s %d", r, spec->n,
                         WIFEXITED(status[r]) ? "exit status" : "signal",
                         WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]));
                ok = 0;
            }
        }
        if (!ok) break;
    }
    kill_all(pids, spec->n);
    if (up[0] >= 0) close(up[0]);
    for (int r = 0; r < spec->n; r++) close(down[r][1]);
    return ok;
}

/* Runs the job from the test process and fails the test if any rank did not end as expected. */
#define RUN_JOB(spec)                                                                              \
    do {                                                                                           \
        char why_[512];                                                                            \
        int ok_ = run_job(&(spec), why_, sizeof why_);                                             \
        cr_assert(ok_, "%d ranks: %s (see the children's stderr above)", (spec).n, why_);          \
    } while (0)

#endif /* PIPERT_TESTS_MULTIPROCESS_H */
