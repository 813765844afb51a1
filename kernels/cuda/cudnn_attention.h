/* Causal self-attention of a bf16 qkv through cuDNN's fused flash attention: the operation
 * graphs of its backend API that cuDNN recognises as scaled dot-product attention (the
 * forward and the backward), a plan for each shape, and running them on pipert's tensors.
 *
 * Tensors, as attention_mma.cuh's: qkv [B, T, 3C] bf16 (q, k, v of a position side by side,
 * head h at columns h·hs of each), out [B, T, C] bf16, dqkv as qkv, dout as out; stats [B, NH,
 * T] fp32 (each row's log-sum-exp of the scaled scores, natural log: what the backward needs of
 * the forward). The scale is 1/√hs; position t attends to positions ≤ t.
 *
 * Naive reading, per batch b and head h, with q, k, v, o, do the [T, hs] slices:
 *   forward:  S = q·kᵀ/√hs, masked (s > t: −∞);  stats_t = log Σ_s exp(S_ts);
 *             P = exp(S − stats);  o = P·v
 *   backward: D_t = Σ_d do_td·o_td;  dP = do·vᵀ;  dS = P∘(dP − D)/√hs;
 *             dq = dS·k;  dk = dSᵀ·q;  dv = Pᵀ·do
 * Private to kernels/cuda/ and its tests. */
#ifndef PT_KERNELS_CUDA_CUDNN_ATTENTION_H
#define PT_KERNELS_CUDA_CUDNN_ATTENTION_H

#include "kernels/cuda/cudnn_api.h"

typedef struct pt_cudnn_attention_shape {
    int B, T, NH, hs;
} pt_cudnn_attention_shape;

typedef enum pt_cudnn_attention_pass {
    PT_CUDNN_ATTENTION_FORWARD,
    PT_CUDNN_ATTENTION_BACKWARD,
} pt_cudnn_attention_pass;

/* What planning one pass found. */
typedef struct pt_cudnn_attention_report {
    int engine_configs;        /* cuDNN's heuristics' configurations that take the graph */
    int engine;                /* the global index of the first one's engine (−1: none) */
    cudnnStatus_t plan_status; /* its execution plan's finalization: compiled and loaded, or not */
    char plan_reason[512];     /* cuDNN's reason where it was not */
} pt_cudnn_attention_report;

/* Builds the pass's graph and tries cuDNN's configurations for it in the heuristics' order,
 * the report saying what it found. With a handle (pt_cudnn_open) the first plan that
 * finalizes is kept for the shape; with a device description (pt_cudnn_open_described) the
 * plans are compiled for that device and kept nowhere (loading them needs it). An error only
 * where the graph itself was refused (a bug of ours: the message says where). */
pipert_result pt_cudnn_attention_plan(pt_cudnn *c, pt_cudnn_attention_pass pass,
                                      pt_cudnn_attention_shape shape,
                                      pt_cudnn_attention_report *report);

/* Bytes of device workspace the pass's plan needs at this shape: PIPERT_ERR_UNSUPPORTED where
 * cuDNN has no plan for it. */
pipert_result pt_cudnn_attention_workspace(pt_cudnn *c, pt_cudnn_attention_pass pass,
                                           pt_cudnn_attention_shape shape, size_t *bytes);

/* Run on the handle's stream; workspace: pt_cudnn_attention_workspace's bytes, 256-byte
 * aligned. Pointers are device pointers, 16-byte aligned; dq_sums [B, T, C] fp32, the
 * backward's own (it zeroes it, and cuDNN sums dq there in an order of its own). */
pipert_result pt_cudnn_attention_forward(pt_cudnn *c, pt_cudnn_attention_shape shape, void *out,
                                         float *stats, const void *qkv, void *workspace);
pipert_result pt_cudnn_attention_backward(pt_cudnn *c, pt_cudnn_attention_shape shape, void *dqkv,
                                          const void *dout, const void *qkv, const void *out,
                                          const float *stats, float *dq_sums, void *workspace);

#endif
