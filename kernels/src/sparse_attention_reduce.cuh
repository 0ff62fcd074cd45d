// Sparse MQA attention's fixed-order dkv reduction, the sinks' gradient and the mask rows turned
// into index lists (sparse_attention.cu launches them).
#pragma once

#include "sparse_attention_simt.cuh"

namespace opslot::sparse {
namespace {

// ---------------------------------------------------------------------------------------------
// dkv_acc[r, :] += the w rows of key r's pairs, in the inverse index's order. One CTA per key.

constexpr int kReduceThreads = 128;

// The scratch rows of pair id `pr` (relative to the chunk; query ql, slot j): one per head block,
// rows (ql, hb, j), K * dqk apart. Its head block 0's row.
template <typename W>
__device__ __forceinline__ const W* pair_rows(const W* w, int64_t pr, int64_t nhb, int64_t K,
                                              int64_t dqk) {
  if (nhb == 1) return w + pr * dqk;
  const int64_t ql = pr / K, j = pr - ql * K;
  return w + (ql * nhb * K + j) * dqk;
}

// The contribution of pair id `pr` to column d: its head blocks' rows, in head block order.
template <typename W>
__device__ __forceinline__ float pair_value(const W* w, int64_t pr, int64_t nhb, int64_t K,
                                            int64_t dqk, int64_t d) {
  const W* row = pair_rows(w, pr, nhb, K, dqk) + d;
  float v = 0.f;
  for (int64_t hb = 0; hb < nhb; ++hb) v += to_float(row[hb * K * dqk]);
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

// The same sums with 16-byte column groups: a key's row is cut into slices of 32 groups (8 bf16 or
// 4 float columns each), and one warp takes one (key, slice): lane l the group 32 slice + l. The
// key's pair ids are read 32 at a time (one per lane) and broadcast, and kReduceUnroll pairs' rows
// are in flight per lane. A key selected by every query of a chunk (thousands of pairs) is one
// serial chain per slice; slices in separate warps run those chains side by side. Every column adds
// its pairs in the inverse index's order, the head blocks of a pair first (pair_value's order): the
// bits of reduce_kernel. Needs dqk a multiple of the group and w, acc 16-byte aligned (the launcher
// checks).
constexpr int kReduceUnroll = 8;

template <typename W>
struct Group {
  static constexpr int kCols = 16 / sizeof(W);
  uint4 raw;
  __device__ void load(const W* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ void add_to(float (&v)[kCols]) const {  // v[c] += column c (bf16 -> fp32 is exact)
    const uint32_t w4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(W) == 4) {
        v[i] += __uint_as_float(w4[i]);
      } else {
        v[2 * i] += __uint_as_float(w4[i] << 16);
        v[2 * i + 1] += __uint_as_float(w4[i] & 0xffff0000u);
      }
    }
  }
};

// Pair `pr`'s columns of group d, its head blocks added in order, into v.
template <typename W, bool kOneBlock>
__device__ __forceinline__ void add_pair_group(float (&v)[Group<W>::kCols], const W* w, int64_t pr,
                                               int64_t nhb, int64_t K, int64_t dqk, int64_t d) {
  Group<W> g;
  if constexpr (kOneBlock) {
    g.load(w + pr * dqk + d);
    g.add_to(v);
  } else {
    constexpr int kC = Group<W>::kCols;
    const W* row = pair_rows(w, pr, nhb, K, dqk) + d;
    float s[kC];  // the head blocks summed from 0, as pair_value does
#pragma unroll
    for (int c = 0; c < kC; ++c) s[c] = 0.f;
    for (int64_t hb = 0; hb < nhb; ++hb) {
      g.load(row + hb * K * dqk);
      g.add_to(s);
    }
#pragma unroll
    for (int c = 0; c < kC; ++c) v[c] += s[c];
  }
}

constexpr int64_t reduce_slices(int64_t groups) { return (groups + 31) / 32; }

template <typename W, bool kOneBlock>  // kOneBlock: nhb == 1 (at most 64 heads)
__global__ void __launch_bounds__(kReduceThreads)
    reduce_vec_kernel(const W* __restrict__ w, int64_t nhb, int64_t K, int64_t dqk, int64_t nkeys,
                      const int64_t* __restrict__ rowptr, const int64_t* __restrict__ pairs,
                      int64_t pair_base, float* __restrict__ acc) {
  constexpr int kC = Group<W>::kCols;
  const int lane = threadIdx.x & 31;
  const int groups = static_cast<int>(dqk / kC);
  const int64_t slices = reduce_slices(groups);
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * (kReduceThreads / 32) + (threadIdx.x >> 5);
  const int64_t r = wid / slices;
  if (r >= nkeys) return;  // whole warps leave together
  const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
  if (e0 == e1) return;
  float* arow = acc + r * dqk;
  const int gi = static_cast<int>(wid - r * slices) * 32 + lane;
  // Lanes past the row read its first group (a valid address, no branch) and store nothing.
  const bool on = gi < groups;
  const int64_t d = on ? static_cast<int64_t>(gi) * kC : 0;
  float v[kC];
#pragma unroll
  for (int c = 0; c < kC; c += 4) {
    const float4 a = *reinterpret_cast<const float4*>(arow + d + c);
    v[c] = a.x, v[c + 1] = a.y, v[c + 2] = a.z, v[c + 3] = a.w;
  }
  for (int64_t eb = e0; eb < e1; eb += 32) {
    const int n = static_cast<int>(e1 - eb < 32 ? e1 - eb : 32);
    const int64_t mine = lane < n ? pairs[eb + lane] - pair_base : 0;
    int u = 0;
    for (; u + kReduceUnroll <= n; u += kReduceUnroll) {  // kReduceUnroll rows in flight
      if constexpr (kOneBlock) {
        Group<W> x[kReduceUnroll];
#pragma unroll
        for (int k = 0; k < kReduceUnroll; ++k)
          x[k].load(w + __shfl_sync(0xffffffffu, mine, u + k) * dqk + d);
#pragma unroll
        for (int k = 0; k < kReduceUnroll; ++k) x[k].add_to(v);
      } else {
#pragma unroll
        for (int k = 0; k < kReduceUnroll; ++k)
          add_pair_group<W, false>(v, w, __shfl_sync(0xffffffffu, mine, u + k), nhb, K, dqk, d);
      }
    }
    for (; u < n; ++u)
      add_pair_group<W, kOneBlock>(v, w, __shfl_sync(0xffffffffu, mine, u), nhb, K, dqk, d);
  }
  if (on) {
#pragma unroll
    for (int c = 0; c < kC; c += 4)
      *reinterpret_cast<float4*>(arow + d + c) = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);
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

}  // namespace
}  // namespace opslot::sparse
