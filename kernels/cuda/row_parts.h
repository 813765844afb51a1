/* How a kernel reads a row 16 bytes a load when the row need not start on a 16-byte boundary
 * (crossentropy.cu: GPT-2's vocabulary V = 50257 is odd, so most rows of logits start off
 * one): elements [0, head) singly up to the first boundary, then `vectors` loads of 16 bytes,
 * then [tail_start, V) singly. Plain C as well as CUDA, so that test_kernels checks on the host
 * that the three parts cover the row once, whatever its address and length. */
#ifndef PT_KERNELS_CUDA_ROW_PARTS_H
#define PT_KERNELS_CUDA_ROW_PARTS_H

#include <stdint.h>

#ifdef __CUDACC__
#define PT_ROW_PARTS_FN __host__ __device__ inline
#else
#define PT_ROW_PARTS_FN static inline
#endif

typedef struct pt_row_parts {
    int head;       /* elements before the first 16-byte boundary (or all V) */
    int vectors;    /* then this many 16-byte loads of 16 / element_size elements */
    int tail_start; /* and the elements from here to V singly */
} pt_row_parts;

/* A row of V elements of element_size bytes (2 or 4, dividing 16) at `address`, itself a
 * multiple of element_size. */
PT_ROW_PARTS_FN pt_row_parts pt_row_parts_of(uintptr_t address, int V, int element_size)
{
    const int misaligned = (int)(address % 16), width = 16 / element_size;
    int head = misaligned ? (16 - misaligned) / element_size : 0;
    if (head > V) head = V;
    const int vectors = (V - head) / width;
    pt_row_parts parts = {head, vectors, head + vectors * width};
    return parts;
}

#endif
