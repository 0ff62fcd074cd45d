// silu(gate) * up and its backward: elementwise, 16-byte vectors, UNROLL vectors per thread with
// all loads issued before any arithmetic; a scalar tail for n not a multiple of the vector. The
// clamped variant (DeepSeek-V4: silu(min(gate, L)) * clamp(up, -L, L)) is the same kernels with
// kClamp: the unclamped instantiations are unchanged. See kernels/include/opslot_kernels/swiglu.h
// and docs/kernels.md ("swiglu_mlp").
#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/swiglu.h"

namespace opslot {
namespace {

constexpr int kThreads = 256;
// Tuning knobs (opslot_silu_mul_set_tuning, opslot_kernels/bench.h): vectors per thread and
// tensor, and the backward in index order (default: from the end). Mutable in the bench library
// only; the production library has the defaults as constants and only the one-vector kernels.
#ifdef OPSLOT_KERNELS_BENCH
int g_unroll = 1;
int g_bwd_from_start = 0;
#else
constexpr int g_unroll = 1;
constexpr int g_bwd_from_start = 0;
#endif

// fp32: expf and an exact division; 16-bit types: the fast intrinsics (their error is far below
// one 16-bit rounding, and the exact forms cost issue slots this bandwidth-bound kernel needs).
template <typename T>
__device__ __forceinline__ float sigmoid_t(float z) {
  if (sizeof(T) == 4) return 1.f / (1.f + expf(-z));
  return __fdividef(1.f, 1.f + __expf(-z));
}

// torch.clamp's rounding of its scalar bound: the limit in the tensor's dtype (as `max.to<T>()`).
template <typename T>
__device__ __forceinline__ float limit_in(float limit) {
  return to_float(from_float<T>(limit));
}

// torch.clamp: NaN passes through (a comparison with NaN is false), else min/max with the bounds.
__device__ __forceinline__ float clamp_max(float x, float hi) { return x > hi ? hi : x; }
__device__ __forceinline__ float clamp_both(float x, float lo, float hi) {
  return x > hi ? hi : (x < lo ? lo : x);
}

// out = silu(g) * u; clamped: silu(clamp(g, max=L)) * clamp(u, -L, L).
template <typename T, bool kClamp>
__device__ __forceinline__ float silu_mul_value(float z, float u, float lim) {
  if constexpr (kClamp) {
    z = clamp_max(z, lim);
    u = clamp_both(u, -lim, lim);
  }
  return z * sigmoid_t<T>(z) * u;
}

// (d gate, d up) of silu_mul_value; clamped: zero where the clamp's input was outside its bounds
// (torch's clamp backward passes the gradient where min <= x <= max, bounds included; NaN: zero).
template <typename T, bool kClamp>
__device__ __forceinline__ void silu_mul_grads(float z, float uu, float gg, float lim, float& dg,
                                               float& du) {
  if constexpr (kClamp) {
    const bool pass_g = z <= lim, pass_u = uu >= -lim && uu <= lim;
    z = clamp_max(z, lim);
    uu = clamp_both(uu, -lim, lim);
    const float s = sigmoid_t<T>(z);
    du = pass_u ? gg * z * s : 0.f;
    dg = pass_g ? gg * uu * s * (1.f + z * (1.f - s)) : 0.f;
  } else {
    const float s = sigmoid_t<T>(z);
    du = gg * z * s;
    dg = gg * uu * s * (1.f + z * (1.f - s));
  }
}

template <typename T, int VEC, int kUnroll, bool kClamp>
__global__ void __launch_bounds__(kThreads)
    silu_mul_fwd_kernel(int64_t nvec, int64_t n, const T* __restrict__ gate,
                        const T* __restrict__ up, T* __restrict__ out, float limit) {
  using V = Vec<T, VEC>;
  const float lim = kClamp ? limit_in<T>(limit) : 0.f;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  V g[kUnroll], u[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < nvec) {
      g[k] = reinterpret_cast<const V*>(gate)[i];
      u[k] = reinterpret_cast<const V*>(up)[i];
    }
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < nvec) {
      V o;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        o.v[j] =
            from_float<T>(silu_mul_value<T, kClamp>(to_float(g[k].v[j]), to_float(u[k].v[j]), lim));
      reinterpret_cast<V*>(out)[i] = o;
    }
  }
  if (blockIdx.x == 0) {  // the elements after the last whole vector
    for (int64_t i = nvec * VEC + threadIdx.x; i < n; i += kThreads)
      out[i] = from_float<T>(silu_mul_value<T, kClamp>(to_float(gate[i]), to_float(up[i]), lim));
  }
}

template <typename T, int VEC, int kUnroll, bool kClamp>
__global__ void __launch_bounds__(kThreads)
    silu_mul_bwd_kernel(int64_t nvec, int64_t n, const T* __restrict__ gate,
                        const T* __restrict__ up, const T* __restrict__ grad, T* __restrict__ dgate,
                        T* __restrict__ dup, bool from_start, float limit) {
  using V = Vec<T, VEC>;
  const float lim = kClamp ? limit_in<T>(limit) : 0.f;
  // From the end unless told otherwise (blocks start in index order): what the producer of grad
  // wrote last, and what the forward read last, is the most likely to be still in L2.
  const int64_t blk = from_start ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int64_t base = blk * kThreads * kUnroll + threadIdx.x;
  V g[kUnroll], u[kUnroll], d[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < nvec) {
      g[k] = reinterpret_cast<const V*>(gate)[i];
      u[k] = reinterpret_cast<const V*>(up)[i];
      d[k] = reinterpret_cast<const V*>(grad)[i];
    }
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < nvec) {
      V dg, du;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float a, b;
        silu_mul_grads<T, kClamp>(to_float(g[k].v[j]), to_float(u[k].v[j]), to_float(d[k].v[j]),
                                  lim, a, b);
        dg.v[j] = from_float<T>(a);
        du.v[j] = from_float<T>(b);
      }
      reinterpret_cast<V*>(dgate)[i] = dg;
      reinterpret_cast<V*>(dup)[i] = du;
    }
  }
  if (blockIdx.x == 0) {
    for (int64_t i = nvec * VEC + threadIdx.x; i < n; i += kThreads) {
      float a, b;
      silu_mul_grads<T, kClamp>(to_float(gate[i]), to_float(up[i]), to_float(grad[i]), lim, a, b);
      dgate[i] = from_float<T>(a);
      dup[i] = from_float<T>(b);
    }
  }
}

template <typename T, bool kClamp>
int run(bool bwd, int64_t n, const void* gate, const void* up, const void* grad, void* a, void* b,
        float limit, cudaStream_t s) {
  if (n < 0) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "silu_mul: negative size");
  if (n == 0) return OPSLOT_OK;
  if (!gate || !up || !a || (bwd && (!grad || !b)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "silu_mul: null tensor");
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = aligned16(gate) && aligned16(up) && aligned16(a) &&
                   (!bwd || (aligned16(grad) && aligned16(b)));
  const int v = vec ? kVec : 1;
  const int64_t nvec = n / v;
  const T* g = static_cast<const T*>(gate);
  const T* u = static_cast<const T*>(up);
  const T* d = static_cast<const T*>(grad);
  T* o1 = static_cast<T*>(a);
  T* o2 = static_cast<T*>(b);
  auto go = [&](auto unroll_tag) -> int {
    constexpr int U = decltype(unroll_tag)::value;
    int64_t blocks = (nvec + kThreads * U - 1) / (kThreads * U);
    if (blocks < 1) blocks = 1;
    if (blocks > INT32_MAX) return set_error(OPSLOT_ERR_UNSUPPORTED, "silu_mul: too many elements");
    const unsigned grid = static_cast<unsigned>(blocks);
    if (bwd) {
      if (vec)
        silu_mul_bwd_kernel<T, kVec, U, kClamp>
            <<<grid, kThreads, 0, s>>>(nvec, n, g, u, d, o1, o2, g_bwd_from_start != 0, limit);
      else
        silu_mul_bwd_kernel<T, 1, U, kClamp>
            <<<grid, kThreads, 0, s>>>(nvec, n, g, u, d, o1, o2, g_bwd_from_start != 0, limit);
      return check_launch("silu_mul backward");
    }
    if (vec)
      silu_mul_fwd_kernel<T, kVec, U, kClamp><<<grid, kThreads, 0, s>>>(nvec, n, g, u, o1, limit);
    else
      silu_mul_fwd_kernel<T, 1, U, kClamp><<<grid, kThreads, 0, s>>>(nvec, n, g, u, o1, limit);
    return check_launch("silu_mul forward");
  };
  if constexpr (kBench) {  // two and four vectors per thread: bench library only
    if (g_unroll == 2) return go(std::integral_constant<int, 2>{});
    if (g_unroll == 4) return go(std::integral_constant<int, 4>{});
  }
  return go(std::integral_constant<int, 1>{});
}

// The clamped entry points' limit: a negative or NaN bound is refused (torch's clamp(-L, L) with
// L < 0 would give -L everywhere, with zero gradients: not a SwiGLU limit).
int check_limit(float limit) {
  if (!(limit >= 0.f))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "silu_mul_clamped: limit must be a number >= 0, got %g",
                     static_cast<double>(limit));
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int opslot_silu_mul_fwd(int dtype, int64_t n, const void* gate, const void* up,
                                   void* out, void* stream) {
  return dispatch_dtype(dtype, "silu_mul", [&](auto t) -> int {
    return run<decltype(t), false>(false, n, gate, up, nullptr, out, nullptr, 0.f,
                                   static_cast<cudaStream_t>(stream));
  });
}

OPSLOT_API int opslot_silu_mul_bwd(int dtype, int64_t n, const void* gate, const void* up,
                                   const void* grad, void* dgate, void* dup, void* stream) {
  return dispatch_dtype(dtype, "silu_mul", [&](auto t) -> int {
    return run<decltype(t), false>(true, n, gate, up, grad, dgate, dup, 0.f,
                                   static_cast<cudaStream_t>(stream));
  });
}

OPSLOT_API int opslot_silu_mul_clamped_fwd(int dtype, int64_t n, const void* gate, const void* up,
                                           float limit, void* out, void* stream) {
  if (int rc = check_limit(limit)) return rc;
  return dispatch_dtype(dtype, "silu_mul_clamped", [&](auto t) -> int {
    return run<decltype(t), true>(false, n, gate, up, nullptr, out, nullptr, limit,
                                  static_cast<cudaStream_t>(stream));
  });
}

OPSLOT_API int opslot_silu_mul_clamped_bwd(int dtype, int64_t n, const void* gate, const void* up,
                                           const void* grad, float limit, void* dgate, void* dup,
                                           void* stream) {
  if (int rc = check_limit(limit)) return rc;
  return dispatch_dtype(dtype, "silu_mul_clamped", [&](auto t) -> int {
    return run<decltype(t), true>(true, n, gate, up, grad, dgate, dup, limit,
                                  static_cast<cudaStream_t>(stream));
  });
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_silu_mul_set_tuning(int vectors_per_thread, int backward_from_start) {
  if ((vectors_per_thread != 1 && vectors_per_thread != 2 && vectors_per_thread != 4) ||
      backward_from_start < 0 || backward_from_start > 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "silu_mul tuning: vectors_per_thread 1, 2 or 4; backward_from_start 0 or 1");
  g_unroll = vectors_per_thread;
  g_bwd_from_start = backward_from_start;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
