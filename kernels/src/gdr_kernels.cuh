// The kernels of the chunked gated delta rule (gated_delta_rule.cu launches them; the math is in
// kernels/include/opslot_kernels/gated_delta_rule.h and docs/kernels.md). G is the in-chunk
// cumulative log decay, G_C its value at the chunk's end; q and k are normalised (and q scaled) on
// load.
//   forward:  chunk_table -> prep (w, u per chunk) -> state_fwd (sequential: h, v_new, final state)
//             -> output
//   backward: chunk_table -> prep -> dv_local (P^T dO) -> state_bwd (sequential: dh, dv_total,
//             d initial state) -> dqk (dq, dk, dw, dG from the state and output terms) -> wy
//             (through the UT transform: dv, dbeta, dA) -> finish (dA into dk, dbeta, dg; L2-norm
//             backward)
// Every kernel runs blocks of 512 threads: one per (chunk, head), or for the sequential kernels one
// per (sequence, head, 32 Dv columns).
#pragma once

#include "gdr_device.cuh"

namespace opslot::gdr {

// Shared memory carved in order: each call returns the next `n` elements of type E.
struct Carve {
  char* p;
  template <typename E>
  __device__ E* take(int n) {
    E* r = reinterpret_cast<E*>(p);
    p += (static_cast<size_t>(n) * sizeof(E) + 127) / 128 * 128;
    return r;
  }
};

template <typename E>
constexpr size_t carve_bytes(int n) {
  return (static_cast<size_t>(n) * sizeof(E) + 127) / 128 * 128;
}

// seq_first[s] = first chunk of sequence s (seq_first[nseq] = the count), table[i] = chunk i;
// entries past the count get seq = -1. Segment bounds are clamped to [0, T] (the binding checks
// them).
__global__ void chunk_table_kernel(opslot_gdr_problem p, ChunkInfo* table, int* seq_first) {
  auto bounds = [&](int64_t s, int& start, int& len) {
    if (p.cu_seqlens == nullptr) {
      start = 0;
      len = static_cast<int>(p.seqlen);
      return;
    }
    const int a = min(max(p.cu_seqlens[s], 0), static_cast<int>(p.seqlen));
    const int e = min(max(p.cu_seqlens[s + 1], a), static_cast<int>(p.seqlen));
    start = a;
    len = e - a;
  };
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int64_t s = 0; s < p.nseq; ++s) {
      int start, len;
      bounds(s, start, len);
      seq_first[s] = min(acc, static_cast<int>(p.max_chunks));
      acc += (len + kChunk - 1) / kChunk;
    }
    seq_first[p.nseq] = min(acc, static_cast<int>(p.max_chunks));
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < p.nseq; s += blockDim.x) {
    int start, len;
    bounds(s, start, len);
    const int b = p.cu_seqlens == nullptr ? static_cast<int>(s) : 0;
    for (int c = 0, i = seq_first[s]; c * kChunk < len && i < seq_first[s + 1]; ++c, ++i) {
      table[i] =
          ChunkInfo{static_cast<int>(s), b, start + c * kChunk, min(kChunk, len - c * kChunk)};
    }
  }
  for (int64_t i = seq_first[p.nseq] + threadIdx.x; i < p.max_chunks; i += blockDim.x)
    table[i] = ChunkInfo{-1, 0, 0, 0};
}

// ---- prep: w = T (beta e^G k), u = T (beta v), G ------------------------------------------------

// The fp32 products go where the UT system and its fp32 inverse were (free once sTo holds T).
template <typename T>
constexpr size_t prep_smem() {
  return 2 * carve_bytes<T>(kChunk * kLd) + 2 * carve_bytes<float>(kChunk * kLd64) +
         carve_bytes<T>(kChunk * kLd64) + 2 * carve_bytes<float>(kChunk);
}
static_assert(2 * carve_bytes<float>(kChunk * kLd64) >= carve_bytes<float>(kChunk * kLd),
              "sC fits over sA, sTf");

// sTo = T(sTf) for a 64 x 64 tile.
template <typename T>
__device__ void to_op64(const float* s, T* d) {
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    d[(i / kChunk) * kLd64 + i % kChunk] = from_float<T>(s[(i / kChunk) * kLd64 + i % kChunk]);
  }
}

// Loads the chunk's gates and keys, builds the UT system and its inverse: sTo = (I + A)^-1.
template <typename T>
__device__ void ut_inverse(const opslot_gdr_problem& p, const ChunkInfo& c, int h, T* sK, float* sA,
                           float* sTf, T* sTo, float* sG, float* sB) {
  load_gates(p, c, h, sG, sB);
  load_rows<T>(sK, p.k, p.k_stride, c, h, p.dk, p.use_l2norm, 1.f);
  __syncthreads();
  decayed_gram<T>(sK, sG, sB, sA);
  invert_unit_lower(sA, sTf,
                    reinterpret_cast<float*>(sTo));  // sTo is free until the result goes in
  to_op64<T>(sTf, sTo);
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    prep_kernel(opslot_gdr_problem p, const ChunkInfo* table, T* w, T* u, float* gamma, T* kd) {
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  T* sK = cv.take<T>(kChunk * kLd);
  T* sX = cv.take<T>(kChunk * kLd);
  float* sA = cv.take<float>(kChunk * kLd64);
  float* sTf = cv.take<float>(kChunk * kLd64);
  T* sTo = cv.take<T>(kChunk * kLd64);
  float* sC = sA;
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  ut_inverse<T>(p, c, h, sK, sA, sTf, sTo, sG, sB);
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, d = i % kD;
    sX[r * kLd + d] = from_float<T>(to_float(sK[r * kLd + d]) * sB[r] * expf(sG[r]));
  }
  __syncthreads();
  block_gemm<T, true, true>(kChunk, kD, kChunk, sTo, kLd64, sX, kLd, sC, kLd, false);
  __syncthreads();
  T* wt = w + tile_off(blockIdx.x, h, H, kChunk * kD);
  copy_tile(wt, kD, sC, kLd, kChunk, kD);
  store_decayed(kd + tile_off(blockIdx.x, h, H, kChunk * kD), sK,
                [&](int r) { return expf(sG[kChunk - 1] - sG[r]); });
  load_rows<T>(sX, p.v, p.v_stride, c, h, p.dv, false, 1.f);
  __syncthreads();
  scale_rows(sX, [&](int r) { return sB[r]; });
  __syncthreads();
  block_gemm<T, true, true>(kChunk, kD, kChunk, sTo, kLd64, sX, kLd, sC, kLd, false);
  __syncthreads();
  copy_tile(u + tile_off(blockIdx.x, h, H, kChunk * kD), kD, sC, kLd, kChunk, kD);
  if (threadIdx.x < kChunk)
    gamma[tile_off(blockIdx.x, h, H, kChunk) + threadIdx.x] = sG[threadIdx.x];
}

// ---- sequential forward state pass --------------------------------------------------------------

template <typename T>
constexpr size_t state_fwd_smem() {
  return carve_bytes<float>(kD * kLdS) + carve_bytes<T>(kD * kLdS) +
         2 * carve_bytes<T>(kChunk * kLd) + carve_bytes<float>(kChunk * kLdS) +
         2 * carve_bytes<T>(kChunk * kLdS) + 2 * carve_bytes<float>(kChunk);
}

// The backward's inputs of the sequential pass that prep wrote in the forward: kd = e^{G_C - G} k
// and qd = e^G q (normalised, scaled), one block per (chunk, head); G from the forward's gamma.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decay_qk_kernel(opslot_gdr_problem p, const ChunkInfo* table, const float* gamma, T* kd,
                    T* qd) {
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  T* sK = cv.take<T>(kChunk * kLd);
  T* sQ = cv.take<T>(kChunk * kLd);
  float* sG = cv.take<float>(kChunk);
  if (threadIdx.x < kChunk)
    sG[threadIdx.x] = gamma[tile_off(blockIdx.x, h, H, kChunk) + threadIdx.x];
  load_rows<T>(sK, p.k, p.k_stride, c, h, p.dk, p.use_l2norm, 1.f);
  load_rows<T>(sQ, p.q, p.q_stride, c, h, p.dk, p.use_l2norm, p.scale);
  __syncthreads();
  store_decayed(kd + tile_off(blockIdx.x, h, H, kChunk * kD), sK,
                [&](int r) { return expf(sG[kChunk - 1] - sG[r]); });
  store_decayed(qd + tile_off(blockIdx.x, h, H, kChunk * kD), sQ,
                [&](int r) { return expf(sG[r]); });
}

template <typename T>
constexpr size_t decay_qk_smem() {
  return 2 * carve_bytes<T>(kChunk * kLd) + carve_bytes<float>(kChunk);
}

// Initial state (or dfinal) columns c0.. of sequence s into sS (128 x kLdS), zeros outside Dk x Dv.
__device__ inline void load_state(const opslot_gdr_problem& p, const float* src, int s, int h,
                                  int c0, float* sS) {
  for (int i = threadIdx.x; i < kD * kStateCols; i += blockDim.x) {
    const int r = i / kStateCols, c = i % kStateCols;
    float x = 0.f;
    if (src != nullptr && r < p.dk && c0 + c < p.dv)
      x = src[((static_cast<int64_t>(s) * p.heads + h) * p.dk + r) * p.dv + c0 + c];
    sS[r * kLdS + c] = x;
  }
}

__device__ inline void store_state(const opslot_gdr_problem& p, const float* sS, int s, int h,
                                   int c0, float* dst) {
  for (int i = threadIdx.x; i < kD * kStateCols; i += blockDim.x) {
    const int r = i / kStateCols, c = i % kStateCols;
    if (r < p.dk && c0 + c < p.dv)
      dst[((static_cast<int64_t>(s) * p.heads + h) * p.dk + r) * p.dv + c0 + c] = sS[r * kLdS + c];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    state_fwd_kernel(opslot_gdr_problem p, const int* seq_first, const T* w, const T* u,
                     const float* gamma, const T* kd, const float* s0, float* s_final, T* hs,
                     T* vnew) {
  const int s = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kStateCols,
            H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  float* sS = cv.take<float>(kD * kLdS);
  T* sSo = cv.take<T>(kD * kLdS);
  T* sW = cv.take<T>(kChunk * kLd);
  T* sK = cv.take<T>(kChunk * kLd);
  float* sWS = cv.take<float>(kChunk * kLdS);
  T* sU = cv.take<T>(kChunk * kLdS);
  T* sVo = cv.take<T>(kChunk * kLdS);
  float* sG = cv.take<float>(kChunk);
  load_state(p, s0, s, h, c0, sS);
  __syncthreads();
  for (int ci = seq_first[s]; ci < seq_first[s + 1]; ++ci) {
    cp_tile(sW, kLd, w + tile_off(ci, h, H, kChunk * kD), kD, kChunk, kD);
    cp_tile(sK, kLd, kd + tile_off(ci, h, H, kChunk * kD), kD, kChunk, kD);
    cp_tile(sU, kLdS, u + tile_off(ci, h, H, kChunk * kD) + c0, kD, kChunk, kStateCols);
    cp_tile(sG, kChunk, gamma + tile_off(ci, h, H, kChunk), kChunk, 1, kChunk);
    copy_tile(sSo, kLdS, sS, kLdS, kD, kStateCols);
    copy_tile(hs + tile_off(ci, h, H, kD * kD) + c0, kD, sS, kLdS, kD, kStateCols);
    cp_wait_all();
    block_gemm<T, true, true>(kChunk, kStateCols, kD, sW, kLd, sSo, kLdS, sWS, kLdS, false);
    __syncthreads();
    const float decay = expf(sG[kChunk - 1]);
    for (int i = threadIdx.x; i < kChunk * kStateCols; i += blockDim.x) {
      const int r = i / kStateCols, col = i % kStateCols;
      sVo[r * kLdS + col] = from_float<T>(to_float(sU[r * kLdS + col]) - sWS[r * kLdS + col]);
    }
    for (int i = threadIdx.x; i < kD * kStateCols; i += blockDim.x)
      sS[(i / kStateCols) * kLdS + i % kStateCols] *= decay;
    __syncthreads();
    copy_tile(vnew + tile_off(ci, h, H, kChunk * kD) + c0, kD, sVo, kLdS, kChunk, kStateCols);
    block_gemm<T, false, true>(kD, kStateCols, kChunk, sK, kLd, sVo, kLdS, sS, kLdS, true);
    __syncthreads();
  }
  if (s_final != nullptr) store_state(p, sS, s, h, c0, s_final);
}

// ---- per-chunk output, and the backward's P^T dO ------------------------------------------------

template <typename T>
constexpr size_t output_smem() {
  constexpr int W = slice_cols<T>() + 8;
  return 2 * carve_bytes<T>(kChunk * kLd) + carve_bytes<float>(kChunk * kLd64) +
         carve_bytes<T>(kChunk * kLd64) + carve_bytes<T>(kD * W) + carve_bytes<T>(kChunk * W) +
         carve_bytes<float>(kChunk * W) + 2 * carve_bytes<float>(kChunk);
}

// Loads q (normalised, scaled) and k of the chunk, and sPo = (q k^T) * exp(G_i - G_j) for i >= j,
// else 0.
template <typename T>
__device__ void decayed_qk(const opslot_gdr_problem& p, const ChunkInfo& c, int h, T* sQ, T* sK,
                           float* sP, T* sPo, float* sG, float* sB) {
  load_gates(p, c, h, sG, sB);
  load_rows<T>(sQ, p.q, p.q_stride, c, h, p.dk, p.use_l2norm, p.scale);
  load_rows<T>(sK, p.k, p.k_stride, c, h, p.dk, p.use_l2norm, 1.f);
  __syncthreads();
  block_gemm<T, true, false>(kChunk, kChunk, kD, sQ, kLd, sK, kLd, sP, kLd64, false);
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, col = i % kChunk;
    sPo[r * kLd64 + col] =
        from_float<T>(r >= col ? sP[r * kLd64 + col] * expf(sG[r] - sG[col]) : 0.f);
  }
  __syncthreads();
}

// out = (e^G q) h + P v_new, or (dv_local) dvl = P^T dO; one Dv slice at a time.
template <typename T, bool Backward>
__global__ void __launch_bounds__(kThreads)
    output_kernel(opslot_gdr_problem p, const ChunkInfo* table, const T* hs, const T* vnew,
                  const T* dout, T* out, float* dvl) {
  constexpr int W = slice_cols<T>(), LW = W + 8;
  const ChunkInfo c = table[blockIdx.x];
  if (c.seq < 0) return;
  const int h = blockIdx.y, H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  T* sQ = cv.take<T>(kChunk * kLd);
  T* sK = cv.take<T>(kChunk * kLd);
  float* sP = cv.take<float>(kChunk * kLd64);
  T* sPo = cv.take<T>(kChunk * kLd64);
  T* sH = cv.take<T>(kD * LW);
  T* sV = cv.take<T>(kChunk * LW);
  float* sO = cv.take<float>(kChunk * LW);
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  const int64_t orow = p.heads * p.dv;  // out / dout: contiguous [B, T, H, Dv]
  const T* drows =
      Backward ? dout + (static_cast<int64_t>(c.b) * p.seqlen + c.tok0) * orow + h * p.dv : nullptr;
  auto issue = [&](int c0) {  // the Dv slice's operands, asynchronously
    if (Backward) {
      cp_token_tile(sV, LW, drows + c0, orow, kChunk, W, c.len, static_cast<int>(p.dv - c0));
    } else {
      cp_tile(sV, LW, vnew + tile_off(blockIdx.x, h, H, kChunk * kD) + c0, kD, kChunk, W);
      cp_tile(sH, LW, hs + tile_off(blockIdx.x, h, H, kD * kD) + c0, kD, kD, W);
    }
  };
  issue(0);
  decayed_qk<T>(p, c, h, sQ, sK, sP, sPo, sG, sB);
  if (!Backward) scale_rows(sQ, [&](int r) { return expf(sG[r]); });
  for (int c0 = 0; c0 < p.dv; c0 += W) {
    const int cols = static_cast<int>(p.dv - c0 < W ? p.dv - c0 : W);
    cp_wait_all();
    if (Backward) {
      block_gemm<T, false, true>(kChunk, W, kChunk, sPo, kLd64, sV, LW, sO, LW, false);
    } else {
      block_gemm<T, true, true>(kChunk, W, kD, sQ, kLd, sH, LW, sO, LW, false);
      __syncthreads();
      block_gemm<T, true, true>(kChunk, W, kChunk, sPo, kLd64, sV, LW, sO, LW, true);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * W; i += blockDim.x) {
      const int r = i / W, col = i % W;
      if (Backward)
        dvl[tile_off(blockIdx.x, h, H, kChunk * kD) + r * kD + c0 + col] = sO[r * LW + col];
      else if (r < c.len && col < cols)
        out[(static_cast<int64_t>(c.b) * p.seqlen + c.tok0 + r) * orow + h * p.dv + c0 + col] =
            from_float<T>(sO[r * LW + col]);
    }
    if (c0 + W < p.dv) issue(c0 + W);  // sV and sH were last read before the barrier above
    __syncthreads();
  }
}

// ---- sequential backward state pass -------------------------------------------------------------

template <typename T>
constexpr size_t state_bwd_smem() {
  return carve_bytes<float>(kD * kLdS) + carve_bytes<T>(kD * kLdS) +
         3 * carve_bytes<T>(kChunk * kLd) + carve_bytes<float>(kChunk * kLdS) +
         2 * carve_bytes<T>(kChunk * kLdS) + 2 * carve_bytes<float>(kChunk);
}

// dS (grad of the state leaving chunk ci) walks the chunks backwards:
//   dv_total = dv_local + (e^{G_C-G} k) dS;  dS <- e^{G_C} dS + (e^G q)^T dO - w^T dv_total.
// Stores dh[ci] = dS as it enters the chunk (the state-out gradient) and dv_total in place of
// dv_local.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    state_bwd_kernel(opslot_gdr_problem p, const ChunkInfo* table, const int* seq_first, const T* w,
                     const float* gamma, const T* kd, const T* qd, const T* dout,
                     const float* dfinal, float* dinit, T* dh, const float* dvl, T* dvt) {
  const int s = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kStateCols,
            H = static_cast<int>(p.heads);
  extern __shared__ __align__(128) char smem[];
  Carve cv{smem};
  float* sD = cv.take<float>(kD * kLdS);
  T* sDo = cv.take<T>(kD * kLdS);
  T* sK = cv.take<T>(kChunk * kLd);
  T* sQ = cv.take<T>(kChunk * kLd);
  T* sW = cv.take<T>(kChunk * kLd);
  float* sDV = cv.take<float>(kChunk * kLdS);
  T* sDVo = cv.take<T>(kChunk * kLdS);
  T* sDO = cv.take<T>(kChunk * kLdS);
  float* sG = cv.take<float>(kChunk);
  float* sB = cv.take<float>(kChunk);
  load_state(p, dfinal, s, h, c0, sD);
  __syncthreads();
  const int64_t orow = p.heads * p.dv;
  for (int ci = seq_first[s + 1] - 1; ci >= seq_first[s]; --ci) {
    const ChunkInfo c = table[ci];
    const T* drows = dout + (static_cast<int64_t>(c.b) * p.seqlen + c.tok0) * orow + h * p.dv + c0;
    cp_tile(sDV, kLdS, dvl + tile_off(ci, h, H, kChunk * kD) + c0, kD, kChunk, kStateCols);
    cp_tile(sW, kLd, w + tile_off(ci, h, H, kChunk * kD), kD, kChunk, kD);
    cp_token_tile(sDO, kLdS, drows, orow, kChunk, kStateCols, c.len, static_cast<int>(p.dv - c0));
    cp_tile(sK, kLd, kd + tile_off(ci, h, H, kChunk * kD), kD, kChunk, kD);
    cp_tile(sQ, kLd, qd + tile_off(ci, h, H, kChunk * kD), kD, kChunk, kD);
    cp_tile(sG, kChunk, gamma + tile_off(ci, h, H, kChunk), kChunk, 1, kChunk);
    copy_tile(sDo, kLdS, sD, kLdS, kD, kStateCols);
    copy_tile(dh + tile_off(ci, h, H, kD * kD) + c0, kD, sD, kLdS, kD, kStateCols);
    cp_wait_all();
    block_gemm<T, true, true>(kChunk, kStateCols, kD, sK, kLd, sDo, kLdS, sDV, kLdS, true);
    __syncthreads();
    copy_tile(dvt + tile_off(ci, h, H, kChunk * kD) + c0, kD, sDV, kLdS, kChunk, kStateCols);
    for (int i = threadIdx.x; i < kChunk * kStateCols; i += blockDim.x) {
      sDVo[(i / kStateCols) * kLdS + i % kStateCols] =
          from_float<T>(-sDV[(i / kStateCols) * kLdS + i % kStateCols]);
    }
    const float decay = expf(sG[kChunk - 1]);
    for (int i = threadIdx.x; i < kD * kStateCols; i += blockDim.x)
      sD[(i / kStateCols) * kLdS + i % kStateCols] *= decay;
    __syncthreads();
    block_gemm<T, false, true>(kD, kStateCols, kChunk, sQ, kLd, sDO, kLdS, sD, kLdS, true);
    __syncthreads();
    block_gemm<T, false, true>(kD, kStateCols, kChunk, sW, kLd, sDVo, kLdS, sD, kLdS, true);
    __syncthreads();
  }
  if (dinit != nullptr) store_state(p, sD, s, h, c0, dinit);
}

}  // namespace opslot::gdr

#include "gdr_kernels_bwd.cuh"
