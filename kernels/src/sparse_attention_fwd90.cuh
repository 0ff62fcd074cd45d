// Sparse MQA attention's forward on Hopper (sm_90a, warpgroup MMA): the algorithm of
// fwd_mma_kernel (sparse_attention_fwd.cuh) with the products as wgmma from shared memory.
// sparse_attention.cu launches it on compute capability 9.0 for 16-bit inputs whose rows allow
// 16-byte copies; fwd_mma_kernel takes the rest.
//
// One CTA (two warpgroups) per query token and block of 64 heads. The query rows and a ring of
// three 32-key tiles sit in shared memory as 128-byte-swizzled 64-column blocks (wgmma_sm90.cuh),
// filled by 16-byte cp.async copies (skipped keys and the columns past Dqk zero; a tile's indices
// read a tile ahead). Per tile: warpgroup w computes S over its half of Dqk (m64n32k16, both
// operands from shared memory), the halves are added through shared memory in one order (both
// warpgroups hold the same S, bit for bit), both run the same online softmax, and warpgroup w adds
// P V for output columns 256 w .. +256 (m64n64k16, P from registers, V the tile read MN-major).
// Pipelined: a tile's P V and the next tile's S are issued together, and the next tile's softmax
// runs while P V is on the tensor cores. A tile without a valid key issues no MMA. Shapes: dv = 512
// (both models'; dv <= Dqk <= 576), every loop bound and MMA condition uniform, so that ptxas keeps
// the MMAs asynchronous (check: -Xptxas -v reports no C7510-C7520 serialization for it).
#pragma once

#include "sparse_attention_fwd.cuh"
#include "wgmma_sm90.cuh"

namespace opslot::sparse {
namespace {

constexpr int kWgThreads = 256;      // two warpgroups
constexpr int kWgStages = 3;         // key tiles in the ring
constexpr int kBlkQ = kRows * 128;   // one 64-column block of the query rows (bytes)
constexpr int kBlkK = kBk * 128;     // one 64-column block of a key tile (bytes)
constexpr int kSwap = 2 * 16 * 128;  // S partials: [warpgroup][register][thread] floats

// Shared-memory bytes of fwd_wgmma_kernel (1 KB of slack to align the tiles to 1024 bytes).
size_t fwd90_smem(const Dev& d) {
  const int nblk = d.dpad / 64;
  return 1024 + static_cast<size_t>(nblk) * (kBlkQ + kWgStages * kBlkK) + kSwap * sizeof(float) +
         (kWgStages * kBk + kWgThreads / 32) * sizeof(int);
}

// One row of a swizzled tile (blocks of `rows` rows, 1024-byte aligned): this thread's kChunks
// 16-byte chunks lk, lk + 8, ... of row `row` (the eight threads of a row take one 128-byte piece
// of it per copy), the chunks at or past `nvalid` and a row src == nullptr zero. cp.async; the
// caller commits and waits. sw: the thread's byte offset inside a block (row 128 + swizzled chunk).
// Where every chunk is valid (Dqk and dv multiples of 64: both models), each copy is one
// instruction with constant offsets from one pointer (a skipped row reads none of any_global's
// bytes, which hold at least 8 kChunks chunks); elsewhere a chunk past nvalid takes any_global as
// its address.
template <int kChunks>
__device__ __forceinline__ void load_row_sw(unsigned char* dst, int rows, int sw, int lk,
                                            int nvalid, const unsigned char* src,
                                            const void* any_global) {
  const uint32_t d = smem_u32(dst + sw);
  if (nvalid >= 8 * kChunks) {
    const unsigned char* base =
        (src != nullptr ? src : static_cast<const unsigned char*>(any_global)) + lk * 16;
#pragma unroll
    for (int m = 0; m < kChunks; ++m)
      cp16_or_zero(d + m * rows * 128, base + m * 128, src != nullptr);
    return;
  }
#pragma unroll
  for (int m = 0; m < kChunks; ++m) {
    const int c = lk + 8 * m;
    const bool on = src != nullptr && c < nvalid;
    cp16_or_zero(d + m * rows * 128, on ? static_cast<const void*>(src + c * 16) : any_global, on);
  }
}

// The tiles a query's list needs visited: [0, n) holds every valid index (in [0, T)); the -1 that
// end early queries' lists are not visited. Each thread of the CTA scans its share of the list
// (scan_last_valid: the warps' last valid slots into sLast[kWgThreads / 32]); after a barrier,
// tiles_to_visit gives n, warp-uniform as ptxas sees it (a shuffle), so that a loop to n keeps the
// MMAs inside it asynchronous.
__device__ __forceinline__ void scan_last_valid(const Dev& p, const int32_t* idx, int tid,
                                                int* sLast) {
  int last = -1;
  for (int64_t j = tid; j < p.K; j += kWgThreads) {
    if (key_in_range(p, idx[j]) >= 0) last = static_cast<int>(j);
  }
  last = __reduce_max_sync(0xffffffffu, last);
  if ((tid & 31) == 0) sLast[tid >> 5] = last;
}
__device__ __forceinline__ int tiles_to_visit(const int* sLast) {
  int last = sLast[0];
#pragma unroll
  for (int w = 1; w < kWgThreads / 32; ++w) last = max(last, sLast[w]);
  return __shfl_sync(0xffffffffu, last < 0 ? 0 : last / kBk + 1, 0);
}

// Warpgroup W's half of S = Q K^T (k-steps W KS .. W KS + KS - 1 of 16 columns) from the tiles
// whose descriptors' low words are dq and dk: the offsets are constants (descriptors advance in
// 16-byte units).
template <typename T, int KS, int W>
__device__ __forceinline__ void s_half(float (&s)[16], uint32_t dq, uint32_t dk) {
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    constexpr int kQ = kBlkQ / 16, kK = kBlkK / 16;
    const int ks = W * KS + k, sub = (ks & 3) * 2;
    sm90::wgmma_m64n32_ss<T>(s, sm90::desc_of(dq + (ks >> 2) * kQ + sub),
                             sm90::desc_of(dk + (ks >> 2) * kK + sub));
  }
}

// KS: k-steps of 16 columns per warpgroup, Dqk rounded up to 64 / 32 (16 or 18 for dv = 512).
template <typename T, int KS>
__global__ void __launch_bounds__(kWgThreads, 1)
    fwd_wgmma_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse) {
#if defined(OPSLOT_WGMMA)
  using namespace opslot::sm90;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int nblk = p.dpad / 64, nvalid = static_cast<int>(p.dqk / 8);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + nblk * kBlkQ;  // kWgStages tiles of nblk blocks
  float* sX = reinterpret_cast<float*>(sK + kWgStages * nblk * kBlkK);
  int* sIdx = reinterpret_cast<int*>(sX + kSwap);  // [kWgStages][kBk]

  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, lane = tid & 31;
  const int g = lane >> 2, qd = lane & 3, row0 = ((t >> 5) << 4) + g;  // rows row0, row0 + 8
  const int64_t qi = blockIdx.x;
  const QueryRows<T> rows(p, qi);
  const int h0 = blockIdx.y * kRows;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);

  // Copies: thread (lr = tid / 8, lk = tid % 8) loads row lr of a key tile (rows lr and lr + 32 of
  // the query block), chunks lk, lk + 8, ...
  const int lr = tid >> 3, lk = tid & 7, sw = lr * 128 + ((lk ^ (lr & 7)) << 4);
  static_assert(kWgThreads / 8 == kBk && kRows == 2 * kBk, "one key row per 8 threads");
  static_assert(KS % 2 == 0, "a row is KS / 2 chunks a thread (Dqk padded to 64 columns)");
  for (int half = 0; half < 2; ++half) {
    const int r = lr + half * kBk;
    const T* src = h0 + r < p.H ? rows.q + (h0 + r) * p.qs2 : nullptr;
    load_row_sw<KS / 2>(sQ, kRows, sw + half * kBk * 128, lk, nvalid,
                        reinterpret_cast<const unsigned char*>(src), rows.q);
  }
  // The index of row lr of a tile, read a tile ahead of its copies (raw: -1 past K; the range check
  // at the copy), so that its latency is not on the path of every tile.
  auto raw_index = [&](int tile) -> int {
    const int64_t j = static_cast<int64_t>(tile) * kBk + lr;
    return tile < ntiles && j < p.K ? rows.idx[j] : -1;
  };
  // Tile `tile`'s indices and its copies into its stage st (a tile past the last: indices -1, no
  // copies), one commit group either way. The stages are passed, not computed from the tile (a tile
  // is in stage tile % kWgStages: the loop rotates them).
  auto issue = [&](int tile, int st, int raw) {
    // key_in_range past the last tile, written out: the form of the measured kernel (key_in_range
    // itself compiles to other instructions here)
    const int id = tile < ntiles && raw >= 0 && raw < p.T ? raw : -1;
    if (lk == 0) sIdx[st * kBk + lr] = id;
    if (tile < ntiles)
      load_row_sw<KS / 2>(
          sK + st * nblk * kBlkK, kBk, sw, lk, nvalid,
          id >= 0 ? reinterpret_cast<const unsigned char*>(rows.kv + id * p.kvs1) : nullptr,
          rows.kv);
    cp_async_commit();
  };
  // Whether a tile has a valid key: a barrier, after which the copies the caller waited for are
  // visible to every thread and to the MMAs.
  auto tile_live = [&](int st) {
    fence_async_smem();
    return __syncthreads_or(tid < kBk && sIdx[st * kBk + tid] >= 0);
  };

  const int vb0 = wg * 4;
  const uint32_t dq0 = desc_lo(sQ);
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
  float o[4][32];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[i][e] = 0.f;
  float sn[16];              // S of the next tile, this warpgroup's half of Dqk
  uint32_t pa[kBk / 16][4];  // P of the current tile, A fragments
  auto fence_o_pa = [&] {    // O and P in program order around the MMAs' fences and waits
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) reg_fence(o[bb]);
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) reg_fence(pa[kk]);
  };
  // Zeroes sn, then issues the MMAs of this warpgroup's half of S = Q K^T for a tile with a valid
  // key (`live`, a barrier's result: __any_sync shows ptxas it is warp-uniform, else it serializes
  // the MMAs), then commits; the caller waits.
  auto issue_s = [&](int st, int live) {
#pragma unroll
    for (int e = 0; e < 16; ++e) sn[e] = 0.f;
    reg_fence(sn);
    fence_o_pa();
    wg_fence();
    const uint32_t dk0 = desc_lo(sK + st * nblk * kBlkK);
    if (__any_sync(0xffffffffu, live && wg == 0))
      s_half<T, KS, 0>(sn, dq0, dk0);
    else if (__any_sync(0xffffffffu, live))
      s_half<T, KS, 1>(sn, dq0, dk0);
    wg_commit();
  };
  // The softmax of the tile whose S is in sn, the halves added through shared memory in one order
  // (both warpgroups hold the same bits): P into pa, the running max and sum updated, and O
  // rescaled once `o_ready` has waited for its MMAs. A tile without a valid key (sn zero, every
  // index -1) leaves the state as it is, bit for bit (alpha 1, P 0).
  auto softmax_s = [&](int st, auto&& o_ready) {
    reg_fence(sn);
#pragma unroll
    for (int e = 0; e < 16; ++e) sX[(wg * 16 + e) * 128 + t] = sn[e];
    __syncthreads();
    float sc[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) sc[e] = sX[e * 128 + t] + sX[(16 + e) * 128 + t];  // S0 + S1
    float alpha[2];
    softmax_tile(sc, sIdx + st * kBk, p.scale_log2, qd, m_run, l_run, alpha);
    uint32_t pn[kBk / 16][4];  // not pa: the current tile's P V may still read it
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      pn[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
      pn[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
      pn[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
      pn[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
    o_ready();
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // x * 1 is x: the same bits
#pragma unroll
      for (int bb = 0; bb < 4; ++bb)
#pragma unroll
        for (int e = 0; e < 32; ++e) o[bb][e] *= alpha[(e >> 1) & 1];
    }
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) pa[kk][j] = pn[kk][j];
  };

  // The P V of the tile in stage st for this warpgroup's 256 output columns (P in pa), issued and
  // committed.
  auto issue_pv = [&](int st, int live) {
    fence_o_pa();
    wg_fence();
    if (__any_sync(0xffffffffu, live)) {
      const uint32_t dk0 = desc_lo(sK + st * nblk * kBlkK) + vb0 * (kBlkK / 16);
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk)
#pragma unroll
        for (int bb = 0; bb < 4; ++bb)
          wgmma_m64n64_rs<T>(o[bb], pa[kk], desc_of(dk0 + bb * (kBlkK / 16) + kk * (2048 / 16)));
    }
    wg_commit();
  };

  // Tile it's P V runs on the tensor cores while tile it + 1's S halves are added and its softmax
  // runs. The ring holds tiles it, it + 1 and it + 2 (landing); tile it + 3 takes tile it's stage
  // once every warpgroup's P V of tile it is complete. Only the tiles up to the last with a valid
  // key are visited (the -1 that end early queries' lists cost nothing): each thread scans its
  // share of the indices while the first copies land.
  issue(0, 0, raw_index(0));  // with the query rows
  issue(1, 1, raw_index(1));
  issue(2, 2, raw_index(2));
  int next = raw_index(3);
  int* sLast = sIdx + kWgStages * kBk;  // the last valid slot, per warp
  scan_last_valid(p, rows.idx, tid, sLast);
  cp_async_wait<2>();  // the query rows and tile 0
  int live = tile_live(0);
  const int nlive = tiles_to_visit(sLast);  // tiles visited
  issue_s(0, live);
  wg_wait<0>();
  softmax_s(0, [] {});
  cp_async_wait<1>();  // tile 1
  int live_next = tile_live(1);
  int s0 = 0, s1 = 1, s2 = 2;  // the stages of tiles it, it + 1 and it + 2
  for (int it = 0; it + 1 < nlive; ++it) {
    issue_s(s1, live_next);
    issue_pv(s0, live);
    wg_wait<1>();  // S of tile it + 1
    softmax_s(s1, [&] {
      wg_wait<0>();  // P V of tile it
      fence_o_pa();
    });
    cp_async_wait<0>();  // tile it + 2
    live = live_next;
    live_next = tile_live(s2);
    issue(it + 3, s0, next);  // into tile it's stage
    next = raw_index(it + 4);
    const int done = s0;
    s0 = s1;
    s1 = s2;
    s2 = done;
  }
  if (nlive > 0) {  // the last tile's P V (stage s0)
    issue_pv(s0, live);
    wg_wait<0>();
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) reg_fence(o[bb]);
  }
  cp_async_wait<0>();  // no tile at all (K = 0): the query rows' copies are still in flight

  // Normalisation (with the sink in the denominator) and lse; every thread for its two rows.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + 8 * i, h = h0 + r;
    if (h >= p.H) continue;
    float l2 = 0.f;
    const float fac = finish_row(p, h, m_run[i], l_run[i], l2);
    if (wg == 0 && qd == 0) lse[qi * p.H + h] = l2;
    T* orow = out + (qi * p.H + h) * p.dv;
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = (vb0 + bb) * 64 + j * 8 + 2 * qd;
        const float v0 = o[bb][4 * j + 2 * i] * fac, v1 = o[bb][4 * j + 2 * i + 1] * fac;
        st_pair(orow + c, v0, v1);
      }
    }
  }
#endif
}

}  // namespace
}  // namespace opslot::sparse
