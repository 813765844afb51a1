/* Elastic replicas, the worker's side (elastic.c; the protocol: comm/membership.h): what a
 * worker knows of the job's membership, following it at every step boundary, and a replica
 * coming back (its state from join.c). */
#ifndef PT_SESSION_ELASTIC_H
#define PT_SESSION_ELASTIC_H

#include "comm/coord_client.h" /* pt_membership_news */
#include "pipert/pipert.h"

typedef struct pt_elastic_state {
    long acked_epoch;     /* the newest departure acknowledged */
    long ack_step;        /* the steps taken when it was */
    long regrouped_epoch; /* the departure the coupling's groups reflect */
    int absent;           /* replicas out of the job now */
    long joined_at;       /* a joiner: the step its state is of (0: started with the job) */
    long taking_switch;   /* a joiner: the switch whose state it takes now (0: none); a
                           * newer change stops its waits (session.c should_stop) */
    double paused_us;     /* trace clock when the coupling paused */
    double tokens_lost;   /* the batches the replicas that left did not train */
} pt_elastic_state;

/* At a step boundary: acknowledges departures, waits for the switch when the margin ran out,
 * and regroups at the switch. */
pipert_result pt_session_follow_membership(pipert_session *s);
/* Regroups at the switch `news` announced: connects to replicas coming back and, on the
 * donor, gives them their state; then the new groups and the coupling over them. */
pipert_result pt_session_switch_groups(pipert_session *s, const pt_membership_news *news);
/* A replica coming back, in place of resuming: takes the donor's state of step *step at the
 * switch that lets it in (join.c), and regroups with the others. */
pipert_result pt_session_rejoin(pipert_session *s, long *step);

#endif
