// torch op opslot::topk_indices over the C ABI of topk.h: the columns of the k largest values of
// each row of fp32 scores [..., T], in ascending order, int32 [..., k]; columns at or past
// limit[...] count as -inf, an optional mask [..., T] (broadcast to the scores) hides (bool False:
// -inf) or is added (float, in fp32) first, as `masked_fill_(~mask, -inf)` / `add_(mask)` would;
// equal values are taken lowest column first, values order as their bits (torch.topk's: NaN above
// +inf, -0.0 below +0.0). Indices carry no gradient. CUDA and Meta kernels; the CPU kernel computes
// the same contract with ATen (the reference: the k largest of distinct (value, column) keys), so
// CPU tests and opcheck run the exact result the kernel must give.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
constexpr const char* kOp = "topk_indices";

void check(const at::Tensor& scores, const c10::SymInt& k, const OptTensor& limit,
           const OptTensor& mask) {
  TORCH_CHECK_TYPE(scores.scalar_type() == at::kFloat, kOp, ": scores must be torch.float32, got ",
                   py_dtype(scores.scalar_type()));
  TORCH_CHECK_VALUE(scores.dim() >= 1, kOp,
                    ": scores must have at least one dimension (rows of columns), got shape ",
                    py_shape(scores.sym_sizes()));
  const c10::SymInt& cols = scores.sym_size(-1);
  TORCH_CHECK_VALUE(k >= 0 && k <= cols, kOp, ": k must be in [0, ", cols, "] (the columns), got ",
                    k);
  if (limit.has_value()) {
    TORCH_CHECK_TYPE(limit->scalar_type() == at::kInt, kOp, ": limit must be torch.int32, got ",
                     py_dtype(limit->scalar_type()));
    TORCH_CHECK_VALUE(limit->sym_sizes() == scores.sym_sizes().slice(0, scores.dim() - 1), kOp,
                      ": limit must have the shape of the scores without their last dimension, ",
                      py_shape(scores.sym_sizes().slice(0, scores.dim() - 1)), ", got ",
                      py_shape(limit->sym_sizes()));
    TORCH_CHECK_VALUE(limit->device() == scores.device(), kOp, ": limit is on ", limit->device(),
                      ", scores on ", scores.device());
  }
  if (mask.has_value()) {
    (void)mask_kind(*mask, kOp);
    TORCH_CHECK_VALUE(at::is_expandable_to(mask->sym_sizes(), scores.sym_sizes()), kOp,
                      ": mask of shape ", py_shape(mask->sym_sizes()),
                      " does not broadcast to the scores ", py_shape(scores.sym_sizes()));
    TORCH_CHECK_VALUE(mask->device() == scores.device(), kOp, ": mask is on ", mask->device(),
                      ", scores on ", scores.device());
  }
}

at::Tensor meta(const at::Tensor& scores, c10::SymInt k, const OptTensor& limit,
                const OptTensor& mask) {
  check(scores, k, limit, mask);
  std::vector<c10::SymInt> shape(scores.sym_sizes().begin(), scores.sym_sizes().end());
  shape.back() = k;
  return at::empty_symint(shape, scores.options().dtype(at::kInt));
}

// The contract with ATen ops (the CPU kernel): the mask applied, each value's order bits as an
// int64 key (masked columns below every value), made distinct by the column (lower columns
// above), the k largest keys, their columns sorted.
at::Tensor reference(const at::Tensor& scores, c10::SymInt k_sym, const OptTensor& limit,
                     const OptTensor& mask) {
  check(scores, k_sym, limit, mask);
  const int64_t k = k_sym.expect_int();
  at::Tensor out = meta(scores, k_sym, limit, mask);
  if (out.numel() == 0) return out;
  at::Tensor values = scores;
  if (mask.has_value()) {
    values = mask->scalar_type() == at::kBool
                 ? scores.masked_fill(mask->logical_not(), -std::numeric_limits<float>::infinity())
                 : scores.add(*mask);
  }
  const int64_t cols = scores.size(-1);
  at::Tensor bits = values.contiguous().view(at::kInt).to(at::kLong);
  at::Tensor key = at::where(bits.ge(0), bits + (int64_t{1} << 31), -1 - bits);
  key = at::where(values.isnan(), at::full({}, (int64_t{1} << 32) - 1, key.options()), key);
  at::Tensor col = at::arange(cols, key.options());
  if (limit.has_value()) {
    key = key.masked_fill(col.ge(limit->to(at::kLong).unsqueeze(-1)), -1);
  }
  at::Tensor order = key * (int64_t{1} << 31) + ((int64_t{1} << 31) - 1 - col);
  at::Tensor picked = std::get<0>(std::get<1>(order.topk(k, -1)).sort(-1));
  return out.copy_(picked);
}

at::Tensor topk_cuda(const at::Tensor& scores, c10::SymInt k_sym, const OptTensor& limit,
                     const OptTensor& mask) {
  at::Tensor out = meta(scores, k_sym, limit, mask);
  if (out.numel() == 0) return out;
  const KernelTable& table = prepare_cuda(scores);
  c10::DeviceGuard guard(scores.device());
  at::Tensor s3 = as_rows3(scores);
  at::Tensor lim = limit.has_value() ? limit->contiguous() : at::Tensor();
  at::Tensor m3 = mask.has_value() ? as_rows3(mask->expand(scores.sizes())) : at::Tensor();
  const int64_t score_stride[2] = {s3.stride(0), s3.stride(1)};
  const int64_t mask_stride[2] = {m3.defined() ? m3.stride(0) : 0, m3.defined() ? m3.stride(1) : 0};
  OPSLOT_LAUNCH(table, opslot_topk_indices, static_cast<const float*>(ptr(s3)), s3.size(0),
                s3.size(1), s3.size(2), score_stride, k_sym.expect_int(),
                static_cast<const int32_t*>(ptr(lim)), m3.defined() ? ptr(m3) : nullptr,
                m3.defined() ? mask_kind(m3, kOp) : 0, mask_stride,
                static_cast<int32_t*>(mutable_ptr(out)), stream_of(scores));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def("topk_indices(Tensor scores, SymInt k, Tensor? limit=None, Tensor? mask=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) { m.impl("topk_indices", &topk_cuda); }

TORCH_LIBRARY_IMPL(opslot, Meta, m) { m.impl("topk_indices", &meta); }

TORCH_LIBRARY_IMPL(opslot, CPU, m) { m.impl("topk_indices", &reference); }

}  // namespace opslot_torch
