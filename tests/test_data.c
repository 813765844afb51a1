#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/data.h"
#include "runtime/fileio.h"

/* ---- helpers ------------------------------------------------------------- */

static char temp_dir[64];

static void make_temp_dir(void)
{
    strcpy(temp_dir, "/tmp/pipert-test-data-XXXXXX");
    cr_assert(mkdtemp(temp_dir), "mkdtemp failed");
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_temp_dir(void) { nftw(temp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

TestSuite(data, .init = make_temp_dir, .fini = remove_temp_dir);

/* A path inside the test's temporary directory (static buffer per slot). */
static const char *temp_path(const char *name)
{
    static char paths[8][256];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", temp_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *bytes, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(bytes, 1, size, f), size);
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static void expect_error_names(const char *what)
{
    cr_expect(strstr(pipert_last_error(), what), "message \"%s\" should name \"%s\"",
              pipert_last_error(), what);
}

static void expect_tokens_equal_bytes(const pt_dataset *ds, const char *expected, size_t n)
{
    cr_assert_eq(ds->n_tokens, n, "n_tokens %zu, expected %zu", ds->n_tokens, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ds->tokens[i], (unsigned char)expected[i],
                     "token %zu is %u, expected byte %u", i, ds->tokens[i],
                     (unsigned char)expected[i]);
}

/* A dataset made in memory: tokens[i] = i, the first n_train for training. */
static pt_dataset counting_dataset(size_t n, size_t n_train)
{
    pt_dataset ds = {0};
    ds.tokens = malloc(n * sizeof *ds.tokens);
    cr_assert(ds.tokens);
    for (size_t i = 0; i < n; i++) ds.tokens[i] = (uint16_t)i;
    ds.n_tokens = n;
    ds.n_train = n_train;
    ds.max_token = (int)(n - 1);
    snprintf(ds.source, sizeof ds.source, "counting-%zu", n);
    return ds;
}

/* ---- tokenizer ------------------------------------------------------------ */

Test(data, text_tokenizer_is_bytes_without_separator_lines)
{
    /* Lines of exactly "%" (with or without a final newline) become "\n";
     * "%" anywhere else stays, and bytes ≥ 128 keep their value. */
    const char *path = temp_path("fortunes.txt");
    write_text(path, "ab\n%\n%%\n 100%\n%\n%x\n\xff\xc3\xa9\n%");
    const char expected[] = "ab\n\n%%\n 100%\n\n%x\n\xff\xc3\xa9\n\n";
    pt_dataset ds;
    cr_assert_eq(pt_dataset_load(&ds, path, PT_DATA_TEXT, 0.0), PIPERT_OK, "%s", pipert_last_error());
    expect_tokens_equal_bytes(&ds, expected, sizeof expected - 1);
    cr_expect_eq(ds.max_token, 255);
    cr_expect_eq(ds.n_train, ds.n_tokens);
    cr_expect(strstr(ds.source, path), "source \"%s\" should name the file", ds.source);
    pt_dataset_free(&ds);
}

Test(data, directory_reads_sorted_text_files_skipping_dat_u8_and_subdirectories)
{
    const char *dir = temp_path("corpus");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/off", dir);
    cr_assert_eq(mkdir(sub, 0755), 0);
    const struct { const char *name, *text; } files[] = {
        {"b", "B1\n"}, {"a", "A1\n%\n"}, {"a.dat", "XX"}, {"a.u8", "YY"},
        {"off/z", "ZZ"}, {"C", "c\n"}, /* 'C' sorts before 'a' byte-wise */
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        write_text(path, files[i].text);
    }
    pt_dataset ds;
    cr_assert_eq(pt_dataset_load(&ds, dir, PT_DATA_AUTO, 0.0), PIPERT_OK, "%s", pipert_last_error());
    const char expected[] = "c\nA1\n\nB1\n";
    expect_tokens_equal_bytes(&ds, expected, sizeof expected - 1);
    cr_expect(strstr(ds.source, "3 files"), "source \"%s\" should count 3 files", ds.source);
    pt_dataset_free(&ds);
}

/* The expected length of the default corpus, counted independently: every
 * file's bytes, less one for each "%\n" line (which becomes "\n"). */
static size_t fortunes_expected_length(size_t *n_files)
{
    DIR *dir = opendir(PT_FORTUNES_DIR);
    cr_assert(dir, "%s is missing", PT_FORTUNES_DIR);
    size_t total = 0;
    *n_files = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        size_t len = strlen(entry->d_name);
        if ((len >= 4 && !strcmp(entry->d_name + len - 4, ".dat")) ||
            (len >= 3 && !strcmp(entry->d_name + len - 3, ".u8")))
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", PT_FORTUNES_DIR, entry->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        FILE *f = fopen(path, "rb");
        cr_assert(f, "cannot open %s", path);
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        while ((got = getline(&line, &cap, f)) > 0)
            total += strcmp(line, "%\n") == 0 ? 1 : (size_t)got;
        free(line);
        fclose(f);
        ++*n_files;
    }
    closedir(dir);
    return total;
}

Test(data, default_corpus_is_fortunes_without_separators)
{
    pt_dataset ds;
    cr_assert_eq(pt_dataset_load(&ds, "", PT_DATA_AUTO, 0.1), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_gt(ds.n_tokens, 1000000, "the fortunes corpus has only %zu tokens", ds.n_tokens);
    size_t n_files;
    size_t expected = fortunes_expected_length(&n_files);
    cr_expect_eq(ds.n_tokens, expected, "n_tokens %zu, expected %zu from %zu files", ds.n_tokens,
                 expected, n_files);
    char files[64];
    snprintf(files, sizeof files, "%zu files", n_files);
    cr_expect(strstr(ds.source, "fortunes") && strstr(ds.source, files),
              "source \"%s\" should say fortunes and %s", ds.source, files);
    cr_expect_leq(ds.max_token, 255);
    size_t separators = 0;
    for (size_t i = 0; i < ds.n_tokens; i++) {
        int line_start = i == 0 || ds.tokens[i - 1] == '\n';
        int alone = i + 1 == ds.n_tokens || ds.tokens[i + 1] == '\n';
        separators += line_start && alone && ds.tokens[i] == '%';
    }
    cr_expect_eq(separators, 0, "%zu lines are exactly \"%%\"", separators);
    pt_dataset_free(&ds);
}

/* ---- shards --------------------------------------------------------------- */

Test(data, shard_round_trip_and_byte_layout)
{
    const size_t n = 3001;
    uint16_t *tokens = malloc(n * sizeof *tokens);
    for (size_t i = 0; i < n; i++) tokens[i] = (uint16_t)(i * 7919u);
    tokens[0] = 0, tokens[1] = 65535, tokens[2] = 50256;
    const char *path = temp_path("round.bin");
    cr_assert_eq(pt_shard_write(path, tokens, n), PIPERT_OK, "%s", pipert_last_error());

    /* The bytes, decoded by hand: 256 LE int32 then LE uint16. */
    char *raw;
    size_t size;
    cr_assert_eq(pt_read_file(path, &raw, &size), PIPERT_OK);
    const unsigned char *b = (const unsigned char *)raw;
    cr_expect_eq(size, 1024 + 2 * n);
    uint32_t header[256];
    for (int i = 0; i < 256; i++)
        header[i] = b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
    cr_expect_eq(header[0], 20240520u);
    cr_expect_eq(header[1], 1u);
    cr_expect_eq(header[2], n);
    for (int i = 3; i < 256; i++) cr_expect_eq(header[i], 0u, "header[%d] = %u", i, header[i]);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(b[1024 + 2 * i] | b[1024 + 2 * i + 1] << 8, tokens[i], "token %zu", i);
    free(raw);

    uint16_t *back;
    size_t count;
    cr_assert_eq(pt_shard_read(path, &back, &count), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(count, n);
    cr_expect_eq(memcmp(back, tokens, n * sizeof *tokens), 0, "tokens differ after round trip");
    free(back);

    /* Nothing but the shard is left in the directory (no temporary file). */
    DIR *dir = opendir(temp_dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(dir));) entries += e->d_name[0] != '.';
    closedir(dir);
    cr_expect_eq(entries, 1, "%d files in the directory, expected only the shard", entries);

    /* An empty shard is valid. */
    cr_assert_eq(pt_shard_write(path, tokens, 0), PIPERT_OK);
    cr_assert_eq(pt_shard_read(path, &back, &count), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(count, 0);
    free(back);
    free(tokens);
}

/* A valid 10-token shard's bytes [1044]. */
static void good_shard_bytes(unsigned char *bytes)
{
    uint16_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const char *path = temp_path("good.bin");
    cr_assert_eq(pt_shard_write(path, tokens, 10), PIPERT_OK);
    FILE *f = fopen(path, "rb");
    cr_assert_eq(fread(bytes, 1, 1044, f), 1044);
    fclose(f);
}

static void expect_shard_format_error(const char *path, const char *detail)
{
    uint16_t *tokens = NULL;
    size_t count = 1;
    cr_expect_eq(pt_shard_read(path, &tokens, &count), PIPERT_ERR_FORMAT, "%s: got \"%s\"", path,
                 pipert_last_error());
    cr_expect_null(tokens);
    cr_expect_eq(count, 0);
    expect_error_names(path);
    if (detail) expect_error_names(detail);
    /* The dataset loader reports the same. */
    pt_dataset ds;
    cr_expect_eq(pt_dataset_load(&ds, path, PT_DATA_TOKENS, 0.0), PIPERT_ERR_FORMAT);
    expect_error_names(path);
    cr_expect_null(ds.tokens);
}

Test(data, shard_corruptions_are_format_errors_naming_the_file)
{
    unsigned char bytes[1046];
    good_shard_bytes(bytes);

    unsigned char wrong_magic[1044];
    memcpy(wrong_magic, bytes, 1044);
    wrong_magic[0] = 0x39, wrong_magic[1] = 0x30, wrong_magic[2] = 0, wrong_magic[3] = 0; /* 12345 */
    write_bytes(temp_path("magic.bin"), wrong_magic, 1044);
    expect_shard_format_error(temp_path("magic.bin"), "12345");

    write_bytes(temp_path("short.bin"), bytes, 100);
    expect_shard_format_error(temp_path("short.bin"), "100 bytes");

    write_bytes(temp_path("cut.bin"), bytes, 1030);
    expect_shard_format_error(temp_path("cut.bin"), "1030");
    expect_error_names("1044"); /* the size the header implies */

    bytes[1044] = bytes[1045] = 0;
    write_bytes(temp_path("long.bin"), bytes, 1046);
    expect_shard_format_error(temp_path("long.bin"), "1046");

    unsigned char version2[1044];
    memcpy(version2, bytes, 1044);
    version2[4] = 2;
    write_bytes(temp_path("v2.bin"), version2, 1044);
    expect_shard_format_error(temp_path("v2.bin"), "version 2");

    uint16_t *tokens;
    size_t count;
    cr_expect_eq(pt_shard_read(temp_path("absent.bin"), &tokens, &count), PIPERT_ERR_IO);
    expect_error_names(temp_path("absent.bin"));
}

/* ---- format detection and splits ------------------------------------------ */

Test(data, auto_detection_and_forced_formats)
{
    uint16_t shard[5] = {300, 1, 65535, 7, 42};
    const char *tok = temp_path("corpus.tok"); /* magic, but no .bin name */
    cr_assert_eq(pt_shard_write(tok, shard, 5), PIPERT_OK);
    const char *txt = temp_path("plain.txt");
    write_text(txt, "hello\n");
    const char *fake_bin = temp_path("notes.bin"); /* .bin name, text inside */
    write_text(fake_bin, "not a shard, just text that is long enough\n");

    pt_dataset ds;
    cr_assert_eq(pt_dataset_load(&ds, tok, PT_DATA_AUTO, 0.0), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(ds.n_tokens, 5);
    for (int i = 0; i < 5; i++) cr_expect_eq(ds.tokens[i], shard[i]);
    cr_expect_eq(ds.max_token, 65535);
    cr_expect(strstr(ds.source, "tokens"), "source \"%s\" should say tokens", ds.source);
    pt_dataset_free(&ds);

    cr_assert_eq(pt_dataset_load(&ds, txt, PT_DATA_AUTO, 0.0), PIPERT_OK, "%s", pipert_last_error());
    expect_tokens_equal_bytes(&ds, "hello\n", 6);
    pt_dataset_free(&ds);

    cr_expect_eq(pt_dataset_load(&ds, fake_bin, PT_DATA_AUTO, 0.0), PIPERT_ERR_FORMAT,
                 "a .bin file should be read as a shard");
    expect_error_names(fake_bin);

    /* Forced: a shard read as text is its bytes; text read as tokens fails. */
    cr_assert_eq(pt_dataset_load(&ds, tok, PT_DATA_TEXT, 0.0), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(ds.n_tokens, 1024 + 2 * 5);
    cr_expect_eq(ds.tokens[0], 20240520 & 0xff);
    pt_dataset_free(&ds);
    cr_expect_eq(pt_dataset_load(&ds, txt, PT_DATA_TOKENS, 0.0), PIPERT_ERR_FORMAT);
    expect_error_names(txt);

    cr_expect_eq(pt_dataset_load(&ds, txt, PT_DATA_FORMATS, 0.0), PIPERT_ERR_INVALID_ARG);
    expect_error_names("data.format");
    cr_expect_eq(pt_dataset_load(&ds, temp_path("missing.txt"), PT_DATA_AUTO, 0.0), PIPERT_ERR_IO);
    expect_error_names(temp_path("missing.txt"));
}

Test(data, mixed_directory_detects_each_file)
{
    const char *dir = temp_path("mixed");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char path[300];
    uint16_t shard[3] = {1000, 2000, 3000};
    snprintf(path, sizeof path, "%s/1.bin", dir);
    cr_assert_eq(pt_shard_write(path, shard, 3), PIPERT_OK);
    snprintf(path, sizeof path, "%s/2.txt", dir);
    write_text(path, "hi");
    pt_dataset ds;
    cr_assert_eq(pt_dataset_load(&ds, dir, PT_DATA_AUTO, 0.0), PIPERT_OK, "%s", pipert_last_error());
    const uint16_t expected[5] = {1000, 2000, 3000, 'h', 'i'};
    cr_assert_eq(ds.n_tokens, 5);
    for (int i = 0; i < 5; i++) cr_expect_eq(ds.tokens[i], expected[i], "token %d", i);
    cr_expect_eq(ds.max_token, 3000);
    pt_dataset_free(&ds);
}

/* From memory, as the fuzzing harness reads: the same formats and errors. An empty shard first
 * in a directory decoded its no tokens at NULL + 0 (fuzz/corpus/data/regression-empty-shard-*). */
Test(data, loads_from_memory_and_empty_shards_are_no_tokens)
{
    unsigned char bytes[PT_SHARD_HEADER_BYTES + 4] = {0};
    const uint32_t header[3] = {PT_SHARD_MAGIC, PT_SHARD_VERSION, 2};
    memcpy(bytes, header, sizeof header);
    bytes[PT_SHARD_HEADER_BYTES] = 7;
    bytes[PT_SHARD_HEADER_BYTES + 3] = 1;
    pt_dataset ds;
    cr_assert_eq(pt_dataset_load_memory(&ds, "mem.bin", bytes, sizeof bytes, PT_DATA_AUTO, 0.0), PIPERT_OK,
                 "%s", pipert_last_error());
    cr_expect_eq(ds.n_tokens, 2);
    cr_expect_eq(ds.tokens[0], 7);
    cr_expect_eq(ds.tokens[1], 256);
    pt_dataset_free(&ds);

    bytes[8] = 0; /* no tokens */
    cr_expect_eq(pt_dataset_load_memory(&ds, "mem.bin", bytes, PT_SHARD_HEADER_BYTES, PT_DATA_TOKENS, 0.0),
                 PIPERT_ERR_FORMAT);
    expect_error_names("mem.bin: holds no tokens");
    const char *dir = temp_path("empty-first");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char path[300];
    snprintf(path, sizeof path, "%s/0.bin", dir);
    cr_assert_eq(pt_shard_write(path, NULL, 0), PIPERT_OK);
    snprintf(path, sizeof path, "%s/1.txt", dir);
    write_text(path, "ab");
    cr_assert_eq(pt_dataset_load(&ds, dir, PT_DATA_AUTO, 0.0), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(ds.n_tokens, 2);
    pt_dataset_free(&ds);
}

Test(data, split_sizes)
{
    const char *path = temp_path("seven.txt");
    write_text(path, "abcdefg");
    pt_dataset ds;
    const struct { double fraction; size_t n_train; } cases[] = {
        {0.0, 7}, {0.5, 3} /* round(3.5) = 4 held out */, {0.25, 5} /* round(1.75) = 2 */,
        {0.07, 7} /* round(0.49) = 0 */, {0.99, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(pt_dataset_load(&ds, path, PT_DATA_TEXT, cases[i].fraction), PIPERT_OK);
        cr_expect_eq(ds.n_tokens, 7);
        cr_expect_eq(ds.n_train, cases[i].n_train, "val_fraction %g: n_train %zu, expected %zu",
                     cases[i].fraction, ds.n_train, cases[i].n_train);
        pt_dataset_free(&ds);
    }
    const double invalid[] = {-0.1, 1.0, NAN};
    for (size_t i = 0; i < 3; i++) {
        cr_expect_eq(pt_dataset_load(&ds, path, PT_DATA_TEXT, invalid[i]), PIPERT_ERR_INVALID_ARG,
                     "val_fraction %g accepted", invalid[i]);
        expect_error_names("val_fraction");
    }
    write_text(path, "");
    cr_expect_eq(pt_dataset_load(&ds, path, PT_DATA_TEXT, 0.1), PIPERT_ERR_FORMAT);
    expect_error_names(path);
}

/* ---- batches -------------------------------------------------------------- */

Test(data, train_batches_are_reproducible_shifted_and_inside_the_train_split)
{
    enum { B = 4, T = 16 };
    pt_dataset ds = counting_dataset(5000, 4000);
    const uint64_t seed = 1234;
    const uint64_t starts = ds.n_train - T;
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    size_t lowest = SIZE_MAX, highest = 0;
    pt_philox_key key = pt_rng_key(seed, PT_DATA_STREAM);
    for (int replica = 0; replica < 2; replica++) {
        for (long step = 0; step < 1000; step++) {
            pt_dataset_train_batch(&ds, seed, step, replica * B, B, T, in, tg);
            for (int b = 0; b < B; b++) {
                size_t o = (size_t)in[b * T];
                cr_assert_leq(o + T, ds.n_train - 1, "step %ld seq %d: offset %zu leaves the "
                              "train split [0, %zu)", step, b, o, ds.n_train);
                /* Reference: the high word of u64·bound (rejection has
                 * probability < 4000/2^64, never in this range). */
                uint64_t x = pt_rng_u64(key, (uint64_t)step << 32 | (uint64_t)(replica * B + b));
                uint64_t want = (uint64_t)(((unsigned __int128)x * starts) >> 64);
                cr_assert_eq(o, want, "step %ld seq %d: offset %zu, expected %lu", step, b, o,
                             (unsigned long)want);
                for (int t = 0; t < T; t++) {
                    cr_assert_eq(in[b * T + t], (int32_t)(o + t));
                    cr_assert_eq(tg[b * T + t], (int32_t)(o + t + 1), "targets not shifted");
                }
                lowest = o < lowest ? o : lowest;
                highest = o > highest ? o : highest;
            }
        }
    }
    cr_expect_lt(lowest, 20, "8000 draws never came near 0 (lowest %zu)", lowest);
    cr_expect_gt(highest, starts - 21, "8000 draws never came near the end (highest %zu)", highest);

    pt_dataset_train_batch(&ds, seed, 77, 0, B, T, in, tg);
    pt_dataset_train_batch(&ds, seed, 77, 0, B, T, in2, tg2);
    cr_expect_eq(memcmp(in, in2, sizeof in), 0, "same call, different inputs");
    cr_expect_eq(memcmp(tg, tg2, sizeof tg), 0, "same call, different targets");
    pt_dataset_train_batch(&ds, seed, 78, 0, B, T, in2, tg2);
    cr_expect_neq(memcmp(in, in2, sizeof in), 0, "steps 77 and 78 gave the same batch");
    pt_dataset_train_batch(&ds, seed, 77, B, B, T, in2, tg2);
    cr_expect_neq(memcmp(in, in2, sizeof in), 0, "replicas 0 and 1 gave the same batch");
    pt_dataset_train_batch(&ds, seed + 1, 77, 0, B, T, in2, tg2);
    cr_expect_neq(memcmp(in, in2, sizeof in), 0, "seeds 1234 and 1235 gave the same batch");
    pt_dataset_free(&ds);
}

/* R replicas of batch B draw, between them, exactly the batch R·B of one
 * worker: the property that makes data parallelism equal a larger batch. */
Test(data, replicas_share_the_global_batch)
{
    enum { B = 3, R = 4, T = 8 };
    pt_dataset ds = counting_dataset(5000, 4000);
    int32_t whole_in[R * B * T], whole_tg[R * B * T], in[B * T], tg[B * T];
    for (long step = 0; step < 50; step++) {
        pt_dataset_train_batch(&ds, 7, step, 0, R * B, T, whole_in, whole_tg);
        for (int r = 0; r < R; r++) {
            pt_dataset_train_batch(&ds, 7, step, (long)r * B, B, T, in, tg);
            cr_assert_eq(memcmp(in, whole_in + r * B * T, sizeof in), 0, "step %ld replica %d", step, r);
            cr_assert_eq(memcmp(tg, whole_tg + r * B * T, sizeof tg), 0, "step %ld replica %d", step, r);
        }
    }
    pt_dataset_free(&ds);
}

Test(data, train_offsets_are_uniform)
{
    /* n_train − T = 10 possible offsets; 20000 draws; chi-square with 9
     * degrees of freedom stays below 27.88 with probability 0.999. */
    enum { B = 4, T = 3, STARTS = 10, STEPS = 5000 };
    pt_dataset ds = counting_dataset(T + STARTS, T + STARTS);
    long counts[STARTS] = {0};
    int32_t in[B * T], tg[B * T];
    for (long step = 0; step < STEPS; step++) {
        pt_dataset_train_batch(&ds, 99, step, 3 * B, B, T, in, tg);
        for (int b = 0; b < B; b++) {
            cr_assert(in[b * T] >= 0 && in[b * T] < STARTS, "offset %d", in[b * T]);
            counts[in[b * T]]++;
        }
    }
    double expected = (double)B * STEPS / STARTS, chi2 = 0;
    for (int i = 0; i < STARTS; i++) chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    cr_expect_lt(chi2, 27.88, "chi-square %.2f over offsets 0..9", chi2);
    pt_dataset_free(&ds);
}

Test(data, bounded_draw_is_unbiased_when_rejection_matters)
{
    /* bound = 3·2^62: plain multiply-shift (no rejection) would give values ≡ 0
     * (mod 3) with probability 1/2; the unbiased draw gives 1/3. A quarter of
     * the raw draws are rejected, so the redraw path runs often. */
    const uint64_t bound = 3ull << 62, threshold = 1ull << 62; /* 2^64 mod bound */
    pt_philox_key key = pt_rng_key(5, 6);
    const int n = 40000;
    int multiples_of_3 = 0, rejected = 0;
    for (int i = 0; i < n; i++) {
        uint64_t y = pt_rng_below(key, (uint64_t)i, bound);
        cr_assert_lt(y, bound);
        cr_assert_eq(y, pt_rng_below(key, (uint64_t)i, bound), "draw %d not reproducible", i);
        multiples_of_3 += y % 3 == 0;
        unsigned __int128 product = (unsigned __int128)pt_rng_u64(key, (uint64_t)i) * bound;
        if ((uint64_t)product < threshold) rejected++;
        else cr_assert_eq(y, (uint64_t)(product >> 64), "accepted draw %d changed", i);
    }
    double fraction = (double)multiples_of_3 / n; /* standard error 0.0024 */
    cr_expect(fabs(fraction - 1.0 / 3) < 0.012, "P(y ≡ 0 mod 3) = %.4f, expected 1/3", fraction);
    cr_expect(rejected > n / 5 && rejected < n / 3.5, "%d of %d rejected, expected about 1/4",
              rejected, n);
    for (int i = 0; i < 100; i++) cr_expect_eq(pt_rng_below(key, (uint64_t)i, 1), 0);
}

Test(data, validation_batches_spread_evenly_over_the_validation_split)
{
    enum { B = 4, T = 16, N = 5 };
    pt_dataset ds = counting_dataset(5000, 4000);
    int32_t in[B * T], tg[B * T];
    long starts[N * B];
    for (int k = 0; k < N; k++) {
        pt_dataset_val_batch(&ds, k, N, B, T, in, tg);
        for (int b = 0; b < B; b++) {
            long o = in[b * T];
            cr_assert(o >= (long)ds.n_train && o + T <= (long)ds.n_tokens - 1,
                      "batch %d seq %d: start %ld leaves the validation split [%zu, %zu)", k, b, o,
                      ds.n_train, ds.n_tokens);
            for (int t = 0; t < T; t++) {
                cr_assert_eq(in[b * T + t], o + t);
                cr_assert_eq(tg[b * T + t], o + t + 1, "targets not shifted");
            }
            starts[k * B + b] = o;
        }
    }
    /* j·(1000 − 16)/20 = j·49.2: gaps of 49 or 50, from the split's start. */
    cr_expect_eq(starts[0], 4000);
    for (int j = 1; j < N * B; j++) {
        long gap = starts[j] - starts[j - 1];
        cr_expect(gap == 49 || gap == 50, "gap %ld between sequences %d and %d", gap, j - 1, j);
    }
    cr_expect_eq(starts[N * B - 1], 4000 + (19 * 984) / 20);

    /* The smallest split (T+1 tokens): every sequence is the whole split. */
    ds.n_train = ds.n_tokens - (T + 1);
    pt_dataset_val_batch(&ds, 2, 3, B, T, in, tg);
    for (int b = 0; b < B; b++) cr_expect_eq(in[b * T], (int32_t)ds.n_train);
    cr_expect_eq(tg[B * T - 1], (int32_t)ds.n_tokens - 1);
    pt_dataset_free(&ds);
}

/* ---- checks --------------------------------------------------------------- */

Test(data, check_reports_vocabulary_and_length_problems)
{
    pt_dataset ds = counting_dataset(400, 300); /* tokens 0..399 */
    cr_expect_eq(pt_dataset_check(&ds, 8, 400), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_dataset_check(&ds, 8, 399), PIPERT_ERR_CONFIG, "token 399 >= vocab 399");
    expect_error_names(ds.source);
    expect_error_names("399");
    cr_expect_eq(pt_dataset_check(&ds, 8, 256), PIPERT_ERR_CONFIG);
    expect_error_names("vocab_size");

    ds.n_train = 101; /* 101 train tokens, 299 validation tokens */
    cr_expect_eq(pt_dataset_check(&ds, 100, 400), PIPERT_OK, "101 train tokens serve T=100");
    cr_expect_eq(pt_dataset_check(&ds, 101, 400), PIPERT_ERR_CONFIG, "101 train tokens, T+1=102");
    expect_error_names(ds.source);
    expect_error_names("train");

    ds.n_train = 395; /* 5 validation tokens */
    cr_expect_eq(pt_dataset_check(&ds, 4, 400), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_dataset_check(&ds, 5, 400), PIPERT_ERR_CONFIG, "5 validation tokens, T=5");
    expect_error_names(ds.source);
    expect_error_names("validation");

    ds.n_train = 400; /* no validation split: allowed */
    cr_expect_eq(pt_dataset_check(&ds, 64, 400), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_dataset_check(&ds, 0, 400), PIPERT_ERR_CONFIG, "T = 0 accepted");
    pt_dataset_free(&ds);
}
