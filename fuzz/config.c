/* libFuzzer harness: the JSON configuration and `--section.key=value` overrides
 * (runtime/config.c). The input is a configuration text, then after a NUL byte
 * one override per line. Whatever it holds, each step either fails with a
 * message or leaves a configuration that prints as JSON and reads back the
 * same. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "runtime/config.h"

/* data[0, size) as a NUL-terminated string (it may hold NUL bytes of its own). */
static char *string_of(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return NULL;
    memcpy(text, data, size);
    text[size] = '\0';
    return text;
}

static void apply_overrides(pipert_config *cfg, const uint8_t *data, size_t size)
{
    while (size > 0) {
        const uint8_t *newline = memchr(data, '\n', size);
        size_t length = newline ? (size_t)(newline - data) : size;
        char *line = string_of(data, length);
        if (line) (void)pipert_config_set(cfg, line);
        free(line);
        data += length + (newline != NULL);
        size -= length + (newline != NULL);
    }
}

/* A configuration printed as JSON reads back as itself. */
static void check_round_trip(const pipert_config *cfg)
{
    char *text = pipert_config_to_json(cfg);
    FUZZ_CHECK(text != NULL);
    pipert_config again;
    pt_config_defaults(&again);
    FUZZ_CHECK(pt_config_merge_json(&again, text, "printed") == PIPERT_OK);
    FUZZ_CHECK(memcmp(&again, cfg, sizeof again) == 0);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    const uint8_t *nul = memchr(data, '\0', size);
    size_t json_size = nul ? (size_t)(nul - data) : size;
    char *text = string_of(data, json_size);
    if (!text) return 0;
    pipert_config cfg;
    pt_config_defaults(&cfg);
    (void)pt_config_merge_json(&cfg, text, "fuzz.json");
    free(text);
    if (nul) apply_overrides(&cfg, nul + 1, size - json_size - 1);
    (void)pt_config_validate(&cfg);
    pipert_config defaults;
    pt_config_defaults(&defaults);
    if (memcmp(&cfg, &defaults, sizeof cfg) != 0) check_round_trip(&cfg); /* (slow: every key) */
    free(pt_config_model_to_json(&cfg));
    return 0;
}
