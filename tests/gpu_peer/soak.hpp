// The soak: minutes of everything at once on devices 0 and 1, through one
// gvm::Allocator, with the data and the access rights checked throughout.
//
//   block workers    (threads_per_device per device) allocate blocks of
//                    random sizes (512 B .. GiBs) on their streams, fill them,
//                    check them before the free, sometimes free them behind a
//                    use on another stream (record_stream), and hit the
//                    reserved-bytes cap (Config::max_reserved_bytes): on
//                    gvm::out_of_memory they give back half of what they hold
//                    and go on. After every allocation: cuMemGetAccess says
//                    the other device has no access to the block.
//   scratch workers  (one per device) put data in their device's scratch,
//                    let the other device read it in place (a peer kernel)
//                    and copy it out (peer_copy: direct, or staged under
//                    none), and free it behind the peer's work; the access
//                    the peer has to the scratch must be what the current
//                    policy says.
//   the control      (the calling thread) trims (one device or all) and
//                    switches the peer policy per_allocation / none / global
//                    while that peer work is still queued; only the fence
//                    stands between the switch and a sticky error.
// Every check kernel adds its mismatches to a per-thread counter, read and
// reset every few hundred operations; control checks (a wrong value on
// purpose) prove the checks run. At the end: every block freed, the policy
// back to automatic, trim(), then reserved bytes must be back at the
// baseline (zero) and the driver's free memory where it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "device_kernels.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

struct SoakOptions {
  double seconds = 20.0;
  int threads_per_device = 3;
  int streams_per_thread = 2;
  int max_held = 24;  // blocks one block worker holds at most
  // Sizes: 70% up to small_max (log-uniform from 512 B), 27% up to large_max,
  // 3% between huge_min and huge_max (what runs into the cap).
  std::size_t small_max = std::size_t{1} << 20;
  std::size_t large_max = std::size_t{64} << 20;
  std::size_t huge_min = std::size_t{256} << 20;
  std::size_t huge_max = std::size_t{1536} << 20;
  std::size_t scratch_max = std::size_t{32} << 20;
  // Config::max_reserved_bytes of the soak's allocator (per device heap).
  std::size_t reserved_cap = std::size_t{2} << 30;
  // The control's pause between actions is random in [1, control_pause_ms].
  int control_pause_ms = 60;
  // How much less free memory the driver may report after the final trim
  // than before the allocator was made (0 for the simulator, which counts
  // exactly; a little on a real GPU, where the driver's own bookkeeping moves).
  std::size_t free_memory_tolerance = 0;
  unsigned seed = 1;
  Config config;  // the rest of the allocator's config
};

struct SoakReport {
  std::string error;  // the first failure; empty: none
  double seconds = 0;
  // Operations.
  std::uint64_t allocations = 0, frees = 0, cross_stream_frees = 0;
  std::uint64_t out_of_memory = 0;  // gvm::out_of_memory from the cap, absorbed
  std::uint64_t scratch_blocks = 0, peer_kernels = 0, direct_copies = 0, staged_copies = 0;
  std::uint64_t trims = 0, policy_switches = 0, invariant_checks = 0;
  // Control actions that met peer work still queued (an event on a scratch
  // worker's peer stream not yet reached).
  std::uint64_t switches_with_work_queued = 0, trims_with_work_queued = 0;
  // Access rights (cuMemGetAccess) checked, and the ones that were wrong.
  std::uint64_t access_checks = 0;
  std::uint64_t ordinary_block_peer_access = 0;  // a peer could reach an ordinary block
  std::uint64_t scratch_access_wrong = 0;        // the scratch not as the policy says
  // Data.
  std::uint64_t words_checked = 0, wrong_words = 0;
  std::uint64_t control_checks = 0, control_failures = 0, counter_reads = 0;
  // The end.
  std::size_t peak_reserved[2] = {0, 0};
  std::size_t reserved_after_trim[2] = {0, 0};
  std::size_t live_after[2] = {0, 0};
  // Driver free memory after the final trim minus before the allocator.
  long long free_memory_delta[2] = {0, 0};
  std::string invariants;  // check_invariants' complaint, if any
  vmm::Result final_sync[2] = {vmm::Result::success, vmm::Result::success};
};

// Runs the soak on devices 0 and 1 of `driver` (two peer-capable devices).
// Never throws; everything goes into the report.
SoakReport run_soak(vmm::TestDriver& driver, DeviceKernels& kernels, const SoakOptions& options);

// Whether the report is a pass: no error, no wrong word or access, controls
// counted, memory back, contexts alive. *why says what failed.
bool soak_passed(const SoakReport& r, const SoakOptions& o, std::string* why);

// The report as "key=value" lines, for test logs.
std::string to_string(const SoakReport& r);

}  // namespace gvm::test
