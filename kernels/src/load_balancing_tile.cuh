// The load-balancing loss's tile forward (16-byte aligned rows, 8 <= E <= 256, top_k <= 16;
// load_balancing.cu launches it).
#pragma once

#include "load_balancing_kernels.cuh"

namespace opslot {
namespace {

// The forward's fast path (16-byte aligned rows, 8 <= E <= 256, 1 <= top_k <= 16): a warp copies
// tiles of 32 rows into shared memory (cp.async, two tiles in flight), then each lane takes one
// row (max, top-k threshold by a sorted insertion list, the softmax sum, the selection bits) and,
// after a __syncwarp, each lane takes columns (experts lane, lane + 32, ...) over the tile's 32
// rows in order to add the probabilities and the selections. No shuffle per element and no
// per-round arg-max: the selection is a threshold (the k-th largest value; ties: lower index).
constexpr int kFastWarps = 4;
constexpr int kFastMaxE = 256;
constexpr int kFastMaxSmem = 200 * 1024;  // the tile path's largest dynamic shared memory
constexpr int kFastMaxWords = kFastMaxE / 32;

// R / rows, in 32 bits when both fit (a 64-bit division is a long software sequence).
__device__ __forceinline__ int layer_of(int64_t R, int64_t rows) {
  if (R < (int64_t(1) << 32) && rows < (int64_t(1) << 32))
    return static_cast<int>(static_cast<uint32_t>(R) / static_cast<uint32_t>(rows));
  return static_cast<int>(R / rows);
}

struct FastLayout {
  int pitch;       // bytes per tile row (row bytes + 16: lanes reading their own rows hit distinct
                   // banks)
  int tile_bytes;  // 32 rows
  int warp_bytes;  // two tiles + selection words + row statistics
};

__host__ __device__ inline FastLayout fast_layout(int E, int elem) {
  FastLayout f;
  f.pitch = E * elem + 16;
  f.tile_bytes = 32 * f.pitch;
  f.warp_bytes = 2 * f.tile_bytes + 32 * kFastMaxWords * 4 + 3 * 32 * 4;
  return f;
}

__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float min_of(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ unsigned max_of(unsigned a, unsigned b) { return max(a, b); }
__device__ __forceinline__ unsigned min_of(unsigned a, unsigned b) { return min(a, b); }

// Bitonic sort of N values (a power of two, at most 16) in registers, descending.
template <typename T, int N>
__device__ __forceinline__ void sort_desc(T (&c)[N]) {
  constexpr int LOG = N >= 16 ? 4 : N >= 8 ? 3 : N >= 4 ? 2 : N >= 2 ? 1 : 0;
  // Counted loops (not shifts) so that nvcc unrolls them and c stays in registers.
#pragma unroll
  for (int kk = 1; kk <= LOG; ++kk)
#pragma unroll
    for (int jj = kk - 1; jj >= 0; --jj)
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int l = i ^ (1 << jj);
        if (l > i) {
          const bool desc = (i & (1 << kk)) == 0;
          const T a = c[i], b = c[l];
          c[i] = desc ? max_of(a, b) : min_of(a, b);
          c[l] = desc ? min_of(a, b) : max_of(a, b);
        }
      }
}

// Two 16-bit values per 32-bit register: max/min in PTX on plain registers (cuda_bf16.h's
// __hmax2 takes its operands' addresses, which put the whole list in local memory).
template <bool BF16>
__device__ __forceinline__ unsigned pmax2(unsigned a, unsigned b) {
  unsigned d;
  if (BF16)
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
template <bool BF16>
__device__ __forceinline__ unsigned pmin2(unsigned a, unsigned b) {
  unsigned d;
  if (BF16)
    asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else
    asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
template <bool BF16>
__device__ __forceinline__ float half_lo(unsigned x) {
  if (BF16) return __uint_as_float(x << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x & 0xffffu)));
}
template <bool BF16>
__device__ __forceinline__ float half_hi(unsigned x) {
  if (BF16) return __uint_as_float(x & 0xffff0000u);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x >> 16)));
}

// The KMAX largest values of a row in shared memory (cpr 16-byte pieces), descending, by a
// branch-free insertion list. 16-bit values are compared exactly in their own type, two at a time
// (__hmax2/__hmin2: one list for the even and one for the odd positions), and the two lists are
// merged at the end; fp32 values one at a time.
template <bool BF16, int KMAX>
__device__ __forceinline__ void top_values_packed(const unsigned char* rowp, int cpr,
                                                  float (&lst)[KMAX]) {
  const unsigned neg_inf = BF16 ? 0xff80ff80u : 0xfc00fc00u;
  unsigned l2[KMAX];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) l2[i] = neg_inf;
  for (int pc = 0; pc < cpr; ++pc) {
    const uint4 x = *reinterpret_cast<const uint4*>(rowp + pc * 16);
    const unsigned xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      unsigned v = xs[j];
#pragma unroll
      for (int i = 0; i < KMAX; ++i) {
        const unsigned hi = pmax2<BF16>(l2[i], v);
        v = pmin2<BF16>(l2[i], v);
        l2[i] = hi;
      }
    }
  }
  // Even list descending, odd list ascending: their elementwise maximum holds the KMAX largest of
  // both (a bitonic sequence), which a bitonic sort orders.
#pragma unroll
  for (int i = 0; i < KMAX; ++i)
    lst[i] = fmaxf(half_lo<BF16>(l2[i]), half_hi<BF16>(l2[KMAX - 1 - i]));
  sort_desc(lst);
}

template <typename T, int KMAX>
__device__ __forceinline__ void top_values(const unsigned char* rowp, int cpr, float (&lst)[KMAX]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    top_values_packed<true, KMAX>(rowp, cpr, lst);
  } else if constexpr (std::is_same<T, __half>::value) {
    top_values_packed<false, KMAX>(rowp, cpr, lst);
  } else {
#pragma unroll
    for (int i = 0; i < KMAX; ++i) lst[i] = -INFINITY;
    for (int pc = 0; pc < cpr; ++pc) {
      const Vec<T, 4> x = *reinterpret_cast<const Vec<T, 4>*>(rowp + pc * 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = to_float(x.v[j]);
#pragma unroll
        for (int i = 0; i < KMAX; ++i) {
          const float hi = fmaxf(lst[i], v);
          v = fminf(lst[i], v);
          lst[i] = hi;
        }
      }
    }
  }
}

template <typename T, int KMAX>
__global__ void __launch_bounds__(kFastWarps * 32)
    lb_fwd_fast_kernel(const __grid_constant__ LbLayers L, LbArgs a, int64_t partial_rows) {
  extern __shared__ __align__(16) unsigned char fsm[];
  constexpr int VPC = 16 / sizeof(T);  // values per 16-byte piece
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = a.experts, K = a.top_k;
  const FastLayout F = fast_layout(E, sizeof(T));
  const int cpr = E / VPC;  // pieces per row
  const int words = (E + 31) / 32;
  unsigned char* base = fsm + warp * F.warp_bytes;
  unsigned* selw = reinterpret_cast<unsigned*>(base + 2 * F.tile_bytes);  // [32][kFastMaxWords]
  float* st_max = reinterpret_cast<float*>(selw + 32 * kFastMaxWords);
  float* st_inv = st_max + 32;
  float* st_m = st_inv + 32;
  const int64_t total = a.rows * a.layers;
  const int64_t ntiles = (total + 31) / 32;
  const int64_t wstride = static_cast<int64_t>(gridDim.x) * kFastWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kFastWarps + warp;

  auto issue = [&](int64_t tile, int stage) {
    if (tile < ntiles) {
      const int64_t R = tile * 32 + lane;
      const unsigned char* rp = nullptr;
      if (R < total) {
        const int layer = layer_of(R, a.rows);
        const int64_t t = R - static_cast<int64_t>(layer) * a.rows;
        rp = reinterpret_cast<const unsigned char*>(static_cast<const T*>(L.ptr[layer]) +
                                                    t * L.stride[layer]);
      }
      unsigned char* dst = base + stage * F.tile_bytes;
      for (int q = lane; q < 32 * cpr; q += 32) {
        const int r = q / cpr, pc = q - r * cpr;
        const unsigned char* src = reinterpret_cast<const unsigned char*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(rp), r));
        if (src) cp_async16(dst + r * F.pitch + pc * 16, src + pc * 16);
      }
    }
    cp_async_commit();
  };

  float cnt[kFastMaxWords], ps[kFastMaxWords];
#pragma unroll
  for (int j = 0; j < kFastMaxWords; ++j) cnt[j] = ps[j] = 0.f;

  issue(first, 0);
  issue(first + wstride, 1);
  int it = 0;
  for (int64_t tile = first; tile < ntiles; tile += wstride, ++it) {
    cp_async_wait<1>();
    __syncwarp();
    const unsigned char* tb = base + (it & 1) * F.tile_bytes;
    // Row pass: lane = row.
    {
      const int64_t R = tile * 32 + lane;
      const bool valid = R < total;
      float m = 0.f;
      if (valid) {
        const int layer = layer_of(R, a.rows);
        const int64_t t = R - static_cast<int64_t>(layer) * a.rows;
        m = a.mask ? a.mask[t] : 1.f;
      }
      const unsigned char* rowp = tb + lane * F.pitch;
      float lst[KMAX];  // the row's KMAX largest values, descending
      if (valid) {
        top_values<T, KMAX>(rowp, cpr, lst);
      } else {
#pragma unroll
        for (int i = 0; i < KMAX; ++i) lst[i] = -INFINITY;
      }
      // thr = lst[K - 1], as the minimum of the first K (a select on i == K - 1 becomes an indexed
      // load, which puts lst in local memory).
      float thr = INFINITY;
#pragma unroll
      for (int i = 0; i < KMAX; ++i) thr = i < K ? fminf(thr, lst[i]) : thr;
      const float mx = lst[0];
      // One pass: the softmax sum (four partial sums: no serial chain through every element) and,
      // per 32 experts, the bits of the values above and equal to the threshold.
      float s4[4] = {0.f, 0.f, 0.f, 0.f};
      unsigned gtw[kFastMaxWords], eqw[kFastMaxWords];
      int greater = 0;
#pragma unroll
      for (int w = 0; w < kFastMaxWords; ++w) {
        gtw[w] = eqw[w] = 0u;
        if (w >= words || !valid) continue;
        unsigned gt = 0u, eq = 0u;
        for (int pc = w * 32 / VPC; pc < (w + 1) * 32 / VPC && pc < cpr; ++pc) {
          const Vec<T, VPC> x = *reinterpret_cast<const Vec<T, VPC>*>(rowp + pc * 16);
          unsigned g8 = 0u, e8 = 0u;
#pragma unroll
          for (int j = 0; j < VPC; ++j) {
            const float v = to_float(x.v[j]);
            s4[j & 3] += __expf(v - mx);
            g8 |= static_cast<unsigned>(v > thr) << j;
            e8 |= static_cast<unsigned>(v == thr) << j;
          }
          const int sh = (pc * VPC) & 31;
          gt |= g8 << sh;
          eq |= e8 << sh;
        }
        gtw[w] = gt;
        eqw[w] = eq;
        greater += __popc(gt);
      }
      const float s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
      // The experts equal to the threshold, lowest index first, until k are taken.
      int need = K - greater;
      unsigned* sw = selw + lane * kFastMaxWords;
#pragma unroll
      for (int w = 0; w < kFastMaxWords; ++w) {
        if (w >= words) break;
        unsigned ties = eqw[w];
        int extra = __popc(ties) - (need > 0 ? need : 0);
        for (; extra > 0; --extra) ties &= ~(0x80000000u >> __clz(ties));  // drop the highest
        need -= __popc(ties);
        sw[w] = gtw[w] | ties;
      }
      st_max[lane] = mx;
      st_inv[lane] = valid ? 1.f / s : 0.f;
      st_m[lane] = valid ? m : 0.f;
    }
    __syncwarp();
    // Column pass: lane = experts lane + 32 j, the tile's rows in order.
    for (int r = 0; r < 32; ++r) {
      const float mr = st_m[r];
      if (mr == 0.f) continue;
      const float mx = st_max[r], inv = st_inv[r];
      const T* rowv = reinterpret_cast<const T*>(tb + r * F.pitch);
      const unsigned* sw = selw + r * kFastMaxWords;
#pragma unroll
      for (int j = 0; j < kFastMaxWords; ++j) {
        const int e = lane + 32 * j;
        if (e < E) {
          const float p = __expf(to_float(rowv[e]) - mx) * inv;
          ps[j] += mr * p;
          cnt[j] += (sw[j] >> lane & 1u) ? mr : 0.f;
        }
      }
    }
    __syncwarp();
    issue(tile + 2 * wstride, it & 1);
  }
  cp_async_wait<0>();
  // Block partial: the warps in a fixed order (the tiles reuse is over: a barrier first).
  __syncthreads();
  float* red = reinterpret_cast<float*>(fsm);  // [kFastWarps][2E]
#pragma unroll
  for (int j = 0; j < kFastMaxWords; ++j) {
    const int e = lane + 32 * j;
    if (e < E) {
      red[warp * 2 * E + e] = cnt[j];
      red[warp * 2 * E + E + e] = ps[j];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * E; c += kFastWarps * 32) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kFastWarps; ++w) s += red[w * 2 * E + c];
    a.partial[static_cast<int64_t>(blockIdx.x) * 2 * E + c] = s;
  }
  // The partial rows this launch owns beyond its blocks (the grid is capped at the resident
  // blocks) are zeros, so the finalize's fixed-order sum over all of them is unchanged.
  for (int64_t p = blockIdx.x + gridDim.x; p < partial_rows; p += gridDim.x)
    for (int c = threadIdx.x; c < 2 * E; c += kFastWarps * 32) a.partial[p * 2 * E + c] = 0.f;
}

}  // namespace
}  // namespace opslot
