/* DIR/status.json (launch_status.h). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "runtime/error.h"
#include "tools/launch_status.h"

static const char *phase_name(pt_job_phase phase)
{
    switch (phase) {
    case PT_JOB_REGISTERING: return "registering";
    case PT_JOB_RUNNING: return "running";
    case PT_JOB_FINISHED: return "finished";
    case PT_JOB_ABORTED: return "aborted";
    }
    return "unknown";
}

static json_t *rank_json(int rank, const pt_rank_status *r, const pt_launch_rank *p)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:s, s:I, s:i, s:b, s:i, s:i}", "rank", rank,
                          "stage", p->stage, "replica", p->replica, "site", p->site, "state",
                          pt_rank_state_name(r->state), "step", (json_int_t)r->step, "pid",
                          (int)p->pid, "running", p->running, "starts", p->starts, "exits",
                          p->exits);
    if (j && p->exits > 0) {
        char how[32];
        if (WIFSIGNALED(p->last_exit)) snprintf(how, sizeof how, "signal %d", WTERMSIG(p->last_exit));
        else snprintf(how, sizeof how, "exit %d", WEXITSTATUS(p->last_exit));
        json_object_set_new(j, "last_exit", json_string(how));
    }
    return j;
}

/* A new version of path (temporary name, then rename), without fsync: the file says what is
 * true now and is rewritten in half a second, and an fsync on a slow disk would stall the
 * launcher's loop, and with it the coordinator's reading of heartbeats. */
static pipert_result replace_file(const char *path, const json_t *root)
{
    char temporary[PATH_MAX + 8];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    FILE *f = fopen(temporary, "w");
    if (!f) return pt_fail(PIPERT_ERR_IO, "%s: %s", temporary, strerror(errno));
    const int dumped = json_dumpf(root, f, JSON_COMPACT);
    const int closed = fclose(f);
    if (dumped != 0 || closed != 0 || rename(temporary, path) != 0) {
        const int error = errno;
        remove(temporary);
        return pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(error));
    }
    return PIPERT_OK;
}

pipert_result pt_launch_status_write(const char *path, const pt_launch_snapshot *s)
{
    const pt_job_status *job = s->job;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    json_t *ranks = json_array();
    json_t *root = json_pack(
        "{s:f, s:f, s:s, s:I, s:I, s:i, s:i, s:I, s:I, s:i}", "time",
        (double)now.tv_sec + now.tv_nsec * 1e-9, "elapsed_s", s->elapsed_s, "phase",
        phase_name(job->phase), "step", (json_int_t)job->min_step, "total_steps",
        (json_int_t)job->total_steps, "replicas", job->replicas, "replicas_live",
        job->replicas_live, "departures", (json_int_t)job->departures, "joins",
        (json_int_t)job->joins, "restarts_left", s->restarts_left);
    if (!root || !ranks) {
        json_decref(root);
        json_decref(ranks);
        return pt_fail(PIPERT_ERR_NOMEM, "status.json: out of memory");
    }
    if (job->val_step >= 0 && isfinite(job->val_loss)) {
        json_object_set_new(root, "val_step", json_integer(job->val_step));
        json_object_set_new(root, "val_loss", json_real(job->val_loss));
    }
    for (int r = 0; r < job->world; r++)
        json_array_append_new(ranks, rank_json(r, &s->ranks[r], &s->processes[r]));
    json_object_set_new(root, "ranks", ranks);
    const pipert_result rc = replace_file(path, root);
    json_decref(root);
    return rc;
}
