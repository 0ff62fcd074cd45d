// Sparse MQA attention's forward on Hopper (sm_90a, warpgroup MMA): the algorithm of
// fwd_mma_kernel (sparse_attention_fwd.cuh) with the products as wgmma from shared memory.
// sparse_attention.cu launches it on compute capability 9.0 for 16-bit inputs whose rows allow
// 16-byte copies; fwd_mma_kernel takes the rest.
//
// One CTA (two warpgroups) per query token and block of 64 heads. The query rows and a ring of
// three 32-key tiles sit in shared memory as 128-byte-swizzled 64-column blocks (wgmma_sm90.cuh),
// filled by 16-byte cp.async copies (skipped keys and the columns past Dqk zero). Per tile:
// warpgroup w computes S over its half of Dqk (m64n32k16, both operands from shared memory), the
// halves are added through shared memory in one order (both warpgroups hold the same S, bit for
// bit), both run the same online softmax, and warpgroup w adds P V for output columns 256 w .. +256
// (m64n64k16, P from registers, V the tile read MN-major). A tile without a valid key is skipped.
// Shapes: dv = 512 (both models'; dv <= Dqk <= 576), every loop bound the same in all threads, so
// that ptxas keeps the MMAs asynchronous.
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
         kWgStages * kBk * sizeof(int);
}

// One row of a swizzled tile (blocks of `rows` rows, 1024-byte aligned): this thread's 16-byte
// chunks lk, lk + 8, ... < npad of row `row` (the eight threads of a row take one 128-byte piece of
// it per copy), the chunks at or past `nvalid` and a row src == nullptr zero. cp.async; the caller
// commits and waits. sw: the thread's byte offset inside a block (row 128 + swizzled chunk).
__device__ __forceinline__ void load_row_sw(unsigned char* dst, int rows, int sw, int lk, int npad,
                                            int nvalid, const unsigned char* src,
                                            const void* any_global) {
  for (int m = 0; m * 8 < npad; ++m) {
    const int c = lk + 8 * m;
    const bool on = src != nullptr && c < nvalid;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     smem_u32(dst + m * rows * 128 + sw)),
                 "l"(on ? static_cast<const void*>(src + c * 16) : any_global), "r"(on ? 16 : 0)
                 : "memory");
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
  const int nblk = p.dpad / 64, npad = p.dpad / 8, nvalid = static_cast<int>(p.dqk / 8);
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
  for (int half = 0; half < 2; ++half) {
    const int r = lr + half * kBk;
    const T* src = h0 + r < p.H ? rows.q + (h0 + r) * p.qs2 : nullptr;
    load_row_sw(sQ, kRows, sw + half * kBk * 128, lk, npad, nvalid,
                reinterpret_cast<const unsigned char*>(src), rows.q);
  }
  auto issue = [&](int tile) {
    const int st = tile % kWgStages;
    const int id = key_of(p, rows.idx, static_cast<int64_t>(tile) * kBk + lr);
    if (lk == 0) sIdx[st * kBk + lr] = id;
    load_row_sw(sK + st * nblk * kBlkK, kBk, sw, lk, npad, nvalid,
                id >= 0 ? reinterpret_cast<const unsigned char*>(rows.kv + id * p.kvs1) : nullptr,
                rows.kv);
  };
  if (ntiles > 0) issue(0);
  cp_async_commit();
  if (ntiles > 1) issue(1);
  cp_async_commit();

  const int ks0 = wg * KS, vb0 = wg * 4;
  const uint64_t dq0 = desc_sw128(sQ);
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
  float o[4][32];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[i][e] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    const int st = it % kWgStages;
    cp_async_wait<1>();
    fence_async_smem();
    // Every warpgroup is past tile it - 1 here: its stage may take tile it + 2.
    const int live = __syncthreads_or(tid < kBk && sIdx[st * kBk + tid] >= 0);
    if (it + 2 < ntiles) issue(it + 2);
    cp_async_commit();
    if (!live) continue;  // adds nothing: the same result
    const unsigned char* kt = sK + st * nblk * kBlkK;

    float sc[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) sc[e] = 0.f;
    reg_fence(sc);
    const uint64_t dk0 = desc_sw128(kt);
    wg_fence();
#pragma unroll
    for (int k = 0; k < KS; ++k) {  // descriptors advance in 16-byte units
      const int ks = ks0 + k, sub = (ks & 3) * 2;
      wgmma_m64n32_ss<T>(sc, dq0 + (ks >> 2) * (kBlkQ / 16) + sub,
                         dk0 + (ks >> 2) * (kBlkK / 16) + sub);
    }
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);
#pragma unroll
    for (int e = 0; e < 16; ++e) sX[(wg * 16 + e) * 128 + t] = sc[e];
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 16; ++e) sc[e] = sX[e * 128 + t] + sX[(16 + e) * 128 + t];  // S0 + S1

    float alpha[2];
    softmax_tile(sc, sIdx + st * kBk, p.scale_log2, qd, m_run, l_run, alpha);
#pragma unroll
    for (int bb = 0; bb < 4; ++bb)
#pragma unroll
      for (int e = 0; e < 32; ++e) o[bb][e] *= alpha[(e >> 1) & 1];
    uint32_t pa[kBk / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
      reg_fence(pa[kk]);
    }
#pragma unroll
    for (int bb = 0; bb < 4; ++bb) reg_fence(o[bb]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk)
#pragma unroll
      for (int bb = 0; bb < 4; ++bb)
        wgmma_m64n64_rs<T>(o[bb], pa[kk], dk0 + (vb0 + bb) * (kBlkK / 16) + kk * (2048 / 16));
    wg_commit();
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
