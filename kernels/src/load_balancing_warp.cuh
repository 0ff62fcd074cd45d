// The load-balancing loss's warp-per-row forward (16-bit logits, E = 64, 128, 256) and backward,
// and the finalize's column sums (load_balancing.cu launches them).
#pragma once

#include "load_balancing_tile.cuh"

namespace opslot {
namespace {

// ---- The warp-per-row paths (E = 32 * EPL experts, EPL in {2, 4, 8}) ----
// Forward, 16-bit logits: a warp takes one row at a time, lane l the experts l*EPL .. l*EPL+EPL-1,
// which stay the lane's for every row, so the column sums (selections, probabilities) are the
// lane's registers: no shared-memory tile and no column pass. The top-k threshold comes from k
// rounds of one `redux.sync.max.u32` over unique 32-bit keys (the value's 16 bits made orderable
// as an unsigned integer in the high half, 0xffff - expert in the low half: equal values rank the
// lower index first), each lane popping its sorted keys. Backward, any dtype: a warp per row,
// softmax recomputed, two butterflies (sum, dot with the coefficients).
constexpr int kWarpWarps = 16;  // 512-thread blocks, 4 per SM: 64 warps, 32 registers

template <int EPL>
struct RawRow {
  unsigned w[EPL / 2];
};

// Both halves made orderable as unsigned 16-bit integers: -0 becomes +0 (x * 1 + 0), then a
// positive value gets its sign bit set and a negative one all its bits flipped.
template <bool BF16>
__device__ __forceinline__ unsigned ord2(unsigned w) {
  unsigned d;
  if (BF16)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(0x3f803f80u), "r"(0u));
  else
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(0x3c003c00u), "r"(0u));
  const unsigned t = d & 0x80008000u;
  return d ^ ((t - (t >> 15)) | 0x80008000u);
}

// The value of an orderable 16-bit key (inverse of ord2), as fp32.
template <bool BF16>
__device__ __forceinline__ float unord(unsigned o) {
  const unsigned b = (o & 0x8000u) ? (o ^ 0x8000u) : (~o & 0xffffu);
  if (BF16) return __uint_as_float(b << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}

// Chunks: C consecutive rows of one layer, the unit a warp takes (its row pointers are one
// division away, and the next chunk's loads are issued before the current one is reduced).
// Rows of a chunk past the layer's end compute on zeros with weight 0 and store nothing.
struct Chunking {
  int cpl;      // chunks per layer
  int nchunks;  // layers * cpl (the host checks that it fits in an int)
};
__device__ __forceinline__ Chunking chunking(const LbArgs& a, int C) {
  Chunking c;
  c.cpl = static_cast<int>((a.rows + C - 1) / C);
  c.nchunks = a.layers * c.cpl;
  return c;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// KMAX: rounds compiled (top_k <= KMAX); EXACT: top_k == KMAX (no per-round check).
template <bool BF16, int EPL, int KMAX, bool EXACT, int MINB>
__global__ void __launch_bounds__(kWarpWarps * 32, MINB)
    lb_fwd_warp_kernel(const __grid_constant__ LbLayers L, LbArgs a, int64_t partial_rows) {
  extern __shared__ float wsm[];  // [kWarpWarps][2E]
  constexpr int C = 4;            // rows per chunk
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = 32 * EPL, K = a.top_k;
  const Chunking ch = chunking(a, C);
  const int rows = static_cast<int>(a.rows);
  const int W = static_cast<int>(gridDim.x) * kWarpWarps;
  unsigned idxw[EPL / 2];  // the low halves of this lane's keys: 0xffff - expert
#pragma unroll
  for (int j = 0; j < EPL / 2; ++j) {
    const unsigned e0 = lane * EPL + 2 * j;
    idxw[j] = ((0xffffu - e0 - 1u) << 16) | (0xffffu - e0);
  }
  float cnt[EPL], ps[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) cnt[i] = ps[i] = 0.f;

  auto fetch = [&](int c, RawRow<EPL>(&buf)[C], float(&mw)[C]) {
#pragma unroll
    for (int i = 0; i < C; ++i) {
      mw[i] = 0.f;
#pragma unroll
      for (int j = 0; j < EPL / 2; ++j) buf[i].w[j] = 0u;
    }
    if (c < ch.nchunks) {
      const int layer = c / ch.cpl;
      const int t0 = (c - layer * ch.cpl) * C;
      const int64_t stride = L.stride[layer];
      const unsigned short* p =
          static_cast<const unsigned short*>(L.ptr[layer]) + t0 * stride + lane * EPL;
#pragma unroll
      for (int i = 0; i < C; ++i)
        if (t0 + i < rows) {
          buf[i] = ld_stream(reinterpret_cast<const RawRow<EPL>*>(p + i * stride));
          mw[i] = a.mask ? a.mask[t0 + i] : 1.f;
        }
    }
  };

  auto row = [&](const RawRow<EPL>& r, float mrow) {
    unsigned key[EPL], srt[EPL];
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      const unsigned o = ord2<BF16>(r.w[j]);
      key[2 * j] = __byte_perm(idxw[j], o, 0x5410);
      key[2 * j + 1] = __byte_perm(idxw[j], o, 0x7632);
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i) srt[i] = key[i];
    sort_desc(srt);
    // Round k pops the lane's head if it was the k-th largest key; rounds past top_k pop nothing,
    // so m stays the top_k-th largest key of the row.
    unsigned m = __reduce_max_sync(0xffffffffu, srt[0]);
    const float mx = unord<BF16>(m >> 16);
#pragma unroll
    for (int k = 1; k < KMAX; ++k) {
      const bool pop = srt[0] == m && (EXACT || k < K);
#pragma unroll
      for (int i = 0; i + 1 < EPL; ++i) srt[i] = pop ? srt[i + 1] : srt[i];
      srt[EPL - 1] = pop ? 0u : srt[EPL - 1];
      m = __reduce_max_sync(0xffffffffu, srt[0]);
    }
    float e[EPL], s = 0.f;
    const float off = -mx * kLog2e;
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      float lo, hi;
      if (BF16) {
        lo = __uint_as_float(r.w[j] << 16);
        hi = __uint_as_float(r.w[j] & 0xffff0000u);
      } else {
        lo = __half2float(__ushort_as_half(static_cast<unsigned short>(r.w[j] & 0xffffu)));
        hi = __half2float(__ushort_as_half(static_cast<unsigned short>(r.w[j] >> 16)));
      }
      e[2 * j] = ex2_ftz(fmaf(lo, kLog2e, off));
      e[2 * j + 1] = ex2_ftz(fmaf(hi, kLog2e, off));
      s += e[2 * j] + e[2 * j + 1];
    }
    // The row sum in fixed point, one integer reduction instead of five shuffles (exact and
    // order-independent). Every e <= 1, so the row's sum is <= E: with 2^32 / E units per 1
    // (2^24 for E <= 128, 2^23 for 256) it fits 32 bits; each lane's part is rounded by at most
    // half a unit, so the sum (>= 1, the maximum's e is 1) is off by at most 32 * 2^-24 = 2e-6.
    constexpr float kFix = EPL <= 4 ? 16777216.f : 8388608.f;
    const unsigned fx = __reduce_add_sync(0xffffffffu, __float2uint_rn(s * kFix));
    const float w = mrow * rcp_approx(static_cast<float>(fx) * (1.f / kFix));
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      ps[i] = fmaf(e[i], w, ps[i]);
      if (key[i] >= m) cnt[i] += mrow;
    }
  };

  int c = static_cast<int>(blockIdx.x) * kWarpWarps + warp;
  RawRow<EPL> cur[C];
  float mcur[C];
  fetch(c, cur, mcur);
  for (; c < ch.nchunks; c += W) {
    RawRow<EPL> nxt[C];
    float mnxt[C];
    fetch(c + W, nxt, mnxt);
#pragma unroll
    for (int i = 0; i < C; ++i) row(cur[i], mcur[i]);
#pragma unroll
    for (int i = 0; i < C; ++i) {
      cur[i] = nxt[i];
      mcur[i] = mnxt[i];
    }
  }
  // Block partial: the warps in a fixed order.
  float* mine = wsm + warp * 2 * E;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    mine[lane * EPL + i] = cnt[i];
    mine[E + lane * EPL + i] = ps[i];
  }
  __syncthreads();
  for (int col = threadIdx.x; col < 2 * E; col += kWarpWarps * 32) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpWarps; ++w) v += wsm[w * 2 * E + col];
    a.partial[static_cast<int64_t>(blockIdx.x) * 2 * E + col] = v;
  }
  for (int64_t p = blockIdx.x + gridDim.x; p < partial_rows; p += gridDim.x)
    for (int col = threadIdx.x; col < 2 * E; col += kWarpWarps * 32)
      a.partial[p * 2 * E + col] = 0.f;
}

// Backward: LPR lanes per row, each with NV 16-byte vectors (E = LPR * NV * VPV), 32 / LPR rows per
// warp step, S steps per chunk.
template <typename T, int LPR, int NV, int MINB>
__global__ void __launch_bounds__(kWarpWarps * 32, MINB)
    lb_bwd_warp_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int VPV = 16 / sizeof(T);
  constexpr int EPL = NV * VPV;
  constexpr int RPW = 32 / LPR;
  constexpr int S = NV == 1 ? 2 : 1;
  constexpr int C = RPW * S;
  using V = Vec<T, VPV>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = LPR * EPL;
  // Lane q's vectors: q + LPR * j (the row's 16-byte pieces interleaved over the lanes: each load
  // instruction of the row's lanes reads consecutive bytes).
  float cf[EPL];
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int i = 0; i < VPV; ++i) cf[j * VPV + i] = a.coef[(q + LPR * j) * VPV + i];
  const float g = a.grad[0];
  const Chunking ch = chunking(a, C);
  const int rows = static_cast<int>(a.rows);
  const int W = static_cast<int>(gridDim.x) * kWarpWarps;

  auto fetch = [&](int c, V(&buf)[S][NV], float(&mw)[S]) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mw[s] = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int i = 0; i < VPV; ++i) buf[s][j].v[i] = from_float<T>(0.f);
    }
    if (c < ch.nchunks) {
      const int layer = c / ch.cpl;
      const int t0 = (c - layer * ch.cpl) * C + sub;
      const int64_t stride = L.stride[layer];
      const T* p = static_cast<const T*>(L.ptr[layer]) + t0 * stride + q * VPV;
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (t0 + s * RPW < rows) {
#pragma unroll
          for (int j = 0; j < NV; ++j)
            buf[s][j] = ld_stream(reinterpret_cast<const V*>(p + s * RPW * stride + LPR * VPV * j));
          mw[s] = (a.mask ? a.mask[t0 + s * RPW] : 1.f) * g;
        }
    }
  };

  int c = static_cast<int>(blockIdx.x) * kWarpWarps + warp;
  V cur[S][NV];
  float mcur[S];
  fetch(c, cur, mcur);
  for (; c < ch.nchunks; c += W) {
    V nxt[S][NV];
    float mnxt[S];
    fetch(c + W, nxt, mnxt);
    const int layer = c / ch.cpl;
    const int t0 = (c - layer * ch.cpl) * C + sub;
    T* out = static_cast<T*>(L.out[layer]) + static_cast<int64_t>(t0) * E + q * VPV;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float v[EPL], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int i = 0; i < VPV; ++i) {
          v[j * VPV + i] = to_float(cur[s][j].v[i]);
          mx = fmaxf(mx, v[j * VPV + i]);
        }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float off = -mx * kLog2e;
      float sum = 0.f, d = 0.f;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        v[i] = ex2_ftz(fmaf(v[i], kLog2e, off));
        sum += v[i];
        d = fmaf(v[i], cf[i], d);
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        d += __shfl_xor_sync(0xffffffffu, d, o);
      }
      const float inv = rcp_approx(sum);
      const float dot = d * inv, scale = mcur[s] * inv;
      if (t0 + s * RPW < rows) {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
          V o;
#pragma unroll
          for (int i = 0; i < VPV; ++i)
            o.v[i] = from_float<T>((cf[j * VPV + i] - dot) * (scale * v[j * VPV + i]));
          st_stream(reinterpret_cast<V*>(out + static_cast<int64_t>(s) * RPW * E + LPR * VPV * j),
                    o);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mcur[s] = mnxt[s];
#pragma unroll
      for (int j = 0; j < NV; ++j) cur[s][j] = nxt[s][j];
    }
  }
}

// The finalize's first stage: partial rows [prows][ncol] summed in kColChunks chunks of rows, in
// a fixed order, into out[kColChunks][ncol] (the finalize then adds those kColChunks rows).
constexpr int kColChunks = 16;
__global__ void __launch_bounds__(256)
    lb_colsum_kernel(const float* partial, int64_t prows, int ncol, float* out) {
  __shared__ float sm[8][33];
  const int cx = threadIdx.x & 31, gy = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + cx;
  const int64_t per = (prows + kColChunks - 1) / kColChunks;
  const int64_t r0 = blockIdx.y * per, r1 = r0 + per < prows ? r0 + per : prows;
  float s = 0.f;
  if (col < ncol)
    for (int64_t r = r0 + gy; r < r1; r += 8) s += partial[r * ncol + col];
  sm[gy][cx] = s;
  __syncthreads();
  if (gy == 0 && col < ncol) {
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) v += sm[k][cx];
    out[static_cast<int64_t>(blockIdx.y) * ncol + col] = v;
  }
}

}  // namespace
}  // namespace opslot
