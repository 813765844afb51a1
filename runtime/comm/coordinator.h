/* The job's coordinator and the worker's side of it: rendezvous, membership,
 * heartbeats, job-wide abort, and progress aggregation. It is on the control
 * path only — tensors never pass through it — and speaks plain TCP.
 *
 * Where it runs: in `pipert launch` (one machine), or in rank 0's process
 * under SLURM and MPI (runtime/comm/bootstrap.h says which).
 *
 * Protocol: one JSON object per line ('\n'-terminated), each with a "type".
 *   worker → coordinator
 *     register  {rank, world, host, pid, address, secret}   must come first
 *     heartbeat {}                                           every interval
 *     progress  {step, total, loss, tokens_per_s[, val_loss]}
 *     done      {}            the worker finished; its connection may close
 *     error     {reason}      the worker failed; the job aborts
 *   coordinator → worker
 *     welcome   {}            registration accepted
 *     refused   {reason, auth}  registration refused (auth: a wrong secret);
 *                             the connection closes
 *     table     {world, peers: [{rank, host, pid, address}, ...]}
 *                             once every rank has registered
 *     heartbeat {}            every interval, so a worker notices a dead
 *                             coordinator even when its host vanishes
 *     abort     {rank, reason}  rank -1: not one rank's fault
 *     finished  {}            every rank is done
 *
 * Failure detection. A registered rank is declared dead, and the job aborted,
 * when it sends nothing (heartbeats included) for dead_after_s, when its
 * connection closes before it said "done", or when it reports an error. Every
 * rank is told {rank, reason}, once. A worker treats a closed or silent
 * coordinator connection as an abort too. A connection that does not present
 * the job's secret is refused and logged (pt_warn, naming the peer address);
 * it does not abort the job.
 *
 * The secret travels in clear text: it keeps other jobs and stray clients
 * out, not an eavesdropper on the network.
 */
#ifndef PT_COORDINATOR_H
#define PT_COORDINATOR_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/comm/bootstrap.h"
#include "runtime/error.h"

#define PT_HEARTBEAT_INTERVAL_S 1.0
#define PT_DEAD_AFTER_S 5.0
#define PT_REGISTER_TIMEOUT_S 300.0 /* every rank must have registered by then */
#define PT_CONNECT_TIMEOUT_S 120.0  /* a worker retries connecting this long */
#define PT_ADDRESS_MAX 16384        /* longest data-plane address, in characters */

/* ---- coordinator (server) -------------------------------------------------- */

typedef struct pt_coordinator pt_coordinator;

typedef struct pt_coordinator_options {
    const char *bind_host;       /* NULL: every interface; "127.0.0.1": this host only */
    int port;                    /* 0: any free port (pt_coordinator_port says which) */
    int world;                   /* ranks in the job */
    const char *secret;          /* what every worker must present */
    double heartbeat_interval_s; /* how often the coordinator sends heartbeats */
    double dead_after_s;         /* silence after which a rank is dead */
    double register_timeout_s;   /* ranks missing after this long abort the job */
} pt_coordinator_options;

#define PT_COORDINATOR_OPTIONS_INIT                                                                \
    {NULL, 0, 0, NULL, PT_HEARTBEAT_INTERVAL_S, PT_DEAD_AFTER_S, PT_REGISTER_TIMEOUT_S}

typedef enum pt_job_phase {
    PT_JOB_REGISTERING, /* waiting for every rank to register */
    PT_JOB_RUNNING,     /* the table went out */
    PT_JOB_FINISHED,    /* every rank said done */
    PT_JOB_ABORTED,     /* a rank died or failed; abort_rank and abort_reason say which */
} pt_job_phase;

/* A snapshot of the job. Progress fields aggregate each rank's latest report. */
typedef struct pt_job_status {
    pt_job_phase phase;
    int world, registered, done;
    int reporting;       /* ranks that sent progress */
    long min_step;       /* the slowest reporting rank's step */
    long total_steps;    /* as the ranks report it */
    double mean_loss;    /* over reporting ranks' latest losses */
    double tokens_per_s; /* summed over reporting ranks (a finished rank's last rate) */
    long val_step;       /* step of the latest validation loss reported, -1 if none */
    double val_loss;
    int abort_rank;      /* -1: not one rank's fault (or no abort) */
    char abort_reason[512];
} pt_job_status;

/* Listens (SO_REUSEADDR) on bind_host:port. */
pipert_result pt_coordinator_create(pt_coordinator **out, const pt_coordinator_options *options);
/* Stops the serving thread if one runs, closes every connection. NULL is fine. */
void pt_coordinator_free(pt_coordinator *c);

int pt_coordinator_port(const pt_coordinator *c);

/* Serves for up to timeout_ms (returns early after handling any event):
 * accepts, reads, checks heartbeats and deadlines, writes. For a caller with
 * its own loop (pipert launch); not together with pt_coordinator_start. */
pipert_result pt_coordinator_poll(pt_coordinator *c, int timeout_ms);

/* Serves from a thread of its own until pt_coordinator_free (rank 0 under
 * SLURM/MPI, beside its training). */
pipert_result pt_coordinator_start(pt_coordinator *c);

/* Waits until the job is finished or aborted, or timeout_s passes (a thread
 * must be serving: pt_coordinator_start). */
void pt_coordinator_wait(pt_coordinator *c, double timeout_s);

/* Aborts the job (if not aborted already) with a reason, telling every rank;
 * the launcher's word when a process dies. rank -1: no one rank. */
void pt_coordinator_abort(pt_coordinator *c, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void pt_coordinator_status(pt_coordinator *c, pt_job_status *status);

/* The reason rank `rank` failed, as it reported it or as the coordinator saw
 * it ("connection closed before done", "no heartbeat for 5.0 s"); false if it
 * has not failed. */
bool pt_coordinator_rank_failure(pt_coordinator *c, int rank, char *reason, size_t cap);

/* One job-wide progress line from a status:
 * "step 40/100 | loss 2.8131 | 51234 tok/s | 4/4 ranks" */
void pt_job_progress_line(const pt_job_status *s, char *line, size_t cap);

/* ---- client (worker side) ------------------------------------------------- */

typedef struct pt_coord_client pt_coord_client;

/* Called once, from the client's thread, when the job aborts (rank -1: not
 * one rank's fault, or the coordinator is gone). Keep it short: set a flag,
 * cancel a blocking transfer. */
typedef void (*pt_abort_callback)(void *context, int rank, const char *reason);

typedef struct pt_coord_client_options {
    const char *host;            /* the coordinator */
    int port;
    const char *secret;
    int rank, world;
    const char *address;         /* this worker's data-plane address ("" if none) */
    double connect_timeout_s;    /* retry connecting this long (it may not listen yet) */
    double heartbeat_interval_s;
    double dead_after_s;         /* coordinator silence after which the job is aborted */
    pt_abort_callback on_abort;  /* may be NULL */
    void *on_abort_context;
} pt_coord_client_options;

#define PT_COORD_CLIENT_OPTIONS_INIT                                                               \
    {NULL, 0, NULL, 0, 0, "", PT_CONNECT_TIMEOUT_S, PT_HEARTBEAT_INTERVAL_S, PT_DEAD_AFTER_S,    \
     NULL, NULL}

typedef struct pt_peer {
    int rank;
    int pid;
    char host[PT_HOST_MAX];
    char *address; /* data-plane address, NUL-terminated */
} pt_peer;

typedef struct pt_peer_table {
    int world;
    pt_peer *peers; /* [world], peers[r].rank == r */
} pt_peer_table;

/* Connects (retrying for connect_timeout_s), registers, waits for the
 * coordinator's answer, and starts the heartbeat thread. A refusal is
 * PIPERT_ERR_AUTH (wrong secret) or PIPERT_ERR_PEER with the coordinator's
 * reason; no coordinator in time is PIPERT_ERR_TIMEOUT. */
pipert_result pt_coord_client_connect(pt_coord_client **out, const pt_coord_client_options *options);

/* Waits for the table of every rank; it lives as long as the client.
 * PIPERT_ERR_PEER if the job aborted before the table came, PIPERT_ERR_TIMEOUT
 * after timeout_s. (An abort after the table is for pt_coord_client_check.) */
pipert_result pt_coord_client_wait_table(pt_coord_client *c, double timeout_s,
                                         const pt_peer_table **table);

typedef struct pt_rank_progress {
    long step, total_steps;
    double loss, tokens_per_s;
    double val_loss; /* NaN: no validation at this step */
} pt_rank_progress;

pipert_result pt_coord_client_send_progress(pt_coord_client *c, const pt_rank_progress *p);
/* This worker finished; the coordinator expects the connection to close next. */
pipert_result pt_coord_client_send_done(pt_coord_client *c);
/* This worker failed: the job aborts, naming this rank and `reason`. */
pipert_result pt_coord_client_send_error(pt_coord_client *c, const char *reason);

/* Whether the job aborted (a cheap read, for the step loop). */
bool pt_coord_client_aborted(pt_coord_client *c);
/* PIPERT_OK while the job runs; after an abort PIPERT_ERR_PEER with the
 * message "job aborted: rank R: REASON". */
pipert_result pt_coord_client_check(pt_coord_client *c);

/* Stops the heartbeat thread and closes the connection. NULL is fine. */
void pt_coord_client_close(pt_coord_client *c);

#endif
