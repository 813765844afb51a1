/* dp.method=allreduce: dense synchronous averaging (ALGORITHMS.md §4.1).
 *
 * After each step's backward, every replica of a stage holds the mean of the
 * replicas' gradients, g ← (1/R) Σ_r g_r, by a ring all-reduce among the
 * replicas of the stage. It runs before clipping, so every replica clips the
 * same norm and takes the same update: R replicas with batch B each train
 * like one worker with batch R·B. The step's loss is averaged too, for
 * reporting. With one replica it does nothing.
 *
 * Where the mean is made. On kernels whose memory the host cannot read (cuda,
 * cpu-guarded), replicas that all copy each other's device memory (the workers
 * of one host: comm/transport.h, "Device payloads") average in it
 * (dp/device_collective.h); otherwise the ring reduces host copies. The replicas
 * decide together when they form a group (create, regroup), each saying
 * whether it copies every other's memory, so all of them take the same path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/codec.h"
#include "dp/device_collective.h"
#include "dp/methods.h"
#include "dp/wait.h"
#include "runtime/log.h"

typedef struct allreduce_state {
    pt_coupling_options options;
    bool on_device; /* the group averages in device memory, with device_mean */
    /* made when first needed, kept to the end (it may hold buffers an abandoned receive can
     * still write until the transport closes) */
    pt_device_collective *device_mean;
} allreduce_state;

/* The path the replicas agree on, with the device mean made if it is the first time. */
static pipert_result choose_path(allreduce_state *s)
{
    PT_TRY(pt_device_collective_agree(&s->options, s->options.replicas, &s->on_device));
    if (s->options.replicas && !s->options.kernels->host_accessible)
        pt_info("stage %d: the %d replicas average their gradients %s", s->options.stage,
                pt_group_size(s->options.replicas),
                s->on_device ? "in device memory, device to device"
                             : "through host copies (a replica cannot copy another's device "
                               "memory: another host, UCX_TLS without cma, "
                               "runtime.authenticate_messages or PIPERT_DEVICE_PAYLOADS=0)");
    if (!s->on_device || s->device_mean) return PIPERT_OK;
    return pt_device_collective_create(s->options.kernels, 0, &s->device_mean);
}

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
    pipert_result rc = choose_path(s);
    if (rc != PIPERT_OK) {
        free(s);
        return rc;
    }
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
    if (s->on_device) {
        PT_TRY(pt_device_collective_mean_start(s->device_mean, s->options.replicas, at->grads,
                                               at->n_params));
        PT_TRY(pt_coupling_wait_device_collective(&s->options, s->device_mean, what));
        m->bytes_sent += (double)pt_device_collective_mean_bytes(s->options.replicas, at->n_params);
    } else {
        PT_TRY(mean_over_replicas(s, at->grads, at->n_params, what));
        m->bytes_sent += (double)pt_allreduce_bytes_sent(s->options.replicas, at->n_params);
    }
    if (!at->loss) return PIPERT_OK;
    PT_TRY(mean_over_replicas(s, at->loss, 1, what));
    m->bytes_sent += (double)pt_allreduce_bytes_sent(s->options.replicas, 1);
    return PIPERT_OK;
}

static void allreduce_destroy(void *state)
{
    allreduce_state *s = state;
    if (s) pt_device_collective_free(s->device_mean);
    free(s);
}

/* Nothing stays in flight between calls: a wait cut short abandoned its all-reduce. */
static void allreduce_suspend(void *state) { (void)state; }

static bool allreduce_gradients_on_device(void *state)
{
    return ((allreduce_state *)state)->on_device;
}

static pipert_result allreduce_regroup(void *state, const pt_coupling_options *options,
                                       const pt_coupling_point *at)
{
    (void)at;
    allreduce_state *s = state;
    s->options = *options;
    return choose_path(s);
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
    .host_gradients = true,     /* the ring reduces in host memory... */
    .gradients_on_device = allreduce_gradients_on_device, /* ...unless the replicas share a host */
    .traffic = pt_dp_allreduce_traffic,
    .create = allreduce_create,
    .after_backward = allreduce_after_backward,
    .destroy = allreduce_destroy,
    .suspend = allreduce_suspend,
    .regroup = allreduce_regroup,
};
