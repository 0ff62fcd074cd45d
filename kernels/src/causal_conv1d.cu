// Depthwise causal conv1d: forward, backward (+ the fixed-order weight-gradient reduction) and the
// decode update. See kernels/include/opslot_kernels/causal_conv1d.h and docs/kernels.md
// ("causal_conv1d").
//
// Work layout (forward and backward): a block is 4 warps; a warp's 32 lanes hold 32 consecutive
// channel vectors (VEC channels each) of one time step, and the warp walks its own run of time
// steps keeping the previous W-1 inputs (forward) or the next W-1 pre-activation gradients
// (backward) in registers, so each element is loaded once (plus a W-1 row halo per run). Each lane
// streams its rows through a private ring of shared memory filled by cp.async, kStages-1 groups of
// kUnroll rows ahead of the arithmetic, so in-flight loads hold no registers. Block items are
// (channel group, batch, time tile of 4 runs), sized so that the grid is about kWaves resident
// waves of equal blocks.
//
// The relayout kernel copies a gradient into x's layout (a tiled transpose) for the backward's
// vector path.
//
// The device helpers are in causal_conv1d_device.cuh, the kernels in causal_conv1d_kernels.cuh;
// this file holds the launchers and the extern "C" entry points.
#include <atomic>

#include "causal_conv1d_kernels.cuh"

namespace opslot {
namespace {

// ------------------------------------------------------------------------------------------------
// Launchers

// Resident blocks of `kernel` per SM (queried once per kernel; at least 1).
template <typename K>
int blocks_per_sm(K kernel, std::atomic<int>& cached) {
  int n = cached.load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess ||
      n <= 0) {
    cudaGetLastError();  // a failed query only costs the geometry's balance
    n = 1;
  }
  cached.store(n, std::memory_order_relaxed);
  return n;
}

template <typename T, int W>
int fwd_blocks_per_sm() {
  static std::atomic<int> cached{0};
  return blocks_per_sm(conv_fwd_kernel<T, kFwdBytes / sizeof(T), W>, cached);
}

template <typename T, int W>
int bwd_blocks_per_sm() {
  static std::atomic<int> cached{0};
  return blocks_per_sm(conv_bwd_kernel<T, kBwdBytes / sizeof(T), W>, cached);
}

// Tiles and run length: at most kWaves full waves of the vector path's blocks (rounded down: a
// partial extra wave of equal blocks would cost a whole block's time), runs of at least kMinSteps.
// `vec` (the path taken) only sets the channel groups, so the backward's partial rows (B * tiles)
// do not depend on the path.
Geometry geometry_for(const Problem& p, int vector_vec, int vec, int blocks_per_sm) {
  const int64_t pairs = imax(cdiv(p.C, 32 * vector_vec) * p.B, 1);
  const int64_t capacity = static_cast<int64_t>(num_sms()) * blocks_per_sm;
  int64_t tiles = imin(imax(kWaves * capacity / pairs, 1), imax(cdiv(p.T, kWarps * kMinSteps), 1));
  const int64_t steps = imax(cdiv(p.T, tiles * kWarps), 1);
  tiles = imax(cdiv(p.T, kWarps * steps), 1);
  return Geometry{cdiv(p.C, 32 * vec), tiles, steps};
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Strides of a [B, C, T] tensor with those of its size-1 dimensions neutralised (never stepped).
Strides strides_of(const int64_t* s, int64_t B, int64_t C, int64_t T) {
  return Strides{B > 1 ? s[0] : 0, C > 1 ? s[1] : 1, T > 1 ? s[2] : 0};
}

// The vector path: channel stride 1 and every (batch, time) row start aligned to the vector.
template <typename T, int VEC>
bool vector_ok(const void* ptr, const Strides& s) {
  return s.c == 1 && aligned(ptr, VEC * sizeof(T)) && s.t % VEC == 0 && s.b % VEC == 0;
}

int check_grid(const char* what, const Geometry& g, int64_t B) {
  if (g.groups * g.tiles * B > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: input too large", what);
  return OPSLOT_OK;
}

template <typename T, int W>
int launch_fwd(const Problem& p, const T* x, Strides xs, T* out, Strides os, cudaStream_t s) {
  constexpr int kVec = kFwdBytes / sizeof(T);
  const bool vec = vector_ok<T, kVec>(x, xs) && vector_ok<T, kVec>(out, os);
  const Geometry g = geometry_for(p, kVec, vec ? kVec : 1, fwd_blocks_per_sm<T, W>());
  if (int rc = check_grid("causal_conv1d forward", g, p.B)) return rc;
  const unsigned grid = static_cast<unsigned>(g.groups * g.tiles * p.B);
  if (vec)
    conv_fwd_kernel<T, kVec, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, out, os);
  else
    conv_fwd_kernel<T, 1, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, out, os);
  return check_launch("causal_conv1d forward");
}

template <typename T, int W>
Geometry bwd_geometry(const Problem& p, int vec) {
  return geometry_for(p, kBwdBytes / sizeof(T), vec, bwd_blocks_per_sm<T, W>());
}

int64_t partial_rows(const Problem& p, const Geometry& g) {
  return p.B * p.T > 0 ? p.B * g.tiles : 0;
}

template <typename T>
int launch_reduce(const Problem& p, int W, const float* partial, int64_t rows, void* dweight,
                  void* dbias, cudaStream_t s) {
  const int64_t blocks = imin(imax(cdiv((W + 1) * p.C, kSimpleThreads), 1), 4096);
  conv_dw_reduce_kernel<T><<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(
      p, W, partial, rows, dweight, dbias);
  return check_launch("causal_conv1d weight-gradient reduction");
}

template <typename T, int W>
int launch_bwd(const Problem& p, const T* x, Strides xs, const T* grad, Strides gs, T* dx,
               Strides ds, void* dweight, void* dbias, float* scratch, cudaStream_t s) {
  constexpr int kVec = kBwdBytes / sizeof(T);
  const bool vec =
      vector_ok<T, kVec>(x, xs) && vector_ok<T, kVec>(grad, gs) && vector_ok<T, kVec>(dx, ds);
  const Geometry g = bwd_geometry<T, W>(p, vec ? kVec : 1);
  const int64_t rows = partial_rows(p, g);
  if (rows > 0) {
    if (int rc = check_grid("causal_conv1d backward", g, p.B)) return rc;
    const unsigned grid = static_cast<unsigned>(g.groups * g.tiles * p.B);
    if (vec)
      conv_bwd_kernel<T, kVec, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, grad, gs, dx, ds, scratch);
    else
      conv_bwd_kernel<T, 1, W><<<grid, kThreads, 0, s>>>(p, g, x, xs, grad, gs, dx, ds, scratch);
    if (int rc = check_launch("causal_conv1d backward")) return rc;
  }
  return launch_reduce<T>(p, W, scratch, rows, dweight, dbias, s);
}

template <typename T>
int launch_update(const Problem& p, int W, const T* x, Strides xs, T* state, int64_t S, Strides ss,
                  T* out, Strides os, cudaStream_t s) {
  const int64_t blocks = cdiv(p.B * p.C, kSimpleThreads);
  if (blocks > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "causal_conv1d update: too many channels");
  conv_update_kernel<T>
      <<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(p, W, x, xs, state, S, ss, out, os);
  return check_launch("causal_conv1d update");
}

// Lanes along time on a side whose time stride is the smaller (a degenerate dimension never leads).
bool lanes_along_time(const Strides& s, int64_t C, int64_t T) {
  return C == 1 || (T > 1 && s.t < s.c);
}

template <typename E>
int launch_relayout(int64_t B, int64_t C, int64_t T, const void* src, Strides ss, void* dst,
                    Strides ds, cudaStream_t s) {
  const int64_t ctiles = cdiv(C, kTile), ttiles = cdiv(T, kTile), blocks = B * ctiles * ttiles;
  if (blocks > INT32_MAX)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "causal_conv1d relayout: input too large");
  const RelayoutSide<const E> in{static_cast<const E*>(src), ss, lanes_along_time(ss, C, T)};
  const RelayoutSide<E> out{static_cast<E*>(dst), ds, lanes_along_time(ds, C, T)};
  conv_relayout_kernel<E>
      <<<static_cast<unsigned>(blocks), kSimpleThreads, 0, s>>>(C, T, ctiles, ttiles, in, out);
  return check_launch("causal_conv1d relayout");
}

template <typename F>
auto dispatch_width(int width, F&& f) {
  switch (width) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

bool valid_dtype(int d) {
  return d == OPSLOT_FLOAT32 || d == OPSLOT_FLOAT16 || d == OPSLOT_BFLOAT16;
}

// Checks what every entry point shares and fills `p`; OPSLOT_OK or an error code (message set).
int make_problem(const char* what, int dtype, int64_t B, int64_t C, int64_t T, int width,
                 int weight_dtype, const void* weight, int bias_dtype, const void* bias,
                 const void* cu, int cu64, int64_t nseg, int silu, Problem& p) {
  if (B < 0 || C < 0 || T < 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative size", what);
  if (width < 2 || width > kMaxWidth)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kernel width %d (2 to %d supported)", what,
                     width, kMaxWidth);
  if (!valid_dtype(dtype))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  if ((weight_dtype != dtype && weight_dtype != OPSLOT_FLOAT32) ||
      (bias_dtype != dtype && bias_dtype != OPSLOT_FLOAT32))
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT,
        "%s: weight/bias dtype codes %d/%d with input dtype %d (float32 or the input's dtype)",
        what, weight_dtype, bias_dtype, dtype);
  if (T > INT32_MAX - 64)
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: sequence of %lld steps", what,
                     static_cast<long long>(T));
  if (C > 0 && !weight) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null weight", what);
  if (cu && (B != 1 || nseg < 1 || (cu64 != 0 && cu64 != 1)))
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT,
        "%s: cu_seqlens needs batch 1 and at least one segment (batch %lld, %lld segments)", what,
        static_cast<long long>(B), static_cast<long long>(nseg));
  p = Problem{B,
              C,
              T,
              weight,
              bias,
              cu,
              nseg,
              weight_dtype == OPSLOT_FLOAT32,
              bias_dtype == OPSLOT_FLOAT32,
              cu64 == 1,
              silu != 0};
  return OPSLOT_OK;
}

template <typename T>
int64_t bwd_scratch_floats_t(const Problem& p, int width) {
  return dispatch_width(width, [&](auto w) -> int64_t {
    constexpr int kW = decltype(w)::value;
    return partial_rows(p, bwd_geometry<T, kW>(p, 1)) * (kW + 1) * p.C;
  });
}

// Floats of partial rows the backward writes (dtype already checked).
int64_t bwd_scratch_floats(int dtype, const Problem& p, int width) {
  if (dtype == OPSLOT_FLOAT32) return bwd_scratch_floats_t<float>(p, width);
  if (dtype == OPSLOT_FLOAT16) return bwd_scratch_floats_t<__half>(p, width);
  return bwd_scratch_floats_t<__nv_bfloat16>(p, width);
}

}  // namespace
}  // namespace opslot

using namespace opslot;

// ------------------------------------------------------------------------------------------------
// Entry points

extern "C" {

OPSLOT_API int opslot_causal_conv1d_fwd(int dtype, int64_t batch, int64_t channels, int64_t seqlen,
                                        int width, const void* x, const int64_t* x_strides,
                                        int weight_dtype, const void* weight, int bias_dtype,
                                        const void* bias, const void* cu_seqlens,
                                        int cu_seqlens_int64, int64_t num_segments, int silu,
                                        void* out, const int64_t* out_strides, void* stream) {
  const char* what = "causal_conv1d forward";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, cu_seqlens, cu_seqlens_int64, num_segments, silu, p))
    return rc;
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!x || !out || !x_strides || !out_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides xs = strides_of(x_strides, batch, channels, seqlen),
                os = strides_of(out_strides, batch, channels, seqlen);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return dispatch_width(width, [&](auto w) -> int {
      return launch_fwd<T, decltype(w)::value>(p, static_cast<const T*>(x), xs,
                                               static_cast<T*>(out), os,
                                               static_cast<cudaStream_t>(stream));
    });
  });
}

OPSLOT_API int64_t opslot_causal_conv1d_bwd_scratch_floats(int dtype, int64_t batch,
                                                           int64_t channels, int64_t seqlen,
                                                           int width) {
  if (!valid_dtype(dtype) || batch < 0 || channels < 0 || seqlen < 0 || width < 2 ||
      width > kMaxWidth) {
    set_error(OPSLOT_ERR_INVALID_ARGUMENT,
              "causal_conv1d backward scratch: dtype %d, shape [%lld, %lld, %lld], width %d", dtype,
              static_cast<long long>(batch), static_cast<long long>(channels),
              static_cast<long long>(seqlen), width);
    return -1;
  }
  const Problem p{batch, channels, seqlen, nullptr, nullptr, nullptr,
                  0,     false,    false,  false,   false};
  return bwd_scratch_floats(dtype, p, width);
}

OPSLOT_API int opslot_causal_conv1d_bwd(
    int dtype, int64_t batch, int64_t channels, int64_t seqlen, int width, const void* x,
    const int64_t* x_strides, const void* grad, const int64_t* grad_strides, int weight_dtype,
    const void* weight, int bias_dtype, const void* bias, const void* cu_seqlens,
    int cu_seqlens_int64, int64_t num_segments, int silu, void* dx, const int64_t* dx_strides,
    void* dweight, void* dbias, float* scratch, int64_t scratch_floats, void* stream) {
  const char* what = "causal_conv1d backward";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, cu_seqlens, cu_seqlens_int64, num_segments, silu, p))
    return rc;
  if (channels == 0) return OPSLOT_OK;
  const bool empty = batch * seqlen == 0;
  if (!dweight || (!empty && (!x || !grad || !dx || !x_strides || !grad_strides || !dx_strides)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const int64_t need = bwd_scratch_floats(dtype, p, width);
  if (need > 0 && (!scratch || scratch_floats < need))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: scratch of %lld floats, %lld needed", what,
                     static_cast<long long>(scratch_floats), static_cast<long long>(need));
  const Strides none{0, 1, 0};
  const Strides xs = empty ? none : strides_of(x_strides, batch, channels, seqlen);
  const Strides gs = empty ? none : strides_of(grad_strides, batch, channels, seqlen);
  const Strides ds = empty ? none : strides_of(dx_strides, batch, channels, seqlen);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return dispatch_width(width, [&](auto w) -> int {
      return launch_bwd<T, decltype(w)::value>(
          p, static_cast<const T*>(x), xs, static_cast<const T*>(grad), gs, static_cast<T*>(dx), ds,
          dweight, dbias, scratch, static_cast<cudaStream_t>(stream));
    });
  });
}

OPSLOT_API int opslot_causal_conv1d_relayout(int dtype, int64_t batch, int64_t channels,
                                             int64_t seqlen, const void* src,
                                             const int64_t* src_strides, void* dst,
                                             const int64_t* dst_strides, void* stream) {
  const char* what = "causal_conv1d relayout";
  if (!valid_dtype(dtype))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  if (batch < 0 || channels < 0 || seqlen < 0)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative size", what);
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!src || !dst || !src_strides || !dst_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides ss = strides_of(src_strides, batch, channels, seqlen),
                ds = strides_of(dst_strides, batch, channels, seqlen);
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == OPSLOT_FLOAT32)
    return launch_relayout<uint32_t>(batch, channels, seqlen, src, ss, dst, ds, s);
  return launch_relayout<uint16_t>(batch, channels, seqlen, src, ss, dst, ds, s);
}

OPSLOT_API int opslot_causal_conv1d_update(int dtype, int64_t batch, int64_t channels,
                                           int64_t seqlen, int width, const void* x,
                                           const int64_t* x_strides, void* conv_state,
                                           int64_t state_len, const int64_t* state_strides,
                                           int weight_dtype, const void* weight, int bias_dtype,
                                           const void* bias, int silu, void* out,
                                           const int64_t* out_strides, void* stream) {
  const char* what = "causal_conv1d update";
  Problem p;
  if (int rc = make_problem(what, dtype, batch, channels, seqlen, width, weight_dtype, weight,
                            bias_dtype, bias, nullptr, 0, 0, silu, p))
    return rc;
  if (state_len < width - 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: conv_state of %lld columns for kernel width %d (needs >= %d)", what,
                     static_cast<long long>(state_len), width, width - 1);
  if (batch * channels * seqlen == 0) return OPSLOT_OK;
  if (!x || !conv_state || !out || !x_strides || !state_strides || !out_strides)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
  const Strides xs = strides_of(x_strides, batch, channels, seqlen),
                os = strides_of(out_strides, batch, channels, seqlen);
  const Strides ss = strides_of(state_strides, batch, channels, state_len);
  return dispatch_dtype(dtype, what, [&](auto t) -> int {
    using T = decltype(t);
    return launch_update<T>(p, width, static_cast<const T*>(x), xs, static_cast<T*>(conv_state),
                            state_len, ss, static_cast<T*>(out), os,
                            static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
