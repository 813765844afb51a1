/* pipert train: one worker trains the whole model. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "runtime/config.h"
#include "tools/cli.h"
#include "tools/commands.h"

static volatile int stop_requested;

static void request_stop(int signal_number)
{
    (void)signal_number;
    stop_requested = 1;
}

int pt_cmd_train(int argc, char **argv)
{
    const char *out_dir = NULL;
    bool resume = false, quiet = false;
    const pt_cli_flag flags[] = {
        {"--out", "DIR", "write metrics.jsonl and checkpoints here (required)", &out_dir, NULL},
        {"--resume", NULL, "continue from the newest checkpoint in --out", NULL, &resume},
        {"--quiet", NULL, "no progress output", NULL, &quiet},
    };
    const pt_cli cli = {"train", "[--config FILE] [--section.key=value ...] --out DIR [--resume]",
                        "Trains a GPT model on one worker (all cores of this machine by default),\n"
                        "on the fortunes corpus unless data.path says otherwise. Ctrl-C stops at the\n"
                        "next step with a checkpoint; --resume continues with the same losses.",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    if (!out_dir) {
        pipert_config_free(cfg);
        fprintf(stderr, "pipert train: --out DIR is required\n");
        return 2;
    }
    struct sigaction action = {.sa_handler = request_stop};
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);

    pipert_train_options options = {.out_dir = out_dir, .resume = resume, .quiet = quiet,
                                     .stop_flag = &stop_requested};
    pipert_train_summary summary;
    pipert_result rc = pipert_train(cfg, &options, &summary);
    pipert_config_free(cfg);
    if (rc != PIPERT_OK) return pt_cmd_report_failure("train");
    if (!quiet)
        printf("done: %ld steps, final loss %.4f, validation loss %.4f; metrics in %s/metrics.jsonl\n",
               summary.steps_done, (double)summary.last_loss, (double)summary.last_val_loss,
               out_dir);
    return 0;
}
