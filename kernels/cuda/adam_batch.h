/* How adam.cu packs a stage's regions into launches: a batch of regions laid end to end,
 * which travels as the kernel's parameter (4 KiB at most; this one ~2.1 KiB), and the
 * search that takes a batch element back to its region. Plain C as well as CUDA, so that
 * test_kernels checks the packing and the search on the host, where CI runs.
 *
 * Element j of a batch (0 ≤ j < start[count]) is element j − start[r] of region r, at
 * offset[r] + j − start[r] in the flat buffers, for the r with start[r] ≤ j < start[r + 1].
 * Empty regions are left out. */
#ifndef PT_KERNELS_CUDA_ADAM_BATCH_H
#define PT_KERNELS_CUDA_ADAM_BATCH_H

#include "kernels/kernels.h"

#ifdef __CUDACC__
#define PT_ADAM_BATCH_FN __host__ __device__ inline
#else
#define PT_ADAM_BATCH_FN static inline
#endif

#define PT_ADAM_REGIONS_PER_LAUNCH 120

typedef struct pt_adam_batch {
    unsigned long long start[PT_ADAM_REGIONS_PER_LAUNCH + 1];
    unsigned long long offset[PT_ADAM_REGIONS_PER_LAUNCH];
    unsigned char decay[PT_ADAM_REGIONS_PER_LAUNCH];
    int count;
} pt_adam_batch;

/* Fills *b with the non-empty regions from regions[first] on, as many as fit; returns the
 * index of the first region it did not take (n_regions when all are in). */
PT_ADAM_BATCH_FN int pt_adam_batch_fill(pt_adam_batch *b, const pt_param_region *regions,
                                        int n_regions, int first)
{
    unsigned long long total = 0;
    b->count = 0;
    for (; first < n_regions && b->count < PT_ADAM_REGIONS_PER_LAUNCH; first++) {
        const pt_param_region *r = &regions[first];
        if (r->numel == 0) continue;
        b->start[b->count] = total;
        b->offset[b->count] = r->offset;
        b->decay[b->count] = r->decay != 0;
        b->count++;
        total += r->numel;
    }
    b->start[b->count] = total;
    return first;
}

/* The region of batch element j (0 ≤ j < start[count]): the last r with start[r] ≤ j. */
PT_ADAM_BATCH_FN int pt_adam_batch_region(const pt_adam_batch *b, unsigned long long j)
{
    int lo = 0, hi = b->count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (b->start[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Whether every region of the batch starts, in the batch and in the flat buffers, at a multiple
 * of `width` elements (and so is a whole number of width-element steps long, but the last): the
 * kernel may then take width elements at a time without a step straddling two regions. */
PT_ADAM_BATCH_FN int pt_adam_batch_in_steps_of(const pt_adam_batch *b, int width)
{
    for (int r = 0; r <= b->count; r++)
        if (b->start[r] % (unsigned)width != 0) return 0;
    for (int r = 0; r < b->count; r++)
        if (b->offset[r] % (unsigned)width != 0) return 0;
    return 1;
}

#endif
