// Driver: the one interface to the CUDA driver that the allocator sees.
//
// Every driver entry point the allocator uses is a virtual function here that
// returns the driver's result code. Implementations:
//   CudaDriver  the real driver, loaded at run time (cuda_driver.hpp)
//   SimDriver   a CPU simulation for tests and replay (sim_driver.hpp)
// Both also implement TestDriver (test_driver.hpp): the calls only tests,
// benchmarks and tools make (streams of their own, kernels, synchronous
// copies, capture), which are not part of this interface.
// Decorators derive from ForwardingDriver (forwarding_driver.hpp) and override
// only what they change; CountingDriver (counting_driver.hpp) counts and times
// every call. Nothing outside vmm/ includes <cuda.h> or names a cu* function.
//
// The boundary is written once, as the tables of driver_calls.hpp: the
// Driver and TestDriver interfaces, the Call enum, call_name(), the
// forwarding base and the decorators are generated from them. Each entry is
//   X(name, "cuName", (parameters), (arguments))
// and the comment before it is its contract.
//
// Threading: every method may be called from any thread. Calls that act on a
// device make that device's primary context current on the calling thread
// first (the context PyTorch and CuPy use), so callers never manage contexts.
// Streams: nullptr is the legacy default stream of the device the call names
// (its `device`, or dst_device for memcpy_peer_async).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gvm/vmm/driver_calls.hpp"
#include "gvm/vmm/result.hpp"
#include "gvm/vmm/types.hpp"

namespace gvm::vmm {

// Every entry point by name, the Driver's first, then TestDriver's
// (test_driver.hpp lists those): fault injection (SimDriver) and per-call
// statistics (CountingDriver) index by it.
#define GVM_VMM_ENUM(name, cu_name, params, args) name,
#define GVM_VMM_COUNT(name, cu_name, params, args) +1
enum class Call : int {
  GVM_VMM_DRIVER_CALLS(GVM_VMM_ENUM)
  GVM_VMM_TEST_CALLS(GVM_VMM_ENUM)
  count_
};
// The entry points of Driver (what the allocator can call and count).
constexpr int kCallCount = 0 GVM_VMM_DRIVER_CALLS(GVM_VMM_COUNT);
// Driver's and TestDriver's together.
constexpr int kAllCallCount = static_cast<int>(Call::count_);
#undef GVM_VMM_COUNT
#undef GVM_VMM_ENUM

// "cuMemCreate" for Call::mem_create.
const char* call_name(Call c) noexcept;

class Driver {
 public:
  virtual ~Driver() = default;
  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // "cuda" or "sim" (a decorator names what it wraps).
  virtual const char* name() const noexcept = 0;

#define GVM_VMM_PURE(name, cu_name, params, args) virtual Result name params = 0;
  GVM_VMM_DRIVER_CALLS(GVM_VMM_PURE)
#undef GVM_VMM_PURE
};

}  // namespace gvm::vmm
