/* What the collectives' files share (collectives.c, allreduce.c): a group's
 * insides, and the messages of one collective. Not for users of
 * collectives.h. */
#ifndef PT_COLLECTIVES_INTERNAL_H
#define PT_COLLECTIVES_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "comm/collectives.h"
#include "runtime/safetensors.h" /* pt_dtype */

#define MESSAGE_CAPACITY 512

struct pt_group {
    pt_transport *t;
    int size, index; /* members; this process's position */
    int *ranks;      /* [size] transport ranks */
    uint32_t id;
    int checksum;
    atomic_uint sequence; /* of the next collective */
    bool (*interrupted)(void *context);
    void *context;
};

/* One collective's identity: its tag (group id | sequence) and its name for
 * errors. Every message of a collective carries its tag, so messages between
 * two members match receives in the order they were sent. */
typedef struct collective {
    pt_group *g;
    uint32_t sequence, tag;
    char name[64];
} collective;

collective pt_collective_at(pt_group *g, uint32_t sequence, const char *what);
/* The group's next sequence number. */
collective pt_collective_begin(pt_group *g, const char *what);

/* The member at position `index` modulo the group's size. */
int pt_group_member(const pt_group *g, int index);

/* Posts the send of `count` elements of `dtype` to member `to` (any integer,
 * taken modulo the size); `step` goes into the header (microbatch) to help
 * whoever reads a trace. Errors are prefixed with the collective's name. */
pipert_result pt_collective_post_send(const collective *c, int to, const void *data, size_t count,
                                      pt_dtype dtype, int step, pt_request **out);
pipert_result pt_collective_post_recv(const collective *c, int from, void *data, size_t count,
                                      pt_dtype dtype, pt_request **out);

/* The CLOCK_REALTIME instant timeout_s from now, for pthread_cond_timedwait. */
struct timespec pt_collective_deadline_after(double timeout_s);

#endif
