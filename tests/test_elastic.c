/* Elastic replicas, with real processes (comm/membership.h,
 * session/elastic.c, session/join.c): a worker of replica 1 of a 2-stage ×
 * 3-replica job is killed with SIGKILL from outside, mid-run. The job must
 * finish (exit 0) with the two other replicas, their losses going on
 * smoothly, its last checkpoint complete for two replicas (a resume with
 * --replicas 2 goes on from it); with --restarts the replica comes back,
 * takes a survivor's state and trains with the others to the end; without
 * --min-replicas, or below it, the job stops as before. A replica that leaves again at once
 * is started again later each time. Joiners started by hand
 * with other settings are refused by name, and the job goes on without them. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "command.h"

/* Scenarios whose subject is orchestration (the launcher's restart delays, the metrics file
 * changing hands, a look-ahead beside the all-reduce) over library paths the other scenarios
 * run sanitized: the sanitizer build skips them, as it leaves out suite release_only
 * (tests/meson.build: the suite there must stay within 20 minutes on 2 cores). */
#if defined(__SANITIZE_ADDRESS__)
#define RELEASE_BUILD_ONLY() cr_skip_test("orchestration: run by the release build only")
#else
#define RELEASE_BUILD_ONLY() ((void)0)
#endif

#define MODEL                                                                                      \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 "     \
    "--runtime.threads=1 --train.log_every=10 --train.checkpoint_every=100"
/* A killed replica is back within ~120 steps of its kill in either build (release: 400 steps a
 * second; sanitized: 80): 600 steps after the kill leave it five times that. */
enum { STEPS = 1000, KILL_AT = 400, KILLED_RANK = 3 /* stage 1 of replica 1 */ };
#define FINAL_INDEX "/ckpt-00001000.json"
/* A job of these takes seconds in a release build and under 2 minutes sanitized on 2 busy cores. */
#define JOB_LIMIT_S 400.0

/* Starts `pipert launch` of 2 stages × 3 replicas in dir as a child; `elastic`: its options
 * (after MODEL's, so they may override them). */
static pid_t start_job(const char *dir, const char *method, const char *elastic)
{
    char command[4096];
    snprintf(command, sizeof command,
             "PIPERT_LOG=info exec %s launch --quiet --stages 2 --replicas 3 --out %s --dp.method=%s "
             "--train.steps=%d " MODEL " %s >%s.out 2>&1",
             pipert_bin(), dir, method, STEPS, elastic, dir);
    return start_shell(command);
}

/* The pid of a rank, from dir/workers.pid. */
static pid_t worker_pid(const char *dir, int rank)
{
    char path[600], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/workers.pid", dir);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int r, pid = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (sscanf(line, "%d %d", &r, &pid) == 2 && r == rank) break;
    free(text);
    cr_assert_gt(pid, 0, "no pid for rank %d in %s", rank, path);
    return pid;
}

/* Waits for the job to log step `step`, then kills `rank`; the step it was killed at. */
static long kill_rank_at(pid_t job, const char *dir, long step, int rank)
{
    for (int i = 0; i < 6000 && logged_step(dir) < step; i++) {
        cr_assert_eq(waitpid(job, NULL, WNOHANG), 0, "the job ended before step %ld", step);
        usleep(50000);
    }
    const long at = logged_step(dir);
    cr_assert_geq(at, step, "the job did not reach step %ld in time", step);
    cr_assert_eq(kill(worker_pid(dir, rank), SIGKILL), 0);
    return at;
}

static long kill_worker_at(pid_t job, const char *dir, long step)
{
    return kill_rank_at(job, dir, step, KILLED_RANK);
}

/* The job's exit status; a job that hangs is shown and killed after JOB_LIMIT_S. */
static int wait_job(pid_t job, const char *dir)
{
    char pids[600], logs[600], out[600];
    snprintf(pids, sizeof pids, "%s/workers.pid", dir);
    snprintf(logs, sizeof logs, "%s/logs/rank-*.log", dir);
    snprintf(out, sizeof out, "%s.out", dir);
    return wait_job_within(job, JOB_LIMIT_S, pids, logs, out);
}

/* The job stopped (SIGTERM to the launcher) once it logged `step`: its exit status (128 + 15,
 * or 1 when a rank had failed); *last: the last step it logged. */
static int stop_job(pid_t job, const char *dir, long step, long *last)
{
    char out[600];
    snprintf(out, sizeof out, "%s.out", dir);
    return stop_job_at_step(job, dir, step, JOB_LIMIT_S, out, last);
}

/* Rank `rank`'s entry in the launcher's DIR/status.json (json_decref the root: *root). */
static json_t *status_of_rank(const char *dir, int rank, json_t **root)
{
    char path[600];
    snprintf(path, sizeof path, "%s/status.json", dir);
    json_error_t error;
    *root = json_load_file(path, 0, &error);
    cr_assert(*root, "%s: %s", path, error.text);
    json_t *rank_entry = json_array_get(json_object_get(*root, "ranks"), (size_t)rank);
    cr_assert(json_is_object(rank_entry), "%s: no rank %d", path, rank);
    return rank_entry;
}

/* What status.json says of the job's end and of rank `rank`: its processes started and how the
 * latest ended. */
static void expect_status(const char *dir, const char *phase, long departures, long joins,
                          int rank, int starts, const char *last_exit)
{
    json_t *root;
    json_t *r = status_of_rank(dir, rank, &root);
    cr_expect_str_eq(json_string_value(json_object_get(root, "phase")), phase, "status.json's phase");
    cr_expect_eq(json_integer_value(json_object_get(root, "departures")), departures,
                 "status.json's departures");
    cr_expect_eq(json_integer_value(json_object_get(root, "joins")), joins, "status.json's joins");
    cr_expect_eq(json_integer_value(json_object_get(r, "starts")), starts,
                 "rank %d's processes started", rank);
    const char *how = json_string_value(json_object_get(r, "last_exit"));
    cr_expect(how && !strcmp(how, last_exit), "rank %d's last exit: %s, expected %s", rank,
              how ? how : "(none)", last_exit);
    json_decref(root);
}

/* The mean loss over the logged steps in (from, to]. */
static double mean_loss(const double *losses, long from, long to)
{
    double sum = 0;
    int n = 0;
    for (long step = from + 1; step <= to; step++)
        if (!isnan(losses[step - 1])) sum += losses[step - 1], n++;
    cr_assert_gt(n, 0, "no losses logged in steps (%ld, %ld]", from, to);
    return sum / n;
}

/* The checksum rank `rank` logged of its parameters when it finished. */
static unsigned long long final_checksum(const char *dir, int rank)
{
    char suffix[64];
    snprintf(suffix, sizeof suffix, "/logs/rank-%d.log", rank);
    char *log = read_named(dir, suffix);
    const char *line = strstr(log, "finished step ");
    const char *sum = line ? strstr(line, "checksum ") : NULL;
    cr_assert(sum, "rank %d logged no checksum:\n%s", rank, log);
    const unsigned long long value = strtoull(sum + strlen("checksum "), NULL, 16);
    free(log);
    return value;
}

static void survivors_finish(const char *method, bool replicas_equal, const char *options)
{
    char *dir = make_temp_dir();
    char elastic[256];
    snprintf(elastic, sizeof elastic, "--min-replicas 2 %s", options);
    pid_t job = start_job(dir, method, elastic);
    const long killed_at = kill_worker_at(job, dir, KILL_AT);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect_eq(status, 0, "dp.method=%s: the job exited %d after rank %d was killed:\n%s", method,
                 status, KILLED_RANK, out);
    cr_expect(strstr(out, "rank 3 (replica 1) left the job"), "the launcher names the departure:\n%s",
              out);
    /* the killed rank, and its replica's other worker, which stops as the job tells it */
    expect_status(dir, "finished", 1, 0, KILLED_RANK, 1, "signal 9");
    expect_status(dir, "finished", 1, 0, KILLED_RANK - 1, 1, "exit 3");
    /* replica 0's last stage logged every step to the end */
    double *losses = malloc(STEPS * sizeof *losses);
    for (int i = 0; i < STEPS; i++) losses[i] = NAN;
    cr_expect_eq(read_metric_steps(dir, "metrics.jsonl", "loss", losses, STEPS), STEPS / 10,
                 "dp.method=%s: not every logged step is in metrics.jsonl", method);
    /* smoothly: the 200 steps after the kill average no more than 10% above the 200 before */
    const double before = mean_loss(losses, killed_at - 200, killed_at);
    const double after = mean_loss(losses, killed_at, killed_at + 200);
    cr_expect_lt(after, 1.1 * before, "dp.method=%s: loss %.4f before the kill, %.4f after", method,
                 before, after);
    const double last = mean_loss(losses, STEPS - 200, STEPS);
    cr_expect_lt(last, before, "dp.method=%s: the survivors kept learning (%.4f before the kill, "
                 "%.4f over the last 200 steps)", method, before, last);
    /* the survivors' log says when they regrouped */
    char *log = read_named(dir, "/logs/rank-0.log");
    cr_expect(strstr(log, "the coupling resumes over 2 replicas"), "rank 0's log:\n%s", log);
    /* allreduce: the survivors of each stage end bitwise equal (ranks 0, 4 and 1, 5) */
    for (int stage = 0; replicas_equal && stage < 2; stage++)
        cr_expect_eq(final_checksum(dir, stage), final_checksum(dir, 4 + stage),
                     "stage %d: replicas 0 and 2 differ at the end", stage);
    /* the last checkpoint is complete for the two replicas that finished */
    char *index = read_named(dir, FINAL_INDEX);
    cr_expect(strstr(index, "\"replicas\": 2"), "the final index:\n%s", index);
    run_result resumed = run_pipert("launch --quiet --stages 2 --replicas 2 --resume --out %s "
                                    "--dp.method=%s --train.steps=%d " MODEL,
                                    dir, method, STEPS + 20);
    cr_expect_eq(resumed.status, 0, "resume with the survivors: %s", resumed.err);
    free(log);
    free(index);
    free(losses);
    free(out);
    remove_dir(dir);
}

Test(elastic, sparse_survives_a_killed_worker, .timeout = 900)
{
    survivors_finish("sparse", false, "");
}

Test(elastic, allreduce_survives_a_killed_worker, .timeout = 900)
{
    survivors_finish("allreduce", true, "");
}

/* The delay compensation reads each replica's stash, which a regroup does not share
 * again but for the newest: compensated before the all-reduce, the replicas stay equal. */
Test(elastic, allreduce_with_delay_compensation_survives_a_killed_worker, .timeout = 900)
{
    RELEASE_BUILD_ONLY();
    survivors_finish("allreduce", true, "--pipeline.lookahead=nesterov-dc");
}

/* The checksum a log line of rank `rank` gives after `marker` ("…checksum HEX"); 0: none. */
static unsigned long long logged_checksum(const char *dir, int rank, const char *marker)
{
    char suffix[64];
    snprintf(suffix, sizeof suffix, "/logs/rank-%d.log", rank);
    char *log = read_named(dir, suffix);
    const char *line = strstr(log, marker);
    const char *sum = line ? strstr(line, "checksum ") : NULL;
    const unsigned long long value = sum ? strtoull(sum + strlen("checksum "), NULL, 16) : 0;
    cr_expect(sum, "rank %d logged no \"%s\":\n%s", rank, marker, log);
    free(log);
    return value;
}

/* --restarts 1: replica 1 starts again, rejoins, and is equal to the donor when it does; the job
 * takes `steps` steps.
 * `options`: more of the job's. */
static void replica_rejoins(const char *method, bool replicas_equal, int steps, const char *options)
{
    char *dir = make_temp_dir();
    char elastic[256], final_index[64];
    snprintf(elastic, sizeof elastic, "--min-replicas 2 --restarts 1 --train.steps=%d %s", steps,
             options);
    snprintf(final_index, sizeof final_index, "/ckpt-%08d.json", steps);
    pid_t job = start_job(dir, method, elastic);
    const long killed_at = kill_worker_at(job, dir, KILL_AT);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect_eq(status, 0, "dp.method=%s: the job exited %d:\n%s", method, status, out);
    cr_expect(strstr(out, "replica 1 rejoins the job"), "the coordinator logs the join:\n%s", out);
    for (int rank = 2; rank < 4; rank++) expect_status(dir, "finished", 1, 1, rank, 2, "exit 0");
    const char *second = strstr(out, "leaves the job");
    cr_expect(second && !strstr(second + 1, "leaves the job"),
              "one departure, the killed replica's:\n%s", out);
    /* each stage of the joiner starts from its donor's (replica 0's) parameters, bitwise */
    for (int stage = 0; stage < 2; stage++)
        cr_expect_eq(logged_checksum(dir, 2 + stage, "is back in the job"),
                     logged_checksum(dir, stage, "gave rank"),
                     "dp.method=%s: stage %d of the joiner does not start from the donor's state",
                     method, stage);
    /* allreduce: all three replicas end bitwise equal, the joiner included */
    for (int stage = 0; replicas_equal && stage < 2; stage++) {
        cr_expect_eq(final_checksum(dir, 2 + stage), final_checksum(dir, stage),
                     "stage %d: the joiner differs from replica 0 at the end", stage);
        cr_expect_eq(final_checksum(dir, 4 + stage), final_checksum(dir, stage),
                     "stage %d: replica 2 differs from replica 0 at the end", stage);
    }
    /* the losses go on smoothly, with three replicas in the metrics at the end */
    double *losses = malloc(STEPS * sizeof *losses);
    for (int i = 0; i < STEPS; i++) losses[i] = NAN;
    read_metric_steps(dir, "metrics.jsonl", "loss", losses, STEPS);
    const double before = mean_loss(losses, killed_at - 200, killed_at);
    const double after = mean_loss(losses, killed_at + 100, killed_at + 300);
    cr_expect_lt(after, 1.1 * before, "dp.method=%s: loss %.4f before the kill, %.4f after the join",
                 method, before, after);
    char *metrics = read_named(dir, "/metrics.jsonl");
    const char *last = strrchr(metrics, '{');
    cr_expect(last && strstr(last, "\"replicas\":3") && strstr(last, "\"joins\":1"),
              "the last metrics line: %s", last ? last : "(none)");
    char *index = read_named(dir, final_index);
    cr_expect(strstr(index, "\"replicas\": 3"), "the final index:\n%s", index);
    free(index);
    free(metrics);
    free(losses);
    free(out);
    remove_dir(dir);
}

Test(elastic, a_killed_sparse_replica_rejoins, .timeout = 900)
{
    replica_rejoins("sparse", false, STEPS, "");
}

/* the outer methods broadcast θ̃ at the regroup: the joiner takes part with what it loaded */
Test(elastic, a_killed_diloco_replica_rejoins, .timeout = 900)
{
    replica_rejoins("diloco", false, STEPS, "");
}

Test(elastic, a_killed_allreduce_replica_rejoins_equal_to_its_peers, .timeout = 900)
{
    replica_rejoins("allreduce", true, STEPS, "");
}

/* A checkpoint at every step: the ranks of a replica hear of a change at different steps
 * (an asynchronous pipeline's stages are steps apart), so one of them writes its part of a
 * checkpoint the other skips as regrouping, and gives up on gathering the outcomes. The
 * groups the checkpoint gathers in must start afresh at the switch, or the next checkpoint
 * pairs that stale message with a new one (the job then loses replica 0). */
Test(elastic, a_replica_rejoins_amid_checkpoints_at_every_step, .timeout = 900)
{
    /* 700 steps: the replica is back within ~120 steps of its kill at 400; each step writes */
    replica_rejoins("sparse", false, 700, "--train.checkpoint_every=1 --train.keep_checkpoints=2");
}

/* Whether dir.out (the launcher's and coordinator's log) says `text`, within `seconds`. */
static bool launcher_says(const char *dir, const char *text, double seconds)
{
    char path[600], *out;
    size_t size;
    snprintf(path, sizeof path, "%s.out", dir);
    for (int i = 0; i < (int)(seconds * 20); i++, usleep(50000)) {
        if (pt_read_file(path, &out, &size) != PIPERT_OK) continue;
        const bool said = strstr(out, text) != NULL;
        free(out);
        if (said) return true;
    }
    return false;
}

/* Replicas 1 and 2 die together and come back in one switch: the survivors (replica 0) are
 * stopped (SIGSTOP) until both registered again, so neither is let in before the other (and
 * each says, once it runs again, that it had not run). The two joiners must connect to each
 * other too (the lower dials the higher). */
Test(elastic, two_replicas_rejoin_in_one_switch, .timeout = 900)
{
    char *dir = make_temp_dir();
    pid_t job = start_job(dir, "allreduce", "--min-replicas 1 --restarts 2 --heartbeat-timeout 120");
    for (int i = 0; i < 6000 && logged_step(dir) < KILL_AT; i++) usleep(50000);
    cr_assert_geq(logged_step(dir), KILL_AT, "the job did not reach step %d", KILL_AT);
    const pid_t survivors[] = {worker_pid(dir, 0), worker_pid(dir, 1)};
    for (int k = 0; k < 2; k++) cr_assert_eq(kill(survivors[k], SIGSTOP), 0);
    const double stopped_at = pt_now_s();
    cr_assert_eq(kill(worker_pid(dir, 3), SIGKILL), 0, "stage 1 of replica 1");
    cr_assert_eq(kill(worker_pid(dir, 5), SIGKILL), 0, "stage 1 of replica 2");
    const bool both = launcher_says(dir, "replica 1 rejoins the job", 90) &&
                      launcher_says(dir, "replica 2 rejoins the job", 90);
    while (pt_now_s() < stopped_at + 3) usleep(50000); /* long enough to be worth saying */
    for (int k = 0; k < 2; k++) kill(survivors[k], SIGCONT);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_assert(both, "the replicas did not both register again while the survivors waited:\n%s",
              out);
    cr_expect_eq(status, 0, "the job exited %d:\n%s", status, out);
    cr_expect(strstr(out, "every survivor heard of membership change 4") &&
                  !strstr(out, "every survivor heard of membership change 3"),
              "one switch for two departures and two joins:\n%s", out);
    for (int stage = 0; stage < 2; stage++)
        for (int replica = 1; replica < 3; replica++) {
            const int rank = 2 * replica + stage;
            cr_expect_eq(logged_checksum(dir, rank, "is back in the job"),
                         logged_checksum(dir, stage, "gave rank"),
                         "stage %d of replica %d does not start from the donor's state", stage,
                         replica);
            cr_expect_eq(final_checksum(dir, rank), final_checksum(dir, stage),
                         "stage %d: replica %d differs from replica 0 at the end", stage, replica);
        }
    for (int rank = 0; rank < 2; rank++) { /* a stopped worker says so once it runs again */
        char suffix[64];
        snprintf(suffix, sizeof suffix, "/logs/rank-%d.log", rank);
        char *log = read_named(dir, suffix);
        cr_expect(strstr(log, "this process did not run for"),
                  "rank %d, stopped, did not say it had not run:\n%s", rank, log);
        free(log);
    }
    char *metrics = read_named(dir, "/metrics.jsonl");
    const char *last = strrchr(metrics, '{');
    cr_expect(last && strstr(last, "\"replicas\":3") && strstr(last, "\"joins\":2"),
              "the last metrics line: %s", last ? last : "(none)");
    free(metrics);
    free(out);
    remove_dir(dir);
}

/* Replica 1's restarted processes are killed as soon as they appear, for RELAPSE_S (a replica
 * whose site is cut off, or whose host cannot start it, leaves again at once). The launcher
 * must wait before each next start, twice as long each time (0.5, 1, 2, 4 s), not spend its
 * restarts in a loop; once left alone the replica comes back. The survivors are stopped
 * (a heartbeat timeout long enough) until it registered, so that the job still runs then. */
Test(elastic, a_replica_that_leaves_again_at_once_starts_again_later_each_time, .timeout = 900)
{
    RELEASE_BUILD_ONLY();
    enum { RELAPSE_S = 6 };
    char *dir = make_temp_dir();
    pid_t job = start_job(dir, "sparse", "--min-replicas 1 --restarts 100 --heartbeat-timeout 120");
    for (int i = 0; i < 6000 && logged_step(dir) < KILL_AT; i++) usleep(50000);
    cr_assert_geq(logged_step(dir), KILL_AT, "the job did not reach step %d", KILL_AT);
    const int survivors[] = {0, 1, 4, 5};
    pid_t stopped[4];
    for (int k = 0; k < 4; k++) {
        stopped[k] = worker_pid(dir, survivors[k]);
        cr_assert_eq(kill(stopped[k], SIGSTOP), 0);
    }
    pid_t last[2] = {worker_pid(dir, 2), worker_pid(dir, 3)};
    cr_assert_eq(kill(last[1], SIGKILL), 0, "stage 1 of replica 1");
    int killed = 0;
    for (int i = 0; i < RELAPSE_S * 50; i++, usleep(20000))
        for (int stage = 0; stage < 2; stage++) {
            const pid_t pid = worker_pid(dir, 2 + stage);
            if (pid == last[stage]) continue;
            last[stage] = pid;
            killed += kill(pid, SIGKILL) == 0;
        }
    /* left alone, it comes back while the job still runs */
    const bool back = launcher_says(dir, "replica 1 rejoins the job", 90);
    for (int k = 0; k < 4; k++) kill(stopped[k], SIGCONT);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect(back, "the replica did not come back:\n%s", out);
    cr_expect_eq(status, 0, "the job exited %d:\n%s", status, out);
    cr_expect_geq(killed, 4, "only %d restarted processes were there to kill in %d s:\n%s", killed,
                  RELAPSE_S, out);
    json_t *root;
    const long starts = json_integer_value(json_object_get(status_of_rank(dir, 3, &root), "starts"));
    json_decref(root);
    /* started with the job, again at once, then after 0.5, 1, 2 (and 4, past RELAPSE_S) s */
    cr_expect(starts >= 4 && starts <= 6, "rank 3 was started %ld times (in a loop?):\n%s", starts,
              out);
    for (const char *delay = "0.5", *next; delay; delay = next) {
        char said[64];
        snprintf(said, sizeof said, "starts again in %s s", delay);
        cr_expect(strstr(out, said), "the launcher does not say \"%s\":\n%s", said, out);
        next = !strcmp(delay, "0.5") ? "1.0" : !strcmp(delay, "1.0") ? "2.0" : NULL;
    }
    char *metrics = read_named(dir, "/metrics.jsonl");
    const char *line = strrchr(metrics, '{');
    cr_expect(line && strstr(line, "\"replicas\":3"), "the last metrics line: %s",
              line ? line : "(none)");
    free(metrics);
    free(out);
    remove_dir(dir);
}

/* Replica 0's last stage writes metrics.jsonl: killed, replica 1's takes the file over at
 * the switch. (Were replica 0 to rejoin, it would take it back at its switch.) */
Test(elastic, metrics_go_on_when_the_first_replica_leaves, .timeout = 900)
{
    RELEASE_BUILD_ONLY();
    char *dir = make_temp_dir();
    pid_t job = start_job(dir, "sparse", "--min-replicas 2");
    const long killed_at = kill_rank_at(job, dir, KILL_AT, 1);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect_eq(status, 0, "the job exited %d:\n%s", status, out);
    double *losses = malloc(STEPS * sizeof *losses);
    for (int i = 0; i < STEPS; i++) losses[i] = NAN;
    const int lines = read_metric_steps(dir, "metrics.jsonl", "loss", losses, STEPS);
    cr_expect(!isnan(losses[STEPS - 1]), "the last step is logged");
    /* only the steps between the death and the switch (at most the margin, 6, and the
     * acknowledgements' spread) may be missing */
    cr_expect_geq(lines, STEPS / 10 - 5, "%d of %d logged lines", lines, STEPS / 10);
    char *log3 = read_named(dir, "/logs/rank-3.log");
    cr_expect(strstr(log3, "writes") && strstr(log3, "metrics.jsonl from step"),
              "replica 1's last stage took metrics.jsonl over:\n%s", log3);
    const double before = mean_loss(losses, killed_at - 200, killed_at);
    const double after = mean_loss(losses, killed_at + 100, killed_at + 300);
    cr_expect_lt(after, 1.1 * before, "loss %.4f before the kill, %.4f after", before, after);
    free(log3);
    free(losses);
    free(out);
    remove_dir(dir);
}

/* Below --min-replicas, and without it, a death stops the job as before. */
static void job_stops(const char *elastic, const char *expected)
{
    char *dir = make_temp_dir();
    pid_t job = start_job(dir, "sparse", elastic);
    kill_worker_at(job, dir, 100);
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect_neq(status, 0, "the job exited 0 after rank %d was killed (%s)", KILLED_RANK, elastic);
    cr_expect(strstr(out, expected), "expected \"%s\" in:\n%s", expected, out);
    free(out);
    remove_dir(dir);
}

Test(elastic, a_job_without_min_replicas_stops, .timeout = 600)
{
    job_stops("", "killed by signal 9");
}

Test(elastic, too_few_replicas_stop_the_job, .timeout = 600)
{
    job_stops("--min-replicas 3", "killed by signal 9");
}

/* --min-replicas 2 of 3: the first death is a departure, the second would leave one. */
Test(elastic, a_second_departure_below_min_replicas_stops_the_job, .timeout = 600)
{
    char *dir = make_temp_dir();
    /* steps enough that the job still runs at the second kill, which stops it */
    pid_t job = start_job(dir, "sparse", "--min-replicas 2 --train.steps=100000");
    kill_worker_at(job, dir, 100);
    usleep(1500000); /* the departure is through: replica 1 is out */
    cr_assert_eq(kill(worker_pid(dir, 5), SIGKILL), 0, "stage 1 of replica 2");
    const int status = wait_job(job, dir);
    char *out = read_named(dir, ".out");
    cr_expect_neq(status, 0, "the job exited 0 with one replica left:\n%s", out);
    cr_expect(strstr(out, "only 1 replica would remain (--min-replicas 2)"), "%s", out);
    free(out);
    remove_dir(dir);
}

/* ---- joiners that cannot join ---------------------------------------------- */

/* One stage × 2 replicas, long enough for joiners to try while it runs (a step takes ~1 ms). */
#define SMALL_JOB MODEL " --train.steps=30000 --train.checkpoint_every=0 --dp.method=sparse"

/* The job's coordinator (host:port), as rank 0's log says it. */
static void coordinator_of(const char *dir, char *out, size_t capacity)
{
    char *log = read_named(dir, "/logs/rank-0.log");
    const char *at = strstr(log, "; coordinator ");
    cr_assert(at, "rank 0 does not name its coordinator:\n%s", log);
    cr_assert_eq(sscanf(at + strlen("; coordinator "), "%127[^ \n]", out), 1);
    cr_assert_lt(strlen(out), capacity);
    free(log);
}

/* `pipert worker --join` for rank 1, started by hand with the job's environment and its
 * settings but for `differs` (a later option overrides an earlier one). */
static run_result join_by_hand(const char *dir, const char *differs)
{
    char coordinator[128], env[1024];
    coordinator_of(dir, coordinator, sizeof coordinator);
    snprintf(env, sizeof env, "PIPERT_RANK=1 PIPERT_WORLD_SIZE=2 PIPERT_LOCAL_RANK=1 PIPERT_COORD=%s "
             "PIPERT_SECRET_FILE=%s/job.secret PIPERT_MIN_REPLICAS=1", coordinator, dir);
    return run_pipert_with(env, "worker --join --stages 1 --out %s " SMALL_JOB " %s", dir, differs);
}

/* A replica's worker is killed; joiners of its rank with other settings are refused by name,
 * each within the heartbeat timeout (5 s), and the job trains on without them (the test stops
 * it then: 30,000 steps are for the slowest machine). */
Test(elastic, joiners_with_other_settings_are_refused_by_name, .timeout = 600)
{
    static const struct {
        const char *option, *differs;
    } joiners[] = {
        {"--dp.compress=int8", "dp method/codec"},
        {"--model.n_embd=64", "model shape"},
        {"--train.batch_size=8", "batch size and steps"},
        {"--pipeline.schedule=1f1b", "pipeline schedule"},
        {"--runtime.authenticate_messages=true", "message authentication"},
    };
    char *dir = make_temp_dir();
    char command[4096];
    snprintf(command, sizeof command,
             "PIPERT_LOG=info exec %s launch --quiet --stages 1 --replicas 2 --min-replicas 1 "
             "--out %s " SMALL_JOB " >%s.out 2>&1", pipert_bin(), dir, dir);
    pid_t job = start_shell(command);
    kill_rank_at(job, dir, 200, 1);
    cr_assert(launcher_says(dir, "replica 1 leaves the job", 30), "the departure is through");
    for (size_t i = 0; i < sizeof joiners / sizeof joiners[0]; i++) {
        const run_result r = join_by_hand(dir, joiners[i].option);
        cr_expect_neq(r.status, 0, "%s: the joiner exited 0", joiners[i].option);
        cr_expect_lt(r.seconds, 5.0, "%s: refused after %.1f s", joiners[i].option, r.seconds);
        cr_expect(strstr(r.err, "refused rank 1: rank 1 (rejoining) is not of this job's build or "
                                "settings") && strstr(r.err, joiners[i].differs),
                  "%s: the joiner names the mismatch (%s):\n%s", joiners[i].option,
                  joiners[i].differs, r.err);
    }
    cr_expect_eq(waitpid(job, NULL, WNOHANG), 0, "the job still runs after the joiners");
    const long after_joiners = logged_step(dir);
    long last;
    const int status = stop_job(job, dir, after_joiners + 500, &last);
    char *out = read_named(dir, ".out");
    cr_expect_eq(status, 128 + SIGTERM, "the job exited %d:\n%s", status, out);
    cr_expect(strstr(out, "coordinator: refused rank 1 from ") &&
                  strstr(out, "(settings differ in: dp method/codec)"),
              "the launcher's log names each refusal:\n%s", out);
    cr_expect(last >= after_joiners + 500 && last < 30000, "replica 0 trained on from step %ld "
              "to %ld", after_joiners, last);
    free(out);
    remove_dir(dir);
}
