// MoE experts: token scatter/gather-sum, gated activations, bias-gradient segment sums and a
// portable grouped GEMM (see opslot_kernels/moe.h for the layout; docs/kernels.md "## MoE experts"
// for the design).
//
// The fast bf16 GEMMs of the layer are torch._grouped_mm (CUTLASS, sm90/sm100), called from Python;
// the grouped GEMM here is the path for fp16/fp32, other GPUs and unaligned widths: SIMT tiles with
// fp32 accumulation whose row segments are found on the device from `offs`, so no host read.
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

// ---- host helpers ---------------------------------------------------------------------------
template <typename T>
constexpr int vec_width() {
  return 16 / static_cast<int>(sizeof(T));
}

int row_threads(int64_t vectors) {
  int64_t t = (vectors + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 256) t = 256;
  return static_cast<int>(t);
}

int elementwise_blocks(int64_t items, int threads) {
  int64_t b = (items + threads - 1) / threads;
  const int64_t cap = 132 * 32;  // grid-stride beyond a few waves
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return static_cast<int>(b);
}

int check_common(const char* what, const int32_t* offs, int64_t num_experts) {
  if (offs == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: offs is NULL", what);
  if (num_experts < 1 || num_experts > (1 << 20))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: num_experts %lld out of range", what,
                     static_cast<long long>(num_experts));
  return OPSLOT_OK;
}

// Arguments shared by the activation's forward and backward entry points.
int check_act_args(const char* what, const int32_t* offs, int64_t num_experts, int kind,
                   const void* bias, const int32_t* row_expert, int64_t rows, int64_t inter,
                   float limit) {
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (kind != 0 && kind != 1 && kind != 2)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown kind %d", what, kind);
  if (kind != 1 && bias)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kind %d takes no bias", what, kind);
  if (kind == 2 && !(limit >= 0.f))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kind 2 needs a limit >= 0, got %g", what,
                     static_cast<double>(limit));
  if (bias && row_expert == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bias needs row_expert", what);
  if (rows < 0 || inter < 1) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int64_t opslot_moe_route_scratch(int64_t n, int64_t num_experts) {
  const int64_t chunks = (n + kRouteChunk - 1) / kRouteChunk;
  return 2 * (chunks > 0 ? chunks : 1) * (num_experts + 1);
}

OPSLOT_API int opslot_moe_route(const void* idx, int idx_is_int64, int64_t n, int64_t top_k,
                                int64_t num_experts, int32_t* offs, int32_t* row_expert,
                                int32_t* src_token, int32_t* inv, int32_t* scratch, void* stream) {
  const char* what = "opslot_moe_route";
  if (num_experts < 1 || num_experts > kRouteMaxExperts)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: num_experts %lld outside [1, %d]", what,
                     static_cast<long long>(num_experts), kRouteMaxExperts);
  if (n < 0 || n > 0x7fffffff || top_k < 1 || offs == nullptr || scratch == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad arguments (n %lld, top_k %lld)", what,
                     static_cast<long long>(n), static_cast<long long>(top_k));
  auto s = static_cast<cudaStream_t>(stream);
  const int bins = static_cast<int>(num_experts) + 1;
  const int64_t chunks = n > 0 ? (n + kRouteChunk - 1) / kRouteChunk : 0;
  int32_t* counts = scratch;
  int32_t* bases = scratch + (chunks > 0 ? chunks : 1) * bins;
  auto launch = [&](auto tag) {
    using I = decltype(tag);
    const I* ix = static_cast<const I*>(idx);
    if (chunks > 0) {
      route_hist_kernel<I><<<static_cast<unsigned>(chunks), kRouteThreads, bins * sizeof(int), s>>>(
          ix, n, static_cast<int>(num_experts), counts);
      if (int rc = check_launch(what)) return rc;
    }
    route_scan_kernel<<<1, 1024, 0, s>>>(counts, bases, static_cast<int>(chunks),
                                         static_cast<int>(num_experts), offs);
    if (int rc = check_launch(what)) return rc;
    if (chunks > 0) {
      const size_t smem = static_cast<size_t>(bins) * (1 + kRouteThreads / 32) * sizeof(int);
      route_scatter_kernel<I><<<static_cast<unsigned>(chunks), kRouteThreads, smem, s>>>(
          ix, n, top_k, static_cast<int>(num_experts), bases, row_expert, src_token, inv);
      if (int rc = check_launch(what)) return rc;
    }
    return static_cast<int>(OPSLOT_OK);
  };
  return idx_is_int64 ? launch(int64_t{}) : launch(int32_t{});
}

OPSLOT_API int opslot_moe_scatter_rows(const void* src, void* dst, const int32_t* inv,
                                       const float* weights, const void* rows, const void* bias,
                                       const int32_t* row_expert, float* dot_out,
                                       const int32_t* offs, int64_t num_experts, int64_t tokens,
                                       int64_t top_k, int64_t hidden, int dtype, void* stream) {
  const char* what = "opslot_moe_scatter_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (tokens < 0 || top_k < 1 || hidden < 1 || tokens > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape tokens %lld top_k %lld hidden %lld", what,
                     static_cast<long long>(tokens), static_cast<long long>(top_k),
                     static_cast<long long>(hidden));
  if (dot_out && (rows == nullptr || (bias && row_expert == nullptr)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: dot_out needs rows (and row_expert with bias)", what);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (hidden % V == 0) {
      scatter_rows_kernel<T, V><<<static_cast<unsigned>(tokens), row_threads(hidden / V), 0, s>>>(
          static_cast<const T*>(src), static_cast<T*>(dst), inv, weights,
          static_cast<const T*>(rows), static_cast<const T*>(bias), row_expert, dot_out, offs,
          static_cast<int>(num_experts), top_k, hidden);
    } else {
      scatter_rows_kernel<T, 1><<<static_cast<unsigned>(tokens), row_threads(hidden), 0, s>>>(
          static_cast<const T*>(src), static_cast<T*>(dst), inv, weights,
          static_cast<const T*>(rows), static_cast<const T*>(bias), row_expert, dot_out, offs,
          static_cast<int>(num_experts), top_k, hidden);
    }
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gather_sum(const void* rows, void* out, const int32_t* inv,
                                     const float* weights, const void* bias,
                                     const int32_t* row_expert, const int32_t* offs,
                                     int64_t num_experts, int64_t tokens, int64_t top_k,
                                     int64_t hidden, int dtype, void* stream) {
  const char* what = "opslot_moe_gather_sum";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (tokens < 0 || top_k < 1 || hidden < 1 || tokens > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (bias && row_expert == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bias needs row_expert", what);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (hidden % V == 0) {
      gather_sum_kernel<T, V><<<static_cast<unsigned>(tokens), row_threads(hidden / V), 0, s>>>(
          static_cast<const T*>(rows), static_cast<T*>(out), inv, weights,
          static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), top_k,
          hidden);
    } else {
      gather_sum_kernel<T, 1><<<static_cast<unsigned>(tokens), row_threads(hidden), 0, s>>>(
          static_cast<const T*>(rows), static_cast<T*>(out), inv, weights,
          static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), top_k,
          hidden);
    }
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_act_forward(const void* h, void* a, const void* bias,
                                      const int32_t* row_expert, const int32_t* offs,
                                      int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                      float alpha, float limit, int dtype, void* stream) {
  const char* what = "opslot_moe_act_forward";
  if (int rc = check_act_args(what, offs, num_experts, kind, bias, row_expert, rows, inter, limit))
    return rc;
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    const int threads = 256;
    auto launch = [&](auto vtag) {
      constexpr int VV = decltype(vtag)::value;
      const int blocks = elementwise_blocks(rows * (inter / VV), threads);
      if (kind == 0)
        act_forward_kernel<T, VV, 0><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
      else if (kind == 2)
        act_forward_kernel<T, VV, 2><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
      else
        act_forward_kernel<T, VV, 1><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
    };
    if (inter % V == 0)
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_act_backward(const void* da, const void* h, void* dh, const void* bias,
                                       const int32_t* row_expert, const int32_t* offs,
                                       int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                       float alpha, float limit, int dtype, void* stream) {
  const char* what = "opslot_moe_act_backward";
  if (int rc = check_act_args(what, offs, num_experts, kind, bias, row_expert, rows, inter, limit))
    return rc;
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    const int threads = 256;
    auto launch = [&](auto vtag) {
      constexpr int VV = decltype(vtag)::value;
      const int blocks = elementwise_blocks(rows * (inter / VV), threads);
      if (kind == 0)
        act_backward_kernel<T, VV, 0><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
      else if (kind == 2)
        act_backward_kernel<T, VV, 2><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
      else
        act_backward_kernel<T, VV, 1><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
    };
    if (inter % V == 0)
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
    return check_launch(what);
  });
}

OPSLOT_API int64_t opslot_moe_segment_sum_scratch(int64_t num_experts, int64_t cols) {
  return static_cast<int64_t>(kSegSplit) * num_experts * cols;
}

OPSLOT_API int opslot_moe_segment_sum(const void* g, void* out, float* scratch, const int32_t* offs,
                                      int64_t num_experts, int64_t cols, int dtype, void* stream) {
  const char* what = "opslot_moe_segment_sum";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (cols < 1 || scratch == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad cols or scratch", what);
  if (num_experts > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many experts", what);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(num_experts),
              kSegSplit);
    segment_sum_partial_kernel<T><<<grid, dim3(32, 8), 0, s>>>(
        static_cast<const T*>(g), scratch, offs, static_cast<int>(num_experts), cols);
    if (int rc = check_launch(what)) return rc;
    segment_sum_final_kernel<T><<<elementwise_blocks(num_experts * cols, 256), 256, 0, s>>>(
        scratch, static_cast<T*>(out), static_cast<int>(num_experts), cols);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gmm_rows(const void* a, const void* b, int64_t sbe, int64_t sbk,
                                   int64_t sbn, void* c, const int32_t* offs, int64_t num_experts,
                                   int64_t rows, int64_t k, int64_t n, int dtype, void* stream) {
  const char* what = "opslot_moe_gmm_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || k < 1 || n < 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  const int64_t row_tiles = (rows + kBM - 1) / kBM + num_experts;
  const int64_t col_tiles = (n + kBN - 1) / kBN;
  if (row_tiles > 65535 || col_tiles > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %lld rows is too many for one launch", what,
                     static_cast<long long>(rows));
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    gmm_rows_kernel<T><<<dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles)),
                         kGemmThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                               sbe, sbk, sbn, static_cast<T*>(c), offs,
                                               static_cast<int>(num_experts), k, n);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gmm_wgrad(const void* a, const void* g, void* c, int64_t sce, int64_t scp,
                                    int64_t scq, const int32_t* offs, int64_t num_experts,
                                    int64_t rows, int64_t p, int64_t q, int dtype, void* stream) {
  const char* what = "opslot_moe_gmm_wgrad";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || p < 1 || q < 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (num_experts > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many experts", what);
  const int64_t tiles_q = (q + kBN - 1) / kBN;
  const int64_t tiles = (p + kBM - 1) / kBM * tiles_q;
  if (tiles > 0x7fffffff) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too large", what);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    gmm_wgrad_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(num_experts)),
                          kGemmThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(g),
                                                static_cast<T*>(c), sce, scp, scq, offs, p, q,
                                                tiles_q);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_zero_tail_rows(void* c, const int32_t* offs, int64_t num_experts,
                                         int64_t rows, int64_t cols, int dtype, void* stream) {
  const char* what = "opslot_moe_zero_tail_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || cols < 1) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = (rows + kTailRows - 1) / kTailRows;
  if (blocks > 0x7fffffff) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many rows", what);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (cols % V == 0)
      zero_tail_kernel<T, V><<<static_cast<unsigned>(blocks), row_threads(cols / V), 0, s>>>(
          static_cast<T*>(c), offs, static_cast<int>(num_experts), rows, cols);
    else
      zero_tail_kernel<T, 1><<<static_cast<unsigned>(blocks), row_threads(cols), 0, s>>>(
          static_cast<T*>(c), offs, static_cast<int>(num_experts), rows, cols);
    return check_launch(what);
  });
}

}  // extern "C"
