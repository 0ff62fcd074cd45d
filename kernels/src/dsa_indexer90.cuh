// The lightning indexer's scores on Hopper (sm_90a, warpgroup MMA): scores_wgmma_kernel, the
// algorithm of scores_mma_kernel (dsa_indexer_mma.cuh) with the dot products as wgmma, the same
// bits. dsa_indexer.cu launches it on compute capability 9.0 for 16-bit inputs whose head dim
// takes 8 k-steps (113 to 128) and whose padded heads fill a query block with whole queries (Hp
// 16, 32, 64 or 128): GLM-5's and DeepSeek-V4's shapes.
//
// A CTA is kGroups query blocks of the mma.sync kernel, one per warpgroup (queries s0, s0 + qb,
// .. on, the latest first), sharing a ring of four 64-key tiles in shared memory (128-byte-swizzled
// 64-column blocks, wgmma_sm90.cuh; 16-byte cp.async copies, columns past D and keys past T zero),
// up to the largest limit of the CTA's queries. A warpgroup's query rows stay in shared memory as
// two m64 tiles of the same layout (both operands K-major): m64 tile mt is the m16 tiles mt of
// the mma.sync kernel's four warps (rows 16 w .. 16 w + 15 of it are that kernel's m16 tile
// 2 w + mt), so one m64n64k16 per k-step and m64 tile gives warp w the accumulators of the mma.sync
// kernel's warp w for that tile (the m16n8 layout stacked over n), the same products added in the
// same k order. The epilogue is the mma.sync kernel's steps (head_terms, tile_rows), each
// warpgroup for its own queries. With both operands in shared memory a thread holds no query
// fragments (64 registers in the A-from-registers form), so four warpgroups fit an SM (126
// registers, 201 KB of shared memory): each key tile read from L2 serves 512 query rows, and each
// scheduler has four warps to issue from. The descriptors' base words are warp-uniform values
// (__shfl_sync), which ptxas keeps in uniform registers.
//
// Pipelined: the two m64 tiles' MMAs are separate groups; while one tile's MMAs run, the other's
// epilogue does, and the next key tile's MMAs of a tile are issued as soon as its accumulators are
// read. One CTA barrier per key tile (the ring); a warpgroup barrier where a query's rows span
// warps (Hp 64 and 128: DeepSeek-V4), none for Hp 16 and 32 (GLM-5).
#pragma once

#include <type_traits>

#include "dsa_indexer_mma.cuh"
#include "wgmma_sm90.cuh"

namespace opslot::dsa {
namespace {

constexpr int kWgStages = 4;            // key tiles in the ring
constexpr int kWgKSteps = 8;            // k-steps: head dims of 113 to 128
constexpr int kKeyBlock = kKeys * 128;  // one 64-column block of a key tile (bytes)
// A key tile: 64 keys x 128 columns (two 64-column blocks); an m64 query tile has the same layout.
constexpr int kKeyTile = 2 * kKeyBlock;
constexpr int kWgGroups = 4;  // production's warpgroups a CTA (the bench library: 2 to 4)

// Shared memory of a CTA of g warpgroups: the ring, each warpgroup's two m64 query tiles, row
// sums and limits, and slack to align the tiles to 1024 bytes.
constexpr size_t wg_smem(int g) {
  return 1024 + kWgStages * kKeyTile +
         g * (2 * kKeyTile + sizeof(float) * kMTiles * kKeys + sizeof(int) * kMTiles);
}

// scores_wgmma_kernel takes the shape: 8 k-steps, whole queries in a query block.
bool wgmma_shape(const MmaParams& p) { return p.ksteps == kWgKSteps && kMTiles % p.tpq == 0; }

// Warpgroup MMAs of an m64 tile for one key tile: d = the m64 query tile (its two 64-column
// blocks from the descriptor's low word dq) times the key tile's keys (dk), issued and committed;
// the caller waits.
template <typename T>
__device__ __forceinline__ void issue_tile(float (&d)[32], uint32_t dq, uint32_t dk) {
  using namespace opslot::sm90;
  // Zeros as separate definitions: a zero register shared by both tiles' accumulators (the
  // compiler's choice for `d[e] = 0.f`) is an operand of MMAs in flight, and ptxas then waits for
  // them before the other tile's MMAs (C7517/C7520).
#pragma unroll
  for (int e = 0; e < 32; ++e) asm volatile("mov.b32 %0, 0;\n" : "=f"(d[e]));
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < kWgKSteps; ++ks) {
    const uint32_t off = (ks >> 2) * (kKeyBlock / 16) + (ks & 3) * 2;
    wgmma_m64n64_ss<T>(d, desc_of(dq + off), desc_of(dk + off));
  }
  wg_commit();
}

template <typename T, int kGroups>
__global__ void __launch_bounds__(kGroups* kThreads, 1) scores_wgmma_kernel(const MmaParams p) {
#if defined(OPSLOT_WGMMA)
  using namespace opslot::sm90;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sK = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // the ring
  unsigned char* sQ = sK + kWgStages * kKeyTile;  // [warpgroup][m64 tile][kKeyTile bytes]
  float* sPart = reinterpret_cast<float*>(sQ + kGroups * 2 * kKeyTile);   // [warpgroup][..]
  int* sLim = reinterpret_cast<int*>(sPart + kGroups * kMTiles * kKeys);  // [warpgroup][kMTiles]

  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = tid & 31;
  const int64_t b = blockIdx.y;
  const int64_t ctas = (p.blocks + kGroups - 1) / kGroups;  // a query block a warpgroup
  const int64_t s0 = (kGroups * (ctas - 1 - static_cast<int64_t>(blockIdx.x)) + wg) * p.qb;
  unsigned char* myQ = sQ + wg * 2 * kKeyTile;
  float* myPart = sPart + wg * kMTiles * kKeys;
  int* myLim = sLim + wg * kMTiles;
  const T* k = static_cast<const T*>(p.k);

  block_limits(p, b, s0, t, myLim);
  // Query row r (m16 tile r / 16 = 2 w + mt) to row 16 w + r % 16 of m64 tile mt.
  block_queries<T>(p, b, s0, t, kThreads, [myQ](int r, int c) {
    const int tile = r >> 4, row = (tile >> 1) * 16 + (r & 15);
    return myQ + (tile & 1) * kKeyTile + (c >> 3) * kKeyBlock + row * 128 +
           (((c & 7) ^ (row & 7)) << 4);
  });
  cp_async_commit();
  __syncthreads();  // sLim
  int lmax = 0;
  for (int g = 0; g < kGroups; ++g)
    for (int i = 0; i < p.qb; ++i) lmax = max(lmax, sLim[g * kMTiles + i]);
  // warp-uniform as ptxas sees it: a loop to ntiles keeps the MMAs inside it asynchronous
  const int ntiles = __shfl_sync(0xffffffffu, (lmax + kKeys - 1) / kKeys, 0);

  // Key tile `tile` into its stage, one commit group (empty past the last tile): thread (lr, lk)
  // of the first kCopiers copies chunks lk and lk + 8 of rows lr (and lr + 32 where they are 256),
  // each warp instruction four whole rows of a 64-column block. Called for tiles 0, 1, 2, ... in
  // turn: the source pointer advances a tile a call (the copies' addresses recomputed from the
  // strides took ~110 instructions a tile).
  constexpr int kCopiers = kGroups >= 4 ? 512 : 256, kHalves = 512 / kCopiers;
  const bool copier = tid < kCopiers;
  const int lr = tid >> 3, lk = tid & 7, live_pieces = p.D / 8;
  const bool live_c0 = lk < live_pieces, live_c1 = lk + 8 < live_pieces;
  const T* ksrc = k + b * p.ks0 + lr * p.ks1 + lk * 8;  // the next tile's row lr, chunk lk
  const int64_t kstep = kKeys * p.ks1, khalf = 32 * p.ks1, krows = p.T - lr;
  const int sw = lr * 128 + ((lk ^ (lr & 7)) << 4);  // rows lr and lr + 32: the same swizzle
  auto load_keys = [&](int tile) {
    if (copier && tile < ntiles) {
      unsigned char* dst = sK + (tile % kWgStages) * kKeyTile + sw;
      const int64_t t0 = static_cast<int64_t>(tile) * kKeys;
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        const bool live_r = t0 + 32 * half < krows;
        const T* row = ksrc + half * khalf;
        const bool l0 = live_r && live_c0, l1 = live_r && live_c1;
        cp16_or_zero(dst + half * 32 * 128, l0 ? row : k, l0);
        cp16_or_zero(dst + half * 32 * 128 + kKeyBlock, l1 ? row + 64 : k, l1);
      }
      ksrc += kstep;
    }
    cp_async_commit();
  };
  for (int tile = 0; tile < kWgStages - 1; ++tile) load_keys(tile);
  cp_async_wait<kWgStages - 2>();  // the query rows and tile 0
  fence_async_smem();
  __syncthreads();

  const int tile0 = 2 * warp;
  float wt[2][2];
  warp_weights(p, b, s0, warp, lane, wt);
  // The descriptors' words as warp-uniform values: ptxas then keeps the query tiles' in uniform
  // registers (the key stage's still move there per MMA)
  const uint32_t dq0 = __shfl_sync(0xffffffffu, desc_lo(myQ), 0), dq1 = dq0 + kKeyTile / 16;
  const uint32_t dk0 = __shfl_sync(0xffffffffu, desc_lo(sK), 0);
  auto stage = [&](int tile) { return dk0 + (tile % kWgStages) * (kKeyTile / 16); };

  if (ntiles == 0) {  // every query of the CTA without keys
    cp_async_wait<0>();
    write_past(p, b, s0, 0, t, kThreads);
    return;
  }
  float acc0[32], acc1[32];  // m64 tiles 0 and 1
  float v[2][8][2];
  issue_tile<T>(acc0, dq0, stage(0));
  wg_wait<0>();
  // Key tile j's epilogue, its m64 tile 1's MMAs running during tile 0's terms, and (kNext) tile
  // j + 1's m64 tile 0 MMAs during the rest. No MMA is in flight from one step to the next (ptxas
  // serializes MMAs whose accumulators it cannot follow across the loop: C7514), and none sits in
  // a branch (C7520): the last step is its own instance.
  auto step = [&](int j, auto next) {
    constexpr bool kNext = decltype(next)::value;
    // Tile j + 1 has landed; every thread is past tile j - 1 (its MMAs waited, its row sums read
    // where a query spans warps), whose stage takes tile j + 3.
    cp_async_wait<kWgStages - 3>();
    fence_async_smem();
    __syncthreads();
    load_keys(j + 3);
    issue_tile<T>(acc1, dq1, stage(j));
    reg_fence(acc0);
    head_terms(*reinterpret_cast<const float(*)[8][4]>(acc0), wt[0], v[0]);
    if constexpr (kNext) {
      issue_tile<T>(acc0, dq0, stage(j + 1));
      wg_wait<1>();  // m64 tile 1
    } else {
      wg_wait<0>();
    }
    reg_fence(acc1);
    head_terms(*reinterpret_cast<const float(*)[8][4]>(acc1), wt[1], v[1]);
    tile_rows<false>(p, b, s0, j, v, true, tile0, lane, t, kThreads, myLim, myPart,
                     [wg] { bar_wg(wg); });
    if constexpr (kNext) wg_wait<0>();  // m64 tile 0 of tile j + 1
  };
  for (int j = 0; j + 1 < ntiles; ++j) step(j, std::true_type{});
  step(ntiles - 1, std::false_type{});
  cp_async_wait<0>();  // the empty groups of the tiles past the last
  write_past(p, b, s0, ntiles, t, kThreads);
#endif
}

}  // namespace
}  // namespace opslot::dsa
