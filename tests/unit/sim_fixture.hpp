// A SimDriver test fixture: two simulated devices and short helpers that
// assert each driver call succeeds.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

using vmm::Access;
using vmm::AccessKind;
using vmm::Call;
using vmm::DevicePtr;
using vmm::PhysHandle;
using vmm::Profile;
using vmm::Result;
using vmm::SimDriver;

class SimTest : public ::testing::Test {
 protected:
  explicit SimTest(Profile p = Profile::h200, int devices = 2)
      : sim_(SimDriver::uniform(p, devices)), g_(vmm::profile(p).granularity) {}

  SimDriver& sim() { return *sim_; }

  DevicePtr reserve(std::size_t bytes) {
    DevicePtr p = 0;
    EXPECT_EQ(sim_->address_reserve(bytes, 0, &p), Result::success);
    return p;
  }
  PhysHandle create(int device, std::size_t bytes) {
    PhysHandle h = 0;
    EXPECT_EQ(sim_->mem_create(device, bytes, vmm::ShareableHandleType::none, &h), Result::success);
    return h;
  }
  // Creates a chunk on `device`, maps it at `at` and sets `access`.
  PhysHandle map(DevicePtr at, int device, std::size_t bytes, std::vector<vmm::AccessDesc> access) {
    PhysHandle h = create(device, bytes);
    EXPECT_EQ(sim_->mem_map(at, bytes, h), Result::success);
    if (!access.empty()) {
      EXPECT_EQ(sim_->mem_set_access(at, bytes, access.data(), access.size()), Result::success);
    }
    return h;
  }
  vmm::StreamHandle stream(int device) {
    vmm::StreamHandle s = nullptr;
    EXPECT_EQ(sim_->stream_create(device, &s), Result::success);
    return s;
  }
  vmm::EventHandle event(int device) {
    vmm::EventHandle e = nullptr;
    EXPECT_EQ(sim_->event_create(device, &e), Result::success);
    return e;
  }
  Result set_access(DevicePtr at, std::size_t bytes, std::vector<vmm::AccessDesc> access) {
    return sim_->mem_set_access(at, bytes, access.data(), access.size());
  }

  std::unique_ptr<SimDriver> sim_;
  std::size_t g_;  // granularity
};

}  // namespace gvm::test
