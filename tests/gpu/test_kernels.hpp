// The test kernels (kernels/test_kernels.ptx, embedded at build time), loaded
// on one device through Driver::module_load_data, with launch helpers.
// Used by the GPU tests and by the hazard child process; no GoogleTest here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

// The PTX text of kernels/test_kernels.ptx.
const char* test_kernels_ptx() noexcept;

class TestKernels {
 public:
  TestKernels() = default;
  ~TestKernels();
  TestKernels(const TestKernels&) = delete;
  TestKernels& operator=(const TestKernels&) = delete;

  // JIT-compiles the PTX for `device` and finds the four kernels.
  vmm::Result load(vmm::TestDriver& driver, int device);
  bool loaded() const noexcept { return module_ != nullptr; }
  int device() const noexcept { return device_; }

  // Each launches one kernel on `stream` (of this device), not waiting.
  // p[i] = value for i < n.
  vmm::Result fill(vmm::StreamHandle stream, vmm::DevicePtr p, std::uint32_t value, std::size_t n);
  // *mismatches += count of p[i] != value.
  vmm::Result check(vmm::StreamHandle stream, vmm::DevicePtr p, std::uint32_t value, std::size_t n,
                    vmm::DevicePtr mismatches);
  // dst[i] = src[i].
  vmm::Result copy(vmm::StreamHandle stream, vmm::DevicePtr dst, vmm::DevicePtr src, std::size_t n);
  // Reads p[0..n) `iterations` times.
  vmm::Result spin_read(vmm::StreamHandle stream, vmm::DevicePtr p, std::size_t n,
                        std::uint64_t iterations, vmm::DevicePtr sink);

  // check() into a fresh counter, then waits for `stream` and reads the count.
  vmm::Result count_mismatches(vmm::StreamHandle stream, vmm::DevicePtr p, std::uint32_t value,
                               std::size_t n, std::uint32_t* mismatches);

  // spin_read iterations that keep `stream` busy for about `seconds`, measured
  // by timing a short run over the same range (the time depends on the GPU
  // and on whether the range is local or a peer's).
  vmm::Result calibrate_spin(vmm::StreamHandle stream, vmm::DevicePtr p, std::size_t n,
                             double seconds, std::uint64_t* iterations);

 private:
  vmm::Result launch(vmm::FunctionHandle f, vmm::StreamHandle stream, std::size_t n, void** args);

  vmm::TestDriver* driver_ = nullptr;
  int device_ = -1;
  unsigned sm_count_ = 1;
  vmm::ModuleHandle module_ = nullptr;
  vmm::FunctionHandle fill_ = nullptr;
  vmm::FunctionHandle check_ = nullptr;
  vmm::FunctionHandle copy_ = nullptr;
  vmm::FunctionHandle spin_ = nullptr;
};

}  // namespace gvm::test
