// gvm-peer-child <scenario> [--fenced]
//
// Runs one allocator-level peer hazard (peer_hazards.hpp) on the real driver
// and prints the report as key=value lines. Unfenced runs break device 1's
// context on purpose (Config::fence_enabled=false, the test hook), so the GPU
// tests run them here, in a process of their own.
//
// Exit status: 0 the scenario ran (whatever it observed), 2 bad arguments,
// 3 it could not be set up, 4 no CUDA driver.
#include <cstdlib>
#include <iostream>
#include <string>

#include "device_kernels.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "peer_hazards.hpp"

int main(int argc, char** argv) {
  gvm::test::PeerHazard hazard{};
  if (argc < 2 || !gvm::test::parse_peer_hazard(argv[1], &hazard) ||
      (argc == 3 && std::string(argv[2]) != "--fenced") || argc > 3) {
    std::cerr << "usage: gvm-peer-child switch_during_peer_kernel|global_switch_during_peer_copy|"
                 "trim_during_peer_kernel|peer_reads_private_block [--fenced]\n";
    return 2;
  }
  const bool fenced = argc == 3;
  std::string why;
  auto driver = gvm::vmm::try_load_cuda_test_driver(&why);
  if (!driver) {
    std::cout << "setup_error=" << why << std::endl;
    return 4;
  }
  int devices = 0;
  if (driver->device_count(&devices) != gvm::vmm::Result::success || devices < 2) {
    std::cout << "setup_error=needs 2 devices, the driver shows " << devices << std::endl;
    return 3;
  }
  gvm::vmm::Result r = gvm::vmm::Result::success;
  int failed = -1;
  auto kernels = gvm::test::load_ptx_kernels(*driver, 2, &r, &failed);
  if (!kernels) {
    std::cout << "setup_error=loading the test kernels on device " << failed
              << " failed: " << gvm::vmm::result_name(r) << std::endl;
    return 3;
  }
  const gvm::test::PeerHazardReport report =
      gvm::test::run_peer_hazard(*driver, *kernels, hazard, fenced);
  gvm::test::print_peer_report(std::cout, hazard, fenced, report);
  std::cout.flush();
  if (!report.setup_error.empty()) return 3;
  // Device 1's context may be broken: skip every destructor (the kernels'
  // module unload, the driver's context release would only report the same
  // sticky error) and leave.
  std::_Exit(0);
}
