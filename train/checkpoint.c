#include "train/checkpoint.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/memory.h"

#define CHECKPOINT_FORMAT "pipert-checkpoint-1"
#define CHECKPOINT_PREFIX "ckpt-"
#define CHECKPOINT_SUFFIX ".safetensors"

pt_gpt_config pt_gpt_config_from_settings(const pipert_config *cfg)
{
    const pt_model_settings *m = &cfg->model;
    return (pt_gpt_config){m->n_layer, m->n_embd, m->n_head, m->block_size, m->vocab_size,
                           m->tie_weights};
}

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

/* Reads tensors named prefix + model name into a host buffer laid out like
 * the parameters. */
static pipert_result read_slice_tensors(const pt_gpt_slice *slice, const pt_safetensors *st,
                                        const char *prefix, float *host)
{
    char name[PT_TENSOR_NAME_MAX + 32];
    for (int i = 0; i < slice->n_tensors; i++) {
        const pt_gpt_tensor *t = &slice->tensors[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const pt_tensor_entry *e = *prefix ? pt_safetensors_find(st, name)
                                           : find_model_tensor(st, name);
        if (!e && !*prefix && !strcmp(t->name, "lm_head.weight")) {
            /* A tied checkpoint (GPT-2 from Hugging Face): the head starts as wte. */
            e = find_model_tensor(st, "wte.weight");
            if (e) pt_info("%s: no lm_head.weight; the head starts as a copy of wte.weight",
                           pt_safetensors_path(st));
        }
        if (!e)
            return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: tensor %s is missing",
                           pt_safetensors_path(st), name);
        PT_TRY(check_shape(st, e, t));
        PT_TRY(pt_safetensors_read_f32(st, e, host + t->offset, t->numel));
    }
    return PIPERT_OK;
}

static pipert_result load_into(const pt_gpt_slice *slice, const pt_safetensors *st,
                               const char *prefix, float *device_dst)
{
    float *host;
    PT_TRY(pt_alloc((void **)&host, slice->n_params * sizeof(float), "checkpoint tensors"));
    pipert_result rc = read_slice_tensors(slice, st, prefix, host);
    if (rc == PIPERT_OK)
        slice->kernels->copy_to_device(device_dst, host, slice->n_params * sizeof(float));
    pt_free(host);
    return rc;
}

pipert_result pt_gpt_load_params(pt_gpt_slice *slice, const pt_safetensors *st)
{
    return load_into(slice, st, "", slice->params);
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

/* ---- checkpoints --------------------------------------------------------- */

static char *checkpoint_path(const char *dir, long step)
{
    size_t n = strlen(dir) + 64;
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/" CHECKPOINT_PREFIX "%08ld" CHECKPOINT_SUFFIX, dir, step);
    return path;
}

/* The step of a checkpoint file name, or −1 if it is not one. */
static long checkpoint_step(const char *file_name)
{
    long step;
    int consumed = 0;
    if (sscanf(file_name, CHECKPOINT_PREFIX "%8ld" CHECKPOINT_SUFFIX "%n", &step, &consumed) != 1 ||
        consumed == 0 || file_name[consumed] != '\0')
        return -1;
    return step;
}

static int compare_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* Steps of every checkpoint in dir, newest first; *count of them. */
static pipert_result list_checkpoints(const char *dir, long **steps, size_t *count)
{
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return PIPERT_OK;
    size_t capacity = 0;
    for (struct dirent *entry; (entry = readdir(d));) {
        long step = checkpoint_step(entry->d_name);
        if (step < 0) continue;
        if (*count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            long *grown = realloc(*steps, capacity * sizeof **steps);
            if (!grown) {
                closedir(d);
                return pt_fail(PIPERT_ERR_NOMEM, "%s: listing checkpoints: out of memory", dir);
            }
            *steps = grown;
        }
        (*steps)[(*count)++] = step;
    }
    closedir(d);
    if (*count > 1) qsort(*steps, *count, sizeof **steps, compare_desc);
    return PIPERT_OK;
}

pipert_result pt_checkpoint_find_latest(const char *dir, char **path, long *step)
{
    long *steps;
    size_t count;
    *path = NULL;
    PT_TRY(list_checkpoints(dir, &steps, &count));
    if (count == 0) {
        free(steps);
        return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: no checkpoint (" CHECKPOINT_PREFIX
                                             "*" CHECKPOINT_SUFFIX ") to resume from", dir);
    }
    *step = steps[0];
    *path = checkpoint_path(dir, steps[0]);
    free(steps);
    return *path ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
}

static void prune_checkpoints(const char *dir, int keep)
{
    long *steps;
    size_t count;
    if (keep <= 0 || list_checkpoints(dir, &steps, &count) != PIPERT_OK) return;
    for (size_t i = (size_t)keep; i < count; i++) {
        char *path = checkpoint_path(dir, steps[i]);
        if (path && unlink(path) == 0) pt_debug("removed old checkpoint %s", path);
        free(path);
    }
    free(steps);
}

static char *optimizer_state_json(const pt_optimizer *opt)
{
    char mu_product[40];
    snprintf(mu_product, sizeof mu_product, "%.17g", opt->mu_product);
    json_t *o = json_pack("{s:s, s:I, s:s}", "kind",
                          opt->settings.kind == PT_OPTIMIZER_NADAMW ? "nadamw" : "adamw", "t",
                          (json_int_t)opt->t, "mu_product", mu_product);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

static pipert_result set_metadata(pt_safetensors_writer *w, long step, const pt_gpt_slice *slice,
                                  const pt_optimizer *opt, const pipert_config *cfg)
{
    char number[32];
    char *config_json = pipert_config_to_json(cfg);
    char *optimizer_json = optimizer_state_json(opt);
    pipert_result rc = config_json && optimizer_json
                           ? PIPERT_OK
                           : pt_fail(PIPERT_ERR_NOMEM, "checkpoint metadata: out of memory");
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "format", CHECKPOINT_FORMAT);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "config", config_json);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "optimizer", optimizer_json);
    snprintf(number, sizeof number, "%ld", step);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "step", number);
    snprintf(number, sizeof number, "%ld", step + 1);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "data_position", number);
    snprintf(number, sizeof number, "%d", slice->first);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "first_layer", number);
    snprintf(number, sizeof number, "%d", slice->last);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_set_metadata(w, "last_layer", number);
    free(config_json);
    free(optimizer_json);
    return rc;
}

pipert_result pt_checkpoint_save(const char *dir, long step, const pt_gpt_slice *slice,
                                 const pt_optimizer *opt, const pipert_config *cfg, int keep)
{
    const size_t bytes = slice->n_params * sizeof(float);
    float *host[3] = {NULL, NULL, NULL}; /* params, m, v */
    pt_safetensors_writer *w = NULL;
    char *path = checkpoint_path(dir, step);
    pipert_result rc = path ? pt_safetensors_writer_create(&w)
                            : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    const float *sources[3] = {slice->params, opt->m, opt->v};
    const char *prefixes[3] = {"", "optimizer.m.", "optimizer.v."};
    for (int i = 0; i < 3 && rc == PIPERT_OK; i++) {
        rc = pt_alloc((void **)&host[i], bytes, "checkpoint staging buffer");
        if (rc != PIPERT_OK) break;
        slice->kernels->copy_to_host(host[i], sources[i], bytes);
        rc = pt_gpt_add_to_writer(w, slice, host[i], prefixes[i]);
    }
    if (rc == PIPERT_OK) rc = set_metadata(w, step, slice, opt, cfg);
    if (rc == PIPERT_OK) rc = pt_safetensors_writer_write(w, path);
    if (rc == PIPERT_OK) prune_checkpoints(dir, keep);
    pt_safetensors_writer_free(w);
    for (int i = 0; i < 3; i++) pt_free(host[i]);
    free(path);
    return rc;
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

static pipert_result read_optimizer_state(const pt_safetensors *st, pt_optimizer *opt)
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
    pt_optimizer_kind saved_kind;
    pipert_result rc = pt_optimizer_parse_kind(kind, &saved_kind);
    if (rc == PIPERT_OK && saved_kind != opt->settings.kind)
        rc = pt_fail(PIPERT_ERR_CONFIG, "%s: was written by optimizer %s, this run uses another",
                     path, kind);
    if (rc == PIPERT_OK) {
        opt->t = (long)t;
        opt->mu_product = strtod(mu_product, NULL);
    }
    json_decref(o);
    return rc;
}

static pipert_result read_step(const pt_safetensors *st, long *step)
{
    const char *text = pt_safetensors_metadata(st, "step");
    char *end;
    if (!text || (*step = strtol(text, &end, 10)) < 0 || *end)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: metadata \"step\" is missing or not a number",
                       pt_safetensors_path(st));
    return PIPERT_OK;
}

pipert_result pt_checkpoint_load(const char *path, pt_gpt_slice *slice, pt_optimizer *opt,
                                 long *step)
{
    pt_safetensors *st;
    PT_TRY(pt_safetensors_open(&st, path));
    const char *format = pt_safetensors_metadata(st, "format");
    pipert_result rc = format && !strcmp(format, CHECKPOINT_FORMAT)
                           ? PIPERT_OK
                           : pt_fail(PIPERT_ERR_FORMAT, "%s: not a pipert checkpoint (format %s)",
                                     path, format ? format : "missing");
    if (rc == PIPERT_OK) rc = check_same_model(st, slice);
    if (rc == PIPERT_OK) rc = read_step(st, step);
    if (rc == PIPERT_OK) rc = read_optimizer_state(st, opt);
    if (rc == PIPERT_OK) rc = load_into(slice, st, "", slice->params);
    if (rc == PIPERT_OK) rc = load_into(slice, st, "optimizer.m.", opt->m);
    if (rc == PIPERT_OK) rc = load_into(slice, st, "optimizer.v.", opt->v);
    pt_safetensors_close(st);
    return rc;
}
