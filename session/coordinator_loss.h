/* Outliving the coordinator (coordinator_loss.c): the workers' vote on a step to stop at. */
#ifndef PT_SESSION_COORDINATOR_LOSS_H
#define PT_SESSION_COORDINATOR_LOSS_H

#include <stdbool.h>

#include "comm/collectives.h"
#include "pipert/pipert.h"

typedef struct pt_coordinator_vote {
    pt_allreduce_handle *handle; /* in flight since step `step` */
    float *value;                /* its buffer (kept to the end if abandoned) */
    long step;
    long groups;                 /* the membership the groups reflected when it started */
    bool loss_logged;            /* the loss is in the log */
    long reconnections_logged;   /* registrations with a coordinator started again, logged */
} pt_coordinator_vote;

/* After every step: *stop says whether every rank agreed, at this step, to stop after it
 * because the coordinator is lost. */
pipert_result pt_session_coordinator_vote(pipert_session *s, long step, bool *stop);
/* A vote in flight is given up (before the job is left, or when its group changes). */
pipert_result pt_session_coordinator_vote_abandon(pipert_session *s);

#endif
