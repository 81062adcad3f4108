// The hazard proof on the real driver (docs/measurements.md "Hazards",
// docs/peer-access.md "The fence"): changing a peer path while work on it is in flight gives a
// sticky error; draining every stream of both devices first makes the same change harmless. The
// unfenced cases run in a child process (gvm-hazard-child, whose path the build passes in
// GVM_HAZARD_CHILD_PATH) because the sticky error would poison this one; their test names contain
// "Unfenced" so that tools/gpu-suite.sh can leave them out under compute-sanitizer, where they fail
// on purpose.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "child_process.hpp"
#include "gpu_test_env.hpp"
#include "hazard_scenarios.hpp"

namespace gvm::test {
namespace {

using vmm::Result;

class HazardTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    require_peer_pair();
  }

  // Runs the unfenced scenario in the child and checks that the context of
  // the busy device got a sticky error after the change.
  void expect_sticky_in_child(Hazard hazard) {
    ChildResult child = run_child(GVM_HAZARD_CHILD_PATH, {hazard_name(hazard)}, 300);
    std::cout << "--- gvm-hazard-child " << hazard_name(hazard) << " (exit " << child.exit_code
              << ") ---\n"
              << child.output << "---" << std::endl;
    ASSERT_TRUE(child.error.empty()) << child.error;
    ASSERT_FALSE(child.timed_out) << "the child did not finish in 300 s";
    ASSERT_EQ(child.signal, 0) << "the child died of signal " << child.signal;
    ASSERT_EQ(child.exit_code, 0) << "the child could not run the scenario";
    auto kv = parse_key_values(child.output);
    ASSERT_EQ(kv["pending_before_change"], "yes")
        << "the work had already finished when the access changed: the run proves nothing";
    // The change itself may be accepted; what breaks is the work in flight,
    // and then every later call of that context.
    EXPECT_TRUE(kv["sync"] == "CUDA_ERROR_LAUNCH_FAILED" ||
                kv["sync"] == "CUDA_ERROR_ILLEGAL_ADDRESS")
        << "sync=" << kv["sync"];
    EXPECT_NE(kv["later"], "CUDA_SUCCESS") << "the error was not sticky";
  }

  // Runs the fenced scenario here and checks that nothing failed.
  void expect_clean_in_process(Hazard hazard) {
    HazardReport r = run_hazard(*driver_, hazard, /*fenced=*/true);
    std::ostringstream log;
    print_report(log, hazard, true, r);
    std::cout << "--- fenced " << hazard_name(hazard) << " ---\n"
              << log.str() << "---" << std::endl;
    ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
    EXPECT_TRUE(r.pending_before_change)
        << "the work was done before the fence: the fence was not exercised";
    EXPECT_TRUE(ok(r.fence)) << "fence";
    EXPECT_TRUE(ok(r.change)) << "access change";
    EXPECT_TRUE(ok(r.sync)) << "sync after the change";
    EXPECT_TRUE(ok(r.later)) << "later call";
    EXPECT_TRUE(ok(r.verify)) << "data check";
    EXPECT_EQ(r.mismatches, 0u);
  }
};

TEST_F(HazardTest, UnfencedPeerDisableDuringCopyIsSticky) {
  expect_sticky_in_child(Hazard::peer_disable_during_copy);
}

TEST_F(HazardTest, FencedPeerDisableAfterCopyIsClean) {
  expect_clean_in_process(Hazard::peer_disable_during_copy);
}

TEST_F(HazardTest, UnfencedPeerDisableDuringKernelIsSticky) {
  expect_sticky_in_child(Hazard::peer_disable_during_kernel);
}

TEST_F(HazardTest, FencedPeerDisableAfterKernelIsClean) {
  expect_clean_in_process(Hazard::peer_disable_during_kernel);
}

TEST_F(HazardTest, UnfencedRevokeDuringPeerReadIsSticky) {
  expect_sticky_in_child(Hazard::revoke_during_read);
}

TEST_F(HazardTest, FencedRevokeAfterPeerReadIsClean) {
  expect_clean_in_process(Hazard::revoke_during_read);
}

// The child refuses nonsense instead of running something else.
TEST(HazardChild, RejectsUnknownScenario) {
  ChildResult child = run_child(GVM_HAZARD_CHILD_PATH, {"no_such_scenario"}, 60);
  ASSERT_TRUE(child.error.empty()) << child.error;
  EXPECT_EQ(child.exit_code, 2) << child.output;
  EXPECT_NE(child.output.find("usage:"), std::string::npos) << child.output;
}

}  // namespace
}  // namespace gvm::test
