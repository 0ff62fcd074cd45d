// The token-row kernels of DeepSeek-V4's hyper-connections (mhc.cu launches them): the split of
// fn into bf16 terms, the collapse forward (a block a token, or blocks that walk the tokens) and
// backward (a block a token), the Sinkhorn comb forward and backward (a lane per matrix entry; a
// thread per token in the bench library) and mhc/post each way. The per-token math is
// mhc_math.h; the contracts opslot_kernels/mhc.h; the design docs/kernels.md "## mhc". The dx
// kernels are in mhc_dx.cuh.
#pragma once

#include "common.cuh"
#include "mhc_math.h"
#include "opslot_kernels/mhc.h"

namespace opslot {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRowVectors = 4;       // 16-byte vectors per stream and thread held by collapse_fwd
constexpr int kStreamThreads = 256;  // at most, in the blocks that stream a token's row
constexpr int kCollapseFwdThreads = 512;  // at most, in collapse_fwd's (the held rows: 256)

// Sums each of v[0..N) over the block in a fixed order; every thread gets the sums. `red` holds
// N x 32 floats; blockDim.x is a multiple of 32.
template <int N>
__device__ __forceinline__ void block_sum(float (&v)[N], float (*red)[32]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; ++n) red[n][warp] = v[n];
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += red[n][w];
    v[n] = s;
  }
}

// w = hi + mid + lo, each the bf16 rounding of what the previous terms leave.
__device__ __forceinline__ void split3(float w, bf16& hi, bf16& mid, bf16& lo) {
  hi = __float2bfloat16_rn(w);
  const float r1 = w - __bfloat162float(hi);
  mid = __float2bfloat16_rn(r1);
  lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
}

// Makes the compiler forget what it knows of v's bits: the float conversions made before this point
// cannot be reused after it, so a row held in registers stays as its raw 16-bit values (half the
// registers) instead of as the floats of the sum of squares.
template <typename V>
__device__ __forceinline__ void opaque(V& v) {
  if constexpr (sizeof(V) == 16) {
    uint4 u;
    memcpy(&u, &v, 16);
    asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
    memcpy(&v, &u, 16);
  }
}

// The value `.to(dtype)` gives (upstream rounds post and comb to the streams' dtype).
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

__global__ void split3_kernel(const float* __restrict__ w, int64_t n, bf16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bf16 a, b, c;
    split3(w[i], a, b, c);
    out[i] = a;
    out[n + i] = b;
    out[2 * n + i] = c;
  }
}

// The collapsed vector of one token: sum_j pw[j] * xs[j] in fp32, one rounding.
template <typename T, int HC, int VEC>
__device__ __forceinline__ Vec<T, VEC> collapse_vec(const Vec<T, VEC> (&xs)[HC],
                                                    const float (&pw)[HC]) {
  Vec<T, VEC> o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < HC; ++j) acc += pw[j] * to_float(xs[j].v[e]);
    o.v[e] = from_float<T>(acc);
  }
  return o;
}

// A thread's share of token t's row: the vectors threadIdx.x + v * blockDim.x (v < NV, those before
// nvec) of each stream, held in registers (the collapse forward's two kernels).
template <typename T, int HC, int VEC, int NV>
struct HeldRow {
  using V = Vec<T, VEC>;
  V v[HC][NV];
  __device__ __forceinline__ void load(const T* x, int64_t t, int64_t hidden, int64_t nvec) {
    const T* xt = x + t * HC * hidden;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (i < nvec) {
#pragma unroll
        for (int j = 0; j < HC; ++j) v[j][k] = reinterpret_cast<const V*>(xt + j * hidden)[i];
      }
    }
  }
  // ss += the squares of the held values, vector by vector, stream by stream.
  __device__ __forceinline__ void add_squares(int64_t nvec, float& ss) const {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (threadIdx.x + static_cast<int64_t>(k) * blockDim.x < nvec) {
#pragma unroll
        for (int j = 0; j < HC; ++j) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float f = to_float(v[j][k].v[e]);
            ss += f * f;
          }
        }
      }
    }
  }
  // The collapsed vectors of the held ones to ot (the token's output row).
  __device__ __forceinline__ void store_collapsed(const float (&pw)[HC], T* ot,
                                                  int64_t nvec) const {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (i < nvec) {
        V xs[HC];
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          xs[j] = v[j][k];
          opaque(xs[j]);
        }
        reinterpret_cast<V*>(ot)[i] = collapse_vec<T, HC, VEC>(xs, pw);
      }
    }
  }
};

// The GEMM's partial products of token t added: thread m < mixes gets mix m's, the others 0.
__device__ __forceinline__ float gemm_partials(const float* p, int64_t t, int64_t ldp, int nsplit,
                                               int mixes) {
  // m an int: an unsigned threadIdx.x in the index costs the pipelined collapse registers
  const int m = threadIdx.x;
  float pacc = 0.f;
  if (m < mixes) {
    for (int s = 0; s < nsplit; ++s) pacc += p[t * ldp + s * mixes + m];
  }
  return pacc;
}

// Token t's rstd, mixes and pre from this thread's part `ss` of the row's sum of squares and its
// GEMM partials `pacc`: writes rstd[t] and mix[t, ..]; every thread gets pre in pw (a block-wide
// sum, then a barrier after pre_s is written).
template <int HC>
__device__ __forceinline__ void token_weights(float ss, float pacc, int64_t t, int64_t hidden,
                                              int mixes, const float* scale, const float* base,
                                              float norm_eps, float hc_eps, float* mix, float* rstd,
                                              float (*red)[32], float* pre_s, float (&pw)[HC]) {
  float sum[1] = {ss};
  block_sum<1>(sum, red);
  const float r = rsqrtf(sum[0] / static_cast<float>(HC * hidden) + norm_eps);
  if (static_cast<int>(threadIdx.x) < mixes) {
    const int m = threadIdx.x;
    const float mv = r * pacc;
    mix[t * mixes + m] = mv;
    if (m < HC) pre_s[m] = mhc::sigmoid(mv * scale[0] + base[m]) + hc_eps;
  }
  if (threadIdx.x == 0) rstd[t] = r;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < HC; ++j) pw[j] = pre_s[j];
}

// ---- collapse forward: one block per token (rows that 16-byte vectors do not cover in two a
// stream and thread; the pipelined kernel below elsewhere) --------------------------------------
// kHold: the token's streams stay in registers between the sum of squares and the collapse (rows of
// up to kStreamThreads * kRowVectors vectors per stream); else the collapse reads them again (from
// L2: the block read them a moment ago).
template <typename T, int HC, int VEC, bool kHold, int MAXT = kStreamThreads>
__global__ void __launch_bounds__(MAXT)
    collapse_fwd_kernel(const T* __restrict__ x, const float* __restrict__ p, int nsplit,
                        int64_t ldp, const float* __restrict__ scale,
                        const float* __restrict__ base, float norm_eps, float hc_eps,
                        T* __restrict__ out, float* __restrict__ mix, float* __restrict__ rstd,
                        int64_t hidden, int mixes) {
  using V = Vec<T, VEC>;
  __shared__ float red[1][32];
  __shared__ float pre_s[HC];
  const int64_t t = blockIdx.x;
  const int64_t nvec = hidden / VEC;
  const T* xt = x + t * HC * hidden;
  // the GEMM's partial products of this token, loaded before the row (they do not depend on it)
  const float pacc = gemm_partials(p, t, ldp, nsplit, mixes);
  HeldRow<T, HC, VEC, kHold ? kRowVectors : 1> row;
  float ss = 0.f;
  if constexpr (kHold) {
    row.load(x, t, hidden, nvec);
    row.add_squares(nvec, ss);
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      V xs[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j) xs[j] = reinterpret_cast<const V*>(xt + j * hidden)[i];
#pragma unroll
      for (int j = 0; j < HC; ++j) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float f = to_float(xs[j].v[e]);
          ss += f * f;
        }
      }
    }
  }
  float pw[HC];
  token_weights<HC>(ss, pacc, t, hidden, mixes, scale, base, norm_eps, hc_eps, mix, rstd, red,
                    pre_s, pw);
  T* ot = out + t * hidden;
  if constexpr (kHold) {
    row.store_collapsed(pw, ot, nvec);
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      V xs[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j) xs[j] = reinterpret_cast<const V*>(xt + j * hidden)[i];
      reinterpret_cast<V*>(ot)[i] = collapse_vec<T, HC, VEC>(xs, pw);
    }
  }
}

// ---- collapse forward, pipelined: a block walks the tokens blockIdx.x, + gridDim.x, ... with the
// next token's row (and its GEMM partials) loaded into registers while the current one is reduced
// and collapsed. NV vectors per stream and thread cover the row (nvec <= blockDim.x * NV); the sums
// in collapse_fwd_kernel's order, so with its block size its bits. One vector a stream and thread
// (hc 4 at D 4096), or one stream: two blocks an SM, held by the bound to 64 registers (at 65 the
// one-wave grid halves and pre's forward at D 4096 takes 1.17x as long; over 64, ptxas spills).
template <typename T, int HC, int VEC, int NV, int MAXT>
__global__ void __launch_bounds__(MAXT, NV == 1 || HC == 1 ? 2 : 1)
    collapse_fwd_pipe_kernel(int64_t tokens, const T* __restrict__ x, const float* __restrict__ p,
                             int nsplit, int64_t ldp, const float* __restrict__ scale,
                             const float* __restrict__ base, float norm_eps, float hc_eps,
                             T* __restrict__ out, float* __restrict__ mix, float* __restrict__ rstd,
                             int64_t hidden, int mixes) {
  __shared__ float red[1][32];
  __shared__ float pre_s[HC];
  const int64_t nvec = hidden / VEC;
  HeldRow<T, HC, VEC, NV> cur, nxt;
  float pc = gemm_partials(p, blockIdx.x, ldp, nsplit, mixes), pn = 0.f;
  cur.load(x, blockIdx.x, hidden, nvec);
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    if (t + gridDim.x < tokens) {
      pn = gemm_partials(p, t + gridDim.x, ldp, nsplit, mixes);
      nxt.load(x, t + gridDim.x, hidden, nvec);
    }
    float ss = 0.f;
    cur.add_squares(nvec, ss);
    float pw[HC];
    token_weights<HC>(ss, pc, t, hidden, mixes, scale, base, norm_eps, hc_eps, mix, rstd, red,
                      pre_s, pw);
    cur.store_collapsed(pw, out + t * hidden, nvec);
    cur = nxt;
    pc = pn;
  }
}

// ---- post / comb, a lane per matrix entry -----------------------------------------------------
// A token's G lanes (HC * HC rounded up to a power of two; blockDim.x a multiple of G): lane e
// holds entry (e / HC, e % HC) and gathers the lines it lies on from its neighbours by shuffles,
// then runs mhc_math.h's line functions on them in the one-thread form's order: the bits of
// comb_fwd_kernel and comb_bwd_kernel below, with HC * HC times the threads in flight. Every thread
// of the block takes part in the shuffles (the lanes past the last token, or past HC * HC, store
// nothing).
template <int HC>
constexpr int comb_lanes() {
  return HC * HC <= 1 ? 1 : (HC * HC <= 4 ? 4 : 16);
}

template <int HC>
struct CombLane {
  static constexpr int G = comb_lanes<HC>();
  int64_t t;      // the token, clamped to the last one for the loads
  int e, i, j;    // the entry, its row and column (clamped into the matrix)
  bool live;      // t is a token and e an entry
  unsigned mask;  // the block's lanes in this warp
  __device__ CombLane(int64_t tokens) {
    const int64_t gid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t tt = gid / G;
    e = static_cast<int>(gid % G);
    live = tt < tokens && e < HC * HC;
    t = tt < tokens ? tt : tokens - 1;
    const int ec = e < HC * HC ? e : HC * HC - 1;
    i = ec / HC;
    j = ec % HC;
    mask = blockDim.x >= 32 ? 0xffffffffu : (1u << blockDim.x) - 1u;
  }
  // v[b] = entry b of this lane's column (columns) or row, as held by the lanes holding them.
  __device__ __forceinline__ void line(bool columns, float own, float (&v)[HC]) const {
#pragma unroll
    for (int b = 0; b < HC; ++b)
      v[b] = __shfl_sync(mask, own, columns ? b * HC + j : i * HC + b, G);
  }
};

// The Sinkhorn forward of this lane's entry (comb_forward's steps); hist (may be null) receives the
// entry entering each step at hist[(step) * blockDim.x].
template <int HC>
__device__ __forceinline__ float comb_lane_forward(const CombLane<HC>& L, const float* mt,
                                                   const float* base, float s2, int iters,
                                                   float eps, float* hist) {
  float p[HC];
  mhc::softmax_row<HC>(mt, base, s2, L.i, p);
  float c = p[L.j] + eps;
  const int steps = mhc::sinkhorn_steps(iters);
  for (int k = 1; k <= steps; ++k) {
    if (hist != nullptr) hist[(k - 1) * blockDim.x] = c;
    float v[HC];
    L.line(k & 1, c, v);  // odd steps normalise the columns
    c = mhc::mul(c, mhc::line_inv<HC>(v, eps));
  }
  return c;
}

template <int HC>
__global__ void comb_fwd_lanes_kernel(int64_t tokens, int iters, const float* __restrict__ mix,
                                      const float* __restrict__ scale,
                                      const float* __restrict__ base, float eps,
                                      float* __restrict__ post, float* __restrict__ comb) {
  constexpr int M = (2 + HC) * HC;
  const CombLane<HC> L(tokens);
  const float* mt = mix + L.t * M;
  if (L.live && L.e < HC) post[L.t * HC + L.e] = mhc::post_value<HC>(mt, base, scale[1], L.e);
  const float c = comb_lane_forward<HC>(L, mt, base, scale[2], iters, eps, nullptr);
  if (L.live) comb[L.t * HC * HC + L.e] = c;
}

// Its backward: da[t, HC .. M); the entries entering each step in shared memory, [step][thread].
template <int HC>
__global__ void comb_bwd_lanes_kernel(int64_t tokens, int iters, const float* __restrict__ mix,
                                      const float* __restrict__ scale,
                                      const float* __restrict__ base, float eps,
                                      const float* __restrict__ g_post,
                                      const float* __restrict__ g_comb, float* __restrict__ da) {
  constexpr int M = (2 + HC) * HC;
  extern __shared__ float hist[];
  const CombLane<HC> L(tokens);
  const float* mt = mix + L.t * M;
  float* dt = da + L.t * M;
  if (L.live && L.e < HC)
    dt[HC + L.e] = mhc::post_grad<HC>(mt, base, scale[1], L.e,
                                      g_post != nullptr ? g_post + L.t * HC : nullptr);
  float* h = hist + threadIdx.x;
  comb_lane_forward<HC>(L, mt, base, scale[2], iters, eps, h);
  float dc = g_comb != nullptr && L.live ? g_comb[L.t * HC * HC + L.e] : 0.f;
  for (int k = mhc::sinkhorn_steps(iters); k >= 1; --k) {
    const float c = h[(k - 1) * blockDim.x];
    float v[HC], dv[HC];
    L.line(k & 1, c, v);
    L.line(k & 1, dc, dv);
    const float inv = mhc::line_inv<HC>(v, eps);
    const float dot = mhc::line_dot<HC>(dv, v, inv);
    dc = mhc::mul(dc - dot, inv);
  }
  float p[HC], dv[HC];
  mhc::softmax_row<HC>(mt, base, scale[2], L.i, p);
  L.line(false, dc, dv);
  const float dot = mhc::softmax_dot<HC>(dv, p);
  if (L.live) dt[2 * HC + L.e] = p[L.j] * (dc - dot);
}

// ---- post / comb from the mixes: one thread per token (bench library; the same bits as the
// lanes' kernels above) ---------------------------------------------------------------------------
template <int HC>
__global__ void comb_fwd_kernel(int64_t tokens, int iters, const float* __restrict__ mix,
                                const float* __restrict__ scale, const float* __restrict__ base,
                                float eps, float* __restrict__ post, float* __restrict__ comb) {
  constexpr int M = (2 + HC) * HC;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  float m[M], b[M];
  const float sc[3] = {scale[0], scale[1], scale[2]};
#pragma unroll
  for (int i = 0; i < M; ++i) {
    m[i] = mix[t * M + i];
    b[i] = base[i];
  }
  mhc::comb_forward<HC>(m, b, sc, iters, eps, post + t * HC, comb + t * HC * HC, nullptr, 0);
}

// Its backward: da[t, HC .. M); the matrices of the recomputed Sinkhorn steps live in shared
// memory, [step][entry][thread] (consecutive threads, consecutive banks).
template <int HC>
__global__ void comb_bwd_kernel(int64_t tokens, int iters, const float* __restrict__ mix,
                                const float* __restrict__ scale, const float* __restrict__ base,
                                float eps, const float* __restrict__ g_post,
                                const float* __restrict__ g_comb, float* __restrict__ da) {
  constexpr int M = (2 + HC) * HC;
  extern __shared__ float hist[];
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  float m[M], b[M], d[M];
  const float sc[3] = {scale[0], scale[1], scale[2]};
#pragma unroll
  for (int i = 0; i < M; ++i) {
    m[i] = mix[t * M + i];
    b[i] = base[i];
  }
  mhc::comb_backward<HC>(m, b, sc, iters, eps, g_post ? g_post + t * HC : nullptr,
                         g_comb ? g_comb + t * HC * HC : nullptr, d, hist + threadIdx.x,
                         static_cast<int>(blockDim.x));
#pragma unroll
  for (int i = HC; i < M; ++i) da[t * M + i] = d[i];
}

// ---- d base, d scale: the per-token da and dsc summed over the tokens, a block a column -------
// Thread i adds the tokens i + u * blockDim.x into partial u % 8 (eight loads in flight), the
// partials in a fixed tree, then the block's fixed order (block_sum).
__global__ void __launch_bounds__(512)
    token_sums_kernel(int64_t tokens, const float* __restrict__ a, int na,
                      const float* __restrict__ b, int nb, float* __restrict__ sa,
                      float* __restrict__ sb) {
  constexpr int U = 8;
  __shared__ float red[1][32];
  const int c = blockIdx.x;
  const bool first = c < na;
  const float* src = first ? a + c : b + (c - na);
  const int64_t ld = first ? na : nb, step = blockDim.x;
  float acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0.f;
  int64_t t = threadIdx.x;
  for (; t + (U - 1) * step < tokens; t += U * step) {
    float x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = src[(t + u * step) * ld];
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] += x[u];
  }
#pragma unroll
  for (int u = 0; u < U - 1; ++u) {
    if (t + u * step < tokens) acc[u] += src[(t + u * step) * ld];
  }
#pragma unroll
  for (int w = 1; w < U; w *= 2) {
#pragma unroll
    for (int u = 0; u < U; u += 2 * w) acc[u] += acc[u + w];
  }
  float v[1] = {acc[0]};
  block_sum<1>(v, red);
  if (threadIdx.x == 0) (first ? sa[c] : sb[c - na]) = v[0];
}

// ---- collapse backward up to dx: one block per token -----------------------------------------
template <typename T, int HC, int VEC, bool kComb>
__global__ void __launch_bounds__(kStreamThreads)
    collapse_bwd_kernel(const T* __restrict__ x, const T* __restrict__ g,
                        const float* __restrict__ mix, const float* __restrict__ rstd,
                        const float* __restrict__ scale, const float* __restrict__ base,
                        float hc_eps, float* __restrict__ da, float* __restrict__ pre,
                        float* __restrict__ dsc, float* __restrict__ coef_a,
                        bf16* __restrict__ coef_a3, int64_t ld_a3, float* __restrict__ coef_c,
                        int64_t hidden) {
  constexpr int M = kComb ? (2 + HC) * HC : HC;
  constexpr int G = kComb ? 3 : 1;
  using V = Vec<T, VEC>;
  __shared__ float red[HC][32];
  const int64_t t = blockIdx.x;
  const int64_t nvec = hidden / VEC;
  float acc[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) acc[j] = 0.f;
  if (g != nullptr) {
    const T* xt = x + t * HC * hidden;
    const T* gt = g + t * hidden;
#pragma unroll 2
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V gv = reinterpret_cast<const V*>(gt)[i];
      V xv[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j) xv[j] = reinterpret_cast<const V*>(xt + j * hidden)[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float gf = to_float(gv.v[e]);
#pragma unroll
        for (int j = 0; j < HC; ++j) acc[j] += gf * to_float(xv[j].v[e]);
      }
    }
  }
  block_sum<HC>(acc, red);
  if (threadIdx.x != 0) return;
  float m[M], b[M], d[M], a[M], pr[HC], ds[G], c;
  const float sc[3] = {scale[0], kComb ? scale[1] : 0.f, kComb ? scale[2] : 0.f};
#pragma unroll
  for (int i = 0; i < M; ++i) {
    m[i] = mix[t * M + i];
    b[i] = base[i];
    d[i] = i >= HC ? da[t * M + i] : 0.f;
  }
  mhc::token_backward<HC>(acc, m, b, sc, M, rstd[t], 1.f / static_cast<float>(HC * hidden), hc_eps,
                          d, pr, ds, a, &c);
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    da[t * M + j] = d[j];
    pre[t * HC + j] = pr[j];
  }
#pragma unroll
  for (int i = 0; i < G; ++i) dsc[t * G + i] = ds[i];
#pragma unroll
  for (int i = 0; i < M; ++i) coef_a[t * M + i] = a[i];
  coef_c[t] = c;
  if (coef_a3 != nullptr) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      bf16 hi, mid, lo;
      split3(a[i], hi, mid, lo);
      coef_a3[t * ld_a3 + i] = hi;
      coef_a3[t * ld_a3 + M + i] = mid;
      coef_a3[t * ld_a3 + 2 * M + i] = lo;
    }
    for (int64_t i = 3 * M; i < ld_a3; ++i) coef_a3[t * ld_a3 + i] = __float2bfloat16_rn(0.f);
  }
}

// ---- mhc/post -------------------------------------------------------------------------------
// post and comb of token t, rounded to T (upstream's `.to(dtype)`), into every thread's registers:
// p[i] = p_i, c[j][i] = c_ji (read once per block through shared memory).
template <typename T, int HC>
__device__ __forceinline__ void load_post_coefs(const float* post, const float* comb, int64_t t,
                                                float (&p)[HC], float (&c)[HC][HC]) {
  __shared__ float cf[HC + HC * HC];
  const int i = threadIdx.x;
  if (i < HC)
    cf[i] = round_to<T>(post[t * HC + i]);
  else if (i < HC + HC * HC)
    cf[i] = round_to<T>(comb[t * HC * HC + i - HC]);
  __syncthreads();
#pragma unroll
  for (int a = 0; a < HC; ++a) {
    p[a] = cf[a];
#pragma unroll
    for (int j = 0; j < HC; ++j) c[j][a] = cf[HC + j * HC + a];
  }
}

template <typename T, int HC, int VEC>
__global__ void __launch_bounds__(kStreamThreads)
    post_fwd_kernel(const float* __restrict__ post, const float* __restrict__ comb,
                    const T* __restrict__ bo, const T* __restrict__ h, T* __restrict__ out,
                    int64_t hidden) {
  const int64_t t = blockIdx.x;
  float p[HC], c[HC][HC];
  load_post_coefs<T, HC>(post, comb, t, p, c);
  const int64_t nvec = hidden / VEC;
  const T* bt = bo + t * hidden;
  const T* ht = h + t * HC * hidden;
  T* ot = out + t * HC * hidden;
#pragma unroll 2
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const int64_t i = v * VEC;
    float b[VEC], hv[HC][VEC];
    load_vec<VEC>(bt + i, b);
#pragma unroll
    for (int j = 0; j < HC; ++j) load_vec<VEC>(ht + j * hidden + i, hv[j]);
#pragma unroll
    for (int io = 0; io < HC; ++io) {
      float o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float acc = p[io] * b[e];
#pragma unroll
        for (int j = 0; j < HC; ++j) acc += c[j][io] * hv[j][e];
        o[e] = acc;
      }
      store_vec<VEC>(ot + io * hidden + i, o);
    }
  }
}

template <typename T, int HC, int VEC>
__global__ void __launch_bounds__(kStreamThreads)
    post_bwd_kernel(const T* __restrict__ grad, const float* __restrict__ post,
                    const float* __restrict__ comb, const T* __restrict__ bo,
                    const T* __restrict__ h, T* __restrict__ d_bo, T* __restrict__ d_h,
                    float* __restrict__ d_post, float* __restrict__ d_comb, int64_t hidden) {
  constexpr int N = HC + HC * HC;
  __shared__ float red[N][32];
  const int64_t t = blockIdx.x;
  float p[HC], c[HC][HC];
  load_post_coefs<T, HC>(post, comb, t, p, c);
  float acc[N];  // acc[i]: d_post_i; acc[HC + j*HC + i]: d_comb_ji
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.f;
  const int64_t nvec = hidden / VEC;
  const T* gt = grad + t * HC * hidden;
  const T* bt = bo + t * hidden;
  const T* ht = h + t * HC * hidden;
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const int64_t i = v * VEC;
    float gv[HC][VEC], b[VEC], hv[HC][VEC];
#pragma unroll
    for (int io = 0; io < HC; ++io) load_vec<VEC>(gt + io * hidden + i, gv[io]);
    load_vec<VEC>(bt + i, b);
#pragma unroll
    for (int j = 0; j < HC; ++j) load_vec<VEC>(ht + j * hidden + i, hv[j]);
    float o[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      float s = 0.f;
#pragma unroll
      for (int io = 0; io < HC; ++io) s += p[io] * gv[io][e];
      o[e] = s;
    }
    store_vec<VEC>(d_bo + t * hidden + i, o);
#pragma unroll
    for (int j = 0; j < HC; ++j) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float s = 0.f;
#pragma unroll
        for (int io = 0; io < HC; ++io) s += c[j][io] * gv[io][e];
        o[e] = s;
      }
      store_vec<VEC>(d_h + (t * HC + j) * hidden + i, o);
    }
#pragma unroll
    for (int io = 0; io < HC; ++io) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        acc[io] += gv[io][e] * b[e];
#pragma unroll
        for (int j = 0; j < HC; ++j) acc[HC + j * HC + io] += gv[io][e] * hv[j][e];
      }
    }
  }
  block_sum<N>(acc, red);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int io = 0; io < HC; ++io) d_post[t * HC + io] = acc[io];
#pragma unroll
    for (int e = 0; e < HC * HC; ++e) d_comb[t * HC * HC + e] = acc[HC + e];
  }
}

}  // namespace
}  // namespace opslot
