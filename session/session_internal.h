/* The session's state, shared by its files (session.c runs it, outputs.c
 * writes what it reports, checkpoint.c saves and restores it). */
#ifndef PT_SESSION_INTERNAL_H
#define PT_SESSION_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "dp/coupling.h"
#include "pipeline/executor.h"
#include "pipeline/plan.h"
#include "pipert/pipert.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/metrics.h"
#include "runtime/trace.h"
#include "session/coordinator_loss.h"
#include "session/departures.h"
#include "session/elastic.h"
#include "session/job.h"

struct pipert_session {
    pipert_config config;
    pipert_session_options options;
    char out_dir[PT_CONFIG_STRING_MAX];
    pt_log_sink log_sink;
    int threads;
    const pt_kernels *kernels; /* of runtime.device: where the stage's tensors live */
    pt_device_memory device_memory; /* its peer functions, handed to the transport (device.c) */

    pt_job job;
    pt_coupling *coupling;
    pt_stage_executor *executor;
    pt_trace *trace;

    pt_metrics metrics;       /* metrics.jsonl: the last stage of replica 0 (of the first
                               * replica in the job, after replicas left) */
    pt_metrics stage_metrics; /* metrics-stage-N.jsonl: replica 0 of a multi-worker job */
    bool writes_outputs;      /* the last stage of replica 0: it has the loss */
    double window_started;    /* tokens/s over the logging window */
    double run_started;       /* wall clock of this process's first step (metrics' elapsed_s) */
    double elapsed_before;    /* a resumed run: elapsed_s of its last line kept */
    double tokens_per_step;   /* of the whole job: every replica's batch */
    long window_steps;
    double reported_at;       /* the last progress report to the coordinator */

    pthread_mutex_t lock;     /* guards `latest` for readers on other threads */
    pipert_metrics latest;
    bool finished;

    atomic_int stop_requested;
    atomic_int abort_requested;   /* pipert_session_abort: tell the job, with abort_reason */
    char abort_reason[512];
    atomic_int failed;        /* the job ended asynchronously (abort, dead peer) */

    pt_elastic_state elastic;  /* elastic replicas (elastic.c) */
    pt_kept_buffers kept;      /* of abandoned collectives (departures.c) */
    pt_coordinator_vote vote;  /* the workers' vote on a lost coordinator (coordinator_loss.c) */
    long stopped_at;          /* > 0: stopped after this step, the coordinator lost */
};

/* Replicas coming back (join.c). The donor's side: this stage's state now,
 * to `rank` of a replica coming back, tagged with the switch's epoch. */
pipert_result pt_session_send_state(pipert_session *s, int rank, long epoch);
/* The joiner's side: waits for a switch that lets its replica in and takes the donor's state
 * (of step news->switch_step), until every stage of its replica has (elastic.c regroups). */
pipert_result pt_session_take_running_state(pipert_session *s, pt_membership_news *news);
/* Every stage's blocks in this run (checkpoint.c): bounds[s], bounds[s+1]. */
pipert_result pt_session_stage_bounds(pipert_session *s, int *bounds);
/* The same as this job's settings make it (stage_plan.c: plan.layers or the balanced split;
 * the job digest makes every rank's the same), without asking the other stages; and this
 * worker's own stage's. */
pipert_result pt_session_stage_plan(const pipert_session *s, int stages, pt_stage_plan *plan);
pipert_result pt_session_planned_bounds(const pipert_session *s, int *bounds);
pipert_result pt_session_stage_blocks(const pipert_session *s, int *first, int *last);

/* metrics.jsonl and metrics-stage-N.jsonl (outputs.c). */
pipert_result pt_session_open_outputs(pipert_session *s, long resumed_step);
pipert_result pt_session_write_step(pipert_session *s, const pt_pipeline_step *step,
                                    double tokens_per_s);
pipert_result pt_session_write_validation(pipert_session *s, long step, float val_loss);
void pt_session_close_outputs(pipert_session *s);
/* After a regroup: metrics.jsonl moves to the first replica in the job. */
pipert_result pt_session_hand_over_outputs(pipert_session *s, long step);

/* Checkpoints (checkpoint.c): every stage of replica 0 writes its slice, and
 * so does every other replica when the coupling lets replicas drift; the
 * step's index makes the checkpoint complete. */
pipert_result pt_session_save_checkpoint(pipert_session *s, long step);
/* Restores the newest complete checkpoint of out_dir; *step is its step. */
pipert_result pt_session_resume(pipert_session *s, long *step);

/* The checksum of this stage's parameters (device.c), read through a host copy where the
 * host cannot read the kernels' memory: logs compare replicas, and GPU runs with CPU runs. */
pipert_result pt_session_params_checksum(pipert_session *s, unsigned long long *out);

/* device.c: the kernel table of runtime.device for this worker's stage (blocks [first,
 * last)): on cuda its GPU and an arena sized from the stage's needs; and those needs, in
 * bytes of device memory, by the cost model. */
pipert_result pt_session_choose_kernels(pipert_session *s, int first, int last);
pipert_result pt_session_stage_memory(const pipert_session *s, int first, int last, double *bytes);
/* device.c: hands the transport the table's functions for memory peers of this host copy from
 * (none for a table the host reads, or without a transport). */
void pt_session_share_device_memory(pipert_session *s);
/* device.c: logs how much of its GPU memory the stage used at most (cuda; nothing elsewhere). */
void pt_session_report_device_memory(const pipert_session *s);

#endif
