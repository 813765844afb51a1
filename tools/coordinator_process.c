/* pipert launch's coordinator in a process of its own (coordinator_process.h). */
#include "tools/coordinator_process.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/coordinator_protocol.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "tools/worker_exit.h"


struct pt_coordinator_process {
    pt_coordinator_options options;
    int listen_fd, port;
    char secret_path[PATH_MAX], pid_path[PATH_MAX];
    pid_t pid;      /* 0: not running */
    int control_fd; /* -1: not running */
    int starts;
    pt_coord_buffer in;
    char **exits; /* [world]: each rank's last "exited" line while it does not run (or NULL) */
    pt_job_status status;
    pt_rank_status *ranks; /* [world] */
    bool *left;            /* [world] */
    char (*failure)[512];  /* [world]: "" if none */
};

/* ---- the coordinator's side -------------------------------------------------- */

static json_t *number_or_null(double value)
{
    return isfinite(value) ? json_real(value) : json_null();
}

json_t *pt_coordinator_process_snapshot(pt_coordinator *c)
{
    pt_job_status s;
    pt_coordinator_status(c, &s);
    pt_rank_status *ranks = calloc((size_t)s.world, sizeof *ranks);
    if (!ranks) return NULL;
    pt_coordinator_rank_statuses(c, ranks);
    json_t *list = json_array();
    for (int r = 0; r < s.world; r++) {
        char failure[512] = "";
        pt_coordinator_rank_failure(c, r, failure, sizeof failure);
        json_array_append_new(list, json_pack("{s:i, s:I, s:b, s:s}", "state", ranks[r].state,
                                              "step", (json_int_t)ranks[r].step, "left",
                                              pt_coordinator_rank_left(c, r), "failure", failure));
    }
    free(ranks);
    json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, "
                          "s:I, s:o, s:i, s:i, s:I, s:I, s:i, s:s, s:o}",
                          "type", "status", "phase", s.phase, "world", s.world, "registered",
                          s.registered, "done", s.done, "reporting", s.reporting, "min_step",
                          (json_int_t)s.min_step, "total_steps", (json_int_t)s.total_steps,
                          "mean_loss", number_or_null(s.mean_loss), "tokens_per_s",
                          number_or_null(s.tokens_per_s), "compute", number_or_null(s.compute),
                          "wait_pipeline", number_or_null(s.wait_pipeline), "wait_coupling",
                          number_or_null(s.wait_coupling), "bytes_wan",
                          number_or_null(s.bytes_wan), "val_step", (json_int_t)s.val_step,
                          "val_loss", number_or_null(s.val_loss), "replicas", s.replicas,
                          "replicas_live", s.replicas_live, "departures", (json_int_t)s.departures,
                          "joins", (json_int_t)s.joins, "abort_rank", s.abort_rank, "abort_reason",
                          s.abort_reason, "ranks", list);
    return m;
}

/* exited {rank, code, signal, by_launcher, why}: the launcher's judgement of a worker's end
 * (pipert worker's statuses: 0 done, 3 the job aborted), made here, where the rank's own
 * report is: a rank that failed on its own takes its replica out (or aborts the job). */
static void rank_exited(pt_coordinator *c, json_t *m)
{
    long rank, code = -1, signal = 0;
    const char *why = pt_coord_get_string(m, "why");
    if (!pt_coord_get_long(m, "rank", &rank) || !why) return;
    pt_coord_get_long(m, "code", &code);
    pt_coord_get_long(m, "signal", &signal);
    const bool by_launcher = json_is_true(json_object_get(m, "by_launcher"));
    pt_coordinator_drain(c, (int)rank);
    if (pt_coordinator_recovering(c)) { /* kept until the job is rebuilt */
        if (code == 0) pt_coordinator_rank_done(c, (int)rank);
        else pt_coordinator_rank_failed(c, (int)rank, "%s", why);
        return;
    }
    if (pt_coordinator_rank_left(c, (int)rank)) return; /* a worker whose replica left ends as it may */
    const bool reported = pt_coordinator_rank_failure(c, (int)rank, NULL, 0);
    if (pt_worker_exit_failed((int)code, (int)signal, by_launcher, reported)) pt_coordinator_rank_failed(c, (int)rank, "%s", why);
    else if (code == EXIT_JOB_ABORTED) pt_coordinator_abort(c, -1, "%s", why);
    else if (code == 0) pt_coordinator_rank_done(c, (int)rank);
}

void pt_coordinator_process_handle(pt_coordinator *c, const char *line, size_t length)
{
    json_t *m = json_loadb(line, length, 0, NULL);
    const char *type = pt_coord_get_string(m, "type");
    if (type && !strcmp(type, "exited")) rank_exited(c, m);
    else if (type && !strcmp(type, "abort")) {
        const char *reason = pt_coord_get_string(m, "reason");
        pt_coordinator_abort(c, -1, "%s", reason ? reason : "the launcher stopped the job");
    } else pt_warn("coordinator: the launcher sent a line that is not a message (ignored)");
    json_decref(m);
}

/* ---- the launcher's side ------------------------------------------------------- */

static void write_line(pt_coordinator_process *p, const char *line)
{
    if (p->control_fd < 0) return;
    const size_t length = strlen(line);
    for (size_t sent = 0; sent < length;) {
        ssize_t n = send(p->control_fd, line + sent, length - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return; /* it died: the exits go again to the next one */
        sent += (size_t)n;
    }
}

/* In the child, between fork and exec: the sockets at PT_COORDINATOR_LISTEN_FD and PT_COORDINATOR_CONTROL_FD, dying with the
 * launcher; it starts once go[0] reads end of file (the launcher has written the pid file).
 * Returns only on failure. */
static void exec_coordinator(const pt_coordinator_process *p, int control, pid_t launcher,
                             const int go[2])
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127);
    close(go[1]);
    char byte;
    while (read(go[0], &byte, 1) < 0 && errno == EINTR) continue;
    /* out of the way first: either may be at 3 or 4 already (and close-on-exec) */
    const int listen_copy = fcntl(p->listen_fd, F_DUPFD, 10), control_copy = fcntl(control, F_DUPFD, 10);
    if (listen_copy < 0 || control_copy < 0 || dup2(listen_copy, PT_COORDINATOR_LISTEN_FD) < 0 ||
        dup2(control_copy, PT_COORDINATOR_CONTROL_FD) < 0)
        _exit(127);
    close(listen_copy);
    close(control_copy);
    char world[16], stages[16], min_replicas[16], heartbeat[32];
    snprintf(world, sizeof world, "%d", p->options.world);
    snprintf(stages, sizeof stages, "%d", p->options.stages);
    snprintf(min_replicas, sizeof min_replicas, "%d", p->options.min_replicas);
    snprintf(heartbeat, sizeof heartbeat, "%g", p->options.dead_after_s);
    char *argv[] = {"pipert", "coordinator", "--world", world, "--stages", stages,
                    "--min-replicas", min_replicas, "--heartbeat-timeout", heartbeat,
                    "--secret-file", (char *)p->secret_path, p->starts > 0 ? "--recover" : NULL,
                    NULL};
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv("/proc/self/exe", argv);
    _exit(127);
}

/* A new coordinator process. DIR/coordinator.pid names it before it starts: one that took the
 * job over is the one the file names (a test that kills it again read the last one's pid while
 * the launcher's write, fsyncs included, still ran). */
static pipert_result spawn(pt_coordinator_process *p)
{
    int pair[2], go[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return pt_fail(PIPERT_ERR_INTERNAL, "coordinator: socketpair: %s", strerror(errno));
    if (pipe2(go, O_CLOEXEC) != 0) {
        close(pair[0]);
        close(pair[1]);
        return pt_fail(PIPERT_ERR_INTERNAL, "coordinator: pipe: %s", strerror(errno));
    }
    const pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) exec_coordinator(p, pair[1], launcher, go);
    close(pair[1]);
    close(go[0]);
    if (pid < 0) {
        close(pair[0]);
        close(go[1]);
        return pt_fail(PIPERT_ERR_INTERNAL, "coordinator: fork: %s", strerror(errno));
    }
    p->pid = pid;
    p->control_fd = pair[0];
    p->in.length = 0;
    p->starts++;
    char text[32];
    snprintf(text, sizeof text, "%d\n", (int)pid);
    if (p->pid_path[0] && pt_write_file_atomic(p->pid_path, text, strlen(text)) != PIPERT_OK)
        pt_warn("coordinator: %s", pipert_last_error());
    close(go[1]); /* it starts */
    for (int r = 0; r < p->options.world; r++) /* what the one before may not have heard */
        if (p->exits[r]) write_line(p, p->exits[r]);
    return PIPERT_OK;
}

pipert_result pt_coordinator_process_start(pt_coordinator_process **out,
                                           const pt_coordinator_options *options, int listen_fd,
                                           int port, const char *secret_path, const char *pid_path)
{
    *out = NULL;
    pt_coordinator_process *p = calloc(1, sizeof *p);
    const size_t world = (size_t)options->world;
    if (p) {
        p->exits = calloc(world, sizeof *p->exits);
        p->ranks = calloc(world, sizeof *p->ranks);
        p->left = calloc(world, sizeof *p->left);
        p->failure = calloc(world, sizeof *p->failure);
    }
    if (!p || !p->exits || !p->ranks || !p->left || !p->failure) {
        close(listen_fd);
        pt_coordinator_process_free(p);
        return pt_fail(PIPERT_ERR_NOMEM, "coordinator: out of memory");
    }
    p->options = *options;
    p->listen_fd = listen_fd;
    p->control_fd = -1;
    p->port = port;
    snprintf(p->secret_path, sizeof p->secret_path, "%s", secret_path);
    snprintf(p->pid_path, sizeof p->pid_path, "%s", pid_path);
    p->status = (pt_job_status){.phase = PT_JOB_REGISTERING, .world = options->world,
                                .abort_rank = -1, .val_step = -1, .val_loss = NAN,
                                .mean_loss = NAN};
    for (int r = 0; r < options->world; r++) p->ranks[r] = (pt_rank_status){PT_RANK_REGISTERING, -1};
    pipert_result rc = spawn(p);
    if (rc != PIPERT_OK) {
        pt_coordinator_process_free(p);
        return rc;
    }
    *out = p;
    return PIPERT_OK;
}

void pt_coordinator_process_free(pt_coordinator_process *p)
{
    if (!p) return;
    if (p->control_fd >= 0) close(p->control_fd); /* it ends when its launcher's socket closes */
    for (int i = 0; p->pid > 0 && i < 50; i++) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) p->pid = 0;
        else usleep(20000);
    }
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    if (p->listen_fd >= 0) close(p->listen_fd);
    for (int r = 0; p->exits && r < p->options.world; r++) free(p->exits[r]);
    free(p->exits);
    free(p->ranks);
    free(p->left);
    free(p->failure);
    pt_coord_buffer_free(&p->in);
    free(p);
}

int pt_coordinator_process_port(const pt_coordinator_process *p) { return p->port; }

static void gave_up(pt_coordinator_process *p, int status);

/* The coordinator ended (its socket closed, or the launcher reaped it): a new one, unless the
 * job is over. */
static void start_again(pt_coordinator_process *p, const char *how)
{
    if (p->control_fd >= 0) close(p->control_fd);
    p->control_fd = -1;
    const pid_t old = p->pid;
    p->pid = 0;
    if (p->status.phase == PT_JOB_FINISHED || p->status.phase == PT_JOB_ABORTED) return;
    pt_warn("the coordinator (pid %d) %s; starting it again (the workers register with the new "
            "one and train on)", (int)old, how);
    if (spawn(p) != PIPERT_OK) gave_up(p, -1);
}

/* A coordinator that ended on its own (it could not start, or failed) would do so again:
 * the job stops, as when it fails in the launcher's process. */
static void gave_up(pt_coordinator_process *p, int status)
{
    if (p->control_fd >= 0) close(p->control_fd);
    p->control_fd = -1;
    p->pid = 0;
    if (p->status.phase == PT_JOB_FINISHED || p->status.phase == PT_JOB_ABORTED) return;
    p->status.phase = PT_JOB_ABORTED;
    p->status.abort_rank = -1;
    snprintf(p->status.abort_reason, sizeof p->status.abort_reason,
             "the coordinator exited with status %d (its error is above)", status);
    pt_error("job aborted: %s", p->status.abort_reason);
}

bool pt_coordinator_process_reaped(pt_coordinator_process *p, pid_t pid, int wait_status)
{
    if (pid != p->pid) return false;
    if (!WIFSIGNALED(wait_status)) {
        gave_up(p, WEXITSTATUS(wait_status));
        return true;
    }
    char how[64];
    snprintf(how, sizeof how, "was killed by SIG%s", sigabbrev_np(WTERMSIG(wait_status)));
    start_again(p, how);
    return true;
}

static double real_or_nan(json_t *m, const char *key)
{
    json_t *v = json_object_get(m, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void read_snapshot(pt_coordinator_process *p, json_t *m)
{
    json_t *ranks = json_object_get(m, "ranks");
    if (json_array_size(ranks) != (size_t)p->options.world) return;
    pt_job_status *s = &p->status;
    long value;
#define FIELD(name) (pt_coord_get_long(m, #name, &value) ? value : 0)
    s->phase = (pt_job_phase)FIELD(phase);
    s->world = (int)FIELD(world);
    s->registered = (int)FIELD(registered);
    s->done = (int)FIELD(done);
    s->reporting = (int)FIELD(reporting);
    s->min_step = FIELD(min_step);
    s->total_steps = FIELD(total_steps);
    s->val_step = FIELD(val_step);
    s->replicas = (int)FIELD(replicas);
    s->replicas_live = (int)FIELD(replicas_live);
    s->departures = FIELD(departures);
    s->joins = FIELD(joins);
    s->abort_rank = (int)FIELD(abort_rank);
#undef FIELD
    s->mean_loss = real_or_nan(m, "mean_loss");
    s->tokens_per_s = real_or_nan(m, "tokens_per_s");
    s->compute = real_or_nan(m, "compute");
    s->wait_pipeline = real_or_nan(m, "wait_pipeline");
    s->wait_coupling = real_or_nan(m, "wait_coupling");
    s->bytes_wan = real_or_nan(m, "bytes_wan");
    s->val_loss = real_or_nan(m, "val_loss");
    const char *reason = pt_coord_get_string(m, "abort_reason");
    snprintf(s->abort_reason, sizeof s->abort_reason, "%s", reason ? reason : "");
    for (int r = 0; r < p->options.world; r++) {
        json_t *e = json_array_get(ranks, (size_t)r);
        long state = 0, step = -1;
        pt_coord_get_long(e, "state", &state);
        pt_coord_get_long(e, "step", &step);
        p->ranks[r] = (pt_rank_status){(pt_rank_state)state, step};
        p->left[r] = json_is_true(json_object_get(e, "left"));
        const char *failure = pt_coord_get_string(e, "failure");
        snprintf(p->failure[r], sizeof p->failure[r], "%s", failure ? failure : "");
    }
}

/* Reads what the coordinator sent; false when its socket closed. */
static bool read_control(pt_coordinator_process *p)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(p->control_fd, chunk, sizeof chunk, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0 || !pt_coord_buffer_append(&p->in, chunk, (size_t)n)) return false;
    }
    char *newline;
    while ((newline = pt_coord_find_newline(&p->in))) {
        const size_t length = (size_t)(newline - p->in.data);
        json_t *m = json_loadb(p->in.data, length, 0, NULL);
        if (m) read_snapshot(p, m);
        json_decref(m);
        pt_coord_buffer_consume(&p->in, length + 1);
    }
    return true;
}

pipert_result pt_coordinator_process_poll(pt_coordinator_process *p, int timeout_ms)
{
    if (p->control_fd < 0) { /* until the launcher reaps it */
        if (timeout_ms > 0) usleep((useconds_t)timeout_ms * 1000);
        return PIPERT_OK;
    }
    struct pollfd fd = {.fd = p->control_fd, .events = POLLIN};
    int ready = poll(&fd, 1, timeout_ms);
    if (ready < 0 && errno != EINTR)
        return pt_fail(PIPERT_ERR_INTERNAL, "coordinator: poll: %s", strerror(errno));
    if (ready > 0 && !read_control(p)) {
        /* it died; the launcher reaps it (pt_coordinator_process_reaped), or it is gone */
        close(p->control_fd);
        p->control_fd = -1;
    }
    return PIPERT_OK;
}

void pt_coordinator_process_rank_exited(pt_coordinator_process *p, int rank, int wait_status,
                                        bool by_launcher, const char *why)
{
    const bool signalled = WIFSIGNALED(wait_status);
    json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:b, s:s}", "type", "exited", "rank", rank,
                          "code", signalled ? -1 : WEXITSTATUS(wait_status), "signal",
                          signalled ? WTERMSIG(wait_status) : 0, "by_launcher", by_launcher,
                          "why", why);
    char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (!text) return;
    free(p->exits[rank]);
    p->exits[rank] = NULL;
    if (asprintf(&p->exits[rank], "%s\n", text) > 0) write_line(p, p->exits[rank]);
    else p->exits[rank] = NULL;
    free(text);
}

void pt_coordinator_process_rank_started(pt_coordinator_process *p, int rank)
{
    free(p->exits[rank]);
    p->exits[rank] = NULL;
}

void pt_coordinator_process_abort(pt_coordinator_process *p, const char *reason)
{
    json_t *m = json_pack("{s:s, s:s}", "type", "abort", "reason", reason);
    char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (!text) return;
    char *line = NULL;
    if (asprintf(&line, "%s\n", text) > 0) write_line(p, line);
    free(line);
    free(text);
}

void pt_coordinator_process_status(const pt_coordinator_process *p, pt_job_status *status)
{
    *status = p->status;
}

void pt_coordinator_process_rank_statuses(const pt_coordinator_process *p, pt_rank_status *ranks)
{
    memcpy(ranks, p->ranks, (size_t)p->options.world * sizeof *ranks);
}

bool pt_coordinator_process_rank_left(const pt_coordinator_process *p, int rank)
{
    return rank >= 0 && rank < p->options.world && p->left[rank];
}

bool pt_coordinator_process_rank_failure(const pt_coordinator_process *p, int rank, char *reason,
                                         size_t cap)
{
    if (rank < 0 || rank >= p->options.world || !p->failure[rank][0]) return false;
    if (reason && cap) snprintf(reason, cap, "%s", p->failure[rank]);
    return true;
}
