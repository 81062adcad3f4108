// gvm_torch_pool_free: the free of a gvmalloc-backed torch.cuda.MemPool gives
// the device's cached memory back to the driver, and a bad free changes nothing.
#include <gtest/gtest.h>

#include <string>

#include "gvm/gvm.h"

namespace gvm {
namespace {

constexpr ssize_t kMiB = ssize_t{1} << 20;

class TorchPoolFree : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(gvm_init_simulated("h200", 2, nullptr), GVM_OK) << gvm_last_error();
    gvm_clear_last_error();
  }
  void TearDown() override { EXPECT_EQ(gvm_shutdown(), GVM_OK) << gvm_last_error(); }

  static gvm_device_stats_t stats(int device) {
    gvm_device_stats_t s{};
    EXPECT_EQ(gvm_device_stats(device, &s), GVM_OK) << gvm_last_error();
    return s;
  }
};

TEST_F(TorchPoolFree, ReturnsTheDevicesCachedMemory) {
  void* keep = gvm_torch_malloc(3 * kMiB, 0, nullptr);
  void* other = gvm_torch_malloc(5 * kMiB, 1, nullptr);
  void* seg = gvm_torch_malloc(40 * kMiB, 0, nullptr);
  ASSERT_NE(keep, nullptr) << gvm_last_error();
  ASSERT_NE(other, nullptr) << gvm_last_error();
  ASSERT_NE(seg, nullptr) << gvm_last_error();
  const gvm_device_stats_t before = stats(0);
  const gvm_device_stats_t other_before = stats(1);

  testing::internal::CaptureStderr();
  gvm_torch_pool_free(seg, 40 * kMiB, 0, nullptr);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();

  const gvm_device_stats_t after = stats(0);
  EXPECT_EQ(after.frees, before.frees + 1);
  EXPECT_LT(after.live_bytes, before.live_bytes);
  // Only the block still live keeps memory mapped: what it needs, rounded up
  // to the granularity, and nothing cached.
  EXPECT_LT(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.cached_bytes + after.live_bytes, after.reserved_bytes);
  EXPECT_LT(after.reserved_bytes, after.live_bytes + 2 * static_cast<size_t>(kMiB));
  EXPECT_GT(after.chunks_unmapped, before.chunks_unmapped);
  // The other device is not trimmed.
  EXPECT_EQ(stats(1).reserved_bytes, other_before.reserved_bytes);

  gvm_torch_free(keep, 3 * kMiB, 0, nullptr);
  gvm_torch_free(other, 5 * kMiB, 1, nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_OK) << gvm_last_error();
}

TEST_F(TorchPoolFree, NullIsIgnoredAndABadPointerIsToldAndTrimsNothing) {
  void* seg = gvm_torch_malloc(8 * kMiB, 0, nullptr);
  ASSERT_NE(seg, nullptr) << gvm_last_error();
  gvm_torch_free(seg, 8 * kMiB, 0, nullptr);  // cached, not trimmed
  const gvm_device_stats_t before = stats(0);
  ASSERT_GT(before.cached_bytes, 0u);

  testing::internal::CaptureStderr();
  gvm_torch_pool_free(nullptr, 0, 0, nullptr);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(gvm_last_status(), GVM_OK);

  testing::internal::CaptureStderr();
  gvm_torch_pool_free(seg, 8 * kMiB, 0, nullptr);  // a double free
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("gvmalloc: gvm_torch_pool_free: "), std::string::npos) << err;
  const gvm_device_stats_t after = stats(0);
  EXPECT_EQ(after.frees, before.frees);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.chunks_unmapped, before.chunks_unmapped);

  gvm_clear_last_error();
  testing::internal::CaptureStderr();
  gvm_torch_pool_free(seg, 8 * kMiB, 9, nullptr);  // no device 9
  const std::string err9 = testing::internal::GetCapturedStderr();
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(err9.find("no device 9"), std::string::npos) << err9;
  EXPECT_EQ(stats(0).reserved_bytes, before.reserved_bytes);
}

}  // namespace
}  // namespace gvm
