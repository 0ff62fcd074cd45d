// Cross-entropy over rows of logits (loss per row + gradient of the logits), and the in-place
// scaling of gradients computed in the forward. See opslot_kernels/cross_entropy.h.
//
// One thread block per row. Pass 1 reads the row once with 16-byte vector loads and keeps an
// online (max, sum of exp) pair per thread; a deterministic block reduction (fixed shuffle tree,
// then warp 0 over the per-warp partials) gives logsumexp. Pass 2 reads the row again (mostly from
// L2 for short rows, HBM for 150k-entry rows) and writes softmax * scale over it; the target's
// entry is fixed after a barrier (it needs the logit read before the row was overwritten).
// Only sm_80-level instructions: the same code serves sm_80 and sm_90a.
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "opslot_kernels/cross_entropy.h"

namespace opslot {
namespace {

constexpr int kMaxThreads = 512;

// 16 bytes of T.
template <typename T>
struct Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  alignas(16) T v[kN];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {  // p is 16-byte aligned
  Pack<T> out;
  *reinterpret_cast<uint4*>(out.v) = *reinterpret_cast<const uint4*>(p);
  return out;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& pk) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(pk.v);
}

// Elements of T before the first 16-byte-aligned address at or after p (at most n).
template <typename T>
__device__ __forceinline__ int64_t aligned_head(const T* p, int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const int64_t head = static_cast<int64_t>(((16u - (a & 15u)) & 15u) / sizeof(T));
  return head < n ? head : n;
}

// Online softmax statistics: (m, s) = (max, sum of exp(x - max)). Merging is symmetric in its two
// operands (fmaxf, and an IEEE sum of two products), so every lane of a xor-shuffle tree ends with
// bit-identical values. NaN logits make s NaN (fmaxf alone would drop them).
__device__ __forceinline__ void stats_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) {  // both empty (or all -inf): s stays 0, or NaN if either was NaN
    s = s + s2;
    return;
  }
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

// One element (the unaligned head and tail of a row).
__device__ __forceinline__ void stats_add(float& m, float& s, float x) {
  if (x != x) {  // NaN: fmaxf would ignore it
    s = x;
    return;
  }
  stats_merge(m, s, x, 1.f);
}

template <typename T>
__device__ __forceinline__ void stats_add_pack(float& m, float& s, const Pack<T>& p) {
  float f[Pack<T>::kN];
  float vmax = -INFINITY;
#pragma unroll
  for (int k = 0; k < Pack<T>::kN; ++k) {
    f[k] = to_float(p.v[k]);
    vmax = fmaxf(vmax, f[k]);
  }
  const float mn = fmaxf(m, vmax);
  if (mn == -INFINITY) {
    // all -inf so far; a NaN in the pack still has to poison s
#pragma unroll
    for (int k = 0; k < Pack<T>::kN; ++k) s += (f[k] != f[k]) ? f[k] : 0.f;
    return;
  }
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < Pack<T>::kN; ++k) acc += __expf(f[k] - mn);
  s = s * __expf(m - mn) + acc;
  m = mn;
}

// Block-wide merge; every thread returns the row's (m, s). Uses and re-synchronises `shm`.
__device__ __forceinline__ void block_stats(float& m, float& s, float* shm_m, float* shm_s) {
  const unsigned full = 0xffffffffu;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(full, m, o);
    const float s2 = __shfl_xor_sync(full, s, o);
    stats_merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    shm_m[warp] = m;
    shm_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? shm_m[lane] : -INFINITY;
    s = lane < nwarps ? shm_s[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(full, m, o);
      const float s2 = __shfl_xor_sync(full, s, o);
      stats_merge(m, s, m2, s2);
    }
    if (lane == 0) {
      shm_m[32] = m;
      shm_s[32] = s;
    }
  }
  __syncthreads();
  m = shm_m[32];
  s = shm_s[32];
}

template <typename T>
__device__ __forceinline__ Pack<T> grad_pack(const Pack<T>& in, float lse, float scale) {
  Pack<T> out;
#pragma unroll
  for (int k = 0; k < Pack<T>::kN; ++k)
    out.v[k] = from_float<T>(__expf(to_float(in.v[k]) - lse) * scale);
  return out;
}

template <typename T>
__device__ void zero_row(T* g, int64_t vocab) {
  constexpr int kN = Pack<T>::kN;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t head = aligned_head(g, vocab);
  const int64_t nvec = (vocab - head) / kN;
  const T zero = from_float<T>(0.f);
  for (int64_t i = tid; i < head; i += nt) g[i] = zero;
  Pack<T> z;
#pragma unroll
  for (int k = 0; k < kN; ++k) z.v[k] = zero;
  for (int64_t i = tid; i < nvec; i += nt) store_pack(g + head + i * kN, z);
  for (int64_t i = head + nvec * kN + tid; i < vocab; i += nt) g[i] = zero;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 2)
    ce_rows_kernel(const T* logits, int64_t ld_logits, T* grad, int64_t ld_grad, int64_t vocab,
                   const int64_t* __restrict__ targets, int64_t ignore_index,
                   const float* __restrict__ grad_scale, float* __restrict__ row_loss) {
  constexpr int kN = Pack<T>::kN;
  __shared__ float shm_m[33], shm_s[33];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const T* x = logits + row * ld_logits;
  T* g = grad != nullptr ? grad + row * ld_grad : nullptr;
  const int64_t t = targets[row];

  if (t == ignore_index) {
    if (tid == 0) row_loss[row] = 0.f;
    if (g != nullptr) zero_row(g, vocab);
    return;
  }
  const bool in_range = t >= 0 && t < vocab;
  // Read before the barrier in block_stats: after it, other threads may overwrite the row (in
  // place).
  const float xt = (tid == 0 && in_range) ? to_float(x[t]) : NAN;

  // Pass 1: statistics.
  float m = -INFINITY, s = 0.f;
  const int64_t head = aligned_head(x, vocab);
  const int64_t nvec = (vocab - head) / kN;
  const int64_t tail = head + nvec * kN;
  const T* xb = x + head;
  for (int64_t i = tid; i < head; i += nt) stats_add(m, s, to_float(x[i]));
  int64_t i = tid;
  for (; i + 3 * nt < nvec; i += 4 * nt) {
    const Pack<T> p0 = load_pack(xb + i * kN);
    const Pack<T> p1 = load_pack(xb + (i + nt) * kN);
    const Pack<T> p2 = load_pack(xb + (i + 2 * nt) * kN);
    const Pack<T> p3 = load_pack(xb + (i + 3 * nt) * kN);
    stats_add_pack(m, s, p0);
    stats_add_pack(m, s, p1);
    stats_add_pack(m, s, p2);
    stats_add_pack(m, s, p3);
  }
  for (; i < nvec; i += nt) stats_add_pack(m, s, load_pack(xb + i * kN));
  for (int64_t j = tail + tid; j < vocab; j += nt) stats_add(m, s, to_float(x[j]));
  block_stats(m, s, shm_m, shm_s);
  const float lse = m + logf(s);
  if (tid == 0) row_loss[row] = in_range ? lse - xt : NAN;
  if (g == nullptr) return;

  // Pass 2: gradient (softmax * scale), over the row itself when g == x.
  const float scale = in_range ? *grad_scale : NAN;
  if (aligned_head(g, vocab) == head) {
    T* gb = g + head;
    for (int64_t j = tid; j < head; j += nt)
      g[j] = from_float<T>(__expf(to_float(x[j]) - lse) * scale);
    i = tid;
    for (; i + 3 * nt < nvec; i += 4 * nt) {
      const Pack<T> p0 = load_pack(xb + i * kN);
      const Pack<T> p1 = load_pack(xb + (i + nt) * kN);
      const Pack<T> p2 = load_pack(xb + (i + 2 * nt) * kN);
      const Pack<T> p3 = load_pack(xb + (i + 3 * nt) * kN);
      store_pack(gb + i * kN, grad_pack(p0, lse, scale));
      store_pack(gb + (i + nt) * kN, grad_pack(p1, lse, scale));
      store_pack(gb + (i + 2 * nt) * kN, grad_pack(p2, lse, scale));
      store_pack(gb + (i + 3 * nt) * kN, grad_pack(p3, lse, scale));
    }
    for (; i < nvec; i += nt)
      store_pack(gb + i * kN, grad_pack(load_pack(xb + i * kN), lse, scale));
    for (int64_t j = tail + tid; j < vocab; j += nt)
      g[j] = from_float<T>(__expf(to_float(x[j]) - lse) * scale);
  } else {  // logits and gradient aligned differently (out of place only): scalar
    for (int64_t j = tid; j < vocab; j += nt)
      g[j] = from_float<T>(__expf(to_float(x[j]) - lse) * scale);
  }
  __syncthreads();  // the whole row is written; now the target's entry
  if (tid == 0 && in_range) g[t] = from_float<T>((__expf(xt - lse) - 1.f) * scale);
}

template <typename T>
__global__ void ce_scale_kernel(T* x, int64_t n, const float* __restrict__ factor) {
  constexpr int kN = Pack<T>::kN;
  const float f = *factor;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t gt = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t head = aligned_head(x, n);
  const int64_t nvec = (n - head) / kN;
  T* xb = x + head;
  for (int64_t i = gt; i < head; i += stride) x[i] = from_float<T>(to_float(x[i]) * f);
  for (int64_t i = gt; i < nvec; i += stride) {
    Pack<T> p = load_pack(xb + i * kN);
#pragma unroll
    for (int k = 0; k < kN; ++k) p.v[k] = from_float<T>(to_float(p.v[k]) * f);
    store_pack(xb + i * kN, p);
  }
  for (int64_t i = head + nvec * kN + gt; i < n; i += stride)
    x[i] = from_float<T>(to_float(x[i]) * f);
}

}  // namespace
}  // namespace opslot

extern "C" {

OPSLOT_API int opslot_ce_rows(const void* logits, int64_t ld_logits, void* grad, int64_t ld_grad,
                              int64_t rows, int64_t vocab, int dtype, const int64_t* targets,
                              int64_t ignore_index, const float* grad_scale, float* row_loss,
                              void* stream) {
  using namespace opslot;
  const char* what = "opslot_ce_rows";
  if (rows < 0 || rows > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: rows=%lld out of range", what,
                     (long long)rows);
  if (vocab < 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: vocab=%lld must be >= 1", what,
                     (long long)vocab);
  if (rows == 0) return OPSLOT_OK;
  if (logits == nullptr || targets == nullptr || row_loss == nullptr) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null logits/targets/row_loss pointer", what);
  }
  if (rows > 1 && ld_logits < vocab) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: ld_logits=%lld < vocab=%lld", what,
                     (long long)ld_logits, (long long)vocab);
  }
  if (grad != nullptr) {
    if (grad_scale == nullptr)
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: a gradient needs grad_scale", what);
    if (rows > 1 && ld_grad < vocab) {
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: ld_grad=%lld < vocab=%lld", what,
                       (long long)ld_grad, (long long)vocab);
    }
    if (grad == logits && ld_grad != ld_logits) {
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                       "%s: an in-place gradient needs ld_grad == ld_logits", what);
    }
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kN = Pack<T>::kN;
    const int64_t vecs = (vocab + kN - 1) / kN;
    int threads = static_cast<int>(((vecs < kMaxThreads ? vecs : kMaxThreads) + 31) / 32 * 32);
    if (threads < 32) threads = 32;
    ce_rows_kernel<T><<<static_cast<unsigned>(rows), threads, 0, s>>>(
        static_cast<const T*>(logits), ld_logits, static_cast<T*>(grad), ld_grad, vocab, targets,
        ignore_index, grad_scale, row_loss);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_ce_scale_inplace(void* x, int64_t n, int dtype, const float* factor,
                                       void* stream) {
  using namespace opslot;
  const char* what = "opslot_ce_scale_inplace";
  if (n < 0) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: n=%lld < 0", what, (long long)n);
  if (n == 0) return OPSLOT_OK;
  if (x == nullptr || factor == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    const int64_t work = n / Pack<T>::kN + 1;
    int64_t blocks = (work + kThreads - 1) / kThreads;
    if (blocks > 8192) blocks = 8192;
    ce_scale_kernel<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<T*>(x), n, factor);
    return check_launch(what);
  });
}

}  // extern "C"
