// Sparse multi-query attention over per-query index lists, forward and backward
// (kernels/include/opslot_kernels/sparse_attention.h; docs/kernels.md "sparse_mqa_attention").
//
// bf16 / fp16: one CTA per query token and block of 64 heads (rows). The query's selected kv rows
// are gathered 32 at a time (cp.async, zero rows for skipped indices) into shared memory, where
// every head of the block uses them: S = Q K^T, online softmax, O += P V with mma.sync m16n8k16
// (operands in the input dtype, fp32 accumulation). V is the first dv columns of the same rows
// (MLA's latent kv: no second load). The backward recomputes S and P per tile, dP = dO V^T, dS = P
// (dP - delta), accumulates dq = dS K in registers and writes the tile's dkv contribution dS^T Q +
// P^T dO (summed over the block's heads) to a scratch row per (query, selected key); a second
// kernel adds those rows per key in a fixed order (an inverse index sorted by key, then query).
// fp32: the same algorithm on CUDA cores in fp32 (exact, slow: for tests and fp32 users).
//
// On compute capability 9.0, for dv = 512 (both models), the forward and the bf16 backward run the
// same algorithm with warpgroup MMAs (sparse_attention_fwd90.cuh, _bwd90.cuh; the same bits as the
// mma.sync kernels).
//
// The kernels are in sparse_attention_fwd.cuh, _fwd90.cuh, _bwd.cuh, _bwd90.cuh, _simt.cuh (fp32)
// and _reduce.cuh (the dkv reduction, sinks, mask rows); this file holds the checks, the launchers
// and the C ABI.
#include "sparse_attention_bwd.cuh"
#include "sparse_attention_bwd90.cuh"
#include "sparse_attention_reduce.cuh"

namespace opslot::sparse {
namespace {

// ---------------------------------------------------------------------------------------------
// Host side.

int round_up(int64_t x, int m) { return static_cast<int>((x + m - 1) / m * m); }

int check(const opslot_sparse_mqa_problem* p, const char* what) {
  if (p == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: no problem given", what);
  if (p->dtype != OPSLOT_FLOAT32 && p->dtype != OPSLOT_FLOAT16 && p->dtype != OPSLOT_BFLOAT16)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, p->dtype);
  if (p->batch < 0 || p->seqlen < 0 || p->kvlen < 0 || p->topk < 0 || p->heads < 1 ||
      p->heads > 65535 || p->batch * p->seqlen >= (1LL << 31) || p->topk >= (1LL << 31) ||
      p->kvlen >= (1LL << 31)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape batch %lld, seqlen %lld, kvlen %lld, heads %lld, topk %lld",
                     what, static_cast<long long>(p->batch), static_cast<long long>(p->seqlen),
                     static_cast<long long>(p->kvlen), static_cast<long long>(p->heads),
                     static_cast<long long>(p->topk));
  }
  if (p->dqk < 1 || p->dqk > kMaxDqk || p->dv < 1 || p->dv > p->dqk || p->dv > kMaxDv) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: head dims Dqk %lld, dv %lld: this kernel takes Dqk <= %d, 1 <= dv <= "
                     "min(Dqk, %d)",
                     what, static_cast<long long>(p->dqk), static_cast<long long>(p->dv), kMaxDqk,
                     kMaxDv);
  }
  if (p->batch * p->seqlen > 0 && (p->q == nullptr || (p->indices == nullptr && p->topk > 0) ||
                                   (p->kv == nullptr && p->kvlen > 0 && p->topk > 0))) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null input pointer", what);
  }
  return OPSLOT_OK;
}

Dev make_dev(const opslot_sparse_mqa_problem& p) {
  Dev d{};
  const int es = p.dtype == OPSLOT_FLOAT32 ? 4 : 2;
  d.B = p.batch;
  d.S = p.seqlen;
  d.T = p.kvlen;
  d.H = p.heads;
  d.dqk = p.dqk;
  d.dv = p.dv;
  d.K = p.topk;
  d.scale = p.scale;
  d.scale_log2 = p.scale * kLog2e;
  d.q = p.q;
  d.kv = p.kv;
  d.idx = p.indices;
  d.sinks = p.sinks;
  d.qs0 = p.q_stride[0];
  d.qs1 = p.q_stride[1];
  d.qs2 = p.q_stride[2];
  d.kvs0 = p.kv_stride[0];
  d.kvs1 = p.kv_stride[1];
  d.is0 = p.idx_stride[0];
  d.is1 = p.idx_stride[1];
  d.dpad = round_up(p.dqk, 64);
  d.dvpad = round_up(p.dv, 64);
  d.ldq = d.dpad + 8;
  d.ldo = d.dvpad + 8;
  d.q_vec = (p.dqk * es) % 16 == 0 && aligned16(p.q) && stride16_ok(p.q_stride[0], p.batch, es) &&
            stride16_ok(p.q_stride[1], p.seqlen, es) && stride16_ok(p.q_stride[2], p.heads, es);
  d.kv_vec = (p.dqk * es) % 16 == 0 && aligned16(p.kv) &&
             stride16_ok(p.kv_stride[0], p.batch, es) && stride16_ok(p.kv_stride[1], p.kvlen, es);
  d.do_vec = false;
  return d;
}

int head_blocks(const opslot_sparse_mqa_problem& p) {
  return p.dtype == OPSLOT_FLOAT32 ? 1 : static_cast<int>((p.heads + kRows - 1) / kRows);
}
int w_dtype(const opslot_sparse_mqa_problem& p) {
  return p.dtype == OPSLOT_BFLOAT16 ? OPSLOT_BFLOAT16 : OPSLOT_FLOAT32;
}

template <typename K>
int set_smem(K kernel, size_t bytes, const char* what) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                     bytes, cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

// The kernels that take the mma.sync path where a wgmma one applies (opslot_sparse_mqa_set_tuning,
// bench library only): bit 0 the forward, bit 1 the backward; 0 (the default) neither.
#ifdef OPSLOT_KERNELS_BENCH
int g_mma_sync = 0;
#else
constexpr int g_mma_sync = 0;
#endif

// fwd_wgmma_kernel applies: dv = 512, 16-byte copies of the q and kv rows, on Hopper.
bool use_fwd90(const Dev& d) {
  return (g_mma_sync & 1) == 0 && d.dv == 512 && d.q_vec && d.kv_vec && device_is_sm90();
}

// bwd_wgmma_kernel applies: bf16, dv = 512, 16-byte copies of the q, kv and dout rows and of the
// w rows, on Hopper (fp16's fp32 w rows do not fit its staging).
bool use_bwd90(const Dev& d, int dtype, const void* w) {
  return (g_mma_sync & 2) == 0 && dtype == OPSLOT_BFLOAT16 && d.dv == 512 && d.q_vec && d.kv_vec &&
         d.do_vec && aligned16(w) && device_is_sm90();
}

template <typename Kern, typename... A>
int launch(const char* what, Kern kernel, dim3 grid, int block, size_t smem, void* stream,
           A... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return OPSLOT_OK;
  if (smem > 48 * 1024) {
    if (int rc = set_smem(kernel, smem, what)) return rc;
  }
  kernel<<<grid, block, smem, static_cast<cudaStream_t>(stream)>>>(args...);
  return check_launch(what);
}

}  // namespace
}  // namespace opslot::sparse

using namespace opslot;
using namespace opslot::sparse;

extern "C" {

OPSLOT_API int opslot_sparse_mqa_fwd(const opslot_sparse_mqa_problem* p, void* out, float* lse,
                                     void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_fwd";
  if (int rc = check(p, what)) return rc;
  if (p->batch * p->seqlen == 0) return OPSLOT_OK;
  if (out == nullptr || lse == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null output pointer", what);
  const Dev d = make_dev(*p);
  const unsigned nq = static_cast<unsigned>(p->batch * p->seqlen);
  return dispatch_dtype(p->dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      return launch(what, fwd_simt_kernel<T>, dim3(nq, static_cast<unsigned>(p->heads)),
                    kSimtThreads, 0, stream, d, static_cast<T*>(out), lse);
    } else {
      const unsigned hb = static_cast<unsigned>((p->heads + kRows - 1) / kRows);
      if (use_fwd90(d))  // 512 <= Dqk <= 576: 16 or 18 k-steps a warpgroup
        return launch(what, d.dpad == 512 ? fwd_wgmma_kernel<T, 16> : fwd_wgmma_kernel<T, 18>,
                      dim3(nq, hb), kWgThreads, fwd90_smem(d), stream, d, static_cast<T*>(out),
                      lse);
      return launch(what, fwd_mma_kernel<T>, dim3(nq, hb), kFwdThreads, fwd_smem(d, sizeof(T)),
                    stream, d, static_cast<T*>(out), lse);
    }
  });
}

OPSLOT_API int opslot_sparse_mqa_bwd_head_blocks(const opslot_sparse_mqa_problem* p) {
  if (check(p, "opslot_sparse_mqa_bwd_head_blocks")) return -1;
  return head_blocks(*p);
}

OPSLOT_API int opslot_sparse_mqa_bwd_w_dtype(const opslot_sparse_mqa_problem* p) {
  if (check(p, "opslot_sparse_mqa_bwd_w_dtype")) return -1;
  return w_dtype(*p);
}

OPSLOT_API int opslot_sparse_mqa_bwd_queries(const opslot_sparse_mqa_problem* p, const void* dout,
                                             const void* out, const float* lse, int64_t q_begin,
                                             int64_t q_end, void* dq, void* w, float* dsink_part,
                                             void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_bwd_queries";
  if (int rc = check(p, what)) return rc;
  if (q_begin < 0 || q_end < q_begin || q_end > p->batch * p->seqlen)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: query range [%lld, %lld) outside [0, %lld)",
                     what, static_cast<long long>(q_begin), static_cast<long long>(q_end),
                     static_cast<long long>(p->batch * p->seqlen));
  if (q_end == q_begin) return OPSLOT_OK;
  if (dout == nullptr || out == nullptr || lse == nullptr || dq == nullptr ||
      (w == nullptr && p->topk > 0) || (dsink_part == nullptr) != (p->sinks == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  Dev d = make_dev(*p);
  const int es = p->dtype == OPSLOT_FLOAT32 ? 4 : 2;
  d.do_vec = (p->dv * es) % 16 == 0 && aligned16(dout);
  const unsigned nq = static_cast<unsigned>(q_end - q_begin);
  return dispatch_dtype(p->dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    const T* go = static_cast<const T*>(dout);
    const T* o = static_cast<const T*>(out);
    if constexpr (std::is_same_v<T, float>) {
      if (int rc = launch(what, bwd_simt_dq_kernel<T>, dim3(nq, static_cast<unsigned>(p->heads)),
                          kSimtThreads, 0, stream, d, go, o, lse, q_begin, static_cast<T*>(dq),
                          dsink_part))
        return rc;
      if (p->topk == 0) return OPSLOT_OK;
      return launch(what, bwd_simt_w_kernel<T, float>, dim3(nq), kSimtThreads,
                    static_cast<size_t>(2 * p->heads) * sizeof(float), stream, d, go, o, lse,
                    q_begin, static_cast<float*>(w));
    } else {
      using W = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat16, float>;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (use_bwd90(d, p->dtype, w))  // 512 <= Dqk <= 576: 32 or 36 k-steps of S
          return launch(what, d.dpad == 512 ? bwd_wgmma_kernel<32> : bwd_wgmma_kernel<36>,
                        dim3(nq, static_cast<unsigned>(head_blocks(*p))), kWgThreads, bwd90_smem(d),
                        stream, d, go, o, lse, q_begin, static_cast<T*>(dq), static_cast<T*>(w),
                        dsink_part);
      }
      return launch(what, bwd_mma_kernel<T, W>, dim3(nq, static_cast<unsigned>(head_blocks(*p))),
                    kBwdThreads, bwd_smem(d, sizeof(T)), stream, d, go, o, lse, q_begin,
                    static_cast<T*>(dq), static_cast<W*>(w), dsink_part);
    }
  });
}

OPSLOT_API int opslot_sparse_mqa_bwd_reduce(const void* w, int w_dtype, int64_t head_blocks,
                                            int64_t topk, int64_t dqk, int64_t nkeys,
                                            const int64_t* rowptr, const int64_t* pairs,
                                            int64_t pair_base, float* dkv_acc, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_bwd_reduce";
  if (nkeys < 0 || head_blocks < 1 || topk < 0 || dqk < 1 || nkeys >= (1LL << 31))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad sizes nkeys %lld, head_blocks %lld, topk %lld, dqk %lld", what,
                     static_cast<long long>(nkeys), static_cast<long long>(head_blocks),
                     static_cast<long long>(topk), static_cast<long long>(dqk));
  if (nkeys == 0 || topk == 0) return OPSLOT_OK;
  if (rowptr == nullptr || dkv_acc == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  auto run = [&](auto tag) -> int {
    using W = decltype(tag);
    const W* wp = static_cast<const W*>(w);
    // 16-byte column groups where the rows allow them (the same sums in the same order), else a
    // CTA per key and one column per thread.
    if (dqk % Group<W>::kCols == 0 && aligned16(w) && aligned16(dkv_acc)) {
      constexpr int per = kReduceThreads / 32;
      const int64_t warps = nkeys * reduce_slices(dqk / Group<W>::kCols);
      if (warps / per >= (1LL << 31))
        return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %lld keys of %lld columns: too many",
                         what, static_cast<long long>(nkeys), static_cast<long long>(dqk));
      const dim3 grid(static_cast<unsigned>((warps + per - 1) / per));
      return head_blocks == 1
                 ? launch(what, reduce_vec_kernel<W, true>, grid, kReduceThreads, 0, stream, wp,
                          head_blocks, topk, dqk, nkeys, rowptr, pairs, pair_base, dkv_acc)
                 : launch(what, reduce_vec_kernel<W, false>, grid, kReduceThreads, 0, stream, wp,
                          head_blocks, topk, dqk, nkeys, rowptr, pairs, pair_base, dkv_acc);
    }
    return launch(what, reduce_kernel<W>, dim3(static_cast<unsigned>(nkeys)), kReduceThreads, 0,
                  stream, wp, head_blocks, topk, dqk, rowptr, pairs, pair_base, dkv_acc);
  };
  if (w_dtype == OPSLOT_BFLOAT16) return run(__nv_bfloat16{});
  if (w_dtype == OPSLOT_FLOAT32) return run(float{});
  return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: w dtype code %d (bfloat16 or float32)", what,
                   w_dtype);
}

OPSLOT_API int opslot_sparse_mqa_dsink_reduce(const float* part, int64_t rows, int64_t heads,
                                              float* dsinks, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_dsink_reduce";
  if (rows < 0 || heads < 0 || heads > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad sizes rows %lld, heads %lld", what,
                     static_cast<long long>(rows), static_cast<long long>(heads));
  if (heads == 0) return OPSLOT_OK;
  if (dsinks == nullptr || (rows > 0 && part == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  return launch(what, dsink_kernel, dim3(static_cast<unsigned>(heads)), kSinkThreads, 0, stream,
                part, rows, heads, dsinks);
}

OPSLOT_API int opslot_sparse_mqa_mask_indices(const void* mask, int mask_kind, int64_t batch,
                                              int64_t rows, int64_t cols,
                                              const int64_t* mask_stride, int64_t topk,
                                              int32_t* indices, int32_t* status, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_mask_indices";
  if (batch < 0 || rows < 0 || cols < 0 || topk < 0 || cols >= (1LL << 31) ||
      mask_stride == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad sizes batch %lld, rows %lld, cols %lld, topk %lld", what,
                     static_cast<long long>(batch), static_cast<long long>(rows),
                     static_cast<long long>(cols), static_cast<long long>(topk));
  const int64_t nrows = batch * rows;
  if (nrows == 0 || topk == 0) return OPSLOT_OK;
  if ((mask == nullptr && cols > 0) || indices == nullptr || status == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  const int64_t per = kMaskThreads / 32;
  if ((nrows + per - 1) / per >= (1LL << 31))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many rows", what);
  const dim3 grid(static_cast<unsigned>((nrows + per - 1) / per));
  const int64_t s0 = mask_stride[0], s1 = mask_stride[1], s2 = mask_stride[2];
  switch (mask_kind) {
    case OPSLOT_SPARSE_MASK_FLOAT32:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_FLOAT32>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_FLOAT16:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_FLOAT16>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_BFLOAT16:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_BFLOAT16>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_BOOL:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_BOOL>, grid, kMaskThreads, 0, stream, mask,
                    batch, rows, cols, s0, s1, s2, topk, indices, status);
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown mask kind %d", what, mask_kind);
  }
}

}  // extern "C"

#ifdef OPSLOT_KERNELS_BENCH
extern "C" OPSLOT_API int opslot_sparse_mqa_set_tuning(int mma_sync) {
  if (mma_sync < 0 || mma_sync > 3)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "sparse mqa tuning: mma_sync 0 to 3 (bit 0 the forward, bit 1 the backward)");
  g_mma_sync = mma_sync;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH
