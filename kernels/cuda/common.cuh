/* Private to kernels/cuda/: the one device context, error recording, the
 * arena's scratch space, and the kernel entry points each file gives the
 * table in backend.cu. Shapes and semantics are those of kernels/kernels.h;
 * every entry runs on the compute stream and returns before the work is done.
 */
#ifndef PT_KERNELS_CUDA_COMMON_CUH
#define PT_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"

extern "C" {
#include "runtime/error.h"
}

/* ---- the context ------------------------------------------------------------ */

/* One live piece of the arena. */
struct pt_cuda_arena_piece {
    size_t offset, bytes;
    bool live;
};

/* The device memory arena: one cudaMalloc, handed out bottom-up. */
struct pt_cuda_arena {
    char *base;
    size_t capacity, top;       /* bytes; [0, top) is in use or freed-but-buried */
    size_t live_bytes;
    size_t peak;                /* the highest top reached, scratch included */
    pt_cuda_arena_piece *pieces; /* allocation order */
    int n_pieces, pieces_capacity;
};

/* Blocks of the deterministic two-stage reductions (sum, sum_squares). */
#define PT_CUDA_REDUCE_BLOCKS 512

struct pt_cuda_context {
    bool ready;
    int device;
    cudaDeviceProp prop;
    cudaStream_t compute, copy;
    cudaEvent_t compute_mark; /* recorded on compute before a copy-stream transfer */
    cudaEvent_t copy_mark;    /* recorded on copy after it; compute waits on it */
    cublasHandle_t cublas;
    cublasLtHandle_t cublas_lt; /* the products with an epilogue (gemm_lt.cu) */
    void *lt_workspace;         /* cuBLASLt's, LT_WORKSPACE_BYTES, outside the arena */
    bool lt;                    /* products with an epilogue through cuBLASLt (pt_cuda_set_lt) */
    bool tf32;
    bool mma_attention; /* a bf16 qkv's attention on tensor cores (attention_mma.cu) */
    bool gemm_attention; /* an fp32 qkv's attention through cuBLAS (attention_gemm.cu) */
    bool cudnn_attention; /* a bf16 qkv's through cuDNN where it has plans (attention_cudnn.cu) */
    pt_cuda_arena arena;
    double *host_partials; /* pinned [PT_CUDA_REDUCE_BLOCKS] */

    /* the first error since start-up */
    pipert_result error;
    char error_message[512];
};

/* The process's one device context (backend.cu). */
extern pt_cuda_context pt_cuda;

/* ---- errors ------------------------------------------------------------------ */

/* Records `what` failed with `detail` (the first failure only; logged once). */
void pt_cuda_record_error(const char *what, const char *detail, const char *file, int line);

/* true when err is cudaSuccess; records the failure otherwise. */
bool pt_cuda_ok(cudaError_t err, const char *what, const char *file, int line);
bool pt_cublas_ok(cublasStatus_t status, const char *what, const char *file, int line);

#define PT_CUDA_CHECK(call) pt_cuda_ok((call), #call, __FILE__, __LINE__)
#define PT_CUBLAS_CHECK(call) pt_cublas_ok((call), #call, __FILE__, __LINE__)
/* After a <<<...>>> launch: reports a bad configuration at once. */
#define PT_CUDA_LAUNCHED(kernel) pt_cuda_ok(cudaGetLastError(), kernel, __FILE__, __LINE__)

/* ---- memory (memory.cu) ---------------------------------------------------- */

pipert_result pt_cuda_arena_create(size_t capacity);
void pt_cuda_arena_destroy(void);

/* Scratch space for one kernel-table call, taken from the top of the arena
 * and given back before the call returns (later work on the compute stream
 * is ordered after the kernels that used it, so it can be reused at once):
 *     size_t mark = pt_cuda_scratch_mark();
 *     float *tmp = (float *)pt_cuda_scratch(bytes, "what");  // NULL: recorded error
 *     ... launches ...
 *     pt_cuda_scratch_release(mark);
 */
size_t pt_cuda_scratch_mark(void);
/* Whether pt_cuda_scratch(bytes) would succeed now: for a kernel that has another way */
bool pt_cuda_scratch_fits(size_t bytes);
void *pt_cuda_scratch(size_t bytes, const char *what);
void pt_cuda_scratch_release(size_t mark);

pipert_result pt_cuda_alloc(void **out, size_t bytes, const char *what);
void pt_cuda_free(void *ptr);
void pt_cuda_zero(void *ptr, size_t bytes);
void pt_cuda_copy_to_device(void *dst, const void *src_host, size_t bytes);
void pt_cuda_copy_to_host(void *dst_host, const void *src, size_t bytes);
void pt_cuda_copy(void *dst, const void *src, size_t bytes);
void pt_cuda_synchronize(void);

/* ---- memory peers copy from (peer.cu) -------------------------------------- */

extern "C" pipert_result pt_cuda_peer_export(const void *ptr, pt_peer_memory *out);
extern "C" pipert_result pt_cuda_peer_copy(void *dst, const pt_peer_memory *src, size_t bytes);
/* Closes the peers' arenas this process opened (before the context goes). */
extern "C" void pt_cuda_peer_close(void);

/* ---- launch helpers ---------------------------------------------------------- */

#define PT_CUDA_THREADS 256

/* Blocks for a grid-stride loop over n elements: enough to fill the device,
 * no more than needed. */
static inline unsigned pt_cuda_blocks_for(size_t n)
{
    size_t needed = (n + PT_CUDA_THREADS - 1) / PT_CUDA_THREADS;
    size_t cap = (size_t)(pt_cuda.prop.multiProcessorCount > 0 ? pt_cuda.prop.multiProcessorCount
                                                               : 1) * 32;
    size_t blocks = needed < cap ? needed : cap;
    return (unsigned)(blocks > 0 ? blocks : 1);
}

static inline int pt_cuda_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* for (i = this thread's first element; i < n; i += every thread of the grid) */
#define PT_GRID_STRIDE_LOOP(i, n)                                                                  \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* kernel<<<blocks for n, PT_CUDA_THREADS>>>(args...) on the compute stream,
 * for kernels that run a PT_GRID_STRIDE_LOOP over n; nothing for n = 0. */
#define PT_LAUNCH_ELEMENTWISE(kernel, n, ...)                                                      \
    do {                                                                                           \
        if ((n) == 0) break;                                                                       \
        kernel<<<pt_cuda_blocks_for(n), PT_CUDA_THREADS, 0, pt_cuda.compute>>>(__VA_ARGS__);       \
        PT_CUDA_LAUNCHED(#kernel);                                                                 \
    } while (0)

/* ---- the kernels, by file ------------------------------------------------------ */

/* encoder.cu */
void pt_cuda_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                             int B, int T, int C);
void pt_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                              int B, int T, int C);

/* layernorm.cu */
void pt_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C);
void pt_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C);
void pt_cuda_layernorm_backward_bf16(float *dinp, pt_bf16 *dinp_rounded, float *dweight,
                                     float *dbias, const float *dout, const float *inp,
                                     const float *weight, const float *mean, const float *rstd,
                                     int N, int C);

/* matmul.cu */
void pt_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC, pt_weight_layout layout);
void pt_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC,
                             pt_weight_layout layout);

/* layernorm.cu */
void pt_cuda_layernorm_forward_bf16(pt_bf16 *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, int N, int C);
void pt_cuda_residual_layernorm_forward(float *residual, float *out, float *mean, float *rstd,
                                        const float *a, const float *b, const float *weight,
                                        const float *bias, int N, int C);
void pt_cuda_residual_layernorm_forward_bf16(float *residual, pt_bf16 *out, float *mean,
                                             float *rstd, const float *a, const float *b,
                                             const float *weight, const float *bias, int N, int C);

/* elementwise.cu: cuda.h's casts (C entry points), declared here too for the files here, so
 * that each calls them by a declaration of this header's (tests/cuda_host's translation puts
 * this header's declarations, and its own casts, in a namespace of their own) */
extern "C" void pt_cuda_cast_to_bf16(pt_bf16 *out, const float *inp, size_t n);
extern "C" void pt_cuda_cast_from_bf16(float *out, const pt_bf16 *inp, size_t n);

/* elementwise.cu: what matmul.cu does after cuBLAS where cuBLASLt's epilogue does not */
/* out's rows ld_out apart, inp's dense */
void pt_cuda_add_bias_to_bf16(pt_bf16 *out, const float *inp, const float *bias, int N, int OC,
                              int ld_out);
void pt_cuda_gelu_backward_to_bf16(pt_bf16 *dinp, const pt_bf16 *inp, const float *dout, size_t n);

/* matmul.cu, beside cuda.h's bf16 products */
void pt_cuda_matmul_backward_bf16_dinp_written(float *dinp, float *dweight, float *dbias,
                                               const pt_bf16 *dout, const pt_bf16 *inp,
                                               const pt_bf16 *weight, int N, int C, int OC,
                                               int ld_dout, pt_weight_layout layout);
void pt_cuda_matmul_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, const pt_bf16 *inp,
                                         const pt_bf16 *weight, const float *bias, int N, int C,
                                         int OC, int ld_out, pt_weight_layout layout);
void pt_cuda_matmul_gelu_backward_bf16(pt_bf16 *dpre, float *scratch, float *dweight,
                                       float *dbias, const pt_bf16 *dout, const pt_bf16 *inp,
                                       const pt_bf16 *pre, const pt_bf16 *weight, int N, int C,
                                       int OC, pt_weight_layout layout);

/* ---- products with an epilogue (gemm_lt.cu) ---------------------------------- */

/* One operand or result of a GEMM, as its row-major buffer. */
struct pt_gemm_operand {
    const void *data;
    int ld; /* row length of the row-major buffer */
};
struct pt_gemm_result {
    void *data;
    cudaDataType type;
    int ld; /* row stride, ≥ the columns written */
};

/* What cuBLASLt applies to a product's fp32 sums before it stores them (matmul.cu's products):
 * + bias[col] (fp32), or · gelu'(aux[row][col]) (aux bf16, a row-major buffer like D); or what
 * it also writes from an operand as it reads it: the bias gradient, Σ_k op(A)[row][k] (A's,
 * rows_d long) or Σ_k op(B)[k][col] (B's, cols_d long), fp32, written (not added). */
enum pt_gemm_epilogue_kind {
    PT_GEMM_BIAS,
    PT_GEMM_GELU_GRADIENT,
    PT_GEMM_BIAS_GRADIENT_A,
    PT_GEMM_BIAS_GRADIENT_B,
    PT_GEMM_EPILOGUE_KINDS
};
struct pt_gemm_epilogue {
    pt_gemm_epilogue_kind kind;
    const float *bias;         /* PT_GEMM_BIAS */
    const __nv_bfloat16 *aux;  /* PT_GEMM_GELU_GRADIENT */
    float *bias_gradient;      /* PT_GEMM_BIAS_GRADIENT_A, _B */
};

pipert_result pt_cuda_lt_start(void); /* the handle and workspace, once per context */
void pt_cuda_lt_stop(void);

/* D[rows_d, cols_d] (row-major, of d_type) = epilogue(op(A)·op(B) + β·D), inner dimension k, A
 * and B of `type`, as matmul.cu's gemm_row_major_to. false, with nothing launched, when the
 * products with an epilogue are off (pt_cuda_set_lt) or cuBLASLt has no algorithm for this
 * one: the caller makes it another way. */
bool pt_cuda_gemm_lt(pt_gemm_result D, int rows_d, int cols_d, int k,
                     pt_gemm_operand A, cublasOperation_t op_a, pt_gemm_operand B,
                     cublasOperation_t op_b, cudaDataType type, const pt_gemm_epilogue &epilogue,
                     float beta = 0.0f);

/* attention.cu */
pipert_result pt_cuda_attention_setup(void); /* shared-memory limits, once per context */
void pt_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH);
void pt_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH);
void pt_cuda_attention_forward_bf16(float *out, float *att, const pt_bf16 *qkv, int B, int T,
                                    int C, int NH);
void pt_cuda_attention_backward_bf16(float *dqkv, const float *dout, const pt_bf16 *qkv,
                                     const float *att, int B, int T, int C, int NH);
void pt_cuda_attention_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, float *att,
                                            const pt_bf16 *qkv, int B, int T, int C, int NH);
void pt_cuda_attention_backward_bf16_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                             const pt_bf16 *qkv, const float *att, int B, int T,
                                             int C, int NH);

/* attention_mma.cu: the tensor-core kernels attention.cu hands a bf16 qkv to when they take it */
pipert_result pt_cuda_attention_mma_setup(void);
bool pt_cuda_attention_mma_takes(const void *qkv, int C, int NH);
void pt_cuda_attention_mma_forward(float *out, float *lse, float *o_saved,
                                   const __nv_bfloat16 *qkv, int B, int T, int C, int NH);
void pt_cuda_attention_mma_forward_to_bf16(pt_bf16 *out, float *lse, float *o_saved,
                                           const __nv_bfloat16 *qkv, int B, int T, int C, int NH);
/* the backward from the forward's saved state (lse, o_saved): D and a bf16 dO in scratch */
void pt_cuda_attention_mma_backward(float *dqkv, const float *dout, const __nv_bfloat16 *qkv,
                                    const float *lse, const float *o_saved, int B, int T, int C,
                                    int NH);
void pt_cuda_attention_mma_backward_to_bf16(pt_bf16 *dqkv, const float *dout,
                                            const __nv_bfloat16 *qkv, const float *lse,
                                            const float *o_saved, int B, int T, int C, int NH);

/* attention_cudnn.cu (built with cuDNN's headers, PT_HAVE_CUDNN): a bf16 qkv's attention written in
 * bf16 through cuDNN; false, with nothing done, where it does not take it (off, no libcudnn, no
 * plan for the shape): attention.cu's kernels then. The backward goes as the forward went. */
bool pt_cuda_attention_cudnn_forward_to_bf16(pt_bf16 *out, float *att, const pt_bf16 *qkv, int B,
                                             int T, int C, int NH);
bool pt_cuda_attention_cudnn_backward_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                              const pt_bf16 *qkv, const float *att, int B, int T,
                                              int C, int NH);
extern "C" void pt_cuda_cudnn_attention_close(void); /* before the context goes */

/* attention_gemm.cu: an fp32 qkv's attention through cuBLAS, where attention.cu hands it */
bool pt_cuda_attention_gemm_takes(int B, int T, int C, int NH, bool backward);
void pt_cuda_attention_gemm_forward(float *out, float *lse, float *o_saved, const float *qkv,
                                    int B, int T, int C, int NH);
void pt_cuda_attention_gemm_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *lse, const float *delta, int B, int T, int C,
                                     int NH);

/* elementwise.cu */
void pt_cuda_gelu_forward(float *out, const float *inp, size_t n);
void pt_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void pt_cuda_gelu_forward_bf16(pt_bf16 *out, const pt_bf16 *inp, size_t n);
void pt_cuda_gelu_backward_bf16(float *dinp, const pt_bf16 *inp, const float *dout, size_t n);
void pt_cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
void pt_cuda_scale(float *x, float factor, size_t n);
void pt_cuda_gather(float *out, const float *src, const uint32_t *index, size_t n);
void pt_cuda_scatter(float *dst, const uint32_t *index, const float *values, size_t n);

/* reduce.cu */
double pt_cuda_sum_squares(const float *x, size_t n);
double pt_cuda_sum(const float *x, size_t n);

/* crossentropy.cu */
void pt_cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                  int N, int V);
void pt_cuda_crossentropy_forward_backward(float *losses, float *logits, const int32_t *targets,
                                           int N, int V, float dloss);
void pt_cuda_crossentropy_forward_bf16(float *losses, const pt_bf16 *logits,
                                       const int32_t *targets, int N, int V, int ld);
void pt_cuda_crossentropy_forward_backward_bf16(float *losses, pt_bf16 *logits,
                                                const int32_t *targets, int N, int V, int ld,
                                                float dloss);

/* adam.cu */
void pt_cuda_adam_update(float *param, const float *grad, float *m, float *v,
                         const pt_param_region *regions, int n_regions,
                         const pt_adam_coeffs *decayed, const pt_adam_coeffs *plain,
                         float grad_scale);
void pt_cuda_adam_extrapolate(float *out, const float *param, const float *m, const float *v,
                              size_t n, const pt_adam_coeffs *coeffs, float steps);
void pt_cuda_delay_compensate(float *grad, const float *now, const float *used, const float *v,
                              size_t n, const pt_adam_coeffs *coeffs, float lambda);
void pt_cuda_secant_compensate(float *grad, const float *now, const float *used, float *prev_grad,
                               float *prev_used, float *num, float *den, const float *v, size_t n,
                               const pt_secant_coeffs *coeffs);

#endif
