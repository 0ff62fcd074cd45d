// Rotary position embedding on strided q/k, forward and backward: one thread per VEC-element pair
// slot (x[i..i+VEC) with x[i+h..i+h+VEC)), which also copies its share of the pass-through part;
// q's and k's rows in one grid. Four layouts of the same rotation (Mode): HF's rotate_half
// (opslot_rope), DeepSeek-V3's interleaved pairs (opslot_rope_interleaved: the slot's input is the
// 2*VEC consecutive elements x[2i..2i+2VEC)), the vision towers' rotate_half with upstream's
// fp32 rounding, operation by operation (opslot_rope_vision), which in the vision towers' own
// layout (q and k [tokens, heads, dim], cos/sin one row per token) runs rope_vision_heads instead,
// and DeepSeek-V4's interleaved pairs turned in place in the trailing rotary slice, the leading
// features passed through (opslot_rope_deepseek_v4, one tensor), with upstream's rounding.
// Each row's outer dimensions are ordered by the caller (largest stride first), so consecutive
// threads walk memory in order. See kernels/include/opslot_kernels/rope.h and docs/kernels.md.
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "opslot_kernels/rope.h"

namespace opslot {
namespace {

struct RopeTensor {
  const void* in;
  void* out;
  int64_t n[3];  // with the head loop (LOOP): n[0] is the looped dimension (cos/sin stride 0)
  int64_t is[3], os[3], cs[3], ss[3];
  uint32_t n1, n2;  // n[1], n[2] as 32-bit divisors
  int64_t slots;    // threads for this tensor: rows * slots_per_row
};

struct RopeArgs {
  RopeTensor t[2];
  const void* cos;
  const void* sin;
  int half;           // rotary_dim / 2
  int slots_per_row;  // = pairs: each slot also copies every pairs-th pass-through vector
  int pairs;          // half / VEC (at least 1)
  int npass;          // (head_dim - rotary_dim) / VEC pass-through vectors
  int spread;  // 1: pair slots also copy the pass-through part; 0: one slot per pass-through vector
  int rot0;    // first rotated feature (kV4: head_dim - rotary_dim; else 0)
  int pass0;   // first pass-through feature (kV4: 0; else rotary_dim)
};

// The layout and arithmetic of a launch (one entry point each).
enum Mode : int {
  kHalf = 0,         // HF rotate_half, fp32 arithmetic (contracted), one rounding
  kInterleaved = 1,  // input pairs (x[2i], x[2i+1]) -> output halves (backward: the reverse)
  kVision = 2,       // rotate_half, every product and sum rounded to fp32 as upstream's eager
  kV4 = 3,  // pairs (x[2i], x[2i+1]) of the trailing slice turned in place, upstream's rounding
};

// The head loop (opslot_rope_set_tuning, bench library only; off by default: measured slower): a
// thread takes up to kLoopHeads indices of dimension 0 (heads: cos and sin do not depend on them)
// for one position and slot, loading cos/sin once for all of them.
constexpr int kLoopHeads = 8;

// Pass-through vectors a pair slot loads before storing them (SPREAD).
constexpr int kCopyBatch = 4;

// 2*VEC consecutive elements at p (two VEC vectors) split into the even and the odd positions.
template <int VEC, typename T>
__device__ __forceinline__ void load_pairs(const T* p, float (&even)[VEC], float (&odd)[VEC]) {
  alignas(16) T buf[2 * VEC];
  *reinterpret_cast<Vec<T, VEC>*>(buf) = *reinterpret_cast<const Vec<T, VEC>*>(p);
  *reinterpret_cast<Vec<T, VEC>*>(buf + VEC) = *reinterpret_cast<const Vec<T, VEC>*>(p + VEC);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    even[j] = to_float(buf[2 * j]);
    odd[j] = to_float(buf[2 * j + 1]);
  }
}

// The reverse: even[j], odd[j] written to p[2j], p[2j+1] (two VEC vectors), each rounded once.
template <int VEC, typename T>
__device__ __forceinline__ void store_pairs(T* p, const float (&even)[VEC],
                                            const float (&odd)[VEC]) {
  alignas(16) T buf[2 * VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    buf[2 * j] = from_float<T>(even[j]);
    buf[2 * j + 1] = from_float<T>(odd[j]);
  }
  *reinterpret_cast<Vec<T, VEC>*>(p) = *reinterpret_cast<const Vec<T, VEC>*>(buf);
  *reinterpret_cast<Vec<T, VEC>*>(p + VEC) = *reinterpret_cast<const Vec<T, VEC>*>(buf + VEC);
}

// The rotation of a VEC-element pair slot whose inputs x1 (at e) and x2 (at e + half) are loaded,
// stored to y; cos/sin stay in their own type and are converted at each use. kInterleaved reads
// cv1/sv1 only (the first half of cos/sin).
template <typename T, typename Tc, int VEC, bool BWD, int MODE>
__device__ __forceinline__ void rotate_store(const float (&x1)[VEC], const float (&x2)[VEC], T* y,
                                             int e, int half, const Vec<Tc, VEC>& cv1,
                                             const Vec<Tc, VEC>& cv2, const Vec<Tc, VEC>& sv1,
                                             const Vec<Tc, VEC>& sv2) {
  float o1[VEC], o2[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float c1 = to_float(cv1.v[j]), s1 = to_float(sv1.v[j]);
    const float c2 = MODE == kInterleaved ? c1 : to_float(cv2.v[j]);
    const float s2 = MODE == kInterleaved ? s1 : to_float(sv2.v[j]);
    if (MODE == kVision) {  // upstream's rounding: no fused multiply-add
      if (BWD) {
        o1[j] = __fadd_rn(__fmul_rn(x1[j], c1), __fmul_rn(x2[j], s2));
        o2[j] = __fsub_rn(__fmul_rn(x2[j], c2), __fmul_rn(x1[j], s1));
      } else {
        o1[j] = __fsub_rn(__fmul_rn(x1[j], c1), __fmul_rn(x2[j], s1));
        o2[j] = __fadd_rn(__fmul_rn(x2[j], c2), __fmul_rn(x1[j], s2));
      }
    } else if (BWD) {
      o1[j] = x1[j] * c1 + x2[j] * s2;
      o2[j] = x2[j] * c2 - x1[j] * s1;
    } else {
      o1[j] = x1[j] * c1 - x2[j] * s1;
      o2[j] = x2[j] * c2 + x1[j] * s2;
    }
  }
  if (MODE == kInterleaved && BWD) {
    store_pairs<VEC>(y + 2 * e, o1, o2);  // the gradient of x[2i] and of x[2i+1]
  } else {
    store_vec<VEC>(y + e, o1);
    store_vec<VEC>(y + e + half, o2);
  }
}

// One rotation of a VEC-element pair slot, x to y.
template <typename T, typename Tc, int VEC, bool BWD, int MODE>
__device__ __forceinline__ void rotate(const T* x, T* y, int e, int half, const Vec<Tc, VEC>& cv1,
                                       const Vec<Tc, VEC>& cv2, const Vec<Tc, VEC>& sv1,
                                       const Vec<Tc, VEC>& sv2) {
  float x1[VEC], x2[VEC];
  if (MODE == kInterleaved && !BWD) {
    load_pairs<VEC>(x + 2 * e, x1, x2);  // x1 = x[2i], x2 = x[2i+1]
  } else {
    load_vec<VEC>(x + e, x1);
    load_vec<VEC>(x + e + half, x2);
  }
  rotate_store<T, Tc, VEC, BWD, MODE>(x1, x2, y, e, half, cv1, cv2, sv1, sv2);
}

// x rounded to T and back (the gradient casts of upstream's `rope.float()`).
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// kV4: the pairs p[2i], p[2i+1] of a VEC-pair slot (x at x + 2e) turned by cos[e + j], sin[e + j],
// in place, to y. Forward as upstream's `(rope.float() * cos + rotate_half(rope).float() * sin)`:
// each product and the sum rounded to fp32, then to T. Backward as its autograd computes it: each
// product's gradient rounded to fp32 and then to T (the cast of `rope.float()`), the two added
// in fp32 and rounded to T.
template <typename T, typename Tc, int VEC, bool BWD>
__device__ __forceinline__ void rotate_v4(const T* x, T* y, int e, const Vec<Tc, VEC>& cv,
                                          const Vec<Tc, VEC>& sv) {
  float x1[VEC], x2[VEC], o1[VEC], o2[VEC];
  load_pairs<VEC>(x + 2 * e, x1, x2);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float c = to_float(cv.v[j]), s = to_float(sv.v[j]);
    if (BWD) {
      o1[j] = __fadd_rn(round_to<T>(__fmul_rn(x1[j], c)), round_to<T>(__fmul_rn(x2[j], s)));
      o2[j] = __fsub_rn(round_to<T>(__fmul_rn(x2[j], c)), round_to<T>(__fmul_rn(x1[j], s)));
    } else {
      o1[j] = __fsub_rn(__fmul_rn(x1[j], c), __fmul_rn(x2[j], s));
      o2[j] = __fadd_rn(__fmul_rn(x2[j], c), __fmul_rn(x1[j], s));
    }
  }
  store_pairs<VEC>(y + 2 * e, o1, o2);
}

template <typename T, typename Tc, int VEC, bool BWD, bool SPREAD, bool LOOP, int MODE>
__global__ void __launch_bounds__(256) rope_kernel(RopeArgs a) {
  int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int which = 0;
  if (gid >= a.t[0].slots) {
    gid -= a.t[0].slots;
    which = 1;
    if (gid >= a.t[1].slots) return;
  }
  const RopeTensor& t = a.t[which];
  // rows < 2^32 is checked on the host: 32-bit index arithmetic.
  const uint32_t g32 = static_cast<uint32_t>(gid);
  const uint32_t spr = static_cast<uint32_t>(a.slots_per_row);
  uint32_t row = g32 / spr;
  const int slot = static_cast<int>(g32 - row * spr);
  const uint32_t i2 = row % t.n2;
  row /= t.n2;
  const uint32_t i1 = row % t.n1;
  const uint32_t i0 = row / t.n1;  // LOOP: the chunk of kLoopHeads heads
  // Rows i0 (LOOP: h0 .. h1-1, one at a time) of dimension 0.
  const int64_t h0 = LOOP ? static_cast<int64_t>(i0) * kLoopHeads : i0;
  const int64_t h1 = LOOP ? (h0 + kLoopHeads < t.n[0] ? h0 + kLoopHeads : t.n[0]) : h0 + 1;
  const T* x = static_cast<const T*>(t.in) + (h0 * t.is[0] + i1 * t.is[1] + i2 * t.is[2]);
  T* y = static_cast<T*>(t.out) + (h0 * t.os[0] + i1 * t.os[1] + i2 * t.os[2]);
  if (!SPREAD && slot >= a.pairs) {  // one thread per pass-through vector
    const int f = a.pass0 + (slot - a.pairs) * VEC;
    for (int64_t h = h0; h < h1; ++h, x += t.is[0], y += t.os[0])
      *reinterpret_cast<Vec<T, VEC>*>(y + f) = *reinterpret_cast<const Vec<T, VEC>*>(x + f);
    return;
  }
  const int e = slot * VEC;
  const int64_t c0 = LOOP ? 0 : i0;  // LOOP: cos/sin have stride 0 over dimension 0
  const Tc* c = static_cast<const Tc*>(a.cos) + (c0 * t.cs[0] + i1 * t.cs[1] + i2 * t.cs[2]);
  const Tc* s = static_cast<const Tc*>(a.sin) + (c0 * t.ss[0] + i1 * t.ss[1] + i2 * t.ss[2]);
  using C = Vec<Tc, VEC>;
  const C c1 = *reinterpret_cast<const C*>(c + e), s1 = *reinterpret_cast<const C*>(s + e);
  // kInterleaved, kV4: the angle of pair i is cos[i] / sin[i]; no second half is read.
  constexpr bool kPairs = MODE == kInterleaved || MODE == kV4;
  const C c2 = kPairs ? c1 : *reinterpret_cast<const C*>(c + e + a.half);
  const C s2 = kPairs ? s1 : *reinterpret_cast<const C*>(s + e + a.half);
#pragma unroll 1
  for (int64_t h = h0; h < h1; ++h, x += t.is[0], y += t.os[0]) {
    if constexpr (MODE == kV4)
      rotate_v4<T, Tc, VEC, BWD>(x + a.rot0, y + a.rot0, e, c1, s1);
    else
      rotate<T, Tc, VEC, BWD, MODE>(x, y, e, a.half, c1, c2, s1, s2);
    // SPREAD: the pass-through part of a partial rotation is copied by the pair slots, so that
    // every thread of a row moves about the same bytes (one thread per pass-through vector left
    // some threads with one 16-byte load and others with six). After the rotation's stores, so
    // that its registers are free (placed before them, it doubled the kernel's registers).
    // kCopyBatch vectors are loaded before any of them is stored (x and y may alias as far as the
    // compiler knows, so it would otherwise issue one load, then its store); past the end a batch
    // reloads the last vector and stores nothing.
    if (SPREAD) {
      using V = Vec<T, VEC>;
      for (int p0 = slot; p0 < a.npass; p0 += kCopyBatch * a.pairs) {
        V v[kCopyBatch];
#pragma unroll
        for (int b = 0; b < kCopyBatch; ++b) {
          const int p = p0 + b * a.pairs;
          v[b] = *reinterpret_cast<const V*>(x + a.pass0 + (p < a.npass ? p : a.npass - 1) * VEC);
        }
#pragma unroll
        for (int b = 0; b < kCopyBatch; ++b) {
          const int p = p0 + b * a.pairs;
          if (p < a.npass) *reinterpret_cast<V*>(y + a.pass0 + p * VEC) = v[b];
        }
      }
    }
  }
}

// A 16-byte global load issued where it is written (asm volatile: the compiler neither sinks it to
// its first use nor merges it away), with the default caching.
template <typename V>
__device__ __forceinline__ V ld_issued(const V* p) {
  static_assert(sizeof(V) == 16, "16-byte vectors");
  uint4 x;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p));
  V v;
  memcpy(&v, &x, 16);
  return v;
}

// The vision towers' layout (opslot_rope_vision): q and k of one shape [tokens, heads, dim] (outer
// dimensions 0 and 1; cos/sin do not depend on dimension 1), cos/sin one row per token. A thread
// loads the cos/sin of one token and pair slot once (128 B in fp32) and rotates with them every
// `lanes`-th head of q and then of k, two heads per step; consecutive threads take a token's pair
// slots, then its lanes, so that a warp reads and writes whole rows, and q and k of a token are
// done together (cos/sin come from memory once per token).
template <typename T, typename Tc, int VEC, bool BWD>
__global__ void __launch_bounds__(256) rope_vision_heads(RopeArgs a, int lanes) {
  const uint32_t gid = blockIdx.x * blockDim.x + threadIdx.x;  // < 2^32: checked on the host
  if (gid >= a.t[0].slots) return;
  const uint32_t pairs = static_cast<uint32_t>(a.pairs), nl = static_cast<uint32_t>(lanes);
  const uint32_t r = gid / pairs, lane = r % nl, heads = a.t[0].n1;
  const int e = static_cast<int>(gid - r * pairs) * VEC;
  const int64_t token = r / nl;
  const Tc* c = static_cast<const Tc*>(a.cos) + token * a.t[0].cs[0] + e;
  const Tc* s = static_cast<const Tc*>(a.sin) + token * a.t[0].ss[0] + e;
  using C = Vec<Tc, VEC>;
  const C c1 = *reinterpret_cast<const C*>(c), c2 = *reinterpret_cast<const C*>(c + a.half);
  const C s1 = *reinterpret_cast<const C*>(s), s2 = *reinterpret_cast<const C*>(s + a.half);
  // A step's four loads are issued together (plain C++ loads were sunk to their first use, one
  // head's latency after the other's).
  using X = Vec<T, VEC>;
  auto load = [](const T* p) { return ld_issued(reinterpret_cast<const X*>(p)); };
  for (int w = 0; w < 2 && a.t[w].in; ++w) {
    const RopeTensor& t = a.t[w];
    const T* x = static_cast<const T*>(t.in) + (token * t.is[0] + lane * t.is[1]);
    T* y = static_cast<T*>(t.out) + (token * t.os[0] + lane * t.os[1]);
    const int64_t xs = lanes * t.is[1], ys = lanes * t.os[1];
#pragma unroll 1
    for (uint32_t h = lane; h < heads; h += 2 * nl, x += 2 * xs, y += 2 * ys) {
      // Past the last head the second row is the first again (loaded, not stored).
      const bool two = h + nl < heads;
      const T* xb = x + (two ? xs : 0);
      const X va1 = load(x + e), va2 = load(x + e + a.half);
      const X vb1 = load(xb + e), vb2 = load(xb + e + a.half);
      float a1[VEC], a2[VEC], b1[VEC], b2[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        a1[j] = to_float(va1.v[j]);
        a2[j] = to_float(va2.v[j]);
        b1[j] = to_float(vb1.v[j]);
        b2[j] = to_float(vb2.v[j]);
      }
      rotate_store<T, Tc, VEC, BWD, kVision>(a1, a2, y, e, a.half, c1, c2, s1, s2);
      if (two) rotate_store<T, Tc, VEC, BWD, kVision>(b1, b2, y + ys, e, a.half, c1, c2, s1, s2);
    }
  }
}

// Lanes (threads per token and pair slot) of rope_vision_heads for this launch, or 0 where its
// layout does not apply (then rope_kernel runs): q alone or q and k of the same sizes and cos/sin
// strides, outer dimension 2 of size 1, cos/sin independent of dimension 1, 16-byte vectors.
// Four lanes: 8 of the 32 rows of a token (16 heads) per thread; measured against 1 to 16 lanes,
// 1 to 8 heads per step, 4-byte to 16-byte vectors and a block per 2 to 12 tokens staged in shared
// memory with cp.async (docs/results/kernels_h200.md).
constexpr int kVisionLanes = 4;

int vision_lanes(const RopeArgs& a, bool vec_ok) {
  const RopeTensor& q = a.t[0];
  if (!vec_ok || !q.in) return 0;
  for (const RopeTensor& t : a.t) {
    if (!t.in) continue;
    if (t.n[2] != 1 || (t.n[1] > 1 && (t.cs[1] != 0 || t.ss[1] != 0))) return 0;
    if (t.n[0] != q.n[0] || t.n[1] != q.n[1] || t.cs[0] != q.cs[0] || t.ss[0] != q.ss[0]) return 0;
  }
  const int lanes = static_cast<int>(q.n[1] < kVisionLanes ? q.n[1] : kVisionLanes);
  return q.n[0] * lanes * a.pairs < (int64_t(1) << 32) ? lanes : 0;
}

// Tuning knobs (opslot_rope_set_tuning, opslot_kernels/bench.h): mutable in the bench library
// only; the production library has the defaults as constants and no head-loop kernels.
#ifdef OPSLOT_KERNELS_BENCH
int g_spread = 1;
int g_loop = 0;
#else
constexpr int g_spread = 1;
constexpr int g_loop = 0;
#endif

bool aligned(const void* p, int bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <int MODE, typename T, typename Tc>
int launch(const char* what, bool bwd, int64_t head_dim, int64_t rotary_dim, const void* cos,
           const void* sin, const void* q_in, void* q_out, const void* k_in, void* k_out,
           const int64_t* meta, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  RopeArgs a{};
  a.cos = cos;
  a.sin = sin;
  a.half = static_cast<int>(rotary_dim / 2);
  a.rot0 = MODE == kV4 ? static_cast<int>(head_dim - rotary_dim) : 0;
  a.pass0 = MODE == kV4 ? 0 : static_cast<int>(rotary_dim);
  const void* ins[2] = {q_in, k_in};
  void* outs[2] = {q_out, k_out};
  bool vec_ok = a.half % kVec == 0 && head_dim % kVec == 0 && aligned(cos, kVec * sizeof(Tc)) &&
                aligned(sin, kVec * sizeof(Tc));
  int64_t rows_total[2] = {0, 0};
  bool loop = g_loop != 0 && MODE == kHalf;  // the head loop exists for HF's layout only
  for (int w = 0; w < 2; ++w) {
    RopeTensor& t = a.t[w];
    if (!ins[w]) continue;
    const int64_t* m = meta + 15 * w;
    t.in = ins[w];
    t.out = outs[w];
    int64_t rows = 1;
    for (int d = 0; d < 3; ++d) {
      t.n[d] = m[d];
      t.is[d] = m[3 + d];
      t.os[d] = m[6 + d];
      t.cs[d] = m[9 + d];
      t.ss[d] = m[12 + d];
      if (t.n[d] < 0) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative dimension", what);
      rows *= t.n[d];
      vec_ok = vec_ok && t.is[d] % kVec == 0 && t.os[d] % kVec == 0 && t.cs[d] % kVec == 0 &&
               t.ss[d] % kVec == 0;
    }
    if (rows == 0) continue;
    if (!t.in || !t.out) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null tensor", what);
    // The head loop: the largest dimension that cos and sin do not depend on, moved to position 0
    // (the other two keep their order, largest input stride first).
    int hd = -1;
    for (int d = 0; d < 3; ++d)
      if (t.cs[d] == 0 && t.ss[d] == 0 && t.n[d] > 1 && (hd < 0 || t.n[d] > t.n[hd])) hd = d;
    if (hd < 0) loop = false;
    for (int d = loop ? hd : 0; d > 0; --d) {
      std::swap(t.n[d], t.n[d - 1]);
      std::swap(t.is[d], t.is[d - 1]);
      std::swap(t.os[d], t.os[d - 1]);
      std::swap(t.cs[d], t.cs[d - 1]);
      std::swap(t.ss[d], t.ss[d - 1]);
    }
    vec_ok = vec_ok && aligned(t.in, 16) && aligned(t.out, 16);
    t.n1 = static_cast<uint32_t>(t.n[1] > 0 ? t.n[1] : 1);
    t.n2 = static_cast<uint32_t>(t.n[2] > 0 ? t.n[2] : 1);
    if (t.n[1] > UINT32_MAX || t.n[2] > UINT32_MAX)
      return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: a dimension of 2^32 or more", what);
    rows_total[w] = rows;
  }
  // With the head loop a thread row is (chunk of kLoopHeads heads, i1, i2).
  if (loop)
    for (int w = 0; w < 2; ++w)
      if (rows_total[w] > 0)
        rows_total[w] = rows_total[w] / a.t[w].n[0] * ((a.t[w].n[0] + kLoopHeads - 1) / kLoopHeads);
  const int vec = vec_ok ? kVec : 1;
  a.pairs = a.half / vec;
  a.npass = static_cast<int>((head_dim - rotary_dim) / vec);
  a.spread = g_spread && a.npass > 0;
  a.slots_per_row = a.spread ? a.pairs : a.pairs + a.npass;
  int64_t total = 0;
  for (int w = 0; w < 2; ++w) {
    if (rows_total[w] * a.slots_per_row >= (int64_t(1) << 32))
      return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: 2^32 or more vectors in one tensor", what);
    a.t[w].slots = rows_total[w] * a.slots_per_row;
    total += a.t[w].slots;
  }
  if (total == 0) return OPSLOT_OK;
  if (!cos || !sin) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null cos/sin", what);
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  if (blocks > INT32_MAX) return set_error(OPSLOT_ERR_UNSUPPORTED, "%s: too many elements", what);
  const unsigned g = static_cast<unsigned>(blocks);
  auto go = [&](auto vec_tag, auto spread_tag) {
    constexpr int V = decltype(vec_tag)::value;
    constexpr bool SP = decltype(spread_tag)::value;
    if constexpr (kBench && MODE == kHalf) {  // the head loop: bench library only
      if (loop) {
        if (bwd)
          rope_kernel<T, Tc, V, true, SP, true, MODE><<<g, threads, 0, stream>>>(a);
        else
          rope_kernel<T, Tc, V, false, SP, true, MODE><<<g, threads, 0, stream>>>(a);
        return;
      }
    }
    if (bwd)
      rope_kernel<T, Tc, V, true, SP, false, MODE><<<g, threads, 0, stream>>>(a);
    else
      rope_kernel<T, Tc, V, false, SP, false, MODE><<<g, threads, 0, stream>>>(a);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if constexpr (MODE == kVision) {
    if (const int lanes = vision_lanes(a, vec_ok)) {
      a.t[0].slots = a.t[0].n[0] * lanes * a.pairs;  // threads
      const unsigned blocks = static_cast<unsigned>((a.t[0].slots + threads - 1) / threads);
      if (bwd)
        rope_vision_heads<T, Tc, kVec, true><<<blocks, threads, 0, stream>>>(a, lanes);
      else
        rope_vision_heads<T, Tc, kVec, false><<<blocks, threads, 0, stream>>>(a, lanes);
      return check_launch(bwd ? "rope_vision backward" : "rope_vision forward");
    }
  }
  if constexpr (MODE == kInterleaved || MODE == kVision) {  // no pass-through part: no spread
    if (vec_ok)
      go(std::integral_constant<int, kVec>{}, No{});
    else
      go(std::integral_constant<int, 1>{}, No{});
    return check_launch(MODE == kInterleaved
                            ? (bwd ? "rope_interleaved backward" : "rope_interleaved forward")
                            : (bwd ? "rope_vision backward" : "rope_vision forward"));
  } else {
    if (vec_ok) {
      if (a.spread)
        go(std::integral_constant<int, kVec>{}, Yes{});
      else
        go(std::integral_constant<int, kVec>{}, No{});
    } else {
      if (a.spread)
        go(std::integral_constant<int, 1>{}, Yes{});
      else
        go(std::integral_constant<int, 1>{}, No{});
    }
    if constexpr (MODE == kV4)
      return check_launch(bwd ? "rope_deepseek_v4 backward" : "rope_deepseek_v4 forward");
    else
      return check_launch(bwd ? "rope backward" : "rope forward");
  }
}

// The dtype dispatch of an entry point (q/k `dtype`; cos/sin `cs_dtype`: the same or float32).
template <int MODE>
int run(const char* what, int backward, int dtype, int cs_dtype, int64_t head_dim,
        int64_t rotary_dim, const void* cos, const void* sin, const void* q_in, void* q_out,
        const void* k_in, void* k_out, const int64_t* meta, void* stream) {
  if (!meta) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null meta", what);
  if (cs_dtype != dtype && cs_dtype != OPSLOT_FLOAT32)
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: cos/sin dtype code %d with q/k dtype code %d (cos/sin must have "
                     "q's dtype or float32)",
                     what, cs_dtype, dtype);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool bwd = backward != 0;
  const bool cf = cs_dtype == OPSLOT_FLOAT32;
  switch (dtype) {
    case OPSLOT_FLOAT32:
      return launch<MODE, float, float>(what, bwd, head_dim, rotary_dim, cos, sin, q_in, q_out,
                                        k_in, k_out, meta, s);
    case OPSLOT_FLOAT16:
      return cf ? launch<MODE, __half, float>(what, bwd, head_dim, rotary_dim, cos, sin, q_in,
                                              q_out, k_in, k_out, meta, s)
                : launch<MODE, __half, __half>(what, bwd, head_dim, rotary_dim, cos, sin, q_in,
                                               q_out, k_in, k_out, meta, s);
    case OPSLOT_BFLOAT16:
      return cf ? launch<MODE, __nv_bfloat16, float>(what, bwd, head_dim, rotary_dim, cos, sin,
                                                     q_in, q_out, k_in, k_out, meta, s)
                : launch<MODE, __nv_bfloat16, __nv_bfloat16>(
                      what, bwd, head_dim, rotary_dim, cos, sin, q_in, q_out, k_in, k_out, meta, s);
    default:
      return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code %d", what, dtype);
  }
}

// The whole head dimension rotated (interleaved and vision): even, positive, at most 2^30.
int check_whole(const char* what, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 || head_dim > (1 << 30))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: head_dim %lld must be even and positive",
                     what, static_cast<long long>(head_dim));
  return OPSLOT_OK;
}

}  // namespace
}  // namespace opslot

using namespace opslot;

extern "C" OPSLOT_API int opslot_rope(int backward, int dtype, int cs_dtype, int64_t head_dim,
                                      int64_t rotary_dim, const void* cos, const void* sin,
                                      const void* q_in, void* q_out, const void* k_in, void* k_out,
                                      const int64_t* meta, void* stream) {
  if (!meta) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rope: null meta");
  if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > head_dim || head_dim > (1 << 30))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rope: rotary_dim %lld must be even, positive and <= head_dim %lld",
                     static_cast<long long>(rotary_dim), static_cast<long long>(head_dim));
  return run<kHalf>("rope", backward, dtype, cs_dtype, head_dim, rotary_dim, cos, sin, q_in, q_out,
                    k_in, k_out, meta, stream);
}

extern "C" OPSLOT_API int opslot_rope_interleaved(int backward, int dtype, int cs_dtype,
                                                  int64_t head_dim, const void* cos,
                                                  const void* sin, const void* q_in, void* q_out,
                                                  const void* k_in, void* k_out,
                                                  const int64_t* meta, void* stream) {
  if (int rc = check_whole("rope_interleaved", head_dim)) return rc;
  return run<kInterleaved>("rope_interleaved", backward, dtype, cs_dtype, head_dim, head_dim, cos,
                           sin, q_in, q_out, k_in, k_out, meta, stream);
}

extern "C" OPSLOT_API int opslot_rope_vision(int backward, int dtype, int cs_dtype,
                                             int64_t head_dim, const void* cos, const void* sin,
                                             const void* q_in, void* q_out, const void* k_in,
                                             void* k_out, const int64_t* meta, void* stream) {
  if (int rc = check_whole("rope_vision", head_dim)) return rc;
  return run<kVision>("rope_vision", backward, dtype, cs_dtype, head_dim, head_dim, cos, sin, q_in,
                      q_out, k_in, k_out, meta, stream);
}

extern "C" OPSLOT_API int opslot_rope_deepseek_v4(int backward, int dtype, int cs_dtype,
                                                  int64_t head_dim, int64_t rotary_dim,
                                                  const void* cos, const void* sin,
                                                  const void* x_in, void* x_out,
                                                  const int64_t* meta, void* stream) {
  if (!meta) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "rope_deepseek_v4: null meta");
  if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > head_dim || head_dim > (1 << 30))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rope_deepseek_v4: rotary_dim %lld must be even, positive and <= head_dim "
                     "%lld",
                     static_cast<long long>(rotary_dim), static_cast<long long>(head_dim));
  return run<kV4>("rope_deepseek_v4", backward, dtype, cs_dtype, head_dim, rotary_dim, cos, sin,
                  x_in, x_out, nullptr, nullptr, meta, stream);
}

#ifdef OPSLOT_KERNELS_BENCH
extern "C" OPSLOT_API int opslot_rope_set_tuning(int spread_pass_through, int loop_heads) {
  if ((spread_pass_through != 0 && spread_pass_through != 1) ||
      (loop_heads != 0 && loop_heads != 1))
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "rope tuning: spread_pass_through and loop_heads 0 or 1");
  g_spread = spread_pass_through;
  g_loop = loop_heads;
  return OPSLOT_OK;
}
#endif  // OPSLOT_KERNELS_BENCH
