/* Validation through the pipeline (executor.h): at a drained pipeline, all batches at once
 * (pt_stage_executor_validate: flush schedules every train.val_every steps, the asynchronous
 * one at its end), and while the asynchronous schedule runs, in waves.
 *
 * Waves. After its step N (N a multiple of train.val_every, before the last step), stage 0
 * runs the train.val_batches validation batches forward on its current weights and sends
 * each output on (tag TAG_EVAL_WAVE, id = N / val_every · val_batches + k). Stage s runs the
 * wave, on its own current weights, right after its step N + 2s, and sends it on; the last
 * stage's mean loss is the validation loss of step N. Why N + 2s: stage s−1 ran the wave
 * after its step N + 2(s−1) = m and before its forward of the microbatch that stage s
 * needs for its step m + 2 (in the steady state stage s−1 runs F(j + S − s), B(j), step j,
 * and stage s's step j + 1 needs F(j + S − s)); so the wave has been sent by then, the receive
 * does not wait, and which weights each stage validates on does not depend on timing: the
 * losses are as reproducible as the training. Nothing is drained: a stage spends one forward
 * per batch between two of its steps. Each stage uses an activation set of its own for them,
 * so the in-flight microbatches' activations stay intact. At the last step every stage runs
 * the waves still due. A wave under way at a checkpoint is not saved: a resumed run
 * validates after the step it resumed at. Its outputs are sent on without waiting: the next
 * stage takes them only steps later, and meanwhile needs this stage's training microbatches
 * (a send of 64 KiB or more ends only when the receiver read it: transport_direct.c), so
 * each goes from a copy of its own, released once the send ended. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/executor.h"
#include "pipeline/executor_internal.h"
#include "runtime/trace.h"

/* ---- one batch ------------------------------------------------------------ */

/* Validation batch k's tokens (stage 0) and targets (last stage) into the current set. */
static pipert_result load_validation_batch(pt_stage_executor *ex, int k, int n)
{
    if (!pt_executor_reads_data(ex)) return PIPERT_OK;
    pt_gpt_slice *m = ex->model;
    const size_t bytes = (size_t)ex->B * ex->T * sizeof(int32_t);
    if (ex->options.batch) PT_TRY(pt_executor_host_batch(ex, PIPERT_SPLIT_VAL, k));
    else pt_dataset_val_batch(&ex->data, k, n, ex->B, ex->T, ex->inputs, ex->targets);
    if (ex->options.stage == 0) ex->kernels->copy_to_device(m->tokens, ex->inputs, bytes);
    if (pt_executor_is_last_stage(ex)) ex->kernels->copy_to_device(m->targets, ex->targets, bytes);
    return PIPERT_OK;
}

/* The forward of validation batch k on the weights the coupling says the model is (DiLoCo:
 * the outer ones), with m->input already in place; its loss (last stage) into *loss. */
static void validation_forward(pt_stage_executor *ex, float *loss)
{
    pt_gpt_slice *m = ex->model;
    pt_gpt_use_params(m, (float *)pt_coupling_eval_params(ex->options.coupling));
    pt_gpt_forward_eval(m, loss);
    pt_gpt_use_params(m, NULL);
}

/* ---- at a drained pipeline ------------------------------------------------ */

pipert_result pt_stage_executor_validate(pt_stage_executor *ex, float *val_loss)
{
    const int n = ex->config.train.val_batches;
    pt_gpt_slice *m = ex->model;
    double sum = 0;
    *val_loss = NAN;
    pt_gpt_use_activation_slot(m, 0);
    for (int k = 0; k < n; k++) {
        const double started = pt_trace_now_us();
        PT_TRY(load_validation_batch(ex, k, n));
        if (ex->options.stage > 0) PT_TRY(pt_executor_receive(ex, false, k, m->input));
        float loss = NAN;
        validation_forward(ex, &loss);
        if (!pt_executor_is_last_stage(ex))
            PT_TRY(pt_executor_send_forward(ex, false, k, pt_gpt_output(m)));
        sum += loss;
        pt_executor_trace_span(ex, "eval", started, k);
    }
    if (pt_executor_is_last_stage(ex)) *val_loss = (float)(sum / n);
    return PIPERT_OK;
}

/* ---- waves ------------------------------------------------------------------ */

void pt_eval_waves_init(pt_stage_executor *ex)
{
    const pt_train_settings *t = &ex->config.train;
    ex->waves = (pt_eval_waves){0};
    ex->waves.enabled = pt_executor_is_async(ex) && ex->options.stages > 1 && t->val_every > 0 &&
                        t->val_every < t->steps;
}

pipert_result pt_eval_waves_setup(pt_stage_executor *ex)
{
    pt_eval_waves *w = &ex->waves;
    if (!w->enabled || ex->options.stage == 0) return PIPERT_OK;
    const size_t bytes = (size_t)ex->B * ex->T * ex->C * sizeof(float);
    return ex->kernels->alloc((void **)&w->input, bytes, "validation activations");
}

/* A wave's output on its way to the next stage, from a copy of its own. */
typedef struct pt_wave_send {
    float *copy;
    pt_request *request;
} pt_wave_send;

static void drop_send(pt_stage_executor *ex, pt_wave_send *send)
{
    if (send->request) {
        pt_request_cancel(send->request);
        pt_request_free(send->request);
    }
    pt_staging_release(ex, send->copy);
    *send = (pt_wave_send){0};
}

/* Sends that ended (all of them if `wait`, waiting for each) leave the queue, in order. */
static pipert_result finish_sends(pt_stage_executor *ex, bool wait)
{
    pt_eval_waves *w = &ex->waves;
    pipert_result rc = PIPERT_OK;
    int done = 0;
    for (; done < w->n_sending && rc == PIPERT_OK; done++) {
        pt_wave_send *send = &w->sending[done];
        if (wait) {
            rc = pt_executor_complete_send(ex, &send->request);
        } else {
            if (!pt_request_test(send->request, &rc)) break;
            pt_request_free(send->request);
            send->request = NULL;
        }
        if (rc != PIPERT_OK)
            pt_error_prefix("stage %d: sending a validation batch on", ex->options.stage);
        drop_send(ex, send);
    }
    if (done == 0) return rc;
    memmove(w->sending, w->sending + done, (size_t)(w->n_sending - done) * sizeof *w->sending);
    w->n_sending -= done;
    return rc;
}

/* The output of wave batch `id`, copied, sent on without waiting for the next stage. */
static pipert_result post_wave_output(pt_stage_executor *ex, long id)
{
    pt_eval_waves *w = &ex->waves;
    if (w->n_sending == w->sending_capacity) {
        const int capacity = w->sending_capacity ? 2 * w->sending_capacity : 8;
        pt_wave_send *grown = realloc(w->sending, (size_t)capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "validation: out of memory");
        w->sending = grown;
        w->sending_capacity = capacity;
    }
    const size_t bytes = (size_t)ex->B * ex->T * ex->C * sizeof(float);
    pt_wave_send send = {0};
    PT_TRY(pt_staging_alloc(ex, (void **)&send.copy, bytes, "a validation batch on its way"));
    pt_staging_copy_out(ex, send.copy, pt_gpt_output(ex->model), bytes);
    pipert_result rc = pt_executor_post_forward(ex, true, id, send.copy, &send.request);
    if (rc != PIPERT_OK) {
        drop_send(ex, &send);
        return rc;
    }
    w->sending[w->n_sending++] = send;
    return PIPERT_OK;
}

void pt_eval_waves_free(pt_stage_executor *ex)
{
    pt_eval_waves *w = &ex->waves;
    for (int i = 0; i < w->n_sending; i++) drop_send(ex, &w->sending[i]);
    free(w->sending);
    if (w->input && ex->kernels) ex->kernels->free(w->input);
    free(w->steps);
    free(w->results);
    *w = (pt_eval_waves){0};
}

static long wave_id(const pt_stage_executor *ex, long step, int k)
{
    const int n = ex->config.train.val_batches;
    return step / ex->config.train.val_every * n + k;
}

static pipert_result push_wave(pt_eval_waves *w, long step)
{
    if (w->length == w->capacity) {
        int capacity = w->capacity ? 2 * w->capacity : 4;
        long *grown = realloc(w->steps, (size_t)capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "validation: out of memory");
        w->steps = grown;
        w->capacity = capacity;
    }
    w->steps[w->length++] = step;
    return PIPERT_OK;
}

/* The oldest wave is done here: the last stage keeps its loss for the caller. */
static pipert_result pop_wave(pt_stage_executor *ex)
{
    pt_eval_waves *w = &ex->waves;
    const int n = ex->config.train.val_batches;
    if (pt_executor_is_last_stage(ex)) {
        if (w->n_results == w->results_capacity) {
            int capacity = w->results_capacity ? 2 * w->results_capacity : 4;
            pt_validation_result *grown = realloc(w->results, (size_t)capacity * sizeof *grown);
            if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "validation: out of memory");
            w->results = grown;
            w->results_capacity = capacity;
        }
        w->results[w->n_results++] = (pt_validation_result){w->steps[0], (float)(w->loss_sum / n)};
    }
    memmove(w->steps, w->steps + 1, (size_t)(w->length - 1) * sizeof *w->steps);
    w->length--;
    w->loss_sum = 0;
    return PIPERT_OK;
}

/* Batch k of the oldest wave: its input received (stage > 0), forward, sent on. */
static pipert_result run_wave_batch(pt_stage_executor *ex, int k)
{
    pt_eval_waves *w = &ex->waves;
    const long id = wave_id(ex, w->steps[0], k);
    const double started = pt_trace_now_us();
    pt_gpt_slice *m = ex->model;
    if (ex->options.stage > 0) PT_TRY(pt_executor_receive(ex, true, id, w->input));
    pt_gpt_use_activation_slot(m, w->slot);
    PT_TRY(load_validation_batch(ex, k, ex->config.train.val_batches));
    if (ex->options.stage > 0)
        ex->kernels->copy(m->input, w->input, (size_t)ex->B * ex->T * ex->C * sizeof(float));
    float loss = NAN;
    validation_forward(ex, &loss);
    if (!pt_executor_is_last_stage(ex)) PT_TRY(post_wave_output(ex, id));
    w->loss_sum += loss;
    pt_executor_trace_span(ex, "eval", started, id);
    return PIPERT_OK;
}

/* The step after which stage s runs the wave of step N (see the top of this file). */
static long due_step(const pt_stage_executor *ex, long wave_step)
{
    return wave_step + 2L * ex->options.stage;
}

pipert_result pt_eval_waves_after_step(pt_stage_executor *ex)
{
    pt_eval_waves *w = &ex->waves;
    if (!w->enabled) return PIPERT_OK;
    const long step = ex->version, last = ex->config.train.steps;
    if (step % ex->config.train.val_every == 0 && step < last) PT_TRY(push_wave(w, step));
    PT_TRY(finish_sends(ex, false));
    while (w->length > 0 && (due_step(ex, w->steps[0]) <= step || step >= last)) {
        for (int k = 0; k < ex->config.train.val_batches; k++) PT_TRY(run_wave_batch(ex, k));
        PT_TRY(pop_wave(ex));
    }
    /* the run ends with nothing on its way */
    return step >= last ? finish_sends(ex, true) : PIPERT_OK;
}

bool pt_stage_executor_take_validation(pt_stage_executor *ex, long *step, float *val_loss)
{
    pt_eval_waves *w = &ex->waves;
    if (w->n_results == 0) return false;
    *step = w->results[0].step;
    *val_loss = w->results[0].val_loss;
    memmove(w->results, w->results + 1, (size_t)(w->n_results - 1) * sizeof *w->results);
    w->n_results--;
    return true;
}
