/* MoE experts: the device-side pieces of a grouped-GEMM expert layer (opslot moe/standard and
 * moe/gpt_oss, `cuda` implementation). See docs/kernels.md "## MoE experts".
 *
 * Layout shared by every entry point:
 * - N = tokens * top_k (token, k) assignments, flattened token-major (a = t * top_k + k).
 * - Assignments are sorted by expert into N "rows"; `offs[E]` (int32, device) holds the cumulative
 *   row count at the end of each expert's segment (torch._grouped_mm's `offs`). Rows at or past
 *   offs[E-1] ("kept") belong to dropped assignments (expert index == E).
 * - `inv[N]` (int32): the row of assignment a (>= kept when dropped); `row_expert[N]` (int32): the
 *   expert of each row (any value for rows >= kept).
 * - Activations are row-major with a contiguous last dimension; the row stride equals the width.
 * - Every kernel writes every row of its output, zeros where a row is dropped, so all buffers are
 *   fully defined; nothing reads the host, nothing synchronises (CUDA-graph capturable).
 * - Reductions are fixed-order (fp32), so results are bitwise deterministic.
 */
#ifndef OPSLOT_KERNELS_MOE_H_
#define OPSLOT_KERNELS_MOE_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Routing metadata from the router's expert indices idx [N] (int64 when idx_is_int64, else int32;
 * N = tokens * top_k, token-major), all on the device: offs [E], row_expert [N], src_token [N]
 * (= assignment / top_k of each row), inv [N]. A stable counting sort: rows of one expert keep
 * assignment order; indices outside [0, E) (upstream's masking index E) form a last, dropped
 * segment. num_experts <= 1024. scratch: int32, opslot_moe_route_scratch(N, E) elements. */
OPSLOT_API int64_t opslot_moe_route_scratch(int64_t n, int64_t num_experts);
OPSLOT_API int opslot_moe_route(const void* idx, int idx_is_int64, int64_t n, int64_t top_k,
                                int64_t num_experts, int32_t* offs, int32_t* row_expert,
                                int32_t* src_token, int32_t* inv, int32_t* scratch, void* stream);

/* For each token t and k < top_k with row r = inv[t*K+k] < kept:
 *   dst[r, :] = w[t,k] * src[t, :]                           (w = 1 when `weights` is NULL)
 *   dot_out[t*K+k] = <src[t, :], rows[r, :] + bias[row_expert[r], :]>   (only when dot_out != NULL;
 *                                                              bias may be NULL; 0 for dropped)
 * and rows r = t*K+k >= kept of dst are zeroed. Gather of the tokens into expert order (weights
 * NULL) and the backward of the weighted combine (weights, dot_out) are this kernel.
 * weights / dot_out are float32 [N]; src [T, H], dst / rows [N, H], bias [E, H] in `dtype`. */
OPSLOT_API int opslot_moe_scatter_rows(const void* src, void* dst, const int32_t* inv,
                                       const float* weights, const void* rows, const void* bias,
                                       const int32_t* row_expert, float* dot_out,
                                       const int32_t* offs, int64_t num_experts, int64_t tokens,
                                       int64_t top_k, int64_t hidden, int dtype, void* stream);

/* out[t, :] = sum_k w[t,k] * (rows[r, :] + bias[row_expert[r], :]) over kept r = inv[t*K+k],
 * accumulated in fp32 in k order (w = 1 when weights is NULL; bias may be NULL). The weighted
 * combine, and the backward of the gather (a gather-sum: deterministic, no atomics). */
OPSLOT_API int opslot_moe_gather_sum(const void* rows, void* out, const int32_t* inv,
                                     const float* weights, const void* bias,
                                     const int32_t* row_expert, const int32_t* offs,
                                     int64_t num_experts, int64_t tokens, int64_t top_k,
                                     int64_t hidden, int dtype, void* stream);

/* Gated activation of the gate-up GEMM output h [N, 2I] into a [N, I] (zero rows >= kept).
 * kind 0: Qwen/Mixtral `act(gate) * up`, SiLU, gate = h[:, :I], up = h[:, I:].
 * kind 1: GPT-OSS, gate = h[:, 0::2], up = h[:, 1::2] (+ bias[row_expert[r]] [E, 2I] if not NULL),
 *         gate = min(gate, limit), up = clamp(up, -limit, limit),
 *         a = (up + 1) * gate * sigmoid(alpha*gate).
 * kind 2: DeepSeek-V4, the halves as kind 0, no bias, torch.clamp with `limit` (>= 0) rounded to
 *         `dtype`: a = silu(clamp(gate, max=limit)) * clamp(up, -limit, limit); the backward passes
 *         the gradient where the clamp's input is within its bounds, bounds included (NaN: zero).
 */
OPSLOT_API int opslot_moe_act_forward(const void* h, void* a, const void* bias,
                                      const int32_t* row_expert, const int32_t* offs,
                                      int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                      float alpha, float limit, int dtype, void* stream);

/* dh [N, 2I] from da [N, I] and h (the same h, bias, kind as the forward); zero rows >= kept. */
OPSLOT_API int opslot_moe_act_backward(const void* da, const void* h, void* dh, const void* bias,
                                       const int32_t* row_expert, const int32_t* offs,
                                       int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                       float alpha, float limit, int dtype, void* stream);

/* out[e, c] = sum over the rows r of expert e of g[r, c] (fp32, fixed order), written in `dtype`.
 * scratch: float32, at least opslot_moe_segment_sum_scratch(num_experts, cols) elements. */
OPSLOT_API int64_t opslot_moe_segment_sum_scratch(int64_t num_experts, int64_t cols);
OPSLOT_API int opslot_moe_segment_sum(const void* g, void* out, float* scratch, const int32_t* offs,
                                      int64_t num_experts, int64_t cols, int dtype, void* stream);

/* Grouped GEMM over row segments (the portable path: any dtype, any strides of b; fp32
 * accumulation): c[r, n] = sum_k a[r, k] * b[e(r), k, n] for rows r < kept, b element (e, k, n) at
 * b + e*sbe + k*sbk + n*sbn. Rows >= kept of c are not written (the caller zero-fills c). */
OPSLOT_API int opslot_moe_gmm_rows(const void* a, const void* b, int64_t sbe, int64_t sbk,
                                   int64_t sbn, void* c, const int32_t* offs, int64_t num_experts,
                                   int64_t rows, int64_t k, int64_t n, int dtype, void* stream);

/* Weight gradient of a grouped GEMM: c[e, p, q] = sum over the rows r of expert e of
 * a[r, p] * g[r, q] (a [N, P], g [N, Q] row-major), c element (e, p, q) at
 * c + e*sce + p*scp + q*scq; every (e, p, q) is written (zero for an expert without rows). */
OPSLOT_API int opslot_moe_gmm_wgrad(const void* a, const void* g, void* c, int64_t sce, int64_t scp,
                                    int64_t scq, const int32_t* offs, int64_t num_experts,
                                    int64_t rows, int64_t p, int64_t q, int dtype, void* stream);

/* Zero rows [kept, rows) of c [rows, cols] (the rows torch._grouped_mm leaves unwritten). */
OPSLOT_API int opslot_moe_zero_tail_rows(void* c, const int32_t* offs, int64_t num_experts,
                                         int64_t rows, int64_t cols, int dtype, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_MOE_H_ */
