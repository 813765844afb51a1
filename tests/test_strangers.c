/* A stranger's bytes never end a job.
 *
 * A real two-stage `pipert launch` job trains while this test, from outside,
 * finds every TCP port that its processes (the launcher with its coordinator,
 * and the workers, its children) listen on — from the operating system:
 * /proc/PID/fd's socket inodes against the listening entries of
 * /proc/PID/net/tcp and tcp6 — and throws at each: random bytes (64 and
 * 64 KiB); 64 zero bytes (a header announcing 0 bytes and more behind it, what
 * UCX's sockaddr listener, gone now, aborted on); protocol-looking data cut
 * short (a coordinator registration without its end; UCX's TCP greeting,
 * magic number and all, without its header); a registration with a wrong
 * secret; oversized length headers (a bare 32-bit one; UCX's greeting followed
 * by an active-message header of 4 GiB, which UCX 1.13 asserts on); a
 * connection that closes at once and one that sends nothing and stays open
 * through all of it.
 *
 * The job must still have been running when the strangers were done (or the
 * test proved nothing), train on for AFTER_STEPS more steps, and then stop
 * cleanly when asked (SIGTERM: exit status 128 + 15, where a rank that failed
 * would have made it exit 1), and the coordinator must have logged refusing
 * them, once each (not once per line of 64 KiB of random bytes). UCX's ports
 * are closed to new connections by then: their strangers' connects time out,
 * with nothing to log (docs/ARCHITECTURE.md). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"
#include "tests/listening.h"

/* About a millisecond a step alone; the two-stage job runs for several seconds. */
#define SMALL_MODEL                                                                                \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2"
/* Connections throw_everything makes, and the silent one. */
#define STRANGERS_PER_PORT 11
/* A quarter of a minute on an idle machine, longer than the strangers take; the
 * test stops the job once it trained AFTER_STEPS past them (a few seconds). */
#define STEPS 40000
#define AFTER_STEPS 1000
#define FINISH_WAIT_S 900.0
#define MAX_PIDS 16
/* How long the silent stranger stays connected. */
#define IDLE_HOLD_S 3.0

/* ---- the job ------------------------------------------------------------- */

static pid_t start_job(const char *dir, const char *err_path)
{
    char command[2048];
    snprintf(command, sizeof command,
             "exec %s launch --stages 2 --replicas 1 --out %s " SMALL_MODEL
             " --train.steps=%d --train.log_every=100 >/dev/null 2>%s",
             pipert_bin(), dir, STEPS, err_path);
    pid_t launcher = fork();
    cr_assert_geq(launcher, 0);
    if (launcher == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test leaves no job running */
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    return launcher;
}

static bool file_contains(const char *path, const char *needle)
{
    char *text;
    size_t size;
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return false;
    bool found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

/* Until the last stage has logged step 100 (the data plane is up), at most 60 s. */
static bool wait_until_training(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/logs/rank-1.log", dir);
    for (int i = 0; i < 600; i++) {
        if (file_contains(path, "step 100/")) return true;
        usleep(100000);
    }
    return false;
}

/* The launcher and its children (the workers), from /proc/PID/stat's ppid. */
static int job_pids(pid_t launcher, pid_t *pids)
{
    int n = 0;
    pids[n++] = launcher;
    DIR *proc = opendir("/proc");
    cr_assert_not_null(proc);
    for (struct dirent *e; (e = readdir(proc)) && n < MAX_PIDS;) {
        char path[300], text[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t got = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[got] = '\0';
        const char *after_name = strrchr(text, ')'); /* the name may hold spaces */
        int pid, ppid;
        char state;
        if (sscanf(text, "%d", &pid) == 1 && after_name &&
            sscanf(after_name + 1, " %c %d", &state, &ppid) == 2 && ppid == launcher)
            pids[n++] = pid;
    }
    closedir(proc);
    return n;
}

/* ---- strangers ----------------------------------------------------------- */

/* Connects, sends what it can of `bytes` within a second, lingers 200 ms, closes. */
static bool throw_bytes(const port *p, const void *bytes, size_t n)
{
    int fd = stranger_connect(p);
    if (fd < 0) return false;
    size_t sent = 0;
    for (int tries = 0; sent < n && tries < 100; tries++) {
        ssize_t k = send(fd, (const char *)bytes + sent, n - sent, MSG_NOSIGNAL);
        if (k > 0) sent += (size_t)k;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
        else usleep(10000);
    }
    usleep(200000);
    close(fd);
    return true;
}

static void random_bytes(unsigned char *out, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)rand();
}

/* Every stranger at one port (after the silent one, which is connected already, if it could
 * be); returns how many connections it accepted. */
static int throw_everything(const port *p, bool silent_got_in)
{
    static unsigned char big[64 << 10];
    unsigned char small[64], ucx[64];
    int accepted = 0;
    random_bytes(small, sizeof small, (unsigned)p->port);
    random_bytes(big, sizeof big, (unsigned)p->port + 1);
    accepted += throw_bytes(p, small, sizeof small);
    if (!silent_got_in && !accepted) return 0; /* it takes no new connection: the rest neither */
    accepted += throw_bytes(p, big, sizeof big);
    static const unsigned char zeros[64];
    accepted += throw_bytes(p, zeros, sizeof zeros);
    static const char cut_short[] =
        "{\"type\":\"register\",\"rank\":0,\"world\":2,\"host\":\"stranger\",\"pid\":1,\"addr";
    accepted += throw_bytes(p, cut_short, sizeof cut_short - 1);
    static const char wrong_secret[] =
        "{\"type\":\"register\",\"rank\":0,\"world\":2,\"host\":\"stranger\",\"pid\":1,"
        "\"address\":\"x\",\"secret\":\"not the job's secret\"}\n";
    accepted += throw_bytes(p, wrong_secret, sizeof wrong_secret - 1);
    static const unsigned char huge_length[] = {0xff, 0xff, 0xff, 0xff, 'p', 't'};
    accepted += throw_bytes(p, huge_length, sizeof huge_length);
    accepted += throw_bytes(p, ucx, ucx_greeting(ucx, 32, 0xffffffffu, 5)); /* 4 GiB message */
    accepted += throw_bytes(p, ucx, ucx_greeting(ucx, 32, 1, 5) + 1);      /* a 1-byte CM packet */
    accepted += throw_bytes(p, ucx, ucx_greeting(ucx, 0, 0, 3));           /* header cut short */
    int empty = stranger_connect(p);
    if (empty >= 0) {
        close(empty);
        accepted++;
    }
    return accepted;
}

Test(strangers, bytes_at_every_listening_port_do_not_end_the_job)
{
    char *dir = make_temp_dir(), err_path[600];
    snprintf(err_path, sizeof err_path, "%s/launcher.err", dir);
    pid_t launcher = start_job(dir, err_path);
    cr_assert(wait_until_training(dir), "the job did not start training within 60 s");

    pid_t pids[MAX_PIDS];
    int n_pids = job_pids(launcher, pids);
    cr_assert_geq(n_pids, 3, "found %d processes: the launcher and fewer than 2 workers", n_pids);
    port ports[MAX_PORTS];
    int n_ports = 0;
    for (int i = 0; i < n_pids; i++) listening_ports(pids[i], ports, &n_ports);
    cr_assert_geq(n_ports, 1, "no process of the job listens: not even the coordinator");

    /* The silent strangers connect first and stay through everything else. */
    int idle[MAX_PORTS];
    double idle_since = pt_now_s();
    for (int i = 0; i < n_ports; i++) idle[i] = stranger_connect(&ports[i]);
    for (int i = 0; i < n_ports; i++) {
        int accepted = throw_everything(&ports[i], idle[i] >= 0);
        cr_log_info("pid %d, %s port %d: %d stranger connections accepted", (int)ports[i].pid,
                    ports[i].host, ports[i].port, accepted);
    }
    while (pt_now_s() - idle_since < IDLE_HOLD_S) usleep(100000);
    for (int i = 0; i < n_ports; i++)
        if (idle[i] >= 0) close(idle[i]);

    cr_expect_eq(waitpid(launcher, NULL, WNOHANG), 0, "the job ended before the strangers were "
                 "done: this proves nothing (raise STEPS)");
    /* trained on past the strangers: stopped as a user would */
    const long strangers_done_at = logged_step(dir);
    long trained_to;
    const int status = stop_job_at_step(launcher, dir, strangers_done_at + AFTER_STEPS,
                                        FINISH_WAIT_S, err_path, &trained_to);
    char *err = NULL;
    size_t size;
    if (pt_read_file(err_path, &err, &size) != PIPERT_OK) err = strdup("(no launcher.err)");
    cr_assert(trained_to >= strangers_done_at + AFTER_STEPS,
              "the job trained from step %ld to %ld after strangers at %d ports, not %d steps "
              "(exit status %d):\n%s", strangers_done_at, trained_to, n_ports, AFTER_STEPS, status,
              err);
    cr_assert_eq(status, 128 + SIGTERM, "the job did not stop cleanly when asked (exit status %d) "
                 "after strangers at %d ports:\n%s", status, n_ports, err);
    cr_expect(!strstr(err, "SIGKILL"), "a worker had to be killed:\n%s", err);
    cr_expect(strstr(err, "coordinator: refused"), "the coordinator logged no stranger:\n%s", err);
    int warnings = 0;
    for (const char *p = err; (p = strstr(p, "coordinator: ")); p++) warnings++;
    cr_expect_leq(warnings, 2 * STRANGERS_PER_PORT,
                  "the coordinator logged %d lines for %d strangers:\n%s", warnings,
                  STRANGERS_PER_PORT, err);
    free(err);
    remove_dir(dir);
}
