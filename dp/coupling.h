/* The coupling of a stage's replicas: the seam between the stage executor
 * (pipeline/) and the data-parallel methods (ALGORITHMS.md §4).
 *
 * The executor calls its stage's coupling at two fixed points of every
 * optimizer step, and knows nothing else about it:
 *   after_backward  the step's gradient is complete and not yet clipped: a
 *                   method that averages gradients does it here (and may
 *                   average the step's loss for reporting);
 *   after_step      the optimizer has made a new weight version: a method
 *                   that averages parameters reads or overwrites θ here, and
 *                   the newest weight stash when the schedule keeps one
 *                   (§4.2: after a sparse update that stash is overwritten).
 * A method may start non-blocking work at one call and finish it at a later
 * one.
 *
 * Sites (session/job.h). When the replicas of a stage are in more than one
 * site, a method that couples parameters runs among the sites' leaders only
 * (one exchange per site crosses the slow links); the replicas of one site
 * average their gradients densely every step over their fast link, and after
 * the method's step the leader's parameters are broadcast in its site, so a
 * site's replicas stay equal. A method that is itself dense (allreduce) runs
 * over all replicas, in a ring ordered by site. It reports what it sent and how long the step waited for it, and saves
 * and restores its own state in checkpoints. Adding a method is a new file in
 * dp/, one line in the method table (coupling.c) and its name among
 * dp.method's values (runtime/config_schema.c's schema checks it); it never touches the
 * executor, nor the cost model, which prices it from its row (traffic,
 * param_copies, host_share below).
 */
#ifndef PT_COUPLING_H
#define PT_COUPLING_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "models/gpt.h"
#include "comm/collectives.h"
#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "runtime/trace.h"

/* What the executor shows the coupling at a call point. */
typedef struct pt_coupling_point {
    const pt_gpt_slice *model; /* tensor names and offsets of this stage */
    float *params;             /* θ [n_params] */
    float *grads;              /* after_backward: the step's gradient, before clipping */
    size_t n_params;
    float *newest_stash;       /* after_step: the newest stashed weights [n_params], or NULL */
    long step;                 /* the optimizer step being taken (1-based) */
    float *loss;               /* the step's mean loss (last stage), else NULL */
} pt_coupling_point;

/* Per step, reset by pt_coupling_take_metrics. */
typedef struct pt_coupling_metrics {
    const char *method;
    double bytes_sent; /* payload bytes this worker sent for coupling (in its site too) */
    double wait_ms;    /* the step was blocked on the replicas (dp/wait.c) */
    double delay;      /* steps between sending an exchange and applying it */
} pt_coupling_metrics;

/* Time the coupling spent blocked on the replicas, since it was created:
 * wall time and the process's CPU time meanwhile (transport threads). */
typedef struct pt_coupling_blocked {
    double wall_s, cpu_s;
} pt_coupling_blocked;

typedef struct pt_coupling_options {
    const pipert_config *config;
    const pt_kernels *kernels;
    pt_group *replicas;      /* the replicas of this stage (ordered by site); NULL with one */
    pt_group *site_replicas; /* the replicas of this stage in this site; NULL: alone there */
    pt_group *leaders;       /* sites > 1, on each site's first replica: the sites' leaders */
    int sites;               /* sites the replicas of this stage are in (1: no hierarchy) */
    int stage, replica;
    /* Exchanges that run in the background are drawn as "exchange" spans,
     * from posting to the step that takes the result (NULL: no trace). */
    pt_trace *trace;
    /* Asked while a call waits for the network: true ends the wait with
     * PIPERT_ERR_INTERRUPTED (a stop request, a job-wide abort). */
    bool (*should_stop)(void *context);
    void *context;
    /* Elastic replicas: asked while a call waits; true when replicas left the
     * job since the coupling last regrouped, so what is in flight will never
     * complete (NULL: never). */
    bool (*membership_changed)(void *context);
    /* Where the waits add their time (pt_coupling_create points it at the
     * coupling's own count: callers leave it NULL). */
    pt_coupling_blocked *blocked;
} pt_coupling_options;

/* What a method sends under a configuration, for the cost model (scheduler/cost.c): a
 * collective every `every` optimizer steps (0: it never sends), applied `lag` steps after it
 * was posted, carrying `share` of the stage's parameters. */
typedef struct pt_coupling_traffic {
    int every, lag;
    double share;
} pt_coupling_traffic;

/* One method: its calls get the state its create returned. Beside its calls it states the
 * facts the rest of pipert asks of a method (the executor, checkpoints, the cost model), so
 * that a new method is a new file and a line in the table (and its name in the configuration's
 * schema), `pipert plan` included. */
typedef struct pt_coupling_method {
    const char *name;
    /* Runs over every replica even across sites (a dense method); false: the
     * sites' leaders run it and each site averages densely inside. */
    bool over_all_replicas;
    /* Keeps every replica's parameters, optimizer and state bitwise equal
     * (allreduce), so a checkpoint holds replica 0's files only and every
     * replica resumes from them. false (the default of a new method): the
     * replicas drift apart, each replica writes a file of its own
     * (session/checkpoint.c) and resumes from it. */
    bool replicas_identical;
    /* Where the method reads the tensors it is shown. The kernels' memory may
     * be out of the host's reach (cuda, cpu-guarded: kernels.h,
     * host_accessible); a method either moves data with the table's copies
     * itself (both false), or says what it reads and writes with the host, and
     * the coupling hands it host copies of those and copies them back:
     *   host_gradients  after_backward: at->grads (the mean of allreduce);
     *   host_parameters after_step: at->params and at->newest_stash.
     * A method without replicas to exchange with (options.replicas NULL) must leave both
     * alone: it is then handed the kernels' memory, uncopied. */
    bool host_gradients, host_parameters;
    /* OPTIONAL, for a method with host_gradients: true while it averages the kernels' memory
     * itself after all (allreduce between replicas that copy each other's device memory);
     * asked at every after_backward. Such a mean cut short by a departure may leave the
     * gradient partly averaged, which only a method with replicas_identical may do (the
     * survivors are made equal when they regroup). */
    bool (*gradients_on_device)(void *state);
    /* What the cost model charges it:
     *   traffic       its exchanges under `config` (NULL: it sends nothing);
     *   param_copies  parameter-sized buffers of its own (θ̃, momentum, an average),
     *                 device_param_copies of them in a GPU's memory (the rest are host
     *                 memory there; on a CPU all are);
     *   device_share  floats per stage element it keeps in a GPU's memory besides those
     *                 copies (NULL: none);
     *   host_share    the share of a stage's elements the host works through each step,
     *                 priced at the device's sparse_cpu_s_per_element (NULL: none). */
    void (*traffic)(const pipert_config *config, pt_coupling_traffic *out);
    int param_copies, device_param_copies;
    double (*device_share)(const pipert_config *config);
    double (*host_share)(const pipert_config *config);
    pipert_result (*create)(const pt_coupling_options *options, void **state);
    pipert_result (*after_backward)(void *state, pt_coupling_point *at, pt_coupling_metrics *m);
    pipert_result (*after_step)(void *state, pt_coupling_point *at, pt_coupling_metrics *m);
    /* The parameters validation evaluates (DiLoCo: the outer θ̃), or NULL
     * for θ itself; may be NULL. */
    const float *(*eval_params)(void *state);
    /* Adds the method's state to a checkpoint under names "dp.*", and reads
     * it back (NULL: the method keeps no state). */
    pipert_result (*save)(void *state, pt_safetensors_writer *w);
    pipert_result (*load)(void *state, const pt_safetensors *st, const char *path);
    void (*destroy)(void *state);
    /* Elastic replicas (comm/membership.h). suspend: replicas left;
     * forget what is in flight (never reusing its buffers: a late message may
     * still land in them) and average nothing until regroup. regroup: go on
     * with options' groups, the survivors' and any replica coming back, at the
     * same step on each of them (it may run collectives on the new groups; `at`
     * is the stage's model and θ then, for a method that has not started yet:
     * a replica coming back has only loaded its state). NULL: the method
     * cannot go on after a departure, and the job stops. */
    void (*suspend)(void *state);
    pipert_result (*regroup)(void *state, const pt_coupling_options *options,
                             const pt_coupling_point *at);
} pt_coupling_method;

typedef struct pt_coupling pt_coupling;

/* The method whose dp.method value is `value` (pipert_config's dp.method): the library's, or
 * one added with pt_coupling_add_method. NULL, with a PIPERT_ERR_CONFIG naming the known ones,
 * if none is. */
const pt_coupling_method *pt_coupling_method_of(int value);

/* Makes `method` known by its name beside the library's, for a program that links the
 * library's parts (an experiment, a test): call it before any session or plan looks the
 * name up; it is not synchronized. Configurations read afterwards accept the name as
 * dp.method (pt_config_allow_choice). PIPERT_ERR_CONFIG if the name is taken,
 * PIPERT_ERR_UNSUPPORTED past PT_COUPLING_ADDED_MAX. */
#define PT_COUPLING_ADDED_MAX 8
pipert_result pt_coupling_add_method(const pt_coupling_method *method);

/* The method config->dp.method names; an unknown name is a PIPERT_ERR_CONFIG
 * listing the known ones. */
pipert_result pt_coupling_create(const pt_coupling_options *options, pt_coupling **out);
void pt_coupling_free(pt_coupling *c);

pipert_result pt_coupling_after_backward(pt_coupling *c, pt_coupling_point *at);
pipert_result pt_coupling_after_step(pt_coupling *c, pt_coupling_point *at);
pipert_result pt_coupling_save(pt_coupling *c, pt_safetensors_writer *w);
pipert_result pt_coupling_load(pt_coupling *c, const pt_safetensors *st, const char *path);

/* Elastic replicas. After a departure the coupling averages nothing (its
 * calls return at once) until it regroups over the survivors' groups
 * (options' replicas, site_replicas, leaders and sites). A call that was
 * waiting when replicas left returns PIPERT_OK having averaged nothing: its
 * gradient is this replica's own (after_backward works on a copy while the
 * job is elastic, so a collective cut short never leaves it half-reduced), or,
 * for a mean in device memory (gradients_on_device), partly averaged. */
void pt_coupling_set_elastic(pt_coupling *c, bool elastic);
void pt_coupling_suspend(pt_coupling *c);
bool pt_coupling_suspended(const pt_coupling *c);
pipert_result pt_coupling_regroup(pt_coupling *c, const pt_coupling_options *groups,
                                  const pt_coupling_point *at);

/* Blocked time since the coupling was created (utilisation: the difference
 * across a call is the part of it that was waiting, the rest computing). */
pt_coupling_blocked pt_coupling_blocked_time(const pt_coupling *c);

/* The metrics gathered since the last call, which starts a new period. */
pt_coupling_metrics pt_coupling_take_metrics(pt_coupling *c);

/* What validation evaluates: the method's parameters [n_params], or NULL for θ. */
const float *pt_coupling_eval_params(const pt_coupling *c);
const char *pt_coupling_method_name(const pt_coupling *c);
/* The method's replicas_identical. */
bool pt_coupling_replicas_identical(const pt_coupling *c);

#endif
