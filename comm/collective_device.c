/* Messages in device memory between a group's members (collectives.h, "Messages in device
 * memory"): what a collective that reduces in a kernel table's memory sends and receives,
 * under the ticket it took. The transport does the work (transport.h, "Device payloads"); this
 * file gives it the group's ranks, tags and shapes, as pt_collective_post_send does for host
 * buffers. */
#include "comm/collectives.h"
#include "comm/collectives_internal.h"

#include "runtime/safetensors.h"

int pt_group_copies_device_memory(const pt_group *g)
{
    for (int i = 0; i < g->size; i++)
        if (i != g->index && !pt_transport_copies_device_memory_from(g->t, g->ranks[i])) return 0;
    return 1;
}

int pt_group_takes_device_payload(const pt_group *g, int member, size_t count)
{
    const int rank = g->ranks[pt_group_member(g, member)];
    return count * sizeof(float) > PT_TRANSPORT_INLINE_BYTES &&
           pt_transport_peer_copies_device_memory(g->t, rank);
}

static pt_message_header header_of(const collective *c, size_t count)
{
    return (pt_message_header){
        .kind = PT_KIND_COLLECTIVE,
        .dtype = (uint16_t)PT_DTYPE_F32,
        .step = c->sequence,
        .ndim = 1,
        .shape = {(int64_t)count},
        .nbytes = count * sizeof(float),
    };
}

pipert_result pt_group_send_device(pt_group *g, pt_group_ticket ticket, int member,
                                   const float *device, size_t count, pt_request **out)
{
    const collective c = pt_collective_at(g, ticket.sequence, "device-memory collective");
    const pt_message_header h = header_of(&c, count);
    pipert_result rc = pt_send_device(g->t, g->ranks[pt_group_member(g, member)], c.tag, &h, device,
                                      out);
    if (rc != PIPERT_OK) pt_error_prefix("%s", c.name);
    return rc;
}

pipert_result pt_group_send(pt_group *g, pt_group_ticket ticket, int member, const float *host,
                            size_t count, pt_request **out)
{
    const collective c = pt_collective_at(g, ticket.sequence, "device-memory collective");
    return pt_collective_post_send(&c, member, host, count, PT_DTYPE_F32, 0, out);
}

pipert_result pt_group_recv_device(pt_group *g, pt_group_ticket ticket, int member, float *host,
                                   float *device, size_t count, pt_request **out)
{
    const collective c = pt_collective_at(g, ticket.sequence, "device-memory collective");
    const pt_recv_expect expect = {
        .kind = PT_KIND_COLLECTIVE,
        .dtype = (int32_t)PT_DTYPE_F32,
        .ndim = 1,
        .shape = {(int64_t)count},
        .require_checksum = g->checksum,
    };
    pipert_result rc = pt_recv_device(g->t, g->ranks[pt_group_member(g, member)], c.tag, &expect,
                                      host, device, count * sizeof(float), out);
    if (rc != PIPERT_OK) pt_error_prefix("%s", c.name);
    return rc;
}
