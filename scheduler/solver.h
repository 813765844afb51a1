/* The placement solver: given sites of devices and the links between them,
 * chooses the stages S, the replicas R, the split of the blocks and the site
 * of every rank that maximise the predicted tokens/s of the configured
 * model under every device's memory, each candidate priced by the cost model
 * and run through the simulation (scheduler/simulate.h).
 *
 * The search (exact where it is small, a documented heuristic beyond):
 *   - S from 1 to min(L, the most devices of one site): a pipeline stays
 *     inside one site (its activations cross every microbatch; the coupling
 *     crosses sites once a step or less), unless `allow_spanning` — then one
 *     candidate per S also spans sites in order, the baseline to beat;
 *   - R: as many whole pipelines as the sites hold, halving down to 16,
 *     every R from 16 to 1, and what the fastest k sites hold together (a
 *     run of 1,024 devices in 8 sites tries ~30 values); each R packed (the fastest site filled first, so replicas that
 *     fit in one site couple over its fast link) and spread (round-robin over
 *     the sites);
 *   - the split of each candidate: a dynamic programme over (stage, blocks)
 *     that minimises the slowest stage on that pipeline's devices (uneven
 *     blocks for uneven devices), exact;
 *   - the configuration's schedule, microbatches and dp.method as given.
 * Every candidate is simulated for a few steps; the best `keep` are
 * returned, fastest first. */
#ifndef PT_SCHEDULER_SOLVER_H
#define PT_SCHEDULER_SOLVER_H

#include <stdbool.h>

#include "runtime/config.h"
#include "scheduler/cost.h"
#include "scheduler/simulate.h"

/* The devices of one site: all alike. */
typedef struct pt_solver_site {
    int devices;
    pt_cost_device device;
} pt_solver_site;

typedef struct pt_solver_input {
    const pipert_config *config;
    int n_sites;
    const pt_solver_site *sites;
    const pt_sim_link *links; /* [from·n_sites + to]; the diagonal is the link inside a site */
    int max_stages;           /* 0: the model's blocks */
    bool allow_spanning;      /* also try pipelines that span sites */
    int keep;                 /* best plans to return (≥ 1) */
} pt_solver_input;

typedef struct pt_solver_plan {
    int stages, replicas;
    int bounds[PT_PLAN_MAX_STAGES + 1]; /* blocks [bounds[s], bounds[s+1]) */
    int *site_of;                       /* [replica·S + stage] */
    bool spans_sites;
    double step_s, tokens_per_s;
    double peak_memory_bytes;           /* the fullest device's */
    double coupling_bytes_per_step;     /* a replica sends */
} pt_solver_plan;

typedef struct pt_solver_result {
    int n_plans;
    pt_solver_plan *plans; /* fastest first */
    int candidates;        /* simulated */
    int refused_memory;    /* did not fit */
} pt_solver_result;

/* Errors: no candidate fits in memory (naming the smallest need and the
 * largest device), a site without devices, a link without bandwidth. */
pipert_result pt_solve(const pt_solver_input *in, pt_solver_result *out);
void pt_solver_result_free(pt_solver_result *result);

/* The split of L blocks over S stages on devices of FLOP/s speed[s] that
 * minimises the slowest stage (each stage at least one block). */
pipert_result pt_solver_split(const pipert_config *config, int stages, const double *speed,
                              int *bounds);

/* The same, among the splits where stage s fits in memory[s] bytes (memory NULL, or an
 * entry ≤ 0: no limit), with the activations the schedule keeps (pt_cost_stage_memory at the
 * microbatches stage s holds at once). PIPERT_ERR_CONFIG when no split fits. */
pipert_result pt_solver_split_within(const pipert_config *config, int stages, const double *speed,
                                     const double *memory, int *bounds);

#endif
