/* libFuzzer harness: a safetensors file (header length, JSON header, offsets, data). Whatever the
 * bytes, opening either fails with a message or gives entries that lie inside the input, and every
 * reader of an open file works on them. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "runtime/safetensors.h"

static void read_entries(const pt_safetensors *st, const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < pt_safetensors_count(st); i++) {
        const pt_tensor_entry *t = pt_safetensors_at(st, i);
        const uint8_t *bytes = pt_safetensors_data(st, t);
        FUZZ_CHECK(bytes >= data && bytes + t->nbytes <= data + size);
        FUZZ_CHECK(pt_safetensors_find(st, t->name) == t);
        if (t->numel > 1024) continue;
        float values[1024];
        (void)pt_safetensors_read_f32(st, t, values, t->numel);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    pt_safetensors *st;
    if (pt_safetensors_open_memory(&st, "fuzz.safetensors", data, size) != PIPERT_OK) return 0;
    read_entries(st, data, size);
    (void)pt_safetensors_metadata(st, "format");
    FUZZ_CHECK(pt_safetensors_find(st, "") == NULL || pt_safetensors_count(st) > 0);
    pt_safetensors_close(st);
    return 0;
}
