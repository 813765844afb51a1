#include "runtime/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PT_ERROR_CAPACITY 1024

static _Thread_local char last_error[PT_ERROR_CAPACITY];

static const char *const result_names[PIPERT_RESULT_COUNT] = {
    [PIPERT_OK] = "ok",
    [PIPERT_ERR_INVALID_ARG] = "invalid argument",
    [PIPERT_ERR_CONFIG] = "configuration error",
    [PIPERT_ERR_IO] = "input/output error",
    [PIPERT_ERR_FORMAT] = "malformed file",
    [PIPERT_ERR_NOMEM] = "out of memory",
    [PIPERT_ERR_UNSUPPORTED] = "unsupported",
    [PIPERT_ERR_NOT_FOUND] = "not found",
    [PIPERT_ERR_TRANSPORT] = "transport error",
    [PIPERT_ERR_PEER] = "peer error",
    [PIPERT_ERR_TIMEOUT] = "timed out",
    [PIPERT_ERR_AUTH] = "authentication failed",
    [PIPERT_ERR_NO_DEVICE] = "no such device",
    [PIPERT_ERR_INTERRUPTED] = "interrupted",
    [PIPERT_ERR_INTERNAL] = "internal error",
    [PIPERT_ERR_COORDINATOR_LOST] = "coordinator lost",
};

const char *pipert_result_str(pipert_result result)
{
    if ((unsigned)result >= PIPERT_RESULT_COUNT) return "unknown result";
    return result_names[result];
}

const char *pipert_last_error(void) { return last_error; }

#define PT_STRINGIFY_(x) #x
#define PT_STRINGIFY(x) PT_STRINGIFY_(x)

const char *pipert_version(void)
{
    return PT_STRINGIFY(PIPERT_VERSION_MAJOR) "." PT_STRINGIFY(PIPERT_VERSION_MINOR) "." PT_STRINGIFY(
        PIPERT_VERSION_PATCH);
}

pipert_result pt_fail(pipert_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void pt_error_prefix(const char *fmt, ...)
{
    char prefix[PT_ERROR_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[2 * PT_ERROR_CAPACITY + 2];
    snprintf(joined, sizeof joined, "%s: %s", prefix, last_error);
    size_t kept = strnlen(joined, PT_ERROR_CAPACITY - 1); /* truncate deliberately */
    memcpy(last_error, joined, kept);
    last_error[kept] = '\0';
}

void pt_error_clear(void) { last_error[0] = '\0'; }
