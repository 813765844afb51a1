#include "scheduler/simulate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

enum { ACTIVATION, GRADIENT };

typedef enum wait_kind { NOT_WAITING, WAITS_MESSAGE, WAITS_COLLECTIVE } wait_kind;

typedef struct rank_state {
    int replica, stage;
    pt_schedule schedule;
    int pc, pass;       /* instruction; repetition of the schedule (flush schedules: one a step) */
    double clock;
    bool done;
    wait_kind waiting;
    long wait_key;      /* the message or collective waited for */
    double wait_since;
    int steps_taken;
    double *step_end;   /* [steps] */
    int live;
    pt_sim_rank_result result;
} rank_state;

typedef struct collective {
    int posted;
    double last_post, end; /* end < 0: not started */
} collective;

typedef struct simulation {
    const pt_sim_input *in;
    int n_ranks, microbatches_per_pass, passes;
    rank_state *ranks;
    double *arrival;      /* [R·S·2·total microbatches]: < 0 not sent */
    double *link_free;    /* [R·(S−1)·2]: pipeline link queues, each direction */
    double *coupling_free; /* [n_links] */
    double *device_free;   /* [n_devices]: when each shared device is next free */
    collective *collectives; /* [S·per_stage] */
    int collectives_per_stage;
    int *heap, heap_size; /* ranks by clock */
    pt_sim_result *out;
} simulation;

/* ---- a heap of ranks ordered by clock (ties: the lower rank) ------------- */

static bool earlier(const simulation *sim, int a, int b)
{
    const double ca = sim->ranks[a].clock, cb = sim->ranks[b].clock;
    return ca < cb || (ca == cb && a < b);
}

static void heap_push(simulation *sim, int rank)
{
    int i = sim->heap_size++;
    sim->heap[i] = rank;
    while (i > 0 && earlier(sim, sim->heap[i], sim->heap[(i - 1) / 2])) {
        const int parent = (i - 1) / 2, t = sim->heap[i];
        sim->heap[i] = sim->heap[parent];
        sim->heap[parent] = t;
        i = parent;
    }
}

static int heap_pop(simulation *sim)
{
    const int top = sim->heap[0];
    sim->heap[0] = sim->heap[--sim->heap_size];
    for (int i = 0;;) {
        int best = i;
        const int l = 2 * i + 1, r = 2 * i + 2;
        if (l < sim->heap_size && earlier(sim, sim->heap[l], sim->heap[best])) best = l;
        if (r < sim->heap_size && earlier(sim, sim->heap[r], sim->heap[best])) best = r;
        if (best == i) break;
        const int t = sim->heap[i];
        sim->heap[i] = sim->heap[best];
        sim->heap[best] = t;
        i = best;
    }
    return top;
}

/* ---- spans ---------------------------------------------------------------- */

static void span(const simulation *sim, const rank_state *r, const char *category, double from_s,
                 double to_s, long microbatch)
{
    if (!sim->in->traces || to_s <= from_s) return;
    pt_trace *t = sim->in->traces[r->replica * sim->in->stages + r->stage];
    const double origin = sim->in->trace_origin_us;
    pt_trace_span(t, category, origin + 1e6 * from_s, origin + 1e6 * to_s, microbatch,
                  r->steps_taken + 1, -1);
}

/* ---- messages between neighbouring stages -------------------------------- */

static int rank_index(const simulation *sim, int replica, int stage)
{
    return replica * sim->in->stages + stage;
}

/* The microbatch's number in the whole run (flush schedules restart their
 * numbering every pass). */
static long global_microbatch(const simulation *sim, const rank_state *r, int microbatch)
{
    return (long)r->pass * sim->microbatches_per_pass + microbatch;
}

static long message_key(const simulation *sim, int replica, int to_stage, int direction,
                        long microbatch)
{
    const long total = (long)sim->microbatches_per_pass * sim->passes;
    return (((long)replica * sim->in->stages + to_stage) * 2 + direction) * total + microbatch;
}

static void advance(simulation *sim, rank_state *r);

/* What a waiting rank waited for is there at `at`: it goes on after the
 * instruction it waited at. */
static void resume(simulation *sim, rank_state *r, double at, const char *category)
{
    if (at > r->clock) {
        span(sim, r, category, r->clock, at, -1);
        if (r->waiting == WAITS_COLLECTIVE) r->result.wait_coupling_s += at - r->clock;
        r->clock = at;
    }
    r->waiting = NOT_WAITING;
    advance(sim, r);
    if (!r->done) heap_push(sim, rank_index(sim, r->replica, r->stage));
}

static void send(simulation *sim, rank_state *r, int direction, int microbatch)
{
    const pt_sim_input *in = sim->in;
    const int to = r->stage + (direction == ACTIVATION ? 1 : -1);
    const int boundary = direction == ACTIVATION ? r->stage : to;
    const int at = r->replica * (in->stages - 1) + boundary;
    const pt_sim_link *link = &in->stage_links[at];
    const int queue = in->stage_queue ? in->stage_queue[2 * at + direction] : 2 * at + direction;
    double *free_at = &sim->link_free[queue];
    const double start = fmax(r->clock, *free_at);
    *free_at = start + in->activation_bytes / link->bytes_per_s;
    const double arrival = *free_at + link->latency_s;
    r->result.bytes_sent += in->activation_bytes;
    const long key = message_key(sim, r->replica, to, direction, global_microbatch(sim, r, microbatch));
    sim->arrival[key] = arrival;
    rank_state *receiver = &sim->ranks[rank_index(sim, r->replica, to)];
    if (receiver->waiting == WAITS_MESSAGE && receiver->wait_key == key)
        resume(sim, receiver, arrival, "recv");
}

/* Returns false when the rank must wait for the message. */
static bool receive(simulation *sim, rank_state *r, int direction, int microbatch)
{
    const long key =
        message_key(sim, r->replica, r->stage, direction, global_microbatch(sim, r, microbatch));
    const double arrival = sim->arrival[key];
    if (arrival < 0) {
        r->waiting = WAITS_MESSAGE;
        r->wait_key = key;
        return false;
    }
    if (arrival > r->clock) {
        span(sim, r, "recv", r->clock, arrival, microbatch);
        r->clock = arrival;
    }
    return true;
}

/* ---- the coupling ----------------------------------------------------------- */

static collective *collective_of(simulation *sim, int stage, int index)
{
    return &sim->collectives[stage * sim->collectives_per_stage + index];
}

static void start_collective(simulation *sim, int stage, int index)
{
    const pt_sim_coupling *cp = &sim->in->coupling;
    collective *c = collective_of(sim, stage, index);
    const int l = cp->link_of[stage];
    const double start = fmax(c->last_post, sim->coupling_free[l]);
    const double transfer = cp->bytes[stage] / cp->links[l].bytes_per_s;
    /* the link is busy while the bytes go out; the latencies are paid beside */
    sim->coupling_free[l] = start + transfer;
    const int members = cp->members ? cp->members[stage] : sim->in->replicas;
    const int hops = cp->members ? 2 * (members - 1) : cp->hops;
    c->end = start + transfer + hops * cp->links[l].latency_s;
    sim->out->coupling_link_bytes[l] += cp->bytes[stage] * members;
    for (int rep = 0; rep < sim->in->replicas; rep++) {
        rank_state *r = &sim->ranks[rank_index(sim, rep, stage)];
        if (r->waiting == WAITS_COLLECTIVE && r->wait_key == index) {
            r->step_end[r->steps_taken - 1] = fmax(r->clock, c->end);
            resume(sim, r, c->end, "coupling wait");
        }
    }
}

static bool coupled(const simulation *sim)
{
    return sim->in->replicas > 1 && sim->in->coupling.every > 0;
}

/* After optimizer step k: posts collective k (if any), then returns false if
 * the rank must wait for collective k − lag. */
static bool couple(simulation *sim, rank_state *r)
{
    if (!coupled(sim)) return true;
    const pt_sim_coupling *cp = &sim->in->coupling;
    const int k = r->steps_taken;
    if (k % cp->every == 0) {
        collective *c = collective_of(sim, r->stage, k / cp->every);
        c->last_post = fmax(c->last_post, r->clock);
        if (++c->posted == sim->in->replicas) start_collective(sim, r->stage, k / cp->every);
    }
    const int due = k - cp->lag;
    if (due < 1 || due % cp->every) return true;
    const collective *c = collective_of(sim, r->stage, due / cp->every);
    if (c->end < 0) {
        r->waiting = WAITS_COLLECTIVE;
        r->wait_key = due / cp->every;
        return false;
    }
    if (c->end > r->clock) {
        span(sim, r, "coupling wait", r->clock, c->end, -1);
        r->result.wait_coupling_s += c->end - r->clock;
        r->clock = c->end;
    }
    return true;
}

/* ---- one instruction ------------------------------------------------------ */

static void compute(simulation *sim, rank_state *r, const char *category, double seconds,
                    long microbatch)
{
    if (sim->in->device_of && seconds > 0) {
        double *free_at = &sim->device_free[sim->in->device_of[rank_index(sim, r->replica, r->stage)]];
        r->clock = fmax(r->clock, *free_at);
        *free_at = r->clock + seconds;
    }
    span(sim, r, category, r->clock, r->clock + seconds, microbatch);
    r->clock += seconds;
    r->result.busy_s += seconds;
}

/* Runs the rank's next instruction; false if it now waits. */
static bool execute(simulation *sim, rank_state *r)
{
    const pt_sim_costs *cost = &sim->in->costs[rank_index(sim, r->replica, r->stage)];
    const pt_instruction *ins = &r->schedule.instructions[r->pc];
    switch (ins->kind) {
    case PT_LOAD_BATCH: break;
    case PT_FORWARD:
        compute(sim, r, "forward", cost->forward_s, ins->microbatch);
        if (++r->live > r->result.peak_activations) r->result.peak_activations = r->live;
        break;
    case PT_BACKWARD:
        compute(sim, r, "backward", cost->backward_s, ins->microbatch);
        r->live--;
        break;
    case PT_SEND_ACTIVATION: send(sim, r, ACTIVATION, ins->microbatch); break;
    case PT_SEND_GRADIENT: send(sim, r, GRADIENT, ins->microbatch); break;
    case PT_RECV_ACTIVATION: return receive(sim, r, ACTIVATION, ins->microbatch);
    case PT_RECV_GRADIENT: return receive(sim, r, GRADIENT, ins->microbatch);
    case PT_OPTIMIZER_STEP:
        compute(sim, r, "optimizer", cost->optimizer_s, -1);
        r->steps_taken++;
        if (!couple(sim, r)) return false;
        r->step_end[r->steps_taken - 1] = r->clock;
        break;
    default: break;
    }
    return true;
}

/* Moves past the instruction just run; at the end of a pass, the next pass
 * (flush schedules) or the end. */
static void advance(simulation *sim, rank_state *r)
{
    if (++r->pc < r->schedule.count) return;
    r->pc = 0;
    if (++r->pass == sim->passes) r->done = true;
}

/* ---- setup and results ----------------------------------------------------- */

static pipert_result check_input(const pt_sim_input *in)
{
    if (in->stages < 1 || in->replicas < 1 || in->microbatches < 1 || in->steps < 2)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "simulate: %d stages, %d replicas, %d microbatches, %d steps (at least 1, 1, "
                       "1 and 2)", in->stages, in->replicas, in->microbatches, in->steps);
    for (int i = 0; i < in->replicas * (in->stages - 1); i++)
        if (!(in->stage_links[i].bytes_per_s > 0))
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "simulate: the link between stages %d and %d of replica %d has no "
                           "bandwidth", i % (in->stages - 1), i % (in->stages - 1) + 1,
                           i / (in->stages - 1));
    for (int i = 0; in->device_of && i < in->replicas * in->stages; i++)
        if (in->device_of[i] < 0 || in->device_of[i] >= in->n_devices)
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "simulate: rank %d is on device %d of %d", i, in->device_of[i],
                           in->n_devices);
    const pt_sim_coupling *cp = &in->coupling;
    if (in->replicas > 1 && cp->every > 0)
        for (int s = 0; s < in->stages; s++) {
            const int l = cp->link_of[s];
            if (l < 0 || l >= cp->n_links || !(cp->links[l].bytes_per_s > 0))
                return pt_fail(PIPERT_ERR_INVALID_ARG,
                               "simulate: the coupling link of stage %d (%d) has no bandwidth", s,
                               l);
        }
    return PIPERT_OK;
}

static pipert_result setup(simulation *sim, const pt_sim_input *in, pt_sim_result *out)
{
    const bool async = in->kind == PT_SCHEDULE_ASYNC_1F1B;
    sim->in = in;
    sim->out = out;
    sim->n_ranks = in->replicas * in->stages;
    sim->microbatches_per_pass = async ? in->steps : in->microbatches;
    sim->passes = async ? 1 : in->steps;
    const long messages = (long)sim->n_ranks * 2 * sim->microbatches_per_pass * sim->passes;
    sim->collectives_per_stage = in->steps + 1;
    sim->ranks = calloc((size_t)sim->n_ranks, sizeof *sim->ranks);
    sim->arrival = malloc((size_t)messages * sizeof *sim->arrival);
    sim->link_free = calloc((size_t)(in->replicas * in->stages * 2), sizeof *sim->link_free);
    sim->coupling_free = calloc((size_t)in->coupling.n_links + 1, sizeof *sim->coupling_free);
    sim->collectives = calloc((size_t)in->stages * (size_t)sim->collectives_per_stage,
                              sizeof *sim->collectives);
    sim->heap = malloc((size_t)sim->n_ranks * sizeof *sim->heap);
    sim->device_free = calloc((size_t)in->n_devices + 1, sizeof *sim->device_free);
    out->ranks = calloc((size_t)sim->n_ranks, sizeof *out->ranks);
    out->coupling_link_bytes = calloc((size_t)in->coupling.n_links + 1, sizeof(double));
    if (!sim->ranks || !sim->arrival || !sim->link_free || !sim->coupling_free ||
        !sim->collectives || !sim->heap || !sim->device_free || !out->ranks ||
        !out->coupling_link_bytes)
        return pt_fail(PIPERT_ERR_NOMEM, "simulate: out of memory for %ld messages", messages);
    for (long i = 0; i < messages; i++) sim->arrival[i] = -1;
    for (int i = 0; i < in->stages * sim->collectives_per_stage; i++)
        sim->collectives[i].end = -1;
    for (int i = 0; i < sim->n_ranks; i++) {
        rank_state *r = &sim->ranks[i];
        r->replica = i / in->stages;
        r->stage = i % in->stages;
        r->step_end = calloc((size_t)in->steps, sizeof *r->step_end);
        if (!r->step_end) return pt_fail(PIPERT_ERR_NOMEM, "simulate: out of memory");
        PT_TRY(pt_schedule_build(&r->schedule, in->kind, in->stages, sim->microbatches_per_pass,
                                 r->stage));
        heap_push(sim, i);
    }
    return PIPERT_OK;
}

static void teardown(simulation *sim)
{
    for (int i = 0; sim->ranks && i < sim->n_ranks; i++) {
        pt_schedule_free(&sim->ranks[i].schedule);
        free(sim->ranks[i].step_end);
    }
    free(sim->ranks);
    free(sim->arrival);
    free(sim->link_free);
    free(sim->coupling_free);
    free(sim->collectives);
    free(sim->heap);
    free(sim->device_free);
}

/* The mean time between consecutive steps over the middle half of the run
 * (after the pipeline's warm-up, before ranks that finish early leave a
 * shared device to the others), for one rank: steps of ranks that take turns
 * on a device need not be evenly spaced, their rate is. */
static double steady_step(const rank_state *r, int steps)
{
    const int first = steps / 4 > 1 ? steps / 4 : 1;
    const int last = 3 * steps / 4 > first ? 3 * steps / 4 : steps - 1;
    return (r->step_end[last] - r->step_end[first - 1]) / (last - first + 1);
}

static pipert_result finish(simulation *sim)
{
    pt_sim_result *out = sim->out;
    for (int i = 0; i < sim->n_ranks; i++) {
        const rank_state *r = &sim->ranks[i];
        if (!r->done) {
            const pt_instruction *ins = &r->schedule.instructions[r->pc];
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "simulate: deadlock: replica %d stage %d waits at %s %d (step %d)",
                           r->replica, r->stage, pt_instruction_name(ins->kind), ins->microbatch,
                           r->steps_taken + 1);
        }
        out->makespan_s = fmax(out->makespan_s, r->clock);
        out->step_s = fmax(out->step_s, steady_step(r, sim->in->steps));
    }
    for (int i = 0; i < sim->n_ranks; i++) {
        out->ranks[i] = sim->ranks[i].result;
        const double elapsed = sim->ranks[i].clock;
        out->ranks[i].bubble = elapsed > 0 ? 1 - out->ranks[i].busy_s / elapsed : 0;
    }
    return PIPERT_OK;
}

pipert_result pt_simulate(const pt_sim_input *in, pt_sim_result *out)
{
    *out = (pt_sim_result){0};
    PT_TRY(check_input(in));
    simulation sim = {0};
    pipert_result rc = setup(&sim, in, out);
    while (rc == PIPERT_OK && sim.heap_size > 0) {
        rank_state *r = &sim.ranks[heap_pop(&sim)];
        if (!execute(&sim, r)) continue; /* waits: whoever ends the wait pushes it back */
        advance(&sim, r);
        if (!r->done) heap_push(&sim, rank_index(&sim, r->replica, r->stage));
    }
    if (rc == PIPERT_OK) rc = finish(&sim);
    teardown(&sim);
    if (rc != PIPERT_OK) pt_sim_result_free(out);
    return rc;
}

void pt_sim_result_free(pt_sim_result *result)
{
    free(result->ranks);
    free(result->coupling_link_bytes);
    *result = (pt_sim_result){0};
}
