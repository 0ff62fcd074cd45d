// The per-chunk backward kernels of the chunked gated delta rule (see gdr_kernels.cuh).
//
// With q~ = q e^G and k~ = k e^-G, a chunk's output and outgoing state depend on G only through q~,
// k~ and the factor e^{G_C}: so dG_i = q_i . dq_i - k_i . dk_i from the output/state terms, plus
// <S_out, dS_out> = e^{G_C} <h, dh> + sum_i k_i . dk_i(state) at the chunk's last position, plus
// the terms of the UT transform (wy_kernel, finish_kernel). dg is the reverse cumulative sum of dG.
#pragma once

#include "gdr_device.cuh"

namespace opslot::gdr {

template <typename T>
constexpr size_t dqk_union() {
  constexpr int LW = slice_cols<T>() + 8;
  const size_t slices = 3 * carve_bytes<T>(kChunk * LW) + 2 * carve_bytes<T>(kD * LW);
  const size_t qk = 2 * carve_bytes<T>(kChunk * kLd);
  return slices > qk ? slices : qk;
}

template <typename T>
constexpr size_t dqk_smem() {
  return 3 * carve_bytes<float>(kChunk * kLd) + carve_bytes<float>(kChunk * kLd64) +
         dqk_union<T>() + 4 * carve_bytes<float>(kChunk) + carve_bytes<float>(kThreads);
}

// Accumulates over Dv slices: dQ = dO h^T, dK = v_new dh^T, dW = dv_total h^T, dP = dO v_new^T, and
// hdh (this thread's share of <h, dh>).
template <typename T>
__device__ void dqk_slices(const opslot_gdr_problem& p, const ChunkInfo& c, int h, const T* hs,
                           const T* vnew, const T* dh, const T* dvt, const T* dout, char* u,
                           float* sDQ, float* sDK, float* sDW, float* sP, float& hdh) {
  constexpr int W = slice_cols<T>(), LW = W + 8;
  Carve cv{u};
  T* sDO = cv.take<T>(kChunk * LW);
  T* sVn = cv.take<T>(kChunk * LW);
  T* sDV = cv.take<T>(kChunk * LW);
  T* sH = cv.take<T>(kD * LW);
  T* sDH = cv.take<T>(kD * LW);
  const int H = static_cast<int>(p.heads);
  const int64_t orow = p.heads * p.dv, tv = tile_off(blockIdx.x, h, H, kChunk * kD),
                th = tile_off(blockIdx.x, h, H, kD * kD);
  const T* drows = dout + (static_cast<int64_t>(c.b) * p.seqlen + c.tok0) * orow + h * p.dv;
  for (int c0 = 0; c0 < p.dv; c0 += W) {
    const int cols = static_cast<int>(p.dv - c0 < W ? p.dv - c0 : W);
    cp_token_tile(sDO, LW, drows + c0, orow, kChunk, W, c.len, cols);
    cp_tile(sVn, LW, vnew + tv + c0, kD, kChunk, W);
    cp_tile(sDV, LW, dvt + tv + c0, kD, kChunk, W);
    cp_tile(sH, LW, hs + th + c0, kD, kD, W);
    cp_tile(sDH, LW, dh + th + c0, kD, kD, W);
    cp_wait_all();
    for (int i = threadIdx.x; i < kD * W; i += blockDim.x) {
      hdh += to_float(sH[(i / W) * LW + i % W]) * to_float(sDH[(i / W) * LW + i % W]);
    }
    const bool acc = c0 > 0;
    block_gemm<T, true, false>(kChunk, kD, W, sDO, LW, sH, LW, sDQ, kLd, acc);
    block_gemm<T, true, false>(kChunk, kD, W, sVn, LW, sDH, LW, sDK, kLd, acc);
    block_gemm<T, true, false>(kChunk, kD, W, sDV, LW, sH, LW, sDW, kLd, acc);
    block_gemm<T, true, false>(kChunk, kChunk, W, sDO, LW, sVn, LW, sP, kLd64, acc);
    __syncthreads();
  }
}

// Rewrites the fp32 dP (pitch kLd64) in place as T: dPqk = dP * exp(G_i - G_j) for i >= j, else 0.
template <typename T>
__device__ void masked_dp_in_place(float* sP, const float* sG) {
  constexpr int per = kChunk * kChunk / kThreads;
  float v[per];
#pragma unroll
  for (int k = 0; k < per; ++k) {
    const int i = threadIdx.x + kThreads * k, r = i / kChunk, col = i % kChunk;
    v[k] = r >= col ? sP[r * kLd64 + col] * expf(sG[r] - sG[col]) : 0.f;
  }
  __syncthreads();
  T* sPo = reinterpret_cast<T*>(sP);
#pragma unroll
  for (int k = 0; k < per; ++k) {
    const int i = threadIdx.x + kThreads * k;
    sPo[(i / kChunk) * kLd64 + i % kChunk] = from_float<T>(v[k]);
  }
  __syncthreads();
}

// dq (of the scaled, normalised q), dk (output and state terms), dw = -dv_total h^T, and dG from
// them.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dqk_kernel(opslot_gdr_problem p, const ChunkInfo* table, const T* hs, const T* vnew,
               const T* dh, const T* dvt, const T* dout, float* dq, float* dkp, T* dw,
               float* dgam) {
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  float* sDQ = cv.take<float>(kChunk * kLd);
  float* sDK = cv.take<float>(kChunk * kLd);
  float* sDW = cv.take<float>(kChunk * kLd);
  float* sP = cv.take<float>(kChunk * kLd64);
  char* u = reinterpret_cast<char*>(cv.take<char>(static_cast<int>(dqk_union<T>())));
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  float* sR1 = cv.take<float>(kChunk);
  float* sR2 = cv.take<float>(kChunk);
  float* sRed = cv.take<float>(kThreads);
  load_gates(p, c, h, sG, sB);
  float hdh = 0.f;
  dqk_slices<T>(p, c, h, hs, vnew, dh, dvt, dout, u, sDQ, sDK, sDW, sP, hdh);
  const float gc = sG[kChunk - 1];
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, d = i % kD;
    sDQ[r * kLd + d] *= expf(sG[r]);
    sDK[r * kLd + d] *= expf(gc - sG[r]);
    sDW[r * kLd + d] = -sDW[r * kLd + d];
  }
  Carve qk{u};
  T* sQ = qk.take<T>(kChunk * kLd);
  T* sK = qk.take<T>(kChunk * kLd);
  load_rows<T>(sQ, p.q, p.q_stride, c, h, p.dk, p.use_l2norm, p.scale);
  load_rows<T>(sK, p.k, p.k_stride, c, h, p.dk, p.use_l2norm, 1.f);
  __syncthreads();
  row_dots(sK, sDK, sR1);
  const float last = expf(gc) * block_sum(hdh, sRed) +
                     block_sum(threadIdx.x < kChunk ? sR1[threadIdx.x] : 0.f, sRed);
  masked_dp_in_place<T>(sP, sG);
  const T* sPo = reinterpret_cast<const T*>(sP);
  block_gemm<T, true, true>(kChunk, kD, kChunk, sPo, kLd64, sK, kLd, sDQ, kLd, true);
  block_gemm<T, false, true>(kChunk, kD, kChunk, sPo, kLd64, sQ, kLd, sDK, kLd, true);
  __syncthreads();
  row_dots(sQ, sDQ, sR1);
  row_dots(sK, sDK, sR2);
  const int64_t tv = tile_off(blockIdx.x, h, H, kChunk * kD);
  if (threadIdx.x < kChunk) {
    const int t = threadIdx.x;
    dgam[tile_off(blockIdx.x, h, H, kChunk) + t] = sR1[t] - sR2[t] + (t == kChunk - 1 ? last : 0.f);
  }
  copy_tile(dq + tv, kD, sDQ, kLd, kChunk, kD);
  copy_tile(dkp + tv, kD, sDK, kLd, kChunk, kD);
  copy_tile(dw + tv, kD, sDW, kLd, kChunk, kD);
}

// dst[r][d] (global fp32, [64, 128] contiguous) += src[r][d] * f(r) (src pitch kLd): every load of
// a thread issued before the first store (one memory latency, not one per element).
template <typename F>
__device__ void add_rows_scaled(float* dst, const float* src, F f) {
  constexpr int kPer = kChunk * kD / 4 / kThreads;
  float4 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    v[k] = reinterpret_cast<const float4*>(dst)[threadIdx.x + k * kThreads];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + k * kThreads, r = i / (kD / 4), d = (i % (kD / 4)) * 4;
    const float s = f(r);
    v[k].x += src[r * kLd + d] * s;
    v[k].y += src[r * kLd + d + 1] * s;
    v[k].z += src[r * kLd + d + 2] * s;
    v[k].w += src[r * kLd + d + 3] * s;
    reinterpret_cast<float4*>(dst)[i] = v[k];
  }
}

// ---- through the UT transform -------------------------------------------------------------------

template <typename T>
constexpr size_t wy_smem() {
  return 4 * carve_bytes<T>(kChunk * kLd) + 2 * carve_bytes<float>(kChunk * kLd64) +
         carve_bytes<T>(kChunk * kLd64) + carve_bytes<float>(kChunk * kLd) +
         4 * carve_bytes<float>(kChunk);
}

// u = T (beta v), w = T (beta e^G k):  dv = beta T^T du, d(beta e^G k) = T^T dw,
// dT = du (beta v)^T + dw (beta e^G k)^T, dA = -T^T dT T^T (strictly lower, stored for
// finish_kernel).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    wy_kernel(opslot_gdr_problem p, const ChunkInfo* table, const T* dvt, const T* dw, float* dkp,
              float* dA, float* dgam, float* dbp, T* dv) {
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  T* sK = cv.take<T>(kChunk * kLd);
  T* sV = cv.take<T>(kChunk * kLd);
  T* sDU = cv.take<T>(kChunk * kLd);
  T* sDW = cv.take<T>(kChunk * kLd);
  float* sA = cv.take<float>(kChunk * kLd64);
  float* sTf = cv.take<float>(kChunk * kLd64);
  T* sTo = cv.take<T>(kChunk * kLd64);
  float* sAcc = cv.take<float>(kChunk * kLd);
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  float* sR1 = cv.take<float>(kChunk);
  float* sR2 = cv.take<float>(kChunk);
  const int64_t tv = tile_off(blockIdx.x, h, H, kChunk * kD);
  cp_tile(sDU, kLd, dvt + tv, kD, kChunk, kD);
  cp_tile(sDW, kLd, dw + tv, kD, kChunk, kD);
  ut_inverse<T>(p, c, h, sK, sA, sTf, sTo, sG, sB);
  load_rows<T>(sV, p.v, p.v_stride, c, h, p.dv, false, 1.f);
  cp_wait_all();
  block_gemm<T, false, true>(kChunk, kD, kChunk, sTo, kLd64, sDU, kLd, sAcc, kLd, false);
  __syncthreads();
  row_dots(sAcc, sV, sR1);
  const int64_t orow = p.heads * p.dv;
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, d = i % kD;
    if (r < c.len && d < p.dv)
      dv[(static_cast<int64_t>(c.b) * p.seqlen + c.tok0 + r) * orow + h * p.dv + d] =
          from_float<T>(sB[r] * sAcc[r * kLd + d]);
  }
  __syncthreads();
  block_gemm<T, false, true>(kChunk, kD, kChunk, sTo, kLd64, sDW, kLd, sAcc, kLd, false);
  __syncthreads();
  row_dots(sAcc, sK, sR2);
  add_rows_scaled(dkp + tv, sAcc, [&](int r) { return sB[r] * expf(sG[r]); });
  if (threadIdx.x < kChunk) {
    const int t = threadIdx.x;
    const float e = expf(sG[t]);
    dbp[tile_off(blockIdx.x, h, H, kChunk) + t] = sR1[t] + sR2[t] * e;
    dgam[tile_off(blockIdx.x, h, H, kChunk) + t] += sR2[t] * sB[t] * e;
  }
  __syncthreads();
  block_gemm<T, true, false>(kChunk, kChunk, kD, sDU, kLd, sV, kLd, sA, kLd64, false);
  block_gemm<T, true, false>(kChunk, kChunk, kD, sDW, kLd, sK, kLd, sTf, kLd64, false);
  __syncthreads();
  T* sDT = sDU;  // du and dw are no longer needed: their space holds dT and X = dT T^T
  T* sX = sDW;
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, col = i % kChunk;
    sDT[r * kLd64 + col] =
        from_float<T>(sB[col] * (sA[r * kLd64 + col] + sTf[r * kLd64 + col] * expf(sG[col])));
  }
  __syncthreads();
  block_gemm<T, true, false>(kChunk, kChunk, kChunk, sDT, kLd64, sTo, kLd64, sA, kLd64, false);
  __syncthreads();
  to_op64<T>(sA, sX);
  __syncthreads();
  block_gemm<T, false, true>(kChunk, kChunk, kChunk, sTo, kLd64, sX, kLd64, sTf, kLd64, false);
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, col = i % kChunk;
    dA[tile_off(blockIdx.x, h, H, kChunk * kChunk) + i] = r > col ? -sTf[r * kLd64 + col] : 0.f;
  }
}

// ---- the system matrix's gradient, dg, dbeta, and the L2-norm backward --------------------------

template <typename T>
constexpr size_t finish_smem() {
  return carve_bytes<T>(kChunk * kLd) + 2 * carve_bytes<float>(kChunk * kLd64) +
         carve_bytes<T>(kChunk * kLd64) + carve_bytes<float>(kChunk * kLd) +
         3 * carve_bytes<float>(kChunk);
}

// dx of y = scale * x * rsqrt(|x|^2 + 1e-6) (l2norm) or y = scale * x, given dy (fp32 rows of pitch
// ldy, in shared or global memory), for the chunk's rows, written to dst (contiguous [B, T, H, Dk])
// in T: dx = r (s dy - y' (y' . s dy)), y' = x r. Each warp loads its 8 rows at once, then reduces.
template <typename T>
__device__ void norm_backward_rows(const opslot_gdr_problem& p, const ChunkInfo& c, int h,
                                   const void* xsrc, const int64_t* st, const float* dy, int ldy,
                                   float scale, T* dst) {
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * kRowsPerWarp, d0 = 4 * lane;
  const int64_t D = p.dk;
  float x[kRowsPerWarp][4], g[kRowsPerWarp][4];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = r0 + rr;
    const T* xp =
        static_cast<const T*>(xsrc) + (r < c.len ? tok_off(st, c.b, c.tok0 + r, h) : 0) + d0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool live = r < c.len && d0 + j < D;
      x[rr][j] = live ? to_float(xp[j]) : 0.f;
      g[rr][j] = live ? scale * dy[r * ldy + d0 + j] : 0.f;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = r0 + rr;
    if (r >= c.len) break;  // warp-uniform
    float rn = 1.f, dot = 0.f;
    if (p.use_l2norm) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) ss += x[rr][j] * x[rr][j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      rn = rsqrtf(ss + 1e-6f);
#pragma unroll
      for (int j = 0; j < 4; ++j) dot += x[rr][j] * rn * g[rr][j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    }
    T* out = dst + ((static_cast<int64_t>(c.b) * p.seqlen + c.tok0 + r) * p.heads + h) * D;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (d0 + j < D)
        out[d0 + j] =
            from_float<T>(p.use_l2norm ? rn * (g[rr][j] - x[rr][j] * rn * dot) : g[rr][j]);
    }
  }
}

// A = strict_lower(beta_i M_ij D_ij), M = k k^T, D_ij = e^{G_i - G_j}: dM = dA beta D (into sDMo),
// sM <- dA M D (row sums: dbeta), sDA <- dA A (row sums minus column sums: dG).
template <typename T>
__device__ void system_grads(const float* sG, const float* sB, float* sM, float* sDA, T* sDMo) {
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, col = i % kChunk, at = r * kLd64 + col;
    float dm = 0.f, mb = 0.f, ab = 0.f;
    if (r > col) {
      const float d = expf(sG[r] - sG[col]), da = sDA[at];
      dm = da * sB[r] * d;
      mb = da * sM[at] * d;
      ab = dm * sM[at];
    }
    sDMo[at] = from_float<T>(dm);
    sM[at] = mb;
    sDA[at] = ab;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    finish_kernel(opslot_gdr_problem p, const ChunkInfo* table, const float* dA, const float* dq,
                  const float* dkp, const float* dgam, const float* dbp, T* dqo, T* dko, void* dg,
                  void* dbeta) {
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  T* sK = cv.take<T>(kChunk * kLd);
  float* sM = cv.take<float>(kChunk * kLd64);
  float* sDA = cv.take<float>(kChunk * kLd64);
  T* sDMo = cv.take<T>(kChunk * kLd64);
  float* sAcc = cv.take<float>(kChunk * kLd);
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  float* sR = cv.take<float>(kChunk);
  const int64_t tv = tile_off(blockIdx.x, h, H, kChunk * kD),
                tg = tile_off(blockIdx.x, h, H, kChunk);
  cp_tile(sAcc, kLd, dkp + tv, kD, kChunk, kD);
  cp_tile(sDA, kLd64, dA + tile_off(blockIdx.x, h, H, kChunk * kChunk), kChunk, kChunk, kChunk);
  load_gates(p, c, h, sG, sB);
  load_rows<T>(sK, p.k, p.k_stride, c, h, p.dk, p.use_l2norm, 1.f);
  cp_wait_all();
  block_gemm<T, true, false>(kChunk, kChunk, kD, sK, kLd, sK, kLd, sM, kLd64, false);
  __syncthreads();
  system_grads<T>(sG, sB, sM, sDA, sDMo);
  __syncthreads();
  block_gemm<T, true, true>(kChunk, kD, kChunk, sDMo, kLd64, sK, kLd, sAcc, kLd, true);
  __syncthreads();
  block_gemm<T, false, true>(kChunk, kD, kChunk, sDMo, kLd64, sK, kLd, sAcc, kLd, true);
  float db = 0.f;
  if (threadIdx.x < kChunk) {
    const int t = threadIdx.x;
    float rm = 0.f, ra = 0.f, ca = 0.f;
    for (int j = 0; j < kChunk; ++j) {
      rm += sM[t * kLd64 + j];
      ra += sDA[t * kLd64 + j];
      ca += sDA[j * kLd64 + t];
    }
    sR[t] = dgam[tg + t] + ra - ca;
    db = dbp[tg + t] + rm;
  }
  __syncthreads();
  if (threadIdx.x < c.len) {
    const int t = threadIdx.x;
    float acc = 0.f;
    for (int m = kChunk - 1; m >= t; --m) acc += sR[m];
    const int64_t tok = c.tok0 + t;
    st_any(dg, (static_cast<int64_t>(c.b) * p.seqlen + tok) * p.heads + h, p.g_dtype, acc);
    st_any(dbeta, (static_cast<int64_t>(c.b) * p.seqlen + tok) * p.heads + h, p.beta_dtype, db);
  }
  norm_backward_rows<T>(p, c, h, p.q, p.q_stride, dq + tv, kD, p.scale, dqo);
  norm_backward_rows<T>(p, c, h, p.k, p.k_stride, sAcc, kLd, 1.f, dko);
}

}  // namespace opslot::gdr
