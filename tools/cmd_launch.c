/* pipert launch: a job of stages × replicas workers on this machine.
 *
 * The launcher generates the job's secret (DIR/job.secret, mode 0600), runs
 * the coordinator (comm/coordinator.h) on 127.0.0.1, in a process of
 * its own that it starts again if it dies (tools/coordinator_process.h; its
 * pid in DIR/coordinator.pid), and starts one
 * `pipert worker` process per rank — this very executable again
 * (/proc/self/exe), with the same configuration arguments — with the
 * environment of comm/bootstrap.h. Rank r is stage r mod S of replica
 * r div S (comm/layout.h). Cores are divided evenly: with n workers
 * on c cores each gets c div n cores (PIPERT_CORES, the worker binds itself);
 * with more workers than cores, worker r gets core r mod c.
 *
 * Each worker writes stdout and stderr to DIR/logs/rank-R.log; the launcher
 * writes DIR/workers.pid ("RANK PID" lines) and shows one job-wide progress
 * line. A worker that fails — exits non-zero, dies from a signal, goes silent
 * — aborts the job: the others are told, given --grace seconds to stop, then
 * sent SIGTERM and after another grace SIGKILL, and the launcher exits 1
 * naming the rank and why. SIGINT or SIGTERM to the launcher stops every
 * worker the same way (exit 128 + signal). Workers run in process groups of
 * their own (a terminal's Ctrl-C reaches only the launcher, which stops them
 * in order). A launcher killed outright (kill -9) takes the coordinator with
 * it (and its listening socket), not the workers: they notice, agree on a step, checkpoint it and exit
 * with status 4 (session/coordinator_loss.c); `pipert launch --resume`
 * continues. Between emulated sites the launcher also carries the links
 * (tools/wan), so there the workers get PR_SET_PDEATHSIG and die with it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/bootstrap.h"
#include "comm/coordinator.h"
#include "comm/layout.h"
#include "runtime/config.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/topology.h"
#include "runtime/trace.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/coordinator_process.h"
#include "tools/launch_plan.h"
#include "tools/launch_status.h"
#include "tools/progress.h"
#include "tools/worker_exit.h"
#include "tools/wan/sites.h"

/* A worker whose coordinator's connection closed registers again for this long (at least; a
 * coordinator started again takes well under a second), before it counts as lost. */
#define RECONNECT_S 30.0
#define POLL_MS 100
#define LOG_TAIL_LINES 4
#define STATUS_PERIOD_S 0.5 /* DIR/status.json rewritten this often */
/* --restarts: a replica that leaves again within RESTART_QUICK_S of a start (its site cut off,
 * a host that cannot start it) waits before the next, twice as long each time up to
 * RESTART_DELAY_MAX_S, instead of spending its restarts in a loop. */
#define RESTART_QUICK_S 10.0
#define RESTART_DELAY_FIRST_S 0.5
#define RESTART_DELAY_MAX_S 8.0

extern char **environ;

static volatile sig_atomic_t launcher_signal, launcher_signal_count;

static void on_signal(int signal_number)
{
    launcher_signal = signal_number;
    launcher_signal_count++;
}

typedef struct worker_process {
    int rank, stage, replica, site;
    int cores_first, cores_count;
    pid_t pid;
    bool running;
    int wait_status;
    bool signalled_by_launcher;
    int starts;    /* processes started for this rank: more than one after --restarts */
    int exits;     /* of them, those that ended (wait_status: the latest's) */
    char log_path[PATH_MAX + 64];
} worker_process;

/* --restarts: when a replica was last started, and how long it waits before the next start. */
typedef struct replica_restarts {
    double started_at; /* 0: with the job */
    double left_at;    /* when the launcher saw its last worker gone; 0 while it runs */
    double delay_s;
} replica_restarts;

typedef struct job {
    int stages, replicas, world;
    int sites; /* --sites: replica r is in site r mod sites (or as the plan says) */
    bool has_plan; /* --plan: stages, replicas, configuration and every rank's site */
    pt_launch_plan plan;
    pt_wan_sites wan; /* wan.* or --cluster: the sites are namespaces joined by emulated links */
    char out_dir[PATH_MAX];
    char secret_path[PATH_MAX + 16];
    char secret[2 * PT_SECRET_BYTES + 1];
    char host[PT_HOST_MAX];
    int cores;
    double grace_s;
    double heartbeat_timeout_s; /* --heartbeat-timeout */
    int min_replicas;           /* --min-replicas: fewer and the job stops (0: all) */
    int restarts_left;          /* --restarts: replicas that left may start again this often */
    replica_restarts *restarts; /* [replicas] */
    pt_coordinator_process *coordinator;
    worker_process *workers; /* [world] */
    int running;
    /* passed to every worker: --config FILE and --section.key=value */
    const char **config_args;
    int n_config_args;
    bool quiet;
    bool resume; /* --resume: every worker continues from the newest complete checkpoint */
    bool probe;  /* --probe: the workers measure the links between sites (pipert probe --sites) */
    long total_steps, log_every;
    /* shutdown: once the job aborts, stragglers get SIGTERM at term_at and
     * SIGKILL at kill_at */
    double term_at, kill_at;
    bool terminated, killed;
    int signals_handled; /* SIGINT/SIGTERM/SIGHUP to the launcher acted upon */
} job;

/* ---- setup ------------------------------------------------------------------ */

/* Cores for worker r of n on `cores` cores. */
static void assign_cores(int r, int n, int cores, int *first, int *count)
{
    if (n <= cores) {
        *count = cores / n;
        *first = r * *count;
    } else {
        *count = 1;
        *first = r % cores;
    }
}

static pipert_result plan_workers(job *j)
{
    pt_layout layout;
    PT_TRY(pt_layout_make(j->world, j->stages, &layout));
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology));
    j->cores = pt_topology_cores(topology);
    pt_topology_free(topology);
    j->workers = calloc((size_t)j->world, sizeof *j->workers);
    j->restarts = calloc((size_t)j->replicas, sizeof *j->restarts);
    if (!j->workers || !j->restarts) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    for (int r = 0; r < j->world; r++) {
        worker_process *w = &j->workers[r];
        w->rank = r;
        w->stage = pt_layout_stage(&layout, r);
        w->replica = pt_layout_replica(&layout, r);
        w->site = w->replica % j->sites;
        if (j->has_plan)
            PT_TRY(pt_launch_plan_site(&j->plan, &j->wan.cluster, w->replica, w->stage, &w->site));
        assign_cores(r, j->world, j->cores, &w->cores_first, &w->cores_count);
        snprintf(w->log_path, sizeof w->log_path, "%s/logs/rank-%d.log", j->out_dir, r);
    }
    return PIPERT_OK;
}

static pipert_result prepare_directory(job *j, const char *out_dir)
{
    char logs[PATH_MAX + 8];
    snprintf(logs, sizeof logs, "%s/logs", out_dir);
    PT_TRY(pt_make_dirs(logs));
    if (!realpath(out_dir, j->out_dir))
        return pt_fail(PIPERT_ERR_IO, "%s: %s", out_dir, strerror(errno));
    snprintf(j->secret_path, sizeof j->secret_path, "%s/job.secret", j->out_dir);
    PT_TRY(pt_secret_generate(j->secret));
    return pt_secret_write_file(j->secret_path, j->secret);
}

static pipert_result start_coordinator(job *j)
{
    pt_coordinator_options options = PT_COORDINATOR_OPTIONS_INIT;
    options.world = j->world;
    options.dead_after_s = j->heartbeat_timeout_s;
    options.stages = j->stages;
    options.min_replicas = j->min_replicas;
    int fd, port;
    PT_TRY(pt_wan_sites_coordinator_listen(&j->wan, &fd, &port));
    char pid_path[PATH_MAX + 32];
    snprintf(pid_path, sizeof pid_path, "%s/coordinator.pid", j->out_dir);
    return pt_coordinator_process_start(&j->coordinator, &options, fd, port, j->secret_path,
                                        pid_path);
}

static void format_cores(const worker_process *w, char *text, size_t cap)
{
    if (w->cores_count == 1) snprintf(text, cap, "%d", w->cores_first);
    else snprintf(text, cap, "%d-%d", w->cores_first, w->cores_first + w->cores_count - 1);
}

static void print_mapping(const job *j)
{
    printf("pipert launch: %d worker%s (%d stage%s x %d replica%s) on %s, %d cores; coordinator "
           "%s:%d; job directory %s\n",
           j->world, j->world == 1 ? "" : "s", j->stages, j->stages == 1 ? "" : "s", j->replicas,
           j->replicas == 1 ? "" : "s", j->host, j->cores, pt_wan_sites_coordinator_host(&j->wan),
           pt_coordinator_process_port(j->coordinator), j->out_dir);
    pt_wan_sites_print(&j->wan);
    if (j->world > j->cores)
        printf("  (more workers than cores: %d workers share each core)\n",
               (j->world + j->cores - 1) / j->cores);
    printf("  %-5s %-5s %-7s %-4s %-16s %-7s %s\n", "rank", "stage", "replica", "site", "host", "cores",
           "log");
    for (int r = 0; r < j->world; r++) {
        const worker_process *w = &j->workers[r];
        char cores[32];
        format_cores(w, cores, sizeof cores);
        printf("  %-5d %-5d %-7d %-4d %-16s %-7s %s\n", r, w->stage, w->replica, w->site,
               pt_wan_sites_host(&j->wan, w->site, j->host), cores, w->log_path);
    }
    fflush(stdout);
}

/* ---- starting workers ------------------------------------------------------ */

static bool has_prefix(const char *entry, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strncmp(entry, names[i], strlen(names[i]))) return true;
    return false;
}

/* What the launcher sets for each worker, so not inherited. Between emulated
 * sites that includes UCX's choice of transport and device: anything but TCP
 * over wan0 (shared memory, another interface) would bypass the links. */
static bool is_launcher_variable(const job *j, const char *entry)
{
    static const char *const bootstrap[] = {"PIPERT_RANK=", "PIPERT_WORLD_SIZE=",
                                            "PIPERT_LOCAL_RANK=", "PIPERT_COORD=",
                                            "PIPERT_COORD_PORT=", "PIPERT_SECRET=",
                                            "PIPERT_SECRET_FILE=", "PIPERT_CORES=", "PIPERT_SITE=",
                                            "PIPERT_HEARTBEAT_TIMEOUT=", "PIPERT_MIN_REPLICAS=",
                                            "PIPERT_COORD_RECONNECT="};
    static const char *const ucx[] = {"UCX_TLS=", "UCX_NET_DEVICES="};
    return has_prefix(entry, bootstrap, sizeof bootstrap / sizeof bootstrap[0]) ||
           (j->wan.testbed && has_prefix(entry, ucx, sizeof ucx / sizeof ucx[0]));
}

#define WORKER_VARIABLES 12

/* The environment of worker w: ours, without what the launcher sets, plus
 * w's. Strings in `storage` [WORKER_VARIABLES][PATH_MAX + 64]. */
static char **worker_environment(const job *j, const worker_process *w, char storage[][PATH_MAX + 64])
{
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + WORKER_VARIABLES + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_launcher_variable(j, environ[i])) env[k++] = environ[i];
    int count = 0;
    snprintf(storage[count++], sizeof storage[0], "PIPERT_RANK=%d", w->rank);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_WORLD_SIZE=%d", j->world);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_LOCAL_RANK=%d", w->rank);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_COORD=%s:%d",
             pt_wan_sites_coordinator_host(&j->wan),
             pt_coordinator_process_port(j->coordinator));
    snprintf(storage[count++], sizeof storage[0], "PIPERT_SECRET_FILE=%s", j->secret_path);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_CORES=%d,%d", w->cores_first,
             w->cores_count);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_SITE=%d", w->site);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_HEARTBEAT_TIMEOUT=%g",
             j->heartbeat_timeout_s);
    snprintf(storage[count++], sizeof storage[0], "PIPERT_COORD_RECONNECT=%g",
             fmax(RECONNECT_S, 2 * j->heartbeat_timeout_s));
    if (j->min_replicas > 0)
        snprintf(storage[count++], sizeof storage[0], "PIPERT_MIN_REPLICAS=%d", j->min_replicas);
    if (j->wan.testbed) {
        snprintf(storage[count++], sizeof storage[0], "UCX_TLS=tcp");
        snprintf(storage[count++], sizeof storage[0], "UCX_NET_DEVICES=%s", PT_WAN_DEVICE);
    }
    for (int i = 0; i < count; i++) env[k++] = storage[i];
    env[k] = NULL;
    return env;
}

/* argv of `pipert worker --stages S --out DIR [config args] [--resume] [--join]`: a rank
 * started again (--restarts) joins the running job. */
static char **worker_arguments(const job *j, const worker_process *w, char *stages_text)
{
    char **argv = calloc((size_t)j->n_config_args + 8, sizeof *argv);
    if (!argv) return NULL;
    int k = 0;
    argv[k++] = "pipert";
    argv[k++] = "worker";
    argv[k++] = "--stages";
    argv[k++] = stages_text;
    argv[k++] = (char *)"--out";
    argv[k++] = (char *)j->out_dir;
    for (int i = 0; i < j->n_config_args; i++) argv[k++] = (char *)j->config_args[i];
    if (j->resume) argv[k++] = "--resume";
    if (j->probe) argv[k++] = "--probe";
    if (w->starts > 0) argv[k++] = "--join";
    argv[k] = NULL;
    return argv;
}

/* In the child, between fork and exec: between emulated sites (a namespace to
 * enter) die with the launcher, whose relay is the links; enter the site's
 * network namespace, write to the log, start a process group of its own.
 * Returns only on failure. */
static void exec_worker(const worker_process *w, pid_t launcher, int namespace_fd, char **argv,
                        char **env)
{
    if (namespace_fd >= 0) prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127); /* the launcher died before prctl (or before exec) */
    if (namespace_fd >= 0 && pt_wan_sites_enter(namespace_fd) != 0) _exit(127);
    setpgid(0, 0);
    /* a rank started again goes on writing the same log */
    int log = open(w->log_path, O_WRONLY | O_CREAT | (w->starts > 0 ? O_APPEND : O_TRUNC), 0644);
    int null = open("/dev/null", O_RDONLY);
    if (log < 0 || null < 0 || dup2(log, STDOUT_FILENO) < 0 || dup2(log, STDERR_FILENO) < 0 ||
        dup2(null, STDIN_FILENO) < 0)
        _exit(127);
    close(log);
    close(null);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve("/proc/self/exe", argv, env);
    dprintf(STDERR_FILENO, "pipert launch: cannot start the worker (/proc/self/exe): %s\n",
            strerror(errno));
    _exit(127);
}

static pipert_result start_worker(job *j, worker_process *w)
{
    char storage[WORKER_VARIABLES][PATH_MAX + 64], stages_text[16];
    snprintf(stages_text, sizeof stages_text, "%d", j->stages);
    char **env = worker_environment(j, w, storage);
    char **argv = worker_arguments(j, w, stages_text);
    pid_t launcher = getpid();
    int namespace_fd = pt_wan_sites_namespace_fd(&j->wan, w->site);
    pid_t pid = env && argv ? fork() : -2;
    if (pid == 0) exec_worker(w, launcher, namespace_fd, argv, env);
    free(env);
    free(argv);
    if (pid == -2) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    if (pid < 0) return pt_fail(PIPERT_ERR_INTERNAL, "rank %d: fork: %s", w->rank, strerror(errno));
    w->pid = pid;
    w->running = true;
    w->starts++;
    w->signalled_by_launcher = false;
    j->running++;
    return pt_wan_sites_join_cpu_limit(&j->wan, w->site, pid);
}

static pipert_result write_pid_file(const job *j)
{
    char path[PATH_MAX + 16], *text = malloc((size_t)j->world * 24 + 1);
    if (!text) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    size_t used = 0;
    for (int r = 0; r < j->world; r++)
        used += (size_t)sprintf(text + used, "%d %d\n", r, (int)j->workers[r].pid);
    snprintf(path, sizeof path, "%s/workers.pid", j->out_dir);
    pipert_result rc = pt_write_file_atomic(path, text, used);
    free(text);
    return rc;
}

/* ---- watching ------------------------------------------------------------- */

static void signal_running(job *j, int signal_number)
{
    for (int r = 0; r < j->world; r++) {
        worker_process *w = &j->workers[r];
        if (!w->running) continue;
        w->signalled_by_launcher = true;
        kill(w->pid, signal_number);
    }
}

/* A worker's end, in words; whether the rank failed on its own (rather than
 * finishing, or stopping because the job aborted or the launcher stopped it).
 * The coordinator's word on a rank (the error it reported, its silence)
 * counts as its own failure. */
static bool describe_exit(job *j, const worker_process *w, char *text, size_t cap)
{
    const int s = w->wait_status;
    char reported[512];
    const bool has_report = pt_coordinator_process_rank_failure(j->coordinator, w->rank, reported,
                                                                sizeof reported);
    if (WIFSIGNALED(s)) {
        const char *name = sigabbrev_np(WTERMSIG(s));
        if (!w->signalled_by_launcher) {
            snprintf(text, cap, "killed by signal %d (SIG%s)", WTERMSIG(s), name ? name : "?");
            return true;
        }
        snprintf(text, cap, "%s%sstopped by the launcher with SIG%s", has_report ? reported : "",
                 has_report ? "; then " : "", name ? name : "?");
        return pt_worker_exit_failed(-1, WTERMSIG(s), true, has_report);
    }
    const int code = WEXITSTATUS(s);
    if (has_report) snprintf(text, cap, "%s", reported);
    else if (code == 0) snprintf(text, cap, "finished");
    else if (code == EXIT_JOB_ABORTED) snprintf(text, cap, "stopped: the job aborted");
    else snprintf(text, cap, "exited with status %d", code);
    return pt_worker_exit_failed(code, 0, w->signalled_by_launcher, has_report);
}

static void reap_workers(job *j)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        if (pt_coordinator_process_reaped(j->coordinator, pid, status)) continue;
        for (int r = 0; r < j->world; r++) {
            worker_process *w = &j->workers[r];
            if (w->pid != pid || !w->running) continue;
            w->running = false;
            w->wait_status = status;
            w->exits++;
            j->running--;
            char why[1024];
            describe_exit(j, w, why, sizeof why);
            pt_debug("rank %d (pid %d): %s", r, (int)pid, why);
            /* The coordinator judges the exit (coordinator_process.c): it has what the worker
             * said last (its error, its "done"), sent before it exited. */
            pt_coordinator_process_rank_exited(j->coordinator, r, status,
                                               w->signalled_by_launcher, why);
        }
    }
}

/* Whether replica q, whose workers are all gone, may start again now: at once, unless it left
 * within RESTART_QUICK_S of its last start (then after the doubled delay). */
static bool restart_due(job *j, int q, double now)
{
    replica_restarts *r = &j->restarts[q];
    if (r->left_at == 0) {
        r->left_at = now;
        const double lived = now - r->started_at;
        r->delay_s = r->started_at == 0 || lived >= RESTART_QUICK_S ? 0
                     : r->delay_s == 0                            ? RESTART_DELAY_FIRST_S
                                        : fmin(2 * r->delay_s, RESTART_DELAY_MAX_S);
        if (r->delay_s > 0)
            pt_warn("pipert launch: replica %d left again %.1f s after it was started; it starts "
                    "again in %.1f s", q, lived, r->delay_s);
    }
    if (now < r->left_at + r->delay_s) return false;
    r->started_at = now;
    r->left_at = 0;
    return true;
}

/* --restarts: a replica that left the job starts again, joining it (pipert worker --join),
 * once every worker of it has exited, while restarts remain and the job runs. */
static void restart_left_replicas(job *j, double now)
{
    pt_job_status status;
    pt_coordinator_process_status(j->coordinator, &status);
    for (int q = 0; q < j->replicas && j->restarts_left > 0 && status.phase == PT_JOB_RUNNING; q++) {
        worker_process *ranks = &j->workers[q * j->stages];
        if (!pt_coordinator_process_rank_left(j->coordinator, ranks[0].rank)) continue;
        bool running = false;
        for (int s = 0; s < j->stages; s++) running |= ranks[s].running;
        if (running || !restart_due(j, q, now)) continue;
        j->restarts_left--;
        pt_warn("pipert launch: replica %d left the job; starting it again to rejoin (%d restart%s "
                "left)", q, j->restarts_left, j->restarts_left == 1 ? "" : "s");
        for (int s = 0; s < j->stages; s++) {
            pt_coordinator_process_rank_started(j->coordinator, ranks[s].rank);
            if (start_worker(j, &ranks[s]) == PIPERT_OK) continue;
            pt_warn("pipert launch: rank %d not started again: %s", ranks[s].rank,
                    pipert_last_error());
            j->restarts_left = 0;
        }
        if (write_pid_file(j) != PIPERT_OK)
            pt_warn("pipert launch: workers.pid not updated: %s", pipert_last_error());
    }
}

/* Once the job aborted: grace for the workers to stop on their own, then
 * SIGTERM, then SIGKILL. */
static void enforce_shutdown(job *j, const pt_job_status *status, double now)
{
    if (status->phase == PT_JOB_ABORTED && j->term_at == 0) j->term_at = now + j->grace_s;
    if (j->term_at > 0 && now >= j->term_at && !j->terminated && j->running) {
        signal_running(j, SIGTERM);
        j->terminated = true;
        j->kill_at = now + j->grace_s;
    }
    if (j->kill_at > 0 && now >= j->kill_at && !j->killed && j->running) {
        pt_warn("pipert launch: %d worker%s still running %.0f s after SIGTERM; sending SIGKILL",
                j->running, j->running == 1 ? "" : "s", j->grace_s);
        signal_running(j, SIGKILL);
        j->killed = true;
    }
}

static void handle_launcher_signal(job *j, double now)
{
    if (launcher_signal_count == j->signals_handled) return;
    j->signals_handled = launcher_signal_count;
    if (j->signals_handled == 1) {
        char reason[64];
        snprintf(reason, sizeof reason, "pipert launch received SIG%s",
                 sigabbrev_np(launcher_signal));
        pt_coordinator_process_abort(j->coordinator, reason);
        signal_running(j, SIGTERM);
        j->term_at = now;
        j->terminated = true;
        j->kill_at = now + j->grace_s;
    } else if (!j->killed) { /* asked twice: no more waiting */
        signal_running(j, SIGKILL);
        j->killed = true;
    }
}

static void show_progress(job *j, pt_progress *progress, const pt_job_status *s, long *shown_step,
                          long *shown_val_step)
{
    if (s->phase == PT_JOB_ABORTED) return;
    char line[256];
    pt_job_progress_line(s, line, sizeof line);
    const bool logged_step = s->reporting == s->world && s->min_step > *shown_step &&
                             (j->log_every <= 0 || s->min_step % j->log_every == 0 ||
                              s->min_step == j->total_steps);
    if (s->val_step > *shown_val_step) {
        pt_progress_print(progress, "step %ld | val_loss %.4f", s->val_step, s->val_loss);
        *shown_val_step = s->val_step;
    }
    if (logged_step) *shown_step = s->min_step;
    pt_progress_update(progress, line, logged_step);
}

/* DIR/status.json from the coordinator's view of the job and the launcher's of its processes. */
static void write_status(job *j, const pt_job_status *status, double started)
{
    pt_rank_status *ranks = calloc((size_t)j->world, sizeof *ranks);
    pt_launch_rank *processes = calloc((size_t)j->world, sizeof *processes);
    if (ranks && processes) {
        pt_coordinator_process_rank_statuses(j->coordinator, ranks);
        for (int r = 0; r < j->world; r++) {
            const worker_process *w = &j->workers[r];
            processes[r] = (pt_launch_rank){w->stage,  w->replica, w->site,
                                            w->pid,    w->running, w->starts,
                                            w->exits, w->wait_status};
        }
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/status.json", j->out_dir);
        const pt_launch_snapshot snapshot = {pt_now_s() - started, j->restarts_left, status, ranks,
                                             processes};
        if (pt_launch_status_write(path, &snapshot) != PIPERT_OK)
            pt_warn("pipert launch: status.json not written: %s", pipert_last_error());
    }
    free(ranks);
    free(processes);
}

static void watch(job *j)
{
    pt_progress progress;
    pt_progress_init(&progress, j->quiet);
    long shown_step = 0, shown_val_step = -1;
    const double started = pt_now_s();
    double status_at = 0;
    while (j->running > 0) {
        if (pt_coordinator_process_poll(j->coordinator, POLL_MS) != PIPERT_OK)
            pt_coordinator_process_abort(j->coordinator, pipert_last_error());
        const double now = pt_now_s();
        reap_workers(j);
        restart_left_replicas(j, now);
        handle_launcher_signal(j, now);
        pt_job_status status;
        pt_coordinator_process_status(j->coordinator, &status);
        enforce_shutdown(j, &status, now);
        show_progress(j, &progress, &status, &shown_step, &shown_val_step);
        if (now - status_at >= STATUS_PERIOD_S) {
            write_status(j, &status, started);
            status_at = now;
        }
    }
    /* What the workers said last (their "done") was sent before they exited
     * but may still be on its way: in a socket, or an emulated link's latency
     * behind. Read until the job is finished or aborted (a connection that
     * closed without "done" aborts it), at most a heartbeat timeout. */
    const double deadline = pt_now_s() + j->heartbeat_timeout_s;
    pt_job_status status;
    do {
        reap_workers(j); /* the coordinator, should it die now */
        pt_coordinator_process_poll(j->coordinator, POLL_MS);
        pt_coordinator_process_status(j->coordinator, &status);
    } while (status.phase == PT_JOB_RUNNING && pt_now_s() < deadline);
    write_status(j, &status, started);
    pt_progress_finish(&progress);
}

/* ---- the outcome ------------------------------------------------------------- */

/* The last lines of a worker's log, indented, on stderr. */
static void print_log_tail(const char *path)
{
    char *text;
    size_t size;
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return;
    const char *end = text + size;
    if (end > text && end[-1] == '\n') end--;
    const char *start = end;
    for (int lines = 0; start > text; start--)
        if (start[-1] == '\n' && ++lines == LOG_TAIL_LINES) break;
    for (const char *line = start; line < end;) {
        const char *newline = memchr(line, '\n', (size_t)(end - line));
        int length = (int)(newline ? newline - line : end - line);
        fprintf(stderr, "    | %.*s\n", length, line);
        line += length + 1;
    }
    free(text);
}

static void report_rank_failure(job *j, const worker_process *w)
{
    char why[1024];
    describe_exit(j, w, why, sizeof why);
    fprintf(stderr, "pipert launch: rank %d (stage %d, replica %d) failed: %s; log: %s\n", w->rank,
            w->stage, w->replica, why, w->log_path);
    print_log_tail(w->log_path);
}

/* Pipeline workers leave DIR/trace-rank-N.json: one timeline, DIR/trace.json. */
static void merge_traces(const job *j)
{
    char pattern[PATH_MAX + 32], out[PATH_MAX + 32];
    snprintf(pattern, sizeof pattern, "%s/trace-rank-0.json", j->out_dir);
    if (access(pattern, F_OK) != 0) return;
    snprintf(out, sizeof out, "%s/trace.json", j->out_dir);
    int ranks = 0;
    if (pt_trace_merge(j->out_dir, out, &ranks) != PIPERT_OK)
        pt_warn("trace not merged: %s", pipert_last_error());
    else if (!j->quiet)
        printf("pipert launch: trace of %d ranks in %s (open in ui.perfetto.dev)\n", ranks, out);
}

/* Prints the outcome; returns the exit status. */
static int report(job *j)
{
    pt_job_status status;
    pt_coordinator_process_status(j->coordinator, &status);
    if (launcher_signal_count) {
        fprintf(stderr, "pipert launch: stopped by SIG%s; every worker has exited\n",
                sigabbrev_np(launcher_signal));
        return 128 + launcher_signal;
    }
    int failures = 0;
    /* The rank the job aborted for first, then every other rank that failed on its own. */
    if (status.abort_rank >= 0) {
        report_rank_failure(j, &j->workers[status.abort_rank]);
        failures++;
    }
    for (int r = 0; r < j->world; r++) {
        char why[1024];
        if (r == status.abort_rank || !describe_exit(j, &j->workers[r], why, sizeof why)) continue;
        if (status.phase == PT_JOB_FINISHED && pt_coordinator_process_rank_left(j->coordinator, r)) {
            fprintf(stderr, "pipert launch: rank %d (replica %d) left the job: %s\n", r,
                    r / j->stages, why);
            continue;
        }
        report_rank_failure(j, &j->workers[r]);
        failures++;
    }
    if (failures == 0 && status.phase == PT_JOB_FINISHED) {
        merge_traces(j);
        if (!j->quiet)
            printf("pipert launch: done: %d worker%s, %ld steps, loss %.4f%s; metrics in "
                   "%s/metrics.jsonl, logs in %s/logs\n",
                   j->world, j->world == 1 ? "" : "s", status.min_step, status.mean_loss,
                   status.val_step >= 0 ? ", validation loss below" : "", j->out_dir, j->out_dir);
        if (!j->quiet && status.val_step >= 0)
            printf("  val_loss %.4f at step %ld\n", status.val_loss, status.val_step);
        return 0;
    }
    if (failures == 0)
        fprintf(stderr, "pipert launch: job failed: %s\n",
                status.phase == PT_JOB_ABORTED ? status.abort_reason
                                               : "the workers exited before every rank was done");
    return 1;
}

/* ---- the command ------------------------------------------------------------- */

/* --config FILE and every --section.key=value of argv, for the workers. */
static pipert_result collect_config_args(job *j, int argc, char **argv)
{
    j->config_args = calloc((size_t)argc + 1, sizeof *j->config_args);
    if (!j->config_args) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            j->config_args[j->n_config_args++] = argv[i++];
            j->config_args[j->n_config_args++] = argv[i];
        } else if (!strncmp(argv[i], "--", 2) && strchr(argv[i], '=')) {
            j->config_args[j->n_config_args++] = argv[i];
        }
    }
    return PIPERT_OK;
}

/* With a plan, the workers get the whole configuration as one file (the
 * user's --config, the plan's, the overrides: merged here already). */
static pipert_result use_plan_config(job *j, const pipert_config *cfg)
{
    PT_TRY(pt_launch_plan_write_config(&j->plan, cfg, j->out_dir));
    j->config_args[0] = "--config";
    j->config_args[1] = j->plan.config_path;
    j->n_config_args = 2;
    return PIPERT_OK;
}

/* A slower site's CPU time (tools/wan/cpu_limit.h), for the cores its workers are pinned to. */
static pipert_result limit_slower_sites(job *j)
{
    if (!j->wan.cpu.n_sites) return PIPERT_OK;
    int *cores = calloc((size_t)j->wan.cpu.n_sites, sizeof *cores);
    bool *taken = calloc((size_t)j->wan.cpu.n_sites * (size_t)j->cores, sizeof *taken);
    if (!cores || !taken) {
        free(cores);
        free(taken);
        return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < j->world; r++) {
        const worker_process *w = &j->workers[r];
        for (int c = w->cores_first; c < w->cores_first + w->cores_count && c < j->cores; c++)
            if (!taken[w->site * j->cores + c]) {
                taken[w->site * j->cores + c] = true;
                cores[w->site]++;
            }
    }
    pipert_result rc = pt_wan_sites_limit_cpu(&j->wan, cores);
    free(cores);
    free(taken);
    return rc;
}

static pipert_result run_job(job *j, const pipert_config *cfg, const char *out_dir, int argc,
                             char **argv)
{
    PT_TRY(collect_config_args(j, argc, argv));
    PT_TRY(prepare_directory(j, out_dir));
    if (j->has_plan) PT_TRY(use_plan_config(j, cfg));
    PT_TRY(plan_workers(j));
    PT_TRY(pt_wan_sites_start(&j->wan));
    PT_TRY(limit_slower_sites(j));
    PT_TRY(start_coordinator(j));
    gethostname(j->host, sizeof j->host - 1);
    if (!j->quiet) print_mapping(j);
    for (int r = 0; r < j->world; r++) {
        pipert_result rc = start_worker(j, &j->workers[r]);
        if (rc != PIPERT_OK) {
            pt_coordinator_process_abort(j->coordinator, pipert_last_error());
            return rc;
        }
    }
    return write_pid_file(j);
}

static void free_job(job *j)
{
    pt_coordinator_process_free(j->coordinator);
    pt_wan_sites_free(&j->wan); /* after every worker has exited */
    if (j->secret_path[0]) unlink(j->secret_path);
    free(j->workers);
    free(j->restarts);
    free(j->config_args);
    if (j->has_plan) pt_launch_plan_free(&j->plan);
}

static void default_out_dir(char *dir, size_t cap)
{
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(dir, cap, "runs/launch-%Y%m%d-%H%M%S", &tm);
}

/* A usage error after the arguments were read: frees what was read. */
static int refuse(job *j, pipert_config *cfg)
{
    pt_wan_sites_free(&j->wan);
    if (j->has_plan) pt_launch_plan_free(&j->plan);
    pipert_config_free(cfg);
    return 2;
}

/* --plan: the plan says what --stages, --replicas, --sites and --cluster
 * would, so they may not be given beside it. */
static pipert_result read_plan(job *j, const char *path, int argc, char **argv, pipert_config *cfg,
                               const char **stages, const char **replicas, const char **cluster)
{
    static char stages_text[16], replicas_text[16];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--stages") || !strcmp(argv[i], "--replicas") ||
            !strcmp(argv[i], "--sites") || !strcmp(argv[i], "--cluster"))
            return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: the plan %s says it; give it in one place",
                           argv[i], path);
    PT_TRY(pt_launch_plan_read(path, argc, argv, cfg, &j->plan));
    j->has_plan = true;
    snprintf(stages_text, sizeof stages_text, "%d", j->plan.file.stages);
    snprintf(replicas_text, sizeof replicas_text, "%d", j->plan.file.replicas);
    *stages = stages_text;
    *replicas = replicas_text;
    *cluster = j->plan.file.cluster_path[0] ? j->plan.file.cluster_path : NULL;
    return PIPERT_OK;
}

int pt_cmd_launch(int argc, char **argv)
{
    const char *out_dir = NULL, *stages = "1", *replicas = "1", *sites = "1", *grace = "5",
               *heartbeat_timeout = NULL, *cluster_path = NULL, *plan_path = NULL,
               *min_replicas = NULL, *restarts = NULL;
    bool quiet = false, resume = false, probe = false;
    const pt_cli_flag flags[] = {
        {"--stages", "S", "pipeline stages per replica (blocks split by plan.layers or balanced)",
         &stages, NULL},
        {"--replicas", "R", "data-parallel replicas (default 1)", &replicas, NULL},
        {"--sites", "N", "sites the replicas are spread over, round-robin (default 1): inside a "
                         "site replicas average densely, between sites only dp.method's traffic "
                         "flows", &sites, NULL},
        {"--out", "DIR", "job directory: logs/rank-N.log, metrics.jsonl, checkpoints "
                         "(default runs/launch-DATE-TIME)", &out_dir, NULL},
        {"--grace", "SECONDS", "wait this long for workers to stop before SIGTERM, and again "
                               "before SIGKILL (default 5)", &grace, NULL},
        {"--cluster", "FILE", "emulate the links between sites that this cluster description "
                              "lists (per pair; docs/RUNNING.md; root); sets the number of sites",
         &cluster_path, NULL},
        {"--heartbeat-timeout", "SECONDS", "a worker or the coordinator silent this long aborts "
                                           "the job (default 5; 30 between emulated sites, so a "
                                           "link may drop for a while)", &heartbeat_timeout, NULL},
        {"--min-replicas", "N", "elastic replicas: when a worker dies, its replica leaves and the "
                                "others train on, re-forming their coupling, while at least N "
                                "replicas remain (default: all; any failure stops the job)",
         &min_replicas, NULL},
        {"--restarts", "N", "with --min-replicas: a replica that left starts again and rejoins the "
                            "running job, taking its state from a live replica, at most N times in "
                            "all (default 0)", &restarts, NULL},
        {"--resume", NULL, "every worker continues from the newest complete checkpoint in --out "
                           "(any stage split, stage or replica count)", NULL, &resume},
        {"--quiet", NULL, "no mapping or progress output", NULL, &quiet},
        {"--probe", NULL, "the workers measure round trips and bandwidth between the sites "
                          "instead of training (what pipert probe --sites runs)", NULL, &probe},
        {"--plan", "FILE", "run a plan file (pipert plan): its stages, replicas, split, "
                           "configuration and the site of every rank, emulating its cluster's links "
                           "(docs/RUNNING.md, \"Plan files\")", &plan_path, NULL},
    };
    const pt_cli cli = {"launch", "--stages S --replicas R [--out DIR] [--resume] [--config FILE] "
                                  "[--section.key=value ...]",
                        "Starts S x R `pipert worker` processes on this machine (rank = replica*S\n"
                        "+ stage), pinned to evenly divided cores, with a coordinator for\n"
                        "rendezvous, heartbeats and job-wide abort. One log per rank in\n"
                        "DIR/logs; exits non-zero naming the rank if any worker fails.\n"
                        "Under SLURM or MPI start `pipert worker` directly (docs/RUNNING.md).",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    job j = {.quiet = quiet, .resume = resume, .probe = probe};
    int sites_flag = 1;
    pipert_result wan_rc = pt_cli_parse_int("--sites", sites, 1, PT_MAX_WORLD, 1, &sites_flag);
    if (wan_rc == PIPERT_OK && plan_path)
        wan_rc = read_plan(&j, plan_path, argc, argv, cfg, &stages, &replicas, &cluster_path);
    if (wan_rc == PIPERT_OK)
        wan_rc = pt_wan_sites_read(&j.wan, cfg, cluster_path, sites_flag, strcmp(sites, "1") != 0);
    j.total_steps = cfg->train.steps;
    j.log_every = cfg->train.log_every;
    if (wan_rc != PIPERT_OK) {
        fprintf(stderr, "pipert launch: %s\n", pipert_last_error());
        return refuse(&j, cfg);
    }
    char grace_text[32];
    snprintf(grace_text, sizeof grace_text, "%s", grace);
    char *end;
    j.grace_s = strtod(grace_text, &end);
    if (pt_cli_parse_int("--stages", stages, 1, PT_MAX_WORLD, 1, &j.stages) != PIPERT_OK ||
        pt_cli_parse_int("--replicas", replicas, 1, PT_MAX_WORLD, 1, &j.replicas) != PIPERT_OK ||
        pt_cli_parse_int("--sites", sites, 1, PT_MAX_WORLD, 1, &j.sites) != PIPERT_OK ||
        (j.sites > j.replicas && !j.has_plan) ||
        *end || !(j.grace_s >= 0) ||
        (long)j.stages * j.replicas > PT_MAX_WORLD) {
        fprintf(stderr, "pipert launch: --stages, --replicas and --sites take positive integers (at "
                        "most %d workers, at most one site per replica), --grace a number of "
                        "seconds\n",
                PT_MAX_WORLD);
        return refuse(&j, cfg);
    }
    j.sites = j.wan.count;
    if (j.sites > j.replicas && !j.has_plan) {
        fprintf(stderr, "pipert launch: %d sites need at least %d replicas (one per site)\n", j.sites,
                j.sites);
        return refuse(&j, cfg);
    }
    j.heartbeat_timeout_s = j.wan.emulated ? PT_WAN_HEARTBEAT_TIMEOUT_S : PT_DEAD_AFTER_S;
    if (heartbeat_timeout) {
        j.heartbeat_timeout_s = strtod(heartbeat_timeout, &end);
        if (*end || !(j.heartbeat_timeout_s >= 1 && j.heartbeat_timeout_s <= 3600)) {
            fprintf(stderr, "pipert launch: --heartbeat-timeout takes seconds in [1, 3600], got "
                            "'%s'\n", heartbeat_timeout);
            return refuse(&j, cfg);
        }
    }
    if (min_replicas &&
        pt_cli_parse_int("--min-replicas", min_replicas, 1, j.replicas, 1, &j.min_replicas) !=
            PIPERT_OK) {
        fprintf(stderr, "pipert launch: %s\n", pipert_last_error());
        return refuse(&j, cfg);
    }
    if (restarts && (pt_cli_parse_int("--restarts", restarts, 0, 1000000, 0, &j.restarts_left) !=
                         PIPERT_OK ||
                     (j.restarts_left > 0 && !(j.min_replicas > 0 && j.min_replicas < j.replicas)))) {
        fprintf(stderr, "pipert launch: %s\n",
                j.restarts_left > 0 ? "--restarts needs elastic replicas: --min-replicas below "
                                      "--replicas"
                                    : pipert_last_error());
        return refuse(&j, cfg);
    }
    j.world = j.stages * j.replicas;
    char default_dir[64];
    if (!out_dir) {
        default_out_dir(default_dir, sizeof default_dir);
        out_dir = default_dir;
    }
    struct sigaction action = {.sa_handler = on_signal}; /* no SA_RESTART: poll wakes up */
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGHUP, &action, NULL);

    pipert_result rc = run_job(&j, cfg, out_dir, argc, argv);
    if (rc != PIPERT_OK) fprintf(stderr, "pipert launch: error: %s\n", pipert_last_error());
    if (j.running > 0) watch(&j);
    int status = rc != PIPERT_OK ? 1 : report(&j);
    free_job(&j);
    pipert_config_free(cfg);
    return status;
}
