// torch ops over the C ABI of cross_entropy.h (docs/kernels.md, "Cross-entropy"):
// - opslot::ce_linear_fwd: the causal-LM loss without full logits: per chunk of tokens a cuBLAS
//   GEMM writes the logits tile, opslot_ce_rows its row losses and (overwriting it) its gradient,
//   and two GEMMs the chunk's hidden and weight gradients; (loss, grad_hidden, grad_weight).
// - opslot::ce_logits_fwd: the loss of given logits, the gradient into its own buffer.
// - opslot::ce_scale_: x *= factor in place (the backward of both: the upstream gradient is a
//   scalar, so the gradients made in the forward are only scaled).
// - opslot::ce_rows: the launch of opslot_ce_rows as an op. The forwards launch directly on CUDA
//   tensors and call this op on others: its CPU kernel, and ce_scale_'s, are registered from Python
//   (opslot.kernels.cuda.cross_entropy) and call that module's `_backend`, which CPU tests replace
//   with an emulation to run these ops' chunking, reductions and autograd without a GPU.
// The forwards' CUDA kernels are also their CPU kernels. Int arguments are SymInts in the schemas
// (as the Python custom ops had them); the Meta and Autograd kernels keep them symbolic.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Three = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Two = std::tuple<at::Tensor, at::Tensor>;

constexpr int64_t kModeMean = 0, kModeValue = 1, kModeTensor = 2;

void rows_cuda(const at::Tensor& logits, const OptTensor& grad, const at::Tensor& targets,
               int64_t ignore_index, const OptTensor& grad_scale, const at::Tensor& row_loss) {
  const KernelTable& k = prepare_cuda(logits);
  c10::DeviceGuard guard(logits.device());
  OPSLOT_LAUNCH(k, opslot_ce_rows, logits.const_data_ptr(), logits.stride(0),
                grad.has_value() ? grad->data_ptr() : nullptr,
                grad.has_value() ? grad->stride(0) : 0, logits.size(0), logits.size(1),
                dtype_code(logits, "cross_entropy"), targets.const_data_ptr<int64_t>(),
                ignore_index,
                grad_scale.has_value() ? grad_scale->const_data_ptr<float>() : nullptr,
                row_loss.data_ptr<float>(), stream_of(logits));
}

// The launch on CUDA tensors; on others opslot::ce_rows, whose CPU kernel calls `_backend`.
void rows(const at::Tensor& logits, const OptTensor& grad, const at::Tensor& targets,
          int64_t ignore_index, const OptTensor& grad_scale, const at::Tensor& row_loss) {
  launch_or_dispatch<&rows_cuda>("opslot::ce_rows", logits, logits, grad, targets, ignore_index,
                                 grad_scale, row_loss);
}

void scale_cuda(at::Tensor& x, const at::Tensor& factor) {
  if (x.numel() == 0) return;
  const KernelTable& k = prepare_cuda(x);
  TORCH_CHECK_VALUE(x.is_contiguous(), "opslot::ce_scale_ scales contiguous tensors");
  c10::DeviceGuard guard(x.device());
  at::Tensor f = factor.to(x.device(), at::kFloat).reshape({}).contiguous();
  OPSLOT_LAUNCH(k, opslot_ce_scale_inplace, x.data_ptr(), x.numel(), dtype_code(x, "cross_entropy"),
                f.const_data_ptr<float>(), stream_of(x));
}

void scale_meta(at::Tensor& x, const at::Tensor& factor) {}

// The loss's denominator as a device fp32 scalar, without a host synchronisation.
at::Tensor divisor_of(const at::Tensor& targets, const OptTensor& divisor, double value,
                      int64_t mode, int64_t ignore_index) {
  if (mode == kModeTensor) {
    TORCH_CHECK_VALUE(divisor.has_value(), "opslot::ce: mode ", mode, " needs a divisor tensor");
    return divisor->to(targets.device(), at::kFloat).reshape({});
  }
  if (mode == kModeValue) return at::full({}, value, targets.options().dtype(at::kFloat));
  // mean over counted tokens; 0 counted tokens -> divide by 1 (loss 0, not upstream's NaN)
  return (targets != ignore_index).sum().clamp_min(1).to(at::kFloat);
}

// logits (or hidden) [N, C] and targets [N] int64 on their device; the divisor is copied to it.
void check_rows(const char* op, const char* name, const at::Tensor& x, const at::Tensor& targets) {
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": ", name, " must be [tokens, ",
                    std::string(name) == "logits" ? "classes" : "hidden", "], got shape ",
                    py_shape(x.sym_sizes()));
  TORCH_CHECK_TYPE(targets.scalar_type() == at::kLong, op, ": targets must be torch.int64, got ",
                   py_dtype(targets.scalar_type()));
  check_shape(op, "targets", targets, {x.sym_size(0)});
  check_one_device(op, {{name, x}, {"targets", targets}});
}

void check_linear(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
  const char* op = "ce_linear_fwd";
  check_rows(op, "hidden", hidden, targets);
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == hidden.sym_size(1), op,
                    ": weight must be [vocab, ", hidden.sym_size(1), "], got shape ",
                    py_shape(weight.sym_sizes()));
  check_one_device(op, {{"hidden", hidden}, {"weight", weight}});
}

// `t`'s gradient buffer when it is wanted, else an empty tensor.
at::Tensor grad_buffer(const at::Tensor& t, bool wanted) {
  return wanted ? at::empty_like(t) : at::empty({0}, t.options());
}

// (loss fp32, grad_hidden, grad_weight).
Three linear_meta(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                  const OptTensor& divisor, double divisor_value, c10::SymInt mode,
                  c10::SymInt ignore_index, c10::SymInt chunk_size, bool grad_hidden,
                  bool grad_weight) {
  check_linear(hidden, weight, targets);
  return {at::empty({}, hidden.options().dtype(at::kFloat)), grad_buffer(hidden, grad_hidden),
          grad_buffer(weight, grad_weight)};
}

// CE(hidden @ weight.T, targets) reduced by `mode`, chunk by chunk (one [chunk, V] logits tile).
Three linear_fwd(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                 const OptTensor& divisor, double divisor_value, int64_t mode, int64_t ignore_index,
                 int64_t chunk_size, bool grad_hidden, bool grad_weight) {
  check_linear(hidden, weight, targets);
  if (hidden.is_cuda()) prepare(hidden);  // CPU tensors: ce_rows' kernel checks
  int64_t tokens = hidden.size(0), vocab = weight.size(0);
  bool want_grad = grad_hidden || grad_weight;
  at::Tensor div = divisor_of(targets, divisor, divisor_value, mode, ignore_index);
  OptTensor inv = want_grad ? OptTensor(div.reciprocal()) : std::nullopt;
  at::Tensor row_loss = at::empty({tokens}, hidden.options().dtype(at::kFloat));
  at::Tensor grad_h = grad_buffer(hidden, grad_hidden), grad_w = grad_buffer(weight, grad_weight);
  if (tokens == 0 && grad_weight) grad_w.zero_();
  if (tokens > 0) {
    int64_t chunk = std::max<int64_t>(1, std::min(chunk_size, tokens));
    at::Tensor tile_buf = at::empty({chunk, vocab}, weight.options().device(hidden.device()));
    at::Tensor wt = weight.t();
    for (int64_t start = 0; start < tokens; start += chunk) {
      int64_t end = std::min(start + chunk, tokens);
      at::Tensor h = hidden.slice(0, start, end), tile = tile_buf.slice(0, 0, end - start);
      at::mm_out(tile, h, wt);
      rows(tile, want_grad ? OptTensor(tile) : std::nullopt, targets.slice(0, start, end),
           ignore_index, inv, row_loss.slice(0, start, end));
      if (grad_hidden) {
        at::Tensor out = grad_h.slice(0, start, end);
        at::mm_out(out, tile, weight);
      }
      if (grad_weight && start == 0) at::mm_out(grad_w, tile.t(), h);
      if (grad_weight && start > 0) grad_w.addmm_(tile.t(), h);
    }
  }
  return {row_loss.sum() / div, grad_h, grad_w};
}

// (loss fp32, the gradient [N, C] contiguous in the logits' dtype, or an empty tensor).
Two logits_meta(const at::Tensor& logits, const at::Tensor& targets, const OptTensor& divisor,
                double divisor_value, c10::SymInt mode, c10::SymInt ignore_index,
                bool compute_grad) {
  check_rows("ce_logits_fwd", "logits", logits, targets);
  return {at::empty({}, logits.options().dtype(at::kFloat)),
          compute_grad ? at::empty_symint(logits.sym_sizes(), logits.options())
                       : at::empty({0}, logits.options())};
}

Two logits_fwd(const at::Tensor& logits, const at::Tensor& targets, const OptTensor& divisor,
               double divisor_value, int64_t mode, int64_t ignore_index, bool compute_grad) {
  check_rows("ce_logits_fwd", "logits", logits, targets);
  if (logits.is_cuda()) prepare(logits);  // CPU tensors: ce_rows' kernel checks
  at::Tensor div = divisor_of(targets, divisor, divisor_value, mode, ignore_index);
  at::Tensor row_loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  at::Tensor grad =
      compute_grad ? at::empty(logits.sizes(), logits.options()) : at::empty({0}, logits.options());
  if (logits.size(0) > 0) {
    rows(logits, compute_grad ? OptTensor(grad) : std::nullopt, targets, ignore_index,
         compute_grad ? OptTensor(div.reciprocal()) : std::nullopt, row_loss);
  }
  return {row_loss.sum() / div, grad};
}

// True while torch.compile / AOTAutograd traces (fake or functional tensors).
bool traced(const at::Tensor& t) {
  return t.key_set().has_any(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// `grad * grad_loss` (fp32 math, rounded to grad's dtype). Eager: in place on the gradient saved by
// the forward (ce_scale_), so no second copy of a vocab x hidden gradient exists; a second backward
// through the same graph (retain_graph) is then refused by autograd's version check. Traced: the
// same math out of place, which the compiler fuses and plans memory for (AOTAutograd cannot express
// a backward mutation of a forward output).
at::Tensor scaled(at::Tensor grad, const at::Tensor& grad_loss) {
  if (traced(grad) || traced(grad_loss)) {
    return (grad.to(at::kFloat) * grad_loss.to(at::kFloat)).to(grad.scalar_type());
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opslot::ce_scale_", "")
                             .typed<decltype(scale_cuda)>();
  op.call(grad, grad_loss);
  return grad;
}

// The gradients are made in the forward and saved; backward scales them by the loss's gradient.
// Their outputs are never differentiated: grads are not materialized (no zero-filled [N, H] and
// [V, H] tensors for them).
class CeLinearFunction : public torch::autograd::Function<CeLinearFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, const OptTensor& divisor,
                                                double divisor_value, c10::SymInt mode,
                                                c10::SymInt ignore_index, c10::SymInt chunk_size,
                                                bool grad_hidden, bool grad_weight) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::ce_linear_fwd", "")
                               .typed<decltype(linear_meta)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, grad_h, grad_w] = op.call(hidden, weight, targets, divisor, divisor_value, mode,
                                          ignore_index, chunk_size, grad_hidden, grad_weight);
    ctx->set_materialize_grads(false);
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->saved_data["grad_weight"] = grad_weight;
    ctx->save_for_backward({grad_h, grad_w});
    return {loss, grad_h, grad_w};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(10);
    if (!grads[0].defined()) return out;  // only the gradient outputs were used: constants
    auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["grad_hidden"].toBool()) out[0] = scaled(saved[0], grads[0]);
    if (ctx->saved_data["grad_weight"].toBool()) out[1] = scaled(saved[1], grads[0]);
    return out;
  }
};

class CeLogitsFunction : public torch::autograd::Function<CeLogitsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& logits, const at::Tensor& targets,
                                                const OptTensor& divisor, double divisor_value,
                                                c10::SymInt mode, c10::SymInt ignore_index,
                                                bool compute_grad) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::ce_logits_fwd", "")
                               .typed<decltype(logits_meta)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, grad] =
        op.call(logits, targets, divisor, divisor_value, mode, ignore_index, compute_grad);
    ctx->set_materialize_grads(false);
    ctx->saved_data["compute_grad"] = compute_grad;
    ctx->save_for_backward({grad});
    return {loss, grad};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(7);
    if (!ctx->saved_data["compute_grad"].toBool() || !grads[0].defined()) return out;
    out[0] = scaled(ctx->get_saved_variables()[0], grads[0]);
    return out;
  }
};

Three linear_autograd(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                      const OptTensor& divisor, double divisor_value, c10::SymInt mode,
                      c10::SymInt ignore_index, c10::SymInt chunk_size, bool grad_hidden,
                      bool grad_weight) {
  auto o = CeLinearFunction::apply(hidden, weight, targets, divisor, divisor_value, mode,
                                   ignore_index, chunk_size, grad_hidden, grad_weight);
  return {o[0], o[1], o[2]};
}

Two logits_autograd(const at::Tensor& logits, const at::Tensor& targets, const OptTensor& divisor,
                    double divisor_value, c10::SymInt mode, c10::SymInt ignore_index,
                    bool compute_grad) {
  auto o = CeLogitsFunction::apply(logits, targets, divisor, divisor_value, mode, ignore_index,
                                   compute_grad);
  return {o[0], o[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "ce_linear_fwd(Tensor hidden, Tensor weight, Tensor targets, Tensor? divisor, float "
      "divisor_value, SymInt mode, SymInt ignore_index, SymInt chunk_size, bool grad_hidden, bool "
      "grad_weight) -> (Tensor, Tensor, Tensor)");
  m.def(
      "ce_logits_fwd(Tensor logits, Tensor targets, Tensor? divisor, float divisor_value, SymInt "
      "mode, SymInt ignore_index, bool compute_grad) -> (Tensor, Tensor)");
  m.def("ce_scale_(Tensor(a!) x, Tensor factor) -> ()");
  m.def(
      "ce_rows(Tensor logits, Tensor(a!)? grad, Tensor targets, int ignore_index, Tensor? "
      "grad_scale, Tensor(b!) row_loss) -> ()");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("ce_linear_fwd", &linear_fwd);
  m.impl("ce_logits_fwd", &logits_fwd);
  m.impl("ce_scale_", &scale_cuda);
  m.impl("ce_rows", &rows_cuda);
}

// ce_rows' and ce_scale_'s CPU kernels come from Python (`_backend`, above).
TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  m.impl("ce_linear_fwd", &linear_fwd);
  m.impl("ce_logits_fwd", &logits_fwd);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("ce_linear_fwd", &linear_meta);
  m.impl("ce_logits_fwd", &logits_meta);
  m.impl("ce_scale_", &scale_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) {
  m.impl("ce_linear_fwd", &linear_autograd);
  m.impl("ce_logits_fwd", &logits_autograd);
}

TORCH_LIBRARY_IMPL(opslot, ADInplaceOrView, m) { register_inplace_version_bump(m, "ce_scale_"); }

}  // namespace opslot_torch
