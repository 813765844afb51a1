/* Where a worker's tensors live: the kernel table of runtime.device and, on
 * cuda, which GPU and how much of its memory the worker takes.
 *
 * GPUs. A worker knows its rank among the workers of its host under every
 * launcher (comm/bootstrap.h: pipert launch, srun, mpirun); with G
 * GPUs visible it takes GPU local_rank mod G, so that workers get one each
 * when there are enough and share them round-robin otherwise (two workers on
 * one GPU run side by side under MPS). PIPERT_CUDA_DEVICE, when set, wins; a
 * worker whose local rank is unknown (an embedding program) takes GPU 0.
 *
 * Memory. The arena (kernels/cuda/memory.cu) is sized from what the stage
 * needs, by the cost model `pipert plan` and `pipert simulate` use
 * (scheduler/cost.h: parameters, gradients, moments, the weight versions of
 * its look-ahead, the coupling's copies, the activations of the microbatches
 * in flight and their gradients, one set more where the asynchronous pipeline
 * validates in waves), with headroom: a quarter more, and 512 MiB for
 * scratch and what the model keeps beside its activations. So workers sharing
 * a GPU each take what they need, not all free memory; one that does not fit
 * fails naming the device, the bytes needed and the bytes free.
 * PIPERT_CUDA_ARENA_MB, when set, wins.
 *
 * Between workers of one host, tensors go device to device: the transport
 * gets the table's peer functions (CUDA IPC; cpu-guarded's stand-in), and
 * peers that can copy from each other's memory do (comm/transport.h,
 * "Device payloads"); PIPERT_DEVICE_PAYLOADS=0 keeps them to host copies.
 *
 * The parameters' checksum (logs compare replicas, and GPU runs with CPU runs) reads them
 * through a host copy where the host cannot read the table's memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/transport.h" /* pt_checksum64 */
#include "kernels/cuda/cuda.h"
#include "runtime/memory.h"
#include "pipeline/plan.h"
#include "runtime/log.h"
#include "scheduler/cost.h"
#include "session/session_internal.h"

#define HEADROOM_FACTOR 1.25
#define HEADROOM_BYTES ((double)(512u << 20))

/* The GPU of this worker (above). */
/* runtime.device is a GPU: the kernels' memory is its arena, sized here. */
static bool runs_on_a_gpu(const pipert_session *s)
{
    const pt_device_traits *device = pt_device_traits_of(s->config.runtime.device);
    return device && device->gpu;
}

static int choose_gpu(const pipert_session *s)
{
    const int count = pt_cuda_device_count();
    const int local = s->job.boot.local_rank;
    return count > 0 && local >= 0 ? local % count : 0;
}

pipert_result pt_session_stage_memory(const pipert_session *s, int first, int last, double *bytes)
{
    const int S = s->job.layout.stages, stage = s->job.stage;
    pt_stage_plan plan = {.stages = S};
    plan.bounds[stage] = first;
    plan.bounds[stage + 1] = last;
    const pt_cost_device any = {1, 1, 0, 1, 0}; /* memory does not depend on the speed */
    pt_stage_cost cost;
    PT_TRY(pt_cost_stage(&s->config, &plan, stage, &any, &cost));
    *bytes = pt_cost_stage_memory(&cost, pt_cost_in_flight(&s->config, S, stage));
    return PIPERT_OK;
}

pipert_result pt_session_choose_kernels(pipert_session *s, int first, int last)
{
    if (!runs_on_a_gpu(s)) return pt_kernels_for_device(s->config.runtime.device, &s->kernels);
    double needed;
    PT_TRY(pt_session_stage_memory(s, first, last, &needed));
    const double arena = needed * HEADROOM_FACTOR + HEADROOM_BYTES;
    const int gpu = choose_gpu(s);
    pt_cuda_configure(gpu, (size_t)arena);
    pipert_result rc = pt_kernels_cuda(&s->kernels);
    if (rc != PIPERT_OK) {
        pt_error_prefix("rank %d (stage %d, replica %d) on GPU %d, needing %.0f MiB for its stage",
                        s->job.rank, s->job.stage, s->job.replica, gpu, arena / (1 << 20));
        return rc;
    }
    pt_cuda_device_info info;
    PT_TRY(pt_cuda_device_query(&info));
    pt_info("stage %d on GPU %d (%s) with an arena of %zu MiB (the stage needs %.0f MiB by the "
            "cost model)", s->job.stage, info.ordinal, info.name, info.arena_bytes >> 20,
            needed / (1 << 20));
    return PIPERT_OK;
}

void pt_session_share_device_memory(pipert_session *s)
{
    const pt_kernels *k = s->kernels;
    if (!s->job.transport || k->host_accessible || !k->peer_export || !k->peer_copy) return;
    /* PIPERT_DEVICE_PAYLOADS=0: through host copies, as before (to compare, or where CUDA IPC
     * is not allowed between the workers' processes). */
    const char *wanted = getenv("PIPERT_DEVICE_PAYLOADS");
    if (wanted && !strcmp(wanted, "0")) {
        pt_info("stage %d: tensors to other workers go through host copies (PIPERT_DEVICE_PAYLOADS=0)",
                s->job.stage);
        return;
    }
    s->device_memory = (pt_device_memory){
        .kind = k->name, .export_memory = k->peer_export, .copy_from_peer = k->peer_copy};
    pt_transport_use_device_memory(s->job.transport, &s->device_memory);
}

/* On cpu-guarded, what the stand-in's buffers held at most beside the cost model's need, as a
 * GPU's arena would: tests hold one to the other (test_device_guard). */
static void report_guarded_memory(const pipert_session *s)
{
    const pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    double needed;
    if (pt_session_stage_memory(s, slice->first, slice->last, &needed) != PIPERT_OK) {
        pt_error_clear();
        return;
    }
    pt_info("stage %d: the guarded table's high-water mark was %.3f MiB (the stage needs %.3f "
            "MiB by the cost model)",
            s->job.stage, (double)pt_kernels_cpu_guarded_peak_bytes() / (1 << 20),
            needed / (1 << 20));
}

void pt_session_report_device_memory(const pipert_session *s)
{
    if (s->config.runtime.device == PT_DEVICE_CPU_GUARDED) report_guarded_memory(s);
    if (!runs_on_a_gpu(s)) return;
    pt_cuda_device_info info;
    if (pt_cuda_device_query(&info) != PIPERT_OK) return;
    pt_info("stage %d: the CUDA arena's high-water mark was %zu MiB of its %zu MiB",
            s->job.stage, info.arena_peak_bytes >> 20, info.arena_bytes >> 20);
}

pipert_result pt_session_params_checksum(pipert_session *s, unsigned long long *out)
{
    const pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    const size_t bytes = slice->n_params * sizeof(float);
    const float *params = slice->params;
    float *host = NULL;
    if (!s->kernels->host_accessible) {
        PT_TRY(pt_alloc((void **)&host, bytes, "a host copy of the parameters"));
        s->kernels->copy_to_host(host, slice->params, bytes);
        params = host;
    }
    *out = (unsigned long long)pt_checksum64(params, bytes);
    pt_free(host);
    return PIPERT_OK;
}
