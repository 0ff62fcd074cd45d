// torch ops opslot::rms_norm_fwd / opslot::rms_norm_bwd over the C ABI of rms_norm.h: RMSNorm
// (standard, offset, unweighted, unweighted_cast) and Qwen3.5's gated RMSNorm. CUDA and Meta
// kernels, and an Autograd kernel on rms_norm_fwd whose backward calls rms_norm_bwd
// (docs/kernels.md).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;

const char* mode_name(int64_t mode) {
  switch (mode) {
    case OPSLOT_RMS_STANDARD:
      return "rms_norm/standard";
    case OPSLOT_RMS_OFFSET:
      return "rms_norm/offset";
    case OPSLOT_RMS_UNWEIGHTED:
      return "rms_norm/unweighted";
    case OPSLOT_RMS_GATED:
      return "rms_norm_gated/standard";
    case OPSLOT_RMS_UNWEIGHTED_CAST:
      return "rms_norm/unweighted_cast";
    default:
      TORCH_CHECK_VALUE(false, "rms_norm: unknown mode ", mode);
  }
}

at::ScalarType out_dtype(const at::Tensor& x, const OptTensor& weight, int64_t mode) {
  if (mode == OPSLOT_RMS_STANDARD && weight.has_value()) {
    return at::promote_types(weight->scalar_type(), x.scalar_type());
  }
  return x.scalar_type();
}

void check_weight(const at::Tensor& x, const OptTensor& weight, int64_t mode, const char* name) {
  if (mode == OPSLOT_RMS_UNWEIGHTED || mode == OPSLOT_RMS_UNWEIGHTED_CAST) {
    TORCH_CHECK_VALUE(!weight.has_value(), name, " takes weight=None");
    return;
  }
  TORCH_CHECK_VALUE(weight.has_value(), name, " needs a weight");
  TORCH_CHECK_VALUE(weight->dim() == 1 && weight->sym_size(0) == x.sym_size(-1), name,
                    ": weight of shape ", weight->sizes(), " for rows of ", x.sym_size(-1));
  TORCH_CHECK_TYPE(weight->scalar_type() == x.scalar_type() || weight->scalar_type() == at::kFloat,
                   name, ": weight dtype ", weight->scalar_type(), " with input dtype ",
                   x.scalar_type(),
                   " (the cuda kernel takes a weight in the input's dtype or float32); use "
                   "'torch' or 'eager'");
}

void check(const at::Tensor& x, const OptTensor& gate, const OptTensor& weight, int64_t mode) {
  const char* name = mode_name(mode);
  check_float(x, name);
  TORCH_CHECK_VALUE(x.dim() > 0 && x.sym_size(-1) != 0, name,
                    ": the input needs a non-empty last dimension, got shape ", x.sym_sizes());
  check_weight(x, weight, mode, name);
  if (mode == OPSLOT_RMS_GATED) {
    TORCH_CHECK_VALUE(gate.has_value() && gate->sym_sizes() == x.sym_sizes() &&
                          gate->scalar_type() == x.scalar_type(),
                      name, ": gate must have the input's shape and dtype");
  } else {
    TORCH_CHECK_VALUE(!gate.has_value(), name, " takes no gate");
  }
  check_one_device(name, {{"x", x}, {"gate", gate}, {"weight", weight}});
}

// The backward's arguments: the forward's, dy of x's shape and rstd (float32) of its rows'.
void check_bwd(const at::Tensor& dy, const at::Tensor& x, const OptTensor& gate,
               const OptTensor& weight, const at::Tensor& rstd, int64_t mode) {
  check(x, gate, weight, mode);
  const char* name = "rms_norm_bwd";
  check_shape(name, "dy", dy, x.sym_sizes());
  check_shape(name, "rstd", rstd, x.sym_sizes().slice(0, x.dim() - 1));
  TORCH_CHECK_TYPE(rstd.scalar_type() == at::kFloat, name, ": rstd must be torch.float32, got ",
                   py_dtype(rstd.scalar_type()));
  check_one_device(name, {{"x", x}, {"dy", dy}, {"rstd", rstd}});
}

// The weight, contiguous and 32-byte aligned (the kernels read it in 16/32-byte vectors).
OptTensor aligned(const OptTensor& weight) {
  if (!weight.has_value()) return std::nullopt;
  at::Tensor w = weight->contiguous();
  return reinterpret_cast<uintptr_t>(w.const_data_ptr()) % 32 == 0 ? w : w.clone();
}

std::tuple<at::Tensor, at::Tensor> fwd_meta(const at::Tensor& x, const OptTensor& gate,
                                            const OptTensor& weight, double, int64_t mode) {
  check(x, gate, weight, mode);
  auto sizes = x.sym_sizes();
  return {at::empty_symint(sizes, x.options().dtype(out_dtype(x, weight, mode))),
          at::empty_symint(sizes.slice(0, sizes.size() - 1), x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& x, const OptTensor& gate,
                                            const OptTensor& weight, double eps, int64_t mode) {
  check(x, gate, weight, mode);
  c10::DeviceGuard guard(x.device());
  const KernelTable& k = prepare(x);
  at::Tensor xv = rows_view(x);
  OptTensor gv = gate.has_value() ? OptTensor(rows_view(*gate)) : std::nullopt;
  OptTensor wv = aligned(weight);
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(out_dtype(x, weight, mode)));
  at::Tensor rstd = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
  OPSLOT_LAUNCH(k, opslot_rms_norm_fwd, static_cast<int>(mode), dtype_code(x, "rms_norm"),
                dtype_code(wv.value_or(x), "rms_norm"), xv.size(0), xv.size(1),
                static_cast<float>(eps), ptr(xv), row_stride(xv), ptr(gv),
                gv.has_value() ? row_stride(*gv) : 0, ptr(wv), mutable_ptr(y),
                static_cast<float*>(mutable_ptr(rstd)), stream_of(x));
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_meta(const at::Tensor& dy, const at::Tensor& x,
                                                        const OptTensor& gate,
                                                        const OptTensor& weight,
                                                        const at::Tensor& rstd, int64_t mode) {
  check_bwd(dy, x, gate, weight, rstd, mode);
  at::Tensor dx = at::empty_symint(x.sym_sizes(), x.options());
  at::Tensor dgate =
      gate.has_value() ? at::empty_symint(x.sym_sizes(), x.options()) : at::empty({0}, x.options());
  at::Tensor dw = weight.has_value() ? at::empty_symint(weight->sym_sizes(), weight->options())
                                     : at::empty({0}, x.options());
  return {dx, dgate, dw};
}

// Rows of fp32 scratch for the weight gradient (0 for the unweighted variant).
int64_t partial_rows(const KernelTable& k, int64_t mode, int w_code, const at::Tensor& xv,
                     const OptTensor& gv, const at::Tensor& dyv) {
  int64_t rows = OPSLOT_ENTRY(k, opslot_rms_norm_bwd_partial_rows)(
      static_cast<int>(mode), dtype_code(xv, "rms_norm"), w_code, xv.size(0), xv.size(1), ptr(xv),
      row_stride(xv), ptr(gv), gv.has_value() ? row_stride(*gv) : 0, ptr(dyv), row_stride(dyv));
  TORCH_CHECK(rows >= 0, "opslot cuda kernel rms_norm backward: ", k.opslot_last_error());
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                        const OptTensor& gate,
                                                        const OptTensor& weight,
                                                        const at::Tensor& rstd, int64_t mode) {
  auto [dx, dgate, dw] = bwd_meta(dy, x, gate, weight, rstd, mode);  // the checks, the outputs
  c10::DeviceGuard guard(x.device());
  const KernelTable& k = prepare(x);
  at::Tensor xv = rows_view(x);
  OptTensor gv = gate.has_value() ? OptTensor(rows_view(*gate)) : std::nullopt;
  at::Tensor dyv = rows_view(dy.to(out_dtype(x, weight, mode)));
  at::Tensor rs = rstd.contiguous();
  OptTensor wv = aligned(weight);
  int w_code = dtype_code(wv.value_or(x), "rms_norm");
  at::Tensor partial;
  if (weight.has_value()) {
    int64_t rows = partial_rows(k, mode, w_code, xv, gv, dyv);
    partial = at::empty({std::max<int64_t>(rows, 1), xv.size(1)}, x.options().dtype(at::kFloat));
  }
  OPSLOT_LAUNCH(k, opslot_rms_norm_bwd, static_cast<int>(mode), dtype_code(x, "rms_norm"), w_code,
                xv.size(0), xv.size(1), ptr(xv), row_stride(xv), ptr(gv),
                gv.has_value() ? row_stride(*gv) : 0, ptr(wv), static_cast<const float*>(ptr(rs)),
                ptr(dyv), row_stride(dyv), mutable_ptr(dx), mutable_ptr(dgate),
                static_cast<float*>(mutable_ptr(partial)), mutable_ptr(dw), stream_of(x));
  return {dx, dgate, dw};
}

const auto& fwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opslot::rms_norm_fwd", "")
                             .typed<decltype(fwd_cuda)>();
  return op;
}

const auto& bwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opslot::rms_norm_bwd", "")
                             .typed<decltype(bwd_cuda)>();
  return op;
}

// y = norm(x) as opslot.reference; rstd is saved for the backward and never differentiated.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const OptTensor& gate,
                                                const OptTensor& weight, double eps, int64_t mode) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, rstd] = fwd_op().call(x, gate, weight, eps, mode);
    ctx->save_for_backward({x, gate.value_or(at::Tensor()), weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["mode"] = mode;
    ctx->mark_non_differentiable({rstd});
    // rstd never has a gradient: without this, autograd would fill a zero tensor for it.
    ctx->set_materialize_grads(false);
    return {y, rstd};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    OptTensor gate = saved[1].defined() ? OptTensor(saved[1]) : std::nullopt;
    OptTensor weight = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    int64_t mode = ctx->saved_data["mode"].toInt();
    at::Tensor dy = grads[0];
    if (!dy.defined()) dy = at::zeros(x.sizes(), x.options().dtype(out_dtype(x, weight, mode)));
    auto [dx, dgate, dw] = bwd_op().call(dy, x, gate, weight, saved[3], mode);
    return {dx, gate.has_value() ? dgate : at::Tensor(), weight.has_value() ? dw : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> fwd_autograd(const at::Tensor& x, const OptTensor& gate,
                                                const OptTensor& weight, double eps, int64_t mode) {
  auto out = RmsNormFunction::apply(x, gate, weight, eps, mode);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "rms_norm_fwd(Tensor x, Tensor? gate, Tensor? weight, float eps, int mode) -> (Tensor, "
      "Tensor)");
  m.def(
      "rms_norm_bwd(Tensor dy, Tensor x, Tensor? gate, Tensor? weight, Tensor rstd, int mode) -> "
      "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("rms_norm_fwd", &fwd_cuda);
  m.impl("rms_norm_bwd", &bwd_cuda);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("rms_norm_fwd", &fwd_meta);
  m.impl("rms_norm_bwd", &bwd_meta);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  register_cpu_refusal(m, "rms_norm_fwd");
  register_cpu_refusal(m, "rms_norm_bwd");
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("rms_norm_fwd", &fwd_autograd); }

}  // namespace opslot_torch
