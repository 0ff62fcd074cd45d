// Sparse MQA attention's shared definitions (the problem, tiles, gathers) and its tensor-core
// forward (sparse_attention.cu launches it; the algorithm: sparse_attention.cu's header).
#pragma once

#include <cfloat>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "opslot_kernels/sparse_attention.h"

namespace opslot::sparse {
namespace {

constexpr int kRows = 64;         // heads per CTA (a block of up to 64 heads, padded)
constexpr int kBk = 32;           // keys per tile
constexpr int kLdP = kBk + 8;     // row pitch of the P / dS tiles (elements)
constexpr int kMaxDqk = 576;      // largest Dqk (GLM-5's absorbed MLA: 512 + 64)
constexpr int kMaxDv = 512;       // largest dv (8 warps x 64 columns in the forward)
constexpr int kFwdThreads = 256;  // 8 warps
constexpr int kBwdThreads = 512;  // 16 warps
constexpr int kSimtThreads = 128;
constexpr float kMaskedBelow = -65504.f;  // float16's finfo.min: every float dtype's min is <= this

// The problem as the kernels read it (passed by value).
struct Dev {
  int64_t B, S, T, H, dqk, dv, K;
  float scale, scale_log2;
  const void* q;
  const void* kv;
  const int32_t* idx;
  const float* sinks;
  int64_t qs0, qs1, qs2, kvs0, kvs1, is0, is1;
  int dpad, dvpad, ldq, ldo;   // Dqk and dv rounded up to 64; smem row pitches of Q/K and dO
  bool q_vec, kv_vec, do_vec;  // 16-byte cp.async is possible for q rows, kv rows, dout rows
};

// Query token qi's rows: its q rows (head 0; heads qs2 apart), its batch's kv rows, its index list.
template <typename T>
struct QueryRows {
  const T* q;
  const T* kv;
  const int32_t* idx;
  __device__ __forceinline__ QueryRows(const Dev& p, int64_t qi) {
    const int64_t b = qi / p.S, s = qi % p.S;
    q = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1;
    kv = static_cast<const T*>(p.kv) + b * p.kvs0;
    idx = p.idx + b * p.is0 + s * p.is1;
  }
};

// Tensor-core helpers: mma_sm80.cuh (ldsm_x4/x2 and their .trans forms, mma16816).

// acc[mt][nt] (16 x 8 tiles) += A[m0 + 16 mt .., k] * B[k, n0 + 8 nt ..] over k in [0, 16 ksteps),
// operands in shared memory. A is stored [m][k] (A + m * lda + k) or, when AT, [k][m]; B is
// stored [n][k] (B + n * ldb + k) or, when BT, [k][n]. n-tiles nt >= nt_live are skipped. Every
// row address is 16-byte aligned (pitches and offsets are multiples of 8 elements).
template <typename T, int MT, int NT, bool AT, bool BT>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const T* A, int lda, int m0,
                                         const T* B, int ldb, int n0, int ksteps, int nt_live) {
  const int lane = threadIdx.x & 31;
  for (int ks = 0; ks < ksteps; ++ks) {
    const int k = ks * 16;
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (!AT) {
        ldsm_x4(a[mt], A + (m0 + mt * 16 + (lane & 15)) * lda + k + ((lane >> 4) << 3));
      } else {
        ldsm_x4_t(a[mt], A + (k + (lane & 7) + ((lane >> 4) << 3)) * lda + m0 + mt * 16 +
                             (((lane >> 3) & 1) << 3));
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt < nt_live) {
        uint32_t bf[2];
        if constexpr (!BT) {
          ldsm_x2(bf, B + (n0 + nt * 8 + (lane & 7)) * ldb + k + (((lane >> 3) & 1) << 3));
        } else {
          ldsm_x2_t(bf, B + (k + (lane & 7) + (((lane >> 3) & 1) << 3)) * ldb + n0 + nt * 8);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma16816<T>(acc[mt][nt], a[mt], bf);
      }
    }
  }
}

// Two floats as two adjacent 16-bit elements (round to nearest even) in one 32-bit word, a first.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(a, b);
    memcpy(&r, &v, 4);
  }
  return r;
}

// The same pair, one 32-bit store (p aligned to the pair).
template <typename T>
__device__ __forceinline__ void st_pair(T* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) = pack2<T>(a, b);
}

// dst rows r < nrows (pitch ldd), columns [0, cpad): the first `cols` elements of row src(r), the
// rest 0; a row src(r) == nullptr is all 0. With `vec`, 16-byte cp.async copies (cols and cpad
// multiples of 16 bytes, rows aligned; nrows <= blockDim.x): blockDim.x / nrows consecutive threads
// take a row, each calling src once and copying every that-many-th 16-byte piece; the caller
// commits and waits. Else plain loads and stores.
template <typename T, typename Src>
__device__ __forceinline__ void load_rows(T* dst, int ldd, int nrows, int cols, int cpad, bool vec,
                                          Src src, const void* any_global) {
  if (vec) {
    constexpr int V = 16 / sizeof(T);
    const int tpr = blockDim.x / nrows, r = threadIdx.x / tpr;
    if (r >= nrows) return;
    const T* s = src(r);
    for (int c = (threadIdx.x % tpr) * V; c < cpad; c += tpr * V) {
      const bool on = s != nullptr && c < cols;
      cp16_or_zero(dst + r * ldd + c, on ? static_cast<const void*>(s + c) : any_global, on);
    }
  } else {
    const int n = nrows * cpad;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int r = i / cpad, c = i % cpad;
      const T* s = src(r);
      dst[r * ldd + c] = (s != nullptr && c < cols) ? s[c] : from_float<T>(0.f);
    }
  }
}

// An index as the kernels use it: itself inside [0, T), else -1 (skipped).
__device__ __forceinline__ int key_in_range(const Dev& p, int id) {
  return (id >= 0 && id < p.T) ? id : -1;
}

// The index of key slot j of a query (-1 when skipped).
__device__ __forceinline__ int key_of(const Dev& p, const int32_t* irow, int64_t j) {
  if (j >= p.K) return -1;
  return key_in_range(p, irow[j]);
}

// One key tile's online softmax for a thread's two rows, in the m16n8 accumulator layout: s[4 j +
// e] is row g + 8 (e / 2), key 8 j + 2 qd + e % 2 of the tile's 32 (tile_idx: their indices, -1
// when skipped). The raw scores s become P (0 for skipped keys); m_run and l_run (log2 units) are
// updated and alpha is each row's rescale of O. Both forward kernels run it, in the same order of
// operations. 2^x is ex2_ftz, as in both backward kernels: exp2f's bits but for a key 126 or more
// (log2 units) below its row's maximum, whose P is 0 instead of subnormal (less than half an ulp of
// the row's sum, at least 1); exp2f's range check cost about 100 instructions a thread and tile.
__device__ __forceinline__ void softmax_tile(float (&s)[16], const int* tile_idx, float scale_log2,
                                             int qd, float (&m_run)[2], float (&l_run)[2],
                                             float (&alpha)[2]) {
  float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const float v = s[e] * scale_log2;
    s[e] = tile_idx[(e >> 2) * 8 + 2 * qd + (e & 1)] >= 0 ? v : neg_inf();
    mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
  }
  float mnew[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    mnew[i] = fmaxf(m_run[i], mx[i]);
    alpha[i] = mnew[i] == neg_inf() ? 1.f : ex2_ftz(m_run[i] - mnew[i]);
  }
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const int i = (e >> 1) & 1;
    s[e] = mnew[i] == neg_inf() ? 0.f : ex2_ftz(s[e] - mnew[i]);
    sum[i] += s[e];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
    l_run[i] = l_run[i] * alpha[i] + sum[i];
    m_run[i] = mnew[i];
  }
}

// Row h's normalisation from its running max m and sum l (log2 units): the factor for O and lse
// (natural log; -inf without keys). A sink joins the denominator only.
__device__ __forceinline__ float finish_row(const Dev& p, int h, float m, float l, float& lse) {
  float fac = 0.f, lse2 = neg_inf();
  if (p.sinks != nullptr) {
    const float sk = p.sinks[h] * kLog2e, mt = fmaxf(m, sk);
    if (mt != neg_inf()) {
      const float em = m == neg_inf() ? 0.f : exp2f(m - mt);
      const float lt = l * em + exp2f(sk - mt);
      fac = em / lt;
      lse2 = mt + log2f(lt);
    }
  } else if (l > 0.f) {
    fac = 1.f / l;
    lse2 = m + log2f(l);
  }
  lse = lse2 * kLn2;
  return fac;
}

// Shared-memory bytes of the kernels.
size_t fwd_smem(const Dev& d, int es) {
  return static_cast<size_t>(kRows * d.ldq + 2 * kBk * d.ldq + kRows * kLdP) * es +
         (4 * 16 * 32 + 2 * kRows) * sizeof(float) + 2 * kBk * sizeof(int);
}
size_t bwd_smem(const Dev& d, int es) {
  return static_cast<size_t>(kRows * d.ldq + kRows * d.ldo + kBk * d.ldq + 2 * kRows * kLdP) * es +
         (8 * 8 * 32 + 2 * kRows) * sizeof(float) + 2 * kBk * sizeof(int);
}

// ---------------------------------------------------------------------------------------------
// Forward, tensor cores. Warps w = 0..7: S rows 16 (w & 3) .. +16 over half w >> 2 of Dqk (the
// halves are added through shared memory; the first half's warps run the online softmax of their
// rows); P V: every warp owns output columns 64 w .. +64 of all 64 rows.

template <typename T>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_mma_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ldq = p.ldq, dpad = p.dpad;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kRows * ldq;  // two buffers of kBk rows
  T* sP = sK + 2 * kBk * ldq;
  float* sX = reinterpret_cast<float*>(sP + kRows * kLdP);  // [4][16][32]: second-half S partials
  float* sAlpha = sX + 4 * 16 * 32;
  float* sFac = sAlpha + kRows;
  int* sIdx = reinterpret_cast<int*>(sFac + kRows);  // [2][kBk]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const int rg = warp & 3, dh = warp >> 2;
  const int64_t qi = blockIdx.x;
  const QueryRows<T> rows(p, qi);
  const int h0 = blockIdx.y * kRows;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);

  load_rows<T>(
      sQ, ldq, kRows, static_cast<int>(p.dqk), dpad, p.q_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? rows.q + (h0 + r) * p.qs2 : nullptr; },
      rows.q);
  auto issue = [&](int tile) {
    const int buf = tile & 1;
    if (tid < kBk)
      sIdx[buf * kBk + tid] = key_of(p, rows.idx, static_cast<int64_t>(tile) * kBk + tid);
    load_rows<T>(
        sK + buf * kBk * ldq, ldq, kBk, static_cast<int>(p.dqk), dpad, p.kv_vec,
        [&](int r) -> const T* {
          const int id = key_of(p, rows.idx, static_cast<int64_t>(tile) * kBk + r);
          return id >= 0 ? rows.kv + id * p.kvs1 : nullptr;
        },
        rows.kv);
  };
  if (ntiles > 0) issue(0);
  cp_async_commit();

  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
  float acc_o[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] = 0.f;
  const bool pv_warp = warp * 64 < p.dvpad;
  const int half = dpad / 2;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) {
      issue(it + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    // A tile without a valid key adds nothing (alpha 1, P 0): skipped, the same result.
    if (!__syncthreads_or(tid < kBk && sIdx[buf * kBk + tid] >= 0)) continue;
    const T* sKt = sK + buf * kBk * ldq;

    float acc[1][4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
    warp_mma<T, 1, 4, false, false>(acc, sQ + dh * half, ldq, rg * 16, sKt + dh * half, ldq, 0,
                                    half / 16, 4);
    float* px = sX + rg * 16 * 32 + lane;
    if (dh == 1) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) px[(nt * 4 + e) * 32] = acc[0][nt][e];
    }
    __syncthreads();
    if (dh == 0) {
      float(&sc)[16] = reinterpret_cast<float(&)[16]>(acc[0]);
#pragma unroll
      for (int e = 0; e < 16; ++e) sc[e] += px[e * 32];
      float alpha[2];
      softmax_tile(sc, sIdx + buf * kBk, p.scale_log2, qd, m_run, l_run, alpha);
      T* prow = sP + (rg * 16 + g) * kLdP + 2 * qd;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        st_pair(prow + nt * 8, sc[4 * nt], sc[4 * nt + 1]);
        st_pair(prow + 8 * kLdP + nt * 8, sc[4 * nt + 2], sc[4 * nt + 3]);
      }
      if (qd == 0) {
        sAlpha[rg * 16 + g] = alpha[0];
        sAlpha[rg * 16 + g + 8] = alpha[1];
      }
    }
    __syncthreads();
    if (pv_warp) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          acc_o[mt][nt][0] *= a0;
          acc_o[mt][nt][1] *= a0;
          acc_o[mt][nt][2] *= a1;
          acc_o[mt][nt][3] *= a1;
        }
      }
      warp_mma<T, 4, 8, false, true>(acc_o, sP, kLdP, 0, sKt, ldq, warp * 64, kBk / 16, 8);
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // no tile at all (K = 0): the query rows' copies are still in flight

  // Normalisation (with the sink in the denominator) and lse, per row, by the softmax warps.
  if (dh == 0 && qd == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rg * 16 + g + 8 * i, h = h0 + r;
      float l2 = 0.f;
      const float fac = h < p.H ? finish_row(p, h, m_run[i], l_run[i], l2) : 0.f;
      sFac[r] = fac;
      if (h < p.H) lse[qi * p.H + h] = l2;
    }
  }
  __syncthreads();
  if (pv_warp) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = mt * 16 + g + 8 * i, h = h0 + r;
        if (h >= p.H) continue;
        const float f = sFac[r];
        T* orow = out + (qi * p.H + h) * p.dv;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int c = warp * 64 + nt * 8 + 2 * qd;
          if (c < p.dv) orow[c] = from_float<T>(acc_o[mt][nt][2 * i] * f);
          if (c + 1 < p.dv) orow[c + 1] = from_float<T>(acc_o[mt][nt][2 * i + 1] * f);
        }
      }
  }
}

}  // namespace
}  // namespace opslot::sparse
