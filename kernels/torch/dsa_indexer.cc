// torch op opslot::dsa_index_scores over the C ABI of dsa_indexer.h: the lightning indexer's
// scores of DeepSeek sparse attention (GLM-MoE-DSA, DeepSeek-V4),
//   out[b, s, t] = scale * sum_h weights[b, s, h] * relu(q[b, s, h] . k[b, t]), -inf where
//   t >= limit[b, s],
// fp32 [B, S, T]. Forward only (upstream runs the indexer under torch.no_grad()): the Autograd
// kernel refuses inputs that require grad under grad mode. CUDA and Meta kernels; the CPU kernel
// computes the same math with ATen ops in fp32 (the reference; CPU tests and opcheck run it).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
constexpr const char* kOp = "dsa_index_scores";

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& weights,
           const OptTensor& limit) {
  check_float_dtype(q, kOp);
  TORCH_CHECK_VALUE(q.dim() == 4, kOp, ": q must be [batch, seq, heads, dim], got shape ",
                    py_shape(q.sym_sizes()));
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), kOp, ": k is ", py_dtype(k.scalar_type()),
                   " but q is ", py_dtype(q.scalar_type()), " (they must match)");
  TORCH_CHECK_VALUE(
      k.dim() == 3 && k.sym_size(0) == q.sym_size(0) && k.sym_size(2) == q.sym_size(3), kOp,
      ": k must be [batch, keys, dim] = [", q.sym_size(0), ", keys, ", q.sym_size(3),
      "], got shape ", py_shape(k.sym_sizes()));
  TORCH_CHECK_TYPE(weights.scalar_type() == at::kFloat, kOp,
                   ": weights must be torch.float32, got ", py_dtype(weights.scalar_type()));
  TORCH_CHECK_VALUE(
      weights.dim() == 3 && weights.sym_size(0) == q.sym_size(0) &&
          weights.sym_size(1) == q.sym_size(1) && weights.sym_size(2) == q.sym_size(2),
      kOp, ": weights must be [batch, seq, heads] = [", q.sym_size(0), ", ", q.sym_size(1), ", ",
      q.sym_size(2), "], got shape ", py_shape(weights.sym_sizes()));
  TORCH_CHECK_VALUE(k.device() == q.device() && weights.device() == q.device(), kOp,
                    ": q, k and weights must be on one device, got ", q.device(), ", ", k.device(),
                    ", ", weights.device());
  if (limit.has_value()) {
    TORCH_CHECK_TYPE(limit->scalar_type() == at::kInt, kOp, ": limit must be torch.int32, got ",
                     py_dtype(limit->scalar_type()));
    TORCH_CHECK_VALUE(limit->dim() == 2 && limit->sym_size(0) == q.sym_size(0) &&
                          limit->sym_size(1) == q.sym_size(1),
                      kOp, ": limit must be [batch, seq] = [", q.sym_size(0), ", ", q.sym_size(1),
                      "], got shape ", py_shape(limit->sym_sizes()));
    TORCH_CHECK_VALUE(limit->device() == q.device(), kOp, ": limit is on ", limit->device(),
                      ", q on ", q.device());
  }
}

at::Tensor meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& weights, double scale,
                const OptTensor& limit) {
  check(q, k, weights, limit);
  return at::empty_symint({q.sym_size(0), q.sym_size(1), k.sym_size(1)},
                          q.options().dtype(at::kFloat));
}

// The reference math in fp32 with ATen ops (any device; the CPU kernel).
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& weights,
                     double scale, const OptTensor& limit) {
  check(q, k, weights, limit);
  at::Tensor dots = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2).unsqueeze(1));
  at::Tensor out = (at::relu(dots) * weights.unsqueeze(-1)).sum(2) * scale;  // [B, S, T]
  if (limit.has_value()) {
    at::Tensor keys = at::arange(k.size(1), limit->options().dtype(at::kLong));
    out = out.masked_fill(keys.view({1, 1, -1}) >= limit->to(at::kLong).unsqueeze(-1),
                          -std::numeric_limits<float>::infinity());
  }
  return out.contiguous();
}

// Whether the 16-bit kernel reads `t` in place: contiguous last dimension, the head dim and every
// stride of a dimension of more than one element a multiple of 8 elements, 16-byte aligned.
bool kernel_layout(const at::Tensor& t) {
  if (t.size(-1) % 8 != 0 || (t.size(-1) > 1 && t.stride(-1) != 1)) return false;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) {
    if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
  }
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// `t` in a layout the 16-bit kernel reads: itself when it already is, else a contiguous copy with
// the last dimension zero-padded to a multiple of 8 (zeros add nothing to the dot products).
at::Tensor kernel_operand(const at::Tensor& t) {
  if (kernel_layout(t)) return t;
  int64_t d = t.size(-1), padded = (d + 7) / 8 * 8;
  if (padded == d) return t.contiguous();
  std::vector<int64_t> shape = t.sizes().vec();
  shape.back() = padded;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(-1, 0, d).copy_(t);
  return out;
}

at::Tensor scores_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& weights,
                       double scale, const OptTensor& limit) {
  at::Tensor out = meta(q, k, weights, scale, limit);
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3), T = k.size(1);
  const bool half = q.scalar_type() != at::kFloat;
  TORCH_CHECK_VALUE(!half || (D <= 128 && H <= 128), kOp, ": ", py_dtype(q.scalar_type()),
                    " q with ", H, " heads of dim ", D,
                    "; the cuda kernel takes up to 128 heads of dim up to 128 in 16-bit (use "
                    "float32 inputs, or 'torch' for dsa_indexer_implementation)");
  TORCH_CHECK_VALUE(half || D <= 512, kOp, ": float32 q of head dim ", D,
                    "; the cuda kernel takes head dims up to 512 (use 'torch' for "
                    "dsa_indexer_implementation)");
  TORCH_CHECK_VALUE(B <= 65535, kOp, ": batch ", B, "; the cuda kernel takes up to 65535");
  if (out.numel() == 0) return out;
  const KernelTable& table = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  at::Tensor qq = half ? kernel_operand(q) : last_contiguous(q);
  at::Tensor kk = half ? kernel_operand(k) : last_contiguous(k);
  at::Tensor lim = limit.has_value() ? limit->contiguous() : at::Tensor();
  const int64_t dim = qq.size(3);
  OPSLOT_LAUNCH(table, opslot_dsa_index_scores, dtype_code(qq, kOp), B, S, H, dim, T, ptr(qq),
                qq.strides().data(), ptr(kk), kk.strides().data(),
                static_cast<const float*>(ptr(weights)), weights.strides().data(),
                static_cast<float>(scale), static_cast<const int32_t*>(ptr(lim)),
                static_cast<float*>(mutable_ptr(out)), stream_of(qq));
  return out;
}

// Forward only: inputs that would need a gradient are refused, never silently detached.
at::Tensor scores_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& weights,
                           double scale, const OptTensor& limit) {
  TORCH_CHECK_VALUE(!at::GradMode::is_enabled() ||
                        !(q.requires_grad() || k.requires_grad() || weights.requires_grad()),
                    kOp,
                    " is forward only (the DSA indexer runs under torch.no_grad()): call it under "
                    "torch.no_grad() or with inputs that do not require grad");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opslot::dsa_index_scores", "")
                             .typed<decltype(scores_cuda)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(q, k, weights, scale, limit);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "dsa_index_scores(Tensor q, Tensor k, Tensor weights, float scale, Tensor? limit=None) -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) { m.impl("dsa_index_scores", &scores_cuda); }

TORCH_LIBRARY_IMPL(opslot, Meta, m) { m.impl("dsa_index_scores", &meta); }

TORCH_LIBRARY_IMPL(opslot, CPU, m) { m.impl("dsa_index_scores", &reference); }

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("dsa_index_scores", &scores_autograd); }

}  // namespace opslot_torch
