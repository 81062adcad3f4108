// gvm-hazard-child <scenario> [--fenced]
//
// Runs one hazard scenario (hazard_scenarios.hpp) on the real driver and
// prints the report as key=value lines. The unfenced scenarios leave a sticky
// error in a context, so the GPU tests run them here, in a process of their
// own, instead of in the test binary.
//
// Exit status: 0 the scenario ran (whatever it observed), 2 bad arguments,
// 3 it could not be set up, 4 no CUDA driver.
#include <cstdlib>
#include <iostream>
#include <string>

#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "hazard_scenarios.hpp"

int main(int argc, char** argv) {
  gvm::test::Hazard hazard{};
  if (argc < 2 || !gvm::test::parse_hazard(argv[1], &hazard) ||
      (argc == 3 && std::string(argv[2]) != "--fenced") || argc > 3) {
    std::cerr << "usage: gvm-hazard-child peer_disable_during_copy|peer_disable_during_kernel|"
                 "revoke_during_read [--fenced]\n";
    return 2;
  }
  const bool fenced = argc == 3;
  std::string why;
  auto driver = gvm::vmm::try_load_cuda_test_driver(&why);
  if (!driver) {
    std::cout << "setup_error=" << why << std::endl;
    return 4;
  }
  gvm::test::HazardReport report = gvm::test::run_hazard(*driver, hazard, fenced);
  gvm::test::print_report(std::cout, hazard, fenced, report);
  std::cout.flush();
  if (!report.setup_error.empty()) return 3;
  // The context of the busy device may be broken: skip the driver's
  // destructor (which would only report the same sticky error) and leave.
  std::_Exit(0);
}
