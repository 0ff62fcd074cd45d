// The long-row top-k kernel, topk_kernel (a block a row; topk.cu launches it): the one-read pass
// (stream_topk: candidates above a rising threshold in shared memory, rows of 16385 to 65536
// columns) and the two-read path (the top digit over the row, then the keys at or above its
// bucket held in shared memory, or every digit over the row).
#pragma once

#include "topk_select.cuh"

namespace opslot::topk {
namespace {

constexpr int kHeld = 8192;  // keys at or above the top digit's bucket held in shared memory
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

}  // namespace
}  // namespace opslot::topk
