// Helpers shared by the torch ops of libopslot_torch.so: argument checks with opslot's messages,
// the C ABI's dtype codes, pointers, row views, the current CUDA stream, and the per-device check.
#ifndef OPSLOT_TORCH_OP_UTIL_H_
#define OPSLOT_TORCH_OP_UTIL_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "kernel_table.h"

namespace opslot_torch {

// The opslot_dtype code of a float tensor; TypeError naming `what` for any other dtype.
int dtype_code(const at::Tensor& t, const char* what);

// TypeError unless `t` is float32, float16 or bfloat16.
void check_float(const at::Tensor& t, const char* what);

// The table to launch with, after checking that the library runs on `t`'s device (once per
// device and library). The caller holds a c10::DeviceGuard for `t`'s device while it launches.
const KernelTable& prepare(const at::Tensor& t);

// The current CUDA stream of `t`'s device, as the C ABI's `void* stream`.
void* stream_of(const at::Tensor& t);

// nullptr for an empty (or absent) tensor, else its data pointer.
const void* ptr(const at::Tensor& t);
const void* ptr(const std::optional<at::Tensor>& t);
void* mutable_ptr(const at::Tensor& t);

// `t` as [rows, last dim] with a contiguous last dimension (a view when possible).
at::Tensor rows_view(const at::Tensor& t);
// The row stride the C ABI takes for a rows_view (cols when there is one row).
int64_t row_stride(const at::Tensor& rows);

// `t` with its last dimension contiguous (itself when it already is).
at::Tensor last_contiguous(const at::Tensor& t);

// The OPSLOT_TOPK_MASK_* code of an attention mask (topk.h, mask_limit.h); TypeError naming `op`
// unless it is bool, float32, float16 or bfloat16.
int mask_kind(const at::Tensor& mask, const char* op);

// `t` ([..., S, T], at least one dimension) as [B, S, T] with a contiguous last dimension: S its
// second-to-last size (1 for one dimension), B the product of the others; a view when the leading
// dimensions allow it (always for up to three), else a copy.
at::Tensor as_rows3(const at::Tensor& t);

// Registers the wrong-device kernel (a CPU tensor given to a cuda op) for `op` at the CPU key.
void register_cpu_refusal(torch::Library& m, const char* op);

// prepare(t) for a CUDA tensor; for any other, opslot's wrong-device message (the one
// register_cpu_refusal gives). For ops whose CUDA kernel is also their CPU kernel: their argument
// checks (and empty-input early returns) come before the device's refusal, as in the Python ops.
const KernelTable& prepare_cuda(const at::Tensor& t);

// Registers the ADInplaceOrView kernel of a mutating op (`Tensor(a!)` arguments): it bumps the
// version counter of every mutated tensor argument, then redispatches (as torch.library.custom_op
// does for mutates_args), so autograd sees the in-place write.
void register_inplace_version_bump(torch::Library& m, const char* op);

// check_float with the dtype named as Python names it ("got torch.int32"), as the Python ops did.
void check_float_dtype(const at::Tensor& t, const char* what);

// The major compute capability of CUDA device `index` (asked of the driver once per device).
int cuda_capability_major(int index);

// The launch `Kernel` (a function calling one C entry point) on CUDA tensors (`on`'s device); on
// any other device the op `name` through the dispatcher: `Kernel` is that op's CUDA kernel and
// Python registers its CPU kernel, where CPU tests emulate the launch (cross_entropy, moe).
template <auto Kernel, typename... Args>
decltype(auto) launch_or_dispatch(const char* name, const at::Tensor& on, Args&&... args) {
  if (on.is_cuda()) return Kernel(std::forward<Args>(args)...);
  using Signature = std::remove_pointer_t<decltype(Kernel)>;
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Signature>();
  return op.call(std::forward<Args>(args)...);
}

// A tensor argument named as the op's schema names it; `t` is null for an absent optional.
struct Arg {
  Arg(const char* n, const at::Tensor& x) : name(n), t(x.defined() ? &x : nullptr) {}
  Arg(const char* n, const std::optional<at::Tensor>& x) : name(n), t(x ? &*x : nullptr) {}
  const char* name;
  const at::Tensor* t;
};

// ValueError "<op>: <name> is on <device>, <first name> on <device> (an op's tensors share one
// device)" unless every present tensor is on the first one's device: a kernel given a pointer to
// another device's memory would fault or read the wrong memory.
void check_one_device(const char* op, std::initializer_list<Arg> args);

// ValueError "<op>: <name> must be <shape>, got <shape>" (Python's tuples) unless `t` has `want`
// sizes: for arguments whose shape follows from the others (gradients, saved statistics), which
// the kernels read as that many elements.
void check_shape(const char* op, const char* name, const at::Tensor& t, c10::SymIntArrayRef want);

// The sparse attention ops' index lists: TypeError unless int32, ValueError unless [batch, seq,
// topk] with q's batch and seq (q_sizes: q's [batch, seq, ...]).
void check_query_indices(const char* op, const at::Tensor& indices, c10::SymIntArrayRef q_sizes);

// What Python prints: a shape as a tuple ("(2, 3)", "(4,)", "()"), a dtype ("torch.float32").
std::string py_shape(c10::SymIntArrayRef sizes);
std::string py_dtype(at::ScalarType dtype);

}  // namespace opslot_torch

#endif  // OPSLOT_TORCH_OP_UTIL_H_
