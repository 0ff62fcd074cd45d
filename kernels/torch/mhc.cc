// torch ops of DeepSeek-V4's hyper-connections over the C ABI of mhc.h (runtime/opslot/kernels/
// cuda/mhc.py, docs/kernels.md "## mhc"):
//   opslot::mhc_pre_fwd / mhc_pre_bwd    DeepseekV4HyperConnection: (post, comb, collapsed)
//   opslot::mhc_head_fwd / mhc_head_bwd  DeepseekV4HyperHead: the final collapse
//   opslot::mhc_post / mhc_post_bwd      the decoder layer's post * block_output + comb^T @ streams
// Schemas, CUDA, Meta and Autograd kernels as the other ops. The fp32 GEMMs against fn stay cuBLAS
// (through at::mm): for bf16 streams, which bf16 holds exactly, fn and the backward's coefficients
// are split into three bf16 terms (opslot_mhc_split3) and one bf16 GEMM with an fp32 output stands
// for the fp32 one (to within 2^-24 of fn). The CPU kernels run the same composition with each
// launch done in ATen, the per-token math being the kernels' own (kernels/src/mhc_math.h): the CPU
// tests check the composition, the autograd wiring and that math without a GPU.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

#include "../src/mhc_math.h"
#include "op_util.h"

namespace opslot_torch {
namespace {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using variable_list = torch::autograd::variable_list;
using Ctx = torch::autograd::AutogradContext;
using Five = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using Four = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using Three = std::tuple<Tensor, Tensor, Tensor>;

const char* op_name(bool head) { return head ? "mhc/head" : "mhc/pre"; }
int64_t mixes_of(int64_t hc, bool head) { return head ? hc : (2 + hc) * hc; }

// The argument checks of mhc/pre (head: mhc/head): streams [B, S, hc, D], fn [M, hc * D],
// base [M], scale [3] (head: [1]). Messages name the op and what to do.
void check_streams(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                   bool head) {
  const char* what = op_name(head);
  check_float_dtype(x, what);
  TORCH_CHECK_VALUE(x.dim() == 4, what,
                    ": the streams must be [batch, seq, hc_mult, hidden], got shape ",
                    py_shape(x.sym_sizes()));
  const c10::SymInt& hc = x.sym_size(2);
  TORCH_CHECK_VALUE(hc >= 1 && hc <= opslot::mhc::kMaxHc, what, ": hc_mult ", hc,
                    " is not supported by the cuda kernels (1 to ", opslot::mhc::kMaxHc,
                    "); use mhc_implementation 'torch' or 'eager'");
  TORCH_CHECK_VALUE(x.sym_size(3) >= 1, what, ": the streams' hidden size is 0, got shape ",
                    py_shape(x.sym_sizes()));
  const c10::SymInt mixes = head ? hc : (2 + hc) * hc;
  const char* fn_name = head ? "hc_fn" : "fn";
  TORCH_CHECK_VALUE(
      fn.dim() == 2 && fn.sym_size(0) == mixes && fn.sym_size(1) == hc * x.sym_size(3), what, ": ",
      fn_name, " must be [", mixes, ", ", hc * x.sym_size(3), "] for streams of shape ",
      py_shape(x.sym_sizes()), ", got ", py_shape(fn.sym_sizes()));
  TORCH_CHECK_VALUE(base.dim() == 1 && base.sym_size(0) == mixes, what, ": ",
                    head ? "hc_base" : "base", " must be [", mixes, "], got ",
                    py_shape(base.sym_sizes()));
  const int64_t scales = head ? 1 : 3;
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.sym_size(0) == scales, what, ": ",
                    head ? "hc_scale" : "scale", " must be [", scales, "], got ",
                    py_shape(scale.sym_sizes()));
  check_float_dtype(fn, what);
  check_float_dtype(base, what);
  check_float_dtype(scale, what);
  check_one_device(what, {{"x", x},
                          {fn_name, fn},
                          {head ? "hc_base" : "base", base},
                          {head ? "hc_scale" : "scale", scale}});
}

// hc_sinkhorn_iters as the CUDA kernels take it (0 to 2^20; the backward keeps every step: at most
// 1600), checked on every device so that the CPU kernels refuse what the GPU's refuse.
void check_iters(int64_t iters, bool backward) {
  const int64_t most = backward ? 1600 : int64_t{1} << 20;
  TORCH_CHECK_VALUE(iters >= 0 && iters <= most, "mhc/pre: hc_sinkhorn_iters ", iters,
                    " is not supported by the cuda kernels (0 to ", most,
                    backward ? "; the backward keeps every step" : "",
                    "); use mhc_implementation 'torch' or 'eager'");
}

// The backward's arguments: the forward's, its saved statistics and the incoming gradients (each
// present one of its output's shape).
void check_bwd(const OptTensor& g_post, const OptTensor& g_comb, const OptTensor& g_out,
               const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
               const Tensor& mix, const Tensor& rstd, int64_t iters, bool head) {
  check_streams(x, fn, base, scale, head);
  if (!head) check_iters(iters, true);
  const char* what = op_name(head);
  const c10::SymInt &b = x.sym_size(0), &t = x.sym_size(1), &hc = x.sym_size(2);
  check_shape(what, "mix", mix, {b * t, head ? hc : (2 + hc) * hc});
  check_shape(what, "rstd", rstd, {b * t});
  if (g_post) check_shape(what, "grad_post", *g_post, {b, t, hc});
  if (g_comb) check_shape(what, "grad_comb", *g_comb, {b, t, hc, hc});
  if (g_out) check_shape(what, head ? "grad" : "grad_collapsed", *g_out, {b, t, x.sym_size(3)});
  check_one_device(what, {{"x", x},
                          {"mix", mix},
                          {"rstd", rstd},
                          {"grad_post", g_post},
                          {"grad_comb", g_comb},
                          {head ? "grad" : "grad_collapsed", g_out}});
}

void check_post(const Tensor& post, const Tensor& comb, const Tensor& bo, const Tensor& h) {
  const char* what = "mhc/post";
  check_float_dtype(h, what);
  TORCH_CHECK_VALUE(h.dim() == 4, what,
                    ": hidden_states must be [batch, seq, hc_mult, hidden], got shape ",
                    py_shape(h.sym_sizes()));
  const c10::SymInt& hc = h.sym_size(2);
  TORCH_CHECK_VALUE(hc >= 1 && hc <= opslot::mhc::kMaxHc, what, ": hc_mult ", hc,
                    " is not supported by the cuda kernels (1 to ", opslot::mhc::kMaxHc,
                    "); use mhc_implementation 'torch' or 'eager'");
  TORCH_CHECK_VALUE(bo.dim() == 3 && bo.sym_size(0) == h.sym_size(0) &&
                        bo.sym_size(1) == h.sym_size(1) && bo.sym_size(2) == h.sym_size(3),
                    what, ": block_output must be [batch, seq, hidden] = ",
                    py_shape({h.sym_size(0), h.sym_size(1), h.sym_size(3)}), ", got ",
                    py_shape(bo.sym_sizes()));
  TORCH_CHECK_TYPE(bo.scalar_type() == h.scalar_type(), what, ": block_output is ",
                   py_dtype(bo.scalar_type()), " and hidden_states ", py_dtype(h.scalar_type()),
                   " (the cuda kernel takes one dtype); use mhc_implementation 'torch' or 'eager'");
  TORCH_CHECK_VALUE(
      post.dim() == 3 && post.sym_size(0) == h.sym_size(0) && post.sym_size(1) == h.sym_size(1) &&
          post.sym_size(2) == hc,
      what, ": post must be [batch, seq, hc_mult] = ", py_shape({h.sym_size(0), h.sym_size(1), hc}),
      ", got ", py_shape(post.sym_sizes()));
  TORCH_CHECK_VALUE(
      comb.dim() == 4 && comb.sym_size(0) == h.sym_size(0) && comb.sym_size(1) == h.sym_size(1) &&
          comb.sym_size(2) == hc && comb.sym_size(3) == hc,
      what, ": comb must be [batch, seq, hc_mult, hc_mult] = ",
      py_shape({h.sym_size(0), h.sym_size(1), hc, hc}), ", got ", py_shape(comb.sym_sizes()));
  check_float_dtype(post, what);
  check_float_dtype(comb, what);
  check_one_device(what,
                   {{"hidden_states", h}, {"block_output", bo}, {"post", post}, {"comb", comb}});
}

// Contiguous and 16-byte aligned (the kernels read 16-byte vectors), copying only if needed.
Tensor aligned(const Tensor& t) {
  Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 ? c.clone() : c;
}

Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
const float* fptr(const Tensor& t) { return static_cast<const float*>(ptr(t)); }
float* fmut(const Tensor& t) { return static_cast<float*>(mutable_ptr(t)); }

// Calls f(std::integral_constant<int, HC>{}) for hc in 1..kMaxHc (checked before).
template <typename F>
void with_hc(int64_t hc, F&& f) {
  switch (hc) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// -- launches: the C entry point on CUDA tensors, its contract in ATen (and mhc_math.h) on CPU ----
// out [3, n] bf16: w = out[0] + out[1] + out[2].
Tensor split3(const Tensor& w) {
  if (w.is_cuda()) {
    const KernelTable& k = prepare(w);
    Tensor out = at::empty({3, w.numel()}, w.options().dtype(at::kBFloat16));
    OPSLOT_LAUNCH(k, opslot_mhc_split3, fptr(w), w.numel(), mutable_ptr(out), stream_of(w));
    return out;
  }
  Tensor flat = w.reshape({-1});
  Tensor hi = flat.to(at::kBFloat16);
  Tensor r1 = flat - hi.to(at::kFloat);
  Tensor mid = r1.to(at::kBFloat16);
  Tensor lo = (r1 - mid.to(at::kFloat)).to(at::kBFloat16);
  return at::stack({hi, mid, lo});
}

// a @ b with an fp32 result (bf16 operands: cuBLAS with an fp32 output on CUDA; the exact products
// in fp32 elsewhere).
Tensor mm_f32(const Tensor& a, const Tensor& b) {
  if (a.is_cuda() && a.scalar_type() != at::kFloat) return at::mm(a, b, at::kFloat);
  return at::mm(a.to(at::kFloat), b.to(at::kFloat));
}

struct Dims {
  int64_t tokens, hc, hidden, mixes;
};

Dims dims_of(const Tensor& x, bool head) {
  const int64_t hc = x.size(2);
  return {x.size(0) * x.size(1), hc, x.size(3), mixes_of(hc, head)};
}

// p [T, nsplit * M]: the GEMM's partial products.
void collapse_fwd(const Dims& d, const Tensor& x, const Tensor& p, int64_t nsplit,
                  const Tensor& scale, const Tensor& base, double norm_eps, double hc_eps,
                  const Tensor& out, const Tensor& mix, const Tensor& rstd) {
  if (x.is_cuda()) {
    const KernelTable& k = prepare(x);
    OPSLOT_LAUNCH(k, opslot_mhc_collapse_fwd, dtype_code(x, "mhc"), d.tokens, d.hc, d.hidden,
                  d.mixes, ptr(x), fptr(p), nsplit, p.size(1), fptr(scale), fptr(base),
                  static_cast<float>(norm_eps), static_cast<float>(hc_eps), mutable_ptr(out),
                  fmut(mix), fmut(rstd), stream_of(x));
    return;
  }
  Tensor xf = x.reshape({d.tokens, d.hc, d.hidden}).to(at::kFloat);
  Tensor r = at::rsqrt(xf.square().sum({1, 2}) / static_cast<float>(d.hc * d.hidden) +
                       static_cast<float>(norm_eps));
  Tensor acc = p.narrow(1, 0, d.mixes);
  for (int64_t s = 1; s < nsplit; ++s) acc = acc + p.narrow(1, s * d.mixes, d.mixes);
  Tensor m = r.unsqueeze(1) * acc;
  Tensor pre = at::sigmoid(m.narrow(1, 0, d.hc) * scale[0] + base.narrow(0, 0, d.hc)) +
               static_cast<float>(hc_eps);
  out.copy_((pre.unsqueeze(-1) * xf).sum(1).view(out.sizes()));
  mix.copy_(m);
  rstd.copy_(r);
}

void comb_fwd(const Dims& d, int64_t iters, const Tensor& mix, const Tensor& scale,
              const Tensor& base, double hc_eps, const Tensor& post, const Tensor& comb) {
  if (mix.is_cuda()) {
    const KernelTable& k = prepare(mix);
    OPSLOT_LAUNCH(k, opslot_mhc_comb_fwd, d.tokens, d.hc, iters, fptr(mix), fptr(scale), fptr(base),
                  static_cast<float>(hc_eps), fmut(post), fmut(comb), stream_of(mix));
    return;
  }
  with_hc(d.hc, [&](auto tag) {
    constexpr int HC = decltype(tag)::value;
    const float* m = fptr(mix);
    for (int64_t t = 0; t < d.tokens; ++t)
      opslot::mhc::comb_forward<HC>(m + t * d.mixes, fptr(base), fptr(scale),
                                    static_cast<int>(iters), static_cast<float>(hc_eps),
                                    fmut(post) + t * HC, fmut(comb) + t * HC * HC, nullptr, 0);
  });
}

// d base and d scale: the per-token da [T, M] and dsc [T, G] summed over the tokens.
std::pair<Tensor, Tensor> token_sums(const Dims& d, const Tensor& da, const Tensor& dsc) {
  if (da.is_cuda()) {
    Tensor sa = at::empty({da.size(1)}, da.options()), sb = at::empty({dsc.size(1)}, dsc.options());
    const KernelTable& k = prepare(da);
    OPSLOT_LAUNCH(k, opslot_mhc_token_sums, d.tokens, fptr(da), da.size(1), fptr(dsc), dsc.size(1),
                  fmut(sa), fmut(sb), stream_of(da));
    return {sa, sb};
  }
  return {da.sum(0), dsc.sum(0)};
}

void comb_bwd(const Dims& d, int64_t iters, const Tensor& mix, const Tensor& scale,
              const Tensor& base, double hc_eps, const OptTensor& g_post, const OptTensor& g_comb,
              const Tensor& da) {
  if (mix.is_cuda()) {
    const KernelTable& k = prepare(mix);
    OPSLOT_LAUNCH(k, opslot_mhc_comb_bwd, d.tokens, d.hc, iters, fptr(mix), fptr(scale), fptr(base),
                  static_cast<float>(hc_eps), g_post ? fptr(*g_post) : nullptr,
                  g_comb ? fptr(*g_comb) : nullptr, fmut(da), stream_of(mix));
    return;
  }
  with_hc(d.hc, [&](auto tag) {
    constexpr int HC = decltype(tag)::value;
    std::vector<float> hist(
        static_cast<size_t>(opslot::mhc::sinkhorn_steps(static_cast<int>(iters))) * HC * HC);
    std::vector<float> row(d.mixes);
    for (int64_t t = 0; t < d.tokens; ++t) {
      opslot::mhc::comb_backward<HC>(
          fptr(mix) + t * d.mixes, fptr(base), fptr(scale), static_cast<int>(iters),
          static_cast<float>(hc_eps), g_post ? fptr(*g_post) + t * HC : nullptr,
          g_comb ? fptr(*g_comb) + t * HC * HC : nullptr, row.data(), hist.data(), 1);
      for (int64_t m = HC; m < d.mixes; ++m) fmut(da)[t * d.mixes + m] = row[m];
    }
  });
}

// da [T, M] (in: the post/comb part; out: the pre part), pre [T, hc], dsc [T, G], coef_a [T, M],
// coef_a3 [T, ld] bf16 (ld >= 3M; may be undefined), coef_c [T].
void collapse_bwd(const Dims& d, const Tensor& x, const OptTensor& g, const Tensor& mix,
                  const Tensor& rstd, const Tensor& scale, const Tensor& base, double hc_eps,
                  const Tensor& da, const Tensor& pre, const Tensor& dsc, const Tensor& coef_a,
                  const Tensor& coef_a3, const Tensor& coef_c) {
  if (x.is_cuda()) {
    const KernelTable& k = prepare(x);
    OPSLOT_LAUNCH(k, opslot_mhc_collapse_bwd, dtype_code(x, "mhc"), d.tokens, d.hc, d.hidden,
                  d.mixes, ptr(x), g ? ptr(*g) : nullptr, fptr(mix), fptr(rstd), fptr(scale),
                  fptr(base), static_cast<float>(hc_eps), fmut(da), fmut(pre), fmut(dsc),
                  fmut(coef_a), coef_a3.defined() ? mutable_ptr(coef_a3) : nullptr,
                  coef_a3.defined() ? coef_a3.size(1) : 0, fmut(coef_c), stream_of(x));
    return;
  }
  Tensor xf = x.reshape({d.tokens, d.hc, d.hidden}).to(at::kFloat);
  Tensor g_pre = g ? (g->reshape({d.tokens, 1, d.hidden}).to(at::kFloat) * xf).sum(-1).contiguous()
                   : at::zeros({d.tokens, d.hc}, xf.options());
  const float k_inv = 1.f / static_cast<float>(d.hc * d.hidden);
  const int64_t groups = dsc.size(1);
  with_hc(d.hc, [&](auto tag) {
    constexpr int HC = decltype(tag)::value;
    for (int64_t t = 0; t < d.tokens; ++t) {
      float sums[3];
      opslot::mhc::token_backward<HC>(fptr(g_pre) + t * HC, fptr(mix) + t * d.mixes, fptr(base),
                                      fptr(scale), static_cast<int>(d.mixes), fptr(rstd)[t], k_inv,
                                      static_cast<float>(hc_eps), fmut(da) + t * d.mixes,
                                      fmut(pre) + t * HC, sums, fmut(coef_a) + t * d.mixes,
                                      fmut(coef_c) + t);
      for (int64_t i = 0; i < groups; ++i) fmut(dsc)[t * groups + i] = sums[i];
    }
  });
  if (coef_a3.defined()) {
    coef_a3.zero_();
    coef_a3.narrow(1, 0, 3 * d.mixes)
        .copy_(split3(coef_a)
                   .view({3, d.tokens, d.mixes})
                   .permute({1, 0, 2})
                   .reshape({d.tokens, 3 * d.mixes}));
  }
}

void dx_launch(const Dims& d, const Tensor& x, const OptTensor& g, const Tensor& fn,
               const Tensor& coef_a, const Tensor& coef_c, const Tensor& pre, const Tensor& dx) {
  if (x.is_cuda()) {
    const KernelTable& k = prepare(x);
    OPSLOT_LAUNCH(k, opslot_mhc_dx, dtype_code(x, "mhc"), d.tokens, d.hc, d.hidden, d.mixes, ptr(x),
                  g ? ptr(*g) : nullptr, fptr(fn), fptr(coef_a), fptr(coef_c), fptr(pre),
                  mutable_ptr(dx), stream_of(x));
    return;
  }
  Tensor xf = x.reshape({d.tokens, d.hc, d.hidden}).to(at::kFloat);
  Tensor r = at::mm(coef_a, fn).view({d.tokens, d.hc, d.hidden}) - coef_c.view({-1, 1, 1}) * xf;
  if (g) r = pre.unsqueeze(-1) * g->reshape({d.tokens, 1, d.hidden}).to(at::kFloat) + r;
  dx.copy_(r.view(dx.sizes()));
}

// dx and d fn in one pass (opslot_mhc_dx_dfn) where the kernel library says it fits: CUDA, bf16
// streams in whole 64-column tiles, aligned rows.
bool dx_dfn_fits(const Dims& d, const Tensor& x, const OptTensor& g, const Tensor& dx) {
  if (!x.is_cuda()) return false;
  const KernelTable& k = prepare(x);
  return OPSLOT_ENTRY(k, opslot_mhc_dx_dfn_fits)(dtype_code(x, "mhc"), d.hc, d.hidden, d.mixes,
                                                 ptr(x), g ? ptr(*g) : nullptr, ptr(dx)) == 1;
}

// dfn [M, K] fp32; coef_a3 [T, 16 ceil(3M / 16)] bf16.
Tensor dx_dfn_launch(const Dims& d, const Tensor& x, const OptTensor& g, const Tensor& fn,
                     const Tensor& coef_a3, const Tensor& coef_c, const Tensor& pre,
                     const Tensor& dx) {
  const KernelTable& k = prepare(x);
  const int64_t floats =
      OPSLOT_ENTRY(k, opslot_mhc_dx_dfn_scratch_floats)(d.tokens, d.hc, d.hidden, d.mixes);
  TORCH_CHECK(floats >= 0, "opslot cuda kernel mhc: ", k.opslot_last_error());
  auto f = x.options().dtype(at::kFloat);
  Tensor dfn = at::empty({d.mixes, d.hc * d.hidden}, f);
  Tensor scratch = floats > 0 ? at::empty({floats}, f) : Tensor();
  OPSLOT_LAUNCH(k, opslot_mhc_dx_dfn, d.tokens, d.hc, d.hidden, d.mixes, ptr(x),
                g ? ptr(*g) : nullptr, fptr(fn), ptr(coef_a3), fptr(coef_c), fptr(pre),
                mutable_ptr(dx), fmut(dfn), scratch.defined() ? fmut(scratch) : nullptr,
                stream_of(x));
  return dfn;
}

// -- mhc/pre and mhc/head forward -----------------------------------------------------------------
// (out, mix, rstd) and, for pre, (post, comb).
struct FwdOut {
  Tensor post, comb, out, mix, rstd;
};

FwdOut fwd_meta_impl(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                     bool head) {
  check_streams(x, fn, base, scale, head);
  auto f = x.options().dtype(at::kFloat);
  const c10::SymInt tokens = x.sym_size(0) * x.sym_size(1);
  const c10::SymInt& hc = x.sym_size(2);
  FwdOut o;
  o.out = at::empty_symint({x.sym_size(0), x.sym_size(1), x.sym_size(3)}, x.options());
  o.mix = at::empty_symint({tokens, head ? hc : (2 + hc) * hc}, f);
  o.rstd = at::empty_symint({tokens}, f);
  if (!head) {
    o.post = at::empty_symint({x.sym_size(0), x.sym_size(1), hc}, f);
    o.comb = at::empty_symint({x.sym_size(0), x.sym_size(1), hc, hc}, f);
  }
  return o;
}

FwdOut fwd_impl(const Tensor& x_in, const Tensor& fn_in, const Tensor& base_in,
                const Tensor& scale_in, int64_t iters, double hc_eps, double norm_eps, bool head) {
  FwdOut o = fwd_meta_impl(x_in, fn_in, base_in, scale_in, head);
  c10::DeviceGuard guard(x_in.device());
  const Dims d = dims_of(x_in, head);
  if (d.tokens == 0) return o;
  Tensor x = aligned(x_in), fn = f32(fn_in), base = f32(base_in), scale = f32(scale_in);
  Tensor x2d = x.view({d.tokens, d.hc * d.hidden});
  Tensor p;
  int64_t nsplit = 1;
  if (x.scalar_type() == at::kBFloat16) {  // bf16 holds x exactly: x @ (hi + mid + lo)^T
    Tensor w = split3(fn).view({3 * d.mixes, d.hc * d.hidden});
    // at least 16 rows (zeros past the terms; collapse_fwd reads p with its pitch): with head's 12,
    // cuBLAS took a kernel 1.4x slower than with 16 (H200, 16k tokens x 16384: 175.8 against 120.3
    // us, the copy rate of x; bench/mhc.py --only gemm)
    if (w.size(0) < 16) w = at::constant_pad_nd(w, {0, 0, 0, 16 - w.size(0)});
    p = mm_f32(x2d, w.t());
    nsplit = 3;
  } else {
    p = at::mm(x2d.to(at::kFloat), fn.t());
  }
  collapse_fwd(d, x, p, nsplit, scale, base, norm_eps, hc_eps, o.out, o.mix, o.rstd);
  if (!head) comb_fwd(d, iters, o.mix, scale, base, hc_eps, o.post, o.comb);
  return o;
}

Five pre_fwd_meta(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                  int64_t iters, double hc_eps, double norm_eps) {
  check_iters(iters, false);
  FwdOut o = fwd_meta_impl(x, fn, base, scale, false);
  return {o.post, o.comb, o.out, o.mix, o.rstd};
}

Five pre_fwd(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
             int64_t iters, double hc_eps, double norm_eps) {
  check_iters(iters, false);
  FwdOut o = fwd_impl(x, fn, base, scale, iters, hc_eps, norm_eps, false);
  return {o.post, o.comb, o.out, o.mix, o.rstd};
}

Three head_fwd_meta(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    double hc_eps, double norm_eps) {
  FwdOut o = fwd_meta_impl(x, fn, base, scale, true);
  return {o.out, o.mix, o.rstd};
}

Three head_fwd(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
               double hc_eps, double norm_eps) {
  FwdOut o = fwd_impl(x, fn, base, scale, 0, hc_eps, norm_eps, true);
  return {o.out, o.mix, o.rstd};
}

// -- mhc/pre and mhc/head backward ----------------------------------------------------------------
Four bwd_meta_impl(const OptTensor& g_post, const OptTensor& g_comb, const OptTensor& g_out,
                   const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                   const Tensor& mix, const Tensor& rstd, int64_t iters, bool head) {
  check_bwd(g_post, g_comb, g_out, x, fn, base, scale, mix, rstd, iters, head);
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(fn.sym_sizes(), fn.options()),
          at::empty_symint(base.sym_sizes(), base.options()),
          at::empty_symint(scale.sym_sizes(), scale.options())};
}

// (dx, dfn, dbase, dscale); g_post / g_comb only for pre; any gradient may be absent (zero).
Four bwd_impl(const OptTensor& g_post_in, const OptTensor& g_comb_in, const OptTensor& g_out_in,
              const Tensor& x_in, const Tensor& fn_in, const Tensor& base_in,
              const Tensor& scale_in, const Tensor& mix_in, const Tensor& rstd_in, int64_t iters,
              double hc_eps, bool head) {
  check_bwd(g_post_in, g_comb_in, g_out_in, x_in, fn_in, base_in, scale_in, mix_in, rstd_in, iters,
            head);
  c10::DeviceGuard guard(x_in.device());
  const Dims d = dims_of(x_in, head);
  const int64_t K = d.hc * d.hidden;
  auto f = x_in.options().dtype(at::kFloat);
  if (d.tokens == 0) {
    return {at::empty(x_in.sizes(), x_in.options()), at::zeros(fn_in.sizes(), fn_in.options()),
            at::zeros(base_in.sizes(), base_in.options()),
            at::zeros(scale_in.sizes(), scale_in.options())};
  }
  Tensor x = aligned(x_in), fn = f32(fn_in), base = f32(base_in), scale = f32(scale_in);
  Tensor mix = f32(mix_in), rstd = f32(rstd_in);
  OptTensor g_out = g_out_in ? OptTensor(aligned(g_out_in->to(x.scalar_type()))) : std::nullopt;
  Tensor da = at::empty({d.tokens, d.mixes}, f);
  if (!head) {
    OptTensor g_post = g_post_in ? OptTensor(f32(*g_post_in)) : std::nullopt;
    OptTensor g_comb = g_comb_in ? OptTensor(f32(*g_comb_in)) : std::nullopt;
    comb_bwd(d, iters, mix, scale, base, hc_eps, g_post, g_comb, da);
  }
  const int64_t groups = head ? 1 : 3;
  Tensor pre = at::empty({d.tokens, d.hc}, f), dsc = at::empty({d.tokens, groups}, f);
  Tensor coef_a = at::empty({d.tokens, d.mixes}, f), coef_c = at::empty({d.tokens}, f);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  Tensor dx = at::empty(x.sizes(), x.options());
  const bool fused = dx_dfn_fits(d, x, g_out, dx);
  // the split coefficients: the d fn GEMM's [T, 3M], or the fused kernel's padded rows
  const int64_t ld_a3 = fused ? opslot_mhc_dx_dfn_coef_pitch(d.mixes) : 3 * d.mixes;
  Tensor coef_a3 = bf16 ? at::empty({d.tokens, ld_a3}, x.options()) : Tensor();
  collapse_bwd(d, x, g_out, mix, rstd, scale, base, hc_eps, da, pre, dsc, coef_a, coef_a3, coef_c);
  Tensor dfn;
  if (fused) {
    dfn = dx_dfn_launch(d, x, g_out, fn, coef_a3, coef_c, pre, dx);
  } else {
    dx_launch(d, x, g_out, fn, coef_a, coef_c, pre, dx);
    Tensor x2d = x.view({d.tokens, K});
    if (bf16)  // sum_t coef_a[t, m] x[t, k] with coef_a = hi + mid + lo: one [K, 3M] GEMM
      dfn = mm_f32(x2d.t(), coef_a3).view({K, 3, d.mixes}).sum(1).t();
    else
      dfn = at::mm(coef_a.t(), x2d.to(at::kFloat));
  }
  auto [dbase, dscale] = token_sums(d, da, dsc);
  return {dx, dfn.to(fn_in.scalar_type()).contiguous(), dbase.to(base_in.scalar_type()),
          dscale.to(scale_in.scalar_type())};
}

Four pre_bwd_meta(const OptTensor& g_post, const OptTensor& g_comb, const OptTensor& g_out,
                  const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                  const Tensor& mix, const Tensor& rstd, int64_t iters, double hc_eps,
                  double norm_eps) {
  return bwd_meta_impl(g_post, g_comb, g_out, x, fn, base, scale, mix, rstd, iters, false);
}

Four pre_bwd(const OptTensor& g_post, const OptTensor& g_comb, const OptTensor& g_out,
             const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
             const Tensor& mix, const Tensor& rstd, int64_t iters, double hc_eps, double norm_eps) {
  return bwd_impl(g_post, g_comb, g_out, x, fn, base, scale, mix, rstd, iters, hc_eps, false);
}

Four head_bwd_meta(const Tensor& grad, const Tensor& x, const Tensor& fn, const Tensor& base,
                   const Tensor& scale, const Tensor& mix, const Tensor& rstd, double hc_eps,
                   double norm_eps) {
  return bwd_meta_impl(std::nullopt, std::nullopt, grad, x, fn, base, scale, mix, rstd, 0, true);
}

Four head_bwd(const Tensor& grad, const Tensor& x, const Tensor& fn, const Tensor& base,
              const Tensor& scale, const Tensor& mix, const Tensor& rstd, double hc_eps,
              double norm_eps) {
  return bwd_impl(std::nullopt, std::nullopt, grad, x, fn, base, scale, mix, rstd, 0, hc_eps, true);
}

// -- mhc/post -------------------------------------------------------------------------------------
Tensor post_meta(const Tensor& post, const Tensor& comb, const Tensor& bo, const Tensor& h) {
  check_post(post, comb, bo, h);
  return at::empty_symint(h.sym_sizes(), h.options());
}

Tensor post_fwd(const Tensor& post, const Tensor& comb, const Tensor& bo_in, const Tensor& h_in) {
  Tensor out = post_meta(post, comb, bo_in, h_in);
  c10::DeviceGuard guard(h_in.device());
  const int64_t tokens = h_in.size(0) * h_in.size(1), hc = h_in.size(2), hidden = h_in.size(3);
  if (tokens == 0) return out;
  Tensor p = f32(post), c = f32(comb), bo = aligned(bo_in), h = aligned(h_in);
  if (h.is_cuda()) {
    const KernelTable& k = prepare(h);
    OPSLOT_LAUNCH(k, opslot_mhc_post_fwd, dtype_code(h, "mhc"), tokens, hc, hidden, fptr(p),
                  fptr(c), ptr(bo), ptr(h), mutable_ptr(out), stream_of(h));
    return out;
  }
  const auto dt = h.scalar_type();
  Tensor pr = p.to(dt).to(at::kFloat), cr = c.to(dt).to(at::kFloat);
  out.copy_(pr.unsqueeze(-1) * bo.to(at::kFloat).unsqueeze(-2) +
            at::matmul(cr.transpose(-1, -2), h.to(at::kFloat)));
  return out;
}

Four post_bwd_meta(const Tensor& grad, const Tensor& post, const Tensor& comb, const Tensor& bo,
                   const Tensor& h) {
  check_post(post, comb, bo, h);
  check_shape("mhc/post", "grad", grad, h.sym_sizes());
  check_one_device("mhc/post", {{"hidden_states", h}, {"grad", grad}});
  return {at::empty_symint(post.sym_sizes(), post.options()),
          at::empty_symint(comb.sym_sizes(), comb.options()),
          at::empty_symint(bo.sym_sizes(), bo.options()),
          at::empty_symint(h.sym_sizes(), h.options())};
}

Four post_bwd(const Tensor& grad, const Tensor& post, const Tensor& comb, const Tensor& bo_in,
              const Tensor& h_in) {
  auto [d_post, d_comb, d_bo, d_h] = post_bwd_meta(grad, post, comb, bo_in, h_in);
  c10::DeviceGuard guard(h_in.device());
  const int64_t tokens = h_in.size(0) * h_in.size(1), hc = h_in.size(2), hidden = h_in.size(3);
  if (tokens == 0) return {d_post, d_comb, d_bo, d_h};
  Tensor p = f32(post), c = f32(comb), bo = aligned(bo_in), h = aligned(h_in);
  Tensor g = aligned(grad.to(h.scalar_type()));
  auto f = h.options().dtype(at::kFloat);
  Tensor dp = at::empty({tokens, hc}, f), dc = at::empty({tokens, hc, hc}, f);
  if (h.is_cuda()) {
    const KernelTable& k = prepare(h);
    OPSLOT_LAUNCH(k, opslot_mhc_post_bwd, dtype_code(h, "mhc"), tokens, hc, hidden, ptr(g), fptr(p),
                  fptr(c), ptr(bo), ptr(h), mutable_ptr(d_bo), mutable_ptr(d_h), fmut(dp), fmut(dc),
                  stream_of(h));
  } else {
    const auto dt = h.scalar_type();
    Tensor pr = p.to(dt).to(at::kFloat), cr = c.to(dt).to(at::kFloat), gf = g.to(at::kFloat);
    Tensor hf = h.to(at::kFloat), bf = bo.to(at::kFloat);
    d_bo.copy_((pr.unsqueeze(-1) * gf).sum(-2));
    d_h.copy_(at::matmul(cr, gf));
    dp.copy_((gf * bf.unsqueeze(-2)).sum(-1).view({tokens, hc}));
    dc.copy_(at::matmul(hf, gf.transpose(-1, -2)).view({tokens, hc, hc}));
  }
  d_post.copy_(dp.view(d_post.sizes()));
  d_comb.copy_(dc.view(d_comb.sizes()));
  return {d_post, d_comb, d_bo, d_h};
}

// -- autograd -------------------------------------------------------------------------------------
template <typename F>
c10::TypedOperatorHandle<F> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

class PreFunction : public torch::autograd::Function<PreFunction> {
 public:
  static variable_list forward(Ctx* ctx, const Tensor& x, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, int64_t iters, double hc_eps, double norm_eps) {
    static const auto op = find<decltype(pre_fwd)>("opslot::mhc_pre_fwd");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [post, comb, out, mix, rstd] = op.call(x, fn, base, scale, iters, hc_eps, norm_eps);
    ctx->save_for_backward({x, fn, base, scale, mix, rstd});
    ctx->saved_data["iters"] = iters;
    ctx->saved_data["hc_eps"] = hc_eps;
    ctx->saved_data["norm_eps"] = norm_eps;
    ctx->mark_non_differentiable({mix, rstd});
    ctx->set_materialize_grads(false);  // an absent gradient stays absent (zero in the kernels)
    return {post, comb, out, mix, rstd};
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(pre_bwd)>("opslot::mhc_pre_bwd");
    auto s = ctx->get_saved_variables();
    auto& v = ctx->saved_data;
    auto [dx, dfn, dbase, dscale] =
        op.call(opt(grads[0]), opt(grads[1]), opt(grads[2]), s[0], s[1], s[2], s[3], s[4], s[5],
                v["iters"].toInt(), v["hc_eps"].toDouble(), v["norm_eps"].toDouble());
    return {dx, dfn, dbase, dscale, Tensor(), Tensor(), Tensor()};
  }
};

class HeadFunction : public torch::autograd::Function<HeadFunction> {
 public:
  static variable_list forward(Ctx* ctx, const Tensor& x, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, double hc_eps, double norm_eps) {
    static const auto op = find<decltype(head_fwd)>("opslot::mhc_head_fwd");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, mix, rstd] = op.call(x, fn, base, scale, hc_eps, norm_eps);
    ctx->save_for_backward({x, fn, base, scale, mix, rstd});
    ctx->saved_data["hc_eps"] = hc_eps;
    ctx->saved_data["norm_eps"] = norm_eps;
    ctx->mark_non_differentiable({mix, rstd});
    ctx->set_materialize_grads(false);
    return {out, mix, rstd};
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(head_bwd)>("opslot::mhc_head_bwd");
    auto s = ctx->get_saved_variables();
    auto& v = ctx->saved_data;
    Tensor g = grads[0];
    if (!g.defined()) g = at::zeros({s[0].size(0), s[0].size(1), s[0].size(3)}, s[0].options());
    auto [dx, dfn, dbase, dscale] = op.call(g, s[0], s[1], s[2], s[3], s[4], s[5],
                                            v["hc_eps"].toDouble(), v["norm_eps"].toDouble());
    return {dx, dfn, dbase, dscale, Tensor(), Tensor()};
  }
};

class PostFunction : public torch::autograd::Function<PostFunction> {
 public:
  static Tensor forward(Ctx* ctx, const Tensor& post, const Tensor& comb, const Tensor& bo,
                        const Tensor& h) {
    static const auto op = find<decltype(post_fwd)>("opslot::mhc_post");
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({post, comb, bo, h});
    return op.call(post, comb, bo, h);
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(post_bwd)>("opslot::mhc_post_bwd");
    auto s = ctx->get_saved_variables();
    auto [d_post, d_comb, d_bo, d_h] = op.call(grads[0], s[0], s[1], s[2], s[3]);
    return {d_post, d_comb, d_bo, d_h};
  }
};

Five pre_autograd(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                  int64_t iters, double hc_eps, double norm_eps) {
  auto o = PreFunction::apply(x, fn, base, scale, iters, hc_eps, norm_eps);
  return {o[0], o[1], o[2], o[3], o[4]};
}

Three head_autograd(const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    double hc_eps, double norm_eps) {
  auto o = HeadFunction::apply(x, fn, base, scale, hc_eps, norm_eps);
  return {o[0], o[1], o[2]};
}

Tensor post_autograd(const Tensor& post, const Tensor& comb, const Tensor& bo, const Tensor& h) {
  return PostFunction::apply(post, comb, bo, h);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def(
      "mhc_pre_fwd(Tensor x, Tensor fn, Tensor base, Tensor scale, int sinkhorn_iters, float "
      "hc_eps, float norm_eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "mhc_pre_bwd(Tensor? grad_post, Tensor? grad_comb, Tensor? grad_collapsed, Tensor x, Tensor "
      "fn, Tensor base, Tensor scale, Tensor mix, Tensor rstd, int sinkhorn_iters, float hc_eps, "
      "float norm_eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "mhc_head_fwd(Tensor x, Tensor fn, Tensor base, Tensor scale, float hc_eps, float norm_eps) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "mhc_head_bwd(Tensor grad, Tensor x, Tensor fn, Tensor base, Tensor scale, Tensor mix, "
      "Tensor rstd, float hc_eps, float norm_eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("mhc_post(Tensor post, Tensor comb, Tensor block_output, Tensor hidden_states) -> Tensor");
  m.def(
      "mhc_post_bwd(Tensor grad, Tensor post, Tensor comb, Tensor block_output, Tensor "
      "hidden_states) -> (Tensor, Tensor, Tensor, Tensor)");
}

// The CUDA kernels are also the CPU kernels: each launch runs its contract in ATen on CPU tensors
// (the `cuda` implementation's Python functions refuse CPU tensors before calling these ops).
#define OPSLOT_MHC_OPS(m)            \
  m.impl("mhc_pre_fwd", &pre_fwd);   \
  m.impl("mhc_pre_bwd", &pre_bwd);   \
  m.impl("mhc_head_fwd", &head_fwd); \
  m.impl("mhc_head_bwd", &head_bwd); \
  m.impl("mhc_post", &post_fwd);     \
  m.impl("mhc_post_bwd", &post_bwd);

TORCH_LIBRARY_IMPL(opslot, CUDA, m){OPSLOT_MHC_OPS(m)}

TORCH_LIBRARY_IMPL(opslot, CPU, m){OPSLOT_MHC_OPS(m)}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("mhc_pre_fwd", &pre_fwd_meta);
  m.impl("mhc_pre_bwd", &pre_bwd_meta);
  m.impl("mhc_head_fwd", &head_fwd_meta);
  m.impl("mhc_head_bwd", &head_bwd_meta);
  m.impl("mhc_post", &post_meta);
  m.impl("mhc_post_bwd", &post_bwd_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) {
  m.impl("mhc_pre_fwd", &pre_autograd);
  m.impl("mhc_head_fwd", &head_autograd);
  m.impl("mhc_post", &post_autograd);
}

}  // namespace opslot_torch
