// CudaDriver's loader without a GPU: every way of not having a usable driver
// ends in DriverUnavailable with one clear line, never a crash or abort.
// GVM_FAKE_LIBCUDA_PATH (from the build) is fake_libcuda.cpp's library.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gvm/vmm/cuda_driver.hpp"

namespace gvm::vmm {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The message of the DriverUnavailable that loading `library` throws.
std::string load_error(const char* library) {
  try {
    auto d = load_cuda_driver_from(library);
    return "loaded a driver (" + std::string(d->name()) + ")";
  } catch (const DriverUnavailable& e) {
    return e.what();
  }
}

TEST(CudaLoader, MissingLibraryIsNoCudaDriverFound) {
  std::string msg = load_error("libdoes-not-exist.so.1");
  EXPECT_TRUE(starts_with(msg, "no CUDA driver found: ")) << msg;
  EXPECT_NE(msg.find("libdoes-not-exist.so.1"), std::string::npos) << "dlerror() is kept: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

TEST(CudaLoader, EmptyNameIsRefused) {
  EXPECT_TRUE(starts_with(load_error(""), "no CUDA driver found: "));
  EXPECT_TRUE(starts_with(load_error(nullptr), "no CUDA driver found: "));
}

TEST(CudaLoader, LibraryWithoutCuGetProcAddressIsNotADriver) {
  // libc is always there and is certainly not a CUDA driver.
  std::string msg = load_error("libc.so.6");
  EXPECT_NE(msg.find("cuGetProcAddress_v2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("libc.so.6"), std::string::npos) << msg;
}

class FakeDriver : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("GVM_FAKE_CUDA"); }
  std::string load_with(const char* mode) {
    setenv("GVM_FAKE_CUDA", mode, 1);
    return load_error(GVM_FAKE_LIBCUDA_PATH);
  }
};

TEST_F(FakeDriver, CuInitFailureIsNamed) {
  EXPECT_EQ(load_with("init_fails"), "CUDA driver found but cuInit failed: CUDA_ERROR_NO_DEVICE");
}

TEST_F(FakeDriver, MissingEntryPointIsNamed) {
  std::string msg = load_with("missing:cuMemCreate");
  EXPECT_TRUE(starts_with(msg, "CUDA driver too old: ")) << msg;
  EXPECT_NE(msg.find("cuMemCreate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("symbol not found"), std::string::npos) << msg;
}

TEST_F(FakeDriver, NoDeviceIsNamed) {
  EXPECT_EQ(load_with("no_devices"), "CUDA driver found but it shows no device");
}

// try_load_cuda_driver never throws: either a driver, or nullptr and a reason
// that is one of the loader's messages. Both outcomes are checked, so this
// runs (and can fail) with and without a GPU.
TEST(CudaLoader, TryLoadGivesADriverOrAReason) {
  std::string why = "stale";
  auto d = try_load_cuda_driver(&why);
  if (d) {
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_STREQ(d->name(), "cuda");
    int n = 0;
    EXPECT_EQ(d->device_count(&n), Result::success);
    EXPECT_GE(n, 1);
  } else {
    EXPECT_TRUE(starts_with(why, "no CUDA driver found: ") ||
                starts_with(why, "CUDA driver found but ") ||
                starts_with(why, "CUDA driver too old"))
        << why;
    std::cout << "no driver here: " << why << std::endl;
  }
  EXPECT_NO_THROW((void)try_load_cuda_driver(nullptr));
}

TEST(CudaLoader, LoadCudaDriverThrowsOnlyDriverUnavailable) {
  try {
    auto d = load_cuda_driver();
    EXPECT_NE(d, nullptr);
  } catch (const DriverUnavailable& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

}  // namespace
}  // namespace gvm::vmm
