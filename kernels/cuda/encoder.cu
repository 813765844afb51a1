/* Token and position embeddings.
 *
 * Naive reading:
 *   forward:  out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
 *   backward: dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
 *
 * The backward is deterministic and adds in the CPU's order: dwpe[t, c] has
 * one thread that adds b = 0, 1, … in turn; a row of dwte may receive many
 * positions (repeated tokens), so token rows are owned by block groups
 * (token mod TOKEN_GROUPS) and each owner thread walks all positions in
 * order, adding those whose token it owns. No atomics, so the same inputs
 * always give the same bits. A block first lists the positions of each tile of
 * tokens that its group owns, in order (warp ballots and their counts), so that
 * its threads walk the ~1/256 of positions they add rather than all of them
 * (session 34; the same additions in the same order as before). */
#include "kernels/cuda/common.cuh"

#define TOKEN_GROUPS 256   /* owners of dwte rows: blockIdx.x = token mod TOKEN_GROUPS */
#define CHANNELS_PER_BLOCK 128
#define TOKEN_TILE 1024    /* tokens staged in shared memory at a time */
#define ENCODER_WARPS (CHANNELS_PER_BLOCK / 32)

__global__ void encoder_forward_kernel(float *out, const int32_t *tokens, const float *wte,
                                       const float *wpe, int T, int C, size_t n)
{
    /* out[B·T, C], tokens[B·T], wte[V, C], wpe[T_max, C]; n = B·T·C */
    PT_GRID_STRIDE_LOOP(i, n)
    {
        size_t position = i / C; /* b·T + t */
        int c = (int)(i % C), t = (int)(position % T);
        out[i] = wte[(size_t)tokens[position] * C + c] + wpe[(size_t)t * C + c];
    }
}

__global__ void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    /* dwpe[T_max, C] (rows [0, T) touched), dout[B·T, C]; one thread per (t, c) */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * T * C + i];
    dwpe[i] = acc;
}

/* owned[0 .. count) = the k < n, in increasing order, with tile[k] mod TOKEN_GROUPS == group;
 * every thread of the block calls it, and reads the count it returns. */
__device__ int list_owned_positions(int *owned, int *warp_counts, const int32_t *tile, int n,
                                    int group)
{
    constexpr int per_warp = TOKEN_TILE / ENCODER_WARPS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int first = warp * per_warp;
    int mine = 0; /* this warp's positions owned */
    for (int k0 = first; k0 < first + per_warp; k0 += 32) {
        const int k = k0 + lane;
        mine += __popc(__ballot_sync(0xffffffffu, k < n && tile[k] % TOKEN_GROUPS == group));
    }
    if (lane == 0) warp_counts[warp] = mine;
    __syncthreads();
    int at = 0, count = 0;
    for (int w = 0; w < ENCODER_WARPS; w++) {
        at += w < warp ? warp_counts[w] : 0;
        count += warp_counts[w];
    }
    for (int k0 = first; k0 < first + per_warp; k0 += 32) {
        const int k = k0 + lane;
        const bool owns = k < n && tile[k] % TOKEN_GROUPS == group;
        const unsigned ballot = __ballot_sync(0xffffffffu, owns);
        if (owns) owned[at + __popc(ballot & ((1u << lane) - 1u))] = k;
        at += __popc(ballot);
    }
    __syncthreads();
    return count;
}

__global__ void encoder_backward_wte_kernel(float *dwte, const float *dout, const int32_t *tokens,
                                            int N, int C)
{
    /* dwte[V, C], dout[N, C], tokens[N]; grid (TOKEN_GROUPS, C / CHANNELS_PER_BLOCK) */
    __shared__ int32_t tile[TOKEN_TILE];
    __shared__ int owned[TOKEN_TILE];
    __shared__ int warp_counts[ENCODER_WARPS];
    const int group = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    for (int n0 = 0; n0 < N; n0 += TOKEN_TILE) {
        const int count = min(TOKEN_TILE, N - n0);
        for (int k = threadIdx.x; k < count; k += blockDim.x) tile[k] = tokens[n0 + k];
        __syncthreads();
        const int n_owned = list_owned_positions(owned, warp_counts, tile, count, group);
        if (c < C)
            for (int j = 0; j < n_owned; j++) {
                const int k = owned[j];
                dwte[(size_t)tile[k] * C + c] += dout[(size_t)(n0 + k) * C + c];
            }
        __syncthreads(); /* tile, owned and warp_counts are the next tile's */
    }
}

void pt_cuda_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                             int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    PT_LAUNCH_ELEMENTWISE(encoder_forward_kernel, n, out, tokens, wte, wpe, T, C, n);
}

void pt_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                              int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    size_t tc = (size_t)T * C;
    encoder_backward_wpe_kernel<<<(unsigned)((tc + PT_CUDA_THREADS - 1) / PT_CUDA_THREADS),
                                  PT_CUDA_THREADS, 0, pt_cuda.compute>>>(dwpe, dout, B, T, C);
    PT_CUDA_LAUNCHED("encoder_backward_wpe_kernel");
    dim3 grid(TOKEN_GROUPS, pt_cuda_ceil_div(C, CHANNELS_PER_BLOCK));
    encoder_backward_wte_kernel<<<grid, CHANNELS_PER_BLOCK, 0, pt_cuda.compute>>>(dwte, dout,
                                                                                  tokens, B * T, C);
    PT_CUDA_LAUNCHED("encoder_backward_wte_kernel");
}
