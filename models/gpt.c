#include "models/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt_matmul.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/rng.h"

/* ---- the parameter layout ------------------------------------------------ */

typedef enum init_kind { INIT_NORMAL, INIT_RESIDUAL_PROJECTION, INIT_ZEROS, INIT_ONES } init_kind;

/* One tensor of a block: its name suffix, its shape in units of C (dim1 = 0
 * for a vector), where its pointer lives in pt_gpt_block_params, how it is
 * initialised. The order is the order in memory. */
typedef struct block_tensor_spec {
    const char *suffix;
    int dim0_c, dim1_c;
    size_t field;
    init_kind init;
} block_tensor_spec;

#define BLOCK_FIELD(f) offsetof(pt_gpt_block_params, f)
static const block_tensor_spec block_tensors[] = {
    {"ln_1.weight", 1, 0, BLOCK_FIELD(ln_1_weight), INIT_ONES},
    {"ln_1.bias", 1, 0, BLOCK_FIELD(ln_1_bias), INIT_ZEROS},
    {"attn.c_attn.weight", 1, 3, BLOCK_FIELD(c_attn_weight), INIT_NORMAL},
    {"attn.c_attn.bias", 3, 0, BLOCK_FIELD(c_attn_bias), INIT_ZEROS},
    {"attn.c_proj.weight", 1, 1, BLOCK_FIELD(attn_proj_weight), INIT_RESIDUAL_PROJECTION},
    {"attn.c_proj.bias", 1, 0, BLOCK_FIELD(attn_proj_bias), INIT_ZEROS},
    {"ln_2.weight", 1, 0, BLOCK_FIELD(ln_2_weight), INIT_ONES},
    {"ln_2.bias", 1, 0, BLOCK_FIELD(ln_2_bias), INIT_ZEROS},
    {"mlp.c_fc.weight", 1, 4, BLOCK_FIELD(c_fc_weight), INIT_NORMAL},
    {"mlp.c_fc.bias", 4, 0, BLOCK_FIELD(c_fc_bias), INIT_ZEROS},
    {"mlp.c_proj.weight", 4, 1, BLOCK_FIELD(mlp_proj_weight), INIT_RESIDUAL_PROJECTION},
    {"mlp.c_proj.bias", 1, 0, BLOCK_FIELD(mlp_proj_bias), INIT_ZEROS},
};
#define N_BLOCK_TENSORS ((int)(sizeof block_tensors / sizeof block_tensors[0]))

static float **block_field(pt_gpt_block_params *block, size_t field)
{
    return (float **)((char *)block + field);
}

static bool slice_is_tied(const pt_gpt_slice *s)
{
    return s->config.tie_weights && s->has_embedding && s->has_head;
}

static void add_tensor(pt_gpt_slice *s, const char *name, int64_t dim0, int64_t dim1)
{
    pt_gpt_tensor *t = &s->tensors[s->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = dim1 ? 2 : 1;
    t->shape[0] = dim0;
    t->shape[1] = dim1;
    t->numel = (size_t)dim0 * (size_t)(dim1 ? dim1 : 1);
    t->offset = s->n_params;
    t->decay = t->ndim == 2;
    s->n_params += t->numel;
}

/* Lays the slice's tensors out, in model order, in the flat buffer. */
static void layout_tensors(pt_gpt_slice *s)
{
    const pt_gpt_config *c = &s->config;
    const int64_t C = c->n_embd;
    char name[PT_TENSOR_NAME_MAX];
    if (s->has_embedding) {
        add_tensor(s, "wte.weight", c->vocab_size, C);
        add_tensor(s, "wpe.weight", c->block_size, C);
    }
    for (int l = s->first; l < s->last; l++)
        for (int j = 0; j < N_BLOCK_TENSORS; j++) {
            const block_tensor_spec *spec = &block_tensors[j];
            snprintf(name, sizeof name, "h.%d.%s", l, spec->suffix);
            add_tensor(s, name, spec->dim0_c * C, spec->dim1_c * C);
        }
    if (s->has_head) {
        add_tensor(s, "ln_f.weight", C, 0);
        add_tensor(s, "ln_f.bias", C, 0);
        if (!slice_is_tied(s)) add_tensor(s, "lm_head.weight", c->vocab_size, C);
    }
}

static int count_tensors(const pt_gpt_slice *s)
{
    return (s->has_embedding ? 2 : 0) + N_BLOCK_TENSORS * (s->last - s->first) +
           (s->has_head ? (slice_is_tied(s) ? 2 : 3) : 0);
}

/* Points the structured views (blocks, head) into `base` (params or grads). */
static void bind_views(const pt_gpt_slice *s, float *base, pt_gpt_block_params *blocks,
                       pt_gpt_head_params *head)
{
    int t = 0;
    memset(head, 0, sizeof *head);
    if (s->has_embedding) {
        head->wte = base + s->tensors[t++].offset;
        head->wpe = base + s->tensors[t++].offset;
    }
    for (int b = 0; b < s->last - s->first; b++)
        for (int j = 0; j < N_BLOCK_TENSORS; j++)
            *block_field(&blocks[b], block_tensors[j].field) = base + s->tensors[t++].offset;
    if (s->has_head) {
        head->ln_f_weight = base + s->tensors[t++].offset;
        head->ln_f_bias = base + s->tensors[t++].offset;
        head->lm_head = slice_is_tied(s) ? head->wte : base + s->tensors[t++].offset;
    }
}

/* ---- activations --------------------------------------------------------- */

/* Hands out consecutive pieces of one allocation; with base = NULL it only
 * counts, so sizing and binding share one description of the layout. */
typedef struct carver {
    float *base;
    size_t used;
} carver;

static float *carve(carver *cv, size_t n)
{
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (n + 15) / 16 * 16; /* keep every piece 64-byte aligned */
    return p;
}

/* What attention keeps for its backward: the whole probability matrix on the
 * CPU, per-row statistics and a copy of the output for a flash-style kernel.
 * Without a backend (pt_gpt_slice_bytes, a host-memory estimate), the CPU's. */
static size_t attention_saved_floats(const pt_gpt_slice *s)
{
    const int NH = s->config.n_head, C = s->config.n_embd;
    if (s->kernels) return s->kernels->attention_saved_floats(s->B, s->T, C, NH);
    if (s->attention_sizer) return s->attention_sizer(s->B, s->T, C, NH);
    return (size_t)s->B * NH * s->T * s->T;
}

/* An activation that products, attention or the GELU read, in the slice's precision. */
static pt_gpt_operand carve_operand(const pt_gpt_slice *s, carver *cv, size_t n)
{
    if (s->config.precision == PT_PRECISION_BF16)
        return (pt_gpt_operand){.bf16 = (pt_bf16 *)carve(cv, (n + 1) / 2)};
    return (pt_gpt_operand){.f32 = carve(cv, n)};
}

static void carve_activations(pt_gpt_slice *s, carver *cv)
{
    const size_t N = (size_t)s->B * s->T, C = s->config.n_embd;
    s->input = carve(cv, N * C);
    for (int b = 0; b < s->last - s->first; b++) {
        pt_gpt_block_acts *a = &s->block_acts[b];
        a->ln_1 = carve_operand(s, cv, N * C);
        a->ln_1_mean = carve(cv, N);
        a->ln_1_rstd = carve(cv, N);
        a->qkv = carve_operand(s, cv, N * 3 * C);
        a->att = carve(cv, attention_saved_floats(s));
        a->atty = carve_operand(s, cv, N * C);
        a->residual_2 = carve(cv, N * C);
        a->ln_2 = carve_operand(s, cv, N * C);
        a->ln_2_mean = carve(cv, N);
        a->ln_2_rstd = carve(cv, N);
        a->fc = carve_operand(s, cv, N * 4 * C);
        if (!s->config.recompute_gelu) a->fc_gelu = carve_operand(s, cv, N * 4 * C);
        a->residual_3 = carve(cv, N * C);
    }
    if (s->has_head) {
        s->ln_f = carve_operand(s, cv, N * C);
        s->ln_f_mean = carve(cv, N);
        s->ln_f_rstd = carve(cv, N);
        s->dln_f = carve(cv, N * C);
        s->losses = carve(cv, N);
        s->targets = (int32_t *)carve(cv, N);
    }
    if (s->has_embedding) s->tokens = (int32_t *)carve(cv, N);
}

/* Rows of the classifier's logits at a time: as many as the widest activation of a block,
 * [N, 4C], holds, at least one. At GPT-2's shape (V = 50257, C = 768) that is 1/16 of a
 * 16 × 1024 batch: 0.2 GB instead of 3.3 GB of logits, in products still large enough to
 * run at a GEMM's speed. */
static int head_rows(const pt_gpt_slice *s)
{
    const size_t N = (size_t)s->B * s->T, V = (size_t)s->config.vocab_size;
    const size_t rows = N * 4 * (size_t)s->config.n_embd / V;
    return rows < 1 ? 1 : rows > N ? (int)N : (int)rows;
}

/* The logits' row stride: under bf16, V rounded up to 64 elements (128 bytes; GPT-2: 50,304, as
 * llm.c pads its vocabulary), so that every row starts where a 16-byte vector load can
 * (cuBLAS cannot use them on rows at odd bf16 offsets); fp32 logits are dense (its table
 * entries take no stride). */
static int logits_ld(const pt_gpt_slice *s)
{
    const int V = s->config.vocab_size;
    return s->config.precision == PT_PRECISION_BF16 ? (V + 63) / 64 * 64 : V;
}

static void carve_activation_grads(pt_gpt_slice *s, carver *cv)
{
    const size_t N = (size_t)s->B * s->T, C = s->config.n_embd;
    s->dresidual = carve(cv, N * C);
    s->dscratch_c = carve(cv, N * C);
    s->dscratch_3c = carve(cv, N * 3 * C);
    s->dscratch_fc_gelu = carve(cv, N * 4 * C);
    s->dscratch_fc = carve(cv, N * 4 * C);
    if (s->config.recompute_gelu)
        s->gelu_again = s->config.precision == PT_PRECISION_BF16
                            ? carve_operand(s, cv, N * 4 * C)
                            : (pt_gpt_operand){.f32 = s->dscratch_fc};
    if (s->has_head) {
        s->head_rows = head_rows(s);
        s->logits_ld = logits_ld(s);
        s->logits = carve_operand(s, cv, (size_t)s->head_rows * s->logits_ld);
    }
    size_t rows, weight;
    pt_gpt_matmul_scratch(s, &rows, &weight);
    s->bf16_rows = rows;
    if (!rows) return;
    s->bf16_out = (pt_bf16 *)carve(cv, (rows + 1) / 2);
    s->bf16_weight = (pt_bf16 *)carve(cv, (weight + 1) / 2);
}

/* ---- creation ------------------------------------------------------------ */

pt_gpt_config pt_gpt_config_from_settings(const pipert_config *cfg)
{
    const pt_model_settings *m = &cfg->model;
    const pt_device_traits *device = pt_device_traits_of(cfg->runtime.device);
    if (!device) pt_error_clear(); /* a device no table has: refused where the job starts */
    return (pt_gpt_config){m->n_layer,     m->n_embd,      m->n_head,
                           m->block_size,  m->vocab_size,  m->tie_weights,
                           cfg->runtime.precision, device && device->recompute_gelu};
}

pipert_result pt_gpt_config_check(const pt_gpt_config *c, const char *where)
{
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->block_size < 1 || c->vocab_size < 1)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: model sizes must be positive (n_layer=%d n_embd=%d n_head=%d "
                       "block_size=%d vocab_size=%d)",
                       where, c->n_layer, c->n_embd, c->n_head, c->block_size, c->vocab_size);
    if (c->n_embd % c->n_head != 0)
        return pt_fail(PIPERT_ERR_CONFIG, "%s: model.n_embd=%d is not divisible by model.n_head=%d",
                       where, c->n_embd, c->n_head);
    return PIPERT_OK;
}

static pipert_result check_slice_request(const pt_gpt_config *c, int first, int last, int B, int T)
{
    PT_TRY(pt_gpt_config_check(c, "model"));
    if (first < 0 || last > c->n_layer || first > last)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "blocks [%d, %d) are not a slice of a %d-block model",
                       first, last, c->n_layer);
    if (B < 1 || T < 1 || T > c->block_size)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "batch %d×%d: the sequence length must be in [1, model.block_size=%d]", B, T,
                       c->block_size);
    if (c->tie_weights && !(first == 0 && last == c->n_layer))
        return pt_fail(PIPERT_ERR_CONFIG,
                       "model.tie_weights needs the whole model on one stage (slice [%d, %d) of %d)",
                       first, last, c->n_layer);
    return PIPERT_OK;
}

/* A slice with its shape fields set and its tables allocated, no buffers. */
static pipert_result slice_describe(pt_gpt_slice *s, const pt_gpt_config *config, int first,
                                    int last, int B, int T)
{
    s->config = *config;
    s->first = first;
    s->last = last;
    s->has_embedding = first == 0;
    s->has_head = last == config->n_layer;
    s->B = B;
    s->T = T;
    int n_blocks = last - first;
    s->tensors = calloc((size_t)count_tensors(s), sizeof *s->tensors);
    s->blocks = calloc((size_t)n_blocks + 1, sizeof *s->blocks);
    s->block_grads = calloc((size_t)n_blocks + 1, sizeof *s->block_grads);
    s->block_acts = calloc((size_t)n_blocks + 1, sizeof *s->block_acts);
    if (!s->tensors || !s->blocks || !s->block_grads || !s->block_acts)
        return pt_fail(PIPERT_ERR_NOMEM, "model slice tables: out of memory");
    layout_tensors(s);
    carver acts = {0}, grad_acts = {0};
    carve_activations(s, &acts);
    carve_activation_grads(s, &grad_acts);
    s->n_acts = acts.used;
    s->n_grad_acts = grad_acts.used;
    return PIPERT_OK;
}

static void slice_release_tables(pt_gpt_slice *s)
{
    free(s->tensors);
    free(s->blocks);
    free(s->block_grads);
    free(s->block_acts);
}

void pt_gpt_slice_sizes(const pt_gpt_config *config, int first, int last, int B, int T,
                        pt_attention_sizer attention, size_t *params, size_t *acts,
                        size_t *grad_acts)
{
    pt_gpt_slice s = {.attention_sizer = attention};
    *params = *acts = *grad_acts = 0;
    if (check_slice_request(config, first, last, B, T) == PIPERT_OK &&
        slice_describe(&s, config, first, last, B, T) == PIPERT_OK) {
        *params = s.n_params;
        *acts = s.n_acts;
        *grad_acts = s.n_grad_acts;
    }
    slice_release_tables(&s);
}

size_t pt_gpt_slice_bytes(const pt_gpt_config *config, int first, int last, int B, int T)
{
    pt_gpt_slice s = {0};
    size_t bytes = 0;
    if (check_slice_request(config, first, last, B, T) == PIPERT_OK &&
        slice_describe(&s, config, first, last, B, T) == PIPERT_OK)
        bytes = sizeof(float) * (2 * s.n_params + s.n_acts + s.n_grad_acts);
    slice_release_tables(&s);
    return bytes;
}

pipert_result pt_gpt_slice_create(pt_gpt_slice **out, const pt_gpt_config *config, int first,
                                  int last, int B, int T, const pt_kernels *kernels)
{
    *out = NULL;
    PT_TRY(check_slice_request(config, first, last, B, T));
    pt_gpt_slice *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "model slice: out of memory");
    s->kernels = kernels;
    s->act_slots = 1;
    pipert_result rc = slice_describe(s, config, first, last, B, T);
    size_t bytes = sizeof(float) * (2 * s->n_params + s->n_acts + s->n_grad_acts);
    char what[160];
    snprintf(what, sizeof what,
             "the model (n_layer=%d, n_embd=%d, vocab_size=%d, blocks [%d, %d)) at batch %d×%d",
             config->n_layer, config->n_embd, config->vocab_size, first, last, B, T);
    /* the host's memory: refused up front rather than by the OOM killer (a GPU's arena says
     * itself what does not fit) */
    if (rc == PIPERT_OK && kernels->host_accessible) rc = pt_memory_check_fits(bytes, what);
    if (rc == PIPERT_OK) rc = kernels->alloc((void **)&s->params, s->n_params * sizeof(float), what);
    if (rc == PIPERT_OK) rc = kernels->alloc((void **)&s->grads, s->n_params * sizeof(float), what);
    if (rc == PIPERT_OK)
        rc = kernels->alloc((void **)&s->grad_acts, s->n_grad_acts * sizeof(float), what);
    /* last: pt_gpt_set_activation_slots frees and replaces it, and an arena that hands out
     * memory bottom up (cuda's) reuses what is freed at its top */
    if (rc == PIPERT_OK) rc = kernels->alloc((void **)&s->acts, s->n_acts * sizeof(float), what);
    if (rc != PIPERT_OK) {
        pt_gpt_slice_free(s);
        return rc;
    }
    bind_views(s, s->params, s->blocks, &s->head);
    bind_views(s, s->grads, s->block_grads, &s->head_grads);
    carver acts = {.base = s->acts}, grad_acts = {.base = s->grad_acts};
    carve_activations(s, &acts);
    carve_activation_grads(s, &grad_acts);
    *out = s;
    return PIPERT_OK;
}

void pt_gpt_slice_free(pt_gpt_slice *s)
{
    if (!s) return;
    if (s->kernels) {
        s->kernels->free(s->params);
        s->kernels->free(s->grads);
        s->kernels->free(s->acts);
        s->kernels->free(s->grad_acts);
    }
    slice_release_tables(s);
    free(s);
}

const pt_gpt_tensor *pt_gpt_find(const pt_gpt_slice *s, const char *name)
{
    for (int i = 0; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
    return NULL;
}

/* ---- initialisation ------------------------------------------------------ */

static init_kind tensor_init_kind(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!strncmp(name, "h.", 2)) {
        const char *suffix = strchr(name + 2, '.') + 1;
        for (int j = 0; j < N_BLOCK_TENSORS; j++)
            if (!strcmp(block_tensors[j].suffix, suffix)) return block_tensors[j].init;
    }
    if (!strncmp(name, "ln_f.", 5)) return !strcmp(dot, ".weight") ? INIT_ONES : INIT_ZEROS;
    return INIT_NORMAL; /* wte, wpe, lm_head */
}

pipert_result pt_gpt_init(pt_gpt_slice *s, uint64_t seed)
{
    float *host;
    PT_TRY(pt_alloc((void **)&host, s->n_params * sizeof(float), "initial parameters"));
    const float std = 0.02f;
    const float residual_std = std / sqrtf(2.0f * (float)s->config.n_layer);
    for (int i = 0; i < s->n_tensors; i++) {
        const pt_gpt_tensor *t = &s->tensors[i];
        float *dst = host + t->offset;
        pt_philox_key key = pt_rng_key(seed, pt_hash_string(t->name));
        switch (tensor_init_kind(t->name)) {
        case INIT_NORMAL: pt_rng_fill_normal(key, dst, t->numel, 0.f, std); break;
        case INIT_RESIDUAL_PROJECTION: pt_rng_fill_normal(key, dst, t->numel, 0.f, residual_std); break;
        case INIT_ONES:
            for (size_t j = 0; j < t->numel; j++) dst[j] = 1.f;
            break;
        case INIT_ZEROS: break;
        }
    }
    s->kernels->copy_to_device(s->params, host, s->n_params * sizeof(float));
    pt_free(host);
    return PIPERT_OK;
}

/* ---- sizes --------------------------------------------------------------- */

size_t pt_gpt_matmul_params(const pt_gpt_config *c)
{
    const size_t C = c->n_embd;
    return (size_t)c->n_layer * (12 * C * C + 13 * C) + 2 * C + (size_t)c->vocab_size * C;
}

double pt_gpt_flops_per_token(const pt_gpt_config *c, int T)
{
    return 6.0 * (double)pt_gpt_matmul_params(c) + 12.0 * c->n_layer * c->n_embd * (double)T;
}

/* ---- forward ------------------------------------------------------------- */

static const float *block_input(const pt_gpt_slice *s, int b)
{
    return b == 0 ? s->input : s->block_acts[b - 1].residual_3;
}

const float *pt_gpt_output(const pt_gpt_slice *s) { return block_input(s, s->last - s->first); }

/* The GELU's output as the MLP's product reads it: kept, or gelu_again. */
static pt_gpt_operand gelu_output(const pt_gpt_slice *s, const pt_gpt_block_acts *a)
{
    return s->config.recompute_gelu ? s->gelu_again : a->fc_gelu;
}

static void gelu_forward(const pt_gpt_slice *s, const pt_gpt_block_acts *a, size_t n)
{
    const pt_gpt_operand out = gelu_output(s, a);
    if (a->fc.bf16) s->kernels->gelu_forward_bf16(out.bf16, a->fc.bf16, n);
    else s->kernels->gelu_forward(out.f32, a->fc.f32, n);
}

/* The MLP's second product's backward through the GELU: fc's gradient in the slice's
 * precision (what c_fc's backward reads), from s->dresidual, the product's upstream gradient.
 * fp32: the product's dinp in dscratch_fc_gelu, then gelu'(fc)·dinp in dscratch_fc. bf16: one
 * call that writes it rounded into dscratch_fc's memory (the product's fp32 sums stay in the
 * backend, or go to dscratch_fc_gelu where it cannot apply the GELU's gradient itself). */
static pt_gpt_operand mlp_proj_backward(pt_gpt_slice *s, const pt_gpt_block_acts *a,
                                        pt_gpt_block_params *g, const pt_gpt_block_params *p,
                                        bool dresidual_rounded)
{
    const pt_kernels *k = s->kernels;
    const int N = s->B * s->T, C = s->config.n_embd;
    const size_t n = (size_t)N * 4 * C;
    if (a->fc.bf16) {
        pt_bf16 *dfc = (pt_bf16 *)s->dscratch_fc;
        pt_gpt_matmul_gelu_backward(s, dfc, g->mlp_proj_weight, g->mlp_proj_bias, s->dresidual,
                                    dresidual_rounded ? s->bf16_out : NULL, gelu_output(s, a),
                                    a->fc.bf16, p->mlp_proj_weight, N, 4 * C, C);
        return (pt_gpt_operand){.bf16 = dfc};
    }
    pt_gpt_matmul_backward(s, s->dscratch_fc_gelu, g->mlp_proj_weight, g->mlp_proj_bias,
                           s->dresidual, gelu_output(s, a), p->mlp_proj_weight, N, 4 * C, C,
                           PT_WEIGHT_IN_OUT);
    k->zero(s->dscratch_fc, n * sizeof(float));
    k->gelu_backward(s->dscratch_fc, a->fc.f32, s->dscratch_fc_gelu, n);
    return (pt_gpt_operand){.f32 = s->dscratch_fc};
}

/* A layernorm into an operand (ln_1, ln_2, ln_f); its statistics fp32. */
static void layernorm_into(const pt_gpt_slice *s, pt_gpt_operand out, float *mean, float *rstd,
                           const float *inp, const float *weight, const float *bias)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    if (out.bf16)
        s->kernels->layernorm_forward_bf16(out.bf16, mean, rstd, inp, weight, bias, N, C);
    else
        s->kernels->layernorm_forward(out.f32, mean, rstd, inp, weight, bias, N, C);
}

/* residual = a + b, the residual stream's sum (residual may be a), and the layernorm of it into
 * an operand, in one pass. */
static void residual_layernorm_into(const pt_gpt_slice *s, float *residual, const float *a,
                                    const float *b, pt_gpt_operand out, float *mean, float *rstd,
                                    const float *weight, const float *bias)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    if (out.bf16)
        s->kernels->residual_layernorm_forward_bf16(residual, out.bf16, mean, rstd, a, b, weight,
                                                    bias, N, C);
    else
        s->kernels->residual_layernorm_forward(residual, out.f32, mean, rstd, a, b, weight, bias,
                                               N, C);
}

/* atty from qkv, in the slice's precision. */
static void attention_forward(const pt_gpt_slice *s, pt_gpt_block_acts *a)
{
    const pt_kernels *k = s->kernels;
    const int B = s->B, T = s->T, C = s->config.n_embd, NH = s->config.n_head;
    if (a->qkv.bf16)
        k->attention_forward_bf16_to_bf16(a->atty.bf16, s->dscratch_fc, a->att, a->qkv.bf16, B, T,
                                          C, NH);
    else
        k->attention_forward(a->atty.f32, a->att, a->qkv.f32, B, T, C, NH);
}

/* The gradient of qkv through attention of datty, in the slice's precision: fp32 in
 * dscratch_3c, or written in bf16 into bf16_out as attention's backward makes it (what
 * c_attn's backward reads; dscratch_3c is the backend's scratch then). */
static pt_gpt_operand attention_gradient(const pt_gpt_slice *s, const pt_gpt_block_acts *a,
                                         const float *datty)
{
    const pt_kernels *k = s->kernels;
    const int B = s->B, T = s->T, C = s->config.n_embd, NH = s->config.n_head;
    if (a->qkv.bf16) {
        k->attention_backward_bf16_to_bf16(s->bf16_out, s->dscratch_3c, datty, a->qkv.bf16,
                                           a->att, B, T, C, NH);
        return (pt_gpt_operand){.bf16 = s->bf16_out};
    }
    k->zero(s->dscratch_3c, (size_t)B * T * 3 * C * sizeof(float));
    k->attention_backward(s->dscratch_3c, datty, a->qkv.f32, a->att, B, T, C, NH);
    return (pt_gpt_operand){.f32 = s->dscratch_3c};
}

/* Block b's forward. Its ln_1 is made before (block 0) or by the block before it, which adds
 * its residual stream and takes the layernorm after it in one pass, as each block does for
 * its own ln_2 and the next block's ln_1. */
static void block_forward(pt_gpt_slice *s, int b)
{
    const pt_kernels *k = s->kernels;
    const int N = s->B * s->T, C = s->config.n_embd;
    const pt_gpt_block_params *p = &s->blocks[b];
    pt_gpt_block_acts *a = &s->block_acts[b];
    const float *x = block_input(s, b);

    if (b == 0)
        layernorm_into(s, a->ln_1, a->ln_1_mean, a->ln_1_rstd, x, p->ln_1_weight, p->ln_1_bias);
    pt_gpt_matmul_forward_operand(s, a->qkv, a->ln_1, p->c_attn_weight, p->c_attn_bias, N, C,
                                  3 * C, 3 * C, PT_WEIGHT_IN_OUT);
    attention_forward(s, a);
    pt_gpt_matmul_forward(s, a->residual_2, a->atty, p->attn_proj_weight, p->attn_proj_bias, N, C,
                          C, PT_WEIGHT_IN_OUT);
    residual_layernorm_into(s, a->residual_2, a->residual_2, x, a->ln_2, a->ln_2_mean,
                            a->ln_2_rstd, p->ln_2_weight, p->ln_2_bias);

    pt_gpt_matmul_forward_operand(s, a->fc, a->ln_2, p->c_fc_weight, p->c_fc_bias, N, C, 4 * C,
                                  4 * C, PT_WEIGHT_IN_OUT);
    gelu_forward(s, a, (size_t)N * 4 * C);
    pt_gpt_matmul_forward(s, a->residual_3, gelu_output(s, a), p->mlp_proj_weight,
                          p->mlp_proj_bias, N, 4 * C, C, PT_WEIGHT_IN_OUT);
    if (b + 1 == s->last - s->first) {
        k->residual_forward(a->residual_3, a->residual_3, a->residual_2, (size_t)N * C);
        return;
    }
    pt_gpt_block_acts *next = &s->block_acts[b + 1];
    const pt_gpt_block_params *np = &s->blocks[b + 1];
    residual_layernorm_into(s, a->residual_3, a->residual_3, a->residual_2, next->ln_1,
                            next->ln_1_mean, next->ln_1_rstd, np->ln_1_weight, np->ln_1_bias);
}

/* Embeddings (stage 0) and every block of the slice. */
static void trunk_forward(pt_gpt_slice *s)
{
    if (s->has_embedding)
        s->kernels->encoder_forward(s->input, s->tokens, s->head.wte, s->head.wpe, s->B, s->T,
                                    s->config.n_embd);
    for (int b = 0; b < s->last - s->first; b++) block_forward(s, b);
}

/* ---- the classifier: ln_f, the logits and the loss, head_rows rows at a time ---- */

static void head_layernorm(pt_gpt_slice *s)
{
    layernorm_into(s, s->ln_f, s->ln_f_mean, s->ln_f_rstd, pt_gpt_output(s), s->head.ln_f_weight,
                   s->head.ln_f_bias);
}

/* The logits of positions [first, first + n) into s->logits. */
static void head_logits(pt_gpt_slice *s, int first, int n)
{
    const int C = s->config.n_embd, V = s->config.vocab_size;
    pt_gpt_matmul_forward_operand(s, s->logits,
                                  pt_gpt_operand_rows(s->ln_f, (size_t)first, (size_t)C),
                                  s->head.lm_head, NULL, n, C, V, s->logits_ld, PT_WEIGHT_OUT_IN);
}

static int rows_from(const pt_gpt_slice *s, int first)
{
    const int N = s->B * s->T;
    return N - first < s->head_rows ? N - first : s->head_rows;
}

/* The losses and, for the loss scaled by loss_scale / N, dln_f and (weight_gradient) the
 * classifier weight's gradient: each chunk's logits become its dlogits in place and go
 * into both before the next chunk overwrites them (each chunk writes its rows of dln_f). */
static void head_loss_and_backward(pt_gpt_slice *s, float loss_scale, bool weight_gradient)
{
    const pt_kernels *k = s->kernels;
    const int N = s->B * s->T, C = s->config.n_embd, V = s->config.vocab_size;
    head_layernorm(s);
    for (int first = 0; first < N; first += s->head_rows) {
        const int n = rows_from(s, first);
        head_logits(s, first, n);
        if (s->logits.bf16)
            k->crossentropy_forward_backward_bf16(s->losses + first, s->logits.bf16,
                                                  s->targets + first, n, V, s->logits_ld,
                                                  loss_scale / (float)N);
        else
            k->crossentropy_forward_backward(s->losses + first, s->logits.f32, s->targets + first,
                                             n, V, loss_scale / (float)N);
        pt_gpt_matmul_backward_operand(s, s->dln_f + (size_t)first * C,
                                       weight_gradient ? s->head_grads.lm_head : NULL, NULL,
                                       s->logits,
                                       pt_gpt_operand_rows(s->ln_f, (size_t)first, (size_t)C),
                                       s->head.lm_head, n, C, V, s->logits_ld, PT_WEIGHT_OUT_IN);
    }
}

static void head_loss(pt_gpt_slice *s)
{
    const int N = s->B * s->T;
    head_layernorm(s);
    for (int first = 0; first < N; first += s->head_rows) {
        const int n = rows_from(s, first);
        head_logits(s, first, n);
        if (s->logits.bf16)
            s->kernels->crossentropy_forward_bf16(s->losses + first, s->logits.bf16,
                                                  s->targets + first, n, s->config.vocab_size,
                                                  s->logits_ld);
        else
            s->kernels->crossentropy_forward(s->losses + first, s->logits.f32, s->targets + first,
                                             n, s->config.vocab_size);
    }
}

static float mean_loss(const pt_gpt_slice *s)
{
    const int N = s->B * s->T;
    return (float)(s->kernels->sum(s->losses, (size_t)N) / N);
}

void pt_gpt_forward(pt_gpt_slice *s, float loss_scale, float *loss)
{
    pt_gpt_matmul_begin_pass(s);
    trunk_forward(s);
    if (!s->has_head) return;
    head_loss_and_backward(s, loss_scale, true);
    if (loss) *loss = mean_loss(s);
}

void pt_gpt_recompute(pt_gpt_slice *s, float loss_scale)
{
    pt_gpt_matmul_begin_pass(s);
    trunk_forward(s);
    if (s->has_head) head_loss_and_backward(s, loss_scale, false);
}

void pt_gpt_forward_eval(pt_gpt_slice *s, float *loss)
{
    pt_gpt_matmul_begin_pass(s);
    trunk_forward(s);
    if (!s->has_head) return;
    head_loss(s);
    if (loss) *loss = mean_loss(s);
}

/* ---- backward ------------------------------------------------------------ */

/* dresidual += the layernorm's backward of dout (into its branch's input); under bf16 also
 * rounded into bf16_out as it is written, what the product before the branch reads next (no
 * cast that reads dresidual again: the same bits). */
static void layernorm_backward_into(pt_gpt_slice *s, float *weight_gradient, float *bias_gradient,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *mean, const float *rstd)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    if (s->config.precision == PT_PRECISION_BF16)
        s->kernels->layernorm_backward_bf16(s->dresidual, s->bf16_out, weight_gradient,
                                            bias_gradient, dout, inp, weight, mean, rstd, N, C);
    else
        s->kernels->layernorm_backward(s->dresidual, weight_gradient, bias_gradient, dout, inp,
                                       weight, mean, rstd, N, C);
}

/* The attention's output product's backward, from dresidual (under bf16: its rounding in
 * bf16_out, which the layernorm backward before it wrote). */
static void attn_proj_backward(pt_gpt_slice *s, const pt_gpt_block_acts *a,
                               pt_gpt_block_params *g, const pt_gpt_block_params *p)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    if (s->config.precision == PT_PRECISION_BF16)
        pt_gpt_matmul_backward_operand(s, s->dscratch_c, g->attn_proj_weight, g->attn_proj_bias,
                                       (pt_gpt_operand){.bf16 = s->bf16_out}, a->atty,
                                       p->attn_proj_weight, N, C, C, C, PT_WEIGHT_IN_OUT);
    else
        pt_gpt_matmul_backward(s, s->dscratch_c, g->attn_proj_weight, g->attn_proj_bias,
                               s->dresidual, a->atty, p->attn_proj_weight, N, C, C,
                               PT_WEIGHT_IN_OUT);
}

/* On entry s->dresidual holds the gradient of the block's output (and, where dresidual_rounded,
 * bf16_out its bf16 rounding: a layernorm backward wrote both); on return, the gradient of its
 * input, and under bf16 bf16_out its rounding. The residual connections are the accumulation:
 * each layernorm backward adds its branch into dresidual. */
static void block_backward(pt_gpt_slice *s, int b, bool dresidual_rounded)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    const size_t NC = (size_t)N * C;
    const pt_gpt_block_params *p = &s->blocks[b];
    pt_gpt_block_params *g = &s->block_grads[b];
    const pt_gpt_block_acts *a = &s->block_acts[b];
    const float *x = block_input(s, b);

    /* MLP branch: residual_3 = residual_2 + c_proj(gelu(c_fc(ln_2(residual_2)))) */
    if (s->config.recompute_gelu) gelu_forward(s, a, 4 * NC);
    pt_gpt_matmul_backward_operand(s, s->dscratch_c, g->c_fc_weight, g->c_fc_bias,
                                   mlp_proj_backward(s, a, g, p, dresidual_rounded), a->ln_2,
                                   p->c_fc_weight, N, C, 4 * C, 4 * C, PT_WEIGHT_IN_OUT);
    layernorm_backward_into(s, g->ln_2_weight, g->ln_2_bias, s->dscratch_c, a->residual_2,
                            p->ln_2_weight, a->ln_2_mean, a->ln_2_rstd);

    /* attention branch: residual_2 = x + c_proj(attn(c_attn(ln_1(x)))) */
    attn_proj_backward(s, a, g, p);
    pt_gpt_matmul_backward_operand(s, s->dscratch_c, g->c_attn_weight, g->c_attn_bias,
                                   attention_gradient(s, a, s->dscratch_c), a->ln_1,
                                   p->c_attn_weight, N, C, 3 * C, 3 * C, PT_WEIGHT_IN_OUT);
    layernorm_backward_into(s, g->ln_1_weight, g->ln_1_bias, s->dscratch_c, x, p->ln_1_weight,
                            a->ln_1_mean, a->ln_1_rstd);
}

/* dresidual ← gradient of the trunk output, from dln_f (the classifier's backward ran in
 * the forward). */
static void head_backward(pt_gpt_slice *s)
{
    const int N = s->B * s->T, C = s->config.n_embd;
    s->kernels->zero(s->dresidual, (size_t)N * C * sizeof(float));
    layernorm_backward_into(s, s->head_grads.ln_f_weight, s->head_grads.ln_f_bias, s->dln_f,
                            pt_gpt_output(s), s->head.ln_f_weight, s->ln_f_mean, s->ln_f_rstd);
}

const float *pt_gpt_backward(pt_gpt_slice *s, const float *dout)
{
    const size_t NC = (size_t)s->B * s->T * s->config.n_embd;
    pt_gpt_matmul_begin_pass(s);
    if (s->has_head) head_backward(s);
    else s->kernels->copy(s->dresidual, dout, NC * sizeof(float));
    /* under bf16 each layernorm backward leaves dresidual's rounding in bf16_out too */
    const bool bf16 = s->config.precision == PT_PRECISION_BF16;
    for (int b = s->last - s->first - 1; b >= 0; b--)
        block_backward(s, b, bf16 && (s->has_head || b < s->last - s->first - 1));
    if (!s->has_embedding) return s->dresidual;
    s->kernels->encoder_backward(s->head_grads.wte, s->head_grads.wpe, s->dresidual, s->tokens,
                                 s->B, s->T, s->config.n_embd);
    return NULL;
}

void pt_gpt_zero_grads(pt_gpt_slice *s)
{
    s->kernels->zero(s->grads, s->n_params * sizeof(float));
}

/* ---- pipeline support ---------------------------------------------------- */

pipert_result pt_gpt_set_activation_slots(pt_gpt_slice *s, int slots)
{
    if (slots < 1) return pt_fail(PIPERT_ERR_INVALID_ARG, "activation slots: %d", slots);
    if (slots == s->act_slots) return PIPERT_OK;
    size_t floats;
    if (!pt_mul_size(s->n_acts, (size_t)slots, &floats) || !pt_mul_size(floats, sizeof(float), &floats))
        return pt_fail(PIPERT_ERR_NOMEM, "activations of %d microbatches: size overflows", slots);
    char what[96];
    snprintf(what, sizeof what, "activations of %d microbatches in flight (blocks [%d, %d))", slots,
             s->first, s->last);
    if (s->kernels->host_accessible) PT_TRY(pt_memory_check_fits(floats, what));
    /* the old set goes first: the new one takes its place rather than coming on top of it */
    s->kernels->free(s->acts);
    s->acts = NULL;
    PT_TRY(s->kernels->alloc((void **)&s->acts, floats, what));
    s->act_slots = slots;
    pt_gpt_use_activation_slot(s, 0);
    return PIPERT_OK;
}

void pt_gpt_use_activation_slot(pt_gpt_slice *s, int slot)
{
    carver acts = {.base = s->acts + (size_t)slot * s->n_acts};
    carve_activations(s, &acts);
}

void pt_gpt_use_params(pt_gpt_slice *s, float *params)
{
    bind_views(s, params ? params : s->params, s->blocks, &s->head);
}
