/* The coordinator is not a single point of failure (issue 11 item 2), with
 * the fault injected from outside real processes: a `pipert launch` job of 2
 * stages × 2 replicas runs, and once it is under way the test sends SIGKILL
 * to the launcher, which hosts the coordinator. Then:
 *   - every worker exits on its own with status 4, having logged "coordinator
 *     lost: checkpoint of step N written; resume with --resume", all with the
 *     same N (they agreed on it: session/coordinator_loss.c);
 *   - the checkpoint of step N is complete (the newest usable one, every
 *     file verified) and bitwise the one an uninterrupted run writes at N;
 *   - `pipert launch --resume` continues from N to the end, and every step's
 *     loss equals the uninterrupted run's.
 * Both the flush schedule (1f1b) and the asynchronous one (async-1f1b, where
 * each stage checkpoints after its own N-th step).
 *
 * The test process is a child subreaper (PR_SET_CHILD_SUBREAPER): the
 * workers, orphaned by the launcher's death, become its children, so it can
 * wait for them and read their exit status. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"
#include "train/checkpoint.h"

/* A small model: steps of a few milliseconds, so many steps run in a second or two. */
#define MODEL                                                                                      \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 "     \
    "--train.log_every=1 --runtime.threads=1 --runtime.coordinator_check_steps=3"
/* The workers notice the loss when their wait for a coordinator started again runs out (coord_client.h,
 * reconnect_s): seconds, in which a fast machine takes a few hundred steps (162 here, 291 in a
 * CI run against a bound of STEPS / 2 = 200 when STEPS was 400). */
enum { STEPS = 2000, WORKERS = 4, KILL_AFTER_STEP = 5, CHECK_STEPS = 3 };
#define EXIT_COORDINATOR_LOST 4 /* tools/cmd_worker.c */
#define LOST_MESSAGE "coordinator lost: checkpoint of step "

static void path_in(char *path, size_t cap, const char *dir, const char *name)
{
    snprintf(path, cap, "%s/%s", dir, name);
}

/* `pipert launch` of the job into dir, as a child of this process; its pid. */
static pid_t start_launch(const char *schedule, const char *dir)
{
    char command[4096];
    snprintf(command, sizeof command,
             "exec %s launch --quiet --stages 2 --replicas 2 %s " MODEL " --train.steps=%d "
             "--train.checkpoint_every=0 --out %s >%s/launch.out 2>&1",
             pipert_bin(), schedule, STEPS, dir, dir);
    return start_shell(command);
}

/* The highest step in DIR/metrics.jsonl (0 if none yet). */
static long newest_step(const char *dir)
{
    char path[600], *text;
    size_t size;
    path_in(path, sizeof path, dir, "metrics.jsonl");
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return 0;
    long newest = 0;
    for (const char *p = text; (p = strstr(p, "\"step\":")); p++) {
        long step = strtol(p + strlen("\"step\":"), NULL, 10);
        if (step > newest) newest = step;
    }
    free(text);
    return newest;
}

/* Waits until the job has trained past `step`; fails if the launcher ends first. */
static void wait_until_running(pid_t launcher, const char *dir, long step)
{
    const double deadline = pt_now_s() + 120;
    while (newest_step(dir) < step) {
        int status;
        cr_assert_eq(waitpid(launcher, &status, WNOHANG), 0,
                     "pipert launch ended before step %ld (status %d)", step, status);
        cr_assert_lt(pt_now_s(), deadline, "the job did not reach step %ld in 120 s", step);
        usleep(2000);
    }
}

/* The workers' pids, from DIR/workers.pid ("RANK PID" lines). */
static void read_worker_pids(const char *dir, pid_t pids[WORKERS])
{
    char path[600], *text;
    size_t size;
    path_in(path, sizeof path, dir, "workers.pid");
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int n = 0, rank, pid, used;
    for (const char *p = text; n < WORKERS && sscanf(p, "%d %d\n%n", &rank, &pid, &used) == 2;
         p += used)
        pids[n++] = pid;
    free(text);
    cr_assert_eq(n, WORKERS, "%s lists %d workers", path, n);
}

/* Waits (they are this process's children now) for each worker's exit status. */
static void wait_for_workers(const pid_t pids[WORKERS], int statuses[WORKERS])
{
    const double deadline = pt_now_s() + 120;
    for (int r = 0; r < WORKERS; r++) {
        pid_t got;
        while ((got = waitpid(pids[r], &statuses[r], WNOHANG)) == 0) {
            if (pt_now_s() > deadline) {
                for (int k = r; k < WORKERS; k++) kill(pids[k], SIGKILL);
                cr_assert_fail("rank %d (pid %d) still runs 120 s after the coordinator died", r,
                               (int)pids[r]);
            }
            usleep(10000);
        }
        cr_assert_eq(got, pids[r], "rank %d (pid %d): waitpid: %s (not this process's child?)",
                     r, (int)pids[r], strerror(errno));
    }
}

/* The step N of rank r's "coordinator lost: checkpoint of step N written" line (−1 if none). */
static long lost_step_in_log(const char *dir, int r, char *log, size_t cap)
{
    char name[64], path[600], *text;
    size_t size;
    snprintf(name, sizeof name, "logs/rank-%d.log", r);
    path_in(path, sizeof path, dir, name);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    snprintf(log, cap, "%s", size > cap - 1 ? text + size - (cap - 1) : text);
    const char *line = strstr(text, LOST_MESSAGE);
    long step = line && strstr(line, " written; resume with --resume")
                    ? strtol(line + strlen(LOST_MESSAGE), NULL, 10)
                    : -1;
    free(text);
    return step;
}

/* Kills the launcher of a running job in dir; every worker must stop by
 * itself at one agreed step. Returns that step. */
static long kill_the_coordinator(const char *schedule, const char *dir)
{
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "prctl: %s", strerror(errno));
    pid_t launcher = start_launch(schedule, dir);
    wait_until_running(launcher, dir, KILL_AFTER_STEP);
    pid_t pids[WORKERS];
    read_worker_pids(dir, pids);
    cr_assert_eq(kill(launcher, SIGKILL), 0);
    int status;
    cr_assert_eq(waitpid(launcher, &status, 0), launcher);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    int statuses[WORKERS];
    wait_for_workers(pids, statuses);
    long agreed = -1;
    bool missing = false;
    for (int r = 0; r < WORKERS; r++) {
        char log[4096];
        const long step = lost_step_in_log(dir, r, log, sizeof log);
        cr_expect(WIFEXITED(statuses[r]) && WEXITSTATUS(statuses[r]) == EXIT_COORDINATOR_LOST,
                  "rank %d: %s %d, not exit status %d; its log ends:\n%s", r,
                  WIFEXITED(statuses[r]) ? "exit status" : "signal",
                  WIFEXITED(statuses[r]) ? WEXITSTATUS(statuses[r]) : WTERMSIG(statuses[r]),
                  EXIT_COORDINATOR_LOST, log);
        /* every rank's log is shown before the test gives up: which one stopped where */
        cr_expect_gt(step, 0, "rank %d did not log '" LOST_MESSAGE "N written; resume with "
                              "--resume'; its log ends:\n%s", r, log);
        if (step <= 0) {
            missing = true;
            continue;
        }
        if (agreed < 0) agreed = step;
        cr_expect_eq(step, agreed, "rank %d stopped at step %ld, the first at %ld", r, step, agreed);
    }
    cr_assert(!missing, "a rank did not checkpoint and stop (above)");
    /* after the kill (at step ≥ KILL_AFTER_STEP), a vote of at most 2 periods; well before the end */
    cr_expect(agreed > KILL_AFTER_STEP && agreed % CHECK_STEPS == 0 && agreed < STEPS / 2,
              "stopped at step %ld", agreed);
    return agreed;
}

/* The newest usable checkpoint in dir is the one of `step`, and complete. */
static void expect_complete_checkpoint(const char *dir, long step)
{
    pt_checkpoint_index index;
    cr_assert_eq(pt_checkpoint_find_latest(dir, &index), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(index.step, step, "the newest usable checkpoint is of step %ld, not %ld",
                 index.step, step);
    cr_expect_eq(index.stages, 2);
    pt_checkpoint_index_free(&index);
}

/* Runs `pipert launch` of the job with `options` into dir until it logged `step`, then stops
 * it as a user would (SIGTERM): the job is sized for the workers' noticing the loss on the
 * slowest machine, and what the test compares ends at `step`. */
static void launch_until_step(const char *dir, long step, const char *options)
{
    char command[4096], out[600];
    snprintf(command, sizeof command,
             "exec env PIPERT_LOG=info %s launch --quiet --stages 2 --replicas 2 %s " MODEL
             " --train.steps=%d --out %s >%s/launch.out 2>&1",
             pipert_bin(), options, STEPS, dir, dir);
    path_in(out, sizeof out, dir, "launch.out");
    long last;
    const int status = stop_job_at_step(start_shell(command), dir, step, 240, out, &last);
    cr_assert(status == 128 + SIGTERM && last >= step, "pipert launch %s: exit status %d at "
              "step %ld, not stopped after step %ld (see %s)", options, status, last, step, out);
}

/* Steps the resumed run is compared over after the agreed one. */
#define STEPS_AFTER_RESUME 60

static void check_coordinator_loss(const char *schedule)
{
    char *dir = make_temp_dir(), *reference = make_temp_dir();
    const long agreed = kill_the_coordinator(schedule, dir);
    expect_complete_checkpoint(dir, agreed);
    const long compared_to = agreed + STEPS_AFTER_RESUME;
    /* the same job uninterrupted, with a checkpoint of the agreed step (and its multiples:
     * checkpoints change nothing of the training) */
    char options[256];
    snprintf(options, sizeof options, "%s --train.checkpoint_every=%ld --train.keep_checkpoints=0",
             schedule, agreed);
    launch_until_step(reference, compared_to, options);
    for (int stage = 0; stage < 2; stage++) {
        char name[96];
        snprintf(name, sizeof name, "ckpt-%08ld-stage-%d.safetensors", agreed, stage);
        expect_same_tensors(reference, dir, name, "the checkpoint written without a coordinator");
    }

    snprintf(options, sizeof options, "%s --train.checkpoint_every=0 --resume", schedule);
    launch_until_step(dir, compared_to, options);
    char path[600], *log;
    size_t size;
    path_in(path, sizeof path, dir, "logs/rank-0.log");
    cr_assert_eq(pt_read_file(path, &log, &size), PIPERT_OK, "%s", pipert_last_error());
    char expected[96];
    snprintf(expected, sizeof expected, "resumed from the checkpoint of step %ld ", agreed);
    cr_expect(strstr(log, expected), "rank 0 did not say '%s':\n%s", expected, log);
    free(log);

    static double want[STEPS], got[STEPS];
    cr_assert_geq(read_metric_steps(reference, "metrics.jsonl", "loss", want, STEPS), compared_to);
    cr_assert_geq(read_metric_steps(dir, "metrics.jsonl", "loss", got, STEPS), compared_to,
                  "the resumed run's metrics.jsonl lacks steps");
    for (int step = 1; step <= compared_to; step++)
        cr_expect(fabs(got[step - 1] - want[step - 1]) <= 1e-6 * fabs(want[step - 1]),
                  "step %d: loss %.9g after the coordinator's death and --resume, %.9g "
                  "uninterrupted",
                  step, got[step - 1], want[step - 1]);
    remove_dir(reference);
    remove_dir(dir);
}

Test(coordinator_loss, async_pipeline_checkpoints_one_step_and_resumes_exactly, .timeout = 300)
{
    check_coordinator_loss("--pipeline.schedule=async-1f1b");
}

Test(coordinator_loss, flush_pipeline_checkpoints_one_step_and_resumes_exactly, .timeout = 300)
{
    check_coordinator_loss("--pipeline.schedule=1f1b --pipeline.microbatches=2");
}
