/* The job's coordinator: rendezvous, membership, heartbeats, job-wide abort,
 * and progress aggregation. It is on the control path only — tensors never
 * pass through it — and speaks plain TCP: comm/coordinator_protocol.h
 * says what it and the workers say, and how it tells that a rank died. The
 * worker's side is comm/coord_client.h.
 *
 * Where it runs: in `pipert launch` (one machine), or in rank 0's process
 * under SLURM and MPI (comm/bootstrap.h says which).
 */
#ifndef PT_COORDINATOR_H
#define PT_COORDINATOR_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/coordinator_protocol.h"
#include "runtime/error.h"
/* The worker's side too, for the callers that use both (the session layer, tests). */
#include "comm/coord_client.h"

typedef struct pt_coordinator pt_coordinator;

typedef struct pt_coordinator_options {
    const char *bind_host;       /* NULL: every interface; "127.0.0.1": this host only */
    int port;                    /* 0: any free port (pt_coordinator_port says which) */
    int world;                   /* ranks in the job */
    const char *secret;          /* what every worker must present */
    double heartbeat_interval_s; /* how often the coordinator sends heartbeats */
    double dead_after_s;         /* silence after which a rank is dead */
    double register_timeout_s;   /* ranks missing after this long abort the job */
    /* Elastic replicas (comm/membership.h): ranks are replica·stages + stage; a
     * failed rank's replica leaves while at least min_replicas remain (0: all of them must
     * stay, every failure aborts); survivors switch groups switch_margin steps after the
     * last of them heard of it. */
    int stages;
    int min_replicas;
    long switch_margin;
    /* A socket already listening (pt_coordinator_listen), served instead of bind_host:port
     * (-1: none); the coordinator owns it from create on. A launcher keeps one, so that a
     * coordinator started again is found where the last one was. */
    int listen_fd;
    /* Started again while the job runs (coordinator_recover.c): no table goes out; the
     * workers register again with what they know, and the job is rebuilt from it. Ranks
     * not back within recover_timeout_s (0: twice dead_after_s) have failed. */
    bool recover;
    double recover_timeout_s;
} pt_coordinator_options;

#define PT_COORDINATOR_OPTIONS_INIT                                                                \
    {NULL, 0, 0, NULL, PT_HEARTBEAT_INTERVAL_S, PT_DEAD_AFTER_S, PT_REGISTER_TIMEOUT_S, 1, 0,     \
     PT_SWITCH_MARGIN_STEPS, -1, false, 0}

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
    /* means over the ranks that measure them (NaN: none): shares of a step's
     * wall time; and the bytes per step all ranks send between sites */
    double compute, wait_pipeline, wait_coupling, bytes_wan;
    long val_step;       /* step of the latest validation loss reported, -1 if none */
    double val_loss;
    int replicas, replicas_live; /* elastic jobs: replicas in the job, and still in it */
    long departures;     /* replicas that left */
    long joins;          /* replicas that came back (restarted: pipert worker --join) */
    int abort_rank;      /* -1: not one rank's fault (or no abort) */
    char abort_reason[512];
} pt_job_status;

/* One rank as the coordinator sees it now (pipert launch's status.json). */
typedef enum pt_rank_state {
    PT_RANK_REGISTERING, /* not registered yet */
    PT_RANK_TRAINING,    /* registered, its replica in the job */
    PT_RANK_LEFT,        /* its replica left the job */
    PT_RANK_JOINING,     /* registered again (pipert worker --join); its replica not back yet */
    PT_RANK_DONE,        /* said it finished */
} pt_rank_state;

typedef struct pt_rank_status {
    pt_rank_state state;
    long step; /* its latest reported step; -1: none yet */
} pt_rank_status;

/* A listening socket (SO_REUSEADDR, close-on-exec) on host:port (NULL host: every
 * interface; port 0: any free one, *bound says which). */
pipert_result pt_coordinator_listen(const char *host, int port, int *fd, int *bound);

/* Listens (SO_REUSEADDR) on bind_host:port, or serves options->listen_fd. */
pipert_result pt_coordinator_create(pt_coordinator **out, const pt_coordinator_options *options);
/* Stops the serving thread if one runs, closes every connection. NULL is fine. */
void pt_coordinator_free(pt_coordinator *c);

int pt_coordinator_port(const pt_coordinator *c);

/* Serves a socket that is already connected to a worker (one end of a
 * socketpair, or a connection accepted elsewhere) as if it had been accepted;
 * the coordinator owns fd from here on, also on failure. */
pipert_result pt_coordinator_adopt(pt_coordinator *c, int fd);

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

/* Rank `rank` failed (the launcher saw it exit): in an elastic job its
 * replica leaves (membership.h), otherwise the job aborts, as when the
 * coordinator sees it die itself. The first word stands: pt_coordinator_drain
 * first, so that what the rank reported before it exited does. */
void pt_coordinator_rank_failed(pt_coordinator *c, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Rank `rank` finished (the launcher saw it exit 0): what its "done" says, for a
 * coordinator started again after the rank said it to the one before. */
void pt_coordinator_rank_done(pt_coordinator *c, int rank);

/* Reads what `rank` sent and has not been handled yet (its last words before it exited). */
void pt_coordinator_drain(pt_coordinator *c, int rank);

/* Whether the coordinator, started again, is still rebuilding the job (coordinator_recover.c). */
bool pt_coordinator_recovering(pt_coordinator *c);

/* Whether rank's replica left the job. */
bool pt_coordinator_rank_left(pt_coordinator *c, int rank);

void pt_coordinator_status(pt_coordinator *c, pt_job_status *status);

/* Each rank's state and latest step (ranks: room for the world's). */
void pt_coordinator_rank_statuses(pt_coordinator *c, pt_rank_status *ranks);

/* The state's name in status.json: "registering", "training", "left", "joining", "done". */
const char *pt_rank_state_name(pt_rank_state state);

/* The reason rank `rank` failed, as it reported it or as the coordinator saw
 * it ("connection closed before done", "no heartbeat for 5.0 s"); false if it
 * has not failed. */
bool pt_coordinator_rank_failure(pt_coordinator *c, int rank, char *reason, size_t cap);

/* One job-wide progress line from a status:
 * "step 40/100 | loss 2.8131 | 51234 tok/s | 4/4 ranks" */
void pt_job_progress_line(const pt_job_status *s, char *line, size_t cap);

#endif
