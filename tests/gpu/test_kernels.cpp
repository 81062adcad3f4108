#include "test_kernels.hpp"

#include <algorithm>
#include <chrono>

#include "test_kernels_ptx.hpp"  // generated from kernels/test_kernels.ptx

namespace gvm::test {

using vmm::DevicePtr;
using vmm::Result;
using vmm::StreamHandle;

namespace {

// 256 threads a block and up to 8 blocks per SM: enough resident warps to
// saturate memory bandwidth on every GPU from P40 to B200; the kernels use a
// grid-stride loop, so the grid size never changes what they compute.
constexpr unsigned kBlock = 256;
constexpr unsigned kBlocksPerSm = 8;

}  // namespace

const char* test_kernels_ptx() noexcept {
  return kTestKernelsPtx;
}

TestKernels::~TestKernels() {
  if (module_ != nullptr) (void)driver_->module_unload(device_, module_);
}

Result TestKernels::load(vmm::TestDriver& driver, int device) {
  if (module_ != nullptr) return Result::invalid_value;  // load once
  int sms = 0;
  if (Result r = driver.device_attribute(device, vmm::DeviceAttribute::multiprocessor_count, &sms);
      r != Result::success)
    return r;
  vmm::ModuleHandle m = nullptr;
  if (Result r = driver.module_load_data(device, kTestKernelsPtx, &m); r != Result::success)
    return r;
  driver_ = &driver;
  device_ = device;
  module_ = m;
  sm_count_ = static_cast<unsigned>(std::max(sms, 1));
  struct {
    const char* name;
    vmm::FunctionHandle* slot;
  } const functions[] = {
      {"fill_u32", &fill_}, {"check_u32", &check_}, {"copy_u32", &copy_}, {"spin_read", &spin_}};
  for (const auto& f : functions) {
    if (Result r = driver.module_get_function(module_, f.name, f.slot); r != Result::success)
      return r;
  }
  return Result::success;
}

Result TestKernels::launch(vmm::FunctionHandle f, StreamHandle stream, std::size_t n, void** args) {
  if (module_ == nullptr) return Result::invalid_handle;
  std::size_t blocks =
      std::clamp<std::size_t>((n + kBlock - 1) / kBlock, 1, std::size_t{sm_count_} * kBlocksPerSm);
  return driver_->launch_kernel(device_, f, static_cast<unsigned>(blocks), kBlock, stream, args);
}

Result TestKernels::fill(StreamHandle stream, DevicePtr p, std::uint32_t value, std::size_t n) {
  void* args[] = {&p, &value, &n};
  return launch(fill_, stream, n, args);
}

Result TestKernels::check(StreamHandle stream, DevicePtr p, std::uint32_t value, std::size_t n,
                          DevicePtr mismatches) {
  void* args[] = {&p, &value, &n, &mismatches};
  return launch(check_, stream, n, args);
}

Result TestKernels::copy(StreamHandle stream, DevicePtr dst, DevicePtr src, std::size_t n) {
  void* args[] = {&dst, &src, &n};
  return launch(copy_, stream, n, args);
}

Result TestKernels::spin_read(StreamHandle stream, DevicePtr p, std::size_t n,
                              std::uint64_t iterations, DevicePtr sink) {
  void* args[] = {&p, &n, &iterations, &sink};
  return launch(spin_, stream, n, args);
}

Result TestKernels::count_mismatches(StreamHandle stream, DevicePtr p, std::uint32_t value,
                                     std::size_t n, std::uint32_t* mismatches) {
  if (module_ == nullptr) return Result::invalid_handle;
  DevicePtr counter = 0;
  if (Result r = driver_->mem_alloc(device_, sizeof(std::uint32_t), &counter); r != Result::success)
    return r;
  Result r = driver_->memset_d8_async(device_, counter, 0, sizeof(std::uint32_t), stream);
  if (r == Result::success) r = check(stream, p, value, n, counter);
  if (r == Result::success) r = driver_->stream_synchronize(device_, stream);
  if (r == Result::success)
    r = driver_->memcpy_dtoh(device_, mismatches, counter, sizeof(std::uint32_t));
  Result f = driver_->mem_free(device_, counter);
  return r != Result::success ? r : f;
}

Result TestKernels::calibrate_spin(StreamHandle stream, DevicePtr p, std::size_t n, double seconds,
                                   std::uint64_t* iterations) {
  if (module_ == nullptr) return Result::invalid_handle;
  DevicePtr sink = 0;
  if (Result r = driver_->mem_alloc(device_, sizeof(std::uint32_t), &sink); r != Result::success)
    return r;
  // Warm-up (JIT, first touch), then time a run long enough to dwarf the
  // launch overhead.
  Result r = spin_read(stream, p, n, 1, sink);
  if (r == Result::success) r = driver_->stream_synchronize(device_, stream);
  std::uint64_t probe = 16;
  double elapsed = 0;
  while (r == Result::success) {
    auto t0 = std::chrono::steady_clock::now();
    r = spin_read(stream, p, n, probe, sink);
    if (r == Result::success) r = driver_->stream_synchronize(device_, stream);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed >= 0.02 || probe >= (std::uint64_t{1} << 30)) break;
    probe *= 4;
  }
  Result f = driver_->mem_free(device_, sink);
  if (r != Result::success) return r;
  if (f != Result::success) return f;
  double per_iteration = elapsed / static_cast<double>(probe);
  double want = seconds / std::max(per_iteration, 1e-12);
  *iterations = static_cast<std::uint64_t>(std::clamp(want, 1.0, 1e12));
  return Result::success;
}

}  // namespace gvm::test
