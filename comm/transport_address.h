/* What transport_address.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_ADDRESS_H
#define PT_TRANSPORT_ADDRESS_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_address.c: our worker address (into t->worker_address and t->address_text), and
 * a peer's, from its text. */
pipert_result pt_transport_publish_address(pt_transport *t);
pipert_result pt_transport_decode_address(const char *text, uint8_t *out, size_t *length);

#pragma GCC visibility pop

#endif
