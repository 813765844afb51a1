/* Pipeline schedules, simulated for every stage in one process: each
 * microbatch runs forward then backward exactly once on every stage, every
 * send meets its receive, nothing deadlocks, the bubble equals the formula,
 * and the asynchronous schedule's staleness is S−1−s. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "pipeline/lookahead.h"
#include "pipeline/schedule.h"

static const pt_schedule_kind all_kinds[] = {PT_SCHEDULE_GPIPE, PT_SCHEDULE_1F1B,
                                             PT_SCHEDULE_ASYNC_1F1B};

static void build_all(pt_schedule *schedules, pt_schedule_kind kind, int S, int M)
{
    for (int s = 0; s < S; s++)
        cr_assert_eq(pt_schedule_build(&schedules[s], kind, S, M, s), PIPERT_OK, "%s",
                     pipert_last_error());
}

static void free_all(pt_schedule *schedules, int S)
{
    for (int s = 0; s < S; s++) pt_schedule_free(&schedules[s]);
}

/* Position of the first instruction of `kind` for microbatch m, or −1. */
static int position(const pt_schedule *sched, pt_instruction_kind kind, int m)
{
    for (int i = 0; i < sched->count; i++)
        if (sched->instructions[i].kind == kind && sched->instructions[i].microbatch == m) return i;
    return -1;
}

static int count_kind(const pt_schedule *sched, pt_instruction_kind kind, int m)
{
    int n = 0;
    for (int i = 0; i < sched->count; i++)
        n += sched->instructions[i].kind == kind && (m < 0 || sched->instructions[i].microbatch == m);
    return n;
}

static void check_each_microbatch_once(const pt_schedule *sched)
{
    const int S = sched->stages, s = sched->stage;
    for (int m = 0; m < sched->microbatches; m++) {
        cr_assert_eq(count_kind(sched, PT_FORWARD, m), 1, "%s S=%d stage %d: forward %d",
                     pt_schedule_kind_name(sched->kind), S, s, m);
        cr_assert_eq(count_kind(sched, PT_BACKWARD, m), 1, "%s S=%d stage %d: backward %d",
                     pt_schedule_kind_name(sched->kind), S, s, m);
        cr_assert_lt(position(sched, PT_FORWARD, m), position(sched, PT_BACKWARD, m));
        pt_instruction_kind input = s == 0 ? PT_LOAD_BATCH : PT_RECV_ACTIVATION;
        cr_assert_eq(count_kind(sched, input, m), 1);
        cr_assert_lt(position(sched, input, m), position(sched, PT_FORWARD, m));
    }
    int steps = count_kind(sched, PT_OPTIMIZER_STEP, -1);
    int expected = sched->kind == PT_SCHEDULE_ASYNC_1F1B ? sched->microbatches : 1;
    cr_assert_eq(steps, expected, "%s: %d optimizer steps", pt_schedule_kind_name(sched->kind), steps);
}

Test(schedule, every_kind_every_size_runs_correctly)
{
    pt_schedule schedules[16];
    for (size_t k = 0; k < sizeof all_kinds / sizeof all_kinds[0]; k++)
        for (int S = 1; S <= 16; S++)
            for (int M = 1; M <= 64; M++) {
                build_all(schedules, all_kinds[k], S, M);
                for (int s = 0; s < S; s++) check_each_microbatch_once(&schedules[s]);
                pt_simulation sim = pt_schedule_simulate(schedules, S, 1.0, 2.0);
                cr_assert(!sim.deadlocked && !sim.problem[0], "%s S=%d M=%d: %s",
                          pt_schedule_kind_name(all_kinds[k]), S, M, sim.problem);
                /* GPipe and 1F1B flush every step; the asynchronous schedule
                 * fills and drains once per run, here a run of M. */
                double formula = pt_schedule_bubble_formula(S, M);
                cr_assert(fabs(sim.bubble - formula) < 1e-12, "%s S=%d M=%d: bubble %.6f, formula %.6f",
                          pt_schedule_kind_name(all_kinds[k]), S, M, sim.bubble, formula);
                cr_assert_float_eq(sim.makespan, 3.0 * (M + S - 1), 1e-9);
                free_all(schedules, S);
            }
}

/* On stage s the backward of microbatch m runs on weights min(m, S−1−s)
 * optimizer steps newer than its forward's: τ_s = S−1−s in steady state. */
Test(schedule, asynchronous_staleness_is_stages_below)
{
    for (int S = 1; S <= 8; S++)
        for (int s = 0; s < S; s++) {
            pt_schedule sched;
            const int M = 32;
            cr_assert_eq(pt_schedule_build(&sched, PT_SCHEDULE_ASYNC_1F1B, S, M, s), PIPERT_OK);
            for (int m = 0; m < M; m++) {
                int steps = 0;
                for (int i = position(&sched, PT_FORWARD, m); i < position(&sched, PT_BACKWARD, m); i++)
                    steps += sched.instructions[i].kind == PT_OPTIMIZER_STEP;
                int expected = m < S - 1 - s ? m : S - 1 - s;
                cr_assert_eq(steps, expected, "S=%d stage %d microbatch %d: staleness %d, expected %d",
                             S, s, m, steps, expected);
            }
            pt_schedule_free(&sched);
        }
}

/* pipeline.sync_steps: the first K microbatches see no staleness and pass one
 * at a time (each costs a whole trip down and up the S stages, (1 + 2)·S with
 * unit costs), then the schedule is the asynchronous one of the other M − K,
 * whose staleness ramps up from 0 again; nothing deadlocks. */
Test(schedule, synchronous_steps_first_then_asynchronous)
{
    pt_schedule schedules[8];
    for (int S = 1; S <= 8; S++)
        for (int M = 1; M <= 24; M += 3)
            for (int K = 0; K <= M; K++) {
                for (int s = 0; s < S; s++) {
                    pt_schedule *sched = &schedules[s];
                    cr_assert_eq(pt_schedule_build_async(sched, S, M, s, K), PIPERT_OK, "%s",
                                 pipert_last_error());
                    check_each_microbatch_once(sched);
                    for (int m = 0; m < M; m++) {
                        int steps = 0;
                        for (int i = position(sched, PT_FORWARD, m);
                             i < position(sched, PT_BACKWARD, m); i++)
                            steps += sched->instructions[i].kind == PT_OPTIMIZER_STEP;
                        const int after = m - K, tau = S - 1 - s;
                        const int expected = after < 0 ? 0 : after < tau ? after : tau;
                        cr_assert_eq(steps, expected, "S=%d M=%d K=%d stage %d microbatch %d: "
                                                      "staleness %d, expected %d",
                                     S, M, K, s, m, steps, expected);
                    }
                }
                pt_simulation sim = pt_schedule_simulate(schedules, S, 1.0, 2.0);
                cr_assert(!sim.deadlocked && !sim.problem[0], "S=%d M=%d K=%d: %s", S, M, K,
                          sim.problem);
                const double expected = 3.0 * S * K + (M > K ? 3.0 * (M - K + S - 1) : 0.0);
                cr_assert_float_eq(sim.makespan, expected, 1e-9, "S=%d M=%d K=%d: makespan %g",
                                   S, M, K, sim.makespan);
                free_all(schedules, S);
            }
    pt_schedule sched;
    cr_expect_eq(pt_schedule_build_async(&sched, 4, 8, 0, 9), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_schedule_build_async(&sched, 4, 8, 0, -1), PIPERT_ERR_INVALID_ARG);
}

/* 1F1B keeps at most S−s microbatches' activations on stage s; GPipe keeps M. */
Test(schedule, activations_in_flight)
{
    const int S = 6, M = 20;
    for (size_t k = 0; k < 2; k++)
        for (int s = 0; s < S; s++) {
            pt_schedule sched;
            cr_assert_eq(pt_schedule_build(&sched, all_kinds[k], S, M, s), PIPERT_OK);
            int live = 0, peak = 0;
            for (int i = 0; i < sched.count; i++) {
                live += sched.instructions[i].kind == PT_FORWARD;
                live -= sched.instructions[i].kind == PT_BACKWARD;
                peak = live > peak ? live : peak;
            }
            int expected = all_kinds[k] == PT_SCHEDULE_GPIPE ? M : S - s;
            cr_expect_eq(peak, expected, "%s stage %d: %d in flight", pt_schedule_kind_name(all_kinds[k]),
                         s, peak);
            pt_schedule_free(&sched);
        }
}

Test(schedule, the_simulator_catches_broken_schedules)
{
    pt_schedule schedules[2];
    build_all(schedules, PT_SCHEDULE_1F1B, 2, 4);
    /* stage 0 never sends microbatch 3: stage 1 waits for it, and stage 0
     * for its gradient */
    for (int i = 0; i < schedules[0].count; i++)
        if (schedules[0].instructions[i].kind == PT_SEND_ACTIVATION &&
            schedules[0].instructions[i].microbatch == 3)
            schedules[0].instructions[i].kind = PT_FORWARD;
    pt_simulation sim = pt_schedule_simulate(schedules, 2, 1.0, 2.0);
    cr_expect(sim.deadlocked, "a missing send must deadlock: %s", sim.problem);
    cr_expect(strstr(sim.problem, "deadlock: stage 0 waits at recv_gradient 3") != NULL, "%s",
              sim.problem);
    free_all(schedules, 2);

    /* a microbatch sent twice */
    build_all(schedules, PT_SCHEDULE_GPIPE, 2, 2);
    schedules[0].instructions[2] = (pt_instruction){PT_SEND_ACTIVATION, 0};
    schedules[0].instructions[5] = (pt_instruction){PT_SEND_ACTIVATION, 0};
    sim = pt_schedule_simulate(schedules, 2, 1.0, 2.0);
    cr_expect(strstr(sim.problem, "twice") != NULL, "%s", sim.problem);
    free_all(schedules, 2);
}

Test(schedule, names_and_errors)
{
    pt_schedule_kind kind;
    cr_expect_eq(pt_schedule_parse_kind("async-1f1b", &kind), PIPERT_OK);
    cr_expect_eq(kind, PT_SCHEDULE_ASYNC_1F1B);
    cr_expect_eq(pt_schedule_parse_kind("zero-bubble", &kind), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "zero-bubble") != NULL);
    pt_schedule sched;
    cr_expect_eq(pt_schedule_build(&sched, PT_SCHEDULE_GPIPE, 4, 8, 4), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_schedule_build(&sched, PT_SCHEDULE_GPIPE, 4, 0, 0), PIPERT_ERR_INVALID_ARG);
}

/* The most microbatches whose forward ran and whose backward has not, in a stage's list. */
static int most_in_flight(const pt_schedule *s)
{
    int now = 0, most = 0;
    for (int i = 0; i < s->count; i++) {
        now += (s->instructions[i].kind == PT_FORWARD) - (s->instructions[i].kind == PT_BACKWARD);
        most = now > most ? now : most;
    }
    return most;
}

/* What the executor allocates activations for and the cost model charges is what the
 * instruction lists hold at most, for every schedule, stage count, stage and microbatches. */
Test(schedule, in_flight_is_what_the_instruction_lists_hold)
{
    const pt_schedule_kind kinds[] = {PT_SCHEDULE_GPIPE, PT_SCHEDULE_1F1B, PT_SCHEDULE_ASYNC_1F1B};
    for (int k = 0; k < 3; k++)
        for (int S = 2; S <= 6; S++)
            for (int M = 1; M <= 9; M++)
                for (int s = 0; s < S; s++) {
                    pt_schedule sched;
                    cr_assert_eq(pt_schedule_build(&sched, kinds[k], S, M, s), PIPERT_OK);
                    cr_expect_eq(pt_schedule_in_flight(kinds[k], S, s, M), most_in_flight(&sched),
                                 "%s, stage %d of %d, %d microbatches",
                                 pt_schedule_kind_name(kinds[k]), s, S, M);
                    pt_schedule_free(&sched);
                }
    cr_expect_eq(pt_schedule_in_flight(PT_SCHEDULE_GPIPE, 1, 0, 8), 1, "one stage runs 1F1B");
}

/* The look-ahead table: a row per kind, in the enum's order, found by its name; an unknown
 * name is an error naming the known ones. */
Test(schedule, every_lookahead_has_its_row)
{
    for (int k = PT_LOOKAHEAD_NONE; k <= PT_LOOKAHEAD_NESTEROV_SECANT; k++) {
        const pt_lookahead_traits *row = pt_lookahead_traits_of((pt_lookahead)k);
        const char *name = pt_lookahead_name((pt_lookahead)k);
        cr_expect_eq(pt_lookahead_named(name), row, "%s", name);
        cr_expect_eq(row->stashes, k != PT_LOOKAHEAD_NONE, "%s", name);
        cr_expect_eq(row->compensates, row->dc_lambda > 0, "%s: λ %g", name, row->dc_lambda);
    }
    cr_expect_null(pt_lookahead_named("nesterov-dcx"));
    cr_expect(strstr(pipert_last_error(), "\"nesterov-dcx\"") &&
                  strstr(pipert_last_error(), "nesterov-secant"),
              "%s", pipert_last_error());
}
