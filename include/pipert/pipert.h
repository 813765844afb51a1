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

/* What libpipert exports: the functions of this header, nothing else (it is
 * built with -fvisibility=hidden; internal pt_* functions stay inside). */
#if defined(__GNUC__) || defined(__clang__)
#define PIPERT_API __attribute__((visibility("default")))
#else
#define PIPERT_API
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
    PIPERT_ERR_COORDINATOR_LOST, /* the coordinator died: every rank stopped after a checkpoint */
    PIPERT_RESULT_COUNT
} pipert_result;

/* A constant, human-readable name of a result ("invalid argument"). */
PIPERT_API const char *pipert_result_str(pipert_result result);

/* The message of the most recent failure on this thread ("" if none). */
PIPERT_API const char *pipert_last_error(void);

/* "0.1.0" */
PIPERT_API const char *pipert_version(void);

/* ---- configuration ------------------------------------------------------ */

/* A validated configuration: every key has a documented default. */
typedef struct pipert_config pipert_config;

/* A configuration holding the defaults. */
PIPERT_API pipert_result pipert_config_create(pipert_config **out);

/* Merges a JSON file into cfg. Unknown keys and wrongly typed values are
 * reported as "FILE:LINE:COLUMN: ..." */
PIPERT_API pipert_result pipert_config_load_file(pipert_config *cfg, const char *path);

/* Applies one "section.key=value" override (the value is JSON, or a bare
 * string). */
PIPERT_API pipert_result pipert_config_set(pipert_config *cfg, const char *assignment);

/* The whole configuration as a JSON text (caller frees with free()). */
PIPERT_API char *pipert_config_to_json(const pipert_config *cfg);

PIPERT_API void pipert_config_free(pipert_config *cfg);

/* ---- training ----------------------------------------------------------- */

typedef struct pipert_train_options {
    const char *out_dir; /* metrics.jsonl and checkpoints go here */
    int resume;          /* continue from the newest complete checkpoint */
    int quiet;           /* unused: the library prints nothing (pipert_session_step gives the
                            metrics a caller prints); kept for compatibility */
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
PIPERT_API pipert_result pipert_train(const pipert_config *cfg,
                                      const pipert_train_options *options,
                                      pipert_train_summary *summary);

/* ---- sessions: one worker of a (multi-worker) job -------------------------
 *
 * A session is one worker process's whole life in a job of stages × replicas
 * workers: it learns its rank, joins the job, builds its stage of the model,
 * trains step by step, writes metrics and checkpoints, and leaves. `pipert
 * worker`, `pipert train` and `pipert launch`'s workers are thin wrappers over
 * it. Typical use:
 *
 *     pipert_session_options o = PIPERT_SESSION_OPTIONS_INIT;
 *     o.out_dir = "runs/x";
 *     o.stages = 2;
 *     pipert_session *s;
 *     if (pipert_session_create(cfg, &o, &s) == PIPERT_OK) rc = pipert_session_run(s);
 *     pipert_session_destroy(s);
 *
 * Where the rank comes from, in order: the caller's out-of-band allgather
 * (`oob`, below: no coordinator, no environment); else the environment of
 * `pipert launch`, SLURM, Open MPI or PMI (docs/RUNNING.md); else a job of
 * one worker. A session owns no process-wide state: its compute threads are
 * set on the threads that call it, its log lines go to `log` when given, and
 * it installs no signal handler.
 */

typedef struct pipert_session pipert_session;

typedef enum pipert_log_level {
    PIPERT_LOG_ERROR,
    PIPERT_LOG_WARN,
    PIPERT_LOG_INFO,
    PIPERT_LOG_DEBUG,
} pipert_log_level;

/* Receives every log line of the session (no trailing newline): from the threads that call
 * the session and from the library's own (the transport's progress thread, the coordinator's),
 * possibly at the same time, so it must be thread-safe. */
typedef void (*pipert_log_fn)(void *user, pipert_log_level level, const char *line);

/* Bring your own bootstrap (like UCC's ucc_oob_coll): an allgather over the
 * host program's own communicator, e.g. MPI_Allgather on MPI_BYTE. Each rank
 * passes `bytes` bytes in `send`; `recv` receives size × bytes bytes, rank i's
 * at offset i × bytes. Returns 0 on success. Called a few times during
 * pipert_session_create, collectively on every rank, never afterwards. */
typedef struct pipert_oob {
    int rank, size;
    int (*allgather)(void *user, const void *send, void *recv, size_t bytes);
    void *user;
} pipert_oob;

typedef enum pipert_split { PIPERT_SPLIT_TRAIN, PIPERT_SPLIT_VAL } pipert_split;

/* Bring your own data: fills `batch` sequences of `seq_len` tokens into
 * inputs[batch × seq_len] and their next tokens into targets (the inputs
 * shifted by one). Training: microbatch `index` (0-based over the run), the
 * sequences [first_sequence, first_sequence + batch) of that microbatch's
 * global batch (replica r asks for [r·batch, (r+1)·batch)). Validation:
 * batch `index` of train.val_batches. The answer must be a pure function of
 * the arguments: the first and the last stage of a pipeline both ask (one for
 * the inputs, one for the targets), and a resumed run asks again. Returns 0
 * on success; anything else stops the step with PIPERT_ERR_IO. */
typedef int (*pipert_batch_fn)(void *user, pipert_split split, long index, long first_sequence,
                               int batch, int seq_len, int32_t *inputs, int32_t *targets);

typedef struct pipert_session_options {
    size_t size;           /* sizeof(pipert_session_options): set by the initializer */
    const char *out_dir;   /* metrics, checkpoints, traces (required) */
    int stages;            /* pipeline stages; replicas = world size / stages */
    int resume;            /* continue from the newest complete checkpoint in out_dir */
    const pipert_oob *oob; /* NULL: the environment (or one worker) */
    int alone;             /* one worker whatever the environment says (pipert train) */
    pipert_batch_fn batch; /* NULL: data.path */
    void *batch_user;
    pipert_log_fn log;     /* NULL: stderr */
    void *log_user;
    pipert_log_level log_level;
    int site;              /* this worker's site; −1: PIPERT_SITE from the environment, else 0 */
    int join;              /* take the place of this rank in a running elastic job whose replica
                            * left (pipert worker --join): the state comes from a live replica */
    int join_rank;         /* with join and join_world: the rank this process takes, when what
                            * started it is not the job's launcher (a replacement started by hand,
                            * or by another srun or mpirun); PIPERT_COORD names the coordinator */
    int join_world;        /* the job's world size then (0: the launcher's environment says) */
} pipert_session_options;

#define PIPERT_SESSION_OPTIONS_INIT                                                                \
    {sizeof(pipert_session_options), NULL, 1, 0, NULL, 0, NULL, NULL, NULL, NULL, PIPERT_LOG_INFO, \
     -1, 0, 0, 0}

/* Where this worker is and what its last step did. Fields a worker does not
 * have are NaN (loss on any stage but the last) or 0. */
typedef struct pipert_metrics {
    size_t size;        /* sizeof(pipert_metrics): set by the caller */
    int rank, world, stage, stages, replica, replicas;
    long step;          /* optimizer steps this stage has taken */
    long total_steps;
    int done;           /* the run is over (final validation and checkpoint written) */
    float loss;         /* mean training loss of the step, over the replicas (last stage) */
    float val_loss;     /* the newest validation loss (last stage), NaN before the first */
    double lr, grad_norm;
    double staleness;   /* mean measured weight staleness of the step's backwards */
    double tokens_per_s; /* this replica, over the last step */
    double ms_per_step;
    double dp_bytes;    /* bytes this worker sent for coupling replicas in the step */
    double dp_wait_ms;  /* milliseconds the step waited on the coupling */
    double dp_delay;    /* steps between sending a coupling exchange and applying it */
    const char *dp_method; /* the coupling that ran ("allreduce", ...) */
} pipert_metrics;

/* Joins the job (the oob allgather, or the coordinator) and builds this
 * worker's stage; with options->resume, restores the newest checkpoint. On
 * failure *out is NULL. */
PIPERT_API pipert_result pipert_session_create(const pipert_config *cfg,
                                               const pipert_session_options *options,
                                               pipert_session **out);

/* One optimizer step of this worker's stage, with the validation and
 * checkpoint that fall due after it. After the last step the run is finished
 * (metrics.done): final validation, checkpoint, trace, and the job told.
 * metrics may be NULL. Under `pipert launch`, once the coordinator (the
 * launcher) is gone, the ranks agree on a step; after it every rank writes
 * its part of that step's checkpoint and returns PIPERT_ERR_COORDINATOR_LOST
 * (then and at every later call): resume from that checkpoint. */
PIPERT_API pipert_result pipert_session_step(pipert_session *s, pipert_metrics *metrics);

/* Steps until the run is finished. */
PIPERT_API pipert_result pipert_session_run(pipert_session *s);

/* This worker's newest metrics (also between steps, from any thread). */
PIPERT_API pipert_result pipert_session_metrics(const pipert_session *s, pipert_metrics *metrics);

/* Writes a checkpoint of the current step now, collectively: every worker of
 * the job calls it after the same step (each stage of an asynchronous
 * pipeline after its own N-th step). Stage 0 of replica 0 makes it complete
 * by writing the step's index once every stage wrote its file (and every
 * replica its own, when dp.method lets replicas drift apart). */
PIPERT_API pipert_result pipert_session_checkpoint(pipert_session *s);

/* Asks the session to stop: the call in progress (a step, even one waiting
 * inside a collective for a peer) returns PIPERT_ERR_INTERRUPTED within a
 * second, and so does every later one. Safe from any thread and from a
 * signal handler. */
PIPERT_API void pipert_session_stop(pipert_session *s);

/* Stops the session as pipert_session_stop does, and ends the whole job:
 * the call in progress (or the next) returns PIPERT_ERR_INTERRUPTED with
 * `reason`, and every other rank is told (through the coordinator; with an
 * out-of-band bootstrap they notice this rank leaving). Safe from any thread;
 * not from a signal handler (use pipert_session_stop there). */
PIPERT_API void pipert_session_abort(pipert_session *s, const char *reason);

/* The error that ended the job asynchronously (another rank failed, the
 * coordinator or a peer is gone), PIPERT_OK while none did; the message is
 * then pipert_last_error(). Safe from any thread. */
PIPERT_API pipert_result pipert_session_async_error(pipert_session *s);

/* Leaves the job and frees the session (NULL is fine). */
PIPERT_API void pipert_session_destroy(pipert_session *s);

#ifdef __cplusplus
}
#endif

#endif /* PIPERT_H */
