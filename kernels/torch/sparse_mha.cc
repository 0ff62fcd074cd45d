// torch op over the C ABI of sparse_mha.h: sparse multi-head attention over per-head key and value
// caches, forward only (GLM-MoE-DSA's decoding step over Transformers 5.17's cache).
//
//   opslot::sparse_mha_attention(q [B, S, H, dk], k [B, Hkv, T, dk], v [B, Hkv, T, dv],
//       indices int32 [B, S, K], scale) -> (out [B, S, H, dv], lse fp32 [B, S, H])
//
// The CUDA kernel launches the library; the CPU kernel computes the same contract with ATen in fp32
// (the reference math); the Meta kernel gives the shapes. There is no backward: the Autograd kernel
// refuses a call that would need one (grad mode on and an input requiring grad).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <limits>

#include "op_util.h"

namespace opslot_torch {
namespace {

using Two = std::tuple<at::Tensor, at::Tensor>;
constexpr const char* kOp = "sparse_mha_attention";
constexpr int64_t kMaxDim = 512;

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& indices) {
  check_float_dtype(q, "sparse_mha_attention: q");
  for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&k, "k"}, {&v, "v"}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == q.scalar_type(), kOp, ": q and ", name,
                     " must share a dtype, got ", py_dtype(q.scalar_type()), " and ",
                     py_dtype(t->scalar_type()));
  }
  TORCH_CHECK_VALUE(q.dim() == 4, kOp, ": q must be [batch, seq, heads, dk], got ",
                    py_shape(q.sym_sizes()));
  TORCH_CHECK_VALUE(k.dim() == 4 && v.dim() == 4, kOp,
                    ": k and v must be [batch, kv_heads, kv_len, dim], got ",
                    py_shape(k.sym_sizes()), " and ", py_shape(v.sym_sizes()));
  auto s = q.sym_sizes();
  TORCH_CHECK_VALUE(k.sym_size(0) == s[0] && k.sym_size(3) == s[3], kOp, ": q ", py_shape(s),
                    " and k ", py_shape(k.sym_sizes()), " must agree in batch and dk");
  TORCH_CHECK_VALUE(v.sym_sizes().slice(0, 3) == k.sym_sizes().slice(0, 3), kOp, ": k ",
                    py_shape(k.sym_sizes()), " and v ", py_shape(v.sym_sizes()),
                    " must agree in batch, kv_heads and kv_len");
  TORCH_CHECK_VALUE(s[2] >= 1 && k.sym_size(1) >= 1 && s[2] % k.sym_size(1) == 0, kOp, ": heads ",
                    s[2], " must be a positive multiple of kv_heads ", k.sym_size(1));
  TORCH_CHECK_VALUE(s[3] >= 1 && s[3] <= kMaxDim && v.sym_size(3) >= 1 && v.sym_size(3) <= kMaxDim,
                    kOp, ": the kernel takes head dims 1 <= dk, dv <= ", kMaxDim, ", got dk ", s[3],
                    " and dv ", v.sym_size(3));
  check_query_indices(kOp, indices, s);
  check_one_device(kOp, {{"q", q}, {"k", k}, {"v", v}, {"indices", indices}});
}

Two fwd_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& indices, double scale) {
  check(q, k, v, indices);
  auto s = q.sym_sizes();
  return {at::empty_symint({s[0], s[1], s[2], v.sym_size(3)}, q.options()),
          at::empty_symint(s.slice(0, 3), q.options().dtype(at::kFloat))};
}

Two fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& indices, double scale) {
  check(q, k, v, indices);
  const KernelTable& kt = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  at::Tensor qc = last_contiguous(q), kc = last_contiguous(k), vc = last_contiguous(v);
  at::Tensor ic = last_contiguous(indices);
  opslot_sparse_mha_problem p{};
  p.dtype = dtype_code(q, kOp);
  p.batch = q.size(0);
  p.seqlen = q.size(1);
  p.heads = q.size(2);
  p.dk = q.size(3);
  p.kv_heads = k.size(1);
  p.kvlen = k.size(2);
  p.dv = v.size(3);
  p.topk = indices.size(2);
  p.scale = static_cast<float>(scale);
  p.q = ptr(qc);
  p.k = ptr(kc);
  p.v = ptr(vc);
  p.indices = static_cast<const int32_t*>(ptr(ic));
  std::copy_n(qc.strides().begin(), 3, p.q_stride);
  std::copy_n(kc.strides().begin(), 3, p.k_stride);
  std::copy_n(vc.strides().begin(), 3, p.v_stride);
  std::copy_n(ic.strides().begin(), 2, p.idx_stride);
  at::Tensor out = at::empty({p.batch, p.seqlen, p.heads, p.dv}, q.options());
  at::Tensor lse = at::empty({p.batch, p.seqlen, p.heads}, q.options().dtype(at::kFloat));
  const int64_t floats = OPSLOT_ENTRY(kt, opslot_sparse_mha_scratch_floats)(&p);
  TORCH_CHECK(floats >= 0, kOp, ": ", kt.opslot_last_error());
  at::Tensor scratch = at::empty({floats}, q.options().dtype(at::kFloat));
  OPSLOT_LAUNCH(kt, opslot_sparse_mha_fwd, &p, mutable_ptr(out),
                static_cast<float*>(mutable_ptr(lse)), static_cast<float*>(mutable_ptr(scratch)),
                stream_of(q));
  return {out, lse};
}

// The reference math in fp32: every (query, head) row's selected keys and values gathered.
Two fwd_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
            const at::Tensor& indices, double scale) {
  check(q, k, v, indices);
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), T = k.size(2), K = indices.size(2);
  const int64_t group = H / k.size(1);
  at::Tensor idx = indices.to(at::kLong);
  at::Tensor valid = idx.ge(0).logical_and(idx.lt(T));  // [B, S, K]
  at::Tensor safe = at::where(valid, idx, at::zeros_like(idx));
  at::Tensor kf = k.to(at::kFloat).repeat_interleave(group, 1);  // [B, H, T, dk]
  at::Tensor vf = v.to(at::kFloat).repeat_interleave(group, 1);
  if (T == 0) {
    kf = at::zeros({B, H, 1, q.size(3)}, kf.options());
    vf = at::zeros({B, H, 1, v.size(3)}, vf.options());
  }
  auto lopt = idx.options();
  at::Tensor bi = at::arange(B, lopt).view({B, 1, 1, 1}).expand({B, S, H, K});
  at::Tensor hi = at::arange(H, lopt).view({1, 1, H, 1}).expand({B, S, H, K});
  at::Tensor ti = safe.unsqueeze(2).expand({B, S, H, K});
  at::Tensor kg = kf.index({bi, hi, ti}), vg = vf.index({bi, hi, ti});  // [B, S, H, K, d]
  at::Tensor sc = at::einsum("bshd,bshkd->bshk", {q.to(at::kFloat), kg}) * scale;
  sc = sc.masked_fill(valid.logical_not().unsqueeze(2), -std::numeric_limits<double>::infinity());
  at::Tensor lse = at::logsumexp(sc, -1);
  at::Tensor p =
      at::where(lse.isneginf().unsqueeze(-1), at::zeros_like(sc), (sc - lse.unsqueeze(-1)).exp());
  at::Tensor out = at::einsum("bshk,bshkd->bshd", {p, vg});
  return {out.to(q.scalar_type()).contiguous(), lse.contiguous()};
}

Two fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& indices, double scale) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(at::GradMode::is_enabled() &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad())),
      kOp,
      ": has no backward (a decoding-step forward); call it under torch.no_grad() or with inputs "
      "that do not require grad");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opslot::sparse_mha_attention", "")
                             .typed<decltype(fwd_cuda)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(q, k, v, indices, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "sparse_mha_attention(Tensor q, Tensor k, Tensor v, Tensor indices, float scale) -> (Tensor, "
      "Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) { m.impl("sparse_mha_attention", &fwd_cuda); }
TORCH_LIBRARY_IMPL(opslot, CPU, m) { m.impl("sparse_mha_attention", &fwd_cpu); }
TORCH_LIBRARY_IMPL(opslot, Meta, m) { m.impl("sparse_mha_attention", &fwd_meta); }
TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("sparse_mha_attention", &fwd_autograd); }

}  // namespace opslot_torch
