/* Causal self-attention through cuDNN's fused flash attention (cudnn_attention.h).
 *
 * The graphs are those cuDNN's engines recognise as scaled dot-product attention: the
 * forward a product, the scale, the causal mask as a select on generated row and column
 * indices, the softmax with its statistics (max, exp, sum, log), and the second product; the
 * backward recomputes P from the statistics and forms D, dP, dS and the three products, dq
 * accumulated in fp32 in cuDNN's own element order (a tensor the caller gives, zeroed before
 * each run) and rounded to bf16 at the end. Intermediate tensors are virtual (never in
 * memory) and fp32, except the operands of the products after the softmax, bf16 as q, k and v. Whether an
 * engine takes a graph is cuDNN's to say, so tests/test_cudnn_attention.c asks it of these
 * graphs at GPT-2's shapes for an H100 without one, and test_cuda runs them on a GPU. */
#include "kernels/cuda/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cudnn_opgraph.h"

/* the graphs' own tensors: the variant pack's ids */
enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_DQ_SUMS, /* the backward's fp32 dq accumulator */
    UID_SCALE,   /* 1/√hs, by value */
    UID_MASKED,  /* what a masked score becomes: the lowest float, by value */
    UID_ONE,     /* 1, by value */
};

#define PLANS_KEPT 8 /* shapes × passes: a model has one or two shapes */

typedef struct attention_plan {
    pt_cudnn_attention_pass pass;
    pt_cudnn_attention_shape shape;
    pt_cudnn_graph graph;             /* the descriptors the plan was made from */
    cudnnBackendDescriptor_t plan;
    size_t workspace;                 /* bytes */
} attention_plan;

struct pt_cudnn_attention_plans {
    attention_plan *kept[PLANS_KEPT];
    int n;
};

/* ---- layouts ------------------------------------------------------------------ */

static pt_cudnn_layout layout(cudnnDataType_t type, int64_t d0, int64_t d1, int64_t d2,
                              int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
    return (pt_cudnn_layout){type, {d0, d1, d2, d3}, {s0, s1, s2, s3}};
}

/* q, k or v (or their gradients) of qkv as [B, NH, T, hs]; transposed: [B, NH, hs, T] */
static pt_cudnn_layout qkv_part(pt_cudnn_attention_shape s, bool transposed)
{
    const int64_t row = 3 * (int64_t)s.NH * s.hs, batch = (int64_t)s.T * row;
    return transposed ? layout(CUDNN_DATA_BFLOAT16, s.B, s.NH, s.hs, s.T, batch, s.hs, 1, row)
                      : layout(CUDNN_DATA_BFLOAT16, s.B, s.NH, s.T, s.hs, batch, s.hs, row, 1);
}

/* out or dout, [B, T, C] as [B, NH, T, hs] */
static pt_cudnn_layout heads(pt_cudnn_attention_shape s)
{
    const int64_t C = (int64_t)s.NH * s.hs;
    return layout(CUDNN_DATA_BFLOAT16, s.B, s.NH, s.T, s.hs, s.T * C, s.hs, C, 1);
}

/* [B, NH, T, T] scores, fp32 (or `type`) */
static pt_cudnn_layout scores(pt_cudnn_attention_shape s, cudnnDataType_t type)
{
    const int64_t T = s.T;
    return layout(type, s.B, s.NH, T, T, s.NH * T * T, T * T, T, 1);
}

/* the same seen transposed, [B, NH, T(keys), T(queries)], bf16: a product's operand */
static pt_cudnn_layout scores_transposed(pt_cudnn_attention_shape s)
{
    const int64_t T = s.T;
    return layout(CUDNN_DATA_BFLOAT16, s.B, s.NH, T, T, s.NH * T * T, T * T, 1, T);
}

/* one fp32 value a row, [B, NH, T, 1]: the statistics' layout */
static pt_cudnn_layout per_row(pt_cudnn_attention_shape s)
{
    const int64_t T = s.T;
    return layout(CUDNN_DATA_FLOAT, s.B, s.NH, T, 1, s.NH * T, T, 1, 1);
}

/* ---- the graphs ----------------------------------------------------------------- */

typedef cudnnBackendDescriptor_t tensor;
#define F32 CUDNN_DATA_FLOAT

/* A new virtual tensor of `layout`: mode(x[, b]) in fp32 */
static tensor apply(pt_cudnn_graph *g, cudnnPointwiseMode_t mode, tensor x, tensor b,
                    pt_cudnn_layout layout)
{
    tensor y = pt_cudnn_virtual(g, layout);
    pt_cudnn_pointwise(g, mode, F32, -1, x, b, NULL, y);
    return y;
}

/* A new virtual tensor of `layout`: a·b */
static tensor product(pt_cudnn_graph *g, tensor a, tensor b, pt_cudnn_layout layout)
{
    tensor c = pt_cudnn_virtual(g, layout);
    pt_cudnn_matmul(g, a, b, c);
    return c;
}

/* A new virtual tensor, one value a row: `how` over the row of x */
static tensor row_reduction(pt_cudnn_graph *g, cudnnReduceTensorOp_t how, tensor x,
                            pt_cudnn_attention_shape s)
{
    tensor y = pt_cudnn_virtual(g, per_row(s));
    pt_cudnn_reduction(g, how, x, y);
    return y;
}

/* A new virtual tensor: x seen transposed as a product's bf16 operand */
static tensor transposed(pt_cudnn_graph *g, tensor x, pt_cudnn_layout layout)
{
    tensor y = pt_cudnn_virtual(g, layout);
    pt_cudnn_reshape(g, x, y);
    return y;
}

/* The scaled, causally masked scores q·kᵀ·scale: a key after the query becomes the lowest
 * float, a select on generated row and column indices. */
static tensor masked_scores(pt_cudnn_graph *g, pt_cudnn_attention_shape s, tensor q, tensor kt,
                            tensor scale)
{
    tensor scaled = apply(g, CUDNN_POINTWISE_MUL, product(g, q, kt, scores(s, F32)), scale,
                          scores(s, F32));
    tensor row = pt_cudnn_virtual(g, scores(s, CUDNN_DATA_INT32));
    tensor column = pt_cudnn_virtual(g, scores(s, CUDNN_DATA_INT32));
    tensor kept = pt_cudnn_virtual(g, scores(s, CUDNN_DATA_BOOLEAN));
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, scaled, NULL, NULL, row);
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, scaled, NULL, NULL,
                       column);
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, column, NULL, kept);
    tensor masked = pt_cudnn_virtual(g, scores(s, F32));
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F32, -1, scaled,
                       pt_cudnn_scalar(g, UID_MASKED, F32), kept, masked);
    return masked;
}

static void forward_graph(pt_cudnn_graph *g, pt_cudnn_attention_shape s)
{
    tensor q = pt_cudnn_tensor(g, UID_Q, qkv_part(s, false), 0);
    tensor kt = pt_cudnn_tensor(g, UID_K, qkv_part(s, true), 0);
    tensor v = pt_cudnn_tensor(g, UID_V, qkv_part(s, false), 0);
    tensor S = masked_scores(g, s, q, kt, pt_cudnn_scalar(g, UID_SCALE, F32));
    /* the softmax, its statistics max + log Σ exp kept */
    tensor max = row_reduction(g, CUDNN_REDUCE_TENSOR_MAX, S, s);
    tensor e = apply(g, CUDNN_POINTWISE_EXP, apply(g, CUDNN_POINTWISE_SUB, S, max, scores(s, F32)),
                     NULL, scores(s, F32));
    tensor sum = row_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, s);
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_ADD, F32, -1, max,
                       apply(g, CUDNN_POINTWISE_LOG, sum, NULL, per_row(s)), NULL,
                       pt_cudnn_tensor(g, UID_STATS, per_row(s), 0));
    tensor P = apply(g, CUDNN_POINTWISE_DIV, e, sum, scores(s, CUDNN_DATA_BFLOAT16));
    pt_cudnn_matmul(g, P, v, pt_cudnn_tensor(g, UID_O, heads(s), 0));
}

/* D = Σ_d dO∘O, a row's */
static tensor delta(pt_cudnn_graph *g, pt_cudnn_attention_shape s, tensor dout, tensor out,
                    tensor one)
{
    const int64_t C = (int64_t)s.NH * s.hs;
    tensor products = apply(g, CUDNN_POINTWISE_MUL, dout, out,
                            layout(F32, s.B, s.NH, s.T, s.hs, (int64_t)s.T * C, s.hs, C, 1));
    return apply(g, CUDNN_POINTWISE_MUL, row_reduction(g, CUDNN_REDUCE_TENSOR_ADD, products, s),
                 one, per_row(s));
}

/* dq = dS·k, summed in fp32 (cuDNN's order, in a tensor of ours) and rounded once */
static void dq_of(pt_cudnn_graph *g, pt_cudnn_attention_shape s, tensor dS, tensor kt)
{
    const int64_t hs = s.hs, T = s.T;
    tensor sums = pt_cudnn_tensor(g, UID_DQ_SUMS,
                                  layout(F32, s.B, s.NH, T, hs, s.NH * T * hs, T * hs, hs, 1),
                                  PT_CUDNN_REORDER_F16);
    pt_cudnn_matmul(g, dS, transposed(g, kt, qkv_part(s, false)), sums);
    pt_cudnn_pointwise(g, CUDNN_POINTWISE_IDENTITY, F32, -1, sums, NULL, NULL,
                       pt_cudnn_tensor(g, UID_DQ, qkv_part(s, false), 0));
}

static void backward_graph(pt_cudnn_graph *g, pt_cudnn_attention_shape s)
{
    tensor q = pt_cudnn_tensor(g, UID_Q, qkv_part(s, false), 0);
    tensor kt = pt_cudnn_tensor(g, UID_K, qkv_part(s, true), 0);
    tensor vt = pt_cudnn_tensor(g, UID_V, qkv_part(s, true), 0);
    tensor dout = pt_cudnn_tensor(g, UID_DO, heads(s), 0);
    tensor one = pt_cudnn_scalar(g, UID_ONE, F32);
    tensor scale = pt_cudnn_scalar(g, UID_SCALE, F32); /* 1/√hs, used twice */
    tensor D = delta(g, s, dout, pt_cudnn_tensor(g, UID_O, heads(s), 0), one);
    /* P again, from the forward's statistics; dv = Pᵀ·dO */
    tensor S = masked_scores(g, s, q, kt, scale);
    tensor P = apply(g, CUDNN_POINTWISE_EXP,
                     apply(g, CUDNN_POINTWISE_SUB, S, pt_cudnn_tensor(g, UID_STATS, per_row(s), 0),
                           scores(s, F32)),
                     NULL, scores(s, F32));
    pt_cudnn_matmul(g, transposed(g, P, scores_transposed(s)), dout,
                    pt_cudnn_tensor(g, UID_DV, qkv_part(s, false), 0));
    /* dS = P∘(dO·vᵀ − D)/√hs */
    tensor dP = apply(g, CUDNN_POINTWISE_MUL, product(g, dout, vt, scores(s, F32)), one,
                      scores(s, F32));
    tensor centred = apply(g, CUDNN_POINTWISE_SUB, dP, D, scores(s, F32));
    tensor dS = apply(g, CUDNN_POINTWISE_MUL,
                      apply(g, CUDNN_POINTWISE_MUL, centred, P, scores(s, F32)), scale,
                      scores(s, F32));
    /* dk = dSᵀ·q; dq = dS·k */
    pt_cudnn_matmul(g, transposed(g, dS, scores_transposed(s)), q,
                    pt_cudnn_tensor(g, UID_DK, qkv_part(s, false), 0));
    dq_of(g, s, dS, kt);
}

/* ---- plans ---------------------------------------------------------------------- */

static const char *pass_name(pt_cudnn_attention_pass pass)
{
    return pass == PT_CUDNN_ATTENTION_FORWARD ? "attention forward" : "attention backward";
}

/* Heuristics' configurations for the graph that cuDNN says can run it (made in g), at most
 * `max`; how many. */
static int engine_configs(pt_cudnn_graph *g, cudnnBackendDescriptor_t *configs, int max)
{
    const pt_cudnn_api *api = &g->cudnn->api;
    cudnnBackendDescriptor_t heuristics = NULL;
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    int64_t found = 0;
    if (api->create_descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heuristics)) return 0;
    bool ok = !api->set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph) &&
              !api->set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                  &mode);
    if (ok && g->cudnn->device)
        ok = !api->set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->cudnn->device);
    ok = ok && !api->finalize(heuristics) &&
         !api->get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &found, NULL);
    int n = 0;
    if (ok && found > 0) {
        const int asked = found < max ? (int)found : max;
        for (int i = 0; i < asked; i++) {
            configs[i] = NULL;
            api->create_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[i]);
        }
        int64_t got = 0;
        if (api->get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, asked, &got, configs))
            got = 0;
        for (int i = (int)got; i < asked; i++) api->destroy_descriptor(configs[i]);
        n = (int)got;
    }
    api->destroy_descriptor(heuristics);
    return n;
}

static int engine_of(const pt_cudnn *c, cudnnBackendDescriptor_t config)
{
    cudnnBackendDescriptor_t engine = NULL;
    int64_t index = -1, count = 0;
    if (c->api.create_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine)) return -1;
    if (c->api.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &count, &engine) ||
        c->api.get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count,
                             &index))
        index = -1;
    c->api.destroy_descriptor(engine);
    return (int)index;
}

/* An execution plan of `config` for the handle's device or the description's; its status. */
static cudnnStatus_t make_plan(const pt_cudnn *c, cudnnBackendDescriptor_t config,
                               cudnnBackendDescriptor_t *plan)
{
    const pt_cudnn_api *api = &c->api;
    cudnnStatus_t status = api->create_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
    if (status) return status;
    status = api->set_attribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    if (!status && c->handle)
        status = api->set_attribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                    &c->handle);
    if (!status && c->device)
        status = api->set_attribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->device);
    if (!status) status = api->finalize(*plan);
    if (status) {
        api->destroy_descriptor(*plan);
        *plan = NULL;
    }
    return status;
}

#define CONFIGS_TRIED 16

/* The pass's graph in a, and the first of its configurations whose plan finalizes in a->plan
 * (NULL if none), the report saying what was found. */
static pipert_result plan_pass(pt_cudnn *c, attention_plan *a, pt_cudnn_attention_report *report)
{
    memset(report, 0, sizeof *report);
    report->engine = -1;
    report->plan_status = CUDNN_STATUS_NOT_SUPPORTED;
    pt_cudnn_graph_start(&a->graph, c);
    if (a->pass == PT_CUDNN_ATTENTION_FORWARD)
        forward_graph(&a->graph, a->shape);
    else
        backward_graph(&a->graph, a->shape);
    PT_TRY(pt_cudnn_graph_finish(&a->graph, pass_name(a->pass)));
    cudnnBackendDescriptor_t configs[CONFIGS_TRIED];
    report->engine_configs = engine_configs(&a->graph, configs, CONFIGS_TRIED);
    bool decided = false;
    for (int i = 0; i < report->engine_configs; i++) {
        if (!decided) {
            cudnnBackendDescriptor_t plan = NULL;
            const cudnnStatus_t status = make_plan(c, configs[i], &plan);
            report->engine = engine_of(c, configs[i]);
            report->plan_status = status;
            if (status)
                c->api.get_last_error_string(report->plan_reason, sizeof report->plan_reason);
            if (plan && c->handle) a->plan = plan;
            else if (plan) c->api.destroy_descriptor(plan);
            /* with a handle, the first that runs; for a description, whether the first compiles */
            decided = status == CUDNN_STATUS_SUCCESS || !c->handle;
        }
        c->api.destroy_descriptor(configs[i]);
    }
    return PIPERT_OK;
}

static void attention_plan_free(const pt_cudnn *c, attention_plan *a)
{
    if (!a) return;
    if (a->plan) c->api.destroy_descriptor(a->plan);
    pt_cudnn_graph_free(&a->graph);
    free(a);
}

static void free_plans(pt_cudnn *c)
{
    if (!c->attention) return;
    for (int i = 0; i < c->attention->n; i++) attention_plan_free(c, c->attention->kept[i]);
    free(c->attention);
    c->attention = NULL;
}

pipert_result pt_cudnn_attention_plan(pt_cudnn *c, pt_cudnn_attention_pass pass,
                                      pt_cudnn_attention_shape shape,
                                      pt_cudnn_attention_report *report)
{
    attention_plan *a = calloc(1, sizeof *a);
    if (!a) return pt_fail(PIPERT_ERR_NOMEM, "cuDNN %s: out of host memory", pass_name(pass));
    a->pass = pass;
    a->shape = shape;
    pipert_result rc = plan_pass(c, a, report);
    if (rc == PIPERT_OK && a->plan) {
        int64_t bytes = 0, count = 0;
        cudnnStatus_t status = c->api.get_attribute(a->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &count, &bytes);
        if (status) rc = pt_cudnn_fail(c, PIPERT_ERR_INTERNAL, status, "cuDNN: a plan's workspace");
        a->workspace = (size_t)bytes;
    }
    if (rc != PIPERT_OK || !a->plan) {
        attention_plan_free(c, a);
        return rc;
    }
    if (!c->attention && !(c->attention = calloc(1, sizeof *c->attention))) {
        attention_plan_free(c, a);
        return pt_fail(PIPERT_ERR_NOMEM, "cuDNN %s: out of host memory", pass_name(pass));
    }
    c->free_attention = free_plans;
    if (c->attention->n == PLANS_KEPT) { /* forget the oldest */
        attention_plan_free(c, c->attention->kept[0]);
        memmove(c->attention->kept, c->attention->kept + 1, (PLANS_KEPT - 1) * sizeof(void *));
        c->attention->n--;
    }
    c->attention->kept[c->attention->n++] = a;
    return PIPERT_OK;
}

/* The kept plan of (pass, shape), or NULL. */
static const attention_plan *kept_plan(const pt_cudnn *c, pt_cudnn_attention_pass pass,
                                       pt_cudnn_attention_shape shape)
{
    for (int i = 0; c->attention && i < c->attention->n; i++) {
        const attention_plan *a = c->attention->kept[i];
        if (a->pass == pass && !memcmp(&a->shape, &shape, sizeof shape)) return a;
    }
    return NULL;
}

/* The kept plan of (pass, shape), made now if there is none; PIPERT_ERR_UNSUPPORTED where
 * cuDNN has none (or pt_cudnn has no handle to run one). */
static pipert_result plan_for(pt_cudnn *c, pt_cudnn_attention_pass pass,
                              pt_cudnn_attention_shape shape, const attention_plan **out)
{
    if ((*out = kept_plan(c, pass, shape))) return PIPERT_OK;
    pt_cudnn_attention_report report;
    PT_TRY(pt_cudnn_attention_plan(c, pass, shape, &report));
    if ((*out = kept_plan(c, pass, shape))) return PIPERT_OK;
    return pt_fail(PIPERT_ERR_UNSUPPORTED,
                   "cuDNN %s (B %d, T %d, %d heads of %d): %d configurations, no plan%s%s%s",
                   pass_name(pass), shape.B, shape.T, shape.NH, shape.hs, report.engine_configs,
                   c->handle ? "" : " kept without a device", report.plan_reason[0] ? ": " : "",
                   report.plan_reason);
}

pipert_result pt_cudnn_attention_workspace(pt_cudnn *c, pt_cudnn_attention_pass pass,
                                           pt_cudnn_attention_shape shape, size_t *bytes)
{
    const attention_plan *a;
    PT_TRY(plan_for(c, pass, shape, &a));
    *bytes = a->workspace;
    return PIPERT_OK;
}

/* Runs the plan with the tensors' pointers by id (by-value scalars: their host values). */
static pipert_result run(pt_cudnn *c, const attention_plan *a, const int64_t *ids, void **pointers,
                         int n, void *workspace)
{
    const pt_cudnn_api *api = &c->api;
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t status = api->create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (!status)
        status = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, ids);
    if (!status)
        status = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                    n, pointers);
    if (!status)
        status = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                    &workspace);
    if (!status) status = api->finalize(pack);
    if (!status) status = api->execute(c->handle, a->plan, pack);
    pipert_result rc = status ? pt_cudnn_fail(c, PIPERT_ERR_INTERNAL, status, pass_name(a->pass))
                              : PIPERT_OK;
    if (pack) api->destroy_descriptor(pack);
    return rc;
}

pipert_result pt_cudnn_attention_forward(pt_cudnn *c, pt_cudnn_attention_shape shape, void *out,
                                         float *stats, const void *qkv, void *workspace)
{
    const attention_plan *a;
    PT_TRY(plan_for(c, PT_CUDNN_ATTENTION_FORWARD, shape, &a));
    const size_t C = (size_t)shape.NH * shape.hs, element = 2; /* bf16 */
    float scale = 1.0f / sqrtf((float)shape.hs), masked = -FLT_MAX;
    const int64_t ids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_MASKED};
    void *pointers[] = {(void *)qkv, (char *)qkv + C * element, (char *)qkv + 2 * C * element,
                        out, stats, &scale, &masked};
    return run(c, a, ids, pointers, (int)(sizeof ids / sizeof *ids), workspace);
}

pipert_result pt_cudnn_attention_backward(pt_cudnn *c, pt_cudnn_attention_shape shape, void *dqkv,
                                          const void *dout, const void *qkv, const void *out,
                                          const float *stats, float *dq_sums, void *workspace)
{
    const attention_plan *a;
    PT_TRY(plan_for(c, PT_CUDNN_ATTENTION_BACKWARD, shape, &a));
    /* dq's accumulator starts at zero each time, as cuDNN expects of it */
    const size_t sums = (size_t)shape.B * shape.T * shape.NH * shape.hs * sizeof(float);
    cudaError_t err = cudaMemsetAsync(dq_sums, 0, sums, c->stream);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_INTERNAL, "cuDNN attention backward: zeroing dq's sums: %s",
                       cudaGetErrorString(err));
    const size_t C = (size_t)shape.NH * shape.hs, element = 2; /* bf16 */
    float scale = 1.0f / sqrtf((float)shape.hs), masked = -FLT_MAX, one = 1.0f;
    const int64_t ids[] = {UID_Q,  UID_K,  UID_V,  UID_O,       UID_DO,    UID_STATS, UID_DQ,
                           UID_DK, UID_DV, UID_DQ_SUMS, UID_SCALE, UID_MASKED, UID_ONE};
    void *pointers[] = {(void *)qkv,
                        (char *)qkv + C * element,
                        (char *)qkv + 2 * C * element,
                        (void *)out,
                        (void *)dout,
                        (void *)stats,
                        dqkv,
                        (char *)dqkv + C * element,
                        (char *)dqkv + 2 * C * element,
                        dq_sums,
                        &scale,
                        &masked,
                        &one};
    return run(c, a, ids, pointers, (int)(sizeof ids / sizeof *ids), workspace);
}
