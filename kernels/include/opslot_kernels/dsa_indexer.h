/* The lightning indexer's scores of DeepSeek sparse attention (GLM-MoE-DSA, DeepSeek-V4), forward
 * only (upstream runs the indexer under torch.no_grad()).
 *
 *   out[b, s, t] = scale * sum_h weights[b, s, h] * relu(q[b, s, h, :] . k[b, t, :])
 *                  for t < limit[b, s], else -inf
 *
 * with every product summed in fp32. Bitwise deterministic: no atomics, a fixed reduction order,
 * the same arithmetic for an output whatever the grid.
 *
 * Layout: q [B, S, H, D] with element strides (batch, query, head) and a contiguous last dimension;
 * k [B, T, D] with strides (batch, key), contiguous last dimension; weights fp32 [B, S, H] with
 * strides (batch, query, head); limit int32 [B, S] contiguous, or NULL (no limit: every key);
 * a limit below 0 counts as 0 and one above T as T. out fp32 [B, S, T] contiguous, every element
 * written.
 *
 * Kernels. 16-bit q and k (`dtype` float16 / bfloat16) run on tensor cores (mma.sync m16n8k16,
 * fp32 accumulation): one block takes the rows (query, head) of a few queries (heads padded to a
 * multiple of 16 with zero rows), keeps them in registers and walks the key tiles (64 keys) up to
 * its queries' largest limit, double-buffered with cp.async; the ReLU, the head weights and the
 * sum over heads happen in the epilogue (warp shuffles, then a fixed-order sum over the warps of
 * one query), and the tiles past the block's limits are not computed (written -inf). They need
 * D <= 128, H <= 128, D and every q/k stride a multiple of 8 elements and 16-byte aligned q/k
 * pointers (the torch binding copies other inputs into that form). On compute capability 9.0,
 * head dims of 113 to 128 with 16, 32, 64 or 128 padded heads run the same algorithm on warpgroup
 * MMAs (two such blocks a CTA sharing the key tiles), with the same bits. float32 q and k run an
 * exact fp32 CUDA-core kernel (any H, D up to 512), slower.
 */
#ifndef OPSLOT_KERNELS_DSA_INDEXER_H_
#define OPSLOT_KERNELS_DSA_INDEXER_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* q_stride: (batch, query, head); k_stride: (batch, key); w_stride: (batch, query, head). */
OPSLOT_API int opslot_dsa_index_scores(int dtype, int64_t batch, int64_t seq, int64_t heads,
                                       int64_t dim, int64_t keys, const void* q,
                                       const int64_t* q_stride, const void* k,
                                       const int64_t* k_stride, const float* weights,
                                       const int64_t* w_stride, float scale, const int32_t* limit,
                                       float* out, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_DSA_INDEXER_H_ */
