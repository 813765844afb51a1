/* The emulated device (tests/cuda_host) has no cuBLAS: the types kernels/cuda's
 * shared header names, so that the kernel files compile; nothing to call. */
#ifndef PT_TESTS_CUDA_HOST_CUBLAS_H
#define PT_TESTS_CUDA_HOST_CUBLAS_H

#include "cuda_runtime.h"

typedef struct cublasContext *cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };

#endif
