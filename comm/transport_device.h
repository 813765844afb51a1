/* What transport_device.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_DEVICE_H
#define PT_TRANSPORT_DEVICE_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_device.c: same-host device payloads. */
void pt_transport_offer_device_copies(connection *c);
void pt_transport_peer_copies_device(connection *c, uint32_t word);
void pt_transport_send_device_descriptor(pt_transport *t, pt_request *r, ucp_ep_h ep);
int pt_transport_is_device_descriptor(const device_descriptor *d, size_t length);
void pt_transport_copy_from_peer(pt_request *r);

#pragma GCC visibility pop

#endif
