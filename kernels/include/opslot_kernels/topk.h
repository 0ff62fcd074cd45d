/* The indices of the k largest values of each row of an fp32 matrix (DeepSeek sparse attention's
 * top-k over the lightning indexer's scores), forward only.
 *
 *   out[b, s, :] = the k columns t of row (b, s) with the largest score'[b, s, t], ascending in t
 *   score'[b, s, t] = scores[b, s, t]                 without a mask
 *                     scores[b, s, t] if mask, else -inf   bool mask
 *                     scores[b, s, t] + mask[b, s, t]       additive mask (fp32 sum)
 *
 * where the columns at or past limit[b, s] count as -inf (neither they nor their mask entries are
 * read), and equal values are taken lowest column first. The order of values is that of their bits
 * (torch.topk's): NaN above +inf, -0.0 below +0.0. A row with no more than k columns before its
 * limit gives 0, 1, ..., k-1 (every column before the limit, then the first ones past it). Bitwise
 * deterministic: the result is a function of the inputs alone. The mask folds in what
 * `scores.masked_fill_(~mask, -inf)` / `scores.add_(mask)` followed by a top-k computes, without
 * writing the scores.
 *
 * Layout: scores fp32 [batch, seq, cols], element strides (batch, seq), contiguous rows; limit
 * int32 [batch, seq] contiguous, or NULL (every column); a limit below 0 counts as 0 and one above
 * cols as cols. mask: NULL, or [batch, seq, cols] of `mask_kind` with element strides (batch, seq)
 * (0 broadcasts) and contiguous rows. out int32 [batch, seq, k] contiguous, every element written.
 * 0 <= k <= cols < 2^31, batch * seq < 2^31.
 *
 * Kernels: a radix select over the values' 32 order bits in three digits (11, 11 and 10 bits; a
 * shared-memory histogram per digit, stopping early when a digit's bucket holds exactly the values
 * still needed), then the chosen columns written in order (prefix sums). Rows of up to 2048 columns
 * (cols): one warp per row, its keys read once into registers (up to 64 a lane), warp-wide scans.
 * Up to 4096: one block per row, 16 keys a thread in registers, block-wide scans. Longer rows, one
 * block each. Rows of 16385 to 65536 columns with k <= 2048 are read once: the keys at or above a
 * threshold that rises as the row streams are kept in shared memory (at most 11264), selected
 * there, and the chosen columns placed through bitmaps of the row. Other rows, and those whose ties
 * at the k-th largest fill shared memory: after the top digit the keys in its bucket and above it,
 * when there are at most 8192, are copied to shared memory in column order and the rest runs
 * there: the row is read twice; otherwise up to four times (the later reads partly from L2).
 */
#ifndef OPSLOT_KERNELS_TOPK_H_
#define OPSLOT_KERNELS_TOPK_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mask kinds of opslot_topk_indices (the float ones are opslot_dtype's codes). */
enum {
  OPSLOT_TOPK_MASK_FLOAT32 = 0,  /* added to the score */
  OPSLOT_TOPK_MASK_FLOAT16 = 1,  /* added to the score */
  OPSLOT_TOPK_MASK_BFLOAT16 = 2, /* added to the score */
  OPSLOT_TOPK_MASK_BOOL = 3,     /* one byte per entry; 0: the score counts as -inf */
};

OPSLOT_API int opslot_topk_indices(const float* scores, int64_t batch, int64_t seq, int64_t cols,
                                   const int64_t* score_stride, int64_t k, const int32_t* limit,
                                   const void* mask, int mask_kind, const int64_t* mask_stride,
                                   int32_t* out, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_TOPK_H_ */
