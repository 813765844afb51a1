/* What the coordinator's files share (coordinator.h is the interface): the state of
 * its connections, ranks and job, and the helpers the files use one of another's.
 *   coordinator_server.c  the loop: connections, registration, heartbeats, progress,
 *                         departures and switches, aborting and finishing
 *   coordinator_join.c    replicas coming back (membership.h, "Joining")
 *   coordinator_recover.c a coordinator started again rebuilding the job from what the
 *                         workers know when they register again
 * Everything here runs under the coordinator's lock. */
#ifndef PT_COMM_COORDINATOR_INTERNAL_H
#define PT_COMM_COORDINATOR_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/auth.h"
#include "comm/coordinator.h"
#include "comm/coordinator_protocol.h"
#include "comm/membership.h"
#include "runtime/job_digest.h"

typedef struct connection {
    int fd;
    int rank;            /* -1 until registered */
    char peer[96];       /* "10.0.0.5:41234" */
    pt_coord_buffer in, out;
    double opened_at, last_heard;
    bool broken;         /* closed by the peer, or a read/write failed: dropped at the sweep */
    bool close_when_sent; /* refused: close once the answer is out */
    bool challenged;     /* it said hello; our nonce is in `nonce` */
    uint8_t nonce[PT_AUTH_NONCE_BYTES]; /* ours: its proof in "register" must answer it */
    uint8_t peer_nonce[PT_AUTH_NONCE_BYTES];
    pt_coord_seal seal; /* its lines after "welcome" (coordinator_seal.c) */
} connection;

typedef struct rank_state {
    bool registered, done, failed, has_progress;
    bool joining; /* registered to rejoin (pipert worker --join); its replica is not back yet */
    bool ready;   /* joining, and said it can take its state (built, connected to its replica) */
    int pid;
    char host[PT_HOST_MAX];
    char *address;
    pt_rank_progress progress;
    char failure[512];
    connection *conn; /* NULL once closed */
} rank_state;

/* A coordinator started again (coordinator_recover.c), until the job is rebuilt. */
typedef struct coord_recovery {
    bool on;
    double started_at, deadline; /* ranks not back by the deadline have failed */
    json_t **views;      /* [world]: what each rank that registered again knows ("resume") */
    bool *finished;      /* [world]: the launcher saw the rank exit 0 */
    char (*failed)[512]; /* [world]: the launcher saw it fail, and why ("": it did not) */
} coord_recovery;

struct pt_coordinator {
    pt_coordinator_options options;
    pt_auth_key key; /* from the job's secret (auth.h); the secret itself is not kept */
    int listen_fd, port;
    connection **conns;
    int n_conns, cap_conns;
    rank_state *ranks; /* [world] */
    pt_membership membership; /* which replicas are still in (membership.h) */
    pt_job_identity identity; /* what every rank must match: the first registration's */
    bool identity_known;      /* a rank registered: `identity` holds */
    coord_recovery recovery;
    pt_job_phase phase;
    int registered, done;
    int abort_rank;
    char abort_reason[512];
    long val_step;
    double val_loss;
    double created_at, heartbeat_sent_at;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* phase changes */
    pthread_t thread;
    bool thread_started;
    atomic_bool stopping;
};

#pragma GCC visibility push(hidden)

/* coordinator_server.c */
/* Takes `message` over and queues it, sealed once the connection's registration was
 * accepted; a NULL connection drops it. */
void pt_coord_send(connection *conn, json_t *message);
/* The registration is accepted: "welcome", then sealed lines both ways. */
void pt_coord_welcome(pt_coordinator *c, connection *conn);
/* Sends to every registered rank still connected, and takes `message` over. */
void pt_coord_broadcast(pt_coordinator *c, json_t *message);
/* Whether `rank`'s replica is out of the job. */
bool pt_coord_rank_left(const pt_coordinator *c, int rank);
/* The job aborts (once): every rank hears why; `rank` >= 0 is the one that failed. */
void pt_coord_abort_locked(pt_coordinator *c, int rank, const char *reason);
/* Ranks that are done count as having acknowledged the current membership epoch. */
void pt_coord_done_ranks_acknowledge(pt_coordinator *c);

/* coordinator_admit.c */
/* hello {nonce}: the challenge answers it, with our proof and our nonce. */
void pt_coord_hello(pt_coordinator *c, connection *conn, json_t *m);
/* register {rank, world, pid, host, address, proof, protocol, digest, join?, resume?}. */
void pt_coord_register(pt_coordinator *c, connection *conn, json_t *m);
/* Refuses a registration: the answer goes out, then the connection closes. */
void pt_coord_refuse(connection *conn, const char *reason, bool wrong_secret);
/* A refusal that may not hold a moment later ("retry": the worker may register again). */
void pt_coord_refuse_for_now(connection *conn, const char *reason);
/* table {world, peers}: every rank's data-plane address as registered last. */
json_t *pt_coord_table_message(const pt_coordinator *c);

/* coordinator_join.c: register {..., join: true} from a restarted process of `rank`; its
 * "ready" once it can take its state. */
void pt_coord_admit_joiner(pt_coordinator *c, connection *conn, int rank, int pid,
                           const char *host, const char *address);
void pt_coord_joiner_ready(pt_coordinator *c, int rank);
/* A rank that registered to rejoin ended before its replica was back: the rank may register
 * again (a later restart). */
void pt_coord_joiner_failed(pt_coordinator *c, int rank, const char *reason);

/* coordinator_server.c, for coordinator_recover.c */
void pt_coord_rank_failed(pt_coordinator *c, int rank, const char *reason);
void pt_coord_rank_done(pt_coordinator *c, int rank);
void pt_coord_announce_switch(pt_coordinator *c);
void pt_coord_acknowledged(pt_coordinator *c, int rank, long epoch, long step, uint32_t sequence);
void pt_coord_finish_if_done(pt_coordinator *c);

/* coordinator_recover.c */
pipert_result pt_coord_recovery_init(pt_coordinator *c);
void pt_coord_recovery_free(pt_coordinator *c);
/* register {..., resume: VIEW}: a worker whose coordinator went away registers again with
 * what it knows of the job (coordinator_protocol.h); taken over: `view`. */
void pt_coord_register_again(pt_coordinator *c, connection *conn, int rank, int pid,
                             const char *host, const char *address, json_t *view);
/* The launcher's word that `rank` ended (done, or failed for `reason`) while the job is
 * being rebuilt: kept for then (true), or false when the coordinator is not recovering. */
bool pt_coord_recovery_note_exit(pt_coordinator *c, int rank, bool done, const char *reason);
/* Rebuilds the job once every rank is accounted for, or the deadline passed. */
void pt_coord_recovery_check(pt_coordinator *c, double now);

#pragma GCC visibility pop

#endif
