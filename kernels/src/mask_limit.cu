// One past the last column each row of an attention mask shows (opslot_kernels/mask_limit.h): one
// warp per row, reading it backwards from its end until a shown entry.
#include <type_traits>

#include "common.cuh"
#include "opslot_kernels/mask_limit.h"
#include "opslot_kernels/topk.h"

namespace opslot::mask_limit {
namespace {

constexpr const char* kName = "opslot_mask_limit";
constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;  // loads in flight per lane

template <int kMask>
constexpr int kBytes = kMask == OPSLOT_TOPK_MASK_BOOL ? 1
                                                      : (kMask == OPSLOT_TOPK_MASK_FLOAT32 ? 4 : 2);

// Whether a mask entry shows its key, from its bits (the low kBytes bytes of `w`): bool nonzero;
// a float above its dtype's lowest finite value (that value, -inf and NaN hide).
template <int kMask>
__device__ __forceinline__ bool shown_bits(uint32_t w) {
  if constexpr (kMask == OPSLOT_TOPK_MASK_BOOL) {
    return (w & 0xffu) != 0;
  } else if constexpr (kMask == OPSLOT_TOPK_MASK_FLOAT32) {
    return __uint_as_float(w) > __uint_as_float(0xff7fffffu);  // -FLT_MAX
  } else if constexpr (kMask == OPSLOT_TOPK_MASK_FLOAT16) {
    return __half2float(__ushort_as_half(static_cast<uint16_t>(w))) > -65504.f;
  } else {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<uint16_t>(w))) >
           __uint_as_float(0xff7f0000u);  // bfloat16's lowest finite value
  }
}

// Whether entry t of a mask row shows its key.
template <int kMask>
__device__ __forceinline__ bool shown(const void* row, int64_t t) {
  const uint8_t* p = static_cast<const uint8_t*>(row) + t * kBytes<kMask>;
  if constexpr (kBytes<kMask> == 1) return shown_bits<kMask>(*p);
  if constexpr (kBytes<kMask> == 2) return shown_bits<kMask>(*reinterpret_cast<const uint16_t*>(p));
  if constexpr (kBytes<kMask> == 4) return shown_bits<kMask>(*reinterpret_cast<const uint32_t*>(p));
}

// The largest shown entry among the kEntries of a 16-byte vector starting at entry `first`, or -1.
template <int kMask>
__device__ __forceinline__ int last_shown(const uint4& v, int first) {
  constexpr int kEntries = 16 / kBytes<kMask>, kPerWord = 4 / kBytes<kMask>;
  int best = -1;
#pragma unroll
  for (int j = 0; j < kEntries; ++j) {
    const uint32_t w = (&v.x)[j / kPerWord] >> (8 * kBytes<kMask> * (j % kPerWord));
    if (shown_bits<kMask>(w)) best = first + j;
  }
  return best;
}

// Whether a lane of the warp holds a shown entry (`best` >= 0); if so `limit` gets one past the
// largest.
__device__ __forceinline__ bool warp_found(int best, int& limit) {
  if (__ballot_sync(0xffffffffu, best >= 0) == 0) return false;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  limit = best + 1;
  return true;
}

template <int kMask>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    limit_kernel(const void* mask, int64_t seq, int64_t cols, int64_t ms0, int64_t ms1,
                 int64_t rows, int32_t* out) {
  constexpr int kEntries = 16 / kBytes<kMask>;  // entries per 16-byte vector
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t b = r / seq, s = r % seq;
  const void* row = static_cast<const char*>(mask) + (b * ms0 + s * ms1) * kBytes<kMask>;
  int limit = 0;
  int64_t end = cols;  // entries [end, cols) hold nothing shown
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    // The entries past the last whole vector one per lane, then 16-byte vectors, 32 * kUnroll per
    // step (the same steps in every lane).
    const int64_t whole = cols / kEntries;
    int best = -1;
    const int64_t t = whole * kEntries + lane;
    if (t < cols && shown<kMask>(row, t)) best = static_cast<int>(t);
    for (int64_t vend = whole;; vend -= 32 * kUnroll) {
      if (warp_found(best, limit) || vend <= 0) break;
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = vend - 1 - lane - 32 * u;
        v[u] = i >= 0 ? static_cast<const uint4*>(row)[i] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = vend - 1 - lane - 32 * u;
        if (i >= 0) best = max(best, last_shown<kMask>(v[u], static_cast<int>(i * kEntries)));
      }
    }
    end = 0;
  }
  for (; end > 0; end -= 32 * kUnroll) {  // rows not 16-byte aligned: one entry per lane and load
    int best = -1;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = end - 1 - lane - 32 * u;
      if (t >= 0 && shown<kMask>(row, t) && t > best) best = static_cast<int>(t);
    }
    if (warp_found(best, limit)) break;
  }
  if (lane == 0) out[r] = limit;
}

template <int kMask>
int launch(const void* mask, int64_t seq, int64_t cols, const int64_t* st, int64_t rows,
           int32_t* out, cudaStream_t stream) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  limit_kernel<kMask><<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      mask, seq, cols, st[0], st[1], rows, out);
  return check_launch(kName);
}

}  // namespace
}  // namespace opslot::mask_limit

extern "C" {

OPSLOT_API int opslot_mask_limit(const void* mask, int mask_kind, int64_t batch, int64_t seq,
                                 int64_t cols, const int64_t* mask_stride, int32_t* out,
                                 void* stream) {
  using namespace opslot;
  using namespace opslot::mask_limit;
  if (batch < 0 || seq < 0 || cols < 0) {
    return set_error(
        OPSLOT_ERR_INVALID_ARGUMENT, "%s: negative size (batch %lld, seq %lld, cols %lld)", kName,
        static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(cols));
  }
  if (mask_kind < OPSLOT_TOPK_MASK_FLOAT32 || mask_kind > OPSLOT_TOPK_MASK_BOOL) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown mask kind %d", kName, mask_kind);
  }
  if (batch == 0 || seq == 0) return OPSLOT_OK;  // nothing to write
  if (batch * seq > INT32_MAX || cols > INT32_MAX) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: %lld rows of %lld columns; the kernel takes fewer than 2^31 of each",
                     kName, static_cast<long long>(batch * seq), static_cast<long long>(cols));
  }
  if (out == nullptr || mask_stride == nullptr || (cols > 0 && mask == nullptr)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null pointer", kName);
  }
  const auto st = static_cast<cudaStream_t>(stream);
  const int64_t rows = batch * seq;
  switch (mask_kind) {
    case OPSLOT_TOPK_MASK_BOOL:
      return launch<OPSLOT_TOPK_MASK_BOOL>(mask, seq, cols, mask_stride, rows, out, st);
    case OPSLOT_TOPK_MASK_FLOAT32:
      return launch<OPSLOT_TOPK_MASK_FLOAT32>(mask, seq, cols, mask_stride, rows, out, st);
    case OPSLOT_TOPK_MASK_FLOAT16:
      return launch<OPSLOT_TOPK_MASK_FLOAT16>(mask, seq, cols, mask_stride, rows, out, st);
    default:
      return launch<OPSLOT_TOPK_MASK_BFLOAT16>(mask, seq, cols, mask_stride, rows, out, st);
  }
}

}  // extern "C"
