/* dp.method=sparse in checkpoints (dp/sparse.c, "Checkpoints"): the EMA
 * buffer e, onebit's error feedback, the agreed parameters of a compressed
 * exchange, P, and every exchange in flight (completed first) as its step,
 * indices, w_old and ā, so a resumed run applies them at the same steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/sparse_internal.h"
#include "runtime/log.h"

pipert_result pt_sparse_save(void *state, pt_safetensors_writer *w)
{
    sparse_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    /* Exchanges in flight are completed (not applied): their ā goes into the file. */
    for (int k = 0; k < s->length; k++) {
        pipert_result rc = pt_sparse_arrive(s, pt_sparse_queue_at(s, k), true);
        if (rc != PIPERT_OK) {
            s->failed = true;
            pt_error_prefix("dp sparse: saving a checkpoint");
            return rc;
        }
    }
    free(s->saved_state);
    s->saved_state = calloc((size_t)(STATE_HEADER + s->length), sizeof *s->saved_state);
    if (!s->saved_state) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    int64_t *v = s->saved_state;
    v[0] = STATE_VERSION;
    v[1] = s->P;
    v[2] = s->length;
    v[3] = s->length ? pt_sparse_queue_at(s, s->length - 1)->step : 0;
    for (int k = 0; k < s->length; k++) v[STATE_HEADER + k] = pt_sparse_queue_at(s, k)->step;
    int64_t shape[1] = {STATE_HEADER + s->length};
    PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.state", PT_DTYPE_I64, v, 1, shape));
    shape[0] = (int64_t)s->n_params;
    if (s->ema) PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.ema", PT_DTYPE_F32, s->ema, 1, shape));
    if (s->agreed)
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.agreed", PT_DTYPE_F32, s->agreed, 1, shape));
    if (s->worker_error) {
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.worker_error", PT_DTYPE_F32,
                                         s->worker_error, 1, shape));
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.server_error", PT_DTYPE_F32,
                                         s->server_error, 1, shape));
    }
    for (int k = 0; k < s->length; k++) {
        const sparse_exchange *x = pt_sparse_queue_at(s, k);
        char name[64];
        shape[0] = (int64_t)x->count;
        snprintf(name, sizeof name, "dp.sparse.pending.%d.index", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_U32, x->index, 1, shape));
        snprintf(name, sizeof name, "dp.sparse.pending.%d.w_old", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, x->w_old, 1, shape));
        snprintf(name, sizeof name, "dp.sparse.pending.%d.average", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, x->values, 1, shape));
    }
    return PIPERT_OK;
}

/* A tensor of the checkpoint: present, of `dtype`, one dimension. */
static pipert_result find_vector(const pt_safetensors *st, const char *path, const char *name,
                                 pt_dtype dtype, const pt_tensor_entry **out)
{
    const pt_tensor_entry *t = pt_safetensors_find(st, name);
    if (!t) return pt_fail(PIPERT_ERR_FORMAT, "%s: no tensor %s (dp.method=sparse state)", path, name);
    if (t->dtype != dtype || t->ndim != 1)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s is %s with %d dimensions, not a %s vector", path,
                       name, pt_dtype_name(t->dtype), t->ndim, pt_dtype_name(dtype));
    *out = t;
    return PIPERT_OK;
}

static pipert_result load_exchange(sparse_state *s, const pt_safetensors *st, const char *path,
                                   int k, long step)
{
    char name[64];
    const pt_tensor_entry *index = NULL, *w_old = NULL, *average = NULL;
    snprintf(name, sizeof name, "dp.sparse.pending.%d.index", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_U32, &index));
    snprintf(name, sizeof name, "dp.sparse.pending.%d.w_old", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &w_old));
    snprintf(name, sizeof name, "dp.sparse.pending.%d.average", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &average));
    if (w_old->numel != index->numel || average->numel != index->numel)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: the exchange %d of dp.sparse.pending has parts of "
                                          "%zu, %zu and %zu elements",
                       path, k, index->numel, w_old->numel, average->numel);
    sparse_exchange *x = pt_sparse_queue_at(s, s->length);
    PT_TRY(pt_sparse_reserve(x, index->numel, s->R));
    x->step = step;
    x->count = index->numel;
    memcpy(x->index, pt_safetensors_data(st, index), index->nbytes);
    memcpy(x->w_old, pt_safetensors_data(st, w_old), w_old->nbytes);
    memcpy(x->values, pt_safetensors_data(st, average), average->nbytes);
    if (s->ready && x->count > s->max_count)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: the exchange of step %ld holds %zu elements, more "
                                          "than a partition of this stage (%zu)",
                       path, step, x->count, s->max_count);
    for (size_t i = 0; s->ready && i < x->count; i++)
        if (x->index[i] >= s->n_params)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: the exchange of step %ld indexes element %u "
                                              "of a stage of %zu parameters",
                           path, step, x->index[i], s->n_params);
    x->descriptor_mean = x->values_mean = (in_flight){0};
    x->arrived = true; /* checked before it was saved */
    s->length++;
    return PIPERT_OK;
}

/* *buffer ← the F32 vector `name` (replacing what it held); *n its length,
 * checked against the stage now if it is known, else at the first call. */
static pipert_result load_floats(const sparse_state *s, const pt_safetensors *st, const char *path,
                                 const char *name, float **buffer, size_t *n)
{
    const pt_tensor_entry *t = NULL;
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &t));
    if (s->ready && t->numel != s->n_params)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s holds %zu values, the stage %zu parameters",
                       path, name, t->numel, s->n_params);
    float *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (!copy) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for %s", name);
    memcpy(copy, pt_safetensors_data(st, t), t->nbytes);
    free(*buffer);
    *buffer = copy;
    *n = t->numel;
    return PIPERT_OK;
}

pipert_result pt_sparse_load(void *state, const pt_safetensors *st, const char *path)
{
    sparse_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    const char *method = pt_safetensors_metadata(st, "dp_method");
    const pt_tensor_entry *state_entry = pt_safetensors_find(st, "dp.sparse.state");
    if (!state_entry) {
        if (method && !strcmp(method, "sparse"))
            return pt_fail(PIPERT_ERR_FORMAT, "%s: written by dp.method=sparse but holds no "
                                              "dp.sparse.state", path);
        pt_info("%s was written by dp.method=%s: dp.method=sparse starts with an empty EMA and "
                "nothing in flight", path, method ? method : "(none)");
        return PIPERT_OK;
    }
    PT_TRY(find_vector(st, path, "dp.sparse.state", PT_DTYPE_I64, &state_entry));
    if (state_entry->numel < STATE_HEADER)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.state has %zu values", path,
                       state_entry->numel);
    int64_t *v = malloc(state_entry->nbytes);
    if (!v) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    memcpy(v, pt_safetensors_data(st, state_entry), state_entry->nbytes);
    pipert_result rc = PIPERT_OK;
    if (v[0] != STATE_VERSION)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.state version %lld (this build reads %d)",
                     path, (long long)v[0], STATE_VERSION);
    else if (v[1] != s->P)
        rc = pt_fail(PIPERT_ERR_CONFIG,
                     "%s: written with %lld partitions per tensor, but dp.fraction=%g gives %ld: "
                     "resume with the dp.fraction of that run",
                     path, (long long)v[1], s->config->dp.fraction, s->P);
    else if (v[2] < 0 || v[2] > s->capacity || state_entry->numel != (size_t)(STATE_HEADER + v[2]))
        rc = pt_fail(PIPERT_ERR_CONFIG,
                     "%s: %lld exchanges in flight, more than dp.delay=%ld keeps (at most %d)",
                     path, (long long)v[2], s->delay, s->capacity);
    for (int k = 0; rc == PIPERT_OK && k < (int)v[2]; k++)
        rc = load_exchange(s, st, path, k, (long)v[STATE_HEADER + k]);
    free(v);
    PT_TRY(rc);
    size_t n;
    if (s->rule == PT_RULE_EMA && pt_safetensors_find(st, "dp.sparse.ema")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.ema", &s->ema, &n));
        s->loaded_ema = n;
    }
    if (s->codec.kind != PT_CODEC_NONE && pt_safetensors_find(st, "dp.sparse.agreed")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.agreed", &s->agreed, &n));
        s->loaded_agreed = n;
    }
    if (s->codec.kind == PT_CODEC_ONEBIT && pt_safetensors_find(st, "dp.sparse.worker_error")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.worker_error", &s->worker_error, &n));
        PT_TRY(load_floats(s, st, path, "dp.sparse.server_error", &s->server_error,
                           &s->loaded_feedback));
        if (n != s->loaded_feedback)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.worker_error holds %zu values, "
                                              "dp.sparse.server_error %zu", path, n,
                           s->loaded_feedback);
    }
    return PIPERT_OK;
}
