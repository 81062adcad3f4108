// Peer access done safely, on real GPUs (devices 0 and 1; H200 pair with
// NVLink in the lead's runs). Every test skips, saying why, without a CUDA
// driver, with fewer than two devices, without P2P between 0 and 1 or
// without VMM.
//
//   PeerGpuTest         a kernel on device 1 reads and writes device 0's
//                       scratch with context peer access never enabled, and
//                       device 1 has no access to device 0's ordinary blocks
//   PeerEngineGpuTest   the engine scenario (engine_scenario.hpp), 200
//                       iterations (400 phases, 400 policy switches, 200
//                       trims and regrowths), in per_allocation mode with
//                       both fence modes and in forced global mode
//   PeerFencedGpuTest   allocator-level hazards with the fence: clean
//   PeerUnfencedChild   the same with Config::fence_enabled=false, in
//                       gvm-peer-child (GVM_PEER_CHILD_PATH): a sticky error.
//                       "Unfenced" in the suite name lets tools/gpu-suite.sh
//                       leave them out under compute-sanitizer.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <sstream>
#include <string>

#include "child_process.hpp"
#include "device_kernels.hpp"
#include "engine_scenario.hpp"
#include "gpu_test_env.hpp"
#include "peer_pair_fixture.hpp"
#include "gvm/allocator.hpp"
#include "peer_hazards.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::DevicePtr;
using vmm::Result;

constexpr std::size_t kMiB = std::size_t{1} << 20;

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

std::uint64_t calls(const Allocator& a, vmm::Call c) {
  return a.stats().driver.calls[static_cast<std::size_t>(c)];
}

class PeerGpuTest : public PeerPairGpuTest {
 protected:
  void SetUp() override {
    PeerPairGpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int d = 0; d < 2; ++d) GVM_ASSERT_OK(driver_->stream_create(d, &s_[d]));
  }

  void TearDown() override {
    for (int d = 0; d < 2; ++d) {
      if (s_[d] == nullptr) continue;
      (void)driver_->stream_synchronize(d, s_[d]);
      (void)driver_->stream_destroy(d, s_[d]);
    }
    PeerPairGpuTest::TearDown();
  }

  // Context peer access off in both directions, whoever turned it on, so
  // that a test can show it never was turned on again.
  void global_access_off() {
    GVM_ASSERT_OK(driver_->ctx_synchronize(0));
    GVM_ASSERT_OK(driver_->ctx_synchronize(1));
    for (auto [d, p] : {std::pair{1, 0}, std::pair{0, 1}}) {
      const Result r = driver_->disable_peer_access(d, p);
      ASSERT_TRUE(r == Result::success || r == Result::peer_access_not_enabled)
          << "cuCtxDisablePeerAccess(" << d << " -> " << p << "): " << vmm::result_name(r);
    }
  }

  // Asserts that context peer access d -> p is off (nobody enabled it).
  void expect_global_off(int d, int p) {
    const Result r = driver_->disable_peer_access(d, p);
    EXPECT_EQ(r, Result::peer_access_not_enabled)
        << "cuCtxDisablePeerAccess(" << d << " -> " << p << ") returned " << vmm::result_name(r)
        << ": context peer access was on";
  }

  std::uint32_t mismatches(int device, const void* p, std::uint32_t value, std::size_t n) {
    std::uint32_t m = 0xffffffffu;
    const Result r = kernels_->count_mismatches(*driver_, device, s_[device], dp(p), value, n, &m);
    EXPECT_TRUE(ok(r)) << "check on device " << device;
    return m;
  }

  vmm::StreamHandle s_[2] = {nullptr, nullptr};
};

// --- 1. the scratch is reachable, nothing else is, no global toggle --------

TEST_F(PeerGpuTest, PeerKernelReadsAndWritesScratchWithoutGlobalAccess) {
  if (pre_ampere_) GTEST_SKIP() << "pre-Ampere pair: the allocator uses global access here";
  global_access_off();
  if (HasFatalFailure()) return;
  Allocator a(*driver_);
  ASSERT_EQ(a.peer_policy(0, 1), PeerPolicy::per_allocation) << to_string(a.peer_policy(0, 1));
  ASSERT_EQ(a.peer_policy(1, 0), PeerPolicy::per_allocation) << to_string(a.peer_policy(1, 0));

  const std::size_t bytes = 16 * kMiB;
  const std::size_t n = bytes / 4;
  void* scratch = a.scratch_allocate(bytes, 0, s_[0]);
  void* ordinary = a.allocate(bytes, 0, s_[0]);
  void* local1 = a.allocate(bytes, 1, s_[1]);

  // What the driver itself says about who may touch what.
  Access acc = Access::read;
  GVM_ASSERT_OK(driver_->mem_get_access(dp(scratch), 1, &acc));
  EXPECT_EQ(acc, Access::read_write) << "device 1 on device 0's scratch";
  GVM_ASSERT_OK(driver_->mem_get_access(dp(ordinary), 1, &acc));
  EXPECT_EQ(acc, Access::none) << "device 1 on device 0's ordinary block";
  GVM_ASSERT_OK(driver_->mem_get_access(dp(ordinary), 0, &acc));
  EXPECT_EQ(acc, Access::read_write) << "device 0 on its own ordinary block";
  EXPECT_TRUE(a.is_peer_copy_direct(scratch, 0, 1));
  EXPECT_FALSE(a.is_peer_copy_direct(ordinary, 0, 1));

  // Device 0 writes; device 1 reads in place (spin and check kernels).
  const std::uint32_t v1 = 0x1234abcdu, v2 = 0x0badf00du;
  GVM_ASSERT_OK(kernels_->fill(0, s_[0], dp(scratch), v1, n));
  GVM_ASSERT_OK(driver_->stream_synchronize(0, s_[0]));
  DevicePtr sink = 0;
  GVM_ASSERT_OK(driver_->mem_alloc(1, 4, &sink));
  GVM_EXPECT_OK(kernels_->spin_read(1, s_[1], dp(scratch), n, 4, sink));
  EXPECT_EQ(mismatches(1, scratch, v1, n), 0u) << "device 1 reading device 0's scratch";
  EXPECT_EQ(mismatches(1, scratch, v1 + 1, n), n) << "control: the check must see every word";
  GVM_EXPECT_OK(driver_->mem_free(1, sink));

  // Device 1 writes in place; device 0 sees it.
  GVM_ASSERT_OK(kernels_->fill(1, s_[1], dp(scratch), v2, n));
  GVM_ASSERT_OK(driver_->stream_synchronize(1, s_[1]));
  EXPECT_EQ(mismatches(0, scratch, v2, n), 0u) << "device 0 reading what device 1 wrote";

  // A direct copy driven by device 1.
  a.peer_copy(local1, 1, scratch, 0, bytes, s_[1]);
  EXPECT_EQ(mismatches(1, local1, v2, n), 0u) << "direct peer copy into device 1";

  // Nobody enabled context peer access: not the allocator (its counters),
  // not anyone else (the driver says it is not enabled).
  EXPECT_EQ(calls(a, vmm::Call::enable_peer_access), 0u);
  expect_global_off(1, 0);
  expect_global_off(0, 1);

  a.deallocate(scratch, bytes, 0, s_[0]);
  a.deallocate(ordinary, bytes, 0, s_[0]);
  a.deallocate(local1, bytes, 1, s_[1]);
  std::string why;
  EXPECT_TRUE(a.check_invariants(&why)) << why;
}

// --- 2. the engine scenario -------------------------------------------------

struct EngineMode {
  const char* name;
  PeerPolicy policy;
  bool tracked;
};
// Printed in the test list instead of raw bytes (CMake 4's discovery cannot
// parse those).
void PrintTo(const EngineMode& m, std::ostream* os) { *os << m.name; }

class PeerEngineGpuTest : public PeerGpuTest, public ::testing::WithParamInterface<EngineMode> {};

TEST_P(PeerEngineGpuTest, TwoHundredIterationsNoErrorNoStickyState) {
  const EngineMode mode = GetParam();
  if (mode.policy == PeerPolicy::per_allocation && pre_ampere_)
    GTEST_SKIP() << "pre-Ampere pair: per_allocation is not real there";
  global_access_off();
  if (HasFatalFailure()) return;
  EngineOptions o;
  o.iterations = 200;
  o.small_policy = mode.policy;
  o.config.peer_policy = mode.policy;
  o.config.scratch_fence_tracked = mode.tracked;
  // 8 MiB chunks: several per block, so trims and regrowth map and unmap
  // chunk by chunk, and a grant costs ~1 ms per chunk (docs/measurements.md, "Driver calls")
  // instead of ~9 ms per GiB-sized one.
  o.config.scratch_chunk_bytes = 8 * kMiB;

  const auto t0 = std::chrono::steady_clock::now();
  const EngineReport r = run_engine(*driver_, *kernels_, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "--- engine " << mode.name << " ---\n"
            << to_string(r) << "seconds=" << seconds << "\n---" << std::endl;

  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.iterations_done, o.iterations);
  EXPECT_TRUE(ok(r.final_sync[0])) << "device 0 after the last phase (a sticky error?)";
  EXPECT_TRUE(ok(r.final_sync[1])) << "device 1 after the last phase (a sticky error?)";
  std::string where;
  for (const auto& e : r.data_errors) where += "\n  " + e;
  EXPECT_EQ(r.wrong_words, 0u) << where;
  EXPECT_EQ(r.control_failures, 0) << "the checks did not run as launched:" << where;
  EXPECT_TRUE(r.invariants.empty()) << r.invariants;
  // The switches must have met work in flight, or the fence proved nothing.
  EXPECT_GE(r.pending_at_revoke, o.iterations / 2)
      << "the peer spin_read had finished before set_peer_policy(none) in most iterations";
  EXPECT_GT(r.chunks_unmapped, 0u) << "trim never unmapped a chunk";
  if (mode.policy == PeerPolicy::per_allocation) {
    EXPECT_EQ(r.enable_peer_calls, 0u) << "per_allocation must never enable context peer access";
  } else {
    // Entered at every small phase, left at every large one.
    EXPECT_GE(r.enable_peer_calls, static_cast<std::uint64_t>(o.iterations));
    EXPECT_GE(r.disable_peer_calls, static_cast<std::uint64_t>(o.iterations));
  }
  // Nothing left on: per_allocation never turned it on, global turned it off.
  EXPECT_EQ(r.global_left[0], Result::peer_access_not_enabled)
      << vmm::result_name(r.global_left[0]);
  EXPECT_EQ(r.global_left[1], Result::peer_access_not_enabled)
      << vmm::result_name(r.global_left[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PeerEngineGpuTest,
    ::testing::Values(EngineMode{"per_allocation_fence_devices", PeerPolicy::per_allocation, false},
                      EngineMode{"per_allocation_fence_tracked", PeerPolicy::per_allocation, true},
                      EngineMode{"global_fence_devices", PeerPolicy::global, false}),
    [](const auto& p) { return std::string(p.param.name); });

// --- 3. the hazards, fenced here and unfenced in a child --------------------

class PeerFencedGpuTest : public PeerGpuTest {
 protected:
  void expect_clean(PeerHazard h) {
    const PeerHazardReport r = run_peer_hazard(*driver_, *kernels_, h, /*fenced=*/true);
    std::ostringstream log;
    print_peer_report(log, h, true, r);
    std::cout << "--- fenced " << peer_hazard_name(h) << " ---\n"
              << log.str() << "---" << std::endl;
    ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
    EXPECT_TRUE(r.pending_before_change)
        << "the peer's work had finished before the change: the fence was not exercised";
    EXPECT_TRUE(ok(r.change)) << "the change itself: " << r.change_error;
    EXPECT_TRUE(ok(r.sync)) << "the peer's stream after the change";
    EXPECT_TRUE(ok(r.later)) << "a later call on device 1";
    EXPECT_TRUE(ok(r.verify)) << r.verify_error;
    EXPECT_EQ(r.mismatches, 0u);
    EXPECT_FALSE(r.sticky());
  }
};

TEST_F(PeerFencedGpuTest, PolicySwitchDuringPeerKernelIsClean) {
  if (pre_ampere_) GTEST_SKIP() << "pre-Ampere pair: no per_allocation policy to switch from";
  expect_clean(PeerHazard::switch_during_peer_kernel);
}
TEST_F(PeerFencedGpuTest, GlobalSwitchDuringPeerCopyIsClean) {
  expect_clean(PeerHazard::global_switch_during_peer_copy);
}
TEST_F(PeerFencedGpuTest, TrimDuringPeerKernelIsClean) {
  expect_clean(PeerHazard::trim_during_peer_kernel);
}

class PeerUnfencedChild : public PeerGpuTest {
 protected:
  // Runs the unfenced scenario in gvm-peer-child; returns its key=value lines.
  std::map<std::string, std::string> run_in_child(PeerHazard h) {
    const ChildResult child = run_child(GVM_PEER_CHILD_PATH, {peer_hazard_name(h)}, 300);
    std::cout << "--- gvm-peer-child " << peer_hazard_name(h) << " (exit " << child.exit_code
              << ") ---\n"
              << child.output << "---" << std::endl;
    EXPECT_TRUE(child.error.empty()) << child.error;
    EXPECT_FALSE(child.timed_out) << "the child did not finish in 300 s";
    EXPECT_EQ(child.signal, 0) << "the child died of signal " << child.signal;
    EXPECT_EQ(child.exit_code, 0) << "the child could not run the scenario (see its output)";
    return parse_key_values(child.output);
  }

  // The change landed under the peer's work: the busy context must be dead
  // (the error sticks to every later call). If the driver tolerated it, the
  // failure says exactly what it returned instead.
  void expect_sticky(PeerHazard h, bool needs_pending = true) {
    auto kv = run_in_child(h);
    if (HasFailure()) return;
    ASSERT_EQ(kv["fenced"], "no");
    if (needs_pending) {
      ASSERT_EQ(kv["pending_before_change"], "yes")
          << "the peer's work had finished before the change: the run proves nothing";
    }
    const std::string seen =
        "change=" + kv["change"] + " sync=" + kv["sync"] + " later=" + kv["later"];
    EXPECT_EQ(kv["sticky"], "yes") << "the real driver did NOT give a sticky error here: " << seen;
    EXPECT_NE(kv["later"], "CUDA_SUCCESS") << "the error did not stick: " << seen;
  }
};

TEST_F(PeerUnfencedChild, PolicySwitchDuringPeerKernelIsSticky) {
  if (pre_ampere_) GTEST_SKIP() << "pre-Ampere pair: no per_allocation policy to switch from";
  expect_sticky(PeerHazard::switch_during_peer_kernel);
}
TEST_F(PeerUnfencedChild, GlobalSwitchDuringPeerCopyIsSticky) {
  expect_sticky(PeerHazard::global_switch_during_peer_copy);
}
TEST_F(PeerUnfencedChild, TrimDuringPeerKernelIsSticky) {
  expect_sticky(PeerHazard::trim_during_peer_kernel);
}
// Not a fence matter: an ordinary block was never granted, so a peer read
// faults whatever happens. It proves that Access::none is real.
TEST_F(PeerUnfencedChild, PeerKernelOnOrdinaryBlockFaults) {
  auto kv = run_in_child(PeerHazard::peer_reads_private_block);
  if (HasFailure()) return;
  EXPECT_EQ(kv["peer_access"], "none");
  EXPECT_EQ(kv["sticky"], "yes") << "device 1 read device 0's ordinary block without a fault: "
                                 << "change=" << kv["change"] << " sync=" << kv["sync"];
}

// No GPU needed: the child refuses nonsense instead of running something.
TEST(PeerChildArgs, RejectsUnknownScenario) {
  const ChildResult child = run_child(GVM_PEER_CHILD_PATH, {"no_such_scenario"}, 60);
  ASSERT_TRUE(child.error.empty()) << child.error;
  EXPECT_EQ(child.exit_code, 2) << child.output;
  EXPECT_NE(child.output.find("usage:"), std::string::npos) << child.output;
}

}  // namespace
}  // namespace gvm::test
