// Load-balancing loss over the tuple of per-layer router logits. The layer pointers travel by value
// in the kernel-parameter struct, up to kMaxLayers per launch (more layers: more launches, each
// writing its own partial rows). A (layer, token) row is spread over LPR lanes, each holding EPL
// (up to 16) consecutive experts; softmax and top-k are butterflies over those lanes. Per-block
// partial sums (counts, probability sums) go to scratch; lb_finalize adds them in a fixed order and
// writes the loss and the coefficients the backward needs. See
// kernels/include/opslot_kernels/load_balancing.h.
//
// The kernels are in load_balancing_kernels.cuh (general paths, finalize), load_balancing_tile.cuh
// (the tile forward) and load_balancing_warp.cuh (the warp-per-row paths); this file holds the
// knobs, the launchers and the C ABI.
#include <atomic>
#include <mutex>

#include "load_balancing_warp.cuh"

namespace opslot {
namespace {

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
  int occ = 0;
  if (int rc = blocks_per_sm(kernel, kFastWarps * 32, static_cast<size_t>(smem), dev,
                             last_occupancy, static_cast<uint32_t>(smem), "load_balancing", &occ))
    return rc;
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
