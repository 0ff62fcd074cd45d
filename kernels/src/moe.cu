// MoE experts: token scatter/gather-sum, gated activations, bias-gradient segment sums and a
// portable grouped GEMM (see opslot_kernels/moe.h for the layout; docs/kernels.md "## MoE experts"
// for the design).
//
// The fast bf16 GEMMs of the layer are torch._grouped_mm (CUTLASS, sm90/sm100), called from Python;
// the grouped GEMM here is the path for fp16/fp32, other GPUs and unaligned widths: SIMT tiles with
// fp32 accumulation whose row segments are found on the device from `offs`, so no host read.
//
// The kernels are in moe_kernels.cuh and moe_gemm.cuh; this file holds the launchers and the C ABI.
#include "moe_gemm.cuh"

namespace opslot {
namespace {

// ---- host helpers ---------------------------------------------------------------------------
template <typename T>
constexpr int vec_width() {
  return 16 / static_cast<int>(sizeof(T));
}

int row_threads(int64_t vectors) {
  int64_t t = (vectors + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 256) t = 256;
  return static_cast<int>(t);
}

int elementwise_blocks(int64_t items, int threads) {
  int64_t b = (items + threads - 1) / threads;
  const int64_t cap = 132 * 32;  // grid-stride beyond a few waves
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return static_cast<int>(b);
}

int check_common(const char* what, const int32_t* offs, int64_t num_experts) {
  if (offs == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: offs is NULL", what);
  if (num_experts < 1 || num_experts > (1 << 20))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: num_experts %lld out of range", what,
                     static_cast<long long>(num_experts));
  return OPSLOT_OK;
}

// Arguments shared by the activation's forward and backward entry points.
int check_act_args(const char* what, const int32_t* offs, int64_t num_experts, int kind,
                   const void* bias, const int32_t* row_expert, int64_t rows, int64_t inter,
                   float limit) {
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (kind != 0 && kind != 1 && kind != 2)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown kind %d", what, kind);
  if (kind != 1 && bias)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kind %d takes no bias", what, kind);
  if (kind == 2 && !(limit >= 0.f))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: kind 2 needs a limit >= 0, got %g", what,
                     static_cast<double>(limit));
  if (bias && row_expert == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bias needs row_expert", what);
  if (rows < 0 || inter < 1) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" {

OPSLOT_API int64_t opslot_moe_route_scratch(int64_t n, int64_t num_experts) {
  const int64_t chunks = (n + kRouteChunk - 1) / kRouteChunk;
  return 2 * (chunks > 0 ? chunks : 1) * (num_experts + 1);
}

OPSLOT_API int opslot_moe_route(const void* idx, int idx_is_int64, int64_t n, int64_t top_k,
                                int64_t num_experts, int32_t* offs, int32_t* row_expert,
                                int32_t* src_token, int32_t* inv, int32_t* scratch, void* stream) {
  const char* what = "opslot_moe_route";
  if (num_experts < 1 || num_experts > kRouteMaxExperts)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: num_experts %lld outside [1, %d]", what,
                     static_cast<long long>(num_experts), kRouteMaxExperts);
  if (n < 0 || n > 0x7fffffff || top_k < 1 || offs == nullptr || scratch == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad arguments (n %lld, top_k %lld)", what,
                     static_cast<long long>(n), static_cast<long long>(top_k));
  auto s = static_cast<cudaStream_t>(stream);
  const int bins = static_cast<int>(num_experts) + 1;
  const int64_t chunks = n > 0 ? (n + kRouteChunk - 1) / kRouteChunk : 0;
  int32_t* counts = scratch;
  int32_t* bases = scratch + (chunks > 0 ? chunks : 1) * bins;
  auto launch = [&](auto tag) {
    using I = decltype(tag);
    const I* ix = static_cast<const I*>(idx);
    if (chunks > 0) {
      route_hist_kernel<I><<<static_cast<unsigned>(chunks), kRouteThreads, bins * sizeof(int), s>>>(
          ix, n, static_cast<int>(num_experts), counts);
      if (int rc = check_launch(what)) return rc;
    }
    route_scan_kernel<<<1, 1024, 0, s>>>(counts, bases, static_cast<int>(chunks),
                                         static_cast<int>(num_experts), offs);
    if (int rc = check_launch(what)) return rc;
    if (chunks > 0) {
      const size_t smem = static_cast<size_t>(bins) * (1 + kRouteThreads / 32) * sizeof(int);
      route_scatter_kernel<I><<<static_cast<unsigned>(chunks), kRouteThreads, smem, s>>>(
          ix, n, top_k, static_cast<int>(num_experts), bases, row_expert, src_token, inv);
      if (int rc = check_launch(what)) return rc;
    }
    return static_cast<int>(OPSLOT_OK);
  };
  return idx_is_int64 ? launch(int64_t{}) : launch(int32_t{});
}

OPSLOT_API int opslot_moe_scatter_rows(const void* src, void* dst, const int32_t* inv,
                                       const float* weights, const void* rows, const void* bias,
                                       const int32_t* row_expert, float* dot_out,
                                       const int32_t* offs, int64_t num_experts, int64_t tokens,
                                       int64_t top_k, int64_t hidden, int dtype, void* stream) {
  const char* what = "opslot_moe_scatter_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (tokens < 0 || top_k < 1 || hidden < 1 || tokens > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape tokens %lld top_k %lld hidden %lld", what,
                     static_cast<long long>(tokens), static_cast<long long>(top_k),
                     static_cast<long long>(hidden));
  if (dot_out && (rows == nullptr || (bias && row_expert == nullptr)))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: dot_out needs rows (and row_expert with bias)", what);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (hidden % V == 0) {
      scatter_rows_kernel<T, V><<<static_cast<unsigned>(tokens), row_threads(hidden / V), 0, s>>>(
          static_cast<const T*>(src), static_cast<T*>(dst), inv, weights,
          static_cast<const T*>(rows), static_cast<const T*>(bias), row_expert, dot_out, offs,
          static_cast<int>(num_experts), top_k, hidden);
    } else {
      scatter_rows_kernel<T, 1><<<static_cast<unsigned>(tokens), row_threads(hidden), 0, s>>>(
          static_cast<const T*>(src), static_cast<T*>(dst), inv, weights,
          static_cast<const T*>(rows), static_cast<const T*>(bias), row_expert, dot_out, offs,
          static_cast<int>(num_experts), top_k, hidden);
    }
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gather_sum(const void* rows, void* out, const int32_t* inv,
                                     const float* weights, const void* bias,
                                     const int32_t* row_expert, const int32_t* offs,
                                     int64_t num_experts, int64_t tokens, int64_t top_k,
                                     int64_t hidden, int dtype, void* stream) {
  const char* what = "opslot_moe_gather_sum";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (tokens < 0 || top_k < 1 || hidden < 1 || tokens > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (bias && row_expert == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bias needs row_expert", what);
  if (tokens == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (hidden % V == 0) {
      gather_sum_kernel<T, V><<<static_cast<unsigned>(tokens), row_threads(hidden / V), 0, s>>>(
          static_cast<const T*>(rows), static_cast<T*>(out), inv, weights,
          static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), top_k,
          hidden);
    } else {
      gather_sum_kernel<T, 1><<<static_cast<unsigned>(tokens), row_threads(hidden), 0, s>>>(
          static_cast<const T*>(rows), static_cast<T*>(out), inv, weights,
          static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), top_k,
          hidden);
    }
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_act_forward(const void* h, void* a, const void* bias,
                                      const int32_t* row_expert, const int32_t* offs,
                                      int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                      float alpha, float limit, int dtype, void* stream) {
  const char* what = "opslot_moe_act_forward";
  if (int rc = check_act_args(what, offs, num_experts, kind, bias, row_expert, rows, inter, limit))
    return rc;
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    const int threads = 256;
    auto launch = [&](auto vtag) {
      constexpr int VV = decltype(vtag)::value;
      const int blocks = elementwise_blocks(rows * (inter / VV), threads);
      if (kind == 0)
        act_forward_kernel<T, VV, 0><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
      else if (kind == 2)
        act_forward_kernel<T, VV, 2><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
      else
        act_forward_kernel<T, VV, 1><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(h), static_cast<T*>(a), static_cast<const T*>(bias), row_expert,
            offs, static_cast<int>(num_experts), rows, inter, alpha, limit);
    };
    if (inter % V == 0)
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_act_backward(const void* da, const void* h, void* dh, const void* bias,
                                       const int32_t* row_expert, const int32_t* offs,
                                       int64_t num_experts, int64_t rows, int64_t inter, int kind,
                                       float alpha, float limit, int dtype, void* stream) {
  const char* what = "opslot_moe_act_backward";
  if (int rc = check_act_args(what, offs, num_experts, kind, bias, row_expert, rows, inter, limit))
    return rc;
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    const int threads = 256;
    auto launch = [&](auto vtag) {
      constexpr int VV = decltype(vtag)::value;
      const int blocks = elementwise_blocks(rows * (inter / VV), threads);
      if (kind == 0)
        act_backward_kernel<T, VV, 0><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
      else if (kind == 2)
        act_backward_kernel<T, VV, 2><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
      else
        act_backward_kernel<T, VV, 1><<<blocks, threads, 0, s>>>(
            static_cast<const T*>(da), static_cast<const T*>(h), static_cast<T*>(dh),
            static_cast<const T*>(bias), row_expert, offs, static_cast<int>(num_experts), rows,
            inter, alpha, limit);
    };
    if (inter % V == 0)
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
    return check_launch(what);
  });
}

OPSLOT_API int64_t opslot_moe_segment_sum_scratch(int64_t num_experts, int64_t cols) {
  return static_cast<int64_t>(kSegSplit) * num_experts * cols;
}

OPSLOT_API int opslot_moe_segment_sum(const void* g, void* out, float* scratch, const int32_t* offs,
                                      int64_t num_experts, int64_t cols, int dtype, void* stream) {
  const char* what = "opslot_moe_segment_sum";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (cols < 1 || scratch == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad cols or scratch", what);
  if (num_experts > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many experts", what);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(num_experts),
              kSegSplit);
    segment_sum_partial_kernel<T><<<grid, dim3(32, 8), 0, s>>>(
        static_cast<const T*>(g), scratch, offs, static_cast<int>(num_experts), cols);
    if (int rc = check_launch(what)) return rc;
    segment_sum_final_kernel<T><<<elementwise_blocks(num_experts * cols, 256), 256, 0, s>>>(
        scratch, static_cast<T*>(out), static_cast<int>(num_experts), cols);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gmm_rows(const void* a, const void* b, int64_t sbe, int64_t sbk,
                                   int64_t sbn, void* c, const int32_t* offs, int64_t num_experts,
                                   int64_t rows, int64_t k, int64_t n, int dtype, void* stream) {
  const char* what = "opslot_moe_gmm_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || k < 1 || n < 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  const int64_t row_tiles = (rows + kBM - 1) / kBM + num_experts;
  const int64_t col_tiles = (n + kBN - 1) / kBN;
  if (row_tiles > 65535 || col_tiles > 0x7fffffff)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %lld rows is too many for one launch", what,
                     static_cast<long long>(rows));
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    gmm_rows_kernel<T><<<dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles)),
                         kGemmThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                               sbe, sbk, sbn, static_cast<T*>(c), offs,
                                               static_cast<int>(num_experts), k, n);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_gmm_wgrad(const void* a, const void* g, void* c, int64_t sce, int64_t scp,
                                    int64_t scq, const int32_t* offs, int64_t num_experts,
                                    int64_t rows, int64_t p, int64_t q, int dtype, void* stream) {
  const char* what = "opslot_moe_gmm_wgrad";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || p < 1 || q < 1)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (num_experts > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many experts", what);
  const int64_t tiles_q = (q + kBN - 1) / kBN;
  const int64_t tiles = (p + kBM - 1) / kBM * tiles_q;
  if (tiles > 0x7fffffff) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too large", what);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    gmm_wgrad_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(num_experts)),
                          kGemmThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(g),
                                                static_cast<T*>(c), sce, scp, scq, offs, p, q,
                                                tiles_q);
    return check_launch(what);
  });
}

OPSLOT_API int opslot_moe_zero_tail_rows(void* c, const int32_t* offs, int64_t num_experts,
                                         int64_t rows, int64_t cols, int dtype, void* stream) {
  const char* what = "opslot_moe_zero_tail_rows";
  if (int rc = check_common(what, offs, num_experts)) return rc;
  if (rows < 0 || cols < 1) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad shape", what);
  if (rows == 0) return OPSLOT_OK;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = (rows + kTailRows - 1) / kTailRows;
  if (blocks > 0x7fffffff) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many rows", what);
  return dispatch_dtype(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    if (cols % V == 0)
      zero_tail_kernel<T, V><<<static_cast<unsigned>(blocks), row_threads(cols / V), 0, s>>>(
          static_cast<T*>(c), offs, static_cast<int>(num_experts), rows, cols);
    else
      zero_tail_kernel<T, 1><<<static_cast<unsigned>(blocks), row_threads(cols), 0, s>>>(
          static_cast<T*>(c), offs, static_cast<int>(num_experts), rows, cols);
    return check_launch(what);
  });
}

}  // extern "C"
