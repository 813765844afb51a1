/* The protocol version and the job digest's parts (job_digest.h): their text, their
 * comparison, and the one 64-bit digest over them. */
#include "runtime/job_digest.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

static const char *const part_names[PT_DIGEST_PARTS] = {
    [PT_DIGEST_MODEL] = "model shape",
    [PT_DIGEST_SPLIT] = "stage split",
    [PT_DIGEST_BATCH] = "batch size and steps",
    [PT_DIGEST_SCHEDULE] = "pipeline schedule",
    [PT_DIGEST_DP] = "dp method/codec",
    [PT_DIGEST_AUTH] = "message authentication",
};

const char *pt_job_digest_part_name(pt_job_digest_part part)
{
    return part >= 0 && part < PT_DIGEST_PARTS ? part_names[part] : "?";
}

bool pt_job_identity_has_digest(const pt_job_identity *identity)
{
    for (int i = 0; i < PT_DIGEST_PARTS; i++)
        if (identity->part[i]) return true;
    return false;
}

uint64_t pt_job_digest(const pt_job_identity *identity)
{
    if (!pt_job_identity_has_digest(identity)) return 0;
    uint8_t bytes[8 * PT_DIGEST_PARTS], digest[8];
    for (int i = 0; i < PT_DIGEST_PARTS; i++)
        for (int b = 0; b < 8; b++) bytes[8 * i + b] = (uint8_t)(identity->part[i] >> (8 * b));
    crypto_generichash(digest, sizeof digest, bytes, sizeof bytes, NULL, 0);
    uint64_t value = 0;
    for (int b = 0; b < 8; b++) value |= (uint64_t)digest[b] << (8 * b);
    return value;
}

void pt_job_digest_to_hex(const pt_job_identity *identity, char hex[PT_JOB_DIGEST_HEX])
{
    for (int i = 0; i < PT_DIGEST_PARTS; i++)
        snprintf(hex + 16 * i, 17, "%016" PRIx64, identity->part[i]);
}

bool pt_job_digest_from_hex(const char *hex, pt_job_identity *identity)
{
    if (strlen(hex) != PT_JOB_DIGEST_HEX - 1) return false;
    for (int i = 0; i < PT_DIGEST_PARTS; i++) {
        uint64_t value = 0;
        for (int d = 0; d < 16; d++) {
            const char c = hex[16 * i + d];
            const int digit = c >= '0' && c <= '9'   ? c - '0'
                              : c >= 'a' && c <= 'f' ? c - 'a' + 10
                              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                     : -1;
            if (digit < 0) return false;
            value = value << 4 | (uint64_t)digit;
        }
        identity->part[i] = value;
    }
    return true;
}

/* "model shape, dp method/codec": the parts that differ. */
static void name_differing_parts(const pt_job_identity *a, const pt_job_identity *b, char *out,
                                 size_t capacity)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < PT_DIGEST_PARTS && used < capacity; i++)
        if (a->part[i] != b->part[i])
            used += (size_t)snprintf(out + used, capacity - used, "%s%s", used ? ", " : "",
                                     part_names[i]);
}

bool pt_job_identity_mismatch(const pt_job_identity *theirs, const pt_job_identity *mine,
                              char *why, size_t capacity)
{
    if (theirs->protocol != mine->protocol) {
        snprintf(why, capacity, "protocol version %" PRIu32 " vs %" PRIu32 " (another build of pipert)",
                 theirs->protocol, mine->protocol);
        return true;
    }
    if (!pt_job_identity_has_digest(theirs) || !pt_job_identity_has_digest(mine) ||
        !memcmp(theirs->part, mine->part, sizeof mine->part))
        return false;
    char parts[160];
    name_differing_parts(theirs, mine, parts, sizeof parts);
    snprintf(why, capacity, "job digest %016" PRIx64 " vs %016" PRIx64 " (settings differ in: %s)",
             pt_job_digest(theirs), pt_job_digest(mine), parts);
    return true;
}
