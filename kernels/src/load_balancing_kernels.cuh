// The load-balancing loss's general kernels (load_balancing.cu launches them; the layout:
// load_balancing.cu's header, docs/kernels.md "load_balancing_loss"): the arguments, the lane
// layout, the general forward and backward (any dtype, any expert count) and the finalize.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/load_balancing.h"

namespace opslot {
namespace {

constexpr int kMaxLayers = 64;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kFinalThreads = 1024;

struct LbLayers {
  const void* ptr[kMaxLayers];
  int64_t stride[kMaxLayers];
  void* out[kMaxLayers];
};

struct LbArgs {
  int layers;  // in this launch
  int64_t rows;
  int experts;
  int top_k;
  const float* mask;
  float* partial;  // [gridDim.x, 2E] for this launch
  const float* coef;
  const float* grad;
};

// Lane layout: LPR lanes per row (a power of two dividing 32), RPW = 32 / LPR rows per warp at a
// time; lane q of a row owns experts q*EPL .. q*EPL+EPL-1.
template <typename T, int EPL, bool VEC>
__device__ __forceinline__ void load_row(const LbLayers& L, int layer, int64_t t, int E, int q,
                                         float (&v)[EPL]) {
  const T* p = static_cast<const T*>(L.ptr[layer]) + t * L.stride[layer] + q * EPL;
  if (VEC) {
    const Vec<T, EPL> x = *reinterpret_cast<const Vec<T, EPL>*>(p);
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = to_float(x.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = q * EPL + i < E ? to_float(p[i]) : -INFINITY;
  }
}

// Softmax of the row in place (fp32), the same code in the forward and the backward.
template <int EPL, int LPR>
__device__ __forceinline__ void softmax_row(float (&v)[EPL], int E, int q) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < EPL; ++i) mx = fmaxf(mx, v[i]);
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    v[i] = q * EPL + i < E ? expf(v[i] - mx) : 0.f;
    s += v[i];
  }
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.f / s;
#pragma unroll
  for (int i = 0; i < EPL; ++i) v[i] *= inv;
}

template <typename T, int EPL, int LPR, bool VEC>
__global__ void __launch_bounds__(kThreads)
    lb_fwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int RPW = 32 / LPR;
  extern __shared__ float sm[];  // [kWarps * RPW][2E]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = a.experts;
  float cnt[EPL], ps[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) cnt[i] = ps[i] = 0.f;
  const int64_t total = a.rows * a.layers;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RPW; base < total;
       base += static_cast<int64_t>(gridDim.x) * kWarps * RPW) {
    const int64_t r = base + sub;
    const bool valid = r < total;
    const int layer = valid ? static_cast<int>(r / a.rows) : 0;
    const int64_t t = valid ? r - static_cast<int64_t>(layer) * a.rows : 0;
    const float m = valid ? (a.mask ? a.mask[t] : 1.f) : 0.f;
    float v[EPL];
    if (valid) {
      load_row<T, EPL, VEC>(L, layer, t, E, q, v);
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i) v[i] = 0.f;
    }
    // top-k on the logits (softmax is monotone): k rounds of an arg-max over the row's lanes,
    // the lower index on ties.
    unsigned taken = 0;
    for (int k = 0; k < a.top_k; ++k) {
      float best = -INFINITY;
      int bi = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        const int e = q * EPL + i;
        if (e < E && !(taken >> i & 1u) && (bi == 0x7fffffff || v[i] > best)) {
          best = v[i];
          bi = e;
        }
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != 0x7fffffff && (bi == 0x7fffffff || ob > best || (ob == best && oi < bi))) {
          best = ob;
          bi = oi;
        }
      }
      if (bi / EPL == q) taken |= 1u << (bi - q * EPL);
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i) cnt[i] += (taken >> i & 1u) ? m : 0.f;
    softmax_row<EPL, LPR>(v, E, q);
    if (valid) {
#pragma unroll
      for (int i = 0; i < EPL; ++i) ps[i] += m * v[i];
    }
  }
  // Block partial: the warps' row groups in a fixed order.
  float* mine = sm + (warp * RPW + sub) * 2 * E;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    const int e = q * EPL + i;
    if (e < E) {
      mine[e] = cnt[i];
      mine[E + e] = ps[i];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * E; c += kThreads) {
    float s = 0.f;
    for (int w = 0; w < kWarps * RPW; ++w) s += sm[w * 2 * E + c];
    a.partial[static_cast<int64_t>(blockIdx.x) * 2 * E + c] = s;
  }
}

// One block: the column sums' kColChunks rows in a fixed order, then the loss (a fixed-order tree
// over the experts) and the backward's coefficients. E <= 512, so 2E <= kFinalThreads.
__global__ void __launch_bounds__(kFinalThreads)
    lb_finalize_kernel(const float* sums, int nrows, int E, int layers, int64_t rows,
                       const float* mask, float* loss, float* coef) {
  __shared__ float sm[kFinalThreads];
  __shared__ float red[kFinalThreads];
  __shared__ float total_rows;
  const int tid = threadIdx.x;
  // R: the mask's sum (fixed-order tree) times the layers, or rows * layers.
  if (mask) {
    float s = 0.f;
    for (int64_t t = tid; t < rows; t += kFinalThreads) s += mask[t];
    red[tid] = s;
    __syncthreads();
    for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
      if (tid < w) red[tid] += red[tid + w];
      __syncthreads();
    }
    if (tid == 0) total_rows = red[0] * static_cast<float>(layers);
  } else if (tid == 0) {
    total_rows = static_cast<float>(rows) * static_cast<float>(layers);
  }
  // sm[0..E): counts, sm[E..2E): probability sums.
  float v = 0.f;
  if (tid < 2 * E)
    for (int r = 0; r < nrows; ++r) v += sums[static_cast<int64_t>(r) * 2 * E + tid];
  sm[tid] = v;
  __syncthreads();
  const float R = total_rows;
  float term = 0.f;
  if (tid < E) {
    coef[tid] = static_cast<float>(E) * sm[tid] / (R * R);
    term = (sm[tid] / R) * (sm[E + tid] / R);
  }
  red[tid] = term;
  __syncthreads();
  for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  if (tid == 0) loss[0] = red[0] * static_cast<float>(E);
}

template <typename T, int EPL, int LPR, bool VEC>
__global__ void __launch_bounds__(kThreads)
    lb_bwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int RPW = 32 / LPR;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = a.experts;
  float c[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) c[i] = q * EPL + i < E ? a.coef[q * EPL + i] : 0.f;
  const float g = a.grad[0];
  const int64_t total = a.rows * a.layers;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RPW; base < total;
       base += static_cast<int64_t>(gridDim.x) * kWarps * RPW) {
    const int64_t r = base + sub;
    const bool valid = r < total;
    const int layer = valid ? static_cast<int>(r / a.rows) : 0;
    const int64_t t = valid ? r - static_cast<int64_t>(layer) * a.rows : 0;
    const float m = (valid && a.mask ? a.mask[t] : 1.f) * g;
    float v[EPL];
    if (valid) {
      load_row<T, EPL, VEC>(L, layer, t, E, q, v);
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i) v[i] = 0.f;
    }
    softmax_row<EPL, LPR>(v, E, q);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) dot += v[i] * c[i];
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (!valid) continue;
    T* out = static_cast<T*>(L.out[layer]) + t * E + q * EPL;
    if (VEC) {
      Vec<T, EPL> o;
#pragma unroll
      for (int i = 0; i < EPL; ++i) o.v[i] = from_float<T>(m * v[i] * (c[i] - dot));
      *reinterpret_cast<Vec<T, EPL>*>(out) = o;
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i)
        if (q * EPL + i < E) out[i] = from_float<T>(m * v[i] * (c[i] - dot));
    }
  }
}

}  // namespace
}  // namespace opslot
