/* Where a stage's wall time goes, step by step: computing, waiting for a
 * pipeline neighbour, or inside the coupling of the replicas; and the bytes
 * it sent inside its site and to other sites.
 *
 * Computing is measured by CPU time, not by wall time between spans (as the
 * bubble fraction is): with more workers than cores a worker that waits for a
 * core is not computing. For a step of wall time W on T compute threads:
 *   compute        = (process CPU time of the step − CPU time during waits) / (T·W)
 *   wait_pipeline  = wall time blocked on a neighbour's message or a send's completion / W
 *   wait_coupling  = wall time the coupling was blocked on the replicas / W
 * and 1 − their sum is the rest (descheduled, runtime overhead). The CPU time
 * is the process's (CLOCK_PROCESS_CPUTIME_ID): transport threads moving bytes
 * during a wait count toward the wait, outside one toward compute, which is
 * capped at 1 − the waits. The coupling's own work (encoding, averaging,
 * outer steps) is computing: only its waits for the network (dp/wait.c) are
 * waiting. */
#ifndef PT_PIPELINE_UTILISATION_H
#define PT_PIPELINE_UTILISATION_H

#include <stdint.h>

#include "comm/transport.h"

typedef struct pt_utilisation {
    double compute, wait_pipeline, wait_coupling; /* shares of the step's wall time */
    double bytes_site, bytes_wan;                 /* sent in the step: same site, other sites */
} pt_utilisation;

typedef struct pt_utilisation_meter {
    double started_wall, started_cpu;
    double pipeline_wall, pipeline_cpu, coupling_wall, coupling_cpu;
    uint64_t sent_local, sent_remote; /* the transport's counters at the start */
} pt_utilisation_meter;

/* A wait in progress. */
typedef struct pt_utilisation_mark {
    double wall, cpu;
} pt_utilisation_mark;

/* A step starts now (transport may be NULL: nothing is sent). */
void pt_utilisation_start(pt_utilisation_meter *m, pt_transport *transport);

pt_utilisation_mark pt_utilisation_mark_now(void);
/* The interval since `mark` was a wait for a neighbour. */
void pt_utilisation_add_pipeline_wait(pt_utilisation_meter *m, pt_utilisation_mark mark);
/* The coupling was blocked for this wall and process CPU time. */
void pt_utilisation_add_coupling_wait(pt_utilisation_meter *m, double wall_s, double cpu_s);

/* The step that started at pt_utilisation_start ends now; the meter starts
 * the next one. */
pt_utilisation pt_utilisation_finish(pt_utilisation_meter *m, pt_transport *transport, int threads);

#endif
