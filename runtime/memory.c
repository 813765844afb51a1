#include "runtime/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Buffers of at least HUGE_MIN_BYTES are aligned to HUGE_PAGE_BYTES and asked for transparent
 * huge pages (where the kernel gives them on request: THP "madvise", Debian's default). A
 * fresh buffer otherwise costs a page fault per 4 KiB when first touched: for a stage's state
 * of hundreds of MB that was most of the time it took to copy it (session/join.c), and it
 * slows a large model's start. */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)
#define HUGE_MIN_BYTES ((size_t)8 << 20)

pipert_result pt_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    if (bytes == 0) bytes = PT_ALIGNMENT;
    const size_t alignment = bytes >= HUGE_MIN_BYTES ? HUGE_PAGE_BYTES : PT_ALIGNMENT;
    size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    if (rounded < bytes) return pt_fail(PIPERT_ERR_NOMEM, "%s: size overflows", what);
    void *ptr = aligned_alloc(alignment, rounded);
    if (!ptr)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %.1f MiB", what,
                       (double)bytes / (1 << 20));
#ifdef MADV_HUGEPAGE
    if (alignment == HUGE_PAGE_BYTES) (void)madvise(ptr, rounded, MADV_HUGEPAGE);
#endif
    memset(ptr, 0, rounded);
    *out = ptr;
    return PIPERT_OK;
}

void pt_free(void *ptr) { free(ptr); }

size_t pt_memory_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                fclose(f);
                return (size_t)kib * 1024;
            }
        }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)-1;
}

pipert_result pt_memory_check_fits(size_t bytes, const char *what)
{
    size_t available = pt_memory_available();
    if (bytes > available)
        return pt_fail(PIPERT_ERR_NOMEM,
                       "%s needs %.2f GiB but only %.2f GiB of memory is available",
                       what, (double)bytes / (1 << 30), (double)available / (1 << 30));
    return PIPERT_OK;
}

int pt_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
