/* Metrics as JSON lines, one object per line, flushed as written. */
#ifndef PT_METRICS_H
#define PT_METRICS_H

#include <jansson.h>
#include <stdbool.h>

#include "runtime/error.h"

typedef struct pt_metrics {
    FILE *file;
    char *path;
} pt_metrics;

/* Opens `path` for appending. With keep_through_step ≥ 0 (a resumed run),
 * lines whose "step" is beyond it are dropped first (atomically), so a run
 * resumed from step S does not list steps after S twice. */
pipert_result pt_metrics_open(pt_metrics *m, const char *path, long keep_through_step);
/* Writes one line and releases `line`. */
pipert_result pt_metrics_write(pt_metrics *m, json_t *line);
void pt_metrics_close(pt_metrics *m);

#endif
