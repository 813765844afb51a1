/* A kernel table that times every call of another table, per kernel: the
 * answer to "where does the step's time go". Wrapping costs two clock reads
 * per call, and it synchronizes the backend around each kernel, so use it to
 * profile, not to measure throughput. One profiled table exists at a time. */
#ifndef PT_KERNEL_PROFILE_H
#define PT_KERNEL_PROFILE_H

#include <stdio.h>

#include "kernels/kernels.h"

/* The timing table over `inner` (replaces any earlier one); counters reset. */
const pt_kernels *pt_kernels_profiled(const pt_kernels *inner);

typedef struct pt_kernel_time {
    const char *name;
    double seconds;
    long calls;
    /* for the memory-bound kernels, the least traffic their calls had to move (each input read
     * once, each output written once, what they add into read and written: bytes / seconds is
     * the bandwidth they reached); for attention, the operations of its products (causal: the
     * half of T² computed). 0 where not counted. */
    double bytes, flops;
} pt_kernel_time;

/* The per-kernel totals since the table was made, largest first; returns the
 * number of entries written (at most `capacity`). */
int pt_kernel_profile_read(pt_kernel_time *out, int capacity);
void pt_kernel_profile_reset(void);

/* The matrix products again, by entry and shape (N rows, C in, OC out), with the
 * floating-point operations they did (2·N·C·OC a product made: forward 1, backward 1 for
 * dinp and 1 for dweight): which GEMMs run under the device's rate, e.g. the classifier's
 * beside the blocks'. The first 64 shapes seen are kept. */
typedef struct pt_product_time {
    const char *name;
    int N, C, OC;
    double seconds, flops;
    long calls;
} pt_product_time;

/* The products' totals by shape, largest time first; returns the number written. */
int pt_kernel_profile_products(pt_product_time *out, int capacity);

#endif
