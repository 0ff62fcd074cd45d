// torch ops opslot::silu_mul / opslot::silu_mul_bwd over the C ABI of swiglu.h: silu(gate) * up
// in one kernel each way; opslot::silu_mul_clamped / _bwd: DeepSeek-V4's
// silu(gate.clamp(max=limit)) * up.clamp(-limit, limit). CUDA and Meta kernels, and Autograd
// kernels on silu_mul and silu_mul_clamped.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_util.h"

namespace opslot_torch {
namespace {

void check(const at::Tensor& gate, const at::Tensor& up) {
  check_float(gate, "silu_mul");
  TORCH_CHECK_VALUE(gate.sym_sizes() == up.sym_sizes() && gate.scalar_type() == up.scalar_type(),
                    "silu_mul: gate ", gate.sym_sizes(), " ", gate.scalar_type(), " and up ",
                    up.sym_sizes(), " ", up.scalar_type(), " must match in shape and dtype");
  check_one_device("silu_mul", {{"gate", gate}, {"up", up}});
}

// Backward op `op`'s inputs: the forward's, and the incoming gradient of the output's shape, on
// its device.
void check_bwd(const char* op, const at::Tensor& grad, const at::Tensor& gate,
               const at::Tensor& up) {
  check(gate, up);
  check_shape(op, "grad", grad, gate.sym_sizes());
  check_one_device(op, {{"gate", gate}, {"grad", grad}});
}

at::Tensor fwd_meta(const at::Tensor& gate, const at::Tensor& up) {
  check(gate, up);
  return at::empty_symint(gate.sym_sizes(), gate.options());
}

at::Tensor fwd_cuda(const at::Tensor& gate, const at::Tensor& up) {
  check(gate, up);
  c10::DeviceGuard guard(gate.device());
  const KernelTable& k = prepare(gate);
  at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  OPSLOT_LAUNCH(k, opslot_silu_mul_fwd, dtype_code(g, "silu_mul"), g.numel(), ptr(g), ptr(u),
                mutable_ptr(out), stream_of(g));
  return out;
}

// The checks of backward op `op` and its (d gate, d up).
std::tuple<at::Tensor, at::Tensor> grads_meta(const char* op, const at::Tensor& grad,
                                              const at::Tensor& gate, const at::Tensor& up) {
  check_bwd(op, grad, gate, up);
  return {at::empty_symint(gate.sym_sizes(), gate.options()),
          at::empty_symint(gate.sym_sizes(), gate.options())};
}

std::tuple<at::Tensor, at::Tensor> bwd_meta(const at::Tensor& grad, const at::Tensor& gate,
                                            const at::Tensor& up) {
  return grads_meta("silu_mul_bwd", grad, gate, up);
}

std::tuple<at::Tensor, at::Tensor> bwd_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                            const at::Tensor& up) {
  check_bwd("silu_mul_bwd", grad, gate, up);
  c10::DeviceGuard guard(gate.device());
  const KernelTable& k = prepare(gate);
  at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor d = grad.to(gate.scalar_type()).contiguous();
  at::Tensor dg = at::empty(gate.sizes(), gate.options());
  at::Tensor du = at::empty(gate.sizes(), gate.options());
  OPSLOT_LAUNCH(k, opslot_silu_mul_bwd, dtype_code(g, "silu_mul"), g.numel(), ptr(g), ptr(u),
                ptr(d), mutable_ptr(dg), mutable_ptr(du), stream_of(g));
  return {dg, du};
}

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::silu_mul", "")
                               .typed<decltype(fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({gate, up});
    return op.call(gate, up);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::silu_mul_bwd", "")
                               .typed<decltype(bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    auto [dg, du] = op.call(grads[0], saved[0], saved[1]);
    return {dg, du};
  }
};

at::Tensor fwd_autograd(const at::Tensor& gate, const at::Tensor& up) {
  return SiluMulFunction::apply(gate, up);
}

// -- clamped ------------------------------------------------------------------------------------
void check_limit(double limit) {
  TORCH_CHECK_VALUE(limit >= 0, "silu_mul_clamped: limit must be a number >= 0, got ", limit);
}

at::Tensor clamped_meta(const at::Tensor& gate, const at::Tensor& up, double limit) {
  check_limit(limit);
  return fwd_meta(gate, up);
}

at::Tensor clamped_cuda(const at::Tensor& gate, const at::Tensor& up, double limit) {
  check(gate, up);
  check_limit(limit);
  c10::DeviceGuard guard(gate.device());
  const KernelTable& k = prepare(gate);
  at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  OPSLOT_LAUNCH(k, opslot_silu_mul_clamped_fwd, dtype_code(g, "silu_mul_clamped"), g.numel(),
                ptr(g), ptr(u), static_cast<float>(limit), mutable_ptr(out), stream_of(g));
  return out;
}

std::tuple<at::Tensor, at::Tensor> clamped_bwd_meta(const at::Tensor& grad, const at::Tensor& gate,
                                                    const at::Tensor& up, double limit) {
  check_limit(limit);
  return grads_meta("silu_mul_clamped_bwd", grad, gate, up);
}

std::tuple<at::Tensor, at::Tensor> clamped_bwd_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                                    const at::Tensor& up, double limit) {
  check_limit(limit);
  check_bwd("silu_mul_clamped_bwd", grad, gate, up);
  c10::DeviceGuard guard(gate.device());
  const KernelTable& k = prepare(gate);
  at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor d = grad.to(gate.scalar_type()).contiguous();
  at::Tensor dg = at::empty(gate.sizes(), gate.options());
  at::Tensor du = at::empty(gate.sizes(), gate.options());
  OPSLOT_LAUNCH(k, opslot_silu_mul_clamped_bwd, dtype_code(g, "silu_mul_clamped"), g.numel(),
                ptr(g), ptr(u), ptr(d), static_cast<float>(limit), mutable_ptr(dg), mutable_ptr(du),
                stream_of(g));
  return {dg, du};
}

class SiluMulClampedFunction : public torch::autograd::Function<SiluMulClampedFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up, double limit) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::silu_mul_clamped", "")
                               .typed<decltype(clamped_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({gate, up});
    ctx->saved_data["limit"] = limit;
    return op.call(gate, up, limit);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::silu_mul_clamped_bwd", "")
                               .typed<decltype(clamped_bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    auto [dg, du] = op.call(grads[0], saved[0], saved[1], ctx->saved_data["limit"].toDouble());
    return {dg, du, at::Tensor()};
  }
};

at::Tensor clamped_autograd(const at::Tensor& gate, const at::Tensor& up, double limit) {
  return SiluMulClampedFunction::apply(gate, up, limit);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_mul_bwd(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  m.def("silu_mul_clamped(Tensor gate, Tensor up, float limit) -> Tensor");
  m.def(
      "silu_mul_clamped_bwd(Tensor grad, Tensor gate, Tensor up, float limit) -> (Tensor, "
      "Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("silu_mul", &fwd_cuda);
  m.impl("silu_mul_bwd", &bwd_cuda);
  m.impl("silu_mul_clamped", &clamped_cuda);
  m.impl("silu_mul_clamped_bwd", &clamped_bwd_cuda);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("silu_mul", &fwd_meta);
  m.impl("silu_mul_bwd", &bwd_meta);
  m.impl("silu_mul_clamped", &clamped_meta);
  m.impl("silu_mul_clamped_bwd", &clamped_bwd_meta);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  register_cpu_refusal(m, "silu_mul");
  register_cpu_refusal(m, "silu_mul_bwd");
  register_cpu_refusal(m, "silu_mul_clamped");
  register_cpu_refusal(m, "silu_mul_clamped_bwd");
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) {
  m.impl("silu_mul", &fwd_autograd);
  m.impl("silu_mul_clamped", &clamped_autograd);
}

}  // namespace opslot_torch
