/* The C ABI of libopslot_kernels.so: conventions shared by every entry point.
 *
 * - Tensors are raw device pointers with explicit shapes and element strides (int64_t); a kernel
 *   documents which strides it honours (others must be 1 / contiguous, checked by the caller).
 * - `dtype` is an opslot_dtype code; mixed inputs name each dtype.
 * - Every launch goes to the given `stream` (a cudaStream_t passed as void*): no device
 *   synchronisation, no allocation, no host read of device data, so every entry point can be
 *   captured in a CUDA graph. Scratch memory, where needed, is passed in by the caller.
 * - Every entry point returns 0 on success, else a nonzero code (a cudaError_t, or one of the
 *   OPSLOT_ERR_* codes) and records a message for this thread, read with opslot_last_error().
 */
#ifndef OPSLOT_KERNELS_COMMON_H_
#define OPSLOT_KERNELS_COMMON_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPSLOT_KERNELS_ABI_VERSION 1
#define OPSLOT_API __attribute__((visibility("default")))

typedef enum {
  OPSLOT_FLOAT32 = 0,
  OPSLOT_FLOAT16 = 1,
  OPSLOT_BFLOAT16 = 2,
} opslot_dtype;

enum {
  OPSLOT_OK = 0,
  OPSLOT_ERR_INVALID_ARGUMENT =
      10001,                      /* a shape, stride, dtype or pointer the kernel cannot take */
  OPSLOT_ERR_UNSUPPORTED = 10002, /* valid, but not implemented by this build or device */
};

/* OPSLOT_KERNELS_ABI_VERSION of the library (the Python binding refuses a mismatch). */
OPSLOT_API int opslot_abi_version(void);
/* The message of the last failed call on this thread ("" if none). */
OPSLOT_API const char* opslot_last_error(void);
/* What the library was built for,
 * e.g. "opslot_kernels abi 1; nvcc 13.0; sm_90a sm_80 compute_80". */
OPSLOT_API const char* opslot_build_info(void);
/* 0 when the library has machine code or PTX that runs on `device` (a CUDA ordinal), else an error
 * naming the device's compute capability and the library's targets. */
OPSLOT_API int opslot_check_device(int device);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_COMMON_H_ */
