#include "runtime/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

pipert_result pt_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    if (bytes == 0) bytes = PT_ALIGNMENT;
    size_t rounded = (bytes + PT_ALIGNMENT - 1) / PT_ALIGNMENT * PT_ALIGNMENT;
    if (rounded < bytes) return pt_fail(PIPERT_ERR_NOMEM, "%s: size overflows", what);
    void *ptr = aligned_alloc(PT_ALIGNMENT, rounded);
    if (!ptr)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %.1f MiB", what,
                       (double)bytes / (1 << 20));
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
