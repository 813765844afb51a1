/* Products with an epilogue through cuBLASLt: the bias added, or the GELU's gradient applied,
 * to the fp32 sums inside the GEMM before they are stored (rounded once to D's type), or the
 * bias gradient summed from an operand as the GEMM reads it, instead of a separate pass of
 * ours that reads the product or the operand again (matmul.cu's fallbacks).
 *
 * Naive reading, per element of D[row][col] = Σ_k op(A)[row][k]·op(B)[k][col] + β·D (fp32):
 *   PT_GEMM_BIAS:            D = sum + bias[col]
 *   PT_GEMM_GELU_GRADIENT:   D = sum · gelu'(aux[row][col])   (GELU: the tanh approximation)
 *   PT_GEMM_BIAS_GRADIENT_A: D = sum;  bias_gradient[row] = Σ_k op(A)[row][k]
 *   PT_GEMM_BIAS_GRADIENT_B: D = sum;  bias_gradient[col] = Σ_k op(B)[k][col]
 *
 * The row-major to column-major mapping is matmul.cu's: the row-major D = op(A)·op(B) is the
 * column-major Dᵀ = op(B)ᵀ·op(A)ᵀ, so B's buffer is cuBLASLt's first operand (its "A"), m =
 * cols_d and n = rows_d, D's leading dimension its row stride; the bias runs along cuBLASLt's
 * rows (length m), and aux is a dense [rows_d, cols_d] (leading dimension m). So the row-major
 * B's bias gradient is cuBLASLt's BGRADA (its A's, along m), the row-major A's its BGRADB
 * (along n); cuBLASLt writes it in D's type (fp32 here).
 *
 * cuBLASLt chooses an algorithm (its heuristic, one answer) for the pointers' actual
 * alignment: the operands are often rows inside a larger buffer, not the 256 bytes it assumes
 * by default. Its answer is kept for each kind of product, everything the heuristic reads but
 * the pointers themselves (their alignments included), so a step's ~100 products ask it once
 * per kind rather than each time (host time: the heuristic takes tens of µs); "no algorithm"
 * is kept too. Where it has none (a type pair or epilogue it does not fuse, an aux row length
 * not a multiple of 8) the caller falls back, and the first such refusal of each kind is
 * logged once. */
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "runtime/log.h"
}

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* what NVIDIA suggests for Hopper */

static long products_made;      /* pt_cuda_lt_products */
static long heuristic_queries; /* pt_cuda_lt_heuristic_queries */

extern "C" long pt_cuda_lt_products(void) { return products_made; }
extern "C" long pt_cuda_lt_heuristic_queries(void) { return heuristic_queries; }

/* ---- the heuristic's answers, by kind of product ---------------------------------------- */

/* What the heuristic's answer depends on: the product's shape, types, operations, epilogue,
 * and the alignment of each pointer it was told or reads from the descriptor. */
struct lt_kind {
    int32_t compute, op_a, op_b, epilogue, type, d_type;
    int32_t m, n, k, ld_a, ld_b, ld_d;
    uint32_t alignment[5]; /* B's buffer, A's, D's, the bias's (or bias gradient's), aux's */
};
static_assert(sizeof(lt_kind) == 17 * 4, "no padding: kinds are compared as bytes");

struct lt_answer {
    lt_kind kind;
    bool found;
    cublasLtMatmulAlgo_t algo;
};

#define LT_ANSWERS_KEPT 64 /* a GPT-2 step has ~15 kinds of product */
static lt_answer answers[LT_ANSWERS_KEPT];
static int n_answers, next_replaced;

static const lt_answer *answer_for(const lt_kind &kind)
{
    for (int i = 0; i < n_answers; i++)
        if (!memcmp(&answers[i].kind, &kind, sizeof kind)) return &answers[i];
    return NULL;
}

static void keep_answer(const lt_kind &kind, bool found, const cublasLtMatmulAlgo_t &algo)
{
    lt_answer *slot = n_answers < LT_ANSWERS_KEPT ? &answers[n_answers++]
                                                  : &answers[next_replaced++ % LT_ANSWERS_KEPT];
    slot->kind = kind;
    slot->found = found;
    slot->algo = algo;
}

pipert_result pt_cuda_lt_start(void)
{
    cublasStatus_t status = cublasLtCreate(&pt_cuda.cublas_lt);
    if (status != CUBLAS_STATUS_SUCCESS)
        return pt_fail(PIPERT_ERR_INTERNAL, "cuBLASLt: %s", cublasGetStatusString(status));
    cudaError_t err = cudaMalloc(&pt_cuda.lt_workspace, LT_WORKSPACE_BYTES);
    if (err != cudaSuccess)
        return pt_fail(PIPERT_ERR_NOMEM, "CUDA device %d: cuBLASLt's workspace of %zu MiB: %s",
                       pt_cuda.device, LT_WORKSPACE_BYTES >> 20, cudaGetErrorString(err));
    return PIPERT_OK;
}

void pt_cuda_lt_stop(void)
{
    n_answers = next_replaced = 0; /* answers of this handle's */
    if (pt_cuda.lt_workspace) cudaFree(pt_cuda.lt_workspace);
    if (pt_cuda.cublas_lt) cublasLtDestroy(pt_cuda.cublas_lt);
    pt_cuda.lt_workspace = NULL;
    pt_cuda.cublas_lt = NULL;
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

static const char *epilogue_name(pt_gemm_epilogue_kind kind)
{
    switch (kind) {
    case PT_GEMM_BIAS: return "the bias";
    case PT_GEMM_GELU_GRADIENT: return "the GELU's gradient";
    default: return "the bias gradient";
    }
}

/* Logs the first refusal of each epilogue kind: the products then run without it. */
static void note_declined(pt_gemm_epilogue_kind kind, const char *why, int m, int n, int k)
{
    static bool noted[PT_GEMM_EPILOGUE_KINDS];
    if (noted[kind]) return;
    noted[kind] = true;
    pt_info("cuda: cuBLASLt does not fuse %s into a %d×%d×%d product (%s); such products run "
            "as cuBLAS and a kernel", epilogue_name(kind), m, n, k, why);
}

/* The descriptors of one call, destroyed together. */
struct lt_call {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t first = NULL, second = NULL, out = NULL;
    cublasLtMatmulPreference_t preference = NULL;
    ~lt_call()
    {
        if (preference) cublasLtMatmulPreferenceDestroy(preference);
        if (out) cublasLtMatrixLayoutDestroy(out);
        if (second) cublasLtMatrixLayoutDestroy(second);
        if (first) cublasLtMatrixLayoutDestroy(first);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

template <class Value>
static bool set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, Value value)
{
    return cublasLtMatmulDescSetAttribute(desc, what, &value, sizeof value) ==
           CUBLAS_STATUS_SUCCESS;
}

static bool describe_epilogue(cublasLtMatmulDesc_t desc, const pt_gemm_epilogue &e, int m)
{
    switch (e.kind) {
    case PT_GEMM_BIAS:
        return set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) &&
               set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void *)e.bias) &&
               set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)CUDA_R_32F);
    case PT_GEMM_GELU_GRADIENT: /* aux of D's type: bf16 */
        return set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DGELU) &&
               set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (const void *)e.aux) &&
               set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)m);
    default: /* the row-major A is cuBLASLt's B (the mapping above) */
        return set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                   e.kind == PT_GEMM_BIAS_GRADIENT_A ? CUBLASLT_EPILOGUE_BGRADB
                                                     : CUBLASLT_EPILOGUE_BGRADA) &&
               set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void *)e.bias_gradient);
    }
}

/* A layout of a row-major buffer as cuBLASLt's column-major operand: op N reads it as
 * [rows, cols] with leading dimension ld, op T as its transpose stored [cols, rows]. */
static bool describe(cublasLtMatrixLayout_t *layout, cudaDataType type, cublasOperation_t op,
                     int rows, int cols, int ld)
{
    const bool plain = op == CUBLAS_OP_N;
    return cublasLtMatrixLayoutCreate(layout, type, plain ? rows : cols, plain ? cols : rows, ld) ==
           CUBLAS_STATUS_SUCCESS;
}

/* The workspace, and the operands' actual alignment (the bias's and aux's pointers are in the
 * descriptor: the heuristic reads them there). */
static bool prefer(cublasLtMatmulPreference_t *p, const void *D, pt_gemm_operand A,
                   pt_gemm_operand B)
{
    const uint64_t workspace = LT_WORKSPACE_BYTES;
    if (cublasLtMatmulPreferenceCreate(p) != CUBLAS_STATUS_SUCCESS) return false;
    const struct {
        cublasLtMatmulPreferenceAttributes_t what;
        uint32_t bytes;
    } aligned[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(B.data)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(A.data)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(D)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(D)},
    };
    bool ok = cublasLtMatmulPreferenceSetAttribute(*p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace, sizeof workspace) ==
              CUBLAS_STATUS_SUCCESS;
    for (const auto &a : aligned)
        ok = ok && cublasLtMatmulPreferenceSetAttribute(*p, a.what, &a.bytes, sizeof a.bytes) ==
                       CUBLAS_STATUS_SUCCESS;
    return ok;
}

/* The kind of product a call is, for the kept answers. */
static lt_kind kind_of(cublasComputeType_t compute, cublasOperation_t op_a, cublasOperation_t op_b,
                       cudaDataType type, const pt_gemm_epilogue &e, pt_gemm_result D,
                       pt_gemm_operand A, pt_gemm_operand B, int m, int n, int k)
{
    const bool aux = e.kind == PT_GEMM_GELU_GRADIENT;
    const void *bias = e.kind == PT_GEMM_BIAS ? (const void *)e.bias : (const void *)e.bias_gradient;
    return lt_kind{(int32_t)compute, (int32_t)op_a, (int32_t)op_b, (int32_t)e.kind, (int32_t)type,
                   (int32_t)D.type, m, n, k, A.ld, B.ld, D.ld,
                   {alignment_of(B.data), alignment_of(A.data), alignment_of(D.data),
                    aux ? 0u : alignment_of(bias), aux ? alignment_of(e.aux) : 0u}};
}

/* The heuristic's algorithm for the call: kept from an earlier call of its kind, or asked now
 * (and kept, "none" too); false where it has none (logged once per epilogue kind). */
static bool algorithm_for(const lt_call &call, const lt_kind &kind, int m, int n, int k,
                          cublasLtMatmulAlgo_t *algo)
{
    if (const lt_answer *known = answer_for(kind)) {
        *algo = known->algo;
        return known->found; /* a refusal was logged when it was asked */
    }
    cublasLtMatmulHeuristicResult_t chosen = {};
    int found = 0;
    heuristic_queries++;
    const cublasStatus_t asked =
        cublasLtMatmulAlgoGetHeuristic(pt_cuda.cublas_lt, call.desc, call.first, call.second,
                                       call.out, call.out, call.preference, 1, &chosen, &found);
    const bool ok = asked == CUBLAS_STATUS_SUCCESS && found > 0;
    keep_answer(kind, ok, chosen.algo);
    if (!ok)
        note_declined((pt_gemm_epilogue_kind)kind.epilogue,
                      asked != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(asked)
                                                     : "no algorithm",
                      m, n, k);
    *algo = chosen.algo;
    return ok;
}

bool pt_cuda_gemm_lt(pt_gemm_result D, int rows_d, int cols_d, int k,
                     pt_gemm_operand A, cublasOperation_t op_a, pt_gemm_operand B,
                     cublasOperation_t op_b, cudaDataType type, const pt_gemm_epilogue &epilogue,
                     float beta)
{
    /* a combination cuBLASLt refused at the call itself is not asked again */
    static bool refused[PT_GEMM_EPILOGUE_KINDS][2];
    const bool wide = D.type == CUDA_R_32F;
    if (!pt_cuda.lt || !pt_cuda.cublas_lt || refused[epilogue.kind][wide]) return false;
    const bool bias_gradient =
        epilogue.kind == PT_GEMM_BIAS_GRADIENT_A || epilogue.kind == PT_GEMM_BIAS_GRADIENT_B;
    if (bias_gradient && (rows_d <= 0 || cols_d <= 0 || k <= 0)) return false; /* sums of none */
    if (rows_d <= 0 || cols_d <= 0) return true; /* nothing to make */
    const int m = cols_d, n = rows_d;
    if (epilogue.kind == PT_GEMM_GELU_GRADIENT && m % 8) {
        note_declined(epilogue.kind, "aux rows must be a multiple of 8 long", m, n, k);
        return false;
    }
    const cublasComputeType_t compute =
        type == CUDA_R_32F && pt_cuda.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    lt_call call;
    bool described =
        cublasLtMatmulDescCreate(&call.desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        set(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)op_b) &&
        set(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)op_a) &&
        describe_epilogue(call.desc, epilogue, m) &&
        describe(&call.first, type, op_b, m, k, B.ld) &&
        describe(&call.second, type, op_a, k, n, A.ld) &&
        describe(&call.out, D.type, CUBLAS_OP_N, m, n, D.ld) &&
        prefer(&call.preference, D.data, A, B);
    if (!described) {
        note_declined(epilogue.kind, "its descriptors were refused", m, n, k);
        return false;
    }
    cublasLtMatmulAlgo_t algo;
    if (!algorithm_for(call, kind_of(compute, op_a, op_b, type, epilogue, D, A, B, m, n, k), m, n,
                       k, &algo))
        return false;
    const float alpha = 1.0f;
    const cublasStatus_t ran =
        cublasLtMatmul(pt_cuda.cublas_lt, call.desc, &alpha, B.data, call.first, A.data,
                       call.second, &beta, D.data, call.out, D.data, call.out, &algo,
                       pt_cuda.lt_workspace, LT_WORKSPACE_BYTES, pt_cuda.compute);
    if (ran == CUBLAS_STATUS_NOT_SUPPORTED || ran == CUBLAS_STATUS_INVALID_VALUE) {
        /* refused before anything was launched (a type it does not take in this epilogue) */
        refused[epilogue.kind][wide] = true;
        note_declined(epilogue.kind, cublasGetStatusString(ran), m, n, k);
        return false;
    }
    if (pt_cublas_ok(ran, "cublasLtMatmul", __FILE__, __LINE__)) products_made++;
    return true;
}
