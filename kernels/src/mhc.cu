// DeepSeek-V4's hyper-connections (mhc/pre, mhc/post, mhc/head): the memory-bound passes around the
// forward's fp32 GEMM against `fn` (which the caller runs on cuBLAS), and the backward's dx and d
// fn (one tensor-core pass where it fits: dx_dfn_wgmma_kernel on Hopper, else dx_dfn_kernel). See
// opslot_kernels/mhc.h for the contracts, mhc_math.h for the per-token math (shared with the CPU
// kernels of kernels/torch/mhc.cc) and docs/kernels.md "## mhc" for the design and its byte counts.
// The kernels are in mhc_kernels.cuh (the token-row passes), mhc_dx.cuh (dx, dx + d fn) and
// mhc_dx90.cuh (dx + d fn on warpgroup MMAs); this file holds their launchers and the C ABI.
#include <initializer_list>

#include "mhc_dx90.cuh"

namespace opslot {
namespace {

// Bench-library knobs (opslot_mhc_set_tuning), compile-time defaults in the production library:
// - g_hold_threads: collapse_fwd holds the token's row in registers between the sum of squares and
//   the collapse when its block (collapse_fwd_threads: the same for either path, so the results are
//   bitwise equal) has at most this many threads and kRowVectors vectors per stream and thread
//   cover the row. Default 0: never; reading the row again (from L2) measured faster on an H200
//   (docs/kernels.md "## mhc").
// - g_dx_version: 1 (default) the production backward, 2 .. 12 the CUDA-core dx variants of
//   launch_dx_variant with the d fn GEMM, 13 and 14 other rings of dx_dfn_kernel, 15 dx_dfn_kernel
//   where dx_dfn_wgmma_kernel would run, 16 and 17 other rings of dx_dfn_wgmma_kernel (bench
//   library only; see dx_dfn_fits and opslot_mhc_dx_dfn).
// - g_fwd_threads: collapse_fwd's threads per block (opslot_mhc_collapse_set_tuning); 0 (default)
//   collapse_fwd_threads' choice.
// - g_collapse_form, g_comb_form (opslot_mhc_forms_set_tuning): 0 (default) the production
//   forms, kCollapseForm and kCombForm; collapse_fwd 1 a block a token (collapse_fwd_kernel), 2
//   blocks that walk the tokens with the next row in flight (collapse_fwd_pipe_kernel, where
//   16-byte vectors cover the row in at most two a stream and thread; else 1); the comb 1 a thread
//   a token (comb_fwd_kernel, comb_bwd_kernel: bench library only), 2 a lane a matrix entry
//   (comb_*_lanes_kernel). Each form computes the same bits.
#ifdef OPSLOT_KERNELS_BENCH
int g_hold_threads = 0;
int g_dx_version = 1;
int g_fwd_threads = 0;
int g_collapse_form = 0;
int g_comb_form = 0;
#else
constexpr int g_hold_threads = 0;
constexpr int g_fwd_threads = 0;
constexpr int g_collapse_form = 0;
constexpr int g_comb_form = 0;
#endif
// The production forms: side by side on an H100 (docs/results/mhc_h200.md), the pipelined collapse
// took 237 against 268 us for pre at hidden 4096 and 422 against 524 at 7168 (16k tokens, 4
// streams, bf16; 91-98 % of the copy rate for its bytes with head's), the lanes' Sinkhorn backward
// 30 against 50 us.
constexpr int kCollapseForm = 2;
constexpr int kCombForm = 2;
int collapse_form() { return g_collapse_form != 0 ? g_collapse_form : kCollapseForm; }
int comb_form() { return g_comb_form != 0 ? g_comb_form : kCombForm; }

// ---- launch helpers -----------------------------------------------------------------------------

// Threads of a per-token block that streams its row: about two vectors per thread, 64 .. 256.
int stream_threads(int64_t nvec) {
  int t = 64;
  while (t < kStreamThreads && 2 * static_cast<int64_t>(t) < nvec) t *= 2;
  return t;
}

// collapse_fwd's threads: one to two vectors per thread, 64 .. 512. Fewer tokens in flight keep
// their rows in L2 for the second read: on an H200 at 16k tokens x 4 streams the forward took 0.615
// against 0.737 ms at hidden 7168 and 0.358 against 0.375 at 4096 with 256 (bench/mhc.py
// --fwd-threads; docs/results/mhc_h200.md).
int collapse_fwd_threads(int64_t nvec) {
  int t = 64;
  while (t < kCollapseFwdThreads && t < nvec) t *= 2;
  return t;
}

// A grid of one wave of `Kernel` at `threads` a block on the current GPU: its SMs times the blocks
// an SM holds (asked once per kernel, device and block size).
template <auto Kernel>
int one_wave(const char* what, int threads, int64_t* grid) {
  static DeviceMemo per_sm;  // keyed by the block size
  int dev = 0, n = 0;
  const cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess)
    return set_error(static_cast<int>(err), "%s: occupancy query failed: %s", what,
                     cudaGetErrorString(err));
  if (int rc =
          blocks_per_sm(Kernel, threads, 0, dev, per_sm, static_cast<uint32_t>(threads), what, &n))
    return rc;
  *grid = static_cast<int64_t>(num_sms()) * n;
  return OPSLOT_OK;
}

// Calls f(std::integral_constant<int, HC>) for hc in 1..4.
template <typename F>
int dispatch_hc(int64_t hc, const char* what, F&& f) {
  switch (hc) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hc_mult %lld is not supported (1 to %d)", what,
                       static_cast<long long>(hc), mhc::kMaxHc);
  }
}

int check_shape(const char* what, int64_t tokens, int64_t hc, int64_t hidden) {
  if (tokens < 0 || hidden < 1 || hc < 1)
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape (tokens %lld, hc %lld, hidden %lld)", what,
        static_cast<long long>(tokens), static_cast<long long>(hc), static_cast<long long>(hidden));
  if (tokens > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: %lld tokens (at most %d)", what,
                     static_cast<long long>(tokens), INT32_MAX);
  return OPSLOT_OK;
}

int check_mixes(const char* what, int64_t hc, int64_t mixes) {
  if (mixes != hc && mixes != (2 + hc) * hc)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: %lld mixes for hc_mult %lld (expected %lld for pre or %lld for head)",
                     what, static_cast<long long>(mixes), static_cast<long long>(hc),
                     static_cast<long long>((2 + hc) * hc), static_cast<long long>(hc));
  return OPSLOT_OK;
}

// 16-byte vectors when every row starts 16-byte aligned, else scalar accesses.
template <typename T>
bool use_vectors(int64_t hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % (16 / static_cast<int64_t>(sizeof(T))) != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

// ---- dx launches
// ----------------------------------------------------------------------------------
template <typename T>
struct DxArgs {
  const T* x;
  const T* g;
  const float* fn;
  const float* coef_a;
  const float* coef_c;
  const float* pre;
  T* dx;
  int64_t tokens;
  int hc;
  int64_t hidden;
  int mixes;
};

// P-column accesses are aligned: rows of a multiple of P, every pointer aligned to P elements.
template <typename T>
bool dx_fits(const DxArgs<T>& a, int p) {
  const uintptr_t align = static_cast<uintptr_t>(p) * sizeof(T);
  return a.hidden % p == 0 && reinterpret_cast<uintptr_t>(a.x) % align == 0 &&
         reinterpret_cast<uintptr_t>(a.dx) % align == 0 &&
         (a.g == nullptr || reinterpret_cast<uintptr_t>(a.g) % align == 0);
}

// One dx launch; P columns per thread when dx_fits, else P / 2, ... 1.
template <typename T, int MAXM, int P, int THREADS, int TOKENS, bool kPrefetch, int kMinBlocks = 1,
          bool kRing = false>
int launch_dx(const char* what, const DxArgs<T>& a, cudaStream_t s) {
  if constexpr (P > 1) {
    // half the columns where P do not fit; the ring needs copies of 4 bytes at least (cp.async)
    constexpr int H = P / 2;
    constexpr bool kRingH = kRing && H * sizeof(T) >= 4;
    if (!dx_fits(a, P))
      return launch_dx<T, MAXM, H, THREADS, TOKENS, kPrefetch, kMinBlocks, kRingH>(what, a, s);
  }
  const int64_t col_tiles = (a.hidden + THREADS * P - 1) / (THREADS * P);
  const int64_t token_tiles = (a.tokens + TOKENS - 1) / TOKENS;
  if (col_tiles * a.hc > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hidden size too large", what);
  if (token_tiles > 65535)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: %lld tokens (at most %d)", what,
                     static_cast<long long>(a.tokens), 65535 * TOKENS);
  const dim3 grid(static_cast<unsigned>(col_tiles * a.hc), static_cast<unsigned>(token_tiles));
  dx_kernel<T, P, MAXM, THREADS, TOKENS, kPrefetch, kMinBlocks, kRing><<<grid, THREADS, 0, s>>>(
      a.x, a.g, a.fn, a.coef_a, a.coef_c, a.pre, a.dx, a.tokens, a.hc, a.hidden, a.mixes);
  return check_launch(what);
}

// The production configuration (the fastest of the variants below, measured side by side on an
// H200: docs/results/mhc_h200.md): four columns per thread (fn's MAXM x 4 values in registers), 256
// threads x 128 tokens, the next tokens' loads in flight in the cp.async ring.
template <typename T, int MAXM>
int launch_dx_production(const char* what, const DxArgs<T>& a, cudaStream_t s) {
  return launch_dx<T, MAXM, 4, 256, 128, false, 1, true>(what, a, s);
}

#ifdef OPSLOT_KERNELS_BENCH
// Bench-library variants (opslot_mhc_set_tuning dx_version; columns per thread x threads x tokens
// per tile, how the next tokens' loads are kept in flight): 2 the previous production kernel (2 x
// 256 x 256, loaded a group at a time), 3 the same with the next group prefetched in registers, 4
// 2 x 512 x 256, 5 2 x 256 x 64, 6 4 x 256 x 256, 7 16-byte vectors x 256 x 256, 8 and 9 as 3 and 7
// with registers capped for three blocks per SM (3 .. 9 prefetch), 10 2 x 256 x 128 and 11 4 x 256
// x 128 with the cp.async ring (11 is launch_dx_production), 12 as 10 for three blocks per
// SM. Where the fused dx_dfn_kernel fits, these versions turn it off (dx_dfn_fits).
template <typename T, int MAXM>
int launch_dx_variant(int version, const char* what, const DxArgs<T>& a, cudaStream_t s) {
  constexpr int W = static_cast<int>(16 / sizeof(T));
  switch (version) {
    case 2:
      return launch_dx<T, MAXM, 2, 256, 256, false>(what, a, s);
    case 3:
      return launch_dx<T, MAXM, 2, 256, 256, true>(what, a, s);
    case 4:
      return launch_dx<T, MAXM, 2, 512, 256, true>(what, a, s);
    case 5:
      return launch_dx<T, MAXM, 2, 256, 64, true>(what, a, s);
    case 6:
      return launch_dx<T, MAXM, 4, 256, 256, true>(what, a, s);
    case 7:
      return launch_dx<T, MAXM, W, 256, 256, true>(what, a, s);
    case 8:
      return launch_dx<T, MAXM, 2, 256, 256, true, 3>(what, a, s);
    case 9:
      return launch_dx<T, MAXM, W, 256, 256, true, 3>(what, a, s);
    case 10:
      return launch_dx<T, MAXM, 2, 256, 128, false, 1, true>(what, a, s);
    case 11:
      return launch_dx<T, MAXM, 4, 256, 128, false, 1, true>(what, a, s);
    case 12:
      return launch_dx<T, MAXM, 2, 256, 128, false, 3, true>(what, a, s);
    default:
      return launch_dx_production<T, MAXM>(what, a, s);
  }
}
#endif  // OPSLOT_KERNELS_BENCH

// ---- the fused dx + d fn launch --------------------------------------------------------------
// dx_dfn_kernel and dx_dfn_wgmma_kernel take bf16 streams in whole 64-column tiles, x / g / dx
// 16-byte aligned; the bench library's dx_version 2 to 12 turn them off (the CUDA-core dx and the
// d fn GEMM run instead), 13 to 17 choose one (launch_dx_dfn_variant).
bool dx_dfn_fits(int dtype, int64_t hc, int64_t hidden, int64_t mixes, const void* x, const void* g,
                 const void* dx) {
#ifdef OPSLOT_KERNELS_BENCH
  if (g_dx_version >= 2 && g_dx_version <= 12) return false;
#endif  // OPSLOT_KERNELS_BENCH
  return dtype == OPSLOT_BFLOAT16 && hc >= 1 && hc <= mhc::kMaxHc &&
         (mixes == hc || mixes == (2 + hc) * hc) && hidden >= 1 && hidden % kDxfCols == 0 &&
         aligned16(x) && aligned16(dx) && (g == nullptr || aligned16(g));
}

int64_t dx_dfn_ranges(int64_t tokens) { return (tokens + kDxfSpan - 1) / kDxfSpan; }

// One launch of a dx + d fn kernel (dx_dfn_kernel or dx_dfn_wgmma_kernel: the same arguments),
// then, past one range of tokens, the sum of the ranges' d fn slabs.
template <typename Kernel>
int launch_dx_dfn(const char* what, Kernel kernel, int threads, int smem, const DxArgs<bf16>& a,
                  const bf16* coef3, float* dfn, float* scratch, cudaStream_t s) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess)  // several blocks per SM: all of the SM's shared memory
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess)
    return set_error(static_cast<int>(err), "%s: %d bytes of shared memory refused: %s", what, smem,
                     cudaGetErrorString(err));
  const int64_t ranges = dx_dfn_ranges(a.tokens);
  const dim3 grid(static_cast<unsigned>(a.hidden / kDxfCols * a.hc), static_cast<unsigned>(ranges));
  kernel<<<grid, threads, smem, s>>>(a.x, a.g, a.fn, coef3, a.coef_c, a.pre, a.dx,
                                     ranges > 1 ? scratch : dfn, a.tokens, a.hc, a.hidden, a.mixes,
                                     static_cast<int>(opslot_mhc_dx_dfn_coef_pitch(a.mixes)));
  if (ranges == 1) return check_launch(what);
  if (int rc = check_launch(what)) return rc;
  const int64_t n = static_cast<int64_t>(a.mixes) * a.hc * a.hidden;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  dfn_reduce_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(scratch, static_cast<int>(ranges),
                                                                  n, dfn);
  return check_launch(what);
}

template <int MAXM, int STAGES, int MINB>
int launch_dx_dfn_mma(const char* what, const DxArgs<bf16>& a, const bf16* coef3, float* dfn,
                      float* scratch, cudaStream_t s) {
  return launch_dx_dfn(what, dx_dfn_kernel<MAXM, STAGES, MINB>, 256, DxfShape<MAXM>::kSmem(STAGES),
                       a, coef3, dfn, scratch, s);
}

template <int MAXM, int STAGES, int MINB, int WGS>
int launch_dx_dfn_wgmma(const char* what, const DxArgs<bf16>& a, const bf16* coef3, float* dfn,
                        float* scratch, cudaStream_t s) {
  return launch_dx_dfn(what, dx_dfn_wgmma_kernel<MAXM, STAGES, MINB, WGS>, 128 * WGS,
                       Dxf90Shape<MAXM>::kSmem(STAGES, WGS), a, coef3, dfn, scratch, s);
}

// The production dx + d fn: dx_dfn_wgmma_kernel on compute capability 9.0 (two warpgroups with a
// 2-deep ring each, two blocks per SM), else dx_dfn_kernel (3-deep, two blocks per SM).
template <int MAXM>
int launch_dx_dfn_production(const char* what, const DxArgs<bf16>& a, const bf16* coef3, float* dfn,
                             float* scratch, cudaStream_t s) {
  if (device_is_sm90()) return launch_dx_dfn_wgmma<MAXM, 2, 2, 2>(what, a, coef3, dfn, scratch, s);
  return launch_dx_dfn_mma<MAXM, 3, 2>(what, a, coef3, dfn, scratch, s);
}

#ifdef OPSLOT_KERNELS_BENCH
// Bench-library versions of the fused kernel (opslot_mhc_set_tuning dx_version; the same bits
// within each kernel): 13 and 14 dx_dfn_kernel with a 2-deep / a 4-deep ring, 15 dx_dfn_kernel's
// production ring on any device, 16 and 17 dx_dfn_wgmma_kernel with one warpgroup per block, a
// 2-deep ring and three blocks per SM / a 3-deep ring and two (Hopper only).
template <int MAXM>
int launch_dx_dfn_variant(int version, const char* what, const DxArgs<bf16>& a, const bf16* coef3,
                          float* dfn, float* scratch, cudaStream_t s) {
  switch (version) {
    case 13:
      return launch_dx_dfn_mma<MAXM, 2, 2>(what, a, coef3, dfn, scratch, s);
    case 14:
      return launch_dx_dfn_mma<MAXM, 4, 2>(what, a, coef3, dfn, scratch, s);
    case 15:
      return launch_dx_dfn_mma<MAXM, 3, 2>(what, a, coef3, dfn, scratch, s);
    case 16:
    case 17:
      if (!device_is_sm90())
        return set_error(OPSLOT_ERR_UNSUPPORTED,
                         "%s: dx_version %d runs dx_dfn_wgmma_kernel, compute capability 9.0 only",
                         what, version);
      return version == 16 ? launch_dx_dfn_wgmma<MAXM, 2, 3, 1>(what, a, coef3, dfn, scratch, s)
                           : launch_dx_dfn_wgmma<MAXM, 3, 2, 1>(what, a, coef3, dfn, scratch, s);
    default:
      return launch_dx_dfn_production<MAXM>(what, a, coef3, dfn, scratch, s);
  }
}
#endif  // OPSLOT_KERNELS_BENCH

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int opslot_mhc_split3(const float* w, int64_t n, void* out, void* stream) {
  if (n < 0 || (n > 0 && (w == nullptr || out == nullptr)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "opslot_mhc_split3: bad arguments");
  if (n == 0) return OPSLOT_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  split3_kernel<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      w, n, static_cast<bf16*>(out));
  return check_launch("opslot_mhc_split3");
}

OPSLOT_API int opslot_mhc_collapse_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const float* p, int64_t nsplit,
                                       int64_t ldp, const float* scale, const float* base,
                                       float norm_eps, float hc_eps, void* out, float* mix,
                                       float* rstd, void* stream) {
  const char* what = "opslot_mhc_collapse_fwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (nsplit < 1 || nsplit > 3 || ldp < nsplit * mixes)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad nsplit %lld / ldp %lld", what,
                     static_cast<long long>(nsplit), static_cast<long long>(ldp));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {x, out});
    const int64_t nvec = vec ? hidden / kVec : hidden;
    const int threads = collapse_fwd_threads(nvec);
    const bool held =
        threads <= g_hold_threads && nvec <= static_cast<int64_t>(threads) * kRowVectors;
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel, int block = 0) {
        kernel<<<static_cast<unsigned>(tokens), block != 0 ? block : threads, 0, s>>>(
            static_cast<const T*>(x), p, static_cast<int>(nsplit), ldp, scale, base, norm_eps,
            hc_eps, static_cast<T*>(out), mix, rstd, hidden, static_cast<int>(mixes));
      };
      const int64_t nv = (nvec + threads - 1) / threads;
      if (collapse_form() == 2 && vec && !held && g_fwd_threads == 0 && nv <= 2) {
        auto pipe = [&](auto nv_tag) {  // nv_tag: 16-byte vectors a stream and thread
          constexpr auto kernel =
              &collapse_fwd_pipe_kernel<T, HC, kVec, decltype(nv_tag)::value, kCollapseFwdThreads>;
          int64_t grid = 0;
          if (int rc = one_wave<kernel>(what, threads, &grid)) return rc;
          if (grid > tokens) grid = tokens;
          kernel<<<static_cast<unsigned>(grid), threads, 0, s>>>(
              tokens, static_cast<const T*>(x), p, static_cast<int>(nsplit), ldp, scale, base,
              norm_eps, hc_eps, static_cast<T*>(out), mix, rstd, hidden, static_cast<int>(mixes));
          return check_launch(what);
        };
        if (nv == 1) return pipe(std::integral_constant<int, 1>{});
        return pipe(std::integral_constant<int, 2>{});
      }
      if constexpr (kBench) {  // the held rows and other block sizes: bench library only
        if (g_fwd_threads != 0 && vec && !held) {
          launch(collapse_fwd_kernel<T, HC, kVec, false, 1024>, g_fwd_threads);
          return check_launch(what);
        }
        if (held) {
          if (vec)
            launch(collapse_fwd_kernel<T, HC, kVec, true>);
          else
            launch(collapse_fwd_kernel<T, HC, 1, true>);
          return check_launch(what);
        }
      }
      if (vec)
        launch(collapse_fwd_kernel<T, HC, kVec, false, kCollapseFwdThreads>);
      else
        launch(collapse_fwd_kernel<T, HC, 1, false, kCollapseFwdThreads>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_comb_fwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps, float* post,
                                   float* comb, void* stream) {
  const char* what = "opslot_mhc_comb_fwd";
  if (int rc = check_shape(what, tokens, hc, 1)) return rc;
  if (iters < 0 || iters > (1 << 20))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: hc_sinkhorn_iters %lld", what,
                     static_cast<long long>(iters));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
    constexpr int HC = decltype(hc_tag)::value;
    if constexpr (kBench) {
      if (comb_form() == 1) {
        const unsigned blocks = static_cast<unsigned>((tokens + 127) / 128);
        comb_fwd_kernel<HC><<<blocks, 128, 0, s>>>(tokens, static_cast<int>(iters), mix, scale,
                                                   base, hc_eps, post, comb);
        return check_launch(what);
      }
    }
    constexpr int G = comb_lanes<HC>();
    const unsigned blocks = static_cast<unsigned>((tokens * G + 255) / 256);
    comb_fwd_lanes_kernel<HC><<<blocks, 256, 0, s>>>(tokens, static_cast<int>(iters), mix, scale,
                                                     base, hc_eps, post, comb);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_mhc_comb_bwd(int64_t tokens, int64_t hc, int64_t iters, const float* mix,
                                   const float* scale, const float* base, float hc_eps,
                                   const float* g_post, const float* g_comb, float* da,
                                   void* stream) {
  const char* what = "opslot_mhc_comb_bwd";
  if (int rc = check_shape(what, tokens, hc, 1)) return rc;
  if (iters < 0 || iters > 1600)
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: hc_sinkhorn_iters %lld (the backward keeps every step: at most 1600)",
                     what, static_cast<long long>(iters));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
    constexpr int HC = decltype(hc_tag)::value;
    // a block keeps the steps' matrices of 8 tokens (32 in the bench library's thread-a-token
    // form), fewer where they do not fit in 200 KB
    const bool lanes = comb_form() == 2;
    constexpr int G = comb_lanes<HC>();
    const int64_t per_token = static_cast<int64_t>(mhc::sinkhorn_steps(static_cast<int>(iters))) *
                              (lanes ? G : HC * HC) * static_cast<int64_t>(sizeof(float));
    int64_t tpb = (200 << 10) / per_token;
    if (tpb > (lanes ? 8 : 32)) tpb = lanes ? 8 : 32;
    if (tpb < 1) tpb = 1;
    const size_t smem = static_cast<size_t>(per_token * tpb);
    auto kernel = comb_bwd_lanes_kernel<HC>;
    if constexpr (kBench) {
      if (!lanes) kernel = comb_bwd_kernel<HC>;
    }
    if (smem > (48 << 10)) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess)
        return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                         smem, cudaGetErrorString(err));
    }
    const unsigned blocks = static_cast<unsigned>((tokens + tpb - 1) / tpb);
    kernel<<<blocks, static_cast<unsigned>(tpb * (lanes ? G : 1)), smem, s>>>(
        tokens, static_cast<int>(iters), mix, scale, base, hc_eps, g_post, g_comb, da);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_mhc_token_sums(int64_t tokens, const float* a, int64_t na, const float* b,
                                     int64_t nb, float* sa, float* sb, void* stream) {
  const char* what = "opslot_mhc_token_sums";
  if (tokens < 0 || na < 0 || nb < 0 || na + nb > 65535 ||
      (na > 0 && ((tokens > 0 && a == nullptr) || sa == nullptr)) ||
      (nb > 0 && ((tokens > 0 && b == nullptr) || sb == nullptr)))
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad arguments (tokens %lld, na %lld, nb %lld)", what,
        static_cast<long long>(tokens), static_cast<long long>(na), static_cast<long long>(nb));
  if (na + nb == 0) return OPSLOT_OK;
  token_sums_kernel<<<static_cast<unsigned>(na + nb), 512, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, a, static_cast<int>(na), b, static_cast<int>(nb), sa, sb);
  return check_launch(what);
}

OPSLOT_API int opslot_mhc_collapse_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                       int64_t mixes, const void* x, const void* g_out,
                                       const float* mix, const float* rstd, const float* scale,
                                       const float* base, float hc_eps, float* da, float* pre,
                                       float* dsc, float* coef_a, void* coef_a3, int64_t ld_a3,
                                       float* coef_c, void* stream) {
  const char* what = "opslot_mhc_collapse_bwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (coef_a3 != nullptr && ld_a3 < 3 * mixes)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: ld_a3 %lld < 3 x %lld mixes", what,
                     static_cast<long long>(ld_a3), static_cast<long long>(mixes));
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {x, g_out});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            static_cast<const T*>(x), static_cast<const T*>(g_out), mix, rstd, scale, base, hc_eps,
            da, pre, dsc, coef_a, static_cast<bf16*>(coef_a3), ld_a3, coef_c, hidden);
      };
      const bool comb = mixes > hc;
      if (vec && comb)
        launch(collapse_bwd_kernel<T, HC, kVec, true>);
      else if (vec)
        launch(collapse_bwd_kernel<T, HC, kVec, false>);
      else if (comb)
        launch(collapse_bwd_kernel<T, HC, 1, true>);
      else
        launch(collapse_bwd_kernel<T, HC, 1, false>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_dx(int dtype, int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                             const void* x, const void* g_out, const float* fn, const float* coef_a,
                             const float* coef_c, const float* pre, void* dx, void* stream) {
  const char* what = "opslot_mhc_dx";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (hc > mhc::kMaxHc)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: hc_mult %lld is not supported (1 to %d)", what,
                     static_cast<long long>(hc), mhc::kMaxHc);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    const DxArgs<T> a{static_cast<const T*>(x),
                      static_cast<const T*>(g_out),
                      fn,
                      coef_a,
                      coef_c,
                      pre,
                      static_cast<T*>(dx),
                      tokens,
                      static_cast<int>(hc),
                      hidden,
                      static_cast<int>(mixes)};
    const bool comb = mixes > hc;
#ifdef OPSLOT_KERNELS_BENCH
    if (g_dx_version != 1)
      return comb ? launch_dx_variant<T, mhc::kMaxMixes>(g_dx_version, what, a, s)
                  : launch_dx_variant<T, mhc::kMaxHc>(g_dx_version, what, a, s);
#endif  // OPSLOT_KERNELS_BENCH
    return comb ? launch_dx_production<T, mhc::kMaxMixes>(what, a, s)
                : launch_dx_production<T, mhc::kMaxHc>(what, a, s);
  });
}

OPSLOT_API int opslot_mhc_dx_dfn_fits(int dtype, int64_t hc, int64_t hidden, int64_t mixes,
                                      const void* x, const void* g_out, const void* dx) {
  return dx_dfn_fits(dtype, hc, hidden, mixes, x, g_out, dx) ? 1 : 0;
}

OPSLOT_API int64_t opslot_mhc_dx_dfn_scratch_floats(int64_t tokens, int64_t hc, int64_t hidden,
                                                    int64_t mixes) {
  const char* what = "opslot_mhc_dx_dfn_scratch_floats";
  if (check_shape(what, tokens, hc, hidden) != OPSLOT_OK ||
      check_mixes(what, hc, mixes) != OPSLOT_OK)
    return -1;
  const int64_t ranges = dx_dfn_ranges(tokens);
  return ranges > 1 ? ranges * mixes * hc * hidden : 0;
}

OPSLOT_API int opslot_mhc_dx_dfn(int64_t tokens, int64_t hc, int64_t hidden, int64_t mixes,
                                 const void* x, const void* g_out, const float* fn,
                                 const void* coef_a3, const float* coef_c, const float* pre,
                                 void* dx, float* dfn, float* scratch, void* stream) {
  const char* what = "opslot_mhc_dx_dfn";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (int rc = check_mixes(what, hc, mixes)) return rc;
  if (!dx_dfn_fits(OPSLOT_BFLOAT16, hc, hidden, mixes, x, g_out, dx))
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: bfloat16 streams with hidden a multiple of %d and 16-byte aligned rows "
                     "only (hidden %lld; opslot_mhc_dx_dfn_fits)",
                     what, kDxfCols, static_cast<long long>(hidden));
  auto s = static_cast<cudaStream_t>(stream);
  if (tokens == 0) {
    const cudaError_t err = cudaMemsetAsync(dfn, 0, mixes * hc * hidden * sizeof(float), s);
    return err == cudaSuccess
               ? OPSLOT_OK
               : set_error(static_cast<int>(err), "%s: %s", what, cudaGetErrorString(err));
  }
  const int64_t ranges = dx_dfn_ranges(tokens);
  if (ranges > 65535 || (ranges > 1 && scratch == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %lld tokens need %lld scratch floats", what,
                     static_cast<long long>(tokens),
                     static_cast<long long>(ranges * mixes * hc * hidden));
  if (!aligned16(coef_a3))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: coef_a3 is not 16-byte aligned", what);
  const DxArgs<bf16> a{static_cast<const bf16*>(x),
                       static_cast<const bf16*>(g_out),
                       fn,
                       nullptr,
                       coef_c,
                       pre,
                       static_cast<bf16*>(dx),
                       tokens,
                       static_cast<int>(hc),
                       hidden,
                       static_cast<int>(mixes)};
  const auto* coef3 = static_cast<const bf16*>(coef_a3);
  const bool comb = mixes > hc;
#ifdef OPSLOT_KERNELS_BENCH
  if (g_dx_version != 1)
    return comb ? launch_dx_dfn_variant<mhc::kMaxMixes>(g_dx_version, what, a, coef3, dfn, scratch,
                                                        s)
                : launch_dx_dfn_variant<mhc::kMaxHc>(g_dx_version, what, a, coef3, dfn, scratch, s);
#endif  // OPSLOT_KERNELS_BENCH
  return comb ? launch_dx_dfn_production<mhc::kMaxMixes>(what, a, coef3, dfn, scratch, s)
              : launch_dx_dfn_production<mhc::kMaxHc>(what, a, coef3, dfn, scratch, s);
}

OPSLOT_API int opslot_mhc_post_fwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const float* post, const float* comb, const void* block_out,
                                   const void* streams, void* out, void* stream) {
  const char* what = "opslot_mhc_post_fwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {block_out, streams, out});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            post, comb, static_cast<const T*>(block_out), static_cast<const T*>(streams),
            static_cast<T*>(out), hidden);
      };
      if (vec)
        launch(post_fwd_kernel<T, HC, kVec>);
      else
        launch(post_fwd_kernel<T, HC, 1>);
      return check_launch(what);
    });
  });
}

OPSLOT_API int opslot_mhc_post_bwd(int dtype, int64_t tokens, int64_t hc, int64_t hidden,
                                   const void* grad, const float* post, const float* comb,
                                   const void* block_out, const void* streams, void* d_block_out,
                                   void* d_streams, float* d_post, float* d_comb, void* stream) {
  const char* what = "opslot_mhc_post_bwd";
  if (int rc = check_shape(what, tokens, hc, hidden)) return rc;
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = use_vectors<T>(hidden, {grad, block_out, streams, d_block_out, d_streams});
    const int threads = stream_threads(vec ? hidden / kVec : hidden);
    return dispatch_hc(hc, what, [&](auto hc_tag) -> int {
      constexpr int HC = decltype(hc_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(tokens), threads, 0, s>>>(
            static_cast<const T*>(grad), post, comb, static_cast<const T*>(block_out),
            static_cast<const T*>(streams), static_cast<T*>(d_block_out),
            static_cast<T*>(d_streams), d_post, d_comb, hidden);
      };
      if (vec)
        launch(post_bwd_kernel<T, HC, kVec>);
      else
        launch(post_bwd_kernel<T, HC, 1>);
      return check_launch(what);
    });
  });
}

#ifdef OPSLOT_KERNELS_BENCH
OPSLOT_API int opslot_mhc_set_tuning(int hold_max_threads, int dx_version) {
  if ((hold_max_threads != 0 && hold_max_threads != 64 && hold_max_threads != 128 &&
       hold_max_threads != 256) ||
      dx_version < 1 || dx_version > 17)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "mhc tuning: hold_max_threads 0, 64, 128 or 256 (got %d), dx_version 1 to 17 "
                     "(got %d)",
                     hold_max_threads, dx_version);
  g_hold_threads = hold_max_threads;
  g_dx_version = dx_version;
  return OPSLOT_OK;
}

OPSLOT_API int opslot_mhc_forms_set_tuning(int collapse_form, int comb_form) {
  if (collapse_form < 0 || collapse_form > 2 || comb_form < 0 || comb_form > 2)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "mhc tuning: collapse_fwd form 0, 1 or 2 (got %d), comb form 0, 1 or 2 "
                     "(got %d)",
                     collapse_form, comb_form);
  g_collapse_form = collapse_form;
  g_comb_form = comb_form;
  return OPSLOT_OK;
}

OPSLOT_API int opslot_mhc_collapse_set_tuning(int threads) {
  if (threads != 0 && (threads < 32 || threads > 1024 || threads % 32 != 0))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "mhc tuning: fwd threads 0 or a multiple of 32 up to 1024 (got %d)", threads);
  g_fwd_threads = threads;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH

}  // extern "C"
