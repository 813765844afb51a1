/* The kernel dispatch interface: math on buffers, one table per backend.
 *
 * Every pointer is in the backend's memory (host memory for cpu, device memory
 * for cuda). Shapes are written beside each pointer, row-major, with
 * N = B·T positions, C channels, OC output channels, V vocabulary, NH heads.
 *
 * Accumulation rule (as in llm.c): every backward ADDS into its gradient
 * outputs, both activation gradients (dinp) and parameter gradients (dweight,
 * dbias). Callers zero gradients once per step, which makes gradient
 * accumulation over microbatches and residual branches free.
 */
#ifndef PT_KERNELS_H
#define PT_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipert/pipert.h"
#include "runtime/peer_memory.h"
#include "runtime/settings.h"

/* bfloat16 as its 16 bits (the upper half of a float). */
typedef uint16_t pt_bf16;

/* How a weight matrix is stored. Hugging Face GPT-2 Conv1D weights are [C, OC]
 * (y = x·W + b); the language-model head is [V, C] (y = x·Wᵀ). */
typedef enum pt_weight_layout { PT_WEIGHT_IN_OUT, PT_WEIGHT_OUT_IN } pt_weight_layout;

/* One Adam-family update, θ ← θ·decay − c_grad·g/d − c_mom·m/d with
 * m ← β1·m + (1−β1)·g, v ← β2·v + (1−β2)·g², d = √(v/bias2) + ε.
 * AdamW:  c_grad = 0,                     c_mom = γ/(1−β1ᵗ).
 * NAdamW: c_grad = γ(1−μ_t)/(1−Π_t),      c_mom = γ·μ_{t+1}/(1−Π_t·μ_{t+1}).
 * decay = 1 − γλ for decayed tensors, 1 otherwise. (ALGORITHMS.md §2.) */
typedef struct pt_adam_coeffs {
    float decay;
    float beta1, beta2;
    float bias2; /* 1 − β2ᵗ */
    float eps;
    float c_grad, c_mom;
} pt_adam_coeffs;

/* A tensor inside a flat parameter buffer (and its gradient's and moments', at the same
 * offset); decay: weight decay applies (2-D tensors only). */
typedef struct pt_param_region {
    size_t offset, numel;
    int decay;
} pt_param_region;

/* The secant delay compensation's constants for one call (secant_compensate). */
typedef struct pt_secant_coeffs {
    float beta;      /* weight of the past in the running means of Δg·Δw and Δw² */
    float scale;     /* s: the compensation is s·κ⊙(now − used) */
    float cap;       /* κ is at most cap·d: 1/γ(t), so one step moves no element by more than it */
    float inv_bias2; /* 1/(1 − β2ᵗ) of the optimizer's v */
    float eps;
    int learn;       /* prev_* hold a previous pair: update the running means */
    int apply;       /* enough pairs seen: compensate the gradient */
} pt_secant_coeffs;

typedef struct pt_kernels {
    const char *name; /* "cpu", "cuda", "cpu-guarded" */
    /* The host may read and write this table's buffers directly (cpu). false
     * (cuda, cpu-guarded): only the table's own functions touch them, and
     * code above the table moves data with copy_to_host / copy_to_device. */
    bool host_accessible;

    /* ---- memory ---- */
    pipert_result (*alloc)(void **out, size_t bytes, const char *what); /* zero-filled */
    void (*free)(void *ptr);
    void (*zero)(void *ptr, size_t bytes);
    void (*copy_to_device)(void *dst, const void *src_host, size_t bytes);
    void (*copy_to_host)(void *dst_host, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*synchronize)(void);
    /* Host memory for data on its way between this table's memory and the
     * outside (the transport, files): zero-filled, and page-locked where that
     * makes the table's copies faster (cuda). */
    pipert_result (*alloc_host)(void **out, size_t bytes, const char *what);
    void (*free_host)(void *ptr);
    /* Memory other processes of this host copy from (runtime/peer_memory.h).
     * OPTIONAL: NULL where the host reads the memory anyway (cpu).
     * peer_export: names `ptr` (a buffer of this table, or a place in one) for
     * a process whose table is of the same kind. peer_copy: copies `bytes`
     * from what a peer exported into `dst` (this table's memory), after the
     * work already enqueued on this table, and returns when `dst` holds them
     * and the peer's memory is no longer read; it may run on any thread. */
    pipert_result (*peer_export)(const void *ptr, pt_peer_memory *out);
    pipert_result (*peer_copy)(void *dst, const pt_peer_memory *src, size_t bytes);
    /* Compute threads of the host kernels (OpenMP and OpenBLAS together), or
     * NULL when the table's work does not run on host threads (cuda). */
    void (*set_threads)(int threads);

    /* ---- forward / backward ---- */
    /* out[N,C] = wte[tokens[n]] + wpe[n mod T] */
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C);

    /* out[N,C], mean[N], rstd[N] from inp[N,C]; ε = 1e-5 */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
    /* The same with out rounded to bf16 as it is written (ln_1, ln_2, ln_f under bf16: the
     * operands of products); mean and rstd fp32. */
    void (*layernorm_forward_bf16)(pt_bf16 *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C);
    /* residual[N,C] = a + b (residual may be a or b), then the layernorm of residual into out
     * as layernorm_forward(_bf16)'s: the residual stream's addition and the layernorm that
     * reads it next, in one pass. */
    void (*residual_layernorm_forward)(float *residual, float *out, float *mean, float *rstd,
                                       const float *a, const float *b, const float *weight,
                                       const float *bias, int N, int C);
    void (*residual_layernorm_forward_bf16)(float *residual, pt_bf16 *out, float *mean,
                                            float *rstd, const float *a, const float *b,
                                            const float *weight, const float *bias, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
    /* The same, with dinp's new values (after the addition) also rounded to bf16 into
     * dinp_rounded[N,C] (runtime.precision = bf16: the residual stream's gradient, which the bf16
     * product before the layernorm's branch reads next, rounded as it is written rather than by
     * a cast that reads it again). */
    void (*layernorm_backward_bf16)(float *dinp, pt_bf16 *dinp_rounded, float *dweight,
                                    float *dbias, const float *dout, const float *inp,
                                    const float *weight, const float *mean, const float *rstd,
                                    int N, int C);

    /* out[N,OC] = inp[N,C]·W + bias (bias may be NULL) */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC, pt_weight_layout layout);
    /* dinp[N,C] += dout·Wᵀ; dweight += inpᵀ·dout (layout as the weight); dbias[OC] +=
     * Σ_n dout. Each of the three may be NULL: that gradient is not computed. */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC,
                            pt_weight_layout layout);

    /* The matrix products with bf16 operands (runtime.precision = bf16): out, dinp,
     * dweight and dbias are fp32 and accumulate as above (dweight into the fp32 master
     * gradient), the bias is fp32; the sums run in fp32. cast_to_bf16: out[n] =
     * round-to-nearest-even(inp[n]). cuda: tensor cores; cpu: an emulation (each operand
     * widened back to fp32, exactly, and the fp32 product: the fp32 GEMM of the rounded
     * values), for tests and for checking a bf16 run without a GPU, no faster than fp32.
     * cast_from_bf16: out[n] = the float inp[n] is (exact); activations that crossed between
     * stages in bf16 (pipeline.transfer) are widened so. */
    void (*cast_to_bf16)(pt_bf16 *out, const float *inp, size_t n);
    void (*cast_from_bf16)(float *out, const pt_bf16 *inp, size_t n);
    void (*matmul_forward_bf16)(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                const float *bias, int N, int C, int OC, pt_weight_layout layout);
    void (*matmul_backward_bf16)(float *dinp, float *dweight, float *dbias, const pt_bf16 *dout,
                                 const pt_bf16 *inp, const pt_bf16 *weight, int N, int C, int OC,
                                 pt_weight_layout layout);
    /* matmul_backward_bf16 with dinp written, not added to (β = 0: no pass to zero it first, and
     * the product does not read it); dweight and dbias still accumulate. dout's rows are
     * ld_dout ≥ OC apart (the classifier's padded logits; OC elsewhere). */
    void (*matmul_backward_bf16_dinp_written)(float *dinp, float *dweight, float *dbias,
                                              const pt_bf16 *dout, const pt_bf16 *inp,
                                              const pt_bf16 *weight, int N, int C, int OC,
                                              int ld_dout, pt_weight_layout layout);
    /* out[n][o] = bf16(bias[o] + Σ_c inp[n][c]·W[c][o]) (bias may be NULL): a product kept in
     * bf16 as it is made (qkv and fc, the classifier's logits under bf16), its fp32 sums and
     * the bias rounded once. out's rows are ld_out ≥ OC apart, the columns past OC untouched
     * (the classifier's logits: a row stride a multiple of 16 bytes where V = 50,257 is odd,
     * so that the products can use vector loads; OC elsewhere). scratch[N,OC] (fp32, dense) is
     * the backend's to use where it cannot add the bias and round in the product itself; it
     * may be NULL when bias is. */
    void (*matmul_forward_bf16_to_bf16)(pt_bf16 *out, float *scratch, const pt_bf16 *inp,
                                        const pt_bf16 *weight, const float *bias, int N, int C,
                                        int OC, int ld_out, pt_weight_layout layout);
    /* The backward of out = gelu(pre)·W + bias through the GELU (the MLP's second product under
     * bf16): inp[N,C] holds gelu(pre) in bf16, pre[N,C] the GELU's input; dpre[N,C] =
     * bf16(gelu'(pre)·Σ_o dout[n][o]·W[c][o]) is written, not added (what the MLP's first
     * product's backward reads); dweight += inpᵀ·dout, dbias += Σ_n dout as
     * matmul_backward_bf16's. scratch[N,C] (fp32) is the backend's to use where it cannot apply
     * the GELU's gradient in the product itself. */
    void (*matmul_gelu_backward_bf16)(pt_bf16 *dpre, float *scratch, float *dweight, float *dbias,
                                      const pt_bf16 *dout, const pt_bf16 *inp, const pt_bf16 *pre,
                                      const pt_bf16 *weight, int N, int C, int OC,
                                      pt_weight_layout layout);

    /* Causal self-attention. qkv[B,T,3C] holds q, k, v side by side, head h
     * in columns [h·hs, (h+1)·hs) of each; out[B,T,C]; att holds what the forward
     * saves for the backward, attention_saved_floats(B, T, C, NH) floats (cpu: the
     * softmax probabilities [B,NH,T,T], zero above the diagonal). */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH);
    /* Floats the caller must provide in `att` for these shapes: what the
     * forward saves for the backward is the backend's choice. cpu: the
     * probabilities, B·NH·T·T. cuda (flash-style, docs/CUDA.md): each row's
     * log-sum-exp and a copy of out, B·NH·T + B·T·C. */
    size_t (*attention_saved_floats)(int B, int T, int C, int NH);
    /* Attention on a bf16 qkv (runtime.precision = bf16): as above with every q, k and v value
     * read as the bf16 it holds; out, att and dqkv fp32, the sums fp32. */
    void (*attention_forward_bf16)(float *out, float *att, const pt_bf16 *qkv, int B, int T,
                                   int C, int NH);
    void (*attention_backward_bf16)(float *dqkv, const float *dout, const pt_bf16 *qkv,
                                    const float *att, int B, int T, int C, int NH);
    /* The forward with out rounded to bf16 as it is written (atty: what the product after
     * attention reads); att as attention_forward_bf16's. scratch[B,T,C] (fp32) is the
     * backend's to use where it cannot write bf16 itself. */
    void (*attention_forward_bf16_to_bf16)(pt_bf16 *out, float *scratch, float *att,
                                           const pt_bf16 *qkv, int B, int T, int C, int NH);
    /* The same gradient written (not added) into a bf16 dqkv, each element rounded: what the
     * product before attention reads next. scratch[B,T,3C] (fp32) is the backend's to use
     * where it cannot write bf16 itself (cpu; cuda at head sizes other than 32, 64 and 128). */
    void (*attention_backward_bf16_to_bf16)(pt_bf16 *dqkv, float *scratch, const float *dout,
                                            const pt_bf16 *qkv, const float *att, int B, int T,
                                            int C, int NH);

    /* GELU, tanh approximation */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* The same on a bf16 input (runtime.precision = bf16): out[n] = bf16(gelu(inp[n])) with
     * the GELU computed in fp32; dinp (fp32) += gelu'(inp)·dout */
    void (*gelu_forward_bf16)(pt_bf16 *out, const pt_bf16 *inp, size_t n);
    void (*gelu_backward_bf16)(float *dinp, const pt_bf16 *inp, const float *dout, size_t n);

    /* out = a + b */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);

    /* losses[N] = −log softmax(logits[N,V])[targets[n]]. */
    void (*crossentropy_forward)(float *losses, const float *logits, const int32_t *targets,
                                 int N, int V);
    /* The same losses, and logits overwritten in place by
     * dlogits = dloss·(softmax(logits) − onehot(targets)). */
    void (*crossentropy_forward_backward)(float *losses, float *logits, const int32_t *targets,
                                          int N, int V, float dloss);
    /* The same on bf16 logits (the classifier under bf16), their rows ld ≥ V apart (the
     * columns past V neither read nor written): each value read as the bf16 it holds, the
     * softmax and the loss in fp32; dlogits rounded to bf16 in place, as the bf16 products
     * that take them next would round them. */
    void (*crossentropy_forward_bf16)(float *losses, const pt_bf16 *logits,
                                      const int32_t *targets, int N, int V, int ld);
    void (*crossentropy_forward_backward_bf16)(float *losses, pt_bf16 *logits,
                                               const int32_t *targets, int N, int V, int ld,
                                               float dloss);

    /* ---- optimizer and reductions ---- */
    /* One step over every region of the flat buffers param, grad, m and v (regions: host
     * memory), with the `decayed` coefficients where the region decays and `plain` elsewhere;
     * elements outside the regions are not touched. The gradient is read as grad_scale·grad
     * (one fp32 product, the bits a scale(grad, grad_scale) before the step would leave: the
     * clipping of the global norm without a pass of its own); grad itself is not written.
     * cuda: one launch for up to 120 regions (a model's tensors are ~150), not one each. */
    void (*adam_update)(float *param, const float *grad, float *m, float *v,
                        const pt_param_region *regions, int n_regions,
                        const pt_adam_coeffs *decayed, const pt_adam_coeffs *plain,
                        float grad_scale);
    /* Weight prediction (ALGORITHMS.md §3, lookahead = predict): `steps`
     * applications of the update above with the gradient term left out and
     * the moments frozen, extrapolated linearly; m and v are only read:
     *   out = param·(1 − steps·(1 − decay)) − steps·c_mom·m/d,  d = √(v/bias2) + ε
     * (beta1, beta2 and c_grad are not used). With AdamW coefficients of step t,
     * c_mom = γ/(1−β1ᵗ), bias2 = 1−β2ᵗ and decay = 1 − γλ, this is exactly
     * ŵ = θ − τγ(m̂/(√v̂+ε) + λθ) for steps = τ. steps = 0 gives out == param
     * exactly. out[n], param[n], m[n], v[n]; out may be param.
     * OPTIONAL: NULL in a backend that lacks it; callers check. */
    void (*adam_extrapolate)(float *out, const float *param, const float *m, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float steps);
    /* Delay compensation of a stale gradient (ALGORITHMS.md §3, lookahead =
     * dc-asgd; Zheng et al. 2017, the adaptive form): the gradient computed at
     * the weights `used` is carried to the weights `now` by a first-order
     * Taylor step whose Hessian is approximated by λ·g⊙g, scaled per element
     * by the optimizer's root mean square of the gradient:
     *   g ← g + lambda·g·g·(now − used)/d,  d = √(v/bias2) + eps
     * (only bias2 and eps of coeffs are read). grad[n], now[n], used[n], v[n].
     * OPTIONAL: NULL in a backend that lacks it; callers check. */
    void (*delay_compensate)(float *grad, const float *now, const float *used, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float lambda);
    /* Delay compensation with a secant estimate of the Hessian's diagonal
     * (lookahead = nesterov-secant, docs/STALENESS.md). Per element, with
     * Δw = used − prev_used and Δg = grad − prev_grad (the previous backward's
     * stashed weights and raw gradient):
     *   learn:  num ← β·num + (1−β)·Δg·Δw;  den ← β·den + (1−β)·Δw²
     *   then:   prev_grad ← grad;  prev_used ← used
     *   apply:  κ = min(max(num/den, 0), cap·d)  (den = 0: κ = 0),  d = √(v·inv_bias2) + eps
     *           grad ← grad + scale·κ·(now − used)
     * grad[n], now[n], used[n], prev_grad[n], prev_used[n], num[n], den[n], v[n].
     * OPTIONAL: NULL in a backend that lacks it; callers check. */
    void (*secant_compensate)(float *grad, const float *now, const float *used, float *prev_grad,
                              float *prev_used, float *num, float *den, const float *v, size_t n,
                              const pt_secant_coeffs *coeffs);
    double (*sum_squares)(const float *x, size_t n);
    double (*sum)(const float *x, size_t n);
    void (*scale)(float *x, float factor, size_t n);

    /* ---- indexed access (dp.method=sparse's partitions; index in this table's memory) ---- */
    /* out[i] = src[index[i]] for i < n */
    void (*gather)(float *out, const float *src, const uint32_t *index, size_t n);
    /* dst[index[i]] = values[i] for i < n; the indices distinct */
    void (*scatter)(float *dst, const uint32_t *index, const float *values, size_t n);
} pt_kernels;

/* The CPU backend (C + OpenBLAS + OpenMP). */
const pt_kernels *pt_kernels_cpu(void);

/* The CPU kernels on guarded memory (kernels/guarded.c): buffers the host
 * cannot read or write outside this table's calls, as on a GPU. For tests. */
const pt_kernels *pt_kernels_cpu_guarded(void);
/* The most bytes its buffers held at once so far in this process (as asked for: the GPU
 * arena's high-water mark, on the stand-in). */
size_t pt_kernels_cpu_guarded_peak_bytes(void);

/* The CUDA backend, or NULL with PIPERT_ERR_NO_DEVICE/UNSUPPORTED when this
 * build or this machine has none. */
pipert_result pt_kernels_cuda(const pt_kernels **out);

/* Threads the CPU kernels use (OpenMP and OpenBLAS together). */
void pt_kernels_cpu_set_threads(int threads);

/* The table of a runtime.device: cpu, cuda (PIPERT_ERR_NO_DEVICE or UNSUPPORTED where there
 * is none) or cpu-guarded; a value that is none of them is a PIPERT_ERR_CONFIG. */
pipert_result pt_kernels_for_device(pt_device_kind device, const pt_kernels **out);

/* The attention_saved_floats of a runtime.device's table, as pure arithmetic
 * (it starts nothing): for estimates of the memory a stage will take. An
 * unknown device gets the CPU's. */
typedef size_t (*pt_attention_sizer)(int B, int T, int C, int NH);
pt_attention_sizer pt_kernels_attention_sizer(pt_device_kind device);

/* A runtime.device as estimates see it, without starting it (kernels/device.c's table). */
typedef struct pt_device_traits {
    bool gpu; /* tensors live in a GPU's memory, apart from the host's */
    /* the memory estimates count only what lives in the table's memory (a GPU's, or the
     * stand-in's), not what a coupling keeps in host memory beside it */
    bool memory_apart;
    /* memory is what runs short first: the model recomputes the GELU in its backward rather
     * than keeping its output (models/gpt.h), a pass over [N, 4C] for 4·N·4C bytes a block */
    bool recompute_gelu;
    pt_attention_sizer attention_sizer;
    pipert_result (*kernels)(const pt_kernels **out);
} pt_device_traits;

/* The row of `device` (its name: pt_config_choice_name("runtime.device", device)); NULL with a
 * PIPERT_ERR_CONFIG for a value no device has. */
const pt_device_traits *pt_device_traits_of(pt_device_kind device);

#endif
