/* An operation graph of cuDNN's backend API, built op by op (cudnn_attention.c's graphs):
 *     pt_cudnn_graph g;
 *     pt_cudnn_graph_start(&g, cudnn);
 *     cudnnBackendDescriptor_t s = pt_cudnn_virtual(&g, CUDNN_DATA_FLOAT, dims, strides);
 *     pt_cudnn_matmul(&g, q, k, s);  ...
 *     PT_TRY(pt_cudnn_graph_finish(&g, "attention forward"));  // g.graph: the operation graph
 *     ...
 *     pt_cudnn_graph_free(&g);  // every descriptor it made, the graph's too
 * The first call that cuDNN refuses is remembered and the later ones do nothing, so a graph
 * reads as the mathematics does; pt_cudnn_graph_finish reports it. The graph keeps its
 * descriptors for as long as a plan made from it runs. */
#ifndef PT_KERNELS_CUDA_CUDNN_OPGRAPH_H
#define PT_KERNELS_CUDA_CUDNN_OPGRAPH_H

#include "kernels/cuda/cudnn_api.h"

#define PT_CUDNN_GRAPH_DESCRIPTORS 160
#define PT_CUDNN_GRAPH_OPS 48

typedef struct pt_cudnn_graph {
    const pt_cudnn *cudnn;
    cudnnBackendDescriptor_t made[PT_CUDNN_GRAPH_DESCRIPTORS];
    int n_made;
    cudnnBackendDescriptor_t ops[PT_CUDNN_GRAPH_OPS];
    int n_ops;
    int64_t next_virtual_uid;
    cudnnBackendDescriptor_t graph; /* after pt_cudnn_graph_finish */
    /* the first failure */
    cudnnStatus_t status;
    const char *failed; /* what was being made */
    char reason[512];
} pt_cudnn_graph;

/* A 4-d tensor's element type, dimensions and strides (in elements). */
typedef struct pt_cudnn_layout {
    cudnnDataType_t type;
    int64_t dims[4], strides[4];
} pt_cudnn_layout;

enum {
    PT_CUDNN_BY_VALUE = 1,     /* a scalar passed as a host value when the plan runs */
    PT_CUDNN_REORDER_F16 = 2,  /* stored in cuDNN's F16x16 order (its dQ accumulator) */
};

/* Virtual tensors' ids are counted from here; a graph's own (the plan's variant pack) below. */
#define PT_CUDNN_FIRST_VIRTUAL_UID 1000

void pt_cudnn_graph_start(pt_cudnn_graph *g, const pt_cudnn *cudnn);
cudnnBackendDescriptor_t pt_cudnn_tensor(pt_cudnn_graph *g, int64_t uid, pt_cudnn_layout layout,
                                         int flags);
cudnnBackendDescriptor_t pt_cudnn_virtual(pt_cudnn_graph *g, pt_cudnn_layout layout);
/* A by-value scalar of `type`, dims and strides all 1. */
cudnnBackendDescriptor_t pt_cudnn_scalar(pt_cudnn_graph *g, int64_t uid, cudnnDataType_t type);

/* y = mode(x[, b[, t]]) in `compute` precision; axis for CUDNN_POINTWISE_GEN_INDEX (else -1) */
void pt_cudnn_pointwise(pt_cudnn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t compute,
                        int axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y);
/* c = a·b over the last two dimensions, fp32 sums */
void pt_cudnn_matmul(pt_cudnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                     cudnnBackendDescriptor_t c);
/* y = op over the dimensions where y is 1 and x is not, fp32 */
void pt_cudnn_reduction(pt_cudnn_graph *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x,
                        cudnnBackendDescriptor_t y);
/* y = x seen through y's dimensions and strides */
void pt_cudnn_reshape(pt_cudnn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

/* The operation graph of every op so far, or the first failure (named with `what`). */
pipert_result pt_cudnn_graph_finish(pt_cudnn_graph *g, const char *what);
void pt_cudnn_graph_free(pt_cudnn_graph *g);

#endif
