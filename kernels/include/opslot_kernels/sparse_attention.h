/* Sparse multi-query attention over a per-query list of selected keys (DeepSeek sparse attention:
 * GLM-MoE-DSA's absorbed MLA, DeepSeek-V4's sliding window + compressed entries), forward and
 * backward, on tensor cores.
 *
 * One key/value head shared by every query head: q [B, S, H, Dqk], kv [B, T, Dqk], V = kv[...,
 * :dv]. indices int32 [B, S, K]: the keys query (b, s) attends to; an index outside [0, T) (e.g.
 * -1) is skipped. Indices of one row should be distinct (a repeated index is attended twice, as a
 * sum of two keys would be). With optional per-head sinks (fp32 [H], the gpt-oss / DeepSeek-V4
 * "attention sink" logit that joins the softmax's denominator only): s_j = scale * q . kv[idx_j],
 * lse = log(sum_j exp(s_j) [+ exp(sink_h)]), p_j = exp(s_j - lse),          out = sum_j p_j
 * V[idx_j]. A row without a valid index gives out = 0 and lse = -inf (lse = sink_h with sinks): no
 * NaN.
 *
 * Kernels (docs/kernels.md "sparse_mqa_attention"): bf16/fp16 run mma.sync m16n8k16 tensor-core
 * tiles (operands in the input dtype, fp32 accumulation, P rounded to the input dtype before P V,
 * as flash attention does); fp32 inputs run fp32 CUDA-core kernels (exact fp32, slow). One CTA per
 * query token and block of 64 heads gathers each selected kv row once for all of its heads.
 * Backward: per query, dq directly, and the query's contribution to the rows of dkv it selected
 * (summed over its heads) into a scratch buffer `w`; a second kernel sums, per key, the
 * contributions of the queries that selected it (an inverse index sorted by key, then query) in a
 * fixed order into an fp32 accumulator. No float atomics: bitwise deterministic, independent of how
 * the queries are split into chunks.
 *
 * Limits: Dqk <= 576, 1 <= dv <= Dqk, dv <= 512, 1 <= H <= 65535. Layout: q's, kv's and indices'
 * last dimension contiguous, the others by element strides; out, lse, dout, dq are contiguous.
 * Nothing is allocated, synchronised or read back on the host: every entry point can be captured
 * in a CUDA graph.
 */
#ifndef OPSLOT_KERNELS_SPARSE_ATTENTION_H_
#define OPSLOT_KERNELS_SPARSE_ATTENTION_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dtype; /* q, kv, out, dout, dq */
  int64_t batch, seqlen, kvlen, heads, dqk, dv, topk;
  float scale;
  const void* q;          /* [B, S, H, Dqk] */
  const void* kv;         /* [B, T, Dqk] */
  const int32_t* indices; /* [B, S, K] */
  const float* sinks;     /* [H] or NULL */
  int64_t q_stride[3];    /* batch, token, head (elements) */
  int64_t kv_stride[2];   /* batch, token */
  int64_t idx_stride[2];  /* batch, token */
} opslot_sparse_mqa_problem;

/* out [B, S, H, dv] in `dtype`, lse fp32 [B, S, H] (natural log). */
OPSLOT_API int opslot_sparse_mqa_fwd(const opslot_sparse_mqa_problem* p, void* out, float* lse,
                                     void* stream);

/* The backward's scratch layout: how many head blocks share a query's contribution rows (w holds
 * [queries, head_blocks, K, Dqk]) and the dtype code of w (bf16 for bf16 inputs, else fp32); -1 on
 * an invalid problem. */
OPSLOT_API int opslot_sparse_mqa_bwd_head_blocks(const opslot_sparse_mqa_problem* p);
OPSLOT_API int opslot_sparse_mqa_bwd_w_dtype(const opslot_sparse_mqa_problem* p);

/* Backward, part 1, for the flattened queries q_begin <= b * S + s < q_end: dq rows (dq contiguous
 * [B, S, H, Dqk]), w [q_end - q_begin, head_blocks, K, Dqk] (rows of invalid indices are not
 * written), and, with sinks, dsink_part fp32 [B * S, H] (= -exp(sink - lse) * delta). dout and out
 * contiguous [B, S, H, dv] in `dtype`, lse as the forward wrote it. */
OPSLOT_API int opslot_sparse_mqa_bwd_queries(const opslot_sparse_mqa_problem* p, const void* dout,
                                             const void* out, const float* lse, int64_t q_begin,
                                             int64_t q_end, void* dq, void* w, float* dsink_part,
                                             void* stream);

/* Backward, part 2: for every key row r < nkeys (r = b * T + t), dkv_acc[r, :] += the w rows of
 * the pairs pairs[rowptr[r] .. rowptr[r + 1]) in that order. A pair is a flattened (query, slot)
 * id (b * S + s) * K + j; w's rows start at pair id pair_base (= q_begin * K) and hold head_blocks
 * partial rows each. dkv_acc fp32 [nkeys, dqk] contiguous. */
OPSLOT_API int opslot_sparse_mqa_bwd_reduce(const void* w, int w_dtype, int64_t head_blocks,
                                            int64_t topk, int64_t dqk, int64_t nkeys,
                                            const int64_t* rowptr, const int64_t* pairs,
                                            int64_t pair_base, float* dkv_acc, void* stream);

/* dsinks[h] = sum over rows of part[row, h] (fp32, fixed order). */
OPSLOT_API int opslot_sparse_mqa_dsink_reduce(const float* part, int64_t rows, int64_t heads,
                                              float* dsinks, void* stream);

/* Mask kinds of opslot_sparse_mqa_mask_indices. */
enum {
  OPSLOT_SPARSE_MASK_FLOAT32 = 0,
  OPSLOT_SPARSE_MASK_FLOAT16 = 1,
  OPSLOT_SPARSE_MASK_BFLOAT16 = 2,
  OPSLOT_SPARSE_MASK_BOOL = 3, /* one byte per entry, nonzero = attend */
};
/* Status bits of opslot_sparse_mqa_mask_indices (OR-ed into *status). */
enum {
  OPSLOT_SPARSE_MASK_OVERFLOW = 1, /* a row has more valid entries than topk */
  OPSLOT_SPARSE_MASK_BIAS = 2,     /* an additive entry neither 0 nor <= -65504 (or NaN) */
};

/* The valid columns of each row of a [B, rows, cols] attention mask, in increasing order, as an
 * index list indices int32 [B, rows, topk] (contiguous), padded with -1. Valid: a float entry equal
 * to 0 (an additive mask), a bool entry that is true; masked: a float entry <= -65504 (every float
 * dtype's finfo.min, and -inf). Strides (batch, row, col) in elements; a batch stride of 0
 * broadcasts. Rows with more than topk valid entries keep the first topk and set
 * OPSLOT_SPARSE_MASK_OVERFLOW; any other float entry sets OPSLOT_SPARSE_MASK_BIAS (the caller
 * zeroes *status first and checks it on the device). */
OPSLOT_API int opslot_sparse_mqa_mask_indices(const void* mask, int mask_kind, int64_t batch,
                                              int64_t rows, int64_t cols,
                                              const int64_t* mask_stride, int64_t topk,
                                              int32_t* indices, int32_t* status, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_SPARSE_ATTENTION_H_ */
