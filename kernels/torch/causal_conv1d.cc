// torch ops opslot::causal_conv1d_fwd / _bwd / _update over the C ABI of causal_conv1d.h: Qwen3.5
// Gated DeltaNet's depthwise causal conv1d (packed sequences through cu_seqlens) and its decode
// update (conv_state written in place). x is read through its strides; the output and dx take x's
// layout (channels-last when x's channel stride is the smaller). The CUDA kernels are also the CPU
// kernels: the argument checks come first, then the wrong-device refusal (prepare_cuda). Autograd
// on the forward saves only the inputs (the backward recomputes the pre-activation).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;

void check_same_device(const char* name, const OptTensor& t, const at::Tensor& x) {
  TORCH_CHECK_VALUE(!t.has_value() || t->device() == x.device(), "causal_conv1d: ", name, " is on ",
                    t->device(), ", hidden_states on ", x.device());
}

void check(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
           const OptTensor& cu_seqlens) {
  check_float_dtype(x, "causal_conv1d");
  TORCH_CHECK_VALUE(x.dim() == 3,
                    "causal_conv1d: hidden_states must be [batch, channels, seq], got shape ",
                    py_shape(x.sym_sizes()));
  c10::SymInt channels = x.sym_size(1);
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(0) == channels,
                    "causal_conv1d: weight must be [channels, width] = [", channels,
                    ", width], got ", py_shape(weight.sym_sizes()));
  TORCH_CHECK_VALUE(weight.sym_size(1) >= 2 && weight.sym_size(1) <= 4,
                    "causal_conv1d: kernel width ", weight.sym_size(1),
                    "; the cuda kernel takes widths 2 to 4 (use 'torch' or 'eager')");
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
                   "causal_conv1d: weight dtype ", py_dtype(weight.scalar_type()),
                   " with input dtype ", py_dtype(x.scalar_type()),
                   " (the cuda kernel takes a weight in the input's dtype or float32); use "
                   "'torch' or 'eager'");
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == channels,
                      "causal_conv1d: bias must be [", channels, "], got ",
                      py_shape(bias->sym_sizes()));
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type() || bias->scalar_type() == at::kFloat,
                     "causal_conv1d: bias dtype ", py_dtype(bias->scalar_type()),
                     " with input dtype ", py_dtype(x.scalar_type()),
                     " (the cuda kernel takes the input's dtype or float32)");
  }
  check_same_device("weight", weight, x);
  check_same_device("bias", bias, x);
  check_same_device("cu_seqlens", cu_seqlens, x);
  if (cu_seqlens.has_value()) {
    const at::Tensor& cu = *cu_seqlens;
    TORCH_CHECK_VALUE(
        cu.dim() == 1 && (cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong) &&
            cu.sym_numel() >= 2,
        "causal_conv1d: cu_seqlens must be a 1-D int32 or int64 tensor [num_sequences + 1] (at "
        "least 2 entries), got a ",
        cu.dim(), "-D ", py_dtype(cu.scalar_type()), " tensor of ", cu.sym_numel(), " entries");
    TORCH_CHECK_VALUE(x.sym_size(0) == 1,
                      "causal_conv1d: cu_seqlens (packed sequences) needs batch size 1, got ",
                      x.sym_size(0));
  }
}

void check_state(const at::Tensor& x, const at::Tensor& state, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(
      state.dim() == 3 && state.sym_size(0) == x.sym_size(0) && state.sym_size(1) == x.sym_size(1),
      "causal_conv1d: conv_state must be [batch, channels, S] = [", x.sym_size(0), ", ",
      x.sym_size(1), ", S], got ", py_shape(state.sym_sizes()));
  TORCH_CHECK_VALUE(state.sym_size(2) >= weight.sym_size(1) - 1, "causal_conv1d: conv_state holds ",
                    state.sym_size(2), " columns, the kernel width ", weight.sym_size(1),
                    " needs at least ", weight.sym_size(1) - 1);
  TORCH_CHECK_VALUE(state.scalar_type() == x.scalar_type() && state.device() == x.device(),
                    "causal_conv1d: conv_state (", py_dtype(state.scalar_type()), " on ",
                    state.device(), ") must have the input's dtype and device (",
                    py_dtype(x.scalar_type()), " on ", x.device(), ")");
}

void check_grad(const at::Tensor& grad, const at::Tensor& x) {
  TORCH_CHECK_VALUE(grad.sym_sizes() == x.sym_sizes() && grad.device() == x.device(),
                    "causal_conv1d backward: gradient ", py_shape(grad.sym_sizes()), " on ",
                    grad.device(), " for an input ", py_shape(x.sym_sizes()), " on ", x.device());
}

// An uninitialised [B, C, T] tensor in x's dtype with x's layout: channels-last (the transpose of a
// contiguous [B, T, C]) when x's channel stride is smaller than its time stride, else contiguous.
at::Tensor new_like(const at::Tensor& x) {
  auto s = x.sym_sizes();
  if (x.sym_stride(1) < x.sym_stride(2)) {
    return at::empty_symint({s[0], s[2], s[1]}, x.options()).transpose(1, 2);
  }
  return at::empty_symint(s, x.options());
}

// The C ABI's arguments for the parameters: contiguous weight and bias, their dtype codes (bias's
// code is weight's without a bias).
struct Params {
  at::Tensor weight, bias;
  int weight_code, bias_code;
};

Params params(const at::Tensor& weight, const OptTensor& bias) {
  Params p{weight.contiguous(), bias.has_value() ? bias->contiguous() : at::Tensor(), 0, 0};
  p.weight_code = dtype_code(p.weight, "causal_conv1d");
  p.bias_code = dtype_code(p.bias.defined() ? p.bias : p.weight, "causal_conv1d");
  return p;
}

// cu_seqlens contiguous, 1 if int64 else 0, the number of segments (an undefined tensor, 0, 0).
struct Segments {
  at::Tensor cu;
  int is_int64;
  int64_t count;
};

Segments segments(const OptTensor& cu_seqlens) {
  if (!cu_seqlens.has_value()) return {at::Tensor(), 0, 0};
  at::Tensor cu = cu_seqlens->contiguous();
  return {cu, cu.scalar_type() == at::kLong ? 1 : 0, cu.numel() - 1};
}

at::Tensor fwd_meta(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                    const OptTensor& cu_seqlens, bool silu) {
  check(x, weight, bias, cu_seqlens);
  return new_like(x);
}

at::Tensor fwd_cuda(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                    const OptTensor& cu_seqlens, bool silu) {
  at::Tensor out = fwd_meta(x, weight, bias, cu_seqlens, silu);
  if (out.numel() == 0) return out;
  const KernelTable& k = prepare_cuda(x);
  c10::DeviceGuard guard(x.device());
  Params p = params(weight, bias);
  Segments s = segments(cu_seqlens);
  OPSLOT_LAUNCH(k, opslot_causal_conv1d_fwd, dtype_code(x, "causal_conv1d"), x.size(0), x.size(1),
                x.size(2), static_cast<int>(p.weight.size(1)), ptr(x), x.strides().data(),
                p.weight_code, ptr(p.weight), p.bias_code, ptr(p.bias), ptr(s.cu), s.is_int64,
                s.count, silu ? 1 : 0, mutable_ptr(out), out.strides().data(), stream_of(x));
  return out;
}

// (dx, dweight, dbias): dx in x's layout, dweight contiguous in weight's dtype, dbias [C] in bias's
// dtype (weight's without a bias: then it is unused).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_meta(const at::Tensor& grad, const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const OptTensor& bias,
                                                        const OptTensor& cu_seqlens, bool silu) {
  check(x, weight, bias, cu_seqlens);
  check_grad(grad, x);
  return {new_like(x), at::empty_symint(weight.sym_sizes(), weight.options()),
          at::empty_symint({weight.sym_size(0)}, bias.value_or(weight).options())};
}

// g (x's shape and dtype, any strides) copied into x's layout by the library's tiled pass,
// coalesced on both sides (torch's copy_ of a transposed view is not).
at::Tensor relayout(const KernelTable& k, const at::Tensor& g, const at::Tensor& x) {
  at::Tensor out = new_like(x);
  OPSLOT_LAUNCH(k, opslot_causal_conv1d_relayout, dtype_code(x, "causal_conv1d"), x.size(0),
                x.size(1), x.size(2), ptr(g), g.strides().data(), mutable_ptr(out),
                out.strides().data(), stream_of(x));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const OptTensor& bias,
                                                        const OptTensor& cu_seqlens, bool silu) {
  auto [dx, dw, db] = bwd_meta(grad, x, weight, bias, cu_seqlens, silu);
  if (x.numel() == 0) {
    dw.zero_();
    db.zero_();
    return {dx, dw, db};
  }
  const KernelTable& k = prepare_cuda(x);
  c10::DeviceGuard guard(x.device());
  at::Tensor g = grad.to(x.scalar_type());
  Params p = params(weight, bias);
  Segments s = segments(cu_seqlens);
  int code = dtype_code(x, "causal_conv1d");
  int width = static_cast<int>(p.weight.size(1));
  // e.g. contiguous or expanded: into x's layout (keeps the vector path)
  if (g.strides() != dx.strides()) g = relayout(k, g, x);
  int64_t floats = OPSLOT_ENTRY(k, opslot_causal_conv1d_bwd_scratch_floats)(
      code, x.size(0), x.size(1), x.size(2), width);
  TORCH_CHECK(floats >= 0, "opslot cuda kernel causal_conv1d backward: ", k.opslot_last_error());
  at::Tensor scratch = at::empty({std::max<int64_t>(floats, 1)}, x.options().dtype(at::kFloat));
  OPSLOT_LAUNCH(k, opslot_causal_conv1d_bwd, code, x.size(0), x.size(1), x.size(2), width, ptr(x),
                x.strides().data(), ptr(g), g.strides().data(), p.weight_code, ptr(p.weight),
                p.bias_code, ptr(p.bias), ptr(s.cu), s.is_int64, s.count, silu ? 1 : 0,
                mutable_ptr(dx), dx.strides().data(), mutable_ptr(dw), mutable_ptr(db),
                static_cast<float*>(mutable_ptr(scratch)), scratch.numel(), stream_of(x));
  return {dx, dw, db};
}

at::Tensor update_meta(const at::Tensor& x, at::Tensor& conv_state, const at::Tensor& weight,
                       const OptTensor& bias, bool silu) {
  check(x, weight, bias, std::nullopt);
  check_state(x, conv_state, weight);
  return new_like(x);
}

// Decode: the conv over cat(conv_state, x), its last T positions; conv_state <- the last S columns
// of cat(conv_state, x), in place.
at::Tensor update_cuda(const at::Tensor& x, at::Tensor& conv_state, const at::Tensor& weight,
                       const OptTensor& bias, bool silu) {
  at::Tensor out = update_meta(x, conv_state, weight, bias, silu);
  if (out.numel() == 0) return out;
  const KernelTable& k = prepare_cuda(x);
  c10::DeviceGuard guard(x.device());
  Params p = params(weight, bias);
  OPSLOT_LAUNCH(k, opslot_causal_conv1d_update, dtype_code(x, "causal_conv1d"), x.size(0),
                x.size(1), x.size(2), static_cast<int>(p.weight.size(1)), ptr(x),
                x.strides().data(), mutable_ptr(conv_state), conv_state.size(2),
                conv_state.strides().data(), p.weight_code, ptr(p.weight), p.bias_code, ptr(p.bias),
                silu ? 1 : 0, mutable_ptr(out), out.strides().data(), stream_of(x));
  return out;
}

class CausalConv1dFunction : public torch::autograd::Function<CausalConv1dFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const OptTensor& bias,
                            const OptTensor& cu_seqlens, bool silu) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::causal_conv1d_fwd", "")
                               .typed<decltype(fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward(
        {x, weight, bias.value_or(at::Tensor()), cu_seqlens.value_or(at::Tensor())});
    ctx->saved_data["silu"] = silu;
    return op.call(x, weight, bias, cu_seqlens, silu);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::causal_conv1d_bwd", "")
                               .typed<decltype(bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    OptTensor bias = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    OptTensor cu = saved[3].defined() ? OptTensor(saved[3]) : std::nullopt;
    auto [dx, dw, db] =
        op.call(grads[0], saved[0], saved[1], bias, cu, ctx->saved_data["silu"].toBool());
    return {dx, dw, bias.has_value() ? db : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor fwd_autograd(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                        const OptTensor& cu_seqlens, bool silu) {
  return CausalConv1dFunction::apply(x, weight, bias, cu_seqlens, silu);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? cu_seqlens, bool silu) -> "
      "Tensor");
  m.def(
      "causal_conv1d_bwd(Tensor grad, Tensor x, Tensor weight, Tensor? bias, Tensor? cu_seqlens, "
      "bool silu) -> (Tensor, Tensor, Tensor)");
  m.def(
      "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, bool "
      "silu) -> Tensor");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("causal_conv1d_fwd", &fwd_cuda);
  m.impl("causal_conv1d_bwd", &bwd_cuda);
  m.impl("causal_conv1d_update", &update_cuda);
}

// The CUDA kernels: their checks, then the wrong-device refusal (prepare_cuda).
TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  m.impl("causal_conv1d_fwd", &fwd_cuda);
  m.impl("causal_conv1d_bwd", &bwd_cuda);
  m.impl("causal_conv1d_update", &update_cuda);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("causal_conv1d_fwd", &fwd_meta);
  m.impl("causal_conv1d_bwd", &bwd_meta);
  m.impl("causal_conv1d_update", &update_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("causal_conv1d_fwd", &fwd_autograd); }

TORCH_LIBRARY_IMPL(opslot, ADInplaceOrView, m) {
  register_inplace_version_bump(m, "causal_conv1d_update");
}

}  // namespace opslot_torch
