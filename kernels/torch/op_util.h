// Helpers shared by the torch ops of libopslot_torch.so: argument checks with opslot's messages,
// the C ABI's dtype codes, pointers, row views, the current CUDA stream, and the per-device check.
#ifndef OPSLOT_TORCH_OP_UTIL_H_
#define OPSLOT_TORCH_OP_UTIL_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

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

// Registers the wrong-device kernel (a CPU tensor given to a cuda op) for `op` at the CPU key.
void register_cpu_refusal(torch::Library& m, const char* op);

}  // namespace opslot_torch

#endif  // OPSLOT_TORCH_OP_UTIL_H_
