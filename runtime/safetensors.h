/* Reading and writing safetensors files (https://github.com/huggingface/safetensors), the checkpoint
 * format PyTorch and the Hugging Face tools read.
 *
 * Layout: an 8-byte little-endian length N, N bytes of UTF-8 JSON (the header, possibly padded with
 * trailing spaces), then the data section. The header maps each tensor name to
 *     {"dtype": "F32", "shape": [768, 3072], "data_offsets": [begin, end]}
 * with offsets relative to the start of the data section, plus an optional "__metadata__" object
 * of string values. Tensor data is little-endian and row-major.
 *
 * A file is validated completely when it is opened: after pt_safetensors_open succeeds, every
 * entry's bytes lie inside the file, match its shape and dtype, and overlap no other tensor.
 */
#ifndef PT_SAFETENSORS_H
#define PT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/error.h"

#define PT_SAFETENSORS_MAX_DIMS 8
/* Headers longer than this are refused as corrupt (the reference implementation's limit). */
#define PT_SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)

typedef enum pt_dtype {
    PT_DTYPE_F32,
    PT_DTYPE_F16,
    PT_DTYPE_BF16,
    PT_DTYPE_F64,
    PT_DTYPE_I64,
    PT_DTYPE_I32,
    PT_DTYPE_I16,
    PT_DTYPE_I8,
    PT_DTYPE_U64,
    PT_DTYPE_U32,
    PT_DTYPE_U16,
    PT_DTYPE_U8,
    PT_DTYPE_BOOL,
    PT_DTYPE_COUNT
} pt_dtype;

/* Bytes per element (0 for an invalid dtype). */
size_t pt_dtype_size(pt_dtype dtype);
/* The safetensors name: "F32", "BF16", "BOOL", ... ("?" for an invalid dtype). */
const char *pt_dtype_name(pt_dtype dtype);
/* Looks a safetensors dtype name up; returns 0 if it is not one pipert knows. */
int pt_dtype_from_name(const char *name, pt_dtype *dtype);

typedef struct pt_tensor_entry {
    const char *name;
    pt_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[PT_SAFETENSORS_MAX_DIMS];
    size_t numel;  /* product of shape (1 for a scalar) */
    size_t offset; /* from the start of the data section */
    size_t nbytes; /* numel * pt_dtype_size(dtype) */
} pt_tensor_entry;

/* ---- reading ------------------------------------------------------------ */

/* An open, validated file, memory-mapped read-only: it must not be truncated while open (the
 * mapped pages would vanish). Safe to read from several threads at once. */
typedef struct pt_safetensors pt_safetensors;

/* Fails with PIPERT_ERR_IO if the file cannot be read and PIPERT_ERR_FORMAT, naming the file and
 * what is wrong with it, if it is not a valid safetensors file. */
pipert_result pt_safetensors_open(pt_safetensors **out, const char *path);
/* The same from bytes in memory (`name` names them in errors): they are used in place, not copied,
 * and must stay valid and unchanged until pt_safetensors_close. */
pipert_result pt_safetensors_open_memory(pt_safetensors **out, const char *name, const void *bytes,
                                         size_t size);
void pt_safetensors_close(pt_safetensors *st);

const char *pt_safetensors_path(const pt_safetensors *st);

/* The tensors, sorted by name (byte order): entry i for i in [0, count). Entries and their names
 * live as long as st. */
size_t pt_safetensors_count(const pt_safetensors *st);
const pt_tensor_entry *pt_safetensors_at(const pt_safetensors *st, size_t i);
/* NULL if the file holds no tensor of that name. */
const pt_tensor_entry *pt_safetensors_find(const pt_safetensors *st, const char *name);

/* A "__metadata__" value; NULL if absent. */
const char *pt_safetensors_metadata(const pt_safetensors *st, const char *key);

/* The tensor's raw little-endian bytes (t->nbytes of them). The pointer is NOT necessarily
 * aligned for t's dtype: copy out with memcpy. */
const void *pt_safetensors_data(const pt_safetensors *st, const pt_tensor_entry *t);

/* Copies tensor t into dst[0..numel) as fp32, converting F16, BF16 and F64. Fails with
 * PIPERT_ERR_FORMAT, naming the tensor, if t does not hold exactly numel elements or is not of a
 * floating-point dtype. */
pipert_result pt_safetensors_read_f32(const pt_safetensors *st, const pt_tensor_entry *t,
                                      float *dst, size_t numel);

/* Element conversions (exact: every F16 and BF16 value is a float). */
float pt_f16_to_f32(uint16_t bits);
float pt_bf16_to_f32(uint16_t bits);

/* ---- writing ------------------------------------------------------------ */

/* Collects tensors and metadata, then writes them as one file. Tensor data is referenced, not
 * copied: it must stay valid and unchanged until pt_safetensors_writer_write returns.
 *
 * The file lists "__metadata__" first, then the tensors in the order of their data: by element
 * size, largest first, then by name (byte order). So every tensor starts at a multiple of its
 * element size from the data section, which itself starts 8-byte aligned (the header is padded
 * with spaces), and a memory-mapped reader can use the data in place. */
typedef struct pt_safetensors_writer pt_safetensors_writer;

pipert_result pt_safetensors_writer_create(pt_safetensors_writer **out);
/* data holds prod(shape[0..ndim)) elements of dtype (it may be NULL if there are none). Names must
 * be unique and not "__metadata__"; 0 <= ndim <= PT_SAFETENSORS_MAX_DIMS. */
pipert_result pt_safetensors_writer_add(pt_safetensors_writer *w, const char *name, pt_dtype dtype,
                                        const void *data, int ndim, const int64_t *shape);
/* Sets (or replaces) a "__metadata__" entry; key and value are copied. */
pipert_result pt_safetensors_writer_set_metadata(pt_safetensors_writer *w, const char *key,
                                                 const char *value);
/* Writes the file atomically (a temporary beside it, renamed into place): on failure the previous
 * file at path, if any, is untouched and no temporary is left. The writer may be written again. */
pipert_result pt_safetensors_writer_write(const pt_safetensors_writer *w, const char *path);
/* The same bytes in memory (malloc'd into *bytes, *size of them), for pt_safetensors_open_memory
 * at the other end of a connection. */
pipert_result pt_safetensors_writer_serialize(const pt_safetensors_writer *w, void **bytes,
                                              size_t *size);
void pt_safetensors_writer_free(pt_safetensors_writer *w);

/* The same bytes as pieces in file order, without assembling them: piece[0] is the 8-byte
 * header length and the header (owned by the pieces), then each non-empty tensor's data where
 * the writer references it (so it must stay valid and unchanged until the pieces are used). */
typedef struct pt_safetensors_piece {
    const void *data;
    size_t nbytes;
} pt_safetensors_piece;

typedef struct pt_safetensors_pieces {
    pt_safetensors_piece *piece; /* [count] */
    size_t count;
    size_t total; /* the file's size: the sum of the pieces' nbytes */
    unsigned char *head; /* piece[0]'s bytes */
} pt_safetensors_pieces;

pipert_result pt_safetensors_writer_pieces(const pt_safetensors_writer *w,
                                           pt_safetensors_pieces *out);
void pt_safetensors_pieces_free(pt_safetensors_pieces *p);

#endif
