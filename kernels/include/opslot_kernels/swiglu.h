/* The SiLU-times-up product between a SwiGLU MLP's GEMMs, forward and backward, one kernel each.
 *
 * gate, up, out, grad, dgate, dup: contiguous tensors of n elements of `dtype`.
 *   forward:  out = silu(gate) * up                          (fp32 arithmetic, one rounding)
 *   backward: dgate = grad * up * s * (1 + gate * (1 - s)),  dup = grad * silu(gate),
 *             s = sigmoid(gate)
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

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_SWIGLU_H_ */
