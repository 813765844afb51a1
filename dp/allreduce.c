/* dp.method=allreduce: dense synchronous averaging (ALGORITHMS.md §4.1).
 *
 * After each step's backward, every replica of a stage holds the mean of the
 * replicas' gradients, g ← (1/R) Σ_r g_r, by a ring all-reduce among the
 * replicas of the stage. It runs before clipping, so every replica clips the
 * same norm and takes the same update: R replicas with batch B each train
 * like one worker with batch R·B. The step's loss is averaged too, for
 * reporting. With one replica it does nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/codec.h"
#include "dp/methods.h"
#include "dp/wait.h"

typedef struct allreduce_state {
    pt_coupling_options options;
} allreduce_state;

static pipert_result allreduce_create(const pt_coupling_options *options, void **out)
{
    const pt_codec_kind compress = options->config->dp.compress;
    if (compress != PT_CODEC_NONE)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.method=allreduce with dp.compress=%s: the dense all-reduce is the "
                       "uncompressed reference; compressed exchanges are sparse, diloco, "
                       "streaming-diloco and co2", pt_config_choice_name("dp.compress", compress));
    allreduce_state *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "dp allreduce: out of memory");
    s->options = *options;
    *out = s;
    return PIPERT_OK;
}

static pipert_result mean_over_replicas(allreduce_state *s, float *data, size_t count,
                                        const char *what)
{
    pt_allreduce_handle *handle;
    PT_TRY(pt_allreduce_start(s->options.replicas, data, count, PT_REDUCE_MEAN, &handle));
    return pt_coupling_wait_allreduce(&s->options, handle, what);
}

static pipert_result allreduce_after_backward(void *state, pt_coupling_point *at,
                                              pt_coupling_metrics *m)
{
    allreduce_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    char what[96];
    snprintf(what, sizeof what, "averaging the gradients of step %ld", at->step);
    PT_TRY(mean_over_replicas(s, at->grads, at->n_params, what));
    m->bytes_sent += (double)pt_allreduce_bytes_sent(s->options.replicas, at->n_params);
    if (!at->loss) return PIPERT_OK;
    PT_TRY(mean_over_replicas(s, at->loss, 1, what));
    m->bytes_sent += (double)pt_allreduce_bytes_sent(s->options.replicas, 1);
    return PIPERT_OK;
}

static void allreduce_destroy(void *state) { free(state); }

/* Nothing stays in flight between calls: a wait cut short abandoned its all-reduce. */
static void allreduce_suspend(void *state) { (void)state; }

static pipert_result allreduce_regroup(void *state, const pt_coupling_options *options,
                                       const pt_coupling_point *at)
{
    (void)at;
    allreduce_state *s = state;
    s->options = *options;
    return PIPERT_OK;
}

/* The whole gradient, every step, applied at once. */
void pt_dp_allreduce_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    (void)config;
    *out = (pt_coupling_traffic){.every = 1, .lag = 0, .share = 1};
}

const pt_coupling_method pt_dp_allreduce = {
    .name = "allreduce",
    .over_all_replicas = true, /* dense everywhere: a ring ordered by site */
    .replicas_identical = true, /* the same mean gradient everywhere, bitwise */
    .host_gradients = true,     /* the ring reduces in host memory */
    .traffic = pt_dp_allreduce_traffic,
    .create = allreduce_create,
    .after_backward = allreduce_after_backward,
    .destroy = allreduce_destroy,
    .suspend = allreduce_suspend,
    .regroup = allreduce_regroup,
};
