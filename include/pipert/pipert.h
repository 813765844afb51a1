/* pipert — a training runtime for transformer language models.
 *
 * The public C API. Every call returns a pipert_result; on failure a one-line
 * description of what went wrong (naming the file, field or peer) is kept per
 * thread and returned by pipert_last_error(). The library never exits or aborts
 * on a user error: the caller decides what to do.
 */
#ifndef PIPERT_H
#define PIPERT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PIPERT_VERSION_MAJOR 0
#define PIPERT_VERSION_MINOR 1
#define PIPERT_VERSION_PATCH 0

typedef enum pipert_result {
    PIPERT_OK = 0,
    PIPERT_ERR_INVALID_ARG, /* a caller passed something impossible */
    PIPERT_ERR_CONFIG,      /* unknown key, wrong type, value out of range */
    PIPERT_ERR_IO,          /* a file could not be opened, read or written */
    PIPERT_ERR_FORMAT,      /* a file is truncated, corrupt or of the wrong kind */
    PIPERT_ERR_NOMEM,       /* an allocation failed or would not fit in memory */
    PIPERT_ERR_UNSUPPORTED, /* a valid request this build cannot serve */
    PIPERT_ERR_NOT_FOUND,   /* a named thing (tensor, checkpoint, key) is missing */
    PIPERT_ERR_TRANSPORT,   /* the network layer failed */
    PIPERT_ERR_PEER,        /* a peer died, or sent something it should not */
    PIPERT_ERR_TIMEOUT,     /* something did not happen in time */
    PIPERT_ERR_AUTH,        /* a peer did not present the job's secret */
    PIPERT_ERR_NO_DEVICE,   /* the requested device is not present */
    PIPERT_ERR_INTERRUPTED, /* stopped by a signal or by the caller */
    PIPERT_ERR_INTERNAL,    /* a bug in pipert: please report it */
    PIPERT_RESULT_COUNT
} pipert_result;

/* A constant, human-readable name of a result ("invalid argument"). */
const char *pipert_result_str(pipert_result result);

/* The message of the most recent failure on this thread ("" if none). */
const char *pipert_last_error(void);

/* "0.1.0" */
const char *pipert_version(void);

/* ---- configuration ------------------------------------------------------ */

/* A validated configuration: every key has a documented default. */
typedef struct pipert_config pipert_config;

/* A configuration holding the defaults. */
pipert_result pipert_config_create(pipert_config **out);

/* Merges a JSON file into cfg. Unknown keys and wrongly typed values are
 * reported as "FILE:LINE:COLUMN: ..." */
pipert_result pipert_config_load_file(pipert_config *cfg, const char *path);

/* Applies one "section.key=value" override (the value is JSON, or a bare
 * string). */
pipert_result pipert_config_set(pipert_config *cfg, const char *assignment);

/* The whole configuration as a JSON text (caller frees with free()). */
char *pipert_config_to_json(const pipert_config *cfg);

void pipert_config_free(pipert_config *cfg);

/* ---- training ----------------------------------------------------------- */

typedef struct pipert_train_options {
    const char *out_dir; /* metrics.jsonl and checkpoints go here */
    int resume;          /* continue from the newest complete checkpoint */
    int quiet;           /* no progress output on stdout */
    /* A flag the caller may set (e.g. from a signal handler) to stop the run
     * at the next step boundary; NULL if unused. */
    volatile int *stop_flag;
} pipert_train_options;

typedef struct pipert_train_summary {
    long steps_done;
    float last_loss;
    float last_val_loss; /* NaN if validation never ran */
    double tokens_per_s;
} pipert_train_summary;

/* Trains one worker on the whole model as configured. */
pipert_result pipert_train(const pipert_config *cfg, const pipert_train_options *options,
                           pipert_train_summary *summary);

#ifdef __cplusplus
}
#endif

#endif /* PIPERT_H */
