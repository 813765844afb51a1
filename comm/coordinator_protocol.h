/* What the job's coordinator (comm/coordinator.h) and a worker's
 * client (comm/coord_client.h) say to each other. It is on the control
 * path only — tensors never pass through it — and speaks plain TCP.
 *
 * Protocol: one JSON object per line ('\n'-terminated), each with a "type".
 *   worker → coordinator
 *     hello     {nonce}      must come first: the worker's challenge (hexadecimal)
 *     register  {rank, world, host, pid, address, proof, protocol[, digest][, join]}
 *                             after the challenge; protocol: the build's PT_PROTOCOL_VERSION
 *                             (absent: 0, a build from before it), digest: the job digest's
 *                             parts in hexadecimal (runtime/job_digest.h; absent: not compared);
 *                             join: a restarted process takes the rank of a replica that
 *                             left (elastic jobs, membership.h "Joining"); resume: a worker
 *                             whose coordinator's connection closed registers again (with
 *                             a coordinator started again, or over a new connection), with
 *                             what it knows of the job: {epoch, departures, joins, left:
 *                             [replica...], in: [[replica, epoch]...], switch: {epoch, step,
 *                             sequence, donor, joiners}, ack: {epoch, step, sequence},
 *                             progress: {step, total}}
 *                             (coordinator_recover.c)
 *     heartbeat {}                                           every interval
 *     progress  {step, total, loss, tokens_per_s[, val_loss][, compute, wait_pipeline,
 *                wait_coupling, bytes_wan]}
 *     done      {}            the worker finished; its connection may close
 *     error     {reason}      the worker failed; the job aborts (elastic: its replica leaves)
 *     ack       {epoch, step, sequence}  a survivor heard of departure `epoch` at the
 *                             boundary after its step `step`; `sequence`: its groups' next
 *     ready     {}            a rank registered with join: it has built its stage and can
 *                             take its state; once every rank of its replica said so, the
 *                             replica is back ("join")
     joined    {epoch}         a rank of a replica that came back took the state of switch
                             `epoch`; it trains once told its replica is in ("in")
 *   coordinator → worker
 *     challenge {nonce, proof}  the answer to hello: the coordinator's proof (over the
 *                             worker's nonce) and its own nonce, which the worker's proof
 *                             in "register" answers (comm/auth.h)
 *     welcome   {}            registration accepted
 *     refused   {reason, auth, settings}  registration refused (auth: a wrong secret;
 *                             settings: another protocol version or job digest than the
 *                             first rank's); the connection closes
 *     table     {world, peers: [{rank, host, pid, address}, ...]}
 *                             (address: the data plane's, pt_transport_address: the
 *                             worker's UCX address in hexadecimal)
 *                             once every rank has registered
 *     heartbeat {}            every interval, so a worker notices a dead
 *                             coordinator even when its host vanishes
 *     abort     {rank, reason}  rank -1: not one rank's fault
 *     leave     {epoch, replica, rank, reason}  elastic jobs: the rank's failure took its
 *                             replica out; the others go on (comm/membership.h)
 *     join      {epoch, replica, peers: [{rank, address}, ...]}  every rank of a replica
 *                             that left registered again and said ready: it is back, at
 *                             these addresses; the others acknowledge `epoch` as for a
 *                             departure (once all of them registered, the joiners hear the
 *                             replicas that are out, as "leave", and the table)
 *     switch    {epoch, step, sequence, donor, joiners}  every survivor acknowledged
 *                             `epoch`: after step `step` they couple in new groups whose
 *                             collectives start at `sequence`; the replicas listed in
 *                             `joiners` came back and take replica `donor`'s state then (-1:
 *                             none came)
 *     in        {replica, epoch}  every rank of `replica` took the state of switch `epoch`,
                             the switch that let it in last: its ranks train from there (a
                             newer switch that lists it again supersedes that state: they
                             take that one's instead)
     finished  {}            every rank is done
 *
 * Failure detection. A registered rank is declared dead, and the job aborted
 * (or, in an elastic job, its replica out: membership.h), when it sends nothing (heartbeats included) for dead_after_s, when its
 * connection closes before it said "done", or when it reports an error. Every
 * rank is told {rank, reason}, once. A worker treats a closed or silent
 * coordinator connection as an abort too (under pipert launch: as the coordinator's loss,
 * after trying to register again: coord_client.h).
 *
 * What must match. The first rank to register sets the job's protocol version and job digest
 * (the first that carries a digest, its digest): a rank that registers with another is refused,
 * naming the rank and what differs (runtime/job_digest.h), and logged. A rank the job needs to
 * start aborts it (it would wait for that rank forever); a rank rejoining an elastic job is
 * refused alone, and the job goes on.
 *
 * Authentication. Both sides prove that they know the job's secret without
 * sending it: challenge and response with fresh nonces (comm/auth.h),
 * the coordinator first, so a worker never registers with an impostor. A
 * connection whose proof is wrong, or that skips a step, is refused and logged
 * (pt_warn, naming the peer address); it does not abort the job. A recorded
 * registration is worthless later: its proof answers a nonce that is never
 * drawn again. Every line after "welcome", both ways, is sealed
 * (coordinator_seal.c): "MAC JSON", the MAC under a key of this connection
 * (from the job's key and the two nonces), JSON with the next "seq" of its
 * direction; a line that fails is dropped and logged, never acted upon, so
 * bytes injected into the connection can neither abort the job nor stop a
 * worker.
 */
#ifndef PT_COORDINATOR_PROTOCOL_H
#define PT_COORDINATOR_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "comm/auth.h"

#define PT_HEARTBEAT_INTERVAL_S 1.0
#define PT_DEAD_AFTER_S 5.0
#define PT_REGISTER_TIMEOUT_S 300.0 /* every rank must have registered by then */
#define PT_SWITCH_MARGIN_STEPS 0    /* 0: twice the stages, plus 2 (membership.h) */
#define PT_CONNECT_TIMEOUT_S 120.0  /* a worker retries connecting this long */
#define PT_ADDRESS_MAX 16384        /* longest data-plane address, in characters */

/* Who proves what in the registration handshake (pt_auth_prove). */
#define PT_COORD_PROVER ((pt_auth_party){"coordinator", -1, -1})
#define PT_COORD_WORKER_ROLE "worker"

/* What a "progress" message says: one rank's latest report. */
typedef struct pt_rank_progress {
    long step, total_steps;
    double loss, tokens_per_s;
    double val_loss; /* NaN: no validation at this step */
    /* the last step's utilisation (pipeline/utilisation.h): shares of its wall
     * time, and the bytes it sent to other sites; NaN shares: not measured */
    double compute, wait_pipeline, wait_coupling, bytes_wan;
} pt_rank_progress;

/* ---- line framing, for coordinator_server.c and coordinator_client.c ----- */

struct json_t; /* jansson's */

#pragma GCC visibility push(hidden)

/* Bytes received and not yet handled, or queued and not yet sent. */
typedef struct pt_coord_buffer {
    char *data;
    size_t length, capacity;
} pt_coord_buffer;

bool pt_coord_buffer_append(pt_coord_buffer *b, const void *data, size_t n);
void pt_coord_buffer_consume(pt_coord_buffer *b, size_t n);
char *pt_coord_find_newline(const pt_coord_buffer *b);
void pt_coord_buffer_free(pt_coord_buffer *b);

char *pt_coord_message_text(struct json_t *message, size_t *length);
const char *pt_coord_get_string(struct json_t *m, const char *key);
bool pt_coord_get_long(struct json_t *m, const char *key, long *value);
double pt_coord_get_double(struct json_t *m, const char *key, double fallback);

void pt_coord_set_no_delay(int fd);

/* A connection's sealed lines (coordinator_seal.c); off (plain lines) until started. */
typedef struct pt_coord_seal {
    bool on;
    uint8_t key[PT_AUTH_PROOF_BYTES];
    uint64_t sent, received; /* lines so far, each way */
} pt_coord_seal;

/* Both sides start it once the worker's registration is accepted. */
void pt_coord_seal_start(pt_coord_seal *s, const pt_auth_key *key,
                         const uint8_t worker_nonce[PT_AUTH_NONCE_BYTES],
                         const uint8_t coordinator_nonce[PT_AUTH_NONCE_BYTES]);
/* The line to send for `message` (taken over): sealed with the next "seq" once started;
 * NULL when out of memory. */
char *pt_coord_seal_message(pt_coord_seal *s, struct json_t *message, size_t *length);
/* The message of a received line (without its '\n'), or NULL with *why saying what is
 * wrong with it. */
struct json_t *pt_coord_seal_open(pt_coord_seal *s, const char *line, size_t length,
                                  const char **why);
/* CLOCK_MONOTONIC now + seconds, for pthread_cond_timedwait on a condition
 * variable that uses that clock. */
struct timespec pt_coord_deadline_after(double seconds);

#pragma GCC visibility pop

#endif
