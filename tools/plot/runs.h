/* What `pipert plot` draws, read from run directories: the training and
 * validation loss against tokens and wall time (DIR/metrics.jsonl), the
 * coupling method and its compression, and the bytes sent between sites per
 * step (DIR/metrics-stage-N.jsonl; dp_bytes where a run predates bytes_wan). */
#ifndef PT_PLOT_RUNS_H
#define PT_PLOT_RUNS_H

#include <stdbool.h>
#include <stddef.h>

#include "pipert/pipert.h"

typedef struct pt_plot_point {
    double tokens, seconds, loss;
} pt_plot_point;

typedef struct pt_plot_run {
    char label[256];     /* "DIR-NAME (method)", "DIR-NAME (method, compression)" */
    pt_plot_point *train; /* [n_train] */
    pt_plot_point *val;   /* [n_val] */
    size_t n_train, n_val;
    double wan_bytes_per_step; /* mean over logged steps, summed over stages */
    /* The stage lines skip steps (train.log_every > 1): each holds the bytes
     * of its own step only, so the mean is of the logged steps, not of all
     * (wrong for methods that send every H steps). */
    bool bytes_sampled;
} pt_plot_run;

/* Reads a run directory. Errors name the file and line. */
pipert_result pt_plot_read_run(const char *dir, pt_plot_run *run);
void pt_plot_free_run(pt_plot_run *run);

#endif
