// RMSNorm (standard / offset / unweighted / unweighted_cast) and gated RMSNorm: forward, backward,
// and the fixed-order weight-gradient reduction. See kernels/include/opslot_kernels/rms_norm.h and
// docs/kernels.md ("rms_norm").
//
// Layout: a row is handled by `tpr` threads (a power of two, chosen from the width only), each
// holding NV vectors of VEC elements in registers, so x is read once per pass. The row sums are a
// butterfly over those threads (plus shared memory across warps for tpr > 32), whose order depends
// only on the width: a row's result is the same whatever the batch. The backward accumulates each
// thread's weight-gradient columns over the rows of its row group in registers and writes one fp32
// partial row per row group; rms_dw_reduce then adds the partial rows in a fixed order.
//
// The kernels are in rms_norm_kernels.cuh (versions 1 and 2) and rms_norm_pipe.cuh (version 3,
// the weight-gradient reduction); this file holds the geometry, the launchers and the C ABI.
#include <atomic>

#include "rms_norm_pipe.cuh"

namespace opslot {
namespace {

int pow2ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

bool aligned(const void* p, int bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Tuning knobs (opslot_rms_norm_set_tuning / _set_experiment, opslot_kernels/bench.h): mutable in
// the bench library only; the production library has these defaults as constants.
struct Tuning {
  // 16-byte vectors per thread the geometry aims at.
  int vectors_per_thread = 2;
  // Resident waves of the backward (each wave adds partial rows).
  int bwd_waves = 1;
  // 0: version 3 where it applies, else 2 (plain norms) / 1 (gated); 1, 2, 3: that version.
  int variant = 0;
  // Version 3: resident blocks per SM (0: as many as fit; -1: forward not persistent).
  int pipe_blocks_per_sm = 0;
  // Version 3 without its row sums (wrong results: a diagnostic).
  int diag = 0;
  // Version 3's backward in row order (default: from the last row).
  int backward_from_start = 0;
};
#ifdef OPSLOT_KERNELS_BENCH
Tuning g_tuning;
#else
constexpr Tuning g_tuning{};
#endif

// Launch geometry, from the width and vector size only (so a row's arithmetic does not depend on
// the rows).
struct Geometry {
  int vec, tpr, nv, threads, rpb;
};

template <typename Tx, typename Tw, typename To>
Geometry geometry(const RmsArgs& a, bool bwd) {
  constexpr int kVec = 16 / sizeof(Tx);
  bool ok =
      a.cols % kVec == 0 && a.xs % kVec == 0 && aligned(a.x, 16) && aligned(a.w, kVec * sizeof(Tw));
  if (a.mode == OPSLOT_RMS_GATED) ok = ok && a.gs % kVec == 0 && aligned(a.gate, 16);
  if (bwd)
    ok = ok && a.dys % kVec == 0 && aligned(a.dy, kVec * sizeof(To)) && aligned(a.dx, 16) &&
         aligned(a.dgate, 16);
  else
    ok = ok && aligned(a.y, kVec * sizeof(To));
  Geometry g;
  g.vec = ok ? kVec : 1;
  const int64_t nvec = a.cols / g.vec;
  const int64_t per_thread = g.vec > 1 ? g_tuning.vectors_per_thread : 4;
  int64_t tpr = pow2ceil((nvec + per_thread - 1) / per_thread);
  if (tpr > kMaxThreads) tpr = kMaxThreads;
  g.tpr = static_cast<int>(tpr);
  g.nv = pow2ceil((nvec + tpr - 1) / tpr);
  g.threads = g.tpr < 256 ? 256 : g.tpr;
  g.rpb = g.threads / g.tpr;
  return g;
}

template <typename Tx, typename Tw, typename To, int VEC, int NV>
int launch_nv(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
              int64_t* partial_rows) {
  const int64_t needed = (a.rows + g.rpb - 1) / g.rpb;
  const bool gated = a.mode == OPSLOT_RMS_GATED;
  // Version 0 (auto, the default): version 2 for the plain norms, version 1 for the gated norm
  // (measured faster on an H200: docs/results/kernels_h200.md).
  const int v = g_tuning.variant == 1 || (g_tuning.variant == 0 && gated) ? 0 : 1;
  void (*kernel)(RmsArgs);
  if (v == 0) {
    kernel = bwd ? rms_bwd_kernel_v1<Tx, Tw, To, VEC, NV> : rms_fwd_kernel_v1<Tx, Tw, To, VEC, NV>;
  } else if (!gated) {
    kernel = bwd ? rms_bwd_kernel<Tx, Tw, To, VEC, NV, false>
                 : rms_fwd_kernel<Tx, Tw, To, VEC, NV, false>;
  } else if constexpr (kBench) {
    // Version 2 of the gated norm: only opslot_rms_norm_set_tuning selects it (bench library).
    kernel =
        bwd ? rms_bwd_kernel<Tx, Tw, To, VEC, NV, true> : rms_fwd_kernel<Tx, Tw, To, VEC, NV, true>;
  } else {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "rms_norm: version 2 of the gated norm is only in the bench library");
  }
  // Blocks per SM of each kernel, asked once (atomics: a race asks twice and stores the same
  // value).
  static std::atomic<int> occupancy[2][2][2][2];  // [variant][gated][backward][512-thread block]
  std::atomic<int>& occ_memo = occupancy[v][gated ? 1 : 0][bwd ? 1 : 0][g.threads > 256 ? 1 : 0];
  int occ = occ_memo.load(std::memory_order_relaxed);
  if (occ == 0) {
    int n = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, g.threads, 0);
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "rms_norm: occupancy query failed: %s",
                       cudaGetErrorString(err));
    occ = n > 0 ? n : 1;
    occ_memo.store(occ, std::memory_order_relaxed);
  }
  // The forward may use many waves; the backward keeps bwd_waves resident waves (one partial row
  // per row group).
  const int64_t cap = static_cast<int64_t>(num_sms()) * occ * (bwd ? g_tuning.bwd_waves : 16);
  int64_t grid = needed < cap ? needed : cap;
  if (grid < 1) grid = 1;
  if (partial_rows) {
    *partial_rows = grid * g.rpb;
    return OPSLOT_OK;
  }
  if (a.rows == 0) return OPSLOT_OK;
  kernel<<<static_cast<unsigned>(grid), g.threads, 0, stream>>>(a);
  return check_launch(bwd ? "rms_norm backward" : "rms_norm forward");
}

template <typename Tx, typename Tw, typename To, int VEC>
int launch_vec(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
               int64_t* partial_rows) {
  // At most 32 elements per thread (more would spill in the backward).
  constexpr int kMaxNV = VEC >= 8 ? 4 : VEC == 4 ? 8 : 16;
  switch (g.nv) {
    case 1:
      return launch_nv<Tx, Tw, To, VEC, 1>(a, g, bwd, stream, partial_rows);
    case 2:
      return launch_nv<Tx, Tw, To, VEC, 2>(a, g, bwd, stream, partial_rows);
    case 4:
      return launch_nv<Tx, Tw, To, VEC, 4>(a, g, bwd, stream, partial_rows);
    case 8:
      if constexpr (kMaxNV >= 8)
        return launch_nv<Tx, Tw, To, VEC, 8>(a, g, bwd, stream, partial_rows);
      break;
    case 16:
      if constexpr (kMaxNV >= 16)
        return launch_nv<Tx, Tw, To, VEC, 16>(a, g, bwd, stream, partial_rows);
      break;
    default:
      break;
  }
  return set_error(
      OPSLOT_ERR_UNSUPPORTED,
      "rms_norm: width %lld is too wide for the register-resident kernel with %d-element vectors "
      "(at most %d elements per row)%s",
      static_cast<long long>(a.cols), VEC, kMaxThreads * kMaxNV * VEC,
      VEC == 1 ? "; rows that are contiguous, 16-byte aligned and a multiple of 16 bytes wide take "
                 "wider vectors"
               : "");
}

// Version 3's launch: returns kNotEligible when the input does not fit it (the caller then uses
// version 1 or 2).
constexpr int kNotEligible = -12345;

struct PipeGeometry {
  int threads = 0, nv = 0, stages = kStages;
  int64_t smem = 0;
};

template <typename Tx, typename Tw, typename To>
PipeGeometry pipe_geometry(const RmsArgs& a, bool bwd, const Geometry& g) {
  PipeGeometry p;
  constexpr int kVec = 16 / sizeof(Tx);
  if (g.vec != kVec) return p;
  if (bwd && !aligned(a.dw_partial, 16)) return p;
  const int64_t nvec = a.cols / kVec;
  const int64_t vpt = g_tuning.vectors_per_thread < 2 ? 1 : 2;
  int64_t T = pow2ceil((nvec + vpt - 1) / vpt);
  if (T < 32) T = 32;
  if (T > kPipeMaxThreads) T = kPipeMaxThreads;
  const int64_t nv = pow2ceil((nvec + T - 1) / T);
  if (nv > 2) return p;  // four vectors per thread (bf16 wider than 8192) spill in the backward
  const int64_t per_chunk =
      kVec * (static_cast<int64_t>(sizeof(Tx)) * (a.mode == OPSLOT_RMS_GATED ? 2 : 1) +
              (bwd ? static_cast<int64_t>(sizeof(To)) : 0));
  // One ring depth for every direction: a 6-stage ring for the plain forward measured slower than
  // 4 (0.0851 against 0.0819 ms, 0.0840 against 0.0815 in an earlier run), and a 3- or 2-stage
  // backward ring the same as 4 (docs/results/kernels_h200.md).
  const int stages = kStages;
  const int64_t smem = stages * nvec * per_chunk;
  if (smem > kPipeMaxSmem) return p;
  p.stages = stages;
  p.threads = static_cast<int>(T);
  p.nv = static_cast<int>(nv);
  p.smem = smem;
  return p;
}

int device_id() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
  return dev;
}

template <typename Tx, typename Tw, typename To, int VEC, int NV, bool GATED, bool BWD, int S>
int launch_pipe_inst(const RmsArgs& a, const PipeGeometry& p, cudaStream_t stream,
                     int64_t* partial_rows) {
  void (*kernel)(RmsArgs) = rms_pipe_kernel<Tx, Tw, To, VEC, NV, GATED, BWD, S>;
  // Per device: the dynamic shared-memory opt-in (once; the same value, so a race sets it twice),
  // and the occupancy of the last geometry (threads, shared memory) asked for.
  static std::atomic<bool> opted_in[DeviceMemo::kMaxDevices];
  static DeviceMemo last_occupancy;
  const int dev = device_id();
  if (dev >= DeviceMemo::kMaxDevices || !opted_in[dev].load(std::memory_order_acquire)) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kPipeMaxSmem));
    if (err != cudaSuccess)
      return set_error(static_cast<int>(err), "rms_norm: shared-memory opt-in failed: %s",
                       cudaGetErrorString(err));
    if (dev < DeviceMemo::kMaxDevices) opted_in[dev].store(true, std::memory_order_release);
  }
  // threads (< 2^11) and shared memory (< 2^21 bytes): one 32-bit key.
  static_assert(kPipeMaxThreads < (1 << 11) && kPipeMaxSmem < (int64_t(1) << 21), "memo key");
  const uint32_t key = static_cast<uint32_t>(p.smem) << 11 | static_cast<uint32_t>(p.threads);
  int c_occ = 0;
  if (int rc = blocks_per_sm(kernel, p.threads, static_cast<size_t>(p.smem), dev, last_occupancy,
                             key, "rms_norm", &c_occ))
    return rc;
  const int occ = g_tuning.pipe_blocks_per_sm > 0 && g_tuning.pipe_blocks_per_sm < c_occ
                      ? g_tuning.pipe_blocks_per_sm
                      : c_occ;
  const int64_t cap =
      g_tuning.pipe_blocks_per_sm < 0 && !BWD ? a.rows : static_cast<int64_t>(num_sms()) * occ;
  int64_t grid = a.rows < cap ? a.rows : cap;
  if (grid < 1) grid = 1;
  if (partial_rows) {
    *partial_rows = grid;
    return OPSLOT_OK;
  }
  if (a.rows == 0) return OPSLOT_OK;
  RmsArgs b = a;
  b.diag = g_tuning.diag;
  b.reverse = !g_tuning.backward_from_start;
  kernel<<<static_cast<unsigned>(grid), p.threads, static_cast<size_t>(p.smem), stream>>>(b);
  return check_launch(BWD ? "rms_norm backward" : "rms_norm forward");
}

template <typename Tx, typename Tw, typename To, bool GATED, bool BWD>
int launch_pipe_nv(const RmsArgs& a, const PipeGeometry& p, cudaStream_t stream,
                   int64_t* partial_rows) {
  constexpr int kVec = 16 / sizeof(Tx);
  switch (p.nv) {
    case 1:
      return launch_pipe_inst<Tx, Tw, To, kVec, 1, GATED, BWD, kStages>(a, p, stream, partial_rows);
    default:
      return launch_pipe_inst<Tx, Tw, To, kVec, 2, GATED, BWD, kStages>(a, p, stream, partial_rows);
  }
}

template <typename Tx, typename Tw, typename To>
int launch_pipe(const RmsArgs& a, const Geometry& g, bool bwd, cudaStream_t stream,
                int64_t* partial_rows) {
  if (g_tuning.variant != 0 && g_tuning.variant != 3) return kNotEligible;
  const PipeGeometry p = pipe_geometry<Tx, Tw, To>(a, bwd, g);
  if (p.threads == 0) return kNotEligible;
  const bool gated = a.mode == OPSLOT_RMS_GATED;
  if (gated)
    return bwd ? launch_pipe_nv<Tx, Tw, To, true, true>(a, p, stream, partial_rows)
               : launch_pipe_nv<Tx, Tw, To, true, false>(a, p, stream, partial_rows);
  return bwd ? launch_pipe_nv<Tx, Tw, To, false, true>(a, p, stream, partial_rows)
             : launch_pipe_nv<Tx, Tw, To, false, false>(a, p, stream, partial_rows);
}

template <typename Tx, typename Tw, typename To>
int launch(const RmsArgs& a, bool bwd, cudaStream_t stream, int64_t* partial_rows) {
  const Geometry g = geometry<Tx, Tw, To>(a, bwd);
  const int rc = launch_pipe<Tx, Tw, To>(a, g, bwd, stream, partial_rows);
  if (rc != kNotEligible) return rc;
  constexpr int kVec = 16 / sizeof(Tx);
  if (g.vec == kVec) return launch_vec<Tx, Tw, To, kVec>(a, g, bwd, stream, partial_rows);
  return launch_vec<Tx, Tw, To, 1>(a, g, bwd, stream, partial_rows);
}

// Calls f(Tx{}, Tw{}, To{}) for the dtype codes: w_dtype is x_dtype or fp32; To is fp32 for the
// standard norm with an fp32 weight, else Tx.
template <typename F>
int dispatch_types(int mode, int x_dtype, int w_dtype, F&& f) {
  if (mode < OPSLOT_RMS_STANDARD || mode > OPSLOT_RMS_UNWEIGHTED_CAST)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: unknown mode %d", mode);
  if (unweighted_mode(mode)) w_dtype = x_dtype;
  if (w_dtype != x_dtype && w_dtype != OPSLOT_FLOAT32)
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "rms_norm: weight dtype code %d with input dtype code %d (the weight must "
                     "have the input's dtype or float32)",
                     w_dtype, x_dtype);
  const bool wf = w_dtype == OPSLOT_FLOAT32;
  const bool of = wf && mode == OPSLOT_RMS_STANDARD;
  switch (x_dtype) {
    case OPSLOT_FLOAT32:
      return f(float{}, float{}, float{});
    case OPSLOT_FLOAT16:
      if (!wf) return f(__half{}, __half{}, __half{});
      return of ? f(__half{}, float{}, float{}) : f(__half{}, float{}, __half{});
    case OPSLOT_BFLOAT16:
      if (!wf) return f(__nv_bfloat16{}, __nv_bfloat16{}, __nv_bfloat16{});
      return of ? f(__nv_bfloat16{}, float{}, float{})
                : f(__nv_bfloat16{}, float{}, __nv_bfloat16{});
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: unknown dtype code %d", x_dtype);
  }
}

int check_common(int mode, int64_t rows, int64_t cols, const void* x, const void* gate,
                 const void* w) {
  if (rows < 0 || cols <= 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: bad shape rows=%lld cols=%lld",
                     static_cast<long long>(rows), static_cast<long long>(cols));
  if (rows > 0 && !x) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null input");
  if (mode == OPSLOT_RMS_GATED && rows > 0 && !gate)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null gate");
  if (!unweighted_mode(mode) && !w)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rms_norm: null weight");
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int opslot_rms_norm_fwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   float eps, const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, void* y,
                                   float* rstd, void* stream) {
  if (int rc = check_common(mode, rows, cols, x, gate, weight)) return rc;
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.eps = eps;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.w = weight;
  a.y = y;
  a.rstd = rstd;
  return dispatch_types(mode, x_dtype, w_dtype, [&](auto tx, auto tw, auto to) -> int {
    using Tx = decltype(tx);
    using Tw = decltype(tw);
    using To = decltype(to);
    RmsArgs b = a;
    b.tpr = geometry<Tx, Tw, To>(a, false).tpr;
    return launch<Tx, Tw, To>(b, false, static_cast<cudaStream_t>(stream), nullptr);
  });
}

static int rms_bwd_impl(int mode, int x_dtype, int w_dtype, const RmsArgs& a, void* dw,
                        cudaStream_t stream, int64_t* partial_rows) {
  return dispatch_types(mode, x_dtype, w_dtype, [&](auto tx, auto tw, auto to) -> int {
    using Tx = decltype(tx);
    using Tw = decltype(tw);
    using To = decltype(to);
    RmsArgs b = a;
    b.tpr = geometry<Tx, Tw, To>(a, true).tpr;
    int64_t prow = 0;
    if (int rc = launch<Tx, Tw, To>(b, true, stream, &prow)) return rc;
    if (partial_rows) {
      *partial_rows = prow;
      return OPSLOT_OK;
    }
    if (int rc = launch<Tx, Tw, To>(b, true, stream, nullptr)) return rc;
    if (unweighted_mode(mode)) return OPSLOT_OK;
    const int64_t blocks = (a.cols + 31) / 32;
    // With no rows nothing wrote the partials: the reduction over zero partial rows writes zeros.
    rms_dw_reduce_kernel<Tw><<<static_cast<unsigned>(blocks), 1024, 0, stream>>>(
        a.dw_partial, a.rows == 0 ? 0 : prow, a.cols, static_cast<Tw*>(dw));
    return check_launch("rms_norm weight-gradient reduction");
  });
}

OPSLOT_API int64_t opslot_rms_norm_bwd_partial_rows(int mode, int x_dtype, int w_dtype,
                                                    int64_t rows, int64_t cols, const void* x,
                                                    int64_t x_row_stride, const void* gate,
                                                    int64_t gate_row_stride, const void* dy,
                                                    int64_t dy_row_stride) {
  static const char dummy = 0;  // the weight pointer is not needed to size the scratch
  if (check_common(mode, rows, cols, x, gate, &dummy)) return -1;
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.dy = dy;
  a.dys = dy_row_stride;
  int64_t prow = 0;
  if (rms_bwd_impl(mode, x_dtype, w_dtype, a, nullptr, nullptr, &prow)) return -1;
  return prow;
}

OPSLOT_API int opslot_rms_norm_bwd(int mode, int x_dtype, int w_dtype, int64_t rows, int64_t cols,
                                   const void* x, int64_t x_row_stride, const void* gate,
                                   int64_t gate_row_stride, const void* weight, const float* rstd,
                                   const void* dy, int64_t dy_row_stride, void* dx, void* dgate,
                                   float* dw_partial, void* dw, void* stream) {
  if (int rc = check_common(mode, rows, cols, x, gate, weight)) return rc;
  if (!unweighted_mode(mode) && (!dw || !dw_partial))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm backward: null weight-gradient buffers");
  RmsArgs a{};
  a.mode = mode;
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.xs = x_row_stride;
  a.gate = gate;
  a.gs = gate_row_stride;
  a.w = weight;
  a.rstd_in = rstd;
  a.dy = dy;
  a.dys = dy_row_stride;
  a.dx = dx;
  a.dgate = dgate;
  a.dw_partial = dw_partial;
  return rms_bwd_impl(mode, x_dtype, w_dtype, a, dw, static_cast<cudaStream_t>(stream), nullptr);
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_rms_norm_set_experiment(int pipe_blocks_per_sm, int skip_row_sums,
                                              int backward_from_start) {
  if (pipe_blocks_per_sm < -1 || pipe_blocks_per_sm > 32 || skip_row_sums < 0 ||
      skip_row_sums > 1 || backward_from_start < 0 || backward_from_start > 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm experiment: pipe_blocks_per_sm -1..32, skip_row_sums 0..1, "
                     "backward_from_start 0..1");
  if (skip_row_sums && !kDiagnostics)
    return set_error(
        OPSLOT_ERR_UNSUPPORTED,
        "rms_norm experiment: skip_row_sums gives wrong results and is only in a bench library "
        "built with -DOPSLOT_KERNELS_DIAGNOSTICS=ON");
  g_tuning.backward_from_start = backward_from_start;
  g_tuning.pipe_blocks_per_sm = pipe_blocks_per_sm;
  g_tuning.diag = skip_row_sums;
  return OPSLOT_OK;
}

OPSLOT_API int opslot_rms_norm_set_tuning(int vectors_per_thread, int bwd_waves, int variant) {
  if (vectors_per_thread < 1 || vectors_per_thread > 8 || bwd_waves < 1 || bwd_waves > 16 ||
      variant < 0 || variant > 3)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rms_norm tuning: vectors_per_thread 1..8, bwd_waves 1..16, variant 0..3");
  g_tuning.vectors_per_thread = vectors_per_thread;
  g_tuning.bwd_waves = bwd_waves;
  g_tuning.variant = variant;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
