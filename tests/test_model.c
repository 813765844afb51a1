/* The GPT slice: gradients against finite differences of the whole model (its classifier
 * in chunks of rows too), a recomputed forward, slices composing to the whole,
 * initialisation independent of the split, sizes against hand counts, and a model too large
 * for memory. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt.h"
#include "runtime/rng.h"

static const pt_gpt_config tiny = {.n_layer = 2, .n_embd = 8, .n_head = 2, .block_size = 6,
                                   .vocab_size = 13, .tie_weights = false};
enum { B = 2, T = 5 };

static void random_tokens(int32_t *tokens, int32_t *targets, int V, uint64_t seed)
{
    pt_philox_key key = pt_rng_key(seed, 99);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(pt_rng_u64(key, 2 * i) % V);
        targets[i] = (int32_t)(pt_rng_u64(key, 2 * i + 1) % V);
    }
}

/* `to` gets the tokens and targets of `from` (same shape). */
static void same_batch(pt_gpt_slice *to, const pt_gpt_slice *from)
{
    memcpy(to->tokens, from->tokens, sizeof(int32_t) * B * T);
    memcpy(to->targets, from->targets, sizeof(int32_t) * B * T);
}

static pt_gpt_slice *make_slice(const pt_gpt_config *c, int first, int last)
{
    pt_gpt_slice *s = NULL;
    pipert_result rc = pt_gpt_slice_create(&s, c, first, last, B, T, pt_kernels_cpu());
    cr_assert_eq(rc, PIPERT_OK, "slice_create: %s", pipert_last_error());
    cr_assert_eq(pt_gpt_init(s, 1234), PIPERT_OK);
    return s;
}

/* Larger weights than the real init, so every gradient is well above the
 * finite-difference noise of fp32. */
static void scramble_params(pt_gpt_slice *s)
{
    pt_philox_key key = pt_rng_key(77, 1);
    for (size_t i = 0; i < s->n_params; i++) s->params[i] += 0.3f * pt_rng_normal(key, i);
}

static float loss_of(pt_gpt_slice *s)
{
    float loss = 0;
    pt_gpt_forward_eval(s, &loss);
    return loss;
}

static void check_gradients_by_finite_differences(const pt_gpt_config *c)
{
    pt_gpt_slice *s = make_slice(c, 0, c->n_layer);
    scramble_params(s);
    random_tokens(s->tokens, s->targets, c->vocab_size, 5);
    pt_gpt_zero_grads(s);
    float loss;
    pt_gpt_forward(s, 1.0f, &loss);
    pt_gpt_backward(s, NULL);

    const float h = 1e-2f;
    int checked = 0;
    for (int ti = 0; ti < s->n_tensors; ti++) {
        const pt_gpt_tensor *t = &s->tensors[ti];
        /* a few spread-out elements of every tensor */
        for (size_t j = 0; j < t->numel; j += t->numel / 5 + 1) {
            float *p = &s->params[t->offset + j];
            const float saved = *p;
            *p = saved + h;
            double up = loss_of(s);
            *p = saved - h;
            double down = loss_of(s);
            *p = saved;
            double numeric = (up - down) / (2.0 * h);
            double analytic = s->grads[t->offset + j];
            double tolerance = 2e-3 + 3e-2 * fabs(numeric);
            cr_expect(fabs(analytic - numeric) <= tolerance,
                      "%s[%zu]: analytic %.6g vs finite difference %.6g", t->name, j, analytic,
                      numeric);
            checked++;
        }
    }
    cr_expect_gt(checked, 50);
    pt_gpt_slice_free(s);
}

Test(model, gradients_match_finite_differences)
{
    check_gradients_by_finite_differences(&tiny);
}

Test(model, tied_head_gradients_match_finite_differences)
{
    pt_gpt_config tied = tiny;
    tied.tie_weights = true;
    check_gradients_by_finite_differences(&tied);
}

/* A vocabulary wider than a block's widest activation (V = 700 > N·4C = 320 values) makes the
 * classifier run a row at a time (models/gpt.h: its backward inside the forward, in chunks):
 * the gradients, the classifier's among them, still those of the loss. */
Test(model, classifier_in_chunks_of_rows_matches_finite_differences)
{
    pt_gpt_config wide = tiny;
    wide.vocab_size = 700;
    pt_gpt_slice *s = make_slice(&wide, 0, wide.n_layer);
    cr_assert_lt(s->head_rows, B * T, "the classifier runs in chunks");
    pt_gpt_slice_free(s);
    check_gradients_by_finite_differences(&wide);
    wide.tie_weights = true;
    check_gradients_by_finite_differences(&wide);
}

/* pipeline.recompute runs the forward again before the backward: the gradient of ln_f comes
 * back the same and the classifier weight's gradient is not added a second time, so the
 * backward ends with the gradients of one forward and backward. */
Test(model, a_recomputed_forward_adds_no_gradient)
{
    pt_gpt_config wide = tiny;
    wide.vocab_size = 700;
    pt_gpt_slice *once = make_slice(&wide, 0, wide.n_layer);
    pt_gpt_slice *again = make_slice(&wide, 0, wide.n_layer);
    random_tokens(once->tokens, once->targets, wide.vocab_size, 3);
    same_batch(again, once);
    const size_t NC = (size_t)B * T * wide.n_embd;
    float *dln_f = malloc(NC * sizeof(float));
    pt_gpt_slice *both[2] = {once, again};
    for (int m = 0; m < 2; m++) {
        pt_gpt_zero_grads(both[m]);
        pt_gpt_forward(both[m], 0.5f, NULL);
    }
    memcpy(dln_f, again->dln_f, NC * sizeof(float));
    memset(again->dln_f, 0, NC * sizeof(float));
    pt_gpt_recompute(again, 0.5f);
    cr_expect_arr_eq(again->dln_f, dln_f, NC * sizeof(float), "dln_f recomputed differs");
    cr_expect_arr_eq(again->grads, once->grads, once->n_params * sizeof(float),
                     "the recomputed forward added to the gradients");
    for (int m = 0; m < 2; m++) pt_gpt_backward(both[m], NULL);
    cr_expect_arr_eq(again->grads, once->grads, once->n_params * sizeof(float));
    free(dln_f);
    pt_gpt_slice_free(once);
    pt_gpt_slice_free(again);
}

/* recompute_gelu (a GPU's choice): the GELU computed again in the backward gives the bits of
 * the one kept, in either precision, for 4·N·4C bytes (fp32) or 2·N·4C (bf16) less a block. */
static void check_recomputed_gelu(pt_precision precision)
{
    pt_gpt_config c = tiny;
    c.precision = precision;
    pt_gpt_slice *kept = make_slice(&c, 0, c.n_layer);
    c.recompute_gelu = true;
    pt_gpt_slice *again = make_slice(&c, 0, c.n_layer);
    const size_t bf16 = precision == PT_PRECISION_BF16;
    const size_t floats_a_block = (size_t)B * T * 4 * c.n_embd / (bf16 ? 2 : 1);
    cr_expect_eq(kept->n_acts - again->n_acts, c.n_layer * floats_a_block, "activations: %zu, %zu",
                 kept->n_acts, again->n_acts);
    random_tokens(kept->tokens, kept->targets, c.vocab_size, 4);
    same_batch(again, kept);
    float loss[2];
    pt_gpt_slice *both[2] = {kept, again};
    for (int m = 0; m < 2; m++) {
        pt_gpt_zero_grads(both[m]);
        pt_gpt_forward(both[m], 1.0f, &loss[m]);
        pt_gpt_backward(both[m], NULL);
    }
    cr_expect_eq(loss[0], loss[1]);
    cr_expect_arr_eq(again->grads, kept->grads, kept->n_params * sizeof(float),
                     "gradients with the GELU recomputed differ (%s)",
                     precision == PT_PRECISION_BF16 ? "bf16" : "fp32");
    pt_gpt_slice_free(kept);
    pt_gpt_slice_free(again);
}

Test(model, a_recomputed_gelu_gives_the_same_bits)
{
    check_recomputed_gelu(PT_PRECISION_FP32);
    check_recomputed_gelu(PT_PRECISION_BF16);
}

Test(model, parameter_count_matches_hand_count)
{
    pt_gpt_slice *s = make_slice(&tiny, 0, tiny.n_layer);
    const size_t C = 8, V = 13, L = 2, Tmax = 6;
    size_t per_block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) +
                       (4 * C * C + C);
    cr_expect_eq(s->n_params, V * C + Tmax * C + L * per_block + 2 * C + V * C);
    cr_expect_eq(pt_gpt_matmul_params(&tiny), L * per_block + 2 * C + V * C);
    cr_expect_eq(s->n_tensors, 2 + 12 * 2 + 3);
    const pt_gpt_tensor *w = pt_gpt_find(s, "h.1.mlp.c_proj.weight");
    cr_assert_not_null(w);
    cr_expect_eq(w->shape[0], 4 * 8);
    cr_expect_eq(w->shape[1], 8);
    cr_expect(w->decay);
    cr_expect(!pt_gpt_find(s, "h.1.ln_2.bias")->decay);
    cr_expect_null(pt_gpt_find(s, "h.2.ln_1.weight"));
    /* PaLM appendix B: 6N + 12·L·C·T */
    cr_expect_float_eq(pt_gpt_flops_per_token(&tiny, 5),
                       6.0 * (double)pt_gpt_matmul_params(&tiny) + 12.0 * 2 * 8 * 5, 1e-9);
    pt_gpt_slice_free(s);
}

Test(model, initialisation_follows_the_spec_and_ignores_the_split)
{
    pt_gpt_slice *whole = make_slice(&tiny, 0, 2), *second = make_slice(&tiny, 1, 2);
    for (int i = 0; i < second->n_tensors; i++) {
        const pt_gpt_tensor *t = &second->tensors[i], *u = pt_gpt_find(whole, t->name);
        cr_assert_not_null(u, "%s missing from the whole model", t->name);
        cr_expect(!memcmp(second->params + t->offset, whole->params + u->offset,
                          t->numel * sizeof(float)),
                  "%s differs between the split and the whole model", t->name);
    }
    cr_expect_eq(whole->head.ln_f_weight[3], 1.0f);
    cr_expect_eq(whole->blocks[0].c_attn_bias[5], 0.0f);
    pt_gpt_slice_free(whole);
    pt_gpt_slice_free(second);

    /* standard deviations: 0.02, and 0.02/sqrt(2L) for the residual projections */
    pt_gpt_config wide = {.n_layer = 8, .n_embd = 64, .n_head = 4, .block_size = 4, .vocab_size = 300};
    pt_gpt_slice *s = NULL;
    cr_assert_eq(pt_gpt_slice_create(&s, &wide, 0, 8, 1, 4, pt_kernels_cpu()), PIPERT_OK);
    cr_assert_eq(pt_gpt_init(s, 9), PIPERT_OK);
    const char *names[] = {"wte.weight", "h.3.mlp.c_fc.weight", "h.3.mlp.c_proj.weight"};
    const double expected[] = {0.02, 0.02, 0.02 / 4.0};
    for (int k = 0; k < 3; k++) {
        const pt_gpt_tensor *t = pt_gpt_find(s, names[k]);
        double sum2 = 0;
        for (size_t j = 0; j < t->numel; j++) sum2 += (double)s->params[t->offset + j] * s->params[t->offset + j];
        double std = sqrt(sum2 / (double)t->numel);
        cr_expect(fabs(std - expected[k]) < 0.05 * expected[k], "%s: std %g, expected %g",
                  names[k], std, expected[k]);
    }
    pt_gpt_slice_free(s);
}

/* Two slices [0,1) and [1,2), activations and gradients handed across by
 * hand, equal the whole model: the contract a pipeline stage relies on. */
Test(model, slices_compose_to_the_whole_model)
{
    pt_gpt_slice *whole = make_slice(&tiny, 0, 2);
    pt_gpt_slice *first = make_slice(&tiny, 0, 1), *second = make_slice(&tiny, 1, 2);
    random_tokens(whole->tokens, whole->targets, tiny.vocab_size, 11);
    memcpy(first->tokens, whole->tokens, sizeof(int32_t) * B * T);
    memcpy(second->targets, whole->targets, sizeof(int32_t) * B * T);

    float whole_loss, split_loss;
    pt_gpt_zero_grads(whole);
    pt_gpt_forward(whole, 0.5f, &whole_loss);
    pt_gpt_backward(whole, NULL);

    pt_gpt_zero_grads(first);
    pt_gpt_zero_grads(second);
    pt_gpt_forward(first, 0.5f, NULL);
    memcpy(second->input, pt_gpt_output(first), sizeof(float) * B * T * tiny.n_embd);
    pt_gpt_forward(second, 0.5f, &split_loss);
    const float *dx = pt_gpt_backward(second, NULL);
    cr_assert_not_null(dx);
    cr_expect_null(pt_gpt_backward(first, dx));

    cr_expect_float_eq(split_loss, whole_loss, 1e-6f * whole_loss);
    pt_gpt_slice *parts[2] = {first, second};
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < parts[p]->n_tensors; i++) {
            const pt_gpt_tensor *t = &parts[p]->tensors[i], *u = pt_gpt_find(whole, t->name);
            for (size_t j = 0; j < t->numel; j++) {
                float a = parts[p]->grads[t->offset + j], b = whole->grads[u->offset + j];
                cr_assert(fabsf(a - b) <= 1e-6f + 1e-5f * fabsf(b), "%s[%zu]: split %g, whole %g",
                          t->name, j, a, b);
            }
        }
    pt_gpt_slice_free(whole);
    pt_gpt_slice_free(first);
    pt_gpt_slice_free(second);
}

/* runtime.precision = bf16: the products' operands are rounded to bf16 (8 significant bits, a
 * relative error of at most 2^-9 each) and everything else stays fp32, so the loss and the
 * gradient stay within a few such roundings of the fp32 model's, and differ from them (the
 * rounding is in effect). */
static void check_bf16_follows_fp32(pt_gpt_config c)
{
    pt_gpt_slice *exact = make_slice(&c, 0, c.n_layer);
    c.precision = PT_PRECISION_BF16;
    pt_gpt_slice *rounded = make_slice(&c, 0, c.n_layer);
    cr_expect_gt(rounded->n_grad_acts, exact->n_grad_acts, "bf16 has its operands' scratch");
    scramble_params(exact);
    scramble_params(rounded);
    random_tokens(exact->tokens, exact->targets, c.vocab_size, 9);
    same_batch(rounded, exact);
    float loss32, loss16;
    pt_gpt_slice *both[2] = {exact, rounded};
    for (int m = 0; m < 2; m++) {
        pt_gpt_zero_grads(both[m]);
        pt_gpt_forward(both[m], 1.0f, m ? &loss16 : &loss32);
        pt_gpt_backward(both[m], NULL);
    }
    cr_expect(fabsf(loss16 - loss32) <= 1e-2f * loss32 && loss16 != loss32,
              "loss: bf16 %.7f, fp32 %.7f", loss16, loss32);
    double diff = 0, norm = 0;
    for (int i = 0; i < exact->n_tensors; i++) {
        const pt_gpt_tensor *t = &exact->tensors[i];
        double d = 0, n = 0;
        for (size_t j = t->offset; j < t->offset + t->numel; j++) {
            const double g32 = exact->grads[j], g16 = rounded->grads[j];
            d += (g16 - g32) * (g16 - g32);
            n += g32 * g32;
        }
        cr_expect(sqrt(d) <= 5e-2 * sqrt(n) + 1e-6, "%s: bf16 gradient off by %.3g of its norm",
                  t->name, sqrt(d / (n > 0 ? n : 1)));
        diff += d, norm += n;
    }
    cr_expect(sqrt(diff) <= 2e-2 * sqrt(norm) && diff > 0,
              "the bf16 gradient is off by %.3g of its norm", sqrt(diff / norm));
    pt_gpt_slice_free(exact);
    pt_gpt_slice_free(rounded);
}

Test(model, bf16_products_follow_the_fp32_model)
{
    check_bf16_follows_fp32(tiny);
    pt_gpt_config tied = tiny;
    tied.tie_weights = true;
    check_bf16_follows_fp32(tied);
}

/* A vocabulary wider than the row buffers (V = 700 > N·4C = 320 values) sends the head's
 * gradient through in chunks of rows (one here): the same within bf16's rounding. */
Test(model, bf16_head_gradient_in_chunks_of_rows_follows_the_fp32_model)
{
    pt_gpt_config wide = tiny;
    wide.vocab_size = 700;
    check_bf16_follows_fp32(wide);
}

Test(model, bad_slices_and_sizes_are_refused)
{
    pt_gpt_slice *s = NULL;
    cr_expect_eq(pt_gpt_slice_create(&s, &tiny, 1, 3, B, T, pt_kernels_cpu()), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_gpt_slice_create(&s, &tiny, 0, 2, B, 7, pt_kernels_cpu()), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "block_size") != NULL, "%s", pipert_last_error());
    pt_gpt_config odd = tiny;
    odd.n_head = 3;
    cr_expect_eq(pt_gpt_slice_create(&s, &odd, 0, 2, B, T, pt_kernels_cpu()), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "n_head") != NULL, "%s", pipert_last_error());
    pt_gpt_config tied = tiny;
    tied.tie_weights = true;
    cr_expect_eq(pt_gpt_slice_create(&s, &tied, 0, 1, B, T, pt_kernels_cpu()), PIPERT_ERR_CONFIG);
    cr_expect_null(s);
}

Test(model, a_model_too_large_for_memory_is_an_error_not_a_crash)
{
    /* ~200 layers of width 16384: terabytes of parameters */
    pt_gpt_config huge = {.n_layer = 200, .n_embd = 16384, .n_head = 128, .block_size = 2048,
                          .vocab_size = 50257};
    pt_gpt_slice *s = NULL;
    cr_expect_eq(pt_gpt_slice_create(&s, &huge, 0, 200, 8, 2048, pt_kernels_cpu()), PIPERT_ERR_NOMEM);
    cr_expect_null(s);
    cr_expect(strstr(pipert_last_error(), "GiB") != NULL, "message: %s", pipert_last_error());
    cr_expect(strstr(pipert_last_error(), "n_layer=200") != NULL, "message: %s", pipert_last_error());
}
