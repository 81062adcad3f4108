// The shared DriverSuite over SimDriver: two devices of the binary's profile
// (suite_profile.cpp), with backing so that data round trips are checked. The
// P40 binary also runs it on a device without VMM (the cuMemAlloc fallback).
#include <memory>
#include <string>
#include <vector>

#include "common/driver_suite.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

extern const vmm::Profile kSuiteProfile;

namespace {

std::unique_ptr<vmm::TestDriver> make_sim(std::vector<vmm::DeviceProfile> devices) {
  auto d = std::make_unique<vmm::SimDriver>(std::move(devices));
  d->enable_backing(true);
  return d;
}

std::vector<DriverFactory> sim_factories() {
  const vmm::Profile p = kSuiteProfile;
  std::vector<DriverFactory> v;
  v.push_back({std::string(vmm::profile_name(p)) + "_x2", [p](std::string*) {
                 return make_sim({vmm::profile(p), vmm::profile(p)});
               }});
  if (p == vmm::Profile::p40) {
    v.push_back({"p40_no_vmm_x2", [](std::string*) {
                   vmm::DeviceProfile d = vmm::profile(vmm::Profile::p40);
                   d.vmm = false;
                   return make_sim({d, d});
                 }});
  }
  return v;
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Sim, DriverSuite, ::testing::ValuesIn(sim_factories()), factory_name);

}  // namespace gvm::test
