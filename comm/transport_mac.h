/* What transport_mac.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_MAC_H
#define PT_TRANSPORT_MAC_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_mac.c: a connection's message keys from its handshake; the MAC and sequence
 * number of an outgoing header, or of a record (a control record or direct-read answer: the
 * seal covers its first `size` bytes and the sequence number); the check of an incoming one
 * (0 and `why` on refusal). Records are sealed only with authenticate_messages (else zeros). */
void pt_transport_mac_keys(connection *c);
pipert_result pt_transport_mac_sign(pt_transport *t, int rank, pt_message_header *h,
                                    const void *payload);
int pt_transport_mac_check(pt_transport *t, int rank, const pt_message_header *h,
                           const void *payload, char *why, size_t capacity);
pipert_result pt_transport_seal_record(pt_transport *t, int rank, const void *record, size_t size,
                                       uint64_t *sequence, uint8_t mac[PT_MESSAGE_MAC_BYTES]);
int pt_transport_seal_check(pt_transport *t, int rank, const void *record, size_t size,
                            uint64_t sequence, const uint8_t mac[PT_MESSAGE_MAC_BYTES], char *why,
                            size_t capacity);
void pt_transport_mac_forget(peer *p);

#pragma GCC visibility pop

#endif
