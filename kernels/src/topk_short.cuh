// The top-k kernels whose rows sit in registers, read once (topk.cu launches them): a block a row
// (topk_reg_kernel, rows of up to 16 keys a thread) and one, two or four warps a row
// (topk_warp_kernel, rows of up to 8192 columns).
#pragma once

#include "topk_select.cuh"

namespace opslot::topk {
namespace {

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

}  // namespace
}  // namespace opslot::topk
