// Sparse MQA attention on CUDA cores in fp32, forward and backward (exact, slow: for tests and
// fp32 users; sparse_attention.cu launches them).
#pragma once

#include "sparse_attention_bwd.cuh"

namespace opslot::sparse {
namespace {

// ---------------------------------------------------------------------------------------------
// CUDA-core kernels (fp32): 4 warps, each walking the keys w, w + 4, ... with its own online
// softmax state; warps are combined in order (deterministic).

constexpr int kSimtD = kMaxDqk / 32;  // Dqk elements per lane
constexpr int kSimtDv = kMaxDv / 32;  // dv elements per lane
constexpr int kSimtWarps = kSimtThreads / 32;

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

}  // namespace
}  // namespace opslot::sparse
