// The engine scenario: what a multi-GPU inference engine does to peer access
// (docs/peer-access.md, "The problem"), on devices 0 and 1, through gvm::Allocator.
//
// Each iteration is two phases:
//   small batch  set_peer_policy(small_policy) (a grant, or for `global` the
//                context toggle), then direct peer copies from each device's
//                scratch into the other device's blocks, peer kernels that
//                read and write the other device's scratch, and a peer
//                spin_read left running;
//   large batch  set_peer_policy(none) while that peer work is still queued,
//                staged copies out of fresh scratch blocks, trim() while those
//                copies are queued, then regrowth (new scratch chunks, mapped
//                ungranted) with kernels on it still queued when the next
//                small phase grants again.
// Nothing synchronises the host before a switch or a trim: the allocator's
// fence must. Every copy and every peer write is checked on the other device
// with the check kernel into a per-(iteration, check) counter, read back at
// the end; each iteration also has a control check that must count every
// word, proving the checks ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device_kernels.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

struct EngineOptions {
  int iterations = 200;
  // The policy of the small-batch phases: per_allocation, or global (the
  // pre-Ampere path, forced on newer GPUs).
  PeerPolicy small_policy = PeerPolicy::per_allocation;
  // The allocator's config (scratch chunk size, fence mode, test hooks).
  Config config;
  // Block sizes are multiples of this (small batch 1-3x, large 2-6x).
  std::size_t unit_bytes = std::size_t{4} << 20;
  // How long the peer spin_read left running at each switch lasts.
  double spin_seconds = 0.003;
};

struct EngineReport {
  std::string error;  // the first failure ("iteration 17, large batch: trim(): ..."); empty: none
  int iterations_done = 0;
  // Iterations where work was still queued when the host asked for the change.
  int pending_at_revoke = 0;  // peer spin_read, at set_peer_policy(none)
  int pending_at_trim = 0;    // staged copies, at trim()
  int pending_at_grant = 0;   // regrowth kernels, at set_peer_policy(small_policy)
  // Data: words found wrong by the checks, and the first few places.
  std::uint64_t wrong_words = 0;
  int control_failures = 0;  // control checks that did not count every word
  std::vector<std::string> data_errors;
  // What the allocator did (its driver-call counters and stats).
  std::uint64_t enable_peer_calls = 0;
  std::uint64_t disable_peer_calls = 0;
  std::uint64_t set_access_calls = 0;
  std::uint64_t chunks_mapped = 0;  // both devices, arena and scratch
  std::uint64_t chunks_unmapped = 0;
  std::uint64_t fences = 0;
  std::string invariants;  // check_invariants' complaint, if any
  // Both contexts synchronised after the last phase: a sticky error shows here.
  vmm::Result final_sync[2] = {vmm::Result::success, vmm::Result::success};
  // After the allocator is gone: cuCtxDisablePeerAccess(1 -> 0) and (0 -> 1).
  // peer_access_not_enabled means nobody left context peer access on.
  vmm::Result global_left[2] = {vmm::Result::success, vmm::Result::success};
};

// Runs the scenario on devices 0 and 1 of `driver` (which must show at least
// two peer-capable devices). Never throws; everything goes into the report.
EngineReport run_engine(vmm::TestDriver& driver, DeviceKernels& kernels, const EngineOptions& options);

// The report as "key=value" lines, for test logs.
std::string to_string(const EngineReport& r);

}  // namespace gvm::test
