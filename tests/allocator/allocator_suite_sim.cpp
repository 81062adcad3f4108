// The shared AllocatorSuite over SimDriver: two devices of the binary's
// profile (suite_profile.cpp), each as
//   <profile>              the default config, the device's full memory
//   <profile>_tiny         a 64 MiB device and 2 MiB chunks, so that OOM,
//                          release and trim paths run in milliseconds
//   <profile>_no_vmm_tiny  the same through the cuMemAlloc fallback
//                          (Config::force_no_vmm)
// and the P40 binary also on a device whose driver has no VMM at all.
#include <memory>
#include <string>
#include <vector>

#include "allocator_suite.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

extern const vmm::Profile kSuiteProfile;

namespace {

// What SimTiny stands for (tiny configs, so that out-of-memory and eviction paths run in milliseconds).
constexpr std::size_t kTinyBudget = 64 * kMiB;
constexpr std::size_t kTinyChunk = 2 * kMiB;

std::unique_ptr<vmm::TestDriver> make_sim(const vmm::DeviceProfile& d, std::size_t budget) {
  auto sim = std::make_unique<vmm::SimDriver>(std::vector<vmm::DeviceProfile>{d, d});
  sim->enable_backing(true);
  if (budget != 0)
    for (int i = 0; i < 2; ++i) sim->set_physical_budget(i, budget);
  return sim;
}

AllocatorTarget sim_target(std::string name, vmm::DeviceProfile d, bool tiny, Config c) {
  if (tiny) c.max_chunk_bytes = kTinyChunk;
  const std::size_t budget = tiny ? kTinyBudget : d.memory_bytes;
  AllocatorTarget t;
  t.name = std::move(name);
  t.make = [d, tiny](std::string*) { return make_sim(d, tiny ? kTinyBudget : 0); };
  t.config = c;
  t.budget = budget;
  // Eight threads for a second per target would be most of the suite's time
  // across every profile; the full-size default config gets the second.
  t.threaded_time = std::chrono::milliseconds(tiny ? 250 : 1000);
  return t;
}

std::vector<AllocatorTarget> sim_targets() {
  const vmm::Profile p = kSuiteProfile;
  const std::string name = vmm::profile_name(p);
  const vmm::DeviceProfile d = vmm::profile(p);
  Config no_vmm;
  no_vmm.force_no_vmm = true;
  std::vector<AllocatorTarget> v = {
      sim_target(name, d, false, Config{}),
      sim_target(name + "_tiny", d, true, Config{}),
      sim_target(name + "_no_vmm_tiny", d, true, no_vmm),
  };
  if (p == vmm::Profile::p40) {
    vmm::DeviceProfile old = d;
    old.vmm = false;  // an old driver, or a vGPU without VMM
    v.push_back(sim_target(name + "_driver_without_vmm", old, false, Config{}));
    v.push_back(sim_target(name + "_driver_without_vmm_tiny", old, true, Config{}));
  }
  return v;
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Sim, AllocatorSuite, ::testing::ValuesIn(sim_targets()), target_name);

}  // namespace gvm::test
