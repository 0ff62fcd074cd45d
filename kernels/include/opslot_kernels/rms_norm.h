/* RMSNorm (standard, offset, unweighted) and Qwen3.5's gated RMSNorm, forward and backward.
 *
 * Rows of `cols` elements; each row tensor is addressed by a row stride (elements), its last
 * dimension contiguous. Outputs (y, dx, dgate) are contiguous [rows, cols]. The mathematics is
 * opslot.reference's (docs/ops.md):
 *   standard   y = w * to_x(x * r)                     (y in the promoted dtype of w and x)
 *   offset     y = to_x(x * r * (1 + w))
 *   unweighted y = to_x(x * r)
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

/* Benchmarks and tests only (not thread-safe; changes the row-group count, so call it between
 * runs): the number of 16-byte vectors per thread the launch geometry aims at (default 2; version 3
 * takes 1 or 2), the resident waves of their backward (default 1), and the kernel version (0, the
 * default: version 3 where it applies — 16-byte vectors, at most two per thread — else version 2
 * for the plain norms and 1 for the gated norm; 3: one block per row, the next rows copied into a
 * shared-memory ring with cp.async; 2: raw registers and the next row prefetched; 1: fp32
 * registers, one row in flight). Versions 2 and 3 fall back to 2 / 1 where they do not apply. */
OPSLOT_API int opslot_rms_norm_set_tuning(int vectors_per_thread, int bwd_waves, int variant);

/* Benchmarks only (not thread-safe): version 3's resident blocks per SM (0, the default: as many as
 * fit; -1: a forward that is not persistent, one row per block); skip_row_sums = 1, a diagnostic
 * that leaves out version 3's row sums (wrong results: it measures what the sums cost; only in a
 * library built with the CMake option OPSLOT_KERNELS_DIAGNOSTICS=ON, else OPSLOT_ERR_UNSUPPORTED);
 * backward_from_start = 1: version 3's backward takes the rows in order (the default walks them
 * from the last row, which the producer of dy wrote last). */
OPSLOT_API int opslot_rms_norm_set_experiment(int pipe_blocks_per_sm, int skip_row_sums,
                                              int backward_from_start);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_RMS_NORM_H_ */
