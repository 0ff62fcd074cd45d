/* The SiLU-times-up product between a SwiGLU MLP's GEMMs, forward and backward, one kernel each.
 *
 * gate, up, out, grad, dgate, dup: contiguous tensors of n elements of `dtype`.
 *   forward:  out = silu(gate) * up                          (fp32 arithmetic, one rounding)
 *   backward: dgate = grad * up * s * (1 + gate * (1 - s)),  dup = grad * silu(gate),
 *             s = sigmoid(gate)
 *
 * The clamped variant (DeepSeek-V4's SwiGLU, limit L >= 0, rounded to `dtype` as torch.clamp
 * rounds its bound): g = min(gate, L), u = clamp(up, -L, L) (NaN passes through, as in torch);
 *   forward:  out = silu(g) * u
 *   backward: dgate = [gate <= L] * grad * u * s * (1 + g * (1 - s)),
 *             dup = [-L <= up <= L] * grad * silu(g),  s = sigmoid(g)
 * (the gradient of torch.clamp: passed where min <= x <= max, bounds included).
 */
#ifndef OPSLOT_KERNELS_SWIGLU_H_
#define OPSLOT_KERNELS_SWIGLU_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

OPSLOT_API int opslot_silu_mul_fwd(int dtype, int64_t n, const void* gate, const void* up,
                                   void* out, void* stream);
OPSLOT_API int opslot_silu_mul_bwd(int dtype, int64_t n, const void* gate, const void* up,
                                   const void* grad, void* dgate, void* dup, void* stream);
OPSLOT_API int opslot_silu_mul_clamped_fwd(int dtype, int64_t n, const void* gate, const void* up,
                                           float limit, void* out, void* stream);
OPSLOT_API int opslot_silu_mul_clamped_bwd(int dtype, int64_t n, const void* gate, const void* up,
                                           const void* grad, float limit, void* dgate, void* dup,
                                           void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_SWIGLU_H_ */
