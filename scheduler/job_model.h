/* A job as the simulation sees it: from a placement (the stages' blocks, each
 * rank's device and site) and the links between sites, the priced input of
 * scheduler/simulate.h — what `pipert simulate` and the solver both build.
 *
 * Links. Two ranks in one site talk over the diagonal of `links` where it
 * has a bandwidth, else over `local`; in different sites over the cluster's link, and a pipeline
 * boundary, which carries activations one way and gradients the other, takes
 * the slower of its two directions. Bytes of every pipeline boundary that go from
 * one site to another wait in one queue, a queue per direction: pipelines that cross
 * between two sites share the link, and one whose stages run the other way round
 * sends its activations where the first sends its gradients (inside a site each
 * boundary has a queue per direction of its own). A stage's replicas couple over the
 * slowest hop of their ring — for a method that runs by sites (cost.h), the ring of
 * the sites' leaders, and each rank's step also pays its site's dense part; stages
 * whose slowest hop joins the same two sites share that link (one queue), and stages
 * whose replicas are all in one site share that site's link (the diagonal, else
 * `local`). Each rank's step also pays the method's own CPU work (cost.h). */
#ifndef PT_SCHEDULER_JOB_MODEL_H
#define PT_SCHEDULER_JOB_MODEL_H

#include "scheduler/cost.h"
#include "scheduler/simulate.h"

typedef struct pt_job_model_input {
    const pipert_config *config;
    const pt_stage_plan *plan;      /* S = plan->stages */
    int replicas;
    const pt_cost_device *devices;  /* [R·S]: each rank's device */
    const int *site_of;             /* [R·S], or NULL: every rank in one site */
    int n_sites;
    const pt_sim_link *links;       /* [n_sites²] between sites (may be NULL with one site) */
    pt_sim_link local;              /* inside a site */
    const int *device_of;           /* shared devices (simulate.h), or NULL */
    int n_devices;
    int steps;                      /* simulated steps; 0: 10 (flush), 12·S + 20 (async) */
} pt_job_model_input;

typedef struct pt_job_model {
    pt_sim_input in;
    pt_stage_cost *cost;          /* [R·S] */
    pt_sim_costs *times;          /* [R·S] */
    pt_sim_link *stage_links;     /* [R·(S−1)] */
    int *stage_queue;             /* [2·R·(S−1)]: bytes from one site to another share a queue */
    double *coupling_bytes;       /* [S] */
    int *link_of;                 /* [S] */
    int *members;                 /* [S]: who takes part in stage s's coupling (cost.h) */
    pt_sim_link *coupling_links;  /* [S + 1] */
    int (*link_pairs)[2];         /* [S + 1]: the sites each coupling link joins */
    double tokens_per_step;       /* of the whole job */
} pt_job_model;

pipert_result pt_job_model_build(const pt_job_model_input *in, pt_job_model *out);
void pt_job_model_free(pt_job_model *model);

/* The most memory a rank of the simulated job needs, and which rank. */
double pt_job_model_peak_memory(const pt_job_model *model, const pt_sim_result *result,
                                int *rank);

/* What a replica sends for the coupling per step, on every link together. */
double pt_job_model_coupling_bytes_per_step(const pt_job_model *model,
                                            const pt_sim_result *result);

#endif
