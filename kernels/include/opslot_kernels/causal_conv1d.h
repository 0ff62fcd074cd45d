/* Depthwise causal conv1d (Qwen3.5 Gated DeltaNet's `causal_conv1d_fn` / `causal_conv1d_update`),
 * forward, backward and the one-step decode update.
 *
 * Tensors x, out, grad, dx are [B, C, T] (batch, channels, time), each addressed through its own
 * element strides `{batch, channel, time}` (a host array of 3 int64): upstream passes
 * `mixed_qkv.transpose(1, 2)`, a view with channel stride 1, and it is read in place. weight is
 * [C, W] contiguous (2 <= W <= 4), bias [C] contiguous or NULL; each is float32 or x's dtype
 * (weight_dtype / bias_dtype). All arithmetic is fp32, each output element rounded once:
 *
 *   pre[b,c,t] = bias[c] + sum_{j<W} weight[c,j] * x[b,c,t-(W-1)+j]   (x before the start = 0)
 *   out        = silu(pre) if silu else pre
 *
 * Packed sequences: cu_seqlens (device memory, int32 or int64 by cu_seqlens_int64, num_segments + 1
 * entries, 0 = cu[0] <= ... <= cu[N] = T, B == 1) makes each [cu[i], cu[i+1]) its own sequence. It
 * is read on the device only (binary search per warp run and per sequence start met); a malformed
 * array gives unspecified values but never an out-of-bounds access.
 *
 * Backward: dx (x's dtype, own strides), dweight [C, W] (weight_dtype), dbias [C] (bias_dtype;
 * NULL: not written) from grad (x's dtype, own strides); silu' from pre recomputed from x (nothing
 * is saved by the forward). dweight/dbias are deterministic (bitwise equal across runs on a
 * device): each block adds its 4 warps in a fixed order into one fp32 partial row [W + 1][C] of
 * `scratch` (sized by opslot_causal_conv1d_bwd_scratch_floats, which depends on the device's SM
 * count and the kernel's occupancy), and a second kernel adds the rows in order. No atomics.
 *
 * Work layout: a warp's 32 lanes hold 32 consecutive channel vectors of one time step and walk a
 * run of time steps (ascending forward; descending backward, carrying the next W-1 gradients), the
 * W-1 previous inputs in registers; each lane streams its rows through a private shared-memory ring
 * filled by cp.async, 8 to 16 rows ahead. Vectors: 16 bytes forward (8 channels of a 16-bit dtype,
 * 4 of fp32), 8 bytes backward (more live registers per channel), when the channel stride is 1 and
 * every row start of every tensor is aligned to the vector; else one channel per lane (any strides,
 * e.g. a contiguous [B, C, T]: correct, not coalesced). A last partial vector (C not a multiple of
 * the vector, aligned rows) goes element by element. The grid is at most two full resident waves of
 * equal blocks (4 warps x run x 32 vectors).
 *
 * Memory traffic per pass (s = sizeof(dtype), N = B*C*T; the halo rows come from L1/L2):
 *   forward : reads x once (N*s) + W-1 halo rows per warp run (>= 32 rows), writes out (N*s)
 *             -> 2*N*s
 *   backward: reads x (N*s) and grad (N*s) once + 2(W-1) / W-1 halo rows per run, writes dx
 *             (N*s), plus 4*(W+1)*C*rows bytes of partial sums written and read again
 *             -> 3*N*s (+ ~1%)
 *   Qwen3.5 (B=2, T=4096, C=8192, W=4, bf16): forward 268 MB, backward 403 MB + 2 x 2.6 MB (16 rows
 *   on an H200).
 *
 * Relayout (opslot_causal_conv1d_relayout): dst[b, c, t] = src[b, c, t] for any two layouts (own
 * strides, x's dtype), bit-exact. The backward reads x, grad and dx in one layout (the vector path
 * needs all three channels-contiguous); a gradient in another layout (e.g. a contiguous [B, C, T]
 * against upstream's channels-last x) is first put into x's layout by this pass: 64 x 64 tiles
 * through shared memory, coalesced on both sides (2*N*s bytes; torch's strided copy_ of a
 * transposed view reads one 32-byte sector per 2-byte element).
 *
 * Decode update (opslot_causal_conv1d_update, upstream `causal_conv1d_update`): conv_state
 * [B, C, S] (S >= W-1, x's dtype, own strides) holds the last S inputs; out = the conv over
 * cat(state, x) along time, its last T positions; then conv_state = the last S columns of
 * cat(state, x), in place. One thread per (batch, channel) walks its T steps (decode has T = 1).
 *
 * Limits: T < 2^31 - 64. Empty inputs launch nothing (the backward with B*T == 0 and C > 0 still
 * writes zero dweight/dbias).
 */
#ifndef OPSLOT_KERNELS_CAUSAL_CONV1D_H_
#define OPSLOT_KERNELS_CAUSAL_CONV1D_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

OPSLOT_API int opslot_causal_conv1d_fwd(int dtype, int64_t batch, int64_t channels, int64_t seqlen,
                                        int width, const void* x, const int64_t* x_strides,
                                        int weight_dtype, const void* weight, int bias_dtype,
                                        const void* bias, const void* cu_seqlens,
                                        int cu_seqlens_int64, int64_t num_segments, int silu,
                                        void* out, const int64_t* out_strides, void* stream);

/* Floats of fp32 scratch opslot_causal_conv1d_bwd needs for these arguments on the current device
 * (0 for an empty input; -1 with opslot_last_error() on invalid arguments). */
OPSLOT_API int64_t opslot_causal_conv1d_bwd_scratch_floats(int dtype, int64_t batch,
                                                           int64_t channels, int64_t seqlen,
                                                           int width);

OPSLOT_API int opslot_causal_conv1d_bwd(
    int dtype, int64_t batch, int64_t channels, int64_t seqlen, int width, const void* x,
    const int64_t* x_strides, const void* grad, const int64_t* grad_strides, int weight_dtype,
    const void* weight, int bias_dtype, const void* bias, const void* cu_seqlens,
    int cu_seqlens_int64, int64_t num_segments, int silu, void* dx, const int64_t* dx_strides,
    void* dweight, void* dbias, float* scratch, int64_t scratch_floats, void* stream);

OPSLOT_API int opslot_causal_conv1d_relayout(int dtype, int64_t batch, int64_t channels,
                                             int64_t seqlen, const void* src,
                                             const int64_t* src_strides, void* dst,
                                             const int64_t* dst_strides, void* stream);

OPSLOT_API int opslot_causal_conv1d_update(int dtype, int64_t batch, int64_t channels,
                                           int64_t seqlen, int width, const void* x,
                                           const int64_t* x_strides, void* conv_state,
                                           int64_t state_len, const int64_t* state_strides,
                                           int weight_dtype, const void* weight, int bias_dtype,
                                           const void* bias, int silu, void* out,
                                           const int64_t* out_strides, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_CAUSAL_CONV1D_H_ */
