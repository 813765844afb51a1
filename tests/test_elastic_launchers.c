/* Elastic replicas under launchers that are not pipert's: a real `mpirun -np 6` (Open MPI,
 * --enable-recovery so that one process's death does not end the others) and a real
 * `srun -n 6` (--kill-on-bad-exit=0; the test skips itself unless a SLURM answers here:
 * scripts/slurm-one-node.sh start) of `pipert worker`, 2 stages × 3 replicas,
 * PIPERT_MIN_REPLICAS=2, the coordinator in rank 0. A worker is killed with SIGKILL from
 * outside, mid-run: its replica leaves and the others go on, as under pipert launch;
 * replacements started by hand (`pipert worker --join --rank R --world 6`, the way an operator
 * or another scheduler would) take its ranks and rejoin from a survivor's state. When the
 * replica of rank 0 leaves, rank 0 keeps serving the coordinator until the others finish.
 * With a standalone coordinator (`pipert coordinator --listen`) the coordinator is killed and
 * started again, and rank 0 is replaced like any other. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
    bool standalone; /* the coordinator is pipert coordinator --listen, not rank 0 */
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
    snprintf(env, cap, "PIPERT_COORD=%s PIPERT_SECRET=%s PIPERT_MIN_REPLICAS=2 PIPERT_LOG=info%s",
             j->coord, SECRET, j->standalone ? " PIPERT_COORD_STANDALONE=1" : "");
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
                 "-x PIPERT_MIN_REPLICAS -x PIPERT_LOG %s -np %d %s >%s.out 2>&1",
                 env, require_open_mpi(), j->standalone ? "-x PIPERT_COORD_STANDALONE" : "",
                 geteuid() == 0 ? "--oversubscribe --allow-run-as-root" : "--oversubscribe", WORLD,
                 worker, j->dir);
    else
        snprintf(command, cap,
                 "%s exec '%s' --overcommit --kill-on-bad-exit=0 --export=ALL -n %d %s "
                 ">%s.out 2>&1",
                 env, require_slurm(), WORLD, worker, j->dir);
}

static launched_job start_job(launcher by, bool standalone)
{
    launched_job j = {.by = by, .dir = make_temp_dir(), .standalone = standalone};
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
    launched_job j = start_job(by, false);
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
    char story[6000];
    cr_expect(reached_the_last_step(last) && strstr(last, "\"replicas\":3") &&
                  strstr(last, "\"joins\":1"),
              "the last metrics line: %s\nthe job's membership story:\n%s", last,
              membership_story(out, story, sizeof story));
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
    launched_job j = start_job(OPEN_MPI, false);
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
    char story[6000];
    cr_expect(reached_the_last_step(last) && strstr(last, "\"replicas\":2"),
              "replicas 1 and 2 finish the run: %s\nthe job's membership story:\n%s", last,
              membership_story(out, story, sizeof story));
    free(metrics);
    free(out);
    remove_dir(j.dir);
}

/* The checksum on the line of `text` that says `marker` ("... checksum X"); 0: none. */
static unsigned long long checksum_on_line_of(const char *text, const char *marker)
{
    const char *at = strstr(text, marker), *end = at ? strchr(at, '\n') : NULL;
    const char *sum = at ? strstr(at, "checksum ") : NULL;
    return sum && (!end || sum < end) ? strtoull(sum + strlen("checksum "), NULL, 16) : 0;
}

/* How often `text` says `what`. */
static int times_said(const char *text, const char *what)
{
    int n = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what)) n++;
    return n;
}

/* Waits until the file `path` says `what` `times` times (within 120 s). */
static void wait_until_said(const char *path, const char *what, int times)
{
    for (int i = 0; i < 2400; i++, usleep(50000)) {
        char *text;
        size_t size;
        if (pt_read_file(path, &text, &size) != PIPERT_OK) continue;
        const int n = times_said(text, what);
        free(text);
        if (n >= times) return;
    }
    cr_assert_fail("%s did not say \"%s\" %d times within 120 s", path, what, times);
}

/* The pid a file holds (pipert coordinator --pid-file). */
static pid_t pid_in(const char *path)
{
    char *text;
    size_t size;
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    const pid_t pid = (pid_t)strtol(text, NULL, 10);
    free(text);
    cr_assert_gt(pid, 0, "%s holds no pid", path);
    return pid;
}

/* A standalone coordinator (pipert coordinator --listen; the workers have
 * PIPERT_COORD_STANDALONE=1), started beside the job as a user would. Killed twice with
 * SIGKILL, it is started again on its socket and takes the job over from the workers, which
 * train on; then rank 1 is killed, which takes replica 0 out, rank 0 with it, and replacements
 * for ranks 0 and 1 started by hand rejoin: with the coordinator apart, no rank is special. */
static void standalone_coordinator(launcher by, int exit_status)
{
    char *dir = make_temp_dir();
    char secret[700], pid_file[700], coord_out[700], command[4096], job_command[4096];
    snprintf(secret, sizeof secret, "%s.secret", dir);
    snprintf(pid_file, sizeof pid_file, "%s.coordinator.pid", dir);
    snprintf(coord_out, sizeof coord_out, "%s.coord", dir);
    FILE *f = fopen(secret, "w");
    cr_assert(f && fputs(SECRET "\n", f) >= 0 && fclose(f) == 0 && chmod(secret, 0600) == 0);
    launched_job j = {.by = by, .dir = dir, .standalone = true};
    snprintf(j.coord, sizeof j.coord, "127.0.0.1:%d", free_port());
    launch_command(&j, job_command, sizeof job_command); /* skips the test if it cannot run */
    snprintf(command, sizeof command,
             "PIPERT_LOG=info exec %s coordinator --listen %s --world %d --stages 2 "
             "--min-replicas 2 --secret-file %s --pid-file %s >%s 2>&1",
             pipert_bin(), j.coord, WORLD, secret, pid_file, coord_out);
    const pid_t coordinator = start_shell(command);
    j.launcher = start_shell(job_command);
    for (int k = 1; k <= 2; k++) {
        for (int i = 0; i < 6000 && logged_step(dir) < k * KILL_AT; i++) usleep(50000);
        cr_assert_geq(logged_step(dir), k * KILL_AT, "the job did not reach step %d", k * KILL_AT);
        cr_assert_eq(kill(pid_in(pid_file), SIGKILL), 0, "the coordinator");
        wait_until_said(coord_out, "took the running job over", k);
    }
    kill_rank_at(&j, 3 * KILL_AT, 1); /* stage 1 of replica 0 */
    const pid_t replacements[] = {start_replacement(&j, 0), start_replacement(&j, 1)};
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s.out", dir);
    const int status = wait_job_within(j.launcher, JOB_LIMIT_S, "/dev/null", "/dev/null", out_path);
    const int coordinator_status = wait_job_within(coordinator, 60, "/dev/null", "/dev/null",
                                                   coord_out);
    char *out = read_named(dir, ".out"), *coord = read_named(dir, ".coord");
    cr_expect_eq(status, exit_status, "the launcher exited %d:\n%s", status, out);
    cr_expect_eq(coordinator_status, 0, "pipert coordinator exited %d:\n%s", coordinator_status,
                 coord);
    cr_expect_eq(times_said(coord, "was killed by SIGKILL; starting it again"), 2, "%s", coord);
    cr_expect(strstr(coord, "replica 0 leaves the job: rank ") &&
                  strstr(coord, "replica 0 rejoins the job"),
              "the departure and the join:\n%s", coord);
    cr_expect(!strstr(out, "serves the job's coordinator"), "rank 0 hosts nothing:\n%s", out);
    for (int i = 0; i < 2; i++) {
        char suffix[32], gave[64];
        snprintf(suffix, sizeof suffix, ".join-%d", i);
        snprintf(gave, sizeof gave, "gave rank %d (coming back)", i);
        const int joined = wait_job_within(replacements[i], 60, "/dev/null", "/dev/null", out_path);
        char *log = read_named(dir, suffix);
        cr_expect_eq(joined, 0, "the replacement for rank %d exited %d:\n%s", i, joined, log);
        const unsigned long long donor = checksum_on_line_of(out, gave);
        cr_expect(donor != 0 && checksum_on_line_of(log, "is back in the job") == donor,
                  "stage %d of the replacement does not start from the donor's state:\n%s\n%s",
                  i, log, out);
        free(log);
    }
    char *metrics = read_named(dir, "/metrics.jsonl");
    const char *last = last_metrics_line(metrics);
    char story[6000];
    cr_expect(reached_the_last_step(last) && strstr(last, "\"replicas\":3") &&
                  strstr(last, "\"joins\":1"),
              "the last metrics line: %s\nthe coordinator's story:\n%s\nthe workers':\n%s", last,
              membership_story(coord, story, sizeof story / 2),
              membership_story(out, story + sizeof story / 2, sizeof story / 2));
    free(metrics);
    free(coord);
    free(out);
    unlink(secret);
    unlink(pid_file);
    remove_dir(dir);
}

Test(elastic_launchers, mpirun_a_standalone_coordinator_killed_twice_and_rank_0_replaced,
     .timeout = 900)
{
    standalone_coordinator(OPEN_MPI, 0);
}

Test(elastic_launchers, srun_a_standalone_coordinator_killed_twice_and_rank_0_replaced,
     .timeout = 900)
{
    standalone_coordinator(SLURM, 128 + SIGKILL);
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

/* pipert coordinator --listen names what it lacks or cannot use, and exits 1, before it listens:
 * no --secret-file, a secret file others may read, an address that is not HOST:PORT, a heartbeat
 * timeout that is no number of seconds. */
Test(elastic_launchers, a_standalone_coordinator_names_bad_options)
{
    run_result r = run_pipert("coordinator --listen 127.0.0.1:0 --world 4 --stages 2");
    cr_expect_eq(r.status, 1, "%s", r.err);
    cr_expect(strstr(r.err, "--secret-file"), "%s", r.err);
    char *dir = make_temp_dir();
    char path[600];
    snprintf(path, sizeof path, "%s/secret", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f && fputs(SECRET "\n", f) >= 0 && fclose(f) == 0 && chmod(path, 0644) == 0);
    r = run_pipert("coordinator --listen 127.0.0.1:0 --world 4 --secret-file %s", path);
    cr_expect_eq(r.status, 1, "%s", r.err);
    cr_expect(strstr(r.err, path) && strstr(r.err, "chmod 600"), "%s", r.err);
    cr_assert_eq(chmod(path, 0600), 0);
    r = run_pipert("coordinator --listen nowhere --world 4 --secret-file %s", path);
    cr_expect_eq(r.status, 1, "%s", r.err);
    cr_expect(strstr(r.err, "--listen"), "%s", r.err);
    r = run_pipert("coordinator --listen 127.0.0.1:0 --world 4 --heartbeat-timeout soon "
                   "--secret-file %s", path);
    cr_expect_eq(r.status, 1, "%s", r.err);
    cr_expect(strstr(r.err, "--heartbeat-timeout 'soon'"), "%s", r.err);
    remove_dir(dir);
}
