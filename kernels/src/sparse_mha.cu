// Sparse multi-head attention over per-head key and value caches, forward only
// (kernels/include/opslot_kernels/sparse_mha.h; docs/kernels.md "sparse_mha_attention").
//
// A row is one (query token, head): it reads its K selected key and value rows once (no reuse
// across rows: memory-bound, CUDA cores, fp32 math). The row's keys are split over nsplit CTAs
// (splits_of: about kTargetCtas CTAs in all, at least kMinKeys keys a split; a function of the
// shapes only). In a CTA, warp w takes the groups w, w + 4, ... of kGroup consecutive keys: the
// group's indices, then every lane's 16-byte chunks of the group's key and value rows (all in
// flight together), the scores reduced across the warp, an online softmax in the log2 domain (q is
// scaled by scale * log2(e) once). The four warps' (max, sum, output) are merged in a fixed order
// through shared memory into the row's output (one split) or into the split's scratch slot, which
// merge_kernel combines, again in split order. Rows whose dims or strides rule out 16-byte loads
// take the same kernel with one element a load.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/sparse_mha.h"

namespace opslot::mha {
namespace {

constexpr int kThreads = 128;  // four warps a CTA
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 4;              // keys a warp loads at once
constexpr int kMaxDim = 512;           // dk and dv
constexpr int64_t kTargetCtas = 1024;  // split keys until the grid has about this many CTAs
constexpr int64_t kMinKeys = 64;       // keys a split at least

struct Dev {
  int64_t rows, S, T, H, group, dk, dv, K, per_split;
  int nsplit;
  float scale_log2;
  const void* q;
  const void* k;
  const void* v;
  const int32_t* idx;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, is0, is1;
};

// A chunk of E elements of T as loaded (16 bytes where E > 1), and as floats.
template <typename T, int E>
using Raw = std::conditional_t<E == 1, T, uint4>;
template <typename T, int E>
__device__ __forceinline__ Raw<T, E> load_raw(const T* p) {
  if constexpr (E == 1) {
    return p[0];
  } else {
    static_assert(E * sizeof(T) == 16, "a chunk is 16 bytes");
    return __ldg(reinterpret_cast<const uint4*>(p));
  }
}
template <typename T, int E>
__device__ __forceinline__ Raw<T, E> zero_raw() {
  if constexpr (E == 1) {
    return from_float<T>(0.f);
  } else {
    return make_uint4(0, 0, 0, 0);
  }
}
template <typename T, int E>
__device__ __forceinline__ void to_floats(const Raw<T, E>& r, float (&x)[E]) {
  if constexpr (E == 1) {
    x[0] = to_float(r);
  } else {
    Vec<T, E> v;
    memcpy(&v, &r, 16);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = to_float(v.v[e]);
  }
}

// One split of one row's keys: lane l holds chunks l, l + 32, ... (NC of them, E elements each)
// of the query, key, value and output rows.
template <typename T, int E, int NC>
__global__ void __launch_bounds__(kThreads)
    split_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse,
                 float* __restrict__ part) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_o[kWarps][kMaxDim];
  const int64_t row = blockIdx.x;
  const int split = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h = row % p.H, bs = row / p.H, b = bs / p.S, s = bs % p.S, hk = h / p.group;
  const T* q = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1 + h * p.qs2;
  const T* kb = static_cast<const T*>(p.k) + b * p.ks0 + hk * p.ks1;
  const T* vb = static_cast<const T*>(p.v) + b * p.vs0 + hk * p.vs1;
  const int32_t* idx = p.idx + b * p.is0 + s * p.is1;
  const int nck = static_cast<int>(p.dk / E), ncv = static_cast<int>(p.dv / E);

  float qf[NC][E], acc[NC][E];
#pragma unroll
  for (int m = 0; m < NC; ++m) {
    const int c = lane + 32 * m;
    to_floats<T, E>(c < nck ? load_raw<T, E>(q + c * E) : zero_raw<T, E>(), qf[m]);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qf[m][e] *= p.scale_log2;
      acc[m][e] = 0.f;
    }
  }
  float m_run = neg_inf(), l_run = 0.f;
  const int64_t j0 = split * p.per_split, j1 = min(p.K, j0 + p.per_split);
  for (int64_t g = j0 + warp * kGroup; g < j1; g += kWarps * kGroup) {
    int64_t id[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int x = g + u < j1 ? idx[g + u] : -1;
      id[u] = x >= 0 && x < p.T ? x : -1;
    }
    Raw<T, E> kx[kGroup][NC], vx[kGroup][NC];  // converted where used: fewer registers
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
#pragma unroll
      for (int m = 0; m < NC; ++m) {
        const int c = lane + 32 * m;
        kx[u][m] =
            id[u] >= 0 && c < nck ? load_raw<T, E>(kb + id[u] * p.ks2 + c * E) : zero_raw<T, E>();
        vx[u][m] =
            id[u] >= 0 && c < ncv ? load_raw<T, E>(vb + id[u] * p.vs2 + c * E) : zero_raw<T, E>();
      }
    }
    float sc[kGroup];
    float mx = m_run;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      float d = 0.f;
#pragma unroll
      for (int m = 0; m < NC; ++m) {
        float x[E];
        to_floats<T, E>(kx[u][m], x);
#pragma unroll
        for (int e = 0; e < E; ++e) d = fmaf(qf[m][e], x[e], d);
      }
      d = warp_sum(d);
      sc[u] = id[u] >= 0 ? d : neg_inf();
      mx = fmaxf(mx, sc[u]);
    }
    if (mx == neg_inf()) continue;  // no valid key yet (the same on every lane)
    const float alpha = exp2f(m_run - mx);
    l_run *= alpha;
#pragma unroll
    for (int m = 0; m < NC; ++m)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[m][e] *= alpha;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const float pu = exp2f(sc[u] - mx);
      l_run += pu;
#pragma unroll
      for (int m = 0; m < NC; ++m) {
        float x[E];
        to_floats<T, E>(vx[u][m], x);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[m][e] = fmaf(pu, x[e], acc[m][e]);
      }
    }
    m_run = mx;
  }

  // The four warps merged, warp 0 first.
  if (lane == 0) {
    s_m[warp] = m_run;
    s_l[warp] = l_run;
  }
#pragma unroll
  for (int m = 0; m < NC; ++m) {
    const int c = lane + 32 * m;
    if (c < ncv) {
#pragma unroll
      for (int e = 0; e < E; ++e) s_o[warp][c * E + e] = acc[m][e];
    }
  }
  __syncthreads();
  float mm = s_m[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) mm = fmaxf(mm, s_m[w]);
  float f[kWarps], l = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s_m[w] == neg_inf() ? 0.f : exp2f(s_m[w] - mm);
    l = fmaf(f[w], s_l[w], l);
  }
  const int64_t slot = row * p.nsplit + split;
  for (int c = tid; c < p.dv; c += kThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o = fmaf(f[w], s_o[w][c], o);
    if (p.nsplit == 1)
      out[row * p.dv + c] = from_float<T>(l > 0.f ? o / l : 0.f);
    else
      part[slot * p.dv + c] = o;
  }
  if (tid == 0) {
    if (p.nsplit == 1) {
      lse[row] = l > 0.f ? (mm + log2f(l)) * kLn2 : neg_inf();
    } else {
      float* ml = part + p.rows * p.nsplit * p.dv;
      ml[2 * slot] = mm;
      ml[2 * slot + 1] = l;
    }
  }
}

// A row's splits combined in split order: out and lse.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse,
                 const float* __restrict__ part) {
  const int64_t row = blockIdx.x;
  const float* ml = part + p.rows * p.nsplit * p.dv + row * p.nsplit * 2;
  const float* po = part + row * p.nsplit * p.dv;
  float mm = neg_inf();
  for (int i = 0; i < p.nsplit; ++i) mm = fmaxf(mm, ml[2 * i]);
  float l = 0.f;
  for (int i = 0; i < p.nsplit; ++i) {
    if (ml[2 * i] != neg_inf()) l = fmaf(exp2f(ml[2 * i] - mm), ml[2 * i + 1], l);
  }
  for (int c = threadIdx.x; c < p.dv; c += kThreads) {
    float o = 0.f;
    for (int i = 0; i < p.nsplit; ++i) {
      if (ml[2 * i] != neg_inf()) o = fmaf(exp2f(ml[2 * i] - mm), po[i * p.dv + c], o);
    }
    out[row * p.dv + c] = from_float<T>(l > 0.f ? o / l : 0.f);
  }
  if (threadIdx.x == 0) lse[row] = l > 0.f ? (mm + log2f(l)) * kLn2 : neg_inf();
}

// ---------------------------------------------------------------------------------------------
// Host side.

int check(const opslot_sparse_mha_problem* p, const char* what) {
  if (p == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: no problem given", what);
  if (p->dtype != OPSLOT_FLOAT32 && p->dtype != OPSLOT_FLOAT16 && p->dtype != OPSLOT_BFLOAT16)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, p->dtype);
  if (p->batch < 0 || p->seqlen < 0 || p->kvlen < 0 || p->topk < 0 || p->heads < 1 ||
      p->kv_heads < 1 || p->heads % p->kv_heads != 0 || p->kvlen >= (1LL << 31) ||
      p->topk >= (1LL << 31) || p->batch * p->seqlen >= (1LL << 31) / p->heads) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape batch %lld, seqlen %lld, kvlen %lld, heads %lld, kv_heads "
                     "%lld, topk %lld",
                     what, static_cast<long long>(p->batch), static_cast<long long>(p->seqlen),
                     static_cast<long long>(p->kvlen), static_cast<long long>(p->heads),
                     static_cast<long long>(p->kv_heads), static_cast<long long>(p->topk));
  }
  if (p->dk < 1 || p->dk > kMaxDim || p->dv < 1 || p->dv > kMaxDim) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: head dims dk %lld, dv %lld: this kernel takes 1 <= dk, dv <= %d", what,
                     static_cast<long long>(p->dk), static_cast<long long>(p->dv), kMaxDim);
  }
  if (p->batch * p->seqlen > 0 &&
      (p->q == nullptr || (p->indices == nullptr && p->topk > 0) ||
       ((p->k == nullptr || p->v == nullptr) && p->kvlen > 0 && p->topk > 0))) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null input pointer", what);
  }
  return OPSLOT_OK;
}

int64_t rows_of(const opslot_sparse_mha_problem& p) { return p.batch * p.seqlen * p.heads; }

// Splits of each row's keys: a function of the shapes only (the results' bits follow from it).
int64_t splits_of(int64_t rows, int64_t K) {
  if (rows == 0 || K <= kMinKeys) return 1;
  const int64_t n = std::min((kTargetCtas + rows - 1) / rows, (K + kMinKeys - 1) / kMinKeys);
  if (n <= 1) return 1;
  const int64_t per = (K + n - 1) / n;
  return (K + per - 1) / per;
}

// 16-byte loads apply: dims a multiple of 16 bytes, every row of q, k and v starting 16-byte
// aligned.
bool vec_ok(const opslot_sparse_mha_problem& p, int es) {
  return (p.dk * es) % 16 == 0 && (p.dv * es) % 16 == 0 && aligned16(p.q) && aligned16(p.k) &&
         aligned16(p.v) && stride16_ok(p.q_stride[0], p.batch, es) &&
         stride16_ok(p.q_stride[1], p.seqlen, es) && stride16_ok(p.q_stride[2], p.heads, es) &&
         stride16_ok(p.k_stride[0], p.batch, es) && stride16_ok(p.k_stride[1], p.kv_heads, es) &&
         stride16_ok(p.k_stride[2], p.kvlen, es) && stride16_ok(p.v_stride[0], p.batch, es) &&
         stride16_ok(p.v_stride[1], p.kv_heads, es) && stride16_ok(p.v_stride[2], p.kvlen, es);
}

template <typename K, typename... A>
int launch(const char* what, K kernel, dim3 grid, cudaStream_t stream, A... args) {
  kernel<<<grid, kThreads, 0, stream>>>(args...);
  return check_launch(what);
}

}  // namespace
}  // namespace opslot::mha

using namespace opslot;
using namespace opslot::mha;

extern "C" {

OPSLOT_API int64_t opslot_sparse_mha_scratch_floats(const opslot_sparse_mha_problem* p) {
  if (check(p, "opslot_sparse_mha_scratch_floats")) return -1;
  const int64_t rows = rows_of(*p), n = splits_of(rows, p->topk);
  return n == 1 ? 0 : rows * n * (p->dv + 2);
}

OPSLOT_API int opslot_sparse_mha_fwd(const opslot_sparse_mha_problem* p, void* out, float* lse,
                                     float* scratch, void* stream) {
  constexpr const char* what = "opslot_sparse_mha_fwd";
  if (int rc = check(p, what)) return rc;
  const int64_t rows = rows_of(*p);
  if (rows == 0) return OPSLOT_OK;
  const int64_t nsplit = splits_of(rows, p->topk);
  if (out == nullptr || lse == nullptr || (nsplit > 1 && scratch == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null output or scratch pointer", what);
  Dev d{};
  d.rows = rows;
  d.S = p->seqlen;
  d.T = p->kvlen;
  d.H = p->heads;
  d.group = p->heads / p->kv_heads;
  d.dk = p->dk;
  d.dv = p->dv;
  d.K = p->topk;
  d.nsplit = static_cast<int>(nsplit);
  d.per_split = nsplit == 1 ? std::max<int64_t>(p->topk, 1) : (p->topk + nsplit - 1) / nsplit;
  d.scale_log2 = p->scale * kLog2e;
  d.q = p->q;
  d.k = p->k;
  d.v = p->v;
  d.idx = p->indices;
  d.qs0 = p->q_stride[0];
  d.qs1 = p->q_stride[1];
  d.qs2 = p->q_stride[2];
  d.ks0 = p->k_stride[0];
  d.ks1 = p->k_stride[1];
  d.ks2 = p->k_stride[2];
  d.vs0 = p->v_stride[0];
  d.vs1 = p->v_stride[1];
  d.vs2 = p->v_stride[2];
  d.is0 = p->idx_stride[0];
  d.is1 = p->idx_stride[1];
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(nsplit));
  return dispatch_dtype(p->dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    int rc = OPSLOT_OK;
    if (vec_ok(*p, sizeof(T))) {
      constexpr int E = 16 / sizeof(T);  // 8 (16-bit rows: at most two chunks a lane) or 4
      const int64_t chunks = (std::max(p->dk, p->dv) / E + 31) / 32;  // a lane's chunks
      if (chunks <= 1) {
        rc = launch(what, split_kernel<T, E, 1>, grid, st, d, o, lse, scratch);
      } else if (E == 8 || chunks <= 2) {
        rc = launch(what, split_kernel<T, E, 2>, grid, st, d, o, lse, scratch);
      } else if constexpr (E == 4) {
        rc = launch(what, split_kernel<T, E, 4>, grid, st, d, o, lse, scratch);
      }
    } else {
      rc = launch(what, split_kernel<T, 1, kMaxDim / 32>, grid, st, d, o, lse, scratch);
    }
    if (rc != OPSLOT_OK || nsplit == 1) return rc;
    return launch(what, merge_kernel<T>, dim3(static_cast<unsigned>(rows)), st, d, o, lse,
                  static_cast<const float*>(scratch));
  });
}

}  // extern "C"
