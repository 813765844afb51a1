/* Elastic replicas under launchers that are not pipert's: a real `mpirun -np 6` (Open MPI,
 * --enable-recovery so that one process's death does not end the others) and a real
 * `srun -n 6` (--kill-on-bad-exit=0; the test skips itself unless a SLURM answers here:
 * scripts/slurm-one-node.sh start) of `pipert worker`, 2 stages × 3 replicas,
 * PIPERT_MIN_REPLICAS=2, the coordinator in rank 0. A worker is killed with SIGKILL from
 * outside, mid-run: its replica leaves and the others go on, as under pipert launch;
 * replacements started by hand (`pipert worker --join --rank R --world 6`, the way an operator
 * or another scheduler would) take its ranks and rejoin from a survivor's state. When the
 * replica of rank 0 leaves, rank 0 keeps serving the coordinator until the others finish. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "command.h"

#define MODEL                                                                                      \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 "     \
    "--runtime.threads=1 --train.log_every=10 --train.checkpoint_every=500 --dp.method=sparse"
/* The replacements must reach the coordinator before the job ends: a step of this model takes
 * 1-2 ms here, and a replacement starting on a loaded 2-core machine has been seen to need more
 * than the 1,100 steps that were once left after the kill (CI, session 20). 5,600 steps leave it
 * a window some 20 times the 0.35 s a join takes on a quiet machine. */
enum { STEPS = 6000, KILL_AT = 400, WORLD = 6 };
#define SECRET "elastic-under-launchers-0123456789"
#define JOB_LIMIT_S 400.0

typedef enum launcher { OPEN_MPI, SLURM } launcher;

typedef struct launched_job {
    launcher by;
    char *dir;
    char coord[64]; /* 127.0.0.1:port */
    pid_t launcher; /* mpirun or srun */
} launched_job;

/* Skips the test unless Open MPI's mpirun was found when the build was configured. */
static const char *require_open_mpi(void)
{
    const char *mpirun = getenv("MPIRUN");
    if (!mpirun || access(mpirun, X_OK) != 0)
        cr_skip_test("mpirun was not found when the build was configured");
    char command[600], version[256] = "";
    snprintf(command, sizeof command, "'%s' --version 2>&1", mpirun);
    FILE *p = popen(command, "r");
    cr_assert_not_null(p);
    version[fread(version, 1, sizeof version - 1, p)] = '\0';
    pclose(p);
    if (!strstr(version, "Open MPI")) cr_skip_test("needs Open MPI's mpirun (--enable-recovery)");
    return mpirun;
}

/* Skips the test unless srun was found when the build was configured and the one-node SLURM
 * of scripts/slurm-one-node.sh takes jobs (a real cluster may place tasks on other hosts than
 * this one, where the coordinator's address, 127.0.0.1, means something else). */
static const char *require_slurm(void)
{
    const char *srun = getenv("SRUN");
    if (!srun || access(srun, X_OK) != 0)
        cr_skip_test("srun was not found when the build was configured");
    if (system("scontrol show config 2>/dev/null | grep -qE '^ClusterName += pipert$' && "
               "sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'") != 0)
        cr_skip_test("no one-node SLURM of scripts/slurm-one-node.sh takes jobs here");
    return srun;
}

/* A port nobody listens on now (the kernel's pick for a socket bound to port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &length) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The environment every worker of the job gets, as shell assignments. */
static void job_env(const launched_job *j, char *env, size_t cap)
{
    snprintf(env, cap, "PIPERT_COORD=%s PIPERT_SECRET=%s PIPERT_MIN_REPLICAS=2 PIPERT_LOG=info",
             j->coord, SECRET);
}

/* The job's command under its launcher, which writes DIR.out. */
static void launch_command(const launched_job *j, char *command, size_t cap)
{
    char env[512], worker[1024];
    job_env(j, env, sizeof env);
    snprintf(worker, sizeof worker, "%s worker --stages 2 --out %s --train.steps=%d " MODEL,
             pipert_bin(), j->dir, STEPS);
    if (j->by == OPEN_MPI)
        snprintf(command, cap,
                 "%s exec '%s' %s --enable-recovery -x PIPERT_COORD -x PIPERT_SECRET "
                 "-x PIPERT_MIN_REPLICAS -x PIPERT_LOG -np %d %s >%s.out 2>&1",
                 env, require_open_mpi(),
                 geteuid() == 0 ? "--oversubscribe --allow-run-as-root" : "--oversubscribe", WORLD,
                 worker, j->dir);
    else
        snprintf(command, cap,
                 "%s exec '%s' --overcommit --kill-on-bad-exit=0 --export=ALL -n %d %s "
                 ">%s.out 2>&1",
                 env, require_slurm(), WORLD, worker, j->dir);
}

static launched_job start_job(launcher by)
{
    launched_job j = {.by = by, .dir = make_temp_dir()};
    snprintf(j.coord, sizeof j.coord, "127.0.0.1:%d", free_port());
    char command[4096];
    launch_command(&j, command, sizeof command);
    j.launcher = start_shell(command);
    return j;
}

/* Whether process `pid`'s environment holds every one of `entries` ("NAME=value"). */
static bool environment_has(pid_t pid, const char *const *entries, int n)
{
    char path[64], text[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r"); /* /proc says its size is 0: read to the end */
    if (!f) return false;
    const size_t size = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[size] = '\0';
    int found = 0;
    for (size_t at = 0; at < size; at += strlen(text + at) + 1)
        for (int i = 0; i < n; i++) found += strcmp(text + at, entries[i]) == 0;
    return found == n;
}

/* The pid of this job's `pipert` process that mpirun started as `rank`: the one whose
 * environment has this job's coordinator and that rank. */
static pid_t rank_pid(const launched_job *j, int rank)
{
    char coord[96], rank_entry[64];
    snprintf(coord, sizeof coord, "PIPERT_COORD=%s", j->coord);
    snprintf(rank_entry, sizeof rank_entry, "%s=%d",
             j->by == OPEN_MPI ? "OMPI_COMM_WORLD_RANK" : "SLURM_PROCID", rank);
    const char *const entries[] = {coord, rank_entry};
    DIR *proc = opendir("/proc");
    cr_assert_not_null(proc);
    pid_t found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(proc));) {
        const pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
        char path[64], comm[32] = "";
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        FILE *f = pid > 0 ? fopen(path, "r") : NULL;
        if (!f) continue;
        const bool named = fgets(comm, sizeof comm, f) && strncmp(comm, "pipert", 6) == 0;
        fclose(f);
        if (named && environment_has(pid, entries, 2)) found = pid;
    }
    closedir(proc);
    cr_assert_gt(found, 0, "no process of rank %d", rank);
    return found;
}

/* Waits for step `step` in the metrics, then kills `rank` with SIGKILL. */
static void kill_rank_at(const launched_job *j, long step, int rank)
{
    for (int i = 0; i < 6000 && logged_step(j->dir) < step; i++) {
        cr_assert_eq(waitpid(j->launcher, NULL, WNOHANG), 0, "the job ended before step %ld", step);
        usleep(50000);
    }
    cr_assert_geq(logged_step(j->dir), step, "the job did not reach step %ld in time", step);
    cr_assert_eq(kill(rank_pid(j, rank), SIGKILL), 0);
}

/* `pipert worker --join --rank R --world 6`, started by hand; its output in DIR.join-R. */
static pid_t start_replacement(const launched_job *j, int rank)
{
    char env[512], command[4096];
    job_env(j, env, sizeof env);
    snprintf(command, sizeof command,
             "%s exec %s worker --join --rank %d --world %d --stages 2 --out %s "
             "--train.steps=%d " MODEL " >%s.join-%d 2>&1",
             env, pipert_bin(), rank, WORLD, j->dir, STEPS, j->dir, rank);
    return start_shell(command);
}

/* The parameters' checksum a log line of `rank` that says `marker` gives ("[rank N] ...marker...
 * checksum X"). */
static unsigned long long logged_checksum(const char *log, int rank, const char *marker)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d]", rank);
    for (const char *line = log; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        const size_t length = end ? (size_t)(end - line) : strlen(line);
        char text[1024];
        snprintf(text, sizeof text, "%.*s", (int)(length < sizeof text ? length : sizeof text - 1),
                 line);
        const char *sum = strstr(text, "checksum ");
        if (strstr(text, prefix) && strstr(text, marker) && sum)
            return strtoull(sum + strlen("checksum "), NULL, 16);
    }
    cr_expect_fail("rank %d logged no \"%s\"", rank, marker);
    return 0;
}

/* Whether a metrics line is the job's last step's. */
static bool reached_the_last_step(const char *line)
{
    char want[32];
    snprintf(want, sizeof want, "\"step\":%d,", STEPS);
    return strstr(line, want) != NULL;
}

static const char *last_metrics_line(char *metrics)
{
    const char *last = strrchr(metrics, '{');
    return last ? last : "(none)";
}

/* A worker of replica 1 killed: the replica leaves, replacements for its two ranks started by
 * hand rejoin, and the job ends with three replicas. `exit_status`: the launcher's, expected
 * (srun's is the killed task's signal). */
static void replacements_rejoin(launcher by, int exit_status)
{
    launched_job j = start_job(by);
    kill_rank_at(&j, KILL_AT, 3); /* stage 1 of replica 1 */
    /* rank 2, told its replica left, exits; the replacements take both ranks */
    const pid_t replacements[] = {start_replacement(&j, 2), start_replacement(&j, 3)};
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s.out", j.dir);
    const int status = wait_job_within(j.launcher, JOB_LIMIT_S, "/dev/null", "/dev/null", out_path);
    char *out = read_named(j.dir, ".out");
    cr_expect_eq(status, exit_status, "the launcher exited %d:\n%s", status, out);
    cr_expect(strstr(out, "replica 1 leaves the job: rank "), "the departure:\n%s", out);
    cr_expect(strstr(out, "replica 1 rejoins the job"), "the coordinator logs the join:\n%s", out);
    for (int i = 0; i < 2; i++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, ".join-%d", 2 + i);
        const int joined = wait_job_within(replacements[i], 60, "/dev/null", "/dev/null", out_path);
        char *log = read_named(j.dir, suffix);
        cr_expect_eq(joined, 0, "the replacement for rank %d exited %d:\n%s", 2 + i, joined, log);
        /* it started from its donor's (replica 0's) parameters of its stage, bitwise */
        cr_expect_eq(logged_checksum(log, 2 + i, "is back in the job"),
                     logged_checksum(out, i, "gave rank"),
                     "stage %d of the replacement does not start from the donor's state", i);
        free(log);
    }
    char *metrics = read_named(j.dir, "/metrics.jsonl");
    const char *last = last_metrics_line(metrics);
    cr_expect(reached_the_last_step(last) && strstr(last, "\"replicas\":3") &&
                  strstr(last, "\"joins\":1"),
              "the last metrics line: %s", last);
    free(metrics);
    free(out);
    remove_dir(j.dir);
}

Test(elastic_launchers, mpirun_a_killed_rank_leaves_and_replacements_started_by_hand_rejoin,
     .timeout = 900)
{
    replacements_rejoin(OPEN_MPI, 0);
}

Test(elastic_launchers, srun_a_killed_rank_leaves_and_replacements_started_by_hand_rejoin,
     .timeout = 900)
{
    replacements_rejoin(SLURM, 128 + SIGKILL);
}

Test(elastic_launchers, mpirun_rank_0_serves_the_others_when_its_replica_leaves, .timeout = 900)
{
    launched_job j = start_job(OPEN_MPI);
    kill_rank_at(&j, KILL_AT, 1); /* stage 1 of replica 0: rank 0 hosts the coordinator */
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s.out", j.dir);
    wait_job_within(j.launcher, JOB_LIMIT_S, "/dev/null", "/dev/null", out_path);
    char *out = read_named(j.dir, ".out");
    cr_expect(strstr(out, "replica 0 leaves the job: rank "), "the departure:\n%s", out);
    cr_expect(strstr(out, "serves the job's coordinator until the other replicas finish"),
              "rank 0 goes on serving:\n%s", out);
    cr_expect(!strstr(out, "job aborted"), "the others finish:\n%s", out);
    char *metrics = read_named(j.dir, "/metrics.jsonl");
    const char *last = last_metrics_line(metrics);
    cr_expect(reached_the_last_step(last) && strstr(last, "\"replicas\":2"),
              "replicas 1 and 2 finish the run: %s", last);
    free(metrics);
    free(out);
    remove_dir(j.dir);
}

/* --rank and --world belong to a replacement: together, with --join; rank 0 (the coordinator's
 * host) cannot be replaced; PIPERT_MIN_REPLICAS must be a number of the job's replicas. Nothing
 * of the job is needed to refuse them. */
Test(elastic_launchers, replacement_flags_are_checked)
{
    run_result r = run_pipert("worker --out /nonexistent --rank 2 --world 6");
    cr_expect_eq(r.status, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--rank and --world go together, with --join"), "%s", r.err);
    r = run_pipert("worker --out /nonexistent --join --rank 2");
    cr_expect_eq(r.status, 2, "%s", r.err);
    r = run_pipert_with("PIPERT_COORD=127.0.0.1:1 PIPERT_SECRET=" SECRET " PIPERT_MIN_REPLICAS=1",
                        "worker --out /nonexistent --join --rank 0 --world 6 --stages 2");
    cr_expect_neq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "--rank") || strstr(r.err, "rank 0 hosts the coordinator"), "%s", r.err);
    /* a job's PIPERT_MIN_REPLICAS that is no number of its replicas is named, before connecting */
    const char *const bad[] = {"x", "0", "4"};
    for (int i = 0; i < 3; i++) {
        char env[256];
        snprintf(env, sizeof env,
                 "PIPERT_COORD=127.0.0.1:1 PIPERT_SECRET=" SECRET " PIPERT_MIN_REPLICAS=%s", bad[i]);
        r = run_pipert_with(env, "worker --out /nonexistent --join --rank 2 --world 6 --stages 2");
        cr_expect_eq(r.status, 1, "PIPERT_MIN_REPLICAS=%s: %s", bad[i], r.err);
        cr_expect(strstr(r.err, "PIPERT_MIN_REPLICAS=") && strstr(r.err, "1..3"),
                  "PIPERT_MIN_REPLICAS=%s: %s", bad[i], r.err);
    }
}
