/* A worker's membership in a job: who it is (rank, stage, replica), how it
 * got there (the environment of a launcher, the host program's out-of-band
 * allgather, or alone), the control path (the coordinator) and the data
 * plane (the transport and the groups of its stage and of its replica).
 *
 *   launcher  rank from pipert launch / SLURM / Open MPI / PMI
 *             (comm/bootstrap.h); the coordinator does rendezvous,
 *             heartbeats, job-wide abort and progress.
 *   oob       the host program's allgather exchanges the job's secret and
 *             every rank's transport address; no coordinator, no
 *             environment; a dead peer is noticed by the transport.
 *   alone     one worker, no network at all.
 *
 * Sites. Replicas may live in different sites, joined by slow links. The
 * replicas of a stage learn each other's site once they are connected; their
 * group is ordered by site (a ring then crosses each site boundary once),
 * the replicas of one site form a site group (dense averaging over the fast
 * link), and the first replica of each site joins the leaders' group (the
 * only one whose traffic crosses between sites for the asynchronous methods).
 */
#ifndef PT_SESSION_JOB_H
#define PT_SESSION_JOB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "pipert/pipert.h"
#include "comm/bootstrap.h"
#include "comm/collectives.h"
#include "comm/coordinator.h"
#include "comm/layout.h"
#include "comm/transport.h"

typedef enum pt_job_mode { PT_JOB_ALONE, PT_JOB_LAUNCHER, PT_JOB_OOB } pt_job_mode;

typedef struct pt_job {
    pt_job_mode mode;
    int rank, world;
    pt_layout layout;
    int stage, replica;
    pt_bootstrap boot;            /* launcher mode */
    pt_coordinator *coordinator;  /* launcher mode, rank 0 under SLURM/MPI */
    pt_coord_client *client;      /* launcher mode */
    char **addresses;             /* every rank's data-plane address ([world]) */
    pt_transport *transport;      /* world > 1 */
    pt_group *replica_group;      /* the replicas of this stage (replicas > 1), ordered by site */
    pt_group *stage_group;        /* the stages of this replica (stages > 1) */
    int site;                     /* this worker's site (PIPERT_SITE, or the session's option) */
    int sites;                    /* sites the replicas of this stage are in */
    pt_group *site_group;         /* the replicas of this stage in this site (more than one) */
    pt_group *leaders_group;      /* sites > 1, on each site's first replica: the leaders */
    bool elastic;                 /* replicas may leave (PIPERT_MIN_REPLICAS below the replicas) */
    int min_replicas;             /* PIPERT_MIN_REPLICAS (0: unset) */
    long groups_epoch;            /* the membership epoch the groups were formed at */
    bool regrouped;               /* formed at a switch (a joiner: its own) */
    int *replica_sites;           /* [replicas]: each replica's site (replicas > 1) */
    bool *replica_left;           /* [replicas]: left the job, as of the last regroup */
    long *admitted;               /* [replicas]: the join epoch of each replica's processes this
                                   * rank is connected to or made room for (0: the first ones) */
    _Atomic long *room_made;      /* [replicas]: the join epoch whose old process the client's
                                   * thread dropped as soon as it heard of the join */
    atomic_bool makes_room;       /* a joiner until it is in: the client's thread does that */
    bool listening;               /* UCX's listeners take new connections (a joiner until it is
                                   * in, a survivor between admitting joiners and settling) */
    pt_group **retired;           /* groups replaced after replicas left (kept until leaving) */
    int n_retired;
    pt_group *world_group;        /* every rank, under pipert launch (world > 1): agreeing
                                   * on a stop when the coordinator is lost */
    bool authenticate_messages;   /* set before joining: a MAC on every transport message */
    pt_job_identity identity;     /* set before joining: the build and settings every rank must
                                   * match (runtime/job_digest.h), told the coordinator and peers */
    long dropped_logged;          /* coordinator lines dropped (sealed wrong) and logged so far */
    bool joining;                 /* set before joining: this process takes the place of a rank
                                   * of a replica that left (session/join.c); cleared once in */
    int replacement_rank;         /* set before joining, with joining: the rank a process started
                                   * apart from the job takes (replacement_world > 0) */
    int replacement_world;
    bool (*should_stop)(void *context); /* asked while joining */
    void *context;
} pt_job;

/* Joins the job: `oob` when given, else the launcher's environment `envp`
 * when it names one, else alone (`alone` forces that). site ≥ 0 says this
 * worker's site; −1 takes PIPERT_SITE from the environment (0 when unset). */
pipert_result pt_job_join(pt_job *job, int stages, int site, const pipert_oob *oob,
                          const char *const *envp, bool alone);

/* Leaves the job: closes the data plane, the coordinator connection and the
 * coordinator this process hosts. Safe on a partly joined job. */
void pt_job_leave(pt_job *job);

/* PIPERT_ERR_PEER naming the rank when the job was aborted, or when this
 * worker's replica left it. */
pipert_result pt_job_check(pt_job *job);
bool pt_job_aborted(pt_job *job);

/* Elastic replicas (comm/membership.h). What this worker heard of
 * departures and switches (all zero without a coordinator). */
void pt_job_membership(pt_job *job, pt_membership_news *news);
/* Tells the coordinator this survivor heard of departure `epoch` after `step`. */
pipert_result pt_job_acknowledge(pt_job *job, long epoch, long step);
/* A joiner: its stage is built; the coordinator may let its replica back in. */
pipert_result pt_job_ready_to_join(pt_job *job);
/* A joiner took the state of switch `epoch`; it trains once its replica is in. */
pipert_result pt_job_joined(pt_job *job, long epoch);
/* Whether the coordinator said that every rank of this replica took the state of switch
 * `epoch` or a newer one (its replica is in). */
bool pt_job_replica_in(pt_job *job, long epoch);
/* Replaces this stage's replica, site and leaders groups by groups of the
 * replicas still in the job as of membership epoch `epoch`; their collectives
 * start at first_sequence. */
pipert_result pt_job_regroup(pt_job *job, long epoch, uint32_t first_sequence);
/* Replicas coming back (comm/membership.h, "Joining"; session/join.c), at switch
 * `epoch`: joiners[r], the replicas it lets in (the coordinator's word: they take the donor's
 * state, also when a superseded switch let them in before); fresh[r], the replicas of its
 * groups with newer processes than those this rank is connected to (this one excluded). Both
 * [world]. */
pipert_result pt_job_switch_joiners(pt_job *job, long epoch, bool *joiners, bool *fresh);
/* A survivor, at the switch: connects to this stage's rank of each fresh replica
 * (its new address; UCX's sockets open again until settled). */
pipert_result pt_job_admit_joiners(pt_job *job, const bool *fresh);
/* A joiner, while it waits: takes the new address of this stage's rank of every replica
 * that came back since, and drops its old process (so that the new one may connect). */
pipert_result pt_job_make_room(pt_job *job);
/* A joiner at switch `epoch`: connects to this stage's rank of each higher replica that
 * the switch lets in, then waits until every other replica's has connected to it.
 * PIPERT_ERR_TIMEOUT without a message when a newer change superseded the switch. */
pipert_result pt_job_await_replicas(pt_job *job, long epoch, double timeout_s);
/* A joiner: every replica's site, as the survivors' census found them. */
pipert_result pt_job_take_sites(pt_job *job, const int *sites);
/* After the regroup, on every member of the switch: a barrier of the new replica group,
 * then no new connections any more. */
pipert_result pt_job_settle_joiners(pt_job *job);

/* Whether this rank lost the coordinator (pipert launch: the launcher died);
 * `why` (may be NULL) says how it was noticed. */
bool pt_job_coordinator_lost(pt_job *job, char *why, size_t cap);
/* How often this worker registered again with a coordinator started again. */
long pt_job_coordinator_reconnections(pt_job *job);

/* This rank's progress, for the coordinator's job-wide line. */
pipert_result pt_job_report_progress(pt_job *job, const pt_rank_progress *progress);

/* The coordinator's job-wide line, logged by the rank that hosts it. */
void pt_job_log_progress(pt_job *job);

/* This rank is done; the rank hosting the coordinator keeps it serving until
 * every rank is done or the job aborted. */
pipert_result pt_job_finish(pt_job *job);
/* Every rank of the grid reaches this before any goes on (to close its endpoints). */
pipert_result pt_job_leave_together(pt_job *job);

/* Tells the job this rank failed (unless the failure is the job's abort). */
void pt_job_report_failure(pt_job *job, const char *message);

#endif
