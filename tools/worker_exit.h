/* What a `pipert worker`'s exit says (tools/cmd_worker.c sets it; pipert launch and the
 * coordinator it runs read it). */
#ifndef PT_TOOLS_WORKER_EXIT_H
#define PT_TOOLS_WORKER_EXIT_H

#include <stdbool.h>

#define EXIT_RANK_FAILED 1      /* this rank failed (it told the coordinator why) */
#define EXIT_JOB_ABORTED 3      /* it stopped because the job aborted (or it died rejoining) */
#define EXIT_COORDINATOR_LOST 4 /* the coordinator died for good: a checkpoint, then --resume */

/* Whether a worker's end was its own failure rather than finishing, or stopping because the
 * job aborted or the launcher stopped it: code is its exit status (-1 when `signal` ended
 * it); `reported`: the coordinator holds a failure it reported, or saw (its silence). */
static inline bool pt_worker_exit_failed(int code, int signal, bool by_launcher, bool reported)
{
    if (signal) return !by_launcher || reported;
    return reported || (code != 0 && code != EXIT_JOB_ABORTED && !by_launcher);
}

#endif
