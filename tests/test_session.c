/* The session API as a host program uses it (only <pipert/pipert.h>): the
 * one-worker case, a job of forked processes bootstrapped through the host's
 * own allgather (here: a hub in the test process, standing in for
 * MPI_Allgather), the log callback, and stop() from another thread while a
 * step waits for a peer that never answers. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pipert/pipert.h"

#define MAX_RANKS 4
#define STEPS 4

static const char *const small_model[] = {
    "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16",
    "train.batch_size=2", "train.warmup_steps=1", "train.val_batches=1", "runtime.threads=1",
    "train.log_every=1", "train.val_every=0", "train.checkpoint_every=0", NULL};

static pipert_config *small_config(const char *extra)
{
    pipert_config *cfg = NULL;
    cr_assert_eq(pipert_config_create(&cfg), PIPERT_OK);
    for (int i = 0; small_model[i]; i++)
        cr_assert_eq(pipert_config_set(cfg, small_model[i]), PIPERT_OK, "%s", pipert_last_error());
    char steps[32];
    snprintf(steps, sizeof steps, "train.steps=%d", STEPS);
    cr_assert_eq(pipert_config_set(cfg, steps), PIPERT_OK);
    if (extra) cr_assert_eq(pipert_config_set(cfg, extra), PIPERT_OK, "%s", pipert_last_error());
    return cfg;
}

static char *temp_dir(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/pipert-session-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- one worker --------------------------------------------------------------- */

typedef struct captured_log {
    int lines;
    int infos;
} captured_log;

static void capture(void *user, pipert_log_level level, const char *line)
{
    captured_log *log = user;
    log->lines++;
    if (level == PIPERT_LOG_INFO && strstr(line, "stage 0/1")) log->infos++;
}

/* The losses of a one-worker session (grad_accum = M): the reference. */
static void train_alone(const char *extra, float *losses)
{
    pipert_config *cfg = small_config(extra);
    pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
    o.out_dir = temp_dir();
    o.alone = 1;
    captured_log log = {0};
    o.log = capture;
    o.log_user = &log;
    pipert_session *s;
    cr_assert_eq(pipert_session_create(cfg, &o, &s), PIPERT_OK, "%s", pipert_last_error());
    pipert_metrics m = {.size = sizeof m};
    for (int step = 0; step < STEPS; step++) {
        cr_assert_eq(pipert_session_step(s, &m), PIPERT_OK, "%s", pipert_last_error());
        cr_assert_eq(m.step, step + 1);
        losses[step] = m.loss;
    }
    cr_expect(m.done, "the last step did not finish the run");
    cr_expect_eq(pipert_session_step(s, &m), PIPERT_ERR_INVALID_ARG, "a step after the end");
    cr_expect_str_eq(m.dp_method, "allreduce");
    cr_expect(log.infos >= 1, "the log callback saw no line describing the stage (%d lines)",
              log.lines);
    pipert_session_destroy(s);
    pipert_config_free(cfg);
}

Test(session, one_worker_steps_and_reports)
{
    float losses[STEPS];
    train_alone(NULL, losses);
    for (int i = 0; i < STEPS; i++) cr_expect(isfinite(losses[i]) && losses[i] > 0, "loss %f", losses[i]);
    cr_expect(losses[STEPS - 1] < losses[0], "the loss did not fall: %f → %f", losses[0],
              losses[STEPS - 1]);
}

Test(session, options_without_size_are_refused)
{
    pipert_config *cfg = small_config(NULL);
    pipert_session_options o = {.out_dir = "/tmp", .stages = 1};
    pipert_session *s = (pipert_session *)1;
    cr_expect_eq(pipert_session_create(cfg, &o, &s), PIPERT_ERR_INVALID_ARG);
    cr_expect_null(s);
    cr_expect(strstr(pipert_last_error(), "PIPERT_SESSION_OPTIONS_INIT"), "%s", pipert_last_error());
    pipert_config_free(cfg);
}

/* ---- the host's batches ---------------------------------------------------------- */

/* A stream of token (q + t) mod 7 for sequence q, or a token out of range (when
 * `user` says so), or a failure. */
typedef struct host_stream {
    int mode; /* 0: good batches, 1: a token out of range, 2: a failure */
    int calls;
} host_stream;

static int host_batches(void *user, pipert_split split, long index, long first, int batch,
                        int seq_len, int32_t *inputs, int32_t *targets)
{
    host_stream *stream = user;
    const int mode = stream->mode;
    stream->calls++;
    if (mode == 2) return 5;
    for (int b = 0; b < batch; b++)
        for (int t = 0; t < seq_len; t++) {
            const long q = (split == PIPERT_SPLIT_TRAIN ? index * 100 : 50) + first + b;
            inputs[b * seq_len + t] = (int32_t)((q + t) % 7);
            targets[b * seq_len + t] = (int32_t)((q + t + 1) % 7);
        }
    if (mode == 1) targets[3] = 300; /* model.vocab_size is 256 */
    return 0;
}

static pipert_result step_with_batches(int mode)
{
    pipert_config *cfg = small_config(NULL);
    pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
    o.out_dir = temp_dir();
    o.alone = 1;
    host_stream stream = {mode, 0};
    o.batch = host_batches;
    o.batch_user = &stream;
    o.log_level = PIPERT_LOG_ERROR;
    pipert_session *s;
    cr_assert_eq(pipert_session_create(cfg, &o, &s), PIPERT_OK, "%s", pipert_last_error());
    pipert_metrics m = {.size = sizeof m};
    pipert_result rc = PIPERT_OK;
    float first = NAN;
    while (rc == PIPERT_OK && !m.done) {
        rc = pipert_session_step(s, &m);
        if (isnan(first)) first = m.loss;
    }
    if (rc == PIPERT_OK) {
        /* per step one call for the inputs and one for the targets (one stage is
         * the first and the last), and one per validation batch */
        cr_expect_eq(stream.calls, 2 * STEPS + 1, "the callback was called %d times", stream.calls);
        cr_expect_lt(m.loss, first, "the host's stream did not train: %f -> %f", first, m.loss);
    }
    pipert_session_destroy(s);
    pipert_config_free(cfg);
    return rc;
}

Test(session, the_host_hands_the_batches)
{
    cr_expect_eq(step_with_batches(0), PIPERT_OK, "%s", pipert_last_error());
}

Test(session, bad_batches_from_the_host_are_refused_by_name)
{
    cr_expect_eq(step_with_batches(1), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "token 300"), "%s", pipert_last_error());
    cr_expect_eq(step_with_batches(2), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "returned 5"), "%s", pipert_last_error());
}

/* ---- a job bootstrapped by the host's allgather ------------------------------- */

/* The hub: every rank sends (size, bytes), gets everyone's bytes back. */
typedef struct hub_link {
    int fd;
} hub_link;

static int write_all(int fd, const void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = write(fd, (const char *)p + done, n - done);
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = read(fd, (char *)p + done, n - done);
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    return 0;
}

static int hub_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    hub_link *link = user;
    uint64_t size = bytes;
    if (write_all(link->fd, &size, sizeof size) || write_all(link->fd, send, bytes)) return -1;
    uint64_t total;
    if (read_all(link->fd, &total, sizeof total)) return -1;
    return read_all(link->fd, recv, total);
}

/* Runs in the test process: serves allgathers until every rank hangs up. */
static void serve_hub(int *fds, int n)
{
    for (;;) {
        uint64_t size = 0;
        char *all = NULL;
        for (int r = 0; r < n; r++) {
            uint64_t mine;
            if (read_all(fds[r], &mine, sizeof mine)) {
                free(all);
                return; /* a rank is gone: the job is over */
            }
            if (r == 0) {
                size = mine;
                all = malloc(size * (uint64_t)n);
            }
            cr_assert(all && mine == size, "allgather sizes differ");
            cr_assert_eq(read_all(fds[r], all + (size_t)r * size, size), 0);
        }
        uint64_t total = size * (uint64_t)n;
        for (int r = 0; r < n; r++) {
            write_all(fds[r], &total, sizeof total);
            write_all(fds[r], all, total);
        }
        free(all);
    }
}

typedef int (*rank_main)(int rank, int n, hub_link *link, int out_fd);

/* Forks n ranks, serves their allgathers, collects what they write to out,
 * and returns how many exited with status 0. */
static int run_ranks(int n, rank_main body, char *out, size_t out_cap)
{
    int fds[MAX_RANKS], out_pipe[2];
    pid_t pids[MAX_RANKS];
    cr_assert_eq(pipe(out_pipe), 0);
    for (int r = 0; r < n; r++) {
        int pair[2];
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] == 0) {
            close(pair[0]);
            close(out_pipe[0]);
            hub_link link = {pair[1]};
            alarm(120); /* nothing outlives a test */
            _exit(body(r, n, &link, out_pipe[1]));
        }
        close(pair[1]);
        fds[r] = pair[0];
    }
    close(out_pipe[1]);
    serve_hub(fds, n);
    size_t used = 0;
    ssize_t k;
    while (used + 1 < out_cap && (k = read(out_pipe[0], out + used, out_cap - 1 - used)) > 0)
        used += (size_t)k;
    out[used] = '\0';
    close(out_pipe[0]);
    int ok = 0;
    for (int r = 0; r < n; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        close(fds[r]);
    }
    return ok;
}

static pipert_session *join(int rank, int n, int stages, hub_link *link, const char *extra,
                            const char *dir)
{
    pipert_config *cfg = small_config(extra);
    pipert_oob oob = {.rank = rank, .size = n, .allgather = hub_allgather, .user = link};
    pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
    o.out_dir = dir;
    o.stages = stages;
    o.oob = &oob;
    o.log_level = PIPERT_LOG_WARN;
    pipert_session *s = NULL;
    if (pipert_session_create(cfg, &o, &s) != PIPERT_OK)
        fprintf(stderr, "rank %d: %s\n", rank, pipert_last_error());
    pipert_config_free(cfg);
    return s;
}

static char job_dir[64];

/* Two stages, flush: the last stage prints its losses. */
static int pipeline_rank(int rank, int n, hub_link *link, int out_fd)
{
    pipert_session *s = join(rank, n, 2, link, "pipeline.schedule=1f1b", job_dir);
    if (!s) return 1;
    pipert_metrics m = {.size = sizeof m};
    int failed = 0;
    while (!failed && !m.done) {
        failed = pipert_session_step(s, &m) != PIPERT_OK;
        if (failed) fprintf(stderr, "rank %d: %s\n", rank, pipert_last_error());
        else if (m.stage == 1) dprintf(out_fd, "%ld %.9g\n", m.step, (double)m.loss);
    }
    pipert_session_destroy(s);
    return failed;
}

Test(session, a_pipeline_bootstrapped_by_the_host_equals_one_worker)
{
    float reference[STEPS];
    char accum[64];
    snprintf(accum, sizeof accum, "train.grad_accum=%d", 4); /* pipeline.microbatches' default */
    train_alone(accum, reference);
    snprintf(job_dir, sizeof job_dir, "%s", temp_dir());
    char out[4096];
    cr_assert_eq(run_ranks(2, pipeline_rank, out, sizeof out), 2, "ranks failed; output:\n%s", out);
    int seen = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        long step;
        double loss;
        cr_assert_eq(sscanf(line, "%ld %lf", &step, &loss), 2, "line: %s", line);
        cr_assert(step >= 1 && step <= STEPS);
        cr_expect(fabs(loss - reference[step - 1]) <= 1e-5 * fabs(reference[step - 1]),
                  "step %ld: pipeline %.7f, one worker %.7f", step, loss, reference[step - 1]);
        seen++;
    }
    cr_expect_eq(seen, STEPS);
}

/* ---- stop() while a step waits for a peer -------------------------------------- */

typedef struct stopper {
    pipert_session *s;
    double delay_s, stopped_at;
    const char *abort_reason; /* NULL: stop */
} stopper;

static void *stop_later(void *arg)
{
    stopper *st = arg;
    usleep((useconds_t)(st->delay_s * 1e6));
    st->stopped_at = now_s();
    if (st->abort_reason) pipert_session_abort(st->s, st->abort_reason);
    else pipert_session_stop(st->s);
    return NULL;
}

static int waiting_stages;
static const char *abort_reason;

/* Rank 1 joins and then never steps; rank 0's step waits for it (a gradient
 * of the pipeline, or the replicas' all-reduce) until another thread stops
 * the session. Rank 0 prints how long stop() took to return control. */
static int stuck_rank(int rank, int n, hub_link *link, int out_fd)
{
    pipert_session *s = join(rank, n, waiting_stages, link, NULL, job_dir);
    if (!s) return 1;
    if (rank != 0) {
        sleep(8); /* alive, silent */
        pipert_session_destroy(s);
        return 0;
    }
    stopper st = {s, 1.0, 0, abort_reason};
    pthread_t thread;
    pthread_create(&thread, NULL, stop_later, &st);
    pipert_result rc = pipert_session_step(s, NULL);
    const double returned = now_s();
    pthread_join(thread, NULL);
    dprintf(out_fd, "%d %.3f %s\n", (int)rc, returned - st.stopped_at, pipert_last_error());
    pipert_session_destroy(s);
    return 0;
}

static void check_stop_returns(int stages, const char *reason)
{
    waiting_stages = stages;
    abort_reason = reason;
    snprintf(job_dir, sizeof job_dir, "%s", temp_dir());
    char out[256];
    cr_assert_eq(run_ranks(2, stuck_rank, out, sizeof out), 2, "ranks failed: %s", out);
    int rc;
    double seconds;
    cr_assert_eq(sscanf(out, "%d %lf", &rc, &seconds), 2, "rank 0 said: %s", out);
    cr_expect_eq(rc, PIPERT_ERR_INTERRUPTED, "the step returned %d", rc);
    /* The bound is the promise of the API (one second), with room for a
     * loaded machine; a step that ignores stop() would hang until rank 1
     * leaves, 7 s later. */
    cr_expect(seconds < 3.0, "control came back %.2f s after stop()", seconds);
    if (reason) cr_expect(strstr(out, reason), "the error does not give the reason: %s", out);
}

Test(session, stop_returns_from_a_pipeline_wait) { check_stop_returns(2, NULL); }
Test(session, stop_returns_from_a_replica_collective) { check_stop_returns(1, NULL); }
Test(session, abort_returns_with_its_reason) { check_stop_returns(2, "simulation diverged"); }

/* ---- the library's own threads log through the session's callback -------------- */

static pthread_t calling_thread;
static int transport_lines_elsewhere; /* from another thread than the session's caller */
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture_threads(void *user, pipert_log_level level, const char *line)
{
    (void)user;
    (void)level;
    pthread_mutex_lock(&capture_lock); /* the callback is called from several threads */
    if (!pthread_equal(pthread_self(), calling_thread) && strstr(line, "transport: "))
        transport_lines_elsewhere++;
    pthread_mutex_unlock(&capture_lock);
}

/* Two replicas, logging at debug level to a callback, stderr going to a file: the progress
 * thread's lines (a peer connected, a peer left) reach the callback, and no line of pipert's
 * reaches stderr (UCX's own may). Each rank prints "<rank> <lines from other threads> <pipert
 * lines on stderr>". */
static int callback_rank(int rank, int n, hub_link *link, int out_fd)
{
    char path[128];
    snprintf(path, sizeof path, "%s/stderr-%d", job_dir, rank);
    FILE *err = freopen(path, "w", stderr);
    if (!err) return 1;
    calling_thread = pthread_self();
    pipert_config *cfg = small_config(NULL);
    pipert_oob oob = {.rank = rank, .size = n, .allgather = hub_allgather, .user = link};
    pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
    o.out_dir = job_dir;
    o.stages = 1;
    o.oob = &oob;
    o.log = capture_threads;
    o.log_level = PIPERT_LOG_DEBUG;
    pipert_session *s = NULL;
    int failed = pipert_session_create(cfg, &o, &s) != PIPERT_OK;
    pipert_config_free(cfg);
    pipert_metrics m = {.size = sizeof m};
    for (int step = 0; !failed && step < 3; step++) failed = pipert_session_step(s, &m) != PIPERT_OK;
    pipert_session_destroy(s);
    fflush(stderr);
    FILE *written = fopen(path, "r");
    long ours = written ? 0 : -1;
    char line[4096];
    while (written && fgets(line, sizeof line, written))
        ours += strstr(line, " debug ") || strstr(line, " info  ") || strstr(line, " warn  ") ||
                strstr(line, " error ");
    if (written) fclose(written);
    dprintf(out_fd, "%d %d %ld\n", rank, transport_lines_elsewhere, ours);
    return failed;
}

Test(session, the_librarys_threads_log_through_the_callback)
{
    snprintf(job_dir, sizeof job_dir, "%s", temp_dir());
    char out[256];
    cr_assert_eq(run_ranks(2, callback_rank, out, sizeof out), 2, "ranks failed: %s", out);
    int ranks = 0, elsewhere_total = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int rank, elsewhere;
        long bytes;
        cr_assert_eq(sscanf(line, "%d %d %ld", &rank, &elsewhere, &bytes), 3, "line: %s", line);
        cr_expect_eq(bytes, 0, "rank %d wrote %ld lines of pipert's to stderr (see %s/stderr-%d)",
                     rank, bytes, job_dir, rank);
        elsewhere_total += elsewhere;
        ranks++;
    }
    cr_expect_eq(ranks, 2);
    cr_expect_gt(elsewhere_total, 0, "no transport line reached the callback from the progress "
                                     "thread");
}
