/* Validation through a pipeline (validation.c): all batches at a drained pipeline, or in
 * waves while the asynchronous schedule runs. It sees the stage through a port: the stage's
 * model and the few things it does for validation (load a batch, receive, send, trace), which
 * the executor offers and any other source of instructions could; never the executor itself. */
#ifndef PT_VALIDATION_H
#define PT_VALIDATION_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/transport.h"
#include "models/gpt.h"

typedef struct pt_validation_port {
    void *stage; /* handed to every function below */
    int stage_index, stages;
    pt_gpt_slice *model;
    int val_batches;
    /* Validation batch k of n's tokens (stage 0) and targets (last stage) into the model. */
    pipert_result (*load_batch)(void *stage, int k, int n);
    /* The weights a validation runs on (DiLoCo: the outer ones); NULL: the model's own. */
    const float *(*eval_params)(void *stage);
    /* The previous stage's output for batch `id` (of a wave, or of a drained validation). */
    pipert_result (*receive)(void *stage, bool wave, long id, float *dst);
    /* A drained validation's output to the next stage: returns once it was taken. */
    pipert_result (*send)(void *stage, long id, const float *src);
    /* A wave's output to the next stage, from a copy of its own (copy_output); the request ends
     * when the next stage took it, and complete waits for that and frees it. */
    pipert_result (*copy_output)(void *stage, void **copy, const float *src, size_t bytes);
    void (*release_copy)(void *stage, void *copy);
    pipert_result (*post)(void *stage, long id, const float *copy, pt_request **request);
    pipert_result (*complete)(void *stage, pt_request **request);
    void (*trace_span)(void *stage, const char *category, double started_us, long id);
} pt_validation_port;

/* All validation batches through a drained pipeline; the mean loss on the last stage (NaN on
 * the others). */
pipert_result pt_validate_drained(const pt_validation_port *port, float *val_loss);

/* A validation finished while the schedule ran: the step of the weights it started on. */
typedef struct pt_validation_result {
    long step;
    float val_loss;
} pt_validation_result;

/* Validation while the asynchronous schedule runs: "waves" of the validation batches, started
 * by stage 0 after each val_every-th step and passed on by stage s after its step N + 2s,
 * between its own instructions (validation.c says why N + 2s). */
typedef struct pt_eval_waves {
    pt_validation_port port;
    bool enabled;
    long val_every, last_step;
    int slot;              /* the activation set evaluation uses, of its own */
    long *steps;           /* the waves not yet run here, oldest first */
    int length, capacity;
    double loss_sum;       /* last stage: of the wave being run */
    float *input;          /* stage > 0: a received batch [N, C] */
    /* Outputs sent on and not yet read by the next stage, oldest first: it runs the wave
     * steps later (after its step N + 2s), and a large message's send ends only when it
     * was read (comm/transport_direct.c), so each keeps a copy of its own. */
    struct pt_wave_send *sending;
    int n_sending, sending_capacity;
    pt_validation_result *results; /* last stage: finished, not yet taken */
    int n_results, results_capacity;
} pt_eval_waves;

/* Waves for a run of `last_step` steps validating every `val_every` (enabled for the
 * asynchronous schedule of more than one stage only). Then, once the port's model exists
 * (with an activation set of the waves' own, `slot`, which the stage sets), setup. */
void pt_eval_waves_init(pt_eval_waves *w, bool async, int stages, long val_every, long last_step);
/* Whether such a run validates in waves, with an activation set of each stage's own. */
bool pt_eval_waves_wanted(bool async, int stages, long val_every, long last_step);
pipert_result pt_eval_waves_setup(pt_eval_waves *w, const pt_validation_port *port);
/* After the stage's optimizer step `step`: starts a wave, runs those due, ends the sends
 * the next stage took. */
pipert_result pt_eval_waves_after_step(pt_eval_waves *w, long step);
/* The oldest finished validation (last stage); false when there is none. */
bool pt_eval_waves_take(pt_eval_waves *w, long *step, float *val_loss);
void pt_eval_waves_free(pt_eval_waves *w);

#endif
