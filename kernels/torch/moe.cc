// torch ops of the MoE experts over the C ABI of moe.h (docs/kernels.md, runtime/opslot/kernels/
// cuda/moe.py): opslot::moe_route (device routing), moe_gather, moe_combine, moe_act and
// moe_grouped_mm, each differentiable through its _backward op (Autograd kernels), with Meta
// kernels; nothing reads device data on the host.
//
// Each C entry point has a launch function here, called directly on CUDA tensors. On other devices
// the ops call it as the op opslot::moe_k_<name> (launch_or_dispatch), whose CPU kernel Python
// registers (moe.py's `_k_<name>`, which CPU tests emulate); so do the public ops' CPU kernels,
// which are their CUDA kernels. Likewise the choice of GEMM (torch._grouped_mm or the portable
// kernel) is made here for CUDA tensors and by moe_k_use_grouped_mm's Python kernel for others.
// moe_grouped_mm.portable (and its backward) always take the portable kernel: moe.py calls it when
// its GEMM_BACKEND is "portable"; .default does when $OPSLOT_MOE_GEMM is "portable".
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>

#include "op_util.h"

namespace opslot_torch {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Tensor = at::Tensor;
using SymInt = c10::SymInt;
using variable_list = torch::autograd::variable_list;
using Ctx = torch::autograd::AutogradContext;

// Raw pointers as the C ABI takes them (an absent tensor is NULL).
const void* in(const OptTensor& t) { return t.has_value() ? t->const_data_ptr() : nullptr; }
void* out(const OptTensor& t) { return t.has_value() ? t->data_ptr() : nullptr; }
const int32_t* i32(const OptTensor& t) { return static_cast<const int32_t*>(in(t)); }
int code(const Tensor& t) { return dtype_code(t, "moe"); }

// Contiguous and 16-byte aligned (the kernels load 16-byte vectors), copying only if needed.
Tensor aligned(const Tensor& t) {
  Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 ? c.clone() : c;
}
OptTensor aligned(const OptTensor& t) {
  return t.has_value() ? OptTensor(aligned(*t)) : std::nullopt;
}

// -- launches: one per C entry point, the CUDA kernels of the opslot::moe_k_* ops -----------------
void scatter_rows(const Tensor& src, Tensor& dst, const Tensor& inv, const OptTensor& weights,
                  const OptTensor& rows, const OptTensor& bias, const OptTensor& row_expert,
                  const OptTensor& dot, const Tensor& offs, int64_t top_k) {
  const KernelTable& k = prepare_cuda(src);
  c10::DeviceGuard guard(src.device());
  OPSLOT_LAUNCH(k, opslot_moe_scatter_rows, in(src), out(dst), i32(inv),
                static_cast<const float*>(in(weights)), in(rows), in(bias), i32(row_expert),
                static_cast<float*>(out(dot)), i32(offs), offs.size(0), src.size(0), top_k,
                src.size(1), code(src), stream_of(src));
}

void gather_sum(const Tensor& rows, Tensor& dst, const Tensor& inv, const OptTensor& weights,
                const OptTensor& bias, const OptTensor& row_expert, const Tensor& offs,
                int64_t top_k) {
  const KernelTable& k = prepare_cuda(rows);
  c10::DeviceGuard guard(rows.device());
  OPSLOT_LAUNCH(k, opslot_moe_gather_sum, in(rows), out(dst), i32(inv),
                static_cast<const float*>(in(weights)), in(bias), i32(row_expert), i32(offs),
                offs.size(0), dst.size(0), top_k, rows.size(1), code(rows), stream_of(rows));
}

void act_forward(const Tensor& h, Tensor& a, const OptTensor& bias, const Tensor& row_expert,
                 const Tensor& offs, int64_t kind, double alpha, double limit) {
  const KernelTable& k = prepare_cuda(h);
  c10::DeviceGuard guard(h.device());
  OPSLOT_LAUNCH(k, opslot_moe_act_forward, in(h), out(a), in(bias), i32(row_expert), i32(offs),
                offs.size(0), h.size(0), a.size(1), static_cast<int>(kind),
                static_cast<float>(alpha), static_cast<float>(limit), code(h), stream_of(h));
}

void act_backward(const Tensor& da, const Tensor& h, Tensor& dh, const OptTensor& bias,
                  const Tensor& row_expert, const Tensor& offs, int64_t kind, double alpha,
                  double limit) {
  const KernelTable& k = prepare_cuda(da);
  c10::DeviceGuard guard(h.device());
  OPSLOT_LAUNCH(k, opslot_moe_act_backward, in(da), in(h), out(dh), in(bias), i32(row_expert),
                i32(offs), offs.size(0), h.size(0), da.size(1), static_cast<int>(kind),
                static_cast<float>(alpha), static_cast<float>(limit), code(h), stream_of(h));
}

void segment_sum(const Tensor& g, Tensor& dst, const Tensor& offs) {
  const KernelTable& k = prepare_cuda(g);
  c10::DeviceGuard guard(g.device());
  int64_t experts = dst.size(0), cols = dst.size(1);
  int64_t floats = OPSLOT_ENTRY(k, opslot_moe_segment_sum_scratch)(experts, cols);
  TORCH_CHECK(floats >= 0, "opslot cuda kernel moe segment sum: ", k.opslot_last_error());
  Tensor scratch = at::empty({floats}, g.options().dtype(at::kFloat));
  OPSLOT_LAUNCH(k, opslot_moe_segment_sum, in(g), out(dst), static_cast<float*>(out(scratch)),
                i32(offs), experts, cols, code(g), stream_of(g));
}

void gmm_rows(const Tensor& a, const Tensor& b, Tensor& c, const Tensor& offs) {
  const KernelTable& k = prepare_cuda(a);
  c10::DeviceGuard guard(a.device());
  OPSLOT_LAUNCH(k, opslot_moe_gmm_rows, in(a), in(b), b.stride(0), b.stride(1), b.stride(2), out(c),
                i32(offs), offs.size(0), a.size(0), a.size(1), b.size(2), code(a), stream_of(a));
}

void gmm_wgrad(const Tensor& x, const Tensor& g, Tensor& c, const Tensor& offs) {
  const KernelTable& k = prepare_cuda(x);
  c10::DeviceGuard guard(x.device());
  OPSLOT_LAUNCH(k, opslot_moe_gmm_wgrad, in(x), in(g), out(c), c.stride(0), c.stride(1),
                c.stride(2), i32(offs), offs.size(0), x.size(0), x.size(1), g.size(1), code(x),
                stream_of(x));
}

void zero_tail(Tensor& c, const Tensor& offs) {
  const KernelTable& k = prepare_cuda(c);
  c10::DeviceGuard guard(c.device());
  OPSLOT_LAUNCH(k, opslot_moe_zero_tail_rows, out(c), i32(offs), offs.size(0), c.size(0), c.size(1),
                code(c), stream_of(c));
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// torch._grouped_mm (CUTLASS) for bf16 on sm90/sm100 with widths that are multiples of 8 and
// aligned, contiguous operands; else the library's portable grouped GEMM.
bool use_grouped_mm(const Tensor& a, const Tensor& w) {
  if (!(a.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && a.is_cuda())) {
    return false;
  }
  int major = cuda_capability_major(a.get_device());
  return (major == 9 || major == 10) && a.size(0) > 0 && a.size(1) % 8 == 0 && w.size(1) % 8 == 0 &&
         w.size(2) % 8 == 0 && w.size(0) < 1024 && w.is_contiguous() && a.is_contiguous() &&
         aligned16(a) && aligned16(w);
}

#define OPSLOT_MOE_LAUNCH(fn, on, ...) \
  launch_or_dispatch<&fn>("opslot::moe_k_" #fn, on, __VA_ARGS__)

// -- routing --------------------------------------------------------------------------------------
using Four = std::tuple<Tensor, Tensor, Tensor, Tensor>;

Four route_meta(const Tensor& top_k_index, SymInt num_experts) {
  TORCH_CHECK_VALUE(top_k_index.dim() == 2, "top_k_index must be [tokens, top_k], got shape ",
                    py_shape(top_k_index.sym_sizes()));
  SymInt n = top_k_index.sym_size(0) * top_k_index.sym_size(1);
  auto i32 = top_k_index.options().dtype(at::kInt);
  return {at::empty_symint({num_experts}, i32), at::empty_symint({n}, i32),
          at::empty_symint({n}, i32), at::empty_symint({n}, i32)};
}

// The routing kernel (a stable counting sort on the device): (offs, row_expert, src_token, inv).
Four route_cuda(const Tensor& top_k_index, int64_t num_experts) {
  auto [offs, row_expert, src_token, inv] = route_meta(top_k_index, num_experts);
  const KernelTable& k = prepare_cuda(top_k_index);
  c10::DeviceGuard guard(top_k_index.device());
  Tensor idx = top_k_index.reshape(-1);
  if (idx.scalar_type() != at::kLong && idx.scalar_type() != at::kInt) idx = idx.to(at::kLong);
  idx = idx.contiguous();
  int64_t n = idx.numel();
  Tensor scratch = at::empty({OPSLOT_ENTRY(k, opslot_moe_route_scratch)(n, num_experts)},
                             idx.options().dtype(at::kInt));
  OPSLOT_LAUNCH(k, opslot_moe_route, in(idx), idx.scalar_type() == at::kLong ? 1 : 0, n,
                top_k_index.size(1), num_experts, offs.data_ptr<int32_t>(),
                row_expert.data_ptr<int32_t>(), src_token.data_ptr<int32_t>(),
                inv.data_ptr<int32_t>(), static_cast<int32_t*>(out(scratch)), stream_of(idx));
  return {offs, row_expert, src_token, inv};
}

// -- argument checks ------------------------------------------------------------------------------
// What the kernels read as given: rows [N, cols] of a float dtype; index tensors (inv, offs,
// row_expert) int32, contiguous, one entry per row (offs: per expert); a bias [E, cols] in the
// rows' dtype; all on one device. The index values are device data, not read here: moe_route makes
// them (grouped_experts' caller passes offs and row_expert, docs/kernels.md).
void check_matrix(const char* op, const char* name, const Tensor& t) {
  check_float_dtype(t, op);
  TORCH_CHECK_VALUE(t.dim() == 2, op, ": ", name, " must be [rows, columns], got shape ",
                    py_shape(t.sym_sizes()));
}

void check_index(const char* op, const char* name, const Tensor& t, const SymInt& n) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, op, ": ", name, " must be torch.int32, got ",
                   py_dtype(t.scalar_type()));
  check_shape(op, name, t, {n});
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_offs(const char* op, const Tensor& offs) {
  TORCH_CHECK_VALUE(offs.dim() == 1, op, ": offs must be [experts], got shape ",
                    py_shape(offs.sym_sizes()));
  check_index(op, "offs", offs, offs.sym_size(0));
}

void check_bias(const char* op, const OptTensor& bias, const Tensor& like, const Tensor& offs,
                const SymInt& cols) {
  if (!bias.has_value()) return;
  TORCH_CHECK_TYPE(bias->scalar_type() == like.scalar_type(), op, ": bias must be ",
                   py_dtype(like.scalar_type()), " (the rows' dtype), got ",
                   py_dtype(bias->scalar_type()));
  check_shape(op, "bias", *bias, {offs.sym_size(0), cols});
}

void check_top_k(const char* op, const SymInt& top_k) {
  TORCH_CHECK_VALUE(top_k >= 1, op, ": top_k must be at least 1, got ", top_k);
}

// -- gather: x [T, H] -> rows [T*K, H] in expert order (dropped rows zero) ------------------------
Tensor gather_meta(const Tensor& x, const Tensor& inv, const Tensor& offs, SymInt top_k) {
  const char* op = "moe_gather";
  check_matrix(op, "x", x);
  check_top_k(op, top_k);
  check_index(op, "inv", inv, x.sym_size(0) * top_k);
  check_offs(op, offs);
  check_one_device(op, {{"x", x}, {"inv", inv}, {"offs", offs}});
  return at::empty_symint({x.sym_size(0) * top_k, x.sym_size(1)}, x.options());
}

Tensor gather(const Tensor& x, const Tensor& inv, const Tensor& offs, int64_t top_k) {
  Tensor src = aligned(x), dst = gather_meta(x, inv, offs, top_k);
  OPSLOT_MOE_LAUNCH(scatter_rows, src, src, dst, inv, std::nullopt, std::nullopt, std::nullopt,
                    std::nullopt, std::nullopt, offs, top_k);
  return dst;
}

Tensor gather_backward_meta(const Tensor& grad, const Tensor& inv, const Tensor& offs,
                            SymInt top_k) {
  const char* op = "moe_gather_backward";
  check_matrix(op, "grad", grad);
  check_top_k(op, top_k);
  TORCH_CHECK_VALUE(grad.sym_size(0) % top_k == 0, op, ": grad's ", grad.sym_size(0),
                    " rows are not top_k (", top_k, ") per token");
  check_index(op, "inv", inv, grad.sym_size(0));
  check_offs(op, offs);
  check_one_device(op, {{"grad", grad}, {"inv", inv}, {"offs", offs}});
  return at::empty_symint({grad.sym_size(0) / top_k, grad.sym_size(1)}, grad.options());
}

// The unweighted gather-sum: d x[t] = sum_k grad[inv[t*K+k]].
Tensor gather_backward(const Tensor& grad, const Tensor& inv, const Tensor& offs, int64_t top_k) {
  Tensor rows = aligned(grad), dx = gather_backward_meta(grad, inv, offs, top_k);
  OPSLOT_MOE_LAUNCH(gather_sum, rows, rows, dx, inv, std::nullopt, std::nullopt, std::nullopt, offs,
                    top_k);
  return dx;
}

// -- combine: out[t] = sum_k w[t,k] * (rows[inv[t,k]] + bias[expert]) (fp32 sum, k order) ---------
void check_combine(const Tensor& rows, const Tensor& inv, const Tensor& offs, const Tensor& weights,
                   const Tensor& row_expert, const OptTensor& bias) {
  const char* op = "moe_combine";
  check_matrix(op, "rows", rows);
  TORCH_CHECK_TYPE(weights.scalar_type() == at::kFloat, op, ": weights must be torch.float32, got ",
                   py_dtype(weights.scalar_type()));
  TORCH_CHECK_VALUE(weights.dim() == 2, op, ": weights must be [tokens, top_k], got shape ",
                    py_shape(weights.sym_sizes()));
  check_top_k(op, weights.sym_size(1));
  check_index(op, "inv", inv, weights.sym_size(0) * weights.sym_size(1));
  check_index(op, "row_expert", row_expert, rows.sym_size(0));
  check_offs(op, offs);
  check_bias(op, bias, rows, offs, rows.sym_size(1));
  check_one_device(op, {{"rows", rows},
                        {"inv", inv},
                        {"offs", offs},
                        {"weights", weights},
                        {"row_expert", row_expert},
                        {"bias", bias}});
}

Tensor combine_meta(const Tensor& rows, const Tensor& inv, const Tensor& offs,
                    const Tensor& weights, const Tensor& row_expert, const OptTensor& bias) {
  check_combine(rows, inv, offs, weights, row_expert, bias);
  return at::empty_symint({weights.sym_size(0), rows.sym_size(1)}, rows.options());
}

Tensor combine(const Tensor& rows, const Tensor& inv, const Tensor& offs, const Tensor& weights,
               const Tensor& row_expert, const OptTensor& bias) {
  Tensor r = aligned(rows), result = combine_meta(rows, inv, offs, weights, row_expert, bias);
  OPSLOT_MOE_LAUNCH(gather_sum, r, r, result, inv, weights.contiguous(), aligned(bias), row_expert,
                    offs, weights.size(1));
  return result;
}

using Three = std::tuple<Tensor, Tensor, Tensor>;

void check_combine_backward(const Tensor& grad, const Tensor& rows, const Tensor& inv,
                            const Tensor& offs, const Tensor& weights, const Tensor& row_expert,
                            const OptTensor& bias) {
  check_combine(rows, inv, offs, weights, row_expert, bias);
  check_shape("moe_combine_backward", "grad", grad, {weights.sym_size(0), rows.sym_size(1)});
  check_one_device("moe_combine_backward", {{"rows", rows}, {"grad", grad}});
}

// (d rows, d weights [T, K], d bias [E, H] or empty).
Three combine_backward_meta(const Tensor& grad, const Tensor& rows, const Tensor& inv,
                            const Tensor& offs, const Tensor& weights, const Tensor& row_expert,
                            const OptTensor& bias) {
  check_combine_backward(grad, rows, inv, offs, weights, row_expert, bias);
  return {at::empty_symint(rows.sym_sizes(), grad.options()),
          at::empty_symint(weights.sym_sizes(), weights.options()),
          bias.has_value() ? at::empty_symint(bias->sym_sizes(), grad.options())
                           : at::empty({0}, grad.options())};
}

// The scatter with the routing-weight gradient as a per-row dot product, and the down-bias
// gradient as a per-expert segment sum.
Three combine_backward(const Tensor& grad, const Tensor& rows, const Tensor& inv,
                       const Tensor& offs, const Tensor& weights, const Tensor& row_expert,
                       const OptTensor& bias) {
  check_combine_backward(grad, rows, inv, offs, weights, row_expert, bias);
  int64_t top_k = weights.size(1);
  Tensor g = aligned(grad);
  Tensor d_rows = at::empty({g.size(0) * top_k, g.size(1)}, g.options());
  Tensor dot = at::empty({g.size(0) * top_k}, g.options().dtype(at::kFloat));
  OPSLOT_MOE_LAUNCH(scatter_rows, g, g, d_rows, inv, weights.contiguous(), aligned(rows),
                    aligned(bias), row_expert, dot, offs, top_k);
  Tensor d_bias = at::empty({0}, grad.options());
  if (bias.has_value()) {
    d_bias = at::empty({offs.size(0), d_rows.size(1)}, d_rows.options());
    OPSLOT_MOE_LAUNCH(segment_sum, d_rows, d_rows, d_bias, offs);
  }
  return {d_rows, dot.view({weights.size(0), top_k}), d_bias};
}

// -- activation: h [N, 2I] -> a [N, I]; kind 0: silu(gate) * up, kind 1: GPT-OSS (interleaved,
// gate and up, + bias)
void check_act(const Tensor& h, const Tensor& offs, const Tensor& row_expert,
               const OptTensor& bias) {
  const char* op = "moe_act";
  check_matrix(op, "h", h);
  TORCH_CHECK_VALUE(h.sym_size(1) % 2 == 0, op,
                    ": h must hold gate and up, an even number of "
                    "columns, got ",
                    h.sym_size(1));
  check_index(op, "row_expert", row_expert, h.sym_size(0));
  check_offs(op, offs);
  check_bias(op, bias, h, offs, h.sym_size(1));
  check_one_device(op, {{"h", h}, {"offs", offs}, {"row_expert", row_expert}, {"bias", bias}});
}

Tensor act_meta(const Tensor& h, const Tensor& offs, const Tensor& row_expert,
                const OptTensor& bias, SymInt kind, double alpha, double limit) {
  check_act(h, offs, row_expert, bias);
  return at::empty_symint({h.sym_size(0), h.sym_size(1) / 2}, h.options());
}

Tensor act(const Tensor& h, const Tensor& offs, const Tensor& row_expert, const OptTensor& bias,
           int64_t kind, double alpha, double limit) {
  Tensor hc = aligned(h), a = act_meta(h, offs, row_expert, bias, kind, alpha, limit);
  OPSLOT_MOE_LAUNCH(act_forward, hc, hc, a, aligned(bias), row_expert, offs, kind, alpha, limit);
  return a;
}

using Two = std::tuple<Tensor, Tensor>;

void check_act_backward(const Tensor& grad, const Tensor& h, const Tensor& offs,
                        const Tensor& row_expert, const OptTensor& bias) {
  check_act(h, offs, row_expert, bias);
  check_shape("moe_act_backward", "grad", grad, {h.sym_size(0), h.sym_size(1) / 2});
  check_one_device("moe_act_backward", {{"h", h}, {"grad", grad}});
}

// (d h [N, 2I], d bias [E, 2I] or empty).
Two act_backward_meta(const Tensor& grad, const Tensor& h, const Tensor& offs,
                      const Tensor& row_expert, const OptTensor& bias, SymInt kind, double alpha,
                      double limit) {
  check_act_backward(grad, h, offs, row_expert, bias);
  return {at::empty_symint(h.sym_sizes(), h.options()),
          bias.has_value() ? at::empty_symint(bias->sym_sizes(), h.options())
                           : at::empty({0}, h.options())};
}

Two act_grad(const Tensor& grad, const Tensor& h, const Tensor& offs, const Tensor& row_expert,
             const OptTensor& bias, int64_t kind, double alpha, double limit) {
  check_act_backward(grad, h, offs, row_expert, bias);
  Tensor hc = aligned(h), dh = at::empty_like(hc), da = aligned(grad);
  OPSLOT_MOE_LAUNCH(act_backward, da, da, hc, dh, aligned(bias), row_expert, offs, kind, alpha,
                    limit);
  Tensor d_bias = at::empty({0}, h.options());
  if (bias.has_value()) {
    d_bias = at::empty({offs.size(0), dh.size(1)}, dh.options());
    OPSLOT_MOE_LAUNCH(segment_sum, dh, dh, d_bias, offs);
  }
  return {dh, d_bias};
}

// -- grouped GEMM over expert segments of rows ----------------------------------------------------

// $OPSLOT_MOE_GEMM (read once): "portable" makes .default take the portable kernel too (moe.py's
// GEMM_BACKEND starts from it), so that direct op calls (bench/moe.py) follow it.
bool portable_by_environment() {
  static const bool portable = [] {
    const char* value = std::getenv("OPSLOT_MOE_GEMM");
    std::string backend = value != nullptr ? value : "auto";
    TORCH_CHECK_VALUE(backend == "auto" || backend == "portable",
                      "opslot moe GEMM_BACKEND must be 'auto' or 'portable', got '", backend, "'");
    return backend == "portable";
  }();
  return portable;
}

// The GEMM choice: never torch._grouped_mm for .portable; on CUDA tensors use_grouped_mm; on others
// moe_k_use_grouped_mm's Python kernel.
bool grouped_mm_for(const Tensor& a, const Tensor& w, bool portable) {
  if (portable || portable_by_environment()) return false;
  return launch_or_dispatch<&use_grouped_mm>("opslot::moe_k_use_grouped_mm", a, a, w);
}

// c[r] = a[r] @ b[e(r)] over row segments; b is [E, K, N] (any strides); rows past offs[-1] zero.
Tensor segment_rows(const Tensor& a, const Tensor& b, const Tensor& offs, bool cutlass) {
  if (cutlass) {
    Tensor c = at::_grouped_mm(a, b, offs);
    OPSLOT_MOE_LAUNCH(zero_tail, c, c, offs);
    return c;
  }
  Tensor c = at::zeros({a.size(0), b.size(2)}, a.options());
  OPSLOT_MOE_LAUNCH(gmm_rows, a, a, b, c, offs);
  return c;
}

// c[e] = x_e^T @ g_e over row segments: [E, P, Q] from x [N, P], g [N, Q].
Tensor segment_wgrad(const Tensor& x, const Tensor& g, const Tensor& offs, bool cutlass) {
  if (cutlass) return at::_grouped_mm(x.t(), g, offs);
  Tensor c = at::empty({offs.size(0), x.size(1), g.size(1)}, x.options());
  OPSLOT_MOE_LAUNCH(gmm_wgrad, x, x, g, c, offs);
  return c;
}

// The [E, K, N] operand of a @ b per expert: w itself, or w [E, N, K] transposed.
Tensor b_view(const Tensor& w, bool w_transposed) { return w_transposed ? w.transpose(-2, -1) : w; }

void check_gmm(const Tensor& a, const Tensor& w, const Tensor& offs, bool w_transposed) {
  const char* op = "moe_grouped_mm";
  check_matrix(op, "a", a);
  TORCH_CHECK_TYPE(w.scalar_type() == a.scalar_type(), op, ": w must be ",
                   py_dtype(a.scalar_type()), " (a's dtype), got ", py_dtype(w.scalar_type()));
  TORCH_CHECK_VALUE(w.dim() == 3 && w.sym_size(w_transposed ? 2 : 1) == a.sym_size(1), op,
                    ": w must be ", w_transposed ? "[experts, out, " : "[experts, ", a.sym_size(1),
                    w_transposed ? "]" : ", out]", " for a of shape ", py_shape(a.sym_sizes()),
                    ", got ", py_shape(w.sym_sizes()));
  check_offs(op, offs);
  check_shape(op, "offs", offs, {w.sym_size(0)});
  check_one_device(op, {{"a", a}, {"w", w}, {"offs", offs}});
}

Tensor gmm_meta(const Tensor& a, const Tensor& w, const Tensor& offs, bool w_transposed) {
  check_gmm(a, w, offs, w_transposed);
  return at::empty_symint({a.sym_size(0), w.sym_size(w_transposed ? 1 : 2)}, a.options());
}

// Per expert segment of rows: a_e @ w[e].T (w_transposed, w [E, N, K]) or a_e @ w[e] (w [E, K, N]).
Tensor gmm(const Tensor& a, const Tensor& w, const Tensor& offs, bool w_transposed, bool portable) {
  check_gmm(a, w, offs, w_transposed);
  Tensor ac = a.contiguous();
  return segment_rows(ac, b_view(w, w_transposed), offs, grouped_mm_for(ac, w, portable));
}

void check_gmm_backward(const Tensor& grad, const Tensor& a, const Tensor& w, const Tensor& offs,
                        bool w_transposed) {
  check_gmm(a, w, offs, w_transposed);
  check_shape("moe_grouped_mm_backward", "grad", grad,
              {a.sym_size(0), w.sym_size(w_transposed ? 1 : 2)});
  check_one_device("moe_grouped_mm_backward", {{"a", a}, {"grad", grad}});
}

Two gmm_backward_meta(const Tensor& grad, const Tensor& a, const Tensor& w, const Tensor& offs,
                      bool w_transposed) {
  check_gmm_backward(grad, a, w, offs, w_transposed);
  return {at::empty_symint(a.sym_sizes(), a.options()),
          at::empty_symint(w.sym_sizes(), w.options())};
}

// (d a, d w) of gmm.
Two gmm_backward(const Tensor& grad, const Tensor& a, const Tensor& w, const Tensor& offs,
                 bool w_transposed, bool portable) {
  check_gmm_backward(grad, a, w, offs, w_transposed);
  Tensor g = grad.contiguous(), ac = a.contiguous();
  bool cutlass = grouped_mm_for(ac, w, portable) && grouped_mm_for(g, w, portable);
  Tensor d_a = segment_rows(g, b_view(w, w_transposed).transpose(-2, -1), offs, cutlass);
  // d w [E, N, K] or [E, K, N], like w
  Tensor d_w =
      w_transposed ? segment_wgrad(g, ac, offs, cutlass) : segment_wgrad(ac, g, offs, cutlass);
  return {d_a, d_w};
}

Tensor gmm_auto(const Tensor& a, const Tensor& w, const Tensor& offs, bool t) {
  return gmm(a, w, offs, t, false);
}
Tensor gmm_portable(const Tensor& a, const Tensor& w, const Tensor& offs, bool t) {
  return gmm(a, w, offs, t, true);
}
Two gmm_backward_auto(const Tensor& g, const Tensor& a, const Tensor& w, const Tensor& offs,
                      bool t) {
  return gmm_backward(g, a, w, offs, t, false);
}
Two gmm_backward_portable(const Tensor& g, const Tensor& a, const Tensor& w, const Tensor& offs,
                          bool t) {
  return gmm_backward(g, a, w, offs, t, true);
}

// -- autograd -------------------------------------------------------------------------------------
template <typename F>
c10::TypedOperatorHandle<F> find(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<F>();
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

class GatherFunction : public torch::autograd::Function<GatherFunction> {
 public:
  static Tensor forward(Ctx* ctx, const Tensor& x, const Tensor& inv, const Tensor& offs,
                        SymInt top_k) {
    static const auto op = find<decltype(gather_meta)>("opslot::moe_gather");
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({inv, offs});
    ctx->saved_data["top_k"] = top_k;
    return op.call(x, inv, offs, top_k);
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(gather_backward_meta)>("opslot::moe_gather_backward");
    auto s = ctx->get_saved_variables();
    return {op.call(grads[0], s[0], s[1], ctx->saved_data["top_k"].toSymInt()), Tensor(), Tensor(),
            Tensor()};
  }
};

class CombineFunction : public torch::autograd::Function<CombineFunction> {
 public:
  static Tensor forward(Ctx* ctx, const Tensor& rows, const Tensor& inv, const Tensor& offs,
                        const Tensor& weights, const Tensor& row_expert, const OptTensor& bias) {
    static const auto op = find<decltype(combine_meta)>("opslot::moe_combine");
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({rows, inv, offs, weights, row_expert, bias.value_or(Tensor())});
    return op.call(rows, inv, offs, weights, row_expert, bias);
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(combine_backward_meta)>("opslot::moe_combine_backward");
    auto s = ctx->get_saved_variables();
    auto [d_rows, d_w, d_bias] = op.call(grads[0], s[0], s[1], s[2], s[3], s[4], opt(s[5]));
    return {d_rows, Tensor(), Tensor(), d_w, Tensor(), s[5].defined() ? d_bias : Tensor()};
  }
};

class ActFunction : public torch::autograd::Function<ActFunction> {
 public:
  static Tensor forward(Ctx* ctx, const Tensor& h, const Tensor& offs, const Tensor& row_expert,
                        const OptTensor& bias, SymInt kind, double alpha, double limit) {
    static const auto op = find<decltype(act_meta)>("opslot::moe_act");
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({h, offs, row_expert, bias.value_or(Tensor())});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    return op.call(h, offs, row_expert, bias, kind, alpha, limit);
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(act_backward_meta)>("opslot::moe_act_backward");
    auto s = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    auto [dh, d_bias] = op.call(grads[0], s[0], s[1], s[2], opt(s[3]), d["kind"].toSymInt(),
                                d["alpha"].toDouble(), d["limit"].toDouble());
    return {dh,       Tensor(), Tensor(), s[3].defined() ? d_bias : Tensor(),
            Tensor(), Tensor(), Tensor()};
  }
};

// `portable`: the .portable overloads (moe.py's GEMM_BACKEND "portable").
class GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
 public:
  static Tensor forward(Ctx* ctx, const Tensor& a, const Tensor& w, const Tensor& offs,
                        bool w_transposed, bool portable) {
    static const auto op = find<decltype(gmm_meta)>("opslot::moe_grouped_mm");
    static const auto op_portable = find<decltype(gmm_meta)>("opslot::moe_grouped_mm", "portable");
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, w, offs});
    ctx->saved_data["w_transposed"] = w_transposed;
    ctx->saved_data["portable"] = portable;
    return (portable ? op_portable : op).call(a, w, offs, w_transposed);
  }
  static variable_list backward(Ctx* ctx, variable_list grads) {
    static const auto op = find<decltype(gmm_backward_meta)>("opslot::moe_grouped_mm_backward");
    static const auto op_portable =
        find<decltype(gmm_backward_meta)>("opslot::moe_grouped_mm_backward", "portable");
    auto s = ctx->get_saved_variables();
    bool portable = ctx->saved_data["portable"].toBool();
    auto [d_a, d_w] =
        (portable ? op_portable : op)
            .call(grads[0], s[0], s[1], s[2], ctx->saved_data["w_transposed"].toBool());
    return {d_a, d_w, Tensor(), Tensor(), Tensor()};
  }
};

Tensor gather_autograd(const Tensor& x, const Tensor& inv, const Tensor& offs, SymInt top_k) {
  return GatherFunction::apply(x, inv, offs, top_k);
}
Tensor combine_autograd(const Tensor& rows, const Tensor& inv, const Tensor& offs,
                        const Tensor& weights, const Tensor& row_expert, const OptTensor& bias) {
  return CombineFunction::apply(rows, inv, offs, weights, row_expert, bias);
}
Tensor act_autograd(const Tensor& h, const Tensor& offs, const Tensor& row_expert,
                    const OptTensor& bias, SymInt kind, double alpha, double limit) {
  return ActFunction::apply(h, offs, row_expert, bias, kind, alpha, limit);
}
Tensor gmm_autograd_auto(const Tensor& a, const Tensor& w, const Tensor& offs, bool t) {
  return GroupedMmFunction::apply(a, w, offs, t, false);
}
Tensor gmm_autograd_portable(const Tensor& a, const Tensor& w, const Tensor& offs, bool t) {
  return GroupedMmFunction::apply(a, w, offs, t, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opslot, m) {
  m.def("moe_route(Tensor top_k_index, SymInt num_experts) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_gather(Tensor x, Tensor inv, Tensor offs, SymInt top_k) -> Tensor");
  m.def("moe_gather_backward(Tensor grad, Tensor inv, Tensor offs, SymInt top_k) -> Tensor");
  m.def(
      "moe_combine(Tensor rows, Tensor inv, Tensor offs, Tensor weights, Tensor row_expert, "
      "Tensor? bias) -> Tensor");
  m.def(
      "moe_combine_backward(Tensor grad, Tensor rows, Tensor inv, Tensor offs, Tensor weights, "
      "Tensor row_expert, Tensor? bias) -> (Tensor, Tensor, Tensor)");
  m.def(
      "moe_act(Tensor h, Tensor offs, Tensor row_expert, Tensor? bias, SymInt kind, float alpha, "
      "float limit) -> Tensor");
  m.def(
      "moe_act_backward(Tensor grad, Tensor h, Tensor offs, Tensor row_expert, Tensor? bias, "
      "SymInt kind, float alpha, float limit) -> (Tensor, Tensor)");
  m.def("moe_grouped_mm(Tensor a, Tensor w, Tensor offs, bool w_transposed) -> Tensor");
  m.def(
      "moe_grouped_mm_backward(Tensor grad, Tensor a, Tensor w, Tensor offs, bool w_transposed) "
      "-> (Tensor, Tensor)");
  m.def("moe_grouped_mm.portable(Tensor a, Tensor w, Tensor offs, bool w_transposed) -> Tensor");
  m.def(
      "moe_grouped_mm_backward.portable(Tensor grad, Tensor a, Tensor w, Tensor offs, bool "
      "w_transposed) -> (Tensor, Tensor)");
  // The launches as ops (their CPU kernels come from Python; see the top of this file).
  m.def(
      "moe_k_scatter_rows(Tensor src, Tensor(a!) dst, Tensor inv, Tensor? weights, Tensor? rows, "
      "Tensor? bias, Tensor? row_expert, Tensor(b!)? dot, Tensor offs, int top_k) -> ()");
  m.def(
      "moe_k_gather_sum(Tensor rows, Tensor(a!) out, Tensor inv, Tensor? weights, Tensor? bias, "
      "Tensor? row_expert, Tensor offs, int top_k) -> ()");
  m.def(
      "moe_k_act_forward(Tensor h, Tensor(a!) a, Tensor? bias, Tensor row_expert, Tensor offs, int "
      "kind, float alpha, float limit) -> ()");
  m.def(
      "moe_k_act_backward(Tensor da, Tensor h, Tensor(a!) dh, Tensor? bias, Tensor row_expert, "
      "Tensor offs, int kind, float alpha, float limit) -> ()");
  m.def("moe_k_segment_sum(Tensor g, Tensor(a!) out, Tensor offs) -> ()");
  m.def("moe_k_gmm_rows(Tensor a, Tensor b, Tensor(a!) c, Tensor offs) -> ()");
  m.def("moe_k_gmm_wgrad(Tensor x, Tensor g, Tensor(a!) c, Tensor offs) -> ()");
  m.def("moe_k_zero_tail(Tensor(a!) c, Tensor offs) -> ()");
  m.def("moe_k_use_grouped_mm(Tensor a, Tensor w) -> bool");
}

// The public ops' CUDA kernels, also their CPU kernels (their launches dispatch on the device).
#define OPSLOT_MOE_OPS(m)                                \
  m.impl("moe_gather", &gather);                         \
  m.impl("moe_gather_backward", &gather_backward);       \
  m.impl("moe_combine", &combine);                       \
  m.impl("moe_combine_backward", &combine_backward);     \
  m.impl("moe_act", &act);                               \
  m.impl("moe_act_backward", &act_grad);                 \
  m.impl("moe_grouped_mm", &gmm_auto);                   \
  m.impl("moe_grouped_mm.portable", &gmm_portable);      \
  m.impl("moe_grouped_mm_backward", &gmm_backward_auto); \
  m.impl("moe_grouped_mm_backward.portable", &gmm_backward_portable);

TORCH_LIBRARY_IMPL(opslot, CUDA, m) {
  OPSLOT_MOE_OPS(m)
  m.impl("moe_route", &route_cuda);
  m.impl("moe_k_scatter_rows", &scatter_rows);
  m.impl("moe_k_gather_sum", &gather_sum);
  m.impl("moe_k_act_forward", &act_forward);
  m.impl("moe_k_act_backward", &act_backward);
  m.impl("moe_k_segment_sum", &segment_sum);
  m.impl("moe_k_gmm_rows", &gmm_rows);
  m.impl("moe_k_gmm_wgrad", &gmm_wgrad);
  m.impl("moe_k_zero_tail", &zero_tail);
  m.impl("moe_k_use_grouped_mm", &use_grouped_mm);
}

TORCH_LIBRARY_IMPL(opslot, CPU, m) {
  OPSLOT_MOE_OPS(m)
  register_cpu_refusal(m, "moe_route");  // CPU tensors are routed by moe.route_torch
}

TORCH_LIBRARY_IMPL(opslot, Meta, m) {
  m.impl("moe_route", &route_meta);
  m.impl("moe_gather", &gather_meta);
  m.impl("moe_gather_backward", &gather_backward_meta);
  m.impl("moe_combine", &combine_meta);
  m.impl("moe_combine_backward", &combine_backward_meta);
  m.impl("moe_act", &act_meta);
  m.impl("moe_act_backward", &act_backward_meta);
  m.impl("moe_grouped_mm", &gmm_meta);
  m.impl("moe_grouped_mm.portable", &gmm_meta);
  m.impl("moe_grouped_mm_backward", &gmm_backward_meta);
  m.impl("moe_grouped_mm_backward.portable", &gmm_backward_meta);
}

TORCH_LIBRARY_IMPL(opslot, Autograd, m) {
  m.impl("moe_gather", &gather_autograd);
  m.impl("moe_combine", &combine_autograd);
  m.impl("moe_act", &act_autograd);
  m.impl("moe_grouped_mm", &gmm_autograd_auto);
  m.impl("moe_grouped_mm.portable", &gmm_autograd_portable);
}

}  // namespace opslot_torch
