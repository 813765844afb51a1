/* The job digest of a configuration (pt_config_job_digest, runtime/config.h; the digest's
 * parts and their comparison: runtime/job_digest.c). */
#include "runtime/config.h"

#include <stdio.h>
#include <string.h>

#include <sodium.h>

/* The settings in each part of the job digest (pt_config_job_digest): only what changes the
 * shapes, the number or the order of the messages workers exchange, or how they are sealed, so
 * that a worker that differs would hang or corrupt the exchange rather than merely train
 * differently. Not in it: the learning rate and optimizer (replicas may tune their own), the
 * seed, the data, how often a run logs, validates, checkpoints or traces, and where it writes.
 * The stage split (PT_DIGEST_SPLIT) is the stage count and bounds, passed apart. */
static const char *const digested_keys[PT_DIGEST_PARTS][16] = {
    /* the tensors' shapes: activations between stages, gradients and parameters between
     * replicas, the state a joiner takes */
    [PT_DIGEST_MODEL] = {"model.n_layer", "model.n_embd", "model.n_head", "model.block_size",
                         "model.vocab_size", "model.tie_weights"},
    /* activations' batch dimension, microbatches per step, and the step the run ends at (where
     * every replica's last exchange is) */
    [PT_DIGEST_BATCH] = {"train.batch_size", "train.grad_accum", "train.steps"},
    /* which messages cross between stages, in which order, and as what (pipeline.transfer,
     * whose auto follows runtime.precision) */
    [PT_DIGEST_SCHEDULE] = {"pipeline.schedule", "pipeline.microbatches", "pipeline.sync_steps",
                            "pipeline.transfer", "runtime.precision"},
    /* what the replicas exchange, how it is encoded, and when */
    [PT_DIGEST_DP] = {"dp.method", "dp.compress", "dp.block", "dp.delay", "dp.fraction",
                      "dp.partition_block", "dp.period", "dp.fragments", "dp.overlap", "dp.nccl"},
    /* whether every message carries a MAC */
    [PT_DIGEST_AUTH] = {"runtime.authenticate_messages"},
};

/* 64 bits of BLAKE2b (libsodium's generichash) over `text`. */
static uint64_t digest_text(const char *text)
{
    uint8_t digest[8];
    crypto_generichash(digest, sizeof digest, (const unsigned char *)text, strlen(text), NULL, 0);
    uint64_t value = 0;
    for (int b = 0; b < 8; b++) value |= (uint64_t)digest[b] << (8 * b);
    return value ? value : 1; /* 0 means "no digest" */
}

/* "model.n_layer=2;model.n_embd=32;..." for the keys of one part, digested. */
static uint64_t digest_keys(const pipert_config *cfg, const char *const *names)
{
    char text[4096];
    size_t used = 0;
    text[0] = '\0';
    for (; *names && used < sizeof text; names++) {
        char formatted[PT_CONFIG_STRING_MAX + 8];
        pt_config_format_value(cfg, *names, formatted, sizeof formatted);
        used += (size_t)snprintf(text + used, sizeof text - used, "%s=%s;", *names, formatted);
    }
    return digest_text(text);
}

static uint64_t digest_split(int stages, const int *bounds)
{
    char text[4096];
    size_t used = (size_t)snprintf(text, sizeof text, "stages=%d;bounds=", stages);
    for (int s = 0; s <= stages && used < sizeof text; s++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%d,", bounds[s]);
    return digest_text(text);
}

void pt_config_job_digest(const pipert_config *cfg, int stages, const int *bounds,
                          pt_job_identity *out)
{
    *out = (pt_job_identity){.protocol = PT_PROTOCOL_VERSION};
    for (int part = 0; part < PT_DIGEST_PARTS; part++)
        out->part[part] = part == PT_DIGEST_SPLIT ? digest_split(stages, bounds)
                                                  : digest_keys(cfg, digested_keys[part]);
}
