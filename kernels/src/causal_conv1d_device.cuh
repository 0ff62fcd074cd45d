// Depthwise causal conv1d's device helpers: the problem and geometry, the taps, each lane's
// cp.async ring and the forward / backward running states (the work layout: causal_conv1d.cu's
// header).
#pragma once

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/causal_conv1d.h"

namespace opslot {
namespace {

constexpr int kWarps = 4;  // warps per block (forward and backward)
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 8;     // rows per pipeline group
constexpr int kStages = 2;     // ring depth in groups: kStages-1 groups in flight while one is used
constexpr int kFwdBytes = 16;  // a lane's channel vector: 16 bytes forward,
constexpr int kBwdBytes = 8;   // 8 bytes backward (more live registers per channel)
constexpr int kWaves = 2;      // resident waves of blocks the grid aims at (at most)
constexpr int kMinSteps = 32;  // shortest run of time steps per warp (bounds the halo's share)
constexpr int kMaxWidth = 4;
constexpr int kSimpleThreads = 256;  // reduction, decode and relayout kernels
constexpr int kTile = 64;            // relayout tile: kTile channels x kTile steps
constexpr int kRelayoutBlocks = 8;   // resident relayout blocks per SM (2048 threads)

// ------------------------------------------------------------------------------------------------
// Device helpers

struct Strides {  // element strides of a [B, C, T] tensor
  int64_t b, c, t;
};

struct Problem {  // what every kernel of one call shares
  int64_t B, C, T;
  const void* weight;  // [C, W], fp32 or T
  const void* bias;    // [C] or null, fp32 or T
  const void* cu;      // cu_seqlens [nseg + 1] or null
  int64_t nseg;
  bool weight_f32, bias_f32, cu64, silu;
};

struct Geometry {  // block item = (channel group, batch, tile); a tile is kWarps runs of `steps`
  int64_t groups, tiles, steps;
};

__host__ __device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fp32: expf and an exact division; 16-bit types: ex2/rcp approximations, flushing subnormals
// (errors of a few 2^-22, far below one 16-bit rounding; no range fix-ups in the hot loop).
template <typename T>
__device__ __forceinline__ float sigmoid_t(float z) {
  if (sizeof(T) == 4) return 1.f / (1.f + expf(-z));
  const float e = ex2_ftz(z * -1.4426950408889634f);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return r;
}

template <typename T>
__device__ __forceinline__ float load_param(const void* p, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(p)[i] : to_float(static_cast<const T*>(p)[i]);
}

template <typename T>
__device__ __forceinline__ void store_param(void* p, bool f32, int64_t i, float v) {
  if (f32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<T*>(p)[i] = from_float<T>(v);
}

// A ring slot as one shared-memory access of the whole vector (not one per element).
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> ld_slot(const Vec<T, VEC>* p) {
  Vec<T, VEC> v;
  if constexpr (sizeof(v) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    memcpy(&v, &u, 16);
  } else if constexpr (sizeof(v) == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    memcpy(&v, &u, 8);
  } else if constexpr (sizeof(v) == 4) {
    const unsigned u = *reinterpret_cast<const unsigned*>(p);
    memcpy(&v, &u, 4);
  } else {
    v = *p;
  }
  return v;
}

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> zero_vec() {
  Vec<T, VEC> v;
#pragma unroll
  for (int j = 0; j < VEC; ++j) v.v[j] = from_float<T>(0.f);
  return v;
}

// Lag taps wl[k][j] = weight[c0 + j, W-1-k] (the tap on x[t-k]) and the bias, fp32; zero for
// channels past C.
template <typename T, int VEC, int W>
__device__ __forceinline__ void load_taps(const Problem& p, int64_t c0, int nvalid,
                                          float (&wl)[W][VEC], float (&bias)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const bool ok = j < nvalid;
    bias[j] = ok && p.bias ? load_param<T>(p.bias, p.bias_f32, c0 + j) : 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k)
      wl[k][j] = ok ? load_param<T>(p.weight, p.weight_f32, (c0 + j) * W + (W - 1 - k)) : 0.f;
  }
}

__device__ __forceinline__ int64_t cu_at(const Problem& p, int64_t i) {
  return p.cu64 ? static_cast<const int64_t*>(p.cu)[i] : static_cast<const int32_t*>(p.cu)[i];
}

// [start, end) of the sequence holding position t: the segment [cu[i], cu[i+1]) with the last i
// such that cu[i] <= t (so empty segments are skipped), or [0, T) without cu_seqlens. Clamped to
// start <= t < end <= T whatever cu_seqlens holds.
__device__ __forceinline__ void segment_of(const Problem& p, int64_t t, int64_t& start,
                                           int64_t& end) {
  start = 0;
  end = p.T;
  if (p.cu == nullptr) return;
  int64_t lo = 0, hi = p.nseg - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (cu_at(p, mid) <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  start = imin(imax(cu_at(p, lo), 0), t);
  end = imax(imin(cu_at(p, lo + 1), p.T), t + 1);
}

// Asynchronous global -> shared copy of 16 (L2 only), 8 or 4 bytes (sm_80+).
template <int kBytes>
__device__ __forceinline__ void cp_async_n(void* smem, const void* gmem) {
  if constexpr (kBytes == 16) {
    cp_async16(smem, gmem);
  } else {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(kBytes)
                 : "memory");
  }
}

// The VEC channels [c0, c0 + VEC) of one lane over time: element (t, j) at base + t*st + j*sc. A
// whole vector moves as one aligned access (the vector path has sc == 1 and aligned rows); the last
// partial vector (nvalid < VEC) and the scalar path (VEC == 1) go element by element, missing
// channels reading as 0.
template <typename T, int VEC, typename P>
struct Lane {
  P base;
  int64_t st, sc;
  int nvalid;

  __device__ __forceinline__ Vec<T, VEC> load(int64_t t) const {
    const T* p = base + t * st;
    if constexpr (VEC > 1) {
      if (nvalid == VEC) return *reinterpret_cast<const Vec<T, VEC>*>(p);
    }
    Vec<T, VEC> v;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v.v[j] = j < nvalid ? p[j * sc] : from_float<T>(0.f);
    return v;
  }
  // Row t into the shared-memory slot `dst`: cp.async for a whole vector, else loaded here.
  __device__ __forceinline__ void fetch(int64_t t, Vec<T, VEC>* dst) const {
    if constexpr (VEC > 1) {
      if (nvalid == VEC) {
        cp_async_n<sizeof(Vec<T, VEC>)>(dst, base + t * st);
        return;
      }
    }
    *dst = load(t);
  }
  __device__ __forceinline__ void store(int64_t t, const float (&f)[VEC]) const {  // P = T*
    T* p = base + t * st;
    Vec<T, VEC> v;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v.v[j] = from_float<T>(f[j]);
    if constexpr (VEC > 1) {
      if (nvalid == VEC) {
        *reinterpret_cast<Vec<T, VEC>*>(p) = v;
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (j < nvalid) p[j * sc] = v.v[j];
  }
};

template <typename T, int VEC>
using InLane = Lane<T, VEC, const T*>;

template <typename T, int VEC>
using OutLane = Lane<T, VEC, T*>;

template <typename T, int VEC, typename P>
__device__ __forceinline__ Lane<T, VEC, P> lane_of(P ptr, const Strides& s, int64_t b, int64_t c0,
                                                   int nvalid) {
  return Lane<T, VEC, P>{ptr + b * s.b + c0 * s.c, s.t, s.c, nvalid};
}

// Where this warp works: its channel vector c0 (nvalid of its VEC channels exist), batch b and
// run [t0, t1) (empty when t0 >= T or c0 >= C).
struct Work {
  int64_t b, c0, t0, t1;
  int nvalid;
};

template <int VEC>
__device__ __forceinline__ Work work_of(const Problem& p, const Geometry& g) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t item = blockIdx.x;
  const int64_t group = item % g.groups, rest = item / g.groups;
  Work w;
  w.b = rest / g.tiles;
  w.c0 = (group * 32 + lane) * VEC;
  w.t0 = ((rest % g.tiles) * kWarps + warp) * g.steps;
  w.t1 = imin(w.t0 + g.steps, p.T);
  w.nvalid = static_cast<int>(imax(imin(p.C - w.c0, VEC), 0));
  return w;
}

// pipelined(n, fetch, use) streams steps 0..n-1 through this thread's ring of kStages x kUnroll
// slots: fetch(i, slot) starts step i's copies into its slot, use(i, slot) runs once they have
// landed. While a group of kUnroll steps is used, the next kStages-1 groups are in flight. A slot
// is refilled only after this thread has used it (the ring is private to the thread: no barrier).
// Whole groups are used in straight-line code (the register windows of `use` rotate without
// moves); the last partial group in a loop.
template <typename Fetch>
__device__ __forceinline__ void fetch_group(int n, int i0, Fetch&& fetch) {
  const int base = (i0 / kUnroll) % kStages *
                   kUnroll;  // steps i0 .. i0 + kUnroll - 1: stage (i0 / kUnroll) % kStages
#pragma unroll
  for (int i = 0; i < kUnroll; ++i)
    if (i0 + i < n) fetch(i0 + i, base + i);
  cp_async_commit();  // possibly empty: keeps the group count uniform
}

// The first kStages-1 groups (issued early, other work can run while they land).
template <typename Fetch>
__device__ __forceinline__ void pipe_prologue(int n, Fetch&& fetch) {
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) fetch_group(n, s * kUnroll, fetch);
}

// The rest, after pipe_prologue(n, fetch).
template <typename Fetch, typename Use>
__device__ __forceinline__ void pipe_body(int n, Fetch&& fetch, Use&& use) {
  for (int i0 = 0; i0 < n; i0 += kUnroll) {
    fetch_group(n, i0 + (kStages - 1) * kUnroll, fetch);
    cp_async_wait<kStages - 1>();
    const int base = (i0 / kUnroll) % kStages * kUnroll;
    if (i0 + kUnroll <= n) {
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) use(i0 + i, base + i);
    } else {
#pragma unroll 1
      for (int i = 0; i0 + i < n; ++i) use(i0 + i, base + i);
    }
  }
}

template <typename Fetch, typename Use>
__device__ __forceinline__ void pipelined(int n, Fetch&& fetch, Use&& use) {
  pipe_prologue(n, fetch);
  pipe_body(n, fetch, use);
}

// The running state of one lane's forward walk (ascending time, position t): xw[k] = x[t-k]
// (fp32), zero before the start of t's sequence, so a step needs no masks.
template <typename T, int VEC, int W>
struct FwdState {
  float wl[W][VEC], bias[VEC];
  float xw[W][VEC];

  __device__ __forceinline__ void push(const Vec<T, VEC>& v) {  // t-1 -> t: the new x[t]
#pragma unroll
    for (int k = W - 1; k > 0; --k)
#pragma unroll
      for (int j = 0; j < VEC; ++j) xw[k][j] = xw[k - 1][j];
#pragma unroll
    for (int j = 0; j < VEC; ++j) xw[0][j] = to_float(v.v[j]);
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int j = 0; j < VEC; ++j) xw[k][j] = 0.f;
  }
  // o = pre (or silu(pre)) at t.
  __device__ __forceinline__ void step(bool silu, float (&o)[VEC]) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float z = bias[j];
#pragma unroll
      for (int k = 0; k < W; ++k) z = fmaf(wl[k][j], xw[k][j], z);
      o[j] = silu ? z * sigmoid_t<T>(z) : z;
    }
  }
};

// The running state of one lane's backward walk (descending time, position u):
//   xw[k] = x[u-k] (k < W, fp32; zero before the start of u's sequence), gw[m-1] = g[u+m] (m < W;
//   zero past its end), where g = d(loss)/d(pre) = grad * silu'(pre) (or grad without the
//   activation).
template <typename T, int VEC, int W>
struct BwdState {
  float wl[W][VEC], bias[VEC];
  float dw[W][VEC], db[VEC];  // this lane's weight (lag order) and bias gradient sums
  float gw[W - 1][VEC];
  float xw[W][VEC];

  __device__ __forceinline__ void set_x(int k, const Vec<T, VEC>& v) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) xw[k][j] = to_float(v.v[j]);
  }
  __device__ __forceinline__ void shift_x() {  // u -> u-1 (xw[W-1] is set next)
#pragma unroll
    for (int k = 0; k + 1 < W; ++k)
#pragma unroll
      for (int j = 0; j < VEC; ++j) xw[k][j] = xw[k + 1][j];
  }
  __device__ __forceinline__ void clear_future() {
#pragma unroll
    for (int m = 0; m + 1 < W; ++m)
#pragma unroll
      for (int j = 0; j < VEC; ++j) gw[m][j] = 0.f;
  }

  // Position u's g; with kEmit also dx[u] (into dx) and its terms of the weight/bias sums. Ends
  // with gw shifted to u-1.
  template <bool kEmit>
  __device__ __forceinline__ void step(bool silu, const Vec<T, VEC>& grad, float (&dx)[VEC]) {
    float g[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      g[j] = to_float(grad.v[j]);
      if (silu) {
        float z = bias[j];
#pragma unroll
        for (int k = 0; k < W; ++k) z = fmaf(wl[k][j], xw[k][j], z);
        const float s = sigmoid_t<T>(z);
        g[j] *= fmaf(z, fmaf(-s, s, s), s);  // silu'(z) = s + z s (1 - s)
      }
    }
    if (kEmit) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float d = wl[0][j] * g[j];
#pragma unroll
        for (int m = 1; m < W; ++m) d = fmaf(wl[m][j], gw[m - 1][j], d);
        dx[j] = d;
        db[j] += g[j];
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k][j] = fmaf(g[j], xw[k][j], dw[k][j]);
      }
    }
#pragma unroll
    for (int m = W - 2; m > 0; --m)
#pragma unroll
      for (int j = 0; j < VEC; ++j) gw[m][j] = gw[m - 1][j];
#pragma unroll
    for (int j = 0; j < VEC; ++j) gw[0][j] = g[j];
  }
};

}  // namespace
}  // namespace opslot
