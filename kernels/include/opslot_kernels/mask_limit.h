/* One past the last column each row of an attention mask shows (DeepSeek sparse attention's
 * lightning indexer: the keys a query's scores need are those before it).
 *
 *   out[b, s] = 1 + the largest t with mask[b, s, t] shown, or 0 when the row shows none
 *
 * Shown: a bool entry that is nonzero; an additive (float) entry above its dtype's lowest finite
 * value (torch.finfo(dtype).min; that value, -inf and NaN hide a key). The mask kinds are those of
 * opslot_kernels/topk.h (OPSLOT_TOPK_MASK_*).
 *
 * Layout: mask [batch, seq, cols], element strides (batch, seq) (0 broadcasts), contiguous rows;
 * out int32 [batch, seq] contiguous. batch * seq < 2^31, cols < 2^31.
 *
 * Kernel: one warp per row, reading it backwards from its end (16-byte loads, four per lane in
 * flight, where the row is 16-byte aligned; else one entry per lane and load) until a shown entry:
 * a causal mask's row s reads its cols - s - 1 hidden entries and one vector more.
 */
#ifndef OPSLOT_KERNELS_MASK_LIMIT_H_
#define OPSLOT_KERNELS_MASK_LIMIT_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

OPSLOT_API int opslot_mask_limit(const void* mask, int mask_kind, int64_t batch, int64_t seq,
                                 int64_t cols, const int64_t* mask_stride, int32_t* out,
                                 void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_MASK_LIMIT_H_ */
