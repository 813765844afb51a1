/* Host staging of the tensors a stage exchanges with its neighbours.
 *
 * The transport reads and writes host memory. With a kernel table whose
 * memory the host can read (cpu), activations and their gradients go out and
 * come in where the model keeps them, without a copy. Otherwise (cuda,
 * cpu-guarded) each send goes from a host copy of its own, made with the
 * table's copy_to_host and kept until the send completes (sends are not
 * waited for: a slot's copy is reused only after release_activations waited
 * for its send), and each receive lands in one host buffer (also used by
 * validation's sends, which are waited for) and goes to the device with
 * copy_to_device before the receive returns. The host buffers
 * come from the table's alloc_host (page-locked on cuda, so the copies are
 * DMA at full speed).
 *
 * Between processes of one host that copy from each other's device memory
 * (CUDA IPC; comm/transport.h, "Device payloads") neither copy is
 * made: a send names the device tensor itself (after the device finished
 * writing it), and a receive lands in its device buffer unless the message
 * came as bytes (the peer had not heard the offer yet). */
#include <stdlib.h>

#include "pipeline/executor_internal.h"
#include "runtime/log.h"

static bool staged(const pt_stage_executor *ex) { return !ex->kernels->host_accessible; }

pipert_result pt_staging_alloc(pt_stage_executor *ex, void **out, size_t bytes, const char *what)
{
    if (staged(ex)) return ex->kernels->alloc_host(out, bytes, what);
    return ex->kernels->alloc(out, bytes, what);
}

void pt_staging_release(pt_stage_executor *ex, void *buffer)
{
    if (!buffer) return;
    if (staged(ex)) ex->kernels->free_host(buffer);
    else ex->kernels->free(buffer);
}

void pt_staging_copy_out(pt_stage_executor *ex, void *dst, const void *src, size_t bytes)
{
    if (staged(ex)) ex->kernels->copy_to_host(dst, src, bytes);
    else ex->kernels->copy(dst, src, bytes);
}

bool pt_staging_device_to(pt_stage_executor *ex, int peer, size_t bytes)
{
    return staged(ex) && bytes > PT_TRANSPORT_INLINE_BYTES &&
           pt_transport_peer_copies_device_memory(ex->options.transport, peer);
}

pipert_result pt_staging_send_device(pt_stage_executor *ex, int peer, uint32_t tag,
                                     const pt_message_header *header, const void *src,
                                     pt_request **request)
{
    const int next = peer == ex->options.next_rank;
    if (!ex->device_sends_told[next]) {
        ex->device_sends_told[next] = true;
        pt_info("stage %d: tensors to rank %d (the %s stage) go device to device (%s)",
                ex->options.stage, peer, next ? "next" : "previous", ex->kernels->name);
    }
    ex->kernels->synchronize(); /* the peer copies what the kernels wrote, not what they will */
    return pt_send_device(ex->options.transport, peer, tag, header, src, request);
}

pipert_result pt_staging_setup(pt_stage_executor *ex)
{
    if (!staged(ex)) return PIPERT_OK;
    const size_t bytes = (size_t)ex->B * ex->T * ex->C * sizeof(float);
    ex->activation_staging = calloc((size_t)ex->slots, sizeof *ex->activation_staging);
    if (!ex->activation_staging) return pt_fail(PIPERT_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < ex->slots; i++)
        PT_TRY(pt_staging_alloc(ex, (void **)&ex->activation_staging[i], bytes,
                                "host copies of activations being sent"));
    PT_TRY(pt_staging_alloc(ex, (void **)&ex->gradient_staging, bytes,
                            "the host copy of a gradient being sent"));
    return pt_staging_alloc(ex, (void **)&ex->sync_staging, bytes,
                            "host memory for tensors being received");
}

float *pt_staging_sync(pt_stage_executor *ex) { return ex->sync_staging; }

void pt_staging_free(pt_stage_executor *ex)
{
    if (ex->activation_staging)
        for (int i = 0; i < ex->slots; i++) pt_staging_release(ex, ex->activation_staging[i]);
    free(ex->activation_staging);
    pt_staging_release(ex, ex->gradient_staging);
    pt_staging_release(ex, ex->sync_staging);
    ex->activation_staging = NULL;
    ex->gradient_staging = ex->sync_staging = NULL;
}

const void *pt_staging_outgoing(pt_stage_executor *ex, void *staging, const void *src,
                                size_t bytes)
{
    if (!staging) return src;
    ex->kernels->copy_to_host(staging, src, bytes);
    return staging;
}

void *pt_staging_incoming(pt_stage_executor *ex, void *dst)
{
    return staged(ex) ? ex->sync_staging : dst;
}

void pt_staging_arrived(pt_stage_executor *ex, void *dst, size_t bytes)
{
    if (staged(ex)) ex->kernels->copy_to_device(dst, ex->sync_staging, bytes);
}
