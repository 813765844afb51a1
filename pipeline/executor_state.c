/* The stage executor in checkpoints (executor_state.h): the cut of an
 * asynchronous schedule after a stage's N-th step, what a stage saves there,
 * and the replay that continues from it. */
#include "pipeline/executor_state.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/executor_internal.h"
#include "runtime/log.h"

/* ---- cuts of a schedule ----------------------------------------------------- */

pipert_result pt_schedule_cut_at(const pt_schedule *s, long steps, pt_schedule_cut *out)
{
    memset(out, 0, sizeof *out);
    out->newest_forward = -1;
    int i = 0;
    for (long taken = 0; taken < steps; i++) {
        if (i == s->count)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "stage %d's schedule has %ld optimizer steps, "
                                                   "not %ld", s->stage, taken, steps);
        taken += s->instructions[i].kind == PT_OPTIMIZER_STEP;
    }
    out->cursor = i;
    /* state[m]: 0 not forwarded, 1 forwarded, 2 backwarded, at the cut */
    char *state = calloc((size_t)s->microbatches, 1);
    out->in_flight = calloc((size_t)s->microbatches + 1, sizeof *out->in_flight);
    if (!state || !out->in_flight) {
        free(state);
        pt_schedule_cut_free(out);
        return pt_fail(PIPERT_ERR_NOMEM, "schedule cut: out of memory");
    }
    for (int k = 0; k < out->cursor; k++) {
        const pt_instruction *in = &s->instructions[k];
        if (in->kind == PT_FORWARD) {
            state[in->microbatch] = 1;
            out->newest_forward = in->microbatch;
        } else if (in->kind == PT_BACKWARD) {
            state[in->microbatch] = 2;
        }
    }
    for (int m = 0; m < s->microbatches; m++)
        if (state[m] == 1) out->in_flight[out->n_in_flight++] = m;
    free(state);
    return PIPERT_OK;
}

void pt_schedule_cut_free(pt_schedule_cut *cut)
{
    free(cut->in_flight);
    memset(cut, 0, sizeof *cut);
}

static bool cut_holds(const pt_schedule_cut *cut, int microbatch)
{
    for (int i = 0; i < cut->n_in_flight; i++)
        if (cut->in_flight[i] == microbatch) return true;
    return false;
}

/* A stage's list and its cut. */
typedef struct cut_stage {
    pt_schedule schedule;
    pt_schedule_cut cut;
    int *at[PT_INSTRUCTION_KINDS]; /* at[kind][m]: index of (kind, m); count if absent */
} cut_stage;

static void cut_stage_free(cut_stage *c)
{
    for (int k = 0; k < PT_INSTRUCTION_KINDS; k++) free(c->at[k]);
    pt_schedule_cut_free(&c->cut);
    pt_schedule_free(&c->schedule);
}

static pipert_result cut_stage_build(cut_stage *c, const pt_schedule *like, int stage, long steps)
{
    memset(c, 0, sizeof *c);
    const int microbatches = like->microbatches;
    PT_TRY(pt_schedule_build_for_stage(&c->schedule, like, stage));
    PT_TRY(pt_schedule_cut_at(&c->schedule, steps, &c->cut));
    for (int k = 0; k < PT_INSTRUCTION_KINDS; k++) {
        c->at[k] = malloc((size_t)microbatches * sizeof *c->at[k]);
        if (!c->at[k]) return pt_fail(PIPERT_ERR_NOMEM, "schedule cut: out of memory");
        for (int m = 0; m < microbatches; m++) c->at[k][m] = c->schedule.count;
    }
    for (int i = 0; i < c->schedule.count; i++) {
        const pt_instruction *in = &c->schedule.instructions[i];
        if (in->microbatch >= 0) c->at[in->kind][in->microbatch] = i;
    }
    return PIPERT_OK;
}

static bool before_cut(const cut_stage *c, pt_instruction_kind kind, int microbatch)
{
    return c->at[kind][microbatch] < c->cut.cursor;
}

/* The boundary between `me` (stage s) and `next` (stage s+1) at their cuts. */
static pipert_result check_boundary(const cut_stage *me, const cut_stage *next, long steps)
{
    const int s = me->schedule.stage, M = me->schedule.microbatches;
    for (int m = 0; m < M; m++) {
        if (before_cut(next, PT_SEND_GRADIENT, m) != before_cut(me, PT_RECV_GRADIENT, m))
            return pt_fail(PIPERT_ERR_INTERNAL, "cut after step %ld: the gradient of microbatch %d "
                                                "from stage %d crosses it",
                           steps, m, s + 1);
        const bool sent = before_cut(me, PT_SEND_ACTIVATION, m);
        const bool received = before_cut(next, PT_RECV_ACTIVATION, m);
        if (!sent && received)
            return pt_fail(PIPERT_ERR_INTERNAL, "cut after step %ld: stage %d receives microbatch "
                                                "%d before its cut, stage %d sends it after",
                           steps, s + 1, m, s);
        if (sent && !received && !cut_holds(&me->cut, m))
            return pt_fail(PIPERT_ERR_INTERNAL, "cut after step %ld: the activation of microbatch "
                                                "%d crosses it, and stage %d no longer holds it",
                           steps, m, s);
    }
    return PIPERT_OK;
}

static pipert_result make_replay(const cut_stage *me, const cut_stage *prev, const cut_stage *next,
                                 long steps, pt_instruction **replay, int *count)
{
    const pt_schedule_cut *cut = &me->cut;
    *replay = NULL;
    *count = 0;
    if (cut->n_in_flight == 0) return PIPERT_OK;
    pt_instruction *list = calloc((size_t)cut->n_in_flight * 3, sizeof *list);
    if (!list) return pt_fail(PIPERT_ERR_NOMEM, "replay: out of memory");
    int n = 0;
    for (int i = 0; i < cut->n_in_flight; i++) {
        const int m = cut->in_flight[i];
        if (prev && !cut_holds(&prev->cut, m)) {
            free(list);
            return pt_fail(PIPERT_ERR_INTERNAL, "cut after step %ld: microbatch %d is in flight at "
                                                "stage %d but not at stage %d",
                           steps, m, me->schedule.stage, prev->schedule.stage);
        }
        list[n++] = (pt_instruction){prev ? PT_RECV_ACTIVATION : PT_LOAD_BATCH, m};
        list[n++] = (pt_instruction){PT_FORWARD, m};
        if (next && (cut_holds(&next->cut, m) || !before_cut(next, PT_RECV_ACTIVATION, m)))
            list[n++] = (pt_instruction){PT_SEND_ACTIVATION, m};
    }
    *replay = list;
    *count = n;
    return PIPERT_OK;
}

pipert_result pt_schedule_replay(const pt_schedule *mine, long steps, pt_instruction **replay,
                                 int *count, int *cursor)
{
    const int stage = mine->stage, stages = mine->stages;
    *replay = NULL;
    *count = 0;
    cut_stage c[3]; /* stage−1, stage, stage+1 */
    memset(c, 0, sizeof c);
    pipert_result rc = PIPERT_OK;
    for (int i = 0; i < 3 && rc == PIPERT_OK; i++) {
        const int s = stage - 1 + i;
        if (s >= 0 && s < stages) rc = cut_stage_build(&c[i], mine, s, steps);
    }
    const cut_stage *prev = stage > 0 ? &c[0] : NULL, *next = stage < stages - 1 ? &c[2] : NULL;
    if (rc == PIPERT_OK && next) rc = check_boundary(&c[1], next, steps);
    if (rc == PIPERT_OK) rc = make_replay(&c[1], prev, next, steps, replay, count);
    if (rc == PIPERT_OK) *cursor = c[1].cut.cursor;
    for (int i = 0; i < 3; i++) cut_stage_free(&c[i]);
    return rc;
}

/* ---- saving --------------------------------------------------------------------- */

static bool is_async(const pt_stage_executor *ex) { return pt_executor_is_async(ex); }

void pt_stage_executor_describe_schedule(const pt_stage_executor *ex, pt_checkpoint_index *index)
{
    snprintf(index->schedule, sizeof index->schedule, "%s", pt_schedule_kind_name(ex->schedule_kind));
    index->microbatches = ex->schedule.microbatches;
    index->first_microbatch = is_async(ex) ? ex->base : 0;
    snprintf(index->lookahead, sizeof index->lookahead, "%.*s", (int)sizeof index->lookahead - 1,
             is_async(ex) ? pt_lookahead_name(ex->config.pipeline.lookahead) : "n/a");
}

static void stash_prefix(long microbatch, char *prefix, size_t cap)
{
    snprintf(prefix, cap, "pipeline.stash.%ld.", microbatch);
}

/* The microbatches in flight at this step boundary (global ids), in the
 * "pipeline" metadata, and their stashes as tensors. */
static pipert_result save_in_flight(pt_stage_executor *ex, pt_checkpoint_writer *w, json_t *state)
{
    pt_schedule_cut cut;
    PT_TRY(pt_schedule_cut_at(&ex->schedule, ex->version - ex->base, &cut));
    pipert_result rc = PIPERT_OK;
    if (cut.cursor != ex->cursor)
        rc = pt_fail(PIPERT_ERR_INTERNAL, "stage %d: a checkpoint at instruction %d, not at the "
                                          "step boundary %d",
                     ex->options.stage, ex->cursor, cut.cursor);
    json_t *list = json_array();
    json_object_set_new(state, "in_flight", list);
    for (int i = 0; rc == PIPERT_OK && i < cut.n_in_flight; i++) {
        const long g = ex->base + cut.in_flight[i];
        const int slot = pt_executor_slot_of(ex, g);
        json_array_append_new(list, json_pack("[I, I]", (json_int_t)g,
                                              (json_int_t)ex->slot_version[slot]));
        if (!pt_executor_stashes_weights(ex)) continue;
        char prefix[64];
        stash_prefix(g, prefix, sizeof prefix);
        rc = pt_checkpoint_writer_add_slice_buffer(w, ex->slot_weights[slot], prefix);
    }
    pt_schedule_cut_free(&cut);
    return rc;
}

/* predict-damped: the measured update size its prediction is bounded by. */
static void save_update_size(const pt_stage_executor *ex, json_t *state)
{
    const pt_update_size *u = &ex->look.update_size;
    if (!u->before) return;
    json_t *squares = json_array();
    for (int i = 0; i < u->n_regions; i++) json_array_append_new(squares, json_real(u->mean_square[i]));
    json_object_set_new(state, "update_mean_square", squares);
    json_object_set_new(state, "update_measured", json_integer((json_int_t)u->measured));
}

/* The measured update size, when the file has it for as many tensors (older files: none, so
 * the bound starts again from the first step after the resume). */
static void restore_update_size(pt_stage_executor *ex, json_t *root)
{
    pt_update_size *u = &ex->look.update_size;
    json_t *squares = json_object_get(root, "update_mean_square");
    json_t *measured = json_object_get(root, "update_measured");
    if (!u->before || !json_is_array(squares) || (int)json_array_size(squares) != u->n_regions ||
        !json_is_integer(measured))
        return;
    for (int i = 0; i < u->n_regions; i++)
        u->mean_square[i] = json_number_value(json_array_get(squares, (size_t)i));
    u->measured = (long)json_integer_value(measured);
}

/* nesterov-secant: its previous pair and running means, as tensors, and how many pairs it saw. */
static const char *const secant_prefixes[] = {"pipeline.secant.prev_grad.",
                                              "pipeline.secant.prev_used.",
                                              "pipeline.secant.num.", "pipeline.secant.den."};

static float **secant_buffer(pt_secant *s, int i)
{
    float **buffers[] = {&s->prev_grad, &s->prev_used, &s->num, &s->den};
    return buffers[i];
}

static pipert_result save_secant(pt_stage_executor *ex, pt_checkpoint_writer *w, json_t *state)
{
    pt_secant *s = &ex->look.secant;
    if (!s->kernels) return PIPERT_OK;
    json_object_set_new(state, "secant_pairs", json_integer((json_int_t)s->pairs));
    for (int i = 0; i < 4; i++)
        PT_TRY(pt_checkpoint_writer_add_slice_buffer(w, *secant_buffer(s, i), secant_prefixes[i]));
    return PIPERT_OK;
}

/* A file without them (written before nesterov-secant kept state) starts the secant again:
 * its warm-up pairs after the resume are measured, not compensated. */
static pipert_result restore_secant(pt_stage_executor *ex, const pt_safetensors *st, json_t *root)
{
    pt_secant *s = &ex->look.secant;
    json_t *pairs = json_object_get(root, "secant_pairs");
    if (!s->kernels || !json_is_integer(pairs)) return PIPERT_OK;
    for (int i = 0; i < 4; i++)
        PT_TRY(pt_checkpoint_read_slice_buffer(st, ex->model, secant_prefixes[i],
                                               *secant_buffer(s, i)));
    s->pairs = (long)json_integer_value(pairs);
    return PIPERT_OK;
}

pipert_result pt_stage_executor_save_state(pt_stage_executor *ex, pt_checkpoint_writer *w)
{
    json_t *state = json_pack("{s:s, s:I, s:I, s:I, s:i, s:f}", "schedule",
                              pt_schedule_kind_name(ex->schedule_kind), "microbatches",
                              (json_int_t)ex->schedule.microbatches, "first_microbatch",
                              (json_int_t)(is_async(ex) ? ex->base : 0), "version",
                              (json_int_t)ex->version, "cursor", ex->cursor, "staleness_estimate",
                              ex->staleness_estimate);
    if (!state) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    save_update_size(ex, state);
    pipert_result rc = is_async(ex) ? save_in_flight(ex, w, state) : PIPERT_OK;
    if (rc == PIPERT_OK && is_async(ex)) rc = save_secant(ex, w, state);
    char *text = rc == PIPERT_OK ? json_dumps(state, JSON_COMPACT) : NULL;
    if (rc == PIPERT_OK && !text) rc = pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    if (rc == PIPERT_OK)
        rc = pt_safetensors_writer_set_metadata(pt_checkpoint_writer_tensors(w), "pipeline", text);
    free(text);
    json_decref(state);
    return rc;
}

/* ---- how to resume ----------------------------------------------------------------- */

pt_resume_kind pt_stage_executor_plan_resume(const pt_stage_executor *ex,
                                             const pt_checkpoint_index *index, const int *bounds,
                                             char *why, size_t cap)
{
    const int S = ex->options.stages;
    *why = '\0';
    if (!is_async(ex)) return PT_RESUME_FLUSH;
    pt_schedule_kind schedule;
    if (pt_schedule_parse_kind(index->schedule, &schedule) != PIPERT_OK ||
        schedule != PT_SCHEDULE_ASYNC_1F1B) {
        snprintf(why, cap, "the checkpoint is of schedule %s", index->schedule);
        return PT_RESUME_REFILL;
    }
    if (index->stages != S) {
        snprintf(why, cap, "the checkpoint has %d stages, this run %d", index->stages, S);
        return PT_RESUME_REFILL;
    }
    for (int s = 0; s < S; s++)
        if (index->parts[s].first_layer != bounds[s] || index->parts[s].last_layer != bounds[s + 1]) {
            snprintf(why, cap, "stage %d had blocks [%d, %d), now [%d, %d)", s,
                     index->parts[s].first_layer, index->parts[s].last_layer, bounds[s],
                     bounds[s + 1]);
            return PT_RESUME_REFILL;
        }
    const pt_lookahead_traits *ran = pt_lookahead_named(index->lookahead);
    if (ran != pt_lookahead_traits_of(ex->lookahead)) {
        if (!ran) pt_error_clear(); /* a name this build does not know: refilled all the same */
        snprintf(why, cap, "the checkpoint ran pipeline.lookahead=%s, this run %s", index->lookahead,
                 pt_lookahead_name(ex->lookahead));
        return PT_RESUME_REFILL;
    }
    if (!ran->stashes) {
        snprintf(why, cap, "pipeline.lookahead=none keeps no copy of the weights the in-flight "
                           "forwards used");
        return PT_RESUME_REFILL;
    }
    /* Both instruction lists must agree up to the cut: they do when they
     * are equally long, or when the cut is before either one's drain. */
    const long mine = ex->config.train.steps - index->first_microbatch;
    const long theirs = index->microbatches, done = index->step - index->first_microbatch;
    const long shorter = mine < theirs ? mine : theirs;
    if (done < 0 || mine < 1 || (mine != theirs && done + S - 1 > shorter)) {
        snprintf(why, cap, "train.steps differs and the checkpoint's step %ld lies in the pipeline's "
                           "drain", index->step);
        return PT_RESUME_REFILL;
    }
    return PT_RESUME_RESTORE;
}

/* ---- restoring ----------------------------------------------------------------------- */

typedef struct saved_state {
    long microbatches, first_microbatch, version;
    int cursor;
    double staleness_estimate;
    json_t *in_flight; /* [[microbatch, weight version], ...] (owned by root) */
    json_t *root;
} saved_state;

static pipert_result read_saved_state(const pt_safetensors *st, saved_state *out)
{
    const char *path = pt_safetensors_path(st);
    const char *text = pt_safetensors_metadata(st, "pipeline");
    memset(out, 0, sizeof *out);
    out->root = text ? json_loads(text, 0, NULL) : NULL;
    const char *schedule = NULL;
    json_int_t microbatches = 0, first = 0, version = 0;
    if (!out->root ||
        json_unpack(out->root, "{s:s, s:I, s:I, s:I, s:i, s:F, s:o}", "schedule", &schedule,
                    "microbatches", &microbatches, "first_microbatch", &first, "version", &version,
                    "cursor", &out->cursor, "staleness_estimate", &out->staleness_estimate,
                    "in_flight", &out->in_flight) != 0 ||
        !json_is_array(out->in_flight)) {
        json_decref(out->root);
        return pt_fail(PIPERT_ERR_FORMAT, "%s: metadata \"pipeline\" is missing or malformed", path);
    }
    out->microbatches = (long)microbatches;
    out->first_microbatch = (long)first;
    out->version = (long)version;
    return PIPERT_OK;
}

/* The in-flight microbatches of the file are the cut's, with their weights. */
static pipert_result restore_slots(pt_stage_executor *ex, const pt_safetensors *st,
                                   const saved_state *saved, const pt_schedule_cut *cut)
{
    const char *path = pt_safetensors_path(st);
    if ((int)json_array_size(saved->in_flight) != cut->n_in_flight)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %zu microbatches in flight, the schedule has %d at "
                                          "step %ld",
                       path, json_array_size(saved->in_flight), cut->n_in_flight, saved->version);
    for (int i = 0; i < cut->n_in_flight; i++) {
        json_int_t g = -1, version = -1;
        json_unpack(json_array_get(saved->in_flight, (size_t)i), "[I, I]", &g, &version);
        if (g != ex->base + cut->in_flight[i] || version < 0 || version > saved->version)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: in-flight entry %d is microbatch %lld of weight "
                                              "version %lld; the schedule has microbatch %ld",
                           path, i, (long long)g, (long long)version, ex->base + cut->in_flight[i]);
        const int slot = pt_executor_slot_of(ex, (long)g);
        ex->slot_version[slot] = (long)version;
        if (!pt_executor_stashes_weights(ex)) continue;
        char prefix[64];
        stash_prefix((long)g, prefix, sizeof prefix);
        PT_TRY(pt_checkpoint_read_slice_buffer(st, ex->model, prefix, ex->slot_weights[slot]));
    }
    return PIPERT_OK;
}

/* The forwards of the in-flight microbatches again, on their stashed
 * weights, exchanging activations with the neighbouring stages' replays. */
static pipert_result replay(pt_stage_executor *ex, const pt_instruction *list, int count)
{
    pipert_result rc = PIPERT_OK;
    ex->replaying = true;
    for (int i = 0; i < count && rc == PIPERT_OK; i++) rc = pt_executor_execute(ex, &list[i]);
    ex->replaying = false;
    pt_gpt_use_params(ex->model, NULL);
    return rc;
}

/* The instruction list of the run that wrote the checkpoint: the schedule
 * starts at microbatch `first` of the run. */
static pipert_result use_schedule_from(pt_stage_executor *ex, long first)
{
    const long microbatches = ex->config.train.steps - first;
    if (first == ex->base && microbatches == ex->schedule.microbatches) return PIPERT_OK;
    if (microbatches < 1 || microbatches > INT32_MAX / 8)
        return pt_fail(PIPERT_ERR_FORMAT, "the checkpoint's schedule starts at microbatch %ld of "
                                          "a run of %ld", first, ex->config.train.steps);
    pt_schedule_free(&ex->schedule);
    ex->base = first;
    return pt_executor_build_schedule(ex, &ex->schedule, ex->options.stage, first, (int)microbatches);
}

pipert_result pt_stage_executor_restore(pt_stage_executor *ex, const pt_safetensors *st,
                                        long version)
{
    if (!is_async(ex))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "stage %d: restoring in-flight state needs the "
                                               "asynchronous schedule", ex->options.stage);
    saved_state saved;
    PT_TRY(read_saved_state(st, &saved));
    pipert_result rc = PIPERT_OK;
    if (saved.version != version)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: the pipeline is at version %ld, the checkpoint's step "
                                        "is %ld",
                     pt_safetensors_path(st), saved.version, version);
    if (rc == PIPERT_OK) rc = use_schedule_from(ex, saved.first_microbatch);
    const long done = version - ex->base;
    pt_schedule_cut cut = {0};
    pt_instruction *list = NULL;
    int count = 0, cursor = 0;
    if (rc == PIPERT_OK) rc = pt_schedule_cut_at(&ex->schedule, done, &cut);
    if (rc == PIPERT_OK)
        rc = pt_schedule_replay(&ex->schedule, done, &list, &count, &cursor);
    if (rc == PIPERT_OK && saved.cursor != cursor)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: the pipeline is at instruction %d, the schedule's step "
                                        "%ld ends at %d",
                     pt_safetensors_path(st), saved.cursor, version, cursor);
    if (rc == PIPERT_OK) rc = restore_slots(ex, st, &saved, &cut);
    if (rc == PIPERT_OK) {
        ex->version = version;
        ex->cursor = cursor;
        ex->staleness_estimate = saved.staleness_estimate;
        restore_update_size(ex, saved.root);
        rc = restore_secant(ex, st, saved.root);
    }
    if (rc == PIPERT_OK) {
        ex->newest_slot = cut.newest_forward >= 0
                              ? pt_executor_slot_of(ex, ex->base + cut.newest_forward) : -1;
        rc = replay(ex, list, count);
    }
    if (rc == PIPERT_OK)
        pt_info("stage %d: continued the asynchronous schedule at step %ld, instruction %d, with "
                "%d microbatch%s in flight replayed",
                ex->options.stage, version, cursor, cut.n_in_flight,
                cut.n_in_flight == 1 ? "" : "es");
    free(list);
    pt_schedule_cut_free(&cut);
    json_decref(saved.root);
    return rc;
}
