/* Model state on disk, as safetensors named by the global Hugging Face GPT-2
 * names (ALGORITHMS.md §1), so PyTorch reads them and a run resumes under
 * another stage split, stage count or replica count: loading is by name.
 *
 * The checkpoint of step STEP (zero-padded to 8 digits) in DIR is
 *
 *   DIR/ckpt-STEP-stage-S.safetensors   one per pipeline stage S (written by
 *       replica 0 of the stage): every parameter of the stage's slice under
 *       its own name, the optimizer moments under "optimizer.m.NAME" and
 *       "optimizer.v.NAME", what the layers above add (the coupling's "dp.*",
 *       the pipeline's "pipeline.*"), and metadata: "format"
 *       (pipert-checkpoint-2), "config" (the full configuration, JSON),
 *       "step", "optimizer" (kind, t, Π in full precision), "stage",
 *       "stages", "replica", "first_layer"/"last_layer" (blocks
 *       [first, last)) and "write_id" (random, one per write; the index
 *       lists it);
 *   DIR/ckpt-STEP-stage-S-replica-R.safetensors   the same for replica R ≥ 1
 *       of stage S, written only when the coupling lets replicas drift
 *       (every dp.method but allreduce, dp/coupling.h): its own parameters,
 *       optimizer, coupling and pipeline state;
 *   DIR/ckpt-STEP.json   the index (checkpoint_index.c): the step, the
 *       schedule that ran, each stage's file, block range, size in bytes and
 *       write id, and the replica files when there are any.
 *
 * Every file is written under a temporary name (NAME.tmp.PID), fsynced and
 * renamed, and the index is written only once every file of every stage and
 * replica is in place, so a checkpoint is complete exactly when its index
 * exists and every file it lists is there, with the size it lists, and is
 * that file, of that very write (checkpoint_verify.c). A worker killed while writing leaves a
 * temporary file and no index; a full disk is an error naming the file, its
 * temporary removed. Either way the previous checkpoint stays usable.
 * `--resume` finds checkpoints by the directory's file names (checkpoint_dir.c),
 * newest first, and passes by the ones that are not usable. One worker (`pipert train`) writes the same:
 * one stage file, which is then a whole model `pipert check` and PyTorch
 * read, and an index.
 */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "train/optimizer.h"

#define PT_CHECKPOINT_NAME_MAX 64
#define PT_CHECKPOINT_FORMAT "pipert-checkpoint-2" /* the stage files' "format" */

/* ---- the index ------------------------------------------------------------ */

/* One file of a checkpoint: a stage's (replica 0) or a replica's. */
typedef struct pt_checkpoint_part {
    int stage;
    int replica;                        /* 0: the stage file */
    int first_layer, last_layer;        /* blocks [first, last) */
    char file[PT_CHECKPOINT_NAME_MAX];  /* inside the checkpoint's directory */
    uint64_t bytes;
    /* The random id of the write that made the file (its metadata
     * "write_id"): the index accepts that very file, not one a later write
     * of the same name put there. 0 in indexes written before ids existed. */
    uint64_t write_id;
} pt_checkpoint_part;

typedef struct pt_checkpoint_index {
    long step;
    int stages;                /* parts */
    int replicas;              /* of the job that wrote it */
    int n_layer;
    char schedule[32];         /* the schedule that ran: gpipe, 1f1b, async-1f1b */
    long microbatches;         /* of its instruction lists: per step (flush), per run (async) */
    long first_microbatch;     /* async: the list's microbatch 0 in the run (0 unless resumed
                                  from an empty pipeline) */
    char lookahead[32];        /* async-1f1b's pipeline.lookahead; "n/a" otherwise */
    pt_checkpoint_part *parts; /* [stages], by stage: replica 0's files */
    /* [(replicas − 1) · stages]: replica r ≥ 1's file of stage s at
     * (r − 1) · stages + s; NULL when the checkpoint holds replica 0's only. */
    pt_checkpoint_part *replica_parts;
} pt_checkpoint_index;

/* ---- file names (checkpoint_names.c) ---------------------------------------- */

/* "ckpt-STEP-stage-S.safetensors" for replica 0,
 * "ckpt-STEP-stage-S-replica-R.safetensors" for replica R ≥ 1 (STEP
 * zero-padded to 8 digits, as in every name written). */
void pt_checkpoint_part_name(long step, int stage, int replica, char name[PT_CHECKPOINT_NAME_MAX]);
/* "ckpt-STEP.json". */
void pt_checkpoint_index_name(long step, char name[PT_CHECKPOINT_NAME_MAX]);

/* A write id as text: 16 lower-case hex digits. */
#define PT_WRITE_ID_CHARS 16
void pt_checkpoint_format_write_id(uint64_t id, char text[PT_WRITE_ID_CHARS + 1]);
/* The id of such a text; 0 when it is not one. */
uint64_t pt_checkpoint_parse_write_id(const char *text);

/* The step of an index name (ckpt-DIGITS.json, any padding), of a stage or
 * replica file's name, or of a temporary one of either (NAME.tmp.PID); −1
 * when the name is not one. */
long pt_checkpoint_index_step(const char *name);
long pt_checkpoint_part_step(const char *name);
long pt_checkpoint_temp_step(const char *name);

/* ---- the index (checkpoint_index.c) --------------------------------------- */

/* Allocates index->parts for `stages` stages and, with replica_files and
 * replicas > 1, index->replica_parts (zeroed; stage and replica filled in). */
pipert_result pt_checkpoint_index_init(pt_checkpoint_index *index, long step, int stages,
                                       int replicas, bool replica_files);
void pt_checkpoint_index_free(pt_checkpoint_index *index);

/* The file of `stage` of `replica` the index lists, or NULL (a replica ≥ 1
 * of a checkpoint without replica files, or out of range). */
pt_checkpoint_part *pt_checkpoint_index_part(const pt_checkpoint_index *index, int stage,
                                             int replica);

/* Every file of the checkpoint, i in [0, count): replica 0's by stage, then
 * each other replica's. */
int pt_checkpoint_index_file_count(const pt_checkpoint_index *index);
const pt_checkpoint_part *pt_checkpoint_index_file(const pt_checkpoint_index *index, int i);

/* Writes DIR/ckpt-STEP.json atomically. */
pipert_result pt_checkpoint_index_write(const char *dir, const pt_checkpoint_index *index);

/* Reads the index DIR/NAME (NAME: an index name, any padding); a malformed
 * one, or one of another step than its name says, is a PIPERT_ERR_FORMAT
 * naming it. */
pipert_result pt_checkpoint_index_read(const char *dir, const char *name, pt_checkpoint_index *out);

/* ---- usable checkpoints (checkpoint_verify.c) ------------------------------- */

/* PIPERT_OK when every file the index lists (replica files included) is in
 * dir with the listed size, is a valid safetensors file, and is the pipert
 * checkpoint file of the index's step, its stage, replica and blocks, of the
 * write the index lists (its write id, when the index has one); else an
 * error naming the first file that is not. */
pipert_result pt_checkpoint_verify(const char *dir, const pt_checkpoint_index *index);

/* The metadata check of one open file against the index's entry for it. */
pipert_result pt_checkpoint_check_part(const pt_safetensors *st, const pt_checkpoint_index *index,
                                       const pt_checkpoint_part *part);

/* ---- the directory (checkpoint_dir.c) --------------------------------------- */

/* The newest usable checkpoint in dir, found by the names of its index files
 * (ckpt-STEP.json, any zero padding), newest first. Newer ones that are not
 * usable (an unreadable or malformed index, a listed file missing,
 * truncated, corrupt or not the one listed: pt_checkpoint_verify) are passed
 * by with a warning naming the file. PIPERT_ERR_NOT_FOUND naming dir when
 * there is none, with the newest one's problem if there was one. */
pipert_result pt_checkpoint_find_latest(const char *dir, pt_checkpoint_index *out);

/* After the checkpoint of step `newest` is complete: removes temporary files
 * (NAME.tmp.PID, left by a writer that was killed) of steps up to `newest`,
 * and — keep > 0 — whole checkpoints of earlier steps beyond the `keep`
 * newest ones (the index first, then its files, replica files included),
 * and the stage and replica files of earlier steps that no index lists
 * (left by an incomplete checkpoint). keep = 0 removes no checkpoint file. */
void pt_checkpoint_prune(const char *dir, long newest, int keep);

/* Removes the temporary files of checkpoints of steps up to `newest` from
 * dir: no writer is writing them any more once `newest` is complete. */
void pt_checkpoint_remove_temporaries(const char *dir, long newest);

/* ---- writing a stage's file ------------------------------------------------ */

/* A stage file being assembled. Its tensors are host copies it owns, taken
 * when they are added, so training may go on while it is written. */
typedef struct pt_checkpoint_writer pt_checkpoint_writer;

/* A writer holding the slice's parameters, the optimizer's moments and the
 * metadata of step `step` of stage `stage` of `stages`, for the file of
 * `replica` (0: the stage file). */
pipert_result pt_checkpoint_writer_create(pt_checkpoint_writer **out, long step, int stage,
                                          int stages, int replica, const pt_gpt_slice *slice,
                                          const pt_optimizer *opt, const pipert_config *cfg);

/* The same, but the slice's buffers (the parameters, the optimizer moments and those added with
 * pt_checkpoint_writer_add_slice_buffer, which must then live as long as the model) are
 * referenced in place where the host can read the kernels' memory (kernels->host_accessible),
 * not copied: they must stay unchanged until the writer's bytes are used (a joiner's state,
 * sent while training waits). */
pipert_result pt_checkpoint_writer_create_in_place(pt_checkpoint_writer **out, long step,
                                                   int stage, int stages,
                                                   const pt_gpt_slice *slice,
                                                   const pt_optimizer *opt,
                                                   const pipert_config *cfg);

/* Whether `data` lies in a slice buffer the writer holds: its own copies, or the buffers it
 * references in place; not the tensors others added (a coupling's, which may be freed or moved
 * once training goes on). */
bool pt_checkpoint_writer_holds(const pt_checkpoint_writer *w, const void *data);

/* Bytes of the host copies the writer took. */
size_t pt_checkpoint_writer_copied_bytes(const pt_checkpoint_writer *w);

/* The underlying writer, for tensors and metadata of other layers (their
 * data must outlive pt_checkpoint_writer_write). */
pt_safetensors_writer *pt_checkpoint_writer_tensors(pt_checkpoint_writer *w);

/* Adds a buffer laid out like the slice's parameters (backend memory: a
 * stashed weight version) under prefix + each tensor's name, copied now
 * (referenced, by a writer made in place). */
pipert_result pt_checkpoint_writer_add_slice_buffer(pt_checkpoint_writer *w,
                                                    const float *device_buffer,
                                                    const char *prefix);

/* Writes the file (pt_checkpoint_part_name) into DIR atomically; *bytes is
 * its size, *write_id the random id of this write, also in the file's
 * metadata ("write_id"), which the index lists. */
pipert_result pt_checkpoint_writer_write(pt_checkpoint_writer *w, const char *dir, uint64_t *bytes,
                                         uint64_t *write_id);
void pt_checkpoint_writer_free(pt_checkpoint_writer *w);

/* ---- reading a checkpoint ---------------------------------------------------- */

/* A complete checkpoint with the file of every stage of one replica open. */
typedef struct pt_checkpoint {
    pt_checkpoint_index index;
    int replica;            /* whose files: 0, or a replica with files of its own */
    pt_safetensors **parts; /* [index.stages] */
} pt_checkpoint;

/* Opens the files `index` lists for every stage of `replica` (0: the stage
 * files; another replica needs files of its own, pt_checkpoint_index_part),
 * taking the index over (pt_checkpoint_close frees it), and checks that each
 * is a pipert checkpoint of the index's step, stage and replica. */
pipert_result pt_checkpoint_open(pt_checkpoint *c, const char *dir, pt_checkpoint_index *index,
                                 int replica);
void pt_checkpoint_close(pt_checkpoint *c);

/* Restores the slice's parameters and optimizer moments by global name, from
 * whichever files hold them (any split), and the optimizer's t and Π from
 * their metadata. The checkpoint must be of the same model (a difference is
 * an error naming the key) and optimizer kind; a missing tensor is an error
 * naming it and the checkpoint. */
pipert_result pt_checkpoint_load_slice(const pt_checkpoint *c, pt_gpt_slice *slice,
                                       pt_optimizer *opt);

/* The open file of stage `stage` if the checkpoint was split into `stages`
 * stages and gave that stage exactly the slice's blocks, else NULL: state
 * that only means something for the same slice (weight stashes, the
 * coupling's) comes from there. */
const pt_safetensors *pt_checkpoint_same_slice(const pt_checkpoint *c, const pt_gpt_slice *slice,
                                               int stage, int stages);

/* Reads the tensors prefix + each tensor's name of one file into a buffer laid
 * out like the slice's parameters (backend memory). */
pipert_result pt_checkpoint_read_slice_buffer(const pt_safetensors *st, const pt_gpt_slice *slice,
                                              const char *prefix, float *device_dst);

/* ---- model files -------------------------------------------------------------- */

/* Loads every parameter of `slice` from an open safetensors file by global
 * name (any float dtype). A file without lm_head.weight (a tied GPT-2
 * checkpoint) gives the head a copy of wte.weight. A missing tensor or a shape
 * mismatch is an error naming the tensor and the file. */
pipert_result pt_gpt_load_params(pt_gpt_slice *slice, const pt_safetensors *st);

/* Adds the tensors of a host buffer laid out like slice->params (parameters,
 * gradients or optimizer moments) to a writer, each under prefix + its name.
 * The buffer must outlive the write. */
pipert_result pt_gpt_add_to_writer(pt_safetensors_writer *w, const pt_gpt_slice *slice,
                                   const float *host_buffer, const char *prefix);

/* Fills cfg->model from a safetensors file: from its "config" metadata when
 * present, else inferred from the tensor shapes (n_layer from the h.N names,
 * n_embd and vocab_size from wte, block_size from wpe, tie_weights when there
 * is no lm_head, n_head = n_embd/64 as in every GPT-2 size, or 0 = unknown
 * when n_embd is not a multiple of 64). Used by
 * `pipert check`; command-line overrides apply after it. */
pipert_result pt_model_settings_from_file(const pt_safetensors *st, pipert_config *cfg);


#endif
