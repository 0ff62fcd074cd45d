// Every C entry point of libopslot_kernels.so (all production headers; not bench.h), as the torch
// ops of libopslot_torch.so call them: the one declarative table of the boundary. Each X(name)
// becomes a function pointer of the type the header declares (decltype of the prototype), so a
// binding that disagrees with a header does not compile;
// runtime/tests/test_kernel_library_symbols.py checks the list against the headers and the
// library's exports.
//
// The kernel library is opened with dlopen at the path opslot chooses (opslot_torch_use_library,
// called from runtime/opslot/kernels/cuda/_lib.py): the same library the rest of opslot uses, and
// the benchmark library when a benchmark swaps it in.
#ifndef OPSLOT_TORCH_KERNEL_TABLE_H_
#define OPSLOT_TORCH_KERNEL_TABLE_H_

#include <string>

#include "opslot_kernels/causal_conv1d.h"
#include "opslot_kernels/common.h"
#include "opslot_kernels/cross_entropy.h"
#include "opslot_kernels/dsa_indexer.h"
#include "opslot_kernels/gated_delta_rule.h"
#include "opslot_kernels/load_balancing.h"
#include "opslot_kernels/mask_limit.h"
#include "opslot_kernels/mhc.h"
#include "opslot_kernels/moe.h"
#include "opslot_kernels/rms_norm.h"
#include "opslot_kernels/rope.h"
#include "opslot_kernels/sparse_attention.h"
#include "opslot_kernels/sparse_mha.h"
#include "opslot_kernels/swiglu.h"
#include "opslot_kernels/topk.h"

#define OPSLOT_KERNEL_ENTRY_POINTS(X)        \
  X(opslot_abi_version)                      \
  X(opslot_last_error)                       \
  X(opslot_build_info)                       \
  X(opslot_check_device)                     \
  X(opslot_causal_conv1d_fwd)                \
  X(opslot_causal_conv1d_bwd_scratch_floats) \
  X(opslot_causal_conv1d_bwd)                \
  X(opslot_causal_conv1d_relayout)           \
  X(opslot_causal_conv1d_update)             \
  X(opslot_ce_rows)                          \
  X(opslot_ce_scale_inplace)                 \
  X(opslot_dsa_index_scores)                 \
  X(opslot_gdr_max_chunks)                   \
  X(opslot_gdr_workspace_bytes)              \
  X(opslot_gdr_fwd)                          \
  X(opslot_gdr_bwd)                          \
  X(opslot_load_balancing_scratch_floats)    \
  X(opslot_load_balancing_fwd)               \
  X(opslot_load_balancing_bwd)               \
  X(opslot_mask_limit)                       \
  X(opslot_mhc_split3)                       \
  X(opslot_mhc_collapse_fwd)                 \
  X(opslot_mhc_comb_fwd)                     \
  X(opslot_mhc_comb_bwd)                     \
  X(opslot_mhc_collapse_bwd)                 \
  X(opslot_mhc_token_sums)                   \
  X(opslot_mhc_dx)                           \
  X(opslot_mhc_dx_dfn_fits)                  \
  X(opslot_mhc_dx_dfn_scratch_floats)        \
  X(opslot_mhc_dx_dfn)                       \
  X(opslot_mhc_post_fwd)                     \
  X(opslot_mhc_post_bwd)                     \
  X(opslot_moe_route_scratch)                \
  X(opslot_moe_route)                        \
  X(opslot_moe_scatter_rows)                 \
  X(opslot_moe_gather_sum)                   \
  X(opslot_moe_act_forward)                  \
  X(opslot_moe_act_backward)                 \
  X(opslot_moe_segment_sum_scratch)          \
  X(opslot_moe_segment_sum)                  \
  X(opslot_moe_gmm_rows)                     \
  X(opslot_moe_gmm_wgrad)                    \
  X(opslot_moe_zero_tail_rows)               \
  X(opslot_rms_norm_fwd)                     \
  X(opslot_rms_norm_bwd_partial_rows)        \
  X(opslot_rms_norm_bwd)                     \
  X(opslot_rope)                             \
  X(opslot_rope_interleaved)                 \
  X(opslot_rope_vision)                      \
  X(opslot_rope_deepseek_v4)                 \
  X(opslot_sparse_mqa_fwd)                   \
  X(opslot_sparse_mqa_bwd_head_blocks)       \
  X(opslot_sparse_mqa_bwd_w_dtype)           \
  X(opslot_sparse_mqa_bwd_queries)           \
  X(opslot_sparse_mqa_bwd_reduce)            \
  X(opslot_sparse_mqa_dsink_reduce)          \
  X(opslot_sparse_mqa_mask_indices)          \
  X(opslot_sparse_mha_scratch_floats)        \
  X(opslot_sparse_mha_fwd)                   \
  X(opslot_silu_mul_fwd)                     \
  X(opslot_silu_mul_bwd)                     \
  X(opslot_silu_mul_clamped_fwd)             \
  X(opslot_silu_mul_clamped_bwd)             \
  X(opslot_topk_indices)

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

// Raises RuntimeError naming the entry point the library lacks (a build with OPSLOT_KERNELS_ONLY,
// or one older than this opslot).
[[noreturn]] void missing_entry(const KernelTable& table, const char* name);

template <typename F>
F require_entry(F fn, const KernelTable& table, const char* name) {
  if (fn == nullptr) missing_entry(table, name);
  return fn;
}

}  // namespace opslot_torch

// The entry point `name` of `table` (an error when the library lacks it).
#define OPSLOT_ENTRY(table, name) (::opslot_torch::require_entry((table).name, (table), #name))
// Calls entry point `name` of `table`; raises with the library's message unless it returns 0.
#define OPSLOT_LAUNCH(table, name, ...) \
  ::opslot_torch::check_status((table), OPSLOT_ENTRY(table, name)(__VA_ARGS__), #name)

namespace opslot_torch {}  // namespace opslot_torch

#endif  // OPSLOT_TORCH_KERNEL_TABLE_H_
