// The MoE layer's portable grouped GEMM (SIMT tiles, fp32 accumulation; the path for fp16/fp32,
// other GPUs and unaligned widths) and the zeroing of the rows past the kept ones (moe.cu launches
// them).
#pragma once

#include "moe_kernels.cuh"

namespace opslot {
namespace {

// ---- portable grouped GEMM (SIMT, fp32 accumulation) ----------------------------------------
constexpr int kBM = 64, kBN = 64, kBK = 16, kGemmThreads = 256;

__device__ __forceinline__ void tile_fma(const float (*As)[kBM + 4], const float (*Bs)[kBN + 4],
                                         float (&acc)[4][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = As[kk][ty * 4 + i];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx * 4 + j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    gmm_rows_kernel(const T* __restrict__ A, const T* __restrict__ B, int64_t sbe, int64_t sbk,
                    int64_t sbn, T* __restrict__ C, const int32_t* __restrict__ offs,
                    int num_experts, int64_t K, int64_t N) {
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Bs[kBK][kBN + 4];
  __shared__ int s_e, s_row0, s_end;
  if (threadIdx.x == 0) {
    int tile = blockIdx.y, start = 0, found = -1, row0 = 0, end = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int stop = offs[e];
      const int tiles = (stop - start + kBM - 1) / kBM;
      if (tile < tiles) {
        found = e;
        row0 = start + tile * kBM;
        end = stop;
        break;
      }
      tile -= tiles;
      start = stop;
    }
    s_e = found;
    s_row0 = row0;
    s_end = end;
  }
  __syncthreads();
  const int e = s_e;
  if (e < 0) return;
  const int64_t row0 = s_row0, end = s_end, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const T* Be = B + e * sbe;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int i = 0; i < (kBM * kBK) / kGemmThreads; ++i) {
      const int idx = threadIdx.x + i * kGemmThreads;
      const int m = idx / kBK, kk = idx % kBK;
      const int64_t r = row0 + m, k = k0 + kk;
      As[kk][m] = (r < end && k < K) ? to_float(A[r * K + k]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < (kBN * kBK) / kGemmThreads; ++i) {
      const int idx = threadIdx.x + i * kGemmThreads;
      const int kk = idx / kBN, n = idx % kBN;
      const int64_t k = k0 + kk, col = n0 + n;
      Bs[kk][n] = (k < K && col < N) ? to_float(Be[k * sbk + col * sbn]) : 0.f;
    }
    __syncthreads();
    tile_fma(As, Bs, acc);
    __syncthreads();
  }
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + ty * 4 + i;
    if (r >= end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      if (col < N) C[r * N + col] = from_float<T>(acc[i][j]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    gmm_wgrad_kernel(const T* __restrict__ A, const T* __restrict__ G, T* __restrict__ C,
                     int64_t sce, int64_t scp, int64_t scq, const int32_t* __restrict__ offs,
                     int64_t P, int64_t Q, int64_t tiles_q) {
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Bs[kBK][kBN + 4];
  const int e = blockIdx.y;
  const int64_t p0 = (blockIdx.x / tiles_q) * kBM, q0 = (blockIdx.x % tiles_q) * kBN;
  const int64_t start = e == 0 ? 0 : offs[e - 1], end = offs[e];
  float acc[4][4] = {};
  for (int64_t r0 = start; r0 < end; r0 += kBK) {
#pragma unroll
    for (int i = 0; i < (kBM * kBK) / kGemmThreads; ++i) {
      const int idx = threadIdx.x + i * kGemmThreads;
      const int kk = idx / kBM, m = idx % kBM;
      const int64_t r = r0 + kk, p = p0 + m;
      As[kk][m] = (r < end && p < P) ? to_float(A[r * P + p]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < (kBN * kBK) / kGemmThreads; ++i) {
      const int idx = threadIdx.x + i * kGemmThreads;
      const int kk = idx / kBN, n = idx % kBN;
      const int64_t r = r0 + kk, q = q0 + n;
      Bs[kk][n] = (r < end && q < Q) ? to_float(G[r * Q + q]) : 0.f;
    }
    __syncthreads();
    tile_fma(As, Bs, acc);
    __syncthreads();
  }
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t p = p0 + ty * 4 + i;
    if (p >= P) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t q = q0 + tx * 4 + j;
      if (q < Q) C[e * sce + p * scp + q * scq] = from_float<T>(acc[i][j]);
    }
  }
}

// ---- zero the rows past the kept ones --------------------------------------------------------
constexpr int kTailRows = 16;

template <typename T, int V>
__global__ void zero_tail_kernel(T* __restrict__ c, const int32_t* __restrict__ offs,
                                 int num_experts, int64_t rows, int64_t cols) {
  const int64_t kept = kept_rows(offs, num_experts);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTailRows;
  if (r0 + kTailRows <= kept) return;
  float z[V];
#pragma unroll
  for (int i = 0; i < V; ++i) z[i] = 0.f;
  for (int64_t r = r0 > kept ? r0 : kept; r < r0 + kTailRows && r < rows; ++r)
    for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < cols;
         j += static_cast<int64_t>(blockDim.x) * V)
      store_vec<T, V>(c + r * cols + j, z);
}

}  // namespace
}  // namespace opslot
