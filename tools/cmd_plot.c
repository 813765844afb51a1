/* `pipert plot`: PNG pictures of one or more runs (tools/plot/): loss against
 * tokens and against wall time, one line per run with its coupling method in
 * the legend, and the bytes each run sent between sites per step. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/fileio.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/plot/gnuplot.h"

int pt_cmd_plot(int argc, char **argv)
{
    const char *out_dir = NULL;
    const pt_cli_flag flags[] = {
        {"--out", "DIR", "where the pictures go (required): loss-tokens.png, loss-time.png, "
                         "bytes-between-sites.png", &out_dir, NULL},
    };
    /* The run directories are the arguments that are not flags. */
    char **flag_args = calloc((size_t)argc + 1, sizeof *flag_args), **dirs = calloc((size_t)argc + 1, sizeof *dirs);
    int n_flag_args = 0, n_dirs = 0;
    for (int i = 0; flag_args && dirs && i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            flag_args[n_flag_args++] = argv[i++];
            flag_args[n_flag_args++] = argv[i];
        } else if (!strncmp(argv[i], "--", 2) || !strcmp(argv[i], "-h")) {
            flag_args[n_flag_args++] = argv[i];
        } else {
            dirs[n_dirs++] = argv[i];
        }
    }
    const pt_cli cli = {"plot", "--out DIR RUN_DIR [RUN_DIR ...]",
                        "PNG pictures of runs (gnuplot): training and validation loss against\n"
                        "tokens and against wall time, one line per run with its coupling method\n"
                        "in the legend, and the bytes each run sent between sites per step.",
                        flags, (int)(sizeof flags / sizeof flags[0]), false, NULL};
    pt_cli_outcome outcome = flag_args && dirs ? pt_cli_parse(&cli, n_flag_args, flag_args, NULL)
                                               : PT_CLI_USAGE_ERROR;
    if (outcome == PT_CLI_OK && (!out_dir || n_dirs == 0)) {
        fprintf(stderr, "pipert plot: needs --out DIR and at least one run directory\nusage: pipert "
                        "plot %s\n", cli.synopsis);
        outcome = PT_CLI_USAGE_ERROR;
    }
    pt_plot_run *runs = outcome == PT_CLI_OK ? calloc((size_t)n_dirs, sizeof *runs) : NULL;
    pipert_result rc = outcome != PT_CLI_OK ? PIPERT_OK
                       : runs              ? pt_make_dirs(out_dir)
                                           : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    int read = 0;
    for (; rc == PIPERT_OK && runs && read < n_dirs; read++) rc = pt_plot_read_run(dirs[read], &runs[read]);
    if (rc == PIPERT_OK && runs) rc = pt_plot_draw(runs, n_dirs, out_dir);
    if (rc == PIPERT_OK && runs)
        printf("wrote %s/loss-tokens.png, %s/loss-time.png and %s/bytes-between-sites.png (%d run%s)\n",
               out_dir, out_dir, out_dir, n_dirs, n_dirs == 1 ? "" : "s");
    for (int k = 0; runs && k < read; k++) pt_plot_free_run(&runs[k]);
    free(runs);
    free(flag_args);
    free(dirs);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("plot");
}
