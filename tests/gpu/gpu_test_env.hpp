// The real driver for the GPU tests, loaded once per test process. Without a
// driver (or without a GPU) every GPU test is skipped with the loader's own
// message, e.g. "no CUDA driver found: libcuda.so.1: cannot open shared
// object file: No such file or directory".
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

// nullptr when no driver loads; *why says why.
inline vmm::TestDriver* shared_cuda_driver(std::string* why) {
  static std::string reason;
  static std::unique_ptr<vmm::TestDriver> driver = vmm::try_load_cuda_test_driver(&reason);
  if (why != nullptr) *why = reason;
  return driver.get();
}

// Base fixture: driver_ and device_count_, or the test is skipped.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    driver_ = shared_cuda_driver(&why);
    if (driver_ == nullptr) GTEST_SKIP() << why;
    ASSERT_EQ(driver_->device_count(&device_count_), vmm::Result::success);
  }

  // Skips unless devices 0 and 1 exist and can access each other.
  void require_peer_pair() {
    if (device_count_ < 2) GTEST_SKIP() << "needs 2 GPUs, the driver shows " << device_count_;
    bool a = false, b = false;
    ASSERT_EQ(driver_->can_access_peer(0, 1, &a), vmm::Result::success);
    ASSERT_EQ(driver_->can_access_peer(1, 0, &b), vmm::Result::success);
    if (!a || !b) GTEST_SKIP() << "GPUs 0 and 1 have no P2P path (cuDeviceCanAccessPeer)";
  }

  vmm::TestDriver* driver_ = nullptr;
  int device_count_ = 0;
};

// A driver result as a GoogleTest assertion: the failure names the result.
inline ::testing::AssertionResult ok(vmm::Result r) {
  if (r == vmm::Result::success) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "driver call returned " << vmm::result_name(r);
}

}  // namespace gvm::test

#define GVM_ASSERT_OK(expr) ASSERT_TRUE(::gvm::test::ok(expr)) << #expr
#define GVM_EXPECT_OK(expr) EXPECT_TRUE(::gvm::test::ok(expr)) << #expr
