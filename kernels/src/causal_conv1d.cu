// Depthwise causal conv1d: forward, backward (+ the fixed-order weight-gradient reduction) and the
// decode update. See kernels/include/opslot_kernels/causal_conv1d.h and docs/kernels.md
// ("causal_conv1d").
//
// Work layout (forward and backward): a block is 4 warps; a warp's 32 lanes hold 32 consecutive
// channel vectors (VEC channels each) of one time step, and the warp walks its own run of time
// steps keeping the previous W-1 inputs (forward) or the next W-1 pre-activation gradients
// (backward) in registers, so each element is loaded once (plus a W-1 row halo per run). Each lane
// streams its rows through a private ring of shared memory filled by cp.async, kStages-1 groups of
// kUnroll rows ahead of the arithmetic, so in-flight loads hold no registers. Block items are
// (channel group, batch, time tile of 4 runs), sized so that the grid is about kWaves resident
// waves of equal blocks.
//
// The relayout kernel copies a gradient into x's layout (a tiled transpose) for the backward's
// vector path.
//
// Sections: device helpers; kernels; launchers; extern "C" entry points.
#include <atomic>
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
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.4426950408889634f));
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

// ------------------------------------------------------------------------------------------------
// Kernels. Forward and backward: 1-D grid of block items (group fastest, then tile, then batch).

// Forward over one run [t0, t1), cut at sequence starts into pieces; in a piece the rows from
// W-1 before it (not before its sequence's start) to its end stream through the ring, the first
// W-1 only filling the window.
template <typename T, int VEC, int W>
__global__ void __launch_bounds__(kThreads, 4)
    conv_fwd_kernel(Problem p, Geometry geo, const T* __restrict__ x, Strides xs,
                    T* __restrict__ out, Strides os) {
  using V = Vec<T, VEC>;
  __shared__ V ring[kStages * kUnroll][kThreads];
  const Work w = work_of<VEC>(p, geo);
  if (w.nvalid == 0 || w.t0 >= p.T) return;  // no barrier below: idle lanes may leave
  const InLane<T, VEC> xr = lane_of<T, VEC>(x, xs, w.b, w.c0, w.nvalid);
  const OutLane<T, VEC> orow = lane_of<T, VEC>(out, os, w.b, w.c0, w.nvalid);
  FwdState<T, VEC, W> st;
  load_taps<T, VEC, W>(p, w.c0, w.nvalid, st.wl, st.bias);
  V* mine = &ring[0][threadIdx.x];
  for (int64_t a = w.t0; a < w.t1;) {
    int64_t start, end;
    segment_of(p, a, start, end);
    const int64_t b = imin(end, w.t1), ta = imax(a - (W - 1), start);
    st.clear();
    pipelined(
        static_cast<int>(b - ta),
        [&](int i, int slot) { xr.fetch(ta + i, mine + slot * kThreads); },
        [&](int i, int slot) {
          st.push(ld_slot(mine + slot * kThreads));
          if (ta + i >= a) {
            float o[VEC];
            st.step(p.silu, o);
            orow.store(ta + i, o);
          }
        });
    a = b;
  }
}

// The backward window before the step at u (which shifts it): xw[k+1] = x[u-k], k < W-1, zero
// before the sequence start.
template <typename T, int VEC, int W>
__device__ __forceinline__ void reload_window(BwdState<T, VEC, W>& st, const InLane<T, VEC>& xr,
                                              int64_t u, int64_t start) {
#pragma unroll
  for (int k = 0; k + 1 < W; ++k)
    st.set_x(k + 1, u - k >= start ? xr.load(u - k) : zero_vec<T, VEC>());
}

// The gradient halo above a run ending at t1: positions hi .. t1 (at most W-1, in t1-1's sequence)
// give g only; their rows are loaded together.
template <typename T, int VEC, int W>
__device__ __forceinline__ void bwd_halo(BwdState<T, VEC, W>& st, const InLane<T, VEC>& xr,
                                         const InLane<T, VEC>& gr, int64_t hi, int64_t t1,
                                         int64_t start, bool silu) {
  Vec<T, VEC> hx[W - 1], hg[W - 1];
#pragma unroll
  for (int h = 0; h + 1 < W; ++h) {
    const int64_t u = hi - h;
    if (u >= t1) {
      hx[h] = u - (W - 1) >= start ? xr.load(u - (W - 1)) : zero_vec<T, VEC>();
      hg[h] = gr.load(u);
    }
  }
  reload_window(st, xr, hi, start);
  st.clear_future();
#pragma unroll
  for (int h = 0; h + 1 < W; ++h) {
    if (hi - h >= t1) {
      float unused[VEC];
      st.shift_x();
      st.set_x(W - 1, hx[h]);
      st.template step<false>(silu, hg[h], unused);
    }
  }
}

// One warp's backward over [t0, t1), descending, cut at sequence starts into pieces [a, top]. Per
// piece the positions whose taps all lie in the sequence (u-(W-1) >= start) stream through the
// rings, step i bringing grad[u] and x[u-(W-1)] for u = top-i; the first W-1 positions of a
// sequence (masked taps) are loaded directly. The gradient halo runs while the first piece's first
// ring group is in flight.
template <typename T, int VEC, int W>
__device__ __forceinline__ void bwd_run(const Problem& p, const Work& w, const InLane<T, VEC>& xr,
                                        const InLane<T, VEC>& gr, const OutLane<T, VEC>& dxr,
                                        Vec<T, VEC>* xring, Vec<T, VEC>* gring, bool silu,
                                        BwdState<T, VEC, W>& st) {
  int64_t start, end, top = w.t1 - 1;
  segment_of(p, top, start, end);
  auto fetch = [&](int i, int slot) {
    xr.fetch(top - i - (W - 1), xring + slot * kThreads);
    gr.fetch(top - i, gring + slot * kThreads);
  };
  auto use = [&](int i, int slot) {
    st.shift_x();
    st.set_x(W - 1, ld_slot(xring + slot * kThreads));
    float dx[VEC];
    st.template step<true>(silu, ld_slot(gring + slot * kThreads), dx);
    dxr.store(top - i, dx);
  };
  int64_t a = imax(start, w.t0),
          body = imax(a, start + W - 1);  // this piece: [a, top], streamed [body, top]
  pipe_prologue(static_cast<int>(imax(top - body + 1, 0)), fetch);
  bwd_halo(st, xr, gr, imin(w.t1 + W - 2, end - 1), w.t1, start, silu);
  for (bool first = true;; first = false) {
    const int n = static_cast<int>(imax(top - body + 1, 0));
    reload_window(st, xr, top, start);
    if (!first) pipe_prologue(n, fetch);
    pipe_body(n, fetch, use);
#pragma unroll 1
    for (int64_t u = imin(top, body - 1); u >= a; --u) {
      st.shift_x();
      st.set_x(W - 1, u - (W - 1) >= start ? xr.load(u - (W - 1)) : zero_vec<T, VEC>());
      float dx[VEC];
      st.template step<true>(silu, gr.load(u), dx);
      dxr.store(u, dx);
    }
    top = a - 1;
    if (top < w.t0) break;
    segment_of(p, top, start, end);  // into the previous sequence: nothing after its end flows back
    st.clear_future();
    a = imax(start, w.t0);
    body = imax(a, start + W - 1);
  }
}

// Backward: dx, and per block item one fp32 partial row [W + 1][C] (lag-ordered weight sums, then
// the bias sum) over the item's 32*VEC channels, its warps added in order.
template <typename T, int VEC, int W>
__global__ void __launch_bounds__(kThreads, 4)
    conv_bwd_kernel(Problem p, Geometry geo, const T* __restrict__ x, Strides xs,
                    const T* __restrict__ grad, Strides gs, T* __restrict__ dx, Strides ds,
                    float* __restrict__ partial) {
  using V = Vec<T, VEC>;
  __shared__ V xring[kStages * kUnroll][kThreads];
  __shared__ V gring[kStages * kUnroll][kThreads];
  __shared__ float red[kWarps][W + 1][32 * VEC];
  const Work w = work_of<VEC>(p, geo);
  BwdState<T, VEC, W> st;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    st.db[j] = 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k) st.dw[k][j] = 0.f;
  }
  if (w.nvalid > 0 && w.t0 < p.T) {
    load_taps<T, VEC, W>(p, w.c0, w.nvalid, st.wl, st.bias);
    bwd_run<T, VEC, W>(p, w, lane_of<T, VEC>(x, xs, w.b, w.c0, w.nvalid),
                       lane_of<T, VEC>(grad, gs, w.b, w.c0, w.nvalid),
                       lane_of<T, VEC>(dx, ds, w.b, w.c0, w.nvalid), &xring[0][threadIdx.x],
                       &gring[0][threadIdx.x], p.silu, st);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
#pragma unroll
    for (int k = 0; k < W; ++k) red[warp][k][lane * VEC + j] = st.dw[k][j];
    red[warp][W][lane * VEC + j] = st.db[j];
  }
  __syncthreads();
  const int64_t item = blockIdx.x, cb = (item % geo.groups) * 32 * VEC,
                row = item / geo.groups;  // b * tiles + tile
  for (int i = threadIdx.x; i < (W + 1) * 32 * VEC; i += kThreads) {
    const int k = i / (32 * VEC), c = i % (32 * VEC);
    if (cb + c < p.C) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) s += red[v][k][c];
      partial[(row * (W + 1) + k) * p.C + cb + c] = s;
    }
  }
}

// dweight[c, W-1-k] = sum over partial rows r of partial[r][k][c] (k < W), dbias[c] = ...
// [r][W][c]: each output by one thread, rows in order.
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    conv_dw_reduce_kernel(Problem p, int W, const float* __restrict__ partial, int64_t rows,
                          void* dweight, void* dbias) {
  const int64_t n = (W + 1) * p.C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kSimpleThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kSimpleThreads) {
    float s = 0.f;
#pragma unroll 4
    for (int64_t r = 0; r < rows; ++r) s += partial[r * n + i];
    const int64_t k = i / p.C, c = i % p.C;
    if (k < W)
      store_param<T>(dweight, p.weight_f32, c * W + (W - 1 - k), s);
    else if (dbias)
      store_param<T>(dbias, p.bias_f32, c, s);
  }
}

// Decode: one thread per (batch, channel); positions before x come from conv_state [.., S]; then
// the state takes the last S columns of cat(state, x), in ascending order (in place: the value
// read, state[j + T], lies right of the one written).
template <typename T>
__global__ void __launch_bounds__(kSimpleThreads)
    conv_update_kernel(Problem p, int W, const T* __restrict__ x, Strides xs, T* __restrict__ state,
                       int64_t S, Strides ss, T* __restrict__ out, Strides os) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kSimpleThreads + threadIdx.x;
  if (idx >= p.B * p.C) return;
  const int64_t b = idx / p.C, c = idx % p.C;
  const T* xr = x + b * xs.b + c * xs.c;
  T* sr = state + b * ss.b + c * ss.c;
  T* orow = out + b * os.b + c * os.c;
  float wl[kMaxWidth];
#pragma unroll
  for (int k = 0; k < kMaxWidth; ++k)
    wl[k] = k < W ? load_param<T>(p.weight, p.weight_f32, c * W + (W - 1 - k)) : 0.f;
  const float bias = p.bias ? load_param<T>(p.bias, p.bias_f32, c) : 0.f;
  for (int64_t t = 0; t < p.T; ++t) {
    float z = bias;
#pragma unroll
    for (int k = 0; k < kMaxWidth; ++k) {
      if (k < W) {
        const int64_t q = t - k;
        z = fmaf(wl[k], to_float(q >= 0 ? xr[q * xs.t] : sr[(S + q) * ss.t]), z);
      }
    }
    if (p.silu) z *= sigmoid_t<T>(z);
    orow[t * os.t] = from_float<T>(z);
  }
  for (int64_t j = 0; j < S; ++j) {
    const int64_t q = p.T + j;
    sr[j * ss.t] = q < S ? sr[q * ss.t] : xr[(q - S) * xs.t];
  }
}

// Relayout (the backward's gradient into dx's layout): dst[b, c, t] = src[b, c, t], any strides,
// as raw bits E (2 or 4 bytes). A block moves one kTile x kTile tile (channels x steps) through
// shared memory; each side is read or written with consecutive lanes along the dimension its
// `time_fast` names, so a transposing copy is coalesced on both sides (a plain strided copy is
// not).
template <typename E>
struct RelayoutSide {
  E* base;
  Strides s;
  bool time_fast;
};

constexpr int kTileRows = kSimpleThreads / kTile;            // tile rows per pass
constexpr int kTilePasses = kTile * kTile / kSimpleThreads;  // passes per tile

// One thread's part of a pass over one side of the tile at (b, c0, t0): in pass r it moves the
// element at g + r * gstep (global) and o + r * ostep (tile, [channel][step] of pitch kPitch), if
// `on` and slow0 + r * kTileRows < nslow (the tile's extent along the side's slow dimension).
template <typename E>
struct TileWalk {
  E* g;
  int64_t gstep;
  int o, ostep, slow0, nslow;
  bool on;
};

template <int kPitch, typename E>
__device__ __forceinline__ TileWalk<E> tile_walk(const RelayoutSide<E>& side, int64_t b, int64_t c0,
                                                 int64_t t0, int64_t C, int64_t T) {
  const int fast = threadIdx.x % kTile, slow0 = threadIdx.x / kTile;
  const bool tf = side.time_fast;
  const int64_t fstride = tf ? side.s.t : side.s.c, sstride = tf ? side.s.c : side.s.t;
  const int nc = static_cast<int>(imin(C - c0, kTile)), nt = static_cast<int>(imin(T - t0, kTile));
  TileWalk<E> w;
  w.g = side.base + b * side.s.b + c0 * side.s.c + t0 * side.s.t + fast * fstride + slow0 * sstride;
  w.gstep = kTileRows * sstride;
  w.o = tf ? slow0 * kPitch + fast : fast * kPitch + slow0;
  w.ostep = tf ? kTileRows * kPitch : kTileRows;
  w.slow0 = slow0;
  w.nslow = tf ? nc : nt;
  w.on = fast < (tf ? nt : nc);
  return w;
}

template <typename E>
__global__ void __launch_bounds__(kSimpleThreads, kRelayoutBlocks)
    conv_relayout_kernel(int64_t C, int64_t T, int64_t ctiles, int64_t ttiles,
                         RelayoutSide<const E> src, RelayoutSide<E> dst) {
  constexpr int kPitch =
      kTile + 4 / sizeof(E);          // an odd number of words: channel-wise access conflict-free
  __shared__ E tile[kTile * kPitch];  // [channel][step]
  const int64_t item = blockIdx.x, b = item / ctiles / ttiles;
  const int64_t c0 = item % ctiles * kTile, t0 = item / ctiles % ttiles * kTile;
  const TileWalk<const E> in = tile_walk<kPitch>(src, b, c0, t0, C, T);
  E v[kTilePasses];  // all loads in flight at once; positions past the edge hold 0, never stored
#pragma unroll
  for (int r = 0; r < kTilePasses; ++r)
    v[r] = in.on && in.slow0 + r * kTileRows < in.nslow ? in.g[r * in.gstep] : E{0};
#pragma unroll
  for (int r = 0; r < kTilePasses; ++r) tile[in.o + r * in.ostep] = v[r];
  __syncthreads();
  const TileWalk<E> out = tile_walk<kPitch>(dst, b, c0, t0, C, T);
#pragma unroll
  for (int r = 0; r < kTilePasses; ++r) v[r] = tile[out.o + r * out.ostep];
#pragma unroll
  for (int r = 0; r < kTilePasses; ++r)
    if (out.on && out.slow0 + r * kTileRows < out.nslow) out.g[r * out.gstep] = v[r];
}

// ------------------------------------------------------------------------------------------------
// Launchers

int num_sms() {
  static std::atomic<int> cached[64];
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 132;
  if (dev < 64 && (n = cached[dev].load(std::memory_order_relaxed)) > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    n = 132;
  if (dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Resident blocks of `kernel` per SM (queried once per kernel; at least 1).
template <typename K>
int blocks_per_sm(K kernel, std::atomic<int>& cached) {
  int n = cached.load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess ||
      n <= 0) {
    cudaGetLastError();  // a failed query only costs the geometry's balance
    n = 1;
  }
  cached.store(n, std::memory_order_relaxed);
  return n;
}

template <typename T, int W>
int fwd_blocks_per_sm() {
  static std::atomic<int> cached{0};
  return blocks_per_sm(conv_fwd_kernel<T, kFwdBytes / sizeof(T), W>, cached);
}

template <typename T, int W>
int bwd_blocks_per_sm() {
  static std::atomic<int> cached{0};
  return blocks_per_sm(conv_bwd_kernel<T, kBwdBytes / sizeof(T), W>, cached);
}

// Tiles and run length: at most kWaves full waves of the vector path's blocks (rounded down: a
// partial extra wave of equal blocks would cost a whole block's time), runs of at least kMinSteps.
// `vec` (the path taken) only sets the channel groups, so the backward's partial rows (B * tiles)
// do not depend on the path.
Geometry geometry_for(const Problem& p, int vector_vec, int vec, int blocks_per_sm) {
  const int64_t pairs = imax(cdiv(p.C, 32 * vector_vec) * p.B, 1);
  const int64_t capacity = static_cast<int64_t>(num_sms()) * blocks_per_sm;
  int64_t tiles = imin(imax(kWaves * capacity / pairs, 1), imax(cdiv(p.T, kWarps * kMinSteps), 1));
  const int64_t steps = imax(cdiv(p.T, tiles * kWarps), 1);
  tiles = imax(cdiv(p.T, kWarps * steps), 1);
  return Geometry{cdiv(p.C, 32 * vec), tiles, steps};
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Strides of a [B, C, T] tensor with those of its size-1 dimensions neutralised (never stepped).
Strides strides_of(const int64_t* s, int64_t B, int64_t C, int64_t T) {
  return Strides{B > 1 ? s[0] : 0, C > 1 ? s[1] : 1, T > 1 ? s[2] : 0};
}

// The vector path: channel stride 1 and every (batch, time) row start aligned to the vector.
template <typename T, int VEC>
bool vector_ok(const void* ptr, const Strides& s) {
  return s.c == 1 && aligned(ptr, VEC * sizeof(T)) && s.t % VEC == 0 && s.b % VEC == 0;
}

int check_grid(const char* what, const Geometry& g, int64_t B) {
  if (g.groups * g.tiles * B > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: input too large", what);
  return OPSLOT_OK;
}

template <typename T, int W>
int launch_fwd(const Problem& p, const T* x, Strides xs, T* out, Strides os, cudaStream_t s) {
  constexpr int kVec = kFwdBytes / sizeof(T);
  const bool vec = vector_ok<T, kVec>(x, xs) && vector_ok<T, kVec>(out, os);
  const Geometry g = geometry_for(p, kVec, vec ? kVec : 1, fwd_blocks_per_sm<T, W>());
  if (int rc = check_grid("causal_conv1d forward", g, p.B)) return rc;
  const unsigned grid = static_cast<unsigned>(g.groups * g.tiles * p.B);
  if (vec)
    conv_fwd_kernel<T, kVec, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, out, os);
  else
    conv_fwd_kernel<T, 1, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, out, os);
  return check_launch("causal_conv1d forward");
}

template <typename T, int W>
Geometry bwd_geometry(const Problem& p, int vec) {
  return geometry_for(p, kBwdBytes / sizeof(T), vec, bwd_blocks_per_sm<T, W>());
}

int64_t partial_rows(const Problem& p, const Geometry& g) {
  return p.B * p.T > 0 ? p.B * g.tiles : 0;
}

template <typename T>
int launch_reduce(const Problem& p, int W, const float* partial, int64_t rows, void* dweight,
                  void* dbias, cudaStream_t s) {
  const int64_t blocks = imin(imax(cdiv((W + 1) * p.C, kSimpleThreads), 1), 4096);
  conv_dw_reduce_kernel<T><<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(
      p, W, partial, rows, dweight, dbias);
  return check_launch("causal_conv1d weight-gradient reduction");
}

template <typename T, int W>
int launch_bwd(const Problem& p, const T* x, Strides xs, const T* grad, Strides gs, T* dx,
               Strides ds, void* dweight, void* dbias, float* scratch, cudaStream_t s) {
  constexpr int kVec = kBwdBytes / sizeof(T);
  const bool vec =
      vector_ok<T, kVec>(x, xs) && vector_ok<T, kVec>(grad, gs) && vector_ok<T, kVec>(dx, ds);
  const Geometry g = bwd_geometry<T, W>(p, vec ? kVec : 1);
  const int64_t rows = partial_rows(p, g);
  if (rows > 0) {
    if (int rc = check_grid("causal_conv1d backward", g, p.B)) return rc;
    const unsigned grid = static_cast<unsigned>(g.groups * g.tiles * p.B);
    if (vec)
      conv_bwd_kernel<T, kVec, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, grad, gs, dx, ds, scratch);
    else
      conv_bwd_kernel<T, 1, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, grad, gs, dx, ds, scratch);
    if (int rc = check_launch("causal_conv1d backward")) return rc;
  }
  return launch_reduce<T>(p, W, scratch, rows, dweight, dbias, s);
}

template <typename T>
int launch_update(const Problem& p, int W, const T* x, Strides xs, T* state, int64_t S, Strides ss,
                  T* out, Strides os, cudaStream_t s) {
  const int64_t blocks = cdiv(p.B * p.C, kSimpleThreads);
  if (blocks > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "causal_conv1d update: too many channels");
  conv_update_kernel<T>
      <<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(p, W, x, xs, state, S, ss, out, os);
  return check_launch("causal_conv1d update");
}

// Lanes along time on a side whose time stride is the smaller (a degenerate dimension never leads).
bool lanes_along_time(const Strides& s, int64_t C, int64_t T) {
  return C == 1 || (T > 1 && s.t < s.c);
}

template <typename E>
int launch_relayout(int64_t B, int64_t C, int64_t T, const void* src, Strides ss, void* dst,
                    Strides ds, cudaStream_t s) {
  const int64_t ctiles = cdiv(C, kTile), ttiles = cdiv(T, kTile), blocks = B * ctiles * ttiles;
  if (blocks > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "causal_conv1d relayout: input too large");
  const RelayoutSide<const E> in{static_cast<const E*>(src), ss, lanes_along_time(ss, C, T)};
  const RelayoutSide<E> out{static_cast<E*>(dst), ds, lanes_along_time(ds, C, T)};
  conv_relayout_kernel<E>
      <<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(C, T, ctiles, ttiles, in, out);
  return check_launch("causal_conv1d relayout");
}

template <typename F>
auto dispatch_width(int width, F&& f) {
  switch (width) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

bool valid_dtype(int d) {
  return d == OPSLOT_FLOAT32 || d == OPSLOT_FLOAT16 || d == OPSLOT_BFLOAT16;
}

// Checks what every entry point shares and fills `p`; OPSLOT_OK or an error code (message set).
int make_problem(const char* what, int dtype, int64_t B, int64_t C, int64_t T, int width,
                 int weight_dtype, const void* weight, int bias_dtype, const void* bias,
                 const void* cu, int cu64, int64_t nseg, int silu, Problem& p) {
  if (B < 0 || C < 0 || T < 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative size", what);
  if (width < 2 || width > kMaxWidth)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kernel width %d (2 to %d supported)", what,
                     width, kMaxWidth);
  if (!valid_dtype(dtype))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  if ((weight_dtype != dtype && weight_dtype != OPSLOT_FLOAT32) ||
      (bias_dtype != dtype && bias_dtype != OPSLOT_FLOAT32))
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT,
        "%s: weight/bias dtype codes %d/%d with input dtype %d (float32 or the input's dtype)",
        what, weight_dtype, bias_dtype, dtype);
  if (T > INT32_MAX - 64)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: sequence of %lld steps", what,
                     static_cast<long long>(T));
  if (C > 0 && !weight) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null weight", what);
  if (cu && (B != 1 || nseg < 1 || (cu64 != 0 && cu64 != 1)))
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT,
        "%s: cu_seqlens needs batch 1 and at least one segment (batch %lld, %lld segments)", what,
        static_cast<long long>(B), static_cast<long long>(nseg));
  p = Problem{B,
              C,
              T,
              weight,
              bias,
              cu,
              nseg,
              weight_dtype == OPSLOT_FLOAT32,
              bias_dtype == OPSLOT_FLOAT32,
              cu64 == 1,
              silu != 0};
  return OPSLOT_OK;
}

template <typename T>
int64_t bwd_scratch_floats_t(const Problem& p, int width) {
  return dispatch_width(width, [&](auto w) -> int64_t {
    constexpr int kW = decltype(w)::value;
    return partial_rows(p, bwd_geometry<T, kW>(p, 1)) * (kW + 1) * p.C;
  });
}

// Floats of partial rows the backward writes (dtype already checked).
int64_t bwd_scratch_floats(int dtype, const Problem& p, int width) {
  if (dtype == OPSLOT_FLOAT32) return bwd_scratch_floats_t<float>(p, width);
  if (dtype == OPSLOT_FLOAT16) return bwd_scratch_floats_t<__half>(p, width);
  return bwd_scratch_floats_t<__nv_bfloat16>(p, width);
}

}  // namespace
}  // namespace opslot

using namespace opslot;

// ------------------------------------------------------------------------------------------------
// Entry points

extern "C" {

OPSLOT_API int opslot_causal_conv1d_fwd(int dtype, int64_t batch, int64_t channels, int64_t seqlen,
                                        int width, const void* x, const int64_t* x_strides,
                                        int weight_dtype, const void* weight, int bias_dtype,
                                        const void* bias, const void* cu_seqlens,
                                        int cu_seqlens_int64, int64_t num_segments, int silu,
                                        void* out, const int64_t* out_strides, void* stream) {
  const char* what = "causal_conv1d forward";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, cu_seqlens, cu_seqlens_int64, num_segments, silu, p))
    return rc;
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!x || !out || !x_strides || !out_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides xs = strides_of(x_strides, batch, channels, seqlen),
                os = strides_of(out_strides, batch, channels, seqlen);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return dispatch_width(width, [&](auto w) -> int {
      return launch_fwd<T, decltype(w)::value>(p, static_cast<const T*>(x), xs,
                                               static_cast<T*>(out), os,
                                               static_cast<cudaStream_t>(stream));
    });
  });
}

OPSLOT_API int64_t opslot_causal_conv1d_bwd_scratch_floats(int dtype, int64_t batch,
                                                           int64_t channels, int64_t seqlen,
                                                           int width) {
  if (!valid_dtype(dtype) || batch < 0 || channels < 0 || seqlen < 0 || width < 2 ||
      width > kMaxWidth) {
    set_error(OPSLOT_ERR_INVALID_ARGUMENT,
              "causal_conv1d backward scratch: dtype %d, shape [%lld, %lld, %lld], width %d", dtype,
              static_cast<long long>(batch), static_cast<long long>(channels),
              static_cast<long long>(seqlen), width);
    return -1;
  }
  const Problem p{batch, channels, seqlen, nullptr, nullptr, nullptr,
                  0,     false,    false,  false,   false};
  return bwd_scratch_floats(dtype, p, width);
}

OPSLOT_API int opslot_causal_conv1d_bwd(
    int dtype, int64_t batch, int64_t channels, int64_t seqlen, int width, const void* x,
    const int64_t* x_strides, const void* grad, const int64_t* grad_strides, int weight_dtype,
    const void* weight, int bias_dtype, const void* bias, const void* cu_seqlens,
    int cu_seqlens_int64, int64_t num_segments, int silu, void* dx, const int64_t* dx_strides,
    void* dweight, void* dbias, float* scratch, int64_t scratch_floats, void* stream) {
  const char* what = "causal_conv1d backward";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, cu_seqlens, cu_seqlens_int64, num_segments, silu, p))
    return rc;
  if (channels == 0) return OPSLOT_OK;
  const bool empty = batch * seqlen == 0;
  if (!dweight || (!empty && (!x || !grad || !dx || !x_strides || !grad_strides || !dx_strides)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const int64_t need = bwd_scratch_floats(dtype, p, width);
  if (need > 0 && (!scratch || scratch_floats < need))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: scratch of %lld floats, %lld needed", what,
                     static_cast<long long>(scratch_floats), static_cast<long long>(need));
  const Strides none{0, 1, 0};
  const Strides xs = empty ? none : strides_of(x_strides, batch, channels, seqlen);
  const Strides gs = empty ? none : strides_of(grad_strides, batch, channels, seqlen);
  const Strides ds = empty ? none : strides_of(dx_strides, batch, channels, seqlen);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return dispatch_width(width, [&](auto w) -> int {
      return launch_bwd<T, decltype(w)::value>(
          p, static_cast<const T*>(x), xs, static_cast<const T*>(grad), gs, static_cast<T*>(dx), ds,
          dweight, dbias, scratch, static_cast<cudaStream_t>(stream));
    });
  });
}

OPSLOT_API int opslot_causal_conv1d_relayout(int dtype, int64_t batch, int64_t channels,
                                             int64_t seqlen, const void* src,
                                             const int64_t* src_strides, void* dst,
                                             const int64_t* dst_strides, void* stream) {
  const char* what = "causal_conv1d relayout";
  if (!valid_dtype(dtype))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  if (batch < 0 || channels < 0 || seqlen < 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative size", what);
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!src || !dst || !src_strides || !dst_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides ss = strides_of(src_strides, batch, channels, seqlen),
                ds = strides_of(dst_strides, batch, channels, seqlen);
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == OPSLOT_FLOAT32)
    return launch_relayout<uint32_t>(batch, channels, seqlen, src, ss, dst, ds, s);
  return launch_relayout<uint16_t>(batch, channels, seqlen, src, ss, dst, ds, s);
}

OPSLOT_API int opslot_causal_conv1d_update(int dtype, int64_t batch, int64_t channels,
                                           int64_t seqlen, int width, const void* x,
                                           const int64_t* x_strides, void* conv_state,
                                           int64_t state_len, const int64_t* state_strides,
                                           int weight_dtype, const void* weight, int bias_dtype,
                                           const void* bias, int silu, void* out,
                                           const int64_t* out_strides, void* stream) {
  const char* what = "causal_conv1d update";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, nullptr, 0, 0, silu, p))
    return rc;
  if (state_len < width - 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: conv_state of %lld columns for kernel width %d (needs >= %d)", what,
                     static_cast<long long>(state_len), width, width - 1);
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!x || !conv_state || !out || !x_strides || !state_strides || !out_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides xs = strides_of(x_strides, batch, channels, seqlen),
                os = strides_of(out_strides, batch, channels, seqlen);
  const Strides ss = strides_of(state_strides, batch, channels, state_len);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return launch_update<T>(p, width, static_cast<const T*>(x), xs, static_cast<T*>(conv_state),
                            state_len, ss, static_cast<T*>(out), os,
                            static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
