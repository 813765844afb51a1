#include "scheduler/json_fields.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/error.h"

pipert_result pt_json_field_error(const char *path, const char *field, const char *fmt, ...)
{
    char message[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return pt_fail(PIPERT_ERR_CONFIG, "%s: %s: %s", path, field, message);
}

pipert_result pt_json_only_known_keys(const char *path, const char *field, json_t *object,
                                      const char *const *known)
{
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value) {
        const char *const *k = known;
        while (*k && strcmp(*k, key) != 0) k++;
        if (!*k) return pt_json_field_error(path, field, "unknown key '%s'", key);
    }
    return PIPERT_OK;
}
