// The outside review's two-GPU cases (docs/reliability.md, "The outside
// review") on two real GPUs; the simulated pair proves each in
// tests/peer/peer_correctness_sim_test.cpp. Skips, saying why, without two
// devices with P2P and VMM. A broken fix shows as a sticky error (illegal
// address) on a device, which also fails whatever runs after it in this
// process: the cases live in a binary of their own for that reason.
//
//   TeardownWaitsForAStagedCopyOnThePeersStream   ~Allocator with a staged
//       copy queued on device 1's stream behind a 0.5 s kernel, reading
//       device 0's ordinary memory: every device is fenced before any unmap
//   PolicySwitchesRacingPeerCopiesFromThreads    one thread copies out of the
//       scratch (direct or staged, as the policy of the moment says), one
//       switches the policy per_allocation <-> none; every copy arrives whole
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <thread>

#include "gvm/allocator.hpp"
#include "peer_pair_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::DevicePtr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

DevicePtr dp(const void* p) {
  return reinterpret_cast<DevicePtr>(p);
}

class PeerReviewGpuTest : public PeerPairGpuTest {
 protected:
  void SetUp() override {
    PeerPairGpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int d = 0; d < 2; ++d) GVM_ASSERT_OK(driver_->stream_create(d, &s_[d]));
    GVM_ASSERT_OK(driver_->mem_alloc(1, kSpinWords * 4, &spin_));
    GVM_ASSERT_OK(driver_->mem_alloc(1, 4, &sink_));
    GVM_ASSERT_OK(kernels_->fill(1, s_[1], spin_, 1, kSpinWords));
    GVM_ASSERT_OK(kernels_->calibrate_spin(1, s_[1], spin_, kSpinWords, 0.5, &spin_iterations_));
  }
  void TearDown() override {
    for (int d = 0; d < 2; ++d) {
      if (s_[d] == nullptr) continue;
      (void)driver_->stream_synchronize(d, s_[d]);
      (void)driver_->stream_destroy(d, s_[d]);
    }
    if (spin_ != 0) (void)driver_->mem_free(1, spin_);
    if (sink_ != 0) (void)driver_->mem_free(1, sink_);
    PeerPairGpuTest::TearDown();
  }
  // A kernel that keeps device 1's stream busy for about 0.5 s x `times`.
  void busy_device_1(double times = 1.0) {
    GVM_ASSERT_OK(kernels_->spin_read(1, s_[1], spin_, kSpinWords,
                                      static_cast<std::uint64_t>(static_cast<double>(spin_iterations_) * times), sink_));
  }
  std::uint32_t mismatches(int device, const void* p, std::uint32_t value, std::size_t words) {
    std::uint32_t m = 0xffffffffu;
    EXPECT_TRUE(ok(kernels_->count_mismatches(*driver_, device, s_[device], dp(p), value, words, &m)));
    return m;
  }

  static constexpr std::size_t kSpinWords = std::size_t{1} << 20;
  vmm::StreamHandle s_[2] = {nullptr, nullptr};
  DevicePtr spin_ = 0, sink_ = 0;
  std::uint64_t spin_iterations_ = 0;
};

TEST_F(PeerReviewGpuTest, TeardownWaitsForAStagedCopyOnThePeersStream) {
  constexpr std::size_t kBytes = 64 * kMiB;
  {
    Allocator a(*driver_);
    void* src = a.allocate(kBytes, 0, s_[0]);  // ordinary memory: the copy is staged
    void* dst = a.allocate(kBytes, 1, s_[1]);
    ASSERT_FALSE(a.is_peer_copy_direct(src, 0, 1));
    GVM_ASSERT_OK(kernels_->fill(0, s_[0], dp(src), 0x5eed5eedu, kBytes / 4));
    GVM_ASSERT_OK(driver_->stream_synchronize(0, s_[0]));
    busy_device_1();
    a.peer_copy(dst, 1, src, 0, kBytes, s_[1]);  // queued behind the kernel, reads device 0
    // Destroyed with the copy queued and both blocks live.
  }
  GVM_EXPECT_OK(driver_->ctx_synchronize(1))
      << "device 0's arena was unmapped while device 1's stream still read it";
  GVM_EXPECT_OK(driver_->ctx_synchronize(0));
}

TEST_F(PeerReviewGpuTest, PolicySwitchesRacingPeerCopiesFromThreads) {
  if (pre_ampere_) GTEST_SKIP() << "pre-Ampere pair: the allocator uses global access here";
  constexpr std::size_t kBytes = 8 * kMiB, kWords = kBytes / 4;
  constexpr int kCopies = 200, kSwitches = 60;
  constexpr std::uint32_t kValue = 0xa11c0b1eu;
  Allocator a(*driver_);
  void* scratch = a.scratch_allocate(kBytes, 0, s_[0]);
  void* dst = a.allocate(kBytes, 1, s_[1]);
  GVM_ASSERT_OK(kernels_->fill(0, s_[0], dp(scratch), kValue, kWords));
  GVM_ASSERT_OK(driver_->stream_synchronize(0, s_[0]));
  std::atomic<bool> copying{true};
  std::string copy_error, switch_error;
  int direct = 0;
  std::thread copier([&] {
    try {
      for (int i = 0; i < kCopies; ++i) {
        // Now and then a kernel ahead of the copy, so that switches find
        // copies queued, not done.
        if (i % 20 == 0) busy_device_1(0.05);
        if (a.is_peer_copy_direct(scratch, 0, 1)) ++direct;
        a.peer_copy(dst, 1, scratch, 0, kBytes, s_[1]);
      }
    } catch (const std::exception& e) {
      copy_error = e.what();
    }
    copying = false;
  });
  std::thread switcher([&] {
    try {
      for (int i = 0; i < kSwitches && copying; ++i)
        a.set_peer_policy(i % 2 == 0 ? PeerPolicy::none : PeerPolicy::per_allocation);
      a.set_peer_policy(PeerPolicy::per_allocation);
    } catch (const std::exception& e) {
      switch_error = e.what();
    }
  });
  copier.join();
  switcher.join();
  EXPECT_EQ(copy_error, "");
  EXPECT_EQ(switch_error, "");
  GVM_ASSERT_OK(driver_->ctx_synchronize(1)) << "a switch revoked access under a queued copy";
  GVM_ASSERT_OK(driver_->ctx_synchronize(0));
  EXPECT_EQ(mismatches(1, dst, kValue, kWords), 0u);
  std::cout << "[ info ] " << kCopies << " copies (" << direct << " direct), up to " << kSwitches
            << " policy switches\n";
  a.deallocate(dst, kBytes, 1, s_[1]);
  a.scratch_deallocate(scratch, kBytes, 0, s_[0]);
}

}  // namespace
}  // namespace gvm::test
