/* What crosses between stages in bf16 (pipeline.transfer; transfer.h): the executor rounds
 * the activations and the gradient it sends into buffers of their own, in the table's memory
 * (a kernel, on the device where the tensors are), and sends those: half the bytes on the
 * link, in the host staging copies (staging.c) and device to device. A receive lands in one
 * bf16 buffer and is widened into the model's fp32 input or received gradient (exact).
 *
 * A slot's rounded activations stay untouched until its send completed, as the staging copies
 * do (release_activations waits for it before the slot's next forward); with
 * pipeline.recompute they are the one copy of the output being sent, which fp32 keeps in
 * send_copies. The gradient's buffer is rewritten after the backward that completed its send.
 * Validation's activations cross in fp32 (a few batches per validation, their own buffers). */
#include <stdlib.h>

#include "pipeline/executor_internal.h"
#include "pipeline/transfer.h"

static size_t rounded_bytes(const pt_stage_executor *ex)
{
    return (size_t)ex->B * ex->T * ex->C * sizeof(pt_bf16);
}

pipert_result pt_transfer_setup(pt_stage_executor *ex)
{
    ex->transfer_bf16 = ex->options.stages > 1 && pt_transfer_in_bf16(&ex->config);
    if (!ex->transfer_bf16) return PIPERT_OK;
    const pt_kernels *k = ex->kernels;
    const size_t bytes = rounded_bytes(ex);
    if (!pt_executor_is_last_stage(ex)) {
        ex->rounded_sends = calloc((size_t)ex->slots, sizeof *ex->rounded_sends);
        if (!ex->rounded_sends) return pt_fail(PIPERT_ERR_NOMEM, "executor: out of memory");
        for (int i = 0; i < ex->slots; i++)
            PT_TRY(k->alloc((void **)&ex->rounded_sends[i], bytes,
                            "activations being sent, rounded to bf16"));
    }
    if (ex->options.stage > 0)
        PT_TRY(k->alloc((void **)&ex->rounded_gradient, bytes,
                        "the gradient being sent, rounded to bf16"));
    return k->alloc((void **)&ex->rounded_received, bytes, "a bf16 tensor received");
}

void pt_transfer_free(pt_stage_executor *ex)
{
    const pt_kernels *k = ex->kernels;
    for (int i = 0; ex->rounded_sends && i < ex->slots; i++) k->free(ex->rounded_sends[i]);
    free(ex->rounded_sends);
    k->free(ex->rounded_gradient);
    k->free(ex->rounded_received);
    ex->rounded_sends = NULL;
    ex->rounded_gradient = ex->rounded_received = NULL;
}

pt_bf16 *pt_transfer_rounded(pt_stage_executor *ex, int slot)
{
    if (!ex->transfer_bf16) return NULL;
    return slot < 0 ? ex->rounded_gradient : ex->rounded_sends[slot];
}
