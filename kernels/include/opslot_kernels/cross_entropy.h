/* Cross-entropy over rows of logits: the loss of each row and, optionally, the gradient of the
 * logits, in one kernel that reads each row twice (statistics, then gradient) and writes it once.
 *
 * Used by opslot's `cuda` implementations of `cross_entropy_loss/causal` (per chunk of tokens,
 * between cuBLAS GEMMs: the logits tile is overwritten in place by its gradient) and
 * `cross_entropy_loss/sequence_classification` (on given logits, gradient into its own buffer).
 * See docs/kernels.md, "Cross-entropy".
 */
#ifndef OPSLOT_KERNELS_CROSS_ENTROPY_H_
#define OPSLOT_KERNELS_CROSS_ENTROPY_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For each of `rows` rows of `logits` ([rows, vocab], element stride 1, row stride `ld_logits`,
 * `dtype`), with t = targets[r] (int64):
 *   row_loss[r] = logsumexp(x) - x[t]   (fp32 math; 0 when t == ignore_index; NaN when t is
 *                                         outside [0, vocab), where PyTorch raises a device assert)
 * and, when `grad` is not NULL ([rows, vocab], row stride `ld_grad`, same dtype; it may be `logits`
 * itself, same row stride, for an in-place gradient):
 *   grad[r, :] = (softmax(x) - onehot(t)) * (*grad_scale)   (0 for ignored rows, NaN for targets
 *                                                            out of range), rounded to `dtype`.
 * `grad_scale` is a device pointer to one fp32 value (e.g. 1 / number of counted tokens), read on
 * the device: no host synchronisation. rows == 0 is a no-op; vocab must be >= 1. */
OPSLOT_API int opslot_ce_rows(const void* logits, int64_t ld_logits, void* grad, int64_t ld_grad,
                              int64_t rows, int64_t vocab, int dtype, const int64_t* targets,
                              int64_t ignore_index, const float* grad_scale, float* row_loss,
                              void* stream);

/* x[i] = x[i] * (*factor) for i < n (contiguous, `dtype`), in fp32 math; `factor` is a device
 * pointer to one fp32 value. Scales gradients computed in the forward by the incoming gradient. */
OPSLOT_API int opslot_ce_scale_inplace(void* x, int64_t n, int dtype, const float* factor,
                                       void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_CROSS_ENTROPY_H_ */
