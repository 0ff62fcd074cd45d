/* The chunked gated delta rule (Qwen3.5's Gated DeltaNet), forward and backward, on tensor cores.
 *
 * Per sequence and head, with state S [Dk, Dv] (S_0 = initial state or 0), for each token t:
 *   S   <- exp(g_t) * S
 *   S   <- S + k_t^T (beta_t * (v_t - k_t S))
 *   o_t  = q_t S
 * where q, k are first L2-normalised (use_l2norm; rsqrt(sum x^2 + 1e-6)) and q is scaled by `scale`
 * (upstream: Dk^-0.5). Computed chunk-wise (64 tokens): per chunk the WY/UT form
 * T = (I + strict_lower(beta k k^T * exp(G_i - G_j)))^-1, w = T (beta e^G k), u = T (beta v), then
 * a sequential pass over chunks (v_new = u - w S; S <- e^{G_C} S + (e^{G_C - G} k)^T v_new) and the
 * output o = (e^G q) S + (q k^T * exp(G_i - G_j), i >= j) v_new. Matrix products run on tensor
 * cores with operands in the input dtype (bf16 / fp16; tf32 for fp32 inputs) and fp32 accumulation;
 * the state, the gates and every reduction stay fp32. Deterministic: no atomics, fixed reduction
 * order.
 *
 * Layout: q, k [B, T, H, Dk], v [B, T, H, Dv] with element strides (batch, token, head) and a
 * contiguous last dimension; g, beta [B, T, H] with strides (batch, token, head), each of any
 * opslot_dtype. Dk, Dv <= 128 (smaller sizes are padded with zeros inside the kernels). Packed
 * sequences: cu_seqlens [nseq + 1] (int32, device) with batch == 1, each segment an independent
 * sequence; else nseq == batch and every row of the batch is one sequence. States are fp32
 * [nseq, H, Dk, Dv] contiguous. out, dq, dk, dv are contiguous [B, T, H, D] in `dtype`; dg, dbeta
 * contiguous [B, T, H] in g's and beta's dtypes.
 *
 * Memory: the caller allocates `workspace` (opslot_gdr_workspace_bytes) and the tensors the forward
 * writes for the backward: h [max_chunks, H, 128, 128] (the state entering each chunk), v_new and
 * w [max_chunks, H, 64, 128] (the chunk's corrected values and its UT-transformed keys), all in
 * `dtype`, and gamma [max_chunks, H, 64] fp32 (the in-chunk cumulative log decay). Nothing is
 * allocated, synchronised or read back on the host: every entry point can be captured in a CUDA
 * graph.
 */
#ifndef OPSLOT_KERNELS_GATED_DELTA_RULE_H_
#define OPSLOT_KERNELS_GATED_DELTA_RULE_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dtype;      /* q, k, v, out, dq, dk, dv, h, v_new */
  int g_dtype;    /* g and dg */
  int beta_dtype; /* beta and dbeta */
  int use_l2norm; /* 1: L2-normalise q and k inside the op (and its backward) */
  float scale;    /* q's scale after the normalisation */
  int64_t batch, seqlen, heads, dk, dv;
  int64_t nseq;              /* sequences: batch, or the number of packed segments */
  const int32_t* cu_seqlens; /* [nseq + 1] on the device (packed, batch == 1), or NULL */
  int64_t max_chunks;        /* opslot_gdr_max_chunks(batch, seqlen, nseq, cu_seqlens != NULL) */
  const void *q, *k, *v, *g, *beta;
  int64_t q_stride[3], k_stride[3], v_stride[3], g_stride[3],
      beta_stride[3]; /* batch, token, head */
} opslot_gdr_problem;

/* How many 64-token chunks the problem can have (an upper bound for packed sequences). */
OPSLOT_API int64_t opslot_gdr_max_chunks(int64_t batch, int64_t seqlen, int64_t nseq, int packed);
/* Workspace bytes of the forward (backward = 0) or backward (1); -1 on an invalid problem. */
OPSLOT_API int64_t opslot_gdr_workspace_bytes(const opslot_gdr_problem* p, int backward);

/* out [B, T, H, Dv]; final_state [nseq, H, Dk, Dv] fp32 or NULL; initial_state likewise or NULL
 * (zeros). */
OPSLOT_API int opslot_gdr_fwd(const opslot_gdr_problem* p, const float* initial_state, void* out,
                              float* final_state, void* h, void* v_new, void* w, float* gamma,
                              void* workspace, void* stream);
/* dout [B, T, H, Dv] contiguous in `dtype`; dfinal_state fp32 or NULL (zeros); h, v_new, w, gamma
 * as the forward wrote them. dinitial_state fp32 [nseq, H, Dk, Dv] or NULL (not wanted). */
OPSLOT_API int opslot_gdr_bwd(const opslot_gdr_problem* p, const void* dout,
                              const float* dfinal_state, const void* h, const void* v_new,
                              const void* w, const float* gamma, void* dq, void* dk, void* dv,
                              void* dg, void* dbeta, float* dinitial_state, void* workspace,
                              void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_GATED_DELTA_RULE_H_ */
