/* A discrete-event simulation of a training job: R replicas of an S-stage
 * pipeline, each rank running the instruction list the executor runs
 * (pipeline/schedule.h: the same data, not a formula), links as resources
 * that queue, and the replicas' coupling as collectives over links of their
 * own.
 *
 * Time. Every rank has a clock. Events are taken in global time order (a heap
 * of ranks by clock), one instruction at a time, so a link shared by several
 * senders serves them in the order they really send:
 *   LOAD_BATCH                  instant;
 *   FORWARD, BACKWARD           the rank's device is busy for its cost (ranks
 *                               that share a device take turns: a compute
 *                               starts when the device is free);
 *   SEND_ACTIVATION/_GRADIENT   the message queues on the link to the
 *                               neighbour (one resource per direction): it
 *                               starts when the link is free, holds it for
 *                               bytes / bandwidth, and arrives a latency
 *                               later; the sender goes on at once;
 *   RECV_*                      waits until the message has arrived;
 *   OPTIMIZER_STEP              busy for its cost; then the coupling (below).
 *
 * Coupling. After optimizer step k (1-based) with k % every == 0, the rank
 * posts its part of the stage's collective k. The collective starts when
 * every replica of the stage posted and its link is free, holds the link for
 * bytes / bandwidth and ends hops · latency later (the next collective on
 * the link may start sending meanwhile). A rank may finish step k only once
 * collective k − lag has ended (lag 0: a blocking all-reduce; lag > 0: an
 * exchange that runs beside `lag` steps of training, as sparse, streaming
 * DiLoCo or CO2 do).
 *
 * Memory. A stage holds the activations of every microbatch between its
 * forward and its backward; the simulation reports the most at once.
 */
#ifndef PT_SCHEDULER_SIMULATE_H
#define PT_SCHEDULER_SIMULATE_H

#include <stdbool.h>

#include "pipeline/schedule.h"
#include "runtime/trace.h"

typedef struct pt_sim_link {
    double bytes_per_s; /* > 0 */
    double latency_s;   /* one way, ≥ 0 */
} pt_sim_link;

/* What one rank's instructions cost, in seconds. */
typedef struct pt_sim_costs {
    double forward_s, backward_s; /* one microbatch */
    double optimizer_s;           /* one optimizer step */
} pt_sim_costs;

typedef struct pt_sim_coupling {
    int every;           /* a collective after every this many steps; 0: none */
    int lag;             /* steps it may run beside (0: blocking) */
    int hops;            /* latencies it pays, e.g. 2(R−1) for a ring all-reduce */
    /* Optional: [S] how many take part in stage s's collective (each sends bytes[s]; it pays
     * 2·(members[s] − 1) latencies, a ring's, instead of hops); NULL: every replica. */
    const int *members;
    const double *bytes; /* [S]: bytes the busiest member of stage s sends per collective */
    const int *link_of;  /* [S]: index into links: stages with one index share that link */
    const pt_sim_link *links;
    int n_links;
} pt_sim_coupling;

typedef struct pt_sim_input {
    pt_schedule_kind kind;
    int stages, replicas;
    int microbatches; /* per optimizer step (flush schedules) */
    int steps;        /* optimizer steps to simulate (≥ 2) */
    const pt_sim_costs *costs;      /* [replica·S + stage] */
    /* Optional: [R·S] the device each rank computes on (ranks on one device
     * take turns), n_devices of them; NULL: a device per rank. */
    const int *device_of;
    int n_devices;
    const pt_sim_link *stage_links; /* [replica·(S−1) + s]: between stage s and s+1, each direction */
    /* Optional: [2·(replica·(S−1) + s) + d] the queue, in [0, 2·R·(S−1)), that boundary s's
     * messages wait in: d = 0 the activations (stage s to s+1), d = 1 their gradients (back).
     * Messages that share a queue share its bandwidth (pipelines crossing between the same
     * two sites in the same direction); NULL: 2·(replica·(S−1) + s) + d, a queue per boundary
     * and direction. */
    const int *stage_queue;
    double activation_bytes;        /* one microbatch's activations (and, back, their gradients) */
    pt_sim_coupling coupling;
    /* Optional: [R·S] traces, one per rank, that get the simulated spans
     * (times from trace_origin_us). */
    pt_trace **traces;
    double trace_origin_us;
} pt_sim_input;

typedef struct pt_sim_rank_result {
    double busy_s;         /* computing (forward, backward, optimizer) */
    double bubble;         /* 1 − busy / the rank's elapsed time */
    double wait_coupling_s; /* blocked on the coupling */
    int peak_activations;  /* microbatches held at once */
    double bytes_sent;     /* to pipeline neighbours */
} pt_sim_rank_result;

typedef struct pt_sim_result {
    double step_s;     /* steady state: seconds per optimizer step (mean over the middle half), the slowest rank's */
    double makespan_s; /* until the last rank ends */
    pt_sim_rank_result *ranks; /* [R·S], owned: pt_sim_result_free */
    double *coupling_link_bytes; /* [n_links]: bytes the coupling put on each link */
} pt_sim_result;

/* Runs the simulation. Errors (PIPERT_ERR_INVALID_ARG): a link without
 * bandwidth, fewer than 2 steps, a schedule that deadlocks (named: the rank
 * and the instruction it waits at). */
pipert_result pt_simulate(const pt_sim_input *in, pt_sim_result *out);
void pt_sim_result_free(pt_sim_result *result);

#endif
