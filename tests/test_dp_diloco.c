/* The outer methods (diloco, streaming-diloco, co2) in real processes:
 * `pipert launch --replicas 2` on tiny models, checked from outside through
 * metrics.jsonl, metrics-stage-0.jsonl and the workers' logs.
 *
 * - DiLoCo with H = 1, η = 1, μ = 0 is plain parameter averaging after every
 *   step. Two independent references:
 *   (a) identical data on both replicas: a text whose period (16 bytes)
 *       divides the sequence length, read sequentially from offsets that are
 *       multiples of it, so every sequence of every batch is the same. The
 *       replicas then take identical steps, averaging them changes nothing,
 *       and the run must equal one worker with the same per-replica batch. A
 *       wrong sign or scale of the outer step would not (outer_lr = 0.5 is
 *       checked to differ: the test can fail);
 *   (b) ordinary data: dp.method=sparse with fraction 1, rule avg, delay 0
 *       (ALGORITHMS.md §4.2, a separate implementation in dp/sparse.c) is
 *       also θ ← mean_r θ_r after every step.
 * - streaming-diloco with one fragment, no overlap and α = 0 equals diloco
 *   step for step (1e-5).
 * - Outer settings left unset are each method's own (diloco: η 1.0, μ 0.5).
 * - A run resumed from a checkpoint written with an exchange in flight
 *   continues with the losses of the uninterrupted run. On ordinary data,
 *   where the replicas drift apart between outer steps, each replica resumes
 *   from its own file: the losses and both replicas' final checkpoints are
 *   the uninterrupted run's, also in a 2-stage asynchronous pipeline.
 * - Replicas at different speeds: one worker is throttled from outside
 *   (SIGSTOP/SIGCONT in a 15 ms / 5 ms duty cycle, as cpulimit does; a cgroup
 *   CPU limit needs privileges a test does not have, and taskset only moves a
 *   worker to another core of equal speed). Both replicas log the same
 *   sequence of (step, fragment), the run ends, and the fast replica waited.
 * - Every method trains a 2-stage × 2-replica asynchronous pipeline, and
 *   sends only at its sync steps. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"

#define MODEL                                                                                      \
    "--model.n_layer=4 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.warmup_steps=2 --train.val_every=0 --train.val_batches=2 --train.log_every=1 "       \
    "--pipeline.trace=false"
enum { STEPS = 20, MAX_STEPS = 200 };


static double final_val_loss(const char *dir)
{
    double v[MAX_STEPS] = {0};
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "val_loss", v, MAX_STEPS), 1, "%s: no val_loss", dir);
    for (int i = 0; i < MAX_STEPS; i++)
        if (v[i] != 0) return v[i];
    return NAN;
}

/* The largest relative difference of the per-step losses of two runs. */
static double loss_difference(const char *a, const char *b, int steps, int *worst_step)
{
    double x[MAX_STEPS], y[MAX_STEPS], worst = 0;
    cr_assert_eq(read_metric_steps(a, "metrics.jsonl", "loss", x, steps), steps, "%s: steps missing", a);
    cr_assert_eq(read_metric_steps(b, "metrics.jsonl", "loss", y, steps), steps, "%s: steps missing", b);
    for (int i = 0; i < steps; i++) {
        const double d = fabs(x[i] - y[i]) / fabs(x[i]);
        if (d > worst) worst = d, *worst_step = i + 1;
    }
    return worst;
}

static void expect_same_run(const char *reference, const char *dir, const char *what)
{
    int step = 0;
    const double d = loss_difference(reference, dir, STEPS, &step);
    cr_expect_leq(d, 1e-5, "%s: the losses differ by %.3g (relative) at step %d", what, d, step);
    const double va = final_val_loss(reference), vb = final_val_loss(dir);
    cr_expect_leq(fabs(va - vb), 1e-5 * fabs(va), "%s: val_loss %.9g, the reference %.9g", what,
                  vb, va);
}

static char *launch(int stages, const char *extra)
{
    char *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages %d --replicas 2 --out %s " MODEL " --train.steps=%d "
           "--train.batch_size=2 %s",
           stages, dir, STEPS, extra);
    return dir;
}

/* ---- DiLoCo with H = 1, η = 1, μ = 0 is parameter averaging every step -------- */

#define DILOCO_AVERAGING                                                                           \
    "--dp.method=diloco --dp.period=1 --dp.outer_lr=1 --dp.outer_momentum=0"

/* 16000 bytes of a 16-byte pattern: every sequence read at a multiple of the
 * block size (32) from the 14400 training bytes is the same. */
static char *periodic_text(const char *dir)
{
    char *path = malloc(600);
    snprintf(path, 600, "%s/periodic.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 1000; i++) fputs("pipert: outer 16", f);
    fclose(f);
    return path;
}

Test(dp_diloco, averaging_every_step_on_identical_data_equals_one_worker, .timeout = 300)
{
    char *data_dir = make_temp_dir(), *text = periodic_text(data_dir);
    char data[800];
    snprintf(data, sizeof data, "--data.path=%s --data.sampling=sequential --data.val_fraction=0.1",
             text);
    char *single = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " MODEL " --train.steps=%d --train.batch_size=2 "
           "--runtime.threads=1 %s",
           single, STEPS, data);
    char extra[1024];
    snprintf(extra, sizeof extra, "%s %s", DILOCO_AVERAGING, data);
    char *diloco = launch(1, extra);
    expect_same_run(single, diloco, "diloco H=1 η=1 μ=0 on identical data vs one worker");

    /* The reference can tell: half an outer step is not averaging. */
    snprintf(extra, sizeof extra, "--dp.method=diloco --dp.period=1 --dp.outer_lr=0.5 "
                                  "--dp.outer_momentum=0 %s", data);
    char *half = launch(1, extra);
    int step = 0;
    cr_expect_gt(loss_difference(single, half, STEPS, &step), 1e-3,
                 "outer_lr=0.5 trains like one worker too: the comparison cannot fail");
    remove_dir(half);
    remove_dir(diloco);
    remove_dir(single);
    free(text);
    remove_dir(data_dir);
}

Test(dp_diloco, averaging_every_step_equals_sparse_averaging_of_every_element, .timeout = 300)
{
    char *sparse = launch(1, "--dp.method=sparse --dp.fraction=1 --dp.rule=avg --dp.delay=0");
    char *diloco = launch(1, DILOCO_AVERAGING);
    expect_same_run(sparse, diloco, "diloco H=1 η=1 μ=0 vs sparse p=1 avg");
    remove_dir(diloco);
    remove_dir(sparse);
}

Test(dp_diloco, streaming_with_one_fragment_no_overlap_and_alpha_zero_is_diloco, .timeout = 300)
{
    const char *outer = "--dp.period=4 --dp.outer_lr=0.7 --dp.outer_momentum=0.9";
    char a[256], b[256];
    snprintf(a, sizeof a, "--dp.method=diloco %s", outer);
    snprintf(b, sizeof b, "--dp.method=streaming-diloco --dp.fragments=1 --dp.overlap=0 "
                          "--dp.alpha=0 %s", outer);
    char *diloco = launch(1, a), *streaming = launch(1, b);
    expect_same_run(diloco, streaming, "streaming-diloco P=1 τ=0 α=0 vs diloco");
    remove_dir(streaming);
    remove_dir(diloco);
}

/* ---- checkpoints ---------------------------------------------------------------- */

/* A run resumed from the checkpoint of step 9 — written while fragment 1,
 * posted at step 8, was in flight until step 10 — continues with the losses
 * of the uninterrupted run. (On identical data, so every replica holds the
 * same θ, inner optimizer, θ̃ and v; the next test has replicas that differ.) */
/* dp.outer_lr and dp.outer_momentum left unset: each method takes its own (diloco η = 1.0,
 * μ = 0.5; streaming-diloco 0.7, 0.9), exactly as if they were set; and they matter (the paper's
 * values on diloco train otherwise: the comparison can fail). */
Test(dp_diloco, unset_outer_settings_are_each_methods_own, .timeout = 300)
{
    char *own = launch(1, "--dp.method=diloco --dp.period=4");
    char *set = launch(1, "--dp.method=diloco --dp.period=4 --dp.outer_lr=1.0 --dp.outer_momentum=0.5");
    expect_same_run(set, own, "diloco with its own outer step vs η = 1.0, μ = 0.5 set");
    char *paper = launch(1, "--dp.method=diloco --dp.period=4 --dp.outer_lr=0.7 --dp.outer_momentum=0.9");
    int step = 0;
    cr_expect_gt(loss_difference(own, paper, STEPS, &step), 1e-4,
                 "diloco's own outer step trains like η = 0.7, μ = 0.9: the comparison cannot fail");
    char *streaming = launch(1, "--dp.method=streaming-diloco --dp.period=4");
    char *streaming_set = launch(1, "--dp.method=streaming-diloco --dp.period=4 --dp.outer_lr=0.7 "
                                    "--dp.outer_momentum=0.9");
    expect_same_run(streaming_set, streaming, "streaming-diloco's own outer step vs 0.7, 0.9 set");
    remove_dir(streaming_set);
    remove_dir(streaming);
    remove_dir(paper);
    remove_dir(set);
    remove_dir(own);
}

Test(dp_diloco, a_resumed_run_applies_the_exchange_it_had_in_flight, .timeout = 300)
{
    char *data_dir = make_temp_dir(), *text = periodic_text(data_dir);
    char extra[1024];
    snprintf(extra, sizeof extra,
             "--data.path=%s --data.sampling=sequential --dp.method=streaming-diloco "
             "--dp.fragments=2 --dp.period=6 --dp.overlap=2 --dp.alpha=0.7 --dp.outer_lr=0.4 "
             "--train.checkpoint_every=9 --train.keep_checkpoints=0",
             text);
    char *whole = launch(1, extra), *resumed = launch(1, extra);
    char command[2048];
    snprintf(command, sizeof command, "rm %s/ckpt-00000018* %s/ckpt-00000020*", resumed, resumed);
    cr_assert_eq(system(command), 0, "no checkpoints of steps 18 and 20 in %s", resumed);
    char path[700];
    snprintf(path, sizeof path, "%s/ckpt-00000009-stage-0.safetensors", resumed);
    char *file;
    size_t size;
    cr_assert_eq(pt_read_file(path, &file, &size), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(memmem(file, size, "dp.pending.h.1.attn.c_attn.weight", 33),
              "the checkpoint of step 9 does not hold the exchange in flight");
    free(file);
    run_pipert_ok("launch --quiet --resume --stages 1 --replicas 2 --out %s " MODEL " --train.steps=%d "
           "--train.batch_size=2 %s",
           resumed, STEPS, extra);
    expect_same_run(whole, resumed, "resumed at step 9 with an exchange in flight");
    remove_dir(resumed);
    remove_dir(whole);
    free(text);
    remove_dir(data_dir);
}

/* Each replica resumes from its own file: diloco with H = 4 on ordinary data
 * (the replicas drift apart between outer steps), checkpoints every 5 steps,
 * replica 1 killed at step 13. The run resumes from step 10, two inner steps
 * after an outer step, each replica with its own θ and inner moments (and θ̃,
 * v), and continues with the losses of the uninterrupted run; both replicas
 * end bitwise where they did. The same in a 2-stage asynchronous pipeline,
 * whose in-flight microbatches replay on each replica's own stashed weights.
 * (Resumed from replica 0's files, replica 1 would take replica 0's θ and
 * moments, and the losses would differ from the outer step of step 12 on.) */
Test(dp_diloco, a_resumed_run_continues_every_replica_exactly, .timeout = 300)
{
    const char *schedules[] = {"", "--pipeline.schedule=async-1f1b"};
    for (int stages = 1; stages <= 2; stages++) {
        char extra[512], what[128];
        snprintf(extra, sizeof extra, "--dp.method=diloco --dp.period=4 --dp.outer_lr=0.7 "
                                      "--train.checkpoint_every=5 --train.keep_checkpoints=0 %s",
                 schedules[stages - 1]);
        snprintf(what, sizeof what, "diloco H=4, %d stage%s x 2 replicas, resumed at step 10",
                 stages, stages == 1 ? "" : "s");
        char *whole = launch(stages, extra), *resumed = make_temp_dir(), env[128];
        snprintf(env, sizeof env, "PIPERT_TEST_DIE_AT_STEP=13 PIPERT_TEST_DIE_RANK=%d", stages);
        run_result r = run_pipert_with(env, "launch --quiet --stages %d --replicas 2 --out %s " MODEL
                                       " --train.steps=%d --train.batch_size=2 %s",
                                       stages, resumed, STEPS, extra);
        cr_assert_eq(r.status, 1, "%s: the run that should die at step 13 ended with %d: %s", what,
                     r.status, r.err);
        run_pipert_ok("launch --quiet --resume --stages %d --replicas 2 --out %s " MODEL
                      " --train.steps=%d --train.batch_size=2 %s",
                      stages, resumed, STEPS, extra);
        expect_same_run(whole, resumed, what);
        for (int stage = 0; stage < stages; stage++) {
            char name[96];
            snprintf(name, sizeof name, "ckpt-%08d-stage-%d.safetensors", STEPS, stage);
            expect_same_tensors(whole, resumed, name, what);
            snprintf(name, sizeof name, "ckpt-%08d-stage-%d-replica-1.safetensors", STEPS, stage);
            expect_same_tensors(whole, resumed, name, what);
        }
        remove_dir(resumed);
        remove_dir(whole);
    }
}

/* ---- replicas at different speeds -------------------------------------------- */

/* The pid of `rank` once DIR/workers.pid lists it, or 0. */
static pid_t worker_pid(const char *dir, int rank)
{
    char path[512];
    snprintf(path, sizeof path, "%s/workers.pid", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int r;
    long pid;
    pid_t found = 0;
    while (fscanf(f, "%d %ld", &r, &pid) == 2)
        if (r == rank) found = (pid_t)pid;
    fclose(f);
    return found;
}

/* "step S posts fragment F" lines of a worker's log, as S·100 + F. */
static int posted_fragments(const char *dir, int rank, long *out, int capacity)
{
    char path[512], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/logs/rank-%d.log", dir, rank);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int n = 0;
    for (char *p = strstr(text, ": step "); p && n < capacity; p = strstr(p + 1, ": step ")) {
        long step;
        int fragment;
        if (sscanf(p, ": step %ld posts fragment %d", &step, &fragment) == 2)
            out[n++] = step * 100 + fragment;
    }
    free(text);
    return n;
}

Test(dp_diloco, replicas_at_different_speeds_agree_on_the_fragment_order, .timeout = 300)
{
    enum { RUN_STEPS = 180 };
    char *dir = make_temp_dir();
    char command[2048];
    snprintf(command, sizeof command,
             "PIPERT_LOG=debug %s launch --quiet --replicas 2 --out %s " MODEL
             " --train.steps=%d --train.batch_size=2 --dp.method=streaming-diloco "
             "--dp.fragments=2 --dp.period=6 --dp.overlap=2 >/dev/null 2>%s/launch.err",
             pipert_bin(), dir, RUN_STEPS, dir);
    const pid_t launcher = fork();
    cr_assert_geq(launcher, 0);
    if (launcher == 0) {
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    const double started = pt_now_s();
    pid_t slow = 0;
    int status = -1;
    bool deadlocked = false;
    for (;;) {
        const pid_t done = waitpid(launcher, &status, WNOHANG);
        if (done == launcher) break;
        if (pt_now_s() - started > 180) {
            deadlocked = true;
            if (slow) kill(slow, SIGCONT);
            kill(launcher, SIGTERM);
            waitpid(launcher, &status, 0);
            break;
        }
        if (!slow) slow = worker_pid(dir, 1);
        if (slow && kill(slow, SIGSTOP) == 0) {
            usleep(15000);
            kill(slow, SIGCONT);
            usleep(5000);
        } else usleep(5000);
    }
    cr_assert_not(deadlocked, "the job did not end within 180 s with replica 1 throttled");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "pipert launch failed (see %s)", dir);
    cr_assert_neq(slow, 0, "replica 1 was never throttled");

    long fast[128], slowed[128];
    const int n_fast = posted_fragments(dir, 0, fast, 128),
              n_slow = posted_fragments(dir, 1, slowed, 128);
    /* slots 2 apart, τ = 2, nothing posted that falls due after the last step */
    cr_expect_eq(n_fast, RUN_STEPS / 2 - 1, "replica 0 posted %d fragments", n_fast);
    cr_expect_eq(n_slow, n_fast, "replica 1 posted %d fragments, replica 0 %d", n_slow, n_fast);
    for (int i = 0; i < n_fast && i < n_slow; i++)
        cr_expect_eq(fast[i], slowed[i], "post %d: replica 0 step %ld fragment %ld, replica 1 step "
                                         "%ld fragment %ld", i, fast[i] / 100, fast[i] % 100,
                     slowed[i] / 100, slowed[i] % 100);
    double wait[RUN_STEPS] = {0}, waited = 0;
    read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_wait_ms", wait, RUN_STEPS);
    for (int i = 0; i < RUN_STEPS; i++) waited += wait[i];
    cr_expect_gt(waited, 50.0, "replica 0 waited only %.1f ms for the throttled replica", waited);
    remove_dir(dir);
}

/* ---- every method in an asynchronous pipeline ------------------------------- */

Test(dp_diloco, every_outer_method_trains_a_two_stage_pipeline, .timeout = 300)
{
    const char *methods[] = {
        "--dp.method=diloco --dp.period=5",
        "--dp.method=streaming-diloco --dp.period=6 --dp.fragments=2 --dp.overlap=1",
        "--dp.method=co2 --dp.period=5 --dp.penalty=adaptive",
    };
    const char *names[] = {"diloco", "streaming-diloco", "co2"};
    for (int k = 0; k < 3; k++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 2 --replicas 2 --out %s " MODEL " --train.steps=60 "
               "--train.batch_size=4 --train.lr=3e-3 --pipeline.schedule=async-1f1b %s",
               dir, methods[k]);
        double loss[60], bytes[60];
        cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", loss, 60), 60);
        cr_expect_lt(loss[59], loss[0] - 0.3, "%s: the loss did not fall (%g → %g)", names[k],
                     loss[0], loss[59]);
        cr_assert_eq(read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_bytes", bytes, 60), 60);
        int sending = 0;
        for (int i = 0; i < 60; i++) sending += bytes[i] > 0;
        /* diloco: every 5th step; streaming: 3 slots every 6 steps; co2: every 5th but the last */
        const int expected[] = {12, 29, 11};
        cr_expect_eq(sending, expected[k], "%s: %d steps sent, expected %d", names[k], sending,
                     expected[k]);
        char path[600], *text;
        size_t size;
        snprintf(path, sizeof path, "%s/metrics-stage-0.jsonl", dir);
        cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK);
        char method[64];
        snprintf(method, sizeof method, "\"dp_method\":\"%s\"", names[k]);
        cr_expect(strstr(text, method), "%s: the metrics do not name the method", names[k]);
        free(text);
        remove_dir(dir);
    }
}
