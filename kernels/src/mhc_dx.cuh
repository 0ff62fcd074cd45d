// The backward's dx kernels of mhc/pre and mhc/head (mhc.cu launches them): dx on CUDA cores
// (dx_kernel, every dtype) and dx with d fn in one tensor-core pass (dx_dfn_kernel, bf16 streams in
// whole 64-column tiles), with dfn_reduce_kernel adding its ranges in order. Contracts:
// opslot_kernels/mhc.h; design: docs/kernels.md "## mhc".
#pragma once

#include <type_traits>

#include "mhc_kernels.cuh"
#include "mma_sm80.cuh"

namespace opslot {
namespace {

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
// Warp (rg, cg) owns the tile's tokens 16 rg .. 16 rg + 15 and columns 32 cg .. 32 cg + 31 for
// both products, so it reads its part of sA and x once per tile. Per tile:
//   S = coef fn: sA against the regions, hi fhi + mid fhi | hi fmid: the products above 2^-18 of
//       the largest (fp32 accumulators); the three left out (mid fmid, lo fhi, hi flo) are each
//       below 2^-18 relative: about the fp32 rounding of a sum over thousands of tokens, and 1/256
//       of dx's bf16 rounding;
//   dx = pre_j g + S - c x (dx_value: fp32, one rounding), written over the warp's part of the
//       x tile, then stored as whole 16-byte pieces of its rows;
//   D += sA^T x over the warp's tokens: the two terms' sums of coef_a[t, m] x[t, n] (fp32
//       accumulators across the range, one partial per token group).
// One barrier per tile. At the end the four token groups' partials are added in group order, and
// D's terms (hi + mid) into the range's slab of `dfn` ([M, K]: dfn itself for one range, else the
// scratch that dfn_reduce adds in range order): no atomics, a fixed order, the same bits on every
// run.
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

// A fused kernel's block (grid: hidden / 64 * hc blocks by the ranges of kDxfSpan tokens): stream
// j, its columns c0 .. c0 + 63 (col: the first in x's rows of K = hc * hidden), tokens tbeg .. tend
// in ntiles tiles of kDxfTok.
struct DxfBlock {
  int j, ntiles;
  int64_t c0, K, col, tbeg, tend;
  __device__ DxfBlock(int64_t tokens, int hc, int64_t hidden)
      : j(static_cast<int>(blockIdx.x % hc)),
        c0((blockIdx.x / hc) * static_cast<int64_t>(kDxfCols)),
        K(hc * hidden),
        col(j * hidden + c0),
        tbeg(static_cast<int64_t>(blockIdx.y) * kDxfSpan),
        tend(tokens < tbeg + kDxfSpan ? tokens : tbeg + kDxfSpan) {
    ntiles = static_cast<int>((tend - tbeg + kDxfTok - 1) / kDxfTok);
  }
};

// Row kb of the dx product's B at one column of fn (fc: fn's element [0, column]): the regions
// [fn's hi against the coefficients' hi and mid] then [fn's mid against hi], zero past the terms.
template <int MAXM>
__device__ __forceinline__ bf16 dxf_fn_term(const float* fc, int kb, int M, int64_t K) {
  using S = DxfShape<MAXM>;
  const int r = kb < 16 * S::n1 ? 0 : 1;  // the region
  const int kk = kb - r * 16 * S::n1;
  const bf16 zero = __float2bfloat16_rn(0.f);
  bf16 t[3] = {zero, zero, zero};
  if (kk < (2 - r) * M) split3(fc[(kk % M) * K], t[0], t[1], t[2]);
  return r == 0 ? t[0] : t[1];
}

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
  const DxfBlock blk(tokens, hc, hidden);
  const int j = blk.j, ntiles = blk.ntiles;
  const int64_t c0 = blk.c0, K = blk.K, col = blk.col, tbeg = blk.tbeg, tend = blk.tend;
  for (int i = tid; i < kDxfCols * S::KB; i += 256) {
    const int n = i % kDxfCols, kb = i / kDxfCols;  // n fastest: fn's reads coalesce
    sB[n][kb] = dxf_fn_term<MAXM>(fn + col + n, kb, M, K);
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
        if (r >= nt)
          *reinterpret_cast<uint4*>(&st.a[r][ch]) = make_uint4(0u, 0u, 0u, 0u);
        else if (ch < lda3)  // a row's columns only (lda3 < KA for hc <= 2): the products read
          // the first 16 ceil(2M / 16) <= lda3; past 2M, lo terms or zeros, met by zeros in sB
          cp_async16(&st.a[r][ch], coef3 + (t0 + r) * lda3 + ch);
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
    // dx over x in the stage: each element is read and then written by the same thread, and the
    // warp's 16 x 32 part of x is its own this tile (D read it above), so only the warp syncs.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 16 * rg + gq + 8 * h;
      if (t >= nt) continue;
      const float pj = st.p[t], cc = st.cc[t];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = 32 * cg + 8 * q + 2 * cq;
        auto* xd = reinterpret_cast<__nv_bfloat162*>(&st.x[t][n]);
        const __nv_bfloat162 xv = *xd;
        float gf0 = 0.f, gf1 = 0.f;
        if (g != nullptr) {
          const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(&st.g[t][n]);
          gf0 = pj * __low2float(gv);
          gf1 = pj * __high2float(gv);
        }
        *xd = __halves2bfloat162(
            __float2bfloat16_rn(dx_value(gf0, acc[q][2 * h], cc, __low2float(xv))),
            __float2bfloat16_rn(dx_value(gf1, acc[q][2 * h + 1], cc, __high2float(xv))));
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // 16 rows of 64 bytes: four 16-byte pieces a row, coalesced;
      // the 8 lanes of a phase take rows r and r + 4 (576 bytes apart: distinct banks)
      const int t = 16 * rg + 8 * i + (lane >> 3) + 4 * ((lane >> 2) & 1),
                n = 32 * cg + 8 * (lane & 3);
      if (t < nt)
        *reinterpret_cast<uint4*>(dx + (t0 + t) * K + col + n) =
            *reinterpret_cast<const uint4*>(&st.x[t][n]);
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

}  // namespace
}  // namespace opslot
