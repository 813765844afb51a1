/* What every harness in fuzz/ shares: libFuzzer's entry point, which
 * replay_main.c also calls, and a quiet log (a parser's refusals are expected
 * here, thousands of times a second). */
#ifndef PT_FUZZ_H
#define PT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline void fuzz_quiet(void)
{
    static int done;
    if (!done) pt_log_set_level(PT_LOG_ERROR);
    done = 1;
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
