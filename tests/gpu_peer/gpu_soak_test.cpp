// The soak (soak.hpp) on real GPUs 0 and 1, through the real driver.
// GVM_SOAK_SECONDS sets its length: 20 s by default (the ctest run);
// tools/gpu-suite.sh runs it for minutes in a step of its own, and briefly
// under compute-sanitizer. GVM_SOAK_THREADS sets the block workers per device
// (3 by default). Skips, saying why, without a CUDA driver, two
// devices with P2P, or VMM.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "device_kernels.hpp"
#include "gpu_test_env.hpp"
#include "peer_pair_fixture.hpp"
#include "soak.hpp"

namespace gvm::test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A positive number from the environment, or `fallback`.
double env_number(const char* name, double fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end != s && v > 0 ? v : fallback;
}

using SoakGpuTest = PeerPairGpuTest;

TEST_F(SoakGpuTest, ThreadsStreamsPeersTrimsSwitchesAndTheCap) {
  SoakOptions o;
  o.seconds = env_number("GVM_SOAK_SECONDS", 20.0);
  o.threads_per_device = static_cast<int>(env_number("GVM_SOAK_THREADS", 3.0));
  // The driver's free memory moves by a few MiB on its own (module and
  // context bookkeeping); a leaked chunk is at least 2 MiB, usually far more.
  o.free_memory_tolerance = 16 * kMiB;
  const SoakReport r = run_soak(*driver_, *kernels_, o);
  std::cout << "--- soak ---\n" << to_string(r) << "---" << std::endl;
  std::string why;
  EXPECT_TRUE(soak_passed(r, o, &why)) << why;
  // What the soak must have gone through, or it proved less than it says.
  EXPECT_GT(r.out_of_memory, 0u) << "the reserved-bytes cap was never hit";
  EXPECT_GT(r.cross_stream_frees, 0u);
  EXPECT_GT(r.direct_copies, 0u);
  EXPECT_GT(r.staged_copies, 0u);
  EXPECT_GT(r.policy_switches, 2u);
  EXPECT_GT(r.switches_with_work_queued, 0u) << "no switch met peer work in flight";
  EXPECT_GT(r.trims_with_work_queued, 0u) << "no trim met peer work in flight";
  EXPECT_GT(r.control_checks, 0u);
}

}  // namespace
}  // namespace gvm::test
