// The fixture of the allocator's tests on a simulated driver: simulated
// H200s, one gvm::Allocator made by the test (make), the streams it asks for
// (new_stream), and the checks every such test uses. Each test file derives
// its own fixture from this one and adds what only it needs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

class SimAllocatorFixture : public ::testing::Test {
 protected:
  explicit SimAllocatorFixture(int devices = 1)
      : sim_(vmm::SimDriver::uniform(vmm::Profile::h200, devices)) {}
  ~SimAllocatorFixture() override {
    alloc_.reset();  // before its streams go
    for (vmm::StreamHandle s : streams_) (void)sim_->stream_destroy(0, s);
  }

  // A fresh allocator with `c` (the one before it destroyed first).
  Allocator& make(Config c = {}) {
    alloc_.reset();
    alloc_ = std::make_unique<Allocator>(*sim_, c);
    return *alloc_;
  }
  // A new stream of device 0, destroyed with the fixture.
  vmm::StreamHandle new_stream() {
    vmm::StreamHandle s = nullptr;
    EXPECT_EQ(sim_->stream_create(0, &s), vmm::Result::success);
    streams_.push_back(s);
    return s;
  }
  DeviceStats stats() const { return alloc_->device_stats(0); }
  // How often the simulated driver was asked for `c` so far.
  std::uint64_t calls(vmm::Call c) const { return sim_->call_count(c); }
  // What the allocator counts as reserved is what device 0 holds.
  ::testing::AssertionResult device_holds_reserved() const {
    const std::size_t held = sim_->physical_used(0), reserved = stats().reserved_bytes;
    if (held == reserved) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the device holds " << held << " bytes, the allocator reserves " << reserved;
  }
  // The allocator's invariant checker, with its reason on failure.
  ::testing::AssertionResult invariants() const {
    std::string why;
    if (alloc_->check_invariants(&why)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << why;
  }

  std::unique_ptr<vmm::SimDriver> sim_;
  std::unique_ptr<Allocator> alloc_;
  std::vector<vmm::StreamHandle> streams_;
};

}  // namespace gvm::test
