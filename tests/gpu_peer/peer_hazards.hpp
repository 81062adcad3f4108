// The peer hazards through gvm::Allocator: what its fence is for.
//
// tests/gpu/hazard_scenarios.hpp shows the raw driver failing when peer
// access changes under work in flight. These run the same kind of change
// through the allocator (set_peer_policy, trim) with Config::fence_enabled
// as the only difference: with the fence the change waits and nothing breaks;
// without it (the test hook) the change lands under the work and the context
// of the busy device gets a sticky error. Unfenced runs poison their process:
// gvm-peer-child runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "device_kernels.hpp"
#include "gvm/vmm/test_driver.hpp"

namespace gvm::test {

enum class PeerHazard {
  // Device 1 spin_reads device 0's scratch (per_allocation grant) for about
  // a second; the engine switches to PeerPolicy::none (a PROT_NONE revoke).
  switch_during_peer_kernel,
  // Config::peer_policy = global (the pre-Ampere path): 20 direct peer
  // copies of 256 MiB out of device 0's scratch queued on device 1; the
  // engine switches to none (context peer access disabled, grant revoked).
  global_switch_during_peer_copy,
  // Device 1 spin_reads a scratch block of device 0 that device 0 has
  // freed, stream-ordered after that read; trim(0) unmaps its chunk.
  trim_during_peer_kernel,
  // Device 1 reads an ordinary (arena) block of device 0: never granted, so
  // it must fault whatever the fence does. Proves the scratch is the only
  // memory a peer can reach. Unfenced only.
  peer_reads_private_block,
};

const char* peer_hazard_name(PeerHazard h) noexcept;
// GoogleTest prints parameters in the test list; a name instead of raw
// bytes keeps CMake 4's test discovery able to parse it.
inline void PrintTo(PeerHazard h, std::ostream* os) { *os << peer_hazard_name(h); }
bool parse_peer_hazard(const std::string& name, PeerHazard* h) noexcept;

struct PeerHazardReport {
  std::string setup_error;             // non-empty: nothing was tried
  std::string policy;                  // the peer policy of 1 -> 0 before the change
  bool pending_before_change = false;  // the peer's work was still queued
  std::uint64_t spin_iterations = 0;
  vmm::Result change = vmm::Result::success;  // the allocator call (from its driver_error)
  std::string change_error;                   // that error's what()
  vmm::Result sync = vmm::Result::success;    // stream_synchronize of the busy stream after it
  vmm::Result later = vmm::Result::success;   // a later, unrelated call on the busy device
  // Fenced: what was checked afterwards (data, access, unmapping).
  vmm::Result verify = vmm::Result::success;
  std::string verify_error;
  std::uint32_t mismatches = 0;
  std::string peer_access;              // peer_reads_private_block: device 1's access to the block
  std::uint64_t enable_peer_calls = 0;  // cuCtxEnablePeerAccess calls by the allocator
  bool sticky() const noexcept;         // change, sync or later hit a sticky error
};

// Sizes. The defaults are for H200s over NVLink (docs/measurements.md, "Bandwidth": a peer
// copy runs at ~395 GB/s, so 20 x 256 MiB keep the link busy ~13 ms,
// thousands of times longer than the host needs to reach the change); the
// simulator's tests use smaller ones.
struct PeerHazardOptions {
  std::size_t copy_bytes = std::size_t{256} << 20;
  int copies = 20;
  // Range the peer kernels read; its pass count is calibrated so that the
  // kernel runs for spin_seconds (unfenced) or fenced_spin_seconds.
  std::size_t read_bytes = std::size_t{64} << 20;
  double spin_seconds = 1.0;
  double fenced_spin_seconds = 0.2;
};

// Runs one scenario on devices 0 and 1. Unfenced, it leaves device 1's
// context broken and leaks what it made: the process must exit after it.
PeerHazardReport run_peer_hazard(vmm::TestDriver& driver, DeviceKernels& kernels, PeerHazard hazard,
                                 bool fenced, const PeerHazardOptions& options = {});

// "key=value" lines (error names, not numbers).
void print_peer_report(std::ostream& out, PeerHazard hazard, bool fenced,
                       const PeerHazardReport& r);

}  // namespace gvm::test
