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
 * A bias is added by cuBLASLt's epilogue to the fp32 sums before they are stored
 * (gemm_lt.cu); where it declines, the bias is written into out first and the
 * GEMM adds onto it (β = 1), as on the CPU, or (a bf16 out) the fp32 product goes
 * to the caller's scratch and a kernel adds the bias and rounds. The backward
 * through the GELU is the same: cuBLASLt's DGELU epilogue, or the product into
 * scratch and the GELU's gradient kernel; and the bias gradient: summed from dout
 * by the weight gradient's product as it reads it (BGRADA/BGRADB), or by the
 * column sums' kernel. fp32 GEMMs compute in exact fp32
 * (CUBLAS_COMPUTE_32F) unless TF32 is allowed (PIPERT_CUDA_TF32=1,
 * pt_cuda_set_tf32).
 */
#include "kernels/cuda/reduce.cuh"

/* D[rows_d, cols_d] (row-major, rows D.ld apart, of D.type: fp32, or bf16 rounded from the
 * fp32 sums) = α·op(A)·op(B) + β·D, with inner dimension k; A and B of the element type `type`
 * (fp32 or bf16). */
static void gemm_row_major_to(pt_gemm_result D, int rows_d, int cols_d, int k, pt_gemm_operand A,
                              cublasOperation_t op_a, pt_gemm_operand B, cublasOperation_t op_b,
                              cudaDataType type, float beta)
{
    if (rows_d <= 0 || cols_d <= 0) return;
    const float alpha = 1.0f;
    cublasComputeType_t compute =
        type == CUDA_R_32F && pt_cuda.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    PT_CUBLAS_CHECK(cublasGemmEx(pt_cuda.cublas, op_b, op_a, cols_d, rows_d, k, &alpha, B.data,
                                 type, B.ld, A.data, type, A.ld, &beta, D.data, D.type, D.ld,
                                 compute, CUBLAS_GEMM_DEFAULT));
}

/* The same into a dense fp32 D. */
static void gemm_row_major(float *D, int rows_d, int cols_d, int k, pt_gemm_operand A,
                           cublasOperation_t op_a, pt_gemm_operand B, cublasOperation_t op_b,
                           cudaDataType type, float beta)
{
    gemm_row_major_to({D, CUDA_R_32F, cols_d}, rows_d, cols_d, k, A, op_a, B, op_b, type, beta);
}

__global__ void bias_rows_kernel(float *out, const float *bias, int OC, size_t n)
{
    /* out[N, OC] = bias[OC] broadcast over rows; n = N·OC */
    PT_GRID_STRIDE_LOOP(i, n) out[i] = bias[i % OC];
}

/* The product's operands for out[N,OC] = inp[N,C]·W: W [C, OC] (in-out) or [OC, C] read
 * transposed (out-in). */
struct forward_operands {
    pt_gemm_operand inp, weight;
    cublasOperation_t weight_op;
};
static forward_operands forward_of(const void *inp, const void *weight, int C, int OC,
                                   pt_weight_layout layout)
{
    if (layout == PT_WEIGHT_IN_OUT) return {{inp, C}, {weight, OC}, CUBLAS_OP_N};
    return {{inp, C}, {weight, C}, CUBLAS_OP_T};
}

/* out[N,OC] (rows out.ld apart) = inp[N,C]·W + bias through cuBLASLt's bias epilogue; false
 * where it declines (nothing done). */
static bool forward_with_bias_lt(pt_gemm_result out, const void *inp, const void *weight,
                                 const float *bias, int N, int C, int OC,
                                 pt_weight_layout layout, cudaDataType type)
{
    const forward_operands f = forward_of(inp, weight, C, OC, layout);
    return pt_cuda_gemm_lt(out, N, OC, C, f.inp, CUBLAS_OP_N, f.weight, f.weight_op,
                           type, {PT_GEMM_BIAS, bias, NULL, NULL});
}

/* The forward of either element type: out[N,OC] = inp[N,C]·W (+ bias). */
static void matmul_forward_typed(float *out, const void *inp, const void *weight,
                                 const float *bias, int N, int C, int OC, pt_weight_layout layout,
                                 cudaDataType type)
{
    if (bias && forward_with_bias_lt({out, CUDA_R_32F, OC}, inp, weight, bias, N, C, OC, layout,
                                     type))
        return;
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        PT_LAUNCH_ELEMENTWISE(bias_rows_kernel, n, out, bias, OC, n);
        beta = 1.0f;
    }
    const forward_operands f = forward_of(inp, weight, C, OC, layout);
    gemm_row_major(out, N, OC, C, f.inp, CUBLAS_OP_N, f.weight, f.weight_op, type, beta);
}

/* dW (+)= the weight's product (β = 1) with dbias += dout's column sums taken by cuBLASLt's
 * bias-gradient epilogue as it reads dout (rows ld_dout apart; into scratch, then added: the
 * epilogue writes); false where it declines (nothing done). */
static bool weight_and_bias_gradients_lt(float *dweight, float *dbias, const void *dout,
                                         int ld_dout, const void *inp, int N, int C, int OC,
                                         bool in_out, cudaDataType type)
{
    if (!pt_cuda_scratch_fits((size_t)OC * sizeof(float))) return false;
    const size_t mark = pt_cuda_scratch_mark();
    float *sums = (float *)pt_cuda_scratch((size_t)OC * sizeof(float), "the bias gradient");
    const bool made =
        in_out /* dW[C,OC] += inpᵀ·dout: dout is B, its columns' sums */
            ? pt_cuda_gemm_lt({dweight, CUDA_R_32F, OC}, C, OC, N, {inp, C}, CUBLAS_OP_T,
                              {dout, ld_dout}, CUBLAS_OP_N, type,
                              {PT_GEMM_BIAS_GRADIENT_B, NULL, NULL, sums}, 1.0f)
            /* dW[OC,C] += doutᵀ·inp: dout is A, op(A)'s rows' sums */
            : pt_cuda_gemm_lt({dweight, CUDA_R_32F, C}, OC, C, N, {dout, ld_dout}, CUBLAS_OP_T,
                              {inp, C}, CUBLAS_OP_N, type,
                              {PT_GEMM_BIAS_GRADIENT_A, NULL, NULL, sums}, 1.0f);
    if (made) pt_cuda_residual_forward(dbias, dbias, sums, (size_t)OC);
    pt_cuda_scratch_release(mark);
    return made;
}

/* The backward of either element type; dout's rows ld_dout apart, value reads dout[n, o] for
 * the bias. dinp_beta 1 adds into dinp (the table's rule for gradients), 0 writes it. */
template <class Value>
static void matmul_backward_typed(float *dinp, float *dweight, float *dbias, const void *dout,
                                  int ld_dout, const void *inp, const void *weight, int N, int C,
                                  int OC, pt_weight_layout layout, cudaDataType type,
                                  Value dout_value, float dinp_beta = 1.0f)
{
    const bool in_out = layout == PT_WEIGHT_IN_OUT;
    const pt_gemm_operand dY = {dout, ld_dout};
    if (dinp) { /* dinp[N,C] (+)= dout·Wᵀ (in-out) or dout·W (out-in) */
        if (in_out)
            gemm_row_major(dinp, N, C, OC, dY, CUBLAS_OP_N, {weight, OC}, CUBLAS_OP_T, type,
                           dinp_beta);
        else
            gemm_row_major(dinp, N, C, OC, dY, CUBLAS_OP_N, {weight, C}, CUBLAS_OP_N, type,
                           dinp_beta);
    }
    if (dweight && dbias &&
        weight_and_bias_gradients_lt(dweight, dbias, dout, ld_dout, inp, N, C, OC, in_out, type))
        return;
    if (dweight && in_out) /* dW[C,OC] += inpᵀ·dout */
        gemm_row_major(dweight, C, OC, N, {inp, C}, CUBLAS_OP_T, dY, CUBLAS_OP_N, type, 1.0f);
    else if (dweight) /* dW[OC,C] += doutᵀ·inp */
        gemm_row_major(dweight, OC, C, N, dY, CUBLAS_OP_T, {inp, C}, CUBLAS_OP_N, type, 1.0f);
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
    matmul_backward_typed(dinp, dweight, dbias, dout, OC, inp, weight, N, C, OC, layout,
                          CUDA_R_32F, pt_rows_f32{dout, OC});
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
    matmul_backward_typed(dinp, dweight, dbias, dout, OC, inp, weight, N, C, OC, layout,
                          CUDA_R_16BF, pt_rows_bf16{(const __nv_bfloat16 *)dout, OC});
}

void pt_cuda_matmul_backward_bf16_dinp_written(float *dinp, float *dweight, float *dbias,
                                               const pt_bf16 *dout, const pt_bf16 *inp,
                                               const pt_bf16 *weight, int N, int C, int OC,
                                               int ld_dout, pt_weight_layout layout)
{
    matmul_backward_typed(dinp, dweight, dbias, dout, ld_dout, inp, weight, N, C, OC, layout,
                          CUDA_R_16BF, pt_rows_bf16{(const __nv_bfloat16 *)dout, ld_dout}, 0.0f);
}

void pt_cuda_matmul_forward_bf16_to_bf16(pt_bf16 *out, float *scratch, const pt_bf16 *inp,
                                         const pt_bf16 *weight, const float *bias, int N, int C,
                                         int OC, int ld_out, pt_weight_layout layout)
{
    /* out[N,OC] bf16 (rows ld_out apart) = inp·W + bias rounded once from the fp32 sums:
     * cuBLASLt's epilogue; without a bias, cuBLAS with a bf16 C and D; else the fp32 product in
     * scratch, then a kernel adds the bias and rounds */
    const pt_gemm_result D = {out, CUDA_R_16BF, ld_out};
    if (bias && forward_with_bias_lt(D, inp, weight, bias, N, C, OC, layout, CUDA_R_16BF))
        return;
    const forward_operands f = forward_of(inp, weight, C, OC, layout);
    if (!bias) {
        gemm_row_major_to(D, N, OC, C, f.inp, CUBLAS_OP_N, f.weight, f.weight_op, CUDA_R_16BF,
                          0.0f);
        return;
    }
    gemm_row_major(scratch, N, OC, C, f.inp, CUBLAS_OP_N, f.weight, f.weight_op, CUDA_R_16BF,
                   0.0f);
    pt_cuda_add_bias_to_bf16(out, scratch, bias, N, OC, ld_out);
}

void pt_cuda_matmul_gelu_backward_bf16(pt_bf16 *dpre, float *scratch, float *dweight,
                                       float *dbias, const pt_bf16 *dout, const pt_bf16 *inp,
                                       const pt_bf16 *pre, const pt_bf16 *weight, int N, int C,
                                       int OC, pt_weight_layout layout)
{
    /* dpre[N,C] = bf16(gelu'(pre)·dout·Wᵀ): cuBLASLt's DGELU epilogue on the dinp product, or
     * that product into scratch and the GELU's gradient kernel; then dweight and dbias as
     * matmul_backward_bf16's (dinp NULL: not made again) */
    const bool in_out = layout == PT_WEIGHT_IN_OUT;
    const pt_gemm_operand W = {weight, in_out ? OC : C};
    const cublasOperation_t w_op = in_out ? CUBLAS_OP_T : CUBLAS_OP_N;
    const pt_gemm_epilogue gelu_gradient = {PT_GEMM_GELU_GRADIENT, NULL,
                                            (const __nv_bfloat16 *)pre, NULL};
    if (!pt_cuda_gemm_lt({dpre, CUDA_R_16BF, C}, N, C, OC, {dout, OC}, CUBLAS_OP_N, W, w_op,
                         CUDA_R_16BF, gelu_gradient)) {
        gemm_row_major(scratch, N, C, OC, {dout, OC}, CUBLAS_OP_N, W, w_op, CUDA_R_16BF, 0.0f);
        pt_cuda_gelu_backward_to_bf16(dpre, pre, scratch, (size_t)N * C);
    }
    matmul_backward_typed(NULL, dweight, dbias, dout, OC, inp, weight, N, C, OC, layout,
                          CUDA_R_16BF, pt_rows_bf16{(const __nv_bfloat16 *)dout, OC});
}
