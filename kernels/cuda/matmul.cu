/* Fully connected layers through cuBLAS, in fp32 (the table) and with bf16
 * operands (cuda.h), both accumulating in fp32.
 *
 * Naive reading (W as [C, OC], "in-out"; for "out-in" read W[o][c] for W[c][o]):
 *   forward:  out[n][o] = bias[o] + Σ_c inp[n][c]·W[c][o]
 *   backward: dinp[n][c] += Σ_o dout[n][o]·W[c][o]
 *             dW[c][o]   += Σ_n inp[n][c]·dout[n][o]
 *             dbias[o]   += Σ_n dout[n][o]
 *
 * Row-major buffers in a column-major library. cuBLAS reads a row-major
 * [rows, cols] buffer as its column-major transpose, [cols, rows] with leading
 * dimension cols. So the row-major product D = op(A)·op(B) is computed as the
 * column-major product Dᵀ = op(B)ᵀ·op(A)ᵀ: call cuBLAS with the operands
 * swapped (B's buffer first), the same op letters, m = cols(D), n = rows(D).
 *
 * The bias is written into out first and the GEMM adds onto it (β = 1), as
 * on the CPU. fp32 GEMMs compute in exact fp32 (CUBLAS_COMPUTE_32F) unless
 * TF32 is allowed (PIPERT_CUDA_TF32=1, pt_cuda_set_tf32).
 */
#include "kernels/cuda/reduce.cuh"

/* One operand or result of a GEMM, as its row-major buffer. */
struct gemm_operand {
    const void *data;
    int ld; /* row length of the row-major buffer */
};

/* D[rows_d, cols_d] (row-major, of d_type: fp32, or bf16 rounded from the fp32 sums) =
 * α·op(A)·op(B) + β·D, with inner dimension k; A and B of the element type `type` (fp32 or
 * bf16). */
static void gemm_row_major_to(void *D, cudaDataType d_type, int rows_d, int cols_d, int k,
                              gemm_operand A, cublasOperation_t op_a, gemm_operand B,
                              cublasOperation_t op_b, cudaDataType type, float beta)
{
    if (rows_d <= 0 || cols_d <= 0) return;
    const float alpha = 1.0f;
    cublasComputeType_t compute =
        type == CUDA_R_32F && pt_cuda.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    PT_CUBLAS_CHECK(cublasGemmEx(pt_cuda.cublas, op_b, op_a, cols_d, rows_d, k, &alpha, B.data,
                                 type, B.ld, A.data, type, A.ld, &beta, D, d_type, cols_d,
                                 compute, CUBLAS_GEMM_DEFAULT));
}

/* The same into an fp32 D. */
static void gemm_row_major(float *D, int rows_d, int cols_d, int k, gemm_operand A,
                           cublasOperation_t op_a, gemm_operand B, cublasOperation_t op_b,
                           cudaDataType type, float beta)
{
    gemm_row_major_to(D, CUDA_R_32F, rows_d, cols_d, k, A, op_a, B, op_b, type, beta);
}

__global__ void bias_rows_kernel(float *out, const float *bias, int OC, size_t n)
{
    /* out[N, OC] = bias[OC] broadcast over rows; n = N·OC */
    PT_GRID_STRIDE_LOOP(i, n) out[i] = bias[i % OC];
}

/* The forward of either element type: out[N,OC] = inp[N,C]·W (+ bias). */
static void matmul_forward_typed(float *out, const void *inp, const void *weight,
                                 const float *bias, int N, int C, int OC, pt_weight_layout layout,
                                 cudaDataType type)
{
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        PT_LAUNCH_ELEMENTWISE(bias_rows_kernel, n, out, bias, OC, n);
        beta = 1.0f;
    }
    if (layout == PT_WEIGHT_IN_OUT) /* out = inp·W,  W [C, OC] */
        gemm_row_major(out, N, OC, C, {inp, C}, CUBLAS_OP_N, {weight, OC}, CUBLAS_OP_N, type, beta);
    else /* out = inp·Wᵀ,  W [OC, C] */
        gemm_row_major(out, N, OC, C, {inp, C}, CUBLAS_OP_N, {weight, C}, CUBLAS_OP_T, type, beta);
}

/* The backward of either element type; value reads dout[n, o] for the bias. dinp_beta 1
 * adds into dinp (the table's rule for gradients), 0 writes it. */
template <class Value>
static void matmul_backward_typed(float *dinp, float *dweight, float *dbias, const void *dout,
                                  const void *inp, const void *weight, int N, int C, int OC,
                                  pt_weight_layout layout, cudaDataType type, Value dout_value,
                                  float dinp_beta = 1.0f)
{
    const bool in_out = layout == PT_WEIGHT_IN_OUT;
    if (dinp) { /* dinp[N,C] (+)= dout·Wᵀ (in-out) or dout·W (out-in) */
        if (in_out)
            gemm_row_major(dinp, N, C, OC, {dout, OC}, CUBLAS_OP_N, {weight, OC}, CUBLAS_OP_T,
                           type, dinp_beta);
        else
            gemm_row_major(dinp, N, C, OC, {dout, OC}, CUBLAS_OP_N, {weight, C}, CUBLAS_OP_N,
                           type, dinp_beta);
    }
    if (dweight && in_out) /* dW[C,OC] += inpᵀ·dout */
        gemm_row_major(dweight, C, OC, N, {inp, C}, CUBLAS_OP_T, {dout, OC}, CUBLAS_OP_N, type,
                       1.0f);
    else if (dweight) /* dW[OC,C] += doutᵀ·inp */
        gemm_row_major(dweight, OC, C, N, {dout, OC}, CUBLAS_OP_T, {inp, C}, CUBLAS_OP_N, type,
                       1.0f);
    if (dbias) pt_column_sums_add(dbias, dout_value, N, OC);
}

void pt_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC, pt_weight_layout layout)
{
    /* out[N,OC], inp[N,C], weight[C,OC] (in-out) or [OC,C] (out-in), bias[OC] or NULL */
    matmul_forward_typed(out, inp, weight, bias, N, C, OC, layout, CUDA_R_32F);
}

void pt_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC,
                             pt_weight_layout layout)
{
    /* dinp[N,C] or NULL, dweight like weight or NULL, dbias[OC] or NULL, dout[N,OC], inp[N,C] */
    matmul_backward_typed(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout, CUDA_R_32F,
                          pt_rows_f32{dout, OC});
}

extern "C" void pt_cuda_matmul_forward_bf16(float *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                            const float *bias, int N, int C, int OC,
                                            pt_weight_layout layout)
{
    matmul_forward_typed(out, inp, weight, bias, N, C, OC, layout, CUDA_R_16BF);
}

extern "C" void pt_cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias,
                                             const pt_bf16 *dout, const pt_bf16 *inp,
                                             const pt_bf16 *weight, int N, int C, int OC,
                                             pt_weight_layout layout)
{
    matmul_backward_typed(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout, CUDA_R_16BF,
                          pt_rows_bf16{(const __nv_bfloat16 *)dout, OC});
}

void pt_cuda_matmul_backward_bf16_dinp_written(float *dinp, float *dweight, float *dbias,
                                               const pt_bf16 *dout, const pt_bf16 *inp,
                                               const pt_bf16 *weight, int N, int C, int OC,
                                               pt_weight_layout layout)
{
    matmul_backward_typed(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout, CUDA_R_16BF,
                          pt_rows_bf16{(const __nv_bfloat16 *)dout, OC}, 0.0f);
}

void pt_cuda_matmul_forward_bf16_to_bf16(pt_bf16 *out, const pt_bf16 *inp, const pt_bf16 *weight,
                                         int N, int C, int OC, pt_weight_layout layout)
{
    /* out[N,OC] bf16 = inp·W rounded once from the fp32 sums (cuBLAS: bf16 C and D, 32F compute) */
    if (layout == PT_WEIGHT_IN_OUT)
        gemm_row_major_to(out, CUDA_R_16BF, N, OC, C, {inp, C}, CUBLAS_OP_N, {weight, OC},
                          CUBLAS_OP_N, CUDA_R_16BF, 0.0f);
    else
        gemm_row_major_to(out, CUDA_R_16BF, N, OC, C, {inp, C}, CUBLAS_OP_N, {weight, C},
                          CUBLAS_OP_T, CUDA_R_16BF, 0.0f);
}
