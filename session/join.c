/* A replica coming back into a running elastic job (runtime/comm/membership.h,
 * "Joining"): the state that passes from a survivor to the joiner, and the
 * joiner's way in.
 *
 * The joiner (pipert worker --join: a new process for every rank of a replica
 * that left) registers with the coordinator, connects to its own replica's
 * stages, builds its stage, says it is ready, and waits (the survivors train on
 * meanwhile). The coordinator announces the join like a departure; the
 * survivors acknowledge, and the switch names a step T and a donor replica.
 * After its own step T, each survivor of a stage connects to the joiner of
 * its stage (session/elastic.c), and the donor's worker of that stage sends it
 * one message: its stage's state at T exactly as a checkpoint file would hold
 * it (parameters, optimizer moments and counters, the coupling's state, the
 * pipeline's in-flight stashes: one version, taken between two steps, while
 * the others wait at the switch), preceded by a small header (the epoch, T,
 * the file's size, every replica's site). The joiner restores it as --resume
 * restores a checkpoint of step T (the asynchronous pipeline replays its
 * in-flight forwards on the donor's stashes, with its own replica's data),
 * then forms the same new groups as everyone else, and trains from T + 1.
 *
 * A second membership change before the switch supersedes it: the donor
 * sends at a switch only if it switches there (and gives up a send the
 * joiner no longer waits for), and the joiner waits for the state of the
 * newest switch that lets its replica in (the tag carries the epoch). Each of
 * the joiner's ranks says which switch's state it took ("joined"), and none
 * trains until the coordinator says every rank of its replica took that
 * switch's ("in"): a rank whose switch was superseded after it took the state
 * (its replica's other stages got none) takes the next one's instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "pipeline/executor_state.h"
#include "runtime/clock.h"
#include "runtime/memory.h"
#include "session/session_internal.h"
#include "train/checkpoint.h"

#define STATE_MAGIC 0x4e494f4a54505450ll /* "PTPTJOIN" */
#define KIND_STATE_HEADER (PT_KIND_FIRST_FREE + 20)
#define KIND_STATE (PT_KIND_FIRST_FREE + 21)
/* Header fields before the sites: magic, epoch, step, bytes, replicas. */
#define HEADER_FIXED 5
#define WAIT_SLICE_S 0.1
/* How long a joiner waits for the survivors to connect and for its state. */
#define JOIN_TIMEOUT_S 300.0

/* The stage's parameters' checksum, which the logs of donor and joiner show. */
static unsigned long long params_checksum(pipert_session *s)
{
    unsigned long long checksum = 0;
    (void)pt_session_params_checksum(s, &checksum);
    return checksum;
}

/* ---- the donor's side ------------------------------------------------------------ */

/* This stage's state at this step boundary, as the bytes of a checkpoint file. */
static pipert_result serialize_state(pipert_session *s, void **bytes, size_t *size)
{
    pt_checkpoint_writer *w;
    PT_TRY(pt_checkpoint_writer_create(&w, pt_stage_executor_version(s->executor), s->job.stage,
                                       s->job.layout.stages, 0, pt_stage_executor_model(s->executor),
                                       pt_stage_executor_optimizer(s->executor), &s->config));
    pt_safetensors_writer *tensors = pt_checkpoint_writer_tensors(w);
    pipert_result rc = pt_coupling_save(s->coupling, tensors);
    if (rc == PIPERT_OK) rc = pt_stage_executor_save_state(s->executor, w);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_serialize(tensors, bytes, size);
    pt_checkpoint_writer_free(w);
    return rc;
}

/* Whether a newer membership change than `epoch` makes this wait pointless. */
static bool superseded(pipert_session *s, long epoch)
{
    pt_membership_news news;
    pt_job_membership(&s->job, &news);
    return news.epoch > epoch;
}

static void free_payload(pt_request *request, pipert_result result, void *payload)
{
    (void)request;
    (void)result;
    free(payload);
}

/* Sends `payload` (malloc'd; the send owns it) to the joiner `rank` as the state of switch
 * `epoch`. A newer change gives the send up: the joiner waits for the newer switch's state,
 * and the payload is freed once the transport is done with it. */
static pipert_result send_state_part(pipert_session *s, int rank, long epoch, uint16_t kind,
                                     pt_dtype dtype, void *payload, int64_t count)
{
    pt_message_header h = {.kind = kind, .dtype = (uint16_t)dtype, .ndim = 1, .shape = {count},
                           .nbytes = (uint64_t)count * pt_dtype_size(dtype),
                           .replica = s->job.replica, .stage = s->job.stage};
    pt_request *request;
    pipert_result rc = pt_send(s->job.transport, rank, (uint32_t)epoch, &h, payload,
                               PT_SEND_CHECKSUM, &request);
    if (rc != PIPERT_OK) {
        free(payload);
        return rc;
    }
    pt_request_on_complete(request, free_payload, payload);
    const double until = pt_now_s() + JOIN_TIMEOUT_S;
    while ((rc = pt_request_wait(request, WAIT_SLICE_S)) == PIPERT_ERR_TIMEOUT) {
        if (superseded(s, epoch))
            rc = pt_fail(PIPERT_ERR_PEER, "a newer membership change superseded switch %ld",
                         epoch);
        else if (pt_now_s() > until)
            rc = pt_fail(PIPERT_ERR_TIMEOUT, "rank %d took nothing of it for %.0f s", rank,
                         JOIN_TIMEOUT_S);
        else if (atomic_load(&s->stop_requested) || pt_job_aborted(&s->job))
            rc = pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while rank %d took it", rank);
        else continue;
        pt_request_abandon(request);
        return rc;
    }
    pt_request_free(request);
    return rc;
}

pipert_result pt_session_send_state(pipert_session *s, int rank, long epoch)
{
    const double started = pt_now_s();
    const int R = s->job.layout.replicas;
    void *bytes = NULL;
    size_t size = 0;
    int64_t *header = calloc((size_t)(HEADER_FIXED + R), sizeof *header);
    pipert_result rc = header ? serialize_state(s, &bytes, &size)
                              : pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    const double serialized = pt_now_s();
    if (rc == PIPERT_OK) {
        int64_t fixed[HEADER_FIXED] = {STATE_MAGIC, epoch, pt_stage_executor_version(s->executor),
                                       (int64_t)size, R};
        memcpy(header, fixed, sizeof fixed);
        for (int r = 0; r < R; r++) header[HEADER_FIXED + r] = s->job.replica_sites[r];
        rc = send_state_part(s, rank, epoch, KIND_STATE_HEADER, PT_DTYPE_I64, header,
                             HEADER_FIXED + R);
        header = NULL;
    }
    if (rc == PIPERT_OK) {
        rc = send_state_part(s, rank, epoch, KIND_STATE, PT_DTYPE_U8, bytes, (int64_t)size);
        bytes = NULL;
    }
    if (rc == PIPERT_OK)
        pt_info("gave rank %d (coming back) the state of stage %d after step %ld: %.1f MB in "
                "%.2f s (%.2f s to serialize), parameters' checksum %016llx",
                rank, s->job.stage, pt_stage_executor_version(s->executor), size / 1e6,
                pt_now_s() - started, serialized - started, params_checksum(s));
    else pt_error_prefix("giving rank %d its state", rank);
    free(bytes);
    free(header);
    return rc;
}

/* ---- the joiner's side ------------------------------------------------------------- */

typedef struct received_state {
    long epoch, step;
    int *sites;   /* [replicas] */
    void *bytes;  /* a checkpoint file of the donor's stage */
    size_t size;
} received_state;

static void received_state_free(received_state *st)
{
    free(st->sites);
    free(st->bytes);
    *st = (received_state){0};
}

/* Waits for a receive in slices; PIPERT_ERR_TIMEOUT when the epoch was superseded. */
static pipert_result wait_receive(pipert_session *s, pt_request *request, long epoch,
                                  const char *what)
{
    const double until = pt_now_s() + JOIN_TIMEOUT_S;
    for (;;) {
        pipert_result rc = pt_request_wait(request, WAIT_SLICE_S);
        if (rc != PIPERT_ERR_TIMEOUT) return rc;
        PT_TRY(pt_job_check(&s->job));
        if (atomic_load(&s->stop_requested))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting for %s", what);
        if (superseded(s, epoch)) return PIPERT_ERR_TIMEOUT;
        PT_TRY(pt_job_make_room(&s->job));
        if (pt_now_s() > until)
            return pt_fail(PIPERT_ERR_TIMEOUT, "no %s within %.0f s", what, JOIN_TIMEOUT_S);
    }
}

/* Receives into *buffer (malloc'd). A receive that fails or is given up may have matched a
 * message already, whose rest may never come (its sender left mid-message) or still be on its
 * way: then the request is abandoned rather than waited for, and frees the buffer when (if
 * ever) it ends; *buffer is then NULL. */
static pipert_result receive(pipert_session *s, int donor, long epoch, uint16_t kind, pt_dtype dtype,
                             void **buffer, size_t capacity, const char *what)
{
    const pt_recv_expect expect = {.kind = kind, .dtype = dtype, .ndim = -1, .require_checksum = 1};
    pt_request *request;
    PT_TRY(pt_recv(s->job.transport, donor, (uint32_t)epoch, &expect, *buffer, capacity, &request));
    const pipert_result rc = wait_receive(s, request, epoch, what);
    if (rc == PIPERT_OK) {
        pt_request_free(request);
        return rc;
    }
    pt_request_on_complete(request, free_payload, *buffer);
    *buffer = NULL;
    pt_request_abandon(request);
    return rc;
}

static pipert_result receive_state(pipert_session *s, int donor, long epoch, received_state *out)
{
    const int R = s->job.layout.replicas;
    int64_t *header = calloc((size_t)(HEADER_FIXED + R), sizeof *header);
    if (!header) return pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    pipert_result rc = receive(s, donor, epoch, KIND_STATE_HEADER, PT_DTYPE_I64, (void **)&header,
                               (HEADER_FIXED + R) * sizeof *header, "the state's header");
    if (rc == PIPERT_OK && (header[0] != STATE_MAGIC || header[1] != epoch || header[4] != R ||
                            header[3] <= 0 || header[2] < 0))
        rc = pt_fail(PIPERT_ERR_PEER, "rank %d sent a malformed state header (epoch %lld, %lld "
                                      "replicas, %lld bytes)",
                     donor, (long long)header[1], (long long)header[4], (long long)header[3]);
    if (rc == PIPERT_OK) {
        out->epoch = epoch;
        out->step = header[2];
        out->size = (size_t)header[3];
        out->sites = calloc((size_t)R, sizeof *out->sites);
        if (pt_alloc(&out->bytes, out->size, "join: the state received") != PIPERT_OK)
            out->bytes = NULL;
        if (!out->sites || !out->bytes) rc = pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
        for (int r = 0; rc == PIPERT_OK && r < R; r++) out->sites[r] = (int)header[HEADER_FIXED + r];
    }
    free(header);
    if (rc == PIPERT_OK)
        rc = receive(s, donor, epoch, KIND_STATE, PT_DTYPE_U8, &out->bytes, out->size, "the state");
    if (rc != PIPERT_OK) received_state_free(out);
    return rc;
}

/* The schedule fields of a checkpoint index that the donor's state stands for: this job's
 * schedule, split and look-ahead; the donor's instruction list (its pipeline metadata). */
static pipert_result describe_donor(pipert_session *s, const pt_safetensors *st,
                                    pt_checkpoint_index *index, int *bounds)
{
    pt_stage_executor_describe_schedule(s->executor, index);
    const char *text = pt_safetensors_metadata(st, "pipeline");
    json_t *state = text ? json_loads(text, 0, NULL) : NULL;
    json_int_t microbatches = 0, first = 0;
    const int bad = !state || json_unpack(state, "{s:I, s:I}", "microbatches", &microbatches,
                                          "first_microbatch", &first) != 0;
    json_decref(state);
    if (bad) return pt_fail(PIPERT_ERR_PEER, "%s: no pipeline state", pt_safetensors_path(st));
    index->microbatches = (long)microbatches;
    index->first_microbatch = (long)first;
    /* the same job: the same split on every stage */
    const int S = s->job.layout.stages;
    for (int stage = 0; stage < S; stage++) {
        index->parts[stage].first_layer = bounds[stage];
        index->parts[stage].last_layer = bounds[stage + 1];
    }
    return PIPERT_OK;
}

/* The donor's state restored as --resume restores a checkpoint of its step. */
static pipert_result restore_state(pipert_session *s, const pt_safetensors *st, long step)
{
    pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    pt_checkpoint_part part = {.stage = s->job.stage, .first_layer = slice->first,
                               .last_layer = slice->last};
    pt_checkpoint c = {.index = {.step = step, .stages = 1, .parts = &part},
                       .parts = (pt_safetensors **)&st};
    PT_TRY(pt_checkpoint_load_slice(&c, slice, pt_stage_executor_optimizer(s->executor)));
    PT_TRY(pt_coupling_load(s->coupling, st, pt_safetensors_path(st)));

    const int S = s->job.layout.stages;
    int *bounds = calloc((size_t)S + 1, sizeof *bounds);
    pt_checkpoint_index index = {.step = step, .stages = S};
    index.parts = calloc((size_t)S, sizeof *index.parts);
    pipert_result rc = bounds && index.parts ? PIPERT_OK
                                             : pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    /* not asked of the other stages: one of them may wait for a newer switch's state */
    if (rc == PIPERT_OK) rc = pt_session_planned_bounds(s, bounds);
    if (rc == PIPERT_OK) rc = describe_donor(s, st, &index, bounds);
    char why[256] = "";
    const pt_resume_kind kind = rc == PIPERT_OK ? pt_stage_executor_plan_resume(
                                                      s->executor, &index, bounds, why, sizeof why)
                                                : PT_RESUME_FLUSH;
    if (rc == PIPERT_OK && kind == PT_RESUME_RESTORE)
        rc = pt_stage_executor_restore(s->executor, st, step);
    else if (rc == PIPERT_OK) {
        if (kind == PT_RESUME_REFILL && s->job.stage == 0)
            pt_warn("this replica's pipeline starts empty at step %ld (%s)", step, why);
        rc = pt_stage_executor_resume_at(s->executor, step);
    }
    free(index.parts);
    free(bounds);
    return rc;
}

/* Whether the newest switch is `epoch` and lets this replica in. */
static bool lets_this_replica_in(pipert_session *s, long epoch)
{
    bool *joiners = calloc((size_t)s->job.world, sizeof *joiners);
    const bool in = joiners && pt_coord_client_switch_joiners(s->job.client, joiners) == epoch &&
                    joiners[s->job.replica];
    free(joiners);
    return in;
}

static void pause_briefly(void)
{
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

/* Waits for the switch that lets this replica in (the newest change, at or after its join). */
static pipert_result wait_for_switch(pipert_session *s, pt_membership_news *news)
{
    const double until = pt_now_s() + JOIN_TIMEOUT_S;
    for (;;) {
        PT_TRY(pt_job_check(&s->job));
        if (atomic_load(&s->stop_requested))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting to rejoin");
        pt_job_membership(&s->job, news);
        const long joined = pt_coord_client_join_epoch(s->job.client, s->job.replica);
        if (joined > 0 && news->switch_epoch >= joined && news->switch_epoch == news->epoch &&
            news->switch_donor >= 0 && lets_this_replica_in(s, news->switch_epoch))
            return PIPERT_OK;
        if (pt_now_s() > until)
            return pt_fail(PIPERT_ERR_TIMEOUT, "replica %d was not let back in within %.0f s",
                           s->job.replica, JOIN_TIMEOUT_S);
        /* replicas coming back meanwhile may dial this one at the switch */
        PT_TRY(pt_job_make_room(&s->job));
        pause_briefly();
    }
}

static pipert_result take_state(pipert_session *s, const received_state *state)
{
    pt_safetensors *st;
    char name[96];
    snprintf(name, sizeof name, "the state of stage %d after step %ld", s->job.stage, state->step);
    PT_TRY(pt_safetensors_open_memory(&st, name, state->bytes, state->size));
    pipert_result rc = pt_job_take_sites(&s->job, state->sites);
    if (rc == PIPERT_OK) rc = restore_state(s, st, state->step);
    pt_safetensors_close(st);
    return rc;
}

/* At the switch `news` announced: connects to the survivors, takes the donor's state, and
 * tells the coordinator so. */
static pipert_result take_switch(pipert_session *s, const pt_membership_news *news)
{
    PT_TRY(pt_job_await_replicas(&s->job, news->switch_epoch, JOIN_TIMEOUT_S));
    const int donor = pt_layout_rank(&s->job.layout, s->job.stage, news->switch_donor);
    received_state state = {0};
    const double waited = pt_now_s();
    PT_TRY(receive_state(s, donor, news->switch_epoch, &state));
    const double received = pt_now_s();
    const size_t size = state.size;
    pipert_result rc = take_state(s, &state);
    received_state_free(&state);
    PT_TRY(rc);
    pt_info("stage %d: received the state of switch %ld (%.1f MB) %.2f s after the survivors "
            "connected, restored it in %.2f s",
            s->job.stage, news->switch_epoch, size / 1e6, received - waited,
            pt_now_s() - received);
    return pt_job_joined(&s->job, news->switch_epoch);
}

/* After taking the state of switch `epoch`: PIPERT_OK once the coordinator says every rank of
 * this replica took it; PIPERT_ERR_TIMEOUT (no message) when a newer switch lets this replica
 * in again instead. */
static pipert_result wait_until_in(pipert_session *s, long epoch)
{
    const double until = pt_now_s() + JOIN_TIMEOUT_S;
    for (;;) {
        if (pt_job_replica_in(&s->job, epoch)) return PIPERT_OK;
        PT_TRY(pt_job_check(&s->job));
        if (atomic_load(&s->stop_requested))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting for this replica's "
                                                   "other stages to take their state");
        pt_membership_news news;
        pt_job_membership(&s->job, &news);
        if (news.switch_epoch > epoch && lets_this_replica_in(s, news.switch_epoch))
            return PIPERT_ERR_TIMEOUT;
        if (pt_now_s() > until)
            return pt_fail(PIPERT_ERR_TIMEOUT, "replica %d's other stages did not take the state "
                                               "of switch %ld within %.0f s",
                           s->job.replica, epoch, JOIN_TIMEOUT_S);
        PT_TRY(pt_job_make_room(&s->job));
        pause_briefly();
    }
}

pipert_result pt_session_join_running(pipert_session *s, long *step)
{
    const double started = pt_now_s(), started_us = pt_trace_clock_us(s->trace);
    PT_TRY(pt_job_ready_to_join(&s->job));
    pt_membership_news news;
    for (;;) {
        PT_TRY(wait_for_switch(s, &news));
        if (news.switch_step >= s->config.train.steps)
            return pt_fail(PIPERT_ERR_PEER, "the job ends at step %ld, before replica %d could "
                                            "rejoin (after step %ld)",
                           s->config.train.steps, s->job.replica, news.switch_step);
        s->elastic.taking_switch = news.switch_epoch;
        pipert_result rc = take_switch(s, &news);
        if (rc == PIPERT_OK) rc = wait_until_in(s, news.switch_epoch);
        s->elastic.taking_switch = 0;
        if (rc == PIPERT_OK) break;
        if (!superseded(s, news.switch_epoch) || atomic_load(&s->stop_requested) ||
            pt_job_aborted(&s->job))
            return rc;
        pt_info("a newer membership change superseded switch %ld (%s): replica %d waits for "
                "the next one", news.switch_epoch,
                rc == PIPERT_ERR_TIMEOUT ? "before this replica was in" : pipert_last_error(),
                s->job.replica);
    }
    *step = news.switch_step;
    s->elastic.acked_epoch = news.switch_epoch;
    PT_TRY(pt_session_switch_groups(s, &news));
    s->elastic.joined_at = news.switch_step;
    pt_trace_span(s->trace, "rejoining (waiting to be let in, taking the state)", started_us,
                  pt_trace_clock_us(s->trace), -1, -1, -1);
    pt_warn("replica %d is back in the job: stage %d took rank %d's state after step %ld in "
            "%.2f s, parameters' checksum %016llx",
            s->job.replica, s->job.stage,
            pt_layout_rank(&s->job.layout, s->job.stage, news.switch_donor), news.switch_step,
            pt_now_s() - started, params_checksum(s));
    return PIPERT_OK;
}
