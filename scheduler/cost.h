/* The cost model: what a job's pieces cost on the devices and links they
 * are placed on, from the model config (the scheduler's inputs to
 * scheduler/simulate.h and its memory check).
 *
 * Compute. A stage's model FLOPs per token are pipeline/plan.h's (6 per
 * weight, 12·C·T per block for attention, the head on the last stage); a
 * microbatch of B·T tokens takes them at the device's FLOP/s times an
 * efficiency (what `pipert bench` measures of the peak: the kernels' share),
 * one third forward, two thirds backward, but for the classifier's product on
 * the last stage (6·V·C a token), whose backward runs inside the forward
 * (models/gpt.h); with recompute, the backward repeats the forward (the
 * classifier's but for its weight gradient: 4·V·C a token). The optimizer
 * step streams parameters, gradients and both Adam moments:
 * OPTIMIZER_BYTES_PER_PARAM bytes at the device's memory bandwidth. FLOP/s
 * and efficiency are a device's as the job will see it:
 * devices that compute at once share memory bandwidth, caches and (on a
 * shared host) the cores, so a device is slower in a busy job than alone.
 * The model has no term for that; the calibration carries it
 * (scripts/calibrate.sh --workers W: W bench copies at once, the job's busy
 * workers, give the achieved FLOP/s per busy device under that contention).
 *
 * Memory per device, in bytes:
 *   weights      16·P  (parameters, gradients, Adam m and v; P floats)
 *   versions     4·P per extra weight copy the schedule keeps: asynchronous
 *                1F1B with a look-ahead that stashes keeps a stash slot per
 *                microbatch in flight, S−s (stage s; none on the last stage),
 *                and the look-ahead's own extra versions (pipeline/lookahead.h:
 *                predict-damped one more, nesterov-secant four more); none and
 *                the flush schedules none
 *   coupling     4·P·k: the method's own copies, its row's param_copies
 *                (dp/coupling.h; sparse, diloco, streaming-diloco, co2: 2;
 *                allreduce, none: 0); on a GPU (and cpu-guarded, its stand-in:
 *                memory_apart) only device_param_copies of them are in its memory
 *                (the outer methods' θ̃ for validation: 1), and
 *                its device_share (sparse: a step's partition, indices and values,
 *                2p). Not counted: the device collective's chunk buffers (replicas
 *                of one host, dp/device_collective.h: at most 2 × 32 MiB)
 *   activations  4·(acts · (in flight + validation) + activation gradients),
 *                acts of one microbatch as models/gpt.c lays them out; how many
 *                are in flight comes from the simulation (1F1B: S−s); validation
 *                one set more where the asynchronous pipeline validates in waves
 *                (pipeline/validation.h). With pipeline.recompute one set serves
 *                them all, and each microbatch in flight keeps only its input
 *                (or tokens) and its output being sent (or targets)
 *
 * Coupling traffic per collective, for R replicas of a stage of P floats (a
 * ring all-reduce sends 2(R−1)/R of its buffer from each member), times the
 * codec's bits over 32 (pt_codec_bits_per_element: an fp32 scale per block
 * added). Every, lag and share are the method's row's traffic (dp/coupling.h):
 *   allreduce          every step, blocking, P
 *   sparse             every step, beside dp.delay steps (−1: up to 16), p·P
 *   diloco             every H steps, blocking, P
 *   streaming-diloco   every ⌊H/(F+1)⌋ steps, beside τ steps, P/(F+1)
 *   co2                every H steps, beside H steps (one round stale), P
 *   none               nothing
 *
 * Sites (dp/coupling.c). Every method whose row is not over_all_replicas (all but allreduce
 * and none) runs by sites when a stage's replicas are in more than one: each step the k
 * replicas of a site average their gradients densely (a ring all-reduce of the stage's 4P
 * bytes: 2(k−1)/k of them sent, 2(k−1) latencies), the method runs between the sites' first
 * replicas (its ring has one member per site), and after the optimizer step the leader
 * broadcasts its parameters to the site (a binomial tree: ⌈log2 k⌉ rounds of 4P bytes and a
 * latency each; twice when the schedule keeps a weight stash). Both are blocking, on the
 * site's own link.
 *
 * The method's own CPU work: its row's host_share of the stage's elements each step.
 * dp.method=sparse gathers the step's partition of p·P elements at its shuffled indices and
 * applies the average with the EMA correction on the worker's main thread, every step:
 * pt_cost_device's sparse_cpu_s_per_element (measured here by scripts/calibrate.sh) times
 * p·P, added to the optimizer step. The other methods' own work is the transfer's
 * (allreduce) or a few passes every H steps (not modelled).
 */
#ifndef PT_SCHEDULER_COST_H
#define PT_SCHEDULER_COST_H

#include "pipeline/plan.h"
#include "runtime/config.h"
#include "scheduler/simulate.h"

#define OPTIMIZER_BYTES_PER_PARAM 28.0 /* read θ, g, m, v; write θ, m, v: 7 floats */

/* A device as the cost model sees it. */
typedef struct pt_cost_device {
    double flops;            /* fp32 FLOP/s of one device */
    double efficiency;       /* share of `flops` the kernels reach, (0, 1] */
    double memory_bytes;     /* capacity */
    double memory_bytes_per_s; /* bandwidth, for the optimizer step */
    double sparse_cpu_s_per_element; /* dp.method=sparse's own work a step (above); 0: none */
} pt_cost_device;

typedef struct pt_stage_cost {
    int first, last;         /* blocks [first, last) */
    double flops;            /* model FLOPs of one microbatch, forward and backward */
    pt_sim_costs time;       /* on the device */
    double params;           /* P, floats */
    double bytes_fixed;      /* weights, versions and coupling state */
    double bytes_activations; /* one microbatch's activations */
    double bytes_recompute_stash; /* pipeline.recompute: what each microbatch in flight keeps */
    double bytes_rounded_send; /* pipeline.transfer=bf16, no recompute: the bf16 copy of each
                                * microbatch in flight's activations being sent */
    double bytes_transfer;    /* pipeline.transfer=bf16: the gradient sent and a receive, bf16 */
    double bytes_activation_grads;
    int validation_sets;     /* activation sets of validation's own (0 or 1) */
    double bytes_message;    /* one microbatch's activations sent to the next stage (fp32 or
                              * bf16: pipeline.transfer) */
} pt_stage_cost;

/* Stage `stage` of `plan` on `device`, under `config` (model, batch size,
 * schedule, look-ahead, recompute, dp.method). */
pipert_result pt_cost_stage(const pipert_config *config, const pt_stage_plan *plan, int stage,
                            const pt_cost_device *device, pt_stage_cost *out);

/* The microbatches stage s of S holds at once under the schedule (what the simulator finds
 * for uniform stages: S − s for 1F1B and the asynchronous schedule, all M for GPipe). */
int pt_cost_in_flight(const pipert_config *config, int S, int s);

/* The device memory a stage needs with `in_flight` microbatches' activations (and
 * validation's). */
double pt_cost_stage_memory(const pt_stage_cost *cost, int in_flight);

/* The coupling's collectives for stages of params[s] floats whose method runs among
 * members[s] members (the replicas, or by sites the sites' leaders): every, lag, members and
 * hops (the most members' ring) into `out`, its bytes into bytes[s]; links are the caller's.
 * `members` must outlive `out`. */
pipert_result pt_cost_coupling(const pipert_config *config, const int *members, int stages,
                               const double *params, double *bytes, pt_sim_coupling *out);

/* Whether dp.method runs by sites when a stage's replicas are in several (above). */
bool pt_cost_coupling_by_sites(const pipert_config *config);

/* The seconds a replica is blocked each step by its site's dense part of a coupling by sites
 * (above): k replicas of a stage of `params` floats in the site, over `link`; 0 when k < 2. */
double pt_cost_site_coupling_s(const pipert_config *config, int k, double params, pt_sim_link link);

/* The method's own CPU work per step on `device` for a stage of `params` floats (above). */
double pt_cost_method_cpu_s(const pipert_config *config, const pt_cost_device *device,
                            double params);

/* Bits per element the codec of dp.compress sends, scales included. */
double pt_cost_codec_bits(const pipert_config *config);

#endif
