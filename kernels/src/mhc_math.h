// The per-token math of DeepSeek-V4's hyper-connections (mhc/pre, mhc/head), shared by the CUDA
// kernels of mhc_kernels.cuh (a thread per token, or the Sinkhorn's lines gathered by the lanes
// that hold their entries: the line functions below) and by the CPU kernels of
// kernels/torch/mhc.cc, so that the CPU tests run the very code the GPU runs. Plain C++ (no CUDA
// types), fp32 throughout, in upstream's order of operations (transformers'
// DeepseekV4HyperConnection / DeepseekV4HyperHead):
//
//   mix[m]  = rstd * (x_flat . fn[m])                        m < M = (2 + hc) * hc (head: M = hc)
//   pre[j]  = sigmoid(mix[j] * scale[0] + base[j]) + eps     j < hc
//   post[j] = 2 * sigmoid(mix[hc + j] * scale[1] + base[hc + j])
//   comb    = Sinkhorn(softmax_rows(mix[2hc:] * scale[2] + base[2hc:]) + eps): a column
//             normalisation, then (iters - 1) times a row and a column normalisation,
//             each c / (sum + eps).
//
// Backward: `a[m]` is the pre-activation (mix[m] * scale[g(m)] + base[m]); da[m] = dL/da[m] gives
// dbase = sum_t da, dscale[g] = sum_t sum_{m in g} da[m] * mix[m], dmix[m] = da[m] * scale[g(m)].
// The Sinkhorn backward recomputes the forward and keeps the matrix entering each step in `hist`
// (steps * hc * hc floats at hist[(step * hc * hc + e) * ld]: per thread in shared memory on the
// GPU, a local array on the CPU).
#ifndef OPSLOT_KERNELS_MHC_MATH_H_
#define OPSLOT_KERNELS_MHC_MATH_H_

#include <math.h>

#if defined(__CUDACC__)
#define OPSLOT_MHC_FN __host__ __device__ __forceinline__
#else
#define OPSLOT_MHC_FN inline
#endif
#if defined(__CUDA_ARCH__)
#define OPSLOT_MHC_UNROLL _Pragma("unroll")
#else
#define OPSLOT_MHC_UNROLL
#endif

namespace opslot {
namespace mhc {

// hc_mult values the kernels are compiled for (register arrays of hc x hc floats).
constexpr int kMaxHc = 4;
// Mixes per token at most: (2 + hc) * hc.
constexpr int kMaxMixes = (2 + kMaxHc) * kMaxHc;

OPSLOT_MHC_FN float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// a * b rounded by itself: never fused by the compiler into an addition that follows (an FMA),
// whether the sum is in the same thread or not. The Sinkhorn steps' products go through it, so that
// the one-thread-per-token and the lane-per-entry kernels compute the same bits.
OPSLOT_MHC_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The normalisation steps of upstream's Sinkhorn loop (the first column normalisation, then
// iters - 1 row/column pairs; iters < 1 runs the first one only, as upstream's empty range).
OPSLOT_MHC_FN int sinkhorn_steps(int iters) { return iters > 1 ? 2 * iters - 1 : 1; }

// The scale group of mix m: 0 pre, 1 post, 2 comb.
OPSLOT_MHC_FN int group(int m, int hc) { return m < hc ? 0 : (m < 2 * hc ? 1 : 2); }

// post[j] = 2 sigmoid(mix[hc + j] * s1 + base[hc + j]), and the gradient of its pre-activation from
// g, the gradient of post (null: none, 0).
template <int HC>
OPSLOT_MHC_FN float post_value(const float* mix, const float* base, float s1, int j) {
  return 2.f * sigmoid(mix[HC + j] * s1 + base[HC + j]);
}
template <int HC>
OPSLOT_MHC_FN float post_grad(const float* mix, const float* base, float s1, int j,
                              const float* g) {
  const float s = sigmoid(mix[HC + j] * s1 + base[HC + j]);
  return g != nullptr ? g[j] * 2.f * s * (1.f - s) : 0.f;
}

// Row i of the softmax of the comb logits (max-subtracted, as torch's softmax).
template <int HC>
OPSLOT_MHC_FN void softmax_row(const float* mix, const float* base, float s2, int i,
                               float (&p)[HC]) {
  float mx = -INFINITY;
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) {
    p[j] = mix[2 * HC + i * HC + j] * s2 + base[2 * HC + i * HC + j];
    mx = fmaxf(mx, p[j]);
  }
  float sum = 0.f;
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) {
    p[j] = expf(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.f / sum;
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) p[j] = mul(p[j], inv);
}

// Row-wise softmax of the comb logits.
template <int HC>
OPSLOT_MHC_FN void comb_softmax(const float* mix, const float* base, float s2, float (&p)[HC][HC]) {
  OPSLOT_MHC_UNROLL
  for (int i = 0; i < HC; ++i) softmax_row<HC>(mix, base, s2, i, p[i]);
}

// The pieces of a normalisation step and of its backward along one line (entries v[0..HC) in
// order), shared by the one-thread-per-token form below and the lane-per-entry kernels: 1 / (the
// line's sum + eps), and sum_b dv[b] * (v[b] * inv).
template <int HC>
OPSLOT_MHC_FN float line_inv(const float (&v)[HC], float eps) {
  float s = 0.f;
  OPSLOT_MHC_UNROLL
  for (int b = 0; b < HC; ++b) s += v[b];
  return 1.f / (s + eps);
}
template <int HC>
OPSLOT_MHC_FN float line_dot(const float (&dv)[HC], const float (&v)[HC], float inv) {
  float dot = 0.f;
  OPSLOT_MHC_UNROLL
  for (int b = 0; b < HC; ++b) dot += dv[b] * mul(v[b], inv);
  return dot;
}

// The softmax's backward along row i: sum_j dc[j] * p[j] (dl = p * (dc - that)).
template <int HC>
OPSLOT_MHC_FN float softmax_dot(const float (&dc)[HC], const float (&p)[HC]) {
  float dot = 0.f;
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) dot += dc[j] * p[j];
  return dot;
}

// A line of the matrix: entry b of line a, along columns (kColumns: c[b][a], a column normalisation
// divides by the sum over i) or rows (c[a][b]). Compile-time, so that the arrays stay in registers.
template <int HC, bool kColumns>
OPSLOT_MHC_FN float& entry(float (&c)[HC][HC], int a, int b) {
  return kColumns ? c[b][a] : c[a][b];
}

// One normalisation step: c = c / (sum along the line + eps), as c * (1 / (sum + eps)): one
// division per line (within an ulp of upstream's division of each entry).
template <int HC, bool kColumns>
OPSLOT_MHC_FN void normalise(float (&c)[HC][HC], float eps) {
  OPSLOT_MHC_UNROLL
  for (int a = 0; a < HC; ++a) {
    float v[HC];
    OPSLOT_MHC_UNROLL
    for (int b = 0; b < HC; ++b) v[b] = entry<HC, kColumns>(c, a, b);
    const float inv = line_inv<HC>(v, eps);
    OPSLOT_MHC_UNROLL
    for (int b = 0; b < HC; ++b) entry<HC, kColumns>(c, a, b) = mul(v[b], inv);
  }
}

// Its backward, from the matrix c entering the step: y = c / (s + eps) along a line gives
// dc = (dy - sum(dy * y)) / (s + eps); dc holds dy on entry.
template <int HC, bool kColumns>
OPSLOT_MHC_FN void normalise_backward(float (&c)[HC][HC], float (&dc)[HC][HC], float eps) {
  OPSLOT_MHC_UNROLL
  for (int a = 0; a < HC; ++a) {
    float v[HC], dv[HC];
    OPSLOT_MHC_UNROLL
    for (int b = 0; b < HC; ++b) {
      v[b] = entry<HC, kColumns>(c, a, b);
      dv[b] = entry<HC, kColumns>(dc, a, b);
    }
    const float inv = line_inv<HC>(v, eps);
    const float dot = line_dot<HC>(dv, v, inv);
    OPSLOT_MHC_UNROLL
    for (int b = 0; b < HC; ++b) entry<HC, kColumns>(dc, a, b) = mul(dv[b] - dot, inv);
  }
}

// post [hc] and comb [hc, hc] of one token from its mixes; `hist` (may be null) receives the
// matrix entering each normalisation step.
template <int HC>
OPSLOT_MHC_FN void comb_forward(const float* mix, const float* base, const float* scale, int iters,
                                float eps, float* post, float* comb, float* hist, int ld) {
  if (post != nullptr) {
    OPSLOT_MHC_UNROLL
    for (int j = 0; j < HC; ++j) post[j] = post_value<HC>(mix, base, scale[1], j);
  }
  float c[HC][HC];
  comb_softmax<HC>(mix, base, scale[2], c);
  OPSLOT_MHC_UNROLL
  for (int i = 0; i < HC; ++i) {
    OPSLOT_MHC_UNROLL
    for (int j = 0; j < HC; ++j) c[i][j] = c[i][j] + eps;
  }
  const int steps = sinkhorn_steps(iters);
  for (int k = 1; k <= steps; ++k) {
    if (hist != nullptr) {
      OPSLOT_MHC_UNROLL
      for (int e = 0; e < HC * HC; ++e) hist[((k - 1) * HC * HC + e) * ld] = c[e / HC][e % HC];
    }
    if (k & 1)
      normalise<HC, true>(c, eps);
    else
      normalise<HC, false>(c, eps);
  }
  if (comb != nullptr) {
    OPSLOT_MHC_UNROLL
    for (int e = 0; e < HC * HC; ++e) comb[e] = c[e / HC][e % HC];
  }
}

// da[hc .. M) of one token (the post and comb pre-activations) from the gradients of post and
// comb (either may be null: zero). Recomputes the forward into `hist` (steps * hc * hc floats).
template <int HC>
OPSLOT_MHC_FN void comb_backward(const float* mix, const float* base, const float* scale, int iters,
                                 float eps, const float* g_post, const float* g_comb, float* da,
                                 float* hist, int ld) {
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) da[HC + j] = post_grad<HC>(mix, base, scale[1], j, g_post);
  comb_forward<HC>(mix, base, scale, iters, eps, nullptr, nullptr, hist, ld);
  float dc[HC][HC];
  OPSLOT_MHC_UNROLL
  for (int e = 0; e < HC * HC; ++e) dc[e / HC][e % HC] = g_comb != nullptr ? g_comb[e] : 0.f;
  for (int k = sinkhorn_steps(iters); k >= 1; --k) {
    float c[HC][HC];
    OPSLOT_MHC_UNROLL
    for (int e = 0; e < HC * HC; ++e) c[e / HC][e % HC] = hist[((k - 1) * HC * HC + e) * ld];
    if (k & 1)
      normalise_backward<HC, true>(c, dc, eps);
    else
      normalise_backward<HC, false>(c, dc, eps);
  }
  // + eps: identity; softmax: dl = p * (dc - sum_j dc * p)
  float p[HC][HC];
  comb_softmax<HC>(mix, base, scale[2], p);
  OPSLOT_MHC_UNROLL
  for (int i = 0; i < HC; ++i) {
    const float dot = softmax_dot<HC>(dc[i], p[i]);
    OPSLOT_MHC_UNROLL
    for (int j = 0; j < HC; ++j) da[2 * HC + i * HC + j] = p[i][j] * (dc[i][j] - dot);
  }
}

// The collapse weights of one token: pre[j] = sigmoid(mix[j] * scale0 + base[j]) + eps.
template <int HC>
OPSLOT_MHC_FN void pre_weights(const float* mix, const float* base, float scale0, float eps,
                               float* pre) {
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) pre[j] = sigmoid(mix[j] * scale0 + base[j]) + eps;
}

// The end of one token's backward, once g_pre[j] = sum_d g_collapsed[d] * x[j, d] is known and
// da[hc .. M) holds the post/comb part (head: M = hc, no such part):
//   da[j] (j < hc), pre[j] (for the dx kernel), dsc[g] = sum_{m in g} da[m] * mix[m] (groups:
//   3, or 1 when M == hc), coef_a[m] = rstd * da[m] * scale[g(m)] (the weight of fn[m] in dx), and
//   coef_c = rstd^2 / K * sum_m da[m] * scale[g(m)] * mix[m] (the RMS-norm term of dx):
//   dx[j, d] = pre[j] * g_collapsed[d] + sum_m coef_a[m] * fn[m, j * D + d] - coef_c * x[j, d].
template <int HC>
OPSLOT_MHC_FN void token_backward(const float* g_pre, const float* mix, const float* base,
                                  const float* scale, int mixes, float rstd, float k_inv, float eps,
                                  float* da, float* pre, float* dsc, float* coef_a, float* coef_c) {
  OPSLOT_MHC_UNROLL
  for (int j = 0; j < HC; ++j) {
    const float s = sigmoid(mix[j] * scale[0] + base[j]);
    da[j] = g_pre[j] * s * (1.f - s);
    pre[j] = s + eps;
  }
  const int groups = mixes > HC ? 3 : 1;
  float sums[3] = {0.f, 0.f, 0.f};
  float dot = 0.f;
  OPSLOT_MHC_UNROLL
  for (int m = 0; m < mixes; ++m) {
    const int g = group(m, HC);
    const float dm = da[m] * scale[g];
    sums[g] += da[m] * mix[m];
    dot += dm * mix[m];
    coef_a[m] = rstd * dm;
  }
  for (int g = 0; g < groups; ++g) dsc[g] = sums[g];
  *coef_c = rstd * rstd * k_inv * dot;
}

}  // namespace mhc
}  // namespace opslot

#endif  // OPSLOT_KERNELS_MHC_MATH_H_
