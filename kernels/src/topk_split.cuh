// The bench library's paths 13 and 14 of opslot_topk_indices (topk.cu includes this file in the
// bench build only): rows of 16385 (path 14: 8193) to 65536 columns with k <= 2048 split into
// segments that blocks filter in parallel, against a threshold sampled from the row first; the
// last block done with a row selects over its candidates. An experiment on the long-row kernel's
// bound (docs/kernels.md: a block reads nothing during its row's ~25 block-wide steps, and only two
// rows fit an SM): here the streaming blocks have no block-wide step, and the select of one row
// runs while other blocks stream.
//
//  1. topk_sample_kernel, a block of kSampleThreads per row: one 16-byte chunk in every 32 (a
//     32-byte sector read in every 16), 4 keys per 128 columns; the threshold is the sample's r-th
//     largest key, r = f m + 4 sqrt(f m) + 4 for m sampled keys and f = k / n (the digit spanning
//     the sample, as stream_topk's first round, then 11-bit digits down to the key): about
//     (f m + 4 sqrt(f m)) / (f m) k candidates expected, k at 4 standard deviations below, for keys
//     that are not ordered along the row.
//  2. topk_split_kernel, kSplitThreads a block, one segment of kSegKeys keys of one row: the keys
//     at or above the threshold appended (key and 16-bit column) to the row's candidates in global
//     memory (a warp's by one atomicAdd on the row's count; their order is not fixed, nothing after
//     depends on it). The block that completes the row (a per-row counter) copies the candidates to
//     shared memory and selects as stream_topk does at its end (span_select, select_below,
//     stream_write); with fewer than k candidates or more than kSplitCap it takes the two-read
//     path's digits over the row in global memory (finish). Either way the row's counters are
//     reset for the next chunk of rows.
//
// The output is that of every other kernel: the candidates are every key at or above the threshold
// (a function of the input), the select exact. Workspace per chunk of kSplitRows rows: the
// thresholds, two counters and kSplitCap candidates a row (6 bytes each), allocated on the stream.
//
// Included by topk.cu inside its namespace (opslot::topk, anonymous), after the functions it uses.

constexpr int kSampleThreads = 128;
constexpr int kSampleChunks = 4;  // sampled chunks a thread: 512 of a row of 65536 columns
constexpr int kSampleStride = 32;
constexpr int kSplitThreads = 256;
constexpr int kSegChunks = 8;  // 16-byte chunks a thread per segment, all loaded before any is used
constexpr int kSegKeys = 4 * kSegChunks * kSplitThreads;  // 8192
constexpr int kSplitCap = 5120;                           // candidates a row
constexpr int64_t kSplitRows = 8192;                      // rows a chunk of launches takes
constexpr size_t kSplitSmem = (sizeof(uint32_t) + sizeof(uint16_t)) * kSplitCap +
                              2 * kStreamMaxCols / 8;  // candidates, then the two bitmaps

// The workspace of one chunk of rows: per row its threshold, candidate count, finished segments.
struct SplitWork {
  uint32_t* thr;
  int* count;
  int* done;
  uint32_t* keys;  // kSplitCap a row
  uint16_t* cols;
  int64_t row0;  // the chunk's first row
};

// The sample's rank whose bucket floor is the threshold (at least 1, at most m).
__device__ __forceinline__ int sample_rank(int m, int k, int64_t n) {
  const float fm = static_cast<float>(k) * static_cast<float>(m) / static_cast<float>(n);
  const int r = static_cast<int>(ceilf(fm + 4.f * sqrtf(fm))) + 4;
  return r < m ? r : m;
}

template <int kMask>
__global__ void __launch_bounds__(kSampleThreads) topk_sample_kernel(const Params p, SplitWork w) {
  constexpr int kT = kSampleThreads;
  __shared__ uint4 sample[kSampleChunks * kT];  // the sampled keys, packed (16-byte aligned)
  __shared__ int hist[kMaxBins];
  __shared__ int warp_sums[kT / 32];
  __shared__ int pick[3];
  __shared__ uint32_t span[2 * (kT / 32)];
  RowSource<kMask> src;
  int32_t* o;
  const int64_t b = blockIdx.x;
  if (!row_source<kMask, 0>(p, w.row0 + b, src, o)) return;
  const int64_t samples = (src.chunks() + kSampleStride - 1) / kSampleStride;
  uint32_t key[kSampleChunks][4];
  int cnt[kSampleChunks], m = 0;
  uint32_t least = 0xffffffffu, most = 0u;
#pragma unroll
  for (int i = 0; i < kSampleChunks; ++i) {
    const int64_t s = i * kT + threadIdx.x;
    int col[4];
    cnt[i] = s < samples ? src.load(s * kSampleStride, key[i], col) : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < cnt[i]) least = min(least, key[i][j]), most = max(most, key[i][j]);
    }
    m += cnt[i];
  }
  int total;
  int at = block_scan<kT>(m, warp_sums, total) - m;
  auto* keys = reinterpret_cast<uint32_t*>(sample);
#pragma unroll
  for (int i = 0; i < kSampleChunks; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < cnt[i]) keys[at++] = key[i][j];
    }
  }
  uint32_t lo, hi;
  block_span<kT>(least, most, span, lo, hi);  // its barrier: the sample in shared memory
  const KeySource src_keys{keys, total};
  uint32_t prefix;
  int need;
  bool exact;
  int high = span_select<kT>(src_keys, lo, hi, sample_rank(total, p.k, src.n), hist, warp_sums,
                             pick, prefix, need, exact);
  // The digits below, down to the key itself: a bucket's floor is no threshold (the spanning
  // digit's buckets are up to 2^22 keys wide where the scores take both signs: at 64k columns and
  // k = 2048, 6095 candidates against 3257 above the sampled key, bench/topk_sample_emulation.py).
  while (high > 0) high = select_digit<kT>(src_keys, prefix, high, need, hist, warp_sums, pick);
  if (threadIdx.x == 0) w.thr[b] = prefix;  // the sample's r-th largest key
}

template <int kMask>
__global__ void __launch_bounds__(kSplitThreads, 3)
    topk_split_kernel(const Params p, SplitWork w, int segs) {
  constexpr int kT = kSplitThreads;
  extern __shared__ uint4 held[];
  __shared__ int hist[kMaxBins];
  __shared__ int warp_sums[kT / 32];
  __shared__ int pick[3];
  __shared__ uint32_t span[2 * (kT / 32)];
  __shared__ int last;
  RowSource<kMask> src;
  int32_t* o;
  const int64_t b = blockIdx.x / segs;
  const int seg = static_cast<int>(blockIdx.x % segs);
  if (!row_source<kMask, 0>(p, w.row0 + b, src, o)) return;
  const int64_t chunks = src.chunks();
  const int nseg = static_cast<int>((src.n + kSegKeys - 1) / kSegKeys);
  if (seg >= nseg) return;  // past the row's end: not one of its segments
  const uint32_t lo = w.thr[b];
  uint32_t* row_keys = w.keys + b * kSplitCap;
  uint16_t* row_cols = w.cols + b * kSplitCap;
  const int lane = threadIdx.x & 31;
  {  // the segment: every chunk's load issued before the first is used
    const int64_t c0 = static_cast<int64_t>(seg) * (kSegKeys / 4) + threadIdx.x;
    float4 v[kSegChunks];
    typename RowSource<kMask>::Word mw[kSegChunks];
    bool whole[kSegChunks];
#pragma unroll
    for (int i = 0; i < kSegChunks; ++i) whole[i] = src.fetch(c0 + i * kT, v[i], mw[i]);
    // The keys are made from the loaded words twice, to count and to append, rather than held
    // between: 32 more registers, where the kernel is at its 80 (three blocks per SM).
    int take = 0;
#pragma unroll
    for (int i = 0; i < kSegChunks; ++i) {
      uint32_t key[4];
      const int64_t c = c0 + i * kT;
      const int n = c < chunks ? src.keys(c, whole[i], v[i], mw[i], key) : 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) take += j < n && key[j] >= lo;
    }
    if (__any_sync(0xffffffffu, take != 0)) {
      const int incl = warp_scan(take);
      int base = 0;
      if (lane == 31) base = atomicAdd(&w.count[b], incl);
      base = __shfl_sync(0xffffffffu, base, 31);
      int at = base + incl - take;
      if (base + __shfl_sync(0xffffffffu, incl, 31) <= kSplitCap) {  // else the row falls back
#pragma unroll
        for (int i = 0; i < kSegChunks; ++i) {
          uint32_t key[4];
          const int64_t c = c0 + i * kT;
          const int n = c < chunks ? src.keys(c, whole[i], v[i], mw[i], key) : 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j < n && key[j] >= lo) {
              row_keys[at] = key[j];
              row_cols[at] = static_cast<uint16_t>(4 * c + j);
              ++at;
            }
          }
        }
      }
    }
  }
  __threadfence();  // the candidates, before the row's counter says this segment is done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&w.done[b], 1) == nseg - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every segment's candidates, seen after its count
  const int m = *reinterpret_cast<volatile int*>(&w.count[b]);
  const int k = p.k;
  if (m < k || m > kSplitCap) {  // the threshold missed: the two-read path's digits over the row
    histogram<kT>(src, 21, 32, 0u, hist);
    pick_bucket<kT>(hist, kMaxBins, k, warp_sums, pick);
    const uint32_t top = static_cast<uint32_t>(pick[0]);
    const int need = pick[1], count = pick[2];
    if (count == need) {
      write_chosen<kT>(src, 21, top, need, k, warp_sums, o);
    } else {
      finish<kT>(src, top, need, k, hist, warp_sums, pick, o);
    }
  } else {
    auto* keys = reinterpret_cast<uint32_t*>(held);
    auto* cols = reinterpret_cast<uint16_t*>(keys + kSplitCap);
    auto* gt_bits = reinterpret_cast<uint32_t*>(cols + kSplitCap);
    auto* eq_bits = gt_bits + kStreamMaxCols / 32;
    uint32_t mx = 0u;
    for (int i = threadIdx.x; i < m; i += kT) {
      const uint32_t key = *reinterpret_cast<volatile uint32_t*>(&row_keys[i]);
      keys[i] = key;
      cols[i] = *reinterpret_cast<volatile uint16_t*>(&row_cols[i]);
      mx = max(mx, key);
    }
    uint32_t unused, hi;
    block_span<kT>(lo, mx, span, unused, hi);  // its barrier: the candidates in shared memory
    const KeySource cand{keys, m};
    uint32_t prefix;
    int need;
    bool exact;
    const int high = span_select<kT>(cand, lo, hi, k, hist, warp_sums, pick, prefix, need, exact);
    const int shift =
        exact ? high : select_below<kT>(cand, prefix, high, need, hist, warp_sums, pick);
    stream_write<kT>(keys, cols, m, src.n, shift, prefix, need, gt_bits, eq_bits, warp_sums, o);
  }
  if (threadIdx.x == 0) w.count[b] = 0, w.done[b] = 0;  // for the next chunk's row b
}

// The split's launches over the rows of p.lo < n <= p.hi columns (at most 65536), in chunks of
// kSplitRows rows: the workspace allocated and zeroed on the stream, then per chunk the sample
// and the segments.
template <int kMask>
int launch_split(Params p, int64_t rows, cudaStream_t stream) {
  const int64_t chunk = rows < kSplitRows ? rows : kSplitRows;
  const int segs =
      static_cast<int>((min(p.cols, int64_t{kStreamMaxCols}) + kSegKeys - 1) / kSegKeys);
  const size_t counters = 3 * sizeof(int) * chunk;
  const size_t bytes = counters + (sizeof(uint32_t) + sizeof(uint16_t)) * kSplitCap * chunk;
  void* ws = nullptr;
  cudaError_t err = cudaMallocAsync(&ws, bytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(ws, 0, counters, stream);
  if (err == cudaSuccess) {
    err =
        cudaFuncSetAttribute(topk_split_kernel<kMask>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kSplitSmem));
  }
  if (err != cudaSuccess) {
    if (ws != nullptr) cudaFreeAsync(ws, stream);
    return set_error(static_cast<int>(err), "%s: path 13's workspace: %s", kName,
                     cudaGetErrorString(err));
  }
  SplitWork w;
  w.thr = static_cast<uint32_t*>(ws);
  w.count = reinterpret_cast<int*>(w.thr + chunk);
  w.done = w.count + chunk;
  w.keys = reinterpret_cast<uint32_t*>(w.done + chunk);
  w.cols = reinterpret_cast<uint16_t*>(w.keys + kSplitCap * chunk);
  int rc = OPSLOT_OK;
  for (int64_t r0 = 0; r0 < rows && rc == OPSLOT_OK; r0 += chunk) {
    const int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    w.row0 = r0;
    topk_sample_kernel<kMask><<<static_cast<unsigned>(n), kSampleThreads, 0, stream>>>(p, w);
    rc = check_launch(kName);
    if (rc != OPSLOT_OK) break;
    topk_split_kernel<kMask>
        <<<static_cast<unsigned>(n * segs), kSplitThreads, kSplitSmem, stream>>>(p, w, segs);
    rc = check_launch(kName);
  }
  cudaFreeAsync(ws, stream);
  return rc;
}
