/* Causal attention on tensor cores (runtime.precision = bf16): the bodies of
 * the kernels, FlashAttention-2's tiles on mma.sync.m16n8k16 (bf16 operands,
 * fp32 sums). The same mathematics, saved state and determinism as the
 * CUDA-core kernels of attention.cu (read its "naive reading" first); what
 * differs is who computes what, and three roundings to bf16 (below).
 *
 * Portable on purpose: this file is compiled by nvcc for the GPU
 * (attention_mma.cu) and by the host C++ compiler for tests
 * (tests/test_attention_mma.cpp, and attention_mma.cu translated by
 * tests/cuda_host), which run every thread of a block as a fiber on the host
 * and emulate the warp-wide operations from their documented register layouts
 * (tests/cuda_host/include/kernels/cuda/mma_primitives.cuh). The includer defines
 * the primitives first:
 *   PT_MMA_FN                        the qualifier of device functions
 *   pt_block_sync()                  __syncthreads()
 *   pt_shfl_xor(float v, int mask)   __shfl_xor_sync over the full warp
 *   pt_mma_bf16(d, a, b)             d[4] += A·B, one warp's 16×8×16 product
 *   pt_pack_bf16x2(lo, hi)           two floats rounded to nearest even, lo in bits 0–15
 *   pt_round_bf16(x)                 one float rounded to nearest even, as bf16 bits
 *   pt_ldmatrix_x4(r, row)           ldmatrix .x4: lane l gives row l mod 8 of 8×8 matrix
 *   pt_ldmatrix_x4_trans(r, row)     l / 8 (16 bytes, aligned); r[i] = matrix i's (or its
 *                                    transpose's) pair at row l/4, columns 2(l mod 4), +1
 *   pt_cp_async16(dst, src)          cp.async of 16 bytes (4 with pt_cp_async4) into shared
 *   pt_cp_async_commit()             memory: this thread's copies since the last commit form a
 *   pt_cp_async_wait<N>()            group; wait until all but the N newest groups landed
 *   pt_zero16(dst)
 *
 * Register layouts of mma.sync.m16n8k16.row.col (PTX ISA, "Matrix fragments
 * for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
 *   A (16×16, bf16 pairs): a0 = A[g][2t, 2t+1],   a1 = A[g+8][2t, 2t+1],
 *                          a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
 *   B (16×8):              b0 = B[2t, 2t+1][g],   b1 = B[2t+8, 2t+9][g]
 *   C, D (16×8, floats):   c0, c1 = C[g][2t, 2t+1],  c2, c3 = C[g+8][2t, 2t+1]
 * So a lane holds rows g and g + 8 of every 16-row result, four lanes share a
 * row (two shuffles reduce it), and the C fragments of two neighbouring 16×8
 * results are, packed in pairs, the A fragment of their 16×16 concatenation:
 * P never leaves registers between S = QKᵀ and O += P·V (c_to_a).
 *
 * Fragments come from shared memory by ldmatrix, four 8×8 matrices a warp-wide instruction:
 * an A fragment is the four quarters of a 16×16 tile; a B fragment, two 8×8 matrices (k
 * 0–7 and 8–15), so one ldmatrix gives the B fragments of two neighbouring 8-column blocks.
 * B[k][n] = tile[n][k] (the tile's rows are B's columns: Kᵀ, Vᵀ, Qᵀ, dOᵀ) is ldmatrix's
 * layout as it is; B[k][n] = tile[k][n] (V, K, dO, Q as right operands) its .trans.
 *
 * Work split. A block is 4 warps and owns 64 rows, 16 a warp; the other side
 * passes through shared memory in tiles of 64 rows (bf16, rows padded by 8
 * elements so that the fragment loads of a warp hit 32 different banks), two
 * buffers of them: the copy engine fetches the next tiles (cp.async) while the
 * warps compute on this one. The own rows arrive first in the second buffer,
 * whose tiles they leave once they are in registers.
 *   forward  own query rows; tiles of K and V; online softmax as attention.cu
 *   dq       own query rows; tiles of K and V; P and dS recomputed
 *   dkdv     own key rows; tiles of Q and dO (with L and D); Sᵀ = K·Qᵀ and
 *            dPᵀ = V·dOᵀ computed transposed, so that Pᵀ and dSᵀ are the A
 *            operands of dV += Pᵀ·dO and dK += dSᵀ·Q.
 *
 * Roundings to bf16 beyond the inputs' (each errs by at most 2⁻⁸ of the value):
 * the probabilities P before P·V and Pᵀ·dO, the output gradient dO before it
 * meets V, Q and Pᵀ (it arrives in fp32: pt_mma_delta_row rounds it once, into
 * a bf16 copy the tiles come from), and dS before dS·K and dSᵀ·Q.
 * Row sums of P (l) and D use the unrounded values. The CUDA-core kernels
 * round nothing after the inputs: the tests hold these to bf16's error
 * against them, and exactly where the roundings are exact.
 */
#ifndef PT_KERNELS_CUDA_ATTENTION_MMA_CUH
#define PT_KERNELS_CUDA_ATTENTION_MMA_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define PT_MMA_ROWS 64    /* own rows per block: 4 warps of 16 */
#define PT_MMA_TILE 64    /* rows of the other side per shared-memory tile */
#define PT_MMA_THREADS 128

struct pt_mma_shape {
    int B, T, C, NH; /* head size: the kernel's HS */
    float scale;      /* 1/√hs */
    float scale_log2; /* log₂e/√hs: scores in base 2, as attention.cu */
};

/* bf16 elements per shared row: 16 bytes of padding start row r + 1 four banks
 * after row r (head sizes 64, 128; twenty at 32), so the 8 rows of 16 bytes
 * (4 words) of each of ldmatrix's matrices hit 32 different banks. */
template <int HS> constexpr int pt_mma_stride = HS + 8;

template <int HS> constexpr size_t pt_mma_tile_bytes()
{
    return (size_t)PT_MMA_TILE * pt_mma_stride<HS> * 2;
}
/* Two buffers of two tiles (K and V; Q and dO for dkdv, with its L and D rows). */
template <int HS> constexpr size_t pt_mma_forward_shared_bytes() { return 4 * pt_mma_tile_bytes<HS>(); }
template <int HS> constexpr size_t pt_mma_dq_shared_bytes() { return 4 * pt_mma_tile_bytes<HS>(); }
template <int HS> constexpr size_t pt_mma_dkdv_shared_bytes()
{
    return 4 * pt_mma_tile_bytes<HS>() + 4 * PT_MMA_TILE * sizeof(float);
}

/* Buffer `which` (0, 1) of the two, and its first or second tile. */
template <int HS>
PT_MMA_FN uint16_t *pt_mma_buffer_tile(unsigned char *shared, int which, int second)
{
    return (uint16_t *)shared + (2 * which + second) * PT_MMA_TILE * pt_mma_stride<HS>;
}

/* Blocks: B·NH heads × ceil(T/64) row blocks, row-block major, so that the
 * longest blocks of every head start first (query blocks near T see the most
 * keys; key blocks near 0 the most queries). */
struct pt_mma_block {
    int b, h, bh, r0;
};

PT_MMA_FN pt_mma_block pt_mma_own_rows(pt_mma_shape s, int block, bool last_rows_first)
{
    const int heads = s.B * s.NH, row_blocks = (s.T + PT_MMA_ROWS - 1) / PT_MMA_ROWS;
    const int bh = block % heads, k = block / heads;
    const int row_block = last_rows_first ? row_blocks - 1 - k : k;
    return {bh / s.NH, bh % s.NH, bh, row_block * PT_MMA_ROWS};
}

/* The lane's place in its warp's fragments. */
struct pt_mma_lane {
    int warp, g, t;
};

PT_MMA_FN pt_mma_lane pt_mma_lane_of(int tid) { return {tid >> 5, (tid & 31) >> 2, tid & 3}; }

/* ---- tiles ---------------------------------------------------------------------- */

/* Rows [r0, r0 + 64) of a head's slice of a bf16 [B, T, row_stride] buffer
 * (src: its row 0, first column of the head) into tile[64][HS + 8], fetched by cp.async (the
 * caller commits and waits); rows at or past T are zero, stored at once. 16 bytes per thread
 * per pass. */
template <int HS>
PT_MMA_FN void pt_mma_fetch_tile(uint16_t *tile, const uint16_t *src, size_t row_stride, int r0,
                                 int T, int tid)
{
    constexpr int chunks = HS / 8;
    for (int idx = tid; idx < PT_MMA_TILE * chunks; idx += PT_MMA_THREADS) {
        const int r = idx / chunks, c = (idx % chunks) * 8;
        uint16_t *dst = tile + r * pt_mma_stride<HS> + c;
        if (r0 + r < T)
            pt_cp_async16(dst, src + (size_t)(r0 + r) * row_stride + c);
        else
            pt_zero16(dst);
    }
}

/* rows[r] = x[r0 + r] for the 64 rows of a tile, 0 past T (L and D), by cp.async. */
PT_MMA_FN void pt_mma_fetch_rows(float *rows, const float *x, int r0, int T, int tid)
{
    for (int r = tid; r < PT_MMA_TILE; r += PT_MMA_THREADS) {
        if (r0 + r < T) pt_cp_async4(rows + r, x + r0 + r);
        else rows[r] = 0.0f;
    }
}

/* ---- fragments -------------------------------------------------------------------- */

/* A = tile[row0 .. row0 + 16][k0 .. k0 + 16]: matrices i = 0..3 are its quarters (rows
 * + 8·(i mod 2), columns + 8·(i / 2)), in a0..a3's order. */
template <int HS>
PT_MMA_FN void pt_mma_a_fragment(uint32_t (&a)[4], const uint16_t *tile, int row0, int k0,
                                 pt_mma_lane l)
{
    const int lane = l.g * 4 + l.t, i = lane >> 3;
    pt_ldmatrix_x4(a, tile + (row0 + (lane & 7) + 8 * (i & 1)) * pt_mma_stride<HS> + k0 + 8 * (i >> 1));
}

/* b[0..1] and b[2..3]: the B fragments of columns n0..n0+7 and n0+8..n0+15 over k0..k0+15,
 * B[k][n] = tile[n][k] (Kᵀ, Vᵀ, Qᵀ, dOᵀ). Matrix i: tile rows n0 + 8·(i / 2) + 0..7, columns
 * k0 + 8·(i mod 2): register i is then b0, b1 of the first block, b0, b1 of the second. */
template <int HS>
PT_MMA_FN void pt_mma_b_of_rows(uint32_t (&b)[4], const uint16_t *tile, int n0, int k0,
                                pt_mma_lane l)
{
    const int lane = l.g * 4 + l.t, i = lane >> 3;
    pt_ldmatrix_x4(b, tile + (n0 + 8 * (i >> 1) + (lane & 7)) * pt_mma_stride<HS> + k0 + 8 * (i & 1));
}

/* The same with B[k][n] = tile[k][n] (V, K, dO, Q as right operands): matrix i is tile rows
 * k0 + 8·(i mod 2) + 0..7, columns n0 + 8·(i / 2), transposed. */
template <int HS>
PT_MMA_FN void pt_mma_b_of_columns(uint32_t (&b)[4], const uint16_t *tile, int k0, int n0,
                                   pt_mma_lane l)
{
    const int lane = l.g * 4 + l.t, i = lane >> 3;
    pt_ldmatrix_x4_trans(b, tile + (k0 + 8 * (i & 1) + (lane & 7)) * pt_mma_stride<HS> + n0 + 8 * (i >> 1));
}

/* d += A·B twice: with the first and the second 8-column block of a pair b from above. */
PT_MMA_FN void pt_mma_bf16_pair(float (&first)[4], float (&second)[4], const uint32_t (&a)[4],
                                const uint32_t (&b)[4])
{
    const uint32_t b_first[2] = {b[0], b[1]}, b_second[2] = {b[2], b[3]};
    pt_mma_bf16(first, a, b_first);
    pt_mma_bf16(second, a, b_second);
}

/* This warp's 16 rows of a tile, over the head's HS columns, as A fragments (Q, dO, K, V
 * kept in registers for a whole kernel). */
template <int HS>
PT_MMA_FN void pt_mma_warp_rows(uint32_t (&a)[HS / 16][4], const uint16_t *tile, pt_mma_lane l)
{
    for (int ks = 0; ks < HS / 16; ks++) pt_mma_a_fragment<HS>(a[ks], tile, l.warp * 16, ks * 16, l);
}

/* The A fragment of [left | right], two 16×8 results side by side, rounded. */
PT_MMA_FN void pt_mma_c_to_a(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4])
{
    a[0] = pt_pack_bf16x2(left[0], left[1]);
    a[1] = pt_pack_bf16x2(left[2], left[3]);
    a[2] = pt_pack_bf16x2(right[0], right[1]);
    a[3] = pt_pack_bf16x2(right[2], right[3]);
}

/* acc[n] (n-th 16×8 block of a 16×64 result) = A_rows · B where B's columns
 * are the tile's 64 rows: Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ over the head's HS. */
template <int HS>
PT_MMA_FN void pt_mma_times_rows(float (&acc)[PT_MMA_TILE / 8][4], const uint32_t (&a)[HS / 16][4],
                                 const uint16_t *tile, pt_mma_lane l)
{
    for (int n = 0; n < PT_MMA_TILE / 8; n++)
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    for (int n = 0; n < PT_MMA_TILE / 8; n += 2)
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t b[4];
            pt_mma_b_of_rows<HS>(b, tile, n * 8, ks * 16, l);
            pt_mma_bf16_pair(acc[n], acc[n + 1], a[ks], b);
        }
}

/* out[d] += X·tile, X the 16×64 result in C fragments (P, Pᵀ, dS, dSᵀ), the
 * tile's 64 rows its k: P·V, dS·K, Pᵀ·dO, dSᵀ·Q. */
template <int HS>
PT_MMA_FN void pt_mma_accumulate(float (&out)[HS / 8][4], const float (&x)[PT_MMA_TILE / 8][4],
                                 const uint16_t *tile, pt_mma_lane l)
{
    for (int kk = 0; kk < PT_MMA_TILE / 16; kk++) {
        uint32_t a[4];
        pt_mma_c_to_a(a, x[2 * kk], x[2 * kk + 1]);
        for (int d = 0; d < HS / 8; d += 2) {
            uint32_t b[4];
            pt_mma_b_of_columns<HS>(b, tile, kk * 16, d * 8, l);
            pt_mma_bf16_pair(out[d], out[d + 1], a, b);
        }
    }
}

/* The column (within a 64-row tile) of element e of result block n. */
PT_MMA_FN int pt_mma_column(int n, int e, pt_mma_lane l) { return n * 8 + 2 * l.t + (e & 1); }

/* Σ over the four lanes that share a row. */
PT_MMA_FN float pt_mma_row_sum(float x)
{
    x += pt_shfl_xor(x, 1);
    return x + pt_shfl_xor(x, 2);
}
PT_MMA_FN float pt_mma_row_max(float x)
{
    x = fmaxf(x, pt_shfl_xor(x, 1));
    return fmaxf(x, pt_shfl_xor(x, 2));
}

/* A gradient element: added into an fp32 dqkv (the table's rule for gradients), or written
 * into a bf16 one, rounded (attention_backward_bf16_to_bf16: what the product after reads). */
PT_MMA_FN void pt_mma_store_gradient(float *dst, float value) { *dst += value; }
PT_MMA_FN void pt_mma_store_gradient(uint16_t *dst, float value) { *dst = pt_round_bf16(value); }

/* The last row a block of own query rows sees keys up to (causal). */
PT_MMA_FN int pt_mma_last_row(pt_mma_block blk, int T)
{
    return (blk.r0 + PT_MMA_ROWS < T ? blk.r0 + PT_MMA_ROWS : T) - 1;
}

/* Pointers to (b, t = 0, head h) of q, k or v (part 0, 1, 2) in qkv[B, T, 3C],
 * and of a [B, T, C] buffer. */
template <class Element>
PT_MMA_FN Element *pt_mma_qkv_head(Element *qkv, pt_mma_shape s, pt_mma_block blk, int hs, int part)
{
    return qkv + (size_t)blk.b * s.T * 3 * s.C + (size_t)part * s.C + (size_t)blk.h * hs;
}
template <class Element>
PT_MMA_FN Element *pt_mma_btc_head(Element *x, pt_mma_shape s, pt_mma_block blk, int hs)
{
    return x + (size_t)blk.b * s.T * s.C + (size_t)blk.h * hs;
}

/* K and V rows [j0, j0 + 64) of the block's head into buffer `which`: one group of copies. */
template <int HS>
PT_MMA_FN void pt_mma_fetch_kv(unsigned char *shared, int which, const uint16_t *qkv,
                               pt_mma_shape s, pt_mma_block blk, int j0, int tid)
{
    const size_t stride = 3 * (size_t)s.C;
    pt_mma_fetch_tile<HS>(pt_mma_buffer_tile<HS>(shared, which, 0),
                          pt_mma_qkv_head(qkv, s, blk, HS, 1), stride, j0, s.T, tid);
    pt_mma_fetch_tile<HS>(pt_mma_buffer_tile<HS>(shared, which, 1),
                          pt_mma_qkv_head(qkv, s, blk, HS, 2), stride, j0, s.T, tid);
    pt_cp_async_commit();
}

/* The step over keys [j0, j0 + 64), whose K and V were fetched into buffer `which`: once every
 * thread is done with the other buffer, the next keys' fetch into it starts (when there are
 * any up to last_row), then this step's tiles are waited for and seen by every thread. */
template <int HS>
PT_MMA_FN void pt_mma_kv_step(unsigned char *shared, int which, const uint16_t *qkv,
                              pt_mma_shape s, pt_mma_block blk, int j0, int last_row, int tid)
{
    pt_block_sync();
    if (j0 + PT_MMA_TILE <= last_row) {
        pt_mma_fetch_kv<HS>(shared, 1 - which, qkv, s, blk, j0 + PT_MMA_TILE, tid);
        pt_cp_async_wait<1>();
    } else {
        pt_cp_async_wait<0>();
    }
    pt_block_sync();
}

/* ---- forward -------------------------------------------------------------------- */

/* An output element: fp32, or bf16 rounded (attention_forward_bf16_to_bf16: atty as the
 * product after attention reads it). */
PT_MMA_FN void pt_mma_store_output(float *dst, float value) { *dst = value; }
PT_MMA_FN void pt_mma_store_output(uint16_t *dst, float value) { *dst = pt_round_bf16(value); }

/* out[B,T,C] (fp32, or bf16 rounded), lse[B,NH,T], o_saved[B,T,C] (fp32), qkv[B,T,3C] in bf16 */
template <int HS, class Output>
PT_MMA_FN void pt_mma_attention_forward(Output *out, float *lse, float *o_saved,
                                        const uint16_t *qkv, pt_mma_shape s, int block, int tid,
                                        unsigned char *shared)
{
    uint16_t *q_tile = pt_mma_buffer_tile<HS>(shared, 1, 0);
    const pt_mma_block blk = pt_mma_own_rows(s, block, true);
    const pt_mma_lane l = pt_mma_lane_of(tid);
    const size_t stride = 3 * (size_t)s.C;
    pt_mma_fetch_tile<HS>(q_tile, pt_mma_qkv_head(qkv, s, blk, HS, 0), stride, blk.r0, s.T, tid);
    pt_cp_async_commit();
    pt_mma_fetch_kv<HS>(shared, 0, qkv, s, blk, 0, tid);
    pt_cp_async_wait<1>(); /* Q */
    pt_block_sync();
    uint32_t q[HS / 16][4];
    pt_mma_warp_rows<HS>(q, q_tile, l);

    const int row[2] = {blk.r0 + l.warp * 16 + l.g, blk.r0 + l.warp * 16 + l.g + 8};
    float o[HS / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}; /* this lane's share of l */
    const int last_row = pt_mma_last_row(blk, s.T);
    for (int j0 = 0, which = 0; j0 <= last_row; j0 += PT_MMA_TILE, which = 1 - which) {
        pt_mma_kv_step<HS>(shared, which, qkv, s, blk, j0, last_row, tid);
        const uint16_t *k_tile = pt_mma_buffer_tile<HS>(shared, which, 0),
                       *v_tile = pt_mma_buffer_tile<HS>(shared, which, 1);
        float p[PT_MMA_TILE / 8][4];
        pt_mma_times_rows<HS>(p, q, k_tile, l);
        float tile_max[2] = {-INFINITY, -INFINITY};
        for (int n = 0; n < PT_MMA_TILE / 8; n++)
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, j = j0 + pt_mma_column(n, e, l);
                p[n][e] = j <= row[r] && j < s.T ? p[n][e] * s.scale_log2 : -INFINITY;
                tile_max[r] = fmaxf(tile_max[r], p[n][e]);
            }
        float base[2], correction[2];
        for (int r = 0; r < 2; r++) {
            const float m_new = fmaxf(m[r], pt_mma_row_max(tile_max[r]));
            /* a row that has seen no key yet (past T) keeps m = −∞: no NaN from −∞ − −∞ */
            correction[r] = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
            base[r] = m_new == -INFINITY ? 0.0f : m_new;
            m[r] = m_new;
            sum[r] *= correction[r];
        }
        for (int d = 0; d < HS / 8; d++)
            for (int e = 0; e < 4; e++) o[d][e] *= correction[e >> 1];
        for (int n = 0; n < PT_MMA_TILE / 8; n++)
            for (int e = 0; e < 4; e++) {
                p[n][e] = exp2f(p[n][e] - base[e >> 1]);
                sum[e >> 1] += p[n][e];
            }
        pt_mma_accumulate<HS>(o, p, v_tile, l);
    }
    for (int r = 0; r < 2; r++) {
        const float total = pt_mma_row_sum(sum[r]);
        if (row[r] >= s.T) continue;
        Output *dst = pt_mma_btc_head(out, s, blk, HS) + (size_t)row[r] * s.C;
        float *kept = pt_mma_btc_head(o_saved, s, blk, HS) + (size_t)row[r] * s.C;
        for (int d = 0; d < HS / 8; d++)
            for (int e = 2 * r; e < 2 * r + 2; e++) {
                const int c = pt_mma_column(d, e, l);
                kept[c] = o[d][e] / total;
                pt_mma_store_output(&dst[c], kept[c]);
            }
        if (l.t == 0) lse[(size_t)blk.bh * s.T + row[r]] = m[r] + log2f(total);
    }
}

/* ---- backward ------------------------------------------------------------------- */

/* Before the backward's kernels, one warp per (b, t, h) row (row = (b·T + t)·NH + h): D =
 * rowsum(dO ⊙ O) over the head's columns from the unrounded values, into delta[B,NH,T], and
 * dO rounded to bf16 into dout16[B,T,C], the copy the tiles come from. */
template <int HS>
PT_MMA_FN void pt_mma_delta_row(float *delta, uint16_t *dout16, const float *dout,
                                const float *o_saved, pt_mma_shape s, int row, int lane)
{
    const int h = row % s.NH, bt = row / s.NH, t = bt % s.T, b = bt / s.T;
    const size_t at = (size_t)bt * s.C + (size_t)h * HS;
    float acc = 0.0f;
    for (int d = lane; d < HS; d += 32) {
        acc += dout[at + d] * o_saved[at + d];
        dout16[at + d] = pt_round_bf16(dout[at + d]);
    }
    for (int mask = 16; mask >= 1; mask /= 2) acc += pt_shfl_xor(acc, mask);
    if (lane == 0) delta[((size_t)b * s.NH + h) * s.T + t] = acc;
}

/* A lane's two rows of a backward kernel's 16×64 results, for the causal mask: query rows
 * (dq: a column j counts where j ≤ i) or key rows (dkdv, transposed: a column i counts where
 * i ≥ j); both inside T. */
struct pt_mma_rows_cols {
    int row[2]; /* the lane's two rows (absolute) */
    bool rows_are_keys;
};

PT_MMA_FN bool pt_mma_causal(pt_mma_rows_cols rc, int r, int col, int T)
{
    const int row = rc.row[r];
    if (row >= T || col >= T) return false;
    return rc.rows_are_keys ? col >= row : col <= row;
}

/* dqkv[B,T,3C] (fp32: += into the q columns; bf16: the q columns written), dout[B,T,C] bf16,
 * qkv[B,T,3C] bf16, lse and delta [B,NH,T] */
template <int HS, class Gradient>
PT_MMA_FN void pt_mma_attention_dq(Gradient *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                   const float *lse, const float *delta, pt_mma_shape s, int block,
                                   int tid, unsigned char *shared)
{
    uint16_t *q_tile = pt_mma_buffer_tile<HS>(shared, 1, 0),
             *do_tile = pt_mma_buffer_tile<HS>(shared, 1, 1);
    const pt_mma_block blk = pt_mma_own_rows(s, block, true);
    const pt_mma_lane l = pt_mma_lane_of(tid);
    const size_t stride = 3 * (size_t)s.C;
    pt_mma_fetch_tile<HS>(q_tile, pt_mma_qkv_head(qkv, s, blk, HS, 0), stride, blk.r0, s.T, tid);
    pt_mma_fetch_tile<HS>(do_tile, pt_mma_btc_head(dout, s, blk, HS), s.C, blk.r0, s.T, tid);
    pt_cp_async_commit();
    pt_mma_fetch_kv<HS>(shared, 0, qkv, s, blk, 0, tid);
    pt_cp_async_wait<1>(); /* Q and dO */
    pt_block_sync();
    uint32_t q[HS / 16][4], d_o[HS / 16][4];
    pt_mma_warp_rows<HS>(q, q_tile, l);
    pt_mma_warp_rows<HS>(d_o, do_tile, l);
    pt_mma_rows_cols rc = {{blk.r0 + l.warp * 16 + l.g, blk.r0 + l.warp * 16 + l.g + 8}, false};
    float L[2], D[2];
    for (int r = 0; r < 2; r++) {
        const bool inside = rc.row[r] < s.T;
        L[r] = inside ? lse[(size_t)blk.bh * s.T + rc.row[r]] : 0.0f;
        D[r] = inside ? delta[(size_t)blk.bh * s.T + rc.row[r]] : 0.0f;
    }
    float dq[HS / 8][4] = {};
    const int last_row = pt_mma_last_row(blk, s.T);
    for (int j0 = 0, which = 0; j0 <= last_row; j0 += PT_MMA_TILE, which = 1 - which) {
        pt_mma_kv_step<HS>(shared, which, qkv, s, blk, j0, last_row, tid);
        const uint16_t *k_tile = pt_mma_buffer_tile<HS>(shared, which, 0),
                       *v_tile = pt_mma_buffer_tile<HS>(shared, which, 1);
        float ds[PT_MMA_TILE / 8][4], dp[PT_MMA_TILE / 8][4];
        pt_mma_times_rows<HS>(ds, q, k_tile, l);
        pt_mma_times_rows<HS>(dp, d_o, v_tile, l);
        for (int n = 0; n < PT_MMA_TILE / 8; n++)
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const float p = pt_mma_causal(rc, r, j0 + pt_mma_column(n, e, l), s.T)
                                    ? exp2f(ds[n][e] * s.scale_log2 - L[r])
                                    : 0.0f;
                ds[n][e] = p * (dp[n][e] - D[r]);
            }
        pt_mma_accumulate<HS>(dq, ds, k_tile, l);
    }
    for (int r = 0; r < 2; r++) {
        if (rc.row[r] >= s.T) continue;
        Gradient *dst = pt_mma_qkv_head(dqkv, s, blk, HS, 0) + (size_t)rc.row[r] * stride;
        for (int d = 0; d < HS / 8; d++)
            for (int e = 2 * r; e < 2 * r + 2; e++)
                pt_mma_store_gradient(&dst[pt_mma_column(d, e, l)], dq[d][e] * s.scale);
    }
}

/* dqkv[B,T,3C] (fp32: += into the k and v columns; bf16: those written), dout[B,T,C] bf16,
 * qkv[B,T,3C] bf16, lse and delta [B,NH,T] */
template <int HS, class Gradient>
PT_MMA_FN void pt_mma_attention_dkdv(Gradient *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                     const float *lse, const float *delta, pt_mma_shape s,
                                     int block, int tid, unsigned char *shared)
{
    /* buffer w: its Q and dO tiles, and its L and D rows after the four tiles */
    float *rows = (float *)pt_mma_buffer_tile<HS>(shared, 2, 0);
    const pt_mma_block blk = pt_mma_own_rows(s, block, false);
    const pt_mma_lane l = pt_mma_lane_of(tid);
    const size_t stride = 3 * (size_t)s.C;
    auto fetch_queries = [&](int which, int i0) { /* Q, dO, L and D of queries [i0, i0 + 64) */
        pt_mma_fetch_tile<HS>(pt_mma_buffer_tile<HS>(shared, which, 0),
                              pt_mma_qkv_head(qkv, s, blk, HS, 0), stride, i0, s.T, tid);
        pt_mma_fetch_tile<HS>(pt_mma_buffer_tile<HS>(shared, which, 1),
                              pt_mma_btc_head(dout, s, blk, HS), s.C, i0, s.T, tid);
        pt_mma_fetch_rows(rows + 2 * which * PT_MMA_TILE, lse + (size_t)blk.bh * s.T, i0, s.T, tid);
        pt_mma_fetch_rows(rows + (2 * which + 1) * PT_MMA_TILE, delta + (size_t)blk.bh * s.T, i0,
                          s.T, tid);
        pt_cp_async_commit();
    };
    uint16_t *k_own = pt_mma_buffer_tile<HS>(shared, 1, 0), *v_own = pt_mma_buffer_tile<HS>(shared, 1, 1);
    pt_mma_fetch_tile<HS>(k_own, pt_mma_qkv_head(qkv, s, blk, HS, 1), stride, blk.r0, s.T, tid);
    pt_mma_fetch_tile<HS>(v_own, pt_mma_qkv_head(qkv, s, blk, HS, 2), stride, blk.r0, s.T, tid);
    pt_cp_async_commit();
    fetch_queries(0, blk.r0);
    pt_cp_async_wait<1>(); /* K and V */
    pt_block_sync();
    uint32_t k[HS / 16][4], v[HS / 16][4];
    pt_mma_warp_rows<HS>(k, k_own, l);
    pt_mma_warp_rows<HS>(v, v_own, l);
    pt_mma_rows_cols rc = {{blk.r0 + l.warp * 16 + l.g, blk.r0 + l.warp * 16 + l.g + 8}, true};
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int i0 = blk.r0, which = 0; i0 < s.T; i0 += PT_MMA_TILE, which = 1 - which) {
        /* queries i ≥ j ≥ r0 */
        const uint16_t *q_tile = pt_mma_buffer_tile<HS>(shared, which, 0),
                       *do_tile = pt_mma_buffer_tile<HS>(shared, which, 1);
        const float *L_tile = rows + 2 * which * PT_MMA_TILE, *D_tile = L_tile + PT_MMA_TILE;
        pt_block_sync();
        if (i0 + PT_MMA_TILE < s.T) {
            fetch_queries(1 - which, i0 + PT_MMA_TILE);
            pt_cp_async_wait<1>();
        } else {
            pt_cp_async_wait<0>();
        }
        pt_block_sync();
        float p[PT_MMA_TILE / 8][4], ds[PT_MMA_TILE / 8][4]; /* Pᵀ and dSᵀ: rows keys, columns queries */
        pt_mma_times_rows<HS>(p, k, q_tile, l);
        pt_mma_times_rows<HS>(ds, v, do_tile, l);
        for (int n = 0; n < PT_MMA_TILE / 8; n++)
            for (int e = 0; e < 4; e++) {
                const int c = pt_mma_column(n, e, l);
                p[n][e] = pt_mma_causal(rc, e >> 1, i0 + c, s.T)
                              ? exp2f(p[n][e] * s.scale_log2 - L_tile[c])
                              : 0.0f;
                ds[n][e] = p[n][e] * (ds[n][e] - D_tile[c]);
            }
        pt_mma_accumulate<HS>(dv, p, do_tile, l);
        pt_mma_accumulate<HS>(dk, ds, q_tile, l);
    }
    for (int r = 0; r < 2; r++) {
        if (rc.row[r] >= s.T) continue;
        Gradient *dk_dst = pt_mma_qkv_head(dqkv, s, blk, HS, 1) + (size_t)rc.row[r] * stride;
        Gradient *dv_dst = dk_dst + s.C;
        for (int d = 0; d < HS / 8; d++)
            for (int e = 2 * r; e < 2 * r + 2; e++) {
                const int c = pt_mma_column(d, e, l);
                pt_mma_store_gradient(&dk_dst[c], dk[d][e] * s.scale);
                pt_mma_store_gradient(&dv_dst[c], dv[d][e]);
            }
    }
}

#endif
