// Sparse multi-query attention over per-query index lists, forward and backward
// (kernels/include/opslot_kernels/sparse_attention.h; docs/kernels.md "sparse_mqa_attention").
//
// bf16 / fp16: one CTA per query token and block of 64 heads (rows). The query's selected kv rows
// are gathered 32 at a time (cp.async, zero rows for skipped indices) into shared memory, where
// every head of the block uses them: S = Q K^T, online softmax, O += P V with mma.sync m16n8k16
// (operands in the input dtype, fp32 accumulation). V is the first dv columns of the same rows
// (MLA's latent kv: no second load). The backward recomputes S and P per tile, dP = dO V^T, dS = P
// (dP - delta), accumulates dq = dS K in registers and writes the tile's dkv contribution dS^T Q +
// P^T dO (summed over the block's heads) to a scratch row per (query, selected key); a second
// kernel adds those rows per key in a fixed order (an inverse index sorted by key, then query).
// fp32: the same algorithm on CUDA cores in fp32 (exact, slow: for tests and fp32 users).
#include <cfloat>

#include "common.cuh"
#include "mma_sm80.cuh"
#include "opslot_kernels/sparse_attention.h"

namespace opslot::sparse {
namespace {

constexpr int kRows = 64;         // heads per CTA (a block of up to 64 heads, padded)
constexpr int kBk = 32;           // keys per tile
constexpr int kLdP = kBk + 8;     // row pitch of the P / dS tiles (elements)
constexpr int kMaxDqk = 576;      // largest Dqk (GLM-5's absorbed MLA: 512 + 64)
constexpr int kMaxDv = 512;       // largest dv (8 warps x 64 columns in the forward)
constexpr int kFwdThreads = 256;  // 8 warps
constexpr int kBwdThreads = 512;  // 16 warps
constexpr int kSimtThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kMaskedBelow = -65504.f;  // float16's finfo.min: every float dtype's min is <= this

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// The problem as the kernels read it (passed by value).
struct Dev {
  int64_t B, S, T, H, dqk, dv, K;
  float scale, scale_log2;
  const void* q;
  const void* kv;
  const int32_t* idx;
  const float* sinks;
  int64_t qs0, qs1, qs2, kvs0, kvs1, is0, is1;
  int dpad, dvpad, ldq, ldo;   // Dqk and dv rounded up to 64; smem row pitches of Q/K and dO
  bool q_vec, kv_vec, do_vec;  // 16-byte cp.async is possible for q rows, kv rows, dout rows
};

// Tensor-core helpers: mma_sm80.cuh (ldsm_x4/x2 and their .trans forms, mma16816).

// acc[mt][nt] (16 x 8 tiles) += A[m0 + 16 mt .., k] * B[k, n0 + 8 nt ..] over k in [0, 16 ksteps),
// operands in shared memory. A is stored [m][k] (A + m * lda + k) or, when AT, [k][m]; B is
// stored [n][k] (B + n * ldb + k) or, when BT, [k][n]. n-tiles nt >= nt_live are skipped. Every
// row address is 16-byte aligned (pitches and offsets are multiples of 8 elements).
template <typename T, int MT, int NT, bool AT, bool BT>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const T* A, int lda, int m0,
                                         const T* B, int ldb, int n0, int ksteps, int nt_live) {
  const int lane = threadIdx.x & 31;
  for (int ks = 0; ks < ksteps; ++ks) {
    const int k = ks * 16;
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (!AT) {
        ldsm_x4(a[mt], A + (m0 + mt * 16 + (lane & 15)) * lda + k + ((lane >> 4) << 3));
      } else {
        ldsm_x4_t(a[mt], A + (k + (lane & 7) + ((lane >> 4) << 3)) * lda + m0 + mt * 16 +
                             (((lane >> 3) & 1) << 3));
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt < nt_live) {
        uint32_t bf[2];
        if constexpr (!BT) {
          ldsm_x2(bf, B + (n0 + nt * 8 + (lane & 7)) * ldb + k + (((lane >> 3) & 1) << 3));
        } else {
          ldsm_x2_t(bf, B + (k + (lane & 7) + (((lane >> 3) & 1) << 3)) * ldb + n0 + nt * 8);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma16816<T>(acc[mt][nt], a[mt], bf);
      }
    }
  }
}

// Two adjacent 16-bit elements from two floats (round to nearest even), one 32-bit store.
template <typename T>
__device__ __forceinline__ void st_pair(T* p, float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  } else {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
}

// dst rows r < nrows (pitch ldd), columns [0, cpad): the first `cols` elements of row src(r), the
// rest 0; a row src(r) == nullptr is all 0. With `vec`, 16-byte cp.async copies (cols and cpad
// multiples of 16 bytes, rows aligned): the caller commits and waits; else plain loads and stores.
template <typename T, typename Src>
__device__ __forceinline__ void load_rows(T* dst, int ldd, int nrows, int cols, int cpad, bool vec,
                                          Src src, const void* any_global) {
  if (vec) {
    constexpr int V = 16 / sizeof(T);
    const int vc = cpad / V, n = nrows * vc;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int r = i / vc, c = (i % vc) * V;
      const T* s = src(r);
      const bool on = s != nullptr && c < cols;
      const unsigned sa = smem_u32(dst + r * ldd + c);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa),
                   "l"(on ? static_cast<const void*>(s + c) : any_global), "r"(on ? 16 : 0)
                   : "memory");
    }
  } else {
    const int n = nrows * cpad;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int r = i / cpad, c = i % cpad;
      const T* s = src(r);
      dst[r * ldd + c] = (s != nullptr && c < cols) ? s[c] : from_float<T>(0.f);
    }
  }
}

// The kv row of key slot j of a query (nullptr: skipped), and the index itself (-1 when skipped).
__device__ __forceinline__ int key_of(const Dev& p, const int32_t* irow, int64_t j) {
  if (j >= p.K) return -1;
  const int id = irow[j];
  return (id >= 0 && id < p.T) ? id : -1;
}

// Shared-memory bytes of the kernels.
size_t fwd_smem(const Dev& d, int es) {
  return static_cast<size_t>(kRows * d.ldq + 2 * kBk * d.ldq + kRows * kLdP) * es +
         (4 * 16 * 32 + 2 * kRows) * sizeof(float) + 2 * kBk * sizeof(int);
}
size_t bwd_smem(const Dev& d, int es) {
  return static_cast<size_t>(kRows * d.ldq + kRows * d.ldo + kBk * d.ldq + 2 * kRows * kLdP) * es +
         (8 * 8 * 32 + 2 * kRows) * sizeof(float) + 2 * kBk * sizeof(int);
}

// ---------------------------------------------------------------------------------------------
// Forward, tensor cores. Warps w = 0..7: S rows 16 (w & 3) .. +16 over half w >> 2 of Dqk (the
// halves are added through shared memory; the first half's warps run the online softmax of their
// rows); P V: every warp owns output columns 64 w .. +64 of all 64 rows.

template <typename T>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_mma_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ldq = p.ldq, dpad = p.dpad;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kRows * ldq;  // two buffers of kBk rows
  T* sP = sK + 2 * kBk * ldq;
  float* sX = reinterpret_cast<float*>(sP + kRows * kLdP);  // [4][16][32]: second-half S partials
  float* sAlpha = sX + 4 * 16 * 32;
  float* sFac = sAlpha + kRows;
  int* sIdx = reinterpret_cast<int*>(sFac + kRows);  // [2][kBk]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const int rg = warp & 3, dh = warp >> 2;
  const int64_t qi = blockIdx.x, b = qi / p.S, s = qi % p.S;
  const int h0 = blockIdx.y * kRows;
  const T* qbase = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1;
  const T* kvb = static_cast<const T*>(p.kv) + b * p.kvs0;
  const int32_t* irow = p.idx + b * p.is0 + s * p.is1;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);

  load_rows<T>(
      sQ, ldq, kRows, static_cast<int>(p.dqk), dpad, p.q_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? qbase + (h0 + r) * p.qs2 : nullptr; }, qbase);
  auto issue = [&](int tile) {
    const int buf = tile & 1;
    if (tid < kBk) sIdx[buf * kBk + tid] = key_of(p, irow, static_cast<int64_t>(tile) * kBk + tid);
    load_rows<T>(
        sK + buf * kBk * ldq, ldq, kBk, static_cast<int>(p.dqk), dpad, p.kv_vec,
        [&](int r) -> const T* {
          const int id = key_of(p, irow, static_cast<int64_t>(tile) * kBk + r);
          return id >= 0 ? kvb + id * p.kvs1 : nullptr;
        },
        kvb);
  };
  if (ntiles > 0) issue(0);
  cp_async_commit();

  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
  float acc_o[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] = 0.f;
  const bool pv_warp = warp * 64 < p.dvpad;
  const int half = dpad / 2;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) {
      issue(it + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sKt = sK + buf * kBk * ldq;

    float acc[1][4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
    warp_mma<T, 1, 4, false, false>(acc, sQ + dh * half, ldq, rg * 16, sKt + dh * half, ldq, 0,
                                    half / 16, 4);
    float* px = sX + rg * 16 * 32 + lane;
    if (dh == 1) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) px[(nt * 4 + e) * 32] = acc[0][nt][e];
    }
    __syncthreads();
    if (dh == 0) {
      float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * qd + (e & 1);
          const float v = (acc[0][nt][e] + px[(nt * 4 + e) * 32]) * p.scale_log2;
          acc[0][nt][e] = sIdx[buf * kBk + col] >= 0 ? v : neg_inf();
          mx[e >> 1] = fmaxf(mx[e >> 1], acc[0][nt][e]);
        }
      float mnew[2], alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        mnew[i] = fmaxf(m_run[i], mx[i]);
        alpha[i] = mnew[i] == neg_inf() ? 1.f : exp2f(m_run[i] - mnew[i]);
      }
      T* prow = sP + (rg * 16 + g) * kLdP + 2 * qd;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float pe[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          pe[e] = mnew[i] == neg_inf() ? 0.f : exp2f(acc[0][nt][e] - mnew[i]);
          sum[i] += pe[e];
        }
        st_pair(prow + nt * 8, pe[0], pe[1]);
        st_pair(prow + 8 * kLdP + nt * 8, pe[2], pe[3]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
        sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
        l_run[i] = l_run[i] * alpha[i] + sum[i];
        m_run[i] = mnew[i];
      }
      if (qd == 0) {
        sAlpha[rg * 16 + g] = alpha[0];
        sAlpha[rg * 16 + g + 8] = alpha[1];
      }
    }
    __syncthreads();
    if (pv_warp) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          acc_o[mt][nt][0] *= a0;
          acc_o[mt][nt][1] *= a0;
          acc_o[mt][nt][2] *= a1;
          acc_o[mt][nt][3] *= a1;
        }
      }
      warp_mma<T, 4, 8, false, true>(acc_o, sP, kLdP, 0, sKt, ldq, warp * 64, kBk / 16, 8);
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // no tile at all (K = 0): the query rows' copies are still in flight

  // Normalisation (with the sink in the denominator) and lse, per row, by the softmax warps.
  if (dh == 0 && qd == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rg * 16 + g + 8 * i, h = h0 + r;
      const float m = m_run[i], l = l_run[i];
      float fac = 0.f, lse2 = neg_inf();
      if (p.sinks != nullptr && h < p.H) {
        const float sk = p.sinks[h] * kLog2e, mt = fmaxf(m, sk);
        if (mt != neg_inf()) {
          const float em = m == neg_inf() ? 0.f : exp2f(m - mt);
          const float lt = l * em + exp2f(sk - mt);
          fac = em / lt;
          lse2 = mt + log2f(lt);
        }
      } else if (l > 0.f) {
        fac = 1.f / l;
        lse2 = m + log2f(l);
      }
      sFac[r] = fac;
      if (h < p.H) lse[qi * p.H + h] = lse2 * kLn2;
    }
  }
  __syncthreads();
  if (pv_warp) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = mt * 16 + g + 8 * i, h = h0 + r;
        if (h >= p.H) continue;
        const float f = sFac[r];
        T* orow = out + (qi * p.H + h) * p.dv;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int c = warp * 64 + nt * 8 + 2 * qd;
          if (c < p.dv) orow[c] = from_float<T>(acc_o[mt][nt][2 * i] * f);
          if (c + 1 < p.dv) orow[c + 1] = from_float<T>(acc_o[mt][nt][2 * i + 1] * f);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, tensor cores, 16 warps per CTA. Per tile: warps 0-7 compute S and warps 8-15 dP for
// the same 16 x 16 regions (rows 16 (w & 3), keys 16 ((w & 7) >> 2)); the S warps form P and dS.
// dq += dS K: warp (w >> 3, w & 7) owns rows 32 (w >> 3) .. +32 and Dqk columns (w & 7) dpad / 8.
// The dkv tile dS^T Q + P^T dO: warp (w >> 3, w & 7) owns keys 16 (w >> 3) and the same columns,
// three 8-column tiles at a time; it goes to w[query, head block, key slot, :].

template <typename T, typename W>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_mma_kernel(const Dev p, const T* __restrict__ dout, const T* __restrict__ outp,
                   const float* __restrict__ lse, int64_t q_begin, T* __restrict__ dq,
                   W* __restrict__ wout, float* __restrict__ dsink_part) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ldq = p.ldq, ldo = p.ldo, dpad = p.dpad, dvpad = p.dvpad;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kRows * ldq;
  T* sK = sdO + kRows * ldo;
  T* sP = sK + kBk * ldq;
  T* sdS = sP + kRows * kLdP;
  float* sdP = reinterpret_cast<float*>(sdS + kRows * kLdP);  // [8 warps][8][32]
  float* sLse2 = sdP + 8 * 8 * 32;
  float* sDelta = sLse2 + kRows;
  int* sIdx = reinterpret_cast<int*>(sDelta + kRows);  // [2][kBk]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const int64_t qi = q_begin + blockIdx.x, b = qi / p.S, s = qi % p.S;
  const int hb = blockIdx.y, h0 = hb * kRows, nhb = gridDim.y;
  const T* qbase = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1;
  const T* kvb = static_cast<const T*>(p.kv) + b * p.kvs0;
  const int32_t* irow = p.idx + b * p.is0 + s * p.is1;
  const int ntiles = static_cast<int>((p.K + kBk - 1) / kBk);
  const int nq = dpad / 64, cpw = dpad / 8;

  load_rows<T>(
      sQ, ldq, kRows, static_cast<int>(p.dqk), dpad, p.q_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? qbase + (h0 + r) * p.qs2 : nullptr; }, qbase);
  load_rows<T>(
      sdO, ldo, kRows, static_cast<int>(p.dv), dvpad, p.do_vec,
      [&](int r) -> const T* { return h0 + r < p.H ? dout + (qi * p.H + h0 + r) * p.dv : nullptr; },
      dout);
  auto issue = [&](int tile) {
    const int buf = tile & 1;
    if (tid < kBk) sIdx[buf * kBk + tid] = key_of(p, irow, static_cast<int64_t>(tile) * kBk + tid);
    load_rows<T>(
        sK, ldq, kBk, static_cast<int>(p.dqk), dpad, p.kv_vec,
        [&](int r) -> const T* {
          const int id = key_of(p, irow, static_cast<int64_t>(tile) * kBk + r);
          return id >= 0 ? kvb + id * p.kvs1 : nullptr;
        },
        kvb);
  };
  if (ntiles > 0) issue(0);
  cp_async_commit();

  // delta = rowsum(dO * O) and lse (in log2 units; +inf for rows without keys, so that P = 0).
#pragma unroll
  for (int rr = 0; rr < kRows / 16; ++rr) {
    const int r = warp * (kRows / 16) + rr, h = h0 + r;
    float d = 0.f;
    if (h < p.H) {
      const T* o = outp + (qi * p.H + h) * p.dv;
      const T* go = dout + (qi * p.H + h) * p.dv;
      for (int c = lane; c < p.dv; c += 32) d += to_float(o[c]) * to_float(go[c]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) {
      const float l = h < p.H ? lse[qi * p.H + h] : neg_inf();
      sDelta[r] = d;
      sLse2[r] = l == neg_inf() ? pos_inf() : l * kLog2e;
      if (dsink_part != nullptr && h < p.H)
        dsink_part[qi * p.H + h] = l == neg_inf() ? 0.f : -expf(p.sinks[h] - l) * d;
    }
  }

  float acc_dq[2][9][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 9; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[mt][nt][e] = 0.f;
  const int w8 = warp & 7, rg = w8 & 3, kh = w8 >> 2;
  const int rh = warp >> 3, cg = warp & 7;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    {
      float acc[1][2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
      if (warp < 8) {
        warp_mma<T, 1, 2, false, false>(acc, sQ, ldq, rg * 16, sK, ldq, kh * 16, dpad / 16, 2);
      } else {
        warp_mma<T, 1, 2, false, false>(acc, sdO, ldo, rg * 16, sK, ldq, kh * 16, dvpad / 16, 2);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sdP[(w8 * 8 + nt * 4 + e) * 32 + lane] = acc[0][nt][e];
      }
      __syncthreads();
      if (warp < 8) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float pe[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = rg * 16 + g + 8 * (e >> 1);
            const int c = kh * 16 + nt * 8 + 2 * qd + (e & 1);
            pe[e] = sIdx[buf * kBk + c] >= 0 ? exp2f(acc[0][nt][e] * p.scale_log2 - sLse2[r]) : 0.f;
            ds[e] = pe[e] * (sdP[(w8 * 8 + nt * 4 + e) * 32 + lane] - sDelta[r]) * p.scale;
          }
          const int off = (rg * 16 + g) * kLdP + kh * 16 + nt * 8 + 2 * qd;
          st_pair(sP + off, pe[0], pe[1]);
          st_pair(sP + off + 8 * kLdP, pe[2], pe[3]);
          st_pair(sdS + off, ds[0], ds[1]);
          st_pair(sdS + off + 8 * kLdP, ds[2], ds[3]);
        }
      }
    }
    __syncthreads();
    warp_mma<T, 2, 9, false, true>(acc_dq, sdS, kLdP, rh * 32, sK, ldq, cg * cpw, kBk / 16, nq);
    __syncthreads();  // sK is free: the next tile's rows load during the dkv products
    if (it + 1 < ntiles) issue(it + 1);
    cp_async_commit();

    const int mh = rh;
    for (int pass = 0; pass * 3 < nq; ++pass) {
      float acc[1][3][4];
#pragma unroll
      for (int nt = 0; nt < 3; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.f;
      const int n0 = cg * cpw + pass * 24;
      const int live = min(3, nq - pass * 3);
      warp_mma<T, 1, 3, true, true>(acc, sdS, kLdP, mh * 16, sQ, ldq, n0, kRows / 16, live);
      const int live_o = max(0, min(live, (dvpad - n0) / 8));
      if (live_o > 0)
        warp_mma<T, 1, 3, true, true>(acc, sP, kLdP, mh * 16, sdO, ldo, n0, kRows / 16, live_o);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int jl = mh * 16 + g + 8 * i;
        const int64_t j = static_cast<int64_t>(it) * kBk + jl;
        if (j >= p.K || sIdx[buf * kBk + jl] < 0) continue;
        W* wrow = wout + (((qi - q_begin) * nhb + hb) * p.K + j) * p.dqk;
#pragma unroll
        for (int nt = 0; nt < 3; ++nt) {
          if (nt >= live) continue;
          const int c = n0 + nt * 8 + 2 * qd;
          if (c < p.dqk) wrow[c] = from_float<W>(acc[0][nt][2 * i]);
          if (c + 1 < p.dqk) wrow[c + 1] = from_float<W>(acc[0][nt][2 * i + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rh * 32 + mt * 16 + g + 8 * i, h = h0 + r;
      if (h >= p.H) continue;
      T* row = dq + (qi * p.H + h) * p.dqk;
#pragma unroll
      for (int nt = 0; nt < 9; ++nt) {
        if (nt >= nq) continue;
        const int c = cg * cpw + nt * 8 + 2 * qd;
        if (c < p.dqk) row[c] = from_float<T>(acc_dq[mt][nt][2 * i]);
        if (c + 1 < p.dqk) row[c + 1] = from_float<T>(acc_dq[mt][nt][2 * i + 1]);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA-core kernels (fp32): 4 warps, each walking the keys w, w + 4, ... with its own online
// softmax state; warps are combined in order (deterministic).

constexpr int kSimtD = kMaxDqk / 32;  // Dqk elements per lane
constexpr int kSimtDv = kMaxDv / 32;  // dv elements per lane
constexpr int kSimtWarps = kSimtThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid (B * S, H).
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    fwd_simt_kernel(const Dev p, T* __restrict__ out, float* __restrict__ lse) {
  __shared__ float sq[kMaxDqk];
  __shared__ float so[kSimtWarps][kMaxDv];
  __shared__ float sm[kSimtWarps], sl[kSimtWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t qi = blockIdx.x, b = qi / p.S, s = qi % p.S;
  const int h = blockIdx.y;
  const T* qrow = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1 + h * p.qs2;
  const T* kvb = static_cast<const T*>(p.kv) + b * p.kvs0;
  const int32_t* irow = p.idx + b * p.is0 + s * p.is1;
  for (int d = tid; d < p.dqk; d += kSimtThreads) sq[d] = to_float(qrow[d]);
  __syncthreads();
  float m = neg_inf(), l = 0.f, o[kSimtDv];
#pragma unroll
  for (int k = 0; k < kSimtDv; ++k) o[k] = 0.f;
  for (int64_t j = warp; j < p.K; j += kSimtWarps) {
    const int id = key_of(p, irow, j);
    if (id < 0) continue;
    const T* krow = kvb + id * p.kvs1;
    float dot = 0.f;
    for (int d = lane; d < p.dqk; d += 32) dot += sq[d] * to_float(krow[d]);
    const float sc = warp_sum(dot) * p.scale;
    const float mn = fmaxf(m, sc);
    const float a = m == neg_inf() ? 0.f : expf(m - mn);
    const float pj = expf(sc - mn);
    l = l * a + pj;
#pragma unroll
    for (int k = 0; k < kSimtDv; ++k) {
      const int d = lane + 32 * k;
      if (d < p.dv) o[k] = o[k] * a + pj * to_float(krow[d]);
    }
    m = mn;
  }
#pragma unroll
  for (int k = 0; k < kSimtDv; ++k)
    if (lane + 32 * k < p.dv) so[warp][lane + 32 * k] = o[k];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  __syncthreads();
  float mt = neg_inf();
  for (int w = 0; w < kSimtWarps; ++w) mt = fmaxf(mt, sm[w]);
  const float sk = p.sinks != nullptr ? p.sinks[h] : neg_inf();
  mt = fmaxf(mt, sk);
  float lt = 0.f;
  if (mt != neg_inf()) {
    for (int w = 0; w < kSimtWarps; ++w)
      if (sm[w] != neg_inf()) lt += sl[w] * expf(sm[w] - mt);
    if (p.sinks != nullptr) lt += expf(sk - mt);
  }
  const bool any = mt != neg_inf() && lt > 0.f;
  T* orow = out + (qi * p.H + h) * p.dv;
  for (int d = tid; d < p.dv; d += kSimtThreads) {
    float v = 0.f;
    if (any) {
      for (int w = 0; w < kSimtWarps; ++w)
        if (sm[w] != neg_inf()) v += so[w][d] * expf(sm[w] - mt);
      v /= lt;
    }
    orow[d] = from_float<T>(v);
  }
  if (tid == 0) lse[qi * p.H + h] = any ? mt + logf(lt) : neg_inf();
}

// dq and the sink partials. Grid (queries of the chunk, H).
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    bwd_simt_dq_kernel(const Dev p, const T* __restrict__ dout, const T* __restrict__ outp,
                       const float* __restrict__ lse, int64_t q_begin, T* __restrict__ dq,
                       float* __restrict__ dsink_part) {
  __shared__ float sq[kMaxDqk], sdo[kMaxDv], red[kSimtThreads];
  __shared__ float sdq[kSimtWarps][kMaxDqk];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t qi = q_begin + blockIdx.x, b = qi / p.S, s = qi % p.S;
  const int h = blockIdx.y;
  const T* qrow = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1 + h * p.qs2;
  const T* kvb = static_cast<const T*>(p.kv) + b * p.kvs0;
  const int32_t* irow = p.idx + b * p.is0 + s * p.is1;
  const T* gorow = dout + (qi * p.H + h) * p.dv;
  const T* orow = outp + (qi * p.H + h) * p.dv;
  for (int d = tid; d < p.dqk; d += kSimtThreads) sq[d] = to_float(qrow[d]);
  float part = 0.f;
  for (int d = tid; d < p.dv; d += kSimtThreads) {
    sdo[d] = to_float(gorow[d]);
    part += sdo[d] * to_float(orow[d]);
  }
  red[tid] = part;
  __syncthreads();
  for (int st = kSimtThreads / 2; st > 0; st >>= 1) {
    if (tid < st) red[tid] += red[tid + st];
    __syncthreads();
  }
  const float delta = red[0];
  const float l = lse[qi * p.H + h];
  float acc[kSimtD];
#pragma unroll
  for (int k = 0; k < kSimtD; ++k) acc[k] = 0.f;
  if (l != neg_inf()) {
    for (int64_t j = warp; j < p.K; j += kSimtWarps) {
      const int id = key_of(p, irow, j);
      if (id < 0) continue;
      const T* krow = kvb + id * p.kvs1;
      float dot = 0.f, dp = 0.f;
      for (int d = lane; d < p.dqk; d += 32) {
        const float kd = to_float(krow[d]);
        dot += sq[d] * kd;
        if (d < p.dv) dp += sdo[d] * kd;
      }
      dot = warp_sum(dot);
      dp = warp_sum(dp);
      const float pj = expf(dot * p.scale - l);
      const float ds = pj * (dp - delta) * p.scale;
#pragma unroll
      for (int k = 0; k < kSimtD; ++k) {
        const int d = lane + 32 * k;
        if (d < p.dqk) acc[k] += ds * to_float(krow[d]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kSimtD; ++k)
    if (lane + 32 * k < p.dqk) sdq[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  T* row = dq + (qi * p.H + h) * p.dqk;
  for (int d = tid; d < p.dqk; d += kSimtThreads) {
    float v = 0.f;
    for (int w = 0; w < kSimtWarps; ++w) v += sdq[w][d];
    row[d] = from_float<T>(v);
  }
  if (tid == 0 && dsink_part != nullptr)
    dsink_part[qi * p.H + h] = l == neg_inf() ? 0.f : -expf(p.sinks[h] - l) * delta;
}

// The dkv contribution rows of one query (summed over all heads). Grid (queries of the chunk);
// dynamic shared memory: 2 H floats.
template <typename T, typename W>
__global__ void __launch_bounds__(kSimtThreads)
    bwd_simt_w_kernel(const Dev p, const T* __restrict__ dout, const T* __restrict__ outp,
                      const float* __restrict__ lse, int64_t q_begin, W* __restrict__ wout) {
  extern __shared__ float sh[];
  float* sDelta = sh;
  float* sLse = sh + p.H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t qi = q_begin + blockIdx.x, b = qi / p.S, s = qi % p.S;
  const T* qbase = static_cast<const T*>(p.q) + b * p.qs0 + s * p.qs1;
  const T* kvb = static_cast<const T*>(p.kv) + b * p.kvs0;
  const int32_t* irow = p.idx + b * p.is0 + s * p.is1;
  for (int64_t h = warp; h < p.H; h += kSimtWarps) {
    const T* gorow = dout + (qi * p.H + h) * p.dv;
    const T* orow = outp + (qi * p.H + h) * p.dv;
    float d = 0.f;
    for (int c = lane; c < p.dv; c += 32) d += to_float(gorow[c]) * to_float(orow[c]);
    d = warp_sum(d);
    if (lane == 0) {
      sDelta[h] = d;
      sLse[h] = lse[qi * p.H + h];
    }
  }
  __syncthreads();
  for (int64_t j = warp; j < p.K; j += kSimtWarps) {
    const int id = key_of(p, irow, j);
    if (id < 0) continue;
    const T* krow = kvb + id * p.kvs1;
    float acc[kSimtD];
#pragma unroll
    for (int k = 0; k < kSimtD; ++k) acc[k] = 0.f;
    for (int64_t h = 0; h < p.H; ++h) {
      const float l = sLse[h];
      if (l == neg_inf()) continue;
      const T* qh = qbase + h * p.qs2;
      const T* gorow = dout + (qi * p.H + h) * p.dv;
      float dot = 0.f, dp = 0.f;
      for (int d = lane; d < p.dqk; d += 32) {
        const float kd = to_float(krow[d]);
        dot += to_float(qh[d]) * kd;
        if (d < p.dv) dp += to_float(gorow[d]) * kd;
      }
      dot = warp_sum(dot);
      dp = warp_sum(dp);
      const float pj = expf(dot * p.scale - l);
      const float ds = pj * (dp - sDelta[h]) * p.scale;
#pragma unroll
      for (int k = 0; k < kSimtD; ++k) {
        const int d = lane + 32 * k;
        if (d < p.dqk) acc[k] += ds * to_float(qh[d]) + (d < p.dv ? pj * to_float(gorow[d]) : 0.f);
      }
    }
    W* wrow = wout + ((qi - q_begin) * p.K + j) * p.dqk;
#pragma unroll
    for (int k = 0; k < kSimtD; ++k) {
      const int d = lane + 32 * k;
      if (d < p.dqk) wrow[d] = from_float<W>(acc[k]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dkv_acc[r, :] += the w rows of key r's pairs, in the inverse index's order. One CTA per key.

constexpr int kReduceThreads = 128;

// The contribution of pair id `pr` (relative to the chunk) to column d: its head blocks' rows.
template <typename W>
__device__ __forceinline__ float pair_value(const W* w, int64_t pr, int64_t nhb, int64_t K,
                                            int64_t dqk, int64_t d) {
  if (nhb == 1) return to_float(w[pr * dqk + d]);
  const int64_t ql = pr / K, j = pr - ql * K;
  float v = 0.f;
  for (int64_t hb = 0; hb < nhb; ++hb) v += to_float(w[((ql * nhb + hb) * K + j) * dqk + d]);
  return v;
}

template <typename W>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_kernel(const W* __restrict__ w, int64_t nhb, int64_t K, int64_t dqk,
                  const int64_t* __restrict__ rowptr, const int64_t* __restrict__ pairs,
                  int64_t pair_base, float* __restrict__ acc) {
  const int64_t r = blockIdx.x;
  const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
  if (e0 == e1) return;
  float* arow = acc + r * dqk;
  for (int64_t d = threadIdx.x; d < dqk; d += kReduceThreads) {
    float v = arow[d];
    int64_t e = e0;
    for (; e + 4 <= e1; e += 4) {  // four loads in flight, added in order
      float x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = pair_value(w, pairs[e + u] - pair_base, nhb, K, dqk, d);
#pragma unroll
      for (int u = 0; u < 4; ++u) v += x[u];
    }
    for (; e < e1; ++e) v += pair_value(w, pairs[e] - pair_base, nhb, K, dqk, d);
    arow[d] = v;
  }
}

// dsinks[h] = sum_r part[r, h] in a fixed order. One CTA per head.
constexpr int kSinkThreads = 256;

__global__ void __launch_bounds__(kSinkThreads)
    dsink_kernel(const float* __restrict__ part, int64_t rows, int64_t heads,
                 float* __restrict__ dsinks) {
  __shared__ float red[kSinkThreads];
  const int h = blockIdx.x, tid = threadIdx.x;
  float v = 0.f;
  for (int64_t r = tid; r < rows; r += kSinkThreads) v += part[r * heads + h];
  red[tid] = v;
  __syncthreads();
  for (int st = kSinkThreads / 2; st > 0; st >>= 1) {
    if (tid < st) red[tid] += red[tid + st];
    __syncthreads();
  }
  if (tid == 0) dsinks[h] = red[0];
}

// ---------------------------------------------------------------------------------------------
// Mask rows -> index lists. One warp per row, 32 consecutive entries per step (coalesced); a
// ballot of the valid ones places them in order.

constexpr int kMaskThreads = 256;

template <int Kind>
__device__ __forceinline__ int classify(const void* base, int64_t i) {
  // 1: valid, 0: masked, 2: neither (an additive bias or NaN)
  if constexpr (Kind == OPSLOT_SPARSE_MASK_BOOL) {
    return static_cast<const uint8_t*>(base)[i] != 0 ? 1 : 0;
  } else {
    float x;
    if constexpr (Kind == OPSLOT_SPARSE_MASK_FLOAT32)
      x = static_cast<const float*>(base)[i];
    else if constexpr (Kind == OPSLOT_SPARSE_MASK_FLOAT16)
      x = __half2float(static_cast<const __half*>(base)[i]);
    else
      x = __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    if (x == 0.f) return 1;
    if (x <= kMaskedBelow) return 0;
    return 2;
  }
}

template <int Kind>
__global__ void __launch_bounds__(kMaskThreads)
    mask_kernel(const void* __restrict__ mask, int64_t batch, int64_t rows, int64_t cols,
                int64_t ms0, int64_t ms1, int64_t ms2, int64_t topk, int32_t* __restrict__ indices,
                int32_t* __restrict__ status) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kMaskThreads / 32) + (threadIdx.x >> 5);
  if (row >= batch * rows) return;  // whole warps leave together
  const int64_t b = row / rows, r = row % rows;
  const int64_t base = b * ms0 + r * ms1;
  int32_t* out = indices + row * topk;
  const unsigned below = (1u << lane) - 1u;
  int64_t count = 0;
  int flags = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    const int64_t c = c0 + lane;
    const int k = c < cols ? classify<Kind>(mask, base + c * ms2) : 0;
    if (k == 2) flags |= OPSLOT_SPARSE_MASK_BIAS;
    const unsigned valid = __ballot_sync(0xffffffffu, k == 1);
    if (k == 1) {
      const int64_t pos = count + __popc(valid & below);
      if (pos < topk)
        out[pos] = static_cast<int32_t>(c);
      else
        flags |= OPSLOT_SPARSE_MASK_OVERFLOW;
    }
    count += __popc(valid);
  }
  for (int64_t k = count + lane; k < topk; k += 32) out[k] = -1;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) flags |= __shfl_xor_sync(0xffffffffu, flags, o);
  if (lane == 0 && flags != 0) atomicOr(status, flags);
}

// ---------------------------------------------------------------------------------------------
// Host side.

int round_up(int64_t x, int m) { return static_cast<int>((x + m - 1) / m * m); }

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// A stride of a dimension of size > 1 whose bytes are not a multiple of 16 rules out cp.async.
bool stride_ok(int64_t stride, int64_t size, int es) {
  return size <= 1 || (stride * es) % 16 == 0;
}

int check(const opslot_sparse_mqa_problem* p, const char* what) {
  if (p == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: no problem given", what);
  if (p->dtype != OPSLOT_FLOAT32 && p->dtype != OPSLOT_FLOAT16 && p->dtype != OPSLOT_BFLOAT16)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, p->dtype);
  if (p->batch < 0 || p->seqlen < 0 || p->kvlen < 0 || p->topk < 0 || p->heads < 1 ||
      p->heads > 65535 || p->batch * p->seqlen >= (1LL << 31) || p->topk >= (1LL << 31) ||
      p->kvlen >= (1LL << 31)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape batch %lld, seqlen %lld, kvlen %lld, heads %lld, topk %lld",
                     what, static_cast<long long>(p->batch), static_cast<long long>(p->seqlen),
                     static_cast<long long>(p->kvlen), static_cast<long long>(p->heads),
                     static_cast<long long>(p->topk));
  }
  if (p->dqk < 1 || p->dqk > kMaxDqk || p->dv < 1 || p->dv > p->dqk || p->dv > kMaxDv) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: head dims Dqk %lld, dv %lld: this kernel takes Dqk <= %d, 1 <= dv <= "
                     "min(Dqk, %d)",
                     what, static_cast<long long>(p->dqk), static_cast<long long>(p->dv), kMaxDqk,
                     kMaxDv);
  }
  if (p->batch * p->seqlen > 0 && (p->q == nullptr || p->indices == nullptr ||
                                   (p->kv == nullptr && p->kvlen > 0 && p->topk > 0))) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null input pointer", what);
  }
  return OPSLOT_OK;
}

Dev make_dev(const opslot_sparse_mqa_problem& p) {
  Dev d{};
  const int es = p.dtype == OPSLOT_FLOAT32 ? 4 : 2;
  d.B = p.batch;
  d.S = p.seqlen;
  d.T = p.kvlen;
  d.H = p.heads;
  d.dqk = p.dqk;
  d.dv = p.dv;
  d.K = p.topk;
  d.scale = p.scale;
  d.scale_log2 = p.scale * kLog2e;
  d.q = p.q;
  d.kv = p.kv;
  d.idx = p.indices;
  d.sinks = p.sinks;
  d.qs0 = p.q_stride[0];
  d.qs1 = p.q_stride[1];
  d.qs2 = p.q_stride[2];
  d.kvs0 = p.kv_stride[0];
  d.kvs1 = p.kv_stride[1];
  d.is0 = p.idx_stride[0];
  d.is1 = p.idx_stride[1];
  d.dpad = round_up(p.dqk, 64);
  d.dvpad = round_up(p.dv, 64);
  d.ldq = d.dpad + 8;
  d.ldo = d.dvpad + 8;
  d.q_vec = (p.dqk * es) % 16 == 0 && aligned16(p.q) && stride_ok(p.q_stride[0], p.batch, es) &&
            stride_ok(p.q_stride[1], p.seqlen, es) && stride_ok(p.q_stride[2], p.heads, es);
  d.kv_vec = (p.dqk * es) % 16 == 0 && aligned16(p.kv) && stride_ok(p.kv_stride[0], p.batch, es) &&
             stride_ok(p.kv_stride[1], p.kvlen, es);
  d.do_vec = false;
  return d;
}

int head_blocks(const opslot_sparse_mqa_problem& p) {
  return p.dtype == OPSLOT_FLOAT32 ? 1 : static_cast<int>((p.heads + kRows - 1) / kRows);
}
int w_dtype(const opslot_sparse_mqa_problem& p) {
  return p.dtype == OPSLOT_BFLOAT16 ? OPSLOT_BFLOAT16 : OPSLOT_FLOAT32;
}

template <typename K>
int set_smem(K kernel, size_t bytes, const char* what) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                     bytes, cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

template <typename Kern, typename... A>
int launch(const char* what, Kern kernel, dim3 grid, int block, size_t smem, void* stream,
           A... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return OPSLOT_OK;
  if (smem > 48 * 1024) {
    if (int rc = set_smem(kernel, smem, what)) return rc;
  }
  kernel<<<grid, block, smem, static_cast<cudaStream_t>(stream)>>>(args...);
  return check_launch(what);
}

}  // namespace
}  // namespace opslot::sparse

using namespace opslot;
using namespace opslot::sparse;

extern "C" {

OPSLOT_API int opslot_sparse_mqa_fwd(const opslot_sparse_mqa_problem* p, void* out, float* lse,
                                     void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_fwd";
  if (int rc = check(p, what)) return rc;
  if (p->batch * p->seqlen == 0) return OPSLOT_OK;
  if (out == nullptr || lse == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null output pointer", what);
  const Dev d = make_dev(*p);
  const unsigned nq = static_cast<unsigned>(p->batch * p->seqlen);
  return dispatch_dtype(p->dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      return launch(what, fwd_simt_kernel<T>, dim3(nq, static_cast<unsigned>(p->heads)),
                    kSimtThreads, 0, stream, d, static_cast<T*>(out), lse);
    } else {
      const unsigned hb = static_cast<unsigned>((p->heads + kRows - 1) / kRows);
      return launch(what, fwd_mma_kernel<T>, dim3(nq, hb), kFwdThreads, fwd_smem(d, sizeof(T)),
                    stream, d, static_cast<T*>(out), lse);
    }
  });
}

OPSLOT_API int opslot_sparse_mqa_bwd_head_blocks(const opslot_sparse_mqa_problem* p) {
  if (check(p, "opslot_sparse_mqa_bwd_head_blocks")) return -1;
  return head_blocks(*p);
}

OPSLOT_API int opslot_sparse_mqa_bwd_w_dtype(const opslot_sparse_mqa_problem* p) {
  if (check(p, "opslot_sparse_mqa_bwd_w_dtype")) return -1;
  return w_dtype(*p);
}

OPSLOT_API int opslot_sparse_mqa_bwd_queries(const opslot_sparse_mqa_problem* p, const void* dout,
                                             const void* out, const float* lse, int64_t q_begin,
                                             int64_t q_end, void* dq, void* w, float* dsink_part,
                                             void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_bwd_queries";
  if (int rc = check(p, what)) return rc;
  if (q_begin < 0 || q_end < q_begin || q_end > p->batch * p->seqlen)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: query range [%lld, %lld) outside [0, %lld)",
                     what, static_cast<long long>(q_begin), static_cast<long long>(q_end),
                     static_cast<long long>(p->batch * p->seqlen));
  if (q_end == q_begin) return OPSLOT_OK;
  if (dout == nullptr || out == nullptr || lse == nullptr || dq == nullptr ||
      (w == nullptr && p->topk > 0) || (dsink_part == nullptr) != (p->sinks == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  Dev d = make_dev(*p);
  const int es = p->dtype == OPSLOT_FLOAT32 ? 4 : 2;
  d.do_vec = (p->dv * es) % 16 == 0 && aligned16(dout);
  const unsigned nq = static_cast<unsigned>(q_end - q_begin);
  return dispatch_dtype(p->dtype, what, [&](auto tag) -> int {
    using T = decltype(tag);
    const T* go = static_cast<const T*>(dout);
    const T* o = static_cast<const T*>(out);
    if constexpr (std::is_same_v<T, float>) {
      if (int rc = launch(what, bwd_simt_dq_kernel<T>, dim3(nq, static_cast<unsigned>(p->heads)),
                          kSimtThreads, 0, stream, d, go, o, lse, q_begin, static_cast<T*>(dq),
                          dsink_part))
        return rc;
      if (p->topk == 0) return OPSLOT_OK;
      return launch(what, bwd_simt_w_kernel<T, float>, dim3(nq), kSimtThreads,
                    static_cast<size_t>(2 * p->heads) * sizeof(float), stream, d, go, o, lse,
                    q_begin, static_cast<float*>(w));
    } else {
      using W = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat16, float>;
      return launch(what, bwd_mma_kernel<T, W>, dim3(nq, static_cast<unsigned>(head_blocks(*p))),
                    kBwdThreads, bwd_smem(d, sizeof(T)), stream, d, go, o, lse, q_begin,
                    static_cast<T*>(dq), static_cast<W*>(w), dsink_part);
    }
  });
}

OPSLOT_API int opslot_sparse_mqa_bwd_reduce(const void* w, int w_dtype, int64_t head_blocks,
                                            int64_t topk, int64_t dqk, int64_t nkeys,
                                            const int64_t* rowptr, const int64_t* pairs,
                                            int64_t pair_base, float* dkv_acc, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_bwd_reduce";
  if (nkeys < 0 || head_blocks < 1 || topk < 0 || dqk < 1 || nkeys >= (1LL << 31))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad sizes nkeys %lld, head_blocks %lld, topk %lld, dqk %lld", what,
                     static_cast<long long>(nkeys), static_cast<long long>(head_blocks),
                     static_cast<long long>(topk), static_cast<long long>(dqk));
  if (nkeys == 0 || topk == 0) return OPSLOT_OK;
  if (rowptr == nullptr || dkv_acc == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  const unsigned grid = static_cast<unsigned>(nkeys);
  if (w_dtype == OPSLOT_BFLOAT16)
    return launch(what, reduce_kernel<__nv_bfloat16>, dim3(grid), kReduceThreads, 0, stream,
                  static_cast<const __nv_bfloat16*>(w), head_blocks, topk, dqk, rowptr, pairs,
                  pair_base, dkv_acc);
  if (w_dtype == OPSLOT_FLOAT32)
    return launch(what, reduce_kernel<float>, dim3(grid), kReduceThreads, 0, stream,
                  static_cast<const float*>(w), head_blocks, topk, dqk, rowptr, pairs, pair_base,
                  dkv_acc);
  return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: w dtype code %d (bfloat16 or float32)", what,
                   w_dtype);
}

OPSLOT_API int opslot_sparse_mqa_dsink_reduce(const float* part, int64_t rows, int64_t heads,
                                              float* dsinks, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_dsink_reduce";
  if (rows < 0 || heads < 0 || heads > 65535)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: bad sizes rows %lld, heads %lld", what,
                     static_cast<long long>(rows), static_cast<long long>(heads));
  if (heads == 0) return OPSLOT_OK;
  if (dsinks == nullptr || (rows > 0 && part == nullptr))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  return launch(what, dsink_kernel, dim3(static_cast<unsigned>(heads)), kSinkThreads, 0, stream,
                part, rows, heads, dsinks);
}

OPSLOT_API int opslot_sparse_mqa_mask_indices(const void* mask, int mask_kind, int64_t batch,
                                              int64_t rows, int64_t cols,
                                              const int64_t* mask_stride, int64_t topk,
                                              int32_t* indices, int32_t* status, void* stream) {
  constexpr const char* what = "opslot_sparse_mqa_mask_indices";
  if (batch < 0 || rows < 0 || cols < 0 || topk < 0 || cols >= (1LL << 31) ||
      mask_stride == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad sizes batch %lld, rows %lld, cols %lld, topk %lld", what,
                     static_cast<long long>(batch), static_cast<long long>(rows),
                     static_cast<long long>(cols), static_cast<long long>(topk));
  const int64_t nrows = batch * rows;
  if (nrows == 0 || topk == 0) return OPSLOT_OK;
  if ((mask == nullptr && cols > 0) || indices == nullptr || status == nullptr)
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  const int64_t per = kMaskThreads / 32;
  if ((nrows + per - 1) / per >= (1LL << 31))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: too many rows", what);
  const dim3 grid(static_cast<unsigned>((nrows + per - 1) / per));
  const int64_t s0 = mask_stride[0], s1 = mask_stride[1], s2 = mask_stride[2];
  switch (mask_kind) {
    case OPSLOT_SPARSE_MASK_FLOAT32:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_FLOAT32>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_FLOAT16:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_FLOAT16>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_BFLOAT16:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_BFLOAT16>, grid, kMaskThreads, 0, stream,
                    mask, batch, rows, cols, s0, s1, s2, topk, indices, status);
    case OPSLOT_SPARSE_MASK_BOOL:
      return launch(what, mask_kernel<OPSLOT_SPARSE_MASK_BOOL>, grid, kMaskThreads, 0, stream, mask,
                    batch, rows, cols, s0, s1, s2, topk, indices, status);
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown mask kind %d", what, mask_kind);
  }
}

}  // extern "C"
