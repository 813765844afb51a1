/* The CUDA backend beyond the kernel table: the device, its status, bf16
 * matrix products, pinned host staging, and NCCL collectives.
 *
 * The kernel table itself comes from pt_kernels_cuda() (kernels/kernels.h).
 * Every function here exists in every build: without the CUDA backend
 * (meson -Dcuda=disabled, or no nvcc) those that return a result return
 * PIPERT_ERR_UNSUPPORTED, and the others do nothing.
 *
 * Execution model. One device per process (PIPERT_CUDA_DEVICE, default 0),
 * driven from one host thread. Kernels, cuBLAS and NCCL work run in order on
 * one compute stream; host↔device transfers that may overlap with it run on a
 * copy stream, ordered against the compute stream by events. Nothing in the
 * step path synchronizes the device: the host waits only where it must read a
 * result (copy_to_host, sum, sum_squares) or when asked (synchronize).
 *
 * Errors. The table's functions return void, so a failed launch or CUDA call
 * is recorded (the first one, with the call and file:line), logged once, and
 * reported by pt_cuda_status(). A CUDA error is usually fatal to the context:
 * later results are garbage until the process restarts.
 *
 * Memory. The table's alloc hands out pieces of one cudaMalloc (the arena,
 * 256-byte aligned, bump allocation; a free returns memory when it is the
 * newest live piece, so matched create/free pairs reuse it). Its size is
 * PIPERT_CUDA_ARENA_MB, or by default the device's free memory less 2 GiB
 * (left to cuBLAS, NCCL and the CUDA context).
 *
 * Environment, read once when the backend starts:
 *   PIPERT_CUDA_DEVICE    device ordinal (default 0)
 *   PIPERT_CUDA_ARENA_MB  arena size in MiB (default: free memory − 2 GiB)
 *   PIPERT_CUDA_TF32      1: fp32 GEMMs may round their inputs to TF32
 *                         (faster, ~1e-3 relative); default 0, exact fp32
 *   PIPERT_CUDA_MMA_ATTENTION  0: a bf16 qkv's attention on the CUDA-core
 *                         kernels (exact on its values) rather than tensor
 *                         cores (attention_mma.cuh); default 1
 *   PIPERT_CUDA_CUDNN_ATTENTION  1: a bf16 qkv's attention through cuDNN's
 *                         fused attention where it has plans (attention_cudnn.cu);
 *                         default 0
 */
#ifndef PT_KERNELS_CUDA_H
#define PT_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* kernels.h and collectives.h are C headers without guards of their own */
#endif

#include "kernels/kernels.h"
#include "comm/collectives.h" /* pt_reduce_op, shared with the UCX collectives */

/* ---- the device ------------------------------------------------------------ */

typedef struct pt_cuda_device_info {
    char name[256];          /* "NVIDIA H100 80GB HBM3" */
    int ordinal;             /* cudaSetDevice ordinal */
    int major, minor;        /* compute capability */
    int sm_count;
    size_t total_bytes;      /* device memory */
    size_t arena_bytes;      /* the arena's size */
    size_t arena_used_bytes; /* its live pieces */
    size_t arena_peak_bytes; /* the most of it ever in use (scratch included) */
    int tf32;                /* fp32 GEMMs may use TF32 */
} pt_cuda_device_info;

/* Starts the backend if needed (as pt_kernels_cuda does) and describes the
 * device. PIPERT_ERR_NO_DEVICE when there is none. */
pipert_result pt_cuda_device_query(pt_cuda_device_info *out);

/* How the backend starts the next time it starts (pt_kernels_cuda): on
 * `device` (a cudaSetDevice ordinal), with an arena of `arena_bytes` (0: the
 * device's free memory less 2 GiB). PIPERT_CUDA_DEVICE and PIPERT_CUDA_ARENA_MB
 * win when set. A backend already started is not changed. */
void pt_cuda_configure(int device, size_t arena_bytes);

/* CUDA devices this process sees (0 without a driver or GPU, or in a build
 * without CUDA). Starts nothing. */
int pt_cuda_device_count(void);

/* PIPERT_OK, or the first CUDA/cuBLAS error recorded since the backend
 * started, with its message (pipert_last_error). */
pipert_result pt_cuda_status(void);

/* Waits for the device, then releases everything the backend holds (arena,
 * streams, handles): every pointer from the table's alloc becomes invalid. A
 * later pt_kernels_cuda() starts afresh. No-op when not started. */
void pt_cuda_shutdown(void);

/* Lets fp32 GEMMs use TF32 (overrides PIPERT_CUDA_TF32). */
void pt_cuda_set_tf32(int enabled);

/* Runs a bf16 qkv's attention on tensor cores (1) or CUDA cores (0);
 * overrides PIPERT_CUDA_MMA_ATTENTION. */
void pt_cuda_set_mma_attention(int enabled);

/* Runs an fp32 qkv's attention through cuBLAS's products (1, the default, where its T×T
 * scratch fits) or the CUDA-core kernels (0); overrides PIPERT_CUDA_GEMM_ATTENTION. */
void pt_cuda_set_gemm_attention(int enabled);

/* Makes the products that have an epilogue (a bias; the GELU's gradient) through cuBLASLt
 * with it fused (1, the default), or through cuBLAS and a kernel of ours (0); overrides
 * PIPERT_CUDA_LT. cuBLASLt declining a product falls back to the second way by itself. */
void pt_cuda_set_lt(int enabled);

/* Runs a bf16 qkv's attention (written in bf16, the model's bf16 path) through cuDNN's fused
 * flash attention where libcudnn.so.9 (≥ 9.8) loads and has plans for the shape (1), or on
 * attention.cu's kernels (0, the default until a GPU run measures it); overrides
 * PIPERT_CUDA_CUDNN_ATTENTION. Without cuDNN's headers at build time it does nothing. */
void pt_cuda_set_cudnn_attention(int enabled);

/* Attention passes cuDNN has run since the process started: a test's way to see it ran. */
long pt_cuda_cudnn_attention_runs(void);

/* Products cuBLASLt has made with their epilogue since the process started: a test's way to
 * see that the fused path ran rather than declined to the fallback. */
long pt_cuda_lt_products(void);

/* Questions cuBLASLt's heuristic has been asked since the process started (once per kind of
 * product: the answers are kept): a test's way to see that a product asks it once. */
long pt_cuda_lt_heuristic_queries(void);

/* Floats the CUDA attention saves for its backward (kernels.h,
 * attention_saved_floats). Pure C: in every build. */
size_t pt_cuda_attention_saved_floats(int B, int T, int C, int NH);

/* Dense tensor-core peak in FLOP/s of a device, by the name CUDA reports
 * (H100 SXM and H200: 989e12 bf16; H100 PCIe: 756e12; A100: 312e12), for
 * MFU. bf16 = 0 asks for the fp32 peak without tensor cores. 0 when unknown.
 * Pure C: works in every build, without a device. */
double pt_cuda_peak_flops(const char *device_name, int bf16);

/* ---- bf16 ------------------------------------------------------------------ */

/* pt_bf16: kernels.h. */
/* out[n] = round-to-nearest-even(inp[n]), and back (exact). */
void pt_cuda_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n);
void pt_cuda_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n);

/* matmul_forward/backward of kernels.h with bf16 operands and fp32
 * accumulation: out, dinp, dweight and dbias are fp32 (dweight accumulates
 * into the fp32 master gradient), bias is fp32. Shapes as in kernels.h. */
void pt_cuda_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                 const float *bias, int N, int C, int OC,
                                 pt_weight_layout layout);
void pt_cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                  const pt_bf16 *inp, const pt_bf16 *weight, int N, int C,
                                  int OC, pt_weight_layout layout);

/* ---- pinned host staging (for GPU tensors that cross UCX) ------------------ */

/* Page-locked host memory (cudaHostAlloc), zero-filled. */
pipert_result pt_cuda_pinned_alloc(void **out, size_t bytes, const char *what);
void pt_cuda_pinned_free(void *ptr);

/* Start a copy on the copy stream and return at once. The copy begins after
 * all work already enqueued on the compute stream (so it sees finished
 * results, and does not overwrite a buffer a queued kernel still reads);
 * compute work enqueued later waits for it. The host buffer must be pinned
 * and stay untouched until pt_cuda_copy_wait() returns. */
void pt_cuda_stage_to_host(void *dst_pinned, const void *src_device, size_t bytes);
void pt_cuda_stage_to_device(void *dst_device, const void *src_pinned, size_t bytes);

/* Blocks until every copy started on the copy stream has finished; returns
 * pt_cuda_status(). */
pipert_result pt_cuda_copy_wait(void);

/* ---- NCCL collectives -------------------------------------------------------
 * Shaped like comm/collectives.h (a group of ranks, an index in it, the
 * same pt_reduce_op), for device buffers. Every member calls the group's
 * collectives in the same order. Operations are enqueued on the compute
 * stream, after the kernels before them, and return before they complete,
 * like kernels; pt_cuda_status() and the next call report NCCL's
 * asynchronous errors. PIPERT_ERR_UNSUPPORTED when built without NCCL. */

typedef struct pt_nccl_group pt_nccl_group;

#define PT_NCCL_ID_BYTES 128
typedef struct pt_nccl_id {
    unsigned char bytes[PT_NCCL_ID_BYTES];
} pt_nccl_id;

/* One member (conventionally index 0) makes the id and sends it to the others
 * (e.g. with pt_broadcast over the UCX group); every member then creates the
 * group with it. Creation blocks until all n_ranks members have joined. */
pipert_result pt_nccl_unique_id(pt_nccl_id *out);
pipert_result pt_nccl_group_create(const pt_nccl_id *id, int n_ranks, int index,
                                   pt_nccl_group **out);
void pt_nccl_group_destroy(pt_nccl_group *g);
int pt_nccl_group_size(const pt_nccl_group *g);
int pt_nccl_group_index(const pt_nccl_group *g);

/* Copies root_index's buffer (nbytes, device memory) into every member's. */
pipert_result pt_nccl_broadcast(pt_nccl_group *g, void *buffer, size_t nbytes, int root_index);

/* data[count] (device memory) reduced in place across the group. The start
 * form runs on the group's own stream, after the compute work enqueued so far,
 * so it overlaps with compute enqueued after it; wait makes later compute
 * work wait for it (the host does not block) and releases the handle. */
typedef struct pt_nccl_allreduce_handle pt_nccl_allreduce_handle;
pipert_result pt_nccl_allreduce_start(pt_nccl_group *g, float *data, size_t count,
                                      pt_reduce_op op, pt_nccl_allreduce_handle **out);
pipert_result pt_nccl_allreduce_wait(pt_nccl_allreduce_handle *handle);
pipert_result pt_nccl_allreduce(pt_nccl_group *g, float *data, size_t count, pt_reduce_op op);

/* Point to point, nbytes of device memory; a send must meet the peer's recv.
 * sendrecv posts both at once (an exchange with peer_index, which may be this
 * member itself): two members that send to each other first would deadlock. */
pipert_result pt_nccl_send(pt_nccl_group *g, const void *buffer, size_t nbytes, int peer_index);
pipert_result pt_nccl_recv(pt_nccl_group *g, void *buffer, size_t nbytes, int peer_index);
pipert_result pt_nccl_sendrecv(pt_nccl_group *g, const void *send_buffer, void *recv_buffer,
                               size_t nbytes, int peer_index);

#ifdef __cplusplus
}
#endif

#endif
