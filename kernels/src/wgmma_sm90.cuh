// Warpgroup MMA (wgmma, sm_90a) helpers of the Hopper kernels (sparse_attention_fwd90.cuh,
// _bwd90.cuh): the shared-memory matrix descriptor of 128-byte-swizzled tiles, the MMA shapes the
// kernels use, and the fences. Compiled to code only where __CUDA_ARCH_FEAT_SM90_ALL is defined
// (the sm_90a pass); OPSLOT_WGMMA says so to the kernels, whose bodies are empty in the other
// passes.
//
// Tile layout (both operands): rows of 64 16-bit elements, 128 bytes each, in 64-column blocks;
// the 16-byte chunk c of row r is stored at chunk c ^ (r % 8) (the 128-byte swizzle), groups of
// 8 rows are 1024 bytes apart, every block 1024-byte aligned. The same tile is a K-major operand
// (rows = M or N, the 64 columns = K: S = Q K^T) and an MN-major one (rows = K, columns = M or N:
// O += P V, dkv^T = Q^T dS).
//
// Accumulators of m64nN (fp32, N / 2 registers per thread): warp w of the warpgroup holds rows
// 16 w .. 16 w + 15; register 4 j + e holds row 16 w + lane / 4 + 8 (e / 2), column 8 j + 2 (lane
// % 4) + e % 2, the mma.sync m16n8 layout stacked over N. A from registers (m64k16): the mma.sync
// m16n8k16 A fragment of the warp's 16 rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "mma_sm80.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPSLOT_WGMMA 1
#endif

namespace opslot::sm90 {

// Descriptor of a 128-byte-swizzled tile at p (p inside a 1024-byte-aligned block, at most 96 bytes
// past a row start: a k-step's offset): groups of 8 rows 1024 bytes apart. Both byte offsets are
// set to 1024; the shapes below stay inside one 64-column block, where the leading offset (K-major:
// unused; MN-major: the stride between 64-column blocks) does not come into play.
//
// In two words: desc_lo(p), the start address (14 bits, 16-byte units) and the leading offset, and
// a high word the same for every tile. A kernel keeps a tile's low word and adds its k-steps'
// offsets (16-byte units) to it: the address field holds all of shared memory, so no carry leaves
// it, and a 32-bit add replaces the 64-bit arithmetic (with the sign extension of an int offset)
// that ptxas emits around every MMA for `desc + offset`.
__device__ __forceinline__ uint32_t desc_lo(const void* p) {
  return ((smem_u32(p) & 0x3FFFF) >> 4) | (uint32_t{1024 >> 4} << 16);
}
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) {
  return (uint64_t{(1024 >> 4) | (1u << 30)} << 32) | lo;
}
__device__ __forceinline__ uint64_t desc_sw128(const void* p) { return desc_of(desc_lo(p)); }

// Byte offset of element (row, col) in a 128-byte-swizzled tile (col < 64).
__device__ __forceinline__ int sw_off(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

// Barrier of warpgroup wg's 128 threads (named barrier 1 + wg; 0 is __syncthreads').
__device__ __forceinline__ void bar_wg(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by the generic proxy (st.shared, cp.async) becomes visible to wgmma.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins registers in program order around the asm above: before wg_fence (what wgmma reads is
// written first) and after wg_wait (accumulators are read only once complete).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define OPSLOT_WGMMA_SS_M64N32(TY, TA)                                                            \
  asm volatile(                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, " \
      "1, " TA ", 0;\n}\n"                                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),       \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),   \
        "+f"(d[14]), "+f"(d[15])                                                                  \
      : "l"(da), "l"(db), "r"(1))

// d (64 x 32) += A (64 x 16) * B (16 x 32, K-major tile: 32 rows of 16 elements); A a K-major tile
// (64 rows of 16 elements) or, kMnA, an MN-major one (16 rows of 64 elements: the transpose of a
// K-major tile's 64-column block).
template <typename T, bool kMnA = false>
__device__ __forceinline__ void wgmma_m64n32_ss(float (&d)[16], uint64_t da, uint64_t db) {
#if defined(OPSLOT_WGMMA)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (kMnA) {
      OPSLOT_WGMMA_SS_M64N32("bf16", "1");
    } else {
      OPSLOT_WGMMA_SS_M64N32("bf16", "0");
    }
  } else {
    if constexpr (kMnA) {
      OPSLOT_WGMMA_SS_M64N32("f16", "1");
    } else {
      OPSLOT_WGMMA_SS_M64N32("f16", "0");
    }
  }
#endif
}

#define OPSLOT_WGMMA_RS_M64N64(TY, TB)                                                             \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                      \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, "   \
      "%36, p, 1, 1, " TB ";\n}\n"                                                                 \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

// d (64 x 64) += A (64 x 16, registers) * B (16 x 64, MN-major tile: 16 rows of 64 elements; or,
// kKB, a K-major tile: 64 rows of 16 elements).
template <typename T, bool kKB = false>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t (&a)[4],
                                                uint64_t db) {
#if defined(OPSLOT_WGMMA)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (kKB) {
      OPSLOT_WGMMA_RS_M64N64("bf16", "0");
    } else {
      OPSLOT_WGMMA_RS_M64N64("bf16", "1");
    }
  } else {
    if constexpr (kKB) {
      OPSLOT_WGMMA_RS_M64N64("f16", "0");
    } else {
      OPSLOT_WGMMA_RS_M64N64("f16", "1");
    }
  }
#endif
}

#define OPSLOT_WGMMA_RS_M64N32(TY)                                                                \
  asm volatile(                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, " \
      "%19}, %20, p, 1, 1, 1;\n}\n"                                                               \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),       \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),   \
        "+f"(d[14]), "+f"(d[15])                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

// d (64 x 32) += A (64 x 16, registers) * B (16 x 32, MN-major tile: 16 rows of 32 elements, the
// first or the second half of a 64-column block: the swizzle is a function of the address, so a
// descriptor 64 bytes into the rows reads the second half).
template <typename T>
__device__ __forceinline__ void wgmma_m64n32_rs(float (&d)[16], const uint32_t (&a)[4],
                                                uint64_t db) {
#if defined(OPSLOT_WGMMA)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    OPSLOT_WGMMA_RS_M64N32("bf16");
  } else {
    OPSLOT_WGMMA_RS_M64N32("f16");
  }
#endif
}

// TR: the transpose flags of A and B ("1, 1" both MN-major, "0, 0" both K-major).
#define OPSLOT_WGMMA_SS_M64N64(TY, TR)                                                             \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                      \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, " TR   \
      ";\n}\n"                                                                                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "l"(da), "l"(db), "r"(1))

// d (64 x 64) += A (64 x 16) * B (16 x 64), both K-major tiles (64 rows of 16 elements) or, kMn,
// both MN-major (16 rows of 64 elements).
template <typename T, bool kMn = false>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t da, uint64_t db) {
#if defined(OPSLOT_WGMMA)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (kMn) {
      OPSLOT_WGMMA_SS_M64N64("bf16", "1, 1");
    } else {
      OPSLOT_WGMMA_SS_M64N64("bf16", "0, 0");
    }
  } else {
    if constexpr (kMn) {
      OPSLOT_WGMMA_SS_M64N64("f16", "1, 1");
    } else {
      OPSLOT_WGMMA_SS_M64N64("f16", "0, 0");
    }
  }
#endif
}

#undef OPSLOT_WGMMA_SS_M64N32
#undef OPSLOT_WGMMA_SS_M64N64
#undef OPSLOT_WGMMA_RS_M64N32
#undef OPSLOT_WGMMA_RS_M64N64

}  // namespace opslot::sm90
