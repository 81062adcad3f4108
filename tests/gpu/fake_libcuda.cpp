// A stand-in for libcuda.so.1 that lets the unit tests drive CudaDriver's
// loader down its failure paths on a machine without a GPU. It exports only
// cuGetProcAddress_v2, as the real driver does for CUDA 12+, and hands out
// tiny functions written here (no <cuda.h>; the values are CUresult's).
// GVM_FAKE_CUDA picks the failure:
//   init_fails      every entry point resolves; cuInit returns CUDA_ERROR_NO_DEVICE
//   missing:<name>  cuGetProcAddress does not know <name>
//   no_devices      cuInit succeeds; cuDeviceGetCount reports 0
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kNoDevice = 100;
constexpr int kNotFound = 500;
constexpr int kUnknown = 999;
constexpr int kSymbolFound = 0;     // CU_GET_PROC_ADDRESS_SUCCESS
constexpr int kSymbolNotFound = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND

const char* mode() {
  const char* m = std::getenv("GVM_FAKE_CUDA");
  return m != nullptr ? m : "";
}

int fake_init(unsigned) {
  return std::strcmp(mode(), "init_fails") == 0 ? kNoDevice : kSuccess;
}
int fake_driver_version(int* v) {
  *v = 13000;
  return kSuccess;
}
int fake_device_count(int* n) {
  *n = 0;
  return kSuccess;
}
int fake_error_name(int r, const char** s) {
  *s = r == kNoDevice ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return kSuccess;
}
// Any other entry point: the loader resolves but never calls them before
// failing; if it ever did, the call fails loudly instead of doing anything.
int fake_unexpected() {
  return kUnknown;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int cuGetProcAddress_v2(
    const char* symbol, void** pfn, int /*cuda_version*/, unsigned long long /*flags*/,
    int* status) {
  const char* m = mode();
  if (std::strncmp(m, "missing:", 8) == 0 && std::strcmp(symbol, m + 8) == 0) {
    *pfn = nullptr;
    if (status != nullptr) *status = kSymbolNotFound;
    return kNotFound;
  }
  if (std::strcmp(symbol, "cuInit") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_init);
  } else if (std::strcmp(symbol, "cuDriverGetVersion") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_driver_version);
  } else if (std::strcmp(symbol, "cuDeviceGetCount") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_device_count);
  } else if (std::strcmp(symbol, "cuGetErrorName") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_error_name);
  } else {
    *pfn = reinterpret_cast<void*>(&fake_unexpected);
  }
  if (status != nullptr) *status = kSymbolFound;
  return kSuccess;
}
