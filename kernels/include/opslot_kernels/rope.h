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

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_ROPE_H_ */
