/* The dense mean of a group's tensors in the kernels' memory, for replicas that copy each
 * other's device memory (dp.method=allreduce between the workers of one host on GPUs:
 * docs/CUDA.md, "Replicas sharing a host").
 *
 * The ring all-reduce (comm/allreduce.c) reduces in host memory: on a GPU every step's
 * gradient would cross to the host and back. Here each member sends its tensor to every other
 * member as a device payload (the receiver copies it device to device: comm/transport.h,
 * "Device payloads") and sums the group's tensors with the table's kernels, in the members'
 * order, g₀ + g₁ + … + g_{R−1}, then scales by 1/R, so every member ends bitwise equal to the
 * others, as after the ring. The tensor goes in chunks of at most `chunk` floats, one after
 * another, so the device memory it needs is one chunk to receive into and, for R > 2, one to
 * sum in (for R = 2 the sum is made in place: a + b is b + a in IEEE arithmetic); a chunk of
 * the tensor is overwritten only once every member has copied it. A chunk for a member that
 * does not copy this one's memory (its offer not heard yet) or too small to go as a device
 * payload goes as bytes from a host copy, and one that comes as bytes is copied to the device.
 *
 * Each member sends (R−1)·count floats, against the ring's 2(R−1)/R·count: device to device
 * on one host that is a few milliseconds, while the ring's host round trips took a GPU step's
 * time again (docs/CUDA.md). A departure ends the mean with the error of the request that saw
 * it: chunks already averaged stay so (a method that keeps replicas identical makes them
 * equal again when the survivors regroup); buffers a receive may still write are retired. */
#ifndef PT_DP_DEVICE_MEAN_H
#define PT_DP_DEVICE_MEAN_H

#include <stddef.h>

#include "comm/collectives.h"
#include "kernels/kernels.h"

/* Floats in one chunk by default: 32 MiB (GPT-2 124M's gradient is 16 chunks). */
#define PT_DEVICE_MEAN_CHUNK ((size_t)8 << 20)

typedef struct pt_device_mean pt_device_mean;

/* A mean that reuses its buffers from one call to the next; chunk 0: PT_DEVICE_MEAN_CHUNK. */
pipert_result pt_device_mean_create(const pt_kernels *kernels, size_t chunk, pt_device_mean **out);
/* Frees its buffers, retired ones included: only once the transport is closed or nothing can
 * write them (no mean abandoned since). */
void pt_device_mean_free(pt_device_mean *m);

/* Starts averaging data[0..count), in the kernels' memory, over g's members, all of whom call
 * it in the same order with the same count. The device work that wrote `data` is waited for
 * here. Nothing of it runs until pt_device_mean_wait_for drives it (the sums are kernel
 * calls, made on the caller's thread). One mean at a time. */
pipert_result pt_device_mean_start(pt_device_mean *m, pt_group *g, float *data, size_t count);

/* Drives the mean for at most timeout_s: PIPERT_ERR_TIMEOUT while it goes on, else its result
 * (a failure names the member and the chunk; what was in flight is abandoned). */
pipert_result pt_device_mean_wait_for(pt_device_mean *m, double timeout_s);

/* Gives the mean up (a stop, a departure): what is in flight is abandoned and the buffers it
 * may still write are retired. */
void pt_device_mean_abandon(pt_device_mean *m);

/* Bytes one member sends in a mean of count floats over g: the whole tensor to each other. */
size_t pt_device_mean_bytes_sent(const pt_group *g, size_t count);

#endif
