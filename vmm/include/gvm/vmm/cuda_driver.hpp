// CudaDriver: the real CUDA driver, loaded at run time.
//
// gvmalloc never links libcuda: load_cuda_driver() dlopens libcuda.so.1 and
// resolves every entry point through cuGetProcAddress, asking for the ABI of
// the CUDA version the code is compiled against. So the library loads on a
// machine without a GPU and says plainly why there is no driver, instead of
// failing to start (the unit test no_libcuda_dependency keeps it that way).
//
// Contexts: each device's primary context (the one the CUDA runtime, PyTorch
// and CuPy use) is retained on first use and released by the destructor. A
// call that needs a device's context makes it current on the calling thread
// only for the duration of the call and then restores whatever was current,
// so the caller's notion of "current device" never changes under it.
//
// A nullptr stream is the legacy stream of the device the Driver interface
// names for it (dst_device for memcpy_peer_async): that device's context is
// the one made current for the call. The same object is a TestDriver
// (test_driver.hpp: load_cuda_test_driver()).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

// No usable CUDA driver: libcuda.so.1 missing, too old, or cuInit failed.
// what() is one line that says which, e.g.
//   "no CUDA driver found: libcuda.so.1: cannot open shared object file: ..."
//   "CUDA driver found but cuInit failed: CUDA_ERROR_NO_DEVICE"
class DriverUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The real driver. Throws DriverUnavailable; never aborts without a driver.
std::unique_ptr<Driver> load_cuda_driver();

// As load_cuda_driver, but returns nullptr and sets *why (when why is not
// null) instead of throwing.
std::unique_ptr<Driver> try_load_cuda_driver(std::string* why = nullptr);

// load_cuda_driver() from another library name or path. For tests of the
// no-driver and broken-driver paths; production code uses load_cuda_driver.
std::unique_ptr<Driver> load_cuda_driver_from(const char* library);

// The driver's version as cuDriverGetVersion reports it (13000 for 13.0), or
// 0 when `driver` is not a CudaDriver.
int cuda_driver_version(const Driver& driver) noexcept;

// The device whose primary context is current on the calling thread, or -1
// (none, or a context that is not a primary one). Lets tests check that
// CudaDriver leaves the caller's current context as it found it. Returns -1
// when `driver` is not a CudaDriver.
int cuda_current_device(const Driver& driver) noexcept;

}  // namespace gvm::vmm
