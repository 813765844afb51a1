/* Draws the runs of tools/plot/runs.h with gnuplot (a child process; its
 * data and script in a private temporary directory removed afterwards):
 *   OUT/loss-tokens.png          training (solid) and validation (dashed, points) loss against tokens
 *   OUT/loss-time.png            the same against wall time
 *   OUT/bytes-between-sites.png  a bar per run: bytes sent between sites per step
 * Each file is written under a temporary name and renamed into place; when
 * gnuplot fails (or is not installed) the temporary files are removed. */
#ifndef PT_PLOT_GNUPLOT_H
#define PT_PLOT_GNUPLOT_H

#include "tools/plot/runs.h"

#define PT_PLOT_WIDTH 1000
#define PT_PLOT_HEIGHT 600

pipert_result pt_plot_draw(const pt_plot_run *runs, int n_runs, const char *out_dir);

#endif
