/* The job's layout: which (stage, replica) a rank is. rank = replica·stages +
 * stage, so the stages of one replica (a pipeline, which exchanges
 * activations every microbatch) hold consecutive ranks and land on one host
 * under block placement; replicas, which exchange less, spread across hosts.
 * The one place that computes it. */
#ifndef PT_LAYOUT_H
#define PT_LAYOUT_H

#include "runtime/error.h"

typedef struct pt_layout {
    int stages, replicas;
} pt_layout;

/* Fails unless world % stages == 0. */
pipert_result pt_layout_make(int world, int stages, pt_layout *out);
int pt_layout_rank(const pt_layout *l, int stage, int replica);
int pt_layout_stage(const pt_layout *l, int rank);
int pt_layout_replica(const pt_layout *l, int rank);

/* Every rank once, ranks[0..world), in a cycle whose neighbours (the last and
 * the first included) share a stage or a replica: a ring over the world that
 * uses only the connections a job has anyway (the stages of a replica, the
 * replicas of a stage, each a complete graph). */
void pt_layout_world_ring(const pt_layout *l, int *ranks);

/* The stage and replica of `rank` in a job of `world` ranks and `stages`
 * stages: pt_layout_make, then PIPERT_ERR_INVALID_ARG unless 0 <= rank < world. */
pipert_result pt_rank_layout(int rank, int world, int stages, int *stage, int *replica);

#endif
