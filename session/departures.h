/* Departures as the rest of the session meets them (departures.c). */
#ifndef PT_SESSION_DEPARTURES_H
#define PT_SESSION_DEPARTURES_H

#include <stdbool.h>

#include "pipert/pipert.h"

/* Buffers that abandoned collectives may still write, freed when the session ends. */
typedef struct pt_kept_buffers {
    void **buffers;
    int count;
} pt_kept_buffers;

/* Whether replicas left after departure `epoch` (waiting a while for the coordinator's word,
 * which may come after a peer was found dead). */
bool pt_session_departures_since(pipert_session *s, long epoch);
/* The same, waiting up to `seconds` for the word. */
bool pt_session_departures_within(pipert_session *s, long epoch, double seconds);
/* Keeps a buffer that an abandoned collective may still write until the session ends
 * (pt_session_free_kept, after the transport is gone). */
pipert_result pt_session_keep_until_end(pipert_session *s, void *buffer);
void pt_session_free_kept(pipert_session *s);
/* For the coupling's waits (pt_coupling_options.membership_changed): a change the coupling's
 * groups do not reflect yet. */
bool pt_session_membership_changed(void *context);

#endif
