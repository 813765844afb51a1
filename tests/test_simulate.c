/* scheduler/simulate.h against what can be worked out by hand: the bubble
 * formula of 1F1B with flush and GPipe, the asynchronous steady state, a link
 * that queues messages, a blocking all-reduce, exchanges that hide behind
 * compute or are limited by their link, a slow replica holding the others
 * back, and refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/simulate.h"

#define MAX_RANKS 64

/* A job of R replicas × S stages with equal costs, instant links and no
 * coupling; tests change what they need. */
typedef struct job {
    pt_sim_input in;
    pt_sim_costs costs[MAX_RANKS];
    pt_sim_link stage_links[MAX_RANKS];
    double coupling_bytes[MAX_RANKS];
    int link_of[MAX_RANKS];
    pt_sim_link coupling_links[4];
} job;

static void job_init(job *j, pt_schedule_kind kind, int S, int R, int M, int steps, double f,
                     double b)
{
    memset(j, 0, sizeof *j);
    for (int i = 0; i < R * S; i++) j->costs[i] = (pt_sim_costs){f, b, 0};
    for (int i = 0; i < R * (S - 1); i++) j->stage_links[i] = (pt_sim_link){1e30, 0};
    j->coupling_links[0] = (pt_sim_link){1, 0};
    j->in = (pt_sim_input){
        .kind = kind, .stages = S, .replicas = R, .microbatches = M, .steps = steps,
        .costs = j->costs, .stage_links = j->stage_links, .activation_bytes = 1,
        .coupling = {.bytes = j->coupling_bytes, .link_of = j->link_of,
                     .links = j->coupling_links, .n_links = 1},
    };
}

static pt_sim_result run(const job *j)
{
    pt_sim_result r;
    cr_assert_eq(pt_simulate(&j->in, &r), PIPERT_OK, "%s", pipert_last_error());
    return r;
}

/* ---- pipelines ------------------------------------------------------------ */

/* With equal stages, a flush schedule's step is (M+S−1)(f+b), so each stage
 * idles (S−1)/(M+S−1) of it: the published bubble. */
Test(simulate, flush_schedules_have_the_formula_bubble)
{
    const pt_schedule_kind kinds[] = {PT_SCHEDULE_1F1B, PT_SCHEDULE_GPIPE};
    const int shapes[][2] = {{2, 4}, {4, 8}, {4, 3}, {8, 16}, {1, 5}};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int S = shapes[i][0], M = shapes[i][1];
            job j;
            job_init(&j, kinds[k], S, 1, M, 6, 1.0, 2.0);
            pt_sim_result r = run(&j);
            const double expected = (M + S - 1) * 3.0;
            cr_expect_float_eq(r.step_s, expected, 1e-9, "%s S=%d M=%d: step %g, expected %g",
                               pt_schedule_kind_name(kinds[k]), S, M, r.step_s, expected);
            const double bubble = 1 - M * 3.0 / r.step_s;
            cr_expect_float_eq(bubble, pt_schedule_bubble_formula(S, M), 1e-12,
                               "S=%d M=%d: bubble %g", S, M, bubble);
            pt_sim_result_free(&r);
        }
}

/* The asynchronous 1F1B never flushes: once full, every stage takes a step
 * per forward and backward, with no bubble. */
Test(simulate, asynchronous_1f1b_has_no_steady_state_bubble)
{
    for (int S = 1; S <= 8; S *= 2) {
        job j;
        job_init(&j, PT_SCHEDULE_ASYNC_1F1B, S, 1, 1, 40, 1.0, 2.0);
        for (int s = 0; s < S; s++) j.costs[s].optimizer_s = 0.5;
        pt_sim_result r = run(&j);
        cr_expect_float_eq(r.step_s, 3.5, 1e-9, "S=%d: step %g, expected f+b+opt = 3.5", S,
                           r.step_s);
        pt_sim_result_free(&r);
    }
}

/* The slowest stage sets the pace of an uneven pipeline. */
Test(simulate, the_slowest_stage_sets_the_pace)
{
    job j;
    job_init(&j, PT_SCHEDULE_ASYNC_1F1B, 4, 1, 1, 40, 1.0, 2.0);
    j.costs[2] = (pt_sim_costs){2.0, 4.0, 0};
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 6.0, 1e-9, "step %g, expected stage 2's 6", r.step_s);
    cr_expect_float_eq(r.ranks[2].bubble, 0, 0.2, "the slow stage idles %g", r.ranks[2].bubble);
    cr_expect_gt(r.ranks[0].bubble, 0.4, "a fast stage idles %g", r.ranks[0].bubble);
    pt_sim_result_free(&r);
}

/* GPipe with instant compute on 2 stages: stage 0 sends its M activations at
 * once and the link carries them one after the other (c each, latency L
 * after), then the gradients come back the same way: 2·M·c + 2·L a step. */
Test(simulate, a_link_queues_its_messages)
{
    const int M = 4;
    const double c = 1.0, L = 0.5;
    job j;
    job_init(&j, PT_SCHEDULE_GPIPE, 2, 1, M, 5, 0, 0);
    j.in.activation_bytes = 1e6;
    j.stage_links[0] = (pt_sim_link){1e6 / c, L};
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 2 * M * c + 2 * L, 1e-9, "step %g, expected %g", r.step_s,
                       2 * M * c + 2 * L);
    cr_expect_float_eq(r.ranks[0].bytes_sent, 5 * M * 1e6, 1e-3, "stage 0 sent %g",
                       r.ranks[0].bytes_sent);
    pt_sim_result_free(&r);
}

/* Three pipelines whose boundaries share one queue (they cross between the same two sites):
 * each direction carries 3·M messages a step, so the step can be no shorter than 3·M·c
 * (alone, a pipeline's link is idle half of its step of 2·M·c + 2·L, and two would fit in
 * each other's gaps); with a queue each they run side by side. */
Test(simulate, pipelines_sharing_a_crossing_share_its_bandwidth)
{
    const int M = 4, R = 3;
    const double c = 1.0, L = 0.5;
    job j;
    job_init(&j, PT_SCHEDULE_GPIPE, 2, R, M, 8, 0, 0);
    j.in.activation_bytes = 1e6;
    for (int r = 0; r < R; r++) j.stage_links[r] = (pt_sim_link){1e6 / c, L};
    pt_sim_result apart = run(&j);
    cr_expect_float_eq(apart.step_s, 2 * M * c + 2 * L, 1e-9, "a queue each: step %g",
                       apart.step_s);
    const int shared[6] = {0, 1, 0, 1, 0, 1}; /* activations in queue 0, gradients in 1 */
    j.in.stage_queue = shared;
    pt_sim_result together = run(&j);
    cr_expect_geq(together.step_s, R * M * c - 1e-9, "one queue: step %g, below %g",
                  together.step_s, R * M * c);
    cr_expect_leq(together.step_s, R * M * c + 2 * L + 1e-9, "one queue: step %g, above %g",
                  together.step_s, R * M * c + 2 * L);
    pt_sim_result_free(&apart);
    pt_sim_result_free(&together);
}

/* Two pipelines crossing between two sites in opposite stage order, kept in step by an
 * instant blocking coupling: the first's activations go the way the second's gradients go,
 * and each direction of the link has its own capacity. Sharing the queues that way round,
 * both pipelines' activations go out at once (one in each direction), then both gradients:
 * a step of 2·M·c + 2·L. Had both pipelines' activations shared one queue (as for two
 * pipelines in the same stage order), the second's would wait for the first's, and its
 * gradients for the first's gradients: 3·M·c + 2·L. */
Test(simulate, pipelines_crossing_the_other_way_use_the_other_direction)
{
    const int M = 4, R = 2;
    const double c = 1.0, L = 0.5;
    job j;
    job_init(&j, PT_SCHEDULE_GPIPE, 2, R, M, 8, 0, 0);
    j.in.activation_bytes = 1e6;
    for (int r = 0; r < R; r++) j.stage_links[r] = (pt_sim_link){1e6 / c, L};
    j.in.coupling.every = 1; /* no bytes: only keeps the replicas in step */
    const int opposite[4] = {0, 1, 1, 0};
    j.in.stage_queue = opposite;
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 2 * M * c + 2 * L, 1e-9, "opposite ways: step %g, expected %g",
                       r.step_s, 2 * M * c + 2 * L);
    const int same_way[4] = {0, 1, 0, 1};
    j.in.stage_queue = same_way;
    pt_sim_result s = run(&j);
    cr_expect_float_eq(s.step_s, 3 * M * c + 2 * L, 1e-9, "the same way: step %g, expected %g",
                       s.step_s, 3 * M * c + 2 * L);
    pt_sim_result_free(&r);
    pt_sim_result_free(&s);
}

/* ---- coupling --------------------------------------------------------------- */

/* A blocking all-reduce after every step: compute, then bytes/bandwidth plus
 * its hops' latencies, every step. */
Test(simulate, a_blocking_allreduce_adds_its_transfer)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 1, 6, 1.0, 1.0);
    j.coupling_bytes[0] = 3;
    j.coupling_links[0] = (pt_sim_link){1, 0.25};
    j.in.coupling.every = 1;
    j.in.coupling.hops = 2;
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 2 + 3 + 0.5, 1e-9, "step %g, expected 5.5", r.step_s);
    cr_expect_float_eq(r.ranks[1].wait_coupling_s, 6 * 3.5, 1e-9, "waited %g",
                       r.ranks[1].wait_coupling_s);
    cr_expect_float_eq(r.coupling_link_bytes[0], 6 * 3 * 2, 1e-9);
    pt_sim_result_free(&r);
}

/* An exchange that may run beside `lag` steps hides behind compute while its
 * link keeps up, and is limited by the link when it does not. */
Test(simulate, exchanges_beside_training_cost_only_what_the_link_cannot_carry)
{
    const double transfers[] = {1.0, 3.0};
    const double expected[] = {2.0, 3.0};
    for (int k = 0; k < 2; k++) {
        job j;
        job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 1, 40, 1.0, 1.0);
        j.coupling_bytes[0] = transfers[k];
        j.in.coupling.every = 1;
        j.in.coupling.lag = 4;
        pt_sim_result r = run(&j);
        cr_expect_float_eq(r.step_s, expected[k], 1e-9, "transfer %g: step %g, expected %g",
                           transfers[k], r.step_s, expected[k]);
        pt_sim_result_free(&r);
    }
}

/* Every H steps only (DiLoCo): the transfer is paid once per H steps. */
Test(simulate, a_periodic_collective_is_paid_once_a_period)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 1, 41, 1.0, 1.0);
    j.coupling_bytes[0] = 10;
    j.in.coupling.every = 5;
    pt_sim_result r = run(&j);
    double total = 0;
    cr_expect_float_eq(r.ranks[0].wait_coupling_s, 8 * 10.0, 1e-9, "waited %g",
                       r.ranks[0].wait_coupling_s);
    total = r.makespan_s;
    cr_expect_float_eq(total, 41 * 2.0 + 8 * 10.0, 1e-9, "makespan %g", total);
    pt_sim_result_free(&r);
}

/* A blocking coupling makes every replica as slow as the slowest. */
Test(simulate, a_slow_replica_holds_a_blocking_coupling_back)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 1, 10, 1.0, 1.0);
    j.costs[1] = (pt_sim_costs){2.0, 2.0, 0};
    j.coupling_bytes[0] = 1;
    j.in.coupling.every = 1;
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 5.0, 1e-9, "step %g, expected the slow replica's 4 + 1",
                       r.step_s);
    cr_expect_float_eq(r.ranks[0].wait_coupling_s, 10 * 3.0, 1e-9, "the fast one waited %g",
                       r.ranks[0].wait_coupling_s);
    pt_sim_result_free(&r);
    j.in.coupling.every = 0; /* uncoupled: each at its own pace */
    r = run(&j);
    cr_expect_float_eq(r.step_s, 4.0, 1e-9, "uncoupled: the slowest step %g", r.step_s);
    cr_expect_float_eq(r.makespan_s, 40.0, 1e-9);
    pt_sim_result_free(&r);
}

/* Two stages whose collectives share one link queue behind each other. */
Test(simulate, collectives_sharing_a_link_queue)
{
    job j;
    job_init(&j, PT_SCHEDULE_ASYNC_1F1B, 2, 2, 1, 30, 0.5, 0.5);
    j.coupling_bytes[0] = j.coupling_bytes[1] = 2;
    j.in.coupling.every = 1;
    j.in.coupling.lag = 3;
    pt_sim_result shared = run(&j);
    j.coupling_links[1] = j.coupling_links[0];
    j.link_of[1] = 1;
    j.in.coupling.n_links = 2;
    pt_sim_result separate = run(&j);
    cr_expect_float_eq(shared.step_s, 4.0, 1e-9, "one link for both: step %g", shared.step_s);
    cr_expect_float_eq(separate.step_s, 2.0, 1e-9, "a link each: step %g", separate.step_s);
    pt_sim_result_free(&shared);
    pt_sim_result_free(&separate);
}

/* Ranks on one device take turns: two uncoupled replicas on one device take
 * twice as long a step; on two devices, as long as one. */
Test(simulate, ranks_sharing_a_device_take_turns)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 4, 40, 1.0, 2.0);
    const int one[] = {0, 0}, two[] = {0, 1};
    j.in.device_of = one;
    j.in.n_devices = 1;
    pt_sim_result r = run(&j);
    cr_expect_float_eq(r.step_s, 2 * 4 * 3.0, 1e-9, "one device: step %g", r.step_s);
    pt_sim_result_free(&r);
    j.in.device_of = two;
    j.in.n_devices = 2;
    r = run(&j);
    cr_expect_float_eq(r.step_s, 4 * 3.0, 1e-9, "two devices: step %g", r.step_s);
    pt_sim_result_free(&r);
    /* A 2-stage pipeline on one device: no bubble to hide, each stage's work
     * runs in the other's gaps, so a step costs the sum of the work. */
    job_init(&j, PT_SCHEDULE_ASYNC_1F1B, 2, 1, 1, 40, 1.0, 2.0);
    j.in.device_of = one;
    j.in.n_devices = 1;
    r = run(&j);
    cr_expect_float_eq(r.step_s, 6.0, 1e-9, "2 stages on one device: step %g", r.step_s);
    pt_sim_result_free(&r);
}

/* ---- memory, traces, refusals --------------------------------------------- */

/* 1F1B keeps S−s microbatches in flight on stage s; GPipe keeps all M. */
Test(simulate, activations_held_at_once)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 4, 1, 8, 3, 1.0, 2.0);
    pt_sim_result r = run(&j);
    for (int s = 0; s < 4; s++)
        cr_expect_eq(r.ranks[s].peak_activations, 4 - s, "1F1B stage %d holds %d", s,
                     r.ranks[s].peak_activations);
    pt_sim_result_free(&r);
    j.in.kind = PT_SCHEDULE_GPIPE;
    r = run(&j);
    for (int s = 0; s < 4; s++)
        cr_expect_eq(r.ranks[s].peak_activations, 8, "GPipe stage %d holds %d", s,
                     r.ranks[s].peak_activations);
    pt_sim_result_free(&r);
}

Test(simulate, the_trace_gets_every_compute_span)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 2, 2, 4, 3, 1.0, 2.0);
    pt_trace *traces[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pt_trace_create(&traces[i], i, i % 2, i / 2, 1024), PIPERT_OK);
    j.in.traces = traces;
    pt_sim_result r = run(&j);
    for (int i = 0; i < 4; i++) {
        /* 3 steps × 4 microbatches × (forward + backward) + 3 optimizer steps
         * (of cost 0: not drawn) */
        cr_expect_geq(pt_trace_event_count(traces[i]), 24, "rank %d: %zu spans", i,
                      pt_trace_event_count(traces[i]));
        pt_trace_free(traces[i]);
    }
    pt_sim_result_free(&r);
}

Test(simulate, refusals_name_the_problem)
{
    job j;
    job_init(&j, PT_SCHEDULE_1F1B, 3, 1, 2, 4, 1.0, 1.0);
    j.stage_links[1].bytes_per_s = 0;
    pt_sim_result r;
    cr_expect_eq(pt_simulate(&j.in, &r), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "between stages 1 and 2"), "%s", pipert_last_error());
    job_init(&j, PT_SCHEDULE_1F1B, 1, 2, 1, 4, 1.0, 1.0);
    j.in.coupling.every = 1;
    j.coupling_links[0].bytes_per_s = 0;
    cr_expect_eq(pt_simulate(&j.in, &r), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "coupling link of stage 0"), "%s", pipert_last_error());
    j.in.steps = 1;
    cr_expect_eq(pt_simulate(&j.in, &r), PIPERT_ERR_INVALID_ARG);
}
