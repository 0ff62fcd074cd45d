// The k largest values' columns of each row of an fp32 matrix (opslot_kernels/topk.h): the kernel
// a row gets by its columns before any limit, the launches, the C ABI and the bench library's
// knobs. The kernels run a radix select over the values' order bits (topk_select.cuh), then write
// the chosen columns in ascending order through prefix sums. Rows of up to 8192 columns sit in
// registers, read once (topk_short.cuh: one, two or four warps a row, or a block a row on masked
// rows of up to 4096); longer ones take a block a row (topk_long.cuh), reading rows of 16385 to
// 65536 columns once (candidates above a rising threshold in shared memory), others twice. The
// design and its numbers: docs/kernels.md "Top-k".
#include "topk_long.cuh"
#include "topk_short.cuh"

namespace opslot::topk {
namespace {

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
