// The MoE layer's memory-bound kernels (moe.cu launches them): routing (a stable counting sort by
// expert), token scatter and gather-sum, the gated activations and the bias gradients' segment
// sums.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/moe.h"

namespace opslot {
namespace {

constexpr int kSegSplit = 8;  // row splits per expert in the bias-gradient segment sum

__device__ __forceinline__ int kept_rows(const int32_t* offs, int num_experts) {
  return offs[num_experts - 1];
}

template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int j = 0; j < kBytes / 16; ++j) {
      uint4 u = reinterpret_cast<const uint4*>(p)[j];
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[j * kPer + i] = to_float(e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_float(p[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int j = 0; j < kBytes / 16; ++j) {
      uint4 u;
      T* e = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int i = 0; i < kPer; ++i) e[i] = from_float<T>(in[j * kPer + i]);
      reinterpret_cast<uint4*>(p)[j] = u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(in[i]);
  }
}

// Sum over the block in a fixed order; every thread gets the result. `red` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // `red` may still be read from the previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float s = 0.f;
  for (int w = 0; w < warps; ++w) s += red[w];
  return s;
}

// ---- routing: stable counting sort of the (token, k) assignments by expert -------------------
constexpr int kRouteChunk = 4096;   // assignments per block
constexpr int kRouteThreads = 256;  // 8 warps; a chunk is processed in tiles of 256, in order
constexpr int kRouteMaxExperts = 1024;

template <typename I>
__device__ __forceinline__ int route_key(const I* idx, int64_t a, int num_experts) {
  const int64_t v = static_cast<int64_t>(idx[a]);
  return (v < 0 || v > num_experts) ? num_experts : static_cast<int>(v);  // bin E: dropped
}

template <typename I>
__global__ void __launch_bounds__(kRouteThreads)
    route_hist_kernel(const I* __restrict__ idx, int64_t n, int num_experts,
                      int32_t* __restrict__ counts) {
  extern __shared__ int sh[];
  const int bins = num_experts + 1;
  for (int i = threadIdx.x; i < bins; i += blockDim.x) sh[i] = 0;
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kRouteChunk;
  for (int j = threadIdx.x; j < kRouteChunk; j += blockDim.x) {
    const int64_t a = base + j;
    if (a < n) atomicAdd(&sh[route_key(idx, a, num_experts)], 1);  // counts: order-independent
  }
  __syncthreads();
  for (int i = threadIdx.x; i < bins; i += blockDim.x)
    counts[static_cast<int64_t>(blockIdx.x) * bins + i] = sh[i];
}

// One block: per bin, exclusive prefix over the chunks, plus the bin's start; offs = segment ends.
__global__ void route_scan_kernel(const int32_t* __restrict__ counts, int32_t* __restrict__ bases,
                                  int chunks, int num_experts, int32_t* __restrict__ offs) {
  __shared__ int totals[kRouteMaxExperts + 1];
  __shared__ int starts[kRouteMaxExperts + 1];
  const int bins = num_experts + 1;
  for (int e = threadIdx.x; e < bins; e += blockDim.x) {
    int total = 0;
    for (int b = 0; b < chunks; ++b) {
      const int c = counts[static_cast<int64_t>(b) * bins + e];
      bases[static_cast<int64_t>(b) * bins + e] = total;
      total += c;
    }
    totals[e] = total;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < bins; ++e) {
      starts[e] = run;
      run += totals[e];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < bins; e += blockDim.x) {
    const int start = starts[e];
    for (int b = 0; b < chunks; ++b) bases[static_cast<int64_t>(b) * bins + e] += start;
    if (e < num_experts) offs[e] = start + totals[e];
  }
}

template <typename I>
__global__ void __launch_bounds__(kRouteThreads)
    route_scatter_kernel(const I* __restrict__ idx, int64_t n, int64_t top_k, int num_experts,
                         const int32_t* __restrict__ bases, int32_t* __restrict__ row_expert,
                         int32_t* __restrict__ src_token, int32_t* __restrict__ inv) {
  extern __shared__ int sh[];
  const int bins = num_experts + 1;
  int* running = sh;           // [bins]: next row of each bin for this chunk
  int* warp_hist = sh + bins;  // [8][bins]: per-warp counts of the current tile
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < bins; i += blockDim.x)
    running[i] = bases[static_cast<int64_t>(blockIdx.x) * bins + i];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kRouteChunk;
  const unsigned lower = (1u << lane) - 1u;
  for (int t0 = 0; t0 < kRouteChunk && base + t0 < n; t0 += kRouteThreads) {
    for (int i = threadIdx.x; i < (kRouteThreads / 32) * bins; i += blockDim.x) warp_hist[i] = 0;
    __syncthreads();
    const int64_t a = base + t0 + threadIdx.x;
    const bool valid = a < n;
    const int e = valid ? route_key(idx, a, num_experts) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & lower);
    if (valid && rank == 0) warp_hist[warp * bins + e] = __popc(peers);
    __syncthreads();
    if (valid) {
      int pos = running[e] + rank;
      for (int w = 0; w < warp; ++w) pos += warp_hist[w * bins + e];
      inv[a] = pos;
      row_expert[pos] = e;
      src_token[pos] = static_cast<int32_t>(a / top_k);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < bins; i += blockDim.x) {
      int add = 0;
      for (int w = 0; w < kRouteThreads / 32; ++w) add += warp_hist[w * bins + i];
      running[i] += add;
    }
    __syncthreads();
  }
}

// ---- token-major scatter (gather into expert order; combine backward) -----------------------
template <typename T, int V>
__global__ void scatter_rows_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                    const int32_t* __restrict__ inv,
                                    const float* __restrict__ weights, const T* __restrict__ rows,
                                    const T* __restrict__ bias,
                                    const int32_t* __restrict__ row_expert,
                                    float* __restrict__ dot_out, const int32_t* __restrict__ offs,
                                    int num_experts, int64_t top_k, int64_t hidden) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int kept = kept_rows(offs, num_experts);
  const T* s = src + t * hidden;
  for (int64_t k = 0; k < top_k; ++k) {
    const int64_t a = t * top_k + k;
    const int r = inv[a];
    const bool keep = r >= 0 && r < kept;
    float dot = 0.f;
    if (keep) {
      const float w = weights ? weights[a] : 1.f;
      T* d = dst + static_cast<int64_t>(r) * hidden;
      const T* y = dot_out ? rows + static_cast<int64_t>(r) * hidden : nullptr;
      const T* b =
          (dot_out && bias) ? bias + static_cast<int64_t>(row_expert[r]) * hidden : nullptr;
      for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < hidden;
           c += static_cast<int64_t>(blockDim.x) * V) {
        float x[V], o[V];
        load_vec<T, V>(s + c, x);
#pragma unroll
        for (int i = 0; i < V; ++i) o[i] = w * x[i];
        store_vec<T, V>(d + c, o);
        if (y) {
          float yv[V];
          load_vec<T, V>(y + c, yv);
          if (b) {
            float bv[V];
            load_vec<T, V>(b + c, bv);
#pragma unroll
            for (int i = 0; i < V; ++i) yv[i] += bv[i];
          }
#pragma unroll
          for (int i = 0; i < V; ++i) dot += x[i] * yv[i];
        }
      }
    }
    if (dot_out) {
      dot = block_sum(dot, red);
      if (threadIdx.x == 0) dot_out[a] = keep ? dot : 0.f;
    }
    if (a >= kept) {  // the row numbered like this assignment is a dropped row: zero it
      T* d = dst + a * hidden;
      float z[V];
#pragma unroll
      for (int i = 0; i < V; ++i) z[i] = 0.f;
      for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < hidden;
           c += static_cast<int64_t>(blockDim.x) * V)
        store_vec<T, V>(d + c, z);
    }
  }
}

// ---- token-major gather-sum (weighted combine; gather backward) ----------------------------
template <typename T, int V>
__global__ void gather_sum_kernel(const T* __restrict__ rows, T* __restrict__ out,
                                  const int32_t* __restrict__ inv,
                                  const float* __restrict__ weights, const T* __restrict__ bias,
                                  const int32_t* __restrict__ row_expert,
                                  const int32_t* __restrict__ offs, int num_experts, int64_t top_k,
                                  int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int kept = kept_rows(offs, num_experts);
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < hidden;
       c += static_cast<int64_t>(blockDim.x) * V) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t a = t * top_k + k;
      const int r = inv[a];
      if (r < 0 || r >= kept) continue;
      const float w = weights ? weights[a] : 1.f;
      float y[V];
      load_vec<T, V>(rows + static_cast<int64_t>(r) * hidden + c, y);
      if (bias) {
        float b[V];
        load_vec<T, V>(bias + static_cast<int64_t>(row_expert[r]) * hidden + c, b);
#pragma unroll
        for (int i = 0; i < V; ++i) y[i] += b[i];
      }
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += w * y[i];
    }
    store_vec<T, V>(out + t * hidden + c, acc);
  }
}

// ---- gated activations ----------------------------------------------------------------------
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

// Kind 2 (DeepSeek-V4): torch.clamp on the halves, its bound rounded to T as torch rounds a scalar
// bound (`max.to<T>()`); NaN passes through, as in torch.
__device__ __forceinline__ float clamp_hi(float x, float hi) { return x > hi ? hi : x; }
__device__ __forceinline__ float clamp_lohi(float x, float lo, float hi) {
  return x > hi ? hi : (x < lo ? lo : x);
}

template <typename T, int V, int KIND>
__global__ void act_forward_kernel(const T* __restrict__ h, T* __restrict__ a,
                                   const T* __restrict__ bias,
                                   const int32_t* __restrict__ row_expert,
                                   const int32_t* __restrict__ offs, int num_experts, int64_t rows,
                                   int64_t inter, float alpha, float limit) {
  const int kept = kept_rows(offs, num_experts);
  const int64_t per_row = inter / V;
  const int64_t total = rows * per_row;
  const float lim = KIND == 2 ? to_float(from_float<T>(limit)) : limit;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, i = (idx % per_row) * V;
    float o[V];
    if (r >= kept) {
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = 0.f;
    } else if (KIND == 0 || KIND == 2) {
      float g[V], u[V];
      load_vec<T, V>(h + r * 2 * inter + i, g);
      load_vec<T, V>(h + r * 2 * inter + inter + i, u);
      if (KIND == 2) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          g[j] = clamp_hi(g[j], lim);
          u[j] = clamp_lohi(u[j], -lim, lim);
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = g[j] * sigmoidf_(g[j]) * u[j];
    } else {
      float gu[2 * V];
      load_vec<T, 2 * V>(h + r * 2 * inter + 2 * i, gu);
      if (bias) {
        float b[2 * V];
        load_vec<T, 2 * V>(bias + static_cast<int64_t>(row_expert[r]) * 2 * inter + 2 * i, b);
#pragma unroll
        for (int j = 0; j < 2 * V; ++j) gu[j] += b[j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float g = fminf(gu[2 * j], limit);
        const float u = fminf(fmaxf(gu[2 * j + 1], -limit), limit);
        o[j] = (u + 1.f) * g * sigmoidf_(alpha * g);
      }
    }
    store_vec<T, V>(a + r * inter + i, o);
  }
}

template <typename T, int V, int KIND>
__global__ void act_backward_kernel(const T* __restrict__ da, const T* __restrict__ h,
                                    T* __restrict__ dh, const T* __restrict__ bias,
                                    const int32_t* __restrict__ row_expert,
                                    const int32_t* __restrict__ offs, int num_experts, int64_t rows,
                                    int64_t inter, float alpha, float limit) {
  const int kept = kept_rows(offs, num_experts);
  const int64_t per_row = inter / V;
  const int64_t total = rows * per_row;
  const float lim = KIND == 2 ? to_float(from_float<T>(limit)) : limit;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, i = (idx % per_row) * V;
    if (KIND == 0 || KIND == 2) {
      float dg[V], du[V];
      if (r >= kept) {
#pragma unroll
        for (int j = 0; j < V; ++j) dg[j] = du[j] = 0.f;
      } else {
        float g[V], u[V], d[V];
        load_vec<T, V>(h + r * 2 * inter + i, g);
        load_vec<T, V>(h + r * 2 * inter + inter + i, u);
        load_vec<T, V>(da + r * inter + i, d);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          // kind 2: the clamps' gradient passes where min <= x <= max (torch's clamp backward)
          const bool pass_g = KIND == 0 || g[j] <= lim;
          const bool pass_u = KIND == 0 || (u[j] >= -lim && u[j] <= lim);
          const float gc = KIND == 2 ? clamp_hi(g[j], lim) : g[j];
          const float uc = KIND == 2 ? clamp_lohi(u[j], -lim, lim) : u[j];
          const float s = sigmoidf_(gc);
          du[j] = pass_u ? d[j] * gc * s : 0.f;
          dg[j] = pass_g ? d[j] * uc * s * (1.f + gc * (1.f - s)) : 0.f;
        }
      }
      store_vec<T, V>(dh + r * 2 * inter + i, dg);
      store_vec<T, V>(dh + r * 2 * inter + inter + i, du);
    } else {
      float out[2 * V];
      if (r >= kept) {
#pragma unroll
        for (int j = 0; j < 2 * V; ++j) out[j] = 0.f;
      } else {
        float gu[2 * V], d[V];
        load_vec<T, 2 * V>(h + r * 2 * inter + 2 * i, gu);
        load_vec<T, V>(da + r * inter + i, d);
        if (bias) {
          float b[2 * V];
          load_vec<T, 2 * V>(bias + static_cast<int64_t>(row_expert[r]) * 2 * inter + 2 * i, b);
#pragma unroll
          for (int j = 0; j < 2 * V; ++j) gu[j] += b[j];
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float graw = gu[2 * j], uraw = gu[2 * j + 1];
          const float g = fminf(graw, limit);
          const float u = fminf(fmaxf(uraw, -limit), limit);
          const float s = sigmoidf_(alpha * g);
          const float glu = g * s;
          out[2 * j] = graw <= limit ? d[j] * (u + 1.f) * (s + alpha * g * s * (1.f - s)) : 0.f;
          out[2 * j + 1] = (uraw >= -limit && uraw <= limit) ? d[j] * glu : 0.f;
        }
      }
      store_vec<T, 2 * V>(dh + r * 2 * inter + 2 * i, out);
    }
  }
}

// ---- per-expert column sums (bias gradients) ------------------------------------------------
template <typename T>
__global__ void segment_sum_partial_kernel(const T* __restrict__ g, float* __restrict__ partial,
                                           const int32_t* __restrict__ offs, int num_experts,
                                           int64_t cols) {
  __shared__ float red[8][33];
  const int e = blockIdx.y, split = blockIdx.z;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t start = e == 0 ? 0 : offs[e - 1], end = offs[e];
  const int64_t chunk = (end - start + kSegSplit - 1) / kSegSplit;
  const int64_t r0 = start + split * chunk;
  const int64_t r1 = r0 + chunk < end ? r0 + chunk : end;
  float acc = 0.f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) acc += to_float(g[r * cols + c]);
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.y); ++w) s += red[w][threadIdx.x];
    partial[(static_cast<int64_t>(split) * num_experts + e) * cols + c] = s;
  }
}

template <typename T>
__global__ void segment_sum_final_kernel(const float* __restrict__ partial, T* __restrict__ out,
                                         int num_experts, int64_t cols) {
  const int64_t total = static_cast<int64_t>(num_experts) * cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kSegSplit; ++k) s += partial[k * total + idx];
    out[idx] = from_float<T>(s);
  }
}

}  // namespace
}  // namespace opslot
