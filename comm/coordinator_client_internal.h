/* What the two files of the worker's side of the coordinator share: the client's state
 * (coordinator_client.c: the thread that talks to the coordinator, and what the session asks
 * of it) and the way in (coordinator_register.c: connecting, the hello and its proofs, and
 * registering, first or again). Nothing outside these two files includes it. */
#ifndef PT_COORDINATOR_CLIENT_INTERNAL_H
#define PT_COORDINATOR_CLIENT_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "comm/auth.h"
#include "comm/coord_client.h"
#include "comm/coordinator_protocol.h"

/* The table the coordinator sends may be long (every rank's address); a message longer than
 * this is an error. */
#define MAX_COORDINATOR_MESSAGE (64u << 20)
struct pt_coord_client {
    int fd;
    int rank, world;
    int replica; /* -1: not known (no stages given) */
    char where[PT_HOST_MAX + 16]; /* "host:port" */
    /* what registering (again) takes */
    char *host, *address;
    int port;
    pt_auth_key key;
    pt_job_identity identity;
    bool join;
    bool refused_for_now; /* the last registration was refused with "retry" */
    double connect_timeout_s, reconnect_s;
    atomic_bool reconnecting; /* the connection closed: the thread registers again */
    long reconnections;       /* under lock */
    bool acked;               /* under lock: the last acknowledgement sent (view's "ack") */
    long progress_step, progress_total; /* under lock: the last progress sent (-1: none) */
    long ack_epoch, ack_step, ack_sequence;
    double heartbeat_interval_s, dead_after_s, lost_grace_s;
    bool outlive_coordinator;
    pt_abort_callback on_abort;
    void *on_abort_context;
    void (*on_join)(void *context, int replica, long epoch); /* under callback_lock */
    void *on_join_context;
    pthread_mutex_t callback_lock;
    pt_coord_buffer in;
    pt_coord_seal seal; /* lines after "welcome" (coordinator_seal.c); under send_lock to send */
    long dropped;       /* under lock: received lines the seal refused, and the last one's why */
    char dropped_why[96];
    double last_heard, last_sent;
    pthread_mutex_t send_lock; /* one writer at a time */
    pthread_mutex_t lock;      /* the fields below */
    pthread_cond_t changed;
    atomic_bool aborted;
    atomic_bool lost;   /* the coordinator is gone (lost_reason says how) */
    double lost_at;     /* when it went silent (the client listens on for the grace) */
    char lost_reason[512];
    bool abort_claimed; /* under lock: an abort is being delivered */
    int abort_rank;
    char abort_reason[512];
    bool has_table, finished, done_sent;
    pt_peer_table table;
    pt_membership_news membership;
    bool *left;                 /* [world]: replicas that left (a replica index is below world) */
    long *join_epoch;           /* [world]: the epoch each replica last came back in (0: never) */
    bool *switch_joiners;       /* [world]: the replicas the newest switch lets in */
    long *in_epoch;             /* [world]: the switch whose state each replica's ranks all
                                 * took last, as "in" said (0: none) */
    char (*left_reason)[512];   /* [world]: why, as the coordinator said it */
    pthread_t thread;
    bool thread_started;
    int stop_pipe[2];
};

/* ---- coordinator_client.c ---- */

/* Sends one line; `handshake`: before the welcome, so without the seal. */
pipert_result pt_coord_client_send_line(pt_coord_client *c, json_t *message, bool handshake);
/* Handles every whole line received so far. */
void pt_coord_client_handle_buffered(pt_coord_client *c);

/* ---- coordinator_register.c ---- */

/* One connection attempt to every address of host:port, each bounded by timeout_s; the
 * socket (blocking) or -1 with *error set. */
int pt_coord_client_try_connect(const char *host, int port, double timeout_s, int *error,
                                bool *resolved);
/* The connected socket made ready for the thread (non-blocking, no delay). */
void pt_coord_client_prepare_socket(pt_coord_client *c);
/* The hello, the proofs both ways and the registration; `resume`: the job as this rank saw
 * it, when it registers again. */
pipert_result pt_coord_client_register(pt_coord_client *c, json_t *resume, double answer_s);
/* Connects (retrying while the coordinator is not up) and registers. */
pipert_result pt_coord_client_connect_and_register(pt_coord_client *c,
                                                   const pt_coord_client_options *o);

#endif
