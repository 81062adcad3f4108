// The shared driver suite (tests/common/driver_suite.hpp) over the real
// driver. Without a driver every case skips with the loader's message.
#include "common/driver_suite.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, DriverSuite,
                         ::testing::Values(DriverFactory{
                             "cuda",
                             [](std::string* why) { return vmm::try_load_cuda_test_driver(why); }}),
                         factory_name);

}  // namespace
}  // namespace gvm::test
