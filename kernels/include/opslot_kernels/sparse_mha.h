/* Sparse multi-head attention over per-head key and value caches, forward only: the decoding step
 * of GLM-MoE-DSA under Transformers 5.17, whose cache holds every head's expanded keys and values.
 *
 * q [B, S, H, dk], k [B, Hkv, T, dk], v [B, Hkv, T, dv] (H a multiple of Hkv: query head h reads kv
 * head h / (H / Hkv)), indices int32 [B, S, K]: the keys query (b, s) attends to, the same list for
 * all of its heads; an index outside [0, T) (e.g. -1) is skipped. s_j = scale * q . k[idx_j],
 * lse = log(sum_j exp(s_j)), out = sum_j exp(s_j - lse) v[idx_j]. A row without a valid index gives
 * out = 0 and lse = -inf.
 *
 * Memory-bound (one query reads its K selected rows of every head once): CUDA cores, fp32 scores,
 * probabilities and sums. The K keys of each (query, head) row are split over several CTAs where
 * there are few rows (a decoding step: B * S * H rows), each CTA's warps reading groups of keys;
 * a second kernel merges the splits' partial results in a fixed order. The split count depends only
 * on the shapes (opslot_sparse_mha_scratch_floats): bitwise deterministic.
 *
 * Limits: 1 <= dk, dv <= 512, 1 <= Hkv <= H. Layout: the last dimension of q, k, v and indices
 * contiguous, the others by element strides; out and lse contiguous. Nothing is allocated,
 * synchronised or read back on the host: the entry points can be captured in a CUDA graph.
 */
#ifndef OPSLOT_KERNELS_SPARSE_MHA_H_
#define OPSLOT_KERNELS_SPARSE_MHA_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dtype; /* q, k, v, out */
  int64_t batch, seqlen, kvlen, heads, kv_heads, dk, dv, topk;
  float scale;
  const void* q;          /* [B, S, H, dk] */
  const void* k;          /* [B, Hkv, T, dk] */
  const void* v;          /* [B, Hkv, T, dv] */
  const int32_t* indices; /* [B, S, K] */
  int64_t q_stride[3];    /* batch, token, head (elements) */
  int64_t k_stride[3];    /* batch, head, token */
  int64_t v_stride[3];    /* batch, head, token */
  int64_t idx_stride[2];  /* batch, token */
} opslot_sparse_mha_problem;

/* The fp32 scratch opslot_sparse_mha_fwd needs for the problem's split keys (0 where each row is
 * one CTA's); -1 on an invalid problem (opslot_last_error() says why). */
OPSLOT_API int64_t opslot_sparse_mha_scratch_floats(const opslot_sparse_mha_problem* p);

/* out [B, S, H, dv] in `dtype`, lse fp32 [B, S, H] (natural log); scratch: the floats
 * opslot_sparse_mha_scratch_floats asks for (NULL where it is 0). */
OPSLOT_API int opslot_sparse_mha_fwd(const opslot_sparse_mha_problem* p, void* out, float* lse,
                                     float* scratch, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_SPARSE_MHA_H_ */
