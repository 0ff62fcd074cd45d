/* DeepSeek-V4's manifold-constrained hyper-connections (opslot mhc/pre, mhc/post, mhc/head, `cuda`
 * implementation): the memory-bound passes around the small fp32 GEMM against `fn`, which the
 * caller runs (cuBLAS through torch) in the forward; the backward's dx and d fn are one pass
 * (opslot_mhc_dx_dfn) where it fits. docs/kernels.md "## mhc" has the design; the per-token math
 * is kernels/src/mhc_math.h.
 *
 * Shapes: T tokens, hc streams (1 <= hc <= 4), D = hidden, K = hc * D, M mixes per token
 * ((2 + hc) * hc for mhc/pre; hc for mhc/head). x / streams are [T, hc, D] and block outputs /
 * collapsed rows [T, D], contiguous, in `dtype`; every per-token float array is contiguous fp32
 * ([T, M] mixes, [T] rstd, [T, hc] post, [T, hc, hc] comb, ...). Nothing synchronises, nothing
 * allocates; every reduction is in a fixed order (bitwise deterministic).
 */
#ifndef OPSLOT_KERNELS_MHC_H_
#define OPSLOT_KERNELS_MHC_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [3, n] bfloat16: w = out[0] + out[1] + out[2] to within 2^-24 relative (each term the
 * rounding of what the previous ones leave), for bf16 GEMMs that stand for an fp32 one. */
OPSLOT_API int opslot_mhc_split3(const float* w, int64_t n, void* out, void* stream);

/* The collapse (mhc/pre and mhc/head forward), a block a token at a time (blocks that walk the
 * tokens, the next token's row in flight, where 16-byte vectors cover the row):
 *   rstd[t] = 1 / sqrt(sum(x[t]^2) / K + norm_eps)
 *   mix[t, m] = rstd[t] * sum_{s < nsplit} p[t * ldp + s * M + m]   (p: x @ fn^T, nsplit partial
 *                                                                    products of a split GEMM)
 *   pre_j = sigmoid(mix[t, j] * scale[0] + base[j]) + hc_eps
 *   out[t, d] = sum_j pre_j * x[t, j, d]   (fp32, one rounding)
 * scale: [3] (pre) or [1] (head); base [M]. */
OPSLOT_API int opslot_mhc_collapse_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const float* p, int64_t nsplit,
                                       int64_t ldp, const float* scale, const float* base,
                                       float norm_eps, float hc_eps, void* out, float* mix,
                                       float* rstd, void* stream);

/* post [T, hc] and comb [T, hc, hc] from mix [T, (2 + hc) * hc] (mhc_math.h comb_forward's
 * steps), a lane per matrix entry. */
OPSLOT_API int opslot_mhc_comb_fwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps, float* post,
                                   float* comb, void* stream);

/* da[t, hc .. M) from the gradients of post [T, hc] and comb [T, hc, hc] (either may be NULL:
 * zero), recomputing the Sinkhorn iterations (mhc_math.h comb_backward's steps), a lane per matrix
 * entry. iters up to 1600. */
OPSLOT_API int opslot_mhc_comb_bwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps,
                                   const float* g_post, const float* g_comb, float* da,
                                   void* stream);

/* sa[c] = sum_t a[t * na + c] for c < na and sb[c] = sum_t b[t * nb + c] for c < nb (b, sb may be
 * NULL when nb is 0, a and b when tokens is 0): d base and d scale from the backward's per-token da
 * [T, M] and dsc [T, G], in one launch; each column's tokens are added in a fixed order (bitwise
 * deterministic). */
OPSLOT_API int opslot_mhc_token_sums(int64_t tokens, const float* a, int64_t na, const float* b,
                                     int64_t nb, float* sa, float* sb, void* stream);

/* The collapse's backward up to dx, one block per token: g_pre_j = sum_d g_out[t, d] * x[t, j, d]
 * (g_out may be NULL: zero), then mhc_math.h token_backward: writes da[t, 0 .. hc) (reads
 * da[t, hc .. M) when M > hc), pre [T, hc], dsc [T, 3] ([T, 1] for M == hc), coef_a [T, M],
 * coef_c [T]; when coef_a3 is not NULL also coef_a3 [T, ld_a3] bfloat16 (ld_a3 >= 3M), each row
 * the three-term split (opslot_mhc_split3) of coef_a's row, [hi mid lo], then zeros. */
OPSLOT_API int opslot_mhc_collapse_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const void* g_out,
                                       const float* mix, const float* rstd, const float* scale,
                                       const float* base, float hc_eps, float* da, float* pre,
                                       float* dsc, float* coef_a, void* coef_a3, int64_t ld_a3,
                                       float* coef_c, void* stream);

/* dx[t, j, d] = pre[t, j] * g_out[t, d] + sum_m coef_a[t, m] * fn[m, j * D + d]
 *               - coef_c[t] * x[t, j, d]            (fp32, one rounding; g_out may be NULL)
 * fn: [M, K] fp32, M <= 24. */
OPSLOT_API int opslot_mhc_dx(int dtype, int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                             const void* x, const void* g_out, const float* fn, const float* coef_a,
                             const float* coef_c, const float* pre, void* dx, void* stream);

/* coef_a3's row pitch (bfloat16 elements) that opslot_mhc_dx_dfn reads: 16 * ceil(3M / 16). */
static inline int64_t opslot_mhc_dx_dfn_coef_pitch(int64_t mixes) {
  return (3 * mixes + 15) / 16 * 16;
}

/* dx as opslot_mhc_dx and dfn [M, K] fp32, dfn[m, k] = sum_t coef_a[t, m] * x[t, k], in one pass
 * over x on tensor cores, from coef_a split into bf16 terms (opslot_mhc_collapse_bwd's coef_a3, row
 * pitch opslot_mhc_dx_dfn_coef_pitch(M), 16-byte aligned; its first two terms) and fn split the
 * same way in the kernel: the three products above 2^-18 of the largest, fp32 accumulators. Only
 * where opslot_mhc_dx_dfn_fits returns 1 (bfloat16 streams, hidden a multiple of 64, x / g_out / dx
 * 16-byte aligned); else use opslot_mhc_dx and a GEMM. scratch:
 * opslot_mhc_dx_dfn_scratch_floats(...) floats (NULL when that is 0; -1: bad shape). Ranges of 4096
 * tokens, their d fn added in order: bitwise deterministic on a given GPU. Compute capability 9.0
 * runs warpgroup MMAs, other GPUs mma.sync: the same dx, d fn's sums over tokens in another order.
 */
OPSLOT_API int opslot_mhc_dx_dfn_fits(int dtype, int64_t hc, int64_t hidden, int64_t mixes,
                                      const void* x, const void* g_out, const void* dx);
OPSLOT_API int64_t opslot_mhc_dx_dfn_scratch_floats(int64_t tokens, int64_t hc, int64_t hidden,
                                                    int64_t mixes);
OPSLOT_API int opslot_mhc_dx_dfn(int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                                 const void* x, const void* g_out, const float* fn,
                                 const void* coef_a3, const float* coef_c, const float* pre,
                                 void* dx, float* dfn, float* scratch, void* stream);

/* mhc/post: out[t, i, d] = p_i * block_out[t, d] + sum_j c_ji * streams[t, j, d] with p, c the
 * post [T, hc] and comb [T, hc, hc] entries rounded to `dtype` first (upstream's .to(dtype)); fp32
 * arithmetic, one rounding. */
OPSLOT_API int opslot_mhc_post_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const float* post, const float* comb, const void* block_out,
                                   const void* streams, void* out, void* stream);

/* Its backward, one block per token (p, c rounded as in the forward):
 *   d_block_out[t, d] = sum_i p_i * g[t, i, d]      d_streams[t, j, d] = sum_i c_ji * g[t, i, d]
 *   d_post[t, i] = sum_d g[t, i, d] * block_out[t, d]   d_comb[t, j, i] = sum_d g[t, i, d] *
 *   streams[t, j, d]   (fp32 sums in a fixed order) */
OPSLOT_API int opslot_mhc_post_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const void* grad, const float* post, const float* comb,
                                   const void* block_out, const void* streams, void* d_block_out,
                                   void* d_streams, float* d_post, float* d_comb, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_MHC_H_ */
