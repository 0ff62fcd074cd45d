/* RMSNorm (standard, offset, unweighted, unweighted_cast) and Qwen3.5's gated RMSNorm, forward and
 * backward.
 *
 * Rows of `cols` elements; each row tensor is addressed by a row stride (elements), its last
 * dimension contiguous. Outputs (y, dx, dgate) are contiguous [rows, cols]. The mathematics is
 * opslot.reference's (docs/ops.md):
 *   standard   y = w * to_x(x * r)                     (y in the promoted dtype of w and x)
 *   offset     y = to_x(x * r * (1 + w))
 *   unweighted y = to_x(x * r)
 *   unweighted_cast y = to_x(x * to_x(r))   (DeepSeek-V4: the scale rounded to x's dtype first;
 *              backward dx = to_x(to_x(r) dy - r n mean(dy n)), n = x r)
 *   gated      y = to_x(m * silu(gate)),  m = w * to_x(x * r)
 *              (m rounded to x's dtype unless w is fp32)
 * with r = rsqrt(mean(x^2) + eps), everything else in fp32. `weight` has dtype x_dtype or fp32.
 * The forward also writes r (fp32 [rows]) for the backward.
 *
 * The weight gradient is deterministic: every row group writes its fp32 partial sums to
 * `dw_partial` ([opslot_rms_norm_bwd_partial_rows(...), cols] floats, scratch from the caller), and
 * a second kernel adds them in a fixed order. Row results never depend on the number of rows.
 */
#ifndef OPSLOT_KERNELS_RMS_NORM_H_
#define OPSLOT_KERNELS_RMS_NORM_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  OPSLOT_RMS_STANDARD = 0,
  OPSLOT_RMS_OFFSET = 1,
  OPSLOT_RMS_UNWEIGHTED = 2,
  OPSLOT_RMS_GATED = 3,
  OPSLOT_RMS_UNWEIGHTED_CAST = 4,
};

/* y: [rows, cols] contiguous, dtype y_dtype (standard with an fp32 weight: fp32; else x_dtype). */
OPSLOT_API int opslot_rms_norm_fwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   float eps, const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, void* y,
                                   float* rstd, void* stream);

/* Rows of fp32 scratch (each `cols` wide) the backward needs for these arguments on the current
 * device (same arguments as opslot_rms_norm_bwd; -1 with opslot_last_error() when they are
 * invalid). */
OPSLOT_API int64_t opslot_rms_norm_bwd_partial_rows(int mode, int x_dtype, int w_dtype,
                                                    int64_t rows, int64_t cols, const void* x,
                                                    int64_t x_row_stride, const void* gate,
                                                    int64_t gate_row_stride, const void* dy,
                                                    int64_t dy_row_stride);

/* dy has the dtype of y; dx, dgate (gated only) are contiguous in x_dtype; dw (not for unweighted)
 * has w_dtype. */
OPSLOT_API int opslot_rms_norm_bwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, const float* rstd,
                                   const void* dy, int64_t dy_row_stride, void* dx, void* dgate,
                                   float* dw_partial, void* dw, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_RMS_NORM_H_ */
