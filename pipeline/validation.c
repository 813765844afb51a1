/* Validation through the pipeline (validation.h): at a drained pipeline, all batches at once
 * (pt_validate_drained, called by pt_stage_executor_validate: flush schedules every train.val_every steps, the asynchronous
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
#include "pipeline/validation.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/trace.h"

static bool is_last_stage(const pt_validation_port *p) { return p->stage_index == p->stages - 1; }

/* One batch's activations between two stages. */
static size_t activation_bytes(const pt_validation_port *p)
{
    return (size_t)p->model->B * p->model->T * p->model->config.n_embd * sizeof(float);
}

/* The forward of a validation batch on the weights the stage says (DiLoCo: the outer ones),
 * with the model's input already in place; its loss (last stage) into *loss. */
static void validation_forward(const pt_validation_port *p, float *loss)
{
    pt_gpt_use_params(p->model, (float *)p->eval_params(p->stage));
    pt_gpt_forward_eval(p->model, loss);
    pt_gpt_use_params(p->model, NULL);
}

/* ---- at a drained pipeline ------------------------------------------------ */

pipert_result pt_validate_drained(const pt_validation_port *p, float *val_loss)
{
    const int n = p->val_batches;
    pt_gpt_slice *m = p->model;
    double sum = 0;
    *val_loss = NAN;
    pt_gpt_use_activation_slot(m, 0);
    for (int k = 0; k < n; k++) {
        const double started = pt_trace_now_us();
        PT_TRY(p->load_batch(p->stage, k, n));
        if (p->stage_index > 0) PT_TRY(p->receive(p->stage, false, k, m->input));
        float loss = NAN;
        validation_forward(p, &loss);
        if (!is_last_stage(p)) PT_TRY(p->send(p->stage, k, pt_gpt_output(m)));
        sum += loss;
        p->trace_span(p->stage, "eval", started, k);
    }
    if (is_last_stage(p)) *val_loss = (float)(sum / n);
    return PIPERT_OK;
}

/* ---- waves ------------------------------------------------------------------ */

bool pt_eval_waves_wanted(bool async, int stages, long val_every, long last_step)
{
    return async && stages > 1 && val_every > 0 && val_every < last_step;
}

void pt_eval_waves_init(pt_eval_waves *w, bool async, int stages, long val_every, long last_step)
{
    *w = (pt_eval_waves){.enabled = pt_eval_waves_wanted(async, stages, val_every, last_step),
                         .val_every = val_every,
                         .last_step = last_step};
}

pipert_result pt_eval_waves_setup(pt_eval_waves *w, const pt_validation_port *port)
{
    w->port = *port;
    if (!w->enabled || port->stage_index == 0) return PIPERT_OK;
    return port->model->kernels->alloc((void **)&w->input, activation_bytes(port),
                                       "validation activations");
}

/* A wave's output on its way to the next stage, from a copy of its own. */
typedef struct pt_wave_send {
    float *copy;
    pt_request *request;
} pt_wave_send;

static void drop_send(pt_eval_waves *w, pt_wave_send *send)
{
    if (send->request) {
        pt_request_cancel(send->request);
        pt_request_free(send->request);
    }
    w->port.release_copy(w->port.stage, send->copy);
    *send = (pt_wave_send){0};
}

/* Sends that ended (all of them if `wait`, waiting for each) leave the queue, in order. */
static pipert_result finish_sends(pt_eval_waves *w, bool wait)
{
    pipert_result rc = PIPERT_OK;
    int done = 0;
    for (; done < w->n_sending && rc == PIPERT_OK; done++) {
        pt_wave_send *send = &w->sending[done];
        if (wait) {
            rc = w->port.complete(w->port.stage, &send->request);
        } else {
            if (!pt_request_test(send->request, &rc)) break;
            pt_request_free(send->request);
            send->request = NULL;
        }
        if (rc != PIPERT_OK)
            pt_error_prefix("stage %d: sending a validation batch on", w->port.stage_index);
        drop_send(w, send);
    }
    if (done == 0) return rc;
    memmove(w->sending, w->sending + done, (size_t)(w->n_sending - done) * sizeof *w->sending);
    w->n_sending -= done;
    return rc;
}

/* The output of wave batch `id`, copied, sent on without waiting for the next stage. */
static pipert_result post_wave_output(pt_eval_waves *w, long id)
{
    const pt_validation_port *p = &w->port;
    if (w->n_sending == w->sending_capacity) {
        const int capacity = w->sending_capacity ? 2 * w->sending_capacity : 8;
        pt_wave_send *grown = realloc(w->sending, (size_t)capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "validation: out of memory");
        w->sending = grown;
        w->sending_capacity = capacity;
    }
    pt_wave_send send = {0};
    PT_TRY(p->copy_output(p->stage, (void **)&send.copy, pt_gpt_output(p->model),
                          activation_bytes(p)));
    pipert_result rc = p->post(p->stage, id, send.copy, &send.request);
    if (rc != PIPERT_OK) {
        drop_send(w, &send);
        return rc;
    }
    w->sending[w->n_sending++] = send;
    return PIPERT_OK;
}

void pt_eval_waves_free(pt_eval_waves *w)
{
    for (int i = 0; i < w->n_sending; i++) drop_send(w, &w->sending[i]);
    free(w->sending);
    if (w->input && w->port.model && w->port.model->kernels) w->port.model->kernels->free(w->input);
    free(w->steps);
    free(w->results);
    *w = (pt_eval_waves){0};
}

static long wave_id(const pt_eval_waves *w, long step, int k)
{
    return step / w->val_every * w->port.val_batches + k;
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
static pipert_result pop_wave(pt_eval_waves *w)
{
    const int n = w->port.val_batches;
    if (is_last_stage(&w->port)) {
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
static pipert_result run_wave_batch(pt_eval_waves *w, int k)
{
    const pt_validation_port *p = &w->port;
    const long id = wave_id(w, w->steps[0], k);
    const double started = pt_trace_now_us();
    pt_gpt_slice *m = p->model;
    if (p->stage_index > 0) PT_TRY(p->receive(p->stage, true, id, w->input));
    pt_gpt_use_activation_slot(m, w->slot);
    PT_TRY(p->load_batch(p->stage, k, p->val_batches));
    if (p->stage_index > 0) m->kernels->copy(m->input, w->input, activation_bytes(p));
    float loss = NAN;
    validation_forward(p, &loss);
    if (!is_last_stage(p)) PT_TRY(post_wave_output(w, id));
    w->loss_sum += loss;
    p->trace_span(p->stage, "eval", started, id);
    return PIPERT_OK;
}

/* The step after which stage s runs the wave of step N (see the top of this file). */
static long due_step(const pt_eval_waves *w, long wave_step)
{
    return wave_step + 2L * w->port.stage_index;
}

pipert_result pt_eval_waves_after_step(pt_eval_waves *w, long step)
{
    if (!w->enabled) return PIPERT_OK;
    const long last = w->last_step;
    if (step % w->val_every == 0 && step < last) PT_TRY(push_wave(w, step));
    PT_TRY(finish_sends(w, false));
    while (w->length > 0 && (due_step(w, w->steps[0]) <= step || step >= last)) {
        for (int k = 0; k < w->port.val_batches; k++) PT_TRY(run_wave_batch(w, k));
        PT_TRY(pop_wave(w));
    }
    /* the run ends with nothing on its way */
    return step >= last ? finish_sends(w, true) : PIPERT_OK;
}

bool pt_eval_waves_take(pt_eval_waves *w, long *step, float *val_loss)
{
    if (w->n_results == 0) return false;
    *step = w->results[0].step;
    *val_loss = w->results[0].val_loss;
    memmove(w->results, w->results + 1, (size_t)(w->n_results - 1) * sizeof *w->results);
    w->n_results--;
    return true;
}
