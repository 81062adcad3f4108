// TestDriver: the Driver plus the calls only tests, benchmarks and tools make
// (GVM_VMM_TEST_CALLS in driver_calls.hpp): streams of their own, stream
// capture, synchronous copies, fills, kernels, access queries, shareable
// handles. The allocator never makes them, so they are not part of the
// interface it sees; CudaDriver and SimDriver implement both.
#pragma once

#include <memory>
#include <string>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

class TestDriver : public Driver {
 public:
#define GVM_VMM_PURE(name, cu_name, params, args) virtual Result name params = 0;
  GVM_VMM_TEST_CALLS(GVM_VMM_PURE)
#undef GVM_VMM_PURE
};

// The real driver with its test calls: load_cuda_driver() and friends
// (cuda_driver.hpp) as a TestDriver, with the same errors and messages.
std::unique_ptr<TestDriver> load_cuda_test_driver();
std::unique_ptr<TestDriver> try_load_cuda_test_driver(std::string* why = nullptr);
std::unique_ptr<TestDriver> load_cuda_test_driver_from(const char* library);

}  // namespace gvm::vmm
