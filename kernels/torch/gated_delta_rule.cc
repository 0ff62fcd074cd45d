// torch ops opslot::gdr_fwd / opslot::gdr_bwd over the C ABI of gated_delta_rule.h: the chunked
// gated delta rule (Qwen3.5's Gated DeltaNet), dense batches and packed sequences (cu_seqlens).
// gdr_fwd returns the output, the final states and what gdr_bwd reads (the state entering each
// 64-token chunk, the chunk's corrected values and keys, the in-chunk decay); q, k, v, g, beta are
// read through their (batch, token, head) strides. The forward's CUDA kernel is also its CPU kernel
// (its checks come before the wrong-device refusal, as in the Python op). An Autograd kernel on
// gdr_fwd calls gdr_bwd.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Six = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

constexpr int64_t kChunk = 64;
constexpr int64_t kMaxHeadDim = 128;

// Sequences: the batch, or the packed segments.
c10::SymInt num_seqs(const at::Tensor& q, const OptTensor& cu_seqlens) {
  return cu_seqlens.has_value() ? cu_seqlens->sym_size(0) - 1 : q.sym_size(0);
}

// opslot_gdr_max_chunks: chunks of a dense batch, or an upper bound for packed sequences.
c10::SymInt max_chunks(const at::Tensor& q, const OptTensor& cu_seqlens) {
  c10::SymInt per = (q.sym_size(1) + (kChunk - 1)) / kChunk;
  return cu_seqlens.has_value() ? per + num_seqs(q, cu_seqlens) : q.sym_size(0) * per;
}

using Named = std::initializer_list<std::pair<const at::Tensor*, const char*>>;

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
           const at::Tensor& beta, const OptTensor& initial_state, const OptTensor& cu_seqlens) {
  for (auto [t, what] : Named{{&q, "query"}, {&k, "key"}, {&v, "value"}}) {
    check_float_dtype(*t, c10::str("chunk_gated_delta_rule: ", what).c_str());
    TORCH_CHECK_VALUE(t->dim() == 4, "chunk_gated_delta_rule: ", what,
                      " must be [batch, seq, heads, dim], got ", py_shape(t->sym_sizes()));
  }
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   "chunk_gated_delta_rule: query, key and value must share a dtype, got ",
                   py_dtype(q.scalar_type()), ", ", py_dtype(k.scalar_type()), ", ",
                   py_dtype(v.scalar_type()));
  auto s = q.sym_sizes();  // B, T, H, Dk
  TORCH_CHECK_VALUE(k.sym_sizes() == s && v.sym_sizes().slice(0, 3) == s.slice(0, 3),
                    "chunk_gated_delta_rule: query ", py_shape(s), ", key ",
                    py_shape(k.sym_sizes()), " and value ", py_shape(v.sym_sizes()),
                    " must agree in batch, sequence and heads (repeat query/key heads to the value "
                    "heads first)");
  c10::SymInt dk = s[3], dv = v.sym_size(3);
  TORCH_CHECK_VALUE(dk >= 1 && dk <= kMaxHeadDim && dv >= 1 && dv <= kMaxHeadDim,
                    "chunk_gated_delta_rule: the cuda kernel takes head dims 1..", kMaxHeadDim,
                    ", got key ", dk, " and value ", dv);
  for (auto [t, what] : Named{{&g, "g"}, {&beta, "beta"}}) {
    check_float_dtype(*t, c10::str("chunk_gated_delta_rule: ", what).c_str());
    TORCH_CHECK_VALUE(t->sym_sizes() == s.slice(0, 3), "chunk_gated_delta_rule: ", what,
                      " must be [batch, seq, heads] = ", py_shape(s.slice(0, 3)), ", got ",
                      py_shape(t->sym_sizes()));
  }
  if (cu_seqlens.has_value()) {
    const at::Tensor& cu = *cu_seqlens;
    TORCH_CHECK_VALUE(
        cu.dim() == 1 && cu.sym_size(0) >= 1 &&
            (cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong),
        "chunk_gated_delta_rule: cu_seqlens must be a 1-D int32/int64 tensor [num_seqs + 1], got ",
        py_dtype(cu.scalar_type()), " ", py_shape(cu.sym_sizes()));
    TORCH_CHECK_VALUE(s[0] == 1,
                      "chunk_gated_delta_rule: packed sequences (cu_seqlens) need batch 1, got ",
                      s[0]);
  }
  if (initial_state.has_value()) {
    std::vector<c10::SymInt> want = {num_seqs(q, cu_seqlens), s[2], dk, dv};
    TORCH_CHECK_VALUE(initial_state->sym_sizes() == c10::SymIntArrayRef(want),
                      "chunk_gated_delta_rule: initial_state must be ", py_shape(want),
                      " (one per sequence), got ", py_shape(initial_state->sym_sizes()));
  }
  check_one_device("chunk_gated_delta_rule", {{"query", q},
                                              {"key", k},
                                              {"value", v},
                                              {"g", g},
                                              {"beta", beta},
                                              {"initial_state", initial_state},
                                              {"cu_seqlens", cu_seqlens}});
}

// `t` with a contiguous last dimension (itself when it has one).
at::Tensor inner(const at::Tensor& t) {
  return (t.stride(-1) == 1 || t.size(-1) == 1) ? t : t.contiguous();
}

struct Inputs {
  at::Tensor q, k, v, g, beta, cu32;
};

Inputs inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
              const at::Tensor& beta, const OptTensor& cu_seqlens) {
  return {
      inner(q),    inner(k),
      inner(v),    inner(g),
      inner(beta), cu_seqlens.has_value() ? cu_seqlens->to(at::kInt).contiguous() : at::Tensor()};
}

opslot_gdr_problem problem(const Inputs& in, bool use_l2norm, double scale) {
  opslot_gdr_problem p{};
  p.dtype = dtype_code(in.q, "chunk_gated_delta_rule");
  p.g_dtype = dtype_code(in.g, "chunk_gated_delta_rule");
  p.beta_dtype = dtype_code(in.beta, "chunk_gated_delta_rule");
  p.use_l2norm = use_l2norm ? 1 : 0;
  p.scale = static_cast<float>(scale);
  p.batch = in.q.size(0);
  p.seqlen = in.q.size(1);
  p.heads = in.q.size(2);
  p.dk = in.q.size(3);
  p.dv = in.v.size(3);
  OptTensor cu = in.cu32.defined() ? OptTensor(in.cu32) : std::nullopt;
  p.nseq = num_seqs(in.q, cu).expect_int();
  p.cu_seqlens = static_cast<const int32_t*>(ptr(in.cu32));
  p.max_chunks = max_chunks(in.q, cu).expect_int();
  std::pair<const at::Tensor*, int64_t*> fields[] = {{&in.q, p.q_stride},
                                                     {&in.k, p.k_stride},
                                                     {&in.v, p.v_stride},
                                                     {&in.g, p.g_stride},
                                                     {&in.beta, p.beta_stride}};
  for (auto [t, stride] : fields) std::copy_n(t->strides().begin(), 3, stride);
  p.q = in.q.const_data_ptr();
  p.k = in.k.const_data_ptr();
  p.v = in.v.const_data_ptr();
  p.g = in.g.const_data_ptr();
  p.beta = in.beta.const_data_ptr();
  return p;
}

// The kernels' scratch memory. With head dims below 128 the kernels read zero padding past Dv that
// only part of the scratch gets written with: then it starts zeroed.
at::Tensor workspace(const KernelTable& k, const opslot_gdr_problem& p, int backward,
                     const at::Tensor& like) {
  int64_t bytes = OPSLOT_ENTRY(k, opslot_gdr_workspace_bytes)(&p, backward);
  TORCH_CHECK(bytes >= 0, "chunk_gated_delta_rule: ", k.opslot_last_error());
  auto options = like.options().dtype(at::kByte);
  bool full = p.dk == kMaxHeadDim && p.dv == kMaxHeadDim;
  return full ? at::empty({bytes}, options) : at::zeros({bytes}, options);
}

// (out [B, T, H, Dv] in q's dtype, final states fp32 [nseq, H, Dk, Dv], h, v_new, w, gamma); h,
// v_new, w, gamma are zeroed unless the problem fills whole tiles (dense, head dims 128), so that
// every element of the op's outputs is defined.
Six fwd_outputs(const at::Tensor& q, const at::Tensor& v, const OptTensor& cu_seqlens, bool zero) {
  auto s = q.sym_sizes();
  c10::SymInt mc = max_chunks(q, cu_seqlens), dv = v.sym_size(3);
  auto f32 = q.options().dtype(at::kFloat);
  auto alloc = [&](c10::SymIntArrayRef sizes, at::TensorOptions options) {
    return zero ? at::zeros_symint(sizes, options) : at::empty_symint(sizes, options);
  };
  return {at::empty_symint({s[0], s[1], s[2], dv}, q.options()),
          at::empty_symint({num_seqs(q, cu_seqlens), s[2], s[3], dv}, f32),
          alloc({mc, s[2], kMaxHeadDim, kMaxHeadDim}, q.options()),
          alloc({mc, s[2], kChunk, kMaxHeadDim}, q.options()),
          alloc({mc, s[2], kChunk, kMaxHeadDim}, q.options()),
          alloc({mc, s[2], kChunk}, f32)};
}

Six fwd_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
             const at::Tensor& beta, const OptTensor& initial_state, const OptTensor& cu_seqlens,
             bool use_l2norm, double scale) {
  check(q, k, v, g, beta, initial_state, cu_seqlens);
  return fwd_outputs(q, v, cu_seqlens, false);
}

Six fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
             const at::Tensor& beta, const OptTensor& initial_state, const OptTensor& cu_seqlens,
             bool use_l2norm, double scale) {
  check(q, k, v, g, beta, initial_state, cu_seqlens);
  const KernelTable& kt = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  Inputs in = inputs(q, k, v, g, beta, cu_seqlens);
  opslot_gdr_problem p = problem(in, use_l2norm, scale);
  bool full = !cu_seqlens.has_value() && p.dk == kMaxHeadDim && p.dv == kMaxHeadDim;
  auto [out, final_state, hs, vnew, w, gamma] = fwd_outputs(in.q, in.v, cu_seqlens, !full);
  at::Tensor s0 =
      initial_state.has_value() ? initial_state->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor ws = workspace(kt, p, 0, q);
  OPSLOT_LAUNCH(kt, opslot_gdr_fwd, &p, static_cast<const float*>(ptr(s0)), mutable_ptr(out),
                static_cast<float*>(mutable_ptr(final_state)), mutable_ptr(hs), mutable_ptr(vnew),
                mutable_ptr(w), static_cast<float*>(mutable_ptr(gamma)), mutable_ptr(ws),
                stream_of(q));
  return {out, final_state, hs, vnew, w, gamma};
}

// The backward's: the forward's inputs; dout [B, T, H, Dv], dfinal [nseq, H, Dk, Dv] and what the
// forward saved (h, v_new, w in q's dtype, gamma float32), each of the forward's output shape.
void check_bwd(const at::Tensor& dout, const OptTensor& dfinal, const at::Tensor& q,
               const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
               const at::Tensor& beta, const at::Tensor& hs, const at::Tensor& vnew,
               const at::Tensor& w, const at::Tensor& gamma, const OptTensor& cu_seqlens) {
  check(q, k, v, g, beta, std::nullopt, cu_seqlens);
  const char* op = "gdr_bwd";
  auto s = q.sym_sizes();
  c10::SymInt mc = max_chunks(q, cu_seqlens), dv = v.sym_size(3);
  check_shape(op, "dout", dout, {s[0], s[1], s[2], dv});
  if (dfinal.has_value()) {
    check_shape(op, "dfinal", *dfinal, {num_seqs(q, cu_seqlens), s[2], s[3], dv});
  }
  check_shape(op, "h", hs, {mc, s[2], kMaxHeadDim, kMaxHeadDim});
  check_shape(op, "v_new", vnew, {mc, s[2], kChunk, kMaxHeadDim});
  check_shape(op, "w", w, {mc, s[2], kChunk, kMaxHeadDim});
  check_shape(op, "gamma", gamma, {mc, s[2], kChunk});
  for (auto [t, what] : Named{{&hs, "h"}, {&vnew, "v_new"}, {&w, "w"}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == q.scalar_type(), op, ": ", what, " must be ",
                     py_dtype(q.scalar_type()), " (the query's dtype), got ",
                     py_dtype(t->scalar_type()));
  }
  TORCH_CHECK_TYPE(gamma.scalar_type() == at::kFloat, op, ": gamma must be torch.float32, got ",
                   py_dtype(gamma.scalar_type()));
  check_one_device(op, {{"query", q},
                        {"dout", dout},
                        {"dfinal", dfinal},
                        {"h", hs},
                        {"v_new", vnew},
                        {"w", w},
                        {"gamma", gamma}});
}

// (dq, dk, dv, dg, dbeta, d initial state fp32): contiguous, in q's, g's and beta's dtypes.
Six bwd_meta(const at::Tensor& dout, const OptTensor& dfinal, const at::Tensor& q,
             const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
             const at::Tensor& hs, const at::Tensor& vnew, const at::Tensor& w,
             const at::Tensor& gamma, const OptTensor& cu_seqlens, bool use_l2norm, double scale) {
  check_bwd(dout, dfinal, q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens);
  auto s = q.sym_sizes();
  c10::SymInt dv = v.sym_size(3);
  return {
      at::empty_symint(s, q.options()),
      at::empty_symint(s, q.options()),
      at::empty_symint({s[0], s[1], s[2], dv}, q.options()),
      at::empty_symint(s.slice(0, 3), g.options()),
      at::empty_symint(s.slice(0, 3), beta.options()),
      at::empty_symint({num_seqs(q, cu_seqlens), s[2], s[3], dv}, q.options().dtype(at::kFloat))};
}

Six bwd_cuda(const at::Tensor& dout, const OptTensor& dfinal, const at::Tensor& q,
             const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
             const at::Tensor& hs, const at::Tensor& vnew, const at::Tensor& w,
             const at::Tensor& gamma, const OptTensor& cu_seqlens, bool use_l2norm, double scale) {
  auto [dq, dk, dv, dg, dbeta, dinit] =  // the checks, the outputs
      bwd_meta(dout, dfinal, q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens, use_l2norm, scale);
  const KernelTable& kt = prepare_cuda(q);
  c10::DeviceGuard guard(q.device());
  Inputs in = inputs(q, k, v, g, beta, cu_seqlens);
  opslot_gdr_problem p = problem(in, use_l2norm, scale);
  at::Tensor saved_h = hs.contiguous(), saved_vnew = vnew.contiguous(), saved_w = w.contiguous();
  at::Tensor saved_gamma = gamma.contiguous();
  at::Tensor d = dout.to(q.scalar_type()).contiguous();
  at::Tensor df = dfinal.has_value() ? dfinal->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor ws = workspace(kt, p, 1, q);
  OPSLOT_LAUNCH(kt, opslot_gdr_bwd, &p, ptr(d), static_cast<const float*>(ptr(df)), ptr(saved_h),
                ptr(saved_vnew), ptr(saved_w), static_cast<const float*>(ptr(saved_gamma)),
                mutable_ptr(dq), mutable_ptr(dk), mutable_ptr(dv), mutable_ptr(dg),
                mutable_ptr(dbeta), static_cast<float*>(mutable_ptr(dinit)), mutable_ptr(ws),
                stream_of(q));
  return {dq, dk, dv, dg, dbeta, dinit};
}

// out, final = the rule; h, v_new, w, gamma are saved for the backward and never differentiated.
class GatedDeltaRuleFunction : public torch::autograd::Function<GatedDeltaRuleFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
      const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
      const OptTensor& initial_state, const OptTensor& cu_seqlens, bool use_l2norm, double scale) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::gdr_fwd", "")
                               .typed<decltype(fwd_cuda)>();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, final_state, hs, vnew, w, gamma] =
        op.call(q, k, v, g, beta, initial_state, cu_seqlens, use_l2norm, scale);
    ctx->save_for_backward(
        {q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens.value_or(at::Tensor())});
    ctx->saved_data["use_l2norm"] = use_l2norm;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["has_initial"] = initial_state.has_value();
    ctx->mark_non_differentiable({hs, vnew, w, gamma});
    return {out, final_state, hs, vnew, w, gamma};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opslot::gdr_bwd", "")
                               .typed<decltype(bwd_cuda)>();
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &v = s[2];
    OptTensor cu = s[9].defined() ? OptTensor(s[9]) : std::nullopt;
    at::Tensor dout = grads[0];
    if (!dout.defined()) {
      dout = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    }
    OptTensor dfinal = grads[1].defined() ? OptTensor(grads[1]) : std::nullopt;
    auto [dq, dk, dv, dg, dbeta, dinit] =
        op.call(dout, dfinal, q, s[1], v, s[3], s[4], s[5], s[6], s[7], s[8], cu,
                ctx->saved_data["use_l2norm"].toBool(), ctx->saved_data["scale"].toDouble());
    bool has_initial = ctx->saved_data["has_initial"].toBool();
    return {dq,           dk,           dv,          dg, dbeta, has_initial ? dinit : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Six fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                 const at::Tensor& beta, const OptTensor& initial_state,
                 const OptTensor& cu_seqlens, bool use_l2norm, double scale) {
  auto o =
      GatedDeltaRuleFunction::apply(q, k, v, g, beta, initial_state, cu_seqlens, use_l2norm, scale);
  return {o[0], o[1], o[2], o[3], o[4], o[5]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "gdr_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor? initial_state, Tensor? "
      "cu_seqlens, bool use_l2norm, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
      "Tensor)");
  m.def(
      "gdr_bwd(Tensor dout, Tensor? dfinal, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
      "Tensor hs, Tensor vnew, Tensor w, Tensor gamma, Tensor? cu_seqlens, bool use_l2norm, float "
      "scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  m.impl("gdr_fwd", &fwd_cuda);
  m.impl("gdr_bwd", &bwd_cuda);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  m.impl("gdr_fwd", &fwd_cuda);  // its checks, then the wrong-device refusal (prepare_cuda)
  register_cpu_refusal(m, "gdr_bwd");
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("gdr_fwd", &fwd_meta);
  m.impl("gdr_bwd", &bwd_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) { m.impl("gdr_fwd", &fwd_autograd); }

}  // namespace opslot_torch
