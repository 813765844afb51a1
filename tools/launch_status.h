/* DIR/status.json: what pipert launch knows of its job now, rewritten (atomically) about twice
 * a second while it runs and once when it ends. For an operator's dashboard or a driver outside
 * the job (scripts/churn.py): the job's phase and step, the replicas in it, departures and joins,
 * and each rank's state, latest step, pid, process starts and ends ("last_exit": "exit 3",
 * "signal 9"). */
#ifndef PT_LAUNCH_STATUS_H
#define PT_LAUNCH_STATUS_H

#include <sys/types.h>

#include "pipert/pipert.h"
#include "comm/coordinator.h"

/* A rank's process as the launcher knows it. */
typedef struct pt_launch_rank {
    int stage, replica, site;
    pid_t pid;     /* the latest process; 0: none started */
    bool running;
    int starts;    /* processes started for the rank (more than one after --restarts) */
    int exits;     /* of them, those that ended */
    int last_exit; /* the latest that ended: its wait status */
} pt_launch_rank;

typedef struct pt_launch_snapshot {
    double elapsed_s;       /* since the launcher started the workers */
    int restarts_left;
    const pt_job_status *job;
    const pt_rank_status *ranks; /* [job->world], as the coordinator sees them */
    const pt_launch_rank *processes; /* [job->world] */
} pt_launch_snapshot;

/* Writes path (temporary name, then rename; not fsynced: rewritten twice a second). */
pipert_result pt_launch_status_write(const char *path, const pt_launch_snapshot *s);

#endif
