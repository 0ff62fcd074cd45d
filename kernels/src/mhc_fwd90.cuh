// The forward of mhc/pre and mhc/head with each token's row read once (compute capability 9.0:
// thread block clusters): fwd_cluster_kernel computes the mixes, rstd and the collapsed row where
// the GEMM against fn and collapse_fwd (mhc_kernels.cuh) each read the streams. mhc.cu launches it
// where fwd_cluster_plan finds a shape; contracts: opslot_kernels/mhc.h; design: docs/kernels.md
// "## mhc".
#pragma once

#include <cooperative_groups.h>

#include "mhc_kernels.cuh"
#include "mma_sm80.cuh"

namespace opslot {
namespace {

constexpr int kFcTok = 16;  // tokens per tile
constexpr int kFcWarps = 8;
constexpr int kFcThreads = 32 * kFcWarps;
constexpr int kFcMaxCluster = 16;

// A cluster of C blocks owns a tile of kFcTok tokens at a time; block r owns the columns
// [r D / C, (r + 1) D / C) of every stream ("its slice", kb = hc D / C values of a token). Shared
// memory of a block, rows of its slice padded by 16 bytes (ldmatrix without bank conflicts):
//   fn's bf16 terms (opslot_mhc_split3): rows[term][8 MT] of the slice, zero past the mixes;
//   STAGES x kFcTok token rows (the ring, filled by bulk copies: one per token and stream);
//   the warps' partial sums [warp][token][P] (P = mixes + 1: the mixes, then the sum of squares),
//   the cluster's sums of the tokens the block owns [rank][token / C][P], pre [token][kMaxHc],
//   and the transaction barriers: one per stage (the bulk copies), one for the sums, one for pre.
struct FcShape {
  int mt, stages, kb, mixes;
  __host__ __device__ int rows() const { return 3 * 8 * mt; }
  __host__ __device__ int pitch() const { return 2 * kb + 16; }
  __host__ __device__ int p() const { return mixes + 1; }
  __host__ __device__ int x_off() const { return rows() * pitch(); }
  __host__ __device__ int stage_bytes() const { return kFcTok * pitch(); }
  __host__ __device__ int wpart_off() const { return x_off() + stages * stage_bytes(); }
  __host__ __device__ int gather_off() const { return wpart_off() + kFcWarps * kFcTok * p() * 4; }
  __host__ __device__ int pre_off() const { return gather_off() + kFcTok * p() * 4; }
  __host__ __device__ int bar_off() const { return pre_off() + kFcTok * mhc::kMaxHc * 4; }
  __host__ __device__ int bytes() const { return bar_off() + (stages + 2) * 8; }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// wait for the phase of `bar` whose parity is `parity`; kCluster: acquire at cluster scope (the
// data came from other blocks' st.async)
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (kCluster) {
    asm volatile(
        "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], "
        "%1;\n @!p bra W;\n}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
    return;
  }
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// The shared::cluster address of a shared-memory location in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}
// v into another block's shared memory (cluster addresses), counted on that block's barrier
__device__ __forceinline__ void st_async(uint32_t addr, float v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
      "r"(__float_as_uint(v)), "r"(bar)
      : "memory");
}
// bytes (a multiple of 16) from global to this block's shared memory, counted on `bar`
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif  // __CUDA_ARCH__ >= 900

// Per tile: (1) each warp takes every 8th k16 step of the slice: mma.sync of the 16 token rows
// against fn's 3 x 8 MT rows (the three terms added per warp), and the sum of squares from the same
// A fragments; the eight warps' sums are added in warp order and stored into the shared memory of
// the token's owner (block k % C). (2) After a cluster barrier, each block adds its tokens' C sums
// in rank order, writes their mixes and rstd, and stores their pre weights into every block's
// shared memory. (3) Once its tile's weights have landed, each block writes its slice of the
// collapsed rows. Every access to another block's shared memory is an st.async counted on a
// transaction barrier of the receiving block (no round trip, no cluster-wide barrier per tile: a
// block's next sums cannot leave before every owner has read the previous ones). Fixed orders
// throughout: bitwise deterministic. The ring's next tiles are in flight during all three.
template <int MT, int STAGES>
__global__ void __launch_bounds__(kFcThreads, 1)
    fwd_cluster_kernel(const bf16* __restrict__ x, const bf16* __restrict__ fn3,
                       const float* __restrict__ scale, const float* __restrict__ base,
                       float norm_eps, float hc_eps, bf16* __restrict__ out,
                       float* __restrict__ mix, float* __restrict__ rstd, int tokens, int hc,
                       int hidden, int mixes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int NT = 3 * MT;  // n8 tiles: [term][mix group]
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int r = static_cast<int>(cluster.block_rank());
  const int cols = hidden / C, c0 = r * cols, chunks = cols / 8, row_chunks = hc * chunks;
  const FcShape sh{MT, STAGES, hc * cols, mixes};
  const int pitch = sh.pitch(), P = sh.p();
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sfn = smem;
  unsigned char* sx = smem + sh.x_off();
  float* wpart = reinterpret_cast<float*>(smem + sh.wpart_off());
  float* gather = reinterpret_cast<float*>(smem + sh.gather_off());
  float* pre_s = reinterpret_cast<float*>(smem + sh.pre_off());
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + sh.bar_off());
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t K = static_cast<int64_t>(hc) * hidden;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  // fn's slice (cp.async, once): term h, mix m at row 8 MT h + m
  for (int e = tid; e < sh.rows() * row_chunks; e += kFcThreads) {
    const int row = e / row_chunks, q = e % row_chunks, j = q / chunks, c = q % chunks;
    const int h = row / (8 * MT), m = row % (8 * MT);
    unsigned char* dst = sfn + row * pitch + q * 16;
    if (m < mixes)
      cp_async16(dst, fn3 + (h * mixes + m) * K + static_cast<int64_t>(j) * hidden + c0 + c * 8);
    else
      *reinterpret_cast<uint4*>(dst) = zero;
  }
  cp_async_commit();
  uint64_t* gbar = bars + STAGES;  // the sums of the tokens this block owns have landed
  uint64_t* pbar = gbar + 1;       // pre of the tile's tokens has landed
  if (tid < STAGES + 2) mbar_init(bars + tid, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  cluster.sync();  // every block's barriers are initialised before any st.async targets them
  const int ncl = gridDim.x / C, cid = blockIdx.x / C;
  const int ntiles = (tokens + kFcTok - 1) / kFcTok;
  const int mine = (ntiles - cid + ncl - 1) / ncl;  // the grid has at most ntiles clusters
  auto tile_start = [&](int i) { return static_cast<int64_t>(cid + i * ncl) * kFcTok; };
  // thread tid < kFcTok * hc copies token tid / hc's stream tid % hc of every tile
  const int ck = tid / hc, cj = tid % hc;
  const uint32_t seg = static_cast<uint32_t>(cols) * 2;
  auto issue = [&](int i) {  // tile i of this cluster into stage i % STAGES
    if (i >= mine) return;
    const int64_t t0 = tile_start(i);
    const int st = i % STAGES;
    const int valid = static_cast<int>(tokens - t0 < kFcTok ? tokens - t0 : kFcTok);
    unsigned char* base_s = sx + st * sh.stage_bytes();
    if (tid == 0) mbar_expect_tx(bars + st, static_cast<uint32_t>(valid * hc) * seg);
    if (tid < kFcTok * hc) {
      unsigned char* dst = base_s + ck * pitch + cj * seg;
      if (ck < valid)
        bulk_copy(dst, x + ((t0 + ck) * hc + cj) * hidden + c0, seg, bars + st);
      else
        for (int c = 0; c < chunks; ++c) reinterpret_cast<uint4*>(dst)[c] = zero;
    }
  };
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(i);
  cp_async_wait<0>();
  const int ksteps = sh.kb / 16;
  const int g = lane >> 2, c = lane & 3;
  // ldmatrix rows: A the 16 tokens (x4: k 0 / 8 by lane / 16); B fn's rows in pairs of n8 tiles
  // (x4: n 0-7 / 8-15 by lane / 16, k 0 / 8 by lane / 8 % 2), the odd last tile by x2
  const int a_off = (lane & 15) * pitch + (lane >> 4) * 16;
  const int b_off = ((lane & 7) + ((lane >> 4) << 3)) * pitch + ((lane >> 3) & 1) * 16;
  const int b2_off = (lane & 7) * pitch + ((lane >> 3) & 1) * 16;
  // this thread's sums of the tile: entries e = tid, tid + 256 of [token][P], each stored into its
  // owner's gather (the same cluster address every tile; 0: none)
  const int own = kFcTok / C;  // tokens a block owns per tile
  uint32_t push[2], push_bar[2];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int e = tid + n * kFcThreads, k = e / P, v = e % P;
    push[n] = e < kFcTok * P ? cluster_addr(gather + (r * own + k / C) * P + v, k % C) : 0u;
    push_bar[n] = e < kFcTok * P ? cluster_addr(gbar, k % C) : 0u;
  }
  const uint32_t gather_bytes = static_cast<uint32_t>(C * own * P * 4);
  const uint32_t pre_bytes = static_cast<uint32_t>(kFcTok * hc * 4);
  // the collapse's items: (token, 16-byte chunk) = (tid / chunks, tid % chunks), then steps of 256
  const int dk = kFcThreads / chunks, dc = kFcThreads % chunks;
  for (int i = 0; i < mine; ++i) {
    issue(i + STAGES - 1);
    if (tid == 0) {  // this tile's bytes from the other blocks (they cannot arrive before)
      mbar_expect_tx(gbar, gather_bytes);
      mbar_expect_tx(pbar, pre_bytes);
    }
    const int st = i % STAGES;
    mbar_wait(bars + st, static_cast<uint32_t>(i / STAGES) & 1u);
    __syncthreads();  // the fn slice and the zero rows past the last token
    const unsigned char* stp = sx + st * sh.stage_bytes();
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float ss0 = 0.f, ss1 = 0.f;  // sums of squares of tokens g and g + 8
    for (int ks = warp; ks < ksteps; ks += kFcWarps) {
      uint32_t a[4];
      ldsm_x4(a, stp + a_off + ks * 32);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float lo = __uint_as_float(a[v] << 16), hi = __uint_as_float(a[v] & 0xffff0000u);
        if (v & 1)
          ss1 += lo * lo + hi * hi;
        else
          ss0 += lo * lo + hi * hi;
      }
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        uint32_t b[4];
        ldsm_x4(b, sfn + b_off + p * 16 * pitch + ks * 32);
        mma16816<bf16>(acc[2 * p], a, b[0], b[1]);
        mma16816<bf16>(acc[2 * p + 1], a, b[2], b[3]);
      }
      if constexpr (NT % 2 != 0) {
        uint32_t b[2];
        ldsm_x2(b, sfn + b2_off + (NT - 1) * 8 * pitch + ks * 32);
        mma16816<bf16>(acc[NT - 1], a, b[0], b[1]);
      }
    }
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
    float* wp = wpart + warp * kFcTok * P;
#pragma unroll
    for (int q = 0; q < MT; ++q) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = 8 * q + 2 * c + e;
        if (m < mixes) {
          wp[g * P + m] = acc[q][e] + acc[MT + q][e] + acc[2 * MT + q][e];
          wp[(g + 8) * P + m] = acc[q][2 + e] + acc[MT + q][2 + e] + acc[2 * MT + q][2 + e];
        }
      }
    }
    if (c == 0) {
      wp[g * P + mixes] = ss0;
      wp[(g + 8) * P + mixes] = ss1;
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      if (push[n] != 0u) {
        const int e = tid + n * kFcThreads;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kFcWarps; ++w) s += wpart[w * kFcTok * P + e];
        st_async(push[n], s, push_bar[n]);
      }
    }
    const int64_t t0 = tile_start(i);
    const uint32_t parity = static_cast<uint32_t>(i) & 1u;
    if (warp < own) mbar_wait<true>(gbar, parity);
    for (int kk = warp; kk < own; kk += kFcWarps) {
      const int k = r + C * kk;
      float s = 0.f;
      if (lane < P) {
        for (int q = 0; q < C; ++q) s += gather[(q * own + kk) * P + lane];
      }
      const float rs =
          rsqrtf(__shfl_sync(0xffffffffu, s, mixes) / static_cast<float>(hc * hidden) + norm_eps);
      const float mv = rs * s;
      const int64_t t = t0 + k;
      if (t < tokens) {
        if (lane < mixes) mix[t * mixes + lane] = mv;
        if (lane == 0) rstd[t] = rs;
      }
      const float pv = lane < hc ? mhc::sigmoid(mv * scale[0] + base[lane]) + hc_eps : 0.f;
      for (int b = 0; b < C * hc; b += 32) {  // pre_j of token k into every block: (rank, j) a lane
        const int idx = b + lane;
        const float v = __shfl_sync(0xffffffffu, pv, idx % hc);
        if (idx < C * hc)
          st_async(cluster_addr(pre_s + k * mhc::kMaxHc + idx % hc, idx / hc), v,
                   cluster_addr(pbar, idx / hc));
      }
    }
    mbar_wait<true>(pbar, parity);
    const int valid = static_cast<int>(tokens - t0 < kFcTok ? tokens - t0 : kFcTok);
    for (int k = tid / chunks, q = tid % chunks; k < valid;) {
      float o[8];
#pragma unroll
      for (int v = 0; v < 8; ++v) o[v] = 0.f;
#pragma unroll
      for (int j = 0; j < mhc::kMaxHc; ++j) {
        if (j < hc) {
          const float pw = pre_s[k * mhc::kMaxHc + j];
          const Vec<bf16, 8> xv =
              *reinterpret_cast<const Vec<bf16, 8>*>(stp + k * pitch + (j * chunks + q) * 16);
#pragma unroll
          for (int v = 0; v < 8; ++v) o[v] += pw * to_float(xv.v[v]);
        }
      }
      Vec<bf16, 8> ov;
#pragma unroll
      for (int v = 0; v < 8; ++v) ov.v[v] = from_float<bf16>(o[v]);
      *reinterpret_cast<Vec<bf16, 8>*>(out + (t0 + k) * hidden + c0 + q * 8) = ov;
      q += dc;
      k += dk;
      if (q >= chunks) {
        q -= chunks;
        ++k;
      }
    }
    __syncthreads();  // the stage is free for the copies issued next
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  cluster.sync();  // no block leaves while another may still address its shared memory
#endif             // __CUDA_ARCH__ >= 900
}

}  // namespace
}  // namespace opslot
