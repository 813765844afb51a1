/* embed_mpi: an MPI program that trains a small GPT with pipert on data it
 * makes itself: in-situ training, the way a simulation code would embed it.
 *
 *     mpirun -np 4 embed_mpi [--steps N] [--out DIR] [--write-shard PATH] [--verbose]
 *
 * What it shows:
 *   - bootstrap through the host's own communicator: pipert_oob's allgather is
 *     MPI_Allgather on MPI_BYTE, so pipert needs no coordinator, no launcher
 *     and no environment variables, and does not link MPI itself;
 *   - data from memory: a pipert_batch_fn serves token batches from a stream
 *     this program generated (a toy "simulation output"), no files involved;
 *   - a job of 2 pipeline stages × (world size / 2) data-parallel replicas,
 *     stepped one optimizer step at a time with pipert_session_step;
 *   - every pipert call checked, its message printed, MPI_Abort on failure.
 *
 * Rank 0 prints "step N loss X" after every step (the loss lives on the last
 * stage of replica 0, which sends it to rank 0) and "val_loss X" at the end.
 *
 * --write-shard PATH writes the very same token stream (training part, then
 * the validation tail) as an llm.c token shard, so that
 *
 *     pipert launch --stages 2 --replicas 2 --data.path=PATH
 *         --data.sampling=sequential --data.val_fraction=0.1 (+ make_config's keys)
 *
 * trains on exactly the same sequences: with sequential sampling, training
 * sequence q of the run starts at token q·block_size of the training split,
 * which is what batch_from_stream serves, and the stream is long enough that
 * launch's wrap-around (mod n_train − block_size) never happens.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <pipert/pipert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The job. The configuration keys below are built from these numbers. */
enum {
    STAGES = 2,       /* pipeline stages; replicas = world size / STAGES */
    SEQ_LEN = 16,     /* model.block_size */
    BATCH = 2,        /* train.batch_size: sequences per replica per microbatch */
    MICROBATCHES = 4, /* pipeline.microbatches per optimizer step */
    VAL_BATCHES = 2,  /* train.val_batches */
};
/* The validation tail is this fraction of the stream (data.val_fraction);
 * make_stream holds out 1 token in 10. */
#define VAL_FRACTION 0.1

/* The rest of the configuration, as "section.key=value" (pipert_config_set). */
static const char *const other_settings[] = {
    "model.n_layer=2",       "model.n_embd=32",   "model.n_head=2",
    "train.lr=1e-2",         "train.warmup_steps=2",
    "train.val_every=0",     /* validate once, at the end */
    "train.log_every=1",     "runtime.threads=1",
    "pipeline.schedule=1f1b", /* flush every step: the losses of one worker on the same batches */
};

static int world_rank;

/* Prints what failed and ends the whole MPI job. */
static void die(const char *what, pipert_result rc)
{
    fprintf(stderr, "embed_mpi: rank %d: %s: %s: %s\n", world_rank, what, pipert_result_str(rc),
            pipert_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void check(pipert_result rc, const char *what)
{
    if (rc != PIPERT_OK) die(what, rc);
}

/* ---- the "simulation" ---------------------------------------------------- */

/* A particle bouncing between the walls of a box of BOX cells. A run starts
 * with the token RUN_START, then the particle's cell at every time step, from
 * a pseudo-random cell at a pseudo-random speed of 1 to 3 cells a step. The
 * next cell follows from the last two (position and velocity), so a model can
 * learn most of the stream; only the start of each run is noise. */
enum { BOX = 32, RUN_START = 255, RUN_STEPS = 63 };

typedef struct token_stream {
    uint16_t *tokens; /* [n] */
    long n;
    long n_train;     /* [0, n_train) trains, [n_train, n) validates */
} token_stream;

/* splitmix64: a fixed, portable pseudo-random sequence */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void simulate(uint16_t *tokens, long n)
{
    uint64_t state = 2024;
    int cell = 0, velocity = 1;
    for (long i = 0; i < n; i++) {
        if (i % (RUN_STEPS + 1) == 0) {
            tokens[i] = RUN_START;
            cell = (int)(next_random(&state) % BOX);
            velocity = 1 + (int)(next_random(&state) % 3);
            if (next_random(&state) & 1) velocity = -velocity;
            continue;
        }
        tokens[i] = (uint16_t)cell;
        cell += velocity;
        if (cell < 0 || cell >= BOX) { /* bounce off the wall */
            velocity = -velocity;
            cell = cell < 0 ? -cell : 2 * (BOX - 1) - cell;
        }
    }
}

/* A stream for `sequences` training sequences of SEQ_LEN tokens read in order,
 * with a validation tail of VAL_FRACTION: n = 10k tokens, k of them held out,
 * so round(0.1·n) = k exactly as `pipert launch` computes it. */
static token_stream make_stream(long sequences)
{
    /* sequence q starts at q·T and reads T+1 tokens; `pipert launch` wraps a
     * start at n_train − T, so the last start (q−1)·T must stay below it */
    const long train_needed = sequences * SEQ_LEN + 1;
    long k = (train_needed + 8) / 9;
    if (k < SEQ_LEN + 1) k = SEQ_LEN + 1; /* the tail holds a whole sequence */
    token_stream s = {.n = 10 * k, .n_train = 9 * k};
    s.tokens = malloc((size_t)s.n * sizeof *s.tokens);
    if (!s.tokens) {
        fprintf(stderr, "embed_mpi: rank %d: out of memory for %ld tokens\n", world_rank, s.n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    simulate(s.tokens, s.n);
    return s;
}

/* ---- serving batches (pipert_batch_fn) ----------------------------------- */

typedef struct batch_source {
    const token_stream *stream;
    long global_batch; /* sequences in one microbatch over all replicas */
} batch_source;

/* inputs [seq_len] and targets [seq_len] = the stream from `start`, shifted by one */
static void copy_sequence(const uint16_t *tokens, long start, int seq_len, int32_t *inputs,
                          int32_t *targets)
{
    for (int t = 0; t < seq_len; t++) {
        inputs[t] = tokens[start + t];
        targets[t] = tokens[start + t + 1];
    }
}

/* Training microbatch `index`: sequences q = index·global_batch + first + b
 * start at q·T. Validation batch k of VAL_BATCHES: sequence j = k·B + b of
 * J = VAL_BATCHES·B starts at n_train + floor(j·(n_val − T)/J), evenly spread
 * over the held-out tail (what `pipert launch` evaluates on the shard). Pure:
 * both the first and the last stage ask for the same batch. */
static int batch_from_stream(void *user, pipert_split split, long index, long first, int batch,
                             int seq_len, int32_t *inputs, int32_t *targets)
{
    const batch_source *src = user;
    const token_stream *s = src->stream;
    for (int b = 0; b < batch; b++) {
        long start;
        if (split == PIPERT_SPLIT_TRAIN) {
            start = (index * src->global_batch + first + b) * seq_len;
            if (start >= s->n_train - seq_len) return 1; /* past the stream: more steps than made */
        } else {
            if (index >= VAL_BATCHES) return 1;
            const long span = s->n - s->n_train - seq_len, sequences = (long)VAL_BATCHES * batch;
            start = s->n_train + (index * batch + b) * span / sequences;
        }
        copy_sequence(s->tokens, start, seq_len, inputs + (size_t)b * seq_len,
                      targets + (size_t)b * seq_len);
    }
    return 0;
}

/* ---- the llm.c token shard ------------------------------------------------ */

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* 256 little-endian int32 (magic 20240520, version 1, token count), then the
 * tokens as little-endian uint16. Returns 0 on success. */
static int write_shard(const char *path, const token_stream *s)
{
    if (s->n > INT32_MAX) return -1; /* the header's count is an int32 */
    unsigned char header[256 * 4] = {0};
    put_le32(header, 20240520);
    put_le32(header + 4, 1);
    put_le32(header + 8, (uint32_t)s->n);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int failed = fwrite(header, 1, sizeof header, f) != sizeof header;
    for (long i = 0; i < s->n && !failed; i++) {
        const unsigned char token[2] = {(unsigned char)s->tokens[i], (unsigned char)(s->tokens[i] >> 8)};
        failed = fwrite(token, 1, 2, f) != 2;
    }
    failed |= fclose(f) != 0;
    return failed ? -1 : 0;
}

/* ---- bootstrap and logging ------------------------------------------------ */

/* pipert_oob.allgather: every rank's `bytes` bytes to every rank, in rank order. */
static int mpi_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    MPI_Comm comm = *(MPI_Comm *)user;
    if (bytes > INT_MAX) return -1;
    return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) == MPI_SUCCESS
               ? 0
               : -1;
}

/* pipert's log lines (they name the rank once it is known) on stderr. */
static void log_line(void *user, pipert_log_level level, const char *line)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "pipert %s: %s\n", names[level], line);
}

/* ---- the run ---------------------------------------------------------------- */

typedef struct arguments {
    long steps;
    const char *out_dir;
    const char *shard_path; /* NULL: none */
    bool verbose;
} arguments;

static bool parse_arguments(int argc, char **argv, arguments *args)
{
    *args = (arguments){.steps = 20, .out_dir = "runs/embed_mpi"};
    for (int i = 1; i < argc; i++) {
        const bool has_value = i + 1 < argc;
        if (!strcmp(argv[i], "--steps") && has_value) {
            char *end;
            args->steps = strtol(argv[++i], &end, 10);
            if (*end || args->steps < 1) return false;
        } else if (!strcmp(argv[i], "--out") && has_value) {
            args->out_dir = argv[++i];
        } else if (!strcmp(argv[i], "--write-shard") && has_value) {
            args->shard_path = argv[++i];
        } else if (!strcmp(argv[i], "--verbose")) {
            args->verbose = true;
        } else {
            return false;
        }
    }
    return true;
}

static pipert_config *make_config(long steps)
{
    pipert_config *cfg;
    check(pipert_config_create(&cfg), "pipert_config_create");
    char setting[64];
    const struct { const char *key; long value; } job[] = {
        {"model.block_size", SEQ_LEN},         {"train.batch_size", BATCH},
        {"pipeline.microbatches", MICROBATCHES}, {"train.val_batches", VAL_BATCHES},
        {"train.steps", steps},
    };
    for (size_t i = 0; i < sizeof job / sizeof job[0]; i++) {
        snprintf(setting, sizeof setting, "%s=%ld", job[i].key, job[i].value);
        check(pipert_config_set(cfg, setting), setting);
    }
    for (size_t i = 0; i < sizeof other_settings / sizeof other_settings[0]; i++)
        check(pipert_config_set(cfg, other_settings[i]), other_settings[i]);
    return cfg;
}

/* The last stage of replica 0 has the step's loss (the mean over the
 * replicas) and, at the end, the validation loss: it sends both to rank 0. */
enum { TAG_LOSS = 7 };

static void losses_to_rank0(const pipert_metrics *m, float losses[2])
{
    const bool has_loss = m->stage == m->stages - 1 && m->replica == 0;
    losses[0] = m->loss;
    losses[1] = m->val_loss;
    if (has_loss && world_rank != 0) MPI_Send(losses, 2, MPI_FLOAT, 0, TAG_LOSS, MPI_COMM_WORLD);
    if (!has_loss && world_rank == 0)
        MPI_Recv(losses, 2, MPI_FLOAT, MPI_ANY_SOURCE, TAG_LOSS, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);

    arguments args;
    if (!parse_arguments(argc, argv, &args)) {
        if (world_rank == 0)
            fprintf(stderr, "usage: mpirun -np 2R %s [--steps N] [--out DIR] [--write-shard PATH] "
                            "[--verbose]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    if (world_size % STAGES != 0) {
        if (world_rank == 0)
            fprintf(stderr, "embed_mpi: %d ranks cannot form %d-stage pipelines (use a multiple "
                            "of %d)\n", world_size, STAGES, STAGES);
        MPI_Finalize();
        return 2;
    }
    const long replicas = world_size / STAGES;

    /* Every rank makes the same stream; only the first and last stage read it. */
    const long global_batch = replicas * BATCH;
    token_stream stream = make_stream(args.steps * MICROBATCHES * global_batch);
    if (world_rank == 0 && args.shard_path) {
        if (write_shard(args.shard_path, &stream) != 0) {
            fprintf(stderr, "embed_mpi: cannot write %s: %s\n", args.shard_path, strerror(errno));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        printf("wrote %s: %ld tokens, the last %ld for validation (data.val_fraction=%g)\n",
               args.shard_path, stream.n, stream.n - stream.n_train, VAL_FRACTION);
    }

    pipert_config *cfg = make_config(args.steps);
    MPI_Comm comm = MPI_COMM_WORLD;
    pipert_oob oob = {.rank = world_rank, .size = world_size, .allgather = mpi_allgather, .user = &comm};
    batch_source source = {.stream = &stream, .global_batch = global_batch};
    pipert_session_options options = PIPERT_SESSION_OPTIONS_INIT;
    options.out_dir = args.out_dir;
    options.stages = STAGES;
    options.oob = &oob;
    options.batch = batch_from_stream;
    options.batch_user = &source;
    options.log = log_line;
    options.log_level = args.verbose ? PIPERT_LOG_INFO : PIPERT_LOG_WARN;

    pipert_session *session;
    check(pipert_session_create(cfg, &options, &session), "pipert_session_create");
    if (world_rank == 0)
        printf("training %d stages x %ld replicas for %ld steps (pipert %s)\n", STAGES, replicas,
               args.steps, pipert_version());
    fflush(stdout);

    pipert_metrics m = {.size = sizeof m};
    float losses[2];
    while (!m.done) {
        check(pipert_session_step(session, &m), "pipert_session_step");
        losses_to_rank0(&m, losses);
        if (world_rank == 0) {
            printf("step %ld loss %.6f\n", m.step, (double)losses[0]);
            fflush(stdout);
        }
    }
    if (world_rank == 0 && !isnan(losses[1])) printf("val_loss %.6f\n", (double)losses[1]);

    pipert_session_destroy(session);
    pipert_config_free(cfg);
    free(stream.tokens);
    MPI_Finalize();
    return 0;
}
