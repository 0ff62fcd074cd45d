/* The Switch-Transformer load-balancing loss (Qwen3-MoE's load_balancing_loss_func) over the
 * per-layer router logits, without concatenating them, and its gradient w.r.t. every layer's
 * logits.
 *
 * logits: `num_layers` pointers (a host array), each [rows, num_experts] with the given row
 * strides (elements; the expert dimension contiguous), all of `dtype`. mask: NULL, or `rows`
 * fp32 weights (attention_mask flattened). With p = softmax(logits) per row (fp32), sel = the
 * top_k experts of the row (ties: the lower index), m_t the row's mask weight (1 without a mask):
 *   count_e = sum_{l,t} m_t [e in sel],  psum_e = sum_{l,t} m_t p_e,  R = sum_{l,t} m_t
 *   loss    = E * sum_e (count_e / R) * (psum_e / R)
 * The forward writes loss (one float) and coef_e = E * count_e / R^2 (E floats, for the backward);
 * `scratch` holds opslot_load_balancing_scratch_floats(...) floats. Reductions run in a fixed
 * order: results are bitwise reproducible. The backward writes, for every layer,
 *   grad_logits[t, e] = g * m_t * p_e * (coef_e - sum_j p_j coef_j)   (g = *grad_loss, on device)
 * contiguous [rows, num_experts] in `dtype`. The selection counts are not differentiated (as
 * upstream). num_experts <= 512, top_k <= num_experts.
 */
#ifndef OPSLOT_KERNELS_LOAD_BALANCING_H_
#define OPSLOT_KERNELS_LOAD_BALANCING_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

OPSLOT_API int64_t opslot_load_balancing_scratch_floats(int num_layers, int64_t rows,
                                                        int num_experts);

OPSLOT_API int opslot_load_balancing_fwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts,
                                         int top_k, const float* mask, float* scratch, float* loss,
                                         float* coef, void* stream);

OPSLOT_API int opslot_load_balancing_bwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts,
                                         const float* mask, const float* coef,
                                         const float* grad_loss, void* const* grad_logits,
                                         void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_LOAD_BALANCING_H_ */
