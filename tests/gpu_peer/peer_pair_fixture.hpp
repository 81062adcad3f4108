// The fixture of the GPU peer tests: the real driver, devices 0 and 1 with a
// P2P path and VMM, and the test kernels loaded on both. Skips, saying why,
// without any of them.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "device_kernels.hpp"
#include "gpu_test_env.hpp"

namespace gvm::test {

class PeerPairGpuTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    require_peer_pair();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int d = 0; d < 2; ++d) {
      int vmm = 0;
      GVM_ASSERT_OK(driver_->device_attribute(d, vmm::DeviceAttribute::vmm_supported, &vmm));
      if (vmm == 0) GTEST_SKIP() << "device " << d << " has no VMM (cuMemCreate/cuMemMap)";
      int major = 0;
      GVM_ASSERT_OK(
          driver_->device_attribute(d, vmm::DeviceAttribute::compute_capability_major, &major));
      if (major < 8) pre_ampere_ = true;
    }
    vmm::Result r = vmm::Result::success;
    int failed = -1;
    kernels_ = load_ptx_kernels(*driver_, 2, &r, &failed);
    ASSERT_TRUE(kernels_ != nullptr)
        << "loading the test kernels on device " << failed << " failed: " << vmm::result_name(r);
  }

  void TearDown() override { kernels_.reset(); }

  bool pre_ampere_ = false;  // a device below compute capability 8.0
  std::unique_ptr<DeviceKernels> kernels_;
};

}  // namespace gvm::test
