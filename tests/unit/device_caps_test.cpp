// read_device_caps / read_all_device_caps over SimDriver: every field comes
// from the driver, and a failing call is named in the error.
#include "gvm/vmm/device_caps.hpp"

#include <string>

#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

// Expects read_device_caps(0) to throw DriverError with `result`, naming `text`.
void expect_caps_error(SimDriver& sim, Result result, const std::string& text) {
  try {
    vmm::read_device_caps(sim, 0);
    ADD_FAILURE() << "no DriverError; expected one naming " << text;
  } catch (const vmm::DriverError& e) {
    EXPECT_EQ(e.result(), result);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(DeviceCaps, FollowsWhatTheDriverSays) {
  vmm::DeviceProfile a = vmm::profile(Profile::a100);
  vmm::DeviceProfile b = vmm::profile(Profile::p40);
  b.posix_fd_handles = false;
  b.recommended_granularity = b.granularity * 2;
  SimDriver sim({a, b, a});
  sim.set_peer(1, 2, false);
  std::vector<vmm::DeviceCaps> caps = vmm::read_all_device_caps(sim);
  ASSERT_EQ(caps.size(), 3u);
  EXPECT_EQ(caps[1].device, 1);
  EXPECT_EQ(caps[1].name, b.name);
  EXPECT_EQ(caps[1].compute_capability(), b.cc_major * 10 + b.cc_minor);
  EXPECT_FALSE(caps[1].posix_fd_handles);
  EXPECT_EQ(caps[1].recommended_granularity, 2 * caps[1].granularity);
  EXPECT_EQ(caps[0].can_access_peer, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(caps[1].can_access_peer, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(caps[2].can_access_peer, (std::vector<bool>{true, true, false}));
}

TEST(DeviceCaps, AFailingCallIsNamed) {
  auto sim = SimDriver::uniform(Profile::h200, 2);
  sim->fail_call(Call::device_name, 1, Result::unknown);
  expect_caps_error(*sim, Result::unknown, "cuDeviceGetName(device 0)");
  sim->fail_call(Call::device_attribute, 3, Result::not_permitted);  // the third attribute read
  expect_caps_error(*sim, Result::not_permitted, "cuDeviceGetAttribute(device 0, vmm_supported)");
  sim->fail_call(Call::allocation_granularity, 2, Result::unknown);
  expect_caps_error(*sim, Result::unknown, "cuMemGetAllocationGranularity(device 0, recommended)");
  sim->fail_call(Call::device_total_memory, 1, Result::unknown);
  expect_caps_error(*sim, Result::unknown, "cuDeviceTotalMem(device 0)");
  sim->fail_call(Call::can_access_peer, 1, Result::unknown);
  expect_caps_error(*sim, Result::unknown, "cuDeviceCanAccessPeer(device 0, peer 1)");
  sim->fail_call(Call::device_count, 1, Result::not_initialized);
  EXPECT_THROW(vmm::read_all_device_caps(*sim), vmm::DriverError);
  EXPECT_EQ(vmm::read_all_device_caps(*sim).size(), 2u) << "the faults are spent";
}

TEST(DeviceCaps, NoVmmMeansNoGranularityQuery) {
  vmm::DeviceProfile d = vmm::profile(Profile::v100);
  d.vmm = false;
  SimDriver sim({d});
  vmm::DeviceCaps c = vmm::read_device_caps(sim, 0);
  EXPECT_FALSE(c.vmm);
  EXPECT_EQ(c.granularity, 0u);
  EXPECT_EQ(sim.call_count(Call::allocation_granularity), 0u);
}

TEST(DeviceCaps, NoDeviceIsNoDevice) {
  auto sim = SimDriver::uniform(Profile::h100, 0);
  try {
    vmm::read_all_device_caps(*sim);
    ADD_FAILURE() << "no DriverError with no device";
  } catch (const vmm::DriverError& e) {
    EXPECT_EQ(e.result(), Result::no_device);
  }
  EXPECT_THROW(vmm::read_device_caps(*sim, 0), vmm::DriverError);
}

}  // namespace
}  // namespace gvm::test
