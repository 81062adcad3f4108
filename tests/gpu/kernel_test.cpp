// The sm_60 PTX kernels, JIT-compiled by the driver for whatever GPU is
// present, writing and checking VMM-mapped ranges: locally, across chunk
// boundaries, from a peer through a per-allocation grant, and through a
// second mapping of an exported and re-imported handle.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "gpu_test_env.hpp"
#include "gvm/vmm/owners.hpp"
#include "test_kernels.hpp"

namespace gvm::test {
namespace {

using vmm::Access;
using vmm::DeviceAttribute;
using vmm::DevicePtr;
using vmm::GranularityKind;
using vmm::Result;
using vmm::ShareableHandleType;

class KernelTest : public CudaTest {
 protected:
  // Skips when `device` has no VMM; returns its minimum granularity.
  std::size_t vmm_granularity(int device) {
    int vmm = 0;
    EXPECT_TRUE(ok(driver_->device_attribute(device, DeviceAttribute::vmm_supported, &vmm)));
    if (vmm == 0) return 0;
    std::size_t g = 0;
    EXPECT_TRUE(ok(driver_->allocation_granularity(device, GranularityKind::minimum, &g)));
    return g;
  }
};

TEST_F(KernelTest, PtxLoadsOnEveryDevice) {
  for (int d = 0; d < device_count_; ++d) {
    TestKernels k;
    GVM_EXPECT_OK(k.load(*driver_, d)) << " device " << d;
  }
}

// Two chunks mapped side by side and filled by one launch: the range is
// contiguous to kernels across the chunk boundary.
TEST_F(KernelTest, FillAndCheckAVmmRangeAcrossChunks) {
  for (int d = 0; d < device_count_; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    const std::size_t g = vmm_granularity(d);
    if (g == 0) continue;
    TestKernels k;
    GVM_ASSERT_OK(k.load(*driver_, d));
    vmm::ReservedRange range(*driver_, 8 * g, g);
    vmm::MappedChunk a(*driver_, d, range.base(), g, {{d, Access::read_write}});
    vmm::MappedChunk b(*driver_, d, range.base() + g, 2 * g, {{d, Access::read_write}});
    const std::size_t n = 3 * g / 4;
    const std::uint32_t value = 0xa5a50000u + static_cast<std::uint32_t>(d);
    GVM_ASSERT_OK(k.fill(nullptr, range.base(), value, n));
    std::uint32_t mismatches = 1;
    GVM_ASSERT_OK(k.count_mismatches(nullptr, range.base(), value, n, &mismatches));
    EXPECT_EQ(mismatches, 0u);
    // The checker can fail: every word differs from value + 1.
    GVM_ASSERT_OK(k.count_mismatches(nullptr, range.base(), value + 1, n, &mismatches));
    EXPECT_EQ(mismatches, n);
    // And the host sees the kernel's writes at both ends.
    std::uint32_t first = 0, last = 0;
    GVM_ASSERT_OK(driver_->memcpy_dtoh(d, &first, range.base(), 4));
    GVM_ASSERT_OK(driver_->memcpy_dtoh(d, &last, range.base() + 3 * g - 4, 4));
    EXPECT_EQ(first, value);
    EXPECT_EQ(last, value);
  }
}

TEST_F(KernelTest, CopyBetweenVmmChunksOnAStream) {
  const std::size_t g = vmm_granularity(0);
  if (g == 0) GTEST_SKIP() << "device 0 has no VMM";
  TestKernels k;
  GVM_ASSERT_OK(k.load(*driver_, 0));
  vmm::ReservedRange range(*driver_, 4 * g, g);
  vmm::MappedChunk src(*driver_, 0, range.base(), g, {{0, Access::read_write}});
  vmm::MappedChunk dst(*driver_, 0, range.base() + 2 * g, g, {{0, Access::read_write}});
  vmm::StreamHandle s = nullptr;
  GVM_ASSERT_OK(driver_->stream_create(0, &s));
  const std::size_t n = g / 4;
  GVM_ASSERT_OK(k.fill(s, src.addr(), 17, n));
  GVM_ASSERT_OK(k.fill(s, dst.addr(), 0, n));
  GVM_ASSERT_OK(k.copy(s, dst.addr(), src.addr(), n));
  std::uint32_t mismatches = 1;
  GVM_ASSERT_OK(k.count_mismatches(s, dst.addr(), 17, n, &mismatches));
  EXPECT_EQ(mismatches, 0u);
  GVM_EXPECT_OK(driver_->stream_destroy(0, s));
}

// Per-allocation peer access: device 1 reads device 0's VMM range through a
// cuMemSetAccess grant, with no global peer access enabled.
TEST_F(KernelTest, PeerKernelReadsAGrantedRange) {
  require_peer_pair();
  if (IsSkipped() || HasFatalFailure()) return;
  const std::size_t g = vmm_granularity(0);
  if (g == 0) GTEST_SKIP() << "device 0 has no VMM";
  TestKernels k0, k1;
  GVM_ASSERT_OK(k0.load(*driver_, 0));
  GVM_ASSERT_OK(k1.load(*driver_, 1));
  const std::size_t size = 4 * g;
  const std::size_t n = size / 4;
  vmm::ReservedRange range(*driver_, size, g);
  vmm::MappedChunk owned(*driver_, 0, range.base(), size,
                         {{0, Access::read_write}, {1, Access::read_write}});
  Access a = Access::none;
  GVM_ASSERT_OK(driver_->mem_get_access(range.base(), 1, &a));
  EXPECT_EQ(a, Access::read_write);
  GVM_ASSERT_OK(k0.fill(nullptr, range.base(), 0xfeedu, n));
  GVM_ASSERT_OK(driver_->ctx_synchronize(0));

  DevicePtr local = 0;
  GVM_ASSERT_OK(driver_->mem_alloc(1, size, &local));
  GVM_ASSERT_OK(k1.copy(nullptr, local, range.base(), n));  // peer read
  std::uint32_t mismatches = 1;
  GVM_ASSERT_OK(k1.count_mismatches(nullptr, local, 0xfeedu, n, &mismatches));
  EXPECT_EQ(mismatches, 0u);
  // Device 1 also reads it in place.
  GVM_ASSERT_OK(k1.count_mismatches(nullptr, range.base(), 0xfeedu, n, &mismatches));
  EXPECT_EQ(mismatches, 0u);

  // Fenced revoke (nothing in flight: both synchronized above by the reads'
  // stream_synchronize on device 1 and the earlier ctx_synchronize on 0).
  const vmm::AccessDesc revoke[] = {{1, Access::none}};
  GVM_ASSERT_OK(driver_->mem_set_access(range.base(), size, revoke, 1));
  GVM_ASSERT_OK(driver_->mem_get_access(range.base(), 1, &a));
  EXPECT_EQ(a, Access::none);
  GVM_ASSERT_OK(driver_->mem_get_access(range.base(), 0, &a));
  EXPECT_EQ(a, Access::read_write) << "revoking the peer must not touch the owner";
  GVM_EXPECT_OK(driver_->mem_free(1, local));
}

// A POSIX-fd export imported again is the same memory: what one mapping's
// kernel writes, the other mapping's kernel reads.
TEST_F(KernelTest, ExportedHandleImportsToTheSameMemory) {
  const std::size_t g = vmm_granularity(0);
  if (g == 0) GTEST_SKIP() << "device 0 has no VMM";
  int posix_fd = 0;
  GVM_ASSERT_OK(
      driver_->device_attribute(0, DeviceAttribute::posix_fd_handle_supported, &posix_fd));
  if (posix_fd == 0) GTEST_SKIP() << "device 0 cannot export POSIX fd handles";
  TestKernels k;
  GVM_ASSERT_OK(k.load(*driver_, 0));
  const std::size_t size = 2 * g;
  vmm::ReservedRange range(*driver_, 2 * size, g);
  vmm::MappedChunk first(*driver_, 0, range.base(), size, {{0, Access::read_write}},
                         ShareableHandleType::posix_fd);
  int fd = -1;
  GVM_ASSERT_OK(
      driver_->export_shareable_handle(first.handle(), ShareableHandleType::posix_fd, &fd));
  ASSERT_GE(fd, 0);
  vmm::PhysHandle imported = 0;
  Result r =
      driver_->import_shareable_handle(reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                       ShareableHandleType::posix_fd, &imported);
  close(fd);
  GVM_ASSERT_OK(r);
  const DevicePtr second = range.base() + size;
  GVM_ASSERT_OK(driver_->mem_map(second, size, imported));
  const vmm::AccessDesc rw[] = {{0, Access::read_write}};
  GVM_ASSERT_OK(driver_->mem_set_access(second, size, rw, 1));
  GVM_ASSERT_OK(k.fill(nullptr, first.addr(), 0xabcdu, size / 4));
  std::uint32_t mismatches = 1;
  GVM_ASSERT_OK(k.count_mismatches(nullptr, second, 0xabcdu, size / 4, &mismatches));
  EXPECT_EQ(mismatches, 0u);
  GVM_EXPECT_OK(driver_->mem_unmap(second, size));
  GVM_EXPECT_OK(driver_->mem_release(imported));
}

}  // namespace
}  // namespace gvm::test
