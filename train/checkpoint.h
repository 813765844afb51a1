/* Model state on disk, as safetensors named by the global Hugging Face GPT-2
 * names (ALGORITHMS.md §1), so PyTorch reads them and a run can resume under
 * another stage split.
 *
 * A checkpoint DIR/ckpt-STEP.safetensors (STEP zero-padded to 8 digits) holds
 * every parameter of a slice under its own name, the optimizer moments under
 * "optimizer.m.NAME" / "optimizer.v.NAME", and metadata: "format"
 * (pipert-checkpoint-1), "config" (the full configuration, JSON), "step",
 * "data_position" (the next training step: batches are a pure function of
 * (seed, replica, step)), "optimizer" (kind, t, Π in full precision), and the
 * slice's "first_layer"/"last_layer". Files are written atomically, so every
 * ckpt-*.safetensors is complete. */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include <stdbool.h>

#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "train/optimizer.h"

/* Writes the checkpoint of `step` into dir; keeps the `keep` newest (0: all). */
pipert_result pt_checkpoint_save(const char *dir, long step, const pt_gpt_slice *slice,
                                 const pt_optimizer *opt, const pipert_config *cfg, int keep);

/* The newest checkpoint in dir (PIPERT_ERR_NOT_FOUND if none); *path is
 * malloc'd. */
pipert_result pt_checkpoint_find_latest(const char *dir, char **path, long *step);

/* Restores parameters and optimizer state from a checkpoint written for the
 * same model configuration (the model keys must match; a difference is an
 * error naming the key); *step is the step it was written after. */
pipert_result pt_checkpoint_load(const char *path, pt_gpt_slice *slice, pt_optimizer *opt,
                                 long *step);

/* Loads every parameter of `slice` from an open safetensors file by global
 * name (any float dtype). A file without lm_head.weight (a tied GPT-2
 * checkpoint) gives the head a copy of wte.weight. A missing tensor or a shape
 * mismatch is an error naming the tensor and the file. */
pipert_result pt_gpt_load_params(pt_gpt_slice *slice, const pt_safetensors *st);

/* Adds the tensors of a host buffer laid out like slice->params (parameters,
 * gradients or optimizer moments) to a writer, each under prefix + its name.
 * The buffer must outlive the write. */
pipert_result pt_gpt_add_to_writer(pt_safetensors_writer *w, const pt_gpt_slice *slice,
                                   const float *host_buffer, const char *prefix);

/* Fills cfg->model from a safetensors file: from its "config" metadata when
 * present, else inferred from the tensor shapes (n_layer from the h.N names,
 * n_embd and vocab_size from wte, block_size from wpe, tie_weights when there
 * is no lm_head, n_head = n_embd/64 as in every GPT-2 size, or 0 = unknown
 * when n_embd is not a multiple of 64). Used by
 * `pipert check`; command-line overrides apply after it. */
pipert_result pt_model_settings_from_file(const pt_safetensors *st, pipert_config *cfg);

/* The model part of a configuration. */
pt_gpt_config pt_gpt_config_from_settings(const pipert_config *cfg);

#endif
