// Internal helpers shared by the kernel sources (not part of the C ABI).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstring>

#include "opslot_kernels/common.h"

// OPSLOT_KERNELS_BENCH (CMake target opslot_kernels_bench, libopslot_kernels_bench.so): the same
// sources with the benchmark-only tuning knobs of opslot_kernels/bench.h. In the production library
// (opslot_kernels) every knob is a compile-time constant, its default, and the kernel versions that
// only a knob selects are not compiled: a knob-only branch sits under `if constexpr (kBench)`.
#ifdef OPSLOT_KERNELS_BENCH
#include "opslot_kernels/bench.h"
#endif

namespace opslot {

#ifdef OPSLOT_KERNELS_BENCH
constexpr bool kBench = true;
#else
constexpr bool kBench = false;
#endif

// Host-side memo of one value per CUDA device (a kernel's occupancy at the last geometry asked
// for), safe to share between threads: the key and its value are one 64-bit atomic,
// so a reader never pairs a key with another key's value; two threads that race compute the same
// value and store it twice. Devices past kMaxDevices are not memoised (the caller recomputes).
class DeviceMemo {
 public:
  static constexpr int kMaxDevices = 64;
  // The value stored for `key` on `device`, or -1 (none yet, or stored for another key).
  int get(int device, uint32_t key) const {
    if (device < 0 || device >= kMaxDevices) return -1;
    const uint64_t v = slot_[device].load(std::memory_order_acquire);
    if (v == 0 || static_cast<uint32_t>(v >> 32) != key) return -1;
    return static_cast<int>(static_cast<uint32_t>(v) - 1);
  }
  // Stores `value` (>= 0) for `key` on `device`, replacing what was stored.
  void put(int device, uint32_t key, int value) {
    if (device < 0 || device >= kMaxDevices || value < 0) return;
    slot_[device].store(static_cast<uint64_t>(key) << 32 | (static_cast<uint32_t>(value) + 1u),
                        std::memory_order_release);
  }

 private:
  std::atomic<uint64_t> slot_[kMaxDevices] = {};
};

// Records the message returned by opslot_last_error() for this thread; returns `code`.
int set_error(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// After a launch: the launch error, if any, as the entry point's return value.
int check_launch(const char* what);

// The SM count of the current device, asked once per device; 132 where the runtime cannot say.
int num_sms();

// Blocks of `kernel` an SM holds at `threads` threads and `smem` bytes of dynamic shared memory
// on `device`, at least 1, into *out: asked of the runtime once per `key` (the launch's shape) and
// kept in `memo` (one per kernel). A failed query is recorded for opslot_last_error() ("<what>:
// occupancy query failed: ...") and its code returned.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem, int device, DeviceMemo& memo,
                  uint32_t key, const char* what, int* out) {
  int n = memo.get(device, key);
  if (n < 0) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem);
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "%s: occupancy query failed: %s", what,
                       cudaGetErrorString(err));
    if (n < 1) n = 1;
    memo.put(device, key, n);
  }
  *out = n;
  return OPSLOT_OK;
}

// A pointer 16-byte aligned (a 16-byte load or cp.async from it applies).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A dimension's stride keeps its rows 16-byte aligned (elements of es bytes); a dimension of one
// element never moves, so its stride does not matter.
inline bool stride16_ok(int64_t stride, int64_t size, int es) {
  return size <= 1 || (stride * es) % 16 == 0;
}

// The current device is compute capability 9.0 (H100/H200), where the sm_90a code runs: the
// warpgroup-MMA kernels (wgmma_sm90.cuh) have bodies there only.
bool device_is_sm90();

// Storage type of each dtype code.
template <int D>
struct DtypeOf;
template <>
struct DtypeOf<OPSLOT_FLOAT32> {
  using type = float;
};
template <>
struct DtypeOf<OPSLOT_FLOAT16> {
  using type = __half;
};
template <>
struct DtypeOf<OPSLOT_BFLOAT16> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Vectorised access: N elements of T moved as one aligned load/store (16 bytes for bf16 x 8).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// VEC elements at p (aligned to the whole vector) to/from fp32 registers.
template <int VEC, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = to_float(v.v[j]);
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
  Vec<T, VEC> v;
#pragma unroll
  for (int j = 0; j < VEC; ++j) v.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// Streaming (evict-first) loads and stores of a 2/4/8/16-byte vector type.
template <typename V>
__device__ __forceinline__ V ld_stream(const V* p) {
  static_assert(sizeof(V) == 2 || sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16,
                "vector size");
  V v;
  if constexpr (sizeof(V) == 2) {
    const unsigned short x = __ldcs(reinterpret_cast<const unsigned short*>(p));
    memcpy(&v, &x, 2);
  } else if constexpr (sizeof(V) == 4) {
    const unsigned x = __ldcs(reinterpret_cast<const unsigned*>(p));
    memcpy(&v, &x, 4);
  } else if constexpr (sizeof(V) == 8) {
    const uint2 x = __ldcs(reinterpret_cast<const uint2*>(p));
    memcpy(&v, &x, 8);
  } else {
    const uint4 x = __ldcs(reinterpret_cast<const uint4*>(p));
    memcpy(&v, &x, 16);
  }
  return v;
}
template <typename V>
__device__ __forceinline__ void st_stream(V* p, const V& v) {
  if constexpr (sizeof(V) == 2) {
    unsigned short x;
    memcpy(&x, &v, 2);
    __stcs(reinterpret_cast<unsigned short*>(p), x);
  } else if constexpr (sizeof(V) == 4) {
    unsigned x;
    memcpy(&x, &v, 4);
    __stcs(reinterpret_cast<unsigned*>(p), x);
  } else if constexpr (sizeof(V) == 8) {
    uint2 x;
    memcpy(&x, &v, 8);
    __stcs(reinterpret_cast<uint2*>(p), x);
  } else {
    uint4 x;
    memcpy(&x, &v, 16);
    __stcs(reinterpret_cast<uint4*>(p), x);
  }
}

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): e^x = 2^(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2): log x = log2(x) ln 2

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// The sum of v over the 32 lanes of a full warp (every lane gets it; the same order on every lane).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 2^x as the bare MUFU.EX2 (ex2.approx.ftz, relative error ~2^-22): results below 2^-126 are 0.
// exp2f is the same instruction plus a range check and a rescale for those (subnormal) results.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Asynchronous 16-byte global -> shared copies (sm_80+): each thread's copies form groups, and
// cp_async_wait<N>() returns when at most N of this thread's groups are still in flight. A copy is
// visible to the thread that issued it after the wait; other threads need a barrier as well.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same, or 16 zero bytes where !live (src-size 0: gmem is not read, but stays a valid address);
// smem as a shared-window address (a block's base plus constant offsets folds into the copies).
__device__ __forceinline__ void cp16_or_zero(unsigned smem, const void* gmem, bool live) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(live ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp16_or_zero(void* smem, const void* gmem, bool live) {
  cp16_or_zero(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, live);
}
// The same for N = 4, 8 or 16 bytes, through L1 (cp.async.ca).
template <int N>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(N)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Calls f(T{}) with T the storage type of `dtype`; an unknown code is an error.
template <typename F>
int dispatch_dtype(int dtype, const char* what, F&& f) {
  switch (dtype) {
    case OPSLOT_FLOAT32:
      return f(float{});
    case OPSLOT_FLOAT16:
      return f(__half{});
    case OPSLOT_BFLOAT16:
      return f(__nv_bfloat16{});
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  }
}

}  // namespace opslot
