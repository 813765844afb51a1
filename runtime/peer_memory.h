/* A piece of device memory as another process of this host names it.
 *
 * Two workers that share a host (stages of one pipeline, replicas on one
 * machine) can copy tensors straight from each other's device memory instead
 * of through the host: the sender exports where a buffer lives (a CUDA IPC
 * handle of its arena and the offset in it; for runtime.device=cpu-guarded,
 * its pid and the address), the receiver copies out of it with its own
 * table's peer_copy (kernels/kernels.h), and the transport carries the name
 * in place of the payload (comm/transport.h, "Device payloads").
 * The bytes are the exporting table's business: only a table of the same
 * kind reads them. */
#ifndef PT_PEER_MEMORY_H
#define PT_PEER_MEMORY_H

#include <stdint.h>

#define PT_PEER_MEMORY_BYTES 96

typedef struct pt_peer_memory {
    uint8_t bytes[PT_PEER_MEMORY_BYTES];
} pt_peer_memory;

#endif
