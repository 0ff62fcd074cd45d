// Device helpers of the chunked gated delta rule (gated_delta_rule.cu): chunk addressing, tile
// loads, block-wide tensor-core matrix products over shared memory, and the unit-lower-triangular
// inverse. Not part of the C ABI.
#pragma once

#include <mma.h>

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/gated_delta_rule.h"

namespace opslot::gdr {

constexpr int kChunk = 64;         // tokens per chunk
constexpr int kD = 128;            // Dk and Dv are padded with zeros to this inside the kernels
constexpr int kLd = kD + 8;        // row pitch (elements) of [rows, 128] tiles in shared memory
constexpr int kLd64 = kChunk + 8;  // row pitch of [64, 64] tiles
// Dv columns of the state that one sequential block carries: every block of a sequential kernel
// must be resident at once (16 columns made 512 blocks at the Qwen3.5 shape, two waves: 1.7x
// slower).
constexpr int kStateCols = 32;
constexpr int kLdS = kStateCols + 8;

// Dv columns per step of the kernels that walk Dv: 64 for 16-bit operands, 32 for fp32 (tf32).
template <typename T>
constexpr int slice_cols() {
  return sizeof(T) == 2 ? 64 : 32;
}

// One chunk: its sequence, batch row, first token (row index along T) and length (1..64).
struct ChunkInfo {
  int seq, b, tok0, len;
};

__device__ __forceinline__ int64_t tok_off(const int64_t* s, int b, int64_t tok, int h) {
  return b * s[0] + tok * s[1] + h * s[2];
}

__device__ __forceinline__ float ld_any(const void* p, int64_t i, int dtype) {
  if (dtype == OPSLOT_FLOAT32) return static_cast<const float*>(p)[i];
  if (dtype == OPSLOT_FLOAT16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void st_any(void* p, int64_t i, int dtype, float x) {
  if (dtype == OPSLOT_FLOAT32)
    static_cast<float*>(p)[i] = x;
  else if (dtype == OPSLOT_FLOAT16)
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}

template <typename D, typename S>
__device__ __forceinline__ D cvt(S x) {
  return from_float<D>(to_float(x));
}

// Offset of chunk `ci`, head `h` in a per-chunk scratch array of `elems` elements per (chunk,
// head).
__device__ __forceinline__ int64_t tile_off(int ci, int h, int heads, int64_t elems) {
  return (static_cast<int64_t>(ci) * heads + h) * elems;
}

// sG[i] = sum of g over the chunk's tokens 0..i (log decay from the chunk start; g = 0 past the
// chunk's end, so sG[63] is the whole chunk's), sB[i] = beta (0 past the end). Ends with a barrier.
__device__ inline void load_gates(const opslot_gdr_problem& p, const ChunkInfo& c, int h, float* sG,
                                  float* sB) {
  const int t = threadIdx.x;
  if (t < kChunk) {
    float g = 0.f, b = 0.f;
    if (t < c.len) {
      g = ld_any(p.g, tok_off(p.g_stride, c.b, c.tok0 + t, h), p.g_dtype);
      b = ld_any(p.beta, tok_off(p.beta_stride, c.b, c.tok0 + t, h), p.beta_dtype);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, g, o);
      if ((t & 31) >= o) g += n;
    }
    sG[t] = g;
    sB[t] = b;
  }
  __syncthreads();
  if (t >= 32 && t < kChunk) sG[t] += sG[31];
  __syncthreads();
}

// Every kernel of the op runs 512 threads: 16 warps keep more loads and tensor-core tiles in flight
// than 8 (measured side by side at the Qwen3.5 shape: 6.8 ms against 8.7 ms forward + backward).
constexpr int kThreads = 512;
constexpr int kRowsPerWarp = kChunk / (kThreads / 32);

// dst[r][d] (64 x 128, pitch kLd) = x[r][d] * f_r for rows r < len and d < D, else 0, where
// f_r = scale * rsqrt(sum_d x[r][d]^2 + 1e-6) with l2norm, else scale. Each warp loads its 8 rows
// at once (4 consecutive elements per lane, one vector load where aligned), then reduces and
// stores.
template <typename T>
__device__ void load_rows(T* dst, const void* src, const int64_t* st, const ChunkInfo& c, int h,
                          int64_t D, bool l2norm, float scale) {
  using V4 = Vec<T, 4>;
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * kRowsPerWarp, d0 = 4 * lane;
  float x[kRowsPerWarp][4];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = r0 + rr;
    const T* p =
        static_cast<const T*>(src) + (r < c.len ? tok_off(st, c.b, c.tok0 + r, h) : 0) + d0;
    if (r < c.len && d0 + 3 < D && reinterpret_cast<uintptr_t>(p) % sizeof(V4) == 0) {
      const V4 v = *reinterpret_cast<const V4*>(p);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[rr][j] = to_float(v.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[rr][j] = (r < c.len && d0 + j < D) ? to_float(p[j]) : 0.f;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    float f = scale;
    if (l2norm) {
      float ss =
          x[rr][0] * x[rr][0] + x[rr][1] * x[rr][1] + x[rr][2] * x[rr][2] + x[rr][3] * x[rr][3];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      f *= rsqrtf(ss + 1e-6f);
    }
    V4 v;
#pragma unroll
    for (int j = 0; j < 4; ++j) v.v[j] = from_float<T>(x[rr][j] * f);
    *reinterpret_cast<V4*>(dst + (r0 + rr) * kLd + d0) = v;
  }
}

// dst[r][d] (global, [64, 128] contiguous) = src[r][d] * f(r) (src pitch kLd), rounded to T.
template <typename T, typename F>
__device__ void store_decayed(T* dst, const T* src, F f) {
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, d = i % kD;
    dst[i] = from_float<T>(to_float(src[r * kLd + d]) * f(r));
  }
}

// dst[r][c] (pitch ldd) = src[r * lds + c] for r < live_rows and c < live_cols, else 0, for a tile
// of rows x cols (cols a multiple of 4): rows of a token-major tensor such as dO. Four elements per
// thread and step, several steps in flight.
template <typename T>
__device__ void load_token_tile(T* dst, int ldd, const T* src, int64_t lds, int rows, int cols,
                                int live_rows, int live_cols) {
  using V4 = Vec<T, 4>;
  const int vc = cols / 4, n = rows * vc;
  for (int base = threadIdx.x; base < n; base += 4 * blockDim.x) {
    V4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = base + k * blockDim.x, r = i / vc, c = (i % vc) * 4;
      const T* p = src + r * lds + c;
      if (i < n && r < live_rows && c + 3 < live_cols &&
          reinterpret_cast<uintptr_t>(p) % sizeof(V4) == 0) {
        v[k] = *reinterpret_cast<const V4*>(p);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          v[k].v[j] = (i < n && r < live_rows && c + j < live_cols) ? p[j] : from_float<T>(0.f);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = base + k * blockDim.x;
      if (i < n) *reinterpret_cast<V4*>(dst + (i / vc) * ldd + (i % vc) * 4) = v[k];
    }
  }
}

// Multiplies row r of a [64, 128] tile (pitch kLd) by f(r).
template <typename T, typename F>
__device__ void scale_rows(T* s, F f) {
  for (int i = threadIdx.x; i < kChunk * kD; i += blockDim.x) {
    const int r = i / kD, d = i % kD;
    s[r * kLd + d] = from_float<T>(to_float(s[r * kLd + d]) * f(r));
  }
}

// dst[r][c] (pitch ldd) = src[r][c] (pitch lds) for r < rows, c < cols, converted. Four steps per
// thread in flight; same-type copies of whole 16-byte pieces (every pitch and offset here is a
// multiple of 16 bytes) go as uint4.
template <typename D, typename S>
__device__ void copy_tile(D* dst, int ldd, const S* src, int64_t lds, int rows, int cols) {
  if constexpr (std::is_same_v<D, S>) {
    constexpr int V = 16 / sizeof(D);
    if (cols % V == 0) {
      const int vc = cols / V, n = rows * vc;
      for (int base = threadIdx.x; base < n; base += 4 * blockDim.x) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = base + k * blockDim.x;
          if (i < n) v[k] = *reinterpret_cast<const uint4*>(src + (i / vc) * lds + (i % vc) * V);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = base + k * blockDim.x;
          if (i < n) *reinterpret_cast<uint4*>(dst + (i / vc) * ldd + (i % vc) * V) = v[k];
        }
      }
      return;
    }
  }
  const int n = rows * cols;
  for (int base = threadIdx.x; base < n; base += 4 * blockDim.x) {
    D v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = base + k * blockDim.x, r = i / cols, c = i % cols;
      v[k] = i < n ? cvt<D>(src[r * lds + c]) : from_float<D>(0.f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = base + k * blockDim.x;
      if (i < n) dst[(i / cols) * ldd + i % cols] = v[k];
    }
  }
}

// Asynchronous tile loads (cp.async, 16 bytes each; rows and pitches are multiples of 16 bytes):
// the caller issues several, then cp_async_commit(); cp_async_wait<0>(); __syncthreads().
template <typename T>
__device__ void cp_tile(T* dst, int ldd, const T* src, int64_t lds, int rows, int cols) {
  constexpr int V = 16 / sizeof(T);
  const int vc = cols / V, n = rows * vc;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int r = i / vc, c = (i % vc) * V;
    cp_async16(dst + r * ldd + c, src + r * lds + c);
  }
}

// A token-major tile (rows of a [B, T, H, D] tensor such as dO: row r at src + r * lds) with rows
// at or past live_rows and columns at or past live_cols read as 0. Asynchronous (cp.async with zero
// fill) when live_cols is a multiple of 16 bytes and the rows are aligned, else a synchronous load.
template <typename T>
__device__ void cp_token_tile(T* dst, int ldd, const T* src, int64_t lds, int rows, int cols,
                              int live_rows, int live_cols) {
  constexpr int V = 16 / sizeof(T);
  if (live_cols % V != 0 || lds % V != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    load_token_tile(dst, ldd, src, lds, rows, cols, live_rows, live_cols);
    return;
  }
  const int vc = cols / V, n = rows * vc;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int r = i / vc, c = (i % vc) * V;
    const bool live = r < live_rows && c < live_cols;
    cp16_or_zero(dst + r * ldd + c, live ? src + r * lds + c : src, live);
  }
}

__device__ __forceinline__ void cp_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

// Tensor-core operand types: 16-bit inputs multiply as themselves (k = 16), fp32 inputs as tf32
// pieces (k = 8).
template <typename T>
struct Mma {
  using frag = T;
  static constexpr int k = 16;
};
template <>
struct Mma<float> {
  using frag = nvcuda::wmma::precision::tf32;
  static constexpr int k = 8;
};

// C[M][N] (fp32, pitch ldc) = (accumulate ? C : 0) + A[M][K] * B[K][N], operands in shared memory.
// A is row-major (element (m, k) at A[m * lda + k]) when ARow, else column-major (A[k * lda + m]);
// likewise B ((k, n) at B[k * ldb + n] when BRow, else B[n * ldb + k]). M, N, K multiples of 16.
// Each warp takes whole 16 x 16 output tiles, so the caller needs a barrier before reading C.
template <typename T, bool ARow, bool BRow>
__device__ void block_gemm(int M, int N, int K, const T* A, int lda, const T* B, int ldb, float* C,
                           int ldc, bool accumulate) {
  namespace wmma = nvcuda::wmma;
  using F = typename Mma<T>::frag;
  constexpr int KK = Mma<T>::k;
  using LA = std::conditional_t<ARow, wmma::row_major, wmma::col_major>;
  using LB = std::conditional_t<BRow, wmma::row_major, wmma::col_major>;
  const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
  for (int t = threadIdx.x >> 5; t < tiles; t += blockDim.x >> 5) {
    const int tm = t / tiles_n, tn = t % tiles_n;
    float* c = C + tm * 16 * ldc + tn * 16;
    wmma::fragment<wmma::accumulator, 16, 16, KK, float> acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, c, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.f);
    for (int k = 0; k < K; k += KK) {
      wmma::fragment<wmma::matrix_a, 16, 16, KK, F, LA> a;
      wmma::fragment<wmma::matrix_b, 16, 16, KK, F, LB> b;
      wmma::load_matrix_sync(a, ARow ? A + tm * 16 * lda + k : A + k * lda + tm * 16, lda);
      wmma::load_matrix_sync(b, BRow ? B + k * ldb + tn * 16 : B + tn * 16 * ldb + k, ldb);
      if constexpr (std::is_same_v<T, float>) {
        // fp32 operands as three tf32 products (a_hi b_hi + a_hi b_lo + a_lo b_hi): about fp32
        // accuracy.
        auto a_lo = a;
        auto b_lo = b;
#pragma unroll
        for (int i = 0; i < a.num_elements; ++i) {
          a.x[i] = wmma::__float_to_tf32(a_lo.x[i]);
          a_lo.x[i] = wmma::__float_to_tf32(a_lo.x[i] - a.x[i]);
        }
#pragma unroll
        for (int i = 0; i < b.num_elements; ++i) {
          b.x[i] = wmma::__float_to_tf32(b_lo.x[i]);
          b_lo.x[i] = wmma::__float_to_tf32(b_lo.x[i] - b.x[i]);
        }
        wmma::mma_sync(acc, a_lo, b, acc);
        wmma::mma_sync(acc, a, b_lo, acc);
      }
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
  }
}

// sA (64 x 64, pitch kLd64) = strict_lower(beta_i * (k_i . k_j) * exp(G_i - G_j)): the system
// matrix of the chunk's UT transform. sK holds the (normalised) keys. Ends with a barrier.
template <typename T>
__device__ void decayed_gram(const T* sK, const float* sG, const float* sB, float* sA) {
  block_gemm<T, true, false>(kChunk, kChunk, kD, sK, kLd, sK, kLd, sA, kLd64, false);
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x) {
    const int r = i / kChunk, c = i % kChunk;
    float& a = sA[r * kLd64 + c];
    a = r > c ? a * sB[r] * expf(sG[r] - sG[c]) : 0.f;
  }
  __syncthreads();
}

// sT = (I + sA)^-1 for strictly lower sA (64 x 64, fp32, pitch kLd64), in 16 x 16 blocks:
//   T_bb = (I + A_bb)^-1 by forward substitution, one warp per diagonal block and one lane per
//   column (the column in registers: no barrier), then block-diagonal by block-diagonal,
//   T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj. Fixed order everywhere (deterministic). Needs at least
//   256 threads (one per element of a 16 x 16 block); ends with a barrier.
__device__ inline void invert_unit_lower(const float* sA, float* sT, float* sX) {
  constexpr int kB = 16, kNB = kChunk / kB;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kChunk * kChunk; i += blockDim.x)
    sT[(i / kChunk) * kLd64 + i % kChunk] = 0.f;
  __syncthreads();
  if (warp < kNB && lane < kB) {
    const int o = warp * kB;
    float col[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      float acc = i == lane ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) acc -= sA[(o + i) * kLd64 + o + m] * col[m];
      col[i] = i < lane ? 0.f : acc;
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) sT[(o + i) * kLd64 + o + lane] = col[i];
  }
  __syncthreads();
  const int r = threadIdx.x / kB, c = threadIdx.x % kB;  // this thread's element of a 16 x 16 block
  const bool mine = threadIdx.x < kB * kB;
  for (int d = 1; d < kNB; ++d) {
    for (int bi = d; mine && bi < kNB; ++bi) {  // X_ij = sum_{m=j}^{i-1} A_im T_mj, j = bi - d
      const int bj = bi - d;
      float acc = 0.f;
      for (int m = bj * kB; m < bi * kB; ++m)
        acc += sA[(bi * kB + r) * kLd64 + m] * sT[m * kLd64 + bj * kB + c];
      sX[(bi - d) * kB * kB + r * kB + c] = acc;
    }
    __syncthreads();
    for (int bi = d; mine && bi < kNB; ++bi) {  // T_ij = -T_ii X_ij
      const int bj = bi - d;
      const float* x = sX + bj * kB * kB;
      float acc = 0.f;
#pragma unroll
      for (int m = 0; m < kB; ++m) acc += sT[(bi * kB + r) * kLd64 + bi * kB + m] * x[m * kB + c];
      sT[(bi * kB + r) * kLd64 + bj * kB + c] = -acc;
    }
    __syncthreads();
  }
}

// Sum over the block of one value per thread, in a fixed order (deterministic). `red` holds
// blockDim.x floats. Every thread gets the sum.
__device__ inline float block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float total = red[0];
  __syncthreads();
  return total;
}

// Row dot products of two [64, 128] tiles (pitch kLd): out[r] = sum_d a[r][d] * b[r][d], one warp
// per row in a fixed order. Ends with a barrier.
template <typename A, typename B>
__device__ void row_dots(const A* a, const B* b, float* out) {
  const int lane = threadIdx.x & 31;
  for (int r = threadIdx.x >> 5; r < kChunk; r += blockDim.x >> 5) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kD / 32; ++j)
      s += to_float(a[r * kLd + lane + 32 * j]) * to_float(b[r * kLd + lane + 32 * j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[r] = s;
  }
  __syncthreads();
}

}  // namespace opslot::gdr
