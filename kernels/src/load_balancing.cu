// Load-balancing loss over the tuple of per-layer router logits. The layer pointers travel by value
// in the kernel-parameter struct, up to kMaxLayers per launch (more layers: more launches, each
// writing its own partial rows). A (layer, token) row is spread over LPR lanes, each holding EPL
// (up to 16) consecutive experts; softmax and top-k are butterflies over those lanes. Per-block
// partial sums (counts, probability sums) go to scratch; lb_finalize adds them in a fixed order and
// writes the loss and the coefficients the backward needs. See
// kernels/include/opslot_kernels/load_balancing.h.
#include <atomic>
#include <mutex>
#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/load_balancing.h"

namespace opslot {
namespace {

constexpr int kMaxLayers = 64;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kFinalThreads = 1024;

struct LbLayers {
  const void* ptr[kMaxLayers];
  int64_t stride[kMaxLayers];
  void* out[kMaxLayers];
};

struct LbArgs {
  int layers;  // in this launch
  int64_t rows;
  int experts;
  int top_k;
  const float* mask;
  float* partial;  // [gridDim.x, 2E] for this launch
  const float* coef;
  const float* grad;
};

// Lane layout: LPR lanes per row (a power of two dividing 32), RPW = 32 / LPR rows per warp at a
// time; lane q of a row owns experts q*EPL .. q*EPL+EPL-1.
template <typename T, int EPL, bool VEC>
__device__ __forceinline__ void load_row(const LbLayers& L, int layer, int64_t t, int E, int q,
                                         float (&v)[EPL]) {
  const T* p = static_cast<const T*>(L.ptr[layer]) + t * L.stride[layer] + q * EPL;
  if (VEC) {
    const Vec<T, EPL> x = *reinterpret_cast<const Vec<T, EPL>*>(p);
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = to_float(x.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = q * EPL + i < E ? to_float(p[i]) : -INFINITY;
  }
}

// Softmax of the row in place (fp32), the same code in the forward and the backward.
template <int EPL, int LPR>
__device__ __forceinline__ void softmax_row(float (&v)[EPL], int E, int q) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < EPL; ++i) mx = fmaxf(mx, v[i]);
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    v[i] = q * EPL + i < E ? expf(v[i] - mx) : 0.f;
    s += v[i];
  }
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.f / s;
#pragma unroll
  for (int i = 0; i < EPL; ++i) v[i] *= inv;
}

template <typename T, int EPL, int LPR, bool VEC>
__global__ void __launch_bounds__(kThreads)
    lb_fwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int RPW = 32 / LPR;
  extern __shared__ float sm[];  // [kWarps * RPW][2E]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = a.experts;
  float cnt[EPL], ps[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) cnt[i] = ps[i] = 0.f;
  const int64_t total = a.rows * a.layers;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RPW; base < total;
       base += static_cast<int64_t>(gridDim.x) * kWarps * RPW) {
    const int64_t r = base + sub;
    const bool valid = r < total;
    const int layer = valid ? static_cast<int>(r / a.rows) : 0;
    const int64_t t = valid ? r - static_cast<int64_t>(layer) * a.rows : 0;
    const float m = valid ? (a.mask ? a.mask[t] : 1.f) : 0.f;
    float v[EPL];
    if (valid) {
      load_row<T, EPL, VEC>(L, layer, t, E, q, v);
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i) v[i] = 0.f;
    }
    // top-k on the logits (softmax is monotone): k rounds of an arg-max over the row's lanes,
    // the lower index on ties.
    unsigned taken = 0;
    for (int k = 0; k < a.top_k; ++k) {
      float best = -INFINITY;
      int bi = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        const int e = q * EPL + i;
        if (e < E && !(taken >> i & 1u) && (bi == 0x7fffffff || v[i] > best)) {
          best = v[i];
          bi = e;
        }
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != 0x7fffffff && (bi == 0x7fffffff || ob > best || (ob == best && oi < bi))) {
          best = ob;
          bi = oi;
        }
      }
      if (bi / EPL == q) taken |= 1u << (bi - q * EPL);
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i) cnt[i] += (taken >> i & 1u) ? m : 0.f;
    softmax_row<EPL, LPR>(v, E, q);
    if (valid) {
#pragma unroll
      for (int i = 0; i < EPL; ++i) ps[i] += m * v[i];
    }
  }
  // Block partial: the warps' row groups in a fixed order.
  float* mine = sm + (warp * RPW + sub) * 2 * E;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    const int e = q * EPL + i;
    if (e < E) {
      mine[e] = cnt[i];
      mine[E + e] = ps[i];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * E; c += kThreads) {
    float s = 0.f;
    for (int w = 0; w < kWarps * RPW; ++w) s += sm[w * 2 * E + c];
    a.partial[static_cast<int64_t>(blockIdx.x) * 2 * E + c] = s;
  }
}

// One block: the column sums' kColChunks rows in a fixed order, then the loss (a fixed-order tree
// over the experts) and the backward's coefficients. E <= 512, so 2E <= kFinalThreads.
__global__ void __launch_bounds__(kFinalThreads)
    lb_finalize_kernel(const float* sums, int nrows, int E, int layers, int64_t rows,
                       const float* mask, float* loss, float* coef) {
  __shared__ float sm[kFinalThreads];
  __shared__ float red[kFinalThreads];
  __shared__ float total_rows;
  const int tid = threadIdx.x;
  // R: the mask's sum (fixed-order tree) times the layers, or rows * layers.
  if (mask) {
    float s = 0.f;
    for (int64_t t = tid; t < rows; t += kFinalThreads) s += mask[t];
    red[tid] = s;
    __syncthreads();
    for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
      if (tid < w) red[tid] += red[tid + w];
      __syncthreads();
    }
    if (tid == 0) total_rows = red[0] * static_cast<float>(layers);
  } else if (tid == 0) {
    total_rows = static_cast<float>(rows) * static_cast<float>(layers);
  }
  // sm[0..E): counts, sm[E..2E): probability sums.
  float v = 0.f;
  if (tid < 2 * E)
    for (int r = 0; r < nrows; ++r) v += sums[static_cast<int64_t>(r) * 2 * E + tid];
  sm[tid] = v;
  __syncthreads();
  const float R = total_rows;
  float term = 0.f;
  if (tid < E) {
    coef[tid] = static_cast<float>(E) * sm[tid] / (R * R);
    term = (sm[tid] / R) * (sm[E + tid] / R);
  }
  red[tid] = term;
  __syncthreads();
  for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  if (tid == 0) loss[0] = red[0] * static_cast<float>(E);
}

template <typename T, int EPL, int LPR, bool VEC>
__global__ void __launch_bounds__(kThreads)
    lb_bwd_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int RPW = 32 / LPR;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = a.experts;
  float c[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) c[i] = q * EPL + i < E ? a.coef[q * EPL + i] : 0.f;
  const float g = a.grad[0];
  const int64_t total = a.rows * a.layers;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RPW; base < total;
       base += static_cast<int64_t>(gridDim.x) * kWarps * RPW) {
    const int64_t r = base + sub;
    const bool valid = r < total;
    const int layer = valid ? static_cast<int>(r / a.rows) : 0;
    const int64_t t = valid ? r - static_cast<int64_t>(layer) * a.rows : 0;
    const float m = (valid && a.mask ? a.mask[t] : 1.f) * g;
    float v[EPL];
    if (valid) {
      load_row<T, EPL, VEC>(L, layer, t, E, q, v);
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i) v[i] = 0.f;
    }
    softmax_row<EPL, LPR>(v, E, q);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) dot += v[i] * c[i];
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (!valid) continue;
    T* out = static_cast<T*>(L.out[layer]) + t * E + q * EPL;
    if (VEC) {
      Vec<T, EPL> o;
#pragma unroll
      for (int i = 0; i < EPL; ++i) o.v[i] = from_float<T>(m * v[i] * (c[i] - dot));
      *reinterpret_cast<Vec<T, EPL>*>(out) = o;
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i)
        if (q * EPL + i < E) out[i] = from_float<T>(m * v[i] * (c[i] - dot));
    }
  }
}

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

// ---- The warp-per-row paths (E = 32 * EPL experts, EPL in {2, 4, 8}) ----
// Forward, 16-bit logits: a warp takes one row at a time, lane l the experts l*EPL .. l*EPL+EPL-1,
// which stay the lane's for every row, so the column sums (selections, probabilities) are the
// lane's registers: no shared-memory tile and no column pass. The top-k threshold comes from k
// rounds of one `redux.sync.max.u32` over unique 32-bit keys (the value's 16 bits made orderable
// as an unsigned integer in the high half, 0xffff - expert in the low half: equal values rank the
// lower index first), each lane popping its sorted keys. Backward, any dtype: a warp per row,
// softmax recomputed, two butterflies (sum, dot with the coefficients).
constexpr int kWarpWarps = 16;  // 512-thread blocks, 4 per SM: 64 warps, 32 registers
// Tuning knobs (opslot_load_balancing_set_tuning, opslot_kernels/bench.h): the forward path (0
// auto, 1 tile, 2 general) and the backward path (0 auto: warp per row, 1 general). Mutable in the
// bench library only; the production library has the defaults (auto) as constants. Every path is
// the automatic choice for some inputs, so both libraries have the same kernels.
#ifdef OPSLOT_KERNELS_BENCH
int g_lb_fwd_path = 0;
int g_lb_bwd_path = 0;
#else
constexpr int g_lb_fwd_path = 0;
constexpr int g_lb_bwd_path = 0;
#endif

template <int EPL>
struct RawRow {
  unsigned w[EPL / 2];
};

// Both halves made orderable as unsigned 16-bit integers: -0 becomes +0 (x * 1 + 0), then a
// positive value gets its sign bit set and a negative one all its bits flipped.
template <bool BF16>
__device__ __forceinline__ unsigned ord2(unsigned w) {
  unsigned d;
  if (BF16)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(0x3f803f80u), "r"(0u));
  else
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(0x3c003c00u), "r"(0u));
  const unsigned t = d & 0x80008000u;
  return d ^ ((t - (t >> 15)) | 0x80008000u);
}

// The value of an orderable 16-bit key (inverse of ord2), as fp32.
template <bool BF16>
__device__ __forceinline__ float unord(unsigned o) {
  const unsigned b = (o & 0x8000u) ? (o ^ 0x8000u) : (~o & 0xffffu);
  if (BF16) return __uint_as_float(b << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}

__device__ __forceinline__ float ex2f(float x) {  // 2^x, MUFU.EX2 (relative error ~2^-22)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Chunks: C consecutive rows of one layer, the unit a warp takes (its row pointers are one
// division away, and the next chunk's loads are issued before the current one is reduced).
// Rows of a chunk past the layer's end compute on zeros with weight 0 and store nothing.
struct Chunking {
  int cpl;      // chunks per layer
  int nchunks;  // layers * cpl (the host checks that it fits in an int)
};
__device__ __forceinline__ Chunking chunking(const LbArgs& a, int C) {
  Chunking c;
  c.cpl = static_cast<int>((a.rows + C - 1) / C);
  c.nchunks = a.layers * c.cpl;
  return c;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// KMAX: rounds compiled (top_k <= KMAX); EXACT: top_k == KMAX (no per-round check).
template <bool BF16, int EPL, int KMAX, bool EXACT, int MINB>
__global__ void __launch_bounds__(kWarpWarps * 32, MINB)
    lb_fwd_warp_kernel(const __grid_constant__ LbLayers L, LbArgs a, int64_t partial_rows) {
  extern __shared__ float wsm[];  // [kWarpWarps][2E]
  constexpr int C = 4;            // rows per chunk
  constexpr float kLog2e = 1.4426950408889634f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = 32 * EPL, K = a.top_k;
  const Chunking ch = chunking(a, C);
  const int rows = static_cast<int>(a.rows);
  const int W = static_cast<int>(gridDim.x) * kWarpWarps;
  unsigned idxw[EPL / 2];  // the low halves of this lane's keys: 0xffff - expert
#pragma unroll
  for (int j = 0; j < EPL / 2; ++j) {
    const unsigned e0 = lane * EPL + 2 * j;
    idxw[j] = ((0xffffu - e0 - 1u) << 16) | (0xffffu - e0);
  }
  float cnt[EPL], ps[EPL];
#pragma unroll
  for (int i = 0; i < EPL; ++i) cnt[i] = ps[i] = 0.f;

  auto fetch = [&](int c, RawRow<EPL>(&buf)[C], float(&mw)[C]) {
#pragma unroll
    for (int i = 0; i < C; ++i) {
      mw[i] = 0.f;
#pragma unroll
      for (int j = 0; j < EPL / 2; ++j) buf[i].w[j] = 0u;
    }
    if (c < ch.nchunks) {
      const int layer = c / ch.cpl;
      const int t0 = (c - layer * ch.cpl) * C;
      const int64_t stride = L.stride[layer];
      const unsigned short* p =
          static_cast<const unsigned short*>(L.ptr[layer]) + t0 * stride + lane * EPL;
#pragma unroll
      for (int i = 0; i < C; ++i)
        if (t0 + i < rows) {
          buf[i] = ld_stream(reinterpret_cast<const RawRow<EPL>*>(p + i * stride));
          mw[i] = a.mask ? a.mask[t0 + i] : 1.f;
        }
    }
  };

  auto row = [&](const RawRow<EPL>& r, float mrow) {
    unsigned key[EPL], srt[EPL];
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      const unsigned o = ord2<BF16>(r.w[j]);
      key[2 * j] = __byte_perm(idxw[j], o, 0x5410);
      key[2 * j + 1] = __byte_perm(idxw[j], o, 0x7632);
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i) srt[i] = key[i];
    sort_desc(srt);
    // Round k pops the lane's head if it was the k-th largest key; rounds past top_k pop nothing,
    // so m stays the top_k-th largest key of the row.
    unsigned m = __reduce_max_sync(0xffffffffu, srt[0]);
    const float mx = unord<BF16>(m >> 16);
#pragma unroll
    for (int k = 1; k < KMAX; ++k) {
      const bool pop = srt[0] == m && (EXACT || k < K);
#pragma unroll
      for (int i = 0; i + 1 < EPL; ++i) srt[i] = pop ? srt[i + 1] : srt[i];
      srt[EPL - 1] = pop ? 0u : srt[EPL - 1];
      m = __reduce_max_sync(0xffffffffu, srt[0]);
    }
    float e[EPL], s = 0.f;
    const float off = -mx * kLog2e;
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      float lo, hi;
      if (BF16) {
        lo = __uint_as_float(r.w[j] << 16);
        hi = __uint_as_float(r.w[j] & 0xffff0000u);
      } else {
        lo = __half2float(__ushort_as_half(static_cast<unsigned short>(r.w[j] & 0xffffu)));
        hi = __half2float(__ushort_as_half(static_cast<unsigned short>(r.w[j] >> 16)));
      }
      e[2 * j] = ex2f(fmaf(lo, kLog2e, off));
      e[2 * j + 1] = ex2f(fmaf(hi, kLog2e, off));
      s += e[2 * j] + e[2 * j + 1];
    }
    // The row sum in fixed point, one integer reduction instead of five shuffles (exact and
    // order-independent). Every e <= 1, so the row's sum is <= E: with 2^32 / E units per 1
    // (2^24 for E <= 128, 2^23 for 256) it fits 32 bits; each lane's part is rounded by at most
    // half a unit, so the sum (>= 1, the maximum's e is 1) is off by at most 32 * 2^-24 = 2e-6.
    constexpr float kFix = EPL <= 4 ? 16777216.f : 8388608.f;
    const unsigned fx = __reduce_add_sync(0xffffffffu, __float2uint_rn(s * kFix));
    const float w = mrow * rcp_approx(static_cast<float>(fx) * (1.f / kFix));
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      ps[i] = fmaf(e[i], w, ps[i]);
      if (key[i] >= m) cnt[i] += mrow;
    }
  };

  int c = static_cast<int>(blockIdx.x) * kWarpWarps + warp;
  RawRow<EPL> cur[C];
  float mcur[C];
  fetch(c, cur, mcur);
  for (; c < ch.nchunks; c += W) {
    RawRow<EPL> nxt[C];
    float mnxt[C];
    fetch(c + W, nxt, mnxt);
#pragma unroll
    for (int i = 0; i < C; ++i) row(cur[i], mcur[i]);
#pragma unroll
    for (int i = 0; i < C; ++i) {
      cur[i] = nxt[i];
      mcur[i] = mnxt[i];
    }
  }
  // Block partial: the warps in a fixed order.
  float* mine = wsm + warp * 2 * E;
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    mine[lane * EPL + i] = cnt[i];
    mine[E + lane * EPL + i] = ps[i];
  }
  __syncthreads();
  for (int col = threadIdx.x; col < 2 * E; col += kWarpWarps * 32) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpWarps; ++w) v += wsm[w * 2 * E + col];
    a.partial[static_cast<int64_t>(blockIdx.x) * 2 * E + col] = v;
  }
  for (int64_t p = blockIdx.x + gridDim.x; p < partial_rows; p += gridDim.x)
    for (int col = threadIdx.x; col < 2 * E; col += kWarpWarps * 32)
      a.partial[p * 2 * E + col] = 0.f;
}

// Backward: LPR lanes per row, each with NV 16-byte vectors (E = LPR * NV * VPV), 32 / LPR rows per
// warp step, S steps per chunk.
template <typename T, int LPR, int NV, int MINB>
__global__ void __launch_bounds__(kWarpWarps * 32, MINB)
    lb_bwd_warp_kernel(const __grid_constant__ LbLayers L, LbArgs a) {
  constexpr int VPV = 16 / sizeof(T);
  constexpr int EPL = NV * VPV;
  constexpr int RPW = 32 / LPR;
  constexpr int S = NV == 1 ? 2 : 1;
  constexpr int C = RPW * S;
  constexpr float kLog2e = 1.4426950408889634f;
  using V = Vec<T, VPV>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane % LPR, sub = lane / LPR;
  const int E = LPR * EPL;
  // Lane q's vectors: q + LPR * j (the row's 16-byte pieces interleaved over the lanes: each load
  // instruction of the row's lanes reads consecutive bytes).
  float cf[EPL];
#pragma unroll
  for (int j = 0; j < NV; ++j)
#pragma unroll
    for (int i = 0; i < VPV; ++i) cf[j * VPV + i] = a.coef[(q + LPR * j) * VPV + i];
  const float g = a.grad[0];
  const Chunking ch = chunking(a, C);
  const int rows = static_cast<int>(a.rows);
  const int W = static_cast<int>(gridDim.x) * kWarpWarps;

  auto fetch = [&](int c, V(&buf)[S][NV], float(&mw)[S]) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mw[s] = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int i = 0; i < VPV; ++i) buf[s][j].v[i] = from_float<T>(0.f);
    }
    if (c < ch.nchunks) {
      const int layer = c / ch.cpl;
      const int t0 = (c - layer * ch.cpl) * C + sub;
      const int64_t stride = L.stride[layer];
      const T* p = static_cast<const T*>(L.ptr[layer]) + t0 * stride + q * VPV;
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (t0 + s * RPW < rows) {
#pragma unroll
          for (int j = 0; j < NV; ++j)
            buf[s][j] = ld_stream(reinterpret_cast<const V*>(p + s * RPW * stride + LPR * VPV * j));
          mw[s] = (a.mask ? a.mask[t0 + s * RPW] : 1.f) * g;
        }
    }
  };

  int c = static_cast<int>(blockIdx.x) * kWarpWarps + warp;
  V cur[S][NV];
  float mcur[S];
  fetch(c, cur, mcur);
  for (; c < ch.nchunks; c += W) {
    V nxt[S][NV];
    float mnxt[S];
    fetch(c + W, nxt, mnxt);
    const int layer = c / ch.cpl;
    const int t0 = (c - layer * ch.cpl) * C + sub;
    T* out = static_cast<T*>(L.out[layer]) + static_cast<int64_t>(t0) * E + q * VPV;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      float v[EPL], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int i = 0; i < VPV; ++i) {
          v[j * VPV + i] = to_float(cur[s][j].v[i]);
          mx = fmaxf(mx, v[j * VPV + i]);
        }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float off = -mx * kLog2e;
      float sum = 0.f, d = 0.f;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        v[i] = ex2f(fmaf(v[i], kLog2e, off));
        sum += v[i];
        d = fmaf(v[i], cf[i], d);
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        d += __shfl_xor_sync(0xffffffffu, d, o);
      }
      const float inv = rcp_approx(sum);
      const float dot = d * inv, scale = mcur[s] * inv;
      if (t0 + s * RPW < rows) {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
          V o;
#pragma unroll
          for (int i = 0; i < VPV; ++i)
            o.v[i] = from_float<T>((cf[j * VPV + i] - dot) * (scale * v[j * VPV + i]));
          st_stream(reinterpret_cast<V*>(out + static_cast<int64_t>(s) * RPW * E + LPR * VPV * j),
                    o);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mcur[s] = mnxt[s];
#pragma unroll
      for (int j = 0; j < NV; ++j) cur[s][j] = nxt[s][j];
    }
  }
}

// The finalize's first stage: partial rows [prows][ncol] summed in kColChunks chunks of rows, in
// a fixed order, into out[kColChunks][ncol] (the finalize then adds those kColChunks rows).
constexpr int kColChunks = 16;
__global__ void __launch_bounds__(256)
    lb_colsum_kernel(const float* partial, int64_t prows, int ncol, float* out) {
  __shared__ float sm[8][33];
  const int cx = threadIdx.x & 31, gy = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + cx;
  const int64_t per = (prows + kColChunks - 1) / kColChunks;
  const int64_t r0 = blockIdx.y * per, r1 = r0 + per < prows ? r0 + per : prows;
  float s = 0.f;
  if (col < ncol)
    for (int64_t r = r0 + gy; r < r1; r += 8) s += partial[r * ncol + col];
  sm[gy][cx] = s;
  __syncthreads();
  if (gy == 0 && col < ncol) {
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) v += sm[k][cx];
    out[static_cast<int64_t>(blockIdx.y) * ncol + col] = v;
  }
}

int num_sms() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    return 132;
  return n;
}

int64_t blocks_for(int64_t rows, int layers) {
  const int64_t need = (rows * layers + kWarps * 4 - 1) / (kWarps * 4);
  const int64_t cap = static_cast<int64_t>(num_sms()) * 4;
  return need < 1 ? 1 : (need < cap ? need : cap);
}

template <typename T, int EPL, int LPR>
int launch_epl(bool bwd, int num_layers, const void* const* logits, const int64_t* strides,
               void* const* outs, LbArgs a, float* partial_base, cudaStream_t s) {
  int64_t offset = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    LbLayers L{};
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    bool vec = a.experts == EPL * LPR;
    for (int i = 0; i < n; ++i) {
      L.ptr[i] = logits[first + i];
      L.stride[i] = strides[first + i];
      if (!L.ptr[i] && a.rows > 0)
        return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null logits");
      vec = vec && L.stride[i] % EPL == 0 &&
            reinterpret_cast<uintptr_t>(L.ptr[i]) % (EPL * sizeof(T)) == 0;
      if (bwd) {
        L.out[i] = outs[first + i];
        vec = vec && reinterpret_cast<uintptr_t>(L.out[i]) % (EPL * sizeof(T)) == 0;
      }
    }
    LbArgs b = a;
    b.layers = n;
    const int64_t blocks = blocks_for(a.rows, n);
    b.partial = partial_base + offset * 2 * a.experts;
    offset += blocks;
    if (bwd) {
      if (vec)
        lb_bwd_kernel<T, EPL, LPR, true><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(L, b);
      else
        lb_bwd_kernel<T, EPL, LPR, false><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(L, b);
    } else {
      const size_t smem = sizeof(float) * kWarps * (32 / LPR) * 2 * a.experts;
      if (vec)
        lb_fwd_kernel<T, EPL, LPR, true>
            <<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(L, b);
      else
        lb_fwd_kernel<T, EPL, LPR, false>
            <<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(L, b);
    }
    if (int rc = check_launch(bwd ? "load_balancing backward" : "load_balancing forward"))
      return rc;
  }
  return OPSLOT_OK;
}

constexpr int kNotEligible = -12345;

template <typename T, int KMAX>
int launch_fast_k(const LbLayers& L, const LbArgs& b, int64_t owned_rows, cudaStream_t s) {
  const FastLayout F = fast_layout(b.experts, sizeof(T));
  const int smem = kFastWarps * F.warp_bytes;
  void (*kernel)(const LbLayers, LbArgs, int64_t) = lb_fwd_fast_kernel<T, KMAX>;
  // Per device: the dynamic shared memory opted in so far, which only grows (the mutex orders the
  // opt-ins, so no thread lowers it under another's launch), and the occupancy of the last size
  // asked for (DeviceMemo: thread-safe). A device past the memo's range opts in to the largest size
  // the tile path takes.
  static std::atomic<int> opted_in[DeviceMemo::kMaxDevices];
  static std::mutex opt_in_mutex;
  static DeviceMemo last_occupancy;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
  const bool memo = dev < DeviceMemo::kMaxDevices;
  if (!memo || opted_in[dev].load(std::memory_order_acquire) < smem) {
    std::lock_guard<std::mutex> lock(opt_in_mutex);
    if (!memo || opted_in[dev].load(std::memory_order_relaxed) < smem) {
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             memo ? smem : kFastMaxSmem);
      if (err != cudaSuccess)
        return set_error(static_cast<int>(err), "load_balancing: shared-memory opt-in failed: %s",
                         cudaGetErrorString(err));
      if (memo) opted_in[dev].store(smem, std::memory_order_release);
    }
  }
  int occ = last_occupancy.get(dev, static_cast<uint32_t>(smem));
  if (occ < 0) {
    int n = 0;
    cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kFastWarps * 32, smem);
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "load_balancing: occupancy query failed: %s",
                       cudaGetErrorString(err));
    occ = n > 0 ? n : 1;
    last_occupancy.put(dev, static_cast<uint32_t>(smem), occ);
  }
  const int64_t cap = static_cast<int64_t>(num_sms()) * occ;
  const int64_t grid = owned_rows < cap ? owned_rows : cap;
  kernel<<<static_cast<unsigned>(grid), kFastWarps * 32, smem, s>>>(L, b, owned_rows);
  return check_launch("load_balancing forward");
}

// The fast forward for every launch of kMaxLayers layers, or kNotEligible (then the general kernel
// runs).
template <typename T>
int launch_fast(int num_layers, const void* const* logits, const int64_t* strides, LbArgs a,
                float* partial_base, cudaStream_t s) {
  constexpr int VPC = 16 / sizeof(T);
  if (a.experts < 8 || a.experts > kFastMaxE || a.experts % VPC != 0 || a.top_k < 1 ||
      a.top_k > 16 || kFastWarps * fast_layout(a.experts, sizeof(T)).warp_bytes > kFastMaxSmem)
    return kNotEligible;
  for (int i = 0; i < num_layers; ++i)
    if (!logits[i] || reinterpret_cast<uintptr_t>(logits[i]) % 16 != 0 || strides[i] % VPC != 0)
      return kNotEligible;
  int64_t offset = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    LbLayers L{};
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    for (int i = 0; i < n; ++i) {
      L.ptr[i] = logits[first + i];
      L.stride[i] = strides[first + i];
    }
    LbArgs b = a;
    b.layers = n;
    const int64_t owned = blocks_for(a.rows, n);
    b.partial = partial_base + offset * 2 * a.experts;
    offset += owned;
    int rc;
    if (a.top_k <= 2)
      rc = launch_fast_k<T, 2>(L, b, owned, s);
    else if (a.top_k <= 4)
      rc = launch_fast_k<T, 4>(L, b, owned, s);
    else if (a.top_k <= 8)
      rc = launch_fast_k<T, 8>(L, b, owned, s);
    else
      rc = launch_fast_k<T, 16>(L, b, owned, s);
    if (rc) return rc;
  }
  return OPSLOT_OK;
}

// The warp paths: the forward for 16-bit logits, E in {64, 128, 256} (EPL 2, 4, 8 per lane),
// 1 <= top_k <= 16; the backward for E = 8, 16 or 32 lanes times one 16-byte vector.
template <typename T, int EPL, int KMAX, int MINB, bool EXACT = false>
int launch_warp_fwd_k(const LbLayers& L, const LbArgs& b, int64_t owned_rows, cudaStream_t s) {
  constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
  const size_t smem = sizeof(float) * kWarpWarps * 2 * 32 * EPL;
  const int64_t cap = static_cast<int64_t>(num_sms()) * MINB;
  const int64_t grid = owned_rows < cap ? owned_rows : cap;
  lb_fwd_warp_kernel<BF16, EPL, KMAX, EXACT, MINB>
      <<<static_cast<unsigned>(grid), kWarpWarps * 32, smem, s>>>(L, b, owned_rows);
  return check_launch("load_balancing forward");
}

template <typename T, int EPL>
int launch_warp_fwd_epl(const LbLayers& L, const LbArgs& b, int64_t owned_rows, cudaStream_t s) {
  constexpr int M = EPL == 2 ? 3 : EPL == 4 ? 2 : 1;  // resident blocks per SM the registers allow
  if (b.top_k <= 2) return launch_warp_fwd_k<T, EPL, 2, M>(L, b, owned_rows, s);
  if (b.top_k <= 4) return launch_warp_fwd_k<T, EPL, 4, M>(L, b, owned_rows, s);
  if (b.top_k == 8) {  // Qwen3-MoE, DeepSeek-V3: no per-round check
    return launch_warp_fwd_k<T, EPL, 8, M, true>(L, b, owned_rows, s);
  }
  if (b.top_k <= 8) return launch_warp_fwd_k<T, EPL, 8, M>(L, b, owned_rows, s);
  return launch_warp_fwd_k<T, EPL, 16, M>(L, b, owned_rows, s);
}

template <typename T, int LPR, int NV, int MINB>
int launch_warp_bwd_k(const LbLayers& L, const LbArgs& b, int64_t owned_rows, cudaStream_t s) {
  const int64_t cap = static_cast<int64_t>(num_sms()) * MINB;
  const int64_t grid = owned_rows < cap ? owned_rows : cap;
  lb_bwd_warp_kernel<T, LPR, NV, MINB>
      <<<static_cast<unsigned>(grid), kWarpWarps * 32, 0, s>>>(L, b);
  return check_launch("load_balancing backward");
}

template <typename T, int LPR, int NV>
int launch_warp_bwd_lpr(const LbLayers& L, const LbArgs& b, int64_t owned_rows, cudaStream_t s) {
  return launch_warp_bwd_k<T, LPR, NV, 2>(L, b, owned_rows, s);
}

bool warp_rows_aligned(int num_layers, const void* const* ptrs, const int64_t* strides, int vec,
                       int elem) {
  for (int i = 0; i < num_layers; ++i)
    if (!ptrs[i] || reinterpret_cast<uintptr_t>(ptrs[i]) % (vec * elem) != 0 ||
        (strides && strides[i] % vec != 0))
      return false;
  return true;
}

template <typename T>
int launch_warp(bool bwd, int num_layers, const void* const* logits, const int64_t* strides,
                void* const* outs, LbArgs a, float* partial_base, cudaStream_t s) {
  constexpr bool k16 = sizeof(T) == 2;
  const int E = a.experts;
  // The vector a lane loads: EPL values in the forward, 16 bytes in the backward.
  const int vec = bwd ? static_cast<int>(16 / sizeof(T)) : E / 32;
  // Backward: two 16-byte vectors per lane where that leaves 8, 16 or 32 lanes per row, else one.
  const int nv = bwd && vec > 0 && E % (2 * vec) == 0 &&
                         (E / (2 * vec) == 8 || E / (2 * vec) == 16 || E / (2 * vec) == 32)
                     ? 2
                     : 1;
  const int lpr = bwd ? E / (vec * nv) : 32;
  bool ok = (bwd ? g_lb_bwd_path : g_lb_fwd_path) == 0 && vec > 0 && E % vec == 0 &&
            a.rows < (int64_t(1) << 30) &&
            static_cast<int64_t>(num_layers) * (a.rows + 3) / 4 < (int64_t(1) << 30);
  ok = ok && (bwd ? (lpr == 8 || lpr == 16 || lpr == 32)
                  : (k16 && E % 32 == 0 && (vec == 2 || vec == 4 || vec == 8) && a.top_k >= 1 &&
                     a.top_k <= 16));
  ok = ok && warp_rows_aligned(num_layers, logits, strides, vec, sizeof(T)) &&
       (!bwd || warp_rows_aligned(num_layers, outs, nullptr, vec, sizeof(T)));
  if (!ok) return kNotEligible;
  int64_t offset = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    LbLayers L{};
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    for (int i = 0; i < n; ++i) {
      L.ptr[i] = logits[first + i];
      L.stride[i] = strides[first + i];
      if (bwd) L.out[i] = outs[first + i];
    }
    LbArgs b = a;
    b.layers = n;
    const int64_t owned = blocks_for(a.rows, n);
    int rc = OPSLOT_OK;
    if (bwd) {
      if (nv == 2) {
        if (lpr == 8)
          rc = launch_warp_bwd_lpr<T, 8, 2>(L, b, owned, s);
        else if (lpr == 16)
          rc = launch_warp_bwd_lpr<T, 16, 2>(L, b, owned, s);
        else
          rc = launch_warp_bwd_lpr<T, 32, 2>(L, b, owned, s);
      } else {
        if (lpr == 8)
          rc = launch_warp_bwd_lpr<T, 8, 1>(L, b, owned, s);
        else if (lpr == 16)
          rc = launch_warp_bwd_lpr<T, 16, 1>(L, b, owned, s);
        else
          rc = launch_warp_bwd_lpr<T, 32, 1>(L, b, owned, s);
      }
    } else if constexpr (k16) {
      b.partial = partial_base + offset * 2 * a.experts;
      offset += owned;
      if (vec == 2)
        rc = launch_warp_fwd_epl<T, 2>(L, b, owned, s);
      else if (vec == 4)
        rc = launch_warp_fwd_epl<T, 4>(L, b, owned, s);
      else
        rc = launch_warp_fwd_epl<T, 8>(L, b, owned, s);
    }
    if (rc) return rc;
  }
  return OPSLOT_OK;
}

template <typename T>
int launch(bool bwd, int num_layers, const void* const* logits, const int64_t* strides,
           void* const* outs, LbArgs a, float* partial, cudaStream_t s) {
  if (a.rows > 0) {
    int rc = launch_warp<T>(bwd, num_layers, logits, strides, outs, a, partial, s);
    if (rc != kNotEligible) return rc;
    if (!bwd && g_lb_fwd_path <= 1) {
      rc = launch_fast<T>(num_layers, logits, strides, a, partial, s);
      if (rc != kNotEligible) return rc;
    }
  }
  // Up to 16 experts per lane; rows of more than 16 experts are spread over 2..32 lanes.
  switch (a.experts <= 16 ? a.experts : 16 + (a.experts + 15) / 16) {
    case 1:
      return launch_epl<T, 1, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 2:
      return launch_epl<T, 2, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 3:
    case 4:
      return launch_epl<T, 4, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    case 5:
    case 6:
    case 7:
    case 8:
      return launch_epl<T, 8, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
    default:
      break;
  }
  if (a.experts <= 16)
    return launch_epl<T, 16, 1>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 32)
    return launch_epl<T, 16, 2>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 64)
    return launch_epl<T, 16, 4>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 128)
    return launch_epl<T, 16, 8>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 256)
    return launch_epl<T, 16, 16>(bwd, num_layers, logits, strides, outs, a, partial, s);
  if (a.experts <= 512)
    return launch_epl<T, 16, 32>(bwd, num_layers, logits, strides, outs, a, partial, s);
  return set_error(OPSLOT_ERR_UNSUPPORTED, "load_balancing: %d experts (at most 512)", a.experts);
}

int check_args(int num_layers, int64_t rows, int E, int top_k) {
  if (num_layers <= 0 || rows < 0 || E <= 0 || E > 512)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "load_balancing: bad sizes (layers %d, rows %lld, experts %d; "
                     "at most 512 experts)",
                     num_layers, static_cast<long long>(rows), E);
  if (top_k < 0 || top_k > E)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: top_k %d with %d experts", top_k,
                     E);
  return OPSLOT_OK;
}

// The forward's partial rows (every launch's blocks), then kColChunks rows for lb_colsum_kernel.
int64_t partial_rows_of(int num_layers, int64_t rows) {
  int64_t total = 0;
  for (int first = 0; first < num_layers; first += kMaxLayers) {
    const int n = num_layers - first < kMaxLayers ? num_layers - first : kMaxLayers;
    total += blocks_for(rows, n);
  }
  return total;
}

int64_t scratch_rows(int num_layers, int64_t rows) {
  return partial_rows_of(num_layers, rows) + kColChunks;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int64_t opslot_load_balancing_scratch_floats(int num_layers, int64_t rows,
                                                        int num_experts) {
  if (check_args(num_layers, rows, num_experts, 0)) return -1;
  return scratch_rows(num_layers, rows) * 2 * num_experts;
}

OPSLOT_API int opslot_load_balancing_fwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts,
                                         int top_k, const float* mask, float* scratch, float* loss,
                                         float* coef, void* stream) {
  if (int rc = check_args(num_layers, rows, num_experts, top_k)) return rc;
  if (!logits || !row_strides || !scratch || !loss || !coef)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null argument");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  LbArgs a{};
  a.rows = rows;
  a.experts = num_experts;
  a.top_k = top_k;
  a.mask = mask;
  int rc = dispatch_dtype(dtype, "load_balancing", [&](auto t) -> int {
    return launch<decltype(t)>(false, num_layers, logits, row_strides, nullptr, a, scratch, s);
  });
  if (rc) return rc;
  const int64_t prows = partial_rows_of(num_layers, rows);
  float* sums = scratch + prows * 2 * num_experts;
  const dim3 grid((2 * num_experts + 31) / 32, kColChunks);
  lb_colsum_kernel<<<grid, 256, 0, s>>>(scratch, prows, 2 * num_experts, sums);
  if (int rc = check_launch("load_balancing column sums")) return rc;
  lb_finalize_kernel<<<1, kFinalThreads, 0, s>>>(sums, kColChunks, num_experts, num_layers, rows,
                                                 mask, loss, coef);
  return check_launch("load_balancing finalize");
}

OPSLOT_API int opslot_load_balancing_bwd(int dtype, int num_layers, const void* const* logits,
                                         const int64_t* row_strides, int64_t rows, int num_experts,
                                         const float* mask, const float* coef,
                                         const float* grad_loss, void* const* grad_logits,
                                         void* stream) {
  if (int rc = check_args(num_layers, rows, num_experts, 0)) return rc;
  if (!logits || !row_strides || !coef || !grad_loss || !grad_logits)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "load_balancing: null argument");
  if (rows == 0) return OPSLOT_OK;
  LbArgs a{};
  a.rows = rows;
  a.experts = num_experts;
  a.mask = mask;
  a.coef = coef;
  a.grad = grad_loss;
  return dispatch_dtype(dtype, "load_balancing", [&](auto t) -> int {
    return launch<decltype(t)>(true, num_layers, logits, row_strides, grad_logits, a, nullptr,
                               static_cast<cudaStream_t>(stream));
  });
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_load_balancing_set_tuning(int forward_path, int backward_path) {
  if (forward_path < 0 || forward_path > 2 || backward_path < 0 || backward_path > 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "load_balancing tuning: forward_path 0..2, backward_path 0..1");
  g_lb_fwd_path = forward_path;
  g_lb_bwd_path = backward_path;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
