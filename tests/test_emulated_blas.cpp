/* The emulated device's cuBLAS and cuBLASLt (tests/cuda_host/blas.cpp) against the
 * definitions their documentation gives, computed here in double from the operands' places
 * (column-major, X[r + c·ld]): the products, the epilogues, C unread at β = 0, and the
 * refusals the emulation claims to share with the libraries. The kernel tests
 * (cuda-emulated) trust it to stand for cuBLAS; this is what that trust rests on. */
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"

namespace {

/* Deterministic values in [-1, 1), exact in bf16 (8 significant bits): both types hold them. */
std::vector<float> values(size_t n, unsigned seed)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (float)((int)((seed >> 16) % 256) - 128) / 128.0f;
    }
    return v;
}

std::vector<__nv_bfloat16> as_bf16(const std::vector<float> &v)
{
    std::vector<__nv_bfloat16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
    return out;
}

/* op(X)[i][p] of a column-major X with leading dimension ld */
double at(const std::vector<float> &x, int ld, cublasOperation_t op, int i, int p)
{
    return op == CUBLAS_OP_N ? x[(size_t)i + (size_t)p * ld] : x[(size_t)p + (size_t)i * ld];
}

double gelu_gradient(double x)
{
    const double s = std::sqrt(2.0 / M_PI), c = 0.044715, t = std::tanh(s * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
}

cublasHandle_t handle()
{
    static cublasHandle_t h;
    if (!h) cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    return h;
}

} // namespace

/* Every op pair, fp32 and bf16 operands, leading dimensions past the rows: α·op(A)·op(B) + β·C
 * to fp32's rounding, and the rows' padding of C left as it was. */
Test(emulated_blas, gemm_ex_is_the_documented_product)
{
    const int m = 7, n = 5, k = 9, pad = 3;
    const float alpha = 1.5f, beta = 0.5f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                const auto op_a = (cublasOperation_t)ta, op_b = (cublasOperation_t)tb;
                const int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
                const auto A = values((size_t)lda * (ta ? m : k), 1);
                const auto B = values((size_t)ldb * (tb ? k : n), 2);
                const auto C0 = values((size_t)ldc * n, 3);
                std::vector<float> C = C0;
                const auto A16 = as_bf16(A), B16 = as_bf16(B);
                const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
                const void *a = bf16 ? (const void *)A16.data() : A.data();
                const void *b = bf16 ? (const void *)B16.data() : B.data();
                cr_assert_eq(cublasGemmEx(handle(), op_a, op_b, m, n, k, &alpha, a, type, lda, b,
                                          type, ldb, &beta, C.data(), CUDA_R_32F, ldc,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             CUBLAS_STATUS_SUCCESS);
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < ldc; i++) {
                        const size_t e = (size_t)i + (size_t)j * ldc;
                        if (i >= m) {
                            cr_expect_eq(C[e], C0[e], "padding [%d][%d] written", i, j);
                            continue;
                        }
                        double want = beta * C0[e];
                        for (int p = 0; p < k; p++)
                            want += alpha * at(A, lda, op_a, i, p) * at(B, ldb, op_b, p, j);
                        cr_expect(std::fabs(C[e] - want) <= 1e-5 * (1 + std::fabs(want)),
                                  "op %d%d bf16 %d [%d][%d]: %g, want %g", ta, tb, bf16, i, j,
                                  C[e], want);
                    }
            }
}

/* β = 0: C is not read (a scratch C full of NaN stays out), and a bf16 D is the nearest bf16
 * of the fp32 sum. */
Test(emulated_blas, beta_zero_never_reads_c)
{
    const int m = 4, n = 3, k = 5;
    const float alpha = 1.0f, beta = 0.0f;
    const auto A = values((size_t)m * k, 4), B = values((size_t)k * n, 5);
    std::vector<__nv_bfloat16> D(m * n, __float2bfloat16_rn(NAN));
    const auto A16 = as_bf16(A), B16 = as_bf16(B);
    cr_assert_eq(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A16.data(),
                              CUDA_R_16BF, m, B16.data(), CUDA_R_16BF, k, &beta, D.data(),
                              CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float sum = 0;
            for (int p = 0; p < k; p++) sum += A[i + p * m] * B[p + j * k];
            const float got = __bfloat162float(D[i + j * m]);
            cr_expect_eq(got, __bfloat162float(__float2bfloat16_rn(sum)), "[%d][%d]: %g of %g",
                         i, j, got, sum);
        }
}

/* What cuBLAS refuses: a leading dimension shorter than the rows it holds, mixed operand
 * types; nothing is written then. */
Test(emulated_blas, gemm_ex_refuses_as_cublas)
{
    const float one = 1.0f;
    std::vector<float> A(64, 1.0f), B(64, 1.0f), C(64, 7.0f);
    std::vector<__nv_bfloat16> B16(64);
    cr_expect_eq(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A.data(),
                              CUDA_R_32F, 3, B.data(), CUDA_R_32F, 4, &one, C.data(), CUDA_R_32F,
                              4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "lda 3 < m 4");
    cr_expect_eq(cublasGemmEx(handle(), CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 6, &one, A.data(),
                              CUDA_R_32F, 4, B.data(), CUDA_R_32F, 6, &one, C.data(), CUDA_R_32F,
                              4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "op T: lda 4 < k 6");
    cr_expect_eq(cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A.data(),
                              CUDA_R_32F, 4, B16.data(), CUDA_R_16BF, 4, &one, C.data(),
                              CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A with a bf16 B");
    for (float c : C) cr_expect_eq(c, 7.0f, "C written by a refused call");
}

namespace {

/* One cuBLASLt product's descriptors, made and destroyed together. */
struct lt_problem {
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    lt_problem(int m, int n, int k, cudaDataType d_type, int ldd)
    {
        cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, m, k, m), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatrixLayoutCreate(&d, d_type, m, n, ldd), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
        const uint32_t unaligned = 2;
        for (int w = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
             w <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; w++)
            cr_assert_eq(cublasLtMatmulPreferenceSetAttribute(
                             pref, (cublasLtMatmulPreferenceAttributes_t)w, &unaligned,
                             sizeof unaligned),
                         CUBLAS_STATUS_SUCCESS);
    }
    ~lt_problem()
    {
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(d), cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(a), cublasLtMatmulDescDestroy(desc), cublasLtDestroy(lt);
    }
    template <class T> cublasStatus_t set(cublasLtMatmulDescAttributes_t what, T value)
    {
        return cublasLtMatmulDescSetAttribute(desc, what, &value, sizeof value);
    }
    cublasStatus_t run(const void *A, const void *B, void *D)
    {
        cublasLtMatmulHeuristicResult_t chosen = {};
        int found = 0;
        const cublasStatus_t asked =
            cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, 1, &chosen, &found);
        if (asked != CUBLAS_STATUS_SUCCESS) return asked;
        const float one = 1.0f, zero = 0.0f;
        return cublasLtMatmul(lt, desc, &one, A, a, B, b, &zero, D, d, D, d, &chosen.algo,
                              nullptr, 0, nullptr);
    }
};

} // namespace

/* Each epilogue kernels/cuda uses, on a bf16 product (A m×k, B k×n, plain): BIAS adds bias[i],
 * DGELU multiplies by gelu'(aux[i + j·ld]), BGRADA writes Σ_p A[i][p], BGRADB Σ_p B[p][j]. */
Test(emulated_blas, lt_epilogues_are_the_documented_ones)
{
    const int m = 8, n = 3, k = 6;
    const auto A = values((size_t)m * k, 6), B = values((size_t)k * n, 7);
    const auto A16 = as_bf16(A), B16 = as_bf16(B);
    const auto bias = values(m, 8), aux = values((size_t)m * n, 9);
    const auto aux16 = as_bf16(aux);
    auto product = [&](int i, int j) {
        double s = 0;
        for (int p = 0; p < k; p++) s += (double)A[i + p * m] * B[p + j * k];
        return s;
    };
    for (uint32_t epilogue : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_DGELU,
                              CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
        lt_problem lt(m, n, k, CUDA_R_32F, m);
        std::vector<float> D((size_t)m * n, NAN), sums(m > n ? m : n, NAN);
        cr_assert_eq(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue), CUBLAS_STATUS_SUCCESS);
        if (epilogue == CUBLASLT_EPILOGUE_BIAS) {
            lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void *)bias.data());
            lt.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)CUDA_R_32F);
        } else if (epilogue == CUBLASLT_EPILOGUE_DGELU) {
            lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (const void *)aux16.data());
            lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)m);
            lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, (int32_t)CUDA_R_16BF);
        } else {
            lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void *)sums.data());
        }
        if (epilogue == CUBLASLT_EPILOGUE_DGELU) { /* aux of D's type: a bf16 D */
            std::vector<__nv_bfloat16> D16((size_t)m * n);
            cublasLtMatrixLayoutDestroy(lt.d);
            cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_16BF, m, n, m);
            cr_assert_eq(lt.run(A16.data(), B16.data(), D16.data()), CUBLAS_STATUS_SUCCESS);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    const double want = product(i, j) * gelu_gradient(aux[i + j * m]);
                    const double got = __bfloat162float(D16[i + j * m]);
                    cr_expect(std::fabs(got - want) <= std::ldexp(std::fabs(want), -8) + 1e-6,
                              "DGELU [%d][%d]: %g, want %g", i, j, got, want);
                }
            continue;
        }
        cr_assert_eq(lt.run(A16.data(), B16.data(), D.data()), CUBLAS_STATUS_SUCCESS,
                     "epilogue %u", epilogue);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const double want =
                    product(i, j) + (epilogue == CUBLASLT_EPILOGUE_BIAS ? bias[i] : 0.0);
                cr_expect(std::fabs(D[i + j * m] - want) <= 1e-5 * (1 + std::fabs(want)),
                          "epilogue %u [%d][%d]: %g, want %g", epilogue, i, j, D[i + j * m], want);
            }
        const int length = epilogue == CUBLASLT_EPILOGUE_BGRADA ? m
                           : epilogue == CUBLASLT_EPILOGUE_BGRADB ? n : 0;
        for (int i = 0; i < length; i++) {
            double want = 0;
            for (int p = 0; p < k; p++)
                want += epilogue == CUBLASLT_EPILOGUE_BGRADA ? A[i + p * m] : B[p + i * k];
            cr_expect(std::fabs(sums[i] - want) <= 1e-5 * (1 + std::fabs(want)),
                      "bias gradient %u [%d]: %g, want %g", epilogue, i, sums[i], want);
        }
    }
}

/* What cuBLASLt refuses: layouts that do not make D, an aux leading dimension not a multiple
 * of 8, an attribute of the wrong size, and (at the product) a pointer less aligned than the
 * preference promised the heuristic. */
Test(emulated_blas, lt_refuses_as_cublaslt)
{
    const int m = 8, n = 3, k = 6;
    std::vector<__nv_bfloat16> A((size_t)m * k + 8), B((size_t)k * n);
    std::vector<float> D((size_t)m * n + 4);
    {
        lt_problem lt(m, n, k, CUDA_R_32F, m);
        cr_expect_eq(lt.set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)CUBLAS_OP_T),
                     CUBLAS_STATUS_SUCCESS);
        cr_expect_eq(lt.run(A.data(), B.data(), D.data()), CUBLAS_STATUS_INVALID_VALUE,
                     "op(A) is k×m: not D's m rows");
    }
    {
        lt_problem lt(m, n, k, CUDA_R_16BF, m);
        lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_DGELU);
        lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (const void *)A.data());
        lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)12);
        cr_expect_eq(lt.run(A.data(), B.data(), D.data()), CUBLAS_STATUS_INVALID_VALUE,
                     "aux ld 12: not a multiple of 8");
        cr_expect_eq(lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int32_t)16),
                     CUBLAS_STATUS_INVALID_VALUE, "aux ld is 8 bytes, not 4");
    }
    {
        lt_problem lt(m, n, k, CUDA_R_32F, m);
        const uint32_t sixteen = 16;
        cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                             &sixteen, sizeof sixteen);
        float *d = D.data();
        while ((uintptr_t)d % 16 != 4) d++; /* 4-byte aligned, not 16 */
        cr_expect_eq(lt.run(A.data(), B.data(), d), CUBLAS_STATUS_INVALID_VALUE,
                     "D less aligned than promised");
    }
}
