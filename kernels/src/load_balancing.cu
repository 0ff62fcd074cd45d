// Load-balancing loss over the tuple of per-layer router logits. The layer pointers travel by value
// in the kernel-parameter struct, up to kMaxLayers per launch (more layers: more launches, each
// writing its own partial rows). A (layer, token) row is spread over LPR lanes, each holding EPL
// (up to 16) consecutive experts; softmax and top-k are butterflies over those lanes. Per-block partial sums (counts, probability
// sums) go to scratch; lb_finalize adds them in a fixed order and writes the loss and the
// coefficients the backward needs. See kernels/include/opslot_kernels/load_balancing.h.
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
__device__ __forceinline__ void load_row(const LbLayers& L, int layer, int64_t t, int E, int q, float (&v)[EPL]) {
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
__global__ void __launch_bounds__(kThreads) lb_fwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
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

// One block: the partial rows in a fixed order, then the loss and the backward's coefficients.
__global__ void __launch_bounds__(kFinalThreads) lb_finalize_kernel(const float* partial, int64_t prows, int E,
                                                                    int layers, int64_t rows, const float* mask,
                                                                    float* loss, float* coef) {
  __shared__ float sm[kFinalThreads];
  __shared__ float total_rows;
  const int ncol = 2 * E;
  const int ngrp = kFinalThreads / ncol;
  const int col = threadIdx.x % ncol, grp = threadIdx.x / ncol;
  // R: the mask's sum (fixed-order tree) times the layers, or rows * layers.
  if (mask) {
    float s = 0.f;
    for (int64_t t = threadIdx.x; t < rows; t += kFinalThreads) s += mask[t];
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) sm[threadIdx.x] += sm[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) total_rows = sm[0] * static_cast<float>(layers);
  } else if (threadIdx.x == 0) {
    total_rows = static_cast<float>(rows) * static_cast<float>(layers);
  }
  __syncthreads();
  float s = 0.f;
  if (grp < ngrp) {
#pragma unroll 8
    for (int64_t p = grp; p < prows; p += ngrp) s += partial[p * ncol + col];
  }
  sm[threadIdx.x] = s;
  __syncthreads();
  float v = 0.f;
  if (threadIdx.x < ncol) {
    for (int g = 0; g < ngrp; ++g) v += sm[g * ncol + threadIdx.x];
  }
  __syncthreads();
  // sm[0..E): counts, sm[E..2E): probability sums.
  if (threadIdx.x < ncol) sm[threadIdx.x] = v;
  __syncthreads();
  const float R = total_rows;
  if (threadIdx.x < E) coef[threadIdx.x] = static_cast<float>(E) * sm[threadIdx.x] / (R * R);
  if (threadIdx.x == 0) {
    float acc = 0.f;
    for (int e = 0; e < E; ++e) acc += (sm[e] / R) * (sm[E + e] / R);
    loss[0] = acc * static_cast<float>(E);
  }
}

template <typename T, int EPL, int LPR, bool VEC>
__global__ void __launch_bounds__(kThreads) lb_bwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
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

int num_sms() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) return 132;
  return n;
}

int64_t blocks_for(int64_t rows, int layers) {
  const int64_t need = (rows * layers + kWarps * 4 - 1) / (kWarps * 4);
  const int64_t cap = static_cast<int64_t>(num_sms()) * 4;
  return need < 1 ? 1 : (need < cap ? need : cap);
}

template <typename T, int EPL, int LPR>
int launch_epl(bool bwd, int num_layers, const void* const* logits, const int64_t* strides, void* const* outs,
               LbArgs a, float* partial_base, cudaStream_t s) {
  int64_t offset = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    LbLayers L{};
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    bool vec = a.experts == EPL * LPR;
    for (int i = 0; i < n; ++i) {
      L.ptr[i] = logits[first + i];
      L.stride[i] = strides[first + i];
      if (!L.ptr[i] && a.rows > 0) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null logits");
      vec = vec && L.stride[i] % EPL == 0 && reinterpret_cast<uintptr_t>(L.ptr[i]) % (EPL * sizeof(T)) == 0;
      if (bwd) {
        L.out[i] = outs[first + i];
        vec = vec && reinterpret_cast<uintptr_t>(L.out[i]) % (EPL * sizeof(T)) == 0;
      }
    }
    LbArgs b = a;
    b.layers = n;
    const int64_t blocks = blocks_for(a.rows, n);
    b.partial = partial_base + offset * 2 * a.experts;
    offset += blocks;
    if (bwd) {
      if (vec) lb_bwd_kernel<T, EPL, LPR, true><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(L, b);
      else lb_bwd_kernel<T, EPL, LPR, false><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(L, b);
    } else {
      const size_t smem = sizeof(float) * kWarps * (32 / LPR) * 2 * a.experts;
      if (vec) lb_fwd_kernel<T, EPL, LPR, true><<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(L, b);
      else lb_fwd_kernel<T, EPL, LPR, false><<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(L, b);
    }
    if (int rc = check_launch(bwd ? "load_balancing backward" : "load_balancing forward")) return rc;
  }
  return OPSLOT_OK;
}

template <typename T>
int launch(bool bwd, int num_layers, const void* const* logits, const int64_t* strides, void* const* outs, LbArgs a,
           float* partial, cudaStream_t s) {
  // Up to 16 experts per lane; rows of more than 16 experts are spread over 2..32 lanes.
  switch (a.experts <= 16 ? a.experts : 16 + (a.experts + 15) / 16) {
    case 1: return launch_epl<T, 1, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 2: return launch_epl<T, 2, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 3: case 4: return launch_epl<T, 4, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 5: case 6: case 7: case 8: return launch_epl<T, 8, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    default: break;
  }
  if (a.experts <= 16) return launch_epl<T, 16, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 32) return launch_epl<T, 16, 2>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 64) return launch_epl<T, 16, 4>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 128) return launch_epl<T, 16, 8>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 256) return launch_epl<T, 16, 16>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 512) return launch_epl<T, 16, 32>(bwd, num_layers, logits, strides, outs, a, partial, s);
  return set_error(OPSLOT_ERR_UNSUPPORTED, "load_balancing: %d experts (at most 512)", a.experts);
}

int check_args(int num_layers, int64_t rows, int E, int top_k) {
  if (num_layers <= 0 || rows < 0 || E <= 0 || E > 512)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: bad sizes (layers %d, rows %lld, experts %d; "
                     "at most 512 experts)", num_layers, static_cast<long long>(rows), E);
  if (top_k < 0 || top_k > E)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: top_k %d with %d experts", top_k, E);
  return OPSLOT_OK;
}

int64_t scratch_rows(int num_layers, int64_t rows) {
  int64_t total = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    total += blocks_for(rows, n);
  }
  return total;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int64_t opslot_load_balancing_scratch_floats(int num_layers, int64_t rows, int num_experts) {
  if (check_args(num_layers, rows, num_experts, 0)) return -1;
  return scratch_rows(num_layers, rows) * 2 * num_experts;
}

OPSLOT_API int opslot_load_balancing_fwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts, int top_k,
                                         const float* mask, float* scratch, float* loss, float* coef, void* stream) {
  if (int rc = check_args(num_layers, rows, num_experts, top_k)) return rc;
  if (!logits || !row_strides || !scratch || !loss || !coef)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null argument");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  LbArgs a{};
  a.rows = rows;
  a.experts = num_experts;
  a.top_k = top_k;
  a.mask = mask;
  int rc = dispatch_dtype(dtype, "load_balancing", [&](auto t) -> int {
    return launch<decltype(t)>(false, num_layers, logits, row_strides, nullptr, a, scratch, s);
  });
  if (rc) return rc;
  lb_finalize_kernel<<<1, kFinalThreads, 0, s>>>(scratch, scratch_rows(num_layers, rows), num_experts, num_layers, rows,
                                                 mask, loss, coef);
  return check_launch("load_balancing finalize");
}

OPSLOT_API int opslot_load_balancing_bwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts,
                                         const float* mask, const float* coef, const float* grad_loss,
                                         void* const* grad_logits, void* stream) {
  if (int rc = check_args(num_layers, rows, num_experts, 0)) return rc;
  if (!logits || !row_strides || !coef || !grad_loss || !grad_logits)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null argument");
  if (rows == 0) return OPSLOT_OK;
  LbArgs a{};
  a.rows = rows;
  a.experts = num_experts;
  a.mask = mask;
  a.coef = coef;
  a.grad = grad_loss;
  return dispatch_dtype(dtype, "load_balancing", [&](auto t) -> int {
    return launch<decltype(t)>(true, num_layers, logits, row_strides, grad_logits, a, nullptr,
                               static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
