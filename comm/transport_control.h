/* What transport_control.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_CONTROL_H
#define PT_TRANSPORT_CONTROL_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_control.c: keeps one receive of a control word posted on c. */
void pt_transport_post_control_receive(connection *c);

#pragma GCC visibility pop

#endif
