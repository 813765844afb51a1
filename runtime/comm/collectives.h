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
#include <stdint.h>

#include "runtime/comm/transport.h"

typedef struct pt_group pt_group;

typedef struct pt_group_options {
    uint32_t id;  /* 0..255: tells apart groups that share members */
    int checksum; /* checksum every message (pt_checksum64) */
} pt_group_options;

#define PT_GROUP_OPTIONS_INIT                                                                      \
    {                                                                                              \
        .id = 0, .checksum = 0                                                                     \
    }

/* ranks[0..n_ranks) are transport ranks, distinct, and include this process's
 * rank; a member's index in the group is its position in `ranks`. */
pipert_result pt_group_create(pt_transport *t, const int *ranks, int n_ranks,
                              const pt_group_options *options, pt_group **out);
void pt_group_destroy(pt_group *g);
int pt_group_size(const pt_group *g);
int pt_group_index(const pt_group *g); /* this process's index */

/* Returns once every member has entered the barrier (dissemination, ceil(log2 n) rounds). */
pipert_result pt_barrier(pt_group *g);

/* Copies root_index's `buffer` (nbytes) into every member's `buffer` (binomial tree). */
pipert_result pt_broadcast(pt_group *g, void *buffer, size_t nbytes, int root_index);

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

#endif
