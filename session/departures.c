/* Departures as the rest of the session meets them (the protocol: comm/membership.h; the
 * worker's side of it: session/elastic.c). A collective that fails because a peer died may be
 * a replica leaving, which the coordinator announces a moment later: the caller asks
 * pt_session_departures_since before treating the failure as the job's. A collective given up
 * when replicas left may still write its buffer: the buffer is kept until the session ends. */
#include <stdlib.h>
#include <time.h>

#include "runtime/clock.h"
#include "session/session_internal.h"

#define NEWS_POLL_S 0.01
/* A failure is a departure if the coordinator says so within this long. */
#define DEPARTURE_NOTICE_S 12.0

pipert_result pt_session_keep_until_end(pipert_session *s, void *buffer)
{
    pt_kept_buffers *k = &s->kept;
    void **grown = realloc(k->buffers, (size_t)(k->count + 1) * sizeof *grown);
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "session: out of memory");
    k->buffers = grown;
    k->buffers[k->count++] = buffer;
    return PIPERT_OK;
}

void pt_session_free_kept(pipert_session *s)
{
    pt_kept_buffers *k = &s->kept;
    for (int i = 0; i < k->count; i++) free(k->buffers[i]);
    free(k->buffers);
    *k = (pt_kept_buffers){0};
}

bool pt_session_departures_since(pipert_session *s, long epoch)
{
    return pt_session_departures_within(s, epoch, DEPARTURE_NOTICE_S);
}

bool pt_session_departures_within(pipert_session *s, long epoch, double seconds)
{
    /* a peer found dead may be a departure the coordinator announces soon */
    for (const double until = pt_now_s() + seconds;;) {
        pt_membership_news news;
        pt_job_membership(&s->job, &news);
        if (news.epoch > epoch) return true;
        if (pt_now_s() >= until || pt_job_aborted(&s->job)) return false;
        struct timespec pause = {0, (long)(NEWS_POLL_S * 1e9)};
        nanosleep(&pause, NULL);
    }
}

bool pt_session_membership_changed(void *context)
{
    pipert_session *s = context;
    pt_membership_news news;
    pt_job_membership(&s->job, &news);
    return news.epoch > s->elastic.regrouped_epoch;
}
