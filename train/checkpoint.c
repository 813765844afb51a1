/* Checkpoint stage files: a slice's parameters and optimizer state by global
 * tensor name, written by one stage (or one replica of it) and read back by
 * any slice of any split (the index and the directory's bookkeeping are in
 * checkpoint_index.c). */
#include "train/checkpoint.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/log.h"
#include "runtime/memory.h"

/* ---- tensors ------------------------------------------------------------- */

pipert_result pt_gpt_add_to_writer(pt_safetensors_writer *w, const pt_gpt_slice *slice,
                                   const float *host_buffer, const char *prefix)
{
    char name[PT_TENSOR_NAME_MAX + 32];
    for (int i = 0; i < slice->n_tensors; i++) {
        const pt_gpt_tensor *t = &slice->tensors[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, host_buffer + t->offset, t->ndim,
                                         t->shape));
    }
    return PIPERT_OK;
}

/* The entry for a global name, also under the "transformer." prefix that
 * GPT2LMHeadModel files use. */
static const pt_tensor_entry *find_model_tensor(const pt_safetensors *st, const char *name)
{
    const pt_tensor_entry *e = pt_safetensors_find(st, name);
    if (e) return e;
    char prefixed[PT_TENSOR_NAME_MAX + 64];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return pt_safetensors_find(st, prefixed);
}

static pipert_result check_shape(const pt_safetensors *st, const pt_tensor_entry *e,
                                 const pt_gpt_tensor *t)
{
    bool same = e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
    if (same) return PIPERT_OK;
    char want[48], got[96];
    int n = 0;
    for (int d = 0; d < e->ndim && n < (int)sizeof got - 24; d++)
        n += snprintf(got + n, sizeof got - (size_t)n, "%s%" PRId64, d ? ", " : "", e->shape[d]);
    got[n] = '\0';
    if (t->ndim == 2) snprintf(want, sizeof want, "%" PRId64 ", %" PRId64, t->shape[0], t->shape[1]);
    else snprintf(want, sizeof want, "%" PRId64, t->shape[0]);
    return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor %s has shape [%s], the model needs [%s]",
                   pt_safetensors_path(st), e->name, got, want);
}

/* Where the tensors of a slice come from: one model file (Hugging Face names
 * and a tied head understood), or the stage files of a checkpoint (exact
 * names, whichever file holds each). */
typedef struct tensor_sources {
    const pt_safetensors *const *files;
    int count;
    bool model_file; /* one file from anywhere: "transformer." names, a tied head */
    const char *what; /* the checkpoint, for errors */
} tensor_sources;

static const pt_tensor_entry *find_in_sources(const tensor_sources *from, const char *name,
                                              const pt_safetensors **file)
{
    for (int i = 0; i < from->count; i++) {
        const pt_tensor_entry *e = from->model_file ? find_model_tensor(from->files[i], name)
                                                    : pt_safetensors_find(from->files[i], name);
        if (e) {
            *file = from->files[i];
            return e;
        }
    }
    return NULL;
}

/* The entry (and its file) that holds the slice's tensor t under prefix, shape checked. */
static pipert_result find_slice_tensor(const tensor_sources *from, const char *prefix,
                                       const pt_gpt_tensor *t, const pt_tensor_entry **entry,
                                       const pt_safetensors **file, bool *tied)
{
    char name[PT_TENSOR_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    const pt_tensor_entry *e = find_in_sources(from, name, file);
    *tied = !e && from->model_file && !strcmp(t->name, "lm_head.weight");
    /* A tied checkpoint (GPT-2 from Hugging Face): the head starts as wte. */
    if (*tied) e = find_in_sources(from, "wte.weight", file);
    if (!e) return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: tensor %s is missing", from->what, name);
    PT_TRY(check_shape(*file, e, t));
    *entry = e;
    return PIPERT_OK;
}

/* Reads the tensors named prefix + model name into a buffer laid out like the parameters. Every
 * tensor is found and checked before any is read: a refused file leaves the buffer as it was. */
static pipert_result read_slice_tensors(const pt_gpt_slice *slice, const tensor_sources *from,
                                        const char *prefix, float *host)
{
    const pt_tensor_entry *e;
    const pt_safetensors *file = NULL;
    bool tied;
    for (int i = 0; i < slice->n_tensors; i++)
        PT_TRY(find_slice_tensor(from, prefix, &slice->tensors[i], &e, &file, &tied));
    for (int i = 0; i < slice->n_tensors; i++) {
        const pt_gpt_tensor *t = &slice->tensors[i];
        PT_TRY(find_slice_tensor(from, prefix, t, &e, &file, &tied));
        if (tied)
            pt_info("%s: no lm_head.weight; the head starts as a copy of wte.weight",
                    pt_safetensors_path(file));
        PT_TRY(pt_safetensors_read_f32(file, e, host + t->offset, t->numel));
    }
    return PIPERT_OK;
}

static pipert_result load_into(const pt_gpt_slice *slice, const tensor_sources *from,
                               const char *prefix, float *device_dst)
{
    /* straight into the buffer where the host can write it: no staging copy in fresh memory */
    if (slice->kernels->host_accessible) return read_slice_tensors(slice, from, prefix, device_dst);
    float *host;
    PT_TRY(pt_alloc((void **)&host, slice->n_params * sizeof(float), "checkpoint tensors"));
    pipert_result rc = read_slice_tensors(slice, from, prefix, host);
    if (rc == PIPERT_OK)
        slice->kernels->copy_to_device(device_dst, host, slice->n_params * sizeof(float));
    pt_free(host);
    return rc;
}

pipert_result pt_gpt_load_params(pt_gpt_slice *slice, const pt_safetensors *st)
{
    tensor_sources from = {&st, 1, true, pt_safetensors_path(st)};
    return load_into(slice, &from, "", slice->params);
}

pipert_result pt_checkpoint_read_slice_buffer(const pt_safetensors *st, const pt_gpt_slice *slice,
                                              const char *prefix, float *device_dst)
{
    tensor_sources from = {&st, 1, false, pt_safetensors_path(st)};
    return load_into(slice, &from, prefix, device_dst);
}

/* ---- configuration from a file ------------------------------------------- */

static pipert_result infer_model_settings(const pt_safetensors *st, pt_model_settings *m)
{
    const char *path = pt_safetensors_path(st);
    const pt_tensor_entry *wte = find_model_tensor(st, "wte.weight");
    const pt_tensor_entry *wpe = find_model_tensor(st, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: no \"config\" metadata, and no 2-D wte.weight and wpe.weight to infer "
                       "the model from",
                       path);
    int layers = 0;
    char name[PT_TENSOR_NAME_MAX];
    for (;; layers++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", layers);
        if (!find_model_tensor(st, name)) break;
    }
    m->n_layer = layers;
    m->vocab_size = (int)wte->shape[0];
    m->n_embd = (int)wte->shape[1];
    m->block_size = (int)wpe->shape[0];
    m->tie_weights = find_model_tensor(st, "lm_head.weight") == NULL;
    /* Every GPT-2 size has heads of 64 channels; otherwise leave n_head
     * unknown (0) for the caller to demand. */
    m->n_head = m->n_embd % 64 == 0 ? m->n_embd / 64 : 0;
    pt_info("%s: model inferred from tensor shapes: n_layer=%d n_embd=%d n_head=%d (head size 64; "
            "override with --model.n_head) block_size=%d vocab_size=%d%s",
            path, m->n_layer, m->n_embd, m->n_head, m->block_size, m->vocab_size,
            m->tie_weights ? " tied head" : "");
    return PIPERT_OK;
}

pipert_result pt_model_settings_from_file(const pt_safetensors *st, pipert_config *cfg)
{
    const char *config_text = pt_safetensors_metadata(st, "config");
    if (!config_text) return infer_model_settings(st, &cfg->model);
    char source[1100];
    snprintf(source, sizeof source, "%s metadata \"config\"", pt_safetensors_path(st));
    return pt_config_merge_json(cfg, config_text, source);
}

/* ---- writing a stage's file -------------------------------------------------- */

/* A buffer laid out like the slice's parameters that a writer's tensors point into: a host
 * copy it owns, or the buffer itself. */
typedef struct held_buffer {
    const float *data;
    float *copy; /* owned, or NULL */
} held_buffer;

struct pt_checkpoint_writer {
    pt_safetensors_writer *tensors;
    long step;
    int stage, replica;
    const pt_gpt_slice *slice;
    bool in_place; /* slice buffers referenced where the host can read them, not copied */
    held_buffer *held; /* the slice buffers the writer's tensors point into */
    int n_held, held_capacity;
    size_t copied; /* bytes of the copies */
};

static char *optimizer_state_json(const pt_optimizer *opt)
{
    char mu_product[40];
    snprintf(mu_product, sizeof mu_product, "%.17g", opt->mu_product);
    json_t *o = json_pack("{s:s, s:I, s:s}", "kind", pt_optimizer_kind_name(opt->settings.kind),
                          "t", (json_int_t)opt->t, "mu_product", mu_product);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static pipert_result set_number(pt_safetensors_writer *w, const char *key, long value)
{
    char number[32];
    snprintf(number, sizeof number, "%ld", value);
    return pt_safetensors_writer_set_metadata(w, key, number);
}

static pipert_result set_metadata(pt_checkpoint_writer *w, int stages, const pt_optimizer *opt,
                                  const pipert_config *cfg)
{
    char *config_json = pipert_config_to_json(cfg);
    char *optimizer_json = optimizer_state_json(opt);
    pipert_result rc = config_json && optimizer_json
                           ? PIPERT_OK
                           : pt_fail(PIPERT_ERR_NOMEM, "checkpoint metadata: out of memory");
    pt_safetensors_writer *t = w->tensors;
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(t, "format", PT_CHECKPOINT_FORMAT);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(t, "config", config_json);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(t, "optimizer", optimizer_json);
    if (rc == PIPERT_OK) rc = set_number(t, "step", w->step);
    if (rc == PIPERT_OK) rc = set_number(t, "stage", w->stage);
    if (rc == PIPERT_OK) rc = set_number(t, "stages", stages);
    if (rc == PIPERT_OK) rc = set_number(t, "replica", w->replica);
    if (rc == PIPERT_OK) rc = set_number(t, "first_layer", w->slice->first);
    if (rc == PIPERT_OK) rc = set_number(t, "last_layer", w->slice->last);
    free(config_json);
    free(optimizer_json);
    return rc;
}

pipert_result pt_checkpoint_writer_add_slice_buffer(pt_checkpoint_writer *w,
                                                    const float *device_buffer, const char *prefix)
{
    if (w->n_held == w->held_capacity) {
        int capacity = w->held_capacity ? 2 * w->held_capacity : 4;
        held_buffer *grown = realloc(w->held, (size_t)capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
        w->held = grown;
        w->held_capacity = capacity;
    }
    held_buffer h = {.data = device_buffer};
    if (!w->in_place || !w->slice->kernels->host_accessible) {
        const size_t bytes = w->slice->n_params * sizeof(float);
        PT_TRY(pt_alloc((void **)&h.copy, bytes, "checkpoint staging buffer"));
        w->slice->kernels->copy_to_host(h.copy, device_buffer, bytes);
        h.data = h.copy;
        w->copied += bytes;
    }
    w->held[w->n_held++] = h;
    return pt_gpt_add_to_writer(w->tensors, w->slice, h.data, prefix);
}

static pipert_result create_writer(pt_checkpoint_writer **out, long step, int stage, int stages,
                                   int replica, const pt_gpt_slice *slice, const pt_optimizer *opt,
                                   const pipert_config *cfg, bool in_place)
{
    *out = NULL;
    pt_checkpoint_writer *w = calloc(1, sizeof *w);
    if (!w) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    *w = (pt_checkpoint_writer){.step = step, .stage = stage, .replica = replica, .slice = slice,
                                .in_place = in_place};
    pipert_result rc = pt_safetensors_writer_create(&w->tensors);
    if (rc == PIPERT_OK) rc = pt_checkpoint_writer_add_slice_buffer(w, slice->params, "");
    if (rc == PIPERT_OK) rc = pt_checkpoint_writer_add_slice_buffer(w, opt->m, "optimizer.m.");
    if (rc == PIPERT_OK) rc = pt_checkpoint_writer_add_slice_buffer(w, opt->v, "optimizer.v.");
    if (rc == PIPERT_OK) rc = set_metadata(w, stages, opt, cfg);
    if (rc != PIPERT_OK) {
        pt_checkpoint_writer_free(w);
        return rc;
    }
    *out = w;
    return PIPERT_OK;
}

pipert_result pt_checkpoint_writer_create(pt_checkpoint_writer **out, long step, int stage,
                                          int stages, int replica, const pt_gpt_slice *slice,
                                          const pt_optimizer *opt, const pipert_config *cfg)
{
    return create_writer(out, step, stage, stages, replica, slice, opt, cfg, false);
}

pipert_result pt_checkpoint_writer_create_in_place(pt_checkpoint_writer **out, long step,
                                                   int stage, int stages,
                                                   const pt_gpt_slice *slice,
                                                   const pt_optimizer *opt,
                                                   const pipert_config *cfg)
{
    return create_writer(out, step, stage, stages, 0, slice, opt, cfg, true);
}

static bool within(const void *p, const float *buffer, size_t count)
{
    const char *at = p, *first = (const char *)buffer;
    return buffer && at >= first && at < first + count * sizeof *buffer;
}

bool pt_checkpoint_writer_holds(const pt_checkpoint_writer *w, const void *data)
{
    for (int i = 0; i < w->n_held; i++)
        if (within(data, w->held[i].data, w->slice->n_params)) return true;
    return false;
}

size_t pt_checkpoint_writer_copied_bytes(const pt_checkpoint_writer *w) { return w->copied; }

pt_safetensors_writer *pt_checkpoint_writer_tensors(pt_checkpoint_writer *w) { return w->tensors; }

/* A random, non-zero id for one write of a file. */
static uint64_t new_write_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
        id = ((uint64_t)time(NULL) << 32) ^ (uint64_t)getpid() ^ (uint64_t)clock();
    return id ? id : 1;
}

pipert_result pt_checkpoint_writer_write(pt_checkpoint_writer *w, const char *dir, uint64_t *bytes,
                                         uint64_t *write_id)
{
    char name[PT_CHECKPOINT_NAME_MAX], id_text[PT_WRITE_ID_CHARS + 1];
    pt_checkpoint_part_name(w->step, w->stage, w->replica, name);
    *write_id = new_write_id();
    pt_checkpoint_format_write_id(*write_id, id_text);
    PT_TRY(pt_safetensors_writer_set_metadata(w->tensors, "write_id", id_text));
    size_t n = strlen(dir) + sizeof name + 2;
    char *path = malloc(n);
    if (!path) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    snprintf(path, n, "%s/%s", dir, name);
    pipert_result rc = pt_safetensors_writer_write(w->tensors, path);
    struct stat st;
    if (rc == PIPERT_OK && stat(path, &st) != 0)
        rc = pt_fail(PIPERT_ERR_IO, "%s: written, then gone", path);
    if (rc == PIPERT_OK) *bytes = (uint64_t)st.st_size;
    free(path);
    return rc;
}

void pt_checkpoint_writer_free(pt_checkpoint_writer *w)
{
    if (!w) return;
    pt_safetensors_writer_free(w->tensors);
    for (int i = 0; i < w->n_held; i++) pt_free(w->held[i].copy);
    free(w->held);
    free(w);
}

/* ---- reading a checkpoint ------------------------------------------------------ */

pipert_result pt_checkpoint_open(pt_checkpoint *c, const char *dir, pt_checkpoint_index *index,
                                 int replica)
{
    c->index = *index;
    c->replica = replica;
    memset(index, 0, sizeof *index);
    if (!pt_checkpoint_index_part(&c->index, 0, replica))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: the checkpoint of step %ld has no files of "
                                               "replica %d",
                       dir, c->index.step, replica);
    c->parts = calloc((size_t)c->index.stages, sizeof *c->parts);
    if (!c->parts) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    for (int s = 0; s < c->index.stages; s++) {
        const pt_checkpoint_part *part = pt_checkpoint_index_part(&c->index, s, replica);
        char path[PT_CONFIG_STRING_MAX + PT_CHECKPOINT_NAME_MAX + 2];
        snprintf(path, sizeof path, "%s/%s", dir, part->file);
        PT_TRY(pt_safetensors_open(&c->parts[s], path));
        PT_TRY(pt_checkpoint_check_part(c->parts[s], &c->index, part));
    }
    return PIPERT_OK;
}

void pt_checkpoint_close(pt_checkpoint *c)
{
    for (int s = 0; c->parts && s < c->index.stages; s++) pt_safetensors_close(c->parts[s]);
    free(c->parts);
    c->parts = NULL;
    pt_checkpoint_index_free(&c->index);
}

/* The checkpoint's model must be the one being trained: compares the model
 * sections of the two configurations key by key. */
static pipert_result check_same_model(const pt_safetensors *st, const pt_gpt_slice *slice)
{
    pipert_config saved;
    pt_config_defaults(&saved);
    PT_TRY(pt_model_settings_from_file(st, &saved));
    pt_gpt_config c = pt_gpt_config_from_settings(&saved);
    const pt_gpt_config *m = &slice->config;
    const char *differs = c.n_layer != m->n_layer       ? "model.n_layer"
                          : c.n_embd != m->n_embd       ? "model.n_embd"
                          : c.n_head != m->n_head       ? "model.n_head"
                          : c.block_size != m->block_size ? "model.block_size"
                          : c.vocab_size != m->vocab_size ? "model.vocab_size"
                          : c.tie_weights != m->tie_weights ? "model.tie_weights"
                                                            : NULL;
    if (differs)
        return pt_fail(PIPERT_ERR_CONFIG, "%s: was written for a different model (%s differs)",
                       pt_safetensors_path(st), differs);
    return PIPERT_OK;
}

typedef struct optimizer_state {
    pt_optimizer_kind kind;
    long t;
    double mu_product;
} optimizer_state;

static pipert_result read_optimizer_state(const pt_safetensors *st, optimizer_state *out)
{
    const char *path = pt_safetensors_path(st);
    const char *text = pt_safetensors_metadata(st, "optimizer");
    json_t *o = text ? json_loads(text, 0, NULL) : NULL;
    const char *kind = NULL, *mu_product = NULL;
    json_int_t t = 0;
    if (!o || json_unpack(o, "{s:s, s:I, s:s}", "kind", &kind, "t", &t, "mu_product",
                          &mu_product) != 0) {
        json_decref(o);
        return pt_fail(PIPERT_ERR_FORMAT, "%s: metadata \"optimizer\" is missing or malformed", path);
    }
    pipert_result rc = pt_optimizer_parse_kind(kind, &out->kind);
    if (rc != PIPERT_OK) pt_error_prefix("%s: metadata \"optimizer\"", path);
    out->t = (long)t;
    out->mu_product = strtod(mu_product, NULL);
    json_decref(o);
    return rc;
}

/* t and Π of the files the slice's tensors come from: every stage of a
 * checkpoint has taken the same number of steps. */
static pipert_result restore_optimizer_counters(const pt_checkpoint *c, pt_optimizer *opt)
{
    optimizer_state first = {0};
    for (int s = 0; s < c->index.stages; s++) {
        optimizer_state state;
        PT_TRY(read_optimizer_state(c->parts[s], &state));
        if (state.kind != opt->settings.kind)
            return pt_fail(PIPERT_ERR_CONFIG, "%s: was written by optimizer %s; this run uses %s",
                           pt_safetensors_path(c->parts[s]), pt_optimizer_kind_name(state.kind),
                           pt_optimizer_kind_name(opt->settings.kind));
        if (s == 0) first = state;
        else if (state.t != first.t)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: the optimizer took %ld steps, in %s %ld",
                           pt_safetensors_path(c->parts[s]), state.t,
                           pt_safetensors_path(c->parts[0]), first.t);
    }
    opt->t = first.t;
    opt->mu_product = first.mu_product;
    return PIPERT_OK;
}

pipert_result pt_checkpoint_load_slice(const pt_checkpoint *c, pt_gpt_slice *slice,
                                       pt_optimizer *opt)
{
    /* Errors name the directory: the parts' paths are DIR/NAME. */
    const char *first = pt_safetensors_path(c->parts[0]), *slash = strrchr(first, '/');
    char what[PT_CONFIG_STRING_MAX + 96], replica[32] = "";
    if (c->replica > 0) snprintf(replica, sizeof replica, "-replica-%d", c->replica);
    snprintf(what, sizeof what, "%.*s/ckpt-%08ld-stage-*%s.safetensors",
             slash ? (int)(slash - first) : 1, slash ? first : ".", c->index.step, replica);
    tensor_sources from = {(const pt_safetensors *const *)c->parts, c->index.stages, false, what};
    for (int s = 0; s < c->index.stages; s++) PT_TRY(check_same_model(c->parts[s], slice));
    PT_TRY(restore_optimizer_counters(c, opt));
    PT_TRY(load_into(slice, &from, "", slice->params));
    PT_TRY(load_into(slice, &from, "optimizer.m.", opt->m));
    return load_into(slice, &from, "optimizer.v.", opt->v);
}

const pt_safetensors *pt_checkpoint_same_slice(const pt_checkpoint *c, const pt_gpt_slice *slice,
                                               int stage, int stages)
{
    if (c->index.stages != stages || stage < 0 || stage >= stages) return NULL;
    const pt_checkpoint_part *part = &c->index.parts[stage];
    return part->first_layer == slice->first && part->last_layer == slice->last ? c->parts[stage]
                                                                                : NULL;
}
