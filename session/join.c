/* A replica coming back into a running elastic job (comm/membership.h,
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
 * its stage's state at T exactly as a checkpoint file would hold it
 * (parameters, optimizer moments and counters, the coupling's state, the
 * pipeline's in-flight stashes: one version, taken between two steps, while
 * the others wait at the switch): a small header (the epoch, T, the file's
 * size, every replica's site, the pieces' sizes), then the file's pieces, a
 * message each, from where they live. The joiner receives the pieces in
 * order into memory it prepared before it said it was ready, restores the
 * file as --resume restores a checkpoint of step T (the asynchronous pipeline
 * replays its in-flight forwards on the donor's stashes, with its own
 * replica's data), then forms the same new groups as everyone else, and
 * trains from T + 1. Neither side touches fresh memory while the survivors
 * wait: that was most of a rejoin's stall (BENCHMARKS.md "Rejoining").
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
/* Header fields before the sites and the pieces' sizes: magic, epoch, step, bytes, replicas,
 * pieces. */
#define HEADER_FIXED 6
/* A state of more pieces than this is refused (GPT-2 XL's 48 blocks make ~1,800). */
#define MAX_PIECES 65536
#define WAIT_SLICE_S 0.1
/* How long a joiner waits for the survivors to connect and for its state. */
#define JOIN_TIMEOUT_S 300.0
/* How long a joiner whose switch failed waits for the coordinator to say why (a newer change):
 * a coordinator started again notices a silent fellow joiner only after its roll call (twice
 * the heartbeat timeout) and the timeout itself. */
#define JOINER_NOTICE_S 40.0

/* The stage's parameters' checksum, which the logs of donor and joiner show. */
static unsigned long long params_checksum(pipert_session *s)
{
    unsigned long long checksum = 0;
    (void)pt_session_params_checksum(s, &checksum);
    return checksum;
}

/* ---- the donor's side ------------------------------------------------------------ */

/* This stage's state at this step boundary, as a checkpoint file would hold it, with the
 * parameters and optimizer moments referenced in place where the host can read them. */
static pipert_result state_writer(pipert_session *s, pt_checkpoint_writer **out)
{
    pt_checkpoint_writer *w;
    PT_TRY(pt_checkpoint_writer_create_in_place(&w, pt_stage_executor_version(s->executor),
                                                s->job.stage, s->job.layout.stages,
                                                pt_stage_executor_model(s->executor),
                                                pt_stage_executor_optimizer(s->executor),
                                                &s->config));
    pipert_result rc = pt_coupling_save(s->coupling, pt_checkpoint_writer_tensors(w));
    if (rc == PIPERT_OK) rc = pt_stage_executor_save_state(s->executor, w);
    if (rc != PIPERT_OK) {
        pt_checkpoint_writer_free(w);
        return rc;
    }
    *out = w;
    return PIPERT_OK;
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

/* What a donor sends a joiner: a header (magic, epoch, step, bytes, replicas, pieces, every
 * replica's site, every piece's size), then its stage's state as the pieces of a checkpoint
 * file, a message each. The parameters and optimizer moments go straight from the live
 * buffers (training waits until they are sent); what the writer does not hold (a coupling's
 * tensors, which may be freed or moved once training goes on) is copied first. The sends own
 * it with the donor: it is freed when the last of them lets go, even after the donor gave the
 * sends up (a newer switch) and trained on. */
typedef struct outgoing_state {
    atomic_int holders;
    pt_checkpoint_writer *writer;
    pt_safetensors_pieces pieces;
    void *copies; /* the pieces the writer does not hold */
    size_t copied;
    int64_t *header;
    int64_t header_count;
} outgoing_state;

static void outgoing_release(outgoing_state *o)
{
    if (atomic_fetch_sub(&o->holders, 1) != 1) return;
    pt_safetensors_pieces_free(&o->pieces);
    pt_checkpoint_writer_free(o->writer);
    free(o->copies);
    free(o->header);
    free(o);
}

static void release_when_sent(pt_request *request, pipert_result result, void *o)
{
    (void)request;
    (void)result;
    outgoing_release(o);
}

/* Copies the pieces the writer does not hold into one buffer of the state's own. */
static pipert_result copy_unheld_pieces(outgoing_state *o)
{
    pt_safetensors_piece *piece = o->pieces.piece;
    for (size_t i = 1; i < o->pieces.count; i++)
        if (!pt_checkpoint_writer_holds(o->writer, piece[i].data)) o->copied += piece[i].nbytes;
    if (!o->copied) return PIPERT_OK;
    PT_TRY(pt_alloc(&o->copies, o->copied, "join: the state's copied pieces"));
    unsigned char *at = o->copies;
    for (size_t i = 1; i < o->pieces.count; i++) {
        if (pt_checkpoint_writer_holds(o->writer, piece[i].data)) continue;
        memcpy(at, piece[i].data, piece[i].nbytes);
        piece[i].data = at;
        at += piece[i].nbytes;
    }
    return PIPERT_OK;
}

static pipert_result fill_header(pipert_session *s, long epoch, outgoing_state *o)
{
    const int R = s->job.layout.replicas;
    o->header_count = HEADER_FIXED + R + (int64_t)o->pieces.count;
    if (o->pieces.count > MAX_PIECES)
        return pt_fail(PIPERT_ERR_INTERNAL, "join: a state of %zu pieces (at most %d)",
                       o->pieces.count, MAX_PIECES);
    o->header = calloc((size_t)o->header_count, sizeof *o->header);
    if (!o->header) return pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    const int64_t fixed[HEADER_FIXED] = {STATE_MAGIC, epoch,
                                         pt_stage_executor_version(s->executor),
                                         (int64_t)o->pieces.total, R,
                                         (int64_t)o->pieces.count};
    memcpy(o->header, fixed, sizeof fixed);
    for (int r = 0; r < R; r++) o->header[HEADER_FIXED + r] = s->job.replica_sites[r];
    for (size_t i = 0; i < o->pieces.count; i++)
        o->header[HEADER_FIXED + R + (int64_t)i] = (int64_t)o->pieces.piece[i].nbytes;
    return PIPERT_OK;
}

static pipert_result outgoing_state_create(pipert_session *s, long epoch, outgoing_state **out)
{
    outgoing_state *o = calloc(1, sizeof *o);
    if (!o) return pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    atomic_init(&o->holders, 1);
    pipert_result rc = state_writer(s, &o->writer);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_pieces(pt_checkpoint_writer_tensors(o->writer),
                                                           &o->pieces);
    if (rc == PIPERT_OK) rc = copy_unheld_pieces(o);
    if (rc == PIPERT_OK) rc = fill_header(s, epoch, o);
    if (rc != PIPERT_OK) {
        outgoing_release(o);
        return rc;
    }
    *out = o;
    return PIPERT_OK;
}

/* Posts one message of the state to the joiner `rank`; the send holds the state until it ends. */
static pipert_result post_part(pipert_session *s, int rank, long epoch, uint16_t kind,
                               pt_dtype dtype, const void *payload, int64_t count,
                               outgoing_state *o, pt_request **request)
{
    pt_message_header h = {.kind = kind, .dtype = (uint16_t)dtype, .ndim = 1, .shape = {count},
                           .nbytes = (uint64_t)count * pt_dtype_size(dtype),
                           .replica = s->job.replica, .stage = s->job.stage};
    PT_TRY(pt_send(s->job.transport, rank, (uint32_t)epoch, &h, payload, PT_SEND_CHECKSUM,
                   request));
    atomic_fetch_add(&o->holders, 1);
    pt_request_on_complete(*request, release_when_sent, o);
    return PIPERT_OK;
}

/* Waits for one send of switch `epoch`'s state; a newer change gives it up (the joiner waits
 * for the newer switch's state), and so do a stop and the joiner's silence. */
static pipert_result await_sent(pipert_session *s, pt_request *request, int rank, long epoch,
                                double until)
{
    pipert_result rc;
    while ((rc = pt_request_wait(request, WAIT_SLICE_S)) == PIPERT_ERR_TIMEOUT) {
        if (superseded(s, epoch))
            return pt_fail(PIPERT_ERR_PEER, "a newer membership change superseded switch %ld",
                           epoch);
        if (pt_now_s() > until)
            return pt_fail(PIPERT_ERR_TIMEOUT, "rank %d took nothing of it for %.0f s", rank,
                           JOIN_TIMEOUT_S);
        if (atomic_load(&s->stop_requested) || pt_job_aborted(&s->job))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while rank %d took it", rank);
    }
    return rc;
}

/* Posts the header and every piece, then waits for them in order; what is still pending when
 * one fails is given up. */
static pipert_result send_outgoing(pipert_session *s, int rank, long epoch, outgoing_state *o)
{
    const size_t n = o->pieces.count + 1;
    pt_request **requests = calloc(n, sizeof *requests);
    if (!requests) return pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    size_t posted = 0;
    pipert_result rc = post_part(s, rank, epoch, KIND_STATE_HEADER, PT_DTYPE_I64, o->header,
                                 o->header_count, o, &requests[0]);
    if (rc == PIPERT_OK) posted = 1;
    while (rc == PIPERT_OK && posted < n) {
        const pt_safetensors_piece *piece = &o->pieces.piece[posted - 1];
        rc = post_part(s, rank, epoch, KIND_STATE, PT_DTYPE_U8, piece->data,
                       (int64_t)piece->nbytes, o, &requests[posted]);
        if (rc == PIPERT_OK) posted++;
    }
    const double until = pt_now_s() + JOIN_TIMEOUT_S;
    for (size_t i = 0; i < posted; i++) {
        if (rc == PIPERT_OK) rc = await_sent(s, requests[i], rank, epoch, until);
        if (rc == PIPERT_OK) pt_request_free(requests[i]);
        else pt_request_abandon(requests[i]);
    }
    free(requests);
    return rc;
}

pipert_result pt_session_send_state(pipert_session *s, int rank, long epoch)
{
    const double started = pt_now_s();
    outgoing_state *o = NULL;
    pipert_result rc = outgoing_state_create(s, epoch, &o);
    const double prepared = pt_now_s();
    if (rc == PIPERT_OK) rc = send_outgoing(s, rank, epoch, o);
    if (rc == PIPERT_OK)
        pt_info("gave rank %d (coming back) the state of stage %d after step %ld: %.1f MB in "
                "%.2f s (%.2f s to prepare it, %.1f MB of it copied, the rest sent in place), "
                "parameters' checksum %016llx",
                rank, s->job.stage, pt_stage_executor_version(s->executor),
                o->pieces.total / 1e6, pt_now_s() - started, prepared - started,
                (o->copied + pt_checkpoint_writer_copied_bytes(o->writer)) / 1e6,
                params_checksum(s));
    else pt_error_prefix("giving rank %d its state", rank);
    if (o) outgoing_release(o);
    return rc;
}

/* ---- the joiner's side ------------------------------------------------------------- */

/* Memory a joiner prepares for its state while it waits for the switch, so that the survivors,
 * who wait at the switch until the state is taken, do not wait for fresh pages: the size of
 * this stage's own state, and room for a coupling's copies of the parameters (sparse's EMA,
 * DiLoCo's outer parameters and momentum), which a joiner's coupling has not made yet.
 * Allocated and touched (pt_alloc zeroes it). A bigger state gets fresh memory. */
typedef struct prepared_memory {
    unsigned char *bytes;
    size_t capacity;
} prepared_memory;

#define COUPLING_COPIES 2

static void prepare_memory(pipert_session *s, prepared_memory *p)
{
    if (p->bytes) return;
    const double started = pt_now_s();
    pt_checkpoint_writer *w = NULL;
    pt_safetensors_pieces pieces = {0};
    pipert_result rc = state_writer(s, &w);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_pieces(pt_checkpoint_writer_tensors(w), &pieces);
    const size_t coupling = COUPLING_COPIES * pt_stage_executor_model(s->executor)->n_params *
                            sizeof(float);
    const size_t capacity = pieces.total + coupling + (1 << 20);
    pt_safetensors_pieces_free(&pieces);
    pt_checkpoint_writer_free(w);
    if (rc == PIPERT_OK) rc = pt_alloc((void **)&p->bytes, capacity, "join: memory for the state");
    if (rc != PIPERT_OK) {
        pt_warn("stage %d: no memory prepared for the state (%s); it is received into fresh "
                "memory", s->job.stage, pipert_last_error());
        return;
    }
    p->capacity = capacity;
    pt_info("stage %d: prepared %.1f MB for the state in %.2f s", s->job.stage, capacity / 1e6,
            pt_now_s() - started);
}

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

/* Receives into `into` (capacity bytes, inside the malloc'd *owner); *received is the payload's
 * size. A receive that fails or is given up may have matched a message already, whose rest may
 * never come (its sender left mid-message) or still be on its way: then the request is
 * abandoned rather than waited for, and frees *owner when (if ever) it ends; *owner is then
 * NULL. */
static pipert_result receive(pipert_session *s, int donor, long epoch, uint16_t kind, pt_dtype dtype,
                             void *into, size_t capacity, void **owner, size_t *received,
                             const char *what)
{
    const pt_recv_expect expect = {.kind = kind, .dtype = dtype, .ndim = -1, .require_checksum = 1};
    pt_request *request;
    PT_TRY(pt_recv(s->job.transport, donor, (uint32_t)epoch, &expect, into, capacity, &request));
    const pipert_result rc = wait_receive(s, request, epoch, what);
    if (rc == PIPERT_OK) {
        *received = (size_t)pt_request_header(request)->nbytes;
        pt_request_free(request);
        return rc;
    }
    pt_request_on_complete(request, free_payload, *owner);
    *owner = NULL;
    pt_request_abandon(request);
    return rc;
}

/* The state's header: its fields checked against this job and switch, and against each other. */
static pipert_result check_state_header(const int64_t *header, int donor, long epoch, int R)
{
    const int64_t pieces = header[5];
    if (header[0] != STATE_MAGIC || header[1] != epoch || header[4] != R || header[3] <= 0 ||
        header[2] < 0 || pieces < 1 || pieces > MAX_PIECES)
        return pt_fail(PIPERT_ERR_PEER, "rank %d sent a malformed state header (epoch %lld, %lld "
                                        "replicas, %lld bytes, %lld pieces)",
                       donor, (long long)header[1], (long long)header[4], (long long)header[3],
                       (long long)pieces);
    int64_t total = 0;
    for (int64_t i = 0; i < pieces; i++) {
        const int64_t size = header[HEADER_FIXED + R + i];
        if (size <= 0 || size > header[3] - total)
            return pt_fail(PIPERT_ERR_PEER, "rank %d sent a state header whose piece %lld of "
                                            "%lld bytes does not fit its %lld bytes",
                           donor, (long long)i, (long long)size, (long long)header[3]);
        total += size;
    }
    if (total != header[3])
        return pt_fail(PIPERT_ERR_PEER, "rank %d sent a state header whose pieces add up to %lld "
                                        "bytes, not %lld", donor, (long long)total,
                       (long long)header[3]);
    return PIPERT_OK;
}

/* The memory the state goes into: the prepared memory when it is large enough. */
static pipert_result state_memory(pipert_session *s, prepared_memory *prepared, received_state *out)
{
    if (prepared->bytes && out->size <= prepared->capacity) {
        out->bytes = prepared->bytes;
        *prepared = (prepared_memory){0};
        return PIPERT_OK;
    }
    pt_info("stage %d: the state (%.1f MB) is larger than the memory prepared for it (%.1f MB)",
            s->job.stage, out->size / 1e6, prepared->capacity / 1e6);
    return pt_alloc(&out->bytes, out->size, "join: the state received");
}

/* Receives every piece of the state in order, each into its place in out->bytes. */
static pipert_result receive_pieces(pipert_session *s, int donor, long epoch,
                                    const int64_t *sizes, int64_t pieces, received_state *out)
{
    size_t at = 0, received = 0;
    for (int64_t i = 0; i < pieces; i++) {
        const size_t size = (size_t)sizes[i];
        PT_TRY(receive(s, donor, epoch, KIND_STATE, PT_DTYPE_U8, (unsigned char *)out->bytes + at,
                       size, &out->bytes, &received, "the state"));
        if (received != size)
            return pt_fail(PIPERT_ERR_PEER, "rank %d sent %zu bytes as piece %lld of the state, "
                                            "whose header said %zu", donor, received,
                           (long long)i, size);
        at += size;
    }
    return PIPERT_OK;
}

static pipert_result receive_state(pipert_session *s, int donor, long epoch,
                                   prepared_memory *prepared, received_state *out)
{
    const int R = s->job.layout.replicas;
    const size_t capacity = (size_t)(HEADER_FIXED + R + MAX_PIECES) * sizeof(int64_t);
    int64_t *header = calloc(1, capacity);
    if (!header) return pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
    size_t received = 0;
    pipert_result rc = receive(s, donor, epoch, KIND_STATE_HEADER, PT_DTYPE_I64, header, capacity,
                               (void **)&header, &received, "the state's header");
    const size_t count = received / sizeof *header;
    if (rc == PIPERT_OK && (count < HEADER_FIXED + (size_t)R ||
                            header[5] != (int64_t)(count - HEADER_FIXED - (size_t)R)))
        rc = pt_fail(PIPERT_ERR_PEER, "rank %d sent a state header of %zu numbers", donor, count);
    if (rc == PIPERT_OK) rc = check_state_header(header, donor, epoch, R);
    if (rc == PIPERT_OK) {
        out->epoch = epoch;
        out->step = header[2];
        out->size = (size_t)header[3];
        out->sites = calloc((size_t)R, sizeof *out->sites);
        rc = out->sites ? state_memory(s, prepared, out)
                        : pt_fail(PIPERT_ERR_NOMEM, "join: out of memory");
        for (int r = 0; rc == PIPERT_OK && r < R; r++) out->sites[r] = (int)header[HEADER_FIXED + r];
    }
    if (rc == PIPERT_OK)
        rc = receive_pieces(s, donor, epoch, header + HEADER_FIXED + R, header[5], out);
    free(header);
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
static pipert_result take_switch(pipert_session *s, const pt_membership_news *news,
                                 prepared_memory *prepared)
{
    PT_TRY(pt_job_await_replicas(&s->job, news->switch_epoch, JOIN_TIMEOUT_S));
    const int donor = pt_layout_rank(&s->job.layout, s->job.stage, news->switch_donor);
    received_state state = {0};
    const double waited = pt_now_s();
    PT_TRY(receive_state(s, donor, news->switch_epoch, prepared, &state));
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

pipert_result pt_session_take_running_state(pipert_session *s, pt_membership_news *news)
{
    /* before the survivors hear of the join: they wait at the switch for nothing of this */
    prepared_memory prepared = {0};
    prepare_memory(s, &prepared);
    pipert_result rc = pt_job_ready_to_join(&s->job);
    while (rc == PIPERT_OK) {
        prepare_memory(s, &prepared); /* again after a superseded switch took it */
        if ((rc = wait_for_switch(s, news)) != PIPERT_OK) break;
        if (news->switch_step >= s->config.train.steps) {
            rc = pt_fail(PIPERT_ERR_PEER, "the job ends at step %ld, before replica %d could "
                                          "rejoin (after step %ld)",
                         s->config.train.steps, s->job.replica, news->switch_step);
            break;
        }
        s->elastic.taking_switch = news->switch_epoch;
        rc = take_switch(s, news, &prepared);
        if (rc == PIPERT_OK) rc = wait_until_in(s, news->switch_epoch);
        s->elastic.taking_switch = 0;
        if (rc == PIPERT_OK || atomic_load(&s->stop_requested) || pt_job_aborted(&s->job))
            break;
        /* A donor whose switch was superseded gives its sends up and trains on, so a piece
         * read meanwhile from its live buffers fails its checksum: the newer change that
         * explains the failure may reach this replica a moment later. A fellow joiner cut
         * off is announced later still when the coordinator was just started again (its roll
         * call, then the heartbeat timeout): the churn bed saw a joiner give up first. */
        if (!pt_session_departures_within(s, news->switch_epoch, JOINER_NOTICE_S)) break;
        pt_info("a newer membership change superseded switch %ld (%s): replica %d waits for "
                "the next one", news->switch_epoch,
                rc == PIPERT_ERR_TIMEOUT ? "before this replica was in" : pipert_last_error(),
                s->job.replica);
        rc = PIPERT_OK;
    }
    free(prepared.bytes);
    return rc;
}
