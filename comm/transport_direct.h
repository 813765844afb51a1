/* What transport_direct.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_DIRECT_H
#define PT_TRANSPORT_DIRECT_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_direct.c: same-host direct reads. */
void pt_transport_init_direct_reads(pt_transport *t);
void pt_transport_offer_direct_reads(connection *c, const hello *h);
void pt_transport_peer_reads_us(connection *c);
void pt_transport_send_direct(pt_transport *t, pt_request *r, ucp_ep_h ep);
/* A direct or device send waits for its answer (ack id r->descriptor.ack_id). */
void pt_transport_post_ack_receive(pt_request *r);
void pt_transport_acknowledge(pt_transport *t, int rank, uint32_t ack_id, int32_t status);
int pt_transport_is_descriptor(const direct_descriptor *d, size_t length);
void pt_transport_read_directly(pt_request *r);

#pragma GCC visibility pop

#endif
