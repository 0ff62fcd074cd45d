// Sparse MQA attention's tensor-core backward: dq, and the dkv contribution rows per (query,
// selected key) that the reduction adds (sparse_attention.cu launches it).
#pragma once

#include "sparse_attention_fwd.cuh"

namespace opslot::sparse {
namespace {

// ---------------------------------------------------------------------------------------------
// Backward, tensor cores, 16 warps per CTA. Per tile: warps 0-7 compute S and warps 8-15 dP for
// the same 16 x 16 regions (rows 16 (w & 3), keys 16 ((w & 7) >> 2)); the S warps form P and dS.
// dq += dS K: warp (w >> 3, w & 7) owns rows 32 (w >> 3) .. +32 and Dqk columns (w & 7) dpad / 8.
// The dkv tile dS^T Q + P^T dO: warp (w >> 3, w & 7) owns keys 16 (w >> 3) and the same columns,
// three 8-column tiles at a time; it goes to w[query, head block, key slot, :].

// Two adjacent columns of a w row in one store (bf16x2 or float2; p aligned to the pair).
template <typename W>
__device__ __forceinline__ void st_w_pair(W* p, float a, float b) {
  if constexpr (std::is_same_v<W, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  } else {
    st_pair(p, a, b);
  }
}

// Row r of the head block, by one warp: delta = rowsum(dO * O), lse in log2 units (+inf for rows
// without keys, so that P = 0) and the row's part of the sink's gradient. Both backward kernels.
template <typename T>
__device__ __forceinline__ void row_delta_lse(const Dev& p, const T* dout, const T* outp,
                                              const float* lse, int64_t qi, int h0, int r,
                                              float* sDelta, float* sLse2, float* dsink_part) {
  const int lane = threadIdx.x & 31, h = h0 + r;
  float d = 0.f;
  if (h < p.H) {
    const T* o = outp + (qi * p.H + h) * p.dv;
    const T* go = dout + (qi * p.H + h) * p.dv;
    for (int c = lane; c < p.dv; c += 32) d += to_float(o[c]) * to_float(go[c]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
  if (lane == 0) {
    const float l = h < p.H ? lse[qi * p.H + h] : neg_inf();
    sDelta[r] = d;
    sLse2[r] = l == neg_inf() ? pos_inf() : l * kLog2e;
    if (dsink_part != nullptr && h < p.H)
      dsink_part[qi * p.H + h] = l == neg_inf() ? 0.f : -expf(p.sinks[h] - l) * d;
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_mma_kernel(const Dev p, const T* __restrict__ dout, const T* __restrict__ outp,
                   const float* __restrict__ lse, int64_t q_begin, T* __restrict__ dq,
                   W* __restrict__ wout, float* __restrict__ dsink_part) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ldq = p.ldq, ldo = p.ldo, dpad = p.dpad, dvpad = p.dvpad;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kRows * ldq;
  T* sK = sdO + kRows * ldo;
  T* sP = sK + kBk * ldq;
  T* sdS = sP + kRows * kLdP;
  float* sdP = reinterpret_cast<float*>(sdS + kRows * kLdP);  // [8 warps][8][32]
  float* sLse2 = sdP + 8 * 8 * 32;
  float* sDelta = sLse2 + kRows;
  int* sIdx = reinterpret_cast<int*>(sDelta + kRows);  // [2][kBk]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const int64_t qi = q_begin + blockIdx.x;
  const QueryRows<T> rows(p, qi);
  const int hb = blockIdx.y, h0 = hb * kRows, nhb = gridDim.y;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);
  const int nq = dpad / 64, cpw = dpad / 8;

  load_rows<T>(
      sQ, ldq, kRows, static_cast<int>(p.dqk), dpad, p.q_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? rows.q + (h0 + r) * p.qs2 : nullptr; },
      rows.q);
  load_rows<T>(
      sdO, ldo, kRows, static_cast<int>(p.dv), dvpad, p.do_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? dout + (qi * p.H + h0 + r) * p.dv : nullptr; },
      dout);
  auto issue = [&](int tile) {
    const int buf = tile & 1;
    if (tid < kBk)
      sIdx[buf * kBk + tid] = key_of(p, rows.idx, static_cast<int64_t>(tile) * kBk + tid);
    load_rows<T>(
        sK, ldq, kBk, static_cast<int>(p.dqk), dpad, p.kv_vec,
        [&](int r) -> const T* {
          const int id = key_of(p, rows.idx, static_cast<int64_t>(tile) * kBk + r);
          return id >= 0 ? rows.kv + id * p.kvs1 : nullptr;
        },
        rows.kv);
  };
  if (ntiles > 0) issue(0);
  cp_async_commit();

#pragma unroll
  for (int rr = 0; rr < kRows / 16; ++rr)
    row_delta_lse(p, dout, outp, lse, qi, h0, warp * (kRows / 16) + rr, sDelta, sLse2, dsink_part);

  float acc_dq[2][9][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 9; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[mt][nt][e] = 0.f;
  const int w8 = warp & 7, rg = w8 & 3, kh = w8 >> 2;
  const bool pairs = p.dqk % 2 == 0;  // the w rows take two columns per store
  const int rh = warp >> 3, cg = warp & 7;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    // A tile without a valid key adds nothing to dq and writes no w row: skipped.
    if (!__syncthreads_or(tid < kBk && sIdx[buf * kBk + tid] >= 0)) {
      if (it + 1 < ntiles) issue(it + 1);
      cp_async_commit();
      continue;
    }
    {
      float acc[1][2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
      if (warp < 8) {
        warp_mma<T, 1, 2, false, false>(acc, sQ, ldq, rg * 16, sK, ldq, kh * 16, dpad / 16, 2);
      } else {
        warp_mma<T, 1, 2, false, false>(acc, sdO, ldo, rg * 16, sK, ldq, kh * 16, dvpad / 16, 2);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sdP[(w8 * 8 + nt * 4 + e) * 32 + lane] = acc[0][nt][e];
      }
      __syncthreads();
      if (warp < 8) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float pe[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = rg * 16 + g + 8 * (e >> 1);
            const int c = kh * 16 + nt * 8 + 2 * qd + (e & 1);
            pe[e] =
                sIdx[buf * kBk + c] >= 0 ? ex2_ftz(acc[0][nt][e] * p.scale_log2 - sLse2[r]) : 0.f;
            ds[e] = pe[e] * (sdP[(w8 * 8 + nt * 4 + e) * 32 + lane] - sDelta[r]) * p.scale;
          }
          const int off = (rg * 16 + g) * kLdP + kh * 16 + nt * 8 + 2 * qd;
          st_pair(sP + off, pe[0], pe[1]);
          st_pair(sP + off + 8 * kLdP, pe[2], pe[3]);
          st_pair(sdS + off, ds[0], ds[1]);
          st_pair(sdS + off + 8 * kLdP, ds[2], ds[3]);
        }
      }
    }
    __syncthreads();
    warp_mma<T, 2, 9, false, true>(acc_dq, sdS, kLdP, rh * 32, sK, ldq, cg * cpw, kBk / 16, nq);
    __syncthreads();  // sK is free: the next tile's rows load during the dkv products
    if (it + 1 < ntiles) issue(it + 1);
    cp_async_commit();

    const int mh = rh;
    for (int pass = 0; pass * 3 < nq; ++pass) {
      float acc[1][3][4];
#pragma unroll
      for (int nt = 0; nt < 3; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
      const int n0 = cg * cpw + pass * 24;
      const int live = min(3, nq - pass * 3);
      warp_mma<T, 1, 3, true, true>(acc, sdS, kLdP, mh * 16, sQ, ldq, n0, kRows / 16, live);
      const int live_o = max(0, min(live, (dvpad - n0) / 8));
      if (live_o > 0)
        warp_mma<T, 1, 3, true, true>(acc, sP, kLdP, mh * 16, sdO, ldo, n0, kRows / 16, live_o);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int jl = mh * 16 + g + 8 * i;
        const int64_t j = static_cast<int64_t>(it) * kBk + jl;
        if (j >= p.K || sIdx[buf * kBk + jl] < 0) continue;
        W* wrow = wout + (((qi - q_begin) * nhb + hb) * p.K + j) * p.dqk;
#pragma unroll
        for (int nt = 0; nt < 3; ++nt) {
          if (nt >= live) continue;
          const int c = n0 + nt * 8 + 2 * qd;
          if (pairs && c + 1 < p.dqk) {  // even dqk: (row * dqk + c) is even, the pair aligned
            st_w_pair(wrow + c, acc[0][nt][2 * i], acc[0][nt][2 * i + 1]);
            continue;
          }
          if (c < p.dqk) wrow[c] = from_float<W>(acc[0][nt][2 * i]);
          if (c + 1 < p.dqk) wrow[c + 1] = from_float<W>(acc[0][nt][2 * i + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rh * 32 + mt * 16 + g + 8 * i, h = h0 + r;
      if (h >= p.H) continue;
      T* row = dq + (qi * p.H + h) * p.dqk;
#pragma unroll
      for (int nt = 0; nt < 9; ++nt) {
        if (nt >= nq) continue;
        const int c = cg * cpw + nt * 8 + 2 * qd;
        if (c < p.dqk) row[c] = from_float<T>(acc_dq[mt][nt][2 * i]);
        if (c + 1 < p.dqk) row[c + 1] = from_float<T>(acc_dq[mt][nt][2 * i + 1]);
      }
    }
}

}  // namespace
}  // namespace opslot::sparse
