/* libFuzzer harness: training data (runtime/data.c), llm.c token shards and
 * text. The input is 4 bytes of settings — format and file name, validation
 * fraction, block size — then a file's bytes. A dataset that loads and passes
 * pt_dataset_check serves training and validation batches of its own tokens. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "runtime/data.h"

#define SETTINGS 4
#define BATCH 2

static void check_tokens(const pt_dataset *ds, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++) FUZZ_CHECK(tokens[i] >= 0 && tokens[i] <= ds->max_token);
}

static void draw_batches(const pt_dataset *ds, int T, uint8_t seed)
{
    int32_t *inputs = malloc(sizeof *inputs * BATCH * (size_t)T);
    int32_t *targets = malloc(sizeof *targets * BATCH * (size_t)T);
    FUZZ_CHECK(inputs && targets);
    pt_dataset_train_batch(ds, seed, seed, 0, BATCH, T, inputs, targets);
    check_tokens(ds, inputs, BATCH * T);
    check_tokens(ds, targets, BATCH * T);
    if (ds->n_tokens > ds->n_train) {
        for (int k = 0; k < 2; k++) pt_dataset_val_batch(ds, k, 2, BATCH, T, inputs, targets);
        check_tokens(ds, inputs, BATCH * T);
    }
    free(inputs);
    free(targets);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (size < SETTINGS) return 0;
    static const pt_data_format formats[] = {PT_DATA_AUTO, PT_DATA_TEXT, PT_DATA_TOKENS,
                                             PT_DATA_AUTO};
    const pt_data_format format = formats[data[0] & 3];
    const char *name = data[0] & 4 ? "fuzz.bin" : "fuzz.txt";
    double val_fraction = data[1] / 256.0;
    int T = 1 + (data[2] | data[3] << 8) % 64;
    const uint8_t *file = data + SETTINGS;
    size_t file_size = size - SETTINGS;

    uint16_t *shard;
    size_t count;
    if (pt_shard_parse(name, file, file_size, &shard, &count) == PIPERT_OK) {
        FUZZ_CHECK(PT_SHARD_HEADER_BYTES + 2 * count == file_size);
        free(shard);
    }
    pt_dataset ds;
    if (pt_dataset_load_memory(&ds, name, file, file_size, format, val_fraction) != PIPERT_OK)
        return 0;
    FUZZ_CHECK(ds.n_tokens > 0 && ds.n_train <= ds.n_tokens);
    if (pt_dataset_check(&ds, T, 65536) == PIPERT_OK) draw_batches(&ds, T, data[1]);
    pt_dataset_free(&ds);
    return 0;
}
