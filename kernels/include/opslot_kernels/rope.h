/* Rotary position embedding (HF `apply_rotary_pos_emb`, rotate_half convention), full or partial,
 * forward and backward, for q and k in one launch.
 *
 * Each of q and k is a tensor of three outer dimensions and a contiguous head dimension of
 * `head_dim` elements, read and written through strides (HF passes transposed views of the
 * projections; nothing is copied). cos and sin have `rotary_dim` (even, <= head_dim) contiguous
 * features and are addressed per tensor through their own (broadcast, possibly 0) strides over the
 * same three outer dimensions. Features past rotary_dim are copied through.
 *
 * meta: 2 tensors (q, then k) x 15 int64: shape[3], in_stride[3], out_stride[3], cos_stride[3],
 * sin_stride[3] (elements). Forward: in = q/k, out = q_embed/k_embed:
 *   out[i] = x[i] cos[i] - x[i+h] sin[i],  out[i+h] = x[i+h] cos[i+h] + x[i] sin[i+h]
 *   (h = rotary_dim / 2)
 * Backward (backward != 0): in = the gradient of the output, out = the gradient of the input
 * (the transpose: out[i] = g[i] cos[i] + g[i+h] sin[i+h],
 *                 out[i+h] = g[i+h] cos[i+h] - g[i] sin[i]).
 * q/k and their outputs have `dtype`; cos and sin have `cs_dtype` (the same, or float32). k may be
 * absent (k_in == NULL). All arithmetic is fp32, each output element rounded once.
 *
 * Two more layouts share the kernel, each its own entry point with opslot_rope's arguments but
 * rotary_dim (both rotate the whole head dimension, head_dim even, no pass-through) and the same
 * meta array:
 *
 * opslot_rope_interleaved: DeepSeek-V3's `apply_rotary_pos_emb_interleave`. The input holds the
 * rotary dimensions in interleaved pairs (x[2i], x[2i+1]); the output is de-interleaved. Only the
 * first head_dim/2 features of cos and sin are read (upstream: `cos[..., :cos.shape[-1] // 2]`);
 * cos/sin have at least that many contiguous features. With h = head_dim / 2 and i < h:
 *   forward  out[i] = x[2i] cos[i] - x[2i+1] sin[i],  out[i+h] = x[2i+1] cos[i] + x[2i] sin[i]
 *   backward (in = the gradient of the output, de-interleaved; out = the gradient of the input,
 *            interleaved): out[2i] = g[i] cos[i] + g[i+h] sin[i],
 *                          out[2i+1] = g[i+h] cos[i] - g[i] sin[i]
 * fp32 arithmetic, each output element rounded once (as opslot_rope).
 *
 * opslot_rope_vision: the vision towers' `apply_rotary_pos_emb_vision` (Qwen2-VL, Qwen2.5-VL,
 * Qwen3-VL, Qwen3-VL-MoE): opslot_rope's rotation of the whole head dimension with upstream's fp32
 * arithmetic operation by operation: every product and sum rounded to fp32 (never contracted into
 * a fused multiply-add), then the result rounded once to `dtype`:
 *   forward  out[i] = (x[i] cos[i]) - (x[i+h] sin[i]),  out[i+h] = (x[i+h] cos[i+h]) + (x[i]
 * sin[i+h]) backward out[i] = (g[i] cos[i]) + (g[i+h] sin[i+h]), out[i+h] = (g[i+h] cos[i+h]) -
 * (g[i] sin[i]) which is what upstream's `q.float()`, `(q * cos) + (rotate_half(q) * sin)`,
 * `.to(dtype)` and its autograd compute, bit for bit.
 *
 * opslot_rope_deepseek_v4: DeepSeek-V4's `apply_rotary_pos_emb`, on one tensor (q_in/q_out; no k):
 * the last rotary_dim features of each row, in interleaved pairs (x[n+2i], x[n+2i+1]) with
 * n = head_dim - rotary_dim, are turned in place by cos[i], sin[i] (cos/sin hold rotary_dim / 2
 * features, one per pair: upstream's half-width cos before its `repeat_interleave(2)`); the first n
 * features pass through. The meta array's first 15 entries describe the tensor (k's are not read).
 * Upstream's rounding, with r(.) = rounded to fp32 and R(.) = rounded to `dtype`:
 *   forward  out[n+2i] = R(r(r(x[n+2i] c) - r(x[n+2i+1] s))), out[n+2i+1] = R(r(r(x[n+2i+1] c) +
 *            r(x[n+2i] s)))   (`(rope.float() * cos + rotate_half(rope).float() * sin).to(dtype)`)
 *   backward out[n+2i] = R(r(R(r(g[n+2i] c)) + R(r(g[n+2i+1] s)))), out[n+2i+1] =
 *            R(r(R(r(g[n+2i+1] c)) - R(r(g[n+2i] s))))   (its autograd: the cast of each
 *            product's gradient back to `dtype`, then their sum)
 * which is upstream's result bit for bit (the pass-through gradient aside: upstream adds 0 to it,
 * turning -0 into +0; here it is copied).
 */
#ifndef OPSLOT_KERNELS_ROPE_H_
#define OPSLOT_KERNELS_ROPE_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

OPSLOT_API int opslot_rope(int backward, int dtype, int cs_dtype, int64_t head_dim,
                           int64_t rotary_dim, const void* cos, const void* sin, const void* q_in,
                           void* q_out, const void* k_in, void* k_out, const int64_t* meta,
                           void* stream);

OPSLOT_API int opslot_rope_interleaved(int backward, int dtype, int cs_dtype, int64_t head_dim,
                                       const void* cos, const void* sin, const void* q_in,
                                       void* q_out, const void* k_in, void* k_out,
                                       const int64_t* meta, void* stream);

OPSLOT_API int opslot_rope_vision(int backward, int dtype, int cs_dtype, int64_t head_dim,
                                  const void* cos, const void* sin, const void* q_in, void* q_out,
                                  const void* k_in, void* k_out, const int64_t* meta, void* stream);

OPSLOT_API int opslot_rope_deepseek_v4(int backward, int dtype, int cs_dtype, int64_t head_dim,
                                       int64_t rotary_dim, const void* cos, const void* sin,
                                       const void* x_in, void* x_out, const int64_t* meta,
                                       void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_ROPE_H_ */
