/* What transport_send_recv.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_SEND_RECV_H
#define PT_TRANSPORT_SEND_RECV_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_send_recv.c: messages. */
void pt_transport_send_part(pt_request *r, ucp_ep_h ep, const void *buffer, size_t count, int iov,
                            int part);
void pt_transport_send_part_finished(pt_request *r, ucs_status_t status);
void pt_transport_post_part_receive(pt_request *r, ucp_tag_t tag, void *buffer, size_t count,
                                    int iov, arrival_fn arrived);
void pt_transport_post_send(pt_transport *t, pt_request *r);
pipert_result pt_transport_wire_header(pt_transport *t, const pt_message_header *header,
                                       pt_message_header *wire);
pipert_result pt_transport_submit_send(pt_transport *t, int dst_rank, uint32_t user_tag,
                                       const pt_message_header *header, const void *payload,
                                       const pt_peer_memory *device, pt_request **out);
pipert_result pt_transport_submit_receive(pt_transport *t, int src_rank, uint32_t user_tag,
                                          const pt_recv_expect *expect, void *buffer,
                                          void *device_buffer, size_t capacity, pt_request **out);
void pt_transport_post_receive(pt_transport *t, pt_request *r);
void pt_transport_finish_receive(pt_request *r);
void pt_transport_cancel_receives_from(pt_transport *t, int rank, pipert_result code,
                                       const char *reason);

#pragma GCC visibility pop

#endif
