#include "runtime/name_table.h"

#include <stdio.h>
#include <string.h>

#include "runtime/error.h"

static const char *name_of(const void *rows, size_t i, size_t stride, size_t name_offset)
{
    const char *const *name = (const char *const *)((const char *)rows + i * stride + name_offset);
    return *name;
}

int pt_name_table_index(const void *rows, size_t count, size_t stride, size_t name_offset,
                        const char *name, const char *key)
{
    char known[256] = "";
    for (size_t i = 0; i < count; i++) {
        const char *row = name_of(rows, i, stride, name_offset);
        if (name && !strcmp(name, row)) return (int)i;
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", row);
    }
    pt_fail(PIPERT_ERR_CONFIG, "%s: unknown \"%s\" (known: %s)", key, name ? name : "", known);
    return -1;
}
