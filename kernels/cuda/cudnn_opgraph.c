/* Operation graphs of cuDNN's backend API (cudnn_opgraph.h). */
#include "kernels/cuda/cudnn_opgraph.h"

#include <stdio.h>
#include <string.h>

#define ALIGNMENT 16 /* bytes: the tensors' pointers are at least this aligned */

void pt_cudnn_graph_start(pt_cudnn_graph *g, const pt_cudnn *cudnn)
{
    memset(g, 0, sizeof *g);
    g->cudnn = cudnn;
    g->next_virtual_uid = PT_CUDNN_FIRST_VIRTUAL_UID;
}

static bool failed(const pt_cudnn_graph *g) { return g->status != CUDNN_STATUS_SUCCESS || g->failed; }

/* Remembers the first failure: cuDNN's status and reason while making `what`. */
static void note(pt_cudnn_graph *g, cudnnStatus_t status, const char *what)
{
    if (status == CUDNN_STATUS_SUCCESS || failed(g)) return;
    g->status = status;
    g->failed = what;
    g->cudnn->api.get_last_error_string(g->reason, sizeof g->reason);
}

/* A new descriptor of `type`, kept for pt_cudnn_graph_free; NULL once anything failed. */
static cudnnBackendDescriptor_t make(pt_cudnn_graph *g, cudnnBackendDescriptorType_t type,
                                     const char *what)
{
    if (failed(g)) return NULL;
    if (g->n_made == PT_CUDNN_GRAPH_DESCRIPTORS) {
        g->failed = "a graph larger than PT_CUDNN_GRAPH_DESCRIPTORS";
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    note(g, g->cudnn->api.create_descriptor(type, &d), what);
    if (failed(g)) return NULL;
    g->made[g->n_made++] = d;
    return d;
}

static void set(pt_cudnn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what)
{
    if (failed(g) || !d) return;
    note(g, g->cudnn->api.set_attribute(d, name, type, count, value), what);
}

static void set_descriptor(pt_cudnn_graph *g, cudnnBackendDescriptor_t d,
                           cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
                           const char *what)
{
    if (value) set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
}

static void finalize(pt_cudnn_graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (failed(g) || !d) return;
    note(g, g->cudnn->api.finalize(d), what);
}

cudnnBackendDescriptor_t pt_cudnn_tensor(pt_cudnn_graph *g, int64_t uid, pt_cudnn_layout layout,
                                         int flags)
{
    const char *what = "a tensor";
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const int64_t alignment = ALIGNMENT;
    const bool is_virtual = uid >= PT_CUDNN_FIRST_VIRTUAL_UID, by_value = flags & PT_CUDNN_BY_VALUE;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &layout.type, what);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, layout.dims, what);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, layout.strides, what);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    if (is_virtual) set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    if (by_value) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    if (flags & PT_CUDNN_REORDER_F16) {
        const cudnnBackendTensorReordering_t order = CUDNN_TENSOR_REORDERING_F16x16;
        set(g, t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &order,
            what);
    }
    finalize(g, t, what);
    return t;
}

cudnnBackendDescriptor_t pt_cudnn_virtual(pt_cudnn_graph *g, pt_cudnn_layout layout)
{
    return pt_cudnn_tensor(g, g->next_virtual_uid++, layout, 0);
}

cudnnBackendDescriptor_t pt_cudnn_scalar(pt_cudnn_graph *g, int64_t uid, cudnnDataType_t type)
{
    const pt_cudnn_layout one = {type, {1, 1, 1, 1}, {1, 1, 1, 1}};
    return pt_cudnn_tensor(g, uid, one, PT_CUDNN_BY_VALUE);
}

static void add_op(pt_cudnn_graph *g, cudnnBackendDescriptor_t op)
{
    if (failed(g) || !op) return;
    if (g->n_ops == PT_CUDNN_GRAPH_OPS) {
        g->failed = "a graph of more than PT_CUDNN_GRAPH_OPS operations";
        return;
    }
    g->ops[g->n_ops++] = op;
}

/* One operation's input or output: the attribute that names it, and its descriptor (NULL:
 * not set). */
typedef struct operand {
    cudnnBackendAttributeName_t attribute;
    cudnnBackendDescriptor_t descriptor;
} operand;

/* An operation of `type` with its operands, finalized and added to the graph. */
static void operation(pt_cudnn_graph *g, cudnnBackendDescriptorType_t type, const char *what,
                      const operand *operands, int n)
{
    cudnnBackendDescriptor_t op = make(g, type, what);
    for (int i = 0; i < n; i++)
        set_descriptor(g, op, operands[i].attribute, operands[i].descriptor, what);
    finalize(g, op, what);
    add_op(g, op);
}

/* A descriptor of `type` with one attribute of fp32 ("the sums' type"), finalized. */
static cudnnBackendDescriptor_t summing(pt_cudnn_graph *g, cudnnBackendDescriptorType_t type,
                                        cudnnBackendAttributeName_t sums_type, const char *what)
{
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t d = make(g, type, what);
    set(g, d, sums_type, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
    return d;
}

void pt_cudnn_pointwise(pt_cudnn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                        int axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y)
{
    const char *what = "a pointwise operation";
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
    const int64_t axis64 = axis;
    if (axis >= 0) set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis64, what);
    finalize(g, pw, what);
    const operand operands[] = {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                                {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
                                {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                                {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
                                {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}};
    operation(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what, operands, 5);
}

void pt_cudnn_matmul(pt_cudnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                     cudnnBackendDescriptor_t c)
{
    const char *what = "a matrix product";
    cudnnBackendDescriptor_t mm =
        summing(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, what);
    finalize(g, mm, what);
    const operand operands[] = {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                                {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                                {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                                {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}};
    operation(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what, operands, 4);
}

void pt_cudnn_reduction(pt_cudnn_graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                        cudnnBackendDescriptor_t y)
{
    const char *what = "a reduction";
    cudnnBackendDescriptor_t r =
        summing(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, what);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, what);
    finalize(g, r, what);
    const operand operands[] = {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                                {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                                {CUDNN_ATTR_OPERATION_REDUCTION_DESC, r}};
    operation(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what, operands, 3);
}

void pt_cudnn_reshape(pt_cudnn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    const operand operands[] = {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x},
                                {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}};
    operation(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "a reshape", operands, 2);
}

pipert_result pt_cudnn_graph_finish(pt_cudnn_graph *g, const char *what)
{
    cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the graph");
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops,
        "the graph");
    if (g->cudnn->handle)
        set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->cudnn->handle,
            "the graph");
    finalize(g, graph, "the graph");
    if (!failed(g)) {
        g->graph = graph;
        return PIPERT_OK;
    }
    if (g->status == CUDNN_STATUS_SUCCESS)
        return pt_fail(PIPERT_ERR_INTERNAL, "cuDNN %s: %s", what, g->failed);
    return pt_fail(PIPERT_ERR_UNSUPPORTED, "cuDNN %s: %s refused: %s%s%s%s", what, g->failed,
                   g->cudnn->api.get_error_string(g->status), g->reason[0] ? " (" : "",
                   g->reason, g->reason[0] ? ")" : "");
}

void pt_cudnn_graph_free(pt_cudnn_graph *g)
{
    for (int i = g->n_made - 1; i >= 0; i--) g->cudnn->api.destroy_descriptor(g->made[i]);
    g->n_made = g->n_ops = 0;
    g->graph = NULL;
}
