/* A stage file being assembled (train/checkpoint.h), without processes: a writer made in place
 * gives the same bytes as one that copies, while its tensors point into the live parameters,
 * moments and stash buffers (what a donor sends a joiner from, session/join.c); where the host
 * cannot read the kernels' memory (the guarded CPU table, standing for a GPU) it copies after
 * all; and a file that lacks a tensor is refused before anything is written into the slice. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

typedef struct stage {
    pt_gpt_slice *slice;
    pt_optimizer opt;
    pipert_config cfg;
    size_t bytes; /* of one buffer laid out like the parameters */
} stage;

/* A 2-block model's slice on `device`, its parameters initialised and its moments filled with
 * values of their own. */
static void make_stage(stage *st, pt_device_kind device)
{
    const pt_kernels *k;
    cr_assert_eq(pt_kernels_for_device(device, &k), PIPERT_OK, "%s", pipert_last_error());
    pt_config_defaults(&st->cfg);
    const pt_gpt_config model = {2, 16, 2, 8, 32, false, PT_PRECISION_FP32, false};
    cr_assert_eq(pt_gpt_slice_create(&st->slice, &model, 0, 2, 1, 8, k), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_assert_eq(pt_gpt_init(st->slice, 7), PIPERT_OK);
    const pt_optimizer_settings settings = {.kind = PT_OPTIMIZER_ADAMW, .beta1 = 0.9,
                                            .beta2 = 0.95, .eps = 1e-8};
    cr_assert_eq(pt_optimizer_init(&st->opt, &settings, k, st->slice->n_params), PIPERT_OK);
    const size_t n = st->slice->n_params;
    st->bytes = n * sizeof(float);
    float *host = malloc(st->bytes);
    for (size_t i = 0; i < n; i++) host[i] = 0.001f * (float)(i % 977);
    k->copy_to_device(st->opt.m, host, st->bytes);
    for (size_t i = 0; i < n; i++) host[i] = 1e-6f * (float)(i % 131);
    k->copy_to_device(st->opt.v, host, st->bytes);
    free(host);
}

static void free_stage(stage *st)
{
    pt_optimizer_free(&st->opt);
    pt_gpt_slice_free(st->slice);
}

static pt_checkpoint_writer *writer(stage *st, bool in_place)
{
    pt_checkpoint_writer *w;
    const pipert_result rc =
        in_place ? pt_checkpoint_writer_create_in_place(&w, 12, 0, 1, st->slice, &st->opt, &st->cfg)
                 : pt_checkpoint_writer_create(&w, 12, 0, 1, 0, st->slice, &st->opt, &st->cfg);
    cr_assert_eq(rc, PIPERT_OK, "%s", pipert_last_error());
    return w;
}

static void serialize(pt_checkpoint_writer *w, void **bytes, size_t *size)
{
    cr_assert_eq(pt_safetensors_writer_serialize(pt_checkpoint_writer_tensors(w), bytes, size),
                 PIPERT_OK, "%s", pipert_last_error());
}

/* Expects w's file to be reference's byte for byte; returns reference's bytes (*size of them). */
static void *expect_same_file(pt_checkpoint_writer *w, pt_checkpoint_writer *reference,
                              size_t *size, const char *what)
{
    void *got, *expected;
    size_t got_size;
    serialize(w, &got, &got_size);
    serialize(reference, &expected, size);
    cr_assert_eq(got_size, *size, "%s: %zu bytes, not %zu", what, got_size, *size);
    cr_expect_eq(memcmp(got, expected, got_size), 0, "%s: the file differs", what);
    free(got);
    return expected;
}

/* The bytes of the pieces, one after the other. */
static void *concatenate(const pt_safetensors_pieces *p)
{
    unsigned char *out = malloc(p->total), *at = out;
    for (size_t i = 0; i < p->count; i++) {
        memcpy(at, p->piece[i].data, p->piece[i].nbytes);
        at += p->piece[i].nbytes;
    }
    return out;
}

static bool within(const void *p, const void *buffer, size_t bytes)
{
    return (const char *)p >= (const char *)buffer && (const char *)p < (const char *)buffer + bytes;
}

Test(checkpoint_writer, in_place_gives_the_same_bytes_from_the_live_buffers)
{
    stage st;
    make_stage(&st, PT_DEVICE_CPU);
    float *stash = malloc(st.bytes);
    for (size_t i = 0; i < st.slice->n_params; i++) stash[i] = -0.5f * (float)(i % 17);
    pt_checkpoint_writer *copying = writer(&st, false), *in_place = writer(&st, true);
    cr_assert_eq(pt_checkpoint_writer_add_slice_buffer(copying, stash, "stash."), PIPERT_OK);
    cr_assert_eq(pt_checkpoint_writer_add_slice_buffer(in_place, stash, "stash."), PIPERT_OK);
    size_t expected_size;
    void *expected = expect_same_file(in_place, copying, &expected_size, "in place");

    cr_expect_eq(pt_checkpoint_writer_copied_bytes(copying), 4 * st.bytes);
    cr_expect_eq(pt_checkpoint_writer_copied_bytes(in_place), 0, "copied %zu bytes",
                 pt_checkpoint_writer_copied_bytes(in_place));
    const void *live[] = {st.slice->params, st.opt.m, st.opt.v, stash};
    for (int i = 0; i < 4; i++) {
        cr_expect(pt_checkpoint_writer_holds(in_place, (const char *)live[i] + st.bytes / 2),
                  "live buffer %d is not held in place", i);
        cr_expect(!pt_checkpoint_writer_holds(copying, live[i]),
                  "the copying writer claims live buffer %d", i);
        cr_expect(!pt_checkpoint_writer_holds(in_place, (const char *)live[i] + st.bytes),
                  "the byte after live buffer %d is held", i);
    }

    /* its pieces: the header, then data straight from the live buffers, adding up to the file */
    pt_safetensors_pieces pieces;
    cr_assert_eq(pt_safetensors_writer_pieces(pt_checkpoint_writer_tensors(in_place), &pieces),
                 PIPERT_OK);
    cr_assert_eq(pieces.total, expected_size);
    void *joined = concatenate(&pieces);
    cr_expect_eq(memcmp(joined, expected, expected_size), 0, "the pieces differ from the file");
    size_t in_place_bytes = 0;
    for (size_t i = 1; i < pieces.count; i++) {
        cr_expect(pt_checkpoint_writer_holds(in_place, pieces.piece[i].data),
                  "piece %zu is not in a held buffer", i);
        for (int b = 0; b < 4; b++)
            if (within(pieces.piece[i].data, live[b], st.bytes)) in_place_bytes += pieces.piece[i].nbytes;
    }
    cr_expect_eq(in_place_bytes, 4 * st.bytes, "%zu of %zu bytes are sent in place",
                 in_place_bytes, 4 * st.bytes);
    pt_safetensors_pieces_free(&pieces);
    free(joined);
    free(expected);
    pt_checkpoint_writer_free(copying);
    pt_checkpoint_writer_free(in_place);
    free(stash);
    free_stage(&st);
}

/* cpu-guarded keeps its buffers unreadable outside the table's calls, as a GPU's are: a writer
 * made in place must copy (or the donor would send device pointers), and hold its copies. */
Test(checkpoint_writer, in_place_copies_what_the_host_cannot_read)
{
    stage guarded, plain;
    make_stage(&guarded, PT_DEVICE_CPU_GUARDED);
    make_stage(&plain, PT_DEVICE_CPU);
    pt_checkpoint_writer *w = writer(&guarded, true), *reference = writer(&plain, false);
    cr_expect_eq(pt_checkpoint_writer_copied_bytes(w), 3 * guarded.bytes);
    cr_expect(!pt_checkpoint_writer_holds(w, guarded.slice->params));
    size_t size;
    free(expect_same_file(w, reference, &size, "guarded"));
    pt_safetensors_pieces pieces;
    cr_assert_eq(pt_safetensors_writer_pieces(pt_checkpoint_writer_tensors(w), &pieces), PIPERT_OK);
    for (size_t i = 1; i < pieces.count; i++)
        cr_expect(pt_checkpoint_writer_holds(w, pieces.piece[i].data), "piece %zu is not held", i);
    pt_safetensors_pieces_free(&pieces);
    pt_checkpoint_writer_free(w);
    pt_checkpoint_writer_free(reference);
    free_stage(&guarded);
    free_stage(&plain);
}

/* Reading a buffer straight into the slice's memory: a file that lacks one of its tensors is
 * refused by name, and nothing of the buffer changed (every tensor is found before any is
 * read). */
Test(checkpoint_writer, a_file_missing_a_tensor_leaves_the_buffer_untouched)
{
    stage st;
    make_stage(&st, PT_DEVICE_CPU);
    const pt_gpt_slice *m = st.slice;
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    float *source = calloc(m->n_params, sizeof *source);
    for (int i = 0; i + 1 < m->n_tensors; i++) /* all but the last */
        cr_assert_eq(pt_safetensors_writer_add(w, m->tensors[i].name, PT_DTYPE_F32,
                                               source + m->tensors[i].offset, m->tensors[i].ndim,
                                               m->tensors[i].shape),
                     PIPERT_OK);
    void *bytes;
    size_t size;
    cr_assert_eq(pt_safetensors_writer_serialize(w, &bytes, &size), PIPERT_OK);
    pt_safetensors *file;
    cr_assert_eq(pt_safetensors_open_memory(&file, "a file without its last tensor", bytes, size),
                 PIPERT_OK);
    float *before = malloc(st.bytes);
    memcpy(before, m->params, st.bytes);
    cr_expect_eq(pt_checkpoint_read_slice_buffer(file, m, "", m->params), PIPERT_ERR_NOT_FOUND);
    cr_expect(strstr(pipert_last_error(), m->tensors[m->n_tensors - 1].name) != NULL,
              "the error does not name the missing tensor: %s", pipert_last_error());
    cr_expect_eq(memcmp(before, m->params, st.bytes), 0, "the refused read changed the buffer");
    pt_safetensors_close(file);
    pt_safetensors_writer_free(w);
    free(bytes);
    free(before);
    free(source);
    free_stage(&st);
}
