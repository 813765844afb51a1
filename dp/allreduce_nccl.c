/* dp.method=allreduce with dp.nccl=true: the dense synchronous mean of
 * ALGORITHMS.md §4.1 computed by NCCL between the replicas' GPUs, the design's
 * "NCCL inside a site" (docs/CUDA.md, "Between workers").
 *
 * The same step as the UCX method (dp/allreduce.c): after each backward every
 * replica of the stage holds g ← (1/R) Σ_r g_r, before clipping; only the
 * gradient never leaves the GPU (ncclAllReduce with ncclAvg on the compute
 * stream). The step's loss, one host float, is averaged over UCX as before.
 * The NCCL group is made at create and again at every regroup: member 0 of the
 * UCX group of replicas makes the id and broadcasts it over UCX.
 *
 * When it applies: runtime.device=cuda, every replica of the stage on a GPU
 * of its own (NCCL refuses two ranks on one device), all in one site (between
 * sites the methods run over UCX). Off by default until it has run on two
 * GPUs; one GPU can only build it, and its refusals are unit-tested. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/methods.h"
#include "dp/wait.h"
#include "kernels/cuda/cuda.h"

typedef struct nccl_state {
    pt_coupling_options options;
    pt_nccl_group *group; /* NULL with one replica */
} nccl_state;

static pipert_result check_applies(const pt_coupling_options *options)
{
    const pipert_config *c = options->config;
    if (c->dp.method != PT_DP_ALLREDUCE)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.nccl=true averages gradients densely: it needs "
                                          "dp.method=allreduce, not %s",
                       pt_config_choice_name("dp.method", c->dp.method));
    const pt_device_traits *device = pt_device_traits_of(c->runtime.device);
    if (!device || !device->gpu)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.nccl=true needs runtime.device=cuda, not %s",
                       pt_config_choice_name("runtime.device", c->runtime.device));
    if (options->sites > 1)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.nccl=true runs inside one site; these replicas are "
                                          "in %d (between sites the methods run over UCX)",
                       options->sites);
    return PIPERT_OK;
}

/* A new NCCL group over the UCX group of replicas (blocking: every replica calls it). */
static pipert_result make_group(nccl_state *s)
{
    pt_group *replicas = s->options.replicas;
    if (!replicas) return PIPERT_OK;
    pt_nccl_id id = {{0}};
    const int index = pt_group_index(replicas);
    if (index == 0) PT_TRY(pt_nccl_unique_id(&id));
    PT_TRY(pt_broadcast(replicas, &id, sizeof id, 0));
    pipert_result rc = pt_nccl_group_create(&id, pt_group_size(replicas), index, &s->group);
    if (rc != PIPERT_OK)
        pt_error_prefix("dp.nccl: replica %d joining the NCCL group of %d (each replica needs a "
                        "GPU of its own)",
                        s->options.replica, pt_group_size(replicas));
    return rc;
}

static pipert_result nccl_create(const pt_coupling_options *options, void **out)
{
    PT_TRY(check_applies(options));
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "dp allreduce (nccl): out of memory");
    s->options = *options;
    pipert_result rc = make_group(s);
    if (rc != PIPERT_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return PIPERT_OK;
}

static pipert_result nccl_after_backward(void *state, pt_coupling_point *at, pt_coupling_metrics *m)
{
    nccl_state *s = state;
    if (!s->group) return PIPERT_OK;
    const int R = pt_nccl_group_size(s->group);
    char what[96];
    snprintf(what, sizeof what, "averaging the gradients of step %ld with NCCL", at->step);
    pipert_result rc = pt_nccl_allreduce(s->group, at->grads, at->n_params, PT_REDUCE_MEAN);
    if (rc != PIPERT_OK) {
        pt_error_prefix("%s", what);
        return rc;
    }
    m->bytes_sent += 2.0 * (R - 1) / R * (double)at->n_params * sizeof(float);
    if (!at->loss) return PIPERT_OK;
    pt_allreduce_handle *handle;
    PT_TRY(pt_allreduce_start(s->options.replicas, at->loss, 1, PT_REDUCE_MEAN, &handle));
    return pt_coupling_wait_allreduce(&s->options, handle, what);
}

static void nccl_destroy(void *state)
{
    nccl_state *s = state;
    if (s) pt_nccl_group_destroy(s->group);
    free(s);
}

/* Nothing stays in flight between calls; the group of those who left is dropped at regroup. */
static void nccl_suspend(void *state) { (void)state; }

static pipert_result nccl_regroup(void *state, const pt_coupling_options *options,
                                  const pt_coupling_point *at)
{
    (void)at;
    nccl_state *s = state;
    pt_nccl_group_destroy(s->group);
    s->group = NULL;
    s->options = *options;
    return make_group(s);
}

const pt_coupling_method pt_dp_allreduce_nccl = {
    .name = "allreduce",
    .over_all_replicas = true,
    .replicas_identical = true,
    .host_gradients = false, /* the gradient stays on the GPU */
    .traffic = pt_dp_allreduce_traffic,
    .create = nccl_create,
    .after_backward = nccl_after_backward,
    .destroy = nccl_destroy,
    .suspend = nccl_suspend,
    .regroup = nccl_regroup,
};
