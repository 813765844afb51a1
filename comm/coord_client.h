/* The worker's side of the job's coordinator (comm/coordinator.h):
 * it registers, waits for the table of every rank's data-plane address, sends
 * heartbeats (from a thread of its own) and progress, and learns of a
 * job-wide abort. What it says is comm/coordinator_protocol.h.
 *
 * Losing the coordinator (its connection closes, or it stays silent for
 * dead_after_s) aborts the job, unless outlive_coordinator is set (under
 * pipert launch, whose launcher is the coordinator): then the workers may
 * still finish what they are doing without it (session/coordinator_loss.c).
 * With reconnect_s (pipert launch, which starts a coordinator again when it dies) a
 * connection that closes is not yet a loss: the client connects again and registers
 * again with what it knows of the job (coordinator_recover.c), for reconnect_s at
 * most; meanwhile what the worker sends is dropped (its acknowledgement of a
 * membership change goes with the new registration). A silent coordinator is not
 * reconnected to: a link that comes back brings its word.
 * The loss is a condition of its own, pt_coord_client_coordinator_lost();
 * from then on progress, "done" and errors are not sent (there is no one to
 * tell). A safety net: a worker that has not closed its client lost_grace_s
 * after the loss is told the job aborted, so waits end and an orphaned worker
 * never lingers forever.
 */
#ifndef PT_COORD_CLIENT_H
#define PT_COORD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap.h"
#include "comm/coordinator_protocol.h"
#include "runtime/error.h"
#include "runtime/job_digest.h"

typedef struct pt_coord_client pt_coord_client;

/* Called once, from the client's thread, when the job aborts (rank -1: not
 * one rank's fault, or the coordinator is gone: at once, or lost_grace_s after
 * with outlive_coordinator). Keep
 * it short: set a flag, cancel a blocking transfer. */
typedef void (*pt_abort_callback)(void *context, int rank, const char *reason);

typedef struct pt_coord_client_options {
    const char *host;            /* the coordinator */
    int port;
    const char *secret;
    int rank, world;
    const char *address;         /* this worker's data-plane address ("" if none) */
    double connect_timeout_s;    /* retry connecting this long (it may not listen yet) */
    double heartbeat_interval_s;
    double dead_after_s;         /* coordinator silence after which it is lost */
    pt_abort_callback on_abort;  /* may be NULL */
    void *on_abort_context;
    bool outlive_coordinator;    /* a lost coordinator is not an abort (for lost_grace_s) */
    double lost_grace_s;         /* the coordinator lost this long: the job aborts */
    bool join;                   /* rejoin: take this rank of a replica that left (elastic) */
    /* Called on the client's thread, as soon as it heard that `replica` came back with new
     * processes (before the switch that lets it in); may be NULL. */
    void (*on_join)(void *context, int replica, long epoch);
    void *on_join_context;
    /* What the registration says this worker is (runtime/job_digest.h): protocol 0 stands for
     * this build's (another is for tests); no digest: the settings are not compared. */
    pt_job_identity identity;
    /* The connection closed: connect and register again for this long before the coordinator
     * counts as lost (0: at once). Not for a joiner until its replica is in. */
    double reconnect_s;
    int stages; /* ranks of a replica: which replica is this rank's (0: not known) */
} pt_coord_client_options;

/* How long a worker may go on without its coordinator before the client
 * aborts the job (the stop the workers agree on normally comes far sooner). */
#define PT_COORD_LOST_GRACE_S 600.0

#define PT_COORD_CLIENT_OPTIONS_INIT                                                               \
    {NULL, 0, NULL, 0, 0, "", PT_CONNECT_TIMEOUT_S, PT_HEARTBEAT_INTERVAL_S, PT_DEAD_AFTER_S,    \
     NULL, NULL, false, PT_COORD_LOST_GRACE_S, false, NULL, NULL, {0}, 0, 0}

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
 * PIPERT_ERR_AUTH (wrong secret), PIPERT_ERR_CONFIG (another protocol version
 * or job digest than the job's) or PIPERT_ERR_PEER with the coordinator's
 * reason; no coordinator in time is PIPERT_ERR_TIMEOUT. */
pipert_result pt_coord_client_connect(pt_coord_client **out, const pt_coord_client_options *options);

/* Waits for the table of every rank; it lives as long as the client.
 * PIPERT_ERR_PEER if the job aborted or the coordinator was lost before the
 * table came, PIPERT_ERR_TIMEOUT
 * after timeout_s. (An abort after the table is for pt_coord_client_check.) */
pipert_result pt_coord_client_wait_table(pt_coord_client *c, double timeout_s,
                                         const pt_peer_table **table);

/* These three send nothing and return PIPERT_OK once the coordinator is lost. */
pipert_result pt_coord_client_send_progress(pt_coord_client *c, const pt_rank_progress *p);
/* This worker finished; the coordinator expects the connection to close next. */
pipert_result pt_coord_client_send_done(pt_coord_client *c);
/* A rejoining worker (join) built its stage and can take its state. */
pipert_result pt_coord_client_send_ready(pt_coord_client *c);
/* A joiner took the state of switch `epoch` (membership.h: its replica is in once all its ranks
 * took that switch's, and the coordinator says so: pt_coord_client_in_epoch). */
pipert_result pt_coord_client_send_joined(pt_coord_client *c, long epoch);
/* Elastic replicas (comm/membership.h): what this worker heard. */
typedef struct pt_membership_news {
    long epoch;                /* membership changes heard of: departures and joins */
    long switch_epoch;         /* the newest switch (0: none yet) */
    long switch_step;          /* after this step ... */
    uint32_t switch_sequence;  /* ... the new groups' collectives start here */
    int switch_donor;          /* the replica that gives replicas coming back their state; -1 */
    long departures, joins;    /* replicas that left, that came back (as heard) */
} pt_membership_news;

void pt_coord_client_membership(pt_coord_client *c, pt_membership_news *news);
/* Lines from the coordinator dropped because their seal failed (coordinator_seal.c: not
 * sent by it, or replayed), and what was wrong with the last one. */
long pt_coord_client_dropped_lines(pt_coord_client *c, char *why, size_t cap);
/* The membership epoch in which `replica` last came back (0: never). */
long pt_coord_client_join_epoch(pt_coord_client *c, int replica);
/* The replicas the newest switch lets in (joiners: [world]; they came back since the switch
 * before, or a switch that let them in was superseded before they took its state), and that
 * switch's epoch (0: none yet). */
long pt_coord_client_switch_joiners(pt_coord_client *c, bool *joiners);
/* The switch whose state every rank of `replica` took, as the coordinator said last ("in"; 0:
 * none): a joiner of that switch trains from there. */
long pt_coord_client_in_epoch(pt_coord_client *c, int replica);
/* No on_join call after this returns (one under way has ended). */
void pt_coord_client_stop_join_callback(pt_coord_client *c);
/* A rank's data-plane address as the coordinator said last (a replica that
 * came back has new ones); malloc'd, NULL before the table. */
char *pt_coord_client_peer_address(pt_coord_client *c, int rank);
/* Whether `replica` left the job, and why ("rank 3 its connection closed ..."). */
bool pt_coord_client_replica_left(pt_coord_client *c, int replica, char *reason, size_t cap);
/* This survivor heard of departure `epoch` after its step `step`; its groups'
 * next collective sequence is `sequence`. */
pipert_result pt_coord_client_send_ack(pt_coord_client *c, long epoch, long step,
                                       uint32_t sequence);

/* This worker failed: the job aborts, naming this rank and `reason`. */
pipert_result pt_coord_client_send_error(pt_coord_client *c, const char *reason);

/* How often the client registered again with a coordinator started again. */
long pt_coord_client_reconnections(pt_coord_client *c);

/* Whether the job aborted (a cheap read, for the step loop). */
bool pt_coord_client_aborted(pt_coord_client *c);
/* Whether the coordinator is gone (closed its connection, or fell silent)
 * while the job ran, with outlive_coordinator; `why` (may be NULL) receives
 * how it was noticed. */
bool pt_coord_client_coordinator_lost(pt_coord_client *c, char *why, size_t cap);
/* PIPERT_OK while the job runs; after an abort PIPERT_ERR_PEER with the
 * message "job aborted: rank R: REASON". */
pipert_result pt_coord_client_check(pt_coord_client *c);

/* Stops the heartbeat thread and closes the connection. NULL is fine. */
void pt_coord_client_close(pt_coord_client *c);

#endif
