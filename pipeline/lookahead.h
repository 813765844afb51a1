/* The look-aheads of the asynchronous schedule (pipeline.lookahead; executor.h says what each
 * does, docs/STALENESS.md why): one row each in lookahead.c's table, with every fact the
 * executor, checkpoints and the cost model (scheduler/cost.c) ask of one, so that they ask
 * the row rather than compare names. */
#ifndef PT_LOOKAHEAD_H
#define PT_LOOKAHEAD_H

#include <stdbool.h>

typedef enum pt_lookahead {
    PT_LOOKAHEAD_NONE,
    PT_LOOKAHEAD_STASH,
    PT_LOOKAHEAD_NESTEROV,
    PT_LOOKAHEAD_PREDICT,
    PT_LOOKAHEAD_PREDICT_DAMPED,
    PT_LOOKAHEAD_PIPEMARE,
    PT_LOOKAHEAD_DC_ASGD,
    PT_LOOKAHEAD_NESTEROV_DC, /* nesterov's optimizer with dc-asgd's compensation */
    PT_LOOKAHEAD_NESTEROV_SECANT, /* nesterov's optimizer, compensated by a measured secant */
} pt_lookahead;

typedef struct pt_lookahead_traits {
    pt_lookahead kind;
    const char *name;
    /* The forward of a microbatch records the weights it used and its backward uses them
     * again: a stage keeps a version per microbatch in flight (every one but none). */
    bool stashes;
    /* The look-ahead is the optimizer: NAdamW with β1 = 0.99 (AsyncMesh). */
    bool nesterov;
    /* Forwards run on weights predicted τ steps ahead (stashed for the backward). */
    bool predicts;
    /* The gradient is compensated for its delay, with λ = pipeline.dc_lambda or, at 0,
     * dc_lambda (train/staleness.h). */
    bool compensates;
    double dc_lambda;
    /* Weight copies beyond the stash: on every stage (predict-damped: the weights before a
     * step, to measure its size), and on a stage that stashes (nesterov-secant: the previous
     * gradient and stash and two running means, train/secant.h). */
    int extra_versions, extra_versions_when_stashing;
} pt_lookahead_traits;

/* The look-ahead called `name`; NULL with a PIPERT_ERR_CONFIG naming the known ones. */
const pt_lookahead_traits *pt_lookahead_named(const char *name);

/* The row of `kind` (a valid one). */
const pt_lookahead_traits *pt_lookahead_traits_of(pt_lookahead kind);

#endif
