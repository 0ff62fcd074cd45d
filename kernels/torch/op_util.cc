// Helpers shared by the torch ops (op_util.h).
#include "op_util.h"

#include <ATen/core/op_registration/op_registration.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

namespace opslot_torch {
namespace {

constexpr int kMaxDevices = 64;

// Per device: the library whose check passed there (a swapped library is checked again).
std::array<std::atomic<const KernelTable*>, kMaxDevices> g_checked{};
std::mutex g_check_mutex;

void check_device(const KernelTable& table, int index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "opslot cuda kernels: device index ", index,
              " out of range");
  if (g_checked[index].load(std::memory_order_acquire) == &table) return;
  std::lock_guard<std::mutex> lock(g_check_mutex);
  int rc = table.opslot_check_device(index);
  TORCH_CHECK(rc == 0, table.opslot_last_error());
  g_checked[index].store(&table, std::memory_order_release);
}

// A tensor of opslot's cuda ops on another device: the message opslot's Python binding gave.
[[noreturn]] void refuse_device(const std::string& device) {
  TORCH_CHECK(false, "opslot's cuda kernels run on CUDA tensors, got a tensor on ", device,
              " (on a CUDA machine they are the default: move the model to the GPU, or choose "
              "'eager' or 'torch' for this op in ops_implementation, or set "
              "OPSLOT_FORCE_IMPL=eager)");
}

// Any op of opslot given CPU tensors: the message opslot's Python binding gave.
void refuse_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string device = "cpu";
  for (const c10::IValue& v : *stack) {
    if (v.isTensor()) {
      device = v.toTensor().device().str();
      break;
    }
  }
  refuse_device(device);
}

void bump_mutated_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  auto inputs = torch::jit::last(*stack, args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite() && inputs[i].isTensor()) {
      torch::autograd::impl::bump_version(inputs[i].toTensor());
    }
  }
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}

}  // namespace

int dtype_code(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return OPSLOT_FLOAT32;
    case at::kHalf:
      return OPSLOT_FLOAT16;
    case at::kBFloat16:
      return OPSLOT_BFLOAT16;
    default:
      TORCH_CHECK_TYPE(false, what,
                       ": opslot cuda kernels take float32, float16 or bfloat16 tensors, got ",
                       c10::toString(t.scalar_type()));
  }
}

void check_float(const at::Tensor& t, const char* what) { (void)dtype_code(t, what); }

const KernelTable& prepare(const at::Tensor& t) {
  const KernelTable& table = kernels();
  check_device(table, t.get_device());
  return table;
}

void* stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

const void* ptr(const at::Tensor& t) {
  return (!t.defined() || t.numel() == 0) ? nullptr : t.const_data_ptr();
}

const void* ptr(const std::optional<at::Tensor>& t) { return t.has_value() ? ptr(*t) : nullptr; }

void* mutable_ptr(const at::Tensor& t) {
  return (!t.defined() || t.numel() == 0) ? nullptr : t.data_ptr();
}

at::Tensor rows_view(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() > 0, "expected a tensor with at least one dimension");
  at::Tensor v = last_contiguous(t);
  v = v.reshape({-1, v.size(-1)});
  return last_contiguous(v);
}

int64_t row_stride(const at::Tensor& rows) {
  return rows.size(0) > 1 ? rows.stride(0) : rows.size(1);
}

at::Tensor last_contiguous(const at::Tensor& t) {
  return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

int mask_kind(const at::Tensor& mask, const char* op) {
  switch (mask.scalar_type()) {
    case at::kBool:
      return OPSLOT_TOPK_MASK_BOOL;
    case at::kFloat:
      return OPSLOT_TOPK_MASK_FLOAT32;
    case at::kHalf:
      return OPSLOT_TOPK_MASK_FLOAT16;
    case at::kBFloat16:
      return OPSLOT_TOPK_MASK_BFLOAT16;
    default:
      TORCH_CHECK_TYPE(false, op, ": the mask must be bool, float32, float16 or bfloat16, got ",
                       py_dtype(mask.scalar_type()));
  }
  return -1;
}

at::Tensor as_rows3(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() > 0, "expected a tensor with at least one dimension");
  at::Tensor v = last_contiguous(t);
  if (v.dim() == 1) return v.unsqueeze(0).unsqueeze(0);
  if (v.dim() == 2) return v.unsqueeze(0);
  if (v.dim() == 3) return v;
  return last_contiguous(v.reshape({-1, v.size(-2), v.size(-1)}));
}

void register_cpu_refusal(torch::Library& m, const char* op) {
  m.impl(op, torch::CppFunction::makeFromBoxedFunction<&refuse_cpu>());
}

const KernelTable& prepare_cuda(const at::Tensor& t) {
  if (!t.is_cuda()) refuse_device(t.device().str());
  return prepare(t);
}

void register_inplace_version_bump(torch::Library& m, const char* op) {
  m.impl(op, torch::CppFunction::makeFromBoxedFunction<&bump_mutated_versions>());
}

void check_float_dtype(const at::Tensor& t, const char* what) {
  at::ScalarType d = t.scalar_type();
  TORCH_CHECK_TYPE(d == at::kFloat || d == at::kHalf || d == at::kBFloat16, what,
                   ": opslot cuda kernels take float32, float16 or bfloat16 tensors, got ",
                   py_dtype(d));
}

int cuda_capability_major(int index) {
  static std::array<std::atomic<int>, kMaxDevices> majors{};
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "opslot cuda kernels: device index ", index,
              " out of range");
  int major = majors[index].load(std::memory_order_relaxed);
  if (major > 0) return major;
  // The driver is loaded once torch has used CUDA; its two calls need no runtime library.
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using GetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(driver != nullptr, "opslot cuda kernels: the CUDA driver is not loaded");
  auto device_get = reinterpret_cast<DeviceGet>(dlsym(driver, "cuDeviceGet"));
  auto get_attribute = reinterpret_cast<GetAttribute>(dlsym(driver, "cuDeviceGetAttribute"));
  CUdevice device = 0;
  TORCH_CHECK(device_get != nullptr && get_attribute != nullptr &&
                  device_get(&device, index) == CUDA_SUCCESS &&
                  get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) ==
                      CUDA_SUCCESS,
              "opslot cuda kernels: cannot read the compute capability of cuda:", index);
  majors[index].store(major, std::memory_order_relaxed);
  return major;
}

void check_one_device(const char* op, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (a.t == nullptr) continue;
    if (first == nullptr) {
      first = &a;
      continue;
    }
    TORCH_CHECK_VALUE(a.t->device() == first->t->device(), op, ": ", a.name, " is on ",
                      a.t->device(), ", ", first->name, " on ", first->t->device(),
                      " (an op's tensors share one device)");
  }
}

void check_shape(const char* op, const char* name, const at::Tensor& t, c10::SymIntArrayRef want) {
  TORCH_CHECK_VALUE(t.sym_sizes() == want, op, ": ", name, " must be ", py_shape(want), ", got ",
                    py_shape(t.sym_sizes()));
}

void check_query_indices(const char* op, const at::Tensor& indices, c10::SymIntArrayRef q_sizes) {
  TORCH_CHECK_TYPE(indices.scalar_type() == at::kInt, op, ": indices must be int32, got ",
                   py_dtype(indices.scalar_type()));
  TORCH_CHECK_VALUE(
      indices.dim() == 3 && indices.sym_size(0) == q_sizes[0] && indices.sym_size(1) == q_sizes[1],
      op, ": indices must be [batch, seq, topk] with batch and seq of q ",
      py_shape(q_sizes.slice(0, 2)), ", got ", py_shape(indices.sym_sizes()));
}

std::string py_shape(c10::SymIntArrayRef sizes) {
  std::string text = "(";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + c10::str(sizes[i]);
  return text + (sizes.size() == 1 ? ",)" : ")");
}

std::string py_dtype(at::ScalarType dtype) { return "torch." + c10::getDtypeNames(dtype).first; }

}  // namespace opslot_torch
