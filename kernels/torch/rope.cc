// torch ops over the C ABI of rope.h: rotary position embedding of q and k in one launch each way,
// read and written through their strides (HF passes transposed views):
// - opslot::rope_fwd / rope_bwd (opslot_rope): HF's rotate_half, full or partial;
// - opslot::rope_interleaved_fwd / _bwd (opslot_rope_interleaved): DeepSeek-V3's interleaved pairs,
//   rotated into the de-interleaved order;
// - opslot::rope_vision_fwd / _bwd (opslot_rope_vision): the vision towers' rotation in fp32,
//   rounded as upstream's eager code (q and k may differ in dtype: then one launch each);
// - opslot::rope_deepseek_v4_fwd / _bwd (opslot_rope_deepseek_v4): DeepSeek-V4's rotation of one
//   tensor's trailing slice, pairs turned in place, with upstream's rounding.
// CUDA, Meta and CPU-refusal kernels, and an Autograd kernel on each forward; cos/sin get no
// gradient (refused when they require one).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <vector>

#include "op_util.h"

namespace opslot_torch {
namespace {

// cos/sin of one shape, in x's dtype or float32 (what the kernels read); `x_name` names x in the
// message.
void check_cos_sin(const at::Tensor& x, const char* x_name, const at::Tensor& cos,
                   const at::Tensor& sin, const char* op) {
  TORCH_CHECK_TYPE(cos.scalar_type() == sin.scalar_type() &&
                       (cos.scalar_type() == x.scalar_type() || cos.scalar_type() == at::kFloat),
                   op, ": cos/sin of dtype ", cos.scalar_type(), "/", sin.scalar_type(), " with ",
                   x_name, " of dtype ", x.scalar_type(), " (the cuda kernel takes cos/sin in ",
                   x_name, "'s dtype or float32)");
  TORCH_CHECK_VALUE(cos.sym_sizes() == sin.sym_sizes(), op, ": cos and sin differ in shape");
  check_one_device(op, {{x_name, x}, {"cos", cos}, {"sin", sin}});
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  check_float(q, "rotary_pos_emb");
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), "rotary_pos_emb: q is ", q.scalar_type(),
                   " but k is ", k.scalar_type());
  check_cos_sin(q, "q", cos, sin, "rotary_pos_emb");
  auto rd = cos.sym_size(-1);
  TORCH_CHECK_VALUE(rd % 2 == 0 && rd <= q.sym_size(-1) && q.sym_size(-1) == k.sym_size(-1),
                    "rotary_pos_emb: rotary dim ", rd, " must be even and at most the head dim (q ",
                    q.sym_size(-1), ", k ", k.sym_size(-1), ")");
  check_one_device("rotary_pos_emb", {{"q", q}, {"k", k}});
}

// The three outer (size, stride) pairs of a tensor of 1 to 4 dims, left-padded with size 1; a
// dimension of size 1 gets stride 0 (it is never stepped; keeps the vector path aligned).
struct Outer {
  std::array<int64_t, 3> sizes;
  std::array<int64_t, 3> strides;
};

Outer outer(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
            const char* what, const char* op = "rotary_pos_emb") {
  int64_t dims = static_cast<int64_t>(shape.size());
  TORCH_CHECK_VALUE(dims >= 1 && dims <= 4, op, ": ", what, " has ", dims,
                    " dimensions; the cuda kernel takes 1 to 4");
  Outer o{};
  int64_t pad = 4 - dims;
  for (int64_t i = 0; i < 3; ++i) {
    bool padded = i < pad;
    o.sizes[i] = padded ? 1 : shape[i - pad];
    o.strides[i] = (padded || o.sizes[i] == 1) ? 0 : strides[i - pad];
  }
  return o;
}

Outer outer(const at::Tensor& t, const char* what, const char* op) {
  return outer(t.sizes().vec(), t.strides().vec(), what, op);
}

// Strides of cs.unsqueeze(unsqueeze_dim) broadcast over the outer sizes `lead` (no tensor made).
std::array<int64_t, 3> cs_outer(const at::Tensor& cs, int64_t unsqueeze_dim,
                                const std::array<int64_t, 3>& lead,
                                const char* op = "rotary_pos_emb") {
  std::vector<int64_t> shape = cs.sizes().vec(), strides = cs.strides().vec();
  int64_t dims = static_cast<int64_t>(shape.size());
  int64_t pos = unsqueeze_dim >= 0 ? unsqueeze_dim : unsqueeze_dim + dims + 1;
  TORCH_CHECK_INDEX(pos >= 0 && pos <= dims, op, ": unsqueeze_dim ", unsqueeze_dim,
                    " out of range for cos of ", dims, " dims");
  shape.insert(shape.begin() + pos, 1);
  strides.insert(strides.begin() + pos, 0);
  Outer o = outer(shape, strides, "cos/sin (unsqueezed)", op);
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(o.sizes[i] == 1 || o.sizes[i] == lead[i], op, ": cos/sin of shape ",
                      cs.sizes(), " (unsqueeze_dim ", unsqueeze_dim,
                      ") do not broadcast to q/k of outer shape (", lead[0], ", ", lead[1], ", ",
                      lead[2], ")");
  }
  return o.strides;
}

// The kernel's meta entry of one tensor (15 int64 at `meta`): the outer sizes and the
// in/out/cos/sin strides of its three outer dims, largest input stride first.
void layout_one(const at::Tensor& in, const at::Tensor& out, const at::Tensor& cos,
                const at::Tensor& sin, int64_t unsqueeze_dim, const char* op, int64_t* meta) {
  Outer t = outer(in, "q/k", op);
  std::array<int64_t, 3> os = outer(out, "output", op).strides;
  std::array<int64_t, 3> cs = cs_outer(cos, unsqueeze_dim, t.sizes, op);
  std::array<int64_t, 3> ss = cs_outer(sin, unsqueeze_dim, t.sizes, op);
  std::array<int, 3> perm = {0, 1, 2};
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int a, int b) { return t.strides[a] > t.strides[b]; });
  size_t n = 0;
  for (const auto* src : {&t.sizes, &t.strides, &os, &cs, &ss}) {
    for (int i : perm) meta[n++] = (*src)[i];
  }
}

// The meta array of q, then k.
std::array<int64_t, 30> layout(const at::Tensor& q, const at::Tensor& qo, const at::Tensor& k,
                               const at::Tensor& ko, const at::Tensor& cos, const at::Tensor& sin,
                               int64_t unsqueeze_dim, const char* op = "rotary_pos_emb") {
  std::array<int64_t, 30> meta{};
  layout_one(q, qo, cos, sin, unsqueeze_dim, op, meta.data());
  layout_one(k, ko, cos, sin, unsqueeze_dim, op, meta.data() + 15);
  return meta;
}

void launch(bool backward, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& q_out,
            const at::Tensor& k_out, const at::Tensor& cos_in, const at::Tensor& sin_in,
            int64_t unsqueeze_dim) {
  c10::DeviceGuard guard(q_in.device());
  const KernelTable& k = prepare(q_in);
  at::Tensor cos = last_contiguous(cos_in), sin = last_contiguous(sin_in);
  std::array<int64_t, 30> meta = layout(q_in, q_out, k_in, k_out, cos, sin, unsqueeze_dim);
  OPSLOT_LAUNCH(k, opslot_rope, backward ? 1 : 0, dtype_code(q_in, "rotary_pos_emb"),
                dtype_code(cos, "rotary_pos_emb"), q_in.size(-1), cos.size(-1), ptr(cos), ptr(sin),
                ptr(q_in), mutable_ptr(q_out), ptr(k_in), mutable_ptr(k_out), meta.data(),
                stream_of(q_in));
}

using Pair = std::tuple<at::Tensor, at::Tensor>;

Pair rope_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
               const at::Tensor& sin, int64_t unsqueeze_dim) {
  check(q, k, cos, sin);
  return {at::empty_like(last_contiguous(q)), at::empty_like(last_contiguous(k))};
}

Pair rope_cuda(bool backward, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
               const at::Tensor& sin, int64_t unsqueeze_dim) {
  check(q, k, cos, sin);
  at::Tensor qi = last_contiguous(q), ki = last_contiguous(k);
  at::Tensor qo = at::empty_like(qi), ko = at::empty_like(ki);
  launch(backward, qi, ki, qo, ko, cos, sin, unsqueeze_dim);
  return {qo, ko};
}

Pair fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
              const at::Tensor& sin, int64_t unsqueeze_dim) {
  return rope_cuda(false, q, k, cos, sin, unsqueeze_dim);
}

Pair bwd_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& cos,
              const at::Tensor& sin, int64_t unsqueeze_dim) {
  return rope_cuda(true, grad_q, grad_k, cos, sin, unsqueeze_dim);
}

// The autograd of a q/k rotation op pair (forward op `Fwd`, backward op `Bwd`, both taking
// (q, k, cos, sin, unsqueeze_dim)): cos/sin are saved, a missing gradient of one output is zeros,
// and cos/sin get no gradient.
constexpr char kRopeFwd[] = "opslot::rope_fwd";
constexpr char kRopeBwd[] = "opslot::rope_bwd";
constexpr char kInterleavedFwd[] = "opslot::rope_interleaved_fwd";
constexpr char kInterleavedBwd[] = "opslot::rope_interleaved_bwd";

template <typename Self, const char* Fwd, const char* Bwd>
class RotationFunction : public torch::autograd::Function<Self> {
 public:
  using OpType = Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      int64_t);

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                int64_t unsqueeze_dim) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Fwd, "").template typed<OpType>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [qe, ke] = op.call(q, k, cos, sin, unsqueeze_dim);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(q.scalar_type());
    ctx->saved_data["unsqueeze_dim"] = unsqueeze_dim;
    ctx->saved_data["q_shape"] = q.sizes().vec();
    ctx->saved_data["k_shape"] = k.sizes().vec();
    return {qe, ke};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Bwd, "").template typed<OpType>();
    auto saved = ctx->get_saved_variables();
    auto options =
        saved[0].options().dtype(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));
    at::Tensor gq = grads[0], gk = grads[1];
    if (!gq.defined()) gq = at::zeros(ctx->saved_data["q_shape"].toIntVector(), options);
    if (!gk.defined()) gk = at::zeros(ctx->saved_data["k_shape"].toIntVector(), options);
    auto [dq, dk] = op.call(gq, gk, saved[0], saved[1], ctx->saved_data["unsqueeze_dim"].toInt());
    return {dq, dk, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class RopeFunction : public RotationFunction<RopeFunction, kRopeFwd, kRopeBwd> {};
class RopeInterleavedFunction
    : public RotationFunction<RopeInterleavedFunction, kInterleavedFwd, kInterleavedBwd> {};

Pair fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t unsqueeze_dim) {
  TORCH_CHECK_VALUE(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())),
                    "rotary_pos_emb (cuda): cos/sin require grad, but this kernel computes no "
                    "gradient for them; compute cos/sin under torch.no_grad() (as HF does) or use "
                    "'torch'/'eager'");
  auto out = RopeFunction::apply(q, k, cos, sin, unsqueeze_dim);
  return {out[0], out[1]};
}

// -- rotary_pos_emb/interleaved (DeepSeek-V3)
// ------------------------------------------------------
constexpr const char* kInterleaved = "rotary_pos_emb/interleaved";

void check_interleaved(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin) {
  check_float(q, kInterleaved);
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), kInterleaved, ": q is ", q.scalar_type(),
                   " but k is ", k.scalar_type());
  check_cos_sin(q, "q", cos, sin, kInterleaved);
  auto d = q.sym_size(-1);
  TORCH_CHECK_VALUE(d % 2 == 0 && k.sym_size(-1) == d && cos.sym_size(-1) == d, kInterleaved,
                    ": q and k rotate all their features in pairs: their head dims (q ", d, ", k ",
                    k.sym_size(-1), ") must be even and equal to cos/sin's last dim ",
                    cos.sym_size(-1));
  check_one_device(kInterleaved, {{"q", q}, {"k", k}});
}

Pair interleaved_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                      const at::Tensor& sin, int64_t unsqueeze_dim) {
  check_interleaved(q, k, cos, sin);
  return {at::empty_like(last_contiguous(q)), at::empty_like(last_contiguous(k))};
}

Pair interleaved_cuda(bool backward, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& cos_in, const at::Tensor& sin_in, int64_t unsqueeze_dim) {
  check_interleaved(q, k, cos_in, sin_in);
  at::Tensor qi = last_contiguous(q), ki = last_contiguous(k);
  at::Tensor qo = at::empty_like(qi), ko = at::empty_like(ki);
  c10::DeviceGuard guard(qi.device());
  const KernelTable& t = prepare(qi);
  at::Tensor cos = last_contiguous(cos_in), sin = last_contiguous(sin_in);
  std::array<int64_t, 30> meta = layout(qi, qo, ki, ko, cos, sin, unsqueeze_dim, kInterleaved);
  OPSLOT_LAUNCH(t, opslot_rope_interleaved, backward ? 1 : 0, dtype_code(qi, kInterleaved),
                dtype_code(cos, kInterleaved), qi.size(-1), ptr(cos), ptr(sin), ptr(qi),
                mutable_ptr(qo), ptr(ki), mutable_ptr(ko), meta.data(), stream_of(qi));
  return {qo, ko};
}

Pair interleaved_fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t unsqueeze_dim) {
  return interleaved_cuda(false, q, k, cos, sin, unsqueeze_dim);
}

Pair interleaved_bwd_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t unsqueeze_dim) {
  return interleaved_cuda(true, grad_q, grad_k, cos, sin, unsqueeze_dim);
}

Pair interleaved_fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t unsqueeze_dim) {
  TORCH_CHECK_VALUE(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())),
                    "rotary_pos_emb/interleaved (cuda): cos/sin require grad, but this kernel "
                    "computes no gradient for them; compute cos/sin under torch.no_grad() (as HF "
                    "does) or use 'torch'/'eager'");
  auto out = RopeInterleavedFunction::apply(q, k, cos, sin, unsqueeze_dim);
  return {out[0], out[1]};
}

// -- rotary_pos_emb_vision/standard (Qwen2-VL .. Qwen3-VL-MoE vision towers) ----------------------
constexpr const char* kVision = "rotary_pos_emb_vision";
// Upstream's `cos.unsqueeze(-2)`: cos/sin [seq, dim] against q/k [seq, heads, dim].
constexpr int64_t kVisionUnsqueeze = -2;

void check_vision(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                  const at::Tensor& sin) {
  check_float(q, kVision);
  check_float(k, kVision);
  check_float(cos, kVision);
  TORCH_CHECK_TYPE(sin.scalar_type() == cos.scalar_type(), kVision, ": cos is ", cos.scalar_type(),
                   " but sin is ", sin.scalar_type());
  TORCH_CHECK_VALUE(cos.sym_sizes() == sin.sym_sizes(), kVision, ": cos and sin differ in shape");
  auto d = q.sym_size(-1);
  TORCH_CHECK_VALUE(d % 2 == 0 && k.sym_size(-1) == d && cos.sym_size(-1) == d, kVision,
                    ": q and k rotate their whole head dim: their head dims (q ", d, ", k ",
                    k.sym_size(-1), ") must be even and equal to cos/sin's last dim ",
                    cos.sym_size(-1));
  check_one_device(kVision, {{"q", q}, {"k", k}, {"cos", cos}, {"sin", sin}});
}

Pair vision_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                 const at::Tensor& sin) {
  check_vision(q, k, cos, sin);
  return {at::empty_like(last_contiguous(q)), at::empty_like(last_contiguous(k))};
}

Pair vision_cuda(bool backward, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos_in,
                 const at::Tensor& sin_in) {
  check_vision(q, k, cos_in, sin_in);
  at::Tensor qi = last_contiguous(q), ki = last_contiguous(k);
  at::Tensor qo = at::empty_like(qi), ko = at::empty_like(ki);
  c10::DeviceGuard guard(qi.device());
  const KernelTable& t = prepare(qi);
  // The kernel reads cos/sin in q's dtype or float32; any other dtype is widened to float32 here,
  // exactly (upstream computes with `cos.float()`).
  at::Tensor cos = cos_in, sin = sin_in;
  const at::ScalarType cs = cos.scalar_type();
  if (cs != at::kFloat && (cs != qi.scalar_type() || cs != ki.scalar_type())) {
    cos = cos.to(at::kFloat);
    sin = sin.to(at::kFloat);
  }
  cos = last_contiguous(cos);
  sin = last_contiguous(sin);
  const int cs_code = dtype_code(cos, kVision);
  if (qi.scalar_type() == ki.scalar_type()) {
    std::array<int64_t, 30> meta = layout(qi, qo, ki, ko, cos, sin, kVisionUnsqueeze, kVision);
    OPSLOT_LAUNCH(t, opslot_rope_vision, backward ? 1 : 0, dtype_code(qi, kVision), cs_code,
                  qi.size(-1), ptr(cos), ptr(sin), ptr(qi), mutable_ptr(qo), ptr(ki),
                  mutable_ptr(ko), meta.data(), stream_of(qi));
    return {qo, ko};
  }
  // q and k of different dtypes (upstream casts each back to its own): one launch each.
  for (const auto& [in, out] : {std::pair<const at::Tensor&, const at::Tensor&>{qi, qo},
                                std::pair<const at::Tensor&, const at::Tensor&>{ki, ko}}) {
    std::array<int64_t, 30> meta{};
    layout_one(in, out, cos, sin, kVisionUnsqueeze, kVision, meta.data());
    OPSLOT_LAUNCH(t, opslot_rope_vision, backward ? 1 : 0, dtype_code(in, kVision), cs_code,
                  in.size(-1), ptr(cos), ptr(sin), ptr(in), mutable_ptr(out), nullptr, nullptr,
                  meta.data(), stream_of(qi));
  }
  return {qo, ko};
}

Pair vision_fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                     const at::Tensor& sin) {
  return vision_cuda(false, q, k, cos, sin);
}

Pair vision_bwd_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& cos,
                     const at::Tensor& sin) {
  return vision_cuda(true, grad_q, grad_k, cos, sin);
}

class RopeVisionFunction : public torch::autograd::Function<RopeVisionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::rope_vision_fwd", "")
                               .typed<decltype(vision_fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [qe, ke] = op.call(q, k, cos, sin);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["q_dtype"] = static_cast<int64_t>(q.scalar_type());
    ctx->saved_data["k_dtype"] = static_cast<int64_t>(k.scalar_type());
    ctx->saved_data["q_shape"] = q.sizes().vec();
    ctx->saved_data["k_shape"] = k.sizes().vec();
    return {qe, ke};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::rope_vision_bwd", "")
                               .typed<decltype(vision_bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    auto options = [&](const char* key) {
      return saved[0].options().dtype(static_cast<at::ScalarType>(ctx->saved_data[key].toInt()));
    };
    at::Tensor gq = grads[0], gk = grads[1];
    if (!gq.defined()) gq = at::zeros(ctx->saved_data["q_shape"].toIntVector(), options("q_dtype"));
    if (!gk.defined()) gk = at::zeros(ctx->saved_data["k_shape"].toIntVector(), options("k_dtype"));
    auto [dq, dk] = op.call(gq, gk, saved[0], saved[1]);
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};

Pair vision_fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                         const at::Tensor& sin) {
  TORCH_CHECK_VALUE(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())),
                    "rotary_pos_emb_vision (cuda): cos/sin require grad, but this kernel computes "
                    "no gradient for them; compute cos/sin under torch.no_grad() (as HF does) or "
                    "use 'torch'/'eager'");
  auto out = RopeVisionFunction::apply(q, k, cos, sin);
  return {out[0], out[1]};
}

// -- rotary_pos_emb/deepseek_v4 (DeepSeek-V4's apply_rotary_pos_emb: one tensor)
// -------------------
constexpr const char* kV4 = "rotary_pos_emb/deepseek_v4";

void check_v4(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_float(x, kV4);
  check_cos_sin(x, "x", cos, sin, kV4);
  auto pairs = cos.sym_size(-1);
  TORCH_CHECK_VALUE(pairs >= 1 && 2 * pairs <= x.sym_size(-1), kV4, ": cos/sin hold one feature ",
                    "per rotated pair (", pairs, "): twice that must be at least 2 and at most ",
                    "x's last dim ", x.sym_size(-1));
}

at::Tensor v4_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   int64_t unsqueeze_dim) {
  check_v4(x, cos, sin);
  return at::empty_like(last_contiguous(x));
}

at::Tensor v4_cuda(bool backward, const at::Tensor& x, const at::Tensor& cos_in,
                   const at::Tensor& sin_in, int64_t unsqueeze_dim) {
  check_v4(x, cos_in, sin_in);
  at::Tensor xi = last_contiguous(x);
  at::Tensor xo = at::empty_like(xi);  // x's layout: a transposed view stays one
  c10::DeviceGuard guard(xi.device());
  const KernelTable& t = prepare(xi);
  at::Tensor cos = last_contiguous(cos_in), sin = last_contiguous(sin_in);
  std::array<int64_t, 30> meta{};  // one tensor: the second entry is not read
  layout_one(xi, xo, cos, sin, unsqueeze_dim, kV4, meta.data());
  OPSLOT_LAUNCH(t, opslot_rope_deepseek_v4, backward ? 1 : 0, dtype_code(xi, kV4),
                dtype_code(cos, kV4), xi.size(-1), 2 * cos.size(-1), ptr(cos), ptr(sin), ptr(xi),
                mutable_ptr(xo), meta.data(), stream_of(xi));
  return xo;
}

at::Tensor v4_fwd_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t unsqueeze_dim) {
  return v4_cuda(false, x, cos, sin, unsqueeze_dim);
}

at::Tensor v4_bwd_cuda(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t unsqueeze_dim) {
  return v4_cuda(true, grad, cos, sin, unsqueeze_dim);
}

class RopeV4Function : public torch::autograd::Function<RopeV4Function> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& cos,
                                                const at::Tensor& sin, int64_t unsqueeze_dim) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::rope_deepseek_v4_fwd", "")
                               .typed<decltype(v4_fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor out = op.call(x, cos, sin, unsqueeze_dim);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["unsqueeze_dim"] = unsqueeze_dim;
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::rope_deepseek_v4_bwd", "")
                               .typed<decltype(v4_bwd_cuda)>();
    auto saved = ctx->get_saved_variables();
    at::Tensor dx = op.call(grads[0], saved[0], saved[1], ctx->saved_data["unsqueeze_dim"].toInt());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor v4_fwd_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t unsqueeze_dim) {
  TORCH_CHECK_VALUE(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())),
                    "rotary_pos_emb/deepseek_v4 (cuda): cos/sin require grad, but this kernel "
                    "computes no gradient for them; compute cos/sin under torch.no_grad() (as HF "
                    "does) or use 'torch'/'eager'");
  return RopeV4Function::apply(x, cos, sin, unsqueeze_dim)[0];
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "rope_fwd(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim) -> (Tensor, "
      "Tensor)");
  m.def(
      "rope_bwd(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int unsqueeze_dim) -> "
      "(Tensor, Tensor)");
  m.def(
      "rope_interleaved_fwd(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim) -> "
      "(Tensor, Tensor)");
  m.def(
      "rope_interleaved_bwd(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int "
      "unsqueeze_dim) -> (Tensor, Tensor)");
  m.def("rope_vision_fwd(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("rope_deepseek_v4_fwd(Tensor x, Tensor cos, Tensor sin, int unsqueeze_dim) -> Tensor");
  m.def("rope_deepseek_v4_bwd(Tensor grad, Tensor cos, Tensor sin, int unsqueeze_dim) -> Tensor");
  m.def(
      "rope_vision_bwd(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin) -> (Tensor, "
      "Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("rope_fwd", &fwd_cuda);
  m.impl("rope_bwd", &bwd_cuda);
  m.impl("rope_interleaved_fwd", &interleaved_fwd_cuda);
  m.impl("rope_interleaved_bwd", &interleaved_bwd_cuda);
  m.impl("rope_vision_fwd", &vision_fwd_cuda);
  m.impl("rope_vision_bwd", &vision_bwd_cuda);
  m.impl("rope_deepseek_v4_fwd", &v4_fwd_cuda);
  m.impl("rope_deepseek_v4_bwd", &v4_bwd_cuda);
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("rope_fwd", &rope_meta);
  m.impl("rope_bwd", &rope_meta);
  m.impl("rope_interleaved_fwd", &interleaved_meta);
  m.impl("rope_interleaved_bwd", &interleaved_meta);
  m.impl("rope_vision_fwd", &vision_meta);
  m.impl("rope_vision_bwd", &vision_meta);
  m.impl("rope_deepseek_v4_fwd", &v4_meta);
  m.impl("rope_deepseek_v4_bwd", &v4_meta);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  register_cpu_refusal(m, "rope_fwd");
  register_cpu_refusal(m, "rope_bwd");
  register_cpu_refusal(m, "rope_interleaved_fwd");
  register_cpu_refusal(m, "rope_interleaved_bwd");
  register_cpu_refusal(m, "rope_vision_fwd");
  register_cpu_refusal(m, "rope_vision_bwd");
  register_cpu_refusal(m, "rope_deepseek_v4_fwd");
  register_cpu_refusal(m, "rope_deepseek_v4_bwd");
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) {
  m.impl("rope_fwd", &fwd_autograd);
  m.impl("rope_interleaved_fwd", &interleaved_fwd_autograd);
  m.impl("rope_vision_fwd", &vision_fwd_autograd);
  m.impl("rope_deepseek_v4_fwd", &v4_fwd_autograd);
}

}  // namespace opslot_torch
