// The lightning indexer's scores on tensor cores (float16 / bfloat16): scores_mma_kernel
// (mma.sync, any GPU of the library's targets) and the per-block steps it shares with
// scores_wgmma_kernel (dsa_indexer90.cuh, Hopper). dsa_indexer.cu launches them.
//
// A block owns kRows = 128 rows (query, head) of the [S * Hp, D] query matrix: qb consecutive
// queries, each with its heads padded with zero rows to Hp = 16 * ceil(H / 16) (so that each m16
// tile belongs to one query; qb = 8 / (Hp / 16)). Each of the 4 warps keeps two m16 tiles of those
// rows in registers as mma A fragments (D <= 128: 8 k-steps x 4 registers per tile) and the block
// walks the keys in tiles of 64 (cp.async, two stages) up to the largest limit of its queries. Per
// key tile a warp computes its 32 x 64 dot products (K fragments by ldmatrix, reused by both m
// tiles), applies relu and the head weights to the accumulators in registers, sums its rows
// (within a lane, then a 3-round shuffle that leaves each lane the sums of one n8 tile) and
// writes the scaled scores (-inf at or past the query's limit) from the lanes where a query's rows
// lie in the warp (Hp 16 or 32: GLM-5); a query over several warps gets its other warps' row sums
// through shared memory, added in warp order by its first warp (tile_rows). Key tiles past every
// limit of the block are written -inf without computing.
#pragma once

#include <cmath>

#include "common.cuh"
#include "mma_sm80.cuh"

namespace opslot::dsa {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 128;           // (query, head) rows per block
constexpr int kMTiles = kRows / 16;  // m16 tiles per block, two per warp
constexpr int kKeys = 64;            // keys per tile
constexpr int kDMax = 128;           // largest head dim of the tensor-core kernel
constexpr int kPitch = kDMax + 8;    // shared-memory row pitch (elements): 272 bytes, so the 8
                                     // rows of an ldmatrix land in distinct 16-byte bank groups
constexpr int kKSteps = kDMax / 16;  // k16 steps at D = 128
constexpr size_t kMmaSmem = sizeof(uint16_t) * (kRows + 2 * kKeys) * kPitch +
                            sizeof(float) * kMTiles * kKeys + sizeof(int) * kMTiles;

struct MmaParams {
  const void* q;
  const void* k;
  const float* w;
  const int32_t* limit;
  float* out;
  int64_t qs0, qs1, qs2;  // q strides: batch, query, head
  int64_t ks0, ks1;       // k strides: batch, key
  int64_t ws0, ws1, ws2;  // weights strides: batch, query, head
  int64_t S, T;
  int H, D;
  float scale;
  int hp;          // heads padded to a multiple of 16
  int tpq;         // m16 tiles per query (hp / 16)
  int qb;          // queries per block
  int ksteps;      // k16 steps: ceil(D / 16)
  int64_t blocks;  // query blocks per batch row: ceil(S / qb)
};

// relu that keeps NaN (as torch.relu): one max.NaN instruction where a compare and a select took
// two (-0.0 may give +0.0, a zero either way).
__device__ __forceinline__ float relu(float x) {
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(r) : "f"(x));
  return r;
}

// v[n][c]: this lane's row sums for n8 tile n, column 2 * (lane % 4) + c. Returns in y the sums
// over the 8 lanes with the same lane % 4 for the n8 tile g = lane / 4: three rounds, each lane
// keeping half of its values and adding its partner's copy of them (14 shuffles instead of 48).
// A fixed tree: deterministic.
__device__ __forceinline__ void reduce_rows(const float (&v)[8][2], float (&y)[2], int lane) {
  const int g = lane >> 2;
  const bool hi4 = (g & 4) != 0, hi2 = (g & 2) != 0, hi1 = (g & 1) != 0;
  float u[4][2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float send = hi4 ? v[k][c] : v[k + 4][c];
      const float keep = hi4 ? v[k + 4][c] : v[k][c];
      u[k][c] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
  }
  float x[2][2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float send = hi2 ? u[k][c] : u[k + 2][c];
      const float keep = hi2 ? u[k + 2][c] : u[k][c];
      x[k][c] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float send = hi1 ? x[0][c] : x[1][c];
    const float keep = hi1 ? x[1][c] : x[0][c];
    y[c] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
}

// The steps of one query block (kRows rows from query s0 of batch row b), taken by its `threads`
// threads (t: this one's index among them; warp: its warp among them).

// The block's limits (clamped to [0, T]; 0 for queries past S) into sLim[0, kMTiles).
__device__ __forceinline__ void block_limits(const MmaParams& p, int64_t b, int64_t s0, int t,
                                             int* sLim) {
  if (t < kMTiles) {
    int lim = 0;
    if (t < p.qb && s0 + t < p.S) {
      int64_t l = p.limit != nullptr ? static_cast<int64_t>(p.limit[b * p.S + s0 + t]) : p.T;
      l = l < 0 ? 0 : (l > p.T ? p.T : l);
      lim = static_cast<int>(l);
    }
    sLim[t] = lim;
  }
}

// The block's query rows into shared memory (zero rows for padding heads and queries past S, zero
// columns past D) as cp.async copies, the 16-byte piece c of row r to dst(r, c); the caller
// commits and waits.
template <typename T, typename Dst>
__device__ __forceinline__ void block_queries(const MmaParams& p, int64_t b, int64_t s0, int t,
                                              int threads, Dst dst) {
  const T* q = static_cast<const T*>(p.q);
  const int pieces = 2 * p.ksteps;  // 16-byte pieces of a row that the mma reads
  const int live_pieces = p.D / 8;
  for (int i = t; i < kRows * pieces; i += threads) {
    const int r = i / pieces, c = i % pieces;
    const int qi = r / p.hp, h = r % p.hp;
    const bool live = qi < p.qb && s0 + qi < p.S && h < p.H && c < live_pieces;
    const T* src = live ? q + b * p.qs0 + (s0 + qi) * p.qs1 + h * p.qs2 + c * 8 : q;
    cp16_or_zero(dst(r, c), src, live);
  }
}

// The head weights of warp `warp`'s rows g and g + 8 of its m16 tiles 2 warp and 2 warp + 1 (0 for
// padding heads and queries past S).
__device__ __forceinline__ void warp_weights(const MmaParams& p, int64_t b, int64_t s0, int warp,
                                             int lane, float (&wt)[2][2]) {
  const int g = lane >> 2, tile0 = 2 * warp;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = (tile0 + mt) * 16 + g + 8 * half;
      const int qi = r / p.hp, h = r % p.hp;
      const bool live = qi < p.qb && s0 + qi < p.S && h < p.H;
      wt[mt][half] = live ? p.w[b * p.ws0 + (s0 + qi) * p.ws1 + h * p.ws2] : 0.f;
    }
  }
}

// Warp `warp`'s m16 tiles tile0 = 2 warp and tile0 + 1 as A fragments (zero past the k-steps)
// and their rows' head weights (warp_weights).
template <typename T>
__device__ __forceinline__ void warp_fragments(const MmaParams& p, int64_t b, int64_t s0,
                                               const T* sQ, int warp, int lane,
                                               uint32_t (&qa)[2][kKSteps][4], float (&wt)[2][2]) {
  const int tile0 = 2 * warp;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if (ks < p.ksteps) {
        ldsm_x4(qa[mt][ks],
                sQ + ((tile0 + mt) * 16 + (lane & 15)) * kPitch + ks * 16 + (lane >> 4) * 8);
      } else {
        qa[mt][ks][0] = qa[mt][ks][1] = qa[mt][ks][2] = qa[mt][ks][3] = 0u;
      }
    }
  }
  warp_weights(p, b, s0, warp, lane, wt);
}

// One m16 tile's weighted relu terms: v[n][c] = wt[0] relu(acc[n][c]) + wt[1] relu(acc[n][2 + c])
// (rows g and g + 8 of the accumulators' m16n8 layout).
__device__ __forceinline__ void head_terms(const float (&acc)[8][4], const float (&wt)[2],
                                           float (&v)[8][2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) v[n][c] = wt[0] * relu(acc[n][c]) + wt[1] * relu(acc[n][2 + c]);
}

// The second m16 tile's terms added into the first's (both tiles' rows in one query).
__device__ __forceinline__ void add_tiles(float (&v)[2][8][2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) v[0][n][c] += v[1][n][c];
}

// A warp's partial rows of a key tile from the terms of its m16 tiles tile0 and tile0 + 1: one row
// per query, added before the shuffles where both tiles belong to the same query (`same`; the
// second tile's row then 0). col: the lane's first column, 8 (lane / 4) + 2 (lane % 4).
__device__ __forceinline__ void warp_partials(float (&v)[2][8][2], bool same, int tile0, int col,
                                              int lane, float* sPart) {
  float y[2];
  if (same) {
    add_tiles(v);
    reduce_rows(v[0], y, lane);
    sPart[tile0 * kKeys + col] = y[0];
    sPart[tile0 * kKeys + col + 1] = y[1];
    sPart[(tile0 + 1) * kKeys + col] = 0.f;
    sPart[(tile0 + 1) * kKeys + col + 1] = 0.f;
  } else {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      reduce_rows(v[mt], y, lane);
      sPart[(tile0 + mt) * kKeys + col] = y[0];
      sPart[(tile0 + mt) * kKeys + col + 1] = y[1];
    }
  }
}

// Key tile j's output rows: each query's partial rows added in tile order, scaled; -inf at or past
// its limit.
__device__ __forceinline__ void write_tile(const MmaParams& p, int64_t b, int64_t s0, int j,
                                           const float* sPart, const int* sLim, int t,
                                           int threads) {
  const int64_t t0 = static_cast<int64_t>(j) * kKeys;
  for (int i = t; i < p.qb * kKeys; i += threads) {
    const int qi = i / kKeys, c = i % kKeys;
    const int64_t s = s0 + qi, key = t0 + c;
    if (s < p.S && key < p.T) {
      float r = -INFINITY;
      if (key < sLim[qi]) {
        float sum = 0.f;
        for (int m = 0; m < p.tpq; ++m) sum += sPart[(qi * p.tpq + m) * kKeys + c];
        r = sum * p.scale;
      }
      p.out[(b * p.S + s) * p.T + key] = r;
    }
  }
}

// The keys from tile `ntiles` on (past every limit of the block): -inf.
__device__ __forceinline__ void write_past(const MmaParams& p, int64_t b, int64_t s0, int ntiles,
                                           int t, int threads) {
  for (int qi = 0; qi < p.qb; ++qi) {
    const int64_t s = s0 + qi;
    if (s >= p.S) break;
    float* row = p.out + (b * p.S + s) * p.T;
    for (int64_t key = static_cast<int64_t>(ntiles) * kKeys + t; key < p.T; key += threads)
      row[key] = -INFINITY;
  }
}

// Two scores of query s, keys key and key + 1 (key even): y scaled, -inf at or past the limit lim;
// nothing for a query past S or a key past T. One 8-byte store where the row pitch T is even.
__device__ __forceinline__ void store_pair(const MmaParams& p, int64_t b, int64_t s, int64_t key,
                                           int lim, const float (&y)[2]) {
  if (s >= p.S) return;
  float r[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) r[c] = key + c < lim ? y[c] * p.scale : -INFINITY;
  float* o = p.out + (b * p.S + s) * p.T + key;
  if ((p.T & 1) == 0 && key + 1 < p.T) {
    *reinterpret_cast<float2*>(o) = make_float2(r[0], r[1]);
  } else {
    if (key < p.T) o[0] = r[0];
    if (key + 1 < p.T) o[1] = r[1];
  }
}

// Key tile j's output from a warp's terms v (its m16 tiles tile0 and tile0 + 1; `active`: the warp
// has rows). Each query's sum is the one write_tile forms from warp_partials' rows (the warps' row
// sums in warp order), in fewer steps where the query's rows do not straddle warps. A query within
// one warp (tpq 1 or 2): its rows reduced in the warp (reduce_rows) and stored from the lanes, no
// shared memory and no barrier (kSyncAlways: `sync` all the same, at the end). A query over two or
// more whole warps (tpq even): each warp's row sums (both tiles added, then reduce_rows) to sPart,
// `sync`, and the query's first warp adds the others' in warp order and stores. Else (a warp across
// two queries): warp_partials, `sync`, write_tile. `sync` is a barrier of the query block's
// threads, which every one of them reaches. The tpq == 2 branch is the even one with one warp a
// query, kept apart: folded into it, GLM-5's scores measured 3-7 % slower (an H100, 2026-12-05).
template <bool kSyncAlways, typename Sync>
__device__ __forceinline__ void tile_rows(const MmaParams& p, int64_t b, int64_t s0, int j,
                                          float (&v)[2][8][2], bool active, int tile0, int lane,
                                          int t, int threads, const int* sLim, float* sPart,
                                          Sync sync) {
  const int col = (lane >> 2) * 8 + 2 * (lane & 3);
  const int64_t key = static_cast<int64_t>(j) * kKeys + col;
  float y[2];
  if (p.tpq <= 2) {
    if (active) {
      if (p.tpq == 2) {
        add_tiles(v);
        reduce_rows(v[0], y, lane);
        store_pair(p, b, s0 + tile0 / 2, key, sLim[tile0 / 2], y);
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          reduce_rows(v[mt], y, lane);
          store_pair(p, b, s0 + tile0 + mt, key, sLim[tile0 + mt], y);
        }
      }
    }
    if constexpr (kSyncAlways) sync();
  } else if (p.tpq % 2 == 0) {
    const int warps = p.tpq / 2, w = tile0 / 2;  // warps a query, this warp
    if (active) {
      add_tiles(v);
      reduce_rows(v[0], y, lane);
      if (w % warps != 0) {
        *reinterpret_cast<float2*>(sPart + w * kKeys + col) = make_float2(y[0], y[1]);
      }
    }
    sync();
    if (active && w % warps == 0) {
      for (int i = 1; i < warps; ++i) {
        const float2 o = *reinterpret_cast<const float2*>(sPart + (w + i) * kKeys + col);
        y[0] += o.x;
        y[1] += o.y;
      }
      store_pair(p, b, s0 + w / warps, key, sLim[w / warps], y);
    }
  } else {
    if (active) warp_partials(v, tile0 / p.tpq == (tile0 + 1) / p.tpq, tile0, col, lane, sPart);
    sync();
    write_tile(p, b, s0, j, sPart, sLim, t, threads);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 3) scores_mma_kernel(const MmaParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kRows * kPitch;
  float* sPart = reinterpret_cast<float*>(sK + 2 * kKeys * kPitch);
  int* sLim = reinterpret_cast<int*>(sPart + kMTiles * kKeys);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t b = blockIdx.y;
  // The queries with the most keys first (causal limits grow with the query).
  const int64_t s0 = (p.blocks - 1 - static_cast<int64_t>(blockIdx.x)) * p.qb;
  const T* k = static_cast<const T*>(p.k);

  block_limits(p, b, s0, tid, sLim);
  block_queries<T>(p, b, s0, tid, kThreads, [sQ](int r, int c) { return sQ + r * kPitch + c * 8; });
  cp_async_commit();
  __syncthreads();  // sLim
  int lmax = 0;
  for (int i = 0; i < p.qb; ++i) lmax = max(lmax, sLim[i]);
  const int ntiles = (lmax + kKeys - 1) / kKeys;

  const int pieces = 2 * p.ksteps, live_pieces = p.D / 8;  // 16-byte pieces of a row
  auto load_keys = [&](int tile, int stage) {
    T* dst = sK + stage * kKeys * kPitch;
    const int64_t t0 = static_cast<int64_t>(tile) * kKeys;
    for (int i = tid; i < kKeys * pieces; i += kThreads) {
      const int r = i / pieces, c = i % pieces;
      const bool live = t0 + r < p.T && c < live_pieces;
      const T* src = live ? k + b * p.ks0 + (t0 + r) * p.ks1 + c * 8 : k;
      cp16_or_zero(dst + r * kPitch + c * 8, src, live);
    }
  };
  if (ntiles > 0) load_keys(0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // the query rows
  __syncthreads();

  const int tile0 = 2 * warp;  // this warp's m16 tiles: tile0, tile0 + 1
  const bool active = tile0 < p.qb * p.tpq;
  uint32_t qa[2][kKSteps][4];
  float wt[2][2];  // head weight of rows g and g + 8 of each m tile
  warp_fragments(p, b, s0, sQ, warp, lane, qa, wt);

  float v[2][8][2];  // the terms of a key tile
  for (int j = 0; j < ntiles; ++j) {
    if (j + 1 < ntiles) load_keys(j + 1, (j + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // key tile j
    __syncthreads();
    if (active) {
      const T* kt = sK + (j & 1) * kKeys * kPitch;
      float acc[2][8][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        if (ks < p.ksteps) {
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            uint32_t bf[4];
            ldsm_x4(bf, kt + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kPitch + ks * 16 +
                            ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              mma16816<T>(acc[mt][2 * np], qa[mt][ks], bf[0], bf[1]);
              mma16816<T>(acc[mt][2 * np + 1], qa[mt][ks], bf[2], bf[3]);
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) head_terms(acc[mt], wt[mt], v[mt]);
    }
    // every path syncs: the next tile's copies overwrite this tile's stage
    tile_rows<true>(p, b, s0, j, v, active, tile0, lane, tid, kThreads, sLim, sPart,
                    [] { __syncthreads(); });
  }
  write_past(p, b, s0, ntiles, tid, kThreads);
}

}  // namespace
}  // namespace opslot::dsa
