/* Result codes and the per-thread message of the last failure. */
#ifndef PT_ERROR_H
#define PT_ERROR_H

#include "pipert/pipert.h"

/* Records a formatted message for `code` on this thread and returns `code`, so
 * a failure is reported and propagated in one line:
 *     return pt_fail(PIPERT_ERR_FORMAT, "%s: truncated header", path);
 */
pipert_result pt_fail(pipert_result code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message (adds context on the way up). */
void pt_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Forgets the last message. */
void pt_error_clear(void);

/* Propagates a failure: PT_TRY(expr) returns expr's result if it is not OK. */
#define PT_TRY(expr)                                                                               \
    do {                                                                                           \
        pipert_result pt_try_rc_ = (expr);                                                         \
        if (pt_try_rc_ != PIPERT_OK) return pt_try_rc_;                                           \
    } while (0)

#endif
