/* pipert train: one worker trains the whole model (a session of one), with
 * a progress line, and a checkpoint when Ctrl-C stops it. */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "pipert/pipert.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/progress.h"

static volatile sig_atomic_t stop_requested;

static void request_stop(int signal_number)
{
    (void)signal_number;
    stop_requested = 1;
}

static bool every(long step, long period) { return period > 0 && step % period == 0; }

static void show_progress(pt_progress *progress, const pipert_metrics *m, long first_step,
                          long log_every)
{
    const bool persist = every(m->step, log_every) || m->done;
    if (!persist && !progress->interactive) return;
    const double per_step = m->step > first_step ? 1e-3 * m->ms_per_step : 0;
    char text[256];
    snprintf(text, sizeof text,
             "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.0f ms/step | eta %.0fs", m->step,
             m->total_steps, (double)m->loss, m->lr, m->tokens_per_s, m->ms_per_step,
             per_step * (double)(m->total_steps - m->step));
    pt_progress_update(progress, text, persist);
}

static pipert_result train(pipert_session *s, pt_progress *progress, const pipert_config *cfg,
                           pipert_metrics *m)
{
    m->size = sizeof *m;
    PT_TRY(pipert_session_metrics(s, m));
    const long first_step = m->step;
    float val_loss = NAN;
    while (!m->done) {
        if (stop_requested) {
            PT_TRY(pipert_session_checkpoint(s));
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped at step %ld (checkpoint written)", m->step);
        }
        PT_TRY(pipert_session_step(s, m));
        show_progress(progress, m, first_step, cfg->train.log_every);
        if (!isnan(m->val_loss) && (isnan(val_loss) || val_loss != m->val_loss))
            pt_progress_print(progress, "step %ld | val_loss %.4f", m->step, (double)m->val_loss);
        val_loss = m->val_loss;
    }
    pt_progress_finish(progress);
    return PIPERT_OK;
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

    pipert_session_options options = PIPERT_SESSION_OPTIONS_INIT;
    options.out_dir = out_dir;
    options.log_level = PIPERT_LOG_DEBUG; /* stderr, at PIPERT_LOG's level */
    options.resume = resume;
    options.alone = 1;
    pt_progress progress;
    pt_progress_init(&progress, quiet);
    pipert_metrics m = {.size = sizeof m};
    pipert_session *s = NULL;
    pipert_result rc = pipert_session_create(cfg, &options, &s);
    if (rc == PIPERT_OK) rc = train(s, &progress, cfg, &m);
    pt_progress_finish(&progress);
    pipert_session_destroy(s);
    pipert_config_free(cfg);
    if (rc != PIPERT_OK) return pt_cmd_report_failure("train");
    if (!quiet)
        printf("done: %ld steps, final loss %.4f, validation loss %.4f; metrics in %s/metrics.jsonl\n",
               m.step, (double)m.loss, (double)m.val_loss, out_dir);
    return 0;
}
