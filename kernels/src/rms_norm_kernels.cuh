// RMSNorm's row kernels, versions 1 and 2 (rms_norm.cu launches them; the layout and the
// order of the sums: rms_norm.cu's header, docs/kernels.md "rms_norm"): the arguments, the
// per-element math shared by every version, and the forward and backward of versions 1 and 2.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/rms_norm.h"

namespace opslot {
namespace {

constexpr int kMaxThreads = 512;

template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// The gate's sigmoid: exact division and expf in fp32; the fast intrinsics for 16-bit inputs
// (their error is far below a 16-bit rounding).
template <typename T>
__device__ __forceinline__ float fast_sigmoid(float z) {
  if (std::is_same<T, float>::value) return 1.f / (1.f + expf(-z));
  return __fdividef(1.f, 1.f + __expf(-z));
}

#ifndef OPSLOT_KERNELS_DIAGNOSTICS
#define OPSLOT_KERNELS_DIAGNOSTICS 0
#endif
#if OPSLOT_KERNELS_DIAGNOSTICS && !defined(OPSLOT_KERNELS_BENCH)
#error "OPSLOT_KERNELS_DIAGNOSTICS is for the bench library (opslot_kernels_bench) only"
#endif
// Whether this build has the wrong-result diagnostic (CMake OPSLOT_KERNELS_DIAGNOSTICS, off by
// default, bench library only): without it the branch on RmsArgs::diag is compiled out of the
// kernels.
constexpr bool kDiagnostics = OPSLOT_KERNELS_DIAGNOSTICS != 0;

struct RmsArgs {
  int mode;
  int diag;     // diagnostic builds only: 1 skips version 3's row sums (what the sums cost)
  int reverse;  // version 3's backward: rows from the last one (the default)
  int tpr;      // threads per row
  int64_t rows;
  int64_t cols;
  float eps;
  const void* x;
  int64_t xs;
  const void* gate;
  int64_t gs;
  const void* w;
  void* y;
  float* rstd;
  const float* rstd_in;
  const void* dy;
  int64_t dys;
  void* dx;
  void* dgate;
  float* dw_partial;
};

// Sum of v over the tpr threads of this thread's row group; every thread of the block calls it.
__device__ __forceinline__ float row_sum(float v, int tpr, float* smem) {
  if (tpr <= 32) {
    for (int o = tpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int wpr = tpr >> 5, first = (warp / wpr) * wpr;
  float s = 0.f;
  for (int i = 0; i < wpr; ++i) s += smem[first + i];
  __syncthreads();
  return s;
}

// Loads this thread's NV vectors of a row as raw storage (converted to fp32 only where used, which
// keeps registers low enough for more resident rows); zeros where there is nothing to load.
template <int VEC, int NV, typename T>
__device__ __forceinline__ void load_raw(Vec<T, VEC> (&dst)[NV], const T* rowp, bool valid, int t,
                                         int tpr, int nvec) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * tpr;
    if (valid && c < nvec) {
      dst[i] = *reinterpret_cast<const Vec<T, VEC>*>(rowp + static_cast<int64_t>(c) * VEC);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) dst[i].v[j] = from_float<T>(0.f);
    }
  }
}

// The modes without a weight.
__host__ __device__ constexpr bool unweighted_mode(int mode) {
  return mode == OPSLOT_RMS_UNWEIGHTED || mode == OPSLOT_RMS_UNWEIGHTED_CAST;
}

// The scale the forward multiplies x by: r, or (unweighted_cast) r rounded to x's dtype first.
template <typename Tx>
__device__ __forceinline__ float out_scale(int mode, float r) {
  return mode == OPSLOT_RMS_UNWEIGHTED_CAST ? round_to<Tx>(r) : r;
}

// dx of one element from dt (the gradient w.r.t. n = x r) and the row's mean(dt n): r (dt - n
// mean); unweighted_cast's direct term takes the rounded scale its forward multiplied by.
template <typename Tx>
__device__ __forceinline__ float rms_dx(int mode, float r, float dt, float n, float mean) {
  if (mode == OPSLOT_RMS_UNWEIGHTED_CAST) return round_to<Tx>(r) * dt - r * (n * mean);
  return r * (dt - n * mean);
}

// The forward's output for one element: n = x * rstd, w the weight, z the gate (gated norm only).
// FAST: the gate's sigmoid by fast_sigmoid (version 3), else exact division and expf (versions 1
// and 2).
template <typename Tx, typename Tw, bool FAST>
__device__ __forceinline__ float rms_out(int mode, bool gated, float n, float w, float z) {
  if (gated) {
    float m = w * round_to<Tx>(n);
    if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
    return FAST ? m * (z * fast_sigmoid<Tx>(z)) : m * (z / (1.f + expf(-z)));
  }
  if (mode == OPSLOT_RMS_STANDARD) return w * round_to<Tx>(n);
  if (mode == OPSLOT_RMS_OFFSET) return n * (1.f + w);
  return n;  // unweighted
}

// The gradient w.r.t. the normalised value n (dt), for one element; also the weight-gradient term
// (dwt) and, for the gated norm, the gate's gradient (dg).
template <typename Tx, typename Tw, bool GATED>
__device__ __forceinline__ float rms_dt(int mode, float n, float d, float w, float z, float& dwt,
                                        float& dg) {
  if (!GATED) {
    (void)z;
    (void)dg;
  }
  if (GATED) {
    const float tn = round_to<Tx>(n);
    float m = w * tn;
    if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
    const float s = 1.f / (1.f + expf(-z));
    const float dm = d * (z * s);
    dg = d * m * s * (1.f + z * (1.f - s));
    dwt = dm * tn;
    return dm * w;
  }
  if (mode == OPSLOT_RMS_STANDARD) {
    dwt = d * round_to<Tx>(n);
    return d * w;
  }
  if (mode == OPSLOT_RMS_OFFSET) {
    dwt = d * n;
    return d * (1.f + w);
  }
  dwt = 0.f;  // unweighted
  return d;
}

// Version 1 (the default for the gated norm; opslot_rms_norm_set_tuning variant 1 for all):
// fp32 register arrays, one row in flight per row group.
template <typename Tx, typename Tw, typename To, int VEC, int NV>
__global__ void __launch_bounds__(kMaxThreads) rms_fwd_kernel_v1(RmsArgs a) {
  __shared__ float smem[32];
  const int tpr = a.tpr, rpb = blockDim.x / tpr;
  const int t = threadIdx.x % tpr, sub = threadIdx.x / tpr;
  const int nvec = static_cast<int>(a.cols / VEC);
  const float fcols = static_cast<float>(a.cols);
  const Tw* w = static_cast<const Tw*>(a.w);
  // The weight is the same for every row: loaded once, kept in registers (off the per-row latency
  // chain).
  float wreg[NV][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * tpr;
    if (!unweighted_mode(a.mode) && c < nvec) {
      load_vec<VEC>(w + static_cast<int64_t>(c) * VEC, wreg[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wreg[i][j] = 0.f;
    }
  }
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rpb; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * rpb) {
    const int64_t row = base + sub;
    const bool valid = row < a.rows;
    const Tx* xr = static_cast<const Tx*>(a.x) + (valid ? row : 0) * a.xs;
    float xv[NV][VEC];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * tpr;
      if (valid && c < nvec) {
        load_vec<VEC>(xr + static_cast<int64_t>(c) * VEC, xv[i]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) ss += xv[i][j] * xv[i][j];
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) xv[i][j] = 0.f;
      }
    }
    ss = row_sum(ss, tpr, smem);
    const float r = rsqrtf(ss / fcols + a.eps);
    if (!valid) continue;
    if (t == 0) a.rstd[row] = r;
    const float rs = out_scale<Tx>(a.mode, r);
    To* yr = static_cast<To*>(a.y) + row * a.cols;
    const Tx* gr = static_cast<const Tx*>(a.gate) + row * a.gs;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * tpr;
      if (c >= nvec) continue;
      const int64_t off = static_cast<int64_t>(c) * VEC;
      float gv[VEC], out[VEC];
      const float(&wv)[VEC] = wreg[i];
      if (a.mode == OPSLOT_RMS_GATED) load_vec<VEC>(gr + off, gv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        out[j] = rms_out<Tx, Tw, false>(a.mode, a.mode == OPSLOT_RMS_GATED, xv[i][j] * rs, wv[j],
                                        a.mode == OPSLOT_RMS_GATED ? gv[j] : 0.f);
      }
      store_vec<VEC>(yr + off, out);
    }
  }
}

template <typename Tx, typename Tw, typename To, int VEC, int NV>
__global__ void __launch_bounds__(kMaxThreads) rms_bwd_kernel_v1(RmsArgs a) {
  __shared__ float smem[32];
  const int tpr = a.tpr, rpb = blockDim.x / tpr;
  const int t = threadIdx.x % tpr, sub = threadIdx.x / tpr;
  const int nvec = static_cast<int>(a.cols / VEC);
  const float fcols = static_cast<float>(a.cols);
  const Tw* w = static_cast<const Tw*>(a.w);
  float dwacc[NV][VEC], wreg[NV][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * tpr;
    if (!unweighted_mode(a.mode) && c < nvec) {
      load_vec<VEC>(w + static_cast<int64_t>(c) * VEC, wreg[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wreg[i][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) dwacc[i][j] = 0.f;
  }

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rpb; base < a.rows;
       base += static_cast<int64_t>(gridDim.x) * rpb) {
    const int64_t row = base + sub;
    const bool valid = row < a.rows;
    const int64_t vrow = valid ? row : 0;
    const Tx* xr = static_cast<const Tx*>(a.x) + vrow * a.xs;
    const To* dyr = static_cast<const To*>(a.dy) + vrow * a.dys;
    const Tx* gr = static_cast<const Tx*>(a.gate) + vrow * a.gs;
    Tx* dgr = static_cast<Tx*>(a.dgate) + vrow * a.cols;
    const float r = valid ? a.rstd_in[row] : 0.f;
    float nv[NV][VEC], dt[NV][VEC];
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * tpr;
      if (valid && c < nvec) {
        const int64_t off = static_cast<int64_t>(c) * VEC;
        float d[VEC], gv[VEC], dg[VEC];
        const float(&wv)[VEC] = wreg[i];
        load_vec<VEC>(xr + off, nv[i]);
        load_vec<VEC>(dyr + off, d);
        if (a.mode == OPSLOT_RMS_GATED) load_vec<VEC>(gr + off, gv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float n = nv[i][j] * r;
          nv[i][j] = n;
          float g;
          if (a.mode == OPSLOT_RMS_STANDARD) {
            g = d[j] * wv[j];
            dwacc[i][j] += d[j] * round_to<Tx>(n);
          } else if (a.mode == OPSLOT_RMS_OFFSET) {
            g = d[j] * (1.f + wv[j]);
            dwacc[i][j] += d[j] * n;
          } else if (unweighted_mode(a.mode)) {
            g = d[j];
          } else {
            const float tn = round_to<Tx>(n);
            float m = wv[j] * tn;
            if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
            const float z = gv[j];
            const float s = 1.f / (1.f + expf(-z));
            const float dm = d[j] * (z * s);
            dg[j] = d[j] * m * s * (1.f + z * (1.f - s));
            g = dm * wv[j];
            dwacc[i][j] += dm * tn;
          }
          dt[i][j] = g;
          dot += g * n;
        }
        if (a.mode == OPSLOT_RMS_GATED) store_vec<VEC>(dgr + off, dg);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) nv[i][j] = dt[i][j] = 0.f;
      }
    }
    dot = row_sum(dot, tpr, smem);
    if (!valid) continue;
    const float mean = dot / fcols;
    Tx* dxr = static_cast<Tx*>(a.dx) + row * a.cols;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * tpr;
      if (c >= nvec) continue;
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = rms_dx<Tx>(a.mode, r, dt[i][j], nv[i][j], mean);
      store_vec<VEC>(dxr + static_cast<int64_t>(c) * VEC, out);
    }
  }
  if (unweighted_mode(a.mode)) return;
  float* pr = a.dw_partial + (static_cast<int64_t>(blockIdx.x) * rpb + sub) * a.cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * tpr;
    if (c < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) pr[static_cast<int64_t>(c) * VEC + j] = dwacc[i][j];
    }
  }
}

// Version 2 (the default for the plain norms): raw storage and the next row prefetched while the
// current one is reduced and written; GATED is a template parameter (the other modes share one
// instantiation).
template <typename Tx, typename Tw, typename To, int VEC, int NV, bool GATED>
__global__ void __launch_bounds__(kMaxThreads) rms_fwd_kernel(RmsArgs a) {
  __shared__ float smem[32];
  const int tpr = a.tpr, rpb = blockDim.x / tpr;
  const int t = threadIdx.x % tpr, sub = threadIdx.x / tpr;
  const int nvec = static_cast<int>(a.cols / VEC);
  const float fcols = static_cast<float>(a.cols);
  const Tx* X = static_cast<const Tx*>(a.x);
  // The weight is the same for every row: loaded once, kept in registers.
  Vec<Tw, VEC> wreg[NV];
  load_raw<VEC, NV>(wreg, static_cast<const Tw*>(a.w), !unweighted_mode(a.mode), t, tpr, nvec);
  const int64_t step = static_cast<int64_t>(gridDim.x) * rpb;
  int64_t base = static_cast<int64_t>(blockIdx.x) * rpb;
  Vec<Tx, VEC> cur[NV];
  {
    const int64_t row = base + sub;
    load_raw<VEC, NV>(cur, X + (row < a.rows ? row : 0) * a.xs, row < a.rows, t, tpr, nvec);
  }
  for (; base < a.rows; base += step) {
    const int64_t row = base + sub;
    const bool valid = row < a.rows;
    // Prefetch this thread's part of its next row while this one is reduced and written.
    Vec<Tx, VEC> nxt[NV];
    const int64_t nrow = row + step;
    load_raw<VEC, NV>(nxt, X + (nrow < a.rows ? nrow : 0) * a.xs, nrow < a.rows, t, tpr, nvec);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float v = to_float(cur[i].v[j]);
        ss += v * v;
      }
    ss = row_sum(ss, tpr, smem);
    const float r = rsqrtf(ss / fcols + a.eps);
    if (valid) {
      if (t == 0) a.rstd[row] = r;
      const float rs = out_scale<Tx>(a.mode, r);
      To* yr = static_cast<To*>(a.y) + row * a.cols;
      const Tx* gr = static_cast<const Tx*>(a.gate) + row * a.gs;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * tpr;
        if (c >= nvec) continue;
        const int64_t off = static_cast<int64_t>(c) * VEC;
        float gv[VEC], out[VEC];
        if (GATED) load_vec<VEC>(gr + off, gv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out[j] = rms_out<Tx, Tw, false>(a.mode, GATED, to_float(cur[i].v[j]) * rs,
                                          to_float(wreg[i].v[j]), GATED ? gv[j] : 0.f);
        }
        store_vec<VEC>(yr + off, out);
      }
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) cur[i] = nxt[i];
  }
}

template <typename Tx, typename Tw, typename To, int VEC, int NV, bool GATED>
__global__ void __launch_bounds__(kMaxThreads) rms_bwd_kernel(RmsArgs a) {
  __shared__ float smem[32];
  const int tpr = a.tpr, rpb = blockDim.x / tpr;
  const int t = threadIdx.x % tpr, sub = threadIdx.x / tpr;
  const int nvec = static_cast<int>(a.cols / VEC);
  const float fcols = static_cast<float>(a.cols);
  constexpr bool gated = GATED;
  const Tx* X = static_cast<const Tx*>(a.x);
  const To* DY = static_cast<const To*>(a.dy);
  const Tx* G = static_cast<const Tx*>(a.gate);
  Vec<Tw, VEC> wreg[NV];
  load_raw<VEC, NV>(wreg, static_cast<const Tw*>(a.w), !unweighted_mode(a.mode), t, tpr, nvec);
  float dwacc[NV][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) dwacc[i][j] = 0.f;

  const int64_t step = static_cast<int64_t>(gridDim.x) * rpb;
  int64_t base = static_cast<int64_t>(blockIdx.x) * rpb;
  Vec<Tx, VEC> cx[NV], cg[NV];
  Vec<To, VEC> cd[NV];
  {
    const int64_t row = base + sub;
    const bool v = row < a.rows;
    const int64_t vr = v ? row : 0;
    load_raw<VEC, NV>(cx, X + vr * a.xs, v, t, tpr, nvec);
    load_raw<VEC, NV>(cd, DY + vr * a.dys, v, t, tpr, nvec);
    load_raw<VEC, NV>(cg, G + vr * a.gs, v && gated, t, tpr, nvec);
  }
  for (; base < a.rows; base += step) {
    const int64_t row = base + sub;
    const bool valid = row < a.rows;
    const float r = valid ? a.rstd_in[row] : 0.f;
    // Prefetch the next row (x, dy, gate) while this one is reduced and written.
    Vec<Tx, VEC> nx[NV], ng[NV];
    Vec<To, VEC> nd[NV];
    {
      const int64_t nrow = row + step;
      const bool v = nrow < a.rows;
      const int64_t vr = v ? nrow : 0;
      load_raw<VEC, NV>(nx, X + vr * a.xs, v, t, tpr, nvec);
      load_raw<VEC, NV>(nd, DY + vr * a.dys, v, t, tpr, nvec);
      load_raw<VEC, NV>(ng, G + vr * a.gs, v && gated, t, tpr, nvec);
    }
    float dot = 0.f;
    Tx* dgr = static_cast<Tx*>(a.dgate) + (valid ? row : 0) * a.cols;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * tpr;
      float dg[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float n = to_float(cx[i].v[j]) * r;
        float dwt = 0.f;
        dg[j] = 0.f;
        const float g =
            rms_dt<Tx, Tw, GATED>(a.mode, n, to_float(cd[i].v[j]), to_float(wreg[i].v[j]),
                                  to_float(cg[i].v[j]), dwt, dg[j]);
        dwacc[i][j] += dwt;  // zero for rows past the end (their loads were zeros)
        dot += g * n;
      }
      if (gated && valid && c < nvec) store_vec<VEC>(dgr + static_cast<int64_t>(c) * VEC, dg);
    }
    dot = row_sum(dot, tpr, smem);
    if (valid) {
      const float mean = dot / fcols;
      Tx* dxr = static_cast<Tx*>(a.dx) + row * a.cols;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * tpr;
        if (c >= nvec) continue;
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float n = to_float(cx[i].v[j]) * r;
          float dwt, dg;
          const float g =
              rms_dt<Tx, Tw, GATED>(a.mode, n, to_float(cd[i].v[j]), to_float(wreg[i].v[j]),
                                    to_float(cg[i].v[j]), dwt, dg);
          out[j] = rms_dx<Tx>(a.mode, r, g, n, mean);
        }
        store_vec<VEC>(dxr + static_cast<int64_t>(c) * VEC, out);
      }
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      cx[i] = nx[i];
      cd[i] = nd[i];
      cg[i] = ng[i];
    }
  }
  if (unweighted_mode(a.mode)) return;
  float* pr = a.dw_partial + (static_cast<int64_t>(blockIdx.x) * rpb + sub) * a.cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * tpr;
    if (c < nvec) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) pr[static_cast<int64_t>(c) * VEC + j] = dwacc[i][j];
    }
  }
}

}  // namespace
}  // namespace opslot
