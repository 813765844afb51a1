#include "pipeline/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/config.h"


static const char *const instruction_names[PT_INSTRUCTION_KINDS] = {
    [PT_LOAD_BATCH] = "load_batch",         [PT_RECV_ACTIVATION] = "recv_activation",
    [PT_FORWARD] = "forward",               [PT_SEND_ACTIVATION] = "send_activation",
    [PT_RECV_GRADIENT] = "recv_gradient",   [PT_BACKWARD] = "backward",
    [PT_SEND_GRADIENT] = "send_gradient",   [PT_OPTIMIZER_STEP] = "optimizer_step",
};

pipert_result pt_schedule_parse_kind(const char *name, pt_schedule_kind *out)
{
    const int k = pt_config_choice_value("pipeline.schedule", name);
    if (k < 0) return PIPERT_ERR_CONFIG;
    *out = (pt_schedule_kind)k;
    return PIPERT_OK;
}

const char *pt_schedule_kind_name(pt_schedule_kind kind)
{
    return pt_config_choice_name("pipeline.schedule", kind);
}

int pt_schedule_in_flight(pt_schedule_kind kind, int stages, int stage, long microbatches)
{
    if (stages > 1 && kind == PT_SCHEDULE_GPIPE) return (int)microbatches;
    const int depth = stages - stage;
    return depth < microbatches ? depth : (int)microbatches;
}

const char *pt_instruction_name(pt_instruction_kind kind)
{
    return (unsigned)kind < PT_INSTRUCTION_KINDS ? instruction_names[kind] : "unknown";
}

/* ---- building ------------------------------------------------------------ */

static void emit(pt_schedule *s, pt_instruction_kind kind, int microbatch)
{
    s->instructions[s->count++] = (pt_instruction){kind, microbatch};
}

static void emit_forward(pt_schedule *s, int m)
{
    emit(s, s->stage == 0 ? PT_LOAD_BATCH : PT_RECV_ACTIVATION, m);
    emit(s, PT_FORWARD, m);
    if (s->stage < s->stages - 1) emit(s, PT_SEND_ACTIVATION, m);
}

static void emit_backward(pt_schedule *s, int m)
{
    if (s->stage < s->stages - 1) emit(s, PT_RECV_GRADIENT, m);
    emit(s, PT_BACKWARD, m);
    if (s->stage > 0) emit(s, PT_SEND_GRADIENT, m);
    if (s->kind == PT_SCHEDULE_ASYNC_1F1B) emit(s, PT_OPTIMIZER_STEP, -1);
}

static void build_gpipe(pt_schedule *s)
{
    for (int m = 0; m < s->microbatches; m++) emit_forward(s, m);
    for (int m = 0; m < s->microbatches; m++) emit_backward(s, m);
    emit(s, PT_OPTIMIZER_STEP, -1);
}

/* The synchronous microbatches one at a time; then warm-up forwards fill the
 * pipeline below this stage; then one forward and one backward alternate;
 * then the backwards drain. The last stage has no warm-up: it runs F0 B0 F1 B1 … */
static void build_one_forward_one_backward(pt_schedule *s)
{
    const int M = s->microbatches, K = s->synchronous;
    for (int m = 0; m < K; m++) {
        emit_forward(s, m);
        emit_backward(s, m);
    }
    int warmup = s->stages - s->stage - 1;
    if (warmup > M - K) warmup = M - K;
    for (int m = K; m < K + warmup; m++) emit_forward(s, m);
    for (int m = K + warmup; m < M; m++) {
        emit_forward(s, m);
        emit_backward(s, m - warmup);
    }
    for (int m = M - warmup; m < M; m++) emit_backward(s, m);
    if (s->kind == PT_SCHEDULE_1F1B) emit(s, PT_OPTIMIZER_STEP, -1);
}

static pipert_result build(pt_schedule *out, pt_schedule_kind kind, int stages, int microbatches,
                           int stage, int synchronous)
{
    memset(out, 0, sizeof *out);
    if (stages < 1 || microbatches < 1 || stage < 0 || stage >= stages)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "schedule: stage %d of %d stages with %d microbatches is impossible", stage,
                       stages, microbatches);
    if ((unsigned)kind >= (unsigned)PT_SCHEDULE_KINDS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "schedule: unknown kind %d", (int)kind);
    if (synchronous < 0 || synchronous > microbatches)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "schedule: %d synchronous microbatches of %d is impossible", synchronous,
                       microbatches);
    *out = (pt_schedule){.kind = kind,
                         .stages = stages,
                         .microbatches = microbatches,
                         .stage = stage,
                         .synchronous = synchronous};
    /* at most 3 instructions per forward, 4 per backward (with a step), 1 step */
    out->instructions = calloc((size_t)7 * microbatches + 1, sizeof *out->instructions);
    if (!out->instructions) return pt_fail(PIPERT_ERR_NOMEM, "schedule: out of memory");
    if (kind == PT_SCHEDULE_GPIPE) build_gpipe(out);
    else build_one_forward_one_backward(out);
    return PIPERT_OK;
}

pipert_result pt_schedule_build(pt_schedule *out, pt_schedule_kind kind, int stages,
                                int microbatches, int stage)
{
    return build(out, kind, stages, microbatches, stage, 0);
}

pipert_result pt_schedule_build_async(pt_schedule *out, int stages, int microbatches, int stage,
                                      int synchronous)
{
    return build(out, PT_SCHEDULE_ASYNC_1F1B, stages, microbatches, stage, synchronous);
}

pipert_result pt_schedule_build_for_stage(pt_schedule *out, const pt_schedule *like, int stage)
{
    return build(out, like->kind, like->stages, like->microbatches, stage, like->synchronous);
}

void pt_schedule_free(pt_schedule *s)
{
    free(s->instructions);
    memset(s, 0, sizeof *s);
}

double pt_schedule_bubble_formula(int stages, int microbatches)
{
    return (double)(stages - 1) / (double)(microbatches + stages - 1);
}

/* ---- simulation ---------------------------------------------------------- */

/* Messages in flight, by direction: sent_at[dir][(sender)·M + m] is the time
 * the message was sent (−1: not yet), received[…] counts its receives. */
typedef struct mailbox {
    int stages, microbatches;
    double *sent_at[2];
    int *received[2];
} mailbox;

enum { ACTIVATIONS, GRADIENTS };

static bool mailbox_init(mailbox *box, int S, int M)
{
    box->stages = S;
    box->microbatches = M;
    for (int d = 0; d < 2; d++) {
        box->sent_at[d] = malloc(sizeof(double) * S * M);
        box->received[d] = calloc((size_t)S * M, sizeof(int));
        if (!box->sent_at[d] || !box->received[d]) return false;
        for (int i = 0; i < S * M; i++) box->sent_at[d][i] = -1;
    }
    return true;
}

static void mailbox_free(mailbox *box)
{
    for (int d = 0; d < 2; d++) {
        free(box->sent_at[d]);
        free(box->received[d]);
    }
}

typedef struct stage_state {
    int next;     /* index of the next instruction */
    double clock; /* when the stage is free */
    double busy;  /* time spent in forward and backward */
} stage_state;

/* Tries to execute stage s's next instruction; false if it must wait for a
 * message (or is done). Problems are written to sim->problem. */
static bool step_stage(const pt_schedule *sched, stage_state *st, mailbox *box, double fwd,
                       double bwd, pt_simulation *sim)
{
    if (st->next >= sched->count) return false;
    const pt_instruction in = sched->instructions[st->next];
    const int s = sched->stage, M = box->microbatches;
    double cost = 0;
    switch (in.kind) {
    case PT_RECV_ACTIVATION:
    case PT_RECV_GRADIENT: {
        int dir = in.kind == PT_RECV_ACTIVATION ? ACTIVATIONS : GRADIENTS;
        int sender = dir == ACTIVATIONS ? s - 1 : s + 1;
        if (sender < 0 || sender >= box->stages) {
            snprintf(sim->problem, sizeof sim->problem, "stage %d receives from stage %d", s, sender);
            return false;
        }
        double at = box->sent_at[dir][sender * M + in.microbatch];
        if (at < 0) return false; /* not sent yet: wait */
        box->received[dir][sender * M + in.microbatch]++;
        if (at > st->clock) st->clock = at;
        break;
    }
    case PT_SEND_ACTIVATION:
    case PT_SEND_GRADIENT: {
        int dir = in.kind == PT_SEND_ACTIVATION ? ACTIVATIONS : GRADIENTS;
        double *slot = &box->sent_at[dir][s * M + in.microbatch];
        if (*slot >= 0) {
            snprintf(sim->problem, sizeof sim->problem, "stage %d sends %s %d twice", s,
                     pt_instruction_name(in.kind), in.microbatch);
            return false;
        }
        *slot = st->clock;
        break;
    }
    case PT_FORWARD: cost = fwd; break;
    case PT_BACKWARD: cost = bwd; break;
    default: break;
    }
    st->clock += cost;
    st->busy += cost;
    st->next++;
    return true;
}

/* Every send was received exactly once, by the neighbour it was meant for. */
static void check_all_received(const mailbox *box, pt_simulation *sim)
{
    const int S = box->stages, M = box->microbatches;
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < S; s++)
            for (int m = 0; m < M; m++) {
                bool sent = box->sent_at[d][s * M + m] >= 0;
                int got = box->received[d][s * M + m];
                if ((sent && got != 1) || (!sent && got != 0)) {
                    snprintf(sim->problem, sizeof sim->problem,
                             "%s of microbatch %d from stage %d: sent %d time(s), received %d",
                             d == ACTIVATIONS ? "activation" : "gradient", m, s, sent, got);
                    return;
                }
            }
}

pt_simulation pt_schedule_simulate(const pt_schedule *schedules, int S, double fwd, double bwd)
{
    pt_simulation sim = {0};
    const int M = schedules[0].microbatches;
    mailbox box;
    stage_state *state = calloc((size_t)S, sizeof *state);
    if (!state || !mailbox_init(&box, S, M)) {
        snprintf(sim.problem, sizeof sim.problem, "out of memory");
        free(state);
        return sim;
    }
    /* Run every stage as far as it can go, until nothing moves. A stage's
     * times depend only on its own clock and the times messages were sent, so
     * the order in which stages are advanced does not change the result. */
    for (bool moved = true; moved && !sim.problem[0];) {
        moved = false;
        for (int s = 0; s < S; s++)
            while (step_stage(&schedules[s], &state[s], &box, fwd, bwd, &sim)) moved = true;
    }
    double busy = 0;
    for (int s = 0; s < S; s++) {
        if (state[s].next < schedules[s].count && !sim.problem[0]) {
            sim.deadlocked = true;
            const pt_instruction *in = &schedules[s].instructions[state[s].next];
            snprintf(sim.problem, sizeof sim.problem, "deadlock: stage %d waits at %s %d", s,
                     pt_instruction_name(in->kind), in->microbatch);
        }
        if (state[s].clock > sim.makespan) sim.makespan = state[s].clock;
        busy += state[s].busy;
    }
    if (!sim.problem[0]) check_all_received(&box, &sim);
    sim.bubble = sim.makespan > 0 ? 1.0 - busy / (S * sim.makespan) : 0;
    mailbox_free(&box);
    free(state);
    return sim;
}
