// torch ops opslot::load_balancing_loss_fwd / opslot::load_balancing_loss_bwd over the C ABI of
// load_balancing.h: the Switch-Transformer loss over every layer's router logits, the layers never
// concatenated (their pointers go to the kernel). CUDA and Meta kernels, and an Autograd kernel on
// the forward; the top-k counts are not differentiated, as upstream.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;

std::string layer_list(at::TensorList logits) {
  std::string text = "[";
  for (size_t i = 0; i < logits.size() && i < 4; ++i) {
    text += (i ? ", (" : "(") + c10::str(logits[i].sizes(), ", ", logits[i].scalar_type()) + ")";
  }
  return text + "]";
}

// The router logits: [tokens, experts] of one shape, dtype and device; the flattened mask [tokens]
// float32 on their device.
void check_layers(at::TensorList logits, const OptTensor& mask) {
  TORCH_CHECK_VALUE(!logits.empty(), "load_balancing_loss: no router logits");
  const at::Tensor& first = logits[0];
  check_float(first, "load_balancing_loss");
  for (const at::Tensor& t : logits) {
    TORCH_CHECK_VALUE(t.dim() == 2 && t.sym_sizes() == first.sym_sizes() &&
                          t.scalar_type() == first.scalar_type() && t.device() == first.device(),
                      "load_balancing_loss (cuda): every layer's router logits must be [tokens, "
                      "experts] of one shape, dtype and device; got ",
                      layer_list(logits));
  }
  if (mask.has_value()) {
    TORCH_CHECK_VALUE(mask->dim() == 1 && mask->sym_size(0) == first.sym_size(0) &&
                          mask->scalar_type() == at::kFloat,
                      "load_balancing_loss: the flattened attention mask has ", mask->sym_numel(),
                      " entries for ", first.sym_size(0), " rows of router logits");
  }
  check_one_device("load_balancing_loss", {{"router logits", first}, {"mask", mask}});
}

void check(at::TensorList logits, const OptTensor& mask, int64_t num_experts, int64_t top_k) {
  check_layers(logits, mask);
  const at::Tensor& first = logits[0];
  TORCH_CHECK_VALUE(first.sym_size(1) == num_experts, "load_balancing_loss: logits have ",
                    first.sym_size(1), " experts, num_experts is ", num_experts);
  TORCH_CHECK_VALUE(num_experts > 0 && num_experts <= 512,
                    "load_balancing_loss (cuda): ", num_experts,
                    " experts; the kernel takes 1 to 512");
  TORCH_CHECK_VALUE(top_k >= 0 && top_k <= num_experts, "load_balancing_loss: top_k ", top_k,
                    " with ", num_experts, " experts");
}

// The backward's: the forward's logits and mask, the loss's gradient (a scalar, on any device: it
// is copied) and the forward's coef (float32 [experts]).
void check_bwd(const at::Tensor& grad, at::TensorList logits, const OptTensor& mask,
               const at::Tensor& coef) {
  check_layers(logits, mask);
  const char* op = "load_balancing_loss_bwd";
  check_shape(op, "grad", grad, {});
  check_shape(op, "coef", coef, {logits[0].sym_size(1)});
  TORCH_CHECK_TYPE(coef.scalar_type() == at::kFloat, op, ": coef must be torch.float32, got ",
                   py_dtype(coef.scalar_type()));
  check_one_device(op, {{"router logits", logits[0]}, {"coef", coef}});
}

struct Layers {
  std::vector<at::Tensor> ready;  // kept alive across the call
  std::vector<const void*> pointers;
  std::vector<int64_t> row_strides;
};

Layers layers(at::TensorList logits) {
  Layers l;
  for (const at::Tensor& t : logits) {
    l.ready.push_back(last_contiguous(t));
    l.pointers.push_back(ptr(l.ready.back()));
    l.row_strides.push_back(t.size(0) > 1 ? l.ready.back().stride(0) : t.size(1));
  }
  return l;
}

std::tuple<at::Tensor, at::Tensor> fwd_meta(at::TensorList logits, const OptTensor& mask,
                                            int64_t num_experts, int64_t top_k) {
  check(logits, mask, num_experts, top_k);
  auto options = logits[0].options().dtype(at::kFloat);
  return {at::empty({}, options), at::empty({num_experts}, options)};
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(at::TensorList logits, const OptTensor& mask,
                                            int64_t num_experts, int64_t top_k) {
  check(logits, mask, num_experts, top_k);
  const at::Tensor& first = logits[0];
  c10::DeviceGuard guard(first.device());
  const KernelTable& k = prepare(first);
  Layers l = layers(logits);
  int n_layers = static_cast<int>(logits.size());
  int experts = static_cast<int>(num_experts);
  int64_t floats =
      OPSLOT_ENTRY(k, opslot_load_balancing_scratch_floats)(n_layers, first.size(0), experts);
  TORCH_CHECK(floats >= 0, "opslot cuda kernel load_balancing: ", k.opslot_last_error());
  auto options = first.options().dtype(at::kFloat);
  at::Tensor scratch = at::empty({std::max<int64_t>(floats, 1)}, options);
  at::Tensor loss = at::empty({}, options), coef = at::empty({num_experts}, options);
  at::Tensor m = mask.has_value() ? mask->contiguous() : at::Tensor();
  OPSLOT_LAUNCH(k, opslot_load_balancing_fwd, dtype_code(first, "load_balancing_loss"), n_layers,
                l.pointers.data(), l.row_strides.data(), first.size(0), experts,
                static_cast<int>(top_k), static_cast<const float*>(ptr(m)),
                static_cast<float*>(mutable_ptr(scratch)), static_cast<float*>(mutable_ptr(loss)),
                static_cast<float*>(mutable_ptr(coef)), stream_of(first));
  return {loss, coef};
}

at::Tensor bwd_meta(const at::Tensor& grad, at::TensorList logits, const OptTensor& mask,
                    const at::Tensor& coef) {
  check_bwd(grad, logits, mask, coef);
  std::vector<c10::SymInt> sizes = {c10::SymInt(static_cast<int64_t>(logits.size()))};
  for (const c10::SymInt& s : logits[0].sym_sizes()) sizes.push_back(s);
  return at::empty_symint(sizes, logits[0].options());
}

at::Tensor bwd_cuda(const at::Tensor& grad, at::TensorList logits, const OptTensor& mask,
                    const at::Tensor& coef) {
  at::Tensor out = bwd_meta(grad, logits, mask, coef);  // checks the arguments first
  const at::Tensor& first = logits[0];
  c10::DeviceGuard guard(first.device());
  const KernelTable& k = prepare(first);
  Layers l = layers(logits);
  // Each layer's gradient is one [tokens, experts] slab of `out`: addresses, not a view per layer.
  std::vector<void*> outs;
  char* base = out.numel() ? static_cast<char*>(out.data_ptr()) : nullptr;
  for (int64_t i = 0; i < static_cast<int64_t>(logits.size()); ++i) {
    outs.push_back(base ? base + i * out.stride(0) * out.element_size() : nullptr);
  }
  at::Tensor g = grad.to(first.device(), at::kFloat).reshape({1}).contiguous();
  at::Tensor c = coef.contiguous();
  at::Tensor m = mask.has_value() ? mask->contiguous() : at::Tensor();
  OPSLOT_LAUNCH(k, opslot_load_balancing_bwd, dtype_code(first, "load_balancing_loss"),
                static_cast<int>(logits.size()), l.pointers.data(), l.row_strides.data(),
                first.size(0), static_cast<int>(first.size(1)), static_cast<const float*>(ptr(m)),
                static_cast<const float*>(ptr(c)), static_cast<const float*>(ptr(g)), outs.data(),
                stream_of(first));
  return out;
}

class LoadBalancingFunction : public torch::autograd::Function<LoadBalancingFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList logits, const OptTensor& mask,
                                                int64_t num_experts, int64_t top_k) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::load_balancing_loss_fwd", "")
                               .typed<decltype(fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, coef] = op.call(logits, mask, num_experts, top_k);
    std::vector<at::Tensor> saved = {mask.value_or(at::Tensor()), coef};
    saved.insert(saved.end(), logits.begin(), logits.end());
    ctx->save_for_backward(saved);
    ctx->mark_non_differentiable({coef});
    // coef never has a gradient: without this, autograd would fill a zero tensor for it.
    ctx->set_materialize_grads(false);
    return {loss, coef};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::load_balancing_loss_bwd", "")
                               .typed<decltype(bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    size_t n_layers = saved.size() - 2;
    torch::autograd::variable_list out(n_layers + 3);
    if (!grads[0].defined()) return out;
    OptTensor mask = saved[0].defined() ? OptTensor(saved[0]) : std::nullopt;
    std::vector<at::Tensor> logits(saved.begin() + 2, saved.end());
    at::Tensor stacked = op.call(grads[0], logits, mask, saved[1]);
    // The layers' gradients are slabs of `stacked`. Below the autograd keys a select is one plain
    // view (no view tracking, no autograd kernel): the host cost of 48 layers is per layer
    // (docs/results/host_cost_h200.md). Nothing differentiates these gradients again (the backward
    // op has no autograd kernel).
    at::AutoDispatchBelowADInplaceOrView below;
    for (size_t i = 0; i < n_layers; ++i) out[i] = stacked.select(0, static_cast<int64_t>(i));
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> fwd_autograd(at::TensorList logits, const OptTensor& mask,
                                                int64_t num_experts, int64_t top_k) {
  auto out = LoadBalancingFunction::apply(logits, mask, num_experts, top_k);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "load_balancing_loss_fwd(Tensor[] logits, Tensor? mask, int num_experts, int top_k) -> "
      "(Tensor, Tensor)");
  m.def(
      "load_balancing_loss_bwd(Tensor grad, Tensor[] logits, Tensor? mask, Tensor coef) -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("load_balancing_loss_fwd", &fwd_cuda);
  m.impl("load_balancing_loss_bwd", &bwd_cuda);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("load_balancing_loss_fwd", &fwd_meta);
  m.impl("load_balancing_loss_bwd", &bwd_meta);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  register_cpu_refusal(m, "load_balancing_loss_fwd");
  register_cpu_refusal(m, "load_balancing_loss_bwd");
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("load_balancing_loss_fwd", &fwd_autograd); }

}  // namespace opslot_torch
