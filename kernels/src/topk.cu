// The k largest values' columns of each row of an fp32 matrix (opslot_kernels/topk.h): a radix
// select over the values' order bits (a shared-memory histogram per digit), then one pass that
// writes the chosen columns in ascending order through prefix sums. Rows of up to 2048 columns: a
// warp per row, its keys in registers (topk_warp_kernel); up to 4096: a block per row, the keys in
// registers (topk_reg_kernel); longer ones: a block per row (topk_kernel), reading rows of 16385 to
// 65536 columns once (candidates above a rising threshold in shared memory: stream_topk), others
// twice.
#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/topk.h"

namespace opslot::topk {
namespace {

constexpr const char* kName = "opslot_topk_indices";
constexpr int kMaxBins = 2048;  // an 11-bit digit; pick_bucket: kMaxBins / threads buckets each
constexpr int kHeld = 8192;     // keys at or above the top digit's bucket held in shared memory
constexpr size_t kHeldSmem = 2 * sizeof(uint32_t) * kHeld;  // keys and columns: 64 KB
// The one-read pass of topk_kernel (stream_topk): rows of up to kStreamMaxCols columns (a column
// fits 16 bits) and k up to kStreamMaxK; a round is kRound 16-byte chunks a thread, all loaded
// before the first is used; candidates of up to stream_cap keys (a round's and k's, and slack for
// ties) with their columns, then two bitmaps of the row's columns.
constexpr int kRound = 4;
constexpr int kStreamMaxK = 2048;
constexpr int kStreamMaxCols = 65536;
constexpr int64_t kStreamMinCols = 16384;  // shorter rows measured faster with the two-read path
// For blocks of kT threads: keys a round, candidates, the pass's shared memory (82 KB at 512
// threads), the kernel's.
constexpr int round_keys(int kT) { return 4 * kRound * kT; }
constexpr int stream_cap(int kT) { return kStreamMaxK + round_keys(kT) + 1024; }
constexpr size_t stream_smem(int kT) {
  return (sizeof(uint32_t) + sizeof(uint16_t)) * stream_cap(kT) + 2 * kStreamMaxCols / 8;
}
constexpr size_t kernel_smem(int kT) {
  return stream_smem(kT) > kHeldSmem ? stream_smem(kT) : kHeldSmem;
}

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

// The block's least of `lo` and greatest of `hi` (span: 2 (kT / 32) words of shared memory, free
// again after the next barrier).
template <int kT>
__device__ void block_span(uint32_t lo, uint32_t hi, uint32_t* span, uint32_t& min_lo,
                           uint32_t& max_hi) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (lane == 0) span[warp] = lo, span[(kT / 32) + warp] = hi;
  __syncthreads();
  min_lo = span[0], max_hi = span[(kT / 32)];
#pragma unroll
  for (int w = 1; w < (kT / 32); ++w)
    min_lo = min(min_lo, span[w]), max_hi = max(max_hi, span[(kT / 32) + w]);
}

// The shift of the digit that spreads keys from lo to hi over at most 1025 buckets.
__device__ __forceinline__ int span_shift(uint32_t lo, uint32_t hi) {
  return hi > lo ? max(0, 22 - __clz(static_cast<int>(hi - lo))) : 0;
}

// The k-th largest of keys from lo to hi (at least k of them) located by the digit spanning that
// range: `count(shift, base)` adds each key to hist[(key >> shift) - base]. Returns the digit's
// shift, `top` the k-th largest's key >> shift, `need` its rank in that bucket, `exact` whether the
// bucket holds exactly the keys needed.
template <int kT, typename Count>
__device__ int span_select(uint32_t lo, uint32_t hi, int k, int* hist, int* warp_sums, int* pick,
                           uint32_t& top, int& need, bool& exact, Count count) {
  const int shift = span_shift(lo, hi);
  const uint32_t base = lo >> shift;
  const int bins = static_cast<int>((hi >> shift) - base) + 1;
  for (int b = threadIdx.x; b < bins; b += kT) hist[b] = 0;
  __syncthreads();
  count(shift, base);
  __syncthreads();
  pick_bucket<kT>(hist, bins, k, warp_sums, pick);
  top = base + static_cast<uint32_t>(pick[0]);
  need = pick[1];
  exact = pick[2] == need;
  return shift;
}

// span_select over keys in shared memory.
template <int kT>
__device__ int span_select(const KeySource& src, uint32_t lo, uint32_t hi, int k, int* hist,
                           int* warp_sums, int* pick, uint32_t& top, int& need, bool& exact) {
  return span_select<kT>(lo, hi, k, hist, warp_sums, pick, top, need, exact,
                         [&](int shift, uint32_t base) {
                           for (int64_t c = threadIdx.x; c < src.chunks(); c += kT) {
                             uint32_t key[4];
                             const int n = src.load_keys(c, key);
#pragma unroll
                             for (int j = 0; j < 4; ++j) {
                               if (j < n) atomicAdd(&hist[(key[j] >> shift) - base], 1);
                             }
                           }
                         });
}

// The m candidates in keys/cols (from lo to hi; m >= k) cut to those at or above the bucket of the
// k-th largest, by the digit spanning lo to hi (and the next 11 bits where that bucket holds more
// than 1024), in place, their order kept.
// Returns the bucket's lowest key, the next lo; `kept` gets how many stay (at least k).
template <int kT>
__device__ uint32_t stream_compact(uint32_t* keys, uint16_t* cols, int m, int k, uint32_t lo,
                                   uint32_t hi, int* hist, int* warp_sums, int* pick, int& kept) {
  const KeySource src{keys, m};
  uint32_t prefix;
  int need;
  bool exact;
  int shift = span_select<kT>(src, lo, hi, k, hist, warp_sums, pick, prefix, need, exact);
  if (!exact && shift > 0 && pick[2] > 1024) {  // a crowded bucket: its next 11 bits too
    shift = select_digit<kT>(src, prefix, shift, need, hist, warp_sums, pick);
  }
  const uint32_t cut = prefix << shift;
  int run = 0;
  for (int base = 0; base < m; base += 4 * kT) {  // writes land at or before what was read
    const int i0 = base + 4 * static_cast<int>(threadIdx.x);
    uint32_t key[4];
    uint16_t col[4];
    int take = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      key[j] = i0 + j < m ? keys[i0 + j] : 0u;
      col[j] = i0 + j < m ? cols[i0 + j] : 0;
      take += i0 + j < m && key[j] >= cut;
    }
    int total;
    int at = run + block_scan<kT>(take, warp_sums, total) - take;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i0 + j < m && key[j] >= cut) {
        keys[at] = key[j];
        cols[at] = col[j];
        ++at;
      }
    }
    run += total;
  }
  __syncthreads();
  kept = run;
  return cut;
}

// The chosen columns of the m candidates in keys/cols (every key whose bits from `shift` up exceed
// `prefix`, and the first `need` by column of those equal to it; k in all) written to `o` in
// ascending order: the candidates set their bits in two bitmaps of the row's n columns, then a
// column's place is the greater ones before it plus min(equal ones before it, need). The columns
// are placed in shared memory over the keys (read by then) and stored from there in order: each
// thread's columns land at scattered places, which stored directly to global memory took a
// transaction per column.
template <int kT>
__device__ void stream_write(uint32_t* keys, const uint16_t* cols, int m, int64_t n, int k,
                             int shift, uint32_t prefix, int need, uint32_t* gt_bits,
                             uint32_t* eq_bits, int* warp_sums, int32_t* o) {
  constexpr int kW = kStreamMaxCols / 32 / kT;  // bitmap words a thread scans
  const int words = static_cast<int>((n + 31) / 32);
  for (int w = threadIdx.x; w < words; w += kT) gt_bits[w] = eq_bits[w] = 0u;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += kT) {
    const uint32_t hi = keys[i] >> shift;
    const int c = cols[i];
    if (hi > prefix) atomicOr(&gt_bits[c >> 5], 1u << (c & 31));
    if (hi == prefix) atomicOr(&eq_bits[c >> 5], 1u << (c & 31));
  }
  __syncthreads();
  uint32_t gw[kW], ew[kW];
  int packed = 0;
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    const int w = kW * static_cast<int>(threadIdx.x) + j;
    gw[j] = w < words ? gt_bits[w] : 0u;
    ew[j] = w < words ? eq_bits[w] : 0u;
    packed += __popc(gw[j]) | (__popc(ew[j]) << 16);  // at most k and stream_cap(kT): no carry
  }
  int total;
  const int before = block_scan<kT>(packed, warp_sums, total) - packed;
  int g = before & 0xffff, e = before >> 16;
  auto* placed = reinterpret_cast<int32_t*>(keys);  // 16-byte aligned, stream_cap(kT) >= k
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    const int c0 = 32 * (kW * static_cast<int>(threadIdx.x) + j);
    for (uint32_t bits = gw[j] | ew[j]; bits != 0u; bits &= bits - 1u) {
      const int b = __ffs(static_cast<int>(bits)) - 1;
      if ((gw[j] >> b) & 1u) {
        placed[g + min(e, need)] = c0 + b;
        ++g;
      } else {
        if (e < need) placed[g + e] = c0 + b;
        ++e;
      }
    }
  }
  __syncthreads();
  if (k % 4 == 0 && (reinterpret_cast<uintptr_t>(o) & 15) == 0) {
    for (int i = threadIdx.x; i < k / 4; i += kT) {
      reinterpret_cast<int4*>(o)[i] = reinterpret_cast<const int4*>(placed)[i];
    }
  } else {
    for (int i = threadIdx.x; i < k; i += kT) o[i] = placed[i];
  }
}

// Where the one-read pass takes its first threshold lo on a row of more than one round. kRoundKth
// (production): the floor of the bucket holding the first round's k-th largest (every later key
// below it has k others above: never too high; where a row's keys look alike along it, a quarter of
// a 64k row stays, so the candidates overflow and are cut). kSample (the bench library's paths 15
// and 16, an experiment): that of the first round's sample_rank-th largest, the rank at which the
// row's k-th largest is expected in a round plus four standard deviations; where it proves too
// high, lowered to kRoundKth's (stream_topk). Side by side on an H200 it was 1.09-1.13x faster on
// GLM-5's 64k rows without a mask, 1.02-1.04x with the bool mask the slot passes, and 0.73-0.77x
// where the scores fall along the row (docs/kernels.md). kGiven (the bench library's paths 13 and
// 14): a threshold given per row (opslot_topk_set_hint); a row it leaves with fewer than k
// candidates takes the two-read path.
enum Start { kRoundKth, kSample, kGiven };

// kSample's rank in a round of m of the row's n keys (n > m): f m + 4 sqrt(f m) + 4, f = k / n,
// at most k.
__device__ __forceinline__ int sample_rank(int k, int m, int64_t n) {
  const float fm = static_cast<float>(k) * static_cast<float>(m) / static_cast<float>(n);
  return min(k, static_cast<int>(ceilf(fm + 4.f * sqrtf(fm) + 4.f)));
}

// Where stream_topk's time goes, in the bench library (opslot_topk_probe_phases): thread 0's
// clock between marks, summed over rows by phase (0 the first round's select of lo, 1 the rounds,
// 2 the cuts, 3 the select, 4 the write), then rows, cuts and rounds counted, rows whose sampled lo
// was lowered and rows handed to the two-read path; nothing in production.
#ifdef OPSLOT_KERNELS_BENCH
constexpr int kProbes = 10;
__device__ unsigned long long g_phase[kProbes];
struct PhaseClock {
  long long t;
  __device__ PhaseClock() { t = clock64(); }
  __device__ void mark(int phase) {
    if (threadIdx.x != 0) return;
    const long long now = clock64();
    atomicAdd(&g_phase[phase], static_cast<unsigned long long>(now - t));
    t = now;
  }
  __device__ void count(int what) {
    if (threadIdx.x == 0) atomicAdd(&g_phase[what], 1ull);
  }
};
#else
struct PhaseClock {
  __device__ void mark(int) {}
  __device__ void count(int) {}
};
#endif

// The row read once: rounds of round_keys(kT) keys, each key at or above the threshold `lo`
// appended to the candidates in shared memory (a warp's by one atomicAdd: their order is not fixed,
// the result does not depend on it). The first lo on the first round's keys (Start). A round that
// would overflow the candidates is dropped, the candidates cut to those at or above the k-th
// largest's bucket (stream_compact, which raises lo to that bucket's floor: every key below it has
// k others above) and the round taken again from registers. kSample lowers a sampled lo that proves
// too high to kRoundKth's: where the second round adds fewer than half the sampled rank (the row's
// keys falling, seen early) or the row ends with fewer than k candidates, the pass starts again
// from the first round with the lower lo. Then the select over the candidates (its first digit
// spanning them) and the bitmap write. Returns false, before writing anything, for rows too long,
// k too large, or a round that overflows twice (ties at the k-th largest filling the candidates),
// and for kGiven a row left with fewer than k candidates: the row then takes the two-read path.
// Each round asks L2 for the next one (kAhead 1), or for the one after it (2, the bench library's
// path 12; the first round for both).
template <int kMask, int kT, int kAhead, int kStart>
__device__ bool stream_topk(const RowSource<kMask>& src, int k, unsigned char* smem, int* hist,
                            int* warp_sums, int* pick, int* counts, uint32_t* span, int32_t* o,
                            uint32_t hint = 0u) {
  if (src.n > kStreamMaxCols || k > kStreamMaxK) return false;  // the caller checked stream_min
  auto* keys = reinterpret_cast<uint32_t*>(smem);
  auto* cols = reinterpret_cast<uint16_t*>(keys + stream_cap(kT));
  auto* gt_bits = reinterpret_cast<uint32_t*>(cols + stream_cap(kT));
  auto* eq_bits = gt_bits + kStreamMaxCols / 32;
  if (threadIdx.x < 3) counts[threadIdx.x] = 0;
  PhaseClock clock;
  clock.count(5);
  constexpr int64_t kStep = kRound * kT;  // chunks a round
  const int64_t chunks = src.chunks();
  const int lane = threadIdx.x & 31;
  uint32_t lo = 0u, top = 0u;  // the bucket of the first round's k-th largest (key >> high)
  int rank = k;                // kSample: the sampled rank
  bool sampled = false;        // kSample: lo still the sampled one
  uint32_t first_bin = 0u;     // kSample: the first round's histogram's first bucket and
  int bins = 0;                // buckets (kept in hist until a cut or the select)
  uint32_t mx = 0u;            // the greatest key this thread appended
  int high = 0, need = 0;      // and the rank in it: the whole row's where it is one round
  bool exact = false;          // the bucket holds exactly the keys needed
  int start = 0, round = 0;    // candidates before this round; rounds taken, the retries counted
  // The round of chunks from `base` (the first: lo chosen on its keys): its keys at or above lo
  // appended; returns how many, -1 where it overflows twice. One call site: inlined once.
  auto take_round = [&](int64_t base, bool first) -> int {
    uint32_t key[kRound][4];
    int cnt[kRound];
    {
      float4 v[kRound];
      typename RowSource<kMask>::Word mw[kRound];
      bool whole[kRound];
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
        whole[i] = src.fetch(base + i * kT + threadIdx.x, v[i], mw[i]);
      }
      if constexpr (kAhead == 1) {  // the next round
        if (base + kStep < chunks) src.prefetch(base + kStep, kStep, threadIdx.x);
      } else {  // the round after next (the first round: the next one too)
        if (base == 0 && kStep < chunks) src.prefetch(kStep, kStep, threadIdx.x);
        if (base + 2 * kStep < chunks) src.prefetch(base + 2 * kStep, kStep, threadIdx.x);
      }
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
        cnt[i] = src.keys(base + i * kT + threadIdx.x, whole[i], v[i], mw[i], key[i]);
      }
    }
    if (first && kStart == kGiven) {
      lo = hint;
    } else if (first) {  // the round has more than k keys (the row more than k, a round >= k)
      uint32_t least = 0xffffffffu;
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (j < cnt[i]) least = min(least, key[i][j]), mx = max(mx, key[i][j]);
        }
      }
      uint32_t a, b;
      block_span<kT>(least, mx, span, a, b);
      if (kStart == kSample && chunks > kStep) rank = sample_rank(k, round_keys(kT), src.n);
      high = span_select<kT>(a, b, rank, hist, warp_sums, pick, top, need, exact,
                             [&](int shift, uint32_t lowest) {
#pragma unroll
                               for (int i = 0; i < kRound; ++i) {
#pragma unroll
                                 for (int j = 0; j < 4; ++j) {
                                   if (j < cnt[i])
                                     atomicAdd(&hist[(key[i][j] >> shift) - lowest], 1);
                                 }
                               }
                             });
      lo = top << high;
      if (kStart == kSample && rank < k) {
        sampled = true;
        first_bin = a >> high;
        bins = static_cast<int>((b >> high) - first_bin) + 1;
      }
      clock.mark(0);
    }
    for (int attempt = 0;; ++attempt, ++round) {
      // counts[round % 3] takes this round's candidates; thread 0 clears the next one, which every
      // thread read two rounds ago, before the last barrier.
      if (threadIdx.x == 0) counts[(round + 1) % 3] = 0;
      int take = 0;
#pragma unroll
      for (int i = 0; i < kRound; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) take += j < cnt[i] && key[i][j] >= lo;
      }
      bool over = false;
      if (__any_sync(0xffffffffu, take != 0)) {
        const int incl = warp_scan(take);
        int at = 0;
        if (lane == 31) at = atomicAdd(&counts[round % 3], incl);
        at = __shfl_sync(0xffffffffu, at, 31);
        over = start + at + __shfl_sync(0xffffffffu, incl, 31) > stream_cap(kT);
        if (!over) {
          at += start + incl - take;
#pragma unroll
          for (int i = 0; i < kRound; ++i) {
            const int c0 = 4 * static_cast<int>(base + i * kT + threadIdx.x);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (j < cnt[i] && key[i][j] >= lo) {
                keys[at] = key[i][j];
                cols[at] = static_cast<uint16_t>(c0 + j);
                mx = max(mx, key[i][j]);
                ++at;
              }
            }
          }
        }
      }
      const bool overflow = __syncthreads_or(over);
      clock.mark(1);
      clock.count(7);
      if (!overflow) {
        const int added = counts[round % 3];
        start += added;
        ++round;
        return added;
      }
      if (attempt == 1) return -1;
      uint32_t unused, hi;
      block_span<kT>(lo, mx, span, unused, hi);
      lo = stream_compact<kT>(keys, cols, start, k, lo, hi, hist, warp_sums, pick, start);
      clock.mark(2);
      clock.count(6);
    }
  };
  // The rounds. kSample's lo lowered where the second round adds fewer than half the sampled rank
  // or the row ends with fewer than k candidates: the pass starts again from kRoundKth's lo, picked
  // on the first round's histogram, still in hist (no cut has run before either check: the first
  // two rounds fit the candidates, and a cut leaves at least k).
  for (int64_t base = 0; base < chunks;) {
    const int added = take_round(base, round == 0);
    if (added < 0) {
      clock.count(9);
      return false;
    }
    base += kStep;
    const bool early = base == 2 * kStep && 2 * added < rank;
    if (kStart == kSample && sampled && (early || (base >= chunks && start < k))) {
      clock.count(8);
      pick_bucket<kT>(hist, bins, k, warp_sums, pick);
      lo = (first_bin + static_cast<uint32_t>(pick[0])) << high;
      sampled = false;
      start = 0;
      base = 0;
    }
  }
  if (kStart != kRoundKth && start < k) {
    clock.count(9);
    return false;
  }
  // The select over the candidates (at least k, from lo to the greatest). A row of one round
  // without a cut has the bucket of its k-th largest from the first round.
  const KeySource cand{keys, start};
  if (kStart == kGiven || chunks > kStep) {
    uint32_t unused, hi;
    block_span<kT>(lo, mx, span, unused, hi);
    high = span_select<kT>(cand, lo, hi, k, hist, warp_sums, pick, top, need, exact);
  }
  uint32_t prefix = top;
  const int shift =
      exact ? high : select_below<kT>(cand, prefix, high, need, hist, warp_sums, pick);
  clock.mark(3);
  stream_write<kT>(keys, cols, start, src.n, k, shift, prefix, need, gt_bits, eq_bits, warp_sums,
                   o);
  clock.mark(4);
  return true;
}

// Rows longer than the register kernel takes: the one-read pass (stream_topk) where it takes the
// row; else the top digit's histogram over the row, then the rest over the keys at or above its
// bucket held in shared memory (the row read twice), or over the row.
template <int kMask, int kT, int kAhead = 1, int kStart = kRoundKth>
__global__ void __launch_bounds__(kT, kT == 512 ? 2 : 3) topk_kernel(const Params p) {
  // stream_topk's candidates and bitmaps, or kHeld keys and columns
  extern __shared__ uint4 held[];
  __shared__ int hist[kMaxBins];
  __shared__ int warp_sums[(kT / 32)];
  __shared__ int pick[3];
  __shared__ int counts[3];
  __shared__ uint32_t span[2 * (kT / 32)];
  RowSource<kMask> src;
  int32_t* o;
  if (!row_source<kMask, 0>(p, blockIdx.x, src, o)) return;
  const int k = p.k;
  uint32_t hint = 0u;
#ifdef OPSLOT_KERNELS_BENCH
  if constexpr (kStart == kGiven) hint = p.hint[blockIdx.x];
#endif
  if (src.n > p.stream_min &&
      stream_topk<kMask, kT, kAhead, kStart>(src, k, reinterpret_cast<unsigned char*>(held), hist,
                                             warp_sums, pick, counts, span, o, hint)) {
    return;
  }
  histogram<kT>(src, 21, 32, 0u, hist);  // the top digit, bits 21 to 31
  pick_bucket<kT>(hist, kMaxBins, k, warp_sums, pick);
  const uint32_t top = static_cast<uint32_t>(pick[0]);
  const int need = pick[1], count = pick[2];
  if (count == need) {  // the bucket holds exactly the keys still needed
    write_chosen<kT>(src, 21, top, need, k, warp_sums, o);
    return;
  }
  const int m = k - need + count;  // keys in the bucket or above it
  if (m <= kHeld) {                // held in shared memory: the row is read twice in all
    uint32_t* keys = reinterpret_cast<uint32_t*>(held);
    int* held_cols = reinterpret_cast<int*>(keys + kHeld);
    hold<kT>(src, top, keys, held_cols, warp_sums);
    finish<kT>(HeldSource{{keys, m}, held_cols}, top, need, k, hist, warp_sums, pick, o);
  } else {  // read from global memory by every digit
    finish<kT>(src, top, need, k, hist, warp_sums, pick, o);
  }
}

// ---- rows of at most 16 kT columns: the keys in registers, the row read once -------------------
constexpr int kRegChunks = 4;  // 16-byte chunks a thread holds: chunk i * kT + thread, 16 keys

// Blocks per SM the register kernel is compiled for: six 256-thread blocks (40 registers);
// 128-thread blocks stay at 8 (1536 threads would spill pick_bucket's 16 buckets). A row's select
// is a chain of dependent steps: more rows in flight per SM, not fewer instructions, is what
// shortened it (docs/results/dsa_indexer_h200.md).
constexpr int reg_blocks_per_sm(int threads) { return threads == 128 ? 8 : 1536 / threads; }

// Rows of up to 16 kT columns, one block of kT threads each: each thread loads its 16 keys once,
// the three digits' histograms count them from registers, and the chosen columns are written a
// chunk row at a time (a block-wide prefix sum each).
template <int kMask, int kT>
__global__ void __launch_bounds__(kT, reg_blocks_per_sm(kT)) topk_reg_kernel(const Params p) {
  __shared__ int hist[kMaxBins];
  __shared__ int warp_sums[kT / 32];
  __shared__ int pick[3];
  RowSource<kMask> src;
  int32_t* o;
  if (!row_source<kMask, 0>(p, blockIdx.x, src, o)) return;
  const int k = p.k;
  const int iters = static_cast<int>((src.chunks() + kT - 1) / kT);  // chunk rows, <= kRegChunks
  uint32_t key[kRegChunks][4];
  int cnt[kRegChunks];
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    int col[4];
    cnt[i] = src.load(i * kT + threadIdx.x, key[i], col);  // 0 past the row's end: nothing read
  }
  uint32_t prefix = 0;
  int need = k, high = 32, shift = 21;
  for (int d = 0; d < 3; ++d) {  // digits of 11, 11 and 10 bits
    shift = d == 0 ? 21 : (d == 1 ? 10 : 0);
    for (int b = threadIdx.x; b < kMaxBins; b += kT) hist[b] = 0;
    __syncthreads();
    const uint32_t digit = (1u << (high - shift)) - 1u;
#pragma unroll
    for (int i = 0; i < kRegChunks; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < cnt[i] &&
            static_cast<uint32_t>(static_cast<uint64_t>(key[i][j]) >> high) == prefix) {
          atomicAdd(&hist[(key[i][j] >> shift) & digit], 1);
        }
      }
    }
    __syncthreads();
    pick_bucket<kT>(hist, 1 << (high - shift), need, warp_sums, pick);
    prefix = (prefix << (high - shift)) | static_cast<uint32_t>(pick[0]);
    need = pick[1];
    high = shift;
    if (pick[2] == need) break;  // the bucket holds exactly the keys still needed
  }
  // As write_chosen: a column's place is the chosen ones before it, the greater ones plus
  // min(equal ones, need); column order is chunk row i, then thread, then j.
  int gt_run = 0, eq_run = 0;
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i) {
    if (i >= iters || (gt_run == k - need && eq_run >= need)) break;  // the same for every thread
    int cls[4];
    const int packed = classify(key[i], cnt[i], shift, prefix, cls);  // at most 4 kT each
    int total;
    const int before = block_scan<kT>(packed, warp_sums, total) - packed;
    int g = gt_run + (before & 0xffff), e = eq_run + (before >> 16);
    const int c0 = 4 * (i * kT + static_cast<int>(threadIdx.x));
    const int col[4] = {c0, c0 + 1, c0 + 2, c0 + 3};
    place_chosen(cls, col, need, g, e, o);
    gt_run += total & 0xffff;
    eq_run += total >> 16;
  }
}

// ---- rows of up to 8192 columns: kG warps per row, its keys in registers ------------------------
// No block-wide step: a row's chain is warp shuffles and its own histogram, and a block of
// kRowWarps warps selects that many rows. One warp a row up to 2048 columns; two (without a mask)
// and four a row on longer rows, in step by a named barrier where one warp needs only __syncwarp
// (group_warps; the bench library also eight, on rows of up to 16384 columns).
constexpr int kRowWarps = 4;

// Warps of a block of the warp kernel with kG warps a row: kRowWarps, or one row of kG.
constexpr int block_warps(int g) { return g > kRowWarps ? g : kRowWarps; }

// The row's kG warps in step (group: the row's place in the block; barrier 0 is __syncthreads).
template <int kG>
__device__ __forceinline__ void group_sync(int group) {
  if constexpr (kG == 1) {
    __syncwarp();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(32 * kG) : "memory");
  }
}

// Blocks of the warp kernel per SM it is compiled for: the keys take 4 kC registers a lane (and
// the mask's words until they are keys), the histograms 8 KB a warp. No spills: kC 8 at 92-96
// registers (20 rows per SM; 6 blocks spill), kC 16 at 123 without a mask (16 rows), 134-168 with.
// Blocks of 8 warps (the bench library's rows of 8 warps): two.
constexpr int warp_blocks_per_sm(int mask, int chunks, int g = 1) {
  return g > kRowWarps ? 2 : (chunks <= 8 ? 5 : (mask < 0 ? 4 : 3));
}

// No key: a place past the row's end in the warp kernel. order_key gives none (a valid key is at
// least -inf's, kHiddenKey), so its top digit's bucket, 0, holds no valid key, and no prefix of a
// later digit (of the bucket holding the k-th largest) matches it.
constexpr uint32_t kNoKey = 0u;

// Counts the warp's keys (chunk rows 0 .. rows_of_chunks - 1) whose bits from kHigh up equal
// `prefix` (all but kNoKey when kHigh is 32) by their digit, bits [kShift, kHigh), into the row's
// histogram (its kG warps': `member` is the warp's place among them, `group` the row's).
template <int kC, int kShift, int kHigh, int kG>
__device__ __forceinline__ void warp_count(const uint32_t (&key)[kC][4], int rows_of_chunks,
                                           uint32_t prefix, int* hist, int member, int group) {
  constexpr int kBins = 1 << (kHigh - kShift);
  const int lane = threadIdx.x & 31;
  group_sync<kG>(group);  // the previous digit's histogram read by every lane
#pragma unroll
  for (int q = 0; q < kBins / 128 / kG; ++q) {
    reinterpret_cast<int4*>(hist)[(q * kG + member) * 32 + lane] = make_int4(0, 0, 0, 0);
  }
  group_sync<kG>(group);
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    if (i >= rows_of_chunks) break;  // warp-uniform
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // key 0: past the row's end (kNoKey)
      const bool in = kHigh < 32 ? (key[i][j] >> (kHigh & 31)) == prefix : key[i][j] != kNoKey;
      if (in) atomicAdd(&hist[(key[i][j] >> kShift) & (kBins - 1)], 1);
    }
  }
  group_sync<kG>(group);
}

// The bucket of the warp's histogram (kBins buckets) holding the need-th largest key, on every
// lane: its digit, the rank still needed within it and its count. Lane L sums buckets kBins - kPer
// (L + 1) to kBins - 1 - kPer L (its 16-byte pieces in an order rotated by L: no bank conflicts);
// a warp scan finds the lane whose buckets hold the need-th key, a second one, over that lane's
// buckets (kSub a lane, the top ones first), the bucket.
template <int kBins>
__device__ __forceinline__ void warp_pick(const int* hist, int need, int& digit, int& rank,
                                          int& count) {
  constexpr int kPer = kBins / 32, kPieces = kPer / 4, kSub = kPer / 32;
  const int lane = threadIdx.x & 31;
  const int4* mine = reinterpret_cast<const int4*>(hist + kBins - kPer * (lane + 1));
  int s = 0;
#pragma unroll
  for (int q = 0; q < kPieces; ++q) {
    const int4 v = mine[(q + lane) % kPieces];
    s += v.x + v.y + v.z + v.w;
  }
  int incl = warp_scan(s);
  const int src = __ffs(__ballot_sync(0xffffffffu, incl - s < need && incl >= need)) - 1;
  const int above = __shfl_sync(0xffffffffu, incl - s, src);
  const int top = kBins - 1 - kPer * src - kSub * lane;
  int c[kSub];
  s = 0;
#pragma unroll
  for (int j = 0; j < kSub; ++j) {
    c[j] = hist[top - j];
    s += c[j];
  }
  incl = above + warp_scan(s);
  int a = incl - s;
  const int src2 = __ffs(__ballot_sync(0xffffffffu, a < need && incl >= need)) - 1;
  int d = top, r = need - a, n = c[0];
#pragma unroll
  for (int j = 0; j < kSub; ++j) {
    if (a < need && a + c[j] >= need) d = top - j, r = need - a, n = c[j];
    a += c[j];
  }
  digit = __shfl_sync(0xffffffffu, d, src2);
  rank = __shfl_sync(0xffffffffu, r, src2);
  count = __shfl_sync(0xffffffffu, n, src2);
}

// Rows of up to 128 kC kG columns, kG warps each (the latest rows first: with causal limits, the
// longest): each lane loads its 4 kC keys once (chunk i * 32 kG + 32 member + lane), the digits
// count them from registers into the row's histogram, which each of its warps reads whole for the
// same pick, and the chosen columns are written a chunk row at a time.
template <int kMask, int kC, int kG = 1>
__global__ void __launch_bounds__(32 * block_warps(kG), warp_blocks_per_sm(kMask, kC, kG))
    topk_warp_kernel(const Params p, int rows) {
  constexpr int kRows = block_warps(kG) / kG, kW = 32 * kG;  // rows a block, chunks a chunk row
  __shared__ __align__(16) int hists[kRows][kMaxBins];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / kG, member = warp % kG, at = 32 * member + lane;
  const int r = rows - 1 - (static_cast<int>(blockIdx.x) * kRows + group);
  RowSource<kMask> src;
  int32_t* o;
  if (r < 0 || !row_source<kMask, kW>(p, r, src, o)) return;
  int* hist = hists[group];
  const int k = p.k;
  const int chunks = static_cast<int>(src.chunks());
  const int iters = (chunks + kW - 1) / kW;  // chunk rows holding keys
  float4 v[kC];
  typename RowSource<kMask>::Word m[kC];
  bool whole[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) whole[i] = src.fetch(i * kW + at, v[i], m[i]);
  uint32_t key[kC][4];
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const int n = src.keys(i * kW + at, whole[i], v[i], m[i], key[i]);  // 0 past the row's end
#pragma unroll
    for (int j = 0; j < 4; ++j) key[i][j] = j < n ? key[i][j] : kNoKey;
  }
  int digit, rank, count;
  warp_count<kC, 21, 32, kG>(key, iters, 0u, hist, member, group);
  warp_pick<kMaxBins>(hist, k, digit, rank, count);
  uint32_t prefix = static_cast<uint32_t>(digit);
  int need = rank, shift = 21;
  if (count != need) {  // else the bucket holds exactly the keys still needed
    warp_count<kC, 10, 21, kG>(key, iters, prefix, hist, member, group);
    warp_pick<kMaxBins>(hist, need, digit, rank, count);
    prefix = (prefix << 11) | static_cast<uint32_t>(digit);
    need = rank, shift = 10;
    if (count != need) {
      warp_count<kC, 0, 10, kG>(key, iters, prefix, hist, member, group);
      warp_pick<kMaxBins / 2>(hist, need, digit, rank, count);
      prefix = (prefix << 10) | static_cast<uint32_t>(digit);
      need = rank, shift = 0;
    }
  }
  // As write_chosen, a warp scan per chunk row (and the row's warps' sums through shared memory);
  // column order is chunk row i, then warp, lane, j.
  int gt_run = 0, eq_run = 0;
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    if (i >= iters || (gt_run == k - need && eq_run >= need)) break;  // uniform in the row
    int cls[4];  // n = 4: kNoKey is below every prefix
    const int packed = classify(key[i], 4, shift, prefix, cls);  // at most 4 kW each
    const int incl = warp_scan(packed);
    int total = __shfl_sync(0xffffffffu, incl, 31);
    int before = incl - packed;
    if constexpr (kG > 1) {  // slot i % 2 is written again two rows on, past the next barrier
      __shared__ int sums[kRows][2][kG];
      if (lane == 31) sums[group][i % 2][member] = total;
      group_sync<kG>(group);
      total = 0;
#pragma unroll
      for (int w = 0; w < kG; ++w) {
        const int t = sums[group][i % 2][w];
        before += w < member ? t : 0;
        total += t;
      }
    }
    int g = gt_run + (before & 0xffff), e = eq_run + (before >> 16);
    const int c0 = 4 * (i * kW + at);
    const int col[4] = {c0, c0 + 1, c0 + 2, c0 + 3};
    place_chosen(cls, col, need, g, e, o);
    gt_run += total & 0xffff;
    eq_run += total >> 16;
  }
}

// The bench library's kernel choice: opslot_topk_set_tuning's path (opslot_kernels/bench.h lists
// them), 0 in production.
#ifdef OPSLOT_KERNELS_BENCH
int g_path = 0;
constexpr int kLastPath = 16;
const uint32_t* g_hint = nullptr;  // paths 13 and 14's thresholds (opslot_topk_set_hint)
#else
constexpr int g_path = 0;
#endif
bool all_rows_two_read() { return g_path == 1 || g_path == 4; }
// Whether the warp kernel and the split launch with limits run as in production.
bool production_short_rows() { return g_path == 0 || g_path == 3 || g_path >= 6; }
// Whether rows of 2049 to 16384 columns take production's kernels (path 6: those of 5cb1570).
bool production_middle_rows() { return production_short_rows() && g_path != 6; }
// Rows of topk_kernel longer than this try its one-read pass.
int64_t stream_min_cols() {
  return g_path == 3 || g_path == 4 ? INT64_MAX : (g_path == 5 ? 0 : kStreamMinCols);
}

// Chunk rows a lane of the warp kernel holds for rows of `cols` columns (4 keys a chunk), 0 when
// it does not take them one warp a row: rows up to 2048 columns (the bench library's path 2:
// none). Rows of up to 4096 columns (32 chunk rows, 187-255 registers: 8 rows per SM) measured
// 1.5-1.6x slower than the block register kernel (docs/results/dsa_indexer_h200.md).
constexpr int64_t kWarpMaxCols = 128 * 16;
int warp_chunks(int64_t cols) {
  if (!production_short_rows()) return 0;
  for (int c : {8, 16}) {
    if (cols <= 128 * c) return c;  // the last: kWarpMaxCols
  }
  return 0;
}

// Threads of the register kernel for rows of `cols` columns (16 keys a thread), 0 for the
// two-read kernel: rows up to 4096 columns in registers (the bench library's path 1: none). The
// 128-thread blocks for rows of up to 2048 columns only in the bench library (path 2): production
// gives those rows to the warp kernel. 512 threads for rows up to 8192 columns measured as fast as
// the two-read kernel, 1024 threads for rows up to 16384 slower (docs/results/dsa_indexer_h200.md).
constexpr int64_t kRegMaxCols = 4 * kRegChunks * 256;
int reg_threads(int64_t cols) {
  if (all_rows_two_read()) return 0;
#ifdef OPSLOT_KERNELS_BENCH
  if (cols <= 4 * kRegChunks * 128) return 128;
#endif
  return cols <= kRegMaxCols ? 256 : 0;
}

// Warps a row of the warp kernel with more than one warp a row, 0 where it does not take rows of
// `cols` columns: two on rows of 2049 to 4096 columns without a mask (with one the block register
// kernel measured as fast), four on rows of 4097 to 8192 (each chosen side by side on an H200,
// docs/results/dsa_indexer_h200.md). The bench library's paths: 7 two warps with a mask too, 8
// four, on rows of 2049 to 4096 columns; 9 two on rows of 1025 to 2048; 10 none on rows of 4097
// to 8192 (256-thread long-row blocks); 11 eight on rows of 8193 to 16384; 6 none (5cb1570).
int group_warps(int64_t cols, bool masked) {
  if (!production_middle_rows()) return 0;
  if (cols > kWarpMaxCols / 2 && cols <= kWarpMaxCols) return g_path == 9 ? 2 : 0;
  if (cols > kWarpMaxCols && cols <= kRegMaxCols) {
    if (g_path == 8) return 4;
    return masked && g_path != 7 ? 0 : 2;
  }
  if (cols > kRegMaxCols && cols <= 2 * kRegMaxCols) return g_path == 10 ? 0 : 4;
  if (cols > 2 * kRegMaxCols && cols <= 4 * kRegMaxCols) return g_path == 11 ? 8 : 0;
  return 0;
}

// The warp kernel with kG warps a row over `rows` rows.
template <int kMask, int kC, int kG>
int launch_group(const Params& p, int rows, cudaStream_t stream) {
  constexpr int kRows = block_warps(kG) / kG;
  const auto grid = static_cast<unsigned>((rows + kRows - 1) / kRows);
  topk_warp_kernel<kMask, kC, kG><<<grid, 32 * block_warps(kG), 0, stream>>>(p, rows);
  return check_launch(kName);
}

// Threads of the long-row kernel's blocks for rows of `cols` columns: 256 (three an SM) up to
// 16384 columns, 512 (two an SM) above, where the one-read pass runs (256-thread blocks measured
// 10-12 % slower there, three 384-thread blocks 7-14 %); 512 for every row in the bench library's
// paths 1, 2, 4 and 6.
int long_threads(int64_t cols) { return production_middle_rows() && cols <= 16384 ? 256 : 512; }

// topk_kernel with kT threads a block over `grid` rows.
template <int kMask, int kT, int kAhead = 1, int kStart = kRoundKth>
int launch_long(const Params& p, unsigned grid, cudaStream_t stream) {
  constexpr size_t smem = kernel_smem(kT);
  const auto kernel = topk_kernel<kMask, kT, kAhead, kStart>;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", kName,
                     smem, cudaGetErrorString(err));
  }
  kernel<<<grid, kT, smem, stream>>>(p);
  return check_launch(kName);
}

// One launch over every row, taking those of lo < n <= hi columns before their limit, with the
// kernel for rows of `longest` columns.
template <int kMask>
int launch_rows(Params p, int64_t rows, int64_t lo, int64_t hi, int64_t longest,
                cudaStream_t stream) {
  p.lo = lo;
  p.hi = hi;
  const auto warp_grid = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
  const int r = static_cast<int>(rows);
  switch (group_warps(longest, kMask >= 0)) {  // 16 chunk rows a lane, 32 chunks a warp
    case 2:
#ifdef OPSLOT_KERNELS_BENCH
      if (longest <= kWarpMaxCols) return launch_group<kMask, 8, 2>(p, r, stream);
      return launch_group<kMask, 16, 2>(p, r, stream);
#else
      if constexpr (kMask < 0) return launch_group<kMask, 16, 2>(p, r, stream);
      break;  // not reached: production gives two warps a row only to rows without a mask
#endif
    case 4:
#ifdef OPSLOT_KERNELS_BENCH
      if (longest <= kRegMaxCols) return launch_group<kMask, 8, 4>(p, r, stream);
#endif
      return launch_group<kMask, 16, 4>(p, r, stream);
#ifdef OPSLOT_KERNELS_BENCH
    case 8:
      return launch_group<kMask, 16, 8>(p, r, stream);
#endif
    default:
      break;
  }
  switch (warp_chunks(longest)) {
    case 8:
      topk_warp_kernel<kMask, 8><<<warp_grid, 32 * kRowWarps, 0, stream>>>(p, r);
      return check_launch(kName);
    case 16:
      topk_warp_kernel<kMask, 16><<<warp_grid, 32 * kRowWarps, 0, stream>>>(p, r);
      return check_launch(kName);
    default:
      break;
  }
  const auto grid = static_cast<unsigned>(rows);
  switch (reg_threads(longest)) {
#ifdef OPSLOT_KERNELS_BENCH
    case 128:
      topk_reg_kernel<kMask, 128><<<grid, 128, 0, stream>>>(p);
      return check_launch(kName);
#endif
    case 256:
      topk_reg_kernel<kMask, 256><<<grid, 256, 0, stream>>>(p);
      return check_launch(kName);
    default:
      break;
  }
  if (long_threads(longest) == 256) return launch_long<kMask, 256>(p, grid, stream);
#ifdef OPSLOT_KERNELS_BENCH
  // The bench library's path 12: the one-read pass asking L2 two rounds ahead; 13: its threshold
  // given (opslot_topk_set_hint); 14: the same in 256-thread blocks (three an SM, 7168 candidates).
  if (g_path == 12) return launch_long<kMask, 512, 2>(p, grid, stream);
  if (g_path == 13 || g_path == 14) {
    if (g_hint == nullptr) {
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: path %d without opslot_topk_set_hint",
                       kName, g_path);
    }
    Params q = p;
    q.hint = g_hint;
    if (g_path == 14) return launch_long<kMask, 256, 1, kGiven>(q, grid, stream);
    return launch_long<kMask, 512, 1, kGiven>(q, grid, stream);
  }
  // 15: the one-read pass from a sampled first lo (kSample); 16: the same in 256-thread blocks.
  if (g_path == 15) return launch_long<kMask, 512, 1, kSample>(p, grid, stream);
  if (g_path == 16) return launch_long<kMask, 256, 1, kSample>(p, grid, stream);
#endif
  return launch_long<kMask, 512>(p, grid, stream);
}

// One launch, its kernel by the rows' width; but with limits, rows of 2049 to 4096 columns and
// k < 2048, two: the rows of up to 2048 columns before their limit by the warp kernel, the longer
// ones two warps a row without a mask, by the block register kernel with one (each launch skips
// the other's rows; DeepSeek-V4 at 16k tokens 1.12x with the block register kernel). Not where a
// class holds only rows of at most k columns (nothing to select), nor for wider rows: every
// launch's blocks visit every row, and those it skips are not free (GLM-5, k = 2048, two or three
// launches: 8 % slower at 4k tokens, 1 % at 64k; DeepSeek-V4 at 64k tokens, its rows of 16384
// columns split at 8192, four warps a row below: 4 % slower; docs/results/dsa_indexer_h200.md).
template <int kMask>
int launch(const Params& p, int64_t rows, cudaStream_t stream) {
  if (p.limit != nullptr && production_short_rows() && p.cols > kWarpMaxCols &&
      p.cols <= kRegMaxCols && p.k < kWarpMaxCols) {
    if (const int err = launch_rows<kMask>(p, rows, -1, kWarpMaxCols, kWarpMaxCols, stream)) {
      return err;
    }
    return launch_rows<kMask>(p, rows, kWarpMaxCols, INT64_MAX, p.cols, stream);
  }
  return launch_rows<kMask>(p, rows, -1, INT64_MAX, p.cols, stream);
}

}  // namespace
}  // namespace opslot::topk

extern "C" {

OPSLOT_API int opslot_topk_indices(const float* scores, int64_t batch, int64_t seq, int64_t cols,
                                   const int64_t* score_stride, int64_t k, const int32_t* limit,
                                   const void* mask, int mask_kind, const int64_t* mask_stride,
                                   int32_t* out, void* stream) {
  using namespace opslot;
  using namespace opslot::topk;
  if (batch < 0 || seq < 0 || cols < 0 || k < 0 || k > cols) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: batch %lld, seq %lld, cols %lld, k %lld (need 0 <= k <= cols)", kName,
                     static_cast<long long>(batch), static_cast<long long>(seq),
                     static_cast<long long>(cols), static_cast<long long>(k));
  }
  if (batch == 0 || seq == 0 || k == 0) return OPSLOT_OK;  // nothing to write
  if (cols > INT32_MAX || batch * seq > INT32_MAX) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: %lld rows of %lld columns; the kernel takes fewer than 2^31 of each",
                     kName, static_cast<long long>(batch * seq), static_cast<long long>(cols));
  }
  if (scores == nullptr || out == nullptr || score_stride == nullptr ||
      (mask != nullptr && mask_stride == nullptr)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", kName);
  }
  if (mask != nullptr &&
      (mask_kind < OPSLOT_TOPK_MASK_FLOAT32 || mask_kind > OPSLOT_TOPK_MASK_BOOL)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown mask kind %d", kName, mask_kind);
  }
  const Params p{scores,
                 seq,
                 cols,
                 score_stride[0],
                 score_stride[1],
                 limit,
                 mask,
                 mask != nullptr ? mask_stride[0] : 0,
                 mask != nullptr ? mask_stride[1] : 0,
                 static_cast<int>(k),
                 out,
                 -1,
                 INT64_MAX,
                 stream_min_cols()};
  const auto st = static_cast<cudaStream_t>(stream);
  const int64_t rows = batch * seq;
  if (mask == nullptr) return launch<-1>(p, rows, st);
  switch (mask_kind) {
    case OPSLOT_TOPK_MASK_BOOL:
      return launch<OPSLOT_TOPK_MASK_BOOL>(p, rows, st);
    case OPSLOT_TOPK_MASK_FLOAT32:
      return launch<OPSLOT_TOPK_MASK_FLOAT32>(p, rows, st);
    case OPSLOT_TOPK_MASK_FLOAT16:
      return launch<OPSLOT_TOPK_MASK_FLOAT16>(p, rows, st);
    default:
      return launch<OPSLOT_TOPK_MASK_BFLOAT16>(p, rows, st);
  }
}

}  // extern "C"

#ifdef OPSLOT_KERNELS_BENCH
extern "C" OPSLOT_API int opslot_topk_probe_phases(unsigned long long* out, int reset) {
  const unsigned long long zero[opslot::topk::kProbes] = {};
  const cudaError_t err = reset ? cudaMemcpyToSymbol(opslot::topk::g_phase, zero, sizeof(zero))
                                : cudaMemcpyFromSymbol(out, opslot::topk::g_phase, sizeof(zero));
  if (err != cudaSuccess) {
    return opslot::set_error(static_cast<int>(err), "topk phase cycles: %s",
                             cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

extern "C" OPSLOT_API int opslot_topk_set_tuning(int path) {
  if (path < 0 || path > opslot::topk::kLastPath) {
    return opslot::set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                             "topk tuning: path %d, not one of 0 (production) to %d "
                             "(opslot_kernels/bench.h says what each runs)",
                             path, opslot::topk::kLastPath);
  }
  opslot::topk::g_path = path;
  return OPSLOT_OK;
}

extern "C" OPSLOT_API int opslot_topk_set_hint(const uint32_t* lo) {
  opslot::topk::g_hint = lo;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH
