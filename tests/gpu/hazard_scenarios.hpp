// The hazards of docs/measurements.md ("Hazards"), reproduced on the real driver.
//
// Each scenario queues work on device 1 (or device 0 for the copy) that
// touches memory of the other device through a peer path, then changes that
// path: disables global peer access, or revokes a VMM grant with PROT_NONE.
// Run unfenced, the change lands while the work is in flight and the context
// gets a sticky error; run fenced (every stream of both devices drained first,
// by synchronizing both contexts), the same change is harmless.
//
// The unfenced runs poison their process: run them in a child process
// (gvm-hazard-child). The fenced runs are safe in the test process.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

enum class Hazard {
  // 20 peer copies of 256 MiB queued from device 0 to device 1 with global
  // peer access, then peer access disabled (both directions).
  peer_disable_during_copy,
  // A kernel on device 1 reading device 0's cuMemAlloc memory through global
  // peer access for about a second, then peer access disabled.
  peer_disable_during_kernel,
  // A kernel on device 1 reading a VMM range of device 0 granted to device 1
  // with cuMemSetAccess, then the grant revoked (PROT_NONE for device 1).
  revoke_during_read,
};

const char* hazard_name(Hazard h) noexcept;
// false when `name` is not one of hazard_name's values.
bool parse_hazard(const std::string& name, Hazard* h) noexcept;

struct HazardReport {
  std::string setup_error;  // non-empty: the scenario could not be set up (nothing was tried)
  // The work was still pending (its completion event not_ready) right before
  // the fence (fenced) or the access change (unfenced).
  bool pending_before_change = false;
  int busy_device = -1;                       // the device whose stream did the work
  vmm::Result fence = vmm::Result::success;   // fenced: both ctx_synchronize calls
  vmm::Result change = vmm::Result::success;  // disable_peer_access / mem_set_access
  vmm::Result sync = vmm::Result::success;    // stream_synchronize after the change
  vmm::Result later = vmm::Result::success;   // a later, unrelated call (mem_alloc)
  vmm::Result verify = vmm::Result::success;  // fenced: the data check
  std::uint32_t mismatches = 0;               // fenced: wrong words found
  std::uint64_t spin_iterations = 0;          // kernel scenarios
};

// Runs one scenario on devices 0 and 1 of `driver`. Unfenced, it leaves the
// busy device's context broken (and leaks what it made): exit the process.
HazardReport run_hazard(vmm::TestDriver& driver, Hazard hazard, bool fenced);

// The report as "key=value" lines (error names, not numbers), for the child's
// output and the test log.
void print_report(std::ostream& out, Hazard hazard, bool fenced, const HazardReport& r);

}  // namespace gvm::test
