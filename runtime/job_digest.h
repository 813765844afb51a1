/* What every worker of one job must share with the others before it may join them: the
 * build's protocol version, and a digest of the settings that fix what the workers send each
 * other (pt_config_job_digest, runtime/config.h). The coordinator's registration and the
 * transport's hello carry both; a worker that differs is refused, naming what differs
 * (docs/RUNNING.md, "Failures and exit status"). The digest is kept in parts, one per group of
 * settings, so that a refusal can say which group differs. */
#ifndef PT_JOB_DIGEST_H
#define PT_JOB_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the coordinator and the workers say to each other, and how (the coordinator's lines, the
 * transport's hellos, headers and control words): raise it whenever a change makes an older
 * build misunderstand a newer one. 2: a joiner says "joined" once it took its state (an older
 * joiner would stay joining for good). 3: "joined" names the switch whose state it took, and a
 * joiner trains only once the coordinator says its replica is in. 4: a donor sends a joiner its
 * state as a checkpoint file's pieces, a message each (the state's header lists their sizes).
 * 5: device payloads between processes of one host (a header flag, a control word offering
 * them, a device descriptor in place of the payload: comm/transport_device.c). 6: a
 * worker registers again with a coordinator started again, with its view of the job ("resume":
 * comm/coordinator_recover.c; an older coordinator would abort on a second registration). */
#define PT_PROTOCOL_VERSION 6u

/* The groups of settings digested apart (pt_job_digest_part_name names them). */
typedef enum pt_job_digest_part {
    PT_DIGEST_MODEL,    /* model shape */
    PT_DIGEST_SPLIT,    /* stage split */
    PT_DIGEST_BATCH,    /* batch size and steps */
    PT_DIGEST_SCHEDULE, /* pipeline schedule */
    PT_DIGEST_DP,       /* dp method/codec */
    PT_DIGEST_AUTH,     /* message authentication */
    PT_DIGEST_PARTS
} pt_job_digest_part;

typedef struct pt_job_identity {
    uint32_t protocol, reserved;     /* PT_PROTOCOL_VERSION of the build */
    uint64_t part[PT_DIGEST_PARTS]; /* all 0: no digest (the settings are not compared) */
} pt_job_identity;

/* Hexadecimal text of the parts, each 16 digits, and its terminating NUL. */
#define PT_JOB_DIGEST_HEX (16 * PT_DIGEST_PARTS + 1)

const char *pt_job_digest_part_name(pt_job_digest_part part);

/* Whether the identity carries a digest of settings (some part is not 0). */
bool pt_job_identity_has_digest(const pt_job_identity *identity);

/* The job digest: one 64-bit digest of every part (what logs show; 0 without a digest). */
uint64_t pt_job_digest(const pt_job_identity *identity);

void pt_job_digest_to_hex(const pt_job_identity *identity, char hex[PT_JOB_DIGEST_HEX]);
/* The parts from their text; false when it is not PT_DIGEST_PARTS × 16 hexadecimal digits. */
bool pt_job_digest_from_hex(const char *hex, pt_job_identity *identity);

/* Whether `theirs` (a peer's) cannot work with `mine`: another protocol version, or another
 * digest where both carry one. If so, `why` says what differs, theirs first: "protocol version 2
 * vs 1 (another build of pipert)" or "job digest 0123456789abcdef vs fedcba9876543210 (settings
 * differ in: model shape, dp method/codec)". */
bool pt_job_identity_mismatch(const pt_job_identity *theirs, const pt_job_identity *mine,
                              char *why, size_t capacity);

#endif
