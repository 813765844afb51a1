/* What every harness in fuzz/ shares: libFuzzer's entry point, which
 * replay_main.c also calls, and a quiet log (a parser's refusals, and a
 * coordinator's aborts, are expected here thousands of times a second). */
#ifndef PT_FUZZ_H
#define PT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline void fuzz_drop_line(void *user, pt_log_level level, const char *line)
{
    (void)user, (void)level, (void)line;
}

/* Log lines of this thread (where the harness runs the code) go nowhere. */
static inline void fuzz_quiet(void)
{
    static const pt_log_sink nowhere = {fuzz_drop_line, NULL, PT_LOG_ERROR, -1};
    pt_log_use_sink(&nowhere);
}

/* A property of an accepted input does not hold: a bug, whatever the input. */
#define FUZZ_CHECK(condition)                                                                      \
    do {                                                                                           \
        if (!(condition)) {                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
