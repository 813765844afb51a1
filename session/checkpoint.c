/* Checkpoints of a session. A single worker writes DIR/ckpt-STEP.safetensors
 * (train/checkpoint.h); pipeline stages do not checkpoint yet. */
#include <stdlib.h>

#include "runtime/log.h"
#include "session/session_internal.h"
#include "train/checkpoint.h"

pipert_result pt_session_save_checkpoint(pipert_session *s, long step)
{
    if (s->job.layout.stages > 1 || !s->writes_outputs) return PIPERT_OK;
    PT_TRY(pt_checkpoint_save(s->out_dir, step, pt_stage_executor_model(s->executor),
                              pt_stage_executor_optimizer(s->executor), &s->config,
                              s->config.train.keep_checkpoints));
    pt_info("checkpoint of step %ld written to %s", step, s->out_dir);
    return PIPERT_OK;
}

pipert_result pt_session_resume(pipert_session *s, long *step)
{
    if (s->job.layout.stages > 1)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "--resume: pipelines do not checkpoint yet");
    char *path;
    PT_TRY(pt_checkpoint_find_latest(s->out_dir, &path, step));
    pipert_result rc = pt_checkpoint_load(path, pt_stage_executor_model(s->executor),
                                          pt_stage_executor_optimizer(s->executor), step);
    if (rc == PIPERT_OK) rc = pt_stage_executor_resume_at(s->executor, *step);
    if (rc == PIPERT_OK) pt_info("resumed from %s (step %ld)", path, *step);
    free(path);
    return rc;
}
