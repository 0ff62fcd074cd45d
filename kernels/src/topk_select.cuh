// The radix select the top-k kernels share (topk.cu launches them; the contract
// opslot_kernels/topk.h, the design docs/kernels.md "Top-k"): the order keys of fp32 values and
// a mask's entries, a row's keys read from global or shared memory (sources), the digits'
// histograms and the bucket holding the k-th largest, the chosen columns written in ascending
// order through prefix sums, and the launch parameters with a row's source.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/topk.h"

namespace opslot::topk {
namespace {

constexpr const char* kName = "opslot_topk_indices";
constexpr int kMaxBins = 2048;  // an 11-bit digit; pick_bucket: kMaxBins / threads buckets each

// The order of fp32 values as unsigned integers, that of torch.topk's radix select: NaN above +inf,
// -0.0 below +0.0.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t x = __float_as_uint(v);
  if (v != v) return 0xffffffffu;
  return x ^ ((x & 0x80000000u) ? 0xffffffffu : 0x80000000u);
}

// The key of an fp32 -inf: what a column a bool mask hides counts as.
constexpr uint32_t kHiddenKey = 0x007fffffu;

// Four mask entries as one load: bool 4 bytes, fp32 16, fp16/bf16 8 (MaskWord<-1>: no mask).
template <int kMask>
struct MaskWord {
  using type = uint32_t;
};
template <>
struct MaskWord<OPSLOT_TOPK_MASK_FLOAT32> {
  using type = float4;
};
template <>
struct MaskWord<OPSLOT_TOPK_MASK_FLOAT16> {
  using type = uint2;
};
template <>
struct MaskWord<OPSLOT_TOPK_MASK_BFLOAT16> {
  using type = uint2;
};

// Bytes of one mask entry.
template <int kMask>
constexpr int kMaskBytes = sizeof(typename MaskWord<kMask>::type) / 4;

// The four mask entries of one load as fp32 (additive kinds) or 0/1 (bool).
template <int kMask>
__device__ __forceinline__ void mask_values(const typename MaskWord<kMask>::type& w,
                                            float (&a)[4]) {
  if constexpr (kMask == OPSLOT_TOPK_MASK_BOOL) {
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = (w >> (8 * j)) & 0xffu ? 1.f : 0.f;
  } else if constexpr (kMask == OPSLOT_TOPK_MASK_FLOAT32) {
    a[0] = w.x, a[1] = w.y, a[2] = w.z, a[3] = w.w;
  } else {  // float16 / bfloat16
    using E = std::conditional_t<kMask == OPSLOT_TOPK_MASK_FLOAT16, __half, __nv_bfloat16>;
    E e[4];
    *reinterpret_cast<uint2*>(e) = w;
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = static_cast<float>(e[j]);
  }
}

// Four mask entries as fp32 (additive kinds) or 0/1 (bool) from `m` at entry i, `count` of them in
// the row (the rest 0); one aligned load reads them when `vec` and all four are in the row.
template <int kMask>
__device__ __forceinline__ void load_mask(const void* m, int64_t i, int count, bool vec,
                                          float (&a)[4]) {
  using Word = typename MaskWord<kMask>::type;
  if constexpr (kMask == OPSLOT_TOPK_MASK_BOOL) {
    const uint8_t* b = static_cast<const uint8_t*>(m) + i;
    if (vec && count == 4) {
      mask_values<kMask>(*reinterpret_cast<const Word*>(b), a);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = j < count && b[j] != 0 ? 1.f : 0.f;
    }
  } else if constexpr (kMask == OPSLOT_TOPK_MASK_FLOAT32) {
    const float* f = static_cast<const float*>(m) + i;
    if (vec && count == 4) {
      mask_values<kMask>(*reinterpret_cast<const Word*>(f), a);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = j < count ? f[j] : 0.f;
    }
  } else {  // float16 / bfloat16
    using E = std::conditional_t<kMask == OPSLOT_TOPK_MASK_FLOAT16, __half, __nv_bfloat16>;
    const E* h = static_cast<const E*>(m) + i;
    E e[4];
    if (vec && count == 4) {
      *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(h);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) e[j] = j < count ? h[j] : E(0.f);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = static_cast<float>(e[j]);
  }
}

// The order keys of four scores and their mask entries (`a`, unread without a mask).
template <int kMask>
__device__ __forceinline__ void to_keys(const float (&v)[4], const float (&a)[4],
                                        uint32_t (&key)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (kMask == OPSLOT_TOPK_MASK_BOOL) {
      key[j] = a[j] != 0.f ? order_key(v[j]) : kHiddenKey;
    } else if constexpr (kMask >= 0) {
      key[j] = order_key(v[j] + a[j]);
    } else {
      key[j] = order_key(v[j]);
    }
  }
}

// The keys of a row read from global memory (its scores, and its mask entries when kMask >= 0):
// chunk c is columns 4c .. 4c + 3.
template <int kMask>
struct RowSource {
  using Word = typename MaskWord<kMask>::type;
  const float* row;
  int64_t n;         // columns before the limit
  bool vec;          // the scores' row 16-byte aligned: float4 loads
  const void* mask;  // this row's mask entries (kMask >= 0)
  bool mvec;         // the mask's row aligned for one load of four entries

  __device__ int64_t chunks() const { return (n + 3) / 4; }
  // The keys and columns of chunk c; returns how many of its four are in the row (0 past its end).
  __device__ __forceinline__ int load(int64_t c, uint32_t (&key)[4], int (&col)[4]) const {
    const int64_t left = n - 4 * c;
    const int count = left >= 4 ? 4 : (left > 0 ? static_cast<int>(left) : 0);
    float v[4], a[4] = {0.f, 0.f, 0.f, 0.f};
    if (vec && count == 4) {
      const float4 q = *reinterpret_cast<const float4*>(row + 4 * c);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = j < count ? row[4 * c + j] : 0.f;
    }
    if constexpr (kMask >= 0) load_mask<kMask>(mask, 4 * c, count, mvec, a);
    to_keys<kMask>(v, a, key);
#pragma unroll
    for (int j = 0; j < 4; ++j) col[j] = static_cast<int>(4 * c + j);
    return count;
  }
  // Chunk c's scores and mask entries as one load each, without using them, where the chunk is
  // whole and the rows aligned; returns whether it loaded. A kernel issues every chunk's fetch
  // before it needs the first (the loads in flight together), then takes the keys from `keys`.
  __device__ __forceinline__ bool fetch(int64_t c, float4& v, Word& m) const {
    const bool whole = vec && (kMask < 0 || mvec) && 4 * c + 4 <= n;
    if (whole) {
      v = reinterpret_cast<const float4*>(row)[c];
      if constexpr (kMask >= 0) m = reinterpret_cast<const Word*>(mask)[c];
    }
    return whole;
  }
  // Asks L2 for chunks [c, c + count): thread t one 128-byte line of the scores and one of the
  // mask entries, where the row has them.
  __device__ __forceinline__ void prefetch(int64_t c, int64_t count, int t) const {
    const int64_t end = min(n, 4 * (c + count));
    if (4 * c + 32 * t < end) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 4 * c + 32 * t));
    if constexpr (kMask >= 0) {
      constexpr int bytes = kMaskBytes<kMask>;
      const int64_t at = 4 * c + (128 / bytes) * t;
      if (at < end) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(mask) + at * bytes));
      }
    }
  }
  // The keys of chunk c from what fetch loaded (`whole`), else as load reads them; returns how
  // many of its four are in the row.
  __device__ __forceinline__ int keys(int64_t c, bool whole, const float4& v, const Word& m,
                                      uint32_t (&key)[4]) const {
    if (!whole) {
      int col[4];
      return load(c, key, col);
    }
    const float s[4] = {v.x, v.y, v.z, v.w};
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (kMask >= 0) mask_values<kMask>(m, a);
    to_keys<kMask>(s, a, key);
    return 4;
  }
};

// Keys in shared memory (their columns, where a histogram does not read them, 0): chunk c is keys
// 4c .. 4c + 3.
struct KeySource {
  const uint32_t* keys;  // 16-byte aligned
  int m;

  __device__ int64_t chunks() const { return (m + 3) / 4; }
  __device__ void prefetch(int64_t, int64_t, int) const {}  // in shared memory already
  // The keys of chunk c; returns how many of its four there are.
  __device__ __forceinline__ int load_keys(int64_t c, uint32_t (&key)[4]) const {
    const int left = m - 4 * static_cast<int>(c);
    const int count = left >= 4 ? 4 : (left > 0 ? left : 0);
    if (count == 4) {
      const uint4 k4 = reinterpret_cast<const uint4*>(keys)[c];
      key[0] = k4.x, key[1] = k4.y, key[2] = k4.z, key[3] = k4.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) key[j] = j < count ? keys[4 * c + j] : 0u;
    }
    return count;
  }
  __device__ __forceinline__ int load(int64_t c, uint32_t (&key)[4], int (&col)[4]) const {
#pragma unroll
    for (int j = 0; j < 4; ++j) col[j] = 0;
    return load_keys(c, key);
  }
};

// Candidates held in shared memory with their columns (ascending columns).
struct HeldSource : KeySource {
  const int* cols;  // 16-byte aligned

  __device__ __forceinline__ int load(int64_t c, uint32_t (&key)[4], int (&col)[4]) const {
    const int count = load_keys(c, key);
    if (count == 4) {
      const int4 c4 = reinterpret_cast<const int4*>(cols)[c];
      col[0] = c4.x, col[1] = c4.y, col[2] = c4.z, col[3] = c4.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) col[j] = j < count ? cols[4 * c + j] : 0;
    }
    return count;
  }
};

// Counts the keys of `src` whose bits from `high` up equal `prefix` (all of them when high is 32)
// by their digit, bits [shift, high).
template <int kT, typename Src>
__device__ void histogram(const Src& src, int shift, int high, uint32_t prefix, int* hist) {
  for (int b = threadIdx.x; b < kMaxBins; b += kT) hist[b] = 0;
  __syncthreads();
  const uint32_t digit = (1u << (high - shift)) - 1u;
  auto count = [&](const uint32_t(&key)[4], int n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < n && static_cast<uint32_t>(static_cast<uint64_t>(key[j]) >> high) == prefix) {
        atomicAdd(&hist[(key[j] >> shift) & digit], 1);
      }
    }
  };
  const int64_t chunks = src.chunks();
  uint32_t ka[4], kb[4];
  int col[4];
  int64_t c = threadIdx.x;
  for (; c + kT < chunks; c += 2 * kT) {                          // two loads in flight per thread
    src.prefetch(c - threadIdx.x + 2 * kT, 2 * kT, threadIdx.x);  // the next two
    const int na = src.load(c, ka, col);
    const int nb = src.load(c + kT, kb, col);
    count(ka, na);
    count(kb, nb);
  }
  if (c < chunks) count(ka, src.load(c, ka, col));
  __syncthreads();
}

// Inclusive prefix sum of v over the warp's lanes.
__device__ __forceinline__ int warp_scan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Inclusive prefix sum of `v` over the block's kT threads in thread order; `total` gets the sum of
// all. Every thread calls it; `warp_sums` is kT / 32 ints of shared memory, free again on return.
template <int kT>
__device__ __forceinline__ int block_scan(int v, int* warp_sums, int& total) {
  constexpr int kWarps = kT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int x = warp_scan(v);
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int w = lane < kWarps ? warp_sums[lane] : 0;
#pragma unroll
  for (int o = 1; o < kWarps; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, w, o);
    if (lane >= o) w += y;
  }
  const int before = __shfl_sync(0xffffffffu, w, warp > 0 ? warp - 1 : 0);
  total = __shfl_sync(0xffffffffu, w, kWarps - 1);
  __syncthreads();
  return x + (warp > 0 ? before : 0);
}

// The bucket of `hist` (`bins` of them, at most kMaxBins) holding the `need`-th largest key:
// pick[0] = its digit, pick[1] = the rank still needed within it, pick[2] = its count. Thread t of
// kT looks at buckets bins - 1 - P t down to bins - P - P t, P = kMaxBins / kT.
template <int kT>
__device__ void pick_bucket(const int* hist, int bins, int need, int* warp_sums, int* pick) {
  constexpr int P = kMaxBins / kT;
  int c[P], s = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int b = bins - 1 - (P * static_cast<int>(threadIdx.x) + j);
    c[j] = b >= 0 ? hist[b] : 0;
    s += c[j];
  }
  int total;
  const int incl = block_scan<kT>(s, warp_sums, total);
  int above = incl - s;
  if (above < need && incl >= need) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (above + c[j] >= need) {
        pick[0] = bins - 1 - (P * static_cast<int>(threadIdx.x) + j);
        pick[1] = need - above;
        pick[2] = c[j];
        break;
      }
      above += c[j];
    }
  }
  __syncthreads();
}

// Copies the keys of `src` whose top digit (bits 21 to 31) is at least `top` and their columns to
// keys/cols, in ascending column order.
template <int kT, typename Src>
__device__ void hold(const Src& src, uint32_t top, uint32_t* keys, int* cols, int* warp_sums) {
  const int64_t chunks = src.chunks();
  int run = 0;
  for (int64_t base = 0; base < chunks; base += kT) {
    uint32_t key[4];
    int col[4];
    const int n = src.load(base + threadIdx.x, key, col);
    int take = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) take += j < n && (key[j] >> 21) >= top;
    int total;
    int at = run + block_scan<kT>(take, warp_sums, total) - take;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < n && (key[j] >> 21) >= top) {
        keys[at] = key[j];
        cols[at] = col[j];
        ++at;
      }
    }
    run += total;
  }
  __syncthreads();
}

// The classes of four keys, the first n of them in the row: 1 where their bits from `shift` up
// exceed `prefix`, 2 where they equal it, else 0; returns the counts of 1s and 2s packed as
// ones | twos << 16.
__device__ __forceinline__ int classify(const uint32_t (&key)[4], int n, int shift, uint32_t prefix,
                                        int (&cls)[4]) {
  int gt = 0, eq = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t hi = key[j] >> shift;
    cls[j] = j >= n ? 0 : (hi > prefix ? 1 : (hi == prefix ? 2 : 0));
    gt += cls[j] == 1;
    eq += cls[j] == 2;
  }
  return gt | (eq << 16);
}

// Writes four columns by their class (1: greater than the k-th largest's prefix, 2: equal to it,
// 0: neither) at their places: g greater and e equal ones before them, the first `need` equal ones
// chosen; g and e advance past them.
__device__ __forceinline__ void place_chosen(const int (&cls)[4], const int (&col)[4], int need,
                                             int& g, int& e, int32_t* o) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (cls[j] == 1) {
      o[g + min(e, need)] = col[j];
      ++g;
    } else if (cls[j] == 2) {
      if (e < need) o[g + e] = col[j];
      ++e;
    }
  }
}

// Writes the chosen columns of `src` to `o` in ascending order: every key whose bits from `shift`
// up exceed `prefix`, and the first `need` of those where they equal it. A column's place is the
// number of chosen columns before it: the greater ones, plus min(equal ones, need).
template <int kT, typename Src>
__device__ void write_chosen(const Src& src, int shift, uint32_t prefix, int need, int k,
                             int* warp_sums, int32_t* o) {
  const int64_t chunks = src.chunks();
  int gt_run = 0, eq_run = 0;
  for (int64_t base = 0; base < chunks; base += kT) {
    uint32_t key[4];
    int col[4];
    const int n = src.load(base + threadIdx.x, key, col);
    int cls[4];
    const int packed = classify(key, n, shift, prefix, cls);  // at most 4 * kT each per pass
    int total;
    const int before = block_scan<kT>(packed, warp_sums, total) - packed;
    int g = gt_run + (before & 0xffff), e = eq_run + (before >> 16);
    place_chosen(cls, col, need, g, e, o);
    gt_run += total & 0xffff;
    eq_run += total >> 16;
    if (gt_run == k - need && eq_run >= need) break;  // all chosen (the same for every thread)
  }
}

// One digit of the select: the bits below `high` (11 of them, or what is left) of `src`'s keys in
// the bucket `prefix` (their bits from `high` up) holding the k-th largest at rank `need`; returns
// the digit's shift, `prefix` and `need` narrowed to its bucket (pick[2]: that bucket's count).
template <int kT, typename Src>
__device__ int select_digit(const Src& src, uint32_t& prefix, int high, int& need, int* hist,
                            int* warp_sums, int* pick) {
  const int shift = high > 11 ? high - 11 : 0;
  histogram<kT>(src, shift, high, prefix, hist);
  pick_bucket<kT>(hist, 1 << (high - shift), need, warp_sums, pick);
  prefix = (prefix << (high - shift)) | static_cast<uint32_t>(pick[0]);
  need = pick[1];
  return shift;
}

// The select's digits below bit `high` (11 bits each, the last what is left) over `src`, given the
// bucket `prefix` (the keys' bits from `high` up) holding the k-th largest and the rank `need`
// within it; returns the shift of the k-th largest's prefix, `prefix` and `need` updated (the first
// `need` keys equal to it are chosen).
template <int kT, typename Src>
__device__ int select_below(const Src& src, uint32_t& prefix, int high, int& need, int* hist,
                            int* warp_sums, int* pick) {
  while (high > 0) {
    high = select_digit<kT>(src, prefix, high, need, hist, warp_sums, pick);
    if (pick[2] == need) break;  // the bucket holds exactly the keys still needed
  }
  return high;
}

// The select's last two digits over `src`, then the chosen columns written.
template <int kT, typename Src>
__device__ void finish(const Src& src, uint32_t prefix, int need, int k, int* hist, int* warp_sums,
                       int* pick, int32_t* o) {
  const int shift = select_below<kT>(src, prefix, 21, need, hist, warp_sums, pick);
  write_chosen<kT>(src, shift, prefix, need, k, warp_sums, o);
}

struct Params {
  const float* scores;
  int64_t seq, cols;
  int64_t ss0, ss1;  // scores strides: batch, seq
  const int32_t* limit;
  const void* mask;
  int64_t ms0, ms1;  // mask strides: batch, seq
  int k;
  int32_t* out;
  int64_t lo, hi;      // the launch takes the rows of lo < n <= hi columns before their limit
  int64_t stream_min;  // topk_kernel tries the one-read pass on rows longer than this
#ifdef OPSLOT_KERNELS_BENCH
  const uint32_t* hint;  // the bench library's path 13: the one-read pass's threshold a row
#endif
};

// Row r's source (its scores and mask entries before its limit) and output, false for a row of
// another launch (its length outside (lo, hi]). A row with no more than k columns before its limit
// is written here by the row's threads (kRowThreads of them, aligned, or the block's when 0; every
// column before the limit, then the first ones past it) and false returned.
template <int kMask, int kRowThreads>
__device__ bool row_source(const Params& p, int64_t r, RowSource<kMask>& src, int32_t*& o) {
  const int64_t b = r / p.seq, s = r % p.seq;
  const int k = p.k;
  int64_t n = p.cols;
  if (p.limit != nullptr) n = p.limit[r] < 0 ? 0 : (p.limit[r] < n ? p.limit[r] : n);
  if (n <= p.lo || n > p.hi) return false;  // another launch's row
  o = p.out + r * k;
  if (n <= k) {
    if constexpr (kRowThreads > 0) {
      for (int i = threadIdx.x % kRowThreads; i < k; i += kRowThreads) o[i] = i;
    } else {
      for (int i = threadIdx.x; i < k; i += blockDim.x) o[i] = i;
    }
    return false;
  }
  const float* row = p.scores + b * p.ss0 + s * p.ss1;
  const void* mask = nullptr;
  bool mvec = false;
  if constexpr (kMask >= 0) {
    constexpr int bytes = kMaskBytes<kMask>;
    mask = static_cast<const char*>(p.mask) + (b * p.ms0 + s * p.ms1) * bytes;
    mvec = (reinterpret_cast<uintptr_t>(mask) & (4 * bytes - 1)) == 0;
  }
  src = RowSource<kMask>{row, n, (reinterpret_cast<uintptr_t>(row) & 15) == 0, mask, mvec};
  return true;
}

}  // namespace
}  // namespace opslot::topk
