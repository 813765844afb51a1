/* Device memory and transfers: the arena behind the table's alloc/free,
 * scratch space for kernels, the copies of the table, and pinned host
 * staging on the copy stream.
 *
 * The arena is one cudaMalloc handed out bottom-up in 256-byte aligned
 * pieces. A free marks its piece dead; dead pieces at the top are returned,
 * so memory freed in reverse order of allocation (a model slice, then its
 * optimizer; a test's buffers) is reused, and memory freed out of order waits
 * until everything above it is freed too. Scratch is taken above the top and
 * given back within one kernel-table call.
 *
 * Ordering. Everything runs on the compute stream except transfers that may
 * overlap with it, which run on the copy stream:
 *
 *   compute: ... k1 k2 [record compute_mark] .............. [wait copy_mark] k3 ...
 *   copy:                    [wait compute_mark] memcpy [record copy_mark]
 *
 * so a transfer sees the results of the kernels enqueued before it, never
 * overwrites a buffer they still read, and kernels enqueued after it see its
 * data. Freed memory is safe to hand out again at once: the next user's work
 * is enqueued after the old user's on the same stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define ARENA_ALIGNMENT 256

static size_t align_up(size_t bytes)
{
    return (bytes + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
}

/* ---- the arena ------------------------------------------------------------------ */

pipert_result pt_cuda_arena_create(size_t capacity)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    memset(a, 0, sizeof *a);
    capacity = capacity / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    cudaError_t err = cudaMalloc((void **)&a->base, capacity);
    if (err != cudaSuccess) {
        a->base = NULL;
        cudaGetLastError();
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        return pt_fail(PIPERT_ERR_NOMEM,
                       "CUDA device %d: the arena needs %zu MiB, %zu MiB of %zu are free: %s",
                       pt_cuda.device, capacity >> 20, free_bytes >> 20, total_bytes >> 20,
                       cudaGetErrorString(err));
    }
    a->capacity = capacity;
    return PIPERT_OK;
}

void pt_cuda_arena_destroy(void)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    if (a->base) cudaFree(a->base);
    free(a->pieces);
    memset(a, 0, sizeof *a);
}

static pipert_result arena_take(void **out, size_t bytes, const char *what)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    size_t size = align_up(bytes > 0 ? bytes : 1);
    if (size > a->capacity - a->top)
        return pt_fail(PIPERT_ERR_NOMEM,
                       "%s: %zu MiB do not fit in the CUDA arena of device %d (%zu of %zu MiB in "
                       "use; the arena is sized from the stage's needs: set PIPERT_CUDA_ARENA_MB to "
                       "change it)",
                       what, (size + (1 << 20) - 1) >> 20, pt_cuda.device, a->top >> 20,
                       a->capacity >> 20);
    if (a->n_pieces == a->pieces_capacity) {
        int capacity = a->pieces_capacity ? 2 * a->pieces_capacity : 64;
        pt_cuda_arena_piece *grown =
            (pt_cuda_arena_piece *)realloc(a->pieces, (size_t)capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "%s: CUDA arena bookkeeping: out of memory", what);
        a->pieces = grown;
        a->pieces_capacity = capacity;
    }
    a->pieces[a->n_pieces++] = pt_cuda_arena_piece{a->top, size, true};
    *out = a->base + a->top;
    a->top += size;
    a->live_bytes += size;
    if (a->top > a->peak) a->peak = a->top;
    return PIPERT_OK;
}

static void arena_give_back(void *ptr)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    char *p = (char *)ptr;
    int i = -1;
    if (p >= a->base && p < a->base + a->capacity) {
        size_t offset = (size_t)(p - a->base);
        i = a->n_pieces - 1; /* usually the newest piece */
        while (i >= 0 && a->pieces[i].offset != offset) i--;
    }
    if (i < 0 || !a->pieces[i].live) {
        pt_cuda_record_error("free", "a pointer the CUDA arena did not hand out (or a double free)",
                             __FILE__, __LINE__);
        return;
    }
    a->pieces[i].live = false;
    a->live_bytes -= a->pieces[i].bytes;
    while (a->n_pieces > 0 && !a->pieces[a->n_pieces - 1].live) {
        a->n_pieces--;
        a->top = a->pieces[a->n_pieces].offset;
    }
}

size_t pt_cuda_scratch_mark(void) { return pt_cuda.arena.top; }

bool pt_cuda_scratch_fits(size_t bytes)
{
    const pt_cuda_arena *a = &pt_cuda.arena;
    return align_up(bytes > 0 ? bytes : 1) <= a->capacity - a->top;
}

void *pt_cuda_scratch(size_t bytes, const char *what)
{
    pt_cuda_arena *a = &pt_cuda.arena;
    size_t size = align_up(bytes > 0 ? bytes : 1);
    if (size > a->capacity - a->top) {
        char detail[160];
        snprintf(detail, sizeof detail, "%zu bytes of scratch do not fit in the CUDA arena (%zu of %zu MiB in use)",
                 size, a->top >> 20, a->capacity >> 20);
        pt_cuda_record_error(what, detail, __FILE__, __LINE__);
        return NULL;
    }
    void *p = a->base + a->top;
    a->top += size;
    if (a->top > a->peak) a->peak = a->top;
    return p;
}

void pt_cuda_scratch_release(size_t mark) { pt_cuda.arena.top = mark; }

/* ---- the table's memory entries --------------------------------------------------- */

pipert_result pt_cuda_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    PT_TRY(arena_take(out, bytes, what));
    if (!PT_CUDA_CHECK(cudaMemsetAsync(*out, 0, bytes, pt_cuda.compute))) {
        arena_give_back(*out);
        *out = NULL;
        return pt_fail(PIPERT_ERR_INTERNAL, "%s: cannot zero the new CUDA buffer: %s", what,
                       pt_cuda.error_message);
    }
    return PIPERT_OK;
}

void pt_cuda_free(void *ptr)
{
    if (ptr) arena_give_back(ptr);
}

void pt_cuda_zero(void *ptr, size_t bytes)
{
    if (bytes) PT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, pt_cuda.compute));
}

void pt_cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, pt_cuda.compute));
}

/* A transfer on the copy stream, ordered as the header comment draws it. */
static void copy_stream_transfer(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (!bytes) return;
    PT_CUDA_CHECK(cudaEventRecord(pt_cuda.compute_mark, pt_cuda.compute));
    PT_CUDA_CHECK(cudaStreamWaitEvent(pt_cuda.copy, pt_cuda.compute_mark, 0));
    PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, pt_cuda.copy));
    PT_CUDA_CHECK(cudaEventRecord(pt_cuda.copy_mark, pt_cuda.copy));
    PT_CUDA_CHECK(cudaStreamWaitEvent(pt_cuda.compute, pt_cuda.copy_mark, 0));
}

static bool is_pinned(const void *host)
{
    cudaPointerAttributes attributes;
    if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
        cudaGetLastError(); /* not an error worth keeping: treat as pageable */
        return false;
    }
    return attributes.type == cudaMemoryTypeHost;
}

/* The table's contract is the CPU's: src_host may be reused once this
 * returns. A copy from pageable memory is staged by the driver before
 * cudaMemcpyAsync returns; from pinned memory the DMA reads the buffer
 * later, so wait for it (callers that want the overlap use
 * pt_cuda_stage_to_device and pt_cuda_copy_wait). */
void pt_cuda_copy_to_device(void *dst, const void *src_host, size_t bytes)
{
    copy_stream_transfer(dst, src_host, bytes, cudaMemcpyHostToDevice);
    if (bytes && is_pinned(src_host)) PT_CUDA_CHECK(cudaEventSynchronize(pt_cuda.copy_mark));
}

/* The host reads dst_host when this returns: copy after the kernels that
 * produce src, then wait. */
void pt_cuda_copy_to_host(void *dst_host, const void *src, size_t bytes)
{
    if (!bytes) return;
    PT_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, pt_cuda.compute));
    PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda.compute));
}

void pt_cuda_synchronize(void)
{
    PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda.copy));
    PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda.compute));
}

/* ---- pinned staging (cuda.h) ------------------------------------------------------ */

extern "C" pipert_result pt_cuda_pinned_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    const pt_kernels *started;
    PT_TRY(pt_kernels_cuda(&started)); /* the device must be chosen first */
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocDefault);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cudaHostAlloc of %zu bytes failed: %s", what, bytes,
                       cudaGetErrorString(err));
    memset(p, 0, bytes);
    *out = p;
    return PIPERT_OK;
}

extern "C" void pt_cuda_pinned_free(void *ptr)
{
    if (ptr) PT_CUDA_CHECK(cudaFreeHost(ptr));
}

extern "C" void pt_cuda_stage_to_host(void *dst_pinned, const void *src_device, size_t bytes)
{
    copy_stream_transfer(dst_pinned, src_device, bytes, cudaMemcpyDeviceToHost);
}

extern "C" void pt_cuda_stage_to_device(void *dst_device, const void *src_pinned, size_t bytes)
{
    copy_stream_transfer(dst_device, src_pinned, bytes, cudaMemcpyHostToDevice);
}

extern "C" pipert_result pt_cuda_copy_wait(void)
{
    if (!pt_cuda.ready) return pt_fail(PIPERT_ERR_NO_DEVICE, "pt_cuda_copy_wait: the CUDA backend is not started");
    PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda.copy));
    return pt_cuda_status();
}
