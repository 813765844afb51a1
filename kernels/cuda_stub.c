/* The CUDA backend's entry points for builds without it (meson
 * -Dcuda=disabled, or no nvcc found): asking for the backend is a clear
 * error, not a crash, and the rest of kernels/cuda/cuda.h links and fails the
 * same way (kernels/cuda/device_peak.c, pure C, is in every build). */
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "runtime/error.h"

static pipert_result no_cuda(void)
{
    return pt_fail(PIPERT_ERR_UNSUPPORTED,
                   "this build has no CUDA backend (rebuild with meson -Dcuda=enabled on a "
                   "machine with the CUDA toolkit), use runtime.device=\"cpu\"");
}

pipert_result pt_kernels_cuda(const pt_kernels **out)
{
    *out = NULL;
    return no_cuda();
}

pipert_result pt_cuda_device_query(pt_cuda_device_info *out)
{
    memset(out, 0, sizeof *out);
    return no_cuda();
}

pipert_result pt_cuda_status(void) { return no_cuda(); }
void pt_cuda_shutdown(void) {}
void pt_cuda_set_tf32(int enabled) {}
void pt_cuda_set_mma_attention(int enabled) {}
void pt_cuda_set_lt(int enabled) {}
long pt_cuda_lt_products(void) { return 0; }
long pt_cuda_lt_heuristic_queries(void) { return 0; }
void pt_cuda_set_cudnn_attention(int enabled) {}
long pt_cuda_cudnn_attention_runs(void) { return 0; }
void pt_cuda_set_gemm_attention(int enabled) {}
void pt_cuda_configure(int device, size_t arena_bytes) {}
int pt_cuda_device_count(void) { return 0; }

/* Without a backend there is no device memory to pass: these do nothing. */
void pt_cuda_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n) {}
void pt_cuda_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n) {}
void pt_cuda_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                 const float *bias, int N, int C, int OC, pt_weight_layout layout)
{
}
void pt_cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                  const pt_bf16 *inp, const pt_bf16 *weight, int N, int C, int OC,
                                  pt_weight_layout layout)
{
}
void pt_cuda_stage_to_host(void *dst_pinned, const void *src_device, size_t bytes) {}
void pt_cuda_stage_to_device(void *dst_device, const void *src_pinned, size_t bytes) {}

pipert_result pt_cuda_pinned_alloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    return no_cuda();
}
void pt_cuda_pinned_free(void *ptr) {}
pipert_result pt_cuda_copy_wait(void) { return no_cuda(); }

pipert_result pt_nccl_unique_id(pt_nccl_id *out) { return no_cuda(); }
pipert_result pt_nccl_group_create(const pt_nccl_id *id, int n_ranks, int index,
                                   pt_nccl_group **out)
{
    *out = NULL;
    return no_cuda();
}
void pt_nccl_group_destroy(pt_nccl_group *g) {}
int pt_nccl_group_size(const pt_nccl_group *g) { return 0; }
int pt_nccl_group_index(const pt_nccl_group *g) { return -1; }
pipert_result pt_nccl_broadcast(pt_nccl_group *g, void *buffer, size_t nbytes, int root_index)
{
    return no_cuda();
}
pipert_result pt_nccl_allreduce_start(pt_nccl_group *g, float *data, size_t count, pt_reduce_op op,
                                      pt_nccl_allreduce_handle **out)
{
    *out = NULL;
    return no_cuda();
}
pipert_result pt_nccl_allreduce_wait(pt_nccl_allreduce_handle *handle) { return no_cuda(); }
pipert_result pt_nccl_allreduce(pt_nccl_group *g, float *data, size_t count, pt_reduce_op op)
{
    return no_cuda();
}
pipert_result pt_nccl_send(pt_nccl_group *g, const void *buffer, size_t nbytes, int peer_index)
{
    return no_cuda();
}
pipert_result pt_nccl_recv(pt_nccl_group *g, void *buffer, size_t nbytes, int peer_index)
{
    return no_cuda();
}
pipert_result pt_nccl_sendrecv(pt_nccl_group *g, const void *send_buffer, void *recv_buffer,
                               size_t nbytes, int peer_index)
{
    return no_cuda();
}
