// DeviceKernels: the four test kernels on every device, behind one interface,
// so the peer scenarios (engine_scenario.hpp, peer_hazards.hpp) run unchanged
// on the real driver and on the simulated one:
//   load_ptx_kernels  the PTX kernels of tests/gpu (TestKernels), one module
//                     per device, launched through the Driver
//   sim_kernels       SimDriver stand-ins: a kernel is a pending access
//                     (enqueue_access: the simulator's hazards see it) and
//                     its data moves at once through the simulator's backing
// No GoogleTest here: the child process uses it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gvm/vmm/driver.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // Each enqueues one kernel on `stream`, a stream of `device`, and does not
  // wait. `p` may be memory of another device that `device` may access.
  // p[i] = value for i < n.
  virtual vmm::Result fill(int device, vmm::StreamHandle stream, vmm::DevicePtr p,
                           std::uint32_t value, std::size_t n) = 0;
  // *mismatches += count of p[i] != value; `mismatches` is memory of `device`.
  virtual vmm::Result check(int device, vmm::StreamHandle stream, vmm::DevicePtr p,
                            std::uint32_t value, std::size_t n, vmm::DevicePtr mismatches) = 0;
  // Reads p[0..n) `iterations` times: keeps `stream` busy on the range.
  virtual vmm::Result spin_read(int device, vmm::StreamHandle stream, vmm::DevicePtr p,
                                std::size_t n, std::uint64_t iterations, vmm::DevicePtr sink) = 0;
  // spin_read iterations that keep `stream` busy for about `seconds` (waits
  // for the stream while it measures).
  virtual vmm::Result calibrate_spin(int device, vmm::StreamHandle stream, vmm::DevicePtr p,
                                     std::size_t n, double seconds, std::uint64_t* iterations) = 0;

  // check() into a fresh counter, waits for `stream`, reads the count. It
  // synchronises (and cuMemFree synchronises the device): never call it where
  // a test needs work to stay in flight.
  vmm::Result count_mismatches(vmm::TestDriver& driver, int device, vmm::StreamHandle stream,
                               vmm::DevicePtr p, std::uint32_t value, std::size_t n,
                               std::uint32_t* mismatches);
};

// The PTX kernels JIT-compiled on devices 0..devices-1. nullptr on failure,
// with the result and the device that failed.
std::unique_ptr<DeviceKernels> load_ptx_kernels(vmm::TestDriver& driver, int devices,
                                                vmm::Result* result, int* failed_device);

// Stand-ins on the simulator. `sim` must have backing enabled (the checks
// read real bytes) and outlive the object.
std::unique_ptr<DeviceKernels> sim_kernels(vmm::SimDriver& sim);

// A simulated H200 pair with backing, and its stand-in kernels: what the
// scenarios' CPU tests run on.
struct SimPair {
  std::unique_ptr<vmm::SimDriver> sim = vmm::SimDriver::uniform(vmm::Profile::h200, 2);
  std::unique_ptr<DeviceKernels> kernels;
  SimPair() {
    sim->enable_backing(true);
    kernels = sim_kernels(*sim);
  }
};

}  // namespace gvm::test
