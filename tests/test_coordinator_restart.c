/* The coordinator is not a single point of failure (issue 29 item 5), with the fault injected
 * from outside real processes: under `pipert launch` the coordinator is a process of its own
 * (DIR/coordinator.pid); the test sends it SIGKILL, again and again, while a 2 stages × 2
 * replicas job trains. The launcher starts it again, the workers register with the new one and
 * train on (comm/coordinator_recover.c). Then:
 *   - the job finishes (exit 0), every step's loss equal to an undisturbed run's: the
 *     coordinator is control only, so its deaths cost no step;
 *   - each worker logged that it registered again, once per kill;
 *   - in an elastic job, a worker killed right after the coordinator takes its replica out
 *     (the new coordinator learns of it from the launcher, or misses it at its roll call),
 *     and the other replica finishes the job. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/fileio.h"
#include "tests/command.h"

#define MODEL                                                                                      \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 "     \
    "--train.log_every=1 --runtime.threads=1 --train.checkpoint_every=0"
/* The kills are noticed by closed connections, not by silence: a heartbeat timeout well above
 * the default keeps a worker that the loaded machine (a sanitizer build beside other tests on
 * two cores) did not run for 5 s from being counted dead. */
#define JOB "--stages 2 --replicas 2 --heartbeat-timeout 20"
enum { STEPS = 4000, KILLS = 5, STEPS_BETWEEN_KILLS = 40 };
#define TAKEN_OVER "coordinator: took the running job over"
#define REGISTERED_AGAIN "this rank registered with it again"

static char *file_in(const char *dir, const char *name)
{
    char path[700], *text = NULL;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return pt_read_file(path, &text, &size) == PIPERT_OK ? text : NULL;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

static pid_t coordinator_pid(const char *dir)
{
    char *text = file_in(dir, "coordinator.pid");
    const pid_t pid = text ? (pid_t)atoi(text) : 0;
    free(text);
    return pid;
}

static pid_t start_launch(const char *dir, const char *options)
{
    char command[4096];
    snprintf(command, sizeof command,
             "exec env PIPERT_LOG=info %s launch --quiet " JOB " %s " MODEL
             " --train.steps=%d --out %s >%s/launch.out 2>&1",
             pipert_bin(), options, STEPS, dir, dir);
    return start_shell(command);
}

/* Waits until `done(dir)` holds; fails if the launcher ends first or 120 s pass. */
static void wait_for(pid_t launcher, const char *dir, bool (*done)(const char *, long), long arg,
                     const char *what)
{
    const double deadline = pt_now_s() + 120;
    while (!done(dir, arg)) {
        int status;
        char *out = file_in(dir, "launch.out");
        cr_assert_eq(waitpid(launcher, &status, WNOHANG), 0,
                     "pipert launch ended before %s (status %d):\n%s", what, status,
                     out ? out : "");
        free(out);
        cr_assert_lt(pt_now_s(), deadline, "%s did not happen within 120 s", what);
        usleep(5000);
    }
}

static bool reached_step(const char *dir, long step) { return logged_step(dir) >= step; }

static bool taken_over(const char *dir, long times)
{
    char *out = file_in(dir, "launch.out");
    const bool done = count_of(out, TAKEN_OVER) >= times;
    free(out);
    return done;
}

/* SIGKILL to the coordinator `pid`. A coordinator already gone was reaped by its launcher:
 * it ended on its own, or the whole job did; the failure shows the launcher's word on it. */
static void kill_or_explain(pid_t launcher, const char *dir, pid_t pid)
{
    if (kill(pid, SIGKILL) == 0) return;
    const int error = errno;
    int status = 0;
    const pid_t ended = waitpid(launcher, &status, WNOHANG);
    char *out = file_in(dir, "launch.out");
    cr_assert_fail("kill %d (the coordinator in %s/coordinator.pid): %s; pipert launch %s "
                   "(status %d), its output:\n%s",
                   (int)pid, dir, strerror(error), ended == launcher ? "had ended" : "runs on",
                   status, out ? out : "(none)");
}

/* Kills the coordinator `kills` times, each after the new one took the job over and the job
 * trained on; the launcher's pid. */
static pid_t kill_the_coordinator_again_and_again(const char *dir, const char *options, int kills)
{
    pid_t launcher = start_launch(dir, options);
    wait_for(launcher, dir, reached_step, STEPS_BETWEEN_KILLS, "the first steps");
    for (int k = 1; k <= kills; k++) {
        const pid_t pid = coordinator_pid(dir);
        cr_assert_gt(pid, 0, "no coordinator.pid in %s", dir);
        kill_or_explain(launcher, dir, pid);
        wait_for(launcher, dir, taken_over, k, "a new coordinator's taking the job over");
        const long step = logged_step(dir);
        wait_for(launcher, dir, reached_step, step + STEPS_BETWEEN_KILLS, "steps after a kill");
    }
    return launcher;
}

/* The job stopped (SIGTERM) once it logged `step`: its exit status; *stopped_at its last step.
 * The test has seen what it needs by then: the job is sized for the slowest machine. */
static int stop_launcher_at(pid_t launcher, const char *dir, long step, long *stopped_at)
{
    char out[600];
    snprintf(out, sizeof out, "%s/launch.out", dir);
    return stop_job_at_step(launcher, dir, step, 240, out, stopped_at);
}

/* Steps the job trains after the last kill before the test stops it: every rank has logged its
 * registering again by then. */
#define STEPS_BEFORE_STOP 100

Test(coordinator_restart, killed_five_times_the_job_loses_no_step, .timeout = 600)
{
    char *reference = make_temp_dir(), *dir = make_temp_dir();
    const pid_t launcher = kill_the_coordinator_again_and_again(dir, "", KILLS);
    long last;
    const int status = stop_launcher_at(launcher, dir, logged_step(dir) + STEPS_BEFORE_STOP, &last);
    char *out = file_in(dir, "launch.out");
    cr_assert_eq(status, 128 + SIGTERM, "pipert launch failed (%d) after the kills:\n%s", status,
                 out);
    cr_assert_lt(last, STEPS, "the job ended before the test stopped it: raise STEPS");
    cr_expect_eq(count_of(out, "was killed by SIGKILL; starting it again"), KILLS, "%s", out);
    free(out);
    for (int r = 0; r < 4; r++) {
        char name[64], expected[96];
        snprintf(name, sizeof name, "logs/rank-%d.log", r);
        snprintf(expected, sizeof expected, "%d times in all", KILLS);
        char *log = file_in(dir, name);
        cr_expect(log && count_of(log, REGISTERED_AGAIN) == KILLS && strstr(log, expected),
                  "rank %d did not register again %d times:\n%s", r, KILLS, log ? log : "");
        free(log);
    }
    /* the same job undisturbed (the same steps: the schedule of the learning rate), to `last` */
    long reference_last;
    const int reference_status =
        stop_launcher_at(start_launch(reference, ""), reference, last, &reference_last);
    cr_assert_eq(reference_status, 128 + SIGTERM, "the undisturbed run failed (%d)",
                 reference_status);
    static double want[STEPS], got[STEPS];
    cr_assert_geq(read_metric_steps(reference, "metrics.jsonl", "loss", want, STEPS), last);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", got, STEPS), last,
                 "the run's metrics.jsonl lacks steps");
    for (int step = 1; step <= last; step++)
        cr_expect_eq(got[step - 1], want[step - 1],
                     "step %d: loss %.9g with the coordinator killed %d times, %.9g undisturbed",
                     step, got[step - 1], want[step - 1], KILLS);
    remove_dir(reference);
    remove_dir(dir);
}

Test(coordinator_restart, a_worker_killed_with_the_coordinator_takes_its_replica_out,
     .timeout = 600)
{
    char *dir = make_temp_dir();
    pid_t launcher = kill_the_coordinator_again_and_again(dir, "--min-replicas 1", 1);
    /* both at once: the coordinator, and stage 1 of replica 1 */
    char *pids = file_in(dir, "workers.pid");
    int rank3 = 0, rank, pid, used;
    for (const char *p = pids; p && sscanf(p, "%d %d\n%n", &rank, &pid, &used) == 2; p += used)
        if (rank == 3) rank3 = pid;
    free(pids);
    cr_assert_gt(rank3, 0);
    const long killed_at = logged_step(dir);
    kill_or_explain(launcher, dir, coordinator_pid(dir));
    cr_assert_eq(kill(rank3, SIGKILL), 0, "kill rank 3 (%d): %s", rank3, strerror(errno));
    wait_for(launcher, dir, taken_over, 2, "a new coordinator's taking the job over");
    long last;
    const int status = stop_launcher_at(launcher, dir, killed_at + 2 * STEPS_BEFORE_STOP, &last);
    char *out = file_in(dir, "launch.out");
    cr_assert_eq(status, 128 + SIGTERM, "pipert launch failed (%d):\n%s", status, out);
    cr_expect(count_of(out, TAKEN_OVER) == 2, "%s", out);
    /* for rank 3's death, or for its neighbour's failing because of it: the coordinator's own
     * word, noted while it rebuilt the job (not, say, a pipeline that timed out later) */
    cr_expect(strstr(out, "replica 1 leaves the job: rank 3: ") ||
                  strstr(out, "replica 1 leaves the job: rank 2: "),
              "%s", out);
    free(out);
    /* the survivors trained on, without the coordinator that was killed with the worker */
    cr_expect_geq(last, killed_at + 2 * STEPS_BEFORE_STOP, "the job stopped at step %ld, killed "
                  "at %ld", last, killed_at);
    cr_expect_lt(last, STEPS, "the job ended before the test stopped it: raise STEPS");
    remove_dir(dir);
}
