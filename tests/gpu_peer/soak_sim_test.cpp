// The soak (soak.hpp) on the simulated driver, scaled down: proves here,
// without a GPU, that it drives the allocator correctly (threads, streams,
// peer scratch, trims, policy switches, the cap) and that it can fail:
// without the fence, a switch or trim under queued peer work kills the
// simulated context and the soak says so.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "device_kernels.hpp"
#include "soak.hpp"

namespace gvm::test {
namespace {

using vmm::Profile;
using vmm::SimDriver;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;

SoakOptions small_soak() {
  SoakOptions o;
  o.seconds = 2.0;
  o.threads_per_device = 2;
  o.max_held = 12;
  o.small_max = 64 * kKiB;
  o.large_max = 2 * kMiB;
  o.huge_min = 8 * kMiB;
  o.huge_max = 24 * kMiB;
  o.scratch_max = kMiB;
  o.reserved_cap = 32 * kMiB;
  o.control_pause_ms = 10;
  o.config.scratch_chunk_bytes = 2 * kMiB;
  return o;
}

TEST(SoakSim, EverythingAtOnceIsCleanAndGivesEverythingBack) {
  SimPair p;
  const SoakOptions o = small_soak();
  const SoakReport r = run_soak(*p.sim, *p.kernels, o);
  std::cout << to_string(r);
  SCOPED_TRACE(to_string(r));
  std::string why;
  EXPECT_TRUE(soak_passed(r, o, &why)) << why;
  EXPECT_GT(r.allocations, 100u);
  EXPECT_GT(r.out_of_memory, 0u) << "the cap was never hit";
  EXPECT_GT(r.cross_stream_frees, 0u);
  EXPECT_GT(r.direct_copies, 0u);
  EXPECT_GT(r.staged_copies, 0u);
  EXPECT_GT(r.policy_switches, 2u);
  EXPECT_GT(r.trims, 2u);
  EXPECT_GT(r.control_checks, 0u);
  // Races between the soak's own streams (stand-in kernels move their data on
  // the legacy stream, which races by construction: left out).
  std::vector<std::string> races;
  for (const auto& s : p.sim->races())
    if (s.find("legacy stream") == std::string::npos) races.push_back(s);
  EXPECT_TRUE(races.empty()) << races.size() << " races, first: " << races.front();
}

TEST(SoakSim, WithoutTheFenceTheSoakFails) {
  SimPair p;
  SoakOptions o = small_soak();
  o.config.fence_enabled = false;
  const SoakReport r = run_soak(*p.sim, *p.kernels, o);
  std::cout << to_string(r);
  SCOPED_TRACE(to_string(r));
  std::string why;
  EXPECT_FALSE(soak_passed(r, o, &why)) << "the soak cannot tell a missing fence";
  EXPECT_FALSE(r.error.empty());
}

}  // namespace
}  // namespace gvm::test
