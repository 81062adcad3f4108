// Which legacy stream a cuMemcpyPeerAsync on the null stream runs on, on two
// real GPUs. The Driver contract: "stream: a stream of dst_device; nullptr is
// dst_device's legacy stream". The driver itself uses the legacy stream of
// the context current for the call, so CudaDriver must make dst_device's
// context current; making src_device's current (what it did before) puts the
// copy on the source's legacy stream, where nothing orders it after work on
// the destination. Skips, saying why, without two devices with P2P.
//
// Device 1's legacy stream: a slow kernel, then a fill of dst with `late`.
// The copy of src (`copied`) into dst on the null stream follows. On device
// 1's legacy stream it runs after the fill: dst ends as `copied`. On device
// 0's it runs at once, during the slow kernel, and the fill overwrites it:
// dst ends as `late`.
#include <gtest/gtest.h>

#include <cstdint>

#include "peer_pair_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::DevicePtr;

class PeerCopyStreamGpuTest : public PeerPairGpuTest {};

TEST_F(PeerCopyStreamGpuTest, NullStreamIsTheDestinationsLegacyStream) {
  constexpr std::size_t kWords = std::size_t{4} << 20;  // 16 MiB
  constexpr std::size_t kBytes = kWords * sizeof(std::uint32_t);
  constexpr std::uint32_t kCopied = 0xc0b1ed00u, kLate = 0x1a7e0000u;
  DevicePtr src = 0, dst = 0, spin = 0, sink = 0;
  GVM_ASSERT_OK(driver_->mem_alloc(0, kBytes, &src));
  GVM_ASSERT_OK(driver_->mem_alloc(1, kBytes, &dst));
  GVM_ASSERT_OK(driver_->mem_alloc(1, kBytes, &spin));
  GVM_ASSERT_OK(driver_->mem_alloc(1, sizeof(std::uint32_t), &sink));
  GVM_ASSERT_OK(kernels_->fill(0, nullptr, src, kCopied, kWords));
  GVM_ASSERT_OK(kernels_->fill(1, nullptr, spin, 1, kWords));
  GVM_ASSERT_OK(driver_->ctx_synchronize(0));
  GVM_ASSERT_OK(driver_->ctx_synchronize(1));
  std::uint64_t iterations = 0;
  GVM_ASSERT_OK(kernels_->calibrate_spin(1, nullptr, spin, kWords, 0.5, &iterations));

  GVM_ASSERT_OK(kernels_->spin_read(1, nullptr, spin, kWords, iterations, sink));
  GVM_ASSERT_OK(kernels_->fill(1, nullptr, dst, kLate, kWords));
  GVM_ASSERT_OK(driver_->memcpy_peer_async(dst, 1, src, 0, kBytes, nullptr));
  GVM_ASSERT_OK(driver_->ctx_synchronize(1));
  GVM_ASSERT_OK(driver_->ctx_synchronize(0));

  std::uint32_t not_copied = 0, not_late = 0;
  GVM_ASSERT_OK(
      kernels_->count_mismatches(*driver_, 1, nullptr, dst, kCopied, kWords, &not_copied));
  GVM_ASSERT_OK(kernels_->count_mismatches(*driver_, 1, nullptr, dst, kLate, kWords, &not_late));
  EXPECT_EQ(not_copied, 0u) << "the copy was not ordered after device 1's legacy stream: "
                            << (not_late == 0 ? "it ran on device 0's (the fill overwrote it)"
                                              : "dst holds neither value");
  for (DevicePtr p : {spin, dst, sink}) GVM_EXPECT_OK(driver_->mem_free(1, p));
  GVM_EXPECT_OK(driver_->mem_free(0, src));
}

}  // namespace
}  // namespace gvm::test
