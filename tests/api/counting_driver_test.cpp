// CountingDriver forwards every call to the driver it wraps and counts each
// one under its own name, with its time.
#include "counting_driver.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace gvm {
namespace {

using vmm::Call;
using vmm::Result;

// Records which entry point ran and with what first argument; returns `result`.
class RecordingDriver final : public vmm::Driver {
 public:
  std::vector<Call> seen;
  long long last_arg = -1;
  Result result = Result::success;
  std::chrono::microseconds delay{0};
  bool record = true;

  const char* name() const noexcept override { return "recording"; }

  Result device_count(int* count) override {
    *count = 7;
    return hit(Call::device_count, 0);
  }
  Result device_name(int device, std::string* name) override {
    *name = "fake";
    return hit(Call::device_name, device);
  }
  Result device_attribute(int device, vmm::DeviceAttribute, int* value) override {
    *value = 90;
    return hit(Call::device_attribute, device);
  }
  Result device_total_memory(int device, std::size_t*) override {
    return hit(Call::device_total_memory, device);
  }
  Result mem_get_info(int device, std::size_t*, std::size_t*) override {
    return hit(Call::mem_get_info, device);
  }
  Result allocation_granularity(int device, vmm::GranularityKind, std::size_t*) override {
    return hit(Call::allocation_granularity, device);
  }
  Result can_access_peer(int device, int, bool*) override {
    return hit(Call::can_access_peer, device);
  }
  Result ctx_synchronize(int device) override { return hit(Call::ctx_synchronize, device); }
  Result enable_peer_access(int device, int) override {
    return hit(Call::enable_peer_access, device);
  }
  Result disable_peer_access(int device, int) override {
    return hit(Call::disable_peer_access, device);
  }
  Result address_reserve(std::size_t size, std::size_t, vmm::DevicePtr*) override {
    return hit(Call::address_reserve, static_cast<long long>(size));
  }
  Result address_free(vmm::DevicePtr addr, std::size_t) override {
    return hit(Call::address_free, static_cast<long long>(addr));
  }
  Result mem_create(int device, std::size_t, vmm::ShareableHandleType, vmm::PhysHandle*) override {
    return hit(Call::mem_create, device);
  }
  Result mem_release(vmm::PhysHandle handle) override {
    return hit(Call::mem_release, static_cast<long long>(handle));
  }
  Result mem_map(vmm::DevicePtr addr, std::size_t, vmm::PhysHandle) override {
    return hit(Call::mem_map, static_cast<long long>(addr));
  }
  Result mem_unmap(vmm::DevicePtr addr, std::size_t) override {
    return hit(Call::mem_unmap, static_cast<long long>(addr));
  }
  Result mem_set_access(vmm::DevicePtr addr, std::size_t, const vmm::AccessDesc*,
                        std::size_t) override {
    return hit(Call::mem_set_access, static_cast<long long>(addr));
  }
  Result mem_get_access(vmm::DevicePtr addr, int, vmm::Access*) override {
    return hit(Call::mem_get_access, static_cast<long long>(addr));
  }
  Result export_shareable_handle(vmm::PhysHandle handle, vmm::ShareableHandleType, void*) override {
    return hit(Call::export_shareable_handle, static_cast<long long>(handle));
  }
  Result import_shareable_handle(void*, vmm::ShareableHandleType type, vmm::PhysHandle*) override {
    return hit(Call::import_shareable_handle, static_cast<long long>(type));
  }
  Result mem_alloc(int device, std::size_t, vmm::DevicePtr*) override {
    return hit(Call::mem_alloc, device);
  }
  Result mem_free(int device, vmm::DevicePtr) override { return hit(Call::mem_free, device); }
  Result stream_create(int device, vmm::StreamHandle*) override {
    return hit(Call::stream_create, device);
  }
  Result stream_destroy(int device, vmm::StreamHandle) override {
    return hit(Call::stream_destroy, device);
  }
  Result stream_synchronize(int device, vmm::StreamHandle) override {
    return hit(Call::stream_synchronize, device);
  }
  Result stream_wait_event(int device, vmm::StreamHandle, vmm::EventHandle) override {
    return hit(Call::stream_wait_event, device);
  }
  Result event_create(int device, vmm::EventHandle*) override {
    return hit(Call::event_create, device);
  }
  Result event_destroy(vmm::EventHandle) override { return hit(Call::event_destroy, 0); }
  Result event_record(int device, vmm::EventHandle, vmm::StreamHandle) override {
    return hit(Call::event_record, device);
  }
  Result event_query(vmm::EventHandle) override { return hit(Call::event_query, 0); }
  Result event_synchronize(vmm::EventHandle) override { return hit(Call::event_synchronize, 0); }
  Result memcpy_async(int device, vmm::DevicePtr, vmm::DevicePtr, std::size_t,
                      vmm::StreamHandle) override {
    return hit(Call::memcpy_async, device);
  }
  Result memcpy_peer_async(vmm::DevicePtr dst, int, vmm::DevicePtr, int, std::size_t,
                           vmm::StreamHandle) override {
    return hit(Call::memcpy_peer_async, static_cast<long long>(dst));
  }
  Result memcpy_htod(int device, vmm::DevicePtr, const void*, std::size_t) override {
    return hit(Call::memcpy_htod, device);
  }
  Result memcpy_dtoh(int device, void*, vmm::DevicePtr, std::size_t) override {
    return hit(Call::memcpy_dtoh, device);
  }
  Result memset_d8_async(int device, vmm::DevicePtr, unsigned char, std::size_t,
                         vmm::StreamHandle) override {
    return hit(Call::memset_d8_async, device);
  }
  Result module_load_data(int device, const char*, vmm::ModuleHandle*) override {
    return hit(Call::module_load_data, device);
  }
  Result module_unload(int device, vmm::ModuleHandle) override {
    return hit(Call::module_unload, device);
  }
  Result module_get_function(vmm::ModuleHandle, const char*, vmm::FunctionHandle*) override {
    return hit(Call::module_get_function, 0);
  }
  Result launch_kernel(int device, vmm::FunctionHandle, unsigned, unsigned, vmm::StreamHandle,
                       void**) override {
    return hit(Call::launch_kernel, device);
  }

 private:
  Result hit(Call c, long long arg) {
    if (!record) return result;
    seen.push_back(c);
    last_arg = arg;
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    return result;
  }
};

// One invocation of every entry point, by Call, with the first argument 5.
std::vector<std::pair<Call, std::function<Result(vmm::Driver&)>>> every_call() {
  using D = vmm::Driver;
  return {
      {Call::device_count,
       [](D& d) {
         int n = 0;
         return d.device_count(&n);
       }},
      {Call::device_name,
       [](D& d) {
         std::string n;
         return d.device_name(5, &n);
       }},
      {Call::device_attribute,
       [](D& d) {
         int x = 0;
         return d.device_attribute(5, vmm::DeviceAttribute::vmm_supported, &x);
       }},
      {Call::device_total_memory,
       [](D& d) {
         std::size_t x = 0;
         return d.device_total_memory(5, &x);
       }},
      {Call::mem_get_info,
       [](D& d) {
         std::size_t f = 0, t = 0;
         return d.mem_get_info(5, &f, &t);
       }},
      {Call::allocation_granularity,
       [](D& d) {
         std::size_t x = 0;
         return d.allocation_granularity(5, vmm::GranularityKind::minimum, &x);
       }},
      {Call::can_access_peer,
       [](D& d) {
         bool x = false;
         return d.can_access_peer(5, 0, &x);
       }},
      {Call::ctx_synchronize, [](D& d) { return d.ctx_synchronize(5); }},
      {Call::enable_peer_access, [](D& d) { return d.enable_peer_access(5, 0); }},
      {Call::disable_peer_access, [](D& d) { return d.disable_peer_access(5, 0); }},
      {Call::address_reserve,
       [](D& d) {
         vmm::DevicePtr x = 0;
         return d.address_reserve(5, 0, &x);
       }},
      {Call::address_free, [](D& d) { return d.address_free(5, 0); }},
      {Call::mem_create,
       [](D& d) {
         vmm::PhysHandle x = 0;
         return d.mem_create(5, 0, vmm::ShareableHandleType::none, &x);
       }},
      {Call::mem_release, [](D& d) { return d.mem_release(5); }},
      {Call::mem_map, [](D& d) { return d.mem_map(5, 0, 0); }},
      {Call::mem_unmap, [](D& d) { return d.mem_unmap(5, 0); }},
      {Call::mem_set_access, [](D& d) { return d.mem_set_access(5, 0, nullptr, 0); }},
      {Call::mem_get_access,
       [](D& d) {
         vmm::Access x{};
         return d.mem_get_access(5, 0, &x);
       }},
      {Call::export_shareable_handle,
       [](D& d) {
         int fd = 0;
         return d.export_shareable_handle(5, vmm::ShareableHandleType::posix_fd, &fd);
       }},
      {Call::import_shareable_handle,
       [](D& d) {
         vmm::PhysHandle x = 0;
         return d.import_shareable_handle(nullptr, static_cast<vmm::ShareableHandleType>(5), &x);
       }},
      {Call::mem_alloc,
       [](D& d) {
         vmm::DevicePtr x = 0;
         return d.mem_alloc(5, 0, &x);
       }},
      {Call::mem_free, [](D& d) { return d.mem_free(5, 0); }},
      {Call::stream_create,
       [](D& d) {
         vmm::StreamHandle x = nullptr;
         return d.stream_create(5, &x);
       }},
      {Call::stream_destroy, [](D& d) { return d.stream_destroy(5, nullptr); }},
      {Call::stream_synchronize, [](D& d) { return d.stream_synchronize(5, nullptr); }},
      {Call::stream_wait_event, [](D& d) { return d.stream_wait_event(5, nullptr, nullptr); }},
      {Call::event_create,
       [](D& d) {
         vmm::EventHandle x = nullptr;
         return d.event_create(5, &x);
       }},
      {Call::event_destroy, [](D& d) { return d.event_destroy(nullptr); }},
      {Call::event_record, [](D& d) { return d.event_record(5, nullptr, nullptr); }},
      {Call::event_query, [](D& d) { return d.event_query(nullptr); }},
      {Call::event_synchronize, [](D& d) { return d.event_synchronize(nullptr); }},
      {Call::memcpy_async, [](D& d) { return d.memcpy_async(5, 0, 0, 0, nullptr); }},
      {Call::memcpy_peer_async, [](D& d) { return d.memcpy_peer_async(5, 0, 0, 1, 0, nullptr); }},
      {Call::memcpy_htod, [](D& d) { return d.memcpy_htod(5, 0, nullptr, 0); }},
      {Call::memcpy_dtoh, [](D& d) { return d.memcpy_dtoh(5, nullptr, 0, 0); }},
      {Call::memset_d8_async, [](D& d) { return d.memset_d8_async(5, 0, 0, 0, nullptr); }},
      {Call::module_load_data,
       [](D& d) {
         vmm::ModuleHandle x = nullptr;
         return d.module_load_data(5, "", &x);
       }},
      {Call::module_unload, [](D& d) { return d.module_unload(5, nullptr); }},
      {Call::module_get_function,
       [](D& d) {
         vmm::FunctionHandle x = nullptr;
         return d.module_get_function(nullptr, "k", &x);
       }},
      {Call::launch_kernel,
       [](D& d) { return d.launch_kernel(5, nullptr, 1, 1, nullptr, nullptr); }},
  };
}

TEST(CountingDriver, EveryCallIsForwardedAndCountedUnderItsOwnName) {
  const auto calls = every_call();
  ASSERT_EQ(calls.size(), static_cast<std::size_t>(vmm::kCallCount))
      << "every_call() misses an entry point of the Driver interface";
  RecordingDriver inner;
  detail::CountingDriver counting(inner);
  EXPECT_STREQ(counting.name(), "recording");
  EXPECT_EQ(&counting.inner(), &inner);
  EXPECT_EQ(counting.snapshot().total_calls(), 0u);

  for (std::size_t k = 0; k < calls.size(); ++k) {
    const auto& [call, invoke] = calls[k];
    SCOPED_TRACE(vmm::call_name(call));
    // Call k runs k+1 times, so a forwarder counted under the wrong name shows.
    for (std::size_t n = 0; n <= k; ++n) {
      inner.seen.clear();
      ASSERT_EQ(invoke(counting), Result::success);
      ASSERT_EQ(inner.seen.size(), 1u);
      EXPECT_EQ(inner.seen[0], call);
    }
  }
  const DriverCallStats s = counting.snapshot();
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const auto c = static_cast<std::size_t>(calls[k].first);
    EXPECT_EQ(s.calls[c], k + 1) << vmm::call_name(calls[k].first);
  }
}

TEST(CountingDriver, ArgumentsResultsAndOutputsPassThrough) {
  RecordingDriver inner;
  detail::CountingDriver counting(inner);
  int n = 0;
  EXPECT_EQ(counting.device_count(&n), Result::success);
  EXPECT_EQ(n, 7);
  std::string name;
  EXPECT_EQ(counting.device_name(3, &name), Result::success);
  EXPECT_EQ(name, "fake");
  EXPECT_EQ(inner.last_arg, 3);
  EXPECT_EQ(counting.mem_map(0x2000000, 0, 0), Result::success);
  EXPECT_EQ(inner.last_arg, 0x2000000);

  // A failing call is returned unchanged and still counted.
  inner.result = Result::out_of_memory;
  vmm::PhysHandle h = 0;
  EXPECT_EQ(counting.mem_create(1, 2 << 20, vmm::ShareableHandleType::none, &h),
            Result::out_of_memory);
  EXPECT_EQ(counting.snapshot().calls[static_cast<std::size_t>(Call::mem_create)], 1u);
}

TEST(CountingDriver, TimeIsMeasured) {
  RecordingDriver inner;
  inner.delay = std::chrono::milliseconds(2);
  detail::CountingDriver counting(inner);
  ASSERT_EQ(counting.ctx_synchronize(0), Result::success);
  ASSERT_EQ(counting.ctx_synchronize(0), Result::success);
  const auto i = static_cast<std::size_t>(Call::ctx_synchronize);
  const DriverCallStats s = counting.snapshot();
  EXPECT_EQ(s.calls[i], 2u);
  // sleep_for sleeps at least as long as asked.
  EXPECT_GE(s.nanoseconds[i], 4'000'000u);
  EXPECT_EQ(s.total_nanoseconds(), s.nanoseconds[i]);
}

TEST(CountingDriver, CountsFromManyThreads) {
  RecordingDriver inner;
  inner.record = false;  // the inner driver then touches nothing shared
  detail::CountingDriver counting(inner);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&counting] {
      for (int n = 0; n < kPerThread; ++n) (void)counting.event_query(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counting.snapshot().calls[static_cast<std::size_t>(Call::event_query)],
            static_cast<std::uint64_t>(kThreads) * kPerThread);
  EXPECT_EQ(counting.snapshot().total_calls(), static_cast<std::uint64_t>(kThreads) * kPerThread);
}

}  // namespace
}  // namespace gvm
