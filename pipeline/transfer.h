/* What activations and their gradients cross between stages as (pipeline.transfer): fp32, as
 * the model keeps them, or rounded to bf16, half the bytes. The executor rounds what it sends
 * and widens what it receives (pipeline/transfer.c); the cost model prices the messages and
 * the buffers with the same answer. */
#ifndef PT_PIPELINE_TRANSFER_H
#define PT_PIPELINE_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "runtime/config.h"

/* Whether a job's stages exchange bf16: pipeline.transfer, auto following runtime.precision. */
static inline bool pt_transfer_in_bf16(const pipert_config *config)
{
    const pt_transfer t = config->pipeline.transfer;
    return t == PT_TRANSFER_BF16 ||
           (t == PT_TRANSFER_AUTO && config->runtime.precision == PT_PRECISION_BF16);
}

/* Bytes a value of an activation or its gradient takes between stages. */
static inline size_t pt_transfer_value_bytes(const pipert_config *config)
{
    return pt_transfer_in_bf16(config) ? sizeof(pt_bf16) : sizeof(float);
}

#endif
