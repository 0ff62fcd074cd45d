// The lightning indexer's scores of DeepSeek sparse attention (opslot_kernels/dsa_indexer.h):
// out[b, s, t] = scale * sum_h w[b, s, h] * relu(q[b, s, h] . k[b, t]) for t < limit[b, s], else
// -inf. 16-bit inputs on tensor cores (mma.sync m16n8k16, fp32 accumulation); fp32 inputs on an
// exact CUDA-core kernel.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "opslot_kernels/dsa_indexer.h"

namespace opslot::dsa {
namespace {

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (float16 / bfloat16).
//
// A block owns kRows = 128 rows (query, head) of the [S * Hp, D] query matrix: qb consecutive
// queries, each with its heads padded with zero rows to Hp = 16 * ceil(H / 16) (so that each m16
// tile belongs to one query; qb = 8 / (Hp / 16)). Each of the 4 warps keeps two m16 tiles of those
// rows in registers as mma A fragments (D <= 128: 8 k-steps x 4 registers per tile) and the block
// walks the keys in tiles of 64 (cp.async, two stages) up to the largest limit of its queries. Per
// key tile a warp computes its 32 x 64 dot products (K fragments by ldmatrix, reused by both m
// tiles), applies relu and the head weights to the accumulators in registers, sums its rows
// (within a lane, then a 3-round shuffle that leaves each lane the sums of one n8 tile), and writes
// one partial row per query and warp to shared memory; after a barrier the block adds the partial
// rows of each query in a fixed order, scales and writes the output row (-inf at or past the
// query's limit). Key tiles past every limit of the block are written -inf without computing.
// ---------------------------------------------------------------------------------------------

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

// 16 bytes global -> shared, or 16 zero bytes when !live (src is then not read).
__device__ __forceinline__ void cp16_or_zero(void* smem, const void* gmem, bool live) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(live ? 16 : 0)
               : "memory");
}

// relu that keeps NaN (as torch.relu): x < 0 is false for NaN.
__device__ __forceinline__ float relu(float x) { return x < 0.f ? 0.f : x; }

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
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);

  if (tid < kMTiles) {
    int lim = 0;
    if (tid < p.qb && s0 + tid < p.S) {
      int64_t l = p.limit != nullptr ? static_cast<int64_t>(p.limit[b * p.S + s0 + tid]) : p.T;
      l = l < 0 ? 0 : (l > p.T ? p.T : l);
      lim = static_cast<int>(l);
    }
    sLim[tid] = lim;
  }

  // Query rows (zero rows for padding heads and queries past S; zero columns past D).
  const int pieces = 2 * p.ksteps;  // 16-byte pieces of a row that the mma reads
  const int live_pieces = p.D / 8;
  for (int i = tid; i < kRows * pieces; i += kThreads) {
    const int r = i / pieces, c = i % pieces;
    const int qi = r / p.hp, h = r % p.hp;
    const bool live = qi < p.qb && s0 + qi < p.S && h < p.H && c < live_pieces;
    const T* src = live ? q + b * p.qs0 + (s0 + qi) * p.qs1 + h * p.qs2 + c * 8 : q;
    cp16_or_zero(sQ + r * kPitch + c * 8, src, live);
  }
  cp_async_commit();
  __syncthreads();  // sLim
  int lmax = 0;
  for (int i = 0; i < p.qb; ++i) lmax = max(lmax, sLim[i]);
  const int ntiles = (lmax + kKeys - 1) / kKeys;

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

  const int g = lane >> 2, tq = lane & 3;
  const int tile0 = 2 * warp;  // this warp's m16 tiles: tile0, tile0 + 1
  const bool active = tile0 < p.qb * p.tpq;
  const bool same_query = (tile0 / p.tpq) == ((tile0 + 1) / p.tpq);
  uint32_t qa[2][kKSteps][4];
  float wt[2][2];  // head weight of rows g and g + 8 of each m tile
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
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = (tile0 + mt) * 16 + g + 8 * half;
      const int qi = r / p.hp, h = r % p.hp;
      const bool live = qi < p.qb && s0 + qi < p.S && h < p.H;
      wt[mt][half] = live ? p.w[b * p.ws0 + (s0 + qi) * p.ws1 + h * p.ws2] : 0.f;
    }
  }

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
      float v[2][8][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            v[mt][n][c] = wt[mt][0] * relu(acc[mt][n][c]) + wt[mt][1] * relu(acc[mt][n][2 + c]);
      float y[2];
      const int col = g * 8 + 2 * tq;
      if (same_query) {
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) v[0][n][c] += v[1][n][c];
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
    __syncthreads();
    const int64_t t0 = static_cast<int64_t>(j) * kKeys;
    for (int i = tid; i < p.qb * kKeys; i += kThreads) {
      const int qi = i / kKeys, c = i % kKeys;
      const int64_t s = s0 + qi, t = t0 + c;
      if (s < p.S && t < p.T) {
        float r = -INFINITY;
        if (t < sLim[qi]) {
          float sum = 0.f;
          for (int m = 0; m < p.tpq; ++m) sum += sPart[(qi * p.tpq + m) * kKeys + c];
          r = sum * p.scale;
        }
        p.out[(b * p.S + s) * p.T + t] = r;
      }
    }
  }
  // Keys past every limit of the block.
  for (int qi = 0; qi < p.qb; ++qi) {
    const int64_t s = s0 + qi;
    if (s >= p.S) break;
    float* row = p.out + (b * p.S + s) * p.T;
    for (int64_t t = static_cast<int64_t>(ntiles) * kKeys + tid; t < p.T; t += kThreads)
      row[t] = -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// fp32 kernel (CUDA cores, exact fp32 products and sums). A block takes 16 queries x 64 keys (256
// threads, four keys each): the key tile stays in shared memory, the 16 queries' rows of one head
// at a time are loaded next to it, and each thread adds w * relu(dot) per head into four
// registers. Tiles wholly at or past their queries' limits write -inf without computing.
// ---------------------------------------------------------------------------------------------

constexpr int kF32Threads = 256;
constexpr int kF32Queries = 16;
constexpr int kF32Keys = 64;
constexpr int kF32DMax = 512;

struct F32Params {
  const float* q;
  const float* k;
  const float* w;
  const int32_t* limit;
  float* out;
  int64_t qs0, qs1, qs2, ks0, ks1, ws0, ws1, ws2;
  int64_t S, T;
  int H, D;
  float scale;
};

size_t f32_smem(int D) { return sizeof(float) * (kF32Keys + kF32Queries) * (D + 1); }

__global__ void __launch_bounds__(kF32Threads) scores_f32_kernel(const F32Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int pitch = p.D + 1;  // odd pitch: the 16 keys a warp reads sit in distinct banks
  float* sK = reinterpret_cast<float*>(smem);
  float* sQ = sK + kF32Keys * pitch;
  __shared__ int sLim[kF32Queries];
  const int tid = threadIdx.x;
  const int64_t b = blockIdx.z;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kF32Queries;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kF32Keys;
  if (tid < kF32Queries) {
    int64_t l = 0;
    if (s0 + tid < p.S) {
      l = p.limit != nullptr ? static_cast<int64_t>(p.limit[b * p.S + s0 + tid]) : p.T;
      l = l < 0 ? 0 : (l > p.T ? p.T : l);
    }
    sLim[tid] = static_cast<int>(l);
  }
  __syncthreads();
  int lmax = 0;
  for (int i = 0; i < kF32Queries; ++i) lmax = max(lmax, sLim[i]);
  const int qi = tid / 16, kj = tid % 16;
  const int64_t s = s0 + qi;
  if (t0 >= lmax) {
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + kj + 16 * j;
      if (s < p.S && t < p.T) p.out[(b * p.S + s) * p.T + t] = -INFINITY;
    }
    return;
  }
  for (int i = tid; i < kF32Keys * p.D; i += kF32Threads) {
    const int r = i / p.D, d = i % p.D;
    sK[r * pitch + d] = t0 + r < p.T ? p.k[b * p.ks0 + (t0 + r) * p.ks1 + d] : 0.f;
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int h = 0; h < p.H; ++h) {
    __syncthreads();  // sK written; the previous head's sQ read
    for (int i = tid; i < kF32Queries * p.D; i += kF32Threads) {
      const int r = i / p.D, d = i % p.D;
      sQ[r * pitch + d] = s0 + r < p.S ? p.q[b * p.qs0 + (s0 + r) * p.qs1 + h * p.qs2 + d] : 0.f;
    }
    __syncthreads();
    float dot[4] = {0.f, 0.f, 0.f, 0.f};
    const float* qr = sQ + qi * pitch;
    for (int d = 0; d < p.D; ++d) {
      const float x = qr[d];
#pragma unroll
      for (int j = 0; j < 4; ++j) dot[j] = fmaf(x, sK[(kj + 16 * j) * pitch + d], dot[j]);
    }
    const float w = s < p.S ? p.w[b * p.ws0 + s * p.ws1 + h * p.ws2] : 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = fmaf(w, relu(dot[j]), acc[j]);
  }
  if (s >= p.S) return;
  for (int j = 0; j < 4; ++j) {
    const int64_t t = t0 + kj + 16 * j;
    if (t < p.T) p.out[(b * p.S + s) * p.T + t] = t < sLim[qi] ? acc[j] * p.scale : -INFINITY;
  }
}

int set_smem(const void* kernel, size_t bytes, const char* what) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                     bytes, cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A stride matters only where its dimension has more than one element.
bool stride_ok(int64_t size, int64_t stride) { return size <= 1 || stride % 8 == 0; }

constexpr const char* kName = "opslot_dsa_index_scores";

template <typename E>
int launch_mma(int64_t B, int64_t S, int64_t H, int64_t D, int64_t T, const void* q,
               const int64_t* qst, const void* k, const int64_t* kst, const float* w,
               const int64_t* wst, float scale, const int32_t* limit, float* out,
               cudaStream_t stream) {
  MmaParams p{};
  p.q = q;
  p.k = k;
  p.w = w;
  p.limit = limit;
  p.out = out;
  p.qs0 = qst[0];
  p.qs1 = qst[1];
  p.qs2 = qst[2];
  p.ks0 = kst[0];
  p.ks1 = kst[1];
  p.ws0 = wst[0];
  p.ws1 = wst[1];
  p.ws2 = wst[2];
  p.S = S;
  p.T = T;
  p.H = static_cast<int>(H);
  p.D = static_cast<int>(D);
  p.scale = scale;
  p.hp = H == 0 ? 16 : static_cast<int>((H + 15) / 16 * 16);
  p.tpq = p.hp / 16;
  p.qb = kMTiles / p.tpq;
  p.ksteps = static_cast<int>((D + 15) / 16);
  p.blocks = (S + p.qb - 1) / p.qb;
  if (p.blocks > 0x7fffffff) {
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: %lld queries are more than one launch takes",
                     kName, static_cast<long long>(S));
  }
  if (int rc = set_smem(reinterpret_cast<const void*>(&scores_mma_kernel<E>), kMmaSmem, kName))
    return rc;
  const dim3 grid(static_cast<unsigned>(p.blocks), static_cast<unsigned>(B));
  scores_mma_kernel<E><<<grid, kThreads, kMmaSmem, stream>>>(p);
  return check_launch(kName);
}

int launch_f32(int64_t B, int64_t S, int64_t H, int64_t D, int64_t T, const float* q,
               const int64_t* qst, const float* k, const int64_t* kst, const float* w,
               const int64_t* wst, float scale, const int32_t* limit, float* out,
               cudaStream_t stream) {
  const int64_t qblocks = (S + kF32Queries - 1) / kF32Queries;
  const int64_t kblocks = (T + kF32Keys - 1) / kF32Keys;
  if (qblocks > 0x7fffffff || kblocks > 65535) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: %lld queries x %lld keys are more than one float32 launch takes", kName,
                     static_cast<long long>(S), static_cast<long long>(T));
  }
  const F32Params p{q,
                    k,
                    w,
                    limit,
                    out,
                    qst[0],
                    qst[1],
                    qst[2],
                    kst[0],
                    kst[1],
                    wst[0],
                    wst[1],
                    wst[2],
                    S,
                    T,
                    static_cast<int>(H),
                    static_cast<int>(D),
                    scale};
  const size_t smem = f32_smem(static_cast<int>(D));
  if (int rc = set_smem(reinterpret_cast<const void*>(&scores_f32_kernel), smem, kName)) return rc;
  const dim3 grid(static_cast<unsigned>(qblocks), static_cast<unsigned>(kblocks),
                  static_cast<unsigned>(B));
  scores_f32_kernel<<<grid, kF32Threads, smem, stream>>>(p);
  return check_launch(kName);
}

}  // namespace
}  // namespace opslot::dsa

extern "C" {

OPSLOT_API int opslot_dsa_index_scores(int dtype, int64_t batch, int64_t seq, int64_t heads,
                                       int64_t dim, int64_t keys, const void* q,
                                       const int64_t* q_stride, const void* k,
                                       const int64_t* k_stride, const float* weights,
                                       const int64_t* w_stride, float scale, const int32_t* limit,
                                       float* out, void* stream) {
  using namespace opslot;
  using namespace opslot::dsa;
  if (batch < 0 || seq < 0 || heads < 0 || dim < 0 || keys < 0) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: negative size (batch %lld, seq %lld, heads %lld, dim %lld, keys %lld)",
                     kName, static_cast<long long>(batch), static_cast<long long>(seq),
                     static_cast<long long>(heads), static_cast<long long>(dim),
                     static_cast<long long>(keys));
  }
  if (batch == 0 || seq == 0 || keys == 0) return OPSLOT_OK;  // nothing to write
  if (out == nullptr || q_stride == nullptr || k_stride == nullptr || w_stride == nullptr ||
      (heads > 0 && weights == nullptr) ||
      (heads > 0 && dim > 0 && (q == nullptr || k == nullptr))) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", kName);
  }
  if (batch > 65535) {
    return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: batch %lld > 65535", kName,
                     static_cast<long long>(batch));
  }
  const auto st = static_cast<cudaStream_t>(stream);
  if (dtype == OPSLOT_FLOAT32) {
    if (dim > kF32DMax) {
      return set_error(OPSLOT_ERR_UNSUPPORTED,
                       "%s: head dim %lld; the float32 kernel takes up to %d", kName,
                       static_cast<long long>(dim), kF32DMax);
    }
    return launch_f32(batch, seq, heads, dim, keys, static_cast<const float*>(q), q_stride,
                      static_cast<const float*>(k), k_stride, weights, w_stride, scale, limit, out,
                      st);
  }
  if (dtype != OPSLOT_FLOAT16 && dtype != OPSLOT_BFLOAT16) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", kName, dtype);
  }
  if (dim > kDMax || heads > kRows) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: head dim %lld and %lld heads; the 16-bit kernel takes up to %d and %d",
                     kName, static_cast<long long>(dim), static_cast<long long>(heads), kDMax,
                     kRows);
  }
  if (dim % 8 != 0 || !stride_ok(batch, q_stride[0]) || !stride_ok(seq, q_stride[1]) ||
      !stride_ok(heads, q_stride[2]) || !stride_ok(batch, k_stride[0]) ||
      !stride_ok(keys, k_stride[1]) || (q != nullptr && !aligned16(q)) ||
      (k != nullptr && !aligned16(k))) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: the 16-bit kernel needs a head dim (%lld) and q/k strides that are "
                     "multiples of 8 elements and 16-byte aligned q and k",
                     kName, static_cast<long long>(dim));
  }
  if (dtype == OPSLOT_BFLOAT16) {
    return launch_mma<__nv_bfloat16>(batch, seq, heads, dim, keys, q, q_stride, k, k_stride,
                                     weights, w_stride, scale, limit, out, st);
  }
  return launch_mma<__half>(batch, seq, heads, dim, keys, q, q_stride, k, k_stride, weights,
                            w_stride, scale, limit, out, st);
}

}  // extern "C"
