/* runtime.device=cpu-guarded: the CPU kernels on memory the host cannot touch
 * except through the table.
 *
 * A GPU's memory is out of the host's reach: code above the kernel table that
 * reads a tensor directly (a checksum, a send, an average, a save) crashes on
 * the GPU only. This table makes that class of bug crash on any machine. Its
 * buffers live in one arena of address space whose pages are PROT_NONE except
 * while a function of this table runs: a kernel, a copy, a zero, a sum. So
 * any other read or write of a "device" tensor (on any thread, by memcpy, by
 * the transport, by process_vm_readv from a peer) faults or fails with EFAULT,
 * as it would on a GPU, while the math is the CPU table's, bit for bit.
 *
 * The arena is reserved once (MAP_NORESERVE: address space, no memory) and
 * handed out bottom up in whole pages, never reused: a freed allocation's
 * pages go back to the kernel (MADV_DONTNEED) but its addresses stay
 * reserved (outside the table's calls a stale pointer into it faults). Calls may come from
 * several threads; the arena is open while any call is inside (a count under
 * a mutex), and closed again when the last one leaves.
 *
 * Peers. CUDA IPC lets a worker copy from another's device memory on the same
 * host; this table stands in for it so that the protocol runs between real
 * processes here: a place in the arena is named by the pid and the address,
 * and peer_copy reads it through /proc/PID/mem, which (unlike
 * process_vm_readv) reads pages a process keeps PROT_NONE, as a debugger
 * does. So a peer's guarded tensors are reached through this table's
 * peer_copy only, as a GPU's are through CUDA IPC only.
 *
 * Copies check their direction: copy is device to device, copy_to_device
 * host to device, copy_to_host device to host. A pointer on the wrong side
 * (a host buffer given to copy, a device one as copy_to_host's destination)
 * makes cudaMemcpy fail on a GPU; here it is logged and faults, by reading
 * a page of the arena that is never handed out, so a test sees a crash. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/memory.h"

/* Address space reserved for every allocation of the process's lifetime. */
#define ARENA_BYTES ((size_t)256 << 30)
/* The arena asks for transparent huge pages: opening and closing it then
 * changes one page-table entry per 2 MiB instead of 512, which is most of
 * what this table costs over the plain CPU one. */
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct allocation {
    uintptr_t start;
    size_t bytes; /* whole pages */
    size_t asked; /* bytes, as alloc was asked for them */
} allocation;

static struct {
    pthread_mutex_t lock;
    char *base;
    size_t top;  /* bytes handed out so far, from base */
    int inside;  /* table calls running now */
    allocation *live;
    size_t n_live, capacity;
    size_t page;
    size_t live_bytes, peak_bytes; /* asked for, live now and at most so far */
} arena = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const pt_kernels *cpu;

static pipert_result reserve_locked(void)
{
    if (arena.base) return PIPERT_OK;
    arena.page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, ARENA_BYTES + HUGE_PAGE, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return pt_fail(PIPERT_ERR_NOMEM, "cpu-guarded: reserving %zu GiB of address space: %s",
                       ARENA_BYTES >> 30, strerror(errno));
    arena.base = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(arena.base, ARENA_BYTES, MADV_HUGEPAGE);
#endif
    return PIPERT_OK;
}

/* What enter and leave change: every page handed out, to a whole huge page. */
static size_t protected_bytes(void) { return (arena.top + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); }

/* Opens [base, base+top) while a call is inside; every path in and out of
 * the table goes through these two. */
static void enter(void)
{
    pthread_mutex_lock(&arena.lock);
    if (arena.inside++ == 0 && arena.top)
        mprotect(arena.base, protected_bytes(), PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&arena.lock);
}

static void leave(void)
{
    pthread_mutex_lock(&arena.lock);
    if (--arena.inside == 0 && arena.top) mprotect(arena.base, protected_bytes(), PROT_NONE);
    pthread_mutex_unlock(&arena.lock);
}

#define GUARDED(call)                                                                              \
    do {                                                                                           \
        enter();                                                                                   \
        call;                                                                                      \
        leave();                                                                                   \
    } while (0)

static pipert_result remember_locked(uintptr_t start, size_t bytes, size_t asked,
                                     const char *what)
{
    if (arena.n_live == arena.capacity) {
        size_t capacity = arena.capacity ? 2 * arena.capacity : 64;
        allocation *grown = realloc(arena.live, capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "cpu-guarded: out of memory for %s", what);
        arena.live = grown;
        arena.capacity = capacity;
    }
    arena.live[arena.n_live++] = (allocation){start, bytes, asked};
    arena.live_bytes += asked;
    if (arena.live_bytes > arena.peak_bytes) arena.peak_bytes = arena.live_bytes;
    return PIPERT_OK;
}

static pipert_result g_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    pthread_mutex_lock(&arena.lock);
    pipert_result rc = reserve_locked();
    /* whole pages, at least one (a zero-byte allocation still gets an address of its own) */
    const size_t rounded = bytes ? (bytes + arena.page - 1) / arena.page * arena.page : arena.page;
    if (rc == PIPERT_OK && (rounded < bytes || rounded > ARENA_BYTES - arena.top))
        rc = pt_fail(PIPERT_ERR_NOMEM,
                     "cpu-guarded: %s needs %zu bytes; %zu of the %zu GiB arena are used", what,
                     bytes,
                     arena.top, ARENA_BYTES >> 30);
    char *start = arena.base + arena.top;
    if (rc == PIPERT_OK) rc = remember_locked((uintptr_t)start, rounded, bytes, what);
    if (rc == PIPERT_OK) {
        arena.top += rounded; /* fresh pages: zero-filled */
        if (arena.inside) mprotect(arena.base, protected_bytes(), PROT_READ | PROT_WRITE);
        *out = start;
    }
    pthread_mutex_unlock(&arena.lock);
    return rc;
}

static void g_free(void *ptr)
{
    if (!ptr) return;
    pthread_mutex_lock(&arena.lock);
    for (size_t i = 0; i < arena.n_live; i++) {
        if (arena.live[i].start != (uintptr_t)ptr) continue;
        madvise(ptr, arena.live[i].bytes, MADV_DONTNEED); /* the memory back; the addresses stay */
        arena.live_bytes -= arena.live[i].asked;
        arena.live[i] = arena.live[--arena.n_live];
        break;
    }
    pthread_mutex_unlock(&arena.lock);
}

static void g_zero(void *p, size_t n) { GUARDED(cpu->zero(p, n)); }

/* Whether [p, p + n) lies in memory this table handed out: "device" memory. */
static bool on_device(const void *p, size_t n)
{
    pthread_mutex_lock(&arena.lock);
    const uintptr_t start = (uintptr_t)p, base = (uintptr_t)arena.base;
    const bool inside = arena.base && start >= base && start - base + n <= arena.top;
    pthread_mutex_unlock(&arena.lock);
    return inside;
}

/* A copy with a pointer on the wrong side, named, then a fault (the header says why). */
static void wrong_side(const char *copy, const void *d, const void *s, size_t n)
{
    pt_error("cpu-guarded: %s of %zu bytes from %p (%s memory) to %p (%s memory): a pointer on "
             "the wrong side, which a GPU's copy refuses",
             copy, n, s, on_device(s, n) ? "device" : "host", d, on_device(d, n) ? "device" : "host");
    volatile const char *never_handed_out = arena.base + ARENA_BYTES - 1;
    (void)*never_handed_out;
}

static void g_copy(void *d, const void *s, size_t n)
{
    if (n && (!on_device(d, n) || !on_device(s, n))) wrong_side("copy", d, s, n);
    GUARDED(cpu->copy(d, s, n));
}
static void g_copy_to_device(void *d, const void *s, size_t n)
{
    if (n && (!on_device(d, n) || on_device(s, n))) wrong_side("copy_to_device", d, s, n);
    GUARDED(cpu->copy_to_device(d, s, n));
}
static void g_copy_to_host(void *d, const void *s, size_t n)
{
    if (n && (on_device(d, n) || !on_device(s, n))) wrong_side("copy_to_host", d, s, n);
    GUARDED(cpu->copy_to_host(d, s, n));
}
static void g_synchronize(void) {}

static void g_encoder_forward(float *o, const int32_t *t, const float *wte, const float *wpe,
                              int B, int T, int C)
{
    GUARDED(cpu->encoder_forward(o, t, wte, wpe, B, T, C));
}
static void g_encoder_backward(float *dwte, float *dwpe, const float *d, const int32_t *t, int B,
                               int T, int C)
{
    GUARDED(cpu->encoder_backward(dwte, dwpe, d, t, B, T, C));
}
static void g_layernorm_forward(float *o, float *m, float *r, const float *i, const float *w,
                                const float *b, int N, int C)
{
    GUARDED(cpu->layernorm_forward(o, m, r, i, w, b, N, C));
}
static void g_layernorm_backward(float *di, float *dw, float *db, const float *d, const float *i,
                                 const float *w, const float *m, const float *r, int N, int C)
{
    GUARDED(cpu->layernorm_backward(di, dw, db, d, i, w, m, r, N, C));
}
static void g_layernorm_backward_bf16(float *di, pt_bf16 *d16, float *dw, float *db,
                                      const float *d, const float *i, const float *w,
                                      const float *m, const float *r, int N, int C)
{
    GUARDED(cpu->layernorm_backward_bf16(di, d16, dw, db, d, i, w, m, r, N, C));
}
static void g_matmul_forward(float *o, const float *i, const float *w, const float *b, int N,
                             int C, int OC, pt_weight_layout l)
{
    GUARDED(cpu->matmul_forward(o, i, w, b, N, C, OC, l));
}
static void g_matmul_backward(float *di, float *dw, float *db, const float *d, const float *i,
                              const float *w, int N, int C, int OC, pt_weight_layout l)
{
    GUARDED(cpu->matmul_backward(di, dw, db, d, i, w, N, C, OC, l));
}
static void g_cast_to_bf16(pt_bf16 *o, const float *i, size_t n)
{
    GUARDED(cpu->cast_to_bf16(o, i, n));
}
static void g_cast_from_bf16(float *o, const pt_bf16 *i, size_t n)
{
    GUARDED(cpu->cast_from_bf16(o, i, n));
}
static void g_matmul_backward_bf16_dinp_written(float *di, float *dw, float *db,
                                                const pt_bf16 *d, const pt_bf16 *i,
                                                const pt_bf16 *w, int N, int C, int OC, int ld,
                                                pt_weight_layout l)
{
    GUARDED(cpu->matmul_backward_bf16_dinp_written(di, dw, db, d, i, w, N, C, OC, ld, l));
}
static void g_attention_forward_bf16_to_bf16(pt_bf16 *o, float *x, float *a, const pt_bf16 *q,
                                             int B, int T, int C, int NH)
{
    GUARDED(cpu->attention_forward_bf16_to_bf16(o, x, a, q, B, T, C, NH));
}
static void g_attention_backward_bf16_to_bf16(pt_bf16 *dq, float *x, const float *d,
                                              const pt_bf16 *q, const float *a, int B, int T,
                                              int C, int NH)
{
    GUARDED(cpu->attention_backward_bf16_to_bf16(dq, x, d, q, a, B, T, C, NH));
}
static void g_layernorm_forward_bf16(pt_bf16 *o, float *m, float *r, const float *i,
                                     const float *w, const float *b, int N, int C)
{
    GUARDED(cpu->layernorm_forward_bf16(o, m, r, i, w, b, N, C));
}
static void g_residual_layernorm_forward(float *x, float *o, float *m, float *r, const float *a,
                                         const float *b, const float *w, const float *bi, int N,
                                         int C)
{
    GUARDED(cpu->residual_layernorm_forward(x, o, m, r, a, b, w, bi, N, C));
}
static void g_residual_layernorm_forward_bf16(float *x, pt_bf16 *o, float *m, float *r,
                                              const float *a, const float *b, const float *w,
                                              const float *bi, int N, int C)
{
    GUARDED(cpu->residual_layernorm_forward_bf16(x, o, m, r, a, b, w, bi, N, C));
}
static void g_matmul_forward_bf16(float *o, const pt_bf16 *i, const pt_bf16 *w, const float *b,
                                  int N, int C, int OC, pt_weight_layout l)
{
    GUARDED(cpu->matmul_forward_bf16(o, i, w, b, N, C, OC, l));
}
static void g_matmul_backward_bf16(float *di, float *dw, float *db, const pt_bf16 *d,
                                   const pt_bf16 *i, const pt_bf16 *w, int N, int C, int OC,
                                   pt_weight_layout l)
{
    GUARDED(cpu->matmul_backward_bf16(di, dw, db, d, i, w, N, C, OC, l));
}
static void g_matmul_forward_bf16_to_bf16(pt_bf16 *o, float *x, const pt_bf16 *i,
                                          const pt_bf16 *w, const float *b, int N, int C, int OC,
                                          int ld, pt_weight_layout l)
{
    GUARDED(cpu->matmul_forward_bf16_to_bf16(o, x, i, w, b, N, C, OC, ld, l));
}
static void g_matmul_gelu_backward_bf16(pt_bf16 *dp, float *x, float *dw, float *db,
                                        const pt_bf16 *d, const pt_bf16 *i, const pt_bf16 *p,
                                        const pt_bf16 *w, int N, int C, int OC, pt_weight_layout l)
{
    GUARDED(cpu->matmul_gelu_backward_bf16(dp, x, dw, db, d, i, p, w, N, C, OC, l));
}
static void g_attention_forward(float *o, float *a, const float *q, int B, int T, int C, int NH)
{
    GUARDED(cpu->attention_forward(o, a, q, B, T, C, NH));
}
static void g_attention_backward(float *dq, const float *d, const float *q, const float *a, int B,
                                 int T, int C, int NH)
{
    GUARDED(cpu->attention_backward(dq, d, q, a, B, T, C, NH));
}
static void g_attention_forward_bf16(float *o, float *a, const pt_bf16 *q, int B, int T, int C,
                                     int NH)
{
    GUARDED(cpu->attention_forward_bf16(o, a, q, B, T, C, NH));
}
static void g_attention_backward_bf16(float *dq, const float *d, const pt_bf16 *q, const float *a,
                                      int B, int T, int C, int NH)
{
    GUARDED(cpu->attention_backward_bf16(dq, d, q, a, B, T, C, NH));
}
static void g_gelu_forward_bf16(pt_bf16 *o, const pt_bf16 *i, size_t n)
{
    GUARDED(cpu->gelu_forward_bf16(o, i, n));
}
static void g_gelu_backward_bf16(float *di, const pt_bf16 *i, const float *d, size_t n)
{
    GUARDED(cpu->gelu_backward_bf16(di, i, d, n));
}
static void g_gelu_forward(float *o, const float *i, size_t n)
{
    GUARDED(cpu->gelu_forward(o, i, n));
}
static void g_gelu_backward(float *di, const float *i, const float *d, size_t n)
{
    GUARDED(cpu->gelu_backward(di, i, d, n));
}
static void g_residual_forward(float *o, const float *a, const float *b, size_t n)
{
    GUARDED(cpu->residual_forward(o, a, b, n));
}
static void g_crossentropy_forward(float *l, const float *x, const int32_t *t, int N, int V)
{
    GUARDED(cpu->crossentropy_forward(l, x, t, N, V));
}
static void g_crossentropy_forward_backward(float *l, float *x, const int32_t *t, int N, int V,
                                            float d)
{
    GUARDED(cpu->crossentropy_forward_backward(l, x, t, N, V, d));
}
static void g_crossentropy_forward_bf16(float *l, const pt_bf16 *x, const int32_t *t, int N, int V,
                                        int ld)
{
    GUARDED(cpu->crossentropy_forward_bf16(l, x, t, N, V, ld));
}
static void g_crossentropy_forward_backward_bf16(float *l, pt_bf16 *x, const int32_t *t, int N,
                                                 int V, int ld, float d)
{
    GUARDED(cpu->crossentropy_forward_backward_bf16(l, x, t, N, V, ld, d));
}
static void g_adam_update(float *p, const float *g, float *m, float *v, const pt_param_region *r,
                          int nr, const pt_adam_coeffs *c, const pt_adam_coeffs *c0, float s)
{
    GUARDED(cpu->adam_update(p, g, m, v, r, nr, c, c0, s));
}
static void g_adam_extrapolate(float *o, const float *p, const float *m, const float *v,
                               size_t n, const pt_adam_coeffs *c, float steps)
{
    GUARDED(cpu->adam_extrapolate(o, p, m, v, n, c, steps));
}
static void g_delay_compensate(float *g, const float *now, const float *used, const float *v,
                               size_t n, const pt_adam_coeffs *c, float lambda)
{
    GUARDED(cpu->delay_compensate(g, now, used, v, n, c, lambda));
}
static void g_secant_compensate(float *g, const float *now, const float *used, float *pg, float *pu,
                                float *num, float *den, const float *v, size_t n,
                                const pt_secant_coeffs *c)
{
    GUARDED(cpu->secant_compensate(g, now, used, pg, pu, num, den, v, n, c));
}
static double g_sum_squares(const float *x, size_t n)
{
    double r;
    GUARDED(r = cpu->sum_squares(x, n));
    return r;
}
static double g_sum(const float *x, size_t n)
{
    double r;
    GUARDED(r = cpu->sum(x, n));
    return r;
}
static void g_scale(float *x, float f, size_t n) { GUARDED(cpu->scale(x, f, n)); }
static void g_gather(float *out, const float *src, const uint32_t *index, size_t n)
{
    GUARDED(cpu->gather(out, src, index, n));
}
static void g_scatter(float *dst, const uint32_t *index, const float *values, size_t n)
{
    GUARDED(cpu->scatter(dst, index, values, n));
}

/* ---- memory other processes copy from ---------------------------------------- */

#define PEER_MAGIC 0x44524750u /* "PGRD" */

typedef struct guarded_peer_memory {
    uint32_t magic;
    int32_t pid;
    uint64_t address;
} guarded_peer_memory;

_Static_assert(sizeof(guarded_peer_memory) <= PT_PEER_MEMORY_BYTES, "fits a pt_peer_memory");

static pipert_result g_peer_export(const void *ptr, pt_peer_memory *out)
{
    pthread_mutex_lock(&arena.lock);
    const bool inside = arena.base && (const char *)ptr >= arena.base &&
                        (const char *)ptr < arena.base + arena.top;
    pthread_mutex_unlock(&arena.lock);
    if (!inside)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "cpu-guarded: %p is not in this table's memory: nothing to export", ptr);
    const guarded_peer_memory m = {PEER_MAGIC, (int32_t)getpid(), (uint64_t)(uintptr_t)ptr};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &m, sizeof m);
    return PIPERT_OK;
}

/* Reads `bytes` at `address` of process `pid` into dst (open: called between enter and leave).
 * Returns 0 or an errno. The file is opened for each copy: a cached one could outlive its
 * process and, its pid reused, read another's. */
static int read_peer_memory(pid_t pid, uint64_t address, void *dst, size_t bytes)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int error = 0;
    for (size_t done = 0; done < bytes && !error;) {
        const ssize_t got = pread(fd, (char *)dst + done, bytes - done, (off_t)(address + done));
        if (got < 0 && errno != EINTR) error = errno;
        else if (got == 0) error = EFAULT;
        else if (got > 0) done += (size_t)got;
    }
    close(fd);
    return error;
}

static pipert_result g_peer_copy(void *dst, const pt_peer_memory *src, size_t bytes)
{
    guarded_peer_memory m;
    memcpy(&m, src->bytes, sizeof m);
    if (m.magic != PEER_MAGIC || m.pid <= 0)
        return pt_fail(PIPERT_ERR_PEER, "cpu-guarded: the peer memory to copy from is not a "
                                        "cpu-guarded table's");
    int error;
    GUARDED(error = read_peer_memory((pid_t)m.pid, m.address, dst, bytes));
    if (error)
        return pt_fail(PIPERT_ERR_PEER, "cpu-guarded: copying %zu bytes from process %d: %s", bytes,
                       (int)m.pid, strerror(error));
    return PIPERT_OK;
}

static pt_kernels guarded = {
    .name = "cpu-guarded",
    .host_accessible = false,
    .alloc = g_alloc,
    .free = g_free,
    .zero = g_zero,
    .copy_to_device = g_copy_to_device,
    .copy_to_host = g_copy_to_host,
    .copy = g_copy,
    .synchronize = g_synchronize,
    .alloc_host = pt_alloc,
    .free_host = pt_free,
    .peer_export = g_peer_export,
    .peer_copy = g_peer_copy,
    .set_threads = pt_kernels_cpu_set_threads,
    .encoder_forward = g_encoder_forward,
    .encoder_backward = g_encoder_backward,
    .layernorm_forward = g_layernorm_forward,
    .layernorm_backward = g_layernorm_backward,
    .layernorm_backward_bf16 = g_layernorm_backward_bf16,
    .matmul_forward = g_matmul_forward,
    .matmul_backward = g_matmul_backward,
    .cast_to_bf16 = g_cast_to_bf16,
    .cast_from_bf16 = g_cast_from_bf16,
    .layernorm_forward_bf16 = g_layernorm_forward_bf16,
    .residual_layernorm_forward = g_residual_layernorm_forward,
    .residual_layernorm_forward_bf16 = g_residual_layernorm_forward_bf16,
    .matmul_forward_bf16 = g_matmul_forward_bf16,
    .matmul_backward_bf16 = g_matmul_backward_bf16,
    .matmul_backward_bf16_dinp_written = g_matmul_backward_bf16_dinp_written,
    .matmul_forward_bf16_to_bf16 = g_matmul_forward_bf16_to_bf16,
    .matmul_gelu_backward_bf16 = g_matmul_gelu_backward_bf16,
    .attention_forward = g_attention_forward,
    .attention_backward = g_attention_backward,
    .gelu_forward = g_gelu_forward,
    .gelu_backward = g_gelu_backward,
    .attention_forward_bf16 = g_attention_forward_bf16,
    .attention_backward_bf16 = g_attention_backward_bf16,
    .attention_forward_bf16_to_bf16 = g_attention_forward_bf16_to_bf16,
    .attention_backward_bf16_to_bf16 = g_attention_backward_bf16_to_bf16,
    .gelu_forward_bf16 = g_gelu_forward_bf16,
    .gelu_backward_bf16 = g_gelu_backward_bf16,
    .residual_forward = g_residual_forward,
    .crossentropy_forward = g_crossentropy_forward,
    .crossentropy_forward_backward = g_crossentropy_forward_backward,
    .crossentropy_forward_bf16 = g_crossentropy_forward_bf16,
    .crossentropy_forward_backward_bf16 = g_crossentropy_forward_backward_bf16,
    .adam_update = g_adam_update,
    .adam_extrapolate = g_adam_extrapolate,
    .delay_compensate = g_delay_compensate,
    .secant_compensate = g_secant_compensate,
    .sum_squares = g_sum_squares,
    .sum = g_sum,
    .scale = g_scale,
    .gather = g_gather,
    .scatter = g_scatter,
};

static void bind_cpu(void)
{
    cpu = pt_kernels_cpu();
    guarded.attention_saved_floats = cpu->attention_saved_floats; /* pure arithmetic */
}

size_t pt_kernels_cpu_guarded_peak_bytes(void)
{
    pthread_mutex_lock(&arena.lock);
    const size_t peak = arena.peak_bytes;
    pthread_mutex_unlock(&arena.lock);
    return peak;
}

const pt_kernels *pt_kernels_cpu_guarded(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bind_cpu);
    return &guarded;
}
