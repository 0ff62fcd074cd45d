// The C entry points of libopslot_kernels.so that the torch ops of libopslot_torch.so call: the
// one declarative table of the boundary. Each X(name) becomes a function pointer of the type the
// header declares (decltype of the prototype), so a binding that disagrees with a header does not
// compile; runtime/tests/test_kernel_library_symbols.py checks the list against the headers and
// the library's exports.
//
// The kernel library is opened with dlopen at the path opslot chooses (opslot_torch_use_library,
// called from runtime/opslot/kernels/cuda/_lib.py): the same library the rest of opslot uses, and
// the benchmark library when a benchmark swaps it in.
#ifndef OPSLOT_TORCH_KERNEL_TABLE_H_
#define OPSLOT_TORCH_KERNEL_TABLE_H_

#include <string>

#include "opslot_kernels/common.h"
#include "opslot_kernels/load_balancing.h"
#include "opslot_kernels/rms_norm.h"
#include "opslot_kernels/rope.h"
#include "opslot_kernels/swiglu.h"

#define OPSLOT_KERNEL_ENTRY_POINTS(X)     \
  X(opslot_abi_version)                   \
  X(opslot_last_error)                    \
  X(opslot_check_device)                  \
  X(opslot_rms_norm_fwd)                  \
  X(opslot_rms_norm_bwd_partial_rows)     \
  X(opslot_rms_norm_bwd)                  \
  X(opslot_rope)                          \
  X(opslot_silu_mul_fwd)                  \
  X(opslot_silu_mul_bwd)                  \
  X(opslot_load_balancing_scratch_floats) \
  X(opslot_load_balancing_fwd)            \
  X(opslot_load_balancing_bwd)

namespace opslot_torch {

// One opened kernel library: its entry points and path. Immutable once published.
struct KernelTable {
#define OPSLOT_TABLE_FIELD(name) decltype(&::name) name = nullptr;
  OPSLOT_KERNEL_ENTRY_POINTS(OPSLOT_TABLE_FIELD)
#undef OPSLOT_TABLE_FIELD
  std::string path;
};

// The table in use; raises (RuntimeError) when opslot has not opened a kernel library.
const KernelTable& kernels();

// Raises RuntimeError "opslot cuda kernel <name> failed (<rc>): <library message>" unless rc == 0.
void check_status(const KernelTable& table, int rc, const char* name);

}  // namespace opslot_torch

#endif  // OPSLOT_TORCH_KERNEL_TABLE_H_
