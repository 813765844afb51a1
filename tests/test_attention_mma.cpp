/* The tensor-core attention kernels' bodies (kernels/cuda/attention_mma.cuh) run
 * on the emulated device (tests/cuda_host: each thread a fiber, the warp's mma,
 * ldmatrix and cp.async by their documented semantics in
 * tests/cuda_host/include/kernels/cuda/mma_primitives.cuh), against the CPU backend's fp32
 * attention on the same bf16 inputs (itself checked against finite
 * differences in test_kernels.c). On a GPU test_cuda runs the same bodies on
 * the hardware; this suite checks their indexing, causal masks, online
 * softmax, fragment layouts and barriers on every CI run, without one.
 *
 * Tolerances. The kernels round to bf16 (unit roundoff u = 2⁻⁸) what the CPU
 * keeps in fp32: P before P·V, and in the backward dO, P and dS.
 *   forward   out = Σ p̃ⱼvⱼ / Σ pⱼ with |p̃ⱼ − pⱼ| ≤ u·pⱼ, so |out − ref| ≤ u·max|v|
 *             for every element (a bound, not a statistic); lse has no rounding
 *             beyond fp32 sums (1e-5).
 *   exact     q = 0: every score is 0, so every p = 2⁰ = 1 exactly and out is
 *             the plain mean of v over j ≤ i: fp32 agreement (1e-5), which an
 *             off-by-one in the mask (±|v|/i ≥ 1e-3 at T = 200) cannot meet.
 *   bf16 out  the kernels writing bf16 (attention_forward_bf16_to_bf16 and _backward_)
 *             give, element by element, the rounding of their fp32 out and of the gradient
 *             they add into zeros.
 *   backward  each gradient element is a sum of products with two or three
 *             rounded factors: independent errors of ≤ u each, so the error of
 *             a sum of n terms is ~u·rms(term)·√n against a sum of size
 *             ~rms(term)·√n for random signs; normwise 2⁻⁶ (4u) holds with room
 *             (measured: below 2⁻⁸), and a wrong layout or mask errs by ~100%.
 */
#include <criterion/criterion.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_host.hpp"
#include "kernels/cuda/mma_primitives.cuh" /* the emulated device's (tests/cuda_host/include) */

#include "kernels/cuda/attention_mma.cuh"
#include "tests/bf16_bits.h"

extern "C" {
#include "kernels/kernels.h"
}

using std::vector;

namespace {

float bf16_to_float(uint16_t bits) { return pt_bf16_bits_widen(bits); }
uint16_t float_to_bf16(float x) { return pt_bf16_bits_round(x); }

/* body(block, thread, dynamic shared memory) on every thread of `blocks` one-dimensional blocks
 * of `threads`, with the launch limits the device has (shared memory above 48 KiB opted into, at
 * most an H100's 227 KiB); a fault, deadlock or refused launch fails the test. */
template <class Body> void launch(int blocks, int threads, size_t shared_bytes, Body body)
{
    static const char kernel = 0; /* the limit's key: one for each body */
    if (shared_bytes > 48 * 1024) cuda_host::set_max_dynamic_shared(&kernel, (int)shared_bytes);
    cuda_host::launch(
        &kernel,
        [&] {
            body((int)blockIdx.x, (int)threadIdx.x,
                 static_cast<unsigned char *>(cuda_host::dynamic_shared()));
        },
        dim3((unsigned)blocks), dim3((unsigned)threads), shared_bytes);
    const int error = cuda_host::take_error();
    if (error) cr_assert_fail("emulated device: error %d: %s", error, cuda_host::error_message());
}

struct inputs {
    int B, T, C, NH;
    vector<uint16_t> qkv16; /* bf16 bits */
    vector<float> qkv;      /* the same values, exactly widened */
    vector<float> dout;     /* fp32, as the model hands it */
    vector<float> dqkv;     /* what the gradient held before: the kernels add */
};

uint64_t rng = 0x2545f4914f6cdd1dull;
float uniform(float lo, float hi)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 11) * 0x1.0p-53);
}

inputs make_inputs(int B, int T, int C, int NH, bool zero_q)
{
    inputs in{B, T, C, NH, {}, {}, {}, {}};
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    in.qkv16.resize(n_qkv), in.qkv.resize(n_qkv), in.dout.resize(n_out), in.dqkv.resize(n_qkv);
    for (size_t i = 0; i < n_qkv; i++) {
        const bool is_q = (i % (3 * (size_t)C)) < (size_t)C;
        in.qkv16[i] = float_to_bf16(zero_q && is_q ? 0.0f : uniform(-2, 2));
        in.qkv[i] = bf16_to_float(in.qkv16[i]);
        in.dqkv[i] = uniform(-1, 1);
    }
    for (float &x : in.dout) x = uniform(-1, 1);
    return in;
}

pt_mma_shape shape_of(const inputs &in)
{
    const float hs = (float)(in.C / in.NH);
    return pt_mma_shape{in.B, in.T, in.C, in.NH, 1.0f / std::sqrt(hs),
                        1.4426950408889634f / std::sqrt(hs)};
}

int blocks_of(const inputs &in) { return in.B * in.NH * ((in.T + PT_MMA_ROWS - 1) / PT_MMA_ROWS); }

struct result {
    vector<float> out, lse, o_saved, dqkv;
    vector<float> dqkv_from_zero;  /* the fp32 kernels' gradient added into zeros */
    vector<uint16_t> dqkv_bf16;    /* the same kernels writing a bf16 dqkv */
    vector<uint16_t> out_bf16;     /* the forward writing a bf16 out */
};

template <int HS> result run_kernels(const inputs &in, bool with_bf16_gradient = false)
{
    const pt_mma_shape s = shape_of(in);
    const size_t n_out = in.dout.size(), n_rows = (size_t)in.B * in.NH * in.T;
    result r{vector<float>(n_out), vector<float>(n_rows), vector<float>(n_out), in.dqkv,
             vector<float>(in.dqkv.size(), 0.0f), vector<uint16_t>(in.dqkv.size(), 0x7fc0),
             vector<uint16_t>(n_out, 0x7fc0)};
    launch(blocks_of(in), PT_MMA_THREADS, pt_mma_forward_shared_bytes<HS>(),
                          [&](int block, int tid, unsigned char *shared) {
                              pt_mma_attention_forward<HS>(r.out.data(), r.lse.data(),
                                                           r.o_saved.data(), in.qkv16.data(), s,
                                                           block, tid, shared);
                          });
    /* D = rowsum(dO ⊙ O) per (b, h, t) and dO rounded to bf16, by the kernels' pt_mma_delta_row
     * (a warp a row), against a serial sum and the rounding of each value */
    vector<float> delta(n_rows, NAN);
    vector<uint16_t> dout16(n_out, 0x7fc0);
    constexpr int warps = 8;
    launch((int)((n_rows + warps - 1) / warps), 32 * warps, 0,
                          [&](int block, int tid, unsigned char *) {
                              const int row = block * warps + tid / 32;
                              if ((size_t)row < n_rows)
                                  pt_mma_delta_row<HS>(delta.data(), dout16.data(), in.dout.data(),
                                                       r.o_saved.data(), s, row, tid % 32);
                          });
    for (int b = 0; b < in.B; b++)
        for (int t = 0; t < in.T; t++)
            for (int h = 0; h < in.NH; h++) {
                const size_t row = ((size_t)b * in.T + t) * in.C + (size_t)h * HS;
                double serial = 0.0;
                for (int d = 0; d < HS; d++) {
                    serial += (double)in.dout[row + d] * r.o_saved[row + d];
                    if (dout16[row + d] != float_to_bf16(in.dout[row + d]))
                        cr_assert_fail("dO[%zu] not rounded to its nearest bf16", row + d);
                }
                const float got = delta[((size_t)b * in.NH + h) * in.T + t];
                if (!(std::fabs(got - serial) <= 1e-5 * (std::fabs(serial) + 1.0)))
                    cr_assert_fail("D[b %d, h %d, t %d] = %.8g, the serial sum %.8g", b, h, t, got,
                                   serial);
            }
    auto backward = [&](auto *dqkv) {
        launch(blocks_of(in), PT_MMA_THREADS, pt_mma_dq_shared_bytes<HS>(),
                              [&](int block, int tid, unsigned char *shared) {
                                  pt_mma_attention_dq<HS>(dqkv, dout16.data(), in.qkv16.data(),
                                                          r.lse.data(), delta.data(), s, block,
                                                          tid, shared);
                              });
        launch(blocks_of(in), PT_MMA_THREADS, pt_mma_dkdv_shared_bytes<HS>(),
                              [&](int block, int tid, unsigned char *shared) {
                                  pt_mma_attention_dkdv<HS>(dqkv, dout16.data(), in.qkv16.data(),
                                                            r.lse.data(), delta.data(), s, block,
                                                            tid, shared);
                              });
    };
    backward(r.dqkv.data());
    if (with_bf16_gradient) {
        vector<float> lse(n_rows), o_saved(n_out);
        launch(blocks_of(in), PT_MMA_THREADS, pt_mma_forward_shared_bytes<HS>(),
                              [&](int block, int tid, unsigned char *shared) {
                                  pt_mma_attention_forward<HS>(r.out_bf16.data(), lse.data(),
                                                               o_saved.data(), in.qkv16.data(), s,
                                                               block, tid, shared);
                              });
        backward(r.dqkv_from_zero.data());
        backward(r.dqkv_bf16.data());
    }
    return r;
}

/* The CPU backend's fp32 attention on the widened values. */
result reference(const inputs &in)
{
    const pt_kernels *cpu = pt_kernels_cpu();
    result r{vector<float>(in.dout.size()), {}, {}, in.dqkv, {}, {}, {}};
    vector<float> att(cpu->attention_saved_floats(in.B, in.T, in.C, in.NH));
    cpu->attention_forward(r.out.data(), att.data(), in.qkv.data(), in.B, in.T, in.C, in.NH);
    cpu->attention_backward(r.dqkv.data(), in.dout.data(), in.qkv.data(), att.data(), in.B, in.T,
                            in.C, in.NH);
    return r;
}

/* L[i] = log₂ Σ_{j≤i} 2^(scale_log2 · q_i·k_j), in double. */
double reference_lse(const inputs &in, int b, int h, int i)
{
    const int hs = in.C / in.NH;
    const float *q = &in.qkv[((size_t)b * in.T + i) * 3 * in.C + (size_t)h * hs];
    double sum = 0.0;
    for (int j = 0; j <= i; j++) {
        const float *k = &in.qkv[((size_t)b * in.T + j) * 3 * in.C + in.C + (size_t)h * hs];
        double dot = 0.0;
        for (int d = 0; d < hs; d++) dot += (double)q[d] * k[d];
        sum += std::exp2(dot * 1.4426950408889634 / std::sqrt((double)hs));
    }
    return std::log2(sum);
}

double max_abs(const vector<float> &x)
{
    double m = 0.0;
    for (float v : x) m = std::fmax(m, std::fabs(v));
    return m;
}

/* Normwise ‖got − want‖ / ‖want − before‖ over the elements that `part` (0 q, 1 k, 2 v) of
 * dqkv holds, or over all of x when part < 0: the change the kernels made against the
 * change they should have made. */
double relative_error(const vector<float> &got, const vector<float> &want,
                      const vector<float> &before, int C, int part)
{
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        if (part >= 0 && (int)(i % (3 * (size_t)C) / C) != part) continue;
        const double change = want[i] - (before.empty() ? 0.0 : before[i]);
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += change * change;
    }
    return std::sqrt(err / norm);
}

template <int HS> void check(int B, int T, int NH, bool with_bf16_gradient = false)
{
    const int C = HS * NH;
    const inputs in = make_inputs(B, T, C, NH, false);
    const result got = run_kernels<HS>(in, with_bf16_gradient), want = reference(in);
    const double bound = std::ldexp(1.0, -8) * max_abs(in.qkv) + 1e-5;
    for (size_t i = 0; i < want.out.size(); i++)
        if (!(std::fabs(got.out[i] - want.out[i]) <= bound))
            cr_assert_fail("HS %d T %d: out[%zu] = %.7g, the CPU %.7g (bound %.3g)", HS, T, i,
                     got.out[i], want.out[i], bound);
    cr_expect(got.o_saved == got.out, "the saved copy of out is out");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double L = reference_lse(in, b, h, i);
                const float kernel = got.lse[((size_t)b * NH + h) * T + i];
                if (!(std::fabs(kernel - L) <= 1e-5 * (std::fabs(L) + 1)))
                    cr_assert_fail("HS %d T %d: lse[%d][%d][%d] = %.7g, want %.7g", HS, T, b, h, i,
                             kernel, L);
            }
    const char *names[] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        const double rel = relative_error(got.dqkv, want.dqkv, in.dqkv, C, part);
        std::printf("HS %d B %d T %d NH %d: %s relative error %.2e\n", HS, B, T, NH, names[part], rel);
        cr_expect(rel <= std::ldexp(1.0, -6), "HS %d T %d: %s relative error %.3g over 2^-6", HS,
                  T, names[part], rel);
    }
    if (!with_bf16_gradient) return;
    /* the forward writing a bf16 out: the rounding of its fp32 out, every element */
    for (size_t i = 0; i < got.out_bf16.size(); i++)
        if (got.out_bf16[i] != float_to_bf16(got.out[i]))
            cr_assert_fail("HS %d T %d: bf16 out[%zu] = 0x%04x, the fp32 out %.9g rounds to 0x%04x",
                           HS, T, i, got.out_bf16[i], got.out[i],
                           float_to_bf16(got.out[i]));
    /* written in bf16: every element (none left NaN) the rounding of the fp32 gradient */
    for (size_t i = 0; i < got.dqkv_bf16.size(); i++)
        if (got.dqkv_bf16[i] != float_to_bf16(got.dqkv_from_zero[i]))
            cr_assert_fail("HS %d T %d: bf16 dqkv[%zu] = 0x%04x, the fp32 gradient %.9g rounds to "
                           "0x%04x", HS, T, i, got.dqkv_bf16[i], got.dqkv_from_zero[i],
                           float_to_bf16(got.dqkv_from_zero[i]));
}

} // namespace

Test(attention_mma, forward_and_backward_match_the_fp32_kernel_at_head_size_64, .timeout = 600)
{
    check<64>(2, 200, 2, true); /* T past three tiles, not a multiple of 64; a bf16 dqkv too */
    check<64>(1, 64, 1);  /* exactly one tile */
}

Test(attention_mma, forward_and_backward_match_the_fp32_kernel_at_head_size_32, .timeout = 600)
{
    check<32>(1, 100, 3, true); /* the default model's head size; a second tile of 36 rows */
}

Test(attention_mma, forward_and_backward_match_the_fp32_kernel_at_head_size_128, .timeout = 600)
{
    check<128>(1, 70, 1, true); /* a second tile of 6 rows */
}

Test(attention_mma, uniform_scores_give_the_exact_mean_of_v, .timeout = 600)
{
    const int B = 1, T = 200, NH = 2, C = 64 * NH;
    const inputs in = make_inputs(B, T, C, NH, true);
    const result got = run_kernels<64>(in);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double mean = 0.0;
            for (int j = 0; j <= t; j++) mean += in.qkv[(size_t)j * 3 * C + 2 * C + c];
            mean /= t + 1;
            const float kernel = got.out[(size_t)t * C + c];
            if (!(std::fabs(kernel - mean) <= 1e-5 * (std::fabs(mean) + 1)))
                cr_assert_fail("out[%d][%d] = %.7g, the mean of v over j <= %d is %.7g", t, c, kernel,
                         t, mean);
        }
}

Test(attention_mma, the_emulated_mma_is_a_matrix_product)
{
    /* The emulated device's own check: one warp multiplies A (16×16) by B (16×16, two 8-column
     * blocks), each lane loading its registers from shared tiles by attention_mma.cuh's
     * fragment loaders (ldmatrix), against the product computed directly. */
    constexpr int HS = 64, N = 16;
    vector<uint16_t> a_tile(64 * pt_mma_stride<HS>), b_tile(64 * pt_mma_stride<HS>);
    for (uint16_t &x : a_tile) x = float_to_bf16(uniform(-1, 1));
    for (uint16_t &x : b_tile) x = float_to_bf16(uniform(-1, 1));
    /* away from the tiles' corners: row and column offsets as the kernels use them */
    const int a_row = 16, a_k = 32, b_n = 24, b_k = 16;
    vector<float> d(16 * N), d_cols(16 * N);
    launch(1, 32, 0, [&](int, int tid, unsigned char *) {
        const pt_mma_lane l = pt_mma_lane_of(tid);
        uint32_t a[4], b[4], b2[4];
        pt_mma_a_fragment<HS>(a, a_tile.data(), a_row, a_k, l);
        pt_mma_b_of_rows<HS>(b, b_tile.data(), b_n, b_k, l);     /* B[k][n] = b_tile[n][k] */
        pt_mma_b_of_columns<HS>(b2, b_tile.data(), b_k, b_n, l); /* B[k][n] = b_tile[k][n] */
        float acc[2][4] = {}, acc2[2][4] = {};
        pt_mma_bf16_pair(acc[0], acc[1], a, b);
        pt_mma_bf16_pair(acc2[0], acc2[1], a, b2);
        for (int half = 0; half < 2; half++)
            for (int e = 0; e < 4; e++) {
                const int row = l.g + 8 * (e >= 2), col = pt_mma_column(half, e, l);
                d[row * N + col] = acc[half][e];
                d_cols[row * N + col] = acc2[half][e];
            }
    });
    const int S = pt_mma_stride<HS>;
    auto at = [&](const vector<uint16_t> &t, int r, int c) {
        return bf16_to_float(t[r * S + c]);
    };
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < N; n++) {
            double rows = 0.0, cols = 0.0;
            for (int k = 0; k < 16; k++) {
                const double x = at(a_tile, a_row + i, a_k + k);
                rows += x * at(b_tile, b_n + n, b_k + k);
                cols += x * at(b_tile, b_k + k, b_n + n);
            }
            cr_expect(std::fabs(d[i * N + n] - rows) <= 1e-5, "A·Bᵀ[%d][%d] = %g, want %g", i, n,
                      d[i * N + n], rows);
            cr_expect(std::fabs(d_cols[i * N + n] - cols) <= 1e-5, "A·B[%d][%d] = %g, want %g", i,
                      n, d_cols[i * N + n], cols);
        }
}
