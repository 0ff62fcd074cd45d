// torch ops over the C ABI of sparse_attention.h: sparse multi-query attention over per-query index
// lists (DeepSeek sparse attention), forward and backward, and the mask-to-index-list helper of the
// DeepSeek-V4 glue.
//
//   opslot::sparse_mqa_attention(q [B, S, H, Dqk], kv [B, T, Dqk], indices int32 [B, S, K],
//       sinks fp32 [H]?, scale, dv) -> (out [B, S, H, dv], lse fp32 [B, S, H])
//   opslot::sparse_mqa_attention_bwd(dout, q, kv, indices, sinks?, out, lse, scale, dv)
//       -> (dq, dkv, dsinks fp32 [H], or [0] without sinks)
//   opslot::sparse_mqa_mask_indices(mask [B, S, T], topk) -> (indices int32 [B, S, topk], status
//       int32 [1])
//
// CUDA kernels launch the library; the CPU kernels compute the same contract with ATen in fp32 (the
// reference math: CPU tests run the ops, their autograd and opcheck without a GPU); Meta kernels
// give the shapes; the Autograd kernel of sparse_mqa_attention calls sparse_mqa_attention_bwd (lse
// is not differentiable). The backward's dkv is deterministic: per key, the contributions of the
// queries that selected it are added in a fixed order (an inverse index: the (query, slot) pairs
// sorted by key with a stable sort), in chunks of queries whose scratch rows fit kScratchBytes
// ($OPSLOT_SPARSE_MQA_CHUNK queries per chunk overrides it, for tests; results do not depend on
// it).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdlib>
#include <limits>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Two = std::tuple<at::Tensor, at::Tensor>;
using Three = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

constexpr int64_t kMaxDqk = 576;
constexpr int64_t kMaxDv = 512;
constexpr int64_t kScratchBytes = int64_t{2} << 30;  // the backward's per-chunk scratch rows
constexpr double kMaskedBelow = -65504.0;

void check(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
           const OptTensor& sinks, const c10::SymInt& dv) {
  constexpr const char* op = "sparse_mqa_attention";
  check_float_dtype(q, "sparse_mqa_attention: q");
  TORCH_CHECK_VALUE(q.dim() == 4, op, ": q must be [batch, seq, heads, dim], got ",
                    py_shape(q.sym_sizes()));
  TORCH_CHECK_TYPE(kv.scalar_type() == q.scalar_type(), op, ": q and kv must share a dtype, got ",
                   py_dtype(q.scalar_type()), " and ", py_dtype(kv.scalar_type()));
  TORCH_CHECK_VALUE(kv.dim() == 3, op, ": kv must be [batch, kv_len, dim] (one head), got ",
                    py_shape(kv.sym_sizes()));
  auto s = q.sym_sizes();
  TORCH_CHECK_VALUE(kv.sym_size(0) == s[0] && kv.sym_size(2) == s[3], op, ": q ", py_shape(s),
                    " and kv ", py_shape(kv.sym_sizes()), " must agree in batch and head dim");
  check_query_indices(op, indices, s);
  if (sinks.has_value()) {
    TORCH_CHECK_TYPE(sinks->scalar_type() == at::kFloat, op, ": sinks must be float32, got ",
                     py_dtype(sinks->scalar_type()));
    TORCH_CHECK_VALUE(sinks->dim() == 1 && sinks->sym_size(0) == s[2], op,
                      ": sinks must be [heads] = (", s[2], ",), got ",
                      py_shape(sinks->sym_sizes()));
  }
  TORCH_CHECK_VALUE(s[3] >= 1, op, ": q and kv have no features (head dim 0), got q ", py_shape(s));
  TORCH_CHECK_VALUE(dv >= 1 && dv <= s[3], op, ": dv must be in 1..", s[3],
                    " (V = kv[..., :dv]), got ", dv);
  TORCH_CHECK_VALUE(s[3] <= kMaxDqk && dv <= kMaxDv, op,
                    ": the kernels take head dims Dqk <= ", kMaxDqk, " and dv <= ", kMaxDv,
                    ", got Dqk ", s[3], " and dv ", dv);
  TORCH_CHECK_VALUE(s[2] >= 1 && s[2] <= 65535, op, ": heads must be in 1..65535, got ", s[2]);
  bool same = kv.device() == q.device() && indices.device() == q.device() &&
              (!sinks.has_value() || sinks->device() == q.device());
  TORCH_CHECK_VALUE(same, op, ": q, kv, indices and sinks must be on one device, got ", q.device(),
                    ", ", kv.device(), ", ", indices.device(),
                    sinks.has_value() ? c10::str(", ", sinks->device()) : std::string());
}

opslot_sparse_mqa_problem problem(const at::Tensor& q, const at::Tensor& kv,
                                  const at::Tensor& indices, const at::Tensor& sinks, double scale,
                                  int64_t dv) {
  opslot_sparse_mqa_problem p{};
  p.dtype = dtype_code(q, "sparse_mqa_attention");
  p.batch = q.size(0);
  p.seqlen = q.size(1);
  p.heads = q.size(2);
  p.dqk = q.size(3);
  p.kvlen = kv.size(1);
  p.dv = dv;
  p.topk = indices.size(2);
  p.scale = static_cast<float>(scale);
  p.q = q.const_data_ptr();
  p.kv = kv.numel() > 0 ? kv.const_data_ptr() : nullptr;
  p.indices = static_cast<const int32_t*>(ptr(indices));
  p.sinks = static_cast<const float*>(ptr(sinks));
  std::copy_n(q.strides().begin(), 3, p.q_stride);
  std::copy_n(kv.strides().begin(), 2, p.kv_stride);
  std::copy_n(indices.strides().begin(), 2, p.idx_stride);
  return p;
}

struct Inputs {
  at::Tensor q, kv, indices, sinks;
};

Inputs inputs(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
              const OptTensor& sinks) {
  return {last_contiguous(q), last_contiguous(kv), last_contiguous(indices),
          sinks.has_value() ? sinks->contiguous() : at::Tensor()};
}

Two fwd_meta(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
             const OptTensor& sinks, double scale, c10::SymInt dv) {
  check(q, kv, indices, sinks, dv);
  auto s = q.sym_sizes();
  return {at::empty_symint({s[0], s[1], s[2], dv}, q.options()),
          at::empty_symint(s.slice(0, 3), q.options().dtype(at::kFloat))};
}

Two fwd_cuda(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
             const OptTensor& sinks, double scale, c10::SymInt dv) {
  check(q, kv, indices, sinks, dv);
  const KernelTable& kt = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  Inputs in = inputs(q, kv, indices, sinks);
  int64_t d = dv.expect_int();
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), d}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  opslot_sparse_mqa_problem p = problem(in.q, in.kv, in.indices, in.sinks, scale, d);
  OPSLOT_LAUNCH(kt, opslot_sparse_mqa_fwd, &p, mutable_ptr(out),
                static_cast<float*>(mutable_ptr(lse)), stream_of(q));
  return {out, lse};
}

// The reference math (fp32, ATen) of the CPU kernels: the gathered keys [B, S, K, Dqk], the
// validity of each slot, the scores and the probabilities (0 in rows without keys).
struct Reference {
  at::Tensor kg, valid, safe, lse, p;
};

Reference reference(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                    const OptTensor& sinks, double scale) {
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), T = kv.size(1);
  Reference r;
  at::Tensor idx = indices.to(at::kLong);
  r.valid = idx.ge(0).logical_and(idx.lt(T));
  r.safe = at::where(r.valid, idx, at::zeros_like(idx));
  at::Tensor kvf = kv.to(at::kFloat);
  if (T == 0) kvf = at::zeros({B, 1, kv.size(2)}, kvf.options());
  at::Tensor bi = at::arange(B, idx.options()).view({B, 1, 1}).expand_as(idx);
  r.kg = kvf.index({bi, r.safe});  // [B, S, K, D]
  at::Tensor sc = at::einsum("bshd,bskd->bshk", {q.to(at::kFloat), r.kg}) * scale;
  sc = sc.masked_fill(r.valid.logical_not().unsqueeze(2), -std::numeric_limits<double>::infinity());
  at::Tensor logits = sc;
  if (sinks.has_value()) {
    at::Tensor sk = sinks->to(at::kFloat).view({1, 1, H, 1}).expand({B, S, H, 1});
    logits = at::cat({sc, sk}, -1);
  }
  r.lse = at::logsumexp(logits, -1);
  at::Tensor none = r.lse.isneginf().unsqueeze(-1);
  r.p = at::where(none, at::zeros_like(sc), (sc - r.lse.unsqueeze(-1)).exp());
  return r;
}

Two fwd_cpu(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
            const OptTensor& sinks, double scale, c10::SymInt dv) {
  check(q, kv, indices, sinks, dv);
  int64_t d = dv.expect_int();
  Reference r = reference(q, kv, indices, sinks, scale);
  at::Tensor out = at::einsum("bshk,bskd->bshd", {r.p, r.kg.slice(-1, 0, d)});
  return {out.to(q.scalar_type()).contiguous(), r.lse.contiguous()};
}

// The backward's extra arguments: dout and out [B, S, H, dv], lse fp32 [B, S, H].
void check_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& kv,
               const at::Tensor& indices, const OptTensor& sinks, const at::Tensor& out,
               const at::Tensor& lse, const c10::SymInt& dv) {
  check(q, kv, indices, sinks, dv);
  auto s = q.sym_sizes();
  std::vector<c10::SymInt> want = {s[0], s[1], s[2], dv};
  for (auto [t, what] : {std::pair<const at::Tensor*, const char*>{&dout, "dout"}, {&out, "out"}}) {
    TORCH_CHECK_VALUE(t->sym_sizes() == c10::SymIntArrayRef(want),
                      "sparse_mqa_attention_bwd: ", what, " must be ", py_shape(want), ", got ",
                      py_shape(t->sym_sizes()));
  }
  TORCH_CHECK_VALUE(lse.scalar_type() == at::kFloat && lse.sym_sizes() == s.slice(0, 3),
                    "sparse_mqa_attention_bwd: lse must be float32 ", py_shape(s.slice(0, 3)),
                    ", got ", py_dtype(lse.scalar_type()), " ", py_shape(lse.sym_sizes()));
  check_one_device("sparse_mqa_attention_bwd",
                   {{"q", q}, {"dout", dout}, {"out", out}, {"lse", lse}});
}

Three bwd_meta(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& kv,
               const at::Tensor& indices, const OptTensor& sinks, const at::Tensor& out,
               const at::Tensor& lse, double scale, c10::SymInt dv) {
  check_bwd(dout, q, kv, indices, sinks, out, lse, dv);
  auto f32 = q.options().dtype(at::kFloat);
  return {at::empty_symint(q.sym_sizes(), q.options()),
          at::empty_symint(kv.sym_sizes(), kv.options()),
          sinks.has_value() ? at::empty_symint(sinks->sym_sizes(), f32) : at::empty({0}, f32)};
}

// Queries per chunk of the backward: $OPSLOT_SPARSE_MQA_CHUNK, else as many as fit the scratch.
int64_t chunk_queries(int64_t nq, int64_t per_query_bytes) {
  int64_t chunk = 0;
  if (const char* env = std::getenv("OPSLOT_SPARSE_MQA_CHUNK")) chunk = std::atoll(env);
  if (chunk <= 0) chunk = kScratchBytes / std::max<int64_t>(per_query_bytes, 1);
  return std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(nq, 1)));
}

Three bwd_cuda(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& kv,
               const at::Tensor& indices, const OptTensor& sinks, const at::Tensor& out,
               const at::Tensor& lse, double scale, c10::SymInt dv) {
  check_bwd(dout, q, kv, indices, sinks, out, lse, dv);
  const KernelTable& kt = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  Inputs in = inputs(q, kv, indices, sinks);
  const int64_t d = dv.expect_int();
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3), T = kv.size(1);
  const int64_t K = indices.size(2), nq = B * S, nkeys = B * T;
  opslot_sparse_mqa_problem p = problem(in.q, in.kv, in.indices, in.sinks, scale, d);
  at::Tensor go = dout.to(q.scalar_type()).contiguous();
  at::Tensor o = out.contiguous(), l = lse.contiguous();
  at::Tensor dq = at::empty({B, S, H, D}, q.options());
  at::Tensor acc = at::zeros({B, T, D}, q.options().dtype(at::kFloat));
  const int nhb = OPSLOT_ENTRY(kt, opslot_sparse_mqa_bwd_head_blocks)(&p);
  const int wd = OPSLOT_ENTRY(kt, opslot_sparse_mqa_bwd_w_dtype)(&p);
  TORCH_CHECK(nhb >= 1 && wd >= 0, "sparse_mqa_attention: ", kt.opslot_last_error());
  const at::ScalarType wtype = wd == OPSLOT_BFLOAT16 ? at::kBFloat16 : at::kFloat;
  const int64_t chunk = chunk_queries(nq, nhb * K * D * at::elementSize(wtype));
  const int64_t nchunks = nq == 0 ? 0 : (nq + chunk - 1) / chunk;
  // The inverse index: pair ids (b * S + s) * K + j sorted (stably) by (chunk, key row); rowptr
  // [nchunks * nkeys + 1] delimits each (chunk, key)'s pairs. Skipped slots sort last.
  at::Tensor rowptr, perm;
  if (nchunks > 0 && K > 0 && nkeys > 0) {
    auto lopt = q.options().dtype(at::kLong);
    at::Tensor idx = in.indices.to(at::kLong);
    at::Tensor valid = idx.ge(0).logical_and(idx.lt(T));
    at::Tensor row = at::arange(nq, lopt).view({B, S, 1}).floor_divide(chunk) * nkeys +
                     at::arange(B, lopt).view({B, 1, 1}) * T + idx;
    at::Tensor key = at::where(valid, row, at::full({}, nchunks * nkeys, lopt)).reshape({-1});
    const bool small = nchunks * nkeys < std::numeric_limits<int32_t>::max();
    if (small) key = key.to(at::kInt);
    auto sorted = at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    perm = std::get<1>(sorted);
    rowptr = at::searchsorted(std::get<0>(sorted),
                              at::arange(nchunks * nkeys + 1, std::get<0>(sorted).options()));
  }
  at::Tensor w = at::empty({chunk, nhb, K, D}, q.options().dtype(wtype));
  at::Tensor part =
      in.sinks.defined() ? at::empty({nq, H}, q.options().dtype(at::kFloat)) : at::Tensor();
  void* st = stream_of(q);
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t qb = c * chunk, qe = std::min(nq, qb + chunk);
    OPSLOT_LAUNCH(kt, opslot_sparse_mqa_bwd_queries, &p, ptr(go), ptr(o),
                  static_cast<const float*>(ptr(l)), qb, qe, mutable_ptr(dq), mutable_ptr(w),
                  static_cast<float*>(mutable_ptr(part)), st);
    if (rowptr.defined()) {
      OPSLOT_LAUNCH(kt, opslot_sparse_mqa_bwd_reduce, ptr(w), wd, nhb, K, D, nkeys,
                    rowptr.const_data_ptr<int64_t>() + c * nkeys, perm.const_data_ptr<int64_t>(),
                    qb * K, static_cast<float*>(mutable_ptr(acc)), st);
    }
  }
  at::Tensor dsinks = at::empty({in.sinks.defined() ? H : 0}, q.options().dtype(at::kFloat));
  if (in.sinks.defined()) {
    if (nq == 0) {
      dsinks.zero_();
    } else {
      OPSLOT_LAUNCH(kt, opslot_sparse_mqa_dsink_reduce, static_cast<const float*>(ptr(part)), nq, H,
                    static_cast<float*>(mutable_ptr(dsinks)), st);
    }
  }
  return {dq, acc.to(kv.scalar_type()), dsinks};
}

Three bwd_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& kv,
              const at::Tensor& indices, const OptTensor& sinks, const at::Tensor& out,
              const at::Tensor& lse, double scale, c10::SymInt dv) {
  check_bwd(dout, q, kv, indices, sinks, out, lse, dv);
  const int64_t d = dv.expect_int();
  const int64_t B = q.size(0), H = q.size(2), D = q.size(3), T = kv.size(1);
  Reference r = reference(q, kv, indices, sinks, scale);
  at::Tensor go = dout.to(at::kFloat), qf = q.to(at::kFloat);
  at::Tensor delta = (go * out.to(at::kFloat)).sum(-1);                       // [B, S, H]
  at::Tensor dp = at::einsum("bshd,bskd->bshk", {go, r.kg.slice(-1, 0, d)});  // [B, S, H, K]
  at::Tensor ds = r.p * (dp - delta.unsqueeze(-1)) * scale;
  at::Tensor dq = at::einsum("bshk,bskd->bshd", {ds, r.kg});
  at::Tensor dkg = at::einsum("bshk,bshd->bskd", {ds, qf});
  at::Tensor dkv_v = at::einsum("bshk,bshd->bskd", {r.p, go});
  dkg = at::cat({dkg.slice(-1, 0, d) + dkv_v, dkg.slice(-1, d, D)}, -1);
  dkg = dkg.masked_fill(r.valid.logical_not().unsqueeze(-1), 0.0);
  at::Tensor bi = at::arange(B, r.safe.options()).view({B, 1, 1}).expand_as(r.safe);
  at::Tensor dkv = at::zeros({B, T, D}, qf.options());
  if (T > 0) dkv.index_put_({bi, r.safe}, dkg, /*accumulate=*/true);
  at::Tensor dsinks = at::zeros({sinks.has_value() ? H : 0}, qf.options());
  if (sinks.has_value()) {
    at::Tensor psink = (sinks->to(at::kFloat).view({1, 1, H}) - r.lse).exp();
    dsinks = -(psink * delta).sum(at::IntArrayRef{0, 1});
  }
  return {dq.to(q.scalar_type()).contiguous(), dkv.to(kv.scalar_type()).contiguous(), dsinks};
}

// out, lse = attention; lse is returned for the backward and tests, never differentiated.
class SparseMqaFunction : public torch::autograd::Function<SparseMqaFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& kv,
                                                const at::Tensor& indices, const OptTensor& sinks,
                                                double scale, c10::SymInt dv) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::sparse_mqa_attention", "")
                               .typed<decltype(fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] = op.call(q, kv, indices, sinks, scale, dv);
    ctx->save_for_backward({q, kv, indices, sinks.value_or(at::Tensor()), out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dv"] = dv;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::sparse_mqa_attention_bwd", "")
                               .typed<decltype(bwd_cuda)>();
    auto s = ctx->get_saved_variables();
    OptTensor sinks = s[3].defined() ? OptTensor(s[3]) : std::nullopt;
    at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(s[4]);
    auto [dq, dkv, dsinks] =
        op.call(dout, s[0], s[1], s[2], sinks, s[4], s[5], ctx->saved_data["scale"].toDouble(),
                ctx->saved_data["dv"].toSymInt());
    return {dq,           dkv,         at::Tensor(), sinks.has_value() ? dsinks : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

Two fwd_autograd(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                 const OptTensor& sinks, double scale, c10::SymInt dv) {
  auto o = SparseMqaFunction::apply(q, kv, indices, sinks, scale, dv);
  return {o[0], o[1]};
}

// --- mask -> index lists (the DeepSeek-V4 glue) ---

// The mask kinds of sparse_attention.h are those of topk.h (op_util's mask_kind).
static_assert(int{OPSLOT_SPARSE_MASK_FLOAT32} == int{OPSLOT_TOPK_MASK_FLOAT32} &&
              int{OPSLOT_SPARSE_MASK_FLOAT16} == int{OPSLOT_TOPK_MASK_FLOAT16} &&
              int{OPSLOT_SPARSE_MASK_BFLOAT16} == int{OPSLOT_TOPK_MASK_BFLOAT16} &&
              int{OPSLOT_SPARSE_MASK_BOOL} == int{OPSLOT_TOPK_MASK_BOOL});
constexpr const char* kMaskOp = "sparse_mqa_mask_indices";

void check_mask(const at::Tensor& mask, const c10::SymInt& topk) {
  (void)mask_kind(mask, kMaskOp);
  TORCH_CHECK_VALUE(mask.dim() == 3,
                    "sparse_mqa_mask_indices: the mask must be [batch, seq, kv_len], got ",
                    py_shape(mask.sym_sizes()));
  TORCH_CHECK_VALUE(topk >= 0, "sparse_mqa_mask_indices: topk must be >= 0, got ", topk);
}

Two mask_meta(const at::Tensor& mask, c10::SymInt topk) {
  check_mask(mask, topk);
  auto s = mask.sym_sizes();
  auto i32 = mask.options().dtype(at::kInt);
  return {at::empty_symint({s[0], s[1], topk}, i32), at::empty({1}, i32)};
}

Two mask_cuda(const at::Tensor& mask, c10::SymInt topk) {
  check_mask(mask, topk);
  const KernelTable& kt = prepare_cuda(mask);
  c10::DeviceGuard guard(mask.device());
  const int64_t k = topk.expect_int();
  auto i32 = mask.options().dtype(at::kInt);
  at::Tensor indices = at::empty({mask.size(0), mask.size(1), k}, i32);
  at::Tensor status = at::zeros({1}, i32);
  int64_t strides[3] = {mask.size(0) > 1 ? mask.stride(0) : 0, mask.stride(1), mask.stride(2)};
  OPSLOT_LAUNCH(kt, opslot_sparse_mqa_mask_indices,
                mask.numel() > 0 ? mask.const_data_ptr() : nullptr, mask_kind(mask, kMaskOp),
                mask.size(0), mask.size(1), mask.size(2), strides, k,
                static_cast<int32_t*>(mutable_ptr(indices)),
                static_cast<int32_t*>(mutable_ptr(status)), stream_of(mask));
  return {indices, status};
}

Two mask_cpu(const at::Tensor& mask, c10::SymInt topk) {
  check_mask(mask, topk);
  const int64_t k = topk.expect_int();
  const int64_t B = mask.size(0), S = mask.size(1), T = mask.size(2);
  auto lopt = mask.options().dtype(at::kLong);
  at::Tensor valid, bias;
  if (mask.scalar_type() == at::kBool) {
    valid = mask;
    bias = at::zeros({B, S, T}, mask.options());
  } else {
    at::Tensor m = mask.to(at::kFloat);
    valid = m.eq(0);
    bias = valid.logical_or(m.le(kMaskedBelow)).logical_not();
  }
  at::Tensor pos = at::arange(T, lopt).expand({B, S, T});
  at::Tensor key = at::where(valid, pos, at::full({}, T, lopt));
  at::Tensor first = std::get<0>(key.sort(-1));
  if (first.size(-1) < k) first = at::cat({first, at::full({B, S, k - T}, T, lopt)}, -1);
  first = first.slice(-1, 0, k);
  at::Tensor indices = at::where(first.lt(T), first, at::full({}, -1, lopt)).to(at::kInt);
  at::Tensor overflow = valid.sum(-1).gt(k).any().to(at::kInt);
  at::Tensor status =
      (overflow * OPSLOT_SPARSE_MASK_OVERFLOW + bias.any().to(at::kInt) * OPSLOT_SPARSE_MASK_BIAS)
          .reshape({1})
          .to(at::kInt);
  return {indices.contiguous(), status};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "sparse_mqa_attention(Tensor q, Tensor kv, Tensor indices, Tensor? sinks, float scale, "
      "SymInt dv) -> (Tensor, Tensor)");
  m.def(
      "sparse_mqa_attention_bwd(Tensor dout, Tensor q, Tensor kv, Tensor indices, Tensor? sinks, "
      "Tensor out, Tensor lse, float scale, SymInt dv) -> (Tensor, Tensor, Tensor)");
  m.def("sparse_mqa_mask_indices(Tensor mask, SymInt topk) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("sparse_mqa_attention", &fwd_cuda);
  m.impl("sparse_mqa_attention_bwd", &bwd_cuda);
  m.impl("sparse_mqa_mask_indices", &mask_cuda);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  m.impl("sparse_mqa_attention", &fwd_cpu);
  m.impl("sparse_mqa_attention_bwd", &bwd_cpu);
  m.impl("sparse_mqa_mask_indices", &mask_cpu);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("sparse_mqa_attention", &fwd_meta);
  m.impl("sparse_mqa_attention_bwd", &bwd_meta);
  m.impl("sparse_mqa_mask_indices", &mask_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("sparse_mqa_attention", &fwd_autograd); }

}  // namespace opslot_torch
