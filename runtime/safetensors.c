#include "runtime/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/memory.h"

/* Tensor data is little-endian in the file and is used in place (memcpy, no byte swaps). */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pipert's safetensors support assumes a little-endian host"
#endif

#define HEADER_LENGTH_BYTES 8
#define METADATA_KEY "__metadata__"
/* No real tensor has a dimension this long (2^48 elements); larger ones are taken as corruption. */
#define MAX_DIMENSION ((int64_t)1 << 48)

/* ---- dtypes ------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[PT_DTYPE_COUNT] = {
    [PT_DTYPE_F32] = {"F32", 4},  [PT_DTYPE_F16] = {"F16", 2},   [PT_DTYPE_BF16] = {"BF16", 2},
    [PT_DTYPE_F64] = {"F64", 8},  [PT_DTYPE_I64] = {"I64", 8},   [PT_DTYPE_I32] = {"I32", 4},
    [PT_DTYPE_I16] = {"I16", 2},  [PT_DTYPE_I8] = {"I8", 1},     [PT_DTYPE_U64] = {"U64", 8},
    [PT_DTYPE_U32] = {"U32", 4},  [PT_DTYPE_U16] = {"U16", 2},   [PT_DTYPE_U8] = {"U8", 1},
    [PT_DTYPE_BOOL] = {"BOOL", 1},
};

size_t pt_dtype_size(pt_dtype dtype)
{
    return (unsigned)dtype < PT_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

const char *pt_dtype_name(pt_dtype dtype)
{
    return (unsigned)dtype < PT_DTYPE_COUNT ? dtype_info[dtype].name : "?";
}

int pt_dtype_from_name(const char *name, pt_dtype *dtype)
{
    for (int d = 0; d < PT_DTYPE_COUNT; d++) {
        if (strcmp(name, dtype_info[d].name) == 0) {
            *dtype = (pt_dtype)d;
            return 1;
        }
    }
    return 0;
}

static float float_from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. */
float pt_f16_to_f32(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13)); /* inf, NaN */
    if (exponent != 0) return float_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
    /* zero or subnormal: mantissa * 2^-24, exact in fp32 */
    float magnitude = (float)mantissa * 0x1p-24f;
    return sign ? -magnitude : magnitude;
}

/* bfloat16 is the upper half of an fp32. */
float pt_bf16_to_f32(uint16_t bits) { return float_from_bits((uint32_t)bits << 16); }

/* ---- reading ------------------------------------------------------------ */

struct pt_safetensors {
    char *path;
    const unsigned char *map; /* the whole file, map_size bytes */
    size_t map_size;
    const unsigned char *data; /* the data section, data_size bytes */
    size_t data_size;
    bool mapped;               /* map is ours to munmap (else the caller's bytes) */
    json_t *header;            /* owns the strings that entry names point to */
    json_t *metadata;          /* borrowed from header; NULL if the file has none */
    pt_tensor_entry *entries;  /* [count], sorted by name */
    size_t count;
};

static pipert_result map_file(pt_safetensors *st)
{
    int fd = open(st->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pt_fail(PIPERT_ERR_IO, "%s: cannot open: %s", st->path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return pt_fail(PIPERT_ERR_IO, "%s: not a regular file", st->path);
    }
    size_t size = (size_t)info.st_size;
    if (size < HEADER_LENGTH_BYTES) {
        close(fd);
        return pt_fail(PIPERT_ERR_FORMAT, "%s: file is shorter than 8 bytes (%zu bytes): not safetensors",
                       st->path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED)
        return pt_fail(PIPERT_ERR_IO, "%s: cannot map %zu bytes: %s", st->path, size, strerror(saved));
    st->map = map;
    st->map_size = size;
    st->mapped = true;
    return PIPERT_OK;
}

static pipert_result parse_metadata(const pt_safetensors *st, json_t *metadata)
{
    if (!json_is_object(metadata))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: \"%s\" is not an object", st->path, METADATA_KEY);
    const char *key;
    json_t *value;
    json_object_foreach(metadata, key, value) {
        if (!json_is_string(value))
            return pt_fail(PIPERT_ERR_FORMAT, "%s: \"%s\" value of '%s' is not a string", st->path,
                           METADATA_KEY, key);
    }
    return PIPERT_OK;
}

/* Fills t->ndim, shape, numel and nbytes (t->dtype is set). */
static pipert_result parse_shape(const char *path, pt_tensor_entry *t, json_t *shape)
{
    if (!json_is_array(shape))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array of integers",
                       path, t->name);
    if (json_array_size(shape) > PT_SAFETENSORS_MAX_DIMS)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)", path,
                       t->name, json_array_size(shape), PT_SAFETENSORS_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    t->numel = 1;
    int overflow = 0;
    for (int d = 0; d < t->ndim; d++) {
        json_t *dim = json_array_get(shape, (size_t)d);
        if (!json_is_integer(dim))
            return pt_fail(PIPERT_ERR_FORMAT,
                           "%s: tensor '%s': \"shape\" is not an array of integers", path, t->name);
        json_int_t n = json_integer_value(dim);
        if (n < 0)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': negative dimension %lld", path,
                           t->name, (long long)n);
        if (n > MAX_DIMENSION)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': dimension %lld is too large", path,
                           t->name, (long long)n);
        t->shape[d] = n;
        overflow |= !pt_mul_size(t->numel, (size_t)n, &t->numel);
    }
    if (overflow || !pt_mul_size(t->numel, pt_dtype_size(t->dtype), &t->nbytes))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': size of its shape in %s overflows", path,
                       t->name, pt_dtype_name(t->dtype));
    return PIPERT_OK;
}

/* Fills t->offset after checking the range against t->nbytes and the data section. */
static pipert_result parse_offsets(const char *path, pt_tensor_entry *t, json_t *offsets,
                                   size_t data_size)
{
    json_t *first = json_array_get(offsets, 0), *second = json_array_get(offsets, 1);
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_is_integer(first) ||
        !json_is_integer(second))
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: tensor '%s': \"data_offsets\" is not an array of two integers", path,
                       t->name);
    long long begin = json_integer_value(first), end = json_integer_value(second);
    if (begin < 0 || end < begin)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] are not 0 <= begin <= end", path,
                       t->name, begin, end);
    if ((unsigned long long)end > data_size)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] run beyond the data section "
                       "(%zu bytes)", path, t->name, begin, end, data_size);
    if ((size_t)(end - begin) != t->nbytes)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but its shape and "
                       "dtype %s need %zu", path, t->name, begin, end, end - begin,
                       pt_dtype_name(t->dtype), t->nbytes);
    t->offset = (size_t)begin;
    return PIPERT_OK;
}

static pipert_result parse_entry(const pt_safetensors *st, const char *name, json_t *value,
                                 pt_tensor_entry *t)
{
    t->name = name;
    if (!json_is_object(value))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s' is not an object", st->path, name);
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t k = 0; k < sizeof required / sizeof required[0]; k++) {
        if (!json_object_get(value, required[k]))
            return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': missing \"%s\"", st->path, name,
                           required[k]);
    }
    json_t *dtype = json_object_get(value, "dtype");
    if (!json_is_string(dtype))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", st->path,
                       name);
    if (!pt_dtype_from_name(json_string_value(dtype), &t->dtype))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%s\"", st->path, name,
                       json_string_value(dtype));
    PT_TRY(parse_shape(st->path, t, json_object_get(value, "shape")));
    return parse_offsets(st->path, t, json_object_get(value, "data_offsets"), st->data_size);
}

static int compare_entry_names(const void *a, const void *b)
{
    return strcmp(((const pt_tensor_entry *)a)->name, ((const pt_tensor_entry *)b)->name);
}

static int compare_entry_offsets(const void *a, const void *b)
{
    const pt_tensor_entry *x = *(const pt_tensor_entry *const *)a;
    const pt_tensor_entry *y = *(const pt_tensor_entry *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static pipert_result parse_header(pt_safetensors *st)
{
    uint64_t length = 0;
    for (int i = 0; i < HEADER_LENGTH_BYTES; i++) length |= (uint64_t)st->map[i] << (8 * i);
    if (length > PT_SAFETENSORS_MAX_HEADER)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", st->path,
                       (unsigned long long)length);
    if (length > st->map_size - HEADER_LENGTH_BYTES)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)", st->path,
                       (unsigned long long)length, st->map_size);
    st->data = st->map + HEADER_LENGTH_BYTES + length;
    st->data_size = st->map_size - HEADER_LENGTH_BYTES - (size_t)length;

    json_error_t error;
    st->header = json_loadb((const char *)st->map + HEADER_LENGTH_BYTES, (size_t)length,
                            JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &error);
    if (!st->header)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: header is not valid JSON: %s (at header byte %d)",
                       st->path, error.text, error.position);
    if (!json_is_object(st->header))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: header is not a JSON object", st->path);

    st->metadata = json_object_get(st->header, METADATA_KEY);
    if (st->metadata) PT_TRY(parse_metadata(st, st->metadata));
    size_t count = json_object_size(st->header) - (st->metadata ? 1 : 0);
    st->entries = calloc(count ? count : 1, sizeof *st->entries);
    if (!st->entries)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %zu tensor entries", st->path, count);
    const char *name;
    json_t *value;
    json_object_foreach(st->header, name, value) {
        if (strcmp(name, METADATA_KEY) == 0) continue;
        PT_TRY(parse_entry(st, name, value, &st->entries[st->count]));
        st->count++;
    }
    qsort(st->entries, st->count, sizeof *st->entries, compare_entry_names);
    return PIPERT_OK;
}

/* Tensors may not share bytes. Bytes that belong to no tensor are allowed (the reference
 * implementation refuses them; other writers leave gaps), but reported at debug level. */
static pipert_result check_no_overlap(const pt_safetensors *st)
{
    const pt_tensor_entry **by_offset = malloc((st->count ? st->count : 1) * sizeof *by_offset);
    if (!by_offset) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate an index", st->path);
    size_t n = 0;
    for (size_t i = 0; i < st->count; i++) {
        if (st->entries[i].nbytes > 0) by_offset[n++] = &st->entries[i]; /* empty ones hold nothing */
    }
    qsort(by_offset, n, sizeof *by_offset, compare_entry_offsets);
    pipert_result rc = PIPERT_OK;
    size_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->nbytes) {
            rc = pt_fail(PIPERT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                         st->path, by_offset[i - 1]->name, by_offset[i]->name);
            break;
        }
        covered += by_offset[i]->nbytes;
    }
    free(by_offset);
    if (rc == PIPERT_OK && covered < st->data_size)
        pt_debug("%s: %zu of the %zu data bytes belong to no tensor", st->path,
                 st->data_size - covered, st->data_size);
    return rc;
}

static pipert_result new_reader(pt_safetensors **out, const char *path)
{
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->path = strdup(path))) {
        free(*out);
        *out = NULL;
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    }
    return PIPERT_OK;
}

/* Parses and checks st's bytes; frees st on failure. */
static pipert_result validate(pt_safetensors **out, pt_safetensors *st)
{
    pipert_result rc = parse_header(st);
    if (rc == PIPERT_OK) rc = check_no_overlap(st);
    if (rc != PIPERT_OK) {
        pt_safetensors_close(st);
        return rc;
    }
    *out = st;
    return PIPERT_OK;
}

pipert_result pt_safetensors_open(pt_safetensors **out, const char *path)
{
    pt_safetensors *st;
    PT_TRY(new_reader(&st, path));
    pipert_result rc = map_file(st);
    if (rc != PIPERT_OK) {
        pt_safetensors_close(st);
        return rc;
    }
    return validate(out, st);
}

pipert_result pt_safetensors_open_memory(pt_safetensors **out, const char *name, const void *bytes,
                                         size_t size)
{
    *out = NULL;
    if (size < HEADER_LENGTH_BYTES)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: shorter than 8 bytes (%zu bytes): not safetensors",
                       name, size);
    pt_safetensors *st;
    PT_TRY(new_reader(&st, name));
    st->map = bytes;
    st->map_size = size;
    return validate(out, st);
}

void pt_safetensors_close(pt_safetensors *st)
{
    if (!st) return;
    if (st->mapped) munmap((void *)st->map, st->map_size);
    json_decref(st->header);
    free(st->entries);
    free(st->path);
    free(st);
}

const char *pt_safetensors_path(const pt_safetensors *st) { return st->path; }

size_t pt_safetensors_count(const pt_safetensors *st) { return st->count; }

const pt_tensor_entry *pt_safetensors_at(const pt_safetensors *st, size_t i)
{
    return i < st->count ? &st->entries[i] : NULL;
}

const pt_tensor_entry *pt_safetensors_find(const pt_safetensors *st, const char *name)
{
    pt_tensor_entry key = {.name = name};
    return bsearch(&key, st->entries, st->count, sizeof *st->entries, compare_entry_names);
}

const char *pt_safetensors_metadata(const pt_safetensors *st, const char *key)
{
    return st->metadata ? json_string_value(json_object_get(st->metadata, key)) : NULL;
}

const void *pt_safetensors_data(const pt_safetensors *st, const pt_tensor_entry *t)
{
    return st->data + t->offset;
}

pipert_result pt_safetensors_read_f32(const pt_safetensors *st, const pt_tensor_entry *t,
                                      float *dst, size_t numel)
{
    if (t->numel != numel)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s' has %zu elements, expected %zu", st->path,
                       t->name, t->numel, numel);
    const unsigned char *src = pt_safetensors_data(st, t);
    switch (t->dtype) {
    case PT_DTYPE_F32:
        if (numel) memcpy(dst, src, t->nbytes);
        return PIPERT_OK;
    case PT_DTYPE_F16:
    case PT_DTYPE_BF16: {
        float (*convert)(uint16_t) = t->dtype == PT_DTYPE_F16 ? pt_f16_to_f32 : pt_bf16_to_f32;
        for (size_t i = 0; i < numel; i++) {
            uint16_t bits;
            memcpy(&bits, src + 2 * i, sizeof bits);
            dst[i] = convert(bits);
        }
        return PIPERT_OK;
    }
    case PT_DTYPE_F64:
        for (size_t i = 0; i < numel; i++) {
            double value;
            memcpy(&value, src + 8 * i, sizeof value);
            dst[i] = (float)value;
        }
        return PIPERT_OK;
    default:
        return pt_fail(PIPERT_ERR_FORMAT, "%s: tensor '%s' is %s, not a floating-point dtype",
                       st->path, t->name, pt_dtype_name(t->dtype));
    }
}

/* ---- writing ------------------------------------------------------------ */

typedef struct writer_tensor {
    char *name;
    pt_dtype dtype;
    const void *data; /* [nbytes], owned by the caller */
    int ndim;
    int64_t shape[PT_SAFETENSORS_MAX_DIMS];
    size_t nbytes;
} writer_tensor;

struct pt_safetensors_writer {
    writer_tensor *tensors; /* [count] in the order added */
    size_t count, capacity;
    json_t *metadata; /* object of strings */
};

pipert_result pt_safetensors_writer_create(pt_safetensors_writer **out)
{
    *out = NULL;
    pt_safetensors_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->metadata = json_object())) {
        free(w);
        return pt_fail(PIPERT_ERR_NOMEM, "safetensors writer: out of memory");
    }
    *out = w;
    return PIPERT_OK;
}

void pt_safetensors_writer_free(pt_safetensors_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->count; i++) free(w->tensors[i].name);
    free(w->tensors);
    json_decref(w->metadata);
    free(w);
}

/* jansson refuses strings that are not UTF-8; the header must be UTF-8. */
static int is_utf8(const char *s)
{
    json_t *probe = json_string(s);
    json_decref(probe);
    return probe != NULL;
}

static pipert_result check_new_tensor(const pt_safetensors_writer *w, const char *name,
                                      pt_dtype dtype, int ndim, const int64_t *shape)
{
    if (!name || !is_utf8(name) || strcmp(name, METADATA_KEY) == 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor name '%s' is not allowed",
                       name ? name : "(null)");
    for (size_t i = 0; i < w->count; i++) {
        if (strcmp(w->tensors[i].name, name) == 0)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor '%s' added twice",
                           name);
    }
    if (pt_dtype_size(dtype) == 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor '%s': invalid dtype %d",
                       name, (int)dtype);
    if (ndim < 0 || ndim > PT_SAFETENSORS_MAX_DIMS || (ndim > 0 && !shape))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor '%s': ndim %d is not in "
                       "[0, %d]", name, ndim, PT_SAFETENSORS_MAX_DIMS);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || shape[d] > MAX_DIMENSION)
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "safetensors writer: tensor '%s': dimension %lld is out of range", name,
                           (long long)shape[d]);
    }
    return PIPERT_OK;
}

pipert_result pt_safetensors_writer_add(pt_safetensors_writer *w, const char *name, pt_dtype dtype,
                                        const void *data, int ndim, const int64_t *shape)
{
    PT_TRY(check_new_tensor(w, name, dtype, ndim, shape));
    writer_tensor t = {.dtype = dtype, .data = data, .ndim = ndim};
    size_t numel = 1;
    int fits = 1;
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        fits &= pt_mul_size(numel, (size_t)shape[d], &numel);
    }
    if (!fits || !pt_mul_size(numel, pt_dtype_size(dtype), &t.nbytes))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor '%s': size overflows",
                       name);
    if (t.nbytes > 0 && !data)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: tensor '%s' has no data", name);
    if (w->count == w->capacity) {
        size_t capacity = w->capacity ? 2 * w->capacity : 16;
        writer_tensor *grown = realloc(w->tensors, capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "safetensors writer: out of memory");
        w->tensors = grown;
        w->capacity = capacity;
    }
    if (!(t.name = strdup(name))) return pt_fail(PIPERT_ERR_NOMEM, "safetensors writer: out of memory");
    w->tensors[w->count++] = t;
    return PIPERT_OK;
}

pipert_result pt_safetensors_writer_set_metadata(pt_safetensors_writer *w, const char *key,
                                                 const char *value)
{
    if (!key || !value || strcmp(key, "") == 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "safetensors writer: metadata needs a key and a value");
    json_t *string = json_string(value);
    if (!string)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "safetensors writer: metadata value of '%s' is not UTF-8", key);
    if (json_object_set_new(w->metadata, key, string) != 0) /* steals string, even on failure */
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "safetensors writer: metadata key '%s' is not UTF-8", key);
    return PIPERT_OK;
}

/* Data order: larger elements first (so each tensor is aligned to its element size), then name. */
static int compare_layout(const void *a, const void *b)
{
    const writer_tensor *x = *(const writer_tensor *const *)a;
    const writer_tensor *y = *(const writer_tensor *const *)b;
    size_t x_size = pt_dtype_size(x->dtype), y_size = pt_dtype_size(y->dtype);
    if (x_size != y_size) return x_size > y_size ? -1 : 1;
    return strcmp(x->name, y->name);
}

static json_t *tensor_header(const writer_tensor *t, size_t offset)
{
    json_t *shape = json_array();
    for (int d = 0; shape && d < t->ndim; d++) {
        if (json_array_append_new(shape, json_integer(t->shape[d])) != 0) {
            json_decref(shape);
            return NULL;
        }
    }
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", pt_dtype_name(t->dtype), "shape", shape,
                     "data_offsets", (json_int_t)offset, (json_int_t)(offset + t->nbytes));
}

/* The header text, padded with spaces so that the data section starts 8-byte aligned; the
 * tensors in data order go to layout[count]. Caller frees the result. */
static char *build_header(const pt_safetensors_writer *w, const writer_tensor **layout,
                          size_t *length)
{
    for (size_t i = 0; i < w->count; i++) layout[i] = &w->tensors[i];
    qsort(layout, w->count, sizeof *layout, compare_layout);

    json_t *header = json_object();
    int failed = !header;
    if (!failed && json_object_size(w->metadata) > 0)
        failed = json_object_set(header, METADATA_KEY, w->metadata) != 0;
    size_t offset = 0;
    for (size_t i = 0; i < w->count && !failed; i++) {
        failed = json_object_set_new(header, layout[i]->name, tensor_header(layout[i], offset)) != 0;
        offset += layout[i]->nbytes;
    }
    char *text = failed ? NULL : json_dumps(header, JSON_COMPACT);
    json_decref(header);
    if (!text) return NULL;

    size_t used = strlen(text), padded = (used + 7) / 8 * 8;
    char *grown = realloc(text, padded + 1);
    if (!grown) {
        free(text);
        return NULL;
    }
    memset(grown + used, ' ', padded - used);
    grown[padded] = '\0';
    *length = padded;
    return grown;
}

pipert_result pt_safetensors_writer_pieces(const pt_safetensors_writer *w,
                                           pt_safetensors_pieces *out)
{
    *out = (pt_safetensors_pieces){0};
    const writer_tensor **layout = malloc((w->count ? w->count : 1) * sizeof *layout);
    size_t header_length = 0;
    char *header = layout ? build_header(w, layout, &header_length) : NULL;
    unsigned char *head = header ? malloc(HEADER_LENGTH_BYTES + header_length) : NULL;
    out->piece = head ? malloc((w->count + 1) * sizeof *out->piece) : NULL;
    if (!out->piece) {
        free(head);
        free(header);
        free(layout);
        return pt_fail(PIPERT_ERR_NOMEM, "safetensors: cannot build the header");
    }
    for (int i = 0; i < HEADER_LENGTH_BYTES; i++)
        head[i] = (unsigned char)((uint64_t)header_length >> (8 * i));
    memcpy(head + HEADER_LENGTH_BYTES, header, header_length);
    out->head = head;
    out->piece[out->count++] = (pt_safetensors_piece){head, HEADER_LENGTH_BYTES + header_length};
    out->total = HEADER_LENGTH_BYTES + header_length;
    for (size_t i = 0; i < w->count; i++) {
        if (!layout[i]->nbytes) continue;
        out->piece[out->count++] = (pt_safetensors_piece){layout[i]->data, layout[i]->nbytes};
        out->total += layout[i]->nbytes;
    }
    free(header);
    free(layout);
    return PIPERT_OK;
}

void pt_safetensors_pieces_free(pt_safetensors_pieces *p)
{
    free(p->head);
    free(p->piece);
    *p = (pt_safetensors_pieces){0};
}

static int write_all(FILE *stream, const void *data, size_t size)
{
    return size == 0 || fwrite(data, 1, size, stream) == size;
}

pipert_result pt_safetensors_writer_serialize(const pt_safetensors_writer *w, void **bytes,
                                              size_t *size)
{
    *bytes = NULL;
    *size = 0;
    pt_safetensors_pieces pieces;
    PT_TRY(pt_safetensors_writer_pieces(w, &pieces));
    unsigned char *out;
    pipert_result rc = pt_alloc((void **)&out, pieces.total, "safetensors: the serialized file");
    for (size_t i = 0, at = 0; rc == PIPERT_OK && i < pieces.count; i++) {
        memcpy(out + at, pieces.piece[i].data, pieces.piece[i].nbytes);
        at += pieces.piece[i].nbytes;
    }
    if (rc == PIPERT_OK) {
        *bytes = out;
        *size = pieces.total;
    }
    pt_safetensors_pieces_free(&pieces);
    return rc;
}

pipert_result pt_safetensors_writer_write(const pt_safetensors_writer *w, const char *path)
{
    pt_safetensors_pieces pieces;
    if (pt_safetensors_writer_pieces(w, &pieces) != PIPERT_OK)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot build the safetensors header", path);
    pt_atomic_file file;
    pipert_result rc = pt_atomic_open(&file, path);
    int ok = 1;
    for (size_t i = 0; rc == PIPERT_OK && ok && i < pieces.count; i++)
        ok = write_all(file.stream, pieces.piece[i].data, pieces.piece[i].nbytes);
    if (rc == PIPERT_OK && !ok) {
        rc = pt_write_error(path, "fwrite", errno);
        pt_atomic_abort(&file);
    } else if (rc == PIPERT_OK) rc = pt_atomic_commit(&file);
    pt_safetensors_pieces_free(&pieces);
    return rc;
}
