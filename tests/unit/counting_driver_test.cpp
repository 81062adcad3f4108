// ForwardingDriver forwards every call to the driver it wraps; CountingDriver,
// over it, counts each one under its own name, with its time.
#include "gvm/vmm/counting_driver.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace gvm {
namespace {

// The tables name the types of gvm::vmm unqualified.
using namespace gvm::vmm;  // NOLINT(google-build-using-namespace)

// Records which entry point ran and with what first argument; returns
// `result`. Every entry point comes from the table.
class RecordingBase : public vmm::Driver {
 public:
  std::vector<Call> seen;
  long long last_arg = -1;
  Result result = Result::success;
  std::chrono::microseconds delay{0};
  bool record = true;

  const char* name() const noexcept override { return "recording"; }

#define GVM_RECORD(name, cu_name, params, args) \
  Result name params override {                 \
    return hit(Call::name, first_of args);      \
  }
  GVM_VMM_DRIVER_CALLS(GVM_RECORD)
#undef GVM_RECORD

 private:
  template <class T>
  static long long as_number(T v) {
    if constexpr (std::is_pointer_v<T>) {
      return static_cast<long long>(reinterpret_cast<std::intptr_t>(v));
    } else {
      return static_cast<long long>(v);
    }
  }
  template <class T, class... Rest>
  static long long first_of(T first, Rest&&...) {
    return as_number(first);
  }
  Result hit(Call c, long long arg) {
    if (!record) return result;
    seen.push_back(c);
    last_arg = arg;
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    return result;
  }
};

// Two entry points also write the outputs ArgumentsResultsAndOutputsPassThrough reads.
class RecordingDriver final : public RecordingBase {
 public:
  Result device_count(int* count) override {
    *count = 7;
    return RecordingBase::device_count(count);
  }
  Result device_name(int device, std::string* name) override {
    *name = "fake";
    return RecordingBase::device_name(device, name);
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
      {Call::mem_alloc,
       [](D& d) {
         vmm::DevicePtr x = 0;
         return d.mem_alloc(5, 0, &x);
       }},
      {Call::mem_free, [](D& d) { return d.mem_free(5, 0); }},
      {Call::stream_get_id,
       [](D& d) {
         std::uint64_t id = 0;
         return d.stream_get_id(5, nullptr, &id);
       }},
      {Call::stream_capture_status,
       [](D& d) {
         vmm::CaptureStatus st{};
         return d.stream_capture_status(5, nullptr, &st, nullptr);
       }},
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
  };
}

TEST(CountingDriver, EveryCallIsForwardedAndCountedUnderItsOwnName) {
  const auto calls = every_call();
  ASSERT_EQ(calls.size(), static_cast<std::size_t>(vmm::kCallCount))
      << "every_call() misses an entry point of the Driver interface";
  RecordingDriver inner;
  vmm::CountingDriver counting(inner);
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
  const vmm::CallCounts s = counting.snapshot();
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const auto c = static_cast<std::size_t>(calls[k].first);
    EXPECT_EQ(s.calls[c], k + 1) << vmm::call_name(calls[k].first);
  }
}

TEST(CountingDriver, ArgumentsResultsAndOutputsPassThrough) {
  RecordingDriver inner;
  vmm::CountingDriver counting(inner);
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
  vmm::CountingDriver counting(inner);
  ASSERT_EQ(counting.ctx_synchronize(0), Result::success);
  ASSERT_EQ(counting.ctx_synchronize(0), Result::success);
  const auto i = static_cast<std::size_t>(Call::ctx_synchronize);
  const vmm::CallCounts s = counting.snapshot();
  EXPECT_EQ(s.calls[i], 2u);
  // sleep_for sleeps at least as long as asked.
  EXPECT_GE(s.nanoseconds[i], 4'000'000u);
  EXPECT_EQ(s.total_nanoseconds(), s.nanoseconds[i]);
}

TEST(CountingDriver, CountsFromManyThreads) {
  RecordingDriver inner;
  inner.record = false;  // the inner driver then touches nothing shared
  vmm::CountingDriver counting(inner);
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

// A decorator that changes one entry point overrides only that one.
class FailingMap final : public vmm::ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;
  Result mem_map(vmm::DevicePtr addr, std::size_t size, vmm::PhysHandle handle) override {
    if (addr == 0xbad) return Result::out_of_memory;
    return ForwardingDriver::mem_map(addr, size, handle);
  }
};

TEST(ForwardingDriver, ADecoratorOverridesOnlyWhatItChanges) {
  RecordingDriver inner;
  FailingMap d(inner);
  EXPECT_STREQ(d.name(), "recording");
  for (const auto& [call, invoke] : every_call()) {
    SCOPED_TRACE(vmm::call_name(call));
    inner.seen.clear();
    ASSERT_EQ(invoke(d), Result::success);
    ASSERT_EQ(inner.seen.size(), 1u);
    EXPECT_EQ(inner.seen[0], call);
  }
  inner.seen.clear();
  EXPECT_EQ(d.mem_map(0xbad, 0, 0), Result::out_of_memory);
  EXPECT_TRUE(inner.seen.empty()) << "answered without forwarding";
  EXPECT_EQ(d.mem_map(0x1000, 0, 0), Result::success);
  EXPECT_EQ(inner.last_arg, 0x1000);
}

// intercept() sees every call and may answer instead of forwarding.
class Gate final : public vmm::ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;
  std::vector<Call> intercepted;
  Call closed = Call::count_;

 protected:
  Result intercept(Call call, vmm::ForwardedCall forward) override {
    intercepted.push_back(call);
    return call == closed ? Result::not_permitted : forward();
  }
};

TEST(ForwardingDriver, InterceptSeesEveryCallAndMayAnswerItself) {
  RecordingDriver inner;
  Gate d(inner);
  d.closed = Call::event_query;
  for (const auto& [call, invoke] : every_call()) {
    SCOPED_TRACE(vmm::call_name(call));
    inner.seen.clear();
    d.intercepted.clear();
    const Result r = invoke(d);
    ASSERT_EQ(d.intercepted.size(), 1u);
    EXPECT_EQ(d.intercepted[0], call);
    if (call == Call::event_query) {
      EXPECT_EQ(r, Result::not_permitted);
      EXPECT_TRUE(inner.seen.empty());
    } else {
      EXPECT_EQ(r, Result::success);
      EXPECT_EQ(inner.seen.size(), 1u);
    }
  }
}

}  // namespace
}  // namespace gvm
