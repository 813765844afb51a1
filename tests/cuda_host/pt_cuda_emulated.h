/* The emulated CUDA backend's table, for the tests (tests/cuda_host/backend.cpp). */
#ifndef PT_TESTS_CUDA_EMULATED_H
#define PT_TESTS_CUDA_EMULATED_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU's table with kernels/cuda's own kernels in place of its (NULL: no memory). */
const pt_kernels *pt_kernels_cuda_emulated(void);

/* PIPERT_OK, or the first error a kernel or launch recorded (with its message). */
pipert_result pt_cuda_emulated_status(void);

/* Kernels launched so far in this process. */
long pt_cuda_emulated_launches(void);

/* pt_cuda_set_mma_attention, _set_gemm_attention, _set_lt, _set_tf32 and pt_cuda_lt_products,
 * on the emulated device */
void pt_cuda_emulated_set_mma_attention(int enabled);
void pt_cuda_emulated_set_gemm_attention(int enabled);
void pt_cuda_emulated_set_lt(int enabled);
void pt_cuda_emulated_set_tf32(int enabled);
long pt_cuda_emulated_lt_products(void);
long pt_cuda_emulated_lt_heuristic_queries(void);

#ifdef __cplusplus
}
#endif

#endif
