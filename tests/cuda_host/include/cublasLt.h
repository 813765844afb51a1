/* The emulated device (tests/cuda_host) has no cuBLASLt: the handle's type only. */
#ifndef PT_TESTS_CUDA_HOST_CUBLASLT_H
#define PT_TESTS_CUDA_HOST_CUBLASLT_H

#include "cublas_v2.h"

typedef struct cublasLtContext *cublasLtHandle_t;

#endif
