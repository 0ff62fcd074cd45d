// The lightning indexer's scores of DeepSeek sparse attention (opslot_kernels/dsa_indexer.h):
// out[b, s, t] = scale * sum_h w[b, s, h] * relu(q[b, s, h] . k[b, t]) for t < limit[b, s], else
// -inf. 16-bit inputs on tensor cores (fp32 accumulation): warpgroup MMAs on Hopper where the shape
// takes them (dsa_indexer90.cuh), mma.sync m16n8k16 elsewhere (dsa_indexer_mma.cuh), the same bits;
// fp32 inputs on an exact CUDA-core kernel.
#include <cmath>

#include "common.cuh"
#include "dsa_indexer90.cuh"
#include "dsa_indexer_mma.cuh"
#include "opslot_kernels/dsa_indexer.h"

namespace opslot::dsa {
namespace {

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

// A stride matters only where its dimension has more than one element.
bool stride_ok(int64_t size, int64_t stride) { return size <= 1 || stride % 8 == 0; }

constexpr const char* kName = "opslot_dsa_index_scores";

// Where the warpgroup-MMA kernel applies (opslot_dsa_scores_set_tuning, bench library only): 0
// (the default) production's kernel, 1 the mma.sync kernel, 2 to 4 the warpgroup-MMA kernel with
// that many warpgroups a CTA.
#ifdef OPSLOT_KERNELS_BENCH
int g_scores_kernel = 0;
#else
constexpr int g_scores_kernel = 0;
#endif

template <typename E, int kG>
int launch_wgmma(const MmaParams& p, int64_t B, cudaStream_t stream) {
  const auto kernel = &scores_wgmma_kernel<E, kG>;
  if (int rc = set_smem(reinterpret_cast<const void*>(kernel), wg_smem(kG), kName)) return rc;
  const dim3 grid(static_cast<unsigned>((p.blocks + kG - 1) / kG), static_cast<unsigned>(B));
  kernel<<<grid, kG * kThreads, wg_smem(kG), stream>>>(p);
  return check_launch(kName);
}

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
  if (g_scores_kernel != 1 && wgmma_shape(p) && device_is_sm90()) {
#ifdef OPSLOT_KERNELS_BENCH
    if (g_scores_kernel == 2) return launch_wgmma<E, 2>(p, B, stream);
    if (g_scores_kernel == 3) return launch_wgmma<E, 3>(p, B, stream);
    if (g_scores_kernel == 4) return launch_wgmma<E, 4>(p, B, stream);
#endif
    return launch_wgmma<E, kWgGroups>(p, B, stream);
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

#ifdef OPSLOT_KERNELS_BENCH
extern "C" OPSLOT_API int opslot_dsa_scores_set_tuning(int kernel) {
  if (kernel < 0 || kernel > 4)
    return opslot::set_error(
        OPSLOT_ERR_INVALID_ARGUMENT,
        "dsa scores tuning: kernel 0 (production's), 1 (the mma.sync kernel "
        "everywhere) or 2 to 4 (warpgroups a CTA of the warpgroup-MMA kernel)");
  opslot::dsa::g_scores_kernel = kernel;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH
