// torch op opslot::mask_limit over the C ABI of mask_limit.h: one past the last column each row of
// an attention mask [..., T] shows, int32 [...] (0 for a row that shows none). Shown: a bool True;
// a float above its dtype's lowest finite value (that value, -inf and NaN hide). No gradient. CUDA
// and Meta kernels; the CPU kernel computes the same with ATen (the reference).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <limits>

#include "op_util.h"

namespace opslot_torch {
namespace {

constexpr const char* kOp = "mask_limit";

at::Tensor meta(const at::Tensor& mask) {
  (void)mask_kind(mask, kOp);
  TORCH_CHECK_VALUE(mask.dim() >= 1, kOp,
                    ": mask must have at least one dimension (rows of keys), got shape ",
                    py_shape(mask.sym_sizes()));
  return at::empty_symint(mask.sym_sizes().slice(0, mask.dim() - 1),
                          mask.options().dtype(at::kInt));
}

// The lowest finite value of a float mask's dtype (what hides a key, with -inf and NaN).
at::Scalar lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return std::numeric_limits<c10::Half>::lowest();
    case at::kBFloat16:
      return std::numeric_limits<c10::BFloat16>::lowest();
    default:
      return std::numeric_limits<float>::lowest();
  }
}

at::Tensor reference(const at::Tensor& mask) {
  at::Tensor out = meta(mask);
  if (out.numel() == 0) return out;
  if (mask.size(-1) == 0) return out.zero_();
  at::Tensor shown = mask.scalar_type() == at::kBool ? mask : mask.gt(lowest(mask.scalar_type()));
  at::Tensor pos = at::arange(1, mask.size(-1) + 1, mask.options().dtype(at::kInt));
  return out.copy_(at::where(shown, pos, 0).amax(-1));
}

at::Tensor limit_cuda(const at::Tensor& mask) {
  at::Tensor out = meta(mask);
  if (out.numel() == 0) return out;
  const KernelTable& table = prepare_cuda(mask);
  c10::DeviceGuard guard(mask.device());
  at::Tensor m3 = as_rows3(mask);
  const int64_t stride[2] = {m3.stride(0), m3.stride(1)};
  OPSLOT_LAUNCH(table, opslot_mask_limit, m3.numel() > 0 ? m3.const_data_ptr() : nullptr,
                mask_kind(m3, kOp), m3.size(0), m3.size(1), m3.size(2), stride,
                static_cast<int32_t*>(mutable_ptr(out)), stream_of(mask));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) { m.def("mask_limit(Tensor mask) -> Tensor"); }

TORCH_LIBRARY_IMPL(opslot, CUDA, m) { m.impl("mask_limit", &limit_cuda); }

TORCH_LIBRARY_IMPL(opslot, Meta, m) { m.impl("mask_limit", &meta); }

TORCH_LIBRARY_IMPL(opslot, CPU, m) { m.impl("mask_limit", &reference); }

}  // namespace opslot_torch
