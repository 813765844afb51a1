#include "runtime/data.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/fileio.h"


/* ---- little-endian fields ------------------------------------------------ */

static uint32_t load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- token shards -------------------------------------------------------- */

/* Validates a shard's header against its size; *count is the token count. */
static pipert_result shard_check_header(const char *path, const unsigned char *bytes, size_t size,
                                        size_t *count)
{
    *count = 0;
    if (size < PT_SHARD_HEADER_BYTES)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: %zu bytes is shorter than the %d-byte token shard header", path, size,
                       PT_SHARD_HEADER_BYTES);
    uint32_t magic = load_le32(bytes);
    if (magic != PT_SHARD_MAGIC)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: wrong magic number %u (0x%08x); a token shard starts with %d", path,
                       magic, magic, PT_SHARD_MAGIC);
    uint32_t version = load_le32(bytes + 4);
    if (version != PT_SHARD_VERSION)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: unsupported token shard version %u (only version %d, uint16 tokens, "
                       "is supported)",
                       path, version, PT_SHARD_VERSION);
    uint32_t declared = load_le32(bytes + 8);
    if (declared > INT32_MAX)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: negative token count %d in the shard header", path,
                       (int)(int32_t)declared);
    size_t expected = PT_SHARD_HEADER_BYTES + 2 * (size_t)declared;
    if (size != expected)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: file is %zu bytes but its header declares %u tokens, which take %zu "
                       "bytes",
                       path, size, declared, expected);
    *count = declared;
    return PIPERT_OK;
}

/* tokens [count] from the little-endian uint16 payload after the header. */
static void shard_decode_tokens(const unsigned char *bytes, size_t count, uint16_t *tokens)
{
    const unsigned char *payload = bytes + PT_SHARD_HEADER_BYTES;
    for (size_t i = 0; i < count; i++)
        tokens[i] = (uint16_t)(payload[2 * i] | payload[2 * i + 1] << 8);
}

pipert_result pt_shard_parse(const char *name, const void *bytes, size_t size, uint16_t **tokens,
                             size_t *count)
{
    *tokens = NULL;
    *count = 0;
    size_t n;
    PT_TRY(shard_check_header(name, bytes, size, &n));
    uint16_t *out = malloc(n ? n * sizeof *out : 1);
    if (!out) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %zu tokens", name, n);
    shard_decode_tokens(bytes, n, out);
    *tokens = out;
    *count = n;
    return PIPERT_OK;
}

pipert_result pt_shard_read(const char *path, uint16_t **tokens, size_t *count)
{
    *tokens = NULL;
    *count = 0;
    char *bytes;
    size_t size;
    PT_TRY(pt_read_file(path, &bytes, &size));
    pipert_result rc = pt_shard_parse(path, bytes, size, tokens, count);
    free(bytes);
    return rc;
}

pipert_result pt_shard_write(const char *path, const uint16_t *tokens, size_t count)
{
    if (count > INT32_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "%s: %zu tokens do not fit in one shard (at most %d)", path, count,
                       INT32_MAX);
    unsigned char header[PT_SHARD_HEADER_BYTES] = {0};
    store_le32(header, PT_SHARD_MAGIC);
    store_le32(header + 4, PT_SHARD_VERSION);
    store_le32(header + 8, (uint32_t)count);

    pt_atomic_file file;
    PT_TRY(pt_atomic_open(&file, path));
    int failed = fwrite(header, 1, sizeof header, file.stream) != sizeof header;
    /* Tokens are encoded little-endian in chunks, whatever the host's order. */
    unsigned char chunk[8192];
    const size_t per_chunk = sizeof chunk / 2;
    for (size_t start = 0; start < count && !failed; start += per_chunk) {
        size_t n = count - start < per_chunk ? count - start : per_chunk;
        for (size_t i = 0; i < n; i++) {
            chunk[2 * i] = (unsigned char)tokens[start + i];
            chunk[2 * i + 1] = (unsigned char)(tokens[start + i] >> 8);
        }
        failed = fwrite(chunk, 1, 2 * n, file.stream) != 2 * n;
    }
    if (failed) {
        pt_atomic_abort(&file);
        return pt_fail(PIPERT_ERR_IO, "%s: short write", path);
    }
    return pt_atomic_commit(&file);
}

/* ---- a growing token stream ---------------------------------------------- */

typedef struct token_buffer {
    uint16_t *data; /* [capacity], the first `length` in use */
    size_t length, capacity;
} token_buffer;

static pipert_result token_buffer_reserve(token_buffer *buf, size_t extra, const char *path)
{
    if (buf->capacity - buf->length >= extra) return PIPERT_OK;
    size_t wanted = buf->length + extra;
    size_t capacity = buf->capacity * 2 > wanted ? buf->capacity * 2 : wanted;
    uint16_t *grown = realloc(buf->data, (capacity ? capacity : 1) * sizeof *grown);
    if (!grown)
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %zu tokens", path, capacity);
    buf->data = grown;
    buf->capacity = capacity;
    return PIPERT_OK;
}

/* Appends text byte by byte, a line that is exactly "%" becoming "\n". The
 * result is never longer than the text (the caller reserves `size`). */
static void append_text_tokens(token_buffer *buf, const unsigned char *text, size_t size)
{
    size_t line_start = 0;
    while (line_start < size) {
        const unsigned char *newline = memchr(text + line_start, '\n', size - line_start);
        size_t line_end = newline ? (size_t)(newline - text) + 1 : size; /* past the '\n' */
        size_t content = line_end - line_start - (newline ? 1 : 0);
        if (content == 1 && text[line_start] == '%') {
            buf->data[buf->length++] = '\n';
        } else {
            for (size_t i = line_start; i < line_end; i++) buf->data[buf->length++] = text[i];
        }
        line_start = line_end;
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static pt_data_format detect_format(const char *path, const unsigned char *bytes, size_t size)
{
    if (size >= 4 && load_le32(bytes) == PT_SHARD_MAGIC) return PT_DATA_TOKENS;
    return ends_with(path, ".bin") ? PT_DATA_TOKENS : PT_DATA_TEXT;
}

/* Appends the tokens of one file's bytes; *used says which format they were read as. */
static pipert_result append_bytes(token_buffer *buf, const char *path, const unsigned char *bytes,
                                  size_t size, pt_data_format format, pt_data_format *used)
{
    *used = format == PT_DATA_AUTO ? detect_format(path, bytes, size) : format;
    if (*used == PT_DATA_TOKENS) {
        size_t count;
        PT_TRY(shard_check_header(path, bytes, size, &count));
        PT_TRY(token_buffer_reserve(buf, count, path));
        /* An empty shard before any tokens: buf->data is still NULL, and NULL + 0 is undefined. */
        if (count > 0) shard_decode_tokens(bytes, count, buf->data + buf->length);
        buf->length += count;
        return PIPERT_OK;
    }
    PT_TRY(token_buffer_reserve(buf, size, path));
    append_text_tokens(buf, bytes, size);
    return PIPERT_OK;
}

static pipert_result append_file(token_buffer *buf, const char *path, pt_data_format format,
                                 pt_data_format *used)
{
    char *data;
    size_t size;
    PT_TRY(pt_read_file(path, &data, &size));
    pipert_result rc = append_bytes(buf, path, (const unsigned char *)data, size, format, used);
    free(data);
    return rc;
}

/* ---- directories --------------------------------------------------------- */

typedef struct path_list {
    char **paths; /* [count], malloc'd, sorted */
    size_t count, capacity;
} path_list;

static void path_list_free(path_list *list)
{
    for (size_t i = 0; i < list->count; i++) free(list->paths[i]);
    free(list->paths);
    memset(list, 0, sizeof *list);
}

static pipert_result path_list_add(path_list *list, const char *dir, const char *name)
{
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? 2 * list->capacity : 64;
        char **grown = realloc(list->paths, capacity * sizeof *grown);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory listing files", dir);
        list->paths = grown;
        list->capacity = capacity;
    }
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory listing files", dir);
    snprintf(path, n, "%s/%s", dir, name);
    list->paths[list->count++] = path;
    return PIPERT_OK;
}

static int compare_paths(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The corpus files of a directory: regular files (links followed) directly in
 * it, not named *.dat or *.u8, sorted byte-wise (the same order in every
 * locale; all share the directory prefix, so this is name order). */
static pipert_result list_corpus_files(const char *dir, path_list *list)
{
    memset(list, 0, sizeof *list);
    DIR *stream = opendir(dir);
    if (!stream) return pt_fail(PIPERT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    pipert_result rc = PIPERT_OK;
    struct dirent *entry;
    while (rc == PIPERT_OK && (entry = readdir(stream)) != NULL) {
        const char *name = entry->d_name;
        if (ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
        rc = path_list_add(list, dir, name);
        if (rc != PIPERT_OK) break;
        struct stat st;
        if (stat(list->paths[list->count - 1], &st) != 0 || !S_ISREG(st.st_mode))
            free(list->paths[--list->count]); /* ".", "..", subdirectories, dangling links */
    }
    closedir(stream);
    if (rc != PIPERT_OK) {
        path_list_free(list);
        return rc;
    }
    if (list->count == 0)
        return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: no data files in this directory", dir);
    qsort(list->paths, list->count, sizeof *list->paths, compare_paths);
    return PIPERT_OK;
}

/* ---- dataset ------------------------------------------------------------- */

/* Loads a file or every corpus file of a directory into buf and writes a
 * short description of what was read into source [source_size]. */
static pipert_result load_tokens(token_buffer *buf, const char *root, int is_default,
                                 pt_data_format format, char *source, size_t source_size)
{
    struct stat st;
    if (stat(root, &st) != 0) {
        if (is_default)
            return pt_fail(PIPERT_ERR_NOT_FOUND,
                           "%s: the default training corpus is missing; install the `fortunes` "
                           "package (apt-get install fortunes) or set data.path",
                           root);
        return pt_fail(PIPERT_ERR_IO, "%s: %s", root, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        pt_data_format used;
        PT_TRY(append_file(buf, root, format, &used));
        snprintf(source, source_size, "%s (%s)", root, used == PT_DATA_TOKENS ? "tokens" : "text");
        return PIPERT_OK;
    }
    path_list files;
    PT_TRY(list_corpus_files(root, &files));
    size_t n_text = 0, n_shards = 0;
    pipert_result rc = PIPERT_OK;
    for (size_t i = 0; i < files.count && rc == PIPERT_OK; i++) {
        pt_data_format used = PT_DATA_TEXT; /* if the file cannot be read */
        rc = append_file(buf, files.paths[i], format, &used);
        n_shards += used == PT_DATA_TOKENS;
        n_text += used != PT_DATA_TOKENS;
    }
    const char *kind = n_shards == 0 ? "text" : n_text == 0 ? "tokens" : "text and tokens";
    snprintf(source, source_size, "%s%s (%zu files, %s)", is_default ? "fortunes: " : "", root,
             files.count, kind);
    path_list_free(&files);
    return rc;
}

/* Checks the format and fraction; leaves ds empty. */
static pipert_result begin_load(pt_dataset *ds, pt_data_format format, double val_fraction)
{
    memset(ds, 0, sizeof *ds);
    ds->max_token = -1;
    if ((unsigned)format >= PT_DATA_FORMATS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "data.format: no format has the value %d",
                       (int)format);
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "data.val_fraction %g: expected 0 <= value < 1",
                       val_fraction);
    return PIPERT_OK;
}

/* Gives ds the tokens of buf (rc: how reading them went) split for validation. */
static pipert_result finish_load(pt_dataset *ds, token_buffer *buf, pipert_result rc,
                                 const char *root, double val_fraction)
{
    if (rc == PIPERT_OK && buf->length == 0)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: holds no tokens", root);
    if (rc != PIPERT_OK) {
        free(buf->data);
        memset(ds, 0, sizeof *ds);
        ds->max_token = -1;
        return rc;
    }
    ds->tokens = buf->data;
    ds->n_tokens = buf->length;
    for (size_t i = 0; i < buf->length; i++)
        if (buf->data[i] > ds->max_token) ds->max_token = buf->data[i];
    size_t n_val = (size_t)llround(val_fraction * (double)buf->length);
    ds->n_train = buf->length - n_val;
    return PIPERT_OK;
}

pipert_result pt_dataset_load(pt_dataset *ds, const char *path, pt_data_format format,
                              double val_fraction)
{
    PT_TRY(begin_load(ds, format, val_fraction));
    int is_default = !path || !*path;
    const char *root = is_default ? PT_FORTUNES_DIR : path;
    token_buffer buf = {0};
    pipert_result rc = load_tokens(&buf, root, is_default, format, ds->source, sizeof ds->source);
    return finish_load(ds, &buf, rc, root, val_fraction);
}

pipert_result pt_dataset_load_memory(pt_dataset *ds, const char *name, const void *bytes,
                                     size_t size, pt_data_format format, double val_fraction)
{
    pt_data_format used = PT_DATA_TEXT;
    PT_TRY(begin_load(ds, format, val_fraction));
    token_buffer buf = {0};
    pipert_result rc = append_bytes(&buf, name, bytes, size, format, &used);
    snprintf(ds->source, sizeof ds->source, "%s (%s)", name,
             used == PT_DATA_TOKENS ? "tokens" : "text");
    return finish_load(ds, &buf, rc, name, val_fraction);
}

void pt_dataset_free(pt_dataset *ds)
{
    free(ds->tokens);
    memset(ds, 0, sizeof *ds);
    ds->max_token = -1;
}

pipert_result pt_dataset_check(const pt_dataset *ds, int T, int vocab_size)
{
    if (T < 1)
        return pt_fail(PIPERT_ERR_CONFIG, "%s: model.block_size %d: must be at least 1",
                       ds->source, T);
    size_t n_val = ds->n_tokens - ds->n_train;
    if (ds->n_train < (size_t)T + 1)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: the train split has %zu tokens, fewer than model.block_size + 1 = %d",
                       ds->source, ds->n_train, T + 1);
    if (n_val > 0 && n_val < (size_t)T + 1)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: the validation split has %zu tokens, fewer than model.block_size + 1 "
                       "= %d (raise data.val_fraction, or set it to 0 for no validation)",
                       ds->source, n_val, T + 1);
    if (ds->max_token >= vocab_size)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%s: holds token id %d, not below model.vocab_size %d", ds->source,
                       ds->max_token, vocab_size);
    return PIPERT_OK;
}

/* ---- batches ------------------------------------------------------------- */

/* Lemire, "Fast random integer generation in an interval" (2019): the high
 * word of x·bound is uniform in [0, bound) once the draws whose low word falls
 * below 2^64 mod bound are rejected. */

/* inputs [T], targets [T] from the sequence tok[start, start + T]. */
static void copy_sequence(const uint16_t *tok, size_t start, int T, int32_t *inputs,
                          int32_t *targets)
{
    for (int t = 0; t < T; t++) {
        inputs[t] = tok[start + t];
        targets[t] = tok[start + t + 1];
    }
}

static size_t sequence_offset(const pt_dataset *ds, pt_philox_key key, long step, long sequence,
                              int T)
{
    uint64_t starts = ds->n_train - (size_t)T; /* offsets 0 .. n_train − T − 1 */
    if (ds->sampling == PT_SAMPLING_SEQUENTIAL) {
        uint64_t q = (uint64_t)step * (uint64_t)ds->sequences_per_step + (uint64_t)sequence;
        return (size_t)((unsigned __int128)q * (uint64_t)T % starts);
    }
    /* (step, sequence) as the two halves of the counter */
    return (size_t)pt_rng_below(key, (uint64_t)step << 32 | (uint32_t)sequence, starts);
}

void pt_dataset_train_batch(const pt_dataset *ds, uint64_t seed, long step, long first, int B,
                            int T, int32_t *inputs, int32_t *targets)
{
    pt_philox_key key = pt_rng_key(seed, PT_DATA_STREAM);
    for (int b = 0; b < B; b++) {
        size_t offset = sequence_offset(ds, key, step, first + b, T);
        copy_sequence(ds->tokens, offset, T, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
}

void pt_dataset_val_batch(const pt_dataset *ds, int k, int n, int B, int T, int32_t *inputs,
                          int32_t *targets)
{
    uint64_t span = ds->n_tokens - ds->n_train - (size_t)T; /* start positions available */
    uint64_t sequences = (uint64_t)n * (uint64_t)B;
    for (int b = 0; b < B; b++) {
        uint64_t j = (uint64_t)k * (uint64_t)B + (uint64_t)b;
        size_t start = ds->n_train + (size_t)((unsigned __int128)j * span / sequences);
        copy_sequence(ds->tokens, start, T, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
}
