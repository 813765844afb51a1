/* Collectives for CPU workers over the transport, within a group of ranks
 * (e.g. the replicas of one pipeline stage).
 *
 * Every member of a group must start the group's collectives in the same
 * order (each call takes the group's next sequence number, which goes into
 * the messages' tags, so concurrent collectives on one group never mix).
 * A collective ends when it completes or when a member fails (the transport
 * notices dead peers); a member that is alive but never joins is the
 * coordinator's business (heartbeats), not a timeout here.
 * Sizes may be anything, 0 included, whether or not the group size divides
 * them, but must be equal on every member: a member that disagrees fails the
 * receivers' shape check with PIPERT_ERR_PEER.
 *
 * all-reduce is a ring: reduce-scatter then all-gather, 2(n-1) steps, each
 * moving count/n elements to the right neighbour. Every element is reduced
 * by exactly one rank and then copied, so all members end with bitwise equal
 * results. The non-blocking form runs its steps from request callbacks on
 * the transport's progress thread (reductions included), so it advances
 * while the caller computes.
 */
#ifndef PT_COLLECTIVES_H
#define PT_COLLECTIVES_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/transport.h"

typedef struct pt_group pt_group;

typedef struct pt_group_options {
    uint32_t id;  /* 0..255: tells apart groups that share members */
    int checksum; /* checksum every message (pt_checksum64) */
    /* The sequence number of the group's first collective: a group that
     * replaces one of the same id and members starts past every message the
     * old one may still have on the wire (comm/membership.h). */
    uint32_t first_sequence;
    /* Asked every 0.1 s while a blocking barrier, broadcast or all-gather waits: true ends the
     * wait with PIPERT_ERR_INTERRUPTED (its receives cancelled, its sends run to their end, so
     * the caller's buffers are free again). An elastic job's groups are interrupted once their
     * membership is stale: a member whose peers regrouped without it does not wait for them.
     * NULL: never. */
    bool (*interrupted)(void *context);
    void *context;
} pt_group_options;

#define PT_GROUP_OPTIONS_INIT                                                                      \
    {                                                                                              \
        .id = 0, .checksum = 0, .first_sequence = 0, .interrupted = NULL, .context = NULL          \
    }

/* ranks[0..n_ranks) are transport ranks, distinct, and include this process's
 * rank; a member's index in the group is its position in `ranks`. */
pipert_result pt_group_create(pt_transport *t, const int *ranks, int n_ranks,
                              const pt_group_options *options, pt_group **out);
void pt_group_destroy(pt_group *g);
int pt_group_size(const pt_group *g);
int pt_group_index(const pt_group *g); /* this process's index */
/* The sequence number the group's next collective takes. */
uint32_t pt_group_next_sequence(const pt_group *g);

/* Returns once every member has entered the barrier (dissemination, ceil(log2 n) rounds). */
pipert_result pt_barrier(pt_group *g);

/* Copies root_index's `buffer` (nbytes) into every member's `buffer` (binomial tree). */
pipert_result pt_broadcast(pt_group *g, void *buffer, size_t nbytes, int root_index);

/* Bytes this member sends in that broadcast: nbytes to each of its children
 * in the tree (the root sends to ⌈log2 n⌉ members, a leaf to none). */
size_t pt_broadcast_bytes_sent(const pt_group *g, size_t nbytes, int root_index);

/* recv[i * nbytes_each ..] receives member i's `send` (nbytes_each bytes); recv
 * holds n * nbytes_each bytes and must not overlap send. */
pipert_result pt_allgather(pt_group *g, const void *send, size_t nbytes_each, void *recv);

typedef enum pt_reduce_op { PT_REDUCE_SUM, PT_REDUCE_MEAN } pt_reduce_op;

typedef struct pt_allreduce_handle pt_allreduce_handle;

/* Starts reducing data[0..count) in place across the group. `data` must stay
 * untouched until pt_allreduce_wait() returns. */
pipert_result pt_allreduce_start(pt_group *g, float *data, size_t count, pt_reduce_op op,
                                 pt_allreduce_handle **out);

/* Waits for the all-reduce and releases the handle; returns its result. */
pipert_result pt_allreduce_wait(pt_allreduce_handle *handle);

/* Waits at most timeout_s: PIPERT_ERR_TIMEOUT (no message set, the handle
 * still live) if the all-reduce is not done, else as pt_allreduce_wait. */
pipert_result pt_allreduce_wait_for(pt_allreduce_handle *handle, double timeout_s);

/* Gives up waiting (a stop request): the handle frees itself once the
 * transport is done with it (its peers answer, or the transport closes).
 * `data` must stay valid until then, or until the transport is destroyed. */
void pt_allreduce_abandon(pt_allreduce_handle *handle);

/* pt_allreduce_start + pt_allreduce_wait. */
pipert_result pt_allreduce(pt_group *g, float *data, size_t count, pt_reduce_op op);

/* Bytes this member sends in an all-reduce of `count` floats: every chunk but
 * chunk index+1 in the reduce-scatter, every chunk but index+2 in the
 * all-gather (about 2(n−1)/n of the buffer). */
size_t pt_allreduce_bytes_sent(const pt_group *g, size_t count);

/* ---- completions: the waiting half of a non-blocking operation ------------
 *
 * Whoever ends an operation (a request callback, usually on the transport's
 * progress thread) calls pt_completion_finish once; its owner waits with
 * pt_completion_wait_for, or gives up with pt_completion_abandon. A waiter
 * that sees the end frees the completion (and then its owner, itself); if the
 * owner abandoned it, finish frees the completion and calls release(owner).
 * Operations built from several collectives (dp/exchange.c) use one for
 * their handles; the non-blocking all-gather and all-to-all below return one. */
typedef struct pt_completion pt_completion;

pipert_result pt_completion_create(void (*release)(void *owner), void *owner, pt_completion **out);

/* Ends the operation with `result` (message: why it failed, or ""). A
 * result of PIPERT_ERR_TIMEOUT is reported as PIPERT_ERR_TRANSPORT, so that
 * a wait's PIPERT_ERR_TIMEOUT always means "not finished yet". */
void pt_completion_finish(pt_completion *c, pipert_result result, const char *message);

/* 1 once finished (a wait then returns at once), else 0. */
int pt_completion_test(pt_completion *c);

/* Waits at most timeout_s (< 0: no limit): PIPERT_ERR_TIMEOUT (no message
 * set, the completion still live) if not finished; else frees the completion
 * and returns the operation's result, with its message. */
pipert_result pt_completion_wait_for(pt_completion *c, double timeout_s);
pipert_result pt_completion_wait(pt_completion *c);

/* Gives up waiting: release(owner) runs now if the operation has finished,
 * else when it finishes; the completion frees itself. */
void pt_completion_abandon(pt_completion *c);

/* ---- non-blocking all-gather and all-to-all -------------------------------
 *
 * Both post every message at once: each member sends straight to each other
 * member (n−1 messages of nbytes_each out, as many in: the bytes of a ring,
 * in one round trip instead of n−1), and they end from request callbacks on
 * the transport's progress thread. The all-gather puts member i's `send`
 * (nbytes_each) at recv[i·nbytes_each]; the all-to-all sends block j of
 * `send` (send[j·nbytes_each ..]) to member j, which puts it at its
 * recv[i·nbytes_each]. recv holds n·nbytes_each bytes and must not overlap
 * send. Size 0 and a group of one end at once, without messages. */

/* The waitable form: `send` and `recv` must stay untouched until the wait
 * returns; after pt_completion_abandon, until the collective ends (its peers
 * answer, or the transport closes), and so must the group. */
pipert_result pt_allgather_start(pt_group *g, const void *send, size_t nbytes_each, void *recv,
                                 pt_completion **out);
pipert_result pt_alltoall_start(pt_group *g, const void *send, size_t nbytes_each, void *recv,
                                pt_completion **out);

/* ---- chained collectives --------------------------------------------------
 *
 * An operation that runs several collectives one after another on the
 * progress thread (dp/exchange.c) starts each with a callback instead of a
 * handle. Such a collective starts at a time that differs between members,
 * so it cannot take the group's next sequence number then: the operation
 * reserves its tickets when it starts, on its caller's thread, which keeps
 * the group's order the same on every member. */
typedef struct pt_group_ticket {
    uint32_t sequence;
} pt_group_ticket;

/* Takes the group's next sequence number, as starting a collective does. */
pt_group_ticket pt_group_take_ticket(pt_group *g);

/* Called once when a chained collective ends, with its result and (on
 * failure) its message, on the thread that completed its last message:
 * usually the progress thread, or the starting one if it ended at once. It
 * must be short and must not wait; it may start further collectives. The
 * collective frees itself when done returns (its buffers are the caller's). */
typedef void (*pt_collective_done)(void *arg, pipert_result result, const char *message);

/* As the forms above, with done instead of a handle. A failure returned here
 * means nothing started and done is never called; otherwise done is called
 * exactly once, possibly before this returns. */
pipert_result pt_allreduce_then(pt_group *g, pt_group_ticket ticket, float *data, size_t count,
                                pt_reduce_op op, pt_collective_done done, void *arg);
pipert_result pt_allgather_then(pt_group *g, pt_group_ticket ticket, const void *send,
                                size_t nbytes_each, void *recv, pt_collective_done done, void *arg);
pipert_result pt_alltoall_then(pt_group *g, pt_group_ticket ticket, const void *send,
                               size_t nbytes_each, void *recv, pt_collective_done done, void *arg);

/* ---- messages in device memory (collective_device.c) ----------------------
 *
 * For a collective that reduces in a kernel table's memory, built above this file
 * (dp/device_collective.h): member to member under a ticket it took, as device payloads
 * (transport.h, "Device payloads": the receiver copies the sender's device memory) where the
 * receiver copies this member's memory, else as bytes from a host copy the caller made.
 * Messages between two members under one ticket match receives in the order they were sent.
 * `member` is a position in the group. */

/* 1 if this member copies device memory from every other member of g: it has told each of
 * them so (or does as soon as their connection is ready), so when every member says 1, all of
 * them may send each other device payloads. Known without a message; a member not yet
 * connected counts as not copied from. */
int pt_group_copies_device_memory(const pt_group *g);

/* 1 if `member` has said it copies this member's device memory and count floats are above the
 * transport's inline size: pt_group_send_device may send them; else send a host copy. */
int pt_group_takes_device_payload(const pt_group *g, int member, size_t count);

/* Sends count floats of device memory (the device work that wrote them finished) to `member`;
 * they stay untouched until the request completes, which the receiver's copy ends. */
pipert_result pt_group_send_device(pt_group *g, pt_group_ticket ticket, int member,
                                   const float *device, size_t count, pt_request **out);

/* Sends count floats of host memory to `member` (checksummed where the group is). */
pipert_result pt_group_send(pt_group *g, pt_group_ticket ticket, int member, const float *host,
                            size_t count, pt_request **out);

/* Receives count floats from `member` into `device`, or into `host` if they came as bytes
 * (pt_request_on_device says which); both hold count floats. */
pipert_result pt_group_recv_device(pt_group *g, pt_group_ticket ticket, int member, float *host,
                                   float *device, size_t count, pt_request **out);

#endif
