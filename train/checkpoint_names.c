/* The names of a checkpoint's files, the steps they name, and write ids as
 * text. Names are
 * written with the step zero-padded to 8 digits; they are read with any
 * padding (a directory's checkpoints are found by reading its names, never
 * by deriving a name from a step). */
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint.h"

#define PREFIX "ckpt-"
#define INDEX_SUFFIX ".json"
#define PART_INFIX "-stage-"
#define REPLICA_INFIX "-replica-"
#define PART_SUFFIX ".safetensors"
#define TEMP_INFIX ".tmp." /* runtime/fileio.c: PATH.tmp.PID */

void pt_checkpoint_part_name(long step, int stage, int replica, char name[PT_CHECKPOINT_NAME_MAX])
{
    if (replica == 0)
        snprintf(name, PT_CHECKPOINT_NAME_MAX, PREFIX "%08ld" PART_INFIX "%d" PART_SUFFIX, step,
                 stage);
    else
        snprintf(name, PT_CHECKPOINT_NAME_MAX,
                 PREFIX "%08ld" PART_INFIX "%d" REPLICA_INFIX "%d" PART_SUFFIX, step, stage,
                 replica);
}

void pt_checkpoint_index_name(long step, char name[PT_CHECKPOINT_NAME_MAX])
{
    snprintf(name, PT_CHECKPOINT_NAME_MAX, PREFIX "%08ld" INDEX_SUFFIX, step);
}

/* DIGITS at *p (no sign, no space): their value, *p moved past them; −1 if
 * there are none or they overflow. */
static long parse_digits(const char **p)
{
    if (!isdigit((unsigned char)**p)) return -1;
    long value = 0;
    for (; isdigit((unsigned char)**p); (*p)++) {
        const int digit = **p - '0';
        if (value > (LONG_MAX - digit) / 10) return -1;
        value = value * 10 + digit;
    }
    return value;
}

/* "ckpt-" DIGITS, then the rest; the step, or −1. */
static long parse_step(const char *name, const char **rest)
{
    if (strncmp(name, PREFIX, strlen(PREFIX))) return -1;
    *rest = name + strlen(PREFIX);
    return parse_digits(rest);
}

long pt_checkpoint_index_step(const char *name)
{
    const char *rest;
    long step = parse_step(name, &rest);
    return step >= 0 && !strcmp(rest, INDEX_SUFFIX) ? step : -1;
}

/* INFIX DIGITS at *p: moves *p past them; false if not there. */
static bool skip_number_after(const char **p, const char *infix)
{
    if (strncmp(*p, infix, strlen(infix))) return false;
    const char *digits = *p + strlen(infix);
    if (parse_digits(&digits) < 0) return false;
    *p = digits;
    return true;
}

long pt_checkpoint_part_step(const char *name)
{
    const char *rest;
    long step = parse_step(name, &rest);
    if (step < 0 || !skip_number_after(&rest, PART_INFIX)) return -1;
    skip_number_after(&rest, REPLICA_INFIX); /* a replica file */
    return !strcmp(rest, PART_SUFFIX) ? step : -1;
}

long pt_checkpoint_temp_step(const char *name)
{
    const char *temp = strstr(name, TEMP_INFIX), *pid = temp ? temp + strlen(TEMP_INFIX) : NULL;
    if (!temp || (size_t)(temp - name) >= PT_CHECKPOINT_NAME_MAX || parse_digits(&pid) < 0 || *pid)
        return -1;
    char final[PT_CHECKPOINT_NAME_MAX];
    snprintf(final, sizeof final, "%.*s", (int)(temp - name), name);
    const long step = pt_checkpoint_index_step(final);
    return step >= 0 ? step : pt_checkpoint_part_step(final);
}

void pt_checkpoint_format_write_id(uint64_t id, char text[PT_WRITE_ID_CHARS + 1])
{
    snprintf(text, PT_WRITE_ID_CHARS + 1, "%016" PRIx64, id);
}

uint64_t pt_checkpoint_parse_write_id(const char *text)
{
    if (!text || strlen(text) != PT_WRITE_ID_CHARS) return 0;
    uint64_t id = 0;
    for (const char *p = text; *p; p++) {
        const int digit = isdigit((unsigned char)*p) ? *p - '0'
                          : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
                                                     : -1;
        if (digit < 0) return 0;
        id = id << 4 | (uint64_t)digit;
    }
    return id;
}
