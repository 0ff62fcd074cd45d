#include <cstdio>

#include "common.cuh"

namespace {
thread_local char g_last_error[1024] = "";
}

namespace opslot {

int set_error(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, args);
  va_end(args);
  return code;
}

int check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: kernel launch failed: %s", what,
                     cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

int num_sms() {
  static DeviceMemo memo;  // a device's SM count does not change: asked once per device
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  int n = memo.get(dev, 0);
  if (n <= 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      return 132;
    memo.put(dev, 0, n);
  }
  return n;
}

bool device_is_sm90() {
  static DeviceMemo memo;  // a device's compute capability does not change: asked once per device
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  int v = memo.get(dev, 0);
  if (v < 0) {
    int major = 0, minor = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major == 9 && minor == 0;
    memo.put(dev, 0, v);
  }
  return v == 1;
}

}  // namespace opslot

extern "C" {

OPSLOT_API int opslot_abi_version(void) { return OPSLOT_KERNELS_ABI_VERSION; }

OPSLOT_API const char* opslot_last_error(void) { return g_last_error; }

#define OPSLOT_STR2(x) #x
#define OPSLOT_STR(x) OPSLOT_STR2(x)
#ifdef OPSLOT_KERNELS_BENCH
#define OPSLOT_BUILD_KNOBS "; bench (tuning knobs)"
#else
#define OPSLOT_BUILD_KNOBS ""
#endif
#if defined(OPSLOT_KERNELS_DIAGNOSTICS) && OPSLOT_KERNELS_DIAGNOSTICS
#define OPSLOT_BUILD_DIAGNOSTICS "; diagnostics"
#else
#define OPSLOT_BUILD_DIAGNOSTICS ""
#endif
#define OPSLOT_BUILD_ABI OPSLOT_STR(OPSLOT_KERNELS_ABI_VERSION)
#define OPSLOT_BUILD_NVCC OPSLOT_STR(__CUDACC_VER_MAJOR__) "." OPSLOT_STR(__CUDACC_VER_MINOR__)
OPSLOT_API const char* opslot_build_info(void) {
  return "opslot_kernels abi " OPSLOT_BUILD_ABI "; nvcc " OPSLOT_BUILD_NVCC
         "; sm_90a sm_80 compute_80" OPSLOT_BUILD_KNOBS OPSLOT_BUILD_DIAGNOSTICS;
}

// A kernel that does nothing: its attributes tell whether the library has code for a device.
__global__ void opslot_probe_kernel() {}

OPSLOT_API int opslot_check_device(int device) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    return opslot::set_error(static_cast<int>(err), "CUDA device %d: %s", device,
                             cudaGetErrorString(err));
  }
  if (major < 8) {
    return opslot::set_error(
        OPSLOT_ERR_UNSUPPORTED,
        "CUDA device %d has compute capability %d.%d; libopslot_kernels needs 8.0 or newer", device,
        major, minor);
  }
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, opslot_probe_kernel);
  if (err != cudaSuccess) {
    return opslot::set_error(static_cast<int>(err),
                             "CUDA device %d (sm_%d%d): no usable code in libopslot_kernels: %s",
                             device, major, minor, cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

}  // extern "C"
