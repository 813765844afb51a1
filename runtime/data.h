/* Training data: a byte-level tokenizer, llm.c token shards, and a dataset
 * that serves reproducible training and validation batches.
 *
 * Tokens. Text is tokenized byte by byte (token = byte value, vocabulary 256).
 * Token shards are the llm.c format: 256 little-endian int32 (magic 20240520,
 * version 1, token count, the rest zero), then `count` little-endian uint16.
 *
 * Sources (data.path, data.format):
 *   ""           the Debian `fortunes` corpus, /usr/share/games/fortunes;
 *   a file       text, or a token shard;
 *   a directory  every regular file directly in it whose name does not end in
 *                .dat or .u8 (strfile indexes and their UTF-8 links), in
 *                byte-wise sorted name order, concatenated.
 * In text, a line that is exactly "%" (the fortune separator) becomes an empty
 * line, so fortunes stay apart; everything else is kept as it is. With format
 * "auto" a file is a token shard if its first 4 bytes are the shard magic or
 * its name ends in .bin, text otherwise; "text" and "tokens" force one.
 *
 * Splits. The token stream tok[0, n) is cut once: [0, n_train) trains,
 * [n_train, n) validates, n − n_train = round(val_fraction·n).
 */
#ifndef PT_DATA_H
#define PT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/settings.h"

#define PT_SHARD_MAGIC 20240520
#define PT_SHARD_VERSION 1
#define PT_SHARD_HEADER_INTS 256
#define PT_SHARD_HEADER_BYTES (PT_SHARD_HEADER_INTS * 4)

#define PT_FORTUNES_DIR "/usr/share/games/fortunes"

/* ---- token shards -------------------------------------------------------- */

/* Reads a version-1 shard; *tokens [count] is malloc'd (caller frees). Every
 * failure is PIPERT_ERR_IO (cannot read) or PIPERT_ERR_FORMAT (short header,
 * wrong magic, other version, size ≠ 1024 + 2·count) and names the file. */
pipert_result pt_shard_read(const char *path, uint16_t **tokens, size_t *count);
/* The same from a shard's bytes in memory; `name` names them in errors. */
pipert_result pt_shard_parse(const char *name, const void *bytes, size_t size, uint16_t **tokens,
                             size_t *count);

/* Writes tokens [count] as a version-1 shard, atomically (temporary file in
 * the same directory, renamed over `path`). count must fit in an int32. */
pipert_result pt_shard_write(const char *path, const uint16_t *tokens, size_t count);

/* ---- dataset ------------------------------------------------------------- */

/* How training sequences are drawn (data.sampling). */

typedef struct pt_dataset {
    uint16_t *tokens;  /* [n_tokens]: train split, then validation split */
    size_t n_tokens;
    size_t n_train;    /* tokens [0, n_train) train, [n_train, n_tokens) validate */
    int max_token;     /* the largest token id (to check against model.vocab_size) */
    char source[256];  /* what was loaded, for messages and logs */
    pt_sampling sampling;      /* PT_SAMPLING_RANDOM unless set after loading */
    long sequences_per_step;   /* sequential: sequences in one step's global batch */
} pt_dataset;

/* Loads `path` ("" or NULL: the fortunes corpus) as `format` (data.format: auto decides from
 * the file), holding out the last round(val_fraction·n) tokens, 0 ≤ val_fraction < 1. On
 * failure *ds is empty (safe to free). */
pipert_result pt_dataset_load(pt_dataset *ds, const char *path, pt_data_format format,
                              double val_fraction);

/* The same from one file's bytes in memory, `name` standing for its path (in
 * messages, and for format "auto": a name ending in .bin is a token shard). */
pipert_result pt_dataset_load_memory(pt_dataset *ds, const char *name, const void *bytes,
                                     size_t size, pt_data_format format, double val_fraction);

void pt_dataset_free(pt_dataset *ds);

/* Checks that the dataset can serve sequences of T+1 tokens to a model with
 * `vocab_size` tokens: the train split holds at least T+1 tokens, the
 * validation split is empty (val_fraction 0: no validation) or holds at least
 * T+1, and every token is < vocab_size. Returns PIPERT_ERR_CONFIG with a
 * message naming the source otherwise. */
pipert_result pt_dataset_check(const pt_dataset *ds, int T, int vocab_size);

/* Sequences [first, first + B) of the global training batch of `step`: T+1
 * tokens each from the train split. Sequential sampling: sequence i starts at
 * o_i = ((step·sequences_per_step + i)·T) mod (n_train − T). Random sampling
 * (the default): sequence i starts at offset
 * o_i = pt_rng_below(key, step·2³² + i, n_train − T) with
 * key = pt_rng_key(seed, PT_DATA_STREAM), i.e. uniform in [0, n_train − T − 1].
 * A batch depends on nothing else: the same call always gives the same batch
 * (that is what makes --resume exact), and replica r of R, with first = r·B,
 * draws its share of the very batch one worker with batch R·B would draw
 * (that is what makes data parallelism equal to a larger batch).
 *   inputs  [B, T]: inputs[b·T + t]  = tok[o_{first+b} + t]
 *   targets [B, T]: targets[b·T + t] = tok[o_{first+b} + t + 1]
 * Requires pt_dataset_check(ds, T, ...) == PIPERT_OK. */
void pt_dataset_train_batch(const pt_dataset *ds, uint64_t seed, long step, long first, int B,
                            int T, int32_t *inputs, int32_t *targets);

/* The Philox stream id of training-batch draws. */
#define PT_DATA_STREAM 0x64617461u /* "data" */

/* Validation batch k of n (0 ≤ k < n): fixed sequences evenly spread over the
 * validation split. Sequence j = k·B + b of J = n·B starts at
 * n_train + floor(j·(n_val − T) / J), so together the n batches cover the
 * split from its first token to (nearly) its last. Shapes as for training.
 * Requires a validation split of at least T+1 tokens. */
void pt_dataset_val_batch(const pt_dataset *ds, int k, int n, int B, int T, int32_t *inputs,
                          int32_t *targets);


#endif
