/* Host memory: aligned allocations that report failure as a result, and a
 * check that a planned allocation fits in this machine's memory before it is
 * attempted (so "model too large" is an error message, not the OOM killer). */
#ifndef PT_MEMORY_H
#define PT_MEMORY_H

#include <stddef.h>

#include "runtime/error.h"

#define PT_ALIGNMENT 64

/* Zero-filled, PT_ALIGNMENT-aligned (large ones: on huge pages where the kernel offers them);
 * `what` names the allocation in errors. Freed with pt_free (or free). */
pipert_result pt_alloc(void **out, size_t bytes, const char *what);
void pt_free(void *ptr);

/* Bytes of memory this process could still allocate (MemAvailable). */
size_t pt_memory_available(void);

/* Fails with PIPERT_ERR_NOMEM, naming `what`, when `bytes` exceeds what is
 * available. */
pipert_result pt_memory_check_fits(size_t bytes, const char *what);

/* Overflow-checked size arithmetic: returns 0 on overflow. */
int pt_mul_size(size_t a, size_t b, size_t *out);

#endif
