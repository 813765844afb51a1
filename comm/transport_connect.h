/* What transport_connect.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_CONNECT_H
#define PT_TRANSPORT_CONNECT_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_connect.c: peers (under pt_transport_state_lock), connections (under ucx_lock). */
peer *pt_transport_peer_slot_locked(pt_transport *t, int rank);
peer_state pt_transport_peer_state_locked(const pt_transport *t, int rank);
/* Whether a process of `rank` was refused for another build or settings; why into `why`. */
int pt_transport_peer_mismatch_locked(const pt_transport *t, int rank, char *why, size_t capacity);
void pt_transport_connection_close(connection *c);
void pt_transport_send_control(connection *c, uint32_t word);
/* transport_connect.c: `rank` failed (departed: it said goodbye) for `reason`. */
void pt_transport_peer_fail(pt_transport *t, int rank, int departed, const char *reason);
/* The same, for what one connection saw: nothing changes when the rank's process it reached
 * was replaced since (its old endpoint failing late, after a site's link came back). */
void pt_transport_connection_lost(connection *c, int departed, const char *reason);
void pt_transport_start_connect(pt_transport *t, connection *c);
void pt_transport_drop_connections(pt_transport *t, int rank, const char *reason);
void pt_transport_maintain_connections(pt_transport *t);
int pt_transport_next_deadline_ms(const pt_transport *t);
void pt_transport_await_hellos(pt_transport *t);
void pt_transport_stop_hellos(pt_transport *t);
void pt_transport_connection_orphan(connection *c);

#pragma GCC visibility pop

#endif
