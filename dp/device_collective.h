/* Collectives in the kernels' memory, for a group whose members copy each other's device
 * memory (GPU workers of one host: docs/CUDA.md, "Replicas sharing a host"): the dense mean of
 * dp.method=allreduce and of a site's replicas, and a site leader's parameters to its site.
 *
 * The ring all-reduce and the broadcast of comm/collectives.h work in host memory: on a GPU
 * every step's tensor would cross to the host and back. Here a member sends its tensor to
 * another as a device payload (the receiver copies it device to device: comm/transport.h,
 * "Device payloads"):
 *   mean       each member sends its tensor to every other member and sums the group's
 *              tensors with the table's kernels in the members' order, g₀ + g₁ + … + g_{R−1},
 *              then scales by 1/R, so every member ends bitwise equal to the others, as after
 *              the ring (for R = 2 the sum is made in place, a + b being b + a in IEEE
 *              arithmetic: the ring's bits);
 *   broadcast  the root sends its tensor to every other member, which receives it in place.
 * Tensors go in chunks of at most `chunk` floats, one after another, so the device memory a
 * mean needs is one chunk to receive into and, for R > 2, one to sum in; a chunk of a tensor
 * being sent is overwritten only once every member has copied it. A chunk for a member that
 * does not copy this one's memory (its offer not heard yet) or too small to go as a device
 * payload goes as bytes from a host copy, and one that comes as bytes is copied to the device.
 *
 * Each member of a mean sends (R−1)·count floats, against the ring's 2(R−1)/R·count: device to
 * device on one host that is a few milliseconds, while the ring's host round trips took a GPU
 * step's time again (docs/CUDA.md). A departure ends the collective with the error of the
 * request that saw it: chunks already done stay so (a mean's replicas are made equal again
 * when the survivors regroup); buffers a receive may still write are retired. */
#ifndef PT_DP_DEVICE_COLLECTIVE_H
#define PT_DP_DEVICE_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/collectives.h"
#include "dp/coupling.h"
#include "kernels/kernels.h"

/* Floats in one chunk by default: 32 MiB (GPT-2 124M's gradient is 16 chunks). */
#define PT_DEVICE_COLLECTIVE_CHUNK ((size_t)8 << 20)

typedef struct pt_device_collective pt_device_collective;

/* Whether every member of g copies every other's device memory, agreed by all of them: each
 * says whether it does (pt_group_copies_device_memory), and a one-float all-reduce of the
 * answers, waited for as the coupling `o` waits, decides. false without asking on kernels the
 * host reads (the same on every member: runtime.device is a setting of the job) or without a
 * group. Every member calls it at the same point. */
pipert_result pt_device_collective_agree(const pt_coupling_options *o, pt_group *g, bool *yes);

/* A collective that reuses its buffers from one call to the next; chunk 0:
 * PT_DEVICE_COLLECTIVE_CHUNK. */
pipert_result pt_device_collective_create(const pt_kernels *kernels, size_t chunk,
                                          pt_device_collective **out);
/* Frees its buffers, retired ones included: only once the transport is closed or nothing can
 * write them (no collective abandoned since). */
void pt_device_collective_free(pt_device_collective *c);

/* Starts averaging data[0..count), in the kernels' memory, over g's members, all of whom call
 * it in the same order with the same count. The device work that wrote `data` is waited for
 * here. Nothing of it runs until pt_device_collective_wait_for drives it (the sums are kernel
 * calls, made on the caller's thread). One collective at a time. */
pipert_result pt_device_collective_mean_start(pt_device_collective *c, pt_group *g, float *data,
                                              size_t count);

/* Starts copying member root's data[0..count) into every other member's data. */
pipert_result pt_device_collective_broadcast_start(pt_device_collective *c, pt_group *g,
                                                   float *data, size_t count, int root);

/* Drives the collective for at most timeout_s: PIPERT_ERR_TIMEOUT while it goes on, else its
 * result (a failure names the member and the chunk; what was in flight is abandoned). */
pipert_result pt_device_collective_wait_for(pt_device_collective *c, double timeout_s);

/* Gives the collective up (a stop, a departure): what is in flight is abandoned and the
 * buffers it may still write are retired. */
void pt_device_collective_abandon(pt_device_collective *c);

/* Bytes one member sends in a mean of count floats over g: the whole tensor to each other. */
size_t pt_device_collective_mean_bytes(const pt_group *g, size_t count);
/* ... and in a broadcast: the root the whole tensor to each other member, the others none. */
size_t pt_device_collective_broadcast_bytes(const pt_group *g, size_t count, int root);

#endif
