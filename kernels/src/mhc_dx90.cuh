// The backward's dx and d fn of mhc/pre and mhc/head in one pass on warpgroup MMAs (sm_90a):
// dx_dfn_wgmma_kernel, the Hopper form of dx_dfn_kernel (mhc_dx.cuh) for the same inputs and
// outputs (mhc.cu launches it on compute capability 9.0). Contracts: opslot_kernels/mhc.h; design:
// docs/kernels.md "## mhc".
#pragma once

#include "mhc_dx.cuh"
#include "wgmma_sm90.cuh"

namespace opslot {
namespace {

// A block owns 64 columns of one stream and a range of up to kDxfSpan tokens, taken 64 at a time;
// its WGS warpgroups take turns (warpgroup w the tiles w, w + WGS, ..), each through its own
// STAGES-deep cp.async ring, and share fn's terms. Shared memory, from a 1024-byte-aligned base,
// tiles of 128-byte rows, 128-byte-swizzled (wgmma_sm90.cuh):
//   fn's bf16 terms, the dx product's B: KB rows of the block's 64 columns, [hi against the
//     coefficients' hi and mid] then [mid against hi] (the rows of dx_dfn_kernel's sB);
//   per stage: x (64 tokens: the d fn product's B), g (dx is staged over it), the split
//     coefficients (64 tokens x the first KA terms: the d fn product's A; the columns past KA are
//     not written), then per stage pre_j and coef_c.
// Per tile:
//   S = coef fn: m64n64k16, A the warp's 16 tokens of the coefficients (ldmatrix fragments), over
//       the regions' chunks in dx_dfn_kernel's order (fp32 accumulators);
//   D += coef^T x: m64n64k16 from shared memory over the tile's four 16-token steps (rows: the
//       coefficient terms, KA of them meaningful; fp32 accumulators across the range);
// then dx = pre_j g + S - c x (dx_value, one rounding), written over g in the stage and stored as
// whole 128-byte rows. At the end the warpgroups' D are added in warpgroup order and D's two terms
// (hi + mid) go to the range's slab of `dfn` as in dx_dfn_kernel. One accumulator per warpgroup
// (dx_dfn_kernel keeps one per 16-token group): the sums over tokens are in another order, fixed
// by WGS: the same bits on every run.
template <int MAXM>
struct Dxf90Shape {
  using S = DxfShape<MAXM>;
  static_assert(S::KA <= 64, "D's rows are one m64 tile");
  static constexpr int kTile = kDxfTok * 128;  // x, g or the coefficients: 64 rows of 128 bytes
  static constexpr int kB = S::KB * 128;       // fn's terms: KB rows (a multiple of 16)
  static constexpr int kStage = 3 * kTile;
  static constexpr int kScalars = 2 * kDxfTok * 4;  // pre_j and coef_c of a stage
  static constexpr int kSmem(int stages, int wgs) {
    return 1024 + kB + wgs * stages * (kStage + kScalars);
  }
  static_assert(S::KA * kDxfCols * 4 <= kStage, "each warpgroup's D is staged in its ring");
};

template <int MAXM, int STAGES, int MINB, int WGS>
__global__ void __launch_bounds__(128 * WGS, MINB)
    dx_dfn_wgmma_kernel(const bf16* __restrict__ x, const bf16* __restrict__ g,
                        const float* __restrict__ fn, const bf16* __restrict__ coef3,
                        const float* __restrict__ coef_c, const float* __restrict__ pre,
                        bf16* __restrict__ dx, float* __restrict__ dfn, int64_t tokens, int hc,
                        int64_t hidden, int mixes, int lda3) {
#if defined(OPSLOT_WGMMA)
  using namespace opslot::sm90;
  using S = DxfShape<MAXM>;
  using L = Dxf90Shape<MAXM>;
  constexpr int kAChunks = S::KA / 8;    // 16-byte pieces of a coefficient row
  constexpr uint64_t kStep = 2048 >> 4;  // a descriptor's 16-row step (k16 of an MN-major tile)
  constexpr int kThreads = 128 * WGS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sB = smem;
  auto stage = [&](int s) { return smem + L::kB + s * L::kStage; };
  auto scalars = [&](int s) {  // pre_j [64], then coef_c [64]
    return reinterpret_cast<float*>(smem + L::kB + WGS * STAGES * L::kStage + s * L::kScalars);
  };
  const int M = mixes, tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform, as ptxas can tell
  const int wt = tid % 128;                               // the thread within its warpgroup
  const DxfBlock blk(tokens, hc, hidden);
  const int j = blk.j, ntiles = blk.ntiles;
  const int64_t c0 = blk.c0, K = blk.K, col = blk.col, tbeg = blk.tbeg, tend = blk.tend;
  const int mine = (ntiles - wg + WGS - 1) / WGS;  // this warpgroup's tiles: wg, wg + WGS, ..
  auto issue = [&](int i) {  // this warpgroup's i-th tile into its stage i % STAGES
    if (i < mine) {
      const int s = wg * STAGES + i % STAGES;
      unsigned char* st = stage(s);
      const int64_t t0 = tbeg + static_cast<int64_t>(wg + WGS * i) * kDxfTok;
      const int nt = static_cast<int>(tend - t0 < kDxfTok ? tend - t0 : kDxfTok);
      for (int e = wt; e < kDxfTok * 8; e += 128) {
        const int r = e >> 3, ch = e & 7, off = r * 128 + (((ch ^ r) & 7) << 4);
        if (r < nt) {
          cp_async16(st + off, x + (t0 + r) * K + col + 8 * ch);
          if (g != nullptr) cp_async16(st + L::kTile + off, g + (t0 + r) * hidden + c0 + 8 * ch);
          // a row's columns only (lda3 < KA for hc <= 2): S reads the first 16 ceil(2M / 16) <=
          // lda3 (past 2M, lo terms or zeros, met by zeros in sB); D's rows past them are not kept
          if (ch < kAChunks && 8 * ch < lda3)
            cp_async16(st + 2 * L::kTile + off, coef3 + (t0 + r) * lda3 + 8 * ch);
        } else {  // rows past the end: zero (0 * 0 in D)
          *reinterpret_cast<uint4*>(st + off) = make_uint4(0u, 0u, 0u, 0u);
          *reinterpret_cast<uint4*>(st + 2 * L::kTile + off) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      float* sp = scalars(s);
      if (wt < nt) {
        cp_async_ca<4>(sp + wt, pre + (t0 + wt) * hc + j);
        cp_async_ca<4>(sp + kDxfTok + wt, coef_c + t0 + wt);
      }
    }
    cp_async_commit();  // one group per tile, empty past the end: the count stays uniform
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(i);  // in flight while fn's terms are laid out
  for (int i = tid; i < kDxfCols * S::KB; i += kThreads) {
    const int n = i % kDxfCols, kb = i / kDxfCols;  // n fastest: fn's reads coalesce
    *reinterpret_cast<bf16*>(sB + sw_off(kb, n)) = dxf_fn_term<MAXM>(fn + col + n, kb, M, K);
  }
  __syncthreads();  // fn's terms are laid out
  const int warp = wt >> 5, lane = tid & 31, gq = lane >> 2, cq = lane & 3;
  const int c1 = (2 * M + 15) / 16, c2 = (M + 15) / 16;
  const uint64_t db0 = desc_sw128(sB);
  float dacc[32];  // D: rows 16 warp + .. (coefficient terms), the block's 64 columns
#pragma unroll
  for (int i = 0; i < 32; ++i) dacc[i] = 0.f;
  for (int i = 0; i < mine; ++i) {
    cp_async_wait<STAGES - 2>();
    fence_async_smem();  // the tile's copies (and zero rows) visible to the MMAs
    bar_wg(wg);          // the tile has landed; the warpgroup is past its previous tile
    issue(i + STAGES - 1);
    const int s = wg * STAGES + i % STAGES;
    unsigned char* st = stage(s);
    unsigned char* sa = st + 2 * L::kTile;
    uint32_t af[S::n1][4];  // the warp's 16 tokens of the coefficients (S's A)
#pragma unroll
    for (int c = 0; c < S::n1; ++c) {
      if (c < c1) ldsm_x4(af[c], sa + sw_off(16 * warp + (lane & 15), 16 * c + (lane >> 4) * 8));
    }
    float acc[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) acc[e] = 0.f;
    reg_fence(acc);
#pragma unroll
    for (int c = 0; c < S::n1; ++c) {
      if (c < c1) reg_fence(af[c]);
    }
    wg_fence();
#pragma unroll
    for (int c = 0; c < S::n1; ++c) {
      if (c < c1) wgmma_m64n64_rs<bf16>(acc, af[c], db0 + c * kStep);
    }
#pragma unroll
    for (int c = 0; c < S::n2; ++c) {
      if (c < c2) wgmma_m64n64_rs<bf16>(acc, af[c], db0 + (S::n1 + c) * kStep);
    }
    const uint64_t dxd = desc_sw128(st), dad = desc_sw128(sa);
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_m64n64_ss<bf16, true>(dacc, dad + k * kStep, dxd + k * kStep);
    wg_commit();
    wg_wait<0>();  // D's MMAs left in flight past here made ptxas serialize every MMA (C7515)
    reg_fence(dacc);
    reg_fence(acc);
#pragma unroll
    for (int c = 0; c < S::n1; ++c) {
      if (c < c1) reg_fence(af[c]);
    }
    const int64_t t0 = tbeg + static_cast<int64_t>(wg + WGS * i) * kDxfTok;
    const int nt = static_cast<int>(tend - t0 < kDxfTok ? tend - t0 : kDxfTok);
    unsigned char* sg = st + L::kTile;
    const float* sp = scalars(s);
    // dx over g in the stage: each element is read and then written by the same thread, and the
    // warp's 16 rows are its own, so only the warp syncs before storing them.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = 16 * warp + gq + 8 * h;
      if (t >= nt) continue;
      const float pj = sp[t], cc = sp[kDxfTok + t];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int off = sw_off(t, 8 * q + 2 * cq);
        const auto xv = *reinterpret_cast<const __nv_bfloat162*>(st + off);
        auto* gd = reinterpret_cast<__nv_bfloat162*>(sg + off);
        float gf0 = 0.f, gf1 = 0.f;
        if (g != nullptr) {
          const __nv_bfloat162 gv = *gd;
          gf0 = pj * __low2float(gv);
          gf1 = pj * __high2float(gv);
        }
        *gd = __halves2bfloat162(
            __float2bfloat16_rn(dx_value(gf0, acc[4 * q + 2 * h], cc, __low2float(xv))),
            __float2bfloat16_rn(dx_value(gf1, acc[4 * q + 2 * h + 1], cc, __high2float(xv))));
      }
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // the warp's 16 rows: 4 rows of 128 bytes per instruction
      const int t = 16 * warp + 4 * u + (lane >> 3), ch = lane & 7;
      if (t < nt)
        *reinterpret_cast<uint4*>(dx + (t0 + t) * K + col + 8 * ch) =
            *reinterpret_cast<const uint4*>(sg + t * 128 + (((ch ^ t) & 7) << 4));
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: D is summed in it
  // each warpgroup's D in its own [KA][64] (the ring is free), added in warpgroup order below
  auto* sD = reinterpret_cast<float*>(smem + L::kB);
  float* sDw = sD + (wg * S::KA + 16 * warp + gq) * kDxfCols + 2 * cq;  // this thread's entries
  if (16 * warp < S::KA) {
#pragma unroll
    for (int e = 0; e < 32; ++e)
      sDw[8 * ((e >> 1) & 1) * kDxfCols + 8 * (e >> 2) + (e & 1)] = dacc[e];
  }
  __syncthreads();
  float* out = dfn + static_cast<int64_t>(blockIdx.y) * M * K;
  for (int i = tid; i < M * kDxfCols; i += kThreads) {
    const int m = i / kDxfCols, n = i % kDxfCols;
    float hi = sD[m * kDxfCols + n], mid = sD[(M + m) * kDxfCols + n];
#pragma unroll
    for (int w = 1; w < WGS; ++w) {
      hi += sD[(w * S::KA + m) * kDxfCols + n];
      mid += sD[(w * S::KA + M + m) * kDxfCols + n];
    }
    out[m * K + col + n] = hi + mid;
  }
#endif  // OPSLOT_WGMMA
}

}  // namespace
}  // namespace opslot
