/* pipert_train: one worker, the whole model, as a session of one. */
#include <math.h>
#include <string.h>

#include "session/session_internal.h"

static pipert_result train_loop(pipert_session *s, const pipert_train_options *options,
                                pipert_train_summary *summary)
{
    pipert_metrics m = {.size = sizeof m};
    PT_TRY(pipert_session_metrics(s, &m));
    while (!m.done) {
        if (options->stop_flag && *options->stop_flag) {
            PT_TRY(pipert_session_checkpoint(s));
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped at step %ld (checkpoint written)", m.step);
        }
        PT_TRY(pipert_session_step(s, &m));
        summary->steps_done = m.step;
        summary->last_loss = m.loss;
        summary->last_val_loss = m.val_loss;
        summary->tokens_per_s = m.tokens_per_s;
    }
    return PIPERT_OK;
}

pipert_result pipert_train(const pipert_config *cfg, const pipert_train_options *options,
                           pipert_train_summary *summary)
{
    if (!cfg || !options || !options->out_dir || !summary)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_train: config, options.out_dir and summary "
                                               "are required");
    memset(summary, 0, sizeof *summary);
    summary->last_val_loss = NAN;
    pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
    o.out_dir = options->out_dir;
    o.resume = options->resume;
    o.alone = 1;
    pipert_session *s;
    PT_TRY(pipert_session_create(cfg, &o, &s));
    pipert_result rc = train_loop(s, options, summary);
    pipert_session_destroy(s);
    return rc;
}
