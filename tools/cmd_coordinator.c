/* pipert coordinator: the job's coordinator in a process of its own.
 *
 * Started by `pipert launch` (tools/coordinator_process.h), it serves the listening socket it
 * finds at fd 3 and talks to its launcher over fd 4: snapshots of the job out, the launcher's
 * words (a worker exited, stop) in. With --recover it was started again while the job runs and
 * takes it over from the workers (comm/coordinator_recover.c). It ends when the
 * launcher's socket closes.
 *
 * With --listen HOST:PORT it is the coordinator of a job that srun or mpirun started
 * (PIPERT_COORD_STANDALONE=1 in the workers' environment), which a user starts beside the
 * job: this process holds the socket and plays the launcher's part for the coordinator, which
 * it starts as its child as above and again when the child is killed; it exits when the job
 * finished (0) or aborted (1). */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/bootstrap.h"
#include "comm/coordinator.h"
#include "comm/coordinator_protocol.h"
#include "runtime/log.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/coordinator_process.h"

#define SLICE_MS 50
#define RESEND_S 1.0 /* an unchanged snapshot goes again this often */

/* --listen and --pid-file: a standalone coordinator's own options. */
typedef struct standalone_options {
    char listen[PT_HOST_MAX + 16]; /* "": started by pipert launch */
    char pid_file[4096];
} standalone_options;

static pipert_result parse(int argc, char **argv, pt_coordinator_options *o, char *secret_file,
                           size_t cap, standalone_options *alone)
{
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--recover")) {
            o->recover = true;
            continue;
        }
        if (!value) return pt_fail(PIPERT_ERR_CONFIG, "%s needs a value", flag);
        i++;
        if (!strcmp(flag, "--secret-file")) snprintf(secret_file, cap, "%s", value);
        else if (!strcmp(flag, "--listen")) snprintf(alone->listen, sizeof alone->listen, "%s", value);
        else if (!strcmp(flag, "--pid-file"))
            snprintf(alone->pid_file, sizeof alone->pid_file, "%s", value);
        else if (!strcmp(flag, "--heartbeat-timeout")) {
            char *end;
            o->dead_after_s = strtod(value, &end);
            if (end == value || *end || !(o->dead_after_s >= 1 && o->dead_after_s <= 3600))
                return pt_fail(PIPERT_ERR_CONFIG, "--heartbeat-timeout '%s': expected seconds in "
                                                  "[1, 3600]", value);
        }
        else if (!strcmp(flag, "--world")) {
            PT_TRY(pt_cli_parse_int(flag, value, 1, PT_MAX_WORLD, 0, &o->world));
        } else if (!strcmp(flag, "--stages")) {
            PT_TRY(pt_cli_parse_int(flag, value, 1, PT_MAX_WORLD, 1, &o->stages));
        } else if (!strcmp(flag, "--min-replicas")) {
            PT_TRY(pt_cli_parse_int(flag, value, 0, PT_MAX_WORLD, 0, &o->min_replicas));
        } else return pt_fail(PIPERT_ERR_CONFIG, "unknown option %s", flag);
    }
    const char *from_env = getenv("PIPERT_SECRET_FILE");
    if (!*secret_file && alone->listen[0] && from_env) snprintf(secret_file, cap, "%s", from_env);
    if (!*secret_file || o->world < 1)
        return pt_fail(PIPERT_ERR_CONFIG, "--world and --secret-file are required (pipert "
                                          "coordinator --listen HOST:PORT --world W --stages S "
                                          "--secret-file F [--min-replicas N] "
                                          "[--heartbeat-timeout S] [--pid-file P])");
    return PIPERT_OK;
}

/* Sends the snapshot when it changed, or RESEND_S after the last; false when the launcher is
 * gone. */
static bool send_snapshot(pt_coordinator *c, char **last, double *sent_at)
{
    json_t *m = pt_coordinator_process_snapshot(c);
    char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (!text) return true;
    const double now = pt_now_s();
    if (*last && !strcmp(*last, text) && now - *sent_at < RESEND_S) {
        free(text);
        return true;
    }
    free(*last);
    *last = text;
    *sent_at = now;
    const size_t length = strlen(text);
    bool ok = send(PT_COORDINATOR_CONTROL_FD, text, length, MSG_NOSIGNAL) == (ssize_t)length &&
              send(PT_COORDINATOR_CONTROL_FD, "\n", 1, MSG_NOSIGNAL) == 1;
    return ok;
}

/* The launcher's lines; false once its socket closed. */
static bool read_launcher(pt_coordinator *c, pt_coord_buffer *in)
{
    char chunk[65536];
    ssize_t n = recv(PT_COORDINATOR_CONTROL_FD, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0 || !pt_coord_buffer_append(in, chunk, (size_t)n)) return false;
    char *newline;
    while ((newline = pt_coord_find_newline(in))) {
        const size_t length = (size_t)(newline - in->data);
        pt_coordinator_process_handle(c, in->data, length);
        pt_coord_buffer_consume(in, length + 1);
    }
    return true;
}

static void serve(pt_coordinator *c)
{
    pt_coord_buffer in = {0};
    char *last = NULL;
    double sent_at = 0;
    for (bool open = true; open;) {
        struct pollfd fd = {.fd = PT_COORDINATOR_CONTROL_FD, .events = POLLIN};
        if (poll(&fd, 1, SLICE_MS) > 0) open = read_launcher(c, &in);
        if (open) open = send_snapshot(c, &last, &sent_at);
    }
    free(last);
    pt_coord_buffer_free(&in);
}

/* ---- standalone: pipert coordinator --listen ------------------------------------ */

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int signal_number) { stop_signal = signal_number; }

/* Plays the launcher's part for the coordinator child until the job finished or aborted: reaps
 * it (and starts it again when it was killed), and turns SIGINT or SIGTERM into the job's
 * abort. */
static int supervise(pt_coordinator_process *p)
{
    struct sigaction action = {.sa_handler = on_stop_signal}; /* no SA_RESTART: poll wakes up */
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    bool stopping = false;
    pt_job_status status;
    do {
        if (pt_coordinator_process_poll(p, 100) != PIPERT_OK)
            pt_coordinator_process_abort(p, pipert_last_error());
        int wait_status;
        for (pid_t pid; (pid = waitpid(-1, &wait_status, WNOHANG)) > 0;)
            pt_coordinator_process_reaped(p, pid, wait_status);
        if (stop_signal && !stopping) {
            stopping = true;
            pt_warn("pipert coordinator: SIG%s: the job stops", sigabbrev_np(stop_signal));
            pt_coordinator_process_abort(p, "its coordinator was asked to stop");
        }
        pt_coordinator_process_status(p, &status);
    } while (status.phase != PT_JOB_FINISHED && status.phase != PT_JOB_ABORTED);
    return status.phase == PT_JOB_FINISHED ? 0 : 1;
}

static int run_standalone(const pt_coordinator_options *options, const char *secret_file,
                          const standalone_options *alone)
{
    char host[PT_HOST_MAX];
    int port, fd, bound;
    pt_coordinator_process *p = NULL;
    pipert_result rc = pt_parse_host_port(alone->listen, "--listen", host, sizeof host, &port);
    if (rc == PIPERT_OK) rc = pt_coordinator_listen(host, port, &fd, &bound);
    if (rc == PIPERT_OK)
        rc = pt_coordinator_process_start(&p, options, fd, bound, secret_file, alone->pid_file);
    if (rc != PIPERT_OK) return pt_cmd_report_failure("coordinator");
    pt_info("pipert coordinator: listening at %s:%d for %d ranks of %d stages; workers need "
            "PIPERT_COORD=%s:%d PIPERT_COORD_STANDALONE=1", host, bound, options->world,
            options->stages, host, bound);
    const int code = supervise(p);
    pt_coordinator_process_free(p);
    return code;
}

int pt_cmd_coordinator(int argc, char **argv)
{
    pt_coordinator_options options = PT_COORDINATOR_OPTIONS_INIT;
    options.listen_fd = PT_COORDINATOR_LISTEN_FD;
    pt_bootstrap boot = {0};
    standalone_options alone = {0};
    char secret[PT_SECRET_MAX + 1];
    pt_coordinator *c = NULL;
    pipert_result rc =
        parse(argc, argv, &options, boot.secret_file, sizeof boot.secret_file, &alone);
    if (rc == PIPERT_OK) rc = pt_bootstrap_read_secret(&boot, secret);
    if (alone.listen[0]) /* the child reads the file itself; a bad one fails here first */
        return rc == PIPERT_OK ? run_standalone(&options, boot.secret_file, &alone)
                               : pt_cmd_report_failure("coordinator");
    options.secret = secret;
    if (rc == PIPERT_OK) rc = pt_coordinator_create(&c, &options);
    else close(PT_COORDINATOR_LISTEN_FD);
    if (rc == PIPERT_OK) rc = pt_coordinator_start(c);
    if (rc != PIPERT_OK) {
        pt_coordinator_free(c);
        return pt_cmd_report_failure("coordinator");
    }
    serve(c);
    pt_coordinator_free(c);
    return 0;
}
