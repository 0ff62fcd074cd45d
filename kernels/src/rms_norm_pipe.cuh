// RMSNorm's version 3 (one block per row, a cp.async ring of the next rows) and the fixed-order
// weight-gradient reduction (rms_norm.cu launches them).
#pragma once

#include "rms_norm_kernels.cuh"

namespace opslot {
namespace {

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
    if (!unweighted_mode(mode) && c < nvec) {
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
      const float rs = out_scale<Tx>(mode, r);
      To* yr = static_cast<To*>(a.y) + row * a.cols;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c = t + i * T;
        if (c >= nvec) continue;
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out[j] = rms_out<Tx, Tw, true>(mode, GATED, to_float(xv[i].v[j]) * rs, wreg[i][j],
                                         GATED ? to_float(gv[i].v[j]) : 0.f);
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
        for (int j = 0; j < VEC; ++j)
          out[j] = rms_dx<Tx>(mode, r, gk[i][j], to_float(xv[i].v[j]) * r, mean);
        store_vec<VEC>(dxr + static_cast<int64_t>(c) * VEC, out);
      }
    }
  }
  cp_async_wait<0>();
  if (!BWD || unweighted_mode(mode)) return;
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

}  // namespace
}  // namespace opslot
