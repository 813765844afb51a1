/* The session's state, shared by its files (session.c runs it, outputs.c
 * writes what it reports, checkpoint.c saves and restores it). */
#ifndef PT_SESSION_INTERNAL_H
#define PT_SESSION_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "dp/coupling.h"
#include "pipeline/executor.h"
#include "pipert/pipert.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/metrics.h"
#include "runtime/trace.h"
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

    struct {                  /* elastic replicas (elastic.c) */
        long acked_epoch;     /* the newest departure acknowledged */
        long ack_step;        /* the steps taken when it was */
        long regrouped_epoch; /* the departure the coupling's groups reflect */
        int absent;           /* replicas out of the job now */
        long joined_at;       /* a joiner: the step its state is of (0: started with the job) */
        long taking_switch;   /* a joiner: the switch whose state it takes now (0: none); a
                               * newer change stops its waits (session.c should_stop) */
        double paused_us;     /* trace clock when the coupling paused */
        double tokens_lost;   /* the batches the replicas that left did not train */
        void **kept;          /* buffers of abandoned collectives, freed after leaving the job */
        int n_kept;
    } elastic;
    /* coordinator_loss.c: the workers' vote on whether the coordinator is gone */
    pt_allreduce_handle *loss_vote; /* in flight since step loss_vote_step */
    float *loss_vote_value;         /* its buffer (kept to the end if abandoned) */
    long loss_vote_step;
    long loss_vote_groups;          /* elastic.regrouped_epoch when it started */
    bool loss_logged;
    long reconnections_logged; /* registrations with a coordinator started again, logged */
    long stopped_at;          /* > 0: stopped after this step, the coordinator lost */
};

/* Elastic replicas (elastic.c): at a step boundary, acknowledges departures,
 * waits for the switch when the margin ran out, and regroups at the switch. */
pipert_result pt_session_follow_membership(pipert_session *s);
/* Whether replicas left after departure `epoch` (waiting a while for the
 * coordinator's word, which may come after a peer was found dead). */
bool pt_session_departures_since(pipert_session *s, long epoch);
/* Keeps a buffer that an abandoned collective may still write until the
 * session ends (pt_session_free_kept, after the transport is gone). */
pipert_result pt_session_keep_until_end(pipert_session *s, void *buffer);
void pt_session_free_kept(pipert_session *s);
/* For the coupling's waits (pt_coupling_options.membership_changed). */
bool pt_session_membership_changed(void *context);

/* Regroups at the switch `news` announced (elastic.c): connects to replicas
 * coming back and, on the donor, gives them their state; then the new
 * groups and the coupling over them. */
pipert_result pt_session_switch_groups(pipert_session *s, const pt_membership_news *news);
/* Replicas coming back (join.c). The donor's side: this stage's state now,
 * to `rank` of a replica coming back, tagged with the switch's epoch. */
pipert_result pt_session_send_state(pipert_session *s, int rank, long epoch);
/* The joiner's side, in place of resuming: waits for the switch, takes the
 * donor's state of step *step, and regroups with the others. */
pipert_result pt_session_join_running(pipert_session *s, long *step);
/* Every stage's blocks in this run (checkpoint.c): bounds[s], bounds[s+1]. */
pipert_result pt_session_stage_bounds(pipert_session *s, int *bounds);
/* The same as this job's settings make it (plan.layers or the balanced split; the job digest
 * makes every rank's the same), without asking the other stages. */
pipert_result pt_session_planned_bounds(const pipert_session *s, int *bounds);

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

/* After every step (coordinator_loss.c): *stop says whether every rank agreed,
 * at this step, to stop after it because the coordinator is lost. */
pipert_result pt_session_coordinator_vote(pipert_session *s, long step, bool *stop);
/* A vote in flight is given up (before the job is left). */
pipert_result pt_session_coordinator_vote_abandon(pipert_session *s);

/* The checksum of this stage's parameters (session.c), read through a host copy where the
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
