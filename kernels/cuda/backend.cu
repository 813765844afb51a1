/* The CUDA backend: starting the device (streams, events, cuBLAS, the
 * arena), recording errors, and the pt_kernels table gathered from the other
 * files of this directory. See kernels/cuda/cuda.h for the execution model
 * and docs/CUDA.md for the design. */
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "runtime/log.h"
}

#define DEFAULT_RESERVE_BYTES ((size_t)2 << 30) /* left outside the arena */
#define MIN_COMPUTE_CAPABILITY 80              /* the build targets sm_80 and sm_90 */

pt_cuda_context pt_cuda;

static std::mutex start_lock;
static int tf32_request = -1; /* pt_cuda_set_tf32: -1 none, else overrides PIPERT_CUDA_TF32 */
static int mma_attention_request = -1; /* pt_cuda_set_mma_attention, over PIPERT_CUDA_MMA_ATTENTION */
static int lt_request = -1;            /* pt_cuda_set_lt, over PIPERT_CUDA_LT */
static int gemm_attention_request = -1; /* pt_cuda_set_gemm_attention, over PIPERT_CUDA_GEMM_ATTENTION */
static int cudnn_attention_request = -1; /* pt_cuda_set_cudnn_attention, over PIPERT_CUDA_CUDNN_ATTENTION */

/* ---- errors ------------------------------------------------------------------------ */

void pt_cuda_record_error(const char *what, const char *detail, const char *file, int line)
{
    if (pt_cuda.error != PIPERT_OK) return; /* keep the first: later ones are its echoes */
    const char *base = strrchr(file, '/');
    snprintf(pt_cuda.error_message, sizeof pt_cuda.error_message, "CUDA: %s failed at %s:%d: %s",
             what, base ? base + 1 : file, line, detail);
    pt_cuda.error = PIPERT_ERR_INTERNAL;
    pt_error("%s", pt_cuda.error_message);
}

bool pt_cuda_ok(cudaError_t err, const char *what, const char *file, int line)
{
    if (err == cudaSuccess) return true;
    char detail[256];
    snprintf(detail, sizeof detail, "%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    pt_cuda_record_error(what, detail, file, line);
    return false;
}

bool pt_cublas_ok(cublasStatus_t status, const char *what, const char *file, int line)
{
    if (status == CUBLAS_STATUS_SUCCESS) return true;
    pt_cuda_record_error(what, cublasGetStatusString(status), file, line);
    return false;
}

extern "C" pipert_result pt_cuda_status(void)
{
    if (pt_cuda.error == PIPERT_OK) return PIPERT_OK;
    return pt_fail(pt_cuda.error, "%s", pt_cuda.error_message);
}

/* ---- environment ------------------------------------------------------------------- */

/* A non-negative integer from the environment, or `fallback` when unset. */
static pipert_result env_integer(const char *name, long long fallback, long long *out)
{
    const char *text = getenv(name);
    *out = fallback;
    if (!text || !*text) return PIPERT_OK;
    char *end;
    long long value = strtoll(text, &end, 10);
    if (*end || value < 0)
        return pt_fail(PIPERT_ERR_CONFIG, "%s=\"%s\": expected a non-negative integer", name, text);
    *out = value;
    return PIPERT_OK;
}

/* ---- starting and stopping ------------------------------------------------------------ */

/* pt_cuda_configure's choice for the next start; the environment wins. */
static struct {
    int device;
    size_t arena_bytes; /* 0: free memory less DEFAULT_RESERVE_BYTES */
} configured;

extern "C" void pt_cuda_configure(int device, size_t arena_bytes)
{
    std::lock_guard<std::mutex> guard(start_lock);
    configured.device = device > 0 ? device : 0;
    configured.arena_bytes = arena_bytes;
}

extern "C" int pt_cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

static pipert_result choose_device(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear it: this is an answer, not a failure of ours */
        return pt_fail(PIPERT_ERR_NO_DEVICE,
                       "no CUDA device: cudaGetDeviceCount says \"%s\" (%s); is there an NVIDIA "
                       "GPU and driver on this machine?",
                       cudaGetErrorString(err), cudaGetErrorName(err));
    }
    if (count == 0) return pt_fail(PIPERT_ERR_NO_DEVICE, "no CUDA device: cudaGetDeviceCount found none");
    long long ordinal;
    PT_TRY(env_integer("PIPERT_CUDA_DEVICE", configured.device, &ordinal));
    if (ordinal >= count)
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_CUDA_DEVICE=%lld: this machine has %d CUDA devices",
                       ordinal, count);
    pt_cuda.device = (int)ordinal;
    if ((err = cudaSetDevice(pt_cuda.device)) != cudaSuccess ||
        (err = cudaGetDeviceProperties(&pt_cuda.prop, pt_cuda.device)) != cudaSuccess)
        return pt_fail(PIPERT_ERR_NO_DEVICE, "CUDA device %d: %s", pt_cuda.device,
                       cudaGetErrorString(err));
    int capability = 10 * pt_cuda.prop.major + pt_cuda.prop.minor;
    if (capability < MIN_COMPUTE_CAPABILITY)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "CUDA device %d (%s) has compute capability %d.%d; pipert's kernels are built "
                       "for 8.0 (A100) and 9.0 (H100) and newer",
                       pt_cuda.device, pt_cuda.prop.name, pt_cuda.prop.major, pt_cuda.prop.minor);
    return PIPERT_OK;
}

static pipert_result create_streams_and_handles(void)
{
    cudaError_t err;
    if ((err = cudaStreamCreateWithFlags(&pt_cuda.compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&pt_cuda.copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaEventCreateWithFlags(&pt_cuda.compute_mark, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaEventCreateWithFlags(&pt_cuda.copy_mark, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaHostAlloc((void **)&pt_cuda.host_partials, PT_CUDA_REDUCE_BLOCKS * sizeof(double),
                             cudaHostAllocDefault)) != cudaSuccess)
        return pt_fail(PIPERT_ERR_INTERNAL, "CUDA device %d: creating streams and events: %s",
                       pt_cuda.device, cudaGetErrorString(err));
    cublasStatus_t status = cublasCreate(&pt_cuda.cublas);
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasSetStream(pt_cuda.cublas, pt_cuda.compute);
    if (status != CUBLAS_STATUS_SUCCESS)
        return pt_fail(PIPERT_ERR_INTERNAL, "cuBLAS: %s", cublasGetStatusString(status));
    long long tf32;
    PT_TRY(env_integer("PIPERT_CUDA_TF32", 0, &tf32));
    pt_cuda.tf32 = tf32_request >= 0 ? tf32_request != 0 : tf32 != 0;
    long long mma_attention;
    PT_TRY(env_integer("PIPERT_CUDA_MMA_ATTENTION", 1, &mma_attention));
    pt_cuda.mma_attention =
        mma_attention_request >= 0 ? mma_attention_request != 0 : mma_attention != 0;
    long long gemm_attention;
    PT_TRY(env_integer("PIPERT_CUDA_GEMM_ATTENTION", 1, &gemm_attention));
    pt_cuda.gemm_attention =
        gemm_attention_request >= 0 ? gemm_attention_request != 0 : gemm_attention != 0;
    long long cudnn_attention; /* opt-in until a GPU run measures it against attention_mma.cuh */
    PT_TRY(env_integer("PIPERT_CUDA_CUDNN_ATTENTION", 0, &cudnn_attention));
    pt_cuda.cudnn_attention =
        cudnn_attention_request >= 0 ? cudnn_attention_request != 0 : cudnn_attention != 0;
    long long lt;
    PT_TRY(env_integer("PIPERT_CUDA_LT", 1, &lt));
    pt_cuda.lt = lt_request >= 0 ? lt_request != 0 : lt != 0;
    return pt_cuda_lt_start();
}

static pipert_result create_arena(void)
{
    size_t free_bytes = 0, total_bytes = 0;
    cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_INTERNAL, "cudaMemGetInfo: %s", cudaGetErrorString(err));
    size_t fallback = free_bytes > 2 * DEFAULT_RESERVE_BYTES ? free_bytes - DEFAULT_RESERVE_BYTES
                                                             : free_bytes / 2;
    if (configured.arena_bytes) fallback = configured.arena_bytes; /* what the caller needs */
    long long mib;
    PT_TRY(env_integer("PIPERT_CUDA_ARENA_MB", (long long)(fallback >> 20), &mib));
    if (mib < 1) return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_CUDA_ARENA_MB=%lld: must be at least 1", mib);
    return pt_cuda_arena_create((size_t)mib << 20);
}

static void context_destroy(void)
{
    if (pt_cuda.compute) cudaStreamSynchronize(pt_cuda.compute);
    if (pt_cuda.copy) cudaStreamSynchronize(pt_cuda.copy);
    pt_cuda_peer_close();
#if PT_HAVE_CUDNN
    pt_cuda_cudnn_attention_close(); /* its handle runs on the compute stream */
#endif
    pt_cuda_arena_destroy();
    pt_cuda_lt_stop();
    if (pt_cuda.cublas) cublasDestroy(pt_cuda.cublas);
    if (pt_cuda.host_partials) cudaFreeHost(pt_cuda.host_partials);
    if (pt_cuda.compute_mark) cudaEventDestroy(pt_cuda.compute_mark);
    if (pt_cuda.copy_mark) cudaEventDestroy(pt_cuda.copy_mark);
    if (pt_cuda.compute) cudaStreamDestroy(pt_cuda.compute);
    if (pt_cuda.copy) cudaStreamDestroy(pt_cuda.copy);
    memset(&pt_cuda, 0, sizeof pt_cuda);
}

static pipert_result context_create(void)
{
    memset(&pt_cuda, 0, sizeof pt_cuda);
    pipert_result rc = choose_device();
    if (rc == PIPERT_OK) rc = create_streams_and_handles();
    if (rc == PIPERT_OK) rc = create_arena();
    if (rc == PIPERT_OK) rc = pt_cuda_attention_setup();
    if (rc == PIPERT_OK) rc = pt_cuda_attention_mma_setup();
    if (rc != PIPERT_OK) {
        context_destroy();
        return rc;
    }
    pt_cuda.ready = true;
    pt_info("cuda: device %d, %s (compute capability %d.%d, %d SMs), arena %zu MiB, TF32 %s, "
            "bf16 attention on %s%s, fp32 attention %s, epilogues %s",
            pt_cuda.device, pt_cuda.prop.name, pt_cuda.prop.major, pt_cuda.prop.minor,
            pt_cuda.prop.multiProcessorCount, pt_cuda.arena.capacity >> 20,
            pt_cuda.tf32 ? "on" : "off", pt_cuda.mma_attention ? "tensor cores" : "CUDA cores",
            pt_cuda.cudnn_attention ? " (cuDNN's where it has a plan)" : "",
            pt_cuda.gemm_attention ? "through cuBLAS" : "on CUDA cores",
            pt_cuda.lt ? "fused by cuBLASLt" : "as kernels");
    return PIPERT_OK;
}

extern "C" void pt_cuda_shutdown(void)
{
    std::lock_guard<std::mutex> guard(start_lock);
    if (pt_cuda.ready) context_destroy();
}

extern "C" void pt_cuda_set_tf32(int enabled)
{
    std::lock_guard<std::mutex> guard(start_lock);
    tf32_request = enabled != 0;
    pt_cuda.tf32 = enabled != 0; /* also for a backend started later */
}

extern "C" void pt_cuda_set_mma_attention(int enabled)
{
    std::lock_guard<std::mutex> guard(start_lock);
    mma_attention_request = enabled != 0;
    pt_cuda.mma_attention = enabled != 0;
}

extern "C" void pt_cuda_set_gemm_attention(int enabled)
{
    std::lock_guard<std::mutex> guard(start_lock);
    gemm_attention_request = enabled != 0;
    pt_cuda.gemm_attention = enabled != 0;
}

extern "C" void pt_cuda_set_cudnn_attention(int enabled)
{
    std::lock_guard<std::mutex> guard(start_lock);
    cudnn_attention_request = enabled != 0;
    pt_cuda.cudnn_attention = enabled != 0;
}

extern "C" void pt_cuda_set_lt(int enabled)
{
    std::lock_guard<std::mutex> guard(start_lock);
    lt_request = enabled != 0;
    pt_cuda.lt = enabled != 0;
}

/* ---- the table ------------------------------------------------------------------------ */

/* A bf16 qkv's attention written in bf16: cuDNN's where it is asked for and has plans for the
 * shape (attention_cudnn.cu), attention.cu's kernels otherwise. */
static void attention_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, float *att,
                                           const pt_bf16 *qkv, int B, int T, int C, int NH)
{
#if PT_HAVE_CUDNN
    if (pt_cuda_attention_cudnn_forward_to_bf16(out, att, qkv, B, T, C, NH)) return;
#endif
    pt_cuda_attention_forward_bf16_to_bf16(out, scratch, att, qkv, B, T, C, NH);
}

static void attention_backward_bf16_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                            const pt_bf16 *qkv, const float *att, int B, int T,
                                            int C, int NH)
{
#if PT_HAVE_CUDNN
    if (pt_cuda_attention_cudnn_backward_to_bf16(dqkv, scratch, dout, qkv, att, B, T, C, NH)) return;
#endif
    pt_cuda_attention_backward_bf16_to_bf16(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static const pt_kernels cuda_kernels = {
    .name = "cuda",
    .host_accessible = false,

    .alloc = pt_cuda_alloc,
    .free = pt_cuda_free,
    .zero = pt_cuda_zero,
    .copy_to_device = pt_cuda_copy_to_device,
    .copy_to_host = pt_cuda_copy_to_host,
    .copy = pt_cuda_copy,
    .synchronize = pt_cuda_synchronize,
    .alloc_host = pt_cuda_pinned_alloc,
    .free_host = pt_cuda_pinned_free,
    .peer_export = pt_cuda_peer_export,
    .peer_copy = pt_cuda_peer_copy,
    .set_threads = NULL, /* the work runs on the device, not on host threads */

    .encoder_forward = pt_cuda_encoder_forward,
    .encoder_backward = pt_cuda_encoder_backward,
    .layernorm_forward = pt_cuda_layernorm_forward,
    .layernorm_forward_bf16 = pt_cuda_layernorm_forward_bf16,
    .residual_layernorm_forward = pt_cuda_residual_layernorm_forward,
    .residual_layernorm_forward_bf16 = pt_cuda_residual_layernorm_forward_bf16,
    .layernorm_backward = pt_cuda_layernorm_backward,
    .layernorm_backward_bf16 = pt_cuda_layernorm_backward_bf16,
    .matmul_forward = pt_cuda_matmul_forward,
    .matmul_backward = pt_cuda_matmul_backward,
    .cast_to_bf16 = pt_cuda_cast_to_bf16,
    .cast_from_bf16 = pt_cuda_cast_from_bf16,
    .matmul_forward_bf16 = pt_cuda_matmul_forward_bf16,
    .matmul_backward_bf16 = pt_cuda_matmul_backward_bf16,
    .matmul_backward_bf16_dinp_written = pt_cuda_matmul_backward_bf16_dinp_written,
    .matmul_forward_bf16_to_bf16 = pt_cuda_matmul_forward_bf16_to_bf16,
    .matmul_gelu_backward_bf16 = pt_cuda_matmul_gelu_backward_bf16,
    .attention_forward = pt_cuda_attention_forward,
    .attention_backward = pt_cuda_attention_backward,
    .attention_saved_floats = pt_cuda_attention_saved_floats,
    .attention_forward_bf16 = pt_cuda_attention_forward_bf16,
    .attention_backward_bf16 = pt_cuda_attention_backward_bf16,
    .attention_forward_bf16_to_bf16 = attention_forward_bf16_to_bf16,
    .attention_backward_bf16_to_bf16 = attention_backward_bf16_to_bf16,
    .gelu_forward = pt_cuda_gelu_forward,
    .gelu_backward = pt_cuda_gelu_backward,
    .gelu_forward_bf16 = pt_cuda_gelu_forward_bf16,
    .gelu_backward_bf16 = pt_cuda_gelu_backward_bf16,
    .residual_forward = pt_cuda_residual_forward,
    .crossentropy_forward = pt_cuda_crossentropy_forward,
    .crossentropy_forward_backward = pt_cuda_crossentropy_forward_backward,
    .crossentropy_forward_bf16 = pt_cuda_crossentropy_forward_bf16,
    .crossentropy_forward_backward_bf16 = pt_cuda_crossentropy_forward_backward_bf16,

    .adam_update = pt_cuda_adam_update,
    .adam_extrapolate = pt_cuda_adam_extrapolate,
    .delay_compensate = pt_cuda_delay_compensate,
    .secant_compensate = pt_cuda_secant_compensate,
    .sum_squares = pt_cuda_sum_squares,
    .sum = pt_cuda_sum,
    .scale = pt_cuda_scale,
    .gather = pt_cuda_gather,
    .scatter = pt_cuda_scatter,
};

extern "C" pipert_result pt_kernels_cuda(const pt_kernels **out)
{
    *out = NULL;
    std::lock_guard<std::mutex> guard(start_lock);
    if (!pt_cuda.ready) PT_TRY(context_create());
    *out = &cuda_kernels;
    return PIPERT_OK;
}

extern "C" pipert_result pt_cuda_device_query(pt_cuda_device_info *out)
{
    memset(out, 0, sizeof *out);
    const pt_kernels *started;
    PT_TRY(pt_kernels_cuda(&started));
    snprintf(out->name, sizeof out->name, "%s", pt_cuda.prop.name);
    out->ordinal = pt_cuda.device;
    out->major = pt_cuda.prop.major;
    out->minor = pt_cuda.prop.minor;
    out->sm_count = pt_cuda.prop.multiProcessorCount;
    out->total_bytes = pt_cuda.prop.totalGlobalMem;
    out->arena_bytes = pt_cuda.arena.capacity;
    out->arena_used_bytes = pt_cuda.arena.live_bytes;
    out->arena_peak_bytes = pt_cuda.arena.peak;
    out->tf32 = pt_cuda.tf32;
    return PIPERT_OK;
}
