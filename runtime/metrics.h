/* Metrics as JSON lines (one object per line, flushed as written) and the
 * human-facing progress output: a line redrawn in place when stdout is a
 * terminal, plain log lines otherwise. */
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

typedef struct pt_progress {
    bool interactive; /* stdout is a terminal: redraw one line */
    bool quiet;
    bool line_open;   /* a redrawable line is on screen */
    double started;
} pt_progress;

void pt_progress_init(pt_progress *p, bool quiet);
/* Shows `text` (one line, no newline) as the current state. Interactive: the
 * line is redrawn; otherwise it is printed when `persist` is set. */
void pt_progress_update(pt_progress *p, const char *text, bool persist);
/* Prints a line that stays (validation results, checkpoints). */
void pt_progress_print(pt_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pt_progress_finish(pt_progress *p);

#endif
