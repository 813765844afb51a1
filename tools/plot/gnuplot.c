#define _XOPEN_SOURCE 700
#include "tools/plot/gnuplot.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "tools/command.h"

static const char *const pictures[] = {"loss-tokens.png", "loss-time.png", "bytes-between-sites.png"};
#define PICTURES 3

/* s as a gnuplot single-quoted string (a quote inside is doubled). */
static void quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static pipert_result write_points(const char *path, const pt_plot_point *p, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) return pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
    for (size_t i = 0; i < n; i++) fprintf(f, "%.17g %.17g %.17g\n", p[i].tokens, p[i].seconds, p[i].loss);
    return fclose(f) == 0 ? PIPERT_OK : pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
}

static pipert_result write_data(const char *tmp, const pt_plot_run *runs, int n)
{
    char path[PATH_MAX];
    for (int k = 0; k < n; k++) {
        snprintf(path, sizeof path, "%s/train-%d.dat", tmp, k);
        PT_TRY(write_points(path, runs[k].train, runs[k].n_train));
        snprintf(path, sizeof path, "%s/val-%d.dat", tmp, k);
        PT_TRY(write_points(path, runs[k].val, runs[k].n_val));
    }
    return PIPERT_OK;
}

/* One loss picture: x is column 1 (tokens) or 2 (seconds). */
static void plot_losses(FILE *f, const char *tmp, const pt_plot_run *runs, int n, int column)
{
    fprintf(f, "set xlabel '%s'\nset ylabel 'loss'\nset key top right\nset grid\nset style data lines\n",
            column == 1 ? "tokens" : "wall time (s)");
    fputs("plot ", f);
    for (int k = 0; k < n; k++) {
        fprintf(f, "%s'%s/train-%d.dat' using %d:3 lw 1.5 lc %d title ", k ? ", " : "", tmp, k,
                column, k + 1);
        quoted(f, runs[k].label);
        if (runs[k].n_val == 0) continue;
        fprintf(f, ", '%s/val-%d.dat' using %d:3 with linespoints dt 2 pt 7 lc %d title ", tmp, k,
                column, k + 1);
        char label[300];
        snprintf(label, sizeof label, "%s, validation", runs[k].label);
        quoted(f, label);
    }
    fputc('\n', f);
}

static void plot_bytes(FILE *f, const pt_plot_run *runs, int n)
{
    fputs("set style data histograms\nset style fill solid 0.8\nset boxwidth 0.6\nset grid ytics\n"
          "set ylabel 'MB sent between sites per step'\nset xlabel ''\nset xtics rotate by -15\n"
          "set yrange [0:*]\nplot '-' using 2:xtic(1) notitle lc 3\n",
          f);
    for (int k = 0; k < n; k++) {
        /* a string column of inline data is double-quoted, with no escapes */
        fputc('"', f);
        for (const char *c = runs[k].label; *c; c++) fputc(*c == '"' ? '\'' : *c, f);
        fprintf(f, "\" %.9g\n", runs[k].wan_bytes_per_step / 1e6);
    }
    fputs("e\n", f);
}

static pipert_result write_script(const char *path, const char *tmp, const pt_plot_run *runs,
                                  int n, const char *out_dir)
{
    FILE *f = fopen(path, "w");
    if (!f) return pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f, "set terminal pngcairo size %d,%d noenhanced\n", PT_PLOT_WIDTH, PT_PLOT_HEIGHT);
    for (int picture = 0; picture < PICTURES; picture++) {
        char output[PATH_MAX + 64];
        snprintf(output, sizeof output, "%s/%s.tmp", out_dir, pictures[picture]);
        fputs("reset\nset output ", f);
        quoted(f, output);
        fputc('\n', f);
        if (picture < 2) plot_losses(f, tmp, runs, n, picture + 1);
        else plot_bytes(f, runs, n);
    }
    fputs("unset output\n", f);
    return fclose(f) == 0 ? PIPERT_OK : pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
}

static pipert_result rename_pictures(const char *out_dir)
{
    for (int picture = 0; picture < PICTURES; picture++) {
        char from[PATH_MAX + 80], to[PATH_MAX + 64];
        snprintf(to, sizeof to, "%s/%s", out_dir, pictures[picture]);
        snprintf(from, sizeof from, "%s.tmp", to);
        if (rename(from, to) != 0) return pt_fail(PIPERT_ERR_IO, "%s: %s", to, strerror(errno));
    }
    return PIPERT_OK;
}

/* After a failure: what gnuplot wrote under temporary names. */
static void remove_partial_pictures(const char *out_dir)
{
    for (int picture = 0; picture < PICTURES; picture++) {
        char path[PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s.tmp", out_dir, pictures[picture]);
        remove(path);
    }
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

pipert_result pt_plot_draw(const pt_plot_run *runs, int n, const char *out_dir)
{
    char tmp[] = "/tmp/pipert-plot-XXXXXX", script[PATH_MAX];
    if (!mkdtemp(tmp)) return pt_fail(PIPERT_ERR_IO, "cannot make a directory in /tmp: %s", strerror(errno));
    snprintf(script, sizeof script, "%s/plot.gp", tmp);
    pipert_result rc = write_data(tmp, runs, n);
    if (rc == PIPERT_OK) rc = write_script(script, tmp, runs, n, out_dir);
    const char *argv[] = {"gnuplot", script, NULL};
    if (rc == PIPERT_OK) rc = pt_run_command(argv);
    if (rc == PIPERT_OK) rc = rename_pictures(out_dir);
    if (rc != PIPERT_OK) remove_partial_pictures(out_dir);
    nftw(tmp, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    return rc;
}
