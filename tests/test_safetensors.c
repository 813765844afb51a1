#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "runtime/fileio.h"
#include "runtime/safetensors.h"

/* ---- helpers ------------------------------------------------------------ */

static char test_dir[64];

static void make_test_dir(void)
{
    strcpy(test_dir, "/tmp/pt_safetensors_XXXXXX");
    cr_assert(mkdtemp(test_dir), "mkdtemp failed");
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_test_dir(void) { nftw(test_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

TestSuite(safetensors, .init = make_test_dir, .fini = remove_test_dir);

/* A path inside this test's directory (a few rotating buffers: enough for one statement). */
static const char *in_dir(const char *name)
{
    static char buffers[8][256];
    static int next;
    char *path = buffers[next++ % 8];
    snprintf(path, sizeof buffers[0], "%s/%s", test_dir, name);
    return path;
}

static void write_bytes(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, size, f), size);
    fclose(f);
}

/* A safetensors file from a header text (written as is, unpadded) and a data section. */
static void write_raw(const char *path, const char *header, const void *data, size_t data_size)
{
    size_t n = strlen(header);
    unsigned char *bytes = malloc(8 + n + data_size);
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(bytes + 8, header, n);
    if (data_size) memcpy(bytes + 8 + n, data, data_size);
    write_bytes(path, bytes, 8 + n + data_size);
    free(bytes);
}

static size_t count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static void expect_format_error(const char *path, const char *phrase)
{
    pt_safetensors *st = NULL;
    pipert_result rc = pt_safetensors_open(&st, path);
    cr_expect_eq(rc, PIPERT_ERR_FORMAT, "%s: expected a format error containing '%s', got '%s' (%s)",
                 path, phrase, pipert_result_str(rc), pipert_last_error());
    cr_expect_null(st, "a failed open must not return a handle");
    cr_expect(strstr(pipert_last_error(), phrase), "error \"%s\" does not say \"%s\"",
              pipert_last_error(), phrase);
    cr_expect(strstr(pipert_last_error(), path), "error \"%s\" does not name the file",
              pipert_last_error());
    cr_expect_null(strchr(pipert_last_error(), '\n'), "error \"%s\" is not one line",
                   pipert_last_error());
    pt_safetensors_close(st);
}

static uint32_t float_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

/* ---- round trip --------------------------------------------------------- */

Test(safetensors, round_trip_of_dtypes_shapes_and_metadata)
{
    float f32[2 * 3] = {1.f, -2.f, 3.5f, 1e-30f, -0.f, 65504.f};
    uint16_t bf16[5] = {0x3f80, 0xc020, 0x0001, 0x7f7f, 0x8000}; /* odd count: 10 bytes */
    int64_t scalar = -1234567890123ll;
    double f64[2 * 2 * 2] = {0.1, 0.2, 0.3, 0.4, -1e300, 1e-300, 2.0, 3.0};
    int32_t i32[7] = {1, -2, 3, -4, 5, -6, 2147483647};
    uint8_t flags[3] = {1, 0, 1};
    uint16_t f16[1] = {0x3c00};
    uint8_t nothing[1] = {0};
    struct {
        const char *name;
        pt_dtype dtype;
        const void *data;
        int ndim;
        int64_t shape[8];
        size_t numel;
    } tensors[] = {
        {"wte.weight", PT_DTYPE_F32, f32, 2, {2, 3}, 6},
        {"h.0.ln_1.bias", PT_DTYPE_BF16, bf16, 1, {5}, 5},
        {"step", PT_DTYPE_I64, &scalar, 0, {0}, 1},
        {"empty", PT_DTYPE_U8, nothing, 2, {3, 0}, 0},
        {"cube", PT_DTYPE_F64, f64, 3, {2, 2, 2}, 8},
        {"tokens", PT_DTYPE_I32, i32, 1, {7}, 7},
        {"mask", PT_DTYPE_BOOL, flags, 1, {3}, 3},
        {"deep", PT_DTYPE_F16, f16, 8, {1, 1, 1, 1, 1, 1, 1, 1}, 1},
    };
    const size_t count = sizeof tensors / sizeof tensors[0];

    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    for (size_t i = 0; i < count; i++)
        cr_assert_eq(pt_safetensors_writer_add(w, tensors[i].name, tensors[i].dtype, tensors[i].data,
                                               tensors[i].ndim, tensors[i].shape),
                     PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "format", "pt"), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "step", "1"), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "step", "1200"), PIPERT_OK); /* replaces */
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "naïve \"quoted\"", "ünïcode\n"), PIPERT_OK);
    const char *path = in_dir("model.safetensors");
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);
    cr_expect_eq(count_dir_entries(test_dir), 1, "a temporary file was left behind");

    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(pt_safetensors_path(st), path);
    cr_assert_eq(pt_safetensors_count(st), count);
    for (size_t i = 1; i < count; i++)
        cr_expect_lt(strcmp(pt_safetensors_at(st, i - 1)->name, pt_safetensors_at(st, i)->name), 0,
                     "entries are not sorted by name at %zu", i);
    cr_expect_null(pt_safetensors_at(st, count));
    for (size_t i = 0; i < count; i++) {
        const pt_tensor_entry *t = pt_safetensors_find(st, tensors[i].name);
        cr_assert(t, "tensor %s not found", tensors[i].name);
        cr_expect_str_eq(t->name, tensors[i].name);
        cr_expect_eq(t->dtype, tensors[i].dtype, "%s: dtype %s", t->name, pt_dtype_name(t->dtype));
        cr_expect_eq(t->ndim, tensors[i].ndim, "%s: ndim", t->name);
        for (int d = 0; d < t->ndim; d++)
            cr_expect_eq(t->shape[d], tensors[i].shape[d], "%s: dim %d", t->name, d);
        cr_expect_eq(t->numel, tensors[i].numel, "%s: numel", t->name);
        cr_expect_eq(t->nbytes, tensors[i].numel * pt_dtype_size(t->dtype), "%s: nbytes", t->name);
        cr_expect_eq(t->offset % pt_dtype_size(t->dtype), 0, "%s at offset %zu is not aligned",
                     t->name, t->offset);
        if (t->nbytes)
            cr_expect_eq(memcmp(pt_safetensors_data(st, t), tensors[i].data, t->nbytes), 0,
                         "%s: data differs", t->name);
    }
    cr_expect_null(pt_safetensors_find(st, "absent"));
    cr_expect_null(pt_safetensors_find(st, "__metadata__"));
    cr_expect_str_eq(pt_safetensors_metadata(st, "format"), "pt");
    cr_expect_str_eq(pt_safetensors_metadata(st, "step"), "1200");
    cr_expect_str_eq(pt_safetensors_metadata(st, "naïve \"quoted\""), "ünïcode\n");
    cr_expect_null(pt_safetensors_metadata(st, "absent"));
    pt_safetensors_close(st);

    /* The data section starts 8-byte aligned and the header is padded with spaces. */
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(path, &bytes, &size), PIPERT_OK);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
    cr_expect_eq((8 + n) % 8, 0, "header length %llu leaves the data unaligned", (unsigned long long)n);
    cr_expect_eq(bytes[8], '{');
    size_t last = 8 + n - 1;
    while (bytes[last] == ' ') last--;
    cr_expect_eq(bytes[last], '}', "header is padded with something other than spaces");
    free(bytes);
}

/* The writer's output for a small case, byte for byte, built here from the format description. */
Test(safetensors, writer_output_is_byte_exact)
{
    const char header[] =
        "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}";
    const size_t header_length = sizeof header - 1; /* 131 characters, padded to 136 */
    cr_assert_eq(header_length, 131);
    unsigned char expected[8 + 136 + 9];
    memset(expected, 0, sizeof expected);
    expected[0] = 136; /* little-endian u64 */
    memcpy(expected + 8, header, header_length);
    memset(expected + 8 + header_length, ' ', 136 - header_length);
    const unsigned char data[9] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x2a};
    memcpy(expected + 8 + 136, data, sizeof data);

    float a[2] = {1.f, -2.f};
    uint8_t b[1] = {42};
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "b", PT_DTYPE_U8, b, 1, (int64_t[]){1}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "a", PT_DTYPE_F32, a, 1, (int64_t[]){2}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "k", "v"), PIPERT_OK);
    const char *path = in_dir("exact.safetensors");
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);

    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(path, &bytes, &size), PIPERT_OK);
    cr_assert_eq(size, sizeof expected, "file has %zu bytes, expected %zu", size, sizeof expected);
    for (size_t i = 0; i < size; i++)
        cr_assert_eq((unsigned char)bytes[i], expected[i], "byte %zu: 0x%02x, expected 0x%02x", i,
                     (unsigned char)bytes[i], expected[i]);
    free(bytes);
}

/* In memory (a replica rejoining gets its state so): the same bytes as the file, and they open. */
Test(safetensors, serialized_bytes_are_the_file_and_open_in_memory)
{
    float a[3] = {1.f, -2.f, 0.5f};
    int64_t b[2] = {7, -9};
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "a", PT_DTYPE_F32, a, 1, (int64_t[]){3}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "b", PT_DTYPE_I64, b, 1, (int64_t[]){2}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_set_metadata(w, "step", "12"), PIPERT_OK);
    const char *path = in_dir("memory.safetensors");
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    void *bytes;
    size_t size;
    cr_assert_eq(pt_safetensors_writer_serialize(w, &bytes, &size), PIPERT_OK);
    pt_safetensors_writer_free(w);
    char *file;
    size_t file_size;
    cr_assert_eq(pt_read_file(path, &file, &file_size), PIPERT_OK);
    cr_assert_eq(size, file_size);
    cr_expect_eq(memcmp(bytes, file, size), 0, "the serialized bytes differ from the file's");
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open_memory(&st, "in memory", bytes, size), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_str_eq(pt_safetensors_metadata(st, "step"), "12");
    float back[3];
    cr_assert_eq(pt_safetensors_read_f32(st, pt_safetensors_find(st, "a"), back, 3), PIPERT_OK);
    cr_expect(back[0] == 1.f && back[1] == -2.f && back[2] == 0.5f);
    pt_safetensors_close(st);
    free(file);
    free(bytes);
}

/* As pieces (a donor sends its state so): the header, then the caller's own tensor data in file
 * order, an empty tensor left out, adding up to the serialized bytes. */
Test(safetensors, pieces_are_the_file_in_place)
{
    float a[3] = {1.f, -2.f, 0.5f};
    int64_t b[2] = {7, -9};
    float none[1];
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "a", PT_DTYPE_F32, a, 1, (int64_t[]){3}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "b", PT_DTYPE_I64, b, 1, (int64_t[]){2}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "c", PT_DTYPE_F32, none, 1, (int64_t[]){0}), PIPERT_OK);
    void *bytes;
    size_t size;
    cr_assert_eq(pt_safetensors_writer_serialize(w, &bytes, &size), PIPERT_OK);
    pt_safetensors_pieces p;
    cr_assert_eq(pt_safetensors_writer_pieces(w, &p), PIPERT_OK);
    cr_assert_eq(p.count, 3, "%zu pieces: the header, b (8-byte elements first), a", p.count);
    cr_expect_eq(p.piece[1].data, (const void *)b);
    cr_expect_eq(p.piece[2].data, (const void *)a);
    cr_expect_eq(p.piece[0].data, (const void *)p.head);
    cr_assert_eq(p.total, size);
    size_t at = 0;
    for (size_t i = 0; i < p.count; i++) {
        cr_expect_eq(memcmp((const char *)bytes + at, p.piece[i].data, p.piece[i].nbytes), 0,
                     "piece %zu differs from the file's bytes", i);
        at += p.piece[i].nbytes;
    }
    cr_expect_eq(at, size);
    pt_safetensors_pieces_free(&p);
    pt_safetensors_writer_free(w);
    free(bytes);
}

Test(safetensors, empty_file_round_trips)
{
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    const char *path = in_dir("empty.safetensors");
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_safetensors_count(st), 0);
    cr_expect_null(pt_safetensors_find(st, "x"));
    cr_expect_null(pt_safetensors_metadata(st, "x"));
    pt_safetensors_close(st);
}

/* ---- a file built by hand ----------------------------------------------- */

Test(safetensors, hand_built_file_is_parsed)
{
    /* Tensor order in the header differs from name order and from data order; the header has
     * spaces inside and after it; 4 data bytes at the end belong to no tensor (allowed). */
    const char *header = "{ \"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [8, 24]},"
                         " \"__metadata__\": {\"format\": \"pt\", \"note\": \"\\u00e9\"},"
                         " \"b\": {\"shape\": [3], \"dtype\": \"BF16\", \"data_offsets\": [0, 6]},"
                         " \"z\": {\"dtype\": \"I8\", \"shape\": [], \"data_offsets\": [6, 7]} }   ";
    const unsigned char data[28] = {
        0x80, 0x3f, 0x20, 0xc0, 0x00, 0x00,                   /* b: bf16 1.0, -2.5, 0.0 */
        0xfb, 0x00,                                           /* z: int8 -5, one unused byte */
        0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,       /* w: 1.0f, 2.0f */
        0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0xc0,       /* 3.0f, -4.0f */
        0xde, 0xad, 0xbe, 0xef,                               /* belongs to no tensor */
    };
    const char *path = in_dir("hand.safetensors");
    write_raw(path, header, data, sizeof data);

    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_safetensors_count(st), 3);
    cr_expect_str_eq(pt_safetensors_at(st, 0)->name, "b");
    cr_expect_str_eq(pt_safetensors_at(st, 1)->name, "w");
    cr_expect_str_eq(pt_safetensors_at(st, 2)->name, "z");
    cr_expect_str_eq(pt_safetensors_metadata(st, "format"), "pt");
    cr_expect_str_eq(pt_safetensors_metadata(st, "note"), "\xc3\xa9");

    const pt_tensor_entry *w = pt_safetensors_find(st, "w");
    cr_assert(w);
    cr_expect_eq(w->dtype, PT_DTYPE_F32);
    cr_expect_eq(w->ndim, 2);
    cr_expect_eq(w->shape[0], 2);
    cr_expect_eq(w->shape[1], 2);
    cr_expect_eq(w->numel, 4);
    cr_expect_eq(w->offset, 8);
    cr_expect_eq(w->nbytes, 16);
    float values[4];
    cr_assert_eq(pt_safetensors_read_f32(st, w, values, 4), PIPERT_OK, "%s", pipert_last_error());
    const float expected_w[4] = {1.f, 2.f, 3.f, -4.f};
    for (int i = 0; i < 4; i++) cr_expect_eq(values[i], expected_w[i], "w[%d] = %g", i, values[i]);

    const pt_tensor_entry *b = pt_safetensors_find(st, "b");
    cr_assert(b);
    cr_expect_eq(b->dtype, PT_DTYPE_BF16);
    cr_expect_eq(b->offset, 0);
    cr_expect_eq(b->nbytes, 6);
    cr_assert_eq(pt_safetensors_read_f32(st, b, values, 3), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(values[0], 1.f);
    cr_expect_eq(values[1], -2.5f);
    cr_expect_eq(values[2], 0.f);

    const pt_tensor_entry *z = pt_safetensors_find(st, "z");
    cr_assert(z);
    cr_expect_eq(z->dtype, PT_DTYPE_I8);
    cr_expect_eq(z->ndim, 0);
    cr_expect_eq(z->numel, 1);
    cr_expect_eq(*(const int8_t *)pt_safetensors_data(st, z), -5);
    pt_safetensors_close(st);
}

/* ---- conversions -------------------------------------------------------- */

Test(safetensors, half_conversions_match_known_values)
{
    /* bit patterns and values from the IEEE 754 binary16 and bfloat16 definitions */
    const struct {
        uint16_t bits;
        float value;
    } f16[] = {
        {0x3c00, 1.f},       {0xc100, -2.5f},       {0x7bff, 65504.f},     {0x0001, 0x1p-24f},
        {0x03ff, 0x3ffp-24f}, {0x0400, 0x1p-14f},   {0x3555, 0x1.554p-2f}, {0x0000, 0.f},
        {0x7c00, INFINITY},  {0xfc00, -INFINITY},
    }, bf16[] = {
        {0x3f80, 1.f},     {0xc020, -2.5f},       {0x477f, 65280.f}, {0x0001, 0x1p-133f},
        {0x0080, 0x1p-126f}, {0x7f7f, 0x1.fep127f}, {0x7f80, INFINITY}, {0x3eab, 0x1.56p-2f},
    };
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++)
        cr_expect_eq(float_bits(pt_f16_to_f32(f16[i].bits)), float_bits(f16[i].value),
                     "f16 0x%04x -> %a, expected %a", f16[i].bits, pt_f16_to_f32(f16[i].bits),
                     f16[i].value);
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++)
        cr_expect_eq(float_bits(pt_bf16_to_f32(bf16[i].bits)), float_bits(bf16[i].value),
                     "bf16 0x%04x -> %a, expected %a", bf16[i].bits, pt_bf16_to_f32(bf16[i].bits),
                     bf16[i].value);
    cr_expect_eq(float_bits(pt_f16_to_f32(0x8000)), 0x80000000u, "f16 -0 lost its sign");
    cr_expect(isnan(pt_f16_to_f32(0x7e00)) && isnan(pt_f16_to_f32(0xfc01)), "f16 NaN");
    cr_expect(isnan(pt_bf16_to_f32(0x7fc0)), "bf16 NaN");
}

#ifdef __FLT16_MAX__
/* Every binary16 value against the compiler's own _Float16 conversion. */
Test(safetensors, f16_conversion_matches_compiler_for_all_values)
{
    for (uint32_t bits = 0; bits <= 0xffff; bits++) {
        uint16_t h = (uint16_t)bits;
        _Float16 reference_half;
        memcpy(&reference_half, &h, sizeof h);
        float reference = (float)reference_half, got = pt_f16_to_f32(h);
        if (isnan(reference)) cr_assert(isnan(got), "f16 0x%04x: %a, expected NaN", h, got);
        else cr_assert_eq(float_bits(got), float_bits(reference), "f16 0x%04x: %a, expected %a", h,
                          got, reference);
    }
}
#endif

Test(safetensors, read_f32_converts_and_checks)
{
    uint16_t f16[4] = {0x3c00, 0xc100, 0x7bff, 0x0001};
    uint16_t bf16[4] = {0x3f80, 0xc020, 0x477f, 0x0001};
    double f64[4] = {1.0, -2.5, 1e-3, 1e300};
    float f32[4] = {1.f, -2.5f, 65504.f, 0x1p-24f};
    int32_t i32[4] = {1, 2, 3, 4};
    const int64_t shape[2] = {2, 2};
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "f16", PT_DTYPE_F16, f16, 2, shape), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "bf16", PT_DTYPE_BF16, bf16, 2, shape), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "f64", PT_DTYPE_F64, f64, 2, shape), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "f32", PT_DTYPE_F32, f32, 2, shape), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "i32", PT_DTYPE_I32, i32, 2, shape), PIPERT_OK);
    const char *path = in_dir("convert.safetensors");
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);

    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    const struct {
        const char *name;
        float expected[4];
    } cases[] = {
        {"f16", {1.f, -2.5f, 65504.f, 0x1p-24f}},
        {"bf16", {1.f, -2.5f, 65280.f, 0x1p-133f}},
        {"f64", {1.f, -2.5f, (float)1e-3, INFINITY}}, /* 1e300 rounds to +inf in fp32 */
        {"f32", {1.f, -2.5f, 65504.f, 0x1p-24f}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float got[4] = {0};
        const pt_tensor_entry *t = pt_safetensors_find(st, cases[c].name);
        cr_assert(t);
        cr_assert_eq(pt_safetensors_read_f32(st, t, got, 4), PIPERT_OK, "%s", pipert_last_error());
        for (int i = 0; i < 4; i++)
            cr_expect_eq(float_bits(got[i]), float_bits(cases[c].expected[i]),
                         "%s[%d] = %a, expected %a", cases[c].name, i, got[i], cases[c].expected[i]);
    }

    float dst[5];
    cr_expect_eq(pt_safetensors_read_f32(st, pt_safetensors_find(st, "f32"), dst, 5),
                 PIPERT_ERR_FORMAT);
    cr_expect(strstr(pipert_last_error(), "'f32' has 4 elements, expected 5"), "%s",
              pipert_last_error());
    cr_expect_eq(pt_safetensors_read_f32(st, pt_safetensors_find(st, "i32"), dst, 4),
                 PIPERT_ERR_FORMAT);
    cr_expect(strstr(pipert_last_error(), "'i32' is I32, not a floating-point dtype"), "%s",
              pipert_last_error());
    pt_safetensors_close(st);
}

Test(safetensors, dtype_names_and_sizes)
{
    for (int d = 0; d < PT_DTYPE_COUNT; d++) {
        pt_dtype back;
        cr_expect(pt_dtype_from_name(pt_dtype_name((pt_dtype)d), &back) && back == (pt_dtype)d,
                  "dtype %d (%s) does not round trip by name", d, pt_dtype_name((pt_dtype)d));
    }
    cr_expect_eq(pt_dtype_size(PT_DTYPE_BF16), 2);
    cr_expect_eq(pt_dtype_size(PT_DTYPE_I64), 8);
    cr_expect_eq(pt_dtype_size(PT_DTYPE_BOOL), 1);
    cr_expect_eq(pt_dtype_size(PT_DTYPE_COUNT), 0);
    pt_dtype unused;
    cr_expect_not(pt_dtype_from_name("f32", &unused), "dtype names are case-sensitive");
}

/* ---- corrupt files ------------------------------------------------------ */

/* A valid file with one tensor "x" (F32 [4]) and its header length. */
static void write_valid(const char *path, uint64_t *header_length, size_t *file_size)
{
    float x[4] = {1, 2, 3, 4};
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "x", PT_DTYPE_F32, x, 1, (int64_t[]){4}), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);
    char *bytes;
    cr_assert_eq(pt_read_file(path, &bytes, file_size), PIPERT_OK);
    *header_length = 0;
    for (int i = 0; i < 8; i++) *header_length |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
    free(bytes);
}

static void patch_bytes(const char *path, long at, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    cr_assert_eq(fseek(f, at, SEEK_SET), 0);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

Test(safetensors, truncated_and_patched_files_are_format_errors)
{
    uint64_t n;
    size_t size;
    const char *path = in_dir("corrupt.safetensors");

    write_bytes(path, "", 0);
    expect_format_error(path, "shorter than 8 bytes");
    write_bytes(path, "\x10\0\0\0\0", 5);
    expect_format_error(path, "shorter than 8 bytes");

    write_valid(path, &n, &size);
    cr_assert_eq(truncate(path, (off_t)(8 + n - 1)), 0);
    expect_format_error(path, "runs past the end of the file");

    write_valid(path, &n, &size);
    cr_assert_eq(truncate(path, (off_t)(size - 1)), 0); /* the last data byte is gone */
    expect_format_error(path, "run beyond the data section");

    write_valid(path, &n, &size);
    const unsigned char huge[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0}; /* 100000001 */
    patch_bytes(path, 0, huge, 8);
    expect_format_error(path, "exceeds the 100 MB limit");
    const unsigned char enormous[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    patch_bytes(path, 0, enormous, 8);
    expect_format_error(path, "exceeds the 100 MB limit");

    write_valid(path, &n, &size);
    patch_bytes(path, 8, "[", 1);
    expect_format_error(path, "header is not valid JSON");

    write_valid(path, &n, &size);
    patch_bytes(path, 8 + (long)n - 1, "\xff", 1); /* padding byte no longer a space */
    expect_format_error(path, "header is not valid JSON");
}

Test(safetensors, bad_headers_are_format_errors)
{
    static const struct {
        const char *header;
        const char *phrase;
    } cases[] = {
        {"", "header is not valid JSON"},
        {"{\"a\": ", "header is not valid JSON"},
        {"{\"x\": {}} trailing", "header is not valid JSON"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", "duplicate"},
        {"{\"\xff\": 1}", "header is not valid JSON"},
        {"[1, 2]", "header is not a JSON object"},
        {"\"text\"", "header is not a JSON object"},
        {"{\"__metadata__\": 5}", "\"__metadata__\" is not an object"},
        {"{\"__metadata__\": {\"a\": \"ok\", \"b\": 7}}", "\"__metadata__\" value of 'b' is not a string"},
        {"{\"t\": 3}", "tensor 't' is not an object"},
        {"{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", "tensor 't': missing \"dtype\""},
        {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", "tensor 't': missing \"shape\""},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", "tensor 't': missing \"data_offsets\""},
        {"{\"t\": {\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]}}",
         "tensor 't': \"dtype\" is not a string"},
        {"{\"t\": {\"dtype\": \"Q7\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
         "tensor 't': unknown dtype \"Q7\""},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0, 4]}}",
         "tensor 't': \"shape\" is not an array of integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}}",
         "tensor 't': \"shape\" is not an array of integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
         "tensor 't': negative dimension -1"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1125899906842624], \"data_offsets\": [0, 4]}}",
         "tensor 't': dimension 1125899906842624 is too large"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}",
         "tensor 't' has 9 dimensions (at most 8)"},
        {"{\"t\": {\"dtype\": \"U8\", \"shape\": [140737488355328, 140737488355328], "
         "\"data_offsets\": [0, 4]}}", "tensor 't': size of its shape in U8 overflows"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2147483648, 2147483648], "
         "\"data_offsets\": [0, 4]}}", "tensor 't': size of its shape in F32 overflows"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}",
         "tensor 't': \"data_offsets\" is not an array of two integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}",
         "tensor 't': \"data_offsets\" is not an array of two integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"0\": 4}}}",
         "tensor 't': \"data_offsets\" is not an array of two integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}",
         "tensor 't': data_offsets [8, 4] are not 0 <= begin <= end"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}",
         "tensor 't': data_offsets [-4, 0] are not 0 <= begin <= end"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [30, 34]}}",
         "tensor 't': data_offsets [30, 34] run beyond the data section (32 bytes)"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 12]}}",
         "tensor 't': data_offsets [0, 12] hold 12 bytes but its shape and dtype F32 need 8"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 0]}}",
         "hold 0 bytes but its shape and dtype F32 need 4"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
         "tensors 'a' and 'b' overlap"},
        {"{\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [16, 24]},"
         " \"a\": {\"dtype\": \"U8\", \"shape\": [20], \"data_offsets\": [0, 20]}}",
         "tensors 'a' and 'b' overlap"},
    };
    const unsigned char data[32] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "case%zu.safetensors", i);
        const char *path = in_dir(name);
        write_raw(path, cases[i].header, data, sizeof data);
        expect_format_error(path, cases[i].phrase);
    }
}

Test(safetensors, accepted_edge_cases)
{
    const char *headers[] = {
        /* gaps in the data section, empty tensors anywhere, entries out of offset order */
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
        "{\"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [4, 4]},"
        " \"f\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"g\": {\"dtype\": \"I64\", \"shape\": [0], \"data_offsets\": [32, 32]}}",
        "{\"b\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [16, 32]},"
        " \"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
        " \"__metadata__\": {}, \"c\": {\"dtype\": \"F16\", \"shape\": [0], \"data_offsets\": [2, 2],"
        " \"extra\": [\"ignored\"]}}",
        "{}",
    };
    const unsigned char data[32] = {0};
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        const char *path = in_dir("edge.safetensors");
        write_raw(path, headers[i], data, sizeof data);
        pt_safetensors *st;
        cr_expect_eq(pt_safetensors_open(&st, path), PIPERT_OK, "header %zu refused: %s", i,
                     pipert_last_error());
        pt_safetensors_close(st);
    }
}

Test(safetensors, missing_file_is_an_io_error)
{
    pt_safetensors *st;
    const char *path = in_dir("absent.safetensors");
    cr_expect_eq(pt_safetensors_open(&st, path), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), path), "%s", pipert_last_error());
    cr_expect_eq(pt_safetensors_open(&st, test_dir), PIPERT_ERR_IO, "a directory is not a file");
}

/* ---- writer failures ---------------------------------------------------- */

Test(safetensors, writer_refuses_bad_tensors)
{
    float x[4] = {0};
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "x", PT_DTYPE_F32, x, 1, (int64_t[]){4}), PIPERT_OK);
    cr_expect_eq(pt_safetensors_writer_add(w, "x", PT_DTYPE_F32, x, 1, (int64_t[]){4}),
                 PIPERT_ERR_INVALID_ARG, "duplicate name accepted");
    cr_expect(strstr(pipert_last_error(), "'x' added twice"), "%s", pipert_last_error());
    cr_expect_eq(pt_safetensors_writer_add(w, "__metadata__", PT_DTYPE_F32, x, 1, (int64_t[]){4}),
                 PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_safetensors_writer_add(w, "\xff", PT_DTYPE_F32, x, 1, (int64_t[]){4}),
                 PIPERT_ERR_INVALID_ARG, "non-UTF-8 name accepted");
    cr_expect_eq(pt_safetensors_writer_add(w, "y", PT_DTYPE_F32, x, 9,
                                           (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}),
                 PIPERT_ERR_INVALID_ARG, "9 dimensions accepted");
    cr_expect_eq(pt_safetensors_writer_add(w, "y", PT_DTYPE_F32, x, 1, (int64_t[]){-1}),
                 PIPERT_ERR_INVALID_ARG, "negative dimension accepted");
    cr_expect_eq(pt_safetensors_writer_add(w, "y", PT_DTYPE_COUNT, x, 1, (int64_t[]){4}),
                 PIPERT_ERR_INVALID_ARG, "invalid dtype accepted");
    cr_expect_eq(pt_safetensors_writer_add(w, "y", PT_DTYPE_F32, NULL, 1, (int64_t[]){4}),
                 PIPERT_ERR_INVALID_ARG, "missing data accepted");
    cr_expect_eq(pt_safetensors_writer_set_metadata(w, "k", "\xff"), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_safetensors_writer_set_metadata(w, "k", NULL), PIPERT_ERR_INVALID_ARG);
    pt_safetensors_writer_free(w);
}

static void expect_file_holds(const char *path, const char *expected, size_t expected_size)
{
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(path, &bytes, &size), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(size == expected_size && memcmp(bytes, expected, size) == 0,
              "%s changed after a failed write (%zu bytes, was %zu)", path, size, expected_size);
    free(bytes);
}

Test(safetensors, failed_write_leaves_previous_file_intact)
{
    const char *path = in_dir("keep.safetensors");
    uint64_t n;
    size_t size;
    write_valid(path, &n, &size);
    char *before;
    cr_assert_eq(pt_read_file(path, &before, &size), PIPERT_OK);

    /* A file-size limit makes the data write fail part-way (EFBIG instead of SIGXFSZ). */
    static float big[1 << 16];
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    cr_assert_eq(pt_safetensors_writer_add(w, "big", PT_DTYPE_F32, big, 1, (int64_t[]){1 << 16}),
                 PIPERT_OK);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit saved, limited;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    limited = saved;
    limited.rlim_cur = 16384;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &limited), 0);
    pipert_result rc = pt_safetensors_writer_write(w, path);
    setrlimit(RLIMIT_FSIZE, &saved);
    cr_expect_eq(rc, PIPERT_ERR_IO, "a write past the file-size limit gave %s (%s)",
                 pipert_result_str(rc), pipert_last_error());
    cr_expect(strstr(pipert_last_error(), path), "%s", pipert_last_error());
    expect_file_holds(path, before, size);
    cr_expect_eq(count_dir_entries(test_dir), 1, "a temporary file was left behind");

    /* The target is a directory: the rename fails. */
    const char *dir_path = in_dir("a_directory");
    cr_assert_eq(mkdir(dir_path, 0755), 0);
    cr_expect_eq(pt_safetensors_writer_write(w, dir_path), PIPERT_ERR_IO);
    cr_expect_eq(count_dir_entries(test_dir), 2, "a temporary file was left behind");

    /* A missing directory. */
    const char *missing = in_dir("no/such/dir/x.safetensors");
    cr_expect_eq(pt_safetensors_writer_write(w, missing), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "no/such/dir"), "%s", pipert_last_error());

    /* After all that, a normal write still works and replaces the file. */
    cr_expect_eq(pt_safetensors_writer_write(w, path), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(pt_safetensors_find(st, "big"));
    pt_safetensors_close(st);
    pt_safetensors_writer_free(w);
    free(before);
}
