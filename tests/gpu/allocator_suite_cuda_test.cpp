// The shared allocator suite (tests/allocator/allocator_suite.hpp) over the
// real driver: gvm::Allocator on the GPUs of this machine. Without a driver
// every case skips with the loader's message.
#include "allocator/allocator_suite.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {
namespace {

// 2 GiB per device: enough for every case, small next to any GPU the project
// targets (the P40 has 24 GiB), so the out-of-memory cases hit the
// allocator's cap, not the device.
INSTANTIATE_TEST_SUITE_P(Cuda, AllocatorSuite,
                         ::testing::Values(AllocatorTarget{
                             "cuda",
                             [](std::string* why) { return vmm::try_load_cuda_test_driver(why); },
                             Config{}, std::size_t{2} << 30}),
                         target_name);

}  // namespace
}  // namespace gvm::test
