/* What the CUDA kernels keep, as pure arithmetic: in every build, with or
 * without the backend, for estimates of a stage's device memory. */
#include "kernels/cuda/cuda.h"

/* Flash-style attention (attention.cu) saves each row's log-sum-exp and a
 * copy of the output: B·NH·T + B·T·C floats, not the B·NH·T·T probabilities. */
size_t pt_cuda_attention_saved_floats(int B, int T, int C, int NH)
{
    return (size_t)B * NH * T + (size_t)B * T * C;
}
