// CudaDriver on a real GPU: device queries, bad input, contexts, streams and
// events, VMM round trips. Skipped (with the loader's message) without one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gpu_test_env.hpp"
#include "gvm/vmm/owners.hpp"
#include "test_kernels.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::AccessDesc;
using vmm::DeviceAttribute;
using vmm::DevicePtr;
using vmm::GranularityKind;
using vmm::Result;
using vmm::ShareableHandleType;

class CudaDriverTest : public CudaTest {};

bool is_power_of_two(std::size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

TEST_F(CudaDriverTest, NameAndVersion) {
  EXPECT_STREQ(driver_->name(), "cuda");
  // cuDriverGetVersion: 12000 or newer is required to load at all.
  EXPECT_GE(vmm::cuda_driver_version(*driver_), 12000);
  std::cout << "driver version " << vmm::cuda_driver_version(*driver_) << ", " << device_count_
            << " device(s)" << std::endl;
}

TEST_F(CudaDriverTest, EveryDeviceReportsSaneProperties) {
  ASSERT_GE(device_count_, 1);
  for (int d = 0; d < device_count_; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    std::string name;
    GVM_ASSERT_OK(driver_->device_name(d, &name));
    EXPECT_FALSE(name.empty());
    int major = 0, minor = -1, sms = 0, uva = 0;
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::compute_capability_major, &major));
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::compute_capability_minor, &minor));
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::multiprocessor_count, &sms));
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::unified_addressing, &uva));
    EXPECT_GE(major, 6) << "CUDA 13 drivers support Pascal (6.x) and newer";
    EXPECT_GE(minor, 0);
    EXPECT_GE(sms, 1);
    EXPECT_EQ(uva, 1) << "every 64-bit Linux GPU has unified addressing";
    for (auto a : {DeviceAttribute::vmm_supported, DeviceAttribute::posix_fd_handle_supported,
                   DeviceAttribute::fabric_handle_supported,
                   DeviceAttribute::generic_compression_supported}) {
      int v = -1;
      GVM_ASSERT_OK(driver_->device_attribute(d, a, &v));
      EXPECT_TRUE(v == 0 || v == 1) << "attribute " << static_cast<int>(a) << " = " << v;
    }
    std::size_t total = 0, free_bytes = 0, info_total = 0;
    GVM_ASSERT_OK(driver_->device_total_memory(d, &total));
    GVM_ASSERT_OK(driver_->mem_get_info(d, &free_bytes, &info_total));
    EXPECT_GT(total, 0u);
    EXPECT_GT(free_bytes, 0u);
    EXPECT_LE(free_bytes, info_total);
    EXPECT_LE(info_total, total);

    int vmm = 0;
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::vmm_supported, &vmm));
    if (vmm == 0) continue;
    std::size_t g = 0, rg = 0;
    GVM_ASSERT_OK(driver_->allocation_granularity(d, GranularityKind::minimum, &g));
    GVM_ASSERT_OK(driver_->allocation_granularity(d, GranularityKind::recommended, &rg));
    EXPECT_TRUE(is_power_of_two(g)) << g;
    EXPECT_GE(rg, g);
    EXPECT_EQ(rg % g, 0u);
    std::cout << "device " << d << ": " << name << ", sm_" << major << minor << ", " << sms
              << " SMs, " << (total >> 20) << " MiB, granularity " << g << "/" << rg << std::endl;
  }
}

TEST_F(CudaDriverTest, BadInputGetsAClearResultAndChangesNothing) {
  const int bad = device_count_;  // one past the last device
  std::string name;
  int v = 0;
  std::size_t bytes = 0, bytes2 = 0;
  bool can = false;
  DevicePtr p = 0;
  vmm::StreamHandle s = nullptr;
  vmm::EventHandle e = nullptr;
  EXPECT_EQ(driver_->device_name(-1, &name), Result::invalid_device);
  EXPECT_EQ(driver_->device_name(bad, &name), Result::invalid_device);
  EXPECT_EQ(driver_->device_attribute(bad, DeviceAttribute::vmm_supported, &v),
            Result::invalid_device);
  EXPECT_EQ(driver_->device_attribute(0, static_cast<DeviceAttribute>(1000), &v),
            Result::invalid_value);
  EXPECT_EQ(driver_->device_attribute(0, DeviceAttribute::vmm_supported, nullptr),
            Result::invalid_value);
  EXPECT_EQ(driver_->device_total_memory(bad, &bytes), Result::invalid_device);
  EXPECT_EQ(driver_->mem_get_info(bad, &bytes, &bytes2), Result::invalid_device);
  EXPECT_EQ(driver_->allocation_granularity(bad, GranularityKind::minimum, &bytes),
            Result::invalid_device);
  EXPECT_EQ(driver_->allocation_granularity(0, static_cast<GranularityKind>(7), &bytes),
            Result::invalid_value);
  EXPECT_EQ(driver_->can_access_peer(0, bad, &can), Result::invalid_device);
  EXPECT_EQ(driver_->ctx_synchronize(-1), Result::invalid_device);
  EXPECT_EQ(driver_->enable_peer_access(0, bad), Result::invalid_device);
  EXPECT_EQ(driver_->mem_create(bad, 1 << 21, ShareableHandleType::none, &p),
            Result::invalid_device);
  EXPECT_EQ(driver_->mem_create(0, 1 << 21, static_cast<ShareableHandleType>(3), &p),
            Result::invalid_value);
  EXPECT_EQ(driver_->mem_alloc(bad, 1024, &p), Result::invalid_device);
  EXPECT_EQ(driver_->mem_alloc(0, 1024, nullptr), Result::invalid_value);
  EXPECT_EQ(driver_->stream_create(bad, &s), Result::invalid_device);
  EXPECT_EQ(driver_->stream_destroy(0, nullptr), Result::invalid_handle);
  EXPECT_EQ(driver_->event_create(bad, &e), Result::invalid_device);
  EXPECT_EQ(driver_->event_destroy(nullptr), Result::invalid_handle);
  EXPECT_EQ(driver_->event_query(nullptr), Result::invalid_handle);
  EXPECT_EQ(driver_->module_load_data(0, nullptr, &e), Result::invalid_value);
  EXPECT_EQ(driver_->launch_kernel(0, nullptr, 1, 1, nullptr, nullptr), Result::invalid_handle);
  const AccessDesc bad_device[] = {{bad, Access::read_write}};
  const AccessDesc bad_flags[] = {{0, static_cast<Access>(2)}};
  EXPECT_EQ(driver_->mem_set_access(0, 1 << 21, bad_device, 1), Result::invalid_device);
  EXPECT_EQ(driver_->mem_set_access(0, 1 << 21, bad_flags, 1), Result::invalid_value);
  EXPECT_EQ(driver_->mem_set_access(0, 1 << 21, nullptr, 0), Result::invalid_value);
  // Unmapping or freeing what was never reserved is refused by the driver.
  EXPECT_NE(driver_->address_free(0x1000, 1 << 21), Result::success);
  // The device still works after all that.
  GVM_EXPECT_OK(driver_->ctx_synchronize(0));
}

// CudaDriver makes a device's context current only for the call: a thread
// with no current context has none afterwards, whatever device it used.
TEST_F(CudaDriverTest, LeavesTheCallersCurrentContextAlone) {
  std::thread t([&] {
    EXPECT_EQ(vmm::cuda_current_device(*driver_), -1);
    for (int d = 0; d < device_count_; ++d) {
      GVM_EXPECT_OK(driver_->stream_synchronize(d, nullptr));
      EXPECT_EQ(vmm::cuda_current_device(*driver_), -1) << "after a call on device " << d;
    }
  });
  t.join();
}

// Primary contexts are retained lazily from many threads at once.
TEST_F(CudaDriverTest, StreamsAndEventsFromManyThreads) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        int d = (t + i) % device_count_;
        vmm::StreamHandle s = nullptr;
        vmm::EventHandle e = nullptr;
        bool good = driver_->stream_create(d, &s) == Result::success &&
                    driver_->event_create(d, &e) == Result::success &&
                    driver_->event_record(d, e, s) == Result::success &&
                    driver_->stream_wait_event(d, nullptr, e) == Result::success &&
                    driver_->event_synchronize(e) == Result::success &&
                    driver_->event_query(e) == Result::success &&
                    driver_->stream_synchronize(d, s) == Result::success;
        if (e != nullptr && driver_->event_destroy(e) != Result::success) good = false;
        if (s != nullptr && driver_->stream_destroy(d, s) != Result::success) good = false;
        if (!good) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// An event made on one thread is queried and destroyed on another that has
// no current context (the allocator's fence does exactly this).
TEST_F(CudaDriverTest, EventsWorkFromAThreadWithoutContext) {
  const int d = device_count_ - 1;
  vmm::EventHandle e = nullptr;
  GVM_ASSERT_OK(driver_->event_create(d, &e));
  GVM_ASSERT_OK(driver_->event_record(d, e, nullptr));
  std::thread t([&] {
    GVM_EXPECT_OK(driver_->event_synchronize(e));
    GVM_EXPECT_OK(driver_->event_query(e));
    GVM_EXPECT_OK(driver_->event_destroy(e));
  });
  t.join();
}

TEST_F(CudaDriverTest, EventQueryReportsPendingWork) {
  TestKernels k;
  GVM_ASSERT_OK(k.load(*driver_, 0));
  constexpr std::size_t kWords = std::size_t{16} << 20;  // 64 MiB
  DevicePtr buf = 0, sink = 0;
  GVM_ASSERT_OK(driver_->mem_alloc(0, kWords * 4, &buf));
  GVM_ASSERT_OK(driver_->mem_alloc(0, 4, &sink));
  vmm::StreamHandle s = nullptr;
  GVM_ASSERT_OK(driver_->stream_create(0, &s));
  GVM_ASSERT_OK(k.fill(s, buf, 1, kWords));
  std::uint64_t iterations = 0;
  GVM_ASSERT_OK(k.calibrate_spin(s, buf, kWords, 0.3, &iterations));
  vmm::Event done(*driver_, 0);
  GVM_ASSERT_OK(k.spin_read(s, buf, kWords, iterations, sink));
  GVM_ASSERT_OK(done.record(s));
  EXPECT_EQ(done.query(), Result::not_ready) << "a 0.3 s kernel finished at once";
  GVM_EXPECT_OK(done.synchronize());
  GVM_EXPECT_OK(done.query());
  GVM_EXPECT_OK(driver_->stream_destroy(0, s));
  GVM_EXPECT_OK(driver_->mem_free(0, buf));
  GVM_EXPECT_OK(driver_->mem_free(0, sink));
}

TEST_F(CudaDriverTest, VmmReserveCreateMapAccessRoundTrip) {
  for (int d = 0; d < device_count_; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    int vmm = 0;
    GVM_ASSERT_OK(driver_->device_attribute(d, DeviceAttribute::vmm_supported, &vmm));
    if (vmm == 0) {
      std::cout << "device " << d << " has no VMM: round trip not run" << std::endl;
      continue;
    }
    std::size_t g = 0;
    GVM_ASSERT_OK(driver_->allocation_granularity(d, GranularityKind::minimum, &g));
    // 1 TiB of address space reserves in microseconds (docs/measurements.md, "Driver calls").
    vmm::ReservedRange range(*driver_, std::size_t{1} << 40, g);
    ASSERT_FALSE(range.empty());
    EXPECT_EQ(range.base() % g, 0u);
    {
      vmm::MappedChunk chunk(*driver_, d, range.base() + 3 * g, 2 * g, {{d, Access::read_write}});
      Access a = Access::none;
      GVM_ASSERT_OK(driver_->mem_get_access(range.base() + 3 * g, d, &a));
      EXPECT_EQ(a, Access::read_write);
      // The mapped bytes are usable: write and read them back.
      std::vector<unsigned char> out(g, 0xcd), in(g, 0);
      GVM_ASSERT_OK(driver_->memcpy_htod(d, range.base() + 4 * g, out.data(), g));
      GVM_ASSERT_OK(driver_->memcpy_dtoh(d, in.data(), range.base() + 4 * g, g));
      EXPECT_EQ(in, out);
      GVM_ASSERT_OK(chunk.reset());
    }
    GVM_EXPECT_OK(range.reset());
  }
}

TEST_F(CudaDriverTest, OversizedCreateIsOutOfMemoryAndTheDeviceStillWorks) {
  int vmm = 0;
  GVM_ASSERT_OK(driver_->device_attribute(0, DeviceAttribute::vmm_supported, &vmm));
  if (vmm == 0) GTEST_SKIP() << "device 0 has no VMM";
  std::size_t g = 0, total = 0;
  GVM_ASSERT_OK(driver_->allocation_granularity(0, GranularityKind::minimum, &g));
  GVM_ASSERT_OK(driver_->device_total_memory(0, &total));
  vmm::PhysHandle h = 0;
  const std::size_t too_big = (2 * total + g - 1) / g * g;
  // The allocator's OOM path (fence, release the cache, retry) keys on this.
  const Result r = driver_->mem_create(0, too_big, ShareableHandleType::none, &h);
  EXPECT_EQ(r, Result::out_of_memory) << vmm::result_name(r);
  GVM_ASSERT_OK(driver_->mem_create(0, g, ShareableHandleType::none, &h));
  GVM_EXPECT_OK(driver_->mem_release(h));
}

TEST_F(CudaDriverTest, GlobalPeerAccessTogglesWithTheDriversResults) {
  require_peer_pair();
  if (IsSkipped()) return;
  // Nothing is in flight here: this is the fenced toggle.
  Result first = driver_->enable_peer_access(1, 0);
  ASSERT_TRUE(first == Result::success || first == Result::peer_access_already_enabled)
      << vmm::result_name(first);
  EXPECT_EQ(driver_->enable_peer_access(1, 0), Result::peer_access_already_enabled);
  GVM_EXPECT_OK(driver_->disable_peer_access(1, 0));
  EXPECT_EQ(driver_->disable_peer_access(1, 0), Result::peer_access_not_enabled);
  GVM_EXPECT_OK(driver_->ctx_synchronize(1));
}

TEST_F(CudaDriverTest, PeerCopyMovesTheBytes) {
  require_peer_pair();
  if (IsSkipped()) return;
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  DevicePtr a = 0, b = 0;
  GVM_ASSERT_OK(driver_->mem_alloc(0, kBytes, &a));
  GVM_ASSERT_OK(driver_->mem_alloc(1, kBytes, &b));
  vmm::StreamHandle s = nullptr;
  GVM_ASSERT_OK(driver_->stream_create(0, &s));
  GVM_ASSERT_OK(driver_->memset_d8_async(0, a, 0x3c, kBytes, s));
  GVM_ASSERT_OK(driver_->memcpy_peer_async(b, 1, a, 0, kBytes, s));
  GVM_ASSERT_OK(driver_->stream_synchronize(0, s));
  std::vector<unsigned char> host(kBytes, 0);
  GVM_ASSERT_OK(driver_->memcpy_dtoh(1, host.data(), b, kBytes));
  EXPECT_EQ(host, std::vector<unsigned char>(kBytes, 0x3c));
  GVM_EXPECT_OK(driver_->stream_destroy(0, s));
  GVM_EXPECT_OK(driver_->mem_free(0, a));
  GVM_EXPECT_OK(driver_->mem_free(1, b));
}

}  // namespace
}  // namespace gvm::test
