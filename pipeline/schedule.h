/* Pipeline schedules as data (ALGORITHMS.md §3).
 *
 * A schedule is a pure function (kind, S stages, M microbatches, stage) → the
 * list of instructions that stage executes, in order. The executor only
 * dispatches them, so a schedule can be checked with no device and no network
 * by simulating every stage in one process (pt_schedule_simulate).
 *
 * Stage s runs, for microbatch m:
 *   forward:  (s = 0: LOAD_BATCH m | s > 0: RECV_ACTIVATION m) FORWARD m (s < S−1: SEND_ACTIVATION m)
 *   backward: (s < S−1: RECV_GRADIENT m) BACKWARD m (s > 0: SEND_GRADIENT m)
 * and OPTIMIZER_STEP where the schedule updates its weights. Messages are
 * matched by (kind, microbatch) between neighbouring stages, in one
 * deterministic global order — the cure for the send/recv-ordering hangs of
 * other pipeline engines.
 */
#ifndef PT_SCHEDULE_H
#define PT_SCHEDULE_H

#include <stdbool.h>

#include "pipert/pipert.h"
#include "runtime/settings.h"

typedef enum pt_instruction_kind {
    PT_LOAD_BATCH,
    PT_RECV_ACTIVATION,
    PT_FORWARD,
    PT_SEND_ACTIVATION,
    PT_RECV_GRADIENT,
    PT_BACKWARD,
    PT_SEND_GRADIENT,
    PT_OPTIMIZER_STEP,
    PT_INSTRUCTION_KINDS
} pt_instruction_kind;

typedef struct pt_instruction {
    pt_instruction_kind kind;
    int microbatch; /* −1 for OPTIMIZER_STEP */
} pt_instruction;

typedef struct pt_schedule {
    pt_schedule_kind kind;
    int stages, microbatches, stage;
    int synchronous; /* asynchronous 1F1B: its first microbatches that run alone (below) */
    pt_instruction *instructions;
    int count;
} pt_schedule;

/* "gpipe" | "1f1b" | "async-1f1b" */
pipert_result pt_schedule_parse_kind(const char *name, pt_schedule_kind *out);
const char *pt_schedule_kind_name(pt_schedule_kind kind);
const char *pt_instruction_name(pt_instruction_kind kind);

/* Microbatches whose activations stage `stage` of `stages` holds at once under `kind`: all of
 * a step's `microbatches` under GPipe, S − s under 1F1B and the asynchronous schedule (fewer
 * when the step has fewer; the asynchronous schedule's "step" is the run). One stage runs
 * 1F1B whatever the setting (plain gradient accumulation): one. */
int pt_schedule_in_flight(pt_schedule_kind kind, int stages, int stage, long microbatches);

/* The instructions of `stage` for one step of M microbatches (GPipe, 1F1B) or
 * for a run of M microbatches in total (asynchronous 1F1B, which never
 * flushes: its warm-up and drain happen once per run). */
pipert_result pt_schedule_build(pt_schedule *out, pt_schedule_kind kind, int stages,
                                int microbatches, int stage);

/* Asynchronous 1F1B whose first `synchronous` microbatches (at most M) each
 * pass forward through every stage and backward again before the next one
 * starts: those steps see no staleness (a delay-free optimizer's steps, at one
 * microbatch in flight), then the pipeline fills and runs as pt_schedule_build's.
 * 0 is pt_schedule_build's asynchronous schedule. */
pipert_result pt_schedule_build_async(pt_schedule *out, int stages, int microbatches, int stage,
                                      int synchronous);

/* The schedule `like` is, for another of its stages. */
pipert_result pt_schedule_build_for_stage(pt_schedule *out, const pt_schedule *like, int stage);
void pt_schedule_free(pt_schedule *schedule);

/* The bubble fraction of GPipe and 1F1B with equal stages: (S−1)/(M+S−1). */
double pt_schedule_bubble_formula(int stages, int microbatches);

/* Result of running every stage's list in one process with unit costs. */
typedef struct pt_simulation {
    bool deadlocked;       /* some stage waits on a message that never comes */
    double makespan;       /* time until the last stage finishes */
    double bubble;         /* idle fraction: 1 − busy / (stages · makespan) */
    char problem[256];     /* what went wrong, if anything */
} pt_simulation;

/* Simulates the S schedules (schedules[s] for stage s) with forward cost
 * `forward_cost`, backward cost `backward_cost`, instant messages and
 * receives that block until the matching send has happened. Checks that every
 * receive meets a send of the same (kind, microbatch) from the right
 * neighbour and that every send is received. */
pt_simulation pt_schedule_simulate(const pt_schedule *schedules, int stages, double forward_cost,
                                   double backward_cost);

#endif
