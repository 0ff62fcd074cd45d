// An experiment of the bench library (opslot_sparse_mqa_set_tuning bit 2; never in the production
// library): bwd_wgmma_kernel (sparse_attention_bwd90.cuh) pipelined across key tiles. The same
// products in the same order, so the same bits are expected; built, not yet run on a GPU
// (docs/kernels.md, sparse_mqa_attention: "Not done"). Two changes:
// - the key tile's descriptor word passes through __shfl_sync once a tile, so that ptxas holds it
// in
//   a uniform register (the production kernel moves a 64-bit descriptor from vector registers,
//   R2UR, at every S and dP MMA: 173 R2UR in the kernel at Dqk 576, 7 here);
// - tile it + 1's S and dP are issued right after tile it's last dkv block's MMAs, and run on the
//   tensor cores while that block's rows are stored. The loop starts at tile -1, which only issues
//   tile 0's S and dP.
// What ptxas needs to keep the MMAs asynchronous (each found from its -Xptxas -v message): no MMA
// in flight across the loop's back edge and no accumulator in flight where two branches merge
// (C7514: the two warpgroups' last blocks have one form, warpgroup 1's block 8 comes first); an
// accumulator's zeros, and dq's, written before the fence of the groups in flight beside them
// (C7515); only MMAs inside a branch, never its wait or store (C7520).
// 226 KB of shared memory at Dqk 576, as bwd_wgmma_kernel; 244 registers at Dqk 576, 223 at 512.
#pragma once

#include "sparse_attention_bwd90.cuh"

namespace opslot::sparse {
namespace {

// KS: k-steps of 16 columns of Dqk (32 or 36).
template <int KS>
__global__ void __launch_bounds__(kWgThreads, 1)
    bwd_wgmma_pipe_kernel(const Dev p, const __nv_bfloat16* __restrict__ dout,
                          const __nv_bfloat16* __restrict__ outp, const float* __restrict__ lse,
                          int64_t q_begin, __nv_bfloat16* __restrict__ dq,
                          __nv_bfloat16* __restrict__ wout, float* __restrict__ dsink_part) {
#if defined(OPSLOT_WGMMA)
  using T = __nv_bfloat16;
  using namespace opslot::sm90;
  constexpr int NB = KS / 4;  // 64-column blocks of Dqk
  // dq: warpgroup w the 32-column halves [w NB, (w + 1) NB) of the blocks (Dqk 576: four and a half
  // blocks each); dkv: below
  constexpr int NVB = 8;  // dv = 512
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sdO = sQ + NB * kBlkQ;
  unsigned char* sK = sdO + NVB * kBlkQ;  // kBwdStages tiles of NB blocks
  // Two 8 KB regions: sPt holds dP, then P^T and warpgroup 0's dkv staging; sX holds S, then dS^T
  // (sdSt) and warpgroup 1's staging.
  unsigned char* sPt = sK + kBwdStages * NB * kBlkK;
  float* sX = reinterpret_cast<float*>(sPt + 2 * kTileT);
  unsigned char* sdSt = reinterpret_cast<unsigned char*>(sX);
  float* sLse2 = sX + kXchg;
  float* sDelta = sLse2 + kRows;
  int* sIdx = reinterpret_cast<int*>(sDelta + kRows);  // [kBwdStages][kBk]

  // wg through a shuffle: the compiler sees it uniform in a warp, so the wgmma in the warpgroup's
  // branches below stay asynchronous
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), t = tid & 127;
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3, row0 = ((t >> 5) << 4) + g;  // rows row0, row0 + 8
  const int64_t qi = q_begin + blockIdx.x;
  const QueryRows<T> rows(p, qi);
  const int hb = blockIdx.y, h0 = hb * kRows, nhb = gridDim.y;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);
  const int nvalid = static_cast<int>(p.dqk / 8);

  // Copies as in fwd_wgmma_kernel: thread (lr, lk) loads rows lr and lr + 32 of Q and dO, row lr of
  // a key tile, chunks lk, lk + 8, ...
  const int lr = tid >> 3, lk = tid & 7, sw = lr * 128 + ((lk ^ (lr & 7)) << 4);
  for (int half = 0; half < 2; ++half) {
    const int r = lr + half * kBk, h = h0 + r;
    const T* q = h < p.H ? rows.q + h * p.qs2 : nullptr;
    const T* o = h < p.H ? dout + (qi * p.H + h) * p.dv : nullptr;
    load_row_sw<NB>(sQ, kRows, sw + half * kBk * 128, lk, nvalid,
                    reinterpret_cast<const unsigned char*>(q), rows.q);
    load_row_sw<NVB>(sdO, kRows, sw + half * kBk * 128, lk, NVB * 8,
                     reinterpret_cast<const unsigned char*>(o), dout);
  }
  // The index of row lr of a tile, read a tile ahead of its copies (raw: -1 past K; the range check
  // at the copy), so that its latency is not on the path of every tile.
  auto raw_index = [&](int tile) -> int {
    const int64_t j = static_cast<int64_t>(tile) * kBk + lr;
    return tile < ntiles && j < p.K ? rows.idx[j] : -1;
  };
  auto issue = [&](int tile, int raw) {
    const int st = tile % kBwdStages;
    const int id = key_in_range(p, raw);
    if (lk == 0) sIdx[st * kBk + lr] = id;
    load_row_sw<NB>(
        sK + st * NB * kBlkK, kBk, sw, lk, nvalid,
        id >= 0 ? reinterpret_cast<const unsigned char*>(rows.kv + id * p.kvs1) : nullptr, rows.kv);
  };
  // Tile 0 in flight with the rows, the next index read ahead.
  if (ntiles > 0) issue(0, raw_index(0));
  cp_async_commit();
  int next = raw_index(1);

#pragma unroll
  for (int rr = 0; rr < kRows / 8; ++rr)
    row_delta_lse(p, dout, outp, lse, qi, h0, warp * (kRows / 8) + rr, sDelta, sLse2, dsink_part);

  const int hq0 = wg * NB;  // the first of this warpgroup's halves
  float dqa[NB][16];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int e = 0; e < 16; ++e) dqa[b][e] = 0.f;
#pragma unroll
  for (int b = 0; b < NB; ++b) reg_fence(dqa[b]);  // defined before tile 0's S and dP are issued
  const uint64_t dq0 = desc_sw128(sQ), do0 = desc_sw128(sdO);
  const uint64_t dpt = desc_sw128(sPt), ddst = desc_sw128(sdSt);
  unsigned char* stage = (wg == 0 ? sPt : sdSt) + kTileT;

  // S (warpgroup 0) or dP (warpgroup 1) of a tile, 16 columns a step: issued at the end of the
  // iteration before the tile's (below). Its zeros are written before the fence that precedes the
  // MMAs in flight beside them (a write between makes ptxas serialize the MMAs: C7515).
  float sc[16];
  auto zero_sc = [&] {
#pragma unroll
    for (int e = 0; e < 16; ++e) asm volatile("mov.b32 %0, 0;\n" : "=f"(sc[e]));
    reg_fence(sc);
  };
  // Tile `tile` (stage st) has landed for every thread and has a valid key: a barrier (after which
  // the copies waited for are visible to every thread and to the MMAs).
  auto tile_live = [&](int tile, int st) {
    fence_async_smem();
    return __syncthreads_or(tile < ntiles && tid < kBk && sIdx[st * kBk + tid] >= 0);
  };

  // Per tile it (stage st): P and dS from its S and dP, dq, then its dkv blocks, the last block's
  // MMAs issued together with tile it + 1's S and dP, which run on the tensor cores while that
  // block's rows are stored. The loop starts at tile -1 (no tile: it issues tile 0's S and dP).
  int live = 0;
  for (int it = -1; it < ntiles; ++it) {
    const int st = it & 1;  // it % kBwdStages, -1 included
    const int* tidx = sIdx + st * kBk;
    bool row_ok[2] = {false, false};  // the dkv rows this thread stores (keys t / 8, 16 + t / 8)
    if (live) {
      const uint32_t dk0 = __shfl_sync(0xffffffffu, desc_lo(sK + st * NB * kBlkK), 0);
      // Both warpgroups are past tile it - 1's dkv blocks, which read what S and dP overwrite.
      __syncthreads();
      // S and dP meet in shared memory (S in sX, dP in the P^T / dS^T tiles' space), and both
      // warpgroups form the same P and dS of the thread's 16 entries, as bwd_mma_kernel's S warps
      // (one code path for both: the same bits); warpgroup 0 writes P^T where it read dP, 1 dS^T
      // where it read S.
      float* mine = wg == 0 ? sX : reinterpret_cast<float*>(sPt);
      const float* theirs = wg == 0 ? reinterpret_cast<const float*>(sPt) : sX;
#pragma unroll
      for (int e = 0; e < 16; ++e) mine[e * 128 + t] = sc[e];
      __syncthreads();
      float ds[16];
      {
        float other[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) other[e] = theirs[e * 128 + t];
        const float l2[2] = {sLse2[row0], sLse2[row0 + 8]};
        const float dl[2] = {sDelta[row0], sDelta[row0 + 8]};
        bool valid[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) valid[c] = tidx[(c >> 1) * 8 + 2 * qd + (c & 1)] >= 0;
        bar_wg(wg);  // the warpgroup has read what it overwrites next
        unsigned char* tile = wg == 0 ? sPt : sdSt;
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const float sv = wg == 0 ? sc[e] : other[e], dpv = wg == 0 ? other[e] : sc[e];
          const int i = (e >> 1) & 1, c = (e >> 2) * 8 + 2 * qd + (e & 1);
          const float pe =
              valid[((e >> 2) << 1) | (e & 1)] ? ex2_ftz(sv * p.scale_log2 - l2[i]) : 0.f;
          ds[e] = pe * (dpv - dl[i]) * p.scale;
          *reinterpret_cast<T*>(tile + sw_off(c, row0 + 8 * i)) =
              from_float<T>(wg == 0 ? pe : ds[e]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) row_ok[i] = tidx[(t >> 3) + 16 * i] >= 0;
      fence_async_smem();
      __syncthreads();
      // dq += dS K over this warpgroup's halves, dS as the A fragments.
      uint32_t pa[kBk / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          pa[kk][i] = pack2<T>(ds[8 * kk + 2 * i], ds[8 * kk + 2 * i + 1]);
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk) reg_fence(pa[kk]);
#pragma unroll
      for (int b = 0; b < NB; ++b) reg_fence(dqa[b]);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk)
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const int hh = hq0 + b;
          wgmma_m64n32_rs<T>(
              dqa[b], pa[kk],
              desc_of(dk0 + (hh >> 1) * (kBlkK / 16) + (hh & 1) * 4 + kk * (2048 / 16)));
        }
      wg_commit();
      wg_wait<0>();  // (the fragments free for the dkv products' registers)
#pragma unroll
      for (int b = 0; b < NB; ++b) reg_fence(dqa[b]);
    }
    // Tile it + 1 has landed, and both warpgroups are past tile it's dq: its stage takes tile
    // it + 2.
    cp_async_wait<0>();
    const int live_next = tile_live(it + 1, st ^ 1);
    if (it + 2 < ntiles) issue(it + 2, next);
    cp_async_commit();
    next = raw_index(it + 3);
    // The dkv rows of the tile, one 64-column block at a time: warpgroup w blocks 4 w .. 4 w + 3
    // (both terms), then warpgroup 1 block 8 of Dqk 576 (dS^T Q only). A block's MMAs are one group
    // without a branch between them.
    auto dkv_products = [&](float(&acc)[16], int blk, auto with_do) {
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk)
        wgmma_m64n32_ss<T, true>(acc, dq0 + blk * (kBlkQ / 16) + kk * (2048 / 16), ddst + kk * 2);
      if constexpr (decltype(with_do)::value) {
#pragma unroll
        for (int kk = 0; kk < kRows / 16; ++kk)
          wgmma_m64n32_ss<T, true>(acc, do0 + blk * (kBlkQ / 16) + kk * (2048 / 16), dpt + kk * 2);
      }
    };
    auto zero_acc = [](float(&acc)[16]) {
#pragma unroll
      for (int e = 0; e < 16; ++e) asm volatile("mov.b32 %0, 0;\n" : "=f"(acc[e]));
      reg_fence(acc);
    };
    auto dkv_mma = [&](float(&acc)[16], int blk, auto with_do) {
      zero_acc(acc);
      wg_fence();
      dkv_products(acc, blk, with_do);
      wg_commit();
    };
    // A block's rows, once its MMAs are complete, staged and stored as 16-byte pieces.
    auto dkv_store = [&](float(&acc)[16], int blk) {
      reg_fence(acc);
      // The warpgroup's previous block is out. acc[4 j + e]: column row0 + 8 (e / 2) of the block,
      // key 8 j + 2 qd + e % 2.
      bar_wg(wg);
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int col = row0 + 8 * ((e >> 1) & 1), key = (e >> 2) * 8 + 2 * qd + (e & 1);
        *reinterpret_cast<T*>(stage + sw_off(key, col)) = from_float<T>(acc[e]);
      }
      bar_wg(wg);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = t + 128 * i, key = c >> 3, ch = c & 7;
        const int64_t j = static_cast<int64_t>(it) * kBk + key;
        const int col = blk * 64 + ch * 8;
        if (j >= p.K || !row_ok[i] || col >= p.dqk) continue;
        T* wrow = wout + (((qi - q_begin) * nhb + hb) * p.K + j) * p.dqk;
        *reinterpret_cast<uint4*>(wrow + col) =
            *reinterpret_cast<const uint4*>(stage + key * 128 + ((ch ^ (key & 7)) << 4));
      }
    };
    float acc[16];
    const int blk0 = wg * (NVB / 2), last = blk0 + NVB / 2 - 1;
    if (live) {
      // Warpgroup w's blocks 4 w .. 4 w + 3 (both terms), warpgroup 1's block 8 of Dqk 576 (dS^T Q
      // only) first, the last below.
      if constexpr (NB > NVB) {
        if (wg == 1) {
          dkv_mma(acc, NVB, std::false_type{});
          wg_wait<0>();
          dkv_store(acc, NVB);
        }
      }
#pragma unroll
      for (int b = 0; b + 1 < NVB / 2; ++b) {
        dkv_mma(acc, blk0 + b, std::true_type{});
        wg_wait<0>();
        dkv_store(acc, blk0 + b);
      }
    }
    // The last block's MMAs, then tile it + 1's S or dP, which run on the tensor cores while the
    // block's rows are stored. As in fwd_wgmma_kernel, only the MMAs sit in branches (their
    // conditions warp-uniform through __any_sync) and no MMA is in flight across the loop's back
    // edge: else ptxas serializes every MMA (C7514, C7520).
    zero_acc(acc);
    zero_sc();
    wg_fence();
    if (__any_sync(0xffffffffu, live)) dkv_products(acc, last, std::true_type{});
    wg_commit();
    {
      const uint32_t dk1 = __shfl_sync(0xffffffffu, desc_lo(sK + (st ^ 1) * NB * kBlkK), 0);
      if (__any_sync(0xffffffffu, live_next && wg == 0)) {
#pragma unroll
        for (int k = 0; k < KS; ++k)
          wgmma_m64n32_ss<T>(sc, dq0 + (k >> 2) * (kBlkQ / 16) + (k & 3) * 2,
                             desc_of(dk1 + (k >> 2) * (kBlkK / 16) + (k & 3) * 2));
      } else if (__any_sync(0xffffffffu, live_next)) {
#pragma unroll
        for (int k = 0; k < NVB * 4; ++k)
          wgmma_m64n32_ss<T>(sc, do0 + (k >> 2) * (kBlkQ / 16) + (k & 3) * 2,
                             desc_of(dk1 + (k >> 2) * (kBlkK / 16) + (k & 3) * 2));
      }
    }
    wg_commit();
    wg_wait<1>();  // the last block
    reg_fence(acc);
    if (live) dkv_store(acc, last);
    wg_wait<0>();  // S or dP of tile it + 1
    reg_fence(sc);
    live = live_next;
  }
  cp_async_wait<0>();  // the empty groups past the last tile

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = h0 + row0 + 8 * i;
    if (h >= p.H) continue;
    T* row = dq + (qi * p.H + h) * p.dqk;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = (hq0 + b) * 32 + j * 8 + 2 * qd;
        if (c < p.dqk) st_pair(row + c, dqa[b][4 * j + 2 * i], dqa[b][4 * j + 2 * i + 1]);
      }
    }
  }
#endif
}

}  // namespace
}  // namespace opslot::sparse
