// The GPU peer scenarios (engine_scenario.hpp, peer_hazards.hpp) on the
// simulated driver: the same code, with kernels as pending accesses. Proves
// here, without a GPU, that the scenarios drive the allocator correctly (no
// usage error, data checked, switches meeting queued work) and that they can
// fail: with the fence off the simulator's sticky error shows in the report.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "device_kernels.hpp"
#include "engine_scenario.hpp"
#include "peer_hazards.hpp"

namespace gvm::test {
namespace {

using vmm::Profile;
using vmm::Result;
using vmm::SimDriver;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Races between the scenario's own streams (an access not ordered after
// another stream's pending access to the same bytes: a free before the
// peer's use ended, a missing event). The stand-in kernels move data on the
// legacy stream, which races by construction; those are left out.
std::vector<std::string> ordering_races(const SimDriver& sim) {
  std::vector<std::string> out;
  for (const auto& r : sim.races())
    if (r.find("legacy stream") == std::string::npos) out.push_back(r);
  return out;
}

EngineOptions small_engine(PeerPolicy policy, bool tracked, bool fence) {
  EngineOptions o;
  o.iterations = 12;
  o.small_policy = policy;
  o.unit_bytes = kMiB;
  o.config.peer_policy = policy;
  o.config.scratch_fence_tracked = tracked;
  o.config.fence_enabled = fence;
  o.config.scratch_chunk_bytes = 2 * kMiB;
  return o;
}

void expect_clean(const SimDriver& sim, const EngineReport& r, const EngineOptions& o) {
  SCOPED_TRACE(to_string(r));
  const auto races = ordering_races(sim);
  EXPECT_TRUE(races.empty()) << races.size()
                             << " races, the first: " << (races.empty() ? "" : races.front());
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.iterations_done, o.iterations);
  EXPECT_EQ(r.final_sync[0], Result::success);
  EXPECT_EQ(r.final_sync[1], Result::success);
  EXPECT_EQ(r.wrong_words, 0u);
  EXPECT_EQ(r.control_failures, 0);
  EXPECT_TRUE(r.invariants.empty()) << r.invariants;
  // Simulated work stays queued until something synchronises: every switch,
  // trim and grant meets it.
  EXPECT_EQ(r.pending_at_revoke, o.iterations);
  EXPECT_EQ(r.pending_at_trim, o.iterations);
  EXPECT_EQ(r.pending_at_grant, o.iterations - 1);
  EXPECT_GT(r.chunks_unmapped, 0u);
  EXPECT_EQ(r.global_left[0], Result::peer_access_not_enabled);
  EXPECT_EQ(r.global_left[1], Result::peer_access_not_enabled);
}

TEST(PeerEngineSim, PerAllocationFenceDevices) {
  SimPair t;
  const EngineOptions o = small_engine(PeerPolicy::per_allocation, false, true);
  const EngineReport r = run_engine(*t.sim, *t.kernels, o);
  expect_clean(*t.sim, r, o);
  EXPECT_EQ(r.enable_peer_calls, 0u);
}

TEST(PeerEngineSim, PerAllocationFenceTracked) {
  SimPair t;
  const EngineOptions o = small_engine(PeerPolicy::per_allocation, true, true);
  const EngineReport r = run_engine(*t.sim, *t.kernels, o);
  expect_clean(*t.sim, r, o);
  EXPECT_EQ(r.enable_peer_calls, 0u);
}

TEST(PeerEngineSim, ForcedGlobal) {
  SimPair t;
  const EngineOptions o = small_engine(PeerPolicy::global, false, true);
  const EngineReport r = run_engine(*t.sim, *t.kernels, o);
  expect_clean(*t.sim, r, o);
  EXPECT_GE(r.enable_peer_calls, static_cast<std::uint64_t>(o.iterations));
  EXPECT_GE(r.disable_peer_calls, static_cast<std::uint64_t>(o.iterations));
}

// The scenario can fail: without the fence the first switch lands under the
// queued peer work and the context dies.
TEST(PeerEngineSim, WithoutFenceTheScenarioFails) {
  SimPair t;
  const EngineOptions o = small_engine(PeerPolicy::per_allocation, false, false);
  const EngineReport r = run_engine(*t.sim, *t.kernels, o);
  EXPECT_FALSE(r.error.empty()) << to_string(r);
  EXPECT_TRUE(vmm::is_sticky(r.final_sync[0])) << to_string(r);
  EXPECT_EQ(r.iterations_done, 0);
}

// A wrong word is found and located: the checks are real.
TEST(PeerEngineSim, CorruptionIsReported) {
  SimPair t;
  EngineOptions o = small_engine(PeerPolicy::per_allocation, false, true);
  o.iterations = 2;
  // Kernels that fill one word wrong whenever they fill a large range.
  class Corrupting final : public DeviceKernels {
   public:
    explicit Corrupting(SimDriver& s) : sim_(s), inner_(sim_kernels(s)) {}
    Result fill(int d, vmm::StreamHandle s, vmm::DevicePtr p, std::uint32_t v,
                std::size_t n) override {
      Result r = inner_->fill(d, s, p, v, n);
      if (r == Result::success && n >= (std::size_t{4} << 20) / 4) {
        const std::uint32_t bad = v + 7;
        r = sim_.memcpy_htod(d, p + 4 * (n - 1), &bad, 4);
      }
      return r;
    }
    Result check(int d, vmm::StreamHandle s, vmm::DevicePtr p, std::uint32_t v, std::size_t n,
                 vmm::DevicePtr m) override {
      return inner_->check(d, s, p, v, n, m);
    }
    Result spin_read(int d, vmm::StreamHandle s, vmm::DevicePtr p, std::size_t n, std::uint64_t i,
                     vmm::DevicePtr sink) override {
      return inner_->spin_read(d, s, p, n, i, sink);
    }
    Result calibrate_spin(int d, vmm::StreamHandle s, vmm::DevicePtr p, std::size_t n, double sec,
                          std::uint64_t* i) override {
      return inner_->calibrate_spin(d, s, p, n, sec, i);
    }

   private:
    SimDriver& sim_;
    std::unique_ptr<DeviceKernels> inner_;
  } corrupting(*t.sim);
  const EngineReport r = run_engine(*t.sim, corrupting, o);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_GT(r.wrong_words, 0u) << to_string(r);
  EXPECT_FALSE(r.data_errors.empty());
}

// --- the allocator-level hazards ---------------------------------------------

PeerHazardOptions small_hazards() {
  PeerHazardOptions o;
  o.copy_bytes = 8 * kMiB;
  o.copies = 3;
  o.read_bytes = 4 * kMiB;
  return o;
}

class PeerHazardSim : public ::testing::TestWithParam<PeerHazard> {};

TEST_P(PeerHazardSim, FencedIsClean) {
  SimPair t;
  const PeerHazardReport r = run_peer_hazard(*t.sim, *t.kernels, GetParam(), true, small_hazards());
  ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
  EXPECT_TRUE(r.pending_before_change);
  EXPECT_EQ(r.change, Result::success) << r.change_error;
  EXPECT_EQ(r.sync, Result::success);
  EXPECT_EQ(r.later, Result::success);
  EXPECT_EQ(r.verify, Result::success) << r.verify_error;
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_FALSE(r.sticky());
}

TEST_P(PeerHazardSim, UnfencedIsSticky) {
  SimPair t;
  const PeerHazardReport r =
      run_peer_hazard(*t.sim, *t.kernels, GetParam(), false, small_hazards());
  ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
  EXPECT_TRUE(r.pending_before_change);
  EXPECT_TRUE(r.sticky());
  EXPECT_TRUE(vmm::is_sticky(r.later)) << vmm::result_name(r.later);
  t.sim->clear_sticky();
  t.sim->complete_all();
}

INSTANTIATE_TEST_SUITE_P(Scenarios, PeerHazardSim,
                         ::testing::Values(PeerHazard::switch_during_peer_kernel,
                                           PeerHazard::global_switch_during_peer_copy,
                                           PeerHazard::trim_during_peer_kernel),
                         [](const auto& p) { return std::string(peer_hazard_name(p.param)); });

TEST(PeerHazardSimPrivate, PeerReadOfOrdinaryBlockIsRefused) {
  SimPair t;
  const PeerHazardReport r = run_peer_hazard(
      *t.sim, *t.kernels, PeerHazard::peer_reads_private_block, false, small_hazards());
  ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
  EXPECT_EQ(r.peer_access, "none");
  EXPECT_EQ(r.change, Result::illegal_address);
  EXPECT_TRUE(r.sticky());
  t.sim->clear_sticky();
  t.sim->complete_all();
}

TEST(PeerHazardSimPrivate, HasNoFencedForm) {
  SimPair t;
  const PeerHazardReport r = run_peer_hazard(
      *t.sim, *t.kernels, PeerHazard::peer_reads_private_block, true, small_hazards());
  EXPECT_NE(r.setup_error.find("no fenced form"), std::string::npos) << r.setup_error;
}

TEST(PeerHazardNames, RoundTrip) {
  for (PeerHazard h :
       {PeerHazard::switch_during_peer_kernel, PeerHazard::global_switch_during_peer_copy,
        PeerHazard::trim_during_peer_kernel, PeerHazard::peer_reads_private_block}) {
    PeerHazard back{};
    ASSERT_TRUE(parse_peer_hazard(peer_hazard_name(h), &back));
    EXPECT_EQ(back, h);
  }
  PeerHazard x{};
  EXPECT_FALSE(parse_peer_hazard("switch", &x));
}

}  // namespace
}  // namespace gvm::test
