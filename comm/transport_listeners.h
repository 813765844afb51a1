/* What transport_listeners.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_LISTENERS_H
#define PT_TRANSPORT_LISTENERS_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_listeners.c: UCX's listening sockets, found around ucp_worker_create, closed to
 * new connections by pt_transport_stop_listening (transport.h). */
void pt_transport_note_listening_sockets(pt_transport *t);
void pt_transport_find_ucx_listeners(pt_transport *t);

#pragma GCC visibility pop

#endif
