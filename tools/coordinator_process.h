/* pipert launch's coordinator, in a process of its own (`pipert coordinator`, started by the
 * launcher and started again when it dies). `pipert coordinator --listen` (a standalone
 * coordinator for srun and mpirun jobs) plays the launcher's part the same way.
 *
 * The coordinator is on the control path only; running it apart from the launcher means a
 * fault in it, or a kill, costs the job nothing: the launcher holds the listening socket,
 * starts a new coordinator on it (pt_coordinator_options.recover), and the workers, whose
 * connections closed, register again with what they know of the job
 * (comm/coordinator_recover.c). The launcher sees the job through the snapshots the
 * coordinator sends it (its status and every rank's), and tells it what only the launcher
 * sees: a worker's exit, and a stop. Both go as JSON lines over a socket pair:
 *   launcher → coordinator
 *     exited {rank, code, signal, by_launcher, why}   a worker process ended (code -1: it
 *                                                     died from `signal`)
 *     abort  {reason}
 *   coordinator → launcher
 *     status {phase, ..., ranks: [{state, step, left, failure}]}   when anything changed
 * A coordinator started again hears every exit again that still holds (ranks not running).
 */
#ifndef PT_TOOLS_COORDINATOR_PROCESS_H
#define PT_TOOLS_COORDINATOR_PROCESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "comm/coordinator.h"
#include "runtime/error.h"

typedef struct pt_coordinator_process pt_coordinator_process;

/* Where `pipert coordinator` finds its listening socket and its launcher's. */
#define PT_COORDINATOR_LISTEN_FD 3
#define PT_COORDINATOR_CONTROL_FD 4

/* Starts `pipert coordinator` serving listen_fd (taken over; bound to `port`) for a job of
 * `options`; the
 * secret is read from secret_path; the process's pid goes to pid_path ("": nowhere) at every
 * start. */
pipert_result pt_coordinator_process_start(pt_coordinator_process **out,
                                           const pt_coordinator_options *options, int listen_fd,
                                           int port, const char *secret_path,
                                           const char *pid_path);
/* Closes the connection (the coordinator ends) and waits for it; NULL is fine. */
void pt_coordinator_process_free(pt_coordinator_process *p);

int pt_coordinator_process_port(const pt_coordinator_process *p);

/* Reads snapshots for up to timeout_ms; starts the coordinator again if it died. */
pipert_result pt_coordinator_process_poll(pt_coordinator_process *p, int timeout_ms);
/* Whether pid was the coordinator's (the launcher reaped it: waitpid); it is started again. */
bool pt_coordinator_process_reaped(pt_coordinator_process *p, pid_t pid, int wait_status);

/* A worker of `rank` ended (wait_status), or started again (its exit no longer holds). */
void pt_coordinator_process_rank_exited(pt_coordinator_process *p, int rank, int wait_status,
                                        bool by_launcher, const char *why);
void pt_coordinator_process_rank_started(pt_coordinator_process *p, int rank);
void pt_coordinator_process_abort(pt_coordinator_process *p, const char *reason);

/* The latest snapshot. */
void pt_coordinator_process_status(const pt_coordinator_process *p, pt_job_status *status);
void pt_coordinator_process_rank_statuses(const pt_coordinator_process *p, pt_rank_status *ranks);
bool pt_coordinator_process_rank_left(const pt_coordinator_process *p, int rank);
bool pt_coordinator_process_rank_failure(const pt_coordinator_process *p, int rank, char *reason,
                                         size_t cap);

/* The coordinator's side (tools/cmd_coordinator.c): its status line now. */
struct json_t;
struct json_t *pt_coordinator_process_snapshot(pt_coordinator *c);
/* Acts on one line from the launcher. */
void pt_coordinator_process_handle(pt_coordinator *c, const char *line, size_t length);

#endif
