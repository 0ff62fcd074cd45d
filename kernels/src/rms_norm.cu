// RMSNorm (standard / offset / unweighted) and gated RMSNorm: forward, backward, and the
// fixed-order weight-gradient reduction. See kernels/include/opslot_kernels/rms_norm.h and
// docs/kernels.md ("rms_norm").
//
// Layout: a row is handled by `tpr` threads (a power of two, chosen from the width only), each
// holding NV vectors of VEC elements in registers, so x is read once per pass. The row sums are a
// butterfly over those threads (plus shared memory across warps for tpr > 32), whose order depends
// only on the width: a row's result is the same whatever the batch. The backward accumulates each
// thread's weight-gradient columns over the rows of its row group in registers and writes one fp32
// partial row per row group; rms_dw_reduce then adds the partial rows in a fixed order.
#include <atomic>
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
    if (a.mode != OPSLOT_RMS_UNWEIGHTED && c < nvec) {
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
        const float n = xv[i][j] * r;
        float o;
        if (a.mode == OPSLOT_RMS_STANDARD) {
          o = wv[j] * round_to<Tx>(n);
        } else if (a.mode == OPSLOT_RMS_OFFSET) {
          o = n * (1.f + wv[j]);
        } else if (a.mode == OPSLOT_RMS_UNWEIGHTED) {
          o = n;
        } else {
          float m = wv[j] * round_to<Tx>(n);
          if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
          const float z = gv[j];
          o = m * (z / (1.f + expf(-z)));
        }
        out[j] = o;
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
    if (a.mode != OPSLOT_RMS_UNWEIGHTED && c < nvec) {
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
          } else if (a.mode == OPSLOT_RMS_UNWEIGHTED) {
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
      for (int j = 0; j < VEC; ++j) out[j] = r * (dt[i][j] - nv[i][j] * mean);
      store_vec<VEC>(dxr + static_cast<int64_t>(c) * VEC, out);
    }
  }
  if (a.mode == OPSLOT_RMS_UNWEIGHTED) return;
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
  load_raw<VEC, NV>(wreg, static_cast<const Tw*>(a.w), a.mode != OPSLOT_RMS_UNWEIGHTED, t, tpr,
                    nvec);
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
          const float n = to_float(cur[i].v[j]) * r;
          const float w = to_float(wreg[i].v[j]);
          float o;
          if (GATED) {
            float m = w * round_to<Tx>(n);
            if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
            const float z = gv[j];
            o = m * (z / (1.f + expf(-z)));
          } else if (a.mode == OPSLOT_RMS_STANDARD) {
            o = w * round_to<Tx>(n);
          } else if (a.mode == OPSLOT_RMS_OFFSET) {
            o = n * (1.f + w);
          } else {
            o = n;
          }
          out[j] = o;
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
  load_raw<VEC, NV>(wreg, static_cast<const Tw*>(a.w), a.mode != OPSLOT_RMS_UNWEIGHTED, t, tpr,
                    nvec);
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
          out[j] = r * (g - n * mean);
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
  if (a.mode == OPSLOT_RMS_UNWEIGHTED) return;
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

// Version 3 (the default where it applies: 16-byte vectors, rows of at most kPipeMaxRowBytes per
// stream): one block per row at a time, the next kStages - 1 rows of the block (x; gate; dy) copied
// into a shared-memory ring with cp.async while the current row is reduced and written. Each thread
// copies exactly the 16-byte pieces it later reads, so the ring needs no barrier: only the row sum
// does (one __syncthreads per row, double-buffered partials). The bytes in flight per SM come from
// the ring, not from registers, which is what versions 1 and 2 lacked
// (docs/results/kernels_h200.md).
constexpr int kStages = 4;  // ring depth (rows in flight per block, the current one included)
constexpr int kPipeMaxThreads = 512;
constexpr int64_t kPipeMaxSmem = 200 * 1024;

template <int BYTES>
__device__ __forceinline__ void copy_piece(unsigned char* dst, const unsigned char* src) {
#pragma unroll
  for (int b = 0; b < BYTES; b += 16) cp_async16(dst + b, src + b);
}

// Sum over the block's threads (one row per block); `red` is this row's half of the double buffer.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int nw = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < nw; ++i) s += red[i];
  return s;
}

template <typename Tx, typename Tw, typename To, int VEC, int NV, bool GATED, bool BWD, int S>
__global__ void __launch_bounds__(kPipeMaxThreads) rms_pipe_kernel(RmsArgs a) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ float red[2][kPipeMaxThreads / 32];
  constexpr int BX = VEC * static_cast<int>(sizeof(Tx));
  constexpr int BG = GATED ? VEC * static_cast<int>(sizeof(Tx)) : 0;
  constexpr int BD = BWD ? VEC * static_cast<int>(sizeof(To)) : 0;
  const int T = blockDim.x, t = threadIdx.x;
  const int nvec = static_cast<int>(a.cols / VEC);
  const int64_t stage_bytes = static_cast<int64_t>(nvec) * (BX + BG + BD);
  const float fcols = static_cast<float>(a.cols);
  const int64_t G = gridDim.x;
  const int mode = a.mode;

  // Issues this thread's pieces of `row` into stage s (nothing past the end), then commits a group
  // (always, so that group k is row k of this block).
  // The backward walks the rows from the last one (a.reverse): the rows its producer wrote last
  // (dy) and the forward read last (x) are the ones most likely still in L2.
  const bool reverse = BWD && a.reverse;
  auto phys = [&](int64_t row) { return reverse ? a.rows - 1 - row : row; };
  auto issue = [&](int64_t row, int s) {
    if (row < a.rows) {
      const int64_t at = phys(row);
      unsigned char* st = ring + s * stage_bytes;
      const unsigned char* xr =
          reinterpret_cast<const unsigned char*>(static_cast<const Tx*>(a.x) + at * a.xs);
      const unsigned char* gr =
          GATED ? reinterpret_cast<const unsigned char*>(static_cast<const Tx*>(a.gate) + at * a.gs)
                : nullptr;
      const unsigned char* dr =
          BWD ? reinterpret_cast<const unsigned char*>(static_cast<const To*>(a.dy) + at * a.dys)
              : nullptr;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * T;
        if (c < nvec) {
          copy_piece<BX>(st + static_cast<int64_t>(c) * BX, xr + static_cast<int64_t>(c) * BX);
          if (GATED)
            copy_piece<BG>(st + static_cast<int64_t>(nvec) * BX + static_cast<int64_t>(c) * BG,
                           gr + static_cast<int64_t>(c) * BG);
          if (BWD)
            copy_piece<BD>(
                st + static_cast<int64_t>(nvec) * (BX + BG) + static_cast<int64_t>(c) * BD,
                dr + static_cast<int64_t>(c) * BD);
        }
      }
    }
    cp_async_commit();
  };

  // The weight is the same for every row: in registers, as fp32.
  float wreg[NV][VEC];
  float dwacc[NV][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * T;
    if (mode != OPSLOT_RMS_UNWEIGHTED && c < nvec) {
      load_vec<VEC>(static_cast<const Tw*>(a.w) + static_cast<int64_t>(c) * VEC, wreg[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) wreg[i][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) dwacc[i][j] = 0.f;
  }

  const int64_t first = blockIdx.x;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(first + s * G, s);

  // The backward's rstd of the next row is loaded one row ahead (a dependent global load at the
  // start of every row otherwise).
  float r_next = BWD && first < a.rows ? a.rstd_in[phys(first)] : 0.f;
  int k = 0;
  for (int64_t row = first; row < a.rows; row += G, ++k) {
    issue(row + (S - 1) * G, (k + S - 1) % S);
    float r_cur = 0.f;
    if (BWD) {
      r_cur = r_next;
      if (row + G < a.rows) r_next = a.rstd_in[phys(row + G)];
    }
    cp_async_wait<S - 1>();
    const unsigned char* st = ring + (k % S) * stage_bytes;
    Vec<Tx, VEC> xv[NV];
    Vec<Tx, VEC> gv[NV];
    Vec<To, VEC> dv[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = t + i * T;
      if (c < nvec) {
        xv[i] = *reinterpret_cast<const Vec<Tx, VEC>*>(st + static_cast<int64_t>(c) * BX);
        if (GATED)
          gv[i] = *reinterpret_cast<const Vec<Tx, VEC>*>(st + static_cast<int64_t>(nvec) * BX +
                                                         static_cast<int64_t>(c) * BG);
        if (BWD)
          dv[i] = *reinterpret_cast<const Vec<To, VEC>*>(
              st + static_cast<int64_t>(nvec) * (BX + BG) + static_cast<int64_t>(c) * BD);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          xv[i].v[j] = from_float<Tx>(0.f);
          if (GATED) gv[i].v[j] = from_float<Tx>(0.f);
          if (BWD) dv[i].v[j] = from_float<To>(0.f);
        }
      }
    }
    float* rb = red[k & 1];
    if (!BWD) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float v = to_float(xv[i].v[j]);
          ss += v * v;
        }
      ss = (kDiagnostics && a.diag) ? fcols : block_sum(ss, rb);
      const float r = rsqrtf(ss / fcols + a.eps);
      if (t == 0) a.rstd[row] = r;
      To* yr = static_cast<To*>(a.y) + row * a.cols;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * T;
        if (c >= nvec) continue;
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float n = to_float(xv[i].v[j]) * r;
          const float w = wreg[i][j];
          float o;
          if (GATED) {
            float m = w * round_to<Tx>(n);
            if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
            const float z = to_float(gv[i].v[j]);
            o = m * (z * fast_sigmoid<Tx>(z));
          } else if (mode == OPSLOT_RMS_STANDARD) {
            o = w * round_to<Tx>(n);
          } else if (mode == OPSLOT_RMS_OFFSET) {
            o = n * (1.f + w);
          } else {
            o = n;
          }
          out[j] = o;
        }
        store_vec<VEC>(yr + static_cast<int64_t>(c) * VEC, out);
      }
    } else {
      const float r = r_cur;
      float gk[NV][VEC];  // the gradient w.r.t. n, kept for the second pass
      float dot = 0.f;
      Tx* dgr = GATED ? static_cast<Tx*>(a.dgate) + phys(row) * a.cols : nullptr;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float dg[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float n = to_float(xv[i].v[j]) * r;
          const float d = to_float(dv[i].v[j]);
          const float w = wreg[i][j];
          float g;
          if (GATED) {
            const float tn = round_to<Tx>(n);
            float m = w * tn;
            if (!std::is_same<Tw, float>::value) m = round_to<Tx>(m);
            const float z = to_float(gv[i].v[j]);
            const float s = fast_sigmoid<Tx>(z);
            const float dm = d * (z * s);
            dg[j] = d * m * s * (1.f + z * (1.f - s));
            g = dm * w;
            dwacc[i][j] += dm * tn;
          } else if (mode == OPSLOT_RMS_STANDARD) {
            g = d * w;
            dwacc[i][j] += d * round_to<Tx>(n);
          } else if (mode == OPSLOT_RMS_OFFSET) {
            g = d * (1.f + w);
            dwacc[i][j] += d * n;
          } else {
            g = d;
          }
          gk[i][j] = g;
          dot += g * n;
        }
        const int c = t + i * T;
        if (GATED && c < nvec) store_vec<VEC>(dgr + static_cast<int64_t>(c) * VEC, dg);
      }
      dot = (kDiagnostics && a.diag) ? 0.f : block_sum(dot, rb);
      const float mean = dot / fcols;
      Tx* dxr = static_cast<Tx*>(a.dx) + phys(row) * a.cols;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * T;
        if (c >= nvec) continue;
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = r * (gk[i][j] - to_float(xv[i].v[j]) * r * mean);
        store_vec<VEC>(dxr + static_cast<int64_t>(c) * VEC, out);
      }
    }
  }
  cp_async_wait<0>();
  if (!BWD || mode == OPSLOT_RMS_UNWEIGHTED) return;
  float* pr = a.dw_partial + static_cast<int64_t>(blockIdx.x) * a.cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = t + i * T;
    if (c < nvec) {
      float4* p4 = reinterpret_cast<float4*>(pr + static_cast<int64_t>(c) * VEC);
#pragma unroll
      for (int j = 0; j < VEC; j += 4)
        p4[j / 4] = make_float4(dwacc[i][j], dwacc[i][j + 1], dwacc[i][j + 2], dwacc[i][j + 3]);
    }
  }
}

// dw[c] = sum over p of partial[p][c], in a fixed order: 32 columns x 32 row lanes a block, each
// lane with 4 accumulators over rows lane + 32 * (4k + u) (four loads in flight), added
// (0 + 1) + (2 + 3), then the 32 lanes in order. (8 lanes and one accumulator: 3.5 µs for 396 x
// 4096 partials on an H200; this layout 2.5 µs.)
template <typename Tw>
__global__ void __launch_bounds__(1024)
    rms_dw_reduce_kernel(const float* partial, int64_t prow, int64_t cols, Tw* dw) {
  __shared__ float sm[32][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  if (col < cols) {
    int64_t p = ty;
    for (; p + 96 < prow; p += 128) {
      s0 += partial[p * cols + col];
      s1 += partial[(p + 32) * cols + col];
      s2 += partial[(p + 64) * cols + col];
      s3 += partial[(p + 96) * cols + col];
    }
    for (; p < prow; p += 32) s0 += partial[p * cols + col];
  }
  sm[ty][tx] = (s0 + s1) + (s2 + s3);
  __syncthreads();
  if (ty == 0 && col < cols) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) total += sm[i][tx];
    dw[col] = from_float<Tw>(total);
  }
}

// The SM count of the current device, asked once per device (atomics: a race asks twice and
// stores the same value).
int num_sms() {
  static std::atomic<int> cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 132;
  int n = dev < 64 ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (n > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    n = 132;
  if (dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

int pow2ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

bool aligned(const void* p, int bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Tuning knobs (opslot_rms_norm_set_tuning / _set_experiment, opslot_kernels/bench.h): mutable in
// the bench library only; the production library has these defaults as constants.
struct Tuning {
  // 16-byte vectors per thread the geometry aims at.
  int vectors_per_thread = 2;
  // Resident waves of the backward (each wave adds partial rows).
  int bwd_waves = 1;
  // 0: version 3 where it applies, else 2 (plain norms) / 1 (gated); 1, 2, 3: that version.
  int variant = 0;
  // Version 3: resident blocks per SM (0: as many as fit; -1: forward not persistent).
  int pipe_blocks_per_sm = 0;
  // Version 3 without its row sums (wrong results: a diagnostic).
  int diag = 0;
  // Version 3's backward in row order (default: from the last row).
  int backward_from_start = 0;
};
#ifdef OPSLOT_KERNELS_BENCH
Tuning g_tuning;
#else
constexpr Tuning g_tuning{};
#endif

// Launch geometry, from the width and vector size only (so a row's arithmetic does not depend on
// the rows).
struct Geometry {
  int vec, tpr, nv, threads, rpb;
};

template <typename Tx, typename Tw, typename To>
Geometry geometry(const RmsArgs& a, bool bwd) {
  constexpr int kVec = 16 / sizeof(Tx);
  bool ok =
      a.cols % kVec == 0 && a.xs % kVec == 0 && aligned(a.x, 16) && aligned(a.w, kVec * sizeof(Tw));
  if (a.mode == OPSLOT_RMS_GATED) ok = ok && a.gs % kVec == 0 && aligned(a.gate, 16);
  if (bwd)
    ok = ok && a.dys % kVec == 0 && aligned(a.dy, kVec * sizeof(To)) && aligned(a.dx, 16) &&
         aligned(a.dgate, 16);
  else
    ok = ok && aligned(a.y, kVec * sizeof(To));
  Geometry g;
  g.vec = ok ? kVec : 1;
  const int64_t nvec = a.cols / g.vec;
  const int64_t per_thread = g.vec > 1 ? g_tuning.vectors_per_thread : 4;
  int64_t tpr = pow2ceil((nvec + per_thread - 1) / per_thread);
  if (tpr > kMaxThreads) tpr = kMaxThreads;
  g.tpr = static_cast<int>(tpr);
  g.nv = pow2ceil((nvec + tpr - 1) / tpr);
  g.threads = g.tpr < 256 ? 256 : g.tpr;
  g.rpb = g.threads / g.tpr;
  return g;
}

template <typename Tx, typename Tw, typename To, int VEC, int NV>
int launch_nv(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
              int64_t* partial_rows) {
  const int64_t needed = (a.rows + g.rpb - 1) / g.rpb;
  const bool gated = a.mode == OPSLOT_RMS_GATED;
  // Version 0 (auto, the default): version 2 for the plain norms, version 1 for the gated norm
  // (measured faster on an H200: docs/results/kernels_h200.md).
  const int v = g_tuning.variant == 1 || (g_tuning.variant == 0 && gated) ? 0 : 1;
  void (*kernel)(RmsArgs);
  if (v == 0) {
    kernel = bwd ? rms_bwd_kernel_v1<Tx, Tw, To, VEC, NV> : rms_fwd_kernel_v1<Tx, Tw, To, VEC, NV>;
  } else if (!gated) {
    kernel = bwd ? rms_bwd_kernel<Tx, Tw, To, VEC, NV, false>
                 : rms_fwd_kernel<Tx, Tw, To, VEC, NV, false>;
  } else if constexpr (kBench) {
    // Version 2 of the gated norm: only opslot_rms_norm_set_tuning selects it (bench library).
    kernel =
        bwd ? rms_bwd_kernel<Tx, Tw, To, VEC, NV, true> : rms_fwd_kernel<Tx, Tw, To, VEC, NV, true>;
  } else {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "rms_norm: version 2 of the gated norm is only in the bench library");
  }
  // Blocks per SM of each kernel, asked once (atomics: a race asks twice and stores the same
  // value).
  static std::atomic<int> occupancy[2][2][2][2];  // [variant][gated][backward][512-thread block]
  std::atomic<int>& occ_memo = occupancy[v][gated ? 1 : 0][bwd ? 1 : 0][g.threads > 256 ? 1 : 0];
  int occ = occ_memo.load(std::memory_order_relaxed);
  if (occ == 0) {
    int n = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, g.threads, 0);
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "rms_norm: occupancy query failed: %s",
                       cudaGetErrorString(err));
    occ = n > 0 ? n : 1;
    occ_memo.store(occ, std::memory_order_relaxed);
  }
  // The forward may use many waves; the backward keeps bwd_waves resident waves (one partial row
  // per row group).
  const int64_t cap = static_cast<int64_t>(num_sms()) * occ * (bwd ? g_tuning.bwd_waves : 16);
  int64_t grid = needed < cap ? needed : cap;
  if (grid < 1) grid = 1;
  if (partial_rows) {
    *partial_rows = grid * g.rpb;
    return OPSLOT_OK;
  }
  if (a.rows == 0) return OPSLOT_OK;
  kernel<<<static_cast<unsigned>(grid), g.threads, 0, stream>>>(a);
  return check_launch(bwd ? "rms_norm backward" : "rms_norm forward");
}

template <typename Tx, typename Tw, typename To, int VEC>
int launch_vec(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
               int64_t* partial_rows) {
  // At most 32 elements per thread (more would spill in the backward).
  constexpr int kMaxNV = VEC >= 8 ? 4 : VEC == 4 ? 8 : 16;
  switch (g.nv) {
    case 1:
      return launch_nv<Tx, Tw, To, VEC, 1>(a, g, bwd, stream, partial_rows);
    case 2:
      return launch_nv<Tx, Tw, To, VEC, 2>(a, g, bwd, stream, partial_rows);
    case 4:
      return launch_nv<Tx, Tw, To, VEC, 4>(a, g, bwd, stream, partial_rows);
    case 8:
      if constexpr (kMaxNV >= 8)
        return launch_nv<Tx, Tw, To, VEC, 8>(a, g, bwd, stream, partial_rows);
      break;
    case 16:
      if constexpr (kMaxNV >= 16)
        return launch_nv<Tx, Tw, To, VEC, 16>(a, g, bwd, stream, partial_rows);
      break;
    default:
      break;
  }
  return set_error(
      OPSLOT_ERR_UNSUPPORTED,
      "rms_norm: width %lld is too wide for the register-resident kernel with %d-element vectors "
      "(at most %d elements per row)%s",
      static_cast<long long>(a.cols), VEC, kMaxThreads * kMaxNV * VEC,
      VEC == 1 ? "; rows that are contiguous, 16-byte aligned and a multiple of 16 bytes wide take "
                 "wider vectors"
               : "");
}

// Version 3's launch: returns kNotEligible when the input does not fit it (the caller then uses
// version 1 or 2).
constexpr int kNotEligible = -12345;

struct PipeGeometry {
  int threads = 0, nv = 0, stages = kStages;
  int64_t smem = 0;
};

template <typename Tx, typename Tw, typename To>
PipeGeometry pipe_geometry(const RmsArgs& a, bool bwd, const Geometry& g) {
  PipeGeometry p;
  constexpr int kVec = 16 / sizeof(Tx);
  if (g.vec != kVec) return p;
  if (bwd && !aligned(a.dw_partial, 16)) return p;
  const int64_t nvec = a.cols / kVec;
  const int64_t vpt = g_tuning.vectors_per_thread < 2 ? 1 : 2;
  int64_t T = pow2ceil((nvec + vpt - 1) / vpt);
  if (T < 32) T = 32;
  if (T > kPipeMaxThreads) T = kPipeMaxThreads;
  const int64_t nv = pow2ceil((nvec + T - 1) / T);
  if (nv > 2) return p;  // four vectors per thread (bf16 wider than 8192) spill in the backward
  const int64_t per_chunk =
      kVec * (static_cast<int64_t>(sizeof(Tx)) * (a.mode == OPSLOT_RMS_GATED ? 2 : 1) +
              (bwd ? static_cast<int64_t>(sizeof(To)) : 0));
  // One ring depth for every direction: a 6-stage ring for the plain forward measured slower than
  // 4 (0.0851 against 0.0819 ms, 0.0840 against 0.0815 in an earlier run), and a 3- or 2-stage
  // backward ring the same as 4 (docs/results/kernels_h200.md).
  const int stages = kStages;
  const int64_t smem = stages * nvec * per_chunk;
  if (smem > kPipeMaxSmem) return p;
  p.stages = stages;
  p.threads = static_cast<int>(T);
  p.nv = static_cast<int>(nv);
  p.smem = smem;
  return p;
}

int device_id() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
  return dev;
}

template <typename Tx, typename Tw, typename To, int VEC, int NV, bool GATED, bool BWD, int S>
int launch_pipe_inst(const RmsArgs& a, const PipeGeometry& p, cudaStream_t stream,
                     int64_t* partial_rows) {
  void (*kernel)(RmsArgs) = rms_pipe_kernel<Tx, Tw, To, VEC, NV, GATED, BWD, S>;
  // Per device: the dynamic shared-memory opt-in (once; the same value, so a race sets it twice),
  // and the occupancy of the last geometry (threads, shared memory) asked for.
  static std::atomic<bool> opted_in[DeviceMemo::kMaxDevices];
  static DeviceMemo last_occupancy;
  const int dev = device_id();
  if (dev >= DeviceMemo::kMaxDevices || !opted_in[dev].load(std::memory_order_acquire)) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kPipeMaxSmem));
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "rms_norm: shared-memory opt-in failed: %s",
                       cudaGetErrorString(err));
    if (dev < DeviceMemo::kMaxDevices) opted_in[dev].store(true, std::memory_order_release);
  }
  // threads (< 2^11) and shared memory (< 2^21 bytes): one 32-bit key.
  static_assert(kPipeMaxThreads < (1 << 11) && kPipeMaxSmem < (int64_t(1) << 21), "memo key");
  const uint32_t key = static_cast<uint32_t>(p.smem) << 11 | static_cast<uint32_t>(p.threads);
  int c_occ = last_occupancy.get(dev, key);
  if (c_occ < 0) {
    int n = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, p.threads,
                                                                    static_cast<size_t>(p.smem));
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "rms_norm: occupancy query failed: %s",
                       cudaGetErrorString(err));
    c_occ = n > 0 ? n : 1;
    last_occupancy.put(dev, key, c_occ);
  }
  const int occ = g_tuning.pipe_blocks_per_sm > 0 && g_tuning.pipe_blocks_per_sm < c_occ
                      ? g_tuning.pipe_blocks_per_sm
                      : c_occ;
  const int64_t cap =
      g_tuning.pipe_blocks_per_sm < 0 && !BWD ? a.rows : static_cast<int64_t>(num_sms()) * occ;
  int64_t grid = a.rows < cap ? a.rows : cap;
  if (grid < 1) grid = 1;
  if (partial_rows) {
    *partial_rows = grid;
    return OPSLOT_OK;
  }
  if (a.rows == 0) return OPSLOT_OK;
  RmsArgs b = a;
  b.diag = g_tuning.diag;
  b.reverse = !g_tuning.backward_from_start;
  kernel<<<static_cast<unsigned>(grid), p.threads, static_cast<size_t>(p.smem), stream>>>(b);
  return check_launch(BWD ? "rms_norm backward" : "rms_norm forward");
}

template <typename Tx, typename Tw, typename To, bool GATED, bool BWD>
int launch_pipe_nv(const RmsArgs& a, const PipeGeometry& p, cudaStream_t stream,
                   int64_t* partial_rows) {
  constexpr int kVec = 16 / sizeof(Tx);
  switch (p.nv) {
    case 1:
      return launch_pipe_inst<Tx, Tw, To, kVec, 1, GATED, BWD, kStages>(a, p, stream, partial_rows);
    default:
      return launch_pipe_inst<Tx, Tw, To, kVec, 2, GATED, BWD, kStages>(a, p, stream, partial_rows);
  }
}

template <typename Tx, typename Tw, typename To>
int launch_pipe(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
                int64_t* partial_rows) {
  if (g_tuning.variant != 0 && g_tuning.variant != 3) return kNotEligible;
  const PipeGeometry p = pipe_geometry<Tx, Tw, To>(a, bwd, g);
  if (p.threads == 0) return kNotEligible;
  const bool gated = a.mode == OPSLOT_RMS_GATED;
  if (gated)
    return bwd ? launch_pipe_nv<Tx, Tw, To, true, true>(a, p, stream, partial_rows)
               : launch_pipe_nv<Tx, Tw, To, true, false>(a, p, stream, partial_rows);
  return bwd ? launch_pipe_nv<Tx, Tw, To, false, true>(a, p, stream, partial_rows)
             : launch_pipe_nv<Tx, Tw, To, false, false>(a, p, stream, partial_rows);
}

template <typename Tx, typename Tw, typename To>
int launch(const RmsArgs& a, bool bwd, cudaStream_t stream, int64_t* partial_rows) {
  const Geometry g = geometry<Tx, Tw, To>(a, bwd);
  const int rc = launch_pipe<Tx, Tw, To>(a, g, bwd, stream, partial_rows);
  if (rc != kNotEligible) return rc;
  constexpr int kVec = 16 / sizeof(Tx);
  if (g.vec == kVec) return launch_vec<Tx, Tw, To, kVec>(a, g, bwd, stream, partial_rows);
  return launch_vec<Tx, Tw, To, 1>(a, g, bwd, stream, partial_rows);
}

// Calls f(Tx{}, Tw{}, To{}) for the dtype codes: w_dtype is x_dtype or fp32; To is fp32 for the
// standard norm with an fp32 weight, else Tx.
template <typename F>
int dispatch_types(int mode, int x_dtype, int w_dtype, F&& f) {
  if (mode < OPSLOT_RMS_STANDARD || mode > OPSLOT_RMS_GATED)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: unknown mode %d", mode);
  if (mode == OPSLOT_RMS_UNWEIGHTED) w_dtype = x_dtype;
  if (w_dtype != x_dtype && w_dtype != OPSLOT_FLOAT32)
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "rms_norm: weight dtype code %d with input dtype code %d (the weight must "
                     "have the input's dtype or float32)",
                     w_dtype, x_dtype);
  const bool wf = w_dtype == OPSLOT_FLOAT32;
  const bool of = wf && mode == OPSLOT_RMS_STANDARD;
  switch (x_dtype) {
    case OPSLOT_FLOAT32:
      return f(float{}, float{}, float{});
    case OPSLOT_FLOAT16:
      if (!wf) return f(__half{}, __half{}, __half{});
      return of ? f(__half{}, float{}, float{}) : f(__half{}, float{}, __half{});
    case OPSLOT_BFLOAT16:
      if (!wf) return f(__nv_bfloat16{}, __nv_bfloat16{}, __nv_bfloat16{});
      return of ? f(__nv_bfloat16{}, float{}, float{})
                : f(__nv_bfloat16{}, float{}, __nv_bfloat16{});
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: unknown dtype code %d", x_dtype);
  }
}

int check_common(int mode, int64_t rows, int64_t cols, const void* x, const void* gate,
                 const void* w) {
  if (rows < 0 || cols <= 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: bad shape rows=%lld cols=%lld",
                     static_cast<long long>(rows), static_cast<long long>(cols));
  if (rows > 0 && !x) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null input");
  if (mode == OPSLOT_RMS_GATED && rows > 0 && !gate)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null gate");
  if (mode != OPSLOT_RMS_UNWEIGHTED && !w)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null weight");
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int opslot_rms_norm_fwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   float eps, const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, void* y,
                                   float* rstd, void* stream) {
  if (int rc = check_common(mode, rows, cols, x, gate, weight)) return rc;
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.eps = eps;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.w = weight;
  a.y = y;
  a.rstd = rstd;
  return dispatch_types(mode, x_dtype, w_dtype, [&](auto tx, auto tw, auto to) -> int {
    using Tx = decltype(tx);
    using Tw = decltype(tw);
    using To = decltype(to);
    RmsArgs b = a;
    b.tpr = geometry<Tx, Tw, To>(a, false).tpr;
    return launch<Tx, Tw, To>(b, false, static_cast<cudaStream_t>(stream), nullptr);
  });
}

static int rms_bwd_impl(int mode, int x_dtype, int w_dtype, const RmsArgs& a, void* dw,
                        cudaStream_t stream, int64_t* partial_rows) {
  return dispatch_types(mode, x_dtype, w_dtype, [&](auto tx, auto tw, auto to) -> int {
    using Tx = decltype(tx);
    using Tw = decltype(tw);
    using To = decltype(to);
    RmsArgs b = a;
    b.tpr = geometry<Tx, Tw, To>(a, true).tpr;
    int64_t prow = 0;
    if (int rc = launch<Tx, Tw, To>(b, true, stream, &prow)) return rc;
    if (partial_rows) {
      *partial_rows = prow;
      return OPSLOT_OK;
    }
    if (int rc = launch<Tx, Tw, To>(b, true, stream, nullptr)) return rc;
    if (mode == OPSLOT_RMS_UNWEIGHTED) return OPSLOT_OK;
    const int64_t blocks = (a.cols + 31) / 32;
    // With no rows nothing wrote the partials: the reduction over zero partial rows writes zeros.
    rms_dw_reduce_kernel<Tw><<<static_cast<unsigned>(blocks), 1024, 0, stream>>>(
        a.dw_partial, a.rows == 0 ? 0 : prow, a.cols, static_cast<Tw*>(dw));
    return check_launch("rms_norm weight-gradient reduction");
  });
}

OPSLOT_API int64_t opslot_rms_norm_bwd_partial_rows(int mode, int x_dtype, int w_dtype,
                                                    int64_t rows, int64_t cols, const void* x,
                                                    int64_t x_row_stride, const void* gate,
                                                    int64_t gate_row_stride, const void* dy,
                                                    int64_t dy_row_stride) {
  static const char dummy = 0;  // the weight pointer is not needed to size the scratch
  if (check_common(mode, rows, cols, x, gate, &dummy)) return -1;
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.dy = dy;
  a.dys = dy_row_stride;
  int64_t prow = 0;
  if (rms_bwd_impl(mode, x_dtype, w_dtype, a, nullptr, nullptr, &prow)) return -1;
  return prow;
}

OPSLOT_API int opslot_rms_norm_bwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, const float* rstd,
                                   const void* dy, int64_t dy_row_stride, void* dx, void* dgate,
                                   float* dw_partial, void* dw, void* stream) {
  if (int rc = check_common(mode, rows, cols, x, gate, weight)) return rc;
  if (mode != OPSLOT_RMS_UNWEIGHTED && (!dw || !dw_partial))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm backward: null weight-gradient buffers");
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.w = weight;
  a.rstd_in = rstd;
  a.dy = dy;
  a.dys = dy_row_stride;
  a.dx = dx;
  a.dgate = dgate;
  a.dw_partial = dw_partial;
  return rms_bwd_impl(mode, x_dtype, w_dtype, a, dw, static_cast<cudaStream_t>(stream), nullptr);
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_rms_norm_set_experiment(int pipe_blocks_per_sm, int skip_row_sums,
                                              int backward_from_start) {
  if (pipe_blocks_per_sm < -1 || pipe_blocks_per_sm > 32 || skip_row_sums < 0 ||
      skip_row_sums > 1 || backward_from_start < 0 || backward_from_start > 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm experiment: pipe_blocks_per_sm -1..32, skip_row_sums 0..1, "
                     "backward_from_start 0..1");
  if (skip_row_sums && !kDiagnostics)
    return set_error(
        OPSLOT_ERR_UNSUPPORTED,
        "rms_norm experiment: skip_row_sums gives wrong results and is only in a bench library "
        "built with -DOPSLOT_KERNELS_DIAGNOSTICS=ON");
  g_tuning.backward_from_start = backward_from_start;
  g_tuning.pipe_blocks_per_sm = pipe_blocks_per_sm;
  g_tuning.diag = skip_row_sums;
  return OPSLOT_OK;
}

OPSLOT_API int opslot_rms_norm_set_tuning(int vectors_per_thread, int bwd_waves, int variant) {
  if (vectors_per_thread < 1 || vectors_per_thread > 8 || bwd_waves < 1 || bwd_waves > 16 ||
      variant < 0 || variant > 3)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm tuning: vectors_per_thread 1..8, bwd_waves 1..16, variant 0..3");
  g_tuning.vectors_per_thread = vectors_per_thread;
  g_tuning.bwd_waves = bwd_waves;
  g_tuning.variant = variant;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
