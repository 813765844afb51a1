/* A bf16 qkv's attention through cuDNN's fused flash attention (cudnn_attention.h) where it
 * is asked for (PIPERT_CUDA_CUDNN_ATTENTION=1, pt_cuda_set_cudnn_attention) and cuDNN has a
 * plan for both passes at the shape; the table's bf16-to-bf16 entries try it first and run
 * attention.cu's kernels otherwise.
 *
 * What the forward saves, in `att` (pt_cuda_attention_saved_floats, as the other kernels'):
 * cuDNN's statistics in the first B·NH·T floats (the natural-log log-sum-exp of the scaled
 * scores, not attention.cu's base-2 one) and the bf16 output in the space of the fp32 copy the
 * others keep (cuDNN's backward reads O in bf16). So the two passes must go the same way: the
 * choice is a function of the shape alone, made once (both plans are made at the first
 * forward), and a backward cuDNN was chosen for never falls back (a failure is an error).
 * Memory: the backward's fp32 sums of dq and its dO in bf16 go in the caller's fp32 scratch
 * [B, T, 3C] (what the CUDA-core kernels use it for); only cuDNN's own workspace comes from
 * the arena's scratch. */
#include <stdint.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "kernels/cuda/cudnn_attention.h"
#include "runtime/log.h"
}

static long runs; /* pt_cuda_cudnn_attention_runs */

extern "C" long pt_cuda_cudnn_attention_runs(void) { return runs; }

/* cuDNN, loaded at the first use; NULL (and not tried again) where it failed */
static pt_cudnn *cudnn;
static bool cudnn_tried;

/* Shapes cuDNN had no plan for: logged once each, and not asked again (a model has one or two:
 * its training and validation batches). */
#define REFUSED_KEPT 8
static pt_cudnn_attention_shape refused[REFUSED_KEPT];
static int n_refused, next_refused;

static bool was_refused(pt_cudnn_attention_shape s)
{
    for (int i = 0; i < n_refused; i++)
        if (!memcmp(&s, &refused[i], sizeof s)) return true;
    return false;
}

static pt_cudnn *cudnn_now(void)
{
    if (!cudnn_tried) {
        cudnn_tried = true;
        if (pt_cudnn_open(&cudnn, pt_cuda.compute) != PIPERT_OK)
            pt_info("cuda: no cuDNN attention: %s; attention runs on our kernels",
                    pipert_last_error());
    }
    return cudnn;
}

extern "C" void pt_cuda_cudnn_attention_close(void)
{
    pt_cudnn_close(cudnn);
    cudnn = NULL;
    cudnn_tried = false;
    n_refused = next_refused = 0;
}

static size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* Where the forward keeps its bf16 output for the backward: in att's space for the fp32 copy
 * (B·T·C floats, twice what it needs), from its first 16-byte boundary (cuDNN's tensors are). */
static void *saved_output(const float *att, int B, int T, int NH)
{
    const uintptr_t at = (uintptr_t)(att + (size_t)B * NH * T);
    return (void *)((at + 15) / 16 * 16);
}

/* Whether cuDNN runs this shape's attention, and if so each pass's workspace. */
static bool takes(const void *qkv, int B, int T, int C, int NH, size_t *forward_bytes,
                  size_t *backward_bytes)
{
    if (!pt_cuda.cudnn_attention || NH <= 0 || C % NH || (uintptr_t)qkv % 16) return false;
    const pt_cudnn_attention_shape s = {B, T, NH, C / NH};
    if (was_refused(s) || !cudnn_now()) return false;
    if (pt_cudnn_attention_workspace(cudnn, PT_CUDNN_ATTENTION_FORWARD, s, forward_bytes) ==
            PIPERT_OK &&
        pt_cudnn_attention_workspace(cudnn, PT_CUDNN_ATTENTION_BACKWARD, s, backward_bytes) ==
            PIPERT_OK)
        return true;
    pt_info("cuda: %s; this shape's attention runs on our kernels", pipert_last_error());
    refused[next_refused++ % REFUSED_KEPT] = s; /* (the oldest replaced) */
    if (n_refused < REFUSED_KEPT) n_refused++;
    return false;
}

/* cuDNN's failure as the backend's error, at the line that saw it */
#define RECORD(what) pt_cuda_record_error(what, pipert_last_error(), __FILE__, __LINE__)

bool pt_cuda_attention_cudnn_forward_to_bf16(pt_bf16 *out, float *att, const pt_bf16 *qkv, int B,
                                             int T, int C, int NH)
{
    size_t bytes, unused;
    if (!takes(qkv, B, T, C, NH, &bytes, &unused)) return false;
    const pt_cudnn_attention_shape s = {B, T, NH, C / NH};
    float *stats = att;
    void *o_saved = saved_output(att, B, T, NH); /* the bf16 output, for the backward */
    const size_t mark = pt_cuda_scratch_mark();
    void *workspace = bytes ? pt_cuda_scratch(align_up(bytes), "cuDNN attention's workspace") : NULL;
    if (!bytes || workspace) {
        if (pt_cudnn_attention_forward(cudnn, s, out, stats, qkv, workspace) == PIPERT_OK) {
            PT_CUDA_CHECK(cudaMemcpyAsync(o_saved, out, (size_t)B * T * C * sizeof(pt_bf16),
                                          cudaMemcpyDeviceToDevice, pt_cuda.compute));
            runs++;
        } else {
            RECORD("cuDNN attention forward");
        }
    }
    pt_cuda_scratch_release(mark);
    return true;
}

bool pt_cuda_attention_cudnn_backward_to_bf16(pt_bf16 *dqkv, float *scratch, const float *dout,
                                              const pt_bf16 *qkv, const float *att, int B, int T,
                                              int C, int NH)
{
    size_t unused, bytes;
    if (!takes(qkv, B, T, C, NH, &unused, &bytes)) return false;
    const pt_cudnn_attention_shape s = {B, T, NH, C / NH};
    const float *stats = att;
    const void *o_saved = saved_output(att, B, T, NH);
    /* the caller's scratch [B, T, 3C] fp32: dq's fp32 sums [B, T, C], then dO in bf16 */
    const size_t n_out = (size_t)B * T * C, mark = pt_cuda_scratch_mark();
    float *dq_sums = scratch;
    pt_bf16 *dout16 = (pt_bf16 *)(scratch + n_out);
    void *workspace = bytes ? pt_cuda_scratch(align_up(bytes), "cuDNN attention's workspace") : NULL;
    if (!bytes || workspace) { /* (a scratch that does not fit is recorded as an error) */
        pt_cuda_cast_to_bf16(dout16, dout, n_out);
        if (pt_cudnn_attention_backward(cudnn, s, dqkv, dout16, qkv, o_saved, stats, dq_sums,
                                        workspace) == PIPERT_OK)
            runs++;
        else
            RECORD("cuDNN attention backward");
    }
    pt_cuda_scratch_release(mark);
    return true;
}
