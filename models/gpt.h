/* The GPT-2 family (ALGORITHMS.md §1), built so that a pipeline stage can run
 * any contiguous slice of it.
 *
 * A slice holds blocks [first, last) of an L-block model, plus the embeddings
 * (wte, wpe) when first = 0 and the final norm, head and loss when last = L.
 * The whole model is the slice [0, L). Its parameters live in one allocation
 * (and its gradients in another, with the same offsets), named by their global
 * Hugging Face GPT-2 names ("h.3.attn.c_attn.weight"), so a checkpoint written
 * under one stage split loads under any other.
 *
 *   x_in ──(embed, if first = 0)──> block first ─> … ─> block last−1 ──> x_out
 *                                                      └(ln_f, head, loss, if last = L)
 */
#ifndef PT_GPT_H
#define PT_GPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "runtime/config.h"

typedef struct pt_gpt_config {
    int n_layer, n_embd, n_head, block_size, vocab_size;
    bool tie_weights; /* lm_head is wte (whole-model slices only) */
    /* the matrix products' operands (runtime.precision; models/gpt_matmul.c); not a shape:
     * checkpoints and stages of either precision fit each other */
    pt_precision precision;
    /* the GELU's output is not kept but computed again in the backward, from c_fc's output
     * (the device's choice: pt_device_traits); the same values either way */
    bool recompute_gelu;
} pt_gpt_config;

#define PT_TENSOR_NAME_MAX 64

/* One named parameter tensor inside the slice's flat buffer. */
typedef struct pt_gpt_tensor {
    char name[PT_TENSOR_NAME_MAX];
    int ndim;
    int64_t shape[2];
    size_t offset, numel; /* in floats, into params/grads */
    bool decay;           /* weight decay applies (matrices and embeddings) */
} pt_gpt_tensor;

/* Pointers into the flat buffer for one block (shapes as stored). */
typedef struct pt_gpt_block_params {
    float *ln_1_weight, *ln_1_bias;   /* [C] */
    float *c_attn_weight;             /* [C, 3C] */
    float *c_attn_bias;               /* [3C] */
    float *attn_proj_weight;          /* [C, C] */
    float *attn_proj_bias;            /* [C] */
    float *ln_2_weight, *ln_2_bias;   /* [C] */
    float *c_fc_weight;               /* [C, 4C] */
    float *c_fc_bias;                 /* [4C] */
    float *mlp_proj_weight;           /* [4C, C] */
    float *mlp_proj_bias;             /* [C] */
} pt_gpt_block_params;

typedef struct pt_gpt_head_params {
    float *wte;            /* [V, C]   (stage 0) */
    float *wpe;            /* [T_max, C] (stage 0) */
    float *ln_f_weight, *ln_f_bias; /* [C] (last stage) */
    float *lm_head;        /* [V, C]   (last stage; = wte when tied) */
} pt_gpt_head_params;

/* An activation that feeds a matrix product, attention or the GELU, kept in the precision
 * they read: fp32, or under runtime.precision = bf16 rounded to bf16 once, as it is made (all
 * the forward and the backward read of it), in half the memory. Exactly one pointer is set. */
typedef struct pt_gpt_operand {
    float *f32;
    pt_bf16 *bf16;
} pt_gpt_operand;

/* Activations kept from the forward for the backward, per block. */
typedef struct pt_gpt_block_acts {
    pt_gpt_operand ln_1;          /* [N, C] */
    float *ln_1_mean, *ln_1_rstd; /* [N] */
    pt_gpt_operand qkv;           /* [N, 3C] */
    float *att;                   /* what attention saves for its backward: [B, NH, T, T]
                                     probabilities (cpu), or per-row statistics (cuda) */
    pt_gpt_operand atty;          /* [N, C] attention output before c_proj */
    float *residual_2;            /* [N, C] x + attn(ln_1(x)) */
    pt_gpt_operand ln_2;          /* [N, C] */
    float *ln_2_mean, *ln_2_rstd; /* [N] */
    pt_gpt_operand fc;            /* [N, 4C] before GELU */
    pt_gpt_operand fc_gelu;       /* [N, 4C]; none with recompute_gelu: gelu_again */
    float *residual_3;            /* [N, C] block output */
} pt_gpt_block_acts;

typedef struct pt_gpt_slice {
    pt_gpt_config config;
    int first, last;      /* blocks [first, last) */
    bool has_embedding;   /* first == 0 */
    bool has_head;        /* last == n_layer */
    int B, T;             /* activation shapes this slice was built for */
    const pt_kernels *kernels;
    pt_attention_sizer attention_sizer; /* sizes without a backend (pt_gpt_slice_sizes) */

    /* parameters and gradients: one allocation each, same layout */
    float *params, *grads;
    size_t n_params;
    pt_gpt_tensor *tensors;
    int n_tensors;
    pt_gpt_block_params *blocks, *block_grads; /* [last − first] */
    pt_gpt_head_params head, head_grads;

    /* activations: one allocation of `act_slots` sets of n_acts floats */
    float *acts;
    size_t n_acts;
    int act_slots;
    float *input;          /* [N, C] slice input: embeddings (stage 0) or received activations */
    pt_gpt_block_acts *block_acts;
    pt_gpt_operand ln_f;   /* [N, C] */
    float *ln_f_mean, *ln_f_rstd; /* [N] */
    float *dln_f;          /* [N, C] gradient of the loss w.r.t. ln_f, from the training forward */
    float *losses;         /* [N] */
    int32_t *tokens, *targets; /* [N] (backend memory) */

    /* activation gradients */
    float *grad_acts;
    size_t n_grad_acts;
    float *dresidual;   /* [N, C] gradient of the residual stream, block by block */
    float *dscratch_c;  /* [N, C]  d ln_1 / d atty / d ln_2 / d ln_f, one at a time */
    float *dscratch_3c; /* [N, 3C] d qkv */
    float *dscratch_fc_gelu; /* [N, 4C] */
    float *dscratch_fc; /* [N, 4C]; in a forward, what bf16 operands are rounded from */
    /* recompute_gelu: the GELU's output for the MLP's product, forward and backward, [N, 4C]
     * (fp32: dscratch_fc, free until the GELU's backward; bf16: a buffer of its own) */
    pt_gpt_operand gelu_again;
    /* the classifier's logits, then its dlogits, head_rows rows at a time ([head_rows, V], rows
     * logits_ld apart): the B·T·V of them never exist at once (pt_gpt_forward); in the slice's
     * precision (bf16: the product rounds them as it makes them, the cross-entropy its dlogits
     * in place; their rows padded to a multiple of 128 bytes, so that the three products on
     * them can use vector loads where V is odd, as GPT-2's 50,257; fp32: dense) */
    pt_gpt_operand logits;
    int head_rows, logits_ld;
    /* precision = bf16 (models/gpt_matmul.c): the operands rounded as they are used: an
     * upstream gradient's rows (bf16_rows elements of bf16_out), the weight matrix */
    pt_bf16 *bf16_out, *bf16_weight;
    size_t bf16_rows;
    const float *bf16_weight_of; /* the matrix bf16_weight holds in this pass, or NULL */
} pt_gpt_slice;

/* The model part of a configuration: its shape, and runtime.precision for its products. */
pt_gpt_config pt_gpt_config_from_settings(const pipert_config *cfg);

/* Validates the sizes; `where` names the source in errors. */
pipert_result pt_gpt_config_check(const pt_gpt_config *config, const char *where);

/* Bytes a slice needs for parameters, gradients and activations (before
 * optimizer state): what pt_gpt_slice_create will allocate. */
size_t pt_gpt_slice_bytes(const pt_gpt_config *config, int first, int last, int B, int T);

/* The floats a slice holds: parameters (gradients as many), activations of
 * one microbatch, and the activation gradients; 0 each if the request is
 * invalid. `attention`: what the backend's attention keeps
 * (pt_kernels_attention_sizer; NULL: the CPU's). */
void pt_gpt_slice_sizes(const pt_gpt_config *config, int first, int last, int B, int T,
                        pt_attention_sizer attention, size_t *params, size_t *acts,
                        size_t *grad_acts);

/* Allocates a slice for blocks [first, last) with activations for B×T. Fails
 * with PIPERT_ERR_NOMEM, naming the sizes, when it cannot fit in memory. */
pipert_result pt_gpt_slice_create(pt_gpt_slice **out, const pt_gpt_config *config, int first,
                                  int last, int B, int T, const pt_kernels *kernels);
void pt_gpt_slice_free(pt_gpt_slice *slice);

/* Initialises the parameters (ALGORITHMS.md §1) from `seed`; each tensor's
 * values depend only on (seed, its global name), not on the split. */
pipert_result pt_gpt_init(pt_gpt_slice *slice, uint64_t seed);

/* The tensor named `name`, or NULL. */
const pt_gpt_tensor *pt_gpt_find(const pt_gpt_slice *slice, const char *name);

/* Parameters of the whole model except wte and wpe (the N of 6N, §1), and
 * the model FLOPs per token 6N + 12·L·C·T. */
size_t pt_gpt_matmul_params(const pt_gpt_config *config);
double pt_gpt_flops_per_token(const pt_gpt_config *config, int T);

/* Forward of the slice on one microbatch, for training. Stage 0 reads slice->tokens (copy
 * them in first); other stages read slice->input. The slice output (for the next stage) is
 * pt_gpt_output(slice). The last stage reads slice->targets, returns the mean loss in *loss,
 * and already runs the classifier's backward for the loss scaled by `loss_scale` (the weight
 * of this microbatch in the step: 1/microbatches): a chunk of rows at a time, the logits,
 * the loss and dlogits in one pass, dlogits into the gradient of ln_f (kept for
 * pt_gpt_backward) and into the classifier weight's gradient (added to slice->grads here),
 * so that no [B·T, V] tensor is kept (as Liger-Kernel's fused linear cross-entropy). */
void pt_gpt_forward(pt_gpt_slice *slice, float loss_scale, float *loss);
const float *pt_gpt_output(const pt_gpt_slice *slice); /* [N, C] */

/* pt_gpt_forward again on the same microbatch and weights, for a backward whose
 * activations were not kept (pipeline.recompute): the activations and the gradient of ln_f
 * as the first pass left them, without adding the classifier weight's gradient twice. */
void pt_gpt_recompute(pt_gpt_slice *slice, float loss_scale);

/* Forward only up to the loss (no gradient): for evaluation. */
void pt_gpt_forward_eval(pt_gpt_slice *slice, float *loss);

/* Backward of the slice after pt_gpt_forward. The last stage starts from the gradient of
 * ln_f its forward left (dout is ignored); other stages start from `dout` [N, C], the
 * gradient of their output. Parameter gradients accumulate into slice->grads. Returns
 * the gradient of the slice input [N, C] (NULL for stage 0). */
const float *pt_gpt_backward(pt_gpt_slice *slice, const float *dout);

void pt_gpt_zero_grads(pt_gpt_slice *slice);

/* Activation slots: a pipeline stage keeps the activations of several
 * microbatches in flight (1F1B keeps up to S−s). Replaces the activation
 * memory with `slots` sets (what it held is not kept); call once, before the
 * first forward. */
pipert_result pt_gpt_set_activation_slots(pt_gpt_slice *slice, int slots);
/* Points every activation pointer (input, tokens, targets, dln_f, …) at the
 * set of `slot`. */
void pt_gpt_use_activation_slot(pt_gpt_slice *slice, int slot);

/* Runs the forward and backward on the parameters in `params` (same layout
 * as slice->params: a stashed or predicted weight version) instead of the
 * slice's own; NULL goes back to slice->params. Gradients still go to
 * slice->grads. */
void pt_gpt_use_params(pt_gpt_slice *slice, float *params);

#endif
