#include "device_kernels.hpp"

#include <vector>

#include "test_kernels.hpp"

namespace gvm::test {

using vmm::DevicePtr;
using vmm::Result;
using vmm::StreamHandle;

Result DeviceKernels::count_mismatches(vmm::TestDriver& driver, int device, StreamHandle stream,
                                       DevicePtr p, std::uint32_t value, std::size_t n,
                                       std::uint32_t* mismatches) {
  DevicePtr counter = 0;
  if (Result r = driver.mem_alloc(device, sizeof(std::uint32_t), &counter); r != Result::success)
    return r;
  Result r = driver.memset_d8_async(device, counter, 0, sizeof(std::uint32_t), stream);
  if (r == Result::success) r = check(device, stream, p, value, n, counter);
  if (r == Result::success) r = driver.stream_synchronize(device, stream);
  if (r == Result::success)
    r = driver.memcpy_dtoh(device, mismatches, counter, sizeof(std::uint32_t));
  const Result f = driver.mem_free(device, counter);
  return r != Result::success ? r : f;
}

namespace {

// --- the real kernels ------------------------------------------------------

class PtxKernels final : public DeviceKernels {
 public:
  Result load(vmm::TestDriver& driver, int devices, int* failed_device) {
    for (int d = 0; d < devices; ++d) {
      auto k = std::make_unique<TestKernels>();
      if (Result r = k->load(driver, d); r != Result::success) {
        *failed_device = d;
        return r;
      }
      per_device_.push_back(std::move(k));
    }
    return Result::success;
  }

  Result fill(int device, StreamHandle stream, DevicePtr p, std::uint32_t value,
              std::size_t n) override {
    TestKernels* k = on(device);
    return k == nullptr ? Result::invalid_device : k->fill(stream, p, value, n);
  }
  Result check(int device, StreamHandle stream, DevicePtr p, std::uint32_t value, std::size_t n,
               DevicePtr mismatches) override {
    TestKernels* k = on(device);
    return k == nullptr ? Result::invalid_device : k->check(stream, p, value, n, mismatches);
  }
  Result spin_read(int device, StreamHandle stream, DevicePtr p, std::size_t n,
                   std::uint64_t iterations, DevicePtr sink) override {
    TestKernels* k = on(device);
    return k == nullptr ? Result::invalid_device : k->spin_read(stream, p, n, iterations, sink);
  }
  Result calibrate_spin(int device, StreamHandle stream, DevicePtr p, std::size_t n, double seconds,
                        std::uint64_t* iterations) override {
    TestKernels* k = on(device);
    return k == nullptr ? Result::invalid_device
                        : k->calibrate_spin(stream, p, n, seconds, iterations);
  }

 private:
  TestKernels* on(int device) const {
    if (device < 0 || static_cast<std::size_t>(device) >= per_device_.size()) return nullptr;
    return per_device_[static_cast<std::size_t>(device)].get();
  }
  std::vector<std::unique_ptr<TestKernels>> per_device_;
};

// --- the simulator's stand-ins ---------------------------------------------
// The access is enqueued first: it checks `device`'s right to the range the
// way a kernel would (a denied access kills the simulated context) and stays
// pending until something synchronises, so the allocator's fence has real
// work to wait for. The data moves at once (memcpy_htod / dtoh), which is
// what the simulator does for copies too.

class SimKernels final : public DeviceKernels {
 public:
  explicit SimKernels(vmm::SimDriver& sim) : sim_(sim) {}

  Result fill(int device, StreamHandle stream, DevicePtr p, std::uint32_t value,
              std::size_t n) override {
    if (Result r = sim_.enqueue_access(device, stream, p, n * 4, vmm::AccessKind::write);
        r != Result::success)
      return r;
    std::vector<std::uint32_t> words(n, value);
    return sim_.memcpy_htod(device, p, words.data(), n * 4);
  }

  Result check(int device, StreamHandle stream, DevicePtr p, std::uint32_t value, std::size_t n,
               DevicePtr mismatches) override {
    if (Result r = sim_.enqueue_access(device, stream, p, n * 4, vmm::AccessKind::read);
        r != Result::success)
      return r;
    std::vector<std::uint32_t> words(n);
    if (Result r = sim_.memcpy_dtoh(device, words.data(), p, n * 4); r != Result::success) return r;
    std::uint32_t count = 0;
    if (Result r = sim_.memcpy_dtoh(device, &count, mismatches, 4); r != Result::success) return r;
    for (std::uint32_t w : words) count += w != value ? 1u : 0u;
    return sim_.memcpy_htod(device, mismatches, &count, 4);
  }

  Result spin_read(int device, StreamHandle stream, DevicePtr p, std::size_t n, std::uint64_t,
                   DevicePtr) override {
    return sim_.enqueue_access(device, stream, p, n * 4, vmm::AccessKind::read);
  }

  Result calibrate_spin(int, StreamHandle, DevicePtr, std::size_t, double,
                        std::uint64_t* iterations) override {
    *iterations = 1;  // a simulated access lasts until synchronised anyway
    return Result::success;
  }

 private:
  vmm::SimDriver& sim_;
};

}  // namespace

std::unique_ptr<DeviceKernels> load_ptx_kernels(vmm::TestDriver& driver, int devices, Result* result,
                                                int* failed_device) {
  auto k = std::make_unique<PtxKernels>();
  int failed = -1;
  *result = k->load(driver, devices, &failed);
  if (failed_device != nullptr) *failed_device = failed;
  if (*result != Result::success) return nullptr;
  return k;
}

std::unique_ptr<DeviceKernels> sim_kernels(vmm::SimDriver& sim) {
  return std::make_unique<SimKernels>(sim);
}

}  // namespace gvm::test
