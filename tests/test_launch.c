/* The control plane of a multi-worker job.
 *
 * In this process: the coordinator and its clients over real TCP sockets —
 * rendezvous and the peer table, progress aggregation against hand-computed
 * values, refusal (and logging) of a wrong secret, a wrong proof, a replayed
 * registration and an impostor coordinator (the secret never on the wire), and every way a job must
 * abort: a rank's connection drops, a rank goes silent, a rank registers
 * twice, ranks never register, the coordinator dies or goes silent.
 *
 * As real processes (`pipert launch` and `pipert worker`, via PIPERT_BIN): a
 * one-replica job runs to the end with per-rank logs; a worker killed with
 * SIGKILL or stopped with SIGSTOP is noticed within 10 s and the launcher
 * exits non-zero naming the rank; SIGTERM to the launcher leaves no worker
 * behind; and the not-yet-supported requests fail loudly.
 *
 * Time limits are generous multiples of the mechanism's own period (stated
 * at each), since the machine may be busy. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/coordinator.h"
#include "runtime/fileio.h"
#include "tests/command.h"
#include "tests/coord_handshake.h"

#define SECRET "5ecret5ecret5ecret5ecret5ecret00"

/* ---- helpers: coordinator and clients in this process ------------------------ */

static pt_coordinator *start_coordinator(int world, double heartbeat_s, double dead_after_s)
{
    pt_coordinator_options o = PT_COORDINATOR_OPTIONS_INIT;
    o.bind_host = "127.0.0.1";
    o.world = world;
    o.secret = SECRET;
    o.heartbeat_interval_s = heartbeat_s;
    o.dead_after_s = dead_after_s;
    pt_coordinator *c;
    cr_assert_eq(pt_coordinator_create(&c, &o), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_coordinator_start(c), PIPERT_OK, "%s", pipert_last_error());
    return c;
}

typedef struct abort_record {
    atomic_int calls;
    int rank;
    char reason[512];
} abort_record;

static void record_abort(void *context, int rank, const char *reason)
{
    abort_record *r = context;
    r->rank = rank;
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    atomic_fetch_add(&r->calls, 1);
}

static pipert_result connect_client(pt_coord_client **client, int port, const char *secret,
                                    int rank, int world, const char *address, double dead_after_s,
                                    abort_record *record)
{
    pt_coord_client_options o = PT_COORD_CLIENT_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.secret = secret;
    o.rank = rank;
    o.world = world;
    o.address = address;
    o.connect_timeout_s = 5;
    o.heartbeat_interval_s = fmin(0.2, dead_after_s / 3);
    o.dead_after_s = dead_after_s;
    o.on_abort = record ? record_abort : NULL;
    o.on_abort_context = record;
    return pt_coord_client_connect(client, &o);
}

static pt_coord_client *join(int port, int rank, int world, abort_record *record)
{
    pt_coord_client *client;
    char address[32];
    snprintf(address, sizeof address, "address-of-%d", rank);
    cr_assert_eq(connect_client(&client, port, SECRET, rank, world, address, 5.0, record), PIPERT_OK,
                 "rank %d: %s", rank, pipert_last_error());
    return client;
}

/* Waits up to timeout_s for the client to see an abort; the seconds it took. */
static double wait_for_abort(pt_coord_client *client, double timeout_s)
{
    double start = pt_now_s();
    while (!pt_coord_client_aborted(client) && pt_now_s() - start < timeout_s) usleep(10000);
    cr_assert(pt_coord_client_aborted(client), "no abort within %.1f s", timeout_s);
    return pt_now_s() - start;
}

/* stderr into a file while `capture` is open. */
typedef struct capture {
    int saved_fd;
    char path[64];
} capture;

static void capture_begin(capture *cap)
{
    snprintf(cap->path, sizeof cap->path, "/tmp/pipert-stderr-XXXXXX");
    int fd = mkstemp(cap->path);
    cr_assert_geq(fd, 0);
    fflush(stderr);
    cap->saved_fd = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

/* Restores stderr; returns what was written (caller frees). */
static char *capture_end(capture *cap)
{
    fflush(stderr);
    dup2(cap->saved_fd, STDERR_FILENO);
    close(cap->saved_fd);
    char *text;
    size_t size;
    cr_assert_eq(pt_read_file(cap->path, &text, &size), PIPERT_OK);
    unlink(cap->path);
    return text;
}

/* ---- rendezvous and progress ------------------------------------------------- */

Test(coordinator, rendezvous_table_and_progress)
{
    pt_coordinator *c = start_coordinator(3, 0.2, 5.0);
    const int port = pt_coordinator_port(c);
    pt_coord_client *clients[3];
    const int order[3] = {2, 0, 1}; /* registration order need not be rank order */
    for (int i = 0; i < 3; i++) clients[order[i]] = join(port, order[i], 3, NULL);

    char host[PT_HOST_MAX] = "";
    gethostname(host, sizeof host - 1);
    for (int r = 0; r < 3; r++) {
        const pt_peer_table *t;
        cr_assert_eq(pt_coord_client_wait_table(clients[r], 5, &t), PIPERT_OK, "rank %d: %s", r,
                     pipert_last_error());
        cr_assert_eq(t->world, 3);
        for (int p = 0; p < 3; p++) {
            char address[32];
            snprintf(address, sizeof address, "address-of-%d", p);
            cr_expect_eq(t->peers[p].rank, p);
            cr_expect_str_eq(t->peers[p].address, address, "rank %d sees rank %d's address as %s",
                             r, p, t->peers[p].address);
            cr_expect_eq(t->peers[p].pid, getpid());
            cr_expect_str_eq(t->peers[p].host, host);
        }
    }
    pt_job_status s;
    pt_coordinator_status(c, &s);
    cr_expect_eq(s.phase, PT_JOB_RUNNING);
    cr_expect_eq(s.registered, 3);

    /* Latest reports: the job is at the slowest rank's step; the loss is the
     * mean, the rate the sum: (3 + 2 + 1)/3 = 2, 100 + 200 + 300 = 600. The
     * shares are means over the ranks that measured them (not rank 2):
     * compute (0.8 + 0.6)/2, waits (0.1 + 0.3)/2 and (0.06 + 0)/2; bytes
     * between sites the sum, 1000 + 3000. */
    const pt_rank_progress reports[3] = {{10, 50, 3.0, 100, NAN, 0.8, 0.1, 0.06, 1000},
                                         {12, 50, 2.0, 200, 2.5, 0.6, 0.3, 0.0, 3000},
                                         {11, 50, 1.0, 300, NAN, NAN, NAN, NAN, 0}};
    for (int r = 0; r < 3; r++)
        cr_assert_eq(pt_coord_client_send_progress(clients[r], &reports[r]), PIPERT_OK);
    double start = pt_now_s();
    do pt_coordinator_status(c, &s);
    while (s.reporting < 3 && pt_now_s() - start < 5 && usleep(10000) == 0);
    cr_assert_eq(s.reporting, 3);
    cr_expect_eq(s.min_step, 10);
    cr_expect_eq(s.total_steps, 50);
    cr_expect(fabs(s.mean_loss - 2.0) < 1e-9, "mean loss %g, expected 2", s.mean_loss);
    cr_expect(fabs(s.tokens_per_s - 600) < 1e-9, "tokens/s %g, expected 600", s.tokens_per_s);
    cr_expect_eq(s.val_step, 12);
    cr_expect(fabs(s.val_loss - 2.5) < 1e-9, "val_loss %g, expected 2.5", s.val_loss);
    char line[256];
    pt_job_progress_line(&s, line, sizeof line);
    cr_expect(strstr(line, "step 10/50") && strstr(line, "loss 2.0000") && strstr(line, "600 tok/s"),
              "progress line: %s", line);
    cr_expect(fabs(s.compute - 0.7) < 1e-9 && fabs(s.wait_pipeline - 0.2) < 1e-9 &&
                  fabs(s.wait_coupling - 0.03) < 1e-9 && fabs(s.bytes_wan - 4000) < 1e-9,
              "utilisation %g %g %g, %g bytes", s.compute, s.wait_pipeline, s.wait_coupling,
              s.bytes_wan);
    cr_expect(strstr(line, "compute 70%, waiting 20% pipeline 3% coupling") &&
                  strstr(line, "0.00 MB/step between sites"),
              "progress line: %s", line);

    for (int r = 0; r < 3; r++) cr_assert_eq(pt_coord_client_send_done(clients[r]), PIPERT_OK);
    pt_coordinator_wait(c, 5);
    pt_coordinator_status(c, &s);
    cr_expect_eq(s.phase, PT_JOB_FINISHED, "phase %d after every rank said done", s.phase);
    for (int r = 0; r < 3; r++) {
        pt_coord_client_close(clients[r]);
        char reason[64];
        cr_expect_not(pt_coordinator_rank_failure(c, r, reason, sizeof reason),
                      "rank %d closing after done counted as a failure: %s", r, reason);
    }
    pt_coordinator_free(c);
}

/* ---- refusals ----------------------------------------------------------------- */

Test(coordinator, wrong_secret_is_refused_and_logged)
{
    pt_coordinator *c = start_coordinator(1, 0.2, 5.0);
    const int port = pt_coordinator_port(c);
    capture cap;
    capture_begin(&cap);
    pt_coord_client *intruder = NULL;
    pipert_result rc = connect_client(&intruder, port, "not-the-secret-at-all", 0, 1, "", 5.0, NULL);
    char error[1024];
    snprintf(error, sizeof error, "%s", pipert_last_error());
    /* A raw connection that says something else first is refused too. */
    int fd = coord_dial(port);
    cr_assert_geq(fd, 0);
    cr_assert(coord_write_line(fd, "{\"type\": \"progress\", \"step\": 1}\n"));
    char answer[512] = "";
    ssize_t n = 0, got;
    while (n < (ssize_t)sizeof answer - 1 && (got = read(fd, answer + n, sizeof answer - 1 - (size_t)n)) > 0)
        n += got; /* until the coordinator closes it */
    close(fd);
    /* One that skips the hello, and one that proves with random bytes. */
    char skipped[512] = "", wrong_proof[512] = "";
    fd = coord_dial(port);
    cr_assert(coord_write_line(fd, "{\"type\": \"register\", \"rank\": 0, \"world\": 1, "
                                   "\"host\": \"h\", \"pid\": 1, \"address\": \"\", "
                                   "\"proof\": \"00\"}\n"));
    coord_read_line(fd, skipped, sizeof skipped, 10);
    close(fd);
    fd = coord_dial(port);
    coord_transcript sent;
    cr_expect(coord_register_raw(fd, NULL, 0, 1, &sent, wrong_proof, sizeof wrong_proof));
    close(fd);
    usleep(300 * 1000); /* the coordinator's log of the closed connections */
    char *log = capture_end(&cap);

    cr_expect_eq(rc, PIPERT_ERR_AUTH, "a wrong secret got %s", pipert_result_str(rc));
    cr_expect_null(intruder);
    cr_expect(strstr(error, "did not prove that it knows the job's secret"), "client error: %s",
              error);
    cr_expect(strstr(log, "127.0.0.1:") && strstr(log, "closed its connection after our challenge"),
              "the intruder's departure was not logged with its address: %s", log);
    cr_expect(strstr(answer, "refused") && strstr(answer, "register first"),
              "a connection that did not register first got: %s", answer);
    cr_expect(strstr(skipped, "refused") && strstr(skipped, "hello first"),
              "a registration without a hello got: %s", skipped);
    cr_expect(strstr(wrong_proof, "refused") && strstr(wrong_proof, "wrong job secret"),
              "a wrong proof got: %s", wrong_proof);
    cr_expect(strstr(log, "its proof of the job's secret is wrong"),
              "the wrong proof was not logged: %s", log);
    free(log);

    pt_job_status s;
    pt_coordinator_status(c, &s);
    cr_expect_eq(s.phase, PT_JOB_REGISTERING, "a refused stranger changed the job");
    pt_coord_client *worker = join(port, 0, 1, NULL);
    const pt_peer_table *t;
    cr_expect_eq(pt_coord_client_wait_table(worker, 5, &t), PIPERT_OK, "%s", pipert_last_error());
    pt_coord_client_close(worker);
    pt_coordinator_free(c);
}

Test(coordinator, duplicate_rank_aborts_the_job)
{
    pt_coordinator *c = start_coordinator(2, 0.2, 5.0);
    abort_record record = {0};
    pt_coord_client *first = join(pt_coordinator_port(c), 0, 2, &record), *second = NULL;
    cr_expect_eq(connect_client(&second, pt_coordinator_port(c), SECRET, 0, 2, "", 5.0, NULL),
                 PIPERT_ERR_PEER);
    cr_expect(strstr(pipert_last_error(), "registered twice"), "%s", pipert_last_error());
    wait_for_abort(first, 3);
    cr_expect(strstr(record.reason, "registered twice"), "abort reason: %s", record.reason);
    cr_expect_eq(record.rank, -1);
    pt_coord_client_close(first);
    pt_coordinator_free(c);
}

/* A client of rank `rank` whose registration says `identity` (runtime/job_digest.h). */
static pipert_result connect_as(pt_coord_client **client, int port, int rank, int world,
                                const pt_job_identity *identity)
{
    pt_coord_client_options o = PT_COORD_CLIENT_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.secret = SECRET;
    o.rank = rank;
    o.world = world;
    o.connect_timeout_s = 5;
    o.heartbeat_interval_s = 0.2;
    o.identity = *identity;
    return pt_coord_client_connect(client, &o);
}

/* The first rank's protocol version and digest are the job's: a rank of another build, or with
 * other settings, is refused naming itself and what differs (PIPERT_ERR_CONFIG), and since the
 * job cannot start without it, the job aborts. */
static void other_identity_is_refused(const pt_job_identity *theirs, const char *expected)
{
    pt_coordinator *c = start_coordinator(2, 0.2, 5.0);
    capture cap;
    capture_begin(&cap);
    const pt_job_identity ours = {.part = {1, 2, 3, 4, 5, 6}};
    pt_coord_client *first = NULL, *second = NULL;
    cr_assert_eq(connect_as(&first, pt_coordinator_port(c), 0, 2, &ours), PIPERT_OK, "%s",
                 pipert_last_error());
    pipert_result rc = connect_as(&second, pt_coordinator_port(c), 1, 2, theirs);
    char error[1024];
    snprintf(error, sizeof error, "%s", pipert_last_error());
    wait_for_abort(first, 3);
    pt_coord_client_close(first);
    pt_coordinator_free(c);
    char *log = capture_end(&cap);
    cr_expect_eq(rc, PIPERT_ERR_CONFIG, "%s", error);
    cr_expect(strstr(error, "refused rank 1: rank 1 is not of this job's build or settings") &&
                  strstr(error, expected),
              "expected \"%s\" in: %s", expected, error);
    cr_expect(strstr(log, "coordinator: refused rank 1") && strstr(log, expected), "%s", log);
    free(log);
}

Test(coordinator, a_rank_of_another_protocol_version_is_refused_by_name)
{
    const pt_job_identity theirs = {.protocol = PT_PROTOCOL_VERSION + 1, .part = {1, 2, 3, 4, 5, 6}};
    char expected[64];
    snprintf(expected, sizeof expected, "protocol version %u vs %u", PT_PROTOCOL_VERSION + 1,
             PT_PROTOCOL_VERSION);
    other_identity_is_refused(&theirs, expected);
}

Test(coordinator, a_rank_with_other_settings_is_refused_by_name)
{
    const pt_job_identity theirs = {.part = {9, 2, 3, 4, 5, 6}};
    other_identity_is_refused(&theirs, "(settings differ in: model shape)");
}

Test(coordinator, ranks_that_never_register_abort_the_job)
{
    pt_coordinator_options o = PT_COORDINATOR_OPTIONS_INIT;
    o.bind_host = "127.0.0.1";
    o.world = 3;
    o.secret = SECRET;
    o.register_timeout_s = 0.5;
    pt_coordinator *c;
    cr_assert_eq(pt_coordinator_create(&c, &o), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_coordinator_start(c), PIPERT_OK);
    pt_coord_client *client = join(pt_coordinator_port(c), 1, 3, NULL);
    const pt_peer_table *t;
    cr_expect_eq(pt_coord_client_wait_table(client, 5, &t), PIPERT_ERR_PEER);
    cr_expect(strstr(pipert_last_error(), "2 of 3 ranks did not register within 0.5 s") &&
                  strstr(pipert_last_error(), "ranks 0, 2"),
              "%s", pipert_last_error());
    pt_coord_client_close(client);
    pt_coordinator_free(c);
}

/* ---- deaths -------------------------------------------------------------------- */

Test(coordinator, dropped_connection_aborts_every_rank)
{
    pt_coordinator *c = start_coordinator(3, 0.2, 5.0);
    const int port = pt_coordinator_port(c);
    abort_record records[3] = {0};
    pt_coord_client *clients[3];
    for (int r = 0; r < 3; r++) clients[r] = join(port, r, 3, &records[r]);
    const pt_peer_table *t;
    for (int r = 0; r < 3; r++) cr_assert_eq(pt_coord_client_wait_table(clients[r], 5, &t), PIPERT_OK);

    pt_coord_client_close(clients[1]); /* gone without "done": as if the process died */
    for (int r = 0; r < 3; r += 2) {
        double took = wait_for_abort(clients[r], 3); /* a closed socket is seen at once */
        cr_expect_lt(took, 3.0);
        cr_expect_eq(pt_coord_client_check(clients[r]), PIPERT_ERR_PEER);
        cr_expect(strstr(pipert_last_error(), "job aborted: rank 1:") &&
                      strstr(pipert_last_error(), "closed before it said done"),
                  "rank %d: %s", r, pipert_last_error());
        cr_expect_eq(atomic_load(&records[r].calls), 1, "rank %d: abort callback called %d times", r,
                     atomic_load(&records[r].calls));
        cr_expect_eq(records[r].rank, 1);
    }
    pt_job_status s;
    pt_coordinator_status(c, &s);
    cr_expect_eq(s.phase, PT_JOB_ABORTED);
    cr_expect_eq(s.abort_rank, 1);
    pt_coord_client_close(clients[0]);
    pt_coord_client_close(clients[2]);
    pt_coordinator_free(c);
}

/* A rank that registers and then says nothing (hung, stopped, unreachable). */
/* A coordinator started again (recover) takes a worker's registration with its view of the job
 * ("resume": coordinator_recover.c); a view that does not fit the job is refused, saying so and
 * naming the peer in its log, and neither takes the rank nor ends the job. */
Test(coordinator, a_coordinator_started_again_refuses_a_malformed_view_of_the_job)
{
    pt_coordinator_options o = PT_COORDINATOR_OPTIONS_INIT;
    o.bind_host = "127.0.0.1";
    o.world = 2;
    o.stages = 1;
    o.min_replicas = 1;
    o.secret = SECRET;
    o.recover = true;
    o.recover_timeout_s = 60;
    pt_coordinator *c;
    cr_assert_eq(pt_coordinator_create(&c, &o), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_coordinator_start(c), PIPERT_OK, "%s", pipert_last_error());
    const char *malformed[] = {
        ", \"resume\": [1]",                                      /* not an object */
        ", \"resume\": {\"epoch\": -1}",                            /* a negative epoch */
        ", \"resume\": {\"epoch\": 0, \"left\": [2]}",              /* replica 2 of 2 */
        ", \"resume\": {\"epoch\": 0, \"in\": [[0]]}",              /* a pair without its epoch */
        ", \"resume\": {\"epoch\": 0, \"switch\": {\"joiners\": [5]}}", /* replica 5 */
    };
    coord_transcript sent;
    char answer[512];
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        capture cap;
        capture_begin(&cap);
        int fd = coord_dial(pt_coordinator_port(c));
        cr_assert(coord_register_raw_with(fd, SECRET, 0, 2, malformed[i], &sent, answer,
                                          sizeof answer));
        close(fd);
        char *log = capture_end(&cap);
        cr_expect(strstr(answer, "refused") && strstr(answer, "malformed resume view"),
                  "%s got: %s", malformed[i], answer);
        cr_expect(strstr(log, "rank 0 registered again with a malformed view of the job") &&
                      strstr(log, "127.0.0.1:"),
                  "not logged with the peer: %s", log);
        free(log);
    }
    pt_rank_status ranks[2];
    pt_coordinator_rank_statuses(c, ranks);
    cr_expect_eq(ranks[0].state, PT_RANK_REGISTERING, "a malformed view took rank 0");
    int fd = coord_dial(pt_coordinator_port(c));
    cr_assert(coord_register_raw_with(fd, SECRET, 0, 2,
                                      ", \"resume\": {\"epoch\": 0, \"left\": [], "
                                      "\"progress\": {\"step\": 7, \"total\": 9}}",
                                      &sent, answer, sizeof answer));
    cr_expect(strstr(answer, "welcome"), "a well-formed view got: %s", answer);
    pt_coordinator_rank_statuses(c, ranks);
    cr_expect_eq(ranks[0].step, 7, "the view's step is the rank's until it reports the next");
    pt_job_status status;
    pt_coordinator_status(c, &status);
    cr_expect_eq(status.phase, PT_JOB_RUNNING);
    cr_expect(pt_coordinator_recovering(c), "rebuilt before rank 1 was back");
    close(fd);
    pt_coordinator_free(c);
}

/* A registration recorded on the wire and sent again on a new connection is refused (its
 * proof answers another challenge), and it neither takes the rank nor aborts the job. */
Test(coordinator, replayed_registration_is_refused)
{
    pt_coordinator *c = start_coordinator(2, 0.2, 5.0);
    const int port = pt_coordinator_port(c);
    int fd = coord_dial(port);
    coord_transcript sent;
    char answer[512], replayed[512] = "", challenge[512] = "";
    cr_assert(coord_register_raw(fd, SECRET, 1, 2, &sent, answer, sizeof answer));
    cr_assert(strstr(answer, "welcome"), "%s", answer);
    capture cap;
    capture_begin(&cap);
    int replay = coord_dial(port);
    cr_assert(coord_write_line(replay, sent.hello));
    cr_expect(coord_read_line(replay, challenge, sizeof challenge, 10));
    cr_assert(coord_write_line(replay, sent.registration));
    coord_read_line(replay, replayed, sizeof replayed, 10);
    close(replay);
    char *log = capture_end(&cap);
    cr_expect(strstr(replayed, "refused") && strstr(replayed, "wrong job secret"),
              "a replayed registration got: %s", replayed);
    cr_expect(strstr(log, "its proof of the job's secret is wrong"), "not logged: %s", log);
    free(log);
    pt_job_status s;
    pt_coordinator_status(c, &s);
    cr_expect_eq(s.phase, PT_JOB_REGISTERING, "the replay changed the job");
    pt_coord_client *worker = join(port, 0, 2, NULL);
    const pt_peer_table *t;
    cr_expect_eq(pt_coord_client_wait_table(worker, 5, &t), PIPERT_OK, "%s", pipert_last_error());
    pt_coord_client_close(worker);
    close(fd);
    pt_coordinator_free(c);
}

/* A listening TCP socket on 127.0.0.1 at a port the kernel picks; its port in *port. */
static int listen_on_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof addr;
    cr_assert_eq(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    cr_assert_eq(listen(fd, 4), 0);
    getsockname(fd, (struct sockaddr *)&addr, &length);
    *port = ntohs(addr.sin_port);
    return fd;
}

/* A coordinator that does not know the secret: it hears the worker's hello and nothing more;
 * the secret is never among the bytes it receives. */
typedef struct impostor {
    int listen_fd, port;
    char received[8192];
    size_t length;
} impostor;

static void *impostor_serve(void *arg)
{
    impostor *im = arg;
    int fd = accept(im->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    char line[512];
    if (coord_read_line(fd, line, sizeof line, 10)) {
        im->length = (size_t)snprintf(im->received, sizeof im->received, "%s\n", line);
        uint8_t bytes[PT_AUTH_NONCE_BYTES];
        char nonce[PT_AUTH_HEX_CAPACITY], proof[PT_AUTH_HEX_CAPACITY], challenge[256];
        pt_auth_new_nonce(bytes);
        pt_auth_to_hex(bytes, sizeof bytes, nonce);
        pt_auth_new_nonce(bytes);
        pt_auth_to_hex(bytes, sizeof bytes, proof);
        snprintf(challenge, sizeof challenge,
                 "{\"type\": \"challenge\", \"nonce\": \"%s\", \"proof\": \"%s\"}\n", nonce, proof);
        coord_write_line(fd, challenge);
    }
    ssize_t n;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (im->length < sizeof im->received && poll(&p, 1, 2000) == 1 &&
           (n = read(fd, im->received + im->length, sizeof im->received - im->length)) > 0)
        im->length += (size_t)n; /* until the worker closes it */
    close(fd);
    return NULL;
}

Test(coordinator, impostor_coordinator_never_sees_the_secret)
{
    impostor im = {0};
    im.listen_fd = listen_on_loopback(&im.port);
    pthread_t thread;
    pthread_create(&thread, NULL, impostor_serve, &im);
    pt_coord_client *client = NULL;
    pipert_result rc = connect_client(&client, im.port, SECRET, 0, 1, "", 5.0, NULL);
    char error[1024];
    snprintf(error, sizeof error, "%s", pipert_last_error());
    pthread_join(thread, NULL);
    close(im.listen_fd);
    im.received[im.length < sizeof im.received ? im.length : sizeof im.received - 1] = '\0';
    cr_expect_eq(rc, PIPERT_ERR_AUTH, "an impostor coordinator got %s", pipert_result_str(rc));
    cr_expect_null(client);
    cr_expect(strstr(error, "did not prove"), "%s", error);
    cr_expect(strstr(im.received, "\"hello\""), "the impostor heard: %s", im.received);
    cr_expect_null(strstr(im.received, "register"), "a worker registered with an impostor: %s",
                   im.received);
    cr_expect_null(strstr(im.received, SECRET), "the secret went to the impostor: %s",
                   im.received);
    char secret_hex[2 * sizeof SECRET + 1];
    pt_auth_to_hex((const uint8_t *)SECRET, sizeof SECRET - 1, secret_hex);
    cr_expect_null(strstr(im.received, secret_hex), "the secret, in hex, went to the impostor");
}

/* After "welcome" every line is sealed: bytes written into a registered rank's connection
 * without the connection's key (here: the worker's own words, unsealed) are dropped and
 * logged, never acted upon; the rank is not failed and the job not aborted. */
Test(coordinator, unsealed_lines_after_registering_are_dropped)
{
    pt_coordinator *c = start_coordinator(2, 0.2, 5.0);
    int fd = coord_dial(pt_coordinator_port(c));
    coord_transcript sent;
    char answer[512];
    cr_assert(coord_register_raw(fd, SECRET, 1, 2, &sent, answer, sizeof answer));
    cr_assert(strstr(answer, "welcome"), "%s", answer);
    capture cap;
    capture_begin(&cap);
    cr_assert(coord_write_line(fd, "{\"type\": \"error\", \"reason\": \"forged\"}\n"));
    cr_assert(coord_write_line(fd, "0000000000000000000000000000000000000000000000000000000000000000 "
                                   "{\"type\": \"done\", \"seq\": 1}\n"));
    for (int i = 0; i < 20; i++) pt_coordinator_wait(c, 0.05);
    char *log = capture_end(&cap);
    char reason[512];
    cr_expect_not(pt_coordinator_rank_failure(c, 1, reason, sizeof reason),
                  "a forged error failed rank 1: %s", reason);
    pt_job_status s;
    pt_coordinator_status(c, &s);
    cr_expect_neq(s.phase, PT_JOB_ABORTED, "%s", s.abort_reason);
    cr_expect_eq(s.done, 0, "a forged done counted");
    cr_expect(strstr(log, "an unsealed line") && strstr(log, "a line whose MAC is wrong"),
              "the drops are logged: %s", log);
    free(log);
    close(fd);
    pt_coordinator_free(c);
}

/* A coordinator that knows the secret and registers the worker, then writes into its sealed
 * connection: an unsealed abort, an abort under a wrong MAC, a sealed heartbeat, and that
 * heartbeat's line again (a replay). The client must drop and count all but the heartbeat. */
typedef struct forging_coordinator {
    int listen_fd;
    bool registered;
} forging_coordinator;

static void *forging_coordinator_serve(void *arg)
{
    forging_coordinator *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    pt_auth_key key;
    pt_auth_derive_key(SECRET, PT_AUTH_USE_COORDINATOR, &key);
    char line[8192], nonce_hex[PT_AUTH_HEX_CAPACITY], proof_hex[PT_AUTH_HEX_CAPACITY];
    uint8_t worker_nonce[PT_AUTH_NONCE_BYTES], nonce[PT_AUTH_NONCE_BYTES],
        proof[PT_AUTH_PROOF_BYTES];
    json_t *hello = coord_read_line(fd, line, sizeof line, 10) ? json_loads(line, 0, NULL) : NULL;
    const char *theirs = json_string_value(json_object_get(hello, "nonce"));
    if (theirs && pt_auth_from_hex(theirs, worker_nonce, sizeof worker_nonce)) {
        pt_auth_new_nonce(nonce);
        pt_auth_prove(&key, &PT_COORD_PROVER, worker_nonce, nonce, proof);
        pt_auth_to_hex(nonce, sizeof nonce, nonce_hex);
        pt_auth_to_hex(proof, sizeof proof, proof_hex);
        snprintf(line, sizeof line,
                 "{\"type\": \"challenge\", \"nonce\": \"%s\", \"proof\": \"%s\"}\n",
                 nonce_hex, proof_hex);
        f->registered = coord_write_line(fd, line) && coord_read_line(fd, line, sizeof line, 10) &&
                        strstr(line, "register") && coord_write_line(fd, "{\"type\": \"welcome\"}\n");
    }
    json_decref(hello);
    if (f->registered) {
        /* sealed as coordinator_seal.c says, computed here: HMAC-SHA-256 of the JSON text under
         * the connection's key, the proof of "coordinator-session" over the two nonces */
        uint8_t session[PT_AUTH_PROOF_BYTES], mac[crypto_auth_hmacsha256_BYTES];
        pt_auth_prove(&key, &(pt_auth_party){"coordinator-session", -1, -1}, worker_nonce, nonce,
                      session);
        const char text[] = "{\"type\":\"heartbeat\",\"seq\":1}";
        crypto_auth_hmacsha256(mac, (const unsigned char *)text, strlen(text), session);
        char heartbeat[256], mac_hex[2 * sizeof mac + 1];
        sodium_bin2hex(mac_hex, sizeof mac_hex, mac, sizeof mac);
        snprintf(heartbeat, sizeof heartbeat, "%s %s\n", mac_hex, text);
        coord_write_line(fd, "{\"type\": \"abort\", \"rank\": -1, \"reason\": \"forged\"}\n");
        coord_write_line(fd, "00000000000000000000000000000000000000000000000000000000000000"
                             "00 {\"type\": \"abort\", \"rank\": -1, \"reason\": \"forged\", "
                             "\"seq\": 1}\n");
        coord_write_line(fd, heartbeat);
        coord_write_line(fd, heartbeat);
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 5000) == 1 && read(fd, line, sizeof line) > 0) {
    } /* until the worker closes it */
    close(fd);
    return NULL;
}

Test(coordinator, a_worker_drops_lines_its_coordinator_did_not_seal)
{
    int port;
    forging_coordinator f = {.listen_fd = listen_on_loopback(&port)};
    pthread_t thread;
    pthread_create(&thread, NULL, forging_coordinator_serve, &f);
    pt_coord_client *client = NULL;
    cr_assert_eq(connect_client(&client, port, SECRET, 0, 1, "", 30.0, NULL),
                 PIPERT_OK, "%s", pipert_last_error());
    char why[128] = "";
    long dropped = 0;
    for (int i = 0; i < 100 && (dropped = pt_coord_client_dropped_lines(client, why, sizeof why)) < 3;
         i++)
        usleep(20 * 1000);
    cr_expect_eq(dropped, 3, "dropped %ld lines (the last: %s)", dropped, why);
    cr_expect(strstr(why, "replayed"), "the last drop was the replay: %s", why);
    cr_expect_eq(pt_coord_client_check(client), PIPERT_OK, "a forged abort counted: %s",
                 pipert_last_error());
    pt_coord_client_close(client);
    pthread_join(thread, NULL);
    close(f.listen_fd);
    cr_expect(f.registered, "the worker did not register with a coordinator that knows the secret");
}

Test(coordinator, silent_rank_is_declared_dead)
{
    const double dead_after = 0.6;
    pt_coordinator *c = start_coordinator(2, 0.1, dead_after);
    const int port = pt_coordinator_port(c);
    int fd = coord_dial(port);
    cr_assert_geq(fd, 0);
    coord_transcript sent;
    char answer[512];
    cr_assert(coord_register_raw(fd, SECRET, 1, 2, &sent, answer, sizeof answer));
    cr_assert(strstr(answer, "welcome"), "%s", answer);
    const double registered_at = pt_now_s();

    pt_coord_client *alive = join(port, 0, 2, NULL);
    wait_for_abort(alive, 5);
    const double took = pt_now_s() - registered_at;
    cr_expect(took >= dead_after - 0.05, "declared dead after %.2f s, before %.2f s of silence",
              took, dead_after);
    cr_expect(took < dead_after + 2.0, "declared dead only after %.2f s", took);
    cr_expect_eq(pt_coord_client_check(alive), PIPERT_ERR_PEER);
    cr_expect(strstr(pipert_last_error(), "rank 1: sent nothing for"), "%s", pipert_last_error());
    char reason[512];
    cr_expect(pt_coordinator_rank_failure(c, 1, reason, sizeof reason));
    cr_expect_not(pt_coordinator_rank_failure(c, 0, reason, sizeof reason),
                  "the heartbeating rank was blamed: %s", reason);
    close(fd);
    pt_coord_client_close(alive);
    pt_coordinator_free(c);
}

Test(coordinator, worker_notices_a_dead_coordinator)
{
    pt_coordinator *c = start_coordinator(1, 0.1, 5.0);
    abort_record record = {0};
    pt_coord_client *client;
    cr_assert_eq(connect_client(&client, pt_coordinator_port(c), SECRET, 0, 1, "", 0.6, &record),
                 PIPERT_OK, "%s", pipert_last_error());
    const pt_peer_table *t;
    cr_assert_eq(pt_coord_client_wait_table(client, 5, &t), PIPERT_OK);
    pt_coordinator_free(c); /* every connection closes, as when its process dies */
    wait_for_abort(client, 2);
    cr_expect_eq(record.rank, -1);
    cr_expect(strstr(record.reason, "coordinator") && strstr(record.reason, "closed"), "%s",
              record.reason);
    cr_expect_eq(pt_coord_client_send_progress(client, &(pt_rank_progress){1, 2, 1, 1, NAN, NAN, NAN, NAN, 0}),
                 PIPERT_ERR_PEER, "progress after an abort must fail");
    pt_coord_client_close(client);
}

/* Waits up to timeout_s for the client to lose its coordinator; the seconds it took. */
static double wait_for_loss(pt_coord_client *client, double timeout_s)
{
    double start = pt_now_s();
    while (!pt_coord_client_coordinator_lost(client, NULL, 0) && pt_now_s() - start < timeout_s)
        usleep(10000);
    cr_assert(pt_coord_client_coordinator_lost(client, NULL, 0), "no loss within %.1f s", timeout_s);
    return pt_now_s() - start;
}

/* A client that outlives its coordinator (as under pipert launch), aborting grace_s after. */
static pt_coord_client *join_outliving(int port, double grace_s, abort_record *record)
{
    pt_coord_client_options o = PT_COORD_CLIENT_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.secret = SECRET;
    o.world = 1;
    o.connect_timeout_s = 5;
    o.heartbeat_interval_s = 0.1;
    o.dead_after_s = 0.6;
    o.outlive_coordinator = true;
    o.lost_grace_s = grace_s;
    o.on_abort = record_abort;
    o.on_abort_context = record;
    pt_coord_client *client;
    cr_assert_eq(pt_coord_client_connect(&client, &o), PIPERT_OK, "%s", pipert_last_error());
    const pt_peer_table *t;
    cr_assert_eq(pt_coord_client_wait_table(client, 5, &t), PIPERT_OK);
    return client;
}

/* With outlive_coordinator a dead coordinator is lost, not an abort: the workers may
 * finish without it (session/coordinator_loss.c), and what they would tell it is not sent. */
Test(coordinator, outliving_worker_notices_a_lost_coordinator)
{
    pt_coordinator *c = start_coordinator(1, 0.1, 5.0);
    abort_record record = {0};
    pt_coord_client *client = join_outliving(pt_coordinator_port(c), 60, &record);
    pt_coordinator_free(c); /* every connection closes, as when its process dies */
    wait_for_loss(client, 2);
    char why[512];
    cr_expect(pt_coord_client_coordinator_lost(client, why, sizeof why));
    cr_expect(strstr(why, "the coordinator at 127.0.0.1:") &&
                  (strstr(why, "closed the connection") || strstr(why, "lost the connection")),
              "%s", why);
    usleep(300000);
    cr_expect_not(pt_coord_client_aborted(client), "a lost coordinator aborted the job");
    cr_expect_eq(atomic_load(&record.calls), 0);
    cr_expect_eq(pt_coord_client_check(client), PIPERT_OK);
    cr_expect_eq(pt_coord_client_send_progress(client, &(pt_rank_progress){1, 2, 1, 1, NAN, NAN, NAN, NAN, 0}),
                 PIPERT_OK, "progress after the loss is not sent, and not an error");
    cr_expect_eq(pt_coord_client_send_done(client), PIPERT_OK);
    pt_coord_client_close(client);
}

/* The safety net: a worker still running lost_grace_s after the loss is told the job
 * aborted, so that it never lingers. */
Test(coordinator, a_lost_coordinator_aborts_the_job_after_the_grace)
{
    pt_coordinator *c = start_coordinator(1, 0.1, 5.0);
    abort_record record = {0};
    pt_coord_client *client = join_outliving(pt_coordinator_port(c), 0.5, &record);
    pt_coordinator_free(c);
    wait_for_loss(client, 2);
    double took = wait_for_abort(client, 3);
    cr_expect(took > 0.3, "aborted %.2f s after the loss (grace 0.5 s)", took);
    cr_expect_eq(record.rank, -1);
    cr_expect_eq(pt_coord_client_check(client), PIPERT_ERR_PEER);
    cr_expect(strstr(pipert_last_error(), "the coordinator has been gone for"), "%s",
              pipert_last_error());
    pt_coord_client_close(client);
}

/* A coordinator whose process hangs: its socket stays open, but no heartbeat comes. */
typedef struct poller {
    pt_coordinator *c;
    atomic_bool stop;
} poller;

static void *poll_until_stopped(void *arg)
{
    poller *p = arg;
    while (!atomic_load(&p->stop)) pt_coordinator_poll(p->c, 20);
    return NULL;
}

/* A client of a job of 2 stages × 2 replicas that registers again when its connection closes
 * (as under a standalone coordinator); join: a replacement for a rank whose replica left. */
static pt_coord_client_options elastic_options(int port, int rank, bool join)
{
    pt_coord_client_options o = PT_COORD_CLIENT_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.secret = SECRET;
    o.rank = rank;
    o.world = 4;
    o.stages = 2;
    o.address = join ? "address-of-the-replacement" : "address-of-the-first";
    o.connect_timeout_s = 5;
    o.heartbeat_interval_s = 0.1;
    o.dead_after_s = 5;
    o.reconnect_s = 5;
    o.join = join;
    return o;
}

static pt_coord_client *elastic_client(int port, int rank, bool join, abort_record *record)
{
    pt_coord_client_options o = elastic_options(port, rank, join);
    o.on_abort = record_abort;
    o.on_abort_context = record;
    pt_coord_client *client;
    cr_assert_eq(pt_coord_client_connect(&client, &o), PIPERT_OK, "rank %d: %s", rank,
                 pipert_last_error());
    return client;
}

/* A running elastic job of 2 stages × 2 replicas (min 1), its 4 ranks registered. */
static pt_coordinator *elastic_job(pt_coord_client *ranks[4], abort_record records[4])
{
    pt_coordinator_options o = PT_COORDINATOR_OPTIONS_INIT;
    o.bind_host = "127.0.0.1";
    o.world = 4;
    o.secret = SECRET;
    o.heartbeat_interval_s = 0.1;
    o.dead_after_s = 5;
    o.stages = 2;
    o.min_replicas = 1;
    pt_coordinator *c;
    cr_assert_eq(pt_coordinator_create(&c, &o), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_coordinator_start(c), PIPERT_OK, "%s", pipert_last_error());
    for (int r = 0; r < 4; r++)
        ranks[r] = elastic_client(pt_coordinator_port(c), r, false, &records[r]);
    const pt_peer_table *t;
    for (int r = 0; r < 4; r++) cr_assert_eq(pt_coord_client_wait_table(ranks[r], 5, &t), PIPERT_OK);
    return c;
}

/* Replica 0 left; a replacement registers for rank 0, which drops the old process's
 * connection, and the old process, still alive and not yet aware that its replica left,
 * registers again with its view of the job (spoken by hand here). It hears that its replica
 * left and is let go, and rank 0 stays the replacement's: the old process once took the rank
 * back and cut the replacement off, whose partner then waited for it to the end of the job
 * (CI, session 24: 1 in 4 runs of the standalone-coordinator tests under load). */
Test(coordinator, an_old_process_registering_again_leaves_its_rank_to_the_replacement)
{
    abort_record records[5] = {0};
    pt_coord_client *ranks[4];
    pt_coordinator *c = elastic_job(ranks, records);
    const int port = pt_coordinator_port(c);
    pt_coordinator_rank_failed(c, 1, "killed");
    pt_coord_client *replacement = elastic_client(port, 0, true, &records[4]);

    const int old = coord_dial(port);
    cr_assert_geq(old, 0);
    coord_transcript sent;
    char answer[1024];
    cr_assert(coord_register_raw_with(old, SECRET, 0, 4, ", \"resume\": {\"epoch\": 0, "
                                      "\"departures\": 0, \"joins\": 0, \"left\": [], \"in\": []}",
                                      &sent, answer, sizeof answer));
    cr_expect(strstr(answer, "welcome"), "%s", answer);
    /* it hears of the departure, then the coordinator closes its connection */
    bool closed = false;
    char byte;
    for (int i = 0; i < 200 && !closed; i++) {
        struct pollfd p = {.fd = old, .events = POLLIN};
        closed = poll(&p, 1, 10) == 1 && read(old, &byte, 1) == 0; /* its lines, then EOF */
    }
    cr_expect(closed, "the old process's connection was kept");
    close(old);
    usleep(300000);
    cr_expect_not(pt_coord_client_aborted(replacement), "the replacement was cut off: %s",
                  records[4].reason);
    pt_rank_status statuses[4];
    pt_coordinator_rank_statuses(c, statuses);
    cr_expect_eq(statuses[0].state, PT_RANK_JOINING, "rank 0 is no longer the replacement's");
    pt_coord_client_close(replacement);
    for (int r = 0; r < 4; r++) pt_coord_client_close(ranks[r]);
    pt_coordinator_free(c);
}

typedef struct early_joiner {
    int port;
    pipert_result rc;
    double took_s;
    pt_coord_client *client;
    char error[512];
} early_joiner;

static void *join_early(void *arg)
{
    early_joiner *j = arg;
    pt_coord_client_options o = elastic_options(j->port, 0, true);
    o.dead_after_s = 2; /* it tries again for 6 s */
    const double started = pt_now_s();
    j->rc = pt_coord_client_connect(&j->client, &o);
    j->took_s = pt_now_s() - started;
    snprintf(j->error, sizeof j->error, "%s", pipert_last_error());
    return NULL;
}

/* A replacement started right after its old process was killed may register before the
 * coordinator noticed the death: "its replica is in the job" holds only for now, and it
 * tries again until it is let in (here 0.5 s later), within twice the heartbeat timeout. */
Test(coordinator, a_replacement_that_comes_before_the_departure_is_noticed_gets_in)
{
    abort_record records[4] = {0};
    pt_coord_client *ranks[4];
    pt_coordinator *c = elastic_job(ranks, records);
    early_joiner j = {.port = pt_coordinator_port(c)};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, join_early, &j), 0);
    usleep(500000);
    pt_coordinator_rank_failed(c, 1, "killed");
    pthread_join(thread, NULL);
    cr_expect_eq(j.rc, PIPERT_OK, "%s", j.error);
    cr_expect(j.took_s > 0.4 && j.took_s < 4, "registered after %.2f s", j.took_s);
    pt_rank_status statuses[4];
    pt_coordinator_rank_statuses(c, statuses);
    cr_expect_eq(statuses[0].state, PT_RANK_JOINING);
    if (j.client) pt_coord_client_close(j.client);
    for (int r = 0; r < 4; r++) pt_coord_client_close(ranks[r]);
    pt_coordinator_free(c);
}

Test(coordinator, worker_notices_a_silent_coordinator)
{
    pt_coordinator_options o = PT_COORDINATOR_OPTIONS_INIT;
    o.bind_host = "127.0.0.1";
    o.world = 1;
    o.secret = SECRET;
    o.heartbeat_interval_s = 0.1;
    poller p = {0};
    cr_assert_eq(pt_coordinator_create(&p.c, &o), PIPERT_OK, "%s", pipert_last_error());
    pthread_t thread;
    pthread_create(&thread, NULL, poll_until_stopped, &p);
    pt_coord_client *client;
    cr_assert_eq(connect_client(&client, pt_coordinator_port(p.c), SECRET, 0, 1, "", 0.6, NULL),
                 PIPERT_OK, "%s", pipert_last_error());
    const pt_peer_table *t;
    cr_assert_eq(pt_coord_client_wait_table(client, 5, &t), PIPERT_OK);
    usleep(300000);
    cr_expect_not(pt_coord_client_aborted(client), "aborted while the coordinator was serving");
    atomic_store(&p.stop, true);
    pthread_join(thread, NULL);
    double took = wait_for_abort(client, 3);
    cr_expect(took > 0.3, "aborted %.2f s after the coordinator fell silent", took);
    cr_expect_eq(pt_coord_client_check(client), PIPERT_ERR_PEER);
    cr_expect(strstr(pipert_last_error(), "no word from the coordinator"), "%s", pipert_last_error());
    pt_coord_client_close(client);
    pt_coordinator_free(p.c);
}

/* ============================================================================
 * pipert launch and pipert worker, as real processes
 * ========================================================================== */

/* A model that trains in about a millisecond a step. */
#define SMALL_MODEL                                                                                \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2"

static char *read_text(const char *dir, const char *name)
{
    char path[512], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    return text;
}

static bool exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* The worker pids listed in DIR/workers.pid ("RANK PID" lines). */
static int read_worker_pids(const char *dir, pid_t *pids, int capacity)
{
    char *text = read_text(dir, "workers.pid");
    int n = 0, rank, pid, used;
    for (const char *p = text; n < capacity && sscanf(p, "%d %d\n%n", &rank, &pid, &used) == 2; p += used)
        pids[n++] = pid;
    free(text);
    return n;
}

static bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

Test(launch, one_replica_trains_to_the_end)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert("launch --stages 1 --replicas 1 --out %s " SMALL_MODEL
                                  " --train.steps=6 --train.log_every=1",
                              dir);
    cr_assert_eq(r.status, 0, "launch failed (%d): %s", r.status, r.err);
    char *log = read_text(dir, "logs/rank-0.log");
    cr_expect(strstr(log, "rank 0 done: 6 steps"), "rank-0.log: %s", log);
    free(log);
    char *metrics = read_text(dir, "metrics.jsonl");
    int losses = 0;
    for (const char *p = metrics; (p = strstr(p, "\"loss\"")); p++) losses++;
    cr_expect_eq(losses, 6, "metrics.jsonl holds %d loss lines, expected 6:\n%s", losses, metrics);
    free(metrics);
    cr_expect(exists(dir, "ckpt-00000006.json") && exists(dir, "ckpt-00000006-stage-0.safetensors"),
              "no final checkpoint");
    cr_expect_not(exists(dir, "job.secret"), "the secret file outlived the job");
    pid_t pids[4];
    cr_assert_eq(read_worker_pids(dir, pids, 4), 1);
    cr_expect_not(process_exists(pids[0]), "worker %d still exists", (int)pids[0]);
    remove_dir(dir);
}

/* TEST HOOK of cmd_worker.c: PIPERT_TEST_DIE_AT_STEP / PIPERT_TEST_DIE_RANK. */
Test(launch, worker_killed_mid_run_is_named)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert_with("PIPERT_TEST_DIE_AT_STEP=40 PIPERT_TEST_DIE_RANK=0",
                              "launch --replicas 1 --out %s " SMALL_MODEL
                              " --train.steps=1000000 --train.log_every=10",
                              dir);
    cr_expect_eq(r.status, 1, "exit status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "rank 0 (stage 0, replica 0) failed: killed by signal 9 (SIGKILL)"),
              "stderr: %s", r.err);
    cr_expect(strstr(r.err, "logs/rank-0.log"), "the message does not point at the log: %s", r.err);
    /* Startup plus 40 steps of about a millisecond (30 s leaves room for a
     * loaded machine); a launcher that missed
     * the death would run a million steps. */
    cr_expect_lt(r.seconds, 30.0, "the launcher took %.1f s to notice", r.seconds);
    remove_dir(dir);
}

/* Two replicas averaging gradients over UCX, rank 1 killed at step 3: rank 0
 * fails in the all-reduce (peer error) or on the job's abort, and the launcher
 * names rank 1 either way, within 30 s (a hang would take minutes; the
 * bound leaves room for a loaded machine). */
Test(launch, killed_replica_is_named)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert_with("PIPERT_TEST_DIE_AT_STEP=3",
                              "launch --stages 1 --replicas 2 --out %s " SMALL_MODEL
                              " --train.steps=1000000",
                              dir);
    cr_expect_eq(r.status, 1, "exit status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "rank 1 (stage 0, replica 1) failed: killed by signal 9 (SIGKILL)"),
              "stderr: %s", r.err);
    cr_expect_lt(r.seconds, 30.0, "the launcher took %.1f s", r.seconds);
    char *log = read_text(dir, "logs/rank-1.log");
    cr_expect(strstr(log, "raises SIGKILL at step 3"), "rank-1.log: %s", log);
    free(log);
    remove_dir(dir);
}

/* A stopped worker keeps its socket open: only the missing heartbeats (5 s)
 * tell. --grace 1 then SIGTERM (not handled while stopped), 1 s, SIGKILL. */
Test(launch, stopped_worker_is_declared_dead)
{
    char *dir = make_temp_dir(), command[4096], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/launcher.err", dir);
    snprintf(command, sizeof command,
             "%s launch --grace 1 --replicas 1 --out %s " SMALL_MODEL
             " --train.steps=1000000 --train.log_every=1 >/dev/null 2>%s & "
             "launcher=$!; "
             /* stopped once it trains (registered, heartbeating): stopped before it registers, a
              * slow (sanitized, loaded) worker is caught by the 300 s registration timeout instead */
             "for i in $(seq 1200); do [ -s %s/metrics.jsonl ] && break; "
             "kill -0 $launcher 2>/dev/null || break; sleep 0.1; done; "
             "kill -STOP $(cut -d' ' -f2 %s/workers.pid); date +%%s.%%N > %s/stopped_at; "
             "wait $launcher",
             pipert_bin(), dir, err_path, dir, dir, dir);
    int raw = system(command);
    double finished = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    finished = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
    char *stopped = read_text(dir, "stopped_at");
    double took = finished - atof(stopped);
    free(stopped);
    char *err = read_text(dir, "launcher.err");
    cr_expect(WIFEXITED(raw) && WEXITSTATUS(raw) == 1, "exit status %d: %s", WEXITSTATUS(raw), err);
    cr_expect(strstr(err, "rank 0 (stage 0, replica 0) failed: sent nothing for"), "stderr: %s", err);
    cr_expect(strstr(err, "stopped by the launcher with SIGKILL"), "stderr: %s", err);
    /* 5 s of silence, then 1 s + 1 s of grace. */
    cr_expect_lt(took, 10.0, "the job ended %.1f s after the worker stopped", took);
    cr_expect_gt(took, 4.0, "the job ended %.1f s after the worker stopped: before 5 s of silence",
                 took);
    free(err);
    remove_dir(dir);
}

Test(launch, sigterm_leaves_no_worker_behind)
{
    char *dir = make_temp_dir(), out_flag[512], err_path[512];
    snprintf(out_flag, sizeof out_flag, "%s", dir);
    snprintf(err_path, sizeof err_path, "%s/launcher.err", dir);
    const char *bin = pipert_bin();
    pid_t launcher = fork();
    cr_assert_geq(launcher, 0);
    if (launcher == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test does not leave a job running */
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        dup2(err, STDERR_FILENO);
        execl(bin, "pipert", "launch", "--replicas", "1", "--out", out_flag,
              "--model.n_layer=2", "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
              "--train.batch_size=4", "--train.warmup_steps=1", "--train.val_every=0",
              "--train.steps=1000000", "--train.log_every=20", (char *)NULL);
        _exit(127);
    }
    /* Wait until the worker trains (its log shows a step). */
    bool training = false;
    for (int i = 0; i < 300 && !training; i++) {
        usleep(100000);
        char path[600], *text;
        size_t size;
        snprintf(path, sizeof path, "%s/logs/rank-0.log", dir);
        if (pt_read_file(path, &text, &size) == PIPERT_OK) {
            training = strstr(text, "step 20/") != NULL;
            free(text);
        }
    }
    cr_assert(training, "the worker did not start training within 30 s");
    pid_t pids[4];
    int n = read_worker_pids(dir, pids, 4);
    cr_assert_eq(n, 1);
    cr_assert(process_exists(pids[0]), "worker %d gone before SIGTERM", (int)pids[0]);

    kill(launcher, SIGTERM);
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 200 && done == 0; i++) { /* 2 × 5 s of grace at most, then SIGKILL */
        usleep(100000);
        done = waitpid(launcher, &status, WNOHANG);
    }
    if (done == 0) {
        kill(launcher, SIGKILL);
        waitpid(launcher, &status, 0);
        cr_assert_fail("the launcher did not exit within 20 s of SIGTERM");
    }
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM,
              "launcher exit status %d (expected %d)", WEXITSTATUS(status), 128 + SIGTERM);
    cr_expect_not(process_exists(pids[0]), "worker %d survived the launcher", (int)pids[0]);
    char *err = read_text(dir, "launcher.err");
    cr_expect(strstr(err, "stopped by SIGTERM; every worker has exited"), "stderr: %s", err);
    free(err);
    remove_dir(dir);
}

/* ---- requests that cannot be served yet, and bad input ---------------------------- */

/* The "loss" of each step in DIR/metrics.jsonl, steps 1..n. */
static void read_step_losses(const char *dir, double *losses, int n)
{
    char *text = read_text(dir, "metrics.jsonl");
    int found = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        long step;
        double loss;
        if (sscanf(line, "{\"step\":%ld,\"loss\":%lf", &step, &loss) == 2 && step >= 1 && step <= n) {
            losses[step - 1] = loss;
            found++;
        }
    }
    free(text);
    cr_assert_eq(found, n, "%s/metrics.jsonl: %d of %d steps", dir, found, n);
}

/* Dense synchronous data parallelism (ALGORITHMS.md §4.1), the baseline every
 * later method is measured against: R replicas with batch B each, averaging
 * their gradients every step over UCX, give the losses of one worker with
 * batch R·B, within 1e-5 relative, for 20 steps. Spread over sites, the ring
 * is ordered by site and the result is the same. */
static void check_replicas_equal_one_large_batch(int R, int sites)
{
    char *single = make_temp_dir(), *replicas = make_temp_dir();
    enum { STEPS = 20, B = 2 };
    run_result r = run_pipert("train --quiet --out %s " SMALL_MODEL " --train.batch_size=%d "
                                  "--train.steps=%d --train.log_every=1 --runtime.threads=1",
                              single, R * B, STEPS);
    cr_assert_eq(r.status, 0, "single worker failed: %s", r.err);
    r = run_pipert("launch --quiet --stages 1 --replicas %d --sites %d --out %s " SMALL_MODEL
                       " --train.batch_size=%d --train.steps=%d --train.log_every=1",
                   R, sites, replicas, B, STEPS);
    cr_assert_eq(r.status, 0, "%d replicas failed: %s", R, r.err);
    double expected[STEPS], got[STEPS];
    read_step_losses(single, expected, STEPS);
    read_step_losses(replicas, got, STEPS);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-5 * fabs(expected[i]),
                  "R=%d step %d: replicas %.9g, one worker with batch %d: %.9g", R, i + 1, got[i],
                  R * B, expected[i]);
    cr_expect_lt(got[STEPS - 1], got[0], "the loss did not fall");
    remove_dir(single);
    remove_dir(replicas);
}

Test(launch, two_replicas_equal_one_worker_with_twice_the_batch)
{
    check_replicas_equal_one_large_batch(2, 1);
}

Test(launch, three_replicas_equal_one_worker_with_three_times_the_batch)
{
    check_replicas_equal_one_large_batch(3, 1);
}

Test(launch, three_replicas_in_two_sites_equal_one_worker)
{
    check_replicas_equal_one_large_batch(3, 2);
}

/* An uneven explicit split is refused before any worker trains. */
Test(launch, a_split_that_drops_blocks_is_refused)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert("launch --stages 2 --replicas 1 --out %s " SMALL_MODEL
                                  " --plan.layers=1,0 --train.steps=3", dir);
    cr_expect_neq(r.status, 0);
    cr_expect(strstr(r.err, "plan.layers=1,0"), "stderr: %s", r.err);
    remove_dir(dir);
}

Test(launch, bad_configuration_fails_before_any_worker)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert("launch --replicas 2 --out %s --model.n_layer=0", dir);
    cr_expect_eq(r.status, 1, "exit status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "model.n_layer"), "stderr: %s", r.err);
    cr_expect_not(exists(dir, "logs"), "workers were started for a bad configuration");
    remove_dir(dir);
}

Test(launch, worker_without_a_launcher)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert_with("env -u PIPERT_RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK -u PMI_RANK",
                              "worker --out %s " SMALL_MODEL, dir);
    cr_expect_eq(r.status, 1, "exit status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "no launcher found"), "stderr: %s", r.err);
    remove_dir(dir);
}

/* runtime.authenticate_messages: every message signed and checked, the training the same. */
Test(launch, authenticated_messages_train_the_same)
{
    char *plain = make_temp_dir(), *signed_dir = make_temp_dir();
    const char *job = "launch --quiet --stages 2 --replicas 2 --out %s " SMALL_MODEL
                      " --train.steps=5 --train.log_every=1 --runtime.threads=1 "
                      "--pipeline.schedule=1f1b%s";
    run_pipert_ok(job, plain, "");
    run_pipert_ok(job, signed_dir, " --runtime.authenticate_messages=true");
    double a[5] = {0}, b[5] = {0};
    cr_assert_eq(read_metric_steps(plain, "metrics.jsonl", "loss", a, 5), 5);
    cr_assert_eq(read_metric_steps(signed_dir, "metrics.jsonl", "loss", b, 5), 5);
    for (int s = 0; s < 5; s++)
        cr_expect_eq(a[s], b[s], "step %d: %.9g plain, %.9g authenticated", s + 1, a[s], b[s]);
    remove_dir(plain);
    remove_dir(signed_dir);
}

/* dp.method=none: replica 0 trains exactly as the same job with one replica
 * (it draws the first share of each step's batch either way, and nothing
 * reaches it from replica 1). One compute thread in both: a lone worker would
 * take every core, and some BLAS kernels (AMD EPYC's) sum in another order on
 * more threads. */
Test(launch, uncoupled_replicas_train_like_one_alone)
{
    char *alone = make_temp_dir(), *pair = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 1 --out %s " SMALL_MODEL
                  " --train.steps=5 --train.log_every=1 --runtime.threads=1", alone);
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s --dp.method=none " SMALL_MODEL
                  " --train.steps=5 --train.log_every=1 --runtime.threads=1", pair);
    double a[5] = {0}, b[5] = {0}, bytes[5] = {0};
    cr_assert_eq(read_metric_steps(alone, "metrics.jsonl", "loss", a, 5), 5);
    cr_assert_eq(read_metric_steps(pair, "metrics.jsonl", "loss", b, 5), 5);
    cr_assert_eq(read_metric_steps(pair, "metrics-stage-0.jsonl", "dp_bytes", bytes, 5), 5);
    for (int s = 0; s < 5; s++) {
        cr_expect_eq(a[s], b[s], "step %d: alone %.9g, uncoupled replica 0 %.9g", s + 1, a[s], b[s]);
        cr_expect_eq(bytes[s], 0, "step %d: none sent %g bytes", s + 1, bytes[s]);
    }
    remove_dir(alone);
    remove_dir(pair);
}

/* A compression the method cannot use is refused at start, naming both. */
Test(launch, method_and_compression_mismatch_is_refused)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert("launch --quiet --stages 1 --replicas 2 --out %s --dp.method=allreduce "
                              "--dp.compress=e3m0 " SMALL_MODEL " --train.steps=2", dir);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "dp.method=allreduce with dp.compress=e3m0"), "%s", r.err);
    r = run_pipert("launch --quiet --stages 1 --replicas 2 --out %s --dp.method=none "
                   "--dp.compress=int8 " SMALL_MODEL " --train.steps=2", dir);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "dp.method=none with dp.compress=int8"), "%s", r.err);
    remove_dir(dir);
}

/* ---- utilisation and bytes per link class (pipeline/utilisation.h) ------- */

/* Every logged step of DIR/metrics-stage-S.jsonl: its value of `field`. */
static int stage_values(const char *dir, int stage, const char *field, double *values, int n)
{
    char file[64];
    snprintf(file, sizeof file, "metrics-stage-%d.jsonl", stage);
    return read_metric_steps(dir, file, field, values, n);
}

/* With sites: exactly what the coupling sent (the gradients' ring and the
 * loss's mean, payload bytes) crossed between them; inside one site nothing did.
 * The transport counts; dp_bytes is the coupling's own account. */
Test(launch, bytes_between_sites_are_the_couplings)
{
    enum { N = 4 };
    const char *sites[] = {"2", "1"};
    for (int k = 0; k < 2; k++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 1 --replicas 2 --sites %s --out %s " SMALL_MODEL
                      " --train.steps=%d --train.log_every=1", sites[k], dir, N);
        double dp[N], wan[N], site[N];
        cr_assert_eq(stage_values(dir, 0, "dp_bytes", dp, N), N);
        cr_assert_eq(stage_values(dir, 0, "bytes_wan", wan, N), N);
        cr_assert_eq(stage_values(dir, 0, "bytes_site", site, N), N);
        for (int s = 0; s < N; s++) {
            const double crossing = k == 0 ? wan[s] : site[s], other = k == 0 ? site[s] : wan[s];
            cr_expect(crossing == dp[s] && dp[s] > 0,
                      "sites %s, step %d: %g bytes sent to the other replica, the coupling says %g",
                      sites[k], s + 1, crossing, dp[s]);
            cr_expect_eq(other, 0, "sites %s, step %d: %g bytes on the other link class", sites[k],
                         s + 1, other);
        }
        remove_dir(dir);
    }
}

/* A 2-stage pipeline: each share in [0, 1], together at most 1; the last
 * stage waits for the first stage's activations. */
Test(launch, utilisation_shares_add_up)
{
    enum { N = 6 };
    char *dir = make_temp_dir();
    /* steps of milliseconds, not microseconds: a share of a step that short is
     * mostly the noise of the machine's other work */
    run_pipert_ok("launch --quiet --stages 2 --replicas 1 --out %s --model.n_layer=2 "
                  "--model.n_embd=128 --model.n_head=2 --model.block_size=64 --train.batch_size=4 "
                  "--runtime.threads=1 --train.val_every=0 --train.steps=%d --train.log_every=1",
                  dir, N);
    for (int stage = 0; stage < 2; stage++) {
        double compute[N], pipeline[N], coupling[N];
        cr_assert_eq(stage_values(dir, stage, "util_compute", compute, N), N);
        cr_assert_eq(stage_values(dir, stage, "util_wait_pipeline", pipeline, N), N);
        cr_assert_eq(stage_values(dir, stage, "util_wait_coupling", coupling, N), N);
        double waited = 0, coupled = 0;
        for (int s = 0; s < N; s++) {
            cr_expect(compute[s] > 0 && compute[s] <= 1, "stage %d step %d: compute %g", stage,
                      s + 1, compute[s]);
            cr_expect(compute[s] + pipeline[s] + coupling[s] <= 1 + 1e-6,
                      "stage %d step %d: %g + %g + %g > 1", stage, s + 1, compute[s], pipeline[s],
                      coupling[s]);
            waited += pipeline[s];
            coupled += coupling[s];
        }
        /* (a mean: a call of microseconds may still be preempted on a busy machine) */
        cr_expect_lt(coupled / N, 0.05, "stage %d, one replica: %.0f%% of the time in the coupling",
                     stage, 100 * coupled / N);
        if (stage == 1) cr_expect_gt(waited, 0, "the last stage never waited for activations");
    }
    remove_dir(dir);
}

/* The trace shows the coupling: its calls ("couple") and the exchanges that
 * run in the background ("exchange", one per step for sparse). */
Test(launch, coupling_transfers_are_trace_spans)
{
    enum { N = 6 };
    char *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s --dp.method=sparse --dp.delay=2 "
                  SMALL_MODEL " --train.steps=%d", dir, N);
    char *trace = read_text(dir, "trace.json");
    int exchanges = 0, couples = 0;
    for (const char *p = trace; (p = strstr(p, "\"name\":\"exchange\"")); p++) exchanges++;
    for (const char *p = trace; (p = strstr(p, "\"name\":\"couple\"")); p++) couples++;
    cr_expect_eq(exchanges, 2 * N, "%d exchange spans, expected one per step on each of 2 ranks",
                 exchanges);
    cr_expect_eq(couples, 2 * 2 * N, "%d couple spans, expected two calls per step on 2 ranks",
                 couples);
    free(trace);
    remove_dir(dir);
}

/* Inside a couple span, the time blocked on the replicas is a "coupling wait"
 * span: the all-reduce blocks twice a step (the gradients, the loss), sparse's
 * exchanges of a delay of 2 steps on loopback are never late enough. */
Test(launch, coupling_waits_are_trace_spans)
{
    enum { N = 5 };
    const char *methods[] = {"allreduce", "none"};
    const int expected[] = {2 * 2 * N, 0};
    for (int k = 0; k < 2; k++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s --dp.method=%s "
                      SMALL_MODEL " --train.steps=%d", dir, methods[k], N);
        char *trace = read_text(dir, "trace.json");
        int waits = 0;
        for (const char *p = trace; (p = strstr(p, "\"name\":\"coupling wait\"")); p++) waits++;
        cr_expect_eq(waits, expected[k], "%s: %d coupling wait spans, expected %d", methods[k],
                     waits, expected[k]);
        free(trace);
        remove_dir(dir);
    }
}

/* ---- launch --plan ------------------------------------------------------------ */

/* A plan without a cluster: its stages, split and configuration run, the
 * command line still overrides its configuration, and the flags it replaces
 * are refused beside it. */
Test(launch, a_plan_says_the_stages_split_and_configuration)
{
    char *dir = make_temp_dir(), plan[300], run[300];
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(run, sizeof run, "%s/run", dir);
    const char *text =
        "{\"format\": \"pipert-plan-1\", \"stages\": 2, \"replicas\": 2, \"layers\": \"2,1\","
        " \"placement\": [[{\"site\": \"here\"}, {\"site\": \"here\"}], [{\"site\": \"here\"},"
        " {\"site\": \"here\"}]],"
        " \"config\": {\"model\": {\"n_layer\": 3, \"n_embd\": 32, \"n_head\": 2, \"block_size\": 32},"
        " \"train\": {\"batch_size\": 4, \"steps\": 9, \"val_batches\": 2}}}";
    cr_assert_eq(pt_write_file_atomic(plan, text, strlen(text)), PIPERT_OK);
    run_pipert_ok_info("launch --quiet --plan %s --out %s --train.steps=3 --train.log_every=1", plan,
                       run);
    char *log = read_text(run, "logs/rank-3.log");
    cr_expect(strstr(log, "stage 1/2 (blocks [2, 3)"), "rank 3 does not run blocks [2, 3): %s", log);
    free(log);
    double loss[8];
    cr_expect_eq(read_metric_steps(run, "metrics.jsonl", "loss", loss, 8), 3,
                 "the command line's train.steps=3 did not override the plan's 9");
    run_result r = run_pipert("launch --quiet --plan %s --stages 2 --out %s", plan, run);
    cr_expect_eq(r.status, 2, "--stages beside --plan: exit %d", r.status);
    cr_expect(strstr(r.err, "--stages") && strstr(r.err, "plan"), "%s", r.err);
    remove_dir(dir);
}
