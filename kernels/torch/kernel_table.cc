// Opening libopslot_kernels.so and publishing its entry-point table (kernel_table.h).
#include "kernel_table.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/headeronly/version.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#define OPSLOT_TORCH_API extern "C" __attribute__((visibility("default")))
#define OPSLOT_STRINGIFY2(x) #x
#define OPSLOT_STRINGIFY(x) OPSLOT_STRINGIFY2(x)

namespace opslot_torch {
namespace {

// Read by opslot before it loads this file (a plain byte search, no loading): a build for another
// torch release is refused with "rebuild", never loaded.
[[gnu::used]] const char kBuiltFor[] =
    "opslot_torch built for torch " OPSLOT_STRINGIFY(TORCH_VERSION_MAJOR) "." OPSLOT_STRINGIFY(
        TORCH_VERSION_MINOR) "." OPSLOT_STRINGIFY(TORCH_VERSION_PATCH) ";";

std::atomic<const KernelTable*> g_table{nullptr};
std::mutex g_open_mutex;

// Fills `table` from the library at `path`; returns "" or why it cannot be used.
std::string open_table(const char* path, KernelTable* table) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return std::string("cannot load ") + path + ": " + dlerror();
    // An entry point the library lacks stays null (OPSLOT_ENTRY names it when an op needs it: a
    // library built with OPSLOT_KERNELS_ONLY, or an older one, still serves the ops it has); the
    // common ones are required.
#define OPSLOT_TABLE_LOOKUP(name) \
  table->name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));
  OPSLOT_KERNEL_ENTRY_POINTS(OPSLOT_TABLE_LOOKUP)
#undef OPSLOT_TABLE_LOOKUP
  if (!table->opslot_abi_version || !table->opslot_last_error || !table->opslot_check_device) {
    return std::string(path) +
           " is not an opslot kernel library (it lacks opslot_abi_version, opslot_last_error or "
           "opslot_check_device)";
  }
  int version = table->opslot_abi_version();
  if (version != OPSLOT_KERNELS_ABI_VERSION) {
    return std::string(path) + " has C ABI version " + std::to_string(version) +
           ", libopslot_torch.so needs " + std::to_string(OPSLOT_KERNELS_ABI_VERSION);
  }
  table->path = path;
  return "";
}

}  // namespace

const KernelTable& kernels() {
  const KernelTable* table = g_table.load(std::memory_order_acquire);
  TORCH_CHECK(table != nullptr,
              "opslot's torch ops have no kernel library: import opslot.kernels.cuda (it opens "
              "libopslot_kernels.so) before calling torch.ops.opslot");
  return *table;
}

void missing_entry(const KernelTable& table, const char* name) {
  TORCH_CHECK(false, table.path, " has no entry point ", name,
              ": it was built without that kernel (OPSLOT_KERNELS_ONLY?) or is older than this "
              "opslot; rebuild kernels/");
}

void check_status(const KernelTable& table, int rc, const char* name) {
  TORCH_CHECK(rc == 0, "opslot cuda kernel ", name, " failed (", rc,
              "): ", table.opslot_last_error());
}

}  // namespace opslot_torch

// Makes the library at `path` the one every op calls (tables already handed out stay valid: a
// replaced table is never freed). 0 on success, else 1 with the reason in `error` (truncated to
// `error_size`). Thread-safe; a benchmark that swaps libraries must not launch meanwhile.
OPSLOT_TORCH_API int opslot_torch_use_library(const char* path, char* error, size_t error_size) {
  std::lock_guard<std::mutex> lock(opslot_torch::g_open_mutex);
  auto* table = new opslot_torch::KernelTable();
  std::string why = opslot_torch::open_table(path, table);
  if (!why.empty()) {
    delete table;
    std::snprintf(error, error_size, "%s", why.c_str());
    return 1;
  }
  opslot_torch::g_table.store(table, std::memory_order_release);
  return 0;
}

// The path of the kernel library in use ("" when none).
OPSLOT_TORCH_API const char* opslot_torch_library_path() {
  const opslot_torch::KernelTable* table = opslot_torch::g_table.load(std::memory_order_acquire);
  return table == nullptr ? "" : table->path.c_str();
}
