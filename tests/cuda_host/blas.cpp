/* cuBLAS and cuBLASLt on the emulated device (tests/cuda_host): the calls kernels/cuda's
 * products make (matmul.cu, gemm_lt.cu, attention_gemm.cu), implemented from the libraries'
 * documentation, so that the products' own code runs in CI: which buffer goes first, the op
 * letters, m, n, k, the leading dimensions, the epilogues' descriptors.
 *
 * Refused as the libraries refuse (their status, and a line on stderr naming what): a leading
 * dimension shorter than its matrix's rows, a type combination they lack, for cuBLASLt
 * layouts that disagree with the ops, an epilogue without its pointer, an aux leading
 * dimension not a multiple of 8 or shorter than D's rows, an attribute of the wrong size,
 * and a pointer less aligned than the preference promised (the algorithm chosen for the
 * promise would fault on it).
 *
 * Naive reading of a product (column-major, X[r + c·ld]):
 *   P[i][j] = Σ_p op(A)[i][p]·op(B)[p][j]    op(X)[i][p] = X[i][p] (N) or X[p][i] (T)
 *   D[i][j] = epilogue(α·P[i][j] + β·C[i][j])  C not read when β = 0 (its NaNs stay out)
 *   BIAS:  + bias[i]          DGELU: · gelu'(aux[i + j·aux_ld])   (GELU's tanh form)
 * rounded once to D's type; and BGRADA writes bias[i] = Σ_p op(A)[i][p] (m long), BGRADB
 * bias[j] = Σ_p op(B)[p][j] (n long), in D's type. Every element of A and B is read from that
 * place, so a leading dimension or shape reaching past a buffer reads past it
 * (AddressSanitizer's report); the operands are widened to fp32 (rounded to TF32 under
 * CUBLAS_COMPUTE_32F_FAST_TF32) and multiplied by the host's sgemm, fp32 sums as the device's. */
#include <cblas.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"

struct cublasContext {
    int unused;
};
struct cublasLtContext {
    int unused;
};

struct cublasLtMatmulDescEmulated {
    cublasComputeType_t compute;
    cudaDataType scale;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr, *aux = nullptr;
    int32_t bias_type = -1, aux_type = -1; /* -1: D's type */
    int64_t aux_ld = 0;
};

struct cublasLtMatrixLayoutEmulated {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulPreferenceEmulated {
    uint64_t workspace = 0;
    uint32_t alignment[4] = {256, 256, 256, 256}; /* A, B, C, D */
};

namespace {

constexpr uint64_t ALGO_MAGIC = 0x70742d656d756cULL; /* an algorithm this file chose */

const char *status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

/* status, after a line saying why */
cublasStatus_t refuse(cublasStatus_t status, const char *call, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
cublasStatus_t refuse(cublasStatus_t status, const char *call, const char *format, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, format);
    std::vsnprintf(why, sizeof why, format, ap);
    va_end(ap);
    std::fprintf(stderr, "emulated cuBLAS: %s: %s: %s\n", call, why, status_name(status));
    return status;
}

bool known_type(int type) { return type == CUDA_R_32F || type == CUDA_R_16BF; }
bool is_op(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

float tf32_rounded(float x)
{
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) return x; /* inf, NaN */
    bits += 0xfffu + ((bits >> 13) & 1u);              /* nearest, ties to even, 10 bits kept */
    bits &= ~0x1fffu;
    std::memcpy(&x, &bits, 4);
    return x;
}

float load(const void *data, int type, size_t i)
{
    if (type == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)data)[i]);
    return ((const float *)data)[i];
}

void store(void *data, int type, size_t i, float v)
{
    if (type == CUDA_R_16BF)
        ((__nv_bfloat16 *)data)[i] = __float2bfloat16_rn(v);
    else
        ((float *)data)[i] = v;
}

/* A column-major matrix as stored. */
struct stored {
    const void *data;
    int type;
    long rows, cols, ld;
};

/* op(x) as a dense fp32 column-major matrix */
std::vector<float> widened(const stored &x, int op, bool tf32)
{
    const bool plain = op == CUBLAS_OP_N;
    const long rows = plain ? x.rows : x.cols, cols = plain ? x.cols : x.rows;
    std::vector<float> out((size_t)rows * cols);
    for (long j = 0; j < cols; j++)
        for (long i = 0; i < rows; i++) {
            const long r = plain ? i : j, c = plain ? j : i;
            const float v = load(x.data, x.type, (size_t)r + (size_t)c * x.ld);
            out[(size_t)i + (size_t)j * rows] = tf32 ? tf32_rounded(v) : v;
        }
    return out;
}

/* P[m×n] = a·b of widened operands a (m×k) and b (k×n), fp32 */
std::vector<float> product(const std::vector<float> &a, const std::vector<float> &b, long m,
                           long n, long k)
{
    std::vector<float> P((size_t)m * n, 0.0f);
    if (k == 0) return P;
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a.data(),
                (int)m, b.data(), (int)k, 0.0f, P.data(), (int)m);
    return P;
}

/* The same from the stored operands */
std::vector<float> product(const stored &A, int op_a, const stored &B, int op_b, long m, long n,
                           long k, bool tf32)
{
    if (k == 0) return std::vector<float>((size_t)m * n, 0.0f);
    return product(widened(A, op_a, tf32), widened(B, op_b, tf32), m, n, k);
}

/* out[i] = Σ_p x[i·along + p·across] for i < count, p < terms (a widened operand's rows or
 * columns), stored in type */
void sums_of(const std::vector<float> &x, long count, long terms, long along, long across,
             void *out, int type)
{
    for (long i = 0; i < count; i++) {
        float sum = 0.0f;
        for (long p = 0; p < terms; p++) sum += x[(size_t)(i * along + p * across)];
        store(out, type, (size_t)i, sum);
    }
}

float gelu_gradient(float x)
{
    const float s = 0.7978845608028654f, c = 0.044715f; /* √(2/π) */
    const float u = s * (x + c * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * s * (1.0f + 3.0f * c * x * x);
}

/* What is applied to α·P + β·C before it is stored. */
struct epilogue {
    uint32_t kind = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr, *aux = nullptr;
    int bias_type = CUDA_R_32F, aux_type = CUDA_R_32F;
    long aux_ld = 0;
};

/* D = epilogue(α·P + β·C), m×n */
void finish(const std::vector<float> &P, long m, long n, float alpha, float beta, const stored &C,
            void *D, int d_type, long ldd, const epilogue &e)
{
    for (long j = 0; j < n; j++)
        for (long i = 0; i < m; i++) {
            float v = alpha * P[(size_t)i + (size_t)j * m];
            if (beta != 0.0f) v += beta * load(C.data, C.type, (size_t)i + (size_t)j * C.ld);
            if (e.kind == CUBLASLT_EPILOGUE_BIAS) v += load(e.bias, e.bias_type, (size_t)i);
            if (e.kind == CUBLASLT_EPILOGUE_DGELU)
                v *= gelu_gradient(load(e.aux, e.aux_type, (size_t)i + (size_t)j * e.aux_ld));
            store(D, d_type, (size_t)i + (size_t)j * ldd, v);
        }
}

/* cuBLAS's fp32-compute combinations kernels/cuda may ask for (cublasGemmEx's table) */
bool supported(int a_type, int b_type, int c_type, int compute)
{
    if (a_type != b_type) return false;
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        return a_type == CUDA_R_32F && c_type == CUDA_R_32F;
    if (compute != CUBLAS_COMPUTE_32F) return false;
    return a_type == CUDA_R_32F ? c_type == CUDA_R_32F
                                : c_type == CUDA_R_16BF || c_type == CUDA_R_32F;
}

long at_least_1(long x) { return x > 1 ? x : 1; }

/* cublasGemmEx's checks of its arguments */
cublasStatus_t check_gemm(const char *call, cublasHandle_t handle, int transa, int transb, int m,
                          int n, int k, const void *alpha, int a_type, int lda, int b_type,
                          int ldb, const void *beta, int c_type, int ldc, int compute)
{
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "no handle");
    if (!is_op(transa) || !is_op(transb))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "transa %d, transb %d", transa, transb);
    if (m < 0 || n < 0 || k < 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "m %d, n %d, k %d", m, n, k);
    const long a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
    if (lda < at_least_1(a_rows))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "lda %d < A's %ld rows", lda, a_rows);
    if (ldb < at_least_1(b_rows))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "ldb %d < B's %ld rows", ldb, b_rows);
    if (ldc < at_least_1(m))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "ldc %d < C's %d rows", ldc, m);
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no alpha or beta");
    if (!known_type(a_type) || !known_type(b_type) || !known_type(c_type) ||
        !supported(a_type, b_type, c_type, compute))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "types A %d, B %d, C %d, compute %d",
                      a_type, b_type, c_type, compute);
    return CUBLAS_STATUS_SUCCESS;
}

/* One product of cublasGemmEx (arguments checked) */
void gemm(int transa, int transb, int m, int n, int k, float alpha, const void *A, int a_type,
          int lda, const void *B, int b_type, int ldb, float beta, void *C, int c_type, int ldc,
          int compute)
{
    const stored a = {A, a_type, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda};
    const stored b = {B, b_type, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb};
    const std::vector<float> P =
        product(a, transa, b, transb, m, n, k, compute == CUBLAS_COMPUTE_32F_FAST_TF32);
    finish(P, m, n, alpha, beta, {C, c_type, m, n, ldc}, C, c_type, ldc, epilogue{});
}

/* ---- cuBLASLt's checks ----------------------------------------------------------------- */

uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

/* The problem a descriptor and four layouts describe: D (m×n) = op(A)·op(B), k inner. */
struct problem {
    long m, n, k;
    epilogue e;
};

cublasStatus_t check_epilogue(const char *call, const cublasLtMatmulDescEmulated &d,
                              const cublasLtMatrixLayoutEmulated &D, problem *p)
{
    p->e.kind = d.epilogue;
    if (d.epilogue == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
    if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) {
        const int type = d.bias_type == -1 ? (int)D.type : d.bias_type;
        if (!d.bias)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "BIAS without a bias pointer");
        if (type != CUDA_R_32F && type != D.type)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "bias of type %d, D of %d", type,
                          (int)D.type);
        p->e.bias = d.bias, p->e.bias_type = type;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (d.epilogue == CUBLASLT_EPILOGUE_DGELU) {
        const int type = d.aux_type == -1 ? (int)D.type : d.aux_type;
        if (!d.aux) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "DGELU without aux");
        if (d.aux_ld < p->m || d.aux_ld % 8)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                          "aux ld %lld: must be ≥ D's %ld rows and a multiple of 8",
                          (long long)d.aux_ld, p->m);
        if (type != D.type)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "aux of type %d, D of %d", type,
                          (int)D.type);
        p->e.aux = d.aux, p->e.aux_type = type, p->e.aux_ld = d.aux_ld;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA || d.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
        const int type = d.bias_type == -1 ? (int)D.type : d.bias_type;
        if (!d.bias)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a bias gradient without its pointer");
        if (type != D.type) /* the bias gradient is of D's type */
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "bias gradient of type %d, D of %d",
                          type, (int)D.type);
        p->e.bias = d.bias, p->e.bias_type = type;
        return CUBLAS_STATUS_SUCCESS;
    }
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "epilogue %u is not emulated", d.epilogue);
}

cublasStatus_t check_problem(const char *call, const cublasLtMatmulDescEmulated *d,
                             const cublasLtMatrixLayoutEmulated *A,
                             const cublasLtMatrixLayoutEmulated *B,
                             const cublasLtMatrixLayoutEmulated *C,
                             const cublasLtMatrixLayoutEmulated *D, problem *p)
{
    if (!d || !A || !B || !C || !D)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a descriptor or layout is NULL");
    const bool a_plain = d->transa == CUBLAS_OP_N, b_plain = d->transb == CUBLAS_OP_N;
    p->m = (long)D->rows, p->n = (long)D->cols, p->k = (long)(a_plain ? A->cols : A->rows);
    const long a_rows = (long)(a_plain ? A->rows : A->cols);
    const long b_rows = (long)(b_plain ? B->rows : B->cols);
    const long b_cols = (long)(b_plain ? B->cols : B->rows);
    if (a_rows != p->m || b_rows != p->k || b_cols != p->n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "op(A) %ld×%ld and op(B) %ld×%ld do not make D's %ld×%ld", a_rows, p->k,
                      b_rows, b_cols, p->m, p->n);
    if (C->rows != D->rows || C->cols != D->cols || C->type != D->type)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "C and D differ in shape or type");
    if (d->scale != CUDA_R_32F || !supported(A->type, B->type, D->type, d->compute))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                      "types A %d, B %d, D %d, compute %d, scale %d", (int)A->type,
                      (int)B->type, (int)D->type, (int)d->compute, (int)d->scale);
    return check_epilogue(call, *d, *D, p);
}

template <class T> cublasStatus_t take(T *field, const void *buf, size_t size, const char *call)
{
    if (!buf || size != sizeof(T))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "%zu bytes for an attribute of %zu",
                      size, sizeof(T));
    std::memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

/* What an algorithm chosen by the heuristic requires: the alignments it was chosen for. */
enum { ALGO_ID, ALGO_A, ALGO_B, ALGO_C, ALGO_D, ALGO_BIAS, ALGO_AUX };

} // namespace

/* ---- cuBLAS ------------------------------------------------------------------------------ */

const char *cublasGetStatusString(cublasStatus_t status) { return status_name(status); }

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = new cublasContext{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t)
{
    const cublasStatus_t ok = check_gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha,
                                         Atype, lda, Btype, ldb, beta, Ctype, ldc, computeType);
    if (ok != CUBLAS_STATUS_SUCCESS || m == 0 || n == 0) return ok;
    gemm(transa, transb, m, n, k, *(const float *)alpha, A, Atype, lda, B, Btype, ldb,
         *(const float *)beta, C, Ctype, ldc, computeType);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k,
                                   const void *alpha, const void *const Aarray[],
                                   cudaDataType Atype, int lda, const void *const Barray[],
                                   cudaDataType Btype, int ldb, const void *beta,
                                   void *const Carray[], cudaDataType Ctype, int ldc,
                                   int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t)
{
    const char *call = "cublasGemmBatchedEx";
    const cublasStatus_t ok = check_gemm(call, handle, transa, transb, m, n, k, alpha, Atype, lda,
                                         Btype, ldb, beta, Ctype, ldc, computeType);
    if (ok != CUBLAS_STATUS_SUCCESS) return ok;
    if (batchCount < 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "batchCount %d", batchCount);
    if (batchCount > 0 && (!Aarray || !Barray || !Carray))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a pointer array is NULL");
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < batchCount; i++)
        gemm(transa, transb, m, n, k, *(const float *)alpha, Aarray[i], Atype, lda, Barray[i],
             Btype, ldb, *(const float *)beta, Carray[i], Ctype, ldc, computeType);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt ---------------------------------------------------------------------------- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    *handle = new cublasLtContext{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                        cublasComputeType_t computeType, cudaDataType scaleType)
{
    *desc = new cublasLtMatmulDescEmulated{computeType, scaleType};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    const char *call = "cublasLtMatmulDescSetAttribute";
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no descriptor");
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return take((int32_t *)&d->compute, buf, size, call);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return take((int32_t *)&d->scale, buf, size, call);
    case CUBLASLT_MATMUL_DESC_TRANSA: return take(&d->transa, buf, size, call);
    case CUBLASLT_MATMUL_DESC_TRANSB: return take(&d->transb, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&d->epilogue, buf, size, call);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&d->bias, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return take(&d->aux, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return take(&d->aux_ld, buf, size, call);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return take(&d->aux_type, buf, size, call);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take(&d->bias_type, buf, size, call);
    }
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!known_type(type))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutCreate", "type %d",
                      (int)type);
    if (ld < (int64_t)(rows > 1 ? rows : 1))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate",
                      "ld %lld < %llu rows", (long long)ld, (unsigned long long)rows);
    *layout = new cublasLtMatrixLayoutEmulated{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    *pref = new cublasLtMatmulPreferenceEmulated{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no preference");
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return take(&p->workspace, buf, size, call);
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        uint32_t *a = &p->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES];
        const cublasStatus_t ok = take(a, buf, size, call);
        if (ok == CUBLAS_STATUS_SUCCESS && (*a == 0 || (*a & (*a - 1))))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alignment %u", *a);
        return ok;
    }
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "no handle");
    if (!pref || requested < 1 || !results || !returned)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no preference or results");
    *returned = 0;
    problem p;
    const cublasStatus_t ok = check_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (ok != CUBLAS_STATUS_SUCCESS) return ok;
    /* an algorithm for the promised alignments (the bias's and aux's: their pointers') */
    cublasLtMatmulHeuristicResult_t r = {};
    r.algo.data[ALGO_ID] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) r.algo.data[ALGO_A + i] = pref->alignment[i];
    r.algo.data[ALGO_BIAS] = alignment_of(desc->bias);
    r.algo.data[ALGO_AUX] = alignment_of(desc->aux);
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    results[0] = r;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_bytes, cudaStream_t)
{
    const char *call = "cublasLtMatmul";
    if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "no handle");
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no alpha or beta");
    if (!algo || algo->data[ALGO_ID] != ALGO_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "no algorithm from the heuristic");
    if (workspace_bytes > 0 && !workspace)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "a workspace size and no workspace");
    problem p;
    const cublasStatus_t ok = check_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (ok != CUBLAS_STATUS_SUCCESS) return ok;
    if (C == D && (Cdesc->ld != Ddesc->ld))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "in place with C's ld ≠ D's");
    const struct {
        const char *name;
        const void *ptr;
        uint64_t promised;
    } pointers[] = {{"A", A, algo->data[ALGO_A]},          {"B", B, algo->data[ALGO_B]},
                    {"C", C, algo->data[ALGO_C]},          {"D", D, algo->data[ALGO_D]},
                    {"bias", desc->bias, algo->data[ALGO_BIAS]},
                    {"aux", desc->aux, algo->data[ALGO_AUX]}};
    for (const auto &q : pointers)
        if (alignment_of(q.ptr) < q.promised)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                          "%s at %p is %u-byte aligned; the algorithm was chosen for %llu", q.name,
                          q.ptr, alignment_of(q.ptr), (unsigned long long)q.promised);
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    const bool tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const stored A_stored = {A, Adesc->type, (long)Adesc->rows, (long)Adesc->cols, (long)Adesc->ld};
    const stored B_stored = {B, Bdesc->type, (long)Bdesc->rows, (long)Bdesc->cols, (long)Bdesc->ld};
    const std::vector<float> a = widened(A_stored, desc->transa, tf32);
    const std::vector<float> b = widened(B_stored, desc->transb, tf32);
    const std::vector<float> P = product(a, b, p.m, p.n, p.k);
    void *bias_gradient = const_cast<void *>(p.e.bias);
    if (p.e.kind == CUBLASLT_EPILOGUE_BGRADA) /* a: m×k, column-major */
        sums_of(a, p.m, p.k, 1, p.m, bias_gradient, p.e.bias_type);
    if (p.e.kind == CUBLASLT_EPILOGUE_BGRADB) /* b: k×n */
        sums_of(b, p.n, p.k, p.k, 1, bias_gradient, p.e.bias_type);
    finish(P, p.m, p.n, *(const float *)alpha, *(const float *)beta,
           {C, Cdesc->type, p.m, p.n, (long)Cdesc->ld}, D, Ddesc->type, (long)Ddesc->ld, p.e);
    return CUBLAS_STATUS_SUCCESS;
}
