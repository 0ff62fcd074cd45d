// DeepSeek-V4's hyper-connections (mhc/pre, mhc/post, mhc/head): the memory-bound passes around the
// forward's fp32 GEMM against `fn` (which the caller runs on cuBLAS), and the backward's dx and d
// fn (one tensor-core pass where it fits: dx_dfn_kernel). See opslot_kernels/mhc.h for the
// contracts, mhc_math.h for the per-token math (shared with the CPU kernels of
// kernels/torch/mhc.cc) and docs/kernels.md "## mhc" for the design and its byte counts.
#include <initializer_list>
#include <type_traits>

#include "common.cuh"
#include "mhc_math.h"
#include "mma_sm80.cuh"
#include "opslot_kernels/mhc.h"

namespace opslot {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRowVectors = 4;       // 16-byte vectors per stream and thread held by collapse_fwd
constexpr int kStreamThreads = 256;  // at most, in the blocks that stream a token's row
// Bench-library knobs (opslot_mhc_set_tuning), compile-time defaults in the production library:
// - g_hold_threads: collapse_fwd holds the token's row in registers between the sum of squares and
//   the collapse when its block (stream_threads: the same for either path, so the results are
//   bitwise equal) has at most this many threads and kRowVectors vectors per stream and thread
//   cover the row. Default 0: never; reading the row again (from L2) measured faster on an H200
//   (docs/kernels.md "## mhc").
// - g_dx_version: 1 (default) the production backward, 2 .. 12 the CUDA-core dx variants of
//   launch_dx_variant with the d fn GEMM, 13 and 14 other rings of dx_dfn_kernel (bench library
//   only; see dx_dfn_fits).
#ifdef OPSLOT_KERNELS_BENCH
int g_hold_threads = 0;
int g_dx_version = 1;
#else
constexpr int g_hold_threads = 0;
#endif

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

// ---- collapse forward: one block per token ------------------------------------------------------
// kHold: the token's streams stay in registers between the sum of squares and the collapse (rows of
// up to kStreamThreads * kRowVectors vectors per stream); else the collapse reads them again (from
// L2: the block read them a moment ago).
template <typename T, int HC, int VEC, bool kHold>
__global__ void __launch_bounds__(kStreamThreads)
    collapse_fwd_kernel(const T* __restrict__ x, const float* __restrict__ p, int nsplit,
                        int64_t ldp, const float* __restrict__ scale,
                        const float* __restrict__ base, float norm_eps, float hc_eps,
                        T* __restrict__ out, float* __restrict__ mix, float* __restrict__ rstd,
                        int64_t hidden, int mixes) {
  using V = Vec<T, VEC>;
  constexpr int NV = kHold ? kRowVectors : 1;
  __shared__ float red[1][32];
  __shared__ float pre_s[HC];
  const int64_t t = blockIdx.x;
  const int64_t nvec = hidden / VEC;
  const T* xt = x + t * HC * hidden;
  // the GEMM's partial products of this token, loaded before the row (they do not depend on it)
  float pacc = 0.f;
  if (static_cast<int>(threadIdx.x) < mixes) {
    for (int s = 0; s < nsplit; ++s) pacc += p[t * ldp + s * mixes + threadIdx.x];
  }
  V xv[HC][NV];
  float ss[1] = {0.f};
  if constexpr (kHold) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
      if (i < nvec) {
#pragma unroll
        for (int j = 0; j < HC; ++j) xv[j][v] = reinterpret_cast<const V*>(xt + j * hidden)[i];
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      if (threadIdx.x + static_cast<int64_t>(v) * blockDim.x < nvec) {
#pragma unroll
        for (int j = 0; j < HC; ++j) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float f = to_float(xv[j][v].v[e]);
            ss[0] += f * f;
          }
        }
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
#pragma unroll
      for (int j = 0; j < HC; ++j) xv[j][0] = reinterpret_cast<const V*>(xt + j * hidden)[i];
#pragma unroll
      for (int j = 0; j < HC; ++j) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float f = to_float(xv[j][0].v[e]);
          ss[0] += f * f;
        }
      }
    }
  }
  block_sum<1>(ss, red);
  const float r = rsqrtf(ss[0] / static_cast<float>(HC * hidden) + norm_eps);
  if (static_cast<int>(threadIdx.x) < mixes) {
    const int m = threadIdx.x;
    const float mv = r * pacc;
    mix[t * mixes + m] = mv;
    if (m < HC) pre_s[m] = mhc::sigmoid(mv * scale[0] + base[m]) + hc_eps;
  }
  if (threadIdx.x == 0) rstd[t] = r;
  __syncthreads();
  float pw[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) pw[j] = pre_s[j];
  T* ot = out + t * hidden;
  auto collapse = [&](const V(&xs)[HC], int64_t i) {
    V o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < HC; ++j) acc += pw[j] * to_float(xs[j].v[e]);
      o.v[e] = from_float<T>(acc);
    }
    reinterpret_cast<V*>(ot)[i] = o;
  };
  if constexpr (kHold) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
      if (i < nvec) {
        V xs[HC];
#pragma unroll
        for (int j = 0; j < HC; ++j) {
          xs[j] = xv[j][v];
          opaque(xs[j]);
        }
        collapse(xs, i);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      V xs[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j) xs[j] = reinterpret_cast<const V*>(xt + j * hidden)[i];
      collapse(xs, i);
    }
  }
}

// ---- post / comb from the mixes: one thread per token ----------------------------------------
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

// dx's value before its one rounding: gf = pre_j g (0 without g), s = sum_m coef_a[m] fn[m, k],
// c = coef_c, xv = x (dx_kernel and dx_dfn_kernel).
__device__ __forceinline__ float dx_value(float gf, float s, float c, float xv) {
  return gf + s - c * xv;
}

// ---- dx: tiles of (one stream, THREADS * P columns) x TOKENS tokens; fn's columns in registers --
// A thread owns P adjacent columns of one stream (fn's MAXM x P values in registers) and walks the
// tile's tokens (kMinBlocks: blocks per SM the registers must allow). kRing: the next tokens' loads
// in flight as cp.async copies into shared memory. kPrefetch: the loads of the
// next dx_group tokens stay in flight, each slot refilled as soon as its token is taken (else: a
// group is loaded, then computed). Every configuration computes the same sums in the same order
// (the same bits); the production one is launch_dx_production below, the others are bench-library
// variants (opslot_mhc_set_tuning).
template <typename V>
constexpr int dx_group() {
  return sizeof(V) >= 16 ? 4 : 8;  // 64 .. 128 bytes in flight per thread
}

template <typename T, int P, int MAXM, int THREADS, int TOKENS, bool kPrefetch, int kMinBlocks,
          bool kRing>
__global__ void __launch_bounds__(THREADS, kMinBlocks)
    dx_kernel(const T* __restrict__ x, const T* __restrict__ g, const float* __restrict__ fn,
              const float* __restrict__ coef_a, const float* __restrict__ coef_c,
              const float* __restrict__ pre, T* __restrict__ dx, int64_t tokens, int hc,
              int64_t hidden, int mixes) {
  using V = Vec<T, P>;
  constexpr int G = dx_group<V>();
  __shared__ __align__(16) float sa[TOKENS][MAXM];
  __shared__ float sc[TOKENS];
  __shared__ float sp[TOKENS];
  const int j = static_cast<int>(blockIdx.x % hc);
  const int64_t d0 = (blockIdx.x / hc) * static_cast<int64_t>(THREADS * P) + threadIdx.x * P;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * TOKENS;
  const int nt = static_cast<int>(tokens - t0 < TOKENS ? tokens - t0 : TOKENS);
  const int64_t K = hc * hidden;
  for (int i = threadIdx.x; i < nt * MAXM; i += THREADS) {
    const int tt = i / MAXM, m = i % MAXM;
    sa[tt][m] = m < mixes ? coef_a[(t0 + tt) * mixes + m] : 0.f;
  }
  for (int i = threadIdx.x; i < nt; i += THREADS) {
    sc[i] = coef_c[t0 + i];
    sp[i] = pre[(t0 + i) * hc + j];
  }
  const bool active = d0 < hidden;
  float w[MAXM][P];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
#pragma unroll
    for (int e = 0; e < P; ++e)
      w[m][e] = (active && m < mixes) ? fn[m * K + j * hidden + d0 + e] : 0.f;
  }
  __syncthreads();
  if (!active) return;
  const T* xp = x + j * hidden + d0;
  const T* gp = g != nullptr ? g + d0 : nullptr;
  T* op = dx + j * hidden + d0;
  auto load = [&](int tt, V& xv, V& gv) {
    const int64_t t = t0 + tt;
    xv = *reinterpret_cast<const V*>(xp + t * K);
    if (gp != nullptr) gv = *reinterpret_cast<const V*>(gp + t * hidden);
  };
  auto compute = [&](int tt, const V& xv, const V& gv) {
    const float* a = sa[tt];
    float acc[P];
#pragma unroll
    for (int e = 0; e < P; ++e) acc[e] = 0.f;
#pragma unroll
    for (int m = 0; m < MAXM; m += 4) {
      const float4 a4 = *reinterpret_cast<const float4*>(a + m);
#pragma unroll
      for (int e = 0; e < P; ++e) {
        acc[e] += a4.x * w[m][e];
        acc[e] += a4.y * w[m + 1][e];
        acc[e] += a4.z * w[m + 2][e];
        acc[e] += a4.w * w[m + 3][e];
      }
    }
    const float pj = sp[tt], cc = sc[tt];
    V o;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float gf = gp != nullptr ? pj * to_float(gv.v[e]) : 0.f;
      o.v[e] = from_float<T>(dx_value(gf, acc[e], cc, to_float(xv.v[e])));
    }
    *reinterpret_cast<V*>(op + (t0 + tt) * K) = o;
  };
  if constexpr (kRing) {
    // each thread's next R tokens in flight as cp.async copies into its own slots of a ring in
    // shared memory (64 bytes per thread and tensor): no registers held for them
    constexpr int R = sizeof(V) >= 16 ? 4 : 64 / static_cast<int>(sizeof(V));
    __shared__ V rx[R][THREADS];
    __shared__ V rg[R][THREADS];
    auto issue = [&](int tt) {
      if (tt < nt) {
        const int64_t t = t0 + tt;
        cp_async_ca<sizeof(V)>(&rx[tt % R][threadIdx.x], xp + t * K);
        if (gp != nullptr) cp_async_ca<sizeof(V)>(&rg[tt % R][threadIdx.x], gp + t * hidden);
      }
      cp_async_commit();  // one group per token, empty past the end: the count stays uniform
    };
#pragma unroll
    for (int i = 0; i < R; ++i) issue(i);
    for (int tt = 0; tt < nt; ++tt) {
      cp_async_wait<R - 1>();  // token tt's group has landed
      const V xc = rx[tt % R][threadIdx.x];
      V gc;
      if (gp != nullptr) gc = rg[tt % R][threadIdx.x];
      issue(tt + R);  // refills the slot just read (this thread's own)
      compute(tt, xc, gc);
    }
  } else {
    V xs[G], gs[G];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int u = 0; u < G; ++u)
        if (u < nt) load(u, xs[u], gs[u]);
    }
    for (int tt = 0; tt < nt; tt += G) {
      if constexpr (!kPrefetch) {
#pragma unroll
        for (int u = 0; u < G; ++u)
          if (tt + u < nt) load(tt + u, xs[u], gs[u]);
      }
#pragma unroll
      for (int u = 0; u < G; ++u) {
        if (tt + u < nt) {
          const V xc = xs[u], gc = gs[u];
          if (kPrefetch && tt + G + u < nt) load(tt + G + u, xs[u], gs[u]);
          compute(tt + u, xc, gc);
        }
      }
    }
  }
}

// ---- dx and d fn in one pass over x, on tensor cores (bf16 streams) ---------------------------
// A block owns 64 columns of one stream and a range of up to kDxfSpan tokens, taken 64 at a time
// through a STAGES-deep cp.async ring (x, g, the split coefficients, pre_j, coef_c of a tile).
// fn's columns sit in shared memory as bf16 terms (split3): sB row n = [hi hi | mid], two regions
// of fn's M values each, zero-padded to 16. The coefficients come split by collapse_bwd (rows
// [hi mid lo] of M each); the kernel takes their first two terms (sA: [hi mid], zero-padded to KA).
// Per tile:
//   S = coef fn: sA against the regions, hi fhi + mid fhi | hi fmid: the products above 2^-18 of
//       the largest (fp32 accumulators); the three left out (mid fmid, lo fhi, hi flo) are each
//       below 2^-18 relative: about the fp32 rounding of a sum over thousands of tokens, and 1/256
//       of dx's bf16 rounding;
//   dx = pre_j g + S - c x (dx_value: fp32, one rounding), stored from the accumulators;
//   D += sA^T x: the two terms' sums of coef_a[t, m] x[t, n] (fp32 accumulators across the range).
// One barrier per tile. At the end D's terms are added (hi + mid) into the range's slab of
// `dfn` ([M, K]: dfn itself for one range, else the scratch that dfn_reduce adds in range order):
// no atomics, a fixed order, the same bits on every run.
constexpr int kDxfTok = 64, kDxfCols = 64, kDxfSpan = 4096;
constexpr int kDxfPitch = kDxfCols + 8;  // x / g rows of 144 bytes: ldmatrix rows on distinct banks

template <int MAXM>
struct DxfShape {
  static constexpr int n1 = (2 * MAXM + 15) / 16, n2 = (MAXM + 15) / 16;  // 16-wide chunks
  static constexpr int KA = 16 * n1, LDA = KA + 8;  // sA: [hi mid] + the rest; D has KA rows
  static constexpr int KB = 16 * (n1 + n2), LDB = KB + 8;
  static constexpr int kXBytes = kDxfTok * kDxfPitch * 2, kABytes = kDxfTok * LDA * 2;
  static constexpr int kStage = 2 * kXBytes + kABytes + 2 * kDxfTok * 4;
  static constexpr int kSmem(int stages) { return stages * kStage + kDxfCols * LDB * 2; }
  static_assert(KA * kDxfCols * 4 <= 2 * kStage, "D is staged in the ring");
};

template <int MAXM>
struct DxfStage {
  bf16 (*x)[kDxfPitch];
  bf16 (*g)[kDxfPitch];
  bf16 (*a)[DxfShape<MAXM>::LDA];  // the split coefficients
  float* p;                        // pre_j [64]
  float* cc;                       // coef_c [64]
  __device__ DxfStage(unsigned char* base, int s) {
    using S = DxfShape<MAXM>;
    unsigned char* b = base + s * S::kStage;
    x = reinterpret_cast<bf16(*)[kDxfPitch]>(b);
    g = reinterpret_cast<bf16(*)[kDxfPitch]>(b + S::kXBytes);
    a = reinterpret_cast<bf16(*)[S::LDA]>(b + 2 * S::kXBytes);
    p = reinterpret_cast<float*>(b + 2 * S::kXBytes + S::kABytes);
    cc = p + kDxfTok;
  }
};

template <int MAXM, int STAGES, int MINB>
__global__ void __launch_bounds__(256, MINB)
    dx_dfn_kernel(const bf16* __restrict__ x, const bf16* __restrict__ g,
                  const float* __restrict__ fn, const bf16* __restrict__ coef3,
                  const float* __restrict__ coef_c, const float* __restrict__ pre,
                  bf16* __restrict__ dx, float* __restrict__ dfn, int64_t tokens, int hc,
                  int64_t hidden, int mixes, int lda3) {
  using S = DxfShape<MAXM>;
  constexpr int kAChunks = S::KA / 8;  // 16-byte pieces of a coefficient row
  extern __shared__ __align__(16) unsigned char smem[];
  auto sB = reinterpret_cast<bf16(*)[S::LDB]>(smem + STAGES * S::kStage);
  const int M = mixes, tid = threadIdx.x;
  const int j = static_cast<int>(blockIdx.x % hc);
  const int64_t c0 = (blockIdx.x / hc) * static_cast<int64_t>(kDxfCols);
  const int64_t K = hc * hidden, col = j * hidden + c0;  // the block's first column in x's rows
  const int64_t tbeg = static_cast<int64_t>(blockIdx.y) * kDxfSpan;
  const int64_t tend = tokens < tbeg + kDxfSpan ? tokens : tbeg + kDxfSpan;
  const int ntiles = static_cast<int>((tend - tbeg + kDxfTok - 1) / kDxfTok);
  const bf16 zero = __float2bfloat16_rn(0.f);
  for (int i = tid; i < kDxfCols * S::KB; i += 256) {
    const int n = i % kDxfCols, kb = i / kDxfCols;  // n fastest: fn's reads coalesce
    const int r = kb < 16 * S::n1 ? 0 : 1;  // region: fn's hi against [hi mid], mid against hi
    const int kk = kb - r * 16 * S::n1;
    bf16 t[3] = {zero, zero, zero};
    if (kk < (2 - r) * M) split3(fn[(kk % M) * K + col + n], t[0], t[1], t[2]);
    sB[n][kb] = r == 0 ? t[0] : t[1];
  }
  auto issue = [&](int tile) {
    if (tile < ntiles) {
      const DxfStage<MAXM> st(smem, tile % STAGES);
      const int64_t t0 = tbeg + static_cast<int64_t>(tile) * kDxfTok;
      const int nt = static_cast<int>(tend - t0 < kDxfTok ? tend - t0 : kDxfTok);
      for (int i = tid; i < kDxfTok * 8; i += 256) {
        const int r = i >> 3, ch = (i & 7) * 8;
        if (r < nt) {
          cp_async16(&st.x[r][ch], x + (t0 + r) * K + col + ch);
          if (g != nullptr) cp_async16(&st.g[r][ch], g + (t0 + r) * hidden + c0 + ch);
        } else {  // rows past the end: zero (0 * x in D)
          *reinterpret_cast<uint4*>(&st.x[r][ch]) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      for (int i = tid; i < kDxfTok * kAChunks; i += 256) {
        const int r = i / kAChunks, ch = (i % kAChunks) * 8;
        if (r < nt)  // KA <= lda3: the columns past 2M hold lo terms or zeros, met by zeros in sB
          cp_async16(&st.a[r][ch], coef3 + (t0 + r) * lda3 + ch);
        else
          *reinterpret_cast<uint4*>(&st.a[r][ch]) = make_uint4(0u, 0u, 0u, 0u);
      }
      if (tid < nt) {
        cp_async_ca<4>(st.p + tid, pre + (t0 + tid) * hc + j);
        cp_async_ca<4>(st.cc + tid, coef_c + t0 + tid);
      }
    }
    cp_async_commit();  // one group per tile, empty past the end: the count stays uniform
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, cq = lane & 3;
  const int rg = warp & 3, cg = warp >> 2;  // tokens 16 rg .., columns 32 cg ..
  const int c1 = (2 * M + 15) / 16, c2 = (M + 15) / 16;
  float dacc[S::n1][4][4];  // D over the warp's tokens: rows 16 mt .., columns 32 cg + 8 q ..
#pragma unroll
  for (int mt = 0; mt < S::n1; ++mt) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dacc[mt][q][e] = 0.f;
    }
  }
  for (int tile = 0; tile < ntiles; ++tile) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // the tile has landed; every thread is past the previous tile (its stage)
    issue(tile + STAGES - 1);
    const DxfStage<MAXM> st(smem, tile % STAGES);
    {                     // D += sA^T x over the warp's 16 tokens and 32 columns
      uint32_t xb[2][4];  // x as B (k = tokens, n = columns): two 8-column tiles per ldmatrix
#pragma unroll
      for (int qp = 0; qp < 2; ++qp)
        ldsm_x4_t(xb[qp], &st.x[16 * rg + (lane & 7) + ((lane >> 3) & 1) * 8]
                               [32 * cg + 16 * qp + (lane >> 4) * 8]);
#pragma unroll
      for (int mt = 0; mt < S::n1; ++mt) {
        if (mt < c1) {
          uint32_t at[4];  // sA^T: rows 16 mt .. of the coefficients, k = the warp's tokens
          ldsm_x4_t(
              at,
              &st.a[16 * rg + (lane & 7) + ((lane >> 4) & 1) * 8][16 * mt + ((lane >> 3) & 1) * 8]);
#pragma unroll
          for (int qp = 0; qp < 2; ++qp) {
            mma16816<bf16>(dacc[mt][2 * qp], at, xb[qp][0], xb[qp][1]);
            mma16816<bf16>(dacc[mt][2 * qp + 1], at, xb[qp][2], xb[qp][3]);
          }
        }
      }
    }
    uint32_t af[S::n1][4];  // this warp's 16 tokens of sA, each chunk loaded once for both regions
#pragma unroll
    for (int c = 0; c < S::n1; ++c)
      if (c < c1) ldsm_x4(af[c], &st.a[16 * rg + (lane & 15)][16 * c + (lane >> 4) * 8]);
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
    }
    auto region = [&](auto n_max, int chunks, int boff) {
#pragma unroll
      for (int c = 0; c < decltype(n_max)::value; ++c) {
        if (c < chunks) {
#pragma unroll
          for (int np = 0; np < 2; ++np) {  // two n-tiles per ldmatrix
            uint32_t b[4];
            ldsm_x4(b, &sB[32 * cg + 16 * np + (lane & 7) + (lane >> 4) * 8]
                          [boff + 16 * c + ((lane >> 3) & 1) * 8]);
            mma16816<bf16>(acc[2 * np], af[c], b[0], b[1]);
            mma16816<bf16>(acc[2 * np + 1], af[c], b[2], b[3]);
          }
        }
      }
    };
    region(std::integral_constant<int, S::n1>{}, c1, 0);
    region(std::integral_constant<int, S::n2>{}, c2, 16 * S::n1);
    const int64_t t0 = tbeg + static_cast<int64_t>(tile) * kDxfTok;
    const int nt = static_cast<int>(tend - t0 < kDxfTok ? tend - t0 : kDxfTok);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 16 * rg + gq + 8 * h;
      if (t >= nt) continue;
      const float pj = st.p[t], cc = st.cc[t];
      bf16* row = dx + (t0 + t) * K + col;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = 32 * cg + 8 * q + 2 * cq;
        const __nv_bfloat162 xv = *reinterpret_cast<const __nv_bfloat162*>(&st.x[t][n]);
        float gf0 = 0.f, gf1 = 0.f;
        if (g != nullptr) {
          const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(&st.g[t][n]);
          gf0 = pj * __low2float(gv);
          gf1 = pj * __high2float(gv);
        }
        *reinterpret_cast<__nv_bfloat162*>(row + n) = __halves2bfloat162(
            __float2bfloat16_rn(dx_value(gf0, acc[q][2 * h], cc, __low2float(xv))),
            __float2bfloat16_rn(dx_value(gf1, acc[q][2 * h + 1], cc, __high2float(xv))));
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();                             // the ring is free: D is summed in it
  float* sD = reinterpret_cast<float*>(smem);  // [KA][64]
  for (int r = 0; r < 4; ++r) {                // the token groups' partials, in group order
    if (rg == r) {
#pragma unroll
      for (int mt = 0; mt < S::n1; ++mt) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& d =
                sD[(16 * mt + gq + 8 * (e >> 1)) * kDxfCols + 32 * cg + 8 * q + 2 * cq + (e & 1)];
            d = r == 0 ? dacc[mt][q][e] : d + dacc[mt][q][e];
          }
        }
      }
    }
    __syncthreads();
  }
  float* out = dfn + static_cast<int64_t>(blockIdx.y) * M * K;
  for (int i = tid; i < M * kDxfCols; i += 256) {
    const int m = i / kDxfCols, n = i % kDxfCols;
    out[m * K + col + n] = sD[m * kDxfCols + n] + sD[(M + m) * kDxfCols + n];
  }
}

// dfn[i] = sum over the ranges r = 0, 1, .. of part[r * n + i], in that order.
__global__ void dfn_reduce_kernel(const float* __restrict__ part, int ranges, int64_t n,
                                  float* __restrict__ dfn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = part[i];
    for (int r = 1; r < ranges; ++r) s += part[r * n + i];
    dfn[i] = s;
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

// ---- launch helpers -----------------------------------------------------------------------------
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads of a per-token block that streams its row: about two vectors per thread, 64 .. 256.
int stream_threads(int64_t nvec) {
  int t = 64;
  while (t < kStreamThreads && 2 * static_cast<int64_t>(t) < nvec) t *= 2;
  return t;
}

// Calls f(std::integral_constant<int, HC>) for hc in 1..4.
template <typename F>
int dispatch_hc(int64_t hc, const char* what, F&& f) {
  switch (hc) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hc_mult %lld is not supported (1 to %d)", what,
                       static_cast<long long>(hc), mhc::kMaxHc);
  }
}

int check_shape(const char* what, int64_t tokens, int64_t hc, int64_t hidden) {
  if (tokens < 0 || hidden < 1 || hc < 1)
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape (tokens %lld, hc %lld, hidden %lld)", what,
        static_cast<long long>(tokens), static_cast<long long>(hc), static_cast<long long>(hidden));
  if (tokens > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: %lld tokens (at most %d)", what,
                     static_cast<long long>(tokens), INT32_MAX);
  return OPSLOT_OK;
}

int check_mixes(const char* what, int64_t hc, int64_t mixes) {
  if (mixes != hc && mixes != (2 + hc) * hc)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: %lld mixes for hc_mult %lld (expected %lld for pre or %lld for head)",
                     what, static_cast<long long>(mixes), static_cast<long long>(hc),
                     static_cast<long long>((2 + hc) * hc), static_cast<long long>(hc));
  return OPSLOT_OK;
}

// 16-byte vectors when every row starts 16-byte aligned, else scalar accesses.
template <typename T>
bool use_vectors(int64_t hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % (16 / static_cast<int64_t>(sizeof(T))) != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

// ---- dx launches
// ----------------------------------------------------------------------------------
template <typename T>
struct DxArgs {
  const T* x;
  const T* g;
  const float* fn;
  const float* coef_a;
  const float* coef_c;
  const float* pre;
  T* dx;
  int64_t tokens;
  int hc;
  int64_t hidden;
  int mixes;
};

// P-column accesses are aligned: rows of a multiple of P, every pointer aligned to P elements.
template <typename T>
bool dx_fits(const DxArgs<T>& a, int p) {
  const uintptr_t align = static_cast<uintptr_t>(p) * sizeof(T);
  return a.hidden % p == 0 && reinterpret_cast<uintptr_t>(a.x) % align == 0 &&
         reinterpret_cast<uintptr_t>(a.dx) % align == 0 &&
         (a.g == nullptr || reinterpret_cast<uintptr_t>(a.g) % align == 0);
}

// One dx launch; P columns per thread when dx_fits, else P / 2, ... 1.
template <typename T, int MAXM, int P, int THREADS, int TOKENS, bool kPrefetch, int kMinBlocks = 1,
          bool kRing = false>
int launch_dx(const char* what, const DxArgs<T>& a, cudaStream_t s) {
  if constexpr (P > 1) {
    // half the columns where P do not fit; the ring needs copies of 4 bytes at least (cp.async)
    constexpr int H = P / 2;
    constexpr bool kRingH = kRing && H * sizeof(T) >= 4;
    if (!dx_fits(a, P))
      return launch_dx<T, MAXM, H, THREADS, TOKENS, kPrefetch, kMinBlocks, kRingH>(what, a, s);
  }
  const int64_t col_tiles = (a.hidden + THREADS * P - 1) / (THREADS * P);
  const int64_t token_tiles = (a.tokens + TOKENS - 1) / TOKENS;
  if (col_tiles * a.hc > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hidden size too large", what);
  if (token_tiles > 65535)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: %lld tokens (at most %d)", what,
                     static_cast<long long>(a.tokens), 65535 * TOKENS);
  const dim3 grid(static_cast<unsigned>(col_tiles * a.hc), static_cast<unsigned>(token_tiles));
  dx_kernel<T, P, MAXM, THREADS, TOKENS, kPrefetch, kMinBlocks, kRing><<<grid, THREADS, 0, s>>>(
      a.x, a.g, a.fn, a.coef_a, a.coef_c, a.pre, a.dx, a.tokens, a.hc, a.hidden, a.mixes);
  return check_launch(what);
}

// The production configuration (the fastest of the variants below, measured side by side on an
// H200: docs/results/mhc_h200.md): four columns per thread (fn's MAXM x 4 values in registers), 256
// threads x 128 tokens, the next tokens' loads in flight in the cp.async ring.
template <typename T, int MAXM>
int launch_dx_production(const char* what, const DxArgs<T>& a, cudaStream_t s) {
  return launch_dx<T, MAXM, 4, 256, 128, false, 1, true>(what, a, s);
}

#ifdef OPSLOT_KERNELS_BENCH
// Bench-library variants (opslot_mhc_set_tuning dx_version; columns per thread x threads x tokens
// per tile, how the next tokens' loads are kept in flight): 2 the previous production kernel (2 x
// 256 x 256, loaded a group at a time), 3 the same with the next group prefetched in registers, 4
// 2 x 512 x 256, 5 2 x 256 x 64, 6 4 x 256 x 256, 7 16-byte vectors x 256 x 256, 8 and 9 as 3 and 7
// with registers capped for three blocks per SM (3 .. 9 prefetch), 10 2 x 256 x 128 and 11 4 x 256
// x 128 with the cp.async ring (11 is launch_dx_production), 12 as 10 for three blocks per
// SM. Where the fused dx_dfn_kernel fits, these versions turn it off (dx_dfn_fits).
template <typename T, int MAXM>
int launch_dx_variant(int version, const char* what, const DxArgs<T>& a, cudaStream_t s) {
  constexpr int W = static_cast<int>(16 / sizeof(T));
  switch (version) {
    case 2:
      return launch_dx<T, MAXM, 2, 256, 256, false>(what, a, s);
    case 3:
      return launch_dx<T, MAXM, 2, 256, 256, true>(what, a, s);
    case 4:
      return launch_dx<T, MAXM, 2, 512, 256, true>(what, a, s);
    case 5:
      return launch_dx<T, MAXM, 2, 256, 64, true>(what, a, s);
    case 6:
      return launch_dx<T, MAXM, 4, 256, 256, true>(what, a, s);
    case 7:
      return launch_dx<T, MAXM, W, 256, 256, true>(what, a, s);
    case 8:
      return launch_dx<T, MAXM, 2, 256, 256, true, 3>(what, a, s);
    case 9:
      return launch_dx<T, MAXM, W, 256, 256, true, 3>(what, a, s);
    case 10:
      return launch_dx<T, MAXM, 2, 256, 128, false, 1, true>(what, a, s);
    case 11:
      return launch_dx<T, MAXM, 4, 256, 128, false, 1, true>(what, a, s);
    case 12:
      return launch_dx<T, MAXM, 2, 256, 128, false, 3, true>(what, a, s);
    default:
      return launch_dx_production<T, MAXM>(what, a, s);
  }
}
#endif  // OPSLOT_KERNELS_BENCH

// ---- the fused dx + d fn launch --------------------------------------------------------------
// dx_dfn_kernel takes bf16 streams in whole 64-column tiles, x / g / dx 16-byte aligned; the bench
// library's dx_version 2 to 12 turn it off (the CUDA-core dx and the d fn GEMM run instead), 13 and
// 14 run it with a 2-deep / a 4-deep ring (the production one: 3-deep; 2 blocks per SM each; the
// same bits).
bool dx_dfn_fits(int dtype, int64_t hc, int64_t hidden, int64_t mixes, const void* x, const void* g,
                 const void* dx) {
#ifdef OPSLOT_KERNELS_BENCH
  if (g_dx_version >= 2 && g_dx_version <= 12) return false;
#endif  // OPSLOT_KERNELS_BENCH
  return dtype == OPSLOT_BFLOAT16 && hc >= 1 && hc <= mhc::kMaxHc &&
         (mixes == hc || mixes == (2 + hc) * hc) && hidden >= 1 && hidden % kDxfCols == 0 &&
         aligned16(x) && aligned16(dx) && (g == nullptr || aligned16(g));
}

int64_t dx_dfn_ranges(int64_t tokens) { return (tokens + kDxfSpan - 1) / kDxfSpan; }

template <int MAXM, int STAGES, int MINB>
int launch_dx_dfn(const char* what, const DxArgs<bf16>& a, const bf16* coef3, float* dfn,
                  float* scratch, cudaStream_t s) {
  constexpr int kSmem = DxfShape<MAXM>::kSmem(STAGES);
  auto kernel = dx_dfn_kernel<MAXM, STAGES, MINB>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err == cudaSuccess)  // two blocks per SM: all of the SM's shared memory
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess)
    return set_error(static_cast<int>(err), "%s: %d bytes of shared memory refused: %s", what,
                     kSmem, cudaGetErrorString(err));
  const int64_t ranges = dx_dfn_ranges(a.tokens);
  const dim3 grid(static_cast<unsigned>(a.hidden / kDxfCols * a.hc), static_cast<unsigned>(ranges));
  kernel<<<grid, 256, kSmem, s>>>(a.x, a.g, a.fn, coef3, a.coef_c, a.pre, a.dx,
                                  ranges > 1 ? scratch : dfn, a.tokens, a.hc, a.hidden, a.mixes,
                                  static_cast<int>(opslot_mhc_dx_dfn_coef_pitch(a.mixes)));
  if (ranges == 1) return check_launch(what);
  if (int rc = check_launch(what)) return rc;
  const int64_t n = static_cast<int64_t>(a.mixes) * a.hc * a.hidden;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  dfn_reduce_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(scratch, static_cast<int>(ranges),
                                                                  n, dfn);
  return check_launch(what);
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int opslot_mhc_split3(const float* w, int64_t n, void* out, void* stream) {
  if (n < 0 || (n > 0 && (w == nullptr || out == nullptr)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "opslot_mhc_split3: bad arguments");
  if (n == 0) return OPSLOT_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  split3_kernel<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      w, n, static_cast<bf16*>(out));
  return check_launch("opslot_mhc_split3");
}

OPSLOT_API int opslot_mhc_collapse_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const float* p, int64_t nsplit,
                                       int64_t ldp, const float* scale, const float* base,
                                       float norm_eps, float hc_eps, void* out, float* mix,
                                       float* rstd, void* stream) {
  const char* what = "opslot_mhc_collapse_fwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (nsplit < 1 || nsplit > 3 || ldp < nsplit * mixes)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad nsplit %lld / ldp %lld", what,
                     static_cast<long long>(nsplit), static_cast<long long>(ldp));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {x, out});
    const int64_t nvec = vec ? hidden / kVec : hidden;
    const int threads = stream_threads(nvec);
    const bool held =
        threads <= g_hold_threads && nvec <= static_cast<int64_t>(threads) * kRowVectors;
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            static_cast<const T*>(x), p, static_cast<int>(nsplit), ldp, scale, base, norm_eps,
            hc_eps, static_cast<T*>(out), mix, rstd, hidden, static_cast<int>(mixes));
      };
      if constexpr (kBench) {  // the held rows: bench library only
        if (held) {
          if (vec)
            launch(collapse_fwd_kernel<T, HC, kVec, true>);
          else
            launch(collapse_fwd_kernel<T, HC, 1, true>);
          return check_launch(what);
        }
      }
      if (vec)
        launch(collapse_fwd_kernel<T, HC, kVec, false>);
      else
        launch(collapse_fwd_kernel<T, HC, 1, false>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_comb_fwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps, float* post,
                                   float* comb, void* stream) {
  const char* what = "opslot_mhc_comb_fwd";
  if (int rc = check_shape(what, tokens, hc, 1)) return rc;
  if (iters < 0 || iters > (1 << 20))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: hc_sinkhorn_iters %lld", what,
                     static_cast<long long>(iters));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
    constexpr int HC = decltype(hc_tag)::value;
    const unsigned blocks = static_cast<unsigned>((tokens + 127) / 128);
    comb_fwd_kernel<HC><<<blocks, 128, 0, s>>>(tokens, static_cast<int>(iters), mix, scale, base,
                                               hc_eps, post, comb);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_mhc_comb_bwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps,
                                   const float* g_post, const float* g_comb, float* da,
                                   void* stream) {
  const char* what = "opslot_mhc_comb_bwd";
  if (int rc = check_shape(what, tokens, hc, 1)) return rc;
  if (iters < 0 || iters > 1600)
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: hc_sinkhorn_iters %lld (the backward keeps every step: at most 1600)",
                     what, static_cast<long long>(iters));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
    constexpr int HC = decltype(hc_tag)::value;
    // the steps' matrices of 32 tokens (fewer when they do not fit in 200 KB)
    const int64_t per_token = static_cast<int64_t>(mhc::sinkhorn_steps(static_cast<int>(iters))) *
                              HC * HC * static_cast<int64_t>(sizeof(float));
    int64_t tpb = (200 << 10) / per_token;
    if (tpb > 32) tpb = 32;
    if (tpb < 1) tpb = 1;
    const size_t smem = static_cast<size_t>(per_token * tpb);
    auto kernel = comb_bwd_kernel<HC>;
    if (smem > (48 << 10)) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess)
        return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                         smem, cudaGetErrorString(err));
    }
    const unsigned blocks = static_cast<unsigned>((tokens + tpb - 1) / tpb);
    kernel<<<blocks, static_cast<unsigned>(tpb), smem, s>>>(
        tokens, static_cast<int>(iters), mix, scale, base, hc_eps, g_post, g_comb, da);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_mhc_collapse_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const void* g_out,
                                       const float* mix, const float* rstd, const float* scale,
                                       const float* base, float hc_eps, float* da, float* pre,
                                       float* dsc, float* coef_a, void* coef_a3, int64_t ld_a3,
                                       float* coef_c, void* stream) {
  const char* what = "opslot_mhc_collapse_bwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (coef_a3 != nullptr && ld_a3 < 3 * mixes)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: ld_a3 %lld < 3 x %lld mixes", what,
                     static_cast<long long>(ld_a3), static_cast<long long>(mixes));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {x, g_out});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            static_cast<const T*>(x), static_cast<const T*>(g_out), mix, rstd, scale, base, hc_eps,
            da, pre, dsc, coef_a, static_cast<bf16*>(coef_a3), ld_a3, coef_c, hidden);
      };
      const bool comb = mixes > hc;
      if (vec && comb)
        launch(collapse_bwd_kernel<T, HC, kVec, true>);
      else if (vec)
        launch(collapse_bwd_kernel<T, HC, kVec, false>);
      else if (comb)
        launch(collapse_bwd_kernel<T, HC, 1, true>);
      else
        launch(collapse_bwd_kernel<T, HC, 1, false>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_dx(int dtype, int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                             const void* x, const void* g_out, const float* fn, const float* coef_a,
                             const float* coef_c, const float* pre, void* dx, void* stream) {
  const char* what = "opslot_mhc_dx";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (hc > mhc::kMaxHc)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hc_mult %lld is not supported (1 to %d)", what,
                     static_cast<long long>(hc), mhc::kMaxHc);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    const DxArgs<T> a{static_cast<const T*>(x),
                      static_cast<const T*>(g_out),
                      fn,
                      coef_a,
                      coef_c,
                      pre,
                      static_cast<T*>(dx),
                      tokens,
                      static_cast<int>(hc),
                      hidden,
                      static_cast<int>(mixes)};
    const bool comb = mixes > hc;
#ifdef OPSLOT_KERNELS_BENCH
    if (g_dx_version != 1)
      return comb ? launch_dx_variant<T, mhc::kMaxMixes>(g_dx_version, what, a, s)
                  : launch_dx_variant<T, mhc::kMaxHc>(g_dx_version, what, a, s);
#endif  // OPSLOT_KERNELS_BENCH
    return comb ? launch_dx_production<T, mhc::kMaxMixes>(what, a, s)
                : launch_dx_production<T, mhc::kMaxHc>(what, a, s);
  });
}

OPSLOT_API int opslot_mhc_dx_dfn_fits(int dtype, int64_t hc, int64_t hidden, int64_t mixes,
                                      const void* x, const void* g_out, const void* dx) {
  return dx_dfn_fits(dtype, hc, hidden, mixes, x, g_out, dx) ? 1 : 0;
}

OPSLOT_API int64_t opslot_mhc_dx_dfn_scratch_floats(int64_t tokens, int64_t hc, int64_t hidden,
                                                    int64_t mixes) {
  const char* what = "opslot_mhc_dx_dfn_scratch_floats";
  if (check_shape(what, tokens, hc, hidden) != OPSLOT_OK ||
      check_mixes(what, hc, mixes) != OPSLOT_OK)
    return -1;
  const int64_t ranges = dx_dfn_ranges(tokens);
  return ranges > 1 ? ranges * mixes * hc * hidden : 0;
}

OPSLOT_API int opslot_mhc_dx_dfn(int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                                 const void* x, const void* g_out, const float* fn,
                                 const void* coef_a3, const float* coef_c, const float* pre,
                                 void* dx, float* dfn, float* scratch, void* stream) {
  const char* what = "opslot_mhc_dx_dfn";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (!dx_dfn_fits(OPSLOT_BFLOAT16, hc, hidden, mixes, x, g_out, dx))
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: bfloat16 streams with hidden a multiple of %d and 16-byte aligned rows "
                     "only (hidden %lld; opslot_mhc_dx_dfn_fits)",
                     what, kDxfCols, static_cast<long long>(hidden));
  auto s = static_cast<cudaStream_t>(stream);
  if (tokens == 0) {
    const cudaError_t err = cudaMemsetAsync(dfn, 0, mixes * hc * hidden * sizeof(float), s);
    return err == cudaSuccess
               ? OPSLOT_OK
               : set_error(static_cast<int>(err), "%s: %s", what, cudaGetErrorString(err));
  }
  const int64_t ranges = dx_dfn_ranges(tokens);
  if (ranges > 65535 || (ranges > 1 && scratch == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %lld tokens need %lld scratch floats", what,
                     static_cast<long long>(tokens),
                     static_cast<long long>(ranges * mixes * hc * hidden));
  if (!aligned16(coef_a3))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: coef_a3 is not 16-byte aligned", what);
  const DxArgs<bf16> a{static_cast<const bf16*>(x),
                       static_cast<const bf16*>(g_out),
                       fn,
                       nullptr,
                       coef_c,
                       pre,
                       static_cast<bf16*>(dx),
                       tokens,
                       static_cast<int>(hc),
                       hidden,
                       static_cast<int>(mixes)};
  const auto* coef3 = static_cast<const bf16*>(coef_a3);
  const bool comb = mixes > hc;
#ifdef OPSLOT_KERNELS_BENCH
  if (g_dx_version == 13)
    return comb ? launch_dx_dfn<mhc::kMaxMixes, 2, 2>(what, a, coef3, dfn, scratch, s)
                : launch_dx_dfn<mhc::kMaxHc, 2, 2>(what, a, coef3, dfn, scratch, s);
  if (g_dx_version == 14)
    return comb ? launch_dx_dfn<mhc::kMaxMixes, 4, 2>(what, a, coef3, dfn, scratch, s)
                : launch_dx_dfn<mhc::kMaxHc, 4, 2>(what, a, coef3, dfn, scratch, s);
#endif  // OPSLOT_KERNELS_BENCH
  return comb ? launch_dx_dfn<mhc::kMaxMixes, 3, 2>(what, a, coef3, dfn, scratch, s)
              : launch_dx_dfn<mhc::kMaxHc, 3, 2>(what, a, coef3, dfn, scratch, s);
}

OPSLOT_API int opslot_mhc_post_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const float* post, const float* comb, const void* block_out,
                                   const void* streams, void* out, void* stream) {
  const char* what = "opslot_mhc_post_fwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {block_out, streams, out});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            post, comb, static_cast<const T*>(block_out), static_cast<const T*>(streams),
            static_cast<T*>(out), hidden);
      };
      if (vec)
        launch(post_fwd_kernel<T, HC, kVec>);
      else
        launch(post_fwd_kernel<T, HC, 1>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_post_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const void* grad, const float* post, const float* comb,
                                   const void* block_out, const void* streams, void* d_block_out,
                                   void* d_streams, float* d_post, float* d_comb, void* stream) {
  const char* what = "opslot_mhc_post_bwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {grad, block_out, streams, d_block_out, d_streams});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            static_cast<const T*>(grad), post, comb, static_cast<const T*>(block_out),
            static_cast<const T*>(streams), static_cast<T*>(d_block_out),
            static_cast<T*>(d_streams), d_post, d_comb, hidden);
      };
      if (vec)
        launch(post_bwd_kernel<T, HC, kVec>);
      else
        launch(post_bwd_kernel<T, HC, 1>);
      return check_launch(what);
    });
  });
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_mhc_set_tuning(int hold_max_threads, int dx_version) {
  if ((hold_max_threads != 0 && hold_max_threads != 64 && hold_max_threads != 128 &&
       hold_max_threads != 256) ||
      dx_version < 1 || dx_version > 14)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "mhc tuning: hold_max_threads 0, 64, 128 or 256 (got %d), dx_version 1 to 14 "
                     "(got %d)",
                     hold_max_threads, dx_version);
  g_hold_threads = hold_max_threads;
  g_dx_version = dx_version;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
