/* `pipert plot`: PNG pictures of one or more runs (tools/plot/): loss against
 * tokens and against wall time, one line per run with its coupling method in
 * the legend, and the bytes each run sent between sites per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/fileio.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/plot/gnuplot.h"

/* argv split in two: the flags (for pt_cli_parse) and the run directories,
 * every argument that is not a flag or a flag's value. */
typedef struct plot_arguments {
    char **flags, **dirs; /* [argc + 1] each */
    int n_flags, n_dirs;
} plot_arguments;

static bool split_arguments(int argc, char **argv, plot_arguments *a)
{
    a->flags = calloc((size_t)argc + 1, sizeof *a->flags);
    a->dirs = calloc((size_t)argc + 1, sizeof *a->dirs);
    a->n_flags = a->n_dirs = 0;
    if (!a->flags || !a->dirs) return false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            a->flags[a->n_flags++] = argv[i++];
            a->flags[a->n_flags++] = argv[i];
        } else if (!strncmp(argv[i], "--", 2) || !strcmp(argv[i], "-h")) {
            a->flags[a->n_flags++] = argv[i];
        } else {
            a->dirs[a->n_dirs++] = argv[i];
        }
    }
    return true;
}

static void free_arguments(plot_arguments *a)
{
    free(a->flags);
    free(a->dirs);
}

static void note_sampled_bytes(const pt_plot_run *run, const char *dir)
{
    if (!run->bytes_sampled) return;
    fprintf(stderr, "pipert plot: note: %s has a metrics line every few steps (train.log_every > 1): "
                    "its bytes between sites per step are the mean of those steps only (exact with "
                    "--train.log_every=1)\n", dir);
}

/* Reads every run directory, then draws them into out_dir. */
static pipert_result plot_runs(char **dirs, int n_dirs, const char *out_dir)
{
    pt_plot_run *runs = calloc((size_t)n_dirs, sizeof *runs);
    if (!runs) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    pipert_result rc = PIPERT_OK;
    int read = 0;
    for (; rc == PIPERT_OK && read < n_dirs; read++) rc = pt_plot_read_run(dirs[read], &runs[read]);
    for (int k = 0; rc == PIPERT_OK && k < n_dirs; k++) note_sampled_bytes(&runs[k], dirs[k]);
    if (rc == PIPERT_OK) rc = pt_make_dirs(out_dir);
    if (rc == PIPERT_OK) rc = pt_plot_draw(runs, n_dirs, out_dir);
    for (int k = 0; k < read; k++) pt_plot_free_run(&runs[k]);
    free(runs);
    return rc;
}

int pt_cmd_plot(int argc, char **argv)
{
    const char *out_dir = NULL;
    const pt_cli_flag flags[] = {
        {"--out", "DIR", "where the pictures go (required): loss-tokens.png, loss-time.png, "
                         "bytes-between-sites.png", &out_dir, NULL},
    };
    const pt_cli cli = {"plot", "--out DIR RUN_DIR [RUN_DIR ...]",
                        "PNG pictures of runs (gnuplot): training and validation loss against\n"
                        "tokens and against wall time, one line per run with its coupling method\n"
                        "in the legend, and the bytes each run sent between sites per step.",
                        flags, (int)(sizeof flags / sizeof flags[0]), false, NULL};
    plot_arguments args;
    if (!split_arguments(argc, argv, &args)) {
        free_arguments(&args);
        fprintf(stderr, "pipert plot: out of memory\n");
        return 1;
    }
    pt_cli_outcome outcome = pt_cli_parse(&cli, args.n_flags, args.flags, NULL);
    if (outcome == PT_CLI_OK && (!out_dir || args.n_dirs == 0)) {
        fprintf(stderr, "pipert plot: needs --out DIR and at least one run directory\n"
                        "usage: pipert plot %s\n", cli.synopsis);
        outcome = PT_CLI_USAGE_ERROR;
    }
    if (outcome != PT_CLI_OK) {
        free_arguments(&args);
        return pt_cli_exit_status(outcome);
    }
    pipert_result rc = plot_runs(args.dirs, args.n_dirs, out_dir);
    if (rc == PIPERT_OK)
        printf("wrote %s/loss-tokens.png, %s/loss-time.png and %s/bytes-between-sites.png (%d run%s)\n",
               out_dir, out_dir, out_dir, args.n_dirs, args.n_dirs == 1 ? "" : "s");
    free_arguments(&args);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("plot");
}
