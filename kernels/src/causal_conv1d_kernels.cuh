// Depthwise causal conv1d's kernels: forward, backward, the weight-gradient reduction, the decode
// update and the relayout (causal_conv1d.cu launches them).
#pragma once

#include "causal_conv1d_device.cuh"

namespace opslot {
namespace {

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

}  // namespace
}  // namespace opslot
